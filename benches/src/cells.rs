//! Would an inverted file (IVF) make search by meaning sub-linear for the built-in model?
//! `cells --transcript FILE --needles FILE` measures it: every message's chunk vectors (as the
//! index stores them, neighbour vectors aside), the exact best ten documents for each needle's
//! query and each paraphrase question of `vilvona_workload::meaning::PROBES` (their statements
//! added as messages), then, for codebooks of several sizes trained by spherical k-means on a
//! sample of the vectors, how many of those ten an IVF search finds when it compares only the
//! chunks filed in the cells nearest the query, and what share of all chunks that is.
//!
//! Beside the share of exact's ten, every measurement here counts the queries whose answer is
//! among the ten found (a needle's message, a paraphrase question's statement, a LoCoMo
//! question's evidence turns): the one document a user asked for can be the one an index
//! loses while it keeps the other nine. `--contrast` prints how far exact search's nearest
//! documents stand from the rest, and `--locomo DIR` measures on natural conversations
//! instead of the generator's.
//!
//! Nothing in the store uses this: it is the measurement a design was chosen by
//! (BENCHMARKS.md, section 4: meaning search).

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::Serialize;
use vilvona_embed::chunks_for;

/// A vector space's cells: `cells × dims` unit centres.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    dims: usize,
    centres: Vec<f32>,
}

impl Codebook {
    /// The codebook of `dims`-dimensional centres laid out one after another; `None` when the
    /// values are not whole centres or there are none.
    pub fn new(dims: usize, centres: Vec<f32>) -> Option<Codebook> {
        (dims > 0 && !centres.is_empty() && centres.len().is_multiple_of(dims))
            .then_some(Codebook { dims, centres })
    }

    /// Trains `cells` centres on unit vectors by spherical k-means: the first centres are
    /// vectors spread evenly through `vectors`, then each round moves every centre to the
    /// normalised mean of the vectors nearest it (a centre left with none keeps its place).
    /// Deterministic: the same vectors give the same codebook.
    pub fn train(vectors: &[Vec<f32>], cells: usize, rounds: usize) -> Option<Codebook> {
        let dims = vectors.first()?.len();
        let cells = cells.min(vectors.len()).max(1);
        let mut centres: Vec<f32> = (0..cells)
            .flat_map(|cell| vectors[cell * vectors.len() / cells].iter().copied())
            .collect();
        for _ in 0..rounds {
            let codebook = Codebook {
                dims,
                centres: centres.clone(),
            };
            let mut sums = vec![0.0_f32; cells * dims];
            for vector in vectors {
                let cell = codebook.cell_of(vector) as usize;
                for (sum, x) in sums[cell * dims..(cell + 1) * dims].iter_mut().zip(vector) {
                    *sum += x;
                }
            }
            for (cell, sum) in sums.chunks_exact(dims).enumerate() {
                let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    for (centre, x) in centres[cell * dims..(cell + 1) * dims].iter_mut().zip(sum) {
                        *centre = x / norm;
                    }
                }
            }
        }
        Codebook::new(dims, centres)
    }

    /// Number of cells.
    pub fn cells(&self) -> usize {
        self.centres.len() / self.dims
    }

    fn scores<'a>(&'a self, vector: &'a [f32]) -> impl Iterator<Item = f32> + 'a {
        self.centres
            .chunks_exact(self.dims)
            .map(move |centre| dot(centre, vector))
    }

    /// The cell a vector belongs to (0 for a vector of other dimensions).
    pub fn cell_of(&self, vector: &[f32]) -> u32 {
        if vector.len() != self.dims {
            return 0;
        }
        let mut best = (0, f32::MIN);
        for (cell, score) in self.scores(vector).enumerate() {
            if score > best.1 {
                best = (cell, score);
            }
        }
        best.0 as u32
    }

    /// The `count` cells whose centres are nearest `vector`, nearest first.
    pub fn nearest(&self, vector: &[f32], count: usize) -> Vec<u32> {
        if vector.len() != self.dims {
            return Vec::new();
        }
        let mut scored: Vec<(f32, u32)> = self
            .scores(vector)
            .enumerate()
            .map(|(cell, score)| (score, cell as u32))
            .collect();
        scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.truncate(count);
        scored.into_iter().map(|(_, cell)| cell).collect()
    }
}

/// What an approximate search kept of exact search's answers, for the needles' queries and
/// the questions apart.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    /// Of exact search's ten best documents, the share found.
    pub needles_recall: f64,
    pub questions_recall: f64,
    /// Of the queries whose answer is known, the share with an answering document among the
    /// ten found; exact search's own share is in [`Contrast`].
    pub needles_answered: f64,
    pub questions_answered: f64,
}

