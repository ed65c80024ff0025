//! What the engine keeps in memory about each conversation ([`Memory`], behind the engine's
//! one lock on them), and the values the job modules keep there: catch-up's state and the
//! turn's recall block. A leaf: the job modules and the engine take these from here.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vilvona_core::admin::RecalledItem;
use vilvona_core::message::AgentMessage;

use crate::budget::HostPrompt;

/// What the engine keeps in memory about one conversation: caches of its stored state, and
/// what the current turn noted before its commit. A conversation let go (idle past
/// `SESSION_CACHE`) reads what it needs from the store again; one whose compaction lock is
/// held is never let go, so two callers never hold two locks for one conversation.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// What the host said and observed about its prompt (the store's `host.prompt`).
    pub(crate) host_prompt: Option<HostPrompt>,
    /// The smallest budget the host gave the assemblies of the current turn (kept as the
    /// conversation's budget when the turn is committed).
    pub(crate) turn_budget: Option<u64>,
    /// How many of the host's leading messages the conversation's seeded context stands for
    /// (a fork child's, a session begun anew's; 0 for the others): see `crate::subagents`.
    pub(crate) host_offset: Option<u64>,
    /// What the last assembly held, tokens by kind: the turn recorded next keeps it (see
    /// `crate::turns`).
    pub(crate) assembled_kinds: Option<BTreeMap<String, u64>>,
    /// What catch-up took in (the store's `catchUp`): see `crate::catch_up`.
    pub(crate) catch_up: Option<CatchUp>,
    /// Whether this process said it took in a turn the host never committed (said once).
    pub(crate) catch_up_said: bool,
    /// Whether this process said the host's history does not reach the store's last message.
    pub(crate) catch_up_unmet_said: bool,
    /// The recall block of the turn being assembled, by its prompt's hash: every request of
    /// one turn carries the same (see `crate::recall`).
    pub(crate) recall: Option<(u64, Option<RecallBlock>)>,
    /// Serializes compaction (after_turn, compact, commit_turn and catch-up can race).
    pub(crate) compaction_lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl Memory {
    /// Whether the conversation's memory may be let go: nobody holds or waits for its
    /// compaction lock.
    pub(crate) fn may_go(&self) -> bool {
        self.compaction_lock
            .as_ref()
            .is_none_or(|lock| Arc::strong_count(lock) == 1)
    }
}

/// What catch-up took in for a conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CatchUp {
    /// Turns taken in from the host's history at a later turn (its user messages; at least
    /// one a time).
    pub(crate) turns: u64,
    /// Messages taken in so.
    pub(crate) messages: u64,
    /// Whether the host's commits are missing now: history was taken in since the last commit
    /// (or the session's history was first taken from an assembly, before any commit).
    pub(crate) missing: bool,
}

/// A turn's recall block.
#[derive(Clone, Debug)]
pub(crate) struct RecallBlock {
    /// The block, a user-role message.
    pub(crate) message: AgentMessage,
    /// Its tokens.
    pub(crate) tokens: u64,
    /// What it holds.
    pub(crate) items: Vec<RecalledItem>,
}
