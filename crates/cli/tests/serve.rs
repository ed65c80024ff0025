//! `vilvona serve --stdio`: the JSON-RPC server as a client drives it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

mod common;
use common::tmpfs::Tmpfs;

struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    pending: Vec<Value>,
}

impl Client {
    fn start(state: &std::path::Path) -> Client {
        Client::start_logging(state, Stdio::null())
    }

    /// A server whose log (stderr) goes to `log`.
    fn start_logging(state: &std::path::Path, log: impl Into<Stdio>) -> Client {
        let mut child = Command::new(common::binary())
            .args(["--state-dir", state.to_str().unwrap(), "serve", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value =
                    serde_json::from_str(&line).expect("the server writes JSON lines only");
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Client {
            stdin: child.stdin.take(),
            child,
            lines,
            pending: Vec::new(),
        }
    }

    fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, id: u64, method: &str, params: Value) {
        self.send_raw(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
    }

    /// The next message matching `want`, keeping the others for later.
    fn wait(&mut self, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(index) = self.pending.iter().position(&want) {
            return self.pending.remove(index);
        }
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(value) if want(&value) => return value,
                Ok(value) => self.pending.push(value),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no reply; still pending: {:?}", self.pending)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the server exited; pending: {:?}", self.pending)
                }
            }
        }
    }

    /// The reply to `id`, or `None` if the server exited without one.
    fn reply_or_exit(&mut self, id: u64) -> Option<Value> {
        if let Some(index) = self
            .pending
            .iter()
            .position(|value| value["id"] == id && value.get("method").is_none())
        {
            return Some(self.pending.remove(index));
        }
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(value) if value["id"] == id && value.get("method").is_none() => {
                    return Some(value);
                }
                Ok(value) => self.pending.push(value),
                Err(RecvTimeoutError::Timeout) => panic!("no reply to {id}"),
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn reply(&mut self, id: u64) -> Value {
        self.wait(|value| value["id"] == id && value.get("method").is_none())
    }

    fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(id, method, params);
        let reply = self.reply(id);
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        reply["result"].clone()
    }
}

/// `base`'s fields with `extra`'s added (a call's session beside its own parameters).
fn merged(base: &Value, extra: Value) -> Value {
    let mut params = base.clone();
    params
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    params
}

fn user(text: &str, at: i64) -> Value {
    json!({"role": "user", "content": text, "timestamp": at})
}

/// `texts` holds each of `marks` once, in that order (a session's turns, each stored once).
fn each_once_in_order(texts: &str, marks: impl IntoIterator<Item = String>) {
    let mut after = 0;
    for mark in marks {
        assert_eq!(texts.matches(&mark).count(), 1, "{mark}: {texts}");
        let at = texts.find(&mark).unwrap();
        assert!(at >= after, "{mark} is out of order: {texts}");
        after = at;
    }
}

/// The session's whole context, as one text (the turns it holds, in order).
fn whole_context(client: &mut Client, id: u64, session: &Value) -> String {
    client
        .call(
            id,
            "assemble",
            merged(session, json!({"messages": [], "tokenBudget": 1_000_000})),
        )
        .to_string()
}

fn initialize(client: &mut Client, config: Value) -> Value {
    client.call(
        1,
        "initialize",
        json!({"engineId": "lossless", "config": config}),
    )
}

#[test]
fn every_method_answers() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    let info = initialize(&mut client, json!({"freshTailCount": 4}));
    assert_eq!(info["info"]["id"], "lossless");
    assert_eq!(
        info["transcriptSemantics"]["currentTurnFence"],
        "before-current-turn-entry-v1"
    );
    assert!(
        info["acceptedHostParams"]
            .as_array()
            .unwrap()
            .contains(&json!("sessionKey"))
    );
    assert_eq!(info["tools"].as_array().unwrap().len(), 4);

    let session = json!({"sessionId": "s1", "sessionKey": "agent:main:s1"});
    let with = |extra: Value| merged(&session, extra);
    assert_eq!(
        client.call(2, "bootstrap", with(json!({})))["bootstrapped"],
        false
    );
    assert_eq!(
        client.call(
            3,
            "ingest",
            with(json!({"message": user("Please remember: the vault code is VAULT-7788.", 1)}))
        )["ingested"],
        true
    );
    assert_eq!(
        client.call(
            4,
            "ingestBatch",
            with(json!({"messages": [user("second", 2), user("third", 3)]}))
        )["ingestedCount"],
        2
    );
    let assembled = client.call(
        5,
        "assemble",
        with(json!({"messages": [], "tokenBudget": 10000, "availableTools": ["vilvona_grep"]})),
    );
    assert_eq!(assembled["messages"].as_array().unwrap().len(), 3);
    assert!(
        assembled["systemPromptAddition"]
            .as_str()
            .unwrap()
            .contains("vilvona_grep")
    );
    client.call(6, "afterTurn", with(json!({"messages": [user("fourth", 4)], "prePromptMessageCount": 0, "tokenBudget": 10000})));
    let commit = with(json!({"advancementKey": "k1", "messages": [user("fifth", 5)]}));
    assert_eq!(
        client.call(7, "commitTurn", commit.clone())["status"],
        "committed"
    );
    assert_eq!(client.call(8, "commitTurn", commit)["status"], "duplicate");
    let compacted = client.call(
        9,
        "compact",
        with(json!({"tokenBudget": 10000, "force": true})),
    );
    assert_eq!(compacted["ok"], true);
    assert!(
        client
            .call(10, "maintain", with(json!({"reason": "turn"})))
            .get("changed")
            .is_some()
    );
    let spawn = client.call(11, "prepareSubagentSpawn", json!({"parentSessionKey": "agent:main:s1", "childSessionKey": "agent:main:s1:sub", "parentSessionId": "s1", "contextMode": "fork", "ttlMs": 60000}));
    let handle = spawn["rollbackHandle"].as_str().unwrap().to_owned();
    assert_eq!(
        client.call(12, "rollback", json!({"handle": handle})),
        json!({})
    );
    client.send(13, "rollback", json!({"handle": "rollback-unknown"}));
    assert_eq!(client.reply(13)["error"]["code"], -32602);
    assert_eq!(
        client.call(
            14,
            "onSubagentEnded",
            json!({"childSessionKey": "agent:main:s1:sub", "reason": "completed"})
        ),
        json!({})
    );
    let tools = client.call(15, "tools/list", json!({}));
    assert_eq!(tools["tools"][0]["name"], "vilvona_grep");
    let found = client.call(16, "tools/call", json!({"name": "vilvona_grep", "sessionId": "s1", "sessionKey": "agent:main:s1", "arguments": {"query": "vault code"}}));
    assert!(
        found["results"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("«VAULT-7788»"),
        "{found}"
    );
    client.send(
        17,
        "tools/call",
        json!({"name": "vilvona_grep", "sessionId": "s1", "arguments": {}}),
    );
    assert_eq!(client.reply(17)["error"]["code"], -32003);
    client.send(18, "nope", json!({}));
    assert_eq!(client.reply(18)["error"]["code"], -32601);
    client.send(19, "ingest", json!({"sessionId": "s1"}));
    let invalid = client.reply(19);
    assert_eq!(invalid["error"]["code"], -32602);
    assert!(
        invalid["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing field `message`")
    );
    assert_eq!(client.call(20, "dispose", json!({})), json!({}));
    drop(client.stdin.take());
    assert!(client.child.wait().unwrap().success());
}

#[test]
fn malformed_lines_get_an_error_and_the_server_keeps_serving() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    client.send_raw("{this is not json");
    let error = client.wait(|value| value["id"].is_null() && value.get("error").is_some());
    assert_eq!(error["error"]["code"], -32700);
    client.send(
        2,
        "ingest",
        json!({"sessionId": "s", "message": user("too early", 0)}),
    );
    assert_eq!(
        client.reply(2)["error"]["code"],
        -32002,
        "not initialized yet"
    );
    initialize(&mut client, json!({}));
    assert_eq!(
        client.call(
            3,
            "ingest",
            json!({"sessionId": "s", "message": user("hi", 1)})
        )["ingested"],
        true
    );
}

