//! `replay` and `demo`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use vilvona_core::admin::EngineAdmin;
use vilvona_core::message::AgentMessage;
use vilvona_runtime::Host;
use vilvona_runtime::context_report::context_report;
use vilvona_transcript::{Entry, for_each_turn, read_transcript, session_messages};

use crate::context::grouped;
use crate::session::{admin, caller};
use crate::{Global, print_json, require_file};

/// A recorded turn: its messages and their entry ids.
type Turn = (Vec<AgentMessage>, Vec<Option<String>>);

/// Reads a transcript into turns. A malformed line ends the reading; the turns before it are
/// returned with the error.
fn read_turns(file: &Path) -> Result<(String, Vec<Turn>, Option<anyhow::Error>)> {
    let mut turns: Vec<Turn> = Vec::new();
    let outcome = for_each_turn(file, |turn| {
        turns.push((
            turn.messages,
            turn.entry_ids.into_iter().map(Some).collect(),
        ));
        Ok(())
    });
    let checked = |id: String| {
        vilvona_runtime::sessions::check_session_id(&id)
            .map(|()| id)
            .with_context(|| format!("{}: the session header's id", file.display()))
    };
    match outcome {
        Ok((Some(header), _)) => Ok((checked(header.id)?, turns, None)),
        Ok((None, _)) => Err(anyhow!(
            "{}: the first line is not a `session` header",
            file.display()
        )),
        Err(error) => {
            // The header may have been read before the bad line.
            let header = vilvona_transcript::read_header(file)
                .map_err(|header_error| anyhow!(header_error))?;
            Ok((checked(header.id)?, turns, Some(anyhow!(error))))
        }
    }
}

/// What a replay did.
pub(crate) struct ReplayReport {
    pub(crate) json: Value,
    pub(crate) session_key: String,
}

async fn replay_turns(
    host: &Host,
    session_id: &str,
    turns: Vec<Turn>,
    show_progress: bool,
) -> Result<ReplayReport> {
    let started = Instant::now();
    let key = session_id.to_owned();
    let engine_id = host.engine().active_id();
    // The serving engine's own account of what it stored, when it keeps history.
    let history = host
        .engine()
        .engine
        .admin()
        .filter(|_| !host.engine().is_quarantined());
    let stored_before = match (&history, host.session(&key).await) {
        (Some(admin), Some(record)) => admin.session_stats(&caller(&key, &record)).await?.messages,
        _ => 0,
    };
    let compactions_before = host
        .session(&key)
        .await
        .map_or(0, |record| record.compaction_count);
    let summaries_before = match &history {
        Some(admin) => total_summaries(admin.as_ref()).await?,
        None => 0,
    };
    let progress = if show_progress {
        ProgressBar::new(turns.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} turns ({elapsed})")
            .context("the progress bar's template")?
            .progress_chars("=> "),
    );
    progress.set_message("replaying");
    let mut messages = 0;
    let mut budget = 0;
    let mut max_assembled = 0;
    let mut over_budget = 0;
    let turn_count = turns.len();
    for (recorded, ids) in turns {
        messages += recorded.len();
        let report = host
            .replay_turn(&key, Some(session_id), recorded, ids)
            .await
            .with_context(|| format!("replaying session {session_id}"))?;
        if report.token_budget > 0 {
            budget = report.token_budget;
        }
        max_assembled = max_assembled.max(report.assembled_tokens);
        over_budget += u64::from(report.over_budget);
        progress.inc(1);
    }
    progress.finish_and_clear();
    let record = host
        .session(&key)
        .await
        .context("the replayed session has no record")?;
    let (ingested, summaries_by_depth, final_tokens, compactions) = match &history {
        Some(admin) => {
            let session = caller(&key, &record);
            let stats = admin.session_stats(&session).await?;
            let summaries = total_summaries(admin.as_ref()).await?;
            // Every summary the store holds for the session, not only the context's tops.
            let stored_by_depth: BTreeMap<String, usize> = admin
                .dag(&session)
                .await?
                .by_depth()
                .into_iter()
                .map(|(depth, summaries)| (depth.to_string(), summaries.len()))
                .collect();
            (
                stats.messages.saturating_sub(stored_before),
                json!(stored_by_depth),
                stats.context_tokens,
                summaries.saturating_sub(summaries_before),
            )
        }
        None => {
            let transcript = read_transcript(&record.session_file)?;
            let rebuilt = session_messages(&transcript.entries);
            let tokens: u64 = rebuilt
                .iter()
                .map(|(_, m)| host.estimator().message_tokens(m))
                .sum();
            let mut by_depth = BTreeMap::new();
            let compaction_entries = transcript
                .entries
                .iter()
                .filter(|l| matches!(l.entry, Entry::Compaction(_)))
                .count();
            if compaction_entries > 0 {
                by_depth.insert("0".to_owned(), compaction_entries);
            }
            (
                0,
                json!(by_depth),
                tokens,
                record.compaction_count.saturating_sub(compactions_before),
            )
        }
    };
    Ok(ReplayReport {
        json: json!({
            "engine": engine_id,
            "session": session_id,
            "turns": turn_count,
            "messages": messages,
            "ingested": ingested,
            "compactions": compactions,
            "summariesByDepth": summaries_by_depth,
            "window": host.config().context_window(),
            "promptBudget": host.prompt_budget(),
            "tokenBudget": budget,
            "finalContextTokens": final_tokens,
            "maxAssembledTokens": max_assembled,
            "overBudgetTurns": over_budget,
            "wallMs": started.elapsed().as_millis() as u64,
        }),
        session_key: key,
    })
}

