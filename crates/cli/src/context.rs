//! `context list|detail|json|map`: what a stored session's next prompt is made of.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use serde::Serialize;
use serde_json::json;
use vilvona_core::engine::AssembleParams;
use vilvona_core::message::AgentMessage;
use vilvona_core::tokens::TokenEstimator;
use vilvona_transcript::{read_transcript, session_messages};

use crate::inspect::find_session;
use crate::treemap::{Tile, render_treemap};
use crate::{ContextView, Global, print_json};

/// The workspace files injected into the system prompt, in order.
const BOOTSTRAP_FILES: [&str; 7] = [
    "AGENTS.md",
    "SOUL.md",
    "TOOLS.md",
    "IDENTITY.md",
    "USER.md",
    "HEARTBEAT.md",
    "BOOTSTRAP.md",
];
/// Per-file and total caps on injected characters (OpenClaw's defaults).
const PER_FILE_MAX_CHARS: usize = 20_000;
const TOTAL_MAX_CHARS: usize = 60_000;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct FileReport {
    name: String,
    status: &'static str,
    raw_chars: usize,
    injected_chars: usize,
    injected_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    name: String,
    count: usize,
    tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    session: String,
    engine: String,
    window: u64,
    token_budget: u64,
    system_prompt_chars: usize,
    system_prompt_tokens: u64,
    engine_addition_tokens: u64,
    workspace_files: Vec<FileReport>,
    tools: Vec<Part>,
    conversation: Vec<Part>,
    fresh_tail_messages: usize,
    session_tokens: u64,
}

fn workspace_files(workspace: Option<&Path>, estimator: &dyn TokenEstimator) -> Vec<FileReport> {
    let mut total = 0;
    BOOTSTRAP_FILES
        .iter()
        .map(|name| {
            let text = workspace.and_then(|dir| std::fs::read_to_string(dir.join(name)).ok());
            match text {
                None => FileReport {
                    name: (*name).to_owned(),
                    status: "MISSING",
                    raw_chars: 0,
                    injected_chars: 0,
                    injected_tokens: 0,
                },
                Some(text) => {
                    let raw = text.chars().count();
                    let allowed = PER_FILE_MAX_CHARS.min(TOTAL_MAX_CHARS.saturating_sub(total));
                    let injected = raw.min(allowed);
                    total += injected;
                    let injected_text: String = text.chars().take(injected).collect();
                    FileReport {
                        name: (*name).to_owned(),
                        status: if injected < raw { "TRUNCATED" } else { "OK" },
                        raw_chars: raw,
                        injected_chars: injected,
                        injected_tokens: estimator.text_tokens(&injected_text),
                    }
                }
            }
        })
        .collect()
}

/// The group a context message belongs to.
fn group(message: &AgentMessage) -> String {
    let text = message.plain_text();
    if let Some(rest) = text.strip_prefix("<summary ")
        && let Some(depth) = rest
            .split("depth=\"")
            .nth(1)
            .and_then(|tail| tail.split('"').next())
    {
        return format!("Summaries (depth {depth})");
    }
    match message {
        AgentMessage::User(_) => "User".to_owned(),
        AgentMessage::Assistant(_) => "Assistant".to_owned(),
        AgentMessage::ToolResult(_) => "Tool results".to_owned(),
        AgentMessage::Other(other) => format!("Other ({})", other.role),
    }
}

