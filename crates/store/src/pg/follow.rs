//! Each node's own recall index over the shared database: a tantivy index (the same schema,
//! tokenizer and queries as on SQLite) that follows the database by id watermark.
//!
//! - Rows are indexed in id order. Ids are allocated in commit order (every transaction that
//!   takes one holds [`ROW_ORDER_LOCK`] until it commits), so once the follower has seen id
//!   N, every row below N is committed or never will be: the watermark never passes a row
//!   that is still to come.
//! - What changes rows that are already indexed (forgetting, rewriting a summary) appends
//!   their keys to `index_changes` in the same transaction; the follower removes each
//!   document and adds it again when the row still exists. The change log follows the same
//!   ordering rule, with its own watermark.
//! - The process holding the index directory's writer lock follows: on open, every half
//!   second in the background, and before each of its searches. Every other process reads
//!   the index as last committed, and searches find the rows beyond it in the database.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use vilvona_core::AgentMessage;

use super::Sql;

use super::at;
use crate::blobs::{BLOB_ID_KEY, INDEXED_BLOB_BYTES};
use crate::error::{Result, StoreError};
use crate::index::filler::{FILL_BATCH, VectorFiller};
use crate::index::{
    IndexRow, IndexSink, IndexedRow, RecallIndex, SharedEmbedder, Waiting, Watermark, neighbour_of,
};

/// Taken (for the rest of the transaction) before a transaction allocates a row id or a
/// change-log entry: ids become visible in the order they were allocated.
pub(crate) const ROW_ORDER_LOCK: i64 = 0x0076_696c_766f_6e62;

/// Rows read from the database per batch while following.
const BATCH: i64 = 1024;

/// A node's index and, while this process holds its lock, its writer.
pub(crate) struct Follower {
    index: RecallIndex,
    sink: Mutex<Option<IndexSink>>,
    /// Serializes following (the background task and searches may both ask).
    following: tokio::sync::Mutex<()>,
    /// Makes vectors in the background (see `index::filler`).
    filler: Mutex<Option<VectorFiller>>,
    /// The index was created when opened: its first following leaves the vectors to the
    /// filler (a new model's index, a new node).
    whole: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("dir", &self.index.dir())
            .finish()
    }
}

impl Follower {
    /// Opens (or creates) the index in `dir` and takes its writer lock if it is free.
    pub(crate) fn open(dir: &Path, embedder: SharedEmbedder) -> Result<Follower> {
        let (index, created) = RecallIndex::open(dir, embedder)?;
        let sink = index.try_writer()?;
        let filler = VectorFiller::for_embedder(index.embedder());
        if sink.is_none() {
            tracing::info!(dir = %dir.display(), "another process maintains this node's recall index; this one reads it");
        }
        Ok(Follower {
            index,
            sink: Mutex::new(sink),
            following: tokio::sync::Mutex::new(()),
            filler: Mutex::new(filler),
            whole: std::sync::atomic::AtomicBool::new(created),
        })
    }

    /// Opens an existing index for reading only; `None` when there is none.
    pub(crate) fn open_existing(dir: &Path, embedder: SharedEmbedder) -> Result<Option<Follower>> {
        Ok(
            RecallIndex::open_existing(dir, embedder)?.map(|index| Follower {
                index,
                sink: Mutex::new(None),
                following: tokio::sync::Mutex::new(()),
                filler: Mutex::new(None),
                whole: std::sync::atomic::AtomicBool::new(false),
            }),
        )
    }

    pub(crate) fn index(&self) -> &RecallIndex {
        &self.index
    }

    fn sink(&self) -> std::sync::MutexGuard<'_, Option<IndexSink>> {
        self.sink.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True while this process maintains the index.
    pub(crate) fn maintains(&self) -> bool {
        self.sink().is_some()
    }

    /// Indexes what the database holds beyond the watermark and applies the change log, then
    /// commits; returns the documents added. Nothing when another process maintains it.
    pub(crate) async fn follow(
        self: &Arc<Self>,
        client: &impl Sql,
        waiting: Waiting,
    ) -> Result<u64> {
        let _following = self.following.lock().await;
        let Some(mut watermark) = self.sink().as_ref().map(IndexSink::watermark) else {
            return Ok(0);
        };
        let mut added = 0u64;
        // Messages first, then summaries, a batch at a time.
        for summaries in [false, true] {
            loop {
                let docs = if summaries {
                    summaries_after(client, watermark.summaries).await?
                } else {
                    messages_after(client, watermark.messages).await?
                };
                match docs.last().map(|doc| doc.row) {
                    None => break,
                    Some(IndexedRow::Message(id)) => watermark.messages = id,
                    Some(IndexedRow::Summary(id)) => watermark.summaries = id,
                }
                added += docs.len() as u64;
                // A whole index, or a long way behind: the vectors are made in the background.
                let later = self.whole.load(std::sync::atomic::Ordering::SeqCst)
                    || docs.len() as i64 >= BATCH;
                self.add(docs, Vec::new(), None, later).await?;
            }
        }
        loop {
            let changes = client
                .rows(
                    "SELECT seq, key FROM index_changes WHERE seq > $1 ORDER BY seq LIMIT $2",
                    &[&watermark.changes, &BATCH],
                )
                .await?;
            let Some(last) = changes.last() else {
                break;
            };
            let last: i64 = at(last, 0)?;
            let mut removed = Vec::with_capacity(changes.len());
            let mut again = Vec::new();
            for change in &changes {
                let row = crate::forget::task_row(at(change, 1)?);
                removed.push(row);
                if let Some(doc) = doc_of(client, row).await? {
                    again.push(doc);
                }
            }
            watermark.changes = last;
            self.add(again, removed, Some(last), false).await?;
        }
        let filled = self.add_vectors(client).await?;
        // Also what an interrupted pass added: its documents are pending in the writer.
        if self.sink().as_ref().is_some_and(|sink| sink.pending() > 0) {
            let follower = self.clone();
            tokio::task::spawn_blocking(move || -> Result<()> {
                if let Some(sink) = follower.sink().as_mut() {
                    sink.commit_waiting(waiting)?;
                }
                follower.index.reload()
            })
            .await
            .map_err(StoreError::TaskFailed)??;
        }
        self.whole.store(false, std::sync::atomic::Ordering::SeqCst);
        self.send_waiting(client, filled).await?;
        Ok(added)
    }

