//! The host: opens the configuration, resolves the engine in the `contextEngine` slot, keeps
//! session transcripts, and drives the turn lifecycle.
//!
//! One turn: bootstrap (once per session, when a transcript already existed) → assemble with
//! `token_budget = window − reserve − prompt pressure` → prepend `systemPromptAddition` →
//! overflow precheck (respecting `promptAuthority`) → model call with overflow recovery →
//! durable append to the transcript → `after_turn` → built-in auto-compaction for engines that
//! do not own compaction → `maintain`. Calls for one session are serialized; sessions run
//! concurrently.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};

use tokio::sync::Mutex;
use vilvona_core::engine::*;
use vilvona_core::host::{HostProfile, Operation, check_host_support};
use vilvona_core::registry::{
    Owner, RegisterOptions, Registry, ResolvedEngine, engine_factory, error_chain,
};
use vilvona_core::summarize::Summarizer;
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_legacy::{CompactionSettings, LegacyEngine};
use vilvona_summarize::{ExtractiveSummarizer, format_utc_rfc3339};
use vilvona_transcript::{SessionHeader, TranscriptWriter, read_transcript, session_messages};

use crate::config::{ConfigError, HostConfig};
use crate::memory::MemoryProvider;
use crate::model::{ModelError, ToolSpec};
use crate::model_summarizer::summarizer_from_config;

use crate::sessions::{SessionRecord, SessionStore, SessionStoreError};
use crate::workspace::{SystemPrompt, build_system_prompt};
use vilvona_core::clock::now_ms;

mod turn;

/// How many provider-overflow recoveries a turn may spend (only ones that freed tokens count).
pub const MAX_OVERFLOW_ATTEMPTS: u32 = 3;

/// Why a host operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Sessions(#[from] SessionStoreError),
    #[error(transparent)]
    Transcript(#[from] vilvona_transcript::TranscriptError),
    #[error(transparent)]
    Resolve(#[from] vilvona_core::registry::ResolveError),
    #[error(transparent)]
    HostRequirement(#[from] Box<vilvona_core::host::HostRequirementError>),
    #[error("context engine \"{engine}\" failed during {operation}")]
    Engine {
        engine: String,
        operation: &'static str,
        #[source]
        source: EngineError,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("context overflow: {0}")]
    Overflow(String),
    #[error("unknown session \"{0}\"")]
    UnknownSession(String),
    #[error(
        "the state directory {} does not exist (a command that only reads creates nothing: check --state-dir)",
        .0.display()
    )]
    NoStateDir(PathBuf),
    /// No engine keeps history for this agent; `reasons` are the failures of engines that
    /// may have (empty when none has any stored).
    #[error(
        "no engine keeps history in {}{}; select one with plugins.slots.contextEngine or replay a session with `--engine lossless`",
        state_dir.display(),
        reasons.iter().map(|reason| format!(" ({reason})")).collect::<String>()
    )]
    NoHistory {
        state_dir: PathBuf,
        reasons: Vec<String>,
    },
    #[error(transparent)]
    Register(#[from] vilvona_core::registry::RegisterError),
    #[error("compacting the transcript")]
    Compaction(#[from] vilvona_legacy::CompactionError),
}

/// How to open a host.
#[derive(Clone, Debug)]
pub struct HostOptions {
    pub state_dir: PathBuf,
    /// The configuration file; default `<state_dir>/vilvona.json5`.
    pub config_path: Option<PathBuf>,
    pub profile: HostProfile,
    pub agent_id: String,
    pub workspace_dir: Option<PathBuf>,
    /// The host's own system prompt, before any engine addition.
    pub system_prompt: String,
    /// Tools the model can call (names go to `assemble` as `available_tools`).
    pub tools: Vec<ToolSpec>,
    /// Use this engine whatever the slot says (`--engine`).
    pub engine_override: Option<String>,
    /// Use this window whatever the config says (`--context-window`).
    pub context_window_override: Option<u64>,
    /// Inspection only: engines open their storage read-only (no writer lock, nothing created),
    /// so this host works beside any process that writes the same state directory.
    pub read_only: bool,
    /// The selected engine must serve (the command line): if it cannot start, `open` fails
    /// with the reason instead of resolving to `legacy`, and its later failures are returned.
    pub require_selected: bool,
    /// Keep the `lossless` engine's history in this PostgreSQL database (`--store-url`,
    /// `VILVONA_STORE_URL`), whatever the configuration says.
    pub store_url: Option<String>,
    /// What the host's own compaction (the `legacy` engine's) summarizes with, as OpenClaw
    /// summarizes with its model; the extractive summarizer when `None`.
    pub summarizer: Option<Arc<dyn Summarizer>>,
}

impl HostOptions {
    pub fn new(state_dir: impl Into<PathBuf>) -> HostOptions {
        HostOptions {
            state_dir: state_dir.into(),
            config_path: None,
            profile: HostProfile::embedded(),
            agent_id: "main".to_owned(),
            workspace_dir: None,
            system_prompt: "You are a helpful coding agent.".to_owned(),
            tools: Vec::new(),
            engine_override: None,
            context_window_override: None,
            read_only: false,
            require_selected: false,
            store_url: None,
            summarizer: None,
        }
    }

    /// The agent's directory: `<state dir>/agents/<agent id>`. Engines keep their storage
    /// under it unless their settings say otherwise.
    pub fn agent_dir(&self) -> PathBuf {
        self.state_dir.join("agents").join(&self.agent_id)
    }

    pub fn config_path(&self) -> PathBuf {
        self.config_path
            .clone()
            .unwrap_or_else(|| self.state_dir.join("vilvona.json5"))
    }
}

/// The state dir: `--state-dir`, else `$VILVONA_STATE_DIR`, else `~/.vilvona`.
pub fn default_state_dir(flag: Option<&Path>) -> PathBuf {
    let dir = match (flag, std::env::var_os("VILVONA_STATE_DIR")) {
        (Some(dir), _) => dir.to_owned(),
        (None, Some(dir)) => PathBuf::from(dir),
        (None, None) => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".vilvona"),
    };
    // Absolute: the transcript paths recorded in sessions.json must mean the same file from
    // any working directory.
    std::path::absolute(&dir).unwrap_or(dir)
}

