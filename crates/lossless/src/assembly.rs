//! Assembly: the context as the model sees it, rendered once per item and extended when the
//! context only grew.

use std::collections::HashMap;
use std::sync::Arc;

use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;

use crate::render::{
    DESCRIBE_TOOL, EXPAND_TOOL, GREP_TOOL, RECALL_GUIDANCE, summary_depth, summary_message,
};

use crate::engine::{LosslessEngine, lock_map, store_error};
use crate::units::unit_end;

/// Most rendered items kept for assembly (a few contexts' worth).
const RENDERED_CACHE_ITEMS: usize = 16_384;

/// Most context items the kept assemblies hold together (a gateway with thousands of sessions
/// keeps the recently active ones; the others are rebuilt from the store).
const ASSEMBLED_ITEMS: usize = 32_768;

/// The last assembly of recently assembled conversations, least recently used evicted first.
#[derive(Default)]
pub(crate) struct Assemblies {
    entries: HashMap<ConversationId, (u64, Vec<ItemRef>, Messages)>,
    items: usize,
    clock: u64,
}

impl Assemblies {
    pub(crate) fn take(
        &mut self,
        conversation: ConversationId,
    ) -> Option<(Vec<ItemRef>, Messages)> {
        let (_, items, messages) = self.entries.remove(&conversation)?;
        self.items -= items.len();
        Some((items, messages))
    }

    pub(crate) fn keep(
        &mut self,
        conversation: ConversationId,
        items: Vec<ItemRef>,
        messages: Messages,
    ) {
        self.clock += 1;
        self.items += items.len();
        if let Some((_, old, _)) = self
            .entries
            .insert(conversation, (self.clock, items, messages))
        {
            self.items -= old.len();
        }
        while self.items > ASSEMBLED_ITEMS && self.entries.len() > 1 {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (used, _, _))| *used)
                .map(|(id, _)| *id)
            else {
                break;
            };
            self.take(oldest);
        }
    }

    /// Context items the kept assemblies hold together.
    pub(crate) fn items(&self) -> usize {
        self.items
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl LosslessEngine {
    /// Keeps rendered items for later assemblies: past the cache's bound it starts over (one
    /// context larger than the bound is kept whole until the next call).
    pub(crate) fn remember_rendered(
        &self,
        items: impl IntoIterator<Item = (ItemRef, Arc<AgentMessage>)>,
    ) {
        let items: Vec<(ItemRef, Arc<AgentMessage>)> = items.into_iter().collect();
        let mut rendered = lock_map(&self.inner.rendered);
        if rendered.len() + items.len() > RENDERED_CACHE_ITEMS {
            rendered.clear();
        }
        rendered.extend(items);
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
        let visible: Vec<ItemRef> = refs[start..].iter().map(|entry| entry.item).collect();
        let estimated_tokens = refs[start..].iter().map(|entry| entry.tokens).sum();
        // The previous assembly of this conversation, if the new one extends it.
        let previous = lock_map(&self.inner.assembled).take(conversation);
        let (reused, mut messages) = match previous {
            Some((items, messages)) if visible.starts_with(&items) => (items.len(), messages),
            _ => (0, Messages::new()),
        };
        // What is rendered already, taken at once: another call may empty the cache meanwhile.
        let mut rendered: Vec<Option<Arc<AgentMessage>>> = {
            let cache = lock_map(&self.inner.rendered);
            visible[reused..]
                .iter()
                .map(|item| cache.get(item).cloned())
                .collect()
        };
        let missing: Vec<ItemRef> = visible[reused..]
            .iter()
            .zip(&rendered)
            .filter(|(_, known)| known.is_none())
            .map(|(item, _)| *item)
            .collect();
        if !missing.is_empty() {
            let contents = self
                .inner
                .store
                .items(missing.clone())
                .await
                .map_err(|error| store_error("reading context items", error))?;
            let mut fresh = Vec::with_capacity(missing.len());
            for (item, content) in missing.into_iter().zip(contents) {
                let message = match &content {
                    ItemContent::Summary(summary) => summary_message(summary),
                    ItemContent::Message(message) => message
                        .message()
                        .map_err(|error| store_error("reading a message", error))?,
                };
                fresh.push((item, Arc::new(message)));
            }
            let mut unknown = rendered.iter_mut().filter(|known| known.is_none());
            for (_, message) in &fresh {
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
        // Summaries are few: a walk over the item references finds them.
        let summaries = visible
            .iter()
            .enumerate()
            .filter(|(_, item)| matches!(item, ItemRef::Summary(_)))
            .filter_map(|(index, _)| {
                let depth = summary_depth(&messages[index])?;
                Some(AssembledSummary { index, depth })
            })
            .collect();
        lock_map(&self.inner.assembled).keep(conversation, visible, messages.clone());
        Ok(AssembleResult {
            messages,
            estimated_tokens,
            system_prompt_addition: None,
            prompt_authority: authority,
            context_projection: None,
            summaries,
            holds_history: false,
        })
    }

    pub(crate) async fn assemble_for(
        &self,
        params: &AssembleParams,
    ) -> Result<AssembleResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        // Installed mid-session: the host has history the store lacks. Import it first, each
        // message at its place. Or the host left its history out, trusting the store to hold
        // the session. Either way the cached row's count is from when the session was first
        // seen: read the current one.
        let read_only = self.inner.store.is_read_only();
        let seeds = !params.messages.is_empty() && !read_only;
        if conversation.message_count == 0 && (params.history_elided || seeds) {
            let stored = self
                .inner
                .store
                .conversation_by_id(conversation.id)
                .await
                .map_err(|error| store_error("conversation", error))?
                .map(|row| row.message_count);
            if params.history_elided && !seeds && stored.unwrap_or(0) == 0 {
                // Nothing stored (a session forgotten since): the host's history must come.
                return Err(EngineError::HistoryNeeded);
            }
            if seeds && stored == Some(0) {
                self.ingest_messages(
                    &params.session_id,
                    params.session_key.as_deref(),
                    &params.messages,
                    |index| MessageIdentity::default().at(index as u64),
                    None,
                )
                .await?;
            }
            // Either way the store now holds messages: drop the stale row so this check is
            // not repeated on every later assembly.
            self.forget_conversation_row(&params.session_id);
        }
        if let Some(budget) = params.budget().filter(|_| !read_only) {
            self.remember_budget(conversation.id, budget).await?;
        }
        let budget = self.budget(conversation.id, params.budget()).await?;
        let mut result = self.assemble_context(conversation.id, budget).await?;
        // What the store assembled from, it holds: the host need not send its history again.
        result.holds_history = !result.messages.is_empty();
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
