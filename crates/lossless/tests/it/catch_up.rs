//! Turns the host never commits (OpenClaw on Anthropic's API with its cache-ttl pruning): the
//! engine takes them in from the history `assemble` brings — a bounded tail of it, as OpenClaw
//! reads one — in order, each once, whether or not a commit ever comes.

use serde_json::json;
use tempfile::TempDir;
use vilvona_core::admin::{EngineAdmin, ToolCaller};
use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_lossless::LosslessEngine;

use crate::support::*;

const KEY: &str = "agent:main:anthropic";

/// The host's history as OpenClaw hands it to `assemble`: its newest messages only (a bounded
/// read of the transcript: here the last `tail` messages).
fn bounded(history: &[AgentMessage], tail: usize) -> Vec<AgentMessage> {
    history[history.len().saturating_sub(tail)..].to_vec()
}

async fn assemble(
    engine: &LosslessEngine,
    session: &str,
    history: &[AgentMessage],
    prompt: &str,
) -> AssembleResult {
    engine
        .assemble(&AssembleParams {
            session_id: session.to_owned(),
            session_key: Some(KEY.to_owned()),
            messages: history.to_vec().into(),
            prompt: Some(prompt.to_owned()),
            token_budget: Some(4_000),
            ..AssembleParams::default()
        })
        .await
        .unwrap()
}

/// The texts of a session's stored messages, in order.
async fn stored_texts(engine: &LosslessEngine, session: &str) -> Vec<String> {
    let conversation = engine.conversation(session, Some(KEY)).await.unwrap();
    let row = engine
        .store()
        .conversation_by_id(conversation.id)
        .await
        .unwrap()
        .unwrap();
    engine
        .store()
        .messages_in_seq_range(conversation.id, 0, row.message_count.saturating_sub(1))
        .await
        .unwrap()
        .iter()
        .map(|message| message.text())
        .collect()
}

/// Each of turns `0..turns` is stored exactly once, in order.
fn holds_each_turn_once(texts: &[String], turns: usize) {
    let firsts: Vec<&String> = texts
        .iter()
        .filter(|text| text.starts_with("Turn "))
        .collect();
    let expected: Vec<String> = (0..turns).map(|n| format!("Turn {n}:")).collect();
    assert_eq!(firsts.len(), turns, "{firsts:?}");
    for (text, expected) in firsts.iter().zip(&expected) {
        assert!(text.starts_with(expected.as_str()), "{text} for {expected}");
    }
    assert_eq!(texts.len(), turns * 4, "four messages a turn, none twice");
}

fn caller(session: &str) -> ToolCaller {
    ToolCaller {
        session_id: session.to_owned(),
        session_key: Some(KEY.to_owned()),
    }
}

/// 40 turns, none committed; each assembly brings the newest six turns of the history. Before
/// catch-up the store held turn 0 only (imported on first sight) and the engine told the host it
/// held the history, so the host stopped sending it.
#[tokio::test]
async fn turns_the_host_never_commits_are_taken_in_at_the_next_assembly() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..40 {
        let assembled = assemble(&engine, "s", &bounded(&history, 24), &format!("turn {n}")).await;
        assert!(
            !assembled.holds_history || history.is_empty(),
            "turn {n}: the engine must keep asking for the history while commits are missing"
        );
        assert!(
            assembled.estimated_tokens <= 4_000,
            "turn {n}: {}",
            assembled.estimated_tokens
        );
        history.extend(turn(n));
    }
    assemble(&engine, "s", &bounded(&history, 24), "the next").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 40);

    // The same history again (the in-turn assemblies, a retry): nothing is stored twice.
    assemble(&engine, "s", &bounded(&history, 24), "again").await;
    assemble(&engine, "s", &bounded(&history, 3), "a shorter tail").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 40);

    // Compaction ran as for committed turns, and each caught-up turn has its record.
    let summaries = context_summaries(&engine, "s", Some(KEY)).await;
    assert!(!summaries.is_empty(), "the caught-up turns were compacted");
    let records = engine.turn_history(&caller("s")).await.unwrap();
    assert_eq!(
        records.len(),
        39,
        "one record a catch-up (turn 0 came on first sight)"
    );
    // Named: the session's stats and the store's check say so.
    let stats = engine.session_stats(&caller("s")).await.unwrap();
    let caught = stats.catch_up.expect("the stats name the catch-up");
    assert_eq!((caught.turns, caught.messages), (39, 156));
    assert!(caught.commits_missing);
    let check = engine.check().await.unwrap();
    assert!(check.is_healthy(), "{:?}", check.problems);
    assert_eq!(check.notices.len(), 1, "{:?}", check.notices);
    assert!(
        check.notices[0].contains("39 turn(s)"),
        "{}",
        check.notices[0]
    );
}

