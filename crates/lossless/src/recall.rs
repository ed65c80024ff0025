//! Recall at assembly: what the history holds about a new user turn, brought into its prompt
//! for a model that never calls a recall tool.
//!
//! For each new user turn (the host's `prompt`, which OpenClaw hands `assemble` before the turn
//! is in its transcript), the history the recall tools reach is searched — by the turn's
//! content words (its common words left out) and by the meaning of the whole turn apart, as
//! hybrid grep fuses them, a date the turn names first — and the
//! best few messages that the assembled context does not already show are added after the
//! context, as one user-role block: each excerpt with its id (for `vilvona_expand` and
//! `vilvona_describe`), its time and role, and the part of the message that matched (the whole
//! of a short message; the sentences around the match of a long one).
//!
//! Nothing is added unless the best match by words stands out from the crowd: a score well
//! above the history's typical match ([`TEXT_STANDOUT`] times the [`REFERENCE_RANK`]-th). A
//! turn of routine work, whose words match much of the history alike, gets nothing; a question
//! about something said once does, and then the block holds that match first, then what
//! hybrid search ranks first (as `vilvona_grep` would answer: meaning counts there), up to
//! `maxItems` within `maxTokens`.
//! Meaning does not open recall: in the built-in model's crowded space a task's nearest
//! earlier tasks stand as far above the rest as a question's answer does (measured: a meaning
//! gate opened recall on young coding sessions' routine turns and added nothing on LoCoMo).
//!
//! The block is counted inside the prompt's budget (it takes no more than the room the context
//! leaves, nor `maxTokens`), sits after the context (never in `systemPromptAddition`, which the
//! host puts before the history), and is the same for every request of one turn (remembered by
//! the prompt): a tool loop keeps its cached prefix. What was recalled is kept for the turn's
//! record (`context history`, the panel). No model call.

use std::collections::HashSet;

use vilvona_core::admin::{RecalledItem, ToolCaller};
use vilvona_core::engine::EngineError;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;
use vilvona_summarize::{STOP_WORDS, format_utc_rfc3339};

use crate::config::RecallScope;
use crate::engine::LosslessEngine;
use crate::errors::{ToolError, store_error};
use crate::memory::RecallBlock;
use crate::tools::{Scope, message_id_string};

/// How many hits of each search (words, meaning) are read: the reference rank's, and more.
const SEARCH_DEPTH: usize = 30;

/// The rank of the hit the others are measured against: the history's typical match.
const REFERENCE_RANK: usize = 10;

/// How many times the reference's BM25 score the best text hit must reach. Measured (BENCHMARKS.md,
/// section 5): a coding session's next task matches its earlier ones at 1.1–1.2 times the
/// typical match, a question about one of them at 2.4–4. The sweep, made when the question's
/// every word was searched: at 1.3 LoCoMo's development half had 0.734 of its evidence in the
/// prompt (0.738 at 1.2, where a quarter of the coding session's tasks open recall; 0.716 at
/// 1.4, 0.687 at 1.5); searched by its content words, 0.751 at 1.3.
const TEXT_STANDOUT: f32 = 1.3;

/// A message no longer than this is shown whole (bytes); a longer one, this much around its
/// match.
const EXCERPT_BYTES: usize = 420;

/// The fewest tokens worth a block: less room than this, and nothing is added.
const MIN_BLOCK_TOKENS: u64 = 48;

/// The block's first line.
const BLOCK_HEAD: &str = "<recall note=\"what the history holds about the request below, found by vilvona; not part of the conversation. vilvona_describe or vilvona_expand an id to read more\">";

/// The block's last line.
const BLOCK_TAIL: &str = "</recall>";

/// A hit that stood out, with the score it was chosen by.
struct Chosen {
    hit: SearchHit,
    score: f32,
}

/// Whether a list's best hit stands out from the list's typical match (its
/// [`REFERENCE_RANK`]-th hit): a list of fewer hits than that matched words that are rare in
/// the history, and stands out when it holds any.
fn stands_out(hits: &[SearchHit], beats: impl Fn(f32, f32) -> bool) -> bool {
    let Some(best) = hits.first() else {
        return false;
    };
    match hits.get(REFERENCE_RANK - 1) {
        Some(reference) => beats(best.score, reference.score),
        None => beats(best.score, f32::NEG_INFINITY),
    }
}

