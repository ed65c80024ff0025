//! The engine registry, slot resolution, and quarantine.
//!
//! Hosts register engine factories under an id and an owner, then resolve the value of the
//! `contextEngine` slot to one engine. A plugin engine that is missing, fails its factory, fails
//! contract validation, or fails a lifecycle call is *quarantined* for the life of the registry
//! (the process) and `legacy` serves in its place, unless the failure policy is `strict`.
//!
//! The registry does not know the built-in `legacy` engine: the host registers it, under the
//! [`Owner::Core`] owner, like any other engine. That keeps this crate free of engine code.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::admin::{EngineAdmin, ToolCaller, ToolDefinition};
use crate::engine::*;

/// The id of the default engine every failure falls back to.
pub const LEGACY_ENGINE_ID: &str = "legacy";

/// A boxed, sendable future (factories are async: opening a store is IO).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a factory receives: the engine's own config entry and the agent's directories.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FactoryContext {
    /// `plugins.entries.<id>.config`, when present.
    pub config: Option<Value>,
    /// The agent's directory (engines keep their storage under it).
    pub agent_dir: Option<PathBuf>,
    /// The agent's workspace.
    pub workspace_dir: Option<PathBuf>,
    /// The host only reads (an inspection command beside a running gateway): the engine opens
    /// its storage without creating anything or taking any writer's lock, and refuses writes.
    pub read_only: bool,
    /// The host inspects an engine that is not the active one: it opens storage that exists
    /// and refuses (creating nothing) when there is none.
    pub existing_only: bool,
    /// Where [`config`](Self::config) was written, for errors that point at a key.
    pub origin: Option<SettingsOrigin>,
}

/// Creates an engine instance.
pub type EngineFactory = Arc<
    dyn Fn(FactoryContext) -> BoxFuture<'static, Result<Arc<dyn ContextEngine>, EngineError>>
        + Send
        + Sync,
>;

/// Wraps an async closure as an [`EngineFactory`].
pub fn engine_factory<F, Fut>(factory: F) -> EngineFactory
where
    F: Fn(FactoryContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<dyn ContextEngine>, EngineError>> + Send + 'static,
{
    Arc::new(move |context| Box::pin(factory(context)))
}

/// Who registered an engine.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    /// The host itself; the only owner allowed to register `legacy`.
    Core,
    /// A plugin, by plugin id.
    Plugin(String),
}

impl Owner {
    /// A plugin owner.
    pub fn plugin(id: impl Into<String>) -> Owner {
        Owner::Plugin(id.into())
    }

    fn plugin_id(&self) -> Option<&str> {
        match self {
            Owner::Core => None,
            Owner::Plugin(id) => Some(id),
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Core => f.write_str("core"),
            Owner::Plugin(id) => write!(f, "plugin:{id}"),
        }
    }
}

impl Serialize for Owner {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// An empty id.
    #[error("a context engine id must not be empty")]
    EmptyId,
    /// Only the core may register `legacy`.
    #[error("context engine id \"{id}\" is reserved for the core; {owner} cannot register it")]
    ReservedDefault {
        /// The id.
        id: String,
        /// Who tried.
        owner: Owner,
    },
    /// Another owner holds the id.
    #[error("context engine \"{id}\" is already registered by {existing_owner}")]
    OwnedByOther {
        /// The id.
        id: String,
        /// Who holds it.
        existing_owner: Owner,
    },
    /// The same owner registered it already (and did not ask to replace it).
    #[error(
        "context engine \"{id}\" is already registered by {owner}; pass allow_same_owner_refresh to replace it"
    )]
    AlreadyRegistered {
        /// The id.
        id: String,
        /// Who holds it (and tried again).
        owner: Owner,
    },
}

/// Options for [`Registry::register_with`].
#[derive(Clone, Debug, Default)]
pub struct RegisterOptions {
    /// Let the same owner replace its own registration (plugin reload).
    pub allow_same_owner_refresh: bool,
    /// The tools the engine's instances offer, declared up front (like a plugin manifest's
    /// tool contracts) so a host can list them before any instance exists.
    pub tools: Vec<ToolDefinition>,
}

