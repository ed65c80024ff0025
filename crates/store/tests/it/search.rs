//! Recall: terms, phrases, regex, time ranges, order, snippets, and scope isolation.

use std::sync::Arc;

use tempfile::TempDir;
use vilvona_store::*;

use crate::conformance::{Backend, on_both_backends};
use crate::support::*;

on_both_backends!(
    terms_rank_by_bm25_and_snippets_highlight,
    phrases_need_adjacent_terms,
    regex_is_linear_and_bounded_by_the_limit,
    time_ranges_and_recency_order,
    scope_is_always_agent_and_conversations,
    summaries_are_searchable_with_their_ids,
    cjk_words_are_found_inside_runs,
    oversize_queries_are_refused_with_one_line,
    meaning_is_found_in_other_words,
    another_model_embeds_in_the_background,
    a_slow_model_holds_neither_writes_nor_searches,
);

struct Fixture {
    store: std::sync::Arc<dyn HistoryStore>,
    main: ConversationId,
    earlier: ConversationId,
    other_agent: ConversationId,
}

async fn fixture(backend: &Backend) -> Fixture {
    let store = backend.open().await;
    let main = store.conversation(&key("main", "s2")).await.unwrap().id;
    let earlier = store.conversation(&key("main", "s1")).await.unwrap().id;
    let other_agent = store.conversation(&key("ops", "s1")).await.unwrap().id;
    let lines = [
        (
            main,
            "Please remember: the ticket for the staging database password rotation is OPS-18330.",
            1_000,
        ),
        (
            main,
            "The parser cache is cold after a restart; warm it in the writer thread.",
            2_000,
        ),
        (
            main,
            "Ran cargo test: 3 failures in crates/store/src/writer.rs line 88.",
            3_000,
        ),
        (
            main,
            "Database rotation went fine; the password was not touched.",
            4_000,
        ),
        (
            earlier,
            "An earlier session decided to keep the WAL checkpoint at 1000 pages.",
            500,
        ),
        (
            other_agent,
            "The ops agent keeps its own staging database password rotation notes: OPS-99999.",
            1_500,
        ),
    ];
    for (index, (conversation, text, time)) in lines.into_iter().enumerate() {
        store
            .ingest(
                conversation,
                vec![new_message(text, time, Some(&format!("e{index}")))],
                None,
            )
            .await
            .unwrap();
    }
    Fixture {
        store,
        main,
        earlier,
        other_agent,
    }
}

fn texts(hits: &[SearchHit]) -> Vec<String> {
    hits.iter().map(|hit| hit.snippet.clone()).collect()
}

async fn terms_rank_by_bm25_and_snippets_highlight(backend: &Backend) {
    let f = fixture(backend).await;
    let hits = f
        .store
        .search(query(
            "main",
            vec![f.main],
            "staging database password rotation",
        ))
        .await
        .unwrap();
    assert_eq!(hits.len(), 2);
    assert!(hits[0].score >= hits[1].score);
    assert_eq!(
        hits[0].snippet,
        "Please remember: the ticket for the «staging» «database» «password» «rotation» is OPS-18330."
    );
    assert!(matches!(hits[0].source, HitSource::Message { seq: 0, .. }));
}

async fn phrases_need_adjacent_terms(backend: &Backend) {
    let f = fixture(backend).await;
    let mut phrase = query("main", vec![f.main], "password rotation");
    phrase.mode = SearchMode::Phrase;
    let hits = f.store.search(phrase).await.unwrap();
    assert_eq!(hits.len(), 1, "{:?}", texts(&hits));
    let mut identifier = query("main", vec![f.main], "OPS-18330");
    identifier.mode = SearchMode::Phrase;
    assert_eq!(f.store.search(identifier).await.unwrap().len(), 1);
}