#[test]
fn a_line_that_is_not_utf8_gets_a_parse_error_and_the_server_keeps_serving() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    let stdin = client.stdin.as_mut().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"\xff\xfe\"}\n")
        .unwrap();
    stdin.flush().unwrap();
    // The id is readable: the answer carries it, so the client waiting on 5 gets it.
    let error = client.wait(|value| value["id"] == 5);
    assert_eq!(error["error"]["code"], -32700, "{error}");
    client
        .send_raw(r#"{"jsonrpc":"2.0","id":"req-7","method":"ingest","params":{"sessionId": u}}"#);
    let error = client.wait(|value| value["id"] == "req-7");
    assert_eq!(error["error"]["code"], -32700, "{error}");
    client.send_raw(r#"{"jsonrpc":"2.0","method":"ingest","params":{oops}}"#);
    // (Notifications carry no id either: `$/started` of a call.)
    let error = client.wait(|value| value["id"].is_null() && value.get("error").is_some());
    assert_eq!(error["error"]["code"], -32700, "{error}");
    assert_eq!(
        client.call(
            6,
            "ingest",
            json!({"sessionId": "u", "message": user("still here", 1)})
        )["ingested"],
        true
    );
}

#[test]
fn a_line_nested_too_deep_gets_a_parse_error_and_the_server_keeps_serving() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    client.send_raw(&format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ingest\",\"params\":{}1{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    ));
    let error = client.wait(|value| value["id"] == 5);
    assert_eq!(error["error"]["code"], -32700, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("recursion limit")
    );
    assert_eq!(
        client.call(
            6,
            "ingest",
            json!({"sessionId": "d", "message": user("fine", 1)})
        )["ingested"],
        true
    );
}

#[test]
fn calls_run_concurrently_and_each_session_keeps_its_order() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    let mut id = 100;
    for index in 0..25 {
        for session in 0..4 {
            id += 1;
            client.send(id, "ingest", json!({"sessionId": format!("s{session}"), "message": user(&format!("s{session} m{index}"), index)}));
        }
    }
    for reply in 101..=id {
        assert_eq!(client.reply(reply)["result"]["ingested"], true);
    }
    for session in 0..4 {
        let assembled = client.call(
            1_000 + session,
            "assemble",
            json!({"sessionId": format!("s{session}"), "messages": [], "tokenBudget": 100000}),
        );
        let texts: Vec<String> = assembled["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect();
        let expected: Vec<String> = (0..25)
            .map(|index| format!("s{session} m{index}"))
            .collect();
        assert_eq!(texts, expected);
    }
}

/// A compaction whose summarizer is the host's model: the server asks `llm.complete`.
fn host_model_session(client: &mut Client) {
    host_model_backlog(client, "h", 12);
}

/// Session `session` holding `count` messages, on a server whose summarizer is the host's.
fn host_model_backlog(client: &mut Client, session: &str, count: i64) {
    initialize(
        client,
        json!({"summarizer": {"kind": "host"}, "freshTailCount": 2, "leafChunkTokens": 400, "leafTargetTokens": 60, "condensedTargetTokens": 50}),
    );
    let messages: Vec<Value> = (0..count)
        .map(|i| {
            user(
                &format!("Message {i}: {}", "the queue drains the batch. ".repeat(10)),
                i,
            )
        })
        .collect();
    client.call(
        2,
        "ingestBatch",
        json!({"sessionId": session, "messages": messages}),
    );
}

/// Answers every `llm.complete` the server asks with `answer` (given the ask and how many came
/// before it) until the reply to request `id` comes: the reply, and how many were asked.
fn answer_asks_until(
    client: &mut Client,
    id: u64,
    answer: impl Fn(&Value, usize) -> Value,
) -> (Value, usize) {
    let mut asked = 0;
    loop {
        let message = client.wait(|value| value["method"] == "llm.complete" || value["id"] == id);
        if message["id"] == id {
            return (message, asked);
        }
        let result = answer(&message, asked);
        asked += 1;
        client.send_raw(
            &json!({"jsonrpc": "2.0", "id": message["id"], "result": result}).to_string(),
        );
    }
}

#[test]
fn the_summarizer_can_be_the_hosts_model_and_a_call_can_be_cancelled() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    host_model_session(&mut client);
    client.send(
        3,
        "compact",
        json!({"sessionId": "h", "tokenBudget": 2000, "force": true}),
    );
    let ask = client.wait(|value| value["method"] == "llm.complete");
    // The request names the call whose work asks: the client answers with that call's model.
    assert_eq!(ask["params"]["scope"], 3, "{ask}");
    assert!(
        ask["params"]["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("<source>")
    );
    client.send_raw(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"text": "HOST SUMMARY of the queue work"}}).to_string());
    // Later passes ask again; answer until the compaction replies.
    let (reply, _) = answer_asks_until(
        &mut client,
        3,
        |_, _| json!({"content": [{"type": "text", "text": "HOST SUMMARY again"}]}),
    );
    assert_eq!(reply["result"]["compacted"], true, "{reply}");
    let assembled = client.call(
        4,
        "assemble",
        json!({"sessionId": "h", "messages": [], "tokenBudget": 100000}),
    );
    assert!(
        assembled["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("HOST SUMMARY")
    );

    // A compaction waiting on the host is cancelled.
    client.call(5, "ingestBatch", json!({"sessionId": "h", "messages": (20..32).map(|i| user(&format!("Later {i}: {}", "more queue work here. ".repeat(10)), i)).collect::<Vec<_>>()}));
    client.send(
        6,
        "compact",
        json!({"sessionId": "h", "tokenBudget": 2000, "force": true}),
    );
    client.wait(|value| value["method"] == "llm.complete");
    client.send_raw(
        &json!({"jsonrpc": "2.0", "method": "$/cancel", "params": {"id": 6}}).to_string(),
    );
    let cancelled = client.reply(6);
    assert_eq!(cancelled["error"]["code"], -32800, "{cancelled}");
    // The session still answers.
    assert_eq!(
        client.call(
            7,
            "ingest",
            json!({"sessionId": "h", "message": user("after the cancel", 99)})
        )["ingested"],
        true
    );
}

#[test]
fn a_client_that_disconnects_mid_call_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    host_model_session(&mut client);
    client.send(
        3,
        "compact",
        json!({"sessionId": "h", "tokenBudget": 2000, "force": true}),
    );
    client.wait(|value| value["method"] == "llm.complete");
    // The client dies while the server waits on it.
    drop(client.stdin.take());
    let status = client.child.wait().unwrap();
    assert!(status.success());
    // Everything acknowledged is there (stored, and reachable: the integrity check follows
    // every summary down to its messages), whatever the cancelled compaction had published.
    let stats = std::process::Command::new(common::binary())
        .args([
            "--state-dir",
            dir.path().to_str().unwrap(),
            "stats",
            "--session",
            "h",
            "--json",
        ])
        .output()
        .unwrap();
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["messages"], 12, "{stats}");
    let doctor = std::process::Command::new(common::binary())
        .args([
            "--state-dir",
            dir.path().to_str().unwrap(),
            "doctor",
            "--json",
        ])
        .output()
        .unwrap();
    let doctor: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(doctor["checks"][0]["ok"], true, "{doctor}");
}

fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
}

fn stored_count(client: &mut Client, id: u64, session: &str) -> usize {
    client.call(
        id,
        "assemble",
        json!({"sessionId": session, "messages": [], "tokenBudget": 1_000_000}),
    )["messages"]
        .as_array()
        .unwrap()
        .len()
}

