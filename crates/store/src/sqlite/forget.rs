//! Forgetting and archiving on SQLite (twin: `crate::pg::forget`): the SQL, run inside the
//! writer's transaction.
//!
//! Forgetting removes rows and everything derived from them in one transaction — context items
//! (in any conversation that holds them by reference), DAG edges, summaries, blob references
//! and blobs nothing references any more, grants, per-conversation state — and queues the
//! index's documents for those rows in `index_tasks`, in the same transaction, so the index
//! follows even when the process dies before it commits. A summary that covered a forgotten
//! message is rewritten (the engine summarized what remains) or removed.

use std::collections::HashSet;

use rusqlite::{Connection, OptionalExtension, params};

use super::write::WriteTx;
use super::{index_rows, read};
use crate::error::Result;
use crate::forget::task_key;
use crate::index::IndexedRow;
use crate::types::*;

/// The summaries above the messages of `conversation` created before `before_ms`, lowest
/// depth first; when `None`, above every message and every summary of it (any conversation's:
/// a fork's fold of its parent's rows): what forgetting those rows touches.
pub(crate) fn summaries_above(
    connection: &Connection,
    conversation: ConversationId,
    before_ms: Option<i64>,
) -> Result<Vec<StoredSummary>> {
    let mut statement = connection.prepare_cached(
        "WITH RECURSIVE up(id) AS (
             SELECT parent_id FROM (
                 SELECT e.parent_id FROM summary_edges e
                 JOIN messages m ON m.id = e.child_message_id
                 WHERE m.conversation_id = ?1 AND (?2 IS NULL OR m.created_at < ?2)
                 UNION
                 SELECT e.parent_id FROM summary_edges e
                 JOIN summaries c ON c.id = e.child_summary_id
                 WHERE ?2 IS NULL AND c.conversation_id = ?1
             )
             UNION
             SELECT e.parent_id FROM summary_edges e JOIN up ON e.child_summary_id = up.id
         )
         SELECT id FROM summaries WHERE id IN (SELECT id FROM up) ORDER BY depth, id",
    )?;
    let ids = statement
        .query_map(params![conversation.0, before_ms], |row| {
            row.get::<_, i64>(0)
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut summaries = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(summary) = read::summary(connection, SummaryRowId(id))? {
            summaries.push(summary);
        }
    }
    Ok(summaries)
}

/// Queues index work for a row: its document is removed and, if the row still exists in a
/// conversation that is not archived, added again from the database.
fn queue(connection: &WriteTx<'_>, row: IndexedRow) -> Result<()> {
    connection
        .prepare_cached("INSERT OR IGNORE INTO index_tasks (key) VALUES (?1)")?
        .execute([task_key(row)])?;
    Ok(())
}

