//! Connection setup and versioned migrations keyed on `PRAGMA user_version` (twin:
//! `crate::pg::schema`).

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::config::DbConfig;

use crate::error::{Result, StoreError};

/// One migration: the SQL that takes the schema from version `n - 1` to `n`.
struct Migration {
    /// True when the migration rewrites existing rows (not only adds tables or indexes): the
    /// database is copied aside before it runs.
    rewrites_data: bool,
    sql: &'static str,
    /// Rows the SQL alone cannot derive (it cannot read the compressed message JSON), filled in
    /// the same transaction.
    backfill: Option<fn(&Connection) -> Result<()>>,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        rewrites_data: false,
        backfill: None,
        sql: r#"
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    agent_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    session_key TEXT,
    active INTEGER NOT NULL DEFAULT 1,
    archived_at INTEGER,
    created_at INTEGER NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 0,
    next_position INTEGER NOT NULL DEFAULT 0,
    context_tokens INTEGER NOT NULL DEFAULT 0,
    UNIQUE (agent_id, session_id)
);
CREATE INDEX conversations_by_key ON conversations (agent_id, session_key);

CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    -- The message JSON exactly as ingested, lz4-compressed (size-prefixed).
    json BLOB NOT NULL,
    tokens INTEGER NOT NULL,
    ingest_key BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (conversation_id, seq),
    UNIQUE (conversation_id, ingest_key)
);

CREATE TABLE summaries (
    id INTEGER PRIMARY KEY,
    summary_id TEXT NOT NULL UNIQUE,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    depth INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('leaf', 'condensed')),
    content TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    earliest_at INTEGER,
    latest_at INTEGER,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    level TEXT NOT NULL,
    summarizer TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX summaries_by_conversation ON summaries (conversation_id, depth);

-- Ordered children of a summary: messages for a leaf, summaries for a condensed node. A child
-- has at most one parent in each conversation (migration 4 lets a fork fold its parent's rows
-- too): each conversation's summaries are a forest of trees over the rows it folded.
CREATE TABLE summary_edges (
    parent_id INTEGER NOT NULL REFERENCES summaries (id),
    ordinal INTEGER NOT NULL,
    child_message_id INTEGER REFERENCES messages (id),
    child_summary_id INTEGER REFERENCES summaries (id),
    PRIMARY KEY (parent_id, ordinal),
    CHECK ((child_message_id IS NULL) <> (child_summary_id IS NULL))
) WITHOUT ROWID;
CREATE UNIQUE INDEX summary_edges_by_message ON summary_edges (child_message_id)
    WHERE child_message_id IS NOT NULL;
CREATE UNIQUE INDEX summary_edges_by_summary ON summary_edges (child_summary_id)
    WHERE child_summary_id IS NOT NULL;

-- What the model sees, in order. Positions are gapped: appends step by POSITION_STEP, and a
-- replaced range takes the position of its first item, so nothing is ever renumbered.
CREATE TABLE context_items (
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    position INTEGER NOT NULL,
    message_id INTEGER REFERENCES messages (id),
    summary_id INTEGER REFERENCES summaries (id),
    tokens INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, position),
    CHECK ((message_id IS NULL) <> (summary_id IS NULL))
) WITHOUT ROWID;

CREATE TABLE blobs (
    blob_id TEXT PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    kind TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    lines INTEGER NOT NULL,
    description TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE grants (
    id INTEGER PRIMARY KEY,
    grantee TEXT NOT NULL,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    expires_at INTEGER NOT NULL,
    token_cap INTEGER NOT NULL,
    revoked_at INTEGER,
    created_at INTEGER NOT NULL
);
CREATE INDEX grants_by_grantee ON grants (grantee);

-- Advancement keys of committed turns: a repeated key is a duplicate.
CREATE TABLE turn_commits (
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    advancement_key TEXT NOT NULL,
    committed_at INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, advancement_key)
) WITHOUT ROWID;

-- Small per-conversation state (bootstrap progress and the like).
CREATE TABLE conversation_state (
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (conversation_id, key)
) WITHOUT ROWID;

