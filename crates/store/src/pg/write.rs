//! Writes: ingest, replace, append, remove, and a summary rewritten in place. Each is one
//! transaction; those that change a context first lock its conversation's row, so writes to
//! one conversation take turns across every process and machine.

use std::collections::HashMap;

use deadpool_postgres::Object;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSqlOwned, ToSql};
use vilvona_core::clock::now_ms;

use super::read::*;
use super::{Sql, at, follow};
use crate::error::{Result, StoreError};
use crate::index::IndexedRow;
use crate::rows::{POSITION_STEP, prepare, summary_id};
use crate::types::*;

/// A conversation's messages by ingest key (`$2`): the key, id and seq of each found. One
/// probe of the unique index per key, whatever plan the prepared statement settled on while
/// the table was small.
const MESSAGES_BY_KEY: &str = "SELECT k.key, m.id, m.seq FROM unnest($2::BYTEA[]) AS k(key)
     CROSS JOIN LATERAL (SELECT id, seq FROM messages
                         WHERE conversation_id = $1 AND ingest_key = k.key LIMIT 1) AS m";

/// A conversation's messages by place (`$2`, seqs): the seq, id and stored JSON of each found.
const MESSAGES_BY_PLACE: &str = "SELECT p.seq, m.id, m.json FROM unnest($2::BIGINT[]) AS p(seq)
     CROSS JOIN LATERAL (SELECT id, json FROM messages
                         WHERE conversation_id = $1 AND seq = p.seq LIMIT 1) AS m";

/// The rows `sql` finds for `probes` in a conversation (`$1` the conversation, `$2` the
/// probes), by their first column; the second and third make the value. No probes, no query.
async fn probe<P, K, A, B>(
    client: &impl Sql,
    sql: &str,
    conversation: ConversationId,
    probes: &[P],
) -> Result<HashMap<K, (A, B)>>
where
    P: ToSql + Sync,
    K: FromSqlOwned + Eq + std::hash::Hash,
    A: FromSqlOwned,
    B: FromSqlOwned,
{
    if probes.is_empty() {
        return Ok(HashMap::new());
    }
    let mut found = HashMap::new();
    for row in client.rows(sql, &[&conversation.0, &probes]).await? {
        found.insert(at(&row, 0)?, (at(&row, 1)?, at(&row, 2)?));
    }
    Ok(found)
}

/// A new summary row, its id from the sequence: summary id, conversation, depth, kind, content,
/// tokens, earliest and latest times, first and last places, level, summarizer, creation time.
pub(super) const INSERT_SUMMARY: &str = "INSERT INTO summaries (id, summary_id, conversation_id,
        depth, kind, content, tokens, earliest_at, latest_at, first_seq, last_seq, level,
        summarizer, created_at)
    VALUES (nextval('summary_ids'), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
    RETURNING id";

/// Locks a conversation's row for the rest of the transaction: writes to one conversation's
/// context take turns, across every process and machine.
pub(super) async fn lock_conversation(
    client: &impl Sql,
    conversation: ConversationId,
) -> Result<Row> {
    client
        .row_opt(
            "SELECT next_seq, next_position, archived_at IS NOT NULL FROM conversations
             WHERE id = $1 FOR UPDATE",
            &[&conversation.0],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "conversation",
            id: conversation.0.to_string(),
        })
}

/// Writes a summary's ordered children.
pub(super) async fn insert_edges(
    client: &impl Sql,
    parent: i64,
    children: &[(Option<i64>, Option<i64>)],
) -> Result<()> {
    let (messages, summaries): (Vec<Option<i64>>, Vec<Option<i64>>) =
        children.iter().copied().unzip();
    client
        .run(
            "INSERT INTO summary_edges (parent_id, ordinal, child_message_id, child_summary_id)
             SELECT $1, ordinal - 1, message, summary
             FROM unnest($2::BIGINT[], $3::BIGINT[]) WITH ORDINALITY AS t(message, summary, ordinal)",
            &[&parent, &messages, &summaries],
        )
        .await?;
    Ok(())
}

