//! The `lossless` engine: lifecycle, incremental compaction, assembly, subagent grants.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use vilvona_core::admin::{EngineAdmin, ToolCaller, ToolDefinition};
use vilvona_core::engine::*;
use vilvona_core::host::{Capability, HostRequirement, Operation};
use vilvona_core::message::{AgentMessage, ContentBlock, MessageContent};
use vilvona_core::summarize::{
    SourceItem, SummarizeError, Summarizer, SummaryKind, SummaryLevel, SummaryRequest,
};
use vilvona_core::tokens::TokenEstimator;
use vilvona_store::*;
use vilvona_summarize::{source_item, truncate};
use vilvona_transcript::{Cursor, Entry, read_entries};

use crate::config::LosslessConfig;
use crate::render::{
    DESCRIBE_TOOL, EXPAND_TOOL, GREP_TOOL, RECALL_GUIDANCE, SummaryHeader, describe_content,
    large_content_reference, summary_message, summary_tokens,
};
use crate::tools::tool_definitions;
use crate::units::{Candidate, condense_candidate, fresh_tail_start, leaf_candidate, unit_start};

/// The engine id and the slot value that selects it.
pub const ENGINE_ID: &str = "lossless";

/// Key of the bootstrap cursor in the store's per-conversation state.
const BOOTSTRAP_CURSOR: &str = "bootstrap.cursor";
/// Key of the prompt budget the host last gave for a conversation.
const HOST_BUDGET: &str = "host.tokenBudget";
/// Messages imported per store transaction during bootstrap.
const BOOTSTRAP_BATCH: usize = 500;

/// What one compaction call asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactionRequest<'a> {
    /// The prompt budget the context must fit.
    pub budget: u64,
    /// Compact even below the threshold (manual `/compact`, overflow recovery).
    pub force: bool,
    /// How far down a forced compaction goes (the default: the configured target ratio).
    pub target: Option<CompactionTarget>,
    /// The operator's instructions for the summaries (`/compact <instructions>`).
    pub custom_instructions: Option<&'a str>,
    /// Checked between passes: the caller gave up.
    pub abort: Option<&'a AbortSignal>,
}

impl CompactionRequest<'_> {
    /// The routine check after a turn: compact if the context is above the threshold.
    pub fn routine(budget: u64) -> CompactionRequest<'static> {
        CompactionRequest {
            budget,
            ..CompactionRequest::default()
        }
    }

    /// Compact now, whatever the threshold says.
    pub fn forced(budget: u64) -> CompactionRequest<'static> {
        CompactionRequest {
            budget,
            force: true,
            ..CompactionRequest::default()
        }
    }
}

/// Why a compaction call stopped, with what it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub passes: u32,
    pub summaries_created: u32,
    pub fallbacks: u32,
    pub reason: Option<CompactReason>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn HistoryStore>,
    pub(crate) summarizer: Arc<dyn Summarizer>,
    pub(crate) estimator: Arc<dyn TokenEstimator>,
    pub(crate) config: LosslessConfig,
    /// session id → conversation, for this engine instance.
    conversations: StdMutex<HashMap<String, Conversation>>,
    /// Serializes compaction per conversation (after_turn, compact, commit_turn can race).
    compaction_locks: StdMutex<HashMap<ConversationId, Arc<tokio::sync::Mutex<()>>>>,
    /// Rendered context items, so assembly parses only what is new. Items are immutable, so
    /// entries never go stale; the cache is emptied when it grows past its bound.
    rendered: StdMutex<HashMap<ItemRef, Arc<AgentMessage>>>,
    /// The last assembly per conversation (its items and messages), extended when the context
    /// only grew; the least recently assembled go first past [`ASSEMBLED_ITEMS`].
    assembled: StdMutex<Assemblies>,
    /// The prompt budget the host last gave per conversation (mirrors the store's state).
    budgets: StdMutex<HashMap<ConversationId, u64>>,
}

/// Keeps a conversation's budget in memory (a cache of the store's state, bounded).
fn remember_budget(
    budgets: &StdMutex<HashMap<ConversationId, u64>>,
    conversation: ConversationId,
    budget: u64,
) {
    let mut budgets = lock_map(budgets);
    if budgets.len() >= SESSION_CACHE {
        budgets.clear();
    }
    budgets.insert(conversation, budget);
}

fn lock_map<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Most rendered items kept for assembly (a few contexts' worth).
const RENDERED_CACHE_ITEMS: usize = 16_384;
/// Most context items the kept assemblies hold together (a gateway with thousands of sessions
/// keeps the recently active ones; the others are rebuilt from the store).
const ASSEMBLED_ITEMS: usize = 32_768;
/// Most sessions whose conversation row and budget are kept in memory (read from the store
/// again on a miss), and most idle compaction locks.
const SESSION_CACHE: usize = 4_096;

/// What [`LosslessEngine::cached_sessions`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachedSessions {
    pub conversations: usize,
    pub assemblies: usize,
    pub assembled_items: usize,
    pub budgets: usize,
    pub compaction_locks: usize,
}

/// The last assembly of recently assembled conversations, least recently used evicted first.
#[derive(Default)]
pub(crate) struct Assemblies {
    entries: HashMap<ConversationId, (u64, Vec<ItemRef>, Messages)>,
    items: usize,
    clock: u64,
}

impl Assemblies {
    fn take(&mut self, conversation: ConversationId) -> Option<(Vec<ItemRef>, Messages)> {
        let (_, items, messages) = self.entries.remove(&conversation)?;
        self.items -= items.len();
        Some((items, messages))
    }

