//! The tantivy recall index, text and vectors (`vectors`, filled by `filler`): derived from the
//! rows of either backend, never the source of truth.
//!
//! Text is indexed, not stored: hits carry a key (`message id × 2` or `summary id × 2 + 1`) and
//! the text for snippets comes from SQLite. Each commit carries a payload with the highest
//! message and summary ids it holds (the watermark), so the index and its watermark change
//! atomically; on open the store indexes whatever SQLite has beyond it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::indexer::{LogMergePolicy, NoMergePolicy};
use tantivy::query::{
    BooleanQuery, ConstScoreQuery, Occur, PhraseQuery, Query, RangeQuery, TermQuery,
};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::{DocAddress, Index, IndexReader, IndexWriter, Order, ReloadPolicy, TantivyDocument};
use tantivy::{Term, doc};

use vilvona_embed::{Embedder, Vectors};

use crate::error::{IndexError, Result, StoreError};
use crate::tokenize::{RecallTokenizer, TOKENIZER, words};
use crate::types::{SearchMode, SearchOrder, SearchQuery, SearchTarget};

/// Memory for the index writer: modest, so the store's footprint does not grow with history.
const WRITER_HEAP_BYTES: usize = 24 * 1024 * 1024;

mod facts;
pub(crate) mod filler;
mod pipeline;
mod top;
mod vectors;
mod writing;

/// What embeds the index's documents, when recall by meaning is on.
pub(crate) type SharedEmbedder = Option<Arc<dyn Embedder>>;

/// The vectors of a document that has nothing to embed (so it does not wait for any): one
/// byte, which no chunk's vectors are.
const NOTHING_EMBEDDED: [u8; 1] = [0];

const KIND_MESSAGE: u64 = 0;
const KIND_SUMMARY: u64 = 1;

/// Whether an index commit waits for the vectors still being made (see `pipeline`): an
/// explicit flush does; a commit on a timer, or before a search, does not.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiting {
    ForAll,
    ForNone,
}

/// The highest row ids the index holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Watermark {
    #[serde(rename = "m")]
    pub(crate) messages: i64,
    #[serde(rename = "s")]
    pub(crate) summaries: i64,
    /// On PostgreSQL, the last entry of the change log (`index_changes`) applied; always 0
    /// on SQLite, whose index work goes through `index_tasks`.
    #[serde(rename = "c", default, skip_serializing_if = "is_zero")]
    pub(crate) changes: i64,
}

fn is_zero(value: &i64) -> bool {
    *value == 0
}

#[derive(Clone, Copy)]
pub(crate) struct Fields {
    key: Field,
    conversation: Field,
    agent: Field,
    kind: Field,
    role: Field,
    time: Field,
    text: Field,
    /// Each document's chunk vectors, when the index embeds (the field's name names the model,
    /// so an index made with another model has another schema and is rebuilt).
    vectors: Option<Field>,
}

/// How a search applies its scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Score the words alone, pruning, and check the scope on fast fields (a scope holding
    /// most of the index).
    Prune,
    /// Intersect the words with the scope's postings (a scope that is a small part of it).
    Filter,
}

/// What a hit points at, decoded from its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum IndexedRow {
    Message(i64),
    Summary(i64),
}

pub(crate) fn key_of(row: IndexedRow) -> u64 {
    match row {
        IndexedRow::Message(id) => (id as u64) << 1,
        IndexedRow::Summary(id) => ((id as u64) << 1) | 1,
    }
}

fn row_of(key: u64) -> IndexedRow {
    let id = (key >> 1) as i64;
    if key & 1 == 0 {
        IndexedRow::Message(id)
    } else {
        IndexedRow::Summary(id)
    }
}

/// The vectors field's name for a model.
fn vectors_field(model: &str) -> String {
    // The stored format (four bits a dimension) is part of the name too.
    format!("vectors4 of {model}")
}

fn schema(embedder: Option<&dyn Embedder>) -> (Schema, Fields) {
    let mut builder = Schema::builder();
    let text_options = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    );
    let fields = Fields {
        key: builder.add_u64_field("key", INDEXED | FAST),
        conversation: builder.add_u64_field("conversation", INDEXED | FAST),
        agent: builder.add_text_field("agent", STRING),
        kind: builder.add_u64_field("kind", INDEXED | FAST),
        role: builder.add_text_field("role", STRING),
        time: builder.add_i64_field("time", INDEXED | FAST),
        text: builder.add_text_field("text", text_options),
        vectors: embedder
            .map(|embedder| builder.add_bytes_field(&vectors_field(embedder.name()), FAST)),
    };
    (builder.build(), fields)
}

/// Every data file of a committed segment ends with a footer of at least 8 bytes; a shorter
/// file is truncated. (tantivy itself panics on files of 4 to 7 bytes.) Files of segments the
/// last commit does not name (an interrupted write's leftovers) are not the index's.
fn check_files(dir: &Path) -> Result<()> {
    let Ok(meta) = std::fs::read_to_string(dir.join("meta.json")) else {
        return Ok(());
    };
    let committed: std::collections::HashSet<String> =
        serde_json::from_str::<serde_json::Value>(&meta)
            .ok()
            .and_then(|meta| meta.get("segments").cloned())
            .and_then(|segments| segments.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|segment| {
                segment
                    .get("segment_id")?
                    .as_str()
                    .map(|id| id.replace('-', ""))
            })
            .collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stem = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned());
        if !stem.is_some_and(|stem| committed.contains(&stem)) {
            continue;
        }
        let length = entry.metadata().map_or(0, |meta| meta.len());
        if length < 8 {
            return Err(StoreError::from(tantivy::TantivyError::SystemError(
                format!("{} is truncated ({length} bytes)", entry.path().display()),
            )));
        }
    }
    Ok(())
}

/// Runs index code that may panic on damaged files (a third-party library's arithmetic on
/// lengths it read), turning a panic into an error: the index is disposable, a panic there must
/// not take the store down.
pub(crate) fn contained<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    quiet_contained_panics();
    let outcome = CONTAINING.with(|depth| {
        depth.set(depth.get() + 1);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        depth.set(depth.get() - 1);
        outcome
    });
    outcome.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(StoreError::from(tantivy::TantivyError::SystemError(
            format!("reading the index panicked: {message}"),
        )))
    })
}

thread_local! {
    /// How deep this thread is in [`contained`] calls: a panic there becomes an error, and
    /// prints nothing of its own.
    static CONTAINING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Installs, once, a panic hook that stays silent for panics [`contained`] turns into errors
/// (a damaged index file: doctor reports it, tantivy's own panic text would only confuse) and
/// prints every other panic as before.
fn quiet_contained_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CONTAINING.with(std::cell::Cell::get) == 0 {
                previous(info);
            }
        }));
    });
}

fn mmap_directory(dir: &Path) -> Result<MmapDirectory> {
    MmapDirectory::open(dir).map_err(|error| {
        StoreError::from(tantivy::TantivyError::SystemError(format!(
            "{}: {error}",
            dir.display()
        )))
    })
}

