//! Helpers for engine authors, as OpenClaw's plugin SDK offers them.

use std::path::Path;

use vilvona_core::engine::{CompactParams, CompactReason, CompactResult, CompactionTarget};
use vilvona_core::summarize::Summarizer;
use vilvona_core::tokens::TokenEstimator;
use vilvona_legacy::{CompactionError, CompactionRequest, CompactionSettings, compact_transcript};

pub use crate::memory::{MemoryProvider, build_memory_system_prompt_addition};

/// Delegating mode: an engine that does not own compaction runs the built-in compaction on the
/// session transcript from its own `compact` (OpenClaw's `delegateCompactionToRuntime`). A
/// no-op `compact` would disable `/compact` and overflow recovery for that engine.
pub async fn delegate_compaction_to_runtime(
    params: &CompactParams,
    settings: &CompactionSettings,
    summarizer: &dyn Summarizer,
    estimator: &dyn TokenEstimator,
) -> Result<CompactResult, CompactionError> {
    let Some(session_file) = params.session_file.as_deref() else {
        return Ok(CompactResult::failed(CompactReason::Other(
            "no session transcript to compact".to_owned(),
        )));
    };
    let mut settings = settings.clone();
    if let Some(budget) = params.token_budget {
        settings.context_window = budget;
    }
    compact_transcript(CompactionRequest {
        session_file: Path::new(session_file),
        custom_instructions: params.custom_instructions.as_deref(),
        settings: &settings,
        summarizer,
        estimator,
        must_make_room: params.force && params.compaction_target == Some(CompactionTarget::Budget),
    })
    .await
}
