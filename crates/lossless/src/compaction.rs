//! Compaction: passes that fold the oldest raw messages into leaf summaries and runs of
//! same-depth summaries into condensed ones until the context fits, and the re-summarizing of
//! fallback (truncated) summaries in `maintain`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{
    SourceItem, SummarizeError, SummaryKind, SummaryLevel, SummaryRequest,
};
use vilvona_store::*;
use vilvona_summarize::{source_item, truncate};

use crate::assembly::Rendition;
use crate::render::{SummaryHeader, summary_tokens};
use crate::units::{
    Candidate, condense_candidate, fresh_tail_start, leaf_candidate, leaf_candidate_from,
    unit_start,
};

use crate::engine::{LosslessEngine, content_source, lock_map, store_error};

/// What one compaction call asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactionRequest<'a> {
    /// The prompt budget the context must fit.
    pub budget: u64,
    /// Compact even below the threshold (manual `/compact`, overflow recovery).
    pub force: bool,
    /// How far down a forced compaction goes (the default: the configured target ratio).
    pub target: Option<CompactionTarget>,
    /// The operator's instructions for the summaries (`/compact <instructions>`).
    pub custom_instructions: Option<&'a str>,
    /// Checked between passes: the caller gave up.
    pub abort: Option<&'a AbortSignal>,
}

impl CompactionRequest<'_> {
    /// The routine check after a turn: compact if the context is above the threshold.
    pub fn routine(budget: u64) -> CompactionRequest<'static> {
        CompactionRequest {
            budget,
            ..CompactionRequest::default()
        }
    }

    /// Compact now, whatever the threshold says.
    pub fn forced(budget: u64) -> CompactionRequest<'static> {
        CompactionRequest {
            budget,
            force: true,
            ..CompactionRequest::default()
        }
    }
}

/// Why a compaction call stopped, with what it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// Context tokens before the call.
    pub tokens_before: u64,
    /// Context tokens after it.
    pub tokens_after: u64,
    /// Passes made: rounds of summarizing (one summary, or several independent leaves made
    /// together).
    pub passes: u32,
    /// Summaries published.
    pub summaries_created: u32,
    /// Of those, truncation fallbacks (the summarizer failed at every level).
    pub fallbacks: u32,
    /// Why the call stopped.
    pub reason: Option<CompactReason>,
}

/// Most leaf summaries made at once when a backlog needs several.
const PARALLEL_LEAVES: usize = 4;

enum Published {
    Replaced {
        fallback: bool,
        summary: StoredSummary,
    },
    Stale,
    NoProgress,
}

/// The context after summaries took the place of runs, as the store writes it (a summary at
/// the position of the first item it replaced, costing its tokens): what the next pass plans
/// from, without reading the references again. `replaced` is in the order of the runs.
fn with_replacements(
    items: &[ContextRef],
    replaced: &[(std::ops::Range<usize>, StoredSummary)],
) -> Vec<ContextRef> {
    let mut next = Vec::with_capacity(items.len());
    let mut from = 0;
    for (range, summary) in replaced {
        debug_assert!(from <= range.start, "runs in order, apart");
        next.extend_from_slice(&items[from..range.start]);
        next.push(ContextRef {
            position: items[range.start].position,
            item: ItemRef::Summary(summary.row_id),
            tokens: summary.tokens,
            continues_unit: false,
            summary: Some(SummaryShape {
                depth: summary.depth,
                level: summary.level,
                first_seq: summary.first_seq,
                last_seq: summary.last_seq,
            }),
        });
        from = range.end;
    }
    next.extend_from_slice(&items[from..]);
    next
}

/// The time and seq range an item, or a run of items, covers: what a summary's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    earliest_ms: Option<i64>,
    latest_ms: Option<i64>,
    first_seq: u64,
    last_seq: u64,
}

impl Span {
    /// What nothing covers: joined with any span, that span.
    const EMPTY: Span = Span {
        earliest_ms: None,
        latest_ms: None,
        first_seq: u64::MAX,
        last_seq: 0,
    };

