//! Assembly: the context as the model sees it, rendered once per item and extended when the
//! context only grew.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;

use crate::render::{
    DESCRIBE_TOOL, EXPAND_TOOL, GREP_TOOL, RECALL_GUIDANCE, summary_depth, summary_message,
};

use crate::budget::HostPrompt;
use crate::cache::{Rendition, lock_map};
use crate::catch_up::same_message;
use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::memory::RecallBlock;
use crate::units::unit_end;

impl LosslessEngine {
    /// Keeps rendered items, with a message's seq and their tokens, for later assemblies and
    /// compactions.
    pub(crate) fn remember_rendered(
        &self,
        items: impl IntoIterator<Item = (Rendition, Arc<AgentMessage>, Option<u64>, u64)>,
    ) {
        let mut rendered = lock_map(&self.inner.rendered);
        for (rendition, message, seq, tokens) in items {
            rendered.keep(rendition, message, seq, tokens);
        }
    }

    /// The context as the model sees it, within `budget` when the fresh tail fits. Reads the
    /// item references (no message bodies), renders only items not rendered before, and when
    /// the context only grew since the last assembly, appends to the previous list instead of
    /// rebuilding it.
    pub async fn assemble_context(
        &self,
        conversation: ConversationId,
        budget: u64,
    ) -> Result<AssembleResult, EngineError> {
        Ok(self.assemble_holding(conversation, budget).await?.0)
    }

    /// [`LosslessEngine::assemble_context`], and the messages the context shows whole.
    async fn assemble_holding(
        &self,
        conversation: ConversationId,
        budget: u64,
    ) -> Result<(AssembleResult, HashSet<MessageId>), EngineError> {
        let refs = self
            .inner
            .store
            .context_refs(conversation)
            .await
            .map_err(|error| store_error("reading the context", error))?;
        let total: u64 = refs.iter().map(|item| item.tokens).sum();
        let mut start = 0;
        let mut authority = PromptAuthority::Assembled;
        if total > budget {
            // Clamp: drop the oldest units until the rest fits (never splitting a unit).
            let mut remaining = total;
            while start < refs.len() && remaining > budget {
                let end = unit_end(&refs, start);
                remaining -= refs[start..end].iter().map(|item| item.tokens).sum::<u64>();
                start = end;
            }
            authority = PromptAuthority::PreassemblyMayOverflow;
        }
        let shown = &refs[start..];
        let visible: Vec<Rendition> = shown.iter().map(Rendition::of).collect();
        let estimated_tokens = shown.iter().map(|entry| entry.tokens).sum();
        // The previous assembly of this conversation, if the new one extends it.
        let previous = lock_map(&self.inner.assembled).take(conversation);
        let (reused, mut messages) = match previous {
            Some((items, messages)) if visible.starts_with(&items) => (items.len(), messages),
            _ => (0, Messages::new()),
        };
        // What is rendered already, taken at once: another call may empty the cache meanwhile.
        let mut rendered: Vec<Option<Arc<AgentMessage>>> = {
            let mut cache = lock_map(&self.inner.rendered);
            visible[reused..]
                .iter()
                .map(|item| cache.get(item))
                .collect()
        };
        let (missing, missing_tokens): (Vec<Rendition>, Vec<u64>) = visible[reused..]
            .iter()
            .zip(&shown[reused..])
            .zip(&rendered)
            .filter(|(_, known)| known.is_none())
            .map(|((rendition, entry), _)| (*rendition, entry.tokens))
            .unzip();
        if !missing.is_empty() {
            let contents = self
                .inner
                .store
                .items(missing.iter().map(|rendition| rendition.item).collect())
                .await
                .map_err(|error| store_error("reading context items", error))?;
            let mut fresh = Vec::with_capacity(missing.len());
            for ((item, content), tokens) in missing.into_iter().zip(contents).zip(missing_tokens) {
                let (message, seq) = match &content {
                    ItemContent::Summary(summary) => (summary_message(summary), None),
                    ItemContent::Message(message) => (
                        message
                            .message()
                            .map_err(|error| store_error("reading a message", error))?,
                        Some(message.seq),
                    ),
                };
                fresh.push((item, Arc::new(message), seq, tokens));
            }
            let mut unknown = rendered.iter_mut().filter(|known| known.is_none());
            for (_, message, _, _) in &fresh {
                if let Some(slot) = unknown.next() {
                    *slot = Some(Arc::clone(message));
                }
            }
            self.remember_rendered(fresh);
        }
        let list = messages.make_mut();
        for message in rendered {
            let message = message
                .ok_or_else(|| EngineError::failed("lossless assemble: a context item vanished"))?;
            list.push(message.as_ref().clone());
        }
        // What it holds by kind, for the turn's record (see `crate::turns`).
        let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
        for (entry, message) in shown.iter().zip(messages.iter()) {
            let kind = match entry.summary {
                Some(shape) => format!("summary, depth {}", shape.depth),
                None => format!("message, {}", message.role()),
            };
            *by_kind.entry(kind).or_default() += entry.tokens;
        }
        self.note_assembled(conversation, by_kind);
        // Summaries are few: a walk over the item references finds them.
        let summaries = visible
            .iter()
            .enumerate()
            .filter(|(_, rendition)| matches!(rendition.item, ItemRef::Summary(_)))
            .filter_map(|(index, _)| {
                let depth = summary_depth(&messages[index])?;
                Some(AssembledSummary { index, depth })
            })
            .collect();
        let held = visible
            .iter()
            .filter_map(|rendition| match rendition.item {
                ItemRef::Message(id) => Some(id),
                ItemRef::Summary(_) => None,
            })
            .collect();
        lock_map(&self.inner.assembled).keep(
            conversation,
            visible,
            messages.clone(),
            estimated_tokens,
        );
        let result = AssembleResult {
            messages,
            estimated_tokens,
            system_prompt_addition: None,
            prompt_authority: authority,
            context_projection: None,
            summaries,
            holds_history: false,
        };
        Ok((result, held))
    }

