//! The extractive summarizer: deterministic, offline, within its token target.
//!
//! It splits each source item into sentences, scores them for what a later reader needs
//! (explicit "remember"/"note" statements, decisions and requests, questions, errors and failing
//! checks, outcomes, identifiers, recency), keeps the best that fit the target in their original
//! order with role and time markers, and ends with an `Expand for details about:` footer naming
//! the identifiers it had to drop, so the model knows what exists below. Tool payloads (code,
//! logs) are described, not copied: a tool result contributes a one-line description and its
//! error lines.

use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};

use regex::Regex;

use async_trait::async_trait;
use vilvona_core::summarize::{
    Answer, QuestionRequest, SourceItem, SummarizeError, Summarizer, Summary, SummaryKind,
    SummaryLevel, SummaryRequest,
};
use vilvona_core::tokens::TokenEstimator;

use crate::identifiers::identifiers;
use crate::lines::{EXTRACTIVE_ID, PINNED_PREFIX, sentences};
use crate::time::format_utc_minutes;
use crate::truncate::truncate;

/// The prefix of the footer line; engines and tests look for it.
pub const EXPAND_FOOTER: &str = "Expand for details about:";

/// The share of a summary's target its pinned facts may take.
const PINNED_SHARE: f64 = 0.5;

/// The fraction of the target an aggressive summary may use.
const AGGRESSIVE_FACTOR: f64 = 0.5;
/// Longest sentence kept whole, in characters; longer ones are cut with an ellipsis.
const MAX_SENTENCE_CHARS: usize = 400;
/// Error lines kept from one tool result.
const MAX_ERROR_LINES: usize = 3;

/// The extractive summarizer. Counts tokens with the engine's own estimator, so "within the
/// target" means within the target as the engine measures it.
#[derive(Debug, Clone)]
pub struct ExtractiveSummarizer {
    estimator: Arc<dyn TokenEstimator>,
}

impl ExtractiveSummarizer {
    pub const ID: &'static str = EXTRACTIVE_ID;

    pub fn new(estimator: Arc<dyn TokenEstimator>) -> ExtractiveSummarizer {
        ExtractiveSummarizer { estimator }
    }

    /// The summary, synchronously (it does no IO).
    pub fn summarize_now(&self, request: &SummaryRequest) -> Summary {
        match request.level {
            SummaryLevel::Fallback => truncate(request, &*self.estimator),
            SummaryLevel::Normal => self.extract(request, request.target_tokens),
            SummaryLevel::Aggressive => {
                let target = ((request.target_tokens as f64) * AGGRESSIVE_FACTOR).floor() as u64;
                self.extract(request, target.max(1))
            }
        }
    }

    fn extract(&self, request: &SummaryRequest, target: u64) -> Summary {
        let (mut units, candidates) = units(request);
        let pinned = self.pin(request, &candidates, target);
        // A pinned sentence is not repeated in the body.
        units.retain(|unit| !pinned.iter().any(|pin| pin.text == unit.text));
        let pinned_text = render_pinned(&pinned);
        let target = target.saturating_sub(if pinned_text.is_empty() {
            0
        } else {
            self.estimator.text_tokens(&pinned_text) + 1
        });
        let focus = focus_words(request.custom_instructions.as_deref());
        let condensed = request.kind == SummaryKind::Condensed;
        let item_count = request.items.len().max(1) as f64;
        let mut scored: Vec<(f64, usize)> = units
            .iter()
            .enumerate()
            .map(|(index, unit)| {
                let recency = (unit.item as f64 + 1.0) / item_count;
                (score(unit, recency, condensed, &focus), index)
            })
            .collect();
        // Best first; ties keep the earlier unit. Scores are finite, so the order is total.
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

        let source_identifiers = source_identifiers(request);
        let footer_reserve = if source_identifiers.is_empty() {
            0
        } else {
            (target / 4).max(1)
        };
        let body_budget = target.saturating_sub(footer_reserve);
        let mut chosen: BTreeSet<usize> = BTreeSet::new();
        let mut used = 0;
        for (_, index) in &scored {
            let cost = self.estimator.text_tokens(&units[*index].text) + 1;
            // Markers cost a few tokens for each item that gets its first kept unit.
            let marker = if chosen
                .iter()
                .any(|kept| units[*kept].item == units[*index].item)
            {
                0
            } else {
                self.estimator
                    .text_tokens(&marker(&request.items[units[*index].item]))
                    + 1
            };
            if used + cost + marker <= body_budget {
                chosen.insert(*index);
                used += cost + marker;
            }
        }

        // Render, then drop the weakest kept units until the whole text fits the target.
        let mut order: Vec<usize> = scored.iter().map(|(_, index)| *index).collect();
        order.retain(|index| chosen.contains(index));
        loop {
            let body = render(request, &units, &chosen);
            let dropped: Vec<&str> = source_identifiers
                .iter()
                .filter(|identifier| !body.contains(identifier.as_str()))
                .map(String::as_str)
                .collect();
            let remaining = target.saturating_sub(self.estimator.text_tokens(&body) + 1);
            let footer = footer(&dropped, remaining, &*self.estimator);
            let text = match (body.is_empty(), footer.is_empty()) {
                (_, true) => body,
                (true, false) => footer,
                (false, false) => format!("{body}\n{footer}"),
            };
            if self.estimator.text_tokens(&text) <= target || chosen.is_empty() {
                let text = if self.estimator.text_tokens(&text) <= target {
                    text
                } else {
                    String::new()
                };
                let text = match (text.is_empty(), pinned_text.is_empty()) {
                    (_, true) => text,
                    (true, false) => pinned_text,
                    (false, false) => with_pinned(&text, &pinned_text),
                };
                return Summary::new(text, request.level);
            }
            if let Some(weakest) = order.pop() {
                chosen.remove(&weakest);
            }
        }
    }
}