    /// One message, stored at `time`.
    fn message(time: i64, seq: u64) -> Span {
        Span {
            earliest_ms: Some(time),
            latest_ms: Some(time),
            first_seq: seq,
            last_seq: seq,
        }
    }

    /// What both cover (times that are unknown do not count).
    fn join(self, other: Span) -> Span {
        let bound = |a: Option<i64>, b: Option<i64>, pick: fn(i64, i64) -> i64| match (a, b) {
            (Some(a), Some(b)) => Some(pick(a, b)),
            (a, b) => a.or(b),
        };
        Span {
            earliest_ms: bound(self.earliest_ms, other.earliest_ms, i64::min),
            latest_ms: bound(self.latest_ms, other.latest_ms, i64::max),
            first_seq: self.first_seq.min(other.first_seq),
            last_seq: self.last_seq.max(other.last_seq),
        }
    }
}

/// An item of a run to summarize: what the summarizer reads of it, and what the summary's
/// header says it covers.
struct RunItem {
    position: i64,
    item: ItemRef,
    source: SourceItem,
    span: Span,
}

impl RunItem {
    fn read(entry: &ContextRef, content: &ItemContent) -> RunItem {
        let span = match content {
            ItemContent::Message(message) => Span::message(message.created_at_ms, message.seq),
            ItemContent::Summary(summary) => Span {
                earliest_ms: summary.earliest_at_ms,
                latest_ms: summary.latest_at_ms,
                first_seq: summary.first_seq,
                last_seq: summary.last_seq,
            },
        };
        RunItem {
            position: entry.position,
            item: entry.item,
            source: content_source(content),
            span,
        }
    }

    /// A message this instance keeps rendered, when the rendering tells all a stored row would:
    /// its seq is known, and its timestamp is what the store took as its time.
    fn rendered(position: i64, id: MessageId, message: &AgentMessage, seq: u64) -> Option<RunItem> {
        let time = message.timestamp_ms()?;
        Some(RunItem {
            position,
            item: ItemRef::Message(id),
            source: source_item(message),
            span: Span::message(time, seq),
        })
    }
}

/// A run read for summarizing: what the summarizer reads, the context items the summary
/// replaces, and what its header says it covers.
struct Run {
    sources: Vec<SourceItem>,
    items: Vec<(i64, ItemRef)>,
    span: Span,
}

