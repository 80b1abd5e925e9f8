//! Hugging Face text-embeddings-inference's routes for a text encoder, for clients written
//! against TEI: `POST /embed`, `POST /similarity`, and `POST /`, which is either, by the form of
//! its `inputs`, as TEI serves it (what Hugging Face's `InferenceClient(model=URL)` and the
//! LangChain and LlamaIndex classes built on it send).
//!
//! `POST /decode` turns token ids back into text, and `POST /tokenize` with TEI's body (`inputs`)
//! lists each input's tokens ([`tokenize`]; the route is vLLM's too, told apart by the body).
//! `POST /rerank` with TEI's body (`query`, `texts`) orders the texts by their score against
//! the query ([`rerank`]; the route is vLLM's too, told apart by the body).
//! `GET /info` describes the encoder as TEI describes its model ([`info`]): `?model=` names it,
//! and may be left out when the repository has only one.
//!
//! `/embed`'s body is TEI's: `inputs` (a string or a list of strings), `normalize`, `truncate`,
//! `truncation_direction` (`Right`, the default, cuts a long text's end; `Left` its start),
//! `prompt_name` (one of the model's prompts, put before
//! each text: [`sheaf_core::embed::TextEncoder::prompt`]), `dimensions`; plus `model`, which TEI has no need of
//! since it serves one model: here it names the text encoder, and may be left out when the
//! repository has only one. The answer is a list of vectors, one per input. `/similarity` takes
//! `inputs: {source_sentence, sentences}` and `parameters: {truncate, truncation_direction,
//! prompt_name}`
//! (and `model`), and answers the cosine similarity of the source sentence's vector to each
//! sentence's, in order. Errors have TEI's shape, `{"error", "error_type"}`, and TEI's status for
//! a request that does not validate, 413; a body that is not the route's JSON is 422.
//!
//! `POST /embed_all` answers each input's token states, unpooled ([`embed_all`]: `inputs`,
//! `truncate`, `truncation_direction`, `prompt_name`, `model`).
//!
//! TEI's routes for what sheaf's encoders do not compute (`/embed_sparse`, `/predict`) answer
//! 501 with why ([`NO_SPARSE`], [`NO_CLASSIFIER`]), as their gRPC calls answer UNIMPLEMENTED.

use axum::extract::rejection::JsonRejection;
use axum::extract::Query;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sheaf_backend::DataType;
use sheaf_core::config::PoolingConfig;
use sheaf_core::embed::{
    one_against_others, ranked, EmbedInput, EmbedRequest, EncoderInfo, TruncationSide,
};
use sheaf_core::{ErrorKind, InferError};

use crate::texts::parse_input;
use crate::AppState;

/// TEI's routes, but for `/tokenize` (shared with vLLM's) and `POST /` ([`root`], on the
/// router that holds the dashboard's page).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/embed", post(embed))
        .route("/similarity", post(similarity))
        .route("/decode", post(decode))
        .route("/info", get(info))
        .route("/embed_sparse", post(|| not_served(NO_SPARSE)))
        .route("/embed_all", post(embed_all))
        .route("/predict", post(|| not_served(NO_CLASSIFIER)))
}

/// Why `/embed_sparse` (gRPC `EmbedSparse`) is not served.
pub const NO_SPARSE: &str =
    "sparse embeddings are not served: sheaf's text encoders pool dense vectors (no SPLADE head)";

/// Why `/predict` (gRPC `Predict`) is not served.
pub const NO_CLASSIFIER: &str = "no sequence classifier is served: sheaf's text encoders embed \
     and score; use /embed, /similarity or /rerank";

/// A TEI route for what no model here computes: 501, saying why.
async fn not_served(why: &'static str) -> TeiError {
    TeiError(StatusCode::NOT_IMPLEMENTED, "Backend", why.to_string())
}

/// TEI's `/tokenize` body (the route is shared with vLLM's, which tells the two apart by
/// `inputs`: see [`tokenize`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeBody {
    pub inputs: Value,
    pub model: Option<String>,
    pub add_special_tokens: Option<bool>,
    pub prompt_name: Option<String>,
}

/// TEI's `/decode` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeBody {
    pub ids: Value,
    pub model: Option<String>,
    pub skip_special_tokens: Option<bool>,
}

/// One token as TEI lists it.
#[derive(Debug, serde::Serialize)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