impl Kept {
    pub(crate) fn of<T>(outcome: &[Found<T>], needle_queries: usize) -> Kept {
        Kept {
            needles_recall: recall(outcome, 0..needle_queries),
            questions_recall: recall(outcome, needle_queries..outcome.len()),
            needles_answered: answered_share(outcome, 0..needle_queries),
            questions_answered: answered_share(outcome, needle_queries..outcome.len()),
        }
    }

    /// The four figures as the cells of a Markdown row.
    pub fn cells(&self) -> String {
        format!(
            "{:.3} | {:.3} | {:.3} | {:.3}",
            self.needles_recall,
            self.questions_recall,
            self.needles_answered,
            self.questions_answered
        )
    }
}

/// One codebook's outcome at one number of cells probed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Probed {
    pub cells: usize,
    /// Cells each chunk is filed in (2: in its nearest two, "spilled").
    pub filed_in: usize,
    pub probed: usize,
    /// Chunk entries compared, as a share of all chunks (the exact search's work is 1).
    pub compared: f64,
    /// The largest cell's entries, as a share of all.
    pub largest_cell: f64,
    #[serde(flatten)]
    pub kept: Kept,
}

/// The documents' chunk vectors and the queries (needles first), read and embedded.
#[derive(Debug)]
pub struct Corpus {
    pub documents: Vec<Vec<Vec<f32>>>,
    pub queries: Vec<Vec<f32>>,
    pub needle_queries: usize,
    /// For each query, the documents that answer it (a needle's: each message that holds its
    /// answer; a paraphrase question's: its statement); empty where none is known.
    pub answers: Vec<Vec<usize>>,
}

impl Corpus {
    /// Every document's chunk vectors, one after another.
    pub(crate) fn chunks(&self) -> Vec<&[f32]> {
        self.documents.iter().flatten().map(Vec::as_slice).collect()
    }
}

/// Reads an OpenClaw transcript's messages and a needles file, and embeds them with the
/// built-in model; the paraphrase set's statements are added as messages, its questions as
/// queries.
pub fn corpus(transcript: &Path, needles: &Path) -> Result<Corpus> {
    let model = vilvona_embed::builtin();
    let text = std::fs::read_to_string(transcript)
        .with_context(|| format!("reading {}", transcript.display()))?;
    let messages: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["type"] == "message")
        .map(|entry| {
            let message = &entry["message"];
            let text = match &message["content"] {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Array(parts) => parts
                    .iter()
                    .filter_map(|part| part["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            (message["role"].as_str().unwrap_or("").to_owned(), text)
        })
        .collect();
    let needles: Vec<crate::Needle> = serde_json::from_str(
        &std::fs::read_to_string(needles)
            .with_context(|| format!("reading {}", needles.display()))?,
    )?;
    let mut answers: Vec<Vec<usize>> = needles
        .iter()
        .map(|needle| {
            messages
                .iter()
                .enumerate()
                .filter(|(_, (_, text))| text.contains(&needle.answer))
                .map(|(doc, _)| doc)
                .collect()
        })
        .collect();
    answers
        .extend((0..vilvona_workload::meaning::PROBES.len()).map(|at| vec![messages.len() + at]));
    let mut documents: Vec<Vec<Vec<f32>>> = messages
        .par_iter()
        .map(|(role, text)| model.embed_chunks(text, chunks_for(role)))
        .collect();
    let probes = vilvona_workload::meaning::PROBES;
    documents.extend(
        probes
            .iter()
            .map(|probe| model.embed_chunks(probe.statement, 8)),
    );
    let mut queries: Vec<Vec<f32>> = needles
        .iter()
        .filter_map(|n| model.embed(&n.query))
        .collect();
    let needle_queries = queries.len();
    queries.extend(
        probes
            .iter()
            .filter_map(|probe| model.embed(probe.question)),
    );
    Ok(Corpus {
        documents,
        queries,
        needle_queries,
        answers,
    })
}

/// The best similarity of a document's chunks that pass `filter`.
fn best(chunks: &[Vec<f32>], query: &[f32], filter: impl Fn(usize) -> bool) -> Option<f32> {
    chunks
        .iter()
        .enumerate()
        .filter(|(at, _)| filter(*at))
        .map(|(_, chunk)| dot(chunk, query))
        .reduce(f32::max)
}

/// The ten best documents, best first.
pub(crate) fn ten_best(scores: impl Iterator<Item = (f32, usize)>) -> Vec<usize> {
    let mut scores: Vec<(f32, usize)> = scores.collect();
    scores.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scores.into_iter().take(10).map(|(_, doc)| doc).collect()
}

/// The ten best of `documents` compared exactly with `query` (each by its best chunk): the
/// last stage of an approximate search.
pub(crate) fn reranked_ten<'a>(
    corpus: &Corpus,
    query: &[f32],
    documents: impl IntoIterator<Item = &'a usize>,
) -> Vec<usize> {
    ten_best(
        documents.into_iter().filter_map(|&doc| {
            best(&corpus.documents[doc], query, |_| true).map(|score| (score, doc))
        }),
    )
}

/// What reranking the first `reranked` of each query's `ranked` documents (an approximate
/// search's candidates, in its order) kept of exact search's answers.
pub(crate) fn reranked_kept(
    corpus: &Corpus,
    exact: &[Vec<usize>],
    ranked: &[Vec<usize>],
    reranked: usize,
) -> Kept {
    let outcome: Vec<Found<()>> = corpus
        .queries
        .iter()
        .zip(exact)
        .zip(ranked)
        .zip(&corpus.answers)
        .map(|(((query, exact), ranked), answers)| {
            let found = reranked_ten(corpus, query, ranked.iter().take(reranked));
            Found::of(exact, &found, answers, ())
        })
        .collect();
    Kept::of(&outcome, corpus.needle_queries)
}

/// Exact search's ten best documents for each query.
pub(crate) fn exact_ten(corpus: &Corpus) -> Vec<Vec<usize>> {
    corpus
        .queries
        .par_iter()
        .map(|query| ten_best(exact_scores(corpus, query)))
        .collect()
}

/// Every document's score for `query` by exact search (its best chunk), with its number.
fn exact_scores<'a>(
    corpus: &'a Corpus,
    query: &'a [f32],
) -> impl Iterator<Item = (f32, usize)> + 'a {
    corpus
        .documents
        .iter()
        .enumerate()
        .filter_map(|(doc, chunks)| best(chunks, query, |_| true).map(|score| (score, doc)))
}

