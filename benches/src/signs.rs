//! Would sign codes, scanned in place of the vectors, keep exact search's answers at depths
//! that pay (`cells --signs 1,5 --rerank 200,1000`)? Each chunk vector is centred on the
//! corpus's mean, turned by a fixed random rotation (seeded; each table also measures it left out),
//! and kept as its signs: 24 bytes at 192 dimensions, with two numbers for the second stage.
//! A query then runs three stages:
//! 1. the Hamming distance between the query's signs and every chunk's (`count_ones` over
//!    64-bit words), keeping the `share` % nearest chunks;
//! 2. for those, an asymmetric estimate of the similarity, the rotated query at full precision
//!    against the chunk's signs scaled by its two numbers; each document's best chunk ranks it,
//!    and the `reranked` best documents go on;
//! 3. those documents compared exactly, their ten best kept.
//!
//! The figures: the share of exact search's ten kept, the queries answered, the bytes a query
//! reads in each stage (the store's vectors take 100 bytes: 192 dimensions at 4 bits and a
//! scale) and the first stage's nanoseconds a code on one core, beside exact comparison's a
//! chunk. Nothing in the store uses this: it is the measurement a design is chosen by
//! (BENCHMARKS.md, section 4: meaning search).

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::cells::{Corpus, Kept, dot, exact_ten, reranked_kept, reranked_ten};

/// Bytes the store keeps a vector in (192 dimensions at four bits, and an `f32` scale).
const STORED_VECTOR_BYTES: usize = 100;

/// Centres, turns and binarises vectors of one corpus.
#[derive(Debug)]
pub struct SignCoder {
    dims: usize,
    mean: Vec<f32>,
    /// `dims × dims`, row after row, orthonormal rows; `None`: the identity.
    rotation: Option<Vec<f32>>,
    /// The mean turned: a vector turned less it is the vector centred and turned.
    turned_mean: Vec<f32>,
}

/// A chunk's code: its signs, packed, and the two numbers the second stage scales them by.
#[derive(Clone, Debug, PartialEq)]
pub struct Code {
    pub signs: Vec<u64>,
    /// `|x − mean|`.
    pub norm: f32,
    /// How well the signs stand for the turned, centred vector: `Σ|o_i| / √dims` of its unit
    /// form `o` (1 when every dimension is as large as every other).
    pub alignment: f32,
}

/// A query made ready for the three stages.
#[derive(Debug)]
pub struct Query {
    pub signs: Vec<u64>,
    /// The query turned (not centred: the mean's share of a similarity is the same for every
    /// chunk, so it does not change the order).
    pub turned: Vec<f32>,
    /// For each byte of a code's signs and each of its 256 values, the sum of the turned
    /// query's dimensions whose signs it sets; and the sum of them all.
    table: Vec<f32>,
    total: f32,
}

impl SignCoder {
    /// A coder whose mean is `sample`'s, and whose rotation (with `rotate`) is the
    /// orthonormalised rows of a matrix of Gaussian numbers drawn from `seed`. `None` without
    /// vectors.
    pub fn new(sample: &[&[f32]], rotate: bool, seed: u64) -> Option<SignCoder> {
        let dims = sample.first()?.len();
        let mut mean = vec![0.0_f64; dims];
        for vector in sample {
            for (sum, x) in mean.iter_mut().zip(*vector) {
                *sum += f64::from(*x);
            }
        }
        let mean: Vec<f32> = mean
            .into_iter()
            .map(|sum| (sum / sample.len() as f64) as f32)
            .collect();
        let mut coder = SignCoder {
            dims,
            rotation: rotate.then(|| random_rotation(dims, seed)),
            turned_mean: Vec::new(),
            mean,
        };
        coder.turned_mean = coder.turn(&coder.mean);
        Some(coder)
    }

    /// 64-bit words a code's signs take.
    pub fn words(&self) -> usize {
        self.dims.div_ceil(64)
    }

    fn turn(&self, vector: &[f32]) -> Vec<f32> {
        match &self.rotation {
            Some(rows) => rows
                .chunks_exact(self.dims)
                .map(|row| dot(row, vector))
                .collect(),
            None => vector.to_vec(),
        }
    }

