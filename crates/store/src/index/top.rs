//! The best documents of a scored query within a scope, found while the query prunes.
//!
//! tantivy skips documents that cannot make the cut (block-max WAND over a union of words)
//! only when the words are the whole query; a scope joined to them as a required clause has
//! every matching document scored. When the scope holds most of the index, scoring the words
//! alone and checking the scope on fast fields for the few documents that could still make
//! the cut is far cheaper; when the scope is a small part of the index, intersecting with its
//! postings is (`RecallIndex::search` chooses).

use tantivy::query::{EnableScoring, Query};
use tantivy::{Score, Searcher};

use super::facts::{FactCache, Scope};

/// The best `limit` documents of `query` in `scope` as `(score, key)`, best first; equal
/// scores are ordered by key, the highest (newest row) first, so which rows make the cut does
/// not depend on how documents are laid out in segments.
pub(super) fn best(
    searcher: &Searcher,
    facts: &FactCache,
    query: &dyn Query,
    scope: &Scope,
    limit: usize,
) -> tantivy::Result<Vec<(Score, u64)>> {
    let weight = query.weight(EnableScoring::enabled_from_searcher(searcher))?;
    let mut top = Top::new(limit);
    let columns = facts.of_segments(searcher)?;
    for (segment, columns) in searcher.segment_readers().iter().zip(columns) {
        let alive = segment.alive_bitset();
        weight.for_each_pruning(top.threshold(), segment, &mut |doc, score| {
            if alive.is_none_or(|alive| alive.is_alive(doc))
                && let Some(key) = columns.in_scope(doc, scope)
            {
                top.offer(score, key);
            }
            top.threshold()
        })?;
    }
    Ok(top.into_best())
}

/// The best `(score, key)` pairs seen so far, best first.
pub(super) struct Top {
    limit: usize,
    best: Vec<(Score, u64)>,
}

impl Top {
    pub(super) fn new(limit: usize) -> Top {
        Top {
            limit,
            best: Vec::with_capacity(limit + 1),
        }
    }

    pub(super) fn offer(&mut self, score: Score, key: u64) {
        let better = |a: &(Score, u64), b: &(Score, u64)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        let candidate = (score, key);
        if self.best.len() == self.limit
            && self
                .best
                .last()
                .is_none_or(|worst| better(&candidate, worst).is_le())
        {
            return;
        }
        let at = self
            .best
            .partition_point(|held| better(held, &candidate).is_gt());
        self.best.insert(at, candidate);
        self.best.truncate(self.limit);
    }

    pub(super) fn into_best(self) -> Vec<(Score, u64)> {
        self.best
    }

    /// Scores the query need not offer any more. The scorer offers only scores above it, and a
    /// score equal to the worst held one may still win on its key: just below that score.
    pub(super) fn threshold(&self) -> Score {
        match self.best.last() {
            Some(worst) if self.best.len() == self.limit => worst.0.next_down(),
            _ => Score::MIN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_keeps_the_best_and_breaks_ties_by_the_newest_key() {
        let mut top = Top::new(3);
        for (score, key) in [(1.0, 1), (3.0, 2), (2.0, 3), (2.0, 9), (0.5, 10), (3.0, 4)] {
            top.offer(score, key);
        }
        assert_eq!(top.best, [(3.0, 4), (3.0, 2), (2.0, 9)]);
        assert!(top.threshold() < 2.0 && top.threshold() > 1.99);
    }
}
