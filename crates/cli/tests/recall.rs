//! Recall from the command line: every language, large content, bounds, paging.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};
use tempfile::TempDir;

use common::vilvona;

fn ok_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// One line on stderr and exit status 1.
fn one_line_error(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1));
    let error = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    assert_eq!(error.lines().count(), 1, "{error}");
    error
}

/// A transcript of `messages` (role, content) as OpenClaw writes it.
fn transcript(dir: &Path, session: &str, messages: &[Value]) -> String {
    let mut lines = vec![json!({"type": "session", "version": 3, "id": session,
        "timestamp": "2026-03-02T09:00:00Z", "cwd": "/workspace"})];
    for (index, message) in messages.iter().enumerate() {
        let mut message = message.clone();
        message["timestamp"] = json!(1_772_442_000_000_i64 + index as i64 * 1_000);
        lines.push(json!({"type": "message", "id": format!("{session}-{index}"),
            "parentId": if index == 0 { Value::Null } else { json!(format!("{session}-{}", index - 1)) },
            "timestamp": "2026-03-02T09:00:00Z", "message": message}));
    }
    let path = dir.join(format!("{session}.jsonl"));
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_owned()
}

fn replay(state: &Path, file: &str) {
    let output = vilvona(state, &["replay", file, "--engine", "lossless", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Replays the 15-turn fixture (session `synthetic-11-15`) through lossless at `window` tokens.
fn replay_fixture(state: &Path, window: &str) {
    let fixture = format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = vilvona(
        state,
        &[
            "replay",
            &fixture,
            "--engine",
            "lossless",
            "--context-window",
            window,
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn grep(state: &Path, session: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["grep", "--session", session, "--json"];
    all.extend_from_slice(args);
    ok_json(&vilvona(state, &all))["results"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn chinese_japanese_and_korean_facts_are_found_by_their_words() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let file = transcript(
        state,
        "cjk",
        &[
            json!({"role": "user", "content": "我们把告警阈值改成了百分之八十五。"}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "本番環境のしきい値を変更しました。"}]}),
            json!({"role": "user", "content": "운영 환경의 경고 임계값을 85퍼센트로 바꿨습니다."}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "了解。"}]}),
        ],
    );
    replay(state, &file);
    for (word, highlighted) in [
        ("告警阈值", "我们把«告警阈值»改成了百分之八十五。"),
        ("しきい値", "本番環境の«しきい値»を変更しました。"),
        (
            "임계값",
            "운영 환경의 경고 «임계값»을 85퍼센트로 바꿨습니다.",
        ),
    ] {
        for mode in ["text", "phrase"] {
            let hits = grep(state, "cjk", &[word, "--mode", mode]);
            assert_eq!(hits.len(), 1, "{word} ({mode}): {hits:?}");
            assert_eq!(hits[0]["snippet"], highlighted);
        }
    }
}

#[test]
fn a_word_at_the_end_of_a_huge_tool_output_is_found_and_read_from_a_second_session() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let mut output = String::new();
    let mut row = 0;
    while output.len() < 999_960 {
        output.push_str(&format!("row {row:06} ok in 4ms\n"));
        row += 1;
    }
    output.push_str("the last word: xylophonequokka");
    let lines = output.lines().count().to_string();
    for session in ["bigA", "bigB"] {
        let file = transcript(
            state,
            session,
            &[
                json!({"role": "user", "content": "print the whole table"}),
                json!({"role": "assistant", "content": [{"type": "toolCall", "id": "c1", "name": "exec", "arguments": {"command": "dump"}}]}),
                json!({"role": "toolResult", "toolCallId": "c1", "toolName": "exec", "content": [{"type": "text", "text": output}], "isError": false}),
                json!({"role": "assistant", "content": [{"type": "text", "text": "Done."}]}),
            ],
        );
        replay(state, &file);
    }
    for args in [
        &["xylophonequokka"][..],
        &["last word: xylo\\w+", "--mode", "regex"][..],
    ] {
        // By default (hybrid) rows near in meaning follow; the one holding the word is first.
        let hits = grep(state, "bigB", args);
        let holding = hits
            .iter()
            .filter(|hit| hit["snippet"].as_str().unwrap().contains("xylophonequokka"))
            .count();
        assert_eq!(holding, 1, "{args:?}: {hits:?}");
        assert!(
            hits[0]["snippet"]
                .as_str()
                .unwrap()
                .ends_with("xylophonequokka»"),
            "{hits:?}"
        );
        let file = hits[0]["file"].as_str().unwrap();
        let range = format!("{lines}-{lines}");
        let described = ok_json(&vilvona(
            state,
            &[
                "describe",
                file,
                "--session",
                "bigB",
                "--lines",
                &range,
                "--json",
            ],
        ));
        assert_eq!(described["content"], "the last word: xylophonequokka");
    }
}

