//! Ingest: messages prepared (token counts, large content moved to blobs) and stored, one
//! at a time, in batches, after a turn, or as a durable turn.

use std::sync::Arc;

use serde_json::Value;
use vilvona_core::admin::TurnRecord;
use vilvona_core::engine::*;
use vilvona_core::message::{AgentMessage, ContentBlock, MessageContent};
use vilvona_store::*;

use crate::render::{describe_content, large_content_reference};

use crate::cache::Rendition;
use crate::compaction::CompactionRequest;
use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::turns::turn_usage;

/// The smallest threshold above which content moves to a blob, however small the room: below
/// it, a reference and a description would save little.
const MIN_LARGE_CONTENT_TOKENS: u64 = 1_000;

/// Most messages of one ingest whose rendered form is kept for the next assembly.
const RENDER_ON_INGEST: usize = 64;

impl LosslessEngine {
    /// Prepares messages for the store: token counts, and large tool output moved to blobs.
    pub(crate) async fn prepare(
        &self,
        conversation: ConversationId,
        messages: &[AgentMessage],
        identity: impl Fn(usize) -> MessageIdentity,
    ) -> Result<Vec<NewMessage>, EngineError> {
        // Large content moves to a blob above the configured threshold, or above half of what
        // the context may hold beside the host's prompt, whichever is smaller: a tool's output
        // larger than the whole room would leave a newest unit no compaction can fit (at 16k,
        // OpenClaw's own prompt leaves ~5k; the configured 25k is for large windows).
        let ceiling = self
            .host_prompt(conversation)
            .await?
            .limits(&self.inner.config)
            .ceiling;
        let threshold = self
            .inner
            .config
            .large_content_threshold_tokens
            .min((ceiling / 2).max(MIN_LARGE_CONTENT_TOKENS));
        let mut prepared = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let tokens = self.inner.estimator.message_tokens(message);
            let (message, tokens) = match self
                .externalize(conversation, message, tokens, threshold)
                .await?
            {
                Some(moved) => {
                    let tokens = self.inner.estimator.message_tokens(&moved);
                    (moved, tokens)
                }
                None => (message.clone(), tokens),
            };
            prepared.push(NewMessage {
                tokens,
                message,
                identity: identity(index),
            });
        }
        Ok(prepared)
    }

    /// A tool result (or user content) larger than `threshold`: each large text block is stored
    /// once as a blob and replaced by a reference and a description. The original is restorable:
    /// the block keeps the blob id. `None` when the message (of `tokens`) stays as it is.
    async fn externalize(
        &self,
        conversation: ConversationId,
        message: &AgentMessage,
        tokens: u64,
        threshold: u64,
    ) -> Result<Option<AgentMessage>, EngineError> {
        let is_candidate = matches!(message, AgentMessage::ToolResult(_) | AgentMessage::User(_));
        if !is_candidate || tokens <= threshold {
            return Ok(None);
        }
        let mut message = message.clone();
        let content = match &mut message {
            AgentMessage::ToolResult(result) => &mut result.content,
            AgentMessage::User(user) => &mut user.content,
            _ => return Ok(None),
        };
        if let MessageContent::Text(text) = content {
            *content = MessageContent::Blocks(vec![ContentBlock::text(std::mem::take(text))]);
        }
        if let MessageContent::Blocks(blocks) = content {
            for block in blocks.iter_mut() {
                let ContentBlock::Text(text) = block else {
                    continue;
                };
                if self.inner.estimator.text_tokens(&text.text) <= threshold / 2 {
                    continue;
                }
                let (kind, description) = describe_content(&text.text);
                let info = self
                    .inner
                    .store
                    .put_blob(NewBlob {
                        conversation,
                        kind,
                        content: std::mem::take(&mut text.text),
                        description: description.clone(),
                    })
                    .await
                    .map_err(|error| store_error("storing large content", error))?;
                text.text = large_content_reference(&info.blob_id, &description);
                text.extra.insert(
                    vilvona_store::BLOB_ID_KEY.to_owned(),
                    Value::String(info.blob_id),
                );
            }
        }
        Ok(Some(message))
    }

    pub(crate) async fn ingest_messages(
        &self,
        session_id: &str,
        session_key: Option<&str>,
        messages: &[AgentMessage],
        identity: impl Fn(usize) -> MessageIdentity,
        advancement_key: Option<String>,
    ) -> Result<IngestOutcome, EngineError> {
        let conversation = self.conversation(session_id, session_key).await?;
        let prepared = self.prepare(conversation.id, messages, identity).await?;
        // A turn's messages, as stored, are what the next assembly renders: kept now, they
        // need not be read back and parsed then. (A bulk import is not worth the copies.)
        let rendered: Vec<(Arc<AgentMessage>, u64)> = if prepared.len() <= RENDER_ON_INGEST {
            prepared
                .iter()
                .map(|new| (Arc::new(new.message.clone()), new.tokens))
                .collect()
        } else {
            Vec::new()
        };
        let outcome = self
            .inner
            .store
            .ingest(conversation.id, prepared, advancement_key)
            .await
            .map_err(|error| store_error("ingest", error))?;
        if let IngestOutcome::Stored(results) = &outcome {
            // Only what this call stored: an earlier copy of a message may differ from it.
            self.remember_rendered(
                results
                    .iter()
                    .zip(rendered)
                    .filter(|(result, _)| result.ingested)
                    .map(|(result, (message, tokens))| {
                        (
                            Rendition::message(result.message_id),
                            message,
                            Some(result.seq),
                            tokens,
                        )
                    }),
            );
        }
        Ok(outcome)
    }

    pub(crate) async fn ingest_one(
        &self,
        params: &IngestParams,
    ) -> Result<IngestResult, EngineError> {
        let stored = self
            .ingest_by_entry_id(
                &params.session_id,
                params.session_key.as_deref(),
                std::slice::from_ref(&params.message),
                std::slice::from_ref(&params.entry_id),
            )
            .await?;
        Ok(IngestResult {
            ingested: stored > 0,
        })
    }

    pub(crate) async fn ingest_many(
        &self,
        params: &IngestBatchParams,
    ) -> Result<IngestBatchResult, EngineError> {
        let ingested_count = self
            .ingest_by_entry_id(
                &params.session_id,
                params.session_key.as_deref(),
                &params.messages,
                &params.entry_ids,
            )
            .await?;
        Ok(IngestBatchResult { ingested_count })
    }

    /// Stores messages the host names by entry id where it has one; answers how many were new.
    async fn ingest_by_entry_id(
        &self,
        session_id: &str,
        session_key: Option<&str>,
        messages: &[AgentMessage],
        entry_ids: &[Option<String>],
    ) -> Result<u64, EngineError> {
        let outcome = self
            .ingest_messages(
                session_id,
                session_key,
                messages,
                |index| MessageIdentity {
                    entry_id: entry_ids.get(index).cloned().flatten(),
                    ..MessageIdentity::default()
                },
                None,
            )
            .await?;
        Ok(outcome.newly_stored())
    }

    /// Stores the turn's messages (each at its place in the host's snapshot), then compacts
    /// unless the turn is a heartbeat.
    pub(crate) async fn ingest_turn(&self, params: &AfterTurnParams) -> Result<(), EngineError> {
        let (messages, entry_ids) = params.new_messages();
        let first_place = (params.messages.len() - messages.len()) as u64;
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        let context_before = self.context_before_turn(conversation.id, messages).await?;
        self.ingest_messages(
            &params.session_id,
            params.session_key.as_deref(),
            messages,
            |index| MessageIdentity {
                entry_id: entry_ids.get(index).cloned().flatten(),
                turn: None,
                place: Some(first_place + index as u64),
            },
            None,
        )
        .await?;
        self.note_commit(conversation.id).await?;
        self.compact_after_turn(
            conversation.id,
            Turn {
                messages,
                context_before,
                budget: params.budget(),
                settings: params.runtime_settings.as_ref(),
                is_heartbeat: params.is_heartbeat,
            },
        )
        .await
    }

    /// The context's tokens before a turn is stored, when the turn reports what its model call
    /// counted (the overhead is measured against it); `None` otherwise (no read).
    pub(crate) async fn context_before_turn(
        &self,
        conversation: ConversationId,
        messages: &[AgentMessage],
    ) -> Result<Option<u64>, EngineError> {
        let reports_usage = messages.iter().any(|message| {
            matches!(message, AgentMessage::Assistant(assistant)
                if assistant.usage.as_ref().and_then(|usage| usage.prompt_tokens()).is_some())
        });
        if !reports_usage {
            return Ok(None);
        }
        Ok(Some(self.context_tokens(conversation).await?))
    }

    /// After a stored turn: what it shows of the host's prompt is kept (the budget of its
    /// assemblies, the overhead its model call reported), then the conversation is compacted
    /// against the limits that gives, and the turn is recorded (`crate::turns`). A heartbeat
    /// turn never compacts.
    pub(crate) async fn compact_after_turn(
        &self,
        conversation: ConversationId,
        turn: Turn<'_>,
    ) -> Result<(), EngineError> {
        let mut prompt = self.host_prompt(conversation).await?;
        if let Some(budget) = turn.budget.or(self.take_turn_budget(conversation)) {
            prompt.budget = Some(budget);
        }
        prompt.note_window(turn.settings, turn.budget);
        if let Some(context_before) = turn.context_before {
            prompt.note_turn(turn.messages, context_before, &*self.inner.estimator);
        }
        self.keep_host_prompt(conversation, prompt).await?;
        let limits = prompt.limits(&self.inner.config);
        let mut record = TurnRecord {
            at: self.inner.clock.now_ms(),
            host_prompt: prompt.overhead,
            window: prompt.window,
            trigger: limits.trigger,
            usage: turn_usage(turn.messages),
            heartbeat: turn.is_heartbeat,
            ..TurnRecord::default()
        };
        if turn.is_heartbeat {
            let tokens = self.context_tokens(conversation).await?;
            record.context_before_compaction = tokens;
            record.context_after_compaction = tokens;
        } else {
            // The summaries wait for the configured summarizer: a host's model is not always in
            // scope here (OpenClaw passes it to `maintain`, which follows, not to `commitTurn`).
            let report = self
                .compact_conversation(
                    conversation,
                    CompactionRequest {
                        wait_for_summarizer: true,
                        ..CompactionRequest::within(limits)
                    },
                )
                .await?;
            record.context_before_compaction = report.tokens_before;
            record.context_after_compaction = report.tokens_after;
            record.folds = report.published;
        }
        self.record_turn(conversation, record).await
    }

    /// One atomic write per advancement key; a message without entry id is identified by the
    /// key and its index in the turn, so equal messages of two turns are both kept. Compacts
    /// against what the host said of its prompt (2026.9 sends no budget here: the smallest its
    /// assemblies of the turn were given counts), unless the turn is a heartbeat: a heartbeat's
    /// messages are stored and searchable, but it never triggers compaction (it would spend
    /// summarizer calls and break the prompt cache for a ping).
    pub(crate) async fn commit_durable_turn(
        &self,
        params: &CommitTurnParams,
    ) -> Result<CommitTurnResult, EngineError> {
        let conversation = self
            .conversation(&params.session_id, params.session_key.as_deref())
            .await?;
        // A turn taken in from the host's history before its commit came (`crate::catch_up`)
        // is stored already: its key is kept, so the commit sent again is a duplicate too.
        if self
            .taken_in_already(conversation.id, &params.messages)
            .await?
        {
            self.inner
                .store
                .ingest(
                    conversation.id,
                    Vec::new(),
                    Some(params.advancement_key.clone()),
                )
                .await
                .map_err(|error| store_error("ingest", error))?;
            self.note_commit(conversation.id).await?;
            return Ok(CommitTurnResult {
                status: CommitStatus::Duplicate,
            });
        }
        // The turn's place in the host's transcript: a turn sent again after its messages came
        // back with the host's history is found there and stored once.
        // A fork child's places are the host's less the parent's history its seed shows.
        let host_place = admitted_at(params);
        let offset = match host_place {
            Some(at) => self.settle_host_offset(conversation.id, at).await?,
            None => self.host_offset(conversation.id).await?,
        };
        if let (Some(at), Some(admission)) = (host_place, params.admission.as_ref()) {
            self.fill_gap_from_the_hosts_record(conversation.id, admission, at, offset)
                .await?;
        }
        let admitted_at = host_place.and_then(|at| at.checked_sub(offset));
        let context_before = self
            .context_before_turn(conversation.id, &params.messages)
            .await?;
        let outcome = self
            .ingest_messages(
                &params.session_id,
                params.session_key.as_deref(),
                &params.messages,
                |index| MessageIdentity {
                    entry_id: None,
                    turn: Some((params.advancement_key.clone(), index as u32)),
                    place: admitted_at.map(|at| at + index as u64),
                },
                Some(params.advancement_key.clone()),
            )
            .await?;
        self.note_commit(conversation.id).await?;
        if outcome == IngestOutcome::DuplicateTurn {
            return Ok(CommitTurnResult {
                status: CommitStatus::Duplicate,
            });
        }
        self.compact_after_turn(
            conversation.id,
            Turn {
                messages: &params.messages,
                context_before,
                budget: params.budget(),
                settings: params.runtime_settings.as_ref(),
                is_heartbeat: params.is_heartbeat,
            },
        )
        .await?;
        Ok(CommitTurnResult {
            status: CommitStatus::Committed,
        })
    }
}

