//! The command line as a newcomer reads it: what the help says each view prints, what a
//! mistaken id or cursor answers, the labels of the DAG picture, how full the window is, and
//! configuration errors that say which key and where.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use tempfile::TempDir;

use common::vilvona;

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_str(&stdout(output)).unwrap()
}

/// One line on stderr and exit status 1.
fn refusal(output: &Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let error = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    assert_eq!(error.lines().count(), 1, "{error}");
    error
}

/// A session of the fixture replayed through lossless at a 12,000-token window, compacted.
fn replayed(state: &Path) -> &'static str {
    std::fs::write(
        state.join("vilvona.json5"),
        r#"{ plugins: { slots: { contextEngine: "lossless" } }, agents: { defaults: { contextTokens: 12000 } } }"#,
    )
    .unwrap();
    let fixture = format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    stdout(&vilvona(state, &["replay", &fixture, "--json"]));
    stdout(&vilvona(
        state,
        &["compact", "--session", "synthetic-11-15", "--json"],
    ));
    "synthetic-11-15"
}

#[test]
fn the_views_say_what_they_print_and_ids_resolve_as_shown() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let session = replayed(state);

    // The help describes what the views print.
    let help = stdout(&vilvona(state, &["context", "--help"]));
    assert!(!help.contains("One line per context item"), "{help}");
    assert!(help.contains("how full the window is"), "{help}");

    // How full the window is, with the one budget the prompt has.
    let list = stdout(&vilvona(state, &["context", "list", "--session", session]));
    let window = list
        .lines()
        .find(|line| line.starts_with("Window: "))
        .unwrap_or_else(|| panic!("no window line in:\n{list}"));
    let report = json(&vilvona(state, &["context", "json", "--session", session]));
    let used = report["report"]["sessionTokens"].as_u64().unwrap();
    let percent = (used * 100 + 6_000) / 12_000;
    assert!(
        window.contains(&format!("/ 12,000 tokens ({percent}%)")),
        "{window}"
    );
    // Half of a small window is kept for the reply (reserveTokensFloor, capped at half).
    assert_eq!(report["report"]["promptBudget"], 6_000);
    assert!(window.contains("the prompt may use 6,000"), "{window}");
    assert!(!list.contains("budget="), "{list}");

    // The DAG picture's labels are ids describe and expand resolve.
    let summary = json(&vilvona(
        state,
        &[
            "grep",
            "the",
            "--session",
            session,
            "--scope",
            "summaries",
            "--json",
        ],
    ))["results"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let label: String = summary.chars().take(12).collect();
    let dot = stdout(&vilvona(
        state,
        &["context", "dag", "--session", session, "--format", "dot"],
    ));
    assert!(dot.contains(&summary), "{dot}");
    for named in [label.as_str(), label.trim_start_matches("sum_")] {
        let described = json(&vilvona(
            state,
            &["describe", named, "--session", session, "--json"],
        ));
        assert_eq!(described["id"], summary.as_str(), "{named}");
        let expanded = json(&vilvona(
            state,
            &["expand", named, "--session", session, "--json"],
        ));
        assert_eq!(expanded["id"], summary.as_str(), "{named}");
    }
    let unknown = refusal(&vilvona(
        state,
        &["describe", "sum_ffffffffff", "--session", session],
    ));
    assert!(unknown.contains("sum_ffffffffff not found"), "{unknown}");

    // Expand takes a summary; a message id says so, and names the command that reads it.
    let message = json(&vilvona(
        state,
        &[
            "grep",
            "password",
            "--session",
            session,
            "--scope",
            "messages",
            "--json",
        ],
    ))["results"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let error = refusal(&vilvona(state, &["expand", &message, "--session", session]));
    assert!(
        error.contains("is not a summary") && error.contains("describe"),
        "{error}"
    );

    // A cursor past the last child is an error, not an empty page.
    let total = json(&vilvona(
        state,
        &["expand", &summary, "--session", session, "--json"],
    ))["total"]
        .as_u64()
        .unwrap();
    let error = refusal(&vilvona(
        state,
        &["expand", &summary, "--session", session, "--cursor", "99"],
    ));
    assert!(
        error.contains(&format!(
            "cursor 99 is past the last child: {summary} has {total}"
        )),
        "{error}"
    );

    // Stats are lines a person reads, not `key: <JSON>`.
    let stats = stdout(&vilvona(state, &["stats", "--session", session]));
    assert!(!stats.contains('{') && !stats.contains('"'), "{stats}");
    assert!(stats.contains("messages:"), "{stats}");
}

#[test]
fn the_demo_explains_its_budget_and_recalls_every_planted_fact() {
    let dir = TempDir::new().unwrap();
    let text = stdout(&vilvona(dir.path(), &["demo", "--turns", "400"]));
    // Every summary the store holds, by depth, as words.
    let stored = text
        .lines()
        .find(|line| line.starts_with("summaries stored:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        stored.contains("(depth 0: ") && !stored.contains('{'),
        "{stored}"
    );
    assert!(
        text.contains(
            "prompt budget:        16,000 of a 32,000-token window; the rest is kept for the reply"
        ),
        "{text}"
    );
    assert!(text.contains("tokens ("), "{text}");
    assert!(
        text.contains("10 of 10 planted facts recalled from the whole history."),
        "{text}"
    );
}

/// A configuration mistake is one line naming the key path, the file, line and column, and —
/// for a slip — the key that was meant.
#[test]
fn configuration_errors_name_the_key_and_where_it_is() {
    for (file, said) in [
        (
            "{\n  plugins: {\n    slots: { contextEngine: \"lossless\" },\n    entries: { lossless: { config: { freshTailCount: \"many\" } } },\n  },\n}\n",
            "plugins.entries.lossless.config.freshTailCount (STATE/vilvona.json5:4:38): invalid type: string \"many\", expected usize",
        ),
        (
            "{\n  plugins: {\n    slots: { contextEngine: \"lossless\" },\n    entries: { lossless: { config: { freshTailCont: 8 } } },\n  },\n}\n",
            "plugins.entries.lossless.config.freshTailCont (STATE/vilvona.json5:4:38): is not a setting; did you mean `freshTailCount`?",
        ),
        (
            "{\n  plugins: {\n    slots: { contextEngine: \"lossless\" },\n  agents: { defaults: { contextTokens: 32000 } },\n",
            "STATE/vilvona.json5:5:1: the file ends inside the object (`plugins`) opened at line 2, column 12: a closing `}` is missing",
        ),
    ] {
        let dir = TempDir::new().unwrap();
        let state = dir.path();
        std::fs::write(state.join("vilvona.json5"), file).unwrap();
        let said = said.replace("STATE", &state.display().to_string());
        let error = refusal(&vilvona(state, &["sessions"]));
        assert!(error.ends_with(&said), "{error}\nwanted: {said}");
        // Doctor reports it in its report, with no log line of its own before it.
        let doctor = vilvona(state, &["doctor"]);
        let stderr = String::from_utf8_lossy(&doctor.stderr);
        assert!(!stderr.contains("ERROR"), "{stderr}");
        let report = format!("{}{stderr}", String::from_utf8_lossy(&doctor.stdout));
        assert!(report.contains(&said), "{report}");
    }
    // An unknown key of the host's own is reported with its place and the key meant.
    let dir = TempDir::new().unwrap();
    std::fs::write(
        dir.path().join("vilvona.json5"),
        "{\n  agents: { defaults: { contextTokns: 32000 } },\n}\n",
    )
    .unwrap();
    // (Doctor's exit status also counts the temporary directory's permissions.)
    let doctor = vilvona(dir.path(), &["doctor"]);
    let doctor = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.contains(&format!(
            "unknown key (ignored): agents.defaults.contextTokns at {}/vilvona.json5:2:25; did you mean agents.defaults.contextTokens?",
            dir.path().display()
        )),
        "{doctor}"
    );
}

/// Uninstalling edits the key the file sets, not a comment that mentions it.
#[test]
fn uninstall_edits_the_key_not_the_comment_above_it() {
    let dir = TempDir::new().unwrap();
    let config = dir.path().join("vilvona.json5");
    let text = "{\n  plugins: {\n    slots: {\n      // was: contextEngine: \"x\"\n      contextEngine: \"lossless\",\n    },\n  },\n}\n";
    std::fs::write(&config, text).unwrap();
    let said = stdout(&vilvona(dir.path(), &["plugins", "uninstall", "lossless"]));
    assert!(said.contains("it now selects \"legacy\""), "{said}");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        text.replace("contextEngine: \"lossless\"", "contextEngine: \"legacy\"")
    );
}

/// The demo's closing lines are the next commands, and each works pasted as printed: this
/// executable (`cargo run` puts no `vilvona` on PATH), the demo's own state directory (a path
/// with a space in it, quoted), and a panel that starts.
#[test]
fn the_demo_ends_with_commands_that_work_as_printed() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("my state");
    std::fs::create_dir(&state).unwrap();
    let text = stdout(&vilvona(&state, &["demo", "--turns", "60"]));
    let next: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("Next, pasted as printed"))
        .skip(1)
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    assert_eq!(next.len(), 4, "{text}");
    for line in &next {
        if line.contains(" ui ") {
            // The panel's server: it prints its URL, then serves until stopped.
            let mut child = std::process::Command::new("sh")
                .args(["-c", &format!("exec {line}")])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut first = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(child.stdout.take().unwrap()),
                &mut first,
            )
            .unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            assert!(
                first.starts_with("vilvona ui: http://127.0.0.1:"),
                "{line}: {first}"
            );
            continue;
        }
        let output = std::process::Command::new("sh")
            .args(["-c", line])
            .output()
            .unwrap();
        let printed = stdout(&output);
        assert!(!printed.trim().is_empty(), "{line} printed nothing");
        assert!(!printed.contains("no sessions"), "{line}: {printed}");
    }
    // The counts agree: the demo compacted, and `sessions` says so (it once said 0).
    let demo = state.join("demo");
    let sessions = json(&vilvona(&demo, &["sessions", "--json"]));
    let compactions = sessions[0]["compactions"].as_u64().unwrap();
    let stats = json(&vilvona(
        &demo,
        &[
            "context",
            "dag",
            "--format",
            "json",
            "--session",
            "synthetic-rs-7-60",
        ],
    ));
    assert_eq!(
        compactions,
        stats["summaries"].as_array().unwrap().len() as u64,
        "{sessions}"
    );
    assert!(compactions > 0, "{sessions}");
    // No empty heading, and no "compactable since the last compaction" beside summaries.
    let detail = stdout(&vilvona(
        &demo,
        &["context", "detail", "--session", "synthetic-rs-7-60"],
    ));
    assert!(
        detail.contains("Injected workspace files: none"),
        "{detail}"
    );
    assert!(
        detail.contains("summaries standing for the other"),
        "{detail}"
    );
}