#[test]
fn oversize_queries_and_bad_dates_are_refused_in_one_line() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let file = transcript(
        state,
        "s",
        &[json!({"role": "user", "content": "hello there"})],
    );
    replay(state, &file);
    let long = "word ".repeat(2_000);
    let error = one_line_error(&vilvona(state, &["grep", &long, "--session", "s"]));
    assert_eq!(
        error,
        "vilvona: invalid arguments: the query is 10000 bytes; at most 4096 are allowed"
    );
    for (flag, value) in [
        ("--since", "9223372036854775807-01-01"),
        ("--since", "2026-99-01"),
        ("--before", "2026-02-30T10:00:00Z"),
        ("--before", "yesterday"),
    ] {
        let error = one_line_error(&vilvona(
            state,
            &["grep", "hello", "--session", "s", flag, value],
        ));
        let key = flag.trim_start_matches("--");
        assert_eq!(
            error,
            format!(
                "vilvona: invalid arguments: {key}: {value:?} is not an RFC 3339 time like 2026-03-02T09:00:00Z"
            )
        );
    }
    // An offset is honoured: 11:00+02:00 is 09:00Z, when the message was written.
    let hits = grep(
        state,
        "s",
        &["hello", "--since", "2026-03-02T11:00:00+02:00"],
    );
    assert_eq!(hits.len(), 1);
    let hits = grep(
        state,
        "s",
        &["hello", "--since", "2026-03-02T11:00:01+02:00"],
    );
    assert!(hits.is_empty(), "{hits:?}");
}

#[test]
fn expand_pages_with_a_cursor_to_the_last_child() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    replay_fixture(state, "12000");
    let session = "synthetic-11-15";
    let summaries = grep(
        state,
        session,
        &["the", "--scope", "summaries", "--limit", "50"],
    );
    let summary = summaries
        .iter()
        .filter_map(|hit| hit["id"].as_str())
        .next()
        .expect("the replay made summaries");
    let mut cursor: Option<u64> = None;
    let mut seen = Vec::new();
    let total = loop {
        let mut args = vec![
            "expand",
            summary,
            "--session",
            session,
            "--token-cap",
            "100",
            "--json",
        ];
        let at = cursor.map(|cursor| cursor.to_string());
        if let Some(at) = &at {
            args.extend(["--cursor", at.as_str()]);
        }
        let page = ok_json(&vilvona(state, &args));
        for item in page["items"].as_array().unwrap() {
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_u64() {
            Some(next) => cursor = Some(next),
            None => break page["total"].as_u64().unwrap(),
        }
    };
    assert!(total >= 2, "a summary of one child pages nothing");
    assert_eq!(seen.len() as u64, total, "{seen:?}");
    let described = ok_json(&vilvona(
        state,
        &["describe", summary, "--session", session, "--json"],
    ));
    assert_eq!(described["children"], json!(seen));
    // The text view says how to go on.
    let first = vilvona(
        state,
        &[
            "expand",
            summary,
            "--session",
            session,
            "--token-cap",
            "100",
        ],
    );
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(text.contains("continue with --cursor 1"), "{text}");
}

