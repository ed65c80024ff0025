//! The JSON-RPC server behind `vilvona serve --stdio`: one engine behind JSON-RPC 2.0 on a
//! pair of streams (stdin and stdout for the OpenClaw plugin).
//!
//! One JSON object per line each way; logs go elsewhere (stderr). Requests run concurrently, but
//! the calls of one session run in the order they arrived. `$/cancel` aborts a call. The server
//! may send requests of its own (`llm.complete`) when the engine's summarizer is the host's
//! model. When the input closes, in-flight calls are cancelled and answered, the engine is
//! disposed, and [`serve`] returns: everything a reply acknowledged is already stored.
//!
//! Error codes: -32700 parse error, -32600 invalid request, -32601 unknown method, -32602
//! invalid params, -32800 cancelled, -32001 engine error, -32002 not initialized, -32003
//! recall tool error, -32004 host's `llm.complete` failed, -32005 the engine needs the history
//! an `assemble` left out (`historyElided`): send it again with the history, -32006 transient:
//! the engine works but could not do this call now (a busy store, a database restarting);
//! the same call may succeed if sent again. A client tells -32001 (the engine cannot work)
//! from the others: only -32001 means "broken".
//!
//! `llm.complete` names the request it serves (`scope`, the id of the client's call whose
//! work asked for it): the client answers it with that call's own host model.
//!
//! `assemble` replies name a `revision`. A client that sends back the revision it holds
//! (`assembledRevision`) gets only what changed: `held` lists runs `[at, from, count]` (the
//! context's messages `at..at+count` are the held context's `from..from+count`), and `messages`
//! fills the other places in order. The server keeps one hash per message of what it last
//! sent each session, not the messages.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, RwLock, mpsc, oneshot, watch};
use vilvona_core::admin::ToolCaller;
use vilvona_core::engine::*;
use vilvona_core::error_chain;
use vilvona_core::registry::{EngineSelection, EntrySettings, Registry};
use vilvona_core::summarize::{
    Answer, QuestionRequest, SummarizeError, Summarizer, Summary, SummaryRequest,
};

use crate::HostConfig;
use crate::host::{register_legacy, register_lossless};
use crate::model_summarizer::{answer_prompts, parse_answer, strip_reasoning, summary_prompts};

mod sent;

use sent::{SentContexts, assembled_reply};

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const CANCELLED: i64 = -32800;
const ENGINE_ERROR: i64 = -32001;
const NOT_INITIALIZED: i64 = -32002;
const TOOL_ERROR: i64 = -32003;
const HOST_LLM_ERROR: i64 = -32004;
const HISTORY_NEEDED: i64 = -32005;
const TRANSIENT: i64 = -32006;

tokio::task_local! {
    /// The client's request whose work runs in this task.
    static CALLER: Caller;
}

/// The client's request a task works for: its id is the scope a host-model request
/// (`llm.complete`) names, so the client answers it with that call's model.
#[derive(Clone, Debug)]
struct Caller {
    id: Value,
    /// Whether the call brought the host's model (the request's `hostModel` member; `None`
    /// when the client does not say, and is then asked).
    host_model: Option<bool>,
}

/// How long the server waits for the client's answer to `llm.complete`.
const HOST_LLM_TIMEOUT: Duration = Duration::from_secs(120);

/// How long, once the input closed, cancelled calls have to answer.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The engine `initialize` opens when it names none.
const DEFAULT_ENGINE: &str = "lossless";

#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
    /// The engine's database is lost to this process (removed, replaced, its log cut under
    /// it): once this is answered the process exits, so that its client starts one that opens
    /// the database anew.
    reopen: bool,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            reopen: false,
        }
    }
}

/// Whether `error` comes from a database this process can no longer use but a new one can.
fn needs_reopen(error: &EngineError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<vilvona_store::StoreError>()
            .is_some_and(vilvona_store::StoreError::needs_reopen)
        {
            return true;
        }
        cause = error.source();
    }
    false
}

fn engine_error(method: &str, error: EngineError) -> RpcError {
    if error.is_cancellation() {
        return RpcError::new(CANCELLED, format!("{method} was cancelled"));
    }
    if matches!(error, EngineError::HistoryNeeded) {
        return RpcError::new(HISTORY_NEEDED, format!("{method}: {error}"));
    }
    if error.is_transient() {
        return RpcError {
            reopen: needs_reopen(&error),
            ..RpcError::new(TRANSIENT, format!("{method}: {}", error_chain(&error)))
        };
    }
    RpcError::new(ENGINE_ERROR, format!("{method}: {}", error_chain(&error)))
}

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Active {
    engine: Arc<dyn ContextEngine>,
    _registry: Registry,
}

/// What `initialize` asked for: kept so that an engine that failed to open is opened again on
/// the next call, instead of another engine answering in its place.
#[derive(Clone, Debug)]
struct Setup {
    state_dir: PathBuf,
    engine_id: String,
    config: Option<Value>,
}

