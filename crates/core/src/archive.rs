//! A session's whole history as one portable file: what `vilvona export` writes and
//! `vilvona import` reads, to move a session between stores (or backends).
//!
//! # The file (format `vilvona-session`, version 1)
//!
//! JSON Lines, UTF-8, one record per line:
//!
//! 1. a header: `{"format":"vilvona-session","version":1,"exportedAtMs":…,"session":{…}}`;
//! 2. records, each an object with one key naming its kind — `message` (in `seq` order),
//!    `blob`, `summary` (every child before its parent), `context` (in position order),
//!    `turn` (an advancement key already committed) and `state` (a per-session value);
//! 3. a trailer: `{"end":{"records":N,"blake3":"…"}}`, counting the records of step 2 and
//!    hashing every byte before the trailer line. A file without it was cut short.
//!
//! Rows are identified by what stays true in any store: a message by its session and `seq`, a
//! summary by its public id (`sum_…`), a blob by its content id. Row ids are not carried; the
//! importing store assigns its own. A message's JSON is carried verbatim as a string, so the
//! bytes stored are the bytes ingested. Grants are not carried: they belong to live subagent
//! runs on one store.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// The format's name, in every header.
pub const ARCHIVE_FORMAT: &str = "vilvona-session";
/// The format version this build writes and reads.
pub const ARCHIVE_VERSION: u32 = 1;

/// One session's history, whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionArchive {
    /// The session and its counters.
    pub session: ArchivedSession,
    /// Every stored message, in `seq` order.
    pub messages: Vec<ArchivedMessage>,
    /// Stored files the messages reference or the session owns.
    pub blobs: Vec<ArchivedBlob>,
    /// Every summary of the session, each after its children.
    pub summaries: Vec<ArchivedSummary>,
    /// The context, in order.
    pub context: Vec<ArchivedItem>,
    /// Advancement keys of committed turns (a redelivered turn stays a duplicate).
    pub turns: Vec<ArchivedTurn>,
    /// Per-session state values (bootstrap progress and the like).
    pub state: BTreeMap<String, String>,
}

/// The session a history belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedSession {
    /// The agent.
    pub agent_id: String,
    /// The session id.
    pub session_id: String,
    /// The host's session key, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key: Option<String>,
    /// When retention archived it (its rows are then kept out of the recall index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived_at_ms: Option<i64>,
    /// When it was first stored.
    pub created_at_ms: i64,
    /// The `seq` the next message takes (forgotten messages keep their numbers).
    pub next_seq: u64,
    /// The position the next context item takes.
    pub next_position: i64,
    /// Messages forgotten so far.
    pub forgotten_messages: u64,
}

/// A stored message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedMessage {
    /// Its place in the session.
    pub seq: u64,
    /// Its role.
    pub role: String,
    /// The message JSON exactly as ingested.
    pub json: String,
    /// Its tokens, as counted at ingest.
    pub tokens: u64,
    /// The key that makes a redelivery of it a duplicate (hex).
    pub ingest_key: String,
    /// When it was stored.
    pub created_at_ms: i64,
    /// The stored files its text moved to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blobs: Vec<String>,
    /// Its id in the store it was exported from (`msg_<id>`): an import gives it a new one,
    /// and keeps this so that citations and notes naming the old one still resolve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_id: Option<i64>,
}

/// A stored file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedBlob {
    /// Its content id.
    pub blob_id: String,
    /// What it is (a tool output, a file).
    pub kind: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its lines.
    pub lines: u64,
    /// The short description shown in its place.
    pub description: String,
    /// Its text.
    pub content: String,
    /// When it was stored.
    pub created_at_ms: i64,
}

