//! The PostgreSQL backend: the same [`HistoryStore`] over a database that several gateways on
//! several machines share. Its twin is `crate::sqlite`: the same jobs in files of the same
//! names (`archive`, `forget`, `schema`, `search`; reads and writes are here, in `mod.rs`), and
//! `follow` keeps this node's index beside the shared rows.
//!
//! - **Driver**: tokio-postgres with a deadpool pool. The trait is async and PostgreSQL is a
//!   network service, so an async driver keeps no thread waiting on the network; tokio-postgres
//!   is the driver the pool and the rest of the ecosystem build on, and its statements are the
//!   server's own SQL (no query builder, no compile-time database).
//! - **Concurrency across processes and machines**: every write is one transaction. Writes to a
//!   conversation's context (ingest, replace, append, remove) first lock the conversation's
//!   row (`SELECT … FOR UPDATE`), so two gateways writing one session take turns: an ingest
//!   sees the other's messages and stores nothing twice (unique keys, `ON CONFLICT`), and a
//!   replace compares the run it planned with the run under the lock: one of two compactions
//!   of the same run wins, the other is `Stale` and re-plans.
//! - **Ids** come from sequences, never reused.
//! - **Recall**: each node keeps a tantivy index that follows the database (`follow`), so
//!   BM25, phrases, CJK and regex answer exactly as on SQLite (the same index code); rows the
//!   index has not taken yet are found in the database (`search`). PostgreSQL's own
//!   full-text search was not used: its parsers neither split CJK runs nor rank by BM25.

mod archive;
mod follow;
mod forget;
mod schema;
mod search;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::types::{FromSql, FromSqlOwned};
use tokio_postgres::{NoTls, Row};
use vilvona_core::archive::{ImportReport, SessionArchive};
use vilvona_core::clock::now_ms;
use vilvona_core::summarize::SummaryKind;

use crate::HistoryStore;
use crate::dag::{self, DagSummary, DagView};
use crate::error::{PostgresError, Result, StoreError};
use crate::index::{IndexedRow, Waiting};
use crate::rows::prepare;
use crate::rows::{POSITION_STEP, hex16, summary_id};
use crate::types::*;
use follow::Follower;

use crate::index::SharedEmbedder;

/// Connections one process keeps at most.
const POOL_SIZE: usize = 8;

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<PgInner>,
}

struct PgInner {
    pool: Pool,
    /// The database as it may be shown (no password).
    name: String,
    read_only: bool,
    /// The store's tables' size when last measured (at open, by the integrity check and after
    /// reclaiming space): `disk_bytes` cannot wait for the server.
    bytes: AtomicU64,
    /// This node's recall index, when the store was opened with a place for it.
    follower: OnceLock<Arc<Follower>>,
    /// What embeds queries (and the rows the index does not hold) for recall by meaning.
    embedder: OnceLock<SharedEmbedder>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &self.inner.name)
            .finish()
    }
}

/// `postgres://user@host/db`, without the password, for messages.
fn display_name(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    format!(
        "postgres://{}@{}/{}",
        config.get_user().unwrap_or(""),
        host,
        config.get_dbname().unwrap_or("")
    )
}

/// Statements as this backend runs them: each prepared once per pooled connection (the pool
/// keeps every connection's cache), so a statement is one round trip instead of two.
#[async_trait]
pub(crate) trait Sql: deadpool_postgres::GenericClient + Sync {
    async fn rows(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let statement = self.prepare_cached(sql).await?;
        Ok(self.query(&statement, params).await?)
    }

    async fn row(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
        let statement = self.prepare_cached(sql).await?;
        Ok(self.query_one(&statement, params).await?)
    }

    async fn row_opt(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        let statement = self.prepare_cached(sql).await?;
        Ok(self.query_opt(&statement, params).await?)
    }

    async fn run(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let statement = self.prepare_cached(sql).await?;
        Ok(self.execute(&statement, params).await?)
    }
}

impl<T: deadpool_postgres::GenericClient + Sync> Sql for T {}

/// A column, typed; a mismatch is an error, never a panic.
fn at<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T> {
    Ok(row.try_get(index)?)
}

/// A conversation's messages by ingest key (`$2`): the key, id and seq of each found. One
/// probe of the unique index per key, whatever plan the prepared statement settled on while
/// the table was small.
const MESSAGES_BY_KEY: &str = "SELECT k.key, m.id, m.seq FROM unnest($2::BYTEA[]) AS k(key)
     CROSS JOIN LATERAL (SELECT id, seq FROM messages
                         WHERE conversation_id = $1 AND ingest_key = k.key LIMIT 1) AS m";

/// A conversation's messages by place (`$2`, seqs): the seq, id and stored JSON of each found.
const MESSAGES_BY_PLACE: &str = "SELECT p.seq, m.id, m.json FROM unnest($2::BIGINT[]) AS p(seq)
     CROSS JOIN LATERAL (SELECT id, json FROM messages
                         WHERE conversation_id = $1 AND seq = p.seq LIMIT 1) AS m";

/// The rows `sql` finds for `probes` in a conversation (`$1` the conversation, `$2` the
/// probes), by their first column; the second and third make the value. No probes, no query.
async fn probe<P, K, A, B>(
    client: &impl Sql,
    sql: &str,
    conversation: ConversationId,
    probes: &[P],
) -> Result<HashMap<K, (A, B)>>
where
    P: ToSql + Sync,
    K: FromSqlOwned + Eq + std::hash::Hash,
    A: FromSqlOwned,
    B: FromSqlOwned,
{
    if probes.is_empty() {
        return Ok(HashMap::new());
    }
    let mut found = HashMap::new();
    for row in client.rows(sql, &[&conversation.0, &probes]).await? {
        found.insert(at(&row, 0)?, (at(&row, 1)?, at(&row, 2)?));
    }
    Ok(found)
}

fn count(row: &Row, index: usize) -> Result<u64> {
    Ok(at::<i64>(row, index)?.max(0) as u64)
}

/// How often the process maintaining a node's index looks for new rows.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

impl PgStore {
    /// Connects, and brings the schema to this build's version (every node may do this at
    /// once: migrations take an advisory lock). With `index_dir`, this node keeps a recall
    /// index there (in a directory named after the database), following the database.
    pub async fn open(url: &str, index_dir: Option<&Path>) -> Result<PgStore> {
        PgStore::open_with(url, index_dir, crate::builtin_embedder()).await
    }

    /// [`PgStore::open`] with the embedding model for recall by meaning (`None`: none).
    pub async fn open_with(
        url: &str,
        index_dir: Option<&Path>,
        embedder: SharedEmbedder,
    ) -> Result<PgStore> {
        let store = PgStore::connect(url, false).await?;
        let _ = store.inner.embedder.set(embedder.clone());
        {
            let mut client = store.client().await?;
            schema::migrate(&mut client, &store.inner.name).await?;
        }
        if let Some(base) = index_dir {
            let dir = base.join(store.store_id().await?);
            let base = base.to_owned();
            let follower = tokio::task::spawn_blocking(move || {
                crate::private_dir(&base).map_err(|error| StoreError::io(&base, error))?;
                Follower::open(&dir, embedder)
            })
            .await
            .map_err(StoreError::TaskFailed)??;
            let _ = store.inner.follower.set(Arc::new(follower));
            store.follow(Waiting::ForAll).await?;
            store.follow_in_background();
        }
        store.measure().await?;
        Ok(store)
    }

    /// Connects for reading only: nothing is migrated or created, and every write fails with
    /// [`StoreError::ReadOnly`]. A node's index in `index_dir` is read as last committed.
    pub async fn open_read_only(url: &str, index_dir: Option<&Path>) -> Result<PgStore> {
        PgStore::open_read_only_with(url, index_dir, crate::builtin_embedder()).await
    }

