//! The example engine, selected through the slot, passes the conformance kit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use vilvona_conformance::{
    Expectations, SessionFixture, check_contract, check_tool_pairs, legacy_stand_in_factory,
    sample_conversation,
};
use vilvona_core::registry::RegisterError;
use vilvona_core::*;
use window_engine::{ENGINE_ID, PLUGIN_ID, WindowConfig, WindowEngine};

fn registry() -> Registry {
    let registry = Registry::new();
    // The host registers its real `legacy` engine; this crate only knows the contract.
    registry
        .register(LEGACY_ENGINE_ID, Owner::Core, legacy_stand_in_factory())
        .unwrap();
    window_engine::register(&registry).unwrap();
    registry
}

#[tokio::test]
async fn the_contract_holds() {
    check_contract(
        &WindowEngine::new(WindowConfig::default()),
        &SessionFixture::new("window"),
        Expectations {
            stores_messages: true,
            passes_through: false,
        },
    )
    .await;
}

#[tokio::test]
async fn the_slot_selects_it_with_its_entry_config() {
    let registry = registry();
    let mut selection = EngineSelection::slot(ENGINE_ID);
    selection.entries.insert(
        PLUGIN_ID.to_owned(),
        EntrySettings {
            enabled: Some(true),
            config: Some(json!({"defaultTokenBudget": 50})),
            ..EntrySettings::default()
        },
    );
    let resolved = registry.resolve(&selection).await.unwrap();
    assert_eq!(resolved.source, SelectionSource::Configured);
    assert_eq!(resolved.engine.info().id, ENGINE_ID);
    assert!(registry.quarantines().is_empty());

    // With no budget from the host, the configured default (50 tokens) windows the history.
    let mut history = Vec::new();
    for _ in 0..6 {
        history.extend(sample_conversation());
    }
    let assembled = resolved
        .engine
        .assemble(&AssembleParams {
            session_id: "fresh".to_owned(),
            messages: history.clone().into(),
            ..AssembleParams::default()
        })
        .await
        .unwrap();
    assert!(
        assembled.estimated_tokens <= 50,
        "{}",
        assembled.estimated_tokens
    );
    assert!(assembled.messages.len() < history.len());
    check_tool_pairs(&assembled.messages).unwrap();
}

#[tokio::test]
async fn invalid_config_quarantines_at_factory_time() {
    let registry = registry();
    let mut selection = EngineSelection::slot(ENGINE_ID);
    selection.failure_policy = FailurePolicy::Strict;
    selection.entries.insert(
        PLUGIN_ID.to_owned(),
        EntrySettings {
            enabled: None,
            config: Some(json!({"defaultTokenBudget": 0})),
            ..EntrySettings::default()
        },
    );
    let error = registry.resolve(&selection).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("plugins.entries.window-engine.config.defaultTokenBudget must be positive"),
        "{error}"
    );
    assert_eq!(
        registry.quarantine_of(ENGINE_ID).unwrap().operation,
        Stage::Factory
    );
}

#[test]
fn a_plugin_cannot_register_as_legacy_or_twice() {
    let registry = registry();
    assert!(matches!(
        window_engine::register(&registry),
        Err(RegisterError::AlreadyRegistered { .. })
    ));
}

#[tokio::test]
async fn every_budget_keeps_the_window_within_budget_and_tool_pairs_intact() {
    let engine = WindowEngine::new(WindowConfig::default());
    let mut history = Vec::new();
    for _ in 0..10 {
        history.extend(sample_conversation());
    }
    for (index, message) in history.iter().enumerate() {
        engine
            .ingest(&IngestParams {
                session_id: "s".to_owned(),
                session_key: None,
                message: message.clone(),
                entry_id: Some(format!("e{index}")),
                is_heartbeat: false,
            })
            .await
            .unwrap();
    }
    for budget in 0..400 {
        let assembled = engine
            .assemble(&AssembleParams {
                session_id: "s".to_owned(),
                token_budget: Some(budget),
                ..AssembleParams::default()
            })
            .await
            .unwrap();
        assert!(assembled.estimated_tokens <= budget, "budget {budget}");
        check_tool_pairs(&assembled.messages).unwrap_or_else(|e| panic!("budget {budget}: {e}"));
    }
    let compacted = engine
        .compact(&CompactParams {
            session_id: "s".to_owned(),
            token_budget: Some(200),
            force: true,
            ..CompactParams::default()
        })
        .await
        .unwrap();
    assert!(compacted.compacted);
    let details = compacted.result.unwrap();
    assert!(details.tokens_after.unwrap() <= 100, "{details:?}");
}
