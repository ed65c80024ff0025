//! Criterion benches of the engine's hot paths at several history sizes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::json;
use vilvona_benches::FakeSummarizer;
use vilvona_core::engine::{ContextEngine, IngestBatchParams};
use vilvona_core::tokens::HeuristicEstimator;
use vilvona_lossless::{CompactionRequest, LosslessConfig, LosslessEngine, ToolCaller};
use vilvona_summarize::{TokenizerKind, estimator};

const SIZES: [usize; 3] = [100, 1_000, 4_000];

struct Fixture {
    _dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    engine: LosslessEngine,
    workload: vilvona_workload::Workload,
    next_turn: std::cell::Cell<usize>,
}

fn fixture(turns: usize) -> Fixture {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let workload = vilvona_workload::generate(turns + 2_000, 7, 10);
    let engine = runtime.block_on(async {
        let engine = LosslessEngine::open(
            &dir.path().join("store"),
            LosslessConfig::default(),
            Arc::new(FakeSummarizer),
            Arc::new(HeuristicEstimator),
        )
        .await
        .unwrap();
        for turn in 0..turns {
            ingest_turn(&engine, &workload, turn).await;
            let conversation = engine.conversation("bench", None).await.unwrap();
            engine
                .compact_conversation(conversation.id, CompactionRequest::routine(128_000))
                .await
                .unwrap();
        }
        engine
    });
    Fixture {
        _dir: dir,
        runtime,
        engine,
        workload,
        next_turn: std::cell::Cell::new(turns),
    }
}

async fn ingest_turn(engine: &LosslessEngine, workload: &vilvona_workload::Workload, turn: usize) {
    let range = workload.turns[turn % workload.turns.len()].clone();
    let messages = workload.entries[range.clone()]
        .iter()
        .map(|e| e.message.clone())
        .collect();
    let ids = workload.entries[range]
        .iter()
        .map(|e| Some(format!("{}-{turn}", e.id)))
        .collect();
    engine
        .ingest_batch(&IngestBatchParams {
            session_id: "bench".to_owned(),
            messages,
            entry_ids: ids,
            ..IngestBatchParams::default()
        })
        .await
        .unwrap();
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("lossless");
    group.sample_size(20);
    for size in SIZES {
        let fixture = fixture(size);
        let conversation = fixture
            .runtime
            .block_on(fixture.engine.conversation("bench", None))
            .unwrap();
        group.bench_with_input(BenchmarkId::new("ingest_turn", size), &size, |b, _| {
            b.iter(|| {
                let turn = fixture.next_turn.get();
                fixture.next_turn.set(turn + 1);
                fixture
                    .runtime
                    .block_on(ingest_turn(&fixture.engine, &fixture.workload, turn));
            });
        });
        group.bench_with_input(BenchmarkId::new("assemble_128k", size), &size, |b, _| {
            b.iter(|| {
                fixture
                    .runtime
                    .block_on(fixture.engine.assemble_context(conversation.id, 128_000))
                    .unwrap()
            });
        });
        group.bench_with_input(BenchmarkId::new("compaction_check", size), &size, |b, _| {
            b.iter(|| {
                fixture
                    .runtime
                    .block_on(
                        fixture.engine.compact_conversation(
                            conversation.id,
                            CompactionRequest::routine(128_000),
                        ),
                    )
                    .unwrap()
            });
        });
        group.bench_with_input(
            BenchmarkId::new("compaction_pass_forced", size),
            &size,
            |b, _| {
                b.iter(|| {
                    fixture
                        .runtime
                        .block_on(fixture.engine.compact_conversation(
                            conversation.id,
                            CompactionRequest::forced(128_000),
                        ))
                        .unwrap()
                });
            },
        );
        let caller = ToolCaller {
            session_id: "bench".to_owned(),
            session_key: None,
        };
        group.bench_with_input(BenchmarkId::new("grep", size), &size, |b, _| {
            b.iter(|| {
                fixture
                    .runtime
                    .block_on(fixture.engine.call_tool(
                        &caller,
                        "vilvona_grep",
                        &json!({"query": "staging database password rotation"}),
                    ))
                    .unwrap()
            });
        });
    }
    group.finish();

    let mut tokens = c.benchmark_group("tokens");
    let text = vilvona_workload::generate(20, 7, 1).to_jsonl();
    for (name, kind) in [
        ("heuristic", TokenizerKind::Heuristic),
        ("o200k", TokenizerKind::O200k),
        ("cl100k", TokenizerKind::Cl100k),
    ] {
        let estimator = estimator(kind, 1.0);
        tokens.bench_function(name, |b| b.iter(|| estimator.text_tokens(&text)));
    }
    tokens.finish();

    // Search by meaning compares the query with every stored chunk vector: 1,000 chunks of
    // the built-in model's (four bits a dimension), as one document's worth each.
    let model = vilvona_embed::builtin();
    let sentences: Vec<String> = (0..1_000)
        .map(|at| format!("The {at}th sentence about deployment budgets and retry windows."))
        .collect();
    let stored: Vec<Vec<u8>> = sentences
        .iter()
        .map(|sentence| vilvona_embed::Vectors::encode(&model.embed_chunks(sentence, 1)).0)
        .collect();
    let query = vilvona_embed::QueryVector::new(
        &model
            .embed("when is the deployment window")
            .unwrap_or_default(),
    );
    let mut meaning = c.benchmark_group("meaning");
    // What the index pays per message: a generated session's 4 KB of text, as chunks.
    let session = vilvona_workload::generate(3, 7, 1).to_jsonl();
    let end = (0..=session.len().min(4096))
        .rev()
        .find(|at| session.is_char_boundary(*at))
        .unwrap_or(0);
    let message = &session[..end];
    meaning.bench_function("embed_4kb_message", |b| {
        b.iter(|| model.embed_chunks(message, vilvona_embed::chunks_for("assistant")))
    });
    meaning.bench_function("compare_1000_chunks", |b| {
        b.iter(|| {
            stored
                .iter()
                .filter_map(|bytes| vilvona_embed::Vectors::best_similarity(bytes, &query))
                .fold(f32::MIN, f32::max)
        })
    });
    // The first stage of a search by sign codes (`cells --signs`): the query's 192 signs
    // against 100,000 codes (the sentences' chunks, repeated), the nearest 1 % kept.
    let vectors: Vec<Vec<f32>> = sentences
        .iter()
        .flat_map(|sentence| model.embed_chunks(sentence, 1))
        .collect();
    let sample: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
    let coder = vilvona_benches::signs::SignCoder::new(&sample, true, 0x5eed)
        .expect("the sentences have vectors");
    let codes: Vec<vilvona_benches::signs::Code> =
        vectors.iter().map(|vector| coder.encode(vector)).collect();
    let signs =
        vilvona_benches::signs::Signs::new(coder.words(), codes.iter().cycle().take(100_000));
    let query = coder.query(
        &model
            .embed("when is the deployment window")
            .expect("the query has a vector"),
    );
    let mut distances = Vec::new();
    meaning.bench_function("sign_scan_100000_codes", |b| {
        b.iter(|| signs.nearest(&query.signs, 1_000, &mut distances).len())
    });
    meaning.finish();
}

criterion_group!(engine, benches);
criterion_main!(engine);