/// OpenClaw 2026.9 sends turns without entry ids: equal messages of two turns are two pairs;
/// the same advancement key again is a duplicate; a transcript of the same turns imports
/// nothing twice.
#[test]
fn message_identity_over_commit_turn_and_bootstrap() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    let turn = |key: &str| json!({"sessionId": "r", "advancementKey": key, "messages": [{"role": "user", "content": "continue"}, assistant("ok")]});
    assert_eq!(
        client.call(2, "commitTurn", turn("k1"))["status"],
        "committed"
    );
    assert_eq!(
        client.call(3, "commitTurn", turn("k2"))["status"],
        "committed"
    );
    assert_eq!(stored_count(&mut client, 4, "r"), 4);
    assert_eq!(
        client.call(5, "commitTurn", turn("k1"))["status"],
        "duplicate"
    );
    assert_eq!(stored_count(&mut client, 6, "r"), 4);
    let batch = json!({"sessionId": "b", "messages": [user("u", 1), assistant("a"), user("u", 1), assistant("a"), user("u", 1), assistant("a")]});
    assert_eq!(client.call(7, "ingestBatch", batch)["ingestedCount"], 6);

    // commitTurn first, then bootstrap of a transcript holding the same two messages.
    let first = [
        json!({"role": "user", "content": "deploy it", "timestamp": 10}),
        assistant("deployed"),
    ];
    client.call(
        8,
        "commitTurn",
        json!({"sessionId": "t", "advancementKey": "t1", "messages": first}),
    );
    let file = dir.path().join("t.jsonl");
    let mut lines = vec![json!({"type": "session", "version": 3, "id": "t", "timestamp": "2026-11-30T00:00:00Z", "cwd": "/"}).to_string()];
    let mut parent = Value::Null;
    for (index, message) in first.iter().enumerate() {
        let id = format!("e{index}");
        lines.push(json!({"type": "message", "id": id, "parentId": parent, "timestamp": "2026-11-30T00:00:01Z", "message": message}).to_string());
        parent = json!(id);
    }
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let booted = client.call(
        9,
        "bootstrap",
        json!({"sessionId": "t", "sessionFile": file.to_str().unwrap()}),
    );
    assert_eq!(booted["importedMessages"], 0, "{booted}");
    assert_eq!(stored_count(&mut client, 10, "t"), 2);
}

/// `commitTurn` carries no budget in OpenClaw 2026.9: the engine compacts against the one the
/// host last gave `assemble` for the session, even after a restart.
#[test]
fn commit_turn_compacts_against_the_budget_assemble_was_given() {
    let dir = TempDir::new().unwrap();
    let config = json!({"freshTailCount": 2});
    let mut client = Client::start(dir.path());
    initialize(&mut client, config.clone());
    client.call(
        2,
        "assemble",
        json!({"sessionId": "c", "messages": [], "tokenBudget": 3000}),
    );
    let filler = "the parser rewrites the queue and the batch drains slowly; ".repeat(6);
    let mut id = 10;
    for turn in 0..40 {
        id += 1;
        client.call(id, "commitTurn", json!({"sessionId": "c", "advancementKey": format!("c{turn}"), "messages": [user(&format!("turn {turn}: {filler}"), turn), assistant(&format!("done {turn}: {filler}"))]}));
        id += 1;
        // Only runtimeSettings this time: the same budget, by the other route.
        let assembled = client.call(
            id,
            "assemble",
            json!({"sessionId": "c", "messages": [], "runtimeSettings": {"limits": {"promptTokenBudget": 3000}}}),
        );
        // Compacted when over the trigger (the default contextThreshold of the budget).
        let tokens = assembled["estimatedTokens"].as_u64().unwrap();
        assert!(
            tokens <= 2850 && assembled["promptAuthority"] == "assembled",
            "turn {turn}: {tokens} tokens ({})",
            assembled["promptAuthority"]
        );
    }
    let summaries = client.call(
        900,
        "tools/call",
        json!({"name": "vilvona_grep", "sessionId": "c", "arguments": {"query": "parser", "scope": "summaries"}}),
    );
    assert!(
        !summaries["results"].as_array().unwrap().is_empty(),
        "commitTurn never compacted: {summaries}"
    );
    drop(client.stdin.take());
    assert!(client.child.wait().unwrap().success());

    // After a restart the remembered budget still applies, before any assemble.
    let mut again = Client::start(dir.path());
    initialize(&mut again, config);
    for turn in 40..50i64 {
        again.call(1_000 + turn as u64, "commitTurn", json!({"sessionId": "c", "advancementKey": format!("c{turn}"), "messages": [user(&format!("turn {turn}: {filler}"), turn), assistant(&format!("done {turn}: {filler}"))]}));
    }
    let tokens = again.call(
        2_000,
        "assemble",
        json!({"sessionId": "c", "messages": [], "tokenBudget": 3000}),
    )["estimatedTokens"]
        .as_u64()
        .unwrap();
    assert!(tokens <= 2250 + 400, "{tokens} tokens after 10 more turns");
}

/// Inside OpenClaw the server never substitutes another engine: a store that cannot open is a
/// JSON-RPC error on every call, and the next call tries again.
#[test]
fn an_engine_that_cannot_open_is_an_error_and_is_retried() {
    let dir = TempDir::new().unwrap();
    let store = dir.path().join("agents").join("main").join("lossless");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    // A file where the store's directory belongs.
    std::fs::write(&store, "not a directory").unwrap();
    let mut client = Client::start(dir.path());
    client.send(
        1,
        "initialize",
        json!({"engineId": "lossless", "config": {}}),
    );
    let failed = client.reply(1);
    assert_eq!(failed["error"]["code"], -32001, "{failed}");
    client.send(
        2,
        "ingest",
        json!({"sessionId": "x", "message": user("hi", 1)}),
    );
    let failed = client.reply(2);
    assert_eq!(failed["error"]["code"], -32001, "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lossless"),
        "{failed}"
    );
    std::fs::remove_file(&store).unwrap();
    assert_eq!(
        client.call(
            3,
            "ingest",
            json!({"sessionId": "x", "message": user("hi", 1)})
        )["ingested"],
        true
    );
}

/// A heartbeat turn is stored (and searchable) but never triggers compaction; the next real
/// turn does.
#[test]
fn heartbeat_turns_are_stored_but_never_compact() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({"freshTailCount": 2}));
    client.call(
        2,
        "assemble",
        json!({"sessionId": "h", "messages": [], "tokenBudget": 2000}),
    );
    let filler = "HEARTBEAT_OK and the status of the queue stays the same; ".repeat(8);
    for turn in 0..20i64 {
        client.call(10 + turn as u64, "commitTurn", json!({"sessionId": "h", "advancementKey": format!("h{turn}"), "isHeartbeat": true, "messages": [user(&format!("ping {turn}: {filler}"), turn), assistant(&filler)]}));
    }
    let before = client.call(
        100,
        "assemble",
        json!({"sessionId": "h", "messages": [], "tokenBudget": 1_000_000}),
    );
    assert_eq!(
        before["messages"].as_array().unwrap().len(),
        40,
        "nothing compacted"
    );
    client.call(101, "commitTurn", json!({"sessionId": "h", "advancementKey": "real", "messages": [user("a real question", 99), assistant("a real answer")]}));
    let after = client.call(
        102,
        "assemble",
        json!({"sessionId": "h", "messages": [], "tokenBudget": 2000}),
    );
    assert!(
        after["messages"].as_array().unwrap().len() < 42,
        "the real turn did not compact ({} tokens)",
        after["estimatedTokens"]
    );
}

/// `vilvona_expand_query` through `serve` with the host's model: the server asks
/// `llm.complete` (purpose `answer`) with the evidence, and the answer cites what it was shown.
#[test]
fn a_question_is_answered_by_the_hosts_model() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    host_model_session(&mut client);
    client.call(
        3,
        "ingest",
        json!({"sessionId": "h", "message": user("Please remember: the vault code is VAULT-7788 and Ines owns it.", 50)}),
    );
    client.send(
        4,
        "tools/call",
        json!({"name": "vilvona_expand_query", "sessionId": "h", "arguments": {"query": "vault code", "question": "Who owns the vault code?"}}),
    );
    let ask = client.wait(|value| value["method"] == "llm.complete");
    assert_eq!(ask["params"]["purpose"], "answer");
    let prompt = ask["params"]["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("Question: Who owns the vault code?"),
        "{prompt}"
    );
    let cited = prompt
        .lines()
        .find(|line| line.contains("VAULT-7788"))
        .and_then(|line| line.strip_prefix('['))
        .and_then(|line| line.split_whitespace().next())
        .unwrap()
        .to_owned();
    client.send_raw(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"text": format!("{{\"answer\": \"Ines owns it.\", \"citations\": [\"{cited}\"]}}")}}).to_string());
    let answered = client.reply(4);
    assert_eq!(answered["result"]["answer"], "Ines owns it.", "{answered}");
    assert_eq!(answered["result"]["citations"], json!([cited]));
    assert_eq!(answered["result"]["answeredBy"], "host-llm/v1");
}