    fn signs(&self, turned: &[f32]) -> Vec<u64> {
        let mut words = vec![0_u64; self.words()];
        for (at, x) in turned.iter().enumerate() {
            if *x > 0.0 {
                words[at / 64] |= 1 << (at % 64);
            }
        }
        words
    }

    pub fn encode(&self, vector: &[f32]) -> Code {
        let turned: Vec<f32> = self
            .turn(vector)
            .iter()
            .zip(&self.turned_mean)
            .map(|(x, m)| x - m)
            .collect();
        let norm = turned.iter().map(|x| x * x).sum::<f32>().sqrt();
        let alignment = if norm > 0.0 {
            turned.iter().map(|x| x.abs()).sum::<f32>() / (norm * (self.dims as f32).sqrt())
        } else {
            1.0
        };
        Code {
            signs: self.signs(&turned),
            norm,
            alignment,
        }
    }

    pub fn query(&self, query: &[f32]) -> Query {
        let turned = self.turn(query);
        let centred: Vec<f32> = turned
            .iter()
            .zip(&self.turned_mean)
            .map(|(x, m)| x - m)
            .collect();
        let mut table = vec![0.0_f32; self.words() * 8 * 256];
        for (byte, values) in table.chunks_exact_mut(256).enumerate() {
            for (value, sum) in values.iter_mut().enumerate() {
                *sum = (0..8)
                    .filter(|bit| value >> bit & 1 == 1)
                    .filter_map(|bit| turned.get(byte * 8 + bit))
                    .sum();
            }
        }
        Query {
            signs: self.signs(&centred),
            total: turned.iter().sum(),
            turned,
            table,
        }
    }

    /// The second stage's estimate of `⟨query, chunk − mean⟩` from the chunk's code: the
    /// turned query against the signs as a unit vector, scaled by the norm and divided by the
    /// alignment (an unbiased estimate when the rotation is random).
    pub fn estimate(&self, query: &Query, code: &Code) -> f32 {
        self.estimate_signs(query, &code.signs, code.norm, code.alignment)
    }

    /// [`SignCoder::estimate`] from a code's parts.
    pub fn estimate_signs(&self, query: &Query, signs: &[u64], norm: f32, alignment: f32) -> f32 {
        // The dimensions whose sign is set count +, the others −: twice the set ones' sum
        // less the whole sum, the set ones' sum read byte by byte from the query's table.
        let set: f32 = signs
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .zip(query.table.chunks_exact(256))
            .map(|(byte, values)| values[byte as usize])
            .sum();
        let signed = 2.0 * set - query.total;
        if alignment > 0.0 {
            norm * signed / ((self.dims as f32).sqrt() * alignment)
        } else {
            0.0
        }
    }
}

/// The number of signs that differ.
pub fn hamming(a: &[u64], b: &[u64]) -> u32 {
    a.iter().zip(b).map(|(a, b)| (a ^ b).count_ones()).sum()
}

/// A `dims × dims` matrix with orthonormal rows: Gaussian numbers (Box–Muller over a
/// 64-bit linear congruential generator seeded by `seed`), orthonormalised row by row
/// (modified Gram–Schmidt, in `f64`).
fn random_rotation(dims: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut uniform = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 11) as f64 + 0.5) / (1_u64 << 53) as f64
    };
    let mut rows: Vec<Vec<f64>> = (0..dims)
        .map(|_| {
            (0..dims)
                .map(|_| {
                    let (u, v) = (uniform(), uniform());
                    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
                })
                .collect()
        })
        .collect();
    for at in 0..dims {
        let (done, rest) = rows.split_at_mut(at);
        let row = &mut rest[0];
        for earlier in done.iter() {
            let along: f64 = row.iter().zip(earlier).map(|(a, b)| a * b).sum();
            for (x, e) in row.iter_mut().zip(earlier) {
                *x -= along * e;
            }
        }
        let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        for x in row.iter_mut() {
            *x /= norm;
        }
    }
    rows.into_iter().flatten().map(|x| x as f32).collect()
}

