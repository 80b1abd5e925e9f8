//! The `/v1` handlers: parse, submit to the engine, answer as JSON or as server-sent events.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use sheaf_backend::generation::{
    Event, FinishReason, GenError, Prompt, PromptLogprobs, StopBy, TokenLogprob, ToolAnswer,
    ToolCall, Tools, Usage,
};
use sheaf_core::metrics::{GenLabels, Metrics};
use sheaf_core::{Generate, ModelHandle};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::body::{Body, BodyError};
use super::wire::{ChatRequest, Common, CompletionRequest};
use crate::error::{bad, OpenAiError};
use crate::AppState;

/// Records time to first token and inter-token latency as text leaves the engine.
pub(crate) struct Timing {
    metrics: Arc<Metrics>,
    labels: GenLabels,
    last: Option<Instant>,
    start: Instant,
}

impl Timing {
    /// From now, for `model`'s answer.
    pub(crate) fn start(state: &AppState, model: &str) -> Timing {
        Timing {
            metrics: state.manager.metrics().clone(),
            labels: GenLabels {
                model: model.to_string(),
            },
            last: None,
            start: Instant::now(),
        }
    }

    pub(crate) fn text(&mut self) {
        let now = Instant::now();
        let g = &self.metrics.generation;
        match self.last {
            None => g
                .time_to_first_token
                .get_or_create(&self.labels)
                .observe((now - self.start).as_secs_f64()),
            Some(last) => g
                .inter_token_latency
                .get_or_create(&self.labels)
                .observe((now - last).as_secs_f64()),
        }
        self.last = Some(now);
    }
}

pub(super) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(super) fn next_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `GET /v1/models`: the generation models and text encoders a request may name (loaded, or in
/// the `on_demand` control mode loaded by the first request).
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .manager
        .offered_generators()
        .into_iter()
        .chain(state.manager.offered_encoders())
        .map(|n| card(&state, &n))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// A model as `/v1/models` lists it, with vLLM's `max_model_len`: the most tokens a request
/// may hold (a generation model's context, prompt and answer together; an encoder's input).
fn card(state: &AppState, name: &str) -> Value {
    let mut card = json!({ "id": name, "object": "model", "created": 0, "owned_by": "sheaf" });
    let handle = state.manager.get(name, None).ok();
    let longest = handle.as_deref().and_then(|h| match h.generator() {
        Ok(g) => Some(g.info().context_length),
        Err(_) => h.text_encoder().ok().map(|e| e.max_input_tokens()),
    });
    if let Some(longest) = longest {
        card["max_model_len"] = json!(longest);
    }
    card
}

/// `GET /v1/models/{model}`: one of them (OpenAI's model retrieval); 404 for another name.
pub async fn model(
    State(state): State<AppState>,
    axum::extract::Path(model): axum::extract::Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    let known = state
        .manager
        .offered_generators()
        .into_iter()
        .chain(state.manager.offered_encoders())
        .any(|n| n == model);
    if !known {
        let message = format!("The model '{}' does not exist", sheaf_core::clip(&model));
        let error = OpenAiError::new(axum::http::StatusCode::NOT_FOUND, message);
        return Err(error.code(crate::error::MODEL_NOT_FOUND));
    }
    Ok(Json(card(&state, &model)))
}

/// The generation model `name` (loaded first in the `on_demand` control mode), and its context
/// length.
pub(super) async fn generator(
    state: &AppState,
    name: &str,
) -> Result<(Arc<ModelHandle>, usize), OpenAiError> {
    let handle = state.manager.get_or_load(name, None).await?;
    let context = handle.generator()?.info().context_length;
    Ok((handle, context))
}

/// The two response shapes.
#[derive(Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    body: Result<Body<CompletionRequest>, BodyError>,
) -> Result<Response, OpenAiError> {
    let Body(body) = body.map_err(|e| bad(e.0))?;
    let (handle, context) = generator(&state, &body.common.model).await?;
    let (common, requests, echo) = body.into_request(context).map_err(bad)?;
    let waiting = handle.generator()?.info().max_waiting;
    if requests.len() > waiting {
        return Err(bad(format!(
            "prompt: {} prompts, but this model queues at most {waiting} requests; send fewer \
             in one request",
            requests.len()
        )));
    }
    // Each prompt as text, to lead its choices' answers with.
    let echo = match echo {
        false => None,
        true => Some(
            requests
                .iter()
                .map(|g| match &g.request.prompt {
                    Prompt::Tokens(ids) => handle.detokenize(ids),
                    Prompt::Text(text) => Ok(text.clone()),
                    Prompt::Chat(_) => Ok(String::new()),
                })
                .collect::<Result<Vec<String>, _>>()?,
        ),
    };
    let asked = Asked { tools: None, echo };
    run(&state, &handle, Kind::Completion, common, requests, asked).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Body<ChatRequest>, BodyError>,
) -> Result<Response, OpenAiError> {
    let Body(body) = body.map_err(|e| bad(e.0))?;
    let (handle, context) = generator(&state, &body.common.model).await?;
    let echo = body.echo.unwrap_or(false);
    let (common, request, tools) = body.into_request(context).map_err(bad)?;
    // vLLM's chat echo: the final message leads the answer when it is the assistant's.
    let echo = match (echo, &request.request.prompt) {
        (true, Prompt::Chat(messages)) => messages
            .last()
            .filter(|(role, _)| role == "assistant")
            .map(|(_, text)| vec![text.clone()]),
        _ => None,
    };
    let asked = Asked { tools, echo };
    run(&state, &handle, Kind::Chat, common, vec![request], asked).await
}

