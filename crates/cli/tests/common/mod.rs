//! What the tests that run several `vilvona` processes share: the binary, on a state directory.

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

/// A database of its own on the test server `VILVONA_TEST_POSTGRES_URL` names (`.ci/run`
/// starts one); `None`, said on stderr, without one — except in CI, where that fails.
#[allow(dead_code)]
pub(crate) fn postgres_database(purpose: &str) -> Option<String> {
    let base = match std::env::var("VILVONA_TEST_POSTGRES_URL") {
        Ok(base) => base,
        Err(_)
            if std::env::var_os("CI").is_some()
                || std::env::var_os("VILVONA_REQUIRE_POSTGRES").is_some() =>
        {
            panic!("CI has no PostgreSQL server: VILVONA_TEST_POSTGRES_URL is unset")
        }
        Err(_) => {
            eprintln!(
                "SKIPPED: VILVONA_TEST_POSTGRES_URL is unset (scripts/postgres-test-server.sh starts a server)"
            );
            return None;
        }
    };
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
    Some(format!("{base} dbname={name}"))
}
