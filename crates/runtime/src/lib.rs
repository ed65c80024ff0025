//! The vilvona host: what an agent gateway embeds, and what the command line drives.
//!
//! - [`config`]: the JSON5 configuration with OpenClaw's keys (the only module that knows the
//!   file format);
//! - [`Host`]: engine selection through `plugins.slots.contextEngine`, session transcripts and
//!   `sessions.json`, the turn lifecycle (`run_turn`, `replay_turn`, `compact`, subagents);
//! - [`model`] and [`openai`]: the model seam and an OpenAI-compatible client;
//! - [`model_summarizer`]: the model-backed summarizer with the extractive default behind it;
//! - [`pruning`], [`memory`], [`doctor`], and [`sdk`] helpers for engine authors.

pub mod config;
pub mod context_report;
pub mod doctor;
pub mod gateway_settings;
pub mod host;
mod json5_layout;
pub mod memory;
pub mod model;
pub mod model_summarizer;
pub mod openai;
pub mod privacy;
pub mod pruning;
pub mod sdk;
pub mod serve;
pub mod sessions;
pub mod workspace;

pub use config::{HostConfig, reset_context_engine_slot};
pub use doctor::{Check, DoctorReport, doctor};
pub use host::{Host, HostError, HostOptions, SubagentSpawn, TurnReport, default_state_dir};
pub use model::{Model, ModelError, ModelRequest, ModelResponse, ToolSpec};
/// The schema version of the stores this build reads and writes.
pub use vilvona_store::SCHEMA_VERSION as STORE_SCHEMA_VERSION;
