//! Damage: the index is disposable (any file of it missing or truncated, before or while the
//! store is open, is healed by rebuilding from SQLite), and a damaged database row is skipped
//! and named, never a reason for the rest to go unsearchable.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use vilvona_store::*;

use crate::support::*;

async fn filled(dir: &TempDir) -> (Store, ConversationId) {
    let store = open(dir).await;
    let conversation = store.conversation(&key("main", "d")).await.unwrap().id;
    for batch in 0..4 {
        let messages = (0..10)
            .map(|i| {
                let n = batch * 10 + i;
                new_message(
                    &format!("note {n}: the shard{n} rollover is tracked"),
                    n,
                    None,
                )
            })
            .collect();
        store.ingest(conversation, messages, None).await.unwrap();
        // A commit per batch: several segments.
        store.flush_index().await.unwrap();
    }
    (store, conversation)
}

/// Every file of the index with the given extension.
fn index_files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join(INDEX_DIR))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|found| found == extension))
        .collect()
}

async fn finds_everything(store: &Store, conversation: ConversationId) {
    for n in [0, 17, 39] {
        let hits = store
            .search(query("main", vec![conversation], &format!("shard{n}")))
            .await
            .unwrap();
        assert_eq!(hits.len(), 1, "shard{n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_truncated_index_file_is_healed_at_open() {
    for (extension, truncate) in [
        ("idx", false),
        ("term", true),
        ("fast", false),
        ("pos", true),
    ] {
        let dir = TempDir::new().unwrap();
        let (store, conversation) = filled(&dir).await;
        store.close().await.unwrap();
        drop(store);
        let victim = index_files(dir.path(), extension).pop().unwrap();
        if truncate {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&victim)
                .unwrap()
                .set_len(3)
                .unwrap();
        } else {
            std::fs::remove_file(&victim).unwrap();
        }
        // A read-only open does not repair, but still finds everything (in SQLite).
        let reader = Store::open_read_only(dir.path()).await.unwrap();
        finds_everything(&reader, conversation).await;
        let problems = reader.integrity_check().await.unwrap().problems;
        assert!(
            problems
                .iter()
                .any(|problem| problem.contains("recall index cannot be read")),
            "{extension}: doctor is told: {problems:?}"
        );
        // A writing open moves the damaged index aside and rebuilds it.
        let store = open(&dir).await;
        finds_everything(&store, conversation).await;
        assert_eq!(store.index_doc_count().await.unwrap(), 40, "{extension}");
        let report = store.integrity_check().await.unwrap();
        assert!(report.is_healthy(), "{extension}: {:?}", report.problems);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_while_open_falls_back_to_the_database_and_is_rebuilt() {
    let dir = TempDir::new().unwrap();
    let (store, conversation) = filled(&dir).await;
    for victim in index_files(dir.path(), "idx") {
        std::fs::remove_file(victim).unwrap();
    }
    // Found anyway, from SQLite.
    finds_everything(&store, conversation).await;
    // The maintainer notices and rebuilds beside, then swaps.
    let mut healthy = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        if store.integrity_check().await.unwrap().is_healthy() {
            healthy = true;
            break;
        }
    }
    assert!(healthy, "the index was rebuilt");
    assert_eq!(store.index_doc_count().await.unwrap(), 40);
    finds_everything(&store, conversation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_row_is_skipped_and_named() {
    let dir = TempDir::new().unwrap();
    let (store, conversation) = filled(&dir).await;
    store.close().await.unwrap();
    drop(store);
    {
        let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        connection
            .execute(
                "UPDATE messages SET json = x'0a000000ffffffff' WHERE seq = 5",
                [],
            )
            .unwrap();
    }
    let store = open(&dir).await;
    // The rebuild goes through, skipping the row; the rest is found.
    assert_eq!(store.rebuild_index().await.unwrap(), 39);
    finds_everything(&store, conversation).await;
    let report = store.integrity_check().await.unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|problem| problem.contains("cannot be decoded")),
        "{:?}",
        report.problems
    );
}
