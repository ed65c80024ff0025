//! The `lossless` engine: its state (the store, the summarizer, bounded per-session caches).
//! The contract's members are in [`crate::contract`]; each job module (the crate's root lists
//! them) adds its own `impl LosslessEngine` and takes nothing else from here; what it keeps per
//! conversation is one [`crate::memory::Memory`].

use std::path::Path;
use std::sync::{Arc, Mutex as StdMutex};

use vilvona_core::clock::{Clock, SystemClock};
use vilvona_core::engine::*;
use vilvona_core::summarize::Summarizer;
use vilvona_core::tokens::TokenEstimator;
use vilvona_store::*;

use crate::budget::{HOST_BUDGET, HOST_PROMPT, HostPrompt};
use crate::cache::{Assemblies, RenderedItems, lock_map};
use crate::config::LosslessConfig;
use crate::errors::store_error;
use crate::lru::Lru;
use crate::memory::Memory;

/// The engine id and the slot value that selects it.
pub const ENGINE_ID: &str = "lossless";

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn HistoryStore>,
    pub(crate) summarizer: Arc<dyn Summarizer>,
    pub(crate) estimator: Arc<dyn TokenEstimator>,
    pub(crate) config: LosslessConfig,
    /// The time (grant expiry, retention).
    pub(crate) clock: Arc<dyn Clock>,
    /// Work started off the turn's path (retention), awaited by [`LosslessEngine::settled`].
    pub(crate) background: StdMutex<Vec<tokio::task::JoinHandle<()>>>,
    /// session id → conversation, for this engine instance (least recently used go first).
    pub(crate) conversations: StdMutex<Lru<String, Conversation>>,
    /// Rendered context items, so assembly and compaction parse only what is new (bounded by
    /// their estimated bytes).
    pub(crate) rendered: StdMutex<RenderedItems>,
    /// The last assembly per conversation (its items and messages), extended when the context
    /// only grew; the least recently assembled go first past their bound in bytes.
    pub(crate) assembled: StdMutex<Assemblies>,
    /// What the engine keeps in memory about each conversation, behind one lock (the least
    /// recently used go first; see [`Memory`]).
    pub(crate) memories: StdMutex<Lru<ConversationId, Memory>>,
}

/// Most sessions whose conversation row and [`Memory`] are kept (the least recently used go
/// first; read from the store again on a miss).
const SESSION_CACHE: usize = 4_096;

/// What [`LosslessEngine::cached_sessions`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachedSessions {
    /// Conversation rows kept.
    pub conversations: usize,
    /// Conversations whose last assembly is kept.
    pub assemblies: usize,
    /// Context items those assemblies hold together.
    pub assembled_items: usize,
    /// Their estimated bytes (bounded).
    pub assembled_bytes: usize,
    /// Rendered items kept for assembly and compaction.
    pub rendered_items: usize,
    /// Their estimated bytes (bounded).
    pub rendered_bytes: usize,
    /// Conversations whose memory is kept (what the host said of its prompt, the current
    /// turn's notes, the compaction lock).
    pub memories: usize,
}

/// The lossless engine. Cheap to clone.
#[derive(Clone)]
pub struct LosslessEngine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for LosslessEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LosslessEngine")
            .field("store", &self.inner.store)
            .field("agent", &self.inner.config.agent_id)
            .finish()
    }
}

impl LosslessEngine {
    /// An engine over `store`, reading the system's clock.
    pub fn new(
        store: Arc<dyn HistoryStore>,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
        config: LosslessConfig,
    ) -> LosslessEngine {
        LosslessEngine::with_parts(store, summarizer, estimator, config, Arc::new(SystemClock))
    }

    /// The same engine (a fresh instance over the same store) reading the time from `clock`:
    /// grant expiry and retention follow it.
    pub fn with_clock(&self, clock: Arc<dyn Clock>) -> LosslessEngine {
        let inner = &self.inner;
        LosslessEngine::with_parts(
            inner.store.clone(),
            inner.summarizer.clone(),
            inner.estimator.clone(),
            inner.config.clone(),
            clock,
        )
    }

    /// The same engine (a fresh instance over the same store) with other settings: an
    /// evaluation compares two settings on one history.
    pub fn with_config(&self, config: LosslessConfig) -> LosslessEngine {
        let inner = &self.inner;
        LosslessEngine::with_parts(
            inner.store.clone(),
            inner.summarizer.clone(),
            inner.estimator.clone(),
            config,
            inner.clock.clone(),
        )
    }

    fn with_parts(
        store: Arc<dyn HistoryStore>,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
        config: LosslessConfig,
        clock: Arc<dyn Clock>,
    ) -> LosslessEngine {
        LosslessEngine {
            inner: Arc::new(Inner {
                store,
                summarizer,
                estimator,
                config,
                clock,
                background: StdMutex::new(Vec::new()),
                conversations: StdMutex::new(Lru::new(SESSION_CACHE)),
                rendered: StdMutex::new(RenderedItems::default()),
                assembled: StdMutex::new(Assemblies::default()),
                memories: StdMutex::new(Lru::new(SESSION_CACHE)),
            }),
        }
    }

