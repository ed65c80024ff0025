//! The built-in compaction on real transcript files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use tempfile::TempDir;
use vilvona_core::engine::CompactReason;
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SummarizeError, Summarizer, Summary, SummaryRequest};
use vilvona_core::tokens::HeuristicEstimator;
use vilvona_legacy::*;
use vilvona_summarize::ExtractiveSummarizer;
use vilvona_transcript::{
    Entry, SessionHeader, TranscriptWriter, read_transcript, session_messages,
};

fn message(value: serde_json::Value) -> AgentMessage {
    serde_json::from_value(value).unwrap()
}

/// Writes a transcript of `turns` turns: a request naming a file, a read of it, a result, an
/// answer. Each message is roughly `size` characters.
fn write_session(dir: &Path, turns: usize, size: usize) -> PathBuf {
    let path = dir.join("s1.jsonl");
    let mut writer = TranscriptWriter::create(
        &path,
        &SessionHeader::new("s1", "2026-03-02T09:00:00Z".to_owned()),
    )
    .unwrap();
    let filler = "alpha beta gamma delta ".repeat(size / 23 + 1);
    for turn in 0..turns {
        let t = 1_772_442_351_000_i64 + turn as i64 * 60_000;
        let messages = [
            json!({"role": "user", "content": format!("Turn {turn}: please fix crates/m{turn}/src/lib.rs. {filler}"), "timestamp": t}),
            json!({"role": "assistant", "content": [{"type": "toolCall", "id": format!("c{turn}"), "name": if turn % 2 == 0 { "read" } else { "edit" }, "arguments": {"path": format!("crates/m{turn}/src/lib.rs")}}], "timestamp": t + 1}),
            json!({"role": "toolResult", "toolCallId": format!("c{turn}"), "toolName": "read", "content": [{"type": "text", "text": filler.clone()}], "timestamp": t + 2}),
            json!({"role": "assistant", "content": [{"type": "text", "text": format!("Fixed the bug in m{turn}; decided to keep the cache. {filler}")}], "timestamp": t + 3}),
        ];
        for value in messages {
            writer
                .append_message(&message(value), "2026-03-02T09:00:00Z".to_owned())
                .unwrap();
        }
    }
    writer.sync().unwrap();
    path
}

fn settings(keep: u64) -> CompactionSettings {
    CompactionSettings {
        keep_recent_tokens: keep,
        context_window: 32_000,
        ..CompactionSettings::default()
    }
}

async fn compact(
    path: &Path,
    settings: &CompactionSettings,
    summarizer: &dyn Summarizer,
) -> vilvona_core::CompactResult {
    compact_with(path, settings, summarizer, false).await
}

async fn compact_with(
    path: &Path,
    settings: &CompactionSettings,
    summarizer: &dyn Summarizer,
    must_make_room: bool,
) -> vilvona_core::CompactResult {
    compact_transcript(CompactionRequest {
        session_file: path,
        custom_instructions: None,
        settings,
        summarizer,
        estimator: &HeuristicEstimator,
        must_make_room,
    })
    .await
    .unwrap()
}

fn extractive() -> ExtractiveSummarizer {
    ExtractiveSummarizer::new(Arc::new(HeuristicEstimator))
}

#[tokio::test]
async fn compaction_appends_a_structured_summary_and_keeps_the_recent_messages() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 12, 400);
    let result = compact(&path, &settings(1_000), &extractive()).await;
    assert!(result.ok && result.compacted, "{result:?}");
    let details = result.result.unwrap();
    assert!(details.tokens_after.unwrap() < details.tokens_before);
    let summary = details.summary.unwrap();
    for section in [
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "### Done",
        "### In Progress",
        "### Blocked",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
        "## Latest User Request (verbatim)",
        "## Files Read",
        "## Files Modified",
    ] {
        assert!(summary.contains(section), "missing {section}:\n{summary}");
    }
    assert!(
        summary.contains("crates/m0/src/lib.rs"),
        "read files carried:\n{summary}"
    );
    assert!(
        summary.contains("crates/m1/src/lib.rs"),
        "modified files carried:\n{summary}"
    );

    let transcript = read_transcript(&path).unwrap();
    let Entry::Compaction(entry) = &transcript.entries.last().unwrap().entry else {
        panic!("the compaction entry is appended last");
    };
    assert_eq!(
        Some(entry.first_kept_entry_id.clone()),
        details.first_kept_entry_id
    );
    let rebuilt = session_messages(&transcript.entries);
    assert!(rebuilt[0].1.plain_text().contains("## Goal"));
    // The kept side never starts with a tool result.
    assert!(rebuilt[1].1.tool_result_call_id().is_none());
}

