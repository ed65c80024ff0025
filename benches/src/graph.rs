//! Would a graph index (HNSW) make search by meaning sub-linear for the built-in model, where
//! an inverted file did not (`cells`)? `cells --graph` measures it on the same corpus: every
//! chunk vector in one HNSW (the `instant-distance` crate, similarity as the distance's
//! complement), searched with several beam widths (`ef`); each query's document ranking is
//! each document's best chunk among those the search returns, against exact search's ten
//! best. The figure that matters beside recall is how many chunks a search compares (counted
//! in the distance function), at two sizes of history: a search that stops growing with the
//! history compares about as many at both.
//!
//! Nothing in the store uses this: it is the measurement a design is chosen by
//! (BENCHMARKS.md, section 4: meaning search).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use instant_distance::{Builder, HnswMap, Search};
use serde::Serialize;

use crate::cells::{Corpus, Found, Kept, dot, exact_ten, ten_best};

/// Distances computed since the count was last read (searches run one at a time).
static COMPARED: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
struct Chunk(Vec<f32>);

impl instant_distance::Point for Chunk {
    fn distance(&self, other: &Self) -> f32 {
        COMPARED.fetch_add(1, Ordering::Relaxed);
        1.0 - dot(&self.0, &other.0)
    }
}

/// One beam width's outcome.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Searched {
    pub ef_construction: usize,
    pub ef: usize,
    #[serde(flatten)]
    pub kept: Kept,
    /// Chunks compared per search, on average, and as a share of all chunks.
    pub compared: f64,
    pub compared_share: f64,
    /// Seconds the graph took to build (on every core).
    pub build_s: f64,
}

/// The graph against exact search, for each beam width in `efs` (the graph is built once per
/// width: the crate fixes it at build time).
pub fn evaluate(corpus: &Corpus, efs: &[usize], ef_construction: usize) -> Vec<Searched> {
    let exact = exact_ten(corpus);
    let mut points = Vec::new();
    let mut owners = Vec::new();
    for (doc, chunks) in corpus.documents.iter().enumerate() {
        for chunk in chunks {
            points.push(Chunk(chunk.clone()));
            owners.push(doc as u32);
        }
    }
    let chunks = points.len();
    let mut rows = Vec::new();
    for &ef in efs {
        let started = Instant::now();
        let map: HnswMap<Chunk, u32> = Builder::default()
            .ef_construction(ef_construction)
            .ef_search(ef)
            .seed(7)
            .build(points.clone(), owners.clone());
        let build_s = started.elapsed().as_secs_f64();
        COMPARED.swap(0, Ordering::Relaxed);
        let mut search = Search::default();
        let outcome: Vec<Found<u64>> = corpus
            .queries
            .iter()
            .zip(&exact)
            .zip(&corpus.answers)
            .map(|((query, exact), answers)| {
                let mut best: HashMap<u32, f32> = HashMap::new();
                for item in map.search(&Chunk(query.clone()), &mut search) {
                    let similarity = 1.0 - item.distance;
                    let entry = best.entry(*item.value).or_insert(f32::MIN);
                    *entry = entry.max(similarity);
                }
                let found = ten_best(best.into_iter().map(|(doc, score)| (score, doc as usize)));
                Found::of(exact, &found, answers, COMPARED.swap(0, Ordering::Relaxed))
            })
            .collect();
        let compared =
            outcome.iter().map(|row| row.work).sum::<u64>() as f64 / outcome.len().max(1) as f64;
        rows.push(Searched {
            ef_construction,
            ef,
            kept: Kept::of(&outcome, corpus.needle_queries),
            compared,
            compared_share: compared / chunks.max(1) as f64,
            build_s,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cells::random_units;

    /// A beam wider than the corpus finds exact search's ten for every query; one of four
    /// returns four chunks, so it cannot.
    #[test]
    fn a_beam_as_wide_as_the_corpus_is_exact() {
        let documents = (0..60)
            .map(|doc| random_units(1 + doc % 3, 8, doc as u64 + 1))
            .collect();
        let queries = random_units(6, 8, 7);
        let corpus = Corpus {
            documents,
            queries,
            needle_queries: 2,
            answers: vec![Vec::new(); 6],
        };
        let rows = evaluate(&corpus, &[4, 400], 400);
        assert_eq!(rows[1].kept.needles_recall, 1.0, "{rows:?}");
        assert_eq!(rows[1].kept.questions_recall, 1.0, "{rows:?}");
        assert!(rows[0].kept.questions_recall <= 0.4, "{rows:?}");
        assert!(rows.iter().all(|row| row.compared > 0.0), "{rows:?}");
    }
}
