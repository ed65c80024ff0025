//! `plugins.entries.lossless.config`, with documented defaults and validation at factory time.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vilvona_core::registry::SettingsOrigin;
use vilvona_core::summarize::SummarizerConfig;
use vilvona_summarize::TokenizerKind;

/// Why `plugins.entries.lossless.config` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not the shape of the settings: an unknown key (with the nearest known one), a value of
    /// the wrong type.
    #[error("plugins.entries.lossless.config.{key}: {problem}")]
    Shape {
        /// The setting, by dotted path inside the settings (empty: the settings themselves).
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A setting breaks a rule.
    #[error("plugins.entries.lossless.config.{key} {rule}")]
    Invalid {
        /// The setting.
        key: &'static str,
        /// What it must be.
        rule: &'static str,
    },
}

impl ConfigError {
    /// The error with the key's file, line and column, when the host said where the settings
    /// were written.
    pub fn located(&self, origin: Option<&SettingsOrigin>) -> String {
        let Some(origin) = origin else {
            return self.to_string();
        };
        match self {
            ConfigError::Shape { key, problem } => format!("{}: {problem}", origin.describe(key)),
            ConfigError::Invalid { key, rule } => format!("{} {rule}", origin.describe(key)),
        }
    }

    /// What serde said, with the path of the key it was reading; an unknown key names the
    /// known key nearest to it.
    fn from_serde(error: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
        let path = error.path().to_string();
        let problem = error.inner().to_string();
        let unknown = problem
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split_once('`'));
        let (key, problem) = match unknown {
            Some((field, rest)) => {
                let known: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
                // The path ends at the unknown key, or (inside a tagged enum) at its object.
                let key = match path.as_str() {
                    "." | "" => field.to_owned(),
                    whole if whole == field || whole.ends_with(&format!(".{field}")) => {
                        whole.to_owned()
                    }
                    parent => format!("{parent}.{field}"),
                };
                let hint = match vilvona_core::suggest::nearest(field, known.iter().copied()) {
                    Some(near) => format!("; did you mean `{near}`?"),
                    None => format!("; known keys here: {}", known.join(", ")),
                };
                (key, format!("is not a setting{hint}"))
            }
            None => (if path == "." { String::new() } else { path }, problem),
        };
        ConfigError::Shape { key, problem }
    }
}

/// Where the history is kept (`plugins.entries.lossless.config.store`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreSelection {
    /// The embedded store: a SQLite database and a tantivy index in a directory.
    Sqlite {
        /// The directory (else `storeDir`, else `<agent dir>/lossless`).
        #[serde(default)]
        dir: Option<String>,
    },
    /// A PostgreSQL database, shared by every gateway that names it.
    Postgres {
        /// A connection string: `postgres://user:password@host:port/db`, or
        /// `host=/run/postgresql dbname=vilvona` (key-value; `host` may be a socket directory).
        url: String,
    },
}

