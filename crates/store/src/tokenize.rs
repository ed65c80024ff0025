//! How the recall index splits text into terms, in every script.
//!
//! Words of alphabetic scripts and numbers are split on anything that is not alphanumeric, as
//! before. Chinese, Japanese and Korean do not put spaces between words (Korean puts them
//! between phrases, with particles attached), so a run of CJK characters becomes overlapping
//! bigrams — `告警阈值` is `告警 警阈 阈值` at consecutive positions — and a query's run is a
//! phrase of its bigrams. A lone CJK character is a term of its own. Terms are lowercased;
//! terms longer than [`MAX_TERM_BYTES`] are dropped (hashes, base64). A word of ASCII letters
//! only is indexed by its English stem (Snowball: `painted`, `painting`, `paints` → `paint`), so
//! a question finds the message that words the same thing in another form; a word holding a
//! digit or any other character (an identifier, a version, a word of another script) is kept
//! whole. On the natural-question set stemming added 3.5 points of recall@10 to a plain BM25
//! (the `locomo` bench).
//!
//! Bigrams were chosen over single characters (index the same size within a few per cent on
//! CJK text, but a query of two characters matches every text holding both anywhere) and over
//! a dictionary segmenter (tens of megabytes of dictionary in the binary, and a query segmented
//! differently from the text is not found).

use tantivy::tokenizer::{Token, TokenStream, Tokenizer};
use vilvona_core::tokens::is_cjk;

/// The name the index's text field is registered with (a new name for each change of the
/// terms: an index written with other terms is rebuilt, see `RecallIndex::open`).
pub(crate) const TOKENIZER: &str = "vilvona-stemmed";

/// Longer terms are not indexed.
pub(crate) const MAX_TERM_BYTES: usize = 40;

/// A word of a text: an alphanumeric word, or a run of CJK characters with its terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Word {
    /// The word as written (byte range of the source text).
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Its terms, lowercased: one for an alphabetic word, the bigrams of a CJK run.
    pub(crate) terms: Vec<String>,
    pub(crate) cjk: bool,
}

/// One term of a text, as the index holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TermAt {
    /// The source bytes it covers: a whole alphabetic word, or a bigram's two characters.
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// Lowercased.
    pub(crate) text: String,
    /// Which word of the text it belongs to (the bigrams of one CJK run share it).
    pub(crate) word: usize,
    pub(crate) cjk: bool,
}

/// A stretch of text the index splits on: an alphanumeric word (of a script that spaces its
/// words), or a run of CJK characters. Byte offsets into the source text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) cjk: bool,
}

/// The runs of a text, in order: the one place where the index's word boundaries are drawn
/// (the terms come from them, and so does where a snippet marks a query's words).
pub(crate) struct Runs<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Runs<'a> {
    pub(crate) fn new(text: &'a str) -> Runs<'a> {
        Runs { text, at: 0 }
    }

    /// The run holding byte `at` of an ASCII text (`at` on a letter or digit), drawn from
    /// there without walking the text from its start: in ASCII the alphanumeric characters
    /// are the ASCII letters and digits, and there is no CJK. A snippet's byte search uses it
    /// (`highlight`, whose property test holds it to `Runs`).
    pub(crate) fn around_ascii(text: &[u8], at: usize) -> std::ops::Range<usize> {
        let from = text[..at]
            .iter()
            .rposition(|byte| !byte.is_ascii_alphanumeric())
            .map_or(0, |before| before + 1);
        let to = text[at..]
            .iter()
            .position(|byte| !byte.is_ascii_alphanumeric())
            .map_or(text.len(), |after| at + after);
        from..to
    }
}

impl Iterator for Runs<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        let rest = &self.text[self.at..];
        let (offset, first) = rest
            .char_indices()
            .find(|(_, c)| c.is_alphanumeric() || is_cjk(*c))?;
        let cjk = is_cjk(first);
        let from = self.at + offset;
        let to = rest[offset..]
            .char_indices()
            .find(|(_, c)| {
                if cjk {
                    !is_cjk(*c)
                } else {
                    !c.is_alphanumeric() || is_cjk(*c)
                }
            })
            .map_or(self.text.len(), |(length, _)| from + length);
        self.at = to;
        Some(Run { from, to, cjk })
    }
}

