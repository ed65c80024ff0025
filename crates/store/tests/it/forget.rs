//! Forgetting: everything of a conversation goes in one transaction; a writer killed at any
//! write of it leaves the old state or the new one, never half of it.

use std::path::Path;

use tempfile::TempDir;
use vilvona_store::*;

use crate::support::*;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Two conversations: `s1` with messages, two leaves, a blob only it references and a blob
/// `s2` references too; `s2` with its own messages.
async fn two_conversations(dir: &TempDir) -> (ConversationId, ConversationId, String, String) {
    let store = open(dir).await;
    let s1 = store.conversation(&key("main", "s1")).await.unwrap().id;
    let s2 = store.conversation(&key("main", "s2")).await.unwrap().id;
    let mut blobs = Vec::new();
    for (name, content) in [
        ("own", "zebrafinch ledger ".repeat(300)),
        ("shared", "heronpond shared log ".repeat(300)),
    ] {
        let info = store
            .put_blob(NewBlob {
                conversation: s1,
                kind: "log".to_owned(),
                content,
                description: name.to_owned(),
            })
            .await
            .unwrap();
        blobs.push(info.blob_id);
    }
    let reference = |blob: &str, entry: &str| NewMessage {
        message: serde_json::from_value(serde_json::json!({
            "role": "toolResult", "toolCallId": "c", "toolName": "exec", "timestamp": 5,
            "content": [{"type": "text", "text": "[stored]", BLOB_ID_KEY: blob}]
        }))
        .unwrap(),
        identity: MessageIdentity {
            entry_id: Some(entry.to_owned()),
            ..MessageIdentity::default()
        },
        tokens: 5,
    };
    for turn in 0..4 {
        let batch = (0..3)
            .map(|i| {
                new_message(
                    &format!("s1 turn {turn} note {i}: the quokka password is QK-{turn}{i}"),
                    turn * 10 + i,
                    Some(&format!("a{turn}{i}")),
                )
            })
            .collect();
        store.ingest(s1, batch, None).await.unwrap();
    }
    store
        .ingest(
            s1,
            vec![reference(&blobs[0], "b0"), reference(&blobs[1], "b1")],
            None,
        )
        .await
        .unwrap();
    store
        .ingest(
            s2,
            vec![
                new_message("s2 keeps the heron notes", 1, Some("c0")),
                reference(&blobs[1], "c1"),
            ],
            None,
        )
        .await
        .unwrap();
    for content in ["leaf one about quokka", "leaf two about quokka"] {
        let context = store.context(s1).await.unwrap();
        let first = context
            .iter()
            .position(|item| matches!(item.content, ItemContent::Message(_)))
            .unwrap();
        store
            .replace(plan(s1, &context, first..first + 3, content))
            .await
            .unwrap();
    }
    store.close().await.unwrap();
    (s1, s2, blobs[0].clone(), blobs[1].clone())
}

fn whole(conversation: ConversationId) -> ForgetPlan {
    ForgetPlan::whole(conversation)
}

/// `Some(true)`: s1 is whole; `Some(false)`: s1 is gone with all that was only its; `None`:
/// anything in between.
async fn state_of(
    store: &Store,
    s1: ConversationId,
    s2: ConversationId,
    own: &str,
    shared: &str,
) -> Option<bool> {
    let conversations: Vec<ConversationId> = store
        .conversations(Some("main"))
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    let quokka = store
        .search(query("main", vec![s1, s2], "quokka"))
        .await
        .unwrap()
        .len();
    let own_blob = store.blob_info(own).await.unwrap().is_some();
    let shared_readers = store.blob_readers(shared).await.unwrap();
    let s2_found = store
        .search(query("main", vec![s2], "heron"))
        .await
        .unwrap()
        .len();
    assert_eq!(s2_found, 1, "s2 keeps its message");
    assert!(
        store.blob_info(shared).await.unwrap().is_some(),
        "s2 still references the shared blob"
    );
    match (
        conversations.contains(&s1),
        quokka,
        own_blob,
        shared_readers.contains(&s1),
    ) {
        (true, n, true, true) if n >= 10 => Some(true),
        (false, 0, false, false) => Some(false),
        _ => None,
    }
}

