//! Queries. Each takes a connection (a reader's, or the writer's inside its transaction) and
//! uses cached statements; none holds a transaction open.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Row, params};
use vilvona_core::summarize::SummaryKind;

use super::index_rows::{Neighbours, for_each_message_after_where, max_ids};
use crate::codec;
use crate::error::{Result, StoreError};
use crate::types::*;

const CONVERSATION_COLUMNS: &str = "c.id, c.agent_id, c.session_id, c.session_key, c.active,
    c.created_at, c.context_tokens, c.next_seq,
    (SELECT max(m.created_at) FROM messages m WHERE m.conversation_id = c.id
        AND m.seq = c.next_seq - 1), c.archived_at, c.forgotten_messages";

fn conversation_row(row: &Row<'_>) -> rusqlite::Result<Conversation> {
    Ok(Conversation {
        id: ConversationId(row.get(0)?),
        agent_id: row.get(1)?,
        session_id: row.get(2)?,
        session_key: row.get(3)?,
        active: row.get::<_, i64>(4)? != 0,
        created_at_ms: row.get(5)?,
        context_tokens: row.get::<_, i64>(6)?.max(0) as u64,
        message_count: row.get::<_, i64>(7)?.max(0) as u64,
        last_activity_ms: row.get(8)?,
        archived_at_ms: row.get(9)?,
        stored_messages: (row.get::<_, i64>(7)? - row.get::<_, i64>(10)?).max(0) as u64,
    })
}

pub(crate) fn conversation_by_key(
    connection: &Connection,
    key: &ConversationKey,
) -> Result<Option<Conversation>> {
    Ok(connection
        .prepare_cached(&format!(
            "SELECT {CONVERSATION_COLUMNS} FROM conversations c
             WHERE c.agent_id = ?1 AND c.session_id = ?2"
        ))?
        .query_row(params![key.agent_id, key.session_id], conversation_row)
        .optional()?)
}

pub(crate) fn conversation(
    connection: &Connection,
    id: ConversationId,
) -> Result<Option<Conversation>> {
    Ok(connection
        .prepare_cached(&format!(
            "SELECT {CONVERSATION_COLUMNS} FROM conversations c WHERE c.id = ?1"
        ))?
        .query_row([id.0], conversation_row)
        .optional()?)
}

