//! Searches: BM25 and phrase queries through the index, linear-time regex over SQLite, and
//! snippets built from the SQLite text.

use regex::{Regex, RegexBuilder};
use rusqlite::Connection;

use crate::blobs::{self, BLOB_ID_KEY};
use crate::error::{Result, StoreError};
use crate::highlight::{Marks, QueryWords, snippet, snippet_of_match};
use crate::index::{IndexRow, IndexedRow, RecallIndex, Watermark, key_of};
use crate::tokenize::{Terms, Word, words};
use crate::types::*;
use crate::{SUMMARY_ROLE, read};
use vilvona_embed::Embedder;

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
        rows.extend(rows_after(connection, query, through, |_| true, &nearness)?);
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

/// How near a row read from the database (one the index does not hold) is to the query,
/// embedded as it is read (a local model's work: see `meaning_rows`).
pub(crate) fn row_nearness<'a>(
    embedder: &'a dyn Embedder,
    query: &'a vilvona_embed::QueryVector,
) -> impl Fn(&str, &str) -> Option<f32> + 'a {
    move |text, role| {
        let chunks = embedder
            .embed_texts(&[(text, vilvona_embed::chunks_for(role))])
            .ok()?
            .pop()?;
        vilvona_embed::nearness(&chunks, query)
    }
}

/// A hybrid search's meaning list, or none (text search alone) when the model could not embed
/// the query.
pub(crate) fn without_unavailable_model<T: Default>(list: Result<T>) -> Result<T> {
    match list {
        Err(StoreError::Embedding(error)) => {
            tracing::warn!(%error, "searching by words alone");
            Ok(T::default())
        }
        other => other,
    }
}

/// A hybrid search's lists are read deeper than its limit, so that a row ranked just below the
/// limit in both can still win.
pub(crate) fn widened(query: &SearchQuery, mode: SearchMode) -> SearchQuery {
    SearchQuery {
        mode,
        order: SearchOrder::Relevance,
        limit: (query.limit * HYBRID_DEPTH).clamp(MIN_HYBRID_ROWS, MAX_HYBRID_ROWS),
        ..query.clone()
    }
}

/// How much deeper than its limit a hybrid search reads each list.
const HYBRID_DEPTH: usize = 3;
/// The least deep a hybrid search reads each list.
const MIN_HYBRID_ROWS: usize = 60;
/// The deepest a hybrid search reads each list.
const MAX_HYBRID_ROWS: usize = 150;
/// Reciprocal rank fusion's constant: how much the first ranks count more than later ones.
const FUSION_K: f32 = 60.0;

/// The least BM25 score of a text hit that counts in a hybrid search (a word in most rows of
/// the scope scores well under it; one in a few rows, well over).
const MIN_TEXT_SCORE: f32 = 1.0;

/// Text search's first hits that hybrid search always returns: reciprocal rank fusion favours
/// a row both lists hold, which can push an exact match of the query's words (text's first
/// hit, in no meaning list) below rows that half-match both ways.
const TEXT_LEADERS_KEPT: usize = 3;

/// Reciprocal rank fusion of the text and the meaning rows: a row's score is the sum over the
/// lists it is in of `1 / (FUSION_K + rank)`; a text row that scored under [`MIN_TEXT_SCORE`]
/// does not vote. Text search's first [`TEXT_LEADERS_KEPT`] rows are always among the
/// results. Best first (equal scores: the newest row first); at most `limit`.
pub(crate) fn fuse(
    text: &[(IndexedRow, f32)],
    meaning: &[(IndexedRow, f32)],
    limit: usize,
) -> Vec<(IndexedRow, f32)> {
    // A text hit that matched only words found nearly everywhere ("the", "what") says
    // nothing.
    let text: Vec<IndexedRow> = text
        .iter()
        .filter(|(_, score)| *score >= MIN_TEXT_SCORE)
        .map(|(row, _)| *row)
        .collect();
    let leaders = &text[..text.len().min(TEXT_LEADERS_KEPT)];
    let mut fused: Vec<(IndexedRow, f32)> = Vec::with_capacity(text.len() + meaning.len());
    let mut at: std::collections::HashMap<IndexedRow, usize> = std::collections::HashMap::new();
    let meaning = meaning.iter().map(|(row, _)| *row);
    for list in [
        Box::new(text.iter().copied()) as Box<dyn Iterator<Item = IndexedRow>>,
        Box::new(meaning),
    ] {
        for (rank, row) in list.enumerate() {
            let share = 1.0 / (FUSION_K + rank as f32 + 1.0);
            match at.get(&row) {
                Some(index) => fused[*index].1 += share,
                None => {
                    at.insert(row, fused.len());
                    fused.push((row, share));
                }
            }
        }
    }
    fused.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| key_of(b.0).cmp(&key_of(a.0)))
    });
    // Room for the leaders first; the other rows fill the rest in fused order.
    let room = limit.saturating_sub(leaders.len());
    let mut others = 0;
    fused.retain(|(row, _)| {
        leaders.contains(row) || {
            others += 1;
            others <= room
        }
    });
    fused.truncate(limit);
    fused
}

