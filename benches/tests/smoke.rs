//! A smoke run of the workload runner on a 50-turn session, so it cannot silently rot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vilvona_benches::{RunOptions, SummarizerChoice, run, to_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_runs_on_fifty_turns() {
    let dir = tempfile::TempDir::new().unwrap();
    let workload = vilvona_workload::generate(50, 7, 5);
    let transcript = dir.path().join("session.jsonl");
    let needles = dir.path().join("needles.json");
    std::fs::write(&transcript, workload.to_jsonl()).unwrap();
    std::fs::write(&needles, serde_json::to_string(&workload.needles).unwrap()).unwrap();
    for summarizer in [SummarizerChoice::Fake, SummarizerChoice::Extractive] {
        let figures = run(&RunOptions {
            transcript: transcript.clone(),
            needles: needles.clone(),
            summarizer,
            store_dir: None,
            store_url: None,
            progress_every: 0,
            // The fake run also greps from a second process while it ingests.
            probe: (summarizer == SummarizerChoice::Fake)
                .then(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_workload"))),
            instructions: false,
            embedding: true,
        })
        .await
        .unwrap();
        assert_eq!(figures.turns, 50);
        assert_eq!(figures.messages, workload.entries.len());
        assert_eq!(figures.needles_found, 5, "{summarizer:?}");
        assert_eq!(figures.ingest.count, 50);
        assert_eq!(figures.assemble.count, 5);
        assert_eq!(
            figures.grep_hybrid.as_ref().map(|grep| grep.count),
            Some(5 * 10)
        );
        assert!(figures.store_bytes > 0);
        if summarizer == SummarizerChoice::Fake {
            let probe = figures.grep_from_another_process.unwrap();
            assert!(probe.count > 0, "the probe grepped while the runner wrote");
        }
        let json = to_json(&figures).unwrap();
        for field in [
            "ingest",
            "ingestMedianByTenthMs",
            "compaction",
            "summariesByDepth",
            "assemble",
            "finalEstimatedTokens",
            "grep",
            "grepHybrid",
            "needlesFound",
            "needlesInFinalContext",
            "storeBytes",
            "transcriptBytes",
            "peakRssMib",
            "wallS",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
    }
}
