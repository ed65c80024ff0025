//! Searches on PostgreSQL: rows are screened in SQL (their lowercased JSON must hold the
//! query's ASCII terms), then matched with the same tokenizer, phrase rule, highlighter and
//! regex engine as on SQLite, so what matches is the same on both backends. Text queries rank
//! by the share of the query's words a row holds, newest first among equals.

use regex::RegexBuilder;
use tokio_postgres::GenericClient;

use super::{MESSAGE_COLUMNS, SUMMARY_COLUMNS, at, message_row, summary_row, top_ancestor_row};
use crate::blobs::{BLOB_ID_KEY, INDEXED_BLOB_BYTES};
use crate::error::{Result, StoreError};
use crate::highlight::{Marks, QueryWords, snippet};
use crate::index::{IndexedRow, key_of};
use crate::search::{
    REGEX_BLOB_BYTES, REGEX_SIZE_LIMIT, check_bounds, match_share, message_hit, summary_hit,
};
use crate::tokenize::words;
use crate::types::*;

pub(crate) async fn run(
    client: &impl GenericClient,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    check_bounds(query)?;
    if query.conversations.is_empty() || query.limit == 0 {
        return Ok(Vec::new());
    }
    let mut hits = match query.mode {
        SearchMode::Regex => regex_search(client, query).await?,
        SearchMode::Text | SearchMode::Phrase => word_search(client, query).await?,
    };
    for hit in &mut hits {
        let item = match &hit.source {
            HitSource::Message { id, .. } => ItemRef::Message(*id),
            HitSource::Summary { row_id, .. } => ItemRef::Summary(*row_id),
        };
        hit.covered_by = match top_ancestor_row(client, item).await? {
            Some(row) => client
                .query_opt("SELECT summary_id FROM summaries WHERE id = $1", &[&row.0])
                .await?
                .map(|row| at(&row, 0))
                .transpose()?,
            None => None,
        };
    }
    Ok(hits)
}

pub(crate) async fn blob_content(
    client: &impl GenericClient,
    blob_id: &str,
) -> Result<Option<String>> {
    client
        .query_opt("SELECT content FROM blobs WHERE blob_id = $1", &[&blob_id])
        .await?
        .map(|row| at(&row, 0))
        .transpose()
}

async fn blobs_of(client: &impl GenericClient, message: i64) -> Result<Vec<String>> {
    client
        .query(
            "SELECT blob_id FROM blob_references WHERE message_id = $1 ORDER BY blob_id",
            &[&message],
        )
        .await?
        .iter()
        .map(|row| at(row, 0))
        .collect()
}

fn ids(query: &SearchQuery) -> Vec<i64> {
    query.conversations.iter().map(|id| id.0).collect()
}

/// The `LIKE` patterns rows must hold, and whether all must (a phrase) or any (text). `None`
/// when no screen is safe: a term outside ASCII, which `lower()` may not fold as Rust does.
fn screen(query: &SearchQuery, terms: &[String]) -> Option<(Vec<String>, bool)> {
    let all = query.mode == SearchMode::Phrase;
    let ascii: Vec<String> = terms
        .iter()
        .filter(|term| term.is_ascii())
        .map(|term| format!("%{term}%"))
        .collect();
    let usable = if all {
        !ascii.is_empty()
    } else {
        ascii.len() == terms.len()
    };
    usable.then_some((ascii, all))
}

async fn word_search(client: &impl GenericClient, query: &SearchQuery) -> Result<Vec<SearchHit>> {
    let query_words = words(&query.text);
    if query_words.is_empty() {
        return Ok(Vec::new());
    }
    let terms: Vec<String> = query_words
        .iter()
        .flat_map(|word| word.terms.clone())
        .collect();
    let query_marks = QueryWords::new(&query.text, &query_words);
    let marks = Marks::Words(&query_marks);
    let (patterns, all) = screen(query, &terms).unwrap_or((vec!["%".to_owned()], false));
    let quantifier = if all { "ALL" } else { "ANY" };
    let conversations = ids(query);
    let mut found: Vec<(u64, f32, SearchHit)> = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    if query.target != SearchTarget::Summaries {
        // JSON escapes no letter unless asked to: a row holding `\u` escapes, or a reference
        // to stored content, always goes on to be matched.
        let rows = client
            .query(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN conversations c ON c.id = m.conversation_id
                     WHERE m.conversation_id = ANY($1) AND c.agent_id = $2
                       AND ($3::BIGINT IS NULL OR m.created_at >= $3)
                       AND ($4::BIGINT IS NULL OR m.created_at < $4)
                       AND (strpos(m.json, '\\u') > 0 OR strpos(m.json, $5) > 0
                            OR lower(m.json) LIKE {quantifier}($6))"
                ),
                &[
                    &conversations,
                    &query.agent_id,
                    &query.since_ms,
                    &query.before_ms,
                    &BLOB_ID_KEY,
                    &patterns,
                ],
            )
            .await?;
        for row in rows {
            let message = message_row(&row, 0)?;
            let text = message.text();
            let (share, snippet_text, file) = match match_share(query.mode, &text, &query_words) {
                Some(share) => (Some(share), text, None),
                None if message.json.contains(BLOB_ID_KEY) => {
                    blob_match(client, &message, query, &query_words, &mut budget).await?
                }
                None => (None, text, None),
            };
            if let Some(share) = share {
                let key = key_of(IndexedRow::Message(message.id.0));
                let snippet = snippet(&snippet_text, marks);
                found.push((key, share, message_hit(message, share, snippet, file)));
            }
        }
    }
    if query.target != SearchTarget::Messages {
        let rows = client
            .query(
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM summaries s JOIN conversations c ON c.id = s.conversation_id
                     WHERE s.conversation_id = ANY($1) AND c.agent_id = $2
                       AND ($3::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) >= $3)
                       AND ($4::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) < $4)
                       AND lower(s.content) LIKE {quantifier}($5)"
                ),
                &[
                    &conversations,
                    &query.agent_id,
                    &query.since_ms,
                    &query.before_ms,
                    &patterns,
                ],
            )
            .await?;
        for row in rows {
            let summary = summary_row(&row, 0)?;
            if let Some(share) = match_share(query.mode, &summary.content, &query_words) {
                let key = key_of(IndexedRow::Summary(summary.row_id.0));
                found.push((key, share, summary_hit(summary, share, marks)));
            }
        }
    }
    match query.order {
        SearchOrder::Relevance => {
            found.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        }
        SearchOrder::Recency => found.sort_by_key(|(_, _, hit)| std::cmp::Reverse(hit.time_ms)),
    }
    Ok(found
        .into_iter()
        .take(query.limit)
        .map(|(_, _, hit)| hit)
        .collect())
}

