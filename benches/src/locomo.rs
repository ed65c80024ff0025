//! Recall on natural questions: conversations in LoCoMo's format (Maharana et al., "Evaluating
//! Very Long-Term Conversational Memory of LLM Agents", ACL 2024), each replayed as one session
//! through the lossless engine at a 16,000-token budget, then every question with evidence
//! (categories 1–4) passed verbatim to `vilvona_grep` (messages, limit 10) in each mode, beside a
//! plain BM25 (Okapi, lower-cased word tokens) over the same messages.
//!
//! A conversation file holds `speaker_a`, `speaker_b`, `session_N` (turns `{speaker, dia_id,
//! text}`, a photo as `blip_caption`), `session_N_date_time` (`"1:56 pm on 8 May, 2023"`) and
//! `qa` (`{question, evidence: [dia_id, …], category}`). A turn becomes one message: speaker A's
//! as the user's, speaker B's as the assistant's, the speaker's name kept in the text, a photo as
//! its caption, timed at its session's date-time. No file of the set is part of the project: the
//! folder is an argument.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::Serialize;
use serde_json::{Value, json};
use vilvona_core::engine::{ContextEngine, IngestBatchParams};
use vilvona_core::message::AgentMessage;
use vilvona_core::tokens::TokenEstimator;
use vilvona_lossless::{CompactionRequest, EmbeddingSelection, ToolCaller};

/// The budget each conversation is compacted to.
const BUDGET: u64 = 16_000;
/// The modes of `vilvona_grep` compared, then the BM25 baseline.
pub const MODES: [&str; 3] = ["text", "semantic", "hybrid"];
/// The baseline's name in the tables.
pub const BASELINE: &str = "bm25";
/// LoCoMo's question categories with evidence, by number.
pub const CATEGORIES: [(u64, &str); 4] = [
    (1, "multi-hop"),
    (2, "temporal"),
    (3, "open-domain"),
    (4, "single-hop"),
];

/// Sums over questions, for one mode and one category (or all).
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    pub questions: usize,
    /// Sum over questions of the share of its evidence among the first 5 hits.
    pub recall_5: f64,
    /// … among the first 10.
    pub recall_10: f64,
    /// Questions with some evidence among the first 10.
    pub hit_10: usize,
}

impl Tally {
    fn add(&mut self, ranks: &[Option<usize>]) {
        let share = |k: usize| {
            ranks
                .iter()
                .filter(|rank| rank.is_some_and(|r| r < k))
                .count() as f64
                / ranks.len() as f64
        };
        self.questions += 1;
        self.recall_5 += share(5);
        self.recall_10 += share(10);
        self.hit_10 += usize::from(share(10) > 0.0);
    }

    /// Mean recall@5, recall@10 and the share of questions hit within 10.
    pub fn means(&self) -> (f64, f64, f64) {
        let n = self.questions.max(1) as f64;
        (
            self.recall_5 / n,
            self.recall_10 / n,
            self.hit_10 as f64 / n,
        )
    }
}

/// One mode's figures: over all questions and per category.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeFigures {
    pub mode: String,
    pub all: Tally,
    /// In [`CATEGORIES`] order.
    pub categories: Vec<Tally>,
    /// Median time of one search, in milliseconds (the baseline's is its own scoring loop).
    pub median_ms: f64,
}

/// The evaluation's outcome.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocomoFigures {
    pub conversations: Vec<String>,
    pub messages: usize,
    /// Questions of categories 1–4 asked.
    pub questions: usize,
    /// Questions left out because none of their evidence names a turn of the conversation.
    pub unmatched: usize,
    /// [`MODES`] then [`BASELINE`].
    pub modes: Vec<ModeFigures>,
}

impl LocomoFigures {
    /// A mode's figures (or the baseline's).
    pub fn mode(&self, mode: &str) -> Option<&ModeFigures> {
        self.modes.iter().find(|figures| figures.mode == mode)
    }
}