pub(crate) fn conversations(
    connection: &Connection,
    agent_id: Option<&str>,
) -> Result<Vec<Conversation>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {CONVERSATION_COLUMNS} FROM conversations c
         WHERE ?1 IS NULL OR c.agent_id = ?1 ORDER BY c.id"
    ))?;
    let rows = statement.query_map([agent_id], conversation_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The agent a conversation belongs to.
pub(crate) fn agent_of(
    connection: &Connection,
    conversation: ConversationId,
) -> Result<Option<String>> {
    Ok(connection
        .prepare_cached("SELECT agent_id FROM conversations WHERE id = ?1")?
        .query_row([conversation.0], |row| row.get(0))
        .optional()?)
}

/// Conversations of an agent that share a session key (a session and its earlier sessions).
pub(crate) fn conversations_by_session_key(
    connection: &Connection,
    agent_id: &str,
    session_key: &str,
) -> Result<Vec<Conversation>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {CONVERSATION_COLUMNS} FROM conversations c
         WHERE c.agent_id = ?1 AND c.session_key = ?2 ORDER BY c.id"
    ))?;
    let rows = statement.query_map(params![agent_id, session_key], conversation_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

const MESSAGE_COLUMNS: &str =
    "m.id, m.conversation_id, m.seq, m.role, m.json, m.tokens, m.created_at";

fn message_row(
    connection: &Connection,
    row: &Row<'_>,
    offset: usize,
) -> rusqlite::Result<StoredMessage> {
    Ok(StoredMessage {
        id: MessageId(row.get(offset)?),
        conversation: ConversationId(row.get(offset + 1)?),
        seq: row.get::<_, i64>(offset + 2)? as u64,
        role: row.get(offset + 3)?,
        json: codec::decode(connection, &row.get::<_, Vec<u8>>(offset + 4)?)?,
        tokens: row.get::<_, i64>(offset + 5)? as u64,
        created_at_ms: row.get(offset + 6)?,
    })
}

const SUMMARY_COLUMNS: &str = "s.id, s.summary_id, s.conversation_id, s.depth, s.kind, s.content,
    s.tokens, s.earliest_at, s.latest_at, s.first_seq, s.last_seq, s.level, s.summarizer,
    s.created_at";

/// A summary row as raw columns; parsing the enum columns happens outside rusqlite's closure.
struct SummaryColumns {
    row_id: i64,
    summary_id: String,
    conversation: i64,
    depth: i64,
    kind: String,
    content: String,
    tokens: i64,
    earliest: Option<i64>,
    latest: Option<i64>,
    first_seq: i64,
    last_seq: i64,
    level: String,
    summarizer: String,
    created_at: i64,
}

fn summary_columns(row: &Row<'_>, offset: usize) -> rusqlite::Result<SummaryColumns> {
    Ok(SummaryColumns {
        row_id: row.get(offset)?,
        summary_id: row.get(offset + 1)?,
        conversation: row.get(offset + 2)?,
        depth: row.get(offset + 3)?,
        kind: row.get(offset + 4)?,
        content: row.get(offset + 5)?,
        tokens: row.get(offset + 6)?,
        earliest: row.get(offset + 7)?,
        latest: row.get(offset + 8)?,
        first_seq: row.get(offset + 9)?,
        last_seq: row.get(offset + 10)?,
        level: row.get(offset + 11)?,
        summarizer: row.get(offset + 12)?,
        created_at: row.get(offset + 13)?,
    })
}

impl SummaryColumns {
    fn into_summary(self) -> Result<StoredSummary> {
        Ok(StoredSummary {
            row_id: SummaryRowId(self.row_id),
            summary_id: self.summary_id,
            conversation: ConversationId(self.conversation),
            depth: self.depth as u32,
            kind: parse_kind(&self.kind)?,
            content: self.content,
            tokens: self.tokens as u64,
            earliest_at_ms: self.earliest,
            latest_at_ms: self.latest,
            first_seq: self.first_seq as u64,
            last_seq: self.last_seq as u64,
            level: parse_level(&self.level)?,
            summarizer: self.summarizer,
            created_at_ms: self.created_at,
        })
    }
}

/// The whole context of a conversation, in order, in one query.
pub(crate) fn context(
    connection: &Connection,
    conversation: ConversationId,
) -> Result<Vec<ContextItem>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT ci.position, ci.tokens, ci.message_id, {MESSAGE_COLUMNS}, {SUMMARY_COLUMNS}
         FROM context_items ci
         LEFT JOIN messages m ON m.id = ci.message_id
         LEFT JOIN summaries s ON s.id = ci.summary_id
         WHERE ci.conversation_id = ?1
         ORDER BY ci.position"
    ))?;
    let mut rows = statement.query([conversation.0])?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        let position: i64 = row.get(0)?;
        let tokens = row.get::<_, i64>(1)? as u64;
        let is_message = row.get::<_, Option<i64>>(2)?.is_some();
        let content = if is_message {
            ItemContent::Message(message_row(connection, row, 3)?)
        } else {
            ItemContent::Summary(summary_columns(row, 10)?.into_summary()?)
        };
        items.push(ContextItem {
            position,
            tokens,
            content,
        });
    }
    Ok(items)
}

/// Columns 5–8 of [`context_refs`]: `None` when the summary row is missing.
fn summary_shape(row: &Row<'_>) -> Result<Option<SummaryShape>> {
    let Some(depth) = row.get::<_, Option<u32>>(5)? else {
        return Ok(None);
    };
    let Some(level) = row
        .get_ref(6)?
        .as_str_or_null()
        .map_err(rusqlite::Error::from)?
    else {
        return Ok(None);
    };
    Ok(Some(SummaryShape {
        depth,
        level: parse_level(level)?,
        first_seq: row.get::<_, i64>(7)?.max(0) as u64,
        last_seq: row.get::<_, i64>(8)?.max(0) as u64,
    }))
}

/// The context as references, tokens and unit flags only (no message JSON).
pub(crate) fn context_refs(
    connection: &Connection,
    conversation: ConversationId,
) -> Result<Vec<ContextRef>> {
    let mut statement = connection.prepare_cached(
        "SELECT ci.position, ci.message_id, ci.summary_id, ci.tokens, m.role = ?2, s.depth,
                s.level, s.first_seq, s.last_seq
         FROM context_items ci LEFT JOIN messages m ON m.id = ci.message_id
              LEFT JOIN summaries s ON s.id = ci.summary_id
         WHERE ci.conversation_id = ?1 ORDER BY ci.position",
    )?;
    let mut rows = statement.query(params![conversation.0, TOOL_RESULT_ROLE])?;
    let mut refs = Vec::new();
    while let Some(row) = rows.next()? {
        // Most rows are messages: the summary columns are read only for a summary (every
        // column read costs; this query is most of an assembly).
        let (item, shape) = match row.get::<_, Option<i64>>(1)? {
            Some(id) => (ItemRef::Message(MessageId(id)), None),
            None => match row.get::<_, Option<i64>>(2)? {
                Some(id) => (ItemRef::Summary(SummaryRowId(id)), summary_shape(row)?),
                None => (ItemRef::Message(MessageId(-1)), None),
            },
        };
        refs.push(ContextRef {
            position: row.get(0)?,
            item,
            tokens: row.get::<_, i64>(3)?.max(0) as u64,
            continues_unit: row.get::<_, Option<bool>>(4)?.unwrap_or(false),
            summary: shape,
        });
    }
    Ok(refs)
}

