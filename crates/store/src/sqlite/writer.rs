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
use super::{archive, blobs, forget, index_rows, read};
use crate::codec::{self, EncoderSlot};
use crate::error::{Result, StoreError};
use crate::index::filler::VectorFiller;
use crate::index::{IndexDoc, IndexSink, IndexSlot, IndexedRow, Waiting, neighbour_of};
use crate::rows::{POSITION_STEP, PreparedMessage, hex16, sequence_key, summary_id};
use crate::types::*;
use vilvona_core::archive::{ImportReport, SessionArchive};
use vilvona_core::clock::now_ms;

mod upkeep;

use upkeep::{INDEX_COMMIT_DELAY, INDEX_COMMIT_DOCS, LOCK_RETRY, Retry};

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
        // Ids are assigned here, above every id ever used (see `index_rows::max_ids`).
        let mut next_id = index_rows::max_ids(transaction.reader())?.0 + 1;
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
                index_rows::neighbour_before(&self.connection, conversation.0, *seq)?
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
                index_rows::max_ids(transaction.reader())?.1 + 1
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
