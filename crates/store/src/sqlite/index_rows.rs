//! What the recall index reads of the rows: messages and summaries streamed in id order from a
//! watermark (batches decoded across the cores), one row as the index holds it, a message's
//! neighbour, and the highest ids ever assigned.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use vilvona_core::message::AgentMessage;

use crate::codec;
use crate::error::Result;
use crate::index::{IndexRow, IndexedRow, neighbour_of};

/// Streams messages with `id > after`, in id order, with their text and neighbours (to index
/// them); returns the ids of rows that could not be decoded (skipped).
pub(crate) fn for_each_message_after(
    connection: &Connection,
    after: i64,
    f: impl FnMut(IndexRow) -> Result<()>,
) -> Result<Vec<i64>> {
    for_each_message_between(connection, after, i64::MAX, Neighbours::Read, |_| true, f)
}

/// [`for_each_message_after`], skipping (before parsing them) rows whose JSON fails `keep`.
pub(crate) fn for_each_message_after_where(
    connection: &Connection,
    after: i64,
    neighbours: Neighbours,
    keep: impl Fn(&str) -> bool + Sync,
    f: impl FnMut(IndexRow) -> Result<()>,
) -> Result<Vec<i64>> {
    for_each_message_between(connection, after, i64::MAX, neighbours, keep, f)
}

/// One row as the index holds it (`None` when it no longer exists or cannot be decoded).
pub(crate) fn index_row(connection: &Connection, row: IndexedRow) -> Result<Option<IndexRow>> {
    let mut found = None;
    let keep = |row: IndexRow| -> Result<()> {
        found = Some(row);
        Ok(())
    };
    match row {
        IndexedRow::Message(id) => {
            for_each_message_between(connection, id - 1, id, Neighbours::Read, |_| true, keep)?;
        }
        IndexedRow::Summary(id) => for_each_summary_between(connection, id - 1, id, keep)?,
    }
    Ok(found)
}

/// Whether a stream of messages reads each one's neighbour (the message before it), which
/// only its vectors need.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Neighbours {
    Read,
    Skip,
}

/// The neighbour (see `index::neighbour_of`) of a conversation's message at `seq`: the end of
/// the text of the message before it.
pub(crate) fn neighbour_before(
    connection: &Connection,
    conversation: i64,
    seq: i64,
) -> Result<Option<String>> {
    let json: Option<Vec<u8>> = connection
        .prepare_cached(
            "SELECT json FROM messages WHERE conversation_id = ?1 AND seq < ?2
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![conversation, seq], |row| row.get(0))
        .optional()?;
    let Some(json) = json else {
        return Ok(None);
    };
    let json = codec::decode(connection, &json)?;
    Ok(neighbour_of(&AgentMessage::plain_text_of_json(&json)))
}

/// Rows read from SQLite at a time; a batch at least [`PARALLEL_MIN`] long is decoded,
/// screened, parsed and turned into text across the machine's cores (rayon).
const BATCH: usize = 2048;
const PARALLEL_MIN: usize = 64;

