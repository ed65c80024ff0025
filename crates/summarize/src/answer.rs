//! Answers from history without a model: the sentences of the evidence that share the most
//! words with the question, each cited by the id it came from.

use vilvona_core::summarize::{Answer, QuestionRequest};
use vilvona_core::tokens::TokenEstimator;

use vilvona_core::tokens::is_cjk;

use crate::lines::{EXTRACTIVE_ID, PINNED_PREFIX, sentences};

/// Sentences an offline answer quotes at most.
const MAX_SENTENCES: usize = 3;

/// Words too common to say what a question is about.
pub const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "with", "that", "this", "what", "which", "who", "whom", "when", "where",
    "why", "how", "was", "were", "are", "is", "did", "does", "do", "has", "have", "had", "our",
    "your", "their", "its", "from", "into", "about", "there", "then", "than", "any", "all", "can",
    "could", "would", "should", "will", "been", "being", "you", "they", "them", "we", "us", "it",
    "these", "those", "get", "gets", "got", "now", "here", "just", "some", "also", "very", "more",
    "most", "much", "many", "not", "but", "she", "her", "his", "him", "one", "out",
];

/// What a question is about: its content words, lowercased, and the bigrams of its CJK runs.
fn keywords(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut push = |word: String| {
        if !words.contains(&word) {
            words.push(word);
        }
    };
    let mut run: Vec<char> = Vec::new();
    let flush_run = |run: &mut Vec<char>, push: &mut dyn FnMut(String)| {
        match run.len() {
            0 => {}
            1 => push(run[0].to_string()),
            _ => run.windows(2).for_each(|pair| push(pair.iter().collect())),
        }
        run.clear();
    };
    for word in text.split(|c: char| !c.is_alphanumeric() && c != '-' && c != '_') {
        let mut latin = String::new();
        for c in word.chars() {
            if is_cjk(c) {
                run.push(c);
            } else {
                flush_run(&mut run, &mut push);
                latin.push(c);
            }
        }
        flush_run(&mut run, &mut push);
        let latin = latin.trim_matches(['-', '_']).to_lowercase();
        let meaningful = latin.chars().any(|c| c.is_ascii_digit()) || latin.chars().count() >= 3;
        if meaningful && !STOP_WORDS.contains(&latin.as_str()) {
            push(latin);
        }
    }
    words
}

/// The best-matching sentences of the evidence (at most three, within the answer's tokens),
/// in the order they were said, each evidence item cited once. No matching sentence: an
/// answer that says so, citing nothing.
pub fn extractive_answer(request: &QuestionRequest, estimator: &dyn TokenEstimator) -> Answer {
    let wanted = keywords(&request.question);
    let matched = |sentence: &str| {
        let lower = sentence.to_lowercase();
        wanted
            .iter()
            .filter(|word| lower.contains(word.as_str()))
            .count()
    };
    // A sentence that holds fewer than half the words the best one holds is about something
    // else that shares a word with the question ("database" in "a database outage" for "the
    // ticket of the database migration"): quoting it would cite an unrelated message.
    let best = evidence_sentences(request)
        .map(|(_, _, sentence)| matched(sentence))
        .max()
        .unwrap_or(0);
    answer_from(request, estimator, |sentence| {
        let matched = matched(sentence);
        (matched > 0 && matched * 2 > best).then_some(matched as f32)
    })
}

/// Least similarity in meaning for a sentence to answer a question (the built-in model, at 192
/// dimensions, places unrelated sentences below 0.25 and "Painting watercolours at night helps
/// me relax" at 0.34 from "What does the user do to unwind?"; at 128 dimensions they were 0.3
/// and 0.41, and the floor 0.4).
const MEANING_FLOOR: f32 = 0.3;
/// How far below the best a sentence may be and still be quoted with it.
const MEANING_SPREAD: f32 = 0.05;

/// The sentences of the evidence nearest the question in meaning (`nearness` gives a
/// sentence's similarity to the question), as [`extractive_answer`] quotes and cites them:
/// for a question that shares no word with its answer. `None` when no sentence is near
/// enough.
pub fn meaning_answer(
    request: &QuestionRequest,
    estimator: &dyn TokenEstimator,
    nearness: impl Fn(&str) -> Option<f32>,
) -> Option<Answer> {
    let mut best = f32::MIN;
    let mut near: Vec<(String, f32)> = Vec::new();
    for sentence in evidence_sentences(request).map(|(_, _, sentence)| sentence) {
        if let Some(similarity) = nearness(sentence) {
            best = best.max(similarity);
            near.push((sentence.to_owned(), similarity));
        }
    }
    let floor = MEANING_FLOOR.max(best - MEANING_SPREAD);
    let answer = answer_from(request, estimator, |sentence| {
        near.iter()
            .find(|(said, _)| said == sentence)
            .map(|(_, similarity)| *similarity)
            .filter(|similarity| *similarity >= floor)
    });
    (!answer.citations.is_empty()).then_some(answer)
}

/// Each evidence item's sentences: `(item, position, sentence)`. A summary's pinned line is
/// the statement itself.
fn evidence_sentences(request: &QuestionRequest) -> impl Iterator<Item = (usize, usize, &str)> {
    request
        .evidence
        .iter()
        .enumerate()
        .flat_map(|(item, evidence)| {
            evidence
                .text
                .lines()
                .map(|line| {
                    let line = line.trim();
                    line.strip_prefix(PINNED_PREFIX).map_or(line, str::trim)
                })
                .flat_map(sentences)
                .enumerate()
                .map(move |(position, sentence)| (item, position, sentence))
        })
}

