//! OpenAI's Responses API, `POST /v1/responses` (what the OpenAI Agents SDK and newer clients
//! call): its request is read as the chat request it amounts to (`instructions` as the system
//! message, `input` as the conversation, function calls and their outputs as the assistant's
//! and the tool's turns, `text.format` as `response_format`, `tools` as chat functions), runs
//! on the same engine path, and is answered as a `response` object with `message` and
//! `function_call` output items; streamed, as its typed events (`response.created` …
//! `response.output_text.delta` … `response.completed`).
//!
//! Answers are kept (`store`, true unless the request says false; [`super::store`]): a request
//! may go on from one with `previous_response_id` (its conversation's items come before the
//! request's input; its instructions do not carry over, as OpenAI's), and
//! `GET`/`DELETE /v1/responses/{id}` read and remove them. A request with `background: true` is
//! answered at once with its `queued` object and runs on a task of its own; `GET` shows it
//! `in_progress`, then finished (or `failed`), and `POST /v1/responses/{id}/cancel` stops it.
//! With `stream: true` as well, its events are kept as they come ([`super::replay`]): the
//! request's own stream follows them, the run goes on if that client goes, and `GET
//! /v1/responses/{id}?stream=true&starting_after=N` reads them again from after event `N`.
//! A request made in a conversation of the Conversations API (`conversation`,
//! [`super::conversations`]) reads its items first and adds its own once finished. With
//! `truncation: auto`, the oldest turns are dropped to fit the model's context ([`fit`]). Tools
//! other than functions and inputs other than text are refused with what to do.
//!
//! [`request`] reads a request as its chat request; [`answer`] builds the `response` object and
//! its stream events; this file holds the routes, the runs, and what is kept of them.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use sheaf_backend::generation::{Event, GenError, GenRequest, Prompt, Tools};
use sheaf_core::ModelHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::conversation_store::{Conversation as StoredConversation, ConversationStore, Refused};
use super::handlers::{generator, next_id, now_s, timed, Timing};
use super::replay::{EventLog, Writer};
use super::store::{Keep, ResponseStore, Stored};
use crate::error::{bad, OpenAiError};
use crate::AppState;

mod answer;
mod request;

use answer::{output_items, Answer, Streamed};
pub(super) use request::input_message;
use request::to_chat;