/// A document to index.
#[derive(Clone, Copy)]
pub(crate) struct IndexDoc<'a> {
    pub(crate) row: IndexedRow,
    pub(crate) conversation: i64,
    pub(crate) agent: &'a str,
    pub(crate) role: &'a str,
    pub(crate) time_ms: i64,
    pub(crate) text: &'a str,
    /// For a message: the end of the message before it in its conversation (see
    /// [`neighbour_of`]); its vectors read the two together once.
    pub(crate) neighbour: Option<&'a str>,
}

/// Bytes of the message before a message that the message's neighbour vector reads: its end,
/// where the question a reply answers (or the answer a question follows up) is.
const NEIGHBOUR_BYTES: usize = 400;

/// The least a neighbour vector's similarity counts for (its length; the other vectors are
/// unit length): a message that says nearly nothing of its own ("Noted.") read with the one
/// before it is nearly that message, and must not pass it. The weight rises with the share of
/// the vector's text that is the message's own, to 1 from half (see [`embed_documents`]).
const NEIGHBOUR_WEIGHT: f32 = 0.7;

/// Bytes of a message's own start that its neighbour vector reads.
const NEIGHBOUR_HEAD_BYTES: usize = 600;

/// What a message's neighbour vector is made of, from the text of the message before it: its
/// last [`NEIGHBOUR_BYTES`] (`None` when it has no text).
pub(crate) fn neighbour_of(previous: &str) -> Option<String> {
    let previous = previous.trim_end();
    if previous.is_empty() {
        return None;
    }
    let mut from = previous.len().saturating_sub(NEIGHBOUR_BYTES);
    while !previous.is_char_boundary(from) {
        from += 1;
    }
    Some(previous[from..].to_owned())
}

/// The chunk vectors of documents: each text's own (at most its count), then, for a message
/// with a neighbour, one vector of the neighbour's end and the text's start read together,
/// weighted by how much of that is the message's own ([`NEIGHBOUR_WEIGHT`]). A reply ("Yes,
/// every Sunday morning with my cousin.") means little without what it answers: on the
/// natural-question set this vector added 6.5 points of recall@10 to meaning search and 4 to
/// hybrid search (BENCHMARKS.md).
pub(crate) fn embed_documents(
    embedder: &dyn Embedder,
    docs: &[(&str, usize, Option<&str>)],
) -> std::result::Result<Vec<Vec<Vec<f32>>>, vilvona_embed::EmbedError> {
    // (the joined text, its weight) of each document with a neighbour.
    let joined: Vec<Option<(String, f32)>> = docs
        .iter()
        .map(|(text, _, neighbour)| {
            neighbour.map(|neighbour| {
                let head = &text[..crate::tokenize::floor_boundary(text, NEIGHBOUR_HEAD_BYTES)];
                let own = head.len() as f32 / (head.len() + neighbour.len()).max(1) as f32;
                let weight = NEIGHBOUR_WEIGHT + (1.0 - NEIGHBOUR_WEIGHT) * (2.0 * own).min(1.0);
                (format!("{neighbour}\n{head}"), weight)
            })
        })
        .collect();
    let texts: Vec<(&str, usize)> = docs
        .iter()
        .map(|(text, most, _)| (*text, *most))
        .chain(joined.iter().flatten().map(|(text, _)| (text.as_str(), 1)))
        .collect();
    let mut embedded = embedder.embed_texts(&texts)?;
    let mut neighbours = embedded
        .split_off(docs.len().min(embedded.len()))
        .into_iter();
    for (chunks, joined) in embedded.iter_mut().zip(&joined) {
        let Some((_, weight)) = joined else {
            continue;
        };
        let neighbour = neighbours.next().unwrap_or_default();
        // A text with nothing to embed stays without vectors.
        if !chunks.is_empty() {
            chunks.extend(neighbour.into_iter().map(|mut vector| {
                vector.iter_mut().for_each(|x| *x *= weight);
                vector
            }));
        }
    }
    Ok(embedded)
}

/// A row to index, with its text extracted (owned: read from either database).
pub(crate) struct IndexRow {
    pub(crate) row: IndexedRow,
    pub(crate) conversation: i64,
    pub(crate) agent: String,
    pub(crate) role: String,
    pub(crate) time_ms: i64,
    pub(crate) text: String,
    /// See [`IndexDoc::neighbour`].
    pub(crate) neighbour: Option<String>,
}

impl IndexRow {
    pub(crate) fn conversation(&self) -> i64 {
        self.conversation
    }

    pub(crate) fn doc(&self) -> IndexDoc<'_> {
        IndexDoc {
            row: self.row,
            conversation: self.conversation,
            agent: &self.agent,
            role: &self.role,
            time_ms: self.time_ms,
            text: &self.text,
            neighbour: self.neighbour.as_deref(),
        }
    }
}

/// The index and a reader over it; shared by the writer thread and searchers. Whichever
/// process holds the index's writer lock maintains it; every other process (a second writer, a
/// read-only command) only reads it, reloading before each search.
pub(crate) struct RecallIndex {
    index: Index,
    reader: IndexReader,
    fields: Fields,
    dir: PathBuf,
    /// True while this process holds the writer lock (it reloads after its own commits).
    maintained_here: AtomicBool,
    /// The watermark of the commit the reader was last reloaded at, or an older one: the reader
    /// holds at least every row up to it, so searches read SQLite for the rows beyond it.
    reader_watermark: Mutex<Watermark>,
    /// A search could not read the index: its maintainer rebuilds it.
    broken: AtomicBool,
    /// What embeds its documents (and queries for them), if anything.
    embedder: SharedEmbedder,
    /// Segments' vectors, read once each up to a bound (`VILVONA_VECTOR_CACHE_MIB`).
    vector_cache: vectors::VectorCache,
    /// Segments' fact columns, opened once each.
    fact_cache: facts::FactCache,
}

/// The segments a searcher has (what the per-segment caches keep; the rest were merged away).
fn segment_ids(
    searcher: &tantivy::Searcher,
) -> std::collections::HashSet<tantivy::index::SegmentId> {
    searcher
        .segment_readers()
        .iter()
        .map(tantivy::SegmentReader::segment_id)
        .collect()
}

/// The index a store currently uses: a rebuild swaps a new one in.
pub(crate) struct IndexSlot(RwLock<Arc<RecallIndex>>);

impl IndexSlot {
    pub(crate) fn new(index: RecallIndex) -> IndexSlot {
        IndexSlot(RwLock::new(Arc::new(index)))
    }

    pub(crate) fn current(&self) -> Arc<RecallIndex> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, index: RecallIndex) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(index);
    }
}

impl RecallIndex {
    /// Opens the index in `dir`, creating it if the directory is missing or empty. Returns the
    /// index and whether it had to be created (so the caller indexes everything from SQLite).
    /// The index is disposable: one that cannot be opened or read (a missing or truncated
    /// file, another schema) is moved aside and recreated, never a reason to fail.
    pub(crate) fn open(dir: &Path, embedder: SharedEmbedder) -> Result<(RecallIndex, bool)> {
        match RecallIndex::open_or_create(dir, embedder.clone()) {
            Ok(opened) => Ok(opened),
            Err(problem) => {
                if let StoreError::Index(IndexError(tantivy::TantivyError::SchemaError(_))) =
                    problem
                {
                    tracing::info!(dir = %dir.display(), "the recall index was written by another build or with another embedding model; rebuilding it from the database");
                } else {
                    tracing::warn!(dir = %dir.display(), %problem, "the recall index is damaged; rebuilding it from the database");
                }
                let aside = dir.with_file_name(format!(
                    "{}.damaged-{}",
                    dir.file_name()
                        .and_then(|name| name.to_str())
                        .unwrap_or("index"),
                    vilvona_core::clock::now_ms()
                ));
                std::fs::rename(dir, &aside).map_err(|error| StoreError::io(dir, error))?;
                let opened = RecallIndex::open_or_create(dir, embedder)?;
                if let Err(error) = std::fs::remove_dir_all(&aside) {
                    tracing::warn!(dir = %aside.display(), %error, "could not remove the damaged index");
                }
                Ok((opened.0, true))
            }
        }
    }