/// One turn of a conversation, as replayed.
#[derive(Clone, Debug)]
struct Turn {
    dia_id: String,
    user: bool,
    text: String,
    at_ms: i64,
}

/// A question with evidence.
#[derive(Clone, Debug)]
struct Question {
    text: String,
    evidence: Vec<String>,
    category: usize,
}

/// The `.json` files of a folder, in name order.
pub fn conversation_files(folder: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .with_context(|| format!("reading the folder {}", folder.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{} holds no conversation (.json) file", folder.display());
    }
    Ok(files)
}

/// The turns of every conversation of `files` embedded with the built-in model, one pool of
/// documents, and their questions as queries with their evidence turns as answers (a
/// question whose evidence names no turn is left out): natural text for the measurements of
/// `cells` (`--locomo`). None of it counts as a needle.
pub fn meaning_corpus(files: &[PathBuf]) -> Result<crate::cells::Corpus> {
    use rayon::prelude::*;
    let model = vilvona_embed::builtin();
    let mut corpus = crate::cells::Corpus {
        documents: Vec::new(),
        queries: Vec::new(),
        needle_queries: 0,
        answers: Vec::new(),
    };
    for file in files {
        let (turns, questions) = read_conversation(file)?;
        let first = corpus.documents.len();
        let at: HashMap<&str, usize> = turns
            .iter()
            .enumerate()
            .map(|(index, turn)| (turn.dia_id.as_str(), first + index))
            .collect();
        corpus.documents.par_extend(turns.par_iter().map(|turn| {
            let role = if turn.user { "user" } else { "assistant" };
            model.embed_chunks(&turn.text, vilvona_embed::chunks_for(role))
        }));
        for question in &questions {
            let answers: Vec<usize> = question
                .evidence
                .iter()
                .filter_map(|dia| at.get(dia.as_str()).copied())
                .collect();
            if let (false, Some(query)) = (answers.is_empty(), model.embed(&question.text)) {
                corpus.queries.push(query);
                corpus.answers.push(answers);
            }
        }
    }
    Ok(corpus)
}

/// Replays every conversation of `files` with `embedding` and asks its questions; `progress` is
/// told each step.
pub async fn evaluate(
    files: &[PathBuf],
    embedding: &EmbeddingSelection,
    progress: impl Fn(&str),
) -> Result<LocomoFigures> {
    let mut figures = LocomoFigures {
        modes: MODES
            .iter()
            .chain([&BASELINE])
            .map(|mode| ModeFigures {
                mode: (*mode).to_owned(),
                categories: vec![Tally::default(); CATEGORIES.len()],
                ..ModeFigures::default()
            })
            .collect(),
        ..LocomoFigures::default()
    };
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); figures.modes.len()];
    for file in files {
        let (name, turns, questions) = read_named(file, &progress)?;
        let asked = ask_conversation(
            &name,
            &turns,
            &questions,
            embedding,
            &mut figures,
            &mut times,
        )
        .await?;
        figures.messages += turns.len();
        figures.questions += asked;
        figures.unmatched += questions.len() - asked;
        figures.conversations.push(name);
    }
    for (mode, times) in figures.modes.iter_mut().zip(&mut times) {
        times.sort();
        mode.median_ms = times
            .get(times.len() / 2)
            .map_or(0.0, |time| time.as_secs_f64() * 1e3);
    }
    Ok(figures)
}