struct Server {
    out: mpsc::UnboundedSender<String>,
    state_dir: PathBuf,
    /// `--store-url`: the `lossless` engine keeps its history in this PostgreSQL database.
    store_url: Option<String>,
    active: RwLock<Option<Active>>,
    setup: StdMutex<Option<Setup>>,
    in_flight: StdMutex<HashMap<String, watch::Sender<bool>>>,
    /// Signalled each time a call has answered.
    answered: Notify,
    /// Signalled when a call found the engine's database lost to this process: the process
    /// exits.
    database_lost: Notify,
    queues: StdMutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
    session_keys: StdMutex<SessionKeys>,
    rollbacks: StdMutex<HashMap<String, Box<dyn SpawnRollback>>>,
    next_handle: AtomicU64,
    reverse: StdMutex<HashMap<String, oneshot::Sender<Result<Value, String>>>>,
    next_reverse: AtomicU64,
    sent: StdMutex<SentContexts>,
    me: StdMutex<Weak<Server>>,
}

fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many sessions' keys the server remembers by their ids; past it, the one least recently
/// named goes.
const KNOWN_SESSION_KEYS: usize = 4096;

/// The session keys calls named beside their session ids, so that a call naming only the id
/// waits in the key's queue: id → (key, when it was last named, by a count of calls).
#[derive(Default)]
struct SessionKeys {
    keys: HashMap<String, (String, u64)>,
    calls: u64,
}

impl SessionKeys {
    /// The queue a call waits in: its session's, by the session key each method names it by
    /// (by the id where a call names no key and no call named its key yet), so that a child's
    /// own calls and its end (`onSubagentEnded`, which may forget it) never run at once; a spawn
    /// waits with its parent's calls. `None`: a call of no session, run at once.
    fn queue_key(&mut self, method: &str, params: &Value) -> Option<String> {
        let named = |key: &str| params.get(key).and_then(Value::as_str);
        self.calls += 1;
        for (id, key) in [
            ("sessionId", "sessionKey"),
            ("childSessionId", "childSessionKey"),
        ] {
            if let (Some(id), Some(key)) = (named(id), named(key)) {
                self.remember(id, key);
            }
        }
        match method {
            "prepareSubagentSpawn" => named("parentSessionKey").map(str::to_owned),
            "onSubagentEnded" | "rollback" => named("childSessionKey").map(str::to_owned),
            _ => named("sessionKey").map(str::to_owned).or_else(|| {
                let id = named("sessionId")?;
                Some(match self.keys.get_mut(id) {
                    Some((key, named_at)) => {
                        *named_at = self.calls;
                        key.clone()
                    }
                    None => id.to_owned(),
                })
            }),
        }
    }

    /// Remembers that `id` is the session `key` names; past the bound, the id least recently
    /// named is forgotten (its calls then wait in their id's queue until a call names the key).
    fn remember(&mut self, id: &str, key: &str) {
        if self.keys.len() >= KNOWN_SESSION_KEYS && !self.keys.contains_key(id) {
            let oldest = self
                .keys
                .iter()
                .min_by_key(|(_, (_, named_at))| *named_at)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                self.keys.remove(&oldest);
            }
        }
        self.keys
            .insert(id.to_owned(), (key.to_owned(), self.calls));
    }
}

impl Server {
    fn send(&self, value: Value) {
        let _ = self.out.send(value.to_string());
    }

    fn respond(&self, id: Value, outcome: Result<Value, RpcError>) {
        match outcome {
            Ok(result) => self.send(json!({"jsonrpc": "2.0", "id": id, "result": result})),
            Err(error) => {
                self.send(json!({"jsonrpc": "2.0", "id": id, "error": {"code": error.code, "message": error.message}}));
                if error.reopen {
                    self.database_lost.notify_one();
                }
            }
        }
    }

