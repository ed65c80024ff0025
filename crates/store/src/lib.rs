//! vilvona's storage: SQLite is the source of truth, a tantivy index serves recall.
//!
//! - Every message is stored once, verbatim (its JSON), with a token count and an ingest key;
//!   ingesting it again (a restart, a retry, a replay) stores nothing.
//! - The *context* of a conversation is an ordered list of items (messages and summaries) with
//!   gapped positions; compaction replaces a contiguous run with one summary through a
//!   compare-and-swap ([`HistoryStore::replace`]), so summarization runs outside any transaction.
//! - One writer thread owns the write connection and the index writer; reads use their own
//!   connections on blocking threads. No async worker thread ever waits on SQLite.
//! - The index holds no text (snippets come from SQLite) and can always be rebuilt from SQLite.
//!
//! Engines see the store through the [`HistoryStore`] trait. Two backends implement it, twins
//! file for file: [`Store`] (`sqlite/`, the embedded SQLite database with its index in one
//! directory) and [`PgStore`] (`pg/`, a PostgreSQL database several machines share, each node
//! with its own index). What both share sits at the crate root; `index/` is the recall index
//! (text and vectors) either keeps.

#![warn(missing_docs)]

// What both backends share: the rows, their encoding and the rules searches and archives keep.
mod archive;
mod blobs;
mod codec;
mod dag;
mod error;
mod forget;
mod highlight;
mod rows;
mod search;
mod tokenize;
mod types;

// The recall index (text and vectors) both backends keep beside their rows.
mod index;

// The backends: twins, file for file, where they do the same job.
mod pg;
mod sqlite;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use vilvona_core::archive::{ImportReport, SessionArchive};
pub use vilvona_embed::Embedder;

pub use blobs::{BLOB_ID_KEY, referenced_blobs};
pub use dag::{DagSummary, DagView};
pub use error::{DatabaseError, IndexError, PostgresError, Result, StoreError};
pub use pg::PgStore;
pub use search::{MAX_QUERY_BYTES, MAX_QUERY_WORDS, fuse_hits, within_query_bounds};
#[cfg(feature = "fault-injection")]
pub use sqlite::FaultPlan;
pub use sqlite::{DATABASE_FILE, INDEX_DIR, SCHEMA_VERSION, Store, StoreConfig};
pub use types::*;

/// What engines need from storage. Every read is scoped by the caller to an agent's
/// conversations; searches take the scope explicitly.
#[async_trait]
pub trait HistoryStore: Send + Sync + std::fmt::Debug {
    /// The conversation for an agent's session, created on first use.
    async fn conversation(&self, key: &ConversationKey) -> Result<Conversation>;
    /// A conversation by its row id.
    async fn conversation_by_id(&self, id: ConversationId) -> Result<Option<Conversation>>;
    /// Every conversation, or an agent's.
    async fn conversations(&self, agent_id: Option<&str>) -> Result<Vec<Conversation>>;
    /// An agent's conversations that share a session key, oldest first.
    async fn conversations_by_session_key(
        &self,
        agent_id: &str,
        session_key: &str,
    ) -> Result<Vec<Conversation>>;

    /// Stores messages in order and appends the new ones to the context, in one transaction.
    /// With an `advancement_key`, the whole call happens at most once per key.
    async fn ingest(
        &self,
        conversation: ConversationId,
        messages: Vec<NewMessage>,
        advancement_key: Option<String>,
    ) -> Result<IngestOutcome>;

    /// The context, in order, with each item's message or summary.
    async fn context(&self, conversation: ConversationId) -> Result<Vec<ContextItem>>;
    /// Replaces a planned run of context items with one summary, if the run is unchanged.
    async fn replace(&self, plan: ReplacePlan) -> Result<ReplaceOutcome>;
    /// Appends existing messages or summaries (of any conversation) to a context, by reference.
    async fn append_items(&self, conversation: ConversationId, items: Vec<ItemRef>) -> Result<()>;
    /// Empties a context (its rows stay); returns how many items it had.
    async fn remove_context(&self, conversation: ConversationId) -> Result<u64>;
    /// Rewrites a summary's text in place, keeping its id and edges. False if it changed meanwhile.
    async fn update_summary(&self, update: SummaryUpdate) -> Result<bool>;

    /// A stored message by id.
    async fn message(&self, id: MessageId) -> Result<Option<StoredMessage>>;
    /// A conversation's messages with `seq` from `first_seq` through `last_seq`, in order.
    async fn messages_in_seq_range(
        &self,
        conversation: ConversationId,
        first_seq: u64,
        last_seq: u64,
    ) -> Result<Vec<StoredMessage>>;
    /// A summary by row id.
    async fn summary(&self, row_id: SummaryRowId) -> Result<Option<StoredSummary>>;
    /// A summary by its public id (`sum_…`).
    async fn summary_by_id(&self, summary_id: &str) -> Result<Option<StoredSummary>>;
    /// A summary's ordered children.
    async fn children(&self, parent: SummaryRowId) -> Result<Vec<ItemContent>>;
    /// The summary directly above an item, if it has been summarized.
    async fn parent_of(&self, item: ItemRef) -> Result<Option<StoredSummary>>;
    /// The topmost summary above an item: the one in the context that covers it.
    async fn top_ancestor(&self, item: ItemRef) -> Result<Option<StoredSummary>>;
    /// The context as references and tokens only (cheap: no message JSON).
    async fn context_refs(&self, conversation: ConversationId) -> Result<Vec<ContextRef>>;
    /// The contents of items, in the order given.
    async fn items(&self, refs: Vec<ItemRef>) -> Result<Vec<ItemContent>>;

    /// Searches the given conversations of an agent (see [`SearchQuery`]).
    async fn search(&self, query: SearchQuery) -> Result<Vec<SearchHit>>;

