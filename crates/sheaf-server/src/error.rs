//! The one error vocabulary of the HTTP routes: the one mapping from [`ErrorKind`] to HTTP
//! status ([`ApiError`]), rendered in the KServe body `{"error": "..."}` by the KServe routes
//! and in OpenAI's `{"error": {"message", "type", ...}}` by the OpenAI routes ([`OpenAiError`]).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sheaf_backend::generation::GenError;
use sheaf_core::{ErrorKind, InferError};

/// An error answered over HTTP.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> ApiError {
        let status = match e.kind {
            ErrorKind::InvalidInput | ErrorKind::ContextExceeded => StatusCode::BAD_REQUEST,
            ErrorKind::ModelNotFound => StatusCode::NOT_FOUND,
            ErrorKind::NotReady | ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Conflict => StatusCode::CONFLICT,
        };
        ApiError::new(status, e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(status = %self.status, error = %self.message, "request failed");
        } else {
            tracing::debug!(status = %self.status, error = %self.message, "request rejected");
        }
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let message = sheaf_core::clip_to(&self.message, sheaf_core::MESSAGE_CHARS);
        let mut response = (self.status, Json(json!({ "error": message }))).into_response();
        if retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// An error in OpenAI's shape: its status, its message and, where OpenAI's API names one for
/// the case, its `code` ([`OpenAiError::code`]).
#[derive(Debug)]
pub struct OpenAiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) code: Option<&'static str>,
}

/// OpenAI's `code` for a model the server does not offer.
pub const MODEL_NOT_FOUND: &str = "model_not_found";
/// OpenAI's `code` for a prompt its model's context cannot hold.
pub const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";
/// OpenAI's `code` for a request without a valid API key.
pub const INVALID_API_KEY: &str = "invalid_api_key";

impl OpenAiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> OpenAiError {
        OpenAiError {
            status,
            message: message.into(),
            code: None,
        }
    }

    /// The same error with OpenAI's `code` for its case, which clients read to tell one
    /// refusal from another without parsing its message (a prompt too long for the context, a
    /// model not found, a key refused).
    pub fn code(self, code: &'static str) -> OpenAiError {
        OpenAiError {
            code: Some(code),
            ..self
        }
    }

    /// Its body, `{"error": {"message", "type", "param", "code"}}` ([`openai_body`]).
    pub fn body(&self) -> serde_json::Value {
        openai_body(self.status, &self.message, self.code)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// An error in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, its type
/// named after `status`: the body of an error answer, and a streamed answer's error event.
/// `param` is the request field a refusal names ([`param_of`]), as OpenAI's clients read it.
fn openai_body(status: StatusCode, message: &str, code: Option<&str>) -> serde_json::Value {
    let kind = match status {
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "invalid_request_error"
        }
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::SERVICE_UNAVAILABLE => "server_overloaded",
        _ => "server_error",
    };
    let param = status
        .is_client_error()
        .then(|| param_of(message))
        .flatten();
    let message = sheaf_core::clip_to(message, sheaf_core::MESSAGE_CHARS);
    json!({ "error": { "message": message, "type": kind, "param": param, "code": code } })
}

/// The field a refusal is about. The routes' messages about a field open with its path, as
/// `max_tokens: ...`, `messages[2].content: ...` or `metadata.job: ...`; a message that opens
/// otherwise names none.
pub(crate) fn param_of(message: &str) -> Option<&str> {
    let (path, _) = message.split_once(": ")?;
    let starts = path
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let fits = path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '-'));
    (starts && fits && path.len() <= 128).then_some(path)
}

/// The one mapping of error kinds to statuses (the KServe routes'), in OpenAI's error shape,
/// with OpenAI's code for the kinds it names.
impl From<InferError> for OpenAiError {
    fn from(e: InferError) -> Self {
        let code = match e.kind {
            ErrorKind::ModelNotFound => Some(MODEL_NOT_FOUND),
            ErrorKind::ContextExceeded => Some(CONTEXT_LENGTH_EXCEEDED),
            _ => None,
        };
        let api = ApiError::from(e);
        OpenAiError {
            code,
            ..OpenAiError::new(api.status, api.message)
        }
    }
}

impl From<GenError> for OpenAiError {
    fn from(e: GenError) -> Self {
        InferError::from(e).into()
    }
}

/// A request OpenAI's routes refuse: 400.
pub(crate) fn bad(message: impl Into<String>) -> OpenAiError {
    OpenAiError::new(StatusCode::BAD_REQUEST, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_field_its_message_opens_with() {
        for (message, param) in [
            (
                "max_tokens: invalid value: integer `-3`, expected usize",
                Some("max_tokens"),
            ),
            (
                "messages[2].content: a string or a list of parts",
                Some("messages[2].content"),
            ),
            ("metadata.job: over 512 characters", Some("metadata.job")),
            ("No such Batch object: batch_9", None),
            ("a load's body: not JSON", None),
            ("Failed to parse the request body as JSON", None),
            (": nothing before", None),
        ] {
            assert_eq!(param_of(message), param, "{message}");
            let body = openai_body(StatusCode::BAD_REQUEST, message, None);
            assert_eq!(body["error"]["param"].as_str(), param, "{message}");
        }
        // A server's own failure names no field of the request.
        let body = openai_body(StatusCode::INTERNAL_SERVER_ERROR, "engine: stopped", None);
        assert!(body["error"]["param"].is_null());
    }

    #[test]
    fn the_cases_openai_names_carry_its_code_and_others_none() {
        let code = |e: OpenAiError| e.body()["error"]["code"].as_str().map(str::to_owned);
        let too_long = GenError::PromptTooLong {
            tokens: 9000,
            limit: 8192,
        };
        assert_eq!(
            code(too_long.into()).as_deref(),
            Some(CONTEXT_LENGTH_EXCEEDED)
        );
        let unknown = InferError::new(ErrorKind::ModelNotFound, "unknown model 'nope'");
        let error = OpenAiError::from(unknown);
        assert_eq!(error.status, StatusCode::NOT_FOUND);
        assert_eq!(code(error).as_deref(), Some(MODEL_NOT_FOUND));
        assert_eq!(code(GenError::Invalid("n: at most 8".into()).into()), None);
        assert_eq!(code(bad("max_tokens: below 1")), None);
        let busy = OpenAiError::from(GenError::Overloaded("busy".into()));
        assert_eq!(busy.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(code(busy), None);
    }
}
