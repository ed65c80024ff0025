//! Token estimation.
//!
//! Engines budget in tokens. The [`TokenEstimator`] trait lets a host or engine choose between
//! this fast heuristic and a real tokenizer (provided elsewhere); counts are meant to be computed
//! once per message, when it is stored, not on every assembly.

use serde_json::Value;

use crate::message::{AgentMessage, ContentBlock, MessageContent};

/// Counts tokens of text and messages.
pub trait TokenEstimator: Send + Sync + std::fmt::Debug {
    /// Tokens in a piece of text.
    fn text_tokens(&self, text: &str) -> u64;

    /// Tokens a message costs in a prompt: its text, tool-call JSON, images, and a small
    /// per-message framing overhead.
    fn message_tokens(&self, message: &AgentMessage) -> u64 {
        let mut tokens = MESSAGE_OVERHEAD_TOKENS;
        match message.content() {
            Some(MessageContent::Text(text)) => tokens += self.text_tokens(text),
            Some(MessageContent::Blocks(blocks)) => {
                for block in blocks {
                    tokens += self.block_tokens(block);
                }
            }
            None => {
                // A role the typed view does not cover: count its whole JSON.
                if let AgentMessage::Other(other) = message {
                    tokens += self.text_tokens(&Value::Object(other.fields.clone()).to_string());
                }
            }
        }
        tokens
    }

    /// Tokens of one content block.
    fn block_tokens(&self, block: &ContentBlock) -> u64 {
        match block {
            ContentBlock::Text(b) => self.text_tokens(&b.text),
            ContentBlock::Thinking(b) => self.text_tokens(&b.thinking),
            ContentBlock::ToolCall(b) => {
                self.text_tokens(&b.name) + self.text_tokens(&b.arguments.to_string())
            }
            ContentBlock::Image(_) => IMAGE_TOKENS,
            ContentBlock::Other(fields) => match fields.get("text") {
                Some(Value::String(text)) => self.text_tokens(text),
                _ => self.text_tokens(&Value::Object(fields.clone()).to_string()),
            },
        }
    }
}

/// What one image costs, whatever its size (providers downscale; this is their typical charge).
pub const IMAGE_TOKENS: u64 = 2_000;

/// Role markers and separators the provider adds around each message.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// Whether a character is Chinese, Japanese or Korean script (Han with its extensions and
/// compatibility ideographs, kana, Hangul): scripts written without spaces between words, so
/// recall splits their runs into bigrams and questions match them by bigram.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF     // Hiragana, Katakana
        | 0x31F0..=0x31FF   // Katakana phonetic extensions
        | 0x3400..=0x4DBF   // CJK extension A
        | 0x4E00..=0x9FFF   // CJK unified ideographs
        | 0xAC00..=0xD7AF   // Hangul syllables
        | 0x1100..=0x11FF   // Hangul jamo
        | 0x3130..=0x318F   // Hangul compatibility jamo
        | 0xF900..=0xFAFF   // CJK compatibility ideographs
        | 0xFF66..=0xFF9F   // half-width Katakana
        | 0x20000..=0x2FA1F // CJK extensions B–F, compatibility supplement
    )
}

/// ≈4 characters per token for Latin text, one token per CJK character, two per emoji or other
/// astral-plane character. Rounds up: a non-empty text is at least one token.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeuristicEstimator;

impl TokenEstimator for HeuristicEstimator {
    fn text_tokens(&self, text: &str) -> u64 {
        // Quarter tokens, so the common ASCII path stays in integers.
        let mut quarters: u64 = 0;
        for ch in text.chars() {
            quarters += match ch as u32 {
                0..=0x2FFF => 1,
                // CJK symbols, kana, CJK ideographs, Hangul, compatibility forms.
                0x3000..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF => 4,
                0x10000.. => 8,
                _ => 1,
            };
        }
        quarters.div_ceil(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_weights_scripts() {
        let e = HeuristicEstimator;
        assert_eq!(e.text_tokens(""), 0);
        assert_eq!(e.text_tokens("abcd"), 1);
        assert_eq!(e.text_tokens("abcde"), 2);
        assert_eq!(e.text_tokens("日本語"), 3);
        assert_eq!(e.text_tokens("🙂🙂"), 4);
    }
}