#[tokio::test]
async fn a_second_compaction_updates_the_first() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 12, 400);
    let first = compact(&path, &settings(1_000), &extractive())
        .await
        .result
        .unwrap();
    // More history arrives.
    let mut writer = TranscriptWriter::open(&path).unwrap();
    for turn in 12..20 {
        writer
            .append_message(&message(json!({"role": "user", "content": format!("Turn {turn}: please also look at crates/late{turn}/src/x.rs; {}", "word ".repeat(100)), "timestamp": turn})), "t".to_owned())
            .unwrap();
        writer
            .append_message(&message(json!({"role": "assistant", "content": [{"type": "text", "text": "word ".repeat(120)}], "timestamp": turn})), "t".to_owned())
            .unwrap();
    }
    writer.sync().unwrap();
    let second = compact(&path, &settings(1_000), &extractive()).await;
    assert!(second.compacted, "{second:?}");
    let second = second.result.unwrap();
    let summary = second.summary.unwrap();
    // The goal and the file lists of the first summary carry forward.
    let goal_line = |summary: &str| {
        summary
            .lines()
            .skip_while(|l| *l != "## Goal")
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        goal_line(&summary),
        goal_line(first.summary.as_deref().unwrap())
    );
    assert!(summary.contains("crates/m0/src/lib.rs"), "{summary}");
    assert!(second.tokens_before > 0);
}

#[tokio::test]
async fn a_history_too_small_is_not_compacted() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 2, 100);
    let before = std::fs::read(&path).unwrap();
    let result = compact(&path, &settings(20_000), &extractive()).await;
    assert!(result.ok && !result.compacted);
    assert_eq!(result.reason, Some(CompactReason::TooSmall));
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[derive(Debug)]
struct Broken;

#[async_trait]
impl Summarizer for Broken {
    fn id(&self) -> &str {
        "broken"
    }
    async fn summarize(&self, _request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        Err(SummarizeError::Transient(
            "provider returned 503".to_owned(),
        ))
    }
}

#[tokio::test]
async fn a_failed_summary_is_reported_and_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 12, 400);
    let before = std::fs::read(&path).unwrap();
    let result = compact(&path, &settings(1_000), &Broken).await;
    assert!(!result.ok && !result.compacted);
    assert_eq!(result.reason, Some(CompactReason::SummarizerUnavailable));
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the transcript is unchanged"
    );
}

/// When the host needs room now (overflow, preflight), legacy makes it: a history the usual
/// cut would keep whole keeps only its newest turn, and a summarizer that fails leaves a
/// truncated summary in its place instead of nothing.
#[tokio::test]
async fn room_needed_now_is_made_even_when_the_cut_keeps_all_and_the_summarizer_fails() {
    for summarizer in [&Broken as &dyn Summarizer, &extractive()] {
        let dir = TempDir::new().unwrap();
        let path = write_session(dir.path(), 3, 400);
        let routine = compact(&path, &settings(20_000), summarizer).await;
        assert!(!routine.compacted, "{routine:?}");
        let result = compact_with(&path, &settings(20_000), summarizer, true).await;
        assert!(
            result.ok && result.compacted,
            "{}: {result:?}",
            summarizer.id()
        );
        let details = result.result.unwrap();
        assert!(details.tokens_after.unwrap() < details.tokens_before);
        let kept = session_messages(&read_transcript(&path).unwrap().entries);
        assert!(
            kept.len() <= 2,
            "only the newest turn's last unit and the summary: {}",
            kept.len()
        );
    }
}

#[tokio::test]
async fn the_summary_respects_its_hard_cap() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 30, 2_000);
    let mut capped = settings(1_000);
    capped.summary_max_chars = 900;
    let summary = compact(&path, &capped, &extractive())
        .await
        .result
        .unwrap()
        .summary
        .unwrap();
    assert!(
        summary.chars().count() <= 900,
        "{}",
        summary.chars().count()
    );
    assert!(summary.ends_with("[summary truncated at the character cap]"));
}

