//! Forgetting on request and retention, through the engine and its recall tools.

use serde_json::{Value, json};
use tempfile::TempDir;
use vilvona_core::engine::*;
use vilvona_lossless::*;
use vilvona_store::{ItemContent, StoredSummary};

use crate::support::*;

const DAY: i64 = 86_400_000;

/// A session of `turns` turns (about 500 tokens each) with a fact at `fact_turn`, compacted as
/// it goes; message times start at `start_ms`, a minute apart per turn.
async fn session(
    engine: &LosslessEngine,
    id: &str,
    turns: usize,
    fact: &str,
    fact_turn: usize,
    start_ms: i64,
) {
    let conversation = engine.conversation(id, Some(id)).await.unwrap();
    for index in 0..turns {
        let mut messages = turn(index);
        for message in &mut messages {
            let mut value = serde_json::to_value(&*message).unwrap();
            value["timestamp"] = json!(start_ms + index as i64 * 60_000);
            *message = serde_json::from_value(value).unwrap();
        }
        if index == fact_turn {
            messages.insert(1, message(json!({"role": "user", "content": fact, "timestamp": start_ms + index as i64 * 60_000 + 1})));
        }
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: id.to_owned(),
                session_key: Some(id.to_owned()),
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
}

fn caller(session: &str) -> ToolCaller {
    ToolCaller {
        session_id: session.to_owned(),
        session_key: Some(session.to_owned()),
    }
}

async fn grep(engine: &LosslessEngine, session: &str, query: &str) -> Vec<Value> {
    engine
        .call_tool(
            &caller(session),
            "vilvona_grep",
            &json!({"query": query, "mode": "phrase", "limit": 50}),
        )
        .await
        .unwrap()["results"]
        .as_array()
        .unwrap()
        .clone()
}

/// Every summary of a conversation's DAG, from its context down.
async fn all_summaries(engine: &LosslessEngine, session: &str) -> Vec<StoredSummary> {
    let mut below = context_summaries(engine, session, Some(session)).await;
    let mut all = Vec::new();
    while let Some(summary) = below.pop() {
        for child in engine.store().children(summary.row_id).await.unwrap() {
            if let ItemContent::Summary(child) = child {
                below.push(child);
            }
        }
        all.push(summary);
    }
    all
}

/// The sessions the store holds for agent main.
async fn stored_sessions(engine: &LosslessEngine) -> Vec<String> {
    engine
        .store()
        .conversations(Some("main"))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.session_id)
        .collect()
}

fn recall_everything() -> LosslessConfig {
    LosslessConfig {
        recall_all_conversations: true,
        ..small_config()
    }
}

#[tokio::test]
async fn a_forgotten_session_is_unfindable_and_the_other_keeps_its_recall() {
    let dir = TempDir::new().unwrap();
    let engine = engine_in(
        &dir,
        recall_everything(),
        std::sync::Arc::new(vilvona_summarize::ExtractiveSummarizer::new(estimator())),
    )
    .await;
    let gone_fact =
        "Please remember: the vault rotation is tracked in OPS-11111 and Noor Haddad owns it.";
    let kept_fact =
        "Please remember: the backup drill is tracked in OPS-22222 and Ivo Petrov owns it.";
    session(&engine, "gone", 24, gone_fact, 3, 1_772_442_000_000).await;
    session(&engine, "kept", 24, kept_fact, 3, 1_772_442_000_000).await;
    // Before: the kept session reaches the other's fact (recallAllConversations).
    let hits = grep(&engine, "kept", "vault rotation").await;
    assert!(!hits.is_empty());
    let gone_ids: Vec<String> = hits
        .iter()
        .map(|hit| hit["id"].as_str().unwrap().to_owned())
        .collect();
    let gone_summary = all_summaries(&engine, "gone").await[0].summary_id.clone();

    let forgotten = engine.forget_session("gone").await.unwrap();
    assert!(forgotten.report.messages > 90, "{forgotten:?}");
    assert!(
        forgotten.space.bytes_after < forgotten.space.bytes_before,
        "{forgotten:?}"
    );
    assert!(grep(&engine, "kept", "vault rotation").await.is_empty());
    assert!(grep(&engine, "kept", "OPS-11111").await.is_empty());
    for id in gone_ids.iter().chain([&gone_summary]) {
        let described = engine
            .call_tool(&caller("kept"), "vilvona_describe", &json!({"id": id}))
            .await;
        assert!(
            matches!(described, Err(ToolError::NotFound(_))),
            "{id}: {described:?}"
        );
    }
    let expanded = engine
        .call_tool(
            &caller("kept"),
            "vilvona_expand",
            &json!({"id": gone_summary}),
        )
        .await;
    assert!(
        matches!(expanded, Err(ToolError::NotFound(_))),
        "{expanded:?}"
    );
    // The other session's recall is whole.
    let kept = grep(&engine, "kept", "backup drill").await;
    assert!(kept.iter().any(|hit| hit["kind"] == "message"), "{kept:?}");
    assert!(engine.store().integrity_check().await.unwrap().is_healthy());
}

