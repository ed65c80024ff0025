//! Recall at assembly: a turn that asks about something the context has folded away gets it
//! back in its prompt, as one block after the context, the same for every request of the turn,
//! and recorded with the turn; a turn like the others gets nothing; the setting turns it off.

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::admin::{EngineAdmin, ToolCaller};
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_lossless::{LosslessConfig, LosslessEngine};
use vilvona_summarize::ExtractiveSummarizer;

use crate::support::*;

const KEY: &str = "agent:main:recall";
const FACT: &str = "We bumped the staging database onto port 6543 last week.";

/// Thirty committed turns at a 4,000-token budget, the fact said in passing in turn 3's
/// request; returns the host's history.
async fn session(engine: &LosslessEngine) -> Vec<AgentMessage> {
    let mut history = Vec::new();
    for n in 0..30 {
        let mut messages = turn(n);
        if n == 3 {
            // Said in passing, in a request like the others.
            let request = messages[0].plain_text();
            messages[0] = message(json!({
                "role": "user",
                "content": format!("{request} By the way: {FACT}"),
                "timestamp": 1_772_442_351_000_i64 + 3 * 60_000,
            }));
        }
        engine
            .commit_turn(&CommitTurnParams {
                advancement_key: format!("turn-{n}"),
                session_id: "s".to_owned(),
                session_key: Some(KEY.to_owned()),
                messages: messages.clone(),
                token_budget: Some(4_000),
                ..CommitTurnParams::default()
            })
            .await
            .unwrap();
        history.extend(messages);
    }
    engine.settled().await;
    history
}

async fn assemble(engine: &LosslessEngine, history: &[AgentMessage], prompt: &str) -> Vec<String> {
    engine
        .assemble(&AssembleParams {
            session_id: "s".to_owned(),
            session_key: Some(KEY.to_owned()),
            messages: history.to_vec().into(),
            prompt: Some(prompt.to_owned()),
            token_budget: Some(4_000),
            ..AssembleParams::default()
        })
        .await
        .unwrap()
        .messages
        .iter()
        .map(AgentMessage::plain_text)
        .collect()
}

fn recall_blocks(texts: &[String]) -> Vec<&String> {
    texts
        .iter()
        .filter(|text| text.starts_with("<recall note="))
        .collect()
}

fn caller() -> ToolCaller {
    ToolCaller {
        session_id: "s".to_owned(),
        session_key: Some(KEY.to_owned()),
    }
}

#[tokio::test]
async fn a_folded_fact_comes_back_for_the_turn_that_asks_about_it() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let history = session(&engine).await;
    let question = "Which port does the staging database listen on now?";

    let texts = assemble(&engine, &history, question).await;
    assert!(
        !texts.iter().any(|text| text.starts_with("Turn 3:")),
        "turn 3 is folded out of the context"
    );
    let blocks = recall_blocks(&texts);
    assert_eq!(blocks.len(), 1, "{texts:#?}");
    let block = blocks[0];
    assert!(block.contains("6543"), "{block}");
    assert!(
        block.contains("msg_"),
        "the excerpt names its message: {block}"
    );
    assert_eq!(
        texts.last(),
        Some(block),
        "the block comes after the context"
    );

    // Another request of the same turn (a tool loop) carries the same block.
    let again = assemble(&engine, &history, question).await;
    assert_eq!(recall_blocks(&again), blocks);

    // The turn's record keeps what was recalled, with its score.
    let mut asked = history.clone();
    asked.push(message(
        json!({"role": "user", "content": question, "timestamp": 1_772_444_351_000_i64}),
    ));
    asked.push(message(json!({"role": "assistant", "content": [{"type": "text", "text": "6543."}], "timestamp": 1_772_444_352_000_i64})));
    engine
        .commit_turn(&CommitTurnParams {
            advancement_key: "turn-30".to_owned(),
            session_id: "s".to_owned(),
            session_key: Some(KEY.to_owned()),
            messages: asked[asked.len() - 2..].to_vec(),
            token_budget: Some(4_000),
            ..CommitTurnParams::default()
        })
        .await
        .unwrap();
    let records = engine.turn_history(&caller()).await.unwrap();
    let last = records.last().unwrap();
    assert!(!last.recalled.is_empty(), "{last:?}");
    assert!(block.contains(&last.recalled[0].id), "{last:?}");
    assert!(last.recalled[0].score > 0.0);

    // A turn like the others (the next task) opens nothing.
    let texts = assemble(&engine, &asked, "Turn 31: check crates/m31/src/lib.rs.").await;
    assert!(recall_blocks(&texts).is_empty(), "{texts:#?}");
}

#[tokio::test]
async fn the_setting_turns_it_off() {
    let question = "Which port does the staging database listen on now?";
    for (scope, opens) in [
        (vilvona_lossless::RecallScope::Key, true),
        (vilvona_lossless::RecallScope::Off, false),
    ] {
        let dir = TempDir::new().unwrap();
        let config = LosslessConfig {
            assembly_recall: vilvona_lossless::AssemblyRecall {
                scope,
                ..vilvona_lossless::AssemblyRecall::default()
            },
            ..small_config()
        };
        let engine = engine_in(
            &dir,
            config,
            std::sync::Arc::new(ExtractiveSummarizer::new(estimator())),
        )
        .await;
        let history = session(&engine).await;
        let texts = assemble(&engine, &history, question).await;
        assert_eq!(
            recall_blocks(&texts).len(),
            usize::from(opens),
            "{scope:?}: {texts:#?}"
        );
    }
}
