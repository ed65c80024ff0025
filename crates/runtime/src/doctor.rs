//! `doctor`: what the host would tell an operator about its configuration and engines.

use serde::Serialize;
use vilvona_core::host::{Operation, check_host_support};
use vilvona_core::registry::{QuarantineRecord, RegisteredEngine, SelectionSource};

use crate::host::Host;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compatibility {
    pub operation: Operation,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A named check added by the caller (the store's integrity check, for instance).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnknownKey {
    pub key: String,
    /// `FILE:LINE:COLUMN`.
    pub place: String,
    pub did_you_mean: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DoctorReport {
    pub config_file: String,
    pub config_exists: bool,
    /// Keys the configuration has that nothing reads: each with its place and, for a slip,
    /// the key that was meant.
    pub unknown_keys: Vec<UnknownKey>,
    pub selected_engine: String,
    pub active_engine: String,
    pub selection_source: SelectionSource,
    pub registered_engines: Vec<RegisteredEngine>,
    pub quarantines: Vec<QuarantineRecord>,
    pub host: String,
    pub compatibility: Vec<Compatibility>,
    pub state_dir: String,
    pub state_dir_writable: bool,
    pub sessions: usize,
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// Healthy: no quarantine, every operation supported, the state dir writable, every check ok.
    /// Unknown keys are reported but do not make the host unhealthy.
    pub fn healthy(&self) -> bool {
        self.quarantines.is_empty()
            && self.compatibility.iter().all(|c| c.ok)
            && self.state_dir_writable
            && self.checks.iter().all(|check| check.ok)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let mark = |ok: bool| if ok { "ok" } else { "PROBLEM" };
        out.push_str(&format!(
            "config: {} ({})\n",
            self.config_file,
            if self.config_exists {
                "found"
            } else {
                "not found; defaults apply"
            }
        ));
        for unknown in &self.unknown_keys {
            out.push_str(&format!(
                "  unknown key (ignored): {} at {}{}\n",
                unknown.key,
                unknown.place,
                unknown
                    .did_you_mean
                    .as_ref()
                    .map_or_else(String::new, |meant| format!("; did you mean {meant}?"))
            ));
        }
        out.push_str(&format!(
            "context engine: {} (slot: {}, source: {:?})\n",
            self.active_engine, self.selected_engine, self.selection_source
        ));
        out.push_str("registered engines:\n");
        for engine in &self.registered_engines {
            out.push_str(&format!("  - {} (owner {})\n", engine.id, engine.owner));
        }
        if self.quarantines.is_empty() {
            out.push_str("quarantines: none\n");
        } else {
            out.push_str("quarantines:\n");
            for record in &self.quarantines {
                out.push_str(&format!(
                    "  - {} failed during {}: {} — PROBLEM\n",
                    record.engine_id, record.operation, record.reason
                ));
            }
        }
        out.push_str(&format!("host {}:\n", self.host));
        for compatibility in &self.compatibility {
            out.push_str(&format!(
                "  {}: {}{}\n",
                compatibility.operation,
                mark(compatibility.ok),
                compatibility
                    .error
                    .as_deref()
                    .map(|error| format!(" — {error}"))
                    .unwrap_or_default()
            ));
        }
        out.push_str(&format!(
            "state dir: {} ({}), {} session(s)\n",
            self.state_dir,
            if self.state_dir_writable {
                "writable"
            } else {
                "NOT WRITABLE — PROBLEM"
            },
            self.sessions
        ));
        for check in &self.checks {
            out.push_str(&format!(
                "{}: {} — {}\n",
                check.name,
                mark(check.ok),
                check.detail
            ));
        }
        out.push_str(if self.healthy() {
            "healthy\n"
        } else {
            "problems found\n"
        });
        out
    }
}

/// The report for `host`, with the caller's extra checks.
pub async fn doctor(host: &Host, mut checks: Vec<Check>) -> DoctorReport {
    if let Some(agreed) = crate::gateway_settings::check(host.config(), &host.options().state_dir) {
        checks.push(Check {
            name: "gateway settings".to_owned(),
            ok: agreed.is_ok(),
            detail: agreed.unwrap_or_else(|differs| differs),
        });
    }
    let info = host.engine().engine.info();
    let profile = &host.options().profile;
    let compatibility = Operation::ALL
        .iter()
        .map(|operation| {
            match check_host_support(&info.id, &info.host_requirements, *operation, profile) {
                Ok(()) => Compatibility {
                    operation: *operation,
                    ok: true,
                    error: None,
                },
                Err(error) => Compatibility {
                    operation: *operation,
                    ok: false,
                    error: Some(error.to_string()),
                },
            }
        })
        .collect();
    let state_dir = &host.options().state_dir;
    let probe = state_dir.join(".doctor-probe");
    let writable = std::fs::write(&probe, b"ok").is_ok() && std::fs::remove_file(&probe).is_ok();
    let config_path = host.options().config_path();
    DoctorReport {
        config_file: config_path.display().to_string(),
        config_exists: config_path.exists(),
        unknown_keys: host
            .config()
            .unknown_keys
            .iter()
            .map(|key| UnknownKey {
                key: key.clone(),
                place: host.config().place_of(key),
                did_you_mean: crate::config::known_key_near(key),
            })
            .collect(),
        selected_engine: host.engine().selected_id.clone(),
        active_engine: host.engine().active_id(),
        selection_source: host.engine().source,
        registered_engines: host.registry().engines(),
        quarantines: host.registry().quarantines(),
        host: profile.id.clone(),
        compatibility,
        state_dir: state_dir.display().to_string(),
        state_dir_writable: writable,
        sessions: host.listed_sessions().await.len(),
        checks,
    }
}
