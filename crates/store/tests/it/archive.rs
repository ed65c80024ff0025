//! Exporting a conversation and importing it into another store: an exact round trip, the
//! imported rows as searchable and as idempotent as the originals, and refusals that write
//! nothing.

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::archive::{ArchivedRef, SessionArchive};
use vilvona_core::message::AgentMessage;
use vilvona_core::summarize::SummaryKind;
use vilvona_store::*;

use crate::support::*;

/// A conversation with everything an archive carries: entry-identified and durable-turn
/// messages, a message whose text moved to a stored file, leaves under a condensed summary,
/// raw messages after them, state; and a second conversation whose context holds the first
/// one's summary and message by reference (as a subagent's fork does).
async fn history(store: &Store) -> (ConversationId, ConversationId) {
    let parent = store.conversation(&key("main", "s1")).await.unwrap();
    let blob = store
        .put_blob(NewBlob {
            conversation: parent.id,
            kind: "log".to_owned(),
            content: "line one\nthe kestrel deploy key is KD-4411\n".to_owned(),
            description: "deploy log".to_owned(),
        })
        .await
        .unwrap();
    let mut messages: Vec<NewMessage> = (0..8)
        .map(|n| {
            new_message(
                &format!("message {n}: the osprey ticket is OSP-{n}{n}"),
                1_000 + n,
                Some(&format!("e{n}")),
            )
        })
        .collect();
    messages.push(NewMessage {
        message: serde_json::from_value::<AgentMessage>(json!({
            "role": "toolResult", "toolCallId": "c1", "toolName": "exec",
            "content": [{"type": "text", "text": "[stored]", BLOB_ID_KEY: blob.blob_id}]
        }))
        .unwrap(),
        identity: MessageIdentity {
            entry_id: Some("e8".to_owned()),
            ..MessageIdentity::default()
        },
        tokens: 5,
    });
    store.ingest(parent.id, messages, None).await.unwrap();
    let turn = vec![
        new_message("a durable turn: the heron gate is HG-7", 2_000, None),
        new_message("noted", 2_001, None),
    ];
    stored(
        store
            .ingest(parent.id, turn, Some("turn-1".to_owned()))
            .await
            .unwrap(),
    );
    for range in [0..3, 1..4] {
        let context = store.context(parent.id).await.unwrap();
        let outcome = store
            .replace(plan(parent.id, &context, range, "leaf: osprey tickets"))
            .await
            .unwrap();
        assert!(matches!(outcome, ReplaceOutcome::Replaced(_)));
    }
    let context = store.context(parent.id).await.unwrap();
    let mut condensed = plan(parent.id, &context, 0..2, "condensed: the osprey tickets");
    condensed.summary.kind = SummaryKind::Condensed;
    condensed.summary.depth = 1;
    assert!(matches!(
        store.replace(condensed).await.unwrap(),
        ReplaceOutcome::Replaced(_)
    ));
    store
        .set_state(parent.id, "bootstrap", "{\"offset\":42}")
        .await
        .unwrap();

    let child = store.conversation(&key("main", "s1-sub")).await.unwrap();
    let refs: Vec<ItemRef> = store
        .context_refs(parent.id)
        .await
        .unwrap()
        .iter()
        .take(2)
        .map(|item| item.item)
        .collect();
    store.append_items(child.id, refs).await.unwrap();
    store
        .ingest(
            child.id,
            vec![new_message("the subagent's own note", 3_000, Some("c0"))],
            None,
        )
        .await
        .unwrap();
    (parent.id, child.id)
}

async fn phrase_hits(store: &Store, conversation: ConversationId, text: &str) -> usize {
    let mut query = query("main", vec![conversation], text);
    query.mode = SearchMode::Phrase;
    store.search(query).await.unwrap().len()
}

