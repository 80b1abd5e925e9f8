//! Triton's generate extension on a generation model, answered as Triton's vLLM backend answers
//! it, so that clients written for `tritonserver` with that backend (LangChain's and LiteLLM's
//! Triton providers, `curl` examples) run unchanged.
//!
//! The request is one JSON object: `text_input` (the prompt, as text); the backend's switches
//! `stream`, `exclude_input_in_output` and `return_finish_reason`, `return_num_input_tokens`,
//! `return_num_output_tokens`, `return_cumulative_logprob`; and vLLM's sampling parameters
//! (`max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`, penalties, …), each
//! as a field of its own, in the `parameters` object, or in `sampling_parameters` (a JSON
//! object written as a string, the backend's input of that name). A name given twice, in any
//! of those places, or one the route does not take, is a 400 naming it. The sampling
//! parameters are read as `/v1/completions` reads its fields, with the same defaults (16
//! tokens) and limits, and the request takes the same path: the model's queue, then the engine.
//!
//! Without `stream`, the answer is one object, `model_name`, `model_version` and `text_output`:
//! the prompt followed by the generated text, or the generated text alone with
//! `exclude_input_in_output: true`. With `stream: true` (on `generate_stream` only), each piece
//! of text is a server-sent event of its own, as it comes, without the prompt (asking for it is
//! a 400, as under Triton), and a last event, whose `text_output` is empty, ends the stream.
//! Each answer carries what was asked for besides: `finish_reason` (`stop` or `length`; `null`
//! until the last event), `num_input_tokens`, `num_output_tokens` (streamed: the tokens of that
//! event's text) and `cumulative_logprob` (the generated tokens' log-probabilities summed).

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use sheaf_backend::generation::{Event, FinishReason, Prompt, Usage};
use sheaf_core::{Generate, InferError, ModelHandle};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::generate::Once;
use crate::error::ApiError;
use crate::openai::handlers::{timed, Timing};
use crate::openai::wire::CompletionRequest;
use crate::AppState;

/// Which of the extension's two routes the request came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Generate,
    Stream,
}

/// The backend's switches (module docs), each false unless given.
const SWITCHES: [&str; 7] = [
    "stream",
    "exclude_input_in_output",
    "return_finish_reason",
    "return_num_input_tokens",
    "return_num_output_tokens",
    "return_cumulative_logprob",
    "return_logprobs",
];

/// The sampling parameters the route takes, read as `/v1/completions` reads them.
const SAMPLING: [&str; 23] = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "n",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "priority",
    "timeout",
];

/// What the request asks for besides its text.
#[derive(Debug, Default, PartialEq)]
struct Asked {
    prompt: String,
    stream: bool,
    /// The prompt leads the answer's text.
    prepend: bool,
    finish_reason: bool,
    input_tokens: bool,
    output_tokens: bool,
    cumulative_logprob: bool,
}

