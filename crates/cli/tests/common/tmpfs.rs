//! A small tmpfs mounted for a test (a full disk on demand; needs root), unmounted when
//! dropped. Shared by the test binaries that fill a disk.

use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`3m`) at `at`, or says why it could not.
    pub(crate) fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|error| error.to_string())?;
        let output = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|error| error.to_string())?;
        if output.status.success() {
            Ok(Tmpfs(at.to_owned()))
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
