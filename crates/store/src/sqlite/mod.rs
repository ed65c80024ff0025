//! The embedded backend: a SQLite database and a tantivy index in one directory, written by
//! one writer thread. Its twin is `crate::pg` (PostgreSQL): the same jobs in files of the same
//! names — `archive`, `forget`, `schema`, `search` — with what they share at the crate root.
//!
//! - `read`: queries on reader connections; `write` and `writer`: the writer thread, its
//!   transactions and the index it keeps; `blobs`: large content's rows; `opened`: the files
//!   as opened, which explain SQLite's errors when they are replaced or cut.

mod archive;
mod blobs;
mod forget;
mod index_rows;
mod opened;
mod read;
mod schema;
mod search;
mod write;
mod writer;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};
use tokio::sync::oneshot;
use vilvona_core::archive::{ImportReport, SessionArchive};
use vilvona_embed::Embedder;

pub use schema::SCHEMA_VERSION;
#[cfg(feature = "fault-injection")]
pub use write::FaultPlan;

use crate::dag::{self, DagView};
use crate::error::{Result, StoreError};
use crate::index::{self, IndexSlot, RecallIndex};
use crate::rows::prepare;
use crate::types::*;
use crate::{HistoryStore, builtin_embedder, codec, private_dir};
use opened::OpenedDatabase;
use writer::{Command, Writer};

/// The file name of the database inside the store directory.
pub const DATABASE_FILE: &str = "vilvona.db";
/// The directory of the recall index inside the store directory.
pub const INDEX_DIR: &str = "index";

/// How to open a [`Store`].
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The directory holding the database and the index (created if missing).
    pub dir: PathBuf,
    /// Test hooks; the default injects nothing.
    #[cfg(feature = "fault-injection")]
    pub faults: FaultPlan,
    /// How long new rows may wait for an index commit (default 250 ms;
    /// `VILVONA_INDEX_COMMIT_MS`). Searches never wait for it.
    pub index_commit_delay: Option<Duration>,
    /// What embeds messages and summaries for recall by meaning (default: the built-in
    /// model; `None`: no vectors, semantic search refused).
    pub embedder: Option<Arc<dyn Embedder>>,
}

impl StoreConfig {
    /// Settings for the store in `dir`, with the defaults (and `VILVONA_INDEX_COMMIT_MS`).
    pub fn new(dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            dir: dir.into(),
            #[cfg(feature = "fault-injection")]
            faults: FaultPlan::default(),
            index_commit_delay: std::env::var("VILVONA_INDEX_COMMIT_MS")
                .ok()
                .and_then(|value| value.parse().ok())
                .map(Duration::from_millis),
            embedder: builtin_embedder(),
        }
    }
}

struct Inner {
    db_path: PathBuf,
    dir: PathBuf,
    /// `None` for a store opened read-only: every write is refused.
    commands: Mutex<Option<Sender<Command>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    /// `None` only for a read-only store without a usable index: searches read SQLite alone.
    index: Option<Arc<IndexSlot>>,
    /// Why a read-only store has no index although one is there (doctor reports it).
    index_problem: Option<String>,
    /// What embeds queries (and the rows the index does not hold) for recall by meaning.
    embedder: Option<Arc<dyn Embedder>>,
    read_only: bool,
    /// The dictionary new messages are compressed with (see `codec`).
    encoder: Arc<codec::EncoderSlot>,
    /// The database file as opened: SQLite's errors are explained by what happened to it.
    opened: Option<OpenedDatabase>,
}

impl Inner {
    /// `error` as the database's files explain it (replaced, its log cut under the process).
    fn explain(&self, error: StoreError) -> StoreError {
        match &self.opened {
            Some(opened) => opened.explain(error),
            None => error,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel lets the writer commit the index and exit; waiting for it frees
        // the index lock for whoever opens the store next.
        self.commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = self
            .writer_thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = thread.join();
        }
    }
}

/// The embedded store: a SQLite database and a tantivy index in one directory.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