-- Store-wide state: the mirror of the index watermark, for the integrity check.
CREATE TABLE store_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"#,
    },
    // 2: which messages reference which blobs (a blob is readable by every conversation that
    // references it, and indexed under the messages that do); index work queued by forgetting
    // and archiving.
    Migration {
        rewrites_data: false,
        backfill: Some(super::blobs::backfill_references),
        sql: r#"
CREATE TABLE blob_references (
    message_id INTEGER NOT NULL REFERENCES messages (id),
    blob_id TEXT NOT NULL REFERENCES blobs (blob_id),
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    PRIMARY KEY (message_id, blob_id)
) WITHOUT ROWID;
CREATE INDEX blob_references_by_blob ON blob_references (blob_id, conversation_id);

-- Index work the database asks of whichever process maintains the index: the document of
-- each row here is removed and, if the row still exists outside an archived conversation,
-- added again. Written in the transaction that forgets, rewrites or archives the row.
CREATE TABLE index_tasks (key INTEGER PRIMARY KEY);
-- Messages forgotten from a conversation (what `next_seq` counts, less these, is stored).
ALTER TABLE conversations ADD COLUMN forgotten_messages INTEGER NOT NULL DEFAULT 0;
CREATE INDEX messages_by_time ON messages (conversation_id, created_at);
CREATE INDEX summaries_fallback ON summaries (conversation_id) WHERE level = 'fallback';
"#,
    },
    // 3: zstd dictionaries for message JSON (see `codec`). Builds before this one cannot read
    // rows compressed against them, and refuse the newer schema.
    Migration {
        rewrites_data: false,
        backfill: None,
        sql: r#"
-- Written once, in the transaction that first uses it; never changed or deleted. `id` is the
-- dictionary id the zstd frames carry.
CREATE TABLE compression_dictionaries (
    id INTEGER PRIMARY KEY,
    dictionary BLOB NOT NULL,
    created_at INTEGER NOT NULL
);
"#,
    },
    // 4: a row may lie under summaries of several conversations. A fork holds its parent's
    // rows by reference and folds them on its own, so a message sits under one summary of each
    // conversation that folded it (one per conversation: a context holds a row once, and a fold
    // takes it out). Under the unique indexes whichever session folded second failed on every
    // later call; dropping them is also what heals a store that already holds such a fork.
    Migration {
        rewrites_data: false,
        backfill: None,
        sql: r#"
DROP INDEX summary_edges_by_message;
DROP INDEX summary_edges_by_summary;
CREATE INDEX summary_edges_by_message ON summary_edges (child_message_id)
    WHERE child_message_id IS NOT NULL;
CREATE INDEX summary_edges_by_summary ON summary_edges (child_summary_id)
    WHERE child_summary_id IS NOT NULL;
"#,
    },
];

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long an open waits for the processes that still hold a database whose write-ahead log
/// was cut under them (each exits at its next use of it).
const CUT_LOG_WAIT: Duration = Duration::from_secs(10);

