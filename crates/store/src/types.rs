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
    /// The agent.
    pub agent_id: String,
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    pub session_key: Option<String>,
}

/// A stored conversation: one session of an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    /// Its row id.
    pub id: ConversationId,
    /// The agent.
    pub agent_id: String,
    /// The host's session id.
    pub session_id: String,
    /// The host's session key, when it has one.
    pub session_key: Option<String>,
    /// False once the session ended.
    pub active: bool,
    /// When it was created, in milliseconds since the epoch.
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
    /// The host's entry id.
    pub entry_id: Option<String>,
    /// `(advancement key, index within the turn)`.
    pub turn: Option<(String, u32)>,
    /// Its position in the session's message sequence, when known.
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
    /// The message.
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
    /// Its id.
    pub message_id: MessageId,
    /// Its place in the conversation.
    pub seq: u64,
    /// False when the message was already stored (see [`MessageIdentity`]).
    pub ingested: bool,
}

/// The result of an ingest call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngestOutcome {
    /// One result per message, in order.
    Stored(Vec<Ingested>),
    /// The advancement key was already committed: nothing was written.
    DuplicateTurn,
}

impl IngestOutcome {
    /// Messages this call stored (the others were stored before).
    pub fn newly_stored(&self) -> u64 {
        match self {
            IngestOutcome::Stored(results) => {
                results.iter().filter(|result| result.ingested).count() as u64
            }
            IngestOutcome::DuplicateTurn => 0,
        }
    }
}

/// A stored message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    /// Its id.
    pub id: MessageId,
    /// Its conversation.
    pub conversation: ConversationId,
    /// Its place in the conversation.
    pub seq: u64,
    /// Its role (`user`, `assistant`, `toolResult`, …).
    pub role: String,
    /// The message JSON exactly as ingested.
    pub json: String,
    /// Its tokens, as the engine counted them.
    pub tokens: u64,
    /// When it was created, in milliseconds since the epoch.
    pub created_at_ms: i64,
}

impl StoredMessage {
    /// The message, decoded from its stored JSON.
    pub fn message(&self) -> Result<AgentMessage> {
        serde_json::from_str(&self.json)
            .map_err(|error| StoreError::CorruptRow(format!("message {}: {error}", self.id.0)))
    }

    /// The message's readable text (derived from the JSON; not stored twice).
    pub fn text(&self) -> String {
        AgentMessage::plain_text_of_json(&self.json)
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
    /// Its row id.
    pub row_id: SummaryRowId,
    /// Content-addressed: `sum_` and 16 hex digits of a blake3 over its children and content.
    pub summary_id: String,
    /// Its conversation.
    pub conversation: ConversationId,
    /// 0 for a leaf over messages; one more than its children for a condensed node.
    pub depth: u32,
    /// Leaf or condensed.
    pub kind: SummaryKind,
    /// Its text.
    pub content: String,
    /// Its tokens, as the engine counted them.
    pub tokens: u64,
    /// When the earliest message below it was created.
    pub earliest_at_ms: Option<i64>,
    /// When the latest message below it was created.
    pub latest_at_ms: Option<i64>,
    /// The seq range of the messages it covers.
    pub first_seq: u64,
    /// The last message below it, by `seq`.
    pub last_seq: u64,
    /// How it was produced (normal, aggressive, or the truncation fallback).
    pub level: SummaryLevel,
    /// The summarizer id and prompt version that produced it.
    pub summarizer: String,
    /// When it was published.
    pub created_at_ms: i64,
}

/// Time and seq range covered by a planned run of items (the store reads it while publishing).
pub(crate) struct Span {
    pub(crate) earliest_ms: Option<i64>,
    pub(crate) latest_ms: Option<i64>,
    pub(crate) first_seq: i64,
    pub(crate) last_seq: i64,
}

impl StoredSummary {
    /// The summary a replacement published, as both backends answer it.
    pub(crate) fn published(
        row_id: i64,
        summary_id: String,
        conversation: ConversationId,
        summary: NewSummary,
        span: Span,
        created_at_ms: i64,
    ) -> StoredSummary {
        StoredSummary {
            row_id: SummaryRowId(row_id),
            summary_id,
            conversation,
            depth: summary.depth,
            kind: summary.kind,
            content: summary.content,
            tokens: summary.tokens,
            earliest_at_ms: span.earliest_ms,
            latest_at_ms: span.latest_ms,
            first_seq: span.first_seq as u64,
            last_seq: span.last_seq as u64,
            level: summary.level,
            summarizer: summary.summarizer,
            created_at_ms,
        }
    }
}

/// What a context item points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemRef {
    /// A message.
    Message(MessageId),
    /// A summary.
    Summary(SummaryRowId),
}

