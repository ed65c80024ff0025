//! The tantivy recall index, text and vectors (`vectors`, filled by `filler`): derived from the
//! rows of either backend, never the source of truth.
//!
//! Text is indexed, not stored: hits carry a key (`message id × 2` or `summary id × 2 + 1`) and
//! the text for snippets comes from SQLite. Each commit carries a payload with the highest
//! message and summary ids it holds (the watermark), so the index and its watermark change
//! atomically; on open the store indexes whatever SQLite has beyond it.
//!
//! Only the process that holds the index directory's writer lock changes the index (SQLite's
//! writer, `crate::sqlite` `writer/upkeep.rs`; a PostgreSQL node's follower, `crate::pg`
//! `follow.rs`); every other process reads it as last committed. The index heals itself and a
//! damaged one never makes the store fail: opening checks each committed segment's files and
//! probes every segment, and a damaged index is moved aside and built again; a search that
//! cannot read it marks it broken and answers from the database alone, and the maintainer
//! rebuilds it beside the live one and swaps it in ([`IndexSlot`]). Calls into tantivy that
//! could panic on damaged files run inside [`contained`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::{
    BooleanQuery, ConstScoreQuery, Occur, PhraseQuery, Query, RangeQuery, TermQuery,
};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::{DocAddress, Index, IndexReader, Order, ReloadPolicy};
use tantivy::{Term, doc};

use vilvona_embed::Embedder;

use crate::error::{IndexError, Result, StoreError};
use crate::tokenize::{RecallTokenizer, TOKENIZER, words};
use crate::types::{SearchMode, SearchOrder, SearchQuery, SearchTarget};

/// Memory for the index writer: modest, so the store's footprint does not grow with history.
const WRITER_HEAP_BYTES: usize = 24 * 1024 * 1024;

mod facts;
pub(crate) mod filler;
mod pipeline;
mod sink;
mod top;
mod vectors;
mod writing;

pub(crate) use sink::IndexSink;

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
/// hybrid search (the `locomo` bench).
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

#[cfg(test)]
mod tests;
