//! What a stand-in wrote, rewritten by the configured summarizer once it can be asked.
//!
//! A fold published while the configured summarizer could not write it (the host's model out
//! of reach, refusing, down) was written by a stand-in: the truncation, or the fallback
//! summarizer. `maintain` rewrites them from their children, oldest first, a few a call
//! (each is a model call): those still in the context, and those a condensation took in while
//! the summarizer could not rewrite them first (recall's expansion reads them). One whose
//! rewrite the summarizer cannot fit (not smaller than what it summarizes, or than a
//! truncation it replaces) is remembered and passed over by later calls (state
//! `standIns.unfit`), so it neither blocks the others nor costs a model call at every
//! maintenance; it is said once. And a compaction that would condense stand-ins into a parent
//! rewrites them first when it can, so the parent is written from the model's summaries, not
//! from a truncation.

use std::collections::BTreeSet;

use vilvona_core::engine::*;
use vilvona_core::summarize::{SourceItem, SummaryKind, SummaryLevel, SummaryRequest};
use vilvona_store::*;

use crate::compaction::MIN_SUMMARY_TEXT_TOKENS;
use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::render::{content_source, summary_tokens};

/// The state key of the stand-ins whose rewrite did not fit (their public ids, newest last).
const UNFIT: &str = "standIns.unfit";

/// How many of those are remembered. Folded ones stay rewritable, so past this many the
/// oldest would be asked again (a few model calls a maintenance, for good): the bound is far
/// above what a summarizer that fits its rewrites at all leaves.
const UNFIT_KEPT: usize = 4_096;

/// What became of one stand-in asked to be rewritten.
enum Rewrite {
    Rewritten,
    /// The summarizer's text did not fit: remembered, passed over from now on.
    Unfit,
    /// The summarizer could not be asked, or another call rewrote it first.
    NotNow,
}

/// How many stand-ins one call (a `maintain`, or a condensation about to take them in) asks
/// the summarizer to rewrite at most (each a model call).
pub(crate) const STAND_INS_PER_MAINTENANCE: usize = 4;

impl LosslessEngine {
    /// Rewrites, with the configured summarizer, the conversation's summaries that a stand-in
    /// wrote (in the context, or folded under a parent while the summarizer was down), oldest
    /// first, asking the summarizer at most `at_most` times; passes over those whose
    /// rewrite did not fit before. Stops at the first the summarizer cannot write (still
    /// unavailable: the next call tries again). Returns how many were rewritten.
    pub(crate) async fn rewrite_stand_ins(
        &self,
        conversation: ConversationId,
        at_most: usize,
    ) -> Result<u64, EngineError> {
        if !self.inner.summarizer.in_reach() {
            return Ok(0);
        }
        let stand_ins = self.rewritable_stand_ins(conversation).await?;
        let left = stand_ins.len() as u64;
        let rewritten = self
            .rewrite_each(conversation, stand_ins.iter().take(at_most))
            .await?;
        if rewritten > 0 {
            tracing::info!(
                rewritten,
                left = left - rewritten,
                summarizer = self.inner.summarizer.id(),
                "rewrote summaries a stand-in wrote"
            );
        }
        Ok(rewritten)
    }

