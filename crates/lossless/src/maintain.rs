//! The host's calls that compact: `compact` (a manual `/compact`, preflight, overflow
//! recovery) and `maintain` (after a turn, with the host's model in reach: the stand-ins'
//! rewrite, retention, a routine compaction), each against what the host says of its prompt.

use serde_json::json;
use vilvona_core::engine::*;

use crate::budget::HostPrompt;
use crate::compaction::{CompactionReport, CompactionRequest};
use crate::engine::LosslessEngine;
use crate::stand_ins::STAND_INS_PER_MAINTENANCE;

impl LosslessEngine {
    pub(crate) async fn compact_for(
        &self,
        params: &CompactParams,
    ) -> Result<CompactResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        // What the host says of its whole prompt now: its budget and its count.
        let mut prompt = self.host_prompt(conversation.id).await?;
        let own = self.context_tokens(conversation.id).await?;
        // A count is the whole prompt's only when the host asks for room now (OpenClaw's
        // preflight and overflow recovery); a manual compaction's count, if any, is not.
        let room_now = params.force && params.compaction_target == Some(CompactionTarget::Budget);
        prompt.note_compaction(
            params.token_budget,
            params.runtime_settings.as_ref(),
            params.current_token_count.filter(|_| room_now),
            own,
        );
        if !self.inner.store.is_read_only() {
            self.keep_host_prompt(conversation.id, prompt).await?;
        }
        let limits = prompt.limits(&self.inner.config);
        let report = self
            .compact_conversation(
                conversation.id,
                CompactionRequest {
                    budget: limits.ceiling,
                    limits: Some(limits),
                    force: params.force,
                    target: params.compaction_target,
                    current_token_count: params.current_token_count,
                    custom_instructions: params.custom_instructions.as_deref(),
                    abort: params.abort.as_ref(),
                    wait_for_summarizer: false,
                },
            )
            .await?;
        self.record_later_folds(conversation.id, &report).await?;
        let compacted = report.summaries_created > 0 && report.tokens_after < report.tokens_before;
        let reason = report.reason.clone().unwrap_or(if compacted {
            CompactReason::Compacted
        } else {
            CompactReason::NoCandidate
        });
        let details = CompactDetails {
            tokens_before: report.tokens_before,
            tokens_after: Some(report.tokens_after),
            details: Some(report_details(&report, &prompt)),
            ..CompactDetails::default()
        };
        Ok(CompactResult {
            ok: true,
            compacted,
            reason: Some(reason),
            result: Some(details),
        })
    }

    /// Re-summarizes fallback summaries, then compacts if the context is above the threshold
    /// of what the host last said about its prompt (it may have changed since the last turn).
    pub(crate) async fn maintain_session(
        &self,
        params: &MaintainParams,
    ) -> Result<MaintainResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let rewritten = self
            .rewrite_stand_ins(conversation.id, STAND_INS_PER_MAINTENANCE)
            .await?;
        self.maybe_run_retention(&self.inner.config.retention).await;
        let mut prompt = self.host_prompt(conversation.id).await?;
        prompt.note_window(params.runtime_settings.as_ref(), params.token_budget);
        if let Some(budget) = params.token_budget.filter(|budget| *budget > 0) {
            prompt.budget = Some(budget);
        }
        let report = self
            .compact_conversation(
                conversation.id,
                CompactionRequest::within(prompt.limits(&self.inner.config)),
            )
            .await?;
        self.record_later_folds(conversation.id, &report).await?;
        let compacted = report.summaries_created > 0;
        let mut reasons = Vec::new();
        if rewritten > 0 {
            reasons.push(format!("rewrote {rewritten} summaries a stand-in wrote"));
        }
        if compacted {
            reasons.push(format!(
                "compacted {} → {} tokens",
                report.tokens_before, report.tokens_after
            ));
        }
        if report.degraded > 0 {
            reasons.push(format!(
                "{} summaries written by the fallback summarizer: {}",
                report.degraded,
                report
                    .degraded_reason
                    .as_deref()
                    .unwrap_or("the summarizer failed")
            ));
        }
        Ok(MaintainResult {
            changed: rewritten > 0 || compacted,
            bytes_freed: 0,
            rewritten_entries: rewritten,
            reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        })
    }
}

/// What a compaction result's `details` say: what it did, why it stopped, the limits it worked
/// to and what the host's prompt was known to hold.
fn report_details(report: &CompactionReport, prompt: &HostPrompt) -> serde_json::Value {
    let mut details = json!({
        "passes": report.passes,
        "summariesCreated": report.summaries_created,
        "fallbackSummaries": report.fallbacks,
        "degradedSummaries": report.degraded,
        "stopReason": report.reason.as_ref().map(ToString::to_string),
        "hostPrompt": prompt,
    });
    if let Some(limits) = report.limits {
        details["limits"] = json!({
            "trigger": limits.trigger,
            "goal": limits.goal,
            "share": limits.share,
            "ceiling": limits.ceiling,
        });
    }
    if let Some(reason) = &report.degraded_reason {
        details["degradedReason"] = json!(reason);
    }
    if let Some(detail) = &report.detail {
        details["detail"] = json!(detail);
    }
    details
}
