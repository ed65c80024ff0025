//! A document's facts: its key and what a scope checks (conversation, kind, time), read from
//! a segment's fast-field columns.
//!
//! Opening a column looks it up by name in the segment's column directory; a text search did
//! that for four columns of every segment at every search, 45 % of `top::best`'s samples at
//! T = 1,000 (a profile of `workload --generate 1000`). A segment never changes (its
//! deletions are kept apart), so its columns are opened once and kept while the searcher has
//! it ([`FactCache`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tantivy::fastfield::Column;
use tantivy::index::SegmentId;
use tantivy::{DocId, Searcher, SegmentReader};

/// The columns a segment's facts are read from.
pub(super) struct FactColumns {
    keys: Column<u64>,
    conversations: Column<u64>,
    kinds: Column<u64>,
    times: Column<i64>,
}

impl FactColumns {
    fn open(segment: &SegmentReader) -> tantivy::Result<FactColumns> {
        let fast = segment.fast_fields();
        Ok(FactColumns {
            keys: fast.u64("key")?,
            conversations: fast.u64("conversation")?,
            kinds: fast.u64("kind")?,
            times: fast.i64("time")?,
        })
    }

    /// A document's facts, all read.
    pub(super) fn of(&self, doc: DocId) -> Facts {
        Facts::read(
            self.keys.first(doc),
            self.conversations.first(doc),
            self.kinds.first(doc),
            self.times.first(doc),
        )
    }

    /// A document's key, if a search may find it in `scope` (its kind and time read only when
    /// the scope limits them).
    pub(super) fn in_scope(&self, doc: DocId, scope: &Scope) -> Option<u64> {
        scope
            .admits(
                self.conversations.first(doc),
                || self.kinds.first(doc),
                || self.times.first(doc),
            )
            .then(|| self.keys.first(doc))?
    }
}

/// A document's facts, in 32 bytes (the vectors held for a segment keep one for every
/// document).
#[derive(Clone, Copy)]
pub(super) struct Facts {
    key: u64,
    conversation: u64,
    time: i64,
    /// The row's kind; a kind past `u32::MAX` (the index writes 0 and 1, and a scope asks
    /// for nothing else) reads as none.
    kind: u32,
    /// Which of the values the document has (`HAS_…`).
    has: u8,
}

/// The document has a key and a conversation (without both it is never found).
const HAS_KEY: u8 = 1;
const HAS_KIND: u8 = 2;
const HAS_TIME: u8 = 4;

impl Facts {
    fn read(
        key: Option<u64>,
        conversation: Option<u64>,
        kind: Option<u64>,
        time: Option<i64>,
    ) -> Facts {
        let kind = kind.and_then(|kind| u32::try_from(kind).ok());
        let found = key.zip(conversation);
        Facts {
            key: found.map_or(0, |(key, _)| key),
            conversation: found.map_or(0, |(_, conversation)| conversation),
            time: time.unwrap_or(0),
            kind: kind.unwrap_or(0),
            has: u8::from(found.is_some()) * HAS_KEY
                + u8::from(kind.is_some()) * HAS_KIND
                + u8::from(time.is_some()) * HAS_TIME,
        }
    }

    /// Its key, if a search may find it in `scope`.
    pub(super) fn in_scope(&self, scope: &Scope) -> Option<u64> {
        let has = |bit| self.has & bit != 0;
        (has(HAS_KEY)
            && scope.admits(
                Some(self.conversation),
                || has(HAS_KIND).then_some(u64::from(self.kind)),
                || has(HAS_TIME).then_some(self.time),
            ))
        .then_some(self.key)
    }
}

/// Segments' fact columns, opened once each and dropped when the searcher no longer has
/// their segment.
#[derive(Default)]
pub(super) struct FactCache(Mutex<HashMap<SegmentId, Arc<FactColumns>>>);

impl FactCache {
    /// The columns of each of `searcher`'s segments, in its order.
    pub(super) fn of_segments(
        &self,
        searcher: &Searcher,
    ) -> tantivy::Result<Vec<Arc<FactColumns>>> {
        let mut open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let columns = searcher
            .segment_readers()
            .iter()
            .map(|segment| {
                let id = segment.segment_id();
                if let Some(columns) = open.get(&id) {
                    return Ok(columns.clone());
                }
                let columns = Arc::new(FactColumns::open(segment)?);
                open.insert(id, columns.clone());
                Ok(columns)
            })
            .collect::<tantivy::Result<Vec<_>>>()?;
        if open.len() > columns.len() {
            let live = super::segment_ids(searcher);
            open.retain(|id, _| live.contains(id));
        }
        Ok(columns)
    }

    /// The segments whose columns are open.
    #[cfg(test)]
    pub(super) fn open_segments(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Which documents count: fast-field values, checked for each candidate.
pub(super) struct Scope<'a> {
    /// Sorted.
    pub(super) conversations: &'a [u64],
    pub(super) kind: Option<u64>,
    pub(super) since_ms: Option<i64>,
    pub(super) before_ms: Option<i64>,
}

impl Scope<'_> {
    /// Whether a document of these values is in the scope (its kind and time asked for only
    /// when the scope limits them).
    pub(super) fn admits(
        &self,
        conversation: Option<u64>,
        kind: impl FnOnce() -> Option<u64>,
        time: impl FnOnce() -> Option<i64>,
    ) -> bool {
        conversation.is_some_and(|value| self.conversations.binary_search(&value).is_ok())
            && self.kind.is_none_or(|wanted| kind() == Some(wanted))
            && (self.since_ms.is_none() && self.before_ms.is_none()
                || time().is_some_and(|time| {
                    self.since_ms.is_none_or(|since| time >= since)
                        && self.before_ms.is_none_or(|before| time < before)
                }))
    }
}
