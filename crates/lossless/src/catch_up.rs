//! Catch-up: turns the host never committed, taken in from its history at the next assembly.
//!
//! OpenClaw hands a finished turn to the engine (`commitTurn`) only when the turn's last
//! transcript entry is a message. On Anthropic's API, with the cache-ttl pruning OpenClaw turns
//! on by itself there, a marker entry follows every answer: no turn is ever committed, and
//! nothing says so (OpenClaw's tracker: #156425). `assemble` still brings the host's history,
//! a bounded tail of it (OpenClaw reads about 8 bytes a token of its budget), and what that
//! tail holds past the store's last message was never committed. It is stored in order, each
//! message once, then compacted as a committed turn is. A commit that comes after all
//! (OpenClaw fixed, a queued commit delivered late) finds its messages stored and stores
//! nothing twice.
//!
//! Where the two meet: the store's last messages (up to [`MEET_RUN`]) found as a run in the
//! host's history, compared by role, time, tool call and text ([`same_message`]); the latest
//! such run. A history that does not reach back to the store's last message is left alone
//! (and said so, once). The same takes back a tail the store lost (a log cut by a crash) when
//! the host's history still holds it.
//!
//! The host may hand the engine its own assembled context back as history (OpenClaw does
//! inside a turn's tool loop): one that holds the engine's renderings (summaries, a recall
//! block) brings nothing to take in.
//!
//! Never silent: a session whose turns arrive this way is logged once per process, and its
//! state ([`CATCH_UP`]) counts the turns taken in and says whether commits are missing now —
//! read by `stats`, `context list`, the panel and `doctor`. While they are missing, the engine
//! never tells the host it holds the history ([`AssembleResult::holds_history`]), so the host
//! keeps sending it; the next commit ends that.

use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;

use crate::engine::LosslessEngine;
use crate::errors::store_error;
use crate::memory::CatchUp;
use crate::render::is_engine_rendering;

/// The state key of a conversation's [`CatchUp`].
pub(crate) const CATCH_UP: &str = "catchUp";

/// How many of the store's last messages must stand together in the host's history for the
/// two to meet there.
const MEET_RUN: u64 = 4;

/// Whether a stored message and one of the host's are the same message: the same role, the
/// same time when both carry one, the same tool call for a tool's result, and the same text
/// (unless the store moved the message's large content to a blob, which changed its text).
pub(crate) fn same_message(stored: &AgentMessage, host: &AgentMessage) -> bool {
    if stored.role() != host.role() {
        return false;
    }
    if let (Some(a), Some(b)) = (stored.timestamp_ms(), host.timestamp_ms())
        && a != b
    {
        return false;
    }
    if stored.tool_result_call_id() != host.tool_result_call_id() {
        return false;
    }
    let moved_to_a_blob = stored.content().is_some_and(|content| {
        content.blocks().iter().any(|block| match block {
            vilvona_core::message::ContentBlock::Text(text) => text.extra.contains_key(BLOB_ID_KEY),
            _ => false,
        })
    });
    moved_to_a_blob || stored.plain_text() == host.plain_text()
}

/// Where `host` goes on past `last` (the store's last messages, oldest first): the index after
/// the latest run of `host` that is `last`. `None` when `host` holds no such run.
pub(crate) fn past_the_store(host: &[AgentMessage], last: &[AgentMessage]) -> Option<usize> {
    if last.is_empty() {
        return Some(0);
    }
    (last.len()..=host.len()).rev().find(|&end| {
        last.iter()
            .zip(&host[end - last.len()..end])
            .all(|(stored, message)| same_message(stored, message))
    })
}

/// Turns among `messages`: its user messages, at least one.
fn turns_in(messages: &[AgentMessage]) -> u64 {
    (messages
        .iter()
        .filter(|message| matches!(message, AgentMessage::User(_)))
        .count() as u64)
        .max(1)
}