/// A mistaken session or id says where it looked and what ids look like.
#[test]
fn a_mistaken_name_says_where_it_looked() {
    let dir = TempDir::new().unwrap();
    let session = replayed(dir.path());
    let unknown = refusal(&vilvona(dir.path(), &["grep", "x", "--session", "nope"]));
    assert!(
        unknown.contains(&dir.path().display().to_string()),
        "{unknown}"
    );
    // A regex mistake is one line too (the regex crate draws it over four).
    let regex = refusal(&vilvona(
        dir.path(),
        &["grep", "(", "--mode", "regex", "--session", session],
    ));
    assert!(regex.ends_with("unclosed group"), "{regex}");
    let missing = refusal(&vilvona(
        dir.path(),
        &["describe", "foo", "--session", session],
    ));
    assert!(
        missing.contains("msg_12") && missing.contains("sum_"),
        "{missing}"
    );
}

/// The set-up section says how long the first build takes, beside the command.
#[test]
fn the_readme_says_how_long_the_first_build_takes_beside_the_command() {
    let readme =
        std::fs::read_to_string(format!("{}/../../README.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let setup = &readme[readme.find("## Set up").unwrap()..];
    let setup = &setup[..setup[3..].find("\n## ").unwrap()];
    let block_end = setup.find("```\n\n").unwrap();
    let after = &setup[block_end..block_end + 400];
    assert!(
        after.contains("first build") && after.contains("minutes"),
        "{after}"
    );
}

/// The rows of the table that follows `<!-- settings: NAME -->` in SETTINGS.md: each key (or
/// variable) with its default cell.
fn settings_table(doc: &str, name: &str) -> Vec<(String, String)> {
    let marker = format!("<!-- settings: {name} -->");
    let at = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("SETTINGS.md has no table {marker}"));
    doc[at + marker.len()..]
        .lines()
        .skip_while(|line| line.trim().is_empty())
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

/// The keys the engine's parser accepts at `path` of `minimal` (a known-good object): an
/// unknown key there is refused with the list of the known ones.
fn accepted_keys(minimal: &Value, path: &[&str]) -> Vec<String> {
    let mut probe = minimal.clone();
    let mut at = &mut probe;
    for part in path {
        at = &mut at[*part];
    }
    at["zzzzzzzz"] = Value::from(1);
    let error = vilvona_lossless::LosslessConfig::from_value(Some(&probe))
        .expect_err("an unknown key is refused")
        .to_string();
    let (_, known) = error
        .split_once("known keys here: ")
        .unwrap_or_else(|| panic!("the refusal lists no known keys: {error}"));
    known.split(", ").map(str::to_owned).collect()
}

#[test]
fn the_settings_reference_lists_what_the_parsers_accept() {
    let root = format!("{}/../..", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(format!("{root}/SETTINGS.md")).unwrap();
    let keys = |rows: &[(String, String)]| -> Vec<String> {
        let mut keys: Vec<String> = rows.iter().map(|(key, _)| key.clone()).collect();
        keys.sort();
        keys
    };
    let sorted = |mut list: Vec<String>| {
        list.sort();
        list
    };

    // The engine's settings: every key its parser accepts, no other, each default the one the
    // engine applies (a required key: refused when left out).
    let sections: [(&str, Value, &[&str]); 8] = [
        ("engine", serde_json::json!({}), &[]),
        (
            "retention",
            serde_json::json!({"retention": {}}),
            &["retention"],
        ),
        (
            "summarizer.openai",
            serde_json::json!({"summarizer": {"kind": "openai", "baseUrl": "http://127.0.0.1:9/v1", "model": "m"}}),
            &["summarizer"],
        ),
        (
            "embedding.file",
            serde_json::json!({"embedding": {"kind": "file", "path": "/model.safetensors"}}),
            &["embedding"],
        ),
        (
            "embedding.openai",
            serde_json::json!({"embedding": {"kind": "openai", "baseUrl": "http://127.0.0.1:9/v1", "model": "m"}}),
            &["embedding"],
        ),
        (
            "assemblyRecall",
            serde_json::json!({"assemblyRecall": {}}),
            &["assemblyRecall"],
        ),
        (
            "store.sqlite",
            serde_json::json!({"store": {"kind": "sqlite"}}),
            &["store"],
        ),
        (
            "store.postgres",
            serde_json::json!({"store": {"kind": "postgres", "url": "postgres://x/y"}}),
            &["store"],
        ),
    ];
    for (name, minimal, path) in sections {
        let rows = settings_table(&doc, name);
        assert_eq!(
            keys(&rows),
            sorted(accepted_keys(&minimal, path)),
            "SETTINGS.md's table {name} against the keys the parser accepts"
        );
        let parsed = vilvona_lossless::LosslessConfig::from_value(Some(&minimal)).unwrap();
        let mut applied = serde_json::to_value(&parsed).unwrap();
        for part in path {
            applied = applied[*part].clone();
        }
        for (key, default) in &rows {
            let place = format!("SETTINGS.md, table {name}, {key}");
            if default == "required" {
                let mut without = minimal.clone();
                let mut at = &mut without;
                for part in path {
                    at = &mut at[*part];
                }
                at.as_object_mut().unwrap().remove(key);
                assert!(
                    vilvona_lossless::LosslessConfig::from_value(Some(&without)).is_err(),
                    "{place}: said to be required, but the settings parse without it"
                );
            } else if let Some(code) = default.strip_prefix('`') {
                let written: Value = serde_json::from_str(code.split('`').next().unwrap())
                    .unwrap_or_else(|error| panic!("{place}: the default is not JSON: {error}"));
                assert_eq!(written, applied[key.as_str()], "{place}: the default");
            } else {
                assert!(
                    applied[key.as_str()].is_object(),
                    "{place}: a default that is not a value must be a section of its own"
                );
            }
        }
    }

    // The host's keys: every key `vilvona.json5` may hold, and nothing it would call unknown.
    let host = keys(&settings_table(&doc, "host"));
    let mut patterns: Vec<String> = vilvona_runtime::config::known_keys()
        .iter()
        .filter(|pattern| !pattern.ends_with("**"))
        .map(|pattern| pattern.replace('*', "<id>"))
        .collect();
    patterns.sort();
    for pattern in &patterns {
        assert!(
            host.contains(pattern),
            "SETTINGS.md's host table lacks {pattern}"
        );
    }
    for key in &host {
        let as_pattern = key.replace("<id>", "*");
        let below_a_subtree = vilvona_runtime::config::known_keys().iter().any(|pattern| {
            pattern
                .strip_suffix("**")
                .is_some_and(|parent| as_pattern.starts_with(parent))
        });
        assert!(
            patterns.contains(key) || below_a_subtree,
            "SETTINGS.md's host table lists {key}, which the host calls unknown"
        );
    }

    // The plugin's settings: the manifest's schema, and the binary's lookup order as the
    // plugin's resolveBinary follows it.
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/bindings/openclaw/openclaw.plugin.json")).unwrap(),
    )
    .unwrap();
    let properties = manifest["configSchema"]["properties"].as_object().unwrap();
    assert_eq!(
        keys(&settings_table(&doc, "plugin")),
        sorted(properties.keys().cloned().collect()),
        "SETTINGS.md's plugin table against the manifest's configSchema"
    );
    let order = ["this setting", "VILVONA_BIN", "platform package", "PATH"];
    for description in [
        properties["binary"]["description"]
            .as_str()
            .unwrap()
            .to_owned(),
        settings_table(&doc, "plugin")
            .iter()
            .find(|(key, _)| key == "binary")
            .map(|_| {
                doc.lines()
                    .find(|line| line.starts_with("| `binary`"))
                    .unwrap()
                    .to_owned()
            })
            .unwrap(),
    ] {
        let places: Vec<usize> = order
            .iter()
            .map(|step| {
                description
                    .find(step)
                    .unwrap_or_else(|| panic!("{description:?} does not name {step}"))
            })
            .collect();
        assert!(
            places.is_sorted(),
            "{description:?}: the lookup order is {order:?}"
        );
    }
    let plugin = std::fs::read_to_string(format!("{root}/bindings/openclaw/index.js")).unwrap();
    let lookup = &plugin[plugin.find("export function resolveBinary").unwrap()..];
    let steps: Vec<usize> = [
        "config.binary",
        "env.VILVONA_BIN",
        "platformPackage()",
        "env.PATH",
    ]
    .iter()
    .map(|step| lookup.find(step).unwrap())
    .collect();
    assert!(
        steps.is_sorted(),
        "resolveBinary's order changed: update SETTINGS.md and the manifest"
    );

    // Environment variables: every one the code reads is listed, and none it does not.
    let env = keys(&settings_table(&doc, "env"));
    let mut read: Vec<String> = Vec::new();
    let mut sources = vec![
        std::path::PathBuf::from(format!("{root}/crates/cli/build.rs")),
        std::path::PathBuf::from(format!("{root}/bindings/openclaw/index.js")),
    ];
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(format!("{root}/crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("src"))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                sources.push(path);
            }
        }
    }
    for source in sources {
        let text = std::fs::read_to_string(&source).unwrap();
        for (at, _) in text.match_indices("VILVONA_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !read.contains(&name) {
                read.push(name);
            }
        }
    }
    read.push("RUST_LOG".to_owned());
    assert_eq!(env, sorted(read), "SETTINGS.md's environment table");
}

