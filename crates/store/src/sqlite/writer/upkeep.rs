//! The index's upkeep on the writer thread, done between commands.
//!
//! One process at a time maintains the index: the one that holds its directory's writer lock.
//! A writer without the lock writes only the database and tries to take the lock again every
//! [`LOCK_RETRY`]. With the lock, it indexes every row past the watermark in id order, which is
//! commit order because SQLite admits one writer at a time: rows it committed itself when they
//! follow the watermark directly, else (another process wrote in between) caught up from the
//! database, which it also polls every [`FOREIGN_ROWS_POLL`]. It applies the work queued in
//! `index_tasks` (forgetting, rewritten summaries, archiving), commits, and only then clears
//! the tasks. A job that keeps failing pauses ([`Retry`]); vectors have their own pause, so a
//! model's outage never holds up commits. A broken index is rebuilt beside the live one; a
//! process without the lock asks for a rebuild with a `<index>.rebuild-requested` file, which
//! the maintainer looks for once a second.

use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::Writer;
use crate::error::{Result, StoreError};
use crate::index::filler::{FILL_BATCH, VectorFiller, embed_rows};
use crate::index::{IndexDoc, IndexRow, IndexSink, IndexedRow, Waiting};
use crate::sqlite::{index_rows, read};

/// How long added documents may wait for an index commit (searches do not wait for it: rows
/// beyond the committed watermark are searched in SQLite).
pub(super) const INDEX_COMMIT_DELAY: Duration = Duration::from_millis(250);

/// How long `rebuild-index` waits for another process to release the index.
pub(super) const REBUILD_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Commit the index once this many documents wait.
pub(super) const INDEX_COMMIT_DOCS: usize = 4096;

/// The file by which a process that cannot take the index's lock (`rebuild-index`, `doctor
/// --fix`) asks the process that holds it to rebuild it: beside the index directory.
pub(super) fn rebuild_request(index_dir: &std::path::Path) -> std::path::PathBuf {
    let name = index_dir
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("index");
    index_dir.with_file_name(format!("{name}.rebuild-requested"))
}

/// A background job that keeps failing: when to try it again (a pause that doubles from
/// [`RETRY_FIRST`] to [`RETRY_MOST`]) and which failures to log (the 1st, 2nd, 4th, 8th …,
/// each with the count), so a fault that lasts neither floods the log nor spins a core.
#[derive(Debug)]
pub(super) struct Retry {
    failures: u32,
    next_try: Instant,
}

/// The first pause after a failure of background index work.
pub(super) const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest pause between tries of failing background index work.
pub(super) const RETRY_MOST: Duration = Duration::from_secs(60);

impl Retry {
    pub(super) fn new() -> Retry {
        Retry {
            failures: 0,
            next_try: Instant::now(),
        }
    }

    pub(super) fn due(&self) -> bool {
        Instant::now() >= self.next_try
    }

    /// How long until the next try (zero when due).
    pub(super) fn wait(&self) -> Duration {
        self.next_try.saturating_duration_since(Instant::now())
    }

    pub(super) fn failed(&mut self, what: &str, error: &StoreError) {
        self.failures = self.failures.saturating_add(1);
        let pause = RETRY_FIRST
            .saturating_mul(1 << (self.failures - 1).min(6))
            .min(RETRY_MOST);
        self.next_try = Instant::now() + pause;
        if self.failures.is_power_of_two() {
            tracing::warn!(
                %error,
                failures = self.failures,
                retry_in_s = pause.as_secs(),
                "{what} failed; it is tried again after a pause (logged at the 1st, 2nd, 4th, 8th … failure)"
            );
        }
    }

    pub(super) fn succeeded(&mut self, what: &str) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "{what} works again");
        }
        self.failures = 0;
        self.next_try = Instant::now();
    }
}

/// How often a writer without the index lock tries to take it over.
pub(super) const LOCK_RETRY: Duration = Duration::from_secs(2);

/// Rows behind the index's watermark from which catching up leaves the vectors to the filler.
pub(super) const EMBED_LATER_ROWS: i64 = 1_000;

