//! Embeddings for recall by meaning.
//!
//! A [`StaticModel`] holds one vector per vocabulary token; a text's embedding is the mean of
//! its tokens' vectors, normalised: no neural network runs, so a message is embedded in
//! microseconds and nothing is fetched. The built-in model ([`builtin`]) is distilled from
//! sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) by `scripts/convert-embedding-model.py`;
//! a model file in the same format (safetensors: `embeddings` I8 `[vocab, dims]`, `scales` F32
//! `[vocab]`, the vocabulary in the metadata) can be used instead ([`StaticModel::load`]).
//!
//! A text is embedded per sentence, up to [`MAX_CHUNKS`] chunks, so that a fact stated in one
//! sentence of a long message is not averaged away (a tool's output, up to
//! [`MAX_TOOL_OUTPUT_CHUNKS`]); a stored [`Vectors`] value holds them quantised to four bits
//! per dimension, and a query is compared with its best chunk.

#[cfg(feature = "test-endpoint")]
pub mod endpoint;
mod remote;
mod wordpiece;

pub use remote::{RemoteEmbedder, RemoteSettings};

use std::path::Path;
use std::sync::{Arc, OnceLock};

use wordpiece::Vocabulary;

/// Tokens of one chunk at most (a longer sentence is cut).
pub const CHUNK_TOKENS: usize = 48;
/// Bytes of a text that are embedded (the start of a longer one; its words are all in the
/// text index).
pub const MAX_EMBEDDED_BYTES: usize = 32 * 1024;
/// Most chunks a text is embedded as (a longer text's tokens are spread over this many).
pub const MAX_CHUNKS: usize = 8;
/// Most chunks a tool's output is embedded as: it is most of what is stored (files, logs),
/// its words are all in the text index, and what is said about it is embedded in full.
pub const MAX_TOOL_OUTPUT_CHUNKS: usize = 2;

/// Most chunks a row of this role (`summary` for a summary) is embedded as.
pub fn chunks_for(role: &str) -> usize {
    if role == "toolResult" || role == "tool" {
        MAX_TOOL_OUTPUT_CHUNKS
    } else {
        MAX_CHUNKS
    }
}

/// The built-in model's file (see the crate's documentation and the README for its origin).
const BUILTIN: &[u8] = include_bytes!("../model/minilm-l6-static-192.safetensors");

/// Why a model file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a model of this format.
    #[error("{what}: {problem}")]
    Format { what: String, problem: String },
}

/// Why texts could not be embedded (a model reached over the network).
#[derive(Clone, Debug, thiserror::Error)]
pub enum EmbedError {
    /// Not reachable now (a timeout, a refused connection, a rate limit, a server error, or
    /// credentials refused within the cooldown): worth trying again later.
    #[error("the embedding model is unavailable: {0}")]
    Unavailable(String),
    /// It answered with something that is not embeddings of the texts sent.
    #[error("the embedding model failed: {0}")]
    Failed(String),
}

/// What turns text into vectors: a name (recorded with the vectors it made, so that another
/// model's vectors are never compared with them) and the embedding.
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// The model's name, as recorded with its vectors.
    fn name(&self) -> &str;

    /// Each text's chunk vectors, normalised, at most as many as the number paired with it
    /// (none for a text with nothing to embed), in the texts' order.
    fn embed_texts(&self, texts: &[(&str, usize)]) -> Result<Vec<Vec<Vec<f32>>>, EmbedError>;

    /// One normalised vector for the whole text (a query); `None` when there is nothing to
    /// embed.
    fn embed_query(&self, text: &str) -> Result<Option<Vec<f32>>, EmbedError>;

    /// Whether embedding is local computation (microseconds, no network): rows can then be
    /// embedded as they are committed or read. A model behind an endpoint embeds in the
    /// background instead.
    fn local(&self) -> bool {
        true
    }
}

/// A static embedding model: a vector per vocabulary token.
pub struct StaticModel {
    name: String,
    dims: usize,
    vocabulary: Vocabulary,
    /// `vocab × dims` quantised values; token `t`'s vector is `values[t] * scales[t]`.
    values: Vec<i8>,
    scales: Vec<f32>,
}

