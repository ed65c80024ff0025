//! The deterministic truncation fallback: no model, always succeeds, always shrinks.
//!
//! Used when summarization fails at every other level. Its output is marked as a fallback
//! so that an engine can re-summarize it once a summarizer works again; it is never a
//! near-copy of the source: it is at most half the source and at most the target.

use vilvona_core::summarize::{Summary, SummaryLevel, SummaryRequest};
use vilvona_core::tokens::TokenEstimator;

/// The summarizer id recorded on a summary an engine truncated on its own (to make room when
/// summarizing could not), rather than as a summarizer's last level.
pub const TRUNCATION_ID: &str = "truncation/v1";

/// Marker that opens every fallback summary.
pub const FALLBACK_MARKER: &str = "[fallback summary: truncated";

/// The head of each item, in order, within `min(target, source / 2)` tokens.
pub fn truncate(request: &SummaryRequest, estimator: &dyn TokenEstimator) -> Summary {
    let source_tokens: u64 = request
        .items
        .iter()
        .map(|item| estimator.text_tokens(&item.text))
        .sum();
    let header = format!("{FALLBACK_MARKER} from {source_tokens} tokens]");
    let cap = request.target_tokens.min(source_tokens / 2);
    let mut text = header;
    if request.items.is_empty() || estimator.text_tokens(&text) >= cap {
        return Summary::new(text, SummaryLevel::Fallback);
    }
    // An equal share for each item, in characters (≈4 per token); a line that does not fit is
    // shortened until it does, or dropped.
    let budget = cap - estimator.text_tokens(&text);
    let share_chars = ((budget as usize * 4) / request.items.len()).max(16);
    for item in &request.items {
        let words: String = item.text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut chars = share_chars;
        while chars >= 16 {
            let head: String = words.chars().take(chars).collect();
            let candidate = format!("{text}\n[{}] {head}", item.label);
            if estimator.text_tokens(&candidate) <= cap {
                text = candidate;
                break;
            }
            chars /= 2;
        }
    }
    Summary::new(text, SummaryLevel::Fallback)
}