/// Every summary the store holds (not only those in a context): the compactions made.
async fn total_summaries(admin: &dyn EngineAdmin) -> Result<u64> {
    Ok(admin.check().await?.summaries)
}

fn print_human(report: &Value) {
    println!(
        "engine:               {}",
        report["engine"].as_str().unwrap_or("")
    );
    println!(
        "session:              {}",
        report["session"].as_str().unwrap_or("")
    );
    println!(
        "turns / messages:     {} / {}",
        report["turns"], report["messages"]
    );
    println!("stored by the engine: {}", report["ingested"]);
    println!("compactions:          {}", report["compactions"]);
    let by_depth: Vec<String> = report["summariesByDepth"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(depth, count)| format!("depth {depth}: {count}"))
        .collect();
    let stored: u64 = report["summariesByDepth"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, count)| count.as_u64())
        .sum();
    println!(
        "summaries stored:     {stored}{}",
        if by_depth.is_empty() {
            String::new()
        } else {
            format!(" ({})", by_depth.join(", "))
        }
    );
    let tokens = |field: &str| grouped(report[field].as_u64().unwrap_or(0));
    println!(
        "prompt budget:        {} of a {}-token window; the rest is kept for the reply",
        tokens("promptBudget"),
        tokens("window")
    );
    println!("final context tokens: {}", tokens("finalContextTokens"));
    println!("max assembled tokens: {}", tokens("maxAssembledTokens"));
    println!("over-budget turns:    {}", report["overBudgetTurns"]);
    println!("wall time:            {} ms", report["wallMs"]);
}

