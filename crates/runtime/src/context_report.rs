//! The `/context` report: what a session's next prompt is made of (system prompt, workspace
//! files, skills, tools, and the assembled conversation by kind), built the way a turn builds
//! its prompt.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;
use vilvona_core::engine::AssembleParams;
use vilvona_core::message::AgentMessage;
use vilvona_transcript::{Entry, read_transcript, session_messages};

use crate::sessions::SessionRecord;
use crate::workspace::InjectedFile;
use crate::{Host, HostError};

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileReport {
    /// The file as injected.
    #[serde(flatten)]
    pub file: InjectedFile,
    /// Tokens of the file as it is on disk.
    pub raw_tokens: u64,
    /// Tokens of what was injected (after truncation).
    pub injected_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// What it is (a tool, a skill, a group of messages).
    pub name: String,
    /// How many of it.
    pub count: usize,
    /// Characters, where they mean something.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chars: Option<usize>,
    /// Estimated tokens.
    pub tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptCounts {
    /// Message entries in the transcript.
    pub messages: usize,
    /// Real conversation (user, assistant, tool results) after the last compaction: what a
    /// compaction could fold.
    pub compactable: usize,
    /// Of those, what the assembled context still shows verbatim.
    pub raw_in_context: usize,
    /// Summaries in the assembled context.
    pub summaries_in_context: usize,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextReport {
    pub session: String,
    pub engine: String,
    pub workspace: Option<String>,
    pub sandbox: String,
    pub window: u64,
    /// What the whole prompt may use: the window less what is kept for the reply.
    pub prompt_budget: u64,
    /// The conversation's share of that budget (what the system prompt and tools leave), as
    /// the engine is asked to assemble within.
    pub token_budget: u64,
    pub bootstrap_max_chars: usize,
    pub bootstrap_total_max_chars: usize,
    pub system_prompt_chars: usize,
    pub system_prompt_tokens: u64,
    pub project_context_chars: usize,
    pub project_context_tokens: u64,
    pub engine_addition_tokens: u64,
    pub workspace_files: Vec<FileReport>,
    pub skills: Vec<Part>,
    pub skills_list_chars: usize,
    pub skills_list_tokens: u64,
    pub tool_list_chars: usize,
    pub tool_list_tokens: u64,
    pub tools: Vec<Part>,
    pub conversation: Vec<Part>,
    pub transcript: TranscriptCounts,
    pub fresh_tail_messages: usize,
    pub session_tokens: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Turns the engine took in from the host's history because the host never committed
    /// them (OpenClaw on Anthropic's API with cache-ttl pruning), when it took any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<vilvona_core::admin::CatchUpReport>,
}

impl ContextReport {
    /// How full the window is, in whole percent (rounded to nearest).
    pub fn window_percent(&self) -> u64 {
        (self.session_tokens * 100 + self.window / 2) / self.window.max(1)
    }
}

/// The group a context message belongs to (summaries are grouped by depth separately).
fn group(message: &AgentMessage) -> String {
    match message {
        AgentMessage::User(_) => "User".to_owned(),
        AgentMessage::Assistant(_) => "Assistant".to_owned(),
        AgentMessage::ToolResult(_) => "Tool results".to_owned(),
        AgentMessage::Other(other) => format!("Other ({})", other.role),
    }
}

/// The engine that stored a session: the one that keeps the agent's history when it holds
/// this session (whatever the slot selects now: a gateway's plugin stores with `lossless` in a
/// state directory whose own configuration selects nothing), else the active one; and whether
/// it holds the session.
async fn storing_engine(
    host: &Host,
    session_id: &str,
) -> (
    String,
    std::sync::Arc<dyn vilvona_core::engine::ContextEngine>,
    bool,
) {
    if let Ok(engine) = host.history().await
        && let Some(admin) = engine.admin()
        && admin.stored_sessions().await.is_ok_and(|stored| {
            stored
                .iter()
                .any(|session| session.session_id == session_id)
        })
    {
        return (engine.info().id, engine, true);
    }
    (
        host.engine().active_id(),
        host.engine().engine.clone(),
        false,
    )
}

/// What a session's next prompt is made of, as `/context` reports it: the system prompt and
/// its parts, the tools, and the assembled conversation by kind.
pub async fn context_report(
    host: &Host,
    key: &str,
    record: &SessionRecord,
) -> Result<ContextReport, HostError> {
    let key = key.to_owned();
    let estimator = host.estimator().clone();
    // A session a gateway stored through `serve` has no transcript here: the engine that
    // stored it holds its history.
    let entries = if record.session_file.as_os_str().is_empty() {
        Vec::new()
    } else {
        read_transcript(&record.session_file)?.entries
    };
    let history: Vec<AgentMessage> = session_messages(&entries)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    let (engine_id, engine, stores) = storing_engine(host, &record.session_id).await;
    let system = host.system_prompt();
    let budget = host.token_budget(&system.text, "");
    let assembled = engine
        .assemble(&AssembleParams {
            session_id: record.session_id.clone(),
            session_key: Some(key.clone()),
            messages: history.clone().into(),
            history_elided: stores && history.is_empty(),
            token_budget: Some(budget),
            available_tools: host
                .options()
                .tools
                .iter()
                .map(|tool| tool.name.clone())
                .collect(),
            ..AssembleParams::default()
        })
        .await
        .map_err(|source| HostError::Engine {
            engine: engine_id.clone(),
            operation: "assemble",
            source,
        })?;
    let depths: HashMap<usize, u32> = assembled
        .summaries
        .iter()
        .map(|summary| (summary.index, summary.depth))
        .collect();
    let is_summary = |index: usize| depths.contains_key(&index);
    let mut conversation: Vec<Part> = Vec::new();
    for (index, message) in assembled.messages.iter().enumerate() {
        let name = match depths.get(&index) {
            Some(depth) => format!("Summaries (depth {depth})"),
            None => group(message),
        };
        let tokens = estimator.message_tokens(message);
        match conversation.iter_mut().find(|part| part.name == name) {
            Some(part) => {
                part.count += 1;
                part.tokens += tokens;
            }
            None => conversation.push(Part {
                name,
                count: 1,
                chars: None,
                tokens,
            }),
        }
    }
    let fresh_tail = (0..assembled.messages.len())
        .rev()
        .take_while(|&index| !is_summary(index))
        .count();
    let real = |m: &AgentMessage| {
        matches!(
            m,
            AgentMessage::User(_) | AgentMessage::Assistant(_) | AgentMessage::ToolResult(_)
        )
    };
    let transcript_counts = TranscriptCounts {
        messages: entries
            .iter()
            .filter(|located| matches!(located.entry, Entry::Message(_)))
            .count(),
        compactable: history.iter().filter(|m| real(m)).count(),
        raw_in_context: assembled
            .messages
            .iter()
            .enumerate()
            .filter(|(index, m)| real(m) && !is_summary(*index))
            .count(),
        summaries_in_context: depths.len(),
    };
    let tools: Vec<Part> = host
        .options()
        .tools
        .iter()
        .map(|tool| {
            let schema = json!({"name": tool.name, "description": tool.description, "parameters": tool.parameters}).to_string();
            Part {
                name: tool.name.clone(),
                count: 1,
                chars: Some(schema.chars().count()),
                tokens: estimator.text_tokens(&schema),
            }
        })
        .collect();
    let skills: Vec<Part> = system
        .skills
        .iter()
        .map(|skill| Part {
            name: skill.name.clone(),
            count: 1,
            chars: Some(skill.entry_chars),
            tokens: (skill.entry_chars as u64).div_ceil(4),
        })
        .collect();
    let addition_tokens = assembled
        .system_prompt_addition
        .as_deref()
        .map_or(0, |addition| estimator.text_tokens(addition));
    let files: Vec<FileReport> = system
        .files
        .iter()
        .map(|file| FileReport {
            raw_tokens: (file.raw_chars as u64).div_ceil(4),
            injected_tokens: estimator.text_tokens(&file.text),
            file: file.clone(),
        })
        .collect();
    let chars_tokens = |chars: usize| (chars as u64).div_ceil(4);
    let system_tokens = estimator.text_tokens(&system.text);
    let session_tokens = system_tokens
        + addition_tokens
        + tools.iter().map(|t| t.tokens).sum::<u64>()
        + conversation.iter().map(|c| c.tokens).sum::<u64>();
    let config = host.config();
    let catch_up = match engine.admin() {
        Some(admin) if stores => admin
            .session_stats(&vilvona_core::admin::ToolCaller {
                session_id: record.session_id.clone(),
                session_key: Some(key.clone()),
            })
            .await
            .ok()
            .and_then(|stats| stats.catch_up),
        _ => None,
    };
    Ok(ContextReport {
        session: key,
        engine: engine_id,
        workspace: system
            .workspace
            .as_ref()
            .map(|dir| dir.display().to_string()),
        sandbox: format!(
            "mode={} sandboxed=false",
            config.sandbox_mode.as_deref().unwrap_or("off")
        ),
        window: config.context_window(),
        prompt_budget: host.prompt_budget(),
        token_budget: budget,
        bootstrap_max_chars: config.bootstrap.per_file_max_chars,
        bootstrap_total_max_chars: config.bootstrap.total_max_chars,
        system_prompt_chars: system.text.chars().count(),
        system_prompt_tokens: system_tokens,
        project_context_chars: system.project_context_chars,
        project_context_tokens: chars_tokens(system.project_context_chars),
        engine_addition_tokens: addition_tokens,
        workspace_files: files,
        skills,
        skills_list_chars: system.skills_chars,
        skills_list_tokens: chars_tokens(system.skills_chars),
        tool_list_chars: system.tool_list_chars,
        tool_list_tokens: chars_tokens(system.tool_list_chars),
        tools,
        conversation,
        transcript: transcript_counts,
        fresh_tail_messages: fresh_tail,
        session_tokens,
        input_tokens: record.input_tokens,
        output_tokens: record.output_tokens,
        catch_up,
    })
}
