//! Transcripts: round trip of a real-format file, torn last lines, malformed lines, resuming.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;

use serde_json::Value;
use tempfile::TempDir;
use vilvona_core::message::AgentMessage;
use vilvona_transcript::*;

fn fixture() -> std::path::PathBuf {
    format!(
        "{}/../../fixtures/gen-session-15.jsonl",
        env!("CARGO_MANIFEST_DIR")
    )
    .into()
}

#[test]
fn a_real_format_file_round_trips() {
    let transcript = read_transcript(&fixture()).unwrap();
    assert_eq!(transcript.header.id, "synthetic-11-15");
    assert!(transcript.torn.is_none());
    let dir = TempDir::new().unwrap();
    let copy = dir.path().join("copy.jsonl");
    let mut writer = TranscriptWriter::create(&copy, &transcript.header).unwrap();
    for located in &transcript.entries {
        writer.append(&located.entry).unwrap();
    }
    writer.sync().unwrap();
    let original: Vec<Value> = std::fs::read_to_string(fixture())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let copied: Vec<Value> = std::fs::read_to_string(&copy)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(copied, original);
}

#[test]
fn unknown_entry_types_are_kept() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"type":"session","version":3,"id":"s1","timestamp":"2026-03-02T09:00:00Z","cwd":"/w"}"#, "\n",
            r#"{"type":"model_change","id":"a1","parentId":null,"timestamp":"2026-03-02T09:00:01Z","provider":"x","modelId":"y"}"#, "\n",
            r#"{"type":"message","id":"a2","parentId":"a1","timestamp":"2026-03-02T09:00:02Z","message":{"role":"user","content":"hi","timestamp":1}}"#, "\n",
        ),
    )
    .unwrap();
    let transcript = read_transcript(&path).unwrap();
    assert!(
        matches!(&transcript.entries[0].entry, Entry::Other(fields) if fields["modelId"] == "y")
    );
    assert!(
        matches!(&transcript.entries[1].entry, Entry::Message(m) if m.parent_id.as_deref() == Some("a1"))
    );
}

#[test]
fn a_torn_last_line_is_skipped_and_cut_before_appending() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s.jsonl");
    let mut writer = TranscriptWriter::create(
        &path,
        &SessionHeader::new("s1", "2026-03-02T09:00:00Z".to_owned()),
    )
    .unwrap();
    let first = writer
        .append_message(&AgentMessage::user_text("one"), "t1".to_owned())
        .unwrap();
    writer
        .append_message(&AgentMessage::assistant_text("two"), "t2".to_owned())
        .unwrap();
    writer.sync().unwrap();
    drop(writer);
    // A crash in the middle of the third append.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(br#"{"type":"message","id":"zz","parentId":"#)
        .unwrap();

    let transcript = read_transcript(&path).unwrap();
    assert_eq!(transcript.entries.len(), 2, "earlier lines are all kept");
    assert_eq!(transcript.torn, Some(TornLine { line: 4, bytes: 39 }));
    assert_eq!(transcript.entries[0].entry.id(), Some(first.as_str()));

    let mut writer = TranscriptWriter::open(&path).unwrap();
    writer
        .append_message(&AgentMessage::user_text("three"), "t3".to_owned())
        .unwrap();
    writer.sync().unwrap();
    let transcript = read_transcript(&path).unwrap();
    assert!(transcript.torn.is_none());
    assert_eq!(transcript.entries.len(), 3);
    let Entry::Message(third) = &transcript.entries[2].entry else {
        panic!()
    };
    assert_eq!(
        third.parent_id,
        transcript.entries[1].entry.id().map(str::to_owned)
    );
}

#[test]
fn a_malformed_line_names_file_and_line_and_keeps_what_came_before() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"type":"session","id":"s1"}"#,
            "\n",
            r#"{"type":"message","id":"a","message":{"role":"user","content":"ok"}}"#,
            "\n",
            "{not json}\n",
            r#"{"type":"message","id":"b","message":{"role":"user","content":"after"}}"#,
            "\n",
        ),
    )
    .unwrap();
    let mut seen = Vec::new();
    let error = read_entries(&path, Cursor::default(), |located| {
        seen.push(located.entry.id().unwrap().to_owned());
        Ok(())
    })
    .unwrap_err();
    assert_eq!(seen, ["a"]);
    let text = error.to_string();
    assert!(
        text.ends_with("bad.jsonl:3: key must be a string at line 1 column 2"),
        "{text}"
    );
    let no_header = dir.path().join("no-header.jsonl");
    std::fs::write(&no_header, "{\"type\":\"message\"}\n").unwrap();
    assert!(
        read_transcript(&no_header)
            .unwrap_err()
            .to_string()
            .contains("is not a `session` header")
    );
}

#[test]
fn reading_resumes_from_a_cursor() {
    let mut cursor = Cursor::default();
    let mut first_half = Vec::new();
    read_entries(&fixture(), Cursor::default(), |located| {
        if first_half.len() < 10 {
            cursor = located.end;
            first_half.push(located.line);
        }
        Ok(())
    })
    .unwrap();
    let mut rest = Vec::new();
    let (header, _) = read_entries(&fixture(), cursor, |located| {
        rest.push(located.line);
        Ok(())
    })
    .unwrap();
    assert!(header.is_none());
    assert_eq!(rest[0], first_half[9] + 1);
    assert_eq!(
        first_half.len() + rest.len(),
        read_transcript(&fixture()).unwrap().entries.len()
    );
}