/// What an answer is made of besides the engine's events.
struct Asked {
    /// A chat's functions, whose calls are read out of each choice's answer.
    tools: Option<Tools>,
    /// Text that leads each prompt's choices' answers: a completion's prompt, a chat's final
    /// assistant message (`echo`).
    echo: Option<Vec<String>>,
}

/// Submits `requests` (one per prompt, each with the same choices) and answers with all their
/// choices, prompt by prompt: choice `i` is prompt `i / per`'s.
async fn run(
    state: &AppState,
    handle: &ModelHandle,
    kind: Kind,
    common: Common,
    mut requests: Vec<Generate>,
    asked: Asked,
) -> Result<Response, OpenAiError> {
    let Asked { tools, echo } = asked;
    let mut timing = Timing::start(state, &common.model);
    let Some(request) = requests.first() else {
        return Err(bad("prompt: no prompt"));
    };
    let logprobs = request.request.logprobs;
    let top = logprobs.unwrap_or(0);
    let logprobs = logprobs.is_some();
    let per = request.choices;
    // Checked before the count is used: no channel or buffer is made for a bad `n`.
    sheaf_core::generate::check_choices(per, handle.generator()?.info().max_choices)?;
    let n = per * requests.len();
    // vLLM's `prompt_logprobs`, as asked for (the engine may read more alternatives, for
    // `echo` with `logprobs`).
    let prompt_top = common.vllm.prompt_logprobs.unwrap_or(0);
    let wants_prompt = common.vllm.prompt_logprobs.is_some();
    let stops = request.request.stop.clone();
    // vLLM's usage in every chunk (with `include_usage`): each prompt's tokens counted here,
    // each generated token by its log-probability, which the engine then sends.
    let continuous = match common.stream_options.as_ref() {
        Some(o) if o.include_usage && o.continuous_usage_stats => Some(
            requests
                .iter_mut()
                .map(|g| {
                    g.request.logprobs.get_or_insert(0);
                    Ok(handle
                        .tokenize(&g.request.prompt, g.request.rendering)?
                        .len())
                })
                .collect::<Result<Vec<usize>, OpenAiError>>()?,
        ),
        _ => None,
    };
    let mut receivers = Vec::new();
    for g in requests {
        receivers.extend(handle.generate(g)?);
    }
    // The choices' events, merged and tagged with the choice index.
    let mut events = merged(receivers);
    let id = next_id(match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    });
    if common.stream {
        // Errors known before the first token (a prompt too long) are answered as plain HTTP.
        let first = events.next().await;
        if let Some((_, Event::Error(e))) = first {
            return Err(e.into());
        }
        if let Some((_, Event::Text(_))) = first {
            timing.text();
        }
        let usage = common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        let chunks = Chunks {
            kind,
            id,
            model: common.model,
            include_usage: usage,
            continuous,
            logprobs,
            n,
            tools,
            echo,
            // A completion's echoed prompt comes with its log-probabilities, read by the engine.
            echo_top: matches!(kind, Kind::Completion)
                .then_some(top)
                .filter(|_| logprobs),
            per,
            stops,
        }
        .stream(first, events, timing, state.drain.clone());
        return Ok(Sse::new(chunks)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut texts = vec![String::new(); n];
    let mut tokens: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut prompts: Vec<Option<PromptLogprobs>> = vec![None; n];
    let mut ends: Vec<Option<(FinishReason, Usage)>> = vec![None; n];
    while ends.iter().any(Option::is_none) {
        match events.next().await {
            Some((i, Event::Text(t))) => {
                timing.text();
                texts[i].push_str(&t)
            }
            Some((i, Event::Logprob(t))) => tokens[i].push(t),
            Some((i, Event::PromptLogprobs(p))) => prompts[i] = Some(p),
            Some((i, Event::Done(reason, usage))) => ends[i] = Some((reason, usage)),
            Some((_, Event::Error(e))) => return Err(e.into()),
            None => return Err(GenError::Internal("the engine dropped the request".into()).into()),
        }
    }
    let mut total = Usage::default();
    let choices: Vec<Value> = (0..n)
        .map(|i| {
            let (mut reason, usage) =
                ends[i].unwrap_or((FinishReason::Stop(None), Usage::default()));
            // Each prompt is counted once; each choice's completion adds up.
            if i % per == 0 {
                total.prompt_tokens += usage.prompt_tokens;
            }
            let echo = echo.as_ref().map(|e| e[i / per].as_str());
            total.completion_tokens += usage.completion_tokens;
            let rendered = match (logprobs, kind, &echo, &prompts[i]) {
                (false, ..) => Value::Null,
                (true, Kind::Chat, ..) => super::logprobs::chat(&tokens[i]),
                (true, Kind::Completion, Some(_), Some(prompt)) => {
                    super::logprobs::echoed(prompt, top, &tokens[i])
                }
                (true, Kind::Completion, ..) => super::logprobs::completion(&tokens[i], &mut 0),
            };
            let text = std::mem::take(&mut texts[i]);
            let vllm_prompt = |p: &PromptLogprobs| super::logprobs::prompt(p, prompt_top);
            match kind {
                Kind::Completion => {
                    let mut choice = json!({
                        "index": i,
                        "text": echo.unwrap_or_default().to_string() + &text,
                        "finish_reason": reason.as_str(),
                        "stop_reason": stop_reason(reason, &stops),
                        "logprobs": rendered,
                    });
                    if let Some(p) = prompts[i].as_ref().filter(|_| wants_prompt) {
                        choice["prompt_logprobs"] = vllm_prompt(p);
                    }
                    choice
                }
                Kind::Chat => {
                    let echoed = echo.unwrap_or_default();
                    let mut message =
                        json!({ "role": "assistant", "content": echoed.to_string() + &text });
                    if let Some(tools) = &tools {
                        let mut answer = tools.answer();
                        let shown = answer.push(&text);
                        let (rest, calls) = answer.finish();
                        let content: Option<String> = match (echo, shown, rest) {
                            (None, None, None) => None,
                            (e, a, b) => Some(
                                e.unwrap_or_default().to_string()
                                    + &a.unwrap_or_default()
                                    + &b.unwrap_or_default(),
                            ),
                        };
                        message["content"] = content.map_or(Value::Null, Value::String);
                        if !calls.is_empty() {
                            message["tool_calls"] = calls_json(&calls, false);
                            reason = FinishReason::ToolCalls;
                        }
                    }
                    json!({
                        "index": i,
                        "message": message,
                        "finish_reason": reason.as_str(),
                        "stop_reason": stop_reason(reason, &stops),
                        "logprobs": rendered,
                    })
                }
            }
        })
        .collect();
    let mut body = json!({
        "id": id,
        "object": match kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion" },
        "created": now_s(),
        "model": common.model,
        "choices": choices,
        "usage": usage_json(&total),
    });
    // A chat's prompt is the request's, once (vLLM's place for it).
    if let (Kind::Chat, true, Some(p)) = (kind, wants_prompt, prompts[0].as_ref()) {
        body["prompt_logprobs"] = super::logprobs::prompt(p, prompt_top);
    }
    Ok(Json(body).into_response())
}

/// vLLM's `stop_reason`: the stop string (one of `stops`) or stop token id that ended a choice;
/// null for an end-of-generation token, a length or a call.
fn stop_reason(reason: FinishReason, stops: &[String]) -> Value {
    match reason {
        FinishReason::Stop(Some(StopBy::String(i))) => {
            stops.get(i).map_or(Value::Null, |s| json!(s))
        }
        FinishReason::Stop(Some(StopBy::Token(t))) => json!(t),
        _ => Value::Null,
    }
}

/// Calls in OpenAI's shape; streamed deltas also carry each call's index.
fn calls_json(calls: &[ToolCall], streamed: bool) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(k, call)| {
            let mut c = json!({
                "id": next_id("call"),
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            });
            if streamed {
                c["index"] = json!(k);
            }
            c
        })
        .collect();
    Value::Array(calls)
}