/// A session the host has open in this process.
struct LiveSession {
    key: String,
    record: SessionRecord,
    writer: TranscriptWriter,
    /// The rebuilt context of the transcript (after the last compaction), shared with engines.
    history: Messages,
    entry_ids: Vec<Option<String>>,
    history_tokens: u64,
    /// Every message entry id in the transcript, so a replayed turn is recognized.
    known_ids: HashSet<String>,
}

/// A subagent spawn as the host plans it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubagentSpawn {
    pub parent_key: String,
    pub child_key: String,
    pub mode: ContextMode,
    pub ttl_ms: Option<u64>,
    /// OpenClaw's `lightContext`: an isolated child that starts without the parent's context.
    pub light_context: bool,
}

impl SubagentSpawn {
    pub fn new(parent_key: &str, child_key: &str, mode: ContextMode) -> SubagentSpawn {
        SubagentSpawn {
            parent_key: parent_key.to_owned(),
            child_key: child_key.to_owned(),
            mode,
            ttl_ms: None,
            light_context: false,
        }
    }
}

/// The outcome of one turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnReport {
    pub engine_id: String,
    pub token_budget: u64,
    /// Tokens of what the model was sent (assembled context, with the prompt).
    pub assembled_tokens: u64,
    pub over_budget: bool,
    pub prechecked: bool,
    pub compactions: u32,
    pub overflow_recoveries: u32,
    pub new_messages: usize,
    pub system_prompt: String,
}

/// The host.
pub struct Host {
    options: HostOptions,
    config: HostConfig,
    registry: Registry,
    engine: ResolvedEngine,
    sessions: Mutex<SessionStore>,
    live: StdMutex<HashMap<String, Arc<Mutex<Option<LiveSession>>>>>,
    estimator: Arc<dyn TokenEstimator>,
    summarizer: Arc<dyn Summarizer>,
    memory: Option<Arc<dyn MemoryProvider>>,
    /// The engine that keeps the agent's history, once looked for ([`Host::history`]).
    history: tokio::sync::OnceCell<Arc<dyn ContextEngine>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("state_dir", &self.options.state_dir)
            .field("engine", &self.engine)
            .finish()
    }
}

