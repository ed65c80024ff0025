//! The bodies of vilvona's fuzz targets. `fuzz/` (cargo-fuzz) runs them under libFuzzer; the
//! tests run every file of `fuzz/corpus/<target>/` through them, so CI exercises the same
//! inputs on the stable toolchain. Each body must return normally for any input: a panic, an
//! abort or a stack overflow is a finding.
// A fuzz body asserts what must hold; a failed assertion is how a finding is reported.
#![allow(clippy::panic, clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_lossless::{LosslessConfig, LosslessEngine, ToolCaller};
use vilvona_summarize::ExtractiveSummarizer;

/// The target names, as `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/` spell them.
pub const TARGETS: [&str; 5] = [
    "transcript_line",
    "message_model",
    "config",
    "jsonrpc_line",
    "grep_query",
];

/// Runs one target's body on one input.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "transcript_line" => transcript_line(data),
        "message_model" => message_model(data),
        "config" => config(data),
        "jsonrpc_line" => jsonrpc_line(data),
        "grep_query" => grep_query(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

/// A transcript line: parsed as the reader does; a message entry's message survives a round
/// trip unchanged.
pub fn transcript_line(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(vilvona_transcript::Entry::Message(entry)) = vilvona_transcript::parse_line(&text) {
        round_trip(&entry.message);
    }
}

/// The message model: any object with a string `role` parses, and `to_string` gives back the
/// same JSON value; the text read from any JSON is the decoded message's.
pub fn message_model(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let decoded = serde_json::from_str::<AgentMessage>(text)
            .map(|message| message.plain_text())
            .unwrap_or_default();
        assert_eq!(
            AgentMessage::plain_text_of_json(text),
            decoded,
            "the text read from the JSON is not the decoded message's"
        );
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Ok(message) = serde_json::from_value::<AgentMessage>(value.clone()) {
        let again = serde_json::to_value(&message).expect("a parsed message serializes");
        assert_eq!(again, value, "the message model lost or changed data");
        round_trip(&message);
    }
}

fn round_trip(message: &AgentMessage) {
    let text = serde_json::to_string(message).expect("a parsed message serializes");
    let back: AgentMessage = serde_json::from_str(&text).expect("a serialized message parses");
    assert_eq!(&back, message);
    let _ = message.plain_text();
}

/// The JSON5 configuration, as `vilvona.json5`.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = vilvona_runtime::HostConfig::parse(&text, Path::new("fuzz.json5"));
}

/// One JSON-RPC line as `vilvona serve --stdio` reads it: UTF-8, a JSON value, a method, and
/// the method's parameters.
pub fn jsonrpc_line(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(request) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    let parse = |params: Value| -> Result<(), serde_json::Error> {
        match request.get("method").and_then(Value::as_str) {
            Some("bootstrap") => serde_json::from_value::<BootstrapParams>(params).map(drop),
            Some("ingest") => serde_json::from_value::<IngestParams>(params).map(drop),
            Some("ingestBatch") => serde_json::from_value::<IngestBatchParams>(params).map(drop),
            Some("assemble") => serde_json::from_value::<AssembleParams>(params).map(drop),
            Some("compact") => serde_json::from_value::<CompactParams>(params).map(drop),
            Some("afterTurn") => serde_json::from_value::<AfterTurnParams>(params).map(drop),
            Some("commitTurn") => serde_json::from_value::<CommitTurnParams>(params).map(drop),
            Some("maintain") => serde_json::from_value::<MaintainParams>(params).map(drop),
            Some("prepareSubagentSpawn") => {
                serde_json::from_value::<SubagentSpawnParams>(params).map(drop)
            }
            _ => Ok(()),
        }
    };
    let _ = parse(params);
}

struct GrepFixture {
    runtime: tokio::runtime::Runtime,
    engine: LosslessEngine,
    _dir: tempfile::TempDir,
}

/// One store with a little history, shared by every grep input.
fn grep_fixture() -> &'static GrepFixture {
    static FIXTURE: OnceLock<GrepFixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::TempDir::new().expect("a temporary directory");
        let estimator = vilvona_summarize::estimator(vilvona_summarize::TokenizerKind::Heuristic, 1.0);
        let engine = runtime.block_on(async {
            let engine = LosslessEngine::open(
                &dir.path().join("store"),
                LosslessConfig::default(),
                Arc::new(ExtractiveSummarizer::new(estimator.clone())),
                estimator,
            )
            .await
            .expect("the store opens");
            let messages = [
                "Please remember: the vault code is VAULT-7788.",
                "我们把告警阈值改成了九十。",
                "The parser fails on line 42 of crates/store/src/lib.rs",
            ]
            .iter()
            .enumerate()
            .map(|(i, text)| {
                serde_json::from_value(json!({"role": "user", "content": text, "timestamp": 1_700_000_000_000_i64 + i as i64}))
                    .expect("a message")
            })
            .collect();
            engine
                .ingest_batch(&IngestBatchParams {
                    session_id: "fuzz".to_owned(),
                    messages,
                    ..IngestBatchParams::default()
                })
                .await
                .expect("ingest");
            engine
        });
        GrepFixture {
            runtime,
            engine,
            _dir: dir,
        }
    })
}

/// A grep as the model calls it: a JSON object of arguments (query, mode, scope, limit,
/// since/before dates, order), or raw text searched in each mode. Errors are answers; only a
/// panic is a finding.
pub fn grep_query(data: &[u8]) {
    let fixture = grep_fixture();
    let caller = ToolCaller {
        session_id: "fuzz".to_owned(),
        session_key: None,
    };
    let calls: Vec<Value> = match serde_json::from_slice::<Value>(data) {
        Ok(arguments @ Value::Object(_)) => vec![arguments],
        _ => {
            let text = String::from_utf8_lossy(data).into_owned();
            ["text", "phrase", "regex"]
                .iter()
                .map(|mode| json!({"query": text, "mode": mode}))
                .collect()
        }
    };
    for arguments in calls {
        let _ = fixture.runtime.block_on(fixture.engine.call_tool(
            &caller,
            "vilvona_grep",
            &arguments,
        ));
    }
}