    /// The conversation's stand-ins the summarizer may rewrite: all but those it could not fit.
    /// Only those summaries are read (an indexed query), not the whole context.
    async fn rewritable_stand_ins(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<StoredSummary>, EngineError> {
        let stand_ins = self
            .inner
            .store
            .stand_in_summaries(conversation)
            .await
            .map_err(|error| store_error("reading the summaries a stand-in wrote", error))?;
        let unfit = self.unfit_stand_ins(conversation).await?;
        Ok(stand_ins
            .into_iter()
            .filter(|summary| !unfit.contains(&summary.summary_id))
            .collect())
    }

    /// Each of `stand_ins` rewritten in turn, until the summarizer cannot be asked now; how
    /// many were.
    async fn rewrite_each(
        &self,
        conversation: ConversationId,
        stand_ins: impl Iterator<Item = &StoredSummary>,
    ) -> Result<u64, EngineError> {
        let mut rewritten = 0;
        for summary in stand_ins {
            match self.rewrite_stand_in(conversation, summary).await? {
                Rewrite::Rewritten => rewritten += 1,
                Rewrite::Unfit => {}
                Rewrite::NotNow => break,
            }
        }
        Ok(rewritten)
    }

    /// The stand-ins among `items` (a run a condensation is about to take in, or the context
    /// the panel's re-summarize names), at most `at_most` of them rewritten when the summarizer
    /// can be asked; those whose rewrite did not fit before are passed over. Returns how many
    /// were rewritten (a run must then be read again).
    pub(crate) async fn rewrite_stand_ins_among(
        &self,
        conversation: ConversationId,
        items: &[ItemRef],
        at_most: usize,
    ) -> Result<u64, EngineError> {
        let summaries: BTreeSet<SummaryRowId> = items
            .iter()
            .filter_map(|item| match item {
                ItemRef::Summary(id) => Some(*id),
                ItemRef::Message(_) => None,
            })
            .collect();
        if summaries.is_empty() || !self.inner.summarizer.in_reach() {
            return Ok(0);
        }
        let stand_ins = self.rewritable_stand_ins(conversation).await?;
        let rewritten = self
            .rewrite_each(
                conversation,
                stand_ins
                    .iter()
                    .filter(|summary| summaries.contains(&summary.row_id))
                    .take(at_most),
            )
            .await?;
        if rewritten > 0 {
            tracing::info!(
                rewritten,
                among = items.len(),
                summarizer = self.inner.summarizer.id(),
                "rewrote summaries a stand-in wrote, among the items named"
            );
        }
        Ok(rewritten)
    }

    /// One stand-in rewritten from its children, keeping its edges.
    async fn rewrite_stand_in(
        &self,
        conversation: ConversationId,
        summary: &StoredSummary,
    ) -> Result<Rewrite, EngineError> {
        let children = self
            .inner
            .store
            .children(summary.row_id)
            .await
            .map_err(|error| store_error("reading children", error))?;
        let source: Vec<SourceItem> = children.iter().map(content_source).collect();
        let source_tokens: u64 = source
            .iter()
            .map(|s| self.inner.estimator.text_tokens(&s.text))
            .sum();
        let target = match summary.kind {
            SummaryKind::Leaf => self.inner.config.leaf_target_tokens,
            SummaryKind::Condensed => self.inner.config.condensed_target_tokens,
        }
        .min(source_tokens / 3);
        // A truncation made to fit room stays within it: no larger than what it replaces.
        let target = match summary.level {
            SummaryLevel::Fallback => {
                target.min(self.inner.estimator.text_tokens(&summary.content))
            }
            _ => target,
        }
        .max(MIN_SUMMARY_TEXT_TOKENS);
        let request = SummaryRequest::new(summary.kind, summary.depth, target, source);
        let produced = match self.inner.summarizer.summarize(&request).await {
            Ok(produced)
                if produced.degraded.is_none() || summary.level == SummaryLevel::Fallback =>
            {
                produced
            }
            // Unavailable again: a stand-in's text in place of a stand-in's helps nobody.
            _ => return Ok(Rewrite::NotNow),
        };
        let tokens = summary_tokens(&*self.inner.estimator, &summary.into(), &produced.text);
        let fits = match summary.level {
            SummaryLevel::Fallback => tokens <= summary.tokens,
            _ => tokens <= target.saturating_mul(3),
        };
        if produced.text.trim().is_empty() || tokens >= source_tokens || !fits {
            tracing::warn!(
                summary = %summary.summary_id,
                tokens,
                target,
                replaces = summary.tokens,
                summarizer = self.inner.summarizer.id(),
                "the summarizer's rewrite of a stand-in's summary does not fit; it stays as the stand-in wrote it, and is not asked again"
            );
            self.remember_unfit(conversation, &summary.summary_id)
                .await?;
            return Ok(Rewrite::Unfit);
        }
        let summarizer = match produced.degraded {
            Some(degraded) => stand_in_summarizer(&degraded.written_by, self.inner.summarizer.id()),
            None => self.inner.summarizer.id().to_owned(),
        };
        let updated = self
            .inner
            .store
            .update_summary(SummaryUpdate {
                row_id: summary.row_id,
                expected_level: summary.level,
                expected_summarizer: summary.summarizer.clone(),
                content: produced.text,
                tokens,
                level: produced.level,
                summarizer,
            })
            .await
            .map_err(|error| store_error("rewriting a summary", error))?;
        Ok(if updated {
            Rewrite::Rewritten
        } else {
            Rewrite::NotNow
        })
    }

    /// The stand-ins of a conversation whose rewrite did not fit.
    async fn unfit_stand_ins(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<String>, EngineError> {
        Ok(self
            .inner
            .store
            .state(conversation, UNFIT)
            .await
            .map_err(|error| {
                store_error("reading the stand-ins that could not be rewritten", error)
            })?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default())
    }

    async fn remember_unfit(
        &self,
        conversation: ConversationId,
        summary_id: &str,
    ) -> Result<(), EngineError> {
        let mut unfit = self.unfit_stand_ins(conversation).await?;
        unfit.push(summary_id.to_owned());
        let over = unfit.len().saturating_sub(UNFIT_KEPT);
        unfit.drain(..over);
        let text = serde_json::to_string(&unfit).map_err(|error| {
            EngineError::caused_by(
                "lossless: writing the stand-ins that could not be rewritten",
                error,
            )
        })?;
        self.inner
            .store
            .set_state(conversation, UNFIT, &text)
            .await
            .map_err(|error| {
                store_error("remembering a stand-in that could not be rewritten", error)
            })
    }
}
