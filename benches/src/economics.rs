//! What a user pays per turn: the prompt-cache economics of a sequence of model requests.
//!
//! Providers cache a prompt's prefix. For each billed request, the prefix is the longest common
//! prefix, in characters of the serialized `messages` (system message included), with the
//! previous request of the same stream: main turns are one stream, summarizer calls another;
//! requests a provider refused are not billed and leave the chain as it was. Tokens are
//! characters / 4. A cached token costs a tenth of a fresh one and a token written to the
//! cache 1.25 of one: cached cost = prefix/4 × 0.1 + (size − prefix)/4 × 1.25; uncached cost =
//! size/4. Units are "input-token units".
//!
//! A provider that reports what its cache did (the soak's mock of Anthropic's API, whose cache
//! is written only at the request's `cache_control` breakpoints) is taken at its word instead:
//! its request costs `input + 1.25 × written + 0.1 × read` (Anthropic's accounting), and its hit
//! ratio is what it read of the whole prompt.
//!
//! The same figures come from two places: the gateway soak's mock model, which recorded every
//! request a real OpenClaw gateway sent ([`read_recorded_requests`]), and the economics replay,
//! which builds the requests a host would send from an engine's assembled context.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result, anyhow, bail};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SummarizeError, Summarizer, Summary, SummaryRequest};
use vilvona_runtime::{Host, HostOptions, Model, ModelError, ModelRequest, ModelResponse};

use crate::FakeSummarizer;

/// Which chain of cached prefixes a request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// The session's own model calls.
    Turn,
    /// Calls that summarize history.
    Summarizer,
}

/// One model request as the cost model sees it.
#[derive(Clone, Debug)]
pub struct Request {
    pub stream: Stream,
    /// The serialized `messages` array.
    pub messages: String,
    /// Whether the provider refused it (over the window): not billed.
    pub rejected: bool,
    /// What the provider said its cache did, when it said (else the prefix model decides).
    pub billed: Option<Billed>,
}

/// A request's prompt tokens as a provider billed them (Anthropic's usage).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Billed {
    /// Fresh input (`input_tokens`).
    pub input: u64,
    /// Read from the cache (`cache_read_input_tokens`).
    pub cache_read: u64,
    /// Written to the cache (`cache_creation_input_tokens`).
    pub cache_write: u64,
}

/// Prompt-cache economics of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheFigures {
    /// Billed requests of the turn stream.
    pub turn_requests: usize,
    /// Billed requests of the summarizer stream.
    pub summarizer_requests: usize,
    /// Requests refused as over the window.
    pub rejected_requests: usize,
    /// Σ prefix ÷ Σ size over billed turn requests.
    pub turn_cache_hit_ratio: f64,
    /// Σ prefix ÷ Σ size over all billed requests.
    pub cache_hit_ratio: f64,
    /// Input-token units without a cache.
    pub uncached_units: f64,
    /// Input-token units with the prompt cache.
    pub cached_units: f64,
    /// Of those, the summarizer calls'.
    pub summarizer_cached_units: f64,
    /// Prompt tokens of summarizer calls ÷ prompt tokens of all billed calls.
    pub summarizer_share: f64,
    /// Summarizer prompt tokens.
    pub summarizer_input_tokens: u64,
    /// Turn requests whose history (everything after the system message) is smaller than the
    /// previous turn request's: the context was compacted and the prompt rewritten.
    pub prompt_rewrites: usize,
    /// Prompt tokens of billed turn requests: mean and largest.
    pub turn_prompt_tokens_mean: f64,
    pub turn_prompt_tokens_max: u64,
}

fn tokens(chars: usize) -> f64 {
    chars as f64 / 4.0
}

/// The common prefix of two strings, in characters.
fn common_prefix_chars(a: &str, b: &str) -> usize {
    // Compare bytes, then step back to a character boundary and count characters.
    let bytes = a
        .as_bytes()
        .iter()
        .zip(b.as_bytes())
        .take_while(|(x, y)| x == y)
        .count();
    let mut end = bytes;
    while !a.is_char_boundary(end) {
        end -= 1;
    }
    a[..end].chars().count()
}