/// Answers a generate request for the generation model `handle`.
pub(super) async fn answer(
    state: &AppState,
    handle: &ModelHandle,
    body: &[u8],
    route: Route,
) -> Result<Response, ApiError> {
    let (asked, fields) = read(body)?;
    if asked.stream && route == Route::Generate {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "stream: true sends the text as it comes, in several answers: use generate_stream",
        ));
    }
    let context = handle.generator()?.info().context_length;
    let mut g = request(&handle.name, &asked, fields, context)?;
    // Each generated token's log-probability: summed, or counted while streaming.
    if asked.cumulative_logprob || (asked.stream && asked.output_tokens) {
        g.request.logprobs = Some(0);
    }
    let input_tokens = match asked.stream && asked.input_tokens {
        true => Some(
            handle
                .tokenize(&g.request.prompt, g.request.rendering)?
                .len(),
        ),
        false => None,
    };
    let mut timing = Timing::start(state, &handle.name);
    let receiver = handle
        .generate(g)?
        .into_iter()
        .next()
        .ok_or_else(|| InferError::internal("the engine gave no answer channel"))?;
    let mut events = UnboundedReceiverStream::new(receiver);
    let mut answer = Answer {
        model_name: handle.name.clone(),
        model_version: handle.version.clone(),
        asked,
        input_tokens,
        counted: 0,
        reported: 0,
        cumulative: 0.0,
    };
    if !answer.asked.stream {
        let mut text = String::new();
        let (reason, usage) = loop {
            match events.next().await {
                Some(Event::Text(t)) => {
                    timing.text();
                    text.push_str(&t);
                }
                Some(Event::Logprob(t)) => answer.cumulative += f64::from(t.chosen.logprob),
                Some(Event::PromptLogprobs(_)) => {}
                Some(Event::Done(reason, usage)) => break (reason, usage),
                Some(Event::Error(e)) => return Err(InferError::from(e).into()),
                None => return Err(InferError::internal("the engine dropped the request").into()),
            }
        };
        if answer.asked.prepend {
            text.insert_str(0, &answer.asked.prompt);
        }
        let body = answer.last(text, reason, usage);
        return Ok(match route {
            Route::Generate => Json(body).into_response(),
            Route::Stream => {
                let one = Ok::<_, std::convert::Infallible>(event(&body));
                Sse::new(futures::stream::iter([one])).into_response()
            }
        });
    }
    let work = super::handlers::admit_stream(state)?;
    // An error before any text (a prompt longer than the context) is a plain HTTP error.
    let first = events.next().await;
    if let Some(Event::Error(e)) = first {
        return Err(InferError::from(e).into());
    }
    if let Some(Event::Text(_)) = first {
        timing.text();
    }
    let rest = timed(events.map(|e| (0, e)), timing, state.drain.clone());
    let events = futures::stream::iter(first.map(|e| (0, e))).chain(rest);
    let sse = futures::stream::unfold(
        (Box::pin(events), answer, Some(work)),
        |(mut events, mut answer, work)| async move {
            work.as_ref()?;
            loop {
                let body = match events.next().await? {
                    (_, Event::Text(t)) => answer.piece(t),
                    (_, Event::Logprob(t)) => {
                        answer.counted += 1;
                        answer.cumulative += f64::from(t.chosen.logprob);
                        continue;
                    }
                    (_, Event::PromptLogprobs(_)) => continue,
                    (_, Event::Done(reason, usage)) => {
                        let body = answer.last(String::new(), reason, usage);
                        return Some((Ok(event(&body)), (events, answer, None)));
                    }
                    (_, Event::Error(e)) => {
                        let body = json!({ "error": InferError::from(e).message });
                        return Some((Ok(event(&body)), (events, answer, None)));
                    }
                };
                return Some((
                    Ok::<_, std::convert::Infallible>(event(&body)),
                    (events, answer, work),
                ));
            }
        },
    );
    Ok(Sse::new(sse)
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn event(body: &Value) -> SseEvent {
    SseEvent::default().data(body.to_string())
}

/// Where one answer stands, and how its parts are written.
struct Answer {
    model_name: String,
    model_version: String,
    asked: Asked,
    /// The prompt's tokens, counted before a streamed answer begins.
    input_tokens: Option<usize>,
    /// Generated tokens seen so far (streamed, each token's log-probability counts it).
    counted: usize,
    /// Of those, the ones earlier events reported.
    reported: usize,
    cumulative: f64,
}

impl Answer {
    /// A streamed piece of text, with what was asked for so far.
    fn piece(&mut self, text: String) -> Value {
        let mut body = self.head(text);
        if self.asked.finish_reason {
            body["finish_reason"] = Value::Null;
        }
        if let (true, Some(n)) = (self.asked.input_tokens, self.input_tokens) {
            body["num_input_tokens"] = json!(n);
        }
        if self.asked.output_tokens {
            body["num_output_tokens"] = json!(self.counted - self.reported);
            self.reported = self.counted;
        }
        if self.asked.cumulative_logprob {
            body["cumulative_logprob"] = json!(self.cumulative);
        }
        body
    }

    /// The last (or only) answer: `text`, why the sequence ended, and its counts.
    fn last(&mut self, text: String, reason: FinishReason, usage: Usage) -> Value {
        let mut body = self.head(text);
        if self.asked.finish_reason {
            body["finish_reason"] = json!(reason.as_str());
        }
        if self.asked.input_tokens {
            body["num_input_tokens"] = json!(usage.prompt_tokens);
        }
        if self.asked.output_tokens {
            // The end-of-generation token counts, as the engine counts it, though it has no
            // text (and no log-probability).
            body["num_output_tokens"] =
                json!(usage.completion_tokens.saturating_sub(self.reported));
            self.reported = usage.completion_tokens;
        }
        if self.asked.cumulative_logprob {
            body["cumulative_logprob"] = json!(self.cumulative);
        }
        body
    }

    fn head(&self, text: String) -> Value {
        json!({
            "model_name": self.model_name,
            "model_version": self.model_version,
            "text_output": text,
        })
    }
}

fn invalid(message: impl Into<String>) -> InferError {
    InferError::invalid(message)
}

/// The request's text and switches, and its sampling parameters (every other field, from the
/// body, its `parameters` and its `sampling_parameters`), each named once.
fn read(body: &[u8]) -> Result<(Asked, Map<String, Value>), InferError> {
    let Once(given) = serde_json::from_slice::<Once<Value>>(body)
        .map_err(|e| invalid(format!("the generate request is not a JSON object: {e}")))?;
    let mut prompt = None;
    let mut fields = Map::new();
    let add = |fields: &mut Map<String, Value>, name: String, value: Value| {
        if fields.contains_key(&name) {
            return Err(invalid(format!(
                "'{}' is given twice (as a field, in parameters or in sampling_parameters)",
                sheaf_core::clip(&name)
            )));
        }
        fields.insert(name, value);
        Ok(())
    };
    for (name, value) in given {
        match name.as_str() {
            "text_input" => {
                prompt = Some(match value {
                    Value::String(s) => s,
                    Value::Array(mut one) if one.len() == 1 && one[0].is_string() => {
                        match one.pop() {
                            Some(Value::String(s)) => s,
                            _ => String::new(),
                        }
                    }
                    _ => {
                        return Err(invalid(
                            "text_input: the prompt, as a string (or a list of one string)",
                        ))
                    }
                })
            }
            "parameters" => {
                let Once(given) = serde_json::from_value::<Once<Value>>(value)
                    .map_err(|e| invalid(format!("'parameters' must be a JSON object: {e}")))?;
                for (name, value) in given {
                    add(&mut fields, name, value)?;
                }
            }
            "sampling_parameters" => {
                let parsed = match &value {
                    Value::String(s) => serde_json::from_str::<Once<Value>>(s).ok(),
                    _ => None,
                };
                let Some(Once(given)) = parsed else {
                    return Err(invalid(
                        "sampling_parameters: a JSON object written as a string, such as \
                         \"{\\\"temperature\\\": 0}\"",
                    ));
                };
                for (name, value) in given {
                    add(&mut fields, name, value)?;
                }
            }
            _ => add(&mut fields, name, value)?,
        }
    }
    let prompt = prompt.ok_or_else(|| invalid("text_input: missing: the prompt to continue"))?;
    let mut switch = |name: &str| match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(invalid(format!("{name}: true or false, not {other}"))),
    };
    let [stream, exclude, finish_reason, input_tokens, output_tokens, cumulative, logprobs] =
        SWITCHES.map(&mut switch);
    if logprobs?.unwrap_or(false) {
        return Err(invalid(
            "return_logprobs: not served on the generate route; POST /v1/completions gives each \
             token's log-probability and its alternatives (`logprobs`)",
        ));
    }
    let stream = stream?.unwrap_or(false);
    // The prompt leads a whole answer unless excluded; a streamed one never.
    let prepend = exclude?.map_or(!stream, |exclude| !exclude);
    if prepend && stream {
        return Err(invalid(
            "exclude_input_in_output: false is not allowed with stream: true (the pieces of \
             text come without the prompt)",
        ));
    }
    let asked = Asked {
        prompt,
        stream,
        prepend,
        finish_reason: finish_reason?.unwrap_or(false),
        input_tokens: input_tokens?.unwrap_or(false),
        output_tokens: output_tokens?.unwrap_or(false),
        cumulative_logprob: cumulative?.unwrap_or(false),
    };
    if let Some(name) = fields.keys().find(|k| !SAMPLING.contains(&k.as_str())) {
        let why = match name.as_str() {
            "lora_name" => "sheaf serves no LoRA adapters".to_string(),
            _ => format!(
                "the generate route of a generation model takes text_input, {}, \
                 sampling_parameters, parameters and the sampling parameters {}",
                SWITCHES[..6].join(", "),
                SAMPLING.join(", ")
            ),
        };
        return Err(invalid(format!("'{}': {why}", sheaf_core::clip(name))));
    }
    if fields.get("n").is_some_and(|n| *n != json!(1)) {
        return Err(invalid(
            "n: 1 on the generate route (one text_output); POST /v1/completions gives several \
             choices",
        ));
    }
    Ok((asked, fields))
}

