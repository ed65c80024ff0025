//! The built-in summarization compaction: one structured summary of older history, the most
//! recent messages kept verbatim. Any engine can call [`compact_transcript`] in "delegating
//! mode", as OpenClaw plugins call `delegateCompactionToRuntime`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use vilvona_core::clock::now_ms;
use vilvona_core::engine::{CompactDetails, CompactReason, CompactResult};
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{
    SourceItem, SummarizeError, Summarizer, SummaryKind, SummaryLevel, SummaryRequest,
};
use vilvona_core::tokens::TokenEstimator;
use vilvona_summarize::{format_utc_rfc3339, source_item};
use vilvona_transcript::{
    CompactionEntry, Entry, Located, SessionHeader, TranscriptError, TranscriptWriter,
    read_transcript,
};

use crate::cut::{EntryKind, find_cut_within};
use crate::structure::{StructuredSummary, build_summary};

/// Settings of the built-in compaction (`agents.defaults.compaction.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionSettings {
    /// Recent history kept verbatim.
    pub keep_recent_tokens: u64,
    /// The model's window, for chunk sizes (the token budget when the host gives one).
    pub context_window: u64,
    /// Move the compacted history to a successor transcript instead of appending to this one.
    pub truncate_after_compaction: bool,
    /// Hard cap on the summary's length.
    pub summary_max_chars: usize,
    /// The prompt budget of the run that asked for compaction (window − reserve − prompt
    /// pressure), when known. The kept tail and the summary are then capped to shares of it,
    /// as OpenClaw caps its retention when the window is known: one compaction leaves room for
    /// many turns instead of running again on the next.
    pub prompt_budget: Option<u64>,
}

/// Share of the prompt budget the kept recent tail may take.
const KEPT_TAIL_SHARE: f64 = 0.4;
/// Share of the prompt budget the kept tail may never exceed where a later cut exists: with
/// the summary's share, a compaction leaves at most three quarters of the budget, so it frees
/// at least a quarter of it.
const MAX_KEPT_SHARE: f64 = 0.6;
/// Share of the prompt budget the summary may take (in tokens, ≈ 4 characters each).
const SUMMARY_SHARE: f64 = 0.15;

impl CompactionSettings {
    /// Recent history kept verbatim: `keep_recent_tokens`, capped to the budget's share.
    pub fn kept_tail_tokens(&self) -> u64 {
        match self.prompt_budget {
            Some(budget) => self
                .keep_recent_tokens
                .min((budget as f64 * KEPT_TAIL_SHARE) as u64)
                .max(1),
            None => self.keep_recent_tokens,
        }
    }

    /// The most the kept tail may hold when a later valid cut allows it.
    pub fn max_kept_tokens(&self) -> u64 {
        self.prompt_budget
            .map_or(u64::MAX, |budget| (budget as f64 * MAX_KEPT_SHARE) as u64)
    }

    /// The summary's cap in characters: `summary_max_chars`, capped to the budget's share.
    pub fn summary_chars(&self) -> usize {
        match self.prompt_budget {
            Some(budget) => self
                .summary_max_chars
                .min((budget as f64 * SUMMARY_SHARE * 4.0) as usize)
                .max(400),
            None => self.summary_max_chars,
        }
    }
}

impl Default for CompactionSettings {
    fn default() -> CompactionSettings {
        CompactionSettings {
            keep_recent_tokens: 20_000,
            context_window: 128_000,
            truncate_after_compaction: false,
            summary_max_chars: 16_000,
            prompt_budget: None,
        }
    }
}

/// One compaction call.
#[derive(Clone, Copy, Debug)]
pub struct CompactionRequest<'a> {
    pub session_file: &'a Path,
    pub custom_instructions: Option<&'a str>,
    pub settings: &'a CompactionSettings,
    pub summarizer: &'a dyn Summarizer,
    pub estimator: &'a dyn TokenEstimator,
    /// The host needs room now (its provider refused the prompt, or its preflight): when the
    /// usual cut keeps everything, only the newest turn is kept; when the summarizer fails, a
    /// deterministic summary (marked as a fallback) takes its place rather than nothing.
    pub must_make_room: bool,
}

/// Why compaction could not run at all (as opposed to deciding not to).
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error(transparent)]
    Transcript(#[from] TranscriptError),
}

/// The summary's id in `details.summarizer`.
const PROMPT_VERSION: &str = "legacy-structured/v1";

