//! The turn lifecycle with a recording engine.

use std::sync::Arc;

use tempfile::TempDir;
use vilvona_conformance::{Expectations, SessionFixture, check_contract};
use vilvona_core::engine::{ContextMode, PromptAuthority, SubagentEndReason};
use vilvona_core::host::HostProfile;
use vilvona_core::message::AgentMessage;
use vilvona_core::registry::LEGACY_ENGINE_ID;
use vilvona_runtime::{Host, HostError, HostOptions, SubagentSpawn};
use vilvona_transcript::read_transcript;

use crate::support::*;

const RECORDER_CONFIG: &str = r#"{ plugins: { slots: { contextEngine: "recorder" } } }"#;

async fn host_with(
    dir: &TempDir,
    config: &str,
    behaviour: Behaviour,
) -> (
    Host,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
) {
    write_config(dir.path(), config);
    let (register, calls, seen) = register_recorder(behaviour);
    let host = Host::open(HostOptions::new(dir.path()), register)
        .await
        .unwrap();
    (host, calls, seen)
}

fn calls(log: &CallLog) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test]
async fn the_turn_calls_the_engine_in_order() {
    let dir = TempDir::new().unwrap();
    let (host, log, seen) = host_with(&dir, RECORDER_CONFIG, Behaviour::default()).await;
    let model = ScriptedModel::new(vec![Ok("first answer"), Ok("second answer")]);
    host.run_turn("agent:main:s1", AgentMessage::user_text("hello"), &model)
        .await
        .unwrap();
    // A new session: no bootstrap (no transcript existed). The engine owns compaction and
    // vouches for its assembly, so there is no precheck compaction.
    assert_eq!(calls(&log), ["assemble", "after_turn", "maintain(turn)"]);
    host.run_turn("agent:main:s1", AgentMessage::user_text("again"), &model)
        .await
        .unwrap();
    assert_eq!(calls(&log), ["assemble", "after_turn", "maintain(turn)"]);
    let seen: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, text)| text.clone())
        .collect();
    assert_eq!(seen, ["hello", "first answer", "again", "second answer"]);

    // A second host process on the same state dir bootstraps the existing session once.
    drop(host);
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, Behaviour::default()).await;
    host.run_turn("agent:main:s1", AgentMessage::user_text("third"), &model)
        .await
        .unwrap();
    host.run_turn("agent:main:s1", AgentMessage::user_text("fourth"), &model)
        .await
        .unwrap();
    assert_eq!(
        calls(&log),
        [
            "bootstrap",
            "maintain(bootstrap)",
            "assemble",
            "after_turn",
            "maintain(turn)",
            "assemble",
            "after_turn",
            "maintain(turn)"
        ]
    );
}

