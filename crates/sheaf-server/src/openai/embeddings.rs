//! `POST /v1/embeddings`, as OpenAI serves it, for the repository's text encoders (ONNX models
//! with an `embedding` section): `input` as a string, a list of strings, a list of token ids or
//! a list of such lists; `encoding_format` `float` or `base64` (little-endian float32, which
//! the `openai` clients ask for by default); `dimensions` where the model allows it; `usage`;
//! and vLLM's `truncate_prompt_tokens` and `truncation_side` ([`truncate_prompt_tokens`]).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sheaf_core::embed::{EmbedRequest, TruncationSide};

use super::body::{Body, BodyError};
use crate::error::{bad, OpenAiError};
use crate::texts::parse_input;
use crate::AppState;

/// The request body. Fields other than these and `user` are refused by name.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub input: Value,
    pub encoding_format: Option<String>,
    pub dimensions: Option<usize>,
    pub truncate_prompt_tokens: Option<i64>,
    pub truncation_side: Option<String>,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

/// `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
/// "usage"}`.
pub async fn embeddings(
    State(state): State<AppState>,
    body: Result<Body<EmbeddingsRequest>, BodyError>,
) -> Result<Response, OpenAiError> {
    let Body(body) = body.map_err(|e| bad(e.0))?;
    if let Some(key) = body.rest.keys().find(|k| k.as_str() != "user") {
        return Err(bad(format!(
            "{key}: not supported by sheaf's /v1/embeddings; leave it out"
        )));
    }
    let base64 = match body.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(bad(format!(
                "encoding_format '{}' is neither 'float' nor 'base64'",
                sheaf_core::clip(other)
            )))
        }
    };
    let input = parse_input(&body.input, "input").map_err(bad)?;
    let model = state.manager.get_or_load(&body.model, None).await?;
    let mut request = EmbedRequest::new(input);
    request.dimensions = body.dimensions;
    truncate_prompt_tokens(
        &mut request,
        body.truncate_prompt_tokens,
        body.truncation_side.as_deref(),
    )?;
    let answer = model.embed(request).await?;
    let data = answer
        .vectors
        .iter()
        .enumerate()
        .map(|(index, v)| Item {
            object: "embedding",
            index,
            embedding: if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Vector::Float(v)
            },
        })
        .collect();
    Ok(Json(Answer {
        object: "list",
        data,
        model: &answer.model_name,
        usage: Usage {
            prompt_tokens: answer.tokens,
            total_tokens: answer.tokens,
        },
    })
    .into_response())
}

/// The answer body: typed, so that each float32 is written as the shortest text that reads back
/// as the same float32.
#[derive(Serialize)]
struct Answer<'a> {
    object: &'static str,
    data: Vec<Item<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Item<'a> {
    object: &'static str,
    index: usize,
    embedding: Vector<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// vLLM's `truncate_prompt_tokens` and `truncation_side`, on `/v1/embeddings` and the scoring
/// routes: -1 cuts each text at the model's longest input, and k (1 or more) at k tokens,
/// special tokens included; `truncation_side` `left` (vLLM's default) keeps the last tokens and
/// `right` the first. Without `truncate_prompt_tokens`, the model's `embedding.truncate` decides,
/// cutting a text's end.
pub(crate) fn truncate_prompt_tokens(
    request: &mut EmbedRequest,
    value: Option<i64>,
    side: Option<&str>,
) -> Result<(), OpenAiError> {
    let side = match side {
        None => TruncationSide::Left,
        Some(s) => TruncationSide::parse(s).ok_or_else(|| {
            bad(format!(
                "truncation_side '{}' is neither 'left' nor 'right'",
                sheaf_core::clip(s)
            ))
        })?,
    };
    match value {
        None => {}
        Some(-1) => {
            request.truncate = Some(true);
            request.truncation_side = side;
        }
        Some(k) if k >= 1 => {
            request.truncate_to = Some(usize::try_from(k).unwrap_or(usize::MAX));
            request.truncation_side = side;
        }
        Some(k) => {
            return Err(bad(format!(
                "truncate_prompt_tokens {k} is neither -1 (the model's longest input) nor a \
                 number of tokens to keep (1 or more)"
            )))
        }
    }
    Ok(())
}
