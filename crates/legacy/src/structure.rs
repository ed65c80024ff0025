//! The structured compaction summary: Goal, Constraints & Preferences, Progress (Done / In
//! Progress / Blocked), Key Decisions, Next Steps, Critical Context, the latest user request
//! verbatim, and the files read and modified. A previous summary is updated, not restarted:
//! its sections and file lists carry forward.

use std::collections::BTreeMap;

use serde_json::Value;
use vilvona_core::message::{AgentMessage, ContentBlock};

/// What goes into one structured summary.
pub(crate) struct StructuredSummary<'a> {
    pub(crate) previous: Option<&'a str>,
    pub(crate) messages: &'a [&'a AgentMessage],
    pub(crate) critical_context: &'a str,
    pub(crate) split_turn_prefix: Option<&'a str>,
    pub(crate) max_chars: usize,
}

pub(crate) struct Built {
    pub(crate) text: String,
    pub(crate) read_files: Vec<String>,
    pub(crate) modified_files: Vec<String>,
}

/// The longest latest-request quote.
const MAX_REQUEST_CHARS: usize = 2_000;
/// Bullets kept per section.
const MAX_BULLETS: usize = 12;
/// Files kept per list.
const MAX_FILES: usize = 60;

/// Words that mark a user's sentence as a constraint to keep.
const CONSTRAINT_WORDS: &[&str] = &[
    "must",
    "never",
    "always",
    "prefer",
    "don't",
    "do not",
    "remember",
    "note that",
    "note:",
    "make sure",
];

/// Words that mark an assistant's sentence as work done.
const DONE_WORDS: &[&str] = &[
    "fixed",
    "done",
    "passed",
    "passes",
    "implemented",
    "added",
    "completed",
    "merged",
];

/// Words that mark an assistant's sentence as a decision.
const DECISION_WORDS: &[&str] = &[
    "decided",
    "decision",
    "chose",
    "going with",
    "we will",
    "instead of",
    "agreed",
];

/// Words that mark an assistant's sentence as a next step.
const NEXT_WORDS: &[&str] = &[
    "next,",
    "next step",
    "todo",
    "remaining",
    "follow-up",
    "then i will",
    "i will now",
];

const GOAL: &str = "Goal";
const CONSTRAINTS: &str = "Constraints & Preferences";
const DONE: &str = "Done";
const IN_PROGRESS: &str = "In Progress";
const BLOCKED: &str = "Blocked";
const DECISIONS: &str = "Key Decisions";
const NEXT: &str = "Next Steps";
const READ_FILES: &str = "Files Read";
const MODIFIED_FILES: &str = "Files Modified";

pub(crate) const TRUNCATION_MARKER: &str = "[summary truncated at the character cap]";

fn sentences(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines().flat_map(|line| {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = line.as_bytes();
        for (index, byte) in bytes.iter().enumerate() {
            if matches!(byte, b'.' | b'!' | b'?')
                && bytes.get(index + 1).is_some_and(u8::is_ascii_whitespace)
            {
                out.push(line[start..=index].trim().to_owned());
                start = index + 1;
            }
        }
        out.push(line[start..].trim().to_owned());
        out.into_iter().filter(|sentence| sentence.len() > 3)
    })
}

fn matches_any(sentence: &str, words: &[&str]) -> bool {
    let lower = sentence.to_lowercase();
    words.iter().any(|word| lower.contains(word))
}

/// `## Title` sections of a previous summary, with their bullet lines.
fn parse_sections(previous: &str) -> BTreeMap<String, Vec<String>> {
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in previous.lines() {
        if let Some(title) = line
            .strip_prefix("## ")
            .or_else(|| line.strip_prefix("### "))
        {
            current = Some(title.trim().to_owned());
            continue;
        }
        if let (Some(title), Some(bullet)) = (&current, line.trim().strip_prefix("- "))
            && bullet != "(none)"
        {
            sections
                .entry(title.clone())
                .or_default()
                .push(bullet.to_owned());
        }
    }
    sections
}

fn push_unique(list: &mut Vec<String>, value: String, cap: usize) {
    if !list.contains(&value) {
        list.push(value);
    }
    if list.len() > cap {
        list.remove(0);
    }
}

