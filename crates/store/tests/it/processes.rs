//! Several stores on one directory at once, as several processes open it: a second writer, a
//! read-only reader, fresh opens racing the migration. The index lock and SQLite's file locks
//! behave the same between two handles of one process as between two processes.

use std::time::Duration;

use tempfile::TempDir;
use vilvona_store::*;

use crate::support::*;

fn slow_commits(dir: &TempDir) -> StoreConfig {
    StoreConfig {
        // The index commits only at close: every search below reads SQLite for new rows.
        index_commit_delay: Some(Duration::from_secs(3_600)),
        ..StoreConfig::new(dir.path())
    }
}

/// Two writers on one directory, opened in turn, each with a conversation of its own (`a` and
/// `b`). The second cannot take the index lock; it opens anyway.
async fn two_writers(dir: &TempDir) -> ((Store, ConversationId), (Store, ConversationId)) {
    let first = Store::open(slow_commits(dir)).await.unwrap();
    let second = Store::open(slow_commits(dir)).await.unwrap();
    let a = first.conversation(&key("main", "a")).await.unwrap().id;
    let b = second.conversation(&key("main", "b")).await.unwrap().id;
    ((first, a), (second, b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_works_without_the_index_and_everything_is_found_at_once() {
    let dir = TempDir::new().unwrap();
    let ((first, a), (second, b)) = two_writers(&dir).await;
    first
        .ingest(
            a,
            vec![new_message("the rollout ticket is OPS-111", 1, None)],
            None,
        )
        .await
        .unwrap();
    second
        .ingest(
            b,
            vec![new_message("the rollback ticket is OPS-222", 2, None)],
            None,
        )
        .await
        .unwrap();
    // Acknowledged, not committed to the index: found by both, by text and by phrase.
    for store in [&first, &second] {
        let hits = store
            .search(query("main", vec![a, b], "ticket"))
            .await
            .unwrap();
        assert_eq!(hits.len(), 2, "{hits:?}");
        let mut phrase = query("main", vec![b], "rollback ticket");
        phrase.mode = SearchMode::Phrase;
        assert_eq!(store.search(phrase).await.unwrap().len(), 1);
    }
    // A reader opened now sees both too.
    let reader = Store::open_read_only(dir.path()).await.unwrap();
    assert_eq!(
        reader
            .search(query("main", vec![a, b], "ticket"))
            .await
            .unwrap()
            .len(),
        2
    );
    // The maintainer leaves; the second writer takes the index over and catches up.
    first.close().await.unwrap();
    second
        .ingest(
            b,
            vec![new_message("the third ticket is OPS-333", 3, None)],
            None,
        )
        .await
        .unwrap();
    let mut indexed = 0;
    for _ in 0..100 {
        second.flush_index().await.unwrap();
        indexed = second.index_doc_count().await.unwrap();
        if indexed == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        indexed, 3,
        "the second writer took over and indexed every row"
    );
    assert!(second.integrity_check().await.unwrap().is_healthy());
}

#[tokio::test]
async fn a_read_only_store_reads_and_never_writes() {
    let dir = TempDir::new().unwrap();
    let writer = open(&dir).await;
    let conversation = writer.conversation(&key("main", "s")).await.unwrap().id;
    writer
        .ingest(
            conversation,
            vec![new_message("kept verbatim", 1, None)],
            None,
        )
        .await
        .unwrap();
    let reader = Store::open_read_only(dir.path()).await.unwrap();
    assert!(reader.is_read_only());
    assert_eq!(reader.context(conversation).await.unwrap().len(), 1);
    assert_eq!(
        reader.conversation(&key("main", "s")).await.unwrap().id,
        conversation
    );
    // An unknown session is not created by a reader.
    let unknown = reader
        .conversation(&key("main", "nobody"))
        .await
        .unwrap_err();
    assert!(matches!(unknown, StoreError::NotFound { .. }), "{unknown}");
    assert_eq!(writer.conversations(None).await.unwrap().len(), 1);
    let refused = reader
        .ingest(conversation, vec![new_message("no", 2, None)], None)
        .await
        .unwrap_err();
    assert!(matches!(refused, StoreError::ReadOnly(_)), "{refused}");
    assert!(reader.integrity_check().await.unwrap().is_healthy());
    // No store at all: a clear error, and nothing is created.
    let empty = TempDir::new().unwrap();
    let missing = Store::open_read_only(empty.path().join("none"))
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("unknown store"), "{missing}");
    assert!(!empty.path().join("none").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_opens_racing_the_migration_all_succeed() {
    let dir = TempDir::new().unwrap();
    let opens: Vec<_> = (0..8)
        .map(|_| tokio::spawn(Store::open(StoreConfig::new(dir.path()))))
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap());
    }
    for (index, store) in stores.iter().enumerate() {
        let conversation = store
            .conversation(&key("main", &format!("s{index}")))
            .await
            .unwrap()
            .id;
        store
            .ingest(conversation, vec![new_message("hello", 1, None)], None)
            .await
            .unwrap();
    }
    assert_eq!(stores[0].conversations(None).await.unwrap().len(), 8);
}

/// One writer trains the store's compression dictionary once the store holds enough messages
/// and compresses what it learned from again; a second writer that opened before reads those
/// rows, adopts the same dictionary instead of training its own, and every handle opened later
/// reads everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dictionary_is_trained_and_every_writer_and_reader_uses_it() {
    let dir = TempDir::new().unwrap();
    let ((first, a), (second, b)) = two_writers(&dir).await;
    let lines: Vec<String> = (0..1_100).map(line).collect();
    for (batch, chunk) in lines.chunks(50).enumerate() {
        let messages = chunk
            .iter()
            .enumerate()
            .map(|(index, text)| new_message(text, (batch * 50 + index) as i64, None))
            .collect();
        first.ingest(a, messages, None).await.unwrap();
    }
    assert_eq!(dictionaries(&dir), 1);
    assert_eq!(zstd_rows(&dir), vec![true; 1_100]);
    assert_eq!(texts(&second, a, 1_100).await, lines);

    // The second writer still compresses with lz4, until it crosses the line itself and finds
    // the dictionary stored.
    second
        .ingest(b, vec![new_message("before adopting", 1, None)], None)
        .await
        .unwrap();
    second
        .ingest(b, vec![new_message("after adopting", 2, None)], None)
        .await
        .unwrap();
    assert_eq!(zstd_rows(&dir)[1_100..], [false, true]);
    assert_eq!(dictionaries(&dir), 1);
    assert_eq!(
        texts(&first, b, 2).await,
        ["before adopting", "after adopting"]
    );

    first.close().await.unwrap();
    second.close().await.unwrap();
    let reopened = Store::open(slow_commits(&dir)).await.unwrap();
    reopened
        .ingest(b, vec![new_message("after reopening", 3, None)], None)
        .await
        .unwrap();
    assert_eq!(zstd_rows(&dir)[1_102..], [true]);
    let reader = Store::open_read_only(dir.path()).await.unwrap();
    assert_eq!(texts(&reader, a, 1_100).await, lines);
    assert_eq!(texts(&reader, b, 3).await.len(), 3);
    let hits = reader
        .search(query("main", vec![a], "region"))
        .await
        .unwrap();
    assert!(!hits.is_empty());
    assert!(reader.integrity_check().await.unwrap().is_healthy());
}

/// Two writers appending at once while a third party folds the log and truncates it (as a
/// writer does when it closes): the log grows, is restarted and cut to nothing under each
/// writer's check before and after its write, and none of that is a cut log. Every write is
/// acknowledged and stored (a check that read the log's length before its index saw frames
/// appended in between as frames missing: 4 messages of 16 concurrent replays were lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_log_restarted_and_truncated_by_others_is_never_taken_for_a_cut_one() {
    let dir = TempDir::new().unwrap();
    let ((first, a), (second, b)) = two_writers(&dir).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let folder = {
        let (database, stop) = (dir.path().join(DATABASE_FILE), stop.clone());
        std::thread::spawn(move || {
            let connection = rusqlite::Connection::open(database).unwrap();
            connection.busy_timeout(Duration::from_millis(5)).unwrap();
            let mut folds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                folds += usize::from(
                    connection
                        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                        .is_ok(),
                );
            }
            folds
        })
    };
    tokio::join!(append_bulky(&first, a, "a"), append_bulky(&second, b, "b"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        folder.join().unwrap() > 0,
        "the log was folded at least once"
    );
    for (store, conversation) in [(&first, a), (&second, b)] {
        let stored = store
            .conversation_by_id(conversation)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.message_count, 200);
    }
}

/// 200 messages of about 2 kB each, one write each.
async fn append_bulky(store: &Store, conversation: ConversationId, name: &str) {
    let bulky = "the deploy log line repeats until the page fills ".repeat(40);
    for n in 0..200 {
        store
            .ingest(
                conversation,
                vec![new_message(&format!("{name} {n}: {bulky}"), n, None)],
                None,
            )
            .await
            .unwrap_or_else(|error| panic!("{name}'s write {n}: {error}"));
    }
}
