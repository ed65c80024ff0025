//! Scope: agents, conversations, subagent grants.

use std::sync::Arc;

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::clock::{Clock, ManualClock, SystemClock};
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_lossless::{CompactionRequest, LosslessConfig, LosslessEngine, ToolCaller, ToolError};
use vilvona_store::{HistoryStore, Store, StoreConfig};
use vilvona_summarize::ExtractiveSummarizer;

use crate::support::*;

async fn say(engine: &LosslessEngine, session: &str, key: &str, text: &str, at: i64) {
    engine
        .ingest(&IngestParams {
            session_id: session.to_owned(),
            session_key: Some(key.to_owned()),
            message: message(json!({"role": "user", "content": text, "timestamp": at})),
            entry_id: None,
            is_heartbeat: false,
        })
        .await
        .unwrap();
}

fn caller(session: &str, key: &str) -> ToolCaller {
    ToolCaller {
        session_id: session.to_owned(),
        session_key: Some(key.to_owned()),
    }
}

async fn hits(engine: &LosslessEngine, caller: &ToolCaller, query: &str) -> usize {
    engine
        .call_tool(
            caller,
            "vilvona_grep",
            &json!({"query": query, "mode": "phrase"}),
        )
        .await
        .unwrap()["results"]
        .as_array()
        .unwrap()
        .len()
}

fn with_agent(
    store: &Arc<dyn HistoryStore>,
    agent: &str,
    configure: impl FnOnce(&mut LosslessConfig),
) -> LosslessEngine {
    let mut config = small_config();
    config.agent_id = agent.to_owned();
    configure(&mut config);
    LosslessEngine::new(
        store.clone(),
        Arc::new(ExtractiveSummarizer::new(estimator())),
        estimator(),
        config,
    )
}

#[tokio::test]
async fn agents_and_conversations_are_isolated_unless_configured() {
    let dir = TempDir::new().unwrap();
    let store: Arc<dyn HistoryStore> =
        Arc::new(Store::open(StoreConfig::new(dir.path())).await.unwrap());
    let main = with_agent(&store, "main", |_| {});
    let ops = with_agent(&store, "ops", |_| {});
    say(
        &ops,
        "o1",
        "agent:ops:o1",
        "the ops pager rotation secret is PAGER-77",
        1,
    )
    .await;
    say(
        &main,
        "s1",
        "agent:main:s1",
        "the main agent notes the parser cache warmup",
        2,
    )
    .await;
    say(
        &main,
        "s2",
        "agent:main:s2",
        "another conversation mentions the billing export",
        3,
    )
    .await;
    say(
        &main,
        "s0",
        "agent:main:s1",
        "an earlier session of s1 chose WAL checkpoints",
        0,
    )
    .await;

    let s1 = caller("s1", "agent:main:s1");
    assert_eq!(
        hits(&main, &s1, "pager rotation secret").await,
        0,
        "another agent: never"
    );
    assert_eq!(
        hits(&main, &s1, "billing export").await,
        0,
        "another conversation: not by default"
    );
    assert_eq!(
        hits(&main, &s1, "WAL checkpoints").await,
        1,
        "an earlier session under the same key: yes"
    );
    assert_eq!(hits(&main, &s1, "parser cache warmup").await, 1);

    let wide = with_agent(&store, "main", |config| {
        config.recall_all_conversations = true
    });
    assert_eq!(hits(&wide, &s1, "billing export").await, 1);
    assert_eq!(hits(&wide, &s1, "pager rotation secret").await, 0);
    let cross = with_agent(&store, "main", |config| {
        config.recall_agents = vec!["ops".to_owned()]
    });
    assert_eq!(
        hits(&cross, &s1, "pager rotation secret").await,
        1,
        "only when the config names the agent"
    );

    // The ops engine asked with an ops session's id but another agent's key: refused, for
    // every tool (isolation follows the agent in the key, not only the session id).
    let impostor = caller("o1", "agent:main:o1");
    for (tool, arguments) in [
        ("vilvona_grep", json!({"query": "pager rotation secret"})),
        ("vilvona_describe", json!({"id": "msg_1"})),
    ] {
        let refused = ops
            .call_tool(&impostor, tool, &arguments)
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, ToolError::OtherAgent { key_agent, agent } if key_agent == "main" && agent == "ops"),
            "{tool}: {refused}"
        );
    }
    assert_eq!(
        hits(&ops, &caller("o1", "agent:ops:o1"), "pager rotation secret").await,
        1
    );
}

