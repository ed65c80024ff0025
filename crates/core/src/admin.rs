//! What an engine offers besides the turn lifecycle: tools the model can call, and the
//! administration of the history it keeps.
//!
//! Both are optional members of [`ContextEngine`](crate::ContextEngine): an engine without
//! tools returns none, an engine that keeps no history has no [`EngineAdmin`]. Hosts reach
//! them through the quarantine guard like every other call, so a host never needs an engine's
//! concrete type to offer its tools or check its store.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::archive::{ImportReport, SessionArchive};
use crate::error::EngineError;

/// A tool as a host offers it to a model: its name, what it does, and the JSON schema of its
/// arguments.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolDefinition {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON schema of its arguments.
    pub parameters: Value,
}

/// The session on whose behalf a tool is called; engines scope what a tool reads by it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCaller {
    /// The calling session's id.
    pub session_id: String,
    /// The calling session's key, when the host has one.
    pub session_key: Option<String>,
}

impl ToolCaller {
    /// A caller named by its session id and, optionally, key.
    pub fn new(session_id: impl Into<String>, session_key: Option<String>) -> ToolCaller {
        ToolCaller {
            session_id: session_id.into(),
            session_key,
        }
    }
}

/// The result of checking an engine's storage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageCheck {
    /// One line on what was checked, e.g. counts of rows.
    pub summary: String,
    /// Summaries the store holds.
    pub summaries: u64,
    /// What is wrong; empty when healthy.
    pub problems: Vec<String>,
    /// Whether rebuilding the derived search index from the store heals one of the problems
    /// (what `doctor --fix` does).
    #[serde(default)]
    pub index_needs_rebuild: bool,
    /// What an operator should know that is not a problem of the store (sessions whose turns
    /// the host never committed, say).
    #[serde(default)]
    pub notices: Vec<String>,
}

impl StorageCheck {
    /// True when the check found nothing wrong.
    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty()
    }
}

/// How much an engine's storage holds on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageUsage {
    /// Bytes of the database files.
    pub database_bytes: u64,
    /// Documents in the recall index.
    pub index_docs: u64,
}

/// A session whose history the engine keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredSession {
    /// The session id.
    pub session_id: String,
    /// The session key, when one was given.
    pub session_key: Option<String>,
}

/// What the engine keeps of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStats {
    /// The session id.
    pub session: String,
    /// Messages held (forgotten ones excluded).
    pub messages: u64,
    /// Summaries in the context, by depth.
    pub summaries_by_depth: BTreeMap<String, u64>,
    /// Summaries in the context, by who wrote them (`<writer> in place of <configured>` when
    /// a fallback wrote one because the configured summarizer could not be reached).
    pub summaries_by_summarizer: BTreeMap<String, u64>,
    /// Items of the context.
    pub context_items: u64,
    /// Tokens of the context.
    pub context_tokens: u64,
    /// The context's items grouped by kind (`summary, depth 0`, `message, user`).
    pub context_by_kind: BTreeMap<String, ItemGroup>,
    /// What the context is planned against, when the engine plans against a host's window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<WindowPlan>,
    /// Turns the engine took in from the host's history because the host never committed
    /// them, when it took any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUpReport>,
}

/// Turns an engine took in from the host's history at a later turn, because the host never
/// handed them over (OpenClaw commits no turn on Anthropic's API with its cache-ttl pruning),
/// or because the store lost them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CatchUpReport {
    /// Turns taken in so.
    pub turns: u64,
    /// Their messages.
    pub messages: u64,
    /// Whether the host's commits are missing now (none came since the last turn taken in).
    pub commits_missing: bool,
}

/// What an engine plans a session's context against: what the host last said of its window
/// and its own prompt, and the limits drawn from them (tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowPlan {
    /// The whole prompt's budget the host checks against (its model's window), when it said.
    pub window: Option<u64>,
    /// What the host adds around the engine's context (system prompt, tools, the user's
    /// prompt), as last counted.
    pub host_prompt: Option<u64>,
    /// Whether that count is the provider's (from usage), not the host's estimate.
    pub host_prompt_observed: bool,
    /// What the host keeps free for the model's reply.
    pub reserve: Option<u64>,
    /// The room the host last gave the engine's context, when it said.
    pub budget: Option<u64>,
    /// A routine compaction runs above this many tokens of context.
    pub trigger: u64,
    /// A compaction folds the context down to this.
    pub goal: u64,
    /// The most the context may hold.
    pub ceiling: u64,
}

