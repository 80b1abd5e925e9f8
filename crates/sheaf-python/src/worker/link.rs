//! The thread that answers what a model process asks of the server while it runs, whenever it
//! asks (during `execute` or from a thread of its own afterwards), and watches the requests a
//! streaming model still answers ([`super::open`]).
//!
//! Requests a model sends to the server's models (Triton's business logic scripting,
//! `pb_utils.InferenceRequest(...).exec()`) are answered through the calls region.
//!
//! The process sends `{"call": {"model", "version", "inputs", "outputs", "parameters", "id",
//! "decoupled"}}`, its inputs placed in the calls region. A plain call is run to its answer,
//! its outputs are placed in the region, and the process gets `{"ok": {"outputs": [...],
//! "parameters": {...}}}` (the parameters only when the answering model set some) or
//! `{"error": "..."}`.
//!
//! With `decoupled` (`exec(decoupled=True)`), the model reads the responses while they come: the
//! stream runs on the server's runtime and hands each response to this thread. Each goes to the
//! process as `{"part": {"outputs": [...], "parameters": {...}}}` (placed at the start of the
//! calls region) or `{"part": {"error": "..."}}`, and the next one waits until the process has
//! copied it out and said `{"next": {}}`. The end of the stream is `{"ok": {}}`. `{"cancel": {}}`
//! (Triton's `cancel()` on the iterator) stops the stream: the request is dropped, and after
//! the responses already come, the process gets [`sheaf_backend::CANCELLED`] as an error part,
//! then the end.
//!
//! The model may also load and unload the server's models, and ask whether one is ready
//! (Triton's model loading API): `{"manage": {"op", "model", "version"}}`, answered
//! `{"ok": ...}` or `{"error": "..."}`.
//!
//! While requests stream, the thread looks every [`LOOK_EVERY`] whether their clients have gone
//! (raising their flags) and whether one has gone the model's execution timeout without a
//! response (then the process hangs, and is killed: its requests fail, and the next batch starts
//! it again).

use std::collections::VecDeque;
use std::process::Child;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sheaf_backend::{Call, Callback, Called, Tensor};

use super::open::Open;
use super::Pipe;
use crate::answers::{read_placed, ALIGN};
use crate::region::Region;
use crate::traced::Traced;

/// How often the clients of streaming requests are looked at.
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(50);

/// What the link thread is told.
pub(crate) enum Event {
    /// A message of the process: `call`, `manage`, `next` or `cancel`.
    Message(Value),
    /// A response (`Some`) or the end (`None`) of the stream the model asked for, numbered.
    Streamed(u64, Option<Result<Called, String>>),
    /// A call of a streaming model has begun: its requests are to be watched.
    Look,
    /// The worker is gone.
    Stop,
}

/// The link thread's side of one process.
pub(crate) struct Link {
    pub(crate) pipe: Pipe,
    /// The model's own requests and their answers.
    pub(crate) calls: Region,
    /// The stream the model is reading, if any.
    pub(crate) stream: Option<OpenStream>,
    /// How many streams the model has asked for, to number them.
    pub(crate) streams_begun: u64,
    pub(crate) callback: Callback,
    /// Where the streams the model asks for send their responses: this thread's own events.
    pub(crate) events: Sender<Event>,
    pub(crate) open: Arc<Open>,
    pub(crate) child: Arc<Mutex<Child>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) instance: String,
    /// The requests of its batches that may be traced, by number: a request the model sends
    /// names the one it is sent for.
    pub(crate) traced: Traced,
}

