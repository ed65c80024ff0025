//! Searches: BM25 and phrase queries through the index, linear-time regex over SQLite, and
//! snippets built from the SQLite text.

use regex::{Regex, RegexBuilder};
use rusqlite::Connection;

use crate::blobs::{self, BLOB_ID_KEY};
use crate::error::{Result, StoreError};
use crate::highlight::{Marks, QueryWords, snippet};
use crate::index::{IndexRow, IndexedRow, RecallIndex, Watermark, key_of};
use crate::read;
use crate::tokenize::{Terms, Word, words};
use crate::types::*;

/// Bound on the compiled size of a user regex.
pub(crate) const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Bytes of large content one search reads at most (to match a regex or place a snippet).
pub(crate) const REGEX_BLOB_BYTES: usize = 512 * 1024 * 1024;
/// Longest query, in bytes (any mode).
pub const MAX_QUERY_BYTES: usize = 4096;
/// Most words (a CJK run counts as one) in a text or phrase query.
pub const MAX_QUERY_WORDS: usize = 64;

/// Refuses a query over the bounds before any work is done for it.
pub(crate) fn check_bounds(query: &SearchQuery) -> Result<()> {
    let bytes = query.text.len();
    if bytes > MAX_QUERY_BYTES {
        return Err(StoreError::QueryTooLarge(format!(
            "the query is {bytes} bytes; at most {MAX_QUERY_BYTES} are allowed"
        )));
    }
    if query.mode != SearchMode::Regex {
        let count = words(&query.text).len();
        if count > MAX_QUERY_WORDS {
            return Err(StoreError::QueryTooLarge(format!(
                "the query has {count} words; at most {MAX_QUERY_WORDS} are allowed"
            )));
        }
    }
    Ok(())
}