    /// Opens the embedded store in `dir` and builds the engine.
    pub async fn open(
        dir: &Path,
        config: LosslessConfig,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
    ) -> Result<LosslessEngine, EngineError> {
        let store = Store::open(StoreConfig::new(dir)).await;
        LosslessEngine::over(store, config, summarizer, estimator)
    }

    fn over(
        store: vilvona_store::Result<Store>,
        config: LosslessConfig,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
    ) -> Result<LosslessEngine, EngineError> {
        let store = store.map_err(|error| store_error("opening the store", error))?;
        Ok(LosslessEngine::new(
            Arc::new(store),
            summarizer,
            estimator,
            config,
        ))
    }

    /// Opens the embedded store in `dir` for reading only (inspection beside a running writer):
    /// recall, assembly and statistics work; nothing is created or written.
    pub async fn open_read_only(
        dir: &Path,
        config: LosslessConfig,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
    ) -> Result<LosslessEngine, EngineError> {
        let store = Store::open_read_only(dir).await;
        LosslessEngine::over(store, config, summarizer, estimator)
    }

    /// The store, for this crate and its tests (hosts use the contract's admin interface).
    #[cfg(any(test, feature = "test-support"))]
    pub fn store(&self) -> &Arc<dyn HistoryStore> {
        &self.inner.store
    }

    #[cfg(not(any(test, feature = "test-support")))]
    pub(crate) fn store(&self) -> &Arc<dyn HistoryStore> {
        &self.inner.store
    }

    /// Keeps a background task to await in [`LosslessEngine::settled`] (finished ones dropped).
    pub(crate) fn keep_background(&self, task: tokio::task::JoinHandle<()>) {
        let mut background = lock_map(&self.inner.background);
        background.retain(|task| !task.is_finished());
        background.push(task);
    }

    /// Waits for the work this engine started in the background (retention) to finish.
    pub async fn settled(&self) {
        let tasks = std::mem::take(&mut *lock_map(&self.inner.background));
        for task in tasks {
            if let Err(error) = task.await {
                tracing::warn!(%error, "a background task of the lossless engine failed");
            }
        }
    }

    /// Milliseconds since the epoch, by the engine's clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// The engine's settings.
    pub fn config(&self) -> &LosslessConfig {
        &self.inner.config
    }

    /// The conversation for a session of this engine's agent (created on first use).
    pub async fn conversation(
        &self,
        session_id: &str,
        session_key: Option<&str>,
    ) -> Result<Conversation, EngineError> {
        if let Some(found) = lock_map(&self.inner.conversations).get(&session_id.to_owned()) {
            return Ok(found.clone());
        }
        let conversation = self
            .inner
            .store
            .conversation(&ConversationKey {
                agent_id: self.inner.config.agent_id.clone(),
                session_id: session_id.to_owned(),
                session_key: session_key.map(str::to_owned),
            })
            .await
            .map_err(|error| store_error("conversation", error))?;
        lock_map(&self.inner.conversations).insert(session_id.to_owned(), conversation.clone());
        Ok(conversation)
    }

    /// Drops a session's cached conversation row (its counts went stale); the next call reads
    /// it again.
    pub(crate) fn forget_conversation_row(&self, session_id: &str) {
        lock_map(&self.inner.conversations).remove(&session_id.to_owned());
    }

    /// What the host has said and observed about its prompt for a conversation: kept in
    /// memory, else read from the store (state `host.prompt`; a store written by an earlier
    /// version has only the budget, under `host.tokenBudget`).
    pub(crate) async fn host_prompt(
        &self,
        conversation: ConversationId,
    ) -> Result<HostPrompt, EngineError> {
        if let Some(prompt) = self.memory(conversation, |memory| memory.host_prompt) {
            return Ok(prompt);
        }
        let prompt = self.stored_host_prompt(conversation).await?;
        self.memory(conversation, |memory| memory.host_prompt = Some(prompt));
        Ok(prompt)
    }