impl Link {
    /// Answers the process's requests and watches its streams until the worker goes.
    pub(crate) fn run(mut self, events: Receiver<Event>) {
        let mut watching = false;
        loop {
            let event = if watching {
                match events.recv_timeout(LOOK_EVERY) {
                    Ok(e) => Some(e),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match events.recv() {
                    Ok(e) => Some(e),
                    Err(_) => return,
                }
            };
            match event {
                Some(Event::Stop) => return,
                Some(Event::Message(message)) => self.handle(&message),
                Some(Event::Streamed(id, response)) => self.streamed(id, response),
                Some(Event::Look) | None => {}
            }
            let looked = self.open.look();
            watching = looked.open;
            if looked.overdue {
                self.hangs();
            }
        }
    }

    fn handle(&mut self, message: &Value) {
        if let Some(call) = message.get("call") {
            if let Some(answer) = self.answer_call(call) {
                self.send(&answer);
            }
        } else if let Some(manage) = message.get("manage") {
            let answer = self.answer_manage(manage);
            self.send(&answer);
        } else if message.get("next").is_some() {
            self.stream_taken();
        } else if message.get("cancel").is_some() {
            if let Some(cancel) = self.stream.as_mut().and_then(|s| s.cancel.take()) {
                cancel();
            }
        }
    }

    /// Writes one message to the process; one that cannot be written means the process is
    /// lost, which its reader sees.
    fn send(&mut self, message: &Value) {
        if let Err(e) = super::write_message(&self.pipe, message) {
            tracing::warn!(instance = %self.instance, error = %e, "cannot write to the model's Python process");
        }
    }

    /// A request has gone the model's execution timeout without a response: the process is
    /// killed, and its requests fail with the reason.
    fn hangs(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let why = format!(
            "the model's Python process (pid {}) was lost: a streaming request went the model's \
             execution timeout ({} ms) without a response",
            child.id(),
            self.timeout.map_or(0, |t| t.as_millis())
        );
        tracing::error!(instance = %self.instance, "{why}");
        self.open.gone(&why);
        let _ = child.kill();
    }
}

/// A stream the model is reading.
pub(crate) struct OpenStream {
    /// Its number: responses of an earlier stream are dropped.
    id: u64,
    /// Responses, then the end (`None`), not yet handed to the process.
    waiting: VecDeque<Option<Result<Called, String>>>,
    /// Whether the process has taken the last response it was given, so that the calls region
    /// is free.
    taken: bool,
    /// Stops the stream; dropped with it (which stops it too, when it has not ended).
    cancel: Option<sheaf_backend::StreamCancel>,
}

impl Link {
    /// Loads, unloads or asks after a model of the server, as the model asked
    /// (`{"manage": {"op": "load" | "unload" | "ready", "model", "version", "config", "files"}}`,
    /// Triton's model loading API; `config`: a load's configuration in Triton's JSON form;
    /// `files`: the model's files to load from, each path's bytes in base64); the answer for the
    /// process.
    fn answer_manage(&self, manage: &Value) -> Value {
        let Some(caller) = self.callback.get() else {
            return json!({ "error": "this server does not manage models" });
        };
        let text = |key: &str| manage.get(key).and_then(Value::as_str).unwrap_or_default();
        let model = text("model");
        if model.is_empty() {
            return json!({ "error": "no model named (model_name=...)" });
        }
        let done = match text("op") {
            "load" => {
                let config = Some(text("config")).filter(|c| !c.is_empty());
                files_of(manage)
                    .and_then(|files| caller.load(model, config, files))
                    .map(|()| Value::Null)
            }
            "unload" => caller.unload(model).map(|()| Value::Null),
            "ready" => {
                let version = Some(text("version")).filter(|v| !v.is_empty() && *v != "-1");
                Ok(Value::Bool(caller.is_ready(model, version)))
            }
            other => Err(format!("unknown model operation {other:?}")),
        };
        match done {
            Ok(v) => json!({ "ok": v }),
            Err(e) => json!({ "error": e }),
        }
    }

    /// Runs the request the model sent, and returns the answer for the process; none for a
    /// stream, whose responses go to the process as they come.
    fn answer_call(&mut self, call: &Value) -> Option<Value> {
        match self.run_call(call) {
            Ok(answer) => answer.map(|a| json!({ "ok": a })),
            Err(e) => Some(json!({ "error": e })),
        }
    }