pub(super) async fn ingest(
    client: &mut Object,
    conversation: ConversationId,
    messages: Vec<NewMessage>,
    advancement_key: Option<String>,
) -> Result<IngestOutcome> {
    let messages = messages
        .into_iter()
        .map(prepare)
        .collect::<Result<Vec<_>>>()?;
    let transaction = client.transaction().await?;
    if let Some(key) = &advancement_key {
        // A node committing the same key meanwhile makes this wait, then find it.
        let inserted = transaction
            .run(
                "INSERT INTO turn_commits (conversation_id, advancement_key, committed_at)
                 VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                &[&conversation.0, key, &now_ms()],
            )
            .await?;
        if inserted == 0 {
            return Ok(IngestOutcome::DuplicateTurn);
        }
    }
    let row = lock_conversation(&transaction, conversation).await?;
    follow::order_rows(&transaction).await?;
    let (mut next_seq, mut next_position, archived): (i64, i64, bool) =
        (at(&row, 0)?, at(&row, 1)?, at(&row, 2)?);

    // What is stored already, in two reads (under the lock, nobody adds to it): the
    // messages with these keys, and those at these places.
    let keys: Vec<&[u8]> = messages
        .iter()
        .filter_map(|message| message.ingest_key.as_ref().map(|key| &key[..]))
        .collect();
    let by_key: HashMap<Vec<u8>, (i64, i64)> =
        probe(&transaction, MESSAGES_BY_KEY, conversation, &keys).await?;
    let places: Vec<i64> = messages
        .iter()
        .filter_map(|message| message.place.and_then(|place| i64::try_from(place).ok()))
        .collect();
    let by_place: HashMap<i64, (i64, String)> =
        probe(&transaction, MESSAGES_BY_PLACE, conversation, &places).await?;

    /// What becomes of one message: stored before, or the n-th new row of this call.
    enum Fate {
        Stored(i64, i64),
        New(usize),
    }
    let mut fates = Vec::with_capacity(messages.len());
    let mut new_rows: Vec<usize> = Vec::new();
    let mut new_by_key: HashMap<[u8; 16], usize> = HashMap::new();
    let mut new_by_seq: HashMap<i64, usize> = HashMap::new();
    for (index, message) in messages.iter().enumerate() {
        let known = match &message.ingest_key {
            Some(key) => match (by_key.get(&key[..]), new_by_key.get(key)) {
                (Some((id, seq)), _) => Some(Fate::Stored(*id, *seq)),
                (None, Some(slot)) => Some(Fate::New(*slot)),
                (None, None) => None,
            },
            None => None,
        };
        let known = known.or_else(|| {
            let place = i64::try_from(message.place?).ok()?;
            match (by_place.get(&place), new_by_seq.get(&place)) {
                (Some((id, json)), _) if *json == message.json => Some(Fate::Stored(*id, place)),
                (None, Some(slot)) if messages[new_rows[*slot]].json == message.json => {
                    Some(Fate::New(*slot))
                }
                _ => None,
            }
        });
        let fate = known.unwrap_or_else(|| {
            let slot = new_rows.len();
            new_rows.push(index);
            if let Some(key) = message.ingest_key {
                new_by_key.insert(key, slot);
            }
            new_by_seq.insert(next_seq + slot as i64, slot);
            Fate::New(slot)
        });
        fates.push(fate);
    }

    let mut ids: Vec<i64> = Vec::new();
    if !new_rows.is_empty() {
        ids = transaction
            .rows(
                "SELECT nextval('message_ids') FROM generate_series(1, $1::BIGINT)",
                &[&(new_rows.len() as i64)],
            )
            .await?
            .iter()
            .map(|row| at(row, 0))
            .collect::<Result<_>>()?;
        ids.sort_unstable();
        let (mut seqs, mut roles, mut jsons, mut tokens, mut keys, mut times, mut positions) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for (slot, index) in new_rows.iter().enumerate() {
            let message = &messages[*index];
            let seq = next_seq + slot as i64;
            seqs.push(seq);
            roles.push(message.role.as_str());
            jsons.push(message.json.as_str());
            tokens.push(message.tokens as i64);
            keys.push(
                message
                    .ingest_key
                    .unwrap_or_else(|| crate::rows::sequence_key(conversation, seq))
                    .to_vec(),
            );
            times.push(message.created_at_ms);
            positions.push(next_position + slot as i64 * POSITION_STEP);
        }
        transaction
            .run(
                "INSERT INTO messages (id, conversation_id, seq, role, json, tokens, ingest_key, created_at)
                 SELECT id, $1, seq, role, json, tokens, key, at
                 FROM unnest($2::BIGINT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[],
                             $7::BYTEA[], $8::BIGINT[]) AS t(id, seq, role, json, tokens, key, at)",
                &[&conversation.0, &ids, &seqs, &roles, &jsons, &tokens, &keys, &times],
            )
            .await?;
        transaction
            .run(
                "INSERT INTO context_items (conversation_id, position, message_id, tokens)
                 SELECT $1, position, id, tokens
                 FROM unnest($2::BIGINT[], $3::BIGINT[], $4::BIGINT[]) AS t(position, id, tokens)",
                &[&conversation.0, &positions, &ids, &tokens],
            )
            .await?;
        for (slot, index) in new_rows.iter().enumerate() {
            for blob in &messages[*index].blobs {
                transaction
                    .run(
                        "INSERT INTO blob_references (blob_id, message_id, conversation_id)
                         SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM blobs WHERE blob_id = $1)
                         ON CONFLICT DO NOTHING",
                        &[blob, &ids[slot], &conversation.0],
                    )
                    .await?;
            }
        }
        let added_tokens: i64 = tokens.iter().sum();
        next_seq += new_rows.len() as i64;
        next_position += new_rows.len() as i64 * POSITION_STEP;
        transaction
            .run(
                // A session resumed after retention archived it is live again.
                "UPDATE conversations
                 SET next_seq = $2, next_position = $3, context_tokens = context_tokens + $4,
                     archived_at = CASE WHEN $5 THEN NULL ELSE archived_at END
                 WHERE id = $1",
                &[
                    &conversation.0,
                    &next_seq,
                    &next_position,
                    &added_tokens,
                    &archived,
                ],
            )
            .await?;
    }
    transaction.commit().await?;
    let first_new_seq = next_seq - new_rows.len() as i64;
    let mut reported = vec![false; new_rows.len()];
    Ok(IngestOutcome::Stored(
        fates
            .into_iter()
            .map(|fate| match fate {
                Fate::Stored(id, seq) => Ingested {
                    message_id: MessageId(id),
                    seq: seq as u64,
                    ingested: false,
                },
                // The first mention stores it; a repeat in the same call was stored by it.
                Fate::New(slot) => Ingested {
                    message_id: MessageId(ids[slot]),
                    seq: (first_new_seq + slot as i64) as u64,
                    ingested: !std::mem::replace(&mut reported[slot], true),
                },
            })
            .collect(),
    ))
}

