//! A session's compactions read from its summary DAG, newest first: what each fold folded
//! against what it wrote, by which summarizer, whether a fallback or the truncation wrote it,
//! and how much of the next prompt a provider's prompt cache could still serve after it.
//! `vilvona context timeline` prints it; the panel's "Compactions" draws the same JSON.
//!
//! The store keeps no record of which folds one compaction call made, nor of past prompts:
//! each summary is one fold, and the cache figure is an estimate from the DAG's shape (see
//! [`Fold::cache_kept`]).

use std::collections::HashMap;

use serde::Serialize;
use vilvona_core::admin::{DagSummary, DagView};

/// One fold: a summary and what it replaced in the context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Fold {
    /// When it was published, in milliseconds since the epoch.
    pub(crate) at: i64,
    /// The summary it wrote (`sum_…`).
    pub(crate) id: String,
    pub(crate) depth: u32,
    /// Messages it folded.
    pub(crate) messages: u64,
    /// Summaries it folded.
    pub(crate) folded_summaries: usize,
    /// Tokens of what it folded.
    pub(crate) before: u64,
    /// Tokens of what it wrote.
    pub(crate) after: u64,
    pub(crate) summarizer: String,
    /// A fallback wrote it in place of the configured summarizer.
    pub(crate) fallback: bool,
    /// The truncation wrote it, no summarizer (level `fallback`).
    pub(crate) truncated: bool,
    /// Tokens a model summarizer read for it (the extractive one and the truncation read
    /// nothing).
    pub(crate) model_tokens: u64,
    /// Tokens of the summaries ahead of it in the context when it was written. A provider's
    /// prompt cache keeps a prompt's prefix up to the first item that changed: the next
    /// request after this fold could be served from the cache for the system prompt, the
    /// tools and these summaries, and reads everything from the fold on anew. Ahead means
    /// written earlier, not yet folded themselves, and older than what this fold folded (a
    /// compaction folds the oldest first).
    pub(crate) cache_kept: u64,
}

/// The session's folds, newest first, with their totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Timeline {
    /// Every fold of the session.
    pub(crate) folds: usize,
    /// Tokens model summarizers read, over every fold.
    pub(crate) model_tokens: u64,
    /// Folds a fallback wrote in place of the configured summarizer.
    pub(crate) fallbacks: usize,
    /// Folds the truncation wrote.
    pub(crate) truncations: usize,
    /// The mean of `cacheKept` over every fold (0 without folds).
    pub(crate) mean_cache_kept: u64,
    /// The newest folds (all of them, or as many as asked for).
    pub(crate) rows: Vec<Fold>,
}

/// The timeline of `view`'s folds; `limit` bounds the rows, not the totals.
pub(crate) fn timeline(view: &DagView, limit: Option<usize>) -> Timeline {
    let summaries = &view.summaries;
    let tokens: HashMap<i64, u64> = summaries.iter().map(|s| (s.row_id, s.tokens)).collect();
    let kept = caches_kept(summaries);
    let mut folds: Vec<Fold> = summaries
        .iter()
        .map(|summary| {
            let before = summary.child_message_tokens
                + summary
                    .child_summaries
                    .iter()
                    .map(|row| tokens.get(row).copied().unwrap_or(0))
                    .sum::<u64>();
            let truncated = summary.level == "fallback";
            Fold {
                at: summary.created_at_ms,
                id: summary.summary_id.clone(),
                depth: summary.depth,
                messages: summary.child_messages,
                folded_summaries: summary.child_summaries.len(),
                before,
                after: summary.tokens,
                summarizer: summary.summarizer.clone(),
                fallback: summary.summarizer.contains(" in place of "),
                truncated,
                model_tokens: if truncated || summary.summarizer.starts_with("extractive") {
                    0
                } else {
                    before
                },
                cache_kept: kept.get(&summary.row_id).copied().unwrap_or(0),
            }
        })
        .collect();
    folds.sort_by(|a, b| b.at.cmp(&a.at).then(b.depth.cmp(&a.depth)));
    let count = folds.len();
    let mean_cache_kept = match count {
        0 => 0,
        n => folds.iter().map(|f| f.cache_kept).sum::<u64>() / n as u64,
    };
    Timeline {
        folds: count,
        model_tokens: folds.iter().map(|f| f.model_tokens).sum(),
        fallbacks: folds.iter().filter(|f| f.fallback).count(),
        truncations: folds.iter().filter(|f| f.truncated).count(),
        mean_cache_kept,
        rows: folds
            .into_iter()
            .take(limit.unwrap_or(usize::MAX))
            .collect(),
    }
}