/// Registers the built-in `lossless` engine (owner `plugin:lossless`, settings from
/// `plugins.entries.lossless.config`). The summarizer its settings name is built here: models
/// are the host's to reach (`host_model` is the embedding host's own, when it offers one).
pub fn register_lossless(
    registry: &Registry,
    host_model: Option<Arc<dyn Summarizer>>,
) -> Result<(), vilvona_core::registry::RegisterError> {
    registry.register_with(
        vilvona_lossless::ENGINE_ID,
        Owner::plugin(vilvona_lossless::ENGINE_ID),
        vilvona_lossless::factory(Arc::new(move |config, estimator| {
            summarizer_from_config(config, estimator, host_model.clone())
                .map_err(|error| EngineError::InvalidConfig(error_chain(&error)))
        })),
        RegisterOptions {
            tools: vilvona_lossless::tool_definitions(),
            ..RegisterOptions::default()
        },
    )
}

/// Registers the built-in `legacy` engine, configured from the host configuration.
pub fn register_legacy(
    registry: &Registry,
    config: &HostConfig,
    summarizer: Arc<dyn Summarizer>,
    estimator: Arc<dyn TokenEstimator>,
) -> Result<(), vilvona_core::registry::RegisterError> {
    let settings = CompactionSettings {
        keep_recent_tokens: config.compaction.keep_recent_tokens,
        context_window: config.context_window(),
        truncate_after_compaction: config.compaction.truncate_after_compaction,
        ..CompactionSettings::default()
    };
    registry.register(
        vilvona_core::registry::LEGACY_ENGINE_ID,
        Owner::Core,
        engine_factory(move |_| {
            let engine: Arc<dyn ContextEngine> = Arc::new(LegacyEngine::new(
                settings.clone(),
                summarizer.clone(),
                estimator.clone(),
            ));
            async move { Ok(engine) }
        }),
    )
}

impl Host {
    /// Opens a host: reads the configuration, registers `legacy` and whatever `register` adds,
    /// and resolves the slot.
    pub async fn open(
        options: HostOptions,
        register: impl FnOnce(&Registry, &HostConfig) -> Result<(), HostError>,
    ) -> Result<Host, HostError> {
        if options.read_only {
            // Reading creates nothing: a mistyped --state-dir is an error, not an empty one.
            if !options.state_dir.is_dir() {
                return Err(HostError::NoStateDir(options.state_dir.clone()));
            }
        } else {
            crate::privacy::ensure_private_dir(&options.state_dir).map_err(|source| {
                HostError::Sessions(SessionStoreError::Io {
                    path: options.state_dir.clone(),
                    source,
                })
            })?;
        }
        let mut config = HostConfig::load(&options.config_path())?;
        crate::gateway_settings::apply(&mut config, &options.state_dir);
        if let Some(engine) = &options.engine_override {
            config.context_engine_slot = Some(engine.clone());
        }
        if let Some(url) = &options.store_url {
            config.use_store_url(url);
        }
        if let Some(window) = options.context_window_override {
            config.context_tokens = Some(window);
            if let Some(model) = config.model.as_mut() {
                model.context_window = Some(window);
            }
        }
        let estimator: Arc<dyn TokenEstimator> = Arc::new(HeuristicEstimator);
        let summarizer: Arc<dyn Summarizer> = match &options.summarizer {
            Some(summarizer) => summarizer.clone(),
            None => Arc::new(ExtractiveSummarizer::new(estimator.clone())),
        };
        let registry = Registry::new();
        register_legacy(&registry, &config, summarizer.clone(), estimator.clone())?;
        register_lossless(&registry, None)?;
        register(&registry, &config)?;
        let mut selection =
            config.engine_selection(Some(options.agent_dir()), options.workspace_dir.clone());
        selection.read_only = options.read_only;
        let engine = if options.require_selected {
            registry.resolve_required(&selection).await?
        } else {
            registry.resolve(&selection).await?
        };
        tracing::info!(engine = %engine.active_id(), selected = %engine.selected_id, "context engine resolved");
        let sessions = SessionStore::open(&options.state_dir);
        let mut options = options;
        // The model is offered the tools of the engine that serves.
        for tool in engine.engine.tools() {
            if !options
                .tools
                .iter()
                .any(|existing| existing.name == tool.name)
            {
                options.tools.push(ToolSpec {
                    name: tool.name,
                    description: tool.description,
                    parameters: tool.parameters,
                });
            }
        }
        Ok(Host {
            options,
            config,
            registry,
            engine,
            sessions: Mutex::new(sessions),
            live: StdMutex::new(HashMap::new()),
            estimator,
            summarizer,
            memory: None,
            history: tokio::sync::OnceCell::new(),
        })
    }

