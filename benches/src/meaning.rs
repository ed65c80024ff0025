//! Recall by meaning, measured: a generated coding session with facts stated once in passing
//! (`vilvona_workload::meaning::PROBES`), replayed through the lossless engine at a 16,000-token
//! budget with the extractive summarizer, then each fact asked about in other words through
//! `vilvona_grep` in text, semantic and hybrid mode. A question counts as recalled at k when the
//! message stating its fact is among the first k hits.

use std::sync::Arc;

use anyhow::{Result, anyhow};
use serde::Serialize;
use serde_json::json;
use vilvona_core::engine::{ContextEngine, IngestBatchParams};
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_lossless::{
    CompactionRequest, EmbeddingSelection, LosslessConfig, LosslessEngine, ToolCaller,
};
use vilvona_store::{SearchMode, SearchOrder, SearchQuery, SearchTarget};
use vilvona_summarize::ExtractiveSummarizer;
use vilvona_workload::meaning::{PROBES, Planted, plant};

/// The budget the session is compacted to (its history is mostly summaries, as a user's is).
const BUDGET: u64 = 16_000;
/// The modes compared.
pub const MODES: [&str; 3] = ["text", "semantic", "hybrid"];

/// How often each mode recalled the facts.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeRecall {
    pub mode: String,
    /// Questions whose fact was among the first 5 hits.
    pub at_5: usize,
    /// … among the first 10.
    pub at_10: usize,
}

/// The evaluation's outcome.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecallFigures {
    pub turns: usize,
    pub questions: usize,
    /// Per mode, in [`MODES`] order.
    pub modes: Vec<ModeRecall>,
    /// Questions text search recalled within 10 and hybrid did not.
    pub lost_by_hybrid: Vec<String>,
    /// Of those, the ones hybrid did not recall within 20 either.
    pub lost_within_20: Vec<String>,
    /// Questions in Chinese or Japanese, and how many hybrid recalled within 10.
    pub cjk_questions: usize,
    pub cjk_hybrid_at_10: usize,
}

impl RecallFigures {
    /// The figures of one mode.
    pub fn mode(&self, mode: &str) -> &ModeRecall {
        self.modes
            .iter()
            .find(|figures| figures.mode == mode)
            .unwrap_or(&self.modes[0])
    }
}

/// Replays a `turns`-turn session with every probe planted, then asks each question in each
/// mode. `progress` is told each step.
pub async fn evaluate(turns: usize, seed: u64, progress: impl Fn(&str)) -> Result<RecallFigures> {
    let mut workload = vilvona_workload::generate(turns, seed, 0);
    let planted = plant(&mut workload, PROBES);
    let dir = tempfile::TempDir::new()?;
    let engine = extractive_engine(dir.path(), BUDGET, &EmbeddingSelection::default()).await?;
    let (session, key) = ("meaning", "agent:main:meaning");
    let conversation = engine.conversation(session, Some(key)).await?;
    for turn in 0..workload.turns.len() {
        let range = workload.turns[turn].clone();
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: session.to_owned(),
                session_key: Some(key.to_owned()),
                messages: workload.turn_messages(turn),
                entry_ids: workload.entries[range]
                    .iter()
                    .map(|entry| Some(entry.id.clone()))
                    .collect(),
                is_heartbeat: false,
            })
            .await?;
        engine
            .compact_conversation(conversation.id, CompactionRequest::routine(BUDGET))
            .await?;
        if (turn + 1) % 250 == 0 {
            progress(&format!("{} turns", turn + 1));
        }
    }
    engine.store().index_doc_count().await?;
    let caller = ToolCaller {
        session_id: session.to_owned(),
        session_key: Some(key.to_owned()),
    };
    let mut figures = RecallFigures {
        turns,
        questions: planted.len(),
        modes: MODES
            .iter()
            .map(|mode| ModeRecall {
                mode: (*mode).to_owned(),
                ..ModeRecall::default()
            })
            .collect(),
        ..RecallFigures::default()
    };
    for Planted { probe, .. } in &planted {
        let stated = stating_message(&engine, conversation.id, probe.statement).await?;
        let cjk = probe.question.chars().any(vilvona_core::tokens::is_cjk);
        let mut ranks = Vec::new();
        for (index, mode) in MODES.iter().enumerate() {
            let found = engine
                .call_tool(
                    &caller,
                    "vilvona_grep",
                    &json!({"query": probe.question, "mode": mode, "scope": "messages", "limit": 10}),
                )
                .await?;
            let rank = found["results"]
                .as_array()
                .and_then(|hits| hits.iter().position(|hit| hit["id"] == stated.as_str()));
            let counts = &mut figures.modes[index];
            counts.at_5 += usize::from(rank.is_some_and(|rank| rank < 5));
            counts.at_10 += usize::from(rank.is_some_and(|rank| rank < 10));
            ranks.push(rank);
        }
        let within = |rank: Option<usize>, k: usize| rank.is_some_and(|rank| rank < k);
        if within(ranks[0], 10) && !within(ranks[2], 10) {
            figures.lost_by_hybrid.push(probe.question.to_owned());
            let deeper = engine
                .call_tool(
                    &caller,
                    "vilvona_grep",
                    &json!({"query": probe.question, "mode": "hybrid", "scope": "messages", "limit": 20}),
                )
                .await?;
            let found = deeper["results"]
                .as_array()
                .is_some_and(|hits| hits.iter().any(|hit| hit["id"] == stated.as_str()));
            if !found {
                figures.lost_within_20.push(probe.question.to_owned());
            }
        }
        if cjk {
            figures.cjk_questions += 1;
            figures.cjk_hybrid_at_10 += usize::from(within(ranks[2], 10));
        }
    }
    Ok(figures)
}