/// A session a gateway stored through `serve` (no transcript in the state directory, whose own
/// configuration selects no engine): `sessions` lists it, doctor counts it, and the `/context`
/// views show it as the engine that stored it assembles it.
#[test]
fn the_command_line_sees_the_sessions_a_gateway_stored() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    let scope = json!({"sessionId": "gw-1", "sessionKey": "agent:main:openai-user:gw"});
    client.call(2, "assemble", json!({"sessionId": "gw-1", "sessionKey": "agent:main:openai-user:gw", "messages": [], "tokenBudget": 2000}));
    let filler = "the ledger shard rebalanced and the cursor moved on; ".repeat(8);
    for turn in 0..20 {
        let mut params = scope.clone();
        params["advancementKey"] = json!(format!("k{turn}"));
        params["messages"] = json!([
            user(&format!("turn {turn}: {filler}"), turn),
            assistant(&format!("done {turn}: {filler}"))
        ]);
        client.call(10 + turn as u64, "commitTurn", params);
    }
    drop(client.stdin.take());
    assert!(client.child.wait().unwrap().success());
    let run = |args: &[&str]| {
        std::process::Command::new(common::binary())
            .arg("--state-dir")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    let sessions = run(&["sessions", "--json"]);
    assert!(
        sessions.status.success(),
        "{}",
        String::from_utf8_lossy(&sessions.stderr)
    );
    let sessions: Value = serde_json::from_slice(&sessions.stdout).unwrap();
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{sessions}");
    assert_eq!(sessions[0]["id"], "gw-1");
    assert_eq!(sessions[0]["key"], "agent:main:openai-user:gw");
    assert_eq!(sessions[0]["messages"], 40);
    let listed = run(&["context", "list", "--session", "gw-1"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(text.contains("Summaries (depth"), "{text}");
    let report = run(&["context", "json", "--session", "gw-1"]);
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["report"]["engine"], "lossless", "{report}");
    let doctor: Value = serde_json::from_slice(&run(&["doctor", "--json"]).stdout).unwrap();
    assert_eq!(doctor["sessions"], 1, "{doctor}");
}

/// The recall index deleted under a running server while turns go on: every turn succeeds,
/// search finds everything meanwhile (from the database), the index is rebuilt in place
/// without a restart, and the log says so in a few lines (it once wrote millions). Then bytes
/// overwritten in a segment: doctor sees them (it once said "healthy") and `doctor --fix` has
/// the running server rebuild the index.
#[test]
fn an_index_deleted_under_a_running_server_is_rebuilt_with_a_bounded_log() {
    let dir = TempDir::new().unwrap();
    let log_path = dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut client = Client::start_logging(dir.path(), log);
    initialize(&mut client, json!({}));
    let mut id = 10;
    let mut turn = |client: &mut Client, n: i64| {
        id += 1;
        let messages = json!([
            user(&format!("turn {n}: the kestrel{n} shard moved"), n),
            assistant(&format!("done {n}"))
        ]);
        let result = client.call(
            id,
            "commitTurn",
            json!({"sessionId": "damaged", "sessionKey": "agent:main:damaged", "advancementKey": format!("k{n}"), "messages": messages}),
        );
        assert_eq!(result["status"], "committed", "turn {n}");
    };
    for n in 0..10 {
        turn(&mut client, n);
    }
    let index = dir.path().join("agents/main/lossless/index");
    // Doctor's verdict on the store (another process, read-only): its integrity check.
    let doctor = |dir: &std::path::Path| -> (bool, String) {
        let output = Command::new(common::binary())
            .args(["--state-dir", dir.to_str().unwrap(), "doctor", "--json"])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        let store = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|check| check["name"] == "store integrity")
            .cloned()
            .unwrap_or_default();
        (store["ok"] == true, store.to_string())
    };
    // The index exists (committed a moment after the turns), then is deleted whole.
    let mut waited = 0;
    while !index.join("meta.json").exists() && waited < 100 {
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    }
    assert!(
        index.join("meta.json").exists(),
        "the index was never written"
    );
    std::fs::remove_dir_all(&index).unwrap();
    for n in 10..40 {
        turn(&mut client, n);
        std::thread::sleep(Duration::from_millis(20));
    }
    // Search finds old and new turns meanwhile.
    for n in [3, 35] {
        let hits = client.call(
            100 + n as u64,
            "tools/call",
            json!({"name": "vilvona_grep", "arguments": {"query": format!("kestrel{n}")}, "sessionId": "damaged", "sessionKey": "agent:main:damaged"}),
        );
        assert!(hits.to_string().contains(&format!("kestrel{n}")), "{hits}");
    }
    // Rebuilt in place while the server runs: doctor (another process) finds it healthy.
    let mut healthy = false;
    for _ in 0..150 {
        if index.join("meta.json").exists() && doctor(dir.path()).0 {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        healthy,
        "the index was not rebuilt: {}",
        doctor(dir.path()).1
    );
    // The rebuilt index holds every turn (searched again, now through the index).
    let hits = client.call(
        200,
        "tools/call",
        json!({"name": "vilvona_grep", "arguments": {"query": "kestrel12"}, "sessionId": "damaged", "sessionKey": "agent:main:damaged"}),
    );
    assert!(hits.to_string().contains("kestrel12"), "{hits}");

    // Bytes overwritten in a live segment's fast fields (its vectors and keys): doctor's
    // checksums see it, and `doctor --fix` has the running server rebuild the index. First the
    // server finishes its vectors, so no later commit or merge replaces the garbled segment.
    let mut settled = false;
    for _ in 0..150 {
        let (ok, detail) = doctor(dir.path());
        if ok && !detail.contains("wait for") {
            settled = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(settled, "vectors never caught up: {}", doctor(dir.path()).1);
    let meta: Value =
        serde_json::from_slice(&std::fs::read(index.join("meta.json")).unwrap()).unwrap();
    let fast = meta["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|segment| {
            let id = segment["segment_id"].as_str().unwrap().replace('-', "");
            index.join(format!("{id}.fast"))
        })
        .find(|path| path.exists())
        .expect("a live segment with fast fields");
    let mut bytes = std::fs::read(&fast).unwrap();
    // Inside the file, its footer left whole: only the checksum can tell.
    let (from, count) = (bytes.len() / 4, (bytes.len() / 2).min(4096));
    for (offset, byte) in bytes[from..from + count].iter_mut().enumerate() {
        *byte = !*byte ^ (offset as u8);
    }
    std::fs::write(&fast, bytes).unwrap();
    let (ok, detail) = doctor(dir.path());
    assert!(
        !ok && detail.contains("checksum"),
        "doctor missed the damage: {detail}"
    );
    let fixed = Command::new(common::binary())
        .args([
            "--state-dir",
            dir.path().to_str().unwrap(),
            "doctor",
            "--fix",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&fixed.stderr);
    assert!(said.contains("asked to rebuild"), "{said}");
    let mut healed = false;
    for n in 40..190 {
        // Turns go on meanwhile.
        if n % 10 == 0 {
            turn(&mut client, n);
        }
        if doctor(dir.path()).0 {
            healed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(healed, "not healed: {}", doctor(dir.path()).1);
    let hits = client.call(
        201,
        "tools/call",
        json!({"name": "vilvona_grep", "arguments": {"query": "kestrel36"}, "sessionId": "damaged", "sessionKey": "agent:main:damaged"}),
    );
    assert!(hits.to_string().contains("kestrel36"), "{hits}");

    drop(client.stdin.take());
    client.child.wait().unwrap();
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines = text.lines().count();
    assert!(
        lines < 100,
        "{lines} log lines:\n{}",
        text.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}

/// A store that lost its newest turns (its write-ahead log lost with a crash; here, the
/// engine's directory restored from a copy taken three turns earlier) is behind the host's
/// history. The first assembly after the restart brings the lost turns back from the history
/// the host sends, each once, in order; what the store already held is not stored twice.
#[test]
fn turns_the_store_lost_come_back_from_the_hosts_history() {
    let dir = TempDir::new().unwrap();
    let session = json!({"sessionId": "healed", "sessionKey": "agent:main:healed"});
    let with = |extra: Value| merged(&session, extra);
    let mut history: Vec<Value> = Vec::new();
    let commit = |client: &mut Client, n: i64, history: &mut Vec<Value>| {
        let messages = vec![
            user(&format!("turn {n}: the heron{n} key is HR-{n}"), n),
            assistant(&format!("noted {n}")),
        ];
        let result = client.call(
            10 + n as u64,
            "commitTurn",
            with(json!({"advancementKey": format!("k{n}"), "messages": messages})),
        );
        assert_eq!(result["status"], "committed");
        history.extend(messages);
    };
    let stop = |mut client: Client| {
        drop(client.stdin.take());
        assert!(client.child.wait().unwrap().success());
    };
    let engine_dir = dir.path().join("agents/main/lossless");
    let copy = dir.path().join("copy");

    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    for n in 0..3 {
        commit(&mut client, n, &mut history);
    }
    stop(client);
    // The copy the store will fall back to: three turns.
    copy_dir(&engine_dir, &copy);
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    for n in 3..6 {
        commit(&mut client, n, &mut history);
    }
    stop(client);
    std::fs::remove_dir_all(&engine_dir).unwrap();
    copy_dir(&copy, &engine_dir);

    // Restarted: the host (its plugin too, new with the process) sends its whole history.
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    assert_eq!(
        stored_count(&mut client, 50, "healed"),
        6,
        "three turns held"
    );
    let assembled = client.call(
        51,
        "assemble",
        with(json!({"messages": history, "tokenBudget": 1_000_000})),
    );
    // Each once, the lost turns after the kept ones.
    each_once_in_order(
        &assembled["messages"].to_string(),
        (0..6).map(|n| format!("heron{n} key")),
    );
    assert_eq!(stored_count(&mut client, 52, "healed"), 12);
    // Searchable, and stored once: a second assembly with the same history adds nothing, and
    // the next turn follows them.
    let hits = client.call(
        53,
        "tools/call",
        with(json!({"name": "vilvona_grep", "arguments": {"query": "heron4"}})),
    );
    assert!(hits.to_string().contains("HR-4"), "{hits}");
    client.call(
        54,
        "assemble",
        with(json!({"messages": history, "tokenBudget": 1_000_000})),
    );
    commit(&mut client, 6, &mut history);
    assert_eq!(stored_count(&mut client, 55, "healed"), 14);
    stop(client);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The state directory removed under a running server: the database it has open is gone, so
/// what it would store from then on could never be read again. It acknowledges no turn more
/// (each commit fails, naming the file) and logs a few lines, not a flood; restarted, it opens
/// a new database there, and the first assembly brings the whole history back from the host.
#[test]
fn a_state_directory_removed_under_a_running_server_acknowledges_nothing_it_cannot_keep() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let log_path = dir.path().join("serve.log");
    let session = json!({"sessionId": "gone", "sessionKey": "agent:main:gone"});
    let with = |extra: Value| merged(&session, extra);
    let mut history: Vec<Value> = Vec::new();
    let commit = |client: &mut Client, n: i64, history: &mut Vec<Value>| -> Option<Value> {
        let messages = vec![
            user(&format!("turn {n}: the plover{n} code is PL-{n}"), n),
            assistant(&format!("noted {n}")),
        ];
        client.send(
            10 + n as u64,
            "commitTurn",
            with(json!({"advancementKey": format!("k{n}"), "messages": messages.clone()})),
        );
        let reply = client.reply_or_exit(10 + n as u64)?;
        if reply.get("error").is_none() {
            history.extend(messages);
        }
        Some(reply)
    };
    let mut client = Client::start_logging(&state, std::fs::File::create(&log_path).unwrap());
    initialize(&mut client, json!({}));
    for n in 0..3 {
        let reply = commit(&mut client, n, &mut history).unwrap();
        assert_eq!(reply["result"]["status"], "committed", "{reply}");
    }
    // The server's index may be writing a commit into it meanwhile (its vectors are made
    // beside the turns): removed again until nothing is left, as `rm -rf` retried would.
    let mut removed = std::fs::remove_dir_all(&state);
    for _ in 0..50 {
        match &removed {
            Err(error) if error.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                removed = std::fs::remove_dir_all(&state);
            }
            _ => break,
        }
    }
    removed.unwrap();
    // The first turn after it is refused as a passing failure (-32006: a new process will
    // store it), and the server stops so that its client starts one.
    let reply = commit(&mut client, 3, &mut history).unwrap();
    assert_eq!(reply["error"]["code"], -32006, "{reply}");
    let error = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(
        error.contains("vilvona.db was removed or replaced"),
        "turn 3 was acknowledged into a removed database: {reply}"
    );
    let status = client.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let lines = std::fs::read_to_string(&log_path).unwrap().lines().count();
    assert!(lines < 20, "{lines} log lines");

    // Restarted: a new database; the host's history (the three acknowledged turns, and the
    // five it still holds queued or had yet to send) comes back.
    let mut client = Client::start(&state);
    initialize(&mut client, json!({}));
    client.call(
        50,
        "assemble",
        with(json!({"messages": history, "tokenBudget": 1_000_000})),
    );
    for n in 3..8 {
        let reply = commit(&mut client, n, &mut history).unwrap();
        assert_eq!(reply["result"]["status"], "committed", "{reply}");
    }
    each_once_in_order(
        &whole_context(&mut client, 51, &session),
        (0..8).map(|n| format!("plover{n} code")),
    );
    drop(client.stdin.take());
    client.child.wait().unwrap();
}

/// OpenClaw's agent database as a host keeps it (the tables and columns the engine reads):
/// `messages` become the session's active transcript, a model-change event first (no message
/// position), every third message compressed as OpenClaw compresses larger events.
fn host_record(path: &std::path::Path, session: &str, messages: &[Value]) {
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS transcript_events (session_id TEXT NOT NULL, seq INTEGER NOT NULL,
               event_json TEXT, created_at INTEGER NOT NULL, event_zstd BLOB, PRIMARY KEY (session_id, seq));
             CREATE TABLE IF NOT EXISTS session_transcript_active_events (session_id TEXT NOT NULL,
               active_position INTEGER NOT NULL, event_seq INTEGER NOT NULL, message_position INTEGER,
               PRIMARY KEY (session_id, active_position));
             DELETE FROM transcript_events; DELETE FROM session_transcript_active_events;",
        )
        .unwrap();
    let mut events = vec![json!({"type": "model_change", "provider": "mock"})];
    events.extend(
        messages
            .iter()
            .map(|message| json!({"type": "message", "message": message})),
    );
    let mut position = 0;
    for (seq, event) in events.iter().enumerate() {
        let text = event.to_string();
        let (json, frame) = if seq % 3 == 2 {
            (None, Some(zstd::encode_all(text.as_bytes(), 3).unwrap()))
        } else {
            (Some(text), None)
        };
        connection
            .execute(
                "INSERT INTO transcript_events VALUES (?1, ?2, ?3, 0, ?4)",
                rusqlite::params![session, seq as i64 + 1, json, frame],
            )
            .unwrap();
        let message_position = (event["type"] == "message").then(|| {
            position += 1;
            position - 1
        });
        connection
            .execute(
                "INSERT INTO session_transcript_active_events VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![session, seq as i64, seq as i64 + 1, message_position],
            )
            .unwrap();
    }
}

/// The write-ahead log truncated under a running server (a careless cleanup, a restore that
/// copied only the database file): the turns it held are gone from the database, and SQLite,
/// which still believes in them, would write later turns after a hole that the next open
/// discards. Nothing is acknowledged into such a log, the server exits so that a new one opens
/// the database anew, and what was lost comes back from the host's record — OpenClaw sends the
/// turn it holds queued before any assembly, so the turn itself brings it: its admission
/// anchor names OpenClaw's agent database.
#[test]
fn a_write_ahead_log_truncated_under_a_running_server_loses_no_acknowledged_turn() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let log_path = dir.path().join("serve.log");
    let record = dir.path().join("openclaw-agent.sqlite");
    let wal = state.join("agents/main/lossless/vilvona.db-wal");
    let session = json!({"sessionId": "wal", "sessionKey": "agent:main:wal"});
    let with = |extra: Value| merged(&session, extra);
    let turn = |n: i64| {
        vec![
            user(&format!("turn {n}: the sandpiper{n} code is SP-{n}"), n),
            assistant(&format!("noted {n}")),
        ]
    };
    // The host records every turn it runs before it commits it; it places turn n at 2n.
    let commit = |client: &mut Client, id: u64, n: i64| -> Option<Value> {
        let ran: Vec<Value> = (0..=n).flat_map(turn).collect();
        host_record(&record, "wal", &ran);
        client.send(
            id,
            "commitTurn",
            with(json!({
                "advancementKey": format!("k{n}"),
                "messages": turn(n),
                "admission": {
                    "sessionId": "wal",
                    "storePath": record.to_str().unwrap(),
                    "activeMessagePosition": 2 * n,
                },
            })),
        );
        client.reply_or_exit(id)
    };
    let mut client = Client::start_logging(&state, std::fs::File::create(&log_path).unwrap());
    initialize(&mut client, json!({}));
    for n in 0..3 {
        let reply = commit(&mut client, 10 + n as u64, n).unwrap();
        assert_eq!(reply["result"]["status"], "committed", "{reply}");
    }
    let held = std::fs::metadata(&wal).unwrap().len();
    assert!(
        held > 0,
        "the turns are still in the log (else this tests nothing)"
    );
    // Another process has the database open too (a reader, here this test), and shares
    // SQLite's view of the log with the servers.
    let reader = rusqlite::Connection::open(state.join("agents/main/lossless/vilvona.db")).unwrap();
    reader
        .set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
    reader
        .query_row("SELECT count(*) FROM messages", [], |row| {
            row.get::<_, i64>(0)
        })
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(0)
        .unwrap();
    // The next turn is refused as a passing failure (the host keeps it), naming the log, and
    // the server exits by itself.
    let reply = commit(&mut client, 13, 3).unwrap();
    assert_eq!(reply["error"]["code"], -32006, "{reply}");
    let error = reply["error"]["message"].as_str().unwrap();
    assert!(error.contains("vilvona.db-wal was truncated"), "{reply}");
    // A new server, started at once as the plugin does (the old one may still be exiting):
    // the database opens (the cut log discarded, not folded in). The host sends its queued
    // turn first, then the turns it runs; a commit sent twice is stored once.
    // The reader lets go a second later: until then the new server's open waits.
    let let_go = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        drop(reader);
    });
    let mut old = client;
    let mut client = Client::start(&state);
    initialize(&mut client, json!({}));
    let_go.join().unwrap();
    let status = old.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.lines().count() < 20, "{log}");
    for n in 3..8 {
        let reply = commit(&mut client, 40 + n as u64, n).unwrap();
        assert_eq!(reply["result"]["status"], "committed", "{reply}");
    }
    let reply = commit(&mut client, 49, 7).unwrap();
    assert_eq!(reply["result"]["status"], "duplicate", "{reply}");
    each_once_in_order(
        &whole_context(&mut client, 51, &session),
        (0..8).map(|n| format!("sandpiper{n} code")),
    );
    drop(client.stdin.take());
    client.child.wait().unwrap();
}