async fn regex_is_linear_and_bounded_by_the_limit(backend: &Backend) {
    let f = fixture(backend).await;
    let mut regex = query("main", vec![f.main], r"crates/\w+/src/\w+\.rs line \d+");
    regex.mode = SearchMode::Regex;
    let hits = f.store.search(regex.clone()).await.unwrap();
    assert_eq!(
        texts(&hits),
        ["Ran cargo test: 3 failures in «crates/store/src/writer.rs line 88»."]
    );
    regex.text = "(a|b)*c[".to_owned();
    let error = f.store.search(regex.clone()).await.unwrap_err();
    assert!(
        error.to_string().starts_with("invalid regex \"(a|b)*c[\""),
        "{error}"
    );
    regex.text = "e".to_owned();
    regex.limit = 2;
    assert_eq!(f.store.search(regex).await.unwrap().len(), 2);
}

async fn time_ranges_and_recency_order(backend: &Backend) {
    let f = fixture(backend).await;
    let mut ranged = query("main", vec![f.main], "database password");
    ranged.since_ms = Some(2_000);
    let hits = f.store.search(ranged.clone()).await.unwrap();
    assert_eq!(hits.iter().map(|h| h.time_ms).collect::<Vec<_>>(), [4_000]);
    ranged.since_ms = None;
    ranged.before_ms = Some(4_000);
    let hits = f.store.search(ranged.clone()).await.unwrap();
    assert_eq!(hits.iter().map(|h| h.time_ms).collect::<Vec<_>>(), [1_000]);
    ranged.before_ms = None;
    ranged.order = SearchOrder::Recency;
    let hits = f.store.search(ranged).await.unwrap();
    assert_eq!(
        hits.iter().map(|h| h.time_ms).collect::<Vec<_>>(),
        [4_000, 1_000]
    );
}