/// Compacts the transcript at `request.session_file`. On success it appends (or, with rotation,
/// writes a successor transcript with) a `compaction` entry whose `firstKeptEntryId` marks the
/// first kept message. If summarization fails, nothing is written and the result says so.
pub async fn compact_transcript(
    request: CompactionRequest<'_>,
) -> Result<CompactResult, CompactionError> {
    let transcript = read_transcript(request.session_file)?;
    let (previous, context) = current_context(&transcript.entries);
    let kinds: Vec<(EntryKind, u64)> = context
        .iter()
        .map(|located| entry_kind_and_tokens(&located.entry, request.estimator))
        .collect();
    let previous_tokens = previous
        .map(|entry| request.estimator.text_tokens(&entry.summary))
        .unwrap_or(0);
    let tokens_before = previous_tokens + kinds.iter().map(|(_, tokens)| tokens).sum::<u64>();
    let cut = find_cut_within(
        &kinds,
        request.settings.kept_tail_tokens(),
        request.settings.max_kept_tokens(),
    )
    .or_else(|| {
        // Room is needed now: keep just the newest unit.
        request
            .must_make_room
            .then(|| find_cut_within(&kinds, 1, 1))
            .flatten()
    });
    let Some(cut) = cut else {
        return Ok(CompactResult::unchanged(
            CompactReason::TooSmall,
            tokens_before,
        ));
    };
    let Some(first_kept_entry_id) = context[cut.first_kept..]
        .iter()
        .find_map(|located| located.entry.id().map(str::to_owned))
    else {
        return Ok(CompactResult::unchanged(
            CompactReason::NoCandidate,
            tokens_before,
        ));
    };
    let history_end = cut.turn_start.unwrap_or(cut.first_kept);
    let history: Vec<&AgentMessage> = messages(&context[..history_end]);
    let turn_prefix: Vec<&AgentMessage> = messages(&context[history_end..cut.first_kept]);

    let critical = match summarize_staged(&request, &history, previous.map(|p| p.summary.as_str()))
        .await
    {
        Ok(text) => text,
        Err(error) if request.must_make_room => {
            tracing::warn!(%error, "compaction summary failed; room is needed now, so a truncated summary stands in");
            truncated_summary(
                &request,
                &history,
                (request.settings.summary_chars() / 4) as u64,
            )
        }
        Err(error) => {
            tracing::warn!(%error, "compaction summary failed; the transcript is unchanged");
            return Ok(CompactResult::failed(CompactReason::SummarizerUnavailable));
        }
    };
    let prefix_summary = if turn_prefix.is_empty() {
        None
    } else {
        match summarize_staged(&request, &turn_prefix, None).await {
            Ok(text) => Some(text),
            Err(_) if request.must_make_room => Some(truncated_summary(
                &request,
                &turn_prefix,
                (request.settings.summary_chars() / 4) as u64,
            )),
            Err(error) => {
                tracing::warn!(%error, "split-turn prefix summary failed; the transcript is unchanged");
                return Ok(CompactResult::failed(CompactReason::SummarizerUnavailable));
            }
        }
    };
    let mut all_summarized = history.clone();
    all_summarized.extend(turn_prefix.iter().copied());
    let mut structured = build_summary(StructuredSummary {
        previous: previous.map(|p| p.summary.as_str()),
        messages: &all_summarized,
        critical_context: &critical,
        split_turn_prefix: prefix_summary.as_deref(),
        max_chars: request.settings.summary_chars(),
    });
    let kept_tokens: u64 = kinds[cut.first_kept..]
        .iter()
        .map(|(_, tokens)| tokens)
        .sum();
    let mut tokens_after = request.estimator.text_tokens(&structured.text) + kept_tokens;
    if tokens_after >= tokens_before && request.must_make_room {
        // The structured summary of a short history is longer than the history: room is
        // needed now, so a truncation within half of what is summarized stands in.
        let summarized = tokens_before.saturating_sub(kept_tokens);
        structured.text = truncated_summary(&request, &all_summarized, summarized / 2);
        tokens_after = request.estimator.text_tokens(&structured.text) + kept_tokens;
    }
    if tokens_after >= tokens_before {
        return Ok(CompactResult::unchanged(
            CompactReason::NoProgress,
            tokens_before,
        ));
    }
    // Still above the budget (the kept tail holds a unit larger than its share): say so, so
    // the caller knows another compaction of this history would not help.
    let over_budget = request
        .settings
        .prompt_budget
        .is_some_and(|budget| tokens_after > budget);
    let details = json!({
        "readFiles": structured.read_files,
        "modifiedFiles": structured.modified_files,
        "summarizer": format!("{}+{PROMPT_VERSION}", request.summarizer.id()),
        "splitTurn": cut.turn_start.is_some(),
        "tokensAfter": tokens_after,
    });
    let timestamp = format_utc_rfc3339(now_ms());
    let mut result = CompactDetails {
        summary: Some(structured.text.clone()),
        first_kept_entry_id: Some(first_kept_entry_id.clone()),
        tokens_before,
        tokens_after: Some(tokens_after),
        details: Some(details.clone()),
        ..CompactDetails::default()
    };
    let mut compaction = CompactionEntry {
        id: String::new(),
        parent_id: None,
        timestamp: Some(timestamp.clone()),
        summary: structured.text,
        first_kept_entry_id,
        tokens_before,
        details: Some(details),
        extra: Map::new(),
    };
    if request.settings.truncate_after_compaction {
        let (session_id, session_file) = write_successor(
            request.session_file,
            &transcript.header,
            compaction,
            &context[cut.first_kept..],
            timestamp,
        )?;
        result.session_id = Some(session_id);
        result.session_file = Some(session_file.to_string_lossy().into_owned());
    } else {
        let mut writer = TranscriptWriter::open(request.session_file)?;
        compaction.id = writer.next_id();
        compaction.parent_id = writer.last_id().map(str::to_owned);
        writer.append(&Entry::Compaction(compaction))?;
        writer.sync()?;
    }
    let mut compacted = CompactResult::compacted(result);
    if over_budget {
        compacted.reason = Some(CompactReason::OverBudget);
    }
    Ok(compacted)
}

