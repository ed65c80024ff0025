//! The whole prompt is the budget. A host's prompt holds its own system prompt, tools and the
//! current prompt around the engine's context (OpenClaw 2026.9: 10–11k tokens of system prompt
//! alone), and the host checks the *whole* prompt against its limits. What the host says and
//! observes about its prompt is kept per conversation ([`HostPrompt`]), and compaction and
//! assembly work to the [`Limits`] it gives.
//!
//! The host fields read (each optional):
//! - `assemble`: `tokenBudget` (else `runtimeSettings.limits.promptTokenBudget`), the room the
//!   host gives the engine's context; the smallest of one turn's assembles is kept (OpenClaw
//!   assembles once against its real message budget and again, inside the tool loop, against
//!   budgets that leave out its system prompt). A `promptTokenBudget` above the call's own
//!   budget is the whole prompt's budget.
//! - `commitTurn` / `afterTurn`: the turn's messages; the last assistant message's `usage`
//!   (input + cache read + cache write) is what the provider counted for the whole prompt of
//!   that call. Minus the engine's own share of that request (its context before the turn and
//!   the turn's messages before that answer), it is the host's overhead. The turn's user
//!   message is what the next prompt is expected to add.
//! - `compact`: `tokenBudget` and `runtimeSettings.limits.promptTokenBudget` (the whole prompt's
//!   budget), `currentTokenCount` (the host's count of the whole prompt: minus the context, the
//!   overhead).

use serde::{Deserialize, Serialize};
use vilvona_core::engine::RuntimeSettings;
use vilvona_core::message::AgentMessage;
use vilvona_core::tokens::TokenEstimator;

use crate::config::LosslessConfig;

/// The store state key under which a conversation's [`HostPrompt`] is kept.
pub(crate) const HOST_PROMPT: &str = "host.prompt";

/// The key earlier versions kept the host's budget under (read when `host.prompt` is absent).
pub(crate) const HOST_BUDGET: &str = "host.tokenBudget";

/// What the host has said and observed about its prompt for one conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostPrompt {
    /// The room the host gives the engine's context (the smallest budget of its latest turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
    /// The whole prompt's budget: what the host checks its system prompt, tools, the current
    /// prompt and the engine's context against together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// What the host adds around the engine's context, as last observed: the provider's
    /// count when a turn reported usage (`overhead_observed`), else the host's own estimate.
    /// It follows the latest observation down as well as up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<u64>,
    /// Whether `overhead` came from a provider's usage (what the provider counted), not from
    /// a host's estimate (a compaction's `currentTokenCount`). A provider's count is not
    /// replaced by an estimate: OpenClaw's preflight estimate adds a safety margin of its own
    /// and, without usage, counts the history it holds rather than the prompt it sends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overhead_observed: bool,
    /// The provider's latest counts of the overhead, newest first (0: none yet). The overhead
    /// is the largest of them: a turn whose usage belongs to a smaller call than the one the
    /// engine measures against (a count from before a mid-turn compaction, a provider that
    /// reports its first call's usage) lowers it only once four turns agree.
    #[serde(default, skip_serializing_if = "no_observations")]
    pub observations: [u64; OBSERVATIONS],
    /// The latest user prompt: what the next turn adds before the engine's context is assembled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<u64>,
    /// What the host keeps free of the window for the model's output (its reserve:
    /// `runtimeSettings.limits.maxOutputTokens` beside a budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<u64>,
    /// The context's tokens as the host's latest model call saw them (the context a turn was
    /// stored on, with the turn): what a later count of the host's is measured against, even
    /// after a compaction made it stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<u64>,
}

/// Where compaction starts, where it stops, and what must always fit, in tokens of the engine's
/// own context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A routine pass runs above this.
    pub trigger: u64,
    /// A pass compacts down to this.
    pub goal: u64,
    /// The room the context is planned to: trigger and goal are shares of it, and the fresh
    /// tail and summaries are sized from it.
    pub share: u64,
    /// The most the context may hold: what the window leaves beside the host's own prompt.
    /// Assembly fits it, and a compaction the host asks for reaches it whatever it takes.
    pub ceiling: u64,
}

