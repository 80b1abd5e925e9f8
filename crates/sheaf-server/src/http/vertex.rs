//! Google Vertex AI's custom-container contract (tritonserver's `--allow-vertex-ai`): on its own
//! port (`AIP_HTTP_PORT`, 8080), the health route (`AIP_HEALTH_ROUTE`) answers 200 once the
//! server is ready (503 otherwise), and the prediction route (`AIP_PREDICT_ROUTE`) is an
//! inference request to the endpoint's model (`--vertex-ai-default-model`; without one, the
//! server's only model) in the body of `POST /v2/models/<model>/infer`, binary tensors naming
//! their JSON length in the content type:
//! `application/vnd.vertex-ai-triton.binary+json;json-header-size=N`.
//!
//! As under Triton, a prediction request with `X-Vertex-Ai-Triton-Redirect: PATH` goes to
//! that route of the main HTTP API instead (`v2/models/other/infer`, `v2/models/x/ready`, ...),
//! with its method, headers and body: it passes the main port's checks for that route (its key,
//! its restricted group), so the redirect opens nothing a client could not reach there. The
//! prediction route passes the main port's checks too (keys, body limits, drain, the request
//! memory, where a redirected body is counted once); the health route none, as Vertex's health
//! checks send no header.

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceExt;

use super::cloud::{endpoint_model, infer_binary_named, readiness};
use crate::error::ApiError;
use crate::AppState;

/// The content type of a body with binary tensors, before its `json-header-size`.
pub const BINARY_CONTENT_TYPE: &str = "application/vnd.vertex-ai-triton.binary+json";

/// The header that sends a prediction request to another route.
pub const REDIRECT: &str = "x-vertex-ai-triton-redirect";

/// What the Vertex AI port needs.
#[derive(Clone)]
pub struct Vertex {
    pub state: AppState,
    /// The endpoint's model; `None`: the only model the server has.
    pub model: Option<String>,
    /// The main HTTP API, where redirected requests go.
    pub main: Router,
}

/// The health route: 200 once ready, 503 otherwise.
pub async fn health(State(v): State<Vertex>) -> StatusCode {
    readiness(&v.state).await
}

/// The prediction route: the infer route on the endpoint's model, or, redirected, any route of
/// the main API.
pub async fn predict(
    State(v): State<Vertex>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if let Some(target) = headers.get(REDIRECT) {
        let target = target.to_str().unwrap_or("").trim().trim_start_matches('/');
        let uri: Uri = format!("/{target}").parse().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "{REDIRECT} '{}' is not a route of the HTTP API",
                    sheaf_core::clip(target)
                ),
            )
        })?;
        let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        // The route's own method: a POST for inference and the repository API, a GET for
        // readiness and metadata, as Triton takes a redirect.
        let get = body.is_empty() && !wants_post(uri.path());
        let mut request = Request::new(Body::from(body));
        *request.method_mut() = if get {
            axum::http::Method::GET
        } else {
            axum::http::Method::POST
        };
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        request.headers_mut().remove(REDIRECT);
        // This port's gate holds the body's bytes until the answer is sent.
        request.extensions_mut().insert(super::gate::HeldAlready);
        return Ok(v.main.oneshot(request).await.into_response());
    }
    let model = endpoint_model(&v.state, &v.model)?;
    infer_binary_named(v.state, model, headers, body, BINARY_CONTENT_TYPE).await
}

/// Whether a route of the main API takes a POST.
fn wants_post(path: &str) -> bool {
    path.ends_with("/infer")
        || path.ends_with("/generate")
        || path.ends_with("/generate_stream")
        || path.starts_with("/v2/repository/")
        || path.ends_with("/register")
        || path.ends_with("/unregister")
        || path.starts_with("/v1/")
        || path == "/embed"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_that_take_a_post_are_told_from_those_that_take_a_get() {
        for post in [
            "/v2/models/m/infer",
            "/v2/models/m/versions/1/infer",
            "/v2/repository/index",
            "/v2/repository/models/m/load",
            "/v1/chat/completions",
        ] {
            assert!(wants_post(post), "{post}");
        }
        for get in [
            "/v2/models/m/ready",
            "/v2/models/m",
            "/v2/health/ready",
            "/v2",
        ] {
            assert!(!wants_post(get), "{get}");
        }
    }
}
