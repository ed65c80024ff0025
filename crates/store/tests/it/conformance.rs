//! The store conformance suite: the same cases, unchanged, against both backends — the
//! embedded SQLite store and PostgreSQL. Each case takes a [`Backend`], from which it opens as
//! many stores as it needs (two stores on one backend are two nodes: two processes on one
//! store directory, or two gateways on one database).
//!
//! PostgreSQL cases run on the server `VILVONA_TEST_POSTGRES_URL` names (a database each);
//! `.ci/run` starts one with `scripts/postgres-test-server.sh`. They are ignored unless asked
//! for (`cargo test -- --include-ignored`), so a run without a server shows them as not run;
//! asked for without a server, they fail.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SummaryKind, SummaryLevel};
use vilvona_store::*;

use crate::support::*;

/// Why a PostgreSQL case fails when it is asked for without a server.
pub(crate) const NEEDS_POSTGRES: &str = "this test needs PostgreSQL (scripts/postgres-test-server.sh starts one; export the URL it prints as VILVONA_TEST_POSTGRES_URL)";

/// Where the stores of one case live.
pub(crate) enum Backend {
    Sqlite(TempDir),
    /// A database, and the local index directories of the nodes opened on it.
    Postgres(String, std::sync::Mutex<Vec<TempDir>>),
}

impl Backend {
    pub(crate) fn sqlite() -> Backend {
        Backend::Sqlite(TempDir::new().unwrap())
    }

    /// A fresh database on the test server `VILVONA_TEST_POSTGRES_URL` names. The PostgreSQL
    /// cases are ignored unless asked for (`cargo test -- --include-ignored`, as `.ci/run`
    /// does); asked for without a server, they fail.
    pub(crate) async fn postgres() -> Backend {
        let base = std::env::var("VILVONA_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| panic!("{NEEDS_POSTGRES}: VILVONA_TEST_POSTGRES_URL is unset"));
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "vilvona_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|error| panic!("the test server at {base:?}: {error}"));
        let running = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        drop(client);
        let _ = running.await;
        Backend::Postgres(
            format!("{base} dbname={name}"),
            std::sync::Mutex::new(Vec::new()),
        )
    }

    /// A store on this backend (each call: another node, with its own index).
    pub(crate) async fn open(&self) -> Arc<dyn HistoryStore> {
        self.open_with(builtin_embedder()).await
    }

    /// [`Backend::open`] with an embedding model (`None`: none).
    pub(crate) async fn open_with(
        &self,
        embedder: Option<Arc<dyn Embedder>>,
    ) -> Arc<dyn HistoryStore> {
        self.try_open_with(embedder).await.unwrap()
    }

    /// [`Backend::open`], its failure returned.
    pub(crate) async fn try_open(&self) -> Result<Arc<dyn HistoryStore>, StoreError> {
        self.try_open_with(builtin_embedder()).await
    }

    async fn try_open_with(
        &self,
        embedder: Option<Arc<dyn Embedder>>,
    ) -> Result<Arc<dyn HistoryStore>, StoreError> {
        Ok(match self {
            Backend::Sqlite(dir) => Arc::new(
                Store::open(StoreConfig {
                    embedder,
                    ..StoreConfig::new(dir.path())
                })
                .await?,
            ),
            Backend::Postgres(url, nodes) => {
                let node = TempDir::new().unwrap();
                let store = PgStore::open_with(url, Some(node.path()), embedder).await?;
                nodes.lock().unwrap().push(node);
                Arc::new(store)
            }
        })
    }

    /// A store on this backend that only reads (beside the first node's index).
    pub(crate) async fn open_read_only(&self) -> Arc<dyn HistoryStore> {
        self.try_open_read_only().await.unwrap()
    }

    /// Runs `sql` on this backend's database, beside the store.
    pub(crate) async fn execute_batch(&self, sql: &str) {
        match self {
            Backend::Sqlite(dir) => rusqlite::Connection::open(dir.path().join(DATABASE_FILE))
                .unwrap()
                .execute_batch(sql)
                .unwrap(),
            Backend::Postgres(url, _) => postgres_batch(url, sql).await,
        }
    }

    /// [`Backend::open_read_only`], its failure returned.
    pub(crate) async fn try_open_read_only(&self) -> Result<Arc<dyn HistoryStore>, StoreError> {
        Ok(match self {
            Backend::Sqlite(dir) => Arc::new(Store::open_read_only(dir.path()).await?),
            Backend::Postgres(url, nodes) => {
                let first = nodes
                    .lock()
                    .unwrap()
                    .first()
                    .map(|node| node.path().to_owned());
                Arc::new(PgStore::open_read_only(url, first.as_deref()).await?)
            }
        })
    }
}

/// Runs `sql` on the PostgreSQL database `url` names.
async fn postgres_batch(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let running = tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap();
    drop(client);
    let _ = running.await;
}

/// The one `bigint` a query on the PostgreSQL database `url` names answers.
pub(crate) async fn postgres_query(url: &str, sql: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let running = tokio::spawn(connection);
    let value = client.query_one(sql, &[]).await.unwrap().get(0);
    drop(client);
    let _ = running.await;
    value
}

/// Runs each case once per backend: `sqlite::case` and `postgres::case`.
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Backend::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs PostgreSQL: scripts/postgres-test-server.sh starts one, .ci/run runs these"]
                async fn $case() {
                    super::$case(&super::Backend::postgres().await).await;
                }
            )*
        }
    };
}

pub(crate) use on_both_backends;

on_both_backends!(
    ingest_stores_each_message_once,
    replace_is_compare_and_swap,
    the_dag_reads_back,
    two_nodes_compacting_one_run_publish_one_summary,
    two_nodes_ingesting_one_session_store_each_message_once,
    forks_grants_state_and_blobs,
    a_fork_and_its_parent_fold_the_same_rows,
    a_retired_session_keeps_its_rows_and_its_id_begins_anew,
    search_answers_alike,
    a_read_only_store_refuses_writes,
    export_and_import_round_trip,
    forgetting_removes_rows_and_what_derives_from_them,
    every_node_finds_what_another_wrote_and_loses_what_it_forgot,
    a_model_behind_an_endpoint_embeds_in_the_background,
    a_rewritten_summary_keeps_every_holders_total_in_step,
    forgetting_a_parent_or_a_fork_takes_the_folds_of_its_rows_in_every_conversation,
);