/// Characters of the messages after the first (the system message), if the serialized array
/// starts with one: how much history a request carries.
fn history_chars(messages: &str) -> usize {
    let total = messages.chars().count();
    match serde_json::from_str::<Vec<Value>>(messages) {
        Ok(list) => match list.first() {
            Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
                total.saturating_sub(first.to_string().chars().count())
            }
            _ => total,
        },
        Err(_) => total,
    }
}

/// The figures of a sequence of requests, in the order they were sent.
pub fn cache_figures(requests: &[Request]) -> CacheFigures {
    let mut figures = CacheFigures::default();
    let mut previous: [Option<&str>; 2] = [None, None];
    let mut previous_history: Option<usize> = None;
    let (mut turn_prefix, mut turn_size) = (0.0, 0.0);
    let (mut all_prefix, mut all_size) = (0.0, 0.0);
    let mut summarizer_tokens = 0.0;
    let mut turn_tokens_sum = 0.0;
    for request in requests {
        if request.rejected {
            figures.rejected_requests += 1;
            continue;
        }
        let slot = match request.stream {
            Stream::Turn => 0,
            Stream::Summarizer => 1,
        };
        let (size, prefix, cached) = match request.billed {
            // Tokens as characters, to add up with the prefix model's.
            Some(billed) => {
                let whole = billed.input + billed.cache_read + billed.cache_write;
                let cached = billed.input as f64
                    + billed.cache_write as f64 * 1.25
                    + billed.cache_read as f64 * 0.1;
                (whole as usize * 4, billed.cache_read as usize * 4, cached)
            }
            None => {
                let size = request.messages.chars().count();
                let prefix = previous[slot]
                    .map_or(0, |before| common_prefix_chars(before, &request.messages));
                (
                    size,
                    prefix,
                    tokens(prefix) * 0.1 + tokens(size - prefix) * 1.25,
                )
            }
        };
        previous[slot] = Some(&request.messages);
        figures.uncached_units += tokens(size);
        figures.cached_units += cached;
        all_prefix += prefix as f64;
        all_size += size as f64;
        match request.stream {
            Stream::Turn => {
                figures.turn_requests += 1;
                turn_prefix += prefix as f64;
                turn_size += size as f64;
                let prompt = (size as f64 / 4.0).ceil() as u64;
                turn_tokens_sum += prompt as f64;
                figures.turn_prompt_tokens_max = figures.turn_prompt_tokens_max.max(prompt);
                let history = history_chars(&request.messages);
                // Rewrites are told by the history whatever the accounting.
                if previous_history.is_some_and(|before| history < before) {
                    figures.prompt_rewrites += 1;
                }
                previous_history = Some(history);
            }
            Stream::Summarizer => {
                figures.summarizer_requests += 1;
                figures.summarizer_cached_units += cached;
                summarizer_tokens += tokens(size);
            }
        }
    }
    let ratio = |part: f64, whole: f64| if whole > 0.0 { part / whole } else { 0.0 };
    figures.turn_cache_hit_ratio = ratio(turn_prefix, turn_size);
    figures.cache_hit_ratio = ratio(all_prefix, all_size);
    figures.summarizer_share = ratio(summarizer_tokens, tokens(all_size as usize));
    figures.summarizer_input_tokens = summarizer_tokens.ceil() as u64;
    figures.turn_prompt_tokens_mean = ratio(turn_tokens_sum, figures.turn_requests as f64);
    figures
}

/// The requests the gateway soak's mock model recorded (`mock.jsonl`: each request body with
/// `__mock: {stream, rejected}`).
pub fn read_recorded_requests(path: &Path) -> Result<Vec<Request>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut requests = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let body: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), number + 1))?;
        let mock = body
            .get("__mock")
            .with_context(|| format!("{}:{}: no __mock record", path.display(), number + 1))?;
        let stream = match mock.get("stream").and_then(Value::as_str) {
            Some("turn") => Stream::Turn,
            Some("summarizer") => Stream::Summarizer,
            other => bail!(
                "{}:{}: unknown stream {other:?}",
                path.display(),
                number + 1
            ),
        };
        let messages = body
            .get("messages")
            .cloned()
            .unwrap_or(Value::Array(Vec::new()));
        let count = |key: &str| mock.get(key).and_then(Value::as_u64);
        let billed = match (count("input"), count("cacheRead"), count("cacheWrite")) {
            (Some(input), Some(cache_read), Some(cache_write)) => Some(Billed {
                input,
                cache_read,
                cache_write,
            }),
            _ => None,
        };
        requests.push(Request {
            stream,
            messages: messages.to_string(),
            rejected: mock
                .get("rejected")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            billed,
        });
    }
    Ok(requests)
}

