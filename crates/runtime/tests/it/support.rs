//! A recording engine and a scripted model.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_core::registry::{Owner, Registry, engine_factory};
use vilvona_runtime::{HostConfig, HostError, Model, ModelError, ModelRequest, ModelResponse};

/// What the recording engine does.
#[derive(Clone, Debug)]
pub(crate) struct Behaviour {
    pub(crate) owns_compaction: bool,
    pub(crate) authority: PromptAuthority,
    pub(crate) estimated_tokens: u64,
    pub(crate) addition: Option<String>,
    /// Whether `compact` reports that it freed tokens.
    pub(crate) compacts: bool,
    /// `after_turn` is overridden (else the trait default ingests the new messages).
    pub(crate) has_after_turn: bool,
    /// Stages that fail.
    pub(crate) fail: Vec<&'static str>,
    pub(crate) rollback: bool,
}

impl Default for Behaviour {
    fn default() -> Behaviour {
        Behaviour {
            owns_compaction: true,
            authority: PromptAuthority::Assembled,
            estimated_tokens: 10,
            addition: None,
            compacts: true,
            has_after_turn: true,
            fail: Vec::new(),
            rollback: false,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) behaviour: Behaviour,
    pub(crate) calls: Arc<Mutex<Vec<String>>>,
    /// Messages seen by ingest / after_turn, per session, in order.
    pub(crate) seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Recorder {
    fn record(&self, call: &str) -> Result<(), EngineError> {
        self.calls.lock().unwrap().push(call.to_owned());
        if self.behaviour.fail.contains(&call) {
            Err(EngineError::failed(format!(
                "recorder failed during {call}"
            )))
        } else {
            Ok(())
        }
    }
}

#[derive(Debug)]
struct Rollback(Arc<Mutex<Vec<String>>>);

#[async_trait]
impl SpawnRollback for Rollback {
    async fn rollback(self: Box<Self>) -> Result<(), EngineError> {
        self.0.lock().unwrap().push("rollback".to_owned());
        Ok(())
    }
}

#[async_trait]
impl ContextEngine for Recorder {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: "recorder".to_owned(),
            name: "Recording Engine".to_owned(),
            owns_compaction: self.behaviour.owns_compaction,
            ..EngineInfo::default()
        }
    }

    async fn ingest(&self, params: &IngestParams) -> Result<IngestResult, EngineError> {
        self.record("ingest")?;
        self.seen
            .lock()
            .unwrap()
            .push((params.session_id.clone(), params.message.plain_text()));
        Ok(IngestResult { ingested: true })
    }

    async fn ingest_batch(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        self.record("ingest_batch")?;
        let mut seen = self.seen.lock().unwrap();
        for message in &params.messages {
            seen.push((params.session_id.clone(), message.plain_text()));
        }
        Ok(IngestBatchResult {
            ingested_count: params.messages.len() as u64,
        })
    }

    async fn after_turn(&self, params: &AfterTurnParams) -> Result<(), EngineError> {
        if !self.behaviour.has_after_turn {
            let (messages, entry_ids) = params.new_messages();
            return self
                .ingest_batch(&IngestBatchParams {
                    session_id: params.session_id.clone(),
                    session_key: params.session_key.clone(),
                    messages: messages.to_vec(),
                    entry_ids: entry_ids.to_vec(),
                    is_heartbeat: false,
                })
                .await
                .map(drop);
        }
        self.record("after_turn")?;
        let (messages, _) = params.new_messages();
        let mut seen = self.seen.lock().unwrap();
        for message in messages {
            seen.push((params.session_id.clone(), message.plain_text()));
        }
        Ok(())
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        self.record("assemble")?;
        Ok(AssembleResult {
            messages: params.messages.clone(),
            estimated_tokens: self.behaviour.estimated_tokens,
            system_prompt_addition: self.behaviour.addition.clone(),
            prompt_authority: self.behaviour.authority,
            ..AssembleResult::default()
        })
    }

    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError> {
        self.record(if params.force {
            "compact(force)"
        } else {
            "compact"
        })?;
        Ok(if self.behaviour.compacts {
            CompactResult::compacted(CompactDetails {
                tokens_before: 100,
                tokens_after: Some(10),
                ..CompactDetails::default()
            })
        } else {
            CompactResult::unchanged(CompactReason::NoCandidate, 100)
        })
    }

    async fn bootstrap(&self, _params: &BootstrapParams) -> Result<BootstrapResult, EngineError> {
        self.record("bootstrap")?;
        Ok(BootstrapResult::default())
    }

    async fn maintain(&self, params: &MaintainParams) -> Result<MaintainResult, EngineError> {
        self.record(&format!("maintain({:?})", params.reason).to_lowercase())?;
        Ok(MaintainResult::default())
    }

    async fn prepare_subagent_spawn(
        &self,
        _params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        self.record("prepare_subagent_spawn")?;
        Ok(self
            .behaviour
            .rollback
            .then(|| Box::new(Rollback(self.calls.clone())) as Box<dyn SpawnRollback>))
    }

    async fn on_subagent_ended(&self, _params: &SubagentEndedParams) -> Result<(), EngineError> {
        self.record("on_subagent_ended")
    }
}

pub(crate) type CallLog = Arc<Mutex<Vec<String>>>;
pub(crate) type SeenLog = Arc<Mutex<Vec<(String, String)>>>;

/// Registers a recorder under `recorder` and returns its call log and seen messages.
pub(crate) fn register_recorder(
    behaviour: Behaviour,
) -> (
    impl FnOnce(&Registry, &HostConfig) -> Result<(), HostError>,
    CallLog,
    SeenLog,
) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (calls_for_factory, seen_for_factory) = (calls.clone(), seen.clone());
    let register = move |registry: &Registry, _config: &HostConfig| {
        registry
            .register(
                "recorder",
                Owner::plugin("recorder"),
                engine_factory(move |_| {
                    let engine: Arc<dyn ContextEngine> = Arc::new(Recorder {
                        behaviour: behaviour.clone(),
                        calls: calls_for_factory.clone(),
                        seen: seen_for_factory.clone(),
                    });
                    async move { Ok(engine) }
                }),
            )
            .map_err(HostError::from)
    };
    (register, calls, seen)
}

/// A model that answers from a script: `Ok(text)` or an overflow.
#[derive(Debug, Default)]
pub(crate) struct ScriptedModel {
    pub(crate) script: Mutex<VecDeque<Result<String, String>>>,
    pub(crate) requests: Mutex<Vec<ModelRequest>>,
}

impl ScriptedModel {
    pub(crate) fn new(script: Vec<Result<&str, &str>>) -> ScriptedModel {
        ScriptedModel {
            script: Mutex::new(
                script
                    .into_iter()
                    .map(|step| step.map(str::to_owned).map_err(str::to_owned))
                    .collect(),
            ),
            requests: Mutex::default(),
        }
    }
}

#[async_trait]
impl Model for ScriptedModel {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        match self.script.lock().unwrap().pop_front() {
            Some(Ok(text)) => Ok(ModelResponse {
                messages: vec![AgentMessage::assistant_text(text)],
                input_tokens: Some(5),
                output_tokens: Some(2),
            }),
            Some(Err(detail)) => Err(ModelError::Overflow(detail)),
            None => Ok(ModelResponse {
                messages: vec![AgentMessage::assistant_text("ok")],
                input_tokens: None,
                output_tokens: None,
            }),
        }
    }
}

pub(crate) fn write_config(dir: &std::path::Path, text: &str) {
    std::fs::write(dir.join("vilvona.json5"), text).unwrap();
}
