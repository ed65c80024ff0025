//! `lossless`: a context engine that never loses a message.
//!
//! Every message is stored verbatim once (`vilvona-store`). The context is a list of items —
//! messages and summaries — kept under the token budget by folding older history into a DAG of
//! summaries whose edges point back at what they replaced: leaves over runs of raw messages,
//! condensed nodes over runs of same-depth summaries. Compaction runs incrementally after each
//! turn, just enough to get under a target, and every pass must shrink the context. The agent
//! recovers any detail with the recall tools (`vilvona_grep`, `vilvona_describe`,
//! `vilvona_expand`). Subagents get scoped, expiring read grants.

#![warn(missing_docs)]

mod admin;
mod arguments;
mod assembly;
mod bootstrap;
mod budget;
mod cache;
mod catch_up;
mod compaction;
mod config;
mod contract;
mod dates;
mod engine;
mod errors;
mod forget;
mod ingest;
mod lru;
mod maintain;
mod memory;
mod recall;
mod registration;
mod render;
mod reset;
mod stand_ins;
mod subagents;
mod tools;
mod turns;
mod units;

pub use budget::{HostPrompt, Limits};
pub use compaction::{CompactionReport, CompactionRequest};
pub use config::{
    AssemblyRecall, ConfigError, EmbeddingSelection, LosslessConfig, OverCap, RecallScope,
    RetentionPolicy, StoreSelection,
};
pub use engine::{CachedSessions, ENGINE_ID, LosslessEngine};
pub use errors::ToolError;
pub use forget::{Forgotten, RetentionAction, RetentionKind};
pub use registration::{BuildSummarizer, factory};
pub use render::{DESCRIBE_TOOL, EXPAND_QUERY_TOOL, EXPAND_TOOL, GREP_TOOL, RECALL_GUIDANCE};
pub use tools::tool_definitions;
pub use vilvona_core::admin::{ToolCaller, ToolDefinition};
pub use vilvona_summarize::parse_rfc3339;
