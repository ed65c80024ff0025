//! Incremental compaction, assembly and recall on the embedded store.

use serde_json::json;
use tempfile::TempDir;
use vilvona_conformance::check_tool_pairs;
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_lossless::{CompactionRequest, LosslessEngine, RECALL_GUIDANCE, ToolCaller};
use vilvona_transcript::{SessionHeader, TranscriptWriter};

use crate::support::*;

async fn drive(
    engine: &LosslessEngine,
    session: &str,
    turns: std::ops::Range<usize>,
    budget: u64,
) -> Vec<AgentMessage> {
    let mut history = Vec::new();
    for index in turns {
        let pre = history.len();
        history.extend(turn(index));
        engine
            .after_turn(&AfterTurnParams {
                session_id: session.to_owned(),
                session_key: Some(format!("agent:main:{session}")),
                messages: history.clone().into(),
                pre_prompt_message_count: pre,
                token_budget: Some(budget),
                ..AfterTurnParams::default()
            })
            .await
            .unwrap();
    }
    history
}

async fn assemble(
    engine: &LosslessEngine,
    session: &str,
    budget: u64,
    tools: &[&str],
) -> AssembleResult {
    engine
        .assemble(&AssembleParams {
            session_id: session.to_owned(),
            session_key: Some(format!("agent:main:{session}")),
            token_budget: Some(budget),
            available_tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            ..AssembleParams::default()
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn compaction_keeps_the_context_under_budget_and_everything_reachable() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let budget = 4_000;
    let mut max_estimate = 0;
    for round in 0..6 {
        drive(&engine, "s1", round * 5..round * 5 + 5, budget).await;
        let assembled = assemble(&engine, "s1", budget, &[]).await;
        assert!(
            assembled.estimated_tokens <= budget,
            "{} > {budget}",
            assembled.estimated_tokens
        );
        assert_eq!(assembled.prompt_authority, PromptAuthority::Assembled);
        check_tool_pairs(&assembled.messages).unwrap();
        max_estimate = max_estimate.max(assembled.estimated_tokens);
        let report = engine.store().integrity_check().await.unwrap();
        assert!(report.is_healthy(), "{:?}", report.problems);
    }
    let conversation = engine.conversation("s1", None).await.unwrap();
    let items = engine.store().context(conversation.id).await.unwrap();
    let depths: Vec<u32> = items
        .iter()
        .filter_map(|item| match &item.content {
            vilvona_store::ItemContent::Summary(summary) => Some(summary.depth),
            _ => None,
        })
        .collect();
    assert!(!depths.is_empty(), "summaries exist");
    assert!(
        depths.iter().any(|d| *d >= 1),
        "condensed summaries exist: {depths:?}"
    );
    // 30 turns × 4 messages stored, none lost.
    let row = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.message_count, 120);
    assert!(max_estimate > budget / 2);
}

/// Compaction takes a run's messages from what the engine keeps rendered when it can, and from
/// the store otherwise: both give the same summaries. One engine ingested the turns (all of
/// them rendered); the other was opened afterwards on a copy (nothing rendered).
#[tokio::test]
async fn a_run_read_from_memory_is_summarized_as_one_read_from_the_store() {
    let (warm_dir, cold_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let warm = engine(&warm_dir).await;
    let cold = engine(&cold_dir).await;
    // A budget nothing exceeds: the turns are stored, not compacted.
    drive(&warm, "s1", 0..24, 1_000_000).await;
    drive(&cold, "s1", 0..24, 1_000_000).await;
    drop(cold);
    let cold = engine(&cold_dir).await;
    let mut summaries = Vec::new();
    for engine in [&warm, &cold] {
        let conversation = engine.conversation("s1", None).await.unwrap();
        let report = engine
            .compact_conversation(conversation.id, CompactionRequest::forced(4_000))
            .await
            .unwrap();
        assert!(report.summaries_created > 0, "{report:?}");
        summaries.push(
            context_summaries(engine, "s1", None)
                .await
                .into_iter()
                .map(|summary| {
                    (
                        summary.content,
                        summary.tokens,
                        summary.earliest_at_ms,
                        summary.latest_at_ms,
                        summary.first_seq,
                        summary.last_seq,
                    )
                })
                .collect::<Vec<_>>(),
        );
    }
    assert!(warm.cached_sessions().rendered_items > 0);
    assert_eq!(summaries[0], summaries[1]);
}

/// What a summary replaced leaves the engine's memory too: every rendered item it keeps is in
/// the context.
#[tokio::test]
async fn rendered_items_leave_memory_with_the_context() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    for round in 0..6 {
        drive(&engine, "s1", round * 5..round * 5 + 5, 4_000).await;
        assemble(&engine, "s1", 4_000, &[]).await;
    }
    let conversation = engine.conversation("s1", None).await.unwrap();
    let items = engine.store().context(conversation.id).await.unwrap();
    let cached = engine.cached_sessions();
    assert!(
        items.len() < 120,
        "the run compacted: {} items",
        items.len()
    );
    assert!(cached.rendered_items > 0, "{cached:?}");
    assert!(
        cached.rendered_items <= items.len(),
        "{cached:?} for {} items in the context",
        items.len()
    );
}

#[tokio::test]
async fn an_unchanged_context_assembles_byte_identically_and_offers_recall_guidance() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    drive(&engine, "s1", 0..12, 4_000).await;
    let first = assemble(&engine, "s1", 4_000, &[]).await;
    let second = assemble(&engine, "s1", 4_000, &[]).await;
    assert_eq!(
        serde_json::to_string(&first).unwrap(),
        serde_json::to_string(&second).unwrap()
    );
    assert!(first.system_prompt_addition.is_none());
    let text = first.messages[0].plain_text();
    assert!(text.starts_with("<summary id=\"sum_"), "{text}");
    assert!(text.contains("Call vilvona_expand with id"), "{text}");
    let with_tools = assemble(&engine, "s1", 4_000, &["vilvona_grep", "exec"]).await;
    assert_eq!(
        with_tools.system_prompt_addition.as_deref(),
        Some(RECALL_GUIDANCE)
    );
}