/// A message whose own text does not match, matched through the stored files it references
/// (as the index holds their words under it): the share, the text to cut the snippet from,
/// and the file.
async fn blob_match(
    client: &impl GenericClient,
    message: &StoredMessage,
    query: &SearchQuery,
    query_words: &[crate::tokenize::Word],
    budget: &mut usize,
) -> Result<(Option<f32>, String, Option<String>)> {
    for blob in blobs_of(client, message.id.0).await? {
        if *budget == 0 {
            break;
        }
        let Some(mut content) = blob_content(client, &blob).await? else {
            continue;
        };
        *budget = budget.saturating_sub(content.len());
        if content.len() > INDEXED_BLOB_BYTES {
            content.truncate(crate::search::floor_boundary(&content, INDEXED_BLOB_BYTES));
        }
        if let Some(share) = match_share(query.mode, &content, query_words) {
            return Ok((Some(share), content, Some(blob)));
        }
    }
    Ok((None, String::new(), None))
}

async fn regex_search(client: &impl GenericClient, query: &SearchQuery) -> Result<Vec<SearchHit>> {
    let pattern = RegexBuilder::new(&query.text)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|error| StoreError::InvalidRegex {
            pattern: query.text.clone(),
            detail: error.to_string(),
        })?;
    let marks = Marks::Pattern(&pattern);
    let mut hits = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    for conversation in &query.conversations {
        if query.target != SearchTarget::Summaries {
            let rows = client
                .query(
                    &format!(
                        "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE m.conversation_id = $1 AND c.agent_id = $2
                           AND ($3::BIGINT IS NULL OR m.created_at >= $3)
                           AND ($4::BIGINT IS NULL OR m.created_at < $4)
                         ORDER BY m.seq DESC"
                    ),
                    &[&conversation.0, &query.agent_id, &query.since_ms, &query.before_ms],
                )
                .await?;
            for row in rows {
                if hits.len() >= query.limit {
                    break;
                }
                let message = message_row(&row, 0)?;
                let text = message.text();
                if pattern.is_match(&text) {
                    let snippet = snippet(&text, marks);
                    hits.push(message_hit(message, 0.0, snippet, None));
                    continue;
                }
                if !message.json.contains(BLOB_ID_KEY) {
                    continue;
                }
                for blob in blobs_of(client, message.id.0).await? {
                    if budget == 0 {
                        break;
                    }
                    let Some(content) = blob_content(client, &blob).await? else {
                        continue;
                    };
                    budget = budget.saturating_sub(content.len());
                    if pattern.is_match(&content) {
                        let snippet = snippet(&content, marks);
                        hits.push(message_hit(message, 0.0, snippet, Some(blob)));
                        break;
                    }
                }
            }
        }
        if query.target != SearchTarget::Messages && hits.len() < query.limit {
            let rows = client
                .query(
                    &format!(
                        "SELECT {SUMMARY_COLUMNS} FROM summaries s JOIN conversations c ON c.id = s.conversation_id
                         WHERE s.conversation_id = $1 AND c.agent_id = $2
                           AND ($3::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) >= $3)
                           AND ($4::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) < $4)
                         ORDER BY s.id DESC"
                    ),
                    &[&conversation.0, &query.agent_id, &query.since_ms, &query.before_ms],
                )
                .await?;
            for row in rows {
                if hits.len() >= query.limit {
                    break;
                }
                let summary = summary_row(&row, 0)?;
                if pattern.is_match(&summary.content) {
                    hits.push(summary_hit(summary, 0.0, marks));
                }
            }
        }
    }
    hits.sort_by_key(|hit| std::cmp::Reverse(hit.time_ms));
    hits.truncate(query.limit);
    Ok(hits)
}
