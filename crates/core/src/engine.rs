//! The `ContextEngine` trait, its parameters and results.
//!
//! Parameter and result types serialize to OpenClaw's camelCase wire shapes, so a host can bridge
//! them to JavaScript engines (and a JavaScript host to ours) without a translation table.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::admin::{EngineAdmin, ToolCaller, ToolDefinition};
pub use crate::error::EngineError;
use crate::host::HostRequirements;
use crate::message::AgentMessage;

// --- message lists -----------------------------------------------------------------------------

/// A shared, immutable-by-default list of messages. Hosts pass the whole conversation to
/// `assemble` and `after_turn` on every turn; sharing it makes that O(1) instead of a copy of
/// the history. Reads go through `Deref<Target = [AgentMessage]>`; a host appends with
/// [`Messages::make_mut`], which copies only if an engine kept a reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Messages(Arc<Vec<AgentMessage>>);

impl Messages {
    /// An empty list.
    pub fn new() -> Messages {
        Messages::default()
    }

    /// The list for appending (copy-on-write).
    pub fn make_mut(&mut self) -> &mut Vec<AgentMessage> {
        Arc::make_mut(&mut self.0)
    }

    /// A copy of the list.
    pub fn to_vec(&self) -> Vec<AgentMessage> {
        self.0.as_ref().clone()
    }
}

impl std::ops::Deref for Messages {
    type Target = [AgentMessage];

    fn deref(&self) -> &[AgentMessage] {
        &self.0
    }
}

impl From<Vec<AgentMessage>> for Messages {
    fn from(messages: Vec<AgentMessage>) -> Messages {
        Messages(Arc::new(messages))
    }
}

impl FromIterator<AgentMessage> for Messages {
    fn from_iter<I: IntoIterator<Item = AgentMessage>>(iter: I) -> Messages {
        Messages(Arc::new(iter.into_iter().collect()))
    }
}

impl PartialEq<Vec<AgentMessage>> for Messages {
    fn eq(&self, other: &Vec<AgentMessage>) -> bool {
        self.0.as_ref() == other
    }
}

// --- engine info --------------------------------------------------------------------------------

/// What an engine is, and what it needs from its host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineInfo {
    /// The engine's own id (display and logs); may differ from the id it was registered under.
    pub id: String,
    /// A display name.
    pub name: String,
    /// The engine's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The engine owns compaction: the host turns its built-in auto-compaction off.
    #[serde(default)]
    pub owns_compaction: bool,
    /// What the engine needs from a host, per operation (checked before it runs).
    #[serde(default, skip_serializing_if = "HostRequirements::is_empty")]
    pub host_requirements: HostRequirements,
    /// Whether `maintain` after a turn blocks the reply.
    #[serde(default)]
    pub turn_maintenance_mode: TurnMaintenanceMode,
    /// Host-added parameters the engine wants to receive (OpenClaw 2026.8+).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub accepted_host_params: BTreeSet<HostParam>,
    /// Declared transcript semantics; with `commit_turn`, required for durable turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript_semantics: Option<TranscriptSemantics>,
}

/// Whether `maintain` after a turn blocks the reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnMaintenanceMode {
    /// The reply waits for it.
    #[default]
    Foreground,
    /// It runs after the reply.
    Background,
}

/// Host-added parameters an engine can opt into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HostParam {
    /// `sessionKey` on every call.
    SessionKey,
    /// The run's prompt, on `assemble`.
    Prompt,
    /// `runtimeSettings` (the run's limits).
    RuntimeSettings,
    /// The session's target (channel, thread).
    SessionTarget,
    /// `runtimeContext` (the host's services, such as its model).
    RuntimeContext,
    /// An abort signal on `compact`.
    AbortSignal,
}

/// The transcript guarantees an engine declares for durable (recorder-backed) turns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptSemantics {
    /// `before-current-turn-entry-v1`: `assemble` receives the history before the current turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_turn_fence: Option<String>,
    /// `atomic-idempotent-v1`: `commit_turn` is one atomic write per advancement key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_advancement_idempotency: Option<String>,
}

