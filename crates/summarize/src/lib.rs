//! Offline summarization and token counting for vilvona's engines.
//!
//! - [`ExtractiveSummarizer`]: the default summarizer — deterministic, no model, no network,
//!   always within its token target, with an `Expand for details about:` footer for what it
//!   dropped;
//! - [`truncate`]: the deterministic fallback level behind the same trait;
//! - [`extractive_answer`]: an answer to a question from evidence, without a model;
//! - [`estimator`]: the heuristic or a BPE tokenizer (`o200k`, `cl100k`, vocabularies embedded),
//!   with a calibration multiplier;
//! - [`identifiers`]: the identifier extraction both use, also handy for descriptions;
//! - [`prompt_excerpt`]: what a model summarizer's prompt reads of each item.

mod answer;
mod excerpt;
mod extractive;
mod identifiers;
mod lines;
mod time;
mod tokenizer;
mod truncate;

pub use answer::{STOP_WORDS, extractive_answer, meaning_answer};
pub use excerpt::prompt_excerpt;
pub use extractive::{EXPAND_FOOTER, ExtractiveSummarizer};
pub use identifiers::identifiers;
pub use lines::PINNED_PREFIX;
pub use time::{format_utc_minutes, format_utc_rfc3339, parse_rfc3339};
pub use tokenizer::{BpeEstimator, TokenizerKind, estimator};
pub use truncate::{FALLBACK_MARKER, TRUNCATION_ID, truncate};

use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::SourceItem;

/// A message as summarizer input: labelled with its role (`toolResult:<tool>` for tool
/// results, so summarizers can describe payloads instead of copying them).
pub fn source_item(message: &AgentMessage) -> SourceItem {
    let label = match message {
        AgentMessage::ToolResult(result) => match &result.tool_name {
            Some(tool) => format!("toolResult:{tool}"),
            None => "toolResult".to_owned(),
        },
        other => other.role().to_owned(),
    };
    SourceItem {
        label,
        timestamp_ms: message.timestamp_ms(),
        text: message.plain_text(),
    }
}
