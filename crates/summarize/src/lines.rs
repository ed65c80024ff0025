//! What the extractive summarizer, its answers and a model summarizer's excerpts read text by:
//! the sentences of a line and the mark of a pinned fact.

/// What the extractive summarizer signs its summaries and answers with.
pub(crate) const EXTRACTIVE_ID: &str = "extractive/v1";

/// The prefix of a pinned fact's line. A condensed summary carries its children's pinned lines
/// up (within a share of its target), so a fact stated once survives every level.
pub const PINNED_PREFIX: &str = "Pinned:";

/// Splits a line after `.`, `!` or `?` followed by whitespace.
pub(crate) fn sentences(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = line.as_bytes();
    for (index, byte) in bytes.iter().enumerate() {
        let ends = matches!(byte, b'.' | b'!' | b'?');
        let next_is_space = bytes
            .get(index + 1)
            .is_some_and(|next| next.is_ascii_whitespace());
        if ends && next_is_space {
            let sentence = line[start..=index].trim();
            if !sentence.is_empty() {
                out.push(sentence);
            }
            start = index + 1;
        }
    }
    let rest = line[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}