impl Limits {
    /// Limits for a context that may hold `budget` tokens, the host's prompt aside.
    pub fn of_budget(budget: u64, config: &LosslessConfig) -> Limits {
        HostPrompt {
            budget: Some(budget),
            ..HostPrompt::default()
        }
        .limits(config)
    }
}

/// How many of the provider's latest overhead counts the overhead is taken from.
pub(crate) const OBSERVATIONS: usize = 4;

fn no_observations(observations: &[u64; OBSERVATIONS]) -> bool {
    observations.iter().all(|count| *count == 0)
}

/// The most of the window (less the reply's reserve) that a host's estimate of its own prompt
/// may claim; the rest stays the engine's context.
pub(crate) const ESTIMATED_OVERHEAD_SHARE: f64 = 0.75;

fn share(tokens: u64, ratio: f64) -> u64 {
    (tokens as f64 * ratio) as u64
}

impl HostPrompt {
    /// The limits for the engine's context.
    ///
    /// - The ceiling is hard: the window less the host's observed overhead and the reply's
    ///   reserve when the window and overhead are known (a provider refuses a prompt that
    ///   leaves the reply no room, or the host cuts the reply to what is left), else the host's
    ///   budget (else the window, else
    ///   the configured `defaultTokenBudget`). A host's budget is its own estimate, and may be
    ///   far below what its window holds (OpenClaw at 16k computes 1 token: it counts its
    ///   system prompt a fifth larger than it is, and that alone exceeds its prompt budget).
    /// - The share is what compaction plans to: the host's budget, and the whole prompt's
    ///   limit (the window less its reserve) less the overhead and the next prompt, whichever
    ///   is tighter, at most the ceiling. The trigger is `contextThreshold` of it, the goal
    ///   `targetRatio`.
    pub fn limits(&self, config: &LosslessConfig) -> Limits {
        let overhead = self.overhead_estimate();
        let observed_room = match (self.window, self.overhead) {
            (Some(window), Some(_)) => Some(
                window
                    .saturating_sub(overhead)
                    .saturating_sub(self.reserve.unwrap_or(0)),
            ),
            _ => None,
        };
        let ceiling = observed_room
            .or(self.budget)
            .or(self.window)
            .unwrap_or(config.default_token_budget)
            .max(1);
        let whole_limit = self.window.map(|window| {
            window
                .saturating_sub(self.reserve.unwrap_or(0))
                .saturating_sub(overhead + self.prompt.unwrap_or(0))
        });
        let planned = match (self.budget, whole_limit) {
            (Some(budget), Some(whole)) => budget.min(whole),
            (budget, whole) => budget.or(whole).unwrap_or(config.default_token_budget),
        };
        let planned = planned.min(ceiling);
        let trigger = share(planned, config.context_threshold);
        Limits {
            trigger,
            goal: share(planned, config.target_ratio).min(trigger),
            share: planned,
            ceiling,
        }
    }

    /// The overhead the limits use. A provider's count is taken as it is; a host's estimate
    /// never claims more than [`ESTIMATED_OVERHEAD_SHARE`] of what the window leaves beside the
    /// reply's reserve, so an estimate that grows with the host's own history (a provider
    /// without usage) cannot starve the context to nothing.
    pub fn overhead_estimate(&self) -> u64 {
        let overhead = self.overhead.unwrap_or(0);
        match self.window {
            Some(window) if !self.overhead_observed => {
                let room = window.saturating_sub(self.reserve.unwrap_or(0));
                overhead.min(share(room, ESTIMATED_OVERHEAD_SHARE))
            }
            _ => overhead,
        }
    }

    /// The call's whole-prompt budget: a `promptTokenBudget` above the budget the call gives
    /// the engine's context.
    /// Beside a budget the call gives the context, its reserve for the model's output.
    pub(crate) fn note_window(&mut self, settings: Option<&RuntimeSettings>, budget: Option<u64>) {
        let limits = settings.and_then(|settings| settings.limits.as_ref());
        let stated = limits
            .and_then(|limits| limits.prompt_token_budget)
            .filter(|window| *window > 0);
        if let Some(window) = stated.filter(|window| budget.is_none_or(|budget| *window > budget)) {
            self.window = Some(window);
        }
        if let Some(reserve) = limits
            .and_then(|limits| limits.max_output_tokens)
            .filter(|reserve| *reserve > 0 && budget.is_some())
        {
            self.reserve = Some(reserve);
        }
    }