/// [`Fold::cache_kept`] of every fold, by row: one pass over the summaries in the order they
/// were written (row ids grow), the tokens of those the context holds at each step kept as
/// running sums by that order, so a long session costs n log n, not n².
fn caches_kept(summaries: &[DagSummary]) -> HashMap<i64, u64> {
    let mut written: Vec<&DagSummary> = summaries.iter().collect();
    written.sort_by_key(|summary| summary.row_id);
    let place: HashMap<i64, usize> = written
        .iter()
        .enumerate()
        .map(|(at, summary)| (summary.row_id, at))
        .collect();
    let mut held = PrefixSums(vec![0; written.len() + 1]);
    let mut in_context = vec![false; written.len()];
    let mut kept = HashMap::with_capacity(written.len());
    for (at, fold) in written.iter().enumerate() {
        let children: Vec<usize> = fold
            .child_summaries
            .iter()
            .filter_map(|row| place.get(row).copied())
            .collect();
        // What it folded starts at its oldest child summary; a fold of messages only comes
        // after every summary the context held.
        let first = children.iter().copied().min().unwrap_or(at);
        kept.insert(fold.row_id, held.before(first));
        for child in children {
            if std::mem::take(&mut in_context[child]) {
                held.add(child, -(written[child].tokens as i64));
            }
        }
        held.add(at, fold.tokens as i64);
        in_context[at] = true;
    }
    kept
}

/// Sums of values by place, changed and read in log n (a Fenwick tree).
struct PrefixSums(Vec<i64>);

impl PrefixSums {
    fn add(&mut self, place: usize, delta: i64) {
        let mut at = place + 1;
        while at < self.0.len() {
            self.0[at] += delta;
            at += at & at.wrapping_neg();
        }
    }