/// The contents of items, in the order asked.
pub(crate) fn items(connection: &Connection, refs: &[ItemRef]) -> Result<Vec<ItemContent>> {
    let mut out = Vec::with_capacity(refs.len());
    for item in refs {
        let content = match item {
            ItemRef::Message(id) => message(connection, *id)?.map(ItemContent::Message),
            ItemRef::Summary(id) => summary(connection, *id)?.map(ItemContent::Summary),
        };
        out.push(content.ok_or_else(|| StoreError::NotFound {
            what: "context item",
            id: format!("{item:?}"),
        })?);
    }
    Ok(out)
}

/// The topmost summary above an item (the one that currently covers it), if any.
pub(crate) fn top_ancestor(
    connection: &Connection,
    item: ItemRef,
) -> Result<Option<StoredSummary>> {
    match top_ancestor_row(connection, item)? {
        Some(row_id) => summary(connection, row_id),
        None => Ok(None),
    }
}

/// The public id of the topmost summary above each item, in the items' order: the walks read
/// edges only, and no summary body is loaded. The items walk up together, one read a level
/// (a search's twenty hits at depth three read 60 edges one statement each before).
pub(crate) fn top_ancestor_ids(
    connection: &Connection,
    items: impl IntoIterator<Item = ItemRef>,
) -> Result<Vec<Option<String>>> {
    let items: Vec<ItemRef> = items.into_iter().collect();
    // Each item met, with its parent once read.
    let mut parents: HashMap<ItemRef, Option<SummaryRowId>> = HashMap::new();
    let mut level: Vec<ItemRef> = items.clone();
    while !level.is_empty() {
        level.sort_unstable_by_key(|item| match item {
            ItemRef::Message(id) => (0, id.0),
            ItemRef::Summary(row) => (1, row.0),
        });
        level.dedup();
        level.retain(|item| !parents.contains_key(item));
        let read = parents_of(connection, &level)?;
        level = read
            .values()
            .flatten()
            .map(|row| ItemRef::Summary(*row))
            .collect();
        parents.extend(read);
    }
    let mut ids: HashMap<SummaryRowId, Option<String>> = HashMap::new();
    let mut found = Vec::with_capacity(items.len());
    for item in items {
        let mut top = None;
        let mut current = item;
        // A damaged DAG's cycle ends at the number of rows met.
        for _ in 0..=parents.len() {
            match parents.get(&current).copied().flatten() {
                Some(parent) => {
                    top = Some(parent);
                    current = ItemRef::Summary(parent);
                }
                None => break,
            }
        }
        let id = match top {
            Some(row) => match ids.get(&row) {
                Some(id) => id.clone(),
                None => {
                    let id: Option<String> = connection
                        .prepare_cached("SELECT summary_id FROM summaries WHERE id = ?1")?
                        .query_row([row.0], |row| row.get(0))
                        .optional()?;
                    ids.insert(row, id.clone());
                    id
                }
            },
            None => None,
        };
        found.push(id);
    }
    Ok(found)
}

/// The summary directly above each item in the item's own conversation, in two reads: the
/// messages', the summaries'. A fork may fold its parent's rows too (a row then lies under one
/// summary of each conversation): the walk up from a row follows the summaries of the
/// conversation that owns it. The edges are read first (`CROSS JOIN` keeps SQLite's order):
/// joined plainly, SQLite went through every summary of the conversation for each step, a walk
/// that grew with the history.
fn parents_of(
    connection: &Connection,
    items: &[ItemRef],
) -> Result<HashMap<ItemRef, Option<SummaryRowId>>> {
    let mut parents: HashMap<ItemRef, Option<SummaryRowId>> =
        items.iter().map(|item| (*item, None)).collect();
    let (mut messages, mut summaries) = (Vec::new(), Vec::new());
    for item in items {
        match item {
            ItemRef::Message(id) => messages.push(id.0),
            ItemRef::Summary(row) => summaries.push(row.0),
        }
    }
    for (sql, ids, of) in [
        (
            PARENTS_OF_MESSAGES,
            messages,
            (|id| ItemRef::Message(MessageId(id))) as fn(i64) -> ItemRef,
        ),
        (PARENTS_OF_SUMMARIES, summaries, |id| {
            ItemRef::Summary(SummaryRowId(id))
        }),
    ] {
        if ids.is_empty() {
            continue;
        }
        let ids = serde_json::to_string(&ids).map_err(StoreError::Unserializable)?;
        let mut statement = connection.prepare_cached(sql)?;
        let mut rows = statement.query([ids])?;
        while let Some(row) = rows.next()? {
            parents.insert(of(row.get(0)?), Some(SummaryRowId(row.get(1)?)));
        }
    }
    Ok(parents)
}

