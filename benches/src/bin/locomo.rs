//! Recall on natural questions: `locomo FOLDER [--json] [--embedding JSON] [--at-least R]
//! [--prompt] [--prompt-at-least R]` replays every LoCoMo conversation file (`*.json`) in FOLDER
//! through the lossless engine, asks each question with evidence in each mode of `vilvona_grep`
//! and with a plain BM25, and prints recall@5/@10 and hit@10 per mode and recall@10 per
//! category (Markdown, or one JSON document). `--at-least R` fails unless the default mode's
//! recall@10 is at least R (a regression check for `.ci/run`). `--prompt` measures instead
//! what the assembled prompt holds of each question's evidence at an 8,000-token budget, with
//! recall at assembly off and on; `--prompt-at-least R` fails unless the share with it on is
//! at least R.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser;
use vilvona_benches::locomo::{conversation_files, evaluate, evaluate_prompt, prompt_table, table};
use vilvona_lossless::EmbeddingSelection;

#[derive(Parser, Debug)]
#[command(about = "Recall on LoCoMo's natural questions, per mode and category")]
struct Args {
    /// A folder of LoCoMo conversation files.
    folder: PathBuf,
    /// One JSON document instead of Markdown.
    #[arg(long)]
    json: bool,
    /// The embedding to search by meaning with, as the plugin's `embedding` setting (JSON);
    /// the built-in model when not given.
    #[arg(long)]
    embedding: Option<String>,
    /// Fail unless the default mode (hybrid) recalls at least this share of the evidence at 10.
    #[arg(long)]
    at_least: Option<f64>,
    /// Measure the evidence in the assembled prompt (at an 8,000-token budget) instead.
    #[arg(long)]
    prompt: bool,
    /// With `--prompt`: fail unless recall at assembly brings at least this share of the
    /// evidence into the prompt.
    #[arg(long)]
    prompt_at_least: Option<f64>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<ExitCode> {
    let args = Args::parse();
    let files = conversation_files(&args.folder)?;
    let embedding: EmbeddingSelection = match &args.embedding {
        Some(json) => serde_json::from_str(json).context("reading --embedding")?,
        None => EmbeddingSelection::default(),
    };
    if args.prompt {
        let figures =
            evaluate_prompt(&files, &embedding, |step| eprintln!("locomo: {step}")).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&figures)?);
        } else {
            print!("{}", prompt_table(&figures));
        }
        if let Some(bar) = args.prompt_at_least {
            let share = figures.on.all.mean();
            if share < bar {
                eprintln!(
                    "locomo: recall at assembly brings {share:.3} of the evidence into the prompt, under {bar:.3}"
                );
                return Ok(ExitCode::FAILURE);
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let figures = evaluate(&files, &embedding, |step| eprintln!("locomo: {step}")).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        print!("{}", table(&figures));
    }
    if let Some(bar) = args.at_least {
        let recall = figures
            .mode("hybrid")
            .map_or(0.0, |mode| mode.all.means().1);
        if recall < bar {
            eprintln!("locomo: hybrid recall@10 {recall:.3} is under {bar:.3}");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
