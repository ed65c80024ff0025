//! Export and import on PostgreSQL: the same archive, the same rules and the same read-back
//! check as on SQLite (twin: `crate::sqlite::archive`; the checks both make:
//! `crate::archive`), in PostgreSQL's SQL.

use std::collections::{BTreeMap, HashMap};

use super::Sql;
use vilvona_core::archive::{
    ArchivedBlob, ArchivedItem, ArchivedMessage, ArchivedRef, ArchivedSession, ArchivedSummary,
    ArchivedTurn, ImportReport, SessionArchive, SessionName,
};

use super::{at, count};
use crate::archive::{check, first_difference, hex, refused};
use crate::error::{Result, StoreError};
use crate::types::ConversationId;

/// Reads a conversation's whole history (run it inside one repeatable-read transaction).
pub(crate) async fn export(
    client: &impl Sql,
    conversation: ConversationId,
) -> Result<SessionArchive> {
    let id = conversation.0;
    let row = client
        .row_opt(
            "SELECT agent_id, session_id, session_key, archived_at, created_at, next_seq,
                    next_position, forgotten_messages
             FROM conversations WHERE id = $1",
            &[&id],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "conversation",
            id: id.to_string(),
        })?;
    let session = ArchivedSession {
        agent_id: at(&row, 0)?,
        session_id: at(&row, 1)?,
        session_key: at(&row, 2)?,
        archived_at_ms: at(&row, 3)?,
        created_at_ms: at(&row, 4)?,
        next_seq: count(&row, 5)?,
        next_position: at(&row, 6)?,
        forgotten_messages: count(&row, 7)?,
    };
    let mut seq_of: HashMap<i64, u64> = HashMap::new();
    let mut messages = Vec::new();
    for row in client
        .rows(
            "SELECT m.id, m.seq, m.role, m.json, m.tokens, m.ingest_key, m.created_at,
                    coalesce((SELECT array_agg(r.blob_id ORDER BY r.blob_id COLLATE \"C\") FROM blob_references r
                              WHERE r.message_id = m.id), '{}')
             FROM messages m WHERE m.conversation_id = $1 ORDER BY m.seq",
            &[&id],
        )
        .await?
    {
        let seq = count(&row, 1)?;
        seq_of.insert(at(&row, 0)?, seq);
        messages.push(ArchivedMessage {
            seq,
            role: at(&row, 2)?,
            json: at(&row, 3)?,
            tokens: count(&row, 4)?,
            ingest_key: hex(at::<&[u8]>(&row, 5)?),
            created_at_ms: at(&row, 6)?,
            blobs: at(&row, 7)?,
            origin_id: Some(at(&row, 0)?),
        });
    }
    let mut summary_ids: HashMap<i64, String> = HashMap::new();
    let mut summaries = Vec::new();
    for row in client
        .rows(
            "SELECT id, summary_id, depth, kind, content, tokens, earliest_at, latest_at,
                    first_seq, last_seq, level, summarizer, created_at
             FROM summaries WHERE conversation_id = $1 ORDER BY id",
            &[&id],
        )
        .await?
    {
        let row_id: i64 = at(&row, 0)?;
        let summary_id: String = at(&row, 1)?;
        summary_ids.insert(row_id, summary_id.clone());
        summaries.push((
            row_id,
            ArchivedSummary {
                summary_id,
                depth: count(&row, 2)? as u32,
                kind: at(&row, 3)?,
                content: at(&row, 4)?,
                tokens: count(&row, 5)?,
                earliest_at_ms: at(&row, 6)?,
                latest_at_ms: at(&row, 7)?,
                first_seq: count(&row, 8)?,
                last_seq: count(&row, 9)?,
                level: at(&row, 10)?,
                summarizer: at(&row, 11)?,
                created_at_ms: at(&row, 12)?,
                children: Vec::new(),
            },
        ));
    }
    // A reference in portable terms: this session's rows by seq or summary id, another's by
    // its session (messages) or its public id (summaries).
    let reference = async |message: Option<i64>, summary: Option<i64>| -> Result<ArchivedRef> {
        if let Some(message) = message {
            if let Some(seq) = seq_of.get(&message) {
                return Ok(ArchivedRef::Message {
                    seq: *seq,
                    from: None,
                });
            }
            let row = client
                .row_opt(
                    "SELECT c.agent_id, c.session_id, m.seq FROM messages m
                     JOIN conversations c ON c.id = m.conversation_id WHERE m.id = $1",
                    &[&message],
                )
                .await?
                .ok_or_else(|| {
                    StoreError::CorruptRow(format!(
                        "an item names message {message}, which is not stored"
                    ))
                })?;
            return Ok(ArchivedRef::Message {
                seq: count(&row, 2)?,
                from: Some(SessionName {
                    agent_id: at(&row, 0)?,
                    session_id: at(&row, 1)?,
                }),
            });
        }
        let summary = summary.ok_or_else(|| {
            StoreError::CorruptRow("an item that is neither a message nor a summary".to_owned())
        })?;
        if let Some(summary_id) = summary_ids.get(&summary) {
            return Ok(ArchivedRef::Summary {
                summary_id: summary_id.clone(),
            });
        }
        let row = client
            .row_opt(
                "SELECT summary_id FROM summaries WHERE id = $1",
                &[&summary],
            )
            .await?
            .ok_or_else(|| {
                StoreError::CorruptRow(format!(
                    "an item names summary row {summary}, which is not stored"
                ))
            })?;
        Ok(ArchivedRef::Summary {
            summary_id: at(&row, 0)?,
        })
    };
    for (row_id, summary) in &mut summaries {
        for row in client
            .rows(
                "SELECT child_message_id, child_summary_id FROM summary_edges
                 WHERE parent_id = $1 ORDER BY ordinal",
                &[&*row_id],
            )
            .await?
        {
            summary
                .children
                .push(reference(at(&row, 0)?, at(&row, 1)?).await?);
        }
    }
    let mut context = Vec::new();
    for row in client
        .rows(
            "SELECT position, message_id, summary_id, tokens FROM context_items
             WHERE conversation_id = $1 ORDER BY position",
            &[&id],
        )
        .await?
    {
        context.push(ArchivedItem {
            position: at(&row, 0)?,
            item: reference(at(&row, 1)?, at(&row, 2)?).await?,
            tokens: count(&row, 3)?,
        });
    }
    let blobs = client
        .rows(
            "SELECT blob_id, kind, bytes, lines, description, content, created_at FROM blobs
             WHERE conversation_id = $1
                OR blob_id IN (SELECT blob_id FROM blob_references WHERE conversation_id = $1)
             ORDER BY blob_id COLLATE \"C\"",
            &[&id],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(ArchivedBlob {
                blob_id: at(row, 0)?,
                kind: at(row, 1)?,
                bytes: count(row, 2)?,
                lines: count(row, 3)?,
                description: at(row, 4)?,
                content: at(row, 5)?,
                created_at_ms: at(row, 6)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let turns = client
        .rows(
            "SELECT advancement_key, committed_at FROM turn_commits
             WHERE conversation_id = $1 ORDER BY committed_at, advancement_key COLLATE \"C\"",
            &[&id],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(ArchivedTurn {
                advancement_key: at(row, 0)?,
                committed_at_ms: at(row, 1)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let state = client
        .rows(
            "SELECT key, value FROM conversation_state WHERE conversation_id = $1",
            &[&id],
        )
        .await?
        .iter()
        .map(|row| Ok((at(row, 0)?, at(row, 1)?)))
        .collect::<Result<BTreeMap<String, String>>>()?;
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

/// The row a reference names: the archive's own rows first, then the store's.
async fn resolve(
    client: &impl Sql,
    conversation: ConversationId,
    messages: &HashMap<u64, i64>,
    summaries: &HashMap<String, i64>,
    item: &ArchivedRef,
    owner: &str,
) -> Result<(Option<i64>, Option<i64>)> {
    match item {
        ArchivedRef::Message { seq, from: None } => match messages.get(seq) {
            Some(id) => Ok((Some(*id), None)),
            None => Err(refused(format!(
                "{owner} names message {seq} of this session, which the file does not hold"
            ))),
        },
        ArchivedRef::Message {
            seq,
            from: Some(session),
        } => match client
            .row_opt(
                "SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                 WHERE c.agent_id = $1 AND c.session_id = $2 AND m.seq = $3 AND c.id <> $4",
                &[
                    &session.agent_id,
                    &session.session_id,
                    &(*seq as i64),
                    &conversation.0,
                ],
            )
            .await?
        {
            Some(row) => Ok((Some(at(&row, 0)?), None)),
            None => Err(refused(format!(
                "{owner} names message {seq} of session {:?} (agent {:?}), which this store does not hold; import that session first",
                session.session_id, session.agent_id
            ))),
        },
        ArchivedRef::Summary { summary_id } => {
            if let Some(id) = summaries.get(summary_id) {
                return Ok((None, Some(*id)));
            }
            match client
                .row_opt(
                    "SELECT id FROM summaries WHERE summary_id = $1",
                    &[summary_id],
                )
                .await?
            {
                Some(row) => Ok((None, Some(at(&row, 0)?))),
                None => Err(refused(format!(
                    "{owner} names summary {summary_id}, which neither the file (before it) nor this store holds; import the session it belongs to first"
                ))),
            }
        }
    }
}

/// Stores an archive as a new conversation inside the caller's transaction and checks it
/// reads back equal; the caller commits only on success.
pub(crate) async fn import(
    client: &impl Sql,
    archive: &SessionArchive,
) -> Result<(ConversationId, ImportReport)> {
    let keys = check(archive)?;
    let session = &archive.session;
    let existing = client
        .row_opt(
            "SELECT c.id,
                    (SELECT count(*) FROM messages WHERE conversation_id = c.id),
                    (SELECT count(*) FROM summaries WHERE conversation_id = c.id)
             FROM conversations c WHERE c.agent_id = $1 AND c.session_id = $2 FOR UPDATE",
            &[&session.agent_id, &session.session_id],
        )
        .await?;
    let counters: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
        &session.session_key,
        &session.archived_at_ms,
        &session.created_at_ms,
        &(session.next_seq as i64),
        &session.next_position,
        &(session.forgotten_messages as i64),
    ];
    let conversation = match existing {
        Some(row) if count(&row, 1)? > 0 || count(&row, 2)? > 0 => {
            return Err(refused(format!(
                "session {:?} of agent {:?} already holds {} messages and {} summaries in this store; forget it first, or import into another store",
                session.session_id,
                session.agent_id,
                count(&row, 1)?,
                count(&row, 2)?
            )));
        }
        Some(row) => {
            let id: i64 = at(&row, 0)?;
            for sql in [
                "DELETE FROM context_items WHERE conversation_id = $1",
                "DELETE FROM conversation_state WHERE conversation_id = $1",
                "DELETE FROM turn_commits WHERE conversation_id = $1",
            ] {
                client.run(sql, &[&id]).await?;
            }
            let mut params = counters.to_vec();
            params.push(&id);
            client
                .run(
                    "UPDATE conversations SET session_key = $1, archived_at = $2, created_at = $3,
                         next_seq = $4, next_position = $5, forgotten_messages = $6
                     WHERE id = $7",
                    &params,
                )
                .await?;
            ConversationId(id)
        }
        None => {
            let mut params = counters.to_vec();
            params.push(&session.agent_id);
            params.push(&session.session_id);
            let row = client
                .row(
                    "INSERT INTO conversations (session_key, archived_at, created_at, next_seq,
                         next_position, forgotten_messages, agent_id, session_id)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
                    &params,
                )
                .await?;
            ConversationId(at(&row, 0)?)
        }
    };
    let mut report = ImportReport {
        session_id: session.session_id.clone(),
        ..ImportReport::default()
    };
    super::follow::order_rows(client).await?;
    for blob in &archive.blobs {
        report.blobs += client
            .run(
                "INSERT INTO blobs (blob_id, conversation_id, kind, bytes, lines, description, content, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                &[
                    &blob.blob_id,
                    &conversation.0,
                    &blob.kind,
                    &(blob.bytes as i64),
                    &(blob.lines as i64),
                    &blob.description,
                    &blob.content,
                    &blob.created_at_ms,
                ],
            )
            .await?;
    }
    let mut messages: HashMap<u64, i64> = HashMap::new();
    for (message, ingest_key) in archive.messages.iter().zip(keys) {
        let row = client
            .row(
                "INSERT INTO messages (id, conversation_id, seq, role, json, tokens, ingest_key, created_at)
                 VALUES (nextval('message_ids'), $1, $2, $3, $4, $5, $6, $7) RETURNING id",
                &[
                    &conversation.0,
                    &(message.seq as i64),
                    &message.role,
                    &message.json,
                    &(message.tokens as i64),
                    &ingest_key,
                    &message.created_at_ms,
                ],
            )
            .await?;
        let id: i64 = at(&row, 0)?;
        messages.insert(message.seq, id);
        for blob in &message.blobs {
            client
                .run(
                    "INSERT INTO blob_references (message_id, blob_id, conversation_id) VALUES ($1, $2, $3)",
                    &[&id, blob, &conversation.0],
                )
                .await?;
        }
        report.messages += 1;
    }
    let mut summaries: HashMap<String, i64> = HashMap::new();
    for summary in &archive.summaries {
        let owner = format!("summary {}", summary.summary_id);
        let taken = client
            .row_opt(
                "SELECT 1 FROM summaries WHERE summary_id = $1",
                &[&summary.summary_id],
            )
            .await?;
        if taken.is_some() {
            return Err(refused(format!(
                "{owner} is already stored; a session's summaries are stored once per store"
            )));
        }
        let mut children = Vec::with_capacity(summary.children.len());
        for child in &summary.children {
            children
                .push(resolve(client, conversation, &messages, &summaries, child, &owner).await?);
        }
        let row = client
            .row(
                super::write::INSERT_SUMMARY,
                &[
                    &summary.summary_id,
                    &conversation.0,
                    &i64::from(summary.depth),
                    &summary.kind,
                    &summary.content,
                    &(summary.tokens as i64),
                    &summary.earliest_at_ms,
                    &summary.latest_at_ms,
                    &(summary.first_seq as i64),
                    &(summary.last_seq as i64),
                    &summary.level,
                    &summary.summarizer,
                    &summary.created_at_ms,
                ],
            )
            .await?;
        let id: i64 = at(&row, 0)?;
        super::write::insert_edges(client, id, &children).await?;
        summaries.insert(summary.summary_id.clone(), id);
        report.summaries += 1;
    }
    let mut tokens: i64 = 0;
    for (index, item) in archive.context.iter().enumerate() {
        let owner = format!("context item {index}");
        let (message, summary) = resolve(
            client,
            conversation,
            &messages,
            &summaries,
            &item.item,
            &owner,
        )
        .await?;
        client
            .run(
                "INSERT INTO context_items (conversation_id, position, message_id, summary_id, tokens)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &conversation.0,
                    &item.position,
                    &message,
                    &summary,
                    &(item.tokens as i64),
                ],
            )
            .await?;
        tokens += item.tokens as i64;
        report.context_items += 1;
    }
    client
        .run(
            "UPDATE conversations SET context_tokens = $2 WHERE id = $1",
            &[&conversation.0, &tokens],
        )
        .await?;
    for turn in &archive.turns {
        client
            .run(
                "INSERT INTO turn_commits (conversation_id, advancement_key, committed_at) VALUES ($1, $2, $3)",
                &[&conversation.0, &turn.advancement_key, &turn.committed_at_ms],
            )
            .await?;
    }
    for (key, value) in &archive.state {
        client
            .run(
                "INSERT INTO conversation_state (conversation_id, key, value) VALUES ($1, $2, $3)",
                &[&conversation.0, key, value],
            )
            .await?;
    }
    let stored = export(client, conversation).await?;
    if let Some(difference) = first_difference(archive, &stored) {
        return Err(refused(format!(
            "the store read back differs from the file ({difference}); nothing was imported"
        )));
    }
    report.verified = true;
    Ok((conversation, report))
}