pub(super) async fn replace(client: &mut Object, plan: ReplacePlan) -> Result<ReplaceOutcome> {
    let (Some(first), Some(last)) = (plan.items.first(), plan.items.last()) else {
        return Ok(ReplaceOutcome::Stale);
    };
    let (first_position, last_position) = (first.0, last.0);
    let transaction = client.transaction().await?;
    lock_conversation(&transaction, plan.conversation).await?;
    follow::order_rows(&transaction).await?;
    let current = items_in_range(
        &transaction,
        plan.conversation,
        first_position,
        last_position,
    )
    .await?;
    if current
        .iter()
        .map(|(position, item, _)| (*position, *item))
        .ne(plan.items.iter().copied())
    {
        return Ok(ReplaceOutcome::Stale);
    }
    let removed_tokens: i64 = current.iter().map(|(_, _, tokens)| *tokens as i64).sum();
    let span = span_of(&transaction, &plan.items, plan.summary.kind).await?;
    let summary_id = summary_id(plan.conversation, &plan.summary, &plan.items);
    let created_at = now_ms();
    let row = transaction
        .row(
            INSERT_SUMMARY,
            &[
                &summary_id,
                &plan.conversation.0,
                &i64::from(plan.summary.depth),
                &kind_str(plan.summary.kind),
                &plan.summary.content,
                &(plan.summary.tokens as i64),
                &span.earliest_ms,
                &span.latest_ms,
                &span.first_seq,
                &span.last_seq,
                &level_str(plan.summary.level),
                &plan.summary.summarizer,
                &created_at,
            ],
        )
        .await?;
    let row_id: i64 = at(&row, 0)?;
    let children: Vec<_> = plan
        .items
        .iter()
        .map(|(_, item)| columns_of(*item))
        .collect();
    insert_edges(&transaction, row_id, &children).await?;
    transaction
        .run(
            "DELETE FROM context_items WHERE conversation_id = $1 AND position BETWEEN $2 AND $3",
            &[&plan.conversation.0, &first_position, &last_position],
        )
        .await?;
    transaction
        .run(
            "INSERT INTO context_items (conversation_id, position, summary_id, tokens)
             VALUES ($1, $2, $3, $4)",
            &[
                &plan.conversation.0,
                &first_position,
                &row_id,
                &(plan.summary.tokens as i64),
            ],
        )
        .await?;
    transaction
        .run(
            "UPDATE conversations SET context_tokens = context_tokens - $2 + $3 WHERE id = $1",
            &[
                &plan.conversation.0,
                &removed_tokens,
                &(plan.summary.tokens as i64),
            ],
        )
        .await?;
    transaction.commit().await?;
    Ok(ReplaceOutcome::Replaced(StoredSummary::published(
        row_id,
        summary_id,
        plan.conversation,
        plan.summary,
        span,
        created_at,
    )))
}

