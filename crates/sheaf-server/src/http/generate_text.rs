//! Triton's generate extension on a generation model: the requests and answers of Triton's
//! vLLM backend's contract ([`crate::triton_text`]) as the extension's JSON. `/generate` gives
//! the one answer, `/generate_stream` each answer as a server-sent event (`stream: true` only
//! there); an answer is `model_name`, `model_version`, `text_output` and the fields asked for
//! (`finish_reason`, `num_input_tokens`, `num_output_tokens`, `cumulative_logprob`, and
//! `logprobs` as JSON text, as Triton writes a BYTES output), each one element as itself and
//! an element per output (`n` > 1) as a list, as the extension writes a tensor. An error after
//! the first event is an event `{"error": ...}`.
//!
//! The KServe route (`/infer`) takes the same requests as tensors, as gRPC does
//! ([`TextRequest::from_tensors`]), and answers with KServe responses whose outputs are those
//! tensors (`text_output`, and the ones asked for); `stream: true` there needs server-sent
//! events (`Accept: text/event-stream`), one response each.

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};
use sheaf_core::ModelHandle;

use crate::error::ApiError;
use crate::triton_text::{self, TextAnswer, TextRequest};
use crate::AppState;

/// Which of the extension's two routes the request came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Generate,
    Stream,
}

/// Answers a generate request for the generation model `handle`.
pub(super) async fn answer(
    state: &AppState,
    handle: &ModelHandle,
    body: &[u8],
    route: Route,
) -> Result<Response, ApiError> {
    let request = TextRequest::from_json(handle, body)?;
    let (name, version) = (handle.name.clone(), handle.version.clone());
    if request.streams() {
        if route == Route::Generate {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "stream: true sends the text as it comes, in several answers: use generate_stream",
            ));
        }
        let render = move |a| event(&rendered(&name, &version, a));
        let failed = |message| event(&json!({ "error": message }));
        return streamed(state, handle, request, render, failed).await;
    }
    let one = rendered(
        &name,
        &version,
        triton_text::run_once(state, handle, request).await?,
    );
    Ok(match route {
        Route::Generate => Json(one).into_response(),
        Route::Stream => {
            let one = Ok::<_, std::convert::Infallible>(event(&one));
            Sse::new(futures::stream::iter([one])).into_response()
        }
    })
}

/// Answers a KServe request (`/infer`) for the generation model `handle`; `events`: the client
/// takes server-sent events.
pub(super) async fn infer(
    state: &AppState,
    handle: &ModelHandle,
    raw: &sheaf_core::RawRequest,
    events: bool,
) -> Result<Response, ApiError> {
    let request = TextRequest::from_tensors(handle, raw)?;
    let (name, version, id) = (handle.name.clone(), handle.version.clone(), raw.id.clone());
    if request.streams() {
        if !events {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "stream: true sends the text as it comes, in several responses: ask for \
                 server-sent events (Accept: text/event-stream)",
            ));
        }
        let render = move |a| event(&kserve(&name, &version, id.as_deref(), a));
        let failed = |message| {
            SseEvent::default()
                .event("error")
                .data(json!({ "error": message }).to_string())
        };
        return streamed(state, handle, request, render, failed).await;
    }
    let one = triton_text::run_once(state, handle, request).await?;
    Ok(Json(kserve(&name, &version, id.as_deref(), one)).into_response())
}

/// A streamed request's answers as server-sent events, each as `render` writes it, and an
/// error after the first as `failed` writes its message. The drain's account of the request is
/// held until the stream ends.
async fn streamed(
    state: &AppState,
    handle: &ModelHandle,
    request: TextRequest,
    render: impl Fn(TextAnswer) -> SseEvent + Send + 'static,
    failed: fn(String) -> SseEvent,
) -> Result<Response, ApiError> {
    let work = super::handlers::admit_stream(state)?;
    let answers = triton_text::run(state, handle, request).await?;
    let events = answers.map(move |answer| {
        let _held = &work;
        Ok::<_, std::convert::Infallible>(match answer {
            Ok(a) => render(a),
            Err(e) => failed(e.message),
        })
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// An answer as a KServe response: each part an output tensor of shape `[n]`, an element per
/// output (`num_input_tokens`: `[1]`).
fn kserve(model_name: &str, model_version: &str, id: Option<&str>, a: TextAnswer) -> Value {
    let output = |name: &str, datatype: &str, data: Vec<Value>| json!({ "name": name, "datatype": datatype, "shape": [data.len()], "data": data });
    let mut outputs = vec![output("text_output", "BYTES", each(a.texts))];
    if let Some(reasons) = a.finish_reasons {
        let reasons = reasons.into_iter().map(|r| r.unwrap_or("None"));
        outputs.push(output("finish_reason", "BYTES", each(reasons)));
    }
    if let Some(n) = a.num_input_tokens {
        outputs.push(output("num_input_tokens", "UINT32", vec![json!(n)]));
    }
    if let Some(n) = a.num_output_tokens {
        outputs.push(output("num_output_tokens", "UINT32", each(n)));
    }
    if let Some(sums) = a.cumulative_logprobs {
        let sums = sums.into_iter().map(|sum| sum as f32);
        outputs.push(output("cumulative_logprob", "FP32", each(sums)));
    }
    if let Some(logprobs) = a.logprobs {
        outputs.push(output("logprobs", "BYTES", each(logprobs)));
    }
    let mut body = json!({
        "model_name": model_name,
        "model_version": model_version,
        "outputs": outputs,
    });
    if let Some(id) = id {
        body["id"] = json!(id);
    }
    body
}

fn each<T: Into<Value>>(items: impl IntoIterator<Item = T>) -> Vec<Value> {
    items.into_iter().map(Into::into).collect()
}

/// The extension's JSON for an output: one element as itself, several as a list.
fn one_or_list<T: Into<Value>>(items: impl IntoIterator<Item = T>) -> Value {
    let mut items = each(items);
    match items.len() {
        1 => items.remove(0),
        _ => Value::Array(items),
    }
}

fn event(body: &Value) -> SseEvent {
    SseEvent::default().data(body.to_string())
}

/// An answer as the extension's JSON.
fn rendered(model_name: &str, model_version: &str, a: TextAnswer) -> Value {
    let mut body = json!({
        "model_name": model_name,
        "model_version": model_version,
        "text_output": one_or_list(a.texts),
    });
    if let Some(reasons) = a.finish_reasons {
        body["finish_reason"] = one_or_list(reasons);
    }
    if let Some(n) = a.num_input_tokens {
        body["num_input_tokens"] = json!(n);
    }
    if let Some(n) = a.num_output_tokens {
        body["num_output_tokens"] = one_or_list(n);
    }
    if let Some(sums) = a.cumulative_logprobs {
        body["cumulative_logprob"] = one_or_list(sums);
    }
    if let Some(logprobs) = a.logprobs {
        body["logprobs"] = one_or_list(logprobs);
    }
    body
}