    fn keep(&mut self, conversation: ConversationId, items: Vec<ItemRef>, messages: Messages) {
        self.clock += 1;
        self.items += items.len();
        if let Some((_, old, _)) = self
            .entries
            .insert(conversation, (self.clock, items, messages))
        {
            self.items -= old.len();
        }
        while self.items > ASSEMBLED_ITEMS && self.entries.len() > 1 {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _, _))| *used)
                .map(|(id, _)| *id)
            else {
                break;
            };
            self.take(oldest);
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
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

pub(crate) fn store_error(operation: &str, error: StoreError) -> EngineError {
    EngineError::caused_by(format!("lossless {operation}"), error)
}

impl LosslessEngine {
    pub fn new(
        store: Arc<dyn HistoryStore>,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
        config: LosslessConfig,
    ) -> LosslessEngine {
        LosslessEngine {
            inner: Arc::new(Inner {
                store,
                summarizer,
                estimator,
                config,
                conversations: StdMutex::new(HashMap::new()),
                compaction_locks: StdMutex::new(HashMap::new()),
                rendered: StdMutex::new(HashMap::new()),
                assembled: StdMutex::new(Assemblies::default()),
                budgets: StdMutex::new(HashMap::new()),
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

    pub fn config(&self) -> &LosslessConfig {
        &self.inner.config
    }

    /// The conversation for a session of this engine's agent (created on first use).
    pub async fn conversation(
        &self,
        session_id: &str,
        session_key: Option<&str>,
    ) -> Result<Conversation, EngineError> {
        if let Some(found) = self
            .inner
            .conversations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session_id)
        {
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
        {
            let mut conversations = lock_map(&self.inner.conversations);
            // A cache: past its bound it starts over (rows are read from the store again).
            if conversations.len() >= SESSION_CACHE {
                conversations.clear();
            }
            conversations.insert(session_id.to_owned(), conversation.clone());
        }
        Ok(conversation)
    }

    /// The budget to compact against: the one the call carries, else the one the host last
    /// gave `assemble` for this conversation (kept in the store, so it survives restarts); the
    /// configured default only before the host ever gave one. OpenClaw 2026.9 gives
    /// `commitTurn` no budget, and a guess above its real prompt budget would let every session
    /// overflow before compaction.
    async fn budget(
        &self,
        conversation: ConversationId,
        carried: Option<u64>,
    ) -> Result<u64, EngineError> {
        if let Some(budget) = carried {
            return Ok(budget);
        }
        if let Some(budget) = lock_map(&self.inner.budgets).get(&conversation) {
            return Ok(*budget);
        }
        let stored = self
            .inner
            .store
            .state(conversation, HOST_BUDGET)
            .await
            .map_err(|error| store_error("reading the host's budget", error))?
            .and_then(|text| text.parse::<u64>().ok())
            .filter(|budget| *budget > 0);
        let budget = stored.unwrap_or(self.inner.config.default_token_budget);
        if stored.is_some() {
            remember_budget(&self.inner.budgets, conversation, budget);
        }
        Ok(budget)
    }

    /// Keeps the prompt budget the host gave `assemble` (the one budget OpenClaw always sends
    /// and computes from the real window); writes only when it changed.
    async fn remember_budget(
        &self,
        conversation: ConversationId,
        budget: u64,
    ) -> Result<(), EngineError> {
        if lock_map(&self.inner.budgets).get(&conversation) == Some(&budget) {
            return Ok(());
        }
        self.inner
            .store
            .set_state(conversation, HOST_BUDGET, &budget.to_string())
            .await
            .map_err(|error| store_error("saving the host's budget", error))?;
        remember_budget(&self.inner.budgets, conversation, budget);
        Ok(())
    }

    /// Prepares messages for the store: token counts, and large tool output moved to blobs.
    async fn prepare(
        &self,
        conversation: ConversationId,
        messages: &[AgentMessage],
        identity: impl Fn(usize) -> MessageIdentity,
    ) -> Result<Vec<NewMessage>, EngineError> {
        let mut prepared = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let tokens = self.inner.estimator.message_tokens(message);
            let (message, tokens) = match self.externalize(conversation, message, tokens).await? {
                Some(moved) => {
                    let tokens = self.inner.estimator.message_tokens(&moved);
                    (moved, tokens)
                }
                None => (message.clone(), tokens),
            };
            prepared.push(NewMessage {
                tokens,
                message,
                identity: identity(index),
            });
        }
        Ok(prepared)
    }

    /// A tool result (or user content) larger than the threshold: each large text block is stored
    /// once as a blob and replaced by a reference and a description. The original is restorable:
    /// the block keeps the blob id. `None` when the message (of `tokens`) stays as it is.
    async fn externalize(
        &self,
        conversation: ConversationId,
        message: &AgentMessage,
        tokens: u64,
    ) -> Result<Option<AgentMessage>, EngineError> {
        let threshold = self.inner.config.large_content_threshold_tokens;
        let is_candidate = matches!(message, AgentMessage::ToolResult(_) | AgentMessage::User(_));
        if !is_candidate || tokens <= threshold {
            return Ok(None);
        }
        let mut message = message.clone();
        let content = match &mut message {
            AgentMessage::ToolResult(result) => &mut result.content,
            AgentMessage::User(user) => &mut user.content,
            _ => return Ok(None),
        };
        if let MessageContent::Text(text) = content {
            *content = MessageContent::Blocks(vec![ContentBlock::text(std::mem::take(text))]);
        }
        if let MessageContent::Blocks(blocks) = content {
            for block in blocks.iter_mut() {
                let ContentBlock::Text(text) = block else {
                    continue;
                };
                if self.inner.estimator.text_tokens(&text.text) <= threshold / 2 {
                    continue;
                }
                let (kind, description) = describe_content(&text.text);
                let info = self
                    .inner
                    .store
                    .put_blob(NewBlob {
                        conversation,
                        kind,
                        content: std::mem::take(&mut text.text),
                        description: description.clone(),
                    })
                    .await
                    .map_err(|error| store_error("storing large content", error))?;
                text.text = large_content_reference(&info.blob_id, &description);
                text.extra.insert(
                    vilvona_store::BLOB_ID_KEY.to_owned(),
                    Value::String(info.blob_id),
                );
            }
        }
        Ok(Some(message))
    }

    async fn ingest_messages(
        &self,
        session_id: &str,
        session_key: Option<&str>,
        messages: &[AgentMessage],
        identity: impl Fn(usize) -> MessageIdentity,
        advancement_key: Option<String>,
    ) -> Result<IngestOutcome, EngineError> {
        let conversation = self.conversation(session_id, session_key).await?;
        let prepared = self.prepare(conversation.id, messages, identity).await?;
        self.inner
            .store
            .ingest(conversation.id, prepared, advancement_key)
            .await
            .map_err(|error| store_error("ingest", error))
    }

    /// How many sessions' state this engine keeps in memory: conversations, their last
    /// assembly, their budgets, their compaction locks. Each is bounded; idle sessions' state
    /// is read from the store again when they return.
    pub fn cached_sessions(&self) -> CachedSessions {
        // One lock at a time (a guard in a struct literal lives to the end of the statement).
        let (assemblies, assembled_items) = {
            let assembled = lock_map(&self.inner.assembled);
            (assembled.len(), assembled.items)
        };
        let conversations = lock_map(&self.inner.conversations).len();
        let budgets = lock_map(&self.inner.budgets).len();
        let compaction_locks = lock_map(&self.inner.compaction_locks).len();
        CachedSessions {
            conversations,
            assemblies,
            assembled_items,
            budgets,
            compaction_locks,
        }
    }

    /// Drops what this instance keeps about a conversation that was forgotten or archived
    /// (it is read from the store again if it comes back).
    pub(crate) fn forget_cached(&self, conversation: ConversationId, session_id: &str) {
        lock_map(&self.inner.conversations).remove(session_id);
        lock_map(&self.inner.assembled).take(conversation);
        lock_map(&self.inner.budgets).remove(&conversation);
        lock_map(&self.inner.rendered).clear();
    }

    pub(crate) fn compaction_lock(
        &self,
        conversation: ConversationId,
    ) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock_map(&self.inner.compaction_locks);
        if locks.len() >= SESSION_CACHE {
            // Locks nobody holds or waits for are dropped (one is made again when needed).
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        locks.entry(conversation).or_default().clone()
    }

    /// Incremental compaction: above `threshold × budget` (or when forced), summarize the oldest
    /// units outside the fresh tail and condense same-depth runs, just enough to get under
    /// `target`, bounded by passes and a deadline. Every pass must shrink the context.
    pub async fn compact_conversation(
        &self,
        conversation: ConversationId,
        request: CompactionRequest<'_>,
    ) -> Result<CompactionReport, EngineError> {
        let CompactionRequest {
            budget,
            force,
            target,
            custom_instructions,
            abort,
        } = request;
        let lock = self.compaction_lock(conversation);
        let _guard = lock.lock().await;
        let config = &self.inner.config;
        let threshold = (budget as f64 * config.context_threshold) as u64;
        let goal = match target {
            Some(CompactionTarget::Budget) => budget,
            _ => (budget as f64 * config.target_ratio) as u64,
        };
        let deadline = Instant::now() + Duration::from_millis(config.deadline_ms);
        let mut report = CompactionReport::default();
        // The running total is one row read: the common below-threshold turn costs no more.
        let running_total = self
            .inner
            .store
            .conversation_by_id(conversation)
            .await
            .map_err(|error| store_error("reading the conversation", error))?
            .map_or(0, |row| row.context_tokens);
        let trigger = match target {
            Some(CompactionTarget::Budget) => threshold.max(budget),
            _ => threshold,
        };
        if !force && running_total <= trigger {
            report.tokens_before = running_total;
            report.tokens_after = running_total;
            report.reason = Some(CompactReason::BelowThreshold);
            return Ok(report);
        }
        let mut items = self.context(conversation).await?;
        let mut total: u64 = items.iter().map(|item| item.tokens).sum();
        report.tokens_before = total;
        loop {
            if abort.is_some_and(AbortSignal::is_aborted) {
                return Err(EngineError::Cancelled);
            }
            let forced_first_pass = force && report.passes == 0;
            if total <= goal && !forced_first_pass {
                report.reason = Some(if report.summaries_created > 0 {
                    CompactReason::Compacted
                } else {
                    CompactReason::BelowThreshold
                });
                break;
            }
            if report.passes >= config.max_passes_per_turn {
                report.reason = Some(if report.summaries_created > 0 {
                    CompactReason::Compacted
                } else {
                    CompactReason::NoProgress
                });
                break;
            }
            if report.passes > 0 && Instant::now() >= deadline {
                report.reason = Some(CompactReason::Deadline);
                break;
            }
            let tail_start = fresh_tail_start(&items, config, goal.max(1));
            let summary_prefix: u64 = items[..tail_start]
                .iter()
                .filter(|item| matches!(item.content, ItemContent::Summary(_)))
                .map(|item| item.tokens)
                .sum();
            let needed = total.saturating_sub(goal).max(1);
            let leaf = leaf_candidate(&items, tail_start, config.leaf_chunk_tokens, needed);
            let mut condense =
                condense_candidate(&items, tail_start, config, config.condensed_min_fanout);
            let mut leaf = leaf;
            if leaf.is_none() && condense.is_none() && force {
                // Forced (manual /compact, overflow recovery): fold any two same-depth summaries
                // rather than report that nothing can be done. Overflow recovery (the budget
                // target) may then summarize the fresh tail too, all but its newest unit: a
                // provider that refused the prompt is better served by a summary than by a
                // protected tail.
                condense = condense_candidate(&items, tail_start, config, 2);
                if condense.is_none()
                    && target == Some(CompactionTarget::Budget)
                    && !items.is_empty()
                {
                    let newest_unit = unit_start(&items, items.len() - 1);
                    leaf = leaf_candidate(&items, newest_unit, config.leaf_chunk_tokens, needed);
                }
            }
            let candidate = match (leaf, condense) {
                (Some(_), Some(condense)) if summary_prefix > budget / 4 => condense,
                (Some(leaf), _) => leaf,
                (None, Some(condense)) => condense,
                (None, None) => {
                    report.reason = Some(if report.summaries_created > 0 {
                        CompactReason::Compacted
                    } else {
                        CompactReason::NoCandidate
                    });
                    break;
                }
            };
            report.passes += 1;
            match self
                .summarize_and_publish(conversation, &items, &candidate, custom_instructions)
                .await?
            {
                Published::Replaced { fallback } => {
                    report.summaries_created += 1;
                    report.fallbacks += u32::from(fallback);
                }
                Published::Stale => {}
                Published::NoProgress => {
                    report.reason = Some(if report.summaries_created > 0 {
                        CompactReason::Compacted
                    } else {
                        CompactReason::NoProgress
                    });
                    break;
                }
            }
            items = self.context(conversation).await?;
            let new_total: u64 = items.iter().map(|item| item.tokens).sum();
            if new_total >= total && report.summaries_created == 0 {
                report.reason = Some(CompactReason::NoProgress);
                total = new_total;
                break;
            }
            total = new_total;
        }
        report.tokens_after = total;
        Ok(report)
    }

    async fn context(&self, conversation: ConversationId) -> Result<Vec<ContextItem>, EngineError> {
        self.inner
            .store
            .context(conversation)
            .await
            .map_err(|error| store_error("reading the context", error))
    }

    /// Summarizes a candidate (outside any transaction) and publishes it with a compare-and-swap.
    async fn summarize_and_publish(
        &self,
        conversation: ConversationId,
        items: &[ContextItem],
        candidate: &Candidate,
        custom_instructions: Option<&str>,
    ) -> Result<Published, EngineError> {
        let config = &self.inner.config;
        let run = &items[candidate.range.clone()];
        let (kind, depth, target) = match candidate.condensing_depth {
            None => (SummaryKind::Leaf, 0, config.leaf_target_tokens),
            Some(depth) => (
                SummaryKind::Condensed,
                depth + 1,
                config.condensed_target_tokens,
            ),
        };
        // A summary keeps at most a third of its source: every pass shrinks the context.
        let target = target.min(candidate.tokens / 3).max(16);
        let source: Vec<SourceItem> = run.iter().map(item_source).collect();
        let previous_context = items[..candidate.range.start]
            .iter()
            .rev()
            .find_map(|item| match &item.content {
                ItemContent::Summary(summary) => Some(summary.content.clone()),
                ItemContent::Message(_) => None,
            });
        let header_span = span(run);
        let mut request = SummaryRequest {
            kind,
            depth,
            level: SummaryLevel::Normal,
            target_tokens: target,
            items: source,
            previous_context,
            custom_instructions: custom_instructions.map(str::to_owned),
        };
        let mut produced = None;
        for level in [SummaryLevel::Normal, SummaryLevel::Aggressive] {
            request.level = level;
            match self.inner.summarizer.summarize(&request).await {
                Ok(summary) if !summary.text.trim().is_empty() => {
                    let tokens = self.inner.estimator.text_tokens(&summary.text);
                    if tokens < candidate.tokens && tokens <= target.saturating_mul(3) {
                        produced = Some((summary.text, summary.level));
                        break;
                    }
                    tracing::debug!(
                        tokens,
                        target,
                        ?level,
                        "summary did not shrink its source; escalating"
                    );
                }
                Ok(_) => tracing::debug!(?level, "empty summary; escalating"),
                Err(SummarizeError::Cancelled) => return Err(EngineError::Cancelled),
                Err(error) => tracing::warn!(%error, ?level, "summarizer failed; escalating"),
            }
        }
        let (content, level) = match produced {
            Some(produced) => produced,
            None => {
                request.level = SummaryLevel::Fallback;
                request.target_tokens = target.min(config.fallback_max_tokens);
                let fallback = truncate(&request, &*self.inner.estimator);
                (fallback.text, SummaryLevel::Fallback)
            }
        };
        // Ids are content-addressed and always this long; the placeholder counts the same.
        let header = SummaryHeader {
            summary_id: "sum_0000000000000000",
            depth,
            kind,
            earliest_ms: header_span.0,
            latest_ms: header_span.1,
            first_seq: header_span.2,
            last_seq: header_span.3,
        };
        let tokens = summary_tokens(&*self.inner.estimator, &header, &content);
        if tokens >= candidate.tokens {
            return Ok(Published::NoProgress);
        }
        let plan = ReplacePlan {
            conversation,
            items: run
                .iter()
                .map(|item| (item.position, item.item_ref()))
                .collect(),
            summary: NewSummary {
                kind,
                depth,
                content,
                tokens,
                level,
                summarizer: self.inner.summarizer.id().to_owned(),
            },
        };
        match self.inner.store.replace(plan).await {
            Ok(ReplaceOutcome::Replaced(_)) => Ok(Published::Replaced {
                fallback: level == SummaryLevel::Fallback,
            }),
            Ok(ReplaceOutcome::Stale) => Ok(Published::Stale),
            Err(error) => Err(store_error("publishing a summary", error)),
        }
    }

    /// Imports a session transcript from where the last bootstrap stopped. Each message is
    /// identified by its entry id and its place among the transcript's messages, so what
    /// `commit_turn` or `assemble` already stored is recognised, not imported twice.
    async fn import_transcript(
        &self,
        conversation: &Conversation,
        path: &Path,
    ) -> Result<u64, EngineError> {
        let mark: BootstrapMark = self
            .inner
            .store
            .state(conversation.id, BOOTSTRAP_CURSOR)
            .await
            .map_err(|error| store_error("reading the bootstrap cursor", error))?
            .map_or_else(BootstrapMark::default, |text| BootstrapMark::parse(&text));
        let (cursor, first_place) = (mark.cursor, mark.place);
        // Read synchronously in a blocking task, then ingest in batches.
        let path = path.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            let mut batch: Vec<(String, AgentMessage)> = Vec::new();
            let mut end = cursor;
            let result = read_entries(&path, cursor, |located| {
                if let Entry::Message(entry) = located.entry {
                    batch.push((entry.id, entry.message));
                }
                end = located.end;
                Ok(())
            });
            result.map(|_| (batch, end))
        })
        .await
        .map_err(|error| EngineError::failed(format!("bootstrap reader: {error}")))?
        .map_err(|error| EngineError::caused_by("lossless bootstrap", error))?;
        let (entries, end) = read;
        let mut imported = 0;
        for (chunk_index, chunk) in entries.chunks(BOOTSTRAP_BATCH).enumerate() {
            let messages: Vec<AgentMessage> =
                chunk.iter().map(|(_, message)| message.clone()).collect();
            let chunk_start = (chunk_index * BOOTSTRAP_BATCH) as u64;
            let prepared = self
                .prepare(conversation.id, &messages, |index| MessageIdentity {
                    entry_id: Some(chunk[index].0.clone()),
                    turn: None,
                    place: first_place.map(|first| first + chunk_start + index as u64),
                })
                .await?;
            if let IngestOutcome::Stored(results) = self
                .inner
                .store
                .ingest(conversation.id, prepared, None)
                .await
                .map_err(|error| store_error("bootstrap ingest", error))?
            {
                imported += results.iter().filter(|result| result.ingested).count() as u64;
            }
        }
        if end != cursor {
            let mark = BootstrapMark {
                cursor: end,
                place: first_place.map(|first| first + entries.len() as u64),
            };
            self.inner
                .store
                .set_state(conversation.id, BOOTSTRAP_CURSOR, &mark.to_string())
                .await
                .map_err(|error| store_error("saving the bootstrap cursor", error))?;
        }
        Ok(imported)
    }

    /// The context as the model sees it, within `budget` when the fresh tail fits. Reads the
    /// item references (no message bodies), renders only items not rendered before, and when
    /// the context only grew since the last assembly, appends to the previous list instead of
    /// rebuilding it.
    pub async fn assemble_context(
        &self,
        conversation: ConversationId,
        budget: u64,
    ) -> Result<AssembleResult, EngineError> {
        let refs = self
            .inner
            .store
            .context_refs(conversation)
            .await
            .map_err(|error| store_error("reading the context", error))?;
        let total: u64 = refs.iter().map(|item| item.tokens).sum();
        let mut start = 0;
        let mut authority = PromptAuthority::Assembled;
        if total > budget {
            // Clamp: drop the oldest units until the rest fits (never splitting a unit).
            let mut remaining = total;
            while start < refs.len() && remaining > budget {
                let mut end = start + 1;
                while end < refs.len() && refs[end].continues_unit {
                    end += 1;
                }
                remaining -= refs[start..end].iter().map(|item| item.tokens).sum::<u64>();
                start = end;
            }
            authority = PromptAuthority::PreassemblyMayOverflow;
        }
        let visible: Vec<ItemRef> = refs[start..].iter().map(|entry| entry.item).collect();
        let estimated_tokens = refs[start..].iter().map(|entry| entry.tokens).sum();
        // The previous assembly of this conversation, if the new one extends it.
        let previous = lock_map(&self.inner.assembled).take(conversation);
        let (reused, mut messages) = match previous {
            Some((items, messages)) if visible.starts_with(&items) => (items.len(), messages),
            _ => (0, Messages::new()),
        };
        let missing: Vec<ItemRef> = {
            let rendered = lock_map(&self.inner.rendered);
            visible[reused..]
                .iter()
                .filter(|item| !rendered.contains_key(item))
                .copied()
                .collect()
        };
        let mut fresh = Vec::with_capacity(missing.len());
        if !missing.is_empty() {
            let contents = self
                .inner
                .store
                .items(missing.clone())
                .await
                .map_err(|error| store_error("reading context items", error))?;
            for (item, content) in missing.into_iter().zip(contents) {
                let message = match &content {
                    ItemContent::Summary(summary) => summary_message(summary),
                    ItemContent::Message(message) => message
                        .message()
                        .map_err(|error| store_error("reading a message", error))?,
                };
                fresh.push((item, Arc::new(message)));
            }
        }
        {
            let mut rendered = lock_map(&self.inner.rendered);
            for (item, message) in fresh {
                rendered.insert(item, message);
            }
            let list = messages.make_mut();
            for item in &visible[reused..] {
                match rendered.get(item) {
                    Some(message) => list.push(message.as_ref().clone()),
                    None => {
                        return Err(EngineError::failed(
                            "lossless assemble: a context item vanished",
                        ));
                    }
                }
            }
            if rendered.len() > RENDERED_CACHE_ITEMS {
                rendered.clear();
            }
        }
        lock_map(&self.inner.assembled).keep(conversation, visible, messages.clone());
        Ok(AssembleResult {
            messages,
            estimated_tokens,
            system_prompt_addition: None,
            prompt_authority: authority,
            context_projection: None,
        })
    }

    /// Re-summarizes context summaries that the fallback produced, keeping their edges.
    async fn resummarize_fallbacks(
        &self,
        conversation: ConversationId,
    ) -> Result<u64, EngineError> {
        // Only the fallback summaries are read (an indexed query), not the whole context.
        let fallbacks = self
            .inner
            .store
            .fallback_summaries(conversation)
            .await
            .map_err(|error| store_error("reading fallback summaries", error))?;
        let mut rewritten = 0;
        for summary in &fallbacks {
            let children = self
                .inner
                .store
                .children(summary.row_id)
                .await
                .map_err(|error| store_error("reading children", error))?;
            let source: Vec<SourceItem> = children.iter().map(content_source).collect();
            let source_tokens: u64 = source
                .iter()
                .map(|s| self.inner.estimator.text_tokens(&s.text))
                .sum();
            let target = match summary.kind {
                SummaryKind::Leaf => self.inner.config.leaf_target_tokens,
                SummaryKind::Condensed => self.inner.config.condensed_target_tokens,
            }
            .min(source_tokens / 3)
            .max(16);
            let request = SummaryRequest {
                kind: summary.kind,
                depth: summary.depth,
                level: SummaryLevel::Normal,
                target_tokens: target,
                items: source,
                previous_context: None,
                custom_instructions: None,
            };
            let Ok(produced) = self.inner.summarizer.summarize(&request).await else {
                // Still unavailable: try again at the next maintenance.
                return Ok(rewritten);
            };
            let tokens = summary_tokens(&*self.inner.estimator, &summary.into(), &produced.text);
            if produced.text.trim().is_empty() || tokens >= source_tokens {
                continue;
            }
            let updated = self
                .inner
                .store
                .update_summary(SummaryUpdate {
                    row_id: summary.row_id,
                    expected_level: SummaryLevel::Fallback,
                    content: produced.text,
                    tokens,
                    level: produced.level,
                    summarizer: self.inner.summarizer.id().to_owned(),
                })
                .await
                .map_err(|error| store_error("re-summarizing", error))?;
            rewritten += u64::from(updated);
        }
        Ok(rewritten)
    }
}

/// Where the last bootstrap stopped: the transcript cursor and the place (count of messages
/// before it). A mark saved before places were kept is a bare cursor; its place is unknown.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct BootstrapMark {
    cursor: Cursor,
    place: Option<u64>,
}

