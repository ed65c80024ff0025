//! How a host registers the engine: [`factory`] parses and checks the entry's settings,
//! places the store, and asks the host to build the summarizer the settings name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vilvona_core::registry::{EngineFactory, engine_factory};
use vilvona_core::summarize::{Summarizer, SummarizerConfig};
use vilvona_core::tokens::TokenEstimator;
use vilvona_core::{ContextEngine, EngineError};

use vilvona_store::{HistoryStore, PgStore, Store, StoreConfig, StoreError};

use crate::config::{EmbeddingSelection, LosslessConfig, StoreSelection};
use crate::engine::LosslessEngine;
use crate::errors::store_error;

/// Builds the summarizer a configuration names; the host provides it, since models are the
/// host's to reach.
pub type BuildSummarizer = Arc<
    dyn Fn(&SummarizerConfig, Arc<dyn TokenEstimator>) -> Result<Arc<dyn Summarizer>, EngineError>
        + Send
        + Sync,
>;

impl LosslessConfig {
    /// Where the embedded store lives: `store.dir`, else `storeDir`, else
    /// `<agent dir>/lossless`.
    pub fn store_path(&self, agent_dir: Option<&Path>) -> PathBuf {
        let configured = match &self.store {
            Some(StoreSelection::Sqlite { dir: Some(dir) }) => Some(dir),
            _ => self.store_dir.as_ref(),
        };
        match (configured, agent_dir) {
            (Some(dir), _) => PathBuf::from(dir),
            (None, Some(agent_dir)) => agent_dir.join("lossless"),
            (None, None) => PathBuf::from("lossless"),
        }
    }

    /// The embedding model the settings name (read from its file, for `file`).
    pub fn embedder(&self) -> Result<Option<Arc<dyn vilvona_store::Embedder>>, EngineError> {
        Ok(match &self.embedding {
            EmbeddingSelection::Builtin => vilvona_store::builtin_embedder(),
            EmbeddingSelection::File { path } => Some(Arc::new(
                vilvona_embed::StaticModel::load(Path::new(path)).map_err(|error| {
                    EngineError::InvalidConfig(format!(
                        "plugins.entries.lossless.config.embedding.path: {error}"
                    ))
                })?,
            )),
            EmbeddingSelection::None => None,
            EmbeddingSelection::OpenAi {
                base_url,
                model,
                api_key_env,
                dimensions,
                batch_size,
                timeout_ms,
                retries,
                backoff_ms,
                auth_cooldown_ms,
            } => {
                let api_key = match api_key_env {
                    Some(name) => Some(std::env::var(name).map_err(|_| {
                        EngineError::InvalidConfig(format!(
                            "plugins.entries.lossless.config.embedding.apiKeyEnv: the environment variable {name} is not set"
                        ))
                    })?),
                    None => None,
                };
                let settings = vilvona_embed::RemoteSettings {
                    base_url: base_url.clone(),
                    model: model.clone(),
                    api_key,
                    dimensions: *dimensions,
                    batch_size: *batch_size,
                    timeout: Duration::from_millis(*timeout_ms),
                    retries: *retries,
                    backoff: Duration::from_millis(*backoff_ms),
                    auth_cooldown: Duration::from_millis(*auth_cooldown_ms),
                };
                Some(Arc::new(
                    vilvona_embed::RemoteEmbedder::new(settings).map_err(|error| {
                        EngineError::InvalidConfig(format!(
                            "plugins.entries.lossless.config.embedding: {error}"
                        ))
                    })?,
                ))
            }
        })
    }

    /// Opens the store the settings select. `read_only` takes no writer's lock and creates
    /// nothing; `existing_only` declines when there is no store yet.
    pub async fn open_store(
        &self,
        agent_dir: Option<&Path>,
        read_only: bool,
        existing_only: bool,
    ) -> Result<Arc<dyn HistoryStore>, EngineError> {
        let embedder = self.embedder()?;
        let opened: Result<Arc<dyn HistoryStore>, StoreError> = match &self.store {
            Some(StoreSelection::Postgres { url }) => {
                // This node's recall index, beside where an embedded store would be.
                let index_dir = self.store_path(agent_dir).join("postgres-index");
                if existing_only || read_only {
                    match PgStore::open_read_only_with(url, Some(&index_dir), embedder.clone())
                        .await
                    {
                        Ok(store) if read_only => Ok(Arc::new(store)),
                        Ok(_) => PgStore::open_with(url, Some(&index_dir), embedder)
                            .await
                            .map(|store| Arc::new(store) as _),
                        Err(StoreError::NotFound { id, .. }) if existing_only => {
                            return Err(EngineError::refused(format!(
                                "no lossless store in the PostgreSQL database {id}"
                            )));
                        }
                        Err(error) => Err(error),
                    }
                } else {
                    PgStore::open_with(url, Some(&index_dir), embedder)
                        .await
                        .map(|store| Arc::new(store) as _)
                }
            }
            None | Some(StoreSelection::Sqlite { .. }) => {
                let dir = self.store_path(agent_dir);
                if existing_only && !dir.join(vilvona_store::DATABASE_FILE).exists() {
                    return Err(EngineError::refused(format!(
                        "no lossless store in {}",
                        dir.display()
                    )));
                }
                if read_only {
                    Store::open_read_only_with(&dir, embedder)
                        .await
                        .map(|store| Arc::new(store) as _)
                } else {
                    Store::open(StoreConfig {
                        embedder,
                        ..StoreConfig::new(&dir)
                    })
                    .await
                    .map(|store| Arc::new(store) as _)
                }
            }
        };
        opened.map_err(|error| store_error("opening the store", error))
    }
}

/// The engine's factory for a registry. It honours the factory context: read-only opens take
/// no writer's lock, and `existing_only` refuses to create a store that is not there.
pub fn factory(build_summarizer: BuildSummarizer) -> EngineFactory {
    engine_factory(move |context| {
        let build_summarizer = build_summarizer.clone();
        async move {
            let config = LosslessConfig::from_value(context.config.as_ref()).map_err(|error| {
                EngineError::InvalidConfig(error.located(context.origin.as_ref()))
            })?;
            let estimator =
                vilvona_summarize::estimator(config.tokenizer, config.tokenizer_multiplier);
            let summarizer = build_summarizer(
                config
                    .summarizer
                    .as_ref()
                    .unwrap_or(&SummarizerConfig::Extractive),
                estimator.clone(),
            )?;
            let store = config
                .open_store(
                    context.agent_dir.as_deref(),
                    context.read_only,
                    context.existing_only,
                )
                .await?;
            let engine: Arc<dyn ContextEngine> =
                Arc::new(LosslessEngine::new(store, summarizer, estimator, config));
            Ok(engine)
        }
    })
}
