//! The built `vilvona` binary in temporary state directories.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use tempfile::TempDir;

fn vilvona(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vilvona"))
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&output.stdout)))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn fixture() -> String {
    format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn the_demo_runs_and_recalls_facts() {
    let dir = TempDir::new().unwrap();
    let output = vilvona(dir.path(), &["demo", "--turns", "150"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", stderr(&output));
    for expected in [
        "engine:               lossless",
        "over-budget turns:    0",
        "What the model sees now",
        "vilvona_grep",
        "answer: OPS-",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn replay_reports_and_stores_nothing_the_second_time() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let first = json(&vilvona(
        state,
        &[
            "replay",
            &fixture(),
            "--engine",
            "lossless",
            "--context-window",
            "12000",
            "--json",
        ],
    ));
    for field in [
        "engine",
        "session",
        "turns",
        "messages",
        "ingested",
        "compactions",
        "summariesByDepth",
        "tokenBudget",
        "finalContextTokens",
        "maxAssembledTokens",
        "overBudgetTurns",
        "wallMs",
    ] {
        assert!(first.get(field).is_some(), "missing {field}: {first}");
    }
    assert_eq!(first["engine"], "lossless");
    assert_eq!(first["session"], "synthetic-11-15");
    assert_eq!(first["turns"], 15);
    assert_eq!(first["ingested"], first["messages"]);
    assert_eq!(first["overBudgetTurns"], 0);
    let second = json(&vilvona(
        state,
        &[
            "replay",
            &fixture(),
            "--engine",
            "lossless",
            "--context-window",
            "12000",
            "--json",
        ],
    ));
    assert_eq!(second["ingested"], 0);

    // The inspection commands on the replayed session.
    std::fs::write(state.join("vilvona.json5"), r#"{ plugins: { slots: { contextEngine: "lossless" } }, agents: { defaults: { contextTokens: 12000 } } }"#).unwrap();
    let session = "synthetic-11-15";
    let stats = json(&vilvona(state, &["stats", "--session", session, "--json"]));
    for field in [
        "messages",
        "summariesByDepth",
        "contextItems",
        "contextTokens",
        "databaseBytes",
        "indexDocs",
    ] {
        assert!(stats.get(field).is_some(), "missing {field}: {stats}");
    }
    assert_eq!(stats["messages"], first["messages"]);
    let grep = json(&vilvona(
        state,
        &[
            "grep",
            "password rotation",
            "--session",
            session,
            "--mode",
            "phrase",
            "--json",
        ],
    ));
    let hit = &grep["results"][0];
    assert!(
        hit["snippet"]
            .as_str()
            .unwrap()
            .contains("«password» «rotation»"),
        "{grep}"
    );
    let described = json(&vilvona(
        state,
        &[
            "describe",
            hit["id"].as_str().unwrap(),
            "--session",
            session,
            "--json",
        ],
    ));
    assert!(
        described["text"]
            .as_str()
            .unwrap()
            .contains("Please remember")
    );
    let sessions = json(&vilvona(state, &["sessions", "--json"]));
    assert_eq!(sessions[0]["id"], session);
    assert_eq!(sessions[0]["messages"], first["messages"]);
    let compacted = json(&vilvona(
        state,
        &["compact", "--session", session, "--json"],
    ));
    assert_eq!(compacted["ok"], true);
    if let Some(summary) = json(&vilvona(
        state,
        &[
            "grep",
            "rotation",
            "--session",
            session,
            "--scope",
            "summaries",
            "--json",
        ],
    ))["results"][0]["id"]
        .as_str()
    {
        let expanded = json(&vilvona(
            state,
            &[
                "expand",
                summary,
                "--session",
                session,
                "--token-cap",
                "500",
                "--json",
            ],
        ));
        assert!(
            expanded["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
        );
    }
    let doctor = vilvona(state, &["doctor", "--json"]);
    assert_eq!(doctor.status.code(), Some(0), "{}", stderr(&doctor));
    let report = json(&doctor);
    assert_eq!(report["healthy"], true);
    assert!(report["checks"][0]["name"] == "store integrity");

    let context = json(&vilvona(state, &["context", "json", "--session", session]));
    assert!(
        context["report"]["conversation"]
            .as_array()
            .is_some_and(|parts| !parts.is_empty())
    );
    let list = vilvona(state, &["context", "list", "--session", session]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("Injected workspace files:"));
    let map = state.join("map.png");
    let output = vilvona(
        state,
        &[
            "context",
            "map",
            "--session",
            session,
            "--out",
            map.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let bytes = std::fs::read(&map).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 1280);

    let rebuilt = vilvona(state, &["rebuild-index"]);
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
}

#[test]
fn bad_input_is_one_clear_line() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();

    let unknown = vilvona(state, &["stats", "--session", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        stderr(&unknown).trim(),
        format!(
            "vilvona: unknown session \"nope\" in {0}; `vilvona --state-dir {0} sessions` lists the stored ones",
            state.display()
        )
    );

    let missing = vilvona(state, &["replay", "/nonexistent/session.jsonl"]);
    assert_eq!(
        stderr(&missing).trim(),
        "vilvona: /nonexistent/session.jsonl: no such file; check the path"
    );

    // A malformed line: named with its line number, everything before it kept, non-zero exit.
    let lines: Vec<String> = std::fs::read_to_string(fixture())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let mut broken = lines[..12].to_vec();
    broken.push("{\"type\":\"message\",\"id\":".to_owned());
    broken.extend(lines[12..20].iter().cloned());
    let file = state.join("broken.jsonl");
    std::fs::write(&file, broken.join("\n") + "\n").unwrap();
    let output = vilvona(
        state,
        &[
            "replay",
            file.to_str().unwrap(),
            "--engine",
            "lossless",
            "--json",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    let error = stderr(&output);
    assert!(
        error.contains(&format!("{}:13:", file.display())),
        "{error}"
    );
    assert!(!error.contains("panicked"), "{error}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["messages"], 11,
        "the 11 messages before the bad line were replayed"
    );

    std::fs::write(
        state.join("vilvona.json5"),
        "{\n  plugins: { slots: { contextEngine: 'lossless' ,, } }\n}\n",
    )
    .unwrap();
    let config = vilvona(state, &["doctor"]);
    assert_eq!(config.status.code(), Some(1));
    let error = stderr(&config);
    assert!(
        error.starts_with(&format!(
            "vilvona: {}:2:",
            state.join("vilvona.json5").display()
        )),
        "{error}"
    );
    assert_eq!(error.lines().count(), 1, "{error}");
}

/// A disabled entry selects `legacy`, and every report names the engine that served.
#[test]
fn a_disabled_entry_is_reported_as_legacy() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    std::fs::write(
        state.join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" }, entries: { lossless: { enabled: false } } } }"#,
    )
    .unwrap();
    let replay = json(&vilvona(state, &["replay", &fixture(), "--json"]));
    assert_eq!(replay["engine"], "legacy");
    let doctor = json(&vilvona(state, &["doctor", "--json"]));
    assert_eq!(doctor["activeEngine"], "legacy", "{doctor}");
    let context = json(&vilvona(
        state,
        &["context", "json", "--session", "synthetic-11-15"],
    ));
    assert_eq!(context["report"]["engine"], "legacy", "{context}");
}

#[test]
fn uninstalling_the_selected_engine_resets_the_slot() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("vilvona.json5");
    std::fs::write(
        &config,
        "{\n  // mine\n  plugins: { slots: { contextEngine: \"lossless\" } },\n}\n",
    )
    .unwrap();
    let output = vilvona(dir.path(), &["plugins", "uninstall", "window"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("\"lossless\"")
    );
    let output = vilvona(dir.path(), &["plugins", "uninstall", "lossless"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.contains("contextEngine: \"legacy\"") && text.contains("// mine"),
        "{text}"
    );
    let doctor = json(&vilvona(dir.path(), &["doctor", "--json"]));
    assert_eq!(doctor["activeEngine"], "legacy");
}

/// The /context views report what OpenClaw's report: the workspace and sandbox lines, injected
/// files raw against injected, skills, the tool list's text, compactable transcript counts,
/// and token usage in json.
#[test]
fn context_views_report_the_workspace_skills_and_usage() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let workspace = state.join("ws");
    std::fs::create_dir_all(workspace.join("skills/deploy")).unwrap();
    std::fs::write(workspace.join("AGENTS.md"), "a".repeat(25_000)).unwrap();
    std::fs::write(
        workspace.join("skills/deploy/SKILL.md"),
        "---\nname: deploy\ndescription: Ship it\n---\n",
    )
    .unwrap();
    json(&vilvona(state, &["replay", &fixture(), "--json"]));
    let ws = workspace.to_str().unwrap();
    let session = "synthetic-11-15";
    let list = vilvona(
        state,
        &["context", "list", "--session", session, "--workspace", ws],
    );
    let text = String::from_utf8_lossy(&list.stdout);
    for expected in [
        &format!("Workspace: {ws}") as &str,
        "Sandbox: mode=off sandboxed=false",
        "Bootstrap max/file: 20,000 chars",
        "- AGENTS.md: TRUNCATED | raw 25,000 chars (~6,250 tok) | injected 20,000 chars",
        "Skills list (system prompt text):",
        "(1 skills)",
        "Tool list (system prompt text):",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let detail = vilvona(
        state,
        &["context", "detail", "--session", session, "--workspace", ws],
    );
    let text = String::from_utf8_lossy(&detail.stdout);
    assert!(
        text.contains("Top skills (prompt entry size):\n- deploy:"),
        "{text}"
    );
    assert!(
        text.contains(
            "Transcript: 68 messages; 68 user, assistant and tool results since its last compaction entry"
        ),
        "{text}"
    );
    let report = json(&vilvona(state, &["context", "json", "--session", session]));
    assert_eq!(report["session"]["inputTokens"], 0);
    assert_eq!(report["session"]["outputTokens"], 0);
    assert_eq!(report["report"]["transcript"]["messages"], 68);
}

/// Asked for lossless, the command line never quietly runs on legacy.
#[test]
fn an_engine_that_cannot_start_fails_the_command() {
    let dir = TempDir::new().unwrap();
    let store = dir.path().join("agents").join("main").join("lossless");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    std::fs::write(&store, "a file where the store directory belongs").unwrap();
    let output = vilvona(
        dir.path(),
        &["replay", &fixture(), "--engine", "lossless", "--json"],
    );
    assert!(!output.status.success());
    assert!(
        output.stdout.is_empty(),
        "no report of a run that did not happen"
    );
    let error = stderr(&output);
    assert!(
        error.contains(
            "context engine \"lossless\" could not start (factory): lossless opening the store:"
        ),
        "{error}"
    );
    assert_eq!(error.lines().count(), 1, "{error}");
}

/// Hostile input: a configuration nested 30,000 levels, a transcript whose first entry is
/// malformed — each one clear line naming the file and line, never a crash.
#[test]
fn hostile_configuration_and_transcripts_get_one_clear_line() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let deep = format!("{{ a: {}1{} }}", "[".repeat(30_000), "]".repeat(30_000));
    std::fs::write(state.join("vilvona.json5"), deep).unwrap();
    for command in [&["doctor"][..], &["replay", &fixture()][..]] {
        let output = vilvona(state, command);
        assert_eq!(output.status.code(), Some(1), "{command:?}");
        let error = stderr(&output);
        assert!(
            error.contains("vilvona.json5:1:") && error.contains("nest deeper than 64 levels"),
            "{command:?}: {error}"
        );
        assert_eq!(error.lines().count(), 1, "{error}");
    }
    std::fs::remove_file(state.join("vilvona.json5")).unwrap();

    let file = state.join("first-bad.jsonl");
    let header = std::fs::read_to_string(fixture())
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    std::fs::write(
        &file,
        format!("{header}\n{{\"type\":\"message\",\"message\":{{\"role\":\"user\",\"content\":\"no id\"}}}}\n"),
    )
    .unwrap();
    let output = vilvona(state, &["replay", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let error = stderr(&output);
    assert!(error.contains(&format!("{}:2:", file.display())), "{error}");
    assert!(!error.contains("has no record"), "{error}");
}

/// Private by default: the state directory 0700 and every file in it 0600 whatever the umask;
/// doctor reports anything looser, and doctor --fix tightens it. A relative state directory is
/// recorded absolute.
#[test]
fn the_state_directory_is_private_and_absolute() {
    use std::os::unix::fs::PermissionsExt;

    let dir = TempDir::new().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_vilvona"))
        .current_dir(dir.path())
        .args([
            "--state-dir",
            "rel",
            "replay",
            &fixture(),
            "--engine",
            "lossless",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let state = dir.path().join("rel");
    let records: Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("sessions.json")).unwrap())
            .unwrap();
    for record in records.as_object().unwrap().values() {
        assert!(
            Path::new(record["sessionFile"].as_str().unwrap()).is_absolute(),
            "{record}"
        );
    }
    let mut checked = 0;
    let mut pending = vec![state.clone()];
    while let Some(path) = pending.pop() {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", path.display());
        checked += 1;
        if path.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .unwrap()
                    .flatten()
                    .map(|entry| entry.path()),
            );
        }
    }
    assert!(checked > 10, "only {checked} paths");
    let doctor = json(&vilvona(&state, &["doctor", "--json"]));
    assert_eq!(doctor["healthy"], true, "{doctor}");

    // A 0644 file is out of reach while the directories above it are 0700: exposed only
    // when they are opened too.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        state.join("sessions"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let transcript = std::fs::read_dir(state.join("sessions"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    std::fs::set_permissions(&transcript, std::fs::Permissions::from_mode(0o644)).unwrap();
    let loose = vilvona(&state, &["doctor", "--json"]);
    assert_eq!(loose.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&loose.stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|check| check["name"] == "private state directory")
        .unwrap()
        .clone();
    assert_eq!(check["ok"], false);
    assert!(
        check["detail"].as_str().unwrap().contains("doctor --fix"),
        "{check}"
    );
    let fixed = json(&vilvona(&state, &["doctor", "--fix", "--json"]));
    assert_eq!(fixed["healthy"], true, "{fixed}");
    let mode = std::fs::metadata(&transcript).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// A transcript line with bytes that are not UTF-8 is kept, lossily, with a warning naming
/// the line: everything valid in it matters more than its bad bytes.
#[test]
fn invalid_utf8_in_a_transcript_line_is_kept_with_a_warning() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let mut bytes = std::fs::read(fixture()).unwrap();
    // The second line (the first entry): one byte replaced by 0xff inside its text.
    let second = bytes.iter().position(|byte| *byte == b'\n').unwrap() + 1;
    let offset = second
        + bytes[second..]
            .windows(9)
            .position(|window| window == b"\"content\"")
            .unwrap()
        + 14;
    bytes[offset] = 0xff;
    let file = state.join("bad-bytes.jsonl");
    std::fs::write(&file, bytes).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_vilvona"))
        .arg("--state-dir")
        .arg(state)
        .args([
            "replay",
            file.to_str().unwrap(),
            "--engine",
            "lossless",
            "--json",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not valid UTF-8") && stderr(&output).contains("line=2"),
        "{}",
        stderr(&output)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ingested"], report["messages"]);
}

/// `doctor --fix` where no engine keeps history: nothing to rebuild, and nothing said of an
/// index (it once printed that "the recall index could not be rebuilt").
#[test]
fn doctor_fix_without_a_store_says_nothing_of_an_index() {
    let dir = TempDir::new().unwrap();
    let fixed = vilvona(dir.path(), &["doctor", "--fix"]);
    let said = stderr(&fixed);
    assert!(!said.contains("index"), "{said}");
    assert!(said.contains("tightened"), "{said}");
}

/// The panel's server stands up to a local program: connections beyond the descriptors it may
/// open fail alone (it accepts again; it once ended on the first failed accept), and once they
/// are gone a request is answered as before.
#[test]
fn the_panel_server_survives_running_out_of_descriptors() {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    use std::net::TcpStream;
    let dir = TempDir::new().unwrap();
    let mut server = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 48 && exec '{}' --state-dir '{}' ui --port 0",
            env!("CARGO_BIN_EXE_vilvona"),
            dir.path().display()
        ))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let address = first
        .trim()
        .strip_prefix("vilvona ui: http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    // Twice as many connections as descriptors: the accepts beyond them fail.
    let held: Vec<TcpStream> = (0..96)
        .filter_map(|_| TcpStream::connect(&address).ok())
        .collect();
    assert!(held.len() > 48, "{} connections", held.len());
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(held);
    let page = (0..100).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut stream = TcpStream::connect(&address).ok()?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    });
    let running = server.try_wait().unwrap().is_none();
    server.kill().ok();
    server.wait().ok();
    assert!(running, "the server ended");
    assert!(
        page.is_some(),
        "the page was not served after the connections went"
    );
}
