//! The JSON5 configuration.

use std::path::Path;

use tempfile::TempDir;
use vilvona_core::registry::FailurePolicy;
use vilvona_runtime::config::{HostConfig, PruningMode};
use vilvona_runtime::reset_context_engine_slot;

const FULL: &str = r#"// vilvona configuration
{
  plugins: {
    slots: { contextEngine: "lossless", memory: "notes" },
    entries: {
      lossless: { enabled: true, config: { freshTailCount: 32, summarizer: { kind: "extractive" } } },
      other: { enabled: false },
    },
    contextEngineFailurePolicy: "strict",
  },
  agents: {
    defaults: {
      contextTokens: 64000,
      compaction: { reserveTokens: 8000, reserveTokensFloor: 12000, keepRecentTokens: 9000, truncateAfterCompaction: true },
      contextPruning: { mode: "cache-ttl", softTrimRatio: 0.25, hardClearRatio: 0.6, minPrunableToolChars: 1000,
                        keepLastAssistants: 2, softTrim: { maxChars: 3000, headChars: 100, tailChars: 200 },
                        hardClear: { placeholder: "[cleared]" } },
      model: { primary: "local/mock-1" },
    },
  },
  models: { providers: { local: { baseUrl: "http://127.0.0.1:9/v1", apiKey: "k", models: [{ id: "mock-1", contextWindow: 32000 }] } } },
  surprise: 1,
  plugins2: { x: 1 },
}
"#;

#[test]
fn every_key_is_read() {
    let config = HostConfig::parse(FULL, Path::new("vilvona.json5")).unwrap();
    assert_eq!(config.context_engine_slot.as_deref(), Some("lossless"));
    assert_eq!(config.memory_slot.as_deref(), Some("notes"));
    assert_eq!(config.failure_policy, FailurePolicy::Strict);
    assert_eq!(config.entries["lossless"].enabled, Some(true));
    assert_eq!(
        config.entries["lossless"].config.as_ref().unwrap()["freshTailCount"],
        32
    );
    assert_eq!(config.entries["other"].enabled, Some(false));
    assert_eq!(config.context_tokens, Some(64_000));
    assert_eq!(config.compaction.reserve_tokens, 8_000);
    assert_eq!(config.compaction.reserve_tokens_floor, 12_000);
    assert_eq!(config.compaction.keep_recent_tokens, 9_000);
    assert!(config.compaction.truncate_after_compaction);
    assert_eq!(config.pruning.mode, PruningMode::CacheTtl);
    assert_eq!(config.pruning.soft_trim_ratio, 0.25);
    assert_eq!(config.pruning.hard_clear_ratio, 0.6);
    assert_eq!(config.pruning.min_prunable_tool_chars, 1_000);
    assert_eq!(config.pruning.keep_last_assistants, 2);
    assert_eq!(
        (
            config.pruning.soft_trim_max_chars,
            config.pruning.soft_trim_head_chars,
            config.pruning.soft_trim_tail_chars
        ),
        (3_000, 100, 200)
    );
    assert_eq!(config.pruning.hard_clear_placeholder, "[cleared]");
    let model = config.model.clone().unwrap();
    assert_eq!(
        (
            model.base_url.as_str(),
            model.model.as_str(),
            model.api_key.as_deref()
        ),
        ("http://127.0.0.1:9/v1", "mock-1", Some("k"))
    );
    // The model's window wins over contextTokens; the reserve is raised to the floor.
    assert_eq!(config.context_window(), 32_000);
    assert_eq!(config.reserve_tokens(32_000), 12_000);
    assert_eq!(
        config.reserve_tokens(16_000),
        8_000,
        "capped at half a small window"
    );
    assert_eq!(config.unknown_keys, ["plugins2", "surprise"]);
}

#[test]
fn defaults_apply_without_a_file() {
    let dir = TempDir::new().unwrap();
    let config = HostConfig::load(&dir.path().join("missing.json5")).unwrap();
    assert_eq!(config.context_engine_slot, None);
    assert_eq!(config.context_window(), 200_000);
    assert_eq!(config.compaction.keep_recent_tokens, 20_000);
    assert_eq!(config.reserve_tokens(200_000), 20_000);
    assert_eq!(config.pruning.mode, PruningMode::Off);
    assert_eq!(config.failure_policy, FailurePolicy::Fallback);
}

