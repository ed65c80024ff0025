use std::path::PathBuf;

/// Everything that can go wrong in the store. Each variant names the thing and the place; a
/// variant with a source does not repeat it in its message (chains print each cause once).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{path}: not a usable vilvona database ({detail}); move it aside to start fresh")]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "{path}: database schema version {found} is newer than this build understands ({supported}); upgrade vilvona"
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sqlite")]
    Sqlite(#[source] DatabaseError),
    #[error("search index")]
    Index(#[source] IndexError),
    /// A message that cannot be stored as it is.
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// A message whose JSON cannot be written.
    #[error("the message cannot be serialized")]
    Unserializable(#[source] serde_json::Error),
    #[error(
        "message of {bytes} bytes exceeds the {limit}-byte limit; store large content as a blob"
    )]
    MessageTooLarge { bytes: usize, limit: usize },
    #[error("invalid regex {pattern:?}: {detail}")]
    InvalidRegex { pattern: String, detail: String },
    /// A query over the store's bounds (length, number of terms).
    #[error("{0}")]
    QueryTooLarge(String),
    #[error("unknown {what} {id}")]
    NotFound { what: &'static str, id: String },
    /// The writer thread (or a blocking task of the store) is gone.
    #[error("the store's writer has stopped: {0}")]
    WriterStopped(&'static str),
    /// A blocking task of the store panicked or was cancelled.
    #[error("a task of the store failed")]
    TaskFailed(#[source] tokio::task::JoinError),
    #[error("injected fault: {0}")]
    InjectedFault(String),
    #[error("corrupt row: {0}")]
    CorruptRow(String),
    /// `rebuild-index` while another process keeps maintaining the index.
    #[error(
        "{0}: another process (a running `vilvona serve` or replay) maintains the recall index and keeps it current; stop it to rebuild the index"
    )]
    IndexBusy(PathBuf),
    /// A write on a store opened for reading only (an inspection command).
    #[error("{0}: the store was opened read-only")]
    ReadOnly(String),
}

/// An error of the embedded database, opaque: the store's callers do not depend on its driver.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DatabaseError(pub(crate) rusqlite::Error);

/// An error of the recall index, opaque like [`DatabaseError`].
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct IndexError(pub(crate) tantivy::TantivyError);

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> StoreError {
        StoreError::Sqlite(DatabaseError(error))
    }
}

impl From<tantivy::TantivyError> for StoreError {
    fn from(error: tantivy::TantivyError) -> StoreError {
        StoreError::Index(IndexError(error))
    }
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
