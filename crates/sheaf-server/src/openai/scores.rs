//! vLLM's scoring routes for the repository's text encoders: `POST /score` (and `/v1/score`)
//! scores texts against texts, and `POST /rerank` (and `/v1/rerank`, and `/v2/rerank`, where
//! Cohere's `ClientV2.rerank` posts) orders documents by their score against a query.
//!
//! Every text encoder sheaf serves is a bi-encoder: each text is embedded on its own, and a
//! score is the cosine similarity of two texts' vectors, as vLLM scores with an embedding model
//! (a cross-encoder, which reads both texts at once, is not served). All texts of a request go
//! to the model's queue as one embeddings request ([`sheaf_core::embed`]), which also builds
//! the scores and the order; this module reads the bodies and renders the answers.
//!
//! `/score` takes `text_1` and `text_2`, each a string or a list of strings: one `text_1` is
//! scored against every `text_2`; otherwise the lists pair up and must be as long.
//! `/rerank` takes `query`, `documents` (strings, or objects with a `text`), `top_n` (0 or
//! absent: all) and Cohere's `return_documents`; its results come best first, each with its
//! place in `documents`. Both take `model` (may be left out when one encoder is loaded) and
//! `truncate_prompt_tokens` (-1: cut texts at the model's longest input; k: at k tokens) with
//! `truncation_side` (`left`, vLLM's default, keeps the last tokens). Errors have
//! OpenAI's shape, as on vLLM. A `/rerank` body in TEI's form (`texts`, no `documents`) is
//! TEI's, answered in TEI's shape ([`crate::tei::rerank`]).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sheaf_core::embed::{
    one_against_others, ranked, EmbedInput, EmbedRequest, Embeddings, MAX_INPUTS,
};

use super::body::{Body, BodyError};
use super::handlers::{next_id, now_s};
use crate::error::{bad, OpenAiError};
use crate::texts::{encoder, parse_texts};
use crate::AppState;

/// `/score`'s body.
#[derive(Debug, Deserialize)]
pub struct ScoreBody {
    pub model: Option<String>,
    pub text_1: Value,
    pub text_2: Value,
    pub truncate_prompt_tokens: Option<i64>,
    pub truncation_side: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `/rerank`'s body.
#[derive(Debug, Deserialize)]
pub struct RerankBody {
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<Document>,
    pub top_n: Option<usize>,
    pub return_documents: Option<bool>,
    pub truncate_prompt_tokens: Option<i64>,
    pub truncation_side: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A document to rank: its text, or an object holding it (Jina's and vLLM's form).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Document::Text(text) | Document::Object { text } => text,
        }
    }
}

#[derive(Serialize)]
struct ScoreAnswer<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    data: Vec<ScoreItem>,
    usage: Usage,
}

#[derive(Serialize)]
struct ScoreItem {
    index: usize,
    object: &'static str,
    score: f32,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct RerankAnswer<'a> {
    id: String,
    model: &'a str,
    usage: Usage,
    results: Vec<RerankItem<'a>>,
}

#[derive(Serialize)]
struct RerankItem<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText<'a>>,
    relevance_score: f32,
}

#[derive(Serialize)]
struct DocumentText<'a> {
    text: &'a str,
}