/// How often the writer looks for a batch of vectors the filler is making.
pub(super) const FILL_POLL: Duration = Duration::from_millis(50);

/// How often the index's maintainer looks for rows written by other processes.
pub(super) const FOREIGN_ROWS_POLL: Duration = Duration::from_secs(1);

/// The next batch of rows whose documents wait for vectors, as the database holds them (not
/// an archived conversation's).
pub(super) fn waiting_rows(
    connection: &Connection,
    index: &crate::index::RecallIndex,
) -> Result<Vec<IndexRow>> {
    let archived = read::archived_conversations(connection)?;
    let mut rows = Vec::new();
    for row in index.waiting_for_vectors(FILL_BATCH)? {
        rows.extend(index_rows::index_row(connection, row)?);
    }
    rows.retain(|row| !archived.contains(&row.conversation()));
    Ok(rows)
}

impl Writer {
    /// Indexes every row SQLite has beyond the index's watermark (after a crash between the
    /// two commits, rows other processes wrote, or an index rebuilt from nothing), then
    /// commits. Nothing while another process maintains the index.
    pub(crate) fn catch_up_index(&mut self) -> Result<u64> {
        let Some(sink) = self.sink.as_mut() else {
            return Ok(0);
        };
        let watermark = sink.watermark();
        let mut added = 0;
        let connection = &self.connection;
        // A whole index (a new model's, a lost one) or a long way behind: the vectors are made
        // in the background, so that opening the store does not wait for them.
        let (messages, summaries) = index_rows::max_ids(connection)?;
        let behind =
            (messages - watermark.messages).max(0) + (summaries - watermark.summaries).max(0);
        let whole = watermark.messages == 0 && watermark.summaries == 0;
        sink.embed_later(whole || behind >= EMBED_LATER_ROWS);
        let archived = read::archived_conversations(connection)?;
        let mut add = |row: IndexRow| -> Result<()> {
            added += u64::from(sink.add_unless_archived(&row, &archived)?);
            Ok(())
        };
        let undecodable =
            index_rows::for_each_message_after(connection, watermark.messages, &mut add)?;
        index_rows::for_each_summary_after(connection, watermark.summaries, &mut add)?;
        self.note_undecodable(undecodable);
        if added > 0 {
            tracing::debug!(
                documents = added,
                "caught the recall index up with the database"
            );
        }
        let caught_up = self.commit_index().and_then(|()| self.apply_index_tasks());
        if let Some(sink) = self.sink.as_mut() {
            sink.embed_later(false);
        }
        caught_up?;
        Ok(added)
    }

    /// How long the loop may wait for a command before index work is due.
    pub(super) fn next_wake(&self) -> Duration {
        if !self.index_retry.due() {
            return self.index_retry.wait();
        }
        let mut index_check = self
            .next_index_check
            .saturating_duration_since(Instant::now());
        if self.filler.as_ref().is_some_and(VectorFiller::in_flight) {
            index_check = index_check.min(FILL_POLL);
        }
        match self.sink.as_ref().and_then(IndexSink::first_pending_at) {
            Some(first) => self
                .commit_delay
                .saturating_sub(first.elapsed())
                .min(index_check),
            None => index_check,
        }
    }