/// The last compaction (if any) and the entries of the current context after it: those from
/// its `firstKeptEntryId` on, without compaction entries.
fn current_context(entries: &[Located]) -> (Option<&CompactionEntry>, Vec<&Located>) {
    let last = entries
        .iter()
        .rposition(|located| matches!(located.entry, Entry::Compaction(_)));
    let Some(index) = last else {
        return (None, entries.iter().collect());
    };
    let Entry::Compaction(compaction) = &entries[index].entry else {
        return (None, entries.iter().collect());
    };
    let start = entries
        .iter()
        .position(|located| located.entry.id() == Some(compaction.first_kept_entry_id.as_str()))
        .unwrap_or(index + 1);
    let context = entries[start..]
        .iter()
        .filter(|located| !matches!(located.entry, Entry::Compaction(_)))
        .collect();
    (Some(compaction), context)
}

fn messages<'a>(entries: &[&'a Located]) -> Vec<&'a AgentMessage> {
    entries
        .iter()
        .filter_map(|located| match &located.entry {
            Entry::Message(entry) => Some(&entry.message),
            _ => None,
        })
        .collect()
}

fn entry_kind_and_tokens(entry: &Entry, estimator: &dyn TokenEstimator) -> (EntryKind, u64) {
    match entry {
        Entry::Message(entry) => {
            let kind = match &entry.message {
                AgentMessage::User(_) => EntryKind::User,
                AgentMessage::ToolResult(_) => EntryKind::ToolResult,
                message if message.tool_calls().next().is_some() => EntryKind::ToolCall,
                _ => EntryKind::Assistant,
            };
            (kind, estimator.message_tokens(&entry.message))
        }
        _ => (EntryKind::Metadata, 0),
    }
}

/// What stands in for a summary the summarizer could not write when room is needed now: the
/// head of each message, deterministically truncated within the summary's share, marked as a
/// fallback.
fn truncated_summary(
    request: &CompactionRequest<'_>,
    messages: &[&AgentMessage],
    target: u64,
) -> String {
    let items = messages
        .iter()
        .map(|message| source_item(message))
        .collect();
    let mut summary_request = SummaryRequest::new(SummaryKind::Leaf, 0, target, items);
    summary_request.level = SummaryLevel::Fallback;
    vilvona_summarize::truncate(&summary_request, request.estimator).text
}