fn usage_json(u: &Usage) -> Value {
    counts_json(u.prompt_tokens, u.completion_tokens)
}

fn counts_json(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// What every chunk of one streamed answer repeats.
struct Chunks {
    kind: Kind,
    id: String,
    model: String,
    include_usage: bool,
    /// vLLM's `continuous_usage_stats`: each prompt's tokens, for the usage every chunk carries
    /// (its choice's tokens so far, each counted by its log-probability).
    continuous: Option<Vec<usize>>,
    /// Whether chunks carry the log-probabilities of their tokens.
    logprobs: bool,
    /// Choices: the stream ends when each has finished.
    n: usize,
    /// A chat's functions: each choice's text is held back where a call may start.
    tools: Option<Tools>,
    /// Text each prompt's choices' answers start with, in a chunk of its own (`echo`).
    echo: Option<Vec<String>>,
    /// With `echo`, the alternatives per token of the echoed prompt's log-probabilities (a
    /// completion's `logprobs`): its chunk then waits for them, and carries them.
    echo_top: Option<usize>,
    /// Choices per prompt: choice `i` is prompt `i / per`'s.
    per: usize,
    /// The request's stop strings, for each choice's `stop_reason`.
    stops: Vec<String>,
}

/// The choices' events as they come, each tagged with its choice's index.
pub(crate) fn merged(
    receivers: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
) -> impl Stream<Item = (usize, Event)> + Unpin + Send + 'static {
    stream::select_all(
        receivers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |event| (i, event))),
    )
}