async fn scope_is_always_agent_and_conversations(backend: &Backend) {
    let f = fixture(backend).await;
    // The main agent's scope never returns the ops agent's row, even naming its conversation.
    let mut identifier = query("main", vec![f.main, f.earlier, f.other_agent], "OPS-99999");
    identifier.mode = SearchMode::Phrase;
    let hits = f.store.search(identifier.clone()).await.unwrap();
    assert!(hits.is_empty(), "{:?}", texts(&hits));
    identifier.agent_id = "ops".to_owned();
    identifier.conversations = vec![f.other_agent];
    assert_eq!(f.store.search(identifier).await.unwrap().len(), 1);
    // Earlier sessions of the same agent only when the caller puts them in scope.
    assert!(
        f.store
            .search(query("main", vec![f.main], "checkpoint"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        f.store
            .search(query("main", vec![f.main, f.earlier], "checkpoint"))
            .await
            .unwrap()
            .len(),
        1
    );
    let mut regex = query("main", vec![f.main], "OPS-9+");
    regex.mode = SearchMode::Regex;
    assert!(f.store.search(regex).await.unwrap().is_empty());
}

async fn summaries_are_searchable_with_their_ids(backend: &Backend) {
    let f = fixture(backend).await;
    let context = f.store.context(f.main).await.unwrap();
    let ReplaceOutcome::Replaced(summary) = f
        .store
        .replace(plan(
            f.main,
            &context,
            0..2,
            "Decided: warm the parser cache; ticket OPS-18330 tracked.",
        ))
        .await
        .unwrap()
    else {
        panic!("replace must land");
    };
    let mut summaries_only = query("main", vec![f.main], "parser cache");
    summaries_only.target = SearchTarget::Summaries;
    let hits = f.store.search(summaries_only).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert!(
        matches!(&hits[0].source, HitSource::Summary { summary_id, .. } if *summary_id == summary.summary_id)
    );
    let mut messages_only = query("main", vec![f.main], "parser cache");
    messages_only.target = SearchTarget::Messages;
    let hits = f.store.search(messages_only).await.unwrap();
    assert!(
        hits.iter()
            .all(|hit| matches!(hit.source, HitSource::Message { .. }))
    );
    assert_eq!(hits.len(), 1);
}

/// Facts in Chinese, Japanese and Korean, each found by a word inside its run (text and
/// phrase), with the word highlighted in the snippet.
async fn cjk_words_are_found_inside_runs(backend: &Backend) {
    let store = backend.open().await;
    let main = store.conversation(&key("main", "cjk")).await.unwrap().id;
    let facts = [
        "我们把告警阈值改成了百分之八十五，明天上线。",
        "本番環境のしきい値を変更しました。チケットはOPS-4411です。",
        "운영 환경의 경고 임계값을 85퍼센트로 바꿨습니다.",
        "An English line about thresholds, for contrast.",
    ];
    for (index, text) in facts.iter().enumerate() {
        store
            .ingest(
                main,
                vec![new_message(
                    text,
                    1_000 + index as i64,
                    Some(&format!("c{index}")),
                )],
                None,
            )
            .await
            .unwrap();
    }
    // Once through the index (after a rebuild commits everything), once from rows beyond it.
    for indexed in [false, true] {
        if indexed {
            store.rebuild_index().await.unwrap();
        }
        for (word, expected) in [
            ("告警阈值", "我们把«告警阈值»改成了百分之八十五，明天上线。"),
            (
                "しきい値",
                "本番環境の«しきい値»を変更しました。チケットはOPS-4411です。",
            ),
            (
                "임계값",
                "운영 환경의 경고 «임계값»을 85퍼센트로 바꿨습니다.",
            ),
        ] {
            for mode in [SearchMode::Text, SearchMode::Phrase] {
                let mut search = query("main", vec![main], word);
                search.mode = mode;
                let hits = store.search(search).await.unwrap();
                assert_eq!(
                    texts(&hits),
                    [expected],
                    "{word} ({mode:?}, indexed: {indexed})"
                );
            }
        }
        // A run's characters in another order is not the word.
        let hits = store
            .search(query("main", vec![main], "阈值告警"))
            .await
            .unwrap();
        assert!(hits.is_empty(), "{:?}", texts(&hits));
    }
}

async fn oversize_queries_are_refused_with_one_line(backend: &Backend) {
    let f = fixture(backend).await;
    let long = "word ".repeat(1_000);
    let error = f
        .store
        .search(query("main", vec![f.main], &long))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("the query is 5000 bytes; at most {MAX_QUERY_BYTES} are allowed")
    );
    let many = (0..100)
        .map(|n| format!("w{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    let error = f
        .store
        .search(query("main", vec![f.main], &many))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("the query has 100 words; at most {MAX_QUERY_WORDS} are allowed")
    );
}

/// A message whose text moved to a blob: the blob's words are found (the hit names the file),
/// the blob is readable by each conversation that references it, and a store written before
/// references were kept learns them when it migrates.
#[tokio::test]
async fn blob_words_are_found_and_references_scope_the_blob() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir).await;
    let first = store.conversation(&key("main", "a")).await.unwrap().id;
    let second = store.conversation(&key("main", "b")).await.unwrap().id;
    let stranger = store.conversation(&key("main", "c")).await.unwrap().id;
    let content = format!(
        "{}the last line names quokkaverdict",
        "filler line\n".repeat(5_000)
    );
    let mut blob_id = String::new();
    for (index, conversation) in [first, second].into_iter().enumerate() {
        let info = store
            .put_blob(NewBlob {
                conversation,
                kind: "log".to_owned(),
                content: content.clone(),
                description: "a log".to_owned(),
            })
            .await
            .unwrap();
        blob_id = info.blob_id.clone();
        let message: vilvona_core::message::AgentMessage = serde_json::from_value(serde_json::json!({
            "role": "toolResult", "toolCallId": "c", "toolName": "exec", "timestamp": 10,
            "content": [{"type": "text", "text": format!("[stored as {blob_id}]"), BLOB_ID_KEY: blob_id}]
        }))
        .unwrap();
        let stored = NewMessage {
            message,
            identity: MessageIdentity {
                entry_id: Some(format!("m{index}")),
                ..MessageIdentity::default()
            },
            tokens: 10,
        };
        store
            .ingest(conversation, vec![stored], None)
            .await
            .unwrap();
    }
    let hits = store
        .search(query("main", vec![second], "quokkaverdict"))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].file.as_deref(), Some(blob_id.as_str()));
    assert!(
        hits[0]
            .snippet
            .ends_with("filler line the last line names «quokkaverdict»"),
        "{}",
        hits[0].snippet
    );
    let mut readers = store.blob_readers(&blob_id).await.unwrap();
    readers.sort();
    assert_eq!(readers, [first, second]);
    assert!(!readers.contains(&stranger));

    // As a database of schema 1 (no references kept), then migrated.
    drop(store);
    let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    connection
        .execute_batch(
            "DROP TABLE compression_dictionaries;
             DROP TABLE blob_references; DROP TABLE index_tasks; DROP INDEX messages_by_time;
             ALTER TABLE conversations DROP COLUMN forgotten_messages;
             DROP INDEX summaries_fallback;
             PRAGMA user_version = 1;",
        )
        .unwrap();
    drop(connection);
    let store = open(&dir).await;
    let mut readers = store.blob_readers(&blob_id).await.unwrap();
    readers.sort();
    assert_eq!(readers, [first, second]);
}