/// Replays one conversation and tallies its questions into `figures`; returns how many were
/// asked.
async fn ask_conversation(
    name: &str,
    turns: &[Turn],
    questions: &[Question],
    embedding: &EmbeddingSelection,
    figures: &mut LocomoFigures,
    times: &mut [Vec<Duration>],
) -> Result<usize> {
    let dir = tempfile::TempDir::new()?;
    let engine = crate::meaning::extractive_engine(dir.path(), BUDGET, embedding).await?;
    let session = format!("locomo-{name}");
    let key = format!("agent:main:{session}");
    let conversation = replay(&engine, &session, &key, turns, BUDGET).await?;
    // The stored messages are in ingest order: the n-th is the n-th turn.
    let stored = engine
        .store()
        .messages_in_seq_range(conversation, 0, i64::MAX as u64)
        .await?;
    if stored.len() != turns.len() {
        bail!(
            "{name}: {} turns replayed, {} stored",
            turns.len(),
            stored.len()
        );
    }
    let id_of: HashMap<&str, String> = turns
        .iter()
        .zip(&stored)
        .map(|(turn, message)| (turn.dia_id.as_str(), format!("msg_{}", message.id.0)))
        .collect();
    let texts: Vec<&str> = turns.iter().map(|turn| turn.text.as_str()).collect();
    let baseline = Bm25::new(&texts);
    let caller = ToolCaller {
        session_id: session.clone(),
        session_key: Some(key.clone()),
    };
    let mut asked = 0;
    for question in questions {
        let evidence: Vec<&String> = {
            let mut ids: Vec<&String> = question
                .evidence
                .iter()
                .filter_map(|dia| id_of.get(dia.as_str()))
                .collect();
            ids.sort();
            ids.dedup();
            ids
        };
        if evidence.is_empty() {
            continue;
        }
        asked += 1;
        for (index, mode) in MODES.iter().enumerate() {
            let started = Instant::now();
            let found = engine
                .call_tool(
                    &caller,
                    "vilvona_grep",
                    &json!({"query": question.text, "mode": mode, "scope": "messages", "limit": 10}),
                )
                .await?;
            times[index].push(started.elapsed());
            let hits: Vec<&str> = found["results"]
                .as_array()
                .map(|hits| hits.iter().filter_map(|hit| hit["id"].as_str()).collect())
                .unwrap_or_default();
            let ranks: Vec<Option<usize>> = evidence
                .iter()
                .map(|id| hits.iter().position(|hit| *hit == id.as_str()))
                .collect();
            tally(&mut figures.modes[index], question.category, &ranks);
        }
        let started = Instant::now();
        let best = baseline.top(&question.text, 10);
        times[MODES.len()].push(started.elapsed());
        let ranks: Vec<Option<usize>> = evidence
            .iter()
            .map(|id| {
                best.iter()
                    .position(|&row| &id_of[turns[row].dia_id.as_str()] == *id)
            })
            .collect();
        tally(&mut figures.modes[MODES.len()], question.category, &ranks);
    }
    Ok(asked)
}

fn tally(figures: &mut ModeFigures, category: usize, ranks: &[Option<usize>]) {
    figures.all.add(ranks);
    figures.categories[category].add(ranks);
}

/// A conversation file's name, turns and questions, its size said as progress.
fn read_named(file: &Path, progress: &impl Fn(&str)) -> Result<(String, Vec<Turn>, Vec<Question>)> {
    let name = file
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (turns, questions) = read_conversation(file)?;
    progress(&format!(
        "{name}: {} turns, {} questions",
        turns.len(),
        questions.len()
    ));
    Ok((name, turns, questions))
}

/// The conversation of a file: its turns and its questions.
fn read_conversation(file: &Path) -> Result<(Vec<Turn>, Vec<Question>)> {
    let raw =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let value: Value =
        serde_json::from_str(&raw).with_context(|| format!("parsing {}", file.display()))?;
    conversation(&value).with_context(|| format!("reading {}", file.display()))
}