/// Streams messages with `after < id <= through` in id order. Rows are read in batches; each
/// batch is decompressed, screened by `keep` (on the JSON, before parsing), parsed and turned
/// into text — in parallel for a long batch (catching up, rebuilding) — then the blob text is
/// added and `f` called, in id order. Returns the ids of rows that could not be decoded.
fn for_each_message_between(
    connection: &Connection,
    after: i64,
    through: i64,
    neighbours: Neighbours,
    keep: impl Fn(&str) -> bool + Sync,
    mut f: impl FnMut(IndexRow) -> Result<()>,
) -> Result<Vec<i64>> {
    use rayon::prelude::*;
    type Raw = (i64, i64, String, String, i64, Vec<u8>, i64);
    // Each conversation's last message streamed, as its next message's neighbour.
    let mut last: HashMap<i64, Option<String>> = HashMap::new();
    /// A row's text and the blobs it references (`None`: screened out), or why it cannot be
    /// decoded.
    type Parsed = rusqlite::Result<Option<(String, Vec<String>)>>;
    // Dictionaries are looked up on this thread (the only one with the connection) and the
    // rows decoded with them off it.
    type Dictionary = rusqlite::Result<Option<codec::Decoder>>;
    let parse = |(raw, dictionary): (&Raw, Dictionary)| -> Parsed {
        let json = codec::decode_with(&raw.5, dictionary?.as_deref())?;
        if !keep(&json) {
            return Ok(None);
        }
        Ok(Some(match serde_json::from_str::<AgentMessage>(&json) {
            Ok(message) => (
                message.plain_text(),
                crate::blobs::referenced_blobs(&message),
            ),
            Err(_) => (String::new(), Vec::new()),
        }))
    };
    let mut statement = connection.prepare_cached(
        "SELECT m.id, m.conversation_id, c.agent_id, m.role, m.created_at, m.json, m.seq
         FROM messages m JOIN conversations c ON c.id = m.conversation_id
         WHERE m.id > ?1 AND m.id <= ?2 ORDER BY m.id",
    )?;
    let mut rows = statement.query([after, through])?;
    let mut undecodable = Vec::new();
    let mut batch: Vec<Raw> = Vec::new();
    loop {
        let row = rows.next()?;
        if let Some(row) = row {
            batch.push((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
                row.get(6)?,
            ));
            if batch.len() < BATCH {
                continue;
            }
        }
        let dictionaries: Vec<Dictionary> = batch
            .iter()
            .map(|raw| codec::dictionary_of(connection, &raw.5))
            .collect();
        let parsed: Vec<Parsed> = if batch.len() >= PARALLEL_MIN {
            batch.par_iter().zip(dictionaries).map(parse).collect()
        } else {
            batch.iter().zip(dictionaries).map(parse).collect()
        };
        for ((id, conversation, agent, role, time_ms, _, seq), parsed) in
            std::mem::take(&mut batch).into_iter().zip(parsed)
        {
            // One damaged row (a flipped byte in its page) is skipped and named, never a
            // reason for the rest to go unindexed or unsearched.
            let (mut text, blobs) = match parsed {
                Ok(Some(parsed)) => parsed,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(message = id, %error, "a stored message cannot be decoded; skipped");
                    undecodable.push(id);
                    continue;
                }
            };
            let neighbour = match neighbours {
                Neighbours::Read => {
                    let before = match last.remove(&conversation) {
                        Some(before) => before,
                        None => neighbour_before(connection, conversation, seq)?,
                    };
                    last.insert(conversation, neighbour_of(&text));
                    before
                }
                Neighbours::Skip => None,
            };
            super::blobs::indexed_text(connection, &mut text, &blobs)?;
            f(IndexRow {
                row: IndexedRow::Message(id),
                conversation,
                agent,
                role,
                time_ms,
                text,
                neighbour,
            })?;
        }
        if row.is_none() {
            break;
        }
    }
    Ok(undecodable)
}

/// Streams summaries with `id > after`, in id order.
pub(crate) fn for_each_summary_after(
    connection: &Connection,
    after: i64,
    f: impl FnMut(IndexRow) -> Result<()>,
) -> Result<()> {
    for_each_summary_between(connection, after, i64::MAX, f)
}

fn for_each_summary_between(
    connection: &Connection,
    after: i64,
    through: i64,
    mut f: impl FnMut(IndexRow) -> Result<()>,
) -> Result<()> {
    let mut statement = connection.prepare_cached(
        "SELECT s.id, s.conversation_id, c.agent_id, coalesce(s.latest_at, s.created_at), s.content
         FROM summaries s JOIN conversations c ON c.id = s.conversation_id
         WHERE s.id > ?1 AND s.id <= ?2 ORDER BY s.id",
    )?;
    let mut rows = statement.query([after, through])?;
    while let Some(row) = rows.next()? {
        f(IndexRow {
            row: IndexedRow::Summary(row.get(0)?),
            conversation: row.get(1)?,
            agent: row.get(2)?,
            role: crate::SUMMARY_ROLE.to_owned(),
            time_ms: row.get(3)?,
            text: row.get(4)?,
            neighbour: None,
        })?;
    }
    Ok(())
}

/// The highest message and summary ids ever assigned: the newest rows', or higher when
/// forgetting removed the newest (ids are never reused: the index would take a new row for
/// one it already holds).
pub(crate) fn max_ids(connection: &Connection) -> Result<(i64, i64)> {
    Ok(connection
        .prepare_cached(
            "SELECT max(coalesce((SELECT max(id) FROM messages), 0),
                        coalesce((SELECT CAST(value AS INTEGER) FROM store_state
                                  WHERE key = 'highest_message_id'), 0)),
                    max(coalesce((SELECT max(id) FROM summaries), 0),
                        coalesce((SELECT CAST(value AS INTEGER) FROM store_state
                                  WHERE key = 'highest_summary_id'), 0))",
        )?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))?)
}