/// The disk fills up under a running server, turns continuing: no turn is acknowledged that is
/// not stored, each refused turn is a passing failure (never "broken", which OpenClaw
/// quarantines for) in one line, the log stays bounded, and once there is room again the turns
/// the host sends again are stored: every turn once, in order, also after a restart.
#[test]
#[ignore = "mounts an 8 MiB tmpfs (needs root): .ci/run runs it"]
fn a_disk_that_fills_under_a_running_server_acknowledges_nothing_it_cannot_keep() {
    let dir = TempDir::new().unwrap();
    let mount = dir.path().join("small");
    let _tmpfs = Tmpfs::mount(&mount, "8m")
        .unwrap_or_else(|reason| panic!("this test mounts a tmpfs and could not: {reason}"));
    let state = mount.join("state");
    let log_path = dir.path().join("serve.log");
    let session = json!({"sessionId": "full", "sessionKey": "agent:main:full"});
    let with = |extra: Value| merged(&session, extra);
    // Each turn carries 20 KiB of tool output, so that a full disk is reached in a few turns.
    let filler = "lorem ipsum dolor sit amet ".repeat(800);
    let commit = |client: &mut Client, id: u64, n: i64| -> Value {
        let messages = vec![
            user(&format!("turn {n}: the avocet{n} code is AV-{n}"), n),
            assistant(&format!("noted {n}: {filler}")),
        ];
        client.send(
            id,
            "commitTurn",
            with(json!({"advancementKey": format!("k{n}"), "messages": messages})),
        );
        client.reply(id)
    };
    let mut client = Client::start_logging(&state, std::fs::File::create(&log_path).unwrap());
    initialize(&mut client, json!({}));
    for n in 0..3 {
        let reply = commit(&mut client, 10 + n as u64, n);
        assert_eq!(reply["result"]["status"], "committed", "{reply}");
    }
    // Fill what is left of the disk.
    let ballast = mount.join("ballast");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&ballast).unwrap();
        let block = vec![0u8; 64 * 1024];
        while file
            .write_all(&block)
            .and_then(|()| file.sync_all())
            .is_ok()
        {}
    }
    let mut refused = Vec::new();
    for n in 3..8 {
        let reply = commit(&mut client, 20 + n as u64, n);
        if let Some(error) = reply.get("error") {
            assert_eq!(
                error["code"], -32006,
                "a full disk is a passing failure: {reply}"
            );
            let message = error["message"].as_str().unwrap();
            assert!(!message.contains('\n'), "one line: {message}");
            assert!(
                message.contains("full") || message.contains("No space"),
                "{message}"
            );
            refused.push(n);
        } else {
            assert_eq!(reply["result"]["status"], "committed", "{reply}");
        }
    }
    assert!(
        !refused.is_empty(),
        "8 MiB held every turn: this tested no full disk"
    );
    // Room again: the host sends the refused turns again.
    std::fs::remove_file(&ballast).unwrap();
    for &n in &refused {
        let reply = commit(&mut client, 40 + n as u64, n);
        assert_eq!(reply["result"]["status"], "committed", "{reply}");
    }
    drop(client.stdin.take());
    client.child.wait().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.lines().count() < 40, "{log}");

    let mut client = Client::start(&state);
    initialize(&mut client, json!({}));
    each_once_in_order(
        &whole_context(&mut client, 51, &session),
        (0..8).map(|n| format!("avocet{n} code")),
    );
    drop(client.stdin.take());
    client.child.wait().unwrap();
}