/// A conversation's turns, in order, and its questions with evidence.
fn conversation(value: &Value) -> Result<(Vec<Turn>, Vec<Question>)> {
    let speaker_a = value["speaker_a"]
        .as_str()
        .ok_or_else(|| anyhow!("no speaker_a"))?;
    let mut turns = Vec::new();
    for number in 1.. {
        let Some(session) = value.get(format!("session_{number}")) else {
            break;
        };
        let when = value[format!("session_{number}_date_time")]
            .as_str()
            .ok_or_else(|| anyhow!("session_{number} has no date_time"))?;
        let start = date_time_ms(when).with_context(|| format!("session_{number}_date_time"))?;
        let session = session
            .as_array()
            .ok_or_else(|| anyhow!("session_{number} is not a list"))?;
        for (index, turn) in session.iter().enumerate() {
            let field = |name: &str| turn[name].as_str().unwrap_or_default();
            let (speaker, dia_id) = (field("speaker"), field("dia_id"));
            if dia_id.is_empty() {
                bail!("a turn of session_{number} has no dia_id");
            }
            let mut text = format!("{speaker}: {}", field("text"));
            if !field("blip_caption").is_empty() {
                text.push_str(&format!(" [shares a photo: {}]", field("blip_caption")));
            }
            turns.push(Turn {
                dia_id: dia_id.trim().to_owned(),
                user: speaker == speaker_a,
                text,
                at_ms: start + index as i64 * 1_000,
            });
        }
    }
    if turns.is_empty() {
        bail!("no session_1");
    }
    let questions = value["qa"]
        .as_array()
        .ok_or_else(|| anyhow!("no qa list"))?
        .iter()
        .filter_map(|qa| {
            let category = qa["category"].as_u64()?;
            let index = CATEGORIES
                .iter()
                .position(|(number, _)| *number == category)?;
            Some(Question {
                text: qa["question"].as_str()?.to_owned(),
                evidence: qa["evidence"]
                    .as_array()?
                    .iter()
                    .filter_map(|id| id.as_str().map(|id| id.trim().to_owned()))
                    .collect(),
                category: index,
            })
        })
        .collect();
    Ok((turns, questions))
}

/// `"1:56 pm on 8 May, 2023"` as milliseconds since the epoch (UTC).
fn date_time_ms(text: &str) -> Result<i64> {
    let bad = || anyhow!("{text:?} is not like \"1:56 pm on 8 May, 2023\"");
    let (clock, date) = text.split_once(" on ").ok_or_else(bad)?;
    let (time, half) = clock.trim().split_once(' ').ok_or_else(bad)?;
    let (hour, minute) = time.split_once(':').ok_or_else(bad)?;
    let (mut hour, minute): (i64, i64) = (hour.parse()?, minute.parse()?);
    hour %= 12;
    if half.eq_ignore_ascii_case("pm") {
        hour += 12;
    }
    let words: Vec<&str> = date
        .split([' ', ','])
        .filter(|word| !word.is_empty())
        .collect();
    let [day, month, year] = words[..] else {
        return Err(bad());
    };
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let month = MONTHS
        .iter()
        .position(|name| month.to_ascii_lowercase().starts_with(name))
        .ok_or_else(bad)? as i64
        + 1;
    let days = days_from_civil(year.parse()?, month, day.parse()?);
    Ok(((days * 24 + hour) * 60 + minute) * 60_000)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let of_era = year - era * 400;
    let of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let of_century = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
    era * 146_097 + of_century - 719_468
}

/// BM25 (Okapi: k1 1.5, b 0.75, a negative idf raised to a quarter of the mean idf) over
/// lower-cased word tokens: the baseline.
struct Bm25 {
    documents: Vec<HashMap<String, f64>>,
    lengths: Vec<f64>,
    mean_length: f64,
    idf: HashMap<String, f64>,
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
}