pub(super) async fn append_items(
    client: &mut Object,
    conversation: ConversationId,
    items: Vec<ItemRef>,
) -> Result<()> {
    let transaction = client.transaction().await?;
    let row = lock_conversation(&transaction, conversation).await?;
    let mut next_position: i64 = at(&row, 1)?;
    let mut added: i64 = 0;
    for item in items {
        let tokens = tokens_of(&transaction, item).await?;
        let (message, summary) = columns_of(item);
        transaction
            .run(
                "INSERT INTO context_items (conversation_id, position, message_id, summary_id, tokens)
                 VALUES ($1, $2, $3, $4, $5)",
                &[&conversation.0, &next_position, &message, &summary, &tokens],
            )
            .await?;
        next_position += POSITION_STEP;
        added += tokens;
    }
    transaction
        .run(
            "UPDATE conversations SET next_position = $2, context_tokens = context_tokens + $3
             WHERE id = $1",
            &[&conversation.0, &next_position, &added],
        )
        .await?;
    transaction.commit().await?;
    Ok(())
}

pub(super) async fn remove_context(
    client: &mut Object,
    conversation: ConversationId,
) -> Result<u64> {
    let transaction = client.transaction().await?;
    lock_conversation(&transaction, conversation).await?;
    let removed = transaction
        .run(
            "DELETE FROM context_items WHERE conversation_id = $1",
            &[&conversation.0],
        )
        .await?;
    transaction
        .run(
            "UPDATE conversations SET context_tokens = 0 WHERE id = $1",
            &[&conversation.0],
        )
        .await?;
    transaction.commit().await?;
    Ok(removed)
}

pub(super) async fn update_summary(client: &mut Object, update: SummaryUpdate) -> Result<bool> {
    let transaction = client.transaction().await?;
    // Conversation rows first, in id order, as every write takes them (a fork's replace holds
    // its own and then checks the summary's key); then the summary, without claiming its key.
    transaction
        .run(
            "SELECT id FROM conversations WHERE id IN
                 (SELECT conversation_id FROM context_items WHERE summary_id = $1)
             ORDER BY id FOR UPDATE",
            &[&update.row_id.0],
        )
        .await?;
    let Some(current) = transaction
        .row_opt(
            &format!("SELECT {SUMMARY_COLUMNS} FROM summaries s WHERE s.id = $1 FOR NO KEY UPDATE"),
            &[&update.row_id.0],
        )
        .await?
        .map(|row| summary_row(&row, 0))
        .transpose()?
    else {
        return Ok(false);
    };
    if current.level != update.expected_level || current.summarizer != update.expected_summarizer {
        return Ok(false);
    }
    transaction
        .run(
            "UPDATE summaries SET content = $2, tokens = $3, level = $4, summarizer = $5 WHERE id = $1",
            &[
                &update.row_id.0,
                &update.content,
                &(update.tokens as i64),
                &level_str(update.level),
                &update.summarizer,
            ],
        )
        .await?;
    // Every conversation that holds it (a fork holds its parent's summaries) keeps its
    // running total in step.
    let delta = update.tokens as i64 - current.tokens as i64;
    transaction
        .run(
            "UPDATE conversations c SET context_tokens = c.context_tokens + $2 * held.count
             FROM (SELECT conversation_id, COUNT(*) AS count FROM context_items
                   WHERE summary_id = $1 GROUP BY conversation_id) AS held
             WHERE c.id = held.conversation_id",
            &[&update.row_id.0, &delta],
        )
        .await?;
    transaction
        .run(
            "UPDATE context_items SET tokens = $2 WHERE summary_id = $1",
            &[&update.row_id.0, &(update.tokens as i64)],
        )
        .await?;
    // Every node's index replaces the summary's document.
    follow::log_changes(&transaction, &[IndexedRow::Summary(update.row_id.0)]).await?;
    transaction.commit().await?;
    Ok(true)
}