    /// [`PgStore::open_read_only`] with the embedding model the store's writers use.
    pub async fn open_read_only_with(
        url: &str,
        index_dir: Option<&Path>,
        embedder: SharedEmbedder,
    ) -> Result<PgStore> {
        let store = PgStore::connect(url, true).await?;
        let _ = store.inner.embedder.set(embedder.clone());
        {
            let client = store.client().await?;
            schema::check_version(&client, &store.inner.name).await?;
        }
        if let Some(base) = index_dir {
            let dir = base.join(store.store_id().await?);
            let opened =
                tokio::task::spawn_blocking(move || Follower::open_existing(&dir, embedder))
                    .await
                    .map_err(StoreError::TaskFailed)?;
            match opened {
                Ok(Some(follower)) => {
                    let _ = store.inner.follower.set(Arc::new(follower));
                }
                Ok(None) => {}
                // Searches read the database; the node's next writer repairs the index.
                Err(error) => {
                    tracing::warn!(%error, "this node's recall index cannot be read; searching the database directly");
                }
            }
        }
        store.measure().await?;
        Ok(store)
    }

    /// The id the database was given when its schema was created.
    async fn store_id(&self) -> Result<String> {
        let client = self.client().await?;
        client
            .row_opt("SELECT value FROM store_state WHERE key = 'store_id'", &[])
            .await?
            .map(|row| at::<String>(&row, 0))
            .transpose()?
            .ok_or_else(|| StoreError::NotFound {
                what: "store id",
                id: self.inner.name.clone(),
            })
    }

    fn follower(&self) -> Option<&Arc<Follower>> {
        self.inner.follower.get()
    }

    /// Brings this node's index up to the database (when this process maintains it); with
    /// [`Waiting::ForNone`], documents whose vectors are still being made are committed by a
    /// later pass.
    async fn follow(&self, waiting: Waiting) -> Result<u64> {
        match self.follower() {
            Some(follower) if follower.maintains() => {
                let client = self.client().await?;
                follower.follow(&client, waiting).await
            }
            _ => Ok(0),
        }
    }

    /// Follows every [`FOLLOW_EVERY`] while the store is open.
    fn follow_in_background(&self) {
        let store = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(FOLLOW_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(inner) = store.upgrade() else {
                    return;
                };
                if let Err(error) = (PgStore { inner }).follow(Waiting::ForNone).await {
                    tracing::warn!(%error, "following the database into this node's recall index failed; trying again");
                }
            }
        });
    }

    async fn connect(url: &str, read_only: bool) -> Result<PgStore> {
        let config: tokio_postgres::Config = url.parse().map_err(|error| {
            StoreError::Postgres(PostgresError(format!(
                "the store URL is not a PostgreSQL connection string ({error})"
            )))
        })?;
        let name = display_name(&config);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|error| StoreError::Postgres(PostgresError(error.to_string())))?;
        let store = PgStore {
            inner: Arc::new(PgInner {
                pool,
                name,
                read_only,
                bytes: AtomicU64::new(0),
                follower: OnceLock::new(),
                embedder: OnceLock::new(),
            }),
        };
        // The first connection says at once whether the server is there.
        drop(store.client().await?);
        Ok(store)
    }

    /// The database, as messages name it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    async fn client(&self) -> Result<Object> {
        self.inner.pool.get().await.map_err(|error| match error {
            deadpool_postgres::PoolError::Backend(error) => StoreError::Postgres(PostgresError(
                format!("{}: {}", self.inner.name, PostgresError::describe(&error)),
            )),
            other => other.into(),
        })
    }

    fn writable(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(StoreError::ReadOnly(self.inner.name.clone()));
        }
        Ok(())
    }

    async fn measure(&self) -> Result<()> {
        let client = self.client().await?;
        // The store's own tables with their indexes and TOAST: the database's size would add
        // the catalogs of an empty database (several MB) to every figure.
        let row = client
            .row(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::BIGINT
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'",
                &[],
            )
            .await?;
        self.inner.bytes.store(count(&row, 0)?, Ordering::Relaxed);
        Ok(())
    }
}

const CONVERSATION_COLUMNS: &str = "c.id, c.agent_id, c.session_id, c.session_key, c.active,
    c.created_at, c.context_tokens, c.next_seq,
    (SELECT max(m.created_at) FROM messages m WHERE m.conversation_id = c.id
        AND m.seq = c.next_seq - 1), c.archived_at, c.forgotten_messages";

fn conversation_row(row: &Row) -> Result<Conversation> {
    let next_seq: i64 = at(row, 7)?;
    let forgotten: i64 = at(row, 10)?;
    Ok(Conversation {
        id: ConversationId(at(row, 0)?),
        agent_id: at(row, 1)?,
        session_id: at(row, 2)?,
        session_key: at(row, 3)?,
        active: at(row, 4)?,
        created_at_ms: at(row, 5)?,
        context_tokens: count(row, 6)?,
        message_count: next_seq.max(0) as u64,
        last_activity_ms: at(row, 8)?,
        archived_at_ms: at(row, 9)?,
        stored_messages: (next_seq - forgotten).max(0) as u64,
    })
}

const MESSAGE_COLUMNS: &str =
    "m.id, m.conversation_id, m.seq, m.role, m.json, m.tokens, m.created_at";

fn message_row(row: &Row, offset: usize) -> Result<StoredMessage> {
    Ok(StoredMessage {
        id: MessageId(at(row, offset)?),
        conversation: ConversationId(at(row, offset + 1)?),
        seq: count(row, offset + 2)?,
        role: at(row, offset + 3)?,
        json: at(row, offset + 4)?,
        tokens: count(row, offset + 5)?,
        created_at_ms: at(row, offset + 6)?,
    })
}

const SUMMARY_COLUMNS: &str = "s.id, s.summary_id, s.conversation_id, s.depth, s.kind, s.content,
    s.tokens, s.earliest_at, s.latest_at, s.first_seq, s.last_seq, s.level, s.summarizer,
    s.created_at";

fn summary_row(row: &Row, offset: usize) -> Result<StoredSummary> {
    Ok(StoredSummary {
        row_id: SummaryRowId(at(row, offset)?),
        summary_id: at(row, offset + 1)?,
        conversation: ConversationId(at(row, offset + 2)?),
        depth: count(row, offset + 3)? as u32,
        kind: parse_kind(&at::<String>(row, offset + 4)?)?,
        content: at(row, offset + 5)?,
        tokens: count(row, offset + 6)?,
        earliest_at_ms: at(row, offset + 7)?,
        latest_at_ms: at(row, offset + 8)?,
        first_seq: count(row, offset + 9)?,
        last_seq: count(row, offset + 10)?,
        level: parse_level(&at::<String>(row, offset + 11)?)?,
        summarizer: at(row, offset + 12)?,
        created_at_ms: at(row, offset + 13)?,
    })
}

fn item_of(message: Option<i64>, summary: Option<i64>) -> ItemRef {
    match (message, summary) {
        (Some(id), _) => ItemRef::Message(MessageId(id)),
        (None, Some(id)) => ItemRef::Summary(SummaryRowId(id)),
        (None, None) => ItemRef::Message(MessageId(-1)),
    }
}

fn columns_of(item: ItemRef) -> (Option<i64>, Option<i64>) {
    match item {
        ItemRef::Message(id) => (Some(id.0), None),
        ItemRef::Summary(id) => (None, Some(id.0)),
    }
}

async fn conversation_by_key(
    client: &impl Sql,
    key: &ConversationKey,
) -> Result<Option<Conversation>> {
    client
        .row_opt(
            &format!(
                "SELECT {CONVERSATION_COLUMNS} FROM conversations c
                 WHERE c.agent_id = $1 AND c.session_id = $2"
            ),
            &[&key.agent_id, &key.session_id],
        )
        .await?
        .as_ref()
        .map(conversation_row)
        .transpose()
}

