//! The engine's administration ([`EngineAdmin`]): checking, measuring, rebuilding and
//! forgetting the stored history, for hosts that only know the contract.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use vilvona_core::EngineError;
use vilvona_core::admin::{
    CatchUpReport, DagView, EngineAdmin, Forgotten, ItemGroup, Resummarized, RetentionRun,
    SessionStats, StorageCheck, StorageUsage, StoredSession, ToolCaller, TurnRecord, WindowPlan,
};
use vilvona_core::archive::{ImportReport, SessionArchive};
use vilvona_store::{ConversationId, ItemContent, ItemRef, MessageId, StoreError};

use crate::engine::LosslessEngine;
use crate::errors::store_error;

#[async_trait]
impl EngineAdmin for LosslessEngine {
    async fn check(&self) -> Result<StorageCheck, EngineError> {
        let report = self
            .store()
            .integrity_check()
            .await
            .map_err(|error| store_error("checking the store", error))?;
        let stand_ins = match report.stand_in_summaries {
            0 => String::new(),
            count => format!(
                " ({count} written by a fallback in place of the configured summarizer: it could not be reached)"
            ),
        };
        Ok(StorageCheck {
            summary: format!(
                "{} messages, {} summaries{stand_ins}, {} context items, {}",
                report.messages, report.summaries, report.context_items, report.recall
            ),
            summaries: report.summaries,
            problems: report.problems,
            index_needs_rebuild: report.index_needs_rebuild,
            notices: self.catch_up_notice().await?.into_iter().collect(),
        })
    }

    async fn rebuild_index(&self) -> Result<u64, EngineError> {
        self.store()
            .rebuild_index()
            .await
            .map_err(|error| store_error("rebuilding the index", error))
    }

    async fn usage(&self) -> Result<StorageUsage, EngineError> {
        Ok(StorageUsage {
            database_bytes: self.store().disk_bytes(),
            index_docs: self
                .store()
                .index_doc_count()
                .await
                .map_err(|error| store_error("counting index documents", error))?,
        })
    }

    async fn stored_sessions(&self) -> Result<Vec<StoredSession>, EngineError> {
        Ok(self
            .agent_conversations()
            .await?
            .into_iter()
            .map(|conversation| StoredSession {
                session_id: conversation.session_id,
                session_key: conversation.session_key,
            })
            .collect())
    }

    async fn session_stats(&self, session: &ToolCaller) -> Result<SessionStats, EngineError> {
        let conversation = self
            .conversation(&session.session_id, session.session_key.as_deref())
            .await?;
        let store = self.store();
        let row = store
            .conversation_by_id(conversation.id)
            .await
            .map_err(|error| store_error("reading a conversation", error))?
            .ok_or_else(|| {
                EngineError::failed(format!(
                    "the conversation of session {:?} disappeared",
                    session.session_id
                ))
            })?;
        let items = store
            .context(conversation.id)
            .await
            .map_err(|error| store_error("reading a context", error))?;
        let mut summaries_by_depth: BTreeMap<String, u64> = BTreeMap::new();
        let mut context_by_kind: BTreeMap<String, ItemGroup> = BTreeMap::new();
        let mut summaries_by_summarizer: BTreeMap<String, u64> = BTreeMap::new();
        for item in &items {
            let kind = match &item.content {
                ItemContent::Summary(summary) => {
                    *summaries_by_depth
                        .entry(summary.depth.to_string())
                        .or_default() += 1;
                    *summaries_by_summarizer
                        .entry(summary.summarizer.clone())
                        .or_default() += 1;
                    format!("summary, depth {}", summary.depth)
                }
                ItemContent::Message(message) => format!("message, {}", message.role),
            };
            let group = context_by_kind.entry(kind).or_default();
            group.items += 1;
            group.tokens += item.tokens;
        }
        let host = self.stored_host_prompt(conversation.id).await?;
        let limits = host.limits(self.config());
        let plan = WindowPlan {
            window: host.window,
            host_prompt: host.overhead,
            host_prompt_observed: host.overhead_observed,
            reserve: host.reserve,
            budget: host.budget,
            trigger: limits.trigger,
            goal: limits.goal,
            ceiling: limits.ceiling,
        };
        let caught = self.catch_up_state(conversation.id).await?;
        Ok(SessionStats {
            plan: Some(plan),
            catch_up: (caught.turns > 0).then_some(CatchUpReport {
                turns: caught.turns,
                messages: caught.messages,
                commits_missing: caught.missing,
            }),
            session: session.session_id.clone(),
            messages: row.stored_messages,
            summaries_by_depth,
            summaries_by_summarizer,
            context_items: items.len() as u64,
            context_tokens: row.context_tokens,
            context_by_kind,
        })
    }

    async fn turn_history(&self, session: &ToolCaller) -> Result<Vec<TurnRecord>, EngineError> {
        let conversation = self
            .conversation(&session.session_id, session.session_key.as_deref())
            .await?;
        self.turn_records(conversation.id).await
    }

    async fn dag(&self, session: &ToolCaller) -> Result<DagView, EngineError> {
        let conversation = self
            .conversation(&session.session_id, session.session_key.as_deref())
            .await?;
        self.store()
            .dag_view(conversation.id)
            .await
            .map_err(|error| store_error("reading the summary DAG", error))
    }

