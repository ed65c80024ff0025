//! The natural-question evaluation on a conversation of its format written for this test (the
//! benchmark's own files are not part of the project: `.ci/run` passes their folder to the
//! `locomo` bench, and BENCHMARKS.md has its figures).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use vilvona_benches::locomo::{CATEGORIES, conversation_files, evaluate, table};
use vilvona_lossless::EmbeddingSelection;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_is_replayed_and_every_question_with_evidence_asked_in_each_mode() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/locomo-mini");
    let files = conversation_files(&folder).unwrap();
    let figures = evaluate(&files, &EmbeddingSelection::default(), |step| {
        eprintln!("{step}")
    })
    .await
    .unwrap();
    println!("{}", table(&figures));
    // 30 turns; 9 questions: one adversarial (no category of recall), one whose evidence names
    // no turn of the conversation.
    assert_eq!(figures.messages, 30);
    assert_eq!((figures.questions, figures.unmatched), (7, 1));
    let modes: Vec<&str> = figures
        .modes
        .iter()
        .map(|mode| mode.mode.as_str())
        .collect();
    assert_eq!(modes, ["text", "semantic", "hybrid", "bm25"]);
    for mode in &figures.modes {
        let per_category: usize = mode.categories.iter().map(|tally| tally.questions).sum();
        assert_eq!(per_category, 7, "{}", mode.mode);
        assert_eq!(mode.categories.len(), CATEGORIES.len());
        let (at_5, at_10, hit_10) = mode.all.means();
        assert!(
            at_5 <= at_10 && at_10 <= hit_10 && hit_10 <= 1.0,
            "{mode:?}"
        );
    }
    // A conversation of 30 turns: the default mode finds nearly all of the evidence in its
    // first ten, and no less than the plain BM25 beside it.
    let recall = |mode: &str| figures.mode(mode).unwrap().all.means().1;
    assert!(recall("hybrid") >= 0.8, "{}", table(&figures));
    assert!(recall("hybrid") >= recall("bm25"), "{}", table(&figures));
}

#[test]
fn a_folder_without_conversations_is_named() {
    let empty = tempfile::TempDir::new().unwrap();
    let error = conversation_files(empty.path()).unwrap_err().to_string();
    assert!(error.contains("holds no conversation"), "{error}");
}
