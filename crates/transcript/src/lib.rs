//! OpenClaw session transcripts: a JSONL file with a `session` header line, then one entry per
//! line (`{type, id, parentId, timestamp, …}`). `message` and `compaction` entries are typed;
//! every other entry type is kept verbatim.
//!
//! Reads stream line by line and report byte offsets, so a caller can resume where it stopped.
//! A malformed line is an error naming the file and line, except a torn *last* line (a crash
//! mid-append): that one is skipped with a warning and reported, and everything before it is
//! kept. Appends are flushed and synced before they return.

pub mod agent_database;

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use vilvona_core::message::AgentMessage;

/// Errors naming the file and, where it applies, the line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TranscriptError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("{path}: the first line is not a `session` header")]
    MissingHeader { path: PathBuf },
    /// The caller's visitor stopped the reading after the last line.
    #[error("{path}: {reason}")]
    Visit { path: PathBuf, reason: String },
}

pub type Result<T, E = TranscriptError> = std::result::Result<T, E>;

fn io_error(path: &Path, source: std::io::Error) -> TranscriptError {
    TranscriptError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The `session` header line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionHeader {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SessionHeader {
    pub fn new(id: impl Into<String>, timestamp: String) -> SessionHeader {
        SessionHeader {
            id: id.into(),
            version: Some(3),
            timestamp: Some(timestamp),
            cwd: None,
            extra: Map::new(),
        }
    }
}

/// A `message` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageEntry {
    pub id: String,
    #[serde(default)]
    pub parent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    pub message: AgentMessage,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A `compaction` entry: the summary of everything before `first_kept_entry_id`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionEntry {
    pub id: String,
    #[serde(default)]
    pub parent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    pub summary: String,
    pub first_kept_entry_id: String,
    pub tokens_before: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One transcript entry after the header.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Message(MessageEntry),
    Compaction(CompactionEntry),
    /// Any other entry type (model changes, labels, custom entries, …), kept verbatim.
    Other(Map<String, Value>),
}

impl Entry {
    /// Sets the entry's parent (`parentId`), for the entry kinds that chain.
    pub fn set_parent(&mut self, parent: Option<String>) {
        match self {
            Entry::Message(entry) => entry.parent_id = parent,
            Entry::Compaction(entry) => entry.parent_id = parent,
            Entry::Other(fields) => {
                if fields.contains_key("parentId") {
                    fields.insert(
                        "parentId".to_owned(),
                        parent.map_or(Value::Null, Value::String),
                    );
                }
            }
        }
    }

    pub fn id(&self) -> Option<&str> {
        match self {
            Entry::Message(entry) => Some(&entry.id),
            Entry::Compaction(entry) => Some(&entry.id),
            Entry::Other(fields) => fields.get("id").and_then(Value::as_str),
        }
    }

    fn parse(value: Value) -> std::result::Result<Entry, String> {
        let kind = value.get("type").and_then(Value::as_str).map(str::to_owned);
        match kind.as_deref() {
            Some("message") => serde_json::from_value(value)
                .map(Entry::Message)
                .map_err(|error| format!("message entry: {error}")),
            Some("compaction") => serde_json::from_value(value)
                .map(Entry::Compaction)
                .map_err(|error| format!("compaction entry: {error}")),
            Some(_) => match value {
                Value::Object(fields) => Ok(Entry::Other(fields)),
                _ => Err("expected an object".to_owned()),
            },
            None => Err("entry has no string `type`".to_owned()),
        }
    }

    fn to_value(&self) -> Value {
        let (kind, mut value) = match self {
            Entry::Message(entry) => ("message", serde_json::to_value(entry)),
            Entry::Compaction(entry) => ("compaction", serde_json::to_value(entry)),
            Entry::Other(fields) => return Value::Object(fields.clone()),
        };
        if let Ok(Value::Object(fields)) = &mut value {
            fields.insert("type".to_owned(), Value::String(kind.to_owned()));
        }
        value.unwrap_or(Value::Null)
    }
}

/// A place in a transcript: a byte offset at a line start, and how many lines precede it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub offset: u64,
    pub line: u64,
}

/// An entry with its line number and the cursor just after it (where to resume).
#[derive(Clone, Debug, PartialEq)]
pub struct Located {
    pub entry: Entry,
    pub line: u64,
    pub end: Cursor,
}

/// A torn final line that was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornLine {
    pub line: u64,
    pub bytes: u64,
}

