//! One turn of a session: assemble within the budget, the model call with overflow recovery,
//! the durable append, `after_turn`, the built-in compaction for engines that do not own it,
//! and `maintain`; and a compaction asked for by name (`/compact`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use vilvona_core::clock::now_ms;
use vilvona_core::engine::{
    AfterTurnParams, AssembleParams, AssembleResult, CompactParams, CompactReason, CompactResult,
    CompactionTarget, MaintainReason, PromptAuthority,
};
use vilvona_core::host::Operation;
use vilvona_core::message::AgentMessage;
use vilvona_legacy::{CompactionRequest, CompactionSettings, compact_transcript};
use vilvona_summarize::format_utc_rfc3339;
use vilvona_transcript::TranscriptWriter;

use super::{Host, HostError, LiveSession, MAX_OVERFLOW_ATTEMPTS, TurnReport};
use crate::memory::build_memory_system_prompt_addition;
use crate::model::{Model, ModelError, ModelRequest};
use crate::pruning::prune_tool_results;

impl Host {
    fn available_tools(&self) -> BTreeSet<String> {
        self.options
            .tools
            .iter()
            .map(|tool| tool.name.clone())
            .collect()
    }

    async fn assemble(
        &self,
        live: &LiveSession,
        prompt: &str,
        budget: u64,
    ) -> Result<AssembleResult, HostError> {
        let available_tools = self.available_tools();
        let citations_mode = self.config.memory_citations.clone();
        let memory_prompt = build_memory_system_prompt_addition(
            self.memory.as_ref(),
            &available_tools,
            citations_mode.as_deref(),
        );
        let params = AssembleParams {
            session_id: live.record.session_id.clone(),
            session_key: Some(live.key.clone()),
            messages: live.history.clone(),
            history_elided: false,
            token_budget: Some(budget),
            available_tools,
            citations_mode,
            model: self.config.model.as_ref().map(|model| model.model.clone()),
            prompt: Some(prompt.to_owned()),
            runtime_settings: None,
            memory_prompt,
        };
        match self.engine.engine.assemble(&params).await {
            Ok(result) => Ok(result),
            Err(error) if error.is_cancellation() => Err(self.engine_error("assemble", error)),
            Err(error) => {
                // Strict policy, or legacy itself failed: use the host's own history.
                tracing::warn!(%error, "context engine assemble failed, using pipeline messages");
                Ok(AssembleResult {
                    messages: live.history.clone(),
                    estimated_tokens: 0,
                    ..AssembleResult::default()
                })
            }
        }
    }

    /// Assembles for a prompt and runs the overflow precheck: when the estimate (as
    /// `promptAuthority` directs) is over budget, compacts through the active engine and
    /// assembles again. The budget already leaves room for the system prompt and the prompt
    /// (their pressure is subtracted from it), so the history alone is compared with it.
    async fn assemble_checked(
        &self,
        live: &mut LiveSession,
        prompt: &str,
        budget: u64,
        report: &mut TurnReport,
    ) -> Result<AssembleResult, HostError> {
        let assembled = self.assemble(live, prompt, budget).await?;
        let Some(estimate) = self.precheck_estimate(live, &assembled) else {
            return Ok(assembled);
        };
        report.prechecked = true;
        if estimate <= budget {
            return Ok(assembled);
        }
        let result = self
            .compact_live(
                live,
                false,
                Some(CompactionTarget::Budget),
                None,
                budget,
                Some(estimate),
            )
            .await?;
        report.compactions += u32::from(result.compacted);
        self.assemble(live, prompt, budget).await
    }

    /// The estimate the precheck compares against the budget, or `None` when the precheck is
    /// skipped (an engine that owns compaction and vouches for its assembled context).
    fn precheck_estimate(&self, live: &LiveSession, assembled: &AssembleResult) -> Option<u64> {
        let info = self.engine.engine.info();
        if info.owns_compaction && assembled.prompt_authority == PromptAuthority::Assembled {
            return None;
        }
        let assembled_estimate = self.assembled_tokens(live, assembled);
        Some(match assembled.prompt_authority {
            PromptAuthority::Assembled => assembled_estimate,
            PromptAuthority::PreassemblyMayOverflow => assembled_estimate.max(live.history_tokens),
        })
    }