/// An index written by an earlier build (another tokenizer in its schema: the one before CJK
/// bigrams, or the one before stemming) is rebuilt from the database when the store opens,
/// and then finds CJK words.
#[tokio::test]
async fn an_index_with_the_earlier_tokenizer_is_rebuilt_on_open() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir).await;
    let main = store.conversation(&key("main", "cjk")).await.unwrap().id;
    store
        .ingest(
            main,
            vec![new_message("我们把告警阈值改成了八十五。", 1, Some("c"))],
            None,
        )
        .await
        .unwrap();
    store.rebuild_index().await.unwrap();
    store.close().await.unwrap();
    let meta = dir.path().join("index/meta.json");
    let written = std::fs::read_to_string(&meta).unwrap();
    let now = "\"tokenizer\": \"vilvona-stemmed\"";
    assert!(written.contains(now), "{written}");
    for earlier in ["default", "vilvona"] {
        std::fs::write(
            &meta,
            written.replace(now, &format!("\"tokenizer\": \"{earlier}\"")),
        )
        .unwrap();
        let store = open(&dir).await;
        let hits = store
            .search(query("main", vec![main], "告警阈值"))
            .await
            .unwrap();
        assert_eq!(
            texts(&hits),
            ["我们把«告警阈值»改成了八十五。"],
            "{earlier}"
        );
        assert!(std::fs::read_to_string(&meta).unwrap().contains(now));
        assert!(store.index_doc_count().await.unwrap() >= 1);
        store.close().await.unwrap();
    }
}

/// Rebuilding decodes rows in parallel batches (rayon): every row of several batches is
/// indexed once, a damaged row among them is skipped and named, and searches find the rest.
#[tokio::test]
async fn a_rebuild_across_parallel_batches_indexes_every_row_once() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir).await;
    let main = store.conversation(&key("main", "many")).await.unwrap().id;
    for batch in 0..5 {
        let messages = (0..1_000)
            .map(|i| {
                let n = batch * 1_000 + i;
                new_message(
                    &format!("row {n} carries marker m{n}x"),
                    n,
                    Some(&format!("r{n}")),
                )
            })
            .collect();
        store.ingest(main, messages, None).await.unwrap();
    }
    store.close().await.unwrap();
    drop(store);
    let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    connection
        .execute("UPDATE messages SET json = x'00ff00ff' WHERE id = 3000", [])
        .unwrap();
    drop(connection);
    let store = open(&dir).await;
    let documents = store.rebuild_index().await.unwrap();
    assert_eq!(documents, 4_999);
    assert_eq!(store.index_doc_count().await.unwrap(), 4_999);
    for n in [0, 2_047, 2_048, 4_095, 4_096, 4_999] {
        let hits = store
            .search(query("main", vec![main], &format!("m{n}x")))
            .await
            .unwrap();
        assert_eq!(hits.len(), 1, "m{n}x");
    }
    let report = store.integrity_check().await.unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("3000")),
        "{:?}",
        report.problems
    );
}