impl std::fmt::Debug for StaticModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticModel")
            .field("name", &self.name)
            .field("dims", &self.dims)
            .field("vocabulary", &self.vocabulary.len())
            .finish()
    }
}

/// The built-in model, read once per process.
pub fn builtin() -> Arc<StaticModel> {
    static MODEL: OnceLock<Arc<StaticModel>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            // The file is part of the build; a broken one fails every test that embeds.
            #[allow(clippy::expect_used)]
            Arc::new(
                StaticModel::parse(BUILTIN, "the built-in model")
                    .expect("the built-in embedding model is well-formed"),
            )
        })
        .clone()
}

impl StaticModel {
    /// Reads a model file (the built-in model's format).
    pub fn load(path: &Path) -> Result<StaticModel, ModelError> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })?;
        StaticModel::parse(&bytes, &path.display().to_string())
    }

    /// Parses a model from a safetensors file's bytes; `what` names it in errors.
    pub fn parse(bytes: &[u8], what: &str) -> Result<StaticModel, ModelError> {
        let problem = |problem: &str| ModelError::Format {
            what: what.to_owned(),
            problem: problem.to_owned(),
        };
        let header_length = bytes
            .get(..8)
            .map(|length| u64::from_le_bytes(length.try_into().unwrap_or_default()) as usize)
            .ok_or_else(|| problem("shorter than a safetensors header"))?;
        let header: serde_json::Value = bytes
            .get(8..8usize.saturating_add(header_length))
            .and_then(|text| serde_json::from_slice(text).ok())
            .ok_or_else(|| problem("the safetensors header is not JSON"))?;
        let data = &bytes[8 + header_length..];
        let metadata = &header["__metadata__"];
        let text = |key: &str| {
            metadata[key]
                .as_str()
                .ok_or_else(|| problem(&format!("the metadata has no {key:?}")))
        };
        if text("tokenizer")? != "bert-wordpiece-uncased" || text("pooling")? != "mean" {
            return Err(problem(
                "only tokenizer \"bert-wordpiece-uncased\" with \"mean\" pooling is supported",
            ));
        }
        let tensor = |name: &str, dtype: &str| -> Result<(&[u8], Vec<usize>), ModelError> {
            let info = &header[name];
            if info["dtype"] != dtype {
                return Err(problem(&format!("tensor {name:?} is not {dtype}")));
            }
            let shape: Vec<usize> = info["shape"]
                .as_array()
                .map(|dims| {
                    dims.iter()
                        .filter_map(|d| d.as_u64())
                        .map(|d| d as usize)
                        .collect()
                })
                .unwrap_or_default();
            let range = info["data_offsets"]
                .as_array()
                .and_then(|offsets| Some((offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?)))
                .and_then(|(start, end)| data.get(start as usize..end as usize))
                .ok_or_else(|| problem(&format!("tensor {name:?} lies outside the file")))?;
            Ok((range, shape))
        };
        let (values, shape) = tensor("embeddings", "I8")?;
        let (scales, scale_shape) = tensor("scales", "F32")?;
        let [tokens, dims] = shape[..] else {
            return Err(problem("\"embeddings\" is not two-dimensional"));
        };
        let vocabulary: Vec<&str> = text("vocab")?.split('\n').collect();
        if vocabulary.len() != tokens
            || scale_shape != [tokens]
            || values.len() != tokens * dims
            || scales.len() != tokens * 4
            || dims == 0
        {
            return Err(problem(
                "the vocabulary, embeddings and scales disagree in size",
            ));
        }
        if !dims.is_multiple_of(2) {
            // Stored vectors hold two dimensions a byte.
            return Err(problem("the embeddings have an odd number of dimensions"));
        }
        let scales: Vec<f32> = scales
            .chunks_exact(4)
            .map(|bytes| f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
            .collect();
        Ok(StaticModel {
            name: text("name")?.to_owned(),
            dims,
            vocabulary: Vocabulary::new(vocabulary),
            values: values.iter().map(|byte| *byte as i8).collect(),
            scales,
        })
    }

    /// The mean of the tokens' vectors, normalised; `None` without tokens.
    fn pool(&self, tokens: &[u32]) -> Option<Vec<f32>> {
        if tokens.is_empty() {
            return None;
        }
        let mut sum = vec![0.0_f32; self.dims];
        for token in tokens {
            let at = *token as usize * self.dims;
            let scale = self.scales[*token as usize];
            for (total, value) in sum.iter_mut().zip(&self.values[at..at + self.dims]) {
                *total += f32::from(*value) * scale;
            }
        }
        normalised(sum)
    }

    fn tokens(&self, text: &str) -> Vec<u32> {
        let mut tokens = Vec::new();
        self.vocabulary.pieces(text, |id| tokens.push(id));
        tokens
    }
}