#[tokio::test]
async fn recall_finds_a_compacted_fact_and_expansion_reaches_it() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history = drive(&engine, "s1", 0..3, 4_000).await;
    let fact = message(
        json!({"role": "user", "content": "Please remember: the deploy key for staging is KEY-4471 and Mei Tanaka owns it.", "timestamp": 1_772_442_999_000_i64}),
    );
    engine
        .after_turn(&AfterTurnParams {
            session_id: "s1".to_owned(),
            session_key: Some("agent:main:s1".to_owned()),
            messages: {
                history.push(fact.clone());
                history.clone().into()
            },
            pre_prompt_message_count: history.len() - 1,
            token_budget: Some(4_000),
            ..AfterTurnParams::default()
        })
        .await
        .unwrap();
    drive(&engine, "s1", 3..20, 4_000).await;
    let assembled = assemble(&engine, "s1", 4_000, &[]).await;
    assert!(
        !assembled.messages.contains(&fact),
        "the raw message was compacted"
    );
    assert!(
        assembled
            .messages
            .iter()
            .any(|m| m.plain_text().starts_with("<summary") && m.plain_text().contains("KEY-4471")),
        "the extractive summary kept the remember-note"
    );

    let caller = ToolCaller {
        session_id: "s1".to_owned(),
        session_key: Some("agent:main:s1".to_owned()),
    };
    let found = engine
        .call_tool(
            &caller,
            "vilvona_grep",
            &json!({"query": "deploy key staging", "scope": "messages"}),
        )
        .await
        .unwrap();
    let hit = &found["results"][0];
    assert!(
        hit["snippet"].as_str().unwrap().contains("«KEY-4471»"),
        "{found}"
    );
    let covered_by = hit["coveredBy"].as_str().unwrap().to_owned();
    // Expand from the covering summary down to the message.
    let mut frontier = vec![covered_by];
    let mut reached = false;
    while let Some(id) = frontier.pop() {
        let mut cursor = json!(null);
        loop {
            let expanded = engine
                .call_tool(
                    &caller,
                    "vilvona_expand",
                    &json!({"id": id, "cursor": cursor}),
                )
                .await
                .unwrap();
            for item in expanded["items"].as_array().unwrap() {
                if item["kind"] == "summary" {
                    frontier.push(item["id"].as_str().unwrap().to_owned());
                } else if item["text"].as_str().unwrap().contains("KEY-4471") {
                    reached = true;
                }
            }
            if expanded["nextCursor"].is_null() {
                break;
            }
            cursor = expanded["nextCursor"].clone();
        }
    }
    assert!(reached, "expansion reaches the message");
    let described = engine
        .call_tool(&caller, "vilvona_describe", &json!({"id": hit["id"]}))
        .await
        .unwrap();
    assert!(described["text"].as_str().unwrap().contains("KEY-4471"));
    let regex = engine
        .call_tool(
            &caller,
            "vilvona_grep",
            &json!({"query": "KEY-\\d{4}", "mode": "regex"}),
        )
        .await
        .unwrap();
    assert!(!regex["results"].as_array().unwrap().is_empty());
    let bad = engine
        .call_tool(
            &caller,
            "vilvona_grep",
            &json!({"query": "x", "mode": "fuzzy"}),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("mode \"fuzzy\""), "{bad}");
    assert!(
        bad.to_string()
            .contains("mode \"fuzzy\": use text, phrase, regex, semantic or hybrid"),
        "{bad}"
    );
    let bad_scope = engine
        .call_tool(
            &caller,
            "vilvona_grep",
            &json!({"query": "x", "scope": "files"}),
        )
        .await
        .unwrap_err();
    assert!(
        bad_scope
            .to_string()
            .contains("scope \"files\": use messages, summaries or both"),
        "{bad_scope}"
    );
}

