//! The host configuration: a JSON5 file with OpenClaw's keys.
//!
//! Only this module knows the file format. Everything else receives typed values. Unknown keys
//! are collected for doctor, never fatal; a malformed file is an error naming file, line and
//! column.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vilvona_core::registry::{EngineSelection, EntrySettings, FailurePolicy, SettingsOrigin};

use crate::json5_layout;
use crate::workspace::BootstrapLimits;

/// The default window when neither the model nor the config gives one (OpenClaw's).
pub const DEFAULT_CONTEXT_TOKENS: u64 = 200_000;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// A key's value breaks a rule; `place` is `FILE:LINE:COLUMN` of the key (or `FILE`).
    #[error("{place}: `{key}` {problem}")]
    Invalid {
        place: String,
        key: String,
        problem: String,
    },
}

/// `agents.defaults.compaction`.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionConfig {
    pub reserve_tokens: u64,
    pub reserve_tokens_floor: u64,
    pub keep_recent_tokens: u64,
    pub truncate_after_compaction: bool,
}

impl Default for CompactionConfig {
    fn default() -> CompactionConfig {
        CompactionConfig {
            reserve_tokens: 16_384,
            reserve_tokens_floor: 20_000,
            keep_recent_tokens: 20_000,
            truncate_after_compaction: false,
        }
    }
}

/// `agents.defaults.contextPruning.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PruningMode {
    #[default]
    Off,
    CacheTtl,
}

/// `agents.defaults.contextPruning`, with OpenClaw's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct PruningConfig {
    pub mode: PruningMode,
    pub soft_trim_ratio: f64,
    pub hard_clear_ratio: f64,
    pub soft_trim_max_chars: usize,
    pub soft_trim_head_chars: usize,
    pub soft_trim_tail_chars: usize,
    pub min_prunable_tool_chars: usize,
    pub keep_last_assistants: usize,
    pub hard_clear_placeholder: String,
}

impl Default for PruningConfig {
    fn default() -> PruningConfig {
        PruningConfig {
            mode: PruningMode::Off,
            soft_trim_ratio: 0.3,
            hard_clear_ratio: 0.5,
            soft_trim_max_chars: 4_000,
            soft_trim_head_chars: 1_500,
            soft_trim_tail_chars: 1_500,
            min_prunable_tool_chars: 50_000,
            keep_last_assistants: 3,
            hard_clear_placeholder: "[Old tool result content cleared]".to_owned(),
        }
    }
}

/// The model the host calls (`models.providers.<id>` and `agents.defaults.model.primary`, or
/// the flat `model` block).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub api_key_env: Option<String>,
    pub timeout_ms: u64,
    pub context_window: Option<u64>,
}

/// The parsed configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostConfig {
    /// The file it came from (`None` when no file exists: every default applies).
    pub path: Option<PathBuf>,
    pub raw: Value,
    pub unknown_keys: Vec<String>,
    /// `plugins.slots.contextEngine`.
    pub context_engine_slot: Option<String>,
    /// `plugins.slots.memory`.
    pub memory_slot: Option<String>,
    /// `memory.citations` (`auto`, `on`, `off`): handed to engines as `citationsMode`.
    pub memory_citations: Option<String>,
    /// `plugins.entries`.
    pub entries: BTreeMap<String, EntrySettings>,
    pub failure_policy: FailurePolicy,
    /// `agents.defaults.contextTokens`.
    pub context_tokens: Option<u64>,
    pub compaction: CompactionConfig,
    pub pruning: PruningConfig,
    pub model: Option<ModelConfig>,
    /// `agents.defaults.workspace`: the agent's workspace (bootstrap files, skills).
    pub workspace: Option<PathBuf>,
    /// `agents.defaults.bootstrapMaxChars` / `bootstrapTotalMaxChars`.
    pub bootstrap: BootstrapLimits,
    /// `agents.defaults.sandbox.mode` (reported by `/context`; this host runs no sandbox).
    pub sandbox_mode: Option<String>,
    /// The line and column of every key written in the file, by dotted path.
    pub key_positions: BTreeMap<String, (usize, usize)>,
}

