//! Searches on SQLite (twin: `crate::pg::search`): BM25 and phrase queries through the index,
//! rows past its watermark and archived rows read from SQLite, linear-time regex over the
//! rows, and snippets built from their text.

use rusqlite::Connection;

use super::{blobs, index_rows, read};
use crate::SUMMARY_ROLE;
use crate::blobs::BLOB_ID_KEY;
use crate::error::{Result, StoreError};
use crate::highlight::{Marks, QueryWords, snippet, snippet_of_match};
use crate::index::{IndexRow, IndexedRow, RecallIndex, Watermark, key_of};
use crate::search::{
    REGEX_BLOB_BYTES, check_bounds, fuse, match_share, message_hit, query_regex, row_nearness,
    summary_hit, unindexed_scale, widened, without_unavailable_model,
};
use crate::sqlite::index_rows::Neighbours;
use crate::tokenize::{Word, term_screen, words};
use crate::types::*;
use vilvona_embed::Embedder;

pub(crate) fn run(
    connection: &Connection,
    index: Option<&RecallIndex>,
    embedder: Option<&dyn Embedder>,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    check_bounds(query)?;
    // The scope is the agent's: a conversation of another agent is never searched.
    let mut scope = Vec::with_capacity(query.conversations.len());
    for conversation in &query.conversations {
        if read::agent_of(connection, *conversation)?.as_deref() == Some(query.agent_id.as_str()) {
            scope.push(*conversation);
        }
    }
    let query = &SearchQuery {
        conversations: scope,
        ..query.clone()
    };
    if query.conversations.is_empty() || query.limit == 0 {
        return Ok(Vec::new());
    }
    let mut hits = match query.mode {
        SearchMode::Regex => regex_search(connection, query)?,
        SearchMode::Text | SearchMode::Phrase => indexed_search(connection, index, query)?,
        SearchMode::Semantic => {
            let embedder = embedder.ok_or(StoreError::NoEmbeddings)?;
            meaning_search(connection, index, embedder, query)?
        }
        SearchMode::Hybrid => {
            // Fused by row, so that only the rows returned are read for their snippets.
            let text = indexed_rows(connection, index, &widened(query, SearchMode::Text))?;
            let meaning = match embedder {
                Some(embedder) => without_unavailable_model(meaning_rows(
                    connection,
                    index,
                    embedder,
                    &widened(query, SearchMode::Semantic),
                ))?,
                None => Vec::new(),
            };
            word_hits(connection, fuse(&text, &meaning, query.limit), query)?
        }
    };
    // In the same read: which summary covers each hit now.
    let covering =
        read::top_ancestor_ids(connection, hits.iter().map(|hit| hit.source.item_ref()))?;
    for (hit, covered_by) in hits.iter_mut().zip(covering) {
        hit.covered_by = covered_by;
    }
    Ok(hits)
}

/// BM25 (or phrase) hits from the index, merged with matches among the rows it does not hold
/// yet (beyond the watermark its reader is known to hold), read from SQLite.
fn indexed_search(
    connection: &Connection,
    index: Option<&RecallIndex>,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    let rows = indexed_rows(connection, index, query)?;
    word_hits(connection, rows, query)
}

/// [`indexed_search`]'s rows and scores, best first (or as the index orders them).
fn indexed_rows(
    connection: &Connection,
    index: Option<&RecallIndex>,
    query: &SearchQuery,
) -> Result<Vec<(IndexedRow, f32)>> {
    let query_words = words(&query.text);
    if query_words.is_empty() {
        return Ok(Vec::new());
    }
    let (through, mut rows) = read_index(index, "searching", |index| index.search(query));
    let best = unindexed_scale(rows.iter().map(|(_, score)| *score), query_words.len());
    let mut unindexed = unindexed_matches(connection, query, &query_words, through, best)?;
    unindexed.extend(archived_matches(connection, query, &query_words, best)?);
    if !unindexed.is_empty() {
        let mut known: std::collections::HashSet<IndexedRow> =
            rows.iter().map(|(row, _)| *row).collect();
        rows.extend(unindexed.into_iter().filter(|(row, _)| known.insert(*row)));
        if query.order == SearchOrder::Relevance {
            // Equal scores: the newest row first, as the index orders them.
            rows.sort_by(|a, b| {
                b.1.total_cmp(&a.1)
                    .then_with(|| key_of(b.0).cmp(&key_of(a.0)))
            });
        }
    }
    Ok(rows)
}