fn top_ancestor_row(connection: &Connection, item: ItemRef) -> Result<Option<SummaryRowId>> {
    let mut current = item;
    let mut top = None;
    while let Some(parent) = parent_row(connection, current)? {
        current = ItemRef::Summary(parent);
        top = Some(parent);
    }
    Ok(top)
}

pub(crate) fn items_in_range(
    connection: &Connection,
    conversation: ConversationId,
    first: i64,
    last: i64,
) -> Result<Vec<(i64, ItemRef, u64)>> {
    let mut statement = connection.prepare_cached(
        "SELECT position, message_id, summary_id, tokens FROM context_items
         WHERE conversation_id = ?1 AND position BETWEEN ?2 AND ?3 ORDER BY position",
    )?;
    let rows = statement.query_map(params![conversation.0, first, last], |row| {
        let message: Option<i64> = row.get(1)?;
        let summary: Option<i64> = row.get(2)?;
        let item = match (message, summary) {
            (Some(id), _) => ItemRef::Message(MessageId(id)),
            (None, Some(id)) => ItemRef::Summary(SummaryRowId(id)),
            (None, None) => ItemRef::Message(MessageId(-1)),
        };
        Ok((row.get(0)?, item, row.get::<_, i64>(3)? as u64))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(crate) fn tokens_of(connection: &Connection, item: ItemRef) -> Result<i64> {
    let found = integer_of(
        connection,
        item,
        "SELECT tokens FROM messages WHERE id = ?1",
        "SELECT tokens FROM summaries WHERE id = ?1",
    )?;
    found.ok_or_else(|| StoreError::NotFound {
        what: "context item",
        id: format!("{item:?}"),
    })
}

/// Time and seq range covered by a planned run of items.
pub(crate) fn span_of(
    connection: &Connection,
    items: &[(i64, ItemRef)],
    kind: SummaryKind,
) -> Result<Span> {
    let mut span = Span {
        earliest_ms: None,
        latest_ms: None,
        first_seq: i64::MAX,
        last_seq: i64::MIN,
    };
    for (_, item) in items {
        let (earliest, latest, first, last): (Option<i64>, Option<i64>, i64, i64) = match (item, kind) {
            (ItemRef::Message(id), SummaryKind::Leaf) => connection
                .prepare_cached("SELECT created_at, created_at, seq, seq FROM messages WHERE id = ?1")?
                .query_row([id.0], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))?,
            (ItemRef::Summary(id), SummaryKind::Condensed) => connection
                .prepare_cached(
                    "SELECT earliest_at, latest_at, first_seq, last_seq FROM summaries WHERE id = ?1",
                )?
                .query_row([id.0], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))?,
            (item, kind) => {
                return Err(StoreError::InvalidMessage(format!(
                    "a {} summary cannot cover {item:?}",
                    kind_str(kind)
                )));
            }
        };
        span.earliest_ms = min_option(span.earliest_ms, earliest);
        span.latest_ms = max_option(span.latest_ms, latest);
        span.first_seq = span.first_seq.min(first);
        span.last_seq = span.last_seq.max(last);
    }
    Ok(span)
}

fn min_option(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn max_option(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

pub(crate) fn message(connection: &Connection, id: MessageId) -> Result<Option<StoredMessage>> {
    Ok(connection
        .prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = ?1"
        ))?
        .query_row([id.0], |row| message_row(connection, row, 0))
        .optional()?)
}

pub(crate) fn messages_in_seq_range(
    connection: &Connection,
    conversation: ConversationId,
    first_seq: u64,
    last_seq: u64,
) -> Result<Vec<StoredMessage>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages m
         WHERE m.conversation_id = ?1 AND m.seq BETWEEN ?2 AND ?3 ORDER BY m.seq"
    ))?;
    let rows = statement.query_map(
        params![conversation.0, first_seq as i64, last_seq as i64],
        |row| message_row(connection, row, 0),
    )?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(crate) fn summary(
    connection: &Connection,
    row_id: SummaryRowId,
) -> Result<Option<StoredSummary>> {
    connection
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = ?1"
        ))?
        .query_row([row_id.0], |row| summary_columns(row, 0))
        .optional()?
        .map(SummaryColumns::into_summary)
        .transpose()
}

