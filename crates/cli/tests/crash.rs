//! The crash and damage suite: a real `vilvona replay` killed with SIGKILL at spread moments
//! more than a hundred times, each kill followed by reopening and checking; and a matrix of
//! damage to the index and the database, after which every command works or fails with one
//! clear line, and recall comes back whenever the database is intact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

mod common;
use common::tmpfs::Tmpfs;
use common::{command, vilvona};

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Exit 0, or exit 1 with a report or one error line: never a panic or a signal.
fn clean(output: &Output, what: &str) -> bool {
    let error = stderr(output);
    // A panic that was contained (a damaged index file) prints nothing of its own.
    assert!(!error.contains("panicked"), "{what}: {error}");
    match output.status.code() {
        Some(0) => true,
        Some(1) => {
            // Either a report (doctor: problems found) or one error line; warnings may precede.
            let lines = error
                .lines()
                .filter(|line| line.starts_with("vilvona:"))
                .count();
            assert!(
                lines == 1 || (lines == 0 && !output.stdout.is_empty()),
                "{what}: one error line or a report, got: {error}"
            );
            assert!(!error.contains("panicked"), "{what}: {error}");
            false
        }
        other => panic!("{what}: exit {other:?}: {error}"),
    }
}

fn lossless_state(dir: &Path) -> PathBuf {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let config = state.join("vilvona.json5");
    std::fs::write(
        &config,
        r#"{ plugins: { slots: { contextEngine: "lossless" } }, agents: { defaults: { contextTokens: 16000 } } }"#,
    )
    .unwrap();
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    state
}

struct Session {
    file: PathBuf,
    id: String,
    /// Each entry's message as JSON, in order.
    messages: Vec<Value>,
    needles: Vec<vilvona_workload::Needle>,
}

fn session(dir: &Path, turns: usize, seed: u64) -> Session {
    let workload = vilvona_workload::generate(turns, seed, 8);
    let file = dir.join(format!("session-{seed}.jsonl"));
    std::fs::write(&file, workload.to_jsonl()).unwrap();
    Session {
        file,
        id: workload.header.id.clone(),
        messages: workload
            .entries
            .iter()
            .map(|entry| serde_json::to_value(&entry.message).unwrap())
            .collect(),
        needles: workload.needles.clone(),
    }
}

/// Whether grep in `mode` answers with the needle's value. By meaning, the query is the
/// statement itself: its vector is the stored one's, so it is found exactly when the vectors
/// are there (how well other words find a fact is the recall tests' and the bench's concern;
/// on this workload's word salad, a subject's few words are close to many lines).
fn recalled(
    state: &Path,
    session: &Session,
    needle: &vilvona_workload::Needle,
    mode: &str,
) -> bool {
    let query = if mode == "semantic" {
        &needle.statement
    } else {
        &needle.query
    };
    let found = vilvona(
        state,
        &[
            "grep",
            query,
            "--session",
            &session.id,
            "--mode",
            mode,
            "--json",
        ],
    );
    String::from_utf8_lossy(&found.stdout).contains(needle.answer.as_str())
}

/// Whether a writer has set the database up (a kill can land between creating the file and
/// the migrations' one transaction).
fn set_up(connection: &rusqlite::Connection) -> bool {
    connection
        .query_row("PRAGMA user_version", [], |row| row.get::<_, i64>(0))
        .is_ok_and(|version| version > 0)
}

/// The messages the store holds for a session, in sequence order.
fn stored(state: &Path, session: &str) -> Vec<Value> {
    let db = state.join("agents/main/lossless/vilvona.db");
    if !db.exists() {
        return Vec::new();
    }
    let connection = rusqlite::Connection::open(db).unwrap();
    if !set_up(&connection) {
        return Vec::new();
    }
    let mut statement = connection
        .prepare(
            "SELECT m.json FROM messages m JOIN conversations c ON c.id = m.conversation_id
             WHERE c.session_id = ?1 ORDER BY m.seq",
        )
        .unwrap();
    statement
        .query_map([session], |row| row.get::<_, Vec<u8>>(0))
        .unwrap()
        .map(|bytes| {
            let json = decode(&connection, &bytes.unwrap());
            serde_json::from_slice(&json).unwrap()
        })
        .collect()
}