/// A commit that comes after its turn was taken in stores nothing twice; once commits come,
/// the engine says it holds the history again.
#[tokio::test]
async fn a_commit_after_catch_up_stores_nothing_twice_and_commits_resume() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..6 {
        assemble(&engine, "s", &history, &format!("turn {n}")).await;
        history.extend(turn(n));
    }
    // Turn 5 is taken in by the next assembly; then its commit comes after all (queued).
    assemble(&engine, "s", &history, "turn 6").await;
    let commit = |n: usize, at: usize| CommitTurnParams {
        advancement_key: format!("k{n}"),
        session_id: "s".to_owned(),
        session_key: Some(KEY.to_owned()),
        messages: turn(n),
        admission: Some(json!({"sessionId": "s", "activeMessagePosition": at})),
        token_budget: Some(4_000),
        ..CommitTurnParams::default()
    };
    let late = engine.commit_turn(&commit(5, 20)).await.unwrap();
    assert_eq!(late.status, CommitStatus::Duplicate, "already taken in");
    assert_eq!(
        engine.commit_turn(&commit(5, 20)).await.unwrap().status,
        CommitStatus::Duplicate,
        "and sent again"
    );
    holds_each_turn_once(&stored_texts(&engine, "s").await, 6);
    // Commits resume: turn 6 is committed, and the next assembly may leave the history out.
    history.extend(turn(6));
    assert_eq!(
        engine.commit_turn(&commit(6, 24)).await.unwrap().status,
        CommitStatus::Committed
    );
    let assembled = assemble(&engine, "s", &history, "turn 7").await;
    assert!(assembled.holds_history);
    holds_each_turn_once(&stored_texts(&engine, "s").await, 7);
    let caught = engine
        .session_stats(&caller("s"))
        .await
        .unwrap()
        .catch_up
        .unwrap();
    assert!(!caught.commits_missing, "{caught:?}");
}

/// A gateway restarted after 30 uncommitted turns: the new process's first assembly brings a
/// bounded tail that no longer begins where the store does, and the turn the last process did
/// not see is taken in from it.
#[tokio::test]
async fn a_restart_takes_in_what_the_last_process_did_not_see() {
    let dir = TempDir::new().unwrap();
    let mut history: Vec<AgentMessage> = Vec::new();
    {
        let engine = engine(&dir).await;
        for n in 0..30 {
            assemble(&engine, "s", &bounded(&history, 24), &format!("turn {n}")).await;
            history.extend(turn(n));
        }
        engine.settled().await;
    }
    let engine = engine(&dir).await;
    assemble(&engine, "s", &bounded(&history, 24), "turn 30").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 30);
}

/// A session reset as `/new` does, with no commits before or after: the new window's turns are
/// its own, and nothing of before is stored again.
#[tokio::test]
async fn a_session_begun_anew_takes_in_its_own_turns_without_commits() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..4 {
        assemble(&engine, "s", &history, &format!("turn {n}")).await;
        history.extend(turn(n));
    }
    assemble(&engine, "s", &history, "before the reset").await;
    engine
        .on_session_reset(&SessionResetParams {
            session_id: "s".to_owned(),
            session_key: Some(KEY.to_owned()),
            reason: Some("new".to_owned()),
        })
        .await
        .unwrap();
    // The host's new window: turns written after the reset (their times are now).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let fresh_turn = |n: usize| -> Vec<AgentMessage> {
        turn(n)
            .into_iter()
            .enumerate()
            .map(|(index, message)| {
                let mut value = serde_json::to_value(&message).unwrap();
                value["timestamp"] = json!(now + 60_000 * n as i64 + index as i64);
                serde_json::from_value(value).unwrap()
            })
            .collect()
    };
    let mut window: Vec<AgentMessage> = Vec::new();
    for n in 10..14 {
        let assembled = assemble(&engine, "s", &window, &format!("turn {n}")).await;
        for message in assembled.messages.iter() {
            assert!(
                !message.plain_text().starts_with("Turn 0:"),
                "nothing of before in the new window's context"
            );
        }
        window.extend(fresh_turn(n));
    }
    assemble(&engine, "s", &window, "the next").await;
    let texts = stored_texts(&engine, "s").await;
    let firsts: Vec<&String> = texts.iter().filter(|t| t.starts_with("Turn ")).collect();
    assert_eq!(firsts.len(), 4, "{firsts:?}");
    assert!(firsts[0].starts_with("Turn 10:"), "{firsts:?}");
}

/// A caught-up turn is compacted against what its assembly says of the host's prompt, its
/// budget beside its settings: OpenClaw states a prompt budget below the assembly's budget,
/// which taken alone read as a window of 10.6k less an 8k reserve, and every turn was folded
/// to nothing (a trigger of 0 in each turn's record).
#[tokio::test]
async fn a_caught_up_turn_is_compacted_against_the_assemblys_budget() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let settings = RuntimeSettings {
        limits: Some(RuntimeLimits {
            prompt_token_budget: Some(3_600),
            max_output_tokens: Some(8_000),
            ..RuntimeLimits::default()
        }),
        ..RuntimeSettings::default()
    };
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..12 {
        engine
            .assemble(&AssembleParams {
                session_id: "s".to_owned(),
                session_key: Some(KEY.to_owned()),
                messages: history.clone().into(),
                prompt: Some(format!("turn {n}")),
                token_budget: Some(4_000),
                runtime_settings: Some(settings.clone()),
                ..AssembleParams::default()
            })
            .await
            .unwrap();
        history.extend(turn(n));
    }
    let records = engine.turn_history(&caller("s")).await.unwrap();
    assert!(!records.is_empty());
    for record in &records {
        assert!(
            record.trigger >= 2_000,
            "turn {}: trigger {}",
            record.turn,
            record.trigger
        );
    }
}