/// The engine's settings. Every field has a default; unknown keys are an error (a typo should
/// not silently fall back to a default).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LosslessConfig {
    /// Compact after a turn when the context exceeds this share of the budget.
    pub context_threshold: f64,
    /// Compact down to this share of the budget.
    pub target_ratio: f64,
    /// Newest messages never compacted in routine passes.
    pub fresh_tail_count: usize,
    /// Optional token cap on the fresh tail.
    pub fresh_tail_max_tokens: Option<u64>,
    /// The fresh tail takes at most this share of the context's planned room, at least the
    /// newest unit: routine compaction always has older material to take. None: see
    /// [`LosslessConfig::fresh_tail_ratio`].
    pub fresh_tail_ratio: Option<f64>,
    /// Largest run of raw messages summarized into one leaf.
    pub leaf_chunk_tokens: u64,
    /// What a leaf summary should not exceed, in tokens.
    pub leaf_target_tokens: u64,
    /// What a condensed summary should not exceed, in tokens.
    pub condensed_target_tokens: u64,
    /// Fewest same-depth summaries condensed into one node.
    pub condensed_min_fanout: usize,
    /// The deepest summary level condensation may build (none: unbounded).
    pub max_depth: Option<u32>,
    /// Summarizer passes allowed per call.
    pub max_passes_per_turn: u32,
    /// Target of the deterministic truncation fallback.
    pub fallback_max_tokens: u64,
    /// A tool result above this many tokens is stored once as a blob and shown by reference.
    pub large_content_threshold_tokens: u64,
    /// Largest result of one `vilvona_expand` call.
    pub max_expand_tokens: u64,
    /// Budget when the host gives none.
    pub default_token_budget: u64,
    /// Wall-clock limit of one compaction call, in milliseconds, checked between passes: a
    /// call that needs compaction always makes its first pass, so it never returns without
    /// progress only because the machine was slow to reach it.
    pub deadline_ms: u64,
    /// How tokens are counted (the heuristic, or an embedded BPE vocabulary).
    pub tokenizer: TokenizerKind,
    /// A factor applied to every count (to match a provider's own tokenizer).
    pub tokenizer_multiplier: f64,
    /// The agent whose conversations this engine serves.
    pub agent_id: String,
    /// Let recall reach this agent's other conversations (not just this session's family).
    pub recall_all_conversations: bool,
    /// Other agents whose conversations recall may read.
    pub recall_agents: Vec<String>,
    /// Where the store lives; default `<agent dir>/lossless`.
    pub store_dir: Option<String>,
    /// Which backend keeps the history: `{kind: "sqlite", dir?}` (the default: SQLite and a
    /// tantivy index in `storeDir`) or `{kind: "postgres", url}` (a PostgreSQL database that
    /// several gateways share).
    pub store: Option<StoreSelection>,
    /// The summarizer (`{kind: "extractive"}`, `{kind: "host"}` or a model), built by the
    /// host that registers the engine.
    pub summarizer: Option<SummarizerConfig>,
    /// Archiving, deleting and the size cap, applied by `vilvona retention` and (at most once
    /// a day) by `maintain`.
    pub retention: RetentionPolicy,
    /// What embeds messages and summaries for recall by meaning: `{kind: "builtin"}` (the
    /// default: the static model in the binary, no network), `{kind: "file", path}` (a model
    /// file of the same format) or `{kind: "none"}`.
    pub embedding: EmbeddingSelection,
    /// What the history holds about each new user turn, brought into its prompt at assembly
    /// (see `crate::recall`).
    pub assembly_recall: AssemblyRecall,
}

/// `plugins.entries.lossless.config.assemblyRecall`: for each new user turn (the host's
/// `prompt`), the history beyond the assembled context is searched and the best few excerpts
/// are added to the prompt as one block after the context.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AssemblyRecall {
    /// Where it searches: `off`, `session` (this session), `key` (the session key's sessions,
    /// earlier ones after a reset too, and what a spawned child's grants reach: the recall
    /// tools' reach; the default) or `agent` (every session of the agent).
    pub scope: RecallScope,
    /// The block's tokens at most (counted inside the prompt's budget).
    pub max_tokens: u64,
    /// Excerpts at most.
    pub max_items: usize,
}

/// Where recall at assembly searches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecallScope {
    /// Nothing is recalled at assembly.
    Off,
    /// This session's history.
    Session,
    /// The recall tools' reach: the session key's sessions and the grants.
    #[default]
    Key,
    /// Every session of the agent.
    Agent,
}

impl Default for AssemblyRecall {
    fn default() -> AssemblyRecall {
        AssemblyRecall {
            scope: RecallScope::Key,
            max_tokens: 600,
            max_items: 10,
        }
    }
}

/// `plugins.entries.lossless.config.embedding`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum EmbeddingSelection {
    /// The static model built into the binary.
    #[default]
    Builtin,
    /// A static model file (safetensors, as `scripts/convert-embedding-model.py` writes).
    File {
        /// The file.
        path: String,
    },
    /// No vectors: semantic search is refused, hybrid search is text search.
    None,
    /// An OpenAI-compatible `/embeddings` endpoint; documents are embedded in the background.
    #[serde(rename = "openai", rename_all = "camelCase")]
    OpenAi {
        /// The endpoint's base URL (`…/v1`).
        base_url: String,
        /// The model asked.
        model: String,
        /// The environment variable holding the API key.
        #[serde(default)]
        api_key_env: Option<String>,
        /// Dimensions asked for (models that can shorten their vectors).
        #[serde(default)]
        dimensions: Option<usize>,
        /// Texts per request at most.
        #[serde(default = "default_embedding_batch")]
        batch_size: usize,
        /// Time limit of one request.
        #[serde(default = "default_embedding_timeout_ms")]
        timeout_ms: u64,
        /// Retries of a failing request.
        #[serde(default = "default_embedding_retries")]
        retries: u32,
        /// The first retry's wait, doubled each time.
        #[serde(default = "default_embedding_backoff_ms")]
        backoff_ms: u64,
        /// How long refused credentials stop requests.
        #[serde(default = "default_embedding_cooldown_ms")]
        auth_cooldown_ms: u64,
    },
}

