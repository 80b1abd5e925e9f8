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
//!
//! As Triton's `SAGEMAKER_TRITON_INFERENCE_TYPE`, `/invocations` may instead take the body of
//! the generate extension's `/generate` or `/generate_stream` (server-sent events, for a
//! streaming model), for an endpoint that serves a language model; and as
//! `SAGEMAKER_TRITON_PING_MODE`, `/ping` may answer the server's liveness (200 while it runs)
//! rather than its readiness.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::cloud::{endpoint_model, infer_binary_named, readiness};
use super::handlers::ModelPath;
use crate::error::ApiError;
use crate::AppState;

/// The content type of a body with binary tensors, before its `json-header-size`.
pub const BINARY_CONTENT_TYPE: &str = "application/vnd.sagemaker-triton.binary+json";

/// How the SageMaker port answers: the model and route `/invocations` runs, and what `/ping`
/// tells.
#[derive(Debug, Clone, Default)]
pub struct SageMakerOptions {
    /// The endpoint's model; `None`: the only model the server has.
    pub model: Option<String>,
    pub inference: InferenceType,
    pub ping: PingMode,
}

/// The route whose body `/invocations` takes (Triton's `SAGEMAKER_TRITON_INFERENCE_TYPE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InferenceType {
    /// `POST /v2/models/<model>/infer`.
    #[default]
    Infer,
    /// The generate extension's `/generate`: one JSON answer.
    Generate,
    /// `/generate_stream`: each answer as a server-sent event.
    GenerateStream,
}

/// What `/ping` answers (Triton's `SAGEMAKER_TRITON_PING_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PingMode {
    /// 200 once the server is ready, 503 before and while it drains.
    #[default]
    Ready,
    /// 200 while the server runs.
    Live,
}

impl std::str::FromStr for InferenceType {
    type Err = String;

    /// The variable's words: `infer`, `generate`, `generate_stream`.
    fn from_str(given: &str) -> Result<Self, String> {
        match given {
            "infer" => Ok(InferenceType::Infer),
            "generate" => Ok(InferenceType::Generate),
            "generate_stream" => Ok(InferenceType::GenerateStream),
            other => Err(format!(
                "'{other}': give infer, generate or generate_stream"
            )),
        }
    }
}

impl std::str::FromStr for PingMode {
    type Err = String;

    /// The variable's words: `ready`, `live`.
    fn from_str(given: &str) -> Result<Self, String> {
        match given {
            "ready" => Ok(PingMode::Ready),
            "live" => Ok(PingMode::Live),
            other => Err(format!("'{other}': give ready or live")),
        }
    }
}

/// What the SageMaker port needs: the server, and how it answers.
#[derive(Clone)]
pub struct SageMaker {
    pub state: AppState,
    pub options: SageMakerOptions,
    /// The models a multi-model endpoint loaded ([`super::sagemaker_models`]).
    pub models: super::sagemaker_models::Loaded,
}

/// `GET /ping`: 200 once ready (or, in the live mode, while the server runs), 503 otherwise.
pub async fn ping(State(s): State<SageMaker>) -> StatusCode {
    match s.options.ping {
        PingMode::Ready => readiness(&s.state).await,
        PingMode::Live => StatusCode::OK,
    }
}

/// `POST /invocations`: the infer route (or the generate extension's), on the endpoint's
/// model.
pub async fn invocations(
    State(s): State<SageMaker>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let model = endpoint_model(&s.state, &s.options.model)?;
    if s.options.inference == InferenceType::Infer {
        return infer_binary_named(s.state, model, headers, body, BINARY_CONTENT_TYPE).await;
    }
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let path = Path(ModelPath {
        model,
        version: None,
    });
    if s.options.inference == InferenceType::Generate {
        super::generate::generate(State(s.state), path, headers, body).await
    } else {
        super::generate::generate_stream(State(s.state), path, headers, body).await
    }
}
