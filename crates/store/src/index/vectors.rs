//! The documents nearest a query vector, within a scope, by brute force over the index's
//! vectors (a bytes fast field: each document's chunk vectors, see `vilvona_embed::Vectors`).
//!
//! A segment's vectors are read once into memory, in document order (segments never change), with
//! each document's key and scope values, and kept while the segment is searched, as long as every
//! segment held fits under a bound (`VILVONA_VECTOR_CACHE_MIB`, 256 MiB by default); a segment past
//! it is compared as its values are read from the index file at each search. Comparing a
//! 192-dimension query with a chunk is about 16–35 ns on one core (four bits a dimension, whole
//! numbers in 16-bit lanes the compiler vectorises), and pieces of 1,024 documents are compared
//! across the cores, sharing the least score that can still count (`Floor`). The comparison is
//! exact: the similarities of this model's vectors lie close together (a typical query's 60th best
//! is 0.55, the median document 0.35), so bounds on the rest of a vector prune almost nothing, and
//! a cheaper first pass to pick whom to compare exactly (the first 32 or 64 dimensions, or one bit
//! a dimension) kept only 61–90 % of the best 60 even when it passed on 20 times as many
//! (`vilvona_benches::quantized`). The work grows with the scope. An inverted file over the chunks
//! was measured (`vilvona_benches::cells`): to keep 0.95 of this search's ten best it compares
//! about a quarter of the chunks, a constant factor, so nothing here has one; a graph index (HNSW)
//! over vectors kept on disk is what would answer in time that does not grow with the history
//! (`vilvona_benches::graph`; BENCHMARKS.md, section 4). A faster comparison would not: at 480,000
//! messages the vectors are about 178 MiB, which a 2-core machine's memory takes 6–8 ms to stream
//! once, and an AVX2 kernel measured against this one waited on its loads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tantivy::index::SegmentId;
use tantivy::{Score, Searcher};
use vilvona_embed::{QueryVector, Vectors};

use super::facts::Scope;
use super::facts::{FactCache, FactColumns, Facts};
use super::top::Top;

/// One segment's vectors, laid out in document order in one buffer (a search reads them
/// front to back), with the fast-field values a scope is checked by.
pub(super) struct SegmentVectors {
    bytes: Vec<u8>,
    /// Per document, where its vectors end in `bytes` (they start where the previous
    /// document's end).
    ends: Vec<u32>,
    /// Per document, its key and what a scope checks (read from the columns once: a search
    /// checks every document).
    facts: Vec<Facts>,
}

impl SegmentVectors {
    /// The bytes it holds (as reserved in the cache).
    fn size(&self) -> usize {
        self.bytes.len()
            + self.ends.len() * std::mem::size_of::<u32>()
            + self.facts.len() * std::mem::size_of::<Facts>()
    }

    fn of(&self, doc: tantivy::DocId) -> &[u8] {
        let doc = doc as usize;
        let start = if doc == 0 {
            0
        } else {
            self.ends[doc - 1] as usize
        };
        &self.bytes[start..self.ends[doc] as usize]
    }
}

/// Segments' vectors read so far, up to a bound on the bytes they hold, dropped when their
/// segment is no longer searched. A segment whose vectors do not fit under the bound is
/// compared as its values are read from the index file at each search (`compare_from_file`):
/// slower, but the process's own memory does not grow with the history past the bound.
pub(super) struct VectorCache {
    held: Mutex<Held>,
    /// The most bytes the held segments may take.
    limit: usize,
}

#[derive(Default)]
struct Held {
    segments: HashMap<SegmentId, Placed>,
    /// Bytes the held segments take (and those being read, reserved first).
    bytes: usize,
}

/// Where a segment's vectors are read from at a search.
#[derive(Clone)]
enum Placed {
    Memory(Arc<SegmentVectors>),
    /// They did not fit under the bound: read from the index file at each search.
    File,
}

/// The bound when `VILVONA_VECTOR_CACHE_MIB` does not set one: at T = 100,000 turns (480,000
/// messages) the vectors and their facts take about 195 MiB, so a history of several hundred
/// thousand messages is searched from memory (`workload --generate 100000`).
const DEFAULT_LIMIT_MIB: usize = 256;