/// Each conversation's running total equals what its context holds, and the store is sound.
async fn totals_in_step_and_sound(store: &Arc<dyn HistoryStore>, conversations: &[ConversationId]) {
    for conversation in conversations {
        let row = store
            .conversation_by_id(*conversation)
            .await
            .unwrap()
            .unwrap();
        let held: u64 = store
            .context(*conversation)
            .await
            .unwrap()
            .iter()
            .map(|item| item.tokens)
            .sum();
        assert_eq!(row.context_tokens, held, "session {}", row.session_id);
    }
    let report = store.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// A summary rewritten in place (a stand-in rewritten by the model) changes the total of every
/// conversation that holds it: its own and a fork's that holds it by reference. Before, the
/// whole change went to the summary's own conversation, once per holder.
async fn a_rewritten_summary_keeps_every_holders_total_in_step(backend: &Backend) {
    let store = backend.open().await;
    let parent = store
        .conversation(&key("main", "rewritten"))
        .await
        .unwrap()
        .id;
    let fork = store
        .conversation(&key("main", "rewritten-fork"))
        .await
        .unwrap()
        .id;
    store
        .ingest(
            parent,
            (0..4)
                .map(|n| new_message(&format!("rewritten message {n}"), 100 + n, None))
                .collect(),
            None,
        )
        .await
        .unwrap();
    let context = store.context(parent).await.unwrap();
    let ReplaceOutcome::Replaced(summary) = store
        .replace(plan(parent, &context, 0..2, "a short stand-in"))
        .await
        .unwrap()
    else {
        panic!("published")
    };
    let seed = store
        .context_refs(parent)
        .await
        .unwrap()
        .iter()
        .map(|item| item.item)
        .collect();
    store.append_items(fork, seed).await.unwrap();
    totals_in_step_and_sound(&store, &[parent, fork]).await;
    let update = |tokens: u64, expected: &str| SummaryUpdate {
        row_id: summary.row_id,
        expected_level: SummaryLevel::Normal,
        expected_summarizer: expected.to_owned(),
        content: "the model's summary, longer than the stand-in it replaces".to_owned(),
        tokens,
        level: SummaryLevel::Normal,
        summarizer: "model/v1".to_owned(),
    };
    assert!(
        store
            .update_summary(update(summary.tokens + 50, "test/v1"))
            .await
            .unwrap()
    );
    totals_in_step_and_sound(&store, &[parent, fork]).await;
    // Read first elsewhere, rewritten since: refused, and nothing moves.
    assert!(!store.update_summary(update(3, "test/v1")).await.unwrap());
    totals_in_step_and_sound(&store, &[parent, fork]).await;
}

/// A fork folds its parent's rows; a fork of the fork condenses those folds. Forgetting the
/// fork takes the grandchild's condensed fold with it; forgetting the parent takes every fold
/// of its rows, whichever conversation made it: no text of them is left, and the store is
/// sound. Before, a whole-session forget took only the session's own summaries.
async fn forgetting_a_parent_or_a_fork_takes_the_folds_of_its_rows_in_every_conversation(
    backend: &Backend,
) {
    let store = backend.open().await;
    let parent = store.conversation(&key("main", "fp")).await.unwrap().id;
    let fork = store
        .conversation(&key("main", "fp-fork"))
        .await
        .unwrap()
        .id;
    let grandchild = store
        .conversation(&key("main", "fp-grandchild"))
        .await
        .unwrap()
        .id;
    store
        .ingest(
            parent,
            (0..6)
                .map(|n| new_message(&format!("parent secret zebrafinch{n}"), 100 + n, None))
                .collect(),
            None,
        )
        .await
        .unwrap();
    let seed = |from: ConversationId| {
        let store = store.clone();
        async move {
            store
                .context_refs(from)
                .await
                .unwrap()
                .iter()
                .map(|item| item.item)
                .collect::<Vec<_>>()
        }
    };
    store.append_items(fork, seed(parent).await).await.unwrap();
    // The fork folds its parent's rows, twice.
    for (range, text) in [
        (0..2, "fork leaf of zebrafinch0 and 1"),
        (1..3, "fork leaf of zebrafinch2 and 3"),
    ] {
        let context = store.context(fork).await.unwrap();
        assert!(matches!(
            store
                .replace(plan(fork, &context, range, text))
                .await
                .unwrap(),
            ReplaceOutcome::Replaced(_)
        ));
    }
    // The grandchild, seeded with the fork's context, condenses the fork's two leaves.
    store
        .append_items(grandchild, seed(fork).await)
        .await
        .unwrap();
    let context = store.context(grandchild).await.unwrap();
    let condensed = ReplacePlan {
        summary: NewSummary {
            kind: SummaryKind::Condensed,
            depth: 1,
            ..leaf("grandchild condensed zebrafinch0 to 3")
        },
        ..plan(grandchild, &context, 0..2, "")
    };
    let ReplaceOutcome::Replaced(condensed) = store.replace(condensed).await.unwrap() else {
        panic!("published")
    };
    totals_in_step_and_sound(&store, &[parent, fork, grandchild]).await;

    // The fork goes: the grandchild's fold of its folds goes with it (nothing of it remains).
    let whole = ForgetPlan::whole(fork);
    assert_eq!(
        store.forget(whole).await.unwrap(),
        None,
        "a plan that leaves the grandchild's fold is stale"
    );
    let plan_fork = ForgetPlan {
        removed: vec![condensed.row_id],
        ..ForgetPlan::whole(fork)
    };
    store.forget(plan_fork).await.unwrap().unwrap();
    assert_eq!(store.summary(condensed.row_id).await.unwrap(), None);
    totals_in_step_and_sound(&store, &[parent, grandchild]).await;

    // A second fork folds the parent's rows again; then the parent goes, and every fold of
    // its rows with it.
    let second = store
        .conversation(&key("main", "fp-second"))
        .await
        .unwrap()
        .id;
    store
        .append_items(second, seed(parent).await)
        .await
        .unwrap();
    let context = store.context(second).await.unwrap();
    let ReplaceOutcome::Replaced(second_leaf) = store
        .replace(plan(
            second,
            &context,
            0..3,
            "second fork leaf of zebrafinch0 to 2",
        ))
        .await
        .unwrap()
    else {
        panic!("published")
    };
    let above: Vec<SummaryRowId> = store
        .summaries_above(parent, None)
        .await
        .unwrap()
        .into_iter()
        .filter(|summary| summary.conversation != parent)
        .map(|summary| summary.row_id)
        .collect();
    assert_eq!(above, vec![second_leaf.row_id]);
    let every = vec![parent, fork, grandchild, second];
    let mut regex = query("main", every.clone(), "zebrafinch");
    regex.mode = SearchMode::Regex;
    regex.limit = 100;
    let before = store.search(regex.clone()).await.unwrap();
    assert!(
        before
            .iter()
            .any(|hit| matches!(hit.source, HitSource::Summary { .. })),
        "the folds are found before: {before:?}"
    );
    let plan_parent = ForgetPlan {
        removed: above,
        ..ForgetPlan::whole(parent)
    };
    store.forget(plan_parent).await.unwrap().unwrap();
    totals_in_step_and_sound(&store, &[grandchild, second]).await;
    for conversation in [grandchild, second] {
        assert!(store.context(conversation).await.unwrap().is_empty());
    }
    assert_eq!(store.summary(second_leaf.row_id).await.unwrap(), None);
    let found = store
        .search(query("main", every.clone(), "zebrafinch0 zebrafinch3"))
        .await
        .unwrap();
    assert!(found.is_empty(), "{found:?}");
    assert!(store.search(regex).await.unwrap().is_empty());
    for conversation in every {
        let view = store.dag_view(conversation).await.unwrap();
        assert!(view.summaries.is_empty(), "{view:?}");
    }
}

fn turn_message(text: &str, key: &str, index: u32) -> NewMessage {
    NewMessage {
        message: user(text, 1_000 + i64::from(index)),
        identity: MessageIdentity {
            turn: Some((key.to_owned(), index)),
            ..MessageIdentity::default()
        },
        tokens: 10,
    }
}

async fn ingest_stores_each_message_once(backend: &Backend) {
    let store = backend.open().await;
    let conversation = store.conversation(&key("main", "s1")).await.unwrap();
    assert_eq!(
        store.conversation(&key("main", "s1")).await.unwrap().id,
        conversation.id,
        "found, not created twice"
    );
    let id = conversation.id;
    // Equal messages without identity are distinct messages.
    let same: Vec<NewMessage> = (0..6)
        .map(|n| new_message(if n % 2 == 0 { "hi" } else { "ok" }, 1, None))
        .collect();
    assert_eq!(
        store.ingest(id, same, None).await.unwrap().newly_stored(),
        6
    );
    // An entry id is the identity: a redelivery stores nothing.
    let entry = vec![new_message("with an id", 2, Some("e1"))];
    let first = stored(store.ingest(id, entry.clone(), None).await.unwrap());
    let again = stored(store.ingest(id, entry, None).await.unwrap());
    assert!(first[0].ingested && !again[0].ingested);
    assert_eq!(first[0].message_id, again[0].message_id);
    // Twice in one call: stored once.
    let twice = vec![
        new_message("twice", 3, Some("e2")),
        new_message("twice", 3, Some("e2")),
    ];
    let twice = stored(store.ingest(id, twice, None).await.unwrap());
    assert_eq!(
        twice.iter().map(|r| r.ingested).collect::<Vec<_>>(),
        vec![true, false]
    );
    assert_eq!(twice[0].message_id, twice[1].message_id);
    // A durable turn happens once per advancement key.
    let turn = vec![
        turn_message("turn a", "k1", 0),
        turn_message("turn b", "k1", 1),
    ];
    assert_eq!(
        store
            .ingest(id, turn.clone(), Some("k1".to_owned()))
            .await
            .unwrap()
            .newly_stored(),
        2
    );
    assert_eq!(
        store
            .ingest(id, turn.clone(), Some("k1".to_owned()))
            .await
            .unwrap(),
        IngestOutcome::DuplicateTurn
    );
    // Without the key, the turn slots still identify the messages.
    assert_eq!(
        store.ingest(id, turn, None).await.unwrap().newly_stored(),
        0
    );
    // A message known by its place is the stored one when equal, a new one when not.
    let placed_same = placed(new_message("hi", 1, None), 0);
    let placed_other = placed(new_message("something else", 1, None), 1);
    let results = stored(
        store
            .ingest(id, vec![placed_same, placed_other], None)
            .await
            .unwrap(),
    );
    assert_eq!(
        results
            .iter()
            .map(|r| (r.seq, r.ingested))
            .collect::<Vec<_>>(),
        vec![(0, false), (10, true)]
    );
    let conversation = store.conversation_by_id(id).await.unwrap().unwrap();
    assert_eq!(conversation.stored_messages, 11);
    let context = store.context(id).await.unwrap();
    assert_eq!(context.len(), 11);
    assert_eq!(
        conversation.context_tokens,
        context.iter().map(|item| item.tokens).sum::<u64>()
    );
    let messages = store.messages_in_seq_range(id, 6, 8).await.unwrap();
    assert_eq!(
        messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![6, 7, 8]
    );
    assert_eq!(messages[1].text(), "twice");
    assert_eq!(
        store.message(messages[0].id).await.unwrap().unwrap(),
        messages[0]
    );
    // Stored verbatim.
    let json = &store
        .message(first[0].message_id)
        .await
        .unwrap()
        .unwrap()
        .json;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(json).unwrap(),
        json!({"role": "user", "content": "with an id", "timestamp": 2})
    );
}