impl Store {
    /// Opens (or creates) the store: migrates the database, opens the index (recreating it from
    /// the database if it is missing or unreadable), indexes what the last run did not, and
    /// starts the writer thread.
    pub async fn open(config: StoreConfig) -> Result<Store> {
        tokio::task::spawn_blocking(move || Store::open_blocking(config))
            .await
            .map_err(StoreError::TaskFailed)?
    }

    fn open_blocking(config: StoreConfig) -> Result<Store> {
        let dir = config.dir;
        private_dir(&dir).map_err(|error| StoreError::io(&dir, error))?;
        let db_path = dir.join(DATABASE_FILE);
        // Created private before SQLite opens it: its WAL and shared-memory files take the
        // database file's mode.
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&db_path)
            .map_err(|error| StoreError::io(&db_path, error))?;
        let mut connection = schema::connect(&db_path)?;
        schema::migrate(&mut connection, &db_path)?;
        let embedder = config.embedder;
        let (index, created) = RecallIndex::open(&dir.join(INDEX_DIR), embedder.clone())?;
        if created && index_rows::max_ids(&connection)? != (0, 0) {
            tracing::warn!(dir = %index.dir().display(), "the recall index was missing; rebuilding it from the database");
        }
        let index = Arc::new(IndexSlot::new(index));
        #[cfg(feature = "fault-injection")]
        let faults = config.faults;
        #[cfg(not(feature = "fault-injection"))]
        let faults = write::FaultPlan::default();
        let opened = OpenedDatabase::of(&connection);
        let encoder = Arc::new(codec::EncoderSlot::default());
        if let Some(stored) = codec::stored_encoder(&connection)? {
            encoder.set(stored);
        }
        let mut writer = Writer::new(
            connection,
            opened.clone(),
            index.clone(),
            faults,
            config.index_commit_delay,
            encoder.clone(),
        )?;
        writer.catch_up_index()?;
        let (sender, receiver) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("vilvona-store-writer".to_owned())
            .spawn(move || writer.run(receiver))
            .map_err(|error| StoreError::io(&dir, error))?;
        Ok(Store {
            inner: Arc::new(Inner {
                db_path,
                dir,
                commands: Mutex::new(Some(sender)),
                writer_thread: Mutex::new(Some(thread)),
                readers: Mutex::new(Vec::new()),
                index: Some(index),
                index_problem: None,
                embedder,
                read_only: false,
                encoder,
                opened,
            }),
        })
    }

    /// Opens an existing store for reading only, as inspection commands do: no writer thread,
    /// no migration, no index lock, so it works while any other process writes. The index is
    /// read as its maintainer last committed it, and rows beyond that are searched in SQLite.
    /// Every write fails with [`StoreError::ReadOnly`].
    pub async fn open_read_only(dir: impl Into<PathBuf>) -> Result<Store> {
        Store::open_read_only_with(dir, builtin_embedder()).await
    }

    /// [`Store::open_read_only`] with the embedding model the store's writers use.
    pub async fn open_read_only_with(
        dir: impl Into<PathBuf>,
        embedder: Option<Arc<dyn Embedder>>,
    ) -> Result<Store> {
        let dir = dir.into();
        tokio::task::spawn_blocking(move || {
            let db_path = dir.join(DATABASE_FILE);
            if !db_path.exists() {
                return Err(StoreError::NotFound {
                    what: "store",
                    id: dir.display().to_string(),
                });
            }
            let connection = schema::connect(&db_path)?;
            schema::check_version(&connection, &db_path)?;
            let opened = OpenedDatabase::of(&connection);
            let (index, index_problem) = match RecallIndex::open_existing(
                &dir.join(INDEX_DIR),
                embedder.clone(),
            ) {
                Ok(index) => (index.map(|index| Arc::new(IndexSlot::new(index))), None),
                // Written by another build or with another embedding model: nothing is wrong,
                // the next writer rebuilds it.
                Err(error) if error.is_other_index_schema() => {
                    tracing::info!(dir = %dir.display(), "the recall index was written by another build or with another embedding model; searching the database until a writer rebuilds it");
                    (None, None)
                }
                Err(error) => {
                    let problem = vilvona_core::error_chain(&error);
                    tracing::warn!(dir = %dir.display(), %problem, "the recall index cannot be read; searching the database directly");
                    (None, Some(problem))
                }
            };
            Ok(Store {
                inner: Arc::new(Inner {
                    db_path,
                    dir,
                    commands: Mutex::new(None),
                    writer_thread: Mutex::new(None),
                    // A store opened for reading keeps no connection idle (see `read`).
                    readers: Mutex::new(Vec::new()),
                    index,
                    index_problem,
                    embedder,
                    read_only: true,
                    encoder: Arc::default(),
                    opened,
                }),
            })
        })
        .await
        .map_err(StoreError::TaskFailed)?
    }

    /// True when the store was opened with [`Store::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Bytes on disk: the database (with its WAL) and the index.
    pub fn disk_bytes(&self) -> u64 {
        fn dir_bytes(path: &Path) -> u64 {
            std::fs::read_dir(path)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|entry| match entry.metadata() {
                            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
                            Ok(meta) => meta.len(),
                            Err(_) => 0,
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        dir_bytes(&self.inner.dir)
    }

    /// Documents the index serves (after pending commits).
    pub async fn index_doc_count(&self) -> Result<u64> {
        self.flush_index().await?;
        match &self.inner.index {
            Some(slot) => {
                let index = slot.current();
                index.refresh()?;
                Ok(index.doc_count())
            }
            None => Ok(0),
        }
    }

    /// Commits pending index documents (a no-op for a read-only store or one whose index
    /// another process maintains).
    pub async fn flush_index(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        self.call(|reply| Command::FlushIndex { reply }).await
    }

    /// Drops the index and rebuilds it from the database; returns the documents indexed.
    pub async fn rebuild_index(&self) -> Result<u64> {
        self.call(|reply| Command::RebuildIndex { reply }).await
    }

    /// Commits the index and stops the writer. Later calls fail with
    /// [`StoreError::WriterStopped`].
    pub async fn close(&self) -> Result<()> {
        let result = self.call(|reply| Command::Shutdown { reply }).await;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            inner
                .commands
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(thread) = inner
                .writer_thread
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                let _ = thread.join();
            }
        })
        .await
        .map_err(StoreError::TaskFailed)?;
        result
    }

    async fn call<T>(&self, command: impl FnOnce(writer::Reply<T>) -> Command) -> Result<T> {
        let (reply, response) = oneshot::channel();
        {
            let commands = self
                .inner
                .commands
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if self.inner.read_only {
                return Err(StoreError::ReadOnly(self.inner.dir.display().to_string()));
            }
            let sender = commands
                .as_ref()
                .ok_or_else(|| StoreError::WriterStopped("the store is closed"))?;
            sender
                .send(command(reply))
                .map_err(|_| StoreError::WriterStopped("the writer thread exited"))?;
        }
        response
            .await
            .map_err(|_| StoreError::WriterStopped("the writer thread exited"))?
            .map_err(|error| self.inner.explain(error))
    }

    /// Runs `query` on a reader connection on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = inner
                .readers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let connection = match pooled {
                Some(connection) => connection,
                None => schema::connect(&inner.db_path)?,
            };
            let result = query(&connection).map_err(|error| inner.explain(error));
            let mut readers = inner.readers.lock().unwrap_or_else(PoisonError::into_inner);
            if result.as_ref().is_err_and(StoreError::needs_reopen) {
                // The database was replaced or its log cut: every connection held goes, and
                // the next read opens it anew.
                readers.clear();
            } else if !inner.read_only && readers.len() < 4 {
                // A bounded pool: at most a few idle connections stay open. A store opened
                // for reading (the panel's server, an inspection command) keeps none: a
                // process that only reads never holds the database between its reads, so a
                // writer that must open it alone (its log cut under the last one) never
                // waits on it.
                readers.push(connection);
            }
            result
        })
        .await
        .map_err(StoreError::TaskFailed)?
    }
}

