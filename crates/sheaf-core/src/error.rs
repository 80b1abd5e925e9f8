//! The one error type of the request path. Each protocol maps [`ErrorKind`] once onto its own
//! status codes (HTTP in `sheaf-server/src/http/error.rs`).

use sheaf_backend::BackendError;

/// What class of failure a request met; it decides the status code a client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or does not fit the model (HTTP 400).
    InvalidInput,
    /// No such model or version (HTTP 404).
    ModelNotFound,
    /// The model exists but cannot serve now: loading, failed to load, or shutting down (503).
    NotReady,
    /// The model's queue is full; retry later (HTTP 503).
    Overloaded,
    /// The request's deadline passed before it ran (HTTP 504).
    Timeout,
    /// A failure inside the server or backend (HTTP 500).
    Internal,
}

/// An error with its kind and a message that says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InferError {
    pub kind: ErrorKind,
    pub message: String,
}

impl InferError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> InferError {
        InferError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> InferError {
        InferError::new(ErrorKind::InvalidInput, message)
    }

    pub fn internal(message: impl Into<String>) -> InferError {
        InferError::new(ErrorKind::Internal, message)
    }
}

impl From<BackendError> for InferError {
    fn from(e: BackendError) -> InferError {
        let kind = match e {
            BackendError::InvalidInput(_) => ErrorKind::InvalidInput,
            BackendError::Load(_) | BackendError::Library(_) => ErrorKind::NotReady,
            BackendError::Runtime(_) => ErrorKind::Internal,
        };
        InferError::new(kind, e.to_string())
    }
}
