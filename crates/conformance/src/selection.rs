//! Slot resolution, quarantine and the failure policy, checked with a probe engine whose
//! failures are set by the case.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_core::registry::*;

use crate::Report;

/// The id and owner of the plugin engine the selection table registers.
pub const PROBE_ENGINE_ID: &str = "probe";
pub const PROBE_PLUGIN_ID: &str = "probe-plugin";

/// How the probe engine is registered for a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeSetup {
    /// Registered and healthy, except that `fail_at` stages fail (as `fail_as` says).
    Engine {
        fail_at: &'static [Stage],
        fail_as: Failure,
    },
    /// Registered with a factory that errors.
    FailingFactory,
    /// Registered with a factory whose engine has an empty name.
    InvalidContract,
    /// Not registered at all.
    Unregistered,
}

/// How the probe's failing stages fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// An error: the engine is broken.
    Error,
    /// [`EngineError::Cancelled`].
    Cancelled,
    /// [`EngineError::Transient`]: the call may succeed if tried again.
    Transient,
}

/// A call the row makes after resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Stage(Stage),
    /// `compact` with an abort signal that is already aborted.
    AbortedCompact,
}

/// One row of the selection table.
#[derive(Clone, Debug)]
pub struct SelectionCase {
    pub name: &'static str,
    pub slot: Option<&'static str>,
    pub probe: ProbeSetup,
    /// `plugins.entries.probe-plugin.enabled`.
    pub enabled: Option<bool>,
    pub policy: FailurePolicy,
    pub calls: &'static [Call],
    /// The `info().id` of the serving engine after the calls.
    pub expect_engine: &'static str,
    /// The recorded quarantine stage for the probe, if any.
    pub expect_quarantine: Option<Stage>,
    /// Substring of the error the resolution or the *last* call returns; `None` = all succeed.
    pub expect_error: Option<&'static str>,
    /// Whether the probe's factory may have been called.
    pub expect_factory_called: bool,
}

const HEALTHY: ProbeSetup = ProbeSetup::Engine {
    fail_at: &[],
    fail_as: Failure::Error,
};

