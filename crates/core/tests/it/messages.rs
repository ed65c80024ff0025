//! The message model round-trips every message without loss.

use serde_json::Value;
use vilvona_core::message::{AgentMessage, ContentBlock};

fn fixture(name: &str) -> String {
    let path = format!("{}/../../fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// Parses `line` as a message, serializes it, and checks the JSON value is unchanged.
fn check_round_trip(line: &str, origin: &str) -> AgentMessage {
    let original: Value = serde_json::from_str(line).unwrap();
    let message: AgentMessage =
        serde_json::from_str(line).unwrap_or_else(|error| panic!("{origin}: {error}"));
    let reserialized: Value =
        serde_json::from_str(&serde_json::to_string(&message).unwrap()).unwrap();
    assert_eq!(
        reserialized, original,
        "{origin}: round trip changed the message"
    );
    message
}

#[test]
fn generated_session_messages_round_trip() {
    let text = fixture("gen-session-15.jsonl");
    let mut roles = std::collections::BTreeMap::<String, usize>::new();
    for (index, line) in text.lines().enumerate() {
        let entry: Value = serde_json::from_str(line).unwrap();
        if entry["type"] != "message" {
            continue;
        }
        let message_json = entry["message"].to_string();
        let message = check_round_trip(&message_json, &format!("line {}", index + 1));
        assert!(
            !matches!(message, AgentMessage::Other(_)),
            "line {}: a generated {} message should fit the typed view",
            index + 1,
            message.role()
        );
        *roles.entry(message.role().to_owned()).or_default() += 1;
    }
    assert_eq!(
        roles.keys().cloned().collect::<Vec<_>>(),
        ["assistant", "toolResult", "user"]
    );
}

#[test]
fn odd_messages_round_trip() {
    let text = fixture("odd-messages.jsonl");
    let kinds: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(index, line)| {
            let message = check_round_trip(line, &format!("odd-messages.jsonl:{}", index + 1));
            let view = match &message {
                AgentMessage::User(_) => "User",
                AgentMessage::Assistant(_) => "Assistant",
                AgentMessage::ToolResult(_) => "ToolResult",
                AgentMessage::Other(_) => "Other",
            };
            format!("{}:{view}", message.role())
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user:User",
            "assistant:Assistant",
            "assistant:Assistant",
            "toolResult:ToolResult",
            "toolResult:ToolResult",
            "user:User",
            "user:User",
            "assistant:Assistant",
            "bashExecution:Other",
            "compactionSummary:Other",
            "toolResult:Other",
            "assistant:Assistant",
            "user:User",
        ]
    );
}

#[test]
fn misfit_fields_stay_verbatim_beside_the_typed_view() {
    let line = r#"{"role":"assistant","content":"plain","stopReason":null,"usage":{"input":1.5},"timestamp":"later"}"#;
    let AgentMessage::Assistant(message) = serde_json::from_str(line).unwrap() else {
        panic!("expected the assistant view");
    };
    assert_eq!(message.stop_reason, None);
    assert_eq!(message.usage, None);
    assert_eq!(message.timestamp, None);
    assert_eq!(message.extra["stopReason"], Value::Null);
    assert_eq!(message.extra["timestamp"], "later");
    assert_eq!(message.extra["usage"]["input"], 1.5);
}

#[test]
fn unknown_blocks_are_kept_in_place() {
    let line = r#"{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"redacted_thinking","data":"x"},{"type":"toolCall","id":"c1","name":"exec","arguments":{}}]}"#;
    let message: AgentMessage = serde_json::from_str(line).unwrap();
    let types: Vec<&str> = message
        .content()
        .unwrap()
        .blocks()
        .iter()
        .map(ContentBlock::block_type)
        .collect();
    assert_eq!(types, ["text", "redacted_thinking", "toolCall"]);
    assert_eq!(
        message
            .tool_calls()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        ["c1"]
    );
}

#[test]
fn a_message_needs_a_string_role() {
    let missing = serde_json::from_str::<AgentMessage>(r#"{"content":"hi"}"#).unwrap_err();
    assert!(
        missing.to_string().contains("message has no `role`"),
        "{missing}"
    );
    let numeric = serde_json::from_str::<AgentMessage>(r#"{"role":7}"#).unwrap_err();
    assert!(
        numeric.to_string().contains("`role` must be a string"),
        "{numeric}"
    );
}

#[test]
fn plain_text_reads_every_kind_of_content() {
    let text = fixture("odd-messages.jsonl");
    let lines: Vec<&str> = text.lines().collect();
    let plain = |index: usize| {
        serde_json::from_str::<AgentMessage>(lines[index])
            .unwrap()
            .plain_text()
    };
    assert_eq!(plain(0), "What is in this screenshot?\n[image image/png]");
    assert_eq!(
        plain(1),
        "The user wants a description.\nA single white pixel."
    );
    assert_eq!(
        plain(2),
        "exec {\"command\":\"ls\"}\nread {\"path\":\"README.md\"}"
    );
    assert_eq!(plain(4), "[image image/jpeg]\n# vilvona");
    assert_eq!(plain(10), "a result without its toolCallId");
}

/// The text read from a message's JSON is the text of the message it decodes to, for every
/// shape: typed views, views that do not fit, blocks of every kind, and JSON that is no
/// message (its text is empty).
#[test]
fn plain_text_of_json_is_the_decoded_messages() {
    let decoded = |json: &str| {
        serde_json::from_str::<AgentMessage>(json)
            .map(|message| message.plain_text())
            .unwrap_or_default()
    };
    let odd = fixture("odd-messages.jsonl");
    let generated = fixture("gen-session-15.jsonl");
    let generated: Vec<String> = generated
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|entry| entry["type"] == "message")
        .map(|entry| entry["message"].to_string())
        .collect();
    let shapes = [
        r#"{"role":"user","content":"hi"}"#,
        r#"{"role":"user"}"#,
        r#"{"role":"user","content":null}"#,
        r#"{"role":"user","content":7}"#,
        r#"{"role":"user","content":[7, {"type":"text","text":"after a number"}]}"#,
        r#"{"role":"user","content":[{"type":"text"},{"type":"text","text":5},{"text":"no type"}]}"#,
        r#"{"role":"assistant","content":[{"type":"toolCall","id":"c","name":"exec","arguments":{"b":1.0,"a":[1e400,-0]}}]}"#,
        r#"{"role":"assistant","content":[{"type":"toolCall","name":"exec"},{"type":"thinking","text":"t"}]}"#,
        r#"{"role":"assistant","content":[{"type":"image","mimeType":3},{"type":"image"}]}"#,
        r#"{"role":"toolResult","content":"result","timestamp":"later"}"#,
        r#"{"role":"custom","content":[{"type":"text","text":"other role"}],"extra":{"content":"no"}}"#,
        r#"{"role":"user","content":"first","content":"second"}"#,
        r#"{"role":"user","role":"user","content":"twice"}"#,
        r#"{"role":7,"content":"a number's role"}"#,
        r#"{"content":"no role"}"#,
        r#"["user","an array"]"#,
        r#"  {"role":"user","content":"spaced"}  "#,
        r#"{"role":"user","content":"cut"#,
        r#"{"role":"user","content":"\ud83d\ude00 \u00e9 \\ \" escaped"}"#,
        "",
        "null",
    ];
    let lines = odd
        .lines()
        .chain(generated.iter().map(String::as_str))
        .chain(shapes);
    let mut checked = 0;
    for line in lines {
        assert_eq!(
            AgentMessage::plain_text_of_json(line),
            decoded(line),
            "{line}"
        );
        checked += 1;
    }
    assert!(checked > 40, "{checked} lines checked");
}
