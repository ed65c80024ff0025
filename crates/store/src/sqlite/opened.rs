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

/// The log's first bytes: `None` when it is missing or holds no header (a checkpoint may
/// truncate it to nothing; only an error of SQLite's says that was not one).
fn log_header(log: &Path) -> Option<[u8; 4]> {
    use std::io::Read as _;
    let mut header = [0u8; 4];
    std::fs::File::open(log)
        .and_then(|mut file| file.read_exact(&mut header))
        .ok()
        .map(|()| header)
}

/// SQLite's errors for a file it cannot read as it expects: "not a database", an I/O error,
/// "malformed".
pub(crate) fn is_damage(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::NotADatabase | ErrorCode::SystemIoFailure | ErrorCode::DatabaseCorrupt)
    )
}

/// The log of the database at `path`, when it is there but holds no log (cut to nothing, or
/// overwritten): with one of [`is_damage`]'s errors, the log was cut under a process.
pub(crate) fn cut_log(path: &Path) -> Option<PathBuf> {
    let log = log_path_of(path);
    let there = std::fs::metadata(&log).is_ok();
    (there && !log_header(&log).is_some_and(|header| LOG_MAGIC.contains(&header))).then_some(log)
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
        match log_header(&self.log_path()) {
            Some(header) if !LOG_MAGIC.contains(&header) => Err(StoreError::LogLost {
                path: self.log_path(),
            }),
            _ => Ok(()),
        }
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