#[tokio::test]
async fn images_and_cjk_count_in_the_cut() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s.jsonl");
    let mut writer =
        TranscriptWriter::create(&path, &SessionHeader::new("s", "t".to_owned())).unwrap();
    let filler = "the parser cache needs a warm start after restarts. ".repeat(80);
    writer.append_message(&message(json!({"role": "user", "content": format!("Start the work. {filler}"), "timestamp": 1})), "t".to_owned()).unwrap();
    writer.append_message(&message(json!({"role": "assistant", "content": [{"type": "text", "text": filler.clone()}], "timestamp": 2})), "t".to_owned()).unwrap();
    let cjk = writer
        .append_message(
            &message(json!({"role": "user", "content": "日本語".repeat(1_000), "timestamp": 3})),
            "t".to_owned(),
        )
        .unwrap();
    let image = writer
        .append_message(&message(json!({"role": "user", "content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}], "timestamp": 4})), "t".to_owned())
        .unwrap();
    writer.sync().unwrap();
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&path, &copy).unwrap();
    // The image alone costs 2,000 tokens: it fills a 2,000-token keep window by itself.
    let small_window = |keep| CompactionSettings {
        context_window: 6_000,
        ..settings(keep)
    };
    let result = compact(&path, &small_window(2_000), &extractive()).await;
    assert!(result.compacted, "{result:?}");
    assert_eq!(
        result.result.unwrap().first_kept_entry_id.as_deref(),
        Some(image.as_str())
    );
    // 3,000 CJK characters count 3,000 tokens: a 2,100-token window reaches into them.
    let result = compact(&copy, &small_window(2_100), &extractive()).await;
    assert!(result.compacted, "{result:?}");
    assert_eq!(
        result.result.unwrap().first_kept_entry_id.as_deref(),
        Some(cjk.as_str())
    );
}

#[tokio::test]
async fn rotation_writes_a_successor_and_leaves_the_old_transcript_alone() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 12, 400);
    let before = std::fs::read(&path).unwrap();
    let mut rotating = settings(1_000);
    rotating.truncate_after_compaction = true;
    let result = compact(&path, &rotating, &extractive())
        .await
        .result
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let successor_id = result.session_id.unwrap();
    let successor = PathBuf::from(result.session_file.unwrap());
    assert!(successor_id.starts_with("s1-c"));
    let transcript = read_transcript(&successor).unwrap();
    assert_eq!(transcript.header.id, successor_id);
    assert_eq!(transcript.header.extra["parentSession"], "s1");
    assert!(matches!(transcript.entries[0].entry, Entry::Compaction(_)));
    let rebuilt = session_messages(&transcript.entries);
    assert!(rebuilt.len() > 1);
}

/// With the run's prompt budget known, the kept tail and the summary fit shares of it; a
/// newest unit larger than the budget is kept (it cannot be split) and the result says the
/// context is still over budget instead of pretending.
#[tokio::test]
async fn the_kept_tail_and_summary_fit_the_prompt_budget() {
    let dir = TempDir::new().unwrap();
    let path = write_session(dir.path(), 12, 400);
    let budget = 2_000;
    let capped = CompactionSettings {
        prompt_budget: Some(budget),
        ..settings(20_000)
    };
    let result = compact(&path, &capped, &extractive()).await;
    assert!(result.compacted, "{result:?}");
    assert_eq!(result.reason, Some(CompactReason::Compacted));
    let details = result.result.unwrap();
    assert!(
        details.tokens_after.unwrap() <= budget * 3 / 4,
        "{details:?}"
    );
    assert!(details.summary.unwrap().chars().count() <= (budget as usize * 3 / 20) * 4);

    // A last tool result larger than the whole budget.
    let mut writer = TranscriptWriter::open(&path).unwrap();
    for value in [
        json!({"role": "user", "content": "read the big log", "timestamp": 1}),
        json!({"role": "assistant", "content": [{"type": "toolCall", "id": "big", "name": "read", "arguments": {"path": "big.log"}}], "timestamp": 2}),
        json!({"role": "toolResult", "toolCallId": "big", "toolName": "read", "content": [{"type": "text", "text": "log line ".repeat(1_500)}], "timestamp": 3}),
    ] {
        writer
            .append_message(&message(value), "t".to_owned())
            .unwrap();
    }
    writer.sync().unwrap();
    let result = compact(&path, &capped, &extractive()).await;
    assert!(result.compacted, "{result:?}");
    assert_eq!(result.reason, Some(CompactReason::OverBudget));
}