#[test]
fn a_malformed_file_names_line_and_column() {
    let text = "{\n  plugins: {\n    slots: { contextEngine: \"lossless\" ,, }\n  }\n}\n";
    let error = HostConfig::parse(text, Path::new("/state/vilvona.json5")).unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("/state/vilvona.json5:3:"), "{message}");
    let invalid = HostConfig::parse(
        r#"{ plugins: { contextEngineFailurePolicy: "loud" } }"#,
        Path::new("c.json5"),
    )
    .unwrap_err();
    assert_eq!(
        invalid.to_string(),
        "c.json5:1:14: `plugins.contextEngineFailurePolicy` must be \"fallback\" or \"strict\", not \"loud\""
    );
    let negative = HostConfig::parse(
        r#"{ agents: { defaults: { contextTokens: -5 } } }"#,
        Path::new("c.json5"),
    )
    .unwrap_err();
    assert!(
        negative
            .to_string()
            .contains("`agents.defaults.contextTokens` must be a whole number"),
        "{negative}"
    );
}

/// A file that ends inside an object says so at its end, and names the object left open and
/// where it was opened (json5 alone points at the opening brace as if it were the mistake).
#[test]
fn a_file_that_ends_too_soon_names_what_was_left_open() {
    let text = "{\n  plugins: {\n    slots: { contextEngine: \"lossless\" },\n  agents: { defaults: { contextTokens: 32000 } },\n";
    let error = HostConfig::parse(text, Path::new("/state/vilvona.json5")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "/state/vilvona.json5:5:1: the file ends inside the object (`plugins`) opened at line 2, column 12: a closing `}` is missing"
    );
}

/// Every key's line and column is known, for any error that names a key.
#[test]
fn keys_are_placed_by_line_and_column() {
    let config = HostConfig::parse(FULL, Path::new("/state/vilvona.json5")).unwrap();
    assert_eq!(
        config.place_of("plugins.slots.contextEngine"),
        "/state/vilvona.json5:4:14"
    );
    assert_eq!(config.place_of("surprise"), "/state/vilvona.json5:22:3");
    assert_eq!(config.place_of("not.written"), "/state/vilvona.json5");
    let origin = config.entries["lossless"].origin.clone().unwrap();
    assert_eq!(origin.key, "plugins.entries.lossless.config");
    assert_eq!(
        origin.describe("freshTailCount"),
        "plugins.entries.lossless.config.freshTailCount (/state/vilvona.json5:6:44)"
    );
    assert_eq!(
        vilvona_runtime::config::known_key_near("agents.defaults.contextTokns").as_deref(),
        Some("agents.defaults.contextTokens")
    );
    assert_eq!(vilvona_runtime::config::known_key_near("surprise"), None);
}

/// A comment that mentions the key is not the key: the edit changes the value the file sets,
/// and the comment stays as written.
#[test]
fn uninstalling_edits_the_key_not_a_comment_that_mentions_it() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("vilvona.json5");
    let text = "{\n  plugins: {\n    slots: {\n      // was: contextEngine: \"x\"\n      /* contextEngine: 'lossless' */ contextEngine: 'lossless',\n    },\n  },\n}\n";
    std::fs::write(&path, text).unwrap();
    assert!(reset_context_engine_slot(&path, "lossless").unwrap());
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text.replace(
            "*/ contextEngine: 'lossless'",
            "*/ contextEngine: \"legacy\""
        )
    );
}

#[test]
fn uninstalling_resets_the_slot_and_keeps_everything_else() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("vilvona.json5");
    std::fs::write(&path, FULL).unwrap();
    assert!(!reset_context_engine_slot(&path, "something-else").unwrap());
    assert!(reset_context_engine_slot(&path, "lossless").unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text,
        FULL.replace(r#"contextEngine: "lossless""#, r#"contextEngine: "legacy""#)
    );
    let config = HostConfig::parse(&text, &path).unwrap();
    assert_eq!(config.context_engine_slot.as_deref(), Some("legacy"));
    assert_eq!(
        config.entries["lossless"].config.as_ref().unwrap()["freshTailCount"],
        32
    );
}