/// A stored message's JSON, decoded as the store writes it: a zstd frame against the
/// dictionary the frame names, or lz4 with its size prefixed.
fn decode(connection: &rusqlite::Connection, bytes: &[u8]) -> Vec<u8> {
    if bytes.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]) {
        let id = zstd::zstd_safe::get_dict_id_from_frame(bytes).unwrap();
        let dictionary: Vec<u8> = connection
            .query_row(
                "SELECT dictionary FROM compression_dictionaries WHERE id = ?1",
                [i64::from(id.get())],
                |row| row.get(0),
            )
            .unwrap();
        let size = zstd::zstd_safe::get_frame_content_size(bytes)
            .unwrap()
            .unwrap();
        return zstd::bulk::Decompressor::with_dictionary(&dictionary)
            .unwrap()
            .decompress(bytes, size as usize)
            .unwrap();
    }
    let size = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    lz4_decompress(&bytes[4..], size)
}

/// A minimal LZ4 block decoder (the format is small and fixed), so the test reads the store
/// without the store's code.
fn lz4_decompress(mut input: &[u8], size: usize) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(size);
    while !input.is_empty() {
        let token = input[0];
        input = &input[1..];
        let mut literals = (token >> 4) as usize;
        if literals == 15 {
            loop {
                let byte = input[0];
                input = &input[1..];
                literals += byte as usize;
                if byte != 255 {
                    break;
                }
            }
        }
        out.extend_from_slice(&input[..literals]);
        input = &input[literals..];
        if input.is_empty() {
            break;
        }
        let offset = u16::from_le_bytes([input[0], input[1]]) as usize;
        input = &input[2..];
        let mut length = (token & 15) as usize;
        if length == 15 {
            loop {
                let byte = input[0];
                input = &input[1..];
                length += byte as usize;
                if byte != 255 {
                    break;
                }
            }
        }
        length += 4;
        let start = out.len() - offset;
        for index in 0..length {
            out.push(out[start + index]);
        }
    }
    out
}

/// The message entries of the session's transcript, as JSON.
fn transcript(state: &Path, session: &str) -> Vec<Value> {
    let path = state.join("sessions").join(format!("{session}.jsonl"));
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut ids = std::collections::HashSet::new();
    text.lines()
        .skip(1)
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| entry["type"] == "message")
        .map(|entry| {
            assert!(
                ids.insert(entry["id"].as_str().unwrap().to_owned()),
                "entry {} written twice",
                entry["id"]
            );
            entry["message"].clone()
        })
        .collect()
}

