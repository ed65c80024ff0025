//! Reads: the rows of conversations, messages and summaries, what a context holds and what a
//! summary covers. Each takes a client (a pooled connection, or a transaction of a write) and
//! holds no transaction of its own.

use std::collections::HashMap;

use tokio_postgres::Row;
use vilvona_core::summarize::SummaryKind;

use super::{Sql, at, count};
use crate::dag::{DagSummary, DagView};
use crate::error::{Result, StoreError};
use crate::types::*;

pub(super) const CONVERSATION_COLUMNS: &str =
    "c.id, c.agent_id, c.session_id, c.session_key, c.active,
    c.created_at, c.context_tokens, c.next_seq,
    (SELECT max(m.created_at) FROM messages m WHERE m.conversation_id = c.id
        AND m.seq = c.next_seq - 1), c.archived_at, c.forgotten_messages";

pub(super) fn conversation_row(row: &Row) -> Result<Conversation> {
    let next_seq: i64 = at(row, 7)?;
    let forgotten: i64 = at(row, 10)?;
    Ok(Conversation {
        id: ConversationId(at(row, 0)?),
        agent_id: at(row, 1)?,
        session_id: at(row, 2)?,
        session_key: at(row, 3)?,
        active: at(row, 4)?,
        created_at_ms: at(row, 5)?,
        context_tokens: count(row, 6)?,
        message_count: next_seq.max(0) as u64,
        last_activity_ms: at(row, 8)?,
        archived_at_ms: at(row, 9)?,
        stored_messages: (next_seq - forgotten).max(0) as u64,
    })
}

pub(super) const MESSAGE_COLUMNS: &str =
    "m.id, m.conversation_id, m.seq, m.role, m.json, m.tokens, m.created_at";

pub(super) fn message_row(row: &Row, offset: usize) -> Result<StoredMessage> {
    Ok(StoredMessage {
        id: MessageId(at(row, offset)?),
        conversation: ConversationId(at(row, offset + 1)?),
        seq: count(row, offset + 2)?,
        role: at(row, offset + 3)?,
        json: at(row, offset + 4)?,
        tokens: count(row, offset + 5)?,
        created_at_ms: at(row, offset + 6)?,
    })
}

pub(super) const SUMMARY_COLUMNS: &str =
    "s.id, s.summary_id, s.conversation_id, s.depth, s.kind, s.content,
    s.tokens, s.earliest_at, s.latest_at, s.first_seq, s.last_seq, s.level, s.summarizer,
    s.created_at";

pub(super) fn summary_row(row: &Row, offset: usize) -> Result<StoredSummary> {
    Ok(StoredSummary {
        row_id: SummaryRowId(at(row, offset)?),
        summary_id: at(row, offset + 1)?,
        conversation: ConversationId(at(row, offset + 2)?),
        depth: count(row, offset + 3)? as u32,
        kind: parse_kind(&at::<String>(row, offset + 4)?)?,
        content: at(row, offset + 5)?,
        tokens: count(row, offset + 6)?,
        earliest_at_ms: at(row, offset + 7)?,
        latest_at_ms: at(row, offset + 8)?,
        first_seq: count(row, offset + 9)?,
        last_seq: count(row, offset + 10)?,
        level: parse_level(&at::<String>(row, offset + 11)?)?,
        summarizer: at(row, offset + 12)?,
        created_at_ms: at(row, offset + 13)?,
    })
}

pub(super) fn item_of(message: Option<i64>, summary: Option<i64>) -> ItemRef {
    match (message, summary) {
        (Some(id), _) => ItemRef::Message(MessageId(id)),
        (None, Some(id)) => ItemRef::Summary(SummaryRowId(id)),
        (None, None) => ItemRef::Message(MessageId(-1)),
    }
}

pub(super) fn columns_of(item: ItemRef) -> (Option<i64>, Option<i64>) {
    match item {
        ItemRef::Message(id) => (Some(id.0), None),
        ItemRef::Summary(id) => (None, Some(id.0)),
    }
}