/// What to do when the selected engine fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Quarantine the engine and let `legacy` serve (OpenClaw's behaviour).
    #[default]
    Fallback,
    /// Fail the run instead of silently substituting `legacy`.
    Strict,
}

/// The plugin settings for one entry of `plugins.entries`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EntrySettings {
    /// `enabled: false` selects `legacy` silently.
    pub enabled: Option<bool>,
    /// Handed to the factory as [`FactoryContext::config`].
    pub config: Option<Value>,
    /// Where `config` was written (handed on as [`FactoryContext::origin`]).
    pub origin: Option<SettingsOrigin>,
}

/// Where an entry's settings were written: the file, the entry's own key
/// (`plugins.entries.<id>.config`), and the line and column of each key inside it (by dotted
/// path relative to it), so an engine's error can say which key and where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingsOrigin {
    /// The configuration file.
    pub file: PathBuf,
    /// The entry's key in it.
    pub key: String,
    /// Line and column (1-based) of each key inside the entry's settings.
    pub positions: BTreeMap<String, (usize, usize)>,
}

impl SettingsOrigin {
    /// `plugins.entries.lossless.config.freshTailCount (FILE:5:29)` for a key inside the
    /// settings (an empty key names the settings themselves).
    pub fn describe(&self, key: &str) -> String {
        let whole = if key.is_empty() {
            self.key.clone()
        } else {
            format!("{}.{key}", self.key)
        };
        match self.positions.get(key) {
            Some((line, column)) => format!("{whole} ({}:{line}:{column})", self.file.display()),
            None => format!("{whole} ({})", self.file.display()),
        }
    }
}

/// What the host's configuration says about engine selection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineSelection {
    /// `plugins.slots.contextEngine`.
    pub slot: Option<String>,
    /// `plugins.entries`, keyed by plugin id (or engine id).
    pub entries: BTreeMap<String, EntrySettings>,
    /// What happens when the selected engine fails.
    pub failure_policy: FailurePolicy,
    /// The agent's directories, handed to the factory.
    pub agent_dir: Option<PathBuf>,
    /// The agent's workspace.
    pub workspace_dir: Option<PathBuf>,
    /// Handed to the factory as [`FactoryContext::read_only`].
    pub read_only: bool,
    /// Handed to the factory as [`FactoryContext::existing_only`].
    pub existing_only: bool,
}

impl EngineSelection {
    /// A selection of `slot` with everything else default.
    pub fn slot(slot: impl Into<String>) -> EngineSelection {
        EngineSelection {
            slot: Some(slot.into()),
            ..EngineSelection::default()
        }
    }

    /// The engine id the slot asks for, or `None` for the default.
    pub fn requested_id(&self) -> Option<&str> {
        match self.slot.as_deref().map(str::trim) {
            None | Some("") | Some(LEGACY_ENGINE_ID) | Some("none") => None,
            Some(id) => Some(id),
        }
    }

    fn entry_for(&self, engine_id: &str, owner: Option<&Owner>) -> Option<&EntrySettings> {
        owner
            .and_then(Owner::plugin_id)
            .and_then(|plugin_id| self.entries.get(plugin_id))
            .or_else(|| self.entries.get(engine_id))
    }
}

/// The stage of work at which an engine failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    /// Finding the engine.
    Resolve,
    /// Its factory.
    Factory,
    /// Checking what the factory returned.
    ContractValidation,
    /// `bootstrap`.
    Bootstrap,
    /// `ingest`.
    Ingest,
    /// `ingest_batch`.
    IngestBatch,
    /// `after_turn`.
    AfterTurn,
    /// `assemble`.
    Assemble,
    /// `compact`.
    Compact,
    /// `maintain`.
    Maintain,
    /// `commit_turn`.
    CommitTurn,
    /// `prepare_subagent_spawn`.
    PrepareSubagentSpawn,
    /// `on_subagent_ended`.
    OnSubagentEnded,
    /// `on_session_reset`.
    OnSessionReset,
    /// `call_tool`.
    CallTool,
}

