//! Snippets: where a hit's words are in its text, and the excerpt around the densest of them.
//!
//! A text or phrase search marks the query's words the way the index matched them: an alphanumeric
//! word where the text has a word of the same term (case and English inflection aside), a CJK run
//! wherever the text holds it. The words are compared while the text is scanned, so a search
//! compiles nothing per query. A regex search marks the regex's own matches.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use regex::Regex;

use crate::tokenize::floor_boundary;
use crate::tokenize::{Run, Runs, Word, term_screen, word_term};

/// Characters of context before the first match in a snippet.
const SNIPPET_LEAD: usize = 60;
/// Longest snippet, in bytes of source text.
const SNIPPET_BYTES: usize = 220;

/// English words that carry no evidence: a snippet marks them only when a query has nothing
/// else (`«the» ticket «for» «the» billing` read as noise).
const UNMARKED_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "has",
    "have", "how", "in", "is", "it", "its", "of", "on", "or", "that", "the", "this", "to", "was",
    "were", "what", "when", "where", "which", "who", "with",
];

/// The words of a text or phrase query, ready to be found in a text.
#[derive(Debug, Default)]
pub(crate) struct QueryWords {
    /// Alphanumeric words, as the index's terms (lowercased, stemmed).
    alphanumeric: Vec<String>,
    /// The ASCII terms' screens (`term_screen`), each once (never empty: a term is a word's).
    screens: Vec<String>,
    /// CJK runs as written (CJK has no case).
    cjk: Vec<String>,
    /// Whether a word, lowercased, is one of the query's: the hits of a search share most of
    /// their words, and making a word's term (stemming it) is most of a snippet's work.
    seen: Mutex<HashMap<String, bool>>,
}

impl QueryWords {
    pub(crate) fn new(text: &str, words: &[Word]) -> QueryWords {
        let mut found = QueryWords::default();
        for word in words {
            let written = &text[word.start..word.end];
            if word.cjk {
                if !found.cjk.iter().any(|held| held == written) {
                    found.cjk.push(written.to_owned());
                }
            } else if !UNMARKED_WORDS.contains(&written.to_lowercase().as_str()) {
                let term = word_term(written);
                if !found.alphanumeric.contains(&term) {
                    found.alphanumeric.push(term);
                }
            }
        }
        // A query of nothing but words that carry no evidence marks them all.
        if found.is_empty() {
            for word in words.iter().filter(|word| !word.cjk) {
                let term = word_term(&text[word.start..word.end]);
                if !found.alphanumeric.contains(&term) {
                    found.alphanumeric.push(term);
                }
            }
        }
        for term in found.alphanumeric.iter().filter(|term| term.is_ascii()) {
            let screen = term_screen(term);
            if !found.screens.iter().any(|held| held == screen) {
                found.screens.push(screen.to_owned());
            }
        }
        found
    }

    fn is_empty(&self) -> bool {
        self.alphanumeric.is_empty() && self.cjk.is_empty()
    }

    /// Whether `written` (a whole alphanumeric word of a text) is one of the query's words.
    fn holds_word(&self, written: &str) -> bool {
        // Most words of a text hold no query term's screen (or, not ASCII, share no first
        // letter with a query word): they are passed without making their term.
        let screened = if written.is_ascii() {
            self.screens
                .iter()
                .any(|screen| holds_ignoring_case(written, screen))
        } else {
            let first = |word: &str| word.chars().next().map(|c| c.to_lowercase().next());
            let initial = first(written);
            self.alphanumeric
                .iter()
                .any(|wanted| first(wanted) == initial)
        };
        screened && self.is_term_of(&written.to_lowercase())
    }

    /// Whether the word `lower` (lowercased) has one of the query's terms.
    fn is_term_of(&self, lower: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = seen.get(lower) {
            return *known;
        }
        let holds = self.alphanumeric.contains(&word_term(lower));
        seen.insert(lower.to_owned(), holds);
        holds
    }

