//! `vilvona export` and `vilvona import`: a session's whole history as one file
//! (`vilvona_core::archive` describes the format).

use std::fs::OpenOptions;
use std::io::{BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use vilvona_core::archive::SessionArchive;
use vilvona_core::clock::now_ms;

use crate::session::{admin, find_session};
use crate::{Global, print_json};

/// Writes a session's history to `out`: complete or not at all (a temporary file beside it
/// is renamed into place), readable by its owner only, as the store is.
pub(crate) async fn export(
    global: &Global,
    session: &str,
    out: &Path,
    json: bool,
) -> Result<ExitCode> {
    let host = global.reader().await?;
    let (_, record) = find_session(&host, session).await?;
    let archive = admin(&host)
        .await?
        .export_session(&record.session_id)
        .await?;
    let file_name = out
        .file_name()
        .with_context(|| format!("--out {}: not a file name", out.display()))?;
    let partial = out.with_file_name(format!(
        ".{}.{}.partial",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> Result<()> {
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        archive
            .write(&mut file, now_ms())
            .with_context(|| format!("writing {}", partial.display()))?;
        file.flush()?;
        file.sync_all()
            .with_context(|| format!("syncing {}", partial.display()))?;
        std::fs::rename(&partial, out)
            .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(error);
    }
    if json {
        print_json(&serde_json::json!({
            "sessionId": record.session_id,
            "file": out,
            "messages": archive.messages.len(),
            "summaries": archive.summaries.len(),
            "contextItems": archive.context.len(),
            "blobs": archive.blobs.len(),
        }))?;
    } else {
        println!(
            "{}: {} messages, {} summaries, {} context items, {} stored files → {}",
            record.session_id,
            archive.messages.len(),
            archive.summaries.len(),
            archive.context.len(),
            archive.blobs.len(),
            out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Stores the history a file holds as a new session, verified by reading it back.
pub(crate) async fn import(
    global: &Global,
    file: &Path,
    engine: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let opened =
        std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let (archive, _) = SessionArchive::read(BufReader::new(opened))
        .with_context(|| format!("reading {}", file.display()))?;
    let mut options = global.options();
    options.engine_override = engine;
    let host = global.host_with(options).await?;
    let report = admin(&host).await?.import_session(archive).await?;
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        println!(
            "{}: imported {} messages, {} summaries, {} context items, {} new stored files; {}",
            report.session_id,
            report.messages,
            report.summaries,
            report.context_items,
            report.blobs,
            if report.verified {
                "read back equal to the file"
            } else {
                "NOT verified"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
