//! Searches on PostgreSQL, as on SQLite (twin: `crate::sqlite::search`; what both do alike:
//! `crate::search`): this node's tantivy index answers text and phrase
//! queries (BM25) for the rows it holds, and the rows beyond its watermark are read from the
//! database, screened in SQL (their lowercased JSON must hold the query's ASCII terms) and
//! matched with the same tokenizer and phrase rule, scored by the share of the query's words
//! they hold relative to the best indexed hit. Regex reads the database. Without an index,
//! the database answers alone.

use super::Sql;
use crate::SUMMARY_ROLE;

use super::at;
use super::follow::Follower;
use super::read::{MESSAGE_COLUMNS, SUMMARY_COLUMNS, message_row, summary_row, top_ancestor_row};
use crate::blobs::{BLOB_ID_KEY, INDEXED_BLOB_BYTES};
use crate::error::Result;
use crate::error::StoreError;
use crate::highlight::{Marks, QueryWords, snippet, snippet_of_match};
use crate::index::{IndexedRow, Watermark, key_of};
use crate::search::{
    REGEX_BLOB_BYTES, check_bounds, fuse_hits, match_share, message_hit, query_regex, row_nearness,
    summary_hit, unindexed_scale, widened, without_unavailable_model,
};
use crate::tokenize::{term_screen, words};
use crate::types::*;
use vilvona_embed::Embedder;

pub(crate) async fn run(
    client: &impl Sql,
    index: Option<&Follower>,
    embedder: Option<&dyn Embedder>,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    check_bounds(query)?;
    // The scope is the agent's: a conversation of another agent is never searched.
    let mut query = query.clone();
    query.conversations = client
        .rows(
            "SELECT id FROM conversations WHERE id = ANY($1) AND agent_id = $2 ORDER BY id",
            &[&ids(&query), &query.agent_id],
        )
        .await?
        .iter()
        .map(|row| at(row, 0).map(ConversationId))
        .collect::<Result<_>>()?;
    let query = &query;
    if query.conversations.is_empty() || query.limit == 0 {
        return Ok(Vec::new());
    }
    let mut hits = match query.mode {
        SearchMode::Regex => regex_search(client, query).await?,
        SearchMode::Text | SearchMode::Phrase => word_search(client, index, query).await?,
        SearchMode::Semantic => {
            let embedder = embedder.ok_or(StoreError::NoEmbeddings)?;
            meaning_search(client, index, embedder, query).await?
        }
        SearchMode::Hybrid => {
            let text = word_search(client, index, &widened(query, SearchMode::Text)).await?;
            let meaning = match embedder {
                Some(embedder) => without_unavailable_model(
                    meaning_search(
                        client,
                        index,
                        embedder,
                        &widened(query, SearchMode::Semantic),
                    )
                    .await,
                )?,
                None => Vec::new(),
            };
            fuse_hits(text, meaning, query)
        }
    };
    for hit in &mut hits {
        hit.covered_by = match top_ancestor_row(client, hit.source.item_ref()).await? {
            Some(row) => client
                .row_opt("SELECT summary_id FROM summaries WHERE id = $1", &[&row.0])
                .await?
                .map(|row| at(&row, 0))
                .transpose()?,
            None => None,
        };
    }
    Ok(hits)
}

pub(crate) async fn blob_content(client: &impl Sql, blob_id: &str) -> Result<Option<String>> {
    client
        .row_opt("SELECT content FROM blobs WHERE blob_id = $1", &[&blob_id])
        .await?
        .map(|row| at(&row, 0))
        .transpose()
}

