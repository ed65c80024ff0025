//! `vilvona forget` and `vilvona retention`.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::{Result, anyhow};
use serde_json::json;
use vilvona_core::admin::RetentionKind;

use crate::session::{admin, find_session};
use crate::{Global, print_json};

/// Forgets a session, or its messages before a time.
pub(crate) async fn forget(
    global: &Global,
    session: &str,
    before: Option<&str>,
    json: bool,
) -> Result<ExitCode> {
    let host = global.host().await?;
    let (key, record) = find_session(&host, session).await?;
    let before_ms = match before {
        Some(text) => Some(vilvona_summarize::parse_rfc3339(text).ok_or_else(|| {
            anyhow!("--before {text:?} is not an RFC 3339 time like 2026-03-02T09:00:00Z")
        })?),
        None => None,
    };
    let forgotten = admin(&host)
        .await?
        .forget(&record.session_id, before_ms)
        .await?;
    if before_ms.is_none() {
        // The session's record and transcript (this host's own files) go with it.
        host.remove_session(&key).await?;
    }
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
    let run = admin(&host).await?.retention(!dry_run).await?;
    let (plan, space) = (&run.actions, run.space);
    if space.is_some() {
        // The deleted sessions' records and transcripts (this host's own) go too: one listing
        // of the records for all of them.
        let keys: HashMap<String, String> = host
            .sessions()
            .await
            .into_iter()
            .map(|(key, record)| (record.session_id, key))
            .collect();
        for action in plan {
            if action.action == RetentionKind::Delete
                && let Some(key) = keys.get(&action.session_id)
            {
                host.remove_session(key).await?;
            }
        }
    }
    if json {
        print_json(
            &json!({"dryRun": dry_run, "policy": run.policy, "actions": plan, "space": space}),
        )?;
    } else {
        if plan.is_empty() {
            println!("retention: nothing to do");
        }
        for action in plan {
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
