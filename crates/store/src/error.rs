use std::path::PathBuf;

/// Everything that can go wrong in the store. Each variant names the thing and the place; a
/// variant with a source does not repeat it in its message (chains print each cause once).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file cannot be used.
    #[error("{path}: not a usable vilvona database ({detail}); move it aside to start fresh")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    #[error(
        "{path}: database schema version {found} is newer than this build understands ({supported}); upgrade vilvona"
    )]
    /// The database was written by a newer build.
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest this build reads.
        supported: i64,
    },
    /// The database file was removed or replaced while this process had it open: what it
    /// wrote from then on went to a file no one can open again, so it acknowledges nothing
    /// more.
    #[error(
        "{path} was removed or replaced while this process had it open; nothing more is stored in it (restart the process to open a database at that path anew)"
    )]
    DatabaseGone {
        /// The database file.
        path: PathBuf,
    },
    /// The database's write-ahead log was truncated or overwritten while this process had the
    /// database open: what it held since the last checkpoint is gone from the database, and
    /// SQLite would write after a hole that the next open discards, so this process
    /// acknowledges nothing more.
    #[error(
        "{path} was truncated or overwritten under a process that had the database open: what it held since the last checkpoint is gone from the database (a host's history brings acknowledged turns back) and nothing more is stored through it (restart the process to open the database anew)"
    )]
    LogLost {
        /// The write-ahead log file.
        path: PathBuf,
    },
    /// A file operation failed.
    #[error("{path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The database failed.
    #[error("sqlite")]
    Sqlite(#[source] DatabaseError),
    /// The PostgreSQL database failed (or could not be reached).
    #[error("postgresql")]
    Postgres(#[source] PostgresError),
    /// The recall index failed.
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
    /// A message larger than the store takes in one row.
    MessageTooLarge {
        /// The message's size.
        bytes: usize,
        /// The most a row takes.
        limit: usize,
    },
    /// A regular expression that does not compile (or would be too large).
    #[error("invalid regex {pattern:?}: {detail}")]
    InvalidRegex {
        /// The expression.
        pattern: String,
        /// Why it does not compile.
        detail: String,
    },
    /// A query over the store's bounds (length, number of terms).
    #[error("{0}")]
    QueryTooLarge(String),
    /// A search by meaning on a store opened without an embedding model.
    #[error("recall by meaning is off: the store was opened without an embedding model")]
    NoEmbeddings,
    /// The embedding model could not embed the query (a model behind an endpoint that is
    /// unreachable or refused it).
    #[error(transparent)]
    Embedding(#[from] vilvona_embed::EmbedError),
    /// No such row.
    #[error("unknown {what} {id}")]
    NotFound {
        /// What kind of row.
        what: &'static str,
        /// Which.
        id: String,
    },
    /// The writer thread (or a blocking task of the store) is gone.
    #[error("the store's writer has stopped: {0}")]
    WriterStopped(&'static str),
    /// A blocking task of the store panicked or was cancelled.
    #[error("a task of the store failed")]
    TaskFailed(#[source] tokio::task::JoinError),
    /// A fault the test plan injected.
    #[error("injected fault: {0}")]
    InjectedFault(String),
    /// A stored row that does not decode.
    #[error("corrupt row: {0}")]
    CorruptRow(String),
    /// `rebuild-index` while another process keeps maintaining the index.
    #[error(
        "{0}: another process (a running `vilvona serve` or replay) maintains the recall index; on SQLite it was asked to rebuild it and does within seconds, else stop it and run this again"
    )]
    IndexBusy(PathBuf),
    /// A write on a store opened for reading only (an inspection command).
    #[error("{0}: the store was opened read-only")]
    ReadOnly(String),
    /// What the PostgreSQL backend does not do yet.
    #[error("{0} is not available on the PostgreSQL backend yet")]
    NotOnPostgres(&'static str),
    /// An archive that cannot be imported into this store as it is.
    #[error("the archive cannot be imported: {0}")]
    ImportRefused(String),
}

impl StoreError {
    /// True when this process can no longer use its database but a new one can (the file
    /// removed or replaced, its log cut under it): a server stops, so that its client starts
    /// one that opens the database anew.
    pub fn needs_reopen(&self) -> bool {
        matches!(
            self,
            StoreError::DatabaseGone { .. } | StoreError::LogLost { .. }
        )
    }

    /// True when the same call may succeed if tried again: the database is busy or locked by
    /// another process, the disk is full (space comes back), a PostgreSQL server is restarting or
    /// unreachable, an embedding endpoint is down, a file operation was interrupted. A broken store
    /// (corrupt, newer schema, a writer that stopped) is not transient. A database that needs
    /// reopening is: a new process succeeds ([`StoreError::needs_reopen`]).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::DatabaseGone { .. } | StoreError::LogLost { .. } => true,
            StoreError::Sqlite(DatabaseError(error)) => matches!(
                error.sqlite_error_code(),
                Some(
                    rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                        | rusqlite::ErrorCode::DiskFull
                )
            ),
            StoreError::Postgres(error) => error.is_transient(),
            StoreError::Embedding(_) => true,
            StoreError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::StorageFull
            ),
            _ => false,
        }
    }
}

