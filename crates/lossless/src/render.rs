//! How stored items appear to the model: summaries as user-role `<summary>` blocks, large
//! content as references with a deterministic description. Rendering depends only on stored
//! fields, so an unchanged context renders byte-identically (prompt-cache friendly).

use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SourceItem, SummaryKind};
use vilvona_core::tokens::{MESSAGE_OVERHEAD_TOKENS, TokenEstimator};
use vilvona_store::{ItemContent, StoredSummary};
use vilvona_summarize::{format_utc_rfc3339, source_item};

/// The recall tools' names.
pub const GREP_TOOL: &str = "vilvona_grep";
/// The tool that describes a summary, message or stored file.
pub const DESCRIBE_TOOL: &str = "vilvona_describe";
/// The tool that reads what a summary covers.
pub const EXPAND_TOOL: &str = "vilvona_expand";
/// The tool that answers a question from the history.
pub const EXPAND_QUERY_TOOL: &str = "vilvona_expand_query";

/// Guidance added to the system prompt when the host offers the recall tools. Static, so the
/// prompt prefix stays cacheable.
pub const RECALL_GUIDANCE: &str = "Older parts of this conversation appear as <summary> blocks. \
Nothing was deleted: before answering from memory about earlier work, search the full history \
with vilvona_grep, inspect a summary or stored file with vilvona_describe, read what a \
summary covers with vilvona_expand, or ask vilvona_expand_query a question about it.";

/// The fields a summary wrapper shows, available before and after publication.
pub(crate) struct SummaryHeader<'a> {
    pub(crate) summary_id: &'a str,
    pub(crate) depth: u32,
    pub(crate) kind: SummaryKind,
    pub(crate) earliest_ms: Option<i64>,
    pub(crate) latest_ms: Option<i64>,
    pub(crate) first_seq: u64,
    pub(crate) last_seq: u64,
}

impl<'a> From<&'a StoredSummary> for SummaryHeader<'a> {
    fn from(summary: &'a StoredSummary) -> SummaryHeader<'a> {
        SummaryHeader {
            summary_id: &summary.summary_id,
            depth: summary.depth,
            kind: summary.kind,
            earliest_ms: summary.earliest_at_ms,
            latest_ms: summary.latest_at_ms,
            first_seq: summary.first_seq,
            last_seq: summary.last_seq,
        }
    }
}

/// The text of a summary as the model sees it.
pub(crate) fn summary_text(header: &SummaryHeader<'_>, content: &str) -> String {
    let kind = match header.kind {
        SummaryKind::Leaf => "leaf",
        SummaryKind::Condensed => "condensed",
    };
    let time = |ms: Option<i64>| ms.map(format_utc_rfc3339).unwrap_or_default();
    format!(
        "<summary id=\"{}\" depth=\"{}\" kind=\"{kind}\" earliest=\"{}\" latest=\"{}\" messages=\"{}-{}\">\n{}\n</summary>\n(Earlier conversation, summarized. Call {EXPAND_TOOL} with id \"{}\" for what it covers.)",
        header.summary_id,
        header.depth,
        time(header.earliest_ms),
        time(header.latest_ms),
        header.first_seq,
        header.last_seq,
        content.trim(),
        header.summary_id,
    )
}

/// A summary as a user-role message.
pub(crate) fn summary_message(summary: &StoredSummary) -> AgentMessage {
    AgentMessage::user_text(summary_text(&summary.into(), &summary.content))
}

/// The depth a rendered summary message states in its header.
pub(crate) fn summary_depth(message: &AgentMessage) -> Option<u32> {
    let AgentMessage::User(user) = message else {
        return None;
    };
    let text = match &user.content {
        vilvona_core::message::MessageContent::Text(text) => text.as_str(),
        _ => return None,
    };
    // The header alone: the body is never scanned.
    let header = text.strip_prefix("<summary ")?.split_once('>')?.0;
    let (_, depth) = header.split_once("depth=\"")?;
    depth.split_once('"')?.0.parse().ok()
}

/// How a recall block (`crate::recall`) begins: how a host's history that holds one back is
/// told from the host's own.
pub(crate) const RECALL_BLOCK_OPENING: &str = "<recall note=";

