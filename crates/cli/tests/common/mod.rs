//! What the tests that run several `vilvona` processes share: the binary, on a state directory.

#[allow(dead_code)]
pub(crate) mod tmpfs;

use std::path::Path;
use std::process::{Command, Output};

/// `vilvona --state-dir STATE ARGS…`, with logs at their default level.
#[allow(dead_code)]
pub(crate) fn command(state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vilvona"));
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
