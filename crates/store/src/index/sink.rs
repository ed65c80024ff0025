//! The writing side of the index: documents added and removed as the store's writer thread
//! commits rows, embedded when the index commits, and the watermark each commit carries.
//!
//! A commit happens on a timer, after a number of documents, or when a caller waits for it (a
//! flush, a merge, a rebuild, a writer that stops). A local model's vectors are made as
//! documents arrive (`pipeline`); a timed commit takes only the documents whose vectors are
//! ready, and its watermark stops below the first one still waiting, so a commit never waits
//! for the model and searches read the rows past that point from the database. A flush waits
//! for every document. Removing a document drops it if it still waits. A whole fill (another
//! model, a lost index, a long catch-up) adds documents without vectors, for the `filler`.

use std::sync::Arc;
use std::time::Instant;

use tantivy::indexer::{LogMergePolicy, NoMergePolicy};
use tantivy::schema::Field;
use tantivy::{IndexWriter, TantivyDocument, Term, doc};

use vilvona_embed::Vectors;

use super::writing;
use super::{
    Fields, IndexDoc, IndexRow, IndexedRow, KIND_MESSAGE, KIND_SUMMARY, NOTHING_EMBEDDED,
    RecallIndex, SharedEmbedder, Waiting, Watermark, embed_documents, key_of, pipeline,
};
use crate::error::{Result, StoreError};

/// The writing side of the index, owned by the store's writer thread (tantivy's writer
/// itself is on a thread of its own, see `writing`).
pub(crate) struct IndexSink {
    pub(super) writer: writing::IndexThread,
    pub(super) fields: Fields,
    pub(super) embedder: SharedEmbedder,
    pub(super) watermark: Watermark,
    pub(super) pending: usize,
    pub(super) first_pending_at: Option<Instant>,
    /// Documents still to embed, with their text: they are embedded and added when the index
    /// commits (or before a removal, which must follow them), not while the rows' writer
    /// waits for its answer.
    pub(super) unembedded: Vec<Unembedded>,
    /// A local model's vectors made as documents arrive (see `pipeline`): started with the
    /// first document to embed.
    pub(super) pipeline: Option<pipeline::Pipeline>,
    /// Documents are added without vectors, for the filler to embed in the background (a
    /// whole index being rebuilt or caught up must not hold the store's open or its writer).
    pub(super) embed_later: bool,
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
