//! How the database holds a message's JSON.
//!
//! Messages are small JSON documents that repeat the same keys, roles and phrasing, which a
//! general-purpose compressor cannot learn from one message alone. Once a store holds
//! [`DICTIONARY_AFTER`] messages, the writer trains a zstd dictionary on them and stores it in
//! `compression_dictionaries`; from then on every message is a zstd frame compressed against it
//! (the frame names the dictionary by id). Rows written before, and stores written by earlier
//! builds, stay lz4 with their size prefixed. Both decode: a zstd frame begins with its magic
//! number, which read as an lz4 size prefix would claim more than 4 GiB.
//!
//! A dictionary row is written once and never changed or deleted, in the transaction that first
//! uses it, so every frame's dictionary is in the database whichever process wrote the frame.
//! Decoders load a dictionary the first time a row names it and keep it for the process.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};

use rusqlite::{Connection, OptionalExtension};
use zstd::zstd_safe::{CCtx, CDict, DCtx, DDict};

/// How many messages a store holds before the writer trains its dictionary.
pub(crate) const DICTIONARY_AFTER: i64 = 1_000;
/// How many of the newest messages the dictionary is trained on, and how many bytes at most.
const SAMPLE_ROWS: i64 = 1_000;
const SAMPLE_BYTES: usize = 8 << 20;
/// The dictionary's size: larger ones compressed the reference workload no better.
const DICTIONARY_BYTES: usize = 16 << 10;
/// Level 1: on the reference workload level 3 made messages 7% smaller and ingest 10% slower.
const LEVEL: i32 = 1;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// A frame that claims more than this is damaged (large tool output lives in blobs).
const MAX_JSON_BYTES: u64 = 1 << 30;

/// Why stored JSON cannot be read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    #[error("the row names compression dictionary {0}, which the database does not hold")]
    MissingDictionary(u32),
    #[error("the zstd frame is damaged: {0}")]
    Zstd(&'static str),
    #[error("the lz4 block is damaged")]
    Lz4(#[source] lz4_flex::block::DecompressError),
    #[error("the decoded JSON is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
}

fn conversion(error: CodecError) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(error))
}

/// A trained dictionary, ready to compress with.
pub(crate) struct Encoder {
    id: u32,
    dictionary: CDict<'static>,
}

impl Encoder {
    /// `None` when `bytes` is no zstd dictionary.
    fn new(bytes: &[u8]) -> Option<Encoder> {
        let id = zstd::zstd_safe::get_dict_id_from_dict(bytes)?.get();
        Some(Encoder {
            id,
            dictionary: CDict::try_create(bytes, LEVEL)?,
        })
    }
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("id", &self.id).finish()
    }
}

/// The dictionary new messages are compressed with, shared by the callers that prepare
/// messages and the writer that trains or adopts it.
#[derive(Debug, Default)]
pub(crate) struct EncoderSlot(RwLock<Option<Arc<Encoder>>>);

impl EncoderSlot {
    pub(crate) fn get(&self) -> Option<Arc<Encoder>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes `encoder` the one new messages are compressed with (after the transaction that
    /// stored it, or found it stored, committed).
    pub(crate) fn set(&self, encoder: Encoder) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(encoder));
    }
}

thread_local! {
    static COMPRESSOR: RefCell<CCtx<'static>> = RefCell::new(CCtx::create());
    static DECOMPRESSOR: RefCell<DCtx<'static>> = RefCell::new(DCtx::create());
}

/// The stored form of `json`: a zstd frame against the encoder's dictionary, or lz4 without one.
pub(crate) fn encode(json: &str, encoder: Option<&Encoder>) -> Vec<u8> {
    let Some(encoder) = encoder else {
        return lz4_flex::compress_prepend_size(json.as_bytes());
    };
    let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(json.len()));
    let compressed = COMPRESSOR.with(|context| {
        context
            .borrow_mut()
            .compress_using_cdict(&mut out, json.as_bytes(), &encoder.dictionary)
    });
    match compressed {
        Ok(_) => out,
        // zstd fails only on allocation; lz4 still stores the message.
        Err(_) => lz4_flex::compress_prepend_size(json.as_bytes()),
    }
}