    /// Sets the active memory provider (`plugins.slots.memory`).
    pub fn set_memory_provider(&mut self, provider: Arc<dyn MemoryProvider>) {
        if self.config.memory_slot.as_deref() == Some(provider.id()) {
            self.memory = Some(provider);
        }
    }

    pub fn memory_provider(&self) -> Option<&Arc<dyn MemoryProvider>> {
        self.memory.as_ref()
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    pub fn options(&self) -> &HostOptions {
        &self.options
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn engine(&self) -> &ResolvedEngine {
        &self.engine
    }

    /// The engine that keeps this agent's history, for recall and administration: the active
    /// engine when it has an [`EngineAdmin`](vilvona_core::EngineAdmin), else the first other
    /// registered engine whose stored history exists, opened as this host opens (read-only
    /// when it is) and never creating storage.
    pub async fn history(&self) -> Result<Arc<dyn ContextEngine>, HostError> {
        self.history
            .get_or_try_init(|| self.find_history())
            .await
            .cloned()
    }

    async fn find_history(&self) -> Result<Arc<dyn ContextEngine>, HostError> {
        if self.engine.engine.admin().is_some() {
            return Ok(self.engine.engine.clone());
        }
        let active = self.engine.active_id();
        let mut reasons = Vec::new();
        for registered in self.registry.engines() {
            if registered.id == active || registered.id == vilvona_core::LEGACY_ENGINE_ID {
                continue;
            }
            let mut selection = self.config.engine_selection(
                Some(self.options.agent_dir()),
                self.options.workspace_dir.clone(),
            );
            selection.slot = Some(registered.id.clone());
            selection.read_only = self.options.read_only;
            selection.existing_only = true;
            match self.registry.instantiate(&selection).await {
                Ok(engine) if engine.admin().is_some() => return Ok(engine),
                Ok(_) | Err(vilvona_core::registry::ResolveError::Declined { .. }) => {}
                Err(error) => reasons.push(error_chain(&error)),
            }
        }
        Err(HostError::NoHistory {
            state_dir: self.options.state_dir.clone(),
            reasons,
        })
    }

    pub fn estimator(&self) -> &Arc<dyn TokenEstimator> {
        &self.estimator
    }

    /// The system prompt of a run now: the host's own prompt, the tool list, and the
    /// workspace's skills and bootstrap files (`options.workspace_dir`, else
    /// `agents.defaults.workspace`).
    pub fn system_prompt(&self) -> SystemPrompt {
        build_system_prompt(
            &self.options.system_prompt,
            &self.options.tools,
            self.workspace(),
            self.config.bootstrap,
        )
    }

    /// The agent's workspace, if it has one.
    pub fn workspace(&self) -> Option<&Path> {
        self.options
            .workspace_dir
            .as_deref()
            .or(self.config.workspace.as_deref())
    }

    /// What a whole prompt may use: the window less what is kept for the model's reply. The
    /// one budget a user is shown (`context list`, the demo).
    pub fn prompt_budget(&self) -> u64 {
        let window = self.config.context_window();
        window
            .saturating_sub(self.config.reserve_tokens(window))
            .max(1)
    }

    /// The token budget for a prompt: window − reserve − prompt pressure (chars/4 × 1.2).
    pub fn token_budget(&self, system_prompt: &str, prompt: &str) -> u64 {
        let pressure = (((system_prompt.len() + prompt.len()) as f64 / 4.0) * 1.2).ceil() as u64;
        self.prompt_budget().saturating_sub(pressure).max(1)
    }

    /// A session's record, if it exists.
    /// (Read from `sessions.json` now: other processes may have added it.)
    pub async fn session(&self, session_key: &str) -> Option<SessionRecord> {
        match self.sessions.lock().await.get(session_key) {
            Ok(record) => record.cloned(),
            Err(error) => {
                tracing::warn!(%error, "reading the session index failed");
                None
            }
        }
    }

    /// Forgets a session's record and its transcript (when the transcript is in the state
    /// directory: a host's own files elsewhere are not this host's to delete). Returns the
    /// record it removed.
    pub async fn remove_session(
        &self,
        session_key: &str,
    ) -> Result<Option<SessionRecord>, HostError> {
        let removed = self.sessions.lock().await.remove(session_key)?;
        if let Some(record) = &removed
            && record.session_file.starts_with(&self.options.state_dir)
        {
            match std::fs::remove_file(&record.session_file) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(HostError::Sessions(SessionStoreError::Io {
                        path: record.session_file.clone(),
                        source,
                    }));
                }
            }
        }
        Ok(removed)
    }