    /// A request of the server's own to the client, answered on stdin.
    async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let id = format!(
            "vilvona-{}",
            self.next_reverse.fetch_add(1, Ordering::Relaxed)
        );
        let (sender, receiver) = oneshot::channel();
        lock(&self.reverse).insert(id.clone(), sender);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        match tokio::time::timeout(HOST_LLM_TIMEOUT, receiver).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err("the client went away".to_owned()),
            Err(_) => {
                lock(&self.reverse).remove(&id);
                Err(format!(
                    "no answer to {method} within {} s",
                    HOST_LLM_TIMEOUT.as_secs()
                ))
            }
        }
    }

    fn handle_line(self: &Arc<Self>, line: String) {
        if line.trim().is_empty() {
            return;
        }
        let value: Value =
            match serde_json::from_str(&line).or_else(|error| match well_formed(&line) {
                Some(repaired) => serde_json::from_str(&repaired),
                None => Err(error),
            }) {
                Ok(value) => value,
                Err(error) => {
                    self.respond(
                        readable_id(line.as_bytes()),
                        Err(RpcError::new(PARSE_ERROR, format!("parse error: {error}"))),
                    );
                    return;
                }
            };
        let id = value.get("id").cloned();
        match (value.get("method").and_then(Value::as_str), id) {
            (Some("$/cancel"), _) => {
                let target = value
                    .get("params")
                    .and_then(|p| p.get("id"))
                    .map(Value::to_string)
                    .unwrap_or_default();
                if let Some(flag) = lock(&self.in_flight).get(&target) {
                    let _ = flag.send(true);
                }
            }
            // Before `initialize`, the tools the engine declares, answered at once (no engine
            // is opened): a plugin lists them when it loads, then closes the input.
            (Some("tools/list"), Some(id)) if lock(&self.setup).is_none() => {
                let params = value.get("params").cloned().unwrap_or(Value::Null);
                self.respond(id, declared_tools(&params));
            }
            (Some(method), Some(id)) => self.dispatch(
                Caller {
                    id,
                    host_model: value.get("hostModel").and_then(Value::as_bool),
                },
                method.to_owned(),
                value.get("params").cloned().unwrap_or(Value::Null),
            ),
            (Some(method), None) => tracing::debug!(method, "ignoring an unknown notification"),
            (None, Some(id)) if value.get("result").is_some() || value.get("error").is_some() => {
                let key = id
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| id.to_string());
                if let Some(waiter) = lock(&self.reverse).remove(&key) {
                    let answer = match value.get("error") {
                        Some(error) => Err(error
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("error")
                            .to_owned()),
                        None => Ok(value.get("result").cloned().unwrap_or(Value::Null)),
                    };
                    let _ = waiter.send(answer);
                }
            }
            (None, id) => self.respond(
                id.unwrap_or(Value::Null),
                Err(RpcError::new(INVALID_REQUEST, "invalid request: no method")),
            ),
        }
    }

    /// Runs a request: calls of one session in arrival order, others concurrently. A call
    /// that waits behind another of its session is told to the client (`$/queued`), and every
    /// call when its work begins (`$/started`): a client times a call from then, not from
    /// when it sent it.
    fn dispatch(self: &Arc<Self>, caller: Caller, method: String, params: Value) {
        let id = caller.id.clone();
        tracing::debug!(method, host_model = ?caller.host_model, "a call");
        let (flag, mut cancelled) = watch::channel(false);
        lock(&self.in_flight).insert(id.to_string(), flag);
        let server = self.clone();
        let queue_key = lock(&self.session_keys).queue_key(&method, &params);
        let waiting = id.clone();
        let job: Job = Box::pin(async move {
            server.send(json!({"jsonrpc": "2.0", "method": "$/started", "params": {"id": id}}));
            let work = CALLER.scope(caller, server.call(&method, params, cancelled.clone()));
            let outcome = tokio::select! {
                outcome = work => outcome,
                _ = cancelled.wait_for(|flag| *flag) => Err(RpcError::new(CANCELLED, format!("{method} was cancelled"))),
            };
            lock(&server.in_flight).remove(&id.to_string());
            server.respond(id, outcome);
            server.answered.notify_waiters();
        });
        match queue_key {
            None => {
                tokio::spawn(job);
            }
            Some(key) => {
                let mut queues = lock(&self.queues);
                if queues.contains_key(&key) {
                    // Behind another call of its session: not started yet.
                    self.send(
                        json!({"jsonrpc": "2.0", "method": "$/queued", "params": {"id": waiting}}),
                    );
                }
                let queue = queues.entry(key.clone()).or_insert_with(|| {
                    let (sender, mut receiver) = mpsc::unbounded_channel::<Job>();
                    let server = Arc::downgrade(self);
                    tokio::spawn(async move {
                        while let Some(job) = receiver.recv().await {
                            job.await;
                            // An idle session's queue goes (a gateway sees thousands of
                            // sessions): jobs are sent under the queues' lock, so an empty
                            // receiver checked under it stays empty.
                            let Some(server) = server.upgrade() else {
                                return;
                            };
                            let mut queues = lock(&server.queues);
                            if receiver.is_empty() {
                                queues.remove(&key);
                                return;
                            }
                        }
                    });
                    sender
                });
                let _ = queue.send(job);
            }
        }
    }

    /// The engine, opened again if it failed to open before.
    async fn engine(&self) -> Result<Arc<dyn ContextEngine>, RpcError> {
        if let Some(active) = self.active.read().await.as_ref() {
            return Ok(active.engine.clone());
        }
        let setup = lock(&self.setup)
            .clone()
            .ok_or_else(|| RpcError::new(NOT_INITIALIZED, "call initialize first"))?;
        let mut active = self.active.write().await;
        if active.is_none() {
            *active = Some(self.open(&setup).await?);
        }
        let active = active.as_ref().ok_or_else(|| {
            RpcError::new(ENGINE_ERROR, "the engine closed while it was being opened")
        })?;
        Ok(active.engine.clone())
    }

    /// Opens the engine `initialize` asked for, with no quarantine guard and no fallback:
    /// inside OpenClaw the host is OpenClaw, and its own failure policy applies to the errors
    /// this server returns. Substituting `legacy` here would leave OpenClaw believing the
    /// selected engine owns compaction while nothing does.
    async fn open(&self, setup: &Setup) -> Result<Active, RpcError> {
        // A configuration that cannot be read is an engine that cannot work: -32001.
        let host_config = HostConfig::load(&setup.state_dir.join("vilvona.json5"))
            .map_err(|e| RpcError::new(ENGINE_ERROR, error_chain(&e)))?;
        let estimator =
            vilvona_summarize::estimator(vilvona_summarize::TokenizerKind::Heuristic, 1.0);
        let summarizer: Arc<dyn Summarizer> = Arc::new(
            vilvona_summarize::ExtractiveSummarizer::new(estimator.clone()),
        );
        let registry = Registry::new();
        register_legacy(&registry, &host_config, summarizer, estimator)
            .map_err(|e| RpcError::new(ENGINE_ERROR, error_chain(&e)))?;
        let host_llm: Arc<dyn Summarizer> = Arc::new(HostLlmSummarizer {
            server: lock(&self.me).clone(),
        });
        register_lossless(&registry, Some(host_llm))
            .map_err(|e| RpcError::new(ENGINE_ERROR, error_chain(&e)))?;
        let mut selection = EngineSelection {
            slot: Some(setup.engine_id.clone()),
            agent_dir: Some(crate::HostOptions::new(&setup.state_dir).agent_dir()),
            ..EngineSelection::default()
        };
        let config = match &self.store_url {
            Some(url) if setup.engine_id == vilvona_lossless::ENGINE_ID => {
                Some(crate::config::with_store_url(setup.config.clone(), url))
            }
            _ => setup.config.clone(),
        };
        selection.entries.insert(
            setup.engine_id.clone(),
            EntrySettings {
                enabled: Some(true),
                config,
                // The gateway's settings are not a file here (OpenClaw read its own).
                origin: None,
            },
        );
        // A passing failure to open (the database held by a process that must let go of it
        // first, its log cut under that one) is transient: the client tries again, and
        // nothing is quarantined for it.
        let engine = registry.instantiate(&selection).await.map_err(|e| {
            let code = match e {
                vilvona_core::registry::ResolveError::Passing { .. } => TRANSIENT,
                _ => ENGINE_ERROR,
            };
            RpcError::new(code, error_chain(&e))
        })?;
        // What the gateway gave, for the command line on this state directory (a record that
        // cannot be written costs the command line its copy, not the gateway its engine).
        if let Err(error) = crate::gateway_settings::record(
            &setup.state_dir,
            &setup.engine_id,
            setup.config.as_ref(),
        ) {
            tracing::warn!(%error, state_dir = %setup.state_dir.display(), "the engine settings could not be recorded for the command line");
        }
        Ok(Active {
            engine,
            _registry: registry,
        })
    }

    async fn call(
        &self,
        method: &str,
        params: Value,
        cancelled: watch::Receiver<bool>,
    ) -> Result<Value, RpcError> {
        fn parse<T: DeserializeOwned>(method: &str, params: Value) -> Result<T, RpcError> {
            serde_json::from_value(params)
                .map_err(|error| RpcError::new(INVALID_PARAMS, format!("{method}: {error}")))
        }
        fn reply<T: serde::Serialize>(value: T) -> Result<Value, RpcError> {
            serde_json::to_value(value)
                .map_err(|error| RpcError::new(ENGINE_ERROR, error_chain(&error)))
        }
        // Parses the method's parameters as `$params` and calls the engine's `$member` with them.
        macro_rules! engine_call {
            ($member:ident, $params:ty) => {{
                let params: $params = parse(method, params)?;
                self.engine()
                    .await?
                    .$member(&params)
                    .await
                    .map_err(|e| engine_error(method, e))?
            }};
        }
        match method {
            "initialize" => self.initialize(params).await,
            "bootstrap" => reply(engine_call!(bootstrap, BootstrapParams)),
            "ingest" => reply(engine_call!(ingest, IngestParams)),
            "ingestBatch" => reply(engine_call!(ingest_batch, IngestBatchParams)),
            "assemble" => {
                let held = params.get("assembledRevision").and_then(Value::as_u64);
                let params: AssembleParams = parse(method, params)?;
                let result = self
                    .engine()
                    .await?
                    .assemble(&params)
                    .await
                    .map_err(|e| engine_error(method, e))?;
                assembled_reply(&self.sent, &params.session_id, held, result)
                    .map_err(|error| RpcError::new(ENGINE_ERROR, error_chain(&error)))
            }
            "compact" => {
                let mut params: CompactParams = parse(method, params)?;
                let abort = AbortSignal::new();
                params.abort = Some(abort.clone());
                let mut watcher = cancelled.clone();
                let relay = tokio::spawn(async move {
                    if watcher.wait_for(|flag| *flag).await.is_ok() {
                        abort.abort();
                    }
                });
                let result = self.engine().await?.compact(&params).await;
                relay.abort();
                reply(result.map_err(|e| engine_error(method, e))?)
            }
            "afterTurn" => {
                engine_call!(after_turn, AfterTurnParams);
                Ok(json!({}))
            }
            "commitTurn" => reply(engine_call!(commit_turn, CommitTurnParams)),
            "maintain" => reply(engine_call!(maintain, MaintainParams)),
            "prepareSubagentSpawn" => {
                let prepared = engine_call!(prepare_subagent_spawn, SubagentSpawnParams);
                Ok(match prepared {
                    None => json!({"rollbackHandle": null}),
                    Some(rollback) => {
                        let handle = format!(
                            "rollback-{}",
                            self.next_handle.fetch_add(1, Ordering::Relaxed)
                        );
                        lock(&self.rollbacks).insert(handle.clone(), rollback);
                        json!({"rollbackHandle": handle})
                    }
                })
            }
            "rollback" => {
                let handle = params
                    .get("handle")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let held = lock(&self.rollbacks).remove(&handle);
                match (held, params.get("childSessionKey").and_then(Value::as_str)) {
                    (Some(rollback), _) => rollback
                        .rollback()
                        .await
                        .map_err(|e| engine_error(method, e))?,
                    // The handle was made by a process that is gone (it lived in its memory):
                    // the child never ran, so ending it as deleted undoes its preparation —
                    // its grant revoked, a fork's seeded context and row forgotten.
                    (None, Some(child)) => self
                        .engine()
                        .await?
                        .on_subagent_ended(&SubagentEndedParams {
                            child_session_key: child.to_owned(),
                            reason: SubagentEndReason::Deleted,
                        })
                        .await
                        .map_err(|e| engine_error(method, e))?,
                    (None, None) => {
                        return Err(RpcError::new(
                            INVALID_PARAMS,
                            format!("rollback: unknown handle {handle:?} and no childSessionKey"),
                        ));
                    }
                }
                Ok(json!({}))
            }
            "onSubagentEnded" => {
                engine_call!(on_subagent_ended, SubagentEndedParams);
                Ok(json!({}))
            }
            "onSessionReset" => {
                engine_call!(on_session_reset, SessionResetParams);
                Ok(json!({}))
            }
            "dispose" => {
                self.engine()
                    .await?
                    .dispose()
                    .await
                    .map_err(|e| engine_error(method, e))?;
                Ok(json!({}))
            }
            "tools/list" => Ok(json!({"tools": reply(self.engine().await?.tools())?})),
            "tools/call" => {
                let engine = self.engine().await?;
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let caller = ToolCaller {
                    session_id: params
                        .get("sessionId")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    session_key: params
                        .get("sessionKey")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                };
                let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
                engine
                    .call_tool(&caller, name, &arguments)
                    .await
                    .map_err(|error| {
                        RpcError::new(TOOL_ERROR, format!("{name}: {}", error_chain(&error)))
                    })
            }
            other => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("unknown method {other:?}"),
            )),
        }
    }

    async fn initialize(&self, params: Value) -> Result<Value, RpcError> {
        let setup = Setup {
            state_dir: params
                .get("stateDir")
                .and_then(Value::as_str)
                .map_or_else(|| self.state_dir.clone(), PathBuf::from),
            engine_id: params
                .get("engineId")
                .and_then(Value::as_str)
                .unwrap_or(DEFAULT_ENGINE)
                .to_owned(),
            config: params
                .get("config")
                .cloned()
                .filter(|config| !config.is_null()),
        };
        if let Some(existing) = self.active.read().await.as_ref() {
            return Ok(json!({"info": existing.engine.info(), "alreadyInitialized": true}));
        }
        // Kept before opening: if the engine cannot open now, the next call tries again.
        *lock(&self.setup) = Some(setup);
        let engine = self.engine().await?;
        let info = engine.info();
        let tools = serde_json::to_value(engine.tools())
            .map_err(|error| RpcError::new(ENGINE_ERROR, error_chain(&error)))?;
        Ok(json!({
            "info": info,
            "transcriptSemantics": info.transcript_semantics,
            "acceptedHostParams": info.accepted_host_params,
            "hostRequirements": info.host_requirements,
            "tools": tools,
        }))
    }

    async fn shutdown(&self) {
        for flag in lock(&self.in_flight).values() {
            let _ = flag.send(true);
        }
        for (_, waiter) in lock(&self.reverse).drain() {
            let _ = waiter.send(Err("the client went away".to_owned()));
        }
        if let Some(active) = self.active.write().await.take()
            && let Err(error) = active.engine.dispose().await
        {
            tracing::warn!(%error, "disposing the engine failed");
        }
    }
}