#[test]
fn ask_answers_from_history_with_citations_offline() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    replay_fixture(state, "12000");
    let session = "synthetic-11-15";
    let answered = ok_json(&vilvona(
        state,
        &[
            "ask",
            "Who owns the staging database password rotation?",
            "--session",
            session,
            "--query",
            "staging database password rotation",
            "--json",
        ],
    ));
    assert!(
        answered["answer"]
            .as_str()
            .unwrap()
            .contains("OPS-48292 and Kwame Mensah owns it"),
        "{answered}"
    );
    assert_eq!(answered["answeredBy"], "extractive/v1");
    let cited = answered["citations"][0].as_str().unwrap();
    let described = ok_json(&vilvona(
        state,
        &["describe", cited, "--session", session, "--json"],
    ));
    assert!(
        described["text"]
            .as_str()
            .unwrap()
            .contains("Kwame Mensah owns it"),
        "{described}"
    );
    let text = vilvona(
        state,
        &[
            "ask",
            "Who owns the staging database password rotation?",
            "--session",
            session,
        ],
    );
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(shown.contains(&format!("cited: {cited}")), "{shown}");
}

#[test]
fn the_summary_dag_draws_as_dot_and_png() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    replay_fixture(state, "12000");
    let session = "synthetic-11-15";
    let dot = vilvona(state, &["context", "dag", "--session", session]);
    assert!(
        dot.status.success(),
        "{}",
        String::from_utf8_lossy(&dot.stderr)
    );
    let text = String::from_utf8_lossy(&dot.stdout);
    assert!(text.starts_with("digraph \"synthetic-11-15\" {"), "{text}");
    assert!(text.contains("depth 0 leaf"), "{text}");
    assert!(text.contains("messages\\n"), "{text}");
    assert!(text.contains("raw in the context"), "{text}");
    assert!(text.trim_end().ends_with('}'));
    let png = state.join("dag.png");
    let drawn = vilvona(
        state,
        &[
            "context",
            "dag",
            "--session",
            session,
            "--format",
            "png",
            "--out",
            png.to_str().unwrap(),
        ],
    );
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 1280);
}

/// `context dag --format json` gives each summary the time span of the messages below it;
/// `context timeline --json` lists one fold a summary, newest first, with a cache-hit estimate.
#[test]
fn the_dag_as_json_has_spans_and_the_timeline_one_fold_a_summary() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    replay_fixture(state, "6000");
    let session = "synthetic-11-15";
    let json = |args: &[&str]| -> serde_json::Value {
        let output = vilvona(state, args);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let dag = json(&["context", "dag", "--session", session, "--format", "json"]);
    let summaries = dag["summaries"].as_array().unwrap();
    assert!(summaries.len() > 1, "{dag}");
    for summary in summaries {
        let (earliest, latest) = (
            summary["earliestAtMs"].as_i64().unwrap(),
            summary["latestAtMs"].as_i64().unwrap(),
        );
        // The fixture's messages were written on 2026-03-02.
        assert!(
            earliest <= latest && earliest > 1_772_000_000_000,
            "{summary}"
        );
    }
    let timeline = json(&["context", "timeline", "--session", session, "--json"]);
    assert_eq!(timeline["folds"].as_u64(), Some(summaries.len() as u64));
    let rows = timeline["rows"].as_array().unwrap();
    assert_eq!(rows.len(), summaries.len());
    assert!(
        rows.windows(2)
            .all(|pair| pair[0]["at"].as_i64() >= pair[1]["at"].as_i64())
    );
    // A fold over messages keeps the cache for the summaries ahead of it: some fold has some.
    assert!(
        rows.iter().any(|row| row["cacheKept"].as_u64() > Some(0)),
        "{timeline}"
    );
    let text = vilvona(state, &["context", "timeline", "--session", session]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.starts_with(&format!("{} folds; ", summaries.len())),
        "{text}"
    );
}

/// A reader that stops early (`vilvona describe … | head`) ends the command quietly: no panic
/// on the broken pipe.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::io::Read;
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let file = transcript(
        state,
        "pipe",
        &[json!({"role": "user", "content": "word ".repeat(18_000)})],
    );
    replay(state, &file);
    let mut child = common::command(state, &["describe", "msg_1", "--session", "pipe", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 5];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(141));
}