/// One turn of a session as the engine saw it when the turn was committed: the context its
/// model call was assembled from, what the host added, the folds the turn's compaction made,
/// and what the provider reported for its calls. An engine keeps a bounded number of the
/// newest, forgotten with the session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRecord {
    /// The turn's number in the session, from 1.
    pub turn: u64,
    /// When it was committed, in milliseconds since the epoch.
    pub at: i64,
    /// Tokens of the context the turn's last assembly held, by kind (`summary, depth 0`,
    /// `message, user`); empty when this engine instance assembled none for it.
    pub context: BTreeMap<String, u64>,
    /// What the host adds around the context (system prompt, tools, the user's prompt), as the
    /// provider counted it, else the host's estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_prompt: Option<u64>,
    /// The host's window, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Context tokens above which compaction runs.
    pub trigger: u64,
    /// What the provider reported for the turn's model calls, summed; `None` when it
    /// reported nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TurnUsage>,
    /// The summaries the turn's compaction published (`sum_…`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub folds: Vec<String>,
    /// Context tokens before the turn's compaction.
    pub context_before_compaction: u64,
    /// Context tokens after it.
    pub context_after_compaction: u64,
    /// A heartbeat turn (never compacts).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub heartbeat: bool,
    /// What the engine brought into the turn's prompt from the history beyond its context
    /// (recall at assembly), best first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recalled: Vec<RecalledItem>,
}

/// One excerpt an engine brought into a turn's prompt from the history beyond its context.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecalledItem {
    /// The message's id (`msg_…`).
    pub id: String,
    /// The score it was chosen by (hybrid search's fused score).
    pub score: f64,
    /// The excerpt's tokens.
    pub tokens: u64,
}

/// A turn's model calls as the provider counted them (tokens), and what the host priced them
/// at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnUsage {
    /// Calls that reported usage.
    pub calls: u64,
    /// Input tokens read fresh (neither from nor into the cache).
    pub input: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
    /// Output tokens.
    pub output: u64,
    /// What the calls cost, as the host priced them from its model's configured prices per
    /// token kind (OpenClaw's `usage.cost.total`), when it priced any above zero; or as
    /// `vilvona context history --prices` prices the tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// Prices per million tokens of each kind, to price a turn's usage where the host did not.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TokenPrices {
    /// Input read fresh.
    pub input: f64,
    /// Input read from the cache.
    pub cached_input: f64,
    /// Input written to the cache.
    pub cache_write: f64,
    /// Output.
    pub output: f64,
}

impl TokenPrices {
    /// `INPUT,CACHED,WRITE,OUTPUT` per million tokens (`3,0.3,3.75,15`).
    pub fn parse(text: &str) -> Result<TokenPrices, String> {
        let prices: Vec<f64> = text
            .split(',')
            .map(|part| {
                part.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|price| price.is_finite() && *price >= 0.0)
                    .ok_or_else(|| format!("{part:?} is not a price (a number, 0 or more)"))
            })
            .collect::<Result<_, _>>()?;
        match prices[..] {
            [input, cached_input, cache_write, output] => Ok(TokenPrices {
                input,
                cached_input,
                cache_write,
                output,
            }),
            _ => Err(format!(
                "{text:?}: four prices per million tokens are needed, INPUT,CACHED,WRITE,OUTPUT (as 3,0.3,3.75,15)"
            )),
        }
    }

    /// What `usage` costs at these prices.
    pub fn cost(&self, usage: &TurnUsage) -> f64 {
        (usage.input as f64 * self.input
            + usage.cache_read as f64 * self.cached_input
            + usage.cache_write as f64 * self.cache_write
            + usage.output as f64 * self.output)
            / 1_000_000.0
    }
}

/// Items of one kind in a context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemGroup {
    /// How many.
    pub items: u64,
    /// Their tokens.
    pub tokens: u64,
}

/// What a forget removed from the store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForgetReport {
    /// Messages removed.
    pub messages: u64,
    /// Summaries removed (nothing remained below them).
    pub summaries_removed: u64,
    /// Summaries rewritten from what remained below them.
    pub summaries_rewritten: u64,
    /// Context items removed.
    pub context_items: u64,
    /// Stored files removed (no other message referenced them).
    pub blobs: u64,
    /// Other conversations whose context held forgotten rows by reference.
    pub conversations_touched: u64,
}

/// Space on disk before and after reclaiming it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimReport {
    /// Bytes before.
    pub bytes_before: u64,
    /// Bytes after.
    pub bytes_after: u64,
}

/// What forgetting did, with the space reclaimed afterwards.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Forgotten {
    /// What was removed.
    #[serde(flatten)]
    pub report: ForgetReport,
    /// The space reclaimed.
    pub space: ReclaimReport,
}

/// What retention does to one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RetentionKind {
    /// Kept, out of the recall index.
    Archive,
    /// Forgotten.
    Delete,
}

/// One thing retention does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionAction {
    /// The session it acts on.
    pub session_id: String,
    /// What it does.
    pub action: RetentionKind,
    /// Why, in words.
    pub reason: String,
}

/// What a retention run found and did.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionRun {
    /// The policy, as configured.
    pub policy: Value,
    /// What it does (or would do, on a dry run).
    pub actions: Vec<RetentionAction>,
    /// The space reclaimed, when anything was done.
    pub space: Option<ReclaimReport>,
}

/// What re-summarizing the summaries a stand-in wrote in a session's context found and did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resummarized {
    /// The summarizer that writes the new summaries (the configured one).
    pub summarizer: String,
    /// The summaries a stand-in wrote in the session's context (a truncation, or a fallback
    /// summarizer in place of the configured one) before the run.
    pub flagged: u64,
    /// How many were rewritten (0 on a preview).
    pub rewritten: u64,
    /// Of those, how many it left truncated: the summarizer failed, or wrote nothing smaller
    /// than the truncation it would replace.
    pub remaining: u64,
}

