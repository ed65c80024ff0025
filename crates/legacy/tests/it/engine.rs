use std::sync::Arc;

use vilvona_conformance::{Expectations, SessionFixture, check_contract, check_selection_table};
use vilvona_core::registry::engine_factory;
use vilvona_core::tokens::HeuristicEstimator;
use vilvona_core::{ContextEngine, EngineInfo};
use vilvona_legacy::{CompactionSettings, LegacyEngine};
use vilvona_summarize::ExtractiveSummarizer;

pub(crate) fn legacy() -> LegacyEngine {
    let estimator = Arc::new(HeuristicEstimator);
    LegacyEngine::new(
        CompactionSettings::default(),
        Arc::new(ExtractiveSummarizer::new(estimator.clone())),
        estimator,
    )
}

#[tokio::test]
async fn the_contract_holds() {
    check_contract(
        &legacy(),
        &SessionFixture::new("legacy"),
        Expectations {
            stores_messages: false,
            passes_through: true,
        },
    )
    .await;
}

#[tokio::test]
async fn the_selection_table_holds_with_the_real_legacy_engine() {
    check_selection_table(engine_factory(|_| async {
        let engine: Arc<dyn ContextEngine> = Arc::new(legacy());
        Ok(engine)
    }))
    .await;
}

#[test]
fn it_is_the_legacy_engine_openclaw_users_know() {
    let info: EngineInfo = legacy().info();
    assert_eq!(info.id, "legacy");
    assert_eq!(info.name, "Legacy Context Engine");
    assert!(!info.owns_compaction);
    assert!(info.host_requirements.is_empty());
}