/// One turn the soak's driver sent (`results.jsonl`).
#[derive(Clone, Debug, Deserialize)]
pub struct TurnResult {
    pub turn: usize,
    pub kind: String,
    pub status: u16,
    pub ms: u64,
    #[serde(default)]
    pub expect: Option<String>,
    #[serde(default)]
    pub reply: String,
    /// The driver's digest of what the user said this turn.
    #[serde(default)]
    pub said: Option<String>,
    #[serde(default)]
    pub session: Option<String>,
}

/// Median and 90th percentile of a list (0 when empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MedianP90 {
    pub median: f64,
    pub p90: f64,
}

pub fn median_p90(values: &[f64]) -> MedianP90 {
    if values.is_empty() {
        return MedianP90::default();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    MedianP90 {
        median: at(0.5),
        p90: at(0.9),
    }
}

/// The soak's figures: its turns, and what its requests cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SoakFigures {
    pub engine: String,
    pub window: u64,
    /// The soak matrix's cell this run is (its column's name in a table), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
    pub turns: usize,
    pub turns_ok: usize,
    pub wall_per_turn_ms: MedianP90,
    pub facts: usize,
    pub facts_answered: usize,
    /// Of those, the answers the model found in its prompt (it called no recall tool).
    #[serde(default)]
    pub facts_from_prompt: usize,
    /// Cached input units over all requests, per turn.
    pub cached_units_per_turn: f64,
    /// What makes two runs one conversation, to compare: what the user said, turn by turn (a
    /// digest of the driver's), and how the provider's cache was billed. Empty when the
    /// driver recorded no digest.
    #[serde(default)]
    pub conversation: String,
    /// The host that ran it (`openclaw@VERSION`), when said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The model's side of the run, when said: the provider, the shape of its usage, and what
    /// changes the requests without changing what the user says (restarts, resets, sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(flatten)]
    pub cache: CacheFigures,
}

/// What a run's turns said and how it was billed, as [`SoakFigures::conversation`]: a digest
/// of each turn's kind and the driver's digest of its text, in turn order (sessions that ran
/// the script at once, in the order of their names). Empty when a turn has no digest.
fn conversation(turns: &[TurnResult], requests: &[Request]) -> String {
    let mut ordered: Vec<&TurnResult> = turns.iter().collect();
    ordered.sort_by(|a, b| (a.turn, &a.session).cmp(&(b.turn, &b.session)));
    let mut hasher = blake3::Hasher::new();
    for turn in ordered {
        let Some(said) = &turn.said else {
            return String::new();
        };
        for part in [turn.kind.as_bytes(), said.as_bytes()] {
            hasher.update(part).update(&[0]);
        }
    }
    let digest = &hasher.finalize().to_hex()[..16];
    let billed = match requests.iter().any(|request| request.billed.is_some()) {
        true => "the provider's cache report",
        false => "the shared prefix",
    };
    format!("{} turns said {digest}, billed by {billed}", turns.len())
}

