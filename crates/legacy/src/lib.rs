//! The `legacy` engine and the built-in summarization compaction.
//!
//! `legacy` is what every host falls back to: ingest stores nothing (the host's transcript is
//! the record), assemble passes the host's messages through unchanged, and compact runs the
//! built-in compaction on the session transcript — one structured summary of older history,
//! the recent messages kept verbatim. [`compact_transcript`] is public so that any engine can
//! delegate its compaction to it.

mod compaction;
mod cut;
mod structure;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use vilvona_core::engine::*;
use vilvona_core::summarize::Summarizer;
use vilvona_core::tokens::TokenEstimator;

pub use compaction::{CompactionError, CompactionRequest, CompactionSettings, compact_transcript};
pub use cut::{CutPoint, EntryKind, find_cut, find_cut_within};

/// The engine id every host falls back to.
pub const ENGINE_ID: &str = vilvona_core::registry::LEGACY_ENGINE_ID;

/// The built-in engine.
#[derive(Debug, Clone)]
pub struct LegacyEngine {
    settings: CompactionSettings,
    summarizer: Arc<dyn Summarizer>,
    estimator: Arc<dyn TokenEstimator>,
}

impl LegacyEngine {
    pub fn new(
        settings: CompactionSettings,
        summarizer: Arc<dyn Summarizer>,
        estimator: Arc<dyn TokenEstimator>,
    ) -> LegacyEngine {
        LegacyEngine {
            settings,
            summarizer,
            estimator,
        }
    }
}

#[async_trait]
impl ContextEngine for LegacyEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: ENGINE_ID.to_owned(),
            name: "Legacy Context Engine".to_owned(),
            version: Some("1.0.0".to_owned()),
            ..EngineInfo::default()
        }
    }

    async fn ingest(&self, _params: &IngestParams) -> Result<IngestResult, EngineError> {
        Ok(IngestResult { ingested: false })
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        // Legacy passes the host's history through: it never holds a session itself.
        if params.history_elided {
            return Err(EngineError::HistoryNeeded);
        }
        // The memory provider's section is the only addition legacy makes, as OpenClaw's
        // host does for it.
        Ok(AssembleResult {
            messages: params.messages.clone(),
            estimated_tokens: 0,
            system_prompt_addition: params
                .memory_prompt
                .clone()
                .filter(|memory| !memory.trim().is_empty()),
            ..AssembleResult::default()
        })
    }

    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError> {
        if params.abort.as_ref().is_some_and(AbortSignal::is_aborted) {
            return Err(EngineError::Cancelled);
        }
        let Some(session_file) = params.session_file.as_deref() else {
            return Ok(CompactResult::failed(CompactReason::Other(
                "no session transcript to compact".to_owned(),
            )));
        };
        let mut settings = self.settings.clone();
        if let Some(budget) = params.token_budget.filter(|budget| *budget > 0) {
            settings.context_window = budget;
            settings.prompt_budget = Some(budget);
        }
        compact_transcript(CompactionRequest {
            session_file: Path::new(session_file),
            custom_instructions: params.custom_instructions.as_deref(),
            settings: &settings,
            summarizer: &*self.summarizer,
            estimator: &*self.estimator,
            must_make_room: params.force
                && params.compaction_target == Some(CompactionTarget::Budget),
        })
        .await
        .map_err(|error| EngineError::caused_by("legacy compaction", error))
    }
}