impl TranscriptSemantics {
    /// The current-turn fence: the engine sees the history before the current turn's entry.
    pub const CURRENT_TURN_FENCE_V1: &'static str = "before-current-turn-entry-v1";
    /// Turn advancement is atomic and idempotent by key.
    pub const ATOMIC_IDEMPOTENT_V1: &'static str = "atomic-idempotent-v1";

    /// Both declarations a durable-turn host requires.
    pub fn durable_v1() -> TranscriptSemantics {
        TranscriptSemantics {
            current_turn_fence: Some(Self::CURRENT_TURN_FENCE_V1.to_owned()),
            turn_advancement_idempotency: Some(Self::ATOMIC_IDEMPOTENT_V1.to_owned()),
        }
    }

    /// True when both declarations have the values a durable-turn host requires.
    pub fn supports_durable_turns(&self) -> bool {
        self.current_turn_fence.as_deref() == Some(Self::CURRENT_TURN_FENCE_V1)
            && self.turn_advancement_idempotency.as_deref() == Some(Self::ATOMIC_IDEMPOTENT_V1)
    }
}

// --- cancellation -------------------------------------------------------------------------------

/// A cancellation flag shared between a host and an engine call. The host aborts; the engine
/// checks [`AbortSignal::is_aborted`] between steps and returns [`EngineError::Cancelled`].
#[derive(Clone, Debug, Default)]
pub struct AbortSignal {
    aborted: Arc<AtomicBool>,
}

impl AbortSignal {
    /// A signal not yet raised.
    pub fn new() -> AbortSignal {
        AbortSignal::default()
    }

    /// Raises the signal (every clone sees it).
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }

    /// True once raised.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

// --- parameters and results ---------------------------------------------------------------------

/// The host's per-run settings (`runtimeSettings` in OpenClaw 2026.x). Only what engines use is
/// typed; every other key is kept as sent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSettings {
    /// The run's prompt and output budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RuntimeLimits>,
    /// Other keys, kept as sent.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// `runtimeSettings.limits`: the run's prompt and output budgets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeLimits {
    /// Tokens the prompt may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_budget: Option<u64>,
    /// Tokens the reply may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Other keys, kept as sent.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// The prompt budget a call carries: its `tokenBudget`, else
/// `runtimeSettings.limits.promptTokenBudget`. Zero counts as absent.
pub fn carried_budget(
    token_budget: Option<u64>,
    runtime_settings: Option<&RuntimeSettings>,
) -> Option<u64> {
    token_budget.filter(|budget| *budget > 0).or_else(|| {
        runtime_settings
            .and_then(|settings| settings.limits.as_ref())
            .and_then(|limits| limits.prompt_token_budget)
            .filter(|budget| *budget > 0)
    })
}

/// `budget()` on each call's parameters that carry a budget and run settings.
macro_rules! carries_budget {
    ($($params:ty),+) => {$(
        impl $params {
            /// The prompt budget this call carries (see [`carried_budget`]).
            pub fn budget(&self) -> Option<u64> {
                carried_budget(self.token_budget, self.runtime_settings.as_ref())
            }
        }
    )+};
}

carries_budget!(
    AssembleParams,
    AfterTurnParams,
    MaintainParams,
    CommitTurnParams
);

/// `bootstrap`: a session the engine may import.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The session transcript (OpenClaw JSONL) the engine may import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
}

/// What `bootstrap` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapResult {
    /// True when the engine imported (or checked) the transcript.
    pub bootstrapped: bool,
    /// Messages imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_messages: Option<u64>,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `ingest`: one message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngestParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The message.
    pub message: AgentMessage,
    /// The host's transcript entry id for the message, when it has one (an idempotency key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_id: Option<String>,
    /// A heartbeat turn (a ping, not conversation): stored, never compacted for.
    #[serde(default)]
    pub is_heartbeat: bool,
}

/// What `ingest` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngestResult {
    /// False when the message was a duplicate or the engine stores nothing.
    pub ingested: bool,
}

