//! Registration, slot resolution, quarantine and failure policy.

use std::sync::Arc;

use vilvona_conformance::{
    Expectations, LegacyStandIn, ProbeEngine, SessionFixture, check_contract,
    check_selection_table, legacy_stand_in_factory,
};
use vilvona_core::registry::{RegisterError, RegisterOptions};
use vilvona_core::*;

fn probe_factory(engine: impl Fn() -> ProbeEngine + Send + Sync + 'static) -> EngineFactory {
    let engine = Arc::new(engine);
    engine_factory(move |_| {
        let engine = engine.clone();
        async move {
            let engine: Arc<dyn ContextEngine> = Arc::new(engine());
            Ok(engine)
        }
    })
}

fn registry_with_legacy() -> Registry {
    let registry = Registry::new();
    registry
        .register(LEGACY_ENGINE_ID, Owner::Core, legacy_stand_in_factory())
        .unwrap();
    registry
}

#[tokio::test]
async fn selection_table() {
    check_selection_table(legacy_stand_in_factory()).await;
}

#[tokio::test]
async fn the_contract_holds_for_the_legacy_stand_in() {
    check_contract(
        &LegacyStandIn,
        &SessionFixture::new("pass-through"),
        Expectations {
            stores_messages: false,
            passes_through: true,
        },
    )
    .await;
}

#[test]
fn only_the_core_registers_legacy() {
    let registry = Registry::new();
    let error = registry
        .register(
            LEGACY_ENGINE_ID,
            Owner::plugin("evil"),
            legacy_stand_in_factory(),
        )
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "context engine id \"legacy\" is reserved for the core; plugin:evil cannot register it"
    );
    registry
        .register(LEGACY_ENGINE_ID, Owner::Core, legacy_stand_in_factory())
        .unwrap();
}

#[test]
fn an_owner_cannot_take_another_owners_id() {
    let registry = registry_with_legacy();
    registry
        .register("lossless", Owner::plugin("a"), legacy_stand_in_factory())
        .unwrap();
    let taken = registry
        .register("lossless", Owner::plugin("b"), legacy_stand_in_factory())
        .unwrap_err();
    assert_eq!(
        taken,
        RegisterError::OwnedByOther {
            id: "lossless".to_owned(),
            existing_owner: Owner::plugin("a")
        }
    );
    let again = registry
        .register("lossless", Owner::plugin("a"), legacy_stand_in_factory())
        .unwrap_err();
    assert!(
        matches!(again, RegisterError::AlreadyRegistered { .. }),
        "{again}"
    );
    registry
        .register_with(
            "lossless",
            Owner::plugin("a"),
            legacy_stand_in_factory(),
            RegisterOptions {
                allow_same_owner_refresh: true,
                ..RegisterOptions::default()
            },
        )
        .unwrap();
    assert_eq!(
        registry.register(" ", Owner::plugin("a"), legacy_stand_in_factory()),
        Err(RegisterError::EmptyId)
    );
    let listed: Vec<(String, String)> = registry
        .engines()
        .into_iter()
        .map(|engine| (engine.id, engine.owner.to_string()))
        .collect();
    assert_eq!(
        listed,
        [
            ("legacy".to_owned(), "core".to_owned()),
            ("lossless".to_owned(), "plugin:a".to_owned())
        ]
    );
    assert_eq!(registry.unregister_owner(&Owner::plugin("a")), ["lossless"]);
    assert_eq!(registry.engines().len(), 1);
}

#[tokio::test]
async fn without_legacy_resolution_names_the_available_engines() {
    let registry = Registry::new();
    registry
        .register("window", Owner::plugin("w"), legacy_stand_in_factory())
        .unwrap();
    let error = registry
        .resolve(&EngineSelection::default())
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Context engine \"legacy\" is not registered. Available engines: window"
    );
}

