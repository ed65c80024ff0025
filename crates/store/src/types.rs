//! The values the store takes and returns.

use serde::{Deserialize, Serialize};
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SummaryKind, SummaryLevel};

use crate::error::{Result, StoreError};

/// A conversation's row id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ConversationId(pub i64);

/// A message's row id (global across conversations, increasing with ingest order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MessageId(pub i64);

/// A summary's row id. The public, content-addressed id is [`StoredSummary::summary_id`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SummaryRowId(pub i64);

/// Which conversation: an agent's session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConversationKey {
    pub agent_id: String,
    pub session_id: String,
    pub session_key: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    pub id: ConversationId,
    pub agent_id: String,
    pub session_id: String,
    pub session_key: Option<String>,
    pub active: bool,
    pub created_at_ms: i64,
    /// The running total of the context items' tokens.
    pub context_tokens: u64,
    /// Messages ever stored (sequence numbers given out; never goes down).
    pub message_count: u64,
    /// The newest message's time, if any.
    pub last_activity_ms: Option<i64>,
    /// When retention archived it (its rows left the index; searches read them from the
    /// database); `None` while it is live. New messages make it live again.
    pub archived_at_ms: Option<i64>,
    /// Messages the store holds now: `message_count` less those forgotten.
    pub stored_messages: u64,
}

/// The largest message JSON the store accepts. Larger content belongs in a blob.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// How a message is recognised when it arrives again: one rule, whichever path it came by.
///
/// - With an entry id (the host's transcript id), that id is its identity.
/// - Without one, inside a durable turn, it is the turn's advancement key and its index there.
/// - With a `place` (its 0-based position in the session's message sequence as the host
///   counts it), a message equal to the one already stored at that place is the same message.
///   This is how a transcript bootstrapped after `commit_turn` stored its turns imports nothing
///   twice.
/// - Otherwise it is new: two equal messages are two messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageIdentity {
    pub entry_id: Option<String>,
    /// `(advancement key, index within the turn)`.
    pub turn: Option<(String, u32)>,
    pub place: Option<u64>,
}

impl MessageIdentity {
    /// Identified by the host's entry id.
    pub fn entry(entry_id: impl Into<String>) -> MessageIdentity {
        MessageIdentity {
            entry_id: Some(entry_id.into()),
            ..MessageIdentity::default()
        }
    }

    /// The same identity, also known to sit at `place` in the session.
    pub fn at(mut self, place: u64) -> MessageIdentity {
        self.place = Some(place);
        self
    }
}

/// A message to ingest, with what the engine computed for it.
#[derive(Clone, Debug)]
pub struct NewMessage {
    pub message: AgentMessage,
    /// How the message is recognised if it arrives again.
    pub identity: MessageIdentity,
    /// Token count, computed once by the engine's estimator.
    pub tokens: u64,
}

impl NewMessage {
    /// Parses one message from JSON, with an error that says what is wrong with it.
    pub fn from_json(json: &str, entry_id: Option<String>, tokens: u64) -> Result<NewMessage> {
        let message = serde_json::from_str(json)
            .map_err(|error| StoreError::InvalidMessage(error.to_string()))?;
        Ok(NewMessage {
            message,
            identity: MessageIdentity {
                entry_id,
                ..MessageIdentity::default()
            },
            tokens,
        })
    }
}

/// What happened to one message of an ingest call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ingested {
    pub message_id: MessageId,
    pub seq: u64,
    /// False when the message was already stored (see [`MessageIdentity`]).
    pub ingested: bool,
}

/// The result of an ingest call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngestOutcome {
    Stored(Vec<Ingested>),
    /// The advancement key was already committed: nothing was written.
    DuplicateTurn,
}

/// A stored message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    pub id: MessageId,
    pub conversation: ConversationId,
    pub seq: u64,
    pub role: String,
    /// The message JSON exactly as ingested.
    pub json: String,
    pub tokens: u64,
    pub created_at_ms: i64,
}

impl StoredMessage {
    pub fn message(&self) -> Result<AgentMessage> {
        serde_json::from_str(&self.json)
            .map_err(|error| StoreError::CorruptRow(format!("message {}: {error}", self.id.0)))
    }

    /// The message's readable text (derived from the JSON; not stored twice).
    pub fn text(&self) -> String {
        self.message()
            .map(|message| message.plain_text())
            .unwrap_or_default()
    }
}