/// `ingest_batch`: messages of one turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngestBatchParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The messages, in order.
    pub messages: Vec<AgentMessage>,
    /// Entry ids parallel to `messages`, when the host has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entry_ids: Vec<Option<String>>,
    /// A heartbeat turn (a ping, not conversation): stored, never compacted for.
    #[serde(default)]
    pub is_heartbeat: bool,
}

/// What `ingest_batch` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngestBatchResult {
    /// Messages stored (the others were already stored).
    pub ingested_count: u64,
}

/// `after_turn`: the session after a turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AfterTurnParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The session transcript (OpenClaw JSONL), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
    /// The whole conversation snapshot; `messages[pre_prompt_message_count..]` is the new turn.
    pub messages: Messages,
    /// Entry ids of the new turn's messages (parallel to `messages[pre_prompt_message_count..]`),
    /// when the host has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entry_ids: Vec<Option<String>>,
    /// How many of `messages` came before this turn.
    pub pre_prompt_message_count: usize,
    /// The summary of an auto-compaction the host ran in this turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compaction_summary: Option<String>,
    /// A heartbeat turn (a ping, not conversation): stored, never compacted for.
    #[serde(default)]
    pub is_heartbeat: bool,
    /// The prompt budget the host gives, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// The host's per-run settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_settings: Option<RuntimeSettings>,
}

impl AfterTurnParams {
    /// The messages the turn added, with their entry ids when known.
    pub fn new_messages(&self) -> (&[AgentMessage], &[Option<String>]) {
        let start = self.pre_prompt_message_count.min(self.messages.len());
        let new = &self.messages[start..];
        let ids = if self.entry_ids.len() == new.len() {
            &self.entry_ids[..]
        } else {
            &[]
        };
        (new, ids)
    }
}

/// `assemble`: build what the model sees.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssembleParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The host's own history for the session (what legacy passes through); empty when
    /// `history_elided`.
    #[serde(default)]
    pub messages: Messages,
    /// The host left its history out because the engine said it holds the session
    /// ([`AssembleResult::holds_history`]); an engine that needs it after all answers
    /// [`EngineError::HistoryNeeded`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history_elided: bool,
    /// The prompt budget the host gives, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// Tool names the model can call this run (a `Set` in OpenClaw; an array on the wire).
    #[serde(default)]
    pub available_tools: BTreeSet<String>,
    /// How memory citations are shown (`memory.citations`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub citations_mode: Option<String>,
    /// The model of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The run's prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The host's per-run settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_settings: Option<RuntimeSettings>,
    /// The host's memory provider's prompt section for this run, when one is active (the
    /// embedded host's `memory` settings); engines may place it or ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_prompt: Option<String>,
}

/// Which estimate the host's overflow precheck trusts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptAuthority {
    /// The assembled context is windowed and self-contained: check only its estimate.
    #[default]
    Assembled,
    /// The assembled view may hide overflow in the transcript: check the larger of both.
    PreassemblyMayOverflow,
}

/// When a host with persistent threads injects the context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjectionMode {
    /// Every turn.
    PerTurn,
    /// Once, when the backend thread starts.
    ThreadBootstrap,
}

/// How a host with persistent backend threads should inject the assembled context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextProjection {
    /// When to inject.
    pub mode: ProjectionMode,
    /// Changes when the projected context must be sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// A digest of the projected context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// What `assemble` built.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssembleResult {
    /// Exactly what the model will see, in order.
    pub messages: Messages,
    /// The engine's estimate of the assembled tokens (legacy reports 0).
    pub estimated_tokens: u64,
    /// Text to add to the system prompt (recall guidance, memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_addition: Option<String>,
    /// Which view the host's overflow precheck trusts.
    #[serde(default)]
    pub prompt_authority: PromptAuthority,
    /// How a host with persistent threads should inject it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_projection: Option<ContextProjection>,
    /// The messages that stand for summarized history, for reports like `/context` (none for
    /// an engine that does not summarize).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summaries: Vec<AssembledSummary>,
    /// The engine keeps this session's history itself: the host may leave `messages` out of
    /// its next `assemble` of the session (`history_elided`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_history: bool,
}