async fn replace_is_compare_and_swap(backend: &Backend) {
    let store = backend.open().await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    let messages: Vec<NewMessage> = (0..6)
        .map(|n| new_message(&format!("message {n}"), 100 + n, Some(&format!("e{n}"))))
        .collect();
    store.ingest(id, messages, None).await.unwrap();
    let context = store.context(id).await.unwrap();
    let first = plan(id, &context, 0..3, "the first three");
    let ReplaceOutcome::Replaced(leaf) = store.replace(first.clone()).await.unwrap() else {
        panic!("the first replace publishes");
    };
    assert_eq!(
        (
            leaf.first_seq,
            leaf.last_seq,
            leaf.earliest_at_ms,
            leaf.latest_at_ms
        ),
        (0, 2, Some(100), Some(102))
    );
    assert_eq!(
        store.replace(first).await.unwrap(),
        ReplaceOutcome::Stale,
        "the run is no longer there"
    );
    // A plan made before another change to its run is stale too.
    let context = store.context(id).await.unwrap();
    assert_eq!(context.len(), 4);
    let mut moved = plan(id, &context, 1..3, "moved");
    moved.items[1].0 += 1;
    assert_eq!(store.replace(moved).await.unwrap(), ReplaceOutcome::Stale);
    let conversation = store.conversation_by_id(id).await.unwrap().unwrap();
    assert_eq!(
        conversation.context_tokens,
        context.iter().map(|item| item.tokens).sum::<u64>()
    );
    assert_eq!(context[0].tokens, leaf.tokens);
    let refs = store.context_refs(id).await.unwrap();
    assert_eq!(
        refs[0].summary,
        Some(SummaryShape {
            depth: 0,
            level: SummaryLevel::Normal,
            first_seq: leaf.first_seq,
            last_seq: leaf.last_seq,
        })
    );
    assert_eq!(
        refs.iter().map(|r| r.item).collect::<Vec<_>>(),
        context
            .iter()
            .map(ContextItem::item_ref)
            .collect::<Vec<_>>()
    );
}

