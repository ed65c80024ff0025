//! Subagents: scoped, expiring recall grants for a child session, forks, and their end.
//!
//! A fork child sees its parent's history once. At the spawn its context is seeded with the
//! parent's context by reference (the parent's summaries and fresh tail, no copies), and the
//! child's state records what the seed stands for (`fork.origin`). The host then hands the
//! child its own transcript, which begins with the parent's history copied: those leading
//! messages are what the seed already shows, so they are never stored as the child's. The
//! child's own messages are numbered from 0, and every place the host names is shifted by
//! where they begin among the host's places (`host_offset`, settled by the child's first turn).
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

use crate::engine::LosslessEngine;
use crate::errors::store_error;

/// The state key of a conversation whose own messages do not begin at the host's first place:
/// its [`HostOrigin`] (named when only fork children had one).
const HOST_ORIGIN: &str = "fork.origin";

/// Why a conversation's own messages begin later among the host's places than its first: a
/// fork child's record begins with its parent's history; a session the host began anew under
/// the same id (`crate::reset`) keeps what came before in its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HostOrigin {
    /// A fork child's parent conversation (none for a session begun anew).
    pub(crate) parent: Option<i64>,
    /// How many messages the parent had stored when the child was forked (0 for a session
    /// begun anew: every message the host shows at its first sight came before the reset).
    pub(crate) parent_messages: u64,
    /// Where the conversation's own messages begin among the host's places, once its first
    /// turn showed them.
    pub(crate) offset: Option<u64>,
    /// A fork child's: the time of its parent's last stored message at the spawn. The host's
    /// copy of the parent's history ends there, when the parent's last messages cannot be
    /// found in it as a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent_last_at_ms: Option<i64>,
    /// A session begun anew's: when. What the host shows of earlier came before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) since_ms: Option<i64>,
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
        let parent_last_at_ms = match parent_messages.checked_sub(1) {
            None => None,
            Some(last) => store
                .messages_in_seq_range(parent, last, last)
                .await
                .map_err(|error| store_error("reading the parent's last message", error))?
                .first()
                .and_then(|message| message.message().ok()?.timestamp_ms()),
        };
        let items: Vec<ItemRef> = self
            .context_refs(parent)
            .await?
            .iter()
            .map(|item| item.item)
            .collect();
        let origin = HostOrigin {
            parent: Some(parent.0),
            parent_messages,
            offset: None,
            parent_last_at_ms,
            since_ms: None,
        };
        self.record_host_origin(child, &origin).await?;
        store
            .append_items(child, items)
            .await
            .map_err(|error| store_error("seeding the fork", error))?;
        self.memory(child, |memory| memory.host_offset = None);
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

    pub(crate) async fn record_host_origin(
        &self,
        conversation: ConversationId,
        origin: &HostOrigin,
    ) -> Result<(), EngineError> {
        let text = serde_json::to_string(origin).unwrap_or_default();
        self.inner
            .store
            .set_state(conversation, HOST_ORIGIN, &text)
            .await
            .map_err(|error| store_error("recording where the session's own messages begin", error))
    }

    /// The host origin of a conversation: a fork child's, or a session's begun anew.
    async fn host_origin(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<HostOrigin>, EngineError> {
        let text = self
            .inner
            .store
            .state(conversation, HOST_ORIGIN)
            .await
            .map_err(|error| store_error("reading the host origin", error))?;
        Ok(text.and_then(|text| serde_json::from_str(&text).ok()))
    }

    /// Where the conversation's own messages begin among the host's places (its turns'
    /// admission anchors, its record): 0 for every conversation but one with a
    /// [`HostOrigin`] (a fork child, whose host record begins with its parent's history; a
    /// session begun anew, whose record keeps what came before). A host place `p` is the
    /// conversation's own message `p - offset`. Such a conversation's is settled by its first
    /// turn ([`LosslessEngine::settle_host_offset`]); until then, 0.
    pub(crate) async fn host_offset(
        &self,
        conversation: ConversationId,
    ) -> Result<u64, EngineError> {
        self.offset_settled_at(conversation, None).await
    }

    /// A turn the host places at `at`: the first one of a conversation with a host origin
    /// settles its offset (what it has stored so far are its first messages, so the turn's
    /// first message is its next), and every conversation's offset is answered.
    pub(crate) async fn settle_host_offset(
        &self,
        conversation: ConversationId,
        at: u64,
    ) -> Result<u64, EngineError> {
        self.offset_settled_at(conversation, Some(at)).await
    }

    /// The conversation's offset, from memory or its host origin (read once); one not yet
    /// settled is settled by a turn placed at `at`, else answered as 0 and not kept.
    async fn offset_settled_at(
        &self,
        conversation: ConversationId,
        at: Option<u64>,
    ) -> Result<u64, EngineError> {
        if let Some(offset) = self.memory(conversation, |memory| memory.host_offset) {
            return Ok(offset);
        }
        let offset = match (self.host_origin(conversation).await?, at) {
            (None, _) => 0,
            (
                Some(HostOrigin {
                    offset: Some(offset),
                    ..
                }),
                _,
            ) => offset,
            (Some(mut origin), Some(at)) => {
                let held = self
                    .inner
                    .store
                    .conversation_by_id(conversation)
                    .await
                    .map_err(|error| store_error("reading the fork", error))?
                    .map_or(0, |row| row.message_count);
                let offset = at.saturating_sub(held);
                origin.offset = Some(offset);
                self.record_host_origin(conversation, &origin).await?;
                offset
            }
            (Some(_), None) => return Ok(0),
        };
        self.memory(conversation, |memory| memory.host_offset = Some(offset));
        Ok(offset)
    }

    /// How many of the host's leading messages, on a conversation's first sight of them,
    /// are not its own to store: 0 for a conversation without a host origin; for a session
    /// begun anew, those from before it began so. A fork child's transcript is the parent's
    /// history (from the host's last compaction boundary on, so it may be shorter than the
    /// parent's store), then the parent's turn that spawned the child, not yet stored when the
    /// spawn was prepared: the history is what the seed shows, the turn is the child's. They
    /// part after the parent's last messages at the spawn, found as a run (one message can
    /// recur: the host's "missing tool result" stand-in follows every spawn call). A
    /// transcript that does not hold that run (the host's copy differs) parts after its last
    /// message no later than the parent's last at the spawn, else before its last user
    /// message: the spawning turn is the child's either way.
    pub(crate) async fn forked_history(
        &self,
        conversation: ConversationId,
        host: &[AgentMessage],
    ) -> Result<usize, EngineError> {
        let Some(origin) = self.host_origin(conversation).await? else {
            return Ok(0);
        };
        let Some(parent) = origin.parent else {
            // Begun anew: what the host shows from before then (a record written before this
            // was kept shows nothing of its time: all of it came before).
            return Ok(match origin.since_ms {
                Some(since) => host
                    .iter()
                    .position(|message| message.timestamp_ms().is_some_and(|at| at >= since))
                    .unwrap_or(host.len()),
                None => host.len(),
            });
        };
        if origin.parent_messages == 0 {
            return Ok(host.len());
        }
        let first = origin.parent_messages.saturating_sub(FORK_RUN);
        let run = self
            .inner
            .store
            .messages_in_seq_range(ConversationId(parent), first, origin.parent_messages - 1)
            .await
            .map_err(|error| store_error("reading the parent's last messages", error))?
            .iter()
            .map(StoredMessage::message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| store_error("reading the parent's last messages", error))?;
        if let Some(parted) =
            crate::catch_up::past_the_store(host, &run).filter(|_| !run.is_empty())
        {
            return Ok(parted);
        }
        let by_time = origin.parent_last_at_ms.and_then(|last| {
            host.iter()
                .rposition(|message| message.timestamp_ms().is_some_and(|at| at <= last))
                .map(|at| at + 1)
        });
        let parted = by_time.unwrap_or_else(|| {
            host.iter()
                .rposition(|message| matches!(message, AgentMessage::User(_)))
                .unwrap_or(0)
        });
        tracing::warn!(
            conversation = conversation.0,
            parent,
            parent_messages = origin.parent_messages,
            host = host.len(),
            parted,
            by_time = by_time.is_some(),
            "a fork child's transcript does not hold its parent's last messages at the spawn; it is taken as the parent's history up to its {}, and the child's from there",
            if by_time.is_some() {
                "last message no later than the parent's last"
            } else {
                "last user message"
            }
        );
        Ok(parted)
    }
}

/// How many of the parent's last messages at a spawn find where a fork child's transcript
/// leaves the parent's history.
const FORK_RUN: u64 = 4;