/// The tools an engine declares at registration (`params.engineId`, default lossless).
fn declared_tools(params: &Value) -> Result<Value, RpcError> {
    let registry = Registry::new();
    register_lossless(&registry, None).map_err(|e| RpcError::new(ENGINE_ERROR, error_chain(&e)))?;
    let engine_id = params
        .get("engineId")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_ENGINE);
    let tools = serde_json::to_value(registry.declared_tools(engine_id))
        .map_err(|error| RpcError::new(ENGINE_ERROR, error_chain(&error)))?;
    Ok(json!({ "tools": tools }))
}

/// The id of a request that does not parse, when it can still be read (a top-level `"id":`
/// followed by a number or a plain string): the client waiting on it then gets its answer.
/// `null` otherwise, as JSON-RPC prescribes.
fn readable_id(line: &[u8]) -> Value {
    let text = String::from_utf8_lossy(line);
    let Some(at) = text.find("\"id\"") else {
        return Value::Null;
    };
    let rest = text[at + 4..].trim_start();
    let Some(rest) = rest.strip_prefix(':') else {
        return Value::Null;
    };
    let rest = rest.trim_start();
    if let Some(string) = rest.strip_prefix('"') {
        return match string.find(['"', '\\']) {
            Some(end) if string.as_bytes()[end] == b'"' => Value::String(string[..end].to_owned()),
            _ => Value::Null,
        };
    }
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse::<i64>().map_or(Value::Null, Value::from)
}