    /// The sum of the values before `place`.
    fn before(&self, place: usize) -> u64 {
        let (mut at, mut sum) = (place, 0);
        while at > 0 {
            sum += self.0[at];
            at -= at & at.wrapping_neg();
        }
        sum.max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary of row `row` at depth `depth`, `tokens` long, folding `children` (summaries)
    /// or `messages` (their tokens: ten a message).
    fn summary(row: i64, depth: u32, tokens: u64, children: &[i64], messages: u64) -> DagSummary {
        DagSummary {
            row_id: row,
            summary_id: format!("sum_{row}"),
            depth,
            kind: if depth == 0 { "leaf" } else { "condensed" }.to_owned(),
            tokens,
            in_context: false,
            child_summaries: children.to_vec(),
            child_messages: messages,
            child_message_tokens: messages * 10,
            level: "normal".to_owned(),
            summarizer: "host-llm/v1".to_owned(),
            created_at_ms: row * 1000,
            earliest_at_ms: None,
            latest_at_ms: None,
        }
    }

    /// Three leaves, a condensed summary over the first two, then a fourth leaf: each fold's
    /// prefix is the summaries the context held ahead of it at the time.
    #[test]
    fn each_fold_keeps_the_cache_for_the_summaries_ahead_of_it() {
        let view = DagView {
            summaries: vec![
                summary(1, 0, 100, &[], 20),
                summary(2, 0, 200, &[], 20),
                summary(3, 0, 300, &[], 20),
                summary(4, 1, 50, &[1, 2], 0),
                summary(5, 0, 400, &[], 20),
            ],
            ..DagView::default()
        };
        let timeline = timeline(&view, None);
        let kept: Vec<(&str, u64, u64, u64)> = timeline
            .rows
            .iter()
            .map(|f| (f.id.as_str(), f.before, f.after, f.cache_kept))
            .collect();
        assert_eq!(
            kept,
            [
                // After the condensation: its 50 and the third leaf's 300.
                ("sum_5", 200, 400, 350),
                // Folds the first two; nothing is ahead of them.
                ("sum_4", 300, 50, 0),
                ("sum_3", 200, 300, 300),
                ("sum_2", 200, 200, 100),
                ("sum_1", 200, 100, 0),
            ]
        );
        assert_eq!(timeline.folds, 5);
        assert_eq!(timeline.mean_cache_kept, 750 / 5);
        assert_eq!(timeline.model_tokens, 200 * 4 + 300);
    }

    /// A limit bounds the rows, never the totals; fallbacks and truncations are counted and
    /// read nothing of a model.
    #[test]
    fn a_limit_bounds_the_rows_not_the_totals() {
        let mut truncated = summary(2, 0, 20, &[], 20);
        truncated.level = "fallback".to_owned();
        truncated.summarizer = "truncate/v1".to_owned();
        let mut stood_in = summary(3, 0, 30, &[], 20);
        stood_in.summarizer = "extractive/v1 in place of host-llm/v1".to_owned();
        let view = DagView {
            summaries: vec![summary(1, 0, 10, &[], 20), truncated, stood_in],
            ..DagView::default()
        };
        let timeline = timeline(&view, Some(1));
        assert_eq!(timeline.rows.len(), 1);
        assert_eq!(timeline.rows[0].id, "sum_3");
        assert!(timeline.rows[0].fallback && !timeline.rows[0].truncated);
        assert_eq!(
            (
                timeline.folds,
                timeline.fallbacks,
                timeline.truncations,
                timeline.model_tokens
            ),
            (3, 1, 1, 200)
        );
    }

    /// The one pass agrees with the definition read plainly (every summary looked at for every
    /// fold) on a DAG grown as compaction grows one: leaves, and the oldest run of a depth
    /// condensed when four of it are held.
    #[test]
    fn the_one_pass_agrees_with_the_definition() {
        let mut summaries: Vec<DagSummary> = Vec::new();
        let mut held: Vec<(i64, u32)> = Vec::new();
        for row in 1..400_i64 {
            let depth_full =
                (0..6).find(|depth| held.iter().filter(|(_, d)| d == depth).count() >= 4);
            let next = match depth_full {
                Some(depth) => {
                    let run: Vec<i64> = held
                        .iter()
                        .filter(|(_, d)| *d == depth)
                        .take(4)
                        .map(|(r, _)| *r)
                        .collect();
                    held.retain(|(r, _)| !run.contains(r));
                    summary(row, depth + 1, (row * 37 % 200) as u64 + 10, &run, 0)
                }
                None => summary(row, 0, (row * 53 % 300) as u64 + 10, &[], 5),
            };
            held.push((row, next.depth));
            held.sort_by_key(|(r, d)| (std::cmp::Reverse(*d), *r));
            summaries.push(next);
        }
        let plainly = |fold: &DagSummary| -> u64 {
            let first = fold
                .child_summaries
                .iter()
                .copied()
                .min()
                .unwrap_or(fold.row_id);
            let folded_at = |row: i64| {
                summaries
                    .iter()
                    .filter(|s| s.child_summaries.contains(&row))
                    .map(|s| s.row_id)
                    .min()
            };
            summaries
                .iter()
                .filter(|s| {
                    s.row_id < first && folded_at(s.row_id).is_none_or(|by| by > fold.row_id)
                })
                .map(|s| s.tokens)
                .sum()
        };
        let kept = caches_kept(&summaries);
        for fold in &summaries {
            assert_eq!(kept[&fold.row_id], plainly(fold), "{}", fold.summary_id);
        }
        assert!(kept.values().any(|kept| *kept > 0));
    }

    #[test]
    fn no_folds_no_timeline() {
        let timeline = timeline(&DagView::default(), Some(40));
        assert_eq!((timeline.folds, timeline.mean_cache_kept), (0, 0));
        assert!(timeline.rows.is_empty());
    }
}
