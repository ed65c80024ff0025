//! Host capabilities, operations, and the fail-closed host-requirement check.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Something a host can do for an engine. Serialized in kebab-case, as OpenClaw names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// The host calls `bootstrap` for a session with a transcript.
    Bootstrap,
    /// The host calls `assemble` before the prompt.
    AssembleBeforePrompt,
    /// The host calls `after_turn`.
    AfterTurn,
    /// The host calls `maintain`.
    Maintain,
    /// The host calls `compact`.
    Compact,
    /// The host offers its model (`runtimeContext.llm.complete`).
    RuntimeLlmComplete,
    /// The host projects context into persistent backend threads.
    ThreadBootstrapProjection,
    /// The host passes reference context.
    ReferenceContext,
}

impl Capability {
    /// Every capability.
    pub const ALL: [Capability; 8] = [
        Capability::Bootstrap,
        Capability::AssembleBeforePrompt,
        Capability::ReferenceContext,
        Capability::AfterTurn,
        Capability::Maintain,
        Capability::Compact,
        Capability::RuntimeLlmComplete,
        Capability::ThreadBootstrapProjection,
    ];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Bootstrap => "bootstrap",
            Capability::AssembleBeforePrompt => "assemble-before-prompt",
            Capability::AfterTurn => "after-turn",
            Capability::Maintain => "maintain",
            Capability::Compact => "compact",
            Capability::RuntimeLlmComplete => "runtime-llm-complete",
            Capability::ThreadBootstrapProjection => "thread-bootstrap-projection",
            Capability::ReferenceContext => "reference-context",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit of work a host starts with an engine; host requirements are declared per operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// An agent run (a turn).
    AgentRun,
    /// A manual `/compact`.
    ManualCompact,
    /// A subagent spawn.
    SubagentSpawn,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 3] = [
        Operation::AgentRun,
        Operation::ManualCompact,
        Operation::SubagentSpawn,
    ];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::AgentRun => "agent-run",
            Operation::ManualCompact => "manual-compact",
            Operation::SubagentSpawn => "subagent-spawn",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an engine needs from the host for one operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRequirement {
    /// What the host must offer.
    pub required_capabilities: BTreeSet<Capability>,
    /// The engine's own sentence for a host that does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsupported_message: Option<String>,
}

/// Per-operation requirements, as `info.hostRequirements`.
pub type HostRequirements = BTreeMap<Operation, HostRequirement>;

/// A host: its id, a label for messages, and the capabilities it advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProfile {
    /// The host's id.
    pub id: String,
    /// A display name.
    pub label: String,
    /// What it offers.
    pub capabilities: BTreeSet<Capability>,
}

impl HostProfile {
    /// The embedded host: runs the whole lifecycle itself and advertises every capability.
    pub fn embedded() -> HostProfile {
        HostProfile {
            id: "embedded".to_owned(),
            label: "the embedded host".to_owned(),
            capabilities: Capability::ALL.into_iter().collect(),
        }
    }

    /// A generic command-line backend: it never calls `assemble` before the prompt.
    pub fn cli(backend_id: &str) -> HostProfile {
        HostProfile {
            id: format!("cli:{backend_id}"),
            label: format!("the CLI backend \"{backend_id}\""),
            capabilities: [
                Capability::Bootstrap,
                Capability::AfterTurn,
                Capability::Maintain,
            ]
            .into_iter()
            .collect(),
        }
    }
}

/// The host cannot give an engine what it declared it needs for an operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "Context engine \"{engine_id}\" cannot run operation \"{operation}\" on {host_label}. \
     Missing host capabilities: {missing}. Required capabilities: {required}. \
     Host capabilities: {available}.{message}",
    missing = join(missing),
    required = join(required),
    available = join(available),
    message = unsupported_message.as_deref().map(|m| format!(" {m}")).unwrap_or_default()
)]
pub struct HostRequirementError {
    /// The engine.
    pub engine_id: String,
    /// The operation refused.
    pub operation: Operation,
    /// The host's id.
    pub host_id: String,
    /// The host's display name.
    pub host_label: String,
    /// Required capabilities the host lacks.
    pub missing: Vec<Capability>,
    /// Every required capability.
    pub required: Vec<Capability>,
    /// What the host offers.
    pub available: Vec<Capability>,
    /// The engine's own sentence, when it has one.
    pub unsupported_message: Option<String>,
}

fn join(capabilities: &[Capability]) -> String {
    if capabilities.is_empty() {
        return "(none)".to_owned();
    }
    capabilities
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks an engine's declared requirements for `operation` against `host`. Fails closed: the
/// caller must not start the operation on an error. This is not a quarantine.
pub fn check_host_support(
    engine_id: &str,
    requirements: &HostRequirements,
    operation: Operation,
    host: &HostProfile,
) -> Result<(), Box<HostRequirementError>> {
    let Some(requirement) = requirements.get(&operation) else {
        return Ok(());
    };
    let missing: Vec<Capability> = requirement
        .required_capabilities
        .difference(&host.capabilities)
        .copied()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Box::new(HostRequirementError {
        engine_id: engine_id.to_owned(),
        operation,
        host_id: host.id.clone(),
        host_label: host.label.clone(),
        missing,
        required: requirement.required_capabilities.iter().copied().collect(),
        available: host.capabilities.iter().copied().collect(),
        unsupported_message: requirement.unsupported_message.clone(),
    }))
}
