//! The workload runner's narrower runs: forgetting sessions, bootstrapping from a long
//! transcript, and the memory a `vilvona serve` process holds.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow};
use serde::Serialize;
use serde_json::{Value, json};
use vilvona_core::engine::{BootstrapParams, ContextEngine, IngestBatchParams};
use vilvona_core::message::AgentMessage;
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};
use vilvona_lossless::{CompactionRequest, LosslessConfig, LosslessEngine};
use vilvona_transcript::for_each_turn;

use crate::{BUDGET, RunOptions, stream_turns};

/// What `--forget-half-of N` measured: the transcript's turns spread over N sessions (a
/// contiguous share each), then half of the sessions forgotten and the space reclaimed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForgetFigures {
    pub sessions: usize,
    pub turns: usize,
    /// Database and index, after the index merged and free pages went back (as after any
    /// forget), before forgetting.
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub after_over_before: f64,
    /// Bytes per 1,000 turns of the whole store before forgetting.
    pub growth_per_thousand_turns: u64,
    pub forget_ms_per_session: f64,
    pub reclaim_ms: f64,
    pub integrity_ok: bool,
}

/// Spreads the transcript over `sessions` sessions, forgets the first half of them, and
/// measures the store before and after (both after reclaiming space, so the figures compare
/// like with like).
pub async fn run_forget(options: &RunOptions, sessions: usize) -> Result<ForgetFigures> {
    let sessions = sessions.max(2);
    let mut turns = Vec::new();
    let mut stream = stream_turns(&options.transcript);
    while let Some(turn) = stream.recv().await {
        turns.push(turn?);
    }
    let (_temporary, store_dir) = options.store_place()?;
    let estimator: Arc<dyn TokenEstimator> = Arc::new(HeuristicEstimator);
    let summarizer = options.summarizer.build(&estimator);
    let config = LosslessConfig {
        default_token_budget: BUDGET,
        ..LosslessConfig::default()
    };
    let engine = LosslessEngine::open(&store_dir, config, summarizer, estimator)
        .await
        .map_err(|error| anyhow!("opening the store: {error}"))?;
    let share = turns.len().div_ceil(sessions);
    for (index, chunk) in turns.chunks(share).enumerate() {
        let session = format!("session-{index:02}");
        let conversation = engine.conversation(&session, Some(&session)).await?;
        for turn in chunk {
            let (batch, ids): (Vec<AgentMessage>, Vec<Option<String>>) = turn
                .iter()
                .map(|(message, id)| (message.clone(), Some(format!("{session}-{id}"))))
                .unzip();
            engine
                .ingest_batch(&IngestBatchParams {
                    session_id: session.clone(),
                    session_key: Some(session.clone()),
                    messages: batch,
                    entry_ids: ids,
                    is_heartbeat: false,
                })
                .await?;
            engine
                .compact_conversation(conversation.id, CompactionRequest::routine(BUDGET))
                .await?;
        }
    }
    let store = engine.store().clone();
    let reclaim_started = Instant::now();
    let bytes_before = store.reclaim_space().await?.bytes_after;
    let first_reclaim = reclaim_started.elapsed();
    let forget_started = Instant::now();
    let forgotten = sessions / 2;
    for index in 0..forgotten {
        engine
            .forget_session(&format!("session-{index:02}"))
            .await
            .map_err(|error| anyhow!("forgetting: {error}"))?;
    }
    let forget_elapsed = forget_started.elapsed();
    let reclaim_started = Instant::now();
    let bytes_after = store.reclaim_space().await?.bytes_after;
    let reclaim_elapsed = reclaim_started.elapsed().max(first_reclaim);
    let integrity_ok = store.integrity_check().await?.is_healthy();
    Ok(ForgetFigures {
        sessions,
        turns: turns.len(),
        bytes_before,
        bytes_after,
        after_over_before: bytes_after as f64 / bytes_before.max(1) as f64,
        growth_per_thousand_turns: bytes_before * 1_000 / turns.len().max(1) as u64,
        forget_ms_per_session: forget_elapsed.as_secs_f64() * 1e3 / forgotten as f64,
        reclaim_ms: reclaim_elapsed.as_secs_f64() * 1e3,
        integrity_ok,
    })
}

/// What `--bootstrap` measured: the whole transcript imported into a fresh store by the
/// engine's `bootstrap` (parsing, token counting, storing and indexing every message).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapFigures {
    pub messages: u64,
    pub import_ms: f64,
    pub messages_per_second: f64,
    /// Then the backlog compacted under the workload's budget, as the first turn after the
    /// import would: how long, and how many summaries in how many passes.
    pub catch_up_ms: f64,
    pub summaries: u32,
    pub passes: u32,
}

/// Imports the transcript as a session the engine has never seen.
pub async fn run_bootstrap(options: &RunOptions) -> Result<BootstrapFigures> {
    let (_temporary, store_dir) = options.store_place()?;
    let estimator: Arc<dyn TokenEstimator> = Arc::new(HeuristicEstimator);
    let engine = LosslessEngine::open(
        &store_dir,
        LosslessConfig::default(),
        options.summarizer.build(&estimator),
        estimator,
    )
    .await
    .map_err(|error| anyhow!("opening the store: {error}"))?;
    let started = Instant::now();
    let result = engine
        .bootstrap(&BootstrapParams {
            session_id: "bootstrap".to_owned(),
            session_key: None,
            session_file: Some(options.transcript.display().to_string()),
        })
        .await?;
    let elapsed = started.elapsed().as_secs_f64();
    let messages = result.imported_messages.unwrap_or(0);
    let conversation = engine.conversation("bootstrap", None).await?;
    let catching_up = Instant::now();
    let (mut summaries, mut passes) = (0, 0);
    loop {
        let report = engine
            .compact_conversation(conversation.id, CompactionRequest::routine(BUDGET))
            .await?;
        summaries += report.summaries_created;
        passes += report.passes;
        if report.summaries_created == 0 {
            break;
        }
    }
    Ok(BootstrapFigures {
        messages,
        import_ms: elapsed * 1e3,
        messages_per_second: messages as f64 / elapsed.max(1e-9),
        catch_up_ms: catching_up.elapsed().as_secs_f64() * 1e3,
        summaries,
        passes,
    })
}