#[tokio::test]
async fn large_tool_output_is_stored_once_and_shown_by_reference() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let log: String = (0..3_000)
        .map(|i| {
            if i == 1_234 {
                "error[E0502]: cannot borrow `cache` as mutable\n".to_owned()
            } else {
                format!("test case_{i} ... ok\n")
            }
        })
        .collect();
    let result = message(
        json!({"role": "toolResult", "toolCallId": "c1", "toolName": "exec", "content": [{"type": "text", "text": log}], "timestamp": 5}),
    );
    let call = message(
        json!({"role": "assistant", "content": [{"type": "toolCall", "id": "c1", "name": "exec", "arguments": {"command": "cargo test"}}], "timestamp": 4}),
    );
    engine
        .ingest_batch(&IngestBatchParams {
            session_id: "s1".to_owned(),
            messages: vec![
                message(json!({"role": "user", "content": "run the tests", "timestamp": 3})),
                call,
                result,
            ],
            ..IngestBatchParams::default()
        })
        .await
        .unwrap();
    let assembled = assemble(&engine, "s1", 100_000, &[]).await;
    let shown = assembled.messages[2].plain_text();
    assert!(
        shown.starts_with("[Large content stored as file_"),
        "{shown}"
    );
    assert!(
        shown.contains("log (") && shown.contains("error[E0502]: cannot borrow `cache` as mutable"),
        "{shown}"
    );
    assert!(assembled.estimated_tokens < 1_000);
    let id = shown
        .split_whitespace()
        .nth(4)
        .unwrap()
        .trim_end_matches(':')
        .to_owned();
    let caller = ToolCaller {
        session_id: "s1".to_owned(),
        session_key: None,
    };
    let described = engine
        .call_tool(
            &caller,
            "vilvona_describe",
            &json!({"id": id, "lines": "1235-1236"}),
        )
        .await
        .unwrap();
    assert_eq!(
        described["content"],
        "error[E0502]: cannot borrow `cache` as mutable\ntest case_1235 ... ok"
    );
    assert_eq!(described["lines"], 3_000);
}

