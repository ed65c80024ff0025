//! The state directory is private: conversation history holds whatever secrets the agent saw.
//!
//! The directory is kept at `0700` (whatever the umask, whatever created it), so nothing inside
//! is reachable by another local user; the command line also sets its umask to `077`, so every
//! file it creates or rewrites (databases, WAL and shared-memory files, index segments,
//! transcripts, `sessions.json`, the configuration) is `0600`. `doctor` lists any path that
//! group or others can reach, and `doctor --fix` tightens every loose mode.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Mode bits that let group or others in.
const SHARED_BITS: u32 = 0o077;

/// Creates `dir` (and parents) if missing and makes it `0700` if it is looser.
pub fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & SHARED_BITS != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// A path group or others may access, with its mode.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoosePath {
    pub path: PathBuf,
    pub mode: u32,
}

/// Every directory and file at or below `dir` that group or others can actually reach: its
/// own mode lets them in and every directory on the way (from `dir` down) lets them through. A
/// `0644` file inside the `0700` state directory is out of reach, so not reported. Symbolic
/// links are not followed.
pub fn loose_paths(dir: &Path) -> Vec<LoosePath> {
    let mut found = Vec::new();
    visit(dir, true, &mut |path, mode, reachable| {
        if reachable && mode & SHARED_BITS != 0 {
            found.push(LoosePath {
                path: path.to_owned(),
                mode: mode & 0o777,
            });
        }
    });
    found
}

/// Tightens every path at or below `dir` whose mode lets group or others in, reachable or not:
/// directories to `0700`, files to `0600`. Returns how many it changed.
pub fn tighten(dir: &Path) -> std::io::Result<usize> {
    let mut changed = 0;
    let mut failure = None;
    let mut loose = Vec::new();
    visit(dir, true, &mut |path, mode, _| {
        if mode & SHARED_BITS != 0 {
            loose.push(LoosePath {
                path: path.to_owned(),
                mode,
            });
        }
    });
    for loose in loose {
        let is_dir = std::fs::symlink_metadata(&loose.path).is_ok_and(|meta| meta.is_dir());
        let mode = if is_dir { 0o700 } else { 0o600 };
        match std::fs::set_permissions(&loose.path, std::fs::Permissions::from_mode(mode)) {
            Ok(()) => changed += 1,
            Err(error) => failure = Some(error),
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(changed),
    }
}

/// Visits `path` and everything below it with its mode and whether group or others can reach
/// it (every directory above it, from where the walk began, lets them pass).
fn visit(path: &Path, reachable: bool, found: &mut impl FnMut(&Path, u32, bool)) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.file_type().is_symlink() {
        return;
    }
    let mode = meta.permissions().mode();
    found(path, mode, reachable);
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        // Group or others pass through a directory with an execute bit for them.
        let through = reachable && mode & 0o011 != 0;
        for entry in entries.flatten() {
            visit(&entry.path(), through, found);
        }
    }
}
