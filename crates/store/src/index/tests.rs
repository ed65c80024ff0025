//! The index against plain walks over its documents: the nearest by meaning found in pieces,
//! and text search pruned by the fact columns, find what a walk over every document finds.

use proptest::prelude::*;

use super::*;
use crate::types::ConversationId;

const WORDS: [&str; 6] = ["alpha", "beta", "gamma", "delta", "告警阈值", "epsilon"];

/// A document: conversation, kind (summary or not), time, words; and a query: words,
/// conversations, target, a time range.
type Doc = (u8, bool, i64, Vec<usize>);

fn index_of(dir: &Path, docs: &[Doc], deleted: &[usize]) -> RecallIndex {
    let (index, _) = RecallIndex::open(dir, None).unwrap();
    let mut sink = index.try_writer().unwrap().unwrap();
    for (id, (conversation, summary, time, words)) in docs.iter().enumerate() {
        let text: Vec<&str> = words.iter().map(|word| WORDS[*word]).collect();
        let row = if *summary {
            IndexedRow::Summary(id as i64 + 1)
        } else {
            IndexedRow::Message(id as i64 + 1)
        };
        sink.add(IndexDoc {
            row,
            conversation: i64::from(*conversation),
            agent: "main",
            role: "user",
            time_ms: *time,
            text: &text.join(" "),
            neighbour: None,
        })
        .unwrap();
        // Several segments: the threshold carries from one to the next.
        if id % 7 == 6 {
            sink.commit().unwrap();
        }
    }
    for id in deleted.iter().filter(|id| **id < docs.len()) {
        let (_, summary, ..) = docs[*id];
        sink.remove(if summary {
            IndexedRow::Summary(*id as i64 + 1)
        } else {
            IndexedRow::Message(*id as i64 + 1)
        });
    }
    sink.commit().unwrap();
    index.reload().unwrap();
    index
}

