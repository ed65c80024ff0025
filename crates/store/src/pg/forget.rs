//! Forgetting on PostgreSQL: the plan `crate::sqlite::forget` applies on SQLite, applied in one
//! transaction here. What it removes or rewrites is written to the change log, from which every
//! node's index follows (`follow`); ids come from sequences, so no row's id is ever reused.

use std::collections::HashSet;

use super::Sql;

use super::at;
use super::read::{span_of, summaries_above};
use crate::error::Result;
use crate::index::IndexedRow;
use crate::types::*;

async fn ids(client: &impl Sql, sql: &str, conversation: i64) -> Result<Vec<i64>> {
    client
        .rows(sql, &[&conversation])
        .await?
        .iter()
        .map(|row| at(row, 0))
        .collect()
}

/// Applies a plan in the caller's transaction; `None` when it is stale.
pub(crate) async fn apply(client: &impl Sql, plan: &ForgetPlan) -> Result<Option<ForgetReport>> {
    let conversation = plan.conversation;
    if client
        .row_opt(
            "SELECT 1 FROM conversations WHERE id = $1",
            &[&conversation.0],
        )
        .await?
        .is_none()
    {
        return Ok(Some(ForgetReport::default()));
    }
    let before = match plan.scope {
        ForgetScope::Conversation => None,
        ForgetScope::Before(ms) => Some(ms),
    };
    // Every conversation whose summaries the plan touches (a fork's folds of these rows), and
    // every one whose context holds these rows (a fork that may yet fold them for the first
    // time), is locked with this one, in id order as every write takes them, before the plan
    // is checked: no fold of the forgotten rows commits between the check and the removal.
    let holders = ids(
        client,
        "SELECT DISTINCT ci.conversation_id FROM context_items ci
         LEFT JOIN messages m ON m.id = ci.message_id
         LEFT JOIN summaries s ON s.id = ci.summary_id
         WHERE m.conversation_id = $1 OR s.conversation_id = $1",
        conversation.0,
    )
    .await?;
    let mut touched: Vec<i64> = summaries_above(client, conversation, before)
        .await?
        .iter()
        .map(|summary| summary.conversation.0)
        .chain(holders)
        .chain([conversation.0])
        .collect();
    touched.sort_unstable();
    touched.dedup();
    client
        .run(
            "SELECT id FROM conversations WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&touched],
        )
        .await?;
    let mut report = ForgetReport::default();
    let (messages, summaries): (Vec<i64>, Vec<i64>) = match plan.scope {
        ForgetScope::Conversation => {
            if !plan.still_covers(
                conversation,
                &summaries_above(client, conversation, None).await?,
            ) {
                return Ok(None);
            }
            let mut summaries = ids(
                client,
                "SELECT id FROM summaries WHERE conversation_id = $1",
                conversation.0,
            )
            .await?;
            summaries.extend(plan.removed.iter().map(|id| id.0));
            (
                ids(
                    client,
                    "SELECT id FROM messages WHERE conversation_id = $1",
                    conversation.0,
                )
                .await?,
                summaries,
            )
        }
        ForgetScope::Before(before_ms) => {
            if !plan.still_covers(
                conversation,
                &summaries_above(client, conversation, before).await?,
            ) {
                return Ok(None);
            }
            let messages = client
                .rows(
                    "SELECT id FROM messages WHERE conversation_id = $1 AND created_at < $2",
                    &[&conversation.0, &before_ms],
                )
                .await?
                .iter()
                .map(|row| at(row, 0))
                .collect::<Result<Vec<i64>>>()?;
            (messages, plan.removed.iter().map(|id| id.0).collect())
        }
    };

    // Context items that hold a forgotten row, in any conversation, and their running totals.
    let mut touched: HashSet<i64> = HashSet::new();
    for (column, rows) in [("message_id", &messages), ("summary_id", &summaries)] {
        let held = client
            .rows(
                &format!(
                    "DELETE FROM context_items WHERE {column} = ANY($1)
                     RETURNING conversation_id, tokens"
                ),
                &[rows],
            )
            .await?;
        report.context_items += held.len() as u64;
        for row in held {
            let holder: i64 = at(&row, 0)?;
            touched.insert(holder);
            client
                .run(
                    "UPDATE conversations SET context_tokens = context_tokens - $2 WHERE id = $1",
                    &[&holder, &at::<i64>(&row, 1)?],
                )
                .await?;
        }
    }

    for rewrite in &plan.rewritten {
        client
            .run(
                "DELETE FROM summary_edges WHERE parent_id = $1
                 AND (child_message_id IN (SELECT id FROM messages WHERE conversation_id = $2
                          AND ($3::BIGINT IS NULL OR created_at < $3))
                      OR child_summary_id = ANY($4))",
                &[&rewrite.row_id.0, &conversation.0, &before, &summaries],
            )
            .await?;
        let remaining = client
            .rows(
                "SELECT ordinal, child_message_id, child_summary_id FROM summary_edges
                 WHERE parent_id = $1 ORDER BY ordinal",
                &[&rewrite.row_id.0],
            )
            .await?
            .iter()
            .map(|row| Ok((at(row, 0)?, super::read::item_of(at(row, 1)?, at(row, 2)?))))
            .collect::<Result<Vec<(i64, ItemRef)>>>()?;
        let current = client
            .row(
                "SELECT kind, tokens FROM summaries WHERE id = $1",
                &[&rewrite.row_id.0],
            )
            .await?;
        let kind = parse_kind(at(&current, 0)?)?;
        let old_tokens: i64 = at(&current, 1)?;
        let span = span_of(client, &remaining, kind).await?;
        client
            .run(
                "UPDATE summaries SET content = $2, tokens = $3, summarizer = $4,
                     earliest_at = $5, latest_at = $6, first_seq = $7, last_seq = $8
                 WHERE id = $1",
                &[
                    &rewrite.row_id.0,
                    &rewrite.content,
                    &(rewrite.tokens as i64),
                    &rewrite.summarizer,
                    &span.earliest_ms,
                    &span.latest_ms,
                    &span.first_seq,
                    &span.last_seq,
                ],
            )
            .await?;
        let holders = client
            .rows(
                "UPDATE context_items SET tokens = $2 WHERE summary_id = $1 RETURNING conversation_id",
                &[&rewrite.row_id.0, &(rewrite.tokens as i64)],
            )
            .await?;
        for row in holders {
            client
                .run(
                    "UPDATE conversations SET context_tokens = context_tokens + $2 WHERE id = $1",
                    &[&at::<i64>(&row, 0)?, &(rewrite.tokens as i64 - old_tokens)],
                )
                .await?;
        }
        report.summaries_rewritten += 1;
    }

    // Removed summaries: their edges (as parent and as child), then the rows.
    client
        .run(
            "DELETE FROM summary_edges WHERE parent_id = ANY($1) OR child_summary_id = ANY($1)",
            &[&summaries],
        )
        .await?;
    report.summaries_removed += client
        .run("DELETE FROM summaries WHERE id = ANY($1)", &[&summaries])
        .await?;

    // Messages: their edges, blob references, then the rows; blobs nothing references any
    // more go with them.
    let mut blobs: HashSet<String> = client
        .rows(
            "DELETE FROM blob_references WHERE message_id = ANY($1) RETURNING blob_id",
            &[&messages],
        )
        .await?
        .iter()
        .map(|row| at(row, 0))
        .collect::<Result<_>>()?;
    client
        .run(
            "DELETE FROM summary_edges WHERE child_message_id = ANY($1)",
            &[&messages],
        )
        .await?;
    report.messages += client
        .run("DELETE FROM messages WHERE id = ANY($1)", &[&messages])
        .await?;
    if report.messages > 0 && plan.scope != ForgetScope::Conversation {
        client
            .run(
                "UPDATE conversations SET forgotten_messages = forgotten_messages + $2 WHERE id = $1",
                &[&conversation.0, &(report.messages as i64)],
            )
            .await?;
    }
    if plan.scope == ForgetScope::Conversation {
        for row in client
            .rows(
                "SELECT blob_id FROM blobs WHERE conversation_id = $1",
                &[&conversation.0],
            )
            .await?
        {
            blobs.insert(at(&row, 0)?);
        }
    }
    for blob in &blobs {
        let reader = client
            .row_opt(
                "SELECT conversation_id FROM blob_references WHERE blob_id = $1 LIMIT 1",
                &[blob],
            )
            .await?;
        match reader {
            // Still referenced: it belongs to a conversation that references it.
            Some(row) => {
                client
                    .run(
                        "UPDATE blobs SET conversation_id = $2 WHERE blob_id = $1 AND conversation_id = $3",
                        &[blob, &at::<i64>(&row, 0)?, &conversation.0],
                    )
                    .await?;
            }
            None => {
                report.blobs += client
                    .run("DELETE FROM blobs WHERE blob_id = $1", &[blob])
                    .await?;
            }
        }
    }
    if plan.scope == ForgetScope::Conversation {
        for sql in [
            "DELETE FROM context_items WHERE conversation_id = $1",
            "DELETE FROM grants WHERE conversation_id = $1",
            "DELETE FROM turn_commits WHERE conversation_id = $1",
            "DELETE FROM conversation_state WHERE conversation_id = $1",
            "DELETE FROM conversations WHERE id = $1",
        ] {
            client.run(sql, &[&conversation.0]).await?;
        }
        touched.remove(&conversation.0);
    }
    // Every node's index drops the forgotten rows' documents and replaces the rewritten ones.
    let changed: Vec<IndexedRow> = messages
        .iter()
        .map(|id| IndexedRow::Message(*id))
        .chain(summaries.iter().map(|id| IndexedRow::Summary(*id)))
        .chain(
            plan.rewritten
                .iter()
                .map(|rewrite| IndexedRow::Summary(rewrite.row_id.0)),
        )
        .collect();
    super::follow::log_changes(client, &changed).await?;
    report.conversations_touched = touched.len() as u64;
    Ok(Some(report))
}
