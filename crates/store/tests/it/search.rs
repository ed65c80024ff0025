//! Recall: terms, phrases, regex, time ranges, order, snippets, and scope isolation.

use tempfile::TempDir;
use vilvona_store::*;

use crate::support::*;

struct Fixture {
    _dir: TempDir,
    store: Store,
    main: ConversationId,
    earlier: ConversationId,
    other_agent: ConversationId,
}

async fn fixture() -> Fixture {
    let dir = TempDir::new().unwrap();
    let store = open(&dir).await;
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
        _dir: dir,
        store,
        main,
        earlier,
        other_agent,
    }
}

fn texts(hits: &[SearchHit]) -> Vec<String> {
    hits.iter().map(|hit| hit.snippet.clone()).collect()
}

#[tokio::test]
async fn terms_rank_by_bm25_and_snippets_highlight() {
    let f = fixture().await;
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

#[tokio::test]
async fn phrases_need_adjacent_terms() {
    let f = fixture().await;
    let mut phrase = query("main", vec![f.main], "password rotation");
    phrase.mode = SearchMode::Phrase;
    let hits = f.store.search(phrase).await.unwrap();
    assert_eq!(hits.len(), 1, "{:?}", texts(&hits));
    let mut identifier = query("main", vec![f.main], "OPS-18330");
    identifier.mode = SearchMode::Phrase;
    assert_eq!(f.store.search(identifier).await.unwrap().len(), 1);
}

#[tokio::test]
async fn regex_is_linear_and_bounded_by_the_limit() {
    let f = fixture().await;
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

#[tokio::test]
async fn time_ranges_and_recency_order() {
    let f = fixture().await;
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

#[tokio::test]
async fn scope_is_always_agent_and_conversations() {
    let f = fixture().await;
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

#[tokio::test]
async fn summaries_are_searchable_with_their_ids() {
    let f = fixture().await;
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
