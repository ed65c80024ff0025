//! The PostgreSQL schema and its versioned migrations (`vilvona_schema.version`), the same
//! tables as the SQLite schema (twin: `crate::sqlite::schema`) in PostgreSQL's types.

use tokio_postgres::Client;

use crate::error::{Result, StoreError};

/// Every migration, in order; the schema's version is how many ran.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE conversations (
    id BIGSERIAL PRIMARY KEY,
    agent_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    session_key TEXT,
    active BOOLEAN NOT NULL DEFAULT TRUE,
    archived_at BIGINT,
    created_at BIGINT NOT NULL,
    next_seq BIGINT NOT NULL DEFAULT 0,
    next_position BIGINT NOT NULL DEFAULT 0,
    context_tokens BIGINT NOT NULL DEFAULT 0,
    forgotten_messages BIGINT NOT NULL DEFAULT 0,
    UNIQUE (agent_id, session_id)
);
CREATE INDEX conversations_by_key ON conversations (agent_id, session_key);

-- Row ids come from sequences: never reused, whichever node inserts.
CREATE SEQUENCE message_ids;
CREATE SEQUENCE summary_ids;

CREATE TABLE messages (
    id BIGINT PRIMARY KEY,
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    seq BIGINT NOT NULL,
    role TEXT NOT NULL,
    -- The message JSON exactly as ingested (large values are compressed by TOAST).
    json TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    ingest_key BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (conversation_id, seq),
    UNIQUE (conversation_id, ingest_key)
);
CREATE INDEX messages_by_time ON messages (conversation_id, created_at);

CREATE TABLE summaries (
    id BIGINT PRIMARY KEY,
    summary_id TEXT NOT NULL UNIQUE,
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    depth BIGINT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('leaf', 'condensed')),
    content TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    earliest_at BIGINT,
    latest_at BIGINT,
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    level TEXT NOT NULL,
    summarizer TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX summaries_by_conversation ON summaries (conversation_id, depth);

CREATE TABLE summary_edges (
    parent_id BIGINT NOT NULL REFERENCES summaries (id),
    ordinal BIGINT NOT NULL,
    child_message_id BIGINT REFERENCES messages (id),
    child_summary_id BIGINT REFERENCES summaries (id),
    PRIMARY KEY (parent_id, ordinal),
    CHECK ((child_message_id IS NULL) <> (child_summary_id IS NULL))
);
CREATE UNIQUE INDEX summary_edges_by_message ON summary_edges (child_message_id)
    WHERE child_message_id IS NOT NULL;
CREATE UNIQUE INDEX summary_edges_by_summary ON summary_edges (child_summary_id)
    WHERE child_summary_id IS NOT NULL;

CREATE TABLE context_items (
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    position BIGINT NOT NULL,
    message_id BIGINT REFERENCES messages (id),
    summary_id BIGINT REFERENCES summaries (id),
    tokens BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, position),
    CHECK ((message_id IS NULL) <> (summary_id IS NULL))
);
CREATE INDEX context_items_by_summary ON context_items (summary_id) WHERE summary_id IS NOT NULL;
CREATE INDEX context_items_by_message ON context_items (message_id) WHERE message_id IS NOT NULL;

CREATE TABLE blobs (
    blob_id TEXT PRIMARY KEY,
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    kind TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    lines BIGINT NOT NULL,
    description TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE blob_references (
    message_id BIGINT NOT NULL REFERENCES messages (id),
    blob_id TEXT NOT NULL REFERENCES blobs (blob_id),
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    PRIMARY KEY (message_id, blob_id)
);
CREATE INDEX blob_references_by_blob ON blob_references (blob_id, conversation_id);

CREATE TABLE grants (
    id BIGSERIAL PRIMARY KEY,
    grantee TEXT NOT NULL,
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    expires_at BIGINT NOT NULL,
    token_cap BIGINT NOT NULL,
    revoked_at BIGINT,
    created_at BIGINT NOT NULL
);
CREATE INDEX grants_by_grantee ON grants (grantee);

CREATE TABLE turn_commits (
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    advancement_key TEXT NOT NULL,
    committed_at BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, advancement_key)
);

