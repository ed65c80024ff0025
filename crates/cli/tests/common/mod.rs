//! What the tests that run several `vilvona` processes share: the binary, on a state directory.

#[allow(dead_code)]
pub(crate) mod tmpfs;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

/// The binary these tests run: the one `cargo test` built beside them, or the build that
/// `VILVONA_TEST_BINARY` names (`.ci/run` points it at its one release build, which runs the
/// crash suite's hundred kills several times faster than a debug build).
#[allow(dead_code)]
pub(crate) fn binary() -> PathBuf {
    std::env::var_os("VILVONA_TEST_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vilvona")))
}

/// `vilvona --state-dir STATE ARGS…`, with logs at their default level.
#[allow(dead_code)]
pub(crate) fn command(state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .env_remove("RUST_LOG");
    command
}

/// Runs `vilvona` to completion.
#[allow(dead_code)]
pub(crate) fn vilvona(state: &Path, args: &[&str]) -> Output {
    command(state, args).output().unwrap()
}

/// A database of its own on the test server `VILVONA_TEST_POSTGRES_URL` names. The tests that
/// need one are ignored unless asked for (`cargo test -- --include-ignored`, as `.ci/run`
/// does); asked for without a server, they fail.
#[allow(dead_code)]
pub(crate) fn postgres_database(purpose: &str) -> String {
    let base = std::env::var("VILVONA_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "this test needs PostgreSQL (scripts/postgres-test-server.sh starts one; export the URL it prints as VILVONA_TEST_POSTGRES_URL)"
        )
    });
    let name = format!("vilvona_{purpose}_{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        let running = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        drop(client);
        let _ = running.await;
    });
    format!("{base} dbname={name}")
}

/// Whether the slow suites run whole (`.ci/run` sets `VILVONA_FULL_SUITES`): `cargo test` alone
/// runs a smaller version of each, and says so in its name's doc.
#[allow(dead_code)]
pub(crate) fn full_suites() -> bool {
    std::env::var_os("VILVONA_FULL_SUITES").is_some()
}

/// `vilvona --state-dir STATE ARGS… serve --stdio`, initialized with the lossless engine and
/// `config`, answering one JSON-RPC call at a time (within a minute). Killed when dropped.
#[allow(dead_code)]
pub(crate) struct Serve {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    next_id: u64,
}

#[allow(dead_code)]
impl Serve {
    pub(crate) fn start(state: &Path, args: &[&str], config: &Value) -> Serve {
        let mut child = Command::new(binary())
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .args(["serve", "--stdio"])
            .env_remove("VILVONA_STORE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(serde_json::from_str(&line).unwrap()).is_err() {
                    break;
                }
            }
        });
        let mut serve = Serve {
            stdin: child.stdin.take().unwrap(),
            child,
            lines,
            next_id: 0,
        };
        serve.call(
            "initialize",
            json!({"engineId": "lossless", "config": config}),
        );
        serve
    }

    /// Calls `method`; its result (an error reply fails the test).
    pub(crate) fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let reply = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|error| panic!("{method}: no reply ({error})"));
            if reply["id"] == id && reply.get("method").is_none() {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
