//! doctor, compact, the recall tools, stats, sessions, rebuild-index.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use vilvona_runtime::{Check, HostError, doctor as doctor_report};

use crate::session::{admin, admin_of, caller, find_session};
use crate::{Global, print_json};

/// Calls a tool of the engine that keeps history, as the named session would.
async fn call_recall_tool(
    global: &Global,
    session: &str,
    tool: &str,
    arguments: &Value,
) -> Result<Value> {
    crate::views::recall(&global.reader().await?, session, tool, arguments).await
}

pub(crate) async fn doctor(global: &Global, json: bool, fix: bool) -> Result<ExitCode> {
    let mut checks = Vec::new();
    if fix {
        let tightened = vilvona_runtime::privacy::tighten(&global.state_dir)
            .with_context(|| format!("tightening {}", global.state_dir.display()))?;
        eprintln!(
            "doctor --fix: tightened {tightened} path(s) in {}",
            global.state_dir.display()
        );
    }
    if fix {
        fix_recall_index(global).await;
    }
    let loose = vilvona_runtime::privacy::loose_paths(&global.state_dir);
    let mut options = global.options();
    options.read_only = true;
    let host = Global::host_as_configured(options).await?;
    match host.history().await {
        // No engine keeps history and none failed to open its own: nothing to check.
        Err(HostError::NoHistory { reasons, .. }) if reasons.is_empty() => {}
        Err(error) => checks.push(Check {
            name: "store integrity".to_owned(),
            ok: false,
            detail: format!(
                "the store could not be checked: {}",
                vilvona_core::error_chain(&error)
            ),
        }),
        Ok(engine) => {
            let report = admin_of(&engine)?.check().await?;
            checks.push(Check {
                name: "store integrity".to_owned(),
                ok: report.is_healthy(),
                detail: crate::views::integrity_detail(&report),
            });
            // Not a problem: what the engine did about the host's (missing commits, say).
            for notice in &report.notices {
                checks.push(Check {
                    name: "turns taken in from the host's history".to_owned(),
                    ok: true,
                    detail: notice.clone(),
                });
            }
        }
    }
    // The session index: a damaged one is moved aside and rebuilt by --fix.
    match host.check_session_index().await {
        Ok(_) => {}
        Err(error) if fix => {
            let (aside, count) = host.rebuild_session_index().await?;
            eprintln!(
                "doctor --fix: {} was damaged ({}); moved to {} and rebuilt with {count} session(s) from the store and the transcripts",
                global.state_dir.join("sessions.json").display(),
                vilvona_core::error_chain(&error),
                aside.display()
            );
        }
        Err(error) => checks.push(Check {
            name: "session index".to_owned(),
            ok: false,
            detail: vilvona_core::error_chain(&error),
        }),
    }
    // After the store's check (doctor's first), the state directory's permissions, as they
    // were before this host opened (opening keeps the directory itself 0700).
    checks.push(Check {
        name: "private state directory".to_owned(),
        ok: loose.is_empty(),
        detail: match loose.first() {
            None => "only its owner can read the state directory".to_owned(),
            Some(first) => format!(
                "{} path(s) group or others may read, e.g. {} (mode {:o}); run `vilvona doctor --fix` (directories 0700, files 0600)",
                loose.len(),
                first.path.display(),
                first.mode
            ),
        },
    });
    let report = doctor_report(&host, checks).await;
    if json {
        let mut value = serde_json::to_value(&report)?;
        value["healthy"] = json!(report.healthy());
        print_json(&value)?;
    } else {
        print!("{}", report.to_text());
    }
    Ok(if report.healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub(crate) async fn compact(
    global: &Global,
    session: &str,
    instructions: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let host = global.host().await?;
    let (key, _) = find_session(&host, session).await?;
    let result = host.compact(&key, instructions).await?;
    if json {
        print_json(&serde_json::to_value(&result)?)?;
    } else {
        let details = result.result.as_ref();
        println!(
            "{}: {} ({} → {} tokens)",
            key,
            if result.compacted {
                "compacted"
            } else {
                "nothing compacted"
            },
            details.map_or(0, |d| d.tokens_before),
            details.and_then(|d| d.tokens_after).unwrap_or(0),
        );
        if let Some(reason) = &result.reason {
            println!("reason: {reason}");
        }
    }
    Ok(if result.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub(crate) async fn grep(
    global: &Global,
    session: &str,
    arguments: &Value,
    json: bool,
) -> Result<ExitCode> {
    let query = arguments["query"].as_str().unwrap_or_default();
    let result = call_recall_tool(global, session, "vilvona_grep", arguments).await?;
    if json {
        print_json(&result)?;
    } else {
        let results = result["results"].as_array().cloned().unwrap_or_default();
        if results.is_empty() {
            println!("no matches for {query:?}");
        }
        for hit in results {
            println!(
                "{} {} {}{}\n    {}{}",
                hit["id"].as_str().unwrap_or(""),
                hit["kind"].as_str().unwrap_or(""),
                hit["time"].as_str().unwrap_or(""),
                hit["coveredBy"]
                    .as_str()
                    .map(|s| format!(" (covered by {s})"))
                    .unwrap_or_default(),
                hit["file"]
                    .as_str()
                    .map(|file| format!("in {file}: "))
                    .unwrap_or_default(),
                hit["snippet"].as_str().unwrap_or("")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn describe(
    global: &Global,
    id: &str,
    session: &str,
    lines: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let arguments = json!({"id": id, "lines": lines});
    let result = call_recall_tool(global, session, "vilvona_describe", &arguments).await?;
    if json {
        print_json(&result)?;
    } else {
        for (field, value) in result.as_object().into_iter().flatten() {
            match value {
                Value::String(text) if text.contains('\n') => println!("{field}:\n{text}"),
                Value::String(text) => println!("{field}: {text}"),
                other => println!("{field}: {other}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn expand(
    global: &Global,
    id: &str,
    session: &str,
    token_cap: Option<u64>,
    cursor: Option<u64>,
    json: bool,
) -> Result<ExitCode> {
    let arguments = json!({"id": id, "tokenCap": token_cap, "cursor": cursor});
    let result = call_recall_tool(global, session, "vilvona_expand", &arguments).await?;
    if json {
        print_json(&result)?;
    } else {
        for item in result["items"].as_array().cloned().unwrap_or_default() {
            let body = item["text"]
                .as_str()
                .or_else(|| item["content"].as_str())
                .unwrap_or("");
            println!(
                "── {} {} {}",
                item["id"].as_str().unwrap_or(""),
                item["kind"].as_str().unwrap_or(""),
                item["time"]
                    .as_str()
                    .or_else(|| item["latest"].as_str())
                    .unwrap_or("")
            );
            println!("{body}");
        }
        if let Some(next) = result["nextCursor"].as_u64() {
            let total = result["total"].as_u64().unwrap_or(next);
            println!(
                "(more: {} of {total} items remain; continue with --cursor {next})",
                total.saturating_sub(next)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn ask(
    global: &Global,
    session: &str,
    arguments: &Value,
    json: bool,
) -> Result<ExitCode> {
    let result = call_recall_tool(global, session, "vilvona_expand_query", arguments).await?;
    if json {
        print_json(&result)?;
    } else {
        println!("{}", result["answer"].as_str().unwrap_or(""));
        let citations: Vec<&str> = result["citations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        println!(
            "\ncited: {} (answered by {}, from {} tokens of history)",
            if citations.is_empty() {
                "nothing".to_owned()
            } else {
                citations.join(", ")
            },
            result["answeredBy"].as_str().unwrap_or(""),
            result["tokens"]
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn stats(global: &Global, session: &str, json: bool) -> Result<ExitCode> {
    let host = global.reader().await?;
    let (key, record) = find_session(&host, session).await?;
    let engine = host.history().await?;
    let admin = admin_of(&engine)?;
    let stats = admin.session_stats(&caller(&key, &record)).await?;
    if json {
        print_json(&crate::views::stats(&host, session).await?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let usage = admin.usage().await?;
    let engine_id = engine.info().id;
    let n = |value: u64| crate::context::grouped(value);
    let counted = |counts: &std::collections::BTreeMap<String, u64>, label: &str| {
        counts
            .iter()
            .map(|(name, count)| format!("{label}{name}: {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("session:        {} (engine {engine_id})", stats.session);
    println!("messages:       {}", n(stats.messages));
    println!(
        "context:        {} items, {} tokens",
        n(stats.context_items),
        n(stats.context_tokens)
    );
    for (kind, group) in &stats.context_by_kind {
        println!(
            "  {kind:<22} {:>5} items {:>8} tokens",
            n(group.items),
            n(group.tokens)
        );
    }
    if !stats.summaries_by_depth.is_empty() {
        println!(
            "summaries in the context, by depth: {}",
            counted(&stats.summaries_by_depth, "depth ")
        );
        println!(
            "  written by: {}",
            counted(&stats.summaries_by_summarizer, "")
        );
    }
    println!(
        "store:          {} bytes of database, {} documents in the recall index",
        n(usage.database_bytes),
        n(usage.index_docs)
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn sessions(global: &Global, json: bool) -> Result<ExitCode> {
    let rows = crate::views::sessions(&global.reader().await?).await?;
    let rows = rows.as_array().cloned().unwrap_or_default();
    if json {
        print_json(&Value::Array(rows))?;
    } else if rows.is_empty() {
        println!("no sessions in {}", global.state_dir.display());
    } else {
        for row in rows {
            println!(
                "{}  {}  id={}  messages={}  last={}",
                row["agent"].as_str().unwrap_or(""),
                row["key"].as_str().unwrap_or(""),
                row["id"].as_str().unwrap_or(""),
                row["messages"],
                row["lastActivity"].as_str().unwrap_or("-")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `doctor --fix`: a recall index the store check finds missing, unreadable, damaged or ahead
/// of the database is rebuilt from the database (when the process that maintains it lets go
/// of it within 10 s; else the reason is printed and the check below still reports it).
async fn fix_recall_index(global: &Global) {
    let rebuilt = async {
        let host = global.host().await?;
        let engine = match host.history().await {
            // No engine keeps history here: no index to fix.
            Err(HostError::NoHistory { reasons, .. }) if reasons.is_empty() => return Ok(None),
            engine => engine?,
        };
        let admin = admin_of(&engine)?;
        if !admin.check().await?.index_needs_rebuild {
            return Ok(None);
        }
        anyhow::Ok(Some(admin.rebuild_index().await?))
    };
    match rebuilt.await {
        Ok(None) => {}
        Ok(Some(documents)) => eprintln!(
            "doctor --fix: rebuilt the recall index from the database ({documents} documents)"
        ),
        Err(error) => eprintln!("doctor --fix: the recall index could not be rebuilt: {error:#}"),
    }
}

pub(crate) async fn rebuild_index(global: &Global) -> Result<ExitCode> {
    let host = global.host().await?;
    let documents = admin(&host).await?.rebuild_index().await?;
    println!("rebuilt the recall index: {documents} documents");
    Ok(ExitCode::SUCCESS)
}
