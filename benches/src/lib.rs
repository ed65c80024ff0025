//! The workload runner: the reference plugin's benchmark, run through vilvona's real store and
//! lossless engine.
//!
//! For each turn of a transcript: ingest the turn's messages as one batch; run the after-turn
//! compaction at a 128,000-token budget (threshold 0.75); every 10th turn assemble at 128,000.
//! Then grep every needle's query and check its answer is in a returned row, and count the
//! needle answers present verbatim in one final assembly. The summarizer's own time is measured
//! and subtracted from compaction time.

pub mod cells;
pub mod economics;
pub mod graph;
pub mod hold;
pub mod locomo;
pub mod meaning;
pub mod quantized;
mod runs;
pub mod signs;

pub use runs::{
    BootstrapFigures, ForgetFigures, ServeMemoryFigures, run_bootstrap, run_forget,
    run_serve_memory,
};

/// The benches run the engine with the `vilvona` binary's allocator (see its `main.rs`), so
/// that their memory and times are the binary's.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use vilvona_core::engine::{AssembleParams, ContextEngine, IngestBatchParams};
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::{SummarizeError, Summarizer, Summary, SummaryRequest};
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_lossless::{
    CompactionRequest, EmbeddingSelection, LosslessConfig, LosslessEngine, StoreSelection,
    ToolCaller,
};
use vilvona_summarize::ExtractiveSummarizer;
use vilvona_transcript::for_each_turn;

/// The budget every step uses.
pub const BUDGET: u64 = 128_000;

/// The workload's summarizer: ~zero cost, so the engine's own overhead is what is measured.
/// `"Summary: "` + the first `4 × min(2400, ceil(0.35 × ceil(len/4)))` characters of the source.
#[derive(Debug, Default)]
pub struct FakeSummarizer;

#[async_trait]
impl Summarizer for FakeSummarizer {
    fn id(&self) -> &str {
        "fake/v1"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let source = request.source_text();
        let tokens = (source.chars().count() as f64 / 4.0).ceil();
        let keep = 4 * (2_400.0_f64).min((0.35 * tokens).ceil()) as usize;
        let mut text = String::from("Summary: ");
        text.extend(source.chars().take(keep));
        Ok(Summary::new(text, request.level))
    }
}

/// [`FakeSummarizer`]'s summaries after a remote model's latency (100 ms).
#[derive(Debug, Default)]
pub struct RemoteSummarizer;

#[async_trait]
impl Summarizer for RemoteSummarizer {
    fn id(&self) -> &str {
        "remote/v1"
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        FakeSummarizer.summarize(request).await
    }
}

/// Times another summarizer: its own time is subtracted from compaction time.
#[derive(Debug)]
pub struct TimedSummarizer {
    pub inner: Arc<dyn Summarizer>,
    pub nanos: AtomicU64,
    pub calls: AtomicU64,
}

#[async_trait]
impl Summarizer for TimedSummarizer {
    fn id(&self) -> &str {
        self.inner.id()
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let started = Instant::now();
        let result = self.inner.summarize(request).await;
        self.nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        result
    }
}

/// A planted fact, as `gen_session.py --needles` writes it.
#[derive(Clone, Debug, Deserialize)]
pub struct Needle {
    pub query: String,
    pub answer: String,
}

/// Which summarizer the run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SummarizerChoice {
    Fake,
    Extractive,
    /// The fake summaries, each after 100 ms, as a remote model would take.
    Remote,
}

/// Median and 99th percentile, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Spread {
    pub median_ms: f64,
    pub p99_ms: f64,
    pub count: usize,
}

fn spread(samples: &[Duration]) -> Spread {
    if samples.is_empty() {
        return Spread::default();
    }
    let mut sorted: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1_000.0).collect();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    Spread {
        median_ms: at(0.5),
        p99_ms: at(0.99),
        count: sorted.len(),
    }
}