pub(crate) fn run(
    connection: &Connection,
    index: Option<&RecallIndex>,
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
    };
    // In the same read: which summary covers each hit now.
    for hit in &mut hits {
        let item = match &hit.source {
            HitSource::Message { id, .. } => ItemRef::Message(*id),
            HitSource::Summary { row_id, .. } => ItemRef::Summary(*row_id),
        };
        hit.covered_by = read::top_ancestor_id(connection, item)?;
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
    let query_words = words(&query.text);
    if query_words.is_empty() {
        return Ok(Vec::new());
    }
    let query_marks = QueryWords::new(&query.text, &query_words);
    let marks = Marks::Words(&query_marks);
    let read_index = |index: &RecallIndex| -> Result<(Watermark, Vec<(IndexedRow, f32)>)> {
        crate::index::contained(|| {
            index.refresh()?;
            let through = index.searched_through();
            Ok((through, index.search(query)?))
        })
    };
    let (through, mut rows) = match index.map(|index| (index, read_index(index))) {
        Some((_, Ok(found))) => found,
        // The index is disposable: when it cannot be read, this search reads SQLite alone and
        // the index's maintainer rebuilds it.
        Some((index, Err(error))) => {
            tracing::warn!(%error, "the recall index could not be read; searching the database instead");
            index.mark_broken();
            (Watermark::default(), Vec::new())
        }
        None => (Watermark::default(), Vec::new()),
    };
    let best = rows.iter().map(|(_, score)| *score).fold(1.0_f32, f32::max);
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
    let mut hits = Vec::new();
    let mut budget = REGEX_BLOB_BYTES;
    for (row, score) in rows {
        let hit = match row {
            IndexedRow::Message(id) => match read::message(connection, MessageId(id))? {
                Some(message) => {
                    // The index matched: the snippet comes from where the words are.
                    let (snippet, file) = message_match(connection, &message, marks, &mut budget)?
                        .unwrap_or_else(|| (snippet(&message.text(), marks), None));
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

/// Rows beyond the watermark (the last moments of writes, in any process) that match the
/// query, scored relative to the best index score by the share of query terms they hold.
fn unindexed_matches(
    connection: &Connection,
    query: &SearchQuery,
    query_words: &[Word],
    through: Watermark,
    best: f32,
) -> Result<Vec<(IndexedRow, f32)>> {
    let mut found = Vec::new();
    let all_terms: Vec<String> = query_words
        .iter()
        .flat_map(|word| word.terms.clone())
        .collect();
    let in_scope = |conversation: i64, time_ms: i64| {
        query.conversations.contains(&ConversationId(conversation))
            && query.since_ms.is_none_or(|since| time_ms >= since)
            && query.before_ms.is_none_or(|before| time_ms < before)
    };
    let mut consider = |row: IndexRow| -> Result<()> {
        let doc = row.doc();
        if doc.agent != query.agent_id || !in_scope(doc.conversation, doc.time_ms) {
            return Ok(());
        }
        let score = match_share(query.mode, doc.text, query_words);
        if let Some(share) = score {
            found.push((doc.row, best * share));
        }
        Ok(())
    };
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
    if query.target != SearchTarget::Summaries {
        read::for_each_message_after_where(connection, through.messages, screen, &mut consider)?;
        // (Rows that cannot be decoded are skipped; doctor names them.)
    }
    if query.target != SearchTarget::Messages {
        read::for_each_summary_after(connection, through.summaries, &mut consider)?;
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
    let archived = read::archived_conversations(connection)?;
    let score = |text: &str| match_share(query.mode, text, query_words);
    let mut found = Vec::new();
    for conversation in &query.conversations {
        if !archived.contains(&conversation.0) {
            continue;
        }
        if query.target != SearchTarget::Summaries {
            // Rows on damaged pages are skipped (and counted in the log), as text search does.
            read::for_each_message_in(connection, *conversation, query, |message| {
                if let Some(share) = score(&message.text()) {
                    found.push((IndexedRow::Message(message.id.0), best * share));
                }
                Ok(true)
            })?;
        }
        if query.target != SearchTarget::Messages {
            read::for_each_summary_in(connection, *conversation, query, |summary| {
                if let Some(share) = score(&summary.content) {
                    found.push((IndexedRow::Summary(summary.row_id.0), best * share));
                }
                Ok(true)
            })?;
        }
    }
    Ok(found)
}

pub(crate) fn summary_hit(summary: StoredSummary, score: f32, marks: Marks) -> SearchHit {
    SearchHit {
        covered_by: None,
        file: None,
        snippet: snippet(&summary.content, marks),
        conversation: summary.conversation,
        time_ms: summary.latest_at_ms.unwrap_or(summary.created_at_ms),
        score,
        source: HitSource::Summary {
            row_id: summary.row_id,
            summary_id: summary.summary_id,
            depth: summary.depth,
            kind: summary.kind,
        },
    }
}

/// Where `pattern` matches a message: a snippet of its own text, else of the first blob it
/// references that matches (named as the file) while `budget` (bytes of blob text read by
/// this search) lasts. `None` when it matches neither.
fn message_match(
    connection: &Connection,
    message: &StoredMessage,
    marks: Marks,
    budget: &mut usize,
) -> Result<Option<(String, Option<String>)>> {
    let text = message.text();
    if marks.is_match(&text) {
        return Ok(Some((snippet(&text, marks), None)));
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
        if marks.is_match(&content) {
            return Ok(Some((snippet(&content, marks), Some(blob))));
        }
    }
    Ok(None)
}

pub(crate) fn message_hit(
    message: StoredMessage,
    score: f32,
    snippet: String,
    file: Option<String>,
) -> SearchHit {
    SearchHit {
        snippet,
        file,
        conversation: message.conversation,
        time_ms: message.created_at_ms,
        score,
        covered_by: None,
        source: HitSource::Message {
            id: message.id,
            seq: message.seq,
            role: message.role,
        },
    }
}

/// The query's regex, compiled within [`REGEX_SIZE_LIMIT`].
pub(crate) fn query_regex(query: &SearchQuery) -> Result<Regex> {
    RegexBuilder::new(&query.text)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|error| StoreError::InvalidRegex {
            pattern: query.text.clone(),
            detail: error.to_string(),
        })
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
                if let Some((snippet, file)) =
                    message_match(connection, &message, Marks::Pattern(&pattern), &mut budget)?
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

/// How well a row's text matches, as the index would: a phrase holds every term in order (1.0);
/// text holds the share of the query's words it has (a CJK run counts when whole). `None` when
/// it does not match.
pub(crate) fn match_share(mode: SearchMode, text: &str, words: &[Word]) -> Option<f32> {
    match mode {
        SearchMode::Phrase => {
            let all: Vec<String> = words.iter().flat_map(|word| word.terms.clone()).collect();
            holds_sequences(text, std::slice::from_ref(&all))[0].then_some(1.0)
        }
        _ => {
            let wanted: Vec<Vec<String>> = words.iter().map(|word| word.terms.clone()).collect();
            let matched = holds_sequences(text, &wanted)
                .into_iter()
                .filter(|held| *held)
                .count();
            (matched > 0).then(|| matched as f32 / words.len() as f32)
        }
    }
}

/// For each wanted sequence of terms, whether `text` holds it at consecutive positions. The
/// text's terms stream through a window as long as the longest sequence, so a 50 MB text is
/// never held as terms.
fn holds_sequences(text: &str, wanted: &[Vec<String>]) -> Vec<bool> {
    let mut held = vec![false; wanted.len()];
    let longest = wanted.iter().map(Vec::len).max().unwrap_or(0);
    if longest == 0 {
        return held;
    }
    let mut window: std::collections::VecDeque<String> =
        std::collections::VecDeque::with_capacity(longest);
    for term in Terms::new(text) {
        if window.len() == longest {
            window.pop_front();
        }
        window.push_back(term.text);
        for (sequence, found) in wanted.iter().zip(held.iter_mut()) {
            if !*found
                && sequence.len() <= window.len()
                && window
                    .iter()
                    .skip(window.len() - sequence.len())
                    .eq(sequence.iter())
            {
                *found = true;
            }
        }
        if held.iter().all(|found| *found) {
            break;
        }
    }
    held
}

pub(crate) fn floor_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}
