//! The one error type of the request path. Each protocol maps [`ErrorKind`] once onto its own
//! status codes (HTTP in `sheaf-server/src/error.rs`).

use sheaf_backend::generation::GenError;
use sheaf_backend::BackendError;

/// What class of failure a request met; it decides the status code a client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or does not fit the model (HTTP 400).
    InvalidInput,
    /// A prompt longer than its model's context can hold with one generated token (HTTP 400,
    /// as [`ErrorKind::InvalidInput`]; OpenAI's routes name it with its own code).
    ContextExceeded,
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
    /// What the request would add exists already: a model name, a registered folder (HTTP
    /// 409).
    Conflict,
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
            BackendError::Load(_) | BackendError::Library(_) | BackendError::Unavailable(_) => {
                ErrorKind::NotReady
            }
            BackendError::Runtime(_) | BackendError::Rescheduled => ErrorKind::Internal,
        };
        InferError::new(kind, e.to_string())
    }
}

impl From<GenError> for InferError {
    fn from(e: GenError) -> InferError {
        let kind = match e {
            GenError::PromptTooLong { .. } => ErrorKind::ContextExceeded,
            GenError::Invalid(_) => ErrorKind::InvalidInput,
            GenError::Overloaded(_) => ErrorKind::Overloaded,
            GenError::Timeout(_) => ErrorKind::Timeout,
            GenError::Internal(_) => ErrorKind::Internal,
        };
        InferError::new(kind, e.to_string())
    }
}

/// The most characters of client-sent text (a model name, a header value) that an error message
/// repeats.
pub const CLIP_CHARS: usize = 128;

/// The most characters of a whole error message sent to a client.
pub const MESSAGE_CHARS: usize = 1024;

/// `text` cut to [`CLIP_CHARS`] characters, saying how long it was, so that a 10 KB name sent
/// by a client is not echoed back (or logged) whole.
pub fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    clip_to(text, CLIP_CHARS)
}

/// `text` cut to `max_chars` characters, on a character boundary, saying how long it was.
pub fn clip_to(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_text_and_cuts_long_text_on_a_character_boundary() {
        assert_eq!(clip("mlp"), "mlp");
        let exact = "a".repeat(CLIP_CHARS);
        assert_eq!(clip(&exact), exact.as_str());
        let long = "é".repeat(10_000);
        let cut = clip(&long);
        assert!(cut.starts_with(&"é".repeat(CLIP_CHARS)));
        assert!(cut.ends_with("… (20000 bytes)"), "{cut}");
        assert!(cut.len() < 400);
    }
}