/// The nearest documents, compared in pieces across the cores (several segments, several
/// pieces each, a deleted document, a scope of one conversation, messages only, a time
/// range), are the ones a plain walk over every document finds, with the same
/// similarities.
#[test]
fn the_nearest_in_pieces_are_the_nearest_of_all() {
    const SUBJECTS: [&str; 8] = [
        "the harbour ferry",
        "my sister",
        "the database migration",
        "painting at night",
        "the staging cluster",
        "our team lunch",
        "a flaky test",
        "the quarterly report",
    ];
    const VERBS: [&str; 6] = [
        "leaves at noon",
        "was rescheduled",
        "helps me relax",
        "failed again",
        "needs a review",
        "moved to Friday",
    ];
    let dir = tempfile::tempdir().unwrap();
    let embedder: Arc<dyn Embedder> = vilvona_embed::builtin();
    let (index, _) = RecallIndex::open(&dir.path().join("index"), Some(embedder.clone())).unwrap();
    let mut sink = index.try_writer().unwrap().unwrap();
    let docs: Vec<(IndexedRow, i64, i64, String)> = (0..3_000_i64)
        .map(|id| {
            let row = if id % 5 == 4 {
                IndexedRow::Summary(id + 1)
            } else {
                IndexedRow::Message(id + 1)
            };
            let (a, b) = (
                id as usize * 7 % SUBJECTS.len(),
                id as usize * 11 % VERBS.len(),
            );
            // Every fourth note without its number: equal texts in every piece, whose
            // equal scores are ordered by key across the pieces.
            let text = if id % 4 == 0 {
                format!("{} {}.", SUBJECTS[a], VERBS[b])
            } else {
                format!("Note {id}: {} {}.", SUBJECTS[a], VERBS[b])
            };
            (row, id % 3, id * 1_000, text)
        })
        .collect();
    for (at, (row, conversation, time_ms, text)) in docs.iter().enumerate() {
        sink.add(IndexDoc {
            row: *row,
            conversation: *conversation,
            agent: "main",
            role: "user",
            time_ms: *time_ms,
            text,
            neighbour: None,
        })
        .unwrap();
        if at == 1_700 {
            sink.commit().unwrap();
        }
    }
    let deleted = IndexedRow::Message(1_201);
    sink.remove(deleted);
    sink.commit().unwrap();
    index.reload().unwrap();

    let question = "when does the ferry leave the harbour?";
    let vector = embedder.embed_query(question).unwrap().unwrap();
    let query = SearchQuery {
        agent_id: "main".to_owned(),
        conversations: vec![ConversationId(1)],
        text: question.to_owned(),
        mode: SearchMode::Semantic,
        target: SearchTarget::Messages,
        since_ms: Some(200_000),
        before_ms: Some(2_900_000),
        limit: 25,
        order: SearchOrder::Relevance,
    };
    let found = index.nearest(&query, &vector).unwrap();
    let quantised = vilvona_embed::QueryVector::new(&vector);
    let mut all: Vec<(f32, u64)> = docs
        .iter()
        .filter(|(row, conversation, time_ms, _)| {
            matches!(row, IndexedRow::Message(_))
                && *row != deleted
                && *conversation == 1
                && (200_000..2_900_000).contains(time_ms)
        })
        .map(|(row, _, _, text)| {
            let chunks = embedder
                .embed_texts(&[(text, vilvona_embed::chunks_for("user"))])
                .unwrap()
                .remove(0);
            (
                vilvona_embed::nearness(&chunks, &quantised).unwrap(),
                key_of(*row),
            )
        })
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    let expected: Vec<(IndexedRow, f32)> = all
        .into_iter()
        .take(query.limit)
        .map(|(similarity, key)| (row_of(key), similarity))
        .collect();
    assert_eq!(found, expected);

    // The same from a cache that holds both segments, one of them, or none (the rest
    // read from the index files at each search), searched twice each; and so for
    // every document in scope (the best 25 are all in the newer segment).
    let scope = facts::Scope {
        conversations: &[1],
        kind: target_kind(query.target),
        since_ms: query.since_ms,
        before_ms: query.before_ms,
    };
    let field = vectors_field(embedder.name());
    let searcher = index.reader.searcher();
    let nearest_from = |cache: &vectors::VectorCache, limit: usize| {
        let best = vectors::nearest(
            &searcher,
            cache,
            &index.fact_cache,
            &field,
            &vector,
            &scope,
            limit,
        );
        let best: Vec<(IndexedRow, f32)> = best
            .unwrap()
            .into_iter()
            .map(|(score, key)| (row_of(key), score))
            .collect();
        best
    };
    let all_held = vectors::VectorCache::holding(usize::MAX);
    assert_eq!(nearest_from(&all_held, query.limit), expected);
    let every = nearest_from(&all_held, docs.len());
    assert_eq!(every[..query.limit], expected);
    let both = all_held.held_bytes();
    for (limit, held) in [(both, both..=both), (both / 2, 1..=both - 1), (0, 0..=0)] {
        let cache = vectors::VectorCache::holding(limit);
        for _ in 0..2 {
            assert_eq!(
                nearest_from(&cache, query.limit),
                expected,
                "holding {limit}"
            );
            assert_eq!(nearest_from(&cache, docs.len()), every, "holding {limit}");
        }
        assert!(held.contains(&cache.held_bytes()), "holding {limit} bytes");
    }

    // Merged into one segment (without the deleted document): what the two held is freed,
    // and the one left, smaller than both, is held in their place; the two segments'
    // columns are closed and the merged one's opened.
    assert_eq!(index.fact_cache.open_segments(), 2);
    sink.merge_all().unwrap();
    index.reload().unwrap();
    let merged = index.reader.searcher();
    assert_eq!(merged.segment_readers().len(), 1);
    let best = vectors::nearest(
        &merged,
        &all_held,
        &index.fact_cache,
        &field,
        &vector,
        &scope,
        query.limit,
    );
    assert_eq!(best.unwrap().len(), query.limit);
    assert!((1..both).contains(&all_held.held_bytes()));
    assert_eq!(index.fact_cache.open_segments(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Pruning with the scope on fast fields finds what intersecting with the scope's
    /// postings finds: the same best scores, each row with the score it has there.
    #[test]
    fn pruning_finds_what_filtering_finds(
        docs in prop::collection::vec(
            (0u8..4, any::<bool>(), 0i64..100, prop::collection::vec(0usize..WORDS.len(), 1..6)),
            1..60,
        ),
        deleted in prop::collection::vec(0usize..60, 0..5),
        query_words in prop::collection::vec(0usize..WORDS.len(), 1..4),
        conversations in prop::collection::btree_set(0u8..4, 1..4),
        target in prop_oneof![Just(SearchTarget::Both), Just(SearchTarget::Messages), Just(SearchTarget::Summaries)],
        since in prop::option::of(0i64..100),
        before in prop::option::of(0i64..100),
        phrase in any::<bool>(),
        limit in 1usize..8,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let index = index_of(&dir.path().join("index"), &docs, &deleted);
        let text: Vec<&str> = query_words.iter().map(|word| WORDS[*word]).collect();
        let mut query = SearchQuery {
            agent_id: "main".to_owned(),
            conversations: conversations.iter().map(|c| ConversationId(i64::from(*c))).collect(),
            text: text.join(" "),
            mode: if phrase { SearchMode::Phrase } else { SearchMode::Text },
            target,
            since_ms: since,
            before_ms: before,
            limit,
            order: SearchOrder::Relevance,
        };
        let searcher = index.reader.searcher();
        let pruned = index.search_with(&searcher, &query, Plan::Prune).unwrap();
        query.limit = docs.len();
        let all = index.search_with(&searcher, &query, Plan::Filter).unwrap();
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * a.abs().max(1.0);
        prop_assert_eq!(pruned.len(), all.len().min(limit));
        for ((_, got), (_, want)) in pruned.iter().zip(&all) {
            prop_assert!(close(*got, *want), "{got} vs {want}");
        }
        for (row, score) in &pruned {
            let there = all.iter().find(|(other, _)| other == row);
            prop_assert!(there.is_some_and(|(_, other)| close(*score, *other)), "{row:?}");
        }
    }
}