/// The dictionary a stored row was compressed against (`None` for lz4 and plain zstd),
/// loaded from `connection` the first time this process meets it.
pub(crate) fn dictionary_of(
    connection: &Connection,
    bytes: &[u8],
) -> rusqlite::Result<Option<Decoder>> {
    if !bytes.starts_with(&ZSTD_MAGIC) {
        return Ok(None);
    }
    let Some(id) = zstd::zstd_safe::get_dict_id_from_frame(bytes) else {
        return Ok(None);
    };
    let (path, id) = (connection.path().unwrap_or_default(), id.get());
    if let Some(found) = DECODERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(path)
        .and_then(|decoders| decoders.get(&id))
    {
        return Ok(Some(found.clone()));
    }
    let stored: Option<Vec<u8>> = connection
        .prepare_cached("SELECT dictionary FROM compression_dictionaries WHERE id = ?1")?
        .query_row([i64::from(id)], |row| row.get(0))
        .optional()?;
    let stored = stored.ok_or_else(|| conversion(CodecError::MissingDictionary(id)))?;
    let dictionary = Arc::new(DDict::create(&stored));
    DECODERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(path.to_owned())
        .or_default()
        .insert(id, dictionary.clone());
    Ok(Some(dictionary))
}

/// A dictionary ready to decode with.
pub(crate) type Decoder = Arc<DDict<'static>>;

/// Dictionaries met so far, by database path and id: a process keeps the few its stores use.
static DECODERS: LazyLock<Mutex<HashMap<String, HashMap<u32, Decoder>>>> =
    LazyLock::new(Mutex::default);

/// The JSON of a stored row, loading its dictionary from `connection` when it has one.
pub(crate) fn decode(connection: &Connection, bytes: &[u8]) -> rusqlite::Result<String> {
    let dictionary = dictionary_of(connection, bytes)?;
    decode_with(bytes, dictionary.as_deref())
}

/// The JSON of a stored row whose dictionary (from [`dictionary_of`]) is at hand: for decoding
/// on threads that have no connection.
pub(crate) fn decode_with(
    bytes: &[u8],
    dictionary: Option<&DDict<'_>>,
) -> rusqlite::Result<String> {
    let raw = if bytes.starts_with(&ZSTD_MAGIC) {
        decompress(bytes, dictionary).map_err(conversion)?
    } else {
        lz4_flex::decompress_size_prepended(bytes)
            .map_err(|error| conversion(CodecError::Lz4(error)))?
    };
    String::from_utf8(raw).map_err(|error| conversion(CodecError::NotUtf8(error)))
}

fn decompress(bytes: &[u8], dictionary: Option<&DDict<'_>>) -> Result<Vec<u8>, CodecError> {
    let size = match zstd::zstd_safe::get_frame_content_size(bytes) {
        Ok(Some(size)) if size <= MAX_JSON_BYTES => size as usize,
        _ => return Err(CodecError::Zstd("no plausible content size")),
    };
    let mut out = Vec::with_capacity(size);
    let written = DECOMPRESSOR.with(|context| {
        let mut context = context.borrow_mut();
        match dictionary {
            Some(dictionary) => context.decompress_using_ddict(&mut out, bytes, dictionary),
            None => context.decompress(&mut out, bytes),
        }
    });
    match written {
        Ok(written) if written == size => Ok(out),
        Ok(_) => Err(CodecError::Zstd("shorter than its content size")),
        Err(code) => Err(CodecError::Zstd(zstd::zstd_safe::get_error_name(code))),
    }
}

/// The dictionary the database holds (the first one stored, should two processes have raced).
pub(crate) fn stored_encoder(connection: &Connection) -> rusqlite::Result<Option<Encoder>> {
    let stored: Option<Vec<u8>> = connection
        .prepare_cached(
            "SELECT dictionary FROM compression_dictionaries ORDER BY created_at, id LIMIT 1",
        )?
        .query_row([], |row| row.get(0))
        .optional()?;
    Ok(stored.as_deref().and_then(Encoder::new))
}

/// A dictionary trained on the newest messages, with those messages: the writer stores it and
/// compresses them again with it.
pub(crate) struct Trained {
    pub(crate) bytes: Vec<u8>,
    pub(crate) id: u32,
    pub(crate) encoder: Encoder,
    /// The sampled rows (id, JSON): written before the dictionary, so lz4.
    pub(crate) samples: Vec<(i64, String)>,
}