/// A message of an assembled context that stands for summarized history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssembledSummary {
    /// Its index in [`AssembleResult::messages`].
    pub index: usize,
    /// Its depth in the engine's summaries (0: a summary of raw messages).
    pub depth: u32,
}

/// How far a compaction should go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionTarget {
    /// Down to the token budget.
    Budget,
    /// Down to the engine's own target below its threshold.
    Threshold,
}

/// `compact`: make the context smaller.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The agent, when the host names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The session transcript (OpenClaw JSONL), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
    /// The prompt budget the host gives, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// Compact even when under threshold (manual `/compact`).
    #[serde(default)]
    pub force: bool,
    /// The host's count of its whole prompt (its own system prompt and tools, and the
    /// context), when it has one: OpenClaw sends it when it needs room now (preflight,
    /// overflow recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_token_count: Option<u64>,
    /// How far to go (the engine's default target when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_target: Option<CompactionTarget>,
    /// The operator's instructions for the summary (`/compact <instructions>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_instructions: Option<String>,
    /// The host's per-run settings (its prompt budget), when it sends them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_settings: Option<RuntimeSettings>,
    /// Aborted by the host on run abort or timeout. Not on the wire (`$/cancel` carries it).
    #[serde(skip)]
    pub abort: Option<AbortSignal>,
}

/// Why a compaction did (or did not) change anything. Stable strings on the wire; a reason from
/// a foreign engine that is not one of ours is kept as [`CompactReason::Other`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactReason {
    /// Compaction ran and reduced the context.
    Compacted,
    /// The context is already below the engine's threshold.
    BelowThreshold,
    /// Nothing outside the protected tail could be compacted.
    NoCandidate,
    /// A pass would not have reduced tokens; stopped rather than loop.
    NoProgress,
    /// The call ran out of time.
    Deadline,
    /// The summarizer failed at every level.
    SummarizerUnavailable,
    /// The history is too small to compact.
    TooSmall,
    /// The caller cancelled.
    Cancelled,
    /// The engine keeps a window instead of summarizing.
    Windowed,
    /// Compaction ran, but what it must keep (the recent tail) alone exceeds the budget.
    OverBudget,
    /// Nothing to do: the context is already where compaction would bring it (the host's count
    /// predates the engine's last compaction). OpenClaw treats this as a skip, not a failure.
    AlreadyCompacted,
    /// A reason this contract does not name, kept as sent.
    #[serde(untagged)]
    Other(String),
}

impl fmt::Display for CompactReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_value(self) {
            Ok(Value::String(s)) => f.write_str(&s),
            _ => write!(f, "{self:?}"),
        }
    }
}

/// What a compaction produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactDetails {
    /// The summary text, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The first transcript entry kept verbatim (legacy compaction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_kept_entry_id: Option<String>,
    /// Context tokens before.
    pub tokens_before: u64,
    /// Context tokens after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_after: Option<u64>,
    /// Engine-specific detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// The successor session when compaction rotated the transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The successor transcript file when compaction rotated the transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
}

/// What `compact` did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactResult {
    /// False when compaction failed.
    pub ok: bool,
    /// True only when the context actually got smaller.
    pub compacted: bool,
    /// Why it compacted, or did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<CompactReason>,
    /// What it produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<CompactDetails>,
}

impl CompactResult {
    /// A successful compaction.
    pub fn compacted(details: CompactDetails) -> CompactResult {
        CompactResult {
            ok: true,
            compacted: true,
            reason: Some(CompactReason::Compacted),
            result: Some(details),
        }
    }

    /// A call that succeeded but changed nothing.
    pub fn unchanged(reason: CompactReason, tokens: u64) -> CompactResult {
        CompactResult {
            ok: true,
            compacted: false,
            reason: Some(reason),
            result: Some(CompactDetails {
                tokens_before: tokens,
                tokens_after: Some(tokens),
                ..CompactDetails::default()
            }),
        }
    }

    /// A call that failed honestly: nothing changed.
    pub fn failed(reason: CompactReason) -> CompactResult {
        CompactResult {
            ok: false,
            compacted: false,
            reason: Some(reason),
            result: None,
        }
    }
}