/// A whole transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct Transcript {
    pub header: SessionHeader,
    pub entries: Vec<Located>,
    pub torn: Option<TornLine>,
}

/// Reads the header line of a transcript.
pub fn read_header(path: &Path) -> Result<SessionHeader> {
    let file = File::open(path).map_err(|error| io_error(path, error))?;
    let mut first = String::new();
    BufReader::new(file)
        .read_line(&mut first)
        .map_err(|error| io_error(path, error))?;
    parse_header(path, &first)
}

fn parse_header(path: &Path, line: &str) -> Result<SessionHeader> {
    let value: Value =
        serde_json::from_str(line.trim()).map_err(|error| TranscriptError::Malformed {
            path: path.to_owned(),
            line: 1,
            reason: format!("session header: {error}"),
        })?;
    if value.get("type").and_then(Value::as_str) != Some("session") {
        return Err(TranscriptError::MissingHeader {
            path: path.to_owned(),
        });
    }
    let mut value = value;
    if let Value::Object(fields) = &mut value {
        fields.remove("type");
    }
    serde_json::from_value(value).map_err(|error| TranscriptError::Malformed {
        path: path.to_owned(),
        line: 1,
        reason: format!("session header: {error}"),
    })
}

/// Parses one entry line (not the header), with the reason when it does not fit.
pub fn parse_line(text: &str) -> std::result::Result<Entry, String> {
    serde_json::from_str::<Value>(text)
        .map_err(|error| error.to_string())
        .and_then(Entry::parse)
}

/// Lines parsed together: each batch is parsed across cores (rayon), then visited in order.
const PARSE_BATCH: usize = 256;
/// Below this many lines a batch is parsed on the calling thread (rayon's hand-off costs more).
const PARALLEL_LINES: usize = 64;

/// A line read but not yet parsed.
struct RawLine {
    number: u64,
    /// Where the line ends: the cursor after it.
    end: u64,
    /// Its bytes (the newline excluded when present).
    bytes: Vec<u8>,
    complete: bool,
}

/// Streams a transcript's entries from `from` (the default cursor = the start, header
/// included), calling `visit` for each. Stops at the first malformed line with an error, having
/// visited everything before it. Returns the header (when read from the start) and a torn last
/// line, if any. Lines are parsed in batches across cores and visited in file order.
pub fn read_entries(
    path: &Path,
    from: Cursor,
    mut visit: impl FnMut(Located) -> std::result::Result<(), String>,
) -> Result<(Option<SessionHeader>, Option<TornLine>)> {
    let offset = from.offset;
    let mut file = File::open(path).map_err(|error| io_error(path, error))?;
    let length = file
        .metadata()
        .map_err(|error| io_error(path, error))?
        .len();
    file.seek(SeekFrom::Start(offset))
        .map_err(|error| io_error(path, error))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut header = None;
    let mut line_number: u64 = from.line;
    let mut position = offset;
    let mut batch: Vec<RawLine> = Vec::with_capacity(PARSE_BATCH);
    loop {
        batch.clear();
        let mut at_end = false;
        while batch.len() < PARSE_BATCH {
            let mut bytes = Vec::new();
            let read = reader
                .read_until(b'\n', &mut bytes)
                .map_err(|error| io_error(path, error))?;
            if read == 0 {
                at_end = true;
                break;
            }
            line_number += 1;
            position += read as u64;
            let complete = bytes.last() == Some(&b'\n');
            if offset == 0 && line_number == 1 {
                let text = String::from_utf8_lossy(&bytes);
                let text = text.trim();
                if !text.is_empty() {
                    header = Some(parse_header(path, text)?);
                    continue;
                }
            }
            batch.push(RawLine {
                number: line_number,
                end: position,
                bytes,
                complete,
            });
        }
        let parse = |line: &RawLine| -> Option<std::result::Result<Entry, String>> {
            let text = String::from_utf8_lossy(&line.bytes);
            if matches!(text, std::borrow::Cow::Owned(_)) {
                // Kept, lossily: every valid part of the line matters more than its bad bytes.
                tracing::warn!(
                    path = %path.display(),
                    line = line.number,
                    "the line is not valid UTF-8; its invalid bytes are read as U+FFFD"
                );
            }
            let text = text.trim();
            (!text.is_empty()).then(|| parse_line(text))
        };
        let parsed: Vec<_> = if batch.len() >= PARALLEL_LINES {
            batch.par_iter().map(parse).collect()
        } else {
            batch.iter().map(parse).collect()
        };
        for (line, parsed) in batch.iter().zip(parsed) {
            match parsed {
                None => {}
                Some(Ok(entry)) => visit(Located {
                    entry,
                    line: line.number,
                    end: Cursor {
                        offset: line.end,
                        line: line.number,
                    },
                })
                .map_err(|reason| TranscriptError::Malformed {
                    path: path.to_owned(),
                    line: line.number,
                    reason,
                })?,
                Some(Err(reason)) if !line.complete && line.end == length => {
                    tracing::warn!(
                        path = %path.display(),
                        line = line.number,
                        %reason,
                        "ignoring a torn last line (an append interrupted by a crash)"
                    );
                    return Ok((
                        header,
                        Some(TornLine {
                            line: line.number,
                            bytes: line.bytes.len() as u64,
                        }),
                    ));
                }
                Some(Err(reason)) => {
                    return Err(TranscriptError::Malformed {
                        path: path.to_owned(),
                        line: line.number,
                        reason,
                    });
                }
            }
        }
        if at_end {
            return Ok((header, None));
        }
    }
}

