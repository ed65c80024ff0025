//! Bootstrap: a session transcript imported from where the last import stopped.

use std::path::Path;

use serde_json::json;
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;
use vilvona_transcript::{Cursor, Entry, read_entries};

use crate::engine::LosslessEngine;
use crate::errors::store_error;

/// Key of the bootstrap cursor in the store's per-conversation state.
const BOOTSTRAP_CURSOR: &str = "bootstrap.cursor";

/// Messages imported per store transaction during bootstrap.
const BOOTSTRAP_BATCH: usize = 500;

/// Where the last bootstrap stopped: the transcript cursor and the place (count of messages
/// before it). A mark saved before places were kept is a bare cursor; its place is unknown.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct BootstrapMark {
    cursor: Cursor,
    place: Option<u64>,
}

impl Default for BootstrapMark {
    fn default() -> BootstrapMark {
        BootstrapMark {
            cursor: Cursor::default(),
            place: Some(0),
        }
    }
}

impl BootstrapMark {
    pub(crate) fn parse(text: &str) -> BootstrapMark {
        serde_json::from_str(text).unwrap_or_else(|_| BootstrapMark {
            cursor: serde_json::from_str(text).unwrap_or_default(),
            place: None,
        })
    }
}

impl std::fmt::Display for BootstrapMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&json!({"cursor": self.cursor, "place": self.place}).to_string())
    }
}

impl LosslessEngine {
    /// Imports a session transcript from where the last bootstrap stopped. Each message is
    /// identified by its entry id and its place among the transcript's messages, so what
    /// `commit_turn` or `assemble` already stored is recognised, not imported twice.
    async fn import_transcript(
        &self,
        conversation: &Conversation,
        path: &Path,
    ) -> Result<u64, EngineError> {
        let mark: BootstrapMark = self
            .inner
            .store
            .state(conversation.id, BOOTSTRAP_CURSOR)
            .await
            .map_err(|error| store_error("reading the bootstrap cursor", error))?
            .map_or_else(BootstrapMark::default, |text| BootstrapMark::parse(&text));
        let (cursor, first_place) = (mark.cursor, mark.place);
        // Read synchronously in a blocking task, then ingest in batches.
        let path = path.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            let mut batch: Vec<(String, AgentMessage)> = Vec::new();
            let mut end = cursor;
            let result = read_entries(&path, cursor, |located| {
                if let Entry::Message(entry) = located.entry {
                    batch.push((entry.id, entry.message));
                }
                end = located.end;
                Ok(())
            });
            result.map(|_| (batch, end))
        })
        .await
        .map_err(|error| EngineError::failed(format!("bootstrap reader: {error}")))?
        .map_err(|error| EngineError::caused_by("lossless bootstrap", error))?;
        let (entries, end) = read;
        let mut imported = 0;
        for (chunk_index, chunk) in entries.chunks(BOOTSTRAP_BATCH).enumerate() {
            let messages: Vec<AgentMessage> =
                chunk.iter().map(|(_, message)| message.clone()).collect();
            let chunk_start = (chunk_index * BOOTSTRAP_BATCH) as u64;
            let prepared = self
                .prepare(conversation.id, &messages, |index| MessageIdentity {
                    entry_id: Some(chunk[index].0.clone()),
                    turn: None,
                    place: first_place.map(|first| first + chunk_start + index as u64),
                })
                .await?;
            imported += self
                .inner
                .store
                .ingest(conversation.id, prepared, None)
                .await
                .map_err(|error| store_error("bootstrap ingest", error))?
                .newly_stored();
        }
        if end != cursor {
            let mark = BootstrapMark {
                cursor: end,
                place: first_place.map(|first| first + entries.len() as u64),
            };
            self.inner
                .store
                .set_state(conversation.id, BOOTSTRAP_CURSOR, &mark.to_string())
                .await
                .map_err(|error| store_error("saving the bootstrap cursor", error))?;
        }
        Ok(imported)
    }

    pub(crate) async fn bootstrap_session(
        &self,
        params: &BootstrapParams,
    ) -> Result<BootstrapResult, EngineError> {
        let Some(file) = params.session_file.as_deref() else {
            return Ok(BootstrapResult {
                bootstrapped: false,
                imported_messages: None,
                reason: Some("no session transcript".to_owned()),
            });
        };
        let path = Path::new(file);
        if !path.exists() {
            return Ok(BootstrapResult {
                bootstrapped: false,
                imported_messages: None,
                reason: Some(format!("{file} does not exist")),
            });
        }
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let imported = self.import_transcript(&conversation, path).await?;
        Ok(BootstrapResult {
            bootstrapped: true,
            imported_messages: Some(imported),
            reason: None,
        })
    }
}