#[tokio::test]
async fn without_after_turn_the_new_messages_are_ingested_as_a_batch() {
    let dir = TempDir::new().unwrap();
    let behaviour = Behaviour {
        has_after_turn: false,
        ..Behaviour::default()
    };
    let (host, log, seen) = host_with(&dir, RECORDER_CONFIG, behaviour).await;
    host.run_turn(
        "k",
        AgentMessage::user_text("hi"),
        &ScriptedModel::default(),
    )
    .await
    .unwrap();
    assert_eq!(calls(&log), ["assemble", "ingest_batch", "maintain(turn)"]);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn the_system_prompt_addition_is_prepended() {
    let dir = TempDir::new().unwrap();
    let behaviour = Behaviour {
        addition: Some("Use vilvona_grep to recall.".to_owned()),
        ..Behaviour::default()
    };
    let (host, _, _) = host_with(&dir, RECORDER_CONFIG, behaviour).await;
    let model = ScriptedModel::default();
    let report = host
        .run_turn("k", AgentMessage::user_text("hi"), &model)
        .await
        .unwrap();
    let prompt = &model.requests.lock().unwrap()[0].system_prompt;
    assert!(
        prompt.starts_with("Use vilvona_grep to recall.\n\nYou are a helpful coding agent."),
        "{prompt}"
    );
    assert_eq!(&report.system_prompt, prompt);
}

/// Precheck routes: which (owns compaction, authority) pairs precheck, and what they compare.
#[tokio::test]
async fn the_precheck_follows_prompt_authority() {
    // A tiny window (budget ~1) so any estimate is over budget.
    let config = r#"{ plugins: { slots: { contextEngine: "recorder" } }, agents: { defaults: { contextTokens: 400, compaction: { reserveTokens: 0, reserveTokensFloor: 0 } } } }"#;
    let cases = [
        // owns, authority, estimated, expected calls of the second turn
        (
            true,
            PromptAuthority::Assembled,
            10_000,
            vec!["assemble", "after_turn", "maintain(turn)"],
        ),
        (
            true,
            PromptAuthority::PreassemblyMayOverflow,
            1,
            vec![
                "assemble",
                "compact",
                "maintain(compaction)",
                "assemble",
                "after_turn",
                "maintain(turn)",
            ],
        ),
        (
            false,
            PromptAuthority::Assembled,
            10_000,
            vec![
                "assemble",
                "compact",
                "maintain(compaction)",
                "assemble",
                "after_turn",
                "maintain(turn)",
            ],
        ),
        (
            false,
            PromptAuthority::Assembled,
            1,
            vec!["assemble", "after_turn", "maintain(turn)"],
        ),
    ];
    for (owns, authority, estimated, expected) in cases {
        let dir = TempDir::new().unwrap();
        let behaviour = Behaviour {
            owns_compaction: owns,
            authority,
            estimated_tokens: estimated,
            ..Behaviour::default()
        };
        let (host, log, _) = host_with(&dir, config, behaviour).await;
        // A long first turn makes the unwindowed history large.
        let long = "word ".repeat(2_000);
        host.run_turn(
            "k",
            AgentMessage::user_text(long),
            &ScriptedModel::default(),
        )
        .await
        .unwrap();
        calls(&log);
        host.run_turn(
            "k",
            AgentMessage::user_text("short"),
            &ScriptedModel::default(),
        )
        .await
        .unwrap();
        let mut got = calls(&log);
        // A non-owning engine also gets the built-in auto-compaction after the turn (the
        // history is over the tiny window); that does not go through the engine.
        got.retain(|call| {
            call != "maintain(compaction)" || expected.contains(&"maintain(compaction)")
        });
        assert_eq!(
            got, expected,
            "owns={owns} authority={authority:?} estimated={estimated}"
        );
    }
}

#[tokio::test]
async fn overflow_recovery_stops_after_three_compactions_that_freed_tokens() {
    let dir = TempDir::new().unwrap();
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, Behaviour::default()).await;
    let model = ScriptedModel::new(vec![
        Err("context length exceeded"),
        Err("context length exceeded"),
        Ok("made it"),
    ]);
    let report = host
        .run_turn("k", AgentMessage::user_text("hi"), &model)
        .await
        .unwrap();
    assert_eq!(report.overflow_recoveries, 2);
    assert_eq!(calls(&log).iter().filter(|c| *c == "compact").count(), 2);

    let model = ScriptedModel::new(vec![Err("too long"); 5]);
    let error = host
        .run_turn("k", AgentMessage::user_text("hi"), &model)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("still too large after 3 compactions"),
        "{error}"
    );
    assert_eq!(
        model.requests.lock().unwrap().len(),
        4,
        "one call and three retries"
    );
}

#[tokio::test]
async fn overflow_recovery_does_not_count_compactions_that_freed_nothing() {
    let dir = TempDir::new().unwrap();
    let behaviour = Behaviour {
        compacts: false,
        ..Behaviour::default()
    };
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, behaviour).await;
    let model = ScriptedModel::new(vec![Err("context length exceeded"), Ok("never reached")]);
    let error = host
        .run_turn("k", AgentMessage::user_text("hi"), &model)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("compaction freed nothing (no_candidate)"),
        "{text}"
    );
    // A plain compaction, then a forced one; neither freed anything, so no retry was spent.
    let log = calls(&log);
    assert_eq!(
        log.iter()
            .filter(|c| c.starts_with("compact"))
            .collect::<Vec<_>>(),
        ["compact", "compact(force)"]
    );
    assert_eq!(model.requests.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_failed_spawn_rolls_back_its_preparation() {
    let dir = TempDir::new().unwrap();
    let behaviour = Behaviour {
        rollback: true,
        ..Behaviour::default()
    };
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, behaviour).await;
    let failed: Result<(), &str> = host
        .spawn_subagent(
            SubagentSpawn {
                ttl_ms: Some(60_000),
                ..SubagentSpawn::new("parent", "child", ContextMode::Fork)
            },
            async { Err("the child process did not start") },
        )
        .await
        .unwrap();
    assert!(failed.is_err());
    assert_eq!(calls(&log), ["prepare_subagent_spawn", "rollback"]);
    let started: Result<(), &str> = host
        .spawn_subagent(
            SubagentSpawn::new("parent", "child", ContextMode::Isolated),
            async { Ok(()) },
        )
        .await
        .unwrap();
    assert!(started.is_ok());
    host.end_subagent("child", SubagentEndReason::Completed)
        .await
        .unwrap();
    assert_eq!(calls(&log), ["prepare_subagent_spawn", "on_subagent_ended"]);
}