impl VectorCache {
    /// A cache holding at most `limit` bytes of vectors and facts.
    pub(super) fn holding(limit: usize) -> VectorCache {
        VectorCache {
            held: Mutex::new(Held::default()),
            limit,
        }
    }

    /// A cache bounded by `VILVONA_VECTOR_CACHE_MIB` (256 MiB when unset or not a number).
    pub(super) fn configured() -> VectorCache {
        let mib = std::env::var("VILVONA_VECTOR_CACHE_MIB")
            .ok()
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_LIMIT_MIB);
        VectorCache::holding(mib.saturating_mul(1 << 20))
    }

    /// Bytes the held segments take.
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where `segment`'s vectors are read from; `None` when it has no vectors column.
    fn segment(
        &self,
        segment: &tantivy::SegmentReader,
        columns: &FactColumns,
        field: &str,
    ) -> tantivy::Result<Option<Placed>> {
        let id = segment.segment_id();
        if let Some(placed) = self.lock().segments.get(&id) {
            return Ok(Some(placed.clone()));
        }
        let Some(column) = segment.fast_fields().bytes(field)? else {
            return Ok(None);
        };
        let facts_bytes = segment.max_doc() as usize * std::mem::size_of::<Facts>();
        // The bytes are reserved before they are read, so that searches reading segments at
        // once do not pass the bound together.
        let mut reserved = 0;
        let fits = |vectors_bytes: usize| {
            let needed = vectors_bytes + facts_bytes;
            let mut held = self.lock();
            let fits = held.bytes + needed <= self.limit;
            if fits {
                held.bytes += needed;
                reserved = needed;
            }
            fits
        };
        let read = in_document_order(&column, segment.max_doc(), fits);
        let (bytes, ends) = match read {
            Ok(Some(read)) => read,
            Ok(None) => {
                let placed = self
                    .lock()
                    .segments
                    .entry(id)
                    .or_insert(Placed::File)
                    .clone();
                return Ok(Some(placed));
            }
            Err(error) => {
                self.lock().bytes -= reserved;
                return Err(error.into());
            }
        };
        let facts = (0..segment.max_doc()).map(|doc| columns.of(doc)).collect();
        let placed = Placed::Memory(Arc::new(SegmentVectors { bytes, ends, facts }));
        let mut held = self.lock();
        if let Some(Placed::Memory(_)) = held.segments.insert(id, placed.clone()) {
            // Another search read it at the same time: its reservation stands for both.
            held.bytes -= reserved;
        }
        Ok(Some(placed))
    }

    /// Forgets segments the searcher no longer has (merged away or deleted). When one that
    /// was held goes, the segments read from their files are tried again (they may fit).
    fn keep_only(&self, searcher: &Searcher) {
        let live = super::segment_ids(searcher);
        let mut held = self.lock();
        let mut freed = 0;
        held.segments.retain(|id, placed| {
            let keep = live.contains(id);
            if !keep && let Placed::Memory(vectors) = placed {
                freed += vectors.size();
            }
            keep
        });
        if freed > 0 {
            held.bytes -= freed;
            held.segments
                .retain(|_, placed| matches!(placed, Placed::Memory(_)));
        }
    }
}

