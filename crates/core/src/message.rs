//! OpenClaw agent messages as typed values.
//!
//! The wire format is OpenClaw's camelCase JSON. The typed fields are a *view* over that JSON:
//! every key the view does not know, and every known key whose value does not have the shape the
//! view expects (a `null` timestamp, a string where a number was expected), is kept verbatim in
//! `extra`. A message of a known role whose required parts do not fit the view at all is kept
//! whole as [`AgentMessage::Other`]. So `from_str` → value → `to_string` never loses anything:
//! the output is the same JSON value as the input (key order aside).

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A JSON object: the unknown keys of a message or block.
pub type Extra = Map<String, Value>;

/// One message of an agent conversation.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentMessage {
    /// `role: "user"`.
    User(UserMessage),
    /// `role: "assistant"`: text, thinking and tool calls.
    Assistant(AssistantMessage),
    /// `role: "toolResult"`: the result of one tool call.
    ToolResult(ToolResultMessage),
    /// Any other role, or a known role whose content does not fit the typed view. Kept verbatim.
    Other(OtherMessage),
}

/// `role: "user"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserMessage {
    /// Its content: text or blocks.
    pub content: MessageContent,
    /// When it was created, in milliseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `role: "assistant"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssistantMessage {
    /// Its content: text, thinking and tool calls.
    pub content: MessageContent,
    /// Why the model stopped (`stop`, `toolUse`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The provider's token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// When it was created, in milliseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Token usage reported by the provider for one assistant message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<u64>,
    /// Output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<u64>,
    /// Tokens read from the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<u64>,
    /// Tokens written to the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<u64>,
    /// All tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Usage {
    /// The prompt tokens the provider counted for the call: fresh input plus what was read
    /// from or written to its prompt cache (providers that cache report the three apart).
    /// `None` when the provider gave no input count.
    pub fn prompt_tokens(&self) -> Option<u64> {
        let input = self.input?;
        Some(input + self.cache_read.unwrap_or(0) + self.cache_write.unwrap_or(0))
    }
}

/// `role: "toolResult"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultMessage {
    /// The tool call it answers.
    pub tool_call_id: String,
    /// The tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// What the tool returned.
    pub content: MessageContent,
    /// True when the tool failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// When it was created, in milliseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A message whose role the typed view does not cover: kept as the JSON object it was.
#[derive(Clone, Debug, PartialEq)]
pub struct OtherMessage {
    /// The `role` value (always a string: an object without one is not a message).
    pub role: String,
    /// Every key of the object except `role`.
    pub fields: Extra,
}

/// Message content: OpenClaw allows a plain string or an array of blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed blocks.
    Blocks(Vec<ContentBlock>),
}

/// One block of message content.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentBlock {
    /// `type: "text"`.
    Text(TextBlock),
    /// `type: "image"`: base64 data and a MIME type.
    Image(ImageBlock),
    /// `type: "thinking"`: reasoning text, optionally signed.
    Thinking(ThinkingBlock),
    /// `type: "toolCall"`.
    ToolCall(ToolCallBlock),
    /// Any other block type, or a known type that does not fit the view. Kept verbatim.
    Other(Extra),
}

/// A text block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TextBlock {
    /// The text.
    pub text: String,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// An image block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageBlock {
    /// The image, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Its media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The model's reasoning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThinkingBlock {
    /// The reasoning text.
    pub thinking: String,
    /// The provider's signature of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_signature: Option<String>,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallBlock {
    /// Its id (tool results name it).
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments.
    pub arguments: Value,
    /// Keys the typed view does not know, kept as sent.
    #[serde(flatten)]
    pub extra: Extra,
}

impl AgentMessage {
    /// The role string as it appears on the wire.
    pub fn role(&self) -> &str {
        match self {
            AgentMessage::User(_) => "user",
            AgentMessage::Assistant(_) => "assistant",
            AgentMessage::ToolResult(_) => "toolResult",
            AgentMessage::Other(other) => &other.role,
        }
    }