/// Why `vilvona`'s figures and `legacy`'s cannot be compared as one conversation, if they
/// cannot: a recorded legacy run (`benches/hold/soak-legacy-*.json`) may be of another cell,
/// or older than the driver's script or the host. What the mock model answers is not in it.
pub fn not_comparable(vilvona: &SoakFigures, legacy: &SoakFigures) -> Vec<String> {
    let mut reasons = Vec::new();
    if legacy.engine != "legacy" {
        reasons.push(format!(
            "the figures given as legacy's are {}'s",
            legacy.engine
        ));
    }
    if (vilvona.turns, vilvona.window) != (legacy.turns, legacy.window) {
        reasons.push(format!(
            "legacy's figures are of {} turns at {} tokens, vilvona's of {} at {}",
            legacy.turns, legacy.window, vilvona.turns, vilvona.window
        ));
    }
    match (vilvona.conversation.as_str(), legacy.conversation.as_str()) {
        ("", _) | (_, "") => reasons.push(
            "a run names no conversation (its driver recorded no digest of the turns): record it again"
                .to_owned(),
        ),
        (ours, theirs) if ours != theirs => reasons.push(format!(
            "not the same conversation: vilvona's {ours:?}, legacy's {theirs:?} (a recorded run: record it again with the cell's flags)"
        )),
        _ => {}
    }
    for (what, ours, theirs) in [
        ("host", &vilvona.host, &legacy.host),
        ("route", &vilvona.route, &legacy.route),
    ] {
        match (ours, theirs) {
            (Some(ours), Some(theirs)) if ours == theirs => {}
            (Some(_), Some(_)) => reasons.push(format!(
                "not the same {what}: vilvona's {ours:?}, legacy's {theirs:?}"
            )),
            _ => reasons.push(format!(
                "a run does not say its {what} (economics soak --{what}): record it again"
            )),
        }
    }
    reasons
}

pub fn read_turn_results(path: &Path) -> Result<Vec<TurnResult>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a turn result", path.display(), number + 1))
        })
        .collect()
}

pub fn soak_figures(
    engine: &str,
    window: u64,
    turns: &[TurnResult],
    requests: &[Request],
) -> SoakFigures {
    let cache = cache_figures(requests);
    let wall: Vec<f64> = turns.iter().map(|turn| turn.ms as f64).collect();
    let questions: Vec<&TurnResult> = turns.iter().filter(|turn| turn.expect.is_some()).collect();
    let answered = questions
        .iter()
        .filter(|turn| {
            turn.status == 200
                && turn
                    .expect
                    .as_deref()
                    .is_some_and(|value| turn.reply.contains(value))
        })
        .count();
    let from_prompt = questions
        .iter()
        .filter(|turn| {
            turn.status == 200
                && turn.reply.contains("(from the context)")
                && turn
                    .expect
                    .as_deref()
                    .is_some_and(|value| turn.reply.contains(value))
        })
        .count();
    SoakFigures {
        engine: engine.to_owned(),
        window,
        cell: None,
        turns: turns.len(),
        turns_ok: turns.iter().filter(|turn| turn.status == 200).count(),
        wall_per_turn_ms: median_p90(&wall),
        facts: questions.len(),
        facts_answered: answered,
        facts_from_prompt: from_prompt,
        cached_units_per_turn: if turns.is_empty() {
            0.0
        } else {
            cache.cached_units / turns.len() as f64
        },
        conversation: conversation(turns, requests),
        host: None,
        route: None,
        cache,
    }
}

fn thousands(units: f64) -> String {
    format!("{:.1}k", units / 1_000.0)
}