async fn blobs_of(client: &impl Sql, message: i64) -> Result<Vec<String>> {
    client
        .rows(
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

/// BM25 (or phrase) hits from this node's index, merged with the matches among the rows
/// beyond its watermark, read from the database (as on SQLite).
async fn word_search(
    client: &impl Sql,
    index: Option<&Follower>,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    let query_words = words(&query.text);
    if query_words.is_empty() {
        return Ok(Vec::new());
    }
    // A stemmed term screens by the part every word of it holds.
    let terms: Vec<String> = query_words
        .iter()
        .flat_map(|word| word.terms.iter().map(|term| term_screen(term).to_owned()))
        .collect();
    let query_marks = QueryWords::new(&query.text, &query_words);
    let marks = Marks::Words(&query_marks);
    let (through, indexed) = match index.map(|index| read_index(index, query)) {
        Some(Ok(found)) => found,
        // The index is disposable: when it cannot be read, the database answers alone.
        Some(Err(error)) => {
            tracing::warn!(%error, "this node's recall index could not be read; searching the database instead");
            (Watermark::default(), Vec::new())
        }
        None => (Watermark::default(), Vec::new()),
    };
    let best = unindexed_scale(indexed.iter().map(|(_, score)| *score), query_words.len());
    let (patterns, all) = screen(query, &terms).unwrap_or((vec!["%".to_owned()], false));
    let quantifier = if all { "ALL" } else { "ANY" };
    let conversations = ids(query);
    let mut found: Vec<(u64, f32, SearchHit)> = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    for (row, score) in indexed {
        let key = key_of(row);
        let hit = match row {
            IndexedRow::Message(id) => match super::read::message(client, MessageId(id)).await? {
                Some(message) => {
                    let text = message.text();
                    let (snippet, file) = match snippet_of_match(&text, marks) {
                        Some(snippet) => (snippet, None),
                        None => {
                            match blob_match(client, &message, query, &query_words, &mut budget)
                                .await?
                            {
                                (Some(_), content, file) => (snippet(&content, marks), file),
                                (None, _, _) => (snippet(&text, marks), None),
                            }
                        }
                    };
                    Some(message_hit(message, score, snippet, file))
                }
                None => None,
            },
            IndexedRow::Summary(id) => super::read::summary(client, SummaryRowId(id))
                .await?
                .map(|summary| summary_hit(summary, score, marks)),
        };
        // The index is derived; the database decides. A row outside the scope is never
        // returned.
        if let Some(hit) = hit
            && query.conversations.contains(&hit.conversation)
        {
            found.push((key, score, hit));
        }
    }
    // Whether any row lies beyond the watermark (two probes of the primary keys): usually
    // none, right after the index followed.
    let newest = client
        .row(
            "SELECT (SELECT coalesce(max(id), 0) FROM messages),
                    (SELECT coalesce(max(id), 0) FROM summaries)",
            &[],
        )
        .await?;
    let (newest_message, newest_summary): (i64, i64) = (at(&newest, 0)?, at(&newest, 1)?);
    if query.target != SearchTarget::Summaries && newest_message > through.messages {
        // JSON escapes no letter unless asked to: a row holding `\u` escapes, or a reference
        // to stored content, always goes on to be matched.
        let rows = client
            .rows(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN conversations c ON c.id = m.conversation_id
                     WHERE m.conversation_id = ANY($1) AND c.agent_id = $2
                       AND ($3::BIGINT IS NULL OR m.created_at >= $3)
                       AND ($4::BIGINT IS NULL OR m.created_at < $4)
                       AND (strpos(m.json, '\\u') > 0 OR strpos(m.json, $5) > 0
                            OR lower(m.json) LIKE {quantifier}($6))
                       AND m.id > $7"
                ),
                &[
                    &conversations,
                    &query.agent_id,
                    &query.since_ms,
                    &query.before_ms,
                    &BLOB_ID_KEY,
                    &patterns,
                    &through.messages,
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
                found.push((
                    key,
                    best * share,
                    message_hit(message, best * share, snippet, file),
                ));
            }
        }
    }
    if query.target != SearchTarget::Messages && newest_summary > through.summaries {
        let rows = client
            .rows(
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM summaries s JOIN conversations c ON c.id = s.conversation_id
                     WHERE s.conversation_id = ANY($1) AND c.agent_id = $2
                       AND ($3::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) >= $3)
                       AND ($4::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) < $4)
                       AND lower(s.content) LIKE {quantifier}($5)
                       AND s.id > $6"
                ),
                &[
                    &conversations,
                    &query.agent_id,
                    &query.since_ms,
                    &query.before_ms,
                    &patterns,
                    &through.summaries,
                ],
            )
            .await?;
        for row in rows {
            let summary = summary_row(&row, 0)?;
            if let Some(share) = match_share(query.mode, &summary.content, &query_words) {
                let key = key_of(IndexedRow::Summary(summary.row_id.0));
                found.push((key, best * share, summary_hit(summary, best * share, marks)));
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

/// The rows nearest the query's meaning, as on SQLite: this node's index's nearest, with the
/// rows beyond its watermark read from the database and embedded as they are read.
async fn meaning_search(
    client: &impl Sql,
    index: Option<&Follower>,
    embedder: &dyn Embedder,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    let Some(vector) = embedder.embed_query(&query.text)? else {
        return Ok(Vec::new());
    };
    let usable = index.filter(|index| {
        index
            .index()
            .embedder()
            .is_some_and(|own| own.name() == embedder.name())
    });
    let read = |index: &Follower| {
        crate::index::contained(|| {
            let through = index.searched_through()?;
            Ok((through, index.index().nearest(query, &vector)?))
        })
    };
    let (through, indexed) = match usable.map(read) {
        Some(Ok(found)) => found,
        Some(Err(error)) => {
            tracing::warn!(%error, "this node's recall index could not be read; embedding the database's rows instead");
            (Watermark::default(), Vec::new())
        }
        None => (Watermark::default(), Vec::new()),
    };
    let quantised = vilvona_embed::QueryVector::new(&vector);
    let nearness = row_nearness(embedder, &quantised);
    let query_words = words(&query.text);
    let query_marks = QueryWords::new(&query.text, &query_words);
    let marks = Marks::Words(&query_marks);
    let conversations = ids(query);
    let mut found: Vec<(u64, f32, SearchHit)> = Vec::new();
    for (row, score) in indexed {
        let hit = match row {
            IndexedRow::Message(id) => {
                super::read::message(client, MessageId(id))
                    .await?
                    .map(|message| {
                        let snippet = snippet(&message.text(), marks);
                        message_hit(message, score, snippet, None)
                    })
            }
            IndexedRow::Summary(id) => super::read::summary(client, SummaryRowId(id))
                .await?
                .map(|summary| summary_hit(summary, score, marks)),
        };
        if let Some(hit) = hit
            && query.conversations.contains(&hit.conversation)
        {
            found.push((key_of(row), score, hit));
        }
    }
    // Rows beyond the watermark: embedded as they are read, with a local model only (as on
    // SQLite).
    let local = embedder.local();
    if local && query.target != SearchTarget::Summaries {
        let rows = client
            .rows(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN conversations c ON c.id = m.conversation_id
                     WHERE m.conversation_id = ANY($1) AND c.agent_id = $2
                       AND ($3::BIGINT IS NULL OR m.created_at >= $3)
                       AND ($4::BIGINT IS NULL OR m.created_at < $4)
                       AND m.id > $5
                     ORDER BY m.id"
                ),
                &[&conversations, &query.agent_id, &query.since_ms, &query.before_ms, &through.messages],
            )
            .await?;
        // Each message's neighbour, as the index's document will have it.
        let mut last: std::collections::HashMap<i64, Option<String>> =
            std::collections::HashMap::new();
        for row in rows {
            let message = message_row(&row, 0)?;
            let text = message.text();
            let conversation = message.conversation.0;
            let neighbour = match last.remove(&conversation) {
                Some(neighbour) => neighbour,
                None => {
                    super::follow::neighbour_before(client, conversation, message.seq as i64)
                        .await?
                }
            };
            last.insert(conversation, crate::index::neighbour_of(&text));
            if let Some(score) = nearness(&text, &message.role, neighbour.as_deref()) {
                let key = key_of(IndexedRow::Message(message.id.0));
                let snippet = snippet(&text, marks);
                found.push((key, score, message_hit(message, score, snippet, None)));
            }
        }
    }
    if local && query.target != SearchTarget::Messages {
        let rows = client
            .rows(
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM summaries s JOIN conversations c ON c.id = s.conversation_id
                     WHERE s.conversation_id = ANY($1) AND c.agent_id = $2
                       AND ($3::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) >= $3)
                       AND ($4::BIGINT IS NULL OR coalesce(s.latest_at, s.created_at) < $4)
                       AND s.id > $5"
                ),
                &[&conversations, &query.agent_id, &query.since_ms, &query.before_ms, &through.summaries],
            )
            .await?;
        for row in rows {
            let summary = summary_row(&row, 0)?;
            if let Some(score) = nearness(&summary.content, SUMMARY_ROLE, None) {
                let key = key_of(IndexedRow::Summary(summary.row_id.0));
                found.push((key, score, summary_hit(summary, score, marks)));
            }
        }
    }
    found.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    found.dedup_by_key(|(key, _, _)| *key);
    let mut hits: Vec<SearchHit> = found
        .into_iter()
        .take(query.limit)
        .map(|(_, _, hit)| hit)
        .collect();
    if query.order == SearchOrder::Recency {
        hits.sort_by_key(|hit| std::cmp::Reverse(hit.time_ms));
    }
    Ok(hits)
}

/// The index's hits and the watermark its reader holds (read before searching).
fn read_index(
    index: &Follower,
    query: &SearchQuery,
) -> Result<(Watermark, Vec<(IndexedRow, f32)>)> {
    crate::index::contained(|| {
        let through = index.searched_through()?;
        Ok((through, index.index().search(query)?))
    })
}

/// A message whose own text does not match, matched through the stored files it references
/// (as the index holds their words under it): the share, the text to cut the snippet from,
/// and the file.
async fn blob_match(
    client: &impl Sql,
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
            content.truncate(crate::tokenize::floor_boundary(
                &content,
                INDEXED_BLOB_BYTES,
            ));
        }
        if let Some(share) = match_share(query.mode, &content, query_words) {
            return Ok((Some(share), content, Some(blob)));
        }
    }
    Ok((None, String::new(), None))
}

async fn regex_search(client: &impl Sql, query: &SearchQuery) -> Result<Vec<SearchHit>> {
    let pattern = query_regex(query)?;
    let marks = Marks::Pattern(&pattern);
    let mut hits = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    for conversation in &query.conversations {
        if query.target != SearchTarget::Summaries {
            let rows = client
                .rows(
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
                .rows(
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