/// The slot/policy/quarantine table, mined from OpenClaw's registry and quarantine behaviour.
pub fn selection_cases() -> Vec<SelectionCase> {
    let row = |name, slot, probe, calls, expect_engine| SelectionCase {
        name,
        slot,
        probe,
        enabled: None,
        policy: FailurePolicy::Fallback,
        calls,
        expect_engine,
        expect_quarantine: None,
        expect_error: None,
        expect_factory_called: expect_engine == PROBE_ENGINE_ID,
    };
    let lifecycle_failure = |name, stage| SelectionCase {
        expect_quarantine: Some(stage),
        expect_factory_called: true,
        ..row(
            name,
            Some(PROBE_ENGINE_ID),
            ProbeSetup::Engine {
                fail_at: match stage {
                    Stage::Bootstrap => &[Stage::Bootstrap],
                    Stage::Ingest => &[Stage::Ingest],
                    Stage::IngestBatch => &[Stage::IngestBatch],
                    Stage::AfterTurn => &[Stage::AfterTurn],
                    Stage::Assemble => &[Stage::Assemble],
                    Stage::Maintain => &[Stage::Maintain],
                    Stage::OnSubagentEnded => &[Stage::OnSubagentEnded],
                    Stage::OnSessionReset => &[Stage::OnSessionReset],
                    _ => &[],
                },
                fail_as: Failure::Error,
            },
            match stage {
                Stage::Bootstrap => &[Call::Stage(Stage::Bootstrap)],
                Stage::Ingest => &[Call::Stage(Stage::Ingest)],
                Stage::IngestBatch => &[Call::Stage(Stage::IngestBatch)],
                Stage::AfterTurn => &[Call::Stage(Stage::AfterTurn)],
                Stage::Assemble => &[Call::Stage(Stage::Assemble)],
                Stage::Maintain => &[Call::Stage(Stage::Maintain)],
                Stage::OnSubagentEnded => &[Call::Stage(Stage::OnSubagentEnded)],
                Stage::OnSessionReset => &[Call::Stage(Stage::OnSessionReset)],
                _ => &[],
            },
            LEGACY_ENGINE_ID,
        )
    };
    vec![
        row(
            "unset slot selects legacy",
            None,
            HEALTHY,
            &[Call::Stage(Stage::Assemble)],
            LEGACY_ENGINE_ID,
        ),
        row(
            "empty slot selects legacy",
            Some(""),
            HEALTHY,
            &[],
            LEGACY_ENGINE_ID,
        ),
        row(
            "\"legacy\" selects legacy",
            Some("legacy"),
            HEALTHY,
            &[],
            LEGACY_ENGINE_ID,
        ),
        row(
            "\"none\" selects legacy",
            Some("none"),
            HEALTHY,
            &[],
            LEGACY_ENGINE_ID,
        ),
        row(
            "a registered engine is selected",
            Some("probe"),
            HEALTHY,
            &[Call::Stage(Stage::Assemble)],
            PROBE_ENGINE_ID,
        ),
        row(
            "the slot value is trimmed",
            Some("  probe  "),
            HEALTHY,
            &[],
            PROBE_ENGINE_ID,
        ),
        SelectionCase {
            enabled: Some(true),
            ..row(
                "an enabled entry keeps the engine",
                Some("probe"),
                HEALTHY,
                &[],
                PROBE_ENGINE_ID,
            )
        },
        SelectionCase {
            enabled: Some(false),
            ..row(
                "a disabled entry selects legacy silently, without calling the factory",
                Some("probe"),
                ProbeSetup::FailingFactory,
                &[Call::Stage(Stage::Assemble)],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            enabled: Some(false),
            policy: FailurePolicy::Strict,
            ..row(
                "a disabled entry selects legacy even under the strict policy",
                Some("probe"),
                HEALTHY,
                &[],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::Resolve),
            ..row(
                "an unknown engine is quarantined and legacy serves",
                Some("missing"),
                ProbeSetup::Unregistered,
                &[Call::Stage(Stage::Assemble)],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::Resolve),
            policy: FailurePolicy::Strict,
            expect_error: Some(
                "Context engine \"missing\" is not registered. Available engines: legacy",
            ),
            ..row(
                "strict: an unknown engine fails resolution",
                Some("missing"),
                ProbeSetup::Unregistered,
                &[],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::Factory),
            expect_factory_called: true,
            ..row(
                "a failing factory is quarantined and legacy serves",
                Some("probe"),
                ProbeSetup::FailingFactory,
                &[Call::Stage(Stage::Ingest)],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::Factory),
            expect_factory_called: true,
            policy: FailurePolicy::Strict,
            expect_error: Some("probe factory exploded"),
            ..row(
                "strict: a failing factory fails resolution",
                Some("probe"),
                ProbeSetup::FailingFactory,
                &[],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::ContractValidation),
            expect_factory_called: true,
            ..row(
                "an engine with an empty name fails contract validation",
                Some("probe"),
                ProbeSetup::InvalidContract,
                &[Call::Stage(Stage::Assemble)],
                LEGACY_ENGINE_ID,
            )
        },
        lifecycle_failure(
            "a failing bootstrap quarantines; legacy serves the retry",
            Stage::Bootstrap,
        ),
        lifecycle_failure(
            "a failing ingest quarantines; legacy serves the retry",
            Stage::Ingest,
        ),
        lifecycle_failure(
            "a failing ingest_batch quarantines; legacy serves the retry",
            Stage::IngestBatch,
        ),
        lifecycle_failure(
            "a failing after_turn quarantines; legacy serves the retry",
            Stage::AfterTurn,
        ),
        lifecycle_failure(
            "a failing assemble quarantines; legacy serves the retry",
            Stage::Assemble,
        ),
        lifecycle_failure(
            "a failing maintain quarantines; legacy serves the retry",
            Stage::Maintain,
        ),
        lifecycle_failure(
            "a failing on_subagent_ended quarantines; legacy serves the retry",
            Stage::OnSubagentEnded,
        ),
        lifecycle_failure(
            "a failing on_session_reset quarantines; legacy serves the retry",
            Stage::OnSessionReset,
        ),
        SelectionCase {
            expect_quarantine: Some(Stage::Compact),
            expect_error: Some("probe failed during compact"),
            expect_factory_called: true,
            ..row(
                "a failing compact quarantines and returns its error",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Compact],
                    fail_as: Failure::Error,
                },
                &[Call::Stage(Stage::Compact)],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::PrepareSubagentSpawn),
            expect_error: Some("probe failed during prepareSubagentSpawn"),
            expect_factory_called: true,
            ..row(
                "a failing spawn preparation quarantines and returns its error",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::PrepareSubagentSpawn],
                    fail_as: Failure::Error,
                },
                &[Call::Stage(Stage::PrepareSubagentSpawn)],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::Assemble),
            expect_factory_called: true,
            ..row(
                "after quarantine every call goes to legacy",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Assemble],
                    fail_as: Failure::Error,
                },
                &[
                    Call::Stage(Stage::Assemble),
                    Call::Stage(Stage::Ingest),
                    Call::Stage(Stage::Compact),
                ],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_quarantine: Some(Stage::Ingest),
            expect_factory_called: true,
            ..row(
                "the first failure is the one recorded",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Ingest, Stage::Assemble],
                    fail_as: Failure::Error,
                },
                &[Call::Stage(Stage::Ingest), Call::Stage(Stage::Assemble)],
                LEGACY_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_error: Some("cancelled"),
            ..row(
                "a cancelled call never quarantines",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Assemble],
                    fail_as: Failure::Cancelled,
                },
                &[Call::Stage(Stage::Assemble)],
                PROBE_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_error: Some("probe's store was busy during compact"),
            ..row(
                "a transient failure never quarantines, and is not retried on legacy",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Assemble, Stage::Compact],
                    fail_as: Failure::Transient,
                },
                &[Call::Stage(Stage::Assemble), Call::Stage(Stage::Compact)],
                PROBE_ENGINE_ID,
            )
        },
        SelectionCase {
            expect_error: Some("cancelled"),
            ..row(
                "an already-aborted compact is cancelled before it starts",
                Some("probe"),
                HEALTHY,
                &[Call::AbortedCompact],
                PROBE_ENGINE_ID,
            )
        },
        SelectionCase {
            policy: FailurePolicy::Strict,
            expect_quarantine: Some(Stage::Assemble),
            expect_error: Some("probe failed during assemble"),
            ..row(
                "strict: a failing call returns its error instead of using legacy",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Assemble],
                    fail_as: Failure::Error,
                },
                &[Call::Stage(Stage::Assemble)],
                PROBE_ENGINE_ID,
            )
        },
        SelectionCase {
            policy: FailurePolicy::Strict,
            expect_quarantine: Some(Stage::Assemble),
            expect_error: Some("failure policy is strict"),
            ..row(
                "strict: calls after a quarantine fail too",
                Some("probe"),
                ProbeSetup::Engine {
                    fail_at: &[Stage::Assemble],
                    fail_as: Failure::Error,
                },
                &[Call::Stage(Stage::Assemble), Call::Stage(Stage::Ingest)],
                PROBE_ENGINE_ID,
            )
        },
    ]
}

