//! The state directory as a tester and a newcomer meet it: session ids that differ only in
//! punctuation, ids too long for a file name, a directory that does not exist, a damaged
//! `sessions.json`, an index that is gone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tempfile::TempDir;

use common::vilvona;

/// A transcript of `turns` turns for session `id`; entry ids `e1`, `e2`, … (the same in every
/// file: transcripts of different sessions may share entry ids).
fn transcript(dir: &Path, name: &str, id: &str, turns: usize, word: &str) -> PathBuf {
    let path = dir.join(name);
    let mut lines = vec![json!({"type": "session", "version": 3, "id": id, "timestamp": "2026-11-30T00:00:00Z", "cwd": "/"}).to_string()];
    let mut parent = Value::Null;
    let mut entry = 0;
    for turn in 0..turns {
        for message in [
            json!({"role": "user", "content": format!("{word} request {turn}: check the {word} ledger"), "timestamp": 1_772_442_351_000_i64 + turn as i64 * 1000}),
            json!({"role": "assistant", "content": [{"type": "text", "text": format!("{word} answer {turn}")}], "timestamp": 1_772_442_351_500_i64 + turn as i64 * 1000}),
        ] {
            entry += 1;
            let id = format!("e{entry}");
            lines.push(json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2026-11-30T00:00:01Z", "message": message}).to_string());
            parent = json!(id);
        }
    }
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn json_of(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `a/b`, `a:b` and `a_b` were all `sessions/a_b.jsonl`: the second and third replays found
/// their entry ids already in the file and wrote none of them.
#[test]
fn session_ids_that_differ_only_in_punctuation_keep_transcripts_of_their_own() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let ids = ["a/b", "a:b", "a_b"];
    for (index, id) in ids.iter().enumerate() {
        let file = transcript(
            dir.path(),
            &format!("t{index}.jsonl"),
            id,
            20,
            &format!("w{index}"),
        );
        let replayed = vilvona(
            &state,
            &[
                "replay",
                file.to_str().unwrap(),
                "--engine",
                "lossless",
                "--json",
            ],
        );
        json_of(&replayed);
    }
    let records: Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("sessions.json")).unwrap())
            .unwrap();
    let records = records.as_object().unwrap();
    assert_eq!(records.len(), 3, "{records:?}");
    let mut files = std::collections::BTreeSet::new();
    for record in records.values() {
        let file = record["sessionFile"].as_str().unwrap().to_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let messages = text
            .lines()
            .filter(|line| line.contains("\"type\":\"message\""))
            .count();
        assert_eq!(messages, 40, "{file} holds every message of its session");
        files.insert(file);
    }
    assert_eq!(files.len(), 3, "{files:?}");
}

/// A transcript written by an earlier version under the old shared name moves to the session's
/// own name when the session is opened.
#[test]
fn a_transcript_under_the_old_shared_name_moves_on_open() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let file = transcript(dir.path(), "t.jsonl", "a:b", 3, "old");
    json_of(&vilvona(
        &state,
        &[
            "replay",
            file.to_str().unwrap(),
            "--engine",
            "lossless",
            "--json",
        ],
    ));
    // As an earlier version left it: the transcript at `a_b.jsonl`, the record naming it.
    let sessions = state.join("sessions.json");
    let mut records: Value =
        serde_json::from_str(&std::fs::read_to_string(&sessions).unwrap()).unwrap();
    let record = records
        .as_object_mut()
        .unwrap()
        .values_mut()
        .next()
        .unwrap();
    let current = PathBuf::from(record["sessionFile"].as_str().unwrap());
    let old = state.join("sessions").join("a_b.jsonl");
    std::fs::rename(&current, &old).unwrap();
    record["sessionFile"] = json!(old.to_str().unwrap());
    std::fs::write(&sessions, serde_json::to_string(&records).unwrap()).unwrap();
    // The next replay of the session opens it: the file moves back to the session's own name
    // and nothing is written twice.
    let again = json_of(&vilvona(
        &state,
        &[
            "replay",
            file.to_str().unwrap(),
            "--engine",
            "lossless",
            "--json",
        ],
    ));
    assert_eq!(again["ingested"], 0, "{again}");
    assert!(!old.exists());
    assert!(current.exists(), "{}", current.display());
}

