//! Fault injection in the style of redb: fail the N-th write, or kill the writer at the N-th
//! write, reopen, and check every acknowledged message is present and consistent.

use tempfile::TempDir;
use vilvona_store::*;

use crate::support::*;

/// Drives a fixed workload through a store with `faults`, returning the entry ids whose ingest
/// was acknowledged and the summaries whose publication was acknowledged.
async fn workload(dir: &TempDir, faults: FaultPlan) -> (Vec<String>, Vec<String>) {
    let store = open_with(dir, faults).await;
    run_workload(&store).await
}

async fn open_with(dir: &TempDir, faults: FaultPlan) -> Store {
    let mut config = StoreConfig::new(dir.path());
    config.faults = faults;
    Store::open(config).await.unwrap()
}

/// Every write statement the workload makes is covered when the fault points run from 1 to
/// this: the first crash point after which the writer is still alive for one more write
/// (survival is monotonic in the crash point, so a binary search finds it).
async fn fault_points() -> u64 {
    let survives = |n: u64| async move {
        let dir = TempDir::new().unwrap();
        let store = open_with(
            &dir,
            FaultPlan {
                crash_at_write: Some(n),
                ..FaultPlan::default()
            },
        )
        .await;
        run_workload(&store).await;
        store.set_store_state("probe", "alive").await.is_ok()
    };
    let (mut dead, mut alive) = (0, 4096);
    assert!(survives(alive).await, "the workload makes over 4096 writes");
    while alive - dead > 1 {
        let middle = (dead + alive) / 2;
        if survives(middle).await {
            alive = middle;
        } else {
            dead = middle;
        }
    }
    alive
}

async fn run_workload(store: &Store) -> (Vec<String>, Vec<String>) {
    let mut acknowledged = Vec::new();
    let mut summaries = Vec::new();
    let Ok(Conversation {
        id: conversation, ..
    }) = store.conversation(&key("main", "s1")).await
    else {
        return (acknowledged, summaries);
    };
    for turn in 0..8 {
        let ids: Vec<String> = (0..3).map(|i| format!("t{turn}m{i}")).collect();
        let batch = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                new_message(
                    &format!("turn {turn} message {i}"),
                    turn * 10 + i as i64,
                    Some(id),
                )
            })
            .collect();
        if store.ingest(conversation, batch, None).await.is_ok() {
            acknowledged.extend(ids);
        }
        if turn % 3 == 2 {
            let Ok(context) = store.context(conversation).await else {
                continue;
            };
            let messages: Vec<usize> = (0..context.len())
                .filter(|&i| matches!(context[i].content, ItemContent::Message(_)))
                .take(4)
                .collect();
            if messages.len() == 4 && messages[3] == messages[0] + 3 {
                let plan = plan(
                    conversation,
                    &context,
                    messages[0]..messages[3] + 1,
                    &format!("summary at turn {turn}"),
                );
                if let Ok(ReplaceOutcome::Replaced(summary)) = store.replace(plan).await {
                    summaries.push(summary.summary_id);
                }
            }
        }
    }
    (acknowledged, summaries)
}