/// Runs every row of [`selection_cases`] on a fresh registry where `legacy` is registered with
/// `legacy_factory` (the host's real default engine). Panics with every failing row.
pub async fn check_selection_table(legacy_factory: EngineFactory) {
    let mut report = Report::default();
    for case in selection_cases() {
        if let Err(problem) = check_selection_case(&case, legacy_factory.clone()).await {
            report.failures.push(format!("{}: {problem}", case.name));
        }
    }
    report.finish("selection table");
}

/// Runs one row; `Err` describes how the outcome differed from the row.
pub async fn check_selection_case(
    case: &SelectionCase,
    legacy_factory: EngineFactory,
) -> Result<(), String> {
    let registry = Registry::new();
    registry
        .register(LEGACY_ENGINE_ID, Owner::Core, legacy_factory)
        .map_err(|error| format!("registering legacy: {error}"))?;
    let factory_calls = Arc::new(AtomicUsize::new(0));
    if let Some(factory) = probe_factory(case.probe, factory_calls.clone()) {
        registry
            .register(PROBE_ENGINE_ID, Owner::plugin(PROBE_PLUGIN_ID), factory)
            .map_err(|error| format!("registering the probe: {error}"))?;
    }
    let mut selection = EngineSelection {
        slot: case.slot.map(str::to_owned),
        failure_policy: case.policy,
        ..EngineSelection::default()
    };
    if case.enabled.is_some() {
        selection.entries.insert(
            PROBE_PLUGIN_ID.to_owned(),
            EntrySettings {
                enabled: case.enabled,
                ..EntrySettings::default()
            },
        );
    }

    let mut last_error: Option<String> = None;
    match registry.resolve(&selection).await {
        Err(error) => last_error = Some(error.to_string()),
        Ok(resolved) => {
            for call in case.calls {
                last_error = run_call(&*resolved.engine, *call)
                    .await
                    .err()
                    .map(|e| e.to_string());
            }
            let serving = resolved.engine.info().id;
            if serving != case.expect_engine {
                return Err(format!(
                    "expected \"{}\" to serve, but \"{serving}\" does",
                    case.expect_engine
                ));
            }
        }
    }
    match (&last_error, case.expect_error) {
        (None, None) => {}
        (Some(error), None) => return Err(format!("unexpected error: {error}")),
        (None, Some(expected)) => return Err(format!("expected an error containing {expected:?}")),
        (Some(error), Some(expected)) => {
            if !error.contains(expected) {
                return Err(format!("error {error:?} does not contain {expected:?}"));
            }
        }
    }
    let quarantined = registry
        .quarantine_of(case.slot.map(str::trim).unwrap_or_default())
        .map(|record| record.operation);
    if quarantined != case.expect_quarantine {
        return Err(format!(
            "expected quarantine {:?}, found {quarantined:?}",
            case.expect_quarantine
        ));
    }
    let called = factory_calls.load(Ordering::SeqCst) > 0;
    if called && !case.expect_factory_called {
        return Err("the probe's factory was called".to_owned());
    }
    Ok(())
}