/// Semantic search finds a fact asked about in other words, within the same scope rules as text
/// search, including a row the index has not committed yet; hybrid search keeps what text
/// search finds; a store opened without an embedding model refuses semantic search and answers
/// hybrid search with text alone, and opening it again with the model embeds everything anew.
async fn meaning_is_found_in_other_words(backend: &Backend) {
    let f = fixture(backend).await;
    f.store
        .ingest(
            f.main,
            vec![new_message(
                "Painting watercolours in the evening helps me relax after long days.",
                5_000,
                Some("e-paint"),
            )],
            None,
        )
        .await
        .unwrap();
    f.store
        .ingest(
            f.other_agent,
            vec![new_message(
                "Gardening at dusk helps the ops lead unwind and relax.",
                5_500,
                Some("e-garden"),
            )],
            None,
        )
        .await
        .unwrap();
    let mut meaning = query(
        "main",
        vec![f.main, f.other_agent],
        "What do I do to unwind?",
    );
    meaning.mode = SearchMode::Semantic;
    meaning.limit = 3;
    // Found at once (the index may not hold the row yet), and never the other agent's.
    let hits = f.store.search(meaning.clone()).await.unwrap();
    assert!(
        hits[0].snippet.starts_with("Painting watercolours"),
        "{:?}",
        texts(&hits)
    );
    assert!(
        hits.iter().all(|hit| hit.conversation == f.main),
        "{:?}",
        texts(&hits)
    );
    assert!(hits.len() <= 3);
    f.store.index_doc_count().await.unwrap();
    let again = f.store.search(meaning.clone()).await.unwrap();
    assert_eq!(
        texts(&again),
        texts(&hits),
        "the index answers as the database did"
    );
    meaning.before_ms = Some(5_000);
    assert!(
        f.store
            .search(meaning.clone())
            .await
            .unwrap()
            .iter()
            .all(|hit| hit.time_ms < 5_000)
    );
    let mut hybrid = query("main", vec![f.main], "staging database password rotation");
    hybrid.mode = SearchMode::Hybrid;
    hybrid.limit = 2;
    let hits = f.store.search(hybrid).await.unwrap();
    assert_eq!(hits.len(), 2);
    assert!(
        hits[0]
            .snippet
            .contains("«password» «rotation» is OPS-18330"),
        "{:?}",
        texts(&hits)
    );

    // Without a model: semantic search is refused, hybrid search is text search.
    drop(f.store);
    let plain = backend.open_with(None).await;
    let mut semantic = query("main", vec![f.main], "unwind");
    semantic.mode = SearchMode::Semantic;
    let error = plain.search(semantic.clone()).await.unwrap_err();
    assert!(matches!(error, StoreError::NoEmbeddings), "{error}");
    let mut hybrid = query("main", vec![f.main], "watercolours");
    hybrid.mode = SearchMode::Hybrid;
    assert_eq!(plain.search(hybrid).await.unwrap().len(), 1);
    drop(plain);
    // With the model again: the index is rebuilt, its vectors are made in the background,
    // and meaning is found again.
    let embedding = backend.open().await;
    semantic.text = "What do I do to unwind?".to_owned();
    let hits = found_by_meaning(&*embedding, &semantic, "Painting watercolours").await;
    assert!(
        hits[0].snippet.starts_with("Painting watercolours"),
        "{:?}",
        texts(&hits)
    );
}

/// A model that embeds documents only once its gate is open (queries at once).
#[derive(Debug)]
struct GatedModel(Arc<std::sync::atomic::AtomicBool>);

impl Embedder for GatedModel {
    fn name(&self) -> &str {
        "gated test model"
    }