#[async_trait]
impl HistoryStore for Store {
    async fn conversation(&self, key: &ConversationKey) -> Result<Conversation> {
        let key = key.clone();
        let lookup = key.clone();
        if let Some(found) = self
            .read(move |connection| read::conversation_by_key(connection, &lookup))
            .await?
        {
            return Ok(found);
        }
        if self.inner.read_only {
            // Reading creates nothing: an unknown session has no history here.
            return Err(StoreError::NotFound {
                what: "session",
                id: format!("{} of agent {}", key.session_id, key.agent_id),
            });
        }
        self.call(|reply| Command::Conversation { key, reply })
            .await
    }

    async fn conversation_by_id(&self, id: ConversationId) -> Result<Option<Conversation>> {
        self.read(move |connection| read::conversation(connection, id))
            .await
    }

    async fn conversations(&self, agent_id: Option<&str>) -> Result<Vec<Conversation>> {
        let agent_id = agent_id.map(str::to_owned);
        self.read(move |connection| read::conversations(connection, agent_id.as_deref()))
            .await
    }

    async fn conversations_by_session_key(
        &self,
        agent_id: &str,
        session_key: &str,
    ) -> Result<Vec<Conversation>> {
        let (agent_id, session_key) = (agent_id.to_owned(), session_key.to_owned());
        self.read(move |connection| {
            read::conversations_by_session_key(connection, &agent_id, &session_key)
        })
        .await
    }