/// One context item with everything assembly needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextItem {
    /// Its position (gaps of 1,024; a replaced run takes its first position).
    pub position: i64,
    /// What it costs in the context.
    pub tokens: u64,
    /// The message or summary.
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

/// What a context item holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemContent {
    /// A message.
    Message(StoredMessage),
    /// A summary.
    Summary(StoredSummary),
}

impl ContextItem {
    /// A reference to it.
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
    /// Its position.
    pub position: i64,
    /// The message or summary.
    pub item: ItemRef,
    /// What it costs in the context.
    pub tokens: u64,
    /// The item continues the unit before it (see [`Unit`]; read from the message's role).
    pub continues_unit: bool,
    /// For a summary: what compaction plans by (`None` for a message).
    pub summary: Option<SummaryShape>,
}

/// A context summary's depth, level and span, without its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SummaryShape {
    /// Its depth in the DAG.
    pub depth: u32,
    /// How it was made (a fallback summary is never rolled up).
    pub level: SummaryLevel,
    /// The seq range of the messages below it. With its level and tokens, this tells a summary
    /// rewritten in place (re-summarized, or narrowed by forgetting) from the one read before.
    pub first_seq: u64,
    /// See `first_seq`.
    pub last_seq: u64,
}

/// A summary to publish in place of a planned run of context items.
#[derive(Clone, Debug)]
pub struct NewSummary {
    /// Leaf or condensed.
    pub kind: SummaryKind,
    /// 0 for a leaf; one more than its children for a condensed node.
    pub depth: u32,
    /// Its text.
    pub content: String,
    /// Its tokens, as the engine counted them (with its wrapper in the context).
    pub tokens: u64,
    /// How it was produced.
    pub level: SummaryLevel,
    /// Which summarizer produced it (`extractive/v1`, a model).
    pub summarizer: String,
}

/// A compaction plan: replace these contiguous context items (as read) with one summary.
#[derive(Clone, Debug)]
pub struct ReplacePlan {
    /// The conversation.
    pub conversation: ConversationId,
    /// `(position, item)` pairs exactly as the caller read them, in order, contiguous.
    pub items: Vec<(i64, ItemRef)>,
    /// The summary to put in their place.
    pub summary: NewSummary,
}

/// The result of a replace: published, or refused because the context changed meanwhile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplaceOutcome {
    /// Published; the summary as stored.
    Replaced(StoredSummary),
    /// The planned range is no longer what the caller read: nothing was written.
    Stale,
}

/// A new text for an existing summary (re-summarizing a fallback node).
#[derive(Clone, Debug)]
pub struct SummaryUpdate {
    /// The summary.
    pub row_id: SummaryRowId,
    /// The level the caller read; the update is refused if it changed meanwhile.
    pub expected_level: SummaryLevel,
    /// The summarizer the caller read; the update is refused if it changed meanwhile (another
    /// call rewrote it first).
    pub expected_summarizer: String,
    /// The new text.
    pub content: String,
    /// Its tokens.
    pub tokens: u64,
    /// How it was produced.
    pub level: SummaryLevel,
    /// Which summarizer produced it.
    pub summarizer: String,
}

/// What forgetting removes: a whole conversation, or its messages created before a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgetScope {
    /// The whole conversation.
    Conversation,
    /// Milliseconds since the epoch; messages created before it are forgotten.
    Before(i64),
}

