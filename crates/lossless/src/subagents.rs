//! Subagents: scoped, expiring recall grants for a child session, forks, and their end.
//!
//! A fork child sees its parent's history once. At the spawn its context is seeded with the
//! parent's context by reference (the parent's summaries and fresh tail, no copies), and the
//! child's state records what the seed stands for (`fork.origin`). The host then hands the
//! child its own transcript, which begins with the parent's history copied: those leading
//! messages are what the seed already shows, so they are never stored as the child's. The
//! child's own messages are numbered from 0, and every place the host names is shifted by the
//! number of host messages the seed covers (`host_offset`).
//!
//! Each session folds on its own: the child's folds may take in the parent's rows (a row then
//! lies under one summary of each conversation), and the parent's folds never see the child's.
//! A child's end revokes its grants; a deleted child's history goes with it, and nothing of
//! the parent's.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;

use crate::cache::lock_map;
use crate::engine::LosslessEngine;
use crate::errors::store_error;

/// The state key of a fork child: its [`ForkOrigin`].
const FORK_ORIGIN: &str = "fork.origin";

/// Where a fork child's seeded context came from, and what of the host's history it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ForkOrigin {
    /// The parent's conversation.
    parent: i64,
    /// How many messages the parent had stored when the child was forked.
    parent_messages: u64,
    /// How many of the host's leading messages the seed stands for, once the child's first
    /// assembly (or its first turn) showed the host's transcript.
    covered: Option<u64>,
}

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
        let grant = self.grant_recall(params, parent.id).await?;
        let mut seeded = None;
        if params.context_mode == ContextMode::Fork {
            let child_session = params
                .child_session_id
                .clone()
                .unwrap_or_else(|| params.child_session_key.clone());
            let child = self
                .conversation(&child_session, Some(&params.child_session_key))
                .await?;
            self.seed_fork(parent.id, child.id).await?;
            seeded = Some(child.id);
        }
        Ok(Some(Box::new(GrantRollback {
            store: self.inner.store.clone(),
            grant_id: grant,
            seeded,
        })))
    }

    /// The child's grant to read its parent's history. A spawn sent again (the process that
    /// took the first one died before it answered) finds the grant the first one made and
    /// makes no second: no grant is orphaned.
    async fn grant_recall(
        &self,
        params: &SubagentSpawnParams,
        parent: ConversationId,
    ) -> Result<i64, EngineError> {
        let now = self.now_ms();
        let store = &self.inner.store;
        let held = store
            .grants(&params.child_session_key)
            .await
            .map_err(|error| store_error("reading grants", error))?
            .into_iter()
            .find(|grant| {
                grant.conversation == parent && !grant.revoked && grant.expires_at_ms > now
            });
        if let Some(grant) = held {
            return Ok(grant.id);
        }
        let ttl = params.ttl_ms.unwrap_or(3_600_000) as i64;
        let grant = store
            .create_grant(NewGrant {
                grantee: params.child_session_key.clone(),
                conversation: parent,
                expires_at_ms: now + ttl,
                token_cap: self.inner.config.max_expand_tokens * 8,
            })
            .await
            .map_err(|error| store_error("granting recall", error))?;
        Ok(grant.id)
    }

    /// Seeds a fork child's context with its parent's, by reference, once: a child that
    /// already holds a context or messages (a spawn sent again) is left as it is.
    async fn seed_fork(
        &self,
        parent: ConversationId,
        child: ConversationId,
    ) -> Result<(), EngineError> {
        let store = &self.inner.store;
        let held = store
            .context_refs(child)
            .await
            .map_err(|error| store_error("reading the fork's context", error))?;
        let child_row = store
            .conversation_by_id(child)
            .await
            .map_err(|error| store_error("reading the fork", error))?;
        if !held.is_empty() || child_row.is_some_and(|row| row.message_count > 0) {
            return Ok(());
        }
        let parent_messages = store
            .conversation_by_id(parent)
            .await
            .map_err(|error| store_error("reading the parent", error))?
            .map_or(0, |row| row.message_count);
        let items: Vec<ItemRef> = self
            .context_refs(parent)
            .await?
            .iter()
            .map(|item| item.item)
            .collect();
        let origin = ForkOrigin {
            parent: parent.0,
            parent_messages,
            covered: None,
        };
        store
            .set_state(
                child,
                FORK_ORIGIN,
                &serde_json::to_string(&origin).unwrap_or_default(),
            )
            .await
            .map_err(|error| store_error("recording the fork", error))?;
        store
            .append_items(child, items)
            .await
            .map_err(|error| store_error("seeding the fork", error))?;
        lock_map(&self.inner.host_offsets).remove(&child);
        Ok(())
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
        if params.reason != SubagentEndReason::Deleted {
            // Completed, swept or released: the child's history stays, recallable by id.
            return Ok(());
        }
        // Deleted: the child's history goes (what it held of its parent's by reference stays
        // the parent's).
        let children = self
            .inner
            .store
            .conversations_by_session_key(&self.inner.config.agent_id, &params.child_session_key)
            .await
            .map_err(|error| store_error("finding the child", error))?;
        for child in children {
            self.forget_conversation(&child).await?;
        }
        Ok(())
    }

    /// The fork origin of a conversation, if it was seeded as one.
    async fn fork_origin(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<ForkOrigin>, EngineError> {
        let text = self
            .inner
            .store
            .state(conversation, FORK_ORIGIN)
            .await
            .map_err(|error| store_error("reading the fork origin", error))?;
        Ok(text.and_then(|text| serde_json::from_str(&text).ok()))
    }

    /// How many of the host's leading messages the conversation's seeded context stands for: 0
    /// for every conversation but a fork child's. A host place `p` is the conversation's own
    /// message `p - offset`.
    pub(crate) async fn host_offset(
        &self,
        conversation: ConversationId,
    ) -> Result<u64, EngineError> {
        if let Some(offset) = lock_map(&self.inner.host_offsets).get(&conversation) {
            return Ok(*offset);
        }
        let offset = match self.fork_origin(conversation).await? {
            None => 0,
            Some(ForkOrigin {
                covered: Some(covered),
                ..
            }) => covered,
            // Not settled yet: the child's first assembly or turn settles it.
            Some(_) => return Ok(0),
        };
        lock_map(&self.inner.host_offsets).insert(conversation, offset);
        Ok(offset)
    }

    /// Settles, on a fork child's first sight of the host's transcript, how many of its
    /// leading messages the seed stands for, and answers it (0 for a conversation that is no
    /// fork). `host` is the transcript before the child's own turn (its first assembly);
    /// `first_own` the place of the child's first own message when only that is known (its
    /// first turn).
    ///
    /// The host's fork copies the parent's transcript: where the parent's last message when
    /// forked is the host's message at the same place, what comes before and at it is the
    /// seed's; the rest (the parent's turn that spawned the child, not yet stored when the
    /// spawn was prepared) is the child's to store. A transcript that does not meet the parent
    /// there is taken as the seed's whole.
    pub(crate) async fn settle_fork(
        &self,
        conversation: ConversationId,
        host: Option<&[AgentMessage]>,
        first_own: Option<u64>,
    ) -> Result<u64, EngineError> {
        let Some(mut origin) = self.fork_origin(conversation).await? else {
            return Ok(0);
        };
        if let Some(covered) = origin.covered {
            return Ok(covered);
        }
        let covered = match (host, first_own) {
            (Some(host), _) => {
                let at = origin.parent_messages as usize;
                let meets = at > 0 && at <= host.len() && {
                    let last = self
                        .inner
                        .store
                        .messages_in_seq_range(
                            ConversationId(origin.parent),
                            at as u64 - 1,
                            at as u64 - 1,
                        )
                        .await
                        .map_err(|error| store_error("reading the parent's last message", error))?;
                    let first = &host[at - 1];
                    last.first().is_some_and(|stored| {
                        stored.role == first.role() && stored.text() == first.plain_text()
                    })
                };
                if meets {
                    at as u64
                } else {
                    if !host.is_empty() {
                        tracing::warn!(
                            conversation = conversation.0,
                            parent = origin.parent,
                            parent_messages = origin.parent_messages,
                            host = host.len(),
                            "a fork child's transcript does not meet its parent's history where it was forked; the seeded context stands for all of it"
                        );
                    }
                    host.len() as u64
                }
            }
            (None, Some(place)) => place,
            (None, None) => return Ok(0),
        };
        origin.covered = Some(covered);
        self.inner
            .store
            .set_state(
                conversation,
                FORK_ORIGIN,
                &serde_json::to_string(&origin).unwrap_or_default(),
            )
            .await
            .map_err(|error| store_error("recording the fork", error))?;
        lock_map(&self.inner.host_offsets).insert(conversation, covered);
        Ok(covered)
    }
}