/// A bytes column's values laid out in document order in one buffer of exactly their size, and
/// where each document's end is in it. The column numbers its distinct values in sorted order and
/// keeps them in that order (documents refer to them): the values are streamed twice, once for
/// their lengths and once to copy each where its documents are, so nothing but the buffer is as
/// large as the values (holding each value first as an allocation of its own left the process
/// 40–150 MiB more of its own memory after grep at T = 100,000). `None`, with nothing copied, when
/// `fits` refuses the bytes they would take (the values and their ends).
fn in_document_order(
    column: &tantivy::columnar::BytesColumn,
    max_doc: tantivy::DocId,
    fits: impl FnOnce(usize) -> bool,
) -> std::io::Result<Option<(Vec<u8>, Vec<u32>)>> {
    let too_large = || std::io::Error::other("a segment's vectors are over 4 GiB");
    let mut lengths = Vec::with_capacity(column.num_terms());
    let mut values = column.dictionary().stream()?;
    while values.advance() {
        lengths.push(u32::try_from(values.key().len()).map_err(|_| too_large())?);
    }
    let ords: Vec<Option<u32>> = (0..max_doc)
        .map(|doc| {
            let ord = column.ords().first(doc)?;
            u32::try_from(ord)
                .ok()
                .filter(|&ord| (ord as usize) < lengths.len())
        })
        .collect();
    let mut ends = Vec::with_capacity(ords.len());
    let mut end = 0_u32;
    for ord in &ords {
        end = end
            .checked_add(ord.map_or(0, |ord| lengths[ord as usize]))
            .ok_or_else(too_large)?;
        ends.push(end);
    }
    drop(lengths);
    if !fits(end as usize + ends.len() * std::mem::size_of::<u32>()) {
        return Ok(None);
    }
    let mut bytes = vec![0; end as usize];
    // The documents by their value's number, to be filled as the values stream past.
    let mut waiting: Vec<(u32, tantivy::DocId)> = ords
        .iter()
        .zip(0..)
        .filter_map(|(ord, doc)| Some(((*ord)?, doc)))
        .collect();
    drop(ords);
    waiting.sort_unstable();
    let mut waiting = waiting.into_iter().peekable();
    let mut values = column.dictionary().stream()?;
    let mut ord = 0_u32;
    while values.advance() {
        while let Some((_, doc)) = waiting.next_if(|&(wanted, _)| wanted == ord) {
            let doc = doc as usize;
            let start = if doc == 0 { 0 } else { ends[doc - 1] as usize };
            bytes[start..ends[doc] as usize].copy_from_slice(values.key());
        }
        ord += 1;
    }
    Ok(Some((bytes, ends)))
}

/// Documents compared in one piece of work (pieces run across the cores).
const DOCS_PER_PIECE: u32 = 1_024;

/// The `limit` documents in `scope` whose best chunk is nearest `query` (normalised), as
/// `(cosine similarity, key)`, best first; equal scores: the newest row first. The segments'
/// documents are compared in pieces across the machine's cores (rayon).
pub(super) fn nearest(
    searcher: &Searcher,
    cache: &VectorCache,
    facts: &FactCache,
    field: &str,
    query: &[f32],
    scope: &Scope,
    limit: usize,
) -> crate::error::Result<Vec<(Score, u64)>> {
    use rayon::prelude::*;

    cache.keep_only(searcher);
    let query = QueryVector::new(query);
    let floor = Floor::default();
    let mut pieces = Vec::new();
    let columns = facts.of_segments(searcher)?;
    for (segment, columns) in searcher.segment_readers().iter().zip(columns) {
        match cache.segment(segment, &columns, field)? {
            None => {}
            // One piece: its values are read once.
            Some(Placed::File) => {
                pieces.push((segment, Piece::FromFile(columns), 0..segment.max_doc()))
            }
            Some(Placed::Memory(vectors)) => {
                let mut start = 0;
                while start < segment.max_doc() {
                    let end = segment.max_doc().min(start + DOCS_PER_PIECE);
                    pieces.push((segment, Piece::Held(vectors.clone()), start..end));
                    start = end;
                }
            }
        }
    }
    let tops = pieces
        .into_par_iter()
        .map(|(segment, piece, docs)| {
            // Contained here too: a panic in a worker thread is quieted only inside.
            super::contained(|| match piece {
                Piece::Held(vectors) => Ok(compare(
                    segment, &vectors, docs, &query, scope, limit, &floor,
                )),
                Piece::FromFile(columns) => Ok(compare_from_file(
                    segment, &columns, field, &query, scope, limit, &floor,
                )?),
            })
        })
        .collect::<crate::error::Result<Vec<Top>>>()?;
    let mut best = Top::new(limit);
    for (similarity, key) in tops.into_iter().flat_map(Top::into_best) {
        best.offer(similarity, key);
    }
    Ok(best.into_best())
}

/// What a piece of work compares.
enum Piece {
    /// Vectors held in memory.
    Held(Arc<SegmentVectors>),
    /// A segment's values as they are read from its file, its documents' facts from these
    /// columns.
    FromFile(Arc<FactColumns>),
}

/// The highest threshold of the pieces' lists so far (an `f32`'s bits), shared by the pieces
/// compared at once. A document scoring at or under it is never among the best of all: some
/// piece already holds `limit` documents above it. Without it, every piece starts from an
/// empty list and offers it most of its first documents.
struct Floor(AtomicU32);