    /// A user message with plain-text content.
    pub fn user_text(text: impl Into<String>) -> AgentMessage {
        AgentMessage::User(UserMessage {
            content: MessageContent::Text(text.into()),
            timestamp: None,
            extra: Extra::new(),
        })
    }

    /// An assistant message with one text block.
    pub fn assistant_text(text: impl Into<String>) -> AgentMessage {
        AgentMessage::Assistant(AssistantMessage {
            content: MessageContent::Blocks(vec![ContentBlock::text(text)]),
            stop_reason: Some("stop".to_owned()),
            usage: None,
            timestamp: None,
            extra: Extra::new(),
        })
    }

    /// The message's timestamp in milliseconds since the epoch, when it carries one.
    pub fn timestamp_ms(&self) -> Option<i64> {
        match self {
            AgentMessage::User(m) => m.timestamp,
            AgentMessage::Assistant(m) => m.timestamp,
            AgentMessage::ToolResult(m) => m.timestamp,
            AgentMessage::Other(m) => m.fields.get("timestamp").and_then(Value::as_i64),
        }
    }

    /// The content of the message, for the typed roles.
    pub fn content(&self) -> Option<&MessageContent> {
        match self {
            AgentMessage::User(m) => Some(&m.content),
            AgentMessage::Assistant(m) => Some(&m.content),
            AgentMessage::ToolResult(m) => Some(&m.content),
            AgentMessage::Other(_) => None,
        }
    }