/// TEI's `/embed` body.
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

/// TEI's `/embed_all` body: `/embed`'s, less what applies to a pooled vector.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedAllBody {
    pub inputs: Value,
    pub model: Option<String>,
    pub truncate: Option<bool>,
    pub truncation_direction: Option<String>,
    pub prompt_name: Option<String>,
}

/// TEI's `/similarity` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarityBody {
    pub inputs: SimilarityInputs,
    pub model: Option<String>,
    #[serde(default)]
    pub parameters: SimilarityParameters,
}

/// A source sentence and the sentences it is compared with.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarityInputs {
    pub source_sentence: String,
    pub sentences: Vec<String>,
}

/// How `/similarity` reads its sentences.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimilarityParameters {
    pub truncate: Option<bool>,
    pub truncation_direction: Option<String>,
    pub prompt_name: Option<String>,
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
            ErrorKind::InvalidInput | ErrorKind::ContextExceeded => validation(e.message),
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

/// A body that is not the route's JSON.
fn unprocessable(message: String) -> TeiError {
    TeiError(StatusCode::UNPROCESSABLE_ENTITY, "Validation", message)
}

/// `POST /embed`: `[[f32, …], …]`, one vector per input.
pub async fn embed(
    State(state): State<AppState>,
    body: Result<Json<EmbedBody>, JsonRejection>,
) -> Result<Json<Vec<Vec<f32>>>, TeiError> {
    let Json(body) = body.map_err(|e| unprocessable(e.body_text()))?;
    embed_texts(&state, body).await.map(Json)
}

/// `POST /embed_all`: `[[[f32, …], …], …]`, per input, the encoder's state of each of its
/// tokens (special tokens included), unpooled and as the model gave them.
pub async fn embed_all(
    State(state): State<AppState>,
    body: Result<Json<EmbedAllBody>, JsonRejection>,
) -> Result<Json<Vec<Vec<Vec<f32>>>>, TeiError> {
    let Json(body) = body.map_err(|e| unprocessable(e.body_text()))?;
    let side = truncation_side(body.truncation_direction.as_deref())?;
    let input = parse_input(&body.inputs, "inputs").map_err(validation)?;
    let mut request = EmbedRequest::new(input);
    request.prompt_name = body.prompt_name;
    request.truncate = body.truncate;
    request.truncation_side = side;
    let answer = encoder(&state, body.model)
        .await?
        .embed_tokens(request)
        .await?;
    Ok(Json(answer.states))
}

/// `POST /similarity`: `[f32, …]`, the source sentence's similarity to each sentence.
pub async fn similarity(
    State(state): State<AppState>,
    body: Result<Json<SimilarityBody>, JsonRejection>,
) -> Result<Json<Vec<f32>>, TeiError> {
    let Json(body) = body.map_err(|e| unprocessable(e.body_text()))?;
    compare(&state, body).await.map(Json)
}

/// `POST /`, as TEI serves it for a text encoder: sentence similarity when `inputs` is an
/// object (`{source_sentence, sentences}`), embeddings otherwise.
pub async fn root(
    State(state): State<AppState>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, TeiError> {
    let form: Value = serde_json::from_slice(&body)
        .map_err(|e| unprocessable(format!("the body is not JSON: {e}")))?;
    let read = |e: JsonRejection| unprocessable(e.body_text());
    let answer = if form.get("inputs").is_some_and(Value::is_object) {
        let Json(body) = Json::from_bytes(&body).map_err(read)?;
        json!(compare(&state, body).await?)
    } else {
        let Json(body) = Json::from_bytes(&body).map_err(read)?;
        json!(embed_texts(&state, body).await?)
    };
    Ok(Json(answer))
}

/// `POST /tokenize` in TEI's form: `[[{"id", "text", "special", "start", "stop"}, …], …]`, the
/// tokens of each input (`start` and `stop`: where a token lies in its text's bytes).
pub async fn tokenize(state: &AppState, body: &[u8]) -> Response {
    let answer = async {
        let Json(body): Json<TokenizeBody> =
            Json::from_bytes(body).map_err(|e| unprocessable(e.body_text()))?;
        let texts = crate::texts::parse_texts(&body.inputs, "inputs").map_err(validation)?;
        let encoder = encoder(state, body.model).await?.text_encoder()?;
        let special = body.add_special_tokens.unwrap_or(true);
        texts
            .iter()
            .map(|text| {
                Ok(encoder
                    .tokens(text, special, body.prompt_name.as_deref())?
                    .into_iter()
                    .map(|t| Token {
                        id: t.id,
                        text: t.text,
                        special: t.special,
                        start: t.span.map(|s| s.0),
                        stop: t.span.map(|s| s.1),
                    })
                    .collect())
            })
            .collect::<Result<Vec<Vec<Token>>, TeiError>>()
    };
    match answer.await {
        Ok(tokens) => Json(tokens).into_response(),
        Err(e) => e.into_response(),
    }
}

/// TEI's `/rerank` body (the route is shared with vLLM's, which tells the two apart by
/// `texts`: see [`rerank`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankBody {
    pub query: String,
    pub texts: Vec<String>,
    pub model: Option<String>,
    pub truncate: Option<bool>,
    pub truncation_direction: Option<String>,
    pub raw_scores: Option<bool>,
    pub return_text: Option<bool>,
}