#[tokio::test]
async fn grants_let_a_child_read_its_parent_until_they_end() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    for index in 0..16 {
        for message in turn(index) {
            engine
                .ingest(&IngestParams {
                    session_id: "parent".to_owned(),
                    session_key: Some("agent:main:parent".to_owned()),
                    message,
                    entry_id: None,
                    is_heartbeat: false,
                })
                .await
                .unwrap();
        }
    }
    say(
        &engine,
        "parent",
        "agent:main:parent",
        "remember the rollout flag is FLAG-9",
        9_999_999_999_999,
    )
    .await;
    let parent = engine.conversation("parent", None).await.unwrap();
    engine
        .compact_conversation(parent.id, CompactionRequest::forced(4_000))
        .await
        .unwrap();
    let summary_id = match &engine.store().context(parent.id).await.unwrap()[0].content {
        vilvona_store::ItemContent::Summary(summary) => summary.summary_id.clone(),
        other => panic!("expected a summary first, got {other:?}"),
    };

    let child = caller("child", "agent:main:parent:sub1");
    assert_eq!(
        hits(&engine, &child, "rollout flag").await,
        0,
        "no grant yet"
    );
    let spawn = SubagentSpawnParams {
        parent_session_key: "agent:main:parent".to_owned(),
        child_session_key: "agent:main:parent:sub1".to_owned(),
        parent_session_id: Some("parent".to_owned()),
        child_session_id: Some("child".to_owned()),
        context_mode: ContextMode::Isolated,
        ttl_ms: Some(60_000),
        ..SubagentSpawnParams::default()
    };
    engine
        .prepare_subagent_spawn(&spawn)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(hits(&engine, &child, "rollout flag").await, 1);
    engine
        .call_tool(&child, "vilvona_expand", &json!({"id": summary_id}))
        .await
        .unwrap();

    // A child of another parent is refused.
    let stranger = caller("other-child", "agent:main:other:sub1");
    let refused = engine
        .call_tool(&stranger, "vilvona_describe", &json!({"id": summary_id}))
        .await
        .unwrap_err();
    assert!(matches!(refused, ToolError::OutOfScope(_)), "{refused}");

    engine
        .on_subagent_ended(&SubagentEndedParams {
            child_session_key: "agent:main:parent:sub1".to_owned(),
            reason: SubagentEndReason::Completed,
        })
        .await
        .unwrap();
    assert_eq!(hits(&engine, &child, "rollout flag").await, 0);
    let revoked = engine
        .call_tool(&child, "vilvona_expand", &json!({"id": summary_id}))
        .await
        .unwrap_err();
    assert!(matches!(revoked, ToolError::GrantEnded(_)), "{revoked}");

    // An expired grant is refused too.
    let expired = SubagentSpawnParams {
        child_session_key: "agent:main:parent:sub2".to_owned(),
        child_session_id: Some("child2".to_owned()),
        ttl_ms: Some(0),
        ..spawn.clone()
    };
    engine.prepare_subagent_spawn(&expired).await.unwrap();
    let child2 = caller("child2", "agent:main:parent:sub2");
    let ended = engine
        .call_tool(&child2, "vilvona_describe", &json!({"id": summary_id}))
        .await
        .unwrap_err();
    assert!(matches!(ended, ToolError::GrantEnded(_)), "{ended}");

    // A grant ends when the engine's clock passes its expiry (a set clock, not a wait).
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let timed = engine.with_clock(clock.clone());
    let minute = SubagentSpawnParams {
        child_session_key: "agent:main:parent:sub4".to_owned(),
        child_session_id: Some("child4".to_owned()),
        ttl_ms: Some(60_000),
        ..spawn.clone()
    };
    timed.prepare_subagent_spawn(&minute).await.unwrap();
    let child4 = caller("child4", "agent:main:parent:sub4");
    clock.advance(59_000);
    assert_eq!(hits(&timed, &child4, "rollout flag").await, 1);
    clock.advance(2_000);
    let lapsed = timed
        .call_tool(&child4, "vilvona_describe", &json!({"id": summary_id}))
        .await
        .unwrap_err();
    assert!(matches!(lapsed, ToolError::GrantEnded(_)), "{lapsed}");

    // Fork seeds the child's context by reference; rollback removes grant and seed.
    let fork = SubagentSpawnParams {
        child_session_key: "agent:main:parent:sub3".to_owned(),
        child_session_id: Some("child3".to_owned()),
        context_mode: ContextMode::Fork,
        ..spawn
    };
    let rollback = engine.prepare_subagent_spawn(&fork).await.unwrap().unwrap();
    let child3 = engine.conversation("child3", None).await.unwrap();
    let seeded = engine.store().context(child3.id).await.unwrap();
    assert_eq!(
        seeded.len(),
        engine.store().context(parent.id).await.unwrap().len()
    );
    rollback.rollback().await.unwrap();
    assert!(engine.store().context(child3.id).await.unwrap().is_empty());
    assert!(
        engine
            .store()
            .grants("agent:main:parent:sub3")
            .await
            .unwrap()
            .is_empty()
    );
}

