//! The read-only views of a store as JSON, in one place: the command line's `--json` outputs,
//! `vilvona ui` and the OpenClaw panel (through `vilvona ui`) all call these, so the three never
//! disagree on a number.
//!
//! A request names its view and carries that view's arguments, as the page sends it:
//! `{"view": "grep", "session": "agent:main:x", "query": "…"}`.

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};
use vilvona_core::admin::{StorageCheck, TokenPrices, TurnRecord};
use vilvona_runtime::Host;
use vilvona_runtime::context_report::{ContextReport, context_report};

use crate::session::{admin, caller, find_session};

/// How long a `watch` waits for a change before it answers "unchanged".
const WATCH_WAIT: Duration = Duration::from_secs(20);
/// How often a `watch` looks at the session.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Answers one request of the page (see the module's documentation).
pub(crate) async fn answer(
    host: &Host,
    request: &Value,
    prices: Option<TokenPrices>,
) -> Result<Value> {
    let view = request["view"].as_str().unwrap_or_default();
    let session = || {
        request["session"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| anyhow!("the \"{view}\" view needs a \"session\""))
    };
    let tool = |name: &'static str, fields: &[&str]| {
        let mut arguments = json!({});
        for field in fields {
            if !request[*field].is_null() {
                arguments[*field] = request[*field].clone();
            }
        }
        (name, arguments)
    };
    let (name, arguments) = match view {
        "sessions" => return sessions(host).await,
        "context" => return context(host, session()?).await,
        "dag" => {
            let in_context = request["inContext"].as_bool().unwrap_or(false);
            return dag(host, session()?, in_context).await;
        }
        "timeline" => {
            let limit = request["limit"].as_u64().map(|n| n as usize);
            return Ok(serde_json::to_value(
                timeline(host, session()?, limit).await?,
            )?);
        }
        "stats" => return stats(host, session()?).await,
        "history" => {
            // The newest `limit` turns (all that are kept without it).
            let mut turns = history(host, session()?, prices).await?;
            if let Some(limit) = request["limit"].as_u64() {
                turns.drain(..turns.len().saturating_sub(limit as usize));
            }
            return Ok(serde_json::to_value(turns)?);
        }
        "health" => return health(host).await,
        "watch" => return watch(host, session()?, request["since"].as_str()).await,
        "grep" => tool("vilvona_grep", &["query", "mode", "limit"]),
        "expand" => tool("vilvona_expand", &["id", "cursor", "tokenCap"]),
        "describe" => tool("vilvona_describe", &["id"]),
        other => bail!(
            "unknown view \"{other}\" (sessions, context, dag, timeline, stats, health, watch, grep, expand, describe)"
        ),
    };
    recall(host, session()?, name, &arguments).await
}

/// The stored sessions: key, id and messages (`vilvona sessions --json`).
pub(crate) async fn sessions(host: &Host) -> Result<Value> {
    let admin = admin(host).await.ok();
    let mut rows = Vec::new();
    for (key, record) in host.listed_sessions().await {
        // Where the engine keeps the history, its counts: its messages, and its folds (each
        // summary it wrote), which the host's record of its own compactions does not see.
        let (messages, folds) = match &admin {
            Some(admin) => {
                let session = caller(&key, &record);
                let messages = admin.session_stats(&session).await.ok().map(|s| s.messages);
                let folds = admin
                    .dag(&session)
                    .await
                    .ok()
                    .map(|dag| dag.summaries.len() as u64);
                (messages, folds)
            }
            None => (None, None),
        };
        let messages = match messages {
            Some(count) => count,
            None => vilvona_transcript::read_transcript(&record.session_file)
                .map(|t| {
                    t.entries
                        .iter()
                        .filter(|l| matches!(l.entry, vilvona_transcript::Entry::Message(_)))
                        .count() as u64
                })
                .unwrap_or(0),
        };
        // A session only the store holds (a gateway's) has no record of its own here.
        let recorded = !record.session_file.as_os_str().is_empty();
        rows.push(json!({
            "agent": host.options().agent_id,
            "key": key,
            "id": record.session_id,
            "messages": messages,
            "lastActivity": recorded.then(|| vilvona_summarize::format_utc_rfc3339(record.updated_at_ms)),
            "compactions": folds.map(|folds| folds.max(record.compaction_count)).or(recorded.then_some(record.compaction_count)),
        }));
    }
    Ok(Value::Array(rows))
}

/// What the session's next prompt is made of (`vilvona context json`).
pub(crate) async fn context(host: &Host, session: &str) -> Result<Value> {
    let (key, record) = find_session(host, session).await?;
    Ok(context_json(&context_report(host, &key, &record).await?))
}

/// The report as `context json` prints it.
pub(crate) fn context_json(report: &ContextReport) -> Value {
    json!({
        "report": report,
        "session": {
            "totalTokens": report.session_tokens,
            "contextTokens": report.window,
            "inputTokens": report.input_tokens,
            "outputTokens": report.output_tokens,
        },
    })
}