/// A key is a pointer to its newest session: after OpenClaw's `/new` (a new session id under
/// the same key) every command given the key acts on the new session, and the old one stays
/// reachable by its id. Before the fix `stats --session KEY` answered the oldest.
#[test]
fn a_key_means_its_newest_session() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    let key = "agent:main:main";
    for (id, (session, turns)) in [("yesterday", 3), ("today", 1)].into_iter().enumerate() {
        for turn in 0..turns {
            client.call(
                10 * id as u64 + turn,
                "commitTurn",
                json!({"sessionId": session, "sessionKey": key,
                       "advancementKey": format!("{session}-{turn}"),
                       "messages": [user(&format!("{session} turn {turn}"), turn as i64), assistant("ok")]}),
            );
        }
    }
    drop(client.stdin.take());
    assert!(client.child.wait().unwrap().success());
    let stats = |session: &str| -> Value {
        let output = std::process::Command::new(common::binary())
            .arg("--state-dir")
            .arg(dir.path())
            .args(["stats", "--session", session, "--json"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    };
    assert_eq!(stats(key)["messages"], 2, "the key names today's session");
    assert_eq!(stats("yesterday")["messages"], 6, "the old one by its id");
}

/// OpenClaw's `/new` and `/reset` keep the session id and start a new window of its
/// transcript. Told so (`onSessionReset`, from the plugin's `before_reset` hook), the engine
/// shows nothing of before in the session's context: its earlier history stays stored under
/// another id, listed beside the key, and recallable; the host's places, which go on past the
/// reset, bring nothing of before back from its record; a reset told twice is harmless. Before,
/// the model kept seeing the earlier window after `/new`, and the store took the host's
/// record of it for messages it had lost.
#[test]
fn a_session_begun_anew_under_the_same_id_shows_nothing_of_before() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let record = dir.path().join("openclaw-agent.sqlite");
    let session = json!({"sessionId": "same", "sessionKey": "agent:main:same"});
    let turn = |n: i64| {
        vec![
            user(&format!("turn {n}: the godwit{n} code is GW-{n}"), n),
            assistant(&format!("noted {n}")),
        ]
    };
    // The host's record holds every turn it ran, before and after the reset; it places turn n
    // at 2n.
    let commit = |client: &mut Client, id: u64, n: i64| {
        let ran: Vec<Value> = (0..=n).flat_map(turn).collect();
        host_record(&record, "same", &ran);
        let result = client.call(
            id,
            "commitTurn",
            merged(
                &session,
                json!({
                    "advancementKey": format!("k{n}"),
                    "messages": turn(n),
                    "admission": {"sessionId": "same", "storePath": record.to_str().unwrap(),
                                  "activeMessagePosition": 2 * n},
                }),
            ),
        );
        assert_eq!(result["status"], "committed", "{result}");
    };
    let mut client = Client::start(&state);
    initialize(&mut client, json!({}));
    for n in 0..3 {
        commit(&mut client, 10 + n as u64, n);
    }
    for id in [20, 21] {
        client.call(
            id,
            "onSessionReset",
            merged(&session, json!({"reason": "new"})),
        );
    }
    // The host's first run after the reset shows its new window.
    client.call(
        22,
        "assemble",
        merged(
            &session,
            json!({"messages": [turn(3)[0]], "tokenBudget": 100_000}),
        ),
    );
    for n in 3..6 {
        commit(&mut client, 30 + n as u64, n);
    }
    let context = whole_context(&mut client, 40, &session);
    each_once_in_order(&context, (3..6).map(|n| format!("godwit{n} code")));
    for n in 0..3 {
        assert!(
            !context.contains(&format!("godwit{n} code")),
            "turn {n} came before the reset: {context}"
        );
    }
    let grep = client.call(
        41,
        "tools/call",
        merged(
            &session,
            json!({"name": "vilvona_grep", "arguments": {"query": "godwit1"}}),
        ),
    );
    assert!(
        grep.to_string().contains("GW-1"),
        "recall reaches the earlier history: {grep}"
    );
    drop(client.stdin.take());
    assert!(client.child.wait().unwrap().success());
    let sessions = std::process::Command::new(common::binary())
        .arg("--state-dir")
        .arg(&state)
        .args(["sessions", "--json"])
        .output()
        .unwrap();
    let sessions: Value = serde_json::from_slice(&sessions.stdout).unwrap();
    let listed: Vec<(String, u64)> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["messages"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed.len(), 2, "{sessions}");
    assert!(
        listed
            .iter()
            .any(|(id, messages)| id.starts_with("same@new-") && *messages == 6),
        "the earlier history under its own id: {sessions}"
    );
    assert!(listed.contains(&("same".to_owned(), 6)), "{sessions}");
}