/// A summary, with its ordered children.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedSummary {
    /// Its public id (`sum_…`).
    pub summary_id: String,
    /// 0 for a leaf.
    pub depth: u32,
    /// `leaf` or `condensed`.
    pub kind: String,
    /// Its text.
    pub content: String,
    /// Its tokens.
    pub tokens: u64,
    /// When the earliest message below it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_at_ms: Option<i64>,
    /// When the latest message below it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_at_ms: Option<i64>,
    /// The first message below it.
    pub first_seq: u64,
    /// The last message below it.
    pub last_seq: u64,
    /// `normal`, `aggressive` or `fallback`.
    pub level: String,
    /// The summarizer and prompt version that wrote it.
    pub summarizer: String,
    /// When it was published.
    pub created_at_ms: i64,
    /// What it summarizes, in order.
    pub children: Vec<ArchivedRef>,
}

/// A message or summary, by the identity it keeps in any store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ArchivedRef {
    /// A message of this session, or (a context holding another session's message, as a
    /// subagent's does) of the named one, which must exist where the file is imported.
    Message {
        /// Its `seq`.
        seq: u64,
        /// The session that holds it, when not this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<SessionName>,
    },
    /// A summary, of this session or any other.
    Summary {
        /// Its public id.
        #[serde(rename = "summaryId")]
        summary_id: String,
    },
}

/// Names a session of a store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionName {
    /// The agent.
    pub agent_id: String,
    /// The session id.
    pub session_id: String,
}

/// One context item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedItem {
    /// Its position (gapped; only the order matters).
    pub position: i64,
    /// What it holds.
    pub item: ArchivedRef,
    /// Its tokens.
    pub tokens: u64,
}

/// A committed turn's advancement key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedTurn {
    /// The key.
    pub advancement_key: String,
    /// When the turn committed.
    pub committed_at_ms: i64,
}

/// What an import stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportReport {
    /// The session imported.
    pub session_id: String,
    /// Messages stored.
    pub messages: u64,
    /// Summaries stored.
    pub summaries: u64,
    /// Context items.
    pub context_items: u64,
    /// Stored files added (a file the store already held is not counted).
    pub blobs: u64,
    /// True when the store, read back, holds exactly what the file held.
    pub verified: bool,
}

/// Why a file could not be read as an archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Reading or writing failed.
    #[error("reading or writing the archive")]
    Io(#[from] std::io::Error),
    /// A line is not what the format allows there.
    #[error("line {line}: {detail}")]
    Malformed {
        /// 1-based.
        line: u64,
        /// What is wrong.
        detail: String,
    },
    /// The file is another format or a version this build does not read.
    #[error("not a {ARCHIVE_FORMAT} file of version {ARCHIVE_VERSION}: {0}")]
    Unsupported(String),
    /// The trailer is missing: the file was cut short.
    #[error("the file ends after line {0} without its end record: it was cut short")]
    Truncated(u64),
    /// The trailer does not match the lines before it.
    #[error("the file does not match its end record ({0}): it was changed or damaged")]
    Damaged(String),
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    format: String,
    version: u32,
    exported_at_ms: i64,
    session: ArchivedSession,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Record {
    Message(ArchivedMessage),
    Blob(ArchivedBlob),
    Summary(ArchivedSummary),
    Context(ArchivedItem),
    Turn(ArchivedTurn),
    State { key: String, value: String },
    End(End),
}

#[derive(Serialize, Deserialize)]
struct End {
    records: u64,
    blake3: String,
}

/// Counts and hashes the lines written through it.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Hashing<W> {
    fn line(&mut self, value: &impl Serialize) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(value)?;
        bytes.push(b'\n');
        self.hasher.update(&bytes);
        self.inner.write_all(&bytes)
    }
}

