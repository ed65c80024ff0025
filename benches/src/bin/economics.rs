//! What a user pays per turn.
//!
//! - `economics soak --requests mock.jsonl --turns results.jsonl --engine NAME --window TOKENS`:
//!   the gateway soak's figures (turns, wall per turn, facts answered, prompt-cache economics)
//!   from what its driver and its mock model recorded, as one JSON document.
//! - `economics replay --transcript FILE [--windows 32000,128000,200000]
//!   [--system-prompt-tokens 10000] [--json]`: the economics replay: the transcript through the
//!   host with `legacy` and with `lossless` at each window, what every model request would cost
//!   (a Markdown table, or one JSON document).
//! - `economics compare --vilvona FIGURES --legacy FIGURES [--check]`: the two engines' figures
//!   of one soak side by side (a Markdown table); `--check` fails unless vilvona's cached input
//!   per turn is at most 0.8 of legacy's, its cache-hit ratio on turn requests at least 90 %,
//!   and its summarizer share of prompt tokens at most legacy's; `--check-cost` checks the
//!   cost alone (the soak matrix's short cells); `--at-most R` moves the cost bar to R of
//!   legacy's and `--hit-at-least R` the cache-hit bar to R; `--check-summarizer` also fails
//!   when vilvona's summarizer read more prompt tokens than legacy's; either check fails when
//!   the two runs are not of one conversation (what the user said turn by turn, the window,
//!   how the provider billed; `economics soak --host` and `--route`: the host, the provider's
//!   shape, restarts and resets), as a recorded legacy run (`benches/hold/soak-legacy-*.json`)
//!   may not be; what the mock model answers is not compared. `--also` adds columns; a run made with
//!   `economics soak --cell NAME` is headed by its cell.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use vilvona_benches::economics::{
    ReplayOptions, SoakFigures, not_comparable, read_recorded_requests, read_turn_results, replay,
    replay_table, soak_figures, soak_table,
};

#[derive(Parser, Debug)]
#[command(about = "What a user pays per turn: the prompt-cache economics of model requests")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The gateway soak's figures from its recordings.
    Soak {
        /// The mock model's requests (mock.jsonl).
        #[arg(long)]
        requests: PathBuf,
        /// The driver's turns (results.jsonl).
        #[arg(long)]
        turns: PathBuf,
        /// The engine that served the run (a label).
        #[arg(long)]
        engine: String,
        /// The model's window (a label).
        #[arg(long)]
        window: u64,
        /// The soak matrix's cell the run is (a label).
        #[arg(long)]
        cell: Option<String>,
        /// The host that ran it (`openclaw@VERSION`): runs of different hosts are not compared.
        #[arg(long)]
        host: Option<String>,
        /// The model's side of the run (provider, usage shape, restarts, resets, sessions):
        /// runs of different routes are not compared.
        #[arg(long)]
        route: Option<String>,
    },
    /// Replays a transcript through both engines at each window.
    Replay {
        #[arg(long)]
        transcript: PathBuf,
        /// Windows to replay at, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [32_000u64, 128_000, 200_000])]
        windows: Vec<u64>,
        /// The host's system prompt, in tokens.
        #[arg(long, default_value_t = 10_000)]
        system_prompt_tokens: u64,
        /// One JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Two engines' soak figures side by side.
    Compare {
        #[arg(long)]
        vilvona: PathBuf,
        #[arg(long)]
        legacy: PathBuf,
        /// More runs to show beside them (not checked).
        #[arg(long)]
        also: Vec<PathBuf>,
        /// Fail unless vilvona meets the bars (cost, cache hits, summarizer share).
        #[arg(long)]
        check: bool,
        /// Fail unless vilvona's cached input per turn is at most 0.8 of legacy's (the soak
        /// matrix's bar for short cells, whose first uncached turns weigh too much for a
        /// cache-hit bar).
        #[arg(long)]
        check_cost: bool,
        /// The cost bar of `--check` and `--check-cost`: vilvona's cached input per turn at
        /// most this share of legacy's.
        #[arg(long, default_value_t = 0.8)]
        at_most: f64,
        /// The cache-hit bar of `--check`: vilvona's cache-hit ratio on turn requests at least
        /// this.
        #[arg(long, default_value_t = 0.9)]
        hit_at_least: f64,
        /// Also fail unless vilvona's summarizer read no more prompt tokens than legacy's (a
        /// model summarizer's cell).
        #[arg(long)]
        check_summarizer: bool,
    },
}

fn read_figures(path: &Path) -> Result<SoakFigures> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not soak figures", path.display()))
}

async fn run(args: Args) -> Result<bool> {
    match args.command {
        Command::Replay {
            transcript,
            windows,
            system_prompt_tokens,
            json,
        } => {
            let mut runs = Vec::new();
            for window in windows {
                for engine in ["legacy", "lossless"] {
                    eprintln!("economics: {engine} at {window} tokens");
                    runs.push(
                        replay(&ReplayOptions {
                            transcript: transcript.clone(),
                            engine: engine.to_owned(),
                            window,
                            system_prompt_tokens,
                        })
                        .await?,
                    );
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
            } else {
                println!("{}", replay_table(&runs));
            }
            Ok(true)
        }
        Command::Soak {
            requests,
            turns,
            engine,
            window,
            cell,
            host,
            route,
        } => {
            let requests = read_recorded_requests(&requests)?;
            let turns = read_turn_results(&turns)?;
            let figures = SoakFigures {
                cell,
                host,
                route,
                ..soak_figures(&engine, window, &turns, &requests)
            };
            println!("{}", serde_json::to_string_pretty(&figures)?);
            Ok(true)
        }
        Command::Compare {
            vilvona,
            legacy,
            also,
            check,
            check_cost,
            at_most,
            hit_at_least,
            check_summarizer,
        } => {
            let (vilvona, legacy) = (read_figures(&vilvona)?, read_figures(&legacy)?);
            let also = also
                .iter()
                .map(|path| read_figures(path))
                .collect::<Result<Vec<_>>>()?;
            let mut runs = vec![&legacy, &vilvona];
            runs.extend(also.iter());
            println!("{}", soak_table(&runs));
            if !check && !check_cost {
                return Ok(true);
            }
            let mut failed = not_comparable(&vilvona, &legacy);
            let ratio = vilvona.cached_units_per_turn / legacy.cached_units_per_turn.max(1.0);
            eprintln!("economics: vilvona's cached input per turn is {ratio:.2} of legacy's");
            if ratio > at_most {
                failed.push(format!(
                    "cached input per turn is {ratio:.2} of legacy's (at most {at_most:.2})"
                ));
            }
            let (read, legacy_read) = (
                vilvona.cache.summarizer_input_tokens,
                legacy.cache.summarizer_input_tokens,
            );
            if check_summarizer && read > legacy_read {
                failed.push(format!(
                    "the summarizer read {read} prompt tokens, legacy's {legacy_read}"
                ));
            }
            if check && vilvona.cache.turn_cache_hit_ratio < hit_at_least {
                failed.push(format!(
                    "the cache-hit ratio on turn requests is {:.1} % (at least {:.0} %)",
                    vilvona.cache.turn_cache_hit_ratio * 100.0,
                    hit_at_least * 100.0
                ));
            }
            if check && vilvona.cache.summarizer_share > legacy.cache.summarizer_share {
                failed.push("the summarizer's share of prompt tokens is above legacy's".to_owned());
            }
            for failure in &failed {
                eprintln!("economics: {failure}");
            }
            Ok(failed.is_empty())
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("economics: {error:#}");
            ExitCode::FAILURE
        }
    }
}