/// Everything the runner records.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    pub transcript: String,
    pub summarizer: SummarizerChoice,
    pub turns: usize,
    pub messages: usize,
    pub ingest: Spread,
    pub ingest_median_by_tenth_ms: Vec<f64>,
    pub compaction: Spread,
    pub compacting_turns: usize,
    /// All compacting turns' compaction time together, summarizer excluded.
    pub compaction_total_ms: f64,
    /// Summaries made per compacting turn (the reference makes more, smaller ones).
    pub summaries_per_compacting_turn: f64,
    pub summarizer_calls: u64,
    pub summarizer_ms_per_call: f64,
    pub summaries_by_depth: std::collections::BTreeMap<u32, u64>,
    /// Summaries anywhere in the DAG whose tokens exceed their kind's target.
    pub summaries_over_target: u64,
    pub assemble: Spread,
    pub final_estimated_tokens: u64,
    pub grep: Spread,
    /// The same queries by meaning, when the store embeds.
    pub grep_semantic: Option<Spread>,
    /// … and in hybrid mode (text and meaning fused).
    pub grep_hybrid: Option<Spread>,
    /// How long the runner waited after the ingest for the vectors the background still had
    /// to make (grep by meaning is timed once every document has its vectors).
    #[serde(default)]
    pub vectors_waited_ms: f64,
    /// Grep from a second process (read-only) while this one ingests, when asked for.
    pub grep_from_another_process: Option<Spread>,
    pub needles: usize,
    pub needles_found: usize,
    pub needles_in_final_context: usize,
    /// Assemblies at 128k with a needle's query as the new user turn (three wordings each):
    /// the whole assembly, recall at assembly included.
    #[serde(default)]
    pub assemble_with_recall: Option<Spread>,
    /// … and how many of those prompts hold the needle's answer.
    #[serde(default)]
    pub needles_in_prompt_with_recall: usize,
    pub store_bytes: u64,
    pub transcript_bytes: u64,
    pub store_to_transcript: f64,
    /// The store once every index segment merged into one and the WAL was checkpointed (as
    /// after `vilvona forget` or a retention run), measured after grep.
    pub store_bytes_merged: u64,
    pub store_to_transcript_merged: f64,
    /// Peak resident memory of the whole run, the maintenance at its end included.
    pub peak_rss_mib: f64,
    /// Peak resident memory through ingest, compaction, assembly and grep: before the
    /// integrity check and the index's merge into one segment at the end.
    pub peak_rss_before_maintenance_mib: f64,
    /// Resident memory after grep, before that maintenance: the process's own (heap, stacks:
    /// Linux `RssAnon`) and the pages of mapped files it holds (`RssFile`: the index's files,
    /// which the kernel can drop and read again).
    pub rss_anon_after_grep_mib: f64,
    pub rss_file_after_grep_mib: f64,
    pub wall_s: f64,
}

/// Peak resident memory of this process (Linux `VmHWM`), in MiB.
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// A memory figure of this process's `/proc/self/status` (Linux), in MiB; 0 elsewhere.
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|value| {
                    value
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// One turn: a user message and everything until the next one, with entry ids.
pub type Turn = Vec<(AgentMessage, String)>;

/// Streams a transcript's turns through a small channel, so memory does not grow with the
/// transcript: a reader thread parses while the engine works.
pub fn stream_turns(path: &Path) -> tokio::sync::mpsc::Receiver<Result<Turn>> {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Turn>>(64);
    let path = path.to_owned();
    std::thread::spawn(move || {
        let outcome = for_each_turn(&path, |turn| {
            let turn: Turn = turn.messages.into_iter().zip(turn.entry_ids).collect();
            sender
                .blocking_send(Ok(turn))
                .map_err(|_| "the runner stopped".to_owned())
        });
        if let Err(error) = outcome {
            let _ = sender.blocking_send(Err(anyhow!("reading {}: {error}", path.display())));
        }
    });
    receiver
}

impl SummarizerChoice {
    fn build(self, estimator: &Arc<dyn TokenEstimator>) -> Arc<dyn Summarizer> {
        match self {
            SummarizerChoice::Fake => Arc::new(FakeSummarizer),
            SummarizerChoice::Extractive => Arc::new(ExtractiveSummarizer::new(estimator.clone())),
            SummarizerChoice::Remote => Arc::new(RemoteSummarizer),
        }
    }
}

/// How to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub transcript: PathBuf,
    pub needles: PathBuf,
    pub summarizer: SummarizerChoice,
    /// Where the store goes (a temporary directory when `None`).
    pub store_dir: Option<PathBuf>,
    /// Keep the history in this PostgreSQL database instead (the headline run only).
    pub store_url: Option<String>,
    /// Print progress every this many turns (0 = silent).
    pub progress_every: usize,
    /// Start `probe` (this runner in `--probe-grep` mode) beside the ingestion: it greps the
    /// needles from a second process, read-only, while this one writes.
    pub probe: Option<PathBuf>,
    /// Count instructions under callgrind (see [`Instructions`]).
    pub instructions: bool,
    /// Embed messages and summaries (the default, built-in model) for recall by meaning.
    pub embedding: bool,
}

