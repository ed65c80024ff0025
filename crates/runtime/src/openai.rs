//! The chat-completions endpoint of an OpenAI-compatible provider: the host's [`Model`] and the
//! transport of the model-backed summarizer and `ask` (HTTP, retries and failures are
//! `vilvona-openai`'s).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use vilvona_core::message::{
    AgentMessage, AssistantMessage, ContentBlock, Extra, MessageContent, ToolCallBlock, Usage,
};
use vilvona_openai::{Client, Endpoint, Failure, Retries, api_key};

use crate::config::ModelConfig;
use crate::model::{Model, ModelError, ModelRequest, ModelResponse, ToolSpec, is_overflow_message};

/// A chat-completions endpoint, asked through `vilvona-openai`'s client (the one the
/// embeddings use too).
#[derive(Clone, Debug)]
pub struct OpenAiClient {
    client: Arc<Client>,
    model: String,
}

/// One completion: the text, the reasoning the provider reported separately, tool calls, usage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completion {
    pub text: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCallBlock>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

impl OpenAiClient {
    /// A client for `config`. The API key comes from the config, else from the environment
    /// variable it names.
    pub fn new(config: &ModelConfig) -> Result<OpenAiClient, ModelError> {
        let client = Client::new(Endpoint {
            base_url: config.base_url.clone(),
            api_key: api_key(config.api_key.clone(), config.api_key_env.as_deref()),
            timeout: Duration::from_millis(config.timeout_ms),
        })
        .map_err(model_error)?;
        Ok(OpenAiClient {
            client: Arc::new(client),
            model: config.model.clone(),
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Calls `/chat/completions` once with `model` (or the configured one).
    pub async fn chat(
        &self,
        model: Option<&str>,
        messages: Vec<Value>,
        tools: &[ToolSpec],
    ) -> Result<Completion, ModelError> {
        let body = chat_body(model.unwrap_or(&self.model), &messages, tools);
        let answer = self
            .client
            .post(CHAT_PATH, &body)
            .await
            .map_err(model_error)?;
        read_completion(&answer).map_err(|problem| {
            ModelError::Failed(format!("{}/{CHAT_PATH}: {problem}", self.client.base_url()))
        })
    }

    /// Calls `/chat/completions` through a chain of models, each retried as `retries` says
    /// (see [`Client::call`]); returns the model that answered and its completion.
    pub async fn chat_with_retries(
        &self,
        models: &[String],
        retries: &Retries,
        messages: Vec<Value>,
    ) -> Result<(String, Completion), ModelError> {
        self.client
            .call(
                CHAT_PATH,
                models,
                retries,
                |model| chat_body(model, &messages, &[]),
                read_completion,
            )
            .await
            .map_err(model_error)
    }
}

const CHAT_PATH: &str = "chat/completions";

/// A chat-completions request: not streamed, with the tools offered.
fn chat_body(model: &str, messages: &[Value], tools: &[ToolSpec]) -> Value {
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": false,
    });
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name, "description": tool.description, "parameters": tool.parameters
                }})
            })
            .collect();
    }
    body
}

fn read_completion(value: &Value) -> Result<Completion, String> {
    parse_completion(value).ok_or_else(|| "response has no choices[0].message".to_owned())
}

/// A failure as the host's model calls name it; a rejected prompt is an overflow when the
/// provider's answer says so.
fn model_error(failure: Failure) -> ModelError {
    match failure {
        Failure::Transient(detail) => ModelError::Transient(detail),
        Failure::Refused(detail) => ModelError::Auth(detail),
        Failure::Rejected { detail, body } if is_overflow_message(&body) => {
            ModelError::Overflow(detail)
        }
        Failure::Rejected { detail, .. } | Failure::Failed(detail) => ModelError::Failed(detail),
    }
}