/// One row of [`soak_table`]: its label and how a run's figures show in it.
type Row = (&'static str, fn(&SoakFigures) -> String);

const SOAK_ROWS: &[Row] = &[
    ("turns ok / failed", |f| {
        format!("{} / {}", f.turns_ok, f.turns - f.turns_ok)
    }),
    ("wall per turn, median / p90 (s)", |f| {
        let wall = f.wall_per_turn_ms;
        format!("{:.2} / {:.2}", wall.median / 1_000.0, wall.p90 / 1_000.0)
    }),
    ("compactions (history shrank)", |f| {
        f.cache.prompt_rewrites.to_string()
    }),
    ("prompt tokens per turn request, mean / max", |f| {
        let max = f.cache.turn_prompt_tokens_max as f64;
        format!(
            "{} / {}",
            thousands(f.cache.turn_prompt_tokens_mean),
            thousands(max)
        )
    }),
    ("model requests (turn / summarizer / refused)", |f| {
        let cache = &f.cache;
        format!(
            "{} / {} / {}",
            cache.turn_requests, cache.summarizer_requests, cache.rejected_requests
        )
    }),
    ("cache-hit ratio, turn requests", |f| {
        format!("{:.1} %", f.cache.turn_cache_hit_ratio * 100.0)
    }),
    ("input-token units per turn, cached", |f| {
        thousands(f.cached_units_per_turn)
    }),
    ("input-token units per turn, no cache", |f| {
        thousands(f.cache.uncached_units / f.turns.max(1) as f64)
    }),
    ("summarizer share of prompt tokens", |f| {
        format!("{:.1} %", f.cache.summarizer_share * 100.0)
    }),
    ("planted facts answered (of them, from the prompt)", |f| {
        format!(
            "{} / {} ({})",
            f.facts_answered, f.facts, f.facts_from_prompt
        )
    }),
];

/// Soak figures side by side, as Markdown (one column per run).
pub fn soak_table(runs: &[&SoakFigures]) -> String {
    let mut out = String::from("| figure |");
    for run in runs {
        match &run.cell {
            Some(cell) => out.push_str(&format!(" {cell}: {} |", run.engine)),
            None => out.push_str(&format!(" {} ({}k) |", run.engine, run.window / 1_000)),
        }
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(runs.len()));
    for (label, value) in SOAK_ROWS {
        out.push_str(&format!("\n| {label} |"));
        for run in runs {
            out.push_str(&format!(" {} |", value(run)));
        }
    }
    out
}

// --- the economics replay ----------------------------------------------------------------

/// How to replay a transcript for its economics.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// An OpenClaw session transcript (JSONL).
    pub transcript: PathBuf,
    /// `legacy` or `lossless`.
    pub engine: String,
    /// The model's window.
    pub window: u64,
    /// The host's own system prompt, in tokens (OpenClaw 2026.9's is 10–11k).
    pub system_prompt_tokens: u64,
}

/// What a replay cost, per the cost model, with what the summarizer was asked.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayFigures {
    pub engine: String,
    pub window: u64,
    pub system_prompt_tokens: u64,
    pub turns: usize,
    /// Compactions the host ran or asked for (legacy's own, overflow recoveries; an engine that
    /// owns compaction compacts on its own, which `prompt_rewrites` shows).
    pub host_compactions: u32,
    /// Cached input units over all requests, per turn.
    pub cached_units_per_turn: f64,
    /// Uncached input units, per turn.
    pub uncached_units_per_turn: f64,
    /// Summarizer calls that a model would have served, and their tokens (input as the
    /// summarizer request's text / 4, output as the summary's).
    pub summarizer_calls: u64,
    pub summarizer_input_tokens: u64,
    pub summarizer_output_tokens: u64,
    #[serde(flatten)]
    pub cache: CacheFigures,
}

/// The instructions a summarizing model gets (their size matters, not their wording).
const SUMMARY_INSTRUCTIONS: &str = "You summarize a conversation between a user and an agent. \
Keep decisions, open tasks, constraints, the user's pending requests and every exact identifier \
(paths, ids, ports, names, dates). Write compact sections; do not continue the conversation.";

/// The requests of a replay, in order (turn and summarizer streams together).
#[derive(Debug, Default)]
struct Recorder {
    requests: Mutex<Vec<Request>>,
    summaries: Mutex<(u64, u64, u64)>,
}

impl Recorder {
    fn push(&self, request: Request) {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request);
    }
}

/// A summarizing model: the fake workload summarizer, each call recorded as a request of the
/// summarizer stream (the instructions, then the source).
#[derive(Debug)]
struct RecordedSummarizer(Arc<Recorder>);

#[async_trait]
impl Summarizer for RecordedSummarizer {
    fn id(&self) -> &str {
        "recorded-model/v1"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let source = request.source_text();
        let messages = json!([
            {"role": "system", "content": SUMMARY_INSTRUCTIONS},
            {"role": "user", "content": source},
        ])
        .to_string();
        let summary = FakeSummarizer.summarize(request).await?;
        {
            let mut counts = self
                .0
                .summaries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            counts.0 += 1;
            counts.1 += messages.chars().count() as u64 / 4;
            counts.2 += summary.text.chars().count() as u64 / 4;
        }
        self.0.push(Request {
            stream: Stream::Summarizer,
            messages,
            rejected: false,
            billed: None,
        });
        Ok(summary)
    }
}