/// The sentences `score` rates best (at most three, within the answer's tokens; a sentence it
/// gives no score is never quoted), in the order they were said, each evidence item cited
/// once; or an answer that says nothing was found.
fn answer_from(
    request: &QuestionRequest,
    estimator: &dyn TokenEstimator,
    score: impl Fn(&str) -> Option<f32>,
) -> Answer {
    let mut candidates: Vec<(f32, usize, usize, String)> = evidence_sentences(request)
        .filter_map(|(item, position, sentence)| {
            score(sentence).map(|rated| (rated, item, position, sentence.to_owned()))
        })
        .collect();
    // Best rated first; on a tie, a message (the source) before a summary (a copy), then the
    // evidence as offered (best hit first).
    let is_summary = |item: usize| request.evidence[item].label == "summary";
    candidates.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(is_summary(a.1).cmp(&is_summary(b.1)))
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
    });
    let mut chosen: Vec<(usize, usize, String)> = Vec::new();
    let mut used = 0;
    for (_, item, position, sentence) in candidates {
        if chosen.len() == MAX_SENTENCES {
            break;
        }
        let cost = estimator.text_tokens(&sentence) + 1;
        if used + cost > request.max_answer_tokens || chosen.iter().any(|c| c.2 == sentence) {
            continue;
        }
        used += cost;
        chosen.push((item, position, sentence));
    }
    if chosen.is_empty() {
        return Answer {
            text: "Nothing in the history found for this question answers it.".to_owned(),
            citations: Vec::new(),
            answered_by: EXTRACTIVE_ID.to_owned(),
        };
    }
    chosen.sort();
    let mut citations: Vec<String> = Vec::new();
    for (item, _, _) in &chosen {
        let id = &request.evidence[*item].id;
        if !citations.contains(id) {
            citations.push(id.clone());
        }
    }
    Answer {
        text: chosen
            .into_iter()
            .map(|(_, _, sentence)| sentence)
            .collect::<Vec<_>>()
            .join(" "),
        citations,
        answered_by: EXTRACTIVE_ID.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vilvona_core::summarize::Evidence;
    use vilvona_core::tokens::HeuristicEstimator;

    fn evidence(id: &str, text: &str) -> Evidence {
        Evidence {
            id: id.to_owned(),
            label: "user".to_owned(),
            timestamp_ms: None,
            text: text.to_owned(),
        }
    }

    #[test]
    fn the_best_matching_sentences_answer_with_their_ids() {
        let request = QuestionRequest {
            question: "Who owns the staging password rotation ticket?".to_owned(),
            evidence: vec![
                evidence("msg_3", "The cache is cold. Nothing else happened."),
                evidence(
                    "msg_9",
                    "Please remember: the ticket for the staging database password rotation is OPS-48292 and Kwame Mensah owns it. Then we ran the tests.",
                ),
                evidence("sum_1", "告警阈值改成了八十五。"),
            ],
            max_answer_tokens: 200,
        };
        let answer = extractive_answer(&request, &HeuristicEstimator);
        assert!(
            answer.text.starts_with("Please remember: the ticket"),
            "{}",
            answer.text
        );
        assert_eq!(answer.citations, ["msg_9"]);

        let cjk = QuestionRequest {
            question: "告警阈值是多少？".to_owned(),
            ..request.clone()
        };
        assert_eq!(
            extractive_answer(&cjk, &HeuristicEstimator).citations,
            ["sum_1"]
        );

        let unrelated = QuestionRequest {
            question: "Which compiler flags?".to_owned(),
            ..request
        };
        assert!(
            extractive_answer(&unrelated, &HeuristicEstimator)
                .citations
                .is_empty()
        );
    }

    /// A sentence that shares one word with the question, where another holds most of them, is
    /// not quoted: its message is about something else.
    #[test]
    fn sentences_that_share_a_word_by_chance_are_not_cited() {
        let request = QuestionRequest {
            question: "What is the ticket number for the database migration?".to_owned(),
            evidence: vec![
                evidence(
                    "msg_1",
                    "The ticket for the database migration is OPS-4411.",
                ),
                evidence("msg_2", "We had a database outage yesterday."),
                evidence("msg_3", "The migration of the office is next week."),
                evidence(
                    "msg_4",
                    "Ticket OPS-4411 moves the database migration to Friday.",
                ),
            ],
            max_answer_tokens: 200,
        };
        let answer = extractive_answer(&request, &HeuristicEstimator);
        assert_eq!(answer.citations, ["msg_1", "msg_4"], "{}", answer.text);
    }

    #[test]
    fn a_question_in_other_words_is_answered_by_the_nearest_sentences() {
        let request = QuestionRequest {
            question: "What does the user do to unwind?".to_owned(),
            evidence: vec![
                evidence("msg_1", "Refactor the parser cache. Run the tests."),
                evidence("msg_3", "Thanks. Painting at night helps me relax."),
            ],
            max_answer_tokens: 200,
        };
        // Similarities as a model would give them: the painting sentence is near, "Thanks."
        // within the spread of it is quoted too, the rest below the floor is not.
        let nearness = |sentence: &str| -> Option<f32> {
            Some(match sentence {
                "Painting at night helps me relax." => 0.62,
                "Thanks." => 0.58,
                _ => 0.2,
            })
        };
        let answer = meaning_answer(&request, &HeuristicEstimator, nearness).unwrap();
        assert_eq!(answer.text, "Thanks. Painting at night helps me relax.");
        assert_eq!(answer.citations, ["msg_3"]);
        // Nothing near enough: no answer by meaning.
        assert!(meaning_answer(&request, &HeuristicEstimator, |_| Some(0.25)).is_none());
    }
}
