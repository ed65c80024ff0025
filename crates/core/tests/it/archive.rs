//! The session archive's file format: a faithful round trip, and every damage named.

use vilvona_core::archive::*;

fn archive() -> SessionArchive {
    SessionArchive {
        session: ArchivedSession {
            agent_id: "main".to_owned(),
            session_id: "s1".to_owned(),
            session_key: Some("agent:main:s1".to_owned()),
            archived_at_ms: None,
            created_at_ms: 1,
            next_seq: 2,
            next_position: 2048,
            forgotten_messages: 0,
        },
        messages: vec![
            ArchivedMessage {
                seq: 0,
                role: "user".to_owned(),
                // Verbatim: key order, spacing and escapes are the ingested bytes.
                json:
                    "{\"role\":\"user\",  \"content\":\"caf\\u00e9 ✓ 中文\\n\",\"timestamp\":1.50}"
                        .to_owned(),
                tokens: 9,
                ingest_key: "00ff".repeat(8),
                created_at_ms: 1,
                blobs: vec!["file_0123456789abcdef".to_owned()],
                origin_id: Some(255),
            },
            ArchivedMessage {
                seq: 1,
                role: "assistant".to_owned(),
                json: "{\"role\":\"assistant\",\"content\":[]}".to_owned(),
                tokens: 3,
                ingest_key: "11".repeat(16),
                created_at_ms: 2,
                blobs: Vec::new(),
                origin_id: None,
            },
        ],
        blobs: vec![ArchivedBlob {
            blob_id: "file_0123456789abcdef".to_owned(),
            kind: "log".to_owned(),
            bytes: 5,
            lines: 1,
            description: "a log".to_owned(),
            content: "hello".to_owned(),
            created_at_ms: 1,
        }],
        summaries: vec![ArchivedSummary {
            summary_id: "sum_0011223344556677".to_owned(),
            depth: 0,
            kind: "leaf".to_owned(),
            content: "both messages".to_owned(),
            tokens: 3,
            earliest_at_ms: Some(1),
            latest_at_ms: Some(2),
            first_seq: 0,
            last_seq: 1,
            level: "normal".to_owned(),
            summarizer: "test/v1".to_owned(),
            created_at_ms: 3,
            children: vec![
                ArchivedRef::Message { seq: 0, from: None },
                ArchivedRef::Message { seq: 1, from: None },
            ],
        }],
        context: vec![ArchivedItem {
            position: 0,
            item: ArchivedRef::Summary {
                summary_id: "sum_0011223344556677".to_owned(),
            },
            tokens: 3,
        }],
        turns: vec![ArchivedTurn {
            advancement_key: "turn-1".to_owned(),
            committed_at_ms: 2,
        }],
        state: [("bootstrap".to_owned(), "{}".to_owned())].into(),
    }
}

fn written() -> Vec<u8> {
    let mut file = Vec::new();
    archive().write(&mut file, 42).unwrap();
    file
}

#[test]
fn a_written_archive_reads_back_equal() {
    let file = written();
    let (read, exported_at) = SessionArchive::read(&file[..]).unwrap();
    assert_eq!(read, archive());
    assert_eq!(exported_at, 42);
    let text = String::from_utf8(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 7 + 1, "header, seven records, trailer");
    assert!(lines[0].starts_with("{\"format\":\"vilvona-session\",\"version\":1,"));
    assert!(lines[8].starts_with("{\"end\":{\"records\":7,"));
}

#[test]
fn damage_is_named() {
    let file = written();
    let text = String::from_utf8(file.clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let read = |text: &str| {
        SessionArchive::read(text.as_bytes())
            .unwrap_err()
            .to_string()
    };

    // Cut short, at any line.
    for keep in 1..lines.len() {
        let cut = lines[..keep].join("\n") + "\n";
        assert_eq!(
            read(&cut),
            format!("the file ends after line {keep} without its end record: it was cut short")
        );
    }
    // A changed byte inside a record's text.
    let changed = text.replace("both messages", "both massages");
    assert!(
        read(&changed).contains("it was changed or damaged"),
        "{}",
        read(&changed)
    );
    // A record dropped.
    let dropped = [&lines[..2], &lines[3..]].concat().join("\n");
    assert!(
        read(&dropped).contains("counts 7 records"),
        "{}",
        read(&dropped)
    );
    // A line that is no record.
    let garbage = [&lines[..2], &["{\"mystery\":1}"], &lines[2..]]
        .concat()
        .join("\n");
    assert!(read(&garbage).starts_with("line 3: "), "{}", read(&garbage));
    // Lines after the trailer.
    let trailing = text.clone() + "{\"state\":{\"key\":\"k\",\"value\":\"v\"}}\n";
    assert_eq!(read(&trailing), "line 9: lines follow the end record");
    // Another format, another version, nothing at all.
    assert!(read("{\"hello\":1}\n").starts_with("not a vilvona-session file of version 1"));
    let newer = text.replacen("\"version\":1", "\"version\":2", 1);
    assert!(
        read(&newer).ends_with("it is \"vilvona-session\" version 2"),
        "{}",
        read(&newer)
    );
    assert!(read("").ends_with("the file is empty"));
}
