//! Why an engine call failed, and what a host makes of it.

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The caller cancelled the call. Never a reason to quarantine an engine.
    #[error("cancelled")]
    Cancelled,
    /// The engine does not implement an optional method the host required.
    #[error("context engine does not implement {method}")]
    Unsupported {
        /// The member not implemented.
        method: &'static str,
    },
    /// The engine's configuration is invalid (raised by factories).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A request the engine refused as the caller's mistake (an unknown tool, invalid
    /// arguments, an id out of scope). Never a reason to quarantine an engine.
    #[error(transparent)]
    Refused(Box<dyn std::error::Error + Send + Sync>),
    /// The host left its history out of an `assemble` (`history_elided`) but this engine
    /// needs it for this session: send the call again with the history. Never a reason to
    /// quarantine an engine.
    #[error("the engine needs the host's history for this session; send it again")]
    HistoryNeeded,
    /// The engine works, but this call could not be done now: a busy or locked store, a
    /// database that is restarting, a model that timed out. The same call may succeed if
    /// tried again. Never a reason to quarantine an engine: a host retries it, degrades
    /// (answers without the work) or fails only the call.
    #[error("{message}")]
    Transient {
        /// What could not be done.
        message: String,
        /// Why, when another error caused it.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Any other failure, with its source.
    #[error("{message}")]
    Failed {
        /// What failed.
        message: String,
        /// Why, when another error caused it.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl EngineError {
    /// A failure described by a message.
    pub fn failed(message: impl Into<String>) -> EngineError {
        EngineError::Failed {
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by another error.
    pub fn caused_by(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> EngineError {
        EngineError::Failed {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A transient failure caused by another error: the call may succeed if tried again.
    pub fn transient(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> EngineError {
        EngineError::Transient {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// True when the call may succeed if tried again ([`EngineError::Transient`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, EngineError::Transient { .. })
    }

    /// A refusal described by a message.
    pub fn refused(message: impl Into<String>) -> EngineError {
        EngineError::Refused(message.into().into())
    }

    /// True when the caller cancelled the call.
    pub fn is_cancellation(&self) -> bool {
        matches!(self, EngineError::Cancelled)
    }

    /// True for errors that say nothing about the engine's health: cancellations, refusals,
    /// optional methods it does not implement, and transient failures.
    pub fn is_callers_concern(&self) -> bool {
        matches!(
            self,
            EngineError::Cancelled
                | EngineError::Refused(_)
                | EngineError::Unsupported { .. }
                | EngineError::HistoryNeeded
                | EngineError::Transient { .. }
        )
    }
}