/// [`hits_of`] with the query's words marked in the snippets.
fn word_hits(
    connection: &Connection,
    rows: Vec<(IndexedRow, f32)>,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    let query_words = words(&query.text);
    let query_marks = QueryWords::new(&query.text, &query_words);
    hits_of(connection, rows, Marks::Words(&query_marks), query)
}

/// The hits of scored rows, each with a snippet around what matched (for a message, in the
/// stored file that matched when its own text did not), in the query's order and limit. Rows
/// outside the query's scope are dropped: the index is derived, the database decides.
fn hits_of(
    connection: &Connection,
    rows: Vec<(IndexedRow, f32)>,
    marks: Marks,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    let mut hits = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    for (row, score) in rows {
        let hit = match row {
            IndexedRow::Message(id) => match read::message(connection, MessageId(id))? {
                Some(message) => {
                    // The index matched: the snippet comes from where the words are.
                    let text = message.text();
                    let (snippet, file) =
                        message_match(connection, &message, &text, marks, &mut budget)?
                            .unwrap_or_else(|| (snippet(&text, marks), None));
                    Some(message_hit(message, score, snippet, file))
                }
                None => None,
            },
            IndexedRow::Summary(id) => read::summary(connection, SummaryRowId(id))?
                .map(|summary| summary_hit(summary, score, marks)),
        };
        // The index is derived; SQLite decides. A row outside the scope is never returned.
        if let Some(hit) = hit
            && query.conversations.contains(&hit.conversation)
        {
            hits.push(hit);
        }
    }
    if query.order == SearchOrder::Recency {
        hits.sort_by_key(|hit| std::cmp::Reverse(hit.time_ms));
    }
    hits.truncate(query.limit);
    Ok(hits)
}

/// The index's hits and the watermark they are complete to, the index refreshed first; or,
/// when it cannot be read, none (the caller then reads the database alone, `doing` its rows:
/// the index is disposable) and the index marked broken for its maintainer to rebuild.
fn read_index(
    index: Option<&RecallIndex>,
    doing: &str,
    search: impl FnOnce(&RecallIndex) -> Result<Vec<(IndexedRow, f32)>>,
) -> (Watermark, Vec<(IndexedRow, f32)>) {
    let Some(index) = index else {
        return (Watermark::default(), Vec::new());
    };
    let read = crate::index::contained(|| {
        index.refresh()?;
        let through = index.searched_through();
        Ok((through, search(index)?))
    });
    match read {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, "the recall index could not be read; {doing} the database's rows instead");
            index.mark_broken();
            (Watermark::default(), Vec::new())
        }
    }
}

/// The rows nearest the query's meaning (cosine similarity of embeddings): the index's
/// nearest, with the rows it does not hold (beyond its watermark, archived) embedded as they
/// are read. Snippets mark the query's words where the text has them.
fn meaning_search(
    connection: &Connection,
    index: Option<&RecallIndex>,
    embedder: &dyn Embedder,
    query: &SearchQuery,
) -> Result<Vec<SearchHit>> {
    let rows = meaning_rows(connection, index, embedder, query)?;
    word_hits(connection, rows, query)
}

