//! What the tests that run several `vilvona` processes share: the binary, on a state directory.

use std::path::Path;
use std::process::{Command, Output};

/// `vilvona --state-dir STATE ARGS…`, with logs at their default level.
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
pub(crate) fn vilvona(state: &Path, args: &[&str]) -> Output {
    command(state, args).output().unwrap()
}
