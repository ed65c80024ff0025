//! Compaction: passes that fold the oldest raw messages into leaf summaries and runs of
//! same-depth summaries into condensed ones until the context fits. The host's calls that
//! compact are in [`crate::maintain`]; the rewriting of what a stand-in wrote, in
//! [`crate::stand_ins`].

use std::time::{Duration, Instant};

use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{
    Degraded, SourceItem, SummarizeError, SummaryKind, SummaryLevel, SummaryRequest,
};
use vilvona_store::*;
use vilvona_summarize::{source_item, truncate};

use crate::budget::Limits;
use crate::cache::Rendition;
use crate::render::{SummaryHeader, summary_tokens};
use crate::units::{
    Candidate, condense_candidate, fresh_tail_start, leaf_candidate, leaf_candidate_from,
    unit_start,
};

use crate::cache::lock_map;
use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::render::content_source;

/// What one compaction call asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactionRequest<'a> {
    /// The room the host gives the context, when `limits` are not given: trigger, goal and
    /// ceiling are the configured shares of it.
    pub budget: u64,
    /// The limits to work to (the whole prompt's, from what the host said and observed).
    pub limits: Option<Limits>,
    /// Compact even below the threshold (manual `/compact`, overflow recovery).
    pub force: bool,
    /// What the host asks for: `Budget` is room it needs now (overflow, preflight).
    pub target: Option<CompactionTarget>,
    /// The host's count of its whole prompt, when it gave one. A host that counted asks on its
    /// latest request: a context already at the goal was compacted since (a stale count). One
    /// that did not count gets the most room compaction can make.
    pub current_token_count: Option<u64>,
    /// The operator's instructions for the summaries (`/compact <instructions>`).
    pub custom_instructions: Option<&'a str>,
    /// Checked between passes: the caller gave up.
    pub abort: Option<&'a AbortSignal>,
    /// A routine pass that waits for the configured summarizer: what its fallback would write
    /// is not published (unless room must be made), and the pass stops.
    pub wait_for_summarizer: bool,
}

impl CompactionRequest<'_> {
    /// The routine check after a turn: compact if the context is above the threshold.
    pub fn routine(budget: u64) -> CompactionRequest<'static> {
        CompactionRequest {
            budget,
            ..CompactionRequest::default()
        }
    }

    /// The routine check against limits.
    pub fn within(limits: Limits) -> CompactionRequest<'static> {
        CompactionRequest {
            limits: Some(limits),
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
    /// The limits it worked to.
    pub limits: Option<Limits>,
    /// Passes made: rounds of summarizing (one summary, or several independent leaves made
    /// together).
    pub passes: u32,
    /// Summaries published.
    pub summaries_created: u32,
    /// Of those, truncation fallbacks (the summarizer failed at every level, or room had to be
    /// made by truncation).
    pub fallbacks: u32,
    /// Of those, written by the summarizer behind the one configured (a host's model that
    /// could not be reached: its extractive fallback).
    pub degraded: u32,
    /// Why the configured summarizer did not write them (the last reason).
    pub degraded_reason: Option<String>,
    /// The summaries published, in order (`sum_…`).
    pub published: Vec<String>,
    /// Why the call stopped.
    pub reason: Option<CompactReason>,
    /// What the reason means here, when it needs saying.
    pub detail: Option<String>,
}

impl CompactionReport {
    /// Counts a published summary.
    fn count(&mut self, summary: &StoredSummary, degraded: Option<Degraded>) {
        self.summaries_created += 1;
        self.published.push(summary.summary_id.clone());
        self.fallbacks += u32::from(summary.level == SummaryLevel::Fallback);
        if let Some(degraded) = degraded {
            self.degraded += 1;
            self.degraded_reason = Some(degraded.reason);
        }
    }
}

/// Most leaf summaries made at once when a backlog needs several.
const PARALLEL_LEAVES: usize = 4;

/// The id a summary's header is measured with before it has one (ids are content-addressed and
/// always this long).
const PLACEHOLDER_ID: &str = "sum_0000000000000000";

/// The fewest tokens of text a summary is asked for.
pub(crate) const MIN_SUMMARY_TEXT_TOKENS: u64 = 32;