async fn the_dag_reads_back(backend: &Backend) {
    let store = backend.open().await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    let messages: Vec<NewMessage> = (0..8)
        .map(|n| new_message(&format!("m{n}"), 100 + n, None))
        .collect();
    let ids = stored(store.ingest(id, messages, None).await.unwrap());
    for _ in 0..2 {
        let context = store.context(id).await.unwrap();
        let start = context
            .iter()
            .position(|item| matches!(item.content, ItemContent::Message(_)))
            .unwrap();
        store
            .replace(plan(id, &context, start..start + 3, "a leaf"))
            .await
            .unwrap();
    }
    let context = store.context(id).await.unwrap();
    let mut condensed = plan(id, &context, 0..2, "both leaves");
    condensed.summary.kind = SummaryKind::Condensed;
    condensed.summary.depth = 1;
    let ReplaceOutcome::Replaced(top) = store.replace(condensed).await.unwrap() else {
        panic!("published");
    };
    assert_eq!((top.first_seq, top.last_seq), (0, 5));
    let children = store.children(top.row_id).await.unwrap();
    assert_eq!(children.len(), 2);
    let ItemContent::Summary(leaf) = &children[0] else {
        panic!("a condensed summary's children are summaries");
    };
    let grandchildren = store.children(leaf.row_id).await.unwrap();
    assert!(matches!(&grandchildren[0], ItemContent::Message(m) if m.id == ids[0].message_id));
    let first = ItemRef::Message(ids[0].message_id);
    assert_eq!(
        store.parent_of(first).await.unwrap().unwrap().row_id,
        leaf.row_id
    );
    assert_eq!(
        store.top_ancestor(first).await.unwrap().unwrap().row_id,
        top.row_id
    );
    assert_eq!(
        store
            .top_ancestor(ItemRef::Message(ids[7].message_id))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.summary_by_id(&top.summary_id).await.unwrap().unwrap(),
        top
    );
    let items = store
        .items(vec![ItemRef::Summary(top.row_id), first])
        .await
        .unwrap();
    assert!(matches!(&items[1], ItemContent::Message(m) if m.seq == 0));
    // A search's hits each name the summary that covers them now, as the walk up does for one
    // item (the search walks its hits together, sharing their steps).
    let mut every_row = query("main", vec![id], "m0 m1 m2 m3 m4 m5 m6 m7 leaf leaves");
    every_row.limit = 20;
    let hits = store.search(every_row).await.unwrap();
    assert_eq!(hits.len(), 11, "eight messages and three summaries");
    for hit in &hits {
        let item = hit.source.item_ref();
        let walked = store.top_ancestor(item).await.unwrap();
        assert_eq!(
            hit.covered_by,
            walked.map(|summary| summary.summary_id),
            "{item:?}"
        );
    }
    let view = store.dag_view(id).await.unwrap();
    assert_eq!(view.summaries.len(), 3);
    assert_eq!(view.summaries[0].child_summaries.len(), 2);
    assert_eq!(view.raw_messages, 2);
    // Each summary's time span is the stored one (the panel shows it on the DAG's rows).
    assert!(top.earliest_at_ms.is_some() && top.latest_at_ms.is_some());
    assert_eq!(
        (
            view.summaries[0].earliest_at_ms,
            view.summaries[0].latest_at_ms
        ),
        (top.earliest_at_ms, top.latest_at_ms)
    );
    let above = store.summaries_above(id, None).await.unwrap();
    assert_eq!(above.len(), 3);
    assert_eq!(above.last().unwrap().row_id, top.row_id);
    // Re-summarizing a fallback node in place.
    let fallback = leaf.clone();
    assert!(
        !store
            .update_summary(SummaryUpdate {
                row_id: fallback.row_id,
                expected_level: SummaryLevel::Fallback,
                expected_summarizer: fallback.summarizer.clone(),
                content: "never".to_owned(),
                tokens: 1,
                level: SummaryLevel::Normal,
                summarizer: "test/v2".to_owned(),
            })
            .await
            .unwrap(),
        "the level changed meanwhile"
    );
    assert!(
        store
            .update_summary(SummaryUpdate {
                row_id: top.row_id,
                expected_level: SummaryLevel::Normal,
                expected_summarizer: top.summarizer.clone(),
                content: "both leaves, rewritten".to_owned(),
                tokens: top.tokens + 5,
                level: SummaryLevel::Normal,
                summarizer: "test/v2".to_owned(),
            })
            .await
            .unwrap()
    );
    let conversation = store.conversation_by_id(id).await.unwrap().unwrap();
    let context = store.context(id).await.unwrap();
    assert_eq!(
        conversation.context_tokens,
        context.iter().map(|item| item.tokens).sum::<u64>()
    );
    let report = store.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!((report.messages, report.summaries), (8, 3));
}