impl LosslessEngine {
    /// Takes in what the host's history (`params.messages`) holds past the store: on first
    /// sight, the conversation's history as the host has it (a fork child's, less what its
    /// seed shows); later, the turns the host never committed (see the module), compacted
    /// after. Nothing when the store is read-only or the history is left out.
    pub(crate) async fn catch_up(
        &self,
        conversation: ConversationId,
        params: &AssembleParams,
    ) -> Result<(), EngineError> {
        // The engine's own assembled context handed back (OpenClaw's calls inside a turn's
        // tool loop) holds its renderings (summaries, a recall block), which are no turns: the
        // rest meets the store like any history.
        let host: Vec<AgentMessage> = params
            .messages
            .iter()
            .filter(|message| !is_engine_rendering(message))
            .cloned()
            .collect();
        let host = host.as_slice();
        if host.is_empty() || self.inner.store.is_read_only() {
            return Ok(());
        }
        let Some(row) = self.stored_row(conversation).await? else {
            return Ok(());
        };
        let held = row.message_count;
        if held == 0 {
            // First sight: a fork child's transcript begins with its parent's history, which
            // its seed shows; a session begun anew's, with what came before.
            let own = self.forked_history(conversation, host).await?;
            let history = &host[own..];
            if history.is_empty() {
                return Ok(());
            }
            self.ingest_messages(
                &row.session_id,
                row.session_key.as_deref(),
                history,
                |index| MessageIdentity::default().at(index as u64),
                None,
            )
            .await?;
            self.forget_conversation_row(&row.session_id);
            // Taken from an assembly, not a commit: until one comes, the history is needed.
            return self.note_catch_up(conversation, None).await;
        }
        let first = held.saturating_sub(MEET_RUN);
        let last = self.stored_messages(conversation, first, held - 1).await?;
        // Met by the store's last messages; else (a tail too short to hold them, a message the
        // host rewrote since, the newest rows forgotten) by time: what the host says past the
        // store's newest message and any forgetting's horizon.
        let met = (!last.is_empty())
            .then(|| past_the_store(host, &last))
            .flatten();
        let past = match met {
            Some(past) => Some(past),
            None => self.past_by_time(conversation, host, &last).await?,
        };
        let Some(past) = past else {
            if self.memory(conversation, |memory| {
                !std::mem::replace(&mut memory.catch_up_unmet_said, true)
            }) {
                tracing::warn!(
                    session_id = %row.session_id,
                    held,
                    host = host.len(),
                    "the host's history does not reach back to the store's last message; the store takes in nothing from it"
                );
            }
            return Ok(());
        };
        let missing = &host[past..];
        if missing.is_empty() {
            return Ok(());
        }
        let context_before = self.context_before_turn(conversation, missing).await?;
        self.ingest_messages(
            &row.session_id,
            row.session_key.as_deref(),
            missing,
            |index| MessageIdentity::default().at(held + index as u64),
            None,
        )
        .await?;
        self.forget_conversation_row(&row.session_id);
        if self.memory(conversation, |memory| {
            !std::mem::replace(&mut memory.catch_up_said, true)
        }) {
            tracing::warn!(
                session_id = %row.session_id,
                messages = missing.len(),
                "the host's history holds turns it never committed (OpenClaw on Anthropic's API with its cache-ttl pruning does not commit turns: its issue #156425); they are taken in from the history at each next turn (said once per session and process; `vilvona doctor` counts them)"
            );
        }
        self.note_catch_up(conversation, Some(missing)).await?;
        self.compact_after_turn(
            conversation,
            crate::ingest::Turn {
                messages: missing,
                context_before,
                // What this assembly says of the host's prompt (its budget beside the window
                // its settings state: without the budget, a settings' prompt budget below the
                // window would be taken for the window).
                budget: params.budget(),
                settings: params.runtime_settings.as_ref(),
                is_heartbeat: false,
            },
        )
        .await
    }

    /// Where `host` goes on past the store by time: after its last message stamped at or before
    /// both the store's newest message (of `last`) and the horizon of a forgetting (nothing
    /// before it comes back). `None` when neither is known, or a message past that point
    /// carries no time to tell.
    async fn past_by_time(
        &self,
        conversation: ConversationId,
        host: &[AgentMessage],
        last: &[AgentMessage],
    ) -> Result<Option<usize>, EngineError> {
        let horizon = self.forget_horizon(conversation).await?;
        let newest = last.iter().filter_map(AgentMessage::timestamp_ms).max();
        let Some(after) = newest.max(horizon) else {
            return Ok(None);
        };
        let past = host
            .iter()
            .rposition(|message| message.timestamp_ms().is_some_and(|at| at <= after))
            .map_or(0, |index| index + 1);
        Ok(host[past..]
            .iter()
            .all(|message| message.timestamp_ms().is_some())
            .then_some(past))
    }

