//! A Responses answer built from the engine's events: the `response` object with its
//! `message` and `function_call` output items, whole ([`Answer`]) or as its typed stream events
//! ([`Streamed`]).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::Event as SseEvent;
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use sheaf_backend::generation::{Event, FinishReason, GenError, ToolAnswer, Tools, Usage};

use crate::openai::handlers::{next_id, timed, Timing};
use crate::openai::replay::Typed;

use super::request::Echo;
use super::Ends;

/// The output items of a finished answer: its text as a message (when there is any), then the
/// function calls read out of it.
pub(super) fn output_items(text: &str, tools: Option<&Tools>) -> Vec<Value> {
    let (shown, calls) = match tools {
        None => (text.to_string(), Vec::new()),
        Some(tools) => {
            let mut held = tools.answer();
            let shown = held.push(text);
            let (rest, calls) = held.finish();
            (shown.unwrap_or_default() + &rest.unwrap_or_default(), calls)
        }
    };
    let mut items = Vec::new();
    if !shown.is_empty() || calls.is_empty() {
        items.push(message_item(&next_id("msg"), &shown, "completed"));
    }
    items.extend(calls.iter().map(|call| {
        json!({
            "type": "function_call",
            "id": next_id("fc"),
            "call_id": next_id("call"),
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        })
    }));
    items
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{ "type": "output_text", "text": text, "annotations": [] }])
    } else {
        json!([])
    };
    json!({ "type": "message", "id": id, "status": status, "role": "assistant", "content": content })
}

/// The `response` object of one answer.
pub(super) struct Answer {
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) echo: Echo,
}

impl Answer {
    /// The object with `status` and `output` (and the usage once known).
    pub(super) fn object(&self, status: &str, output: Vec<Value>, usage: Option<&Usage>) -> Value {
        let e = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "model": self.model,
            "output": output,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "temperature": e.temperature,
            "top_p": e.top_p,
            "tools": e.tools,
            "tool_choice": e.tool_choice,
            "parallel_tool_calls": e.parallel_tool_calls,
            "text": e.text,
            "metadata": e.metadata,
            "store": e.store,
            "background": e.background,
            "previous_response_id": e.previous_response_id,
            "conversation": e.conversation,
            "truncation": e.truncation,
            "usage": usage.map(|u| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": { "cached_tokens": 0 },
                "output_tokens": u.completion_tokens,
                "output_tokens_details": { "reasoning_tokens": 0 },
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })),
        })
    }

    /// The error, and the `failed` object carrying it.
    pub(super) fn failed(&self, e: &GenError) -> (Value, Value) {
        let error = json!({ "code": "server_error", "message": e.to_string() });
        let mut failed = self.object("failed", Vec::new(), None);
        failed["error"] = error.clone();
        (error, failed)
    }

    /// The finished object: `incomplete` when the token limit cut the answer.
    pub(super) fn finished(
        &self,
        output: Vec<Value>,
        reason: FinishReason,
        usage: &Usage,
    ) -> Value {
        let cut = matches!(reason, FinishReason::Length);
        let mut object = self.object(
            if cut { "incomplete" } else { "completed" },
            output,
            Some(usage),
        );
        if cut {
            object["incomplete_details"] = json!({ "reason": "max_output_tokens" });
        }
        object
    }
}

/// Where a streamed answer stands.
pub(super) struct Streamed {
    pub(super) answer: Answer,
    /// The next event's `sequence_number`.
    seq: u64,
    /// The message item's id.
    item: String,
    /// Whether the message item and its text part were announced.
    opened: bool,
    text: String,
    /// With functions to call: the text held back where a call may start.
    held: Option<ToolAnswer>,
    /// Where the finished answer is kept, with the conversation before its output.
    ends: Option<Ends>,
    /// Whether the answer has ended (its last events are out).
    ended: bool,
    /// The finished (or failed) object, once the answer has ended, until taken.
    pub(super) whole: Option<Value>,
}

impl Streamed {
    pub(super) fn new(answer: Answer, tools: Option<&Tools>, ends: Option<Ends>) -> Streamed {
        Streamed {
            answer,
            seq: 0,
            item: next_id("msg"),
            opened: false,
            text: String::new(),
            held: tools.map(Tools::answer),
            ends,
            ended: false,
            whole: None,
        }
    }

