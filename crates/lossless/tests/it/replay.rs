//! A generated session replayed through the host with `lossless`: within budget every turn,
//! summaries condensed to depth ≥ 1, every needle found and reached by expansion, and a second
//! replay stores nothing. The 2,000-turn run at a 128,000-token window is behind
//! `VILVONA_LARGE_TESTS=1`; the default run is the same check, smaller.

use serde_json::{Value, json};
use tempfile::TempDir;
use vilvona_lossless::{LosslessEngine, ToolCaller};
use vilvona_runtime::{Host, HostOptions};
use vilvona_store::ItemContent;
use vilvona_workload::{Workload, generate};

const KEY: &str = "agent:main:replay";

async fn replay(dir: &TempDir, workload: &Workload) -> (Host, u64) {
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    let mut over_budget = 0;
    for (turn, range) in workload.turns.iter().enumerate() {
        let ids = workload.entries[range.clone()]
            .iter()
            .map(|entry| Some(entry.id.clone()))
            .collect();
        let report = host
            .replay_turn(
                KEY,
                Some(&workload.header.id),
                workload.turn_messages(turn),
                ids,
            )
            .await
            .unwrap();
        over_budget += u64::from(report.over_budget);
    }
    (host, over_budget)
}

/// The store the host's engine wrote, opened beside it for inspection.
async fn stored(dir: &TempDir) -> LosslessEngine {
    let estimator: std::sync::Arc<dyn vilvona_core::tokens::TokenEstimator> =
        std::sync::Arc::new(vilvona_core::tokens::HeuristicEstimator);
    LosslessEngine::open_read_only(
        &dir.path().join("agents/main/lossless"),
        vilvona_lossless::LosslessConfig::default(),
        std::sync::Arc::new(vilvona_summarize::ExtractiveSummarizer::new(
            estimator.clone(),
        )),
        estimator,
    )
    .await
    .unwrap()
}

/// Expands from `id` down through summaries until a message containing `answer` is reached.
async fn reach(engine: &LosslessEngine, caller: &ToolCaller, id: &str, answer: &str) -> bool {
    let mut frontier = vec![id.to_owned()];
    while let Some(id) = frontier.pop() {
        let mut cursor = Value::Null;
        loop {
            let expanded = engine
                .call_tool(
                    caller,
                    "vilvona_expand",
                    &json!({"id": id, "cursor": cursor}),
                )
                .await
                .unwrap();
            for item in expanded["items"].as_array().unwrap() {
                if item["kind"] == "summary" {
                    frontier.push(item["id"].as_str().unwrap().to_owned());
                } else if item["text"].as_str().unwrap_or("").contains(answer) {
                    return true;
                }
            }
            if expanded["nextCursor"].is_null() {
                break;
            }
            cursor = expanded["nextCursor"].clone();
        }
    }
    false
}

async fn check(turns: usize, window: u64, lossless: &str) {
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("vilvona.json5"),
        format!(r#"{{ agents: {{ defaults: {{ contextTokens: {window} }} }}, plugins: {{ slots: {{ contextEngine: "lossless" }}, entries: {{ lossless: {{ config: {lossless} }} }} }} }}"#),
    )
    .unwrap();
    let workload = generate(turns, 7, 10);
    let (host, over_budget) = replay(&dir, &workload).await;
    assert_eq!(
        host.engine().active_id(),
        "lossless",
        "{:?}",
        host.registry().quarantines()
    );
    assert_eq!(
        over_budget, 0,
        "no turn's assembled context exceeded the budget"
    );
    let engine = stored(&dir).await;
    let record = host.session(KEY).await.unwrap();
    let conversation = engine
        .conversation(&record.session_id, Some(KEY))
        .await
        .unwrap();
    let row = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.message_count as usize, workload.entries.len());
    let items = engine.store().context(conversation.id).await.unwrap();
    let max_depth = items
        .iter()
        .filter_map(|item| match &item.content {
            ItemContent::Summary(summary) => Some(summary.depth),
            ItemContent::Message(_) => None,
        })
        .max();
    assert!(
        max_depth >= Some(1),
        "summaries at depth ≥ 1: {max_depth:?}"
    );
    let report = engine.store().integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{:?}", report.problems);

    let caller = ToolCaller {
        session_id: record.session_id.clone(),
        session_key: Some(KEY.to_owned()),
    };
    for needle in &workload.needles {
        let found = engine
            .call_tool(
                &caller,
                "vilvona_grep",
                &json!({"query": needle.query, "scope": "messages", "limit": 5}),
            )
            .await
            .unwrap();
        let results = found["results"].as_array().unwrap();
        let mut hit = None;
        for result in results {
            let described = engine
                .call_tool(&caller, "vilvona_describe", &json!({"id": result["id"]}))
                .await
                .unwrap();
            if described["text"]
                .as_str()
                .unwrap_or("")
                .contains(&needle.answer)
            {
                hit = Some(result.clone());
                break;
            }
        }
        let hit = hit.unwrap_or_else(|| panic!("needle {} not found: {found}", needle.answer));
        // Asked by its own words (the default mode, hybrid), the stating row is the first hit.
        assert_eq!(
            hit["id"], results[0]["id"],
            "{:?}: the stating row is not first: {found}",
            needle.query
        );
        assert!(
            hit["snippet"]
                .as_str()
                .unwrap()
                .contains(&needle.answer[4..]),
            "the snippet shows the answer: {hit}"
        );
        match hit["coveredBy"].as_str() {
            Some(summary) => assert!(
                reach(&engine, &caller, summary, &needle.answer).await,
                "needle {} not reached",
                needle.answer
            ),
            None => {
                let message = engine
                    .call_tool(&caller, "vilvona_describe", &json!({"id": hit["id"]}))
                    .await
                    .unwrap();
                assert!(message["text"].as_str().unwrap().contains(&needle.answer));
            }
        }
    }
    drop(engine);
    drop(host);

    // A second replay of the same session stores nothing new.
    let (_host, _) = replay(&dir, &workload).await;
    let engine = stored(&dir).await;
    let row = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.message_count as usize, workload.entries.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_session_replays_within_budget_and_every_needle_is_recalled() {
    check(
        240,
        24_000,
        "{ freshTailCount: 24, leafChunkTokens: 4000, leafTargetTokens: 600, condensedTargetTokens: 500 }",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_turns_at_a_128k_window() {
    if std::env::var_os("VILVONA_LARGE_TESTS").is_none() {
        return;
    }
    check(2_000, 128_000, "{}").await;
}