/// `POST /v1/responses`.
pub async fn responses(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, OpenAiError> {
    let Json(mut body) = body.map_err(|e| bad(e.body_text()))?;
    let kept = Keeping::read(&mut body, &state.responses)?;
    let made_in = conversation_of(&mut body, &state.conversations, kept.previous.is_some())?;
    let previous = match (&kept.previous, &made_in) {
        (Some(p), _) => Some(p.items.as_slice()),
        (None, Some(c)) => Some(c.items.as_slice()),
        (None, None) => None,
    };
    let (chat, mut echo, input) = to_chat(body, previous).map_err(bad)?;
    let truncate = echo.truncation == "auto";
    let answer_limit = echo.max_output_tokens.as_u64().map(|n| n as usize);
    if echo.background {
        background_allowed(&kept, &state.responses)?;
    }
    echo.store = kept.store;
    echo.previous_response_id = kept.previous.as_ref().map(|p| p.object["id"].clone());
    echo.conversation = made_in.as_ref().map(|c| json!({ "id": c.id }));
    let input: Vec<Value> = input.into_iter().map(listed).collect();
    // What a later request goes on from: the conversation before, this input, the output.
    let history = kept.store.then(|| {
        let mut items = previous.map(<[Value]>::to_vec).unwrap_or_default();
        let start = items.len();
        items.extend(input.iter().cloned());
        History {
            store: state.responses.clone(),
            input: start..items.len(),
            items,
        }
    });
    let joined = made_in.map(|c| Joined {
        store: state.conversations.clone(),
        id: c.id,
        input,
    });
    let (handle, context) = generator(&state, &chat.common.model).await?;
    let (common, mut request, tools) = chat.into_request(context).map_err(bad)?;
    if truncate {
        // What the answer may take: its own limit, else a quarter of the context.
        let reserve = match answer_limit {
            Some(n) => n,
            None => context / 4,
        };
        fit(&handle, &mut request.request, reserve, context)?;
    }
    let mut timing = Timing::start(&state, &common.model);
    let mut events = match handle.generate(request)?.into_iter().next() {
        Some(rx) => UnboundedReceiverStream::new(rx),
        None => return Err(GenError::Internal("the engine gave no answer".into()).into()),
    };
    let answer = Answer {
        // Random, so that one client cannot read another's kept responses by guessing.
        id: format!("resp_{:032x}", rand::random::<u128>()),
        created: now_s(),
        model: common.model.clone(),
        echo,
    };
    if answer.echo.background {
        let Some(history) = history else {
            return Err(GenError::Internal("a background response is not kept".into()).into());
        };
        let events = timed(events.map(|e| (0, e)), timing, state.drain.clone());
        let events = Box::pin(events.map(|(_, e)| e));
        let run = Run {
            answer,
            tools,
            history,
            joined,
        };
        return in_background(&state, run, events, common.stream);
    }
    if !common.stream {
        let object = answered(&answer, &mut events, tools.as_ref(), || timing.text()).await?;
        Ends { history, joined }.finished(&object);
        return Ok(Json(object).into_response());
    }
    // Errors known before the first token (a prompt too long) are answered as plain HTTP.
    let first = events.next().await;
    if let Some(Event::Error(e)) = first {
        return Err(e.into());
    }
    let streamed = Streamed::new(answer, tools.as_ref(), Some(Ends { history, joined }));
    let events = streamed.events(first, events, timing, state.drain.clone());
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// `truncation: auto`: drops the conversation's oldest turns (a system message stays, and so
/// does the last turn) until the prompt leaves `reserve` tokens of the model's `context` for
/// the answer, as few as that takes (found by halving, a tokenization each). A prompt that
/// fits is left as it is; one whose last turn alone does not fit is refused by the engine as
/// too long.
fn fit(
    handle: &ModelHandle,
    request: &mut GenRequest,
    reserve: usize,
    context: usize,
) -> Result<(), OpenAiError> {
    let Prompt::Chat(messages) = &request.prompt else {
        return Ok(());
    };
    let limit = context.saturating_sub(reserve).max(1);
    let rendering = request.rendering;
    let system = usize::from(messages.first().is_some_and(|(role, _)| role == "system"));
    let without = |dropped: usize| {
        let mut kept = messages[..system].to_vec();
        kept.extend_from_slice(&messages[system + dropped..]);
        Prompt::Chat(kept)
    };
    let fits = |dropped: usize| -> Result<bool, OpenAiError> {
        Ok(handle.tokenize(&without(dropped), rendering)?.len() <= limit)
    };
    // At most every turn but the last.
    let most = messages.len().saturating_sub(system + 1);
    if most == 0 || fits(0)? {
        return Ok(());
    }
    let (mut fewest, mut enough) = (1, most);
    if fits(most)? {
        while fewest < enough {
            let mid = (fewest + enough) / 2;
            if fits(mid)? {
                enough = mid;
            } else {
                fewest = mid + 1;
            }
        }
    }
    request.prompt = without(enough);
    Ok(())
}

/// Reads an answer's events to its end: the finished `response` object; `text_came` is called
/// with each piece of text.
async fn answered(
    answer: &Answer,
    events: &mut (impl Stream<Item = Event> + Unpin),
    tools: Option<&Tools>,
    mut text_came: impl FnMut(),
) -> Result<Value, GenError> {
    let mut text = String::new();
    loop {
        match events.next().await {
            Some(Event::Text(t)) => {
                text_came();
                text.push_str(&t);
            }
            Some(Event::Logprob(_) | Event::PromptLogprobs(_)) => {}
            Some(Event::Done(reason, usage)) => {
                let items = output_items(&text, tools);
                return Ok(answer.finished(items, reason, &usage));
            }
            Some(Event::Error(e)) => return Err(e),
            None => return Err(GenError::Internal("the engine dropped the request".into())),
        }
    }
}

/// A background response needs the store it is read back from.
fn background_allowed(kept: &Keeping, responses: &ResponseStore) -> Result<(), OpenAiError> {
    if !responses.enabled() {
        return Err(bad(
            "background: this server keeps no responses (--responses-store-mib 0), and a \
             background response is read back from them; answer while the connection is open",
        ));
    }
    if !kept.store {
        return Err(bad(
            "background: needs store (true by default): a background response is read back \
             with GET /v1/responses/{id}",
        ));
    }
    Ok(())
}

/// What a background run answers, and where it keeps its answer.
struct Run {
    answer: Answer,
    tools: Option<Tools>,
    history: History,
    joined: Option<Joined>,
}

/// Answers at once and runs the response on a task of its own, admitted as a request still in
/// flight (a drain waits for it, and its shutdown timeout fails it): the kept object turns
/// `in_progress` with its first event, then its finished (or `failed`) object replaces it.
/// `POST /v1/responses/{id}/cancel` stops it. The answer is the `queued` object; with `stream`,
/// the stream of its events instead, kept as they come, so that the run goes on when this
/// client goes and `GET ...?stream=true` reads them again.
fn in_background(
    state: &AppState,
    run: Run,
    events: impl Stream<Item = Event> + Unpin + Send + 'static,
    stream: bool,
) -> Result<Response, OpenAiError> {
    let Some(in_flight) = state.drain.admit() else {
        return Err(OpenAiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down; send the request again elsewhere",
        ));
    };
    let Run {
        answer,
        tools,
        history,
        joined,
    } = run;
    let queued = answer.object("queued", Vec::new(), None);
    let log = stream.then(|| Arc::new(EventLog::default()));
    let keeper = Keeper {
        store: history.store,
        items: history.items,
        input: history.input,
        events: log.clone(),
        joined,
    };
    let id = answer.id.clone();
    let store = Arc::clone(&keeper.store);
    store.start(&id);
    keeper.running(queued.clone());
    let task = match log.clone() {
        Some(log) => tokio::spawn(async move {
            let _in_flight = in_flight;
            streamed_run(answer, tools, events, keeper, Writer(log)).await;
        }),
        None => tokio::spawn(async move {
            let _in_flight = in_flight;
            answered_run(answer, tools, events, keeper).await;
        }),
    };
    store.running(&id, task.abort_handle());
    match log {
        Some(log) => Ok(
            Sse::new(log.follow(0).map(|e| Ok::<_, Infallible>(e.sse())))
                .keep_alive(KeepAlive::default())
                .into_response(),
        ),
        None => Ok(Json(queued).into_response()),
    }
}

/// Where a background run keeps its object as it goes.
struct Keeper {
    store: Arc<ResponseStore>,
    /// The conversation before its output.
    items: Vec<Value>,
    input: std::ops::Range<usize>,
    events: Option<Arc<EventLog>>,
    /// The conversation it was made in.
    joined: Option<Joined>,
}

impl Keeper {
    /// Keeps `object` while the run goes on.
    fn running(&self, object: Value) {
        let kept = Keep {
            object,
            items: self.items.clone(),
            input: self.input.clone(),
            events: self.events.clone(),
        };
        self.store.update(kept, false);
    }

    /// Keeps the finished `object`, its output after the conversation, once the conversation
    /// it was made in has its items.
    fn finished(self, object: Value) {
        if let Some(joined) = self.joined {
            joined.add(&object);
        }
        let mut items = self.items;
        if let Some(output) = object["output"].as_array() {
            items.extend(output.iter().cloned());
        }
        let kept = Keep {
            object,
            items,
            input: self.input,
            events: self.events,
        };
        self.store.update(kept, true);
    }
}

/// A background run answered as one object.
async fn answered_run(
    answer: Answer,
    tools: Option<Tools>,
    mut events: impl Stream<Item = Event> + Unpin,
    keeper: Keeper,
) {
    let mut in_progress = Some(answer.object("in_progress", Vec::new(), None));
    let started = || {
        if let Some(object) = in_progress.take() {
            keeper.running(object);
        }
    };
    let object = match answered(&answer, &mut events, tools.as_ref(), started).await {
        Ok(object) => object,
        Err(e) => answer.failed(&e).1,
    };
    keeper.finished(object);
}

/// A background run whose events are kept: `response.created` and `response.queued` at once,
/// `response.in_progress` with the engine's first event, then those of [`Streamed`]. The
/// finished object is kept before the events that end the stream are written, so that a
/// client that has read them reads it back finished.
async fn streamed_run(
    answer: Answer,
    tools: Option<Tools>,
    mut events: impl Stream<Item = Event> + Unpin,
    keeper: Keeper,
    log: Writer,
) {
    let mut streamed = Streamed::new(answer, tools.as_ref(), None);
    let queued = streamed.answer.object("queued", Vec::new(), None);
    log.push([
        streamed.event("response.created", json!({ "response": queued.clone() })),
        streamed.event("response.queued", json!({ "response": queued })),
    ]);
    let mut started = false;
    let mut ending = None;
    while let Some(event) = events.next().await {
        if !std::mem::replace(&mut started, true) {
            let object = streamed.answer.object("in_progress", Vec::new(), None);
            keeper.running(object.clone());
            log.push([streamed.event("response.in_progress", json!({ "response": object }))]);
        }
        let out = streamed.step(event);
        if let Some(whole) = streamed.whole.take() {
            ending = Some((whole, out));
            break;
        }
        log.push(out);
    }
    let (whole, out) = match ending {
        Some(ending) => ending,
        None => {
            let dropped = GenError::Internal("the engine dropped the request".into());
            let out = streamed.step(Event::Error(dropped));
            let whole = match streamed.whole.take() {
                Some(whole) => whole,
                None => streamed.answer.object("failed", Vec::new(), None),
            };
            (whole, out)
        }
    };
    keeper.finished(whole);
    log.push(out);
}

/// `POST /v1/responses/{id}/cancel`: stops a background response still running, which is kept
/// `cancelled`; a finished one is answered as it is. Only background responses are cancelled.
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    let Some(stored) = state.responses.get(&id) else {
        // One let go to stay within the budget while it ran is stopped all the same.
        state.responses.cancel(&id);
        return Err(unknown(&state.responses, &id));
    };
    if stored.object["background"] != true {
        return Err(bad(format!(
            "response '{}' was not made in the background (background: true); only those are \
             cancelled",
            sheaf_core::clip(&id)
        )));
    }
    state.responses.cancel(&id);
    match state.responses.get(&id) {
        Some(stored) => Ok(Json(stored.object.clone())),
        None => Err(unknown(&state.responses, &id)),
    }
}

