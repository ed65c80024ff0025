//! `vilvona forget` and `vilvona retention`.

use std::process::ExitCode;

use anyhow::{Context as _, Result, anyhow};
use serde_json::json;
use vilvona_lossless::{LosslessConfig, RetentionKind};

use crate::inspect::{find_session, lossless};
use crate::{Global, print_json};

/// Forgets a session, or its messages before a time.
pub(crate) async fn forget(
    global: &Global,
    session: &str,
    before: Option<&str>,
    json: bool,
) -> Result<ExitCode> {
    let host = global.host().await?;
    let (key, record) = find_session(global, &host, session).await?;
    let engine = lossless(global, &host).await?;
    let forgotten = match before {
        Some(text) => {
            let before_ms = vilvona_lossless::parse_rfc3339(text).ok_or_else(|| {
                anyhow!("--before {text:?} is not an RFC 3339 time like 2026-03-02T09:00:00Z")
            })?;
            engine.forget_before(&record.session_id, before_ms).await?
        }
        None => {
            let forgotten = engine.forget_session(&record.session_id).await?;
            // The session's record and transcript (this host's own files) go with it.
            host.remove_session(&key).await?;
            forgotten
        }
    };
    if json {
        print_json(&serde_json::to_value(&forgotten)?)?;
    } else {
        let report = &forgotten.report;
        println!(
            "{}: forgot {} messages; {} summaries rebuilt, {} removed; {} context items, {} stored files",
            record.session_id,
            report.messages,
            report.summaries_rewritten,
            report.summaries_removed,
            report.context_items,
            report.blobs
        );
        println!(
            "store: {:.1} MB → {:.1} MB",
            forgotten.space.bytes_before as f64 / 1e6,
            forgotten.space.bytes_after as f64 / 1e6
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows what the retention policy does now, and (without `--dry-run`) does it.
pub(crate) async fn retention(global: &Global, dry_run: bool, json: bool) -> Result<ExitCode> {
    let host = global.host().await?;
    let config = LosslessConfig::from_value(
        host.config()
            .entries
            .get(vilvona_lossless::ENGINE_ID)
            .and_then(|entry| entry.config.as_ref()),
    )
    .map_err(|problem| anyhow!(problem))?;
    let engine = lossless(global, &host).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("reading the clock")?
        .as_millis() as i64;
    let plan = engine.retention_plan(&config.retention, now).await?;
    let space = if dry_run || plan.is_empty() {
        None
    } else {
        let space = engine.apply_retention(&plan).await?;
        for action in &plan {
            if action.action == RetentionKind::Delete
                && let Ok((key, _)) = find_session(global, &host, &action.session_id).await
            {
                host.remove_session(&key).await?;
            }
        }
        Some(space)
    };
    if json {
        print_json(
            &json!({"dryRun": dry_run, "policy": config.retention, "actions": plan, "space": space}),
        )?;
    } else {
        if plan.is_empty() {
            println!("retention: nothing to do");
        }
        for action in &plan {
            let verb = match (action.action, dry_run) {
                (RetentionKind::Archive, true) => "would archive",
                (RetentionKind::Delete, true) => "would delete",
                (RetentionKind::Archive, false) => "archived",
                (RetentionKind::Delete, false) => "deleted",
            };
            println!("{verb} {}: {}", action.session_id, action.reason);
        }
        if let Some(space) = space {
            println!(
                "store: {:.1} MB → {:.1} MB",
                space.bytes_before as f64 / 1e6,
                space.bytes_after as f64 / 1e6
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
