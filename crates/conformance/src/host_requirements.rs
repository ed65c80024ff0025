//! The fail-closed host-capability table: what a host must offer an engine that requires it.

use vilvona_core::host::{Capability, HostProfile, HostRequirement, Operation, check_host_support};

use crate::Report;

/// One row of the host-requirement table.
#[derive(Clone, Debug)]
pub struct HostRequirementCase {
    pub name: &'static str,
    /// The operation the engine declares `required` for.
    pub declared_for: Operation,
    pub required: &'static [Capability],
    pub unsupported_message: Option<&'static str>,
    pub operation: Operation,
    pub host: HostProfile,
    /// Substrings the error must contain; `None` when the check must pass.
    pub expect_error: Option<&'static [&'static str]>,
}

pub fn host_requirement_cases() -> Vec<HostRequirementCase> {
    use Capability::*;
    vec![
        HostRequirementCase {
            name: "no requirements pass anywhere",
            declared_for: Operation::AgentRun,
            required: &[],
            unsupported_message: None,
            operation: Operation::AgentRun,
            host: HostProfile::cli("claude-cli"),
            expect_error: None,
        },
        HostRequirementCase {
            name: "the embedded host satisfies assemble-before-prompt",
            declared_for: Operation::AgentRun,
            required: &[AssembleBeforePrompt],
            unsupported_message: None,
            operation: Operation::AgentRun,
            host: HostProfile::embedded(),
            expect_error: None,
        },
        HostRequirementCase {
            name: "a CLI backend lacks assemble-before-prompt",
            declared_for: Operation::AgentRun,
            required: &[AssembleBeforePrompt, AfterTurn],
            unsupported_message: Some("Select the legacy engine for CLI backends."),
            operation: Operation::AgentRun,
            host: HostProfile::cli("claude-cli"),
            expect_error: Some(&[
                "Context engine \"probe\" cannot run operation \"agent-run\" on the CLI backend \"claude-cli\".",
                "Missing host capabilities: assemble-before-prompt.",
                "Required capabilities: assemble-before-prompt, after-turn.",
                "Host capabilities: bootstrap, after-turn, maintain.",
                "Select the legacy engine for CLI backends.",
            ]),
        },
        HostRequirementCase {
            name: "requirements apply only to their operation",
            declared_for: Operation::AgentRun,
            required: &[AssembleBeforePrompt],
            unsupported_message: None,
            operation: Operation::ManualCompact,
            host: HostProfile::cli("claude-cli"),
            expect_error: None,
        },
        HostRequirementCase {
            name: "manual compaction that needs compact on a CLI backend",
            declared_for: Operation::ManualCompact,
            required: &[Compact],
            unsupported_message: None,
            operation: Operation::ManualCompact,
            host: HostProfile::cli("codex"),
            expect_error: Some(&["Missing host capabilities: compact."]),
        },
    ]
}

/// Runs [`host_requirement_cases`]. Panics with every failing row.
pub fn check_host_requirement_table() {
    let mut report = Report::default();
    for case in host_requirement_cases() {
        let mut requirements = vilvona_core::host::HostRequirements::new();
        requirements.insert(
            case.declared_for,
            HostRequirement {
                required_capabilities: case.required.iter().copied().collect(),
                unsupported_message: case.unsupported_message.map(str::to_owned),
            },
        );
        let outcome = check_host_support("probe", &requirements, case.operation, &case.host);
        match (outcome, case.expect_error) {
            (Ok(()), None) => {}
            (Ok(()), Some(_)) => report.failures.push(format!(
                "{}: expected a fail-closed error, got none",
                case.name
            )),
            (Err(error), None) => report
                .failures
                .push(format!("{}: expected success, got: {error}", case.name)),
            (Err(error), Some(parts)) => {
                let text = error.to_string();
                for part in parts {
                    report.check(text.contains(part), || {
                        format!("{}: error text lacks {part:?}: {text}", case.name)
                    });
                }
            }
        }
    }
    report.finish("host-requirement table");
}