impl HostConfig {
    /// Reads `path`; a missing file is the default configuration.
    pub fn load(path: &Path) -> Result<HostConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(HostConfig::default());
            }
            Err(source) => {
                return Err(ConfigError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        HostConfig::parse(&text, path)
    }

    /// Parses JSON5 text read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<HostConfig, ConfigError> {
        if let Some((line, column)) = too_deep(text, MAX_NESTING) {
            return Err(ConfigError::Syntax {
                path: path.to_owned(),
                line,
                column,
                message: format!("objects and arrays nest deeper than {MAX_NESTING} levels"),
            });
        }
        let raw: Value = json5::from_str(text).map_err(|error| syntax_error(text, path, &error))?;
        // Where each key is, for errors that name one (json5 accepted the text, so it reads).
        let key_positions: BTreeMap<String, (usize, usize)> = json5_layout::scan(text)
            .unwrap_or_default()
            .into_iter()
            .map(|placed| (placed.path, json5_layout::line_column(text, placed.key_at)))
            .collect();
        if !raw.is_object() {
            return Err(ConfigError::Invalid {
                place: path.display().to_string(),
                key: "(root)".to_owned(),
                problem: "must be an object".to_owned(),
            });
        }
        let reader = Reader {
            path,
            raw: &raw,
            positions: &key_positions,
        };
        let mut config = HostConfig {
            path: Some(path.to_owned()),
            unknown_keys: unknown_keys(&raw),
            context_engine_slot: reader.string("plugins.slots.contextEngine")?,
            memory_slot: reader.string("plugins.slots.memory")?,
            memory_citations: match reader.string("memory.citations")?.as_deref() {
                None => None,
                Some(mode @ ("auto" | "on" | "off")) => Some(mode.to_owned()),
                Some(other) => {
                    return Err(reader.invalid(
                        "memory.citations",
                        format!("must be \"auto\", \"on\" or \"off\", not {other:?}"),
                    ));
                }
            },
            failure_policy: match reader
                .string("plugins.contextEngineFailurePolicy")?
                .as_deref()
            {
                None | Some("fallback") => FailurePolicy::Fallback,
                Some("strict") => FailurePolicy::Strict,
                Some(other) => {
                    return Err(reader.invalid(
                        "plugins.contextEngineFailurePolicy",
                        format!("must be \"fallback\" or \"strict\", not {other:?}"),
                    ));
                }
            },
            context_tokens: reader.positive("agents.defaults.contextTokens")?,
            ..HostConfig::default()
        };
        if let Some(Value::Object(entries)) = lookup(&raw, "plugins.entries") {
            for (id, entry) in entries {
                let enabled = match entry.get("enabled") {
                    None | Some(Value::Null) => None,
                    Some(Value::Bool(enabled)) => Some(*enabled),
                    Some(_) => {
                        return Err(reader.invalid(
                            &format!("plugins.entries.{id}.enabled"),
                            "must be true or false".to_owned(),
                        ));
                    }
                };
                let key = format!("plugins.entries.{id}.config");
                let inside = format!("{key}.");
                config.entries.insert(
                    id.clone(),
                    EntrySettings {
                        enabled,
                        config: entry.get("config").cloned(),
                        origin: Some(SettingsOrigin {
                            file: path.to_owned(),
                            positions: key_positions
                                .iter()
                                .filter_map(|(placed, at)| {
                                    placed
                                        .strip_prefix(&inside)
                                        .map(|relative| (relative.to_owned(), *at))
                                })
                                .collect(),
                            key,
                        }),
                    },
                );
            }
        }
        let compaction = &mut config.compaction;
        let prefix = "agents.defaults.compaction";
        if let Some(value) = reader.unsigned(&format!("{prefix}.reserveTokens"))? {
            compaction.reserve_tokens = value;
        }
        if let Some(value) = reader.unsigned(&format!("{prefix}.reserveTokensFloor"))? {
            compaction.reserve_tokens_floor = value;
        }
        if let Some(value) = reader.positive(&format!("{prefix}.keepRecentTokens"))? {
            compaction.keep_recent_tokens = value;
        }
        if let Some(value) = reader.boolean(&format!("{prefix}.truncateAfterCompaction"))? {
            compaction.truncate_after_compaction = value;
        }
        let pruning = &mut config.pruning;
        let prefix = "agents.defaults.contextPruning";
        pruning.mode = match reader.string(&format!("{prefix}.mode"))?.as_deref() {
            None | Some("off") => PruningMode::Off,
            Some("cache-ttl") => PruningMode::CacheTtl,
            Some(other) => {
                return Err(reader.invalid(
                    &format!("{prefix}.mode"),
                    format!("must be \"off\" or \"cache-ttl\", not {other:?}"),
                ));
            }
        };
        if let Some(value) = reader.ratio(&format!("{prefix}.softTrimRatio"))? {
            pruning.soft_trim_ratio = value;
        }
        if let Some(value) = reader.ratio(&format!("{prefix}.hardClearRatio"))? {
            pruning.hard_clear_ratio = value;
        }
        if let Some(value) = reader.unsigned(&format!("{prefix}.softTrim.maxChars"))? {
            pruning.soft_trim_max_chars = value as usize;
        }
        if let Some(value) = reader.unsigned(&format!("{prefix}.softTrim.headChars"))? {
            pruning.soft_trim_head_chars = value as usize;
        }
        if let Some(value) = reader.unsigned(&format!("{prefix}.softTrim.tailChars"))? {
            pruning.soft_trim_tail_chars = value as usize;
        }
        if let Some(value) = reader.unsigned(&format!("{prefix}.minPrunableToolChars"))? {
            pruning.min_prunable_tool_chars = value as usize;
        }
        if let Some(value) = reader.unsigned(&format!("{prefix}.keepLastAssistants"))? {
            pruning.keep_last_assistants = value as usize;
        }
        if let Some(value) = reader.string(&format!("{prefix}.hardClear.placeholder"))? {
            pruning.hard_clear_placeholder = value;
        }
        config.model = model_config(&reader)?;
        config.workspace = reader
            .string("agents.defaults.workspace")?
            .map(PathBuf::from);
        if let Some(value) = reader.positive("agents.defaults.bootstrapMaxChars")? {
            config.bootstrap.per_file_max_chars = value as usize;
        }
        if let Some(value) = reader.positive("agents.defaults.bootstrapTotalMaxChars")? {
            config.bootstrap.total_max_chars = value as usize;
        }
        config.sandbox_mode = reader.string("agents.defaults.sandbox.mode")?;
        config.key_positions = key_positions;
        Ok(config)
    }

    /// `FILE:LINE:COLUMN` of a key (dotted path), or the file alone when it is not written.
    pub fn place_of(&self, key: &str) -> String {
        let file = self
            .path
            .as_deref()
            .map_or_else(String::new, |path| path.display().to_string());
        match self.key_positions.get(key) {
            Some((line, column)) => format!("{file}:{line}:{column}"),
            None => file,
        }
    }

    /// What the registry needs to resolve the slot.
    pub fn engine_selection(
        &self,
        agent_dir: Option<PathBuf>,
        workspace_dir: Option<PathBuf>,
    ) -> EngineSelection {
        EngineSelection {
            slot: self.context_engine_slot.clone(),
            entries: self.entries.clone(),
            failure_policy: self.failure_policy,
            agent_dir,
            workspace_dir,
            read_only: false,
            existing_only: false,
        }
    }

    /// Points the `lossless` engine at a PostgreSQL database (`--store-url`,
    /// `VILVONA_STORE_URL`), whatever its entry's `store` says.
    pub fn use_store_url(&mut self, url: &str) {
        let entry = self
            .entries
            .entry(vilvona_lossless::ENGINE_ID.to_owned())
            .or_default();
        entry.config = Some(with_store_url(entry.config.take(), url));
    }

    /// The model window: the model's own, else `agents.defaults.contextTokens`, else 200,000.
    pub fn context_window(&self) -> u64 {
        self.model
            .as_ref()
            .and_then(|model| model.context_window)
            .or(self.context_tokens)
            .unwrap_or(DEFAULT_CONTEXT_TOKENS)
    }

    /// The reserve for the reply: `reserveTokens` raised to the floor, both capped at half the
    /// window so a small window does not compact on its first token.
    pub fn reserve_tokens(&self, window: u64) -> u64 {
        let reserve = self
            .compaction
            .reserve_tokens
            .max(self.compaction.reserve_tokens_floor);
        reserve.min(window / 2)
    }
}