impl Default for Floor {
    fn default() -> Floor {
        Floor(AtomicU32::new(Score::MIN.to_bits()))
    }
}

impl Floor {
    fn get(&self) -> Score {
        Score::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn raise(&self, to: Score) {
        // Err: it was already as high.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                (to > Score::from_bits(bits)).then_some(to.to_bits())
            });
    }
}

/// The best `limit` of a segment's documents `docs` in `scope` (those over `floor`).
fn compare(
    segment: &tantivy::SegmentReader,
    vectors: &SegmentVectors,
    docs: std::ops::Range<tantivy::DocId>,
    query: &QueryVector,
    scope: &Scope,
    limit: usize,
    floor: &Floor,
) -> Top {
    let alive = segment.alive_bitset();
    let mut top = Top::new(limit);
    for doc in docs {
        if !alive.is_none_or(|alive| alive.is_alive(doc)) {
            continue;
        }
        let Some(key) = vectors.facts[doc as usize].in_scope(scope) else {
            continue;
        };
        if let Some(similarity) = Vectors::best_similarity(vectors.of(doc), query)
            && similarity > floor.get()
        {
            top.offer(similarity, key);
            floor.raise(top.threshold());
        }
    }
    top
}

/// The best `limit` of a segment's documents in `scope` (those over `floor`), its vectors
/// compared as the column's values are read from the index file: each value once, for every
/// document in scope that has it (the documents sorted by their value's number first).
fn compare_from_file(
    segment: &tantivy::SegmentReader,
    columns: &FactColumns,
    field: &str,
    query: &QueryVector,
    scope: &Scope,
    limit: usize,
    floor: &Floor,
) -> tantivy::Result<Top> {
    let mut top = Top::new(limit);
    let Some(column) = segment.fast_fields().bytes(field)? else {
        return Ok(top);
    };
    let alive = segment.alive_bitset();
    let mut wanted: Vec<(u64, u64)> = (0..segment.max_doc())
        .filter(|&doc| alive.is_none_or(|alive| alive.is_alive(doc)))
        .filter_map(|doc| Some((column.ords().first(doc)?, columns.in_scope(doc, scope)?)))
        .collect();
    wanted.sort_unstable();
    // Called once for each wanted document, in order, with its value (the dictionary reads
    // only the blocks that hold one, and no automaton as a stream over it would).
    let mut documents = wanted.iter();
    let mut last: Option<(u64, Option<Score>)> = None;
    column
        .dictionary()
        .sorted_ords_to_term_cb(wanted.iter().map(|&(ord, _)| ord), |value| {
            let Some(&(ord, key)) = documents.next() else {
                return Ok(());
            };
            let similarity = match last {
                Some((same, similarity)) if same == ord => similarity,
                _ => Vectors::best_similarity(value, query),
            };
            last = Some((ord, similarity));
            if let Some(similarity) = similarity
                && similarity > floor.get()
            {
                top.offer(similarity, key);
                floor.raise(top.threshold());
            }
            Ok(())
        })?;
    Ok(top)
}

/// Up to `limit` keys of live documents with no vectors (waiting for a model behind an
/// endpoint), in the segments' order.
pub(super) fn waiting(
    searcher: &Searcher,
    field: &str,
    limit: usize,
) -> crate::error::Result<Vec<u64>> {
    let mut keys = Vec::new();
    for segment in searcher.segment_readers() {
        let fast = segment.fast_fields();
        let (key_column, vectors) = (fast.u64("key")?, fast.bytes(field)?);
        // Every document of the segment has vectors (or the mark that it has none to have):
        // nothing to look at (the common case, looked for once a second).
        if vectors.as_ref().is_some_and(|column| {
            column.ords().get_cardinality() == tantivy::columnar::Cardinality::Full
        }) {
            continue;
        }
        let alive = segment.alive_bitset();
        for doc in 0..segment.max_doc() {
            if keys.len() >= limit {
                return Ok(keys);
            }
            let embedded = vectors
                .as_ref()
                .is_some_and(|column| column.ords().first(doc).is_some());
            if !embedded
                && alive.is_none_or(|alive| alive.is_alive(doc))
                && let Some(key) = key_column.first(doc)
            {
                keys.push(key);
            }
        }
    }
    Ok(keys)
}