/// Recall by meaning on a fresh install with the network unplugged: no embedding provider is
/// configured, and the built-in model finds a fact asked about in other words. Every command
/// runs in a network namespace of its own, which has no interface but a loopback that is down.
#[test]
fn meaning_is_recalled_with_the_network_unplugged() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let file = transcript(
        state,
        "unplugged",
        &[
            json!({"role": "user", "content": "Refactor the parser cache in src/cache.rs and run the tests."}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Done: the cache is warmed in the writer thread; 212 tests pass."}]}),
            json!({"role": "user", "content": "Thanks. Painting watercolours at night helps me relax after long days."}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Noted."}]}),
            json!({"role": "user", "content": "Now update the serde dependency and rerun the benchmark suite."}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "Bumped; the index opens and the probe search passes."}]}),
        ],
    );
    let unplugged_with = |args: &[&str], env: &[(&str, &str)]| -> Output {
        let output = std::process::Command::new("unshare")
            .arg("-rn")
            .arg(common::binary())
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .output()
            .expect(
                "this test runs vilvona under `unshare -rn` (util-linux) to unplug the network",
            );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    let unplugged = |args: &[&str]| unplugged_with(args, &[]);
    unplugged(&["replay", &file, "--engine", "lossless", "--json"]);
    let question = "What does the user do to unwind?";
    let words = ok_json(&unplugged(&[
        "grep",
        question,
        "--session",
        "unplugged",
        "--mode",
        "text",
        "--json",
    ]));
    assert!(
        !words.to_string().contains("Painting"),
        "the question shares no word with the fact: {words}"
    );
    for mode in ["semantic", "hybrid"] {
        let args = [
            "grep",
            question,
            "--session",
            "unplugged",
            "--mode",
            mode,
            "--json",
        ];
        let found = ok_json(&unplugged(&args));
        assert!(
            found["results"][0]["snippet"]
                .as_str()
                .unwrap()
                .contains("Painting watercolours"),
            "{mode}: {found}"
        );
        // With no vectors held in memory (read from the index files), the same answer.
        let from_files = ok_json(&unplugged_with(&args, &[("VILVONA_VECTOR_CACHE_MIB", "0")]));
        assert_eq!(from_files["results"], found["results"], "{mode}");
    }
    let answered = ok_json(&unplugged(&[
        "ask",
        question,
        "--session",
        "unplugged",
        "--json",
    ]));
    assert!(
        answered.to_string().contains("Painting watercolours"),
        "{answered}"
    );
}

