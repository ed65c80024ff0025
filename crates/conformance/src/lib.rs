//! The conformance kit of the context-engine contract (`vilvona-core`): the contract's
//! behaviours, checked against any engine.
//!
//! Engine crates take this crate as a dev-dependency (it holds test doubles and panics on a
//! broken expectation, so it never ships in a binary) and call:
//!
//! - [`check_contract`] with an engine instance: every lifecycle member behaves as the contract
//!   says (results well-formed, optional members defaulted, idempotency where declared);
//! - [`check_selection_table`] with their host's `legacy` factory: the slot-resolution,
//!   quarantine and failure-policy table of [`selection_cases`];
//! - [`check_host_requirement_table`]: the fail-closed host-capability table.
//!
//! Failures are collected and reported together, one line per broken expectation.

#![allow(clippy::panic)]

use std::collections::BTreeSet;

use serde_json::json;

use vilvona_core::message::AgentMessage;

mod contract;
mod host_requirements;
mod selection;

pub use contract::check_contract;
pub use host_requirements::{
    HostRequirementCase, check_host_requirement_table, host_requirement_cases,
};
pub use selection::{
    Call, Failure, LegacyStandIn, PROBE_ENGINE_ID, PROBE_PLUGIN_ID, ProbeEngine, ProbeSetup,
    SelectionCase, check_selection_case, check_selection_table, legacy_stand_in_factory,
    selection_cases,
};

// --- fixtures -----------------------------------------------------------------------------------

/// The session an engine is checked on.
#[derive(Clone, Debug)]
pub struct SessionFixture {
    pub session_id: String,
    pub session_key: Option<String>,
    /// A transcript path, for engines that read one (legacy compaction, bootstrap).
    pub session_file: Option<String>,
}

impl SessionFixture {
    pub fn new(session_id: &str) -> SessionFixture {
        SessionFixture {
            session_id: session_id.to_owned(),
            session_key: Some(format!("agent:main:{session_id}")),
            session_file: None,
        }
    }
}

/// What the engine under test is expected to do where engines legitimately differ.
#[derive(Clone, Copy, Debug, Default)]
pub struct Expectations {
    /// `ingest` stores messages (`ingested: true` the first time, `false` for a repeat).
    pub stores_messages: bool,
    /// `assemble` returns the host's messages unchanged with `estimated_tokens: 0` (legacy).
    pub passes_through: bool,
}

/// A short coding-agent exchange: a request, a tool call and its result, an answer. Each
/// message carries a timestamp, so two calls give equal messages.
pub fn sample_conversation() -> Vec<AgentMessage> {
    let raw = [
        json!({"role": "user", "content": "Fix the flaky test in crates/store/src/lib.rs, ticket OPS-1234.", "timestamp": 1_772_442_351_000_i64}),
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Reading the file first."},
            {"type": "toolCall", "id": "call_1", "name": "read", "arguments": {"path": "crates/store/src/lib.rs"}}
        ], "stopReason": "toolUse", "timestamp": 1_772_442_360_000_i64}),
        json!({"role": "toolResult", "toolCallId": "call_1", "toolName": "read", "content": [
            {"type": "text", "text": "fn flaky() { sleep(10); assert!(done()); }"}
        ], "isError": false, "timestamp": 1_772_442_361_000_i64}),
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "The test sleeps instead of waiting; replaced the sleep with a barrier."}
        ], "stopReason": "stop", "timestamp": 1_772_442_380_000_i64}),
    ];
    raw.into_iter()
        .filter_map(|value| serde_json::from_value(value).ok())
        .collect()
}

/// Checks that no tool result appears before (or without) the assistant message that called
/// it. Returns the first violation.
pub fn check_tool_pairs(messages: &[AgentMessage]) -> Result<(), String> {
    let mut open: BTreeSet<&str> = BTreeSet::new();
    for (index, message) in messages.iter().enumerate() {
        for call in message.tool_calls() {
            open.insert(&call.id);
        }
        if let Some(id) = message.tool_result_call_id()
            && !open.contains(id)
        {
            return Err(format!(
                "message {index}: tool result for \"{id}\" without its tool call before it"
            ));
        }
    }
    Ok(())
}

// --- reporting ---------------------------------------------------------------------------------

#[derive(Default)]
pub(crate) struct Report {
    failures: Vec<String>,
}

impl Report {
    pub(crate) fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(what());
        }
    }

    pub(crate) fn finish(self, title: &str) {
        if !self.failures.is_empty() {
            panic!(
                "{title}: {} failure(s)\n  - {}",
                self.failures.len(),
                self.failures.join("\n  - ")
            );
        }
    }
}