/// [`fuse`] for lists of hits (their snippets made already): the fused hits, each with its
/// fused score and the text search's snippet when both lists hold it; newest first for
/// recency.
pub(crate) fn fuse_hits(
    text: Vec<SearchHit>,
    meaning: Vec<SearchHit>,
    query: &SearchQuery,
) -> Vec<SearchHit> {
    let row_of = |hit: &SearchHit| match &hit.source {
        HitSource::Message { id, .. } => IndexedRow::Message(id.0),
        HitSource::Summary { row_id, .. } => IndexedRow::Summary(row_id.0),
    };
    let ranked = |hits: &[SearchHit]| -> Vec<(IndexedRow, f32)> {
        hits.iter().map(|hit| (row_of(hit), hit.score)).collect()
    };
    let fused = fuse(&ranked(&text), &ranked(&meaning), query.limit);
    let mut by_row: std::collections::HashMap<IndexedRow, SearchHit> =
        std::collections::HashMap::new();
    // Meaning first, so that text's hit (its snippet is where the words are) replaces it.
    for hit in meaning.into_iter().chain(text) {
        by_row.insert(row_of(&hit), hit);
    }
    let mut hits: Vec<SearchHit> = fused
        .into_iter()
        .filter_map(|(row, score)| by_row.remove(&row).map(|hit| SearchHit { score, ..hit }))
        .collect();
    if query.order == SearchOrder::Recency {
        hits.sort_by_key(|hit| std::cmp::Reverse(hit.time_ms));
    }
    hits
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
    let all_terms: Vec<String> = query_words
        .iter()
        .flat_map(|word| word.terms.clone())
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
    rows_after(connection, query, through, screen, |text, _| {
        match_share(query.mode, text, query_words).map(|share| best * share)
    })
}

/// Rows beyond the watermark in the query's scope (its agent, conversations, times and
/// target), with the score `score` gives their text and role (none: not a match); a message
/// is read only when `screen` passes its JSON. Rows that cannot be decoded are skipped
/// (doctor names them).
fn rows_after(
    connection: &Connection,
    query: &SearchQuery,
    through: Watermark,
    screen: impl Fn(&str) -> bool + Sync,
    score: impl Fn(&str, &str) -> Option<f32>,
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
            && let Some(score) = score(doc.text, doc.role)
        {
            found.push((doc.row, score));
        }
        Ok(())
    };
    if query.target != SearchTarget::Summaries {
        read::for_each_message_after_where(connection, through.messages, screen, &mut consider)?;
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
    archived_rows(connection, query, |text, _| {
        match_share(query.mode, text, query_words).map(|share| best * share)
    })
}

/// Rows of archived conversations in the query's scope, with the score `score` gives their
/// text and role (none: not a match).
fn archived_rows(
    connection: &Connection,
    query: &SearchQuery,
    score: impl Fn(&str, &str) -> Option<f32>,
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
                if let Some(score) = score(&message.text(), &message.role) {
                    found.push((IndexedRow::Message(message.id.0), score));
                }
                Ok(true)
            })?;
        }
        if query.target != SearchTarget::Messages {
            read::for_each_summary_in(connection, *conversation, query, |summary| {
                if let Some(score) = score(&summary.content, SUMMARY_ROLE) {
                    found.push((IndexedRow::Summary(summary.row_id.0), score));
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