impl Stage {
    /// Its name in logs and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Resolve => "resolve",
            Stage::Factory => "factory",
            Stage::ContractValidation => "contract-validation",
            Stage::Bootstrap => "bootstrap",
            Stage::Ingest => "ingest",
            Stage::IngestBatch => "ingestBatch",
            Stage::AfterTurn => "afterTurn",
            Stage::Assemble => "assemble",
            Stage::Compact => "compact",
            Stage::Maintain => "maintain",
            Stage::CommitTurn => "commitTurn",
            Stage::PrepareSubagentSpawn => "prepareSubagentSpawn",
            Stage::OnSubagentEnded => "onSubagentEnded",
            Stage::OnSessionReset => "onSessionReset",
            Stage::CallTool => "callTool",
        }
    }

    /// Failures here are returned to the caller instead of retried on `legacy`: retrying a
    /// compaction or a spawn preparation on another engine would act on state the failed
    /// engine may already have touched, and a tool belongs to the engine that offered it.
    fn rethrows(self) -> bool {
        matches!(
            self,
            Stage::Compact | Stage::PrepareSubagentSpawn | Stage::CallTool
        )
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One quarantined engine: the first failure that put it there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRecord {
    /// The engine quarantined.
    pub engine_id: String,
    /// Who registered it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// Where it failed.
    pub operation: Stage,
    /// The failure, one line.
    pub reason: String,
    /// Milliseconds since the epoch.
    pub failed_at_ms: u64,
}

/// A registered engine, for listings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegisteredEngine {
    /// The id it is registered under.
    pub id: String,
    /// Who registered it.
    pub owner: Owner,
}

/// Why resolution could not produce any engine.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No `legacy` to fall back to.
    #[error(
        "Context engine \"{LEGACY_ENGINE_ID}\" is not registered. Available engines: {available}"
    )]
    DefaultNotRegistered {
        /// The engines that are registered.
        available: String,
    },
    /// `legacy`'s factory failed.
    #[error("the default context engine \"{LEGACY_ENGINE_ID}\" failed to start")]
    DefaultFactory(#[source] EngineError),
    /// Failure policy `strict`: the selected engine failed and nothing was substituted.
    #[error(
        "context engine \"{engine_id}\" failed during {operation}: {reason} (failure policy is strict, so \"{LEGACY_ENGINE_ID}\" was not substituted)"
    )]
    Strict {
        /// The engine.
        engine_id: String,
        /// Where it failed.
        operation: Stage,
        /// The failure, one line.
        reason: String,
    },
    /// [`Registry::instantiate`]: the selected engine could not be created. Nothing was
    /// quarantined and nothing substituted; the caller may try again.
    #[error("context engine \"{engine_id}\" could not start ({operation}): {reason}")]
    Unavailable {
        /// The engine.
        engine_id: String,
        /// Where it failed.
        operation: Stage,
        /// The failure, one line.
        reason: String,
    },
    /// [`Registry::instantiate`]: the selected engine could not start for a passing reason
    /// (its factory's error is transient: a database busy, or held by another process that
    /// must let go of it first). The same call may succeed later; nothing is broken.
    #[error("context engine \"{engine_id}\" could not start now: {reason}")]
    Passing {
        /// The engine.
        engine_id: String,
        /// The failure, one line.
        reason: String,
    },
    /// [`Registry::instantiate`]: the factory declined, as the context allowed it to (no
    /// storage to open for [`FactoryContext::existing_only`]). Nothing failed.
    #[error("context engine \"{engine_id}\" declined: {reason}")]
    Declined {
        /// The engine.
        engine_id: String,
        /// What it said.
        reason: String,
    },
}

/// Where the active engine came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SelectionSource {
    /// The slot is unset, empty, `legacy` or `none`.
    Default,
    /// The slot names a plugin engine whose entry is disabled.
    Disabled,
    /// The slot names an engine and it resolved.
    Configured,
    /// The slot names an engine that is quarantined; `legacy` serves.
    Quarantined,
}

/// The result of resolving the slot.
#[derive(Clone)]
pub struct ResolvedEngine {
    /// The engine to drive: the selected engine behind its quarantine guard, or `legacy`.
    pub engine: Arc<dyn ContextEngine>,
    /// The id the slot asked for after normalization (`legacy` for the default).
    pub selected_id: String,
    /// Where the selection came from.
    pub source: SelectionSource,
    registry: Registry,
}