#[tokio::test]
async fn forgetting_before_a_time_rebuilds_the_summaries_without_the_forgotten_text() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let start = 1_772_442_000_000;
    let early = "Please remember: the staging password is hunter-4471 and Lena Fischer owns it.";
    session(&engine, "s", 40, early, 2, start).await;
    let late = "Please remember: the release train leaves on Friday and Omar Said owns it.";
    let conversation = engine.conversation("s", Some("s")).await.unwrap();
    engine
        .ingest(&IngestParams {
            session_id: "s".to_owned(),
            session_key: Some("s".to_owned()),
            message: message(
                json!({"role": "user", "content": late, "timestamp": start + 40 * 60_000}),
            ),
            entry_id: None,
            is_heartbeat: false,
        })
        .await
        .unwrap();
    assert!(
        all_summaries(&engine, "s")
            .await
            .iter()
            .any(|s| s.content.contains("hunter-4471")),
        "the early fact was summarized"
    );
    let before = all_summaries(&engine, "s").await.len();

    // Forget the first ten turns.
    let forgotten = engine
        .forget_before("s", start + 10 * 60_000)
        .await
        .unwrap();
    assert!(forgotten.report.messages >= 40, "{forgotten:?}");
    let row = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.stored_messages,
        row.message_count - forgotten.report.messages
    );
    assert!(forgotten.report.summaries_rewritten + forgotten.report.summaries_removed > 0);
    let summaries = all_summaries(&engine, "s").await;
    assert!(summaries.len() <= before);
    for summary in &summaries {
        assert!(
            !summary.content.contains("hunter-4471"),
            "{}",
            summary.content
        );
        assert!(!summary.content.contains("Turn 3:"), "{}", summary.content);
        let earliest = summary.earliest_at_ms.unwrap();
        assert!(
            earliest >= start + 10 * 60_000,
            "a summary still spans forgotten time"
        );
    }
    assert!(grep(&engine, "s", "hunter-4471").await.is_empty());
    assert!(!grep(&engine, "s", "release train").await.is_empty());
    assert!(!grep(&engine, "s", "Turn 20").await.is_empty());
    let report = engine.store().integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{:?}", report.problems);
    // The context still assembles and compaction goes on.
    let context = engine.store().context(conversation.id).await.unwrap();
    assert!(!context.is_empty());
    session(&engine, "s", 45, "nothing", 99, start + 50 * 60_000).await;
    assert!(engine.store().integrity_check().await.unwrap().is_healthy());
}

#[tokio::test]
async fn retention_does_what_its_dry_run_listed() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let now = 1_800_000_000_000;
    session(
        &engine,
        "old",
        6,
        "Please remember: the old fact is OPS-30000.",
        1,
        now - 300 * DAY,
    )
    .await;
    session(
        &engine,
        "idle",
        6,
        "Please remember: the idle fact is OPS-40000.",
        1,
        now - 60 * DAY,
    )
    .await;
    session(
        &engine,
        "fresh",
        6,
        "Please remember: the fresh fact is OPS-50000.",
        1,
        now - DAY / 2,
    )
    .await;
    let policy = RetentionPolicy {
        archive_after_days: Some(30),
        delete_after_days: Some(200),
        ..RetentionPolicy::default()
    };
    let plan = engine.retention_plan(&policy, now).await.unwrap();
    let listed: Vec<(String, RetentionKind)> = plan
        .iter()
        .map(|a| (a.session_id.clone(), a.action))
        .collect();
    assert_eq!(
        listed,
        [
            ("old".to_owned(), RetentionKind::Delete),
            ("idle".to_owned(), RetentionKind::Archive)
        ]
    );
    engine.apply_retention(&plan).await.unwrap();
    let conversations = engine.store().conversations(Some("main")).await.unwrap();
    let state: Vec<(String, bool)> = conversations
        .iter()
        .map(|c| (c.session_id.clone(), c.archived_at_ms.is_some()))
        .collect();
    assert_eq!(
        state,
        [("idle".to_owned(), true), ("fresh".to_owned(), false)]
    );
    // Nothing more to do, and the archived session still recalls its own history (read from
    // the database, its rows out of the index).
    assert!(
        engine
            .retention_plan(&policy, now)
            .await
            .unwrap()
            .is_empty()
    );
    let docs_archived = engine.store().index_doc_count().await.unwrap();
    assert!(!grep(&engine, "idle", "idle fact").await.is_empty());
    assert!(grep(&engine, "idle", "old fact").await.is_empty());
    // A new message makes it live: its rows return to the index.
    session(&engine, "idle", 1, "x", 9, now).await;
    let live = engine.store().conversations(Some("main")).await.unwrap();
    assert!(live.iter().all(|c| c.archived_at_ms.is_none()));
    assert!(engine.store().index_doc_count().await.unwrap() > docs_archived);
    assert!(!grep(&engine, "idle", "idle fact").await.is_empty());
    assert!(engine.store().integrity_check().await.unwrap().is_healthy());
}

