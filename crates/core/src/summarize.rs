//! The summarizer seam. Engines ask for summaries; implementations (extractive, model-backed,
//! deterministic truncation) live outside the contract crate.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// What is being summarized: raw messages (a leaf) or earlier summaries (a condensed node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryKind {
    /// Over raw messages.
    Leaf,
    /// Over summaries of the depth below.
    Condensed,
}

/// How hard to compress. Engines escalate when a level fails or does not shrink the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryLevel {
    /// Within the target.
    Normal,
    /// Shorter: only decisions, outcomes and identifiers.
    Aggressive,
    /// Deterministic truncation: no model, always succeeds, always shrinks.
    Fallback,
}

/// One unit of source text: a message (labelled with its role) or a summary (with its id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceItem {
    /// `user`, `assistant`, `toolResult`, … or a summary id.
    pub label: String,
    /// Milliseconds since the epoch, when known.
    pub timestamp_ms: Option<i64>,
    /// The text.
    pub text: String,
}

/// A request for one summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRequest {
    /// Leaf or condensed.
    pub kind: SummaryKind,
    /// 0 for a leaf; d+1 for a node condensing depth-d summaries.
    pub depth: u32,
    /// How hard to compress.
    pub level: SummaryLevel,
    /// The token count the summary should not exceed.
    pub target_tokens: u64,
    /// What to summarize, labelled.
    pub items: Vec<SourceItem>,
    /// Text of the summaries just before this range, for continuity. Not to be summarized.
    pub previous_context: Option<String>,
    /// Operator instructions (from `/compact <instructions>`).
    pub custom_instructions: Option<String>,
}

impl SummaryRequest {
    /// A request at the normal level, with no previous context and no operator instructions.
    pub fn new(
        kind: SummaryKind,
        depth: u32,
        target_tokens: u64,
        items: Vec<SourceItem>,
    ) -> SummaryRequest {
        SummaryRequest {
            kind,
            depth,
            level: SummaryLevel::Normal,
            target_tokens,
            items,
            previous_context: None,
            custom_instructions: None,
        }
    }

    /// The source as one text: each item on its own lines, prefixed by its label.
    pub fn source_text(&self) -> String {
        let mut out = String::new();
        for item in &self.items {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push('[');
            out.push_str(&item.label);
            out.push_str("] ");
            out.push_str(&item.text);
        }
        out
    }
}

/// A produced summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The summary.
    pub text: String,
    /// The level that produced it (a summarizer may fall back internally).
    pub level: SummaryLevel,
    /// Set when the summarizer asked could not write it and the one behind it did.
    pub degraded: Option<Degraded>,
}

impl Summary {
    /// A summary written by the summarizer asked.
    pub fn new(text: String, level: SummaryLevel) -> Summary {
        Summary {
            text,
            level,
            degraded: None,
        }
    }
}

/// Who wrote a summary in place of the summarizer asked, and why: a host's model that could not
/// be reached, its extractive fallback. Engines record the writer and report the count, so a
/// fallback never passes for the model's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    /// The id of the summarizer that wrote the summary.
    pub written_by: String,
    /// Why the one asked did not.
    pub reason: String,
}

/// Why a summary could not be produced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SummarizeError {
    /// Worth retrying later or at another level (rate limit, timeout, server error).
    #[error("summarizer temporarily unavailable: {0}")]
    Transient(String),
    /// Credentials were refused; retrying will not help until the operator acts.
    #[error("summarizer authentication failed: {0}")]
    Auth(String),
    /// The output was empty or not smaller than the input.
    #[error("summarizer output unusable: {0}")]
    BadOutput(String),
    /// The caller cancelled.
    #[error("summarization cancelled")]
    Cancelled,
    /// This summarizer does not answer questions (the engine answers extractively instead).
    #[error("this summarizer does not answer questions")]
    Unsupported,
}

/// A piece of stored history offered as evidence for a question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The id a citation names (`msg_…`, `sum_…`).
    pub id: String,
    /// `user`, `assistant`, `toolResult:exec`, `summary`, …
    pub label: String,
    /// When it was created.
    pub timestamp_ms: Option<i64>,
    /// Its text.
    pub text: String,
}

/// A question to answer from history alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuestionRequest {
    /// The question.
    pub question: String,
    /// What to answer from.
    pub evidence: Vec<Evidence>,
    /// The answer should not exceed this many tokens.
    pub max_answer_tokens: u64,
}

/// An answer and the evidence ids it rests on (each one of the request's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The answer.
    pub text: String,
    /// The ids of the evidence it rests on.
    pub citations: Vec<String>,
    /// Who answered: a summarizer id (a model's, or the extractive default's).
    pub answered_by: String,
}

/// Produces summaries. Implementations must be deterministic where they can be (the extractive
/// default is), and must never hold a database transaction while they run.
#[async_trait]
pub trait Summarizer: Send + Sync + fmt::Debug {
    /// A stable id recorded on every summary node (for provenance and re-summarization).
    fn id(&self) -> &str;

    /// Summarizes the request's items within its target.
    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError>;

    /// Whether the summarizer can be asked now. A host's model is within reach only during a
    /// call that brings it (OpenClaw brings its model to `maintain` and `compact`, not to a
    /// turn's commit); a fold that can wait for such a call does, rather than publish what a
    /// stand-in writes in its place.
    fn in_reach(&self) -> bool {
        true
    }

    /// Answers a question from the evidence alone, citing the evidence it used. The same model
    /// that writes the summaries answers; a summarizer without one says [`Unsupported`]
    /// (the engine then answers extractively).
    ///
    /// [`Unsupported`]: SummarizeError::Unsupported
    async fn answer(&self, request: &QuestionRequest) -> Result<Answer, SummarizeError> {
        let _ = request;
        Err(SummarizeError::Unsupported)
    }
}

/// `summarizer` in an engine's config: `{kind: "extractive"}`, `{kind: "openai", …}`, or
/// `{kind: "host"}` (the embedding host's own model, e.g. OpenClaw's `llm.complete`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind", deny_unknown_fields)]
pub enum SummarizerConfig {
    /// The offline extractive summarizer.
    #[default]
    #[serde(rename = "extractive")]
    Extractive,
    /// The embedding host's model.
    #[serde(rename = "host")]
    Host,
    /// An OpenAI-compatible chat-completions endpoint.
    #[serde(rename = "openai", rename_all = "camelCase")]
    OpenAi {
        /// The endpoint's base URL.
        base_url: String,
        /// The model asked first.
        model: String,
        /// The environment variable holding the API key.
        #[serde(default)]
        api_key_env: Option<String>,
        /// Models asked, in order, when the first fails.
        #[serde(default)]
        fallback_models: Vec<String>,
        /// Time limit of one request.
        #[serde(default = "default_timeout_ms")]
        timeout_ms: u64,
        /// Retries of one model before the next.
        #[serde(default = "default_retries")]
        retries: u32,
        /// The first retry's wait, doubled each time.
        #[serde(default = "default_backoff_ms")]
        backoff_ms: u64,
        /// How long an authentication failure stops requests.
        #[serde(default = "default_cooldown_ms")]
        auth_cooldown_ms: u64,
    },
}

fn default_timeout_ms() -> u64 {
    60_000
}
fn default_retries() -> u32 {
    2
}
fn default_backoff_ms() -> u64 {
    500
}
fn default_cooldown_ms() -> u64 {
    300_000
}