impl Bm25 {
    fn new(texts: &[&str]) -> Bm25 {
        let mut documents = Vec::with_capacity(texts.len());
        let mut lengths = Vec::with_capacity(texts.len());
        let mut frequency: HashMap<String, f64> = HashMap::new();
        for text in texts {
            let mut counts: HashMap<String, f64> = HashMap::new();
            let mut length = 0.0;
            for word in words(text) {
                *counts.entry(word).or_default() += 1.0;
                length += 1.0;
            }
            for word in counts.keys() {
                *frequency.entry(word.clone()).or_default() += 1.0;
            }
            documents.push(counts);
            lengths.push(length);
        }
        let total = texts.len() as f64;
        let mut idf: HashMap<String, f64> = frequency
            .into_iter()
            .map(|(word, n)| (word, ((total - n + 0.5) / (n + 0.5)).ln()))
            .collect();
        let mean_idf = idf.values().sum::<f64>() / idf.len().max(1) as f64;
        for value in idf.values_mut() {
            if *value < 0.0 {
                *value = 0.25 * mean_idf;
            }
        }
        Bm25 {
            mean_length: lengths.iter().sum::<f64>() / total.max(1.0),
            documents,
            lengths,
            idf,
        }
    }

    /// The `k` best documents' indexes for `query`, best first (ties in document order).
    fn top(&self, query: &str, k: usize) -> Vec<usize> {
        let (k1, b) = (1.5, 0.75);
        let query: Vec<String> = words(query).collect();
        let mut scored: Vec<(f64, usize)> = self
            .documents
            .iter()
            .enumerate()
            .map(|(index, counts)| {
                let norm = k1 * (1.0 - b + b * self.lengths[index] / self.mean_length);
                let score = query
                    .iter()
                    .map(|word| {
                        let tf = counts.get(word).copied().unwrap_or(0.0);
                        self.idf.get(word).copied().unwrap_or(0.0) * tf * (k1 + 1.0) / (tf + norm)
                    })
                    .sum::<f64>();
                (score, index)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(k).map(|(_, index)| index).collect()
    }
}

/// The budget of the evidence-in-the-prompt measurement: most of a 12–25k-token conversation
/// folded.
pub const PROMPT_BUDGET: u64 = 8_000;

/// How much of a recalled or raw message must stand in the prompt for its turn to count: the
/// whole turn, or its first this many characters for a longer one.
const PROMPT_EVIDENCE_CHARS: usize = 300;

/// Shares of evidence in the prompt, summed over questions.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareTally {
    pub questions: usize,
    /// Sum over questions of the share of its evidence turns whose text is in the prompt.
    pub share: f64,
}

impl ShareTally {
    fn add(&mut self, share: f64) {
        self.questions += 1;
        self.share += share;
    }

    /// The mean share.
    pub fn mean(&self) -> f64 {
        self.share / self.questions.max(1) as f64
    }
}

/// One side of the measurement: recall at assembly on or off.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptSide {
    pub recall: bool,
    pub all: ShareTally,
    /// In [`CATEGORIES`] order.
    pub categories: Vec<ShareTally>,
    /// Tokens recall at assembly added per question: median and 90th percentile.
    pub added_tokens_median: u64,
    pub added_tokens_p90: u64,
    /// Questions to which nothing was added.
    pub nothing_added: usize,
    /// The assembly's time per question (milliseconds): median and 99th percentile.
    pub assemble_ms_median: f64,
    pub assemble_ms_p99: f64,
}

/// What the prompt holds of each question's evidence, with recall at assembly off and on.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptFigures {
    pub conversations: Vec<String>,
    pub messages: usize,
    pub questions: usize,
    pub budget: u64,
    pub off: PromptSide,
    pub on: PromptSide,
}