#[tokio::test]
async fn the_size_cap_deletes_the_least_recently_active_first() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let now = 1_800_000_000_000;
    for (index, id) in ["a", "b", "c", "d"].iter().enumerate() {
        session(
            &engine,
            id,
            12,
            "filler",
            99,
            now - (10 - index as i64) * DAY,
        )
        .await;
    }
    let size = engine.store().disk_bytes();
    let policy = RetentionPolicy {
        max_store_mb: Some(size as f64 / 2.0 / 1e6),
        ..RetentionPolicy::default()
    };
    let plan = engine.retention_plan(&policy, now).await.unwrap();
    let order: Vec<&str> = plan.iter().map(|a| a.session_id.as_str()).collect();
    assert!((1..4).contains(&order.len()), "{plan:?}");
    assert_eq!(order, ["a", "b", "c", "d"][..order.len()].to_vec());
    assert!(plan.iter().all(|a| a.action == RetentionKind::Delete));
    engine.apply_retention(&plan).await.unwrap();
    let left = stored_sessions(&engine).await;
    assert_eq!(left.len(), 4 - order.len());
    assert!(engine.store().disk_bytes() < size);
}

/// `maintain` applies the configured policy in the background, at most once a day.
#[tokio::test]
async fn maintain_applies_retention_at_most_once_a_day() {
    let dir = TempDir::new().unwrap();
    let config = LosslessConfig {
        retention: RetentionPolicy {
            delete_after_days: Some(100),
            ..RetentionPolicy::default()
        },
        ..small_config()
    };
    let engine = engine_in(
        &dir,
        config,
        std::sync::Arc::new(vilvona_summarize::ExtractiveSummarizer::new(estimator())),
    )
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    session(&engine, "ancient", 3, "x", 9, now - 400 * DAY).await;
    session(&engine, "today", 3, "x", 9, now).await;
    let maintain = MaintainParams {
        session_id: "today".to_owned(),
        session_key: Some("today".to_owned()),
        ..MaintainParams::default()
    };
    assert_eq!(engine.retention_last_run().await, None);
    engine.maintain(&maintain).await.unwrap();
    let first = engine.retention_last_run().await.expect("retention ran");
    // It runs in the background: wait for it to finish.
    engine.settled().await;
    let left = stored_sessions(&engine).await;
    assert_eq!(left, ["today"]);
    // Within the day, maintain does not run it again.
    session(&engine, "ancient2", 3, "x", 9, now - 400 * DAY).await;
    engine.maintain(&maintain).await.unwrap();
    assert_eq!(engine.retention_last_run().await, Some(first));
    assert_eq!(
        engine
            .store()
            .conversations(Some("main"))
            .await
            .unwrap()
            .len(),
        2
    );
}