/// A summary's text is at most this share of the context's planned room (its share, or a
/// quarter of its ceiling when the host plans very tight): at a small window, summaries stay
/// small enough that several fit beside the fresh tail.
const SUMMARY_SHARE: u64 = 8;

enum Published {
    Replaced {
        summary: StoredSummary,
        /// Written by the summarizer behind the one configured.
        degraded: Option<Degraded>,
    },
    Stale,
    NoProgress,
    /// Not published: the configured summarizer could not write it, and the caller waits for
    /// it (why it could not).
    Waiting(String),
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

impl Run {
    /// The header of a summary of this run, before it has an id.
    fn header(&self, kind: SummaryKind, depth: u32) -> SummaryHeader<'static> {
        SummaryHeader {
            summary_id: PLACEHOLDER_ID,
            depth,
            kind,
            earliest_ms: self.span.earliest_ms,
            latest_ms: self.span.latest_ms,
            first_seq: self.span.first_seq,
            last_seq: self.span.last_seq,
        }
    }
}

impl LosslessEngine {
    /// Incremental compaction: above the trigger (or when forced), summarize the oldest units
    /// outside the fresh tail and condense same-depth runs down to the goal, bounded by passes
    /// and a deadline. Every pass must shrink the context. When the host asked for room (a
    /// forced call) or the context is above its ceiling and the passes cannot get it under, the
    /// tail but its newest unit is summarized, then everything before the newest unit is folded
    /// by deterministic truncation, which needs no summarizer: the call returns a context
    /// within the ceiling whenever the newest unit leaves room for one summary.
    pub async fn compact_conversation(
        &self,
        conversation: ConversationId,
        request: CompactionRequest<'_>,
    ) -> Result<CompactionReport, EngineError> {
        let CompactionRequest {
            budget,
            limits,
            force,
            target,
            current_token_count,
            custom_instructions,
            abort,
            wait_for_summarizer,
        } = request;
        let lock = self.compaction_lock(conversation);
        let _guard = lock.lock().await;
        let config = &self.inner.config;
        let limits = limits.unwrap_or_else(|| Limits::of_budget(budget, config));
        let deadline = Instant::now() + Duration::from_millis(config.deadline_ms);
        let mut report = CompactionReport {
            limits: Some(limits),
            ..CompactionReport::default()
        };
        // The running total is one row read: the common below-threshold turn costs no more.
        let running_total = self
            .inner
            .store
            .conversation_by_id(conversation)
            .await
            .map_err(|error| store_error("reading the conversation", error))?
            .map_or(0, |row| row.context_tokens);
        report.tokens_before = running_total;
        report.tokens_after = running_total;
        if !force && running_total <= limits.trigger {
            report.reason = Some(CompactReason::BelowThreshold);
            return Ok(report);
        }
        let room_now = force && target == Some(CompactionTarget::Budget);
        // The host asks for room it already has: its count predates the last compaction.
        if room_now && current_token_count.is_some() && running_total <= limits.goal {
            report.reason = Some(CompactReason::AlreadyCompacted);
            return Ok(report);
        }
        // Passes plan over references (tokens, kinds, depths, the unit rule): only the runs
        // chosen for summarizing are read with their bodies.
        let mut items = self.context_refs(conversation).await?;
        let mut total: u64 = items.iter().map(|item| item.tokens).sum();
        report.tokens_before = total;
        // Whether this call must make room whatever it takes: the host needs it now (overflow,
        // preflight), or the context no longer fits what the host gives it.
        let must_fit = room_now || total > limits.ceiling;
        if wait_for_summarizer && !self.inner.summarizer.in_reach() {
            // A fold after a turn, in a call that cannot reach the summarizer (OpenClaw brings
            // its model to `maintain`, which it calls right after a turn's commit, not to the
            // commit): that call folds, even what must fit (nothing reads the context between
            // the two; an assembly before it would fit the context itself).
            report.reason = Some(CompactReason::SummarizerUnavailable);
            report.detail = Some(format!(
                "{} cannot be asked in this call; the fold waits for one that can",
                self.inner.summarizer.id()
            ));
            return Ok(report);
        }
        let min_run = self.min_summarized_run();
        let mut attempts = 0;
        loop {
            if abort.is_some_and(AbortSignal::is_aborted) {
                return Err(EngineError::Cancelled);
            }
            // A manual /compact, or a host that needs room without saying how much, gets at
            // least one pass; every other call stops at the goal.
            let forced_first_pass =
                force && report.passes == 0 && (!room_now || current_token_count.is_none());
            if total <= limits.goal && !forced_first_pass {
                break;
            }
            if attempts >= config.max_passes_per_turn as usize
                || (report.passes > 0 && Instant::now() >= deadline)
            {
                if attempts < config.max_passes_per_turn as usize {
                    report.reason = Some(CompactReason::Deadline);
                }
                break;
            }
            let tail_start = fresh_tail_start(&items, config, limits.share);
            let summary_prefix: u64 = items[..tail_start]
                .iter()
                .filter(|item| matches!(item.item, ItemRef::Summary(_)))
                .map(|item| item.tokens)
                .sum();
            let needed = total.saturating_sub(limits.goal).max(1);
            let mut leaf = leaf_candidate(
                &items,
                tail_start,
                config.leaf_chunk_tokens,
                needed,
                min_run,
            );
            let mut condense =
                condense_candidate(&items, tail_start, config, config.condensed_min_fanout);
            if leaf.is_none() && condense.is_none() && (force || must_fit) {
                // Forced (manual /compact, overflow): fold any two same-depth summaries rather
                // than report that nothing can be done; when room must be made, the fresh tail
                // but its newest unit too.
                condense = condense_candidate(&items, tail_start, config, 2);
                if condense.is_none() && must_fit && !items.is_empty() {
                    let newest_unit = unit_start(&items, items.len() - 1);
                    leaf = leaf_candidate(
                        &items,
                        newest_unit,
                        config.leaf_chunk_tokens,
                        needed,
                        min_run,
                    );
                }
            }
            let candidate = match (leaf, condense) {
                (Some(_), Some(condense)) if summary_prefix > limits.share / 4 => condense,
                (Some(leaf), _) => leaf,
                (None, Some(condense)) => condense,
                (None, None) => {
                    if report.summaries_created == 0 {
                        report.reason = Some(CompactReason::NoCandidate);
                    }
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
                        min_run,
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
            let mut waiting = None;
            let ranges: Vec<std::ops::Range<usize>> = batch
                .iter()
                .map(|candidate| candidate.range.clone())
                .collect();
            let mut replaced = Vec::with_capacity(ranges.len());
            for (range, published) in ranges.into_iter().zip(
                self.summarize_batch(
                    conversation,
                    &items,
                    batch,
                    limits,
                    custom_instructions,
                    wait_for_summarizer && !must_fit,
                )
                .await?,
            ) {
                match published {
                    Published::Replaced { summary, degraded } => {
                        report.count(&summary, degraded);
                        replaced.push((range, summary));
                    }
                    Published::Stale => stale = true,
                    Published::NoProgress => stalled = true,
                    Published::Waiting(reason) => waiting = Some(reason),
                }
            }
            items = self
                .context_after(conversation, &items, &replaced, stale || stalled)
                .await?;
            let new_total: u64 = items.iter().map(|item| item.tokens).sum();
            let progressed = new_total < total;
            total = new_total;
            if let Some(reason) = waiting {
                if report.summaries_created == 0 {
                    report.reason = Some(CompactReason::SummarizerUnavailable);
                    report.detail = Some(reason);
                }
                break;
            }
            if stalled || !progressed {
                if report.summaries_created == 0 {
                    report.reason = Some(CompactReason::NoProgress);
                }
                break;
            }
        }
        if must_fit && total > limits.ceiling {
            // What passes could not do, truncation does: everything before the newest unit
            // becomes one summary that fits beside it (no summarizer; nothing is lost from the
            // store, and expansion still reaches every message).
            let (folded, after) = self
                .truncate_to_fit(conversation, items, limits.ceiling, &mut report)
                .await?;
            items = after;
            total = items.iter().map(|item| item.tokens).sum();
            if !folded && total > limits.ceiling {
                report.reason = Some(CompactReason::NoProgress);
                report.detail = Some(format!(
                    "the newest unit alone ({} tokens) leaves no room for a summary within {} tokens",
                    newest_unit_tokens(&items),
                    limits.ceiling
                ));
            }
        }
        report.tokens_after = total;
        let progressed = report.summaries_created > 0 && total < report.tokens_before;
        if !progressed && room_now && total <= limits.ceiling {
            // The host asked for room the context already leaves it: nothing was left that
            // compaction could take, and what there is fits.
            report.reason = Some(CompactReason::AlreadyCompacted);
        } else if report.reason.is_none() {
            report.reason = Some(if progressed {
                CompactReason::Compacted
            } else {
                CompactReason::BelowThreshold
            });
        }
        Ok(report)
    }

    /// The smallest run worth a summary: one whose summary, header and all, can be a third of
    /// it. A shorter run ("ok", a one-line answer) would come back larger than it went in.
    fn min_summarized_run(&self) -> u64 {
        let header = SummaryHeader {
            summary_id: PLACEHOLDER_ID,
            depth: 0,
            kind: SummaryKind::Leaf,
            earliest_ms: Some(0),
            latest_ms: Some(0),
            first_seq: 0,
            last_seq: 0,
        };
        (summary_tokens(&*self.inner.estimator, &header, "") + MIN_SUMMARY_TEXT_TOKENS) * 3
    }

    /// Folds everything before the newest unit into summaries by deterministic truncation until
    /// the context fits `ceiling`: each run of raw messages into a leaf, then every summary into
    /// one node above the deepest. Published like any summary (compare-and-swap). Answers
    /// whether anything was folded, and the context after.
    async fn truncate_to_fit(
        &self,
        conversation: ConversationId,
        mut items: Vec<ContextRef>,
        ceiling: u64,
        report: &mut CompactionReport,
    ) -> Result<(bool, Vec<ContextRef>), EngineError> {
        let mut folded = false;
        // Each round folds one run; a context of n items needs at most n rounds (and a stale
        // publish starts the round over from what the store holds).
        for _ in 0..items.len().saturating_mul(2).max(4) {
            let total: u64 = items.iter().map(|item| item.tokens).sum();
            if total <= ceiling || items.is_empty() {
                break;
            }
            let newest = unit_start(&items, items.len() - 1);
            let newest_tokens: u64 = items[newest..].iter().map(|item| item.tokens).sum();
            let Some(room) = ceiling.checked_sub(newest_tokens) else {
                break;
            };
            // The oldest run of raw messages before the newest unit, else all the summaries.
            let raw = items[..newest]
                .iter()
                .position(|item| item.summary.is_none());
            let candidate = match raw {
                Some(first) => {
                    let end = items[first..newest]
                        .iter()
                        .position(|item| item.summary.is_some())
                        .map_or(newest, |offset| first + offset);
                    Candidate {
                        tokens: items[first..end].iter().map(|item| item.tokens).sum(),
                        range: first..end,
                        condensing_depth: None,
                    }
                }
                None if newest >= 2 || (newest == 1 && items[0].tokens > room) => Candidate {
                    tokens: items[..newest].iter().map(|item| item.tokens).sum(),
                    range: 0..newest,
                    condensing_depth: items[..newest]
                        .iter()
                        .filter_map(|item| item.summary.map(|shape| shape.depth))
                        .max(),
                },
                None => break,
            };
            // Everything before the newest unit shares the room; this run gets its part.
            let others: u64 = items[..newest]
                .iter()
                .enumerate()
                .filter(|(index, _)| !candidate.range.contains(index))
                .map(|(_, item)| item.tokens)
                .sum();
            let fits = room.saturating_sub(others);
            let mut plan = self
                .truncated_plan(conversation, &items, &candidate, fits)
                .await?;
            if plan.is_none() && candidate.condensing_depth.is_none() && others > 0 {
                // No leaf fits beside the summaries already there (a short tool call after two
                // summaries): this run's leaf takes the whole room for now, and a later round
                // folds every summary into one.
                plan = self
                    .truncated_plan(conversation, &items, &candidate, room)
                    .await?;
            }
            let range = candidate.range.clone();
            match self.publish(plan).await? {
                Published::Replaced { summary, degraded } => {
                    report.count(&summary, degraded);
                    folded = true;
                    items = self
                        .context_after(conversation, &items, &[(range, summary)], false)
                        .await?;
                }
                Published::Stale => items = self.context_refs(conversation).await?,
                Published::NoProgress | Published::Waiting(_) => break,
            }
        }
        Ok((folded, items))
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
        limits: Limits,
        custom_instructions: Option<&str>,
    ) -> Result<Option<(ReplacePlan, Option<Degraded>)>, EngineError> {
        let config = &self.inner.config;
        if candidate.condensing_depth.is_some() {
            // What a stand-in wrote is rewritten before a parent is written from it.
            let run: Vec<ItemRef> = items[candidate.range.clone()]
                .iter()
                .map(|item| item.item)
                .collect();
            self.rewrite_stand_ins_among(
                conversation,
                &run,
                crate::stand_ins::STAND_INS_PER_MAINTENANCE,
            )
            .await?;
        }
        let (run, previous_context) = self.read_run(items, candidate).await?;
        let (kind, depth, target) = match candidate.condensing_depth {
            None => (SummaryKind::Leaf, 0, config.leaf_target_tokens),
            Some(depth) => (
                SummaryKind::Condensed,
                depth + 1,
                config.condensed_target_tokens,
            ),
        };
        // A summary keeps at most a third of its source (every pass shrinks the context), and
        // a small share of the context's room.
        let target = target
            .min(candidate.tokens / 3)
            .min(limits.share.max(limits.ceiling / 4) / SUMMARY_SHARE)
            .max(MIN_SUMMARY_TEXT_TOKENS);
        let header = run.header(kind, depth);
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
                        produced = Some(summary);
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
        let summary = match produced {
            Some(produced) => produced,
            None => {
                request.level = SummaryLevel::Fallback;
                request.target_tokens = target.min(config.fallback_max_tokens);
                truncate(&request, &*self.inner.estimator)
            }
        };
        let tokens = summary_tokens(&*self.inner.estimator, &header, &summary.text);
        if tokens >= candidate.tokens {
            return Ok(None);
        }
        let summarizer = match &summary.degraded {
            Some(degraded) => stand_in_summarizer(&degraded.written_by, self.inner.summarizer.id()),
            // The summarizer wrote nothing usable: the truncation stood in.
            None if summary.level == SummaryLevel::Fallback => {
                stand_in_summarizer(vilvona_summarize::TRUNCATION_ID, self.inner.summarizer.id())
            }
            None => self.inner.summarizer.id().to_owned(),
        };
        let plan = ReplacePlan {
            conversation,
            items: run.items,
            summary: NewSummary {
                kind,
                depth,
                content: summary.text,
                tokens,
                level: summary.level,
                summarizer,
            },
        };
        Ok(Some((plan, summary.degraded)))
    }

    /// A summary of `candidate` by deterministic truncation, at most `fits` tokens with its
    /// wrapper; `None` when not even that fits.
    async fn truncated_plan(
        &self,
        conversation: ConversationId,
        items: &[ContextRef],
        candidate: &Candidate,
        fits: u64,
    ) -> Result<Option<(ReplacePlan, Option<Degraded>)>, EngineError> {
        let (run, _) = self.read_run(items, candidate).await?;
        let (kind, depth) = match candidate.condensing_depth {
            None => (SummaryKind::Leaf, 0),
            Some(depth) => (SummaryKind::Condensed, depth + 1),
        };
        let header = run.header(kind, depth);
        let estimator = &*self.inner.estimator;
        let bare = summary_tokens(estimator, &header, "");
        let Some(room) = fits.checked_sub(bare).filter(|room| *room >= 8) else {
            return Ok(None);
        };
        let mut request = SummaryRequest::new(
            kind,
            depth,
            room.min(self.inner.config.fallback_max_tokens),
            run.sources,
        );
        request.level = SummaryLevel::Fallback;
        let summary = truncate(&request, estimator);
        let tokens = summary_tokens(estimator, &header, &summary.text);
        if tokens > fits {
            return Ok(None);
        }
        let plan = ReplacePlan {
            conversation,
            items: run.items,
            summary: NewSummary {
                kind,
                depth,
                content: summary.text,
                tokens,
                level: SummaryLevel::Fallback,
                summarizer: vilvona_summarize::TRUNCATION_ID.to_owned(),
            },
        };
        Ok(Some((plan, None)))
    }

    /// Publishes a summary with the store's compare-and-swap.
    async fn publish(
        &self,
        plan: Option<(ReplacePlan, Option<Degraded>)>,
    ) -> Result<Published, EngineError> {
        let Some((plan, degraded)) = plan else {
            return Ok(Published::NoProgress);
        };
        if written_by_a_stand_in(plan.summary.level, &plan.summary.summarizer) {
            // Counted by the soak: none while the configured summarizer answers.
            tracing::warn!(
                summarizer = %plan.summary.summarizer,
                reason = degraded.as_ref().map_or(
                    "no summarizer wrote a usable summary, or none could fit the room",
                    |degraded| degraded.reason.as_str()
                ),
                "published a summary a stand-in wrote; maintenance rewrites it with {}",
                self.inner.summarizer.id()
            );
        }
        let replaced: Vec<ItemRef> = plan.items.iter().map(|(_, item)| *item).collect();
        match self.inner.store.replace(plan).await {
            Ok(ReplaceOutcome::Replaced(summary)) => {
                // What left the context need not be kept rendered.
                lock_map(&self.inner.rendered).forget(replaced);
                Ok(Published::Replaced { summary, degraded })
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
        limits: Limits,
        custom_instructions: Option<&str>,
        wait_for_summarizer: bool,
    ) -> Result<Vec<Published>, EngineError> {
        if let [candidate] = &batch[..] {
            let plan = self
                .summarize_candidate(conversation, items, candidate, limits, custom_instructions)
                .await?;
            return Ok(vec![self.publish_or_wait(plan, wait_for_summarizer).await?]);
        }
        // At once, on this call's own task: what the call carries in task-local state (the
        // host's model in scope, which `serve` names per call) is the leaves' too. Spawned
        // tasks lost it, and every leaf made together fell back ("no host model in scope").
        let plans = all_at_once(
            batch
                .iter()
                .map(|candidate| {
                    self.summarize_candidate(
                        conversation,
                        items,
                        candidate,
                        limits,
                        custom_instructions,
                    )
                })
                .collect(),
        )
        .await;
        let mut published = Vec::with_capacity(plans.len());
        for plan in plans {
            published.push(self.publish_or_wait(plan?, wait_for_summarizer).await?);
        }
        Ok(published)
    }

    /// Publishes a summary, unless the configured summarizer did not write it and the caller
    /// would rather wait for it (a routine pass after a turn: the host's model may be in scope
    /// at its next call, as OpenClaw offers it to `maintain` but not to `commitTurn`).
    async fn publish_or_wait(
        &self,
        plan: Option<(ReplacePlan, Option<Degraded>)>,
        wait_for_summarizer: bool,
    ) -> Result<Published, EngineError> {
        match plan {
            Some((_, Some(degraded))) if wait_for_summarizer => {
                Ok(Published::Waiting(degraded.reason))
            }
            plan => self.publish(plan).await,
        }
    }
}

/// The tokens of the newest unit of a context (what every compaction keeps).
fn newest_unit_tokens(items: &[ContextRef]) -> u64 {
    match items.len() {
        0 => 0,
        len => items[unit_start(items, len - 1)..]
            .iter()
            .map(|item| item.tokens)
            .sum(),
    }
}

/// Runs futures at once on the calling task and answers their outputs in their order: they
/// wait on the model together, and keep the caller's task-local state (which spawned tasks
/// would not).
async fn all_at_once<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut running: Vec<Option<std::pin::Pin<Box<F>>>> = futures
        .into_iter()
        .map(|future| Some(Box::pin(future)))
        .collect();
    let mut outputs: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, output) in running.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
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