impl fmt::Debug for ResolvedEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedEngine")
            .field("selected_id", &self.selected_id)
            .field("source", &self.source)
            .field("active_id", &self.active_id())
            .finish()
    }
}

impl ResolvedEngine {
    /// The id of the engine currently serving: the selected one, or `legacy` when its entry is
    /// disabled or it is quarantined.
    pub fn active_id(&self) -> String {
        let replaced = matches!(
            self.source,
            SelectionSource::Disabled | SelectionSource::Quarantined
        ) || (self.selected_id != LEGACY_ENGINE_ID && self.is_quarantined());
        if replaced {
            LEGACY_ENGINE_ID.to_owned()
        } else {
            self.selected_id.clone()
        }
    }

    /// True when the selected engine has been quarantined (at resolution or since).
    pub fn is_quarantined(&self) -> bool {
        self.registry.quarantine_of(&self.selected_id).is_some()
    }
}

struct Registration {
    owner: Owner,
    factory: EngineFactory,
    tools: Vec<ToolDefinition>,
}

#[derive(Default)]
struct RegistryState {
    engines: RwLock<BTreeMap<String, Registration>>,
    quarantines: Mutex<BTreeMap<String, QuarantineRecord>>,
}

/// The process-wide set of engine factories and quarantines. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct Registry {
    state: Arc<RegistryState>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("engines", &self.engines())
            .field("quarantines", &self.quarantines())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers a factory under `id`. See [`Registry::register_with`] for the rules.
    pub fn register(
        &self,
        id: &str,
        owner: Owner,
        factory: EngineFactory,
    ) -> Result<(), RegisterError> {
        self.register_with(id, owner, factory, RegisterOptions::default())
    }

    /// Registers a factory. Only [`Owner::Core`] may register `legacy`; an owner cannot take an
    /// id another owner holds; the same owner replaces its registration only when
    /// `allow_same_owner_refresh` is set. A successful registration lifts that id's quarantine.
    pub fn register_with(
        &self,
        id: &str,
        owner: Owner,
        factory: EngineFactory,
        options: RegisterOptions,
    ) -> Result<(), RegisterError> {
        let id = id.trim();
        if id.is_empty() {
            return Err(RegisterError::EmptyId);
        }
        if id == LEGACY_ENGINE_ID && owner != Owner::Core {
            return Err(RegisterError::ReservedDefault {
                id: id.to_owned(),
                owner,
            });
        }
        let mut engines = self
            .state
            .engines
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = engines.get(id) {
            if existing.owner != owner {
                return Err(RegisterError::OwnedByOther {
                    id: id.to_owned(),
                    existing_owner: existing.owner.clone(),
                });
            }
            if !options.allow_same_owner_refresh {
                return Err(RegisterError::AlreadyRegistered {
                    id: id.to_owned(),
                    owner,
                });
            }
        }
        engines.insert(
            id.to_owned(),
            Registration {
                owner,
                factory,
                tools: options.tools,
            },
        );
        drop(engines);
        self.clear_quarantine(id);
        Ok(())
    }

    /// Removes every engine an owner registered (plugin unload).
    pub fn unregister_owner(&self, owner: &Owner) -> Vec<String> {
        let mut engines = self
            .state
            .engines
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let removed: Vec<String> = engines
            .iter()
            .filter(|(_, registration)| &registration.owner == owner)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &removed {
            engines.remove(id);
        }
        drop(engines);
        for id in &removed {
            self.clear_quarantine(id);
        }
        removed
    }

    /// Registered engines, sorted by id.
    pub fn engines(&self) -> Vec<RegisteredEngine> {
        self.state
            .engines
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(id, registration)| RegisteredEngine {
                id: id.clone(),
                owner: registration.owner.clone(),
            })
            .collect()
    }

    /// Current quarantines, oldest first.
    pub fn quarantines(&self) -> Vec<QuarantineRecord> {
        let mut records: Vec<QuarantineRecord> = self
            .state
            .quarantines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        records.sort_by_key(|record| record.failed_at_ms);
        records
    }

    /// The quarantine record of an engine id, if it is quarantined.
    pub fn quarantine_of(&self, engine_id: &str) -> Option<QuarantineRecord> {
        self.state
            .quarantines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(engine_id)
            .cloned()
    }

    /// Lifts a quarantine (operator repair); returns whether there was one.
    pub fn clear_quarantine(&self, engine_id: &str) -> bool {
        self.state
            .quarantines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(engine_id)
            .is_some()
    }

    /// Records a quarantine unless one exists (the first failure is the one kept), and logs it.
    fn quarantine(&self, engine_id: &str, owner: Option<&Owner>, operation: Stage, reason: &str) {
        let mut quarantines = self
            .state
            .quarantines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if quarantines.contains_key(engine_id) {
            return;
        }
        let reason = sanitize_for_log(reason);
        tracing::error!(
            target: "vilvona::context_engine",
            "Context engine \"{}\" owner={} failed during {}: {}; quarantining it for this process and falling back to default engine \"{}\".",
            sanitize_for_log(engine_id),
            owner.map_or_else(|| "unknown".to_owned(), Owner::to_string),
            operation,
            reason,
            LEGACY_ENGINE_ID,
        );
        quarantines.insert(
            engine_id.to_owned(),
            QuarantineRecord {
                engine_id: engine_id.to_owned(),
                owner: owner.cloned(),
                operation,
                reason,
                failed_at_ms: crate::clock::now_ms().max(0) as u64,
            },
        );
    }

    /// The tools a registered engine declared it offers (none for an unknown id).
    pub fn declared_tools(&self, id: &str) -> Vec<ToolDefinition> {
        self.state
            .engines
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id.trim())
            .map(|registration| registration.tools.clone())
            .unwrap_or_default()
    }

    fn registration(&self, id: &str) -> Option<(Owner, EngineFactory)> {
        self.state
            .engines
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .map(|registration| (registration.owner.clone(), registration.factory.clone()))
    }

    fn available(&self) -> String {
        let ids: Vec<String> = self.engines().into_iter().map(|engine| engine.id).collect();
        if ids.is_empty() {
            "(none)".to_owned()
        } else {
            ids.join(", ")
        }
    }

    /// Creates the default engine. Strict: if `legacy` itself fails there is nothing further.
    pub async fn resolve_default(
        &self,
        selection: &EngineSelection,
    ) -> Result<Arc<dyn ContextEngine>, ResolveError> {
        let Some((_, factory)) = self.registration(LEGACY_ENGINE_ID) else {
            return Err(ResolveError::DefaultNotRegistered {
                available: self.available(),
            });
        };
        let entry = selection.entries.get(LEGACY_ENGINE_ID);
        let context = FactoryContext {
            config: entry.and_then(|entry| entry.config.clone()),
            origin: entry.and_then(|entry| entry.origin.clone()),
            agent_dir: selection.agent_dir.clone(),
            workspace_dir: selection.workspace_dir.clone(),
            read_only: selection.read_only,
            existing_only: selection.existing_only,
        };
        factory(context).await.map_err(ResolveError::DefaultFactory)
    }

    /// Resolves the slot to an engine, following the selection policy:
    ///
    /// - unset, `""`, `"legacy"`, `"none"` → `legacy`;
    /// - the selected engine's entry has `enabled: false` → `legacy`, silently (no quarantine,
    ///   the factory is not called);
    /// - already quarantined → `legacy`;
    /// - not registered, factory error, or invalid contract (empty id or name) → quarantine and
    ///   `legacy` (or [`ResolveError::Strict`] under the strict policy);
    /// - otherwise the engine, wrapped so that a failing lifecycle call quarantines it.
    pub async fn resolve(
        &self,
        selection: &EngineSelection,
    ) -> Result<ResolvedEngine, ResolveError> {
        let Some(requested) = selection.requested_id() else {
            return self
                .resolved_default(selection, LEGACY_ENGINE_ID, SelectionSource::Default)
                .await;
        };
        let registration = self.registration(requested);
        let owner = registration.as_ref().map(|(owner, _)| owner.clone());
        let entry = selection.entry_for(requested, owner.as_ref());
        if entry.and_then(|entry| entry.enabled) == Some(false) {
            return self
                .resolved_default(selection, requested, SelectionSource::Disabled)
                .await;
        }
        if let Some(record) = self.quarantine_of(requested) {
            return match selection.failure_policy {
                FailurePolicy::Fallback => {
                    self.resolved_default(selection, requested, SelectionSource::Quarantined)
                        .await
                }
                FailurePolicy::Strict => Err(ResolveError::Strict {
                    engine_id: requested.to_owned(),
                    operation: record.operation,
                    reason: record.reason,
                }),
            };
        }

        let (stage, reason) = match registration {
            None => (
                Stage::Resolve,
                format!(
                    "Context engine \"{requested}\" is not registered. Available engines: {}",
                    self.available()
                ),
            ),
            Some((owner, factory)) => {
                let context = FactoryContext {
                    config: entry.and_then(|entry| entry.config.clone()),
                    origin: entry.and_then(|entry| entry.origin.clone()),
                    agent_dir: selection.agent_dir.clone(),
                    workspace_dir: selection.workspace_dir.clone(),
                    read_only: selection.read_only,
                    existing_only: selection.existing_only,
                };
                match factory(context).await {
                    Err(error) => (Stage::Factory, error_chain(&error)),
                    Ok(engine) => match contract_problems(&engine.info()) {
                        Some(problems) => (
                            Stage::ContractValidation,
                            format!(
                                "Context engine \"{requested}\" factory returned an invalid ContextEngine: {problems}."
                            ),
                        ),
                        None => {
                            return self
                                .guarded(
                                    selection,
                                    requested,
                                    owner,
                                    engine,
                                    selection.failure_policy,
                                )
                                .await;
                        }
                    },
                }
            }
        };
        self.quarantine(requested, owner.as_ref(), stage, &reason);
        match selection.failure_policy {
            FailurePolicy::Fallback => {
                self.resolved_default(selection, requested, SelectionSource::Quarantined)
                    .await
            }
            FailurePolicy::Strict => Err(ResolveError::Strict {
                engine_id: requested.to_owned(),
                operation: stage,
                reason,
            }),
        }
    }

    /// Creates the selected engine with no quarantine guard and no fallback, for a process
    /// whose own host applies the failure policy (`vilvona serve` inside OpenClaw: substituting
    /// an engine behind the host's back would leave it believing the selected engine owns
    /// compaction). A slot that selects the default, or a disabled entry, gives `legacy`; an
    /// engine that cannot be created is [`ResolveError::Unavailable`], and nothing is recorded,
    /// so a later call may try again.
    pub async fn instantiate(
        &self,
        selection: &EngineSelection,
    ) -> Result<Arc<dyn ContextEngine>, ResolveError> {
        let Some(requested) = selection.requested_id() else {
            return self.resolve_default(selection).await;
        };
        let unavailable = |operation, reason| ResolveError::Unavailable {
            engine_id: requested.to_owned(),
            operation,
            reason,
        };
        let Some((owner, factory)) = self.registration(requested) else {
            return Err(unavailable(
                Stage::Resolve,
                format!(
                    "it is not registered. Available engines: {}",
                    self.available()
                ),
            ));
        };
        let entry = selection.entry_for(requested, Some(&owner));
        if entry.and_then(|entry| entry.enabled) == Some(false) {
            return self.resolve_default(selection).await;
        }
        let context = FactoryContext {
            config: entry.and_then(|entry| entry.config.clone()),
            origin: entry.and_then(|entry| entry.origin.clone()),
            agent_dir: selection.agent_dir.clone(),
            workspace_dir: selection.workspace_dir.clone(),
            read_only: selection.read_only,
            existing_only: selection.existing_only,
        };
        let engine = factory(context).await.map_err(|error| match error {
            EngineError::Refused(reason) => ResolveError::Declined {
                engine_id: requested.to_owned(),
                reason: reason.to_string(),
            },
            error if error.is_transient() => ResolveError::Passing {
                engine_id: requested.to_owned(),
                reason: error_chain(&error),
            },
            error => unavailable(Stage::Factory, error_chain(&error)),
        })?;
        match contract_problems(&engine.info()) {
            Some(problems) => Err(unavailable(
                Stage::ContractValidation,
                format!("the factory returned an invalid ContextEngine: {problems}"),
            )),
            None => Ok(engine),
        }
    }

    /// Resolves the slot for a caller that asked for this engine explicitly (the command
    /// line): the selected engine or an error, never a silent substitute. Like
    /// [`Registry::instantiate`] nothing is quarantined when it cannot start; once it runs,
    /// its failures are returned (failure policy `strict`).
    pub async fn resolve_required(
        &self,
        selection: &EngineSelection,
    ) -> Result<ResolvedEngine, ResolveError> {
        let Some(requested) = selection.requested_id() else {
            return self
                .resolved_default(selection, LEGACY_ENGINE_ID, SelectionSource::Default)
                .await;
        };
        let owner = self.registration(requested).map(|(owner, _)| owner);
        if selection
            .entry_for(requested, owner.as_ref())
            .and_then(|entry| entry.enabled)
            == Some(false)
        {
            return self
                .resolved_default(selection, requested, SelectionSource::Disabled)
                .await;
        }
        let engine = self.instantiate(selection).await?;
        self.guarded(
            selection,
            requested,
            owner.unwrap_or(Owner::Core),
            engine,
            FailurePolicy::Strict,
        )
        .await
    }

    /// The selected engine behind its quarantine guard.
    async fn guarded(
        &self,
        selection: &EngineSelection,
        requested: &str,
        owner: Owner,
        engine: Arc<dyn ContextEngine>,
        policy: FailurePolicy,
    ) -> Result<ResolvedEngine, ResolveError> {
        let guarded = GuardedEngine {
            registered_id: requested.to_owned(),
            owner,
            inner: engine,
            fallback: self.resolve_default(selection).await?,
            registry: self.clone(),
            policy,
        };
        Ok(ResolvedEngine {
            engine: Arc::new(guarded),
            selected_id: requested.to_owned(),
            source: SelectionSource::Configured,
            registry: self.clone(),
        })
    }

    async fn resolved_default(
        &self,
        selection: &EngineSelection,
        selected_id: &str,
        source: SelectionSource,
    ) -> Result<ResolvedEngine, ResolveError> {
        Ok(ResolvedEngine {
            engine: self.resolve_default(selection).await?,
            selected_id: selected_id.to_owned(),
            source,
            registry: self.clone(),
        })
    }
}

