//! Migrations, idempotent ingest, the context and compare-and-swap replace, and the small tables.

use tempfile::TempDir;
use vilvona_store::*;

use crate::conformance::{Backend, on_both_backends, postgres_query};
use crate::support::*;

on_both_backends!(
    ingest_is_idempotent_across_reopen,
    message_identity_keeps_repeats_and_drops_redeliveries,
    the_message_json_is_kept_exactly,
    replace_publishes_a_summary_only_if_the_plan_is_current,
    an_advancement_key_commits_a_turn_once,
    blobs_grants_and_state,
    bad_input_is_a_clear_error_and_loses_nothing,
    a_summary_is_rewritten_in_place_and_a_context_can_be_emptied,
    the_summaries_a_stand_in_wrote_are_found_until_rewritten,
    a_set_up_that_stops_partway_leaves_no_half_made_store,
);

#[tokio::test]
async fn a_new_store_migrates_and_reopens() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir).await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap();
    assert_eq!(conversation.message_count, 0);
    store.close().await.unwrap();

    let reopened = open(&dir).await;
    let again = reopened.conversation(&key("main", "s1")).await.unwrap();
    assert_eq!(again.id, conversation.id);
    let user_version: i64 = rusqlite::Connection::open(dir.path().join(DATABASE_FILE))
        .unwrap()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(user_version, SCHEMA_VERSION);
}

#[tokio::test]
async fn a_database_from_a_newer_version_is_refused() {
    let dir = TempDir::new().unwrap();
    drop(open(&dir).await);
    rusqlite::Connection::open(dir.path().join(DATABASE_FILE))
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let error = Store::open(StoreConfig::new(dir.path())).await.unwrap_err();
    assert!(
        error.to_string().contains(&format!(
            "database schema version 99 is newer than this build understands ({SCHEMA_VERSION})"
        )),
        "{error}"
    );
}