impl SessionArchive {
    /// Writes the archive as a file of the format above.
    pub fn write(&self, out: impl Write, exported_at_ms: i64) -> Result<(), ArchiveError> {
        let mut out = Hashing {
            inner: std::io::BufWriter::new(out),
            hasher: blake3::Hasher::new(),
        };
        out.line(&Header {
            format: ARCHIVE_FORMAT.to_owned(),
            version: ARCHIVE_VERSION,
            exported_at_ms,
            session: self.session.clone(),
        })?;
        let mut records = 0u64;
        let mut put = |out: &mut Hashing<_>, record: Record| {
            records += 1;
            out.line(&record)
        };
        for message in &self.messages {
            put(&mut out, Record::Message(message.clone()))?;
        }
        for blob in &self.blobs {
            put(&mut out, Record::Blob(blob.clone()))?;
        }
        for summary in &self.summaries {
            put(&mut out, Record::Summary(summary.clone()))?;
        }
        for item in &self.context {
            put(&mut out, Record::Context(item.clone()))?;
        }
        for turn in &self.turns {
            put(&mut out, Record::Turn(turn.clone()))?;
        }
        for (key, value) in &self.state {
            put(
                &mut out,
                Record::State {
                    key: key.clone(),
                    value: value.clone(),
                },
            )?;
        }
        let end = Record::End(End {
            records,
            blake3: out.hasher.finalize().to_hex().to_string(),
        });
        let mut bytes = serde_json::to_vec(&end).map_err(std::io::Error::from)?;
        bytes.push(b'\n');
        out.inner.write_all(&bytes)?;
        out.inner.flush()?;
        Ok(())
    }

    /// Reads a file of the format above, checking its trailer; returns the archive and when it
    /// was exported.
    pub fn read(input: impl BufRead) -> Result<(SessionArchive, i64), ArchiveError> {
        let mut hasher = blake3::Hasher::new();
        let mut archive = SessionArchive::default();
        let mut exported_at_ms = None;
        let mut records = 0u64;
        let mut line_number = 0u64;
        let mut lines = input.split(b'\n');
        while let Some(line) = lines.next() {
            let line = line?;
            line_number += 1;
            let malformed = |detail: String| ArchiveError::Malformed {
                line: line_number,
                detail,
            };
            if exported_at_ms.is_none() {
                let header: Header = serde_json::from_slice(&line).map_err(|error| {
                    ArchiveError::Unsupported(format!("its first line is no header ({error})"))
                })?;
                if header.format != ARCHIVE_FORMAT || header.version != ARCHIVE_VERSION {
                    return Err(ArchiveError::Unsupported(format!(
                        "it is {:?} version {}",
                        header.format, header.version
                    )));
                }
                exported_at_ms = Some(header.exported_at_ms);
                archive.session = header.session;
            } else {
                let record: Record =
                    serde_json::from_slice(&line).map_err(|error| malformed(error.to_string()))?;
                match record {
                    Record::End(end) => {
                        let digest = hasher.finalize().to_hex().to_string();
                        if end.records != records || end.blake3 != digest {
                            return Err(ArchiveError::Damaged(format!(
                                "it counts {} records and hashes to {}; the file has {records} records hashing to {digest}",
                                end.records, end.blake3
                            )));
                        }
                        let rest = lines.next().transpose()?;
                        if rest.is_some_and(|rest| !rest.is_empty()) {
                            return Err(malformed("lines follow the end record".to_owned()));
                        }
                        return Ok((archive, exported_at_ms.unwrap_or_default()));
                    }
                    Record::Message(message) => archive.messages.push(message),
                    Record::Blob(blob) => archive.blobs.push(blob),
                    Record::Summary(summary) => archive.summaries.push(summary),
                    Record::Context(item) => archive.context.push(item),
                    Record::Turn(turn) => archive.turns.push(turn),
                    Record::State { key, value } => {
                        archive.state.insert(key, value);
                    }
                }
                records += 1;
            }
            hasher.update(&line);
            hasher.update(b"\n");
        }
        if exported_at_ms.is_none() {
            return Err(ArchiveError::Unsupported("the file is empty".to_owned()));
        }
        Err(ArchiveError::Truncated(line_number))
    }
}
