//! The writer thread: the only owner of the write connection and of the index writer.
//!
//! Every write arrives as a [`Command`] over a channel and runs in one SQLite transaction; the
//! reply goes back over a oneshot channel, so async callers await it without blocking their
//! runtime. After a transaction commits, the rows it created are added to the index; the index
//! commits in batches (on a short timer, on a size threshold, or when a search asks for it).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;

use super::opened::OpenedDatabase;
use super::write::{FaultPlan, WriteCounter, WriteTx};
use super::{archive, blobs, forget, read};
use crate::codec::{self, EncoderSlot};
use crate::error::{Result, StoreError};
use crate::index::filler::{FILL_BATCH, VectorFiller, embed_rows};
use crate::index::{IndexDoc, IndexRow, IndexSink, IndexSlot, IndexedRow, Waiting, neighbour_of};
use crate::rows::{POSITION_STEP, PreparedMessage, hex16, sequence_key, summary_id};
use crate::types::*;
use vilvona_core::archive::{ImportReport, SessionArchive};
use vilvona_core::clock::now_ms;

/// How long added documents may wait for an index commit (searches do not wait for it: rows
/// beyond the committed watermark are searched in SQLite).
const INDEX_COMMIT_DELAY: Duration = Duration::from_millis(250);

/// How long `rebuild-index` waits for another process to release the index.
const REBUILD_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Commit the index once this many documents wait.
const INDEX_COMMIT_DOCS: usize = 4096;

pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

pub(crate) enum Command {
    Conversation {
        key: ConversationKey,
        reply: Reply<Conversation>,
    },
    Ingest {
        conversation: ConversationId,
        messages: Vec<PreparedMessage>,
        advancement_key: Option<String>,
        reply: Reply<IngestOutcome>,
    },
    Replace {
        plan: ReplacePlan,
        reply: Reply<ReplaceOutcome>,
    },
    AppendItems {
        conversation: ConversationId,
        items: Vec<ItemRef>,
        reply: Reply<()>,
    },
    PutBlob {
        blob: NewBlob,
        reply: Reply<BlobInfo>,
    },
    CreateGrant {
        grant: NewGrant,
        reply: Reply<Grant>,
    },
    RevokeGrants {
        grantee: String,
        reply: Reply<u64>,
    },
    DeleteGrant {
        id: i64,
        reply: Reply<()>,
    },
    SetState {
        conversation: ConversationId,
        entries: Vec<(String, String)>,
        reply: Reply<()>,
    },
    UpdateSummary {
        update: SummaryUpdate,
        reply: Reply<bool>,
    },
    RemoveContext {
        conversation: ConversationId,
        reply: Reply<u64>,
    },
    Forget {
        plan: ForgetPlan,
        reply: Reply<Option<ForgetReport>>,
    },
    SetArchived {
        conversation: ConversationId,
        archived: bool,
        reply: Reply<bool>,
    },
    RetireSession {
        conversation: ConversationId,
        as_session_id: String,
        reply: Reply<()>,
    },
    Reclaim {
        reply: Reply<()>,
    },
    Import {
        archive: Box<SessionArchive>,
        reply: Reply<(ConversationId, ImportReport)>,
    },
    SetStoreState {
        key: String,
        value: String,
        reply: Reply<()>,
    },
    FlushIndex {
        reply: Reply<()>,
    },
    RebuildIndex {
        reply: Reply<u64>,
    },
    Shutdown {
        reply: Reply<()>,
    },
}

pub(crate) struct Writer {
    connection: Connection,
    /// The index's writing side while this process holds its lock; `None` while another
    /// process maintains it (this one then writes SQLite only and tries again later).
    sink: Option<IndexSink>,
    index: Arc<IndexSlot>,
    agents: HashMap<i64, String>,
    /// Message rows the last catch-up could not decode (skipped; doctor names them).
    undecodable: Vec<i64>,
    /// Every write statement passes through it (and the fault plan, in tests).
    counter: WriteCounter,
    /// When to try for the index lock again (not holding it) or look for rows other processes
    /// wrote (holding it).
    next_index_check: Instant,
    commit_delay: Duration,
    /// The dictionary new messages are compressed with, shared with the callers that prepare
    /// them; `None` until the store holds enough messages to train one.
    encoder: Arc<EncoderSlot>,
    /// The message id past which, without a dictionary, one is trained (grows when training
    /// finds too little to learn from).
    train_dictionary_after: Option<i64>,
    /// Makes vectors in the background when the model is behind an endpoint.
    filler: Option<VectorFiller>,
    /// The index work that keeps failing (a deleted or damaged index, a full disk): when to
    /// try it again, and which failures to log.
    index_retry: Retry,
    /// The same for adding vectors (an embedding endpoint that is down), apart: an outage of
    /// the model must not hold up the index's commits.
    vector_retry: Retry,
    /// The database file as opened: a file removed or replaced, or its log cut, under the
    /// process is noticed before a write is acknowledged.
    file: Option<OpenedDatabase>,
}