/// An engine entry's settings with `store` replaced by the PostgreSQL database at `url`.
pub fn with_store_url(config: Option<Value>, url: &str) -> Value {
    let mut config = match config {
        Some(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    config.insert(
        "store".to_owned(),
        serde_json::json!({ "kind": "postgres", "url": url }),
    );
    Value::Object(config)
}

/// Rewrites the `contextEngine` slot to `legacy` in the file's text, leaving everything else
/// (comments, order, other keys) as it was. Returns whether the file changed.
pub fn reset_context_engine_slot(
    path: &Path,
    uninstalled_engine: &str,
) -> Result<bool, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(ConfigError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let config = HostConfig::parse(&text, path)?;
    if config.context_engine_slot.as_deref().map(str::trim) != Some(uninstalled_engine) {
        return Ok(false);
    }
    // The value's bytes, found by reading the file's structure (a comment that mentions
    // `contextEngine:` is not the key); everything around them stays as written.
    let placed = json5_layout::scan(&text).unwrap_or_default();
    let Some(slot) = json5_layout::find(&placed, "plugins.slots.contextEngine") else {
        return Ok(false);
    };
    let updated = format!(
        "{}\"legacy\"{}",
        &text[..slot.value.start],
        &text[slot.value.end..]
    );
    // The rewritten file must still say what we meant.
    let check = HostConfig::parse(&updated, path)?;
    if check.context_engine_slot.as_deref() != Some("legacy") {
        return Ok(false);
    }
    let temporary = path.with_extension("json5.tmp");
    std::fs::write(&temporary, updated.as_bytes()).map_err(|source| ConfigError::Io {
        path: temporary.clone(),
        source,
    })?;
    std::fs::rename(&temporary, path).map_err(|source| ConfigError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(true)
}

/// A file json5 could not read, said where the trouble is: for a file that ends inside an
/// object, array, string or comment, the end of the file and where that one was opened.
fn syntax_error(text: &str, path: &Path, error: &json5::Error) -> ConfigError {
    let (line, column) = error
        .position()
        .map_or((0, 0), |position| (position.line + 1, position.column + 1));
    let message = error.to_string();
    let message = message
        .split(" at line ")
        .next()
        .unwrap_or(&message)
        .to_owned();
    if let Err(json5_layout::Broken::Unclosed {
        opener,
        at,
        path: key,
    }) = json5_layout::scan(text)
    {
        let (open_line, open_column) = json5_layout::line_column(text, at);
        let (end_line, end_column) = json5_layout::line_column(text, text.len());
        let what = match opener {
            '{' => "the object",
            '[' => "the array",
            '/' => "the comment",
            _ => "the string",
        };
        let of_key = if key.is_empty() {
            String::new()
        } else {
            format!(" (`{key}`)")
        };
        let closer = match opener {
            '{' => "`}`".to_owned(),
            '[' => "`]`".to_owned(),
            '/' => "`*/`".to_owned(),
            quote => format!("`{quote}`"),
        };
        return ConfigError::Syntax {
            path: path.to_owned(),
            line: end_line,
            column: end_column,
            message: format!(
                "the file ends inside {what}{of_key} opened at line {open_line}, column {open_column}: a closing {closer} is missing"
            ),
        };
    }
    ConfigError::Syntax {
        path: path.to_owned(),
        line,
        column,
        message,
    }
}

fn lookup<'a>(value: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .try_fold(value, |current, key| current.get(key))
}

struct Reader<'a> {
    path: &'a Path,
    raw: &'a Value,
    positions: &'a BTreeMap<String, (usize, usize)>,
}

impl Reader<'_> {
    fn invalid(&self, key: &str, problem: String) -> ConfigError {
        let file = self.path.display();
        ConfigError::Invalid {
            place: match self.positions.get(key) {
                Some((line, column)) => format!("{file}:{line}:{column}"),
                None => file.to_string(),
            },
            key: key.to_owned(),
            problem,
        }
    }

    fn string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match lookup(self.raw, key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(self.invalid(key, "must be a string".to_owned())),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match lookup(self.raw, key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(value)) => Ok(Some(*value)),
            Some(_) => Err(self.invalid(key, "must be true or false".to_owned())),
        }
    }

    fn unsigned(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match lookup(self.raw, key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "must be a whole number ≥ 0".to_owned())),
        }
    }

    fn positive(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.unsigned(key)? {
            Some(0) => Err(self.invalid(key, "must be positive".to_owned())),
            other => Ok(other),
        }
    }

    fn ratio(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match lookup(self.raw, key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => match value.as_f64() {
                Some(ratio) if (0.0..=1.0).contains(&ratio) => Ok(Some(ratio)),
                _ => Err(self.invalid(key, "must be a number between 0 and 1".to_owned())),
            },
        }
    }
}