/// One text's place in TEI's `/rerank` answer.
#[derive(Debug, Serialize)]
struct Rank<'a> {
    index: usize,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

/// `POST /rerank` in TEI's form: `[{"index", "score", "text"?}, …]`, every text best first.
/// A score is the cosine of the query's vector and the text's (the encoder is a bi-encoder),
/// so there are no raw logits to give: `raw_scores: true` is refused.
pub async fn rerank(state: &AppState, body: &[u8]) -> Response {
    let answer = async {
        let Json(body): Json<RerankBody> =
            Json::from_bytes(body).map_err(|e| unprocessable(e.body_text()))?;
        let side = truncation_side(body.truncation_direction.as_deref())?;
        if body.raw_scores == Some(true) {
            return Err(validation(
                "raw_scores is not supported: a score is the cosine of two texts' vectors, \
                 with no logits before it",
            ));
        }
        let texts = one_against_others(
            body.query,
            body.texts.iter().cloned(),
            ("query", "texts"),
            "rank",
        )?;
        let mut request = EmbedRequest::new(EmbedInput::Texts(texts));
        request.truncate = body.truncate;
        request.truncation_side = side;
        let answer = encoder(state, body.model).await?.embed(request).await?;
        Ok((ranked(&answer.scores(1), 0), body.texts, body.return_text))
    };
    match answer.await {
        Ok((order, texts, show)) => {
            let show = show.unwrap_or(false);
            let ranks: Vec<Rank> = order
                .into_iter()
                .map(|(index, score)| Rank {
                    index,
                    score,
                    text: show.then(|| texts[index].as_str()),
                })
                .collect();
            Json(ranks).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /info`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InfoQuery {
    pub model: Option<String>,
}

/// TEI's description of the model it serves, from the encoder's [`EncoderInfo`].
#[derive(Debug, Serialize)]
pub struct Info {
    model_id: String,
    model_sha: Option<String>,
    model_dtype: String,
    served_model_name: String,
    model_type: Value,
    max_concurrent_requests: usize,
    max_input_length: usize,
    max_batch_tokens: usize,
    max_batch_requests: Option<usize>,
    max_client_batch_size: usize,
    auto_truncate: bool,
    tokenization_workers: usize,
    version: &'static str,
    sha: Option<String>,
    docker_label: Option<String>,
}

impl Info {
    fn of(e: EncoderInfo) -> Info {
        let pooling = match e.pooling {
            PoolingConfig::Mean => "mean",
            PoolingConfig::Cls => "cls",
            PoolingConfig::Last => "last_token",
        };
        Info {
            model_id: e.name.clone(),
            model_sha: None,
            model_dtype: dtype_name(e.dtype),
            served_model_name: e.name,
            model_type: json!({"embedding": {"pooling": pooling}}),
            max_concurrent_requests: e.max_queue_size,
            max_input_length: e.max_input_tokens,
            max_batch_tokens: e.max_batch_tokens,
            max_batch_requests: (e.max_batch_size > 0).then_some(e.max_batch_size),
            max_client_batch_size: e.max_inputs,
            auto_truncate: e.truncate,
            tokenization_workers: tokenization_workers(),
            version: env!("CARGO_PKG_VERSION"),
            sha: None,
            docker_label: None,
        }
    }
}

/// A vector type as TEI names a model's (`float32`, `float16`…).
pub(crate) fn dtype_name(dtype: DataType) -> String {
    match dtype {
        DataType::F32 => "float32".to_string(),
        DataType::F16 => "float16".to_string(),
        DataType::BF16 => "bfloat16".to_string(),
        other => other.as_str().to_ascii_lowercase(),
    }
}

/// Texts are tokenised on the runtime's threads (long ones on its blocking pool): one per core.
pub(crate) fn tokenization_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `GET /info`: the encoder as TEI describes its model. TEI's `model_type` for an encoder is
/// `{"embedding": {"pooling"}}`; `max_batch_tokens` is 0 where the model has no token budget.
pub async fn info(
    State(state): State<AppState>,
    query: Result<Query<InfoQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Info>, TeiError> {
    let Query(query) = query.map_err(|e| unprocessable(e.body_text()))?;
    // A query names no payload: what does not validate is a bad request, not a large one.
    let bad = |e: InferError| match e.kind {
        ErrorKind::InvalidInput => TeiError(StatusCode::BAD_REQUEST, "Validation", e.message),
        _ => TeiError::from(e),
    };
    let handle = crate::texts::encoder(&state, query.model)
        .await
        .map_err(bad)?;
    Ok(Json(Info::of(handle.encoder_info().map_err(bad)?)))
}

/// `POST /decode`: `["…", …]`, the text of each list of ids (`ids` one list or several).
pub async fn decode(
    State(state): State<AppState>,
    body: Result<Json<DecodeBody>, JsonRejection>,
) -> Result<Json<Vec<String>>, TeiError> {
    let Json(body) = body.map_err(|e| unprocessable(e.body_text()))?;
    let lists = match crate::texts::parse_input(&body.ids, "ids") {
        Ok(sheaf_core::embed::EmbedInput::Tokens(lists)) => lists,
        _ => {
            return Err(validation(
                "`ids` must be a non-empty list of token ids, or a list of such lists",
            ))
        }
    };
    let encoder = encoder(&state, body.model).await?.text_encoder()?;
    let skip = body.skip_special_tokens.unwrap_or(true);
    let texts = lists
        .iter()
        .map(|ids| encoder.decode(ids, skip))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(texts))
}

async fn embed_texts(state: &AppState, body: EmbedBody) -> Result<Vec<Vec<f32>>, TeiError> {
    let side = truncation_side(body.truncation_direction.as_deref())?;
    let input = parse_input(&body.inputs, "inputs").map_err(validation)?;
    let mut request = EmbedRequest::new(input);
    request.prompt_name = body.prompt_name;
    request.normalize = body.normalize;
    request.truncate = body.truncate;
    request.truncation_side = side;
    request.dimensions = body.dimensions;
    Ok(encoder(state, body.model)
        .await?
        .embed(request)
        .await?
        .vectors)
}

async fn compare(state: &AppState, body: SimilarityBody) -> Result<Vec<f32>, TeiError> {
    let SimilarityBody {
        inputs,
        model,
        parameters,
    } = body;
    let side = truncation_side(parameters.truncation_direction.as_deref())?;
    let texts = one_against_others(
        inputs.source_sentence,
        inputs.sentences.into_iter(),
        ("inputs.source_sentence", "inputs.sentences"),
        "compare",
    )?;
    let mut request = EmbedRequest::new(EmbedInput::Texts(texts));
    request.truncate = parameters.truncate;
    request.truncation_side = side;
    request.prompt_name = parameters.prompt_name;
    let answer = encoder(state, model).await?.embed(request).await?;
    Ok(answer.scores(1))
}

/// TEI's `truncation_direction`: `Right` (the default) or `Left`, in any case.
fn truncation_side(truncation_direction: Option<&str>) -> Result<TruncationSide, TeiError> {
    match truncation_direction {
        None => Ok(TruncationSide::Right),
        Some(d) => TruncationSide::parse(d).ok_or_else(|| {
            validation(format!(
                "truncation_direction '{}' is neither 'Right' nor 'Left'",
                sheaf_core::clip(d)
            ))
        }),
    }
}

/// The text encoder `model` names, else the repository's only one.
async fn encoder(
    state: &AppState,
    model: Option<String>,
) -> Result<std::sync::Arc<sheaf_core::ModelHandle>, TeiError> {
    Ok(crate::texts::encoder(state, model).await?)
}