/// A summary in a conversation's DAG.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DagSummary {
    /// The node's number, unique within the store.
    pub row_id: i64,
    /// The id the recall tools know it by (`sum_…`).
    pub summary_id: String,
    /// 0 for a leaf over messages.
    pub depth: u32,
    /// `leaf` or `condensed`.
    pub kind: String,
    /// Tokens of its text.
    pub tokens: u64,
    /// Whether the context holds it (a top of the DAG).
    pub in_context: bool,
    /// Its child summaries, by row id.
    pub child_summaries: Vec<i64>,
    /// Messages directly below it.
    pub child_messages: u64,
    /// Tokens of those messages.
    pub child_message_tokens: u64,
    /// How it was written: `normal`, `aggressive`, or `fallback` (the deterministic
    /// truncation that makes room without a summarizer).
    pub level: String,
    /// The summarizer and prompt version that wrote it (`extractive/v1 in place of
    /// host-llm/v1` when a fallback stood in for the configured one).
    pub summarizer: String,
    /// When it was published, in milliseconds since the epoch.
    pub created_at_ms: i64,
    /// When the earliest message below it was written (ms since the epoch), when known.
    pub earliest_at_ms: Option<i64>,
    /// When the latest message below it was written, when known.
    pub latest_at_ms: Option<i64>,
}

/// A conversation's DAG: its summaries, and the messages the context holds raw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DagView {
    /// Every summary, deepest first.
    pub summaries: Vec<DagSummary>,
    /// Messages the context holds unsummarized.
    pub raw_messages: u64,
    /// Tokens of those messages.
    pub raw_message_tokens: u64,
}

impl DagView {
    /// Summaries by depth.
    pub fn by_depth(&self) -> BTreeMap<u32, Vec<&DagSummary>> {
        let mut levels: BTreeMap<u32, Vec<&DagSummary>> = BTreeMap::new();
        for summary in &self.summaries {
            levels.entry(summary.depth).or_default().push(summary);
        }
        levels
    }
}

/// The administration of an engine's stored history: what operators and `doctor` need, with no
/// knowledge of how the engine stores it.
#[async_trait]
pub trait EngineAdmin: Send + Sync {
    /// Checks the storage without changing it.
    async fn check(&self) -> Result<StorageCheck, EngineError>;

    /// Rebuilds the recall index from the database; returns the documents written.
    async fn rebuild_index(&self) -> Result<u64, EngineError>;

    /// Bytes on disk and documents indexed.
    async fn usage(&self) -> Result<StorageUsage, EngineError>;

    /// The sessions whose history is kept.
    async fn stored_sessions(&self) -> Result<Vec<StoredSession>, EngineError>;

    /// What is kept of one session.
    async fn session_stats(&self, session: &ToolCaller) -> Result<SessionStats, EngineError>;

    /// The session's summary DAG.
    async fn dag(&self, session: &ToolCaller) -> Result<DagView, EngineError>;

    /// The session's newest turns as the engine recorded them (see [`TurnRecord`]), oldest
    /// first.
    async fn turn_history(&self, session: &ToolCaller) -> Result<Vec<TurnRecord>, EngineError>;

    /// Rewrites the summaries in the session's context that a stand-in wrote when the
    /// configured summarizer could not (a truncation, or a fallback summarizer) with the
    /// configured summarizer, each keeping its place and its sources; without `apply`, only
    /// counts them. (Maintenance rewrites those folded under a parent too.)
    async fn resummarize(
        &self,
        session: &ToolCaller,
        apply: bool,
    ) -> Result<Resummarized, EngineError>;

    /// Forgets a session's history, or only what came before `before_ms`.
    async fn forget(
        &self,
        session_id: &str,
        before_ms: Option<i64>,
    ) -> Result<Forgotten, EngineError>;

    /// What the retention policy does now (by the engine's clock); with `apply`, does it.
    async fn retention(&self, apply: bool) -> Result<RetentionRun, EngineError>;

    /// A session's whole history, read in one snapshot (see [`crate::archive`]).
    async fn export_session(&self, session_id: &str) -> Result<SessionArchive, EngineError>;

    /// Stores an exported history as a new session, in one transaction, and verifies that the
    /// store holds exactly what the archive holds. Refused when the session, or one of its
    /// summaries, is already stored.
    async fn import_session(&self, archive: SessionArchive) -> Result<ImportReport, EngineError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_four_numbers_per_million_tokens() {
        let prices = TokenPrices::parse("3, 0.3,3.75,15").unwrap();
        let usage = TurnUsage {
            calls: 1,
            input: 1_000_000,
            cache_read: 2_000_000,
            cache_write: 0,
            output: 100_000,
            cost: None,
        };
        assert!((prices.cost(&usage) - (3.0 + 0.6 + 1.5)).abs() < 1e-9);
        for wrong in ["3,0.3,3.75", "3,0.3,3.75,x", "3,-1,3.75,15", ""] {
            assert!(TokenPrices::parse(wrong).is_err(), "{wrong}");
        }
    }
}