    fn filler(&self) -> std::sync::MutexGuard<'_, Option<VectorFiller>> {
        self.filler.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the vectors the filler made, when a batch is done (the rows as the database holds
    /// them now: one forgotten or rewritten since is not the batch's). Returns whether one was.
    async fn add_vectors(self: &Arc<Self>, client: &impl Sql) -> Result<bool> {
        if !self.maintains() {
            return Ok(false);
        }
        let Some(filled) = self.filler().as_mut().and_then(VectorFiller::take_done) else {
            return Ok(false);
        };
        let mut current = Vec::with_capacity(filled.rows.len());
        for (row, vectors) in filled.rows.into_iter().zip(filled.vectors) {
            if let Some(now) = doc_of(client, row.row).await?
                && now.text == row.text
            {
                current.push((now, vectors));
            }
        }
        let follower = self.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            if let Some(sink) = follower.sink().as_mut() {
                for (row, vectors) in &current {
                    sink.add_with_vectors(row.doc(), vectors)?;
                }
            }
            Ok(())
        })
        .await
        .map_err(StoreError::TaskFailed)??;
        Ok(true)
    }

    /// Hands the filler the next documents that wait for vectors, when it is free and it is
    /// time to look (`now`: a batch was just added).
    async fn send_waiting(&self, client: &impl Sql, now: bool) -> Result<()> {
        let ready = self
            .filler()
            .as_ref()
            .is_some_and(|filler| filler.ready() && (now || filler.due()));
        if !ready || !self.maintains() {
            return Ok(());
        }
        let mut rows = Vec::new();
        for row in self.index.waiting_for_vectors(FILL_BATCH)? {
            rows.extend(doc_of(client, row).await?);
        }
        if let Some(filler) = self.filler().as_mut() {
            filler.send(rows);
        }
        Ok(())
    }

    /// Removes then adds documents on a blocking thread (tantivy's writer may wait on its
    /// indexing threads).
    async fn add(
        self: &Arc<Self>,
        docs: Vec<IndexRow>,
        removed: Vec<IndexedRow>,
        changes_through: Option<i64>,
        embed_later: bool,
    ) -> Result<()> {
        let follower = self.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut sink = follower.sink();
            let Some(sink) = sink.as_mut() else {
                return Ok(());
            };
            for row in removed {
                sink.remove(row);
            }
            sink.embed_later(embed_later);
            for doc in &docs {
                sink.add(doc.doc())?;
            }
            sink.embed_later(false);
            if let Some(seq) = changes_through {
                sink.pass_changes(seq);
            }
            Ok(())
        })
        .await
        .map_err(StoreError::TaskFailed)?
    }

    /// Drops every document; the next [`Follower::follow`] indexes everything again.
    pub(crate) async fn clear(self: &Arc<Self>) -> Result<()> {
        let _following = self.following.lock().await;
        let follower = self.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut sink = follower.sink();
            let sink = sink
                .as_mut()
                .ok_or_else(|| StoreError::IndexBusy(follower.index.dir().to_owned()))?;
            sink.clear()?;
            sink.commit()?;
            follower.index.reload()
        })
        .await
        .map_err(StoreError::TaskFailed)?
    }

    /// The rows the index's reader holds (searches find those beyond it in the database).
    pub(crate) fn searched_through(&self) -> Result<Watermark> {
        if !self.maintains() {
            self.index.refresh()?;
        }
        Ok(self.index.searched_through())
    }
}

/// The neighbour (see `index::neighbour_of`) of a conversation's message at `seq`: the end of
/// the text of the message before it.
pub(crate) async fn neighbour_before(
    client: &impl Sql,
    conversation: i64,
    seq: i64,
) -> Result<Option<String>> {
    Ok(client
        .row_opt(
            "SELECT json FROM messages WHERE conversation_id = $1 AND seq < $2
             ORDER BY seq DESC LIMIT 1",
            &[&conversation, &seq],
        )
        .await?
        .map(|before| {
            at::<&str>(&before, 0).map(|json| neighbour_of(&AgentMessage::plain_text_of_json(json)))
        })
        .transpose()?
        .flatten())
}

