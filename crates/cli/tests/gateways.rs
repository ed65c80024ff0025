//! Two gateways, one history: two `vilvona serve --stdio` processes (each with its own state
//! directory, as on two machines) keep one session in one PostgreSQL database. Its turns
//! alternate between them, a load balancer's retry sends some turns to both, and a third
//! process greps the whole time.
//!
//! The database is created on the server `VILVONA_TEST_POSTGRES_URL` names (`.ci/run` starts
//! one); without it the test says so and passes, except in CI, where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tempfile::TempDir;

/// A gateway's engine process: `vilvona serve --stdio` on its own state directory.
use common::Serve as Gateway;

impl Gateway {
    fn grep(&mut self, query: &str) -> Vec<String> {
        let found = self.call(
            "tools/call",
            json!({"name": "vilvona_grep", "sessionId": "shared", "arguments": {"query": query, "mode": "phrase"}}),
        );
        found["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|hit| hit["snippet"].as_str().unwrap().to_owned())
            .collect()
    }

    fn assembled(&mut self) -> Value {
        self.call(
            "assemble",
            json!({"sessionId": "shared", "messages": [], "tokenBudget": 4000}),
        )["messages"]
            .clone()
    }
}

fn turn(n: u64) -> Value {
    let filler = "the scheduler drains the queue and the cache warms slowly; ".repeat(5);
    json!({
        "sessionId": "shared",
        "advancementKey": format!("turn-{n}"),
        "messages": [
            {"role": "user", "content": format!("Turn {n}. Please remember: the ticket for rollout {n} is OPS-{}. {filler}", 4000 + n), "timestamp": 1_000 + n},
            {"role": "assistant", "content": [{"type": "text", "text": format!("Noted turn {n}. {filler}")}]}
        ]
    })
}

#[test]
#[ignore = "needs PostgreSQL: scripts/postgres-test-server.sh starts one, .ci/run runs it"]
fn two_gateways_keep_one_history() {
    let url = common::postgres_database("gateways");
    let (one, two, three) = (
        TempDir::new().unwrap(),
        TempDir::new().unwrap(),
        TempDir::new().unwrap(),
    );
    let config = json!({"store": {"kind": "postgres", "url": url}, "freshTailCount": 6});
    let mut gateways = [
        Gateway::start(one.path(), &[], &config),
        Gateway::start(two.path(), &[], &config),
    ];
    // The budget both compact against, remembered in the shared database.
    gateways[0].assembled();

    // A third process greps the whole time, with the store URL from the environment.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let searcher = {
        let (stop, failures, url) = (stop.clone(), failures.clone(), url.clone());
        let state = three.path().to_owned();
        std::fs::write(
            state.join("vilvona.json5"),
            r#"{ plugins: { slots: { contextEngine: "lossless" } } }"#,
        )
        .unwrap();
        std::thread::spawn(move || {
            let mut searches = 0;
            while !stop.load(Ordering::Relaxed) || searches == 0 {
                let output = Command::new(common::binary())
                    .args(["--state-dir", state.to_str().unwrap()])
                    .args(["grep", "rollout", "--session", "shared", "--json"])
                    .env("VILVONA_STORE_URL", &url)
                    .output()
                    .unwrap();
                // Before the first turn the session is unknown; after it, every grep answers.
                if !output.status.success() && searches > 0 {
                    failures
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&output.stderr).into_owned());
                }
                if output.status.success() {
                    searches += 1;
                }
            }
            searches
        })
    };

    let turns = 24u64;
    for n in 0..turns {
        let (this, other) = ((n % 2) as usize, ((n + 1) % 2) as usize);
        assert_eq!(
            gateways[this].call("commitTurn", turn(n))["status"],
            "committed"
        );
        // Every third turn, the load balancer also retries it on the other gateway.
        if n % 3 == 0 {
            assert_eq!(
                gateways[other].call("commitTurn", turn(n))["status"],
                "duplicate",
                "turn {n}"
            );
        }
        gateways[this].assembled();
    }
    stop.store(true, Ordering::Relaxed);
    let searches = searcher.join().unwrap();
    assert!(searches > 0);
    assert!(
        failures.lock().unwrap().is_empty(),
        "{:?}",
        failures.lock().unwrap()
    );

    // The context converges: both gateways assemble the same messages, and it was compacted.
    let (first, second) = (gateways[0].assembled(), gateways[1].assembled());
    assert_eq!(first, second);
    let stats = Command::new(common::binary())
        .args([
            "--state-dir",
            three.path().to_str().unwrap(),
            "--store-url",
            &url,
        ])
        .args(["stats", "--session", "shared", "--json"])
        .output()
        .unwrap();
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(
        stats["messages"],
        2 * turns,
        "no message lost or doubled: {stats}"
    );
    assert!(
        stats["summariesByDepth"]
            .as_object()
            .is_some_and(|depths| !depths.is_empty()),
        "the session was compacted: {stats}"
    );
    // Every fact is found from either gateway.
    for n in 0..turns {
        let fact = format!("OPS-{}", 4000 + n);
        for gateway in gateways.iter_mut() {
            let found = gateway.grep(&fact);
            assert!(
                found
                    .iter()
                    .any(|snippet| snippet.contains(&format!("«{fact}»"))
                        || snippet.contains(&format!("«OPS»-«{}»", 4000 + n))),
                "{fact}: {found:?}"
            );
        }
    }
    // Doctor reads the third state directory as it is (a read-only command makes nothing
    // private): a state directory is its user's alone.
    std::fs::set_permissions(
        three.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let doctor = Command::new(common::binary())
        .args([
            "--state-dir",
            three.path().to_str().unwrap(),
            "--store-url",
            &url,
        ])
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        doctor.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
}
