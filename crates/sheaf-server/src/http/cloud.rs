//! What the clouds' container frontends share ([`super::sagemaker`], [`super::vertex`]): an
//! endpoint's readiness and model, and the infer route with binary bodies whose JSON length is
//! named in a content type of the cloud's own (`...;json-header-size=N`) rather than in
//! `Inference-Header-Content-Length`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::handlers::{self, ModelPath};
use crate::error::ApiError;
use crate::kserve::HEADER_CONTENT_LENGTH;
use crate::AppState;

/// An endpoint's health: 200 once the server is ready, 503 before and while it drains.
pub(super) async fn readiness(state: &AppState) -> StatusCode {
    if state.ready_checked().await {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// The model an endpoint runs: the one it names, else the server's only model.
pub(super) fn endpoint_model(state: &AppState, named: &Option<String>) -> Result<String, ApiError> {
    match named {
        Some(model) => Ok(model.clone()),
        None => only_model(state),
    }
}

/// The infer route on `model`, for a cloud's frontend whose binary bodies name their JSON
/// length in a content type of their own (`binary`): read from the request's, and written in
/// the answer's when binary outputs follow, as that cloud's clients read it.
pub(super) async fn infer_binary_named(
    state: AppState,
    model: String,
    mut headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    binary: &str,
) -> Result<Response, ApiError> {
    if let Some(n) = json_header_size(&headers, binary)? {
        let value = HeaderValue::from(n);
        headers.insert(HEADER_CONTENT_LENGTH, value);
    }
    let path = Path(ModelPath {
        model,
        version: None,
    });
    let mut response = handlers::infer(State(state), path, headers, body).await?;
    let length = response
        .headers()
        .get(HEADER_CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(n) = length {
        let kind = format!("{binary};json-header-size={n}");
        if let Ok(value) = HeaderValue::from_str(&kind) {
            response.headers_mut().insert(header::CONTENT_TYPE, value);
        }
    }
    Ok(response.into_response())
}

/// The `json-header-size` of a `binary` body's content type; `None` for a JSON body.
fn json_header_size(headers: &HeaderMap, binary: &str) -> Result<Option<usize>, ApiError> {
    let Some(kind) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return Ok(None);
    };
    let mut parts = kind.split(';').map(str::trim);
    if !parts
        .next()
        .is_some_and(|media| media.eq_ignore_ascii_case(binary))
    {
        return Ok(None);
    }
    let size = parts
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("json-header-size"))
        .map(|(_, v)| v.trim().parse::<usize>());
    match size {
        Some(Ok(n)) => Ok(Some(n)),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("a {binary} body names its JSON length: {binary};json-header-size=N"),
        )),
    }
}

/// The server's one model, for an endpoint that names none.
fn only_model(state: &AppState) -> Result<String, ApiError> {
    let names: Vec<String> = state
        .manager
        .index(false)
        .into_iter()
        .map(|m| m.name)
        .collect();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the server has {} models and no default: name the one the endpoint runs \
                 (SageMaker: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME or --sagemaker-model; Vertex AI: \
                 --vertex-ai-default-model)",
                names.len()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::sagemaker::BINARY_CONTENT_TYPE as SAGEMAKER;

    fn with_type(kind: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(kind).unwrap());
        headers
    }

    #[test]
    fn a_binary_body_names_its_json_length_in_its_content_type() {
        assert_eq!(
            json_header_size(&HeaderMap::new(), SAGEMAKER).unwrap(),
            None
        );
        assert_eq!(
            json_header_size(&with_type("application/json"), SAGEMAKER).unwrap(),
            None
        );
        let binary = with_type("application/vnd.sagemaker-triton.binary+json;json-header-size=123");
        assert_eq!(json_header_size(&binary, SAGEMAKER).unwrap(), Some(123));
        let spaced =
            with_type("application/vnd.sagemaker-triton.binary+json; json-header-size = 7");
        assert_eq!(json_header_size(&spaced, SAGEMAKER).unwrap(), Some(7));
        for bad in [
            "application/vnd.sagemaker-triton.binary+json",
            "application/vnd.sagemaker-triton.binary+json;json-header-size=x",
        ] {
            assert!(
                json_header_size(&with_type(bad), SAGEMAKER).is_err(),
                "{bad}"
            );
        }
    }
}