/// Whether a message is one this engine rendered into an assembled context (a summary, or a
/// recall block), not one of the host's: a host that hands the engine its own assembled
/// context back as history (OpenClaw's calls inside a turn's tool loop) is not bringing turns.
pub(crate) fn is_engine_rendering(message: &AgentMessage) -> bool {
    let AgentMessage::User(user) = message else {
        return false;
    };
    let text = match &user.content {
        vilvona_core::message::MessageContent::Text(text) => text.as_str(),
        vilvona_core::message::MessageContent::Blocks(blocks) => match blocks.first() {
            Some(vilvona_core::message::ContentBlock::Text(text)) => text.text.as_str(),
            _ => return false,
        },
    };
    text.starts_with("<summary id=\"sum_") || text.starts_with(RECALL_BLOCK_OPENING)
}

/// What a rendered summary costs in the context.
pub(crate) fn summary_tokens(
    estimator: &dyn TokenEstimator,
    header: &SummaryHeader<'_>,
    content: &str,
) -> u64 {
    estimator.text_tokens(&summary_text(header, content)) + MESSAGE_OVERHEAD_TOKENS
}

/// A deterministic description of large content: kind, size, and what it is made of.
pub(crate) fn describe_content(text: &str) -> (String, String) {
    let lines: Vec<&str> = text.lines().collect();
    let size = format!("{} characters, {} lines", text.len(), lines.len());
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(text) {
        let keys: Vec<&str> = fields.keys().take(12).map(String::as_str).collect();
        return (
            "json".to_owned(),
            format!("JSON object ({size}); top-level keys: {}", keys.join(", ")),
        );
    }
    let symbols: Vec<String> = lines
        .iter()
        .filter_map(|line| {
            let trimmed = line.trim_start();
            let indented = line.len() != trimmed.len();
            if indented {
                return None;
            }
            [
                "pub fn ",
                "fn ",
                "pub struct ",
                "struct ",
                "pub enum ",
                "enum ",
                "impl ",
                "def ",
                "class ",
                "function ",
                "export function ",
            ]
            .iter()
            .find_map(|prefix| trimmed.strip_prefix(prefix))
            .map(|rest| {
                rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .filter(|name| !name.is_empty())
        })
        .take(12)
        .collect();
    if !symbols.is_empty() {
        return (
            "code".to_owned(),
            format!("code ({size}); top-level symbols: {}", symbols.join(", ")),
        );
    }
    let errors: Vec<String> = lines
        .iter()
        .filter(|line| {
            let lower = line.to_lowercase();
            lower.contains("error") || lower.contains("failed") || lower.contains("panicked")
        })
        .take(5)
        .map(|line| line.trim().chars().take(160).collect())
        .collect();
    if !errors.is_empty() {
        return (
            "log".to_owned(),
            format!("log ({size}); error lines: {}", errors.join(" | ")),
        );
    }
    let first: String = lines
        .first()
        .map(|line| line.trim().chars().take(160).collect())
        .unwrap_or_default();
    ("text".to_owned(), format!("text ({size}); begins: {first}"))
}

/// The reference that stands in the context for stored large content.
pub(crate) fn large_content_reference(blob_id: &str, description: &str) -> String {
    format!(
        "[Large content stored as {blob_id}: {description}. Read it with {DESCRIBE_TOOL} {{\"id\": \"{blob_id}\", \"lines\": \"1-200\"}}.]"
    )
}

/// A context item as a summarizer reads it (a message that no longer parses: its role, no text).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_summary_states_its_depth_in_its_header_only() {
        let header = SummaryHeader {
            summary_id: "sum_1",
            depth: 3,
            kind: SummaryKind::Condensed,
            earliest_ms: Some(0),
            latest_ms: Some(1),
            first_seq: 1,
            last_seq: 9,
        };
        let rendered = AgentMessage::user_text(summary_text(&header, "it quoted depth=\"7\" once"));
        assert_eq!(summary_depth(&rendered), Some(3));
        assert_eq!(summary_depth(&AgentMessage::user_text("depth=\"2\"")), None);
    }
}
