//! `economics --requests mock.jsonl --turns results.jsonl --engine NAME --window TOKENS`: the
//! gateway soak's figures (turns, wall per turn, facts answered, prompt-cache economics) from
//! what its driver and its mock model recorded, as one JSON document.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use vilvona_benches::economics::{read_recorded_requests, read_turn_results, soak_figures};

#[derive(Parser, Debug)]
#[command(about = "Computes the gateway soak's figures from its recordings")]
struct Args {
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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let figures = read_recorded_requests(&args.requests).and_then(|requests| {
        let turns = read_turn_results(&args.turns)?;
        Ok(soak_figures(&args.engine, args.window, &turns, &requests))
    });
    match figures.and_then(|figures| Ok(serde_json::to_string_pretty(&figures)?)) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("economics: {error:#}");
            ExitCode::FAILURE
        }
    }
}