async fn two_nodes_compacting_one_run_publish_one_summary(backend: &Backend) {
    let (a, b) = (backend.open().await, backend.open().await);
    let id = a.conversation(&key("main", "s1")).await.unwrap().id;
    a.ingest(
        id,
        (0..40)
            .map(|n| new_message(&format!("message {n}"), n, Some(&format!("e{n}"))))
            .collect(),
        None,
    )
    .await
    .unwrap();
    for round in 0..5 {
        // Both plan the same run of the context as they read it, and race to publish.
        let context = a.context(id).await.unwrap();
        let start = context
            .iter()
            .position(|item| matches!(item.content, ItemContent::Message(_)))
            .unwrap();
        let run = start..start + 4;
        let plan_a = plan(id, &context, run.clone(), &format!("round {round} by a"));
        let plan_b = plan(
            id,
            &b.context(id).await.unwrap(),
            run,
            &format!("round {round} by b"),
        );
        let (first, second) = tokio::join!(a.replace(plan_a), b.replace(plan_b));
        let outcomes = [first.unwrap(), second.unwrap()];
        assert_eq!(
            outcomes
                .iter()
                .filter(|outcome| matches!(outcome, ReplaceOutcome::Replaced(_)))
                .count(),
            1,
            "round {round}: one wins, the other is stale: {outcomes:?}"
        );
    }
    // No item lost or doubled: every message is in the context once, raw or under a summary.
    let context = a.context(id).await.unwrap();
    assert_eq!(context.len(), 5 + 20);
    let mut covered = BTreeSet::new();
    for item in &context {
        match &item.content {
            ItemContent::Message(message) => assert!(covered.insert(message.seq)),
            ItemContent::Summary(summary) => {
                for child in a.children(summary.row_id).await.unwrap() {
                    let ItemContent::Message(message) = child else {
                        panic!("leaves only")
                    };
                    assert!(covered.insert(message.seq));
                }
            }
        }
    }
    assert_eq!(covered, (0..40).collect());
    assert_eq!(
        b.context(id).await.unwrap(),
        context,
        "both nodes read the same"
    );
    let report = b.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

async fn two_nodes_ingesting_one_session_store_each_message_once(backend: &Backend) {
    let (a, b) = (backend.open().await, backend.open().await);
    let id = a.conversation(&key("main", "s1")).await.unwrap().id;
    let messages: Vec<NewMessage> = (0..60)
        .map(|n| new_message(&format!("message {n}"), n, Some(&format!("e{n}"))))
        .collect();
    // Each node delivers every message, in overlapping batches, at the same time.
    let deliver = |store: Arc<dyn HistoryStore>, batch: usize| {
        let messages = messages.clone();
        async move {
            for chunk in messages.chunks(batch) {
                store.ingest(id, chunk.to_vec(), None).await.unwrap();
            }
        }
    };
    tokio::join!(deliver(a.clone(), 7), deliver(b.clone(), 11));
    let conversation = b.conversation_by_id(id).await.unwrap().unwrap();
    assert_eq!(conversation.stored_messages, 60);
    let stored = a.messages_in_seq_range(id, 0, 1000).await.unwrap();
    assert_eq!(stored.len(), 60);
    let texts: BTreeSet<String> = stored.iter().map(|m| m.text()).collect();
    assert_eq!(texts.len(), 60, "no message twice");
    assert_eq!(a.context(id).await.unwrap().len(), 60);
}

async fn forks_grants_state_and_blobs(backend: &Backend) {
    let store = backend.open().await;
    let parent = store.conversation(&key("main", "parent")).await.unwrap().id;
    let child = store.conversation(&key("main", "child")).await.unwrap().id;
    let ids = stored(
        store
            .ingest(
                parent,
                vec![new_message("a", 1, None), new_message("b", 2, None)],
                None,
            )
            .await
            .unwrap(),
    );
    store
        .append_items(
            child,
            ids.iter().map(|i| ItemRef::Message(i.message_id)).collect(),
        )
        .await
        .unwrap();
    let forked = store.context(child).await.unwrap();
    assert_eq!(forked.len(), 2);
    assert_eq!(
        store
            .conversation_by_id(child)
            .await
            .unwrap()
            .unwrap()
            .context_tokens,
        forked.iter().map(|item| item.tokens).sum::<u64>()
    );
    assert_eq!(store.remove_context(child).await.unwrap(), 2);
    assert!(store.context(child).await.unwrap().is_empty());

    let grant = store
        .create_grant(NewGrant {
            grantee: "agent:main:child".to_owned(),
            conversation: parent,
            expires_at_ms: 10_000,
            token_cap: 500,
        })
        .await
        .unwrap();
    assert_eq!(
        store.grants("agent:main:child").await.unwrap(),
        vec![grant.clone()]
    );
    assert_eq!(store.revoke_grants("agent:main:child").await.unwrap(), 1);
    assert!(store.grants("agent:main:child").await.unwrap()[0].revoked);
    store.delete_grant(grant.id).await.unwrap();
    assert!(store.grants("agent:main:child").await.unwrap().is_empty());

    assert_eq!(store.state(parent, "k").await.unwrap(), None);
    store.set_state(parent, "k", "v1").await.unwrap();
    store.set_state(parent, "k", "v2").await.unwrap();
    assert_eq!(
        store.state(parent, "k").await.unwrap().as_deref(),
        Some("v2")
    );
    assert_eq!(store.state(child, "k").await.unwrap(), None);
    store.set_store_state("s", "1").await.unwrap();
    assert_eq!(store.store_state("s").await.unwrap().as_deref(), Some("1"));

    let new_blob = |conversation| NewBlob {
        conversation,
        kind: "log".to_owned(),
        content: "line\nthe kestrel key is KD-4411\n".to_owned(),
        description: "a log".to_owned(),
    };
    let blob = store.put_blob(new_blob(parent)).await.unwrap();
    assert_eq!(
        store.put_blob(new_blob(child)).await.unwrap(),
        blob,
        "stored once"
    );
    assert_eq!((blob.bytes, blob.lines), (32, 2));
    assert_eq!(
        store.blob_content(&blob.blob_id).await.unwrap().as_deref(),
        Some("line\nthe kestrel key is KD-4411\n")
    );
    assert_eq!(
        store.blob_readers(&blob.blob_id).await.unwrap(),
        vec![parent]
    );
    let reference = NewMessage {
        message: serde_json::from_value::<AgentMessage>(json!({
            "role": "toolResult", "toolCallId": "c1", "toolName": "exec",
            "content": [{"type": "text", "text": "[stored]", BLOB_ID_KEY: blob.blob_id}]
        }))
        .unwrap(),
        identity: MessageIdentity::default(),
        tokens: 5,
    };
    store.ingest(child, vec![reference], None).await.unwrap();
    assert_eq!(
        store.blob_readers(&blob.blob_id).await.unwrap(),
        vec![parent, child]
    );
    let mut query = query("main", vec![child], "kestrel key");
    query.mode = SearchMode::Phrase;
    let hits = store.search(query).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].file.as_deref(), Some(blob.blob_id.as_str()));
    assert!(
        hits[0].snippet.contains("«kestrel» «key»"),
        "{}",
        hits[0].snippet
    );
    assert!(store.conversation_bytes(parent).await.unwrap() >= 32);
}

/// A session the host began anew under the same id: the conversation that held it keeps its
/// rows under another id and its key, and the id's next lookup makes a new, empty one.
async fn a_retired_session_keeps_its_rows_and_its_id_begins_anew(backend: &Backend) {
    let store = backend.open().await;
    let mut session = key("main", "anew");
    session.session_key = Some("agent:main:anew".to_owned());
    let before = store.conversation(&session).await.unwrap().id;
    let messages: Vec<NewMessage> = (0..3)
        .map(|n| new_message(&format!("before the reset {n}"), 100 + n, None))
        .collect();
    store.ingest(before, messages, None).await.unwrap();
    store.retire_session(before, "anew@new-1").await.unwrap();
    let now = store.conversation(&session).await.unwrap();
    assert_ne!(now.id, before);
    assert_eq!(now.message_count, 0);
    let kept = store.conversation_by_id(before).await.unwrap().unwrap();
    assert_eq!(
        (
            kept.session_id.as_str(),
            kept.session_key.as_deref(),
            kept.message_count
        ),
        ("anew@new-1", Some("agent:main:anew"), 3)
    );
    let under_key: Vec<ConversationId> = store
        .conversations_by_session_key("main", "agent:main:anew")
        .await
        .unwrap()
        .iter()
        .map(|conversation| conversation.id)
        .collect();
    assert_eq!(under_key.len(), 2);
    assert!(under_key.contains(&before) && under_key.contains(&now.id));
}