/// A turn of a transcript: a user message and every message after it until the next user
/// message (messages before the first user message form a turn of their own), with their
/// entry ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turn {
    pub messages: Vec<AgentMessage>,
    pub entry_ids: Vec<String>,
}

/// Reads a transcript's message entries as turns, handing each to `visit` once the next begins
/// (so memory holds one turn). On a malformed line the turn read so far is handed over before
/// the error is returned: everything before the bad line is visited.
pub fn for_each_turn(
    path: &Path,
    mut visit: impl FnMut(Turn) -> std::result::Result<(), String>,
) -> Result<(Option<SessionHeader>, Option<TornLine>)> {
    let mut current = Turn::default();
    let mut stopped = false;
    let outcome = read_entries(path, Cursor::default(), |located| {
        if let Entry::Message(entry) = located.entry {
            if matches!(entry.message, AgentMessage::User(_)) && !current.messages.is_empty() {
                visit(std::mem::take(&mut current)).inspect_err(|_| stopped = true)?;
            }
            current.messages.push(entry.message);
            current.entry_ids.push(entry.id);
        }
        Ok(())
    });
    // The last turn, or the part of one read before a bad line.
    if !stopped
        && !current.messages.is_empty()
        && let Err(reason) = visit(current)
        && outcome.is_ok()
    {
        return Err(TranscriptError::Visit {
            path: path.to_owned(),
            reason,
        });
    }
    outcome
}

/// Reads a whole transcript.
pub fn read_transcript(path: &Path) -> Result<Transcript> {
    let mut entries = Vec::new();
    let (header, torn) = read_entries(path, Cursor::default(), |located| {
        entries.push(located);
        Ok(())
    })?;
    let header = header.ok_or_else(|| TranscriptError::MissingHeader {
        path: path.to_owned(),
    })?;
    Ok(Transcript {
        header,
        entries,
        torn,
    })
}

/// Appends entries to a transcript, durably.
#[derive(Debug)]
pub struct TranscriptWriter {
    path: PathBuf,
    file: File,
    last_id: Option<String>,
    /// Every entry id in the file, as far as it has been read.
    known: HashSet<String>,
    /// How far the file has been read (other processes may append after it).
    seen: Cursor,
}

