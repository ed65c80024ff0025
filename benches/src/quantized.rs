//! Would vectors compressed by product quantization (PQ) let search by meaning keep only a
//! few bytes a chunk in memory, and compare them far faster, where an inverted file and a graph
//! did not pay (`cells`, `graph`)? `cells --quantized 24x256,48x16` measures it on the same
//! corpus: each chunk vector cut into `parts` pieces of consecutive dimensions, each piece
//! replaced by the number of the nearest of `centres` centres trained for that piece (k-means
//! on a sample); a query scores every chunk from `parts` looked-up partial similarities, takes
//! each document's best chunk, and compares exactly only the `reranked` documents that score
//! best so (their full vectors read from disk, in a store built so). The figures that matter:
//! the share of exact search's ten kept, and how few documents must be compared exactly for it.
//!
//! Nothing in the store uses this: it is the measurement a design is chosen by
//! (BENCHMARKS.md, section 4: meaning search).

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::cells::{Corpus, Kept, dot, exact_ten, reranked_kept};

/// A shape of quantizer: `parts` pieces a vector, `centres` centres a piece (at most 256, so a
/// code is a byte a piece).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shape {
    pub parts: usize,
    pub centres: usize,
}

impl std::str::FromStr for Shape {
    type Err = String;

    /// `PARTSxCENTRES`, as `24x256`.
    fn from_str(text: &str) -> Result<Shape, String> {
        let (parts, centres) = text
            .split_once('x')
            .ok_or_else(|| format!("{text:?} is not PARTSxCENTRES (as 24x256)"))?;
        let number = |value: &str| {
            value
                .parse::<usize>()
                .map_err(|error| format!("{value:?} in {text:?}: {error}"))
        };
        let shape = Shape {
            parts: number(parts)?,
            centres: number(centres)?,
        };
        if shape.parts == 0 || !(1..=256).contains(&shape.centres) {
            return Err(format!(
                "{text:?}: a quantizer needs at least one part and 1 to 256 centres a part"
            ));
        }
        Ok(shape)
    }
}

impl Shape {
    /// Bytes a chunk's code takes, packed (`48x16`: four bits a part, 24 bytes).
    pub fn code_bytes(&self) -> usize {
        let bits = usize::BITS - (self.centres - 1).leading_zeros();
        (self.parts * bits as usize).div_ceil(8)
    }
}

/// A trained quantizer: for each part, `centres` centres of that part's dimensions.
#[derive(Debug)]
pub struct Quantizer {
    shape: Shape,
    /// Where each part's dimensions start and end (parts differ by one dimension at most
    /// when the dimensions do not divide evenly).
    bounds: Vec<std::ops::Range<usize>>,
    /// Per part, its centres laid out one after another.
    centres: Vec<Vec<f32>>,
}

impl Quantizer {
    /// Trains each part's centres by k-means (squared distance) on `sample`: the first
    /// centres are pieces spread evenly through it, then `rounds` rounds move each centre to
    /// the mean of the pieces nearest it. Deterministic. `None` without vectors, or with more
    /// parts than dimensions.
    pub fn train(sample: &[&[f32]], shape: Shape, rounds: usize) -> Option<Quantizer> {
        let dims = sample.first()?.len();
        if shape.parts > dims {
            return None;
        }
        let bounds: Vec<std::ops::Range<usize>> = (0..shape.parts)
            .map(|part| part * dims / shape.parts..(part + 1) * dims / shape.parts)
            .collect();
        let centres = bounds
            .par_iter()
            .map(|range| {
                let pieces: Vec<&[f32]> =
                    sample.iter().map(|vector| &vector[range.clone()]).collect();
                k_means(&pieces, shape.centres, rounds)
            })
            .collect();
        Some(Quantizer {
            shape,
            bounds,
            centres,
        })
    }

    /// A vector's code: per part, the number of its nearest centre.
    pub fn encode(&self, vector: &[f32]) -> Vec<u8> {
        self.bounds
            .iter()
            .zip(&self.centres)
            .map(|(range, centres)| nearest(centres, &vector[range.clone()]) as u8)
            .collect()
    }

    /// A query's table: per part, its similarity with each centre of that part.
    pub fn table(&self, query: &[f32]) -> Vec<f32> {
        let mut table = Vec::with_capacity(self.shape.parts * self.shape.centres);
        for (range, centres) in self.bounds.iter().zip(&self.centres) {
            let piece = &query[range.clone()];
            table.extend(
                centres
                    .chunks_exact(piece.len())
                    .map(|centre| dot(centre, piece)),
            );
        }
        table
    }

    /// A code's approximate similarity with the query `table` was made for.
    pub fn score(&self, table: &[f32], code: &[u8]) -> f32 {
        code.iter()
            .enumerate()
            .map(|(part, centre)| table[part * self.shape.centres + *centre as usize])
            .sum()
    }
}

/// The number of the centre (of `centres`, laid out one after another) nearest `piece`.
fn nearest(centres: &[f32], piece: &[f32]) -> usize {
    let mut best = (0, f32::MAX);
    for (at, centre) in centres.chunks_exact(piece.len()).enumerate() {
        let distance: f32 = centre
            .iter()
            .zip(piece)
            .map(|(c, x)| (c - x) * (c - x))
            .sum();
        if distance < best.1 {
            best = (at, distance);
        }
    }
    best.0
}

