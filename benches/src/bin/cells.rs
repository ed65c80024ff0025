//! `cells --transcript FILE --needles FILE [--cells 256,1024] [--probe 16,64] [--json]`: how
//! much of exact search's top ten an inverted file over the built-in model's vectors keeps,
//! and at what share of the work (see `vilvona_benches::cells`). With `--graph 64,256
//! [--ef-construction 100]`, the same for a graph index (HNSW) at each beam width instead
//! (see `vilvona_benches::graph`). With `--quantized 24x256,48x16 [--rerank 50,200]`, the same
//! for vectors compressed by product quantization, the best documents so compared again
//! exactly (see `vilvona_benches::quantized`). With `--signs 1,5 [--rerank 200,1000]`, the same
//! for sign codes (turned by a random rotation and not) in three stages, with the first
//! stage's time a code (see `vilvona_benches::signs`). Every table also counts the queries answered
//! in the ten found. `--contrast` first prints how far exact search's nearest documents stand
//! from the rest; `--locomo DIR` takes LoCoMo's conversations instead of a transcript.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    about = "Measures an inverted file (IVF) over the built-in model's vectors against exact search"
)]
struct Args {
    #[arg(long, required_unless_present = "locomo")]
    transcript: Option<PathBuf>,
    #[arg(long, required_unless_present = "locomo")]
    needles: Option<PathBuf>,
    /// Measure on a folder of LoCoMo conversations instead (their turns the documents, their
    /// questions the queries, each answered by its evidence turns).
    #[arg(long, conflicts_with_all = ["transcript", "needles"])]
    locomo: Option<PathBuf>,
    /// Print how far each set's nearest documents stand from the rest (exact search) first.
    #[arg(long)]
    contrast: bool,
    /// Codebook sizes tried.
    #[arg(long, value_delimiter = ',', default_values_t = [256, 1024])]
    cells: Vec<usize>,
    /// Numbers of cells probed per query.
    #[arg(long, value_delimiter = ',', default_values_t = [16, 32, 64, 128])]
    probe: Vec<usize>,
    /// Measure a graph index (HNSW) at these beam widths instead of the inverted file.
    #[arg(long, value_delimiter = ',')]
    graph: Vec<usize>,
    /// Measure product quantizers of these shapes (PARTSxCENTRES) instead.
    #[arg(long, value_delimiter = ',')]
    quantized: Vec<vilvona_benches::quantized::Shape>,
    /// Measure sign codes instead, keeping these percentages of the chunks after the Hamming
    /// stage (as 1,5).
    #[arg(long, value_delimiter = ',')]
    signs: Vec<f64>,
    /// Numbers of documents compared exactly after the quantized or sign codes' pass (with
    /// `--signs`, the first is also the setting timed on one core).
    #[arg(long, value_delimiter = ',', default_values_t = [10, 50, 100, 200, 500])]
    rerank: Vec<usize>,
    /// The graph's beam width while it is built.
    #[arg(long, default_value_t = 100)]
    ef_construction: usize,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let corpus = match (&args.locomo, &args.transcript, &args.needles) {
        (Some(folder), ..) => vilvona_benches::locomo::conversation_files(folder)
            .and_then(|files| vilvona_benches::locomo::meaning_corpus(&files)),
        (None, Some(transcript), Some(needles)) => {
            vilvona_benches::cells::corpus(transcript, needles)
        }
        _ => unreachable!("clap requires a transcript and needles without --locomo"),
    };
    let corpus = match corpus {
        Ok(corpus) => corpus,
        Err(error) => {
            eprintln!("cells: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let chunks: usize = corpus.documents.iter().map(Vec::len).sum();
    eprintln!(
        "{} documents, {chunks} chunks, {} queries ({} needles)",
        corpus.documents.len(),
        corpus.queries.len(),
        corpus.needle_queries
    );
    if args.contrast {
        print_rows(
            args.json,
            &vilvona_benches::cells::contrast(&corpus),
            &[
                "queries",
                "documents",
                "similarity of the 1st / 10th / 100th / median document",
                "answer in exact's ten",
                "answer's rank, median",
            ],
            |row| {
                format!(
                    "| {} ({}) | {} | {:.3} / {:.3} / {:.3} / {:.3} | {:.2} | {} |",
                    row.set,
                    row.queries,
                    row.documents,
                    row.first,
                    row.tenth,
                    row.hundredth,
                    row.median,
                    row.answer_in_ten,
                    row.answer_rank_median
                )
            },
        );
    }
    if !args.graph.is_empty() {
        let rows = vilvona_benches::graph::evaluate(&corpus, &args.graph, args.ef_construction);
        print_rows(
            args.json,
            &rows,
            &[
                "ef construction",
                "ef",
                "needles' top 10 kept",
                "questions' top 10 kept",
                "needles answered",
                "questions answered",
                "chunks compared (share)",
                "build",
            ],
            |row| {
                format!(
                    "| {} | {} | {} | {:.0} ({:.2} %) | {:.0} s |",
                    row.ef_construction,
                    row.ef,
                    row.kept.cells(),
                    row.compared,
                    row.compared_share * 100.0,
                    row.build_s
                )
            },
        );
        return ExitCode::SUCCESS;
    }
    if !args.signs.is_empty() {
        let reranked = args.rerank.first().copied().unwrap_or(1_000);
        if let Some(time) = vilvona_benches::signs::scan_time(&corpus, args.signs[0], reranked) {
            eprintln!(
                "on one core, {} % kept, {} reranked: stage one {:.2} ns a code over {} chunks, the three stages {:.2} ms a query (stage two {:.2}, stage three {:.2}; exact comparison in f32: {:.2} ns a chunk)",
                args.signs[0],
                time.reranked,
                time.hamming_ns,
                time.chunks,
                time.three_stages_ms,
                time.estimates_ms,
                time.rerank_ms,
                time.exact_ns
            );
        }
        let rows =
            vilvona_benches::signs::evaluate(&corpus, &[true, false], &args.signs, &args.rerank);
        print_rows(
            args.json,
            &rows,
            &[
                "rotated",
                "chunks kept by Hamming",
                "reranked",
                "needles' top 10 kept",
                "questions' top 10 kept",
                "needles answered",
                "questions answered",
                "MB read a query: codes + estimates + rerank (exact)",
            ],
            |row| {
                format!(
                    "| {} | {} % | {} | {} | {:.2} + {:.2} + {:.2} ({:.2}) |",
                    if row.rotated { "yes" } else { "no" },
                    row.share,
                    row.reranked,
                    row.kept.cells(),
                    row.bytes_codes / 1e6,
                    row.bytes_estimates / 1e6,
                    row.bytes_rerank / 1e6,
                    row.bytes_exact / 1e6
                )
            },
        );
        return ExitCode::SUCCESS;
    }
    if !args.quantized.is_empty() {
        let rows = vilvona_benches::quantized::evaluate(&corpus, &args.quantized, &args.rerank);
        print_rows(
            args.json,
            &rows,
            &[
                "parts × centres",
                "bytes a chunk",
                "reranked",
                "needles' top 10 kept",
                "questions' top 10 kept",
                "needles answered",
                "questions answered",
                "train / encode",
            ],
            |row| {
                format!(
                    "| {} × {} | {} | {} | {} | {:.0} / {:.0} s |",
                    row.parts,
                    row.centres,
                    row.code_bytes,
                    row.reranked,
                    row.kept.cells(),
                    row.train_s,
                    row.encode_s
                )
            },
        );
        return ExitCode::SUCCESS;
    }
    let rows = vilvona_benches::cells::evaluate(&corpus, &args.cells, &args.probe);
    print_rows(
        args.json,
        &rows,
        &[
            "cells",
            "filed in",
            "probed",
            "needles' top 10 kept",
            "questions' top 10 kept",
            "needles answered",
            "questions answered",
            "chunks compared",
            "largest cell",
        ],
        |row| {
            format!(
                "| {} | {} | {} | {} | {:.1} % | {:.1} % |",
                row.cells,
                row.filed_in,
                row.probed,
                row.kept.cells(),
                row.compared * 100.0,
                row.largest_cell * 100.0
            )
        },
    );
    ExitCode::SUCCESS
}

/// The rows as one JSON document, or as a Markdown table under `columns`.
fn print_rows<T: serde::Serialize>(
    json: bool,
    rows: &[T],
    columns: &[&str],
    line: impl Fn(&T) -> String,
) {
    if json {
        println!("{}", serde_json::to_string_pretty(rows).unwrap_or_default());
        return;
    }
    println!("| {} |", columns.join(" | "));
    println!("|{}", "---|".repeat(columns.len()));
    for row in rows {
        println!("{}", line(row));
    }
}
