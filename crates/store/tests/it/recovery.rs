//! Crash recovery of the index, rebuilds, damaged files and the integrity check.

use tempfile::TempDir;
use vilvona_store::*;

use crate::support::*;

async fn ingest_some(store: &Store, conversation: ConversationId, from: usize, count: usize) {
    let batch = (from..from + count)
        .map(|i| {
            new_message(
                &format!("note {i} about shard{i} rollover"),
                i as i64,
                Some(&format!("e{i}")),
            )
        })
        .collect();
    store.ingest(conversation, batch, None).await.unwrap();
}

#[tokio::test]
async fn the_index_catches_up_after_a_crash_between_the_two_commits() {
    let dir = TempDir::new().unwrap();
    {
        let mut config = StoreConfig::new(dir.path());
        config.faults.skip_index_commits = true;
        let store = Store::open(config).await.unwrap();
        let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
        ingest_some(&store, conversation, 0, 20).await;
        // SQLite committed; the index never did. The process "dies" here.
    }
    let store = open(&dir).await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    let hits = store
        .search(query("main", vec![conversation], "shard17"))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(store.index_doc_count().await.unwrap(), 20);
    let report = store.integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{:?}", report.problems);
    assert_eq!(report.indexed_messages_through, 20);
}

#[tokio::test]
async fn a_rebuild_equals_the_incremental_index() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir).await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    ingest_some(&store, conversation, 0, 30).await;
    let context = store.context(conversation).await.unwrap();
    store
        .replace(plan(
            conversation,
            &context,
            0..10,
            "shard rollover notes 0 to 9",
        ))
        .await
        .unwrap();
    let probes = ["shard3", "rollover", "notes", "shard29"];
    let mut before = Vec::new();
    for probe in probes {
        before.push(
            store
                .search(query("main", vec![conversation], probe))
                .await
                .unwrap(),
        );
    }
    assert_eq!(store.rebuild_index().await.unwrap(), 31);
    for (probe, expected) in probes.iter().zip(before) {
        let after = store
            .search(query("main", vec![conversation], probe))
            .await
            .unwrap();
        let ids = |hits: &[SearchHit]| {
            let mut ids: Vec<String> = hits.iter().map(|h| format!("{:?}", h.source)).collect();
            ids.sort();
            ids
        };
        assert_eq!(ids(&after), ids(&expected), "{probe}");
    }
}

#[tokio::test]
async fn a_missing_index_directory_is_rebuilt_from_the_database() {
    let dir = TempDir::new().unwrap();
    {
        let store = open(&dir).await;
        let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
        ingest_some(&store, conversation, 0, 5).await;
        store.close().await.unwrap();
    }
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    let store = open(&dir).await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    assert_eq!(
        store
            .search(query("main", vec![conversation], "shard4"))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn a_corrupted_database_file_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join(DATABASE_FILE), vec![0x5a; 8192]).unwrap();
    let error = Store::open(StoreConfig::new(dir.path())).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("vilvona.db: not a usable vilvona database"),
        "{text}"
    );
    assert!(text.contains("move it aside"), "{text}");
    // The file is left as it was for the operator to inspect.
    assert_eq!(
        std::fs::read(dir.path().join(DATABASE_FILE)).unwrap(),
        vec![0x5a; 8192]
    );
}

#[tokio::test]
async fn the_integrity_check_catches_a_broken_edge_and_an_orphan() {
    let dir = TempDir::new().unwrap();
    {
        let store = open(&dir).await;
        let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
        ingest_some(&store, conversation, 0, 6).await;
        let context = store.context(conversation).await.unwrap();
        store
            .replace(plan(conversation, &context, 0..3, "first three"))
            .await
            .unwrap();
        assert!(store.integrity_check().await.unwrap().is_healthy());
        store.close().await.unwrap();
    }
    {
        // Damage the database behind the store's back: an edge to a message that does not exist
        // and a message dropped from the context without a summary over it.
        let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        connection
            .pragma_update(None, "foreign_keys", "OFF")
            .unwrap();
        connection
            .execute(
                "UPDATE summary_edges SET child_message_id = 999 WHERE ordinal = 1",
                [],
            )
            .unwrap();
        connection
            .execute(
                "DELETE FROM context_items WHERE position = (SELECT max(position) FROM context_items)",
                [],
            )
            .unwrap();
    }
    let store = open(&dir).await;
    let report = store.integrity_check().await.unwrap();
    let problems = report.problems.join("\n");
    assert!(
        problems.contains("1 summary edges that point at nothing"),
        "{problems}"
    );
    assert!(
        problems.contains("2 messages unreachable from the context"),
        "{problems}"
    );
    assert!(
        problems.contains("running context-token total drifted"),
        "{problems}"
    );
}