/// A word at the very end of a 1,000,000-character tool output is found by text and regex grep
/// (the hit names the file), and the content is readable from a second session whose message
/// references the same stored content.
#[tokio::test]
async fn large_content_is_searchable_and_readable_by_every_session_that_references_it() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut output = String::with_capacity(1_000_100);
    let mut line = 0;
    while output.len() < 999_950 {
        output.push_str(&format!("row {line:06} status nominal latency 4ms\n"));
        line += 1;
    }
    output.push_str("final verdict: zanzibarquokka");
    let lines = output.lines().count();
    for session in ["bigA", "bigB"] {
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: session.to_owned(),
                session_key: Some(session.to_owned()),
                messages: vec![
                    message(json!({"role": "user", "content": "dump the table", "timestamp": 1})),
                    message(
                        json!({"role": "toolResult", "toolCallId": "c1", "toolName": "exec",
                        "content": [{"type": "text", "text": output}], "timestamp": 2}),
                    ),
                ],
                ..IngestBatchParams::default()
            })
            .await
            .unwrap();
    }
    let b = caller("bigB", "bigB");
    for mode in ["text", "regex"] {
        let query = if mode == "text" {
            "zanzibarquokka"
        } else {
            "verdict: zanzibar\\w+"
        };
        let found = engine
            .call_tool(&b, "vilvona_grep", &json!({"query": query, "mode": mode}))
            .await
            .unwrap();
        let results = found["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "{mode}: {found}");
        let snippet = results[0]["snippet"].as_str().unwrap();
        assert!(snippet.contains("zanzibarquokka»"), "{mode}: {snippet}");
        let file = results[0]["file"].as_str().unwrap();
        assert!(file.starts_with("file_"), "{file}");
        let described = engine
            .call_tool(
                &b,
                "vilvona_describe",
                &json!({"id": file, "lines": format!("{lines}-{lines}")}),
            )
            .await
            .unwrap();
        assert_eq!(described["content"], "final verdict: zanzibarquokka");
    }
    // A session that never referenced it still may not read it.
    say(&engine, "other", "other", "unrelated", 3).await;
    let found = engine
        .call_tool(&b, "vilvona_grep", &json!({"query": "zanzibarquokka"}))
        .await
        .unwrap();
    let file = found["results"][0]["file"].as_str().unwrap().to_owned();
    let refused = engine
        .call_tool(
            &caller("other", "other"),
            "vilvona_describe",
            &json!({"id": file}),
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, ToolError::OutOfScope(_)), "{refused}");
}

