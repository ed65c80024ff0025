use std::sync::Arc;

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::Summarizer;
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_lossless::{LosslessConfig, LosslessEngine};
use vilvona_summarize::ExtractiveSummarizer;

/// Small settings so compaction happens within a few turns (and shallow passes, from three
/// quarters of the budget down to 60%).
pub(crate) fn small_config() -> LosslessConfig {
    LosslessConfig {
        context_threshold: 0.75,
        target_ratio: 0.6,
        fresh_tail_count: 8,
        leaf_chunk_tokens: 1_200,
        leaf_target_tokens: 200,
        condensed_target_tokens: 160,
        large_content_threshold_tokens: 2_000,
        max_expand_tokens: 1_000,
        default_token_budget: 4_000,
        ..LosslessConfig::default()
    }
}

pub(crate) fn estimator() -> Arc<dyn TokenEstimator> {
    Arc::new(HeuristicEstimator)
}

pub(crate) async fn engine_in(
    dir: &TempDir,
    config: LosslessConfig,
    summarizer: Arc<dyn Summarizer>,
) -> LosslessEngine {
    LosslessEngine::open(&dir.path().join("store"), config, summarizer, estimator())
        .await
        .unwrap()
}

pub(crate) async fn engine(dir: &TempDir) -> LosslessEngine {
    engine_in(
        dir,
        small_config(),
        Arc::new(ExtractiveSummarizer::new(estimator())),
    )
    .await
}

pub(crate) fn message(value: serde_json::Value) -> AgentMessage {
    serde_json::from_value(value).unwrap()
}

/// One turn: a request, a tool call and its result, an answer. About 500 tokens.
pub(crate) fn turn(index: usize) -> Vec<AgentMessage> {
    let t = 1_772_442_351_000_i64 + index as i64 * 60_000;
    let filler =
        "the worker queue drains the batch before the lease expires and the cursor advances. "
            .repeat(4);
    vec![
        message(
            json!({"role": "user", "content": format!("Turn {index}: check crates/m{index}/src/lib.rs. {filler}"), "timestamp": t}),
        ),
        message(
            json!({"role": "assistant", "content": [{"type": "toolCall", "id": format!("c{index}"), "name": "read", "arguments": {"path": format!("crates/m{index}/src/lib.rs")}}], "timestamp": t + 1}),
        ),
        message(
            json!({"role": "toolResult", "toolCallId": format!("c{index}"), "toolName": "read", "content": [{"type": "text", "text": format!("fn m{index}() {{}}\n{filler}")}], "timestamp": t + 2}),
        ),
        message(
            json!({"role": "assistant", "content": [{"type": "text", "text": format!("Decided to keep m{index} as it is. {filler}")}], "timestamp": t + 3}),
        ),
    ]
}

/// The summaries in a session's context, in order.
pub(crate) async fn context_summaries(
    engine: &LosslessEngine,
    session: &str,
    session_key: Option<&str>,
) -> Vec<vilvona_store::StoredSummary> {
    let conversation = engine.conversation(session, session_key).await.unwrap();
    engine
        .store()
        .context(conversation.id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|item| match item.content {
            vilvona_store::ItemContent::Summary(summary) => Some(summary),
            vilvona_store::ItemContent::Message(_) => None,
        })
        .collect()
}
