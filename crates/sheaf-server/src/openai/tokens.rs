//! `POST /tokenize` and `POST /detokenize`, as vLLM serves them: the model's own tokenizer,
//! applied as a generation request with the same rendering fields would be (a chat rendered
//! with the model's template, `add_generation_prompt`, `continue_final_message`,
//! `add_special_tokens`), with each token's text on request (`return_token_strs`). A
//! `/tokenize` body with TEI's `inputs` is TEI's, for a text encoder ([`crate::tei::tokenize`]);
//! vLLM's bodies naming a text encoder get its tokens (special tokens included unless
//! `add_special_tokens: false`), as it embeds.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sheaf_backend::generation::Prompt;

use super::body::{Body, BodyError};
use super::handlers::generator;
use super::wire::{DetokenizeRequest, Tokenize, TokenizeRequest};
use crate::error::{bad, OpenAiError};
use crate::AppState;

/// `{"count", "max_model_len", "tokens"}`; TEI's answer for TEI's body.
pub async fn tokenize(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    let tei = serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.get("inputs").is_some());
    if tei {
        return crate::tei::tokenize(&state, &body).await;
    }
    match tokenize_prompt(&state, super::body::read(&body)).await {
        Ok(answer) => answer.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tokenize_prompt(
    state: &AppState,
    body: Result<TokenizeRequest, String>,
) -> Result<Json<Value>, OpenAiError> {
    let body = body.map_err(bad)?;
    let Tokenize {
        model,
        prompt,
        rendering,
        token_strs,
    } = body.into_prompt().map_err(bad)?;
    let handle = state.manager.get_or_load(&model, None).await?;
    if handle.is_encoder() {
        // A text encoder's tokens, as it embeds the text.
        let Prompt::Text(text) = prompt else {
            return Err(bad(format!(
                "'{model}' is an embedding model: give `prompt`, not `messages`"
            )));
        };
        let encoder = handle.text_encoder()?;
        let special = rendering.special.unwrap_or(true);
        let tokens = encoder.tokens(&text, special, None)?;
        let strs = token_strs.then(|| tokens.iter().map(|t| t.text.clone()).collect());
        let ids = tokens.iter().map(|t| t.id as i64).collect();
        return Ok(answer(ids, encoder.max_input_tokens(), strs));
    }
    let (handle, context) = generator(state, &model).await?;
    let tokens = handle.tokenize(&prompt, rendering)?;
    let strs = token_strs
        .then(|| tokens.iter().map(|&t| handle.detokenize(&[t])).collect())
        .transpose()?;
    let ids = tokens.iter().map(|&t| i64::from(t)).collect();
    Ok(answer(ids, context, strs))
}

/// `{"count", "max_model_len", "tokens"}`, and `token_strs` (each token's text) when asked.
fn answer(tokens: Vec<i64>, max_model_len: usize, strs: Option<Vec<String>>) -> Json<Value> {
    let mut body = json!({
        "count": tokens.len(),
        "max_model_len": max_model_len,
        "tokens": tokens,
    });
    if let Some(strs) = strs {
        body["token_strs"] = json!(strs);
    }
    Json(body)
}

/// `{"prompt"}`: the text of the token ids.
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<Body<DetokenizeRequest>, BodyError>,
) -> Result<Json<Value>, OpenAiError> {
    let Body(body) = body.map_err(|e| bad(e.0))?;
    let handle = state.manager.get_or_load(&body.model, None).await?;
    if handle.is_encoder() {
        let ids = body
            .tokens
            .iter()
            .map(|&t| u32::try_from(t).map_err(|_| bad(format!("token id {t} is negative"))))
            .collect::<Result<Vec<u32>, _>>()?;
        let text = handle.text_encoder()?.decode(&ids, false)?;
        return Ok(Json(json!({ "prompt": text })));
    }
    let (handle, _) = generator(&state, &body.model).await?;
    let text = handle.detokenize(&body.tokens)?;
    Ok(Json(json!({ "prompt": text })))
}
