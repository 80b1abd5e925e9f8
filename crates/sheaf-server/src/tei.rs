//! Hugging Face text-embeddings-inference's `POST /embed`, for clients written against TEI, also
//! served at `POST /` as TEI serves it (what Hugging Face's `InferenceClient(model=URL)` and the
//! LangChain and LlamaIndex classes built on it send).
//!
//! The body is TEI's: `inputs` (a string or a list of strings), `normalize`, `truncate`,
//! `truncation_direction` (`right` only), `dimensions`; plus `model`, which TEI has no need of
//! since it serves one model: here it names the text encoder, and may be left out when the
//! repository has only one. The answer is a list of vectors, one per input. Errors have TEI's
//! shape, `{"error", "error_type"}`, and TEI's status for a request that does not validate, 413.

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sheaf_core::embed::EmbedRequest;
use sheaf_core::{ErrorKind, InferError};

use crate::texts::parse_input;
use crate::AppState;

/// The `/embed` route.
pub fn routes() -> Router<AppState> {
    Router::new().route("/embed", post(embed))
}

/// TEI's request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedBody {
    pub inputs: Value,
    pub model: Option<String>,
    pub normalize: Option<bool>,
    pub truncate: Option<bool>,
    pub truncation_direction: Option<String>,
    pub prompt_name: Option<String>,
    pub dimensions: Option<usize>,
}

/// An error in TEI's shape.
pub struct TeiError(StatusCode, &'static str, String);

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        let message = sheaf_core::clip_to(&self.2, sheaf_core::MESSAGE_CHARS);
        let mut response = (
            self.0,
            Json(json!({ "error": message, "error_type": self.1 })),
        )
            .into_response();
        if self.0 == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

fn validation(message: impl Into<String>) -> TeiError {
    TeiError(StatusCode::PAYLOAD_TOO_LARGE, "Validation", message.into())
}

impl From<InferError> for TeiError {
    fn from(e: InferError) -> Self {
        match e.kind {
            ErrorKind::InvalidInput => validation(e.message),
            ErrorKind::ModelNotFound => TeiError(StatusCode::NOT_FOUND, "Validation", e.message),
            ErrorKind::Conflict => TeiError(StatusCode::CONFLICT, "Validation", e.message),
            ErrorKind::NotReady | ErrorKind::Overloaded => {
                TeiError(StatusCode::SERVICE_UNAVAILABLE, "Overloaded", e.message)
            }
            ErrorKind::Timeout => TeiError(StatusCode::GATEWAY_TIMEOUT, "Overloaded", e.message),
            ErrorKind::Internal => {
                TeiError(StatusCode::INTERNAL_SERVER_ERROR, "Backend", e.message)
            }
        }
    }
}

/// `[[f32, …], …]`: one vector per input.
pub async fn embed(
    State(state): State<AppState>,
    body: Result<Json<EmbedBody>, JsonRejection>,
) -> Result<Json<Vec<Vec<f32>>>, TeiError> {
    let Json(body) = body.map_err(|e| {
        TeiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation",
            e.body_text(),
        )
    })?;
    if let Some(d) = body
        .truncation_direction
        .as_deref()
        .filter(|d| !d.eq_ignore_ascii_case("right"))
    {
        return Err(validation(format!(
            "truncation_direction '{}' is not supported; sheaf truncates on the right",
            sheaf_core::clip(d)
        )));
    }
    if body.prompt_name.is_some() {
        return Err(validation(
            "prompt_name is not supported: the model has no configured prompts",
        ));
    }
    let input = parse_input(&body.inputs, "inputs").map_err(validation)?;
    let name = match body.model {
        Some(name) => name,
        None => only_encoder(&state)?,
    };
    let model = state.manager.get_or_load(&name, None).await?;
    let mut request = EmbedRequest::new(input);
    request.normalize = body.normalize;
    request.truncate = body.truncate;
    request.dimensions = body.dimensions;
    Ok(Json(model.embed(request).await?.vectors))
}

/// The repository's one loaded text encoder, for a request that names none.
fn only_encoder(state: &AppState) -> Result<String, TeiError> {
    let encoders = state.manager.encoders();
    match encoders.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(TeiError(
            StatusCode::NOT_FOUND,
            "Validation",
            "no embedding model is loaded".into(),
        )),
        many => Err(validation(format!(
            "several embedding models are loaded ({}): name one in `model`",
            many.join(", ")
        ))),
    }
}
