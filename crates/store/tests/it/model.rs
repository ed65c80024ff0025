//! Random sequences of ingest / replace / reopen checked against a simple in-memory model.

use proptest::prelude::*;
use vilvona_core::summarize::{SummaryKind, SummaryLevel};
use vilvona_store::*;

use crate::conformance::Backend;
use crate::support::*;

#[derive(Clone, Debug)]
enum Op {
    /// Ingest messages with these entry numbers (numbers repeat: duplicates).
    Ingest(Vec<u8>),
    /// Replace the context run starting at `start % len` of length `1 + len % 4`.
    Replace {
        start: usize,
        len: usize,
    },
    /// A plan whose first position is wrong: must be refused as stale.
    StaleReplace,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(0u8..40, 1..5).prop_map(Op::Ingest),
        3 => (any::<usize>(), any::<usize>()).prop_map(|(start, len)| Op::Replace { start, len }),
        1 => Just(Op::StaleReplace),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ModelItem {
    Message(String),
    Summary { content: String, depth: u32 },
}

fn observed(context: &[ContextItem]) -> Vec<ModelItem> {
    context
        .iter()
        .map(|item| match &item.content {
            ItemContent::Message(message) => ModelItem::Message(message.text()),
            ItemContent::Summary(summary) => ModelItem::Summary {
                content: summary.content.clone(),
                depth: summary.depth,
            },
        })
        .collect()
}

async fn run(backend: &Backend, ops: Vec<Op>) {
    let mut store = backend.open().await;
    let conversation = store.conversation(&key("main", "model")).await.unwrap().id;
    let mut model: Vec<ModelItem> = Vec::new();
    let mut stored_entries: Vec<String> = Vec::new();
    let mut summaries = 0;
    for op in ops {
        match op {
            Op::Ingest(numbers) => {
                let batch: Vec<NewMessage> = numbers
                    .iter()
                    .map(|n| {
                        new_message(&format!("entry-{n}"), i64::from(*n), Some(&format!("e{n}")))
                    })
                    .collect();
                let results = stored(store.ingest(conversation, batch, None).await.unwrap());
                for (n, result) in numbers.iter().zip(results) {
                    let entry = format!("entry-{n}");
                    let fresh = !stored_entries.contains(&entry);
                    assert_eq!(result.ingested, fresh, "{entry}");
                    if fresh {
                        stored_entries.push(entry.clone());
                        model.push(ModelItem::Message(entry));
                    }
                }
            }
            Op::Replace { start, len } => {
                if model.is_empty() {
                    continue;
                }
                let start = start % model.len();
                let end = (start + 1 + len % 4).min(model.len());
                let context = store.context(conversation).await.unwrap();
                let run = &model[start..end];
                let all_messages = run.iter().all(|item| matches!(item, ModelItem::Message(_)));
                let all_summaries = run
                    .iter()
                    .all(|item| matches!(item, ModelItem::Summary { .. }));
                summaries += 1;
                let content = format!("summary-{summaries}");
                let (kind, depth) = if all_messages {
                    (SummaryKind::Leaf, 0)
                } else {
                    let depth = run
                        .iter()
                        .filter_map(|item| match item {
                            ModelItem::Summary { depth, .. } => Some(*depth),
                            ModelItem::Message(_) => None,
                        })
                        .max()
                        .unwrap_or(0);
                    (SummaryKind::Condensed, depth + 1)
                };
                let mut plan = plan(conversation, &context, start..end, &content);
                plan.summary = NewSummary {
                    kind,
                    depth,
                    content: content.clone(),
                    tokens: 3,
                    level: SummaryLevel::Normal,
                    summarizer: "model/v1".to_owned(),
                };
                let outcome = store.replace(plan).await;
                if all_messages || all_summaries {
                    assert!(
                        matches!(outcome, Ok(ReplaceOutcome::Replaced(_))),
                        "{outcome:?}"
                    );
                    model.splice(start..end, [ModelItem::Summary { content, depth }]);
                } else {
                    assert!(outcome.is_err(), "a mixed run must be refused: {outcome:?}");
                }
            }
            Op::StaleReplace => {
                let context = store.context(conversation).await.unwrap();
                if context.is_empty() {
                    continue;
                }
                let mut plan = plan(conversation, &context, 0..1, "stale");
                plan.items[0].0 += 1;
                assert_eq!(store.replace(plan).await.unwrap(), ReplaceOutcome::Stale);
            }
            Op::Reopen => {
                // (On PostgreSQL, another node: the model holds whichever node reads.)
                drop(store);
                store = backend.open().await;
            }
        }
        let context = store.context(conversation).await.unwrap();
        assert_eq!(observed(&context), model);
        let row = store
            .conversation_by_id(conversation)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.message_count as usize, stored_entries.len());
        assert_eq!(
            row.context_tokens,
            context.iter().map(|item| item.tokens).sum::<u64>()
        );
    }
    let report = store.integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{:?}", report.problems);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_store_behaves_like_the_model(ops in prop::collection::vec(op(), 1..24)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run(&Backend::sqlite(), ops));
    }

    #[test]
    #[ignore = "needs PostgreSQL: scripts/postgres-test-server.sh starts one, .ci/run runs it"]
    fn the_postgresql_store_behaves_like_the_model(ops in prop::collection::vec(op(), 1..24)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async { run(&Backend::postgres().await, ops).await });
    }
}