impl StaticModel {
    /// Dimensions of each vector.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The text's chunk vectors (at most `most`), each normalised; none for a text with no
    /// known token.
    pub fn embed_chunks(&self, text: &str, most: usize) -> Vec<Vec<f32>> {
        let most = most.max(1);
        // Sentences, each its tokens (a sentence longer than a chunk is cut): a fact stated in
        // one sentence of a long message keeps a vector of its own instead of being averaged
        // into the rest.
        let text = &text[..floor_char_boundary(text, MAX_EMBEDDED_BYTES)];
        let mut pieces: Vec<Vec<u32>> = Vec::new();
        for sentence in sentences(text) {
            let tokens = self.tokens(sentence);
            pieces.extend(tokens.chunks(CHUNK_TOKENS).map(<[u32]>::to_vec));
        }
        let lengths: Vec<usize> = pieces.iter().map(Vec::len).collect();
        grouped(&lengths, most)
            .into_iter()
            .filter_map(|group| self.pool(&pieces[group].concat()))
            .collect()
    }

    /// One normalised vector for the whole text; `None` when no token is known.
    pub fn embed(&self, text: &str) -> Option<Vec<f32>> {
        self.pool(&self.tokens(text))
    }
}

impl Embedder for StaticModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn embed_texts(&self, texts: &[(&str, usize)]) -> Result<Vec<Vec<Vec<f32>>>, EmbedError> {
        Ok(texts
            .iter()
            .map(|(text, most)| self.embed_chunks(text, *most))
            .collect())
    }

    fn embed_query(&self, text: &str) -> Result<Option<Vec<f32>>, EmbedError> {
        Ok(self.embed(text))
    }
}

/// Consecutive pieces (of these lengths) grouped into at most `most` chunks: each piece its
/// own chunk when there are few enough, else groups of about equal length. (Grouping a short
/// text's sentences too, to store fewer vectors, costs most of the recall: a fact stated in
/// passing is averaged with its neighbours.)
fn grouped(lengths: &[usize], most: usize) -> Vec<std::ops::Range<usize>> {
    let most = most.max(1);
    if lengths.len() <= most {
        return (0..lengths.len()).map(|at| at..at + 1).collect();
    }
    let share = lengths.iter().sum::<usize>().div_ceil(most);
    let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
    let mut length = 0;
    for (at, piece) in lengths.iter().enumerate() {
        let starts = length > 0 && length + piece > share && groups.len() < most;
        match groups.last_mut() {
            Some(last) if !starts => {
                last.end = at + 1;
                length += piece;
            }
            _ => {
                groups.push(at..at + 1);
                length = *piece;
            }
        }
    }
    groups
}

/// The largest char boundary at or below `index`.
fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    if index >= text.len() {
        return text.len();
    }
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// The text's sentences: cut after `.`, `!`, `?` and their full-width forms, and at line
/// breaks.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let rest_trimmed = rest.trim_start();
        if rest_trimmed.is_empty() {
            return None;
        }
        let mut end = rest_trimmed.len();
        let mut chars = rest_trimmed.char_indices().peekable();
        while let Some((at, ch)) = chars.next() {
            let closes = match ch {
                '\n' | '。' | '！' | '？' => true,
                '.' | '!' | '?' => chars.peek().is_none_or(|(_, next)| next.is_whitespace()),
                _ => false,
            };
            if closes {
                end = at + ch.len_utf8();
                break;
            }
        }
        let (sentence, after) = rest_trimmed.split_at(end);
        rest = after;
        Some(sentence)
    })
}

