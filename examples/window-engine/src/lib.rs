//! A sliding-window context engine: the smallest useful engine, and the path an engine author
//! follows. It is written only against `vilvona-core`.
//!
//! It stores each session's messages in memory, assembles the newest messages that fit the
//! token budget (never separating a tool result from the call that made it), and compacts by
//! moving the start of its window forward. It forgets what falls out of the window; the
//! `lossless` engine is the full reference that does not.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde::Deserialize;
use vilvona_core::registry::RegisterError;
use vilvona_core::*;

/// The id the engine registers under and the slot value that selects it.
pub const ENGINE_ID: &str = "window";
/// The plugin that owns the registration (and the `plugins.entries` key for its settings).
pub const PLUGIN_ID: &str = "window-engine";

/// Settings from `plugins.entries.window-engine.config`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WindowConfig {
    /// Budget used when the host gives none.
    #[serde(default = "default_budget")]
    pub default_token_budget: u64,
}

fn default_budget() -> u64 {
    32_000
}

impl Default for WindowConfig {
    fn default() -> WindowConfig {
        WindowConfig {
            default_token_budget: default_budget(),
        }
    }
}

/// Registers the engine under [`ENGINE_ID`], owned by [`PLUGIN_ID`].
pub fn register(registry: &Registry) -> Result<(), RegisterError> {
    registry.register(
        ENGINE_ID,
        Owner::plugin(PLUGIN_ID),
        engine_factory(|context: FactoryContext| async move {
            let config = match context.config {
                None => WindowConfig::default(),
                Some(value) => serde_json::from_value(value).map_err(|error| {
                    EngineError::InvalidConfig(format!(
                        "plugins.entries.{PLUGIN_ID}.config: {error}"
                    ))
                })?,
            };
            if config.default_token_budget == 0 {
                return Err(EngineError::InvalidConfig(format!(
                    "plugins.entries.{PLUGIN_ID}.config.defaultTokenBudget must be positive"
                )));
            }
            let engine: Arc<dyn ContextEngine> = Arc::new(WindowEngine::new(config));
            Ok(engine)
        }),
    )
}

#[derive(Debug, Default)]
struct Session {
    /// Every ingested message with its token count, oldest first.
    messages: Vec<(AgentMessage, u64)>,
    /// Idempotency keys already ingested: the host's entry id, else the message JSON.
    seen: HashSet<String>,
    /// How many of the oldest messages compaction has moved out of the window.
    dropped: usize,
}

/// The sliding-window engine.
#[derive(Debug)]
pub struct WindowEngine {
    config: WindowConfig,
    sessions: Mutex<HashMap<String, Session>>,
}

impl WindowEngine {
    pub fn new(config: WindowConfig) -> WindowEngine {
        WindowEngine {
            config,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    fn with_session<T>(&self, session_id: &str, f: impl FnOnce(&mut Session) -> T) -> T {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        f(sessions.entry(session_id.to_owned()).or_default())
    }
}

/// The index of the oldest message to keep so that `messages[index..]` fits `budget`, moved
/// forward past tool results whose call would be cut off.
fn window_start(messages: &[(AgentMessage, u64)], floor: usize, budget: u64) -> usize {
    let mut start = messages.len();
    let mut total = 0;
    while start > floor {
        let tokens = messages[start - 1].1;
        if total + tokens > budget {
            break;
        }
        total += tokens;
        start -= 1;
    }
    while start < messages.len() && messages[start].0.tool_result_call_id().is_some() {
        start += 1;
    }
    start
}

#[async_trait]
impl ContextEngine for WindowEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: ENGINE_ID.to_owned(),
            name: "Sliding Window Engine".to_owned(),
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            owns_compaction: true,
            ..EngineInfo::default()
        }
    }

    async fn ingest(&self, params: &IngestParams) -> Result<IngestResult, EngineError> {
        let key = match &params.entry_id {
            Some(id) => format!("entry:{id}"),
            None => serde_json::to_string(&params.message)
                .map_err(|error| EngineError::caused_by("serializing a message", error))?,
        };
        let tokens = HeuristicEstimator.message_tokens(&params.message);
        let ingested = self.with_session(&params.session_id, |session| {
            let fresh = session.seen.insert(key);
            if fresh {
                session.messages.push((params.message.clone(), tokens));
            }
            fresh
        });
        Ok(IngestResult { ingested })
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        let budget = params
            .token_budget
            .unwrap_or(self.config.default_token_budget);
        // The host passes its whole history; the engine's state is how much of its start has
        // been compacted away. With no history from the host, the stored messages stand in.
        let (source, dropped) = self.with_session(&params.session_id, |session| {
            let source: Vec<(AgentMessage, u64)> = if params.messages.is_empty() {
                session.messages.clone()
            } else {
                params
                    .messages
                    .iter()
                    .map(|m| (m.clone(), HeuristicEstimator.message_tokens(m)))
                    .collect()
            };
            (source, session.dropped)
        });
        let start = window_start(&source, dropped.min(source.len()), budget);
        let candidates = &source[start..];
        let estimated_tokens = candidates.iter().map(|(_, tokens)| tokens).sum();
        Ok(AssembleResult {
            messages: candidates
                .iter()
                .map(|(message, _)| message.clone())
                .collect(),
            estimated_tokens,
            ..AssembleResult::default()
        })
    }

    /// Moves the window start forward so that the window holds at most half of the budget.
    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError> {
        let budget = params
            .token_budget
            .unwrap_or(self.config.default_token_budget);
        Ok(self.with_session(&params.session_id, |session| {
            let in_window = |session: &Session| {
                session.messages[session.dropped..]
                    .iter()
                    .map(|m| m.1)
                    .sum()
            };
            let tokens_before: u64 = in_window(session);
            if !params.force && tokens_before <= budget {
                return CompactResult::unchanged(CompactReason::BelowThreshold, tokens_before);
            }
            let start = window_start(&session.messages, session.dropped, budget / 2);
            if start <= session.dropped {
                return CompactResult::unchanged(CompactReason::NoCandidate, tokens_before);
            }
            session.dropped = start;
            let tokens_after = in_window(session);
            CompactResult::compacted(CompactDetails {
                summary: None,
                tokens_before,
                tokens_after: Some(tokens_after),
                ..CompactDetails::default()
            })
        }))
    }
}