/// A fork child sees its parent's history once, and each of the two folds on its own. The
/// host's fork copies the parent's transcript into the child's (OpenClaw 2026.9): the child's
/// first assembly must not store that copy beside the seeded context, and the parent's turn
/// that spawned the child (not yet committed) is the child's first own messages. Before the
/// fix the child held the parent's history twice, and whichever session folded the shared
/// rows second failed with a UNIQUE constraint on every later call.
#[tokio::test]
async fn a_fork_sees_its_parents_history_once_and_each_folds_on_its_own() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let (parent_key, child_key) = ("agent:main:parent", "agent:main:subagent:fork");
    let mut transcript: Vec<AgentMessage> = Vec::new();
    commit_turns(&engine, "parent", parent_key, 0..12, &mut transcript).await;
    // The parent's last turn before the spawn spawned a child too: it ends in the host's
    // stand-in for a tool result, which the in-flight turn below ends in again.
    let earlier_spawn = spawn_turn("spawn an isolated child", "spawn0");
    commit(
        &engine,
        "parent",
        parent_key,
        "p-spawn0",
        transcript.len(),
        &earlier_spawn,
    )
    .await;
    transcript.extend(earlier_spawn);
    let parent = engine.conversation("parent", None).await.unwrap();
    engine
        .compact_conversation(parent.id, CompactionRequest::forced(4_000))
        .await
        .unwrap();
    let parents_context = engine.store().context_refs(parent.id).await.unwrap();
    assert!(
        parents_context
            .iter()
            .any(|item| matches!(item.item, vilvona_store::ItemRef::Summary(_))),
        "the parent has folded"
    );

    // The spawn, while the parent's turn that asks for it is in flight.
    let spawn = SubagentSpawnParams {
        parent_session_key: parent_key.to_owned(),
        child_session_key: child_key.to_owned(),
        parent_session_id: Some("parent".to_owned()),
        child_session_id: Some("child".to_owned()),
        context_mode: ContextMode::Fork,
        ttl_ms: Some(60_000),
        ..SubagentSpawnParams::default()
    };
    engine
        .prepare_subagent_spawn(&spawn)
        .await
        .unwrap()
        .unwrap();
    // Sent again (the process died before it answered): one grant, one seed.
    engine
        .prepare_subagent_spawn(&spawn)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(engine.store().grants(child_key).await.unwrap().len(), 1);
    let child = engine.conversation("child", None).await.unwrap();
    assert_eq!(
        engine.store().context_refs(child.id).await.unwrap().len(),
        parents_context.len()
    );

    // The child's first assembly: the host's transcript is the parent's, and the in-flight
    // turn's request, tool call and the host's stand-in for its result.
    let in_flight = spawn_turn("spawn a fork to look into m3", "spawn1");
    // The host's fork copies the parent's transcript from its last compaction boundary on
    // (shorter than the parent's store), and places the child's turns in its own record by
    // other numbers than the transcript's.
    let mut childs_host = transcript[10..].to_vec();
    childs_host.extend(in_flight.clone());
    let mut record = transcript.len() + 7 + in_flight.len();
    let assembled = assemble(&engine, "child", child_key, &childs_host).await;
    assert_eq!(
        assembled.messages.len(),
        parents_context.len() + in_flight.len(),
        "the parent's history once (its context), then the turn that spawned the child"
    );
    let stored = |engine: &LosslessEngine| {
        let engine = engine.clone();
        async move {
            let id = engine.conversation("child", None).await.unwrap().id;
            engine
                .store()
                .conversation_by_id(id)
                .await
                .unwrap()
                .unwrap()
                .message_count
        }
    };
    assert_eq!(stored(&engine).await, 3);

    // The child's turns, placed by the host after its copied transcript, and an assembly that
    // brings the whole host transcript again: nothing is stored twice.
    for index in 0..3 {
        let messages = turn(100 + index);
        commit(
            &engine,
            "child",
            child_key,
            &format!("c{index}"),
            record,
            &messages,
        )
        .await;
        record += messages.len();
        childs_host.extend(messages);
    }
    assert_eq!(stored(&engine).await, 15);
    let fresh = engine.with_clock(Arc::new(SystemClock));
    assemble(&fresh, "child", child_key, &childs_host).await;
    assert_eq!(stored(&fresh).await, 15);

    // Both fold the shared rows, in either order, and every later call of each works.
    engine
        .compact_conversation(child.id, CompactionRequest::forced(1_500))
        .await
        .unwrap();
    commit_turns(&engine, "parent", parent_key, 12..20, &mut transcript).await;
    engine
        .compact_conversation(parent.id, CompactionRequest::forced(1_500))
        .await
        .unwrap();
    engine
        .compact_conversation(child.id, CompactionRequest::forced(1_000))
        .await
        .unwrap();
    assemble(&engine, "parent", parent_key, &transcript).await;
    let report = engine.store().integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    // Completed: the child's history stays. Deleted: it goes, and nothing of the parent's.
    let parent_messages = engine
        .store()
        .conversation_by_id(parent.id)
        .await
        .unwrap()
        .unwrap()
        .message_count;
    for (reason, remains) in [
        (SubagentEndReason::Completed, true),
        (SubagentEndReason::Deleted, false),
    ] {
        engine
            .on_subagent_ended(&SubagentEndedParams {
                child_session_key: child_key.to_owned(),
                reason,
            })
            .await
            .unwrap();
        assert_eq!(
            engine
                .store()
                .conversation_by_id(child.id)
                .await
                .unwrap()
                .is_some(),
            remains,
            "{reason:?}"
        );
    }
    let parent_row = engine
        .store()
        .conversation_by_id(parent.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent_row.message_count, parent_messages);
    assemble(&engine, "parent", parent_key, &transcript).await;
    let report = engine.store().integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// A turn that spawns a subagent, as the host's transcript holds it while the turn is in
/// flight: the request, the `sessions_spawn` call, and the host's stand-in for its result.
fn spawn_turn(request: &str, call: &str) -> Vec<AgentMessage> {
    vec![
        message(json!({"role": "user", "content": request, "timestamp": 1})),
        message(
            json!({"role": "assistant", "content": [{"type": "toolCall", "id": call, "name": "sessions_spawn", "arguments": {"context": "fork"}}], "timestamp": 2}),
        ),
        message(
            json!({"role": "toolResult", "toolCallId": call, "toolName": "sessions_spawn", "content": [{"type": "text", "text": "[openclaw] missing tool result in session history; inserted synthetic error result for transcript repair."}], "timestamp": 3}),
        ),
    ]
}

