//! The server's side of a model that runs other models (Triton's BLS): a request from a
//! model's own thread goes through the manager like any protocol's request (found or loaded,
//! queued, batched with the model's other traffic), and its outputs come back by name; a streaming
//! model's responses go back one by one as they come. Loads and unloads take the repository
//! API's path, under the same control mode. A request sent with its parent's trace (see
//! [`sheaf_backend::caller`]) leaves the account of its answer there.

use std::sync::{Arc, Weak};

use futures::StreamExt;
use sheaf_backend::{
    Call, Called, DataType, ModelCaller, Named, StreamCancel, StreamSink, Tensor, TraceCalls,
    CANCELLED,
};

use super::ModelManager;
use crate::json_parameters::{param_u64, sequence_flags};
use crate::request::{ByteTensor, InferResponse, NamedTensor, RawRequest};
use crate::stages::StepReceipt;

/// A [`ModelCaller`] over a manager, for the backends' [`sheaf_backend::Callback`].
pub fn caller(manager: &Arc<ModelManager>) -> Arc<dyn ModelCaller> {
    Arc::new(ManagerCaller {
        manager: Arc::downgrade(manager),
        runtime: tokio::runtime::Handle::current(),
    })
}

/// Holds the manager weakly: the manager holds the backends, which hold this.
struct ManagerCaller {
    manager: Weak<ModelManager>,
    runtime: tokio::runtime::Handle,
}

impl ModelCaller for ManagerCaller {
    fn call(&self, call: Call) -> Result<Called, String> {
        let manager = self.manager()?;
        let (model, version) = (call.model.clone(), call.version.clone());
        let parent = call.calls.clone();
        let raw = request(call)?;
        let answer = self.runtime.block_on(async {
            let handle = manager.get_or_load(&model, version.as_deref()).await?;
            manager.infer(&handle, raw).await
        });
        called(account(answer.map_err(|e| e.message)?, parent.as_ref()))
    }

    fn call_stream(&self, call: Call, mut sink: StreamSink) -> Result<StreamCancel, String> {
        let manager = self.manager()?;
        let (model, version) = (call.model.clone(), call.version.clone());
        let parent = call.calls.clone();
        let raw = request(call)?;
        let (cancel, mut cancelled) = tokio::sync::oneshot::channel::<()>();
        self.runtime.spawn(async move {
            // A cancel, or its sender dropped (the model that asked has gone), stops the
            // stream: dropping it drops the request.
            let finished = tokio::select! {
                biased;
                _ = &mut cancelled => false,
                () = stream_to(&manager, (&model, version.as_deref()), raw, parent, &mut sink) => true,
            };
            if !finished && sink(Some(Err(CANCELLED.to_string()))) {
                sink(None);
            }
        });
        Ok(Box::new(move || {
            let _ = cancel.send(());
        }))
    }