impl LosslessEngine {
    /// Incremental compaction: above `threshold × budget` (or when forced), summarize the oldest
    /// units outside the fresh tail and condense same-depth runs, just enough to get under
    /// `target`, bounded by passes and a deadline. Every pass must shrink the context.
    pub async fn compact_conversation(
        &self,
        conversation: ConversationId,
        request: CompactionRequest<'_>,
    ) -> Result<CompactionReport, EngineError> {
        let CompactionRequest {
            budget,
            force,
            target,
            custom_instructions,
            abort,
        } = request;
        let lock = self.compaction_lock(conversation);
        let _guard = lock.lock().await;
        let config = &self.inner.config;
        let threshold = (budget as f64 * config.context_threshold) as u64;
        let goal = match target {
            Some(CompactionTarget::Budget) => budget,
            _ => (budget as f64 * config.target_ratio) as u64,
        };
        let deadline = Instant::now() + Duration::from_millis(config.deadline_ms);
        let mut report = CompactionReport::default();
        // The running total is one row read: the common below-threshold turn costs no more.
        let running_total = self
            .inner
            .store
            .conversation_by_id(conversation)
            .await
            .map_err(|error| store_error("reading the conversation", error))?
            .map_or(0, |row| row.context_tokens);
        let trigger = match target {
            Some(CompactionTarget::Budget) => threshold.max(budget),
            _ => threshold,
        };
        if !force && running_total <= trigger {
            report.tokens_before = running_total;
            report.tokens_after = running_total;
            report.reason = Some(CompactReason::BelowThreshold);
            return Ok(report);
        }
        // Passes plan over references (tokens, kinds, depths, the unit rule): only the runs
        // chosen for summarizing are read with their bodies.
        let mut items = self.context_refs(conversation).await?;
        let mut total: u64 = items.iter().map(|item| item.tokens).sum();
        report.tokens_before = total;
        let mut attempts = 0;
        loop {
            if abort.is_some_and(AbortSignal::is_aborted) {
                return Err(EngineError::Cancelled);
            }
            let forced_first_pass = force && report.passes == 0;
            if total <= goal && !forced_first_pass {
                report.reason = Some(if report.summaries_created > 0 {
                    CompactReason::Compacted
                } else {
                    CompactReason::BelowThreshold
                });
                break;
            }
            if attempts >= config.max_passes_per_turn as usize {
                report.reason = Some(if report.summaries_created > 0 {
                    CompactReason::Compacted
                } else {
                    CompactReason::NoProgress
                });
                break;
            }
            if report.passes > 0 && Instant::now() >= deadline {
                report.reason = Some(CompactReason::Deadline);
                break;
            }
            let tail_start = fresh_tail_start(&items, config, goal.max(1));
            let summary_prefix: u64 = items[..tail_start]
                .iter()
                .filter(|item| matches!(item.item, ItemRef::Summary(_)))
                .map(|item| item.tokens)
                .sum();
            let needed = total.saturating_sub(goal).max(1);
            let leaf = leaf_candidate(&items, tail_start, config.leaf_chunk_tokens, needed);
            let mut condense =
                condense_candidate(&items, tail_start, config, config.condensed_min_fanout);
            let mut leaf = leaf;
            if leaf.is_none() && condense.is_none() && force {
                // Forced (manual /compact, overflow recovery): fold any two same-depth summaries
                // rather than report that nothing can be done. Overflow recovery (the budget
                // target) may then summarize the fresh tail too, all but its newest unit: a
                // provider that refused the prompt is better served by a summary than by a
                // protected tail.
                condense = condense_candidate(&items, tail_start, config, 2);
                if condense.is_none()
                    && target == Some(CompactionTarget::Budget)
                    && !items.is_empty()
                {
                    let newest_unit = unit_start(&items, items.len() - 1);
                    leaf = leaf_candidate(&items, newest_unit, config.leaf_chunk_tokens, needed);
                }
            }
            let candidate = match (leaf, condense) {
                (Some(_), Some(condense)) if summary_prefix > budget / 4 => condense,
                (Some(leaf), _) => leaf,
                (None, Some(condense)) => condense,
                (None, None) => {
                    report.reason = Some(if report.summaries_created > 0 {
                        CompactReason::Compacted
                    } else {
                        CompactReason::NoCandidate
                    });
                    break;
                }
            };
            // A backlog of raw messages (a long import, a small budget): once a first pass has
            // not been enough (and has checked the deadline), the next leaves are summarized
            // together; they are independent of each other.
            let mut batch = vec![candidate];
            if report.passes > 0 && batch[0].condensing_depth.is_none() {
                let mut freed = batch[0].tokens.saturating_mul(2) / 3;
                while batch.len() < PARALLEL_LEAVES
                    && attempts + batch.len() < config.max_passes_per_turn as usize
                    && freed < needed
                {
                    let from = batch[batch.len() - 1].range.end;
                    let Some(next) = leaf_candidate_from(
                        &items,
                        from,
                        tail_start,
                        config.leaf_chunk_tokens,
                        needed - freed,
                    ) else {
                        break;
                    };
                    freed += next.tokens.saturating_mul(2) / 3;
                    batch.push(next);
                }
            }
            // A pass is one round: one summary, or several independent leaves made together.
            // The summaries attempted are what the per-call bound counts.
            report.passes += 1;
            attempts += batch.len();
            let mut stalled = false;
            let mut stale = false;
            let ranges: Vec<std::ops::Range<usize>> = batch
                .iter()
                .map(|candidate| candidate.range.clone())
                .collect();
            let mut replaced = Vec::with_capacity(ranges.len());
            for (range, published) in ranges.into_iter().zip(
                self.summarize_batch(conversation, &items, batch, custom_instructions)
                    .await?,
            ) {
                match published {
                    Published::Replaced { fallback, summary } => {
                        report.summaries_created += 1;
                        report.fallbacks += u32::from(fallback);
                        replaced.push((range, summary));
                    }
                    Published::Stale => stale = true,
                    Published::NoProgress => stalled = true,
                }
            }
            if stalled {
                report.reason = Some(if report.summaries_created > 0 {
                    CompactReason::Compacted
                } else {
                    CompactReason::NoProgress
                });
                items = self.context_refs(conversation).await?;
                total = items.iter().map(|item| item.tokens).sum();
                break;
            }
            items = self
                .context_after(conversation, &items, &replaced, stale)
                .await?;
            let new_total: u64 = items.iter().map(|item| item.tokens).sum();
            if new_total >= total && report.summaries_created == 0 {
                report.reason = Some(CompactReason::NoProgress);
                total = new_total;
                break;
            }
            total = new_total;
        }
        report.tokens_after = total;
        Ok(report)
    }

