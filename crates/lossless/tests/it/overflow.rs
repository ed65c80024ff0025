//! The whole prompt is the budget. A host whose own prompt takes a third of the window
//! (OpenClaw 2026.9's 10k-token system prompt at 32k), a fresh tail that covers the whole
//! context, a summarizer whose output never fits: when the host asks for room, the engine makes
//! it, whenever the newest unit leaves any.

use std::sync::Arc;

use async_trait::async_trait;
use proptest::prelude::*;
use serde_json::{Value, json};
use tempfile::TempDir;
use vilvona_conformance::check_tool_pairs;
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::*;
use vilvona_lossless::{LosslessConfig, LosslessEngine};
use vilvona_summarize::ExtractiveSummarizer;

use crate::support::*;

/// What OpenClaw 2026.9 puts around the engine's context at a 32k window: its system prompt
/// and tool list.
const HOST_OVERHEAD: u64 = 10_200;
const WINDOW: u64 = 32_000;

/// A summarizer that never produces anything usable (its output is longer than its source).
#[derive(Debug)]
struct NeverFits;

#[async_trait]
impl Summarizer for NeverFits {
    fn id(&self) -> &str {
        "never-fits"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Ok(Summary::new(request.source_text().repeat(2), request.level))
    }
}

/// A summarizer that is never reachable.
#[derive(Debug)]
struct Unreachable;

#[async_trait]
impl Summarizer for Unreachable {
    fn id(&self) -> &str {
        "unreachable"
    }

    async fn summarize(&self, _: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Err(SummarizeError::Transient(
            "503 from the provider".to_owned(),
        ))
    }
}

