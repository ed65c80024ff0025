//! The database's files as this process opened them. Two kinds of damage can happen to a
//! running process's database from outside, and SQLite cannot tell either from its own state:
//! the file removed or replaced (a state directory deleted, a copy restored over it), and its
//! write-ahead log (`-wal`) truncated or overwritten. SQLite keeps writing into the file it
//! holds open, or after a hole in the log that the next open discards: what it acknowledged
//! from then on would be lost. [`OpenedDatabase`] notices both, so that nothing more is
//! acknowledged ([`StoreError::DatabaseGone`], [`StoreError::LogLost`]); a new process opens
//! the database anew, and a host's history brings back what the lost log held.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rusqlite::{Connection, ErrorCode};

use crate::error::{DatabaseError, Result, StoreError};

/// The magic numbers a write-ahead log starts with (big- or little-endian checksums).
const LOG_MAGIC: [[u8; 4]; 2] = [[0x37, 0x7f, 0x06, 0x82], [0x37, 0x7f, 0x06, 0x83]];

/// The write-ahead log beside the database at `path`.
fn log_path_of(path: &Path) -> PathBuf {
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    PathBuf::from(log)
}

/// The log's length and its first bytes (`None` when it holds no header: a checkpoint may
/// truncate it to nothing), from one open; `None` when there is no log.
fn read_log(log: &Path) -> Option<(u64, Option<[u8; 4]>)> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(log).ok()?;
    let length = file.metadata().ok()?.len();
    let mut header = [0u8; 4];
    Some((length, file.read_exact(&mut header).ok().map(|()| header)))
}

/// SQLite's errors for a file it cannot read as it expects: "not a database", an I/O error,
/// "malformed".
pub(crate) fn is_damage(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::NotADatabase | ErrorCode::SystemIoFailure | ErrorCode::DatabaseCorrupt)
    )
}

/// How many bytes the log's index (`-shm`, shared by every process that has the database
/// open) says the log holds: its header and every frame it has indexed. `None` when there is
/// no index, it is not initialized or is being written (its two copies of the header differ),
/// or it indexes no frame: everything was checkpointed, and a log of any length is whole (a
/// clean stop leaves one of 0 bytes behind).
fn indexed_log_len(path: &Path) -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    let mut index = path.as_os_str().to_owned();
    index.push("-shm");
    // Two copies of the 48-byte header, in the host's byte order (SQLite's `WalIndexHdr`).
    let mut headers = [0u8; 96];
    with_index_file(&PathBuf::from(index), |file| {
        file.read_exact_at(&mut headers, 0).ok()
    })??;
    let (header, copy) = headers.split_at(48);
    let word = |at: usize| {
        u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    const WAL_VERSION: u32 = 3_007_000;
    if header != copy || word(0) != WAL_VERSION || header[12] != 1 {
        return None;
    }
    let page = match u16::from_ne_bytes([header[14], header[15]]) {
        1 => 65_536,
        size => u64::from(size),
    };
    let frames = u64::from(word(16));
    (frames > 0 && page > 0).then(|| 32 + frames * (24 + page))
}

/// The log indexes this process has read, kept open: closing a file drops every POSIX lock the
/// process holds on it, SQLite's own included, and SQLite's connections would then use an
/// index that other processes believe nobody holds (they may rebuild it under them). One whose
/// file is gone (a database removed) is closed when another is first read.
static INDEX_FILES: Mutex<Vec<(u64, u64, std::fs::File)>> = Mutex::new(Vec::new());

/// Runs `read` on the log index at `path`, opened once for the process's life.
fn with_index_file<T>(path: &Path, read: impl FnOnce(&std::fs::File) -> T) -> Option<T> {
    let metadata = std::fs::metadata(path).ok()?;
    let (dev, ino) = (metadata.dev(), metadata.ino());
    let mut files = INDEX_FILES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, _, file)) = files.iter().find(|held| (held.0, held.1) == (dev, ino)) {
        return Some(read(file));
    }
    files.retain(|(_, _, file)| file.metadata().is_ok_and(|held| held.nlink() > 0));
    let file = std::fs::File::open(path).ok()?;
    let answer = read(&file);
    files.push((dev, ino, file));
    Some(answer)
}

/// The log of the database at `path`, when it is cut: the log's index (which every process
/// that has the database open shares) says it holds frames that it no longer does, its header
/// gone (cut to nothing, overwritten) or its length short of them (cut to a length that keeps
/// the header). With one of [`is_damage`]'s errors, the log was cut under a process; without
/// such a claim (nothing to checkpoint, as after a clean stop), the error is the database's
/// own: corruption is reported as corruption.
pub(crate) fn cut_log(path: &Path) -> Option<PathBuf> {
    let log = log_path_of(path);
    let (length, header) = read_log(&log)?;
    let claimed = indexed_log_len(path)?;
    let headed = header.is_some_and(|header| LOG_MAGIC.contains(&header));
    (!headed || length < claimed).then_some(log)
}

/// The database file this process opened: its path, device and inode.
#[derive(Clone, Debug)]
pub(crate) struct OpenedDatabase {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl OpenedDatabase {
    /// The file `connection` has open (`None` for an in-memory database).
    pub(crate) fn of(connection: &Connection) -> Option<OpenedDatabase> {
        let path = PathBuf::from(connection.path().filter(|path| !path.is_empty())?);
        let metadata = std::fs::metadata(&path).ok()?;
        Some(OpenedDatabase {
            dev: metadata.dev(),
            ino: metadata.ino(),
            path,
        })
    }

    fn log_path(&self) -> PathBuf {
        log_path_of(&self.path)
    }

    /// Whether the path still names the file opened, and its log (when it holds anything)
    /// starts as a log does. Checked before and after each write that is acknowledged.
    pub(crate) fn check(&self) -> Result<()> {
        match std::fs::metadata(&self.path) {
            Ok(metadata) if metadata.dev() == self.dev && metadata.ino() == self.ino => {}
            _ => {
                return Err(StoreError::DatabaseGone {
                    path: self.path.clone(),
                });
            }
        }
        let log = self.log_path();
        let Some((length, header)) = read_log(&log) else {
            return Ok(());
        };
        let overwritten = header.is_some_and(|header| !LOG_MAGIC.contains(&header));
        // Shorter than the frames its index holds: cut to a length that kept its header (the
        // index is read only when the header is whole).
        if overwritten || indexed_log_len(&self.path).is_some_and(|claimed| length < claimed) {
            return Err(StoreError::LogLost { path: log });
        }
        Ok(())
    }

    /// `error` as the files explain it: SQLite's "not a database", "disk I/O error" or
    /// "malformed" while this process has the database open is the file replaced or the log
    /// cut under it, when that is what the files show; any other error is kept.
    pub(crate) fn explain(&self, error: StoreError) -> StoreError {
        let StoreError::Sqlite(DatabaseError(sqlite)) = &error else {
            return error;
        };
        if !is_damage(sqlite) {
            return error;
        }
        match self.check() {
            Err(gone) => gone,
            Ok(()) => match cut_log(&self.path) {
                Some(log) => StoreError::LogLost { path: log },
                None => error,
            },
        }
    }
}