#[test]
fn a_hundred_sigkills_lose_and_double_nothing() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(dir.path());
    // `cargo test` kills 16 times; `.ci/run` (VILVONA_FULL_SUITES) the hundred. The session is
    // long enough that no kill comes after the replay's end: each kill lands within 345 ms of a
    // start, and a release build's hundred resumes replay three quarters of 600 turns.
    let (kills, turns) = if common::full_suites() {
        (104, 1_500)
    } else {
        (16, 600)
    };
    let session = session(dir.path(), turns, 31);
    for kill in 0..kills {
        let mut replay = command(
            &state,
            &["replay", session.file.to_str().unwrap(), "--json"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        // Spread over the start (opening, bootstrap) and the middle of turns (ingest,
        // compaction, index commits).
        let delay = 15 + (kill * 53) % 330;
        std::thread::sleep(Duration::from_millis(delay as u64));
        replay.kill().unwrap();
        replay.wait().unwrap();
        // What the transcript holds was acknowledged to disk; the store holds the same
        // messages, in order, each once (the last turn may still be on its way: the next open
        // imports it).
        let on_disk = transcript(&state, &session.id);
        let in_store = stored(&state, &session.id);
        assert!(
            on_disk.len() < session.messages.len(),
            "kill {kill} came after the replay had ended: the session is too short"
        );
        assert_eq!(
            on_disk[..],
            session.messages[..on_disk.len()],
            "kill {kill}: transcript"
        );
        assert_eq!(
            in_store[..],
            session.messages[..in_store.len()],
            "kill {kill}: store"
        );
        // (Killed before the store was set up: nothing to check yet.)
        let db = state.join("agents/main/lossless/vilvona.db");
        if !db.exists() || !set_up(&rusqlite::Connection::open(&db).unwrap()) {
            continue;
        }
        let doctor = vilvona(&state, &["doctor", "--json"]);
        assert!(
            doctor.status.success(),
            "kill {kill}: doctor: {}",
            String::from_utf8_lossy(&doctor.stdout)
        );
    }
    // Resumed to the end: everything once, every fact found.
    let done = vilvona(
        &state,
        &["replay", session.file.to_str().unwrap(), "--json"],
    );
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(transcript(&state, &session.id), session.messages);
    assert_eq!(stored(&state, &session.id), session.messages);
    for needle in &session.needles {
        // By words, and by meaning (the index's vectors came through the kills too).
        for mode in ["text", "semantic"] {
            assert!(
                recalled(&state, &session, needle, mode),
                "{mode}: {needle:?}"
            );
        }
    }
}

/// Each kind of damage, then each command: exit 0 or one clear line; when the database is
/// intact, recall is whole again (by itself, or after rebuild-index).
#[test]
fn the_damage_matrix() {
    let dir = TempDir::new().unwrap();
    let template = lossless_state(dir.path());
    let session = session(dir.path(), 120, 17);
    let replayed = vilvona(
        &template,
        &["replay", session.file.to_str().unwrap(), "--json"],
    );
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    let index_dir = |state: &Path| state.join("agents/main/lossless/index");
    let database = |state: &Path| state.join("agents/main/lossless/vilvona.db");

    /// Damage to a copy of the state: given its index directory and its database file.
    type Damage = Box<dyn Fn(&Path, &Path)>;
    let index_file = |extension: &'static str, truncate: bool| {
        move |index: &Path, _db: &Path| {
            let victims: Vec<PathBuf> = std::fs::read_dir(index)
                .unwrap()
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| {
                    extension == "*"
                        || path.extension().is_some_and(|found| found == extension)
                        || path.file_name().is_some_and(|name| name == extension)
                })
                .collect();
            assert!(!victims.is_empty(), "no {extension} file");
            for victim in victims {
                if truncate {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&victim)
                        .unwrap()
                        .set_len(7)
                        .unwrap();
                } else {
                    std::fs::remove_file(&victim).unwrap();
                }
            }
        }
    };
    let cases: Vec<(&str, Damage, bool)> = vec![
        (
            "index .idx deleted",
            Box::new(index_file("idx", false)),
            true,
        ),
        (
            "index .term deleted",
            Box::new(index_file("term", false)),
            true,
        ),
        (
            "index .fast deleted",
            Box::new(index_file("fast", false)),
            true,
        ),
        (
            "index .pos deleted",
            Box::new(index_file("pos", false)),
            true,
        ),
        (
            "index .store deleted",
            Box::new(index_file("store", false)),
            true,
        ),
        (
            "index .store garbled",
            Box::new(|index: &Path, _: &Path| {
                for entry in std::fs::read_dir(index).unwrap().flatten() {
                    let path = entry.path();
                    if path.extension().is_some_and(|found| found == "store") {
                        let mut bytes = std::fs::read(&path).unwrap();
                        let middle = bytes.len() / 2;
                        let end = (middle + 3_000).min(bytes.len());
                        for (offset, byte) in bytes[middle..end].iter_mut().enumerate() {
                            *byte = (offset * 131 % 251) as u8;
                        }
                        std::fs::write(&path, bytes).unwrap();
                    }
                }
            }),
            true,
        ),
        (
            // The fast fields hold each document's vectors (and its key, conversation, time).
            "index .fast garbled",
            Box::new(|index: &Path, _: &Path| {
                for entry in std::fs::read_dir(index).unwrap().flatten() {
                    let path = entry.path();
                    if path.extension().is_some_and(|found| found == "fast") {
                        let mut bytes = std::fs::read(&path).unwrap();
                        let middle = bytes.len() / 3;
                        let end = (middle + 3_000).min(bytes.len());
                        for (offset, byte) in bytes[middle..end].iter_mut().enumerate() {
                            *byte = (offset * 97 % 251) as u8;
                        }
                        std::fs::write(&path, bytes).unwrap();
                    }
                }
            }),
            true,
        ),
        (
            "index .idx truncated",
            Box::new(index_file("idx", true)),
            true,
        ),
        (
            "index .term truncated",
            Box::new(index_file("term", true)),
            true,
        ),
        (
            "index meta.json deleted",
            Box::new(index_file("meta.json", false)),
            true,
        ),
        (
            "index meta.json truncated",
            Box::new(index_file("meta.json", true)),
            true,
        ),
        (
            "the whole index deleted",
            Box::new(|index: &Path, _: &Path| std::fs::remove_dir_all(index).unwrap()),
            true,
        ),
        (
            "a database page flipped",
            Box::new(|_: &Path, db: &Path| {
                let mut bytes = std::fs::read(db).unwrap();
                let middle = bytes.len() / 2;
                for byte in &mut bytes[middle..middle + 64] {
                    *byte ^= 0x5a;
                }
                std::fs::write(db, bytes).unwrap();
            }),
            false,
        ),
        (
            "3,000 bytes written into the middle of the database",
            Box::new(|_: &Path, db: &Path| {
                let mut bytes = std::fs::read(db).unwrap();
                let middle = bytes.len() / 2;
                for (offset, byte) in bytes[middle..middle + 3_000].iter_mut().enumerate() {
                    *byte = (offset * 7 % 256) as u8;
                }
                std::fs::write(db, bytes).unwrap();
            }),
            false,
        ),
        (
            "the database header flipped",
            Box::new(|_: &Path, db: &Path| {
                let mut bytes = std::fs::read(db).unwrap();
                bytes[0] ^= 0xff;
                std::fs::write(db, bytes).unwrap();
            }),
            false,
        ),
        (
            "the database truncated",
            Box::new(|_: &Path, db: &Path| {
                let length = std::fs::metadata(db).unwrap().len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(db)
                    .unwrap()
                    .set_len(length / 3)
                    .unwrap();
            }),
            false,
        ),
        (
            "the database deleted",
            Box::new(|_: &Path, db: &Path| std::fs::remove_file(db).unwrap()),
            false,
        ),
    ];
    for (name, damage, database_intact) in cases {
        let case_dir = TempDir::new().unwrap();
        let state = case_dir.path().join("state");
        copy_dir(&template, &state);
        damage(&index_dir(&state), &database(&state));
        let needle = &session.needles[0];
        for args in [
            vec![
                "grep",
                needle.query.as_str(),
                "--session",
                session.id.as_str(),
                "--json",
            ],
            vec![
                "grep",
                "which ticket do we have for rotating passwords?",
                "--session",
                session.id.as_str(),
                "--mode",
                "semantic",
            ],
            vec![
                "grep",
                needle.query.as_str(),
                "--session",
                session.id.as_str(),
                "--mode",
                "hybrid",
            ],
            vec![
                "grep",
                "line \\d+",
                "--session",
                session.id.as_str(),
                "--mode",
                "regex",
            ],
            vec!["stats", "--session", session.id.as_str()],
            vec!["sessions"],
            vec!["context", "json", "--session", session.id.as_str()],
            vec!["doctor"],
        ] {
            clean(&vilvona(&state, &args), &format!("{name}: {args:?}"));
        }
        if name.starts_with("3,000 bytes") {
            // Regex search skips the rows it cannot read, as text search does, and answers;
            // doctor names the pages (and rows) affected.
            for mode in ["text", "regex"] {
                let found = vilvona(
                    &state,
                    &["grep", "line", "--session", &session.id, "--mode", mode],
                );
                assert!(found.status.success(), "{name}: {mode}: {}", stderr(&found));
            }
            let doctor = vilvona(&state, &["doctor"]);
            let report = String::from_utf8_lossy(&doctor.stdout);
            assert!(
                report.contains("page"),
                "{name}: {report}{}",
                stderr(&doctor)
            );
        }
        let doctor = vilvona(&state, &["doctor", "--json"]);
        if !database_intact {
            // A store that cannot open is a problem, never "healthy"; a flipped page may lie in
            // free space or slack, where nothing can see it.
            if name != "a database page flipped" {
                assert_eq!(
                    doctor.status.code(),
                    Some(1),
                    "{name}: doctor must not say healthy"
                );
            }
            // A writer fails with one line or works; nothing panics.
            clean(
                &vilvona(
                    &state,
                    &["replay", session.file.to_str().unwrap(), "--json"],
                ),
                name,
            );
            continue;
        }
        // The database is intact: a writing command (or rebuild-index) heals the index.
        clean(
            &vilvona(&state, &["rebuild-index"]),
            &format!("{name}: rebuild-index"),
        );
        let doctor = vilvona(&state, &["doctor", "--json"]);
        assert!(
            doctor.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&doctor.stdout)
        );
        for needle in &session.needles {
            for mode in ["text", "semantic", "hybrid"] {
                assert!(
                    recalled(&state, &session, needle, mode),
                    "{name}: {mode}: {needle:?}"
                );
            }
        }
    }
}