/// Which kind of summary, on the wire of the schema.
pub(crate) fn kind_str(kind: SummaryKind) -> &'static str {
    match kind {
        SummaryKind::Leaf => "leaf",
        SummaryKind::Condensed => "condensed",
    }
}

pub(crate) fn level_str(level: SummaryLevel) -> &'static str {
    match level {
        SummaryLevel::Normal => "normal",
        SummaryLevel::Aggressive => "aggressive",
        SummaryLevel::Fallback => "fallback",
    }
}

pub(crate) fn parse_kind(text: &str) -> Result<SummaryKind> {
    match text {
        "leaf" => Ok(SummaryKind::Leaf),
        "condensed" => Ok(SummaryKind::Condensed),
        other => Err(StoreError::CorruptRow(format!("summary kind {other:?}"))),
    }
}

pub(crate) fn parse_level(text: &str) -> Result<SummaryLevel> {
    match text {
        "normal" => Ok(SummaryLevel::Normal),
        "aggressive" => Ok(SummaryLevel::Aggressive),
        "fallback" => Ok(SummaryLevel::Fallback),
        other => Err(StoreError::CorruptRow(format!("summary level {other:?}"))),
    }
}

/// A stored summary node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSummary {
    pub row_id: SummaryRowId,
    /// Content-addressed: `sum_` and 16 hex digits of a blake3 over its children and content.
    pub summary_id: String,
    pub conversation: ConversationId,
    pub depth: u32,
    pub kind: SummaryKind,
    pub content: String,
    pub tokens: u64,
    pub earliest_at_ms: Option<i64>,
    pub latest_at_ms: Option<i64>,
    /// The seq range of the messages it covers.
    pub first_seq: u64,
    pub last_seq: u64,
    pub level: SummaryLevel,
    /// The summarizer id and prompt version that produced it.
    pub summarizer: String,
    pub created_at_ms: i64,
}

/// What a context item points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemRef {
    Message(MessageId),
    Summary(SummaryRowId),
}

/// One context item with everything assembly needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextItem {
    pub position: i64,
    pub tokens: u64,
    pub content: ItemContent,
}

/// The role of a tool result: the one role that continues the unit before it.
pub const TOOL_RESULT_ROLE: &str = "toolResult";

/// The unit rule, in one place: what must never be split is an assistant message with its tool
/// results, so a tool result continues the unit before it and every other item starts one.
pub trait Unit {
    /// True when the item continues the unit before it.
    fn continues_unit(&self) -> bool;
}

impl Unit for ContextItem {
    fn continues_unit(&self) -> bool {
        matches!(&self.content, ItemContent::Message(message) if message.role == TOOL_RESULT_ROLE)
    }
}

impl Unit for ContextRef {
    fn continues_unit(&self) -> bool {
        self.continues_unit
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemContent {
    Message(StoredMessage),
    Summary(StoredSummary),
}

impl ContextItem {
    pub fn item_ref(&self) -> ItemRef {
        match &self.content {
            ItemContent::Message(message) => ItemRef::Message(message.id),
            ItemContent::Summary(summary) => ItemRef::Summary(summary.row_id),
        }
    }
}

/// A context item without its content: what assembly needs to decide what to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextRef {
    pub position: i64,
    pub item: ItemRef,
    pub tokens: u64,
    /// The item continues the unit before it (see [`Unit`]; read from the message's role).
    pub continues_unit: bool,
}

/// A summary to publish in place of a planned run of context items.
#[derive(Clone, Debug)]
pub struct NewSummary {
    pub kind: SummaryKind,
    pub depth: u32,
    pub content: String,
    pub tokens: u64,
    pub level: SummaryLevel,
    pub summarizer: String,
}

/// A compaction plan: replace these contiguous context items (as read) with one summary.
#[derive(Clone, Debug)]
pub struct ReplacePlan {
    pub conversation: ConversationId,
    /// `(position, item)` pairs exactly as the caller read them, in order, contiguous.
    pub items: Vec<(i64, ItemRef)>,
    pub summary: NewSummary,
}

/// The result of a replace: published, or refused because the context changed meanwhile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplaceOutcome {
    Replaced(StoredSummary),
    /// The planned range is no longer what the caller read: nothing was written.
    Stale,
}

