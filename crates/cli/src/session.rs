//! The session a command names and the engine administration it reaches it through.

use std::sync::Arc;

use anyhow::{Result, anyhow};
use vilvona_core::ContextEngine;
use vilvona_core::admin::{EngineAdmin, ToolCaller};
use vilvona_runtime::Host;
use vilvona_runtime::sessions::SessionRecord;

/// A session named by its key or its id: one this host ran, or one an embedding host (the
/// OpenClaw plugin) stored in the engine's history directly.
pub(crate) async fn find_session(host: &Host, name: &str) -> Result<(String, SessionRecord)> {
    if let Some(record) = host.session(name).await {
        return Ok((name.to_owned(), record));
    }
    if let Some(found) = host
        .sessions()
        .await
        .into_iter()
        .find(|(_, record)| record.session_id == name)
    {
        return Ok(found);
    }
    // An id names its session; a key its newest one (OpenClaw's `/new` and daily reset start
    // a session under the same key, and the one it is in now is the newest). Sessions are
    // listed oldest first.
    if let Ok(admin) = admin(host).await
        && let Some(stored) = {
            let stored = admin.stored_sessions().await?;
            let by_id = stored.iter().position(|s| s.session_id == name);
            let by_key = || {
                stored
                    .iter()
                    .rposition(|s| s.session_key.as_deref() == Some(name))
            };
            by_id.or_else(by_key).map(|index| stored[index].clone())
        }
    {
        let key = stored
            .session_key
            .clone()
            .unwrap_or_else(|| stored.session_id.clone());
        return Ok((
            key,
            SessionRecord {
                session_id: stored.session_id,
                ..SessionRecord::default()
            },
        ));
    }
    Err(anyhow!(
        "unknown session \"{name}\" in {}; `vilvona --state-dir {} sessions` lists the stored ones",
        host.options().state_dir.display(),
        host.options().state_dir.display()
    ))
}

/// The administration of the engine that keeps the agent's history.
pub(crate) async fn admin(host: &Host) -> Result<Arc<dyn EngineAdmin>> {
    admin_of(&host.history().await?)
}

pub(crate) fn admin_of(engine: &Arc<dyn ContextEngine>) -> Result<Arc<dyn EngineAdmin>> {
    engine.admin().ok_or_else(|| {
        anyhow!(
            "context engine \"{}\" keeps no history to administer",
            engine.info().id
        )
    })
}

/// Who a command calls the engine's tools as: the named session.
pub(crate) fn caller(key: &str, record: &SessionRecord) -> ToolCaller {
    ToolCaller::new(record.session_id.clone(), Some(key.to_owned()))
}