fn probe_factory(setup: ProbeSetup, calls: Arc<AtomicUsize>) -> Option<EngineFactory> {
    match setup {
        ProbeSetup::Unregistered => None,
        ProbeSetup::FailingFactory => Some(engine_factory(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(EngineError::failed("probe factory exploded")) }
        })),
        ProbeSetup::InvalidContract => Some(engine_factory(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                let engine: Arc<dyn ContextEngine> = Arc::new(ProbeEngine {
                    name: String::new(),
                    ..ProbeEngine::default()
                });
                Ok(engine)
            }
        })),
        ProbeSetup::Engine { fail_at, fail_as } => Some(engine_factory(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let engine: Arc<dyn ContextEngine> = Arc::new(ProbeEngine {
                    fail_at: fail_at.to_vec(),
                    fail_as,
                    ..ProbeEngine::default()
                });
                Ok(engine)
            }
        })),
    }
}

async fn run_call(engine: &dyn ContextEngine, call: Call) -> Result<(), EngineError> {
    let session_id = "conformance".to_owned();
    let message = AgentMessage::user_text("hello");
    match call {
        Call::AbortedCompact => {
            let abort = AbortSignal::new();
            abort.abort();
            engine
                .compact(&CompactParams {
                    session_id,
                    abort: Some(abort),
                    ..CompactParams::default()
                })
                .await
                .map(drop)
        }
        Call::Stage(stage) => match stage {
            Stage::Bootstrap => engine
                .bootstrap(&BootstrapParams {
                    session_id,
                    ..BootstrapParams::default()
                })
                .await
                .map(drop),
            Stage::Ingest => engine
                .ingest(&IngestParams {
                    session_id,
                    session_key: None,
                    message,
                    entry_id: None,
                    is_heartbeat: false,
                })
                .await
                .map(drop),
            Stage::IngestBatch => engine
                .ingest_batch(&IngestBatchParams {
                    session_id,
                    messages: vec![message],
                    ..IngestBatchParams::default()
                })
                .await
                .map(drop),
            Stage::AfterTurn => {
                engine
                    .after_turn(&AfterTurnParams {
                        session_id,
                        messages: vec![message].into(),
                        ..AfterTurnParams::default()
                    })
                    .await
            }
            Stage::Assemble => engine
                .assemble(&AssembleParams {
                    session_id,
                    messages: vec![message].into(),
                    token_budget: Some(1_000),
                    ..AssembleParams::default()
                })
                .await
                .map(drop),
            Stage::Compact => engine
                .compact(&CompactParams {
                    session_id,
                    ..CompactParams::default()
                })
                .await
                .map(drop),
            Stage::Maintain => engine
                .maintain(&MaintainParams {
                    session_id,
                    ..MaintainParams::default()
                })
                .await
                .map(drop),
            Stage::CommitTurn => engine
                .commit_turn(&CommitTurnParams {
                    advancement_key: "k".to_owned(),
                    session_id,
                    ..CommitTurnParams::default()
                })
                .await
                .map(drop),
            Stage::PrepareSubagentSpawn => engine
                .prepare_subagent_spawn(&SubagentSpawnParams {
                    parent_session_key: "parent".to_owned(),
                    child_session_key: "child".to_owned(),
                    ..SubagentSpawnParams::default()
                })
                .await
                .map(drop),
            Stage::OnSubagentEnded => {
                engine
                    .on_subagent_ended(&SubagentEndedParams {
                        child_session_key: "child".to_owned(),
                        reason: SubagentEndReason::Completed,
                    })
                    .await
            }
            Stage::OnSessionReset => {
                engine
                    .on_session_reset(&SessionResetParams {
                        session_id,
                        ..SessionResetParams::default()
                    })
                    .await
            }
            Stage::CallTool => engine
                .call_tool(
                    &vilvona_core::admin::ToolCaller::new(session_id, None),
                    "probe",
                    &serde_json::Value::Null,
                )
                .await
                .map(drop),
            Stage::Resolve | Stage::Factory | Stage::ContractValidation => Ok(()),
        },
    }
}