/// A summarizer that asks the client's host model (`runtimeContext.llm.complete`).
#[derive(Debug)]
struct HostLlmSummarizer {
    server: Weak<Server>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

#[async_trait]
impl Summarizer for HostLlmSummarizer {
    fn id(&self) -> &str {
        "host-llm/v1"
    }

    /// Within a client's call that brought the host's model, or did not say.
    fn in_reach(&self) -> bool {
        CALLER
            .try_with(|caller| caller.host_model != Some(false))
            .unwrap_or(false)
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let text = self
            .complete(
                "summarize",
                request.target_tokens.saturating_mul(2),
                summary_prompts(request),
            )
            .await?;
        Ok(Summary::new(text, request.level))
    }

    async fn answer(&self, request: &QuestionRequest) -> Result<Answer, SummarizeError> {
        let text = self
            .complete(
                "answer",
                request.max_answer_tokens.saturating_mul(2),
                answer_prompts(request),
            )
            .await?;
        parse_answer(&text, request, self.id())
            .ok_or_else(|| SummarizeError::BadOutput("llm.complete returned no answer".to_owned()))
    }
}

impl HostLlmSummarizer {
    /// One `llm.complete` request to the client: a system and a user prompt, for `purpose`,
    /// answered in at most `max_tokens`. Its text, reasoning stripped.
    async fn complete(
        &self,
        purpose: &str,
        max_tokens: u64,
        (system, user): (String, String),
    ) -> Result<String, SummarizeError> {
        if !self.in_reach() {
            return Err(SummarizeError::Transient(format!(
                "llm.complete (error {HOST_LLM_ERROR}): no host model in scope: the call did not bring one"
            )));
        }
        // No caller outside a client's call: the client then has no model to answer with.
        let scope = CALLER
            .try_with(|caller| caller.id.clone())
            .unwrap_or(Value::Null);
        let params = json!({
            "scope": scope,
            "purpose": purpose,
            "maxTokens": max_tokens,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        });
        let server = self
            .server
            .upgrade()
            .ok_or_else(|| SummarizeError::Transient("the server is shutting down".to_owned()))?;
        let answer = server
            .request("llm.complete", params)
            .await
            .map_err(|error| {
                SummarizeError::Transient(format!("llm.complete (error {HOST_LLM_ERROR}): {error}"))
            })?;
        let text = answer
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                answer
                    .get("content")
                    .and_then(Value::as_array)
                    .map(|blocks| {
                        blocks
                            .iter()
                            .filter_map(|block| block.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
            })
            .or_else(|| answer.as_str().map(str::to_owned))
            .unwrap_or_default();
        if text.trim().is_empty() {
            // OpenClaw 2026.9.6 answers a provider's failure (a 503, an outage) with an empty
            // completion, not an error: the model is unavailable, not writing badly.
            return Err(SummarizeError::Transient(
                "llm.complete returned nothing: the host's model is unavailable".to_owned(),
            ));
        }
        let text = strip_reasoning(&text);
        if text.is_empty() {
            return Err(SummarizeError::BadOutput(
                "llm.complete returned no text".to_owned(),
            ));
        }
        Ok(text)
    }
}

/// The line with every lone UTF-16 surrogate escape (`\ud83d` alone: a JavaScript string cut
/// in the middle of an emoji, which `JSON.stringify` writes as valid JSON text) replaced by
/// `\ufffd`, the replacement character, as JavaScript's `toWellFormed` does; `None` when the
/// line has none (its parse error is another). Escaped pairs stay as they are, and so does an
/// escaped backslash before `u` (`\\ud83d` is text). The same string always becomes the same
/// text, so a message sent again is recognised as before.
fn well_formed(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let escape_at = |at: usize| -> Option<u32> {
        let hex = bytes.get(at..at + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        u32::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    };
    let mut out = String::with_capacity(line.len());
    let (mut copied, mut at, mut repaired) = (0, 0, false);
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        match escape_at(at) {
            Some(code @ 0xD800..=0xDFFF) => {
                let paired = code <= 0xDBFF
                    && escape_at(at + 6).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low));
                if paired {
                    at += 12;
                } else {
                    out.push_str(&line[copied..at]);
                    out.push_str("\\ufffd");
                    at += 6;
                    copied = at;
                    repaired = true;
                }
            }
            // Any other escape, `\\` included: its two characters are passed over together.
            _ => at += 2,
        }
    }
    if !repaired {
        return None;
    }
    out.push_str(&line[copied..]);
    Some(out)
}