/// What is wrong with an engine's `info`, if anything.
fn contract_problems(info: &EngineInfo) -> Option<String> {
    let mut problems = Vec::new();
    if info.id.trim().is_empty() {
        problems.push("missing info.id");
    }
    if info.name.trim().is_empty() {
        problems.push("missing info.name");
    }
    (!problems.is_empty()).then(|| problems.join(", "))
}

/// An error and its sources, on one line (each cause once: `error: cause: cause`).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Keeps log lines one line long and bounded: control characters become spaces.
fn sanitize_for_log(text: &str) -> String {
    const MAX_CHARS: usize = 2_000;
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_CHARS)
        .collect();
    if text.chars().count() > MAX_CHARS {
        out.push('…');
    }
    out
}

// --- the quarantine guard -----------------------------------------------------------------------

/// A selected engine behind the quarantine rules. Each call either goes to the engine or, once
/// it is quarantined, to `legacy`; a failing call quarantines the engine and (except for
/// `compact` and `prepare_subagent_spawn`) is retried on `legacy`.
struct GuardedEngine {
    registered_id: String,
    owner: Owner,
    inner: Arc<dyn ContextEngine>,
    fallback: Arc<dyn ContextEngine>,
    registry: Registry,
    policy: FailurePolicy,
}

enum Route {
    Engine,
    Fallback,
}

