//! The contract's members: [`ContextEngine`] for [`LosslessEngine`], each handed to the module
//! that does the job ([`crate::ingest`], [`crate::bootstrap`], [`crate::compaction`],
//! [`crate::assembly`], [`crate::subagents`], [`crate::tools`]). Nothing in the crate imports
//! this module: the job modules never reach back to the contract.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use vilvona_core::admin::{EngineAdmin, ToolCaller, ToolDefinition};
use vilvona_core::engine::*;
use vilvona_core::host::{Capability, HostRequirement, Operation};

use crate::engine::{ENGINE_ID, LosslessEngine};
use crate::tools::tool_definitions;

/// Host requirement: the engine must control the prompt through `assemble`.
fn host_requirements() -> vilvona_core::host::HostRequirements {
    let mut requirements = vilvona_core::host::HostRequirements::new();
    requirements.insert(
        Operation::AgentRun,
        HostRequirement {
            required_capabilities: [Capability::AssembleBeforePrompt].into_iter().collect(),
            unsupported_message: Some(
                "The lossless engine builds the model's context in assemble(); this host never calls it before the prompt. \
                 Use the embedded host, or select the legacy engine for this backend."
                    .to_owned(),
            ),
        },
    );
    requirements
}

#[async_trait]
impl ContextEngine for LosslessEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            id: ENGINE_ID.to_owned(),
            name: "Lossless Context Engine".to_owned(),
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            owns_compaction: true,
            host_requirements: host_requirements(),
            turn_maintenance_mode: TurnMaintenanceMode::Foreground,
            accepted_host_params: [
                HostParam::SessionKey,
                HostParam::Prompt,
                HostParam::AbortSignal,
            ]
            .into_iter()
            .collect(),
            transcript_semantics: Some(TranscriptSemantics::durable_v1()),
        }
    }

    async fn bootstrap(&self, params: &BootstrapParams) -> Result<BootstrapResult, EngineError> {
        self.bootstrap_session(params).await
    }

    async fn ingest(&self, params: &IngestParams) -> Result<IngestResult, EngineError> {
        self.ingest_one(params).await
    }

    async fn ingest_batch(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        self.ingest_many(params).await
    }

    async fn after_turn(&self, params: &AfterTurnParams) -> Result<(), EngineError> {
        self.ingest_turn(params).await
    }

    async fn commit_turn(
        &self,
        params: &CommitTurnParams,
    ) -> Result<CommitTurnResult, EngineError> {
        self.commit_durable_turn(params).await
    }

    async fn assemble(&self, params: &AssembleParams) -> Result<AssembleResult, EngineError> {
        self.assemble_for(params).await
    }

    async fn compact(&self, params: &CompactParams) -> Result<CompactResult, EngineError> {
        self.compact_for(params).await
    }

    async fn maintain(&self, params: &MaintainParams) -> Result<MaintainResult, EngineError> {
        self.maintain_session(params).await
    }

    async fn prepare_subagent_spawn(
        &self,
        params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        self.spawn_subagent(params).await
    }

    async fn on_subagent_ended(&self, params: &SubagentEndedParams) -> Result<(), EngineError> {
        self.end_subagent(params).await
    }

    async fn on_session_reset(&self, params: &SessionResetParams) -> Result<(), EngineError> {
        self.reset_session(params).await
    }

    fn tools(&self) -> Vec<ToolDefinition> {
        tool_definitions()
    }

    async fn call_tool(
        &self,
        caller: &ToolCaller,
        name: &str,
        arguments: &Value,
    ) -> Result<Value, EngineError> {
        Ok(LosslessEngine::call_tool(self, caller, name, arguments).await?)
    }

    fn admin(&self) -> Option<Arc<dyn EngineAdmin>> {
        Some(self.as_admin())
    }

    /// Lets background work (retention) finish: nothing is left half-applied at shutdown.
    async fn dispose(&self) -> Result<(), EngineError> {
        self.settled().await;
        Ok(())
    }
}
