//! The system prompt of a run, as OpenClaw builds it: the host's own prompt, the tool list,
//! the skills list, the workspace line and the workspace's bootstrap files under "Project
//! Context" (each capped, the total capped, truncation marked in the prompt). The same
//! [`SystemPrompt`] feeds the model request and the `/context` report, so what the report says
//! was injected is what the model got.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::model::ToolSpec;

/// The workspace files injected into the system prompt, in order (OpenClaw's set).
pub const BOOTSTRAP_FILES: [&str; 7] = [
    "AGENTS.md",
    "SOUL.md",
    "TOOLS.md",
    "IDENTITY.md",
    "USER.md",
    "HEARTBEAT.md",
    "BOOTSTRAP.md",
];

/// Caps on injected bootstrap text (`agents.defaults.bootstrapMaxChars`,
/// `agents.defaults.bootstrapTotalMaxChars`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootstrapLimits {
    pub per_file_max_chars: usize,
    pub total_max_chars: usize,
}

impl Default for BootstrapLimits {
    fn default() -> BootstrapLimits {
        BootstrapLimits {
            per_file_max_chars: 20_000,
            total_max_chars: 60_000,
        }
    }
}

/// Whether a bootstrap file was injected whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FileStatus {
    Ok,
    Truncated,
    Missing,
}

/// One bootstrap file as injected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectedFile {
    pub name: String,
    pub status: FileStatus,
    pub raw_chars: usize,
    pub injected_chars: usize,
    /// The injected text (not reported: `/context` shows sizes, never contents).
    #[serde(skip)]
    pub text: String,
}

/// One skill's entry in the skills list: `<workspace>/skills/<dir>/SKILL.md` with `name` and
/// `description` in its front matter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub location: PathBuf,
    /// The entry's characters in the system prompt.
    pub entry_chars: usize,
}

/// A run's system prompt and where its characters come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemPrompt {
    pub text: String,
    pub workspace: Option<PathBuf>,
    pub base_chars: usize,
    pub tool_list_chars: usize,
    pub skills: Vec<Skill>,
    pub skills_chars: usize,
    pub files: Vec<InjectedFile>,
    /// The "Project Context" section: the injected files with their headings.
    pub project_context_chars: usize,
}

/// Builds the system prompt for a run.
pub fn build_system_prompt(
    base: &str,
    tools: &[ToolSpec],
    workspace: Option<&Path>,
    limits: BootstrapLimits,
) -> SystemPrompt {
    let mut prompt = SystemPrompt {
        text: base.to_owned(),
        workspace: workspace.map(Path::to_path_buf),
        base_chars: base.chars().count(),
        ..SystemPrompt::default()
    };
    if !tools.is_empty() {
        let section: String = std::iter::once("\n\n## Tooling\n".to_owned())
            .chain(
                tools
                    .iter()
                    .map(|tool| format!("- {}: {}\n", tool.name, tool.description)),
            )
            .collect();
        prompt.tool_list_chars = section.chars().count();
        prompt.text.push_str(&section);
    }
    let Some(workspace) = workspace else {
        return prompt;
    };
    prompt.skills = skills(workspace);
    if !prompt.skills.is_empty() {
        let mut section =
            String::from("\n\n## Skills\nRead a skill's SKILL.md only when the task needs it.\n");
        for skill in &prompt.skills {
            section.push_str(&skill_entry(skill));
        }
        prompt.skills_chars = section.chars().count();
        prompt.text.push_str(&section);
    }
    prompt.text.push_str(&format!(
        "\n\n## Workspace\nWorking directory: {}\n",
        workspace.display()
    ));
    prompt.files = bootstrap_files(workspace, limits);
    let injected: Vec<&InjectedFile> = prompt
        .files
        .iter()
        .filter(|file| file.status != FileStatus::Missing)
        .collect();
    if !injected.is_empty() {
        let mut section = String::from("\n\n# Project Context\n");
        for file in injected {
            section.push_str(&format!("\n## {}\n{}\n", file.name, file.text));
            if file.status == FileStatus::Truncated {
                section.push_str(&format!(
                    "[{} truncated: {} of {} characters injected]\n",
                    file.name, file.injected_chars, file.raw_chars
                ));
            }
        }
        prompt.project_context_chars = section.chars().count();
        prompt.text.push_str(&section);
    }
    prompt
}

/// The bootstrap files of a workspace, each within `per_file_max_chars` and all within
/// `total_max_chars` (earlier files first).
pub fn bootstrap_files(workspace: &Path, limits: BootstrapLimits) -> Vec<InjectedFile> {
    let mut total = 0;
    BOOTSTRAP_FILES
        .iter()
        .map(|name| match std::fs::read_to_string(workspace.join(name)) {
            Err(_) => InjectedFile {
                name: (*name).to_owned(),
                status: FileStatus::Missing,
                raw_chars: 0,
                injected_chars: 0,
                text: String::new(),
            },
            Ok(text) => {
                let raw = text.chars().count();
                let allowed = limits
                    .per_file_max_chars
                    .min(limits.total_max_chars.saturating_sub(total));
                let injected = raw.min(allowed);
                total += injected;
                InjectedFile {
                    name: (*name).to_owned(),
                    status: if injected < raw {
                        FileStatus::Truncated
                    } else {
                        FileStatus::Ok
                    },
                    raw_chars: raw,
                    injected_chars: injected,
                    text: text.chars().take(injected).collect(),
                }
            }
        })
        .collect()
}

fn skill_entry(skill: &Skill) -> String {
    format!(
        "- {}: {} ({})\n",
        skill.name,
        skill.description,
        skill.location.display()
    )
}

/// The skills of a workspace, by name.
fn skills(workspace: &Path) -> Vec<Skill> {
    let Ok(entries) = std::fs::read_dir(workspace.join("skills")) else {
        return Vec::new();
    };
    let mut found: Vec<Skill> = entries
        .flatten()
        .filter_map(|entry| {
            let location = entry.path().join("SKILL.md");
            let text = std::fs::read_to_string(&location).ok()?;
            let field = |key: &str| {
                front_matter(&text).and_then(|lines| {
                    lines.iter().find_map(|line| {
                        line.strip_prefix(key)
                            .and_then(|rest| rest.strip_prefix(':'))
                            .map(|value| value.trim().trim_matches('"').to_owned())
                    })
                })
            };
            let name =
                field("name").unwrap_or_else(|| entry.file_name().to_string_lossy().into_owned());
            let mut skill = Skill {
                name,
                description: field("description").unwrap_or_default(),
                location,
                entry_chars: 0,
            };
            skill.entry_chars = skill_entry(&skill).chars().count();
            Some(skill)
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// The lines between a leading `---` and the next `---`.
fn front_matter(text: &str) -> Option<Vec<&str>> {
    let mut lines = text.lines();
    if lines.next()?.trim() != "---" {
        return None;
    }
    Some(lines.take_while(|line| line.trim() != "---").collect())
}
