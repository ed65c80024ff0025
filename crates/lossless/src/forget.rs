//! Forgetting on request and retention.
//!
//! Forgetting needs the summarizer: every summary above a forgotten row is rebuilt, lowest
//! depth first, from what remains below it (its surviving messages, its children as just
//! rebuilt), or removed when nothing remains, so no summary keeps forgotten text. Forgetting
//! the messages before a time rebuilds the session's own summaries above them; forgetting a
//! whole session removes its own summaries, and rebuilds those of other sessions above its
//! rows — a fork's, which may fold its parent's rows, and a fork of that fork's above them.
//! The plan is applied in one store transaction; if a compaction changed those summaries
//! meanwhile, it is planned again.
//!
//! Retention applies the lossless entry's `retention` policy to this engine's agent: archive
//! sessions idle past `archiveAfterDays`, delete those idle past `deleteAfterDays`, and keep the
//! store under `maxStoreMb` by archiving or deleting the least recently active first.

use std::collections::HashMap;

use vilvona_core::EngineError;
use vilvona_core::summarize::{SourceItem, SummaryKind, SummaryLevel, SummaryRequest};
use vilvona_store::*;
use vilvona_summarize::truncate;

use crate::config::{OverCap, RetentionPolicy};
use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::render::content_source;
use crate::render::{SummaryHeader, summary_tokens};

/// How often a plan may turn out stale before forgetting gives up.
const PLAN_ATTEMPTS: usize = 5;

const DAY_MS: i64 = 86_400_000;

/// The store-wide state key of the last retention run (per agent).
const RETENTION_LAST_RUN: &str = "retention.lastRunAt";

pub use vilvona_core::admin::{Forgotten, RetentionAction, RetentionKind};

/// The state key of the latest time before which a conversation's messages were forgotten.
const FORGET_HORIZON: &str = "forget.horizonMs";

impl LosslessEngine {
    /// The stored conversation of a session of this agent, without creating one.
    pub(crate) async fn stored_conversation(
        &self,
        session_id: &str,
    ) -> Result<Conversation, EngineError> {
        self.find_stored_conversation(session_id)
            .await?
            .ok_or_else(|| {
                EngineError::failed(format!(
                    "no stored session {session_id:?} for agent {:?}",
                    self.config().agent_id
                ))
            })
    }

    /// The stored conversation of a session of this agent, if there is one (none is created).
    pub(crate) async fn find_stored_conversation(
        &self,
        session_id: &str,
    ) -> Result<Option<Conversation>, EngineError> {
        Ok(self
            .agent_conversations()
            .await?
            .into_iter()
            .find(|conversation| conversation.session_id == session_id))
    }

    /// Every conversation this engine's agent has stored.
    pub(crate) async fn agent_conversations(&self) -> Result<Vec<Conversation>, EngineError> {
        self.store()
            .conversations(Some(&self.config().agent_id))
            .await
            .map_err(|error| store_error("listing conversations", error))
    }

    /// Forgets a session and everything derived from it, then gives the space back.
    pub async fn forget_session(&self, session_id: &str) -> Result<Forgotten, EngineError> {
        let conversation = self.stored_conversation(session_id).await?;
        let report = self.forget_conversation(&conversation).await?;
        Ok(Forgotten {
            report,
            space: self.reclaim().await?,
        })
    }

    /// Forgets a conversation and everything derived from it (the summaries of other sessions
    /// above its rows rebuilt from what remains); the space is given back later.
    pub(crate) async fn forget_conversation(
        &self,
        conversation: &Conversation,
    ) -> Result<ForgetReport, EngineError> {
        self.forget_planned(conversation, ForgetScope::Conversation)
            .await
    }

    /// Forgets a session's messages created before `before_ms`: the summaries above them are
    /// rebuilt from what remains, or removed. Then gives the space back.
    pub async fn forget_before(
        &self,
        session_id: &str,
        before_ms: i64,
    ) -> Result<Forgotten, EngineError> {
        let conversation = self.stored_conversation(session_id).await?;
        let report = self
            .forget_planned(&conversation, ForgetScope::Before(before_ms))
            .await?;
        // The host's history still holds what went: catch-up must never take it in again.
        let horizon = self.forget_horizon(conversation.id).await?;
        if horizon.is_none_or(|horizon| horizon < before_ms) {
            self.store()
                .set_state(conversation.id, FORGET_HORIZON, &before_ms.to_string())
                .await
                .map_err(|error| store_error("keeping the forgetting's horizon", error))?;
        }
        Ok(Forgotten {
            report,
            space: self.reclaim().await?,
        })
    }

