//! The contract's lifecycle, checked against one engine instance.

use vilvona_core::engine::*;
use vilvona_core::host::{HostProfile, Operation, check_host_support};

use crate::{Expectations, Report, SessionFixture, check_tool_pairs, sample_conversation};

/// Runs every contract behaviour against `engine`. Panics with the list of broken expectations.
pub async fn check_contract(
    engine: &dyn ContextEngine,
    session: &SessionFixture,
    expect: Expectations,
) {
    let mut report = Report::default();
    let info = engine.info();
    report.check(!info.id.trim().is_empty(), || "info.id is empty".to_owned());
    report.check(!info.name.trim().is_empty(), || {
        "info.name is empty".to_owned()
    });
    for operation in Operation::ALL {
        if let Err(error) = check_host_support(
            &info.id,
            &info.host_requirements,
            operation,
            &HostProfile::embedded(),
        ) {
            report.failures.push(format!(
                "the embedded host must satisfy every operation: {error}"
            ));
        }
    }
    let engine_name = info.id.clone();

    match engine
        .bootstrap(&BootstrapParams {
            session_id: session.session_id.clone(),
            session_key: session.session_key.clone(),
            session_file: session.session_file.clone(),
        })
        .await
    {
        Ok(_) => {}
        Err(error) => report.failures.push(format!("bootstrap failed: {error}")),
    }

    let conversation = sample_conversation();
    report.check(conversation.len() == 4, || {
        "the sample conversation did not parse".to_owned()
    });
    for (index, message) in conversation.iter().enumerate() {
        let result = engine
            .ingest(&IngestParams {
                session_id: session.session_id.clone(),
                session_key: session.session_key.clone(),
                message: message.clone(),
                entry_id: Some(format!("entry-{index}")),
                is_heartbeat: false,
            })
            .await;
        match result {
            Ok(result) => report.check(result.ingested == expect.stores_messages, || {
                format!(
                    "ingest of message {index} returned ingested={} but the engine is expected to {}store",
                    result.ingested,
                    if expect.stores_messages { "" } else { "not " }
                )
            }),
            Err(error) => report.failures.push(format!("ingest of message {index} failed: {error}")),
        }
    }
    if expect.stores_messages {
        let repeat = engine
            .ingest(&IngestParams {
                session_id: session.session_id.clone(),
                session_key: session.session_key.clone(),
                message: conversation[0].clone(),
                entry_id: Some("entry-0".to_owned()),
                is_heartbeat: false,
            })
            .await;
        report.check(
            matches!(repeat, Ok(IngestResult { ingested: false })),
            || format!("re-ingesting the same entry must answer ingested=false, got {repeat:?}"),
        );
    }

    let budget = 100_000;
    match engine
        .assemble(&AssembleParams {
            session_id: session.session_id.clone(),
            session_key: session.session_key.clone(),
            messages: conversation.clone().into(),
            token_budget: Some(budget),
            ..AssembleParams::default()
        })
        .await
    {
        Ok(assembled) => {
            if expect.passes_through {
                report.check(assembled.messages == conversation, || {
                    "a pass-through engine must return the host's messages unchanged".to_owned()
                });
                report.check(assembled.estimated_tokens == 0, || {
                    format!(
                        "a pass-through engine reports estimated_tokens 0, got {}",
                        assembled.estimated_tokens
                    )
                });
            } else {
                report.check(!assembled.messages.is_empty(), || {
                    "assemble returned no messages after four were ingested".to_owned()
                });
                report.check(
                    assembled.estimated_tokens > 0 && assembled.estimated_tokens <= budget,
                    || {
                        format!(
                            "estimated_tokens must be in 1..={budget}, got {}",
                            assembled.estimated_tokens
                        )
                    },
                );
            }
            if let Err(problem) = check_tool_pairs(&assembled.messages) {
                report
                    .failures
                    .push(format!("assembled context breaks a tool pair: {problem}"));
            }
        }
        Err(error) => report.failures.push(format!("assemble failed: {error}")),
    }

    if let Err(error) = engine
        .after_turn(&AfterTurnParams {
            session_id: session.session_id.clone(),
            session_key: session.session_key.clone(),
            session_file: session.session_file.clone(),
            messages: conversation.clone().into(),
            entry_ids: (2..conversation.len())
                .map(|index| Some(format!("entry-{index}")))
                .collect(),
            pre_prompt_message_count: 2,
            token_budget: Some(budget),
            ..AfterTurnParams::default()
        })
        .await
    {
        report.failures.push(format!("after_turn failed: {error}"));
    }

    if let Err(error) = engine
        .maintain(&MaintainParams {
            session_id: session.session_id.clone(),
            session_key: session.session_key.clone(),
            session_file: session.session_file.clone(),
            reason: MaintainReason::Turn,
            ..MaintainParams::default()
        })
        .await
    {
        report.failures.push(format!("maintain failed: {error}"));
    }

    for force in [false, true] {
        let result = engine
            .compact(&CompactParams {
                session_id: session.session_id.clone(),
                session_key: session.session_key.clone(),
                session_file: session.session_file.clone(),
                token_budget: Some(budget),
                force,
                ..CompactParams::default()
            })
            .await;
        match result {
            Ok(result) => check_compact_result(&mut report, &result, force),
            Err(error) => report
                .failures
                .push(format!("compact(force={force}) failed: {error}")),
        }
    }

    match engine
        .prepare_subagent_spawn(&SubagentSpawnParams {
            parent_session_key: session
                .session_key
                .clone()
                .unwrap_or_else(|| session.session_id.clone()),
            child_session_key: format!("{}:child", session.session_id),
            context_mode: ContextMode::Isolated,
            parent_session_id: Some(session.session_id.clone()),
            ttl_ms: Some(60_000),
            ..SubagentSpawnParams::default()
        })
        .await
    {
        Ok(Some(rollback)) => {
            if let Err(error) = rollback.rollback().await {
                report
                    .failures
                    .push(format!("spawn rollback failed: {error}"));
            }
        }
        Ok(None) => {}
        Err(error) => report
            .failures
            .push(format!("prepare_subagent_spawn failed: {error}")),
    }
    if let Err(error) = engine
        .on_subagent_ended(&SubagentEndedParams {
            child_session_key: format!("{}:child", session.session_id),
            reason: SubagentEndReason::Completed,
        })
        .await
    {
        report
            .failures
            .push(format!("on_subagent_ended failed: {error}"));
    }

    if info
        .transcript_semantics
        .as_ref()
        .is_some_and(TranscriptSemantics::supports_durable_turns)
    {
        let params = CommitTurnParams {
            advancement_key: format!("{}:turn-1", session.session_id),
            session_id: session.session_id.clone(),
            session_key: session.session_key.clone(),
            messages: conversation.clone(),
            ..CommitTurnParams::default()
        };
        let first = engine.commit_turn(&params).await;
        report.check(
            matches!(
                first,
                Ok(CommitTurnResult {
                    status: CommitStatus::Committed
                })
            ),
            || format!("the first commit_turn of a key must be committed, got {first:?}"),
        );
        let second = engine.commit_turn(&params).await;
        report.check(
            matches!(
                second,
                Ok(CommitTurnResult {
                    status: CommitStatus::Duplicate
                })
            ),
            || format!("a repeated commit_turn key must be a duplicate, got {second:?}"),
        );
    }

    if let Err(error) = engine.dispose().await {
        report.failures.push(format!("dispose failed: {error}"));
    }
    report.finish(&format!("contract of engine \"{engine_name}\""));
}

fn check_compact_result(report: &mut Report, result: &CompactResult, force: bool) {
    report.check(!result.compacted || result.ok, || {
        format!("compact(force={force}): compacted=true requires ok=true")
    });
    if !result.compacted {
        report.check(result.reason.is_some(), || {
            format!("compact(force={force}): a call that compacted nothing must say why")
        });
    }
    if result.compacted {
        match &result.result {
            None => report.failures.push(format!(
                "compact(force={force}): compacted=true without result details"
            )),
            Some(details) => {
                if let Some(after) = details.tokens_after {
                    report.check(after < details.tokens_before, || {
                        format!(
                            "compact(force={force}): compacted=true but tokens went {} -> {after}",
                            details.tokens_before
                        )
                    });
                }
            }
        }
    }
}