/// `GET /v1/responses/{id}`: a kept response's object; with `stream=true`, the events of one
/// made with `background` and `stream`, from after sequence number `starting_after` (from the
/// first without it), followed while it runs.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    read: Result<Query<Read>, QueryRejection>,
) -> Result<Response, OpenAiError> {
    let Query(read) = read.map_err(|e| bad(e.body_text()))?;
    let Some(stored) = state.responses.get(&id) else {
        return Err(unknown(&state.responses, &id));
    };
    if !read.stream.unwrap_or(false) {
        if read.starting_after.is_some() {
            return Err(bad("starting_after: only with stream=true"));
        }
        return Ok(Json(stored.object.clone()).into_response());
    }
    let Some(log) = stored.events.clone() else {
        return Err(bad(format!(
            "stream: response '{}' was not made with background and stream both true, and only \
             those are streamed again; GET it without stream",
            sheaf_core::clip(&id)
        )));
    };
    let from = read.starting_after.map_or(0, |n| n.saturating_add(1));
    let from = usize::try_from(from).unwrap_or(usize::MAX);
    let events = log.follow(from).map(|e| Ok::<_, Infallible>(e.sse()));
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The query of `GET /v1/responses/{id}` (`include` and `include_obfuscation` change nothing
/// here: sheaf's events carry no obfuscation).
#[derive(Debug, Deserialize)]
pub struct Read {
    stream: Option<bool>,
    starting_after: Option<u64>,
}

/// `DELETE /v1/responses/{id}`: the response removed.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    if !state.responses.remove(&id) {
        return Err(unknown(&state.responses, &id));
    }
    Ok(Json(
        json!({ "id": id, "object": "response.deleted", "deleted": true }),
    ))
}

