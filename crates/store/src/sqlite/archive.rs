//! Exporting a conversation's whole history as a [`SessionArchive`] and importing one as a new
//! conversation, on SQLite (twin: `crate::pg::archive`; the checks both make: `crate::archive`).
//!
//! An export reads in one transaction, so it is one snapshot even while another process
//! compacts. An import writes in one transaction, then exports what it wrote through the same
//! transaction and compares: the transaction commits only when the two are equal, so a store
//! never keeps half an import or an import that differs from its file.

use std::collections::{BTreeMap, HashMap};

use rusqlite::{Connection, OptionalExtension, params};
use vilvona_core::archive::{
    ArchivedBlob, ArchivedItem, ArchivedMessage, ArchivedRef, ArchivedSession, ArchivedSummary,
    ArchivedTurn, ImportReport, SessionArchive, SessionName,
};

use super::index_rows;
use super::write::WriteTx;
use crate::archive::{check, first_difference, hex, refused};
use crate::codec::{self, Encoder};
use crate::error::{Result, StoreError};
use crate::types::ConversationId;

/// Reads a conversation's whole history (run it inside one transaction for a snapshot).
pub(crate) fn export(
    connection: &Connection,
    conversation: ConversationId,
) -> Result<SessionArchive> {
    let id = conversation.0;
    let session = connection
        .prepare_cached(
            "SELECT agent_id, session_id, session_key, archived_at, created_at, next_seq,
                    next_position, forgotten_messages
             FROM conversations WHERE id = ?1",
        )?
        .query_row([id], |row| {
            Ok(ArchivedSession {
                agent_id: row.get(0)?,
                session_id: row.get(1)?,
                session_key: row.get(2)?,
                archived_at_ms: row.get(3)?,
                created_at_ms: row.get(4)?,
                next_seq: row.get::<_, i64>(5)? as u64,
                next_position: row.get(6)?,
                forgotten_messages: row.get::<_, i64>(7)? as u64,
            })
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound {
            what: "conversation",
            id: id.to_string(),
        })?;

    // Row ids of this conversation's messages and summaries, to name references portably.
    let mut seq_of: HashMap<i64, u64> = HashMap::new();
    let mut messages = Vec::new();
    {
        let mut blobs_of = connection.prepare_cached(
            "SELECT blob_id FROM blob_references WHERE message_id = ?1 ORDER BY blob_id",
        )?;
        let mut statement = connection.prepare_cached(
            "SELECT id, seq, role, json, tokens, ingest_key, created_at
             FROM messages WHERE conversation_id = ?1 ORDER BY seq",
        )?;
        let mut rows = statement.query([id])?;
        while let Some(row) = rows.next()? {
            let row_id: i64 = row.get(0)?;
            let seq = row.get::<_, i64>(1)? as u64;
            seq_of.insert(row_id, seq);
            let blobs = blobs_of
                .query_map([row_id], |row| row.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()?;
            messages.push(ArchivedMessage {
                seq,
                role: row.get(2)?,
                json: codec::decode(connection, &row.get::<_, Vec<u8>>(3)?)?,
                tokens: row.get::<_, i64>(4)? as u64,
                ingest_key: hex(&row.get::<_, Vec<u8>>(5)?),
                created_at_ms: row.get(6)?,
                blobs,
                origin_id: Some(row_id),
            });
        }
    }

    let mut summary_ids: HashMap<i64, String> = HashMap::new();
    let mut summaries = Vec::new();
    {
        let mut statement = connection.prepare_cached(
            "SELECT id, summary_id, depth, kind, content, tokens, earliest_at, latest_at,
                    first_seq, last_seq, level, summarizer, created_at
             FROM summaries WHERE conversation_id = ?1 ORDER BY id",
        )?;
        let mut rows = statement.query([id])?;
        while let Some(row) = rows.next()? {
            let row_id: i64 = row.get(0)?;
            let summary_id: String = row.get(1)?;
            summary_ids.insert(row_id, summary_id.clone());
            summaries.push((
                row_id,
                ArchivedSummary {
                    summary_id,
                    depth: row.get(2)?,
                    kind: row.get(3)?,
                    content: row.get(4)?,
                    tokens: row.get::<_, i64>(5)? as u64,
                    earliest_at_ms: row.get(6)?,
                    latest_at_ms: row.get(7)?,
                    first_seq: row.get::<_, i64>(8)? as u64,
                    last_seq: row.get::<_, i64>(9)? as u64,
                    level: row.get(10)?,
                    summarizer: row.get(11)?,
                    created_at_ms: row.get(12)?,
                    children: Vec::new(),
                },
            ));
        }
    }
    let reference = |message: Option<i64>, summary: Option<i64>| -> Result<ArchivedRef> {
        match (message, summary) {
            (Some(message), _) => match seq_of.get(&message) {
                Some(seq) => Ok(ArchivedRef::Message {
                    seq: *seq,
                    from: None,
                }),
                None => foreign_message(connection, message),
            },
            (None, Some(summary)) => match summary_ids.get(&summary) {
                Some(summary_id) => Ok(ArchivedRef::Summary {
                    summary_id: summary_id.clone(),
                }),
                None => foreign_summary(connection, summary),
            },
            (None, None) => Err(StoreError::CorruptRow(
                "an item that is neither a message nor a summary".to_owned(),
            )),
        }
    };
    {
        let mut edges = connection.prepare_cached(
            "SELECT child_message_id, child_summary_id FROM summary_edges
             WHERE parent_id = ?1 ORDER BY ordinal",
        )?;
        for (row_id, summary) in &mut summaries {
            let children = edges
                .query_map([*row_id], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<Vec<(Option<i64>, Option<i64>)>>>()?;
            for (message, child) in children {
                summary.children.push(reference(message, child)?);
            }
        }
    }
    let mut context = Vec::new();
    {
        let mut statement = connection.prepare_cached(
            "SELECT position, message_id, summary_id, tokens FROM context_items
             WHERE conversation_id = ?1 ORDER BY position",
        )?;
        let rows = statement
            .query_map([id], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect::<rusqlite::Result<Vec<(i64, Option<i64>, Option<i64>, i64)>>>()?;
        for (position, message, summary, tokens) in rows {
            context.push(ArchivedItem {
                position,
                item: reference(message, summary)?,
                tokens: tokens as u64,
            });
        }
    }
    let blobs = connection
        .prepare_cached(
            "SELECT blob_id, kind, bytes, lines, description, content, created_at FROM blobs
             WHERE conversation_id = ?1
                OR blob_id IN (SELECT blob_id FROM blob_references WHERE conversation_id = ?1)
             ORDER BY blob_id",
        )?
        .query_map([id], |row| {
            Ok(ArchivedBlob {
                blob_id: row.get(0)?,
                kind: row.get(1)?,
                bytes: row.get::<_, i64>(2)? as u64,
                lines: row.get::<_, i64>(3)? as u64,
                description: row.get(4)?,
                content: row.get(5)?,
                created_at_ms: row.get(6)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let turns = connection
        .prepare_cached(
            "SELECT advancement_key, committed_at FROM turn_commits
             WHERE conversation_id = ?1 ORDER BY committed_at, advancement_key",
        )?
        .query_map([id], |row| {
            Ok(ArchivedTurn {
                advancement_key: row.get(0)?,
                committed_at_ms: row.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let state = connection
        .prepare_cached("SELECT key, value FROM conversation_state WHERE conversation_id = ?1")?
        .query_map([id], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<BTreeMap<String, String>>>()?;
    Ok(SessionArchive {
        session,
        messages,
        blobs,
        summaries: summaries.into_iter().map(|(_, summary)| summary).collect(),
        context,
        turns,
        state,
    })
}

/// Another conversation's message, named by its session and `seq`.
fn foreign_message(connection: &Connection, message: i64) -> Result<ArchivedRef> {
    connection
        .prepare_cached(
            "SELECT c.agent_id, c.session_id, m.seq FROM messages m
             JOIN conversations c ON c.id = m.conversation_id WHERE m.id = ?1",
        )?
        .query_row([message], |row| {
            Ok(ArchivedRef::Message {
                seq: row.get::<_, i64>(2)? as u64,
                from: Some(SessionName {
                    agent_id: row.get(0)?,
                    session_id: row.get(1)?,
                }),
            })
        })
        .optional()?
        .ok_or_else(|| {
            StoreError::CorruptRow(format!(
                "an item names message {message}, which is not stored"
            ))
        })
}

/// Another conversation's summary, named by its public id.
fn foreign_summary(connection: &Connection, summary: i64) -> Result<ArchivedRef> {
    connection
        .prepare_cached("SELECT summary_id FROM summaries WHERE id = ?1")?
        .query_row([summary], |row| {
            Ok(ArchivedRef::Summary {
                summary_id: row.get(0)?,
            })
        })
        .optional()?
        .ok_or_else(|| {
            StoreError::CorruptRow(format!(
                "an item names summary row {summary}, which is not stored"
            ))
        })
}

/// Rows an import resolves references against: its own, then the store's.
struct Resolver<'a> {
    connection: &'a Connection,
    conversation: ConversationId,
    messages: HashMap<u64, i64>,
    summaries: HashMap<String, i64>,
}

impl Resolver<'_> {
    /// The row of a reference, and whether it is a message.
    fn resolve(&self, item: &ArchivedRef, owner: &str) -> Result<(Option<i64>, Option<i64>)> {
        match item {
            ArchivedRef::Message { seq, from: None } => match self.messages.get(seq) {
                Some(id) => Ok((Some(*id), None)),
                None => Err(refused(format!(
                    "{owner} names message {seq} of this session, which the file does not hold"
                ))),
            },
            ArchivedRef::Message {
                seq,
                from: Some(session),
            } => {
                let found: Option<i64> = self
                    .connection
                    .prepare_cached(
                        "SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE c.agent_id = ?1 AND c.session_id = ?2 AND m.seq = ?3 AND c.id <> ?4",
                    )?
                    .query_row(
                        params![session.agent_id, session.session_id, *seq as i64, self.conversation.0],
                        |row| row.get(0),
                    )
                    .optional()?;
                match found {
                    Some(id) => Ok((Some(id), None)),
                    None => Err(refused(format!(
                        "{owner} names message {seq} of session {:?} (agent {:?}), which this store does not hold; import that session first",
                        session.session_id, session.agent_id
                    ))),
                }
            }
            ArchivedRef::Summary { summary_id } => {
                if let Some(id) = self.summaries.get(summary_id) {
                    return Ok((None, Some(*id)));
                }
                let found: Option<i64> = self
                    .connection
                    .prepare_cached("SELECT id FROM summaries WHERE summary_id = ?1")?
                    .query_row([summary_id], |row| row.get(0))
                    .optional()?;
                match found {
                    Some(id) => Ok((None, Some(id))),
                    None => Err(refused(format!(
                        "{owner} names summary {summary_id}, which neither the file (before it) nor this store holds; import the session it belongs to first"
                    ))),
                }
            }
        }
    }
}

/// Stores an archive as a new conversation in the writer's transaction and checks it reads
/// back equal. The caller commits only on success. Messages are compressed with `encoder`.
pub(crate) fn import(
    transaction: &WriteTx<'_>,
    archive: &SessionArchive,
    encoder: Option<&Encoder>,
) -> Result<(ConversationId, ImportReport)> {
    let keys = check(archive)?;
    let reader = transaction.reader();
    let session = &archive.session;
    let existing: Option<(i64, i64, i64)> = reader
        .prepare_cached(
            "SELECT c.id,
                    (SELECT count(*) FROM messages WHERE conversation_id = c.id),
                    (SELECT count(*) FROM summaries WHERE conversation_id = c.id)
             FROM conversations c WHERE c.agent_id = ?1 AND c.session_id = ?2",
        )?
        .query_row(params![session.agent_id, session.session_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()?;
    let conversation = match existing {
        Some((_, messages, summaries)) if messages > 0 || summaries > 0 => {
            return Err(refused(format!(
                "session {:?} of agent {:?} already holds {messages} messages and {summaries} summaries in this store; forget it first, or import into another store",
                session.session_id, session.agent_id
            )));
        }
        Some((id, _, _)) => {
            // Created by a first lookup and never written: the import fills it. Whatever it
            // held besides rows goes, so the store ends up holding the file's history alone.
            for sql in [
                "DELETE FROM context_items WHERE conversation_id = ?1",
                "DELETE FROM conversation_state WHERE conversation_id = ?1",
                "DELETE FROM turn_commits WHERE conversation_id = ?1",
            ] {
                transaction.prepare_cached(sql)?.execute([id])?;
            }
            transaction
                .prepare_cached(
                    "UPDATE conversations SET session_key = ?2, archived_at = ?3, created_at = ?4,
                         next_seq = ?5, next_position = ?6, forgotten_messages = ?7
                     WHERE id = ?1",
                )?
                .execute(params![
                    id,
                    session.session_key,
                    session.archived_at_ms,
                    session.created_at_ms,
                    session.next_seq as i64,
                    session.next_position,
                    session.forgotten_messages as i64
                ])?;
            ConversationId(id)
        }
        None => {
            transaction
                .prepare_cached(
                    "INSERT INTO conversations (agent_id, session_id, session_key, archived_at,
                         created_at, next_seq, next_position, forgotten_messages)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?
                .execute(params![
                    session.agent_id,
                    session.session_id,
                    session.session_key,
                    session.archived_at_ms,
                    session.created_at_ms,
                    session.next_seq as i64,
                    session.next_position,
                    session.forgotten_messages as i64
                ])?;
            ConversationId(transaction.last_insert_rowid())
        }
    };

    let mut report = ImportReport {
        session_id: session.session_id.clone(),
        ..ImportReport::default()
    };
    {
        let mut insert = transaction.prepare_cached(
            "INSERT OR IGNORE INTO blobs
                 (blob_id, conversation_id, kind, bytes, lines, description, content, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for blob in &archive.blobs {
            report.blobs += insert.execute(params![
                blob.blob_id,
                conversation.0,
                blob.kind,
                blob.bytes as i64,
                blob.lines as i64,
                blob.description,
                blob.content,
                blob.created_at_ms
            ])? as u64;
        }
    }

    let (mut next_message, mut next_summary) = index_rows::max_ids(reader)?;
    let mut resolver = Resolver {
        connection: reader,
        conversation,
        messages: HashMap::new(),
        summaries: HashMap::new(),
    };
    {
        let mut insert = transaction.prepare_cached(
            "INSERT INTO messages (id, conversation_id, seq, role, json, tokens, ingest_key, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut reference = transaction.prepare_cached(
            "INSERT INTO blob_references (message_id, blob_id, conversation_id) VALUES (?1, ?2, ?3)",
        )?;
        for (message, ingest_key) in archive.messages.iter().zip(keys) {
            next_message += 1;
            resolver.messages.insert(message.seq, next_message);
            insert.execute(params![
                next_message,
                conversation.0,
                message.seq as i64,
                message.role,
                codec::encode(&message.json, encoder),
                message.tokens as i64,
                ingest_key,
                message.created_at_ms
            ])?;
            for blob in &message.blobs {
                reference.execute(params![next_message, blob, conversation.0])?;
            }
            report.messages += 1;
        }
    }
    {
        let mut insert = transaction.prepare_cached(
            "INSERT INTO summaries (id, summary_id, conversation_id, depth, kind, content, tokens,
                 earliest_at, latest_at, first_seq, last_seq, level, summarizer, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        )?;
        let mut edge = transaction.prepare_cached(
            "INSERT INTO summary_edges (parent_id, ordinal, child_message_id, child_summary_id)
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut taken = reader.prepare_cached("SELECT 1 FROM summaries WHERE summary_id = ?1")?;
        for summary in &archive.summaries {
            let owner = format!("summary {}", summary.summary_id);
            if taken.exists([&summary.summary_id])? {
                return Err(refused(format!(
                    "{owner} is already stored; a session's summaries are stored once per store"
                )));
            }
            let children = summary
                .children
                .iter()
                .map(|child| resolver.resolve(child, &owner))
                .collect::<Result<Vec<_>>>()?;
            next_summary += 1;
            insert.execute(params![
                next_summary,
                summary.summary_id,
                conversation.0,
                summary.depth,
                summary.kind,
                summary.content,
                summary.tokens as i64,
                summary.earliest_at_ms,
                summary.latest_at_ms,
                summary.first_seq as i64,
                summary.last_seq as i64,
                summary.level,
                summary.summarizer,
                summary.created_at_ms
            ])?;
            for (ordinal, (message, child)) in children.into_iter().enumerate() {
                edge.execute(params![next_summary, ordinal as i64, message, child])?;
            }
            resolver
                .summaries
                .insert(summary.summary_id.clone(), next_summary);
            report.summaries += 1;
        }
    }
    {
        let mut insert = transaction.prepare_cached(
            "INSERT INTO context_items (conversation_id, position, message_id, summary_id, tokens)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let mut tokens: i64 = 0;
        for (at, item) in archive.context.iter().enumerate() {
            let (message, summary) = resolver.resolve(&item.item, &format!("context item {at}"))?;
            insert.execute(params![
                conversation.0,
                item.position,
                message,
                summary,
                item.tokens as i64
            ])?;
            tokens += item.tokens as i64;
            report.context_items += 1;
        }
        transaction
            .prepare_cached("UPDATE conversations SET context_tokens = ?2 WHERE id = ?1")?
            .execute(params![conversation.0, tokens])?;
    }
    {
        let mut insert = transaction.prepare_cached(
            "INSERT INTO turn_commits (conversation_id, advancement_key, committed_at) VALUES (?1, ?2, ?3)",
        )?;
        for turn in &archive.turns {
            insert.execute(params![
                conversation.0,
                turn.advancement_key,
                turn.committed_at_ms
            ])?;
        }
        let mut insert = transaction.prepare_cached(
            "INSERT INTO conversation_state (conversation_id, key, value) VALUES (?1, ?2, ?3)",
        )?;
        for (key, value) in &archive.state {
            insert.execute(params![conversation.0, key, value])?;
        }
    }

    // Read back through the same transaction: what a reader will see once it commits.
    let stored = export(reader, conversation)?;
    if let Some(difference) = first_difference(archive, &stored) {
        return Err(refused(format!(
            "the store read back differs from the file ({difference}); nothing was imported"
        )));
    }
    report.verified = true;
    Ok((conversation, report))
}