    /// Stores again, each at its place, the messages a store lost after its last one, from a
    /// second record of the session: `record` holds the record's messages from the place of
    /// the store's last message on (from the first place when the store holds none). Only
    /// where the store's last message is the record's first (role and text): a record that
    /// does not meet the store there (sanitized, cut, another session) never rewrites it.
    /// `None` when they do not meet, else how many messages were stored.
    pub(crate) async fn store_lost_tail(
        &self,
        row: &Conversation,
        record: &[AgentMessage],
        source: &str,
    ) -> Result<Option<usize>, EngineError> {
        let held = row.message_count;
        let tail = match (held, record.split_first()) {
            (0, _) => record,
            (_, None) => return Ok(None),
            (_, Some((first, tail))) => {
                let last = self
                    .inner
                    .store
                    .messages_in_seq_range(row.id, held - 1, held - 1)
                    .await
                    .map_err(|error| store_error("reading the last stored message", error))?;
                let meets = match last.first().map(StoredMessage::message) {
                    Some(Ok(stored)) => same_message(&stored, first),
                    _ => false,
                };
                if !meets {
                    return Ok(None);
                }
                tail
            }
        };
        if tail.is_empty() {
            return Ok(Some(0));
        }
        tracing::warn!(
            conversation = row.id.0,
            missing = tail.len(),
            source,
            "the store is behind a second record of the session (lost with a crash, a cut log or a restored copy); storing the missing messages again from it"
        );
        self.ingest_messages(
            &row.session_id,
            row.session_key.as_deref(),
            tail,
            |index| MessageIdentity::default().at(held + index as u64),
            None,
        )
        .await?;
        self.forget_conversation_row(&row.session_id);
        Ok(Some(tail.len()))
    }