    async fn ingest(
        &self,
        conversation: ConversationId,
        messages: Vec<NewMessage>,
        advancement_key: Option<String>,
    ) -> Result<IngestOutcome> {
        // Serialized, keyed and compressed here, on the caller's thread: the writer thread
        // (the one that cannot be parallel) only stores.
        let encoder = self.inner.encoder.get();
        let messages = messages
            .into_iter()
            .map(|message| {
                let mut prepared = prepare(message)?;
                prepared.compressed = codec::encode(&prepared.json, encoder.as_deref());
                Ok(prepared)
            })
            .collect::<Result<Vec<_>>>()?;
        self.call(|reply| Command::Ingest {
            conversation,
            messages,
            advancement_key,
            reply,
        })
        .await
    }

    async fn context(&self, conversation: ConversationId) -> Result<Vec<ContextItem>> {
        self.read(move |connection| read::context(connection, conversation))
            .await
    }

    async fn replace(&self, plan: ReplacePlan) -> Result<ReplaceOutcome> {
        self.call(|reply| Command::Replace { plan, reply }).await
    }

    async fn append_items(&self, conversation: ConversationId, items: Vec<ItemRef>) -> Result<()> {
        self.call(|reply| Command::AppendItems {
            conversation,
            items,
            reply,
        })
        .await
    }

    async fn remove_context(&self, conversation: ConversationId) -> Result<u64> {
        self.call(|reply| Command::RemoveContext {
            conversation,
            reply,
        })
        .await
    }

    async fn update_summary(&self, update: SummaryUpdate) -> Result<bool> {
        self.call(|reply| Command::UpdateSummary { update, reply })
            .await
    }

    async fn message(&self, id: MessageId) -> Result<Option<StoredMessage>> {
        self.read(move |connection| read::message(connection, id))
            .await
    }

    async fn messages_in_seq_range(
        &self,
        conversation: ConversationId,
        first_seq: u64,
        last_seq: u64,
    ) -> Result<Vec<StoredMessage>> {
        self.read(move |connection| {
            read::messages_in_seq_range(connection, conversation, first_seq, last_seq)
        })
        .await
    }

    async fn summary(&self, row_id: SummaryRowId) -> Result<Option<StoredSummary>> {
        self.read(move |connection| read::summary(connection, row_id))
            .await
    }

    async fn summary_by_id(&self, summary_id: &str) -> Result<Option<StoredSummary>> {
        let summary_id = summary_id.to_owned();
        self.read(move |connection| read::summary_by_id(connection, &summary_id))
            .await
    }

    async fn children(&self, parent: SummaryRowId) -> Result<Vec<ItemContent>> {
        self.read(move |connection| read::children(connection, parent))
            .await
    }

