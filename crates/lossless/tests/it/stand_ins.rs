//! Folds a stand-in wrote (the summarizer was down) are rewritten by the summarizer once it
//! answers: one whose rewrite cannot fit is passed over and never asked again (before, it
//! stayed first, cost a model call at every maintenance and kept the others waiting), and a
//! compaction rewrites stand-ins before it condenses them (before, a parent was written from
//! a truncation and the stand-in was counted as rewritten); those a compaction condensed while
//! the model was still down are rewritten under their parent once it answers (before, only
//! the context's were: the soak's cell n found five left).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tempfile::TempDir;
use vilvona_core::engine::*;
use vilvona_core::summarize::*;
use vilvona_lossless::{CompactionRequest, LosslessEngine};
use vilvona_store::{ConversationId, ItemContent, StoredSummary, written_by_a_stand_in};

use crate::support::*;

/// A summarizer that is down (the summarizer behind it writes, as the host's model's fallback
/// does), then answers; while `unfit` names a text, what summarizes a source holding it is
/// far too long to fit.
#[derive(Debug, Default)]
struct Model {
    up: Mutex<bool>,
    unfit: Mutex<Option<String>>,
    asked: Mutex<Vec<String>>,
}

#[async_trait]
impl Summarizer for Model {
    fn id(&self) -> &str {
        "model/v1"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let source = request.source_text();
        if !*self.up.lock().unwrap() {
            // Down: the summarizer behind it writes (as the host's model's fallback does).
            return Ok(Summary {
                degraded: Some(Degraded {
                    written_by: "extractive/v1".to_owned(),
                    reason: "503: the model is down".to_owned(),
                }),
                ..Summary::new(
                    format!("A fallback's digest of {} items.", request.items.len()),
                    request.level,
                )
            });
        }
        self.asked.lock().unwrap().push(source.clone());
        let unfit = self.unfit.lock().unwrap().clone();
        if unfit.is_some_and(|text| source.contains(&text)) {
            return Ok(Summary::new(source.repeat(3), request.level));
        }
        Ok(Summary::new(
            format!("The model's summary of {} items.", request.items.len()),
            request.level,
        ))
    }
}

async fn stand_ins(engine: &LosslessEngine, conversation: ConversationId) -> Vec<StoredSummary> {
    engine
        .store()
        .stand_in_summaries(conversation)
        .await
        .unwrap()
}

/// Twenty turns folded while the model is down: every fold a stand-in's.
async fn folded_while_down(dir: &TempDir) -> (LosslessEngine, Arc<Model>, ConversationId) {
    let model = Arc::new(Model::default());
    let engine = engine_in(dir, small_config(), model.clone()).await;
    let conversation = engine.conversation("s1", Some("s1")).await.unwrap().id;
    for index in 0..20 {
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: "s1".to_owned(),
                session_key: Some("s1".to_owned()),
                messages: turn(index),
                ..IngestBatchParams::default()
            })
            .await
            .unwrap();
        engine
            .compact_conversation(conversation, CompactionRequest::routine(4_000))
            .await
            .unwrap();
    }
    (engine, model, conversation)
}

/// Those folds then condensed while the model is still down: the condensation cannot rewrite
/// them first and takes them in as they are.
async fn condensed_while_down(dir: &TempDir) -> (LosslessEngine, Arc<Model>, ConversationId) {
    let (engine, model, conversation) = folded_while_down(dir).await;
    engine
        .compact_conversation(conversation, CompactionRequest::forced(1_000))
        .await
        .unwrap();
    (engine, model, conversation)
}