/// What one query's approximate search found, against exact search's ten: how many of them
/// it kept, whether it found an answer (`None` when the query's answer is not known), and the
/// work it did (what counts as work is the measurement's).
#[derive(Clone, Debug)]
pub(crate) struct Found<T> {
    kept: usize,
    of: usize,
    answered: Option<bool>,
    pub(crate) work: T,
}

impl<T> Found<T> {
    /// `found`, the ten an approximate search ranks best, against `exact` and `answers`.
    pub(crate) fn of(exact: &[usize], found: &[usize], answers: &[usize], work: T) -> Found<T> {
        Found {
            kept: exact.iter().filter(|doc| found.contains(doc)).count(),
            of: exact.len(),
            answered: (!answers.is_empty()).then(|| found.iter().any(|doc| answers.contains(doc))),
            work,
        }
    }
}

/// Of the exact ten, the share kept over `rows`.
pub(crate) fn recall<T>(rows: &[Found<T>], range: std::ops::Range<usize>) -> f64 {
    let (kept, of) = rows[range]
        .iter()
        .fold((0, 0), |(kept, of), row| (kept + row.kept, of + row.of));
    kept as f64 / of.max(1) as f64
}

/// Of the queries in `range` whose answer is known, the share answered.
pub(crate) fn answered_share<T>(rows: &[Found<T>], range: std::ops::Range<usize>) -> f64 {
    let known: Vec<bool> = rows[range].iter().filter_map(|row| row.answered).collect();
    known.iter().filter(|answered| **answered).count() as f64 / known.len().max(1) as f64
}

/// How far apart a query's nearest documents stand from the rest, averaged over a set of
/// queries: the best document's similarity, the 10th's, the 100th's and the median
/// document's; and where the answer ranks.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Contrast {
    pub set: String,
    pub queries: usize,
    pub documents: usize,
    pub first: f64,
    pub tenth: f64,
    pub hundredth: f64,
    pub median: f64,
    /// Of the queries whose answer is known, the share exact search ranks in its ten.
    pub answer_in_ten: f64,
    /// The median over those queries of the answer's best rank (1 = first).
    pub answer_rank_median: usize,
}

