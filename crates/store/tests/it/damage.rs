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

/// Corruption is reported as corruption, a cut log as a cut log. After a clean stop the log is
/// 0 bytes and SQLite never deletes it: a damaged database was then reported as a cut log (a
/// passing failure, the server restarted on every call) because the check read only the log's
/// first bytes. What decides now is the log's index: it claims frames only while a log holds
/// them. A reader holds the database all along and never lets go (as the panel's server may).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_beside_an_empty_log_is_corruption() {
    let dir = TempDir::new().unwrap();
    let (store, _) = filled(&dir).await;
    store.close().await.unwrap();
    drop(store);
    let database = dir.path().join(DATABASE_FILE);
    let reader = rusqlite::Connection::open(&database).unwrap();
    reader
        .set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
    reader
        .query_row("SELECT count(*) FROM conversations", [], |row| {
            row.get::<_, i64>(0)
        })
        .unwrap();
    let log = dir.path().join(format!("{DATABASE_FILE}-wal"));
    assert_eq!(
        std::fs::metadata(&log).map(|metadata| metadata.len()).ok(),
        Some(0),
        "a clean stop leaves an empty log (else this tests nothing)"
    );
    // Every page but the first overwritten.
    let length = std::fs::metadata(&database).unwrap().len() as usize;
    let mut bytes = std::fs::read(&database).unwrap();
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    bytes[page..length].fill(0x5a);
    std::fs::write(&database, bytes).unwrap();
    let Err(error) = Store::open(StoreConfig::new(dir.path())).await else {
        panic!("a damaged database does not open");
    };
    assert!(!error.needs_reopen(), "reported as a cut log: {error}");
    drop(reader);
}

/// A log cut to a length that keeps its header, under a process that has the database open,
/// is a cut log (the check read only the header, and found it whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_short_of_its_frames_is_a_cut_log() {
    let dir = TempDir::new().unwrap();
    let (store, conversation) = filled(&dir).await;
    let log = dir.path().join(format!("{DATABASE_FILE}-wal"));
    let held = std::fs::metadata(&log).unwrap().len();
    assert!(held > 4096, "the turns are in the log ({held} bytes)");
    // The header and part of the first frame stay.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(100)
        .unwrap();
    let Err(error) = store
        .ingest(
            conversation,
            vec![new_message("after the cut", 99, None)],
            None,
        )
        .await
    else {
        panic!("nothing more is acknowledged through a cut log");
    };
    assert!(matches!(error, StoreError::LogLost { .. }), "{error}");
}

/// A log deleted under a process that has the database open, its index still claiming frames,
/// is a lost log: nothing more is acknowledged (the check read a missing log as no log at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_deleted_while_its_index_claims_frames_is_a_lost_log() {
    let dir = TempDir::new().unwrap();
    let (store, conversation) = filled(&dir).await;
    let log = dir.path().join(format!("{DATABASE_FILE}-wal"));
    let held = std::fs::metadata(&log).unwrap().len();
    assert!(held > 4096, "the turns are in the log ({held} bytes)");
    std::fs::remove_file(&log).unwrap();
    let Err(error) = store
        .ingest(
            conversation,
            vec![new_message("after the log went", 99, None)],
            None,
        )
        .await
    else {
        panic!("nothing more is acknowledged once the log is gone");
    };
    assert!(matches!(error, StoreError::LogLost { .. }), "{error}");
}