#[tokio::test]
async fn legacy_serves_after_a_quarantine_mid_session_without_failing_the_turn() {
    let dir = TempDir::new().unwrap();
    let behaviour = Behaviour {
        fail: vec!["after_turn"],
        ..Behaviour::default()
    };
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, behaviour).await;
    let model = ScriptedModel::default();
    host.run_turn("k", AgentMessage::user_text("one"), &model)
        .await
        .unwrap();
    assert_eq!(host.engine().active_id(), LEGACY_ENGINE_ID);
    assert_eq!(
        host.registry().quarantines()[0].operation.as_str(),
        "afterTurn"
    );
    let report = host
        .run_turn("k", AgentMessage::user_text("two"), &model)
        .await
        .unwrap();
    assert_eq!(report.engine_id, LEGACY_ENGINE_ID);
    // The recorder saw the first turn's calls only.
    assert_eq!(calls(&log), ["assemble", "after_turn"]);
    // Legacy passed the host's history through: the model saw the first turn.
    let second = &model.requests.lock().unwrap()[1];
    assert_eq!(
        second
            .messages
            .iter()
            .map(AgentMessage::plain_text)
            .collect::<Vec<_>>(),
        ["one", "ok", "two"]
    );
}

#[tokio::test]
async fn host_requirements_fail_closed_before_the_turn() {
    let dir = TempDir::new().unwrap();
    write_config(
        dir.path(),
        r#"{ plugins: { slots: { contextEngine: "window" } } }"#,
    );
    let mut options = HostOptions::new(dir.path());
    options.profile = HostProfile::cli("claude-cli");
    let host = Host::open(options, |registry, _| {
        registry
            .register(
                "window",
                vilvona_core::registry::Owner::plugin("w"),
                vilvona_core::registry::engine_factory(|_| async {
                    let engine: Arc<dyn vilvona_core::ContextEngine> = Arc::new(RequiresAssemble);
                    Ok(engine)
                }),
            )
            .map_err(HostError::from)
    })
    .await
    .unwrap();
    let error = host
        .run_turn(
            "k",
            AgentMessage::user_text("hi"),
            &ScriptedModel::default(),
        )
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("cannot run operation \"agent-run\" on the CLI backend \"claude-cli\""),
        "{text}"
    );
    assert!(text.contains("Use the embedded host."), "{text}");
    assert!(
        host.registry().quarantines().is_empty(),
        "a host requirement failure is not a quarantine"
    );
    assert!(host.session("k").await.is_none(), "nothing started");
}

#[derive(Debug)]
struct RequiresAssemble;