#[tokio::test]
async fn bootstrap_imports_once_and_then_only_what_was_appended() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let path = dir.path().join("s1.jsonl");
    let mut writer =
        TranscriptWriter::create(&path, &SessionHeader::new("s1", "t".to_owned())).unwrap();
    for index in 0..5 {
        for message in turn(index) {
            writer.append_message(&message, "t".to_owned()).unwrap();
        }
    }
    writer.sync().unwrap();
    let params = BootstrapParams {
        session_id: "s1".to_owned(),
        session_key: None,
        session_file: Some(path.to_string_lossy().into_owned()),
    };
    let first = engine.bootstrap(&params).await.unwrap();
    assert_eq!(first.imported_messages, Some(20));
    assert_eq!(
        engine.bootstrap(&params).await.unwrap().imported_messages,
        Some(0)
    );
    for message in turn(5) {
        writer.append_message(&message, "t".to_owned()).unwrap();
    }
    writer.sync().unwrap();
    assert_eq!(
        engine.bootstrap(&params).await.unwrap().imported_messages,
        Some(4)
    );
}

#[tokio::test]
async fn a_long_tool_loop_in_one_turn_is_compacted_instead_of_overflowing() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut messages = vec![message(
        json!({"role": "user", "content": "fix every failing test", "timestamp": 1}),
    )];
    for step in 0..40 {
        messages.push(message(json!({"role": "assistant", "content": [{"type": "toolCall", "id": format!("c{step}"), "name": "exec", "arguments": {"command": format!("cargo test case_{step}")}}], "timestamp": 2 + step * 2})));
        messages.push(message(json!({"role": "toolResult", "toolCallId": format!("c{step}"), "toolName": "exec", "content": [{"type": "text", "text": format!("case_{step} failed: {}", "assertion detail ".repeat(30))}], "timestamp": 3 + step * 2})));
    }
    engine
        .after_turn(&AfterTurnParams {
            session_id: "loop".to_owned(),
            messages: messages.into(),
            pre_prompt_message_count: 0,
            token_budget: Some(4_000),
            ..AfterTurnParams::default()
        })
        .await
        .unwrap();
    let assembled = assemble(&engine, "loop", 4_000, &[]).await;
    assert!(
        assembled.estimated_tokens <= 4_000,
        "{}",
        assembled.estimated_tokens
    );
    assert_eq!(assembled.prompt_authority, PromptAuthority::Assembled);
    check_tool_pairs(&assembled.messages).unwrap();
}