/// One setting of the three stages against exact search.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Staged {
    pub rotated: bool,
    /// Percent of the chunks the Hamming stage keeps.
    pub share: f64,
    /// Documents compared exactly at the end.
    pub reranked: usize,
    #[serde(flatten)]
    pub kept: Kept,
    /// Bytes a query reads, on average: every code's signs; the kept chunks' signs again and
    /// their two numbers; the reranked documents' vectors as the store keeps them. Exact
    /// search reads every vector.
    pub bytes_codes: f64,
    pub bytes_estimates: f64,
    pub bytes_rerank: f64,
    pub bytes_exact: f64,
}

/// What one coder's stage-one scan costs on one core.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanTime {
    pub chunks: usize,
    pub reranked: usize,
    /// Milliseconds a query for the three stages (the rerank in `f32`, the chunks in memory).
    pub three_stages_ms: f64,
    /// Of those, stage two's and stage three's.
    pub estimates_ms: f64,
    pub rerank_ms: f64,
    /// Nanoseconds a code for the Hamming scan (distances into a buffer, a histogram, the
    /// kept chunks collected), and a chunk for exact comparison in `f32` over this corpus's
    /// vectors (the store compares its 4-bit vectors at 16–35 ns a chunk in cache: criterion's
    /// `meaning/compare_1000_chunks`).
    pub hamming_ns: f64,
    pub exact_ns: f64,
}

/// Codes laid out for the first stage's scan: their signs one after another.
#[derive(Debug, Default)]
pub struct Signs {
    words: usize,
    signs: Vec<u64>,
}

impl Signs {
    pub fn new<'a>(words: usize, codes: impl IntoIterator<Item = &'a Code>) -> Signs {
        // Distances are kept as `u16`s, and a code takes at least a word.
        debug_assert!(words > 0 && words * 64 < usize::from(u16::MAX));
        Signs {
            words,
            signs: codes
                .into_iter()
                .flat_map(|code| code.signs.iter().copied())
                .collect(),
        }
    }

    /// The signs of the `at`-th code.
    pub fn code(&self, at: usize) -> &[u64] {
        &self.signs[at * self.words..(at + 1) * self.words]
    }

    /// Stage one: the `keep` codes whose signs are nearest `query`'s, by position (ties at the
    /// edge broken by position). `distances` is scratch space, kept between calls.
    pub fn nearest(&self, query: &[u64], keep: usize, distances: &mut Vec<u16>) -> Vec<usize> {
        let mut histogram = vec![0_u32; self.words * 64 + 1];
        distances.clear();
        distances.extend(self.signs.chunks_exact(self.words).map(|code| {
            let distance = hamming(code, query);
            histogram[distance as usize] += 1;
            distance as u16
        }));
        let (mut edge, mut below) = (0, 0);
        while edge + 1 < histogram.len() && below + (histogram[edge] as usize) < keep {
            below += histogram[edge] as usize;
            edge += 1;
        }
        let mut at_edge = keep.saturating_sub(below);
        let mut kept = Vec::with_capacity(keep);
        for (chunk, distance) in distances.iter().enumerate() {
            let distance = *distance as usize;
            if distance < edge {
                kept.push(chunk);
            } else if distance == edge && at_edge > 0 {
                at_edge -= 1;
                kept.push(chunk);
            }
        }
        kept
    }
}

/// Codes laid out for the scan, each chunk's two numbers beside, and its document.
struct Coded {
    signs: Signs,
    norms: Vec<f32>,
    alignments: Vec<f32>,
    document: Vec<u32>,
    /// Each document's chunks, as a range of the above.
    chunks: Vec<std::ops::Range<usize>>,
}

impl Coded {
    /// Stage two: the `deepest` documents best by the estimate over `chunks`, best first.
    fn estimated(
        &self,
        coder: &SignCoder,
        query: &Query,
        chunks: &[usize],
        deepest: usize,
    ) -> Vec<usize> {
        let mut best: std::collections::HashMap<usize, f32> = std::collections::HashMap::new();
        for &chunk in chunks {
            let score = coder.estimate_signs(
                query,
                self.signs.code(chunk),
                self.norms[chunk],
                self.alignments[chunk],
            );
            let entry = best
                .entry(self.document[chunk] as usize)
                .or_insert(f32::MIN);
            *entry = entry.max(score);
        }
        let mut scored: Vec<(f32, usize)> =
            best.into_iter().map(|(doc, score)| (score, doc)).collect();
        scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.truncate(deepest);
        scored.into_iter().map(|(_, doc)| doc).collect()
    }