async fn build(global: &Global, session: &str, workspace: Option<&Path>) -> Result<Report> {
    let host = global.host().await?;
    let (key, record) = find_session(global, &host, session).await?;
    let estimator = host.estimator().clone();
    let transcript = read_transcript(&record.session_file)?;
    let history: Vec<AgentMessage> = session_messages(&transcript.entries)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    let budget = host.token_budget(&host.options().system_prompt, "");
    let assembled = host
        .engine()
        .engine
        .assemble(&AssembleParams {
            session_id: record.session_id.clone(),
            session_key: Some(key.clone()),
            messages: history.into(),
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
        .context("assembling the session's context")?;
    let mut conversation: Vec<Part> = Vec::new();
    for message in assembled.messages.iter() {
        let name = group(message);
        let tokens = estimator.message_tokens(message);
        match conversation.iter_mut().find(|part| part.name == name) {
            Some(part) => {
                part.count += 1;
                part.tokens += tokens;
            }
            None => conversation.push(Part {
                name,
                count: 1,
                tokens,
            }),
        }
    }
    let fresh_tail = assembled
        .messages
        .iter()
        .rev()
        .take_while(|m| !m.plain_text().starts_with("<summary "))
        .count();
    let tools: Vec<Part> = host
        .options()
        .tools
        .iter()
        .map(|tool| Part {
            name: tool.name.clone(),
            count: 1,
            tokens: estimator.text_tokens(&json!({"name": tool.name, "description": tool.description, "parameters": tool.parameters}).to_string()),
        })
        .collect();
    let system_prompt = &host.options().system_prompt;
    let addition_tokens = assembled
        .system_prompt_addition
        .as_deref()
        .map_or(0, |addition| estimator.text_tokens(addition));
    let files = workspace_files(workspace, &*estimator);
    let system_tokens = estimator.text_tokens(system_prompt);
    let session_tokens = system_tokens
        + addition_tokens
        + files.iter().map(|f| f.injected_tokens).sum::<u64>()
        + tools.iter().map(|t| t.tokens).sum::<u64>()
        + conversation.iter().map(|c| c.tokens).sum::<u64>();
    Ok(Report {
        session: key,
        engine: host.engine().active_id(),
        window: host.config().context_window(),
        token_budget: budget,
        system_prompt_chars: system_prompt.len(),
        system_prompt_tokens: system_tokens,
        engine_addition_tokens: addition_tokens,
        workspace_files: files,
        tools,
        conversation,
        fresh_tail_messages: fresh_tail,
        session_tokens,
    })
}

fn print_list(report: &Report, detail: bool) {
    println!(
        "Context breakdown{} — session {} (engine {})",
        if detail { " (detailed)" } else { "" },
        report.session,
        report.engine
    );
    println!(
        "System prompt: {} chars (~{} tok); engine addition ~{} tok",
        report.system_prompt_chars, report.system_prompt_tokens, report.engine_addition_tokens
    );
    println!("Bootstrap max/file: {PER_FILE_MAX_CHARS} chars, total {TOTAL_MAX_CHARS} chars");
    println!("Injected workspace files:");
    for file in &report.workspace_files {
        match file.status {
            "MISSING" => println!("- {}: MISSING | raw 0 | injected 0", file.name),
            status => println!(
                "- {}: {status} | raw {} chars | injected {} chars (~{} tok)",
                file.name, file.raw_chars, file.injected_chars, file.injected_tokens
            ),
        }
    }
    let tool_tokens: u64 = report.tools.iter().map(|t| t.tokens).sum();
    println!(
        "Tool schemas (JSON): ~{tool_tokens} tok ({} tools; counts toward context, not shown as text)",
        report.tools.len()
    );
    if detail {
        for tool in &report.tools {
            println!("  - {}: ~{} tok", tool.name, tool.tokens);
        }
    }
    println!("Conversation:");
    for part in &report.conversation {
        println!(
            "- {}: {} messages, ~{} tok",
            part.name, part.count, part.tokens
        );
    }
    println!(
        "Fresh tail: {} raw messages after the last summary",
        report.fresh_tail_messages
    );
    println!(
        "Session tokens: {} total / budget={} / ctx={}",
        report.session_tokens, report.token_budget, report.window
    );
}

pub(crate) async fn context(
    global: &Global,
    view: ContextView,
    session: &str,
    out: &Path,
    workspace: Option<&Path>,
) -> Result<ExitCode> {
    let report = build(global, session, workspace).await?;
    match view {
        ContextView::List => print_list(&report, false),
        ContextView::Detail => print_list(&report, true),
        ContextView::Json => print_json(
            &json!({"report": report, "session": {"totalTokens": report.session_tokens, "contextTokens": report.window}}),
        )?,
        ContextView::Map => {
            let mut tiles = vec![Tile {
                group: "System prompt".to_owned(),
                label: "System prompt".to_owned(),
                weight: report.system_prompt_tokens + report.engine_addition_tokens,
            }];
            tiles.extend(
                report
                    .workspace_files
                    .iter()
                    .filter(|f| f.injected_tokens > 0)
                    .map(|file| Tile {
                        group: "Workspace files".to_owned(),
                        label: file.name.clone(),
                        weight: file.injected_tokens,
                    }),
            );
            tiles.extend(report.tools.iter().map(|tool| Tile {
                group: "Tool schemas".to_owned(),
                label: tool.name.clone(),
                weight: tool.tokens,
            }));
            tiles.extend(report.conversation.iter().map(|part| {
                match part.name.strip_prefix("Summaries (") {
                    Some(depth) => Tile {
                        group: "Summaries".to_owned(),
                        label: format!("{} x{}", depth.trim_end_matches(')'), part.count),
                        weight: part.tokens,
                    },
                    None => Tile {
                        group: "Messages".to_owned(),
                        label: format!("{} x{}", part.name, part.count),
                        weight: part.tokens,
                    },
                }
            }));
            let title = format!(
                "vilvona context map - {} - {} of {} tokens ({})",
                report.session, report.session_tokens, report.window, report.engine
            );
            render_treemap(&title, &tiles, out)?;
            println!("wrote {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