    /// What the store holds of the host's prompt, whatever this instance remembers (another
    /// process, a gateway's `serve`, may be the one the host talks to).
    pub(crate) async fn stored_host_prompt(
        &self,
        conversation: ConversationId,
    ) -> Result<HostPrompt, EngineError> {
        let read = |key: &'static str| async move {
            self.inner
                .store
                .state(conversation, key)
                .await
                .map_err(|error| store_error("reading the host's prompt", error))
        };
        let prompt = match read(HOST_PROMPT).await? {
            Some(text) => serde_json::from_str(&text).unwrap_or_default(),
            None => HostPrompt {
                budget: read(HOST_BUDGET)
                    .await?
                    .and_then(|text| text.parse::<u64>().ok())
                    .filter(|budget| *budget > 0),
                ..HostPrompt::default()
            },
        };
        Ok(prompt)
    }

    /// Keeps what the host said about its prompt (written to the store only when it changed).
    pub(crate) async fn keep_host_prompt(
        &self,
        conversation: ConversationId,
        prompt: HostPrompt,
    ) -> Result<(), EngineError> {
        if self.memory(conversation, |memory| memory.host_prompt) == Some(prompt) {
            return Ok(());
        }
        let text = serde_json::to_string(&prompt).map_err(|error| {
            EngineError::caused_by("lossless: writing the host's prompt", error)
        })?;
        self.inner
            .store
            .set_state(conversation, HOST_PROMPT, &text)
            .await
            .map_err(|error| store_error("saving the host's prompt", error))?;
        self.memory(conversation, |memory| memory.host_prompt = Some(prompt));
        Ok(())
    }

    /// Notes a budget the host gave one of the current turn's assemblies.
    pub(crate) fn note_turn_budget(&self, conversation: ConversationId, budget: u64) {
        self.memory(conversation, |memory| {
            memory.turn_budget = Some(
                memory
                    .turn_budget
                    .map_or(budget, |smallest| smallest.min(budget)),
            );
        });
    }

    /// The smallest budget the current turn's assemblies were given, if any; the next turn
    /// starts over.
    pub(crate) fn take_turn_budget(&self, conversation: ConversationId) -> Option<u64> {
        self.memory(conversation, |memory| memory.turn_budget.take())
    }

    /// The conversation's row as the store has it now (`None`: gone).
    pub(crate) async fn stored_row(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<vilvona_store::Conversation>, EngineError> {
        self.inner
            .store
            .conversation_by_id(conversation)
            .await
            .map_err(|error| store_error("reading the conversation", error))
    }

    /// The conversation's stored messages at places `first..=last`, decoded.
    pub(crate) async fn stored_messages(
        &self,
        conversation: ConversationId,
        first: u64,
        last: u64,
    ) -> Result<Vec<vilvona_core::message::AgentMessage>, EngineError> {
        let failed = |error| store_error("reading the store's last messages", error);
        self.inner
            .store
            .messages_in_seq_range(conversation, first, last)
            .await
            .map_err(failed)?
            .iter()
            .map(vilvona_store::StoredMessage::message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)
    }

    /// The context's running total as the store keeps it (one row).
    pub(crate) async fn context_tokens(
        &self,
        conversation: ConversationId,
    ) -> Result<u64, EngineError> {
        Ok(self
            .inner
            .store
            .conversation_by_id(conversation)
            .await
            .map_err(|error| store_error("reading the conversation", error))?
            .map_or(0, |row| row.context_tokens))
    }

    /// How many sessions' state this engine keeps in memory: conversations, their last
    /// assembly, their budgets, their compaction locks. Each is bounded; idle sessions' state
    /// is read from the store again when they return.
    pub fn cached_sessions(&self) -> CachedSessions {
        // One lock at a time (a guard in a struct literal lives to the end of the statement).
        let (assemblies, (assembled_items, assembled_bytes)) = {
            let assembled = lock_map(&self.inner.assembled);
            (assembled.len(), assembled.size())
        };
        let (rendered_items, rendered_bytes) = lock_map(&self.inner.rendered).size();
        let conversations = lock_map(&self.inner.conversations).len();
        let memories = lock_map(&self.inner.memories).len();
        CachedSessions {
            conversations,
            assemblies,
            assembled_items,
            assembled_bytes,
            rendered_items,
            rendered_bytes,
            memories,
        }
    }

    /// Drops what this instance keeps about a conversation that was forgotten or archived
    /// (it is read from the store again if it comes back).
    pub(crate) fn forget_cached(&self, conversation: ConversationId, session_id: &str) {
        lock_map(&self.inner.conversations).remove(&session_id.to_owned());
        lock_map(&self.inner.assembled).take(conversation);
        // Its compaction lock stays (a caller may hold it); the rest is read again.
        self.memory(conversation, |memory| {
            *memory = Memory {
                compaction_lock: memory.compaction_lock.take(),
                ..Memory::default()
            };
        });
        lock_map(&self.inner.rendered).clear();
        // A recall block another session holds for its turn may quote what went.
        for memory in lock_map(&self.inner.memories).values_mut() {
            memory.recall = None;
        }
    }

    pub(crate) fn compaction_lock(
        &self,
        conversation: ConversationId,
    ) -> Arc<tokio::sync::Mutex<()>> {
        self.memory(conversation, |memory| {
            memory
                .compaction_lock
                .get_or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
                .clone()
        })
    }

    /// Reads or changes what the engine keeps in memory about `conversation` (made empty on
    /// first use). The lock is held only while `use_memory` runs: never across an await.
    pub(crate) fn memory<R>(
        &self,
        conversation: ConversationId,
        use_memory: impl FnOnce(&mut Memory) -> R,
    ) -> R {
        let mut memories = lock_map(&self.inner.memories);
        use_memory(memories.get_or_insert_with(conversation, Memory::may_go, Memory::default))
    }
}