    fn run_call(&mut self, call: &Value) -> Result<Option<Value>, String> {
        let caller = self.callback.get().cloned().ok_or(
            "this server runs no requests from models (no model manager behind this backend)",
        )?;
        if self.stream.is_some() {
            return Err(
                "the responses of the model's last streaming request are still being read".into(),
            );
        }
        let model = call
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or("the request names no model (InferenceRequest(model_name=...))")?;
        self.calls.follow().map_err(|e| e.to_string())?;
        let inputs = call
            .get("inputs")
            .and_then(Value::as_array)
            .map(|placed| read_placed(self.calls.bytes(), placed, "input"))
            .transpose()?
            .unwrap_or_default();
        let text = |key: &str| call.get(key).and_then(Value::as_str).map(str::to_string);
        let request = Call {
            model: model.to_string(),
            version: text("version"),
            inputs,
            outputs: call
                .get("outputs")
                .and_then(Value::as_array)
                .map(|o| {
                    o.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            parameters: text("parameters").unwrap_or_default(),
            id: text("id").filter(|id| !id.is_empty()),
            calls: call
                .get("trace")
                .and_then(Value::as_u64)
                .and_then(|number| self.traced.calls(number)),
        };
        if call.get("decoupled").and_then(Value::as_bool) == Some(true) {
            self.streams_begun += 1;
            let id = self.streams_begun;
            let to = self.events.clone();
            let sink = Box::new(move |response| to.send(Event::Streamed(id, response)).is_ok());
            let cancel = caller.call_stream(request, sink)?;
            self.stream = Some(OpenStream {
                id,
                waiting: VecDeque::new(),
                taken: true,
                cancel: Some(cancel),
            });
            return Ok(None);
        }
        let answer = caller.call(request)?;
        self.answered(&answer).map(Some)
    }

    /// A response (or the end) of stream `id` has come: handed on when the process is ready.
    fn streamed(&mut self, id: u64, response: Option<Result<Called, String>>) {
        match self.stream.as_mut() {
            Some(stream) if stream.id == id => stream.waiting.push_back(response),
            _ => return,
        }
        self.hand_on()
    }

    /// The process has copied out the response it was given (`{"next": {}}`).
    fn stream_taken(&mut self) {
        if let Some(stream) = self.stream.as_mut() {
            stream.taken = true;
        }
        self.hand_on()
    }

    /// Gives the process the next waiting response, once the calls region is free, or the end.
    fn hand_on(&mut self) {
        let Some(stream) = self.stream.as_mut().filter(|s| s.taken) else {
            return;
        };
        let message = match stream.waiting.pop_front() {
            None => return,
            Some(None) => {
                self.stream = None;
                json!({ "ok": {} })
            }
            Some(Some(Err(e))) if e == sheaf_backend::CANCELLED => {
                json!({ "part": { "error": e, "code": "CANCELLED" } })
            }
            Some(Some(Err(e))) => json!({ "part": { "error": e } }),
            Some(Some(Ok(called))) => match self.answered(&called) {
                Ok(part) => json!({ "part": part }),
                Err(e) => json!({ "part": { "error": e } }),
            },
        };
        if let Some(stream) = self.stream.as_mut() {
            stream.taken = false;
        }
        self.send(&message);
    }

    /// An answer as the process reads it: its outputs placed in the calls region, and its
    /// parameters when it has any.
    fn answered(&mut self, answer: &Called) -> Result<Value, String> {
        let mut message = json!({ "outputs": self.place(&answer.outputs)? });
        if let Some(parameters) = &answer.parameters {
            message["parameters"] = Value::Object(parameters.clone());
        }
        Ok(message)
    }

    fn place(&mut self, answer: &[(String, Tensor)]) -> Result<Vec<Value>, String> {
        let total: usize = answer
            .iter()
            .map(|(_, t)| t.data().len().div_ceil(ALIGN) * ALIGN)
            .sum();
        self.calls.reserve(total).map_err(|e| e.to_string())?;
        let region = self.calls.bytes_mut();
        let mut at = 0;
        let mut placed = Vec::with_capacity(answer.len());
        for (name, t) in answer {
            let n = t.data().len();
            region[at..at + n].copy_from_slice(t.data());
            placed.push(json!({
                "name": name,
                "datatype": t.dtype().as_str(),
                "shape": t.shape(),
                "offset": at,
                "nbytes": n,
            }));
            at += n.div_ceil(ALIGN) * ALIGN;
        }
        Ok(placed)
    }
}

/// The files a model's load asks to load from (`"files": {path: base64}`), decoded.
fn files_of(manage: &Value) -> Result<Vec<(String, Vec<u8>)>, String> {
    use base64::Engine;
    let Some(files) = manage.get("files").and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    files
        .iter()
        .map(|(path, data)| {
            let bytes = data
                .as_str()
                .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
                .ok_or_else(|| format!("load_model: the bytes of file '{path}' did not arrive"))?;
            Ok((path.clone(), bytes))
        })
        .collect()
}
