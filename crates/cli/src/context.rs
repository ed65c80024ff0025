//! `context list|detail|json|map|dag|timeline|history`: what a stored session's next prompt is made
//! of, its summary DAG and its compactions.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use vilvona_runtime::context_report::{ContextReport, Part, context_report};
use vilvona_runtime::workspace::FileStatus;

use crate::session::find_session;
use crate::treemap::{Tile, render_treemap};
use crate::{ContextView, Global, print_json};

/// The report of a stored session, from a read-only host over the state directory.
async fn build(global: &Global, session: &str, workspace: Option<&Path>) -> Result<ContextReport> {
    let mut options = global.options();
    options.workspace_dir = workspace.map(Path::to_path_buf);
    options.read_only = true;
    let host = global.host_with(options).await?;
    let (key, record) = find_session(&host, session).await?;
    Ok(context_report(&host, &key, &record).await?)
}

/// `12,345`: the way `/context` prints counts.
pub(crate) fn grouped(value: impl Into<u64>) -> String {
    let digits = value.into().to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn print_list(report: &ContextReport, detail: bool) {
    let n = |value: usize| grouped(value as u64);
    println!(
        "Context breakdown{} — session {} (engine {})",
        if detail { " (detailed)" } else { "" },
        report.session,
        report.engine
    );
    println!(
        "Workspace: {}",
        report.workspace.as_deref().unwrap_or("(none)")
    );
    println!(
        "Bootstrap max/file: {} chars (total {} chars)",
        n(report.bootstrap_max_chars),
        n(report.bootstrap_total_max_chars)
    );
    println!("Sandbox: {}", report.sandbox);
    println!(
        "System prompt (estimate): {} chars (~{} tok) (Project Context {} chars (~{} tok)); engine addition ~{} tok",
        n(report.system_prompt_chars),
        grouped(report.system_prompt_tokens),
        n(report.project_context_chars),
        grouped(report.project_context_tokens),
        grouped(report.engine_addition_tokens)
    );
    println!();
    if report.workspace_files.is_empty() {
        println!("Injected workspace files: none");
    } else {
        println!("Injected workspace files:");
    }
    for entry in &report.workspace_files {
        let file = &entry.file;
        match file.status {
            FileStatus::Missing => println!("- {}: MISSING | raw 0 | injected 0", file.name),
            status => println!(
                "- {}: {} | raw {} chars (~{} tok) | injected {} chars (~{} tok)",
                file.name,
                if status == FileStatus::Ok {
                    "OK"
                } else {
                    "TRUNCATED"
                },
                n(file.raw_chars),
                grouped(entry.raw_tokens),
                n(file.injected_chars),
                grouped(entry.injected_tokens)
            ),
        }
    }
    println!();
    println!(
        "Skills list (system prompt text): {} chars (~{} tok) ({} skills)",
        n(report.skills_list_chars),
        grouped(report.skills_list_tokens),
        report.skills.len()
    );
    let names: Vec<&str> = report.tools.iter().map(|t| t.name.as_str()).collect();
    println!(
        "Tools: {}",
        if names.is_empty() {
            "(none)".to_owned()
        } else {
            names.join(", ")
        }
    );
    println!(
        "Tool list (system prompt text): {} chars (~{} tok)",
        n(report.tool_list_chars),
        grouped(report.tool_list_tokens)
    );
    let schema_chars: usize = report.tools.iter().filter_map(|t| t.chars).sum();
    let schema_tokens: u64 = report.tools.iter().map(|t| t.tokens).sum();
    println!(
        "Tool schemas (JSON): {} chars (~{} tok) (counts toward context; not shown as text)",
        n(schema_chars),
        grouped(schema_tokens)
    );
    if detail {
        let top = |title: &str, parts: &[Part], unit: &str| {
            let mut sorted: Vec<&Part> = parts.iter().collect();
            sorted.sort_by_key(|part| std::cmp::Reverse(part.tokens));
            println!();
            println!("Top {title} ({unit}):");
            for part in sorted.iter().take(10) {
                println!(
                    "- {}: {} chars (~{} tok)",
                    part.name,
                    n(part.chars.unwrap_or(0)),
                    grouped(part.tokens)
                );
            }
            if sorted.len() > 10 {
                println!("… (+{} more {title})", sorted.len() - 10);
            }
        };
        top("skills", &report.skills, "prompt entry size");
        top("tools", &report.tools, "schema size");
        let counts = &report.transcript;
        println!();
        // An engine that folds its own copy never writes a compaction into the transcript: its
        // summaries stand for what the context does not show verbatim.
        let folded = counts.compactable.saturating_sub(counts.raw_in_context);
        println!(
            "Transcript: {} messages; {} user, assistant and tool results since its last compaction entry; in context: {} verbatim, {} summaries{}",
            counts.messages,
            counts.compactable,
            counts.raw_in_context,
            counts.summaries_in_context,
            if counts.summaries_in_context > 0 && folded > 0 {
                format!(" standing for the other {folded}")
            } else {
                String::new()
            }
        );
    }
    println!();
    println!("Conversation:");
    for part in &report.conversation {
        println!(
            "- {}: {} messages, ~{} tok",
            part.name,
            part.count,
            grouped(part.tokens)
        );
    }
    println!(
        "Fresh tail: {} raw messages after the last summary",
        report.fresh_tail_messages
    );
    println!();
    println!("{}", window_line(report));
    if let Some(caught) = &report.catch_up {
        println!(
            "Turns taken in from the host's history at a later turn: {} ({} messages); the host did not commit them{}",
            grouped(caught.turns),
            grouped(caught.messages),
            if caught.commits_missing {
                ", and its commits are missing now (OpenClaw on Anthropic's API with cache-ttl pruning: `vilvona doctor`)"
            } else {
                "; its commits came since"
            }
        );
    }
    println!(
        "Tokens the model reported for this session: {} in, {} out",
        grouped(report.input_tokens),
        grouped(report.output_tokens)
    );
}

/// How full the window is, the way `/status` shows it, with the one budget the prompt has:
/// `Window: 11,925 / 32,000 tokens (37%) · the prompt may use 28,000; the rest is kept for
/// the reply`.
pub(crate) fn window_line(report: &ContextReport) -> String {
    format!(
        "Window: {} / {} tokens ({}%) · the prompt may use {}; the rest is kept for the reply",
        grouped(report.session_tokens),
        grouped(report.window),
        report.window_percent(),
        grouped(report.prompt_budget)
    )
}

/// `vilvona context dag`: the session's summary DAG as DOT (stdout or `out`) or a PNG.
async fn dag(
    global: &Global,
    session: &str,
    format: crate::DagFormat,
    out: Option<&Path>,
) -> Result<ExitCode> {
    let host = global.reader().await?;
    if let crate::DagFormat::Json = format {
        print_json(&crate::views::dag(&host, session, false).await?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (key, record) = crate::session::find_session(&host, session).await?;
    let view = crate::session::admin(&host)
        .await?
        .dag(&crate::session::caller(&key, &record))
        .await?;
    match format {
        crate::DagFormat::Json => {}
        crate::DagFormat::Dot => {
            let text = crate::dag::dot(&record.session_id, &view);
            match out {
                Some(out) => {
                    std::fs::write(out, text)
                        .with_context(|| format!("writing {}", out.display()))?;
                    println!("wrote {}", out.display());
                }
                None => print!("{text}"),
            }
        }
        crate::DagFormat::Png => {
            let out = out.unwrap_or(Path::new("context-dag.png"));
            crate::dag::png(&record.session_id, &view, out)?;
            println!("wrote {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `vilvona context timeline`: the session's compactions, newest first (or their JSON).
pub(crate) async fn timeline(global: &Global, session: &str, json: bool) -> Result<ExitCode> {
    let host = global.reader().await?;
    let timeline = crate::views::timeline(&host, session, None).await?;
    if json {
        print_json(&serde_json::to_value(&timeline)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} folds; model summarizers read {} tokens for them; {} by a fallback, {} by truncation",
        grouped(timeline.folds as u64),
        grouped(timeline.model_tokens),
        grouped(timeline.fallbacks as u64),
        grouped(timeline.truncations as u64),
    );
    println!(
        "After a fold the prompt cache keeps the system prompt, the tools and ~{} tokens of older summaries (mean); the rest is read anew",
        grouped(timeline.mean_cache_kept)
    );
    for fold in &timeline.rows {
        let flag = match (fold.fallback, fold.truncated) {
            (_, true) => " [truncated]",
            (true, false) => " [fallback]",
            _ => "",
        };
        println!(
            "{}  D{}  {}  {} messages + {} summaries ({} tok) -> {} tok  cache keeps {} tok  {}{flag}",
            vilvona_summarize::format_utc_rfc3339(fold.at),
            fold.depth,
            fold.id,
            grouped(fold.messages),
            grouped(fold.folded_summaries as u64),
            grouped(fold.before),
            grouped(fold.after),
            grouped(fold.cache_kept),
            fold.summarizer,
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `vilvona context history`: the session turn by turn, oldest first (or its JSON).
pub(crate) async fn history(
    global: &Global,
    session: &str,
    json: bool,
    prices: Option<vilvona_core::admin::TokenPrices>,
) -> Result<ExitCode> {
    let host = global.reader().await?;
    let turns = crate::views::history(&host, session, prices).await?;
    if json {
        print_json(&serde_json::to_value(&turns)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "turn  committed (UTC)       host    context  window   trigger  provider: input  cache read  cache write  output      cost  folds"
    );
    for turn in &turns {
        let context: u64 = turn.context.values().sum();
        let usage = turn.usage.map_or_else(
            || format!("{:>15}", "-"),
            |usage| {
                format!(
                    "{:>15}  {:>10}  {:>11}  {:>6}  {:>8}",
                    grouped(usage.input),
                    grouped(usage.cache_read),
                    grouped(usage.cache_write),
                    grouped(usage.output),
                    usage
                        .cost
                        .map_or_else(|| "-".to_owned(), |cost| format!("{cost:.4}")),
                )
            },
        );
        let optional = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), grouped);
        println!(
            "{:>4}  {}  {:>6}  {:>7}  {:>6}  {:>7}  {usage}  {}",
            turn.turn,
            &vilvona_summarize::format_utc_rfc3339(turn.at)[..19],
            optional(turn.host_prompt),
            grouped(context),
            optional(turn.window),
            grouped(turn.trigger),
            if turn.folds.is_empty() {
                String::new()
            } else {
                format!(
                    "{} ({} -> {} tok)",
                    turn.folds.join(" "),
                    grouped(turn.context_before_compaction),
                    grouped(turn.context_after_compaction)
                )
            },
        );
        if !turn.recalled.is_empty() {
            println!("      recalled: {}", recalled_line(&turn.recalled));
        }
    }
    if turns.is_empty() {
        println!("no turn recorded yet (turns are recorded as they are committed)");
    }
    Ok(ExitCode::SUCCESS)
}

/// What recall at assembly brought into a turn: each message id, its score and its tokens.
fn recalled_line(items: &[vilvona_core::admin::RecalledItem]) -> String {
    items
        .iter()
        .map(|item| format!("{} ({:.3}, {} tok)", item.id, item.score, item.tokens))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `context detail`'s closing lines: what the newest turn's prompt was given from the history
/// beyond its context.
fn print_recalled(turn: Option<&vilvona_core::admin::TurnRecord>) {
    println!();
    match turn {
        Some(turn) if !turn.recalled.is_empty() => println!(
            "Recalled into turn {} (from the history beyond the context, best first): {}",
            turn.turn,
            recalled_line(&turn.recalled)
        ),
        Some(turn) => println!("Recalled into turn {}: nothing", turn.turn),
        None => println!("Recalled: no turn recorded yet"),
    }
}

pub(crate) async fn context(
    global: &Global,
    view: ContextView,
    session: &str,
    format: crate::DagFormat,
    out: Option<&Path>,
    workspace: Option<&Path>,
) -> Result<ExitCode> {
    if let ContextView::Dag = view {
        return dag(global, session, format, out).await;
    }
    let out = out.unwrap_or(Path::new("context-map.png"));
    let report = build(global, session, workspace).await?;
    match view {
        ContextView::List => print_list(&report, false),
        ContextView::Detail => {
            print_list(&report, true);
            let host = global.reader().await?;
            let turns = crate::views::history(&host, session, None).await?;
            print_recalled(turns.last());
        }
        ContextView::Json => print_json(&crate::views::context_json(&report))?,
        ContextView::Dag | ContextView::Timeline | ContextView::History => {}
        ContextView::Map => {
            let mut tiles = vec![Tile {
                group: "System prompt".to_owned(),
                label: "System prompt".to_owned(),
                // The files and skills have tiles of their own.
                weight: report
                    .system_prompt_tokens
                    .saturating_sub(report.project_context_tokens + report.skills_list_tokens)
                    + report.engine_addition_tokens,
            }];
            tiles.extend(
                report
                    .workspace_files
                    .iter()
                    .filter(|f| f.injected_tokens > 0)
                    .map(|file| Tile {
                        group: "Workspace files".to_owned(),
                        label: file.file.name.clone(),
                        weight: file.injected_tokens,
                    }),
            );
            tiles.extend(report.skills.iter().map(|skill| Tile {
                group: "Skills".to_owned(),
                label: skill.name.clone(),
                weight: skill.tokens,
            }));
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