/// A summary rewritten without what was forgotten (same id, same place in the DAG).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRewrite {
    /// The summary.
    pub row_id: SummaryRowId,
    /// Its text without what was forgotten.
    pub content: String,
    /// Its tokens.
    pub tokens: u64,
    /// Which summarizer produced it.
    pub summarizer: String,
}

/// Forgetting, as the engine planned it: every summary above a forgotten row is either
/// removed (nothing of it remains) or rewritten from what remains — for
/// [`ForgetScope::Before`], the conversation's own above its forgotten messages; for
/// [`ForgetScope::Conversation`], whose own summaries all go, those of other conversations
/// above its messages and summaries (a fork's, folding its parent's rows). The store applies
/// the plan in one transaction, or answers `None` (stale) when the summaries above those rows
/// changed since the plan was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgetPlan {
    /// The conversation.
    pub conversation: ConversationId,
    /// All of it, or its messages before a time.
    pub scope: ForgetScope,
    /// Summaries removed (nothing of them remains).
    pub removed: Vec<SummaryRowId>,
    /// Summaries rewritten from what remains.
    pub rewritten: Vec<SummaryRewrite>,
}

impl ForgetPlan {
    /// Forgetting a whole conversation that no other conversation's summary stands above
    /// (else the plan is stale: the engine plans those).
    pub fn whole(conversation: ConversationId) -> ForgetPlan {
        ForgetPlan {
            conversation,
            scope: ForgetScope::Conversation,
            removed: Vec::new(),
            rewritten: Vec::new(),
        }
    }

    /// Whether the plan is still the one to apply, given the summaries above the forgotten
    /// rows now (`summaries_above` of its scope): a plan before a time removes or rewrites
    /// exactly those; a whole session's, exactly the other conversations' among them (its own
    /// go with it). Else it is stale.
    pub(crate) fn still_covers(
        &self,
        conversation: ConversationId,
        above: &[StoredSummary],
    ) -> bool {
        let planned = above.iter().filter(|summary| {
            self.scope != ForgetScope::Conversation || summary.conversation != conversation
        });
        self.covers_exactly(planned.map(|summary| summary.row_id))
    }

    /// Whether the plan removes or rewrites exactly these summaries, in any order.
    fn covers_exactly(&self, above: impl IntoIterator<Item = SummaryRowId>) -> bool {
        let mut above: Vec<SummaryRowId> = above.into_iter().collect();
        let mut planned: Vec<SummaryRowId> = self
            .removed
            .iter()
            .copied()
            .chain(self.rewritten.iter().map(|rewrite| rewrite.row_id))
            .collect();
        above.sort();
        planned.sort();
        above == planned
    }
}

pub use vilvona_core::admin::{ForgetReport, ReclaimReport};

/// Content too large for the context, stored once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewBlob {
    /// The conversation that stores it first.
    pub conversation: ConversationId,
    /// What it is (`json`, `log`, `code`, `text`).
    pub kind: String,
    /// The content.
    pub content: String,
    /// A short description, shown in its place.
    pub description: String,
}

/// A stored file's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobInfo {
    /// Content-addressed: `file_` and 16 hex digits of the content's blake3.
    pub blob_id: String,
    /// The conversation that stored it first.
    pub conversation: ConversationId,
    /// What it is.
    pub kind: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its lines.
    pub lines: u64,
    /// Its description.
    pub description: String,
    /// When it was stored.
    pub created_at_ms: i64,
}

/// A subagent's read access to a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// Its id.
    pub id: i64,
    /// The child's session key.
    pub grantee: String,
    /// The conversation it lets the grantee read.
    pub conversation: ConversationId,
    /// When it ends, in milliseconds since the epoch.
    pub expires_at_ms: i64,
    /// The most tokens one read through it returns.
    pub token_cap: u64,
    /// Ended early (the subagent ended).
    pub revoked: bool,
}

/// A grant to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewGrant {
    /// The session key that may read.
    pub grantee: String,
    /// The conversation it may read.
    pub conversation: ConversationId,
    /// When it ends, in milliseconds since the epoch.
    pub expires_at_ms: i64,
    /// The most tokens one read through it returns.
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
    /// By meaning: the rows whose embedding is nearest the query's (cosine similarity).
    Semantic,
    /// Text and meaning together: reciprocal rank fusion of the two searches.
    Hybrid,
}