/// The model: either a flat `model` block (`{baseUrl, model, apiKey | apiKeyEnv, timeoutMs,
/// contextWindow}`) or OpenClaw's `models.providers.<id>` with
/// `agents.defaults.model.primary = "<id>/<model>"`.
fn model_config(reader: &Reader<'_>) -> Result<Option<ModelConfig>, ConfigError> {
    if let Some(base_url) = reader.string("model.baseUrl")? {
        let model = reader.string("model.model")?.ok_or_else(|| {
            reader.invalid("model.model", "is required with model.baseUrl".to_owned())
        })?;
        return Ok(Some(ModelConfig {
            base_url,
            model,
            api_key: reader.string("model.apiKey")?,
            api_key_env: reader.string("model.apiKeyEnv")?,
            timeout_ms: reader.positive("model.timeoutMs")?.unwrap_or(60_000),
            context_window: reader.positive("model.contextWindow")?,
        }));
    }
    let Some(primary) = reader.string("agents.defaults.model.primary")? else {
        return Ok(None);
    };
    let Some((provider, model)) = primary.split_once('/') else {
        return Err(reader.invalid(
            "agents.defaults.model.primary",
            format!("must be \"<provider>/<model>\", not {primary:?}"),
        ));
    };
    let prefix = format!("models.providers.{provider}");
    let base_url = reader
        .string(&format!("{prefix}.baseUrl"))?
        .ok_or_else(|| {
            reader.invalid(
                &format!("{prefix}.baseUrl"),
                "is required for the primary model".to_owned(),
            )
        })?;
    let context_window = lookup(reader.raw, &format!("{prefix}.models"))
        .and_then(Value::as_array)
        .and_then(|models| {
            models
                .iter()
                .find(|entry| entry.get("id").and_then(Value::as_str) == Some(model))
        })
        .and_then(|entry| entry.get("contextWindow"))
        .and_then(Value::as_u64);
    Ok(Some(ModelConfig {
        base_url,
        model: model.to_owned(),
        api_key: reader.string(&format!("{prefix}.apiKey"))?,
        api_key_env: reader.string(&format!("{prefix}.apiKeyEnv"))?,
        timeout_ms: reader
            .positive(&format!("{prefix}.timeoutMs"))?
            .unwrap_or(60_000),
        context_window,
    }))
}