/// Any string JavaScript can hold is a message: a user turn whose text ends in an emoji cut in
/// half (a lone UTF-16 surrogate, which `JSON.stringify` writes as `\ud83d`: valid JSON text)
/// is stored and recalled with U+FFFD in the surrogate's place, never a parse error of the
/// call (OpenClaw fell back to legacy for the rest of the session on one). A well-formed pair
/// escaped the same way stays the emoji. A NUL and a string of 10 MB are messages too.
#[test]
fn a_string_cut_mid_emoji_is_a_message() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    initialize(&mut client, json!({}));
    let lines = [
        r#"{"jsonrpc":"2.0","id":2,"method":"ingest","params":{"sessionId":"s","message":{"role":"user","content":"launch \ud83d","timestamp":1}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"ingest","params":{"sessionId":"s","message":{"role":"user","content":"\udc80 tail and \\ud83d stays text","timestamp":2}}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"ingest","params":{"sessionId":"s","message":{"role":"user","content":"paired \ud83d\ude80 rocket","timestamp":3}}}"#,
    ];
    for (index, line) in lines.iter().enumerate() {
        client.send_raw(line);
        let reply = client.reply(2 + index as u64);
        assert_eq!(reply["result"]["ingested"], true, "{line}: {reply}");
    }
    let context = client.call(
        5,
        "assemble",
        json!({"sessionId": "s", "messages": [], "tokenBudget": 4000}),
    );
    let texts: Vec<&str> = context["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        [
            "launch \u{fffd}",
            "\u{fffd} tail and \\ud83d stays text",
            "paired \u{1f680} rocket"
        ]
    );
    // A NUL, and a string of 10 MB: stored, and recalled.
    client.send_raw(
        r#"{"jsonrpc":"2.0","id":6,"method":"ingest","params":{"sessionId":"s","message":{"role":"user","content":"nul \u0000 inside the tern note","timestamp":4}}}"#,
    );
    assert_eq!(client.reply(6)["result"]["ingested"], true);
    let long = format!(
        "{} the zebrafinch code is ZF-9 {}",
        "filler words ".repeat(400_000),
        "filler words ".repeat(400_000)
    );
    assert!(long.len() > 10_000_000);
    let ingested = client.call(
        7,
        "ingest",
        json!({"sessionId": "s", "message": {"role": "user", "content": long, "timestamp": 5}}),
    );
    assert_eq!(ingested["ingested"], true, "{ingested}");
    let context = client
        .call(
            8,
            "assemble",
            json!({"sessionId": "s", "messages": [], "tokenBudget": 4000}),
        )
        .to_string();
    assert!(context.contains(r"nul \u0000 inside"), "{context:.400}");
    for (id, query) in [(9, "nul inside"), (10, "zebrafinch")] {
        let found = client.call(
            id,
            "tools/call",
            json!({"sessionId": "s", "name": "vilvona_grep", "arguments": {"query": query}}),
        );
        assert!(
            found
                .to_string()
                .contains(if id == 9 { "nul" } else { "ZF-9" }),
            "{query}: {found:.400}"
        );
    }
}