/// A lossless engine with the extractive summarizer, its store in `dir`, compacting to
/// `budget`, embedding with `embedding`: the recall evaluations' engine.
pub async fn extractive_engine(
    dir: &std::path::Path,
    budget: u64,
    embedding: &EmbeddingSelection,
) -> Result<LosslessEngine> {
    let estimator: Arc<dyn TokenEstimator> = Arc::new(HeuristicEstimator);
    let config = LosslessConfig {
        default_token_budget: budget,
        store_dir: Some(dir.join("store").display().to_string()),
        embedding: embedding.clone(),
        ..LosslessConfig::default()
    };
    let store = config
        .open_store(None, false, false)
        .await
        .map_err(|error| anyhow!("opening the store: {error}"))?;
    let summarizer = Arc::new(ExtractiveSummarizer::new(estimator.clone()));
    Ok(LosslessEngine::new(store, summarizer, estimator, config))
}

/// The id (`msg_N`) of the message that states `statement` (found by phrase).
async fn stating_message(
    engine: &LosslessEngine,
    conversation: vilvona_store::ConversationId,
    statement: &str,
) -> Result<String> {
    let hits = engine
        .store()
        .search(SearchQuery {
            agent_id: engine.config().agent_id.clone(),
            conversations: vec![conversation],
            text: statement.to_owned(),
            mode: SearchMode::Phrase,
            target: SearchTarget::Messages,
            since_ms: None,
            before_ms: None,
            order: SearchOrder::Relevance,
            limit: 1,
        })
        .await?;
    match hits.first().map(|hit| &hit.source) {
        Some(vilvona_store::HitSource::Message { id, .. }) => Ok(format!("msg_{}", id.0)),
        _ => Err(anyhow!("no message states {statement:?}")),
    }
}

/// The figures as a Markdown table.
pub fn table(figures: &RecallFigures) -> String {
    let share = |count: usize| 100.0 * count as f64 / figures.questions.max(1) as f64;
    let mut out = String::from("| mode | recall@5 | recall@10 |\n|---|---|---|\n");
    for mode in &figures.modes {
        out.push_str(&format!(
            "| {} | {:.0} % ({}/{}) | {:.0} % ({}/{}) |\n",
            mode.mode,
            share(mode.at_5),
            mode.at_5,
            figures.questions,
            share(mode.at_10),
            mode.at_10,
            figures.questions
        ));
    }
    out.push_str(&format!(
        "\nFound by text within 10 but not by hybrid: {} ({} of them not within 20 either); \
         questions in Chinese or Japanese recalled by hybrid within 10: {} of {}.\n",
        figures.lost_by_hybrid.len(),
        figures.lost_within_20.len(),
        figures.cjk_hybrid_at_10,
        figures.cjk_questions,
    ));
    for question in &figures.lost_by_hybrid {
        out.push_str(&format!("- {question}\n"));
    }
    out
}
