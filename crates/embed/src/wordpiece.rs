//! BERT's uncased WordPiece tokenization, as the built-in model's vocabulary was made for: the
//! text is cleaned (control characters dropped, whitespace unified), lowercased and stripped of
//! accents, Chinese, Japanese and Korean characters stand alone, punctuation splits words, and
//! each word is cut into the longest vocabulary pieces from its start (`##` marks a piece that
//! continues a word). A word with no such cut, or longer than 100 characters, has no pieces.

use rustc_hash::FxHashMap;

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// Longest word cut into pieces (BERT's `max_input_chars_per_word`).
const MAX_WORD_CHARS: usize = 100;

/// A vocabulary: each token's id.
pub(crate) struct Vocabulary {
    /// Hashed with a fast, not collision-resistant hash: the vocabulary is the model's own,
    /// and lookups are most of the cost of embedding.
    ids: FxHashMap<String, u32>,
    /// Characters of the longest piece (`##` aside): no longer cut is looked up.
    longest: usize,
}

impl Vocabulary {
    pub(crate) fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Vocabulary {
        let ids: FxHashMap<String, u32> = tokens
            .into_iter()
            .enumerate()
            .map(|(id, token)| (token.to_owned(), id as u32))
            .collect();
        let longest = ids
            .keys()
            .map(|token| token.trim_start_matches("##").chars().count())
            .max()
            .unwrap_or(0);
        Vocabulary { ids, longest }
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The ids of the text's pieces, in order (words with no pieces are left out).
    pub(crate) fn pieces(&self, text: &str, mut each: impl FnMut(u32)) {
        let mut word = String::new();
        let mut piece = String::new();
        let mut flush = |word: &mut String| {
            if !word.is_empty() {
                self.word_pieces(word, &mut piece, &mut each);
                word.clear();
            }
        };
        // Decomposing (to drop accents) changes nothing in ASCII text, most of what is stored.
        let chars: Box<dyn Iterator<Item = char>> = if text.is_ascii() {
            Box::new(text.chars())
        } else {
            Box::new(text.nfd())
        };
        for ch in chars {
            if ch == '\0' || ch == '\u{fffd}' || (ch.is_control() && !ch.is_whitespace()) {
                continue;
            }
            if is_combining_mark(ch) {
                continue;
            }
            if ch.is_whitespace() {
                flush(&mut word);
            } else if is_cjk(ch) || is_punctuation(ch) {
                flush(&mut word);
                word.push(ch);
                flush(&mut word);
            } else {
                word.extend(ch.to_lowercase());
            }
        }
        flush(&mut word);
    }

    /// The longest pieces from the start of `word`; none when one part has no piece.
    fn word_pieces(&self, word: &str, piece: &mut String, each: &mut impl FnMut(u32)) {
        // Where each character starts: for an ASCII word (most words), every byte.
        let ascii = word.is_ascii();
        let starts: Vec<usize> = if ascii {
            Vec::new()
        } else {
            word.char_indices().map(|(at, _)| at).collect()
        };
        let chars = if ascii { word.len() } else { starts.len() };
        if chars > MAX_WORD_CHARS {
            return;
        }
        let byte_at = |char_at: usize| match (ascii, starts.get(char_at)) {
            (true, _) => char_at,
            (false, Some(at)) => *at,
            (false, None) => word.len(),
        };
        let mut found: Vec<u32> = Vec::new();
        let mut start = 0;
        while start < chars {
            let mut end = chars.min(start + self.longest);
            let mut matched = None;
            while end > start {
                let candidate = &word[byte_at(start)..byte_at(end)];
                let id = if start == 0 {
                    self.ids.get(candidate)
                } else {
                    piece.clear();
                    piece.push_str("##");
                    piece.push_str(candidate);
                    self.ids.get(piece.as_str())
                };
                if let Some(id) = id {
                    matched = Some(*id);
                    break;
                }
                end -= 1;
            }
            match matched {
                Some(id) => found.push(id),
                None => return,
            }
            start = end;
        }
        for id in found {
            each(id);
        }
    }
}

fn is_cjk(ch: char) -> bool {
    matches!(ch as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// ASCII symbols and Unicode punctuation split words (BERT's `_is_punctuation`).
fn is_punctuation(ch: char) -> bool {
    if ch.is_ascii() {
        return ch.is_ascii_punctuation();
    }
    // General punctuation, CJK symbols and punctuation, full-width forms' punctuation.
    matches!(ch as u32,
        0x2000..=0x206F | 0x3000..=0x303F | 0xFF01..=0xFF0F | 0xFF1A..=0xFF20 | 0xFF3B..=0xFF40
        | 0xFF5B..=0xFF65 | 0x00A1..=0x00BF)
        && !ch.is_alphanumeric()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn pieces(vocabulary: &Vocabulary, text: &str) -> Vec<String> {
        let names: HashMap<u32, &String> = vocabulary.ids.iter().map(|(t, id)| (*id, t)).collect();
        let mut out = Vec::new();
        vocabulary.pieces(text, |id| out.push(names[&id].clone()));
        out
    }

    #[test]
    fn words_are_cut_into_the_longest_pieces_from_their_start() {
        let vocabulary = Vocabulary::new([
            "[UNK]", "un", "##aff", "##able", "the", "run", "##ning", ",", "!", "café", "cafe",
            "中", "文", "x",
        ]);
        for (text, want) in [
            (
                "Unaffable, the RUNNING!",
                vec!["un", "##aff", "##able", ",", "the", "run", "##ning", "!"],
            ),
            // Accents are stripped, as the uncased vocabulary was made.
            ("Café", vec!["cafe"]),
            // CJK characters stand alone, inside a run of them or beside Latin letters.
            ("中文x", vec!["中", "文", "x"]),
            // A word with a part that has no piece gives nothing, not a part of it.
            ("unzzz the", vec!["the"]),
            ("tab\tand\u{7}bell", vec![]),
        ] {
            assert_eq!(pieces(&vocabulary, text), want, "{text:?}");
        }
        assert!(pieces(&vocabulary, &"x".repeat(101)).is_empty());
    }
}