    /// The context after a pass: derived from what the pass read and published when the
    /// store's running total agrees with it (one row read instead of the whole context), else
    /// read again (another writer appended or replaced meanwhile, or a publish was stale).
    async fn context_after(
        &self,
        conversation: ConversationId,
        items: &[ContextRef],
        replaced: &[(std::ops::Range<usize>, StoredSummary)],
        stale: bool,
    ) -> Result<Vec<ContextRef>, EngineError> {
        if !stale {
            let derived = with_replacements(items, replaced);
            let derived_total: u64 = derived.iter().map(|item| item.tokens).sum();
            let stored_total = self
                .inner
                .store
                .conversation_by_id(conversation)
                .await
                .map_err(|error| store_error("reading the conversation", error))?
                .map(|row| row.context_tokens);
            if stored_total == Some(derived_total) {
                return Ok(derived);
            }
        }
        self.context_refs(conversation).await
    }

    pub(crate) async fn context_refs(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<ContextRef>, EngineError> {
        self.inner
            .store
            .context_refs(conversation)
            .await
            .map_err(|error| store_error("reading the context", error))
    }

    /// A candidate's run, and the text of the summary before it (the previous context a
    /// summarizer continues from). A message this instance keeps rendered (a turn ingested or
    /// assembled here) is neither read nor parsed again; the rest is read in one call.
    async fn read_run(
        &self,
        items: &[ContextRef],
        candidate: &Candidate,
    ) -> Result<(Run, Option<String>), EngineError> {
        let planned = &items[candidate.range.clone()];
        let previous = items[..candidate.range.start]
            .iter()
            .rev()
            .find(|item| matches!(item.item, ItemRef::Summary(_)));
        let mut known: Vec<Option<RunItem>> = {
            let mut cache = lock_map(&self.inner.rendered);
            planned
                .iter()
                .map(|entry| {
                    let ItemRef::Message(id) = entry.item else {
                        return None;
                    };
                    let (message, seq) = cache.get_with_seq(&Rendition::message(id))?;
                    RunItem::rendered(entry.position, id, &message, seq?)
                })
                .collect()
        };
        let wanted: Vec<ItemRef> = previous
            .into_iter()
            .chain(
                planned
                    .iter()
                    .zip(&known)
                    .filter(|(_, known)| known.is_none())
                    .map(|(entry, _)| entry),
            )
            .map(|entry| entry.item)
            .collect();
        let mut contents = if wanted.is_empty() {
            Vec::new().into_iter()
        } else {
            self.inner
                .store
                .items(wanted)
                .await
                .map_err(|error| store_error("reading the items to summarize", error))?
                .into_iter()
        };
        let previous_context = match previous.and_then(|_| contents.next()) {
            Some(ItemContent::Summary(summary)) => Some(summary.content),
            _ => None,
        };
        let run = planned
            .iter()
            .zip(known.iter_mut())
            .map(|(entry, known)| match known.take() {
                Some(item) => Ok(item),
                None => contents
                    .next()
                    .map(|content| RunItem::read(entry, &content))
                    .ok_or_else(|| EngineError::failed("lossless compaction: an item vanished")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let span = run
            .iter()
            .fold(Span::EMPTY, |span, item| span.join(item.span));
        let (items, sources) = run
            .into_iter()
            .map(|item| ((item.position, item.item), item.source))
            .unzip();
        let run = Run {
            sources,
            items,
            span,
        };
        Ok((run, previous_context))
    }

    /// Summarizes a candidate (outside any transaction): the replacement to publish, or `None`
    /// when no summary would shrink it.
    async fn summarize_candidate(
        &self,
        conversation: ConversationId,
        items: &[ContextRef],
        candidate: &Candidate,
        custom_instructions: Option<&str>,
    ) -> Result<Option<ReplacePlan>, EngineError> {
        let config = &self.inner.config;
        let (run, previous_context) = self.read_run(items, candidate).await?;
        let (kind, depth, target) = match candidate.condensing_depth {
            None => (SummaryKind::Leaf, 0, config.leaf_target_tokens),
            Some(depth) => (
                SummaryKind::Condensed,
                depth + 1,
                config.condensed_target_tokens,
            ),
        };
        // A summary keeps at most a third of its source: every pass shrinks the context.
        let target = target.min(candidate.tokens / 3).max(16);
        let header_span = run.span;
        let mut request = SummaryRequest {
            previous_context,
            custom_instructions: custom_instructions.map(str::to_owned),
            ..SummaryRequest::new(kind, depth, target, run.sources)
        };
        let mut produced = None;
        for level in [SummaryLevel::Normal, SummaryLevel::Aggressive] {
            request.level = level;
            match self.inner.summarizer.summarize(&request).await {
                Ok(summary) if !summary.text.trim().is_empty() => {
                    let tokens = self.inner.estimator.text_tokens(&summary.text);
                    if tokens < candidate.tokens && tokens <= target.saturating_mul(3) {
                        produced = Some((summary.text, summary.level));
                        break;
                    }
                    tracing::debug!(
                        tokens,
                        target,
                        ?level,
                        "summary did not shrink its source; escalating"
                    );
                }
                Ok(_) => tracing::debug!(?level, "empty summary; escalating"),
                Err(SummarizeError::Cancelled) => return Err(EngineError::Cancelled),
                Err(error) => tracing::warn!(%error, ?level, "summarizer failed; escalating"),
            }
        }
        let (content, level) = match produced {
            Some(produced) => produced,
            None => {
                request.level = SummaryLevel::Fallback;
                request.target_tokens = target.min(config.fallback_max_tokens);
                let fallback = truncate(&request, &*self.inner.estimator);
                (fallback.text, SummaryLevel::Fallback)
            }
        };
        // Ids are content-addressed and always this long; the placeholder counts the same.
        let header = SummaryHeader {
            summary_id: "sum_0000000000000000",
            depth,
            kind,
            earliest_ms: header_span.earliest_ms,
            latest_ms: header_span.latest_ms,
            first_seq: header_span.first_seq,
            last_seq: header_span.last_seq,
        };
        let tokens = summary_tokens(&*self.inner.estimator, &header, &content);
        if tokens >= candidate.tokens {
            return Ok(None);
        }
        Ok(Some(ReplacePlan {
            conversation,
            items: run.items,
            summary: NewSummary {
                kind,
                depth,
                content,
                tokens,
                level,
                summarizer: self.inner.summarizer.id().to_owned(),
            },
        }))
    }

    /// Publishes a summary with the store's compare-and-swap.
    async fn publish(&self, plan: Option<ReplacePlan>) -> Result<Published, EngineError> {
        let Some(plan) = plan else {
            return Ok(Published::NoProgress);
        };
        let fallback = plan.summary.level == SummaryLevel::Fallback;
        let replaced: Vec<ItemRef> = plan.items.iter().map(|(_, item)| *item).collect();
        match self.inner.store.replace(plan).await {
            Ok(ReplaceOutcome::Replaced(summary)) => {
                // What left the context need not be kept rendered.
                lock_map(&self.inner.rendered).forget(replaced);
                Ok(Published::Replaced { fallback, summary })
            }
            Ok(ReplaceOutcome::Stale) => Ok(Published::Stale),
            Err(error) => Err(store_error("publishing a summary", error)),
        }
    }

    /// Summarizes a batch of independent candidates at once (each its own task, so the calls
    /// of a model summarizer are in flight together and an extractive one runs on every
    /// core), then publishes them in order.
    async fn summarize_batch(
        &self,
        conversation: ConversationId,
        items: &[ContextRef],
        batch: Vec<Candidate>,
        custom_instructions: Option<&str>,
    ) -> Result<Vec<Published>, EngineError> {
        if let [candidate] = &batch[..] {
            let plan = self
                .summarize_candidate(conversation, items, candidate, custom_instructions)
                .await?;
            return Ok(vec![self.publish(plan).await?]);
        }
        let items: Arc<[ContextRef]> = items.into();
        let mut tasks = tokio::task::JoinSet::new();
        for (index, candidate) in batch.into_iter().enumerate() {
            let (engine, items) = (self.clone(), items.clone());
            let instructions = custom_instructions.map(str::to_owned);
            tasks.spawn(async move {
                let plan = engine
                    .summarize_candidate(conversation, &items, &candidate, instructions.as_deref())
                    .await;
                (index, plan)
            });
        }
        let mut plans = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (index, plan) = joined.map_err(|error| {
                EngineError::caused_by("lossless: a summarizing task failed", error)
            })?;
            plans.push((index, plan?));
        }
        plans.sort_by_key(|(index, _)| *index);
        let mut published = Vec::with_capacity(plans.len());
        for (_, plan) in plans {
            published.push(self.publish(plan).await?);
        }
        Ok(published)
    }

    /// Re-summarizes context summaries that the fallback produced, keeping their edges.
    async fn resummarize_fallbacks(
        &self,
        conversation: ConversationId,
    ) -> Result<u64, EngineError> {
        // Only the fallback summaries are read (an indexed query), not the whole context.
        let fallbacks = self
            .inner
            .store
            .fallback_summaries(conversation)
            .await
            .map_err(|error| store_error("reading fallback summaries", error))?;
        let mut rewritten = 0;
        for summary in &fallbacks {
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
            .min(source_tokens / 3)
            .max(16);
            let request = SummaryRequest::new(summary.kind, summary.depth, target, source);
            let Ok(produced) = self.inner.summarizer.summarize(&request).await else {
                // Still unavailable: try again at the next maintenance.
                return Ok(rewritten);
            };
            let tokens = summary_tokens(&*self.inner.estimator, &summary.into(), &produced.text);
            if produced.text.trim().is_empty() || tokens >= source_tokens {
                continue;
            }
            let updated = self
                .inner
                .store
                .update_summary(SummaryUpdate {
                    row_id: summary.row_id,
                    expected_level: SummaryLevel::Fallback,
                    content: produced.text,
                    tokens,
                    level: produced.level,
                    summarizer: self.inner.summarizer.id().to_owned(),
                })
                .await
                .map_err(|error| store_error("re-summarizing", error))?;
            rewritten += u64::from(updated);
        }
        Ok(rewritten)
    }

    pub(crate) async fn compact_for(
        &self,
        params: &CompactParams,
    ) -> Result<CompactResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let budget = self
            .budget(conversation.id, carried_budget(params.token_budget, None))
            .await?;
        let report = self
            .compact_conversation(
                conversation.id,
                CompactionRequest {
                    budget,
                    force: params.force,
                    target: params.compaction_target,
                    custom_instructions: params.custom_instructions.as_deref(),
                    abort: params.abort.as_ref(),
                },
            )
            .await?;
        let details = CompactDetails {
            tokens_before: report.tokens_before,
            tokens_after: Some(report.tokens_after),
            details: Some(json!({
                "passes": report.passes,
                "summariesCreated": report.summaries_created,
                "fallbackSummaries": report.fallbacks,
                "stopReason": report.reason.as_ref().map(ToString::to_string),
            })),
            ..CompactDetails::default()
        };
        let compacted = report.summaries_created > 0 && report.tokens_after < report.tokens_before;
        let reason = match report.reason {
            Some(reason) => reason,
            None if compacted => CompactReason::Compacted,
            None => CompactReason::NoCandidate,
        };
        Ok(CompactResult {
            ok: true,
            compacted,
            reason: Some(reason),
            result: Some(details),
        })
    }

    /// Re-summarizes fallback summaries, then compacts if the context is above the threshold
    /// of the budget the host last gave (it may have shrunk since the last turn).
    pub(crate) async fn maintain_session(
        &self,
        params: &MaintainParams,
    ) -> Result<MaintainResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let rewritten = self.resummarize_fallbacks(conversation.id).await?;
        self.maybe_run_retention(&self.inner.config.retention).await;
        let budget = self.budget(conversation.id, params.budget()).await?;
        let report = self
            .compact_conversation(conversation.id, CompactionRequest::routine(budget))
            .await?;
        let compacted = report.summaries_created > 0;
        let mut reasons = Vec::new();
        if rewritten > 0 {
            reasons.push(format!("re-summarized {rewritten} fallback summaries"));
        }
        if compacted {
            reasons.push(format!(
                "compacted {} → {} tokens",
                report.tokens_before, report.tokens_after
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(position: i64, id: i64, tokens: u64, continues_unit: bool) -> ContextRef {
        ContextRef {
            position,
            item: ItemRef::Message(MessageId(id)),
            tokens,
            continues_unit,
            summary: None,
        }
    }

    fn summary(row_id: i64, depth: u32, tokens: u64) -> StoredSummary {
        StoredSummary {
            row_id: SummaryRowId(row_id),
            summary_id: format!("sum_{row_id:016x}"),
            conversation: ConversationId(1),
            depth,
            kind: SummaryKind::Leaf,
            content: String::new(),
            tokens,
            earliest_at_ms: None,
            latest_at_ms: None,
            first_seq: 0,
            last_seq: 0,
            level: SummaryLevel::Normal,
            summarizer: "test".to_owned(),
            created_at_ms: 0,
        }
    }

    #[test]
    fn replacements_take_the_first_position_of_their_runs() {
        let items: Vec<ContextRef> = (0..8)
            .map(|i| message(i * 1024, i, 100, i % 2 == 1))
            .collect();
        let next = with_replacements(
            &items,
            &[(1..3, summary(7, 0, 30)), (5..8, summary(9, 0, 40))],
        );
        let shape: Vec<(i64, ItemRef, u64, bool)> = next
            .iter()
            .map(|item| (item.position, item.item, item.tokens, item.continues_unit))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, ItemRef::Message(MessageId(0)), 100, false),
                (1024, ItemRef::Summary(SummaryRowId(7)), 30, false),
                (3072, ItemRef::Message(MessageId(3)), 100, true),
                (4096, ItemRef::Message(MessageId(4)), 100, false),
                (5120, ItemRef::Summary(SummaryRowId(9)), 40, false),
            ]
        );
        assert_eq!(
            next[1].summary,
            Some(SummaryShape {
                depth: 0,
                level: SummaryLevel::Normal,
                first_seq: 0,
                last_seq: 0,
            })
        );
        assert_eq!(with_replacements(&items, &[]).len(), items.len());
    }
}
