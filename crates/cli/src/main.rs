//! `vilvona`: the command line.

mod archive;
mod context;
mod dag;
mod inspect;
mod replay;
mod retention;
mod session;
mod timeline;
mod treemap;
mod ui;
mod views;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use vilvona_core::admin::TokenPrices;
use vilvona_runtime::{Host, HostOptions, default_state_dir};

/// jemalloc rather than the system's allocator: glibc's keeps what a thread frees in that
/// thread's arena, so the same workload run's peak at T = 20,000 turns was about 170 or about
/// 290 MiB by chance; jemalloc's is steady and no higher, and the turns are faster
/// (`workload --generate 20000`, ten runs of each).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "vilvona",
    about = "Context engines for long-lived agents: demo, replay, inspect and recall"
)]
struct Cli {
    /// The state directory (default: $VILVONA_STATE_DIR, else ~/.vilvona).
    #[arg(long, global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The configuration file (default: <state dir>/vilvona.json5).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Keep the lossless engine's history in this PostgreSQL database, whatever the
    /// configuration says (`postgres://user:password@host/db`, or `host=DIR dbname=NAME`).
    #[arg(long, global = true, value_name = "URL", env = "VILVONA_STORE_URL")]
    store_url: Option<String>,
    /// More log output (repeat for more); RUST_LOG also works.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a coding-agent session, replay it through the lossless engine, show what happened.
    Demo {
        /// How many turns the generated session has.
        #[arg(long, default_value_t = 400)]
        turns: usize,
    },
    /// Replay an OpenClaw session transcript (JSONL) through the host lifecycle.
    Replay {
        /// The transcript to replay (one JSON entry per line).
        file: PathBuf,
        /// The engine to replay through (default: the one the contextEngine slot selects).
        #[arg(long, value_name = "ID")]
        engine: Option<String>,
        /// The model's context window in tokens (default: the configured one).
        #[arg(long, value_name = "TOKENS")]
        context_window: Option<u64>,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Check the configuration, the engines, the store and the state directory's permissions.
    Doctor {
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
        /// Tighten group- or world-accessible paths in the state directory (directories 0700,
        /// files 0600) before checking.
        #[arg(long)]
        fix: bool,
    },
    /// The /context views of a stored session.
    Context {
        /// Which view: the breakdown, the breakdown in detail, JSON, a PNG map, or the summary
        /// DAG.
        #[arg(value_enum)]
        view: ContextView,
        /// The session, by key or id (`vilvona sessions` lists them).
        #[arg(long)]
        session: String,
        /// Where `map` (default context-map.png) and `dag --format png` (default
        /// context-dag.png) write their PNG; `dag --format dot` writes here instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// How `dag` is drawn.
        #[arg(long, value_enum, default_value_t = DagFormat::Dot)]
        format: DagFormat,
        /// The workspace whose bootstrap files are injected (AGENTS.md, SOUL.md, …).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// `timeline`, `history`: print one JSON document.
        #[arg(long)]
        json: bool,
        /// `history`: price the turns the host did not price, INPUT,CACHED,WRITE,OUTPUT per
        /// million tokens (as `vilvona ui --prices`).
        #[arg(long, value_name = "PRICES", value_parser = parse_prices)]
        prices: Option<TokenPrices>,
    },
    /// Manual /compact through the host.
    Compact {
        /// The session, by key or id (`vilvona sessions` lists them).
        #[arg(long)]
        session: String,
        /// What the summaries should keep or focus on.
        #[arg(long)]
        instructions: Option<String>,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Search a session's whole history (vilvona_grep).
    Grep {
        /// Words, a phrase, or a regular expression (see --mode).
        query: String,
        /// The session whose history is searched, by key or id.
        #[arg(long)]
        session: String,
        /// How the query matches (hybrid: by words and by meaning together).
        #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
        mode: Mode,
        /// Which rows are searched.
        #[arg(long, value_enum, default_value_t = Scope::Both)]
        scope: Scope,
        /// Only rows at or after this time (RFC 3339, e.g. 2026-03-02T09:00:00Z).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only rows before this time (RFC 3339).
        #[arg(long, value_name = "TIME")]
        before: Option<String>,
        /// How hits are ordered.
        #[arg(long, value_enum, default_value_t = Order::Relevance)]
        order: Order,
        /// At most this many hits (1–50).
        #[arg(long, default_value_t = 10)]
        limit: u64,
        /// Print the tool's JSON result.
        #[arg(long)]
        json: bool,
    },
    /// Describe a summary, message or stored file (vilvona_describe).
    Describe {
        /// A summary id (sum_…), message id (msg_…) or file id (file_…).
        id: String,
        /// The session whose recall scope applies, by key or id.
        #[arg(long)]
        session: String,
        /// For a file: a line range like 1-200.
        #[arg(long, value_name = "FIRST-LAST")]
        lines: Option<String>,
        /// Print the tool's JSON result.
        #[arg(long)]
        json: bool,
    },
    /// Expand a summary into what it covers (vilvona_expand).
    Expand {
        /// A summary id (sum_…).
        id: String,
        /// The session whose recall scope applies, by key or id.
        #[arg(long)]
        session: String,
        /// At most this many tokens of children (capped by maxExpandTokens).
        #[arg(long, value_name = "N")]
        token_cap: Option<u64>,
        /// Continue from this child (the cursor a previous expansion printed).
        #[arg(long, value_name = "N")]
        cursor: Option<u64>,
        /// Print the tool's JSON result.
        #[arg(long)]
        json: bool,
    },
    /// Answer a question from a session's whole history, citing the messages it rests on
    /// (vilvona_expand_query; the configured model answers, else the extractive default).
    Ask {
        /// The question.
        question: String,
        /// The session whose history is searched, by key or id.
        #[arg(long)]
        session: String,
        /// Words to search the history for (default: the question).
        #[arg(long)]
        query: Option<String>,
        /// Tokens of history read at most (capped by maxExpandTokens by default).
        #[arg(long, value_name = "N")]
        token_cap: Option<u64>,
        /// Print the tool's JSON result.
        #[arg(long)]
        json: bool,
    },
    /// Counts for a stored session.
    Stats {
        /// The session, by key or id.
        #[arg(long)]
        session: String,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Stored sessions.
    Sessions {
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Forget a session and everything derived from it (summaries, index documents, stored
    /// files no other session references, grants), or only its messages before a time
    /// (summaries that covered them are rebuilt from what remains). Space is reclaimed after.
    Forget {
        /// The session, by key or id.
        #[arg(long)]
        session: String,
        /// Forget only the messages created before this time (RFC 3339).
        #[arg(long, value_name = "TIME")]
        before: Option<String>,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Write a session's whole history (messages, summaries and their edges, the context,
    /// stored files, committed turns, state) to one file, read as one snapshot.
    Export {
        /// The session, by key or id.
        #[arg(long)]
        session: String,
        /// The file to write (replaced whole, or left as it was).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Store a session exported by `vilvona export` (from this store or another), in one
    /// transaction, verified by reading it back.
    Import {
        /// The file `vilvona export` wrote.
        file: PathBuf,
        /// The engine that keeps the session (default: the one that keeps this state
        /// directory's history, else the one the contextEngine slot selects).
        #[arg(long)]
        engine: Option<String>,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Apply the retention policy (plugins.entries.lossless.config.retention): archive idle
    /// sessions, delete old ones, keep the store under its size cap.
    Retention {
        /// Only list what would be archived or deleted, and why.
        #[arg(long)]
        dry_run: bool,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the recall index from the database.
    RebuildIndex,
    /// Manage engine plugins in the configuration.
    Plugins {
        #[command(subcommand)]
        action: PluginsAction,
    },
    /// The context panel in a browser: what the model sees, the summary DAG, search, the
    /// store's health. Serves 127.0.0.1 read-only and prints the URL (with its token)
    Ui {
        /// The port (0: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Let the page rebuild the recall index (each time after a preview and a
        /// confirmation); without it the server only reads.
        #[arg(long)]
        allow_repair: bool,
        /// Exit when stdin closes: for a parent process that starts it (the OpenClaw plugin
        /// does), so it never outlives its parent.
        #[arg(long)]
        exit_with_stdin: bool,
        /// Price the turns the host did not price: INPUT,CACHED,WRITE,OUTPUT in money per
        /// million tokens of fresh input, input read from the cache, input written to it, and
        /// output (as 3,0.3,3.75,15). Without it (and without the host's prices) the charts
        /// show tokens only.
        #[arg(long, value_name = "PRICES", value_parser = parse_prices)]
        prices: Option<TokenPrices>,
    },
    /// Serve one engine over JSON-RPC 2.0 (for the OpenClaw plugin in bindings/openclaw).
    Serve {
        /// Use stdin/stdout (one JSON object per line; logs go to stderr).
        #[arg(long, required = true)]
        stdio: bool,
    },
}

#[derive(Subcommand, Debug)]
enum PluginsAction {
    /// Uninstall an engine plugin: if the contextEngine slot selects it, the slot is reset to
    /// `legacy` (only that value in the file changes; comments and order stay).
    Uninstall {
        /// The engine id (for example `lossless`).
        id: String,
    },
}

/// `--prices INPUT,CACHED,WRITE,OUTPUT`.
fn parse_prices(text: &str) -> Result<TokenPrices, String> {
    TokenPrices::parse(text)
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum ContextView {
    /// The breakdown: system prompt, workspace files, skills, tools, the conversation by
    /// kind, and how full the window is.
    List,
    /// The breakdown with the largest skills and tools and the transcript's counts.
    Detail,
    /// The whole report as JSON.
    Json,
    /// A treemap of the context window as a PNG (see --out).
    Map,
    /// The summary DAG: depths, kinds and tokens (see --format and --out).
    Dag,
    /// The compactions, newest first: what each fold folded and wrote, by which summarizer,
    /// and how much of the next prompt the provider's cache could still serve (see --json).
    Timeline,
    /// The session turn by turn (the newest 1,000 at most): the context each model call was
    /// assembled from by kind, the folds each turn made, the provider's usage (see --json).
    History,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(crate) enum DagFormat {
    /// Graphviz DOT text.
    Dot,
    /// A PNG picture, one row per depth.
    Png,
    /// JSON: every summary with its depth, tokens and children, and whether the context
    /// holds it (what `vilvona ui` draws).
    Json,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum Mode {
    /// Any of the words, ranked by BM25.
    Text,
    /// The words next to each other, in order.
    Phrase,
    /// A regular expression (linear time), newest first.
    Regex,
    /// By meaning: the nearest embeddings (the built-in model by default; no network).
    Semantic,
    /// Words and meaning together (rank fusion of text and semantic).
    Hybrid,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum Scope {
    /// Stored messages only.
    Messages,
    /// Summaries only.
    Summaries,
    /// Messages and summaries.
    Both,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum Order {
    /// Best match first.
    Relevance,
    /// Newest first.
    Recency,
}

/// The name clap gives a value (what the recall tools take as the argument's value).
trait ValueEnumName {
    fn name(&self) -> String;
}

impl<T: ValueEnum> ValueEnumName for T {
    fn name(&self) -> String {
        self.to_possible_value()
            .map(|value| value.get_name().to_owned())
            .unwrap_or_default()
    }
}

/// Threads for the store's blocking reads and writes. With glibc's allocator each thread that
/// allocated could get its own arena, where what it freed stayed: a gateway serving thousands
/// of sessions held three times the memory with tokio's default (512) than with a few. The
/// allocator is jemalloc now (`ALLOCATOR`), whose caches are per thread too.
const BLOCKING_THREADS: usize = 8;

/// How the command line opens the host.
#[derive(Clone)]
pub(crate) struct Global {
    pub(crate) state_dir: PathBuf,
    pub(crate) config: Option<PathBuf>,
    pub(crate) store_url: Option<String>,
}

impl Global {
    pub(crate) fn options(&self) -> HostOptions {
        let mut options = HostOptions::new(&self.state_dir);
        options.config_path = self.config.clone();
        options.store_url = self.store_url.clone();
        options
    }

    /// A host for a command that writes (replay, compact, rebuild-index).
    pub(crate) async fn host(&self) -> Result<Host> {
        self.host_with(self.options()).await
    }

    /// A host for a command that only reads (grep, describe, expand, stats, sessions, context):
    /// engines open their storage read-only, so it works while any other process writes.
    pub(crate) async fn reader(&self) -> Result<Host> {
        let mut options = self.options();
        options.read_only = true;
        self.host_with(options).await
    }

    /// Opens a host whose selected engine must serve: on the command line nothing is
    /// substituted silently. An engine that cannot start fails the command with its reason.
    pub(crate) async fn host_with(&self, mut options: HostOptions) -> Result<Host> {
        options.require_selected = true;
        Self::host_as_configured(options).await
    }

    /// Opens a host as the gateway would, with the configured failure policy (doctor reports
    /// what failed instead of failing).
    pub(crate) async fn host_as_configured(options: HostOptions) -> Result<Host> {
        Host::open(options, |_, _| Ok(()))
            .await
            .map_err(anyhow::Error::from)
    }
}

/// Logs go to stderr at `warn` (`-v`: info, `-vv`: debug). `doctor` reports an engine that
/// failed to start in its own report, so the log line saying the same is left out unless asked
/// for with `-v`.
fn init_logging(verbose: u8, reports_engine_failures: bool) {
    let default = match verbose {
        0 if reports_engine_failures => "warn,vilvona::context_engine=off",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a terminal: logs piped to a file or a gateway stay plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Prints a value as one JSON document on stdout.
pub(crate) fn print_json(value: &serde_json::Value) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).context("serializing the report")?
    );
    Ok(())
}

/// `0.1.0 (commit 1a2b3c4d5e6f, store schema 1)`.
fn version() -> String {
    format!(
        "{} (commit {}, store schema {})",
        env!("CARGO_PKG_VERSION"),
        env!("VILVONA_COMMIT"),
        vilvona_runtime::STORE_SCHEMA_VERSION
    )
}

/// A reader that stops reading (`vilvona context json | head`) is not an error: the process
/// ends quietly, as if the pipe's signal had ended it (status 141), instead of panicking on
/// the broken pipe.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    // Built once per process; clap wants a `'static` string.
    let version: &'static str = Box::leak(version().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    // Everything this process creates (databases, index files, transcripts, session index,
    // configuration) is private to its user, whatever umask it was started with.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    init_logging(cli.verbose, matches!(cli.command, Command::Doctor { .. }));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("vilvona: could not start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let global = Global {
        state_dir: default_state_dir(cli.state_dir.as_deref()),
        config: cli.config.clone(),
        store_url: cli.store_url.clone(),
    };
    let outcome = runtime.block_on(run(cli.command, &global));
    match outcome {
        Ok(code) => code,
        Err(error) => {
            let chain: Vec<String> = error.chain().map(ToString::to_string).collect();
            eprintln!("vilvona: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, global: &Global) -> Result<ExitCode> {
    match command {
        Command::Demo { turns } => replay::demo(global, turns).await,
        Command::Replay {
            file,
            engine,
            context_window,
            json,
        } => replay::replay(global, &file, engine, context_window, json).await,
        Command::Doctor { json, fix } => inspect::doctor(global, json, fix).await,
        Command::Ui {
            port,
            allow_repair,
            exit_with_stdin,
            prices,
        } => ui::ui(global, port, allow_repair, exit_with_stdin, prices).await,
        Command::Context {
            view,
            session,
            out,
            format,
            workspace,
            json,
            prices,
        } => {
            match view {
                ContextView::Timeline => return context::timeline(global, &session, json).await,
                ContextView::History => {
                    return context::history(global, &session, json, prices).await;
                }
                _ => {}
            }
            context::context(
                global,
                view,
                &session,
                format,
                out.as_deref(),
                workspace.as_deref(),
            )
            .await
        }
        Command::Compact {
            session,
            instructions,
            json,
        } => inspect::compact(global, &session, instructions, json).await,
        Command::Grep {
            query,
            session,
            mode,
            scope,
            since,
            before,
            order,
            limit,
            json,
        } => {
            // The tool's arguments, named as the tool names them (`null`: not given).
            let name = |value: &dyn ValueEnumName| value.name();
            let arguments = serde_json::json!({
                "query": query,
                "mode": name(&mode),
                "scope": name(&scope),
                "order": name(&order),
                "limit": limit,
                "since": since,
                "before": before,
            });
            inspect::grep(global, &session, &arguments, json).await
        }
        Command::Describe {
            id,
            session,
            lines,
            json,
        } => inspect::describe(global, &id, &session, lines, json).await,
        Command::Expand {
            id,
            session,
            token_cap,
            cursor,
            json,
        } => inspect::expand(global, &id, &session, token_cap, cursor, json).await,
        Command::Ask {
            question,
            session,
            query,
            token_cap,
            json,
        } => {
            let arguments = serde_json::json!({
                "question": question,
                "query": query.as_deref().unwrap_or(&question),
                "tokenCap": token_cap,
            });
            inspect::ask(global, &session, &arguments, json).await
        }
        Command::Stats { session, json } => inspect::stats(global, &session, json).await,
        Command::Sessions { json } => inspect::sessions(global, json).await,
        Command::RebuildIndex => inspect::rebuild_index(global).await,
        Command::Forget {
            session,
            before,
            json,
        } => retention::forget(global, &session, before.as_deref(), json).await,
        Command::Retention { dry_run, json } => retention::retention(global, dry_run, json).await,
        Command::Export { session, out, json } => {
            archive::export(global, &session, &out, json).await
        }
        Command::Import { file, engine, json } => {
            archive::import(global, &file, engine, json).await
        }
        Command::Plugins {
            action: PluginsAction::Uninstall { id },
        } => uninstall_plugin(global, &id),
        Command::Serve { stdio: _ } => {
            vilvona_runtime::serve::serve(
                global.state_dir.clone(),
                global.store_url.clone(),
                tokio::io::BufReader::new(tokio::io::stdin()),
                tokio::io::stdout(),
            )
            .await;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `vilvona plugins uninstall ID`: the selected engine is gone, so the slot selects `legacy`.
fn uninstall_plugin(global: &Global, id: &str) -> Result<ExitCode> {
    let path = global.options().config_path();
    // It rewrites a file in the state directory: the directory stays private.
    vilvona_runtime::privacy::ensure_private_dir(&global.state_dir)
        .with_context(|| format!("{}", global.state_dir.display()))?;
    if vilvona_runtime::reset_context_engine_slot(&path, id)? {
        println!(
            "{}: the contextEngine slot selected {id:?}; it now selects \"legacy\"",
            path.display()
        );
    } else {
        println!(
            "{}: the contextEngine slot does not select {id:?}; nothing changed",
            path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses a missing file with a message that says what to do.
pub(crate) fn require_file(path: &std::path::Path) -> Result<()> {
    if !path.exists() {
        bail!("{}: no such file; check the path", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option and argument of every command says what it is for.
    #[test]
    fn every_option_has_a_help_line() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
                let values = if arg.get_action().takes_values() {
                    arg.get_possible_values()
                } else {
                    Vec::new()
                };
                for value in values {
                    if value.get_help().is_none() {
                        missing.push(format!("{path} {id}={}", value.get_name()));
                    }
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {}", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "vilvona", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