/// Under OpenClaw the engine's settings are the plugin's `engine` setting, which only the
/// gateway reads: `serve` records what it was given, the command line on the same state
/// directory reads that record when `vilvona.json5` gives the engine no settings, and `doctor`
/// names the keys where the two differ.
#[test]
fn the_command_line_reads_the_gateways_settings_and_doctor_says_when_they_differ() {
    use std::io::Write;
    use std::process::Stdio;

    let state = TempDir::new().unwrap();
    // Private, as the plugin's state directory is (doctor checks that too).
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let store = state.path().join("the-gateways-store");
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "stateDir": state.path(), "engineId": "lossless",
            "config": {"storeDir": store, "freshTailCount": 7, "summarizer": {"kind": "host"}},
        },
    });
    let mut serve = common::command(state.path(), &["serve", "--stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = serve.stdin.take().unwrap();
    writeln!(stdin, "{initialize}").unwrap();
    // The answer first: a request still open when the input ends is cancelled. (Before it,
    // `$/started` says the call began.)
    let mut output = std::io::BufReader::new(serve.stdout.take().unwrap());
    let answer: Value = loop {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut output, &mut line).unwrap();
        let message: Value = serde_json::from_str(&line).unwrap();
        if message.get("id").is_some() {
            break message;
        }
    };
    drop(stdin);
    assert!(serve.wait().unwrap().success());
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(
        store.is_dir(),
        "serve opened its store where the gateway said"
    );

    // No vilvona.json5: the command line reads the gateway's settings, so its store too (and
    // summarizes without the gateway's model, which is out of its reach).
    let report = json(&vilvona(state.path(), &["doctor", "--json"]));
    let check = |report: &Value, name: &str| -> Value {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|check| check["name"] == name)
            .unwrap_or_else(|| panic!("doctor has no check {name:?}: {report}"))
            .clone()
    };
    let gateway = check(&report, "gateway settings");
    assert_eq!(gateway["ok"], true, "{gateway}");
    assert!(
        gateway["detail"]
            .as_str()
            .unwrap()
            .contains("the command line reads the lossless settings the gateway gave"),
        "{gateway}"
    );
    let integrity = check(&report, "store integrity");
    assert_eq!(integrity["ok"], true, "{integrity}");

    // vilvona.json5 says otherwise: doctor names each key that differs, and is not healthy.
    std::fs::write(
        state.path().join("vilvona.json5"),
        format!(
            r#"{{ plugins: {{ slots: {{ contextEngine: "lossless" }}, entries: {{ lossless: {{ config: {{ storeDir: {store:?}, freshTailCount: 8, targetRatio: 0.3 }} }} }} }} }}"#
        ),
    )
    .unwrap();
    let output = vilvona(state.path(), &["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let gateway = check(&report, "gateway settings");
    assert_eq!(gateway["ok"], false, "{gateway}");
    let detail = gateway["detail"].as_str().unwrap();
    assert!(
        detail.contains("differs from the settings the gateway gave vilvona serve at freshTailCount, summarizer, targetRatio:"),
        "{detail}"
    );
    assert!(detail.contains("gateway-settings.json"), "{detail}");
    assert!(
        !output.status.success(),
        "doctor is unhealthy while they differ"
    );
}

/// `ask` without a model quotes and cites the message that answers, not every message that
/// shares a word with the question (every planted ticket has "ticket" and "owns").
#[test]
fn ask_cites_the_message_that_answers_and_no_other() {
    let dir = TempDir::new().unwrap();
    let state = dir.path();
    let session = replayed(state);
    let answer = json(&vilvona(
        state,
        &[
            "ask",
            "Who owns the ticket for the quarterly load test?",
            "--session",
            session,
            "--json",
        ],
    ));
    assert!(
        answer["answer"]
            .as_str()
            .unwrap()
            .contains("OPS-71820 and Tomasz Wojcik owns it"),
        "{answer}"
    );
    let citations = answer["citations"].as_array().unwrap();
    assert_eq!(citations.len(), 1, "{answer}");
    let cited = citations[0].as_str().unwrap();
    let described = json(&vilvona(
        state,
        &["describe", cited, "--session", session, "--json"],
    ));
    assert!(
        described
            .to_string()
            .contains("quarterly load test is OPS-71820"),
        "{cited}: {described}"
    );
}