impl GuardedEngine {
    fn route(&self, stage: Stage, abort: Option<&AbortSignal>) -> Result<Route, EngineError> {
        if abort.is_some_and(AbortSignal::is_aborted) {
            return Err(EngineError::Cancelled);
        }
        match self.registry.quarantine_of(&self.registered_id) {
            None => Ok(Route::Engine),
            Some(record) => match self.policy {
                FailurePolicy::Fallback => Ok(Route::Fallback),
                FailurePolicy::Strict => Err(EngineError::failed(format!(
                    "context engine \"{}\" is quarantined since {} failed ({}); failure policy is strict, so {stage} was not run on \"{LEGACY_ENGINE_ID}\"",
                    self.registered_id, record.operation, record.reason
                ))),
            },
        }
    }

    /// Decides what follows a failed call: `Err` to return the error as is, `Ok(original)` to
    /// retry on the fallback (returning `original` if that fails too).
    fn after_failure(&self, stage: Stage, error: EngineError) -> Result<EngineError, EngineError> {
        if error.is_callers_concern() {
            return Err(error);
        }
        self.registry.quarantine(
            &self.registered_id,
            Some(&self.owner),
            stage,
            &error_chain(&error),
        );
        if stage.rethrows() || self.policy == FailurePolicy::Strict {
            Err(error)
        } else {
            Ok(error)
        }
    }
}