impl ExtractiveSummarizer {
    /// The facts this summary pins: its candidates by weight (then the newest first), as many
    /// as fit [`PINNED_SHARE`] of the target, in source order. When the section is full, what
    /// matters least leaves first.
    fn pin(&self, request: &SummaryRequest, candidates: &[Pin], target: u64) -> Vec<Pin> {
        if request.level == SummaryLevel::Fallback || candidates.is_empty() {
            return Vec::new();
        }
        let budget = ((target as f64) * PINNED_SHARE).floor() as u64;
        let mut ranked: Vec<usize> = (0..candidates.len()).collect();
        ranked.sort_by(|a, b| {
            candidates[*b]
                .weight
                .cmp(&candidates[*a].weight)
                .then(b.cmp(a))
        });
        let mut kept: BTreeSet<usize> = BTreeSet::new();
        let mut used = 0;
        for index in ranked {
            let cost = self
                .estimator
                .text_tokens(&pinned_line(&candidates[index].text))
                + 1;
            if used + cost <= budget {
                kept.insert(index);
                used += cost;
            }
        }
        kept.into_iter()
            .map(|index| candidates[index].clone())
            .collect()
    }
}

/// A statement worth keeping through every level of the DAG.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pin {
    text: String,
    /// 3: remember/note; 2: a decision; 1: carried up from a child without either.
    weight: u8,
}

/// How much a sentence asks to be kept: 3 for an explicit "remember"/"note", 2 for a decision,
/// 0 otherwise.
fn pin_weight(text: &str) -> u8 {
    let lower = text.to_lowercase();
    if contains_any(&lower, REMEMBER) {
        3
    } else if contains_any(&lower, DECISION) {
        2
    } else {
        0
    }
}

fn pinned_line(text: &str) -> String {
    format!("{PINNED_PREFIX} {text}")
}