/// The recorded turn as the model: each of its assistant messages is one model call, whose
/// request is what the host sent followed by the turn so far; a request above the window is
/// refused, as a provider refuses it. The assistant messages report their call's prompt tokens
/// as usage, as providers do.
#[derive(Debug)]
struct ScriptedTurn {
    recorder: Arc<Recorder>,
    recorded: Vec<AgentMessage>,
    window: u64,
}

fn serialized(system_prompt: &str, messages: &[AgentMessage]) -> String {
    let mut list = vec![json!({"role": "system", "content": system_prompt})];
    list.extend(
        messages
            .iter()
            .map(|message| serde_json::to_value(message).unwrap_or(Value::Null)),
    );
    Value::Array(list).to_string()
}

#[async_trait]
impl Model for ScriptedTurn {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let mut sent = request.messages.clone();
        let mut answered = Vec::with_capacity(self.recorded.len());
        let mut calls = Vec::new();
        for message in &self.recorded {
            if let AgentMessage::Assistant(_) = message {
                let text = serialized(&request.system_prompt, &sent);
                let tokens = text.chars().count() as u64 / 4;
                if tokens > self.window {
                    self.recorder.push(Request {
                        stream: Stream::Turn,
                        messages: text,
                        rejected: true,
                        billed: None,
                    });
                    return Err(ModelError::Overflow(format!(
                        "{tokens} tokens exceed the {}-token window",
                        self.window
                    )));
                }
                calls.push((text, tokens));
            }
            sent.push(message.clone());
            answered.push(message.clone());
        }
        let mut tokens = calls.iter().map(|(_, tokens)| *tokens);
        for message in &mut answered {
            if let AgentMessage::Assistant(assistant) = message {
                let usage = assistant.usage.get_or_insert_with(Default::default);
                usage.input = tokens.next();
                usage.cache_read = None;
                usage.cache_write = None;
            }
        }
        let last = calls.last().map(|(_, tokens)| *tokens);
        for (text, _) in calls {
            self.recorder.push(Request {
                stream: Stream::Turn,
                messages: text,
                rejected: false,
                billed: None,
            });
        }
        Ok(ModelResponse {
            messages: answered,
            input_tokens: last,
            output_tokens: Some(0),
        })
    }
}

/// A fixed system prompt of about `tokens` tokens.
fn system_prompt(tokens: u64) -> String {
    let line = "You are an agent working in a repository; read before you edit, test what you change, and report what you did.\n";
    line.repeat((tokens as usize * 4) / line.len() + 1)
}