    /// Notes an intake from the host's history: `Some(messages)` taken in at a later turn,
    /// `None` a first sight. Either way the host's commits are missing until the next.
    async fn note_catch_up(
        &self,
        conversation: ConversationId,
        taken: Option<&[AgentMessage]>,
    ) -> Result<(), EngineError> {
        let mut state = self.catch_up_state(conversation).await?;
        if let Some(messages) = taken {
            state.turns += turns_in(messages);
            state.messages += messages.len() as u64;
        } else if state.missing {
            return Ok(());
        }
        state.missing = true;
        self.keep_catch_up(conversation, state).await
    }

    /// A commit came: the host's commits are not missing (any more).
    pub(crate) async fn note_commit(
        &self,
        conversation: ConversationId,
    ) -> Result<(), EngineError> {
        let state = self.catch_up_state(conversation).await?;
        if !state.missing {
            return Ok(());
        }
        self.keep_catch_up(
            conversation,
            CatchUp {
                missing: false,
                ..state
            },
        )
        .await
    }

    /// Whether the engine must ask for the host's history at the next assembly: the host's
    /// commits are missing.
    pub(crate) async fn needs_host_history(
        &self,
        conversation: ConversationId,
    ) -> Result<bool, EngineError> {
        Ok(self.catch_up_state(conversation).await?.missing)
    }

    /// What catch-up took in for a conversation: remembered, else read from the store.
    pub(crate) async fn catch_up_state(
        &self,
        conversation: ConversationId,
    ) -> Result<CatchUp, EngineError> {
        if let Some(state) = self.memory(conversation, |memory| memory.catch_up) {
            return Ok(state);
        }
        let state: CatchUp = self
            .inner
            .store
            .state(conversation, CATCH_UP)
            .await
            .map_err(|error| store_error("reading what catch-up took in", error))?
            .map(|text| {
                // Unreadable, it is taken as commits missing: the host keeps sending its
                // history, and nothing is lost by asking for it.
                serde_json::from_str(&text).unwrap_or_else(|error| {
                    tracing::warn!(
                        conversation = conversation.0,
                        %error,
                        "what catch-up took in is unreadable; commits are taken as missing"
                    );
                    CatchUp {
                        missing: true,
                        ..CatchUp::default()
                    }
                })
            })
            .unwrap_or_default();
        self.memory(conversation, |memory| memory.catch_up = Some(state));
        Ok(state)
    }

    async fn keep_catch_up(
        &self,
        conversation: ConversationId,
        state: CatchUp,
    ) -> Result<(), EngineError> {
        let text = serde_json::to_string(&state)
            .map_err(|error| EngineError::caused_by("lossless: writing catch-up's state", error))?;
        self.inner
            .store
            .set_state(conversation, CATCH_UP, &text)
            .await
            .map_err(|error| store_error("recording what catch-up took in", error))?;
        self.memory(conversation, |memory| memory.catch_up = Some(state));
        Ok(())
    }

    /// What doctor says of the sessions whose turns were taken in from the host's history:
    /// how many, and how many turns. `None` when there are none.
    pub(crate) async fn catch_up_notice(&self) -> Result<Option<String>, EngineError> {
        let (mut sessions, mut turns, mut missing) = (0, 0, 0);
        for conversation in self.agent_conversations().await? {
            let state = self.catch_up_state(conversation.id).await?;
            if state.turns > 0 {
                sessions += 1;
                turns += state.turns;
                missing += u64::from(state.missing);
            }
        }
        Ok((sessions > 0).then(|| {
            format!(
                "{sessions} session(s) had {turns} turn(s) taken in from the host's history at a later turn, because the host never committed them (OpenClaw on Anthropic's API with its cache-ttl pruning, its default there: OpenClaw issue #156425) or the store lost them; nothing is missing. Commits are missing now in {missing} of them (`vilvona context list --session ID` says which)"
            )
        }))
    }