/// `GET /v1/responses/{id}/input_items`: a kept response's own input items (not those of the
/// responses it goes on from), a page at a time: `limit` (1 to 100, 20 by default), `order`
/// (`desc`, the default, or `asc`), `after` and `before` (an item's id).
pub async fn input_items(
    State(state): State<AppState>,
    Path(id): Path<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Query(page) = page.map_err(|e| bad(e.body_text()))?;
    let Some(stored) = state.responses.get(&id) else {
        return Err(unknown(&state.responses, &id));
    };
    page.of(stored.input_items()).map(Json).map_err(bad)
}

/// The query of a list of items.
#[derive(Debug, Deserialize)]
pub struct Page {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
    before: Option<String>,
}

impl Page {
    /// The page of `items` (in their order) as OpenAI's list object.
    pub(super) fn of(&self, items: &[Value]) -> Result<Value, String> {
        let limit = self.limit.unwrap_or(20);
        if !(1..=100).contains(&limit) {
            return Err(format!("limit: 1 to 100, not {limit}"));
        }
        let mut items: Vec<&Value> = match self.order.as_deref() {
            None | Some("desc") => items.iter().rev().collect(),
            Some("asc") => items.iter().collect(),
            Some(other) => return Err(format!("order: asc or desc, not {other:?}")),
        };
        let at = |items: &[&Value], id: &str, name: &str| {
            items
                .iter()
                .position(|item| item["id"] == id)
                .ok_or_else(|| {
                    format!(
                        "{name}: no item '{}' among the items listed",
                        sheaf_core::clip(id)
                    )
                })
        };
        if let Some(before) = &self.before {
            let i = at(&items, before, "before")?;
            items.truncate(i);
        }
        if let Some(after) = &self.after {
            let i = at(&items, after, "after")?;
            items.drain(..=i);
        }
        let has_more = items.len() > limit;
        items.truncate(limit);
        Ok(json!({
            "object": "list",
            "data": items,
            "first_id": items.first().map(|item| &item["id"]),
            "last_id": items.last().map(|item| &item["id"]),
            "has_more": has_more,
        }))
    }
}