    /// The corpus's coder (rotated with `rotate`), its chunks coded, and its queries made
    /// ready; `None` without vectors.
    fn prepare(corpus: &Corpus, rotate: bool) -> Option<(SignCoder, Coded, Vec<Query>)> {
        let coder = SignCoder::new(&corpus.chunks(), rotate, 0x5eed)?;
        let coded = Coded::new(&coder, corpus);
        let queries = corpus.queries.iter().map(|q| coder.query(q)).collect();
        Some((coder, coded, queries))
    }

    fn new(coder: &SignCoder, corpus: &Corpus) -> Coded {
        let codes: Vec<Code> = corpus
            .documents
            .par_iter()
            .flat_map_iter(|chunks| chunks.iter().map(|chunk| coder.encode(chunk)))
            .collect();
        let mut document = Vec::with_capacity(codes.len());
        let mut chunks = Vec::with_capacity(corpus.documents.len());
        for (doc, vectors) in corpus.documents.iter().enumerate() {
            chunks.push(document.len()..document.len() + vectors.len());
            document.extend(std::iter::repeat_n(doc as u32, vectors.len()));
        }
        Coded {
            signs: Signs::new(coder.words(), &codes),
            norms: codes.iter().map(|code| code.norm).collect(),
            alignments: codes.iter().map(|code| code.alignment).collect(),
            document,
            chunks,
        }
    }
}

/// Each setting against exact search: with and without the rotation (as `rotations` lists),
/// at each stage-one `shares` (percent of chunks) and each number of documents `reranks`.
pub fn evaluate(
    corpus: &Corpus,
    rotations: &[bool],
    shares: &[f64],
    reranks: &[usize],
) -> Vec<Staged> {
    let exact = exact_ten(corpus);
    let chunk_count: usize = corpus.documents.iter().map(Vec::len).sum();
    let mut rows = Vec::new();
    for &rotate in rotations {
        let Some((coder, coded, queries)) = Coded::prepare(corpus, rotate) else {
            continue;
        };
        for &share in shares {
            let keep = ((chunk_count as f64 * share / 100.0).ceil() as usize).min(chunk_count);
            // Per query, the documents ranked by stage two, as deep as the deepest rerank.
            let deepest = reranks.iter().copied().max().unwrap_or(0);
            let ranked: Vec<Vec<usize>> = queries
                .par_iter()
                .map_init(Vec::new, |distances, query| {
                    let chunks = coded.signs.nearest(&query.signs, keep, distances);
                    coded.estimated(&coder, query, &chunks, deepest)
                })
                .collect();
            for &reranked in reranks {
                let rerank_chunks: usize = ranked
                    .iter()
                    .flat_map(|documents| documents.iter().take(reranked))
                    .map(|&doc| coded.chunks[doc].len())
                    .sum();
                let queries = corpus.queries.len().max(1) as f64;
                rows.push(Staged {
                    rotated: rotate,
                    share,
                    reranked,
                    kept: reranked_kept(corpus, &exact, &ranked, reranked),
                    bytes_codes: (chunk_count * coder.words() * 8) as f64,
                    bytes_estimates: (keep * (8 + coder.words() * 8)) as f64,
                    bytes_rerank: rerank_chunks as f64 * STORED_VECTOR_BYTES as f64 / queries,
                    bytes_exact: (chunk_count * STORED_VECTOR_BYTES) as f64,
                });
            }
        }
    }
    rows
}