#[tokio::test]
async fn compact_reports_honestly() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    drive(&engine, "s1", 0..2, 100_000).await;
    let params = CompactParams {
        session_id: "s1".to_owned(),
        token_budget: Some(100_000),
        ..CompactParams::default()
    };
    let result = engine.compact(&params).await.unwrap();
    assert!(result.ok && !result.compacted);
    assert_eq!(result.reason, Some(CompactReason::BelowThreshold));
    // Forced, with everything inside the fresh tail: nothing to compact.
    let forced = engine
        .compact(&CompactParams {
            force: true,
            ..params.clone()
        })
        .await
        .unwrap();
    assert!(!forced.compacted);
    assert_eq!(forced.reason, Some(CompactReason::NoCandidate));
    // Overflow recovery (the budget target) may summarize the fresh tail, all but its newest
    // unit: the provider refused the prompt.
    let recovery = engine
        .compact(&CompactParams {
            session_id: "s2".to_owned(),
            token_budget: Some(100_000),
            force: true,
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap();
    assert!(
        !recovery.compacted,
        "an empty session has nothing to summarize"
    );
    drive(&engine, "s2", 0..2, 100_000).await;
    let recovery = engine
        .compact(&CompactParams {
            session_id: "s2".to_owned(),
            token_budget: Some(100_000),
            force: true,
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap();
    assert!(recovery.compacted, "{recovery:?}");
    drive(&engine, "s1", 2..12, 100_000).await;
    let forced = engine
        .compact(&CompactParams {
            force: true,
            ..params
        })
        .await
        .unwrap();
    assert!(forced.compacted, "{forced:?}");
    let details = forced.result.unwrap();
    assert!(details.tokens_after.unwrap() < details.tokens_before);
}

/// `vilvona_expand_query` offline: grep, read what the hits cover, and answer extractively with
/// the id of the message that holds the fact, after the fact was folded into summaries.
#[tokio::test]
async fn a_question_is_answered_from_history_with_citations() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let conversation = engine.conversation("q", Some("q")).await.unwrap();
    let fact = "Please remember: the release signing key rotation is tracked in OPS-77123 and Amara Osei owns it.";
    for index in 0..30 {
        let mut messages = turn(index);
        if index == 5 {
            messages.insert(
                1,
                message(json!({"role": "user", "content": fact, "timestamp": 1_772_442_351_500_i64 + index as i64 * 60_000})),
            );
        }
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: "q".to_owned(),
                session_key: Some("q".to_owned()),
                messages,
                ..IngestBatchParams::default()
            })
            .await
            .unwrap();
        engine
            .compact_conversation(conversation.id, CompactionRequest::routine(4_000))
            .await
            .unwrap();
    }
    let caller = ToolCaller {
        session_id: "q".to_owned(),
        session_key: Some("q".to_owned()),
    };
    let found = engine
        .call_tool(
            &caller,
            "vilvona_grep",
            &json!({"query": "signing key rotation", "mode": "phrase"}),
        )
        .await
        .unwrap();
    let fact_id = found["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|hit| hit["kind"] == "message")
        .unwrap()["id"]
        .clone();
    assert!(
        found["results"][0]["coveredBy"].is_string(),
        "the fact was compacted: {found}"
    );
    let answered = engine
        .call_tool(
            &caller,
            "vilvona_expand_query",
            &json!({"query": "signing key rotation", "question": "Who owns the signing key rotation?", "tokenCap": 2000}),
        )
        .await
        .unwrap();
    assert!(
        answered["answer"]
            .as_str()
            .unwrap()
            .contains("Amara Osei owns it"),
        "{answered}"
    );
    assert_eq!(answered["citations"], json!([fact_id]), "{answered}");
    assert_eq!(answered["answeredBy"], "extractive/v1");
    assert!(answered["tokens"].as_u64().unwrap() <= 2_000);
    let refused = engine
        .call_tool(&caller, "vilvona_expand_query", &json!({"query": "x"}))
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "invalid arguments: question is required"
    );
}