    /// The query's words in an ASCII text, in order: each screen's occurrences found in the
    /// lowercased text (a byte search), and only the runs around them looked at.
    fn in_ascii(&self, text: &str) -> Vec<Range<usize>> {
        let lower = text.to_ascii_lowercase();
        let bytes = lower.as_bytes();
        let mut found: Vec<Range<usize>> = self
            .screens
            .iter()
            .flat_map(|screen| memchr::memmem::find_iter(bytes, screen.as_bytes()))
            .map(|at| Runs::around_ascii(bytes, at))
            .collect();
        found.sort_unstable_by_key(|word| word.start);
        found.dedup();
        found.retain(|word| self.is_term_of(&lower[word.clone()]));
        found
    }
}

/// Whether ASCII `text` holds `part`, ignoring ASCII case.
fn holds_ignoring_case(text: &str, part: &str) -> bool {
    part.is_empty()
        || text
            .as_bytes()
            .windows(part.len())
            .any(|window| window.eq_ignore_ascii_case(part.as_bytes()))
}

/// What a snippet marks in a text.
#[derive(Clone, Copy)]
pub(crate) enum Marks<'a> {
    /// The matches of a user's regex.
    Pattern(&'a Regex),
    /// The words of a text or phrase query.
    Words(&'a QueryWords),
}

impl<'a> Marks<'a> {
    /// The non-empty, non-overlapping ranges of `text` to mark, in order.
    fn find_iter<'t>(self, text: &'t str) -> Box<dyn Iterator<Item = Range<usize>> + 't>
    where
        'a: 't,
    {
        match self {
            Marks::Pattern(regex) => Box::new(
                regex
                    .find_iter(text)
                    .filter(|found| !found.is_empty())
                    .map(|found| found.range()),
            ),
            Marks::Words(words) if words.is_empty() => Box::new(std::iter::empty()),
            // No CJK run of a query is in an ASCII text.
            Marks::Words(words) if text.is_ascii() => Box::new(words.in_ascii(text).into_iter()),
            Marks::Words(words) => Box::new(WordMatches {
                text,
                words,
                runs: Runs::new(text),
                pending: VecDeque::new(),
            }),
        }
    }
}

/// The query's words in a text, found in one pass over its runs.
struct WordMatches<'t> {
    text: &'t str,
    words: &'t QueryWords,
    runs: Runs<'t>,
    /// Matches found in the current CJK run, not yet returned.
    pending: VecDeque<Range<usize>>,
}

impl Iterator for WordMatches<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        loop {
            if let Some(found) = self.pending.pop_front() {
                return Some(found);
            }
            let Run { from, to, cjk } = self.runs.next()?;
            let run = &self.text[from..to];
            if !cjk {
                if self.words.holds_word(run) {
                    return Some(from..to);
                }
                continue;
            }
            // Every occurrence of every query run inside this run; where two overlap, the
            // earlier wins, and at one start the longer.
            let mut found: Vec<Range<usize>> = self
                .words
                .cjk
                .iter()
                .flat_map(|wanted| {
                    run.match_indices(wanted.as_str())
                        .map(move |(at, _)| from + at..from + at + wanted.len())
                })
                .collect();
            found.sort_by_key(|range| (range.start, std::cmp::Reverse(range.end)));
            let mut cursor = from;
            for range in found {
                if range.start >= cursor {
                    cursor = range.end;
                    self.pending.push_back(range);
                }
            }
        }
    }
}

/// Where the excerpt should start: at the match that begins the window holding the most
/// distinct matched words (the earliest such window on ties).
fn best_window_start(text: &str, marks: Marks) -> Option<usize> {
    let matches: Vec<(usize, String)> = marks
        .find_iter(text)
        .map(|found| (found.start, text[found].to_lowercase()))
        .collect();
    let mut best: Option<(usize, usize)> = None;
    for (index, (start, _)) in matches.iter().enumerate() {
        let limit = start + SNIPPET_BYTES - SNIPPET_LEAD;
        let mut distinct: Vec<&str> = Vec::new();
        for (position, term) in &matches[index..] {
            if *position >= limit {
                break;
            }
            if !distinct.contains(&term.as_str()) {
                distinct.push(term);
            }
        }
        if best.is_none_or(|(count, _)| distinct.len() > count) {
            best = Some((distinct.len(), *start));
        }
    }
    best.map(|(_, start)| start)
}