macro_rules! guarded {
    ($self:ident, $stage:expr, $abort:expr, $method:ident($($arg:expr),*)) => {{
        match $self.route($stage, $abort)? {
            Route::Fallback => $self.fallback.$method($($arg),*).await,
            Route::Engine => match $self.inner.$method($($arg),*).await {
                Ok(value) => Ok(value),
                Err(error) => match $self.after_failure($stage, error) {
                    Err(error) => Err(error),
                    Ok(original) => $self.fallback.$method($($arg),*).await.map_err(|_| original),
                },
            },
        }
    }};
}

#[async_trait]
impl ContextEngine for GuardedEngine {
    fn info(&self) -> EngineInfo {
        let quarantined = self.registry.quarantine_of(&self.registered_id).is_some();
        if quarantined && self.policy == FailurePolicy::Fallback {
            self.fallback.info()
        } else {
            self.inner.info()
        }
    }

    async fn ingest(&self, params: &IngestParams) -> Result<IngestResult, EngineError> {
        guarded!(self, Stage::Ingest, None, ingest(params))
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        guarded!(self, Stage::Assemble, None, assemble(params))
    }

    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError> {
        guarded!(self, Stage::Compact, params.abort.as_ref(), compact(params))
    }

    async fn bootstrap(&self, params: &BootstrapParams) -> Result<BootstrapResult, EngineError> {
        guarded!(self, Stage::Bootstrap, None, bootstrap(params))
    }