/// Applies a plan in the caller's transaction. `None` (stale) when the summaries above the
/// forgotten messages are no longer the ones the plan was made for (a compaction ran
/// meanwhile).
pub(crate) fn apply(connection: &WriteTx<'_>, plan: &ForgetPlan) -> Result<Option<ForgetReport>> {
    let conversation = plan.conversation;
    if read::conversation(connection.reader(), conversation)?.is_none() {
        return Ok(Some(ForgetReport::default()));
    }
    let before = match plan.scope {
        ForgetScope::Conversation => None,
        ForgetScope::Before(ms) => Some(ms),
    };
    let mut report = ForgetReport::default();
    // Ids are never reused: the highest ever assigned outlives the rows that held them.
    let (highest_message, highest_summary) = index_rows::max_ids(connection.reader())?;
    connection
        .prepare_cached(
            "INSERT INTO store_state (key, value) VALUES ('highest_message_id', ?1), ('highest_summary_id', ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?
        .execute(params![highest_message.to_string(), highest_summary.to_string()])?;
    let (messages, summaries): (Vec<i64>, Vec<i64>) = match plan.scope {
        ForgetScope::Conversation => {
            if !plan.still_covers(
                conversation,
                &summaries_above(connection.reader(), conversation, None)?,
            ) {
                return Ok(None);
            }
            let mut summaries = ids(
                connection.reader(),
                "SELECT id FROM summaries WHERE conversation_id = ?1",
                conversation.0,
            )?;
            summaries.extend(plan.removed.iter().map(|id| id.0));
            (
                ids(
                    connection.reader(),
                    "SELECT id FROM messages WHERE conversation_id = ?1",
                    conversation.0,
                )?,
                summaries,
            )
        }
        ForgetScope::Before(before_ms) => {
            if !plan.still_covers(
                conversation,
                &summaries_above(connection.reader(), conversation, before)?,
            ) {
                return Ok(None);
            }
            let mut statement = connection.prepare_cached(
                "SELECT id FROM messages WHERE conversation_id = ?1 AND created_at < ?2",
            )?;
            let messages = statement
                .query_map(params![conversation.0, before_ms], |row| row.get(0))?
                .collect::<rusqlite::Result<Vec<i64>>>()?;
            (messages, plan.removed.iter().map(|id| id.0).collect())
        }
    };

    // Context items that hold a forgotten row, in any conversation (a fork or a subagent may
    // hold them by reference), and the running totals of those conversations.
    let mut touched: HashSet<i64> = HashSet::new();
    for (column, rows) in [("message_id", &messages), ("summary_id", &summaries)] {
        let mut find = connection.prepare_cached(&format!(
            "SELECT conversation_id, tokens FROM context_items WHERE {column} = ?1"
        ))?;
        let mut delete =
            connection.prepare_cached(&format!("DELETE FROM context_items WHERE {column} = ?1"))?;
        let mut subtract = connection.prepare_cached(
            "UPDATE conversations SET context_tokens = context_tokens - ?2 WHERE id = ?1",
        )?;
        for id in rows {
            let held: Vec<(i64, i64)> = find
                .query_map([id], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            if held.is_empty() {
                continue;
            }
            report.context_items += delete.execute([id])? as u64;
            for (holder, tokens) in held {
                touched.insert(holder);
                subtract.execute(params![holder, tokens])?;
            }
        }
    }

    // Rewritten summaries: new text and tokens, their edges to forgotten children gone, their
    // span recomputed from what remains.
    for rewrite in &plan.rewritten {
        connection
            .prepare_cached(
                "DELETE FROM summary_edges WHERE parent_id = ?1
                 AND (child_message_id IN (SELECT id FROM messages WHERE conversation_id = ?2
                          AND (?3 IS NULL OR created_at < ?3))
                      OR child_summary_id IN (SELECT value FROM json_each(?4)))",
            )?
            .execute(params![
                rewrite.row_id.0,
                conversation.0,
                before,
                serde_json::to_string(&summaries).unwrap_or_default()
            ])?;
        let remaining = read::child_refs(connection.reader(), rewrite.row_id)?;
        let kind = read::summary(connection.reader(), rewrite.row_id)?
            .map(|summary| summary.kind)
            .unwrap_or(vilvona_core::summarize::SummaryKind::Leaf);
        let span = read::span_of(connection.reader(), &remaining, kind)?;
        let old_tokens: i64 = connection
            .prepare_cached("SELECT tokens FROM summaries WHERE id = ?1")?
            .query_row([rewrite.row_id.0], |row| row.get(0))?;
        connection
            .prepare_cached(
                "UPDATE summaries SET content = ?2, tokens = ?3, summarizer = ?4,
                     earliest_at = ?5, latest_at = ?6, first_seq = ?7, last_seq = ?8
                 WHERE id = ?1",
            )?
            .execute(params![
                rewrite.row_id.0,
                rewrite.content,
                rewrite.tokens as i64,
                rewrite.summarizer,
                span.earliest_ms,
                span.latest_ms,
                span.first_seq,
                span.last_seq
            ])?;
        let holders: Vec<i64> = connection
            .prepare_cached("SELECT conversation_id FROM context_items WHERE summary_id = ?1")?
            .query_map([rewrite.row_id.0], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if !holders.is_empty() {
            connection
                .prepare_cached("UPDATE context_items SET tokens = ?2 WHERE summary_id = ?1")?
                .execute(params![rewrite.row_id.0, rewrite.tokens as i64])?;
            for holder in holders {
                connection
                    .prepare_cached(
                        "UPDATE conversations SET context_tokens = context_tokens + ?2 WHERE id = ?1",
                    )?
                    .execute(params![holder, rewrite.tokens as i64 - old_tokens])?;
            }
        }
        queue(connection, IndexedRow::Summary(rewrite.row_id.0))?;
        report.summaries_rewritten += 1;
    }

    // Removed summaries: their edges (as parent and as child), then the rows.
    for id in &summaries {
        connection
            .prepare_cached(
                "DELETE FROM summary_edges WHERE parent_id = ?1 OR child_summary_id = ?1",
            )?
            .execute([id])?;
        report.summaries_removed += connection
            .prepare_cached("DELETE FROM summaries WHERE id = ?1")?
            .execute([id])? as u64;
        queue(connection, IndexedRow::Summary(*id))?;
    }

    // Messages: their edges, blob references, then the rows; blobs nothing references any
    // more go with them.
    let mut blobs: HashSet<String> = HashSet::new();
    for id in &messages {
        connection
            .prepare_cached("DELETE FROM summary_edges WHERE child_message_id = ?1")?
            .execute([id])?;
        for blob in super::blobs::of_message(connection.reader(), *id)? {
            blobs.insert(blob);
        }
        connection
            .prepare_cached("DELETE FROM blob_references WHERE message_id = ?1")?
            .execute([id])?;
        report.messages += connection
            .prepare_cached("DELETE FROM messages WHERE id = ?1")?
            .execute([id])? as u64;
        queue(connection, IndexedRow::Message(*id))?;
    }
    if report.messages > 0 && plan.scope != ForgetScope::Conversation {
        connection
            .prepare_cached(
                "UPDATE conversations SET forgotten_messages = forgotten_messages + ?2 WHERE id = ?1",
            )?
            .execute(params![conversation.0, report.messages as i64])?;
    }
    if plan.scope == ForgetScope::Conversation {
        let owned: Vec<String> = connection
            .prepare_cached("SELECT blob_id FROM blobs WHERE conversation_id = ?1")?
            .query_map([conversation.0], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        blobs.extend(owned);
    }
    for blob in &blobs {
        let reader: Option<i64> = connection
            .prepare_cached(
                "SELECT conversation_id FROM blob_references WHERE blob_id = ?1 LIMIT 1",
            )?
            .query_row([blob], |row| row.get(0))
            .optional()?;
        match reader {
            // Still referenced: it belongs to a conversation that references it.
            Some(reader) => {
                connection
                    .prepare_cached(
                        "UPDATE blobs SET conversation_id = ?2
                         WHERE blob_id = ?1 AND conversation_id = ?3",
                    )?
                    .execute(params![blob, reader, conversation.0])?;
            }
            None => {
                report.blobs += connection
                    .prepare_cached("DELETE FROM blobs WHERE blob_id = ?1")?
                    .execute([blob])? as u64;
            }
        }
    }

    if plan.scope == ForgetScope::Conversation {
        for sql in [
            "DELETE FROM context_items WHERE conversation_id = ?1",
            "DELETE FROM grants WHERE conversation_id = ?1",
            "DELETE FROM turn_commits WHERE conversation_id = ?1",
            "DELETE FROM conversation_state WHERE conversation_id = ?1",
            "DELETE FROM conversations WHERE id = ?1",
        ] {
            connection.prepare_cached(sql)?.execute([conversation.0])?;
        }
        touched.remove(&conversation.0);
    }
    report.conversations_touched = touched.len() as u64;
    Ok(Some(report))
}

/// Marks a conversation archived (or active again) and queues its rows' documents: archived
/// rows leave the index (searches read them from the database), restored ones come back.
pub(crate) fn set_archived(
    connection: &WriteTx<'_>,
    conversation: ConversationId,
    archived_at: Option<i64>,
) -> Result<bool> {
    let changed = connection
        .prepare_cached(
            "UPDATE conversations SET archived_at = ?2
             WHERE id = ?1 AND (archived_at IS NULL) <> (?2 IS NULL)",
        )?
        .execute(params![conversation.0, archived_at])?;
    if changed == 0 {
        return Ok(false);
    }
    connection
        .prepare_cached(
            "INSERT OR IGNORE INTO index_tasks (key)
             SELECT id * 2 FROM messages WHERE conversation_id = ?1
             UNION ALL SELECT id * 2 + 1 FROM summaries WHERE conversation_id = ?1",
        )?
        .execute([conversation.0])?;
    Ok(true)
}

fn ids(connection: &Connection, sql: &str, conversation: i64) -> Result<Vec<i64>> {
    let mut statement = connection.prepare_cached(sql)?;
    let ids = statement
        .query_map([conversation], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    Ok(ids)
}