/// A message's indexed text: its own, then (bounded) the text of the files it references;
/// with its neighbour, from `last` (each conversation's message streamed before it) or read.
async fn message_doc(
    client: &impl Sql,
    row: &tokio_postgres::Row,
    last: &mut HashMap<i64, Option<String>>,
) -> Result<IndexRow> {
    let id: i64 = at(row, 0)?;
    let conversation: i64 = at(row, 1)?;
    let json: &str = at(row, 4)?;
    let seq: i64 = at(row, 6)?;
    let mut text = AgentMessage::plain_text_of_json(json);
    let neighbour = match last.remove(&conversation) {
        Some(neighbour) => neighbour,
        None => neighbour_before(client, conversation, seq).await?,
    };
    last.insert(conversation, neighbour_of(&text));
    if json.contains(BLOB_ID_KEY) {
        for blob in client
            .rows(
                "SELECT b.content FROM blob_references r JOIN blobs b ON b.blob_id = r.blob_id
                 WHERE r.message_id = $1 ORDER BY r.blob_id COLLATE \"C\"",
                &[&id],
            )
            .await?
        {
            let content: &str = at(&blob, 0)?;
            text.push('\n');
            text.push_str(&content[..crate::tokenize::floor_boundary(content, INDEXED_BLOB_BYTES)]);
        }
    }
    Ok(IndexRow {
        row: IndexedRow::Message(id),
        conversation,
        agent: at(row, 2)?,
        role: at(row, 3)?,
        time_ms: at(row, 5)?,
        text,
        neighbour,
    })
}

const MESSAGE_DOC: &str =
    "SELECT m.id, m.conversation_id, c.agent_id, m.role, m.json, m.created_at,
            m.seq
     FROM messages m JOIN conversations c ON c.id = m.conversation_id";
const SUMMARY_DOC: &str = "SELECT s.id, s.conversation_id, c.agent_id, s.content,
            coalesce(s.latest_at, s.created_at)
     FROM summaries s JOIN conversations c ON c.id = s.conversation_id";

fn summary_doc(row: &tokio_postgres::Row) -> Result<IndexRow> {
    Ok(IndexRow {
        row: IndexedRow::Summary(at(row, 0)?),
        conversation: at(row, 1)?,
        agent: at(row, 2)?,
        role: crate::SUMMARY_ROLE.to_owned(),
        time_ms: at(row, 4)?,
        text: at(row, 3)?,
        neighbour: None,
    })
}

async fn messages_after(client: &impl Sql, after: i64) -> Result<Vec<IndexRow>> {
    let rows = client
        .rows(
            &format!("{MESSAGE_DOC} WHERE m.id > $1 ORDER BY m.id LIMIT $2"),
            &[&after, &BATCH],
        )
        .await?;
    let mut docs = Vec::with_capacity(rows.len());
    let mut last = HashMap::new();
    for row in &rows {
        docs.push(message_doc(client, row, &mut last).await?);
    }
    Ok(docs)
}

async fn summaries_after(client: &impl Sql, after: i64) -> Result<Vec<IndexRow>> {
    client
        .rows(
            &format!("{SUMMARY_DOC} WHERE s.id > $1 ORDER BY s.id LIMIT $2"),
            &[&after, &BATCH],
        )
        .await?
        .iter()
        .map(summary_doc)
        .collect()
}

/// A row's document as the database holds it now; `None` when it is gone.
async fn doc_of(client: &impl Sql, row: IndexedRow) -> Result<Option<IndexRow>> {
    match row {
        IndexedRow::Message(id) => {
            match client
                .row_opt(&format!("{MESSAGE_DOC} WHERE m.id = $1"), &[&id])
                .await?
            {
                Some(found) => Ok(Some(
                    message_doc(client, &found, &mut HashMap::new()).await?,
                )),
                None => Ok(None),
            }
        }
        IndexedRow::Summary(id) => client
            .row_opt(&format!("{SUMMARY_DOC} WHERE s.id = $1"), &[&id])
            .await?
            .map(|found| summary_doc(&found))
            .transpose(),
    }
}

/// Appends rows whose documents must be replaced (or removed) to the change log, in the
/// caller's transaction.
pub(crate) async fn log_changes(client: &impl Sql, rows: &[IndexedRow]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    order_rows(client).await?;
    let keys: Vec<i64> = rows
        .iter()
        .map(|row| crate::forget::task_key(*row))
        .collect();
    client
        .run(
            "INSERT INTO index_changes (key) SELECT unnest($1::BIGINT[])",
            &[&keys],
        )
        .await?;
    Ok(())
}

/// Takes [`ROW_ORDER_LOCK`] for the rest of the caller's transaction.
pub(crate) async fn order_rows(client: &impl Sql) -> Result<()> {
    client
        .run("SELECT pg_advisory_xact_lock($1)", &[&ROW_ORDER_LOCK])
        .await?;
    Ok(())
}
