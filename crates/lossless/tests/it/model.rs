//! Random sequences of turns (tool loops, large results, repeated messages, compactions,
//! reopen) with the engine's invariants checked after every step.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;
use tempfile::TempDir;
use vilvona_conformance::check_tool_pairs;
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_lossless::{CompactionRequest, LosslessEngine};
use vilvona_summarize::ExtractiveSummarizer;

use crate::support::*;

#[derive(Clone, Debug)]
enum Step {
    /// A turn with this many tool calls, each result of this many words.
    Turn {
        calls: usize,
        words: usize,
    },
    /// The previous turn delivered again (a restart or retry): must store nothing.
    Redeliver,
    Compact,
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0usize..5, prop_oneof![Just(20usize), Just(120), Just(900), Just(2_600)])
            .prop_map(|(calls, words)| Step::Turn { calls, words }),
        1 => Just(Step::Redeliver),
        1 => Just(Step::Compact),
        1 => Just(Step::Reopen),
    ]
}

fn build_turn(index: usize, calls: usize, words: usize) -> Vec<(AgentMessage, String)> {
    let t = 1_772_442_351_000_i64 + index as i64 * 60_000;
    let mut out = vec![(
        message(
            json!({"role": "user", "content": format!("request {index}: {}", "ask ".repeat(30)), "timestamp": t}),
        ),
        format!("t{index}-u"),
    )];
    for call in 0..calls {
        let id = format!("c{index}-{call}");
        out.push((message(json!({"role": "assistant", "content": [{"type": "toolCall", "id": id, "name": "exec", "arguments": {"n": call}}], "timestamp": t + 1})), format!("t{index}-a{call}")));
        out.push((message(json!({"role": "toolResult", "toolCallId": id, "toolName": "exec", "content": [{"type": "text", "text": format!("result {index}.{call} {}", "word ".repeat(words))}], "timestamp": t + 2})), format!("t{index}-r{call}")));
    }
    out.push((message(json!({"role": "assistant", "content": [{"type": "text", "text": format!("done {index}")}], "timestamp": t + 3})), format!("t{index}-z")));
    out
}

async fn open(dir: &TempDir) -> LosslessEngine {
    let mut config = small_config();
    config.max_passes_per_turn = 6;
    engine_in(
        dir,
        config,
        Arc::new(ExtractiveSummarizer::new(estimator())),
    )
    .await
}

async fn run(steps: Vec<Step>) {
    let dir = TempDir::new().unwrap();
    let mut engine = open(&dir).await;
    let budget = 4_000;
    let mut stored = 0u64;
    let mut last_turn: Vec<(AgentMessage, String)> = Vec::new();
    for (index, step) in steps.into_iter().enumerate() {
        match step {
            Step::Turn { calls, words } => {
                last_turn = build_turn(index, calls, words);
                stored += last_turn.len() as u64;
                let (messages, ids): (Vec<_>, Vec<_>) = last_turn
                    .iter()
                    .cloned()
                    .map(|(m, id)| (m, Some(id)))
                    .unzip();
                engine
                    .after_turn(&AfterTurnParams {
                        session_id: "p".to_owned(),
                        messages: messages.into(),
                        entry_ids: ids,
                        pre_prompt_message_count: 0,
                        token_budget: Some(budget),
                        ..AfterTurnParams::default()
                    })
                    .await
                    .unwrap();
            }
            Step::Redeliver => {
                let (messages, ids): (Vec<_>, Vec<_>) = last_turn
                    .iter()
                    .cloned()
                    .map(|(m, id)| (m, Some(id)))
                    .unzip();
                let result = engine
                    .ingest_batch(&IngestBatchParams {
                        session_id: "p".to_owned(),
                        messages,
                        entry_ids: ids,
                        ..IngestBatchParams::default()
                    })
                    .await
                    .unwrap();
                assert_eq!(
                    result.ingested_count, 0,
                    "a redelivered turn stores nothing"
                );
            }
            Step::Compact => {
                let conversation = engine.conversation("p", None).await.unwrap();
                let report = engine
                    .compact_conversation(conversation.id, CompactionRequest::forced(budget))
                    .await
                    .unwrap();
                // (5) compaction terminates within its pass bound.
                assert!(report.passes <= engine.config().max_passes_per_turn);
            }
            Step::Reopen => {
                // (6) what this instance kept rendered (at ingest, at earlier assemblies) is
                // what a new instance reads from the store.
                let conversation = engine.conversation("p", None).await.unwrap();
                let kept = engine
                    .assemble_context(conversation.id, budget)
                    .await
                    .unwrap();
                drop(engine);
                engine = open(&dir).await;
                let read = engine
                    .assemble_context(conversation.id, budget)
                    .await
                    .unwrap();
                assert_eq!(kept.messages.to_vec(), read.messages.to_vec());
            }
        }
        let conversation = engine.conversation("p", None).await.unwrap();
        // (1) every message stored exactly once…
        let row = engine
            .store()
            .conversation_by_id(conversation.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.message_count, stored);
        // …and reachable; (4) the DAG is acyclic and each message is under at most one leaf.
        let report = engine.store().integrity_check().await.unwrap();
        assert!(report.is_healthy(), "{:?}", report.problems);
        // (2) within budget whenever the tail fits; (3) no tool call separated from its results.
        let assembled = engine
            .assemble_context(conversation.id, budget)
            .await
            .unwrap();
        if assembled.prompt_authority == PromptAuthority::Assembled {
            assert!(
                assembled.estimated_tokens <= budget,
                "{} > {budget}",
                assembled.estimated_tokens
            );
        }
        assert!(assembled.estimated_tokens <= budget);
        check_tool_pairs(&assembled.messages).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(steps in prop::collection::vec(step(), 1..20)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(run(steps));
    }
}