/// Summarizes `messages` in stages: chunks of 15–40% of the window that never split a tool
/// call from its results, then one merge of the partial summaries. A message larger than half
/// the window is noted, not fed whole. Escalates normal → aggressive; never falls back to
/// truncation (a truncated compaction summary would be garbage).
async fn summarize_staged(
    request: &CompactionRequest<'_>,
    messages: &[&AgentMessage],
    previous_summary: Option<&str>,
) -> Result<String, SummarizeError> {
    let window = request.settings.context_window.max(1_000);
    let mut items: Vec<(SourceItem, u64)> = Vec::new();
    if let Some(previous) = previous_summary {
        items.push((
            SourceItem {
                label: "previous summary".to_owned(),
                timestamp_ms: None,
                text: previous.to_owned(),
            },
            request.estimator.text_tokens(previous),
        ));
    }
    for message in messages {
        let tokens = request.estimator.message_tokens(message);
        let mut item = source_item(message);
        if tokens > window / 2 {
            let first_line: String = item
                .text
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            item.text = format!(
                "[{} of {tokens} tokens omitted; it began: {first_line}]",
                item.label
            );
        }
        let tokens = request.estimator.text_tokens(&item.text);
        items.push((item, tokens));
    }
    if items.is_empty() {
        return Ok(String::new());
    }
    let average = items.iter().map(|(_, tokens)| tokens).sum::<u64>() / items.len() as u64;
    let ratio = (0.4 - (average as f64 / window as f64) * 4.0).clamp(0.15, 0.4);
    let chunk_tokens = ((window as f64) * ratio) as u64;
    let target = (window / 20).clamp(256, 4_000);

    let mut chunks: Vec<Vec<SourceItem>> = vec![Vec::new()];
    let mut current_tokens = 0;
    for (item, tokens) in items {
        let starts_unit = !item.label.starts_with("toolResult");
        if starts_unit
            && current_tokens + tokens > chunk_tokens
            && chunks.last().is_some_and(|c| !c.is_empty())
        {
            chunks.push(Vec::new());
            current_tokens = 0;
        }
        current_tokens += tokens;
        if let Some(chunk) = chunks.last_mut() {
            chunk.push(item);
        }
    }
    let mut partials = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        partials.push(summarize_escalating(request, SummaryKind::Leaf, 0, chunk, target).await?);
    }
    if partials.len() == 1 {
        return Ok(partials.remove(0));
    }
    let merged: Vec<SourceItem> = partials
        .into_iter()
        .enumerate()
        .map(|(index, text)| SourceItem {
            label: format!("part {}", index + 1),
            timestamp_ms: None,
            text,
        })
        .collect();
    summarize_escalating(request, SummaryKind::Condensed, 1, merged, target).await
}

async fn summarize_escalating(
    request: &CompactionRequest<'_>,
    kind: SummaryKind,
    depth: u32,
    items: Vec<SourceItem>,
    target_tokens: u64,
) -> Result<String, SummarizeError> {
    let mut last_error = None;
    for level in [SummaryLevel::Normal, SummaryLevel::Aggressive] {
        let summary_request = SummaryRequest {
            kind,
            depth,
            level,
            target_tokens,
            items: items.clone(),
            previous_context: None,
            custom_instructions: request.custom_instructions.map(str::to_owned),
        };
        match request.summarizer.summarize(&summary_request).await {
            Ok(summary) if !summary.text.trim().is_empty() => return Ok(summary.text),
            Ok(_) => last_error = Some(SummarizeError::BadOutput("empty summary".to_owned())),
            Err(SummarizeError::Auth(reason)) => return Err(SummarizeError::Auth(reason)),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| SummarizeError::BadOutput("no summary".to_owned())))
}

/// Writes the successor transcript of a rotation: a header naming the parent session, the
/// compaction entry, then the kept entries. The old transcript is not touched.
fn write_successor(
    session_file: &Path,
    header: &SessionHeader,
    mut compaction: CompactionEntry,
    kept: &[&Located],
    timestamp: String,
) -> Result<(String, PathBuf), CompactionError> {
    let mut hasher_input = header.id.clone();
    hasher_input.push_str(&timestamp);
    let suffix: String = hasher_input
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
        .to_be_bytes()[..4]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let base = header
        .id
        .split("-c")
        .next()
        .unwrap_or(&header.id)
        .to_owned();
    let session_id = format!("{base}-c{suffix}");
    let directory = session_file.parent().unwrap_or(Path::new("."));
    let successor = directory.join(format!("{session_id}.jsonl"));
    let mut successor_header = SessionHeader::new(session_id.clone(), timestamp);
    successor_header.cwd = header.cwd.clone();
    successor_header
        .extra
        .insert("parentSession".to_owned(), Value::String(header.id.clone()));
    let mut writer = TranscriptWriter::create(&successor, &successor_header)?;
    compaction.id = writer.next_id();
    writer.append(&Entry::Compaction(compaction))?;
    for located in kept {
        writer.append(&located.entry)?;
    }
    writer.sync()?;
    Ok((session_id, successor))
}