/// The file by which a process that cannot take the index's lock (`rebuild-index`, `doctor
/// --fix`) asks the process that holds it to rebuild it: beside the index directory.
fn rebuild_request(index_dir: &std::path::Path) -> std::path::PathBuf {
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
struct Retry {
    failures: u32,
    next_try: Instant,
}

/// The first pause after a failure of background index work.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest pause between tries of failing background index work.
const RETRY_MOST: Duration = Duration::from_secs(60);

impl Retry {
    fn new() -> Retry {
        Retry {
            failures: 0,
            next_try: Instant::now(),
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next_try
    }

    /// How long until the next try (zero when due).
    fn wait(&self) -> Duration {
        self.next_try.saturating_duration_since(Instant::now())
    }

    fn failed(&mut self, what: &str, error: &StoreError) {
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

    fn succeeded(&mut self, what: &str) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "{what} works again");
        }
        self.failures = 0;
        self.next_try = Instant::now();
    }
}

/// How often a writer without the index lock tries to take it over.
const LOCK_RETRY: Duration = Duration::from_secs(2);

/// Rows behind the index's watermark from which catching up leaves the vectors to the filler.
const EMBED_LATER_ROWS: i64 = 1_000;

/// How often the writer looks for a batch of vectors the filler is making.
const FILL_POLL: Duration = Duration::from_millis(50);

/// How often the index's maintainer looks for rows written by other processes.
const FOREIGN_ROWS_POLL: Duration = Duration::from_secs(1);

impl Writer {
    /// The writer of `connection`, whose database files the store found as `file` when it
    /// opened them.
    pub(crate) fn new(
        connection: Connection,
        file: Option<OpenedDatabase>,
        index: Arc<IndexSlot>,
        faults: FaultPlan,
        commit_delay: Option<Duration>,
        encoder: Arc<EncoderSlot>,
    ) -> Result<Writer> {
        let sink = index.current().try_writer()?;
        if sink.is_none() {
            tracing::info!(dir = %index.current().dir().display(), "another process maintains the recall index; this one writes the database only");
        }
        let filler = VectorFiller::for_embedder(index.current().embedder());
        Ok(Writer {
            file,
            connection,
            sink,
            filler,
            index,
            agents: HashMap::new(),
            undecodable: Vec::new(),
            counter: WriteCounter::new(faults),
            next_index_check: Instant::now() + LOCK_RETRY,
            commit_delay: commit_delay.unwrap_or(INDEX_COMMIT_DELAY),
            train_dictionary_after: encoder.get().is_none().then_some(codec::DICTIONARY_AFTER),
            encoder,
            index_retry: Retry::new(),
            vector_retry: Retry::new(),
        })
    }

    /// Whether the database's files are still the ones this process opened, and whole.
    fn database_still_there(&self) -> Result<()> {
        self.file.as_ref().map_or(Ok(()), OpenedDatabase::check)
    }