/// The embedding model is the lossless entry's `embedding` setting: a model file of the
/// built-in format works as the built-in one does, `none` turns recall by meaning off (hybrid
/// search is then text search), and a file that is not a model is one line naming the key.
#[test]
fn the_embedding_model_is_a_file_or_none() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let model = state.join("model.safetensors");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../embed/model/minilm-l6-static-192.safetensors"),
        &model,
    )
    .unwrap();
    let configure = |embedding: &str| {
        std::fs::write(
            state.join("vilvona.json5"),
            format!(
                r#"{{ plugins: {{ slots: {{ contextEngine: "lossless" }}, entries: {{ lossless: {{ config: {{ embedding: {embedding} }} }} }} }} }}"#
            ),
        )
        .unwrap();
    };
    configure(&format!(
        r#"{{ kind: "file", path: "{}" }}"#,
        model.display()
    ));
    let file = transcript(
        state,
        "chosen",
        &[
            json!({"role": "user", "content": "Refactor the parser cache in src/cache.rs and run the tests."}),
            json!({"role": "user", "content": "Thanks. Painting watercolours at night helps me relax after long days."}),
            json!({"role": "user", "content": "Now update the serde dependency and rerun the benchmark suite."}),
        ],
    );
    let replayed = vilvona(state, &["replay", &file, "--json"]);
    assert!(
        replayed.status.success(),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let question = "What does the user do to unwind?";
    let grep = |mode: &str| {
        vilvona(
            state,
            &[
                "grep",
                question,
                "--session",
                "chosen",
                "--mode",
                mode,
                "--json",
            ],
        )
    };
    let found = ok_json(&grep("semantic"));
    assert!(
        found["results"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("Painting watercolours"),
        "{found}"
    );

    configure(r#"{ kind: "none" }"#);
    let error = one_line_error(&grep("semantic"));
    assert!(error.contains("recall by meaning is off"), "{error}");
    let words = ok_json(&grep("hybrid"));
    assert!(!words.to_string().contains("Painting"), "{words}");

    std::fs::write(&model, b"not a model").unwrap();
    configure(&format!(
        r#"{{ kind: "file", path: "{}" }}"#,
        model.display()
    ));
    let error = one_line_error(&grep("hybrid"));
    assert!(
        error.contains("plugins.entries.lossless.config.embedding.path")
            && error.contains("model.safetensors"),
        "{error}"
    );
}

/// A model behind an OpenAI-compatible endpoint (a real HTTP server on 127.0.0.1), chosen by
/// the `embedding` setting with its key in the environment: the replay embeds in batches
/// before it ends, and a later grep finds by meaning through it; an endpoint that is down makes
/// semantic grep one line naming it, and hybrid grep still answers by words; a key variable
/// that is not set is one line naming the key.
#[test]
fn an_embedding_endpoint_is_used_through_its_settings() {
    use vilvona_embed::endpoint::TestEndpoint;

    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let endpoint = TestEndpoint::start().unwrap();
    endpoint.require_key("sk-cli-test");
    std::fs::write(
        state.join("vilvona.json5"),
        format!(
            r#"{{ plugins: {{ slots: {{ contextEngine: "lossless" }}, entries: {{ lossless: {{ config: {{ embedding: {{ kind: "openai", baseUrl: "{}", model: "test-model", apiKeyEnv: "VILVONA_TEST_EMBEDDING_KEY", batchSize: 4 }} }} }} }} }} }}"#,
            endpoint.base_url()
        ),
    )
    .unwrap();
    let run = |args: &[&str], key: Option<&str>| {
        let mut command = common::command(state, args);
        match key {
            Some(key) => command.env("VILVONA_TEST_EMBEDDING_KEY", key),
            None => command.env_remove("VILVONA_TEST_EMBEDDING_KEY"),
        };
        command.output().unwrap()
    };
    let file = transcript(
        state,
        "remote",
        &[
            json!({"role": "user", "content": "Refactor the parser cache in src/cache.rs and run the tests."}),
            json!({"role": "user", "content": "Painting watercolours at night helps me relax."}),
            json!({"role": "user", "content": "Now update the serde dependency and rerun the benchmark suite."}),
        ],
    );
    ok_json(&run(&["replay", &file, "--json"], Some("sk-cli-test")));
    assert!(endpoint.inputs() >= 3 && endpoint.largest_batch() <= 4);
    let grep = |mode: &str, key: Option<&str>| {
        run(
            &[
                "grep",
                "at night, what helps me relax?",
                "--session",
                "remote",
                "--mode",
                mode,
                "--json",
            ],
            key,
        )
    };
    let found = ok_json(&grep("semantic", Some("sk-cli-test")));
    assert!(
        found["results"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("Painting watercolours"),
        "{found}"
    );

    endpoint.fail_with(Some(503));
    let error = one_line_error(&grep("semantic", Some("sk-cli-test")));
    assert!(
        error.contains("unavailable") && error.contains(&endpoint.base_url()),
        "{error}"
    );
    let words = ok_json(&grep("hybrid", Some("sk-cli-test")));
    assert!(
        words.to_string().contains("Painting watercolours"),
        "{words}"
    );

    let error = one_line_error(&grep("semantic", None));
    assert!(
        error.contains("plugins.entries.lossless.config.embedding.apiKeyEnv")
            && error.contains("VILVONA_TEST_EMBEDDING_KEY"),
        "{error}"
    );
}
