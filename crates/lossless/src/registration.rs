//! How a host registers the engine: [`factory`] parses and checks the entry's settings,
//! places the store, and asks the host to build the summarizer the settings name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vilvona_core::registry::{EngineFactory, engine_factory};
use vilvona_core::summarize::{Summarizer, SummarizerConfig};
use vilvona_core::tokens::TokenEstimator;
use vilvona_core::{ContextEngine, EngineError, error_chain};

use crate::config::LosslessConfig;
use crate::engine::LosslessEngine;

/// Builds the summarizer a configuration names; the host provides it, since models are the
/// host's to reach.
pub type BuildSummarizer = Arc<
    dyn Fn(&SummarizerConfig, Arc<dyn TokenEstimator>) -> Result<Arc<dyn Summarizer>, EngineError>
        + Send
        + Sync,
>;

impl LosslessConfig {
    /// Where the store lives: `storeDir`, else `<agent dir>/lossless`.
    pub fn store_path(&self, agent_dir: Option<&Path>) -> PathBuf {
        match (&self.store_dir, agent_dir) {
            (Some(dir), _) => PathBuf::from(dir),
            (None, Some(agent_dir)) => agent_dir.join("lossless"),
            (None, None) => PathBuf::from("lossless"),
        }
    }
}

/// The engine's factory for a registry. It honours the factory context: read-only opens take
/// no writer's lock, and `existing_only` refuses to create a store that is not there.
pub fn factory(build_summarizer: BuildSummarizer) -> EngineFactory {
    engine_factory(move |context| {
        let build_summarizer = build_summarizer.clone();
        async move {
            let config = LosslessConfig::from_value(context.config.as_ref())
                .map_err(|error| EngineError::InvalidConfig(error_chain(&error)))?;
            let estimator =
                vilvona_summarize::estimator(config.tokenizer, config.tokenizer_multiplier);
            let summarizer = build_summarizer(
                config
                    .summarizer
                    .as_ref()
                    .unwrap_or(&SummarizerConfig::Extractive),
                estimator.clone(),
            )?;
            let dir = config.store_path(context.agent_dir.as_deref());
            if context.existing_only && !dir.join(vilvona_store::DATABASE_FILE).exists() {
                return Err(EngineError::refused(format!(
                    "no lossless store in {}",
                    dir.display()
                )));
            }
            let engine = if context.read_only {
                LosslessEngine::open_read_only(&dir, config, summarizer, estimator).await?
            } else {
                LosslessEngine::open(&dir, config, summarizer, estimator).await?
            };
            let engine: Arc<dyn ContextEngine> = Arc::new(engine);
            Ok(engine)
        }
    })
}
