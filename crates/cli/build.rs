//! Records the commit the binary is built from, for `vilvona --version`: `VILVONA_COMMIT` when
//! set (a packaging build from a source archive), else `git rev-parse`, else "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=VILVONA_COMMIT");
    let git_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
    for watched in ["HEAD", "index"] {
        let path = git_dir.join(watched);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let commit = std::env::var("VILVONA_COMMIT").ok().or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|output| output.status.success())
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty())
    });
    println!(
        "cargo:rustc-env=VILVONA_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