    fn embed_texts(
        &self,
        texts: &[(&str, usize)],
    ) -> Result<Vec<Vec<Vec<f32>>>, vilvona_embed::EmbedError> {
        while !self.0.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        vilvona_embed::builtin().embed_texts(texts)
    }

    fn embed_query(&self, text: &str) -> Result<Option<Vec<f32>>, vilvona_embed::EmbedError> {
        vilvona_embed::builtin().embed_query(text)
    }
}

/// Opening a store with another model does not wait for its vectors: words are found at
/// once, meaning once the background has embedded every row with the new model.
async fn another_model_embeds_in_the_background(backend: &Backend) {
    let f = fixture(backend).await;
    f.store
        .ingest(
            f.main,
            vec![new_message(
                "Painting watercolours in the evening helps me relax after long days.",
                5_000,
                None,
            )],
            None,
        )
        .await
        .unwrap();
    drop(f.store);
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Were the vectors made while the store opens, this would never return.
    let store = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        backend.open_with(Some(Arc::new(GatedModel(gate.clone())))),
    )
    .await
    .expect("the store opens without waiting for the new model's vectors");
    let mut words = query("main", vec![f.main], "watercolours");
    words.mode = SearchMode::Text;
    assert_eq!(store.search(words).await.unwrap().len(), 1);
    let mut meaning = query("main", vec![f.main], "What do I do to unwind?");
    meaning.mode = SearchMode::Semantic;
    assert!(
        store.search(meaning.clone()).await.unwrap().is_empty(),
        "no vectors of the new model yet"
    );
    gate.store(true, std::sync::atomic::Ordering::SeqCst);
    found_by_meaning(&*store, &meaning, "Painting watercolours").await;
}

/// A local model that takes its time (here: until its gate opens) embeds beside the store's
/// writes and searches: ingests answer, the index commits on its timer without the waiting
/// documents, and words find them in the database meanwhile; meaning finds them once made.
async fn a_slow_model_holds_neither_writes_nor_searches(backend: &Backend) {
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let store = backend
        .open_with(Some(Arc::new(GatedModel(gate.clone()))))
        .await;
    let main = store.conversation(&key("main", "s1")).await.unwrap().id;
    let seconds = std::time::Duration::from_secs(20);
    let lines = [
        "Painting watercolours in the evening helps me relax after long days.",
        "The lighthouse keeper logs the barometer reading at dawn.",
    ];
    for (at, line) in lines.iter().enumerate() {
        tokio::time::timeout(
            seconds,
            store.ingest(main, vec![new_message(line, 1_000 + at as i64, None)], None),
        )
        .await
        .expect("an ingest answers while the model embeds")
        .unwrap();
        // Past the index's commit delay: a commit on the timer has come and gone.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    }
    for word in ["watercolours", "barometer"] {
        let mut words = query("main", vec![main], word);
        words.mode = SearchMode::Text;
        let hits = tokio::time::timeout(seconds, store.search(words))
            .await
            .expect("a search answers while the model embeds")
            .unwrap();
        assert_eq!(texts(&hits).len(), 1, "{word}: {:?}", texts(&hits));
    }
    gate.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut meaning = query("main", vec![main], "What do I do to unwind?");
    meaning.mode = SearchMode::Semantic;
    found_by_meaning(&*store, &meaning, "Painting watercolours").await;
    assert_eq!(store.index_doc_count().await.unwrap(), 2);
}

/// Searches until the first hit starts with `first` (the background makes the vectors within
/// seconds; a minute is the bound of a stuck one).
async fn found_by_meaning(
    store: &dyn HistoryStore,
    query: &SearchQuery,
    first: &str,
) -> Vec<SearchHit> {
    let mut hits = Vec::new();
    for _ in 0..1_200 {
        hits = store.search(query.clone()).await.unwrap();
        if hits
            .first()
            .is_some_and(|hit| hit.snippet.starts_with(first))
        {
            return hits;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "{first:?} was not found first within a minute: {:?}",
        texts(&hits)
    );
}