impl Default for BootstrapMark {
    fn default() -> BootstrapMark {
        BootstrapMark {
            cursor: Cursor::default(),
            place: Some(0),
        }
    }
}

impl BootstrapMark {
    fn parse(text: &str) -> BootstrapMark {
        serde_json::from_str(text).unwrap_or_else(|_| BootstrapMark {
            cursor: serde_json::from_str(text).unwrap_or_default(),
            place: None,
        })
    }
}

impl std::fmt::Display for BootstrapMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&json!({"cursor": self.cursor, "place": self.place}).to_string())
    }
}

enum Published {
    Replaced { fallback: bool },
    Stale,
    NoProgress,
}

/// `(earliest, latest, first seq, last seq)` of a run of items.
fn span(run: &[ContextItem]) -> (Option<i64>, Option<i64>, u64, u64) {
    let mut earliest: Option<i64> = None;
    let mut latest: Option<i64> = None;
    let mut first = u64::MAX;
    let mut last = 0;
    for item in run {
        let (e, l, f, z) = match &item.content {
            ItemContent::Message(message) => (
                Some(message.created_at_ms),
                Some(message.created_at_ms),
                message.seq,
                message.seq,
            ),
            ItemContent::Summary(summary) => (
                summary.earliest_at_ms,
                summary.latest_at_ms,
                summary.first_seq,
                summary.last_seq,
            ),
        };
        earliest = match (earliest, e) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        latest = match (latest, l) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        first = first.min(f);
        last = last.max(z);
    }
    (earliest, latest, first, last)
}