/// Commits the fixture's turns `indexes`, each where the host's transcript places it, and
/// adds them to that transcript.
async fn commit_turns(
    engine: &LosslessEngine,
    session: &str,
    key: &str,
    indexes: std::ops::Range<usize>,
    transcript: &mut Vec<AgentMessage>,
) {
    for index in indexes {
        let messages = turn(index);
        let advancement = format!("{session}-{index}");
        commit(
            engine,
            session,
            key,
            &advancement,
            transcript.len(),
            &messages,
        )
        .await;
        transcript.extend(messages);
    }
}

/// Commits a turn the host placed at `at` in the session's transcript.
async fn commit(
    engine: &LosslessEngine,
    session: &str,
    key: &str,
    advancement: &str,
    at: usize,
    messages: &[AgentMessage],
) {
    engine
        .commit_turn(&CommitTurnParams {
            advancement_key: advancement.to_owned(),
            session_id: session.to_owned(),
            session_key: Some(key.to_owned()),
            messages: messages.to_vec(),
            admission: Some(json!({"sessionId": session, "activeMessagePosition": at})),
            ..CommitTurnParams::default()
        })
        .await
        .unwrap();
}

async fn assemble(
    engine: &LosslessEngine,
    session: &str,
    key: &str,
    messages: &[AgentMessage],
) -> AssembleResult {
    engine
        .assemble(&AssembleParams {
            session_id: session.to_owned(),
            session_key: Some(key.to_owned()),
            messages: messages.to_vec().into(),
            token_budget: Some(100_000),
            ..AssembleParams::default()
        })
        .await
        .unwrap()
}

/// A fork child's first transcript that does not hold its parent's last messages as the store
/// has them (the host's copy differs: sanitized, cut at its own compaction boundary): the turn
/// that spawned the child is still the child's, found by time. Before, the whole transcript
/// was taken as the parent's history and the spawning turn was stored nowhere.
#[tokio::test]
async fn a_forks_transcript_that_differs_from_its_parents_store_still_gives_the_spawning_turn() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let (parent_key, child_key) = ("agent:main:parent2", "agent:main:subagent:fork2");
    let mut transcript: Vec<AgentMessage> = Vec::new();
    commit_turns(&engine, "parent2", parent_key, 0..6, &mut transcript).await;
    engine
        .prepare_subagent_spawn(&SubagentSpawnParams {
            parent_session_key: parent_key.to_owned(),
            child_session_key: child_key.to_owned(),
            parent_session_id: Some("parent2".to_owned()),
            child_session_id: Some("child2".to_owned()),
            context_mode: ContextMode::Fork,
            ttl_ms: Some(60_000),
            ..SubagentSpawnParams::default()
        })
        .await
        .unwrap()
        .unwrap();
    // The host's copy of the parent's history, its texts changed; then the in-flight turn,
    // written after the parent's last stored message.
    let copied: Vec<AgentMessage> = transcript
        .iter()
        .map(|message| {
            let mut value = serde_json::to_value(message).unwrap();
            if value["role"] == "user" {
                value["content"] = json!(format!("[sanitized] {}", message.plain_text()));
            }
            serde_json::from_value(value).unwrap()
        })
        .collect();
    let later = transcript.last().unwrap().timestamp_ms().unwrap() + 1_000;
    let in_flight: Vec<AgentMessage> = spawn_turn("spawn a fork to look into m5", "spawn9")
        .into_iter()
        .enumerate()
        .map(|(index, message)| {
            let mut value = serde_json::to_value(&message).unwrap();
            value["timestamp"] = json!(later + index as i64);
            serde_json::from_value(value).unwrap()
        })
        .collect();
    let mut childs_host = copied;
    childs_host.extend(in_flight.clone());
    assemble(&engine, "child2", child_key, &childs_host).await;
    let child = engine.conversation("child2", None).await.unwrap();
    let stored = engine
        .store()
        .messages_in_seq_range(child.id, 0, 100)
        .await
        .unwrap();
    let texts: Vec<String> = stored.iter().map(|message| message.text()).collect();
    assert_eq!(texts.len(), in_flight.len(), "{texts:?}");
    assert!(
        texts[0].contains("spawn a fork to look into m5"),
        "{texts:?}"
    );
}