    /// Every session record, by key.
    pub async fn sessions(&self) -> Vec<(String, SessionRecord)> {
        match self.sessions.lock().await.records() {
            Ok(records) => records
                .iter()
                .map(|(key, record)| (key.clone(), record.clone()))
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "reading the session index failed");
                Vec::new()
            }
        }
    }

    /// Every session of the state directory: those `sessions.json` records, then those only
    /// the engine that keeps history stored (a gateway's, through `serve`: no transcript
    /// here, so their records name none).
    pub async fn listed_sessions(&self) -> Vec<(String, SessionRecord)> {
        let mut listed = self.sessions().await;
        let known: HashSet<String> = listed
            .iter()
            .map(|(_, record)| record.session_id.clone())
            .collect();
        let Ok(engine) = self.history().await else {
            return listed;
        };
        let Some(admin) = engine.admin() else {
            return listed;
        };
        match admin.stored_sessions().await {
            Ok(stored) => listed.extend(
                stored
                    .into_iter()
                    .filter(|session| !known.contains(&session.session_id))
                    .map(|session| {
                        let key = session
                            .session_key
                            .unwrap_or_else(|| session.session_id.clone());
                        let record = SessionRecord {
                            session_id: session.session_id,
                            ..SessionRecord::default()
                        };
                        (key, record)
                    }),
            ),
            Err(error) => tracing::warn!(%error, "listing the stored sessions failed"),
        }
        listed
    }

    /// Whether the session index (`sessions.json`) reads: its records, or why not.
    pub async fn check_session_index(&self) -> Result<usize, SessionStoreError> {
        self.sessions.lock().await.check()
    }

    /// `doctor --fix` for a damaged session index: moves it aside and writes one rebuilt from
    /// the transcripts in `sessions/` (each header's id; its key the one the engine that keeps
    /// history stored with it, else the id). Answers where the damaged file went and how many
    /// records the new one holds.
    pub async fn rebuild_session_index(&self) -> Result<(PathBuf, usize), HostError> {
        let keys: HashMap<String, String> = match self.history().await {
            Ok(engine) => match engine.admin() {
                Some(admin) => admin
                    .stored_sessions()
                    .await
                    .map_err(|source| self.engine_error("stored_sessions", source))?
                    .into_iter()
                    .filter_map(|stored| Some((stored.session_id, stored.session_key?)))
                    .collect(),
                None => HashMap::new(),
            },
            Err(_) => HashMap::new(),
        };
        let dir = self.options.state_dir.join("sessions");
        let mut records = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().and_then(|ext| ext.to_str()) != Some("jsonl") {
                continue;
            }
            let Ok(header) = vilvona_transcript::read_header(&path) else {
                continue;
            };
            let compactions = read_transcript(&path)
                .map(|transcript| {
                    transcript
                        .entries
                        .iter()
                        .filter(|located| {
                            matches!(located.entry, vilvona_transcript::Entry::Compaction(_))
                        })
                        .count() as u64
                })
                .unwrap_or(0);
            let updated_at_ms = entry
                .metadata()
                .and_then(|metadata| metadata.modified())
                .ok()
                .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |since| since.as_millis() as i64);
            let key = keys
                .get(&header.id)
                .cloned()
                .unwrap_or_else(|| header.id.clone());
            records.insert(
                key,
                SessionRecord {
                    session_id: header.id,
                    session_file: path,
                    compaction_count: compactions,
                    updated_at_ms,
                    ..SessionRecord::default()
                },
            );
        }
        let count = records.len();
        let aside = self.sessions.lock().await.replace_damaged(records)?;
        Ok((aside, count))
    }

    fn slot(&self, session_key: &str) -> Arc<Mutex<Option<LiveSession>>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(session_key.to_owned())
            .or_default()
            .clone()
    }

    /// The session's live state, loaded on first use, held for the caller: calls for one
    /// session queue here; different sessions proceed in parallel.
    async fn live_session(
        &self,
        session_key: &str,
        session_id: Option<&str>,
    ) -> Result<tokio::sync::OwnedMappedMutexGuard<Option<LiveSession>, LiveSession>, HostError>
    {
        let mut guard = self.slot(session_key).lock_owned().await;
        if guard.is_none() {
            *guard = Some(self.load(session_key, session_id).await?);
        }
        tokio::sync::OwnedMutexGuard::try_map(guard, Option::as_mut)
            .map_err(|_| HostError::UnknownSession(session_key.to_owned()))
    }

    /// Opens (or creates) a session and bootstraps the engine if its transcript pre-existed.
    async fn load(
        &self,
        session_key: &str,
        session_id: Option<&str>,
    ) -> Result<LiveSession, HostError> {
        let generated = session_id.map(str::to_owned).unwrap_or_else(new_session_id);
        let record = self
            .sessions
            .lock()
            .await
            .get_or_create(session_key, &generated)?;
        let existed = record.session_file.exists();
        let writer = if existed {
            TranscriptWriter::open(&record.session_file)?
        } else {
            let mut header =
                SessionHeader::new(record.session_id.clone(), format_utc_rfc3339(now_ms()));
            header.cwd = self
                .options
                .workspace_dir
                .as_ref()
                .map(|dir| dir.to_string_lossy().into_owned());
            TranscriptWriter::create(&record.session_file, &header)?
        };
        let mut live = LiveSession {
            key: session_key.to_owned(),
            record,
            writer,
            history: Messages::new(),
            entry_ids: Vec::new(),
            history_tokens: 0,
            known_ids: HashSet::new(),
        };
        self.reload_history(&mut live)?;
        if existed {
            let params = BootstrapParams {
                session_id: live.record.session_id.clone(),
                session_key: Some(session_key.to_owned()),
                session_file: Some(live.record.session_file.to_string_lossy().into_owned()),
            };
            match self.engine.engine.bootstrap(&params).await {
                Ok(result) => tracing::debug!(?result, session = session_key, "bootstrapped"),
                Err(error) => {
                    tracing::warn!(%error, session = session_key, "context engine bootstrap failed")
                }
            }
            self.maintain(&live, MaintainReason::Bootstrap).await;
        }
        Ok(live)
    }

    fn reload_history(&self, live: &mut LiveSession) -> Result<(), HostError> {
        let transcript = read_transcript(&live.record.session_file)?;
        live.known_ids.extend(
            transcript
                .entries
                .iter()
                .filter(|located| matches!(located.entry, vilvona_transcript::Entry::Message(_)))
                .filter_map(|located| located.entry.id().map(str::to_owned)),
        );
        let rebuilt = session_messages(&transcript.entries);
        live.history_tokens = rebuilt
            .iter()
            .map(|(_, message)| self.estimator.message_tokens(message))
            .sum();
        live.entry_ids = rebuilt.iter().map(|(id, _)| Some(id.clone())).collect();
        live.history = rebuilt.into_iter().map(|(_, message)| message).collect();
        Ok(())
    }

    fn session_file(live: &LiveSession) -> String {
        live.record.session_file.to_string_lossy().into_owned()
    }

    async fn maintain(&self, live: &LiveSession, reason: MaintainReason) {
        let params = MaintainParams {
            session_id: live.record.session_id.clone(),
            session_key: Some(live.key.clone()),
            session_file: Some(Self::session_file(live)),
            reason,
            ..MaintainParams::default()
        };
        if let Err(error) = self.engine.engine.maintain(&params).await {
            tracing::warn!(%error, "context engine maintain failed");
        }
    }

    fn check(&self, operation: Operation) -> Result<(), HostError> {
        let info = self.engine.engine.info();
        check_host_support(
            &info.id,
            &info.host_requirements,
            operation,
            &self.options.profile,
        )?;
        Ok(())
    }

    fn engine_error(&self, operation: &'static str, source: EngineError) -> HostError {
        HostError::Engine {
            engine: self.engine.active_id(),
            operation,
            source,
        }
    }

    /// Prepares a subagent, runs `start`, and rolls the preparation back if the start fails.
    /// The child's session (id and transcript path) is created first and handed to the engine.
    /// An isolated spawn with a light context is not prepared at all, as in OpenClaw: the
    /// child starts from nothing and the engine has nothing to grant or seed.
    pub async fn spawn_subagent<F, E>(
        &self,
        spawn: SubagentSpawn,
        start: F,
    ) -> Result<Result<(), E>, HostError>
    where
        F: std::future::Future<Output = Result<(), E>>,
    {
        self.check(Operation::SubagentSpawn)?;
        if spawn.light_context && spawn.mode == ContextMode::Isolated {
            return Ok(start.await);
        }
        let parent = self.session(&spawn.parent_key).await;
        let child = self
            .sessions
            .lock()
            .await
            .get_or_create(&spawn.child_key, &new_session_id())?;
        let params = SubagentSpawnParams {
            parent_session_key: spawn.parent_key.clone(),
            child_session_key: spawn.child_key.clone(),
            context_mode: spawn.mode,
            parent_session_id: parent.as_ref().map(|record| record.session_id.clone()),
            parent_session_file: parent
                .as_ref()
                .map(|record| record.session_file.to_string_lossy().into_owned()),
            child_session_id: Some(child.session_id.clone()),
            child_session_file: Some(child.session_file.to_string_lossy().into_owned()),
            ttl_ms: spawn.ttl_ms,
        };
        let preparation = self
            .engine
            .engine
            .prepare_subagent_spawn(&params)
            .await
            .map_err(|error| self.engine_error("prepareSubagentSpawn", error))?;
        let started = start.await;
        if started.is_err()
            && let Some(rollback) = preparation
            && let Err(error) = rollback.rollback().await
        {
            tracing::warn!(%error, child = spawn.child_key, "rolling back a failed subagent spawn failed");
        }
        Ok(started)
    }

    /// Tells the engine a subagent ended.
    pub async fn end_subagent(
        &self,
        child_key: &str,
        reason: SubagentEndReason,
    ) -> Result<(), HostError> {
        self.engine
            .engine
            .on_subagent_ended(&SubagentEndedParams {
                child_session_key: child_key.to_owned(),
                reason,
            })
            .await
            .map_err(|error| self.engine_error("onSubagentEnded", error))
    }

    /// Releases the engine (host shutdown).
    pub async fn dispose(&self) -> Result<(), HostError> {
        self.engine
            .engine
            .dispose()
            .await
            .map_err(|error| self.engine_error("dispose", error))
    }
}

fn new_session_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:016x}{:04x}", nanos as u64, count & 0xffff)
}