async fn ingest_is_idempotent_across_reopen(backend: &Backend) {
    let first_ids;
    {
        let store = backend.open().await;
        let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
        let results = stored(
            store
                .ingest(
                    conversation,
                    vec![
                        new_message("deploy the parser", 1_000, Some("e1")),
                        placed(new_message("no entry id here", 2_000, None), 1),
                    ],
                    None,
                )
                .await
                .unwrap(),
        );
        assert!(results.iter().all(|r| r.ingested));
        first_ids = results.iter().map(|r| r.message_id).collect::<Vec<_>>();
    }
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let again = stored(
        store
            .ingest(
                conversation,
                vec![
                    new_message("deploy the parser", 1_000, Some("e1")),
                    placed(new_message("no entry id here", 2_000, None), 1),
                    // Same text, different message (another time): kept.
                    placed(new_message("no entry id here", 3_000, None), 2),
                ],
                None,
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        again.iter().map(|r| r.ingested).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(again[0].message_id, first_ids[0]);
    assert_eq!(again[1].message_id, first_ids[1]);
    assert_eq!(again[2].seq, 2);
    let context = store.context(conversation).await.unwrap();
    assert_eq!(context.len(), 3);
    let conversation_row = store
        .conversation_by_id(conversation)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(conversation_row.message_count, 3);
    assert_eq!(
        conversation_row.context_tokens,
        context.iter().map(|item| item.tokens).sum::<u64>()
    );
}

/// One identity rule, whichever path a message arrives by.
async fn message_identity_keeps_repeats_and_drops_redeliveries(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "ids")).await.unwrap().id;
    let ingested = |outcome: IngestOutcome| -> Vec<bool> {
        stored(outcome).iter().map(|r| r.ingested).collect()
    };
    let turn = |advancement: &str, index: u32, text: &str| {
        let mut message = new_message(text, 1, None);
        message.identity.turn = Some((advancement.to_owned(), index));
        message
    };
    // Unidentified equal messages are distinct messages.
    let plain = (0..6)
        .map(|i| new_message(if i % 2 == 0 { "continue" } else { "ok" }, 1, None))
        .collect();
    assert_eq!(
        ingested(store.ingest(conversation, plain, None).await.unwrap()),
        [true; 6]
    );
    // Two turns of equal messages: both kept; the same turn again: nothing new.
    for (advancement, expected) in [
        ("k1", [true, true]),
        ("k2", [true, true]),
        ("k1", [false, false]),
    ] {
        let outcome = store
            .ingest(
                conversation,
                vec![turn(advancement, 0, "continue"), turn(advancement, 1, "ok")],
                None,
            )
            .await
            .unwrap();
        assert_eq!(ingested(outcome), expected, "turn {advancement}");
    }
    // The same messages by another path, at the places they hold (seq 6 and 7): recognised.
    let again = store
        .ingest(
            conversation,
            vec![
                placed(new_message("continue", 1, Some("t-6")), 6),
                placed(new_message("ok", 1, Some("t-7")), 7),
                // At a place that holds something else: a new message.
                placed(new_message("ok", 1, Some("t-8")), 8),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(ingested(again), [false, false, true]);
    assert_eq!(
        store
            .conversation_by_id(conversation)
            .await
            .unwrap()
            .unwrap()
            .message_count,
        11
    );
}

async fn the_message_json_is_kept_exactly(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let line = r#"{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","thinkingSignature":"sig"},{"type":"mystery","x":1}],"usage":{"input":3,"cost":{"total":0.1}},"timestamp":5,"vendorField":[1,2]}"#;
    let message = NewMessage::from_json(line, Some("e1".to_owned()), 7).unwrap();
    let id = stored(
        store
            .ingest(conversation, vec![message], None)
            .await
            .unwrap(),
    )[0]
    .message_id;
    let back = store.message(id).await.unwrap().unwrap();
    let original: serde_json::Value = serde_json::from_str(line).unwrap();
    let round: serde_json::Value = serde_json::from_str(&back.json).unwrap();
    assert_eq!(round, original);
    assert_eq!(back.tokens, 7);
    assert_eq!(back.created_at_ms, 5);
}

async fn replace_publishes_a_summary_only_if_the_plan_is_current(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let batch = (0..6)
        .map(|i| {
            new_message(
                &format!("message number {i}"),
                1_000 + i,
                Some(&format!("e{i}")),
            )
        })
        .collect();
    store.ingest(conversation, batch, None).await.unwrap();
    let context = store.context(conversation).await.unwrap();
    let positions: Vec<i64> = context.iter().map(|item| item.position).collect();
    assert_eq!(positions, [0, 1024, 2048, 3072, 4096, 5120]);

    // Two plans over overlapping ranges: the first wins, the second is stale.
    let first = plan(conversation, &context, 0..3, "the first three messages");
    let second = plan(
        conversation,
        &context,
        2..4,
        "a plan made before the first landed",
    );
    let ReplaceOutcome::Replaced(summary) = store.replace(first.clone()).await.unwrap() else {
        panic!("the first plan must land");
    };
    assert_eq!(store.replace(second).await.unwrap(), ReplaceOutcome::Stale);
    assert_eq!(store.replace(first).await.unwrap(), ReplaceOutcome::Stale);
    assert!(summary.summary_id.starts_with("sum_"));
    assert_eq!((summary.first_seq, summary.last_seq), (0, 2));
    assert_eq!(
        (summary.earliest_at_ms, summary.latest_at_ms),
        (Some(1_000), Some(1_002))
    );

    let after = store.context(conversation).await.unwrap();
    assert_eq!(after.len(), 4);
    assert_eq!(
        after[0].position, 0,
        "the summary takes the first position; nothing is renumbered"
    );
    assert!(
        matches!(&after[0].content, ItemContent::Summary(s) if s.summary_id == summary.summary_id)
    );
    assert_eq!(after[1].position, 3072);
    let children = store.children(summary.row_id).await.unwrap();
    assert_eq!(children.len(), 3);
    assert_eq!(
        store
            .parent_of(context[1].item_ref())
            .await
            .unwrap()
            .unwrap()
            .summary_id,
        summary.summary_id
    );
    let row = store
        .conversation_by_id(conversation)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.context_tokens,
        after.iter().map(|item| item.tokens).sum::<u64>()
    );
    // A plan with a hole is not contiguous: refused.
    let holey = ReplacePlan {
        conversation,
        items: vec![
            (after[1].position, after[1].item_ref()),
            (after[3].position, after[3].item_ref()),
        ],
        summary: leaf("holey"),
    };
    assert_eq!(store.replace(holey).await.unwrap(), ReplaceOutcome::Stale);
    assert!(store.integrity_check().await.unwrap().is_healthy());
}

async fn an_advancement_key_commits_a_turn_once(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let turn = || {
        vec![
            new_message("a turn", 1, None),
            new_message("its reply", 2, None),
        ]
    };
    let first = store
        .ingest(conversation, turn(), Some("turn-1".to_owned()))
        .await
        .unwrap();
    assert!(matches!(first, IngestOutcome::Stored(ref r) if r.len() == 2));
    let second = store
        .ingest(conversation, turn(), Some("turn-1".to_owned()))
        .await
        .unwrap();
    assert_eq!(second, IngestOutcome::DuplicateTurn);
}

async fn blobs_grants_and_state(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let blob = NewBlob {
        conversation,
        kind: "log".to_owned(),
        content: "line one\nline two\nline three\n".to_owned(),
        description: "a log of 3 lines".to_owned(),
    };
    let info = store.put_blob(blob.clone()).await.unwrap();
    assert!(info.blob_id.starts_with("file_"));
    assert_eq!((info.lines, info.bytes), (3, 29));
    assert_eq!(
        store.put_blob(blob).await.unwrap().blob_id,
        info.blob_id,
        "content-addressed"
    );
    assert_eq!(
        store.blob_content(&info.blob_id).await.unwrap().unwrap(),
        "line one\nline two\nline three\n"
    );

    let grant = store
        .create_grant(NewGrant {
            grantee: "agent:main:child".to_owned(),
            conversation,
            expires_at_ms: 10,
            token_cap: 4_000,
        })
        .await
        .unwrap();
    assert_eq!(
        store.grants("agent:main:child").await.unwrap(),
        std::slice::from_ref(&grant)
    );
    assert_eq!(store.revoke_grants("agent:main:child").await.unwrap(), 1);
    assert!(store.grants("agent:main:child").await.unwrap()[0].revoked);
    store.delete_grant(grant.id).await.unwrap();
    assert!(store.grants("agent:main:child").await.unwrap().is_empty());

    store
        .set_state(conversation, "bootstrap.offset", "120")
        .await
        .unwrap();
    store
        .set_state(conversation, "bootstrap.offset", "240")
        .await
        .unwrap();
    assert_eq!(
        store
            .state(conversation, "bootstrap.offset")
            .await
            .unwrap()
            .as_deref(),
        Some("240")
    );
}

async fn bad_input_is_a_clear_error_and_loses_nothing(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    store
        .ingest(conversation, vec![new_message("kept", 1, Some("e1"))], None)
        .await
        .unwrap();

    let invalid = NewMessage::from_json(r#"{"content":"no role"}"#, None, 1).unwrap_err();
    assert!(
        invalid
            .to_string()
            .contains("invalid message: message has no `role`"),
        "{invalid}"
    );
    let not_json = NewMessage::from_json("{not json", None, 1).unwrap_err();
    assert!(
        not_json.to_string().starts_with("invalid message:"),
        "{not_json}"
    );

    let huge = "x".repeat(MAX_MESSAGE_BYTES + 1);
    let error = store
        .ingest(
            conversation,
            vec![new_message("fine", 2, None), new_message(&huge, 3, None)],
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::MessageTooLarge { .. }),
        "{error}"
    );
    // The batch is refused whole; what was stored before is intact.
    let context = store.context(conversation).await.unwrap();
    assert_eq!(context.len(), 1);
}

async fn a_summary_is_rewritten_in_place_and_a_context_can_be_emptied(backend: &Backend) {
    use vilvona_core::summarize::SummaryLevel;
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let batch = (0..4)
        .map(|i| new_message(&format!("raw {i}"), i, Some(&format!("e{i}"))))
        .collect();
    store.ingest(conversation, batch, None).await.unwrap();
    let context = store.context(conversation).await.unwrap();
    let mut fallback = plan(conversation, &context, 0..3, "[fallback] raw 0 raw 1");
    fallback.summary.level = SummaryLevel::Fallback;
    let ReplaceOutcome::Replaced(summary) = store.replace(fallback).await.unwrap() else {
        panic!()
    };
    let update = SummaryUpdate {
        row_id: summary.row_id,
        expected_level: SummaryLevel::Fallback,
        expected_summarizer: summary.summarizer.clone(),
        content: "a real summary of raw zero to two".to_owned(),
        tokens: 2,
        level: SummaryLevel::Normal,
        summarizer: "test/v2".to_owned(),
    };
    assert!(store.update_summary(update.clone()).await.unwrap());
    assert!(
        !store.update_summary(update).await.unwrap(),
        "the level changed: refused"
    );
    let rewritten = store.summary(summary.row_id).await.unwrap().unwrap();
    assert_eq!(
        (rewritten.summary_id.as_str(), rewritten.level),
        (summary.summary_id.as_str(), SummaryLevel::Normal)
    );
    assert_eq!(
        store.children(summary.row_id).await.unwrap().len(),
        3,
        "edges kept"
    );
    let hits = store
        .search(query("main", vec![conversation], "real summary"))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert!(
        store
            .search(query("main", vec![conversation], "fallback"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.integrity_check().await.unwrap().is_healthy());

    let fork = store.conversation(&key("main", "child")).await.unwrap().id;
    store
        .append_items(
            fork,
            context.iter().skip(3).map(|item| item.item_ref()).collect(),
        )
        .await
        .unwrap();
    assert_eq!(store.context(fork).await.unwrap().len(), 1);
    assert_eq!(store.remove_context(fork).await.unwrap(), 1);
    assert!(store.context(fork).await.unwrap().is_empty());
    assert_eq!(
        store
            .conversation_by_id(fork)
            .await
            .unwrap()
            .unwrap()
            .context_tokens,
        0
    );
}

/// The summaries a stand-in wrote: a truncation (level `Fallback`) and one the fallback
/// summarizer wrote in place of the configured one (level `Normal`); a rewrite takes each off
/// the list, and a second rewrite of what the first already rewrote is refused; one folded
/// under a parent stays on it, after those in the context.
async fn the_summaries_a_stand_in_wrote_are_found_until_rewritten(backend: &Backend) {
    use vilvona_core::summarize::SummaryLevel;
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let batch = (0..6)
        .map(|i| new_message(&format!("raw {i}"), i, Some(&format!("e{i}"))))
        .collect();
    store.ingest(conversation, batch, None).await.unwrap();
    let context = store.context(conversation).await.unwrap();
    let mut truncated = plan(conversation, &context, 0..2, "[fallback] raw 0 raw 1");
    truncated.summary.level = SummaryLevel::Fallback;
    let mut stood_in = plan(
        conversation,
        &context,
        2..4,
        "raw 2 and raw 3, extractively",
    );
    stood_in.summary.summarizer = stand_in_summarizer("extractive/v1", "host-llm/v1");
    let modeled = plan(
        conversation,
        &context,
        4..6,
        "raw 4 and raw 5, by the model",
    );
    for plan in [truncated, stood_in, modeled] {
        assert!(matches!(
            store.replace(plan).await.unwrap(),
            ReplaceOutcome::Replaced(_)
        ));
    }
    let found = store.stand_in_summaries(conversation).await.unwrap();
    assert_eq!(
        found
            .iter()
            .map(|summary| summary.summarizer.as_str())
            .collect::<Vec<_>>(),
        ["test/v1", "extractive/v1 in place of host-llm/v1"]
    );
    assert_eq!(found[0].level, SummaryLevel::Fallback);
    let rewrite = SummaryUpdate {
        row_id: found[1].row_id,
        expected_level: SummaryLevel::Normal,
        expected_summarizer: found[1].summarizer.clone(),
        content: "raw 2 and raw 3, by the model".to_owned(),
        tokens: 8,
        level: SummaryLevel::Normal,
        summarizer: "host-llm/v1".to_owned(),
    };
    assert!(store.update_summary(rewrite.clone()).await.unwrap());
    assert!(
        !store.update_summary(rewrite).await.unwrap(),
        "already rewritten: refused"
    );
    let left = store.stand_in_summaries(conversation).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].row_id, found[0].row_id);
    // Folded under a parent a stand-in wrote: still found, after the context's.
    let context = store.context(conversation).await.unwrap();
    let mut condensed = plan(conversation, &context, 0..2, "both, extractively");
    condensed.summary.kind = vilvona_core::summarize::SummaryKind::Condensed;
    condensed.summary.depth = 1;
    condensed.summary.summarizer = stand_in_summarizer("extractive/v1", "host-llm/v1");
    assert!(matches!(
        store.replace(condensed).await.unwrap(),
        ReplaceOutcome::Replaced(_)
    ));
    let left = store.stand_in_summaries(conversation).await.unwrap();
    assert_eq!(
        left.iter()
            .map(|summary| (summary.depth, summary.summarizer.as_str()))
            .collect::<Vec<_>>(),
        [(1, "extractive/v1 in place of host-llm/v1"), (0, "test/v1")],
        "the context's first, then the folded one"
    );
}

/// A process killed while it sets up a fresh store (`.ci/run`'s hundred kills once landed
/// between two migrations) must leave either no store or a whole one: a store stuck at an
/// older schema is refused by every read-only command until a writer migrates it. Here the
/// set-up fails at the second migration instead, the same cut made deterministic.
async fn a_set_up_that_stops_partway_leaves_no_half_made_store(backend: &Backend) {
    // What stops the second migration, the error that names it, and what undoes it.
    let (sabotage, refused_by, undo) = match backend {
        // Migration 2 creates `blob_references`: a table already there fails it.
        Backend::Sqlite(_) => (
            "CREATE TABLE blob_references (x)",
            "blob_references",
            "DROP TABLE blob_references",
        ),
        // Migration 2 drops an index migration 1 made: a trigger refuses every DROP INDEX.
        Backend::Postgres(..) => (
            "CREATE FUNCTION refuse() RETURNS event_trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'refused for the test'; END $$;
             CREATE EVENT TRIGGER refuse_drops ON ddl_command_start WHEN TAG IN ('DROP INDEX')
                 EXECUTE FUNCTION refuse();",
            "refused for the test",
            "DROP EVENT TRIGGER refuse_drops; DROP FUNCTION refuse();",
        ),
    };
    backend.execute_batch(sabotage).await;
    // The error and its causes, as the command line prints them.
    let failed = backend.try_open().await.err().map(|error| {
        std::iter::successors(Some(&error as &dyn std::error::Error), |error| {
            error.source()
        })
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
    });
    assert!(
        failed
            .as_deref()
            .is_some_and(|error| error.contains(refused_by)),
        "the set-up did not stop at the second migration: {failed:?}"
    );
    match backend {
        Backend::Sqlite(dir) => {
            let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
            let tables: i64 = connection
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'conversations'",
                    [],
                    |row| row.get(0),
                )
                .unwrap();
            assert_eq!(tables, 0, "migration 1's tables outlived the failed set-up");
            let version: i64 = connection
                .pragma_query_value(None, "user_version", |row| row.get(0))
                .unwrap();
            assert_eq!(version, 0, "the failed set-up left a schema version");
        }
        Backend::Postgres(url, _) => {
            let rows = postgres_query(
                url,
                "SELECT count(*) FROM pg_tables WHERE tablename IN ('conversations', 'vilvona_schema')",
            )
            .await;
            // (The version's table is one of them.)
            assert_eq!(rows, 0, "migration 1's tables outlived the failed set-up");
        }
    }
    // A read-only open finds no store yet (not one "predating this build").
    let error = backend
        .try_open_read_only()
        .await
        .err()
        .map(|e| e.to_string());
    assert!(
        error
            .as_deref()
            .is_some_and(|error| error.contains("unknown store")),
        "{error:?}"
    );
    // The cause gone, the next writer sets the store up whole.
    backend.execute_batch(undo).await;
    let store = backend.open().await;
    store.conversation(&key("main", "s1")).await.unwrap();
    drop(store);
    backend.open_read_only().await;
}