fn normalised(mut vector: Vec<f32>) -> Option<Vec<f32>> {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return None;
    }
    for x in &mut vector {
        *x /= norm;
    }
    Some(vector)
}

/// A text's chunk vectors as stored: per chunk a little-endian `f32` scale, then four bits
/// per dimension, two dimensions a byte (the even one in the low half), each a value from −7
/// to 7 stored plus 8 (`value × scale` is the normalised vector's component). Four bits keep
/// the similarities within about 0.01 of the exact ones, at half the size of a byte each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vectors(pub Vec<u8>);

/// Largest stored value.
const LEVELS: f32 = 7.0;
/// What is added to a value to store it (so that it is never negative).
const OFFSET: f32 = 8.0;

impl Vectors {
    /// Quantises normalised chunk vectors (of an even number of dimensions).
    pub fn encode(chunks: &[Vec<f32>]) -> Vectors {
        let mut bytes = Vec::new();
        for chunk in chunks {
            let largest = chunk.iter().fold(0.0_f32, |max, x| max.max(x.abs()));
            let scale = if largest > 0.0 { largest / LEVELS } else { 1.0 };
            bytes.extend_from_slice(&scale.to_le_bytes());
            let level = |x: f32| ((x / scale).round().clamp(-LEVELS, LEVELS) + OFFSET) as u8;
            bytes.extend(
                chunk
                    .chunks_exact(2)
                    .map(|pair| level(pair[0]) | (level(pair[1]) << 4)),
            );
        }
        Vectors(bytes)
    }

    /// The best cosine similarity between the query and any chunk; `None` when there are no
    /// chunks of the query's dimensions.
    pub fn best_similarity(bytes: &[u8], query: &QueryVector) -> Option<f32> {
        let pairs = query.even.len();
        let mut best: Option<f32> = None;
        // Chunk by chunk, not `chunks_exact`: its remainder costs a division per document.
        let mut rest = bytes;
        while let Some((chunk, after)) = rest.split_at_checked(4 + pairs) {
            rest = after;
            let scale = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let values = &chunk[4..];
            let (blocks, tail) = values.as_chunks::<BLOCK>();
            let (even_blocks, even_tail) = query.even.as_chunks::<BLOCK>();
            let (high_blocks, _) = query.high.as_chunks::<BLOCK>();
            let mut lanes = [0_i32; LANES];
            for ((values, even), high) in blocks.iter().zip(even_blocks).zip(high_blocks) {
                add_block(values, even, high, &mut lanes);
            }
            let mut dot: i32 = lanes.iter().sum();
            let odd_tail = &query.odd[pairs - tail.len()..];
            for ((value, even), odd) in tail.iter().zip(even_tail).zip(odd_tail) {
                let pair = i32::from(*value);
                dot += (pair & 0x0F) * i32::from(*even) + (pair >> 4) * i32::from(*odd);
            }
            // Σ (stored − 8) × q is Σ stored × q − 8 × Σ q.
            let similarity = (dot - OFFSET as i32 * query.sum) as f32 * scale * query.scale;
            best = Some(best.map_or(similarity, |best| best.max(similarity)));
        }
        // A value that is not whole chunks of the query's size is not compared.
        if rest.is_empty() { best } else { None }
    }
}

/// Pairs of dimensions compared as one block (a stored vector's bytes; the built-in model's
/// 192 dimensions are one; the pairs after a model's whole blocks are compared one by one).
/// With blocks of 64 the built-in model's last 32 pairs were such a tail: 47 ns a chunk
/// against 16 ns with one block (the `meaning` criterion bench, one run each).
const BLOCK: usize = 96;
/// Sums kept apart: sixteen 16-bit lanes (two SSE2 registers).
const LANES: usize = 16;

