//! `sessions.json`: session key → session id, transcript, compaction count, token counters.
//! Written atomically (temporary file, then rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One session's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    pub session_id: String,
    /// The transcript file, absolute.
    pub session_file: PathBuf,
    #[serde(default)]
    pub compaction_count: u64,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default)]
    pub updated_at_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionStoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The session index of a state directory.
#[derive(Debug)]
pub struct SessionStore {
    path: PathBuf,
    sessions_dir: PathBuf,
    records: BTreeMap<String, SessionRecord>,
}

impl SessionStore {
    /// Loads `<state_dir>/sessions.json` (empty when missing).
    pub fn open(state_dir: &Path) -> Result<SessionStore, SessionStoreError> {
        let path = state_dir.join("sessions.json");
        let records = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|source| SessionStoreError::Json {
                path: path.clone(),
                source,
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(SessionStoreError::Io { path, source }),
        };
        Ok(SessionStore {
            path,
            sessions_dir: state_dir.join("sessions"),
            records,
        })
    }

    pub fn get(&self, session_key: &str) -> Option<&SessionRecord> {
        self.records.get(session_key)
    }

    pub fn records(&self) -> &BTreeMap<String, SessionRecord> {
        &self.records
    }

    /// The record for a key, creating one (and naming its transcript) on first use.
    pub fn get_or_create(
        &mut self,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, SessionStoreError> {
        if let Some(record) = self.records.get(session_key) {
            return Ok(record.clone());
        }
        let record = SessionRecord {
            session_id: session_id.to_owned(),
            session_file: self
                .sessions_dir
                .join(format!("{}.jsonl", file_safe(session_id))),
            ..SessionRecord::default()
        };
        self.records.insert(session_key.to_owned(), record.clone());
        self.save()?;
        Ok(record)
    }

    /// Applies `change` to a record and saves.
    pub fn update(
        &mut self,
        session_key: &str,
        change: impl FnOnce(&mut SessionRecord),
    ) -> Result<(), SessionStoreError> {
        if let Some(record) = self.records.get_mut(session_key) {
            change(record);
            record.updated_at_ms = now_ms();
            self.save()?;
        }
        Ok(())
    }

    fn save(&self) -> Result<(), SessionStoreError> {
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| SessionStoreError::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        let text = serde_json::to_string_pretty(&self.records).map_err(|source| {
            SessionStoreError::Json {
                path: self.path.clone(),
                source,
            }
        })?;
        let temporary = self.path.with_extension("json.tmp");
        std::fs::write(&temporary, text).map_err(|source| SessionStoreError::Io {
            path: temporary.clone(),
            source,
        })?;
        std::fs::rename(&temporary, &self.path).map_err(|source| SessionStoreError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// A session id as a file name: anything but letters, digits, `-`, `_` and `.` becomes `_`.
pub fn file_safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}
