//! A way back into the server for models that run other models: Triton's business logic
//! scripting (BLS), where a Python model's `execute` sends requests to any model the server
//! serves and uses their answers, and loads and unloads the models it needs.
//!
//! The scheduler implements [`ModelCaller`]; a backend that needs it gets a [`Callback`] when
//! it is made, which the server fills once its model manager exists (the manager holds the
//! backends, so the callback cannot be given to them before).
//!
//! While requests are traced, each request a model is given carries [`TraceCalls`]
//! ([`crate::RequestInfo::calls`]); a request the model sends on its behalf (Triton's
//! `InferenceRequest(..., trace=request.trace())`) carries the same ([`Call::calls`]), and the
//! scheduler leaves the account of its answer there, so that the first request's trace holds
//! its calls' traces too.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock};

use crate::Tensor;

/// Tensors by name: a request's inputs, or an answer's outputs.
pub type Named = Vec<(String, Tensor)>;

/// An answer to a request a model sent: its outputs by name, and the parameters the model that
/// answered set in it (Triton's `InferenceResponse(parameters=...)`; none when it set none).
#[derive(Debug, Clone, Default)]
pub struct Called {
    pub outputs: Named,
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Where [`ModelCaller::call_stream`] hands each response of a stream (`Some`), then its end
/// (`None`); `false` back means the receiver has gone.
pub type StreamSink = Box<dyn FnMut(Option<Result<Called, String>>) -> bool + Send>;

/// Stops a stream [`ModelCaller::call_stream`] began (Triton's `cancel()` on a decoupled
/// request's response iterator). Dropped without a call, it stops the stream too: whoever was
/// to read it has gone.
pub type StreamCancel = Box<dyn FnOnce() + Send>;

/// What a stream's sink gets when its request was cancelled, before the end.
pub const CANCELLED: &str = "the request was cancelled by the model that sent it";

/// A request a model sends to one of the server's models.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The model's name.
    pub model: String,
    /// Its version; none for the newest.
    pub version: Option<String>,
    /// The inputs, each named.
    pub inputs: Named,
    /// The outputs to answer with, by name; every output when empty.
    pub outputs: Vec<String>,
    /// The request's parameters, as a JSON object's text; empty for none. Those sheaf reads
    /// itself (`priority`, `timeout`, `sequence_id`, `sequence_start`, `sequence_end`) place
    /// the request as a client's would be; the others go to the model.
    pub parameters: String,
    /// The request's id, echoed to the model it runs on; none for none.
    pub id: Option<String>,
    /// Where the account of its answer goes: the calls of the request it was sent for, when
    /// that one may be traced; none otherwise.
    pub calls: Option<TraceCalls>,
}

/// The accounts of the answers to the requests a model sent on behalf of one of its requests,
/// kept for that request's trace. The scheduler puts them here and takes them back; to a
/// backend they are opaque, and it only passes them on from a request to the calls made for
/// it. Clones share the same place.
#[derive(Clone, Default)]
pub struct TraceCalls(Arc<Mutex<Vec<Box<dyn Any + Send>>>>);

impl TraceCalls {
    /// Keeps the account of one call's answer.
    pub fn keep(&self, account: Box<dyn Any + Send>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(account);
    }

    /// The accounts kept so far, in the order their answers came; none are left behind.
    pub fn take(&self) -> Vec<Box<dyn Any + Send>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl PartialEq for TraceCalls {
    /// The same place.
    fn eq(&self, other: &TraceCalls) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TraceCalls {}

impl std::fmt::Debug for TraceCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceCalls")
    }
}

/// Runs a request on one of the server's models, from a model's own thread.
pub trait ModelCaller: Send + Sync {
    /// Runs `call` and returns the outputs it asked for, named. Blocks the calling thread until
    /// the answer; an error is the server's message.
    fn call(&self, call: Call) -> Result<Called, String>;

    /// As [`ModelCaller::call`], for a model that may answer with a stream of responses (a
    /// decoupled model, or a pipeline with one), without blocking: each response goes to
    /// `sink` as it comes, from another thread, then `None` once the stream has ended. An
    /// error that cuts the stream short is its last response; a model that answers once gives
    /// one response. When `sink` returns `false`, no more is sent to it and the stream is
    /// dropped. An error returned here (the request could not be made) means `sink` is never
    /// called. The [`StreamCancel`] returned stops the stream: the request is dropped, so that
    /// the model answering it sees its client gone (and skips it while it waits), and the sink
    /// gets [`CANCELLED`] as an error, then the end; responses handed on before stay.
    fn call_stream(&self, call: Call, sink: StreamSink) -> Result<StreamCancel, String>;

    /// Loads `model` from the repository, as the repository API's load does (Triton's
    /// `pb_utils.load_model`), with `config` (Triton's JSON form, as text) in place of its
    /// folder's configuration when given, and from `files` (each a path inside the model's
    /// folder and its bytes; they need `config`) in place of its folder when there are any;
    /// returns once it is ready, or why it is not.
    fn load(
        &self,
        model: &str,
        config: Option<&str>,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<(), String> {
        let _ = (config, files);
        Err(format!(
            "cannot load '{model}': this server does not manage models"
        ))
    }

    /// Unloads `model` once the requests it admitted are answered (`pb_utils.unload_model`).
    fn unload(&self, model: &str) -> Result<(), String> {
        Err(format!(
            "cannot unload '{model}': this server does not manage models"
        ))
    }

    /// Whether `model` (at `version`, else its newest) is ready to serve
    /// (`pb_utils.is_model_ready`).
    fn is_ready(&self, _model: &str, _version: Option<&str>) -> bool {
        false
    }
}

/// Where a backend finds the server's [`ModelCaller`] once the server has set it; shared by
/// every clone.
#[derive(Clone, Default)]
pub struct Callback(Arc<OnceLock<Arc<dyn ModelCaller>>>);

impl Callback {
    /// Sets the caller; a second call is ignored.
    pub fn set(&self, caller: Arc<dyn ModelCaller>) {
        let _ = self.0.set(caller);
    }

    /// The caller, once set.
    pub fn get(&self) -> Option<&Arc<dyn ModelCaller>> {
        self.0.get()
    }
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Callback(set)"
        } else {
            "Callback(unset)"
        })
    }
}