/// `count` centres of `pieces` by k-means (a centre left with no piece keeps its place).
fn k_means(pieces: &[&[f32]], count: usize, rounds: usize) -> Vec<f32> {
    let dims = pieces.first().map_or(0, |piece| piece.len());
    let mut centres: Vec<f32> = (0..count)
        .flat_map(|at| pieces[at * pieces.len() / count].iter().copied())
        .collect();
    for _ in 0..rounds {
        let mut sums = vec![0.0_f32; count * dims];
        let mut members = vec![0_usize; count];
        for piece in pieces {
            let at = nearest(&centres, piece);
            members[at] += 1;
            for (sum, x) in sums[at * dims..(at + 1) * dims].iter_mut().zip(*piece) {
                *sum += x;
            }
        }
        for (at, sum) in sums.chunks_exact(dims).enumerate() {
            if members[at] > 0 {
                for (centre, x) in centres[at * dims..(at + 1) * dims].iter_mut().zip(sum) {
                    *centre = x / members[at] as f32;
                }
            }
        }
    }
    centres
}

/// One quantizer's outcome at one number of documents compared exactly.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reranked {
    pub parts: usize,
    pub centres: usize,
    /// Bytes a chunk's code takes (the full vector: 96, four bits a dimension).
    pub code_bytes: usize,
    /// Documents compared exactly after the codes' pass.
    pub reranked: usize,
    #[serde(flatten)]
    pub kept: Kept,
    /// Seconds to train the quantizer (on every core) and to encode every chunk.
    pub train_s: f64,
    pub encode_s: f64,
}

/// Each quantizer against exact search, for each number of documents reranked (a quantizer
/// trained on up to 100 vectors a centre, 10 rounds).
pub fn evaluate(corpus: &Corpus, shapes: &[Shape], reranks: &[usize]) -> Vec<Reranked> {
    let exact = exact_ten(corpus);
    let all: Vec<&[f32]> = corpus.chunks();
    let mut rows = Vec::new();
    for &shape in shapes {
        let started = Instant::now();
        let sample: Vec<&[f32]> = all
            .iter()
            .step_by((all.len() / (shape.centres * 100)).max(1))
            .copied()
            .collect();
        let Some(quantizer) = Quantizer::train(&sample, shape, 10) else {
            continue;
        };
        let train_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let codes: Vec<Vec<Vec<u8>>> = corpus
            .documents
            .par_iter()
            .map(|chunks| chunks.iter().map(|chunk| quantizer.encode(chunk)).collect())
            .collect();
        let encode_s = started.elapsed().as_secs_f64();
        // Per query, every document ranked by its best chunk's approximate score.
        let ranked: Vec<Vec<usize>> = corpus
            .queries
            .par_iter()
            .map(|query| {
                let table = quantizer.table(query);
                let mut scored: Vec<(f32, usize)> = codes
                    .iter()
                    .enumerate()
                    .filter_map(|(doc, chunks)| {
                        chunks
                            .iter()
                            .map(|code| quantizer.score(&table, code))
                            .reduce(f32::max)
                            .map(|score| (score, doc))
                    })
                    .collect();
                let most = reranks.iter().copied().max().unwrap_or(0).min(scored.len());
                if most > 0 {
                    scored.select_nth_unstable_by(most - 1, |a, b| b.0.total_cmp(&a.0));
                }
                scored.truncate(most);
                scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                scored.into_iter().map(|(_, doc)| doc).collect()
            })
            .collect();
        for &reranked in reranks {
            rows.push(Reranked {
                parts: shape.parts,
                centres: shape.centres,
                code_bytes: shape.code_bytes(),
                reranked,
                kept: reranked_kept(corpus, &exact, &ranked, reranked),
                train_s,
                encode_s,
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cells::random_units as units;

    /// With as many centres as vectors, every vector is a centre: its code scores it exactly.
    #[test]
    fn a_centre_for_every_vector_scores_exactly() {
        let vectors = units(16, 8, 7);
        let sample: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
        let shape = Shape {
            parts: 2,
            centres: 16,
        };
        let quantizer = Quantizer::train(&sample, shape, 3).expect("a quantizer");
        let query = &units(1, 8, 9)[0];
        let table = quantizer.table(query);
        for vector in &vectors {
            let approximate = quantizer.score(&table, &quantizer.encode(vector));
            assert!((approximate - dot(vector, query)).abs() < 1e-5);
        }
    }

    /// Reranking every document is exact search; one centre a part cannot tell documents
    /// apart, so reranking one finds at most one of the ten.
    #[test]
    fn reranking_every_document_is_exact() {
        let corpus = crate::cells::forty_documents();
        let shapes = [Shape {
            parts: 2,
            centres: 1,
        }];
        let rows = evaluate(&corpus, &shapes, &[1, 40]);
        assert_eq!(rows[1].kept.needles_recall, 1.0, "{rows:?}");
        assert_eq!(rows[1].kept.questions_recall, 1.0, "{rows:?}");
        assert!(rows[0].kept.questions_recall <= 0.1, "{rows:?}");
    }

    #[test]
    fn shapes_are_read_and_checked() {
        assert_eq!(
            "24x256".parse::<Shape>(),
            Ok(Shape {
                parts: 24,
                centres: 256
            })
        );
        assert!("24".parse::<Shape>().is_err());
        assert!("0x16".parse::<Shape>().is_err());
        assert!("24x257".parse::<Shape>().is_err());
        let bytes = |text: &str| text.parse::<Shape>().map(|shape| shape.code_bytes());
        assert_eq!(bytes("24x256"), Ok(24));
        assert_eq!(bytes("48x16"), Ok(24));
        assert_eq!(bytes("3x2"), Ok(1));
    }
}
