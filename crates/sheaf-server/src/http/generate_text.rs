//! Triton's generate extension on a generation model: the requests and answers of Triton's
//! vLLM backend's contract ([`crate::triton_text`]) as the extension's JSON. `/generate` gives
//! the one answer, `/generate_stream` each answer as a server-sent event (`stream: true` only
//! there); an answer is `model_name`, `model_version`, `text_output` and the fields asked for
//! (`finish_reason`, `num_input_tokens`, `num_output_tokens`, `cumulative_logprob`). An error
//! after the first event is an event `{"error": ...}`.

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
    if request.streams() && route == Route::Generate {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "stream: true sends the text as it comes, in several answers: use generate_stream",
        ));
    }
    let streams = request.streams();
    let work = match streams {
        true => Some(super::handlers::admit_stream(state)?),
        false => None,
    };
    let mut answers = triton_text::run(state, handle, request).await?;
    let (name, version) = (handle.name.clone(), handle.version.clone());
    let render = move |a: TextAnswer| rendered(&name, &version, a);
    if !streams {
        let one = match answers.next().await {
            Some(answer) => render(answer?),
            None => return Err(sheaf_core::InferError::internal("no answer").into()),
        };
        return Ok(match route {
            Route::Generate => Json(one).into_response(),
            Route::Stream => {
                let one = Ok::<_, std::convert::Infallible>(event(&one));
                Sse::new(futures::stream::iter([one])).into_response()
            }
        });
    }
    let events = answers.map(move |answer| {
        // The drain's account of the request is held until the stream ends.
        let _held = &work;
        let body = match answer {
            Ok(a) => render(a),
            Err(e) => json!({ "error": e.message }),
        };
        Ok::<_, std::convert::Infallible>(event(&body))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn event(body: &Value) -> SseEvent {
    SseEvent::default().data(body.to_string())
}

/// An answer as the extension's JSON.
fn rendered(model_name: &str, model_version: &str, a: TextAnswer) -> Value {
    let mut body = json!({
        "model_name": model_name,
        "model_version": model_version,
        "text_output": a.text,
    });
    if let Some(reason) = a.finish_reason {
        body["finish_reason"] = json!(reason);
    }
    if let Some(n) = a.num_input_tokens {
        body["num_input_tokens"] = json!(n);
    }
    if let Some(n) = a.num_output_tokens {
        body["num_output_tokens"] = json!(n);
    }
    if let Some(sum) = a.cumulative_logprob {
        body["cumulative_logprob"] = json!(sum);
    }
    body
}
