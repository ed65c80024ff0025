//! Summarizer faults and crashes: nothing is lost and the next turn proceeds.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tempfile::TempDir;
use vilvona_core::engine::*;
use vilvona_core::summarize::*;
use vilvona_lossless::{CompactionRequest, LosslessEngine};
use vilvona_store::ItemContent;

use crate::support::*;

/// A summarizer that misbehaves in a chosen way at every level except fallback.
#[derive(Debug)]
enum Misbehaving {
    Errors,
    Empty,
    Longer,
    /// Hangs forever, after signalling that it was reached.
    Hangs(Arc<tokio::sync::Notify>),
    Slow(Duration),
}

#[async_trait]
impl Summarizer for Misbehaving {
    fn id(&self) -> &str {
        "misbehaving"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        match self {
            Misbehaving::Errors => Err(SummarizeError::Transient(
                "503 from the provider".to_owned(),
            )),
            Misbehaving::Empty => Ok(Summary::new("   ".to_owned(), request.level)),
            Misbehaving::Longer => Ok(Summary::new(request.source_text().repeat(2), request.level)),
            Misbehaving::Hangs(reached) => {
                reached.notify_one();
                std::future::pending::<()>().await;
                unreachable!()
            }
            Misbehaving::Slow(delay) => {
                tokio::time::sleep(*delay).await;
                Ok(Summary::new("slow but short".to_owned(), request.level))
            }
        }
    }
}

async fn drive(engine: &LosslessEngine, turns: std::ops::Range<usize>) {
    for index in turns {
        engine
            .after_turn(&AfterTurnParams {
                session_id: "s1".to_owned(),
                messages: turn(index).into(),
                pre_prompt_message_count: 0,
                token_budget: Some(4_000),
                ..AfterTurnParams::default()
            })
            .await
            .unwrap();
    }
}

async fn check_nothing_lost(engine: &LosslessEngine, expected_messages: u64) {
    let conversation = engine.conversation("s1", None).await.unwrap();
    let row = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.message_count, expected_messages);
    let report = engine.store().integrity_check().await.unwrap();
    assert!(report.is_healthy(), "{:?}", report.problems);
}

#[tokio::test]
async fn every_misbehaviour_falls_back_to_truncation_and_loses_nothing() {
    for misbehaviour in [Misbehaving::Errors, Misbehaving::Empty, Misbehaving::Longer] {
        let dir = TempDir::new().unwrap();
        let label = format!("{misbehaviour:?}");
        let engine = engine_in(&dir, small_config(), Arc::new(misbehaviour)).await;
        drive(&engine, 0..12).await;
        check_nothing_lost(&engine, 48).await;
        let conversation = engine.conversation("s1", None).await.unwrap();
        let items = engine.store().context(conversation.id).await.unwrap();
        let fallbacks = items
            .iter()
            .filter(|item| matches!(&item.content, ItemContent::Summary(s) if s.level == SummaryLevel::Fallback))
            .count();
        assert!(fallbacks > 0, "{label}: fallback summaries published");
        let total: u64 = items.iter().map(|item| item.tokens).sum();
        assert!(total <= 4_000, "{label}: the context still fits ({total})");
    }
}

#[tokio::test]
async fn maintain_resummarizes_fallback_nodes_once_the_summarizer_works() {
    let dir = TempDir::new().unwrap();
    {
        let engine = engine_in(&dir, small_config(), Arc::new(Misbehaving::Errors)).await;
        drive(&engine, 0..16).await;
    }
    let engine = engine(&dir).await;
    let conversation = engine.conversation("s1", None).await.unwrap();
    let count_fallbacks = |items: &Vec<vilvona_store::ContextItem>| {
        items
            .iter()
            .filter(|item| matches!(&item.content, ItemContent::Summary(s) if s.level == SummaryLevel::Fallback))
            .count()
    };
    let items = engine.store().context(conversation.id).await.unwrap();
    let before = count_fallbacks(&items);
    assert!(
        before > 0,
        "{:?}",
        items
            .iter()
            .map(|i| match &i.content {
                ItemContent::Summary(s) => format!("S{}{:?}", s.depth, s.level),
                _ => "m".to_owned(),
            })
            .collect::<Vec<_>>()
    );
    let result = maintain_s1(&engine).await;
    assert!(result.changed);
    assert_eq!(result.rewritten_entries as usize, before);
    assert_eq!(
        count_fallbacks(&engine.store().context(conversation.id).await.unwrap()),
        0
    );
    check_nothing_lost(&engine, 64).await;
}