    async fn parent_of(&self, item: ItemRef) -> Result<Option<StoredSummary>> {
        self.read(move |connection| read::parent_of(connection, item))
            .await
    }

    async fn top_ancestor(&self, item: ItemRef) -> Result<Option<StoredSummary>> {
        self.read(move |connection| read::top_ancestor(connection, item))
            .await
    }

    async fn context_refs(&self, conversation: ConversationId) -> Result<Vec<ContextRef>> {
        self.read(move |connection| read::context_refs(connection, conversation))
            .await
    }

    async fn items(&self, refs: Vec<ItemRef>) -> Result<Vec<ItemContent>> {
        self.read(move |connection| read::items(connection, &refs))
            .await
    }

    async fn search(&self, query: SearchQuery) -> Result<Vec<SearchHit>> {
        // No flush: rows the index has not committed yet (this process's or another's) are
        // searched in SQLite, so what was acknowledged is found at once, from any process.
        let index = self.inner.index.as_ref().map(|slot| slot.current());
        let embedder = self.inner.embedder.clone();
        self.read(move |connection| {
            // One read transaction: one snapshot for the hits and the summaries covering them,
            // and the database's shared memory locked once, not once per statement (a search
            // runs a few dozen).
            let _snapshot = connection.unchecked_transaction()?;
            search::run(connection, index.as_deref(), embedder.as_deref(), &query)
        })
        .await
    }

    async fn put_blob(&self, blob: NewBlob) -> Result<BlobInfo> {
        self.call(|reply| Command::PutBlob { blob, reply }).await
    }

    async fn blob_info(&self, blob_id: &str) -> Result<Option<BlobInfo>> {
        let blob_id = blob_id.to_owned();
        self.read(move |connection| read::blob_info(connection, &blob_id))
            .await
    }

    async fn blob_content(&self, blob_id: &str) -> Result<Option<String>> {
        let blob_id = blob_id.to_owned();
        self.read(move |connection| blobs::content(connection, &blob_id))
            .await
    }

    async fn blob_readers(&self, blob_id: &str) -> Result<Vec<ConversationId>> {
        let blob_id = blob_id.to_owned();
        self.read(move |connection| blobs::readers(connection, &blob_id))
            .await
    }

    async fn create_grant(&self, grant: NewGrant) -> Result<Grant> {
        self.call(|reply| Command::CreateGrant { grant, reply })
            .await
    }

    async fn revoke_grants(&self, grantee: &str) -> Result<u64> {
        let grantee = grantee.to_owned();
        self.call(|reply| Command::RevokeGrants { grantee, reply })
            .await
    }

    async fn delete_grant(&self, id: i64) -> Result<()> {
        self.call(|reply| Command::DeleteGrant { id, reply }).await
    }

    async fn grants(&self, grantee: &str) -> Result<Vec<Grant>> {
        let grantee = grantee.to_owned();
        self.read(move |connection| read::grants(connection, &grantee))
            .await
    }

    async fn state(&self, conversation: ConversationId, key: &str) -> Result<Option<String>> {
        let key = key.to_owned();
        self.read(move |connection| read::state(connection, conversation, &key))
            .await
    }

    async fn set_states(
        &self,
        conversation: ConversationId,
        entries: Vec<(String, String)>,
    ) -> Result<()> {
        self.call(|reply| Command::SetState {
            conversation,
            entries,
            reply,
        })
        .await
    }

    async fn summaries_above(
        &self,
        conversation: ConversationId,
        before_ms: Option<i64>,
    ) -> Result<Vec<StoredSummary>> {
        self.read(move |connection| forget::summaries_above(connection, conversation, before_ms))
            .await
    }

    async fn forget(&self, plan: ForgetPlan) -> Result<Option<ForgetReport>> {
        self.call(|reply| Command::Forget { plan, reply }).await
    }

    async fn set_archived(&self, conversation: ConversationId, archived: bool) -> Result<bool> {
        self.call(|reply| Command::SetArchived {
            conversation,
            archived,
            reply,
        })
        .await
    }