/// The terms of a text, produced lazily (a 50 MB tool output is never held as terms at once).
pub(crate) struct Terms<'a> {
    text: &'a str,
    runs: Runs<'a>,
    /// Inside a CJK run of several characters: the characters still to pair (offsets relative
    /// to the run), the run's start, and the last character paired.
    bigrams: Option<(std::str::CharIndices<'a>, usize, (usize, char))>,
    word: usize,
}

impl<'a> Terms<'a> {
    pub(crate) fn new(text: &'a str) -> Terms<'a> {
        Terms {
            text,
            runs: Runs::new(text),
            bigrams: None,
            word: 0,
        }
    }

    /// A run that is one term, the whole of the next word.
    fn whole(&mut self, run: &Run, text: String) -> TermAt {
        let word = self.word;
        self.word += 1;
        TermAt {
            from: run.from,
            to: run.to,
            text,
            word,
            cjk: run.cjk,
        }
    }
}

impl Iterator for Terms<'_> {
    type Item = TermAt;

    fn next(&mut self) -> Option<TermAt> {
        loop {
            if let Some((chars, start, last)) = &mut self.bigrams {
                match chars.next() {
                    Some((at, c)) => {
                        let (from, previous) = *last;
                        *last = (*start + at, c);
                        return Some(TermAt {
                            from,
                            to: *start + at + c.len_utf8(),
                            text: [previous, c].iter().collect(),
                            word: self.word,
                            cjk: true,
                        });
                    }
                    None => {
                        self.bigrams = None;
                        self.word += 1;
                        continue;
                    }
                }
            }
            let run = self.runs.next()?;
            let written = &self.text[run.from..run.to];
            if run.cjk {
                let mut chars = written.char_indices();
                let (_, first) = chars.next()?;
                if written.len() == first.len_utf8() {
                    // A lone CJK character is a term of its own.
                    return Some(self.whole(&run, first.to_string()));
                }
                self.bigrams = Some((chars, run.from, (run.from, first)));
            } else if written.len() <= MAX_TERM_BYTES {
                return Some(self.whole(&run, word_term(written)));
            }
        }
    }
}

/// The term the index holds for a word of an alphabetic script (as written): lowercased, and
/// a word of ASCII letters only stemmed.
pub(crate) fn word_term(written: &str) -> String {
    static ENGLISH: std::sync::OnceLock<rust_stemmers::Stemmer> = std::sync::OnceLock::new();
    let lower = written.to_lowercase();
    if !lower.bytes().all(|byte| byte.is_ascii_lowercase()) {
        return lower;
    }
    ENGLISH
        .get_or_init(|| rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English))
        .stem(&lower)
        .into_owned()
}

/// A part of a term that every word with that term holds, lowercased, for screening raw text
/// (a stem may differ from its words in its last two letters: `happi` of `happy`, `sky` of
/// `skies`).
pub(crate) fn term_screen(term: &str) -> &str {
    if term.is_ascii() && term.len() > 2 {
        &term[..term.len() - 2]
    } else if term.is_ascii() {
        &term[..1.min(term.len())]
    } else {
        term
    }
}

/// The words of `text`, in order, with the terms the index holds for each (words whose only
/// term is too long are left out).
pub(crate) fn words(text: &str) -> Vec<Word> {
    let mut words: Vec<(usize, Word)> = Vec::new();
    for term in Terms::new(text) {
        match words.last_mut() {
            Some((index, word)) if *index == term.word => {
                word.end = term.to;
                word.terms.push(term.text);
            }
            _ => words.push((
                term.word,
                Word {
                    start: term.from,
                    end: term.to,
                    terms: vec![term.text],
                    cjk: term.cjk,
                },
            )),
        }
    }
    words.into_iter().map(|(_, word)| word).collect()
}