async fn check_after_reopen(
    dir: &TempDir,
    acknowledged: &[String],
    summaries: &[String],
    label: &str,
) {
    let store = open(dir).await;
    let report = store.integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{label}: {:?}", report.problems);
    let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
    // Every acknowledged message is stored: re-ingesting it stores nothing new.
    for id in acknowledged {
        let again = stored(
            store
                .ingest(
                    conversation,
                    vec![new_message("ignored text", 0, Some(id))],
                    None,
                )
                .await
                .unwrap(),
        );
        assert!(
            !again[0].ingested,
            "{label}: acknowledged message {id} was lost"
        );
    }
    for summary_id in summaries {
        assert!(
            store.summary_by_id(summary_id).await.unwrap().is_some(),
            "{label}: acknowledged summary {summary_id} was lost"
        );
    }
    // And the index agrees with the database after the reopen's catch-up.
    let report = store.integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{label}: {:?}", report.problems);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nth_write_fails() {
    for n in 1..=fault_points().await {
        let dir = TempDir::new().unwrap();
        let (acknowledged, summaries) = workload(
            &dir,
            FaultPlan {
                fail_write_at: Some(n),
                ..FaultPlan::default()
            },
        )
        .await;
        check_after_reopen(
            &dir,
            &acknowledged,
            &summaries,
            &format!("fail at write {n}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_dies_at_the_nth_write() {
    for n in 1..=fault_points().await {
        let dir = TempDir::new().unwrap();
        let (acknowledged, summaries) = workload(
            &dir,
            FaultPlan {
                crash_at_write: Some(n),
                ..FaultPlan::default()
            },
        )
        .await;
        check_after_reopen(
            &dir,
            &acknowledged,
            &summaries,
            &format!("crash at write {n}"),
        )
        .await;
    }
}

/// Ingests 1,000 messages in batches of 50 (the last batch crosses the line at which the
/// store trains its compression dictionary); answers whether every ingest was acknowledged.
///
/// The writes are counted from the store's open, so the same write must have the same number
/// in every run: the index is committed on a timer too (it writes its watermark), which under
/// load fell between other batches each run. Here it is committed only when the store closes.
async fn dictionary_workload(dir: &TempDir, faults: FaultPlan) -> bool {
    let mut config = StoreConfig::new(dir.path());
    config.faults = faults;
    config.index_commit_delay = Some(std::time::Duration::from_secs(24 * 3600));
    let store = Store::open(config).await.unwrap();
    let Ok(conversation) = store.conversation(&key("main", "s1")).await else {
        return false;
    };
    for batch in 0..20 {
        let messages = (batch * 50..batch * 50 + 50)
            .map(|index| new_message(&line(index), index as i64, None))
            .collect();
        if store.ingest(conversation.id, messages, None).await.is_err() {
            return false;
        }
    }
    true
}

/// A failure or a kill anywhere in the transaction that stores the dictionary and compresses
/// the messages again with it (every one of its writes is tried at its first, second, middle
/// and last) loses nothing: the messages stay lz4 and read back, and the store trains its
/// dictionary at the next ingest after it reopens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_while_the_dictionary_is_stored_loses_nothing() {
    // The first write of the dictionary's transaction: every ingest before it is acknowledged
    // from there on (a fault at an earlier write fails one of them).
    let (mut failing, mut first) = (0, 1 << 12);
    while first - failing > 1 {
        let middle = (failing + first) / 2;
        let dir = TempDir::new().unwrap();
        let plan = FaultPlan {
            fail_write_at: Some(middle),
            ..FaultPlan::default()
        };
        if dictionary_workload(&dir, plan).await {
            first = middle;
        } else {
            failing = middle;
        }
    }
    let lines: Vec<String> = (0..1_000).map(line).collect();
    for n in [first, first + 1, first + 500, first + 1_000] {
        for plan in [
            FaultPlan {
                fail_write_at: Some(n),
                ..FaultPlan::default()
            },
            FaultPlan {
                crash_at_write: Some(n),
                ..FaultPlan::default()
            },
        ] {
            let dir = TempDir::new().unwrap();
            assert!(dictionary_workload(&dir, plan).await, "{plan:?}");
            assert_eq!(dictionaries(&dir), 0, "{plan:?}");
            assert_eq!(zstd_rows(&dir), vec![false; 1_000], "{plan:?}");
            let store = open(&dir).await;
            let conversation = store.conversation(&key("main", "s1")).await.unwrap().id;
            assert_eq!(texts(&store, conversation, 1_000).await, lines, "{plan:?}");
            store
                .ingest(
                    conversation,
                    vec![new_message("one more", 1_000, None)],
                    None,
                )
                .await
                .unwrap();
            assert_eq!(dictionaries(&dir), 1, "{plan:?}");
            assert_eq!(zstd_rows(&dir)[1..], vec![true; 1_000], "{plan:?}");
            assert_eq!(texts(&store, conversation, 1_000).await, lines, "{plan:?}");
            assert!(store.integrity_check().await.unwrap().is_healthy());
        }
    }
}