/// Replays every conversation of `files` at [`PROMPT_BUDGET`] and, for each question with
/// evidence, assembles the prompt once with the question as the new user turn: the share of
/// the question's evidence turns whose text is in it (a raw message of the context, or an
/// excerpt recall at assembly added; a summary does not count), with recall at assembly off
/// and on.
pub async fn evaluate_prompt(
    files: &[PathBuf],
    embedding: &EmbeddingSelection,
    progress: impl Fn(&str),
) -> Result<PromptFigures> {
    let side = |recall| PromptSide {
        recall,
        categories: vec![ShareTally::default(); CATEGORIES.len()],
        ..PromptSide::default()
    };
    let mut figures = PromptFigures {
        budget: PROMPT_BUDGET,
        off: side(false),
        on: side(true),
        ..PromptFigures::default()
    };
    let mut added: Vec<u64> = Vec::new();
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for file in files {
        let (name, turns, questions) = read_named(file, &progress)?;
        let dir = tempfile::TempDir::new()?;
        let on = crate::meaning::extractive_engine(dir.path(), PROMPT_BUDGET, embedding).await?;
        let off = on.with_config(vilvona_lossless::LosslessConfig {
            assembly_recall: vilvona_lossless::AssemblyRecall {
                scope: vilvona_lossless::RecallScope::Off,
                ..on.config().assembly_recall.clone()
            },
            ..on.config().clone()
        });
        let session = format!("locomo-{name}");
        let key = format!("agent:main:{session}");
        replay(&on, &session, &key, &turns, PROMPT_BUDGET).await?;
        let text_of: HashMap<&str, &str> = turns
            .iter()
            .map(|turn| (turn.dia_id.as_str(), turn.text.as_str()))
            .collect();
        let mut asked = 0;
        for question in &questions {
            let evidence: Vec<&str> = {
                let mut found: Vec<&str> = question
                    .evidence
                    .iter()
                    .filter_map(|dia| text_of.get(dia.as_str()).copied())
                    .collect();
                found.sort_unstable();
                found.dedup();
                found
            };
            if evidence.is_empty() {
                continue;
            }
            asked += 1;
            for (index, (engine, tallies)) in [(&off, &mut figures.off), (&on, &mut figures.on)]
                .into_iter()
                .enumerate()
            {
                let started = Instant::now();
                let assembled = engine
                    .assemble(&vilvona_core::engine::AssembleParams {
                        session_id: session.clone(),
                        session_key: Some(key.clone()),
                        history_elided: true,
                        token_budget: Some(PROMPT_BUDGET),
                        prompt: Some(question.text.clone()),
                        ..vilvona_core::engine::AssembleParams::default()
                    })
                    .await?;
                times[index].push(started.elapsed());
                let summaries: std::collections::HashSet<usize> = assembled
                    .summaries
                    .iter()
                    .map(|summary| summary.index)
                    .collect();
                let shown: Vec<String> = assembled
                    .messages
                    .iter()
                    .enumerate()
                    .filter(|(at, _)| !summaries.contains(at))
                    .map(|(_, message)| message.plain_text())
                    .collect();
                let recalled = shown.iter().find(|text| text.starts_with("<recall"));
                if index == 1 {
                    match recalled {
                        Some(block) => {
                            added.push(vilvona_core::tokens::HeuristicEstimator.text_tokens(block))
                        }
                        None => tallies.nothing_added += 1,
                    }
                }
                let present = evidence
                    .iter()
                    .filter(|turn| {
                        let cut = turn
                            .char_indices()
                            .nth(PROMPT_EVIDENCE_CHARS)
                            .map_or(**turn, |(at, _)| &turn[..at]);
                        shown.iter().any(|text| text.contains(cut))
                    })
                    .count();
                let share = present as f64 / evidence.len() as f64;
                tallies.all.add(share);
                tallies.categories[question.category].add(share);
            }
        }
        figures.messages += turns.len();
        figures.questions += asked;
        figures.conversations.push(name);
    }
    added.sort_unstable();
    let at = |values: &[u64], q: f64| {
        values
            .get(((values.len().saturating_sub(1)) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    figures.on.added_tokens_median = at(&added, 0.5);
    figures.on.added_tokens_p90 = at(&added, 0.9);
    for (side, times) in [&mut figures.off, &mut figures.on]
        .into_iter()
        .zip(&mut times)
    {
        times.sort();
        let ms = |q: f64| {
            times
                .get(((times.len().saturating_sub(1)) as f64 * q).round() as usize)
                .map_or(0.0, |time| time.as_secs_f64() * 1e3)
        };
        side.assemble_ms_median = ms(0.5);
        side.assemble_ms_p99 = ms(0.99);
    }
    Ok(figures)
}

/// The evidence-in-the-prompt figures as Markdown.
pub fn prompt_table(figures: &PromptFigures) -> String {
    let mut out = format!(
        "{} conversations ({}), {} messages, {} questions, at a {}-token budget: the share of a question's evidence turns whose text is in the assembled prompt\n\n| recall at assembly | all |",
        figures.conversations.len(),
        figures.conversations.join(", "),
        figures.messages,
        figures.questions,
        figures.budget
    );
    for (index, (_, name)) in CATEGORIES.iter().enumerate() {
        out.push_str(&format!(
            " {name} ({}) |",
            figures.on.categories[index].questions
        ));
    }
    out.push_str(" tokens added, median / p90 | nothing added | assembly, median / p99 |\n|---|---|---|---|---|---|---|---|---|\n");
    for side in [&figures.off, &figures.on] {
        out.push_str(&format!(
            "| {} | {:.3} |",
            if side.recall { "on" } else { "off" },
            side.all.mean()
        ));
        for tally in &side.categories {
            out.push_str(&format!(" {:.3} |", tally.mean()));
        }
        if side.recall {
            out.push_str(&format!(
                " {} / {} | {} of {} |",
                side.added_tokens_median,
                side.added_tokens_p90,
                side.nothing_added,
                side.all.questions
            ));
        } else {
            out.push_str(" — | — |");
        }
        out.push_str(&format!(
            " {:.2} / {:.2} ms |\n",
            side.assemble_ms_median, side.assemble_ms_p99
        ));
    }
    out
}

/// Replays `turns` as one session, compacting after each answer at `budget`.
async fn replay(
    engine: &vilvona_lossless::LosslessEngine,
    session: &str,
    key: &str,
    turns: &[Turn],
    budget: u64,
) -> Result<vilvona_store::ConversationId> {
    let conversation = engine.conversation(session, Some(key)).await?;
    for turn in turns {
        let role = if turn.user { "user" } else { "assistant" };
        let message: AgentMessage = serde_json::from_value(json!({
            "role": role,
            "content": [{"type": "text", "text": turn.text}],
            "timestamp": turn.at_ms,
        }))?;
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: session.to_owned(),
                session_key: Some(key.to_owned()),
                messages: vec![message],
                entry_ids: vec![Some(turn.dia_id.clone())],
                is_heartbeat: false,
            })
            .await?;
        if !turn.user {
            engine
                .compact_conversation(conversation.id, CompactionRequest::routine(budget))
                .await?;
        }
    }
    engine.store().index_doc_count().await?;
    // A model behind an endpoint embeds in the background: the questions wait for it.
    while engine.store().documents_waiting_for_vectors().await? > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(conversation.id)
}

/// The figures as Markdown: one table over all questions, one per category of recall@10.
pub fn table(figures: &LocomoFigures) -> String {
    let mut out = format!(
        "{} conversations ({}), {} messages, {} questions{}\n\n\
         | mode | recall@5 | recall@10 | hit@10 | median search |\n|---|---|---|---|---|\n",
        figures.conversations.len(),
        figures.conversations.join(", "),
        figures.messages,
        figures.questions,
        if figures.unmatched > 0 {
            format!(
                " ({} without evidence in the conversation left out)",
                figures.unmatched
            )
        } else {
            String::new()
        }
    );
    for mode in &figures.modes {
        let (r5, r10, h10) = mode.all.means();
        out.push_str(&format!(
            "| {} | {r5:.3} | {r10:.3} | {h10:.3} | {:.2} ms |\n",
            mode.mode, mode.median_ms
        ));
    }
    out.push_str("\nrecall@10 by category:\n\n| mode |");
    for (index, (_, name)) in CATEGORIES.iter().enumerate() {
        let count = figures.modes[0].categories[index].questions;
        out.push_str(&format!(" {name} ({count}) |"));
    }
    out.push_str("\n|---|---|---|---|---|\n");
    for mode in &figures.modes {
        out.push_str(&format!("| {} |", mode.mode));
        for tally in &mode.categories {
            out.push_str(&format!(" {:.3} |", tally.means().1));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_times_read_as_the_benchmark_writes_them() {
        let cases = [
            ("1:56 pm on 8 May, 2023", "2023-05-08T13:56"),
            ("12:09 am on 1 January, 2024", "2024-01-01T00:09"),
            ("12:30 pm on 29 February, 2024", "2024-02-29T12:30"),
            ("9:00 am on 31 December, 1999", "1999-12-31T09:00"),
        ];
        for (text, expected) in cases {
            let ms = date_time_ms(text).unwrap();
            let days = ms.div_euclid(86_400_000);
            let minutes = ms.rem_euclid(86_400_000) / 60_000;
            let (y, m, d) = expected[..10]
                .split('-')
                .map(|part| part.parse::<i64>().unwrap())
                .collect::<Vec<_>>()
                .try_into()
                .map(|[y, m, d]: [i64; 3]| (y, m, d))
                .unwrap();
            assert_eq!(days, days_from_civil(y, m, d), "{text}");
            let (h, min): (i64, i64) = (
                expected[11..13].parse().unwrap(),
                expected[14..16].parse().unwrap(),
            );
            assert_eq!(minutes, h * 60 + min, "{text}");
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert!(date_time_ms("May 8").is_err());
    }

    /// Two conversations in one pool: the second's turns follow the first's, each question's
    /// evidence names its own conversation's turns, and one whose evidence names no turn is
    /// left out.
    #[test]
    fn the_meaning_corpus_pools_the_turns_and_maps_the_evidence() {
        let dir = tempfile::TempDir::new().unwrap();
        let conversation = |turns: &[(&str, &str)], qa: Value| {
            json!({
                "speaker_a": "Anna",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": turns
                    .iter()
                    .map(|(dia, text)| json!({"speaker": "Anna", "dia_id": dia, "text": text}))
                    .collect::<Vec<_>>(),
                "qa": qa,
            })
        };
        let first = conversation(
            &[
                ("D1:1", "I adopted a puppy."),
                ("D1:2", "It loves the beach."),
            ],
            json!([{"question": "What did Anna adopt?", "evidence": ["D1:1"], "category": 1}]),
        );
        let second = conversation(
            &[
                ("D1:1", "My sister is a nurse."),
                ("D1:2", "She works nights."),
                ("D1:3", "Bye."),
            ],
            json!([
                {"question": "When does she work?", "evidence": ["D1:2", "D1:3"], "category": 1},
                {"question": "Unanswerable?", "evidence": ["D9:9"], "category": 1},
            ]),
        );
        let files: Vec<PathBuf> = [("a.json", first), ("b.json", second)]
            .into_iter()
            .map(|(name, value)| {
                let path = dir.path().join(name);
                std::fs::write(&path, value.to_string()).unwrap();
                path
            })
            .collect();
        let corpus = meaning_corpus(&files).unwrap();
        assert_eq!(corpus.documents.len(), 5);
        assert_eq!(corpus.needle_queries, 0);
        assert_eq!(corpus.queries.len(), 2);
        assert_eq!(corpus.answers, [vec![0], vec![3, 4]]);
    }

    #[test]
    fn the_baseline_ranks_rare_shared_words_first() {
        let texts = [
            "Anna: I adopted a puppy named Biscuit last week.",
            "Ben: Nice! I went hiking with my sister.",
            "Anna: The puppy loves the beach.",
            "Ben: My sister is a nurse.",
        ];
        let bm25 = Bm25::new(&texts);
        assert_eq!(bm25.top("Which puppy did Anna adopt?", 1), [0]);
        assert_eq!(bm25.top("What does Ben's sister do?", 2).len(), 2);
        assert_eq!(bm25.top("nurse", 1), [3]);
    }
}