/// The Hamming scan's time a code (keeping `share` % of the chunks), the three stages' a
/// query (reranking `reranked` documents), and exact comparison's a chunk, on one core over
/// every query (the rotated coder).
pub fn scan_time(corpus: &Corpus, share: f64, reranked: usize) -> Option<ScanTime> {
    let (coder, coded, queries) = Coded::prepare(corpus, true)?;
    let sample: Vec<&[f32]> = corpus.chunks();
    let keep = (sample.len() as f64 * share / 100.0).ceil() as usize;
    let mut distances = Vec::new();
    let mut kept = 0;
    let started = Instant::now();
    for query in &queries {
        kept += coded
            .signs
            .nearest(&query.signs, keep, &mut distances)
            .len();
    }
    let hamming = started.elapsed().as_secs_f64();
    let (mut estimating, mut reranking) = (0.0, 0.0);
    let started = Instant::now();
    for (query, full) in queries.iter().zip(&corpus.queries) {
        let chunks = coded.signs.nearest(&query.signs, keep, &mut distances);
        let at = Instant::now();
        let documents = coded.estimated(&coder, query, &chunks, reranked);
        estimating += at.elapsed().as_secs_f64();
        let at = Instant::now();
        kept += reranked_ten(corpus, full, &documents).len();
        reranking += at.elapsed().as_secs_f64();
    }
    let staged = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut sum = 0.0_f32;
    for query in &corpus.queries {
        sum += sample
            .iter()
            .map(|chunk| dot(chunk, query))
            .fold(f32::MIN, f32::max);
    }
    let exact = started.elapsed().as_secs_f64();
    std::hint::black_box((kept, sum));
    let work = (queries.len() * sample.len()).max(1) as f64;
    Some(ScanTime {
        chunks: sample.len(),
        reranked,
        three_stages_ms: staged * 1e3 / queries.len().max(1) as f64,
        estimates_ms: estimating * 1e3 / queries.len().max(1) as f64,
        rerank_ms: reranking * 1e3 / queries.len().max(1) as f64,
        hamming_ns: hamming * 1e9 / work,
        exact_ns: exact * 1e9 / work,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cells::random_units as units;

    #[test]
    fn the_rotation_is_orthonormal() {
        let dims = 24;
        let rows = random_rotation(dims, 3);
        for a in 0..dims {
            for b in 0..dims {
                let product = dot(
                    &rows[a * dims..(a + 1) * dims],
                    &rows[b * dims..(b + 1) * dims],
                );
                let expected = if a == b { 1.0 } else { 0.0 };
                assert!((product - expected).abs() < 1e-4, "{a} {b}: {product}");
            }
        }
    }

    /// A vector's code is at Hamming distance 0 from itself as a query, and `dims` from its
    /// opposite about the mean; the estimate of a vector against itself is near its norm².
    #[test]
    fn codes_agree_with_their_vectors() {
        let vectors = units(50, 192, 5);
        let sample: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
        let coder = SignCoder::new(&sample, true, 11).expect("a coder");
        let code = coder.encode(&vectors[0]);
        assert_eq!(hamming(&code.signs, &coder.query(&vectors[0]).signs), 0);
        let opposite: Vec<f32> = vectors[0]
            .iter()
            .zip(&coder.mean)
            .map(|(x, m)| 2.0 * m - x)
            .collect();
        assert_eq!(hamming(&code.signs, &coder.query(&opposite).signs), 192);
        let centred: Vec<f32> = vectors[0]
            .iter()
            .zip(&coder.mean)
            .map(|(x, m)| x - m)
            .collect();
        let estimate = coder.estimate(&coder.query(&centred), &code);
        let truth = dot(&centred, &centred);
        assert!(
            (estimate - truth).abs() < 1e-3 * truth,
            "{estimate} {truth}"
        );
    }

    /// Keeping every chunk and reranking every document is exact search; keeping one chunk
    /// and reranking one document finds one of the ten at most.
    #[test]
    fn the_deepest_setting_is_exact_search() {
        let corpus = crate::cells::forty_documents();
        for rotate in [false, true] {
            let rows = evaluate(&corpus, &[rotate], &[100.0, 1.0], &[40, 1]);
            assert_eq!(rows[0].kept.needles_recall, 1.0, "{rows:?}");
            assert_eq!(rows[0].kept.questions_recall, 1.0, "{rows:?}");
            assert!(rows[3].kept.questions_recall <= 0.1, "{rows:?}");
        }
    }
}