#[test]
fn the_rebuilt_context_starts_at_the_last_compaction() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s.jsonl");
    let mut writer =
        TranscriptWriter::create(&path, &SessionHeader::new("s1", "t".to_owned())).unwrap();
    let ids: Vec<String> = (0..4)
        .map(|i| {
            writer
                .append_message(&AgentMessage::user_text(format!("m{i}")), "t".to_owned())
                .unwrap()
        })
        .collect();
    let compaction = Entry::Compaction(CompactionEntry {
        id: "c1".to_owned(),
        parent_id: Some(ids[3].clone()),
        timestamp: None,
        summary: "m0 and m1 happened".to_owned(),
        first_kept_entry_id: ids[2].clone(),
        tokens_before: 100,
        details: None,
        extra: Default::default(),
    });
    writer.append(&compaction).unwrap();
    writer
        .append_message(&AgentMessage::user_text("m4"), "t".to_owned())
        .unwrap();
    writer.sync().unwrap();
    let transcript = read_transcript(&path).unwrap();
    let rebuilt: Vec<String> = session_messages(&transcript.entries)
        .into_iter()
        .map(|(_, message)| message.plain_text())
        .collect();
    assert_eq!(rebuilt.len(), 4);
    assert!(rebuilt[0].starts_with(COMPACTION_SUMMARY_PREFIX));
    assert!(rebuilt[0].contains("m0 and m1 happened"));
    assert_eq!(&rebuilt[1..], ["m2", "m3", "m4"]);
}

/// Turns: a user message and what follows it; a bad line ends the reading after the part of
/// the turn read before it was handed over.
#[test]
fn turns_are_split_at_user_messages_and_a_bad_line_keeps_what_came_before() {
    let lines: Vec<String> = std::fs::read_to_string(fixture())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let mut turns = Vec::new();
    for_each_turn(&fixture(), |turn| {
        turns.push(turn);
        Ok(())
    })
    .unwrap();
    assert_eq!(turns.len(), 15);
    for turn in &turns {
        assert!(matches!(turn.messages[0], AgentMessage::User(_)));
        assert!(
            turn.messages[1..]
                .iter()
                .all(|m| !matches!(m, AgentMessage::User(_)))
        );
        assert_eq!(turn.messages.len(), turn.entry_ids.len());
    }
    let dir = TempDir::new().unwrap();
    let broken = dir.path().join("broken.jsonl");
    let mut text = lines[..7].join("\n");
    text.push_str("\n{\"type\":\"message\",\n");
    text.push_str(&lines[7..].join("\n"));
    std::fs::write(&broken, text).unwrap();
    let mut read = Vec::new();
    let error = for_each_turn(&broken, |turn| {
        read.push(turn);
        Ok(())
    })
    .unwrap_err();
    assert!(error.to_string().contains(":8:"), "{error}");
    let messages: usize = read.iter().map(|turn| turn.messages.len()).sum();
    assert_eq!(messages, 6, "the six messages before the bad line");
}

/// Long transcripts are parsed in batches across cores; what a reader sees is the same: every
/// entry in order, stopping at the first bad line (named), or a torn last line skipped.
#[test]
fn batches_parsed_across_cores_are_visited_in_order() {
    let dir = tempfile::TempDir::new().unwrap();
    let line = |i: usize| {
        format!(r#"{{"type":"message","id":"m{i}","message":{{"role":"user","content":"n{i}"}}}}"#)
    };
    let write = |name: &str, bad_at: Option<usize>, torn_tail: bool| {
        let mut text = String::from("{\"type\":\"session\",\"id\":\"s\"}\n");
        for i in 0..700 {
            if bad_at == Some(i) {
                text.push_str("{not json}\n");
            } else {
                text.push_str(&line(i));
                text.push('\n');
            }
        }
        if torn_tail {
            text.push_str(r#"{"type":"message","id":"torn"#);
        }
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ids = |path: &std::path::Path| {
        let mut seen = Vec::new();
        let outcome = read_entries(path, Cursor::default(), |located| {
            seen.push(located.entry.id().unwrap().to_owned());
            Ok(())
        });
        (seen, outcome)
    };
    let every: Vec<String> = (0..700).map(|i| format!("m{i}")).collect();

    let (seen, outcome) = ids(&write("whole.jsonl", None, false));
    assert_eq!(seen, every);
    assert!(outcome.unwrap().1.is_none());

    let (seen, outcome) = ids(&write("bad.jsonl", Some(400), false));
    assert_eq!(seen, every[..400]);
    // The header is line 1, so entry 400 is line 402.
    assert!(outcome.unwrap_err().to_string().contains("bad.jsonl:402:"));

    let (seen, outcome) = ids(&write("torn.jsonl", None, true));
    assert_eq!(seen, every);
    assert_eq!(outcome.unwrap().1.unwrap().line, 702);
}