    fn open_or_create(dir: &Path, embedder: SharedEmbedder) -> Result<(RecallIndex, bool)> {
        check_files(dir)?;
        contained(|| RecallIndex::open_or_create_unchecked(dir, embedder))
    }

    fn open_or_create_unchecked(
        dir: &Path,
        embedder: SharedEmbedder,
    ) -> Result<(RecallIndex, bool)> {
        let (schema, fields) = schema(embedder.as_deref());
        std::fs::create_dir_all(dir).map_err(|error| StoreError::io(dir, error))?;
        let directory = mmap_directory(dir)?;
        let exists = Index::exists(&directory).map_err(|error| {
            StoreError::from(tantivy::TantivyError::SystemError(format!(
                "{}: {error}",
                dir.display()
            )))
        })?;
        let index = if exists {
            let index = Index::open(directory)?;
            if index.schema() != schema {
                return Err(StoreError::from(tantivy::TantivyError::SchemaError(
                    "the index was written with another schema".to_owned(),
                )));
            }
            index
        } else {
            // Two processes may create a fresh store at once: whoever loses opens the winner's.
            match Index::create(directory.clone(), schema, tantivy::IndexSettings::default()) {
                Ok(index) => index,
                Err(_) => Index::open(directory)?,
            }
        };
        let opened = RecallIndex::with_reader(index, fields, dir, embedder)?;
        // Every segment's files must be readable: a probe search touches them all.
        opened.probe()?;
        Ok((opened, !exists))
    }

    /// Whether the index holds a row (a term query on its key).
    pub(crate) fn holds(&self, row: IndexedRow) -> Result<bool> {
        let query = TermQuery::new(
            Term::from_field_u64(self.fields.key, key_of(row)),
            IndexRecordOption::Basic,
        );
        Ok(self
            .reader
            .searcher()
            .search(&query, &tantivy::collector::Count)?
            > 0)
    }

    /// A search that reads every segment's term dictionary, postings and fast fields: fails
    /// when one of their files is missing or truncated.
    pub(crate) fn probe(&self) -> Result<()> {
        let searcher = self.reader.searcher();
        for segment in searcher.segment_readers() {
            segment.inverted_index(self.fields.text)?;
            segment.fast_fields().u64("key")?;
            if let Some(embedder) = &self.embedder {
                segment
                    .fast_fields()
                    .bytes(&vectors_field(embedder.name()))?;
            }
        }
        let query = TermQuery::new(
            Term::from_field_text(self.fields.text, "vilvona"),
            IndexRecordOption::WithFreqsAndPositions,
        );
        searcher.search(&query, &TopDocs::with_limit(1))?;
        Ok(())
    }

    /// The index's files whose contents no longer match their checksums (bytes overwritten in
    /// place: a probe reads only what a query touches, so it may not see them). Reads every
    /// file whole: for doctor, not for searches.
    pub(crate) fn damaged_files(&self) -> Result<Vec<PathBuf>> {
        let mut damaged: Vec<PathBuf> = self.index.validate_checksum()?.into_iter().collect();
        damaged.sort();
        Ok(damaged)
    }

    /// Opens an existing index for reading only: never creates, repairs or locks anything.
    /// `Ok(None)` when there is none; an error when it is there but cannot be read (searches
    /// then read SQLite alone, and the next writer rebuilds it).
    pub(crate) fn open_existing(
        dir: &Path,
        embedder: SharedEmbedder,
    ) -> Result<Option<RecallIndex>> {
        if !dir.exists() {
            return Ok(None);
        }
        check_files(dir)?;
        contained(|| RecallIndex::open_existing_unchecked(dir, embedder))
    }

    fn open_existing_unchecked(
        dir: &Path,
        embedder: SharedEmbedder,
    ) -> Result<Option<RecallIndex>> {
        let (schema, fields) = schema(embedder.as_deref());
        let directory = mmap_directory(dir)?;
        if !Index::exists(&directory).unwrap_or(false) {
            return Ok(None);
        }
        let index = Index::open(directory)?;
        if index.schema() != schema {
            return Err(StoreError::from(tantivy::TantivyError::SchemaError(
                "the index was written with another schema".to_owned(),
            )));
        }
        let opened = RecallIndex::with_reader(index, fields, dir, embedder)?;
        opened.probe()?;
        Ok(Some(opened))
    }

    fn with_reader(
        index: Index,
        fields: Fields,
        dir: &Path,
        embedder: SharedEmbedder,
    ) -> Result<RecallIndex> {
        index
            .tokenizers()
            .register(TOKENIZER, RecallTokenizer::default());
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let recall = RecallIndex {
            index,
            reader,
            fields,
            dir: dir.to_owned(),
            maintained_here: AtomicBool::new(false),
            reader_watermark: Mutex::new(Watermark::default()),
            broken: AtomicBool::new(false),
            embedder,
            vector_cache: vectors::VectorCache::configured(),
            fact_cache: facts::FactCache::default(),
        };
        recall.reload()?;
        Ok(recall)
    }

    /// The writer, if no other process holds the index's lock (`None` then: this process
    /// writes SQLite only and tries again later).
    pub(crate) fn try_writer(&self) -> Result<Option<IndexSink>> {
        self.try_writer_with_threads(1)
    }