impl TranscriptWriter {
    /// Creates a new transcript with its header. If another process created it first (two
    /// processes starting one session at once), opens theirs instead.
    pub fn create(path: &Path, header: &SessionHeader) -> Result<TranscriptWriter> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|error| io_error(parent, error))?;
        }
        let file = match OpenOptions::new()
            .create_new(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(path)
        {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                return TranscriptWriter::open(path);
            }
            Err(error) => return Err(io_error(path, error)),
        };
        let mut writer = TranscriptWriter {
            path: path.to_owned(),
            file,
            last_id: None,
            known: HashSet::new(),
            seen: Cursor::default(),
        };
        let mut value = serde_json::to_value(header).unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut value {
            fields.insert("type".to_owned(), Value::String("session".to_owned()));
        }
        writer.locked(|writer| {
            writer.write_line(&value)?;
            writer.seen = writer.end_cursor(1)?;
            Ok(())
        })?;
        writer.sync()?;
        Ok(writer)
    }

    /// Opens an existing transcript for appending. A torn last line (no final newline) is cut
    /// off first: it was never acknowledged, and appending after it would corrupt the next
    /// line. Remembers the entry ids so that nothing is appended twice, and the last one so
    /// new entries chain to it.
    pub fn open(path: &Path) -> Result<TranscriptWriter> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .map_err(|error| io_error(path, error))?;
        let mut writer = TranscriptWriter {
            path: path.to_owned(),
            file,
            last_id: None,
            known: HashSet::new(),
            seen: Cursor::default(),
        };
        writer.locked(TranscriptWriter::catch_up)?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of the last entry, which the next entry names as its parent.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Whether the transcript holds an entry with this id (as far as it was last read; see
    /// [`TranscriptWriter::refresh`]).
    pub fn contains(&self, id: &str) -> bool {
        self.known.contains(id)
    }

    /// Reads what other processes appended since this writer last looked.
    pub fn refresh(&mut self) -> Result<()> {
        self.locked(TranscriptWriter::catch_up)
    }

    /// Appends a message entry with a fresh id chained to the previous entry; returns the id.
    pub fn append_message(&mut self, message: &AgentMessage, timestamp: String) -> Result<String> {
        let id = self.next_id();
        let entry = Entry::Message(MessageEntry {
            id: id.clone(),
            parent_id: self.last_id.clone(),
            timestamp: Some(timestamp),
            message: message.clone(),
            extra: Map::new(),
        });
        self.append(&entry)?;
        Ok(id)
    }

    /// Appends an entry unless the transcript already holds its id; returns whether it was
    /// appended. Appends are serialized across processes (an exclusive lock on the file),
    /// and each first reads what others appended, so a resumed, repeated or concurrent turn
    /// never writes an entry twice, and the entry's parent is the transcript's real last
    /// entry (no parent loops).
    pub fn append(&mut self, entry: &Entry) -> Result<bool> {
        self.locked(|writer| {
            writer.catch_up()?;
            if entry.id().is_some_and(|id| writer.known.contains(id)) {
                return Ok(false);
            }
            let mut entry = entry.clone();
            entry.set_parent(writer.last_id.clone());
            writer.write_line(&entry.to_value())?;
            writer.seen = writer.end_cursor(writer.seen.line + 1)?;
            if let Some(id) = entry.id() {
                writer.known.insert(id.to_owned());
                writer.last_id = Some(id.to_owned());
            }
            Ok(true)
        })
    }

    /// Flushes and syncs what was appended: call before acknowledging a turn.
    pub fn sync(&mut self) -> Result<()> {
        self.file
            .flush()
            .map_err(|error| io_error(&self.path, error))?;
        self.file
            .sync_data()
            .map_err(|error| io_error(&self.path, error))
    }

    /// A new entry id: 8 hex digits from a hash of the file, the previous id and the time.
    pub fn next_id(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.path.to_string_lossy().as_bytes());
        hasher.update(self.last_id.as_deref().unwrap_or("").as_bytes());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        hasher.update(&nanos.to_le_bytes());
        hasher.update(&std::process::id().to_le_bytes());
        hasher.finalize().as_bytes()[..4]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// Runs `work` holding the transcript's exclusive lock (other processes' appends wait).
    fn locked<T>(&mut self, work: impl FnOnce(&mut TranscriptWriter) -> Result<T>) -> Result<T> {
        self.file
            .lock()
            .map_err(|error| io_error(&self.path, error))?;
        let result = work(self);
        let unlocked = self
            .file
            .unlock()
            .map_err(|error| io_error(&self.path, error));
        let value = result?;
        unlocked?;
        Ok(value)
    }

    /// Under the lock: cuts a torn last line (a writer that died mid-line; the lock means no
    /// live writer is mid-line), then reads the entries appended since the last look.
    fn catch_up(&mut self) -> Result<()> {
        let length = self
            .file
            .metadata()
            .map_err(|error| io_error(&self.path, error))?
            .len();
        if length == self.seen.offset {
            return Ok(());
        }
        if length > 0 {
            let mut last = [0u8; 1];
            self.file
                .seek(SeekFrom::Start(length - 1))
                .map_err(|error| io_error(&self.path, error))?;
            self.file
                .read_exact(&mut last)
                .map_err(|error| io_error(&self.path, error))?;
            if last[0] != b'\n' {
                let keep = match read_transcript(&self.path)?.entries.last() {
                    Some(located) => located.end.offset,
                    None => header_end(&self.path)?,
                };
                tracing::warn!(path = %self.path.display(), bytes = length - keep, "cutting a torn last line before appending");
                self.file
                    .set_len(keep)
                    .map_err(|error| io_error(&self.path, error))?;
            }
        }
        let (known, last_id, mut seen) = (&mut self.known, &mut self.last_id, self.seen);
        read_entries(&self.path, self.seen, |located| {
            if let Some(id) = located.entry.id() {
                known.insert(id.to_owned());
                *last_id = Some(id.to_owned());
            }
            seen = located.end;
            Ok(())
        })?;
        self.seen = match seen.offset {
            0 => self.end_cursor(1)?,
            _ => seen,
        };
        Ok(())
    }

    /// A cursor at the current end of the file, `line` lines in.
    fn end_cursor(&self, line: u64) -> Result<Cursor> {
        Ok(Cursor {
            offset: self
                .file
                .metadata()
                .map_err(|error| io_error(&self.path, error))?
                .len(),
            line,
        })
    }

    fn write_line(&mut self, value: &Value) -> Result<()> {
        let mut line =
            serde_json::to_string(value).map_err(|error| TranscriptError::Malformed {
                path: self.path.clone(),
                line: 0,
                reason: error.to_string(),
            })?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|error| io_error(&self.path, error))
    }
}