    async fn ingest_batch(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        guarded!(self, Stage::IngestBatch, None, ingest_batch(params))
    }

    async fn after_turn(&self, params: &AfterTurnParams) -> Result<(), EngineError> {
        guarded!(self, Stage::AfterTurn, None, after_turn(params))
    }

    async fn maintain(&self, params: &MaintainParams) -> Result<MaintainResult, EngineError> {
        guarded!(self, Stage::Maintain, None, maintain(params))
    }

    async fn commit_turn(
        &self,
        params: &CommitTurnParams,
    ) -> Result<CommitTurnResult, EngineError> {
        guarded!(self, Stage::CommitTurn, None, commit_turn(params))
    }

    async fn prepare_subagent_spawn(
        &self,
        params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        guarded!(
            self,
            Stage::PrepareSubagentSpawn,
            None,
            prepare_subagent_spawn(params)
        )
    }

    async fn on_subagent_ended(&self, params: &SubagentEndedParams) -> Result<(), EngineError> {
        guarded!(
            self,
            Stage::OnSubagentEnded,
            None,
            on_subagent_ended(params)
        )
    }

    async fn on_session_reset(&self, params: &SessionResetParams) -> Result<(), EngineError> {
        guarded!(self, Stage::OnSessionReset, None, on_session_reset(params))
    }

    fn tools(&self) -> Vec<ToolDefinition> {
        match self.route(Stage::CallTool, None) {
            Ok(Route::Engine) => self.inner.tools(),
            Ok(Route::Fallback) => self.fallback.tools(),
            Err(_) => Vec::new(),
        }
    }

    async fn call_tool(
        &self,
        caller: &ToolCaller,
        name: &str,
        arguments: &Value,
    ) -> Result<Value, EngineError> {
        guarded!(
            self,
            Stage::CallTool,
            None,
            call_tool(caller, name, arguments)
        )
    }

    /// The selected engine's administration, quarantined or not: an operator checks and
    /// repairs the store of an engine that failed.
    fn admin(&self) -> Option<Arc<dyn EngineAdmin>> {
        self.inner.admin()
    }

    async fn dispose(&self) -> Result<(), EngineError> {
        // The fallback is the host's shared default engine; the host disposes it itself.
        self.inner.dispose().await
    }
}