pub(crate) fn build_summary(input: StructuredSummary<'_>) -> Built {
    let mut sections = input.previous.map(parse_sections).unwrap_or_default();
    let mut section = |title: &str| -> Vec<String> { sections.remove(title).unwrap_or_default() };
    let mut goal = section(GOAL);
    let mut constraints = section(CONSTRAINTS);
    let mut done = section(DONE);
    let mut blocked = section(BLOCKED);
    let mut decisions = section(DECISIONS);
    let mut next = section(NEXT);
    let mut read_files = section(READ_FILES);
    let mut modified_files = section(MODIFIED_FILES);
    let mut in_progress = Vec::new();
    let mut latest_request: Option<String> = None;

    for message in input.messages {
        let text = message.plain_text();
        match message {
            AgentMessage::User(_) => {
                if goal.is_empty()
                    && let Some(first) = sentences(&text).next()
                {
                    goal.push(clip(&first, 400));
                }
                for sentence in sentences(&text) {
                    if matches_any(&sentence, CONSTRAINT_WORDS) {
                        push_unique(&mut constraints, clip(&sentence, 400), MAX_BULLETS);
                    }
                }
                latest_request = Some(text.clone());
            }
            AgentMessage::Assistant(_) => {
                let (read, modified) = tool_call_paths(message);
                for path in read {
                    push_unique(&mut read_files, path, MAX_FILES);
                }
                for path in modified {
                    push_unique(&mut modified_files, path, MAX_FILES);
                }
                let mut last_sentence = None;
                for sentence in sentences(&text) {
                    if message
                        .tool_calls()
                        .any(|call| sentence.starts_with(&call.name))
                    {
                        continue;
                    }
                    if matches_any(&sentence, DONE_WORDS) {
                        push_unique(&mut done, clip(&sentence, 300), MAX_BULLETS);
                    }
                    if matches_any(&sentence, DECISION_WORDS) {
                        push_unique(&mut decisions, clip(&sentence, 300), MAX_BULLETS);
                    }
                    if matches_any(&sentence, NEXT_WORDS) {
                        push_unique(&mut next, clip(&sentence, 300), MAX_BULLETS);
                    }
                    last_sentence = Some(sentence);
                }
                if let Some(sentence) = last_sentence {
                    in_progress = vec![clip(&sentence, 300)];
                }
            }
            AgentMessage::ToolResult(result) => {
                if result.is_error == Some(true)
                    || matches_any(&text, &["error:", "error[", "failed", "panicked"])
                {
                    let line = text
                        .lines()
                        .find(|line| matches_any(line, &["error", "failed", "panicked"]))
                        .unwrap_or_else(|| text.lines().next().unwrap_or(""));
                    let tool = result.tool_name.as_deref().unwrap_or("tool");
                    push_unique(
                        &mut blocked,
                        clip(&format!("{tool}: {}", line.trim()), 300),
                        6,
                    );
                }
            }
            AgentMessage::Other(_) => {}
        }
    }

    let mut out = String::new();
    let write_section = |out: &mut String, heading: &str, bullets: &[String]| {
        out.push_str(heading);
        out.push('\n');
        if bullets.is_empty() {
            out.push_str("- (none)\n");
        }
        for bullet in bullets {
            out.push_str("- ");
            out.push_str(&bullet.replace('\n', " "));
            out.push('\n');
        }
        out.push('\n');
    };
    write_section(&mut out, &format!("## {GOAL}"), &goal);
    write_section(&mut out, &format!("## {CONSTRAINTS}"), &constraints);
    out.push_str("## Progress\n");
    write_section(&mut out, &format!("### {DONE}"), &done);
    write_section(&mut out, &format!("### {IN_PROGRESS}"), &in_progress);
    write_section(&mut out, &format!("### {BLOCKED}"), &blocked);
    write_section(&mut out, &format!("## {DECISIONS}"), &decisions);
    write_section(&mut out, &format!("## {NEXT}"), &next);
    out.push_str("## Critical Context\n");
    out.push_str(input.critical_context.trim());
    out.push_str("\n\n");
    if let Some(prefix) = input.split_turn_prefix {
        out.push_str("## Current Turn (its start, before the kept messages)\n");
        out.push_str(prefix.trim());
        out.push_str("\n\n");
    }
    if let Some(request) = latest_request {
        out.push_str("## Latest User Request (verbatim)\n");
        out.push_str(&clip(&request, MAX_REQUEST_CHARS));
        out.push_str("\n\n");
    }
    write_section(&mut out, &format!("## {READ_FILES}"), &read_files);
    write_section(&mut out, &format!("## {MODIFIED_FILES}"), &modified_files);
    let mut text = out.trim_end().to_owned();
    if text.chars().count() > input.max_chars {
        let keep = input.max_chars.saturating_sub(TRUNCATION_MARKER.len() + 1);
        text = text.chars().take(keep).collect();
        text.push('\n');
        text.push_str(TRUNCATION_MARKER);
    }
    Built {
        text,
        read_files,
        modified_files,
    }
}

fn clip(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        let mut clipped: String = text.chars().take(max_chars).collect();
        clipped.push('…');
        clipped
    }
}

/// File paths a message's tool calls read or modified.
pub(crate) fn tool_call_paths(message: &AgentMessage) -> (Vec<String>, Vec<String>) {
    let mut read = Vec::new();
    let mut modified = Vec::new();
    if let Some(content) = message.content() {
        for block in content.blocks() {
            if let ContentBlock::ToolCall(call) = block {
                let path = ["path", "file_path", "filePath", "file"]
                    .iter()
                    .find_map(|key| call.arguments.get(*key).and_then(Value::as_str));
                if let Some(path) = path {
                    match call.name.as_str() {
                        "edit" | "write" | "apply_patch" | "multi_edit" | "create" => {
                            modified.push(path.to_owned())
                        }
                        _ => read.push(path.to_owned()),
                    }
                }
            }
        }
    }
    (read, modified)
}
