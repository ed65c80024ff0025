//! The recall tools' arguments as types. Each type generates the JSON schema a model is
//! offered (schemars) and parses what the model sent (serde): the schema and the parser are
//! one source. What serde cannot state (required text, bounds, dates) is checked after parsing,
//! with messages that name the argument.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::Value;
use vilvona_store::{SearchMode, SearchOrder, SearchTarget};
use vilvona_summarize::parse_rfc3339;

use crate::errors::ToolError;

/// Parses a tool's arguments (`null` counts as none given).
pub(crate) fn parse<T: DeserializeOwned>(arguments: &Value) -> Result<T, ToolError> {
    let arguments = match arguments {
        Value::Null => Value::Object(serde_json::Map::new()),
        other => other.clone(),
    };
    serde_json::from_value(arguments)
        .map_err(|error| ToolError::InvalidArguments(error.to_string()))
}

/// The JSON schema of a tool's arguments, as a model is offered it.
pub(crate) fn schema<T: JsonSchema>() -> Value {
    let mut schema = schemars::generate::SchemaSettings::draft07()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        object.remove("description");
    }
    for_models(&mut schema);
    schema
}

/// Plain JSON Schema, as model providers and hosts validate it: an absent argument is its
/// default, so a model need not be told it may also send `null` (what schemars says of an
/// `Option`); and integer widths (`format: uint64`) are Rust's business, not a validator's.
fn for_models(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    object.remove("format");
    if let Some(Value::Array(types)) = object.get_mut("type") {
        types.retain(|kind| kind != "null");
        if let [single] = &types[..] {
            let single = single.clone();
            object.insert("type".to_owned(), single);
        }
    }
    if let Some(Value::Array(choices)) = object.get_mut("anyOf") {
        choices.retain(|choice| choice.get("type").is_none_or(|kind| kind != "null"));
        if let [single] = &choices[..] {
            // One choice left: it is the schema, under the field's own description.
            let Value::Object(inner) = single.clone() else {
                return;
            };
            object.remove("anyOf");
            for (key, value) in inner {
                object.entry(key).or_insert(value);
            }
        }
    }
    for value in object.values_mut() {
        match value {
            Value::Object(_) => for_models(value),
            Value::Array(items) => items.iter_mut().for_each(for_models),
            _ => {}
        }
    }
}

/// A text argument the tool cannot do without.
pub(crate) fn required(value: Option<String>, key: &str) -> Result<String, ToolError> {
    value
        .filter(|text| !text.trim().is_empty())
        .ok_or_else(|| ToolError::InvalidArguments(format!("{key} is required")))
}

/// One of a fixed set of strings: its names are the schema's `enum` and the parser's table.
pub(crate) trait Choice: Sized + Copy + Default + PartialEq + 'static {
    /// The argument it is.
    const KEY: &'static str;
    /// Each accepted string and what it means.
    const NAMES: &'static [(&'static str, Self)];

    fn parse<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let given = String::deserialize(deserializer)?;
        if let Some((_, value)) = Self::NAMES.iter().find(|(name, _)| *name == given) {
            return Ok(*value);
        }
        let names: Vec<&str> = Self::NAMES.iter().map(|(name, _)| *name).collect();
        let listed = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        };
        Err(D::Error::custom(format!(
            "{} {given:?}: use {listed}",
            Self::KEY
        )))
    }

    fn schema() -> Schema {
        let names: Vec<&str> = Self::NAMES.iter().map(|(name, _)| *name).collect();
        let default = Self::NAMES
            .iter()
            .find(|(_, value)| *value == Self::default())
            .map(|(name, _)| *name);
        json_schema!({"type": "string", "enum": names, "default": default})
    }
}

macro_rules! choice {
    ($name:ident($key:literal) { $($text:literal => $value:expr),+ $(,)? }) => {
        impl Choice for $name {
            const KEY: &'static str = $key;
            const NAMES: &'static [(&'static str, Self)] = &[$(($text, $value)),+];
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                <Self as Choice>::parse(deserializer)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                <Self as Choice>::schema()
            }
        }
    };
}

/// How the query is read: by default by words and by meaning together (hybrid), which finds
/// more on questions asked in other words than the answer's and keeps an exact lookup's
/// first hit first (BENCHMARKS.md, section 5: LoCoMo by mode, the paraphrase set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mode(pub(crate) SearchMode);

impl Default for Mode {
    fn default() -> Mode {
        Mode(SearchMode::Hybrid)
    }
}
choice!(Mode("mode") {
    "text" => Mode(SearchMode::Text),
    "phrase" => Mode(SearchMode::Phrase),
    "regex" => Mode(SearchMode::Regex),
    "semantic" => Mode(SearchMode::Semantic),
    "hybrid" => Mode(SearchMode::Hybrid),
});