    /// Index work that is due: commit what waits, take the lock over when it is free, index
    /// what other processes wrote.
    pub(super) fn index_work(&mut self) {
        if self.counter.skips_index_commits() || !self.index_retry.due() {
            return;
        }
        // A damaged or missing index (a search could not read it, a commit failed, another
        // process found it damaged and asked) is rebuilt from the database in place, by the
        // maintainer only (a writer without the lock would wait on it); searches read the
        // database meanwhile. A failed rebuild pauses too.
        if self.sink.is_some() && self.index.current().is_broken() {
            tracing::warn!(
                "the recall index is damaged or missing; rebuilding it from the database"
            );
            match self.rebuild_index(true) {
                Ok(documents) => {
                    tracing::info!(documents, "rebuilt the recall index");
                    self.index_retry.succeeded("maintaining the recall index");
                }
                Err(error) => {
                    self.index_retry
                        .failed("rebuilding the recall index", &error);
                    return;
                }
            }
        }
        if !self.add_embedded() {
            return;
        }
        // A commit made without waiting that failed pauses the work, as one that failed here.
        if let Some(Err(error)) = self.sink.as_ref().map(IndexSink::failed) {
            self.index_failed("committing the recall index", &error);
            return;
        }
        let commit_due = self
            .sink
            .as_ref()
            .and_then(IndexSink::first_pending_at)
            .is_some_and(|first| first.elapsed() >= self.commit_delay);
        if commit_due && !self.commit_index_logged(Waiting::ForNone) {
            return;
        }
        if self.vector_retry.due() {
            match self.fill_vectors() {
                Ok(()) => self
                    .vector_retry
                    .succeeded("adding vectors to the recall index"),
                Err(error) => self
                    .vector_retry
                    .failed("adding vectors to the recall index", &error),
            }
        }
        if Instant::now() < self.next_index_check {
            return;
        }
        // Another process asked for a rebuild: looked for once a second, done on the next pass.
        let request = rebuild_request(self.index.current().dir());
        if self.sink.is_some() && request.exists() {
            tracing::info!(file = %request.display(), "another process asked for the recall index to be rebuilt");
            self.index.current().mark_broken();
            if let Err(error) = std::fs::remove_file(&request) {
                tracing::warn!(%error, file = %request.display(), "could not remove the rebuild request");
            }
        }
        if self.sink.is_none() {
            self.next_index_check = Instant::now() + LOCK_RETRY;
            match self.index.current().try_writer() {
                Ok(Some(sink)) => {
                    tracing::info!("took over the recall index");
                    self.sink = Some(sink);
                }
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(%error, "the recall index's writer could not open");
                    return;
                }
            }
        }
        self.next_index_check = Instant::now() + FOREIGN_ROWS_POLL;
        let behind = match (self.sink.as_ref(), index_rows::max_ids(&self.connection)) {
            (Some(sink), Ok((messages, summaries))) => {
                let watermark = sink.watermark();
                messages > watermark.messages || summaries > watermark.summaries
            }
            (_, Err(error)) => {
                tracing::warn!(%error, "reading the database's newest rows failed");
                false
            }
            (None, _) => false,
        };
        let work = if behind {
            self.catch_up_index().map(drop)
        } else {
            self.apply_index_tasks().map(drop)
        };
        match work {
            Ok(()) => self.index_retry.succeeded("maintaining the recall index"),
            Err(error) => self.index_failed("catching the recall index up", &error),
        }
    }

    /// Adds the vectors the filler made (when a batch is done) and, when it is time to look
    /// again or right after a batch, hands it the next documents that wait for theirs.
    pub(super) fn fill_vectors(&mut self) -> Result<()> {
        let (Some(filler), Some(sink)) = (self.filler.as_mut(), self.sink.as_mut()) else {
            return Ok(());
        };
        let done = filler.take_done();
        if let Some(filled) = &done {
            let archived = read::archived_conversations(&self.connection)?;
            for (row, vectors) in filled.rows.iter().zip(&filled.vectors) {
                // Forgotten, rewritten or archived since it was read: not this batch's.
                if let Some(current) = index_rows::index_row(&self.connection, row.row)?
                    && current.text == row.text
                    && !archived.contains(&current.conversation())
                {
                    sink.add_with_vectors(current.doc(), vectors)?;
                }
            }
        }
        if done.is_some() {
            self.commit_index()?;
        }
        let Some(filler) = self.filler.as_mut() else {
            return Ok(());
        };
        if (done.is_some() || filler.due()) && filler.ready() {
            let rows = waiting_rows(&self.connection, &self.index.current())?;
            filler.send(rows);
        }
        Ok(())
    }

    /// Before the writer stops: the vectors the filler has not made yet are made here and now
    /// (for a local model, the work opening the store left for later; for an endpoint, while
    /// it answers), so that a reading command after this one finds every row by meaning.
    pub(super) fn fill_before_stopping(&mut self) -> Result<()> {
        let Some(embedder) = self.index.current().embedder().cloned() else {
            return Ok(());
        };
        if self.sink.is_none() || self.counter.skips_index_commits() {
            return Ok(());
        }
        self.commit_index()?;
        let waiting = self.index.current().waiting_for_vectors(usize::MAX)?.len();
        if waiting > FILL_BATCH {
            tracing::info!(
                documents = waiting,
                model = embedder.name(),
                "making the vectors that wait before the store closes"
            );
        }
        loop {
            let rows = waiting_rows(&self.connection, &self.index.current())?;
            // Rows the database no longer has (or cannot decode) are left as they are.
            if rows.is_empty() {
                return Ok(());
            }
            let vectors = match embed_rows(&*embedder, &rows) {
                Ok(vectors) => vectors,
                Err(error) => {
                    tracing::warn!(%error, "documents wait for their vectors; the next writer makes them");
                    return Ok(());
                }
            };
            let Some(sink) = self.sink.as_mut() else {
                return Ok(());
            };
            for (row, vectors) in rows.iter().zip(&vectors) {
                sink.add_with_vectors(row.doc(), vectors)?;
            }
            self.commit_index()?;
        }
    }

    /// Adds to the index the documents whose vectors the embedding thread has made since;
    /// false when that failed (the index work then pauses, as after a failed commit).
    pub(super) fn add_embedded(&mut self) -> bool {
        match self.sink.as_mut().map(|sink| sink.add_embedded(false)) {
            Some(Err(error)) => {
                self.index_failed("adding documents to the recall index", &error);
                false
            }
            _ => true,
        }
    }

    /// Indexes rows this process just committed: directly when they follow the watermark with
    /// no gap, else (another process wrote in between) by catching up from SQLite, which covers
    /// them in id order. Nothing while another process maintains the index.
    pub(super) fn index_committed(&mut self, docs: &[IndexDoc<'_>]) -> Result<()> {
        let (Some(sink), Some(first)) = (self.sink.as_mut(), docs.first()) else {
            return Ok(());
        };
        let watermark = sink.watermark();
        let follows = match first.row {
            IndexedRow::Message(id) => id == watermark.messages + 1,
            IndexedRow::Summary(id) => id == watermark.summaries + 1,
        };
        if follows {
            for doc in docs {
                sink.add(*doc)?;
            }
            Ok(())
        } else {
            self.catch_up_index().map(drop)
        }
    }

    pub(super) fn commit_index(&mut self) -> Result<()> {
        self.commit_index_with(Waiting::ForAll)
    }

    /// Commits the index: every document added, and waits for it; or (on the timer) those
    /// whose vectors are made, the rest in a later commit, without waiting (the commit and the
    /// reader's reload run on tantivy's writer thread: see `IndexSink::commit_ready_behind`).
    pub(super) fn commit_index_with(&mut self, waiting: Waiting) -> Result<()> {
        let Some(sink) = self.sink.as_mut() else {
            return Ok(());
        };
        // A commit made without waiting may have failed since.
        sink.failed()?;
        if sink.pending() == 0 || self.counter.skips_index_commits() {
            return Ok(());
        }
        match waiting {
            Waiting::ForAll => {
                sink.commit()?;
                self.index.current().reload()
            }
            Waiting::ForNone => sink.commit_ready_behind(self.index.current()),
        }
    }

    /// Commits the index unless its last failure is too recent; false when it failed (now or
    /// lately). What was not committed is caught up from the database later.
    pub(super) fn commit_index_logged(&mut self, waiting: Waiting) -> bool {
        if !self.index_retry.due() {
            return false;
        }
        match self.commit_index_with(waiting) {
            Ok(()) => true,
            Err(error) => {
                self.index_failed("committing the recall index", &error);
                false
            }
        }
    }

    /// Index work failed: a fault of the index's own files (deleted, damaged, unwritable)
    /// marks it broken, so the maintainer rebuilds it from the database in place (searches
    /// read the database meanwhile); and the work pauses before it is tried again.
    pub(super) fn index_failed(&mut self, what: &str, error: &StoreError) {
        if matches!(error, StoreError::Index(_) | StoreError::Io { .. }) {
            self.index.current().mark_broken();
        }
        self.index_retry.failed(what, error);
    }

    /// Rebuilds the index from SQLite beside the current one and swaps it in (see
    /// [`IndexSlot::rebuild_beside`]); rows that cannot be decoded are skipped and named.
    /// `embed_later`: the documents' vectors are made in the background afterwards.
    pub(super) fn rebuild_index(&mut self, embed_later: bool) -> Result<u64> {
        // Another process may be maintaining the index: wait a little for its lock.
        let deadline = Instant::now() + REBUILD_LOCK_WAIT;
        while self.sink.is_none() {
            self.sink = self.index.current().try_writer()?;
            if self.sink.is_none() {
                if Instant::now() >= deadline {
                    // The process that maintains it rebuilds it instead, when it next looks.
                    let request = rebuild_request(self.index.current().dir());
                    if let Err(error) = std::fs::write(&request, b"") {
                        tracing::warn!(%error, file = %request.display(), "could not ask the index's maintainer to rebuild it");
                    }
                    return Err(StoreError::IndexBusy(self.index.current().dir().to_owned()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let connection = &self.connection;
        let archived = read::archived_conversations(connection)?;
        let sink_slot = &mut self.sink;
        let ((added, undecodable), sink) = self.index.rebuild_beside(
            |sink| {
                sink.embed_later(embed_later);
                let mut added = 0;
                let mut add = |row: IndexRow| -> Result<()> {
                    added += u64::from(sink.add_unless_archived(&row, &archived)?);
                    Ok(())
                };
                let undecodable = index_rows::for_each_message_after(connection, 0, &mut add)?;
                index_rows::for_each_summary_after(connection, 0, &mut add)?;
                Ok((added, undecodable))
            },
            // Release this process's writer (and its lock) on the index being replaced.
            || drop(sink_slot.take()),
        )?;
        self.sink = Some(sink);
        self.note_undecodable(undecodable);
        // Queued index work stays queued: a task another process added while the fill read
        // may name a row the fill saw before it changed; applying it again is harmless.
        self.apply_index_tasks()?;
        Ok(added)
    }

    /// Keeps the ids of rows that could not be decoded where doctor finds them.
    pub(super) fn note_undecodable(&mut self, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        self.undecodable.extend(ids);
        self.undecodable.sort_unstable();
        self.undecodable.dedup();
        let Ok(value) = serde_json::to_string(&self.undecodable) else {
            return;
        };
        if let Err(error) = self.set_store_state("undecodable_messages", &value) {
            tracing::warn!(%error, "recording undecodable rows failed");
        }
    }

    /// Applies the index work the database queued (`index_tasks`): each row's document is
    /// removed and, when the row exists outside an archived conversation and the index holds
    /// it (within the watermark), added from the database again. The tasks are cleared only
    /// after the index committed. Nothing while another process maintains the index.
    pub(super) fn apply_index_tasks(&mut self) -> Result<u64> {
        if self.sink.is_none() || self.counter.skips_index_commits() {
            return Ok(0);
        }
        let keys: Vec<i64> = self
            .connection
            .prepare_cached("SELECT key FROM index_tasks ORDER BY key LIMIT 65536")?
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if keys.is_empty() {
            return Ok(0);
        }
        let archived = read::archived_conversations(&self.connection)?;
        let Some(sink) = self.sink.as_mut() else {
            return Ok(0);
        };
        let watermark = sink.watermark();
        for key in &keys {
            let row = crate::forget::task_row(*key);
            sink.remove(row);
            let held = match row {
                IndexedRow::Message(id) => id <= watermark.messages,
                IndexedRow::Summary(id) => id <= watermark.summaries,
            };
            if held
                && let Some(found) = index_rows::index_row(&self.connection, row)?
                && !archived.contains(&found.conversation())
            {
                sink.add(found.doc())?;
            }
        }
        self.commit_index()?;
        let transaction = self.transaction()?;
        {
            let mut delete =
                transaction.prepare_cached("DELETE FROM index_tasks WHERE key = ?1")?;
            for key in &keys {
                delete.execute([key])?;
            }
        }
        transaction.commit()?;
        Ok(keys.len() as u64)
    }
}