    /// The turn's recall block: the one made for this prompt already (every request of one
    /// turn carries the same), else a new one.
    async fn turn_recall(
        &self,
        conversation: ConversationId,
        params: &AssembleParams,
        prompt: &str,
        held: &HashSet<MessageId>,
        room: u64,
    ) -> Result<Option<RecallBlock>, EngineError> {
        let key = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::hash::DefaultHasher::new();
            prompt.hash(&mut hasher);
            hasher.finish()
        };
        if let Some((made_for, block)) = self.memory(conversation, |memory| memory.recall.clone())
            && made_for == key
        {
            return Ok(block);
        }
        let caller = vilvona_core::admin::ToolCaller {
            session_id: params.session_id.clone(),
            session_key: params.session_key.clone(),
        };
        let block = self.recall_for_turn(&caller, prompt, held, room).await?;
        self.memory(conversation, |memory| {
            memory.recall = Some((key, block.clone()));
        });
        Ok(block)
    }

    pub(crate) async fn assemble_for(
        &self,
        params: &AssembleParams,
    ) -> Result<AssembleResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let read_only = self.inner.store.is_read_only();
        if params.messages.is_empty() {
            // The host left its history out, trusting the store to hold the session. The cached
            // row's count is from when the session was first seen: read the current one.
            if params.history_elided && conversation.message_count == 0 {
                let stored = self
                    .inner
                    .store
                    .conversation_by_id(conversation.id)
                    .await
                    .map_err(|error| store_error("conversation", error))?
                    .map_or(0, |row| row.message_count);
                if stored == 0 {
                    // Nothing stored (a session forgotten since): the host's history must come.
                    return Err(EngineError::HistoryNeeded);
                }
                self.forget_conversation_row(&params.session_id);
            }
        } else {
            // Installed mid-session, a turn the host never committed, a tail the store lost:
            // what the host's history holds past the store is taken in (`crate::catch_up`).
            self.catch_up(conversation.id, params).await?;
        }
        // The whole prompt is the budget: the call's budget, and what the host's own prompt
        // was seen to take from its window.
        let carried = params.budget();
        let mut prompt = self.host_prompt(conversation.id).await?;
        if !read_only {
            if let Some(budget) = carried {
                self.note_turn_budget(conversation.id, budget);
            }
            let before = prompt;
            prompt.note_window(params.runtime_settings.as_ref(), params.token_budget);
            if prompt != before {
                self.keep_host_prompt(conversation.id, prompt).await?;
            }
        }
        let limits = HostPrompt {
            budget: carried.or(prompt.budget),
            ..prompt
        }
        .limits(&self.inner.config);
        let (mut result, held) = self
            .assemble_holding(conversation.id, limits.ceiling)
            .await?;
        // What the history holds about the turn, after the context (`crate::recall`).
        if let Some(prompt) = params.prompt.as_deref().filter(|p| !p.trim().is_empty()) {
            let room = limits.ceiling.saturating_sub(result.estimated_tokens);
            if let Some(block) = self
                .turn_recall(conversation.id, params, prompt, &held, room)
                .await?
            {
                result.messages.make_mut().push(block.message);
                result.estimated_tokens += block.tokens;
            }
        }
        // What the store assembled from, it holds: the host need not send its history again,
        // unless the host's commits are missing (`crate::catch_up`).
        result.holds_history = !result.messages.is_empty()
            && (read_only || !self.needs_host_history(conversation.id).await?);
        let offers_recall = [GREP_TOOL, DESCRIBE_TOOL, EXPAND_TOOL]
            .iter()
            .any(|tool| params.available_tools.contains(*tool));
        let mut addition: Vec<&str> = Vec::new();
        if offers_recall {
            addition.push(RECALL_GUIDANCE);
        }
        if let Some(memory) = params
            .memory_prompt
            .as_deref()
            .filter(|m| !m.trim().is_empty())
        {
            addition.push(memory);
        }
        if !addition.is_empty() {
            result.system_prompt_addition = Some(addition.join("\n\n"));
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{RENDERED_BYTES, RenderedItems};
    use vilvona_core::summarize::SummaryLevel;

    #[test]
    fn rendered_items_stay_within_their_bytes_and_keep_what_is_used() {
        let mut rendered = RenderedItems::default();
        let message = Arc::new(AgentMessage::user_text("x"));
        // 1,000 tokens an item: about 4 KB each, so 16 MiB holds about 4,000 (at least half
        // of that in the young generation).
        let tokens = 1_000;
        rendered.keep(
            Rendition::message(MessageId(0)),
            Arc::clone(&message),
            Some(0),
            tokens,
        );
        for id in 1..100_000 {
            rendered.keep(
                Rendition::message(MessageId(id)),
                Arc::clone(&message),
                Some(id as u64),
                tokens,
            );
            // The first item is used all along: it is never let go.
            assert!(rendered.get(&Rendition::message(MessageId(0))).is_some());
            let (_, bytes) = rendered.size();
            assert!(bytes <= RENDERED_BYTES, "{bytes} at {id}");
        }
        let (items, _) = rendered.size();
        assert!(items > 1_900, "{items}");
        assert!(rendered.get(&Rendition::message(MessageId(10))).is_none());
        rendered.forget([ItemRef::Message(MessageId(99_999))]);
        assert!(
            rendered
                .get(&Rendition::message(MessageId(99_999)))
                .is_none()
        );
        assert_eq!(rendered.size().0, items - 1);
    }

    #[test]
    fn a_summary_rewritten_in_place_is_not_its_old_rendering() {
        let mut rendered = RenderedItems::default();
        let entry = |tokens, level| ContextRef {
            position: 0,
            item: ItemRef::Summary(SummaryRowId(3)),
            tokens,
            continues_unit: false,
            summary: Some(SummaryShape {
                depth: 0,
                level,
                first_seq: 0,
                last_seq: 9,
            }),
        };
        let fallback = Rendition::of(&entry(120, SummaryLevel::Fallback));
        rendered.keep(
            fallback,
            Arc::new(AgentMessage::user_text("truncated")),
            None,
            120,
        );
        assert!(rendered.get(&fallback).is_some());
        let rewritten = Rendition::of(&entry(40, SummaryLevel::Normal));
        assert!(rendered.get(&rewritten).is_none());
    }
}
