//! Session pruning trims old tool results in the prompt only.

use serde_json::json;
use vilvona_core::message::AgentMessage;
use vilvona_runtime::config::{PruningConfig, PruningMode};
use vilvona_runtime::pruning::prune_tool_results;

fn message(value: serde_json::Value) -> AgentMessage {
    serde_json::from_value(value).unwrap()
}

fn conversation(result_chars: usize, turns: usize) -> Vec<AgentMessage> {
    let mut messages = vec![message(json!({"role": "user", "content": "start"}))];
    for turn in 0..turns {
        messages.push(message(json!({"role": "assistant", "content": [{"type": "toolCall", "id": format!("c{turn}"), "name": "read", "arguments": {}}]})));
        messages.push(message(json!({"role": "toolResult", "toolCallId": format!("c{turn}"), "toolName": "read", "content": [{"type": "text", "text": format!("H{}T", "x".repeat(result_chars))}]})));
    }
    messages
}

fn cache_ttl() -> PruningConfig {
    PruningConfig {
        mode: PruningMode::CacheTtl,
        ..PruningConfig::default()
    }
}

#[test]
fn off_by_default() {
    let mut messages = conversation(10_000, 6);
    let before = messages.clone();
    let report = prune_tool_results(&mut messages, &PruningConfig::default(), 20_000);
    assert_eq!(report.soft_trimmed + report.hard_cleared, 0);
    assert_eq!(messages, before);
}

#[test]
fn soft_trim_keeps_head_and_tail_and_protects_the_last_assistants() {
    // 6 results of 10k chars in a 40k-token window: ratio ≈ 0.375, soft trim only.
    let mut messages = conversation(10_000, 6);
    let report = prune_tool_results(&mut messages, &cache_ttl(), 40_000);
    assert_eq!(
        report.soft_trimmed, 3,
        "results after the last 3 assistant messages are protected"
    );
    let trimmed = messages[2].plain_text();
    assert!(
        trimmed.starts_with("Hxxx")
            && trimmed.contains("\n...\n")
            && trimmed.contains("xT\n[tool result trimmed from 10002 characters]")
    );
    assert_eq!(trimmed.chars().filter(|c| *c == 'x').count(), 1_499 + 1_499);
    assert_eq!(
        messages[12].plain_text().len(),
        10_002,
        "the newest result is untouched"
    );
}

#[test]
fn hard_clear_replaces_the_oldest_once_enough_is_prunable() {
    let mut messages = conversation(20_000, 8);
    let report = prune_tool_results(&mut messages, &cache_ttl(), 40_000);
    assert!(report.hard_cleared >= 1, "{report:?}");
    assert_eq!(
        messages[2].plain_text(),
        "[Old tool result content cleared]"
    );
    assert_eq!(messages[16].plain_text().len(), 20_002);
}

mod memory {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use vilvona_runtime::memory::{MemoryProvider, build_memory_system_prompt_addition};

    #[derive(Debug)]
    struct Notes;

    impl MemoryProvider for Notes {
        fn id(&self) -> &str {
            "notes"
        }
        fn prompt_section(&self, tools: &BTreeSet<String>, citations: Option<&str>) -> Vec<String> {
            if !tools.contains("memory_search") {
                return Vec::new();
            }
            vec![
                "Search memory with memory_search.".to_owned(),
                format!("Citations: {}", citations.unwrap_or("off")),
            ]
        }
    }

    #[test]
    fn the_memory_addition_comes_from_the_active_provider() {
        let provider: Arc<dyn MemoryProvider> = Arc::new(Notes);
        let tools: BTreeSet<String> = ["memory_search".to_owned()].into_iter().collect();
        assert_eq!(
            build_memory_system_prompt_addition(Some(&provider), &tools, Some("inline")).as_deref(),
            Some("Search memory with memory_search.\nCitations: inline")
        );
        assert_eq!(
            build_memory_system_prompt_addition(Some(&provider), &BTreeSet::new(), None),
            None
        );
        assert_eq!(
            build_memory_system_prompt_addition(None, &tools, None),
            None,
            "no provider configured: nothing added"
        );
    }

    /// The active provider's section reaches the engine on every assembly, with the citation
    /// mode from `memory.citations`; legacy places it in the system prompt.
    #[tokio::test]
    async fn the_memory_section_reaches_the_engine() {
        use vilvona_core::message::AgentMessage;
        use vilvona_runtime::{Host, HostOptions, ToolSpec};

        use crate::support::{ScriptedModel, write_config};

        let dir = tempfile::TempDir::new().unwrap();
        write_config(
            dir.path(),
            r#"{ plugins: { slots: { memory: "notes" } }, memory: { citations: "on" } }"#,
        );
        let mut options = HostOptions::new(dir.path());
        options.tools.push(ToolSpec {
            name: "memory_search".to_owned(),
            description: "Search memory".to_owned(),
            parameters: serde_json::json!({"type": "object"}),
        });
        let mut host = Host::open(options, |_, _| Ok(())).await.unwrap();
        host.set_memory_provider(Arc::new(Notes));
        let model = ScriptedModel::new(vec![Ok("ok")]);
        host.run_turn("agent:main:m", AgentMessage::user_text("hi"), &model)
            .await
            .unwrap();
        let system = model.requests.lock().unwrap()[0].system_prompt.clone();
        assert!(
            system.contains("Search memory with memory_search.\nCitations: on"),
            "{system}"
        );
    }
}
