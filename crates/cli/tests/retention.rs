//! Forgetting and retention through the binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use tempfile::TempDir;

use common::vilvona;

fn ok_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn fixture() -> String {
    format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A short transcript whose messages were written `days_ago` days ago.
fn transcript(dir: &Path, session: &str, days_ago: i64, fact: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Half a day more: the whole days idle (what retention reports) stay the same however
    // long the test takes.
    let at = now - days_ago * 86_400_000 - 43_200_000;
    let lines = [
        json!({"type": "session", "version": 3, "id": session, "timestamp": "2026-03-02T09:00:00Z", "cwd": "/w"}),
        json!({"type": "message", "id": format!("{session}-0"), "parentId": null, "timestamp": "2026-03-02T09:00:00Z",
            "message": {"role": "user", "content": fact, "timestamp": at}}),
        json!({"type": "message", "id": format!("{session}-1"), "parentId": format!("{session}-0"), "timestamp": "2026-03-02T09:00:00Z",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "Noted."}], "timestamp": at + 1000}}),
    ];
    let path = dir.join(format!("{session}.jsonl"));
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_owned()
}

fn grep_count(state: &Path, session: &str, query: &str) -> usize {
    let output = vilvona(
        state,
        &[
            "grep",
            query,
            "--session",
            session,
            "--mode",
            "phrase",
            "--json",
        ],
    );
    ok_json(&output)["results"].as_array().unwrap().len()
}

#[test]
fn forget_removes_a_session_and_only_it() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    std::fs::write(state.join("vilvona.json5"), r#"{ plugins: { slots: { contextEngine: "lossless" }, entries: { lossless: { config: { recallAllConversations: true } } } } }"#).unwrap();
    let replayed = vilvona(
        state,
        &["replay", &fixture(), "--context-window", "12000", "--json"],
    );
    assert!(
        replayed.status.success(),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let other = transcript(
        state,
        "other",
        0,
        "Please remember: the heron gate code is HG-7 and Ada owns it.",
    );
    assert!(
        vilvona(state, &["replay", &other, "--json"])
            .status
            .success()
    );
    assert_eq!(
        grep_count(state, "other", "password rotation"),
        2,
        "other reaches the fixture's fact first"
    );
    let transcript_file = state.join("sessions/synthetic-11-15.jsonl");
    assert!(transcript_file.exists());

    let forgotten = ok_json(&vilvona(
        state,
        &["forget", "--session", "synthetic-11-15", "--json"],
    ));
    assert_eq!(forgotten["messages"], 68, "{forgotten}");
    assert!(forgotten["space"]["bytesAfter"].as_u64() < forgotten["space"]["bytesBefore"].as_u64());
    assert_eq!(grep_count(state, "other", "password rotation"), 0);
    assert_eq!(grep_count(state, "other", "heron gate code"), 1);
    assert!(
        !transcript_file.exists(),
        "the session's transcript went with it"
    );
    let sessions = ok_json(&vilvona(state, &["sessions", "--json"]));
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{sessions}");
    let doctor = vilvona(state, &["doctor", "--json"]);
    assert_eq!(
        doctor.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );

    let bad = vilvona(
        state,
        &["forget", "--session", "other", "--before", "2026-13-01"],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr).trim(),
        "vilvona: --before \"2026-13-01\" is not an RFC 3339 time like 2026-03-02T09:00:00Z"
    );
}

#[test]
fn retention_does_exactly_what_its_dry_run_listed() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    std::fs::write(
        state.join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" } } }"#,
    )
    .unwrap();
    for (session, days) in [("ancient", 300), ("idle", 60), ("fresh", 0)] {
        let file = transcript(
            state,
            session,
            days,
            &format!("Please remember: the {session} code is C-{days}."),
        );
        assert!(
            vilvona(state, &["replay", &file, "--json"])
                .status
                .success()
        );
    }
    // The policy comes after the replays (with it, each turn's maintain would apply it).
    std::fs::write(
        state.join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" }, entries: { lossless: { config: { retention: { archiveAfterDays: 30, deleteAfterDays: 200 } } } } } }"#,
    )
    .unwrap();
    let dry = ok_json(&vilvona(state, &["retention", "--dry-run", "--json"]));
    assert_eq!(dry["dryRun"], true);
    let listed: Vec<(String, String)> = dry["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["sessionId"].as_str().unwrap().to_owned(),
                a["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("ancient".to_owned(), "delete".to_owned()),
            ("idle".to_owned(), "archive".to_owned())
        ]
    );
    // The dry run changed nothing.
    assert_eq!(
        ok_json(&vilvona(state, &["sessions", "--json"]))
            .as_array()
            .unwrap()
            .len(),
        3
    );

    let real = ok_json(&vilvona(state, &["retention", "--json"]));
    assert_eq!(real["actions"], dry["actions"]);
    let sessions: Vec<String> = ok_json(&vilvona(state, &["sessions", "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert!(!sessions.contains(&"ancient".to_owned()));
    // The archived session still finds its own history.
    assert_eq!(grep_count(state, "idle", "idle code"), 1);
    let again = ok_json(&vilvona(state, &["retention", "--dry-run", "--json"]));
    assert_eq!(again["actions"], json!([]));
    let doctor = vilvona(state, &["doctor", "--json"]);
    assert_eq!(
        doctor.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
}