#[tokio::test]
async fn forgetting_a_conversation_is_all_or_nothing_at_every_write() {
    let pristine = TempDir::new().unwrap();
    let (s1, s2, own, shared) = two_conversations(&pristine).await;
    let mut saw_old = 0;
    for crash_at in 1..200 {
        let dir = TempDir::new().unwrap();
        copy_dir(pristine.path(), dir.path());
        let mut config = StoreConfig::new(dir.path());
        config.faults.crash_at_write = Some(crash_at);
        let store = Store::open(config).await.unwrap();
        let outcome = store.forget(whole(s1)).await;
        drop(store);
        let store = open(&dir).await;
        let report = store.integrity_check().await.unwrap();
        assert!(
            report.is_healthy(),
            "crash at {crash_at}: {:?}",
            report.problems
        );
        match state_of(&store, s1, s2, &own, &shared).await {
            Some(true) => {
                assert!(
                    outcome.is_err(),
                    "acknowledged but not applied (crash at {crash_at})"
                );
                saw_old += 1;
            }
            Some(false) => {
                if outcome.is_ok() {
                    assert!(saw_old > 5, "the forget makes several writes");
                    return;
                }
            }
            None => panic!("a half-forgotten conversation after a crash at write {crash_at}"),
        }
    }
    panic!("the forget never completed");
}

/// Fills `conversations` with 400 messages each.
async fn filled(dir: &TempDir, conversations: &[&str]) -> (Store, Vec<ConversationId>) {
    let store = open(dir).await;
    let text = "a line of history that takes space in the database and in the index ".repeat(20);
    let mut ids = Vec::new();
    for tag in conversations {
        let conversation = store.conversation(&key("main", tag)).await.unwrap().id;
        ids.push(conversation);
        for batch in 0..40 {
            let messages = (0..10)
                .map(|i| {
                    new_message(
                        &format!("{tag}{batch}-{i} {text}"),
                        batch * 10 + i,
                        Some(&format!("{tag}{batch}-{i}")),
                    )
                })
                .collect();
            store.ingest(conversation, messages, None).await.unwrap();
        }
    }
    store.flush_index().await.unwrap();
    (store, ids)
}

/// After forgetting one of two equal conversations, the store is about the size of a store
/// that only ever held the other.
#[tokio::test]
async fn forgetting_a_conversation_reclaims_its_space() {
    let only = TempDir::new().unwrap();
    let (alone, _) = filled(&only, &["keep"]).await;
    let alone_bytes = alone.reclaim_space().await.unwrap().bytes_after;

    let dir = TempDir::new().unwrap();
    let (store, ids) = filled(&dir, &["keep", "gone"]).await;
    let before = store.reclaim_space().await.unwrap().bytes_after;
    let report = store.forget(whole(ids[1])).await.unwrap().unwrap();
    assert_eq!(report.messages, 400);
    let after = store.reclaim_space().await.unwrap().bytes_after;
    assert!(
        after * 100 <= alone_bytes * 110 && after * 100 <= before * 75,
        "{before} bytes with both, {after} after forgetting one; {alone_bytes} for one alone"
    );
    assert!(store.integrity_check().await.unwrap().is_healthy());
    assert_eq!(
        store
            .search(query("main", vec![ids[0]], "keep39"))
            .await
            .unwrap()
            .len(),
        10
    );
    assert!(
        store
            .search(query("main", ids.clone(), "gone39"))
            .await
            .unwrap()
            .is_empty()
    );
}

/// The integrity check follows the DAG as a graph: rows below an unreachable summary are
/// unreachable too, and a cycle is named.
#[tokio::test]
async fn the_integrity_check_follows_the_dag_as_a_graph() {
    let dir = TempDir::new().unwrap();
    let (s1, _, _, _) = two_conversations(&dir).await;
    let store = open(&dir).await;
    assert!(store.integrity_check().await.unwrap().is_healthy());
    let view = store.dag_view(s1).await.unwrap();
    assert_eq!(view.summaries.len(), 2);
    assert!(
        view.summaries
            .iter()
            .all(|s| s.in_context && s.child_messages == 3)
    );
    store.close().await.unwrap();
    drop(store);

    let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    let (first, second): (i64, i64) = connection
        .query_row("SELECT min(id), max(id) FROM summaries", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap();
    connection
        .execute("DELETE FROM context_items WHERE summary_id = ?1", [first])
        .unwrap();
    drop(connection);
    let store = open(&dir).await;
    let problems = store.integrity_check().await.unwrap().problems;
    assert!(
        problems.contains(&"3 messages unreachable from the context".to_owned()),
        "{problems:?}"
    );
    assert!(
        problems.contains(&"1 summaries unreachable from the context".to_owned()),
        "{problems:?}"
    );
    store.close().await.unwrap();
    drop(store);

    let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    connection
        .execute_batch(&format!(
            "INSERT INTO summary_edges (parent_id, ordinal, child_summary_id) VALUES ({first}, 99, {second});
             INSERT INTO summary_edges (parent_id, ordinal, child_summary_id) VALUES ({second}, 99, {first});"
        ))
        .unwrap();
    drop(connection);
    let store = open(&dir).await;
    let problems = store.integrity_check().await.unwrap().problems;
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("the summary DAG has a cycle")),
        "{problems:?}"
    );
}