    fn load(
        &self,
        model: &str,
        config: Option<&str>,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<(), String> {
        let manager = self.manager()?;
        let config = config.map(crate::pbtxt::load_config).transpose()?;
        let loaded = match config {
            Some(config) if !files.is_empty() => self
                .runtime
                .block_on(manager.load_with_files(model, config, files)),
            Some(config) => self
                .runtime
                .block_on(manager.load_with_config(model, config)),
            None if !files.is_empty() => {
                return Err(
                    "load_model with files needs a config too: the model's configuration in \
                     Triton's JSON form"
                        .into(),
                )
            }
            None => self.runtime.block_on(manager.load(model)),
        };
        loaded.map(|_| ()).map_err(|e| e.message)
    }

    fn unload(&self, model: &str) -> Result<(), String> {
        let manager = self.manager()?;
        self.runtime
            .block_on(manager.unload(model))
            .map_err(|e| e.message)
    }

    fn is_ready(&self, model: &str, version: Option<&str>) -> bool {
        self.manager().is_ok_and(|m| {
            matches!(
                self.runtime.block_on(m.readiness_checked(model, version)),
                Ok(crate::Readiness::Ready)
            )
        })
    }
}

/// Runs `raw` on `model` at `version` and hands its responses to `sink` as they come, then
/// the end: each response of a streaming model, or the one answer of another (whose account
/// goes to `parent`'s calls).
async fn stream_to(
    manager: &ModelManager,
    (model, version): (&str, Option<&str>),
    raw: RawRequest,
    parent: Option<TraceCalls>,
    sink: &mut StreamSink,
) {
    let handle = match manager.get_or_load(model, version).await {
        Ok(handle) => handle,
        Err(e) => {
            if sink(Some(Err(e.message))) {
                sink(None);
            }
            return;
        }
    };
    if !manager.streams(&handle).await {
        let answer = manager.infer(&handle, raw).await;
        let answer = answer.map(|a| account(a, parent.as_ref()));
        if sink(Some(answer.map_err(|e| e.message).and_then(called))) {
            sink(None);
        }
        return;
    }
    let mut stream = match manager.infer_stream(&handle, raw).await {
        Ok(stream) => stream,
        Err(e) => {
            if sink(Some(Err(e.message))) {
                sink(None);
            }
            return;
        }
    };
    while let Some(response) = stream.next().await {
        let failed = response.is_err();
        if !sink(Some(response.map_err(|e| e.message).and_then(called))) {
            return;
        }
        if failed {
            break;
        }
    }
    sink(None);
}

impl ManagerCaller {
    fn manager(&self) -> Result<Arc<ModelManager>, String> {
        self.manager
            .upgrade()
            .ok_or_else(|| "the server is shutting down".to_string())
    }
}

/// The request `call` makes: its id, inputs, the outputs it asks for (every output when
/// none), and its parameters, those sheaf reads itself (priority, timeout, sequence) read as a
/// client's JSON request's are. Byte strings take the protocols' path, so that an image model
/// decodes them.
fn request(call: Call) -> Result<RawRequest, String> {
    let parameters = match call.parameters.trim() {
        "" => None,
        text => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(map)) => Some(map),
            _ => {
                return Err(format!(
                    "the request's parameters are not a JSON object: {text}"
                ))
            }
        },
    };
    let read = |e: crate::InferError| e.message;
    let owner = "the request";
    let mut raw = RawRequest {
        id: call.id,
        outputs: (!call.outputs.is_empty()).then_some(call.outputs),
        priority: param_u64(&parameters, "priority", owner).map_err(read)?,
        timeout_us: param_u64(&parameters, "timeout", owner).map_err(read)?,
        sequence: sequence_flags(&parameters).map_err(read)?,
        parameters: parameters.and_then(crate::model_parameters),
        // Its own calls are traced with it.
        calls: call.calls.as_ref().map(|_| TraceCalls::default()),
        ..RawRequest::default()
    };
    for (name, tensor) in call.inputs {
        if tensor.dtype() == DataType::Bytes {
            let shape = tensor.shape().to_vec();
            let bytes = ByteTensor::from_wire(name, shape, tensor.data()).map_err(|e| e.message)?;
            raw.byte_inputs.push(bytes);
        } else {
            raw.inputs.push(NamedTensor { name, tensor });
        }
    }
    Ok(raw)
}

/// Leaves the account of `response` in `parent`'s calls, when it has one and was sent with
/// one, and gives the response back.
fn account(mut response: InferResponse, parent: Option<&TraceCalls>) -> InferResponse {
    if let (Some(parent), Some(receipt)) = (parent, response.receipt.take()) {
        parent.keep(Box::new(StepReceipt {
            model: response.model_name.clone(),
            version: response.model_version.clone(),
            receipt,
        }));
    }
    response
}

/// An answer's outputs by name, byte strings in their wire form, and its parameters.
fn called(response: InferResponse) -> Result<Called, String> {
    let mut named: Named = response
        .outputs
        .into_iter()
        .map(|t| (t.name, t.tensor))
        .collect();
    for b in response.byte_outputs {
        let tensor = Tensor::new(DataType::Bytes, b.shape.clone(), b.to_wire())
            .map_err(|e| e.to_string())?;
        named.push((b.name, tensor));
    }
    Ok(Called {
        outputs: named,
        parameters: response.parameters.map(|p| p.as_ref().clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SequenceId;

    fn call(parameters: &str) -> Call {
        Call {
            model: "m".into(),
            version: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            parameters: parameters.into(),
            id: Some("step-1".into()),
            calls: None,
        }
    }

    #[test]
    fn a_model_s_request_is_placed_as_a_client_s_json_request() {
        let raw = request(call(
            r#"{"priority": 2, "timeout": 300000, "sequence_id": "cam-1",
                "sequence_start": true, "sequence_end": false, "answer_in": "fr"}"#,
        ))
        .unwrap();
        assert_eq!(raw.id.as_deref(), Some("step-1"));
        assert_eq!((raw.priority, raw.timeout_us), (Some(2), Some(300_000)));
        let sequence = raw.sequence.unwrap();
        assert_eq!(sequence.id, SequenceId::Text("cam-1".into()));
        assert!(sequence.start && !sequence.end);
        // Only what sheaf does not read reaches the model.
        let kept = raw.parameters.unwrap();
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["answer_in"]);
        let raw = request(call("")).unwrap();
        assert!(raw.sequence.is_none() && raw.parameters.is_none() && raw.priority.is_none());
    }

    #[test]
    fn a_model_s_request_with_misspelt_reserved_parameters_is_refused() {
        let refused = |text: &str| request(call(text)).unwrap_err();
        assert!(refused(r#"{"timeout": -1}"#).contains("'timeout' must be a non-negative integer"));
        assert!(refused(r#"{"sequence_start": true}"#).contains("need a sequence_id"));
        assert!(refused("[1]").contains("not a JSON object"));
    }
}