/// An excerpt around the densest cluster of marks, with marks wrapped in `«` `»` and
/// whitespace folded.
pub(crate) fn snippet(text: &str, marks: Marks) -> String {
    excerpt(text, marks, best_window_start(text, marks))
}

/// [`snippet`] when the text holds a mark, else `None`: one pass over the text says both (a
/// check for a match first, then the snippet's own pass, read a long text twice).
pub(crate) fn snippet_of_match(text: &str, marks: Marks) -> Option<String> {
    let found = best_window_start(text, marks)?;
    Some(excerpt(text, marks, Some(found)))
}

/// The excerpt of [`snippet`], its window starting a little before `found` (at the text's
/// start when there is none).
fn excerpt(text: &str, marks: Marks, found: Option<usize>) -> String {
    let start = found.map_or(0, |found| {
        floor_boundary(text, found.saturating_sub(SNIPPET_LEAD))
    });
    let end = floor_boundary(text, start + SNIPPET_BYTES);
    let window = &text[start..end];
    let mut out = String::with_capacity(window.len() + 16);
    if start > 0 {
        out.push('…');
    }
    let mut cursor = 0;
    for found in marks.find_iter(window) {
        // A query word inside an identifier marks the identifier whole, so the snippet shows
        // the value (`«BILLING_V2_KESTREL»`, not `«BILLING»_V2_KESTREL`).
        let found = match marks {
            Marks::Words(_) => identifier_around(window, found),
            Marks::Pattern(_) => found,
        };
        if found.start < cursor {
            continue;
        }
        out.push_str(&window[cursor..found.start]);
        out.push('«');
        out.push_str(&window[found.clone()]);
        out.push('»');
        cursor = found.end;
    }
    out.push_str(&window[cursor..]);
    if end < text.len() {
        out.push('…');
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `c` belongs to a word of an identifier (CJK runs are matched apart).
fn identifier_char(c: char) -> bool {
    (c.is_alphanumeric() || c == '_') && !vilvona_core::tokens::is_cjk(c)
}

/// Punctuation that joins the words of one identifier (`KEY-4471`, `release/2026.12-wren`,
/// `a.b@c:80`) when a word follows it.
fn joins_identifier(c: char) -> bool {
    matches!(c, '-' | '.' | '/' | ':' | '@' | '#')
}

/// The identifier a match of alphanumeric words lies in: the match widened over word
/// characters and joining punctuation that a word character follows.
fn identifier_around(text: &str, found: Range<usize>) -> Range<usize> {
    if !text[found.clone()].chars().all(identifier_char) {
        return found;
    }
    let (mut start, mut end) = (found.start, found.end);
    loop {
        let mut after = text[end..].chars();
        match (after.next(), after.next()) {
            (Some(c), _) if identifier_char(c) => end += c.len_utf8(),
            (Some(join), Some(next)) if joins_identifier(join) && identifier_char(next) => {
                end += join.len_utf8() + next.len_utf8();
            }
            _ => break,
        }
    }
    loop {
        let mut before = text[..start].chars().rev();
        match (before.next(), before.next()) {
            (Some(c), _) if identifier_char(c) => start -= c.len_utf8(),
            (Some(join), Some(prev)) if joins_identifier(join) && identifier_char(prev) => {
                start -= join.len_utf8() + prev.len_utf8();
            }
            _ => break,
        }
    }
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::words;
    use proptest::prelude::*;

    fn marked(query: &str, text: &str) -> Vec<String> {
        let query_words = QueryWords::new(query, &words(query));
        Marks::Words(&query_words)
            .find_iter(text)
            .map(|found| text[found].to_owned())
            .collect()
    }

    #[test]
    fn query_words_are_marked_as_the_index_matched_them() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("key", "The KEY-4471 and a keyring", &["KEY"]),
            ("Ünïcode école", "ÜNÏCODE à l'École", &["ÜNÏCODE", "École"]),
            ("告警阈值", "我们把告警阈值改成了", &["告警阈值"]),
            ("임계값", "경고 임계값을 85", &["임계값"]),
            ("警", "告警阈值 警", &["警", "警"]),
            ("告警 告警阈值", "把告警阈值改", &["告警阈值"]),
            ("ops v2告警", "v2告警 OPS-17", &["v2", "告警", "OPS"]),
            ("absent", "nothing here", &[]),
            // A stem that differs from its words in their last letters, any case.
            (
                "sky dying happy",
                "SKIES, Dying and HAPPIER",
                &["SKIES", "Dying"],
            ),
            ("happiness", "Happy happiness", &["Happy", "happiness"]),
            // Words that carry no evidence are not marked beside words that do …
            (
                "the ticket for the billing export",
                "the ticket for the billing export job is",
                &["ticket", "billing", "export"],
            ),
            // … but are when the query has nothing else.
            ("to be", "to be or not", &["to", "be"]),
        ];
        for (query, text, expected) in cases {
            assert_eq!(marked(query, text), *expected, "{query:?} in {text:?}");
        }
    }

    #[test]
    fn a_word_inside_an_identifier_marks_the_identifier_whole() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "billing flag",
                "the billing flag is BILLING_V2_KESTREL.",
                "the «billing» «flag» is «BILLING_V2_KESTREL».",
            ),
            (
                "key",
                "The KEY-4471 and a keyring",
                "The «KEY-4471» and a keyring",
            ),
            (
                "release",
                "branch release/2026.12-wren, cut today",
                "branch «release/2026.12-wren», cut today",
            ),
            ("port", "port: 6543", "«port»: 6543"),
            ("告警", "把告警阈值改", "把«告警»阈值改"),
        ];
        for (query, text, expected) in cases {
            let query_words = QueryWords::new(query, &words(query));
            assert_eq!(
                snippet(text, Marks::Words(&query_words)),
                *expected,
                "{query:?}"
            );
        }
    }

    #[test]
    fn the_snippet_centres_on_the_densest_matches() {
        let text = format!(
            "{} index migration retry. {} Please remember: the ticket for the cold storage migration is OPS-68787.",
            "word ".repeat(10),
            "filler ".repeat(80)
        );
        let query = "cold storage migration";
        let query_words = QueryWords::new(query, &words(query));
        let snippet = snippet(&text, Marks::Words(&query_words));
        assert!(
            snippet.contains("«cold» «storage» «migration» is OPS-68787."),
            "{snippet}"
        );
    }

    /// Words and pieces of words that share screens and stems (`happ`, `sky`/`skies`), short
    /// terms (a one-letter screen), digits, and the punctuation between words.
    const PIECES: &[&str] = &[
        "happy",
        "HAPPIER",
        "happiness",
        "sky",
        "Skies",
        "go",
        "g",
        "to",
        "be",
        "key",
        "KEY",
        "keyring",
        "4471",
        "v2",
        "billing",
        "Bill",
        "_",
        "-",
        "/",
        " ",
        ", ",
        ".",
        "\n",
        "a",
    ];

    proptest! {
        /// The ASCII path (a byte search for each screen) marks what the run-by-run path marks.
        #[test]
        fn an_ascii_text_is_marked_as_run_by_run(
            query in proptest::collection::vec(0..PIECES.len(), 1..4),
            text in proptest::collection::vec(0..PIECES.len(), 0..40),
        ) {
            let query: String = query.iter().map(|at| PIECES[*at]).collect::<Vec<_>>().join(" ");
            let text: String = text.iter().map(|at| PIECES[*at]).collect();
            let query_words = QueryWords::new(&query, &words(&query));
            let run_by_run: Vec<Range<usize>> = WordMatches {
                text: &text,
                words: &query_words,
                runs: Runs::new(&text),
                pending: VecDeque::new(),
            }
            .collect();
            prop_assert_eq!(query_words.in_ascii(&text), run_by_run, "{:?} in {:?}", query, text);
        }
    }
}