/// Copies a state directory as it is, permissions included.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::set_permissions(to, std::fs::metadata(from).unwrap().permissions()).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A small tmpfs mounted for one test, unmounted when it ends.
/// The disk fills up mid-replay: the command fails with one clear line, what was written is a
/// consistent prefix, and the replay resumes elsewhere without writing anything twice.
#[test]
#[ignore = "mounts a 3 MiB tmpfs (needs root): .ci/run runs it"]
fn a_full_disk_fails_cleanly_and_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let session = session(dir.path(), 1_500, 43);
    let mount = dir.path().join("small");
    let _tmpfs = Tmpfs::mount(&mount, "3m")
        .unwrap_or_else(|reason| panic!("this test mounts a tmpfs and could not: {reason}"));
    let state = lossless_state(&mount);
    let full = vilvona(
        &state,
        &["replay", session.file.to_str().unwrap(), "--json"],
    );
    assert!(!full.status.success(), "3 MiB held the whole session?");
    clean(&full, "a replay on a full disk");
    assert!(
        stderr(&full).contains("No space left on device") || stderr(&full).contains("full"),
        "{}",
        stderr(&full)
    );
    let on_disk = transcript(&state, &session.id);
    let in_store = stored(&state, &session.id);
    assert_eq!(on_disk[..], session.messages[..on_disk.len()]);
    assert_eq!(in_store[..], session.messages[..in_store.len()]);
    // Moved to a disk with room, the replay resumes and completes: everything once.
    let roomy = dir.path().join("roomy");
    copy_dir(&state, &roomy);
    // (The transcript paths in sessions.json point at the old place: rewrite them.)
    let index = roomy.join("sessions.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replace(state.to_str().unwrap(), roomy.to_str().unwrap()),
    )
    .unwrap();
    let done = vilvona(
        &roomy,
        &["replay", session.file.to_str().unwrap(), "--json"],
    );
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(transcript(&roomy, &session.id), session.messages);
    assert_eq!(stored(&roomy, &session.id), session.messages);
}

