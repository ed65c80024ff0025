use std::sync::Arc;

use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::*;
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_summarize::*;

fn generated_messages() -> Vec<AgentMessage> {
    let path = format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).unwrap();
            (entry["type"] == "message")
                .then(|| serde_json::from_value(entry["message"].clone()).unwrap())
        })
        .collect()
}

fn leaf_request(messages: &[AgentMessage], target_tokens: u64) -> SummaryRequest {
    SummaryRequest {
        kind: SummaryKind::Leaf,
        depth: 0,
        level: SummaryLevel::Normal,
        target_tokens,
        items: messages.iter().map(source_item).collect(),
        previous_context: None,
        custom_instructions: None,
    }
}

fn summarizer() -> ExtractiveSummarizer {
    ExtractiveSummarizer::new(Arc::new(HeuristicEstimator))
}

#[test]
fn the_output_is_deterministic() {
    let messages = generated_messages();
    let request = leaf_request(&messages[..30], 400);
    let first = summarizer().summarize_now(&request);
    let second = summarizer().summarize_now(&request);
    assert_eq!(first, second);
    assert!(!first.text.is_empty());
}

#[test]
fn the_output_is_always_within_its_target() {
    let messages = generated_messages();
    let estimator = HeuristicEstimator;
    for window in [3, 8, 20, 40] {
        for start in (0..messages.len().saturating_sub(window)).step_by(7) {
            for target in [1, 10, 60, 200, 800, 2400] {
                for level in [
                    SummaryLevel::Normal,
                    SummaryLevel::Aggressive,
                    SummaryLevel::Fallback,
                ] {
                    let mut request = leaf_request(&messages[start..start + window], target);
                    request.level = level;
                    let summary = summarizer().summarize_now(&request);
                    let tokens = estimator.text_tokens(&summary.text);
                    let source: u64 = request
                        .items
                        .iter()
                        .map(|i| estimator.text_tokens(&i.text))
                        .sum();
                    let cap = if level == SummaryLevel::Fallback {
                        target.min(source / 2).max(12)
                    } else {
                        target
                    };
                    assert!(
                        tokens <= cap,
                        "{level:?} window {window} at {start}, target {target}: {tokens} tokens\n{}",
                        summary.text
                    );
                }
            }
        }
    }
}

#[test]
fn identifiers_are_kept_or_listed_for_expansion() {
    let messages = generated_messages();
    let estimator = HeuristicEstimator;
    for start in (0..messages.len() - 10).step_by(5) {
        let request = leaf_request(&messages[start..start + 10], 900);
        let summary = summarizer().summarize_now(&request);
        let (body, footer) = match summary.text.split_once(EXPAND_FOOTER) {
            Some((body, footer)) => (body.to_owned(), footer.to_owned()),
            None => (summary.text.clone(), String::new()),
        };
        let listed: Vec<&str> = footer.split(", ").map(str::trim).collect();
        for item in &request.items {
            if item.label.starts_with("toolResult") {
                continue;
            }
            for identifier in identifiers(&item.text) {
                assert!(
                    body.contains(&identifier) || listed.contains(&identifier.as_str()),
                    "window at {start}: {identifier:?} is neither kept nor listed\n{}",
                    summary.text
                );
            }
        }
        assert!(estimator.text_tokens(&summary.text) <= 900);
    }
}

fn item(label: &str, text: &str) -> SourceItem {
    SourceItem {
        label: label.to_owned(),
        timestamp_ms: Some(1_772_442_351_000),
        text: text.to_owned(),
    }
}

#[test]
fn decisions_and_remember_notes_survive_a_leaf_and_a_condensed_pass() {
    let filler =
        "The buffer cursor layout module handles the stream of queue workers in the runtime.";
    let chunk = |n: usize, fact: &str| SummaryRequest {
        kind: SummaryKind::Leaf,
        depth: 0,
        level: SummaryLevel::Normal,
        target_tokens: 120,
        items: (0..12)
            .map(|i| {
                if i == n {
                    item("user", fact)
                } else {
                    item("assistant", &format!("{filler} {filler} Step {i}."))
                }
            })
            .collect(),
        previous_context: None,
        custom_instructions: None,
    };
    let facts = [
        "Please remember: the deploy key for staging is KEY-4471.",
        "We decided to keep the WAL checkpoint at 1000 pages.",
        "Note that Mei Tanaka owns the billing export job.",
        "Decision: going with rusqlite over sqlx for the store.",
    ];
    let leaves: Vec<String> = facts
        .iter()
        .enumerate()
        .map(|(n, fact)| summarizer().summarize_now(&chunk(n * 3, fact)).text)
        .collect();
    for (leaf, fact) in leaves.iter().zip(facts) {
        assert!(leaf.contains(fact), "leaf lost {fact:?}:\n{leaf}");
    }
    let condensed = SummaryRequest {
        kind: SummaryKind::Condensed,
        depth: 1,
        level: SummaryLevel::Normal,
        target_tokens: 160,
        items: leaves
            .iter()
            .enumerate()
            .map(|(i, leaf)| item(&format!("sum_{i}"), leaf))
            .collect(),
        previous_context: None,
        custom_instructions: None,
    };
    let summary = summarizer().summarize_now(&condensed).text;
    for fact in facts {
        assert!(
            summary.contains(fact),
            "condensed summary lost {fact:?}:\n{summary}"
        );
    }
}