/// Instruction counts under `valgrind --tool=callgrind --instr-atstart=no` (with the `instructions`
/// feature; natively the client requests do nothing): the ingest of turns 800–899 and the
/// compaction of turns 900–999 are instrumented call by call, then 100 assembles at 128k and every
/// grep, and each is dumped under its name (`benches/instructions.sh` reads the dumps). Shared
/// machines' speed drifts; these counts do not.
#[derive(Debug)]
pub struct Instructions {
    enabled: bool,
}

/// The turns whose ingest is counted; the next as many have their compaction counted.
pub const COUNTED_TURNS: std::ops::Range<usize> = 800..900;

impl Instructions {
    fn turn_phase(&self, turn: usize) -> Option<&'static str> {
        let width = COUNTED_TURNS.len();
        match turn {
            _ if !self.enabled => None,
            turn if COUNTED_TURNS.contains(&turn) => Some("ingest"),
            turn if (COUNTED_TURNS.end..COUNTED_TURNS.end + width).contains(&turn) => {
                Some("compaction")
            }
            _ => None,
        }
    }

    fn start(&self) {
        #[cfg(feature = "instructions")]
        if self.enabled {
            crabgrind::callgrind::start_instrumentation();
        }
    }

    fn stop(&self) {
        #[cfg(feature = "instructions")]
        if self.enabled {
            crabgrind::callgrind::stop_instrumentation();
        }
    }

    /// Before a counted window: the index merged into one segment, so that no background
    /// merge lands in the window (with the index committing by document count only, as
    /// `benches/instructions.sh` sets it, too few segments follow to start one).
    async fn settle(&self, engine: &LosslessEngine) -> Result<()> {
        if self.enabled {
            engine.store().reclaim_space().await?;
        }
        Ok(())
    }

    /// Writes what was counted since the last dump as `name calls`, and starts over.
    fn dump(&self, name: &str, calls: usize) {
        #[cfg(feature = "instructions")]
        if self.enabled {
            crabgrind::callgrind::dump_stats(format!("{name} {calls}").as_str());
        }
        #[cfg(not(feature = "instructions"))]
        let _ = (name, calls);
    }
}

