//! A session the host begins anew under the same id (OpenClaw's `/new` and `/reset` keep the
//! session id and start a new window of its transcript). The conversation that held the
//! session steps aside: it keeps every message and summary, under the session id with the
//! reset's time appended (listed, and reachable by that id, beside the key it had), and the
//! session's next call begins a new conversation with nothing of the old one in its context.
//! The recall tools still reach the old one, as they reach every session stored under the
//! same key.

use vilvona_core::{EngineError, SessionResetParams};

use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::subagents::HostOrigin;

impl LosslessEngine {
    /// `on_session_reset`: the session's conversation steps aside (see the module).
    pub(crate) async fn reset_session(
        &self,
        params: &SessionResetParams,
    ) -> Result<(), EngineError> {
        let Some(conversation) = self.find_stored_conversation(&params.session_id).await? else {
            // Nothing stored for the session: nothing to set aside.
            return Ok(());
        };
        // One that holds nothing yet (a reset told twice) stays; only where its own messages
        // begin is noted. (A fork child seeded but not yet run holds its parent's context.)
        let fresh = if conversation.message_count == 0 && conversation.context_tokens == 0 {
            conversation
        } else {
            // A compaction of the conversation finishes first: what it writes stays with it.
            let lock = self.compaction_lock(conversation.id);
            let _held = lock.lock().await;
            let retired = format!(
                "{}@{}-{}",
                params.session_id,
                params.reason.as_deref().unwrap_or("reset"),
                self.now_ms()
            );
            self.store()
                .retire_session(conversation.id, &retired)
                .await
                .map_err(|error| {
                    store_error("setting the session's earlier history aside", error)
                })?;
            self.forget_cached(conversation.id, &params.session_id);
            tracing::info!(
                session_id = %params.session_id,
                kept_as = %retired,
                "the host began the session anew; its earlier history is kept under another id"
            );
            self.conversation(&params.session_id, params.session_key.as_deref())
                .await?
        };
        // The host's places go on from where the session was: its first turn shows where the
        // new conversation's own messages begin, and what the host shows before them (and its
        // record holds) came before the reset, not lost from the store.
        self.record_host_origin(
            fresh.id,
            &HostOrigin {
                parent: None,
                parent_messages: 0,
                offset: None,
                parent_last_at_ms: None,
                since_ms: Some(self.now_ms()),
            },
        )
        .await?;
        self.memory(fresh.id, |memory| memory.host_offset = None);
        Ok(())
    }
}
