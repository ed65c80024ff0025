//! A generated 300-turn session replayed through the host with `legacy`: the built-in
//! auto-compaction runs again and again, and what the model would see stays sound.

use tempfile::TempDir;
use vilvona_conformance::check_tool_pairs;
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_runtime::{Host, HostOptions};
use vilvona_transcript::{Entry, read_transcript, session_messages};

use crate::support::write_config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_legacy_compaction_keeps_the_context_sound() {
    let dir = TempDir::new().unwrap();
    write_config(
        dir.path(),
        r#"{ agents: { defaults: { contextTokens: 32000, compaction: { keepRecentTokens: 8000 } } } }"#,
    );
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    let workload = vilvona_workload::generate(300, 7, 60);
    let mut compactions = 0;
    let mut needles_checked = 0;
    for (turn, range) in workload.turns.iter().enumerate() {
        let messages = workload.turn_messages(turn);
        let ids = workload.entries[range.clone()]
            .iter()
            .map(|entry| Some(entry.id.clone()))
            .collect();
        host.replay_turn(
            "agent:main:replay",
            Some(&workload.header.id),
            messages,
            ids,
        )
        .await
        .unwrap();
        let record = host.session("agent:main:replay").await.unwrap();
        if record.compaction_count > compactions {
            compactions = record.compaction_count;
            // After each compaction: every needle stated inside the kept window is verbatim.
            let transcript = read_transcript(&record.session_file).unwrap();
            let first_kept = transcript
                .entries
                .iter()
                .rev()
                .find_map(|located| match &located.entry {
                    Entry::Compaction(compaction) => Some(compaction.first_kept_entry_id.clone()),
                    _ => None,
                })
                .unwrap();
            let kept_from = workload
                .entries
                .iter()
                .position(|entry| entry.id == first_kept)
                .unwrap();
            let text: String = session_messages(&transcript.entries)
                .iter()
                .map(|(_, m)| m.plain_text())
                .collect::<Vec<_>>()
                .join("\n");
            for needle in workload.needles.iter().filter(|n| n.turn <= turn) {
                if workload.turns[needle.turn].start >= kept_from {
                    assert!(
                        text.contains(&needle.statement),
                        "needle of turn {} lost at turn {turn}",
                        needle.turn
                    );
                    needles_checked += 1;
                }
            }
        }
    }
    assert!(needles_checked >= 5, "only {needles_checked} needle checks");
    let record = host.session("agent:main:replay").await.unwrap();
    assert!(
        record.compaction_count >= 5,
        "compacted {} times",
        record.compaction_count
    );
    let transcript = read_transcript(&record.session_file).unwrap();
    let summaries: Vec<&str> = transcript
        .entries
        .iter()
        .filter_map(|located| match &located.entry {
            Entry::Compaction(compaction) => Some(compaction.summary.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(summaries.len() as u64, record.compaction_count);
    for summary in &summaries {
        assert!(
            summary.chars().count() <= 16_000,
            "a summary of {} characters",
            summary.chars().count()
        );
    }
    let rebuilt: Vec<_> = session_messages(&transcript.entries)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    let tokens: u64 = rebuilt
        .iter()
        .map(|m| HeuristicEstimator.message_tokens(m))
        .sum();
    assert!(tokens <= 32_000, "the rebuilt context has {tokens} tokens");
    check_tool_pairs(&rebuilt).unwrap();
}

/// At every window, legacy keeps each turn within its budget, and each compaction frees at
/// least a quarter of the budget: no compaction churn (the kept tail and the summary are
/// capped to the window, as OpenClaw caps them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_stays_within_budget_at_every_window_without_churn() {
    let workload = vilvona_workload::generate(300, 7, 60);
    for window in [16_000u64, 32_000, 64_000, 128_000, 200_000] {
        let dir = TempDir::new().unwrap();
        write_config(
            dir.path(),
            &format!("{{ agents: {{ defaults: {{ contextTokens: {window} }} }} }}"),
        );
        let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
            .await
            .unwrap();
        let mut over_budget = 0;
        let mut smallest_budget = u64::MAX;
        for (turn, range) in workload.turns.iter().enumerate() {
            let ids = workload.entries[range.clone()]
                .iter()
                .map(|entry| Some(entry.id.clone()))
                .collect();
            let report = host
                .replay_turn(
                    "agent:main:windows",
                    Some(&workload.header.id),
                    workload.turn_messages(turn),
                    ids,
                )
                .await
                .unwrap();
            over_budget += u32::from(report.over_budget);
            smallest_budget = smallest_budget.min(report.token_budget);
        }
        assert_eq!(
            over_budget, 0,
            "turns over budget at a {window}-token window"
        );
        let record = host.session("agent:main:windows").await.unwrap();
        let transcript = read_transcript(&record.session_file).unwrap();
        for located in &transcript.entries {
            let Entry::Compaction(compaction) = &located.entry else {
                continue;
            };
            let after = compaction
                .details
                .as_ref()
                .and_then(|details| details["tokensAfter"].as_u64())
                .unwrap();
            eprintln!(
                "DEBUG {window} before {} after {after} summary {} chars details {}",
                compaction.tokens_before,
                compaction.summary.len(),
                compaction.details.as_ref().unwrap()
            );
            assert!(
                compaction.tokens_before - after >= smallest_budget / 4,
                "at a {window}-token window a compaction freed only {} of {} tokens (budget {smallest_budget})",
                compaction.tokens_before - after,
                compaction.tokens_before
            );
        }
    }
}