/// A 10,000-character session id: one line of error, and no record or file left behind.
#[test]
fn a_session_id_too_long_is_refused_in_one_line_and_leaves_nothing() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let id = "x".repeat(10_000);
    let file = transcript(dir.path(), "long.jsonl", &id, 2, "long");
    let output = vilvona(
        &state,
        &["replay", file.to_str().unwrap(), "--engine", "lossless"],
    );
    assert!(!output.status.success());
    let error = stderr(&output);
    assert_eq!(error.trim_end().lines().count(), 1, "{error}");
    assert!(
        error.len() < 300,
        "{} bytes: {}",
        error.len(),
        &error[..300.min(error.len())]
    );
    assert!(error.contains("256"), "{error}");
    // Refused before anything was opened: no record, no transcript.
    assert!(!state.join("sessions.json").exists());
    let transcripts = std::fs::read_dir(state.join("sessions"))
        .map(|entries| entries.count())
        .unwrap_or(0);
    assert_eq!(transcripts, 0);
}

/// A mistyped `--state-dir`: every command that only reads says the directory does not exist
/// and fails, and creates nothing.
#[test]
fn reading_commands_refuse_a_state_directory_that_does_not_exist() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("does-not-exist");
    for args in [
        vec!["sessions"],
        vec!["doctor"],
        vec!["stats", "--session", "s"],
        vec!["grep", "ledger", "--session", "s"],
        vec!["context", "list", "--session", "s"],
    ] {
        let output = vilvona(&missing, &args);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(
            stderr(&output).contains("does not exist"),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!missing.exists(), "{args:?} created the directory");
    }
}

/// One replayed session in a fresh state directory.
fn replayed(dir: &Path) -> PathBuf {
    let state = dir.join("state");
    let file = transcript(dir, "t.jsonl", "ledger-1", 30, "ledger");
    json_of(&vilvona(
        &state,
        &[
            "replay",
            file.to_str().unwrap(),
            "--engine",
            "lossless",
            "--json",
        ],
    ));
    state
}

/// 30 bytes overwritten in the middle of `sessions.json`: reading commands still work from
/// the store, doctor names the damage and the remedy, and `doctor --fix` moves the file aside
/// and rebuilds it from the store and the transcripts.
#[test]
fn a_garbled_session_index_locks_nothing_out_and_doctor_fix_rebuilds_it() {
    let dir = TempDir::new().unwrap();
    let state = replayed(dir.path());
    let index = state.join("sessions.json");
    let mut bytes = std::fs::read(&index).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle..middle + 30].fill(0xff);
    std::fs::write(&index, &bytes).unwrap();
    let grep = json_of(&vilvona(
        &state,
        &["grep", "ledger", "--session", "ledger-1", "--json"],
    ));
    assert!(!grep["results"].as_array().unwrap().is_empty(), "{grep}");
    let stats = json_of(&vilvona(
        &state,
        &["stats", "--session", "ledger-1", "--json"],
    ));
    assert_eq!(stats["messages"], 60);
    let doctor = vilvona(&state, &["doctor"]);
    assert_eq!(doctor.status.code(), Some(1));
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        report.contains("sessions.json") && report.contains("doctor --fix"),
        "{report}"
    );
    let fixed = vilvona(&state, &["doctor", "--fix"]);
    assert!(
        stderr(&fixed).contains("rebuilt with 1 session"),
        "{}",
        stderr(&fixed)
    );
    assert_eq!(
        fixed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&fixed.stdout)
    );
    let aside = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("sessions.json.damaged-")
        })
        .count();
    assert_eq!(aside, 1);
    let sessions = json_of(&vilvona(&state, &["sessions", "--json"]));
    assert_eq!(sessions[0]["id"], "ledger-1");
    assert_eq!(sessions[0]["messages"], 60);
}

/// The index removed (whole, or only its meta.json): doctor says it is missing or empty, and
/// what rebuilds it; a rebuild heals it.
#[test]
fn doctor_reports_a_missing_recall_index_and_rebuild_index_heals_it() {
    for damage in ["index", "index/meta.json"] {
        let dir = TempDir::new().unwrap();
        let state = replayed(dir.path());
        let target = state.join("agents/main/lossless").join(damage);
        if target.is_dir() {
            std::fs::remove_dir_all(&target).unwrap();
        } else {
            std::fs::remove_file(&target).unwrap();
        }
        let doctor = vilvona(&state, &["doctor", "--json"]);
        assert_eq!(
            doctor.status.code(),
            Some(1),
            "{damage}: doctor said healthy"
        );
        let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
        let detail = report["checks"][0]["detail"].as_str().unwrap();
        assert!(
            detail.contains("recall index") && detail.contains("rebuild"),
            "{damage}: {detail}"
        );
        let rebuilt = vilvona(&state, &["rebuild-index"]);
        assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
        let doctor = vilvona(&state, &["doctor", "--json"]);
        assert_eq!(
            doctor.status.code(),
            Some(0),
            "{damage}: {}",
            String::from_utf8_lossy(&doctor.stdout)
        );
    }
}
