//! The engine's own errors: a store's as the engine's (every job module reports failures
//! through [`store_error`]) and why a recall tool call was refused ([`ToolError`]).

use vilvona_core::engine::EngineError;
use vilvona_store::StoreError;

/// A store error as the engine's: transient when the store says a retry may succeed (a busy
/// database, a PostgreSQL restart), so that a host never quarantines the engine for it.
pub(crate) fn store_error(operation: &str, error: StoreError) -> EngineError {
    if error.is_transient() {
        EngineError::transient(format!("lossless {operation}"), error)
    } else {
        EngineError::caused_by(format!("lossless {operation}"), error)
    }
}

/// Why a tool call was refused.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No tool by that name.
    #[error("unknown tool {0}")]
    UnknownTool(String),
    /// The arguments do not fit the tool's schema or bounds.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// No row with that id.
    #[error(
        "{0} not found in this session's reach (ids look like msg_12 for a message, sum_0a1b2c3d… or its first 8 digits for a summary, file_… for a stored file; vilvona_grep shows them)"
    )]
    NotFound(String),
    /// The row exists outside what the caller may read.
    #[error("{0} is outside this session's recall scope")]
    OutOfScope(String),
    /// The subagent grant that allowed the read has ended.
    #[error("the recall grant for {0} has expired or was revoked")]
    GrantEnded(String),
    /// The caller's session key belongs to another agent than the session it names.
    #[error(
        "the session key names agent {key_agent}, but this session belongs to agent {agent}: an agent reads only its own history"
    )]
    OtherAgent {
        /// The agent the key names.
        key_agent: String,
        /// The agent whose session it is.
        agent: String,
    },
    /// Something the tool needs cannot be reached now (an embedding endpoint).
    #[error("{0}")]
    Unavailable(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The engine failed (the answer's summarizer, a conversation lookup).
    #[error(transparent)]
    Engine(#[from] vilvona_core::EngineError),
}

impl From<ToolError> for EngineError {
    /// A refusal is the caller's concern; a store failure is the engine's.
    fn from(error: ToolError) -> EngineError {
        match error {
            ToolError::Store(error) => EngineError::caused_by("lossless recall", error),
            refused => EngineError::Refused(Box::new(refused)),
        }
    }
}
