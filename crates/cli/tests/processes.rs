//! Several real `vilvona` processes on one state directory: readers beside writers, a second
//! writer, sixteen writers, two replays of one session, and a replay killed mid-turn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

mod common;
use common::{command, vilvona};

fn succeeded(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json(output: &Output, what: &str) -> Value {
    serde_json::from_str(&succeeded(output, what)).unwrap()
}

fn fixture() -> String {
    format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A generated session transcript in `dir`: its path, session id and message count.
fn session_file(dir: &Path, turns: usize, seed: u64) -> (PathBuf, String, usize) {
    let workload = vilvona_workload::generate(turns, seed, 4);
    let path = dir.join(format!("session-{seed}.jsonl"));
    std::fs::write(&path, workload.to_jsonl()).unwrap();
    (path, workload.header.id.clone(), workload.entries.len())
}

fn lossless_state(dir: &TempDir) -> PathBuf {
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(
        state.join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" } }, agents: { defaults: { contextTokens: 12000 } } }"#,
    )
    .unwrap();
    state
}

/// Every inspection command on a stored session; all must succeed.
fn inspect_all(state: &Path, session: &str, summary: &str) {
    let found = json(
        &vilvona(state, &["grep", "parser", "--session", session, "--json"]),
        "grep",
    );
    assert!(found["results"].is_array());
    json(
        &vilvona(state, &["stats", "--session", session, "--json"]),
        "stats",
    );
    json(
        &vilvona(
            state,
            &["describe", summary, "--session", session, "--json"],
        ),
        "describe",
    );
    json(
        &vilvona(state, &["expand", summary, "--session", session, "--json"]),
        "expand",
    );
    json(
        &vilvona(state, &["context", "json", "--session", session]),
        "context",
    );
    json(&vilvona(state, &["sessions", "--json"]), "sessions");
    let doctor = json(&vilvona(state, &["doctor", "--json"]), "doctor");
    assert_eq!(doctor["healthy"], true, "{doctor}");
    assert!(
        doctor["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|check| check["name"] == "store integrity" && check["ok"] == true),
        "doctor checked the store: {doctor}"
    );
}

/// The fixture session replayed through lossless, and one of its summaries.
fn prepared(state: &Path) -> (String, String) {
    json(&vilvona(state, &["replay", &fixture(), "--json"]), "replay");
    let session = "synthetic-11-15".to_owned();
    let summaries = json(
        &vilvona(
            state,
            &[
                "grep",
                "the",
                "--session",
                &session,
                "--scope",
                "summaries",
                "--json",
            ],
        ),
        "grep summaries",
    );
    let summary = summaries["results"][0]["id"].as_str().unwrap().to_owned();
    (session, summary)
}

struct Serve {
    child: Child,
    lines: std::sync::mpsc::Receiver<Value>,
    next: u64,
}

impl Serve {
    fn start(state: &Path, env: &[(&str, &str)]) -> Serve {
        let mut command = command(state, &["serve", "--stdio"]);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(serde_json::from_str(&line).unwrap()).is_err() {
                    break;
                }
            }
        });
        let mut serve = Serve {
            child,
            lines,
            next: 0,
        };
        serve.call("initialize", json!({"engineId": "lossless", "config": {}}));
        serve
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let request =
            json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{request}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
        loop {
            let reply = self.lines.recv_timeout(Duration::from_secs(60)).unwrap();
            if reply["id"] == self.next {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    fn stop(mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

#[test]
fn inspection_commands_work_while_a_replay_and_serve_write() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(&dir);
    let (session, summary) = prepared(&state);
    let (big, _, _) = session_file(dir.path(), 400, 21);

    // (a) beside a running replay
    let mut replay = command(&state, &["replay", big.to_str().unwrap(), "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rounds_during = 0;
    while replay.try_wait().unwrap().is_none() && rounds_during < 3 {
        inspect_all(&state, &session, &summary);
        rounds_during += 1;
    }
    let status = replay.wait().unwrap();
    assert!(status.success(), "the replay failed beside the readers");
    assert!(rounds_during > 0, "the replay ended before any reader ran");

    // (b) beside a serving gateway, which holds the index
    let mut serve = Serve::start(&state, &[]);
    serve.call(
        "ingest",
        json!({"sessionId": "gw", "message": {"role": "user", "content": "the gateway is up"}}),
    );
    inspect_all(&state, &session, &summary);
    // A second writer beside it: a replay that cannot take the index still works.
    let second = json(
        &vilvona(&state, &["replay", &fixture(), "--json"]),
        "a replay beside serve",
    );
    assert_eq!(second["engine"], "lossless");
    serve.stop();
}

#[test]
fn an_acknowledged_fact_is_found_from_another_process_before_any_index_commit() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(&dir);
    prepared(&state);
    // This gateway commits its index only when it stops.
    let mut serve = Serve::start(&state, &[("VILVONA_INDEX_COMMIT_MS", "600000")]);
    serve.call(
        "ingest",
        json!({"sessionId": "live", "message": {"role": "user", "content": "Please remember: the failover code is FAILOVER-5150."}}),
    );
    for (query, mode) in [
        ("failover code", "text"),
        ("failover code", "phrase"),
        ("FAILOVER-\\d+", "regex"),
    ] {
        let found = json(
            &vilvona(
                &state,
                &["grep", query, "--session", "live", "--mode", mode, "--json"],
            ),
            "grep",
        );
        assert!(
            found["results"][0]["snippet"]
                .as_str()
                .is_some_and(|snippet| snippet.contains("5150")),
            "{mode}: {found}"
        );
    }
    serve.stop();
}

/// Sessions in `sessions.json`, by key.
fn session_records(state: &Path) -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(state.join("sessions.json")).unwrap();
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_object()
        .unwrap()
        .clone()
}

/// The transcript of a session holds no entry twice and no parent chain loops.
fn assert_transcript_sound(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let mut parents: HashMap<String, Option<String>> = HashMap::new();
    let mut messages = 0;
    for line in text.lines().skip(1) {
        let entry: Value = serde_json::from_str(line).unwrap();
        let id = entry["id"].as_str().unwrap().to_owned();
        assert!(
            !parents.contains_key(&id),
            "{}: entry {id} appears twice",
            path.display()
        );
        parents.insert(id, entry["parentId"].as_str().map(str::to_owned));
        messages += usize::from(entry["type"] == "message");
    }
    for start in parents.keys() {
        let mut seen = HashSet::new();
        let mut current = Some(start.clone());
        while let Some(id) = current {
            assert!(
                seen.insert(id.clone()),
                "{}: a parent loop through {id}",
                path.display()
            );
            current = parents.get(&id).cloned().flatten();
        }
    }
    messages
}

fn stored_messages(state: &Path, session: &str) -> u64 {
    json(
        &vilvona(state, &["stats", "--session", session, "--json"]),
        "stats",
    )["messages"]
        .as_u64()
        .unwrap()
}

#[test]
fn sixteen_concurrent_replays_all_land_on_lossless() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(&dir);
    let sessions: Vec<(PathBuf, String, usize)> = (0..16)
        .map(|seed| session_file(dir.path(), 40, 100 + seed))
        .collect();
    let children: Vec<Child> = sessions
        .iter()
        .map(|(path, _, _)| {
            command(&state, &["replay", path.to_str().unwrap(), "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for ((_, id, messages), child) in sessions.iter().zip(children) {
        let output = child.wait_with_output().unwrap();
        let report = json(&output, &format!("replay of {id}"));
        assert_eq!(report["engine"], "lossless", "{id}: {report}");
        assert_eq!(report["messages"], *messages as u64, "{id}: {report}");
        assert_eq!(stored_messages(&state, id), *messages as u64, "{id}");
    }
    let records = session_records(&state);
    assert_eq!(records.len(), 16, "{:?}", records.keys());
    for record in records.values() {
        assert_transcript_sound(Path::new(record["sessionFile"].as_str().unwrap()));
    }
}

#[test]
fn two_concurrent_replays_of_one_session_double_nothing() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(&dir);
    let (path, id, messages) = session_file(dir.path(), 120, 7);
    let children: Vec<Child> = (0..2)
        .map(|_| {
            command(&state, &["replay", path.to_str().unwrap(), "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        json(&child.wait_with_output().unwrap(), "replay");
    }
    let records = session_records(&state);
    assert_eq!(records.len(), 1);
    let transcript = records.values().next().unwrap()["sessionFile"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(assert_transcript_sound(Path::new(&transcript)), messages);
    assert_eq!(stored_messages(&state, &id), messages as u64);
}

#[test]
fn a_replay_killed_mid_turn_resumes_without_duplicates() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(&dir);
    let (path, id, messages) = session_file(dir.path(), 300, 9);
    for delay_ms in [150, 400, 700, 1_000] {
        let mut child = command(&state, &["replay", path.to_str().unwrap(), "--json"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        // SIGKILL: no chance to flush anything.
        child.kill().unwrap();
        child.wait().unwrap();
    }
    json(
        &vilvona(&state, &["replay", path.to_str().unwrap(), "--json"]),
        "the resumed replay",
    );
    let records = session_records(&state);
    let transcript = records.values().next().unwrap()["sessionFile"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(assert_transcript_sound(Path::new(&transcript)), messages);
    assert_eq!(stored_messages(&state, &id), messages as u64);
}

/// `forget` beside a gateway that holds the index: the forgetting process writes the database
/// and queues the index work; the gateway applies it; no process finds the forgotten fact, the
/// gateway keeps serving, and the store is healthy after.
#[test]
fn forget_beside_a_serving_gateway() {
    let dir = TempDir::new().unwrap();
    let state = lossless_state(&dir);
    let (session, _) = prepared(&state);
    let mut serve = Serve::start(&state, &[]);
    serve.call(
        "ingest",
        json!({"sessionId": "gw", "message": {"role": "user", "content": "the gateway keeps the beacon notes"}}),
    );
    let grep = |query: &str, session: &str| -> usize {
        json(
            &vilvona(
                &state,
                &[
                    "grep",
                    query,
                    "--session",
                    session,
                    "--mode",
                    "phrase",
                    "--json",
                ],
            ),
            "grep",
        )["results"]
            .as_array()
            .unwrap()
            .len()
    };
    assert!(grep("password rotation", &session) > 0);
    let forgotten = json(
        &vilvona(&state, &["forget", "--session", &session, "--json"]),
        "forget beside serve",
    );
    assert_eq!(forgotten["messages"], 68);
    // The gateway still serves, and sees the store as it is now.
    let found = serve.call(
        "tools/call",
        json!({"name": "vilvona_grep", "sessionId": "gw", "arguments": {"query": "beacon notes", "mode": "phrase"}}),
    );
    assert_eq!(found["results"].as_array().unwrap().len(), 1, "{found}");
    serve.call(
        "ingest",
        json!({"sessionId": "gw", "message": {"role": "user", "content": "after the forget, the lighthouse log"}}),
    );
    assert_eq!(grep("lighthouse log", "gw"), 1);
    serve.stop();
    let unknown = vilvona(&state, &["grep", "password", "--session", &session]);
    assert_eq!(unknown.status.code(), Some(1), "the session is gone");
    let doctor = vilvona(&state, &["doctor", "--json"]);
    assert_eq!(
        doctor.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let stats = json(
        &vilvona(&state, &["stats", "--session", "gw", "--json"]),
        "stats",
    );
    assert_eq!(stats["messages"], 2);
}