/// A gateway that assembled a session before an operator's engine (another process, in use)
/// forgot its early part shows none of the forgotten text afterwards, although its summaries
/// kept their references.
#[tokio::test]
async fn a_gateway_shows_no_forgotten_text_after_another_engine_forgot() {
    let dir = TempDir::new().unwrap();
    let gateway = engine(&dir).await;
    let start = 1_772_442_000_000;
    let early = "Please remember: the staging password is hunter-4471 and Lena Fischer owns it.";
    session(&gateway, "s", 40, early, 2, start).await;
    let assemble = || async {
        let assembled = gateway
            .assemble(&AssembleParams {
                session_id: "s".to_owned(),
                session_key: Some("s".to_owned()),
                token_budget: Some(4_000),
                ..AssembleParams::default()
            })
            .await
            .unwrap();
        assembled
            .messages
            .iter()
            .map(|message| message.plain_text())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(assemble().await.contains("hunter-4471"));
    let operator = engine(&dir).await;
    let forgotten = operator
        .forget_before("s", start + 10 * 60_000)
        .await
        .unwrap();
    assert!(forgotten.report.summaries_rewritten > 0, "{forgotten:?}");
    let shown = assemble().await;
    assert!(!shown.contains("hunter-4471"), "{shown}");
    assert!(!shown.contains("Turn 3:"), "{shown}");
}

/// A fork folds its parent's rows and a fork of the fork folds the fork's context; forgetting
/// the grandchild, the parent, then the fork — each through the engine, which plans the
/// rebuilding of every other session's folds above the forgotten rows — leaves the store sound
/// and no forgotten text in any summary or search. Before, a whole-session forget took only
/// the session's own summaries: the forks' folds of the parent's rows kept their text.
#[tokio::test]
async fn forgetting_a_parent_its_fork_and_a_grandchild_leaves_nothing_of_them_anywhere() {
    let dir = TempDir::new().unwrap();
    let engine = engine_in(
        &dir,
        recall_everything(),
        std::sync::Arc::new(vilvona_summarize::ExtractiveSummarizer::new(estimator())),
    )
    .await;
    let start = 1_772_442_351_000;
    session(
        &engine,
        "parent",
        12,
        "The parent's vault code is quetzalvault.",
        1,
        start,
    )
    .await;
    let spawn = |parent: &str, child: &str| SubagentSpawnParams {
        parent_session_key: parent.to_owned(),
        child_session_key: child.to_owned(),
        parent_session_id: Some(parent.to_owned()),
        child_session_id: Some(child.to_owned()),
        context_mode: ContextMode::Fork,
        ttl_ms: Some(3_600_000),
        ..SubagentSpawnParams::default()
    };
    let fold = |session: &'static str, budget: u64| {
        let engine = engine.clone();
        async move {
            let conversation = engine.conversation(session, Some(session)).await.unwrap();
            engine
                .compact_conversation(conversation.id, CompactionRequest::forced(budget))
                .await
                .unwrap();
        }
    };
    engine
        .prepare_subagent_spawn(&spawn("parent", "fork"))
        .await
        .unwrap();
    session(
        &engine,
        "fork",
        4,
        "The fork's own note: ocelotfork.",
        0,
        start + DAY,
    )
    .await;
    fold("fork", 1_500).await;
    engine
        .prepare_subagent_spawn(&spawn("fork", "grandchild"))
        .await
        .unwrap();
    session(
        &engine,
        "grandchild",
        3,
        "The grandchild's note: lemurchild.",
        0,
        start + 2 * DAY,
    )
    .await;
    fold("grandchild", 1_000).await;
    let healthy = |engine: LosslessEngine| async move {
        let check = vilvona_core::admin::EngineAdmin::check(&engine)
            .await
            .unwrap();
        assert!(check.is_healthy(), "{:?}", check.problems);
    };
    healthy(engine.clone()).await;
    // The folds of the forks reach the parent's rows (else this test tests nothing).
    let fork_summaries = all_summaries(&engine, "fork").await;
    let fork = engine.conversation("fork", Some("fork")).await.unwrap();
    // The parent's turns 4 to 11 are its own (the forks' turns are 0 to 3).
    assert!(
        fork_summaries
            .iter()
            .any(|summary| summary.conversation == fork.id
                && summary.content.contains("crates/m9/src/lib.rs")),
        "a fold of the fork's own holds the parent's text: {:?}",
        fork_summaries
            .iter()
            .map(|s| (&s.summary_id, s.conversation, &s.content))
            .collect::<Vec<_>>()
    );

    let nowhere = |texts: &'static [&'static str]| {
        let engine = engine.clone();
        async move {
            for session in stored_sessions(&engine).await {
                for text in texts {
                    assert!(
                        grep(&engine, &session, text).await.is_empty(),
                        "{text} found from {session}"
                    );
                    for summary in all_summaries(&engine, &session).await {
                        assert!(
                            !summary.content.contains(text),
                            "{text} in {session}'s {}: {}",
                            summary.summary_id,
                            summary.content
                        );
                    }
                }
            }
        }
    };
    let forgotten: [(&str, &'static [&'static str]); 3] = [
        ("grandchild", &["lemurchild"]),
        (
            "parent",
            &["quetzalvault", "crates/m9/src/lib.rs", "keep m9 as"],
        ),
        ("fork", &["ocelotfork"]),
    ];
    for (session, texts) in forgotten {
        engine.forget_session(session).await.unwrap();
        healthy(engine.clone()).await;
        nowhere(texts).await;
    }
    assert!(stored_sessions(&engine).await.is_empty());
}