    async fn retire_session(
        &self,
        conversation: ConversationId,
        as_session_id: &str,
    ) -> Result<()> {
        let as_session_id = as_session_id.to_owned();
        self.call(|reply| Command::RetireSession {
            conversation,
            as_session_id,
            reply,
        })
        .await
    }

    async fn conversation_bytes(&self, conversation: ConversationId) -> Result<u64> {
        self.read(move |connection| read::conversation_bytes(connection, conversation))
            .await
    }

    async fn stand_in_summaries(&self, conversation: ConversationId) -> Result<Vec<StoredSummary>> {
        self.read(move |connection| read::stand_in_summaries(connection, conversation))
            .await
    }

    async fn dag_view(&self, conversation: ConversationId) -> Result<DagView> {
        self.read(move |connection| dag::view(connection, conversation))
            .await
    }

    async fn export(&self, conversation: ConversationId) -> Result<SessionArchive> {
        self.read(move |connection| {
            // One read transaction: one snapshot, whatever other processes write meanwhile.
            let snapshot = connection.unchecked_transaction()?;
            let archive = archive::export(&snapshot, conversation)?;
            snapshot.finish()?;
            Ok(archive)
        })
        .await
    }

    async fn import(&self, archive: SessionArchive) -> Result<(ConversationId, ImportReport)> {
        let archive = Box::new(archive);
        self.call(|reply| Command::Import { archive, reply }).await
    }

    async fn store_state(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_owned();
        self.read(move |connection| read::store_state(connection, &key))
            .await
    }

    async fn set_store_state(&self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.call(|reply| Command::SetStoreState { key, value, reply })
            .await
    }

    async fn reclaim_space(&self) -> Result<ReclaimReport> {
        let bytes_before = self.disk_bytes();
        self.call(|reply| Command::Reclaim { reply }).await?;
        Ok(ReclaimReport {
            bytes_before,
            bytes_after: self.disk_bytes(),
        })
    }

    async fn index_doc_count(&self) -> Result<u64> {
        Store::index_doc_count(self).await
    }

    async fn documents_waiting_for_vectors(&self) -> Result<u64> {
        self.flush_index().await?;
        match &self.inner.index {
            Some(slot) => {
                let index = slot.current();
                index.refresh()?;
                Ok(index.waiting_for_vectors(usize::MAX)?.len() as u64)
            }
            None => Ok(0),
        }
    }

    fn embedder(&self) -> Option<Arc<dyn Embedder>> {
        self.inner.embedder.clone()
    }

    async fn rebuild_index(&self) -> Result<u64> {
        Store::rebuild_index(self).await
    }

    fn disk_bytes(&self) -> u64 {
        Store::disk_bytes(self)
    }

    fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    async fn integrity_check(&self) -> Result<IntegrityReport> {
        /// Whether no index problem was reported yet (one sentence about the index is enough).
        fn index_problem_absent(report: &IntegrityReport) -> bool {
            !report
                .problems
                .iter()
                .any(|problem| problem.starts_with("the recall index"))
        }
        self.flush_index().await?;
        let index = self.inner.index.as_ref().map(|slot| slot.current());
        let index_problem = self.inner.index_problem.clone();
        self.read(move |connection| {
            // One snapshot for every statement: a writer's compaction between two of them
            // (a summary added, the context rewritten) would otherwise look like damage.
            let snapshot = connection.unchecked_transaction()?;
            let connection: &Connection = &snapshot;
            let mut report = IntegrityReport::default();
            // A damaged page stops the statement that met it, not the check: what was found
            // stands, and the damage is named.
            let checked = (|| -> Result<()> {
            read::integrity_problems(connection, &mut report)?;
            if let Some(problem) = index_problem {
                report.index_needs_rebuild = true;
                report.problems.push(format!(
                    "the recall index cannot be read ({problem}); searches read the database meanwhile; any writing command (or rebuild-index) rebuilds it"
                ));
            }
            let watermark = match &index {
                Some(index) => index.watermark()?,
                None => Default::default(),
            };
            report.indexed_messages_through = watermark.messages;
            report.recall = format!("index through message {}", watermark.messages);
            // Which model's vectors it holds, and how many documents wait for theirs (the
            // background is making them; not a problem).
            if let Some(embedder) = index.as_ref().and_then(|index| index.embedder()) {
                let waiting = index
                    .as_ref()
                    .map_or(Ok(0), |index| index.waiting_for_vectors(usize::MAX).map(|rows| rows.len()))
                    .unwrap_or(0);
                report.recall.push_str(&format!(", vectors of {}", embedder.name()));
                if waiting > 0 {
                    report.recall.push_str(&format!(" ({waiting} documents wait for theirs)"));
                }
            }
            report.indexed_summaries_through = watermark.summaries;
            if let Some(index) = &index {
                // The index opens, every segment reads, and it answers for a row it claims.
                let probed = index.refresh().and_then(|()| index.probe());
                let known: Option<i64> = connection
                    .query_row(
                        "SELECT max(id) FROM messages WHERE id <= ?1",
                        [watermark.messages],
                        |row| row.get(0),
                    )?;
                // Bytes overwritten in place are seen by the files' checksums alone.
                let probed = probed.map_err(|error| error.to_string()).and_then(|()| {
                    match index.damaged_files().map_err(|error| error.to_string())?.as_slice() {
                        [] => Ok(()),
                        files => Err(format!(
                            "its files {} fail their checksums",
                            files.iter().map(|file| file.display().to_string()).collect::<Vec<_>>().join(", ")
                        )),
                    }
                });
                let answered = match (probed, known) {
                    (Err(problem), _) => Err(problem),
                    (Ok(()), Some(id)) => match index.holds(index::IndexedRow::Message(id)) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(format!("it does not find message {id}, which it claims to hold")),
                        Err(error) => Err(error.to_string()),
                    },
                    (Ok(()), None) => Ok(()),
                };
                if let Err(problem) = answered {
                    report.index_needs_rebuild = true;
                    report.problems.push(format!(
                        "the recall index cannot be read ({problem}); searches read the database meanwhile; run `vilvona doctor --fix` (or rebuild-index)"
                    ));
                }
            }
            let undecodable: Option<String> = connection
                .query_row(
                    "SELECT value FROM store_state WHERE key = 'undecodable_messages'",
                    [],
                    |row| row.get(0),
                )
                .optional()?;
            if let Some(ids) = undecodable.filter(|ids| ids != "[]") {
                report.problems.push(format!(
                    "messages {ids} cannot be decoded (damaged database pages): their text is neither searched nor assembled; restore the database from a backup"
                ));
            }
            let (max_message, max_summary) = index_rows::max_ids(connection)?;
            // Gone (its directory, or its meta.json) while the database holds messages:
            // searches still work (they read the database), but every one reads all of it. (An
            // index that is there but behind is a writer catching up, not damage.)
            if index.is_none() && max_message > 0 && index_problem_absent(&report) {
                report.index_needs_rebuild = true;
                report.problems.push(format!(
                    "the recall index is missing while the database holds messages through {max_message}: searches read the database meanwhile (slower); any writing command (or rebuild-index) rebuilds it"
                ));
            }
            // Behind is normal while writers run (those rows are searched in SQLite); ahead
            // means the database lost rows the index still points at.
            if watermark.messages > max_message || watermark.summaries > max_summary {
                report.index_needs_rebuild = true;
                report.problems.push(format!(
                    "the recall index holds messages through {} and summaries through {}, but the database only has {max_message} and {max_summary} (rows were lost, e.g. with a deleted WAL); run `vilvona doctor --fix` (or rebuild-index)",
                    watermark.messages, watermark.summaries
                ));
            }
            Ok(())
            })();
            match checked {
                Ok(()) => Ok(report),
                Err(error) if error.is_damaged_page() => {
                    report.problems.push(format!(
                        "the check stopped at a damaged database page ({}); restore the database from a backup",
                        vilvona_core::error_chain(&error)
                    ));
                    Ok(report)
                }
                Err(error) => Err(error),
            }
        })
        .await
    }
}
