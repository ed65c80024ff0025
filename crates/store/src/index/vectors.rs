//! The documents nearest a query vector, within a scope, by brute force over the index's
//! vectors (a bytes fast field: each document's chunk vectors, see `vilvona_embed::Vectors`).
//!
//! A segment's vectors are read once into memory (segments never change) and kept while the
//! segment is searched; comparing a 128-dimension query with every document in scope is a few
//! hundred nanoseconds per document, so a conversation of 5,000 messages takes about a
//! millisecond. Past a few hundred thousand documents in scope an approximate nearest
//! neighbour index (HNSW) would pay; nothing here needs one yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tantivy::index::SegmentId;
use tantivy::{Score, Searcher};
use vilvona_embed::{QueryVector, Vectors};

use super::top::{Scope, Top};

/// One segment's vectors, by the ordinal the segment's column gives each distinct value.
pub(super) struct SegmentVectors {
    by_ord: Vec<Box<[u8]>>,
}

/// Segments' vectors read so far, dropped when their segment is no longer searched.
#[derive(Default)]
pub(super) struct VectorCache(Mutex<HashMap<SegmentId, Arc<SegmentVectors>>>);

impl VectorCache {
    fn segment(
        &self,
        segment: &tantivy::SegmentReader,
        field: &str,
    ) -> tantivy::Result<Option<Arc<SegmentVectors>>> {
        let id = segment.segment_id();
        if let Some(held) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
        {
            return Ok(Some(held.clone()));
        }
        let Some(column) = segment.fast_fields().bytes(field)? else {
            return Ok(None);
        };
        let mut by_ord = Vec::with_capacity(column.num_terms());
        let mut values = column.dictionary().stream()?;
        while values.advance() {
            by_ord.push(values.key().into());
        }
        let read = Arc::new(SegmentVectors { by_ord });
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, read.clone());
        Ok(Some(read))
    }

    /// Forgets segments the searcher no longer has (merged away or deleted).
    fn keep_only(&self, searcher: &Searcher) {
        let live: std::collections::HashSet<SegmentId> = searcher
            .segment_readers()
            .iter()
            .map(tantivy::SegmentReader::segment_id)
            .collect();
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|id, _| live.contains(id));
    }
}

/// The `limit` documents in `scope` whose best chunk is nearest `query` (normalised), as
/// `(cosine similarity, key)`, best first; equal scores: the newest row first.
pub(super) fn nearest(
    searcher: &Searcher,
    cache: &VectorCache,
    field: &str,
    query: &[f32],
    scope: &Scope,
    limit: usize,
) -> tantivy::Result<Vec<(Score, u64)>> {
    cache.keep_only(searcher);
    let query = QueryVector::new(query);
    let mut top = Top::new(limit);
    for segment in searcher.segment_readers() {
        let Some(vectors) = cache.segment(segment, field)? else {
            continue;
        };
        let Some(column) = segment.fast_fields().bytes(field)? else {
            continue;
        };
        let fast = segment.fast_fields();
        let (keys, conversations) = (fast.u64("key")?, fast.u64("conversation")?);
        let (kinds, times) = (fast.u64("kind")?, fast.i64("time")?);
        let alive = segment.alive_bitset();
        for doc in 0..segment.max_doc() {
            if !alive.is_none_or(|alive| alive.is_alive(doc))
                || !scope.holds(doc, &conversations, &kinds, &times)
            {
                continue;
            }
            let Some(ord) = column.ords().first(doc) else {
                continue;
            };
            let Some(bytes) = vectors.by_ord.get(ord as usize) else {
                continue;
            };
            if let (Some(similarity), Some(key)) =
                (Vectors::best_similarity(bytes, &query), keys.first(doc))
            {
                top.offer(similarity, key);
            }
        }
    }
    Ok(top.into_best())
}