/// [`meaning_search`]'s rows and similarities, nearest first.
fn meaning_rows(
    connection: &Connection,
    index: Option<&RecallIndex>,
    embedder: &dyn Embedder,
    query: &SearchQuery,
) -> Result<Vec<(IndexedRow, f32)>> {
    let Some(vector) = embedder.embed_query(&query.text)? else {
        return Ok(Vec::new());
    };
    // An index that embeds with another model (or not at all) holds no vectors to compare.
    let usable = index.filter(|index| {
        index
            .embedder()
            .is_some_and(|own| own.name() == embedder.name())
    });
    let (through, mut rows) =
        read_index(usable, "embedding", |index| index.nearest(query, &vector));
    // Rows the index does not hold are embedded as they are read, with a local model only (a
    // model behind an endpoint is not asked per search: they are compared once the index
    // holds their vectors).
    if embedder.local() {
        let quantised = vilvona_embed::QueryVector::new(&vector);
        let nearness = row_nearness(embedder, &quantised);
        rows.extend(rows_after(
            connection,
            query,
            through,
            Neighbours::Read,
            |_| true,
            &nearness,
        )?);
        rows.extend(archived_rows(connection, query, &nearness)?);
    }
    rows.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| key_of(b.0).cmp(&key_of(a.0)))
    });
    rows.dedup_by_key(|(row, _)| *row);
    rows.truncate(query.limit);
    Ok(rows)
}

/// Rows beyond the watermark (the last moments of writes, in any process) that match the
/// query, scored relative to the best index score by the share of query terms they hold.
fn unindexed_matches(
    connection: &Connection,
    query: &SearchQuery,
    query_words: &[Word],
    through: Watermark,
    best: f32,
) -> Result<Vec<(IndexedRow, f32)>> {
    // A stemmed term screens by the part every word of it holds.
    let all_terms: Vec<String> = query_words
        .iter()
        .flat_map(|word| word.terms.iter().map(|term| term_screen(term).to_owned()))
        .collect();
    // A cheap screen before parsing a row: its JSON, lowercased, must contain the query's terms
    // (any of them for text, all for a phrase). JSON escapes no letter unless asked to: a row
    // holding `\u` escapes is always parsed, so the screen only ever lets too much through.
    let needs_all = query.mode == SearchMode::Phrase;
    let screen = |json: &str| {
        let lower = json.to_lowercase();
        if lower.contains("\\u") || json.contains(BLOB_ID_KEY) {
            return true;
        }
        let mut present = all_terms.iter().map(|term| lower.contains(term.as_str()));
        if needs_all {
            present.all(|found| found)
        } else {
            present.any(|found| found)
        }
    };
    rows_after(
        connection,
        query,
        through,
        Neighbours::Skip,
        screen,
        |text, _, _| match_share(query.mode, text, query_words).map(|share| best * share),
    )
}

/// Rows beyond the watermark in the query's scope (its agent, conversations, times and
/// target), with the score `score` gives their text and role (none: not a match); a message
/// is read only when `screen` passes its JSON. Rows that cannot be decoded are skipped
/// (doctor names them).
fn rows_after(
    connection: &Connection,
    query: &SearchQuery,
    through: Watermark,
    neighbours: Neighbours,
    screen: impl Fn(&str) -> bool + Sync,
    score: impl Fn(&str, &str, Option<&str>) -> Option<f32>,
) -> Result<Vec<(IndexedRow, f32)>> {
    let mut found = Vec::new();
    let mut consider = |row: IndexRow| -> Result<()> {
        let doc = row.doc();
        if doc.agent == query.agent_id
            && query
                .conversations
                .contains(&ConversationId(doc.conversation))
            && query.since_ms.is_none_or(|since| doc.time_ms >= since)
            && query.before_ms.is_none_or(|before| doc.time_ms < before)
            && let Some(score) = score(doc.text, doc.role, doc.neighbour)
        {
            found.push((doc.row, score));
        }
        Ok(())
    };
    if query.target != SearchTarget::Summaries {
        index_rows::for_each_message_after_where(
            connection,
            through.messages,
            neighbours,
            screen,
            &mut consider,
        )?;
    }
    if query.target != SearchTarget::Messages {
        index_rows::for_each_summary_after(connection, through.summaries, &mut consider)?;
    }
    Ok(found)
}