/// Every term of `text`, in order (what the index holds for it, position by position).
#[cfg(test)]
pub(crate) fn terms(text: &str) -> Vec<String> {
    Terms::new(text).map(|term| term.text).collect()
}

/// The tokenizer registered with the index: the terms of [`Terms`], at consecutive positions.
#[derive(Clone, Default)]
pub(crate) struct RecallTokenizer {
    token: Token,
}

pub(crate) struct RecallTokenStream<'a> {
    terms: Terms<'a>,
    token: &'a mut Token,
}

impl Tokenizer for RecallTokenizer {
    type TokenStream<'a> = RecallTokenStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> RecallTokenStream<'a> {
        self.token.reset();
        RecallTokenStream {
            terms: Terms::new(text),
            token: &mut self.token,
        }
    }
}

impl TokenStream for RecallTokenStream<'_> {
    fn advance(&mut self) -> bool {
        let Some(term) = self.terms.next() else {
            return false;
        };
        self.token.position = self.token.position.wrapping_add(1);
        self.token.offset_from = term.from;
        self.token.offset_to = term.to;
        self.token.text = term.text;
        true
    }

    fn token(&self) -> &Token {
        self.token
    }

    fn token_mut(&mut self) -> &mut Token {
        self.token
    }
}

/// The largest char boundary of `text` at or below `index` (a cut there leaves valid UTF-8).
pub(crate) fn floor_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_by_script() {
        let cases: &[(&str, &[&str])] = &[
            (
                "Hello, happy tax payer!",
                &["hello", "happi", "tax", "payer"],
            ),
            // English inflections share a term; a word with a digit, or of another script, is
            // kept as written.
            (
                "She painted; painting paints. Skies v2s naïve",
                &["she", "paint", "paint", "paint", "sky", "v2s", "naïve"],
            ),
            (
                "我们把告警阈值改成了",
                &[
                    "我们", "们把", "把告", "告警", "警阈", "阈值", "值改", "改成", "成了",
                ],
            ),
            ("v2告警 OPS-17", &["v2", "告警", "op", "17"]),
            ("警", &["警"]),
            (
                "しきい値を変更",
                &["しき", "きい", "い値", "値を", "を変", "変更"],
            ),
            ("경고 임계값을", &["경고", "임계", "계값", "값을"]),
            ("Ünïcode ÉCOLE", &["ünïcode", "école"]),
            (&"x".repeat(41), &[]),
        ];
        for (text, expected) in cases {
            assert_eq!(terms(text), *expected, "{text}");
        }
    }

    #[test]
    fn a_terms_screen_is_held_by_every_word_of_that_term() {
        for word in [
            "happy",
            "happiness",
            "skies",
            "sky",
            "dying",
            "lying",
            "early",
            "gently",
            "paints",
            "generously",
            "ran",
            "a",
            "at",
            "ops",
        ] {
            let term = word_term(word);
            assert!(
                word.contains(term_screen(&term)),
                "{word}: term {term}, screen {}",
                term_screen(&term)
            );
        }
    }

    #[test]
    fn bigrams_take_consecutive_positions_and_their_characters_offsets() {
        let mut tokenizer = RecallTokenizer::default();
        let text = "at 告警阈值";
        let mut stream = tokenizer.token_stream(text);
        let mut seen = Vec::new();
        while stream.advance() {
            let token = stream.token();
            seen.push((
                token.position,
                text[token.offset_from..token.offset_to].to_owned(),
                token.text.clone(),
            ));
        }
        assert_eq!(
            seen,
            [
                (0, "at".to_owned(), "at".to_owned()),
                (1, "告警".to_owned(), "告警".to_owned()),
                (2, "警阈".to_owned(), "警阈".to_owned()),
                (3, "阈值".to_owned(), "阈值".to_owned()),
            ]
        );
    }
}
