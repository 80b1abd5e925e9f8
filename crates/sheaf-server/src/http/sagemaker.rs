//! Amazon SageMaker's container contract (tritonserver's `--allow-sagemaker`): on its own port
//! (8080), `GET /ping` answers 200 once the server is ready (503 before and while it drains),
//! and `POST /invocations` is an inference request to the endpoint's model (Triton's
//! `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`; without one, the repository's only model), in the body
//! of `POST /v2/models/<model>/infer`. A body with binary tensors names its JSON length in the
//! content type, as Triton's SageMaker frontend takes it:
//! `application/vnd.sagemaker-triton.binary+json;json-header-size=N`. The answer is the infer
//! route's, binary outputs named the same way. The port passes the same checks as the main one
//! (keys, body limits, drain), with `/ping` open as the health routes are. The multi-model
//! endpoint's routes (`/models`...) are [`super::sagemaker_models`]'s.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::cloud::{endpoint_model, infer_binary_named, readiness};
use crate::error::ApiError;
use crate::AppState;

/// The content type of a body with binary tensors, before its `json-header-size`.
pub const BINARY_CONTENT_TYPE: &str = "application/vnd.sagemaker-triton.binary+json";

/// What the SageMaker port needs: the server, and the model `/invocations` runs.
#[derive(Clone)]
pub struct SageMaker {
    pub state: AppState,
    /// The endpoint's model; `None`: the only model the server has.
    pub model: Option<String>,
    /// The models a multi-model endpoint loaded ([`super::sagemaker_models`]).
    pub models: super::sagemaker_models::Loaded,
}

/// `GET /ping`: 200 once ready, 503 otherwise.
pub async fn ping(State(s): State<SageMaker>) -> StatusCode {
    readiness(&s.state)
}

/// `POST /invocations`: the infer route, on the endpoint's model.
pub async fn invocations(
    State(s): State<SageMaker>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let model = endpoint_model(&s.state, &s.model)?;
    infer_binary_named(s.state, model, headers, body, BINARY_CONTENT_TYPE).await
}