    /// Tokens of an assembled context: the engine's own estimate when it gives one, the live
    /// history's running total when the engine passed the history through, else a count.
    fn assembled_tokens(&self, live: &LiveSession, assembled: &AssembleResult) -> u64 {
        if assembled.estimated_tokens > 0 {
            assembled.estimated_tokens
        } else if assembled.messages.len() == live.history.len() {
            live.history_tokens
        } else {
            assembled
                .messages
                .iter()
                .map(|message| self.estimator.message_tokens(message))
                .sum()
        }
    }

    async fn compact_live(
        &self,
        live: &mut LiveSession,
        force: bool,
        target: Option<CompactionTarget>,
        instructions: Option<String>,
        budget: u64,
        current: Option<u64>,
    ) -> Result<CompactResult, HostError> {
        let params = CompactParams {
            session_id: live.record.session_id.clone(),
            session_key: Some(live.key.clone()),
            agent_id: Some(self.options.agent_id.clone()),
            session_file: Some(Self::session_file(live)),
            token_budget: Some(budget),
            force,
            current_token_count: current,
            compaction_target: target,
            custom_instructions: instructions,
            runtime_settings: None,
            abort: None,
        };
        let result = self
            .engine
            .engine
            .compact(&params)
            .await
            .map_err(|error| self.engine_error("compact", error))?;
        self.after_compaction(live, &result).await?;
        Ok(result)
    }

    /// Follows a compaction: a rotated transcript replaces the old one in `sessions.json`, the
    /// history is rebuilt, the count goes up, and the engine may maintain.
    async fn after_compaction(
        &self,
        live: &mut LiveSession,
        result: &CompactResult,
    ) -> Result<(), HostError> {
        if !result.compacted {
            return Ok(());
        }
        if let Some(details) = &result.result
            && let (Some(session_id), Some(session_file)) =
                (&details.session_id, &details.session_file)
        {
            live.record.session_id = session_id.clone();
            live.record.session_file = PathBuf::from(session_file);
            live.writer = TranscriptWriter::open(&live.record.session_file)?;
        }
        live.record.compaction_count += 1;
        let record = live.record.clone();
        self.sessions.lock().await.update(&live.key, |stored| {
            stored.session_id = record.session_id;
            stored.session_file = record.session_file;
            stored.compaction_count = record.compaction_count;
        })?;
        self.reload_history(live)?;
        self.maintain(live, MaintainReason::Compaction).await;
        Ok(())
    }

    /// One turn with a model.
    pub async fn run_turn(
        &self,
        session_key: &str,
        user_message: AgentMessage,
        model: &dyn Model,
    ) -> Result<TurnReport, HostError> {
        self.check(Operation::AgentRun)?;
        let mut guard = self.live_session(session_key, None).await?;
        let live = &mut *guard;
        let prompt = user_message.plain_text();
        let mut report = TurnReport {
            engine_id: self.engine.active_id(),
            ..TurnReport::default()
        };
        let system = self.system_prompt();
        let budget = self.token_budget(&system.text, &prompt);
        report.token_budget = budget;
        let prompt_tokens = self.estimator.message_tokens(&user_message);

        let mut assembled = self
            .assemble_checked(live, &prompt, budget, &mut report)
            .await?;

        let mut attempts = 0;
        let response = loop {
            let request = self.model_request(&system.text, &assembled, &user_message);
            report.system_prompt = request.system_prompt.clone();
            report.assembled_tokens = request
                .messages
                .iter()
                .map(|message| self.estimator.message_tokens(message))
                .sum();
            report.over_budget = report.assembled_tokens.saturating_sub(prompt_tokens) > budget;
            match model.complete(&request).await {
                Ok(response) => break response,
                Err(ModelError::Overflow(detail)) => {
                    // Recover by compacting; only a compaction that freed tokens spends an attempt,
                    // and a compaction that frees nothing ends the recovery (retrying would
                    // overflow again).
                    let mut result = CompactResult::unchanged(CompactReason::NoCandidate, 0);
                    for force in [false, true] {
                        result = self
                            .compact_live(
                                live,
                                force,
                                Some(CompactionTarget::Budget),
                                None,
                                budget,
                                Some(report.assembled_tokens),
                            )
                            .await?;
                        if result.compacted {
                            break;
                        }
                    }
                    if !result.compacted {
                        return Err(HostError::Overflow(format!(
                            "{detail}; compaction freed nothing ({}). Try /compact with instructions or start a new session.",
                            result
                                .reason
                                .map(|reason| reason.to_string())
                                .unwrap_or_default()
                        )));
                    }
                    attempts += 1;
                    report.compactions += 1;
                    report.overflow_recoveries = attempts;
                    if attempts > MAX_OVERFLOW_ATTEMPTS {
                        return Err(HostError::Overflow(format!(
                            "{detail}; still too large after {MAX_OVERFLOW_ATTEMPTS} compactions"
                        )));
                    }
                    tracing::warn!(
                        attempt = attempts,
                        "context overflow; compacted and retrying"
                    );
                    assembled = self.assemble(live, &prompt, budget).await?;
                }
                Err(error) => return Err(error.into()),
            }
        };
        let mut new_messages = vec![user_message];
        new_messages.extend(response.messages);
        report.new_messages = new_messages.len();
        let usage = (
            response.input_tokens.unwrap_or(0),
            response.output_tokens.unwrap_or(0),
        );
        let ids = vec![None; new_messages.len()];
        self.finish_turn(live, new_messages, ids, usage, budget, &mut report)
            .await?;
        Ok(report)
    }