fn header_end(path: &Path) -> Result<u64> {
    let file = File::open(path).map_err(|error| io_error(path, error))?;
    let mut first = Vec::new();
    BufReader::new(file)
        .read_until(b'\n', &mut first)
        .map_err(|error| io_error(path, error))?;
    Ok(first.len() as u64)
}

/// The messages a host rebuilds from a transcript: after the last compaction, its summary (as a
/// user message) and the message entries from its `firstKeptEntryId` on; without one, every
/// message entry. Each message comes with its entry id (the summary with the compaction's).
pub fn session_messages(entries: &[Located]) -> Vec<(String, AgentMessage)> {
    let last_compaction = entries
        .iter()
        .rposition(|located| matches!(located.entry, Entry::Compaction(_)));
    let mut out = Vec::new();
    let start = match last_compaction {
        None => 0,
        Some(index) => {
            let Entry::Compaction(compaction) = &entries[index].entry else {
                return out;
            };
            out.push((
                compaction.id.clone(),
                compaction_summary_message(&compaction.summary),
            ));
            entries
                .iter()
                .position(|located| {
                    located.entry.id() == Some(compaction.first_kept_entry_id.as_str())
                })
                .unwrap_or(index + 1)
        }
    };
    for located in &entries[start..] {
        if let Entry::Message(entry) = &located.entry {
            out.push((entry.id.clone(), entry.message.clone()));
        }
    }
    out
}

/// Opening of the user message that carries a compaction summary into the context.
pub const COMPACTION_SUMMARY_PREFIX: &str =
    "The conversation history before this point was compacted into the following summary:";

/// The user message that stands for a compaction summary in a rebuilt context.
pub fn compaction_summary_message(summary: &str) -> AgentMessage {
    AgentMessage::user_text(format!(
        "{COMPACTION_SUMMARY_PREFIX}\n\n<summary>\n{summary}\n</summary>"
    ))
}