    /// Folds the log into the database and empties it as the writer stops, as SQLite's last
    /// connection would as it closes (no connection does, see `schema::connect`): the database
    /// file alone holds the store afterwards. Not when the files were damaged under the
    /// process: a cut log would be folded in as zeroed pages. It does not wait for other
    /// processes still using the database (their last connection's writer folds it).
    fn checkpoint_if_whole(&self) {
        let folded = self.database_still_there().and_then(|()| {
            self.connection.busy_timeout(Duration::ZERO)?;
            self.connection
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(StoreError::from)
        });
        // Busy: another process reads or writes it; that is no failure.
        if let Err(error) = folded
            && (error.needs_reopen() || !error.is_transient())
        {
            tracing::warn!(error = %vilvona_core::error_chain(&error), "the database's log was not folded into it at the end; the next open reads it");
        }
    }

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
        let (messages, summaries) = read::max_ids(connection)?;
        let behind =
            (messages - watermark.messages).max(0) + (summaries - watermark.summaries).max(0);
        let whole = watermark.messages == 0 && watermark.summaries == 0;
        sink.embed_later(whole || behind >= EMBED_LATER_ROWS);
        let archived = read::archived_conversations(connection)?;
        let mut add = |row: IndexRow| -> Result<()> {
            added += u64::from(sink.add_unless_archived(&row, &archived)?);
            Ok(())
        };
        let undecodable = read::for_each_message_after(connection, watermark.messages, &mut add)?;
        read::for_each_summary_after(connection, watermark.summaries, &mut add)?;
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
    fn next_wake(&self) -> Duration {
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
    fn index_work(&mut self) {
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
        let behind = match (self.sink.as_ref(), read::max_ids(&self.connection)) {
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
    fn fill_vectors(&mut self) -> Result<()> {
        let (Some(filler), Some(sink)) = (self.filler.as_mut(), self.sink.as_mut()) else {
            return Ok(());
        };
        let done = filler.take_done();
        if let Some(filled) = &done {
            let archived = read::archived_conversations(&self.connection)?;
            for (row, vectors) in filled.rows.iter().zip(&filled.vectors) {
                // Forgotten, rewritten or archived since it was read: not this batch's.
                if let Some(current) = read::index_row(&self.connection, row.row)?
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
    fn fill_before_stopping(&mut self) -> Result<()> {
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

    pub(crate) fn run(mut self, commands: Receiver<Command>) {
        loop {
            let received = commands.recv_timeout(self.next_wake());
            match received {
                Ok(Command::Shutdown { reply }) => {
                    let _ = reply.send(
                        self.fill_before_stopping()
                            .and_then(|()| self.commit_index()),
                    );
                    self.checkpoint_if_whole();
                    return;
                }
                Ok(command) => self.handle(command),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    if let Err(error) = self.fill_before_stopping() {
                        tracing::warn!(%error, "adding vectors to the recall index failed; the next writer adds them");
                    }
                    let _ = self.commit_index_logged(Waiting::ForAll);
                    self.checkpoint_if_whole();
                    return;
                }
            }
            if self.counter.crashed() {
                // A simulated kill: nothing more is written and the index is not committed.
                // Returning drops the receiver, so every later call sees a stopped writer.
                return;
            }
            if self
                .sink
                .as_ref()
                .is_some_and(|sink| sink.pending() >= INDEX_COMMIT_DOCS)
            {
                let _ = self.commit_index_logged(Waiting::ForNone);
            }
            self.index_work();
        }
    }

    /// Adds to the index the documents whose vectors the embedding thread has made since;
    /// false when that failed (the index work then pauses, as after a failed commit).
    fn add_embedded(&mut self) -> bool {
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
    fn index_committed(&mut self, docs: &[IndexDoc<'_>]) -> Result<()> {
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

    fn handle(&mut self, command: Command) {
        match command {
            Command::Conversation { key, reply } => {
                let _ = reply.send(self.conversation(&key));
            }
            Command::Ingest {
                conversation,
                messages,
                advancement_key,
                reply,
            } => {
                // Acknowledged only if the file written is the one at the database's path,
                // before and after (a state directory removed under a running process).
                let ingested = self
                    .database_still_there()
                    .and_then(|()| self.ingest(conversation, messages, advancement_key))
                    .and_then(|outcome| self.database_still_there().map(|()| outcome));
                // Only until the store has a dictionary: then there is nothing to look at.
                if let (Some(after), Ok(IngestOutcome::Stored(results))) =
                    (self.train_dictionary_after, &ingested)
                    && results
                        .iter()
                        .any(|result| result.ingested && result.message_id.0 >= after)
                {
                    self.train_dictionary_logged();
                }
                let _ = reply.send(ingested);
            }
            Command::Replace { plan, reply } => {
                let _ = reply.send(self.replace(plan));
            }
            Command::AppendItems {
                conversation,
                items,
                reply,
            } => {
                let _ = reply.send(self.append_items(conversation, &items));
            }
            Command::PutBlob { blob, reply } => {
                let _ = reply.send(self.put_blob(blob));
            }
            Command::CreateGrant { grant, reply } => {
                let _ = reply.send(self.create_grant(grant));
            }
            Command::RevokeGrants { grantee, reply } => {
                let _ = reply.send(self.revoke_grants(&grantee));
            }
            Command::DeleteGrant { id, reply } => {
                let _ = reply.send(self.delete_grant(id));
            }
            Command::SetState {
                conversation,
                entries,
                reply,
            } => {
                let _ = reply.send(self.set_states(conversation, &entries));
            }
            Command::UpdateSummary { update, reply } => {
                let _ = reply.send(self.update_summary(update));
            }
            Command::RemoveContext {
                conversation,
                reply,
            } => {
                let _ = reply.send(self.remove_context(conversation));
            }
            Command::Forget { plan, reply } => {
                let _ = reply.send(self.forget(&plan));
            }
            Command::SetArchived {
                conversation,
                archived,
                reply,
            } => {
                let _ = reply.send(self.set_archived(conversation, archived));
            }
            Command::RetireSession {
                conversation,
                as_session_id,
                reply,
            } => {
                let _ = reply.send(self.retire_session(conversation, &as_session_id));
            }
            Command::Reclaim { reply } => {
                let _ = reply.send(self.reclaim());
            }
            Command::Import { archive, reply } => {
                let _ = reply.send(self.import(&archive));
            }
            Command::SetStoreState { key, value, reply } => {
                let _ = reply.send(self.set_store_state(&key, &value));
            }
            Command::FlushIndex { reply } => {
                let _ = reply.send(self.commit_index());
            }
            Command::RebuildIndex { reply } => {
                // Asked for and waited on: the vectors are made before it answers.
                let _ = reply.send(self.rebuild_index(false));
            }
            Command::Shutdown { reply } => {
                let _ = reply.send(Ok(()));
            }
        }
    }

    /// Trains the store's dictionary, or adopts the one another process stored, once the store
    /// holds enough messages. It runs before the reply to the call that crossed the line, so
    /// that the caller's next messages are compressed against it. A failure leaves messages
    /// lz4, which is always readable.
    fn train_dictionary_logged(&mut self) {
        if let Err(error) = self.train_dictionary() {
            tracing::warn!(error = %vilvona_core::error_chain(&error), "could not train the store's compression dictionary; messages stay lz4");
            self.train_dictionary_after = self.train_dictionary_after.map(|after| after * 2);
        }
    }

    fn train_dictionary(&mut self) -> Result<()> {
        if let Some(stored) = codec::stored_encoder(&self.connection)? {
            self.encoder.set(stored);
            self.train_dictionary_after = None;
            return Ok(());
        }
        let Some(trained) = codec::train(&self.connection)? else {
            tracing::debug!("too little to train a compression dictionary on yet");
            self.train_dictionary_after = self.train_dictionary_after.map(|after| after * 2);
            return Ok(());
        };
        let transaction = self.transaction()?;
        // Another process may have stored one since the look above: theirs is the one.
        let raced = transaction
            .prepare_cached("SELECT count(*) FROM compression_dictionaries")?
            .query_row([], |row| row.get::<_, i64>(0))?
            > 0;
        if !raced {
            transaction
                .prepare_cached(
                    "INSERT INTO compression_dictionaries (id, dictionary, created_at)
                     VALUES (?1, ?2, ?3)",
                )?
                .execute(params![i64::from(trained.id), trained.bytes, now_ms()])?;
            // The messages it learned from are compressed again with it (message JSON never
            // changes once stored, so what was read before the transaction still holds).
            let mut rewrite =
                transaction.prepare_cached("UPDATE messages SET json = ?2 WHERE id = ?1")?;
            for (id, json) in &trained.samples {
                rewrite.execute(params![id, codec::encode(json, Some(&trained.encoder))])?;
            }
        }
        transaction.commit()?;
        if raced {
            return self.train_dictionary();
        }
        tracing::debug!(
            dictionary = trained.id,
            samples = trained.samples.len(),
            "trained the store's compression dictionary"
        );
        self.encoder.set(trained.encoder);
        self.train_dictionary_after = None;
        Ok(())
    }

    /// Opens the write transaction every write statement of a command goes through.
    fn transaction(&mut self) -> Result<WriteTx<'_>> {
        let transaction = self
            .connection
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        Ok(WriteTx::new(transaction, &self.counter))
    }

    fn conversation(&mut self, key: &ConversationKey) -> Result<Conversation> {
        if let Some(found) = read::conversation_by_key(&self.connection, key)? {
            return Ok(found);
        }
        let transaction = self.transaction()?;
        transaction
            .prepare_cached(
                // Another process may have created it since the lookup: theirs is the one.
                "INSERT INTO conversations (agent_id, session_id, session_key, created_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (agent_id, session_id) DO NOTHING",
            )?
            .execute(params![
                key.agent_id,
                key.session_id,
                key.session_key,
                now_ms()
            ])?;
        transaction.commit()?;
        read::conversation_by_key(&self.connection, key)?.ok_or_else(|| StoreError::NotFound {
            what: "conversation",
            id: key.session_id.clone(),
        })
    }

    fn agent_of(&mut self, conversation: ConversationId) -> Result<String> {
        if let Some(agent) = self.agents.get(&conversation.0) {
            return Ok(agent.clone());
        }
        let agent: String = self
            .connection
            .prepare_cached("SELECT agent_id FROM conversations WHERE id = ?1")?
            .query_row([conversation.0], |row| row.get(0))
            .optional()?
            .ok_or_else(|| StoreError::NotFound {
                what: "conversation",
                id: conversation.0.to_string(),
            })?;
        self.agents.insert(conversation.0, agent.clone());
        Ok(agent)
    }

    fn ingest(
        &mut self,
        conversation: ConversationId,
        messages: Vec<PreparedMessage>,
        advancement_key: Option<String>,
    ) -> Result<IngestOutcome> {
        let agent = self.agent_of(conversation)?;
        let transaction = self.transaction()?;
        if let Some(key) = &advancement_key {
            let inserted = transaction
                .prepare_cached(
                    "INSERT OR IGNORE INTO turn_commits (conversation_id, advancement_key, committed_at)
                     VALUES (?1, ?2, ?3)",
                )?
                .execute(params![conversation.0, key, now_ms()])?;
            if inserted == 0 {
                return Ok(IngestOutcome::DuplicateTurn);
            }
        }
        let (mut next_seq, mut next_position, archived): (i64, i64, bool) = transaction
            .prepare_cached(
                "SELECT next_seq, next_position, archived_at IS NOT NULL FROM conversations WHERE id = ?1",
            )?
            .query_row([conversation.0], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })?;
        let mut results = Vec::with_capacity(messages.len());
        let mut added_tokens: i64 = 0;
        // Ids are assigned here, above every id ever used (see `read::max_ids`).
        let mut next_id = read::max_ids(transaction.reader())?.0 + 1;
        let mut created = Vec::new();
        {
            let mut find = transaction.prepare_cached(
                "SELECT id, seq FROM messages WHERE conversation_id = ?1 AND ingest_key = ?2",
            )?;
            let mut insert = transaction.prepare_cached(
                "INSERT INTO messages (id, conversation_id, seq, role, json, tokens, ingest_key, created_at)
                 VALUES (?8, ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            let mut append = transaction.prepare_cached(
                "INSERT INTO context_items (conversation_id, position, message_id, tokens)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            let mut at_place = transaction.prepare_cached(
                "SELECT id, seq, json FROM messages WHERE conversation_id = ?1 AND seq = ?2",
            )?;
            for message in messages {
                let mut existing: Option<(i64, i64)> = match &message.ingest_key {
                    Some(key) => find
                        .query_row(params![conversation.0, &key[..]], |row| {
                            Ok((row.get(0)?, row.get(1)?))
                        })
                        .optional()?,
                    None => None,
                };
                if existing.is_none()
                    && let Some(place) = message.place
                    && let Ok(place) = i64::try_from(place)
                {
                    let found: Option<(i64, i64, Vec<u8>)> = at_place
                        .query_row(params![conversation.0, place], |row| {
                            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                        })
                        .optional()?;
                    if let Some((id, seq, compressed)) = found
                        && codec::decode(transaction.reader(), &compressed)
                            .is_ok_and(|json| json == message.json)
                    {
                        existing = Some((id, seq));
                    }
                }
                if let Some((id, seq)) = existing {
                    results.push(Ingested {
                        message_id: MessageId(id),
                        seq: seq as u64,
                        ingested: false,
                    });
                    continue;
                }
                insert.execute(params![
                    conversation.0,
                    next_seq,
                    message.role,
                    &message.compressed,
                    message.tokens as i64,
                    &message
                        .ingest_key
                        .unwrap_or_else(|| sequence_key(conversation, next_seq))[..],
                    message.created_at_ms,
                    next_id
                ])?;
                let id = next_id;
                next_id += 1;
                let mut message = message;
                // The next message's neighbour: this one's own text, before any file's.
                let tail = neighbour_of(&message.text);
                if !message.blobs.is_empty() {
                    blobs::record_references(&transaction, id, conversation, &message.blobs)?;
                    blobs::indexed_text(transaction.reader(), &mut message.text, &message.blobs)?;
                }
                append.execute(params![
                    conversation.0,
                    next_position,
                    id,
                    message.tokens as i64
                ])?;
                results.push(Ingested {
                    message_id: MessageId(id),
                    seq: next_seq as u64,
                    ingested: true,
                });
                added_tokens += message.tokens as i64;
                created.push((id, message, next_seq, tail));
                next_seq += 1;
                next_position += POSITION_STEP;
            }
        }
        if !created.is_empty() {
            transaction
                .prepare_cached(
                    "UPDATE conversations
                     SET next_seq = ?2, next_position = ?3, context_tokens = context_tokens + ?4
                     WHERE id = ?1",
                )?
                .execute(params![
                    conversation.0,
                    next_seq,
                    next_position,
                    added_tokens
                ])?;
            // A session resumed after retention archived it is live again: its rows return
            // to the index.
            if archived {
                forget::set_archived(&transaction, conversation, None)?;
            }
        }
        transaction.commit()?;
        // Each message's neighbour: the one created before it, or for the first, the
        // conversation's message before it.
        let first_neighbour = match created.first() {
            Some((_, _, seq, _))
                if self.sink.is_some() && self.index.current().embedder().is_some() =>
            {
                read::neighbour_before(&self.connection, conversation.0, *seq)?
            }
            _ => None,
        };
        let neighbours: Vec<Option<&str>> = std::iter::once(first_neighbour.as_deref())
            .chain(created.iter().map(|(.., tail)| tail.as_deref()))
            .collect();
        let docs: Vec<IndexDoc<'_>> = created
            .iter()
            .zip(neighbours)
            .map(|((id, message, ..), neighbour)| IndexDoc {
                row: IndexedRow::Message(*id),
                conversation: conversation.0,
                agent: &agent,
                role: &message.role,
                time_ms: message.created_at_ms,
                text: &message.text,
                neighbour,
            })
            .collect();
        self.index_committed(&docs)?;
        if archived && !docs.is_empty() {
            self.apply_index_tasks()?;
        }
        Ok(IngestOutcome::Stored(results))
    }

    fn replace(&mut self, plan: ReplacePlan) -> Result<ReplaceOutcome> {
        let (Some(first), Some(last)) = (plan.items.first(), plan.items.last()) else {
            return Ok(ReplaceOutcome::Stale);
        };
        let (first_position, last_position) = (first.0, last.0);
        let agent = self.agent_of(plan.conversation)?;
        let transaction = self.transaction()?;
        let current = read::items_in_range(
            transaction.reader(),
            plan.conversation,
            first_position,
            last_position,
        )?;
        let planned: Vec<(i64, ItemRef)> = plan.items.clone();
        if current
            .iter()
            .map(|(position, item, _)| (*position, *item))
            .collect::<Vec<_>>()
            != planned
        {
            return Ok(ReplaceOutcome::Stale);
        }
        let removed_tokens: i64 = current.iter().map(|(_, _, tokens)| *tokens as i64).sum();
        let span = read::span_of(transaction.reader(), &planned, plan.summary.kind)?;
        let summary_id = summary_id(plan.conversation, &plan.summary, &planned);
        let created_at = now_ms();
        transaction
            .prepare_cached(
                "INSERT INTO summaries (summary_id, conversation_id, depth, kind, content, tokens,
                     earliest_at, latest_at, first_seq, last_seq, level, summarizer, created_at, id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            )?
            .execute(params![
                summary_id,
                plan.conversation.0,
                plan.summary.depth,
                kind_str(plan.summary.kind),
                plan.summary.content,
                plan.summary.tokens as i64,
                span.earliest_ms,
                span.latest_ms,
                span.first_seq,
                span.last_seq,
                level_str(plan.summary.level),
                plan.summary.summarizer,
                created_at,
                read::max_ids(transaction.reader())?.1 + 1
            ])?;
        let row_id = transaction.last_insert_rowid();
        {
            let mut edge = transaction.prepare_cached(
                "INSERT INTO summary_edges (parent_id, ordinal, child_message_id, child_summary_id)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (ordinal, (_, item)) in planned.iter().enumerate() {
                match item {
                    ItemRef::Message(id) => {
                        edge.execute(params![row_id, ordinal as i64, id.0, None::<i64>])?
                    }
                    ItemRef::Summary(id) => {
                        edge.execute(params![row_id, ordinal as i64, None::<i64>, id.0])?
                    }
                };
            }
        }
        transaction
            .prepare_cached(
                "DELETE FROM context_items
                 WHERE conversation_id = ?1 AND position BETWEEN ?2 AND ?3",
            )?
            .execute(params![plan.conversation.0, first_position, last_position])?;
        transaction
            .prepare_cached(
                "INSERT INTO context_items (conversation_id, position, summary_id, tokens)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                plan.conversation.0,
                first_position,
                row_id,
                plan.summary.tokens as i64
            ])?;
        transaction
            .prepare_cached(
                "UPDATE conversations SET context_tokens = context_tokens - ?2 + ?3 WHERE id = ?1",
            )?
            .execute(params![
                plan.conversation.0,
                removed_tokens,
                plan.summary.tokens as i64
            ])?;
        transaction.commit()?;
        let stored = StoredSummary::published(
            row_id,
            summary_id,
            plan.conversation,
            plan.summary,
            span,
            created_at,
        );
        self.index_committed(&[IndexDoc {
            row: IndexedRow::Summary(row_id),
            conversation: plan.conversation.0,
            agent: &agent,
            role: crate::SUMMARY_ROLE,
            time_ms: stored.latest_at_ms.unwrap_or(created_at),
            text: &stored.content,
            neighbour: None,
        }])?;
        Ok(ReplaceOutcome::Replaced(stored))
    }

    fn append_items(&mut self, conversation: ConversationId, items: &[ItemRef]) -> Result<()> {
        let transaction = self.transaction()?;
        let mut next_position: i64 = transaction
            .prepare_cached("SELECT next_position FROM conversations WHERE id = ?1")?
            .query_row([conversation.0], |row| row.get(0))?;
        let mut added: i64 = 0;
        for item in items {
            let tokens = read::tokens_of(transaction.reader(), *item)?;
            let (message, summary) = match item {
                ItemRef::Message(id) => (Some(id.0), None),
                ItemRef::Summary(id) => (None, Some(id.0)),
            };
            transaction
                .prepare_cached(
                    "INSERT INTO context_items (conversation_id, position, message_id, summary_id, tokens)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![conversation.0, next_position, message, summary, tokens])?;
            next_position += POSITION_STEP;
            added += tokens;
        }
        transaction
            .prepare_cached(
                "UPDATE conversations SET next_position = ?2, context_tokens = context_tokens + ?3
                 WHERE id = ?1",
            )?
            .execute(params![conversation.0, next_position, added])?;
        transaction.commit()?;
        Ok(())
    }

    /// Rewrites a summary's text in place (same id, same edges), if it still has the level the
    /// caller read (checked inside the write: another process may have rewritten it since);
    /// keeps the context items' tokens and the running total of every conversation that holds
    /// it (a fork holds its parent's summaries) in step.
    fn update_summary(&mut self, update: SummaryUpdate) -> Result<bool> {
        let transaction = self.transaction()?;
        let Some(current) = read::summary(transaction.reader(), update.row_id)? else {
            return Ok(false);
        };
        if current.level != update.expected_level
            || current.summarizer != update.expected_summarizer
        {
            return Ok(false);
        }
        transaction
            .prepare_cached(
                "UPDATE summaries SET content = ?2, tokens = ?3, level = ?4, summarizer = ?5 WHERE id = ?1",
            )?
            .execute(params![
                update.row_id.0,
                update.content,
                update.tokens as i64,
                level_str(update.level),
                update.summarizer
            ])?;
        let delta = update.tokens as i64 - current.tokens as i64;
        transaction
            .prepare_cached(
                "UPDATE conversations SET context_tokens = context_tokens + ?2 * (
                     SELECT COUNT(*) FROM context_items i
                     WHERE i.summary_id = ?1 AND i.conversation_id = conversations.id)
                 WHERE id IN (SELECT conversation_id FROM context_items WHERE summary_id = ?1)",
            )?
            .execute(params![update.row_id.0, delta])?;
        transaction
            .prepare_cached("UPDATE context_items SET tokens = ?2 WHERE summary_id = ?1")?
            .execute(params![update.row_id.0, update.tokens as i64])?;
        // The index's document for the old text is replaced by whichever process maintains
        // the index (this one, at once), even if this one dies before.
        transaction
            .prepare_cached("INSERT OR IGNORE INTO index_tasks (key) VALUES (?1)")?
            .execute([crate::forget::task_key(IndexedRow::Summary(
                update.row_id.0,
            ))])?;
        transaction.commit()?;
        self.apply_index_tasks()?;
        Ok(true)
    }

    /// Empties a conversation's context (undoing a fork seeding); rows stay.
    fn remove_context(&mut self, conversation: ConversationId) -> Result<u64> {
        let transaction = self.transaction()?;
        let removed = transaction
            .prepare_cached("DELETE FROM context_items WHERE conversation_id = ?1")?
            .execute([conversation.0])?;
        transaction
            .prepare_cached("UPDATE conversations SET context_tokens = 0 WHERE id = ?1")?
            .execute([conversation.0])?;
        transaction.commit()?;
        Ok(removed as u64)
    }

    fn put_blob(&mut self, blob: NewBlob) -> Result<BlobInfo> {
        let blob_id = format!(
            "file_{}",
            hex16(blake3::hash(blob.content.as_bytes()).as_bytes())
        );
        let lines = blob.content.lines().count() as u64;
        let bytes = blob.content.len() as u64;
        let created_at = now_ms();
        let transaction = self.transaction()?;
        transaction
            .prepare_cached(
                "INSERT OR IGNORE INTO blobs
                     (blob_id, conversation_id, kind, bytes, lines, description, content, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                blob_id,
                blob.conversation.0,
                blob.kind,
                bytes as i64,
                lines as i64,
                blob.description,
                blob.content,
                created_at
            ])?;
        transaction.commit()?;
        read::blob_info(&self.connection, &blob_id)?.ok_or_else(|| StoreError::NotFound {
            what: "blob",
            id: blob_id,
        })
    }

    fn create_grant(&mut self, grant: NewGrant) -> Result<Grant> {
        let transaction = self.transaction()?;
        transaction
            .prepare_cached(
                "INSERT INTO grants (grantee, conversation_id, expires_at, token_cap, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                grant.grantee,
                grant.conversation.0,
                grant.expires_at_ms,
                grant.token_cap as i64,
                now_ms()
            ])?;
        let id = transaction.last_insert_rowid();
        transaction.commit()?;
        Ok(Grant {
            id,
            grantee: grant.grantee,
            conversation: grant.conversation,
            expires_at_ms: grant.expires_at_ms,
            token_cap: grant.token_cap,
            revoked: false,
        })
    }

    fn revoke_grants(&mut self, grantee: &str) -> Result<u64> {
        let transaction = self.transaction()?;
        let changed = transaction
            .prepare_cached(
                "UPDATE grants SET revoked_at = ?2 WHERE grantee = ?1 AND revoked_at IS NULL",
            )?
            .execute(params![grantee, now_ms()])?;
        transaction.commit()?;
        Ok(changed as u64)
    }

    fn delete_grant(&mut self, id: i64) -> Result<()> {
        let transaction = self.transaction()?;
        transaction
            .prepare_cached("DELETE FROM grants WHERE id = ?1")?
            .execute([id])?;
        transaction.commit()?;
        Ok(())
    }

    fn set_states(
        &mut self,
        conversation: ConversationId,
        entries: &[(String, String)],
    ) -> Result<()> {
        let transaction = self.transaction()?;
        {
            let mut upsert = transaction.prepare_cached(
                "INSERT INTO conversation_state (conversation_id, key, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (conversation_id, key) DO UPDATE SET value = excluded.value",
            )?;
            for (key, value) in entries {
                upsert.execute(params![conversation.0, key, value])?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    fn commit_index(&mut self) -> Result<()> {
        self.commit_index_with(Waiting::ForAll)
    }

    /// Commits the index: every document added, and waits for it; or (on the timer) those
    /// whose vectors are made, the rest in a later commit, without waiting (the commit and the
    /// reader's reload run on tantivy's writer thread: see `IndexSink::commit_ready_behind`).
    fn commit_index_with(&mut self, waiting: Waiting) -> Result<()> {
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
    fn commit_index_logged(&mut self, waiting: Waiting) -> bool {
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
    fn index_failed(&mut self, what: &str, error: &StoreError) {
        if matches!(error, StoreError::Index(_) | StoreError::Io { .. }) {
            self.index.current().mark_broken();
        }
        self.index_retry.failed(what, error);
    }

    /// Rebuilds the index from SQLite beside the current one and swaps it in (see
    /// [`IndexSlot::rebuild_beside`]); rows that cannot be decoded are skipped and named.
    /// `embed_later`: the documents' vectors are made in the background afterwards.
    fn rebuild_index(&mut self, embed_later: bool) -> Result<u64> {
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
                let undecodable = read::for_each_message_after(connection, 0, &mut add)?;
                read::for_each_summary_after(connection, 0, &mut add)?;
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
    fn note_undecodable(&mut self, ids: Vec<i64>) {
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
}

impl Writer {
    fn forget(&mut self, plan: &ForgetPlan) -> Result<Option<ForgetReport>> {
        let transaction = self.transaction()?;
        let Some(report) = forget::apply(&transaction, plan)? else {
            return Ok(None);
        };
        transaction.commit()?;
        self.agents.remove(&plan.conversation.0);
        self.apply_index_tasks()?;
        Ok(Some(report))
    }

    /// Imports an archive in one transaction (see `archive::import`), then indexes its rows.
    fn import(&mut self, archive: &SessionArchive) -> Result<(ConversationId, ImportReport)> {
        let encoder = self.encoder.get();
        let transaction = self.transaction()?;
        let imported = archive::import(&transaction, archive, encoder.as_deref())?;
        transaction.commit()?;
        self.catch_up_index()?;
        Ok(imported)
    }

    fn set_store_state(&mut self, key: &str, value: &str) -> Result<()> {
        let transaction = self.transaction()?;
        transaction
            .prepare_cached(
                "INSERT INTO store_state (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?
            .execute(params![key, value])?;
        transaction.commit()?;
        Ok(())
    }

    fn retire_session(&mut self, conversation: ConversationId, as_session_id: &str) -> Result<()> {
        let transaction = self.transaction()?;
        transaction
            .prepare_cached("UPDATE conversations SET session_id = ?2 WHERE id = ?1")?
            .execute(params![conversation.0, as_session_id])?;
        transaction.commit()?;
        Ok(())
    }

    fn set_archived(&mut self, conversation: ConversationId, archived: bool) -> Result<bool> {
        let transaction = self.transaction()?;
        let changed = forget::set_archived(&transaction, conversation, archived.then(now_ms))?;
        transaction.commit()?;
        self.apply_index_tasks()?;
        Ok(changed)
    }

    /// Applies the index work the database queued (`index_tasks`): each row's document is
    /// removed and, when the row exists outside an archived conversation and the index holds
    /// it (within the watermark), added from the database again. The tasks are cleared only
    /// after the index committed. Nothing while another process maintains the index.
    fn apply_index_tasks(&mut self) -> Result<u64> {
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
                && let Some(found) = read::index_row(&self.connection, row)?
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

    /// Gives freed space back: queued index work applied, every index segment merged into one
    /// (deleted documents are dropped) and unused files removed; the database's free pages
    /// returned to the file system (`incremental_vacuum`, or one `VACUUM` that switches a
    /// database created before incremental vacuum), and the WAL truncated.
    fn reclaim(&mut self) -> Result<()> {
        self.apply_index_tasks()?;
        self.commit_index()?;
        if let Some(sink) = self.sink.as_mut() {
            sink.merge_all()?;
            self.index.current().reload()?;
        }
        let mode: i64 = self
            .connection
            .pragma_query_value(None, "auto_vacuum", |row| row.get(0))?;
        if mode == 2 {
            // Each step of the pragma frees one page: step it to the end.
            let mut vacuum = self.connection.prepare("PRAGMA incremental_vacuum")?;
            let mut steps = vacuum.query([])?;
            while steps.next()?.is_some() {}
        } else {
            self.connection
                .execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
        }
        self.connection
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// The next batch of rows whose documents wait for vectors, as the database holds them (not
/// an archived conversation's).
fn waiting_rows(
    connection: &Connection,
    index: &crate::index::RecallIndex,
) -> Result<Vec<IndexRow>> {
    let archived = read::archived_conversations(connection)?;
    let mut rows = Vec::new();
    for row in index.waiting_for_vectors(FILL_BATCH)? {
        rows.extend(read::index_row(connection, row)?);
    }
    rows.retain(|row| !archived.contains(&row.conversation()));
    Ok(rows)
}