fn parse_completion(value: &Value) -> Option<Completion> {
    let message = value.get("choices")?.get(0)?.get("message")?;
    let text = message
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let reasoning = message
        .get("reasoning_content")
        .or_else(|| message.get("reasoning"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .filter_map(|call| {
                    let function = call.get("function")?;
                    let arguments = function
                        .get("arguments")
                        .and_then(Value::as_str)
                        .and_then(|text| serde_json::from_str(text).ok())
                        .unwrap_or(Value::Object(Default::default()));
                    Some(ToolCallBlock {
                        id: call.get("id")?.as_str()?.to_owned(),
                        name: function.get("name")?.as_str()?.to_owned(),
                        arguments,
                        extra: Extra::new(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let usage = value.get("usage");
    Some(Completion {
        text,
        reasoning,
        tool_calls,
        input_tokens: usage
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64),
        output_tokens: usage
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64),
    })
}

/// Agent messages as chat-completions messages.
pub fn to_chat_messages(system_prompt: &str, messages: &[AgentMessage]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if !system_prompt.is_empty() {
        out.push(json!({"role": "system", "content": system_prompt}));
    }
    for message in messages {
        match message {
            AgentMessage::User(user) => {
                out.push(json!({"role": "user", "content": user_content(&user.content)}))
            }
            AgentMessage::Assistant(assistant) => {
                let text: Vec<&str> = assistant
                    .content
                    .blocks()
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::Text(text) => Some(text.text.as_str()),
                        _ => None,
                    })
                    .collect();
                let text = match &assistant.content {
                    MessageContent::Text(text) => text.clone(),
                    MessageContent::Blocks(_) => text.join("\n"),
                };
                let calls: Vec<Value> = message
                    .tool_calls()
                    .map(|call| {
                        json!({"id": call.id, "type": "function", "function": {
                            "name": call.name, "arguments": call.arguments.to_string()
                        }})
                    })
                    .collect();
                let mut value = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    value["tool_calls"] = Value::Array(calls);
                }
                out.push(value);
            }
            AgentMessage::ToolResult(result) => out.push(json!({
                "role": "tool",
                "tool_call_id": result.tool_call_id,
                "content": message.plain_text(),
            })),
            AgentMessage::Other(_) => {
                let text = message.plain_text();
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text}));
                }
            }
        }
    }
    out
}

fn user_content(content: &MessageContent) -> Value {
    match content {
        MessageContent::Text(text) => Value::String(text.clone()),
        MessageContent::Blocks(blocks) => Value::Array(
            blocks
                .iter()
                .filter_map(|block| match block {
                    ContentBlock::Text(text) => Some(json!({"type": "text", "text": text.text})),
                    ContentBlock::Image(image) => Some(json!({"type": "image_url", "image_url": {
                        "url": format!("data:{};base64,{}", image.mime_type.as_deref().unwrap_or("image/png"), image.data.as_deref().unwrap_or(""))
                    }})),
                    _ => None,
                })
                .collect(),
        ),
    }
}

#[async_trait]
impl Model for OpenAiClient {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let completion = self
            .chat(
                None,
                to_chat_messages(&request.system_prompt, &request.messages),
                &request.tools,
            )
            .await?;
        let mut blocks = Vec::new();
        if !completion.text.is_empty() {
            blocks.push(ContentBlock::text(completion.text));
        }
        let stop_reason = if completion.tool_calls.is_empty() {
            "stop"
        } else {
            "toolUse"
        };
        blocks.extend(
            completion
                .tool_calls
                .into_iter()
                .map(ContentBlock::ToolCall),
        );
        let message = AgentMessage::Assistant(AssistantMessage {
            content: MessageContent::Blocks(blocks),
            stop_reason: Some(stop_reason.to_owned()),
            usage: Some(Usage {
                input: completion.input_tokens,
                output: completion.output_tokens,
                ..Usage::default()
            }),
            timestamp: Some(vilvona_core::clock::now_ms()),
            extra: Extra::new(),
        });
        Ok(ModelResponse {
            messages: vec![message],
            input_tokens: completion.input_tokens,
            output_tokens: completion.output_tokens,
        })
    }
}