async fn conversations_where(
    client: &impl Sql,
    condition: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Conversation>> {
    client
        .rows(
            &format!(
                "SELECT {CONVERSATION_COLUMNS} FROM conversations c WHERE {condition} ORDER BY c.id"
            ),
            params,
        )
        .await?
        .iter()
        .map(conversation_row)
        .collect()
}

pub(crate) async fn message(client: &impl Sql, id: MessageId) -> Result<Option<StoredMessage>> {
    client
        .row_opt(
            &format!("SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = $1"),
            &[&id.0],
        )
        .await?
        .map(|row| message_row(&row, 0))
        .transpose()
}

pub(crate) async fn summary(
    client: &impl Sql,
    row_id: SummaryRowId,
) -> Result<Option<StoredSummary>> {
    client
        .row_opt(
            &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = $1"),
            &[&row_id.0],
        )
        .await?
        .map(|row| summary_row(&row, 0))
        .transpose()
}

/// The summary directly above an item in the item's own conversation (a fork's summaries
/// may lie above its parent's rows too; the walk up follows the owner's). Twin of the SQLite
/// backend's.
async fn parent_row(client: &impl Sql, item: ItemRef) -> Result<Option<SummaryRowId>> {
    let (sql, id) = match item {
        ItemRef::Message(id) => (
            "SELECT e.parent_id FROM summary_edges e JOIN summaries p ON p.id = e.parent_id
             WHERE e.child_message_id = $1
               AND p.conversation_id = (SELECT conversation_id FROM messages WHERE id = $1)",
            id.0,
        ),
        ItemRef::Summary(id) => (
            "SELECT e.parent_id FROM summary_edges e JOIN summaries p ON p.id = e.parent_id
             WHERE e.child_summary_id = $1
               AND p.conversation_id = (SELECT conversation_id FROM summaries WHERE id = $1)",
            id.0,
        ),
    };
    client
        .row_opt(sql, &[&id])
        .await?
        .map(|row| at(&row, 0).map(SummaryRowId))
        .transpose()
}

/// The topmost summary above an item in the item's own conversation, in one read (the walk
/// up the edges runs in the database; a fork's summaries above the same rows are not on it).
pub(crate) async fn top_ancestor_row(
    client: &impl Sql,
    item: ItemRef,
) -> Result<Option<SummaryRowId>> {
    let (message, summary) = columns_of(item);
    client
        .row_opt(
            "WITH RECURSIVE owner(id) AS (
                 SELECT conversation_id FROM messages WHERE id = $1
                 UNION ALL SELECT conversation_id FROM summaries WHERE id = $2
             ),
             up(id, depth) AS (
                 SELECT e.parent_id, 1 FROM summary_edges e
                 JOIN summaries p ON p.id = e.parent_id AND p.conversation_id IN (SELECT id FROM owner)
                 WHERE e.child_message_id = $1 OR e.child_summary_id = $2
                 UNION ALL
                 SELECT e.parent_id, up.depth + 1 FROM summary_edges e JOIN up ON e.child_summary_id = up.id
                 JOIN summaries p ON p.id = e.parent_id AND p.conversation_id IN (SELECT id FROM owner)
                 WHERE up.depth < 10000 -- a damaged DAG's cycle ends here
             )
             SELECT id FROM up ORDER BY depth DESC LIMIT 1",
            &[&message, &summary],
        )
        .await?
        .map(|row| at(&row, 0).map(SummaryRowId))
        .transpose()
}

async fn items_in_range(
    client: &impl Sql,
    conversation: ConversationId,
    first: i64,
    last: i64,
) -> Result<Vec<(i64, ItemRef, u64)>> {
    client
        .rows(
            "SELECT position, message_id, summary_id, tokens FROM context_items
             WHERE conversation_id = $1 AND position BETWEEN $2 AND $3 ORDER BY position",
            &[&conversation.0, &first, &last],
        )
        .await?
        .iter()
        .map(|row| {
            Ok((
                at(row, 0)?,
                item_of(at(row, 1)?, at(row, 2)?),
                count(row, 3)?,
            ))
        })
        .collect()
}

async fn tokens_of(client: &impl Sql, item: ItemRef) -> Result<i64> {
    let (sql, id) = match item {
        ItemRef::Message(id) => ("SELECT tokens FROM messages WHERE id = $1", id.0),
        ItemRef::Summary(id) => ("SELECT tokens FROM summaries WHERE id = $1", id.0),
    };
    match client.row_opt(sql, &[&id]).await? {
        Some(row) => at(&row, 0),
        None => Err(StoreError::NotFound {
            what: "context item",
            id: format!("{item:?}"),
        }),
    }
}

/// Locks a conversation's row for the rest of the transaction: writes to one conversation's
/// context take turns, across every process and machine.
async fn lock_conversation(client: &impl Sql, conversation: ConversationId) -> Result<Row> {
    client
        .row_opt(
            "SELECT next_seq, next_position, archived_at IS NOT NULL FROM conversations
             WHERE id = $1 FOR UPDATE",
            &[&conversation.0],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "conversation",
            id: conversation.0.to_string(),
        })
}

/// The summaries above a conversation's messages (those before a time), lowest depth first;
/// when `None`, above every message and every summary of it (any conversation's: a fork's fold
/// of its parent's rows).
pub(crate) async fn summaries_above(
    client: &impl Sql,
    conversation: ConversationId,
    before_ms: Option<i64>,
) -> Result<Vec<StoredSummary>> {
    client
        .rows(
            &format!(
                "WITH RECURSIVE up(id) AS (
                     SELECT parent_id FROM (
                         SELECT e.parent_id FROM summary_edges e
                         JOIN messages m ON m.id = e.child_message_id
                         WHERE m.conversation_id = $1 AND ($2::BIGINT IS NULL OR m.created_at < $2)
                         UNION
                         SELECT e.parent_id FROM summary_edges e
                         JOIN summaries c ON c.id = e.child_summary_id
                         WHERE $2::BIGINT IS NULL AND c.conversation_id = $1
                     ) AS seed
                     UNION
                     SELECT e.parent_id FROM summary_edges e JOIN up ON e.child_summary_id = up.id
                 )
                 SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id IN (SELECT id FROM up)
                 ORDER BY s.depth, s.id"
            ),
            &[&conversation.0, &before_ms],
        )
        .await?
        .iter()
        .map(|row| summary_row(row, 0))
        .collect()
}

/// Time and seq range covered by a planned run of items, in one read.
async fn span_of(client: &impl Sql, items: &[(i64, ItemRef)], kind: SummaryKind) -> Result<Span> {
    let mut ids = Vec::with_capacity(items.len());
    for (_, item) in items {
        match (item, kind) {
            (ItemRef::Message(id), SummaryKind::Leaf) => ids.push(id.0),
            (ItemRef::Summary(id), SummaryKind::Condensed) => ids.push(id.0),
            (item, kind) => {
                return Err(StoreError::InvalidMessage(format!(
                    "a {} summary cannot cover {item:?}",
                    kind_str(kind)
                )));
            }
        }
    }
    let sql = match kind {
        SummaryKind::Leaf => {
            "SELECT min(created_at), max(created_at), min(seq), max(seq), count(*)
             FROM messages WHERE id = ANY($1)"
        }
        SummaryKind::Condensed => {
            "SELECT min(earliest_at), max(latest_at), min(first_seq), max(last_seq), count(*)
             FROM summaries WHERE id = ANY($1)"
        }
    };
    let row = client.row(sql, &[&ids]).await?;
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    if count(&row, 4)? != unique.len() as u64 {
        return Err(StoreError::NotFound {
            what: "context item",
            id: format!("one of {items:?}"),
        });
    }
    Ok(Span {
        earliest_ms: at(&row, 0)?,
        latest_ms: at(&row, 1)?,
        first_seq: at::<Option<i64>>(&row, 2)?.unwrap_or(i64::MAX),
        last_seq: at::<Option<i64>>(&row, 3)?.unwrap_or(i64::MIN),
    })
}