    /// What a turn's messages show: the provider's count of the last call's whole prompt
    /// (`usage` of the last assistant message that has one) against the engine's share of that
    /// request (`context_before` — the context it was assembled from — and the turn's messages
    /// before that answer); and the turn's prompt, what the next one is expected to add. A count
    /// below the engine's own share says nothing (a host that reports another call's usage).
    pub(crate) fn note_turn(
        &mut self,
        messages: &[AgentMessage],
        context_before: u64,
        estimator: &dyn TokenEstimator,
    ) {
        let tokens: Vec<u64> = messages
            .iter()
            .map(|message| estimator.message_tokens(message))
            .collect();
        self.seen = Some(context_before + tokens.iter().sum::<u64>());
        if let Some(prompt) = messages
            .iter()
            .position(|message| matches!(message, AgentMessage::User(_)))
        {
            self.prompt = Some(tokens[prompt]);
        }
        let observed =
            messages
                .iter()
                .enumerate()
                .rev()
                .find_map(|(index, message)| match message {
                    AgentMessage::Assistant(assistant) => assistant
                        .usage
                        .as_ref()
                        .and_then(|usage| usage.prompt_tokens())
                        .map(|tokens| (index, tokens)),
                    _ => None,
                });
        if let Some((index, observed)) = observed {
            let own = context_before + tokens[..index].iter().sum::<u64>();
            if observed > own {
                self.observations.rotate_right(1);
                self.observations[0] = observed - own;
                self.overhead = self.observations.iter().copied().max();
                self.overhead_observed = true;
            }
        }
    }