/// Why `maintain` is called.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaintainReason {
    /// After a session's bootstrap.
    Bootstrap,
    /// After a turn.
    #[default]
    Turn,
    /// After a compaction.
    Compaction,
}

/// `maintain`: work after a turn (re-summarizing, retention).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintainParams {
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The session transcript (OpenClaw JSONL), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
    /// Why it is called.
    #[serde(default)]
    pub reason: MaintainReason,
    /// The prompt budget the host gives, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// The host's per-run settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_settings: Option<RuntimeSettings>,
}

/// What `maintain` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintainResult {
    /// True when anything changed.
    pub changed: bool,
    /// Bytes freed.
    pub bytes_freed: u64,
    /// Entries (summaries) rewritten.
    pub rewritten_entries: u64,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `commit_turn`: one durable turn, written once per advancement key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitTurnParams {
    /// One durable write per key: a repeat of the same key is a duplicate.
    pub advancement_key: String,
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The admitted user entry through the accepted terminal entry.
    pub messages: Vec<AgentMessage>,
    /// How many of the session's messages came before this turn.
    #[serde(default)]
    pub pre_prompt_message_count: usize,
    /// Transcript anchors of the admitted and terminal entries, as the host sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Value>,
    /// The terminal entry's anchor, as the host sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<Value>,
    /// A heartbeat turn (a ping, not conversation): stored, never compacted for.
    #[serde(default)]
    pub is_heartbeat: bool,
    /// OpenClaw 2026.9 sends none; engines fall back to the budget they last saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// The host's per-run settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_settings: Option<RuntimeSettings>,
}

/// What `commit_turn` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitStatus {
    /// The turn was written.
    Committed,
    /// The key was written before: nothing changed.
    Duplicate,
}

/// What `commit_turn` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitTurnResult {
    /// Written, or a duplicate.
    pub status: CommitStatus,
}

/// How a subagent starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextMode {
    /// With a context of its own (it may recall the parent's history through a grant).
    #[default]
    Isolated,
    /// With the parent's context.
    Fork,
}

/// `prepare_subagent_spawn`: a child session about to start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentSpawnParams {
    /// The parent's session key.
    pub parent_session_key: String,
    /// The child's session key.
    pub child_session_key: String,
    /// Isolated or forked.
    #[serde(default)]
    pub context_mode: ContextMode,
    /// The parent's session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<String>,
    /// The parent's transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_file: Option<String>,
    /// The child's session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session_id: Option<String>,
    /// The child's transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session_file: Option<String>,
    /// How long the child may read the parent's history, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// Undoes a subagent-spawn preparation when the spawn fails after it succeeded.
#[async_trait]
pub trait SpawnRollback: Send + Sync + fmt::Debug {
    /// Undoes the preparation.
    async fn rollback(self: Box<Self>) -> Result<(), EngineError>;
}

/// What a successful preparation returns: a rollback handle, when there is something to undo.
pub type SpawnPreparation = Option<Box<dyn SpawnRollback>>;

/// Why a subagent ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubagentEndReason {
    /// Its session was deleted.
    Deleted,
    /// It finished its task.
    Completed,
    /// It was swept as stale.
    Swept,
    /// It was released by its parent.
    Released,
}

/// `on_subagent_ended`: a child session ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentEndedParams {
    /// The child's session key.
    pub child_session_key: String,
    /// Why it ended.
    pub reason: SubagentEndReason,
}

/// `on_session_reset`: the host begins the session anew under the same session id (OpenClaw's
/// `/new` and `/reset` keep the id and start a new window of its transcript).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionResetParams {
    /// The session that begins anew.
    pub session_id: String,
    /// Its key, when the host names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// The host's word for it (`new`, `reset`), as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// --- the trait ----------------------------------------------------------------------------------