/// What a stream still open when the shutdown timeout ends is told, in its last event.
const CUT_BY_SHUTDOWN: &str = "the server shut down before this answer was complete";

/// A streamed answer's engine events (each tagged with its choice) as they come, each text
/// recorded in `timing`; cut off with an error event (on choice 0) when the server's shutdown
/// timeout ends while it is still open.
pub(crate) fn timed(
    events: impl Stream<Item = (usize, Event)> + Unpin + Send + 'static,
    timing: Timing,
    drain: Arc<crate::drain::Drain>,
) -> impl Stream<Item = (usize, Event)> + Send + 'static {
    stream::unfold(
        (events, timing, drain, false),
        |(mut rx, mut timing, drain, cut)| async move {
            if cut {
                return None;
            }
            let event = tokio::select! {
                event = rx.next() => event?,
                _ = drain.cut_off() => {
                    let error = Event::Error(GenError::Internal(CUT_BY_SHUTDOWN.into()));
                    return Some(((0, error), (rx, timing, drain, true)));
                }
            };
            if let (_, Event::Text(_)) = event {
                timing.text();
            }
            Some((event, (rx, timing, drain, false)))
        },
    )
}

/// Where each choice of a streamed answer stands.
struct ChoiceState {
    /// Token log-probabilities waiting for the chunk that carries their text.
    pending: Vec<TokenLogprob>,
    /// Where the next token's text starts in the choice's answer (completions' `text_offset`).
    offset: usize,
    /// Tokens generated so far (counted where every chunk carries the usage).
    tokens: usize,
    /// With functions to call: what of the answer can be shown, and its calls.
    answer: Option<ToolAnswer>,
    /// Whether its echoed prompt has been sent (or there is none to send).
    echoed: bool,
    done: bool,
}