    /// What a compaction call shows: the whole prompt's budget, and the host's count of the
    /// whole prompt (its latest request, and the prompt to come) against the context that
    /// request held (`seen`, else the context's `own` tokens now). A count taken before the
    /// engine's last compaction is measured against what that request held. The count sets
    /// the overhead only while no provider's count is known, and then as the latest estimate,
    /// down as well as up: a host's estimate is generous (OpenClaw's preflight adds a fifth),
    /// and a ratchet on it would shrink the context for good.
    pub(crate) fn note_compaction(
        &mut self,
        token_budget: Option<u64>,
        settings: Option<&RuntimeSettings>,
        current_token_count: Option<u64>,
        own: u64,
    ) {
        if let Some(window) = token_budget.filter(|budget| *budget > 0) {
            self.window = Some(window);
        }
        self.note_window(settings, None);
        let held = self.seen.unwrap_or(own) + self.prompt.unwrap_or(0);
        if let Some(current) = current_token_count.filter(|count| *count > held)
            && !self.overhead_observed
        {
            self.overhead = Some(current - held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round shares, whatever the defaults are.
    fn config() -> LosslessConfig {
        LosslessConfig {
            context_threshold: 0.75,
            target_ratio: 0.6,
            ..LosslessConfig::default()
        }
    }

    #[test]
    fn a_budget_alone_gives_the_configured_shares_of_it() {
        let limits = Limits::of_budget(10_000, &config());
        assert_eq!(
            limits,
            Limits {
                trigger: 7_500,
                goal: 6_000,
                share: 10_000,
                ceiling: 10_000
            }
        );
    }

    #[test]
    fn the_hosts_overhead_comes_out_of_the_whole_prompt() {
        // OpenClaw at a 32k window: 10.5k of system prompt, a 1k prompt, an 8k reserve, and
        // assemble told nothing smaller than the window.
        let prompt = HostPrompt {
            budget: Some(31_000),
            window: Some(32_000),
            overhead: Some(10_500),
            prompt: Some(1_000),
            reserve: Some(8_000),
            seen: None,
            overhead_observed: true,
            observations: [10_500, 0, 0, 0],
        };
        let limits = prompt.limits(&config());
        assert_eq!(
            limits.ceiling,
            32_000 - 10_500 - 8_000,
            "the reply keeps its reserve"
        );
        assert_eq!(limits.share, 32_000 - 8_000 - 11_500);
        assert_eq!(limits.trigger, limits.share * 3 / 4);
    }

    /// The remembered overhead follows what the host observes, down as well as up: a
    /// provider's count is kept against the host's generous estimates, and without usage the
    /// latest estimate counts, bounded so the context keeps room.
    #[test]
    fn the_overhead_follows_observations_without_a_ratchet() {
        let estimator = vilvona_core::tokens::HeuristicEstimator;
        let turn = |input: u64| -> Vec<AgentMessage> {
            let assistant = serde_json::json!({
                "role": "assistant",
                "content": [{"type": "text", "text": "done"}],
                "usage": {"input": input, "output": 10},
            });
            vec![
                serde_json::from_value(serde_json::json!({"role": "user", "content": "go on"}))
                    .unwrap(),
                serde_json::from_value(assistant).unwrap(),
            ]
        };
        let mut prompt = HostPrompt {
            window: Some(32_000),
            ..HostPrompt::default()
        };
        // Usage of 10k over a 1k context: about 9k of overhead, observed.
        prompt.note_turn(&turn(10_000), 1_000, &estimator);
        let observed = prompt.overhead.unwrap();
        assert!((8_900..9_000).contains(&observed), "{observed}");
        // OpenClaw's preflight estimates 25k: the provider's count stays.
        prompt.note_compaction(Some(32_000), None, Some(25_000), 1_000);
        assert_eq!(prompt.overhead, Some(observed));
        // Smaller counts later lower it, once the last four agree.
        for _ in 0..OBSERVATIONS - 1 {
            prompt.note_turn(&turn(6_000), 1_000, &estimator);
            assert_eq!(prompt.overhead, Some(observed));
        }
        prompt.note_turn(&turn(6_000), 1_000, &estimator);
        assert!(prompt.overhead.unwrap() < 5_000);
        // A larger one raises it at once.
        prompt.note_turn(&turn(12_000), 1_000, &estimator);
        assert!(prompt.overhead.unwrap() > 10_000);

        // No usage at all: the estimate is the latest count, down as well as up, and never
        // more than three quarters of the window.
        let mut prompt = HostPrompt {
            window: Some(32_000),
            seen: Some(2_000),
            ..HostPrompt::default()
        };
        prompt.note_compaction(Some(32_000), None, Some(14_000), 2_000);
        assert_eq!(prompt.overhead, Some(12_000));
        prompt.note_compaction(Some(32_000), None, Some(60_000), 2_000);
        assert_eq!(prompt.overhead, Some(58_000));
        assert_eq!(prompt.overhead_estimate(), 24_000);
        assert_eq!(prompt.limits(&config()).ceiling, 8_000);
        prompt.note_compaction(Some(32_000), None, Some(13_000), 2_000);
        assert_eq!(
            prompt.overhead,
            Some(11_000),
            "the estimate came down again"
        );
    }

    #[test]
    fn the_hosts_budget_plans_but_only_the_window_bounds() {
        // OpenClaw's message budget at 32k, then at 16k, where its estimate leaves 1 token.
        let at_32k = HostPrompt {
            budget: Some(10_700),
            window: Some(32_000),
            overhead: Some(10_500),
            prompt: Some(1_000),
            reserve: Some(8_000),
            seen: None,
            overhead_observed: true,
            observations: [10_500, 0, 0, 0],
        };
        let limits = at_32k.limits(&config());
        assert_eq!((limits.share, limits.ceiling), (10_700, 13_500));
        let at_16k = HostPrompt {
            budget: Some(1),
            window: Some(16_000),
            reserve: Some(4_000),
            ..at_32k
        };
        let limits = at_16k.limits(&config());
        assert_eq!(
            (limits.share, limits.trigger, limits.ceiling),
            (1, 0, 1_500)
        );
        let none = HostPrompt::default().limits(&config());
        assert_eq!(none.ceiling, config().default_token_budget);
    }
}