async fn maintain(engine: &LosslessEngine) {
    engine
        .maintain(&MaintainParams {
            session_id: "s1".to_owned(),
            session_key: Some("s1".to_owned()),
            token_budget: Some(4_000),
            ..MaintainParams::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stand_in_the_model_cannot_fit_is_passed_over_and_not_asked_again() {
    let dir = TempDir::new().unwrap();
    let (engine, model, conversation) = folded_while_down(&dir).await;
    let written = stand_ins(&engine, conversation).await;
    let all = context_summaries(&engine, "s1", Some("s1")).await;
    assert!(
        written.len() >= 3,
        "{} stand-ins of {:?}",
        written.len(),
        all.iter()
            .map(|s| (s.depth, s.level, s.summarizer.clone()))
            .collect::<Vec<_>>()
    );
    // The oldest one's rewrite cannot fit.
    let oldest = &written[0];
    let children = engine.store().children(oldest.row_id).await.unwrap();
    let ItemContent::Message(first) = &children[0] else {
        panic!("a leaf's first child is a message")
    };
    let marker = first.text().chars().take(12).collect::<String>();
    *model.unfit.lock().unwrap() = Some(marker.clone());
    *model.up.lock().unwrap() = true;
    for _ in 0..written.len() {
        maintain(&engine).await;
    }
    let left = stand_ins(&engine, conversation).await;
    assert_eq!(
        left.iter().map(|s| &s.summary_id).collect::<Vec<_>>(),
        vec![&oldest.summary_id],
        "every other stand-in rewritten"
    );
    let asked_about_it = model
        .asked
        .lock()
        .unwrap()
        .iter()
        .filter(|source| source.contains(&marker))
        .count();
    assert_eq!(asked_about_it, 1, "the unfit one was asked once");
}

#[tokio::test]
async fn a_compaction_rewrites_stand_ins_before_it_condenses_them() {
    let dir = TempDir::new().unwrap();
    let (engine, model, conversation) = folded_while_down(&dir).await;
    let written = stand_ins(&engine, conversation).await;
    assert!(written.len() >= 3, "{written:?}");
    *model.up.lock().unwrap() = true;
    // Room now: the leaves are condensed.
    engine
        .compact_conversation(conversation, CompactionRequest::forced(1_000))
        .await
        .unwrap();
    let condensed: Vec<StoredSummary> = context_summaries(&engine, "s1", Some("s1"))
        .await
        .into_iter()
        .filter(|summary| summary.depth > 0)
        .collect();
    assert!(!condensed.is_empty(), "the compaction condensed");
    for parent in condensed {
        assert!(
            !written_by_a_stand_in(parent.level, &parent.summarizer),
            "{parent:?}"
        );
        for child in engine.store().children(parent.row_id).await.unwrap() {
            if let ItemContent::Summary(child) = child {
                assert!(
                    !written_by_a_stand_in(child.level, &child.summarizer),
                    "{} was condensed as a stand-in wrote it: {}",
                    child.summary_id,
                    child.summarizer
                );
            }
        }
    }
}

/// Every summary folded under `summary`.
async fn descendants(engine: &LosslessEngine, summary: &StoredSummary) -> Vec<StoredSummary> {
    let mut found = Vec::new();
    let mut stack = vec![summary.row_id];
    while let Some(parent) = stack.pop() {
        for child in engine.store().children(parent).await.unwrap() {
            if let ItemContent::Summary(child) = child {
                stack.push(child.row_id);
                found.push(child);
            }
        }
    }
    found
}

#[tokio::test]
async fn stand_ins_condensed_while_the_model_is_down_are_rewritten_once_it_answers() {
    let dir = TempDir::new().unwrap();
    let (engine, model, conversation) = condensed_while_down(&dir).await;
    let mut folded = Vec::new();
    for summary in context_summaries(&engine, "s1", Some("s1")).await {
        folded.extend(descendants(&engine, &summary).await);
    }
    assert!(
        folded
            .iter()
            .any(|summary| written_by_a_stand_in(summary.level, &summary.summarizer)),
        "stand-ins condensed as they were: {folded:?}"
    );
    *model.up.lock().unwrap() = true;
    for _ in 0..stand_ins(&engine, conversation).await.len() {
        maintain(&engine).await;
    }
    // (The parents themselves may not fit a rewrite here: the model's summaries they would be
    // written from are a few words each.)
    let mut left = Vec::new();
    for summary in context_summaries(&engine, "s1", Some("s1")).await {
        for summary in descendants(&engine, &summary).await {
            if written_by_a_stand_in(summary.level, &summary.summarizer) {
                left.push((summary.summary_id, summary.summarizer));
            }
        }
    }
    assert!(left.is_empty(), "stand-ins left under a parent: {left:?}");
}

/// The panel's re-summarize rewrites the stand-ins in the context (what it flags), not those
/// folded under a parent, and counts one whose rewrite does not fit as remaining. Before, it
/// asked for as many rewrites as it flagged from a list that left the unfit one out, so a
/// second call rewrote a folded stand-in in its place and said none remained.
#[tokio::test]
async fn re_summarize_rewrites_the_contexts_stand_ins_only() {
    use vilvona_core::admin::{EngineAdmin, ToolCaller};
    let dir = TempDir::new().unwrap();
    let (engine, model, conversation) = condensed_while_down(&dir).await;
    let in_context: Vec<StoredSummary> = context_summaries(&engine, "s1", Some("s1"))
        .await
        .into_iter()
        .filter(|summary| written_by_a_stand_in(summary.level, &summary.summarizer))
        .collect();
    let folded: Vec<String> = stand_ins(&engine, conversation)
        .await
        .into_iter()
        .filter(|summary| in_context.iter().all(|c| c.row_id != summary.row_id))
        .map(|summary| summary.summary_id)
        .collect();
    let parents = in_context.iter().filter(|s| s.depth > 0).count() as u64;
    assert!(
        parents > 0 && !folded.is_empty(),
        "{in_context:?} {folded:?}"
    );
    // A parent's source is its children's fallback digests: its rewrite does not fit.
    *model.unfit.lock().unwrap() = Some("A fallback's digest".to_owned());
    *model.up.lock().unwrap() = true;
    let session = ToolCaller::new("s1", Some("s1".to_owned()));
    let still_folded = |engine: &LosslessEngine| {
        let engine = engine.clone();
        let folded = folded.clone();
        async move {
            let left: Vec<String> = stand_ins(&engine, conversation)
                .await
                .into_iter()
                .map(|summary| summary.summary_id)
                .collect();
            folded.iter().all(|id| left.contains(id))
        }
    };
    let first = engine.resummarize(&session, true).await.unwrap();
    assert_eq!(
        (first.flagged, first.rewritten, first.remaining),
        (
            in_context.len() as u64,
            in_context.len() as u64 - parents,
            parents
        )
    );
    assert!(
        still_folded(&engine).await,
        "a folded stand-in was rewritten"
    );
    let second = engine.resummarize(&session, true).await.unwrap();
    assert_eq!(
        (second.flagged, second.rewritten, second.remaining),
        (parents, 0, parents)
    );
    assert!(
        still_folded(&engine).await,
        "a folded stand-in was rewritten"
    );
}
