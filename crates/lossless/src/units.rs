//! Context items grouped into units, the fresh tail, and compaction candidates.
//!
//! A unit is what must never be split: an assistant message with its tool results, or any other
//! single item. Every boundary the engine draws (chunks, the fresh tail, clamping) is a unit
//! boundary.

use vilvona_store::{ContextRef, ItemRef, Unit};

use crate::config::LosslessConfig;

/// Whether a context item is a message (planning reads references only, never bodies).
fn is_message(item: &ContextRef) -> bool {
    matches!(item.item, ItemRef::Message(_))
}

/// Index of the first item of the unit containing `index`.
pub(crate) fn unit_start(items: &[impl Unit], mut index: usize) -> usize {
    while index > 0 && index < items.len() && items[index].continues_unit() {
        index -= 1;
    }
    index
}

/// The end (exclusive) of the unit starting at `start`.
pub(crate) fn unit_end(items: &[impl Unit], start: usize) -> usize {
    let mut end = start + 1;
    while end < items.len() && items[end].continues_unit() {
        end += 1;
    }
    end
}

/// Where the protected fresh tail starts: the newest `fresh_tail_count` messages, at most
/// `fresh_tail_max_tokens` and `fresh_tail_ratio` of the context's planned room (`share`; at least
/// the newest unit), widened to a unit boundary. Summaries do not count toward it. The token cap
/// keeps routine compaction supplied: once the context is over its trigger, there is always
/// something older than the tail to summarize.
pub(crate) fn fresh_tail_start(items: &[ContextRef], config: &LosslessConfig, share: u64) -> usize {
    let by_ratio = (share as f64 * config.fresh_tail_ratio()) as u64;
    let cap = config
        .fresh_tail_max_tokens
        .map_or(by_ratio, |cap| cap.min(by_ratio));
    let mut start = items.len();
    let mut messages = 0;
    let mut tokens = 0;
    while start > 0 {
        let unit = unit_start(items, start - 1);
        if !items[unit..start].iter().all(is_message) {
            break;
        }
        let unit_tokens: u64 = items[unit..start].iter().map(|item| item.tokens).sum();
        let newest = start == items.len();
        if !newest && (messages >= config.fresh_tail_count || tokens + unit_tokens > cap) {
            break;
        }
        messages += start - unit;
        tokens += unit_tokens;
        start = unit;
    }
    start
}

/// A planned run of items to summarize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) range: std::ops::Range<usize>,
    pub(crate) tokens: u64,
    /// `None` for a leaf over messages; `Some(d)` for condensing depth-`d` summaries.
    pub(crate) condensing_depth: Option<u32>,
}

/// The oldest run of raw messages before `tail_start`, unit-aligned, no larger than the chunk
/// limit, and only as large as needed to free `needed` tokens — but at least `min_run` tokens
/// (a shorter run's summary would not be smaller than it), else none.
pub(crate) fn leaf_candidate(
    items: &[ContextRef],
    tail_start: usize,
    chunk_limit: u64,
    needed: u64,
    min_run: u64,
) -> Option<Candidate> {
    leaf_candidate_from(items, 0, tail_start, chunk_limit, needed, min_run)
}

/// [`leaf_candidate`] among the items from `from` on: the next leaf of a backlog after one
/// already chosen.
pub(crate) fn leaf_candidate_from(
    items: &[ContextRef],
    from: usize,
    tail_start: usize,
    chunk_limit: u64,
    needed: u64,
    min_run: u64,
) -> Option<Candidate> {
    let first = from + items.get(from..tail_start)?.iter().position(is_message)?;
    let first = unit_start(items, first).max(from);
    let mut end = first;
    let mut tokens = 0;
    while end < tail_start {
        if !is_message(&items[end]) {
            break;
        }
        let next = unit_end(items, end).min(tail_start);
        let unit_tokens: u64 = items[end..next].iter().map(|item| item.tokens).sum();
        if end > first && tokens + unit_tokens > chunk_limit {
            break;
        }
        tokens += unit_tokens;
        end = next;
        // Enough to reach the target (a summary keeps about a third), and worth a summary.
        if tokens.saturating_mul(2) / 3 >= needed && tokens >= min_run {
            break;
        }
    }
    (end > first && tokens >= min_run).then_some(Candidate {
        range: first..end,
        tokens,
        condensing_depth: None,
    })
}

/// The oldest run of at least `fanout` same-depth summaries before `tail_start` that are not
/// fallback output (immature nodes are never rolled up), within the chunk limit.
pub(crate) fn condense_candidate(
    items: &[ContextRef],
    tail_start: usize,
    config: &LosslessConfig,
    fanout: usize,
) -> Option<Candidate> {
    let mut index = 0;
    while index < tail_start {
        let Some(first) = items[index].summary else {
            index += 1;
            continue;
        };
        let depth = first.depth;
        let mut end = index;
        let mut tokens = 0;
        while end < tail_start {
            match items[end].summary {
                Some(summary)
                    if summary.depth == depth
                        && summary.level != vilvona_core::summarize::SummaryLevel::Fallback =>
                {
                    if end - index >= fanout
                        && tokens + items[end].tokens > config.leaf_chunk_tokens
                    {
                        break;
                    }
                    tokens += items[end].tokens;
                    end += 1;
                }
                _ => break,
            }
        }
        let allowed = config.max_depth.is_none_or(|max| depth < max);
        if end - index >= fanout && allowed {
            return Some(Candidate {
                range: index..end,
                tokens,
                condensing_depth: Some(depth),
            });
        }
        index = end.max(index + 1);
    }
    None
}