/// The fork invariant: a forked child holds its parent's rows by reference, and each session
/// folds them on its own. A row lies under at most one summary of each conversation, and under
/// summaries of several conversations when they share it; the walk up from a row follows its
/// own conversation's summaries; forgetting the child leaves the parent's DAG whole.
async fn a_fork_and_its_parent_fold_the_same_rows(backend: &Backend) {
    let store = backend.open().await;
    let parent = store.conversation(&key("main", "parent")).await.unwrap().id;
    let child = store
        .conversation(&key("main", "parent-child"))
        .await
        .unwrap()
        .id;
    let messages: Vec<NewMessage> = (0..6)
        .map(|n| new_message(&format!("parent message {n}"), 100 + n, None))
        .collect();
    let ids = stored(store.ingest(parent, messages, None).await.unwrap());
    let parents_context = store.context(parent).await.unwrap();
    store
        .replace(plan(
            parent,
            &parents_context,
            0..2,
            "the parent's first leaf",
        ))
        .await
        .unwrap();
    // The fork: the parent's context (a summary and four messages) seeds the child's.
    let seed: Vec<ItemRef> = store
        .context_refs(parent)
        .await
        .unwrap()
        .iter()
        .map(|item| item.item)
        .collect();
    store.append_items(child, seed).await.unwrap();
    // The child folds first, over the parent's summary and two of its messages.
    let childs_context = store.context(child).await.unwrap();
    let ReplaceOutcome::Replaced(childs) = store
        .replace(plan(child, &childs_context, 1..3, "the child's leaf"))
        .await
        .unwrap()
    else {
        panic!("the child folds rows its parent owns");
    };
    // Then the parent folds the same two messages: the child's fold does not stand in its way.
    let parents_context = store.context(parent).await.unwrap();
    let ReplaceOutcome::Replaced(parents) = store
        .replace(plan(
            parent,
            &parents_context,
            1..3,
            "the parent's second leaf",
        ))
        .await
        .unwrap()
    else {
        panic!("the parent folds what its fork folded before it");
    };
    assert_ne!(parents.row_id, childs.row_id);
    let shared = ItemRef::Message(ids[2].message_id);
    assert_eq!(
        store.top_ancestor(shared).await.unwrap().unwrap().row_id,
        parents.row_id,
        "the walk up from a row follows its own conversation's summaries"
    );
    assert_eq!(
        store.parent_of(shared).await.unwrap().unwrap().row_id,
        parents.row_id
    );
    for summary in [&childs, &parents] {
        let children = store.children(summary.row_id).await.unwrap();
        assert!(
            matches!(&children[1], ItemContent::Message(m) if m.id == ids[3].message_id),
            "both summaries reach the shared messages"
        );
    }
    let report = store.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // A child deleted: its rows and its folds go, the parent's rows and DAG stay whole.
    store.forget(ForgetPlan::whole(child)).await.unwrap();
    assert!(store.context(child).await.unwrap().is_empty());
    assert_eq!(store.summary(childs.row_id).await.unwrap(), None);
    let children = store.children(parents.row_id).await.unwrap();
    assert_eq!(children.len(), 2);
    let context = store.context(parent).await.unwrap();
    assert_eq!(context.len(), 4, "two leaves and the two newest messages");
    let report = store.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.messages, 6);
}

/// What a hit names, whichever backend found it.
/// A model behind an OpenAI-compatible endpoint (a real HTTP server on 127.0.0.1): rows are
/// found by their words at once and by meaning once the background has embedded them; while
/// the endpoint fails, text and hybrid search work, semantic search names the endpoint, and
/// what waits is embedded after a restart once it is back.
async fn a_model_behind_an_endpoint_embeds_in_the_background(backend: &Backend) {
    use std::time::Duration;
    use vilvona_embed::endpoint::TestEndpoint;

    let endpoint = TestEndpoint::start().unwrap();
    let remote = || -> Option<Arc<dyn Embedder>> {
        Some(Arc::new(
            vilvona_embed::RemoteEmbedder::new(vilvona_embed::RemoteSettings {
                base_url: endpoint.base_url(),
                model: "test-model".to_owned(),
                api_key: None,
                dimensions: None,
                batch_size: 8,
                timeout: Duration::from_secs(10),
                retries: 0,
                backoff: Duration::from_millis(1),
                auth_cooldown: Duration::from_secs(60),
            })
            .unwrap(),
        ))
    };
    let store = backend.open_with(remote()).await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    let mut texts = vec!["Painting helps me relax after work.".to_owned()];
    texts.extend((1..12).map(|n| format!("Status line {n}: the build is green.")));
    let messages: Vec<NewMessage> = texts
        .iter()
        .enumerate()
        .map(|(n, text)| new_message(text, 1_000 * (n as i64 + 1), None))
        .collect();
    store.ingest(id, messages, None).await.unwrap();
    let search = |text: &str, mode: SearchMode| {
        let mut query = query("main", vec![id], text);
        query.mode = mode;
        query
    };
    let found = store
        .search(search("painting", SearchMode::Text))
        .await
        .unwrap();
    assert_eq!(named(&found), ["m0"]);
    // The background embeds within seconds; a minute is the bound of a stuck filler.
    let first_by_meaning = |store: Arc<dyn HistoryStore>, text: &'static str, row: &'static str| async move {
        let mut first = Vec::new();
        for _ in 0..1_200 {
            let hits = store
                .search(search(text, SearchMode::Semantic))
                .await
                .unwrap();
            first = named(&hits[..hits.len().min(1)]);
            if first == [row] {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{row} was not found first by meaning for {text:?} within a minute: {first:?}");
    };
    first_by_meaning(store.clone(), "after work, what helps me relax?", "m0").await;
    assert!(endpoint.inputs() >= texts.len(), "{}", endpoint.inputs());
    assert!(endpoint.largest_batch() <= 8);

    // The endpoint fails: words still find the new row; by meaning, the endpoint is named.
    endpoint.fail_with(Some(503));
    store
        .ingest(
            id,
            vec![new_message(
                "The harbour ferry leaves at noon.",
                20_000,
                None,
            )],
            None,
        )
        .await
        .unwrap();
    let found = store
        .search(search("harbour ferry", SearchMode::Text))
        .await
        .unwrap();
    assert_eq!(named(&found), ["m12"]);
    let hybrid = store
        .search(search("harbour ferry", SearchMode::Hybrid))
        .await
        .unwrap();
    assert_eq!(named(&hybrid)[0], "m12");
    let error = store
        .search(search("when does the ferry leave", SearchMode::Semantic))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Embedding(_))
            && error.to_string().contains(&endpoint.base_url()),
        "{error}"
    );
    assert_eq!(store.documents_waiting_for_vectors().await.unwrap(), 1);
    // Closed while it waits; embedded after the endpoint is back.
    drop(store);
    endpoint.fail_with(None);
    let store = backend.open_with(remote()).await;
    first_by_meaning(store.clone(), "ferry leaves harbour at noon", "m12").await;
    assert_eq!(store.documents_waiting_for_vectors().await.unwrap(), 0);
}