pub(crate) fn summary_by_id(
    connection: &Connection,
    summary_id: &str,
) -> Result<Option<StoredSummary>> {
    connection
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.summary_id = ?1"
        ))?
        .query_row([summary_id], |row| summary_columns(row, 0))
        .optional()?
        .map(SummaryColumns::into_summary)
        .transpose()
}

/// The ordered children of a summary: its messages (leaf) or summaries (condensed).
pub(crate) fn children(connection: &Connection, parent: SummaryRowId) -> Result<Vec<ItemContent>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT e.child_message_id, {MESSAGE_COLUMNS}, {SUMMARY_COLUMNS}
         FROM summary_edges e
         LEFT JOIN messages m ON m.id = e.child_message_id
         LEFT JOIN summaries s ON s.id = e.child_summary_id
         WHERE e.parent_id = ?1 ORDER BY e.ordinal"
    ))?;
    let mut rows = statement.query([parent.0])?;
    let mut children = Vec::new();
    while let Some(row) = rows.next()? {
        if row.get::<_, Option<i64>>(0)?.is_some() {
            children.push(ItemContent::Message(message_row(connection, row, 1)?));
        } else {
            children.push(ItemContent::Summary(
                summary_columns(row, 8)?.into_summary()?,
            ));
        }
    }
    Ok(children)
}

/// The fallback (truncated) summaries a conversation's context holds: what maintenance
/// re-summarizes (a partial index keeps this cheap: no context is read).
pub(crate) fn stand_in_summaries(
    connection: &Connection,
    conversation: ConversationId,
) -> Result<Vec<StoredSummary>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries s
         WHERE s.conversation_id = ?1 AND {WRITTEN_BY_A_STAND_IN}
         ORDER BY EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id) DESC,
                  s.id"
    ))?;
    let mut rows = statement.query([conversation.0])?;
    let mut found = Vec::new();
    while let Some(row) = rows.next()? {
        found.push(summary_columns(row, 0)?.into_summary()?);
    }
    Ok(found)
}