/// Rows of archived conversations in the query's scope (retention took them out of the index):
/// read from SQLite and matched like the rows beyond the watermark.
fn archived_matches(
    connection: &Connection,
    query: &SearchQuery,
    query_words: &[Word],
    best: f32,
) -> Result<Vec<(IndexedRow, f32)>> {
    archived_rows(connection, query, |text, _, _| {
        match_share(query.mode, text, query_words).map(|share| best * share)
    })
}

/// Rows of archived conversations in the query's scope, with the score `score` gives their
/// text and role (none: not a match).
fn archived_rows(
    connection: &Connection,
    query: &SearchQuery,
    score: impl Fn(&str, &str, Option<&str>) -> Option<f32>,
) -> Result<Vec<(IndexedRow, f32)>> {
    let archived = read::archived_conversations(connection)?;
    let mut found = Vec::new();
    for conversation in &query.conversations {
        if !archived.contains(&conversation.0) {
            continue;
        }
        if query.target != SearchTarget::Summaries {
            // Rows on damaged pages are skipped (and counted in the log), as text search does.
            read::for_each_message_in(connection, *conversation, query, |message| {
                if let Some(score) = score(&message.text(), &message.role, None) {
                    found.push((IndexedRow::Message(message.id.0), score));
                }
                Ok(true)
            })?;
        }
        if query.target != SearchTarget::Messages {
            read::for_each_summary_in(connection, *conversation, query, |summary| {
                if let Some(score) = score(&summary.content, SUMMARY_ROLE, None) {
                    found.push((IndexedRow::Summary(summary.row_id.0), score));
                }
                Ok(true)
            })?;
        }
    }
    Ok(found)
}

/// Where `pattern` matches a message: a snippet of its own text (`text`), else of the first
/// blob it references that matches (named as the file) while `budget` (bytes of blob text
/// read by this search) lasts. `None` when it matches neither.
fn message_match(
    connection: &Connection,
    message: &StoredMessage,
    text: &str,
    marks: Marks,
    budget: &mut usize,
) -> Result<Option<(String, Option<String>)>> {
    if let Some(snippet) = snippet_of_match(text, marks) {
        return Ok(Some((snippet, None)));
    }
    if !message.json.contains(BLOB_ID_KEY) {
        return Ok(None);
    }
    for blob in blobs::of_message(connection, message.id.0)? {
        if *budget == 0 {
            tracing::warn!(
                message = message.id.0,
                "the search read its budget of large content; later blobs are not searched"
            );
            break;
        }
        let Some(content) = blobs::content(connection, &blob)? else {
            continue;
        };
        *budget = budget.saturating_sub(content.len());
        if let Some(snippet) = snippet_of_match(&content, marks) {
            return Ok(Some((snippet, Some(blob))));
        }
    }
    Ok(None)
}

fn regex_search(connection: &Connection, query: &SearchQuery) -> Result<Vec<SearchHit>> {
    let pattern = query_regex(query)?;
    let mut hits = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    let want_messages = query.target != SearchTarget::Summaries;
    let want_summaries = query.target != SearchTarget::Messages;
    for conversation in &query.conversations {
        if want_messages {
            // Rows on damaged pages are skipped (and counted in the log), as text search does.
            read::for_each_message_in(connection, *conversation, query, |message| {
                let text = message.text();
                let marks = Marks::Pattern(&pattern);
                if let Some((snippet, file)) =
                    message_match(connection, &message, &text, marks, &mut budget)?
                {
                    hits.push(message_hit(message, 0.0, snippet, file));
                }
                Ok(hits.len() < query.limit)
            })?;
        }
        if want_summaries && hits.len() < query.limit {
            read::for_each_summary_in(connection, *conversation, query, |summary| {
                if pattern.is_match(&summary.content) {
                    hits.push(summary_hit(summary, 0.0, Marks::Pattern(&pattern)));
                }
                Ok(hits.len() < query.limit)
            })?;
        }
    }
    // Newest first across conversations and kinds, then cut to the limit.
    hits.sort_by_key(|hit| std::cmp::Reverse(hit.time_ms));
    hits.truncate(query.limit);
    Ok(hits)
}