CREATE TABLE conversation_state (
    conversation_id BIGINT NOT NULL REFERENCES conversations (id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (conversation_id, key)
);

CREATE TABLE store_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
-- Names this database for the nodes' local indexes (an index follows one database only).
INSERT INTO store_state (key, value)
    VALUES ('store_id', substr(md5(random()::TEXT || clock_timestamp()::TEXT), 1, 16));

-- Rows whose index documents must be replaced or removed (forgotten, rewritten), in the
-- order their transactions committed: every node's index applies them.
CREATE TABLE index_changes (
    seq BIGSERIAL PRIMARY KEY,
    key BIGINT NOT NULL
);
"#,
    // A row may lie under summaries of several conversations: a fork holds its parent's rows
    // by reference and folds them on its own (one summary per conversation; see the SQLite
    // schema's migration 4, its twin).
    r#"
DROP INDEX summary_edges_by_message;
DROP INDEX summary_edges_by_summary;
CREATE INDEX summary_edges_by_message ON summary_edges (child_message_id)
    WHERE child_message_id IS NOT NULL;
CREATE INDEX summary_edges_by_summary ON summary_edges (child_summary_id)
    WHERE child_summary_id IS NOT NULL;
"#,
];

/// The schema version this build writes.
pub(crate) const PG_SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock migrations take ("vilvona" in ASCII): every node migrating at once
/// applies each migration once.
const MIGRATION_LOCK: i64 = 0x0076_696c_766f_6e61;

/// Brings the database to [`PG_SCHEMA_VERSION`]: every pending migration in one transaction
/// under an advisory lock (every node migrating at once applies each once), so a node stopped
/// while it sets up or upgrades the schema leaves the one it found. A newer schema is refused.
pub(crate) async fn migrate(client: &mut Client, name: &str) -> Result<()> {
    let transaction = client.transaction().await?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    transaction
        .batch_execute("CREATE TABLE IF NOT EXISTS vilvona_schema (version BIGINT NOT NULL)")
        .await?;
    let found: Option<i64> = transaction
        .query_opt("SELECT version FROM vilvona_schema", &[])
        .await?
        .map(|row| row.get(0));
    let from = found.unwrap_or(0);
    if from > PG_SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: name.into(),
            found: from,
            supported: PG_SCHEMA_VERSION,
        });
    }
    let Some(pending) = usize::try_from(from)
        .ok()
        .and_then(|from| MIGRATIONS.get(from..))
    else {
        return Err(StoreError::Corrupt {
            path: name.into(),
            detail: format!("vilvona_schema holds version {from}, below any schema"),
        });
    };
    for migration in pending {
        transaction.batch_execute(migration).await?;
    }
    if found.is_none() {
        transaction
            .execute(
                "INSERT INTO vilvona_schema (version) VALUES ($1)",
                &[&PG_SCHEMA_VERSION],
            )
            .await?;
    } else if from < PG_SCHEMA_VERSION {
        transaction
            .execute(
                "UPDATE vilvona_schema SET version = $1",
                &[&PG_SCHEMA_VERSION],
            )
            .await?;
    }
    transaction.commit().await?;
    Ok(())
}

/// Refuses a database this build cannot read as it is (a read-only open never migrates).
pub(crate) async fn check_version(client: &Client, name: &str) -> Result<()> {
    let found: i64 = match client
        .query_opt("SELECT version FROM vilvona_schema", &[])
        .await
    {
        Ok(row) => row.map_or(0, |row| row.get(0)),
        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => 0,
        Err(error) => return Err(error.into()),
    };
    if found == 0 {
        return Err(StoreError::NotFound {
            what: "store",
            id: name.to_owned(),
        });
    }
    if found > PG_SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: name.into(),
            found,
            supported: PG_SCHEMA_VERSION,
        });
    }
    if found < PG_SCHEMA_VERSION {
        return Err(StoreError::Corrupt {
            path: name.into(),
            detail: format!(
                "schema version {found} predates this build's {PG_SCHEMA_VERSION}; a writing command (replay, serve) migrates it"
            ),
        });
    }
    Ok(())
}
