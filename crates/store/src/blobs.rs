//! Large content: stored once by content hash, referenced by the messages that carry it.
//!
//! A message whose large text moved to a blob keeps a text block with the reference and the
//! blob id under [`BLOB_ID_KEY`]. Each backend records every such reference
//! (`blob_references`), which is what scopes a blob — any conversation whose messages
//! reference it may read it — and what lets the index hold the blob's words under the message
//! that references it (SQLite's rows: `crate::sqlite::blobs`).

use vilvona_core::message::{AgentMessage, ContentBlock, MessageContent};

/// The key, in a text block's extra fields, of the blob its text moved to.
pub const BLOB_ID_KEY: &str = "vilvonaBlobId";

/// At most this many bytes of one blob's text are indexed (its words beyond stay findable by
/// regex, which reads the whole blob).
pub(crate) const INDEXED_BLOB_BYTES: usize = 64 * 1024 * 1024;

/// The blob ids a message references, in order, without repeats.
pub fn referenced_blobs(message: &AgentMessage) -> Vec<String> {
    let content = match message {
        AgentMessage::User(user) => &user.content,
        AgentMessage::ToolResult(result) => &result.content,
        _ => return Vec::new(),
    };
    let MessageContent::Blocks(blocks) = content else {
        return Vec::new();
    };
    let mut ids: Vec<String> = Vec::new();
    for block in blocks {
        if let ContentBlock::Text(text) = block
            && let Some(id) = text.extra.get(BLOB_ID_KEY).and_then(|id| id.as_str())
            && !ids.iter().any(|known| known == id)
        {
            ids.push(id.to_owned());
        }
    }
    ids
}
