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

/// The log's length and its first bytes, from one open: a log that is not there reads as
/// empty (its index may still claim frames: the log was deleted); `None` when it cannot be
/// read.
fn read_log(log: &Path) -> Option<(u64, Option<[u8; 4]>)> {
    use std::io::Read as _;
    let mut file = match std::fs::File::open(log) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Some((0, None)),
        Err(_) => return None,
    };
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

/// The header of the log's index (`-shm`, shared by every process that has the database
/// open): two copies of SQLite's 48-byte `WalIndexHdr`, in the host's byte order. `None` when
/// there is no index, or it is not initialized or is being written (its two copies differ).
fn index_header(path: &Path) -> Option<[u8; 48]> {
    use std::os::unix::fs::FileExt as _;
    let mut index = path.as_os_str().to_owned();
    index.push("-shm");
    let mut headers = [0u8; 96];
    with_index_file(&PathBuf::from(index), |file| {
        file.read_exact_at(&mut headers, 0).ok()
    })??;
    let mut header = [0u8; 48];
    header.copy_from_slice(&headers[..48]);
    const WAL_VERSION: u32 = 3_007_000;
    let version = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
    (header[..] == headers[48..] && version == WAL_VERSION && header[12] == 1).then_some(header)
}

/// How many bytes an index's header says the log holds: its header and every frame indexed.
/// `None` when it indexes no frame: everything was checkpointed, and a log of any length is
/// whole (a clean stop leaves one of 0 bytes behind).
fn claimed_len(header: &[u8; 48]) -> Option<u64> {
    let page = match u16::from_ne_bytes([header[14], header[15]]) {
        1 => 65_536,
        size => u64::from(size),
    };
    let frames = u64::from(u32::from_ne_bytes([
        header[16], header[17], header[18], header[19],
    ]));
    (frames > 0 && page > 0).then(|| 32 + frames * (24 + page))
}

/// The log as read between two readings of its index that agree.
struct LogReading {
    length: u64,
    /// Its first bytes (`None` when it holds no header: a checkpoint may truncate it to nothing).
    header: Option<[u8; 4]>,
    /// The length its index claims for it; `None` when it claims no frame, or kept changing.
    claimed: Option<u64>,
}

/// The log of the database at `path` (`None` when it cannot be read), read between two readings
/// of its index: other processes append to the log, restart it and truncate it at any moment,
/// and a length read on either side of such a change says nothing of the other reading
/// (frames appended after the length was read looked missing).
fn read_log_and_its_claim(path: &Path) -> Option<LogReading> {
    let log = log_path_of(path);
    for _ in 0..4 {
        let before = index_header(path);
        let (length, header) = read_log(&log)?;
        if before == index_header(path) {
            let claimed = before.as_ref().and_then(claimed_len);
            return Some(LogReading {
                length,
                header,
                claimed,
            });
        }
    }
    // The index kept changing: other processes are writing, and it claims nothing for sure.
    let (length, header) = read_log(&log)?;
    Some(LogReading {
        length,
        header,
        claimed: None,
    })
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
    let log = read_log_and_its_claim(path)?;
    let claimed = log.claimed?;
    let headed = log.header.is_some_and(|header| LOG_MAGIC.contains(&header));
    (!headed || log.length < claimed).then(|| log_path_of(path))
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
        let Some(log) = read_log_and_its_claim(&self.path) else {
            return Ok(());
        };
        let overwritten = log
            .header
            .is_some_and(|header| !LOG_MAGIC.contains(&header));
        // Shorter than the frames its index holds: cut to a length that kept its header.
        if overwritten || log.claimed.is_some_and(|claimed| log.length < claimed) {
            return Err(StoreError::LogLost {
                path: self.log_path(),
            });
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