pub(super) async fn conversation_by_key(
    client: &impl Sql,
    key: &ConversationKey,
) -> Result<Option<Conversation>> {
    client
        .row_opt(
            &format!(
                "SELECT {CONVERSATION_COLUMNS} FROM conversations c
                 WHERE c.agent_id = $1 AND c.session_id = $2"
            ),
            &[&key.agent_id, &key.session_id],
        )
        .await?
        .as_ref()
        .map(conversation_row)
        .transpose()
}

pub(super) async fn conversations_where(
    client: &impl Sql,
    condition: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Conversation>> {
    client
        .rows(
            &format!(
                "SELECT {CONVERSATION_COLUMNS} FROM conversations c WHERE {condition} ORDER BY c.id"
            ),
            params,
        )
        .await?
        .iter()
        .map(conversation_row)
        .collect()
}

pub(crate) async fn message(client: &impl Sql, id: MessageId) -> Result<Option<StoredMessage>> {
    client
        .row_opt(
            &format!("SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = $1"),
            &[&id.0],
        )
        .await?
        .map(|row| message_row(&row, 0))
        .transpose()
}

pub(crate) async fn summary(
    client: &impl Sql,
    row_id: SummaryRowId,
) -> Result<Option<StoredSummary>> {
    client
        .row_opt(
            &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = $1"),
            &[&row_id.0],
        )
        .await?
        .map(|row| summary_row(&row, 0))
        .transpose()
}

/// The summary directly above an item in the item's own conversation (a fork's summaries
/// may lie above its parent's rows too; the walk up follows the owner's). Twin of the SQLite
/// backend's.
pub(super) async fn parent_row(client: &impl Sql, item: ItemRef) -> Result<Option<SummaryRowId>> {
    let (sql, id) = match item {
        ItemRef::Message(id) => (
            "SELECT e.parent_id FROM summary_edges e JOIN summaries p ON p.id = e.parent_id
             WHERE e.child_message_id = $1
               AND p.conversation_id = (SELECT conversation_id FROM messages WHERE id = $1)",
            id.0,
        ),
        ItemRef::Summary(id) => (
            "SELECT e.parent_id FROM summary_edges e JOIN summaries p ON p.id = e.parent_id
             WHERE e.child_summary_id = $1
               AND p.conversation_id = (SELECT conversation_id FROM summaries WHERE id = $1)",
            id.0,
        ),
    };
    client
        .row_opt(sql, &[&id])
        .await?
        .map(|row| at(&row, 0).map(SummaryRowId))
        .transpose()
}

/// The topmost summary above an item in the item's own conversation, in one read (the walk
/// up the edges runs in the database; a fork's summaries above the same rows are not on it).
pub(crate) async fn top_ancestor_row(
    client: &impl Sql,
    item: ItemRef,
) -> Result<Option<SummaryRowId>> {
    let (message, summary) = columns_of(item);
    client
        .row_opt(
            "WITH RECURSIVE owner(id) AS (
                 SELECT conversation_id FROM messages WHERE id = $1
                 UNION ALL SELECT conversation_id FROM summaries WHERE id = $2
             ),
             up(id, depth) AS (
                 SELECT e.parent_id, 1 FROM summary_edges e
                 JOIN summaries p ON p.id = e.parent_id AND p.conversation_id IN (SELECT id FROM owner)
                 WHERE e.child_message_id = $1 OR e.child_summary_id = $2
                 UNION ALL
                 SELECT e.parent_id, up.depth + 1 FROM summary_edges e JOIN up ON e.child_summary_id = up.id
                 JOIN summaries p ON p.id = e.parent_id AND p.conversation_id IN (SELECT id FROM owner)
                 WHERE up.depth < 10000 -- a damaged DAG's cycle ends here
             )
             SELECT id FROM up ORDER BY depth DESC LIMIT 1",
            &[&message, &summary],
        )
        .await?
        .map(|row| at(&row, 0).map(SummaryRowId))
        .transpose()
}