/// Writes a summary's ordered children.
async fn insert_edges(
    client: &impl Sql,
    parent: i64,
    children: &[(Option<i64>, Option<i64>)],
) -> Result<()> {
    let (messages, summaries): (Vec<Option<i64>>, Vec<Option<i64>>) =
        children.iter().copied().unzip();
    client
        .run(
            "INSERT INTO summary_edges (parent_id, ordinal, child_message_id, child_summary_id)
             SELECT $1, ordinal - 1, message, summary
             FROM unnest($2::BIGINT[], $3::BIGINT[]) WITH ORDINALITY AS t(message, summary, ordinal)",
            &[&parent, &messages, &summaries],
        )
        .await?;
    Ok(())
}

#[async_trait]
impl HistoryStore for PgStore {
    async fn conversation(&self, key: &ConversationKey) -> Result<Conversation> {
        let client = self.client().await?;
        if let Some(found) = conversation_by_key(&client, key).await? {
            return Ok(found);
        }
        if self.inner.read_only {
            return Err(StoreError::NotFound {
                what: "session",
                id: format!("{} of agent {}", key.session_id, key.agent_id),
            });
        }
        // Another node may create it meanwhile: theirs is the one.
        client
            .run(
                "INSERT INTO conversations (agent_id, session_id, session_key, created_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (agent_id, session_id) DO NOTHING",
                &[&key.agent_id, &key.session_id, &key.session_key, &now_ms()],
            )
            .await?;
        conversation_by_key(&client, key)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "conversation",
                id: key.session_id.clone(),
            })
    }

    async fn conversation_by_id(&self, id: ConversationId) -> Result<Option<Conversation>> {
        let client = self.client().await?;
        Ok(conversations_where(&client, "c.id = $1", &[&id.0])
            .await?
            .into_iter()
            .next())
    }

    async fn conversations(&self, agent_id: Option<&str>) -> Result<Vec<Conversation>> {
        let client = self.client().await?;
        conversations_where(&client, "$1::TEXT IS NULL OR c.agent_id = $1", &[&agent_id]).await
    }

    async fn conversations_by_session_key(
        &self,
        agent_id: &str,
        session_key: &str,
    ) -> Result<Vec<Conversation>> {
        let client = self.client().await?;
        conversations_where(
            &client,
            "c.agent_id = $1 AND c.session_key = $2",
            &[&agent_id, &session_key],
        )
        .await
    }

    async fn ingest(
        &self,
        conversation: ConversationId,
        messages: Vec<NewMessage>,
        advancement_key: Option<String>,
    ) -> Result<IngestOutcome> {
        self.writable()?;
        let messages = messages
            .into_iter()
            .map(prepare)
            .collect::<Result<Vec<_>>>()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        if let Some(key) = &advancement_key {
            // A node committing the same key meanwhile makes this wait, then find it.
            let inserted = transaction
                .run(
                    "INSERT INTO turn_commits (conversation_id, advancement_key, committed_at)
                     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[&conversation.0, key, &now_ms()],
                )
                .await?;
            if inserted == 0 {
                return Ok(IngestOutcome::DuplicateTurn);
            }
        }
        let row = lock_conversation(&transaction, conversation).await?;
        follow::order_rows(&transaction).await?;
        let (mut next_seq, mut next_position, archived): (i64, i64, bool) =
            (at(&row, 0)?, at(&row, 1)?, at(&row, 2)?);

        // What is stored already, in two reads (under the lock, nobody adds to it): the
        // messages with these keys, and those at these places.
        let keys: Vec<&[u8]> = messages
            .iter()
            .filter_map(|message| message.ingest_key.as_ref().map(|key| &key[..]))
            .collect();
        let by_key: HashMap<Vec<u8>, (i64, i64)> =
            probe(&transaction, MESSAGES_BY_KEY, conversation, &keys).await?;
        let places: Vec<i64> = messages
            .iter()
            .filter_map(|message| message.place.and_then(|place| i64::try_from(place).ok()))
            .collect();
        let by_place: HashMap<i64, (i64, String)> =
            probe(&transaction, MESSAGES_BY_PLACE, conversation, &places).await?;

        /// What becomes of one message: stored before, or the n-th new row of this call.
        enum Fate {
            Stored(i64, i64),
            New(usize),
        }
        let mut fates = Vec::with_capacity(messages.len());
        let mut new_rows: Vec<usize> = Vec::new();
        let mut new_by_key: HashMap<[u8; 16], usize> = HashMap::new();
        let mut new_by_seq: HashMap<i64, usize> = HashMap::new();
        for (index, message) in messages.iter().enumerate() {
            let known = match &message.ingest_key {
                Some(key) => match (by_key.get(&key[..]), new_by_key.get(key)) {
                    (Some((id, seq)), _) => Some(Fate::Stored(*id, *seq)),
                    (None, Some(slot)) => Some(Fate::New(*slot)),
                    (None, None) => None,
                },
                None => None,
            };
            let known = known.or_else(|| {
                let place = i64::try_from(message.place?).ok()?;
                match (by_place.get(&place), new_by_seq.get(&place)) {
                    (Some((id, json)), _) if *json == message.json => {
                        Some(Fate::Stored(*id, place))
                    }
                    (None, Some(slot)) if messages[new_rows[*slot]].json == message.json => {
                        Some(Fate::New(*slot))
                    }
                    _ => None,
                }
            });
            let fate = known.unwrap_or_else(|| {
                let slot = new_rows.len();
                new_rows.push(index);
                if let Some(key) = message.ingest_key {
                    new_by_key.insert(key, slot);
                }
                new_by_seq.insert(next_seq + slot as i64, slot);
                Fate::New(slot)
            });
            fates.push(fate);
        }

        let mut ids: Vec<i64> = Vec::new();
        if !new_rows.is_empty() {
            ids = transaction
                .rows(
                    "SELECT nextval('message_ids') FROM generate_series(1, $1::BIGINT)",
                    &[&(new_rows.len() as i64)],
                )
                .await?
                .iter()
                .map(|row| at(row, 0))
                .collect::<Result<_>>()?;
            ids.sort_unstable();
            let (mut seqs, mut roles, mut jsons, mut tokens, mut keys, mut times, mut positions) =
                (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
            for (slot, index) in new_rows.iter().enumerate() {
                let message = &messages[*index];
                let seq = next_seq + slot as i64;
                seqs.push(seq);
                roles.push(message.role.as_str());
                jsons.push(message.json.as_str());
                tokens.push(message.tokens as i64);
                keys.push(
                    message
                        .ingest_key
                        .unwrap_or_else(|| crate::rows::sequence_key(conversation, seq))
                        .to_vec(),
                );
                times.push(message.created_at_ms);
                positions.push(next_position + slot as i64 * POSITION_STEP);
            }
            transaction
                .run(
                    "INSERT INTO messages (id, conversation_id, seq, role, json, tokens, ingest_key, created_at)
                     SELECT id, $1, seq, role, json, tokens, key, at
                     FROM unnest($2::BIGINT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
                                 $7::BYTEA[], $8::BIGINT[]) AS t(id, seq, role, json, tokens, key, at)",
                    &[&conversation.0, &ids, &seqs, &roles, &jsons, &tokens, &keys, &times],
                )
                .await?;
            transaction
                .run(
                    "INSERT INTO context_items (conversation_id, position, message_id, tokens)
                     SELECT $1, position, id, tokens
                     FROM unnest($2::BIGINT[], $3::BIGINT[], $4::BIGINT[]) AS t(position, id, tokens)",
                    &[&conversation.0, &positions, &ids, &tokens],
                )
                .await?;
            for (slot, index) in new_rows.iter().enumerate() {
                for blob in &messages[*index].blobs {
                    transaction
                        .run(
                            "INSERT INTO blob_references (blob_id, message_id, conversation_id)
                             SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM blobs WHERE blob_id = $1)
                             ON CONFLICT DO NOTHING",
                            &[blob, &ids[slot], &conversation.0],
                        )
                        .await?;
                }
            }
            let added_tokens: i64 = tokens.iter().sum();
            next_seq += new_rows.len() as i64;
            next_position += new_rows.len() as i64 * POSITION_STEP;
            transaction
                .run(
                    // A session resumed after retention archived it is live again.
                    "UPDATE conversations
                     SET next_seq = $2, next_position = $3, context_tokens = context_tokens + $4,
                         archived_at = CASE WHEN $5 THEN NULL ELSE archived_at END
                     WHERE id = $1",
                    &[
                        &conversation.0,
                        &next_seq,
                        &next_position,
                        &added_tokens,
                        &archived,
                    ],
                )
                .await?;
        }
        transaction.commit().await?;
        let first_new_seq = next_seq - new_rows.len() as i64;
        let mut reported = vec![false; new_rows.len()];
        Ok(IngestOutcome::Stored(
            fates
                .into_iter()
                .map(|fate| match fate {
                    Fate::Stored(id, seq) => Ingested {
                        message_id: MessageId(id),
                        seq: seq as u64,
                        ingested: false,
                    },
                    // The first mention stores it; a repeat in the same call was stored by it.
                    Fate::New(slot) => Ingested {
                        message_id: MessageId(ids[slot]),
                        seq: (first_new_seq + slot as i64) as u64,
                        ingested: !std::mem::replace(&mut reported[slot], true),
                    },
                })
                .collect(),
        ))
    }

    async fn context(&self, conversation: ConversationId) -> Result<Vec<ContextItem>> {
        let client = self.client().await?;
        let rows = client
            .rows(
                &format!(
                    "SELECT ci.position, ci.tokens, ci.message_id, {MESSAGE_COLUMNS}, {SUMMARY_COLUMNS}
                     FROM context_items ci
                     LEFT JOIN messages m ON m.id = ci.message_id
                     LEFT JOIN summaries s ON s.id = ci.summary_id
                     WHERE ci.conversation_id = $1 ORDER BY ci.position"
                ),
                &[&conversation.0],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let content = if at::<Option<i64>>(row, 2)?.is_some() {
                    ItemContent::Message(message_row(row, 3)?)
                } else {
                    ItemContent::Summary(summary_row(row, 10)?)
                };
                Ok(ContextItem {
                    position: at(row, 0)?,
                    tokens: count(row, 1)?,
                    content,
                })
            })
            .collect()
    }

    async fn replace(&self, plan: ReplacePlan) -> Result<ReplaceOutcome> {
        self.writable()?;
        let (Some(first), Some(last)) = (plan.items.first(), plan.items.last()) else {
            return Ok(ReplaceOutcome::Stale);
        };
        let (first_position, last_position) = (first.0, last.0);
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        lock_conversation(&transaction, plan.conversation).await?;
        follow::order_rows(&transaction).await?;
        let current = items_in_range(
            &transaction,
            plan.conversation,
            first_position,
            last_position,
        )
        .await?;
        if current
            .iter()
            .map(|(position, item, _)| (*position, *item))
            .ne(plan.items.iter().copied())
        {
            return Ok(ReplaceOutcome::Stale);
        }
        let removed_tokens: i64 = current.iter().map(|(_, _, tokens)| *tokens as i64).sum();
        let span = span_of(&transaction, &plan.items, plan.summary.kind).await?;
        let summary_id = summary_id(plan.conversation, &plan.summary, &plan.items);
        let created_at = now_ms();
        let row = transaction
            .row(
                "INSERT INTO summaries (id, summary_id, conversation_id, depth, kind, content, tokens,
                     earliest_at, latest_at, first_seq, last_seq, level, summarizer, created_at)
                 VALUES (nextval('summary_ids'), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 RETURNING id",
                &[
                    &summary_id,
                    &plan.conversation.0,
                    &i64::from(plan.summary.depth),
                    &kind_str(plan.summary.kind),
                    &plan.summary.content,
                    &(plan.summary.tokens as i64),
                    &span.earliest_ms,
                    &span.latest_ms,
                    &span.first_seq,
                    &span.last_seq,
                    &level_str(plan.summary.level),
                    &plan.summary.summarizer,
                    &created_at,
                ],
            )
            .await?;
        let row_id: i64 = at(&row, 0)?;
        let children: Vec<_> = plan
            .items
            .iter()
            .map(|(_, item)| columns_of(*item))
            .collect();
        insert_edges(&transaction, row_id, &children).await?;
        transaction
            .run(
                "DELETE FROM context_items WHERE conversation_id = $1 AND position BETWEEN $2 AND $3",
                &[&plan.conversation.0, &first_position, &last_position],
            )
            .await?;
        transaction
            .run(
                "INSERT INTO context_items (conversation_id, position, summary_id, tokens)
                 VALUES ($1, $2, $3, $4)",
                &[
                    &plan.conversation.0,
                    &first_position,
                    &row_id,
                    &(plan.summary.tokens as i64),
                ],
            )
            .await?;
        transaction
            .run(
                "UPDATE conversations SET context_tokens = context_tokens - $2 + $3 WHERE id = $1",
                &[
                    &plan.conversation.0,
                    &removed_tokens,
                    &(plan.summary.tokens as i64),
                ],
            )
            .await?;
        transaction.commit().await?;
        Ok(ReplaceOutcome::Replaced(StoredSummary::published(
            row_id,
            summary_id,
            plan.conversation,
            plan.summary,
            span,
            created_at,
        )))
    }

    async fn append_items(&self, conversation: ConversationId, items: Vec<ItemRef>) -> Result<()> {
        self.writable()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let row = lock_conversation(&transaction, conversation).await?;
        let mut next_position: i64 = at(&row, 1)?;
        let mut added: i64 = 0;
        for item in items {
            let tokens = tokens_of(&transaction, item).await?;
            let (message, summary) = columns_of(item);
            transaction
                .run(
                    "INSERT INTO context_items (conversation_id, position, message_id, summary_id, tokens)
                     VALUES ($1, $2, $3, $4, $5)",
                    &[&conversation.0, &next_position, &message, &summary, &tokens],
                )
                .await?;
            next_position += POSITION_STEP;
            added += tokens;
        }
        transaction
            .run(
                "UPDATE conversations SET next_position = $2, context_tokens = context_tokens + $3
                 WHERE id = $1",
                &[&conversation.0, &next_position, &added],
            )
            .await?;
        transaction.commit().await?;
        Ok(())
    }

    async fn remove_context(&self, conversation: ConversationId) -> Result<u64> {
        self.writable()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        lock_conversation(&transaction, conversation).await?;
        let removed = transaction
            .run(
                "DELETE FROM context_items WHERE conversation_id = $1",
                &[&conversation.0],
            )
            .await?;
        transaction
            .run(
                "UPDATE conversations SET context_tokens = 0 WHERE id = $1",
                &[&conversation.0],
            )
            .await?;
        transaction.commit().await?;
        Ok(removed)
    }

    async fn update_summary(&self, update: SummaryUpdate) -> Result<bool> {
        self.writable()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let Some(current) = transaction
            .row_opt(
                &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = $1 FOR UPDATE"),
                &[&update.row_id.0],
            )
            .await?
            .map(|row| summary_row(&row, 0))
            .transpose()?
        else {
            return Ok(false);
        };
        if current.level != update.expected_level
            || current.summarizer != update.expected_summarizer
        {
            return Ok(false);
        }
        transaction
            .run(
                "UPDATE summaries SET content = $2, tokens = $3, level = $4, summarizer = $5 WHERE id = $1",
                &[
                    &update.row_id.0,
                    &update.content,
                    &(update.tokens as i64),
                    &level_str(update.level),
                    &update.summarizer,
                ],
            )
            .await?;
        // Every conversation that holds it (a fork holds its parent's summaries) keeps its
        // running total in step.
        let delta = update.tokens as i64 - current.tokens as i64;
        transaction
            .run(
                "UPDATE conversations c SET context_tokens = c.context_tokens + $2 * held.count
                 FROM (SELECT conversation_id, COUNT(*) AS count FROM context_items
                       WHERE summary_id = $1 GROUP BY conversation_id) AS held
                 WHERE c.id = held.conversation_id",
                &[&update.row_id.0, &delta],
            )
            .await?;
        transaction
            .run(
                "UPDATE context_items SET tokens = $2 WHERE summary_id = $1",
                &[&update.row_id.0, &(update.tokens as i64)],
            )
            .await?;
        // Every node's index replaces the summary's document.
        follow::log_changes(&transaction, &[IndexedRow::Summary(update.row_id.0)]).await?;
        transaction.commit().await?;
        Ok(true)
    }

    async fn message(&self, id: MessageId) -> Result<Option<StoredMessage>> {
        message(&self.client().await?, id).await
    }

    async fn messages_in_seq_range(
        &self,
        conversation: ConversationId,
        first_seq: u64,
        last_seq: u64,
    ) -> Result<Vec<StoredMessage>> {
        let client = self.client().await?;
        client
            .rows(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages m
                     WHERE m.conversation_id = $1 AND m.seq BETWEEN $2 AND $3 ORDER BY m.seq"
                ),
                &[
                    &conversation.0,
                    &(first_seq.min(i64::MAX as u64) as i64),
                    &(last_seq.min(i64::MAX as u64) as i64),
                ],
            )
            .await?
            .iter()
            .map(|row| message_row(row, 0))
            .collect()
    }

    async fn summary(&self, row_id: SummaryRowId) -> Result<Option<StoredSummary>> {
        summary(&self.client().await?, row_id).await
    }

    async fn summary_by_id(&self, summary_id: &str) -> Result<Option<StoredSummary>> {
        let client = self.client().await?;
        client
            .row_opt(
                &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.summary_id = $1"),
                &[&summary_id],
            )
            .await?
            .map(|row| summary_row(&row, 0))
            .transpose()
    }

    async fn children(&self, parent: SummaryRowId) -> Result<Vec<ItemContent>> {
        let client = self.client().await?;
        client
            .rows(
                &format!(
                    "SELECT e.child_message_id, {MESSAGE_COLUMNS}, {SUMMARY_COLUMNS}
                     FROM summary_edges e
                     LEFT JOIN messages m ON m.id = e.child_message_id
                     LEFT JOIN summaries s ON s.id = e.child_summary_id
                     WHERE e.parent_id = $1 ORDER BY e.ordinal"
                ),
                &[&parent.0],
            )
            .await?
            .iter()
            .map(|row| {
                Ok(if at::<Option<i64>>(row, 0)?.is_some() {
                    ItemContent::Message(message_row(row, 1)?)
                } else {
                    ItemContent::Summary(summary_row(row, 8)?)
                })
            })
            .collect()
    }

    async fn parent_of(&self, item: ItemRef) -> Result<Option<StoredSummary>> {
        let client = self.client().await?;
        match parent_row(&client, item).await? {
            Some(row_id) => summary(&client, row_id).await,
            None => Ok(None),
        }
    }

    async fn top_ancestor(&self, item: ItemRef) -> Result<Option<StoredSummary>> {
        let client = self.client().await?;
        match top_ancestor_row(&client, item).await? {
            Some(row_id) => summary(&client, row_id).await,
            None => Ok(None),
        }
    }

    async fn context_refs(&self, conversation: ConversationId) -> Result<Vec<ContextRef>> {
        let client = self.client().await?;
        client
            .rows(
                "SELECT ci.position, ci.message_id, ci.summary_id, ci.tokens, m.role = $2,
                        s.depth, s.level, s.first_seq, s.last_seq
                 FROM context_items ci LEFT JOIN messages m ON m.id = ci.message_id
                      LEFT JOIN summaries s ON s.id = ci.summary_id
                 WHERE ci.conversation_id = $1 ORDER BY ci.position",
                &[&conversation.0, &TOOL_RESULT_ROLE],
            )
            .await?
            .iter()
            .map(|row| {
                let depth: Option<i64> = at(row, 5)?;
                let level: Option<String> = at(row, 6)?;
                let summary = match (depth, level) {
                    (Some(depth), Some(level)) => Some(SummaryShape {
                        depth: depth as u32,
                        level: parse_level(&level)?,
                        first_seq: count(row, 7)?,
                        last_seq: count(row, 8)?,
                    }),
                    _ => None,
                };
                Ok(ContextRef {
                    position: at(row, 0)?,
                    item: item_of(at(row, 1)?, at(row, 2)?),
                    tokens: count(row, 3)?,
                    continues_unit: at::<Option<bool>>(row, 4)?.unwrap_or(false),
                    summary,
                })
            })
            .collect()
    }

    async fn items(&self, refs: Vec<ItemRef>) -> Result<Vec<ItemContent>> {
        // Two reads, whatever the number of items.
        let client = self.client().await?;
        let (mut messages, mut summaries) = (Vec::new(), Vec::new());
        for item in &refs {
            match item {
                ItemRef::Message(id) => messages.push(id.0),
                ItemRef::Summary(id) => summaries.push(id.0),
            }
        }
        let mut found: HashMap<ItemRef, ItemContent> = HashMap::with_capacity(refs.len());
        if !messages.is_empty() {
            for row in client
                .rows(
                    &format!("SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = ANY($1)"),
                    &[&messages],
                )
                .await?
            {
                let message = message_row(&row, 0)?;
                found.insert(ItemRef::Message(message.id), ItemContent::Message(message));
            }
        }
        if !summaries.is_empty() {
            for row in client
                .rows(
                    &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = ANY($1)"),
                    &[&summaries],
                )
                .await?
            {
                let summary = summary_row(&row, 0)?;
                found.insert(
                    ItemRef::Summary(summary.row_id),
                    ItemContent::Summary(summary),
                );
            }
        }
        refs.iter()
            .map(|item| {
                // The same item twice is read once and returned twice.
                found
                    .get(item)
                    .cloned()
                    .ok_or_else(|| StoreError::NotFound {
                        what: "context item",
                        id: format!("{item:?}"),
                    })
            })
            .collect()
    }

    async fn search(&self, query: SearchQuery) -> Result<Vec<SearchHit>> {
        // What this node's index lacks is found in the database anyway; following first
        // only keeps that part short.
        if query.mode != SearchMode::Regex
            && let Err(error) = self.follow(Waiting::ForNone).await
        {
            tracing::warn!(%error, "this node's recall index could not follow the database; searching it as it is");
        }
        let client = self.client().await?;
        let embedder = self.inner.embedder.get().cloned().flatten();
        search::run(
            &client,
            self.follower().map(Arc::as_ref),
            embedder.as_deref(),
            &query,
        )
        .await
    }

    async fn put_blob(&self, blob: NewBlob) -> Result<BlobInfo> {
        self.writable()?;
        let blob_id = format!(
            "file_{}",
            hex16(blake3::hash(blob.content.as_bytes()).as_bytes())
        );
        let client = self.client().await?;
        client
            .run(
                "INSERT INTO blobs (blob_id, conversation_id, kind, bytes, lines, description, content, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                &[
                    &blob_id,
                    &blob.conversation.0,
                    &blob.kind,
                    &(blob.content.len() as i64),
                    &(blob.content.lines().count() as i64),
                    &blob.description,
                    &blob.content,
                    &now_ms(),
                ],
            )
            .await?;
        drop(client);
        self.blob_info(&blob_id)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "blob",
                id: blob_id,
            })
    }

    async fn blob_info(&self, blob_id: &str) -> Result<Option<BlobInfo>> {
        let client = self.client().await?;
        client
            .row_opt(
                "SELECT blob_id, conversation_id, kind, bytes, lines, description, created_at
                 FROM blobs WHERE blob_id = $1",
                &[&blob_id],
            )
            .await?
            .map(|row| {
                Ok(BlobInfo {
                    blob_id: at(&row, 0)?,
                    conversation: ConversationId(at(&row, 1)?),
                    kind: at(&row, 2)?,
                    bytes: count(&row, 3)?,
                    lines: count(&row, 4)?,
                    description: at(&row, 5)?,
                    created_at_ms: at(&row, 6)?,
                })
            })
            .transpose()
    }

    async fn blob_content(&self, blob_id: &str) -> Result<Option<String>> {
        search::blob_content(&self.client().await?, blob_id).await
    }

    async fn blob_readers(&self, blob_id: &str) -> Result<Vec<ConversationId>> {
        let client = self.client().await?;
        client
            .rows(
                "SELECT conversation_id FROM blobs WHERE blob_id = $1
                 UNION SELECT conversation_id FROM blob_references WHERE blob_id = $1
                 ORDER BY 1",
                &[&blob_id],
            )
            .await?
            .iter()
            .map(|row| at(row, 0).map(ConversationId))
            .collect()
    }

    async fn create_grant(&self, grant: NewGrant) -> Result<Grant> {
        self.writable()?;
        let client = self.client().await?;
        let row = client
            .row(
                "INSERT INTO grants (grantee, conversation_id, expires_at, token_cap, created_at)
                 VALUES ($1, $2, $3, $4, $5) RETURNING id",
                &[
                    &grant.grantee,
                    &grant.conversation.0,
                    &grant.expires_at_ms,
                    &(grant.token_cap as i64),
                    &now_ms(),
                ],
            )
            .await?;
        Ok(Grant {
            id: at(&row, 0)?,
            grantee: grant.grantee,
            conversation: grant.conversation,
            expires_at_ms: grant.expires_at_ms,
            token_cap: grant.token_cap,
            revoked: false,
        })
    }

    async fn revoke_grants(&self, grantee: &str) -> Result<u64> {
        self.writable()?;
        let client = self.client().await?;
        Ok(client
            .run(
                "UPDATE grants SET revoked_at = $2 WHERE grantee = $1 AND revoked_at IS NULL",
                &[&grantee, &now_ms()],
            )
            .await?)
    }

    async fn delete_grant(&self, id: i64) -> Result<()> {
        self.writable()?;
        let client = self.client().await?;
        client
            .run("DELETE FROM grants WHERE id = $1", &[&id])
            .await?;
        Ok(())
    }

    async fn grants(&self, grantee: &str) -> Result<Vec<Grant>> {
        let client = self.client().await?;
        client
            .rows(
                "SELECT id, grantee, conversation_id, expires_at, token_cap, revoked_at
                 FROM grants WHERE grantee = $1 ORDER BY id",
                &[&grantee],
            )
            .await?
            .iter()
            .map(|row| {
                Ok(Grant {
                    id: at(row, 0)?,
                    grantee: at(row, 1)?,
                    conversation: ConversationId(at(row, 2)?),
                    expires_at_ms: at(row, 3)?,
                    token_cap: count(row, 4)?,
                    revoked: at::<Option<i64>>(row, 5)?.is_some(),
                })
            })
            .collect()
    }

    async fn state(&self, conversation: ConversationId, key: &str) -> Result<Option<String>> {
        let client = self.client().await?;
        client
            .row_opt(
                "SELECT value FROM conversation_state WHERE conversation_id = $1 AND key = $2",
                &[&conversation.0, &key],
            )
            .await?
            .map(|row| at(&row, 0))
            .transpose()
    }

    async fn set_states(
        &self,
        conversation: ConversationId,
        entries: Vec<(String, String)>,
    ) -> Result<()> {
        self.writable()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        for (key, value) in &entries {
            transaction
                .run(
                    "INSERT INTO conversation_state (conversation_id, key, value) VALUES ($1, $2, $3)
                     ON CONFLICT (conversation_id, key) DO UPDATE SET value = excluded.value",
                    &[&conversation.0, key, value],
                )
                .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    async fn integrity_check(&self) -> Result<IntegrityReport> {
        let mut client = self.client().await?;
        // One snapshot for every statement, as on SQLite.
        let transaction = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let counts = transaction
            .row(
                "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM summaries),
                        (SELECT count(*) FROM context_items)",
                &[],
            )
            .await?;
        let stand_ins = transaction.row(STAND_IN_SUMMARIES, &[]).await?;
        let mut report = IntegrityReport {
            messages: count(&counts, 0)?,
            summaries: count(&counts, 1)?,
            context_items: count(&counts, 2)?,
            recall: "searches read the database".to_owned(),
            stand_in_summaries: count(&stand_ins, 0)?,
            ..IntegrityReport::default()
        };
        if let Some(follower) = self.follower() {
            let index = follower.index();
            let watermark = index.watermark()?;
            report.indexed_messages_through = watermark.messages;
            report.indexed_summaries_through = watermark.summaries;
            report.recall = format!("this node's index through message {}", watermark.messages);
            if let Err(error) = index.refresh().and_then(|()| index.probe()) {
                report.index_needs_rebuild = true;
                report.problems.push(format!(
                    "this node's recall index in {} cannot be read ({}); rebuild-index rebuilds it, searches read the database meanwhile",
                    index.dir().display(),
                    vilvona_core::error_chain(&error)
                ));
            }
        }
        // Every message's JSON parses, as it did at ingest.
        let mut undecodable = 0u64;
        let mut first = None;
        for row in transaction
            .rows("SELECT id, json FROM messages", &[])
            .await?
        {
            if serde_json::from_str::<vilvona_core::AgentMessage>(at(&row, 1)?).is_err() {
                undecodable += 1;
                first = first.or(Some(at::<i64>(&row, 0)?));
            }
        }
        if let Some(first) = first {
            report.problems.push(format!(
                "{undecodable} messages do not decode (the first is message {first})"
            ));
        }
        let drifted = transaction
            .rows(
                "SELECT c.session_id FROM conversations c
                 WHERE c.context_tokens <> coalesce((SELECT sum(tokens) FROM context_items ci
                                                     WHERE ci.conversation_id = c.id), 0)",
                &[],
            )
            .await?;
        if let Some(row) = drifted.first() {
            report.problems.push(format!(
                "{} conversations' running token totals differ from their contexts (the first is session {:?})",
                drifted.len(),
                at::<String>(row, 0)?
            ));
        }
        let ids =
            |rows: Vec<Row>| -> Result<Vec<i64>> { rows.iter().map(|row| at(row, 0)).collect() };
        let messages = ids(transaction.rows("SELECT id FROM messages", &[]).await?)?;
        let summaries = transaction
            .rows("SELECT id, conversation_id FROM summaries", &[])
            .await?
            .iter()
            .map(|row| Ok((at(row, 0)?, at(row, 1)?)))
            .collect::<Result<Vec<(i64, i64)>>>()?;
        let edges = transaction
            .rows(
                "SELECT parent_id, child_message_id, child_summary_id FROM summary_edges",
                &[],
            )
            .await?
            .iter()
            .map(|row| Ok((at(row, 0)?, at(row, 1)?, at(row, 2)?)))
            .collect::<Result<Vec<_>>>()?;
        let roots = transaction
            .rows("SELECT message_id, summary_id FROM context_items", &[])
            .await?
            .iter()
            .map(|row| Ok((at(row, 0)?, at(row, 1)?)))
            .collect::<Result<Vec<_>>>()?;
        report
            .problems
            .extend(dag::problems_of(&messages, &summaries, &edges, &roots));
        transaction.commit().await?;
        drop(client);
        self.measure().await?;
        Ok(report)
    }

    async fn summaries_above(
        &self,
        conversation: ConversationId,
        before_ms: Option<i64>,
    ) -> Result<Vec<StoredSummary>> {
        summaries_above(&self.client().await?, conversation, before_ms).await
    }

    async fn forget(&self, plan: ForgetPlan) -> Result<Option<ForgetReport>> {
        self.writable()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let report = forget::apply(&transaction, &plan).await?;
        if report.is_some() {
            transaction.commit().await?;
        }
        Ok(report)
    }

    async fn set_archived(&self, conversation: ConversationId, archived: bool) -> Result<bool> {
        self.writable()?;
        let client = self.client().await?;
        let changed = client
            .run(
                "UPDATE conversations SET archived_at = CASE WHEN $2 THEN $3::BIGINT ELSE NULL END
                 WHERE id = $1 AND (archived_at IS NOT NULL) <> $2",
                &[&conversation.0, &archived, &now_ms()],
            )
            .await?;
        Ok(changed > 0)
    }

    async fn retire_session(
        &self,
        conversation: ConversationId,
        as_session_id: &str,
    ) -> Result<()> {
        self.writable()?;
        let client = self.client().await?;
        client
            .run(
                "UPDATE conversations SET session_id = $2 WHERE id = $1",
                &[&conversation.0, &as_session_id],
            )
            .await?;
        Ok(())
    }

    async fn conversation_bytes(&self, conversation: ConversationId) -> Result<u64> {
        let client = self.client().await?;
        let row = client
            .row(
                "SELECT ((SELECT coalesce(sum(pg_column_size(json)), 0) FROM messages WHERE conversation_id = $1)
                       + (SELECT coalesce(sum(octet_length(content)), 0) FROM summaries WHERE conversation_id = $1)
                       + (SELECT coalesce(sum(bytes), 0) FROM blobs WHERE conversation_id = $1))::BIGINT",
                &[&conversation.0],
            )
            .await?;
        count(&row, 0)
    }

    async fn reclaim_space(&self) -> Result<ReclaimReport> {
        self.writable()?;
        let bytes_before = self.disk_bytes();
        {
            let client = self.client().await?;
            // Marks the dead rows' space reusable (PostgreSQL keeps the files' size).
            client.batch_execute("VACUUM").await?;
        }
        self.measure().await?;
        Ok(ReclaimReport {
            bytes_before,
            bytes_after: self.disk_bytes(),
        })
    }

    async fn stand_in_summaries(&self, conversation: ConversationId) -> Result<Vec<StoredSummary>> {
        let client = self.client().await?;
        client
            .rows(
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM summaries s
                     WHERE s.conversation_id = $1 AND {WRITTEN_BY_A_STAND_IN}
                       AND EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id)
                     ORDER BY s.id"
                ),
                &[&conversation.0],
            )
            .await?
            .iter()
            .map(|row| summary_row(row, 0))
            .collect()
    }

    async fn dag_view(&self, conversation: ConversationId) -> Result<DagView> {
        let client = self.client().await?;
        let mut view = DagView::default();
        for row in client
            .rows(
                "SELECT s.id, s.summary_id, s.depth, s.kind, s.tokens,
                        EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id),
                        (SELECT count(*) FROM summary_edges e WHERE e.parent_id = s.id
                             AND e.child_message_id IS NOT NULL),
                        (SELECT coalesce(sum(m.tokens), 0)::BIGINT FROM summary_edges e
                             JOIN messages m ON m.id = e.child_message_id WHERE e.parent_id = s.id),
                        s.level, s.summarizer, s.created_at, s.earliest_at, s.latest_at
                 FROM summaries s WHERE s.conversation_id = $1 ORDER BY s.depth DESC, s.id",
                &[&conversation.0],
            )
            .await?
        {
            let row_id: i64 = at(&row, 0)?;
            view.summaries.push(DagSummary {
                row_id,
                summary_id: at(&row, 1)?,
                depth: count(&row, 2)? as u32,
                kind: at(&row, 3)?,
                tokens: count(&row, 4)?,
                in_context: at(&row, 5)?,
                child_summaries: client
                    .rows(
                        "SELECT child_summary_id FROM summary_edges
                         WHERE parent_id = $1 AND child_summary_id IS NOT NULL ORDER BY ordinal",
                        &[&row_id],
                    )
                    .await?
                    .iter()
                    .map(|row| at(row, 0))
                    .collect::<Result<_>>()?,
                child_messages: count(&row, 6)?,
                child_message_tokens: count(&row, 7)?,
                level: at(&row, 8)?,
                summarizer: at(&row, 9)?,
                created_at_ms: at(&row, 10)?,
                earliest_at_ms: at(&row, 11)?,
                latest_at_ms: at(&row, 12)?,
            });
        }
        let row = client
            .row(
                "SELECT count(*), coalesce(sum(tokens), 0)::BIGINT FROM context_items
                 WHERE conversation_id = $1 AND message_id IS NOT NULL",
                &[&conversation.0],
            )
            .await?;
        view.raw_messages = count(&row, 0)?;
        view.raw_message_tokens = count(&row, 1)?;
        Ok(view)
    }

    async fn store_state(&self, key: &str) -> Result<Option<String>> {
        let client = self.client().await?;
        client
            .row_opt("SELECT value FROM store_state WHERE key = $1", &[&key])
            .await?
            .map(|row| at(&row, 0))
            .transpose()
    }

    async fn set_store_state(&self, key: &str, value: &str) -> Result<()> {
        self.writable()?;
        let client = self.client().await?;
        client
            .run(
                "INSERT INTO store_state (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&key, &value],
            )
            .await?;
        Ok(())
    }

    async fn export(&self, conversation: ConversationId) -> Result<SessionArchive> {
        let mut client = self.client().await?;
        let transaction = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let archive = archive::export(&transaction, conversation).await?;
        transaction.commit().await?;
        Ok(archive)
    }

    async fn import(&self, archive: SessionArchive) -> Result<(ConversationId, ImportReport)> {
        self.writable()?;
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let imported = archive::import(&transaction, &archive).await?;
        transaction.commit().await?;
        drop(client);
        // A bulk of new rows: this node's index takes them now, not on its next tick.
        self.follow(Waiting::ForAll).await?;
        Ok(imported)
    }

    fn embedder(&self) -> Option<Arc<dyn crate::Embedder>> {
        self.inner.embedder.get().cloned().flatten()
    }

    async fn index_doc_count(&self) -> Result<u64> {
        self.follow(Waiting::ForAll).await?;
        match self.follower() {
            Some(follower) => {
                follower.index().refresh()?;
                Ok(follower.index().doc_count())
            }
            None => Ok(0),
        }
    }

    async fn documents_waiting_for_vectors(&self) -> Result<u64> {
        self.follow(Waiting::ForAll).await?;
        match self.follower() {
            Some(follower) => {
                follower.index().refresh()?;
                Ok(follower.index().waiting_for_vectors(usize::MAX)?.len() as u64)
            }
            None => Ok(0),
        }
    }

    async fn rebuild_index(&self) -> Result<u64> {
        self.writable()?;
        let follower = self.follower().ok_or(StoreError::NotOnPostgres(
            "a recall index without a place for it",
        ))?;
        follower.clear().await?;
        // The background follower may take some of the rows first: count what is there.
        self.follow(Waiting::ForAll).await?;
        Ok(follower.index().doc_count())
    }

    fn disk_bytes(&self) -> u64 {
        self.inner.bytes.load(Ordering::Relaxed)
    }

    fn is_read_only(&self) -> bool {
        self.inner.read_only
    }
}