/// A long-running engine that sees many sessions keeps a bounded amount of their state (by
/// estimated bytes): the least recently assembled contexts go first, and a session whose state
/// went is rebuilt from the store, whole.
#[tokio::test]
async fn per_session_state_stays_bounded_across_many_sessions() {
    let dir = TempDir::new().unwrap();
    let engine = engine_in(
        &dir,
        vilvona_lossless::LosslessConfig {
            default_token_budget: 1_000_000,
            ..small_config()
        },
        std::sync::Arc::new(vilvona_summarize::ExtractiveSummarizer::new(estimator())),
    )
    .await;
    let session = |n: usize| format!("s{n}");
    // Each session's context is about 200 × 500 tokens (~400 KB of text): 60 of them hold
    // ~24 MB, past the 16 MiB the engine keeps.
    let filler = "lorem ipsum ".repeat(160);
    for n in 0..60 {
        let messages = (0..200)
            .map(|i| message(json!({"role": "user", "content": format!("session {n} note {i} {filler}"), "timestamp": i})))
            .collect();
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: session(n),
                messages,
                ..IngestBatchParams::default()
            })
            .await
            .unwrap();
        let assembled = assemble(&engine, &session(n), 1_000_000, &[]).await;
        assert_eq!(assembled.messages.len(), 200);
    }
    let cached = engine.cached_sessions();
    assert!(cached.assembled_bytes <= 16 << 20, "{cached:?}");
    assert!(cached.rendered_bytes <= 16 << 20, "{cached:?}");
    assert!(cached.assemblies < 60, "{cached:?}");
    // The first session's assembly was let go; it is rebuilt from the store.
    let again = assemble(&engine, &session(0), 1_000_000, &[]).await;
    assert_eq!(again.messages.len(), 200);
    assert!(
        again.messages[199]
            .plain_text()
            .contains("session 0 note 199")
    );
}

/// A date the question names selects what was written then: the June message answers "in
/// June 2026", whichever message the words alone rank first, and the answer says which span it
/// read. Times the caller gives, or a phrase, are taken as they are.
#[tokio::test]
async fn a_date_the_question_names_selects_what_was_written_then() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let said = |text: &str, time: &str| {
        let ms = vilvona_summarize::parse_rfc3339(time).unwrap();
        message(json!({"role": "user", "content": text, "timestamp": ms}))
    };
    let history = vec![
        said(
            "We picked the blue paint for the kitchen walls, the paint we picked first.",
            "2026-05-03T10:00:00Z",
        ),
        said(
            "We picked the green paint for the bedroom.",
            "2026-06-10T10:00:00Z",
        ),
        said(
            "The fence got the paint we picked, the paint we picked last year.",
            "2026-07-01T10:00:00Z",
        ),
    ];
    engine
        .after_turn(&AfterTurnParams {
            session_id: "s1".to_owned(),
            session_key: Some("agent:main:s1".to_owned()),
            messages: history.into(),
            pre_prompt_message_count: 0,
            token_budget: Some(4_000),
            ..AfterTurnParams::default()
        })
        .await
        .unwrap();
    let caller = ToolCaller {
        session_id: "s1".to_owned(),
        session_key: Some("agent:main:s1".to_owned()),
    };
    let grep = |arguments: serde_json::Value| {
        let (engine, caller) = (&engine, &caller);
        async move {
            engine
                .call_tool(caller, "vilvona_grep", &arguments)
                .await
                .unwrap()
        }
    };
    let first =
        |found: &serde_json::Value| found["results"][0]["snippet"].as_str().unwrap().to_owned();
    for mode in ["text", "hybrid"] {
        let undated = grep(json!({"query": "Which paint did we pick?", "mode": mode})).await;
        assert!(
            !first(&undated).contains("green"),
            "{mode}: the words alone already rank June first: {undated}"
        );
        assert!(undated.get("dated").is_none());
        let dated =
            grep(json!({"query": "Which paint did we pick in June 2026?", "mode": mode})).await;
        assert!(first(&dated).contains("green"), "{mode}: {dated}");
        assert_eq!(
            dated["dated"],
            json!({"said": "June 2026", "since": "2026-06-01T00:00:00Z", "before": "2026-07-01T00:00:00Z", "hits": 1}),
            "{mode}"
        );
        // The other hits follow.
        assert_eq!(
            dated["results"].as_array().unwrap().len(),
            3,
            "{mode}: {dated}"
        );
    }
    // The caller's own times are taken as they are; so is a phrase.
    let chosen =
        grep(json!({"query": "paint in June 2026", "since": "2026-07-01T00:00:00Z"})).await;
    assert!(chosen.get("dated").is_none());
    let phrase = grep(json!({"query": "paint in June 2026", "mode": "phrase"})).await;
    assert!(phrase.get("dated").is_none());
}