pub(super) async fn items_in_range(
    client: &impl Sql,
    conversation: ConversationId,
    first: i64,
    last: i64,
) -> Result<Vec<(i64, ItemRef, u64)>> {
    client
        .rows(
            "SELECT position, message_id, summary_id, tokens FROM context_items
             WHERE conversation_id = $1 AND position BETWEEN $2 AND $3 ORDER BY position",
            &[&conversation.0, &first, &last],
        )
        .await?
        .iter()
        .map(|row| {
            Ok((
                at(row, 0)?,
                item_of(at(row, 1)?, at(row, 2)?),
                count(row, 3)?,
            ))
        })
        .collect()
}

pub(super) async fn tokens_of(client: &impl Sql, item: ItemRef) -> Result<i64> {
    let (sql, id) = match item {
        ItemRef::Message(id) => ("SELECT tokens FROM messages WHERE id = $1", id.0),
        ItemRef::Summary(id) => ("SELECT tokens FROM summaries WHERE id = $1", id.0),
    };
    match client.row_opt(sql, &[&id]).await? {
        Some(row) => at(&row, 0),
        None => Err(StoreError::NotFound {
            what: "context item",
            id: format!("{item:?}"),
        }),
    }
}

/// The summaries above a conversation's messages (those before a time), lowest depth first;
/// when `None`, above every message and every summary of it (any conversation's: a fork's fold
/// of its parent's rows).
pub(crate) async fn summaries_above(
    client: &impl Sql,
    conversation: ConversationId,
    before_ms: Option<i64>,
) -> Result<Vec<StoredSummary>> {
    client
        .rows(
            &format!(
                "WITH RECURSIVE up(id) AS (
                     SELECT parent_id FROM (
                         SELECT e.parent_id FROM summary_edges e
                         JOIN messages m ON m.id = e.child_message_id
                         WHERE m.conversation_id = $1 AND ($2::BIGINT IS NULL OR m.created_at < $2)
                         UNION
                         SELECT e.parent_id FROM summary_edges e
                         JOIN summaries c ON c.id = e.child_summary_id
                         WHERE $2::BIGINT IS NULL AND c.conversation_id = $1
                     ) AS seed
                     UNION
                     SELECT e.parent_id FROM summary_edges e JOIN up ON e.child_summary_id = up.id
                 )
                 SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id IN (SELECT id FROM up)
                 ORDER BY s.depth, s.id"
            ),
            &[&conversation.0, &before_ms],
        )
        .await?
        .iter()
        .map(|row| summary_row(row, 0))
        .collect()
}

/// Time and seq range covered by a planned run of items, in one read.
pub(super) async fn span_of(
    client: &impl Sql,
    items: &[(i64, ItemRef)],
    kind: SummaryKind,
) -> Result<Span> {
    let mut ids = Vec::with_capacity(items.len());
    for (_, item) in items {
        match (item, kind) {
            (ItemRef::Message(id), SummaryKind::Leaf) => ids.push(id.0),
            (ItemRef::Summary(id), SummaryKind::Condensed) => ids.push(id.0),
            (item, kind) => {
                return Err(StoreError::InvalidMessage(format!(
                    "a {} summary cannot cover {item:?}",
                    kind_str(kind)
                )));
            }
        }
    }
    let sql = match kind {
        SummaryKind::Leaf => {
            "SELECT min(created_at), max(created_at), min(seq), max(seq), count(*)
             FROM messages WHERE id = ANY($1)"
        }
        SummaryKind::Condensed => {
            "SELECT min(earliest_at), max(latest_at), min(first_seq), max(last_seq), count(*)
             FROM summaries WHERE id = ANY($1)"
        }
    };
    let row = client.row(sql, &[&ids]).await?;
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    if count(&row, 4)? != unique.len() as u64 {
        return Err(StoreError::NotFound {
            what: "context item",
            id: format!("one of {items:?}"),
        });
    }
    Ok(Span {
        earliest_ms: at(&row, 0)?,
        latest_ms: at(&row, 1)?,
        first_seq: at::<Option<i64>>(&row, 2)?.unwrap_or(i64::MAX),
        last_seq: at::<Option<i64>>(&row, 3)?.unwrap_or(i64::MIN),
    })
}