    /// The latest time before which this conversation's messages were forgotten, if any.
    pub(crate) async fn forget_horizon(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<i64>, EngineError> {
        Ok(self
            .store()
            .state(conversation, FORGET_HORIZON)
            .await
            .map_err(|error| store_error("reading the forgetting's horizon", error))?
            .and_then(|text| text.parse().ok()))
    }

    /// Plans and applies a forgetting, planning again while compactions change the summaries
    /// it touches (this conversation's wait; a fork's may not).
    async fn forget_planned(
        &self,
        conversation: &Conversation,
        scope: ForgetScope,
    ) -> Result<ForgetReport, EngineError> {
        // Compaction of this conversation waits: the plan is made against a still DAG.
        let lock = self.compaction_lock(conversation.id);
        let _held = lock.lock().await;
        for _ in 0..PLAN_ATTEMPTS {
            let plan = self.plan_forget(conversation.id, scope).await?;
            let applied = self
                .store()
                .forget(plan)
                .await
                .map_err(|error| store_error("forgetting", error))?;
            if let Some(report) = applied {
                self.forget_cached(conversation.id, &conversation.session_id);
                return Ok(report);
            }
            tracing::debug!(
                session_id = %conversation.session_id,
                "the summaries changed while forgetting; planning again"
            );
        }
        Err(EngineError::failed(format!(
            "session {:?} kept changing while it was forgotten; try again",
            conversation.session_id
        )))
    }

    /// The summaries to rebuild or remove: above the messages before a time, this
    /// conversation's; for a whole conversation, the other conversations' above its rows (its
    /// own all go).
    async fn plan_forget(
        &self,
        conversation: ConversationId,
        scope: ForgetScope,
    ) -> Result<ForgetPlan, EngineError> {
        let store = self.store();
        let before_ms = match scope {
            ForgetScope::Before(ms) => Some(ms),
            ForgetScope::Conversation => None,
        };
        let mut above = store
            .summaries_above(conversation, before_ms)
            .await
            .map_err(|error| store_error("reading the summaries to rebuild", error))?;
        if scope == ForgetScope::Conversation {
            above.retain(|summary| summary.conversation != conversation);
        }
        // A message or a summary that goes with the forgotten rows.
        let gone = |child: &ItemContent| match (child, scope) {
            (ItemContent::Message(message), ForgetScope::Before(before)) => {
                message.conversation == conversation && message.created_at_ms < before
            }
            (ItemContent::Message(message), ForgetScope::Conversation) => {
                message.conversation == conversation
            }
            (ItemContent::Summary(summary), ForgetScope::Conversation) => {
                summary.conversation == conversation
            }
            (ItemContent::Summary(_), ForgetScope::Before(_)) => false,
        };
        let affected: std::collections::HashSet<SummaryRowId> =
            above.iter().map(|summary| summary.row_id).collect();
        let mut removed = Vec::new();
        let mut rewritten: Vec<SummaryRewrite> = Vec::new();
        // New text of the summaries rebuilt so far (lower depths come first).
        let mut rebuilt: HashMap<SummaryRowId, String> = HashMap::new();
        for summary in &above {
            let children = store
                .children(summary.row_id)
                .await
                .map_err(|error| store_error("reading a summary's children", error))?;
            let mut source: Vec<SourceItem> = Vec::new();
            for child in &children {
                match child {
                    child if gone(child) => {}
                    ItemContent::Summary(child) if affected.contains(&child.row_id) => {
                        if let Some(text) = rebuilt.get(&child.row_id) {
                            let mut item = content_source(&ItemContent::Summary(child.clone()));
                            item.text = text.clone();
                            source.push(item);
                        }
                    }
                    other => source.push(content_source(other)),
                }
            }
            if source.is_empty() {
                removed.push(summary.row_id);
                continue;
            }
            let content = self.resummarize(summary, source).await?;
            let tokens = summary_tokens(
                &*self.inner.estimator,
                &SummaryHeader::from(summary),
                &content,
            );
            rebuilt.insert(summary.row_id, content.clone());
            rewritten.push(SummaryRewrite {
                row_id: summary.row_id,
                content,
                tokens,
                summarizer: self.inner.summarizer.id().to_owned(),
            });
        }
        Ok(ForgetPlan {
            conversation,
            scope,
            removed,
            rewritten,
        })
    }

    /// A summary's text rebuilt from `source` at its kind's target; the truncation fallback
    /// when the summarizer cannot.
    async fn resummarize(
        &self,
        summary: &StoredSummary,
        source: Vec<SourceItem>,
    ) -> Result<String, EngineError> {
        let config = self.config();
        let target = match summary.kind {
            SummaryKind::Leaf => config.leaf_target_tokens,
            SummaryKind::Condensed => config.condensed_target_tokens,
        };
        let mut request = SummaryRequest::new(summary.kind, summary.depth, target, source);
        match self.inner.summarizer.summarize(&request).await {
            Ok(produced) if !produced.text.trim().is_empty() => Ok(produced.text),
            Ok(_) | Err(_) => {
                request.level = SummaryLevel::Fallback;
                request.target_tokens = target.min(config.fallback_max_tokens);
                Ok(truncate(&request, &*self.inner.estimator).text)
            }
        }
    }

    async fn reclaim(&self) -> Result<ReclaimReport, EngineError> {
        self.store()
            .reclaim_space()
            .await
            .map_err(|error| store_error("reclaiming space", error))
    }

    /// What the policy would do now: deletions by age, archives by age, then the size cap,
    /// least recently active first. Pure planning: nothing changes.
    pub async fn retention_plan(
        &self,
        policy: &RetentionPolicy,
        now_ms: i64,
    ) -> Result<Vec<RetentionAction>, EngineError> {
        let store = self.store();
        let mut conversations = self.agent_conversations().await?;
        let activity = |c: &Conversation| c.last_activity_ms.unwrap_or(c.created_at_ms);
        conversations.sort_by_key(|c| (activity(c), c.id));
        let idle_days = |c: &Conversation| (now_ms - activity(c)).max(0) / DAY_MS;
        let mut actions: Vec<RetentionAction> = Vec::new();
        let mut deleted: std::collections::HashSet<ConversationId> = Default::default();
        for conversation in &conversations {
            let idle = idle_days(conversation) as u64;
            if let Some(days) = policy.delete_after_days
                && idle > days
            {
                deleted.insert(conversation.id);
                actions.push(RetentionAction {
                    session_id: conversation.session_id.clone(),
                    action: RetentionKind::Delete,
                    reason: format!("no message for {idle} days (deleteAfterDays {days})"),
                });
            } else if let Some(days) = policy.archive_after_days
                && idle > days
                && conversation.archived_at_ms.is_none()
            {
                actions.push(RetentionAction {
                    session_id: conversation.session_id.clone(),
                    action: RetentionKind::Archive,
                    reason: format!("no message for {idle} days (archiveAfterDays {days})"),
                });
            }
        }
        if let Some(cap_mb) = policy.max_store_mb {
            let cap = (cap_mb * 1e6) as u64;
            let disk = store.disk_bytes();
            // Each conversation's share of the disk: the store's size in proportion to the
            // bytes of its rows (the index and free pages follow the rows).
            let mut bytes = Vec::with_capacity(conversations.len());
            for conversation in &conversations {
                bytes.push(
                    store
                        .conversation_bytes(conversation.id)
                        .await
                        .map_err(|error| store_error("measuring a conversation", error))?,
                );
            }
            let total: u64 = bytes.iter().sum::<u64>().max(1);
            let share = |rows: u64| (disk as f64 * rows as f64 / total as f64) as u64;
            let mut size = disk;
            for (conversation, rows) in conversations.iter().zip(&bytes) {
                if deleted.contains(&conversation.id) {
                    size = size.saturating_sub(share(*rows));
                }
            }
            for (conversation, rows) in conversations.iter().zip(&bytes) {
                if size <= cap {
                    break;
                }
                if deleted.contains(&conversation.id) {
                    continue;
                }
                let action = match policy.over_cap {
                    OverCap::Delete => RetentionKind::Delete,
                    OverCap::Archive if conversation.archived_at_ms.is_none() => {
                        RetentionKind::Archive
                    }
                    // Archived already and still over: delete.
                    OverCap::Archive => RetentionKind::Delete,
                };
                let reason = format!(
                    "the store is about {:.2} MB, over maxStoreMb {cap_mb}",
                    size as f64 / 1e6
                );
                actions.retain(|a| a.session_id != conversation.session_id);
                actions.push(RetentionAction {
                    session_id: conversation.session_id.clone(),
                    action,
                    reason,
                });
                // A delete frees the rows' share; an archive, the index's part of it.
                size = size.saturating_sub(match action {
                    RetentionKind::Delete => share(*rows),
                    RetentionKind::Archive => share(*rows) / 3,
                });
                if action == RetentionKind::Delete {
                    deleted.insert(conversation.id);
                }
            }
        }
        Ok(actions)
    }

    /// Applies retention actions (as [`Self::retention_plan`] listed them), then gives the
    /// space back once.
    pub async fn apply_retention(
        &self,
        actions: &[RetentionAction],
    ) -> Result<ReclaimReport, EngineError> {
        // One listing for all the actions (not one per action).
        let ids: HashMap<String, ConversationId> = self
            .agent_conversations()
            .await?
            .into_iter()
            .map(|conversation| (conversation.session_id, conversation.id))
            .collect();
        for action in actions {
            let Some(&conversation) = ids.get(&action.session_id) else {
                // Gone since the plan was made (another process applied it).
                continue;
            };
            match action.action {
                RetentionKind::Delete => {
                    let Some(row) = self
                        .store()
                        .conversation_by_id(conversation)
                        .await
                        .map_err(|error| store_error("applying retention", error))?
                    else {
                        continue;
                    };
                    self.forget_conversation(&row).await?;
                }
                RetentionKind::Archive => {
                    self.store()
                        .set_archived(conversation, true)
                        .await
                        .map_err(|error| store_error("applying retention", error))?;
                }
            }
            self.forget_cached(conversation, &action.session_id);
        }
        self.reclaim().await
    }

    /// Retention from `maintain`: at most once a day (across processes: the last run is kept
    /// in the store), in the background, off the turn's path. Returns whether a run started.
    pub(crate) async fn maybe_run_retention(&self, policy: &RetentionPolicy) -> bool {
        if policy == &RetentionPolicy::default() || self.store().is_read_only() {
            return false;
        }
        let store = self.store();
        let key = format!("{RETENTION_LAST_RUN}.{}", self.config().agent_id);
        let now = self.now_ms();
        let last: i64 = store
            .store_state(&key)
            .await
            .ok()
            .flatten()
            .and_then(|value| value.parse().ok())
            .unwrap_or(0);
        if now - last < DAY_MS {
            return false;
        }
        if store.set_store_state(&key, &now.to_string()).await.is_err() {
            return false;
        }
        let engine = self.clone();
        let policy = policy.clone();
        let task = tokio::spawn(async move {
            let result = async {
                let plan = engine.retention_plan(&policy, now).await?;
                if plan.is_empty() {
                    return Ok(0);
                }
                engine.apply_retention(&plan).await.map(|_| plan.len())
            }
            .await;
            match result {
                Ok(0) => {}
                Ok(count) => {
                    tracing::info!(actions = count, "retention archived or deleted sessions")
                }
                Err(error) => tracing::warn!(%error, "retention failed; it runs again tomorrow"),
            }
        });
        self.keep_background(task);
        true
    }

    /// The last time retention ran for this agent from `maintain`, if it ever did.
    pub async fn retention_last_run(&self) -> Option<i64> {
        let key = format!("{RETENTION_LAST_RUN}.{}", self.config().agent_id);
        self.store()
            .store_state(&key)
            .await
            .ok()
            .flatten()
            .and_then(|value| value.parse().ok())
    }
}