/// What a search looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchTarget {
    /// Messages only.
    Messages,
    /// Summaries only.
    Summaries,
    /// Both.
    #[default]
    Both,
}

/// How hits are ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchOrder {
    /// Best match first.
    #[default]
    Relevance,
    /// Newest first.
    Recency,
}

/// A search, always scoped to one agent and a set of its conversations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    /// The agent whose conversations are searched.
    pub agent_id: String,
    /// The conversations (the caller's scope).
    pub conversations: Vec<ConversationId>,
    /// Words, a phrase, or a regular expression.
    pub text: String,
    /// How `text` is read.
    pub mode: SearchMode,
    /// Messages, summaries, or both.
    pub target: SearchTarget,
    /// Only rows from this time on.
    pub since_ms: Option<i64>,
    /// Only rows before this time.
    pub before_ms: Option<i64>,
    /// Most hits.
    pub limit: usize,
    /// How hits are ordered.
    pub order: SearchOrder,
}

/// What a hit is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HitSource {
    /// A message.
    Message {
        /// Its id.
        id: MessageId,
        /// Its place in the conversation.
        seq: u64,
        /// Its role.
        role: String,
    },
    /// A summary.
    Summary {
        /// Its row id.
        row_id: SummaryRowId,
        /// Its public id.
        summary_id: String,
        /// Its depth.
        depth: u32,
        /// Leaf or condensed.
        kind: SummaryKind,
    },
}

impl HitSource {
    /// The context item the hit is.
    pub fn item_ref(&self) -> ItemRef {
        match self {
            HitSource::Message { id, .. } => ItemRef::Message(*id),
            HitSource::Summary { row_id, .. } => ItemRef::Summary(*row_id),
        }
    }
}

/// One search result.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    /// The message or summary.
    pub source: HitSource,
    /// Its conversation.
    pub conversation: ConversationId,
    /// When it was created (a summary: its latest message).
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
    /// Messages stored.
    pub messages: u64,
    /// Summaries stored.
    pub summaries: u64,
    /// Context items, in every conversation.
    pub context_items: u64,
    /// The highest message id the index holds.
    pub indexed_messages_through: i64,
    /// The highest summary row id the index holds.
    pub indexed_summaries_through: i64,
    /// What serves recall, in a few words (`index through message N`; on PostgreSQL, the
    /// database itself).
    pub recall: String,
    /// Summaries a fallback summarizer wrote in place of the configured one (their summarizer
    /// reads `<writer> in place of <configured>`): not damage, but worth saying.
    pub stand_in_summaries: u64,
    /// What is wrong; empty when healthy.
    pub problems: Vec<String>,
    /// Whether one of the problems is the recall index's (missing, unreadable, damaged, or
    /// ahead of the database): rebuilding it from the database heals it.
    pub index_needs_rebuild: bool,
}

/// Counts the summaries a fallback wrote in place of the configured summarizer (both backends).
pub(crate) const STAND_IN_SUMMARIES: &str =
    "SELECT count(*) FROM summaries WHERE summarizer LIKE '% in place of %'";

/// Whether a summary was written by a stand-in: the truncation (level `Fallback`), or a
/// fallback summarizer in place of the configured one ([`stand_in_summarizer`]).
pub fn written_by_a_stand_in(level: SummaryLevel, summarizer: &str) -> bool {
    level == SummaryLevel::Fallback || summarizer.contains(" in place of ")
}

/// [`written_by_a_stand_in`] in SQL, of a summary row aliased `s` (both backends).
pub(crate) const WRITTEN_BY_A_STAND_IN: &str =
    "(s.level = 'fallback' OR s.summarizer LIKE '% in place of %')";

/// What a summary's `summarizer` records when `written_by` wrote it in place of `asked`.
pub fn stand_in_summarizer(written_by: &str, asked: &str) -> String {
    format!("{written_by} in place of {asked}")
}

impl IntegrityReport {
    /// True when nothing is wrong.
    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty()
    }
}