#[tokio::test]
async fn a_session_moves_to_another_store_exactly() {
    let (from_dir, to_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let from = open(&from_dir).await;
    let (parent, child) = history(&from).await;
    let archive = from.export(parent).await.unwrap();
    assert_eq!(archive.messages.len(), 11);
    assert_eq!(archive.summaries.len(), 3);
    assert_eq!(archive.blobs.len(), 1);
    assert_eq!(archive.turns.len(), 1);
    assert_eq!(archive.state["bootstrap"], "{\"offset\":42}");

    // Through the file format, as the command line moves it.
    let mut file = Vec::new();
    archive.write(&mut file, 7).unwrap();
    let (read, exported_at) = SessionArchive::read(&file[..]).unwrap();
    assert_eq!((read.clone(), exported_at), (archive.clone(), 7));

    let to = open(&to_dir).await;
    // Another session first, so the rows take other ids than they had.
    to.ingest(
        to.conversation(&key("main", "other")).await.unwrap().id,
        vec![new_message("unrelated", 1, Some("x"))],
        None,
    )
    .await
    .unwrap();
    let (imported, report) = to.import(read).await.unwrap();
    assert!(report.verified);
    assert_eq!(
        (report.messages, report.summaries, report.blobs),
        (11, 3, 1)
    );
    assert_eq!(
        without_origins(to.export(imported).await.unwrap()),
        without_origins(archive.clone())
    );

    // The same context, item for item, and the same texts.
    let texts = |items: Vec<ContextItem>| -> Vec<(i64, u64, String)> {
        items
            .into_iter()
            .map(|item| {
                let text = match &item.content {
                    ItemContent::Message(message) => message.json.clone(),
                    ItemContent::Summary(summary) => summary.content.clone(),
                };
                (item.position, item.tokens, text)
            })
            .collect()
    };
    assert_eq!(
        texts(to.context(imported).await.unwrap()),
        texts(from.context(parent).await.unwrap())
    );
    // Found, in messages, summaries and the stored file's text.
    for phrase in [
        "osprey ticket is OSP-33",
        "heron gate is HG-7",
        "kestrel deploy key",
    ] {
        assert_eq!(
            phrase_hits(&to, imported, phrase).await,
            phrase_hits(&from, parent, phrase).await,
            "{phrase}"
        );
        assert!(phrase_hits(&to, imported, phrase).await > 0, "{phrase}");
    }
    assert_eq!(
        to.blob_content(&archive.blobs[0].blob_id).await.unwrap(),
        from.blob_content(&archive.blobs[0].blob_id).await.unwrap()
    );
    // Still idempotent: a redelivered message and a redelivered turn store nothing.
    let again = stored(
        to.ingest(
            imported,
            vec![new_message(
                "message 2: the osprey ticket is OSP-22",
                1_002,
                Some("e2"),
            )],
            None,
        )
        .await
        .unwrap(),
    );
    assert!(!again[0].ingested);
    assert_eq!(again[0].seq, 2);
    assert!(matches!(
        to.ingest(
            imported,
            vec![new_message("anything", 1, None)],
            Some("turn-1".to_owned())
        )
        .await
        .unwrap(),
        IngestOutcome::DuplicateTurn
    ));
    let next = stored(
        to.ingest(
            imported,
            vec![new_message("after the move", 4_000, None)],
            None,
        )
        .await
        .unwrap(),
    );
    assert_eq!(next[0].seq, 11, "numbering goes on where it stopped");
    let report = to.integrity_check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    // The subagent's session names the parent's rows, which the target now holds.
    let child_archive = from.export(child).await.unwrap();
    assert!(child_archive.context.iter().any(|item| matches!(
        &item.item,
        ArchivedRef::Message { from: Some(_), .. } | ArchivedRef::Summary { .. }
    )));
    let (child_imported, _) = to.import(child_archive.clone()).await.unwrap();
    assert_eq!(
        without_origins(to.export(child_imported).await.unwrap()),
        without_origins(child_archive)
    );
}

#[tokio::test]
async fn a_refused_import_writes_nothing() {
    let (from_dir, to_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let from = open(&from_dir).await;
    let (parent, child) = history(&from).await;
    let archive = from.export(parent).await.unwrap();
    let to = open(&to_dir).await;

    let refusal = |error: StoreError| match error {
        StoreError::ImportRefused(reason) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // The subagent's session alone: the parent's rows are not here.
    let reason = refusal(
        to.import(from.export(child).await.unwrap())
            .await
            .unwrap_err(),
    );
    assert!(reason.contains("import the session"), "{reason}");
    // A summary naming a child the file does not hold.
    let mut broken = archive.clone();
    broken.summaries[0].children[0] = ArchivedRef::Message {
        seq: 99,
        from: None,
    };
    let reason = refusal(to.import(broken).await.unwrap_err());
    assert!(reason.contains("message 99"), "{reason}");
    for conversation in to.conversations(None).await.unwrap() {
        assert_eq!(conversation.stored_messages, 0, "{conversation:?}");
    }

    // Into its own store: the session is there.
    let reason = refusal(from.import(archive.clone()).await.unwrap_err());
    assert!(reason.contains("already holds 11 messages"), "{reason}");
    // Under another name but with the same summaries: those are stored once per store.
    let mut renamed = archive.clone();
    renamed.session.session_id = "s1-copy".to_owned();
    let reason = refusal(from.import(renamed).await.unwrap_err());
    assert!(reason.contains("already stored"), "{reason}");
    assert_eq!(from.export(parent).await.unwrap(), archive);

    // A store opened for reading refuses to import at all.
    to.import(archive.clone()).await.unwrap();
    drop(to);
    let read_only = Store::open_read_only(to_dir.path()).await.unwrap();
    let mut renamed = archive;
    renamed.session.session_id = "s2".to_owned();
    renamed.summaries.clear();
    renamed.context.clear();
    assert!(matches!(
        read_only.import(renamed).await,
        Err(StoreError::ReadOnly(_))
    ));
}

#[tokio::test]
async fn an_archived_session_stays_archived() {
    let (from_dir, to_dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let from = open(&from_dir).await;
    let (parent, _) = history(&from).await;
    assert!(from.set_archived(parent, true).await.unwrap());
    let archive = from.export(parent).await.unwrap();
    assert!(archive.session.archived_at_ms.is_some());
    let to = open(&to_dir).await;
    let (imported, _) = to.import(archive.clone()).await.unwrap();
    assert_eq!(
        without_origins(to.export(imported).await.unwrap()),
        without_origins(archive.clone())
    );
    // Out of the index, found in the database.
    assert!(phrase_hits(&to, imported, "heron gate is HG-7").await > 0);
    to.rebuild_index().await.unwrap();
    assert!(phrase_hits(&to, imported, "heron gate is HG-7").await > 0);
}