#[test]
fn code_and_log_payloads_are_described_not_copied() {
    let code = (0..40)
        .map(|i| format!("    let value_{i} = cache.compact({i}); // line {i}"))
        .collect::<Vec<_>>()
        .join("\n");
    let log = (0..60)
        .map(|i| {
            if i == 41 {
                "error[E0308]: mismatched types in crates/store/src/writer.rs".to_owned()
            } else {
                format!("test case_{i} ... ok")
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let request = SummaryRequest {
        kind: SummaryKind::Leaf,
        depth: 0,
        level: SummaryLevel::Normal,
        target_tokens: 400,
        items: vec![
            item("user", "Refactor the compaction loop and run the tests."),
            item(
                "assistant",
                &format!("Here is the new loop:\n{code}\nDone."),
            ),
            item("toolResult:exec", &log),
        ],
        previous_context: None,
        custom_instructions: None,
    };
    let summary = summarizer().summarize_now(&request).text;
    assert!(!summary.contains("let value_7"), "code copied:\n{summary}");
    assert!(
        !summary.contains("test case_3 ... ok"),
        "log copied:\n{summary}"
    );
    assert!(summary.contains("(40 lines of code)"), "{summary}");
    assert!(
        summary.contains(
            "exec returned 60 lines: error[E0308]: mismatched types in crates/store/src/writer.rs"
        ),
        "{summary}"
    );
    assert!(
        summary.contains("[user 2026-03-02 09:05] Refactor the compaction loop and run the tests."),
        "{summary}"
    );
}

#[test]
fn custom_instructions_steer_what_is_kept() {
    let items: Vec<SourceItem> = (0..20)
        .map(|i| {
            let topic = if i == 4 {
                "the billing export"
            } else {
                "the parser cache"
            };
            item(
                "assistant",
                &format!("Step {i} touched {topic} module and its worker queue."),
            )
        })
        .collect();
    let mut request = SummaryRequest {
        kind: SummaryKind::Leaf,
        depth: 0,
        level: SummaryLevel::Normal,
        target_tokens: 40,
        items,
        previous_context: None,
        custom_instructions: None,
    };
    assert!(
        !summarizer()
            .summarize_now(&request)
            .text
            .contains("billing")
    );
    request.custom_instructions = Some("focus on billing".to_owned());
    assert!(
        summarizer()
            .summarize_now(&request)
            .text
            .contains("billing export")
    );
}

#[test]
fn the_fallback_is_marked_and_shrinks() {
    let messages = generated_messages();
    let mut request = leaf_request(&messages[..20], 5_000);
    request.level = SummaryLevel::Fallback;
    let summary = summarizer().summarize_now(&request);
    assert_eq!(summary.level, SummaryLevel::Fallback);
    assert!(summary.text.starts_with(FALLBACK_MARKER));
    let estimator = HeuristicEstimator;
    let source: u64 = request
        .items
        .iter()
        .map(|i| estimator.text_tokens(&i.text))
        .sum();
    assert!(estimator.text_tokens(&summary.text) <= source / 2);
}

fn condensed_request(children: &[String], target_tokens: u64) -> SummaryRequest {
    SummaryRequest {
        kind: SummaryKind::Condensed,
        depth: 1,
        level: SummaryLevel::Normal,
        target_tokens,
        items: children
            .iter()
            .map(|text| SourceItem {
                label: "summary".to_owned(),
                text: text.clone(),
                timestamp_ms: None,
            })
            .collect(),
        previous_context: None,
        custom_instructions: None,
    }
}

/// A remember note stated once survives any number of condensations, inside each target; when
/// the pinned section is full, decisions leave before remember notes, older before newer.
#[test]
fn pinned_facts_are_carried_up_the_dag_within_the_target() {
    let estimator = HeuristicEstimator;
    let filler = "The worker drains the queue and the cursor advances past the batch. ".repeat(6);
    let fact = "Please remember: the ticket for the cold storage migration is OPS-68787.";
    let leaf = summarizer().summarize_now(&SummaryRequest {
        items: vec![SourceItem {
            label: "user".to_owned(),
            text: format!("{filler}{fact} {filler}"),
            timestamp_ms: None,
        }],
        ..leaf_request(&[], 120)
    });
    assert!(
        leaf.text.contains(&format!("{PINNED_PREFIX} {fact}")),
        "{}",
        leaf.text
    );
    // Condense it with many siblings full of other text, level after level.
    let mut level = leaf.text.clone();
    for depth in 0..6 {
        let mut children = vec![level.clone()];
        for sibling in 0..5 {
            children.push(format!("[assistant] Sibling {depth}.{sibling}: {filler}"));
        }
        let summary = summarizer().summarize_now(&condensed_request(&children, 120));
        assert!(
            estimator.text_tokens(&summary.text) <= 120,
            "{}",
            summary.text
        );
        assert!(
            summary.text.contains("OPS-68787"),
            "depth {depth}: {}",
            summary.text
        );
        level = summary.text;
    }
    // A full section: twelve decisions and two remember notes, in a small target.
    let mut children: Vec<String> = (0..12)
        .map(|n| format!("{PINNED_PREFIX} We decided to keep module m{n} as it is."))
        .collect();
    children.insert(
        3,
        format!("{PINNED_PREFIX} Remember: the old token is OPS-11111."),
    );
    children.push(format!(
        "{PINNED_PREFIX} Remember: the new token is OPS-22222."
    ));
    let summary = summarizer().summarize_now(&condensed_request(&children, 80));
    assert!(
        estimator.text_tokens(&summary.text) <= 80,
        "{}",
        summary.text
    );
    assert!(
        summary.text.contains("OPS-11111") && summary.text.contains("OPS-22222"),
        "{}",
        summary.text
    );
    assert!(
        summary.text.contains("m11") && !summary.text.contains("module m0 "),
        "{}",
        summary.text
    );
}
