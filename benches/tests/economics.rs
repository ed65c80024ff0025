//! The economics replay on a short generated session: both engines serve every turn at a 32k
//! window beside a 10k-token system prompt, the prompt is rewritten by compaction, and only
//! the model-summarizing engine spends summarizer calls. (What they cost is in BENCHMARKS.md:
//! costs are figures of a bench, not assertions of a test.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vilvona_benches::economics::{ReplayOptions, replay, replay_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_replay_a_session_at_a_small_window() {
    let dir = tempfile::TempDir::new().unwrap();
    let workload = vilvona_workload::generate(60, 7, 5);
    let transcript = dir.path().join("session.jsonl");
    std::fs::write(&transcript, workload.to_jsonl()).unwrap();
    let mut runs = Vec::new();
    for engine in ["legacy", "lossless"] {
        let figures = replay(&ReplayOptions {
            transcript: transcript.clone(),
            engine: engine.to_owned(),
            window: 32_000,
            system_prompt_tokens: 10_000,
        })
        .await
        .unwrap();
        assert_eq!(figures.turns, 60, "{engine}");
        // Every turn's model calls were billed (a turn calls the model once per assistant
        // message), and none was refused for the window.
        let calls: usize = workload
            .turns
            .iter()
            .map(|range| {
                workload.entries[range.clone()]
                    .iter()
                    .filter(|entry| {
                        matches!(
                            entry.message,
                            vilvona_core::message::AgentMessage::Assistant(_)
                        )
                    })
                    .count()
            })
            .sum();
        assert_eq!(figures.cache.turn_requests, calls, "{engine}");
        assert_eq!(figures.cache.rejected_requests, 0, "{engine}");
        assert!(
            figures.cache.prompt_rewrites >= 1,
            "{engine}: never compacted"
        );
        assert!(figures.cache.turn_cache_hit_ratio > 0.5, "{engine}");
        runs.push(figures);
    }
    assert!(
        runs[0].summarizer_calls > 0,
        "legacy summarizes with its model"
    );
    assert_eq!(
        runs[1].summarizer_calls, 0,
        "lossless summarizes extractively"
    );
    let table = replay_table(&runs);
    assert!(
        table.contains("| cache-hit ratio, turn requests |"),
        "{table}"
    );
}