/// What is searched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scope(pub(crate) SearchTarget);
choice!(Scope("scope") {
    "messages" => Scope(SearchTarget::Messages),
    "summaries" => Scope(SearchTarget::Summaries),
    "both" => Scope(SearchTarget::Both),
});

/// How hits are ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Order(pub(crate) SearchOrder);
choice!(Order("order") {
    "relevance" => Order(SearchOrder::Relevance),
    "recency" => Order(SearchOrder::Recency),
});

/// A time: RFC 3339 text or milliseconds since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum Time {
    /// Milliseconds since the epoch.
    Millis(i64),
    /// RFC 3339, e.g. `2026-03-02T09:00:00Z`.
    Text(String),
}

/// A time argument in milliseconds, or why it is not one.
pub(crate) fn millis(time: Option<Time>, key: &str) -> Result<Option<i64>, ToolError> {
    match time {
        None => Ok(None),
        Some(Time::Millis(ms)) => Ok(Some(ms)),
        Some(Time::Text(text)) => parse_rfc3339(&text).map(Some).ok_or_else(|| {
            ToolError::InvalidArguments(format!(
                "{key}: {text:?} is not an RFC 3339 time like 2026-03-02T09:00:00Z"
            ))
        }),
    }
}

/// `vilvona_grep`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub(crate) struct Grep {
    /// Words, a phrase, or a regular expression.
    #[schemars(required)]
    pub(crate) query: Option<String>,
    /// How the query is read.
    #[serde(default)]
    pub(crate) mode: Mode,
    /// Messages, summaries, or both.
    #[serde(default)]
    pub(crate) scope: Scope,
    /// RFC 3339 time or milliseconds; inclusive.
    pub(crate) since: Option<Time>,
    /// RFC 3339 time or milliseconds; exclusive.
    pub(crate) before: Option<Time>,
    /// Most hits (default 10).
    #[schemars(range(min = 1, max = 50))]
    pub(crate) limit: Option<u64>,
    /// Best match first, or newest first.
    #[serde(default)]
    pub(crate) order: Order,
}

/// `vilvona_describe`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub(crate) struct Describe {
    /// A summary id (sum_…), message id (msg_…) or file id (file_…).
    #[schemars(required)]
    pub(crate) id: Option<String>,
    /// For a file: a line range like "1-200".
    pub(crate) lines: Option<String>,
}

/// `vilvona_expand`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub(crate) struct Expand {
    /// A summary id (sum_…).
    #[schemars(required)]
    pub(crate) id: Option<String>,
    /// Tokens of content returned at most.
    #[schemars(range(min = 100))]
    pub(crate) token_cap: Option<u64>,
    /// Where to continue (the `nextCursor` of the previous call).
    pub(crate) cursor: Option<u64>,
}

/// `vilvona_expand_query`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub(crate) struct ExpandQuery {
    /// Words to search the history for.
    #[schemars(required)]
    pub(crate) query: Option<String>,
    /// The question to answer from what is found.
    #[schemars(required)]
    pub(crate) question: Option<String>,
    /// Tokens of history read at most.
    #[schemars(range(min = 100))]
    pub(crate) token_cap: Option<u64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The schema and the parser are one source: every value the schema offers parses to
    /// what it names, and what the schema requires is required.
    #[test]
    fn the_schema_offers_what_the_parser_takes() {
        let grep = schema::<Grep>();
        for (key, names) in [("mode", Mode::NAMES.len()), ("scope", Scope::NAMES.len())] {
            let offered = grep["properties"][key]["enum"].as_array().unwrap();
            assert_eq!(offered.len(), names, "{key}");
            for value in offered {
                let parsed: Grep = parse(&json!({"query": "q", key: value})).unwrap();
                assert!(parsed.query.is_some());
            }
        }
        assert_eq!(grep["required"], json!(["query"]));
        assert!(!grep.to_string().contains("null") && !grep.to_string().contains("format"));
        assert_eq!(grep["properties"]["mode"]["default"], "hybrid");
        assert_eq!(grep["properties"]["scope"]["default"], "both");
        let parsed: Grep = parse(&json!({"query": "q", "scope": "summaries"})).unwrap();
        assert_eq!(parsed.scope.0, SearchTarget::Summaries);
        let missing: Grep = parse(&Value::Null).unwrap();
        assert_eq!(
            required(missing.query, "query").unwrap_err().to_string(),
            "invalid arguments: query is required"
        );
        let question = schema::<ExpandQuery>();
        assert_eq!(question["required"], json!(["query", "question"]));
        assert_eq!(
            millis(Some(Time::Text("2026-03-02T09:00:00Z".into())), "since").unwrap(),
            Some(1_772_442_000_000)
        );
        assert!(
            millis(Some(Time::Text("soon".into())), "before")
                .unwrap_err()
                .to_string()
                .contains("before: \"soon\" is not an RFC 3339 time")
        );
    }
}