    /// Replays one recorded turn (its user message first) through the lifecycle without a
    /// model: assemble as if about to call the model, record the assembled size, then append the
    /// recorded messages and run the post-turn work.
    pub async fn replay_turn(
        &self,
        session_key: &str,
        session_id: Option<&str>,
        recorded: Vec<AgentMessage>,
        entry_ids: Vec<Option<String>>,
    ) -> Result<TurnReport, HostError> {
        self.check(Operation::AgentRun)?;
        let mut guard = self.live_session(session_key, session_id).await?;
        let live = &mut *guard;
        let mut report = TurnReport {
            engine_id: self.engine.active_id(),
            ..TurnReport::default()
        };
        // A turn the transcript already holds (a second replay of the same file, here or in
        // another process) is skipped.
        live.writer.refresh()?;
        if !entry_ids.is_empty()
            && entry_ids
                .iter()
                .all(|id| id.as_ref().is_some_and(|id| live.writer.contains(id)))
        {
            return Ok(report);
        }
        let prompt_message = recorded.first().cloned();
        let prompt = prompt_message
            .as_ref()
            .map(AgentMessage::plain_text)
            .unwrap_or_default();
        let budget = self.token_budget(&self.system_prompt().text, &prompt);
        report.token_budget = budget;
        let prompt_tokens = prompt_message
            .as_ref()
            .map_or(0, |message| self.estimator.message_tokens(message));
        let assembled = self
            .assemble_checked(live, &prompt, budget, &mut report)
            .await?;
        let assembled_tokens = self.assembled_tokens(live, &assembled);
        report.assembled_tokens = assembled_tokens + prompt_tokens;
        report.over_budget = assembled_tokens > budget;
        report.new_messages = recorded.len();
        self.finish_turn(live, recorded, entry_ids, (0, 0), budget, &mut report)
            .await?;
        Ok(report)
    }

    fn model_request(
        &self,
        system_prompt: &str,
        assembled: &AssembleResult,
        user_message: &AgentMessage,
    ) -> ModelRequest {
        let mut system_prompt = system_prompt.to_owned();
        if let Some(addition) = assembled
            .system_prompt_addition
            .as_deref()
            .filter(|a| !a.trim().is_empty())
        {
            system_prompt = format!("{addition}\n\n{system_prompt}");
        }
        let mut messages = assembled.messages.to_vec();
        messages.push(user_message.clone());
        prune_tool_results(
            &mut messages,
            &self.config.pruning,
            self.config.context_window(),
        );
        ModelRequest {
            system_prompt,
            messages,
            tools: self.options.tools.clone(),
        }
    }

