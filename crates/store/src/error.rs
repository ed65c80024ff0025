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
    Sqlite(#[from] rusqlite::Error),
    #[error("search index")]
    Index(#[from] tantivy::TantivyError),
    #[error("invalid message: {0}")]
    InvalidMessage(String),
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
    #[error("the store's writer has stopped: {0}")]
    WriterStopped(String),
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

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
