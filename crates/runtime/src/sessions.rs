//! `sessions.json`: session key → session id, transcript, compaction count, token counters.
//! Written atomically (temporary file, then rename) under a lock shared by every process.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The session index of a state directory, shared by every process that opens it: each
/// change is a read-modify-write under an exclusive lock on `sessions.json.lock`, written to a
/// temporary file of its own and renamed over `sessions.json`, so no record is lost and no
/// reader ever sees a torn file. Reads re-read the file, so they see other processes' records.
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
        Ok(SessionStore {
            records: read_records(&path)?,
            path,
            sessions_dir: state_dir.join("sessions"),
        })
    }

    /// The record for a key, as the file holds it now.
    pub fn get(&mut self, session_key: &str) -> Result<Option<&SessionRecord>, SessionStoreError> {
        self.records = read_records(&self.path)?;
        Ok(self.records.get(session_key))
    }

    /// Every record, as the file holds them now.
    pub fn records(&mut self) -> Result<&BTreeMap<String, SessionRecord>, SessionStoreError> {
        self.records = read_records(&self.path)?;
        Ok(&self.records)
    }

    /// The record for a key, creating one (and naming its transcript) on first use. When two
    /// processes create the same key at once, both get the first one's record.
    pub fn get_or_create(
        &mut self,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, SessionStoreError> {
        let sessions_dir = self.sessions_dir.clone();
        self.modify(|records| {
            records
                .entry(session_key.to_owned())
                .or_insert_with(|| SessionRecord {
                    session_id: session_id.to_owned(),
                    session_file: sessions_dir.join(format!("{}.jsonl", file_safe(session_id))),
                    updated_at_ms: vilvona_core::clock::now_ms(),
                    ..SessionRecord::default()
                })
                .clone()
        })
    }

    /// Removes a record (a forgotten session); returns it.
    pub fn remove(
        &mut self,
        session_key: &str,
    ) -> Result<Option<SessionRecord>, SessionStoreError> {
        self.modify(|records| records.remove(session_key))
    }

    /// Applies `change` to a record and saves.
    pub fn update(
        &mut self,
        session_key: &str,
        change: impl FnOnce(&mut SessionRecord),
    ) -> Result<(), SessionStoreError> {
        self.modify(|records| {
            if let Some(record) = records.get_mut(session_key) {
                change(record);
                record.updated_at_ms = vilvona_core::clock::now_ms();
            }
        })
    }

    /// Read-modify-write under the lock; the file is replaced only when something changed.
    fn modify<T>(
        &mut self,
        change: impl FnOnce(&mut BTreeMap<String, SessionRecord>) -> T,
    ) -> Result<T, SessionStoreError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| SessionStoreError::Io { path, source }
        };
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let lock_path = self.path.with_extension("json.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        lock.lock().map_err(io(&lock_path))?;
        let before = read_records(&self.path)?;
        let mut records = before.clone();
        let result = change(&mut records);
        if records != before {
            let text = serde_json::to_string_pretty(&records).map_err(|source| {
                SessionStoreError::Json {
                    path: self.path.clone(),
                    source,
                }
            })?;
            let temporary = self.path.with_extension(format!(
                "json.{}.{}.tmp",
                std::process::id(),
                NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(&temporary)
                .and_then(|mut file| std::io::Write::write_all(&mut file, text.as_bytes()))
                .map_err(io(&temporary))?;
            if let Err(source) = std::fs::rename(&temporary, &self.path) {
                let _ = std::fs::remove_file(&temporary);
                return Err(SessionStoreError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        }
        self.records = records;
        drop(lock);
        Ok(result)
    }
}

/// Distinguishes temporary files of one process.
static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

fn read_records(path: &Path) -> Result<BTreeMap<String, SessionRecord>, SessionStoreError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|source| SessionStoreError::Json {
            path: path.to_owned(),
            source,
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(SessionStoreError::Io {
            path: path.to_owned(),
            source,
        }),
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
