//! What both backends write alike: a message prepared for storage, the gaps between context
//! positions, and the keys rows are found by (a message's ingest key, a summary's content
//! address).

use crate::error::{Result, StoreError};
use crate::types::*;

pub(crate) fn prepare(message: NewMessage) -> Result<PreparedMessage> {
    let json = serde_json::to_string(&message.message).map_err(StoreError::Unserializable)?;
    if json.len() > MAX_MESSAGE_BYTES {
        return Err(StoreError::MessageTooLarge {
            bytes: json.len(),
            limit: MAX_MESSAGE_BYTES,
        });
    }
    let identity = &message.identity;
    // `domain\0part\0part…`: the entry form is the one every earlier store used.
    let keyed = |domain: &[u8], parts: &[&[u8]]| {
        let mut hasher = blake3::Hasher::new();
        hasher.update(domain);
        for (index, part) in parts.iter().enumerate() {
            if index > 0 {
                hasher.update(b"\0");
            }
            hasher.update(part);
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        key
    };
    let ingest_key = match (&identity.entry_id, &identity.turn) {
        (Some(entry_id), _) => Some(keyed(b"entry\0", &[entry_id.as_bytes()])),
        (None, Some((advancement_key, index))) => Some(keyed(
            b"turn\0",
            &[advancement_key.as_bytes(), &index.to_le_bytes()],
        )),
        (None, None) => None,
    };
    Ok(PreparedMessage {
        compressed: Vec::new(),
        blobs: crate::blobs::referenced_blobs(&message.message),
        role: message.message.role().to_owned(),
        text: message.message.plain_text(),
        tokens: message.tokens,
        created_at_ms: message
            .message
            .timestamp_ms()
            .unwrap_or_else(vilvona_core::clock::now_ms),
        ingest_key,
        place: identity.place,
        json,
    })
}

/// Gap between appended context positions: room to insert without renumbering.
pub(crate) const POSITION_STEP: i64 = 1024;

/// A message ready for the writer: serialized and keyed by the caller.
#[derive(Debug)]
pub(crate) struct PreparedMessage {
    pub(crate) json: String,
    /// `json`, compressed as SQLite stores it (done before the writer thread, across cores;
    /// empty for PostgreSQL).
    pub(crate) compressed: Vec<u8>,
    pub(crate) role: String,
    pub(crate) text: String,
    /// The blobs its text blocks moved to.
    pub(crate) blobs: Vec<String>,
    pub(crate) tokens: u64,
    /// The key of an identified message (entry id or turn slot); `None` for one that is only
    /// recognised by its place, or not at all.
    pub(crate) ingest_key: Option<[u8; 16]>,
    pub(crate) place: Option<u64>,
    pub(crate) created_at_ms: i64,
}

/// The key of a message that carries no identity of its own: unique by its sequence number.
pub(crate) fn sequence_key(conversation: ConversationId, seq: i64) -> [u8; 16] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"seq\0");
    hasher.update(&conversation.0.to_le_bytes());
    hasher.update(&seq.to_le_bytes());
    let mut key = [0u8; 16];
    key.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    key
}

pub(crate) fn hex16(bytes: &[u8]) -> String {
    bytes[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Content address of a summary: its conversation, shape, children and text.
pub(crate) fn summary_id(
    conversation: ConversationId,
    summary: &NewSummary,
    items: &[(i64, ItemRef)],
) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&conversation.0.to_le_bytes());
    hasher.update(&summary.depth.to_le_bytes());
    hasher.update(kind_str(summary.kind).as_bytes());
    for (_, item) in items {
        let (tag, id) = match item {
            ItemRef::Message(id) => (b'm', id.0),
            ItemRef::Summary(id) => (b's', id.0),
        };
        hasher.update(&[tag]);
        hasher.update(&id.to_le_bytes());
    }
    hasher.update(summary.content.as_bytes());
    format!("sum_{}", hex16(hasher.finalize().as_bytes()))
}
