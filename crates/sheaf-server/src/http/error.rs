//! The one mapping from [`ErrorKind`] to HTTP status, with the KServe error body
//! `{"error": "..."}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
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
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::ModelNotFound => StatusCode::NOT_FOUND,
            ErrorKind::NotReady | ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
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
