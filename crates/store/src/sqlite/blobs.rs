//! Large content's rows on SQLite: references recorded as messages are written, a blob's text
//! read for the index and for searches, and who may read it (what is shared: `crate::blobs`).

use rusqlite::{Connection, OptionalExtension, params};
use vilvona_core::message::AgentMessage;

use super::write::WriteTx;
use crate::blobs::{BLOB_ID_KEY, INDEXED_BLOB_BYTES, referenced_blobs};
use crate::error::Result;
use crate::types::ConversationId;

/// Records that a message references blobs (those the store holds).
/// One reference of a message to a blob that exists.
const RECORD_REFERENCE: &str =
    "INSERT OR IGNORE INTO blob_references (blob_id, message_id, conversation_id)
     SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM blobs WHERE blob_id = ?1)";

pub(crate) fn record_references(
    connection: &WriteTx<'_>,
    message: i64,
    conversation: ConversationId,
    blobs: &[String],
) -> Result<()> {
    let mut insert = connection.prepare_cached(RECORD_REFERENCE)?;
    for blob in blobs {
        insert.execute(params![blob, message, conversation.0])?;
    }
    Ok(())
}

/// The text the index holds for a message: its own text, then the (bounded) text of each blob
/// it references.
pub(crate) fn indexed_text(
    connection: &Connection,
    text: &mut String,
    blobs: &[String],
) -> Result<()> {
    for blob in blobs {
        if let Some(content) = content(connection, blob)? {
            let end = crate::tokenize::floor_boundary(&content, INDEXED_BLOB_BYTES);
            text.push('\n');
            text.push_str(&content[..end]);
        }
    }
    Ok(())
}

pub(crate) fn content(connection: &Connection, blob_id: &str) -> Result<Option<String>> {
    Ok(connection
        .prepare_cached("SELECT content FROM blobs WHERE blob_id = ?1")?
        .query_row([blob_id], |row| row.get(0))
        .optional()?)
}

/// The blobs a stored message references.
pub(crate) fn of_message(connection: &Connection, message: i64) -> Result<Vec<String>> {
    let mut statement = connection.prepare_cached(
        "SELECT blob_id FROM blob_references WHERE message_id = ?1 ORDER BY blob_id",
    )?;
    let ids = statement
        .query_map([message], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(ids)
}

/// The conversations that may read a blob: the one that stored it first and every one whose
/// messages reference it.
pub(crate) fn readers(connection: &Connection, blob_id: &str) -> Result<Vec<ConversationId>> {
    let mut statement = connection.prepare_cached(
        "SELECT conversation_id FROM blobs WHERE blob_id = ?1
         UNION SELECT conversation_id FROM blob_references WHERE blob_id = ?1",
    )?;
    let ids = statement
        .query_map([blob_id], |row| row.get(0).map(ConversationId))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(ids)
}

/// Records the references of messages stored before the store kept them (the migration to
/// schema 2, in the one transaction of the pending migrations).
pub(crate) fn backfill_references(connection: &Connection) -> Result<()> {
    let mut insert = connection.prepare_cached(RECORD_REFERENCE)?;
    let mut statement =
        connection.prepare("SELECT id, conversation_id, json FROM messages ORDER BY id")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        let Ok(json) = row
            .get::<_, Vec<u8>>(2)
            .and_then(|bytes| crate::codec::decode(connection, &bytes))
        else {
            continue;
        };
        if !json.contains(BLOB_ID_KEY) {
            continue;
        }
        if let Ok(message) = serde_json::from_str::<AgentMessage>(&json) {
            let (id, conversation): (i64, i64) = (row.get(0)?, row.get(1)?);
            for blob in referenced_blobs(&message) {
                insert.execute(params![blob, id, conversation])?;
            }
        }
    }
    Ok(())
}