/// Opens a connection with the store's settings: WAL, `synchronous=NORMAL`, foreign keys,
/// a busy timeout, and a statement cache large enough for every query the store makes.
///
/// A database whose log was cut while another process holds it cannot be read here until
/// that process lets go: SQLite shares that process's view of the log, which claims what the
/// cut took. The open is tried again (a new connection each time: only the first process to
/// map the log's index afresh rebuilds it) for up to [`CUT_LOG_WAIT`], then fails with
/// [`StoreError::LogLost`], a passing failure.
pub(crate) fn connect(path: &Path) -> Result<Connection> {
    let started = std::time::Instant::now();
    loop {
        match connect_once(path) {
            Err(StoreError::LogLost { .. }) if started.elapsed() < CUT_LOG_WAIT => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

fn connect_once(path: &Path) -> Result<Connection> {
    let connection = Connection::open(path)?;
    // Before anything is read: a connection that closes last must not fold a cut log into
    // the database as zeroed pages. The writer checkpoints at its end instead, once it has
    // seen that the files are whole (`Writer::checkpoint_if_whole`).
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    connection.busy_timeout(Duration::from_secs(30))?;
    connection.set_prepared_statement_cache_capacity(64);
    let corrupt = |error: rusqlite::Error| StoreError::Corrupt {
        path: path.to_owned(),
        detail: error.to_string(),
    };
    // Processes opening a fresh store at once: turning WAL on takes the database's exclusive
    // lock, and SQLite may answer "locked" at once rather than wait (a lock upgrade that could
    // deadlock). That is a wait, not damage: tried again until the busy timeout.
    let started = std::time::Instant::now();
    let patiently = |step: &dyn Fn() -> rusqlite::Result<()>| loop {
        match step() {
            Err(error)
                if matches!(
                    error.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) && started.elapsed() < Duration::from_secs(30) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other,
        }
    };
    // The first read of the header: a file that is not SQLite fails here, and so does one
    // whose log was cut while another process holds it (tried again by `connect`).
    patiently(&|| {
        connection
            .query_row("SELECT count(*) FROM sqlite_master", [], |row| {
                row.get::<_, i64>(0)
            })
            .map(|_| ())
    })
    .map_err(|error| match super::opened::cut_log(path) {
        Some(log) if super::opened::is_damage(&error) => StoreError::LogLost { path: log },
        _ => corrupt(error),
    })?;
    patiently(&|| connection.pragma_update(None, "journal_mode", "WAL")).map_err(corrupt)?;
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    connection.pragma_update(None, "foreign_keys", "ON")?;
    connection.pragma_update(None, "temp_store", "MEMORY")?;
    // Checkpoint often and truncate the WAL after: its size stays small on disk.
    connection.pragma_update(None, "wal_autocheckpoint", 256)?;
    connection.pragma_update(None, "journal_size_limit", 1_048_576)?;
    Ok(connection)
}

fn version(connection: &Connection) -> Result<i64> {
    Ok(connection.pragma_query_value(None, "user_version", |row| row.get(0))?)
}

/// The database's schema version, refused if it is newer than this build.
fn known_version(connection: &Connection, path: &Path) -> Result<i64> {
    let found = version(connection)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// Refuses a database this build cannot read as it is (a read-only open never migrates).
/// A database no writer has set up yet (a process died between creating the file and
/// committing the migrations' transaction) is no store yet.
pub(crate) fn check_version(connection: &Connection, path: &Path) -> Result<()> {
    let found = known_version(connection, path)?;
    if found == 0 {
        return Err(StoreError::NotFound {
            what: "store",
            id: path.display().to_string(),
        });
    }
    if found < SCHEMA_VERSION {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!(
                "schema version {found} predates this build's {SCHEMA_VERSION}; a writing command (replay, serve) migrates it"
            ),
        });
    }
    Ok(())
}

/// Brings the database at `path` to [`SCHEMA_VERSION`]: every pending migration in one
/// `BEGIN IMMEDIATE` transaction, so a process killed while it sets up or upgrades a store
/// leaves the schema it found (a fresh file stays no store; a half-made one would be refused
/// by every read-only command). The version is read again inside the transaction: two
/// processes opening a fresh store at once migrate it once, the second waits and finds it done.
pub(crate) fn migrate(connection: &mut Connection, path: &Path) -> Result<()> {
    // A new database reclaims freed pages on request (`PRAGMA incremental_vacuum`); this only
    // takes effect before the first table exists.
    if version(connection)? == 0 {
        connection.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    loop {
        let found = known_version(connection, path)?;
        let Some(pending) = MIGRATIONS
            .get(found as usize..)
            .filter(|pending| !pending.is_empty())
        else {
            return Ok(());
        };
        if found > 0 && pending.iter().any(|migration| migration.rewrites_data) {
            let backup = path.with_extension(format!("v{found}.bak"));
            let _ = std::fs::remove_file(&backup);
            connection.execute("VACUUM INTO ?1", [backup.to_string_lossy()])?;
            tracing::info!(backup = %backup.display(), "copied the database aside before migrating to schema {SCHEMA_VERSION}");
        }
        let transaction =
            connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if version(&transaction)? != found {
            // Another process migrated it meanwhile: read the version again.
            continue;
        }
        for migration in pending {
            transaction.execute_batch(migration.sql)?;
            if let Some(backfill) = migration.backfill {
                backfill(&transaction)?;
            }
        }
        transaction.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        transaction.commit()?;
        return Ok(());
    }
}