/// A plugin engine for the tables: records its calls, fails (or is cancelled) at chosen stages.
#[derive(Debug)]
pub struct ProbeEngine {
    pub name: String,
    pub fail_at: Vec<Stage>,
    /// How the `fail_at` stages fail.
    pub fail_as: Failure,
    pub calls: Mutex<Vec<Stage>>,
}

impl Default for ProbeEngine {
    fn default() -> ProbeEngine {
        ProbeEngine {
            name: "Probe Engine".to_owned(),
            fail_at: Vec::new(),
            fail_as: Failure::Error,
            calls: Mutex::new(Vec::new()),
        }
    }
}

impl ProbeEngine {
    fn enter(&self, stage: Stage) -> Result<(), EngineError> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(stage);
        if !self.fail_at.contains(&stage) {
            Ok(())
        } else {
            Err(match self.fail_as {
                Failure::Cancelled => EngineError::Cancelled,
                Failure::Transient => EngineError::Transient {
                    message: format!("probe's store was busy during {stage}"),
                    source: None,
                },
                Failure::Error => EngineError::failed(format!("probe failed during {stage}")),
            })
        }
    }
}

#[async_trait]
impl ContextEngine for ProbeEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: PROBE_ENGINE_ID.to_owned(),
            name: self.name.clone(),
            owns_compaction: true,
            ..EngineInfo::default()
        }
    }

    async fn ingest(&self, _params: &IngestParams) -> Result<IngestResult, EngineError> {
        self.enter(Stage::Ingest)?;
        Ok(IngestResult { ingested: true })
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        self.enter(Stage::Assemble)?;
        Ok(AssembleResult {
            messages: params.messages.clone(),
            estimated_tokens: 1,
            ..AssembleResult::default()
        })
    }

    async fn compact(&self, _params: &CompactParams) -> Result<CompactResult, EngineError> {
        self.enter(Stage::Compact)?;
        Ok(CompactResult::unchanged(CompactReason::BelowThreshold, 0))
    }

    async fn bootstrap(&self, _params: &BootstrapParams) -> Result<BootstrapResult, EngineError> {
        self.enter(Stage::Bootstrap)?;
        Ok(BootstrapResult::default())
    }

    async fn ingest_batch(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        self.enter(Stage::IngestBatch)?;
        Ok(IngestBatchResult {
            ingested_count: params.messages.len() as u64,
        })
    }

    async fn after_turn(&self, _params: &AfterTurnParams) -> Result<(), EngineError> {
        self.enter(Stage::AfterTurn)
    }

    async fn maintain(&self, _params: &MaintainParams) -> Result<MaintainResult, EngineError> {
        self.enter(Stage::Maintain)?;
        Ok(MaintainResult::default())
    }

    async fn prepare_subagent_spawn(
        &self,
        _params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        self.enter(Stage::PrepareSubagentSpawn)?;
        Ok(None)
    }

    async fn on_subagent_ended(&self, _params: &SubagentEndedParams) -> Result<(), EngineError> {
        self.enter(Stage::OnSubagentEnded)
    }

    async fn on_session_reset(&self, _params: &SessionResetParams) -> Result<(), EngineError> {
        self.enter(Stage::OnSessionReset)
    }
}

/// A stand-in for the host's `legacy` engine, for tests and examples that must not depend on
/// the real one: ingest stores nothing, assemble passes the host's messages through with
/// `estimated_tokens: 0`, compact reports that it cannot compact.
#[derive(Debug, Default)]
pub struct LegacyStandIn;

#[async_trait]
impl ContextEngine for LegacyStandIn {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: LEGACY_ENGINE_ID.to_owned(),
            name: "Legacy stand-in".to_owned(),
            ..EngineInfo::default()
        }
    }

    async fn ingest(&self, _params: &IngestParams) -> Result<IngestResult, EngineError> {
        Ok(IngestResult { ingested: false })
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        Ok(AssembleResult {
            messages: params.messages.clone(),
            estimated_tokens: 0,
            ..AssembleResult::default()
        })
    }

    async fn compact(&self, _params: &CompactParams) -> Result<CompactResult, EngineError> {
        Ok(CompactResult::unchanged(CompactReason::TooSmall, 0))
    }
}

/// A factory for [`LegacyStandIn`], to register under [`LEGACY_ENGINE_ID`].
pub fn legacy_stand_in_factory() -> EngineFactory {
    engine_factory(|_| async {
        let engine: Arc<dyn ContextEngine> = Arc::new(LegacyStandIn);
        Ok(engine)
    })
}
