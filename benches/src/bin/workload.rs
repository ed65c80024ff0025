//! `workload --transcript FILE --needles FILE [--summarizer fake|extractive] [--concurrent-grep]
//! [--json] [--hold RECORDED.json]`, or `workload --generate TURNS …` (the workload crate's own
//! generator, seed 7, ten needles: no Python).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use vilvona_benches::{RunOptions, SummarizerChoice, run, table, to_json};

#[derive(Parser, Debug)]
#[command(about = "Runs the reference workload through vilvona's store and lossless engine")]
struct Args {
    #[arg(long, required_unless_present = "generate")]
    transcript: Option<PathBuf>,
    #[arg(long, required_unless_present = "generate")]
    needles: Option<PathBuf>,
    /// Instead of --transcript and --needles: a session of TURNS turns made by the workload
    /// crate's generator (seed 7, ten needles), written to a temporary directory first.
    #[arg(long, value_name = "TURNS", conflicts_with_all = ["transcript", "needles"])]
    generate: Option<usize>,
    /// Hold the run's figures against these (a `--json` document of an earlier run): print
    /// each held figure and fail when one is past its margin (see `vilvona_benches::hold`).
    #[arg(long, value_name = "RECORDED")]
    hold: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = SummarizerChoice::Fake)]
    summarizer: SummarizerChoice,
    /// Keep the store here instead of a temporary directory.
    #[arg(long)]
    store_dir: Option<PathBuf>,
    /// Keep the history in this PostgreSQL database (an empty one: the run's session must
    /// be new there) instead of SQLite; the headline run only.
    #[arg(long, value_name = "URL")]
    store_url: Option<String>,
    /// Also time grep from a second process (read-only) while this one ingests.
    #[arg(long)]
    concurrent_grep: bool,
    /// Mark the counted calls for callgrind (run under benches/instructions.sh)
    #[arg(long)]
    instructions: bool,
    /// (internal) Be that second process: grep the store at --store-dir until stdin closes.
    #[arg(long, hide = true)]
    probe_grep: bool,
    /// Instead of the headline run: spread the transcript over N sessions, forget half of
    /// them, and report the store's size before and after (one JSON document).
    #[arg(long, value_name = "N")]
    forget_half_of: Option<usize>,
    /// Instead of the headline run: import the whole transcript with the engine's bootstrap
    /// and report how long it took (one JSON document).
    #[arg(long)]
    bootstrap: bool,
    /// Instead of the headline run: drive N sessions through one `vilvona serve --stdio`
    /// (the binary at --vilvona) and report its memory as they accumulate (one JSON document).
    #[arg(long, value_name = "N")]
    serve_sessions: Option<usize>,
    /// Turns per session for --serve-sessions.
    #[arg(long, default_value_t = 4)]
    turns_per_session: usize,
    /// The vilvona binary --serve-sessions starts.
    #[arg(long, value_name = "PATH")]
    vilvona: Option<PathBuf>,
    /// Store no vectors (recall by meaning off), to compare ingest and size with.
    #[arg(long)]
    no_embedding: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.probe_grep {
        let (Some(store_dir), Some(needles)) = (&args.store_dir, &args.needles) else {
            eprintln!("workload: --probe-grep needs --store-dir and --needles");
            return ExitCode::FAILURE;
        };
        return match vilvona_benches::probe_grep(store_dir, needles).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("workload probe: {error:#}");
                ExitCode::FAILURE
            }
        };
    }
    let probe = if args.concurrent_grep {
        match std::env::current_exe() {
            Ok(program) => Some(program),
            Err(error) => {
                eprintln!("workload: cannot find this program to start the grep probe: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    if args.instructions && !cfg!(feature = "instructions") {
        eprintln!(
            "workload: --instructions needs the runner built with its `instructions` feature (benches/instructions.sh builds it)"
        );
        return ExitCode::FAILURE;
    }
    let generated = match args.generate.map(generate) {
        Some(Ok(generated)) => Some(generated),
        Some(Err(error)) => {
            eprintln!("workload: generating the session: {error:#}");
            return ExitCode::FAILURE;
        }
        None => None,
    };
    let (transcript, needles) = match (&generated, args.transcript, args.needles) {
        (Some(dir), _, _) => (
            dir.path().join("session.jsonl"),
            dir.path().join("needles.json"),
        ),
        (None, Some(transcript), Some(needles)) => (transcript, needles),
        _ => {
            eprintln!("workload: --transcript and --needles, or --generate TURNS");
            return ExitCode::FAILURE;
        }
    };
    let recorded = match args.hold.as_deref().map(read_json).transpose() {
        Ok(recorded) => recorded,
        Err(error) => {
            eprintln!("workload: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let options = RunOptions {
        transcript,
        needles,
        summarizer: args.summarizer,
        store_dir: args.store_dir,
        store_url: args.store_url,
        progress_every: if args.json { 0 } else { 1_000 },
        probe,
        instructions: args.instructions,
        embedding: !args.no_embedding,
    };
    if let Some(sessions) = args.serve_sessions {
        let Some(vilvona) = &args.vilvona else {
            eprintln!("workload: --serve-sessions needs --vilvona PATH");
            return ExitCode::FAILURE;
        };
        return print_json(vilvona_benches::run_serve_memory(
            &options,
            vilvona,
            sessions,
            args.turns_per_session,
        ));
    }
    if args.bootstrap {
        return print_json(vilvona_benches::run_bootstrap(&options).await);
    }
    if let Some(sessions) = args.forget_half_of {
        return print_json(vilvona_benches::run_forget(&options, sessions).await);
    }
    let figures = run(&options).await;
    if let (Ok(figures), Some(recorded)) = (&figures, &recorded) {
        print!("{}", table(figures));
        return match to_json(figures).and_then(|now| vilvona_benches::hold::hold(&now, recorded)) {
            Ok(held) => {
                print!("{}", vilvona_benches::hold::report(&held));
                if held.iter().all(|held| held.holds) {
                    ExitCode::SUCCESS
                } else {
                    eprintln!("workload: figures past their margins (BROKEN above)");
                    ExitCode::FAILURE
                }
            }
            Err(error) => {
                eprintln!("workload: {error:#}");
                ExitCode::FAILURE
            }
        };
    }
    match figures {
        Ok(figures) if args.json => print_json(to_json(&figures)),
        Ok(figures) => {
            print!("{}", table(&figures));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("workload: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// A temporary directory holding `session.jsonl` and `needles.json` of `turns` generated turns.
/// The session is written a turn at a time: held whole (535 MB at 100,000 turns), the memory
/// it had used stayed with the process and was counted in the run's resident memory.
fn generate(turns: usize) -> anyhow::Result<tempfile::TempDir> {
    use std::io::Write;
    let dir = tempfile::tempdir()?;
    let mut session =
        std::io::BufWriter::new(std::fs::File::create(dir.path().join("session.jsonl"))?);
    let needles = vilvona_workload::write_jsonl(turns, 7, 10, &mut session)?;
    session.flush()?;
    std::fs::write(
        dir.path().join("needles.json"),
        serde_json::to_string_pretty(&needles)?,
    )?;
    Ok(dir)
}

fn read_json(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Prints figures as one JSON document, or the error.
fn print_json<T: serde::Serialize>(figures: anyhow::Result<T>) -> ExitCode {
    match figures.and_then(|figures| Ok(serde_json::to_string_pretty(&figures)?)) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("workload: {error:#}");
            ExitCode::FAILURE
        }
    }
}