fn named(hits: &[SearchHit]) -> Vec<String> {
    hits.iter()
        .map(|hit| match &hit.source {
            HitSource::Message { seq, .. } => format!("m{seq}"),
            HitSource::Summary { depth, .. } => format!("s{depth}"),
        })
        .collect()
}

async fn search_answers_alike(backend: &Backend) {
    let store = backend.open().await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    let other = store.conversation(&key("main", "s2")).await.unwrap().id;
    let texts = [
        "The staging database password rotation ticket is OPS-4821.",
        "Rotation of the password happens weekly; the database is staging.",
        "部署密钥存放在保险库里，负责人是李明。",
        "Café menu: crème brûlée, ÉCLAIR.",
        "Unrelated chatter about lunch.",
    ];
    let messages: Vec<NewMessage> = texts
        .iter()
        .enumerate()
        .map(|(n, text)| new_message(text, 1_000 * (n as i64 + 1), None))
        .collect();
    store.ingest(id, messages, None).await.unwrap();
    store
        .ingest(
            other,
            vec![new_message("password rotation elsewhere", 1, None)],
            None,
        )
        .await
        .unwrap();
    let search = |text: &str, mode: SearchMode| {
        let mut query = query("main", vec![id], text);
        query.mode = mode;
        query
    };
    let phrase = store
        .search(search("password rotation", SearchMode::Phrase))
        .await
        .unwrap();
    assert_eq!(named(&phrase), vec!["m0"]);
    assert!(
        phrase[0].snippet.contains("«password» «rotation»"),
        "{}",
        phrase[0].snippet
    );
    // Text: both messages hold both words, the newer first among equals; none from `other`.
    let text = store
        .search(search("rotation password", SearchMode::Text))
        .await
        .unwrap();
    assert_eq!(
        BTreeSet::from_iter(named(&text)),
        BTreeSet::from(["m0".to_owned(), "m1".to_owned()])
    );
    // CJK: bigrams in order; a run that is not in the text does not match.
    let cjk = store
        .search(search("保险库", SearchMode::Phrase))
        .await
        .unwrap();
    assert_eq!(named(&cjk), vec!["m2"]);
    assert!(cjk[0].snippet.contains("«保险库»"), "{}", cjk[0].snippet);
    assert!(
        store
            .search(search("库保险", SearchMode::Phrase))
            .await
            .unwrap()
            .is_empty()
    );
    // Case folding beyond ASCII.
    let folded = store
        .search(search("éclair", SearchMode::Text))
        .await
        .unwrap();
    assert_eq!(named(&folded), vec!["m3"]);
    // Regex over the text, newest first.
    let regex = store
        .search(search(r"OPS-\d{4}|weekly", SearchMode::Regex))
        .await
        .unwrap();
    assert_eq!(named(&regex), vec!["m1", "m0"]);
    assert!(matches!(
        store.search(search("(unclosed", SearchMode::Regex)).await,
        Err(StoreError::InvalidRegex { .. })
    ));
    // Time range and scope.
    let mut ranged = search("password", SearchMode::Text);
    ranged.since_ms = Some(1_500);
    assert_eq!(named(&store.search(ranged).await.unwrap()), vec!["m1"]);
    let mut both = search("password rotation", SearchMode::Phrase);
    both.conversations = vec![id, other];
    assert_eq!(store.search(both).await.unwrap().len(), 2);
    let mut foreign = search("password rotation", SearchMode::Phrase);
    foreign.agent_id = "someone-else".to_owned();
    assert!(store.search(foreign).await.unwrap().is_empty());
    // Summaries are found, and a message under one names it.
    let context = store.context(id).await.unwrap();
    let ReplaceOutcome::Replaced(leaf) = store
        .replace(plan(
            id,
            &context,
            0..2,
            "Summary: the password rotation ticket OPS-4821.",
        ))
        .await
        .unwrap()
    else {
        panic!("published")
    };
    let found = store
        .search(search("password rotation", SearchMode::Phrase))
        .await
        .unwrap();
    assert_eq!(
        BTreeSet::from_iter(named(&found)),
        BTreeSet::from(["m0".to_owned(), "s0".to_owned()])
    );
    let message = found
        .iter()
        .find(|hit| matches!(hit.source, HitSource::Message { .. }))
        .unwrap();
    assert_eq!(
        message.covered_by.as_deref(),
        Some(leaf.summary_id.as_str())
    );
    let mut summaries_only = search("password rotation", SearchMode::Phrase);
    summaries_only.target = SearchTarget::Summaries;
    assert_eq!(
        named(&store.search(summaries_only).await.unwrap()),
        vec!["s0"]
    );
}