/// Where the host's transcript places a committed turn's first message (its admission
/// anchor's `activeMessagePosition`, counted from 0).
fn admitted_at(params: &CommitTurnParams) -> Option<u64> {
    params
        .admission
        .as_ref()?
        .get("activeMessagePosition")?
        .as_u64()
}

impl LosslessEngine {
    /// A turn the host places after messages the store lacks (lost with a cut log or a crash,
    /// before the host's next assembly could bring them back: OpenClaw delivers the turns it
    /// holds queued first) gets them from the host's own record first, each at its place:
    /// OpenClaw's agent database, which the turn's admission anchor names (`storePath`). Only
    /// where the store's last message is the record's message at the same place; anything
    /// else (no record, another shape, the two not meeting) leaves the store as it is and is
    /// logged, and the turn is stored all the same. `at` is the host's place; the store's own
    /// messages begin at the host's `offset` (a fork child's: see `crate::subagents`).
    async fn fill_gap_from_the_hosts_record(
        &self,
        conversation: ConversationId,
        admission: &Value,
        at: u64,
        offset: u64,
    ) -> Result<(), EngineError> {
        let (Some(path), Some(session)) = (
            admission.get("storePath").and_then(Value::as_str),
            admission.get("sessionId").and_then(Value::as_str),
        ) else {
            return Ok(());
        };
        let Some(row) = self.stored_row(conversation).await? else {
            return Ok(());
        };
        let held = row.message_count;
        if at <= offset + held {
            return Ok(());
        }
        let from = offset + held.saturating_sub(1);
        let (path, session_id) = (std::path::PathBuf::from(path), session.to_owned());
        let read = tokio::task::spawn_blocking(move || {
            vilvona_transcript::agent_database::messages_at(&path, &session_id, from, at)
        })
        .await
        .map_err(|error| EngineError::caused_by("lossless reading the host's record", error))?;
        let record = match read {
            Ok(record) => record,
            Err(error) => {
                tracing::warn!(%error, session, held, at, "the store lacks messages the host places before this turn, and the host's record could not give them; the turn is stored after what the store holds");
                return Ok(());
            }
        };
        if self
            .store_lost_tail(&row, &record, "OpenClaw's record")
            .await?
            .is_none()
        {
            tracing::warn!(
                session,
                held,
                at,
                "the store lacks messages the host places before this turn, but its last message is not the host's at that place; the turn is stored after what the store holds"
            );
        }
        Ok(())
    }
}

/// A stored turn, as compaction after it sees it.
pub(crate) struct Turn<'a> {
    pub(crate) messages: &'a [AgentMessage],
    /// The context's tokens before the turn was stored (when its model call reported usage).
    pub(crate) context_before: Option<u64>,
    /// The budget the turn's call carried.
    pub(crate) budget: Option<u64>,
    pub(crate) settings: Option<&'a RuntimeSettings>,
    pub(crate) is_heartbeat: bool,
}