/// A new text for an existing summary (re-summarizing a fallback node).
#[derive(Clone, Debug)]
pub struct SummaryUpdate {
    pub row_id: SummaryRowId,
    /// The level the caller read; the update is refused if it changed meanwhile.
    pub expected_level: SummaryLevel,
    pub content: String,
    pub tokens: u64,
    pub level: SummaryLevel,
    pub summarizer: String,
}

/// What forgetting removes: a whole conversation, or its messages created before a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgetScope {
    Conversation,
    /// Milliseconds since the epoch; messages created before it are forgotten.
    Before(i64),
}

/// A summary rewritten without what was forgotten (same id, same place in the DAG).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRewrite {
    pub row_id: SummaryRowId,
    pub content: String,
    pub tokens: u64,
    pub summarizer: String,
}

/// Forgetting, as the engine planned it: for [`ForgetScope::Before`], every summary above a
/// forgotten message is either removed (nothing of it remains) or rewritten from what remains.
/// The store applies the plan in one transaction, or answers `None` (stale) when the
/// summaries above those messages changed since the plan was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgetPlan {
    pub conversation: ConversationId,
    pub scope: ForgetScope,
    pub removed: Vec<SummaryRowId>,
    pub rewritten: Vec<SummaryRewrite>,
}

impl ForgetPlan {
    /// Forgetting a whole conversation (nothing to plan: everything of it goes).
    pub fn whole(conversation: ConversationId) -> ForgetPlan {
        ForgetPlan {
            conversation,
            scope: ForgetScope::Conversation,
            removed: Vec::new(),
            rewritten: Vec::new(),
        }
    }
}

pub use vilvona_core::admin::{ForgetReport, ReclaimReport};

/// Content too large for the context, stored once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewBlob {
    pub conversation: ConversationId,
    pub kind: String,
    pub content: String,
    pub description: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobInfo {
    /// Content-addressed: `file_` and 16 hex digits of the content's blake3.
    pub blob_id: String,
    pub conversation: ConversationId,
    pub kind: String,
    pub bytes: u64,
    pub lines: u64,
    pub description: String,
    pub created_at_ms: i64,
}

/// A subagent's read access to a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub id: i64,
    /// The child's session key.
    pub grantee: String,
    pub conversation: ConversationId,
    pub expires_at_ms: i64,
    pub token_cap: u64,
    pub revoked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewGrant {
    pub grantee: String,
    pub conversation: ConversationId,
    pub expires_at_ms: i64,
    pub token_cap: u64,
}

/// How a search matches its text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// BM25 over the query's terms.
    #[default]
    Text,
    /// The terms in order, adjacent.
    Phrase,
    /// A linear-time regular expression over the text (the `regex` crate).
    Regex,
}

/// What a search looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchTarget {
    Messages,
    Summaries,
    #[default]
    Both,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchOrder {
    #[default]
    Relevance,
    Recency,
}

/// A search, always scoped to one agent and a set of its conversations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    pub agent_id: String,
    pub conversations: Vec<ConversationId>,
    pub text: String,
    pub mode: SearchMode,
    pub target: SearchTarget,
    pub since_ms: Option<i64>,
    pub before_ms: Option<i64>,
    pub limit: usize,
    pub order: SearchOrder,
}

/// What a hit is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HitSource {
    Message {
        id: MessageId,
        seq: u64,
        role: String,
    },
    Summary {
        row_id: SummaryRowId,
        summary_id: String,
        depth: u32,
        kind: SummaryKind,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    pub source: HitSource,
    pub conversation: ConversationId,
    pub time_ms: i64,
    /// BM25 score (0 for regex and recency order).
    pub score: f32,
    /// A short excerpt around the densest matches, matches wrapped in `«` `»`.
    pub snippet: String,
    /// The large content (`file_…`) the snippet comes from, when the match is in a blob the
    /// message references rather than in its own text.
    pub file: Option<String>,
    /// The summary that currently covers the row (its topmost ancestor), if it was compacted.
    pub covered_by: Option<String>,
}

/// The outcome of the integrity check: empty `problems` means healthy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IntegrityReport {
    pub messages: u64,
    pub summaries: u64,
    pub context_items: u64,
    pub indexed_messages_through: i64,
    pub indexed_summaries_through: i64,
    pub problems: Vec<String>,
}

impl IntegrityReport {
    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty()
    }
}