fn render_pinned(pins: &[Pin]) -> String {
    pins.iter()
        .map(|pin| pinned_line(&pin.text))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pinned lines go after the body and before the footer (which stays last).
fn with_pinned(text: &str, pinned: &str) -> String {
    match text.rsplit_once('\n') {
        Some((body, last)) if last.starts_with(EXPAND_FOOTER) => {
            format!("{body}\n{pinned}\n{last}")
        }
        None if text.starts_with(EXPAND_FOOTER) => format!("{pinned}\n{text}"),
        _ => format!("{text}\n{pinned}"),
    }
}

const REMEMBER: &[&str] = &[
    "remember",
    "note:",
    "note that",
    "important",
    "don't forget",
    "keep in mind",
    "owns it",
];

const DECISION: &[&str] = &[
    "decided",
    "decision",
    "we will",
    "we'll",
    "agreed",
    "chose ",
    "going with",
    "let's",
    "must ",
    "should ",
    "plan:",
    "instead of",
];

#[async_trait]
impl Summarizer for ExtractiveSummarizer {
    fn id(&self) -> &str {
        Self::ID
    }

    async fn answer(&self, request: &QuestionRequest) -> Result<Answer, SummarizeError> {
        Ok(crate::answer::extractive_answer(request, &*self.estimator))
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let summary = self.summarize_now(request);
        if summary.text.trim().is_empty() {
            return Err(SummarizeError::BadOutput(format!(
                "nothing fits a target of {} tokens",
                request.target_tokens
            )));
        }
        Ok(summary)
    }
}

/// One candidate sentence (or description) and where it came from.
#[derive(Debug)]
struct Unit {
    item: usize,
    text: String,
    is_user: bool,
    is_tool_description: bool,
}

fn is_tool_result(label: &str) -> bool {
    label.starts_with("toolResult")
}

/// The candidate sentences of the source, and the facts it could pin: its own remember and
/// decision statements, and the pinned lines of the child summaries it condenses.
fn units(request: &SummaryRequest) -> (Vec<Unit>, Vec<Pin>) {
    let mut units = Vec::new();
    let mut pins: Vec<Pin> = Vec::new();
    let mut pin = |text: &str, weight: u8| {
        if weight > 0 && !pins.iter().any(|pin| pin.text == text) {
            pins.push(Pin {
                text: text.to_owned(),
                weight,
            });
        }
    };
    for (item_index, item) in request.items.iter().enumerate() {
        let is_user = item.label == "user";
        if is_tool_result(&item.label) {
            units.push(Unit {
                item: item_index,
                text: describe_tool_output(item),
                is_user,
                is_tool_description: true,
            });
            continue;
        }
        let mut code_lines = 0;
        for line in item.text.lines() {
            let line = line.trim_end();
            // A child summary's footer feeds the identifier list, not the sentences.
            if line.trim().is_empty() || line.trim_start().starts_with(EXPAND_FOOTER) {
                continue;
            }
            if let Some(fact) = line.trim_start().strip_prefix(PINNED_PREFIX) {
                let fact = fact.trim();
                pin(fact, pin_weight(fact).max(1));
                continue;
            }
            if looks_like_code(line) {
                code_lines += 1;
                continue;
            }
            for sentence in sentences(line.trim()) {
                let text = clip(sentence, MAX_SENTENCE_CHARS);
                pin(&text, pin_weight(&text));
                units.push(Unit {
                    item: item_index,
                    text,
                    is_user,
                    is_tool_description: false,
                });
            }
        }
        if code_lines > 0 {
            units.push(Unit {
                item: item_index,
                text: format!("({code_lines} lines of code)"),
                is_user,
                is_tool_description: true,
            });
        }
    }
    (units, pins)
}

/// A tool result becomes one line: its size and its first error lines, never its payload.
fn describe_tool_output(item: &SourceItem) -> String {
    let lines: Vec<&str> = item.text.lines().collect();
    let tool = item.label.split_once(':').map_or("tool", |(_, name)| name);
    let errors: Vec<String> = lines
        .iter()
        .filter(|line| is_error_line(line))
        .take(MAX_ERROR_LINES)
        .map(|line| clip(line.trim(), 160))
        .collect();
    let mut description = format!(
        "{tool} returned {} line{}",
        lines.len(),
        if lines.len() == 1 { "" } else { "s" }
    );
    if errors.is_empty() {
        description.push('.');
    } else {
        description.push_str(": ");
        description.push_str(&errors.join(" | "));
    }
    description
}

/// Error reports, not the words in identifiers (`error.batch`, `panic_36` are not errors).
static ERROR_LINE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:error(?:\[\w+\])?:|failed\b|failures?\b|panicked\b|exception\b|traceback\b|fatal:|denied\b|timed out\b)",
    )
    .ok()
});

fn is_error_line(line: &str) -> bool {
    ERROR_LINE
        .as_ref()
        .is_some_and(|regex| regex.is_match(line))
}

fn looks_like_code(line: &str) -> bool {
    let trimmed = line.trim();
    let indented = line.starts_with("    ") || line.starts_with('\t');
    let code_start = [
        "let ", "fn ", "pub ", "use ", "impl ", "struct ", "enum ", "def ", "class ", "import ",
        "return ", "const ", "#include", "}", "{", "//", "#[",
    ]
    .iter()
    .any(|prefix| trimmed.starts_with(prefix));
    let code_end = trimmed.ends_with(';') || trimmed.ends_with('{') || trimmed.ends_with('}');
    (indented && (code_start || code_end)) || (code_start && code_end)
}