#[async_trait::async_trait]
impl vilvona_core::ContextEngine for RequiresAssemble {
    fn info(&self) -> vilvona_core::EngineInfo {
        let mut info = vilvona_core::EngineInfo {
            id: "window".to_owned(),
            name: "Needs assembly".to_owned(),
            ..Default::default()
        };
        info.host_requirements.insert(
            vilvona_core::Operation::AgentRun,
            vilvona_core::HostRequirement {
                required_capabilities: [vilvona_core::Capability::AssembleBeforePrompt]
                    .into_iter()
                    .collect(),
                unsupported_message: Some("Use the embedded host.".to_owned()),
            },
        );
        info
    }
    async fn ingest(
        &self,
        _: &vilvona_core::IngestParams,
    ) -> Result<vilvona_core::IngestResult, vilvona_core::EngineError> {
        Ok(vilvona_core::IngestResult { ingested: false })
    }
    async fn assemble(
        &self,
        params: &vilvona_core::AssembleParams,
    ) -> Result<vilvona_core::AssembleResult, vilvona_core::EngineError> {
        Ok(vilvona_core::AssembleResult {
            messages: params.messages.clone(),
            ..Default::default()
        })
    }
    async fn compact(
        &self,
        _: &vilvona_core::CompactParams,
    ) -> Result<vilvona_core::CompactResult, vilvona_core::EngineError> {
        Ok(vilvona_core::CompactResult::unchanged(
            vilvona_core::CompactReason::Windowed,
            0,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_sessions_at_once_each_complete_and_in_order() {
    let dir = TempDir::new().unwrap();
    let (host, _, seen) = host_with(&dir, RECORDER_CONFIG, Behaviour::default()).await;
    let host = Arc::new(host);
    let mut tasks = Vec::new();
    for session in 0..16 {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            let model = ScriptedModel::default();
            for turn in 0..8 {
                host.run_turn(
                    &format!("s{session}"),
                    AgentMessage::user_text(format!("s{session} t{turn}")),
                    &model,
                )
                .await
                .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    for session in 0..16 {
        let record = host.session(&format!("s{session}")).await.unwrap();
        let view: Vec<&str> = seen
            .iter()
            .filter(|(id, _)| *id == record.session_id)
            .map(|(_, text)| text.as_str())
            .filter(|text| *text != "ok")
            .collect();
        let expected: Vec<String> = (0..8).map(|turn| format!("s{session} t{turn}")).collect();
        assert_eq!(view, expected, "session {session}: the engine's view");
        let transcript = read_transcript(&record.session_file).unwrap();
        let texts: Vec<String> = transcript
            .entries
            .iter()
            .filter_map(|located| match &located.entry {
                vilvona_transcript::Entry::Message(entry) => Some(entry.message.plain_text()),
                _ => None,
            })
            .filter(|text| text != "ok")
            .collect();
        assert_eq!(texts, expected, "session {session}: the transcript");
    }
}

#[tokio::test]
async fn legacy_auto_compaction_rotates_the_transcript_and_updates_sessions_json() {
    let dir = TempDir::new().unwrap();
    write_config(
        dir.path(),
        r#"{ agents: { defaults: { contextTokens: 4000, compaction: { reserveTokens: 1000, reserveTokensFloor: 0, keepRecentTokens: 600, truncateAfterCompaction: true } } } }"#,
    );
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    let model = ScriptedModel::default();
    let mut rotated = None;
    for turn in 0..40 {
        let text = format!(
            "Turn {turn}: please review crates/m{turn}/src/lib.rs. {}",
            "detail ".repeat(60)
        );
        host.run_turn("k", AgentMessage::user_text(text), &model)
            .await
            .unwrap();
        let record = host.session("k").await.unwrap();
        if record.compaction_count > 0 {
            rotated = Some(record);
            break;
        }
    }
    let record = rotated.expect("the built-in compaction ran");
    let first_file = dir.path().join("sessions");
    let files: Vec<_> = std::fs::read_dir(&first_file).unwrap().flatten().collect();
    assert_eq!(
        files.len(),
        2,
        "the old transcript stays, the successor is new"
    );
    let successor = read_transcript(&record.session_file).unwrap();
    assert_eq!(successor.header.id, record.session_id);
    assert!(successor.header.extra.contains_key("parentSession"));
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sessions.json")).unwrap())
            .unwrap();
    assert_eq!(stored["k"]["sessionId"], record.session_id);
    // The next turn continues on the successor.
    host.run_turn("k", AgentMessage::user_text("after rotation"), &model)
        .await
        .unwrap();
    let successor = read_transcript(&record.session_file).unwrap();
    assert!(successor.entries.iter().any(|l| matches!(&l.entry, vilvona_transcript::Entry::Message(m) if m.message.plain_text() == "after rotation")));
}

#[tokio::test]
async fn manual_compact_runs_on_the_active_engine() {
    let dir = TempDir::new().unwrap();
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, Behaviour::default()).await;
    let unknown = host.compact("nope", None).await.unwrap_err();
    assert_eq!(unknown.to_string(), "unknown session \"nope\"");
    host.run_turn(
        "k",
        AgentMessage::user_text("hi"),
        &ScriptedModel::default(),
    )
    .await
    .unwrap();
    calls(&log);
    let result = host
        .compact("k", Some("focus on the parser".to_owned()))
        .await
        .unwrap();
    assert!(result.compacted);
    assert_eq!(calls(&log), ["compact(force)", "maintain(compaction)"]);
    assert_eq!(host.session("k").await.unwrap().compaction_count, 1);
}

#[tokio::test]
async fn the_conformance_suite_runs_against_the_registered_legacy_engine() {
    let dir = TempDir::new().unwrap();
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    assert_eq!(host.engine().active_id(), LEGACY_ENGINE_ID);
    check_contract(
        &*host.engine().engine,
        &SessionFixture::new("runtime-legacy"),
        Expectations {
            stores_messages: false,
            passes_through: true,
        },
    )
    .await;
}

#[tokio::test]
async fn an_isolated_light_spawn_is_not_prepared() {
    let dir = TempDir::new().unwrap();
    let (host, log, _) = host_with(&dir, RECORDER_CONFIG, Behaviour::default()).await;
    let started: Result<(), &str> = host
        .spawn_subagent(
            SubagentSpawn {
                light_context: true,
                ..SubagentSpawn::new("parent", "child", ContextMode::Isolated)
            },
            async { Ok(()) },
        )
        .await
        .unwrap();
    assert!(started.is_ok());
    assert!(calls(&log).is_empty(), "{:?}", calls(&log));
}

/// The child's session is created before the spawn and its id reaches the engine: a forked
/// lossless child sees the parent's context in its own first turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_child_session_starts_from_the_parents_context() {
    let dir = TempDir::new().unwrap();
    write_config(
        dir.path(),
        r#"{ plugins: { slots: { contextEngine: "lossless" } } }"#,
    );
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    let model = ScriptedModel::new(vec![Ok("noted"), Ok("child reply")]);
    host.run_turn(
        "agent:main:parent",
        AgentMessage::user_text("Please remember: the fork marker is FORK-4411."),
        &model,
    )
    .await
    .unwrap();
    host.spawn_subagent(
        SubagentSpawn::new("agent:main:parent", "agent:main:child", ContextMode::Fork),
        async { Ok::<(), ()>(()) },
    )
    .await
    .unwrap()
    .unwrap();
    let child = host.session("agent:main:child").await.unwrap();
    host.run_turn(
        "agent:main:child",
        AgentMessage::user_text("What was the marker?"),
        &model,
    )
    .await
    .unwrap();
    assert_eq!(
        host.session("agent:main:child").await.unwrap().session_id,
        child.session_id
    );
    let requests = model.requests.lock().unwrap();
    let child_request = requests.last().unwrap();
    assert!(
        child_request
            .messages
            .iter()
            .any(|message| message.plain_text().contains("FORK-4411")),
        "the child's first request lacks the parent's context"
    );
}

/// The run's system prompt carries the workspace's bootstrap files under Project Context, each
/// capped and the total capped, with truncation marked; the skills list comes along.
#[tokio::test]
async fn turns_inject_the_workspace_bootstrap_files() {
    let dir = TempDir::new().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(workspace.join("skills/deploy")).unwrap();
    std::fs::write(workspace.join("AGENTS.md"), "Always run the tests.").unwrap();
    std::fs::write(workspace.join("SOUL.md"), "x".repeat(500)).unwrap();
    std::fs::write(
        workspace.join("skills/deploy/SKILL.md"),
        "---\nname: deploy\ndescription: Ship it blue-green\n---\nsteps\n",
    )
    .unwrap();
    write_config(
        dir.path(),
        &format!(
            r#"{{ agents: {{ defaults: {{ workspace: {:?}, bootstrapMaxChars: 300, bootstrapTotalMaxChars: 310 }} }} }}"#,
            workspace.display().to_string()
        ),
    );
    let host = Host::open(HostOptions::new(dir.path()), |_, _| Ok(()))
        .await
        .unwrap();
    let model = ScriptedModel::new(vec![Ok("done")]);
    host.run_turn("agent:main:ws", AgentMessage::user_text("hi"), &model)
        .await
        .unwrap();
    let requests = model.requests.lock().unwrap();
    let system = &requests[0].system_prompt;
    assert!(system.contains("# Project Context"), "{system}");
    assert!(system.contains("## AGENTS.md\nAlways run the tests."));
    // SOUL.md: 500 characters, capped by what the total leaves (310 − 21).
    assert!(
        system.contains("[SOUL.md truncated: 289 of 500 characters injected]"),
        "{system}"
    );
    assert!(system.contains("- deploy: Ship it blue-green"));
    assert!(system.contains(&format!("Working directory: {}", workspace.display())));
}