/// Serves requests read from `input` until it closes, answering on `output`; `state_dir` is
/// where `initialize` opens the engine unless it names another.
pub async fn serve(
    state_dir: PathBuf,
    store_url: Option<String>,
    input: impl AsyncBufRead + Unpin,
    output: impl AsyncWrite + Unpin + Send + 'static,
) {
    let (out, mut lines_out) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = lines_out.recv().await {
            if output.write_all(line.as_bytes()).await.is_err()
                || output.write_all(b"\n").await.is_err()
                || output.flush().await.is_err()
            {
                break;
            }
        }
    });
    let server = Arc::new(Server {
        out,
        state_dir,
        store_url,
        active: RwLock::new(None),
        setup: StdMutex::new(None),
        in_flight: StdMutex::new(HashMap::new()),
        answered: Notify::new(),
        database_lost: Notify::new(),
        queues: StdMutex::new(HashMap::new()),
        session_keys: StdMutex::new(SessionKeys::default()),
        rollbacks: StdMutex::new(HashMap::new()),
        next_handle: AtomicU64::new(1),
        reverse: StdMutex::new(HashMap::new()),
        next_reverse: AtomicU64::new(1),
        sent: StdMutex::new(SentContexts::default()),
        me: StdMutex::new(Weak::new()),
    });
    *lock(&server.me) = Arc::downgrade(&server);
    // Lines are read as bytes: one line that is not UTF-8 gets a parse error, and the server
    // keeps serving. Only the end of the input (or a read error) ends it.
    let mut input = input;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = tokio::select! {
            read = input.read_until(b'\n', &mut line) => read,
            () = server.database_lost.notified() => {
                // At once, not after a graceful shutdown: while this process holds the
                // database, a new one shares its stale view of the cut log and fails too. The
                // answer just sent is given a moment to be written; a call still in flight
                // fails as the process's death, which the client retries on the new one.
                tracing::warn!("the engine's database was lost under this process; exiting, so that a new process opens it anew");
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::process::exit(0);
            }
        };
        match read {
            Ok(0) => break,
            Ok(_) => match String::from_utf8(std::mem::take(&mut line)) {
                Ok(text) => server.handle_line(text),
                Err(error) => server.respond(
                    readable_id(error.as_bytes()),
                    Err(RpcError::new(
                        PARSE_ERROR,
                        format!(
                            "parse error: the line is not UTF-8 ({})",
                            error.utf8_error()
                        ),
                    )),
                ),
            },
            Err(error) => {
                tracing::warn!(%error, "reading the input failed");
                break;
            }
        }
    }
    tracing::info!("the input closed; cancelling in-flight calls and disposing the engine");
    server.shutdown().await;
    // Every cancelled call answers; wait for the last answer (bounded), then stop writing.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        loop {
            let answered = server.answered.notified();
            if lock(&server.in_flight).is_empty() {
                break;
            }
            answered.await;
        }
    })
    .await;
    lock(&server.queues).clear();
    drop(server);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, writer).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child's own calls, its end and a rollback of its spawn wait in one queue (its end may
    /// forget it); a spawn waits with its parent's calls. Before, each method keyed its own
    /// way: a late call of the child ran while the child was forgotten.
    #[test]
    fn one_session_key_one_queue_whatever_the_method() {
        let child = json!({"sessionId": "c-1", "sessionKey": "agent:main:subagent:c"});
        let ended = json!({"childSessionKey": "agent:main:subagent:c", "reason": "deleted"});
        let rolled = json!({"handle": "rollback-1", "childSessionKey": "agent:main:subagent:c"});
        let spawn =
            json!({"parentSessionKey": "agent:main:p", "childSessionKey": "agent:main:subagent:c"});
        let parent = json!({"sessionId": "p-1", "sessionKey": "agent:main:p"});
        let mut keys = SessionKeys::default();
        let mut queue_key = |method: &str, params: &Value| keys.queue_key(method, params);
        let child_queue = queue_key("assemble", &child);
        assert_eq!(child_queue.as_deref(), Some("agent:main:subagent:c"));
        assert_eq!(queue_key("onSubagentEnded", &ended), child_queue);
        assert_eq!(queue_key("rollback", &rolled), child_queue);
        assert_eq!(queue_key("tools/call", &child), child_queue);
        assert_eq!(
            queue_key("prepareSubagentSpawn", &spawn),
            queue_key("commitTurn", &parent)
        );
        assert_eq!(
            queue_key("assemble", &json!({"sessionId": "s"})).as_deref(),
            Some("s")
        );
        assert_eq!(queue_key("tools/list", &json!({})), None);
        // A call naming only its session's id, once a call named the key beside it.
        assert_eq!(
            queue_key("afterTurn", &json!({"sessionId": "c-1"})),
            child_queue
        );
    }

    /// Past its bound the map forgets the session least recently named, not every session (a
    /// live one's id-only calls kept their key's queue); a spawn's child id and key are learned.
    #[test]
    fn session_keys_forget_the_least_recently_named() {
        let mut keys = SessionKeys::default();
        let live = json!({"sessionId": "live", "sessionKey": "agent:main:live"});
        let live_by_id = json!({"sessionId": "live"});
        keys.queue_key("assemble", &live);
        for other in 0..KNOWN_SESSION_KEYS * 2 {
            let other =
                json!({"sessionId": format!("s-{other}"), "sessionKey": format!("k-{other}")});
            keys.queue_key("assemble", &other);
            assert_eq!(
                keys.queue_key("afterTurn", &live_by_id).as_deref(),
                Some("agent:main:live")
            );
        }
        assert_eq!(keys.keys.len(), KNOWN_SESSION_KEYS);
        assert_eq!(
            keys.queue_key("afterTurn", &json!({"sessionId": "s-0"}))
                .as_deref(),
            Some("s-0"),
            "the least recently named went"
        );
        let spawn = json!({
            "parentSessionKey": "agent:main:live",
            "childSessionId": "c-9",
            "childSessionKey": "agent:main:subagent:c9",
        });
        keys.queue_key("prepareSubagentSpawn", &spawn);
        assert_eq!(
            keys.queue_key("afterTurn", &json!({"sessionId": "c-9"}))
                .as_deref(),
            Some("agent:main:subagent:c9")
        );
    }

    /// Lone surrogate escapes become U+FFFD; pairs, escaped backslashes and other escapes stay.
    #[test]
    fn well_formed_replaces_only_lone_surrogates() {
        let table: [(&str, Option<&str>); 9] = [
            (r#""a\ud83d""#, Some(r#""a\ufffd""#)),
            (r#""\udc80b""#, Some(r#""\ufffdb""#)),
            (r#""\ud83d\ude80""#, None),
            (r#""\ud83d\ud83d\ude80""#, Some(r#""\ufffd\ud83d\ude80""#)),
            (r#""\\ud83d""#, None),
            (r#""\\\ud83d""#, Some(r#""\\\ufffd""#)),
            (r#""\u00e9 \n""#, None),
            (r#""\ud83d\n""#, Some(r#""\ufffd\n""#)),
            (r#""é\ud83d é""#, Some(r#""é\ufffd é""#)),
        ];
        for (line, expected) in table {
            let repaired = well_formed(line);
            assert_eq!(repaired.as_deref(), expected, "{line}");
            let parsed: Value = serde_json::from_str(repaired.as_deref().unwrap_or(line)).unwrap();
            assert!(parsed.is_string(), "{line}");
        }
    }

    /// A client tells a broken engine (-32001) from everything else by the code alone.
    #[test]
    fn errors_are_sorted_into_broken_and_the_rest() {
        let cases = [
            (EngineError::Cancelled, CANCELLED),
            (EngineError::HistoryNeeded, HISTORY_NEEDED),
            (
                EngineError::transient("lossless compact", std::io::Error::other("busy")),
                TRANSIENT,
            ),
            (EngineError::failed("the store is corrupt"), ENGINE_ERROR),
        ];
        for (error, code) in cases {
            let text = error.to_string();
            assert_eq!(engine_error("compact", error).code, code, "{text}");
        }
    }
}
