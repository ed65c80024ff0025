//! Session pruning: trims old tool results in the prompt sent to the model, never in the
//! transcript (OpenClaw's `contextPruning`, mode `cache-ttl`).

use vilvona_core::message::{AgentMessage, ContentBlock, MessageContent};

use crate::config::{PruningConfig, PruningMode};

/// What pruning did to one prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub soft_trimmed: usize,
    pub hard_cleared: usize,
    pub chars_removed: usize,
}

fn text_chars(message: &AgentMessage) -> usize {
    message.content().map_or(0, |content| match content {
        MessageContent::Text(text) => text.len(),
        MessageContent::Blocks(blocks) => blocks
            .iter()
            .map(|block| match block {
                ContentBlock::Text(text) => text.text.len(),
                _ => 0,
            })
            .sum(),
    })
}

fn has_image(message: &AgentMessage) -> bool {
    message.content().is_some_and(|content| {
        content
            .blocks()
            .iter()
            .any(|block| matches!(block, ContentBlock::Image(_)))
    })
}

/// Trims tool results in `messages` (the prompt copy) when the prompt is large for the window:
/// at `soft_trim_ratio` results over `soft_trim_max_chars` keep their head and tail; at
/// `hard_clear_ratio`, once enough prunable text exists, the oldest are replaced by a
/// placeholder. Results after the last `keep_last_assistants` assistant messages, results
/// before the first user message, and results with images are never touched.
pub fn prune_tool_results(
    messages: &mut [AgentMessage],
    config: &PruningConfig,
    window_tokens: u64,
) -> PruneReport {
    let mut report = PruneReport::default();
    if config.mode == PruningMode::Off || window_tokens == 0 {
        return report;
    }
    let assistants: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, message)| matches!(message, AgentMessage::Assistant(_)))
        .map(|(index, _)| index)
        .collect();
    if assistants.len() <= config.keep_last_assistants {
        return report;
    }
    let protected_from = assistants[assistants.len() - config.keep_last_assistants.max(1)];
    let Some(first_user) = messages
        .iter()
        .position(|message| matches!(message, AgentMessage::User(_)))
    else {
        return report;
    };
    let eligible: Vec<usize> = (first_user..protected_from)
        .filter(|&index| {
            matches!(messages[index], AgentMessage::ToolResult(_)) && !has_image(&messages[index])
        })
        .collect();
    let total_chars: usize = messages.iter().map(text_chars).sum();
    let window_chars = (window_tokens as f64) * 4.0;
    let ratio = total_chars as f64 / window_chars;
    if ratio < config.soft_trim_ratio {
        return report;
    }
    let prunable: usize = eligible
        .iter()
        .map(|&index| text_chars(&messages[index]))
        .sum();
    if ratio >= config.hard_clear_ratio && prunable >= config.min_prunable_tool_chars {
        let mut remaining = total_chars;
        for &index in &eligible {
            if (remaining as f64) / window_chars < config.hard_clear_ratio {
                break;
            }
            let before = text_chars(&messages[index]);
            replace_text(&mut messages[index], config.hard_clear_placeholder.clone());
            let removed = before.saturating_sub(config.hard_clear_placeholder.len());
            remaining -= removed.min(remaining);
            report.hard_cleared += 1;
            report.chars_removed += removed;
        }
        return report;
    }
    for &index in &eligible {
        let chars = text_chars(&messages[index]);
        if chars <= config.soft_trim_max_chars {
            continue;
        }
        let text = messages[index].plain_text();
        let head: String = text.chars().take(config.soft_trim_head_chars).collect();
        let tail: String = {
            let count = text.chars().count();
            text.chars()
                .skip(count.saturating_sub(config.soft_trim_tail_chars))
                .collect()
        };
        let trimmed = format!("{head}\n...\n{tail}\n[tool result trimmed from {chars} characters]");
        report.chars_removed += chars.saturating_sub(trimmed.len());
        replace_text(&mut messages[index], trimmed);
        report.soft_trimmed += 1;
    }
    report
}

fn replace_text(message: &mut AgentMessage, text: String) {
    if let AgentMessage::ToolResult(result) = message {
        result.content = MessageContent::Blocks(vec![ContentBlock::text(text)]);
    }
}