/// [`Contrast`] of the needles' queries and of the questions.
pub fn contrast(corpus: &Corpus) -> Vec<Contrast> {
    let ranked: Vec<(Vec<f32>, Option<usize>)> = corpus
        .queries
        .par_iter()
        .zip(&corpus.answers)
        .map(|(query, answers)| {
            let mut scored: Vec<(f32, usize)> = exact_scores(corpus, query).collect();
            scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let rank = scored
                .iter()
                .position(|(_, doc)| answers.contains(doc))
                .map(|at| at + 1);
            (scored.into_iter().map(|(score, _)| score).collect(), rank)
        })
        .collect();
    let set = |name: &str, range: std::ops::Range<usize>| {
        let rows = &ranked[range];
        let mean = |at: &dyn Fn(&[f32]) -> f32| {
            rows.iter()
                .map(|(scores, _)| f64::from(at(scores)))
                .sum::<f64>()
                / rows.len().max(1) as f64
        };
        let score_at = |rank: usize| move |scores: &[f32]| scores.get(rank).copied().unwrap_or(0.0);
        let mut ranks: Vec<usize> = rows.iter().filter_map(|(_, rank)| *rank).collect();
        ranks.sort_unstable();
        Contrast {
            set: name.to_owned(),
            queries: rows.len(),
            documents: corpus.documents.len(),
            first: mean(&score_at(0)),
            tenth: mean(&score_at(9)),
            hundredth: mean(&score_at(99)),
            median: mean(&|scores: &[f32]| scores.get(scores.len() / 2).copied().unwrap_or(0.0)),
            answer_in_ten: ranks.iter().filter(|rank| **rank <= 10).count() as f64
                / ranks.len().max(1) as f64,
            answer_rank_median: ranks.get(ranks.len() / 2).copied().unwrap_or(0),
        }
    };
    vec![
        set("needles", 0..corpus.needle_queries),
        set("questions", corpus.needle_queries..ranked.len()),
    ]
}

/// IVF against exact search, for each number of cells (a codebook trained on 40 vectors a
/// cell, 8 rounds), chunks filed in 1 or 2 cells, and each number of cells probed.
pub fn evaluate(corpus: &Corpus, cell_counts: &[usize], probes: &[usize]) -> Vec<Probed> {
    let exact = exact_ten(corpus);
    let all = corpus.chunks();
    let mut rows = Vec::new();
    for &cells in cell_counts {
        let sample: Vec<Vec<f32>> = all
            .iter()
            .step_by((all.len() / (cells * 40)).max(1))
            .map(|vector| vector.to_vec())
            .collect();
        let Some(codebook) = Codebook::train(&sample, cells, 8) else {
            continue;
        };
        for filed_in in [1, 2] {
            // Per document, per chunk, the cells it is filed in.
            let filed: Vec<Vec<Vec<u32>>> = corpus
                .documents
                .par_iter()
                .map(|chunks| {
                    chunks
                        .iter()
                        .map(|chunk| codebook.nearest(chunk, filed_in))
                        .collect()
                })
                .collect();
            let mut sizes = vec![0_usize; codebook.cells()];
            for cell in filed.iter().flatten().flatten() {
                sizes[*cell as usize] += 1;
            }
            let entries: usize = sizes.iter().sum();
            for &probed in probes {
                let outcome: Vec<Found<usize>> = corpus
                    .queries
                    .par_iter()
                    .zip(&exact)
                    .zip(&corpus.answers)
                    .map(|((query, exact), answers)| {
                        let near: HashSet<u32> =
                            codebook.nearest(query, probed).into_iter().collect();
                        let compared: usize = near.iter().map(|cell| sizes[*cell as usize]).sum();
                        let found = ten_best(corpus.documents.iter().enumerate().filter_map(
                            |(doc, chunks)| {
                                let cells = &filed[doc];
                                best(chunks, query, |at| {
                                    cells[at].iter().any(|c| near.contains(c))
                                })
                                .map(|score| (score, doc))
                            },
                        ));
                        Found::of(exact, &found, answers, compared)
                    })
                    .collect();
                rows.push(Probed {
                    cells,
                    filed_in,
                    probed,
                    kept: Kept::of(&outcome, corpus.needle_queries),
                    compared: outcome.iter().map(|row| row.work).sum::<usize>() as f64
                        / outcome.len().max(1) as f64
                        / all.len().max(1) as f64,
                    largest_cell: sizes.iter().copied().max().unwrap_or(0) as f64
                        / entries.max(1) as f64,
                });
            }
        }
    }
    rows
}

/// Forty documents of one to three chunks and five queries (two of them needles), none with a
/// known answer, in 8 dimensions: the product quantizer's and the sign codes' unit tests' corpus.
#[cfg(test)]
pub(crate) fn forty_documents() -> Corpus {
    Corpus {
        documents: (0..40)
            .map(|doc| random_units(1 + doc % 3, 8, doc as u64 + 1))
            .collect(),
        queries: random_units(5, 8, 99),
        needle_queries: 2,
        answers: vec![Vec::new(); 5],
    }
}