/// The ordered children of a summary as references.
pub(crate) fn child_refs(
    connection: &Connection,
    parent: SummaryRowId,
) -> Result<Vec<(i64, ItemRef)>> {
    let mut statement = connection.prepare_cached(
        "SELECT ordinal, child_message_id, child_summary_id FROM summary_edges
         WHERE parent_id = ?1 ORDER BY ordinal",
    )?;
    let refs = statement
        .query_map([parent.0], |row| {
            let ordinal: i64 = row.get(0)?;
            Ok(match row.get::<_, Option<i64>>(1)? {
                Some(message) => (ordinal, ItemRef::Message(MessageId(message))),
                None => (ordinal, ItemRef::Summary(SummaryRowId(row.get(2)?))),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(refs)
}

/// A store-wide state value.
pub(crate) fn store_state(connection: &Connection, key: &str) -> Result<Option<String>> {
    Ok(connection
        .prepare_cached("SELECT value FROM store_state WHERE key = ?1")?
        .query_row([key], |row| row.get(0))
        .optional()?)
}

/// Conversations retention archived (their rows stay out of the index).
pub(crate) fn archived_conversations(
    connection: &Connection,
) -> Result<std::collections::HashSet<i64>> {
    let mut statement =
        connection.prepare_cached("SELECT id FROM conversations WHERE archived_at IS NOT NULL")?;
    let ids = statement
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(ids)
}

/// Bytes a conversation's rows hold: compressed messages, summaries, and the blobs it owns.
pub(crate) fn conversation_bytes(
    connection: &Connection,
    conversation: ConversationId,
) -> Result<u64> {
    let bytes: i64 = connection
        .prepare_cached(
            "SELECT (SELECT coalesce(sum(length(json)), 0) FROM messages WHERE conversation_id = ?1)
                  + (SELECT coalesce(sum(length(content)), 0) FROM summaries WHERE conversation_id = ?1)
                  + (SELECT coalesce(sum(bytes), 0) FROM blobs WHERE conversation_id = ?1)",
        )?
        .query_row([conversation.0], |row| row.get(0))?;
    Ok(bytes.max(0) as u64)
}

/// The summary whose children include `item`, if any.
pub(crate) fn parent_of(connection: &Connection, item: ItemRef) -> Result<Option<StoredSummary>> {
    match parent_row(connection, item)? {
        Some(row_id) => summary(connection, row_id),
        None => Ok(None),
    }
}

/// [`parents_of`]'s statements: the parents of the messages, of the summaries (`?1`: their
/// ids as a JSON array).
const PARENTS_OF_MESSAGES: &str = "SELECT e.child_message_id, e.parent_id FROM json_each(?1) j
     CROSS JOIN summary_edges e ON e.child_message_id = j.value
     CROSS JOIN summaries p ON p.id = e.parent_id
     WHERE p.conversation_id = (SELECT conversation_id FROM messages WHERE id = j.value)";
const PARENTS_OF_SUMMARIES: &str = "SELECT e.child_summary_id, e.parent_id FROM json_each(?1) j
     CROSS JOIN summary_edges e ON e.child_summary_id = j.value
     CROSS JOIN summaries p ON p.id = e.parent_id
     WHERE p.conversation_id = (SELECT conversation_id FROM summaries WHERE id = j.value)";

/// The summary directly above an item (see [`parents_of`]).
fn parent_row(connection: &Connection, item: ItemRef) -> Result<Option<SummaryRowId>> {
    Ok(parents_of(connection, &[item])?.remove(&item).flatten())
}

/// The integer that the message's or the summary's query selects by the item's id, if a row
/// matches.
fn integer_of(
    connection: &Connection,
    item: ItemRef,
    for_message: &str,
    for_summary: &str,
) -> Result<Option<i64>> {
    let (sql, id) = match item {
        ItemRef::Message(id) => (for_message, id.0),
        ItemRef::Summary(id) => (for_summary, id.0),
    };
    Ok(connection
        .prepare_cached(sql)?
        .query_row([id], |row| row.get(0))
        .optional()?)
}

pub(crate) fn blob_info(connection: &Connection, blob_id: &str) -> Result<Option<BlobInfo>> {
    Ok(connection
        .prepare_cached(
            "SELECT blob_id, conversation_id, kind, bytes, lines, description, created_at
             FROM blobs WHERE blob_id = ?1",
        )?
        .query_row([blob_id], |row| {
            Ok(BlobInfo {
                blob_id: row.get(0)?,
                conversation: ConversationId(row.get(1)?),
                kind: row.get(2)?,
                bytes: row.get::<_, i64>(3)? as u64,
                lines: row.get::<_, i64>(4)? as u64,
                description: row.get(5)?,
                created_at_ms: row.get(6)?,
            })
        })
        .optional()?)
}

pub(crate) fn grants(connection: &Connection, grantee: &str) -> Result<Vec<Grant>> {
    let mut statement = connection.prepare_cached(
        "SELECT id, grantee, conversation_id, expires_at, token_cap, revoked_at
         FROM grants WHERE grantee = ?1 ORDER BY id",
    )?;
    let rows = statement.query_map([grantee], |row| {
        Ok(Grant {
            id: row.get(0)?,
            grantee: row.get(1)?,
            conversation: ConversationId(row.get(2)?),
            expires_at_ms: row.get(3)?,
            token_cap: row.get::<_, i64>(4)? as u64,
            revoked: row.get::<_, Option<i64>>(5)?.is_some(),
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(crate) fn state(
    connection: &Connection,
    conversation: ConversationId,
    key: &str,
) -> Result<Option<String>> {
    Ok(connection
        .prepare_cached(
            "SELECT value FROM conversation_state WHERE conversation_id = ?1 AND key = ?2",
        )?
        .query_row(params![conversation.0, key], |row| row.get(0))
        .optional()?)
}

/// Everything [`crate::HistoryStore::integrity_check`] verifies with SQL: the database file,
/// that context items and edges resolve, that depths decrease along edges, and that every
/// message and summary is reachable from the context.
pub(crate) fn integrity_problems(
    connection: &Connection,
    report: &mut IntegrityReport,
) -> Result<()> {
    // What quick_check finds names the damaged pages; the rows on them are found by reading.
    let quick: Vec<String> = connection
        .prepare("PRAGMA quick_check(20)")?
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    if quick.first().is_some_and(|first| first != "ok") {
        report.problems.push(format!(
            "sqlite quick_check: {}; restore the database from a backup",
            quick.join("; ")
        ));
        let (max_message, max_summary) =
            max_ids(connection).unwrap_or((i64::MAX / 2, i64::MAX / 2));
        for (table, max) in [("messages", max_message), ("summaries", max_summary)] {
            let sql = format!("SELECT id, * FROM {table} WHERE id BETWEEN ?1 AND ?2");
            let unreadable = read_ranges_carefully(1, max, &mut |low, high| {
                let mut statement = connection.prepare_cached(&sql)?;
                let mut rows = statement.query(params![low, high])?;
                while rows.next()?.is_some() {}
                Ok(true)
            })?;
            if !unreadable.is_empty() {
                let shown: Vec<String> = unreadable.iter().take(10).map(i64::to_string).collect();
                report.problems.push(format!(
                    "{} {table} cannot be read (on damaged pages), e.g. ids {}: searches skip them",
                    unreadable.len(),
                    shown.join(", ")
                ));
            }
        }
    }
    match structure_problems(connection, report) {
        Err(error) if error.is_damaged_page() => {
            report.problems.push(
                "the structure checks stopped at a damaged page (see quick_check above)".to_owned(),
            );
            Ok(())
        }
        other => other,
    }
}

/// What integrity_problems checks after the pages: decoding, counts, references, the DAG.
fn structure_problems(connection: &Connection, report: &mut IntegrityReport) -> Result<()> {
    // Damage inside a row's bytes passes quick_check: every stored message must decode.
    let undecodable =
        for_each_message_after_where(connection, 0, Neighbours::Skip, |_| false, |_| Ok(()))?;
    if !undecodable.is_empty() {
        let shown: Vec<String> = undecodable.iter().take(10).map(i64::to_string).collect();
        report.problems.push(format!(
            "{} stored message(s) cannot be decoded (damaged database pages), e.g. {}: their text is neither searched nor assembled; restore the database from a backup",
            undecodable.len(),
            shown.join(", ")
        ));
    }
    let count = |sql: &str| -> Result<u64> {
        Ok(connection
            .query_row(sql, [], |row| row.get::<_, i64>(0))?
            .max(0) as u64)
    };
    report.messages = count("SELECT count(*) FROM messages")?;
    report.summaries = count("SELECT count(*) FROM summaries")?;
    report.stand_in_summaries = count(STAND_IN_SUMMARIES)?;
    report.context_items = count("SELECT count(*) FROM context_items")?;
    let checks: [(&str, &str); 4] = [
        (
            "context items that point at nothing",
            "SELECT count(*) FROM context_items ci
             LEFT JOIN messages m ON m.id = ci.message_id
             LEFT JOIN summaries s ON s.id = ci.summary_id
             WHERE m.id IS NULL AND s.id IS NULL",
        ),
        (
            "summary edges that point at nothing",
            "SELECT count(*) FROM summary_edges e
             LEFT JOIN messages m ON m.id = e.child_message_id
             LEFT JOIN summaries s ON s.id = e.child_summary_id
             LEFT JOIN summaries p ON p.id = e.parent_id
             WHERE (m.id IS NULL AND s.id IS NULL) OR p.id IS NULL",
        ),
        (
            "summary edges whose child is not shallower than its parent",
            "SELECT count(*) FROM summary_edges e
             JOIN summaries p ON p.id = e.parent_id
             JOIN summaries s ON s.id = e.child_summary_id
             WHERE s.depth >= p.depth",
        ),
        (
            "summaries without children",
            "SELECT count(*) FROM summaries s
             WHERE NOT EXISTS (SELECT 1 FROM summary_edges e WHERE e.parent_id = s.id)",
        ),
    ];
    for (what, sql) in checks {
        let found = count(sql)?;
        if found > 0 {
            report.problems.push(format!("{found} {what}"));
        }
    }
    // Cycles and reachability, on the DAG as a graph.
    report
        .problems
        .extend(crate::dag::structure_problems(connection)?);
    let drift = count(
        "SELECT count(*) FROM conversations c
         WHERE c.context_tokens <> (SELECT coalesce(sum(ci.tokens), 0) FROM context_items ci
                                    WHERE ci.conversation_id = c.id)",
    )?;
    if drift > 0 {
        report.problems.push(format!(
            "{drift} conversations whose running context-token total drifted"
        ));
    }
    Ok(())
}

/// Streams a conversation's messages within the query's time range, newest first.
pub(crate) fn for_each_message_in(
    connection: &Connection,
    conversation: ConversationId,
    query: &SearchQuery,
    mut f: impl FnMut(StoredMessage) -> Result<bool>,
) -> Result<u64> {
    let sql = format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages m
         WHERE m.conversation_id = ?1
           AND (?2 IS NULL OR m.created_at >= ?2) AND (?3 IS NULL OR m.created_at < ?3)
         ORDER BY m.seq DESC"
    );
    // Newest first; ids grow with seq in a conversation, so where the scan stopped on a
    // damaged page, the careful reading goes on below the last id it delivered.
    let mut last = i64::MAX;
    let mut stopped = false;
    let scanned = for_each_in_range(connection, &sql, conversation, query, |row| {
        let message = message_row(connection, row, 0)?;
        last = message.id.0;
        let go_on = f(message)?;
        stopped = !go_on;
        Ok(go_on)
    });
    match scanned {
        Ok(()) => Ok(0),
        Err(error) if error.is_damaged_page() && !stopped => {
            let careful = format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages m
                 WHERE m.id BETWEEN ?1 AND ?2 AND m.conversation_id = ?3
                   AND (?4 IS NULL OR m.created_at >= ?4) AND (?5 IS NULL OR m.created_at < ?5)
                 ORDER BY m.id DESC"
            );
            let highest =
                (last.saturating_sub(1)).min(max_ids(connection).map_or(i64::MAX, |(m, _)| m));
            // A range re-read after it failed part way must not deliver a row twice: every id
            // above the last one delivered was delivered or cannot be read.
            let mut floor = last;
            let unreadable = read_ranges_carefully(1, highest, &mut |low, high| {
                let mut statement = connection.prepare_cached(&careful)?;
                let mut rows = statement.query(params![
                    low,
                    high,
                    conversation.0,
                    query.since_ms,
                    query.before_ms
                ])?;
                while let Some(row) = rows.next()? {
                    let message = message_row(connection, row, 0)?;
                    if message.id.0 >= floor {
                        continue;
                    }
                    floor = message.id.0;
                    if !f(message)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
            tracing::warn!(
                skipped = unreadable.len(),
                "a search could not read messages on damaged database pages; it read the rest"
            );
            Ok(unreadable.len() as u64)
        }
        Err(error) => Err(error),
    }
}

/// Reads the rows of ids `low..=high` through `read` (which answers whether to go on), the
/// newest range first, splitting a range whose read fails on a damaged page until the single
/// ids that cannot be read are known. Returns those ids.
pub(crate) fn read_ranges_carefully(
    low: i64,
    high: i64,
    read: &mut impl FnMut(i64, i64) -> Result<bool>,
) -> Result<Vec<i64>> {
    const RANGE: i64 = 1_024;
    let mut unreadable = Vec::new();
    let mut pending = Vec::new();
    let mut top = high;
    while top >= low {
        pending.push((top.saturating_sub(RANGE - 1).max(low), top));
        top = top.saturating_sub(RANGE);
    }
    pending.reverse();
    // A stack: the newest range on top, and a failed range's newer half read first.
    while let Some((from, to)) = pending.pop() {
        match read(from, to) {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) if error.is_damaged_page() => {
                if from == to {
                    unreadable.push(from);
                } else {
                    let middle = from + (to - from) / 2;
                    pending.push((from, middle));
                    pending.push((middle + 1, to));
                }
            }
            Err(error) => return Err(error),
        }
    }
    Ok(unreadable)
}

/// Streams a conversation's summaries within the query's time range, newest first.
pub(crate) fn for_each_summary_in(
    connection: &Connection,
    conversation: ConversationId,
    query: &SearchQuery,
    mut f: impl FnMut(StoredSummary) -> Result<bool>,
) -> Result<()> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries s
         WHERE s.conversation_id = ?1
           AND (?2 IS NULL OR coalesce(s.latest_at, s.created_at) >= ?2)
           AND (?3 IS NULL OR coalesce(s.latest_at, s.created_at) < ?3)
         ORDER BY s.id DESC"
    );
    for_each_in_range(connection, &sql, conversation, query, |row| {
        f(summary_columns(row, 0)?.into_summary()?)
    })
}

/// Runs `sql` (parameters: conversation, the query's since and before) and hands each row to `f`
/// until it says stop.
fn for_each_in_range(
    connection: &Connection,
    sql: &str,
    conversation: ConversationId,
    query: &SearchQuery,
    mut f: impl FnMut(&Row<'_>) -> Result<bool>,
) -> Result<()> {
    let mut statement = connection.prepare_cached(sql)?;
    let mut rows = statement.query(params![conversation.0, query.since_ms, query.before_ms])?;
    while let Some(row) = rows.next()? {
        if !f(row)? {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step up the DAG reads the item's edge, then its parent by id: joined plainly,
    /// SQLite went through every summary of the conversation for each step instead.
    #[test]
    fn a_walk_up_reads_edges_first_and_no_conversation_whole() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("plans.db");
        let mut connection = super::super::schema::connect(&path).unwrap();
        super::super::schema::migrate(&mut connection, &path).unwrap();
        for sql in [PARENTS_OF_MESSAGES, PARENTS_OF_SUMMARIES] {
            let mut statement = connection
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            let plan: Vec<String> = statement
                .query_map(["[1]"], |row| row.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let edges = plan.iter().position(|step| step.contains("summary_edges"));
            let parent = plan.iter().position(|step| step.starts_with("SEARCH p "));
            assert!(
                matches!((edges, parent), (Some(e), Some(p)) if e < p),
                "{sql}: {plan:#?}"
            );
            assert!(
                plan.iter()
                    .all(|step| !step.contains("summaries_by_conversation")),
                "{sql}: {plan:#?}"
            );
        }
    }
}