fn item_source(item: &ContextItem) -> SourceItem {
    content_source(&item.content)
}

pub(crate) fn content_source(content: &ItemContent) -> SourceItem {
    match content {
        ItemContent::Message(message) => match message.message() {
            Ok(parsed) => source_item(&parsed),
            Err(_) => SourceItem {
                label: message.role.clone(),
                timestamp_ms: Some(message.created_at_ms),
                text: String::new(),
            },
        },
        ItemContent::Summary(summary) => SourceItem {
            label: summary.summary_id.clone(),
            timestamp_ms: summary.latest_at_ms,
            text: summary.content.clone(),
        },
    }
}

/// Host requirement: the engine must control the prompt through `assemble`.
fn host_requirements() -> vilvona_core::host::HostRequirements {
    let mut requirements = vilvona_core::host::HostRequirements::new();
    requirements.insert(
        Operation::AgentRun,
        HostRequirement {
            required_capabilities: [Capability::AssembleBeforePrompt].into_iter().collect(),
            unsupported_message: Some(
                "The lossless engine builds the model's context in assemble(); this host never calls it before the prompt. \
                 Use the embedded host, or select the legacy engine for this backend."
                    .to_owned(),
            ),
        },
    );
    requirements
}

#[derive(Debug)]
struct GrantRollback {
    store: Arc<dyn HistoryStore>,
    grant_id: i64,
    seeded: Option<ConversationId>,
}