/// A summarizer that fails until it is switched on.
#[derive(Debug, Default)]
struct Recovering(std::sync::atomic::AtomicBool);

#[async_trait]
impl Summarizer for Recovering {
    fn id(&self) -> &str {
        "recovering"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        if !self.0.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SummarizeError::Transient(
                "503 from the provider".to_owned(),
            ));
        }
        Ok(Summary::new(
            format!("recovered summary at depth {}", request.depth),
            request.level,
        ))
    }
}

async fn assemble_s1(engine: &LosslessEngine) -> AssembleResult {
    engine
        .assemble(&AssembleParams {
            session_id: "s1".to_owned(),
            token_budget: Some(4_000),
            ..AssembleParams::default()
        })
        .await
        .unwrap()
}

async fn maintain_s1(engine: &LosslessEngine) -> MaintainResult {
    engine
        .maintain(&MaintainParams {
            session_id: "s1".to_owned(),
            ..MaintainParams::default()
        })
        .await
        .unwrap()
}

/// The text of the summaries an assembly shows, in order.
fn shown_summaries(assembled: &AssembleResult) -> Vec<String> {
    assembled
        .summaries
        .iter()
        .map(|summary| assembled.messages[summary.index].plain_text())
        .collect()
}

/// A fallback summary rewritten in place is shown rewritten by the same engine's next
/// assembly (its rendered form and the kept assembly held the old text).
#[tokio::test]
async fn an_assembly_after_resummarizing_shows_the_new_text() {
    let dir = TempDir::new().unwrap();
    let summarizer = Arc::new(Recovering::default());
    let engine = engine_in(&dir, small_config(), summarizer.clone()).await;
    drive(&engine, 0..16).await;
    assert!(!assemble_s1(&engine).await.summaries.is_empty());
    summarizer
        .0
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(maintain_s1(&engine).await.rewritten_entries > 0);
    let shown = shown_summaries(&assemble_s1(&engine).await);
    let stored: Vec<String> = context_summaries(&engine, "s1", None)
        .await
        .into_iter()
        .map(|summary| summary.content)
        .collect();
    assert_eq!(shown.len(), stored.len());
    for (shown, stored) in shown.iter().zip(&stored) {
        assert!(
            shown.contains(stored.as_str()),
            "shown {shown:?}, stored {stored:?}"
        );
    }
}

/// The same when another engine on the store (another process, in use) re-summarized.
#[tokio::test]
async fn an_assembly_after_another_engine_resummarized_shows_the_new_text() {
    let dir = TempDir::new().unwrap();
    let gateway = engine_in(&dir, small_config(), Arc::new(Recovering::default())).await;
    drive(&gateway, 0..16).await;
    assert!(!assemble_s1(&gateway).await.summaries.is_empty());
    let working = Recovering::default();
    working.0.store(true, std::sync::atomic::Ordering::SeqCst);
    let operator = engine_in(&dir, small_config(), Arc::new(working)).await;
    assert!(maintain_s1(&operator).await.rewritten_entries > 0);
    let shown = shown_summaries(&assemble_s1(&gateway).await);
    assert!(
        shown.iter().all(|text| !text.contains("[fallback summary")),
        "{shown:?}"
    );
    assert!(
        shown.iter().any(|text| text.contains("recovered summary")),
        "{shown:?}"
    );
}

#[tokio::test]
async fn a_slow_summarizer_stops_at_the_deadline() {
    let dir = TempDir::new().unwrap();
    let mut config = small_config();
    config.deadline_ms = 1;
    let engine = engine_in(
        &dir,
        config,
        Arc::new(Misbehaving::Slow(Duration::from_millis(20))),
    )
    .await;
    drive(&engine, 0..10).await;
    let conversation = engine.conversation("s1", None).await.unwrap();
    // A small budget needs several passes; the deadline allows one.
    let report = engine
        .compact_conversation(conversation.id, CompactionRequest::forced(1_500))
        .await
        .unwrap();
    assert_eq!(report.reason, Some(CompactReason::Deadline));
    assert_eq!(report.passes, 1);
    check_nothing_lost(&engine, 40).await;
}

