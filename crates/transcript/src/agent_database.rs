//! OpenClaw 2026.9's own record of a session: its agent database (`openclaw-agent.sqlite`,
//! the `storePath` of a turn's transcript anchors). A session's active transcript there is a
//! list of events (`session_transcript_active_events`, each pointing at a row of
//! `transcript_events` by `event_seq`); the messages among them are numbered from 0 by
//! `message_position`, the same numbering as a turn's `activeMessagePosition`. An event is
//! JSON (`event_json`) or a zstd frame of it (`event_zstd`); a message event carries the
//! message under `message`.
//!
//! Read only, by what the tables say (never written, never migrated): the engine's second
//! record of acknowledged turns when its own store lost some.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, params};
use serde_json::Value;
use vilvona_core::message::AgentMessage;

/// What went wrong reading an agent database, naming it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {detail}")]
pub struct AgentDatabaseError {
    path: PathBuf,
    detail: String,
}

/// The messages of session `session_id` at positions `from..to` of its active transcript, in
/// order. Fails unless every position in the range holds a message.
pub fn messages_at(
    path: &Path,
    session_id: &str,
    from: u64,
    to: u64,
) -> Result<Vec<AgentMessage>, AgentDatabaseError> {
    let failed = |detail: String| AgentDatabaseError {
        path: path.to_owned(),
        detail,
    };
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|error| failed(error.to_string()))?;
    connection
        .busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|error| failed(error.to_string()))?;
    let mut statement = connection
        .prepare(
            "SELECT active.message_position, event.event_json, event.event_zstd
             FROM session_transcript_active_events AS active
             JOIN transcript_events AS event
               ON event.session_id = active.session_id AND event.seq = active.event_seq
             WHERE active.session_id = ?1
               AND active.message_position >= ?2 AND active.message_position < ?3
             ORDER BY active.message_position",
        )
        .map_err(|error| failed(error.to_string()))?;
    let rows = statement
        .query_map(
            params![
                session_id,
                i64::try_from(from).unwrap_or(i64::MAX),
                i64::try_from(to).unwrap_or(i64::MAX)
            ],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, Option<Vec<u8>>>(2)?,
                ))
            },
        )
        .map_err(|error| failed(error.to_string()))?;
    let mut messages = Vec::new();
    for row in rows {
        let (position, json, compressed) = row.map_err(|error| failed(error.to_string()))?;
        let expected = from + messages.len() as u64;
        if u64::try_from(position).ok() != Some(expected) {
            return Err(failed(format!(
                "session {session_id} has no message at position {expected}"
            )));
        }
        let json = match (json, compressed) {
            (Some(json), _) => json,
            (None, Some(frame)) => zstd::decode_all(frame.as_slice())
                .map_err(|error| format!("event at message position {position}: {error}"))
                .and_then(|bytes| {
                    String::from_utf8(bytes).map_err(|error| {
                        format!("event at message position {position} is not UTF-8: {error}")
                    })
                })
                .map_err(failed)?,
            (None, None) => {
                return Err(failed(format!(
                    "the event at message position {position} is empty"
                )));
            }
        };
        let mut event: Value = serde_json::from_str(&json)
            .map_err(|error| failed(format!("event at message position {position}: {error}")))?;
        let message = serde_json::from_value(event["message"].take()).map_err(|error| {
            failed(format!(
                "event at message position {position} holds no message: {error}"
            ))
        })?;
        messages.push(message);
    }
    if messages.len() as u64 != to.saturating_sub(from) {
        return Err(failed(format!(
            "session {session_id} has no message at position {}",
            from + messages.len() as u64
        )));
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A session whose active transcript holds a user message (JSON), a model change (no
    /// message position) and an assistant message (a zstd frame).
    fn database(dir: &Path) -> PathBuf {
        let path = dir.join("openclaw-agent.sqlite");
        let connection = Connection::open(&path).unwrap();
        connection
            .execute_batch(
                "CREATE TABLE transcript_events (session_id TEXT, seq INTEGER, event_json TEXT, event_zstd BLOB);
                 CREATE TABLE session_transcript_active_events (session_id TEXT, active_position INTEGER,
                   event_seq INTEGER, message_position INTEGER);",
            )
            .unwrap();
        let user =
            r#"{"type":"message","message":{"role":"user","content":"the heron code is HR-7"}}"#;
        let change = r#"{"type":"model_change","provider":"mock"}"#;
        let answer = r#"{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"noted"}]}}"#;
        let frame = zstd::encode_all(answer.as_bytes(), 3).unwrap();
        for (seq, json, compressed, position) in [
            (1, Some(user), None, Some(0)),
            (2, Some(change), None, None),
            (3, None, Some(frame), Some(1)),
        ] {
            connection
                .execute(
                    "INSERT INTO transcript_events VALUES ('s', ?1, ?2, ?3)",
                    params![seq, json, compressed],
                )
                .unwrap();
            connection
                .execute(
                    "INSERT INTO session_transcript_active_events VALUES ('s', ?1, ?1, ?2)",
                    params![seq, position],
                )
                .unwrap();
        }
        path
    }

    #[test]
    fn messages_are_read_by_place_whether_json_or_compressed() {
        let dir = tempfile::tempdir().unwrap();
        let path = database(dir.path());
        let messages = messages_at(&path, "s", 0, 2).unwrap();
        let texts: Vec<String> = messages.iter().map(AgentMessage::plain_text).collect();
        assert_eq!(texts, ["the heron code is HR-7", "noted"]);
        assert_eq!(
            messages_at(&path, "s", 1, 2).unwrap()[0].role(),
            "assistant"
        );
    }

    #[test]
    fn a_place_without_a_message_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = database(dir.path());
        let error = messages_at(&path, "s", 1, 3).unwrap_err().to_string();
        assert!(error.contains("no message at position 2"), "{error}");
        let error = messages_at(&path, "other", 0, 1).unwrap_err().to_string();
        assert!(
            error.contains("session other has no message at position 0"),
            "{error}"
        );
        let missing = dir.path().join("none.sqlite");
        assert!(messages_at(&missing, "s", 0, 1).is_err());
    }
}