#[async_trait]
impl SpawnRollback for GrantRollback {
    async fn rollback(self: Box<Self>) -> Result<(), EngineError> {
        self.store
            .delete_grant(self.grant_id)
            .await
            .map_err(|error| store_error("rolling back a grant", error))?;
        if let Some(child) = self.seeded {
            self.store
                .remove_context(child)
                .await
                .map_err(|error| store_error("rolling back a fork", error))?;
        }
        Ok(())
    }
}

#[async_trait]
impl ContextEngine for LosslessEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: ENGINE_ID.to_owned(),
            name: "Lossless Context Engine".to_owned(),
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            owns_compaction: true,
            host_requirements: host_requirements(),
            turn_maintenance_mode: TurnMaintenanceMode::Foreground,
            accepted_host_params: [
                HostParam::SessionKey,
                HostParam::Prompt,
                HostParam::AbortSignal,
            ]
            .into_iter()
            .collect(),
            transcript_semantics: Some(TranscriptSemantics::durable_v1()),
        }
    }

    async fn bootstrap(&self, params: &BootstrapParams) -> Result<BootstrapResult, EngineError> {
        let Some(file) = params.session_file.as_deref() else {
            return Ok(BootstrapResult {
                bootstrapped: false,
                imported_messages: None,
                reason: Some("no session transcript".to_owned()),
            });
        };
        let path = Path::new(file);
        if !path.exists() {
            return Ok(BootstrapResult {
                bootstrapped: false,
                imported_messages: None,
                reason: Some(format!("{file} does not exist")),
            });
        }
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let imported = self.import_transcript(&conversation, path).await?;
        Ok(BootstrapResult {
            bootstrapped: true,
            imported_messages: Some(imported),
            reason: None,
        })
    }

    async fn ingest(&self, params: &IngestParams) -> Result<IngestResult, EngineError> {
        let outcome = self
            .ingest_messages(
                &params.session_id,
                params.session_key.as_deref(),
                std::slice::from_ref(&params.message),
                |_| MessageIdentity {
                    entry_id: params.entry_id.clone(),
                    ..MessageIdentity::default()
                },
                None,
            )
            .await?;
        Ok(IngestResult {
            ingested: matches!(outcome, IngestOutcome::Stored(ref results) if results.iter().any(|r| r.ingested)),
        })
    }

    async fn ingest_batch(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        let outcome = self
            .ingest_messages(
                &params.session_id,
                params.session_key.as_deref(),
                &params.messages,
                |index| MessageIdentity {
                    entry_id: params.entry_ids.get(index).cloned().flatten(),
                    ..MessageIdentity::default()
                },
                None,
            )
            .await?;
        Ok(IngestBatchResult {
            ingested_count: match outcome {
                IngestOutcome::Stored(results) => {
                    results.iter().filter(|r| r.ingested).count() as u64
                }
                IngestOutcome::DuplicateTurn => 0,
            },
        })
    }

    /// Stores the turn's messages (each at its place in the host's snapshot), then compacts
    /// unless the turn is a heartbeat.
    async fn after_turn(&self, params: &AfterTurnParams) -> Result<(), EngineError> {
        let (messages, entry_ids) = params.new_messages();
        let first_place = (params.messages.len() - messages.len()) as u64;
        self.ingest_messages(
            &params.session_id,
            params.session_key.as_deref(),
            messages,
            |index| MessageIdentity {
                entry_id: entry_ids.get(index).cloned().flatten(),
                turn: None,
                place: Some(first_place + index as u64),
            },
            None,
        )
        .await?;
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let budget = self
            .budget(
                conversation.id,
                carried_budget(params.token_budget, params.runtime_settings.as_ref()),
            )
            .await?;
        if !params.is_heartbeat {
            self.compact_conversation(conversation.id, CompactionRequest::routine(budget))
                .await?;
        }
        Ok(())
    }

    /// One atomic write per advancement key; a message without entry id is identified by the
    /// key and its index in the turn, so equal messages of two turns are both kept. Compacts
    /// against the budget the host last gave (2026.9 sends none here), unless the turn is a
    /// heartbeat: a heartbeat's messages are stored and searchable, but it never triggers
    /// compaction (it would spend summarizer calls and break the prompt cache for a ping).
    async fn commit_turn(
        &self,
        params: &CommitTurnParams,
    ) -> Result<CommitTurnResult, EngineError> {
        let outcome = self
            .ingest_messages(
                &params.session_id,
                params.session_key.as_deref(),
                &params.messages,
                |index| MessageIdentity {
                    entry_id: None,
                    turn: Some((params.advancement_key.clone(), index as u32)),
                    place: None,
                },
                Some(params.advancement_key.clone()),
            )
            .await?;
        if outcome == IngestOutcome::DuplicateTurn {
            return Ok(CommitTurnResult {
                status: CommitStatus::Duplicate,
            });
        }
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let budget = self.budget(conversation.id, params.budget()).await?;
        if !params.is_heartbeat {
            self.compact_conversation(conversation.id, CompactionRequest::routine(budget))
                .await?;
        }
        Ok(CommitTurnResult {
            status: CommitStatus::Committed,
        })
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        // Installed mid-session: the host has history the store lacks. Import it first, each
        // message at its place. The cached row's count is from when the session was first
        // seen: read the current one.
        let read_only = self.inner.store.is_read_only();
        if conversation.message_count == 0 && !params.messages.is_empty() && !read_only {
            let refreshed = self
                .inner
                .store
                .conversation_by_id(conversation.id)
                .await
                .map_err(|error| store_error("conversation", error))?;
            if refreshed.is_some_and(|row| row.message_count == 0) {
                self.ingest_messages(
                    &params.session_id,
                    params.session_key.as_deref(),
                    &params.messages,
                    |index| MessageIdentity::default().at(index as u64),
                    None,
                )
                .await?;
            }
            // Either way the store now holds messages: drop the stale row so this check is
            // not repeated on every later assembly.
            self.inner
                .conversations
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&params.session_id);
        }
        if let Some(budget) = params.budget().filter(|_| !read_only) {
            self.remember_budget(conversation.id, budget).await?;
        }
        let budget = self.budget(conversation.id, params.budget()).await?;
        let mut result = self.assemble_context(conversation.id, budget).await?;
        let offers_recall = [GREP_TOOL, DESCRIBE_TOOL, EXPAND_TOOL]
            .iter()
            .any(|tool| params.available_tools.contains(*tool));
        let mut addition: Vec<&str> = Vec::new();
        if offers_recall {
            addition.push(RECALL_GUIDANCE);
        }
        if let Some(memory) = params
            .memory_prompt
            .as_deref()
            .filter(|m| !m.trim().is_empty())
        {
            addition.push(memory);
        }
        if !addition.is_empty() {
            result.system_prompt_addition = Some(addition.join("\n\n"));
        }
        Ok(result)
    }

    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let budget = self
            .budget(conversation.id, carried_budget(params.token_budget, None))
            .await?;
        let report = self
            .compact_conversation(
                conversation.id,
                CompactionRequest {
                    budget,
                    force: params.force,
                    target: params.compaction_target,
                    custom_instructions: params.custom_instructions.as_deref(),
                    abort: params.abort.as_ref(),
                },
            )
            .await?;
        let details = CompactDetails {
            tokens_before: report.tokens_before,
            tokens_after: Some(report.tokens_after),
            details: Some(json!({
                "passes": report.passes,
                "summariesCreated": report.summaries_created,
                "fallbackSummaries": report.fallbacks,
                "stopReason": report.reason.as_ref().map(ToString::to_string),
            })),
            ..CompactDetails::default()
        };
        Ok(
            if report.summaries_created > 0 && report.tokens_after < report.tokens_before {
                CompactResult {
                    ok: true,
                    compacted: true,
                    reason: report.reason.or(Some(CompactReason::Compacted)),
                    result: Some(details),
                }
            } else {
                CompactResult {
                    ok: true,
                    compacted: false,
                    reason: report.reason.or(Some(CompactReason::NoCandidate)),
                    result: Some(details),
                }
            },
        )
    }

    /// Re-summarizes fallback summaries, then compacts if the context is above the threshold
    /// of the budget the host last gave (it may have shrunk since the last turn).
    async fn maintain(&self, params: &MaintainParams) -> Result<MaintainResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let rewritten = self.resummarize_fallbacks(conversation.id).await?;
        self.maybe_run_retention(&self.inner.config.retention).await;
        let budget = self.budget(conversation.id, params.budget()).await?;
        let report = self
            .compact_conversation(conversation.id, CompactionRequest::routine(budget))
            .await?;
        let compacted = report.summaries_created > 0;
        let mut reasons = Vec::new();
        if rewritten > 0 {
            reasons.push(format!("re-summarized {rewritten} fallback summaries"));
        }
        if compacted {
            reasons.push(format!(
                "compacted {} → {} tokens",
                report.tokens_before, report.tokens_after
            ));
        }
        Ok(MaintainResult {
            changed: rewritten > 0 || compacted,
            bytes_freed: 0,
            rewritten_entries: rewritten,
            reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        })
    }

    async fn prepare_subagent_spawn(
        &self,
        params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        let parent = match &params.parent_session_id {
            Some(session_id) => {
                self.conversation(session_id, Some(&params.parent_session_key))
                    .await?
            }
            None => {
                let found = self
                    .inner
                    .store
                    .conversations_by_session_key(
                        &self.inner.config.agent_id,
                        &params.parent_session_key,
                    )
                    .await
                    .map_err(|error| store_error("finding the parent", error))?;
                match found.last() {
                    Some(conversation) => conversation.clone(),
                    None => return Ok(None),
                }
            }
        };
        let ttl = params.ttl_ms.unwrap_or(3_600_000) as i64;
        let grant = self
            .inner
            .store
            .create_grant(NewGrant {
                grantee: params.child_session_key.clone(),
                conversation: parent.id,
                expires_at_ms: now_ms() + ttl,
                token_cap: self.inner.config.max_expand_tokens * 8,
            })
            .await
            .map_err(|error| store_error("granting recall", error))?;
        let mut seeded = None;
        if params.context_mode == ContextMode::Fork {
            let child_session = params
                .child_session_id
                .clone()
                .unwrap_or_else(|| params.child_session_key.clone());
            let child = self
                .conversation(&child_session, Some(&params.child_session_key))
                .await?;
            let items: Vec<ItemRef> = self
                .context(parent.id)
                .await?
                .iter()
                .map(ContextItem::item_ref)
                .collect();
            self.inner
                .store
                .append_items(child.id, items)
                .await
                .map_err(|error| store_error("seeding the fork", error))?;
            seeded = Some(child.id);
        }
        Ok(Some(Box::new(GrantRollback {
            store: self.inner.store.clone(),
            grant_id: grant.id,
            seeded,
        })))
    }

    async fn on_subagent_ended(&self, params: &SubagentEndedParams) -> Result<(), EngineError> {
        self.inner
            .store
            .revoke_grants(&params.child_session_key)
            .await
            .map_err(|error| store_error("revoking grants", error))?;
        Ok(())
    }

    fn tools(&self) -> Vec<ToolDefinition> {
        tool_definitions()
    }

    async fn call_tool(
        &self,
        caller: &ToolCaller,
        name: &str,
        arguments: &Value,
    ) -> Result<Value, EngineError> {
        Ok(LosslessEngine::call_tool(self, caller, name, arguments).await?)
    }

    fn admin(&self) -> Option<Arc<dyn EngineAdmin>> {
        Some(self.as_admin())
    }

    async fn dispose(&self) -> Result<(), EngineError> {
        Ok(())
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}
