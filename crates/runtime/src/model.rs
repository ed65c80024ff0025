//! The model seam of the turn lifecycle.

use async_trait::async_trait;
use serde_json::Value;
use vilvona_core::message::AgentMessage;

/// A tool the model may call: name, description and JSON schema for its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// What the host sends the model for one call.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelRequest {
    pub system_prompt: String,
    pub messages: Vec<AgentMessage>,
    pub tools: Vec<ToolSpec>,
}

/// What the model produced: the assistant's messages and any tool results of its loop.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelResponse {
    pub messages: Vec<AgentMessage>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The provider refused the prompt as too large for the window.
    #[error("context overflow: {0}")]
    Overflow(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    /// Rate limits, 5xx, timeouts: worth retrying.
    #[error("model temporarily unavailable: {0}")]
    Transient(String),
    #[error("model call failed: {0}")]
    Failed(String),
}

/// A model the host can call.
#[async_trait]
pub trait Model: Send + Sync + std::fmt::Debug {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError>;
}

/// Whether a provider's error text means the prompt was too large (OpenClaw's patterns).
pub fn is_overflow_message(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "request_too_large",
        "context length exceeded",
        "context_length_exceeded",
        "maximum context length",
        "input exceeds the maximum number of tokens",
        "input token count exceeds",
        "input is too long for the model",
        "prompt is too long",
    ]
    .iter()
    .any(|pattern| lower.contains(pattern))
}