/// `count` unit vectors of `dims` dimensions, made from `seed` (the same every run): the
/// measurements' unit tests' corpora.
#[cfg(test)]
pub(crate) fn random_units(count: usize, dims: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            let vector: Vec<f32> = (0..dims)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    (state >> 40) as f32 / (1 << 24) as f32 - 0.5
                })
                .collect();
            let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
            vector.into_iter().map(|x| x / norm).collect()
        })
        .collect()
}

/// `Σ a × b`, eight sums apart (so that the compiler makes it a vector loop).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0_f32; 8];
    let (a_blocks, a_tail) = a.as_chunks::<8>();
    let (b_blocks, b_tail) = b.as_chunks::<8>();
    for (a, b) in a_blocks.iter().zip(b_blocks) {
        for lane in 0..8 {
            lanes[lane] += a[lane] * b[lane];
        }
    }
    lanes.iter().sum::<f32>() + a_tail.iter().zip(b_tail).map(|(a, b)| a * b).sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(values: &[f32]) -> Vec<f32> {
        let norm = values.iter().map(|x| x * x).sum::<f32>().sqrt();
        values.iter().map(|x| x / norm).collect()
    }

    #[test]
    fn training_finds_the_groups_of_vectors() {
        // Three groups around three directions, interleaved.
        let directions = [
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],
        ];
        let vectors: Vec<Vec<f32>> = (0..300)
            .map(|at| {
                let mut vector = directions[at % 3].to_vec();
                vector[2] = (at % 7) as f32 * 0.05;
                unit(&vector)
            })
            .collect();
        let codebook = Codebook::train(&vectors, 3, 5).expect("a codebook");
        assert_eq!(codebook.cells(), 3);
        for group in 0..3 {
            let cells: std::collections::HashSet<u32> = vectors
                .iter()
                .skip(group)
                .step_by(3)
                .map(|vector| codebook.cell_of(vector))
                .collect();
            assert_eq!(cells.len(), 1, "group {group} lies in one cell");
        }
        let query = unit(&[0.0, 0.9, 0.1, 0.0]);
        assert_eq!(
            codebook.nearest(&query, 1),
            vec![codebook.cell_of(&vectors[1])]
        );
        assert_eq!(codebook.nearest(&query, 5).len(), 3);
    }

    /// Each query is one document's own vector (its answer), the others random: the answer
    /// ranks first with similarity 1, the similarities fall with the rank, and a query
    /// whose answer is not known counts in neither share.
    #[test]
    fn contrast_ranks_each_answer_and_reads_the_similarities() {
        let documents: Vec<Vec<Vec<f32>>> = random_units(200, 8, 3)
            .into_iter()
            .map(|vector| vec![vector])
            .collect();
        let answers = vec![vec![5], vec![17], vec![120, 3], Vec::new()];
        let queries = [5, 17, 120, 9]
            .iter()
            .map(|&doc| documents[doc][0].clone())
            .collect();
        let corpus = Corpus {
            documents,
            queries,
            needle_queries: 1,
            answers,
        };
        let sets = contrast(&corpus);
        assert_eq!(sets.len(), 2);
        assert_eq!((sets[0].queries, sets[1].queries), (1, 3));
        for set in &sets {
            assert!((set.first - 1.0).abs() < 1e-5, "{set:?}");
            assert!(
                set.first > set.tenth && set.tenth > set.hundredth,
                "{set:?}"
            );
            assert!(set.hundredth > set.median, "{set:?}");
            assert_eq!(
                (set.answer_in_ten, set.answer_rank_median),
                (1.0, 1),
                "{set:?}"
            );
        }
        let exact = [120, 3, 4];
        let rows = [
            Found::of(&exact, &[1, 2], &corpus.answers[2], ()),
            Found::of(&exact, &[3, 120], &corpus.answers[2], ()),
            Found::of(&exact, &[3, 120], &corpus.answers[3], ()),
        ];
        assert_eq!(answered_share(&rows, 0..3), 0.5);
        assert_eq!(recall(&rows, 0..3), 4.0 / 9.0);
    }

    #[test]
    fn centres_must_be_whole() {
        assert!(Codebook::new(4, vec![0.0; 6]).is_none());
        assert!(Codebook::new(4, Vec::new()).is_none());
        assert!(Codebook::train(&[], 4, 1).is_none());
    }
}
