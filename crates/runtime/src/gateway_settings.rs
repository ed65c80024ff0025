//! The engine settings a gateway gave `vilvona serve`, recorded in the state directory so that
//! the command line, run on the same directory, reads what the gateway uses.
//!
//! Under OpenClaw the engine's settings are the plugin's `engine` setting in `openclaw.json`,
//! which only the gateway reads; the command line reads `vilvona.json5`. `serve` records what
//! it was initialized with ([`record`], in [`FILE`]); [`Host::open`](crate::Host::open) applies
//! the record to an engine whose entry in `vilvona.json5` has no settings ([`apply`]); and
//! `doctor` says when the two differ ([`check`]): then each follows its own file.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vilvona_core::registry::SettingsOrigin;

use crate::config::HostConfig;

/// The record's file name in the state directory.
pub const FILE: &str = "gateway-settings.json";

/// What a gateway gave `serve`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    /// The engine it selected.
    pub engine_id: String,
    /// The engine's settings (`null`: none, the defaults).
    pub config: Value,
    /// When `serve` recorded them.
    pub recorded_at_ms: i64,
}

/// Records the settings `serve` was initialized with, unless the record already says so. The
/// file is replaced whole (a reader never sees half of it) and only its owner may read it.
pub fn record(state_dir: &Path, engine_id: &str, config: Option<&Value>) -> std::io::Result<()> {
    let config = config.cloned().unwrap_or(Value::Null);
    if read(state_dir)
        .ok()
        .flatten()
        .is_some_and(|known| known.engine_id == engine_id && known.config == config)
    {
        return Ok(());
    }
    let recorded = Recorded {
        engine_id: engine_id.to_owned(),
        config,
        recorded_at_ms: vilvona_core::clock::now_ms(),
    };
    let path = state_dir.join(FILE);
    let temporary = state_dir.join(format!("{FILE}.{}.tmp", std::process::id()));
    let text = serde_json::to_vec_pretty(&recorded).map_err(std::io::Error::other)?;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| file.write_all(&text))
        .and_then(|()| std::fs::rename(&temporary, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// The record in `state_dir`, if a gateway has run there.
pub fn read(state_dir: &Path) -> Result<Option<Recorded>, String> {
    let path = state_dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|error| format!("{}: {error}", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}

/// The settings `vilvona.json5` itself gives an engine (not what [`apply`] added: those name
/// the record as their origin).
fn written_settings<'a>(config: &'a HostConfig, engine_id: &str) -> Option<&'a Value> {
    let entry = config.entries.get(engine_id)?;
    let from_the_record = entry
        .origin
        .as_ref()
        .is_some_and(|origin| origin.file.file_name() == Some(FILE.as_ref()));
    entry
        .config
        .as_ref()
        .filter(|settings| !from_the_record && !settings.is_null())
}

/// Gives the recorded engine the gateway's settings when `vilvona.json5` gives it none; a
/// record that cannot be read is named in the log and changes nothing.
pub fn apply(config: &mut HostConfig, state_dir: &Path) {
    let recorded = match read(state_dir) {
        Ok(Some(recorded)) if !recorded.config.is_null() => recorded,
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(%error, "the gateway's recorded engine settings cannot be read");
            return;
        }
    };
    if written_settings(config, &recorded.engine_id).is_some() {
        return;
    }
    let mut settings = recorded.config;
    // The host's model is the gateway's (OpenClaw's `llm.complete`): outside it, what the
    // command line summarizes, it summarizes with the extractive summarizer.
    if settings["summarizer"]["kind"] == "host" {
        settings["summarizer"] = serde_json::json!({"kind": "extractive"});
    }
    let entry = config
        .entries
        .entry(recorded.engine_id.clone())
        .or_default();
    entry.config = Some(settings);
    entry.origin = Some(SettingsOrigin {
        file: state_dir.join(FILE),
        key: "config".to_owned(),
        positions: Default::default(),
    });
}

/// Whether the command line and the gateway read the same engine settings, for `doctor`:
/// `Ok` with what it found when they agree (or the command line reads the gateway's), `Err`
/// naming the keys that differ; `None` where no gateway has run on this state directory.
pub fn check(config: &HostConfig, state_dir: &Path) -> Option<Result<String, String>> {
    let path: PathBuf = state_dir.join(FILE);
    let recorded = match read(state_dir) {
        Ok(Some(recorded)) => recorded,
        Ok(None) => return None,
        Err(error) => {
            return Some(Err(format!(
                "the gateway's recorded engine settings cannot be read: {error}"
            )));
        }
    };
    let engine = &recorded.engine_id;
    let when = vilvona_summarize::format_utc_rfc3339(recorded.recorded_at_ms);
    let detail = |said: String| format!("{said} ({}, recorded {when})", path.display());
    Some(match written_settings(config, engine) {
        None => Ok(detail(format!(
            "the command line reads the {engine} settings the gateway gave vilvona serve"
        ))),
        Some(written) => {
            let differing = differences(written, &recorded.config);
            if differing.is_empty() {
                Ok(detail(format!(
                    "vilvona.json5's plugins.entries.{engine}.config and the gateway's agree"
                )))
            } else {
                Err(detail(format!(
                    "vilvona.json5's plugins.entries.{engine}.config differs from the settings the gateway gave vilvona serve at {}: the command line follows vilvona.json5, the gateway the plugin's `engine` setting in openclaw.json; make them agree",
                    differing.join(", ")
                )))
            }
        }
    })
}

/// The dotted keys at which two settings differ (`(the settings)` when they are not both
/// objects and differ), in order.
pub fn differences(a: &Value, b: &Value) -> Vec<String> {
    fn walk(a: &Value, b: &Value, at: &str, found: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(a_keys), Value::Object(b_keys)) => {
                let mut keys: Vec<&String> = a_keys.keys().chain(b_keys.keys()).collect();
                keys.sort();
                keys.dedup();
                for key in keys {
                    let place = if at.is_empty() {
                        key.clone()
                    } else {
                        format!("{at}.{key}")
                    };
                    walk(
                        a_keys.get(key).unwrap_or(&Value::Null),
                        b_keys.get(key).unwrap_or(&Value::Null),
                        &place,
                        found,
                    );
                }
            }
            _ if a != b => found.push(if at.is_empty() {
                "(the settings)".to_owned()
            } else {
                at.to_owned()
            }),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(a, b, "", &mut found);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_name_every_key_that_differs() {
        for (a, b, said) in [
            (json!({"x": 1}), json!({"x": 1}), vec![]),
            (
                json!({"x": 1, "y": {"z": 2}}),
                json!({"x": 2, "y": {"z": 3, "w": 1}}),
                vec!["x", "y.w", "y.z"],
            ),
            (json!({"x": 1}), json!(null), vec!["(the settings)"]),
            (json!({"x": [1]}), json!({"x": [2]}), vec!["x"]),
        ] {
            assert_eq!(differences(&a, &b), said, "{a} against {b}");
        }
    }
}