/// An input item as it is kept and listed: with an id, and a message's text as parts.
pub(super) fn listed(mut item: Value) -> Value {
    let kind = item["type"].as_str().unwrap_or("message").to_string();
    if item["id"].is_null() {
        let prefix = match kind.as_str() {
            "function_call" => "fc",
            "function_call_output" => "fco",
            _ => "msg",
        };
        item["id"] = json!(next_id(prefix));
    }
    if kind == "message" {
        item["type"] = json!("message");
        if let Value::String(text) = &item["content"] {
            let part = if item["role"] == "assistant" {
                "output_text"
            } else {
                "input_text"
            };
            item["content"] = json!([{ "type": part, "text": text }]);
        }
        if item["status"].is_null() {
            item["status"] = json!("completed");
        }
    }
    item
}

/// The 404 of a response not kept, saying why it may not be.
fn unknown(store: &ResponseStore, id: &str) -> OpenAiError {
    let why = if store.enabled() {
        "unknown, deleted, or let go to stay within --responses-store-mib"
    } else {
        "this server keeps no responses (--responses-store-mib 0)"
    };
    OpenAiError::new(
        StatusCode::NOT_FOUND,
        format!("no response '{}' is kept: {why}", sheaf_core::clip(id)),
    )
}

/// What a request asks of the store: whether its answer is kept, and the kept response it
/// goes on from.
struct Keeping {
    store: bool,
    previous: Option<Arc<Stored>>,
}