/// `POST /score`: `{"id", "object": "list", "created", "model", "data": [{"index", "object":
/// "score", "score"}], "usage"}`, one score per `text_2` (or per pair).
pub async fn score(
    State(state): State<AppState>,
    body: Result<Body<ScoreBody>, BodyError>,
) -> Result<Response, OpenAiError> {
    let Body(body) = body.map_err(|e| bad(e.0))?;
    refuse_others(&body.rest)?;
    let firsts = parse_texts(&body.text_1, "text_1").map_err(bad)?;
    let seconds = parse_texts(&body.text_2, "text_2").map_err(bad)?;
    if firsts.len() != 1 && firsts.len() != seconds.len() {
        return Err(bad(format!(
            "`text_1` holds {} texts and `text_2` {}: give one `text_1`, or one for each `text_2`",
            firsts.len(),
            seconds.len()
        )));
    }
    let queries = firsts.len();
    let mut texts = firsts;
    texts.extend(seconds);
    let cut = (body.truncate_prompt_tokens, body.truncation_side.as_deref());
    let answer = embed(&state, body.model, texts, cut).await?;
    let data = answer
        .scores(queries)
        .into_iter()
        .enumerate()
        .map(|(index, score)| ScoreItem {
            index,
            object: "score",
            score,
        })
        .collect();
    Ok(Json(ScoreAnswer {
        id: next_id("score"),
        object: "list",
        created: now_s(),
        model: &answer.model_name,
        data,
        usage: usage(&answer),
    })
    .into_response())
}

/// `POST /rerank`: `{"id", "model", "usage", "results": [{"index", "document": {"text"},
/// "relevance_score"}]}`, best first; TEI's answer for TEI's body (`texts` and no
/// `documents`: [`crate::tei::rerank`]).
pub async fn rerank(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    let tei = serde_json::from_slice::<Value>(&body)
        .is_ok_and(|v| v.get("texts").is_some() && v.get("documents").is_none());
    if tei {
        return crate::tei::rerank(&state, &body).await;
    }
    match rank_documents(&state, super::body::read(&body)).await {
        Ok(answer) => answer,
        Err(e) => e.into_response(),
    }
}

async fn rank_documents(
    state: &AppState,
    body: Result<RerankBody, String>,
) -> Result<Response, OpenAiError> {
    let body = body.map_err(bad)?;
    refuse_others(&body.rest)?;
    let texts = one_against_others(
        body.query,
        body.documents.iter().map(|d| d.text().to_string()),
        ("query", "documents"),
        "rank",
    )?;
    let cut = (body.truncate_prompt_tokens, body.truncation_side.as_deref());
    let answer = embed(state, body.model, texts, cut).await?;
    let show = body.return_documents.unwrap_or(true);
    let results = ranked(&answer.scores(1), body.top_n.unwrap_or(0))
        .into_iter()
        .map(|(index, relevance_score)| RerankItem {
            index,
            document: show.then(|| DocumentText {
                text: body.documents[index].text(),
            }),
            relevance_score,
        })
        .collect();
    Ok(Json(RerankAnswer {
        id: next_id("rerank"),
        model: &answer.model_name,
        usage: usage(&answer),
        results,
    })
    .into_response())
}

/// Refuses, by name, a field these routes do not take (`user` is taken and ignored).
fn refuse_others(rest: &Map<String, Value>) -> Result<(), OpenAiError> {
    match rest.keys().find(|k| k.as_str() != "user") {
        Some(key) => Err(bad(format!(
            "{}: not supported by sheaf's scoring routes; leave it out",
            sheaf_core::clip(key)
        ))),
        None => Ok(()),
    }
}

/// Embeds every text of a request at once, with `truncate_prompt_tokens` read as vLLM reads
/// it ([`super::embeddings::truncate_prompt_tokens`]).
async fn embed(
    state: &AppState,
    model: Option<String>,
    texts: Vec<String>,
    truncate: (Option<i64>, Option<&str>),
) -> Result<Embeddings, OpenAiError> {
    if texts.len() > MAX_INPUTS {
        return Err(bad(format!(
            "the request holds {} texts; at most {MAX_INPUTS} fit one request",
            texts.len()
        )));
    }
    let mut request = EmbedRequest::new(EmbedInput::Texts(texts));
    super::embeddings::truncate_prompt_tokens(&mut request, truncate.0, truncate.1)?;
    Ok(encoder(state, model).await?.embed(request).await?)
}

fn usage(answer: &Embeddings) -> Usage {
    Usage {
        prompt_tokens: answer.tokens,
        total_tokens: answer.tokens,
    }
}
