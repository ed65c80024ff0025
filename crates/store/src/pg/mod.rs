//! The PostgreSQL backend: the same [`HistoryStore`] over a database that several gateways on
//! several machines share. Its twin is `crate::sqlite`: the same jobs in files of the same
//! names (`archive`, `forget`, `read`, `schema`, `search`, `write`; the store's handle, its pool
//! and the trait's dispatch are here), and `follow` keeps this node's index beside the shared
//! rows.
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
mod read;
mod schema;
mod search;
mod write;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::types::FromSql;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use vilvona_core::archive::{ImportReport, SessionArchive};
use vilvona_core::clock::now_ms;

use crate::HistoryStore;
use crate::dag::{self, DagView};
use crate::error::{PostgresError, Result, StoreError};
use crate::index::Waiting;
use crate::rows::hex16;
use crate::types::*;
use follow::Follower;
use read::{
    SUMMARY_COLUMNS, conversation_by_key, conversations_where, message, parent_row,
    summaries_above, summary, summary_row, top_ancestor_row,
};

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
        write::ingest(
            &mut self.client().await?,
            conversation,
            messages,
            advancement_key,
        )
        .await
    }

    async fn context(&self, conversation: ConversationId) -> Result<Vec<ContextItem>> {
        read::context(&self.client().await?, conversation).await
    }

    async fn replace(&self, plan: ReplacePlan) -> Result<ReplaceOutcome> {
        self.writable()?;
        write::replace(&mut self.client().await?, plan).await
    }

    async fn append_items(&self, conversation: ConversationId, items: Vec<ItemRef>) -> Result<()> {
        self.writable()?;
        write::append_items(&mut self.client().await?, conversation, items).await
    }

    async fn remove_context(&self, conversation: ConversationId) -> Result<u64> {
        self.writable()?;
        write::remove_context(&mut self.client().await?, conversation).await
    }

    async fn update_summary(&self, update: SummaryUpdate) -> Result<bool> {
        self.writable()?;
        write::update_summary(&mut self.client().await?, update).await
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
        read::messages_in_seq_range(&self.client().await?, conversation, first_seq, last_seq).await
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
        read::children(&self.client().await?, parent).await
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
        read::context_refs(&self.client().await?, conversation).await
    }

    async fn items(&self, refs: Vec<ItemRef>) -> Result<Vec<ItemContent>> {
        read::items(&self.client().await?, refs).await
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
                     ORDER BY EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id) DESC,
                              s.id"
                ),
                &[&conversation.0],
            )
            .await?
            .iter()
            .map(|row| summary_row(row, 0))
            .collect()
    }

    async fn dag_view(&self, conversation: ConversationId) -> Result<DagView> {
        read::dag_view(&self.client().await?, conversation).await
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