/// `Σ stored × q` over a block of stored bytes (two dimensions each), from the query's even
/// values and its `high` ones (see [`QueryVector`]): a byte `b` holding `lo + 16 × hi`
/// contributes `lo × even + hi × odd`, which is `b × even + hi × (odd − 16 × even)` — the
/// whole byte and its high half, no masking of the low one. Whole numbers in 16-bit lanes,
/// wrapping: the two products can each be up to 32,385 in size, but their sum is a pair's
/// true `lo × even + hi × odd`, under 3,810 in size (a stored value is at most 15, a query's
/// at most 127), so arithmetic modulo 2¹⁶ gives it exactly, and a lane's sums (at most
/// `96 / 16 = 6`) stay under 32,768; each lane is then added to `total`'s (32 bits). Arrays
/// of one known length, and the lanes summed apart, let the compiler make this a vector loop
/// of 16-bit lanes.
#[inline(always)]
fn add_block(
    values: &[u8; BLOCK],
    even: &[i16; BLOCK],
    high: &[i16; BLOCK],
    total: &mut [i32; LANES],
) {
    const { assert!(BLOCK.is_multiple_of(LANES) && BLOCK / LANES <= 8) };
    let mut products = [0_i16; BLOCK];
    for i in 0..BLOCK {
        let byte = i16::from(values[i]);
        products[i] = byte
            .wrapping_mul(even[i])
            .wrapping_add((byte >> 4).wrapping_mul(high[i]));
    }
    let mut lanes = [0_i16; LANES];
    for block in 0..BLOCK / LANES {
        for lane in 0..LANES {
            lanes[lane] = lanes[lane].wrapping_add(products[block * LANES + lane]);
        }
    }
    for (total, lane) in total.iter_mut().zip(lanes) {
        *total += i32::from(lane);
    }
}

/// A query's vector quantised as stored vectors are, for comparing with many of them.
#[derive(Clone, Debug)]
pub struct QueryVector {
    /// The even dimensions' values and the odd ones' (as stored vectors pair them).
    even: Vec<i16>,
    odd: Vec<i16>,
    /// Per pair, `odd − 16 × even` (what a stored byte's high half is multiplied by when the
    /// whole byte is multiplied by the even value: see `block_dot`).
    high: Vec<i16>,
    scale: f32,
    /// The values' sum.
    sum: i32,
}

impl QueryVector {
    /// Quantises a normalised vector.
    pub fn new(vector: &[f32]) -> QueryVector {
        let largest = vector.iter().fold(0.0_f32, |max, x| max.max(x.abs()));
        let scale = if largest > 0.0 { largest / 127.0 } else { 1.0 };
        let values: Vec<i16> = vector
            .iter()
            .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i16)
            .collect();
        let sum = values.iter().map(|value| i32::from(*value)).sum();
        let (even, odd): (Vec<i16>, Vec<i16>) = values
            .chunks_exact(2)
            .map(|pair| (pair[0], pair[1]))
            .unzip();
        let high = even
            .iter()
            .zip(&odd)
            .map(|(even, odd)| odd - 16 * even)
            .collect();
        QueryVector {
            even,
            odd,
            high,
            scale,
            sum,
        }
    }
}

/// The best cosine similarity between `query` and any of a text's chunk vectors as they
/// would be stored (so that a row read from the database scores exactly as the index scores
/// it); `None` when there are none.
pub fn nearness(chunks: &[Vec<f32>], query: &QueryVector) -> Option<f32> {
    Vectors::best_similarity(&Vectors::encode(chunks).0, query)
}