fn default_embedding_batch() -> usize {
    64
}
fn default_embedding_timeout_ms() -> u64 {
    30_000
}
fn default_embedding_retries() -> u32 {
    2
}
fn default_embedding_backoff_ms() -> u64 {
    500
}
fn default_embedding_cooldown_ms() -> u64 {
    300_000
}

impl Default for LosslessConfig {
    fn default() -> LosslessConfig {
        LosslessConfig {
            context_threshold: 0.95,
            target_ratio: 0.2,
            fresh_tail_count: 64,
            fresh_tail_max_tokens: None,
            fresh_tail_ratio: None,
            leaf_chunk_tokens: 20_000,
            leaf_target_tokens: 2_400,
            condensed_target_tokens: 2_000,
            condensed_min_fanout: 4,
            max_depth: None,
            max_passes_per_turn: 8,
            fallback_max_tokens: 512,
            large_content_threshold_tokens: 25_000,
            max_expand_tokens: 4_000,
            default_token_budget: 128_000,
            deadline_ms: 30_000,
            tokenizer: TokenizerKind::Heuristic,
            tokenizer_multiplier: 1.0,
            agent_id: "main".to_owned(),
            recall_all_conversations: false,
            recall_agents: Vec::new(),
            store_dir: None,
            store: None,
            summarizer: None,
            retention: RetentionPolicy::default(),
            embedding: EmbeddingSelection::default(),
            assembly_recall: AssemblyRecall::default(),
        }
    }
}

impl LosslessConfig {
    /// The share of the planned room the fresh tail takes at most: `freshTailRatio`, else a tenth
    /// with a model summarizer and a quarter with the extractive one. Each fold sends the tail it
    /// keeps to the provider again, uncached; a model's folds wait for the call that brings it and
    /// come a turn's growth later, with a tail that much larger: measured in a real gateway (the
    /// soak with `--summarizer host`), the host's model cost 0.97× legacy with a quarter, 0.88×
    /// with a tenth; the extractive summarizer costs the same with either.
    pub fn fresh_tail_ratio(&self) -> f64 {
        self.fresh_tail_ratio.unwrap_or(match self.summarizer {
            Some(SummarizerConfig::Host | SummarizerConfig::OpenAi { .. }) => 0.1,
            _ => 0.25,
        })
    }