fn words(seed: usize, count: usize) -> String {
    const WORDS: [&str; 12] = [
        "trigger", "table", "index", "token", "snapshot", "retry", "endpoint", "module", "shard",
        "worker", "invoice", "backoff",
    ];
    (0..count)
        .map(|i| WORDS[(seed * 7 + i * 3) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One gateway turn as OpenClaw commits it: a ~900-token request, a `read` call on a
/// ~2,000-token file, a one-line answer. `usage` is what the provider counted for the two calls.
fn gateway_turn(n: usize, usage: Option<(u64, u64)>) -> Vec<AgentMessage> {
    let t = 1_796_211_287_905_i64 + n as i64 * 10_000;
    let with_usage = |mut value: Value, input: Option<u64>| {
        if let Some(input) = input {
            value["usage"] = json!({"input": input, "output": 40, "cacheRead": 0, "cacheWrite": 0});
        }
        message(value)
    };
    vec![
        message(
            json!({"role": "user", "content": format!("STEP-{n}: READ_FILE src/mod_{n:02}.py\n\n{}", words(n, 560)), "timestamp": t}),
        ),
        with_usage(
            json!({"role": "assistant", "content": [{"type": "toolCall", "id": format!("call_{n}"), "name": "read", "arguments": {"path": format!("src/mod_{n:02}.py")}}], "stopReason": "toolUse", "timestamp": t + 100}),
            usage.map(|(first, _)| first),
        ),
        message(
            json!({"role": "toolResult", "toolCallId": format!("call_{n}"), "toolName": "read", "content": [{"type": "text", "text": words(n + 1, 1_300)}], "isError": false, "timestamp": t + 200}),
        ),
        with_usage(
            json!({"role": "assistant", "content": [{"type": "text", "text": format!("Step {n} done.")}], "stopReason": "stop", "timestamp": t + 300}),
            usage.map(|(_, second)| second),
        ),
    ]
}

async fn assemble(engine: &LosslessEngine, session: &str, budget: u64) -> AssembleResult {
    engine
        .assemble(&AssembleParams {
            session_id: session.to_owned(),
            session_key: Some(format!("agent:main:{session}")),
            token_budget: Some(budget),
            runtime_settings: Some(RuntimeSettings {
                limits: Some(RuntimeLimits {
                    prompt_token_budget: Some(WINDOW),
                    ..RuntimeLimits::default()
                }),
                ..RuntimeSettings::default()
            }),
            ..AssembleParams::default()
        })
        .await
        .unwrap()
}

async fn commit(engine: &LosslessEngine, session: &str, n: usize, messages: Vec<AgentMessage>) {
    let result = engine
        .commit_turn(&CommitTurnParams {
            session_id: session.to_owned(),
            session_key: Some(format!("agent:main:{session}")),
            advancement_key: format!("turn-{n}"),
            messages,
            ..CommitTurnParams::default()
        })
        .await
        .unwrap();
    assert_eq!(result.status, CommitStatus::Committed);
}

/// Commits gateway turn `n` with the usage its provider reports: the host's `overhead` around
/// the engine's context, the whole counted as `counted` counts (the provider's tokens for what
/// the engine estimates). `edit` may change the turn after its usage is set. Returns the
/// estimated tokens of the turn's messages as generated.
async fn commit_with_usage(
    engine: &LosslessEngine,
    session: &str,
    n: usize,
    overhead: u64,
    counted: impl Fn(u64) -> u64,
    edit: impl FnOnce(&mut Vec<AgentMessage>),
) -> Vec<u64> {
    let before = context_tokens(engine, session).await;
    let tokens: Vec<u64> = gateway_turn(n, None)
        .iter()
        .map(|message| estimator().message_tokens(message))
        .collect();
    let first = overhead + before + tokens[0];
    let second = first + tokens[1] + tokens[2];
    let mut turn = gateway_turn(n, Some((counted(first), counted(second))));
    edit(&mut turn);
    commit(engine, session, n, turn).await;
    tokens
}

/// The host asks for room, as OpenClaw's preflight does: the window as budget, its count of
/// the whole prompt, the budget target.
async fn preflight(engine: &LosslessEngine, session: &str, current: u64) -> CompactResult {
    engine
        .compact(&CompactParams {
            session_id: session.to_owned(),
            session_key: Some(format!("agent:main:{session}")),
            token_budget: Some(WINDOW),
            force: true,
            current_token_count: Some(current),
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap()
}

async fn context_tokens(engine: &LosslessEngine, session: &str) -> u64 {
    let conversation = engine.conversation(session, None).await.unwrap();
    engine
        .store()
        .context_refs(conversation.id)
        .await
        .unwrap()
        .iter()
        .map(|item| item.tokens)
        .sum()
}

/// The session that wedged at turn 7: OpenClaw's defaults (a 64-message fresh tail covers every
/// turn), assemble told 31k although 10k of the window is the host's own, and every preflight
/// compaction answered `no_progress`. Now each answer makes room or says the room is there, and
/// the whole prompt fits the window after each.
#[tokio::test]
async fn the_gateway_session_that_wedged_makes_room_at_every_preflight() {
    for summarizer in [
        Arc::new(NeverFits) as Arc<dyn Summarizer>,
        Arc::new(Unreachable),
        Arc::new(ExtractiveSummarizer::new(estimator())),
    ] {
        let dir = TempDir::new().unwrap();
        let engine = engine_in(&dir, LosslessConfig::default(), summarizer.clone()).await;
        for n in 1..=12 {
            assemble(&engine, "wedge", 31_075).await;
            // The capture's turns reported no usable usage: the engine learns the host's
            // overhead only from the preflight's count.
            commit(&engine, "wedge", n, gateway_turn(n, None)).await;
            let whole = HOST_OVERHEAD + context_tokens(&engine, "wedge").await;
            if whole < WINDOW * 3 / 4 {
                continue;
            }
            let result = preflight(&engine, "wedge", whole).await;
            let reason = result.reason.clone().unwrap();
            assert!(
                result.compacted || reason == CompactReason::AlreadyCompacted,
                "{summarizer:?}, turn {n}: {reason} {:?}",
                result.result
            );
            let after = HOST_OVERHEAD + context_tokens(&engine, "wedge").await;
            assert!(after <= WINDOW, "{summarizer:?}, turn {n}: {after} tokens");
        }
        let report = engine.store().integrity_check().await.unwrap();
        assert!(report.is_healthy(), "{:?}", report.problems);
    }
}

/// With the turn's reported usage, the engine knows the host's overhead and compacts in
/// `commitTurn` before the host would ask: no preflight is ever needed, and the whole prompt
/// stays under the host's threshold (three quarters of the window).
#[tokio::test]
async fn with_the_reported_usage_the_whole_prompt_stays_under_the_hosts_threshold() {
    let dir = TempDir::new().unwrap();
    let engine = engine_in(
        &dir,
        LosslessConfig::default(),
        Arc::new(ExtractiveSummarizer::new(estimator())),
    )
    .await;
    for n in 1..=30 {
        // OpenClaw's first assembly of a turn: its message budget (the window less its reserve
        // and a fifth more than its system prompt).
        assemble(&engine, "usage", 10_700).await;
        let tokens =
            commit_with_usage(&engine, "usage", n, HOST_OVERHEAD, |tokens| tokens, |_| {}).await;
        let next_prompt = HOST_OVERHEAD + context_tokens(&engine, "usage").await + tokens[0];
        assert!(
            next_prompt < WINDOW * 3 / 4,
            "turn {n}: the next prompt would be {next_prompt} tokens"
        );
    }
}

/// Providers count differently from the engine's estimate (characters / 4): a tokenizer on
/// code gives ~3 characters a token, prose ~4.5, and the tool schemas count too. Whatever the
/// ratio, the overhead is learned from the provider's own count and the whole prompt, as the
/// provider counts it, stays within the window turn after turn (no ratchet shrinks it to
/// nothing either: the context keeps room for a turn).
#[tokio::test]
async fn the_whole_prompt_fits_whatever_the_providers_count() {
    for chars_per_token in [3.0_f64, 4.0, 4.5] {
        let dir = TempDir::new().unwrap();
        let engine = engine_in(
            &dir,
            LosslessConfig::default(),
            Arc::new(ExtractiveSummarizer::new(estimator())),
        )
        .await;
        // The provider's count of what the engine estimates as `tokens`.
        let counted = |tokens: u64| (tokens as f64 * 4.0 / chars_per_token) as u64;
        let session = "ratio";
        for n in 1..=30 {
            assemble(&engine, session, 10_700).await;
            let tokens =
                commit_with_usage(&engine, session, n, HOST_OVERHEAD, counted, |_| {}).await;
            let context = context_tokens(&engine, session).await;
            let next_prompt = counted(HOST_OVERHEAD + context + tokens[0]);
            assert!(
                next_prompt <= WINDOW,
                "{chars_per_token} characters a token, turn {n}: the next prompt would be {next_prompt} tokens"
            );
            assert!(
                n < 4 || context > 2_000,
                "{chars_per_token} characters a token, turn {n}: the context was starved to {context} tokens"
            );
        }
    }
}

/// At a 16k window OpenClaw's own prompt leaves ~5.5k tokens: a turn that ends in an 8k-token
/// tool output was a newest unit no compaction could fit (`no_progress`: large content moved
/// out only above 25k tokens). Now the output is kept whole in the store, recallable, and the
/// context holds its reference; the host's request for room is met.
#[tokio::test]
async fn a_tool_output_larger_than_the_room_is_kept_aside_so_compaction_fits() {
    const SMALL_WINDOW: u64 = 16_000;
    let dir = TempDir::new().unwrap();
    let engine = engine_in(
        &dir,
        LosslessConfig::default(),
        Arc::new(ExtractiveSummarizer::new(estimator())),
    )
    .await;
    let session = "small";
    for n in 1..=3 {
        assemble(&engine, session, 1).await;
        commit_with_usage(&engine, session, n, 10_500, |tokens| tokens, |turn| {
            if n == 3 {
                // The last turn reads a file about twice the room and ends in its output (the
                // host asks for room inside its tool loop): the output is part of the newest
                // unit, which compaction never folds.
                turn[2] = message(
                    json!({"role": "toolResult", "toolCallId": "call_3", "toolName": "read", "content": [{"type": "text", "text": format!("{} the kestrel ledger closes here", words(9, 6_000))}], "isError": false, "timestamp": 1_796_211_318_105_i64}),
                );
                turn.truncate(3);
            }
        })
        .await;
    }
    let result = engine
        .compact(&CompactParams {
            session_id: session.to_owned(),
            session_key: Some(format!("agent:main:{session}")),
            token_budget: Some(SMALL_WINDOW),
            force: true,
            current_token_count: Some(10_500 + context_tokens(&engine, session).await),
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap();
    let reason = result.reason.clone().unwrap();
    assert_ne!(reason, CompactReason::NoProgress, "{:?}", result.result);
    let after = context_tokens(&engine, session).await;
    assert!(after + 10_500 <= SMALL_WINDOW, "{after} tokens of context");
    // The whole output is kept and found.
    let hits = engine
        .call_tool(
            &vilvona_core::admin::ToolCaller::new(session, Some(format!("agent:main:{session}"))),
            "vilvona_grep",
            &json!({"query": "kestrel ledger"}),
        )
        .await
        .unwrap();
    assert!(hits.to_string().contains("kestrel"), "{hits}");
}

/// A one-word answer at the oldest point after the summaries: its summary, header and all,
/// would be larger than it, so a pass over it alone can make no progress. Compaction takes it
/// with more, or leaves it.
#[tokio::test]
async fn a_short_unit_after_the_summaries_does_not_stall_compaction() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history = Vec::new();
    for n in 0..6 {
        history.push(message(
            json!({"role": "user", "content": "ok", "timestamp": 1_772_442_351_000_i64 + n}),
        ));
        history.extend(turn(n as usize));
    }
    commit(&engine, "short", 0, history).await;
    let result = engine
        .compact(&CompactParams {
            session_id: "short".to_owned(),
            session_key: Some("agent:main:short".to_owned()),
            token_budget: Some(1_500),
            force: true,
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap();
    assert!(result.compacted, "{result:?}");
    assert!(context_tokens(&engine, "short").await <= 1_500);
}

#[derive(Clone, Debug)]
enum Writer {
    Extractive,
    NeverFits,
    Unreachable,
}

/// A turn of the property: a request, tool calls with results, an answer; sizes in words.
#[derive(Clone, Debug)]
struct Shape {
    request: usize,
    results: Vec<usize>,
    answer: usize,
}

fn shape() -> impl Strategy<Value = Shape> {
    let size = prop_oneof![Just(1usize), Just(12), Just(150), Just(900), Just(3_000)];
    (
        size.clone(),
        prop::collection::vec(size.clone(), 0..3),
        size,
    )
        .prop_map(|(request, results, answer)| Shape {
            request,
            results,
            answer,
        })
}

fn shaped_turn(n: usize, shape: &Shape) -> Vec<AgentMessage> {
    let t = 1_772_442_351_000_i64 + n as i64 * 60_000;
    let mut out = vec![message(
        json!({"role": "user", "content": words(n, shape.request), "timestamp": t}),
    )];
    for (call, size) in shape.results.iter().enumerate() {
        let id = format!("c{n}-{call}");
        out.push(message(json!({"role": "assistant", "content": [{"type": "toolCall", "id": id, "name": "exec", "arguments": {"n": call}}], "timestamp": t + 1})));
        out.push(message(json!({"role": "toolResult", "toolCallId": id, "toolName": "exec", "content": [{"type": "text", "text": words(n + call, *size)}], "timestamp": t + 2})));
    }
    out.push(message(
        json!({"role": "assistant", "content": [{"type": "text", "text": words(n + 5, shape.answer)}], "timestamp": t + 3}),
    ));
    out
}

async fn overflow_case(turns: Vec<Shape>, writer: Writer, budget_share: f64) {
    let dir = TempDir::new().unwrap();
    let summarizer: Arc<dyn Summarizer> = match writer {
        Writer::Extractive => Arc::new(ExtractiveSummarizer::new(estimator())),
        Writer::NeverFits => Arc::new(NeverFits),
        Writer::Unreachable => Arc::new(Unreachable),
    };
    // The engine's defaults, and a budget nothing reaches while the turns are stored.
    let config = LosslessConfig {
        default_token_budget: 100_000_000,
        ..LosslessConfig::default()
    };
    let engine = engine_in(&dir, config, summarizer).await;
    for (n, shape) in turns.iter().enumerate() {
        commit(&engine, "p", n, shaped_turn(n, shape)).await;
    }
    let conversation = engine.conversation("p", None).await.unwrap();
    let refs = engine.store().context_refs(conversation.id).await.unwrap();
    let total: u64 = refs.iter().map(|item| item.tokens).sum();
    let mut newest = refs.len() - 1;
    while newest > 0 && refs[newest].continues_unit {
        newest -= 1;
    }
    let newest_tokens: u64 = refs[newest..].iter().map(|item| item.tokens).sum();
    // Room for the newest unit and one summary beside it (a summary's wrapper is ~70 tokens).
    let floor = newest_tokens + 120;
    let budget = floor + ((total.saturating_sub(floor)) as f64 * budget_share) as u64;
    let result = engine
        .compact(&CompactParams {
            session_id: "p".to_owned(),
            session_key: Some("agent:main:p".to_owned()),
            token_budget: Some(budget),
            force: true,
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap();
    let after = context_tokens(&engine, "p").await;
    assert!(
        after <= budget,
        "{after} > {budget} (newest unit {newest_tokens}, before {total}): {result:?}"
    );
    assert_ne!(result.reason, Some(CompactReason::NoProgress), "{result:?}");
    let report = engine.store().integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{:?}", report.problems);
    let assembled = assemble(&engine, "p", budget).await;
    assert_eq!(assembled.prompt_authority, PromptAuthority::Assembled);
    check_tool_pairs(&assembled.messages).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// For any context and any budget the newest unit fits in (with a summary beside it),
    /// overflow compaction returns a context within the budget, whatever the summarizer does.
    #[test]
    fn overflow_compaction_always_fits_a_budget_the_newest_unit_fits(
        turns in prop::collection::vec(shape(), 1..10),
        writer in prop_oneof![Just(Writer::Extractive), Just(Writer::NeverFits), Just(Writer::Unreachable)],
        budget_share in 0.0f64..1.0,
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(overflow_case(turns, writer, budget_share));
    }
}

/// A case the property found (CI, round 3): a 3,000-word request with a one-word tool result
/// and a one-word answer after it, at the smallest budget the property allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_long_request_before_a_one_word_answer_still_fits() {
    let shape = |request, results: &[usize], answer| Shape {
        request,
        results: results.to_vec(),
        answer,
    };
    overflow_case(
        vec![
            shape(3_000, &[150], 1),
            shape(900, &[], 900),
            shape(150, &[150], 3_000),
            shape(3_000, &[1], 1),
        ],
        Writer::Extractive,
        0.0,
    )
    .await;
}
