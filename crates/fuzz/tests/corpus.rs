//! Every stored corpus input (and every crash input kept under `fuzz/artifacts/`, if any)
//! through its target's body, on the stable toolchain.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

#[test]
fn the_corpus_runs_clean_through_every_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut inputs = 0;
    for target in vilvona_fuzz::TARGETS {
        for kind in ["corpus", "artifacts"] {
            let Ok(entries) = std::fs::read_dir(root.join(kind).join(target)) else {
                continue;
            };
            for entry in entries.flatten() {
                let data = std::fs::read(entry.path()).unwrap();
                vilvona_fuzz::run(target, &data);
                inputs += 1;
            }
        }
    }
    assert!(
        inputs >= 5 * vilvona_fuzz::TARGETS.len(),
        "only {inputs} corpus inputs"
    );
}