#[tokio::test]
async fn a_crash_between_summarizing_and_publishing_loses_nothing() {
    let dir = TempDir::new().unwrap();
    {
        let reached = Arc::new(tokio::sync::Notify::new());
        let engine = engine_in(
            &dir,
            small_config(),
            Arc::new(Misbehaving::Hangs(reached.clone())),
        )
        .await;
        // The turn's messages are stored; compaction then hangs in the summarizer and the
        // process "dies" (the future is dropped) before anything is published: as soon as the
        // summarizer is reached, however slow the machine.
        let hung = tokio::select! {
            () = drive(&engine, 0..12) => false,
            () = reached.notified() => true,
        };
        assert!(hung, "the summarizer hung");
    }
    let engine = engine(&dir).await;
    let conversation = engine.conversation("s1", None).await.unwrap();
    let stored = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap()
        .message_count;
    assert!(stored >= 4, "what was acknowledged is there");
    check_nothing_lost(&engine, stored).await;
    // The next turn proceeds and compacts.
    drive(&engine, 12..14).await;
    check_nothing_lost(&engine, stored + 8).await;
}

/// A summarizer that takes a moment and counts how many of its calls overlap.
#[derive(Debug, Default)]
struct Overlapping {
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Summarizer for Overlapping {
    fn id(&self) -> &str {
        "overlapping"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.in_flight.fetch_sub(1, SeqCst);
        Ok(Summary::new(
            format!("{} items, summarized", request.items.len()),
            request.level,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_summarized_several_leaves_at_a_time_and_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let summarizer = Arc::new(Overlapping::default());
    let engine = engine_in(&dir, small_config(), summarizer.clone()).await;
    // Thirty turns stored without compaction: a backlog, as after a long import.
    for index in 0..30 {
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: "s1".to_owned(),
                messages: turn(index),
                ..IngestBatchParams::default()
            })
            .await
            .unwrap();
    }
    let conversation = engine.conversation("s1", None).await.unwrap();
    let report = engine
        .compact_conversation(conversation.id, CompactionRequest::routine(4_000))
        .await
        .unwrap();
    assert!(report.summaries_created >= 3, "{report:?}");
    assert!(
        report.passes < report.summaries_created,
        "later passes made several leaves each: {report:?}"
    );
    assert!(
        summarizer.most.load(std::sync::atomic::Ordering::SeqCst) > 1,
        "the leaves' summarizer calls overlapped"
    );
    assert!(report.tokens_after < report.tokens_before);
    check_nothing_lost(&engine, 120).await;
    // Each message sits under exactly one leaf (the integrity check's DAG rules) and the
    // context still holds every unsummarized message in order.
    let items = engine.store().context(conversation.id).await.unwrap();
    let seqs: Vec<u64> = items
        .iter()
        .filter_map(|item| match &item.content {
            ItemContent::Message(message) => Some(message.seq),
            ItemContent::Summary(_) => None,
        })
        .collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
}

/// The operator's repair (the panel's "re-summarize"): a preview counts the truncated summaries
/// and asks the summarizer nothing; the repair rewrites them; a summarizer still failing leaves
/// them counted as remaining.
#[tokio::test]
async fn the_admin_resummarizes_truncated_summaries_after_a_preview() {
    use vilvona_core::admin::{EngineAdmin, ToolCaller};
    let dir = TempDir::new().unwrap();
    let summarizer = Arc::new(Recovering::default());
    let engine = engine_in(&dir, small_config(), summarizer.clone()).await;
    drive(&engine, 0..16).await;
    let session = ToolCaller::new("s1", None);
    let preview = engine.resummarize(&session, false).await.unwrap();
    assert!(preview.flagged > 0, "{preview:?}");
    assert_eq!((preview.rewritten, preview.remaining), (0, preview.flagged));
    assert_eq!(preview.summarizer, "recovering");
    // Still failing: nothing rewritten, all remain.
    let failed = engine.resummarize(&session, true).await.unwrap();
    assert_eq!((failed.rewritten, failed.remaining), (0, preview.flagged));
    summarizer
        .0
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let done = engine.resummarize(&session, true).await.unwrap();
    assert_eq!(
        (done.flagged, done.rewritten, done.remaining),
        (preview.flagged, preview.flagged, 0)
    );
    assert!(
        shown_summaries(&assemble_s1(&engine).await)
            .iter()
            .all(|text| !text.contains("[fallback summary"))
    );
    check_nothing_lost(&engine, 64).await;
}