    /// Stores large content once (by content hash); returns what describes it.
    async fn put_blob(&self, blob: NewBlob) -> Result<BlobInfo>;
    /// A stored file's metadata.
    async fn blob_info(&self, blob_id: &str) -> Result<Option<BlobInfo>>;
    /// A stored file's text.
    async fn blob_content(&self, blob_id: &str) -> Result<Option<String>>;
    /// The conversations that may read a blob: the one that stored it first and every one
    /// whose messages reference it.
    async fn blob_readers(&self, blob_id: &str) -> Result<Vec<ConversationId>>;

    /// Lets a subagent's session read a conversation until the grant expires.
    async fn create_grant(&self, grant: NewGrant) -> Result<Grant>;
    /// Revokes every grant of a grantee; returns how many were active.
    async fn revoke_grants(&self, grantee: &str) -> Result<u64>;
    /// Removes a grant (a spawn rolled back).
    async fn delete_grant(&self, id: i64) -> Result<()>;
    /// The grants a session holds, live or not.
    async fn grants(&self, grantee: &str) -> Result<Vec<Grant>>;

    /// A conversation's state value under `key`.
    async fn state(&self, conversation: ConversationId, key: &str) -> Result<Option<String>>;
    /// Sets a conversation's state value under `key`.
    async fn set_state(&self, conversation: ConversationId, key: &str, value: &str) -> Result<()> {
        self.set_states(conversation, vec![(key.to_owned(), value.to_owned())])
            .await
    }
    /// Sets several of a conversation's state values at once: all of them or none.
    async fn set_states(
        &self,
        conversation: ConversationId,
        entries: Vec<(String, String)>,
    ) -> Result<()>;

    /// Checks the whole store without changing it (rows decode, the DAG is sound, the index
    /// answers).
    async fn integrity_check(&self) -> Result<IntegrityReport>;

    /// The summaries above a conversation's messages created before a time (all of its
    /// messages with `None`), lowest depth first: what forgetting them touches.
    async fn summaries_above(
        &self,
        conversation: ConversationId,
        before_ms: Option<i64>,
    ) -> Result<Vec<StoredSummary>>;
    /// Forgets as planned, in one transaction; `None` when the plan is stale (plan again).
    async fn forget(&self, plan: ForgetPlan) -> Result<Option<ForgetReport>>;
    /// Archives a conversation (its rows leave the index; searches read them from the
    /// database) or makes it live again; false when it already was.
    async fn set_archived(&self, conversation: ConversationId, archived: bool) -> Result<bool>;
    /// The conversation stops answering for its session, which the host began anew under the
    /// same id: it keeps all it holds under `as_session_id` (and its key), and the session's
    /// next call begins a new conversation.
    async fn retire_session(&self, conversation: ConversationId, as_session_id: &str)
    -> Result<()>;
    /// Bytes a conversation's rows hold (messages as stored, summaries, blobs it owns).
    async fn conversation_bytes(&self, conversation: ConversationId) -> Result<u64>;
    /// Gives space freed by forgetting back to the file system.
    async fn reclaim_space(&self) -> Result<ReclaimReport>;
    /// The summaries of a conversation that a stand-in wrote (the truncation, level
    /// `Fallback`; or a fallback summarizer in place of the configured one, its summarizer
    /// `"… in place of …"`), those in its context first (what the model reads), then those
    /// folded under a parent (what recall expands), each oldest first, without reading the
    /// context.
    async fn stand_in_summaries(&self, conversation: ConversationId) -> Result<Vec<StoredSummary>>;
    /// A conversation's summary DAG, for drawing it.
    async fn dag_view(&self, conversation: ConversationId) -> Result<DagView>;
    /// Store-wide state (not tied to a conversation), shared by every process.
    async fn store_state(&self, key: &str) -> Result<Option<String>>;
    /// Sets a store-wide state value.
    async fn set_store_state(&self, key: &str, value: &str) -> Result<()>;

    /// A conversation's whole history, read as one snapshot (`vilvona_core::archive`).
    async fn export(&self, conversation: ConversationId) -> Result<SessionArchive>;
    /// Stores an archive as a new conversation in one transaction, which commits only when
    /// the store, read back, holds exactly what the archive holds. Refused
    /// ([`StoreError::ImportRefused`]) when the session already holds rows here, when one of
    /// its summaries is stored here, or when it names rows of another session this store
    /// does not hold.
    async fn import(&self, archive: SessionArchive) -> Result<(ConversationId, ImportReport)>;

    /// Documents the recall index serves.
    async fn index_doc_count(&self) -> Result<u64>;
    /// Documents the recall index serves without their vectors yet (the background makes
    /// them; see `index::filler`); 0 when the index does not embed.
    async fn documents_waiting_for_vectors(&self) -> Result<u64>;
    /// Rebuilds the recall index from the source of truth; returns the documents indexed.
    async fn rebuild_index(&self) -> Result<u64>;
    /// Bytes the store occupies on disk.
    fn disk_bytes(&self) -> u64;
    /// True when every write is refused (the store was opened for inspection).
    fn is_read_only(&self) -> bool {
        false
    }
    /// What embeds rows and queries for recall by meaning, when anything does.
    fn embedder(&self) -> Option<Arc<dyn Embedder>> {
        None
    }
}

/// The role a summary is indexed (and embedded) as.
pub(crate) const SUMMARY_ROLE: &str = "summary";

/// The built-in embedding model, as a store takes it.
pub fn builtin_embedder() -> Option<Arc<dyn Embedder>> {
    Some(vilvona_embed::builtin())
}
/// Creates the store directory (and parents) and keeps it `0700`: conversation history is
/// nobody else's business.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
