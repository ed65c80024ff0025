use serde_json::json;
use tempfile::TempDir;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SummaryKind, SummaryLevel};
use vilvona_store::*;

pub(crate) async fn open(dir: &TempDir) -> Store {
    Store::open(StoreConfig::new(dir.path())).await.unwrap()
}

pub(crate) fn key(agent: &str, session: &str) -> ConversationKey {
    ConversationKey {
        agent_id: agent.to_owned(),
        session_id: session.to_owned(),
        session_key: Some(format!("agent:{agent}:{session}")),
    }
}

pub(crate) fn user(text: &str, timestamp: i64) -> AgentMessage {
    serde_json::from_value(json!({"role": "user", "content": text, "timestamp": timestamp}))
        .unwrap()
}

pub(crate) fn new_message(text: &str, timestamp: i64, entry_id: Option<&str>) -> NewMessage {
    NewMessage {
        message: user(text, timestamp),
        identity: MessageIdentity {
            entry_id: entry_id.map(str::to_owned),
            ..MessageIdentity::default()
        },
        tokens: (text.len() as u64).div_ceil(4) + 4,
    }
}

/// The same message, known to sit at `place` in its session.
pub(crate) fn placed(mut message: NewMessage, place: u64) -> NewMessage {
    message.identity.place = Some(place);
    message
}

pub(crate) fn stored(outcome: IngestOutcome) -> Vec<Ingested> {
    match outcome {
        IngestOutcome::Stored(results) => results,
        IngestOutcome::DuplicateTurn => panic!("unexpected duplicate turn"),
    }
}

pub(crate) fn leaf(content: &str) -> NewSummary {
    NewSummary {
        kind: SummaryKind::Leaf,
        depth: 0,
        content: content.to_owned(),
        tokens: (content.len() as u64).div_ceil(4),
        level: SummaryLevel::Normal,
        summarizer: "test/v1".to_owned(),
    }
}

/// A plan that replaces `range` (indexes into the current context) with a leaf.
pub(crate) fn plan(
    conversation: ConversationId,
    context: &[ContextItem],
    range: std::ops::Range<usize>,
    content: &str,
) -> ReplacePlan {
    ReplacePlan {
        conversation,
        items: context[range]
            .iter()
            .map(|item| (item.position, item.item_ref()))
            .collect(),
        summary: leaf(content),
    }
}

pub(crate) fn query(agent: &str, conversations: Vec<ConversationId>, text: &str) -> SearchQuery {
    SearchQuery {
        agent_id: agent.to_owned(),
        conversations,
        text: text.to_owned(),
        mode: SearchMode::Text,
        target: SearchTarget::Both,
        since_ms: None,
        before_ms: None,
        limit: 10,
        order: SearchOrder::Relevance,
    }
}

/// How each stored message row is compressed, in id order: `true` for a zstd frame.
pub(crate) fn zstd_rows(dir: &TempDir) -> Vec<bool> {
    let connection = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    let mut statement = connection
        .prepare("SELECT json FROM messages ORDER BY id")
        .unwrap();
    statement
        .query_map([], |row| row.get::<_, Vec<u8>>(0))
        .unwrap()
        .map(|bytes| bytes.unwrap().starts_with(&[0x28, 0xB5, 0x2F, 0xFD]))
        .collect()
}

/// How many compression dictionaries the store holds.
pub(crate) fn dictionaries(dir: &TempDir) -> i64 {
    rusqlite::Connection::open(dir.path().join(DATABASE_FILE))
        .unwrap()
        .query_row("SELECT count(*) FROM compression_dictionaries", [], |row| {
            row.get(0)
        })
        .unwrap()
}

/// The text of the `index`-th message of a long session (alike, as real messages are).
pub(crate) fn line(index: usize) -> String {
    format!(
        "step {index}: the deploy of service {} to region {} finished in {} seconds",
        index % 13,
        index % 5,
        index * 7 % 300
    )
}

/// The text of a conversation's first `count` messages, as stored.
pub(crate) async fn texts(store: &Store, conversation: ConversationId, count: u64) -> Vec<String> {
    store
        .messages_in_seq_range(conversation, 0, count - 1)
        .await
        .unwrap()
        .iter()
        .map(|message| {
            let message: vilvona_core::message::AgentMessage =
                serde_json::from_str(&message.json).unwrap();
            message.plain_text()
        })
        .collect()
}

/// An archive as a store that imported it exports it again: the same, but for its messages'
/// origins (their ids in the store that exported it; the importing store gives new ones).
pub(crate) fn without_origins(
    mut archive: vilvona_core::archive::SessionArchive,
) -> vilvona_core::archive::SessionArchive {
    for message in &mut archive.messages {
        message.origin_id = None;
    }
    archive
}