/// How deep objects and arrays may nest in the configuration (the parser recurses per level).
const MAX_NESTING: usize = 64;

/// Where (line, column) the text first nests deeper than `limit`, skipping strings and
/// comments; `None` when it never does.
fn too_deep(text: &str, limit: usize) -> Option<(usize, usize)> {
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        column += 1;
        if c == '\n' {
            line += 1;
            column = 0;
        }
        match quote {
            Some(open) => {
                if c == '\\' {
                    chars.next();
                    column += 1;
                } else if c == open {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '/' if chars.peek() == Some(&'/') => {
                    for skipped in chars.by_ref() {
                        if skipped == '\n' {
                            line += 1;
                            column = 0;
                            break;
                        }
                    }
                }
                '/' if chars.peek() == Some(&'*') => {
                    chars.next();
                    let mut previous = ' ';
                    for skipped in chars.by_ref() {
                        if skipped == '\n' {
                            line += 1;
                            column = 0;
                        }
                        if previous == '*' && skipped == '/' {
                            break;
                        }
                        previous = skipped;
                    }
                }
                '{' | '[' => {
                    depth += 1;
                    if depth > limit {
                        return Some((line, column));
                    }
                }
                '}' | ']' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    None
}

/// Keys this build reads, as dotted paths; `*` matches any one key, and a trailing `**` accepts
/// anything below.
const KNOWN_KEYS: &[&str] = &[
    "plugins",
    "plugins.enabled",
    "plugins.slots",
    "plugins.slots.contextEngine",
    "plugins.slots.memory",
    "plugins.entries",
    "plugins.entries.*",
    "plugins.entries.*.enabled",
    "plugins.entries.*.config",
    "plugins.entries.*.config.**",
    "plugins.contextEngineFailurePolicy",
    "memory",
    "memory.citations",
    "agents",
    "agents.defaults",
    "agents.defaults.contextTokens",
    "agents.defaults.workspace",
    "agents.defaults.bootstrapMaxChars",
    "agents.defaults.bootstrapTotalMaxChars",
    "agents.defaults.sandbox",
    "agents.defaults.sandbox.**",
    "agents.defaults.model",
    "agents.defaults.model.primary",
    "agents.defaults.compaction",
    "agents.defaults.compaction.reserveTokens",
    "agents.defaults.compaction.reserveTokensFloor",
    "agents.defaults.compaction.keepRecentTokens",
    "agents.defaults.compaction.truncateAfterCompaction",
    "agents.defaults.contextPruning",
    "agents.defaults.contextPruning.mode",
    "agents.defaults.contextPruning.softTrimRatio",
    "agents.defaults.contextPruning.hardClearRatio",
    "agents.defaults.contextPruning.minPrunableToolChars",
    "agents.defaults.contextPruning.keepLastAssistants",
    "agents.defaults.contextPruning.softTrim",
    "agents.defaults.contextPruning.softTrim.maxChars",
    "agents.defaults.contextPruning.softTrim.headChars",
    "agents.defaults.contextPruning.softTrim.tailChars",
    "agents.defaults.contextPruning.hardClear",
    "agents.defaults.contextPruning.hardClear.placeholder",
    "agents.defaults.contextPruning.hardClear.enabled",
    "models",
    "models.providers",
    "models.providers.*",
    "models.providers.*.**",
    "model",
    "model.**",
];

/// The keys this build reads, as dotted patterns (`*`: any one key; a trailing `**`: anything
/// below), for the settings reference and its test.
pub fn known_keys() -> &'static [&'static str] {
    KNOWN_KEYS
}

/// The known key a mistyped one most likely meant: a sibling (same parent) whose last part is
/// a slip away.
pub fn known_key_near(path: &str) -> Option<String> {
    let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
    let siblings: Vec<&str> = KNOWN_KEYS
        .iter()
        .filter_map(|pattern| {
            let (pattern_parent, pattern_last) = pattern.rsplit_once('.').unwrap_or(("", pattern));
            (pattern_parent == parent && !pattern_last.contains('*')).then_some(pattern_last)
        })
        .collect();
    vilvona_core::suggest::nearest(last, siblings).map(|meant| {
        if parent.is_empty() {
            meant.to_owned()
        } else {
            format!("{parent}.{meant}")
        }
    })
}

fn known(path: &str) -> bool {
    let path_parts: Vec<&str> = path.split('.').collect();
    KNOWN_KEYS.iter().any(|pattern| {
        let mut pattern_parts: Vec<&str> = pattern.split('.').collect();
        let subtree = pattern_parts.last() == Some(&"**");
        if subtree {
            pattern_parts.pop();
        }
        let length_fits = if subtree {
            path_parts.len() > pattern_parts.len()
        } else {
            path_parts.len() == pattern_parts.len()
        };
        length_fits
            && pattern_parts
                .iter()
                .zip(&path_parts)
                .all(|(pattern, part)| *pattern == "*" || pattern == part)
    })
}

fn unknown_keys(raw: &Value) -> Vec<String> {
    fn walk(value: &Value, prefix: &str, out: &mut Vec<String>) {
        let Value::Object(fields) = value else { return };
        for (key, child) in fields {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            if !known(&path) {
                out.push(path);
                continue;
            }
            walk(child, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(raw, "", &mut out);
    out
}
