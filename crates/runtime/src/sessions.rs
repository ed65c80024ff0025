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
    #[error(
        "{path} is damaged ({reason}); `vilvona doctor --fix` moves it aside and rebuilds it from the store and the transcripts"
    )]
    Damaged { path: PathBuf, reason: String },
    #[error(
        "a session id of {bytes} bytes is longer than the {MAX_SESSION_ID_BYTES} a session id may have"
    )]
    IdTooLong { bytes: usize },
    #[error("a session id may not be empty or hold control characters")]
    InvalidId,
}

/// The longest session id a state directory takes (OpenClaw's are 36-byte UUIDs).
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// Refuses a session id no transcript could be named after: too long, empty, or holding
/// control characters. Checked before anything is written.
pub fn check_session_id(id: &str) -> Result<(), SessionStoreError> {
    if id.len() > MAX_SESSION_ID_BYTES {
        return Err(SessionStoreError::IdTooLong { bytes: id.len() });
    }
    if id.is_empty() || id.chars().any(char::is_control) {
        return Err(SessionStoreError::InvalidId);
    }
    Ok(())
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
    /// The session index of `<state_dir>` (`sessions.json`; empty when missing). A damaged
    /// file does not stop the store from opening: reading it says so, and nothing writes over
    /// it until `doctor --fix` moved it aside.
    pub fn open(state_dir: &Path) -> SessionStore {
        let path = state_dir.join("sessions.json");
        let records = read_records(&path).unwrap_or_else(|error| {
            tracing::warn!(%error, "the session index cannot be read");
            BTreeMap::new()
        });
        SessionStore {
            records,
            path,
            sessions_dir: state_dir.join("sessions"),
        }
    }

    /// Whether `sessions.json` reads (missing counts as readable: no sessions yet).
    pub fn check(&self) -> Result<usize, SessionStoreError> {
        read_records(&self.path).map(|records| records.len())
    }

    /// Moves a damaged `sessions.json` aside (to `sessions.json.damaged-<ms>`) and writes one
    /// rebuilt from `records` (what the store and the transcripts hold). Answers where the old
    /// file went.
    pub fn replace_damaged(
        &mut self,
        records: BTreeMap<String, SessionRecord>,
    ) -> Result<PathBuf, SessionStoreError> {
        let aside = self
            .path
            .with_extension(format!("json.damaged-{}", vilvona_core::clock::now_ms()));
        std::fs::rename(&self.path, &aside).map_err(|source| SessionStoreError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.modify(|current| *current = records)?;
        Ok(aside)
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
    /// processes create the same key at once, both get the first one's record. A record whose
    /// transcript still has the name earlier versions gave it (which several ids could share)
    /// gets its own name: the file moves, unless another record names it too, then this record
    /// starts a transcript of its own.
    pub fn get_or_create(
        &mut self,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, SessionStoreError> {
        check_session_id(session_id)?;
        let sessions_dir = self.sessions_dir.clone();
        let mut moves = None;
        let record = self.modify(|records| {
            let named = sessions_dir.join(transcript_file_name(session_id));
            let shared_by_another = |records: &BTreeMap<String, SessionRecord>, file: &Path| {
                records
                    .iter()
                    .any(|(key, record)| key != session_key && record.session_file == file)
            };
            if let Some(record) = records.get(session_key)
                && record.session_file != named
                && record.session_file
                    == sessions_dir.join(format!("{}.jsonl", file_safe(&record.session_id)))
            {
                let old = record.session_file.clone();
                let shared = shared_by_another(records, &old);
                let named = sessions_dir.join(transcript_file_name(&record.session_id));
                if !shared {
                    moves = Some((old, named.clone()));
                }
                if let Some(record) = records.get_mut(session_key) {
                    record.session_file = named;
                }
            }
            records
                .entry(session_key.to_owned())
                .or_insert_with(|| SessionRecord {
                    session_id: session_id.to_owned(),
                    session_file: named,
                    updated_at_ms: vilvona_core::clock::now_ms(),
                    ..SessionRecord::default()
                })
                .clone()
        })?;
        if let Some((from, to)) = moves
            && from.exists()
            && !to.exists()
        {
            std::fs::rename(&from, &to)
                .map_err(|source| SessionStoreError::Io { path: from, source })?;
        }
        Ok(record)
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
            let text = serde_json::to_string_pretty(&records).map_err(|error| {
                SessionStoreError::Damaged {
                    path: self.path.clone(),
                    reason: error.to_string(),
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
    let damaged = |reason: String| SessionStoreError::Damaged {
        path: path.to_owned(),
        reason,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|error| damaged(error.to_string())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(error) if error.kind() == std::io::ErrorKind::InvalidData => {
            Err(damaged("not UTF-8".to_owned()))
        }
        Err(source) => Err(SessionStoreError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The transcript file of a session id: the id with every byte outside letters, digits, `-`,
/// `_` and `.` escaped as `%XX` (so no two ids share a name), and `.jsonl`; an id whose escaped
/// form would make too long a file name keeps its first 160 bytes and ends in `~` and a hash of
/// the whole id (`~` is always escaped, so such a name cannot be an escaped id's).
pub fn transcript_file_name(id: &str) -> String {
    let mut escaped = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'_')
            || (byte == b'.' && !escaped.is_empty())
        {
            escaped.push(char::from(byte));
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    if escaped.len() > 200 {
        let mut cut = 160;
        // Not inside an escape.
        while escaped.as_bytes()[cut - 1] == b'%' || escaped.as_bytes()[cut - 2] == b'%' {
            cut -= 1;
        }
        escaped.truncate(cut);
        escaped.push('~');
        escaped.push_str(&blake3::hash(id.as_bytes()).to_hex()[..24]);
    }
    escaped.push_str(".jsonl");
    escaped
}

/// The name earlier versions gave a session's transcript: anything but letters, digits, `-`,
/// `_` and `.` became `_` (so `a/b`, `a:b` and `a_b` shared one). Kept to find such files and
/// give them their own name.
fn file_safe(id: &str) -> String {
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