/// A context engine: decides what the model sees on each run.
///
/// `info`, `ingest`, `assemble` and `compact` are required. The optional members have defaults
/// that reproduce OpenClaw's host precedence: the host always calls `after_turn`, whose default
/// ingests the new messages with `ingest_batch`, whose default calls `ingest` for each. So an
/// engine that overrides only `ingest` is driven exactly as OpenClaw drives one.
#[async_trait]
pub trait ContextEngine: Send + Sync {
    /// Who the engine is and what it declares.
    fn info(&self) -> EngineInfo;

    /// Stores one message.
    async fn ingest(&self, params: &IngestParams) -> Result<IngestResult, EngineError>;

    /// Builds what the model sees, within the budget.
    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError>;

    /// Makes the context smaller (or says why not).
    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError>;

    /// Imports a session the engine has not seen (its transcript), once per session.
    async fn bootstrap(&self, _params: &BootstrapParams) -> Result<BootstrapResult, EngineError> {
        Ok(BootstrapResult {
            bootstrapped: false,
            imported_messages: None,
            reason: Some("engine has no bootstrap".to_owned()),
        })
    }

    /// Stores the messages of one turn; the default ingests each.
    async fn ingest_batch(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        let mut ingested_count = 0;
        for (index, message) in params.messages.iter().enumerate() {
            let result = self
                .ingest(&IngestParams {
                    session_id: params.session_id.clone(),
                    session_key: params.session_key.clone(),
                    message: message.clone(),
                    entry_id: params.entry_ids.get(index).cloned().flatten(),
                    is_heartbeat: params.is_heartbeat,
                })
                .await?;
            ingested_count += u64::from(result.ingested);
        }
        Ok(IngestBatchResult { ingested_count })
    }

    /// Work after a turn; the default ingests the turn's new messages.
    async fn after_turn(&self, params: &AfterTurnParams) -> Result<(), EngineError> {
        let (messages, entry_ids) = params.new_messages();
        self.ingest_batch(&IngestBatchParams {
            session_id: params.session_id.clone(),
            session_key: params.session_key.clone(),
            messages: messages.to_vec(),
            entry_ids: entry_ids.to_vec(),
            is_heartbeat: params.is_heartbeat,
        })
        .await?;
        Ok(())
    }

    /// Maintenance after a turn, a bootstrap or a compaction; the default does nothing.
    async fn maintain(&self, _params: &MaintainParams) -> Result<MaintainResult, EngineError> {
        Ok(MaintainResult::default())
    }

    /// Durable turn advancement. Hosts call it only for engines whose `transcript_semantics`
    /// declare atomic idempotency; the default refuses.
    async fn commit_turn(
        &self,
        _params: &CommitTurnParams,
    ) -> Result<CommitTurnResult, EngineError> {
        Err(EngineError::Unsupported {
            method: "commit_turn",
        })
    }

    /// Prepares a subagent's start (grants, a forked context); returns what undoes it.
    async fn prepare_subagent_spawn(
        &self,
        _params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        Ok(None)
    }

    /// Cleans up after a subagent ended (its grants end).
    async fn on_subagent_ended(&self, _params: &SubagentEndedParams) -> Result<(), EngineError> {
        Ok(())
    }

    /// The session begins anew: what the engine keeps for it must not reach the next
    /// assembly. Nothing by default (an engine that builds from the host's messages sees the
    /// new window as it is).
    async fn on_session_reset(&self, _params: &SessionResetParams) -> Result<(), EngineError> {
        Ok(())
    }

    /// The tools this engine offers the model; none by default.
    fn tools(&self) -> Vec<ToolDefinition> {
        Vec::new()
    }

    /// Calls one of [`tools`](ContextEngine::tools) on behalf of `caller`.
    async fn call_tool(
        &self,
        _caller: &ToolCaller,
        name: &str,
        _arguments: &Value,
    ) -> Result<Value, EngineError> {
        Err(EngineError::refused(format!(
            "context engine \"{}\" offers no tool {name:?}",
            self.info().id
        )))
    }

    /// The administration of the history this engine keeps; `None` when it keeps none.
    fn admin(&self) -> Option<Arc<dyn EngineAdmin>> {
        None
    }

    /// Releases resources at host shutdown or reload (not per session).
    async fn dispose(&self) -> Result<(), EngineError> {
        Ok(())
    }
}
