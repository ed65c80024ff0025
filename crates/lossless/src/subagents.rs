//! Subagents: scoped, expiring recall grants for a child session, and their end.

use std::sync::Arc;

use async_trait::async_trait;
use vilvona_core::engine::*;
use vilvona_store::*;

use crate::engine::LosslessEngine;
use crate::errors::store_error;

#[derive(Debug)]
struct GrantRollback {
    store: Arc<dyn HistoryStore>,
    grant_id: i64,
    seeded: Option<ConversationId>,
}

#[async_trait]
impl SpawnRollback for GrantRollback {
    async fn rollback(self: Box<Self>) -> Result<(), EngineError> {
        self.store
            .delete_grant(self.grant_id)
            .await
            .map_err(|error| store_error("rolling back a grant", error))?;
        if let Some(child) = self.seeded {
            self.store
                .remove_context(child)
                .await
                .map_err(|error| store_error("rolling back a fork", error))?;
        }
        Ok(())
    }
}

impl LosslessEngine {
    pub(crate) async fn spawn_subagent(
        &self,
        params: &SubagentSpawnParams,
    ) -> Result<SpawnPreparation, EngineError> {
        let parent = match &params.parent_session_id {
            Some(session_id) => {
                self.conversation(session_id, Some(&params.parent_session_key))
                    .await?
            }
            None => {
                let found = self
                    .inner
                    .store
                    .conversations_by_session_key(
                        &self.inner.config.agent_id,
                        &params.parent_session_key,
                    )
                    .await
                    .map_err(|error| store_error("finding the parent", error))?;
                match found.last() {
                    Some(conversation) => conversation.clone(),
                    None => return Ok(None),
                }
            }
        };
        let ttl = params.ttl_ms.unwrap_or(3_600_000) as i64;
        let grant = self
            .inner
            .store
            .create_grant(NewGrant {
                grantee: params.child_session_key.clone(),
                conversation: parent.id,
                expires_at_ms: self.now_ms() + ttl,
                token_cap: self.inner.config.max_expand_tokens * 8,
            })
            .await
            .map_err(|error| store_error("granting recall", error))?;
        let mut seeded = None;
        if params.context_mode == ContextMode::Fork {
            let child_session = params
                .child_session_id
                .clone()
                .unwrap_or_else(|| params.child_session_key.clone());
            let child = self
                .conversation(&child_session, Some(&params.child_session_key))
                .await?;
            let items: Vec<ItemRef> = self
                .context_refs(parent.id)
                .await?
                .iter()
                .map(|item| item.item)
                .collect();
            self.inner
                .store
                .append_items(child.id, items)
                .await
                .map_err(|error| store_error("seeding the fork", error))?;
            seeded = Some(child.id);
        }
        Ok(Some(Box::new(GrantRollback {
            store: self.inner.store.clone(),
            grant_id: grant.id,
            seeded,
        })))
    }

    pub(crate) async fn end_subagent(
        &self,
        params: &SubagentEndedParams,
    ) -> Result<(), EngineError> {
        self.inner
            .store
            .revoke_grants(&params.child_session_key)
            .await
            .map_err(|error| store_error("revoking grants", error))?;
        Ok(())
    }
}