/// Cosine similarity of two normalised vectors.
pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_model_places_meaning_near_meaning() {
        let model = builtin();
        assert_eq!(model.dims(), 192);
        let v = |text: &str| model.embed(text).unwrap();
        let relax = v("painting helps me relax after work");
        assert!(
            similarity(&relax, &v("what does he do to unwind?"))
                > similarity(&relax, &v("the deploy failed with a timeout")),
            "relax is nearer unwind than a deploy"
        );
        let dog = v("my dog needs a walk");
        assert!(
            similarity(&dog, &v("the puppy wants to go outside"))
                > similarity(&dog, &v("quarterly tax filing"))
        );
        assert!(model.embed("").is_none() && model.embed("   ").is_none());
    }

    #[test]
    fn stored_vectors_keep_the_similarity_and_long_texts_keep_their_parts() {
        let model = builtin();
        let query = model.embed("database password rotation").unwrap();
        let chunks = model.embed_chunks(
            "the ticket for the staging database password rotation is OPS-1",
            MAX_CHUNKS,
        );
        assert_eq!(chunks.len(), 1);
        let exact = similarity(&chunks[0], &query);
        let stored =
            Vectors::best_similarity(&Vectors::encode(&chunks).0, &QueryVector::new(&query))
                .unwrap();
        assert!((exact - stored).abs() < 0.02, "{exact} vs {stored}");
        // A fact in the middle of a long text still has a chunk of its own to match.
        let long = format!(
            "{} the ticket for the staging database password rotation is OPS-1 {}",
            "compile the crate and run the linter. ".repeat(120),
            "upload the artefacts and tag the release. ".repeat(120)
        );
        let chunks = model.embed_chunks(&long, MAX_CHUNKS);
        assert_eq!(chunks.len(), MAX_CHUNKS);
        assert_eq!(
            model.embed_chunks(&long, chunks_for("toolResult")).len(),
            MAX_TOOL_OUTPUT_CHUNKS
        );
        let best = Vectors::best_similarity(&Vectors::encode(&chunks).0, &QueryVector::new(&query))
            .unwrap();
        let whole = similarity(&model.embed(&long).unwrap(), &query);
        assert!(best > whole, "{best} vs the whole text's {whole}");
        assert_eq!(
            Vectors::best_similarity(&[1, 2, 3], &QueryVector::new(&query)),
            None
        );
    }

    /// The blocked whole-number comparison against the stored values decoded and multiplied
    /// in floats: any number of dimensions (whole blocks, a remainder, both), and the largest
    /// values every lane can hold (all dimensions of one size, so that each is stored as ±7
    /// and the query's as ±127).
    #[test]
    fn stored_vectors_compare_as_their_decoded_values_do() {
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 2_001) as f32 / 1_000.0 - 1.0
        };
        for dims in [2, 128, 192, 200, 384, 1_536] {
            let random = normalised((0..dims).map(|_| next()).collect()).unwrap();
            let even = normalised((0..dims).map(|_| 1.0).collect()).unwrap();
            let against = normalised(
                (0..dims)
                    .map(|d| if d % 3 == 0 { -1.0 } else { 1.0 })
                    .collect(),
            )
            .unwrap();
            for (chunk, query) in [
                (&random, &even),
                (&even, &even),
                (&even, &against),
                (&against, &against),
            ] {
                let stored = Vectors::encode(std::slice::from_ref(chunk));
                let scale = f32::from_le_bytes(stored.0[..4].try_into().unwrap());
                let decoded: Vec<f32> = stored.0[4..]
                    .iter()
                    .flat_map(|pair| [pair & 0x0F, pair >> 4])
                    .map(|level| (f32::from(level) - OFFSET) * scale)
                    .collect();
                let quantised = QueryVector::new(query);
                let query_values: Vec<f32> = quantised
                    .even
                    .iter()
                    .zip(&quantised.odd)
                    .flat_map(|(even, odd)| [*even, *odd])
                    .map(|value| f32::from(value) * quantised.scale)
                    .collect();
                let expected = similarity(&decoded, &query_values);
                let found = Vectors::best_similarity(&stored.0, &quantised).unwrap();
                assert!(
                    (expected - found).abs() < 1e-4,
                    "{dims} dimensions: {found} against {expected}"
                );
            }
        }
    }

    #[test]
    fn a_file_that_is_not_a_model_is_named_with_its_problem() {
        for (bytes, problem) in [
            (&b"abc"[..], "shorter than a safetensors header"),
            (&b"\x04\0\0\0\0\0\0\0{]}]"[..], "not JSON"),
            (&b"\x02\0\0\0\0\0\0\0{}"[..], "has no \"tokenizer\""),
        ] {
            let error = StaticModel::parse(bytes, "model.safetensors")
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("model.safetensors: ") && error.contains(problem),
                "{error}"
            );
        }
    }
}