impl Keeping {
    /// Takes `store` and `previous_response_id` out of `body`.
    fn read(body: &mut Value, responses: &ResponseStore) -> Result<Keeping, OpenAiError> {
        let Some(fields) = body.as_object_mut() else {
            return Ok(Keeping {
                store: false,
                previous: None,
            });
        };
        let store = match fields.remove("store") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => b,
            Some(other) => return Err(bad(format!("store: true or false, not {other}"))),
        };
        let previous = match fields.remove("previous_response_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) if !responses.enabled() => {
                return Err(bad(format!(
                    "previous_response_id '{}': this server keeps no responses \
                     (--responses-store-mib 0); send the whole conversation in input",
                    sheaf_core::clip(&id)
                )))
            }
            Some(Value::String(id)) => match responses.get(&id) {
                Some(stored)
                    if matches!(
                        stored.object["status"].as_str(),
                        Some("completed" | "incomplete")
                    ) =>
                {
                    Some(stored)
                }
                Some(stored) => {
                    return Err(bad(format!(
                        "previous_response_id '{}' is {}: a response is gone on from once it \
                         is completed (or incomplete)",
                        sheaf_core::clip(&id),
                        stored.object["status"].as_str().unwrap_or("unfinished")
                    )))
                }
                None => return Err(unknown(responses, &id)),
            },
            Some(other) => {
                return Err(bad(format!(
                    "previous_response_id: a response's id, not {other}"
                )))
            }
        };
        Ok(Keeping {
            store: store && responses.enabled(),
            previous,
        })
    }
}

/// Where a finished answer is kept: the conversation before its output, and which of its items
/// are the request's own input.
struct History {
    store: Arc<ResponseStore>,
    items: Vec<Value>,
    input: std::ops::Range<usize>,
}

/// Keeps a finished `object` with its conversation, when it is to be kept.
fn keep(history: Option<History>, object: &Value) {
    if let Some(History {
        store,
        mut items,
        input,
    }) = history
    {
        if let Some(output) = object["output"].as_array() {
            items.extend(output.iter().cloned());
        }
        store.keep(Keep::answered(object.clone(), items, input));
    }
}

/// Where a finished answer goes: kept as a response, with the conversation before its output
/// (`store`), and added to the conversation it was made in (`conversation`).
struct Ends {
    history: Option<History>,
    joined: Option<Joined>,
}

impl Ends {
    fn finished(self, object: &Value) {
        if let Some(joined) = self.joined {
            joined.add(object);
        }
        keep(self.history, object);
    }
}

/// The conversation (Conversations API) a response was made in, and the request's own input
/// items, which it gains with the output once the response has finished.
struct Joined {
    store: Arc<ConversationStore>,
    id: String,
    input: Vec<Value>,
}

impl Joined {
    /// Adds the input and the output items of the finished `object` (`completed` or
    /// `incomplete`; a failed response adds nothing) at the conversation's end.
    fn add(self, object: &Value) {
        if !matches!(object["status"].as_str(), Some("completed" | "incomplete")) {
            return;
        }
        let mut items = self.input;
        if let Some(output) = object["output"].as_array() {
            items.extend(output.iter().cloned());
        }
        match self.store.append(&self.id, items) {
            Ok(()) => {}
            Err(Refused::TooLarge) => tracing::warn!(
                conversation = %self.id,
                "a response's items were not added to its conversation: it would outgrow \
                 --responses-store-mib"
            ),
            Err(_) => tracing::debug!(
                conversation = %self.id,
                "a response's conversation was deleted or let go before it finished"
            ),
        }
    }
}

