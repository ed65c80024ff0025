//! What a model summarizer reads of each item it summarizes. The store keeps every message
//! whole and recall (`vilvona_grep`, `vilvona_expand` on the summary) reaches it, so a summary
//! request needs what a summary keeps of a message, not all of it: a long message is read as
//! an excerpt — its head, its tail, the lines or sentences between them that matter, and how
//! much was left out. The prompt then grows with the number of messages, not their length.
//!
//! | item | read whole up to | beyond: head + tail | and between them |
//! |---|---|---|---|
//! | a tool's output | 1,290 characters | 500 + 150 | up to 4 lines reporting a failure |
//! | the user's words | 1,800 | 600 + 200 | up to 5 sentences naming an identifier or a number |
//! | the agent's words | 1,300 | 500 + 200 | up to 3 such sentences |
//! | a summary (condensing) | always whole | | |
//!
//! Lines that start with `Pinned:` are read wherever they are, up to [`PINNED_LINES`] of them
//! of at most [`PINNED_LINE`] characters each (a pasted log of them would otherwise enter the
//! prompt whole).

use std::borrow::Cow;

use vilvona_core::summarize::SourceItem;

use crate::identifiers;
use crate::lines::{PINNED_PREFIX, sentences};

/// The most `Pinned:` lines read from between an excerpt's head and tail.
const PINNED_LINES: usize = 8;

/// Each such line's length at most, in characters (bytes on a character boundary).
const PINNED_LINE: usize = 300;

/// How much of one kind of item a summary request reads, in characters.
struct Budget {
    head: usize,
    tail: usize,
    /// Lines (a tool's output) or sentences (prose) kept from between head and tail.
    picks: usize,
    /// Each pick's length at most.
    pick: usize,
    /// Which lines or sentences between head and tail matter.
    matters: fn(&str) -> bool,
}

impl Budget {
    /// The most an excerpt reads; an item no longer than this is read whole.
    fn whole(&self) -> usize {
        self.head + self.tail + self.picks * self.pick
    }
}

const TOOL_OUTPUT: Budget = Budget {
    head: 500,
    tail: 150,
    picks: 4,
    pick: 160,
    matters: reports_failure,
};
const USER: Budget = Budget {
    head: 600,
    tail: 200,
    picks: 5,
    pick: 200,
    matters: names_something,
};
const AGENT: Budget = Budget {
    head: 500,
    tail: 200,
    picks: 3,
    pick: 200,
    matters: names_something,
};

/// A line of a tool's output that reports a failure.
fn reports_failure(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    ["error", "fail", "panic", "exception", "fatal", "denied"]
        .iter()
        .any(|word| lower.contains(word))
}

/// A sentence that names something a summary keeps: an identifier, a number.
fn names_something(sentence: &str) -> bool {
    sentence.chars().any(|c| c.is_ascii_digit()) || !identifiers(sentence).is_empty()
}

/// The budget of an item by its label; `None` for a summary (what a condensed summary reads
/// is its children's summaries, each already bounded), read whole.
fn budget_of(label: &str) -> Option<&'static Budget> {
    match label {
        label if label.starts_with("toolResult") => Some(&TOOL_OUTPUT),
        "user" => Some(&USER),
        label if label.starts_with("sum_") => None,
        _ => Some(&AGENT),
    }
}

/// The last character boundary of `text` at or before `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The first character boundary of `text` at or after `at`.
fn ceil_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// The lines of a tool's output, or the sentences of prose (each line cut after `.`, `!` or
/// `?`, as the extractive summarizer cuts them).
fn pieces(text: &str, lines_only: bool) -> Vec<&str> {
    match lines_only {
        true => text.lines().collect(),
        false => text.lines().flat_map(sentences).collect(),
    }
}

