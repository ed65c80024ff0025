//! The context-engine contract.
//!
//! A *context engine* decides what an agent's model sees on each run: which messages, how older
//! history is summarized, how context crosses subagent boundaries. This crate is the contract
//! between engines and the hosts that drive them, shaped after OpenClaw's:
//!
//! - [`message`]: OpenClaw agent messages as typed values that round-trip losslessly;
//! - [`engine`]: the [`ContextEngine`] trait, its parameters and results;
//! - [`admin`]: the optional members: tools for the model, and the administration of stored
//!   history;
//! - [`host`]: host capabilities and the fail-closed host-requirement check;
//! - [`registry`]: engine registration, slot resolution, quarantine and failure policy;
//! - [`tokens`] and [`summarize`]: the token-estimation and summarizer seams;
//! - [`clock`]: the time, injectable.
//!
//! It does no IO: no files, no network, no database. Engines and hosts live in other crates.

#![warn(missing_docs)]

pub mod admin;
pub mod archive;
pub mod clock;
pub mod engine;
mod error;
pub mod host;
pub mod message;
pub mod registry;
pub mod suggest;
pub mod summarize;
pub mod tokens;

pub use admin::{EngineAdmin, ToolCaller, ToolDefinition};
pub use engine::{
    AbortSignal, AfterTurnParams, AssembleParams, AssembleResult, AssembledSummary,
    BootstrapParams, BootstrapResult, CommitStatus, CommitTurnParams, CommitTurnResult,
    CompactDetails, CompactParams, CompactReason, CompactResult, CompactionTarget, ContextEngine,
    ContextMode, ContextProjection, EngineError, EngineInfo, HostParam, IngestBatchParams,
    IngestBatchResult, IngestParams, IngestResult, MaintainParams, MaintainReason, MaintainResult,
    ProjectionMode, PromptAuthority, SessionResetParams, SpawnPreparation, SpawnRollback,
    SubagentEndReason, SubagentEndedParams, SubagentSpawnParams, TranscriptSemantics,
    TurnMaintenanceMode,
};
pub use host::{
    Capability, HostProfile, HostRequirement, HostRequirementError, HostRequirements, Operation,
    check_host_support,
};
pub use message::{AgentMessage, ContentBlock, MessageContent};
pub use registry::{
    EngineFactory, EngineSelection, EntrySettings, FactoryContext, FailurePolicy, LEGACY_ENGINE_ID,
    Owner, QuarantineRecord, Registry, ResolvedEngine, SelectionSource, Stage, engine_factory,
    error_chain,
};
pub use summarize::{Summarizer, SummaryRequest};
pub use tokens::{HeuristicEstimator, TokenEstimator};