/// An error of the embedded database, opaque: the store's callers do not depend on its driver.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DatabaseError(pub(crate) rusqlite::Error);

/// An error of the PostgreSQL backend, opaque like [`DatabaseError`]: the server's own
/// message (with its SQLSTATE) when it sent one, else what failed on the way to it.
#[derive(Debug)]
pub struct PostgresError(pub(crate) String);

impl std::fmt::Display for PostgresError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PostgresError {}

impl PostgresError {
    /// A connection that failed or was lost, a server shutting down or out of resources, a
    /// serialization failure or deadlock (SQLSTATE classes 08, 53, 57P, 40): what a retry can
    /// outlive. A message without a SQLSTATE came from the way to the server (no connection).
    pub(crate) fn is_transient(&self) -> bool {
        let code = self
            .0
            .split_whitespace()
            .nth(1)
            .filter(|code| code.len() == 6 && code.ends_with(':'))
            .map(|code| code.trim_end_matches(':'));
        match code {
            None => true,
            Some(code) => ["08", "53", "57P", "40"]
                .iter()
                .any(|class| code.starts_with(class)),
        }
    }
}

impl PostgresError {
    /// What the server said (its severity, SQLSTATE and message), else the driver's chain.
    pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
        match error.as_db_error() {
            Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
            None => vilvona_core::error_chain(error),
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> StoreError {
        StoreError::Postgres(PostgresError(PostgresError::describe(&error)))
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> StoreError {
        match error {
            deadpool_postgres::PoolError::Backend(error) => error.into(),
            other => StoreError::Postgres(PostgresError(format!(
                "no connection from the pool: {other}"
            ))),
        }
    }
}

/// An error of the recall index, opaque like [`DatabaseError`].
#[derive(Debug)]
pub struct IndexError(pub(crate) tantivy::TantivyError);

impl std::fmt::Display for IndexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            // The index's writer threads lost their cause on the way (tantivy keeps only that a
            // worker stopped); say what it most likely was instead of tantivy's own sentence.
            tantivy::TantivyError::ErrorInThread(_) => f.write_str(
                "the index writer stopped because one of its threads failed (most often the disk is full or unwritable)",
            ),
            other => other.fmt(f),
        }
    }
}

impl std::error::Error for IndexError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            tantivy::TantivyError::ErrorInThread(_) => None,
            other => other.source(),
        }
    }
}

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
    /// Whether the recall index was written with another schema (another build, another
    /// embedding model).
    pub(crate) fn is_other_index_schema(&self) -> bool {
        matches!(
            self,
            StoreError::Index(IndexError(tantivy::TantivyError::SchemaError(_)))
        )
    }

    /// Whether SQLite found a damaged page (the row it was reading cannot be read; others may).
    pub(crate) fn is_damaged_page(&self) -> bool {
        matches!(
            self,
            StoreError::Sqlite(DatabaseError(rusqlite::Error::SqliteFailure(failure, _)))
                if matches!(failure.code, rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

/// The store's results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// What a retry can outlive is transient; a broken store is not.
    #[test]
    fn transient_errors_are_those_a_retry_can_outlive() {
        let postgres = |text: &str| StoreError::Postgres(PostgresError(text.to_owned()));
        let cases = [
            (
                postgres("FATAL 57P01: terminating connection due to administrator command"),
                true,
            ),
            (postgres("ERROR 40001: could not serialize access"), true),
            (postgres("FATAL 08006: connection failure"), true),
            (
                postgres("error connecting to server: Connection refused (os error 111)"),
                true,
            ),
            (
                postgres("ERROR 42P01: relation \"messages\" does not exist"),
                false,
            ),
            (
                StoreError::Sqlite(DatabaseError(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    None,
                ))),
                true,
            ),
            (
                StoreError::Sqlite(DatabaseError(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
                    None,
                ))),
                false,
            ),
            (StoreError::WriterStopped("the writer panicked"), false),
            (StoreError::CorruptRow("message 4".to_owned()), false),
        ];
        for (error, transient) in cases {
            assert_eq!(error.is_transient(), transient, "{error:?}");
        }
    }
}