/// What a summary request reads of `item`: the whole text when it is short or a summary, else
/// an excerpt within its kind's budget (see the module's table).
pub fn prompt_excerpt(item: &SourceItem) -> Cow<'_, str> {
    let text = item.text.as_str();
    let Some(budget) = budget_of(&item.label) else {
        return Cow::Borrowed(text);
    };
    if text.len() <= budget.whole() {
        return Cow::Borrowed(text);
    }
    let head_end = floor_boundary(text, budget.head);
    let tail_start = ceil_boundary(text, text.len() - budget.tail);
    let middle = &text[head_end..tail_start];
    let pinned: Vec<&str> = middle
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with(PINNED_PREFIX))
        .take(PINNED_LINES)
        .map(|line| &line[..floor_boundary(line, PINNED_LINE)])
        .collect();
    let picked: Vec<&str> = pieces(middle, std::ptr::eq(budget, &TOOL_OUTPUT))
        .into_iter()
        .map(str::trim)
        .filter(|piece| {
            !piece.is_empty() && !piece.starts_with(PINNED_PREFIX) && (budget.matters)(piece)
        })
        .take(budget.picks)
        .map(|piece| &piece[..floor_boundary(piece, budget.pick)])
        .collect();
    let kept: usize = pinned.iter().chain(&picked).map(|piece| piece.len()).sum();
    let mut out = String::with_capacity(budget.whole() + kept + 120);
    out.push_str(&text[..head_end]);
    out.push_str(&format!(
        "\n[… {} characters left out here; recall reaches them whole …]\n",
        middle.len().saturating_sub(kept)
    ));
    for piece in pinned.iter().chain(&picked) {
        out.push_str(piece);
        out.push('\n');
    }
    out.push_str(&text[tail_start..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(label: &str, text: String) -> SourceItem {
        SourceItem {
            label: label.to_owned(),
            timestamp_ms: None,
            text,
        }
    }

    #[test]
    fn a_short_item_and_a_summary_are_read_whole() {
        let short = item("user", "deploy the api to staging".to_owned());
        assert_eq!(prompt_excerpt(&short), short.text);
        let summary = item("sum_0123456789abcdef", "word ".repeat(2_000));
        assert_eq!(prompt_excerpt(&summary), summary.text);
    }

    /// The table of the module's comment, row by row: what each kind reads at most.
    #[test]
    fn each_kind_reads_its_budget_and_what_matters_between() {
        let filler = "the lexer trigger gauge schema promise invoice closure parser. ";
        let cases = [
            ("toolResult:read", "line of a file\n".repeat(600), 1_290),
            ("user", filler.repeat(60), 1_800),
            ("assistant", filler.repeat(60), 1_300),
        ];
        for (label, text, most) in cases {
            let source = item(label, text.clone());
            let excerpt = prompt_excerpt(&source);
            assert!(
                excerpt.len() < most + 120,
                "{label}: {} of {}",
                excerpt.len(),
                text.len()
            );
            assert!(excerpt.starts_with(&text[..500]), "{label}: its head");
            assert!(
                excerpt.ends_with(&text[text.len() - 150..]),
                "{label}: its tail"
            );
            assert!(excerpt.contains("characters left out"), "{label}");
        }
        let mut log = "step ok\n".repeat(400);
        log.insert_str(1_600, "error[E0308]: mismatched types in parse_line\n");
        let source = item("toolResult:exec", log);
        let excerpt = prompt_excerpt(&source);
        assert!(excerpt.contains("error[E0308]: mismatched types in parse_line"));
        let mut words = filler.repeat(30);
        words.push_str("The staging database listens on port 6543 now. ");
        words.push_str(&filler.repeat(30));
        words.push_str("\nPinned: the on-call engineer is Oriana Blevins\n");
        words.push_str(&filler.repeat(30));
        let source = item("user", words);
        let excerpt = prompt_excerpt(&source);
        assert!(excerpt.contains("The staging database listens on port 6543 now."));
        assert!(excerpt.contains("Pinned: the on-call engineer is Oriana Blevins"));
    }

    /// A message of many `Pinned:` lines (a pasted log of them, say) is read within a bound,
    /// as any other: before, every such line entered the summarizer's prompt.
    #[test]
    fn pinned_lines_are_read_within_a_bound() {
        let mut words =
            "the lexer trigger gauge schema promise invoice closure parser. ".repeat(30);
        for index in 0..2_000 {
            words.push_str(&format!("\nPinned: fact {index} {}", "x".repeat(500)));
        }
        words.push_str("\nthe tail of the message. the tail of the message. the tail again.");
        let source = item("user", words.clone());
        let excerpt = prompt_excerpt(&source);
        assert!(excerpt.contains("Pinned: fact 0 "), "the first are read");
        assert!(!excerpt.contains("Pinned: fact 8 "), "at most eight");
        assert!(
            excerpt.len() < 1_800 + 8 * 310 + 120,
            "{} of {}",
            excerpt.len(),
            words.len()
        );
    }

    #[test]
    fn an_excerpt_cuts_on_character_boundaries() {
        let text = "é🙂 ".repeat(2_000);
        for label in ["user", "assistant", "toolResult"] {
            let source = item(label, text.clone());
            assert!(prompt_excerpt(&source).len() < text.len(), "{label}");
        }
    }
}