    /// The tool calls an assistant message makes, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCallBlock> {
        let blocks: &[ContentBlock] = match self {
            AgentMessage::Assistant(AssistantMessage {
                content: MessageContent::Blocks(blocks),
                ..
            }) => blocks,
            _ => &[],
        };
        blocks.iter().filter_map(|block| match block {
            ContentBlock::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// The id of the tool call this message answers, for a tool result.
    pub fn tool_result_call_id(&self) -> Option<&str> {
        match self {
            AgentMessage::ToolResult(m) => Some(&m.tool_call_id),
            _ => None,
        }
    }

    /// The readable text of the message: text blocks, thinking, tool-call names and arguments,
    /// tool-result text. Images contribute a short marker. Used for search and summaries.
    pub fn plain_text(&self) -> String {
        let mut out = String::new();
        match self {
            AgentMessage::Other(other) => match other.fields.get("content") {
                Some(Value::String(text)) => out.push_str(text),
                Some(value) => {
                    if let Ok(content) = serde_json::from_value::<MessageContent>(value.clone()) {
                        content.push_plain_text(&mut out);
                    }
                }
                None => {}
            },
            typed => {
                if let Some(content) = typed.content() {
                    content.push_plain_text(&mut out);
                }
            }
        }
        out
    }

    /// [`plain_text`](Self::plain_text) of the message `json` decodes to; empty when it
    /// is not a message. Every view's text is its `content` read as [`MessageContent`] (a
    /// message of any role whose content does not read so has none), so only the role and
    /// the content of an object are decoded; JSON that does not decode so simply (a
    /// duplicated key, say) is decoded whole.
    pub fn plain_text_of_json(json: &str) -> String {
        /// A message's role (a string) and content; other keys are skipped.
        #[derive(Deserialize)]
        struct RoleAndContent {
            #[serde(rename = "role")]
            _role: String,
            content: Option<MessageContent>,
        }
        // A derived struct would read an array too, which is no message.
        let simple = json
            .trim_start()
            .starts_with('{')
            .then(|| serde_json::from_str::<RoleAndContent>(json).ok())
            .flatten();
        match simple {
            Some(RoleAndContent { content, .. }) => {
                let mut out = String::new();
                if let Some(content) = content {
                    content.push_plain_text(&mut out);
                }
                out
            }
            None => serde_json::from_str::<AgentMessage>(json)
                .map(|message| message.plain_text())
                .unwrap_or_default(),
        }
    }
}

impl MessageContent {
    /// The blocks of the content; a plain string reads as no blocks.
    pub fn blocks(&self) -> &[ContentBlock] {
        match self {
            MessageContent::Text(_) => &[],
            MessageContent::Blocks(blocks) => blocks,
        }
    }

    fn push_plain_text(&self, out: &mut String) {
        match self {
            MessageContent::Text(text) => out.push_str(text),
            MessageContent::Blocks(blocks) => {
                for block in blocks {
                    let before = out.len();
                    if before > 0 {
                        out.push('\n');
                    }
                    match block {
                        ContentBlock::Text(b) => out.push_str(&b.text),
                        ContentBlock::Thinking(b) => out.push_str(&b.thinking),
                        ContentBlock::ToolCall(b) => {
                            out.push_str(&b.name);
                            out.push(' ');
                            out.push_str(&b.arguments.to_string());
                        }
                        ContentBlock::Image(b) => {
                            out.push_str("[image");
                            if let Some(mime) = &b.mime_type {
                                out.push(' ');
                                out.push_str(mime);
                            }
                            out.push(']');
                        }
                        ContentBlock::Other(fields) => {
                            if let Some(Value::String(text)) = fields.get("text") {
                                out.push_str(text);
                            }
                        }
                    }
                    if out.len() == before + 1 {
                        out.truncate(before);
                    }
                }
            }
        }
    }
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> ContentBlock {
        ContentBlock::Text(TextBlock {
            text: text.into(),
            extra: Extra::new(),
        })
    }

    /// The block's `type` as it appears on the wire.
    pub fn block_type(&self) -> &str {
        match self {
            ContentBlock::Text(_) => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Thinking(_) => "thinking",
            ContentBlock::ToolCall(_) => "toolCall",
            ContentBlock::Other(fields) => fields.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }
}

// --- wire format -------------------------------------------------------------------------------

/// Typed optional keys per variant, with the JSON shape the typed view accepts. A present key
/// whose value has another shape is moved to `extra` before the typed parse.
const USER_OPTIONAL: &[(&str, Shape)] = &[("timestamp", Shape::Integer)];
const ASSISTANT_OPTIONAL: &[(&str, Shape)] = &[
    ("stopReason", Shape::String),
    ("usage", Shape::Usage),
    ("timestamp", Shape::Integer),
];
const TOOL_RESULT_OPTIONAL: &[(&str, Shape)] = &[
    ("toolName", Shape::String),
    ("isError", Shape::Bool),
    ("timestamp", Shape::Integer),
];
const IMAGE_OPTIONAL: &[(&str, Shape)] = &[("data", Shape::String), ("mimeType", Shape::String)];
const THINKING_OPTIONAL: &[(&str, Shape)] = &[("thinkingSignature", Shape::String)];

#[derive(Clone, Copy)]
enum Shape {
    Integer,
    String,
    Bool,
    Usage,
}

impl Shape {
    fn accepts(self, value: &Value) -> bool {
        match self {
            Shape::Integer => value.is_i64(),
            Shape::String => value.is_string(),
            Shape::Bool => value.is_boolean(),
            Shape::Usage => value.as_object().is_some_and(|usage| {
                ["input", "output", "cacheRead", "cacheWrite", "totalTokens"]
                    .iter()
                    .all(|key| usage.get(*key).is_none_or(Value::is_u64))
            }),
        }
    }
}

/// Parses `fields` into `T` through the typed view, keeping misfit optional keys in `extra`.
/// Returns the untouched fields when the view does not fit at all.
fn parse_view<T>(
    mut fields: Extra,
    optional: &[(&str, Shape)],
    extra_of: fn(&mut T) -> &mut Extra,
) -> Result<T, Extra>
where
    T: for<'de> Deserialize<'de>,
{
    let mut misfits = Vec::new();
    for (key, shape) in optional {
        if let Some(value) = fields.get(*key)
            && !shape.accepts(value)
            && let Some(value) = fields.remove(*key)
        {
            misfits.push(((*key).to_owned(), value));
        }
    }
    // Parse from a borrowed value so the fields are still at hand when the view does not fit.
    let value = Value::Object(fields);
    match T::deserialize(&value) {
        Ok(mut typed) => {
            extra_of(&mut typed).extend(misfits);
            Ok(typed)
        }
        Err(_) => {
            let Value::Object(mut restored) = value else {
                unreachable!("constructed as an object above")
            };
            restored.extend(misfits);
            Err(restored)
        }
    }
}

impl<'de> Deserialize<'de> for AgentMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Extra::deserialize(deserializer)?;
        let role = match fields.remove("role") {
            Some(Value::String(role)) => role,
            Some(other) => {
                return Err(de::Error::custom(format!(
                    "message `role` must be a string, found {other}"
                )));
            }
            None => return Err(de::Error::custom("message has no `role`")),
        };
        let other =
            |role: String, fields: Extra| AgentMessage::Other(OtherMessage { role, fields });
        Ok(match role.as_str() {
            "user" => match parse_view(fields, USER_OPTIONAL, |m: &mut UserMessage| &mut m.extra) {
                Ok(m) => AgentMessage::User(m),
                Err(fields) => other(role, fields),
            },
            "assistant" => {
                match parse_view(fields, ASSISTANT_OPTIONAL, |m: &mut AssistantMessage| {
                    &mut m.extra
                }) {
                    Ok(m) => AgentMessage::Assistant(m),
                    Err(fields) => other(role, fields),
                }
            }
            "toolResult" => {
                match parse_view(fields, TOOL_RESULT_OPTIONAL, |m: &mut ToolResultMessage| {
                    &mut m.extra
                }) {
                    Ok(m) => AgentMessage::ToolResult(m),
                    Err(fields) => other(role, fields),
                }
            }
            _ => other(role, fields),
        })
    }
}

#[derive(Serialize)]
struct Tagged<'a, T> {
    #[serde(rename = "role")]
    tag: &'a str,
    #[serde(flatten)]
    inner: &'a T,
}