/// The conversation a request names (`conversation`: its id, or `{"id": ...}`), taken out of
/// `body`: the conversation's items go before the request's input. Not with
/// `previous_response_id`.
fn conversation_of(
    body: &mut Value,
    conversations: &ConversationStore,
    previous: bool,
) -> Result<Option<StoredConversation>, OpenAiError> {
    let Some(named) = body.as_object_mut().and_then(|b| b.remove("conversation")) else {
        return Ok(None);
    };
    let id = match &named {
        Value::Null => return Ok(None),
        Value::String(id) => id.as_str(),
        Value::Object(o) => match o.get("id") {
            Some(Value::String(id)) => id.as_str(),
            _ => return Err(bad("conversation: its id, or {\"id\": its id}")),
        },
        _ => return Err(bad("conversation: its id, or {\"id\": its id}")),
    };
    if previous {
        return Err(bad(
            "conversation and previous_response_id: one or the other; a conversation holds \
             the items a response goes on from",
        ));
    }
    match conversations.get(id) {
        Some(conversation) => Ok(Some(conversation)),
        None => Err(super::conversations::unknown(conversations, id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_are_listed_a_page_at_a_time() {
        let items: Vec<Value> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| json!({ "id": id }))
            .collect();
        let page = |query: Value| -> Result<Value, String> {
            serde_json::from_value::<Page>(query).unwrap().of(&items)
        };
        let ids = |list: &Value| -> Vec<String> {
            list["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_string())
                .collect()
        };
        let all = page(json!({})).unwrap();
        assert_eq!(ids(&all), ["d", "c", "b", "a"]);
        assert_eq!(
            (all["first_id"].clone(), all["has_more"].clone()),
            (json!("d"), json!(false))
        );
        let first = page(json!({"order": "asc", "limit": 2})).unwrap();
        assert_eq!(ids(&first), ["a", "b"]);
        assert_eq!(first["has_more"], true);
        let next = page(json!({"order": "asc", "limit": 2, "after": "b"})).unwrap();
        assert_eq!(ids(&next), ["c", "d"]);
        assert_eq!(next["has_more"], false);
        assert_eq!(ids(&page(json!({"before": "b"})).unwrap()), ["d", "c"]);
        for (query, says) in [
            (json!({"limit": 0}), "limit"),
            (json!({"limit": 101}), "limit"),
            (json!({"order": "up"}), "order"),
            (json!({"after": "z"}), "after"),
        ] {
            assert!(page(query.clone()).unwrap_err().contains(says), "{query}");
        }
    }

    #[test]
    fn input_items_are_kept_with_ids_and_text_parts() {
        let item = listed(json!({"role": "user", "content": "hi"}));
        assert_eq!(item["type"], "message");
        assert!(item["id"].as_str().unwrap().starts_with("msg"));
        assert_eq!(
            item["content"],
            json!([{"type": "input_text", "text": "hi"}])
        );
        assert_eq!(item["status"], "completed");
        let item = listed(json!({"type": "function_call_output", "call_id": "c", "output": "x"}));
        assert!(item["id"].as_str().unwrap().starts_with("fco"));
        let kept = listed(json!({"id": "msg_7", "role": "assistant", "content": "ok"}));
        assert_eq!(kept["id"], "msg_7");
        assert_eq!(kept["content"][0]["type"], "output_text");
        // What is kept still reads back as the same turn.
        let message = input_message(0, kept).unwrap();
        assert_eq!(message, json!({"role": "assistant", "content": "ok"}));
    }

    #[test]
    fn store_and_previous_response_id_are_read_and_checked() {
        let store = ResponseStore::new(1 << 20);
        store.keep(Keep::answered(
            json!({"id": "resp_1", "status": "completed", "output": []}),
            vec![json!({"role": "user"})],
            0..1,
        ));
        // A background response still running is not gone on from.
        store.keep(Keep::answered(
            json!({"id": "resp_q", "status": "queued", "output": []}),
            Vec::new(),
            0..0,
        ));
        let mut body = json!({"input": "x", "previous_response_id": "resp_q"});
        let e = Keeping::read(&mut body, &store).map(|_| ()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("is queued"), "{}", e.message);
        let mut body = json!({"input": "x", "previous_response_id": "resp_1"});
        let kept = Keeping::read(&mut body, &store).unwrap();
        assert!(kept.store);
        assert_eq!(kept.previous.unwrap().items.len(), 1);
        assert_eq!(body, json!({"input": "x"}));
        let mut body = json!({"input": "x", "store": false});
        assert!(!Keeping::read(&mut body, &store).unwrap().store);
        let mut body = json!({"input": "x", "previous_response_id": "resp_2"});
        let e = Keeping::read(&mut body, &store).map(|_| ()).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(e.message.contains("resp_2"), "{}", e.message);
        let mut body = json!({"input": "x", "store": "yes"});
        assert_eq!(
            Keeping::read(&mut body, &store)
                .map(|_| ())
                .unwrap_err()
                .status,
            StatusCode::BAD_REQUEST
        );
        let off = ResponseStore::new(0);
        let mut body = json!({"input": "x"});
        assert!(!Keeping::read(&mut body, &off).unwrap().store);
        let mut body = json!({"input": "x", "previous_response_id": "resp_1"});
        let e = Keeping::read(&mut body, &off).map(|_| ()).unwrap_err();
        assert!(e.message.contains("keeps no responses"), "{}", e.message);
    }
}