async fn a_read_only_store_refuses_writes(backend: &Backend) {
    let store = backend.open().await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    store
        .ingest(id, vec![new_message("kept", 1, None)], None)
        .await
        .unwrap();
    let reader = backend.open_read_only().await;
    assert!(reader.is_read_only());
    assert_eq!(reader.context(id).await.unwrap().len(), 1);
    assert!(matches!(
        reader
            .ingest(id, vec![new_message("no", 2, None)], None)
            .await,
        Err(StoreError::ReadOnly(_))
    ));
    assert!(matches!(
        reader.conversation(&key("main", "unknown")).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(store.context(id).await.unwrap().len(), 1);
}

async fn export_and_import_round_trip(backend: &Backend) {
    let store = backend.open().await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    store
        .ingest(
            id,
            (0..6)
                .map(|n| new_message(&format!("message {n} 中文"), n, Some(&format!("e{n}"))))
                .collect(),
            Some("turn-1".to_owned()),
        )
        .await
        .unwrap();
    let context = store.context(id).await.unwrap();
    store
        .replace(plan(id, &context, 0..3, "the first three"))
        .await
        .unwrap();
    store.set_state(id, "bootstrap", "{}").await.unwrap();
    let archive = store.export(id).await.unwrap();
    assert_eq!((archive.messages.len(), archive.summaries.len()), (6, 1));

    // Onto the other backend's store and back: the history is the same everywhere.
    // (The other backend lives as long as its store: its nodes' index directories with it.)
    // (SQLite to PostgreSQL is the command line's archive test.)
    let other = Backend::sqlite();
    let there = other.open().await;
    let (moved, report) = there.import(archive.clone()).await.unwrap();
    assert!(report.verified);
    assert_eq!(
        without_origins(there.export(moved).await.unwrap()),
        without_origins(archive.clone())
    );
    assert!(matches!(
        there.import(archive.clone()).await,
        Err(StoreError::ImportRefused(_))
    ));
    let mut phrase = query("main", vec![moved], "message 4 中文");
    phrase.mode = SearchMode::Phrase;
    assert_eq!(named(&there.search(phrase).await.unwrap()), vec!["m4"]);
    assert_eq!(
        there
            .ingest(
                moved,
                vec![new_message("x", 1, None)],
                Some("turn-1".to_owned())
            )
            .await
            .unwrap(),
        IngestOutcome::DuplicateTurn
    );
}

async fn forgetting_removes_rows_and_what_derives_from_them(backend: &Backend) {
    let store = backend.open().await;
    let id = store.conversation(&key("main", "s1")).await.unwrap().id;
    let fork = store.conversation(&key("main", "fork")).await.unwrap().id;
    let ids = stored(
        store
            .ingest(
                id,
                (0..6)
                    .map(|n| new_message(&format!("message {n}"), 100 + n, None))
                    .collect(),
                None,
            )
            .await
            .unwrap(),
    );
    let context = store.context(id).await.unwrap();
    let ReplaceOutcome::Replaced(old) = store
        .replace(plan(id, &context, 0..2, "the first two"))
        .await
        .unwrap()
    else {
        panic!("published")
    };
    let context = store.context(id).await.unwrap();
    let ReplaceOutcome::Replaced(straddling) = store
        .replace(plan(id, &context, 1..4, "messages two to four"))
        .await
        .unwrap()
    else {
        panic!("published")
    };
    // Another conversation holds a message that will be forgotten, by reference.
    store
        .append_items(fork, vec![ItemRef::Message(ids[0].message_id)])
        .await
        .unwrap();

    // A plan made for other summaries than those above the messages now is stale.
    let stale = ForgetPlan {
        conversation: id,
        scope: ForgetScope::Before(103),
        removed: vec![old.row_id],
        rewritten: Vec::new(),
    };
    assert_eq!(store.forget(stale).await.unwrap(), None);
    let plan = ForgetPlan {
        conversation: id,
        scope: ForgetScope::Before(103),
        removed: vec![old.row_id],
        rewritten: vec![SummaryRewrite {
            row_id: straddling.row_id,
            content: "message three and four".to_owned(),
            tokens: 5,
            summarizer: "test/v1".to_owned(),
        }],
    };
    let report = store.forget(plan).await.unwrap().unwrap();
    assert_eq!(
        (
            report.messages,
            report.summaries_removed,
            report.summaries_rewritten
        ),
        (3, 1, 1)
    );
    assert_eq!(report.conversations_touched, 2, "this one and the fork");
    let rewritten = store.summary(straddling.row_id).await.unwrap().unwrap();
    assert_eq!(rewritten.content, "message three and four");
    assert_eq!((rewritten.first_seq, rewritten.last_seq), (3, 4));
    assert_eq!(store.children(straddling.row_id).await.unwrap().len(), 2);
    assert!(store.context(fork).await.unwrap().is_empty());
    let conversation = store.conversation_by_id(id).await.unwrap().unwrap();
    assert_eq!(conversation.stored_messages, 3);
    let context = store.context(id).await.unwrap();
    assert_eq!(context.len(), 2);
    assert_eq!(
        conversation.context_tokens,
        context.iter().map(|item| item.tokens).sum::<u64>()
    );
    let report = store.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    // The whole conversation, with the file only it stored.
    let blob = store
        .put_blob(NewBlob {
            conversation: id,
            kind: "log".to_owned(),
            content: "only here".to_owned(),
            description: "a log".to_owned(),
        })
        .await
        .unwrap();
    let report = store.forget(ForgetPlan::whole(id)).await.unwrap().unwrap();
    assert_eq!((report.messages, report.blobs), (3, 1));
    assert_eq!(store.conversation_by_id(id).await.unwrap(), None);
    assert_eq!(store.blob_info(&blob.blob_id).await.unwrap(), None);
    let new = store.conversation(&key("main", "s1")).await.unwrap();
    assert_ne!(new.id, id);
    let again = stored(
        store
            .ingest(new.id, vec![new_message("fresh", 1, None)], None)
            .await
            .unwrap(),
    );
    assert!(
        again[0].message_id.0 > ids[5].message_id.0,
        "ids are never reused"
    );
    store.reclaim_space().await.unwrap();
}

async fn every_node_finds_what_another_wrote_and_loses_what_it_forgot(backend: &Backend) {
    let (a, b) = (backend.open().await, backend.open().await);
    let id = a.conversation(&key("main", "s1")).await.unwrap().id;
    let phrase = |text: &str| {
        let mut query = query("main", vec![id], text);
        query.mode = SearchMode::Phrase;
        query
    };
    for round in 0..3 {
        a.ingest(
            id,
            (0..20)
                .map(|n| {
                    new_message(
                        &format!("round {round} note {n}: the heron gate code is HG-{round}{n}"),
                        n,
                        None,
                    )
                })
                .collect(),
            None,
        )
        .await
        .unwrap();
        // At once, whether or not b's index has caught up.
        let found = b
            .search(phrase(&format!("heron gate code is HG-{round}7")))
            .await
            .unwrap();
        assert_eq!(named(&found), vec![format!("m{}", round * 20 + 7)]);
    }
    let context = a.context(id).await.unwrap();
    let ReplaceOutcome::Replaced(leaf) = a
        .replace(plan(
            id,
            &context,
            0..5,
            "Summary: the osprey ledger moved.",
        ))
        .await
        .unwrap()
    else {
        panic!("published")
    };
    let found = b.search(phrase("osprey ledger")).await.unwrap();
    assert!(
        matches!(&found[..], [hit] if hit.source == HitSource::Summary {
            row_id: leaf.row_id,
            summary_id: leaf.summary_id.clone(),
            depth: 0,
            kind: SummaryKind::Leaf,
        })
    );
    // A rewritten summary is found by its new text only, from either node.
    assert!(
        a.update_summary(SummaryUpdate {
            row_id: leaf.row_id,
            expected_level: SummaryLevel::Normal,
            expected_summarizer: leaf.summarizer.clone(),
            content: "Summary: the kestrel ledger moved.".to_owned(),
            tokens: 8,
            level: SummaryLevel::Normal,
            summarizer: "test/v2".to_owned(),
        })
        .await
        .unwrap()
    );
    for store in [&a, &b] {
        assert!(
            store
                .search(phrase("osprey ledger"))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            store.search(phrase("kestrel ledger")).await.unwrap().len(),
            1
        );
    }
    // Forgotten on one node: gone from every node's searches.
    a.forget(ForgetPlan::whole(id)).await.unwrap().unwrap();
    for store in [&a, &b] {
        assert!(
            store
                .search(phrase("heron gate code"))
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store
                .search(phrase("kestrel ledger"))
                .await
                .unwrap()
                .is_empty()
        );
    }
    let other = a.conversation(&key("main", "s2")).await.unwrap().id;
    a.ingest(other, vec![new_message("kept", 1, None)], None)
        .await
        .unwrap();
    assert_eq!(a.rebuild_index().await.unwrap(), 1);
    assert_eq!(a.index_doc_count().await.unwrap(), 1);
}
