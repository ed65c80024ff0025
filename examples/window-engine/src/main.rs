//! `window-demo`: selects the sliding-window engine through the `contextEngine` slot and drives
//! a synthetic coding session through it, printing what the model would see each turn.

use serde_json::json;
use vilvona_core::*;

fn turn(index: usize) -> Vec<AgentMessage> {
    let call_id = format!("call_{index}");
    let values = [
        json!({"role": "user", "content": format!("Turn {index}: run the tests for crates/store and fix what fails."), "timestamp": 1_772_442_351_000_i64 + index as i64 * 60_000}),
        json!({"role": "assistant", "content": [{"type": "toolCall", "id": call_id, "name": "exec", "arguments": {"command": "cargo test -p vilvona-store"}}], "stopReason": "toolUse"}),
        json!({"role": "toolResult", "toolCallId": call_id, "toolName": "exec", "content": [{"type": "text", "text": "test store::reopen ... ok\n".repeat(40)}], "isError": false}),
        json!({"role": "assistant", "content": [{"type": "text", "text": format!("All store tests pass after turn {index}.")}], "stopReason": "stop"}),
    ];
    values
        .into_iter()
        .filter_map(|value| serde_json::from_value(value).ok())
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Registry::new();
    window_engine::register(&registry)?;

    let mut selection = EngineSelection::slot(window_engine::ENGINE_ID);
    selection.entries.insert(
        window_engine::PLUGIN_ID.to_owned(),
        EntrySettings {
            enabled: Some(true),
            config: Some(json!({"defaultTokenBudget": 2_000})),
            ..EntrySettings::default()
        },
    );
    // A host resolves the slot behind its quarantine guard, with its own `legacy` engine as
    // the fallback; this demo has no host, so it creates the selected engine directly.
    let engine = registry.instantiate(&selection).await?;
    let info = engine.info();
    println!(
        "slot contextEngine = {:?} -> {} ({}), owns compaction: {}",
        window_engine::ENGINE_ID,
        info.id,
        info.name,
        info.owns_compaction
    );

    let budget = 2_000;
    let mut history = Vec::new();
    for index in 0..12 {
        let mut messages = turn(index).into_iter();
        let pre_prompt_message_count = history.len();
        // Assemble as the host does before calling the model: the history plus the new prompt.
        history.extend(messages.next());
        let assembled = engine
            .assemble(&AssembleParams {
                session_id: "demo".to_owned(),
                messages: history.clone().into(),
                token_budget: Some(budget),
                ..AssembleParams::default()
            })
            .await?;
        // The model's reply and tool loop, then the post-turn call.
        history.extend(messages);
        engine
            .after_turn(&AfterTurnParams {
                session_id: "demo".to_owned(),
                messages: history.clone().into(),
                pre_prompt_message_count,
                token_budget: Some(budget),
                ..AfterTurnParams::default()
            })
            .await?;
        println!(
            "turn {index:>2}: history {:>3} messages, model sees {:>2} messages ≈ {:>4} tokens of {budget}",
            history.len(),
            assembled.messages.len(),
            assembled.estimated_tokens
        );
    }
    let compacted = engine
        .compact(&CompactParams {
            session_id: "demo".to_owned(),
            token_budget: Some(budget),
            force: true,
            ..CompactParams::default()
        })
        .await?;
    println!("/compact -> {}", serde_json::to_string(&compacted)?);
    println!(
        "quarantines: {}",
        serde_json::to_string(&registry.quarantines())?
    );
    Ok(())
}