    /// Appends the turn durably (with the model's `(input, output)` token usage in the session
    /// record: one write of `sessions.json`), then `after_turn`, built-in auto-compaction
    /// (non-owning engines only) and `maintain`.
    async fn finish_turn(
        &self,
        live: &mut LiveSession,
        new_messages: Vec<AgentMessage>,
        recorded_ids: Vec<Option<String>>,
        (input, output): (u64, u64),
        budget: u64,
        report: &mut TurnReport,
    ) -> Result<(), HostError> {
        let pre_prompt_message_count = live.history.len();
        let mut turn_ids = Vec::with_capacity(new_messages.len());
        let timestamp = format_utc_rfc3339(now_ms());
        for (index, message) in new_messages.iter().enumerate() {
            let id = match recorded_ids.get(index).cloned().flatten() {
                // Already in this session's history (a turn resumed after a crash): not again.
                Some(id) if live.known_ids.contains(&id) => continue,
                // The writer skips an entry another process appended meanwhile.
                Some(id) => {
                    live.writer.append(&vilvona_transcript::Entry::Message(
                        vilvona_transcript::MessageEntry {
                            id: id.clone(),
                            parent_id: live.writer.last_id().map(str::to_owned),
                            timestamp: Some(timestamp.clone()),
                            message: message.clone(),
                            extra: Default::default(),
                        },
                    ))?;
                    id
                }
                None => live.writer.append_message(message, timestamp.clone())?,
            };
            live.entry_ids.push(Some(id.clone()));
            live.known_ids.insert(id.clone());
            turn_ids.push(Some(id));
            live.history_tokens += self.estimator.message_tokens(message);
            live.history.make_mut().push(message.clone());
        }
        // Durable before the turn is acknowledged.
        live.writer.sync()?;
        self.sessions.lock().await.update(&live.key, |record| {
            record.input_tokens += input;
            record.output_tokens += output;
            record.total_tokens += input + output;
        })?;

        let params = AfterTurnParams {
            session_id: live.record.session_id.clone(),
            session_key: Some(live.key.clone()),
            session_file: Some(Self::session_file(live)),
            messages: live.history.clone(),
            entry_ids: turn_ids,
            pre_prompt_message_count,
            auto_compaction_summary: None,
            is_heartbeat: false,
            token_budget: Some(budget),
            runtime_settings: None,
        };
        if let Err(error) = self.engine.engine.after_turn(&params).await {
            tracing::warn!(%error, "context engine post-turn work failed; skipping maintenance");
            return Ok(());
        }
        let info = self.engine.engine.info();
        if !info.owns_compaction {
            // The whole prompt counts, as OpenClaw counts it from the provider's usage: the
            // system prompt as well as the history.
            let window = self.config.context_window();
            let threshold = window.saturating_sub(self.config.reserve_tokens(window));
            let system = self.estimator.text_tokens(&self.system_prompt().text);
            if live.history_tokens + system > threshold {
                let result = self.builtin_compaction(live, None, budget).await?;
                report.compactions += u32::from(result.compacted);
            }
        }
        self.maintain(live, MaintainReason::Turn).await;
        Ok(())
    }

    /// The built-in compaction on the session transcript (what non-owning engines get).
    async fn builtin_compaction(
        &self,
        live: &mut LiveSession,
        instructions: Option<&str>,
        budget: u64,
    ) -> Result<CompactResult, HostError> {
        let settings = CompactionSettings {
            keep_recent_tokens: self.config.compaction.keep_recent_tokens,
            context_window: self.config.context_window(),
            truncate_after_compaction: self.config.compaction.truncate_after_compaction,
            prompt_budget: Some(budget),
            ..CompactionSettings::default()
        };
        let result = compact_transcript(CompactionRequest {
            session_file: &live.record.session_file,
            custom_instructions: instructions,
            settings: &settings,
            summarizer: &*self.summarizer,
            estimator: &*self.estimator,
            must_make_room: false,
        })
        .await?;
        self.after_compaction(live, &result).await?;
        Ok(result)
    }

    /// Manual `/compact [instructions]` (operation `manual-compact`).
    pub async fn compact(
        &self,
        session_key: &str,
        instructions: Option<String>,
    ) -> Result<CompactResult, HostError> {
        self.check(Operation::ManualCompact)?;
        if self.session(session_key).await.is_none() {
            return Err(HostError::UnknownSession(session_key.to_owned()));
        }
        let mut guard = self.live_session(session_key, None).await?;
        let live = &mut *guard;
        let budget = self.token_budget(&self.system_prompt().text, "");
        // The transcript's size is the context only for an engine that passes it through; an
        // engine that owns compaction keeps its own (OpenClaw's manual compaction sends no
        // count either).
        let current = (!self.engine.engine.info().owns_compaction).then_some(live.history_tokens);
        self.compact_live(live, true, None, instructions, budget, current)
            .await
    }
}