/// Replays a transcript through the host with `engine`, as OpenClaw would drive it (a fixed
/// system prompt, the window less OpenClaw's reserve — a quarter of it, at most 20,000 — as
/// the prompt budget, the model's reported usage), and computes what every model request would
/// cost. `legacy` summarizes with a model; `lossless` with its default, the extractive
/// summarizer (no model).
pub async fn replay(options: &ReplayOptions) -> Result<ReplayFigures> {
    let dir = tempfile::TempDir::new()?;
    let reserve = (options.window / 4).min(20_000);
    std::fs::write(
        dir.path().join("vilvona.json5"),
        format!(
            "{{ plugins: {{ slots: {{ contextEngine: \"{}\" }} }}, agents: {{ defaults: {{ contextTokens: {}, compaction: {{ reserveTokens: {reserve}, reserveTokensFloor: 0 }} }} }} }}",
            options.engine, options.window
        ),
    )?;
    let recorder = Arc::new(Recorder::default());
    let host = Host::open(
        HostOptions {
            system_prompt: system_prompt(options.system_prompt_tokens),
            require_selected: true,
            summarizer: Some(Arc::new(RecordedSummarizer(recorder.clone()))),
            ..HostOptions::new(dir.path())
        },
        |_, _| Ok(()),
    )
    .await?;
    let mut turns = Vec::new();
    vilvona_transcript::for_each_turn(&options.transcript, |turn| {
        turns.push(turn.messages);
        Ok(())
    })
    .map_err(|error| anyhow!("reading {}: {error}", options.transcript.display()))?;
    let mut compactions = 0;
    let replayed = turns.len().max(1);
    let key = "agent:main:economics";
    for messages in turns {
        let mut messages = messages.into_iter();
        let Some(user) = messages.next() else {
            continue;
        };
        let model = ScriptedTurn {
            recorder: recorder.clone(),
            recorded: messages.collect(),
            window: options.window,
        };
        let report = host
            .run_turn(key, user, &model)
            .await
            .with_context(|| format!("{} at a {} window", options.engine, options.window))?;
        compactions += report.compactions;
    }
    host.dispose().await?;
    let requests = std::mem::take(
        &mut *recorder
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let (calls, input, output) = *recorder
        .summaries
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = cache_figures(&requests);
    Ok(ReplayFigures {
        engine: options.engine.clone(),
        window: options.window,
        system_prompt_tokens: options.system_prompt_tokens,
        turns: replayed,
        host_compactions: compactions,
        cached_units_per_turn: cache.cached_units / replayed as f64,
        uncached_units_per_turn: cache.uncached_units / replayed as f64,
        summarizer_calls: calls,
        summarizer_input_tokens: input,
        summarizer_output_tokens: output,
        cache,
    })
}

/// Replays side by side, as Markdown (one column per engine and window).
pub fn replay_table(runs: &[ReplayFigures]) -> String {
    type Cell = fn(&ReplayFigures) -> String;
    const ROWS: &[(&str, Cell)] = &[
        ("prompt rewrites (history shrank)", |r| {
            r.cache.prompt_rewrites.to_string()
        }),
        ("turn requests / refused", |r| {
            format!("{} / {}", r.cache.turn_requests, r.cache.rejected_requests)
        }),
        ("prompt tokens per turn request, mean / max", |r| {
            let max = r.cache.turn_prompt_tokens_max as f64;
            format!(
                "{} / {}",
                thousands(r.cache.turn_prompt_tokens_mean),
                thousands(max)
            )
        }),
        ("cache-hit ratio, turn requests", |r| {
            format!("{:.1} %", r.cache.turn_cache_hit_ratio * 100.0)
        }),
        ("input units per turn, cached", |r| {
            thousands(r.cached_units_per_turn)
        }),
        ("input units per turn, no cache", |r| {
            thousands(r.uncached_units_per_turn)
        }),
        ("summarizer calls (input / output tokens)", |r| {
            format!(
                "{} ({} / {})",
                r.summarizer_calls,
                thousands(r.summarizer_input_tokens as f64),
                thousands(r.summarizer_output_tokens as f64)
            )
        }),
        ("summarizer share of prompt tokens", |r| {
            format!("{:.1} %", r.cache.summarizer_share * 100.0)
        }),
    ];
    let mut out = String::from("| figure |");
    for run in runs {
        out.push_str(&format!(" {} {}k |", run.engine, run.window / 1_000));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(runs.len()));
    for (label, value) in ROWS {
        out.push_str(&format!("\n| {label} |"));
        for run in runs {
            out.push_str(&format!(" {} |", value(run)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(stream: Stream, messages: &str) -> Request {
        Request {
            stream,
            messages: messages.to_owned(),
            rejected: false,
            billed: None,
        }
    }

    fn said(turn: usize, said: &str) -> TurnResult {
        TurnResult {
            turn,
            kind: "work".to_owned(),
            status: 200,
            ms: 1,
            expect: None,
            reply: String::new(),
            said: Some(said.to_owned()),
            session: Some("soak".to_owned()),
        }
    }

    /// Runs of one script compare; a run of another script (a fact said in passing), another
    /// billing, an engine other than legacy, another host or route, or a recording that does
    /// not say them does not.
    #[test]
    fn only_runs_of_one_conversation_compare() {
        let script = [said(1, "aa"), said(2, "bb")];
        let run = |engine: &str, turns: &[TurnResult], requests: &[Request]| SoakFigures {
            host: Some("openclaw@1".to_owned()),
            route: Some("openai chars4".to_owned()),
            ..soak_figures(engine, 32_000, turns, requests)
        };
        let plain = [request(Stream::Turn, "[]")];
        let vilvona = run("vilvona", &script, &plain);
        let legacy = run("legacy", &script, &plain);
        assert_eq!(not_comparable(&vilvona, &legacy), Vec::<String>::new());
        // The same turns reversed in the file: still one conversation.
        let reversed = run("legacy", &[said(2, "bb"), said(1, "aa")], &plain);
        assert!(not_comparable(&vilvona, &reversed).is_empty());
        let other = [said(1, "aa"), said(2, "cc")];
        let billed = [Request {
            billed: Some(Billed {
                input: 1,
                cache_read: 0,
                cache_write: 0,
            }),
            ..request(Stream::Turn, "[]")
        }];
        let unsaid = [TurnResult {
            said: None,
            ..said(1, "aa")
        }];
        for (what, legacy) in [
            ("another script", run("legacy", &other, &plain)),
            ("another billing", run("legacy", &script, &billed)),
            ("not legacy", run("vilvona", &script, &plain)),
            ("no digest", run("legacy", &unsaid, &plain)),
            (
                "another host",
                SoakFigures {
                    host: Some("openclaw@2".to_owned()),
                    ..run("legacy", &script, &plain)
                },
            ),
            (
                "no host",
                SoakFigures {
                    host: None,
                    ..run("legacy", &script, &plain)
                },
            ),
            (
                "another route",
                SoakFigures {
                    route: Some("openai tokenizer".to_owned()),
                    ..run("legacy", &script, &plain)
                },
            ),
        ] {
            assert!(!not_comparable(&vilvona, &legacy).is_empty(), "{what}");
        }
    }

    #[test]
    fn a_provider_that_reports_its_cache_is_billed_by_its_report() {
        let billed = |input, cache_read, cache_write| Request {
            billed: Some(Billed {
                input,
                cache_read,
                cache_write,
            }),
            ..request(Stream::Turn, "[]")
        };
        let figures = cache_figures(&[billed(100, 0, 1_000), billed(50, 1_000, 200)]);
        // 100 + 1.25 × 1,000, then 50 + 0.1 × 1,000 + 1.25 × 200.
        assert!((figures.cached_units - (1_350.0 + 400.0)).abs() < 1e-9);
        assert!((figures.uncached_units - 2_350.0).abs() < 1e-9);
        assert!((figures.turn_cache_hit_ratio - 1_000.0 / 2_350.0).abs() < 1e-9);
        assert_eq!(figures.turn_prompt_tokens_max, 1_250);
    }

    #[test]
    fn a_request_extending_the_previous_one_pays_fresh_only_for_what_it_adds() {
        let first = "a".repeat(400);
        let second = format!("{first}{}", "b".repeat(400));
        let figures = cache_figures(&[
            request(Stream::Turn, &first),
            request(Stream::Turn, &second),
        ]);
        // First: 100 fresh tokens; second: 100 cached + 100 fresh.
        assert!((figures.cached_units - (125.0 + 10.0 + 125.0)).abs() < 1e-9);
        assert!((figures.uncached_units - 300.0).abs() < 1e-9);
        assert!((figures.turn_cache_hit_ratio - 400.0 / 1200.0).abs() < 1e-9);
    }

    #[test]
    fn streams_chain_apart_and_refused_requests_are_not_billed() {
        let turn = "t".repeat(40);
        let figures = cache_figures(&[
            request(Stream::Turn, &turn),
            request(Stream::Summarizer, "s".repeat(40).as_str()),
            Request {
                rejected: true,
                ..request(Stream::Turn, "x")
            },
            request(Stream::Turn, &turn),
        ]);
        assert_eq!(figures.turn_requests, 2);
        assert_eq!(figures.summarizer_requests, 1);
        assert_eq!(figures.rejected_requests, 1);
        // The second turn request hits the first one whole: the refused one left no mark.
        assert!((figures.turn_cache_hit_ratio - 0.5).abs() < 1e-9);
        assert!((figures.summarizer_share - 10.0 / 30.0).abs() < 1e-9);
    }

    #[test]
    fn a_request_whose_history_shrank_is_a_rewrite() {
        let with = |history: &str| {
            serde_json::json!([{"role": "system", "content": "sys"}, {"role": "user", "content": history}])
                .to_string()
        };
        let figures = cache_figures(&[
            request(Stream::Turn, &with("aaaa")),
            request(Stream::Turn, &with("aaaabbbb")),
            request(Stream::Turn, &with("summary")),
            request(Stream::Turn, &with("summary and more")),
        ]);
        assert_eq!(figures.prompt_rewrites, 1);
    }
}