/// What a conversation's context holds, in order.
pub(super) async fn context(
    client: &impl Sql,
    conversation: ConversationId,
) -> Result<Vec<ContextItem>> {
    let rows = client
        .rows(
            &format!(
                "SELECT ci.position, ci.tokens, ci.message_id, {MESSAGE_COLUMNS}, {SUMMARY_COLUMNS}
                 FROM context_items ci
                 LEFT JOIN messages m ON m.id = ci.message_id
                 LEFT JOIN summaries s ON s.id = ci.summary_id
                 WHERE ci.conversation_id = $1 ORDER BY ci.position"
            ),
            &[&conversation.0],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let content = if at::<Option<i64>>(row, 2)?.is_some() {
                ItemContent::Message(message_row(row, 3)?)
            } else {
                ItemContent::Summary(summary_row(row, 10)?)
            };
            Ok(ContextItem {
                position: at(row, 0)?,
                tokens: count(row, 1)?,
                content,
            })
        })
        .collect()
}

pub(super) async fn context_refs(
    client: &impl Sql,
    conversation: ConversationId,
) -> Result<Vec<ContextRef>> {
    client
        .rows(
            "SELECT ci.position, ci.message_id, ci.summary_id, ci.tokens, m.role = $2,
                    s.depth, s.level, s.first_seq, s.last_seq
             FROM context_items ci LEFT JOIN messages m ON m.id = ci.message_id
                  LEFT JOIN summaries s ON s.id = ci.summary_id
             WHERE ci.conversation_id = $1 ORDER BY ci.position",
            &[&conversation.0, &TOOL_RESULT_ROLE],
        )
        .await?
        .iter()
        .map(|row| {
            let depth: Option<i64> = at(row, 5)?;
            let level: Option<String> = at(row, 6)?;
            let summary = match (depth, level) {
                (Some(depth), Some(level)) => Some(SummaryShape {
                    depth: depth as u32,
                    level: parse_level(&level)?,
                    first_seq: count(row, 7)?,
                    last_seq: count(row, 8)?,
                }),
                _ => None,
            };
            Ok(ContextRef {
                position: at(row, 0)?,
                item: item_of(at(row, 1)?, at(row, 2)?),
                tokens: count(row, 3)?,
                continues_unit: at::<Option<bool>>(row, 4)?.unwrap_or(false),
                summary,
            })
        })
        .collect()
}

pub(super) async fn items(client: &impl Sql, refs: Vec<ItemRef>) -> Result<Vec<ItemContent>> {
    // Two reads, whatever the number of items.
    let (mut messages, mut summaries) = (Vec::new(), Vec::new());
    for item in &refs {
        match item {
            ItemRef::Message(id) => messages.push(id.0),
            ItemRef::Summary(id) => summaries.push(id.0),
        }
    }
    let mut found: HashMap<ItemRef, ItemContent> = HashMap::with_capacity(refs.len());
    if !messages.is_empty() {
        for row in client
            .rows(
                &format!("SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.id = ANY($1)"),
                &[&messages],
            )
            .await?
        {
            let message = message_row(&row, 0)?;
            found.insert(ItemRef::Message(message.id), ItemContent::Message(message));
        }
    }
    if !summaries.is_empty() {
        for row in client
            .rows(
                &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = ANY($1)"),
                &[&summaries],
            )
            .await?
        {
            let summary = summary_row(&row, 0)?;
            found.insert(
                ItemRef::Summary(summary.row_id),
                ItemContent::Summary(summary),
            );
        }
    }
    refs.iter()
        .map(|item| {
            // The same item twice is read once and returned twice.
            found
                .get(item)
                .cloned()
                .ok_or_else(|| StoreError::NotFound {
                    what: "context item",
                    id: format!("{item:?}"),
                })
        })
        .collect()
}