#[derive(Serialize)]
struct TypeTagged<'a, T> {
    #[serde(rename = "type")]
    tag: &'a str,
    #[serde(flatten)]
    inner: &'a T,
}

impl Serialize for AgentMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let tag = self.role();
        match self {
            AgentMessage::User(m) => Tagged { tag, inner: m }.serialize(serializer),
            AgentMessage::Assistant(m) => Tagged { tag, inner: m }.serialize(serializer),
            AgentMessage::ToolResult(m) => Tagged { tag, inner: m }.serialize(serializer),
            AgentMessage::Other(m) => Tagged {
                tag,
                inner: &m.fields,
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Extra::deserialize(deserializer)?;
        let Some(Value::String(kind)) = fields.get("type").cloned() else {
            return Ok(ContentBlock::Other(fields));
        };
        let restore = |mut fields: Extra| {
            fields.insert("type".to_owned(), Value::String(kind.clone()));
            ContentBlock::Other(fields)
        };
        fields.remove("type");
        Ok(match kind.as_str() {
            "text" => match parse_view(fields, &[], |b: &mut TextBlock| &mut b.extra) {
                Ok(b) => ContentBlock::Text(b),
                Err(fields) => restore(fields),
            },
            "image" => {
                match parse_view(fields, IMAGE_OPTIONAL, |b: &mut ImageBlock| &mut b.extra) {
                    Ok(b) => ContentBlock::Image(b),
                    Err(fields) => restore(fields),
                }
            }
            "thinking" => {
                match parse_view(fields, THINKING_OPTIONAL, |b: &mut ThinkingBlock| {
                    &mut b.extra
                }) {
                    Ok(b) => ContentBlock::Thinking(b),
                    Err(fields) => restore(fields),
                }
            }
            "toolCall" => match parse_view(fields, &[], |b: &mut ToolCallBlock| &mut b.extra) {
                Ok(b) => ContentBlock::ToolCall(b),
                Err(fields) => restore(fields),
            },
            _ => restore(fields),
        })
    }
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let tag = self.block_type();
        match self {
            ContentBlock::Text(b) => TypeTagged { tag, inner: b }.serialize(serializer),
            ContentBlock::Image(b) => TypeTagged { tag, inner: b }.serialize(serializer),
            ContentBlock::Thinking(b) => TypeTagged { tag, inner: b }.serialize(serializer),
            ContentBlock::ToolCall(b) => TypeTagged { tag, inner: b }.serialize(serializer),
            ContentBlock::Other(fields) => fields.serialize(serializer),
        }
    }
}
