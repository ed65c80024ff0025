//! The record per turn: a fold made after a turn was committed — by OpenClaw's `maintain`,
//! which brings the host's model the commit lacks, or a forced `compact` — belongs to that
//! turn's record.

use tempfile::TempDir;
use vilvona_core::admin::{EngineAdmin, ToolCaller};
use vilvona_core::engine::*;

use crate::support::*;

#[tokio::test]
async fn a_fold_made_after_the_commit_is_added_to_the_turns_record() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let caller = ToolCaller {
        session_id: "s".to_owned(),
        session_key: Some("s".to_owned()),
    };
    // A budget the turns stay far below: the commits fold nothing.
    for n in 0..3 {
        engine
            .commit_turn(&CommitTurnParams {
                advancement_key: format!("turn-{n}"),
                session_id: "s".to_owned(),
                session_key: Some("s".to_owned()),
                messages: turn(n),
                token_budget: Some(100_000),
                ..CommitTurnParams::default()
            })
            .await
            .unwrap();
    }
    let before = engine.turn_history(&caller).await.unwrap();
    assert_eq!(before.iter().map(|t| t.turn).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(before.iter().all(|t| t.folds.is_empty()), "{before:?}");

    // Room now (OpenClaw's overflow recovery): the fresh tail but its newest unit is folded.
    let result = engine
        .compact(&CompactParams {
            session_id: "s".to_owned(),
            session_key: Some("s".to_owned()),
            token_budget: Some(100_000),
            force: true,
            compaction_target: Some(CompactionTarget::Budget),
            ..CompactParams::default()
        })
        .await
        .unwrap();
    assert!(result.compacted, "{result:?}");
    let after = engine.turn_history(&caller).await.unwrap();
    assert_eq!(after.len(), 3);
    assert_eq!(
        after[..2],
        before[..2],
        "only the newest turn's record changes"
    );
    let last = &after[2];
    assert!(!last.folds.is_empty(), "{last:?}");
    for id in &last.folds {
        assert!(
            engine.store().summary_by_id(id).await.unwrap().is_some(),
            "{id}"
        );
    }
    assert!(
        last.context_after_compaction < last.context_before_compaction,
        "{last:?}"
    );
}