/// What one chunk of a streamed choice carries.
enum Piece<'a> {
    Nothing,
    /// No choice: the request's usage, last.
    Usage,
    Text(&'a str),
    Calls(&'a [ToolCall]),
}

impl Chunks {
    /// The SSE chunks of one streamed answer (each chunk one choice's, by `index`), ending with
    /// `data: [DONE]` once every choice has finished, or with an error event if the server's
    /// shutdown timeout cuts it off.
    fn stream(
        self,
        first: Option<(usize, Event)>,
        events: impl Stream<Item = (usize, Event)> + Unpin + Send + 'static,
        timing: Timing,
        drain: Arc<crate::drain::Drain>,
    ) -> impl Stream<Item = Result<SseEvent, Infallible>> {
        let Chunks {
            kind,
            id,
            model,
            include_usage,
            continuous,
            logprobs,
            n,
            tools,
            echo,
            echo_top,
            per,
            stops,
        } = self;
        let created = now_s();
        // The echoed prompts wait for their log-probabilities where they carry them.
        let late_echo = echo.as_ref().filter(|_| echo_top.is_some());
        let mut choices: Vec<ChoiceState> = (0..n)
            .map(|_| ChoiceState {
                pending: Vec::new(),
                offset: 0,
                tokens: 0,
                answer: tools.as_ref().map(Tools::answer),
                echoed: late_echo.is_none(),
                done: false,
            })
            .collect();
        let mut total = Usage::default();
        // A choice's usage so far, where every chunk carries it.
        let every = continuous.is_some();
        let counted = move |index: usize, tokens: usize| {
            let prompts = continuous.as_ref()?;
            Some(counts_json(*prompts.get(index / per)?, tokens))
        };
        let rendered = move |c: &mut ChoiceState| match (logprobs, kind) {
            (false, _) => Value::Null,
            (true, Kind::Chat) => super::logprobs::chat(&std::mem::take(&mut c.pending)),
            (true, Kind::Completion) => {
                super::logprobs::completion(&std::mem::take(&mut c.pending), &mut c.offset)
            }
        };
        let chunk = move |index: usize,
                          piece: Piece,
                          reason: Option<FinishReason>,
                          usage: Option<Value>,
                          logprobs: Value| {
            let ended = reason.map(|r| stop_reason(r, &stops));
            let reason = reason.map(FinishReason::as_str);
            let mut choices = match (kind, piece) {
                // The last chunk: the request's usage alone.
                (_, Piece::Usage) => json!([]),
                (Kind::Completion, piece) => {
                    let text = match piece {
                        Piece::Text(p) => p,
                        _ => "",
                    };
                    json!([{
                        "index": index, "text": text, "finish_reason": reason, "logprobs": logprobs
                    }])
                }
                (Kind::Chat, piece) => {
                    let delta = match piece {
                        Piece::Text(p) => json!({ "role": "assistant", "content": p }),
                        Piece::Calls(calls) => json!({
                            "role": "assistant", "content": null, "tool_calls": calls_json(calls, true)
                        }),
                        Piece::Nothing | Piece::Usage => json!({}),
                    };
                    json!([{ "index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs }])
                }
            };
            // A choice's last chunk says which stop ended it.
            if let (Some(stop_reason), Some(choice)) = (ended, choices.get_mut(0)) {
                choice["stop_reason"] = stop_reason;
            }
            let mut body = json!({
                "id": id,
                "object": match kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion.chunk" },
                "created": created,
                "model": model,
                "choices": choices,
            });
            if let Some(usage) = usage {
                body["usage"] = usage;
            }
            SseEvent::default().data(body.to_string())
        };
        let echoed: Vec<Result<SseEvent, Infallible>> = echo
            .iter()
            .filter(|_| echo_top.is_none())
            .flat_map(|e| {
                (0..n).map(|i| {
                    let usage = counted(i, 0);
                    Ok(chunk(i, Piece::Text(&e[i / per]), None, usage, Value::Null))
                })
            })
            .collect();
        let late_echo = late_echo.cloned();
        let rest = timed(events, timing, drain);
        let answers = stream::iter(first).chain(rest).flat_map(move |(i, event)| {
            // A choice's echoed prompt, first: with its log-probabilities when they come, or
            // without, should its text or end come first.
            let echo_first = |c: &mut ChoiceState, prompt: Option<&PromptLogprobs>| {
                let text = late_echo.as_ref()?.get(i / per)?;
                if std::mem::replace(&mut c.echoed, true) {
                    return None;
                }
                let rendered = match (prompt, echo_top) {
                    (Some(p), Some(top)) => super::logprobs::echoed_prompt(p, top, &mut c.offset),
                    _ => Value::Null,
                };
                Some(chunk(i, Piece::Text(text), None, counted(i, 0), rendered))
            };
            let out: Vec<SseEvent> = match (event, choices.get_mut(i)) {
                (Event::Error(e), _) => {
                    let body = OpenAiError::from(e).body();
                    vec![SseEvent::default().data(body.to_string())]
                }
                (Event::PromptLogprobs(p), Some(c)) => {
                    echo_first(c, Some(&p)).into_iter().collect()
                }
                (_, None) => Vec::new(),
                (Event::Logprob(t), Some(c)) => {
                    c.tokens += 1;
                    if logprobs {
                        c.pending.push(t);
                    }
                    Vec::new()
                }
                (Event::Text(t), Some(c)) => {
                    let mut v: Vec<SseEvent> = echo_first(c, None).into_iter().collect();
                    let shown = match c.answer.as_mut() {
                        Some(answer) => answer.push(&t),
                        None => Some(t),
                    };
                    // Held text keeps its tokens' log-probabilities until it is shown.
                    let usage = counted(i, c.tokens);
                    if let Some(text) = shown {
                        v.push(chunk(i, Piece::Text(&text), None, usage, rendered(c)));
                    }
                    v
                }
                (Event::Done(mut reason, usage), Some(c)) => {
                    let mut v: Vec<SseEvent> = echo_first(c, None).into_iter().collect();
                    let so_far = counted(i, c.tokens);
                    if let Some(answer) = c.answer.take() {
                        let (rest, calls) = answer.finish();
                        if let Some(text) = rest {
                            let usage = so_far.clone();
                            v.push(chunk(i, Piece::Text(&text), None, usage, rendered(c)));
                        }
                        if !calls.is_empty() {
                            let usage = so_far.clone();
                            v.push(chunk(i, Piece::Calls(&calls), None, usage, Value::Null));
                            reason = FinishReason::ToolCalls;
                        }
                    }
                    // Tokens whose text a stop string cut go with the choice's last chunk.
                    let last = if c.pending.is_empty() {
                        Value::Null
                    } else {
                        rendered(c)
                    };
                    c.done = true;
                    if i % per == 0 {
                        total.prompt_tokens += usage.prompt_tokens;
                    }
                    total.completion_tokens += usage.completion_tokens;
                    // The choice's own count, the end token included.
                    let usage = every.then(|| usage_json(&usage));
                    v.push(chunk(i, Piece::Nothing, Some(reason), usage, last));
                    if choices.iter().all(|c| c.done) {
                        if include_usage {
                            let usage = Some(usage_json(&total));
                            v.push(chunk(0, Piece::Usage, None, usage, Value::Null));
                        }
                        v.push(SseEvent::default().data("[DONE]"));
                    }
                    v
                }
            };
            stream::iter(out.into_iter().map(Ok))
        });
        stream::iter(echoed).chain(answers)
    }
}