/// The generation request: `fields` read as `/v1/completions` reads its own, for `model`,
/// whose context is `context` tokens.
fn request(
    model: &str,
    asked: &Asked,
    mut fields: Map<String, Value>,
    context: usize,
) -> Result<Generate, InferError> {
    fields.insert("model".into(), json!(model));
    fields.insert("prompt".into(), json!(asked.prompt));
    let completion: CompletionRequest = serde_json::from_value(Value::Object(fields))
        .map_err(|e| InferError::invalid(format!("the sampling parameters: {e}")))?;
    let (_, mut requests, _) = completion
        .into_request(context)
        .map_err(InferError::invalid)?;
    match (requests.pop(), requests.is_empty()) {
        (Some(g), true) => match &g.request.prompt {
            Prompt::Text(_) => Ok(g),
            _ => Err(InferError::internal("a text prompt became another kind")),
        },
        _ => Err(InferError::internal("one prompt became several requests")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(body: Value) -> Result<(Asked, Map<String, Value>), String> {
        read(body.to_string().as_bytes()).map_err(|e| e.message)
    }

    #[test]
    fn the_switches_and_the_sampling_parameters_come_from_every_place() {
        let (a, fields) = asked(json!({
            "text_input": "Hi",
            "max_tokens": 4,
            "parameters": {"temperature": 0, "return_finish_reason": true},
            "sampling_parameters": "{\"top_k\": 5}",
        }))
        .unwrap();
        assert_eq!(
            a,
            Asked {
                prompt: "Hi".into(),
                prepend: true,
                finish_reason: true,
                ..Default::default()
            }
        );
        assert_eq!(fields.len(), 3, "{fields:?}");
        // Streamed, the prompt is left out unless asked for, which is refused.
        let (a, _) = asked(json!({"text_input": ["Hi"], "stream": true})).unwrap();
        assert!(a.stream && !a.prepend);
        let e =
            asked(json!({"text_input": "Hi", "stream": true, "exclude_input_in_output": false}))
                .unwrap_err();
        assert!(e.starts_with("exclude_input_in_output"), "{e}");
        let (a, _) = asked(json!({"text_input": "Hi", "exclude_input_in_output": true})).unwrap();
        assert!(!a.prepend);
    }

    #[test]
    fn what_the_route_does_not_take_is_refused_by_name() {
        for (body, says) in [
            (json!({"max_tokens": 3}), "text_input: missing"),
            (json!({"text_input": 3}), "text_input: the prompt"),
            (
                json!({"text_input": "a", "stream": "yes"}),
                "stream: true or false",
            ),
            (
                json!({"text_input": "a", "echo": true}),
                "'echo': the generate route",
            ),
            (
                json!({"text_input": "a", "lora_name": "x"}),
                "'lora_name': sheaf serves no",
            ),
            (
                json!({"text_input": "a", "return_logprobs": true}),
                "return_logprobs: not served",
            ),
            (
                json!({"text_input": "a", "n": 2}),
                "n: 1 on the generate route",
            ),
            (
                json!({"text_input": "a", "sampling_parameters": "{"}),
                "sampling_parameters: a JSON",
            ),
            (
                json!({"text_input": "a", "top_k": 1, "parameters": {"top_k": 2}}),
                "'top_k' is given twice",
            ),
            (
                json!({"text_input": "a", "parameters": {"seed": 1}, "sampling_parameters": "{\"seed\": 2}"}),
                "'seed' is given twice",
            ),
        ] {
            let e = asked(body.clone()).unwrap_err();
            assert!(e.starts_with(says), "{body}: {e}");
        }
        let e = read(br#"{"text_input": "a", "text_input": "b"}"#).unwrap_err();
        assert!(e.message.contains("given twice"), "{}", e.message);
    }

    #[test]
    fn the_sampling_parameters_are_read_as_a_completion_s() {
        let (a, fields) =
            asked(json!({"text_input": "Hi", "max_tokens": 7, "temperature": 0, "stop": "\n"}))
                .unwrap();
        let g = request("m", &a, fields, 100).unwrap();
        assert_eq!(g.request.prompt, Prompt::Text("Hi".into()));
        assert_eq!(g.request.max_tokens, 7);
        assert_eq!(g.request.sampling.temperature, 0.0);
        assert_eq!(g.request.stop, ["\n"]);
        // A completion's default length and its checks.
        let (a, fields) = asked(json!({"text_input": "Hi"})).unwrap();
        assert_eq!(
            request("m", &a, fields, 100).unwrap().request.max_tokens,
            16
        );
        let (a, fields) = asked(json!({"text_input": "Hi", "max_tokens": 500})).unwrap();
        let e = request("m", &a, fields, 100).unwrap_err();
        assert!(e.message.contains("context"), "{}", e.message);
        let (a, fields) = asked(json!({"text_input": "Hi", "temperature": "hot"})).unwrap();
        let e = request("m", &a, fields, 100).unwrap_err();
        assert!(
            e.message.starts_with("the sampling parameters"),
            "{}",
            e.message
        );
    }
}
