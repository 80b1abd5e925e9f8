//! OpenAI-compatible endpoints for generation models: `POST /v1/completions`,
//! `POST /v1/chat/completions` (with `stream: true` as server-sent events), `POST /v1/responses`
//! (the Responses API, read as the chat it amounts to: [`responses`], its answers kept in
//! [`store`] for `GET`/`DELETE /v1/responses/{id}`, `.../input_items` and, for one made in the
//! background, `POST .../cancel` and its events streamed again from [`replay`]), OpenAI's
//! Conversations API under `/v1/conversations` ([`conversations`], whose conversations a
//! response is made in), OpenAI's Files and Batch APIs under `/v1/files` and `/v1/batches`
//! ([`batch`]: files of requests run in the background), `GET /v1/models` and
//! `GET /v1/models/{model}`, and
//! vLLM's `POST /tokenize` and `POST /detokenize` ([`tokens`]); and for the repository's text
//! encoders `POST /v1/embeddings` ([`embeddings`]) and vLLM's `POST /score` and `POST /rerank`
//! ([`scores`]). The completion routes also read vLLM's guided decoding and answer ends
//! ([`vllm`]).
//!
//! Each handler parses the OpenAI request ([`wire`]), gets the model from the model manager
//! (loading it in the `on_demand` control mode), submits it with
//! [`ModelHandle::generate`](sheaf_core::ModelHandle::generate), and renders the engine's events
//! as one JSON answer or as a stream of chunks.
//! A client that disconnects drops the event channel, which frees its sequence at the engine's
//! next step.

pub mod batch;
pub(crate) mod body;
mod budget;
pub(crate) mod conversation_store;
mod conversations;
mod embeddings;
pub(crate) mod handlers;
pub(crate) mod logprobs;
mod replay;
mod responses;
mod scores;
pub(crate) mod store;
mod tokens;
mod vllm;
pub(crate) mod wire;

use axum::routing::{get, post};
use axum::Router;

use crate::AppState;

/// The `/v1` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/responses", post(responses::responses))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route(
            "/v1/files",
            post(batch::files::upload).get(batch::files::list),
        )
        .route(
            "/v1/files/{id}",
            get(batch::files::get).delete(batch::files::delete),
        )
        .route("/v1/files/{id}/content", get(batch::files::content))
        .route(
            "/v1/batches",
            post(batch::runs::create).get(batch::runs::list),
        )
        .route("/v1/batches/{id}", get(batch::runs::get))
        .route("/v1/batches/{id}/cancel", post(batch::runs::cancel))
        .route("/v1/conversations", post(conversations::create))
        .route(
            "/v1/conversations/{id}",
            get(conversations::get)
                .post(conversations::update)
                .delete(conversations::delete),
        )
        .route(
            "/v1/conversations/{id}/items",
            get(conversations::items).post(conversations::add_items),
        )
        .route(
            "/v1/conversations/{id}/items/{item_id}",
            get(conversations::item).delete(conversations::delete_item),
        )
        .route("/v1/models/{model}", get(handlers::model))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/score", post(scores::score))
        .route("/v1/score", post(scores::score))
        .route("/rerank", post(scores::rerank))
        .route("/v1/rerank", post(scores::rerank))
        .route("/v2/rerank", post(scores::rerank))
}