    /// [`Self::try_writer`] with `threads` indexing threads (each with its own heap): for a
    /// rebuild, which indexes everything at once.
    fn try_writer_with_threads(&self, threads: usize) -> Result<Option<IndexSink>> {
        match self
            .index
            .writer_with_num_threads(threads, threads * WRITER_HEAP_BYTES)
        {
            Ok(writer) => {
                let writer = writing::IndexThread::start(writer, &self.dir)?;
                self.maintained_here.store(true, Ordering::SeqCst);
                Ok(Some(IndexSink {
                    writer,
                    fields: self.fields,
                    embedder: self.embedder.clone(),
                    watermark: self.watermark()?,
                    pending: 0,
                    first_pending_at: None,
                    unembedded: Vec::new(),
                    pipeline: None,
                    embed_later: false,
                }))
            }
            Err(tantivy::TantivyError::LockFailure(..)) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Records that reading the index failed (searches meanwhile read SQLite).
    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    /// Makes searches see the latest commit of whichever process maintains the index.
    pub(crate) fn refresh(&self) -> Result<()> {
        if self.maintained_here.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.reload()
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The watermark of the last commit.
    pub(crate) fn watermark(&self) -> Result<Watermark> {
        let metas = self.index.load_metas()?;
        Ok(metas
            .payload
            .and_then(|payload| serde_json::from_str(&payload).ok())
            .unwrap_or_default())
    }

    /// Number of documents visible to searches.
    pub(crate) fn doc_count(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Reloads the reader. The watermark is read before the reload, so the reader holds at
    /// least every row up to the watermark it records.
    pub(crate) fn reload(&self) -> Result<()> {
        let watermark = self.watermark()?;
        self.reader.reload()?;
        *self
            .reader_watermark
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = watermark;
        Ok(())
    }

    /// The rows the reader is known to hold (see `reader_watermark`). Read it before searching.
    pub(crate) fn searched_through(&self) -> Watermark {
        *self
            .reader_watermark
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a text or phrase search; returns the matching rows with their scores, best first
    /// (or newest first for [`SearchOrder::Recency`]).
    pub(crate) fn search(&self, query: &SearchQuery) -> Result<Vec<(IndexedRow, f32)>> {
        let searcher = self.reader.searcher();
        let plan = if query.order == SearchOrder::Relevance
            && self.mostly_in_scope(&searcher, &query.conversations)?
        {
            Plan::Prune
        } else {
            Plan::Filter
        };
        self.search_with(&searcher, query, plan)
    }

    /// The documents in scope nearest `vector` (the query's embedding), by cosine similarity,
    /// best first; none when the index does not embed.
    pub(crate) fn nearest(
        &self,
        query: &SearchQuery,
        vector: &[f32],
    ) -> Result<Vec<(IndexedRow, f32)>> {
        let Some(embedder) = &self.embedder else {
            return Ok(Vec::new());
        };
        let conversations = sorted_conversations(query);
        let scope = facts::Scope {
            conversations: &conversations,
            kind: target_kind(query.target),
            since_ms: query.since_ms,
            before_ms: query.before_ms,
        };
        let best = vectors::nearest(
            &self.reader.searcher(),
            &self.vector_cache,
            &self.fact_cache,
            &vectors_field(embedder.name()),
            vector,
            &scope,
            query.limit.max(1),
        )?;
        Ok(best
            .into_iter()
            .map(|(score, key)| (row_of(key), score))
            .collect())
    }

    /// Up to `limit` rows whose documents wait for vectors (see `filler`), in the index's
    /// order; none when the index does not embed.
    pub(crate) fn waiting_for_vectors(&self, limit: usize) -> Result<Vec<IndexedRow>> {
        let Some(embedder) = &self.embedder else {
            return Ok(Vec::new());
        };
        let keys = vectors::waiting(
            &self.reader.searcher(),
            &vectors_field(embedder.name()),
            limit,
        )?;
        Ok(keys.into_iter().map(row_of).collect())
    }

    /// What embeds this index's documents.
    pub(crate) fn embedder(&self) -> Option<&Arc<dyn Embedder>> {
        self.embedder.as_ref()
    }

    /// Whether the conversations hold at least half of the index's documents.
    fn mostly_in_scope(
        &self,
        searcher: &tantivy::Searcher,
        conversations: &[crate::types::ConversationId],
    ) -> Result<bool> {
        let mut in_scope = 0;
        for conversation in conversations {
            let term = Term::from_field_u64(self.fields.conversation, conversation.0 as u64);
            in_scope += searcher.doc_freq(&term)?;
        }
        Ok(in_scope * 2 >= searcher.num_docs())
    }

    fn search_with(
        &self,
        searcher: &tantivy::Searcher,
        query: &SearchQuery,
        plan: Plan,
    ) -> Result<Vec<(IndexedRow, f32)>> {
        let Some(text_query) = self.text_query(&query.text, query.mode) else {
            return Ok(Vec::new());
        };
        if query.conversations.is_empty() {
            return Ok(Vec::new());
        }
        let fields = self.fields;
        let kind = target_kind(query.target);
        let limit = query.limit.max(1);
        if plan == Plan::Prune {
            let conversations = sorted_conversations(query);
            let scope = facts::Scope {
                conversations: &conversations,
                kind,
                since_ms: query.since_ms,
                before_ms: query.before_ms,
            };
            let best = top::best(
                searcher,
                &self.fact_cache,
                text_query.as_ref(),
                &scope,
                limit,
            )?;
            return Ok(best
                .into_iter()
                .map(|(score, key)| (row_of(key), score))
                .collect());
        }
        // The scope's clauses filter; only the words score.
        let filter = |query: Box<dyn Query>| -> (Occur, Box<dyn Query>) {
            (Occur::Must, Box::new(ConstScoreQuery::new(query, 0.0)))
        };
        let conversations: Vec<(Occur, Box<dyn Query>)> = query
            .conversations
            .iter()
            .map(|conversation| {
                let term = Term::from_field_u64(fields.conversation, conversation.0 as u64);
                let clause: Box<dyn Query> =
                    Box::new(TermQuery::new(term, IndexRecordOption::Basic));
                (Occur::Should, clause)
            })
            .collect();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![
            (Occur::Must, text_query),
            filter(Box::new(BooleanQuery::new(conversations))),
        ];
        if let Some(kind) = kind {
            clauses.push(filter(Box::new(TermQuery::new(
                Term::from_field_u64(fields.kind, kind),
                IndexRecordOption::Basic,
            ))));
        }
        if query.since_ms.is_some() || query.before_ms.is_some() {
            use std::ops::Bound;
            let lower = query.since_ms.map_or(Bound::Unbounded, |since| {
                Bound::Included(Term::from_field_i64(fields.time, since))
            });
            let upper = query.before_ms.map_or(Bound::Unbounded, |before| {
                Bound::Excluded(Term::from_field_i64(fields.time, before))
            });
            clauses.push(filter(Box::new(RangeQuery::new(lower, upper))));
        }
        let boolean = BooleanQuery::new(clauses);
        let hits: Vec<(f32, DocAddress)> = match query.order {
            // Equal scores are ordered by key, newest row first: which rows make the cut does
            // not depend on how documents happen to be laid out in segments (a rebuild on
            // several threads, a merge).
            SearchOrder::Relevance => searcher
                .search(
                    &boolean,
                    &TopDocs::with_limit(limit).tweak_score(|segment: &tantivy::SegmentReader| {
                        let keys = segment.fast_fields().u64("key").ok();
                        move |doc: tantivy::DocId, score: tantivy::Score| {
                            let key = keys.as_ref().and_then(|keys| keys.first(doc)).unwrap_or(0);
                            (score, key)
                        }
                    }),
                )?
                .into_iter()
                .map(|((score, _), address)| (score, address))
                .collect(),
            SearchOrder::Recency => searcher
                .search(
                    &boolean,
                    &TopDocs::with_limit(limit).order_by_fast_field::<i64>("time", Order::Desc),
                )?
                .into_iter()
                .map(|(_, address)| (0.0, address))
                .collect(),
        };
        let mut rows = Vec::with_capacity(hits.len());
        for (score, address) in hits {
            let column = searcher
                .segment_reader(address.segment_ord)
                .fast_fields()
                .u64("key")?;
            if let Some(key) = column.first(address.doc_id) {
                rows.push((row_of(key), score));
            }
        }
        Ok(rows)
    }

    /// Text: any word (a CJK run counts as one word: the phrase of its bigrams). Phrase: every
    /// term at consecutive positions.
    fn text_query(&self, text: &str, mode: SearchMode) -> Option<Box<dyn Query>> {
        let field = self.fields.text;
        let phrase = |terms: &[String]| -> Box<dyn Query> {
            match terms {
                [one] => Box::new(TermQuery::new(
                    Term::from_field_text(field, one),
                    IndexRecordOption::WithFreqs,
                )),
                many => Box::new(PhraseQuery::new(
                    many.iter()
                        .map(|term| Term::from_field_text(field, term))
                        .collect(),
                )),
            }
        };
        let words = words(text);
        match mode {
            _ if words.is_empty() => None,
            SearchMode::Regex | SearchMode::Semantic | SearchMode::Hybrid => None,
            SearchMode::Phrase => {
                let terms: Vec<String> = words.into_iter().flat_map(|word| word.terms).collect();
                Some(phrase(&terms))
            }
            SearchMode::Text => Some(Box::new(BooleanQuery::new(
                words
                    .iter()
                    .map(|word| (Occur::Should, phrase(&word.terms)))
                    .collect(),
            ))),
        }
    }
}

impl IndexSlot {
    /// Builds a new index beside the current one with `fill`, then swaps it in: the current
    /// index stays whole until the new one is committed, so a failed rebuild never leaves less
    /// than there was. The caller must hold the current index's writer lock and drop its
    /// writer before the swap (`release`). Returns the new index's writer (its lock taken).
    pub(crate) fn rebuild_beside<T>(
        &self,
        fill: impl FnOnce(&mut IndexSink) -> Result<T>,
        release: impl FnOnce(),
    ) -> Result<(T, IndexSink)> {
        let dir = self.current().dir().to_owned();
        let name = dir
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("index");
        let fresh_dir = dir.with_file_name(format!("{name}.rebuild-{}", std::process::id()));
        let old_dir = dir.with_file_name(format!("{name}.old-{}", std::process::id()));
        for leftover in [&fresh_dir, &old_dir] {
            if leftover.exists() {
                std::fs::remove_dir_all(leftover)
                    .map_err(|error| StoreError::io(leftover, error))?;
            }
        }
        let embedder = self.current().embedder.clone();
        let filled = {
            let (fresh, _) = RecallIndex::open_or_create(&fresh_dir, embedder.clone())?;
            // Every core indexes (tantivy's threads); the writer is dropped after the fill.
            let threads = std::thread::available_parallelism()
                .map_or(1, |cores| cores.get())
                .clamp(1, 4);
            let mut sink = fresh
                .try_writer_with_threads(threads)?
                .ok_or_else(|| StoreError::IndexBusy(fresh_dir.clone()))?;
            sink.clear()?;
            let filled = fill(&mut sink)?;
            sink.commit()?;
            filled
        };
        release();
        // The index being replaced may be gone altogether (deleted under a running process).
        let replaced = dir.exists();
        if replaced {
            std::fs::rename(&dir, &old_dir).map_err(|error| StoreError::io(&dir, error))?;
        }
        if let Err(error) = std::fs::rename(&fresh_dir, &dir) {
            if replaced {
                let _ = std::fs::rename(&old_dir, &dir);
            }
            return Err(StoreError::io(&fresh_dir, error));
        }
        if replaced && let Err(error) = std::fs::remove_dir_all(&old_dir) {
            tracing::warn!(dir = %old_dir.display(), %error, "could not remove the replaced index");
        }
        let (swapped, _) = RecallIndex::open_or_create(&dir, embedder)?;
        let sink = swapped
            .try_writer()?
            .ok_or_else(|| StoreError::IndexBusy(dir.clone()))?;
        swapped.reload()?;
        self.replace(swapped);
        Ok((filled, sink))
    }
}

/// The query's conversations as the index keys them, sorted (a [`facts::Scope`]'s).
fn sorted_conversations(query: &SearchQuery) -> Vec<u64> {
    let mut conversations: Vec<u64> = query
        .conversations
        .iter()
        .map(|conversation| conversation.0 as u64)
        .collect();
    conversations.sort_unstable();
    conversations
}

/// The `kind` a search target keeps; `None` keeps both.
fn target_kind(target: SearchTarget) -> Option<u64> {
    match target {
        SearchTarget::Messages => Some(KIND_MESSAGE),
        SearchTarget::Summaries => Some(KIND_SUMMARY),
        SearchTarget::Both => None,
    }
}

/// The writing side of the index, owned by the store's writer thread (tantivy's writer
/// itself is on a thread of its own, see `writing`).
pub(crate) struct IndexSink {
    writer: writing::IndexThread,
    fields: Fields,
    embedder: SharedEmbedder,
    watermark: Watermark,
    pending: usize,
    first_pending_at: Option<Instant>,
    /// Documents still to embed, with their text: they are embedded and added when the index
    /// commits (or before a removal, which must follow them), not while the rows' writer
    /// waits for its answer.
    unembedded: Vec<Unembedded>,
    /// A local model's vectors made as documents arrive (see `pipeline`): started with the
    /// first document to embed.
    pipeline: Option<pipeline::Pipeline>,
    /// Documents are added without vectors, for the filler to embed in the background (a
    /// whole index being rebuilt or caught up must not hold the store's open or its writer).
    embed_later: bool,
}

/// A document that waits for its vectors until the index commits: its key, the document, its
/// text, how many chunks it may have, and its neighbour.
type Unembedded = (u64, TantivyDocument, String, usize, Option<String>);

impl IndexSink {
    pub(crate) fn watermark(&self) -> Watermark {
        self.watermark
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    pub(crate) fn first_pending_at(&self) -> Option<Instant> {
        self.first_pending_at
    }

    /// A row's document, without vectors.
    fn document(&self, doc: IndexDoc<'_>) -> TantivyDocument {
        let fields = self.fields;
        let kind = match doc.row {
            IndexedRow::Message(_) => KIND_MESSAGE,
            IndexedRow::Summary(_) => KIND_SUMMARY,
        };
        doc!(
            fields.key => key_of(doc.row),
            fields.conversation => doc.conversation as u64,
            fields.agent => doc.agent,
            fields.kind => kind,
            fields.role => doc.role,
            fields.time => doc.time_ms,
            fields.text => doc.text,
        )
    }

    pub(crate) fn add(&mut self, doc: IndexDoc<'_>) -> Result<()> {
        let fields = self.fields;
        let advances = match doc.row {
            IndexedRow::Message(id) => id > self.watermark.messages,
            IndexedRow::Summary(id) => id > self.watermark.summaries,
        };
        match doc.row {
            IndexedRow::Message(id) => self.watermark.messages = self.watermark.messages.max(id),
            IndexedRow::Summary(id) => self.watermark.summaries = self.watermark.summaries.max(id),
        }
        let document = self.document(doc);
        match &self.embedder {
            // A local model embeds when the index commits; a model behind an endpoint (or a
            // local one while a whole index is filled), in the background: the document waits
            // without vectors (see `waiting_for_vectors`).
            Some(embedder) if fields.vectors.is_some() && embedder.local() && !self.embed_later => {
                let job = (
                    doc.text.to_owned(),
                    vilvona_embed::chunks_for(doc.role),
                    doc.neighbour.map(str::to_owned),
                );
                if self.pipeline.is_none() {
                    self.pipeline = pipeline::Pipeline::start(embedder.clone());
                }
                match self.pipeline.as_mut() {
                    Some(pipeline) => {
                        pipeline.push(doc.row, advances, document, job);
                        if pipeline.len() > pipeline::MOST_WAITING {
                            self.add_embedded_until(pipeline::MOST_WAITING / 2)?;
                        }
                    }
                    None => self
                        .unembedded
                        .push((key_of(doc.row), document, job.0, job.1, job.2)),
                }
            }
            _ => {
                // Not before the documents that wait for their vectors (see `commit_ready`).
                self.add_embedded(true)?;
                self.add_document(document);
            }
        }
        self.pending += 1;
        self.first_pending_at.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Embeds the documents that wait for their vectors and adds them. A document the model
    /// could not embed is added without vectors (text search must not wait for the model).
    fn add_unembedded(&mut self) -> Result<()> {
        self.add_embedded(true)?;
        self.embed_unembedded()
    }

    /// Embeds and adds the documents that wait without the embedding thread (it could not
    /// start).
    fn embed_unembedded(&mut self) -> Result<()> {
        let (Some(field), Some(embedder)) = (self.fields.vectors, &self.embedder) else {
            return Ok(());
        };
        if self.unembedded.is_empty() {
            return Ok(());
        }
        let waiting = std::mem::take(&mut self.unembedded);
        let texts: Vec<(&str, usize, Option<&str>)> = waiting
            .iter()
            .map(|(_, _, text, most, neighbour)| (text.as_str(), *most, neighbour.as_deref()))
            .collect();
        let mut embedded = match embed_documents(&**embedder, &texts) {
            Ok(embedded) => embedded,
            Err(error) => {
                tracing::warn!(%error, documents = waiting.len(), "indexing documents without vectors");
                Vec::new()
            }
        }
        .into_iter();
        for (_, document, ..) in waiting {
            self.add_embedded_document(field, document, embedded.next())?;
        }
        Ok(())
    }

    /// Adds the documents whose vectors the embedding thread made (see `pipeline`); with
    /// `wait`, every one it was handed. One the model could not embed is added without
    /// vectors, for the filler.
    pub(crate) fn add_embedded(&mut self, wait: bool) -> Result<()> {
        self.add_embedded_until(if wait { 0 } else { usize::MAX })
    }

    /// [`Self::add_embedded`], after waiting until at most `left` documents wait.
    fn add_embedded_until(&mut self, left: usize) -> Result<()> {
        let (Some(field), Some(pipeline)) = (self.fields.vectors, self.pipeline.as_mut()) else {
            return Ok(());
        };
        if pipeline.is_empty() {
            return Ok(());
        }
        for (document, made) in pipeline.take(left) {
            let chunks = made
                .inspect_err(|error| tracing::warn!(%error, "indexing a document without vectors"))
                .ok();
            self.add_embedded_document(field, document, chunks)?;
        }
        Ok(())
    }

    /// Adds a document with its chunk vectors; `None`: not embedded, it waits for the filler.
    fn add_embedded_document(
        &mut self,
        field: Field,
        mut document: TantivyDocument,
        chunks: Option<Vec<Vec<f32>>>,
    ) -> Result<()> {
        match chunks {
            Some(chunks) if chunks.is_empty() => document.add_bytes(field, &NOTHING_EMBEDDED),
            Some(chunks) => document.add_bytes(field, &Vectors::encode(&chunks).0),
            None => {}
        }
        self.add_document(document);
        Ok(())
    }

    /// Hands a document to tantivy's writer (see `writing`).
    fn add_document(&self, document: TantivyDocument) {
        self.writer
            .post(move |writer| Ok(writer.add_document(document).map(drop)?));
    }

    /// Hands the removal of a row's document to tantivy's writer.
    fn delete_key(&self, key: u64) {
        let term = Term::from_field_u64(self.fields.key, key);
        self.writer.post(move |writer| {
            writer.delete_term(term);
            Ok(())
        });
    }

    /// The error of a change of the index made without waiting (a commit on the timer), once.
    pub(crate) fn failed(&self) -> Result<()> {
        self.writer.failed()
    }

    /// Whether documents added from now on wait for the filler's vectors (see `embed_later`).
    pub(crate) fn embed_later(&mut self, later: bool) {
        self.embed_later = later;
    }

    /// Adds a row's document again with the vectors made for it in the background (its old
    /// document, which waited without them, is removed first). Empty vectors (nothing to
    /// embed) are recorded as such, so the row stops waiting.
    pub(crate) fn add_with_vectors(&mut self, doc: IndexDoc<'_>, vectors: &[u8]) -> Result<()> {
        let Some(field) = self.fields.vectors else {
            return Ok(());
        };
        // This document replaces any of the row's that waits to be embedded.
        self.forget_waiting(key_of(doc.row));
        self.add_embedded(true)?;
        self.delete_key(key_of(doc.row));
        let mut document = self.document(doc);
        document.add_bytes(
            field,
            if vectors.is_empty() {
                &NOTHING_EMBEDDED
            } else {
                vectors
            },
        );
        self.add_document(document);
        self.pending += 1;
        self.first_pending_at.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Commits what was added, with the watermark as the commit's payload.
    pub(crate) fn commit(&mut self) -> Result<()> {
        self.add_unembedded()?;
        self.commit_added()
    }

    /// [`Self::commit`] or [`Self::commit_ready`].
    pub(crate) fn commit_waiting(&mut self, waiting: Waiting) -> Result<()> {
        match waiting {
            Waiting::ForAll => self.commit(),
            Waiting::ForNone => self.commit_ready(),
        }
    }

    /// Commits the documents whose vectors are made. Those still being made wait for a later
    /// commit, and the watermark committed stops below the first of them (searches read the
    /// rows beyond it from the database), so that a commit does not wait for the model.
    /// Except for a row indexed again (its old document's removal commits now, and what asked
    /// for it counts it done): then it waits for every document, as [`Self::commit`].
    pub(crate) fn commit_ready(&mut self) -> Result<()> {
        let again = self
            .pipeline
            .as_ref()
            .is_some_and(pipeline::Pipeline::holds_indexed_again);
        self.add_embedded(again)?;
        self.embed_unembedded()?;
        self.commit_added()
    }

    /// [`Self::commit_ready`] without waiting for it: the commit, then `index`'s reload, are
    /// made on tantivy's writer thread (see `writing`), so that the store's writer goes on
    /// with the next command; a failure is reported by [`Self::failed`] or the next call that
    /// waits. A row indexed again waits, as in `commit_ready`.
    pub(crate) fn commit_ready_behind(&mut self, index: Arc<RecallIndex>) -> Result<()> {
        if self
            .pipeline
            .as_ref()
            .is_some_and(pipeline::Pipeline::holds_indexed_again)
        {
            self.commit_ready()?;
            return index.reload();
        }
        self.add_embedded(false)?;
        self.embed_unembedded()?;
        let payload = self.payload()?;
        self.writer.post(move |writer| {
            commit_with(writer, &payload)?;
            index.reload()
        });
        self.committed();
        Ok(())
    }

    fn commit_added(&mut self) -> Result<()> {
        let payload = self.payload()?;
        self.writer
            .call(move |writer| commit_with(writer, &payload))?;
        self.committed();
        Ok(())
    }

    /// The payload of a commit of what was added: the watermark, below the first document
    /// still waiting for its vectors.
    fn payload(&self) -> Result<String> {
        let watermark = match &self.pipeline {
            Some(pipeline) => pipeline.below_waiting(self.watermark),
            None => self.watermark,
        };
        serde_json::to_string(&watermark).map_err(|error| StoreError::CorruptRow(error.to_string()))
    }

    /// What waits for the next commit, once one is made: the documents still being embedded.
    fn committed(&mut self) {
        match self.pipeline.as_ref().map_or(0, pipeline::Pipeline::len) {
            0 => {
                self.pending = 0;
                self.first_pending_at = None;
            }
            waiting => {
                self.pending = waiting;
                self.first_pending_at = Some(Instant::now());
            }
        }
    }

    /// Adds a row's document unless its conversation is archived (its rows stay out of the
    /// index; searches read them from SQLite), in which case the watermark only passes it.
    /// Returns whether a document was added.
    pub(crate) fn add_unless_archived(
        &mut self,
        row: &IndexRow,
        archived: &std::collections::HashSet<i64>,
    ) -> Result<bool> {
        if archived.contains(&row.conversation()) {
            self.pass(row.doc().row);
            Ok(false)
        } else {
            self.add(row.doc())?;
            Ok(true)
        }
    }

    /// Moves the watermark past a row that is deliberately not indexed (an archived
    /// conversation's).
    fn pass(&mut self, row: IndexedRow) {
        match row {
            IndexedRow::Message(id) => self.watermark.messages = self.watermark.messages.max(id),
            IndexedRow::Summary(id) => self.watermark.summaries = self.watermark.summaries.max(id),
        }
        self.pending += 1;
        self.first_pending_at.get_or_insert_with(Instant::now);
    }

    /// Merges every segment into one (dropping deleted documents) and removes files no commit
    /// uses, then commits: after forgetting, the index's files shrink.
    ///
    /// A merge the writer started in the background may take some of the segments while this
    /// one runs, and this one then fails (tantivy cannot find the segments it merged): no new
    /// background merge starts meanwhile, and the merge is tried again over what is there.
    pub(crate) fn merge_all(&mut self) -> Result<()> {
        const ATTEMPTS: usize = 8;
        self.add_unembedded()?;
        self.writer.call(|writer| {
            writer.set_merge_policy(Box::new(NoMergePolicy));
            let mut merged = Ok(());
            for _ in 0..ATTEMPTS {
                let segments = writer.index().searchable_segment_ids()?;
                let has_deletes = writer
                    .index()
                    .searchable_segment_metas()?
                    .iter()
                    .any(|meta| meta.has_deletes());
                if segments.len() <= 1 && !has_deletes {
                    merged = Ok(());
                    break;
                }
                merged = writer.merge(&segments).wait().map(drop);
                match &merged {
                    Err(tantivy::TantivyError::InvalidArgument(_)) => continue,
                    _ => break,
                }
            }
            writer.set_merge_policy(Box::new(LogMergePolicy::default()));
            merged?;
            writer.garbage_collect_files().wait()?;
            Ok(())
        })
    }

    /// Records that the change log was applied through `seq` (PostgreSQL).
    pub(crate) fn pass_changes(&mut self, seq: i64) {
        self.watermark.changes = self.watermark.changes.max(seq);
        self.pending += 1;
        self.first_pending_at.get_or_insert_with(Instant::now);
    }

    /// Removes a row's document (before re-adding it with new text).
    pub(crate) fn remove(&mut self, row: IndexedRow) {
        // Not yet added: it never will be.
        self.forget_waiting(key_of(row));
        self.delete_key(key_of(row));
        self.pending += 1;
        self.first_pending_at.get_or_insert_with(Instant::now);
    }

    /// Drops the row's document that waits for its vectors, if one does.
    fn forget_waiting(&mut self, key: u64) {
        self.unembedded.retain(|(waiting, ..)| *waiting != key);
        if let Some(pipeline) = self.pipeline.as_mut() {
            pipeline.drop_key(key);
        }
    }

    /// Drops every document (for a rebuild).
    pub(crate) fn clear(&mut self) -> Result<()> {
        self.unembedded.clear();
        if let Some(pipeline) = self.pipeline.as_mut() {
            pipeline.drop_all();
        }
        self.writer
            .call(|writer| Ok(writer.delete_all_documents().map(drop)?))?;
        self.watermark = Watermark::default();
        Ok(())
    }
}

/// Commits what `writer` was handed, with `payload` (the watermark), and waits for it.
fn commit_with(writer: &mut IndexWriter<TantivyDocument>, payload: &str) -> Result<()> {
    let mut prepared = writer.prepare_commit()?;
    prepared.set_payload(payload);
    prepared.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::types::ConversationId;

    const WORDS: [&str; 6] = ["alpha", "beta", "gamma", "delta", "告警阈值", "epsilon"];

    /// A document: conversation, kind (summary or not), time, words; and a query: words,
    /// conversations, target, a time range.
    type Doc = (u8, bool, i64, Vec<usize>);

    fn index_of(dir: &Path, docs: &[Doc], deleted: &[usize]) -> RecallIndex {
        let (index, _) = RecallIndex::open(dir, None).unwrap();
        let mut sink = index.try_writer().unwrap().unwrap();
        for (id, (conversation, summary, time, words)) in docs.iter().enumerate() {
            let text: Vec<&str> = words.iter().map(|word| WORDS[*word]).collect();
            let row = if *summary {
                IndexedRow::Summary(id as i64 + 1)
            } else {
                IndexedRow::Message(id as i64 + 1)
            };
            sink.add(IndexDoc {
                row,
                conversation: i64::from(*conversation),
                agent: "main",
                role: "user",
                time_ms: *time,
                text: &text.join(" "),
                neighbour: None,
            })
            .unwrap();
            // Several segments: the threshold carries from one to the next.
            if id % 7 == 6 {
                sink.commit().unwrap();
            }
        }
        for id in deleted.iter().filter(|id| **id < docs.len()) {
            let (_, summary, ..) = docs[*id];
            sink.remove(if summary {
                IndexedRow::Summary(*id as i64 + 1)
            } else {
                IndexedRow::Message(*id as i64 + 1)
            });
        }
        sink.commit().unwrap();
        index.reload().unwrap();
        index
    }

    /// The nearest documents, compared in pieces across the cores (several segments, several
    /// pieces each, a deleted document, a scope of one conversation, messages only, a time
    /// range), are the ones a plain walk over every document finds, with the same
    /// similarities.
    #[test]
    fn the_nearest_in_pieces_are_the_nearest_of_all() {
        const SUBJECTS: [&str; 8] = [
            "the harbour ferry",
            "my sister",
            "the database migration",
            "painting at night",
            "the staging cluster",
            "our team lunch",
            "a flaky test",
            "the quarterly report",
        ];
        const VERBS: [&str; 6] = [
            "leaves at noon",
            "was rescheduled",
            "helps me relax",
            "failed again",
            "needs a review",
            "moved to Friday",
        ];
        let dir = tempfile::tempdir().unwrap();
        let embedder: Arc<dyn Embedder> = vilvona_embed::builtin();
        let (index, _) =
            RecallIndex::open(&dir.path().join("index"), Some(embedder.clone())).unwrap();
        let mut sink = index.try_writer().unwrap().unwrap();
        let docs: Vec<(IndexedRow, i64, i64, String)> = (0..3_000_i64)
            .map(|id| {
                let row = if id % 5 == 4 {
                    IndexedRow::Summary(id + 1)
                } else {
                    IndexedRow::Message(id + 1)
                };
                let (a, b) = (
                    id as usize * 7 % SUBJECTS.len(),
                    id as usize * 11 % VERBS.len(),
                );
                // Every fourth note without its number: equal texts in every piece, whose
                // equal scores are ordered by key across the pieces.
                let text = if id % 4 == 0 {
                    format!("{} {}.", SUBJECTS[a], VERBS[b])
                } else {
                    format!("Note {id}: {} {}.", SUBJECTS[a], VERBS[b])
                };
                (row, id % 3, id * 1_000, text)
            })
            .collect();
        for (at, (row, conversation, time_ms, text)) in docs.iter().enumerate() {
            sink.add(IndexDoc {
                row: *row,
                conversation: *conversation,
                agent: "main",
                role: "user",
                time_ms: *time_ms,
                text,
                neighbour: None,
            })
            .unwrap();
            if at == 1_700 {
                sink.commit().unwrap();
            }
        }
        let deleted = IndexedRow::Message(1_201);
        sink.remove(deleted);
        sink.commit().unwrap();
        index.reload().unwrap();

        let question = "when does the ferry leave the harbour?";
        let vector = embedder.embed_query(question).unwrap().unwrap();
        let query = SearchQuery {
            agent_id: "main".to_owned(),
            conversations: vec![ConversationId(1)],
            text: question.to_owned(),
            mode: SearchMode::Semantic,
            target: SearchTarget::Messages,
            since_ms: Some(200_000),
            before_ms: Some(2_900_000),
            limit: 25,
            order: SearchOrder::Relevance,
        };
        let found = index.nearest(&query, &vector).unwrap();
        let quantised = vilvona_embed::QueryVector::new(&vector);
        let mut all: Vec<(f32, u64)> = docs
            .iter()
            .filter(|(row, conversation, time_ms, _)| {
                matches!(row, IndexedRow::Message(_))
                    && *row != deleted
                    && *conversation == 1
                    && (200_000..2_900_000).contains(time_ms)
            })
            .map(|(row, _, _, text)| {
                let chunks = embedder
                    .embed_texts(&[(text, vilvona_embed::chunks_for("user"))])
                    .unwrap()
                    .remove(0);
                (
                    vilvona_embed::nearness(&chunks, &quantised).unwrap(),
                    key_of(*row),
                )
            })
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        let expected: Vec<(IndexedRow, f32)> = all
            .into_iter()
            .take(query.limit)
            .map(|(similarity, key)| (row_of(key), similarity))
            .collect();
        assert_eq!(found, expected);

        // The same from a cache that holds both segments, one of them, or none (the rest
        // read from the index files at each search), searched twice each; and so for
        // every document in scope (the best 25 are all in the newer segment).
        let scope = facts::Scope {
            conversations: &[1],
            kind: target_kind(query.target),
            since_ms: query.since_ms,
            before_ms: query.before_ms,
        };
        let field = vectors_field(embedder.name());
        let searcher = index.reader.searcher();
        let nearest_from = |cache: &vectors::VectorCache, limit: usize| {
            let best = vectors::nearest(
                &searcher,
                cache,
                &index.fact_cache,
                &field,
                &vector,
                &scope,
                limit,
            );
            let best: Vec<(IndexedRow, f32)> = best
                .unwrap()
                .into_iter()
                .map(|(score, key)| (row_of(key), score))
                .collect();
            best
        };
        let all_held = vectors::VectorCache::holding(usize::MAX);
        assert_eq!(nearest_from(&all_held, query.limit), expected);
        let every = nearest_from(&all_held, docs.len());
        assert_eq!(every[..query.limit], expected);
        let both = all_held.held_bytes();
        for (limit, held) in [(both, both..=both), (both / 2, 1..=both - 1), (0, 0..=0)] {
            let cache = vectors::VectorCache::holding(limit);
            for _ in 0..2 {
                assert_eq!(
                    nearest_from(&cache, query.limit),
                    expected,
                    "holding {limit}"
                );
                assert_eq!(nearest_from(&cache, docs.len()), every, "holding {limit}");
            }
            assert!(held.contains(&cache.held_bytes()), "holding {limit} bytes");
        }

        // Merged into one segment (without the deleted document): what the two held is freed,
        // and the one left, smaller than both, is held in their place; the two segments'
        // columns are closed and the merged one's opened.
        assert_eq!(index.fact_cache.open_segments(), 2);
        sink.merge_all().unwrap();
        index.reload().unwrap();
        let merged = index.reader.searcher();
        assert_eq!(merged.segment_readers().len(), 1);
        let best = vectors::nearest(
            &merged,
            &all_held,
            &index.fact_cache,
            &field,
            &vector,
            &scope,
            query.limit,
        );
        assert_eq!(best.unwrap().len(), query.limit);
        assert!((1..both).contains(&all_held.held_bytes()));
        assert_eq!(index.fact_cache.open_segments(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Pruning with the scope on fast fields finds what intersecting with the scope's
        /// postings finds: the same best scores, each row with the score it has there.
        #[test]
        fn pruning_finds_what_filtering_finds(
            docs in prop::collection::vec(
                (0u8..4, any::<bool>(), 0i64..100, prop::collection::vec(0usize..WORDS.len(), 1..6)),
                1..60,
            ),
            deleted in prop::collection::vec(0usize..60, 0..5),
            query_words in prop::collection::vec(0usize..WORDS.len(), 1..4),
            conversations in prop::collection::btree_set(0u8..4, 1..4),
            target in prop_oneof![Just(SearchTarget::Both), Just(SearchTarget::Messages), Just(SearchTarget::Summaries)],
            since in prop::option::of(0i64..100),
            before in prop::option::of(0i64..100),
            phrase in any::<bool>(),
            limit in 1usize..8,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let index = index_of(&dir.path().join("index"), &docs, &deleted);
            let text: Vec<&str> = query_words.iter().map(|word| WORDS[*word]).collect();
            let mut query = SearchQuery {
                agent_id: "main".to_owned(),
                conversations: conversations.iter().map(|c| ConversationId(i64::from(*c))).collect(),
                text: text.join(" "),
                mode: if phrase { SearchMode::Phrase } else { SearchMode::Text },
                target,
                since_ms: since,
                before_ms: before,
                limit,
                order: SearchOrder::Relevance,
            };
            let searcher = index.reader.searcher();
            let pruned = index.search_with(&searcher, &query, Plan::Prune).unwrap();
            query.limit = docs.len();
            let all = index.search_with(&searcher, &query, Plan::Filter).unwrap();
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * a.abs().max(1.0);
            prop_assert_eq!(pruned.len(), all.len().min(limit));
            for ((_, got), (_, want)) in pruned.iter().zip(&all) {
                prop_assert!(close(*got, *want), "{got} vs {want}");
            }
            for (row, score) in &pruned {
                let there = all.iter().find(|(other, _)| other == row);
                prop_assert!(there.is_some_and(|(_, other)| close(*score, *other)), "{row:?}");
            }
        }
    }
}
