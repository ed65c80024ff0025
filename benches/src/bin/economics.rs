//! What a user pays per turn.
//!
//! - `economics soak --requests mock.jsonl --turns results.jsonl --engine NAME --window TOKENS`:
//!   the gateway soak's figures (turns, wall per turn, facts answered, prompt-cache economics)
//!   from what its driver and its mock model recorded, as one JSON document.
//! - `economics compare --vilvona FIGURES --legacy FIGURES [--check]`: the two engines' figures
//!   of one soak side by side (a Markdown table); `--check` fails unless vilvona's cached input
//!   per turn is at most 0.8 of legacy's, its cache-hit ratio on turn requests at least 90 %,
//!   and its summarizer share of prompt tokens at most legacy's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use vilvona_benches::economics::{
    SoakFigures, read_recorded_requests, read_turn_results, soak_figures, soak_table,
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
    },
    /// Two engines' soak figures side by side.
    Compare {
        #[arg(long)]
        vilvona: PathBuf,
        #[arg(long)]
        legacy: PathBuf,
        /// Fail unless vilvona meets the bars (cost, cache hits, summarizer share).
        #[arg(long)]
        check: bool,
    },
}

fn read_figures(path: &Path) -> Result<SoakFigures> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not soak figures", path.display()))
}

fn run(args: Args) -> Result<bool> {
    match args.command {
        Command::Soak {
            requests,
            turns,
            engine,
            window,
        } => {
            let requests = read_recorded_requests(&requests)?;
            let turns = read_turn_results(&turns)?;
            let figures = soak_figures(&engine, window, &turns, &requests);
            println!("{}", serde_json::to_string_pretty(&figures)?);
            Ok(true)
        }
        Command::Compare {
            vilvona,
            legacy,
            check,
        } => {
            let (vilvona, legacy) = (read_figures(&vilvona)?, read_figures(&legacy)?);
            println!("{}", soak_table(&[&legacy, &vilvona]));
            if !check {
                return Ok(true);
            }
            let mut failed = Vec::new();
            let ratio = vilvona.cached_units_per_turn / legacy.cached_units_per_turn.max(1.0);
            if ratio > 0.8 {
                failed.push(format!(
                    "cached input per turn is {ratio:.2} of legacy's (at most 0.80)"
                ));
            }
            if vilvona.cache.turn_cache_hit_ratio < 0.9 {
                failed.push(format!(
                    "the cache-hit ratio on turn requests is {:.1} % (at least 90 %)",
                    vilvona.cache.turn_cache_hit_ratio * 100.0
                ));
            }
            if vilvona.cache.summarizer_share > legacy.cache.summarizer_share {
                failed.push("the summarizer's share of prompt tokens is above legacy's".to_owned());
            }
            for failure in &failed {
                eprintln!("economics: {failure}");
            }
            Ok(failed.is_empty())
        }
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("economics: {error:#}");
            ExitCode::FAILURE
        }
    }
}
