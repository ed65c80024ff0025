//! Scope: agents, conversations, subagent grants.

use std::sync::Arc;

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::clock::{Clock, ManualClock, SystemClock};
use vilvona_core::engine::*;
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