/// The WAL deleted after a crash: the database loses its newest transactions, the index may
/// claim rows the database no longer has. Doctor says so, rebuild-index heals it, and the
/// replay resumes to a complete, duplicate-free session.
#[test]
fn a_wal_deleted_after_a_crash_is_noticed_and_healed() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(dir.path());
    // Still replaying when it is killed 1.5 s in.
    let session = session(dir.path(), 600, 47);
    let mut replay = command(
        &state,
        &["replay", session.file.to_str().unwrap(), "--json"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    replay.kill().unwrap();
    replay.wait().unwrap();
    let wal = state.join("agents/main/lossless/vilvona.db-wal");
    if wal.exists() {
        std::fs::remove_file(&wal).unwrap();
    }
    let _ = std::fs::remove_file(state.join("agents/main/lossless/vilvona.db-shm"));
    for args in [
        vec!["stats", "--session", session.id.as_str()],
        vec!["grep", "parser", "--session", session.id.as_str()],
        vec!["doctor"],
    ] {
        clean(&vilvona(&state, &args), &format!("{args:?}"));
    }
    clean(&vilvona(&state, &["rebuild-index"]), "rebuild-index");
    let in_store = stored(&state, &session.id);
    assert_eq!(in_store[..], session.messages[..in_store.len()]);
    let done = vilvona(
        &state,
        &["replay", session.file.to_str().unwrap(), "--json"],
    );
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(stored(&state, &session.id), session.messages);
    let doctor = vilvona(&state, &["doctor", "--json"]);
    assert!(
        doctor.status.success(),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
}
