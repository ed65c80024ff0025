//! A date a question names, read as the time it selects: "what did we decide in May 2026?"
//! asks about what was written in May 2026, whatever the words. [`named_date`] finds one
//! calendar date in a query — `2026-05-14`, `May 2026`, `May 14, 2026`, `14 May 2026` (month
//! names in English, whole or three letters) — and answers its span in UTC and the query
//! without it. A month name needs its year beside it, so "what may …" is no date; relative
//! dates ("last week") are not read.

use vilvona_summarize::parse_rfc3339;

/// A date a query names: the span it selects and the query's other words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamedDate {
    /// The date as the query says it.
    pub(crate) said: String,
    /// The span's start, in milliseconds since the epoch (inclusive).
    pub(crate) since_ms: i64,
    /// Its end (exclusive).
    pub(crate) before_ms: i64,
    /// The query without the date's words.
    pub(crate) rest: String,
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// The month a word names (1–12): whole, or its first three letters ("sept" too).
fn month(word: &str) -> Option<u32> {
    let word = word.to_ascii_lowercase();
    MONTHS
        .iter()
        .position(|name| *name == word || (word.len() >= 3 && name.starts_with(&word)))
        .map(|index| index as u32 + 1)
}

/// A year a word is (four digits, 1900–2199).
fn year(word: &str) -> Option<i64> {
    (word.len() == 4 && word.bytes().all(|b| b.is_ascii_digit()))
        .then(|| word.parse().ok())
        .flatten()
        .filter(|year| (1900..2200).contains(year))
}

/// A day of the month a word is: `14`, `14th`, `1st`, `2nd`, `3rd`.
fn day(word: &str) -> Option<u32> {
    let digits = ["st", "nd", "rd", "th"]
        .iter()
        .find_map(|suffix| {
            word.to_ascii_lowercase()
                .strip_suffix(suffix)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| word.to_owned());
    (1..=2)
        .contains(&digits.len())
        .then(|| digits.parse().ok())
        .flatten()
        .filter(|day| (1..=31).contains(day))
}

/// Midnight UTC of a date, if it exists.
fn midnight(year: i64, month: u32, day: u32) -> Option<i64> {
    parse_rfc3339(&format!("{year:04}-{month:02}-{day:02}"))
}

const DAY_MS: i64 = 86_400_000;

/// The first date `query` names (see the module), or none.
pub(crate) fn named_date(query: &str) -> Option<NamedDate> {
    // Words with their punctuation trimmed, and where each lies in the query.
    let words: Vec<(usize, usize, &str)> = query
        .split_whitespace()
        .map(|raw| {
            let start = raw.as_ptr() as usize - query.as_ptr() as usize;
            let word = raw.trim_matches(|c: char| {
                matches!(
                    c,
                    ',' | '.' | '?' | '!' | ';' | ':' | '(' | ')' | '"' | '\''
                )
            });
            (start, start + raw.len(), word)
        })
        .collect();
    let word = |at: usize| words.get(at).map(|(_, _, word)| *word).unwrap_or("");
    for at in 0..words.len() {
        // (span, how many words it takes)
        let found = if let Some(start) = parse_rfc3339(word(at)).filter(|_| word(at).len() == 10) {
            Some(((start, start + DAY_MS), 1))
        } else if let Some(month) = month(word(at)) {
            match (day(word(at + 1)), year(word(at + 1)), year(word(at + 2))) {
                (Some(day), _, Some(year)) => {
                    midnight(year, month, day).map(|start| ((start, start + DAY_MS), 3))
                }
                (_, Some(year), _) => {
                    let next = if month == 12 {
                        (year + 1, 1)
                    } else {
                        (year, month + 1)
                    };
                    midnight(year, month, 1)
                        .zip(midnight(next.0, next.1, 1))
                        .map(|span| (span, 2))
                }
                _ => None,
            }
        } else if let (Some(day), Some(month), Some(year)) =
            (day(word(at)), month(word(at + 1)), year(word(at + 2)))
        {
            midnight(year, month, day).map(|start| ((start, start + DAY_MS), 3))
        } else {
            None
        };
        if let Some(((since_ms, before_ms), taken)) = found {
            let (start, end) = (words[at].0, words[at + taken - 1].1);
            let rest = format!("{} {}", &query[..start], &query[end..]);
            return Some(NamedDate {
                said: query[start..end]
                    .trim_end_matches(['?', '.', ',', '!'])
                    .to_owned(),
                since_ms,
                before_ms,
                rest: rest.split_whitespace().collect::<Vec<_>>().join(" "),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        parse_rfc3339(text).unwrap()
    }

    #[test]
    fn dates_a_question_names_select_their_span() {
        let day = |date: &str| (at(date), at(date) + DAY_MS);
        let table: [(&str, &str, (i64, i64), &str); 8] = [
            (
                "what did we decide on 2026-05-14?",
                "2026-05-14",
                day("2026-05-14"),
                "what did we decide on",
            ),
            (
                "What did Ana cook in May 2023?",
                "May 2023",
                (at("2023-05-01"), at("2023-06-01")),
                "What did Ana cook in",
            ),
            (
                "plans for december 2025",
                "december 2025",
                (at("2025-12-01"), at("2026-01-01")),
                "plans for",
            ),
            (
                "Where was Ana on May 7, 2023?",
                "May 7, 2023",
                day("2023-05-07"),
                "Where was Ana on",
            ),
            (
                "where was Ana on 7 May 2023",
                "7 May 2023",
                day("2023-05-07"),
                "where was Ana on",
            ),
            (
                "the deploy of Sept 3rd 2024 failed",
                "Sept 3rd 2024",
                day("2024-09-03"),
                "the deploy of failed",
            ),
            (
                "leap day 29 Feb 2024",
                "29 Feb 2024",
                day("2024-02-29"),
                "leap day",
            ),
            (
                "notes from Jan 2026, please",
                "Jan 2026",
                (at("2026-01-01"), at("2026-02-01")),
                "notes from please",
            ),
        ];
        for (query, said, (since_ms, before_ms), rest) in table {
            let named = named_date(query).unwrap_or_else(|| panic!("{query}"));
            assert_eq!(
                named,
                NamedDate {
                    said: said.to_owned(),
                    since_ms,
                    before_ms,
                    rest: rest.to_owned()
                },
                "{query}"
            );
        }
    }

    #[test]
    fn words_that_only_look_like_dates_are_not_dates() {
        for query in [
            "what may I deploy?",
            "may the build pass",
            "port 2023 is open",
            "March on",
            "Feb 30, 2024 never was",
            "version 2026-13-01",
            "OPS-48292",
            "marching 2024",
            "",
        ] {
            assert_eq!(named_date(query), None, "{query}");
        }
    }
}