    /// Parses and validates; the error names the key and what is wrong with it.
    pub fn from_value(value: Option<&Value>) -> Result<LosslessConfig, ConfigError> {
        let config: LosslessConfig = match value {
            None | Some(Value::Null) => LosslessConfig::default(),
            Some(value) => {
                serde_path_to_error::deserialize(value.clone()).map_err(ConfigError::from_serde)?
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the rules between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problem =
            |key: &'static str, rule: &'static str| Err(ConfigError::Invalid { key, rule });
        if !(self.context_threshold > 0.0 && self.context_threshold <= 1.0) {
            return problem("contextThreshold", "must be in (0, 1]");
        }
        if !(self.target_ratio > 0.0 && self.target_ratio < self.context_threshold) {
            return problem("targetRatio", "must be positive and below contextThreshold");
        }
        if self
            .fresh_tail_ratio
            .is_some_and(|ratio| !(ratio > 0.0 && ratio <= 1.0))
        {
            return problem("freshTailRatio", "must be in (0, 1]");
        }
        if self.leaf_chunk_tokens == 0
            || self.leaf_target_tokens == 0
            || self.condensed_target_tokens == 0
        {
            return problem(
                "leafChunkTokens/leafTargetTokens/condensedTargetTokens",
                "must be positive",
            );
        }
        if self.leaf_target_tokens >= self.leaf_chunk_tokens {
            return problem("leafTargetTokens", "must be below leafChunkTokens");
        }
        if self.condensed_min_fanout < 2 {
            return problem("condensedMinFanout", "must be at least 2");
        }
        if self.max_passes_per_turn == 0 {
            return problem("maxPassesPerTurn", "must be at least 1");
        }
        if self.fallback_max_tokens == 0
            || self.default_token_budget == 0
            || self.max_expand_tokens == 0
        {
            return problem(
                "fallbackMaxTokens/defaultTokenBudget/maxExpandTokens",
                "must be positive",
            );
        }
        if let Some(StoreSelection::Postgres { url }) = &self.store
            && url.trim().is_empty()
        {
            return problem("store.url", "must name a PostgreSQL database");
        }
        if self.agent_id.trim().is_empty() {
            return problem("agentId", "must not be empty");
        }
        if let (Some(archive), Some(delete)) = (
            self.retention.archive_after_days,
            self.retention.delete_after_days,
        ) && delete <= archive
        {
            return problem(
                "retention.deleteAfterDays",
                "must be more than retention.archiveAfterDays",
            );
        }
        if self
            .retention
            .max_store_mb
            .is_some_and(|cap| cap.is_nan() || cap <= 0.0)
        {
            return problem("retention.maxStoreMb", "must be positive");
        }
        Ok(())
    }
}

/// `retention` in the lossless entry's config. Every limit is optional; none set, nothing
/// happens.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RetentionPolicy {
    /// Archive sessions with no message for this many days: their rows leave the recall index
    /// (searches still find them, reading the database); a new message makes them live again.
    pub archive_after_days: Option<u64>,
    /// Delete sessions with no message for this many days, with everything derived from them.
    pub delete_after_days: Option<u64>,
    /// Keep the store (database and index) under this many megabytes (10^6 bytes).
    pub max_store_mb: Option<f64>,
    /// What the size cap does to the least recently active sessions.
    pub over_cap: OverCap,
}

/// What the size cap does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OverCap {
    /// Archive (drops their index documents) and, if that is not enough, delete.
    Archive,
    /// Delete them, least recently active first (the default).
    #[default]
    Delete,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(settings: Value) -> String {
        let origin = SettingsOrigin {
            file: "/state/vilvona.json5".into(),
            key: "plugins.entries.lossless.config".to_owned(),
            positions: [
                ("freshTailCount".to_owned(), (5, 29)),
                ("freshTailCont".to_owned(), (5, 29)),
                ("retention.maxStoreMB".to_owned(), (6, 40)),
            ]
            .into(),
        };
        match LosslessConfig::from_value(Some(&settings)) {
            Ok(_) => panic!("{settings} was accepted"),
            Err(error) => error.located(Some(&origin)),
        }
    }

    /// An error names the whole key path, where it is written, and — for a slip of the
    /// keyboard — the key that was meant.
    #[test]
    fn errors_name_the_key_its_place_and_the_nearest_known_key() {
        for (settings, said) in [
            (
                json!({"freshTailCount": "many"}),
                "plugins.entries.lossless.config.freshTailCount (/state/vilvona.json5:5:29): invalid type: string \"many\", expected usize",
            ),
            (
                json!({"freshTailCont": 8}),
                "plugins.entries.lossless.config.freshTailCont (/state/vilvona.json5:5:29): is not a setting; did you mean `freshTailCount`?",
            ),
            (
                json!({"retention": {"maxStoreMB": 10}}),
                "plugins.entries.lossless.config.retention.maxStoreMB (/state/vilvona.json5:6:40): is not a setting; did you mean `maxStoreMb`?",
            ),
            (
                json!({"store": {"kind": "sqlite", "dri": "/x"}}),
                "plugins.entries.lossless.config.store.dri (/state/vilvona.json5): is not a setting; did you mean `dir`?",
            ),
            (
                json!({"summarizer": {"kind": "openai", "baseUrl": "http://x/v1", "model": "m", "fallbackModel": ["n"]}}),
                "plugins.entries.lossless.config.summarizer.fallbackModel (/state/vilvona.json5): is not a setting; did you mean `fallbackModels`?",
            ),
            (
                json!({"completelyDifferent": 1}),
                "plugins.entries.lossless.config.completelyDifferent (/state/vilvona.json5): is not a setting; known keys here: contextThreshold,",
            ),
            (
                json!({"contextThreshold": 2.0}),
                "plugins.entries.lossless.config.contextThreshold (/state/vilvona.json5) must be in (0, 1]",
            ),
        ] {
            let error = refused(settings.clone());
            assert!(error.starts_with(said), "{settings}: {error}");
        }
    }
}