/// OpenClaw hands an engine that owns compaction its own assembled context back as history on
/// each model call of a turn (summaries, the raw tail, a recall block): nothing of it is taken
/// in. Before, the recall block was stored as the user's message, and no later turn met the
/// store again: every turn after it was lost.
#[tokio::test]
async fn the_engines_own_context_handed_back_brings_no_turn() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..16 {
        assemble(&engine, "s", &history, &format!("turn {n}")).await;
        history.extend(turn(n));
    }
    let asked = "What did we decide about crates/m3/src/lib.rs back then?";
    let first = assemble(&engine, "s", &history, asked).await;
    let last = first.messages.iter().last().unwrap().plain_text();
    assert!(
        last.starts_with("<recall"),
        "the question recalls turn 3: {last}"
    );
    let before = stored_texts(&engine, "s").await;
    // The calls inside the turn's tool loop: the engine's own output as the history.
    let handed_back: Vec<AgentMessage> = first.messages.iter().cloned().collect();
    let again = assemble(&engine, "s", &handed_back, asked).await;
    assert_eq!(stored_texts(&engine, "s").await, before, "nothing taken in");
    assert_eq!(
        again.messages.iter().last().unwrap().plain_text(),
        last,
        "every request of one turn carries the same block"
    );
    // The next turn's history meets the store as before.
    history.extend(turn(16));
    assemble(&engine, "s", &history, "turn 17").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 17);
}

/// Messages forgotten up to now are still in the host's history: the next assemblies take in
/// none of them again (the store's last messages are gone, so they are met by time, past the
/// forgetting's horizon), and a turn after it is taken in as before.
#[tokio::test]
async fn what_was_forgotten_does_not_come_back_from_the_hosts_history() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..6 {
        assemble(&engine, "s", &history, &format!("turn {n}")).await;
        history.extend(turn(n));
    }
    assemble(&engine, "s", &history, "turn 6").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 6);
    let after_all = history.last().unwrap().timestamp_ms().unwrap() + 1;
    engine.forget_before("s", after_all).await.unwrap();
    assert!(stored_texts(&engine, "s").await.is_empty());

    assemble(&engine, "s", &history, "turn 6, again").await;
    assert!(
        stored_texts(&engine, "s").await.is_empty(),
        "forgotten messages came back from the host's history"
    );
    history.extend(turn(6));
    assemble(&engine, "s", &history, "turn 7").await;
    let texts = stored_texts(&engine, "s").await;
    assert_eq!(texts.len(), 4, "{texts:?}");
    assert!(texts[0].starts_with("Turn 6:"), "{texts:?}");
}

/// A tail too short to hold the store's last four messages (a large tool result fills the
/// host's bounded read): what comes past the store's newest message by time is taken in.
#[tokio::test]
async fn a_tail_shorter_than_the_meeting_run_is_met_by_time() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..4 {
        assemble(&engine, "s", &bounded(&history, 24), &format!("turn {n}")).await;
        history.extend(turn(n));
    }
    assemble(&engine, "s", &bounded(&history, 24), "turn 4").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 4);
    history.extend(turn(4));
    // Only the last message of turn 3 and turn 4's four.
    assemble(&engine, "s", &bounded(&history, 5), "turn 5").await;
    holds_each_turn_once(&stored_texts(&engine, "s").await, 5);
}

/// A user's message that reads like one of the engine's renderings (pasted from the panel)
/// does not stop the session's catch-up.
#[tokio::test]
async fn a_pasted_rendering_does_not_stop_catch_up() {
    let dir = TempDir::new().unwrap();
    let engine = engine(&dir).await;
    let mut history: Vec<AgentMessage> = Vec::new();
    for n in 0..3 {
        assemble(&engine, "s", &history, &format!("turn {n}")).await;
        history.extend(turn(n));
    }
    history.push(message(json!({
        "role": "user",
        "content": "<summary id=\"sum_0123456789abcdef\" depth=\"0\">what the panel showed</summary>",
        "timestamp": history.last().unwrap().timestamp_ms().unwrap() + 1,
    })));
    for n in 3..6 {
        assemble(&engine, "s", &history, &format!("turn {n}")).await;
        history.extend(turn(n + 10));
    }
    assemble(&engine, "s", &history, "turn 6").await;
    let texts = stored_texts(&engine, "s").await;
    assert!(
        texts.iter().any(|text| text.starts_with("Turn 15:")),
        "the turns after the pasted block were taken in: {texts:?}"
    );
}
