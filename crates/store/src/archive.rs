//! What both backends check of a [`SessionArchive`] before and after an import: that it can be
//! imported at all (before any row is written), and where an import's own export differs from
//! its file. Each backend's `archive` module reads and writes the rows.

use vilvona_core::archive::{ArchivedMessage, SessionArchive};

use crate::error::{Result, StoreError};
use crate::types::{parse_kind, parse_level};

/// Why an archive cannot be imported here, named for the operator.
pub(crate) fn refused(detail: String) -> StoreError {
    StoreError::ImportRefused(detail)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

/// Everything about an archive that can be checked without a store, before any row is
/// written (both backends): returns the messages' ingest keys, decoded, in order.
pub(crate) fn check(archive: &SessionArchive) -> Result<Vec<Vec<u8>>> {
    let session = &archive.session;
    let mut seqs = std::collections::HashSet::new();
    let mut keys = Vec::with_capacity(archive.messages.len());
    for message in &archive.messages {
        let Some(key) = unhex(&message.ingest_key) else {
            return Err(refused(format!(
                "message {}: its ingest key {:?} is not hex",
                message.seq, message.ingest_key
            )));
        };
        if message.seq >= session.next_seq {
            return Err(refused(format!(
                "message {} is numbered past the session's next seq {}",
                message.seq, session.next_seq
            )));
        }
        if !seqs.insert(message.seq) {
            return Err(refused(format!("message {} appears twice", message.seq)));
        }
        keys.push(key);
    }
    let mut summary_ids = std::collections::HashSet::new();
    for summary in &archive.summaries {
        let owner = format!("summary {}", summary.summary_id);
        parse_kind(&summary.kind)
            .map_err(|_| refused(format!("{owner}: kind {:?}", summary.kind)))?;
        parse_level(&summary.level)
            .map_err(|_| refused(format!("{owner}: level {:?}", summary.level)))?;
        if !summary_ids.insert(summary.summary_id.as_str()) {
            return Err(refused(format!("{owner} appears twice")));
        }
    }
    for (at, item) in archive.context.iter().enumerate() {
        if item.position >= session.next_position {
            return Err(refused(format!(
                "context item {at} sits at position {}, past the session's next position {}",
                item.position, session.next_position
            )));
        }
    }
    Ok(keys)
}

/// Where two archives first differ, named by part (`None` when equal).
pub(crate) fn first_difference(a: &SessionArchive, b: &SessionArchive) -> Option<String> {
    fn first<T: PartialEq>(name: &str, a: &[T], b: &[T]) -> Option<String> {
        (0..a.len().max(b.len()))
            .find(|at| a.get(*at) != b.get(*at))
            .map(|at| format!("{name}, from number {} on", at + 1))
    }
    if a.session != b.session {
        return Some("the session's fields".to_owned());
    }
    // A message's origin is the store it came from: a new store gives it a new id.
    let without_origin = |messages: &[ArchivedMessage]| -> Vec<ArchivedMessage> {
        messages
            .iter()
            .map(|message| ArchivedMessage {
                origin_id: None,
                ..message.clone()
            })
            .collect()
    };
    first(
        "messages",
        &without_origin(&a.messages),
        &without_origin(&b.messages),
    )
    .or_else(|| first("stored files", &a.blobs, &b.blobs))
    .or_else(|| first("summaries", &a.summaries, &b.summaries))
    .or_else(|| first("context items", &a.context, &b.context))
    .or_else(|| first("turns", &a.turns, &b.turns))
    .or_else(|| (a.state != b.state).then(|| "the session's state values".to_owned()))
}