    /// Whether a committed turn's messages are already stored, taken in from the host's
    /// history before the commit came: found as a run among the store's last messages.
    pub(crate) async fn taken_in_already(
        &self,
        conversation: ConversationId,
        messages: &[AgentMessage],
    ) -> Result<bool, EngineError> {
        if messages.is_empty() || self.catch_up_state(conversation).await? == CatchUp::default() {
            return Ok(false);
        }
        let held = self
            .stored_row(conversation)
            .await?
            .map_or(0, |row| row.message_count);
        let look_back = messages.len() as u64 * 4 + MEET_RUN;
        let stored = self
            .stored_messages(
                conversation,
                held.saturating_sub(look_back),
                held.saturating_sub(1),
            )
            .await?;
        Ok(held > 0
            && stored.windows(messages.len()).any(|run| {
                // Timed messages only: an untimed "continue" repeated is a turn of its own.
                run.iter().zip(messages).all(|(stored, message)| {
                    stored.timestamp_ms().is_some()
                        && message.timestamp_ms().is_some()
                        && same_message(stored, message)
                })
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn said(role: &str, text: &str, at: i64) -> AgentMessage {
        serde_json::from_value(json!({"role": role, "content": text, "timestamp": at})).unwrap()
    }

    #[test]
    fn the_history_goes_on_past_the_latest_run_of_the_stores_last_messages() {
        let history: Vec<AgentMessage> = (0..10)
            .map(|n| {
                said(
                    if n % 2 == 0 { "user" } else { "assistant" },
                    &format!("m{n}"),
                    n,
                )
            })
            .collect();
        // The store holds m0..m5: the host's m6.. are past it, wherever its history begins.
        assert_eq!(past_the_store(&history, &history[2..6]), Some(6));
        assert_eq!(
            past_the_store(&history[3..], &history[2..6]),
            None,
            "not a whole run"
        );
        assert_eq!(past_the_store(&history[4..], &history[4..6]), Some(2));
        assert_eq!(
            past_the_store(&history, &history[6..]),
            Some(10),
            "nothing past it"
        );
        assert_eq!(past_the_store(&history[..3], &history[2..6]), None);
        assert_eq!(past_the_store(&history, &[]), Some(0));
    }

    #[test]
    fn equal_text_at_another_time_is_another_message() {
        let first = [said("user", "continue", 1), said("assistant", "ok", 2)];
        let again = [said("user", "continue", 3), said("assistant", "ok", 4)];
        let history = [first.as_slice(), again.as_slice()].concat();
        assert_eq!(past_the_store(&history, &first), Some(2));
        assert_eq!(past_the_store(&history, &again), Some(4));
        // Without times, the text alone says it: the latest run is taken.
        let untimed = |text: &str, role: &str| {
            serde_json::from_value::<AgentMessage>(json!({"role": role, "content": text})).unwrap()
        };
        let plain = [untimed("continue", "user"), untimed("ok", "assistant")];
        let repeated = [plain.as_slice(), plain.as_slice()].concat();
        assert_eq!(past_the_store(&repeated, &plain), Some(4));
    }

    #[test]
    fn a_tools_result_is_told_by_its_call_and_a_moved_text_by_the_rest() {
        let result = |call: &str, text: &str| {
            serde_json::from_value::<AgentMessage>(json!({"role": "toolResult", "toolCallId": call, "content": [{"type": "text", "text": text}], "timestamp": 5})).unwrap()
        };
        assert!(same_message(&result("c1", "out"), &result("c1", "out")));
        assert!(!same_message(&result("c1", "out"), &result("c2", "out")));
        let moved: AgentMessage = serde_json::from_value(json!({"role": "toolResult", "toolCallId": "c1", "content": [{"type": "text", "text": "[stored as file_1]", BLOB_ID_KEY: "file_1"}], "timestamp": 5})).unwrap();
        assert!(same_message(&moved, &result("c1", "a very long output")));
        assert!(!same_message(&result("c1", "out"), &result("c1", "other")));
    }

    #[test]
    fn a_catch_up_counts_its_user_messages_as_turns() {
        let turn = [
            said("user", "a", 1),
            said("assistant", "b", 2),
            said("user", "c", 3),
        ];
        assert_eq!(turns_in(&turn), 2);
        assert_eq!(turns_in(&turn[1..2]), 1, "at least one");
    }
}