pub(crate) async fn replay(
    global: &Global,
    file: &Path,
    engine: Option<String>,
    window: Option<u64>,
    json: bool,
) -> Result<ExitCode> {
    require_file(file)?;
    let (session_id, turns, error) = read_turns(file)?;
    // Nothing before the bad line: the line is the whole story.
    if turns.is_empty()
        && let Some(error) = error
    {
        return Err(error);
    }
    let mut options = global.options();
    options.engine_override = engine;
    options.context_window_override = window;
    let host = global.host_with(options).await?;
    let report = replay_turns(&host, &session_id, turns, !json).await?;
    if json {
        print_json(&report.json)?;
    } else {
        print_human(&report.json);
    }
    host.dispose().await?;
    if let Some(error) = error {
        eprintln!("vilvona: {error}");
        eprintln!(
            "vilvona: everything before that line was replayed and kept; fix the line and replay again (nothing is stored twice)"
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Planted facts the demo shows in full (the search hit and the summary above it); the rest
/// get one line each.
const DEMO_FACTS_SHOWN: usize = 3;

const DEMO_CONFIG: &str = r#"// Written by `vilvona demo`: the lossless engine at a 32,000-token window.
{
  plugins: {
    slots: { contextEngine: "lossless" },
    entries: {
      lossless: { config: { freshTailCount: 32, leafChunkTokens: 6000, leafTargetTokens: 900, condensedTargetTokens: 800 } },
    },
  },
  agents: { defaults: { contextTokens: 32000 } },
}
"#;

pub(crate) async fn demo(global: &Global, turns: usize) -> Result<ExitCode> {
    let dir = global.state_dir.join("demo");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("clearing the previous demo in {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("vilvona.json5"), DEMO_CONFIG).context("writing the demo config")?;
    let workload = vilvona_workload::generate(turns, 7, 10);
    let transcript = dir.join("generated-session.jsonl");
    std::fs::write(&transcript, workload.to_jsonl()).context("writing the generated session")?;
    println!(
        "Generated a coding-agent session: {} turns, {} messages, {} planted facts ({}).",
        turns,
        workload.entries.len(),
        workload.needles.len(),
        transcript.display()
    );
    println!(
        "Replaying it through the lossless engine at a 32,000-token window (state in {}) …",
        dir.display()
    );
    // The demo is self-contained: its own directory, the embedded store.
    let demo_global = Global {
        state_dir: dir.clone(),
        config: None,
        store_url: None,
    };
    let host = demo_global.host().await?;
    let (session_id, turns, _) = read_turns(&transcript)?;
    let report = replay_turns(&host, &session_id, turns, true).await?;
    println!();
    print_human(&report.json);

    let record = host
        .session(&report.session_key)
        .await
        .context("the demo session has no record")?;
    let stats = admin(&host)
        .await?
        .session_stats(&caller(&report.session_key, &record))
        .await?;
    println!("\nWhat the model sees now (the context, oldest first):");
    for (group, items) in &stats.context_by_kind {
        println!(
            "  {group:<24} {:>4} items {:>7} tokens",
            items.items, items.tokens
        );
    }
    println!(
        "  {:<24} {:>4} items {:>7} tokens",
        "total", stats.context_items, stats.context_tokens
    );
    let window = context_report(&host, &report.session_key, &record).await?;
    println!(
        "  with the system prompt and tools — {}",
        crate::context::window_line(&window)
    );

    println!(
        "\nRecalling the {} planted facts (the first {DEMO_FACTS_SHOWN} in full):",
        workload.needles.len()
    );
    let engine = host.history().await?;
    let caller = caller(&report.session_key, &record);
    let mut recalled = 0;
    let mut shown = 0;
    for needle in &workload.needles {
        let found = engine
            .call_tool(
                &caller,
                "vilvona_grep",
                &json!({"query": needle.query, "scope": "messages", "limit": 1}),
            )
            .await?;
        let Some(hit) = found["results"]
            .as_array()
            .and_then(|results| results.first())
            .cloned()
        else {
            println!("  vilvona_grep {:?}: not found", needle.query);
            continue;
        };
        // The hit is the fact when the message it names holds the answer.
        let message = engine
            .call_tool(&caller, "vilvona_describe", &json!({"id": hit["id"]}))
            .await?;
        if !message["text"]
            .as_str()
            .is_some_and(|text| text.contains(&needle.answer))
        {
            println!(
                "  vilvona_grep {:?}: {} does not hold {}",
                needle.query,
                hit["id"].as_str().unwrap_or(""),
                needle.answer
            );
            continue;
        }
        recalled += 1;
        if shown == DEMO_FACTS_SHOWN {
            println!(
                "  vilvona_grep {:?} → {}: {}",
                needle.query,
                hit["id"].as_str().unwrap_or(""),
                needle.answer
            );
            continue;
        }
        println!("  vilvona_grep {:?}", needle.query);
        println!(
            "    → {} {}",
            hit["id"].as_str().unwrap_or(""),
            hit["snippet"].as_str().unwrap_or("")
        );
        if let Some(summary) = hit["coveredBy"].as_str() {
            let expanded = engine
                .call_tool(
                    &caller,
                    "vilvona_expand",
                    &json!({"id": summary, "tokenCap": 400}),
                )
                .await?;
            println!(
                "    vilvona_expand {summary}: depth {}, {} children; the fact lives under it.",
                expanded["depth"], expanded["total"]
            );
        }
        println!("    answer: {} (owner {})", needle.answer, needle.owner);
        shown += 1;
    }
    println!(
        "{recalled} of {} planted facts recalled from the whole history.",
        workload.needles.len()
    );
    // What to type next, as this very executable (`cargo run` puts none on PATH) and with the
    // demo's own state directory: each line works pasted as printed.
    let exe = std::env::current_exe()
        .map(|path| shell_word(&path.display().to_string()))
        .unwrap_or_else(|_| "vilvona".to_owned());
    let state = shell_word(&dir.display().to_string());
    let session = shell_word(&report.session_key);
    let query = workload
        .needles
        .first()
        .map_or("parser cache", |needle| needle.query.as_str());
    println!("\nNext, pasted as printed (the demo's store is {state}):");
    println!("  {exe} --state-dir {state} sessions");
    println!(
        "  {exe} --state-dir {state} grep {} --session {session}",
        shell_word(query)
    );
    println!("  {exe} --state-dir {state} context list --session {session}");
    println!("  {exe} --state-dir {state} ui    # the context panel in a browser");
    host.dispose().await?;
    Ok(ExitCode::SUCCESS)
}

/// `word` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}
