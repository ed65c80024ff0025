use tempfile::TempDir;
use vilvona_conformance::{Expectations, SessionFixture, check_contract};
use vilvona_runtime::{Host, HostOptions};

use crate::support::engine;

#[tokio::test]
async fn the_contract_holds() {
    let dir = TempDir::new().unwrap();
    check_contract(
        &engine(&dir).await,
        &SessionFixture::new("lossless"),
        Expectations {
            stores_messages: true,
            passes_through: false,
        },
    )
    .await;
}

#[tokio::test]
async fn the_contract_holds_through_the_runtime_host() {
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" }, entries: { lossless: { config: { freshTailCount: 16 } } } } }"#,
    )
    .unwrap();
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    assert_eq!(host.engine().active_id(), "lossless");
    assert!(host.registry().quarantines().is_empty());
    assert!(host.engine().engine.admin().is_some());
    check_contract(
        &*host.engine().engine,
        &SessionFixture::new("through-host"),
        Expectations {
            stores_messages: true,
            passes_through: false,
        },
    )
    .await;
}

#[tokio::test]
async fn invalid_settings_quarantine_at_factory_time() {
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" }, entries: { lossless: { config: { targetRatio: 1.5 } } } } }"#,
    )
    .unwrap();
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    assert_eq!(host.engine().active_id(), "legacy");
    let record = &host.registry().quarantines()[0];
    assert_eq!(record.operation.as_str(), "factory");
    assert!(
        record
            .reason
            .contains("plugins.entries.lossless.config.targetRatio (")
            && record
                .reason
                .contains("vilvona.json5:1:85) must be positive and below contextThreshold"),
        "{}",
        record.reason
    );
}