/// Trains a dictionary on the newest messages; `None` when zstd finds too little to learn from
/// (few or tiny messages).
pub(crate) fn train(connection: &Connection) -> rusqlite::Result<Option<Trained>> {
    let mut statement =
        connection.prepare("SELECT id, json FROM messages ORDER BY id DESC LIMIT ?1")?;
    let mut rows = statement.query([SAMPLE_ROWS])?;
    let mut samples = Vec::new();
    let mut bytes = 0;
    while let Some(row) = rows.next()? {
        // A damaged row is no sample; doctor names it elsewhere.
        let Ok(json) = decode(connection, &row.get::<_, Vec<u8>>(1)?) else {
            continue;
        };
        bytes += json.len();
        samples.push((row.get(0)?, json));
        if bytes >= SAMPLE_BYTES {
            break;
        }
    }
    let mut continuous = Vec::with_capacity(bytes);
    let sizes: Vec<usize> = samples
        .iter()
        .map(|(_, json)| {
            continuous.extend_from_slice(json.as_bytes());
            json.len()
        })
        .collect();
    let Ok(dictionary) = zstd::dict::from_continuous(&continuous, &sizes, DICTIONARY_BYTES) else {
        return Ok(None);
    };
    let Some(encoder) = Encoder::new(&dictionary) else {
        return Ok(None);
    };
    Ok(Some(Trained {
        bytes: dictionary,
        id: encoder.id,
        encoder,
        samples,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages() -> Vec<String> {
        (0..400)
            .map(|index| {
                format!(
                    r#"{{"role":"assistant","content":[{{"type":"text","text":"Step {index}: the build of crate number {} passed its tests in {} ms."}}],"timestamp":{}}}"#,
                    index % 17,
                    index * 37 % 1000,
                    1_700_000_000_000u64 + index * 1000
                )
            })
            .collect()
    }

    /// A database of its own for each test: decoders are kept by database path.
    fn store(messages: &[String]) -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let connection = Connection::open(dir.path().join("codec.db")).unwrap();
        connection
            .execute_batch(
                "CREATE TABLE messages (id INTEGER PRIMARY KEY, json BLOB NOT NULL);
                 CREATE TABLE compression_dictionaries (
                     id INTEGER PRIMARY KEY, dictionary BLOB NOT NULL, created_at INTEGER NOT NULL);",
            )
            .unwrap();
        for (index, json) in messages.iter().enumerate() {
            connection
                .execute(
                    "INSERT INTO messages (id, json) VALUES (?1, ?2)",
                    rusqlite::params![index as i64 + 1, encode(json, None)],
                )
                .unwrap();
        }
        (dir, connection)
    }

    #[test]
    fn both_formats_read_back_and_the_dictionary_compresses_better() {
        let messages = messages();
        let (_dir, connection) = store(&messages);
        let trained = train(&connection).unwrap().expect("enough to train on");
        assert_eq!(trained.samples.len(), messages.len());
        connection
            .execute(
                "INSERT INTO compression_dictionaries (id, dictionary, created_at) VALUES (?1, ?2, 0)",
                rusqlite::params![i64::from(trained.id), trained.bytes],
            )
            .unwrap();
        let encoder = stored_encoder(&connection).unwrap().expect("stored");
        let (mut lz4, mut zstd) = (0, 0);
        for json in &messages {
            let old = encode(json, None);
            let new = encode(json, Some(&encoder));
            assert_eq!(decode(&connection, &old).unwrap(), *json);
            assert_eq!(decode(&connection, &new).unwrap(), *json);
            (lz4, zstd) = (lz4 + old.len(), zstd + new.len());
        }
        assert!(zstd * 2 < lz4, "zstd {zstd} bytes against lz4 {lz4}");
    }

    #[test]
    fn a_frame_whose_dictionary_is_missing_or_damaged_is_an_error_that_says_so() {
        let messages = messages();
        let (_dir, connection) = store(&messages);
        let trained = train(&connection).unwrap().unwrap();
        let frame = encode(&messages[0], Some(&trained.encoder));
        let error = decode(&connection, &frame).unwrap_err().to_string();
        assert!(error.contains("does not hold"), "{error}");
        connection
            .execute(
                "INSERT INTO compression_dictionaries (id, dictionary, created_at) VALUES (?1, ?2, 0)",
                rusqlite::params![i64::from(trained.id), trained.bytes],
            )
            .unwrap();
        let mut damaged = frame.clone();
        let last = damaged.len() - 3;
        damaged[last] ^= 0x5a;
        damaged.truncate(damaged.len() - 1);
        assert!(decode(&connection, &damaged).is_err());
        assert!(decode(&connection, &ZSTD_MAGIC).is_err());
        assert_eq!(decode(&connection, &frame).unwrap(), messages[0]);
    }

    #[test]
    fn too_little_to_learn_from_trains_nothing() {
        let (_dir, connection) = store(&["{}".to_owned(), "{}".to_owned()]);
        assert!(train(&connection).unwrap().is_none());
    }
}
