//! Host requirements fail closed with a message that names everything.

use vilvona_conformance::check_host_requirement_table;
use vilvona_core::{Capability, HostProfile};

#[test]
fn host_requirement_table() {
    check_host_requirement_table();
}

#[test]
fn the_embedded_host_advertises_every_capability() {
    let embedded = HostProfile::embedded();
    for capability in Capability::ALL {
        assert!(embedded.capabilities.contains(&capability), "{capability}");
    }
    let cli = HostProfile::cli("claude-cli");
    assert_eq!(
        cli.capabilities
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>(),
        ["bootstrap", "after-turn", "maintain"]
    );
}