/// Waits until every indexed document has its vectors (the background makes those the index
/// left for later while it caught up with a fast ingest), so that grep by meaning is timed in
/// steady state and not beside the filler's work; answers how long that took.
async fn vectors_made(engine: &LosslessEngine) -> Result<Duration> {
    let begin = Instant::now();
    while engine.store().documents_waiting_for_vectors().await? > 0 {
        anyhow::ensure!(
            begin.elapsed() < Duration::from_secs(600),
            "documents still wait for their vectors after ten minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(begin.elapsed())
}

/// The session the runner writes and the probe reads.
const SESSION: &str = "workload";
const SESSION_KEY: &str = "agent:main:workload";

/// A second process that greps the store while the runner ingests; its latencies come back
/// on its stdout when the runner closes its stdin.
struct GrepProbe {
    child: std::process::Child,
}

impl GrepProbe {
    fn start(program: &Path, store_dir: &Path, needles: &Path) -> Result<GrepProbe> {
        let child = std::process::Command::new(program)
            .arg("--probe-grep")
            .arg("--store-dir")
            .arg(store_dir)
            .arg("--needles")
            .arg(needles)
            .arg("--transcript")
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(GrepProbe { child })
    }

    fn finish(mut self) -> Result<Spread> {
        drop(self.child.stdin.take());
        let output = self
            .child
            .wait_with_output()
            .context("waiting for the probe")?;
        if !output.status.success() {
            return Err(anyhow!("the grep probe failed ({})", output.status));
        }
        let micros: Vec<u64> =
            serde_json::from_slice(&output.stdout).context("the probe's report")?;
        Ok(spread(
            &micros
                .into_iter()
                .map(Duration::from_micros)
                .collect::<Vec<_>>(),
        ))
    }
}

/// The probe: opens the store read-only and greps every needle's query, round after round,
/// until stdin closes; prints the latencies (µs) as a JSON array.
pub async fn probe_grep(store_dir: &Path, needles: &Path) -> Result<()> {
    let needles: Vec<Needle> = serde_json::from_str(
        &std::fs::read_to_string(needles)
            .with_context(|| format!("reading {}", needles.display()))?,
    )?;
    let estimator: Arc<dyn TokenEstimator> = Arc::new(HeuristicEstimator);
    let engine = LosslessEngine::open_read_only(
        store_dir,
        LosslessConfig::default(),
        Arc::new(FakeSummarizer),
        estimator,
    )
    .await
    .map_err(|error| anyhow!("opening the store read-only: {error}"))?;
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = closed.clone();
    std::thread::spawn(move || {
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        watcher.store(true, Ordering::SeqCst);
    });
    let caller = ToolCaller {
        session_id: SESSION.to_owned(),
        session_key: Some(SESSION_KEY.to_owned()),
    };
    let mut micros = Vec::new();
    while !closed.load(Ordering::SeqCst) {
        for needle in &needles {
            let begin = Instant::now();
            engine
                .call_tool(
                    &caller,
                    "vilvona_grep",
                    &json!({"query": needle.query, "mode": "text", "scope": "both"}),
                )
                .await?;
            micros.push(begin.elapsed().as_micros() as u64);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{}", serde_json::to_string(&micros)?);
    Ok(())
}

impl RunOptions {
    /// Where the run keeps its store: `store_dir`, else a temporary directory (removed when
    /// the returned guard drops).
    fn store_place(&self) -> Result<(tempfile::TempDir, PathBuf)> {
        let temporary = tempfile::TempDir::new().context("creating a temporary store directory")?;
        let dir = self
            .store_dir
            .clone()
            .unwrap_or_else(|| temporary.path().join("store"));
        Ok((temporary, dir))
    }
}

/// Runs the workload.
pub async fn run(options: &RunOptions) -> Result<Figures> {
    let started = Instant::now();
    let mut turns = stream_turns(&options.transcript);
    let needles: Vec<Needle> = serde_json::from_str(
        &std::fs::read_to_string(&options.needles)
            .with_context(|| format!("reading {}", options.needles.display()))?,
    )
    .with_context(|| format!("parsing {}", options.needles.display()))?;
    let (_temporary, store_dir) = options.store_place()?;
    let estimator: Arc<dyn TokenEstimator> = Arc::new(HeuristicEstimator);
    let inner = options.summarizer.build(&estimator);
    let timed = Arc::new(TimedSummarizer {
        inner,
        nanos: AtomicU64::new(0),
        calls: AtomicU64::new(0),
    });
    let summarizer_nanos = || timed.nanos.load(Ordering::Relaxed);
    let summarizer_calls = || timed.calls.load(Ordering::Relaxed);
    let summarizer: Arc<dyn Summarizer> = timed.clone();
    let config = LosslessConfig {
        default_token_budget: BUDGET,
        store_dir: Some(store_dir.display().to_string()),
        store: options
            .store_url
            .clone()
            .map(|url| StoreSelection::Postgres { url }),
        embedding: if options.embedding {
            EmbeddingSelection::Builtin
        } else {
            EmbeddingSelection::None
        },
        ..LosslessConfig::default()
    };
    let targets = (config.leaf_target_tokens, config.condensed_target_tokens);
    let store = config
        .open_store(None, false, false)
        .await
        .map_err(|error| anyhow!("opening the store: {error}"))?;
    let engine = LosslessEngine::new(store, summarizer, estimator, config);
    let session = SESSION;
    let conversation = engine.conversation(session, Some(SESSION_KEY)).await?;
    let mut probe = None;

    let counting = Instructions {
        enabled: options.instructions,
    };
    let mut compactions_counted = 0;
    let mut ingest = Vec::new();
    let mut compaction = Vec::new();
    let mut summaries_made = 0u64;
    let mut assemble = Vec::new();
    let mut messages = 0;
    let mut index = 0;
    while let Some(turn) = turns.recv().await {
        let turn = turn?;
        messages += turn.len();
        let (batch, ids): (Vec<AgentMessage>, Vec<Option<String>>) = turn
            .iter()
            .map(|(message, id)| (message.clone(), Some(id.clone())))
            .unzip();
        let phase = counting.turn_phase(index);
        if index == COUNTED_TURNS.start || index == COUNTED_TURNS.end {
            counting.settle(&engine).await?;
        }
        if phase == Some("ingest") {
            counting.start();
        }
        let begin = Instant::now();
        engine
            .ingest_batch(&IngestBatchParams {
                session_id: session.to_owned(),
                session_key: Some("agent:main:workload".to_owned()),
                messages: batch,
                entry_ids: ids,
                is_heartbeat: false,
            })
            .await?;
        ingest.push(begin.elapsed());
        counting.stop();
        if index + 1 == COUNTED_TURNS.end {
            counting.dump("ingest", COUNTED_TURNS.len());
        }
        if index == 0
            && let Some(program) = &options.probe
        {
            probe = Some(GrepProbe::start(program, &store_dir, &options.needles)?);
        }

        let summarizer_before = summarizer_nanos();
        if phase == Some("compaction") {
            counting.start();
        }
        let begin = Instant::now();
        let report = engine
            .compact_conversation(conversation.id, CompactionRequest::routine(BUDGET))
            .await?;
        let elapsed = begin.elapsed();
        counting.stop();
        if phase == Some("compaction") && report.summaries_created > 0 {
            compactions_counted += 1;
        }
        if index + 1 == COUNTED_TURNS.end + COUNTED_TURNS.len() {
            // Per compacting turn, as the wall-time figure.
            counting.dump("compaction", compactions_counted);
        }
        if report.summaries_created > 0 {
            let own = Duration::from_nanos(summarizer_nanos() - summarizer_before);
            compaction.push(elapsed.saturating_sub(own));
            summaries_made += u64::from(report.summaries_created);
        }
        if (index + 1) % 10 == 0 {
            let begin = Instant::now();
            engine.assemble_context(conversation.id, BUDGET).await?;
            assemble.push(begin.elapsed());
        }
        if options.progress_every > 0 && (index + 1) % options.progress_every == 0 {
            eprintln!(
                "  {} turns (resident: {:.0} MiB own, {:.0} MiB of mapped files)",
                index + 1,
                status_mib("RssAnon:"),
                status_mib("RssFile:")
            );
        }
        index += 1;
    }
    let turn_count = index;
    if counting.enabled {
        counting.settle(&engine).await?;
        counting.start();
        for _ in 0..100 {
            engine.assemble_context(conversation.id, BUDGET).await?;
        }
        counting.stop();
        counting.dump("assemble", 100);
    }
    let grep_from_another_process = match probe {
        Some(probe) => Some(probe.finish()?),
        None => None,
    };

    let caller = ToolCaller {
        session_id: session.to_owned(),
        session_key: Some(SESSION_KEY.to_owned()),
    };
    // Grep in steady state: the index commits on a short timer in real use (rows beyond it are
    // searched in SQLite); commit what waits before timing, as a turn later would find it.
    engine.store().index_doc_count().await?;
    let vectors_waited = vectors_made(&engine).await?;
    counting.settle(&engine).await?;
    let mut grep = Vec::with_capacity(needles.len() * GREP_ROUNDS);
    let mut found = 0;
    for needle in &needles {
        let mut result = Value::Null;
        for _ in 0..GREP_ROUNDS {
            counting.start();
            let begin = Instant::now();
            result = engine
                .call_tool(
                    &caller,
                    "vilvona_grep",
                    &json!({"query": needle.query, "mode": "text", "scope": "both"}),
                )
                .await?;
            grep.push(begin.elapsed());
            counting.stop();
        }
        let mut hit = false;
        for row in result["results"].as_array().cloned().unwrap_or_default() {
            let described = engine
                .call_tool(&caller, "vilvona_describe", &json!({"id": row["id"]}))
                .await?;
            let text = described["text"]
                .as_str()
                .or_else(|| described["content"].as_str())
                .unwrap_or("");
            if text.contains(&needle.answer) {
                hit = true;
                break;
            }
        }
        found += usize::from(hit);
    }
    counting.dump("grep", grep.len());
    // The same queries by meaning, and fused, when the store embeds.
    let mut by_mode = Vec::new();
    for mode in ["semantic", "hybrid"] {
        if !options.embedding {
            by_mode.push(None);
            continue;
        }
        let mut timed = Vec::with_capacity(needles.len() * GREP_ROUNDS);
        for needle in &needles {
            for _ in 0..GREP_ROUNDS {
                counting.start();
                let begin = Instant::now();
                engine
                    .call_tool(
                        &caller,
                        "vilvona_grep",
                        &json!({"query": needle.query, "mode": mode, "scope": "both"}),
                    )
                    .await?;
                timed.push(begin.elapsed());
                counting.stop();
            }
        }
        counting.dump(&format!("grep-{mode}"), timed.len());
        by_mode.push(Some(spread(&timed)));
    }
    let (grep_semantic, grep_hybrid) = (by_mode[0], by_mode[1]);
    let assembled = engine
        .assemble(&AssembleParams {
            session_id: session.to_owned(),
            session_key: Some("agent:main:workload".to_owned()),
            token_budget: Some(BUDGET),
            ..AssembleParams::default()
        })
        .await?;
    let context_text: String = assembled
        .messages
        .iter()
        .map(AgentMessage::plain_text)
        .collect::<Vec<_>>()
        .join("\n");
    let in_context = needles
        .iter()
        .filter(|needle| context_text.contains(&needle.answer))
        .count();
    // Recall at assembly: each needle asked as the new user turn, in three wordings (each a
    // new turn: none takes the block made for another).
    let mut with_recall = Vec::with_capacity(needles.len() * RECALL_WORDINGS.len());
    let mut in_prompt = 0;
    for needle in &needles {
        for wording in RECALL_WORDINGS {
            let begin = Instant::now();
            let asked = engine
                .assemble(&AssembleParams {
                    session_id: session.to_owned(),
                    session_key: Some("agent:main:workload".to_owned()),
                    token_budget: Some(BUDGET),
                    prompt: Some(wording.replace("{}", &needle.query)),
                    ..AssembleParams::default()
                })
                .await?;
            with_recall.push(begin.elapsed());
            in_prompt += usize::from(
                asked
                    .messages
                    .iter()
                    .any(|message| message.plain_text().contains(&needle.answer)),
            );
        }
    }

    let peak_rss_before_maintenance_mib = peak_rss_mib();
    let (rss_anon_after_grep_mib, rss_file_after_grep_mib) =
        (status_mib("RssAnon:"), status_mib("RssFile:"));
    let items = engine.store().context(conversation.id).await?;
    let mut by_depth = std::collections::BTreeMap::new();
    let integrity = engine.store().integrity_check().await?;
    let mut below = Vec::new();
    for item in &items {
        if let vilvona_store::ItemContent::Summary(summary) = &item.content {
            *by_depth.entry(summary.depth).or_insert(0) += 1;
            below.push(summary.clone());
        }
    }
    // Every summary of the DAG (each is reachable from the context): its text against its
    // target (the stored count also holds the `<summary>` wrapper the model sees).
    let mut over_target = 0;
    while let Some(summary) = below.pop() {
        let target = match summary.kind {
            vilvona_core::summarize::SummaryKind::Leaf => targets.0,
            vilvona_core::summarize::SummaryKind::Condensed => targets.1,
        };
        over_target += u64::from(HeuristicEstimator.text_tokens(&summary.content) > target);
        for child in engine.store().children(summary.row_id).await? {
            if let vilvona_store::ItemContent::Summary(child) = child {
                below.push(child);
            }
        }
    }
    if !integrity.is_healthy() {
        return Err(anyhow!(
            "the store failed its integrity check: {:?}",
            integrity.problems
        ));
    }
    let store_bytes = engine.store().disk_bytes();
    engine.store().reclaim_space().await?;
    let store_bytes_merged = engine.store().disk_bytes();
    let transcript_bytes = std::fs::metadata(&options.transcript).map_or(0, |meta| meta.len());
    let tenths: Vec<f64> = (0..10)
        .map(|tenth| {
            let chunk = ingest.len().div_ceil(10).max(1);
            let slice: Vec<Duration> = ingest
                .iter()
                .skip(tenth * chunk)
                .take(chunk)
                .copied()
                .collect();
            spread(&slice).median_ms
        })
        .collect();
    let calls = summarizer_calls();
    Ok(Figures {
        transcript: options.transcript.display().to_string(),
        summarizer: options.summarizer,
        turns: turn_count,
        messages,
        ingest: spread(&ingest),
        ingest_median_by_tenth_ms: tenths,
        compacting_turns: compaction.len(),
        compaction_total_ms: compaction.iter().sum::<Duration>().as_secs_f64() * 1e3,
        summaries_per_compacting_turn: ratio(summaries_made, compaction.len() as u64),
        compaction: spread(&compaction),
        summarizer_calls: calls,
        summarizer_ms_per_call: if calls == 0 {
            0.0
        } else {
            summarizer_nanos() as f64 / calls as f64 / 1e6
        },
        summaries_by_depth: by_depth,
        summaries_over_target: over_target,
        assemble: spread(&assemble),
        final_estimated_tokens: assembled.estimated_tokens,
        grep: spread(&grep),
        grep_semantic,
        grep_hybrid,
        vectors_waited_ms: vectors_waited.as_secs_f64() * 1e3,
        grep_from_another_process,
        needles: needles.len(),
        needles_found: found,
        needles_in_final_context: in_context,
        assemble_with_recall: (!with_recall.is_empty()).then(|| spread(&with_recall)),
        needles_in_prompt_with_recall: in_prompt,
        store_bytes,
        transcript_bytes,
        store_to_transcript: ratio(store_bytes, transcript_bytes),
        store_bytes_merged,
        store_to_transcript_merged: ratio(store_bytes_merged, transcript_bytes),
        peak_rss_mib: peak_rss_mib(),
        peak_rss_before_maintenance_mib,
        rss_anon_after_grep_mib,
        rss_file_after_grep_mib,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// How many times grep runs each needle's query (the first answer is checked).
const GREP_ROUNDS: usize = 10;

/// The user turns each needle's query is asked in, for recall at assembly.
const RECALL_WORDINGS: [&str; 3] = ["{}", "What do we know about {}?", "Remind me: {}."];

/// `part ÷ whole`, 0 for nothing.
fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The figures as a small table.
pub fn table(figures: &Figures) -> String {
    let value = |spread: &Spread| {
        format!(
            "{:.3} ms (p99 {:.3} ms, n={})",
            spread.median_ms, spread.p99_ms, spread.count
        )
    };
    let tenths: Vec<String> = figures
        .ingest_median_by_tenth_ms
        .iter()
        .map(|ms| format!("{ms:.3}"))
        .collect();
    let rows: Vec<(&str, String)> = vec![
        (
            "transcript",
            format!(
                "{} ({} turns, {} messages)",
                figures.transcript, figures.turns, figures.messages
            ),
        ),
        (
            "summarizer",
            format!(
                "{:?} ({} calls, {:.3} ms per call)",
                figures.summarizer, figures.summarizer_calls, figures.summarizer_ms_per_call
            ),
        ),
        ("ingest per turn, median", value(&figures.ingest)),
        (
            "ingest medians by tenth",
            format!("{} ms", tenths.join(" → ")),
        ),
        (
            "compaction per compacting turn",
            format!(
                "{} over {} turns",
                value(&figures.compaction),
                figures.compacting_turns
            ),
        ),
        (
            "compaction, all turns",
            format!(
                "{:.1} ms; {:.2} summaries per compacting turn",
                figures.compaction_total_ms, figures.summaries_per_compacting_turn
            ),
        ),
        (
            "summaries by depth",
            format!("{:?}", figures.summaries_by_depth),
        ),
        (
            "summaries over their target",
            figures.summaries_over_target.to_string(),
        ),
        (
            "assemble at 128k",
            format!(
                "{}, {} tokens assembled",
                value(&figures.assemble),
                figures.final_estimated_tokens
            ),
        ),
        (
            "grep",
            format!(
                "{}; {}/{} needles found",
                value(&figures.grep),
                figures.needles_found,
                figures.needles
            ),
        ),
        (
            "grep, semantic",
            figures
                .grep_semantic
                .as_ref()
                .map_or_else(|| "not measured (--no-embedding)".to_owned(), value),
        ),
        (
            "grep, hybrid",
            figures
                .grep_hybrid
                .as_ref()
                .map_or_else(|| "not measured (--no-embedding)".to_owned(), value),
        ),
        (
            "vectors waited for after ingest",
            format!("{:.0} ms", figures.vectors_waited_ms),
        ),
        (
            "grep from another process",
            figures
                .grep_from_another_process
                .as_ref()
                .map_or_else(|| "not measured (--concurrent-grep)".to_owned(), value),
        ),
        (
            "needles in the final context",
            format!(
                "{} of {}",
                figures.needles_in_final_context, figures.needles
            ),
        ),
        (
            "assemble with recall (asked)",
            figures.assemble_with_recall.as_ref().map_or_else(
                || "not measured".to_owned(),
                |spread| {
                    format!(
                        "{}; the answer in {} of {} prompts",
                        value(spread),
                        figures.needles_in_prompt_with_recall,
                        figures.needles * RECALL_WORDINGS.len()
                    )
                },
            ),
        ),
        (
            "store ÷ transcript bytes",
            format!(
                "{:.2}× ({} / {})",
                figures.store_to_transcript, figures.store_bytes, figures.transcript_bytes
            ),
        ),
        (
            "… once the index merged",
            format!(
                "{:.2}× ({} / {})",
                figures.store_to_transcript_merged,
                figures.store_bytes_merged,
                figures.transcript_bytes
            ),
        ),
        (
            "peak RSS",
            format!(
                "{:.0} MiB ({:.0} MiB before the maintenance at the end)",
                figures.peak_rss_mib, figures.peak_rss_before_maintenance_mib,
            ),
        ),
        (
            "resident after grep",
            format!(
                "{:.0} MiB own (heap), {:.0} MiB of mapped files",
                figures.rss_anon_after_grep_mib, figures.rss_file_after_grep_mib,
            ),
        ),
        ("wall time", format!("{:.1} s", figures.wall_s)),
    ];
    rows.iter()
        .map(|(name, value)| format!("{name:<32} {value}\n"))
        .collect()
}

/// The figures as one JSON document.
pub fn to_json(figures: &Figures) -> Result<Value> {
    Ok(serde_json::to_value(figures)?)
}