/// The session's summary DAG (`vilvona context dag --format json`); with `in_context`, only
/// the summaries the context holds (the DAG's tops: what the panel lists, each expanded on
/// demand), which stay few however long the session grows.
pub(crate) async fn dag(host: &Host, session: &str, in_context: bool) -> Result<Value> {
    let (key, record) = find_session(host, session).await?;
    let mut view = admin(host).await?.dag(&caller(&key, &record)).await?;
    if in_context {
        view.summaries.retain(|summary| summary.in_context);
    }
    let mut value = serde_json::to_value(&view)?;
    value["session"] = json!(record.session_id);
    Ok(value)
}

/// The session's compactions, newest first, at most `limit` of them with the totals of all
/// (`vilvona context timeline --json`).
pub(crate) async fn timeline(
    host: &Host,
    session: &str,
    limit: Option<usize>,
) -> Result<crate::timeline::Timeline> {
    let (key, record) = find_session(host, session).await?;
    let view = admin(host).await?.dag(&caller(&key, &record)).await?;
    Ok(crate::timeline::timeline(&view, limit))
}

/// What the engine keeps of the session and what it plans its context against
/// (`vilvona stats --json`).
pub(crate) async fn stats(host: &Host, session: &str) -> Result<Value> {
    let (key, record) = find_session(host, session).await?;
    let engine = host.history().await?;
    let admin = crate::session::admin_of(&engine)?;
    let stats = admin.session_stats(&caller(&key, &record)).await?;
    let usage = admin.usage().await?;
    let mut value = serde_json::to_value(&stats)?;
    value["engine"] = json!(engine.info().id);
    value["version"] = json!(env!("CARGO_PKG_VERSION"));
    value["databaseBytes"] = json!(usage.database_bytes);
    value["indexDocs"] = json!(usage.index_docs);
    Ok(value)
}

/// The session turn by turn, oldest first (`vilvona context history`, the panel's charts).
/// With `prices`, a turn the host did not price is priced at them.
pub(crate) async fn history(
    host: &Host,
    session: &str,
    prices: Option<TokenPrices>,
) -> Result<Vec<TurnRecord>> {
    let (key, record) = find_session(host, session).await?;
    let engine = host.history().await?;
    let admin = crate::session::admin_of(&engine)?;
    let mut turns = admin.turn_history(&caller(&key, &record)).await?;
    if let Some(prices) = prices {
        for usage in turns.iter_mut().filter_map(|turn| turn.usage.as_mut()) {
            if usage.cost.is_none() {
                usage.cost = Some(prices.cost(usage));
            }
        }
    }
    Ok(turns)
}

/// The store's integrity, as doctor's "store integrity" line says it.
pub(crate) async fn health(host: &Host) -> Result<Value> {
    let report = admin(host).await?.check().await?;
    Ok(store_integrity(&report))
}

/// Doctor's "store integrity" check of a storage check: one wording for doctor and the page.
pub(crate) fn store_integrity(report: &StorageCheck) -> Value {
    json!({
        "name": "store integrity",
        "ok": report.is_healthy(),
        "detail": integrity_detail(report),
        "indexNeedsRebuild": report.index_needs_rebuild,
    })
}

/// What was checked when the store is healthy, else what is wrong.
pub(crate) fn integrity_detail(report: &StorageCheck) -> String {
    if report.is_healthy() {
        report.summary.clone()
    } else {
        report.problems.join("; ")
    }
}

/// A recall tool's answer, called as the session would call it (grep, expand, describe).
pub(crate) async fn recall(
    host: &Host,
    session: &str,
    tool: &str,
    arguments: &Value,
) -> Result<Value> {
    let (key, record) = find_session(host, session).await?;
    let engine = host.history().await?;
    Ok(engine
        .call_tool(&caller(&key, &record), tool, arguments)
        .await?)
}

/// What changes when a turn commits or compaction publishes: the messages held, the context's
/// items and tokens, the summaries by depth. Short, and equal exactly when nothing changed.
async fn stamp(host: &Host, session: &str) -> Result<String> {
    let (key, record) = find_session(host, session).await?;
    let stats = admin(host)
        .await?
        .session_stats(&caller(&key, &record))
        .await?;
    let depths: Vec<String> = stats
        .summaries_by_depth
        .iter()
        .map(|(depth, count)| format!("{depth}:{count}"))
        .collect();
    Ok(format!(
        "{}.{}.{}.{}",
        stats.messages,
        stats.context_items,
        stats.context_tokens,
        depths.join(",")
    ))
}

/// Waits (up to 20 s) until the session differs from `since`, then answers its new stamp:
/// the page's live view, without polling the whole report.
async fn watch(host: &Host, session: &str, since: Option<&str>) -> Result<Value> {
    let started = std::time::Instant::now();
    loop {
        let now = stamp(host, session)
            .await
            .with_context(|| format!("watching {session}"))?;
        let changed = since != Some(now.as_str());
        if changed || started.elapsed() >= WATCH_WAIT {
            return Ok(json!({"stamp": now, "changed": changed}));
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}