    async fn resummarize(
        &self,
        session: &ToolCaller,
        apply: bool,
    ) -> Result<Resummarized, EngineError> {
        let conversation = self
            .conversation(&session.session_id, session.session_key.as_deref())
            .await?;
        // The context's (what the panel flags), those whose rewrite did not fit before among
        // them; maintenance rewrites the folded ones in time.
        let context: Vec<ItemRef> = self
            .store()
            .context_refs(conversation.id)
            .await
            .map_err(|error| store_error("reading the context", error))?
            .iter()
            .map(|item| item.item)
            .collect();
        let in_context: HashSet<&ItemRef> = context.iter().collect();
        let flagged = self
            .store()
            .stand_in_summaries(conversation.id)
            .await
            .map_err(|error| store_error("reading the summaries a stand-in wrote", error))?
            .iter()
            .filter(|summary| in_context.contains(&ItemRef::Summary(summary.row_id)))
            .count() as u64;
        let rewritten = match apply && flagged > 0 {
            true => {
                self.rewrite_stand_ins_among(conversation.id, &context, usize::MAX)
                    .await?
            }
            false => 0,
        };
        // What this run found and did not rewrite (the summarizer failed, or wrote nothing
        // smaller than the truncation).
        Ok(Resummarized {
            summarizer: self.inner.summarizer.id().to_owned(),
            flagged,
            rewritten,
            remaining: flagged.saturating_sub(rewritten),
        })
    }

    async fn forget(
        &self,
        session_id: &str,
        before_ms: Option<i64>,
    ) -> Result<Forgotten, EngineError> {
        match before_ms {
            Some(before_ms) => self.forget_before(session_id, before_ms).await,
            None => self.forget_session(session_id).await,
        }
    }

    async fn export_session(&self, session_id: &str) -> Result<SessionArchive, EngineError> {
        let conversation = self.stored_conversation(session_id).await?;
        self.store()
            .export(conversation.id)
            .await
            .map_err(|error| store_error("exporting a session", error))
    }

    async fn import_session(&self, archive: SessionArchive) -> Result<ImportReport, EngineError> {
        // The messages' ids in the store the archive came from, by place.
        let origins: Vec<(u64, i64)> = archive
            .messages
            .iter()
            .filter_map(|message| Some((message.seq, message.origin_id?)))
            .collect();
        match self.store().import(archive).await {
            Ok((conversation, report)) => {
                self.keep_origin_ids(conversation, &origins).await?;
                Ok(report)
            }
            // The archive's fault, not the store's: said as it is, never quarantining.
            Err(StoreError::ImportRefused(reason)) => Err(EngineError::refused(format!(
                "the archive cannot be imported: {reason}"
            ))),
            Err(error) => Err(store_error("importing a session", error)),
        }
    }

    async fn retention(&self, apply: bool) -> Result<RetentionRun, EngineError> {
        let policy = &self.config().retention;
        let actions = self.retention_plan(policy, self.now_ms()).await?;
        let space = if apply && !actions.is_empty() {
            Some(self.apply_retention(&actions).await?)
        } else {
            None
        };
        Ok(RetentionRun {
            policy: serde_json::to_value(policy)
                .map_err(|error| EngineError::caused_by("describing the policy", error))?,
            actions,
            space,
        })
    }
}

/// The state key under which an imported conversation keeps its messages' former ids:
/// `[[former, new, count], …]`, runs of consecutive ids.
pub(crate) const ORIGIN_IDS: &str = "import.originIds";

impl LosslessEngine {
    /// Keeps, for an imported conversation, which id each message had in the store it came
    /// from (as runs), so that `msg_<former>` still resolves.
    async fn keep_origin_ids(
        &self,
        conversation: ConversationId,
        origins: &[(u64, i64)],
    ) -> Result<(), EngineError> {
        if origins.is_empty() {
            return Ok(());
        }
        let stored = self
            .store()
            .export(conversation)
            .await
            .map_err(|error| store_error("reading an imported session", error))?;
        let new_of: std::collections::HashMap<u64, i64> = stored
            .messages
            .iter()
            .filter_map(|message| Some((message.seq, message.origin_id?)))
            .collect();
        let mut runs: Vec<[i64; 3]> = Vec::new();
        for (seq, former) in origins {
            let Some(&new) = new_of.get(seq) else {
                continue;
            };
            match runs.last_mut() {
                Some([from, to, count]) if *from + *count == *former && *to + *count == new => {
                    *count += 1;
                }
                _ => runs.push([*former, new, 1]),
            }
        }
        let text = serde_json::to_string(&runs)
            .map_err(|error| EngineError::caused_by("lossless: writing former ids", error))?;
        self.store()
            .set_state(conversation, ORIGIN_IDS, &text)
            .await
            .map_err(|error| store_error("keeping former ids", error))
    }

    /// The id a message has now, when `former` was its id in the store a conversation in
    /// `conversations` was imported from.
    pub(crate) async fn imported_message_id(
        &self,
        conversations: &[ConversationId],
        former: i64,
    ) -> Result<Option<MessageId>, EngineError> {
        for conversation in conversations {
            let Some(text) = self
                .store()
                .state(*conversation, ORIGIN_IDS)
                .await
                .map_err(|error| store_error("reading former ids", error))?
            else {
                continue;
            };
            let runs: Vec<[i64; 3]> = serde_json::from_str(&text).unwrap_or_default();
            if let Some([from, to, _]) = runs
                .iter()
                .find(|[from, _, count]| (*from..*from + *count).contains(&former))
            {
                return Ok(Some(MessageId(to + (former - from))));
            }
        }
        Ok(None)
    }

    /// This engine as the contract's administration.
    pub(crate) fn as_admin(&self) -> Arc<dyn EngineAdmin> {
        Arc::new(self.clone())
    }
}