fn clip(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(max_chars).collect();
    clipped.push('…');
    clipped
}

fn contains_any(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().any(|needle| haystack.contains(needle))
}

fn score(unit: &Unit, recency: f64, condensed: bool, focus: &[String]) -> f64 {
    let lower = unit.text.to_lowercase();
    let mut score = 0.0;
    if contains_any(&lower, REMEMBER) {
        score += 6.0;
    }
    if contains_any(&lower, DECISION) {
        score += if condensed { 3.5 } else { 3.0 };
    }
    if unit.is_user {
        score += 1.5;
    }
    if unit.text.trim_end().ends_with('?') {
        score += 2.0;
    }
    if is_error_line(&unit.text) || lower.contains("not found") {
        score += 2.5;
    }
    if contains_any(
        &lower,
        &[
            "fixed",
            "passed",
            "passes",
            "works",
            "merged",
            "resolved",
            "completed",
            "done",
        ],
    ) {
        score += 2.0;
    }
    let identifier_count = identifiers(&unit.text).len().min(4) as f64;
    score += identifier_count * if condensed { 1.5 } else { 1.2 };
    if unit.is_tool_description {
        score += 0.5;
    }
    score += recency * if condensed { 0.5 } else { 1.0 };
    let words = unit.text.split_whitespace().count();
    if words < 4 && !unit.is_tool_description {
        score -= 1.0;
    }
    if words > 60 {
        score -= 1.0;
    }
    if !focus.is_empty() && focus.iter().any(|word| lower.contains(word.as_str())) {
        score += 2.5;
    }
    score
}

/// Content words of the operator's instructions, to favour the sentences they ask about.
fn focus_words(instructions: Option<&str>) -> Vec<String> {
    const STOP: &[&str] = &[
        "the",
        "and",
        "for",
        "with",
        "that",
        "this",
        "about",
        "focus",
        "keep",
        "summary",
        "summarize",
        "please",
        "from",
        "into",
        "what",
        "only",
    ];
    instructions
        .map(|text| {
            text.split(|c: char| !c.is_alphanumeric())
                .map(str::to_lowercase)
                .filter(|word| word.len() > 3 && !STOP.contains(&word.as_str()))
                .collect()
        })
        .unwrap_or_default()
}

/// Identifiers of the source that the footer may name: those in the items, plus those the
/// children's own footers named (they exist further below).
fn source_identifiers(request: &SummaryRequest) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for item in &request.items {
        let text = if is_tool_result(&item.label) {
            // A tool payload's identifiers are many and noisy; keep the ones in error lines.
            item.text
                .lines()
                .filter(|line| is_error_line(line))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            item.text.clone()
        };
        for identifier in identifiers(&text) {
            if !all.contains(&identifier) {
                all.push(identifier);
            }
        }
    }
    all
}

fn marker(item: &SourceItem) -> String {
    match item.timestamp_ms {
        Some(ms) => format!("[{} {}]", item.label, format_utc_minutes(ms)),
        None => format!("[{}]", item.label),
    }
}

fn render(request: &SummaryRequest, units: &[Unit], chosen: &BTreeSet<usize>) -> String {
    let mut out = String::new();
    let mut current_item = None;
    for index in chosen {
        let unit = &units[*index];
        if current_item != Some(unit.item) {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&marker(&request.items[unit.item]));
            current_item = Some(unit.item);
        }
        out.push(' ');
        out.push_str(&unit.text);
    }
    out
}

fn footer(dropped: &[&str], budget: u64, estimator: &dyn TokenEstimator) -> String {
    if dropped.is_empty() || budget == 0 {
        return String::new();
    }
    let mut footer = EXPAND_FOOTER.to_owned();
    let mut count = 0;
    for identifier in dropped {
        let candidate = if count == 0 {
            format!("{footer} {identifier}")
        } else {
            format!("{footer}, {identifier}")
        };
        if estimator.text_tokens(&candidate) > budget {
            break;
        }
        footer = candidate;
        count += 1;
    }
    if count == 0 { String::new() } else { footer }
}