pub(super) async fn children(client: &impl Sql, parent: SummaryRowId) -> Result<Vec<ItemContent>> {
    client
        .rows(
            &format!(
                "SELECT e.child_message_id, {MESSAGE_COLUMNS}, {SUMMARY_COLUMNS}
                 FROM summary_edges e
                 LEFT JOIN messages m ON m.id = e.child_message_id
                 LEFT JOIN summaries s ON s.id = e.child_summary_id
                 WHERE e.parent_id = $1 ORDER BY e.ordinal"
            ),
            &[&parent.0],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(if at::<Option<i64>>(row, 0)?.is_some() {
                ItemContent::Message(message_row(row, 1)?)
            } else {
                ItemContent::Summary(summary_row(row, 8)?)
            })
        })
        .collect()
}

pub(super) async fn dag_view(client: &impl Sql, conversation: ConversationId) -> Result<DagView> {
    let mut view = DagView::default();
    for row in client
        .rows(
            "SELECT s.id, s.summary_id, s.depth, s.kind, s.tokens,
                    EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id),
                    (SELECT count(*) FROM summary_edges e WHERE e.parent_id = s.id
                         AND e.child_message_id IS NOT NULL),
                    (SELECT coalesce(sum(m.tokens), 0)::BIGINT FROM summary_edges e
                         JOIN messages m ON m.id = e.child_message_id WHERE e.parent_id = s.id),
                    s.level, s.summarizer, s.created_at, s.earliest_at, s.latest_at
             FROM summaries s WHERE s.conversation_id = $1 ORDER BY s.depth DESC, s.id",
            &[&conversation.0],
        )
        .await?
    {
        let row_id: i64 = at(&row, 0)?;
        view.summaries.push(DagSummary {
            row_id,
            summary_id: at(&row, 1)?,
            depth: count(&row, 2)? as u32,
            kind: at(&row, 3)?,
            tokens: count(&row, 4)?,
            in_context: at(&row, 5)?,
            child_summaries: client
                .rows(
                    "SELECT child_summary_id FROM summary_edges
                     WHERE parent_id = $1 AND child_summary_id IS NOT NULL ORDER BY ordinal",
                    &[&row_id],
                )
                .await?
                .iter()
                .map(|row| at(row, 0))
                .collect::<Result<_>>()?,
            child_messages: count(&row, 6)?,
            child_message_tokens: count(&row, 7)?,
            level: at(&row, 8)?,
            summarizer: at(&row, 9)?,
            created_at_ms: at(&row, 10)?,
            earliest_at_ms: at(&row, 11)?,
            latest_at_ms: at(&row, 12)?,
        });
    }
    let row = client
        .row(
            "SELECT count(*), coalesce(sum(tokens), 0)::BIGINT FROM context_items
             WHERE conversation_id = $1 AND message_id IS NOT NULL",
            &[&conversation.0],
        )
        .await?;
    view.raw_messages = count(&row, 0)?;
    view.raw_message_tokens = count(&row, 1)?;
    Ok(view)
}

pub(super) async fn messages_in_seq_range(
    client: &impl Sql,
    conversation: ConversationId,
    first_seq: u64,
    last_seq: u64,
) -> Result<Vec<StoredMessage>> {
    client
        .rows(
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages m
                 WHERE m.conversation_id = $1 AND m.seq BETWEEN $2 AND $3 ORDER BY m.seq"
            ),
            &[
                &conversation.0,
                &(first_seq.min(i64::MAX as u64) as i64),
                &(last_seq.min(i64::MAX as u64) as i64),
            ],
        )
        .await?
        .iter()
        .map(|row| message_row(row, 0))
        .collect()
}