/// The panel's server (`vilvona ui`), started on `state`: its process, address and token.
fn start_ui(state: &std::path::Path) -> (Child, String, String) {
    let mut child = Command::new(common::binary())
        .args(["--state-dir", state.to_str().unwrap(), "ui", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first.trim().strip_prefix("vilvona ui: http://").unwrap();
    let (address, token) = url.split_once("/#token=").unwrap();
    (child, address.to_owned(), token.to_owned())
}

/// One view of the panel's server: its HTTP status and its JSON.
fn ui_view(address: &str, token: &str, view: &Value) -> (u16, Value) {
    use std::io::Read as _;
    let body = view.to_string();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "POST /api/view HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let json = answer.split_once("\r\n\r\n").unwrap().1;
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// The log cut under a running server while other processes read the store. The panel's
/// server keeps nothing open between its reads, so the new server opens the store at once,
/// and the panel reads the healed store by itself (it once answered "-wal was truncated" to
/// every view from then on, and held the new server's open until it failed with -32001: a
/// quarantine). A reader that never lets go keeps the new server from opening the store:
/// that is answered as transient (-32006), never as a broken engine, and the open succeeds
/// once it lets go.
#[test]
fn a_cut_log_heals_with_readers_present() {
    let dir = TempDir::new().unwrap();
    let state = dir.path().join("state");
    let database = state.join("agents/main/lossless/vilvona.db");
    let wal = state.join("agents/main/lossless/vilvona.db-wal");
    let session = json!({"sessionId": "cut", "sessionKey": "agent:main:cut"});
    let commit = |client: &mut Client, id: u64, n: i64| -> Option<Value> {
        client.send(
            id,
            "commitTurn",
            merged(
                &session,
                json!({"advancementKey": format!("k{n}"),
                       "messages": [user(&format!("turn {n}: the plover{n} code is PL-{n}"), n), assistant("noted")]}),
            ),
        );
        client.reply_or_exit(id)
    };
    let cut = || {
        assert!(
            std::fs::metadata(&wal).unwrap().len() > 0,
            "the log holds the turns"
        );
        std::fs::OpenOptions::new()
            .write(true)
            .open(&wal)
            .unwrap()
            .set_len(0)
            .unwrap();
    };
    let mut client = Client::start(&state);
    initialize(&mut client, json!({}));
    for n in 0..3 {
        assert_eq!(
            commit(&mut client, 10 + n as u64, n).unwrap()["result"]["status"],
            "committed"
        );
    }
    let (mut ui, address, token) = start_ui(&state);
    let context = json!({"view": "context", "session": "agent:main:cut"});
    assert_eq!(ui_view(&address, &token, &context).0, 200);
    cut();
    let reply = commit(&mut client, 13, 3).unwrap();
    assert_eq!(reply["error"]["code"], -32006, "{reply}");
    assert!(client.child.wait().unwrap().success());
    // The panel's server holds nothing: the new server opens the store at once.
    let mut client = Client::start(&state);
    initialize(&mut client, json!({}));
    for n in 3..5 {
        assert_eq!(
            commit(&mut client, 20 + n as u64, n).unwrap()["result"]["status"],
            "committed"
        );
    }
    let grep =
        json!({"view": "grep", "session": "agent:main:cut", "query": "plover4", "mode": "phrase"});
    let (status, view) = ui_view(&address, &token, &grep);
    assert_eq!(status, 200, "{view}");
    assert!(
        view.to_string().contains("PL-4"),
        "the panel reads the healed store: {view}"
    );

    // A reader that holds the database and never lets go by itself.
    let reader = rusqlite::Connection::open(&database).unwrap();
    reader
        .set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
    reader
        .query_row("SELECT count(*) FROM messages", [], |row| {
            row.get::<_, i64>(0)
        })
        .unwrap();
    cut();
    let reply = commit(&mut client, 30, 5).unwrap();
    assert_eq!(reply["error"]["code"], -32006, "{reply}");
    assert!(client.child.wait().unwrap().success());
    let mut client = Client::start(&state);
    client.send(
        2,
        "initialize",
        json!({"engineId": "lossless", "config": {}}),
    );
    let refused = client.reply(2);
    assert_eq!(
        refused["error"]["code"], -32006,
        "passing, not broken: {refused}"
    );
    drop(reader);
    initialize(&mut client, json!({}));
    assert_eq!(
        commit(&mut client, 31, 5).unwrap()["result"]["status"],
        "committed"
    );
    // (What each cut log held is lost to the store here: a host's own record brings it back,
    // as `a_write_ahead_log_truncated_under_a_running_server_loses_no_acknowledged_turn` shows.)
    each_once_in_order(
        &whole_context(&mut client, 32, &session),
        ["plover5 code".to_owned()],
    );
    ui.kill().ok();
    ui.wait().ok();
    drop(client.stdin.take());
    client.child.wait().unwrap();
}

/// Every fold of a backlog reaches the host's model: a compaction that summarizes several
/// leaves together (a long backlog, a small budget) asks `llm.complete` for each, in the
/// call's own scope. The leaves made together once ran in spawned tasks, which do not carry
/// the call's scope: each was written by the fallback ("no host model in scope"), 38 % of a
/// gateway session's folds.
#[test]
fn every_fold_of_a_backlog_reaches_the_hosts_model() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    host_model_backlog(&mut client, "b", 60);
    client.send(
        3,
        "compact",
        json!({"sessionId": "b", "tokenBudget": 2000, "force": true}),
    );
    let (reply, asked) = answer_asks_until(&mut client, 3, |ask, before| {
        // The scope names the call, so the client answers with that call's model (OpenClaw's
        // plugin has no model for any other, and refuses).
        assert_eq!(ask["params"]["scope"], 3, "ask {}: {ask}", before + 1);
        json!({"text": format!("HOST SUMMARY {}", before + 1)})
    });
    assert_eq!(reply["result"]["compacted"], true, "{reply}");
    let details = &reply["result"]["result"]["details"];
    assert!(
        details["summariesCreated"].as_u64().unwrap() > 4,
        "a backlog: several leaves made together: {reply}"
    );
    assert_eq!(details["degradedSummaries"], 0, "{reply}");
    // Every summary but the truncation's (which asks no summarizer) was the model's.
    assert_eq!(
        asked as u64,
        details["summariesCreated"].as_u64().unwrap()
            - details["fallbackSummaries"].as_u64().unwrap(),
        "{reply}"
    );
}

/// A call that does not bring the host's model (OpenClaw brings none to a turn's commit) is not
/// asked for one: its folds are published by a stand-in, flagged, and the next call that
/// brings the model (`maintain`) has the model rewrite them, so a session never keeps them.
#[test]
fn folds_a_stand_in_wrote_without_the_model_are_rewritten_by_it_later() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    host_model_backlog(&mut client, "s", 12);
    client.send_raw(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "compact", "hostModel": false,
            "params": {"sessionId": "s", "tokenBudget": 2000, "force": true}})
        .to_string(),
    );
    let reply = client.wait(|value| value["id"] == 3);
    let details = &reply["result"]["result"]["details"];
    assert!(
        details["degradedSummaries"].as_u64().unwrap() > 0,
        "{reply}"
    );
    assert!(
        !client
            .pending
            .iter()
            .any(|message| message["method"] == "llm.complete"),
        "a call without the model is not asked for it"
    );
    client.send_raw(
        &json!({"jsonrpc": "2.0", "id": 4, "method": "maintain", "hostModel": true,
            "params": {"sessionId": "s"}})
        .to_string(),
    );
    let (reply, asked) = answer_asks_until(
        &mut client,
        4,
        |_, before| json!({"text": format!("HOST REWRITE {}", before + 1)}),
    );
    let rewritten = reply["result"]["rewrittenEntries"].as_u64().unwrap();
    assert!(rewritten > 0 && rewritten <= asked as u64, "{reply}");
    let assembled = client.call(
        5,
        "assemble",
        json!({"sessionId": "s", "messages": [], "tokenBudget": 100000}),
    );
    assert!(
        assembled.to_string().contains("HOST REWRITE"),
        "{assembled}"
    );
    drop(client.stdin.take());
    client.child.wait().unwrap();
}

/// OpenClaw answers `llm.complete` with an empty completion when its provider fails (a 503):
/// the model is unavailable, so the extractive summarizer stands in (flagged, rewritten later),
/// rather than the escalation meant for a model that writes badly ending in a truncation.
#[test]
fn an_empty_completion_is_the_model_unavailable() {
    let dir = TempDir::new().unwrap();
    let mut client = Client::start(dir.path());
    host_model_session(&mut client);
    client.send(
        3,
        "compact",
        json!({"sessionId": "h", "tokenBudget": 2000, "force": true}),
    );
    let (reply, _) = answer_asks_until(&mut client, 3, |_, _| json!({"text": ""}));
    let details = &reply["result"]["result"]["details"];
    assert!(
        details["degradedSummaries"].as_u64().unwrap() > 0,
        "{reply}"
    );
    assert!(
        details["degradedReason"]
            .as_str()
            .unwrap()
            .contains("the host's model is unavailable"),
        "{reply}"
    );
    drop(client.stdin.take());
    client.child.wait().unwrap();
}