/// What `--serve-sessions N` measured: one `vilvona serve --stdio` process (the OpenClaw
/// plugin's) driven through N sessions of a few turns each, its resident memory sampled as the
/// sessions accumulate.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeMemoryFigures {
    pub sessions: usize,
    pub turns_per_session: usize,
    /// `(sessions so far, resident MiB, of which anonymous MiB)`: the rest is file pages
    /// (the memory-mapped index, the binary), which the kernel can drop.
    pub rss_mib: Vec<(usize, f64, f64)>,
    /// The process's high-water mark at the end.
    pub peak_rss_mib: f64,
    pub wall_s: f64,
}

/// A JSON-RPC client of `vilvona serve --stdio` over its pipes.
struct ServeClient {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl ServeClient {
    fn start(vilvona: &Path, state_dir: &Path) -> Result<ServeClient> {
        let mut child = std::process::Command::new(vilvona)
            .arg("--state-dir")
            .arg(state_dir)
            .args(["serve", "--stdio"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", vilvona.display()))?;
        let input = child.stdin.take().context("the server's stdin")?;
        let output = std::io::BufReader::new(child.stdout.take().context("the server's stdout")?);
        Ok(ServeClient {
            child,
            input,
            output,
            next_id: 1,
        })
    }

    /// One request and its answer (the server's own requests are not expected here: the
    /// summarizer is the extractive one).
    fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        use std::io::{BufRead as _, Write as _};
        let id = self.next_id;
        self.next_id += 1;
        writeln!(
            self.input,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        )?;
        self.input.flush()?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.output.read_line(&mut line)? == 0 {
                return Err(anyhow!("the server closed its output during {method}"));
            }
            let answer: Value = serde_json::from_str(&line)?;
            if answer["id"] == json!(id) {
                if let Some(error) = answer.get("error") {
                    return Err(anyhow!("{method}: {error}"));
                }
                return Ok(answer["result"].clone());
            }
        }
    }

    /// Resident, anonymous resident and peak memory of the server, in MiB (from /proc).
    fn memory_mib(&self) -> Result<(f64, f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<f64>().ok())
                .map_or(0.0, |kib| kib / 1024.0)
        };
        Ok((field("VmRSS:"), field("RssAnon:"), field("VmHWM:")))
    }
}

/// Drives `sessions` sessions of `turns_per_session` turns (taken in order from the transcript,
/// round and round) through one server, as the OpenClaw plugin does: `assemble`, then
/// `afterTurn` with the session's messages so far.
pub fn run_serve_memory(
    options: &RunOptions,
    vilvona: &Path,
    sessions: usize,
    turns_per_session: usize,
) -> Result<ServeMemoryFigures> {
    let mut turns: Vec<Vec<Value>> = Vec::new();
    for_each_turn(&options.transcript, |turn| {
        turns.push(
            turn.messages
                .iter()
                .filter_map(|message| serde_json::to_value(message).ok())
                .collect(),
        );
        Ok(())
    })
    .map_err(|error| anyhow!("reading {}: {error}", options.transcript.display()))?;
    if turns.is_empty() {
        return Err(anyhow!("{} has no turns", options.transcript.display()));
    }
    let (_temporary, state_dir) = options.store_place()?;
    std::fs::create_dir_all(&state_dir)?;
    let started = Instant::now();
    let mut client = ServeClient::start(vilvona, &state_dir)?;
    client.call(
        "initialize",
        json!({"stateDir": state_dir, "engineId": "lossless", "config": {"freshTailCount": 16}}),
    )?;
    let mut samples = Vec::new();
    let mut next_turn = 0;
    let sample_every = (sessions / 8).max(1);
    for session in 0..sessions {
        let session_id = format!("session-{session:05}");
        let mut history: Vec<Value> = Vec::new();
        for _ in 0..turns_per_session {
            let turn = &turns[next_turn % turns.len()];
            next_turn += 1;
            let before = history.len();
            history.extend(turn.iter().cloned());
            client.call(
                "assemble",
                json!({"sessionId": session_id, "messages": history[..before + 1.min(turn.len())], "tokenBudget": 8_000}),
            )?;
            client.call(
                "afterTurn",
                json!({"sessionId": session_id, "messages": history, "prePromptMessageCount": before, "tokenBudget": 8_000}),
            )?;
        }
        if (session + 1) % sample_every == 0 || session + 1 == sessions {
            let (resident, anonymous, _) = client.memory_mib()?;
            samples.push((session + 1, resident, anonymous));
            if options.progress_every > 0 {
                eprintln!("  {} sessions", session + 1);
            }
        }
    }
    let (_, _, peak) = client.memory_mib()?;
    drop(client.input);
    let _ = client.child.wait();
    Ok(ServeMemoryFigures {
        sessions,
        turns_per_session,
        rss_mib: samples,
        peak_rss_mib: peak,
        wall_s: started.elapsed().as_secs_f64(),
    })
}