#[tokio::test]
async fn a_quarantine_records_engine_owner_operation_reason_and_time() {
    let registry = registry_with_legacy();
    registry
        .register(
            "probe",
            Owner::plugin("probe-plugin"),
            probe_factory(|| ProbeEngine {
                fail_at: vec![Stage::Assemble],
                ..ProbeEngine::default()
            }),
        )
        .unwrap();
    let resolved = registry
        .resolve(&EngineSelection::slot("probe"))
        .await
        .unwrap();
    assert_eq!(resolved.source, SelectionSource::Configured);
    assert!(resolved.engine.info().owns_compaction);

    let host_messages = vec![AgentMessage::user_text("keep going")];
    let assembled = resolved
        .engine
        .assemble(&AssembleParams {
            session_id: "s".to_owned(),
            messages: host_messages.clone().into(),
            ..AssembleParams::default()
        })
        .await
        .unwrap();
    // Legacy served the retry: the host's messages, unchanged, estimate 0.
    assert_eq!(assembled.messages, host_messages);
    assert_eq!(assembled.estimated_tokens, 0);
    assert_eq!(resolved.active_id(), "legacy");
    // After quarantine, info reads legacy's, so the host stops treating compaction as owned.
    assert!(!resolved.engine.info().owns_compaction);

    let records = registry.quarantines();
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.engine_id, "probe");
    assert_eq!(record.owner, Some(Owner::plugin("probe-plugin")));
    assert_eq!(record.operation, Stage::Assemble);
    assert_eq!(record.reason, "probe failed during assemble");
    assert!(record.failed_at_ms > 1_700_000_000_000);
    let json = serde_json::to_value(record).unwrap();
    assert_eq!(json["owner"], "plugin:probe-plugin");
    assert_eq!(json["operation"], "assemble");

    // A later resolution of the same slot goes straight to legacy.
    let again = registry
        .resolve(&EngineSelection::slot("probe"))
        .await
        .unwrap();
    assert_eq!(again.source, SelectionSource::Quarantined);
    assert_eq!(again.engine.info().id, "legacy");

    // Re-registering the engine (a plugin reload) lifts the quarantine.
    registry
        .register_with(
            "probe",
            Owner::plugin("probe-plugin"),
            probe_factory(ProbeEngine::default),
            RegisterOptions {
                allow_same_owner_refresh: true,
                ..RegisterOptions::default()
            },
        )
        .unwrap();
    assert!(registry.quarantines().is_empty());
    let healed = registry
        .resolve(&EngineSelection::slot("probe"))
        .await
        .unwrap();
    assert_eq!(healed.engine.info().id, "probe");
}

#[tokio::test]
async fn the_factory_receives_its_entry_config_and_directories() {
    let registry = registry_with_legacy();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen_in_factory = seen.clone();
    registry
        .register(
            "probe",
            Owner::plugin("probe-plugin"),
            engine_factory(move |context| {
                *seen_in_factory.lock().unwrap() = Some(context);
                async {
                    let engine: Arc<dyn ContextEngine> = Arc::new(ProbeEngine::default());
                    Ok(engine)
                }
            }),
        )
        .unwrap();
    let mut selection = EngineSelection::slot("probe");
    selection.entries.insert(
        "probe-plugin".to_owned(),
        EntrySettings {
            enabled: Some(true),
            config: Some(serde_json::json!({"freshTailCount": 8})),
            origin: None,
        },
    );
    selection.agent_dir = Some("/agents/main".into());
    selection.workspace_dir = Some("/work".into());
    registry.resolve(&selection).await.unwrap();
    let context = seen.lock().unwrap().clone().unwrap();
    assert_eq!(
        context.config,
        Some(serde_json::json!({"freshTailCount": 8}))
    );
    assert_eq!(context.agent_dir, Some("/agents/main".into()));
    assert_eq!(context.workspace_dir, Some("/work".into()));
}

#[tokio::test]
async fn a_factory_error_is_named_with_its_causes() {
    let registry = registry_with_legacy();
    registry
        .register(
            "lossless",
            Owner::plugin("lossless"),
            engine_factory(|_| async {
                Err(EngineError::caused_by(
                    "opening the store",
                    std::io::Error::other("disk full"),
                ))
            }),
        )
        .unwrap();
    let resolved = registry
        .resolve(&EngineSelection::slot("lossless"))
        .await
        .unwrap();
    assert_eq!(resolved.engine.info().id, "legacy");
    let record = registry.quarantine_of("lossless").unwrap();
    assert_eq!(record.operation, Stage::Factory);
    assert_eq!(record.reason, "opening the store: disk full");
}