    pub(super) fn event(&mut self, kind: &'static str, mut data: Value) -> Typed {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Typed {
            kind,
            data: data.to_string(),
        }
    }

    /// The events that open the message item and its text part, once.
    fn open(&mut self, out: &mut Vec<Typed>) {
        if self.opened {
            return;
        }
        self.opened = true;
        let item = message_item(&self.item, "", "in_progress");
        out.push(self.event(
            "response.output_item.added",
            json!({ "output_index": 0, "item": item }),
        ));
        let part = json!({ "type": "output_text", "text": "", "annotations": [] });
        out.push(self.event(
            "response.content_part.added",
            json!({ "item_id": self.item, "output_index": 0, "content_index": 0, "part": part }),
        ));
    }

    fn delta(&mut self, text: &str, out: &mut Vec<Typed>) {
        self.open(out);
        self.text.push_str(text);
        let data = json!({
            "item_id": self.item, "output_index": 0, "content_index": 0, "delta": text, "logprobs": [],
        });
        out.push(self.event("response.output_text.delta", data));
    }

    /// The events of the answer's end: the message closed, the function calls, the whole.
    fn done(&mut self, reason: FinishReason, usage: &Usage) -> Vec<Typed> {
        let mut out = Vec::new();
        let mut calls = Vec::new();
        if let Some(held) = self.held.take() {
            let (rest, found) = held.finish();
            if let Some(rest) = rest {
                self.delta(&rest, &mut out);
            }
            calls = found;
        }
        let mut output = Vec::new();
        if self.opened || calls.is_empty() {
            self.open(&mut out);
            let text = self.text.clone();
            let data = json!({
                "item_id": self.item, "output_index": 0, "content_index": 0, "text": text, "logprobs": [],
            });
            out.push(self.event("response.output_text.done", data));
            let part = json!({ "type": "output_text", "text": text, "annotations": [] });
            let data = json!({
                "item_id": self.item, "output_index": 0, "content_index": 0, "part": part,
            });
            out.push(self.event("response.content_part.done", data));
            let item = message_item(&self.item, &text, "completed");
            let data = json!({ "output_index": 0, "item": item });
            out.push(self.event("response.output_item.done", data));
            output.push(item);
        }
        for call in calls {
            let index = output.len();
            let (id, call_id) = (next_id("fc"), next_id("call"));
            let mut item = json!({
                "type": "function_call", "id": id, "call_id": call_id, "name": call.name,
                "arguments": "", "status": "in_progress",
            });
            let data = json!({ "output_index": index, "item": item });
            out.push(self.event("response.output_item.added", data));
            let data = json!({ "item_id": id, "output_index": index, "delta": call.arguments });
            out.push(self.event("response.function_call_arguments.delta", data));
            let data = json!({ "item_id": id, "output_index": index, "arguments": call.arguments });
            out.push(self.event("response.function_call_arguments.done", data));
            item["arguments"] = json!(call.arguments);
            item["status"] = json!("completed");
            let data = json!({ "output_index": index, "item": item });
            out.push(self.event("response.output_item.done", data));
            output.push(item);
        }
        let whole = self.answer.finished(output, reason, usage);
        if let Some(ends) = self.ends.take() {
            ends.finished(&whole);
        }
        self.whole = Some(whole.clone());
        let kind = if whole["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(kind, json!({ "response": whole })));
        out
    }

    /// The typed events of one streamed answer, from `response.created` to
    /// `response.completed` (or `response.failed` with the error, also when the server's
    /// shutdown timeout cuts it off).
    pub(super) fn events(
        mut self,
        first: Option<Event>,
        rest: impl Stream<Item = Event> + Unpin + Send + 'static,
        timing: Timing,
        drain: Arc<crate::drain::Drain>,
    ) -> impl Stream<Item = Result<SseEvent, Infallible>> {
        let created = self.answer.object("in_progress", Vec::new(), None);
        let opening = vec![
            self.event("response.created", json!({ "response": created.clone() })),
            self.event("response.in_progress", json!({ "response": created })),
        ];
        let rest = timed(rest.map(|event| (0, event)), timing, drain).map(|(_, event)| event);
        let events = stream::iter(first)
            .chain(rest)
            .flat_map(move |event| stream::iter(self.step(event)));
        stream::iter(opening)
            .chain(events)
            .map(|event| Ok::<_, Infallible>(event.sse()))
    }

    /// The events one event of the engine's makes; none once the answer has ended.
    pub(super) fn step(&mut self, event: Event) -> Vec<Typed> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        match event {
            Event::Text(t) => {
                let shown = match self.held.as_mut() {
                    Some(held) => held.push(&t),
                    None => Some(t),
                };
                if let Some(text) = shown {
                    self.delta(&text, &mut out);
                }
            }
            Event::Logprob(_) | Event::PromptLogprobs(_) => {}
            Event::Done(reason, usage) => {
                self.ended = true;
                out = self.done(reason, &usage);
            }
            Event::Error(e) => {
                self.ended = true;
                let (error, failed) = self.answer.failed(&e);
                out.push(self.event("error", error));
                self.whole = Some(failed.clone());
                out.push(self.event("response.failed", json!({ "response": failed })));
            }
        }
        out
    }
}