/// A failure while recall at assembly searches: the store's or the engine's as it was, so a
/// transient one (a busy store, a restarting server) stays transient and is not taken for a
/// broken engine.
fn failure(error: ToolError) -> EngineError {
    match error {
        ToolError::Store(error) => store_error("recall at assembly", error),
        ToolError::Engine(error) => error,
        refused => EngineError::caused_by("lossless recall at assembly", refused),
    }
}

/// A text hit stands out: at least the least score that counts, and well above the reference.
fn text_stands_out(score: f32, reference: f32) -> bool {
    score >= 1.0 && score >= TEXT_STANDOUT * reference
}

/// The words of `text` that say what it is about, in order: all but the common ones
/// ([`STOP_WORDS`]) and Latin words under three letters without a digit.
fn content_words(text: &str) -> String {
    text.split_whitespace()
        .filter(|word| {
            let bare = word
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase();
            let latin = bare.is_ascii();
            !bare.is_empty()
                && !STOP_WORDS.contains(&bare.as_str())
                && (!latin || bare.len() >= 3 || bare.chars().any(|c| c.is_ascii_digit()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The words of `text` (runs of letters and digits) with where each starts.
fn words_at(text: &str) -> Vec<(usize, &str)> {
    let mut words = Vec::new();
    let mut start = None;
    for (at, c) in text.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(at),
            (false, Some(from)) => {
                words.push((from, &text[from..at]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        words.push((from, &text[from..]));
    }
    words
}

/// Where the rarest word of `query` (three letters or more) first stands in `text`: the place a
/// question is about ("port" once, "the" everywhere); `None` when none does.
fn anchor(text: &str, query: &str) -> Option<usize> {
    let words = words_at(text);
    words_at(query)
        .into_iter()
        .filter(|(_, word)| word.chars().count() >= 3)
        .filter_map(|(_, wanted)| {
            let found: Vec<usize> = words
                .iter()
                .filter(|(_, word)| word.to_lowercase() == wanted.to_lowercase())
                .map(|(at, _)| *at)
                .collect();
            Some((
                found.len(),
                std::cmp::Reverse(wanted.len()),
                *found.first()?,
            ))
        })
        .min()
        .map(|(_, _, at)| at)
}

/// The part of `text` an excerpt shows: all of it when short, else [`EXCERPT_BYTES`] around
/// the rarest word of `query` it holds, else around where `snippet` (a search's snippet, with
/// its «marks») lies in it.
fn excerpt(text: &str, query: &str, snippet: &str) -> String {
    let text = text.trim();
    if text.len() <= EXCERPT_BYTES {
        return text.to_owned();
    }
    // Where the snippet lies: found whole (its opening words may repeat earlier in the text),
    // else by its opening words.
    let plain: String = snippet
        .trim_matches('…')
        .chars()
        .filter(|c| *c != '«' && *c != '»')
        .collect();
    let probe: String = plain.chars().take(40).collect();
    let at = anchor(text, query)
        .or_else(|| {
            [plain.trim(), probe.trim()]
                .into_iter()
                .filter(|part| !part.is_empty())
                .find_map(|part| text.find(part))
        })
        .unwrap_or(0);
    let mut start = at.saturating_sub(EXCERPT_BYTES / 4);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + EXCERPT_BYTES).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}{}{}",
        if start > 0 { "…" } else { "" },
        &text[start..end],
        if end < text.len() { "…" } else { "" }
    )
}

impl LosslessEngine {
    /// The recall block for a turn whose user says `prompt` (see the module): `None` when
    /// recall at assembly is off, nothing stands out, or there is no room for it. `held` are
    /// the messages the assembled context shows; `room` the tokens it leaves.
    pub(crate) async fn recall_for_turn(
        &self,
        caller: &ToolCaller,
        prompt: &str,
        held: &HashSet<MessageId>,
        room: u64,
    ) -> Result<Option<RecallBlock>, EngineError> {
        let settings = &self.inner.config.assembly_recall;
        let room = room.min(settings.max_tokens);
        let query = within_query_bounds(prompt.trim());
        if settings.scope == RecallScope::Off || query.is_empty() || room < MIN_BLOCK_TOKENS {
            return Ok(None);
        }
        let scope = match self.recall_scope(caller, settings.scope).await {
            Ok(scope) => scope,
            // A failure of the store or the engine is one (a transient one stays transient).
            Err(error @ (ToolError::Store(_) | ToolError::Engine(_))) => {
                return Err(failure(error));
            }
            // A refusal (a key of another agent, say): no recall, as the tools would refuse.
            Err(_) => return Ok(None),
        };
        let chosen = self.chosen_hits(&scope, query, held).await?;
        let estimator = &*self.inner.estimator;
        let mut lines = vec![BLOCK_HEAD.to_owned()];
        let mut items = Vec::new();
        let mut tokens = estimator.text_tokens(BLOCK_HEAD) + estimator.text_tokens(BLOCK_TAIL);
        for Chosen { hit, score } in chosen.into_iter().take(settings.max_items) {
            let HitSource::Message { id, role, .. } = &hit.source else {
                continue;
            };
            let text = match self.inner.store.message(*id).await {
                Ok(Some(message)) => message.text(),
                _ => continue,
            };
            let shown = excerpt(&text, query, &hit.snippet);
            let line = format!(
                "[{} · {} · {role}] {shown}",
                message_id_string(*id),
                format_utc_rfc3339(hit.time_ms)
            );
            let cost = estimator.text_tokens(&line);
            if tokens + cost > room {
                break;
            }
            tokens += cost;
            lines.push(line);
            items.push(RecalledItem {
                id: message_id_string(*id),
                score: f64::from(score),
                tokens: cost,
            });
        }
        if items.is_empty() {
            return Ok(None);
        }
        lines.push(BLOCK_TAIL.to_owned());
        let message = AgentMessage::user_text(lines.join("\n"));
        let tokens = estimator.message_tokens(&message);
        Ok(Some(RecallBlock {
            message,
            tokens,
            items,
        }))
    }

    /// Where recall at assembly searches, by its setting.
    async fn recall_scope(
        &self,
        caller: &ToolCaller,
        scope: RecallScope,
    ) -> Result<Scope, ToolError> {
        let mut reach = self.scope(caller).await?;
        match scope {
            RecallScope::Session => {
                reach.reach = vec![(self.inner.config.agent_id.clone(), vec![reach.own.id])];
            }
            RecallScope::Agent => {
                let all = self
                    .store()
                    .conversations(Some(&self.inner.config.agent_id))
                    .await?
                    .into_iter()
                    .map(|conversation| conversation.id)
                    .collect();
                reach.reach = vec![(self.inner.config.agent_id.clone(), all)];
            }
            RecallScope::Key | RecallScope::Off => {}
        }
        Ok(reach)
    }

    /// The messages that stand out for `query`, best first, fused as hybrid grep fuses; none
    /// the context shows already.
    async fn chosen_hits(
        &self,
        scope: &Scope,
        query: &str,
        held: &HashSet<MessageId>,
    ) -> Result<Vec<Chosen>, EngineError> {
        // By words, the turn's content words: a question's "who", "for" and "gets" match every
        // tool output that loops and reads, and would outrank the one message it is about.
        let content = content_words(query);
        let search = |mode, text: &str| SearchQuery {
            agent_id: String::new(),
            conversations: Vec::new(),
            text: text.to_owned(),
            mode,
            target: SearchTarget::Messages,
            since_ms: None,
            before_ms: None,
            limit: SEARCH_DEPTH,
            order: SearchOrder::Relevance,
        };
        if content.is_empty() {
            return Ok(Vec::new());
        }
        let (text, _) = self
            .search_dated(scope, search(SearchMode::Text, &content))
            .await
            .map_err(failure)?;
        // No model (or none available now): words alone.
        let meaning = match self
            .search_dated(scope, search(SearchMode::Semantic, query))
            .await
        {
            Ok((hits, _)) => hits,
            Err(ToolError::InvalidArguments(_) | ToolError::Unavailable(_)) => Vec::new(),
            Err(error) => return Err(failure(error)),
        };
        let not_held = |hit: &SearchHit| match &hit.source {
            HitSource::Message { id, .. } => !held.contains(id),
            HitSource::Summary { .. } => false,
        };
        // Asked about something the history holds apart from the rest: its best match by
        // words stands out.
        if !stands_out(&text, text_stands_out) {
            return Ok(Vec::new());
        }
        // The hit that stood out leads (what hybrid search ranks first may be another, close by
        // meaning to the words around the question's), then the rest as hybrid search ranks them.
        let lead = text.first().map(|hit| hit.source.clone());
        let mut fused = fuse_hits(text, meaning, &search(SearchMode::Hybrid, query));
        if let Some(at) = fused
            .iter()
            .position(|hit| Some(&hit.source) == lead.as_ref())
        {
            fused[..=at].rotate_right(1);
        }
        Ok(fused
            .into_iter()
            .filter(not_held)
            .map(|hit| Chosen {
                score: hit.score,
                hit,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: i64, score: f32) -> SearchHit {
        SearchHit {
            source: HitSource::Message {
                id: MessageId(id),
                seq: id as u64,
                role: "user".to_owned(),
            },
            conversation: ConversationId(1),
            time_ms: 0,
            score,
            snippet: String::new(),
            file: None,
            covered_by: None,
        }
    }

    #[test]
    fn only_a_best_match_that_stands_out_from_the_typical_one_opens_recall() {
        // Routine work: twenty rows matching about alike.
        let alike: Vec<SearchHit> = (0..20).map(|n| hit(n, 6.0 - n as f32 * 0.1)).collect();
        assert!(!stands_out(&alike, text_stands_out));
        // A question about something said once: one row far above the rest.
        let mut once = vec![hit(99, 14.0)];
        once.extend((0..20).map(|n| hit(n, 4.0 - n as f32 * 0.05)));
        assert!(stands_out(&once, text_stands_out));
        // Rare words: a few rows match at all.
        assert!(stands_out(&[hit(1, 3.0), hit(2, 2.5)], text_stands_out));
        assert!(!stands_out(&[], text_stands_out));
    }

    #[test]
    fn a_block_opens_as_a_host_history_is_told_from_the_engines_own() {
        assert!(BLOCK_HEAD.starts_with(crate::render::RECALL_BLOCK_OPENING));
    }

    #[test]
    fn a_short_message_is_shown_whole_and_a_long_one_around_its_match() {
        assert_eq!(
            excerpt("  Caroline: I went to the support group.  ", "", ""),
            "Caroline: I went to the support group."
        );
        let long = format!(
            "{} the canary fleet moved to eu-north-3 {}",
            "a".repeat(900),
            "b".repeat(900)
        );
        let shown = excerpt(
            &long,
            "",
            "…aaaa the «canary» «fleet» moved to eu-north-3 bbbb",
        );
        assert!(
            shown.contains("the canary fleet moved to eu-north-3"),
            "{shown}"
        );
        assert!(shown.len() <= EXCERPT_BYTES + 8, "{}", shown.len());
        assert!(shown.starts_with('…') && shown.ends_with('…'));
    }

    #[test]
    fn a_question_is_searched_by_its_content_words() {
        assert_eq!(
            content_words("Who gets paged for alerts these days?"),
            "paged alerts days?"
        );
        assert_eq!(
            content_words("Is it v2 or 3.1? 告警阈值"),
            "v2 3.1? 告警阈值"
        );
        assert_eq!(content_words("Who is it?"), "");
    }

    /// A long message whose notes repeat: the excerpt is around the question's rarest word, not
    /// the first place the snippet's opening words stand (they stand in every repetition).
    #[test]
    fn a_long_message_is_shown_around_the_rarest_word_the_question_names() {
        let filler = "the worker queue drains the batch before the lease expires. ".repeat(8);
        let long = format!("{filler} By the way: the staging database moved to port 6543.");
        let shown = excerpt(
            &long,
            "Which port does the staging database listen on?",
            "…before the lease expires. By the way: the «staging» «database»",
        );
        assert!(shown.contains("port 6543"), "{shown}");
        assert_eq!(anchor("Port 80, then port 81; PORTS", "port"), Some(0));
        assert_eq!(anchor("nothing here", "which port"), None);
    }
}
