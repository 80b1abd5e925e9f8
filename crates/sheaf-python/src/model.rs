//! The backend and one loaded instance: a model process, restarted when it is lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};

use sheaf_backend::{
    Answer, Backend, BackendError, Callback, CustomMetrics, DataType, Device, LoadSpec, Model,
    RequestInfo, ResponseStream, Signature, Tensor, TensorSpec,
};

use crate::answers::{read_answer, response_error};
use crate::batch_message::write_inputs;
use crate::environment::{Environment, PARAMETER};
use crate::processes::Processes;
use crate::worker::{Failure, Launch, Worker};

/// Loads `model.py` models, each instance in its own interpreter process.
#[derive(Debug, Clone, Default)]
pub struct PythonBackend {
    /// The server's `--python`: the interpreter of models that name none.
    pub interpreter: Option<PathBuf>,
    /// The way back into the server, for models that send requests of their own (BLS).
    pub callback: Callback,
    /// The metrics the models define (`pb_utils.MetricFamily`), shown at `/metrics`.
    pub metrics: CustomMetrics,
}

impl PythonBackend {
    pub fn new(interpreter: Option<PathBuf>, callback: Callback) -> PythonBackend {
        PythonBackend {
            interpreter,
            callback,
            metrics: CustomMetrics::default(),
        }
    }
}

/// Which of the two APIs `model.py` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `class TritonPythonModel`: requests in, one response each.
    Triton,
    /// `def infer(inputs)`: one assembled batch in, one out.
    Batched,
}

/// One instance of a Python model.
pub struct PythonModel {
    /// How its processes start, and the one starting again after a loss.
    processes: Arc<Processes>,
    /// None after the process was lost, until the one starting again is taken by the next
    /// batch.
    worker: Option<Worker>,
    signature: Arc<Signature>,
    api: Api,
    max_batch_size: usize,
    device: Device,
    /// Triton's decoupled mode: responses stream through `get_response_sender()`.
    decoupled: bool,
    /// The warm-up samples that ran at load (inputs, runs), run again on a process started
    /// again after a loss before its first batch.
    warmup: Vec<(Vec<Tensor>, usize)>,
}

impl Backend for PythonBackend {
    fn platform(&self) -> &'static str {
        "python"
    }

    fn model_file(&self) -> &'static str {
        "model.py"
    }

    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
        PythonModel::load(
            spec,
            self.interpreter.as_deref(),
            &self.callback,
            &self.metrics,
        )
        .map(|m| Box::new(m) as Box<dyn Model>)
    }

    fn custom_metrics(&self) -> Option<CustomMetrics> {
        Some(self.metrics.clone())
    }

    /// An interpreter with NumPy holds about this much before the model's own data; the
    /// process's real size is booked once it has loaded.
    fn estimate_memory(&self, _path: &Path) -> Option<u64> {
        Some(64 << 20)
    }
}

impl PythonModel {
    /// Starts the process for `spec.path` (`model.py`) and loads the model in it.
    pub fn load(
        spec: &LoadSpec,
        server_interpreter: Option<&Path>,
        callback: &Callback,
        metrics: &CustomMetrics,
    ) -> Result<PythonModel, BackendError> {
        // Absolute: the process runs in the model's folder, and a repository given relative to
        // the server's working directory must still be found.
        let model_file = std::path::absolute(&spec.path)
            .map_err(|e| BackendError::Load(format!("{}: {e}", spec.path.display())))?;
        let folder = model_file.parent().unwrap_or(Path::new("/"));
        // DIR/<name>/<version>/model.py, or DIR/<name>/model.py (version 1).
        let numbered = folder
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        let (model_dir, version) = match numbered {
            Some(v) => (folder.parent().unwrap_or(folder), v.to_string()),
            None => (folder, "1".to_string()),
        };
        let name = model_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut config: Value = match &spec.model_config {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| BackendError::Load(format!("the model's configuration: {e}")))?,
            None => json!({}),
        };
        config["name"] = json!(name);
        // The instance's index, from its thread's name (`sheaf-<model>@<device>-<i>`).
        let index = std::thread::current()
            .name()
            .and_then(|n| n.rsplit('-').next())
            .and_then(|i| i.parse::<usize>().ok())
            .unwrap_or(0);
        let (kind, device_id, device) = match spec.device {
            Device::Cuda(id) => ("GPU", id, format!("cuda:{id}")),
            Device::Cpu | Device::Sim => ("CPU", 0, "cpu".to_string()),
        };
        let args = json!({
            "model_name": name,
            "model_version": version,
            "model_repository": model_dir,
            "model_instance_kind": kind,
            "model_instance_name": format!("{name}_{index}"),
            "model_instance_device_id": device_id.to_string(),
        });
        let parameters: serde_json::Map<String, Value> = config
            .get("parameters")
            .and_then(Value::as_object)
            .map(|p| {
                p.iter()
                    .map(|(k, v)| {
                        let text = v.get("string_value").cloned().unwrap_or_else(|| v.clone());
                        (k.clone(), text)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let load_config = json!({
            "name": name,
            "version": version,
            "model_dir": model_dir,
            "device": device,
            "instance": index,
            "max_batch_size": config.get("max_batch_size").cloned().unwrap_or(json!(0)),
            "parameters": parameters,
            "inputs": config.get("input").cloned().unwrap_or(json!([])),
            "outputs": config.get("output").cloned().unwrap_or(json!([])),
        });
        // The model's own environment (Triton's EXECUTION_ENV_PATH), unless `python:` names
        // an interpreter: it comes before the server's.
        let environment = match (&spec.interpreter, parameters.get(PARAMETER)) {
            (None, Some(value)) => Some(Environment::open(
                value.as_str().unwrap_or_default(),
                model_dir,
            )?),
            _ => None,
        };
        let launch = Launch {
            interpreter: match &environment {
                Some(env) => env.python.clone(),
                None => crate::interpreter::resolve(
                    spec.interpreter.as_deref(),
                    server_interpreter,
                    model_dir,
                ),
            },
            environment,
            model_file: model_file.clone(),
            runner_dir: crate::interpreter::runner_dir()?.to_path_buf(),
            init: json!({
                "op": "init",
                "model_config": config,
                "args": args,
                "load_config": load_config,
                "auto_complete": spec.auto_complete,
                "max_batch_size_open": spec.max_batch_size_open,
            }),
            timeout: spec.execution_timeout,
            instance: format!("{name}_{index}"),
            callback: callback.clone(),
            metrics: metrics.clone(),
        };
        let processes = Processes::new(launch);
        let (worker, loaded) = processes.start()?;
        let launch = &processes.launch;
        let api = match loaded.get("api").and_then(Value::as_str) {
            Some("triton") => Api::Triton,
            _ => Api::Batched,
        };
        let max_batch_size = loaded
            .get("max_batch_size")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        let mut signature = Signature {
            inputs: specs(&loaded, "inputs")?,
            outputs: specs(&loaded, "outputs")?,
        };
        sequence_tensors(&config, max_batch_size > 0, &mut signature);
        if api == Api::Batched {
            ragged_tensors(&config, &mut signature);
        }
        tracing::info!(
            model = %name,
            instance = %launch.instance,
            pid = worker.pid(),
            interpreter = %launch.interpreter.display(),
            api = ?api,
            "Python model loaded"
        );
        Ok(PythonModel {
            processes: processes.clone(),
            worker: Some(worker),
            warmup: Vec::new(),
            signature: Arc::new(signature),
            api,
            max_batch_size,
            device: spec.device,
            decoupled: loaded
                .get("decoupled")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }

    /// Runs one message: `requests` written into shared memory, the answers read back, one
    /// result per request. A lost process fails the call and is started again at once, on a
    /// thread of its own, so that the failure is answered without waiting for the new process;
    /// the next call takes it when it is up.
    fn run(
        &mut self,
        op: &str,
        requests: &[&[Tensor]],
        infos: &[&RequestInfo],
    ) -> Result<Vec<Result<Answer, BackendError>>, BackendError> {
        let signature = Arc::clone(&self.signature);
        let message = write_inputs(self.worker()?, op, requests, infos, &signature)?;
        let answer = self.call(&message, None)?;
        let Some(worker) = self.worker.as_mut() else {
            return Err(BackendError::Runtime("no model process".into()));
        };
        worker.output.follow()?;
        let responses = answer
            .get("responses")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                BackendError::Runtime("the model process answered without responses".into())
            })?;
        Ok(responses
            .iter()
            .map(|r| match r.get("error") {
                Some(_) => Err(response_error(r)),
                // Triton's request rescheduling: the request runs again in a later batch.
                None if r.get("rescheduled").and_then(Value::as_bool) == Some(true) => {
                    Err(BackendError::Rescheduled)
                }
                None => read_answer(worker.output.bytes(), r, &self.signature),
            })
            .collect())
    }

    /// The running process: the one started again after a loss, once it is up, or a new one.
    fn worker(&mut self) -> Result<&mut Worker, BackendError> {
        if self.worker.as_mut().is_none_or(|w| !w.alive()) {
            self.worker = None;
            let started = match self.processes.take_started() {
                Some(started) => started,
                None => self.processes.start_here(),
            };
            let worker = started.map_err(|e| {
                BackendError::Runtime(format!(
                    "the model's Python process could not be started again: {e}"
                ))
            })?;
            tracing::info!(instance = %self.processes.launch.instance, pid = worker.pid(), "Python model process started again");
            self.worker = Some(worker);
            self.warm_again();
        }
        self.worker
            .as_mut()
            .ok_or_else(|| BackendError::Runtime("no model process".into()))
    }

    /// Runs the warm-up samples on a process started again, as they ran at load; one that
    /// fails is logged, and the batch waiting goes on (a lost process starts again with it).
    fn warm_again(&mut self) {
        // A streaming model's samples end with responses on threads of the process: they run
        // at load only.
        if self.warmup.is_empty() || self.decoupled {
            return;
        }
        let samples = std::mem::take(&mut self.warmup);
        let started = std::time::Instant::now();
        let failed = samples
            .iter()
            .flat_map(|(inputs, runs)| std::iter::repeat_n(inputs, *runs))
            .find_map(|inputs| self.infer(inputs).err());
        match failed {
            Some(e) => {
                tracing::warn!(instance = %self.processes.launch.instance, error = %e, "a warm-up sample failed on the process started again")
            }
            None => {
                tracing::info!(instance = %self.processes.launch.instance, samples = samples.len(), ms = started.elapsed().as_millis() as u64, "warm-up samples ran again")
            }
        }
        self.warmup = samples;
    }

    /// Sends `message` to the process and waits for its answer (up to `timeout`, else the
    /// model's execution timeout); a lost process is started again.
    fn call(
        &mut self,
        message: &impl Serialize,
        timeout: Option<Option<std::time::Duration>>,
    ) -> Result<Value, BackendError> {
        let worker = self.worker()?;
        match worker.call(message, timeout) {
            Ok(answer) => Ok(answer),
            Err(Failure::Raised(m)) => Err(BackendError::Runtime(m)),
            // Its process has already begun to start again (`Processes`).
            Err(lost @ Failure::Lost(_)) => {
                self.worker = None;
                Err(lost.into_backend())
            }
        }
    }
}

impl Drop for PythonModel {
    /// No process starts again once the model goes; one still starting is waited for, so that
    /// it ends with the model.
    fn drop(&mut self) {
        self.processes.end();
    }
}

impl Model for PythonModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let op = match self.api {
            Api::Batched => "infer",
            Api::Triton => "execute",
        };
        self.run(op, &[inputs], &[])?
            .pop()
            .unwrap_or_else(|| Err(BackendError::Runtime("the model gave no answer".into())))
            .map(|answer| answer.outputs)
    }

    fn answers_requests(&self) -> bool {
        self.api == Api::Triton
    }

    fn ready_check(&self) -> Option<Arc<dyn sheaf_backend::ReadyCheck>> {
        Some(self.processes.watch.clone())
    }

    fn keep_warmup(&mut self, samples: Vec<(Vec<Tensor>, usize)>) {
        self.warmup = samples;
    }

    fn infer_requests(
        &mut self,
        requests: &[Vec<Tensor>],
        infos: &[&RequestInfo],
    ) -> Vec<Result<Answer, BackendError>> {
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        match self.run("execute", &refs, infos) {
            Ok(answers) if answers.len() == requests.len() => answers,
            Ok(answers) => requests
                .iter()
                .map(|_| {
                    Err(BackendError::Runtime(format!(
                        "the model answered {} of {} requests",
                        answers.len(),
                        requests.len()
                    )))
                })
                .collect(),
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// What the manager books the instance at on its device: on a GPU, the device memory the
    /// process holds there (its resident memory where the driver lists none); elsewhere, its
    /// resident memory.
    fn memory_bytes(&self) -> Option<u64> {
        let worker = self.worker.as_ref()?;
        match self.device {
            Device::Cuda(_) => worker.gpu_bytes().or_else(|| worker.resident_bytes()),
            _ => worker.resident_bytes(),
        }
    }

    fn streams(&self) -> bool {
        self.decoupled
    }

    /// Sends the batch to the model's `execute` and returns once it has returned: the requests
    /// go on streaming from the model's own threads while the next batch runs.
    fn infer_streaming(
        &mut self,
        requests: &[Vec<Tensor>],
        infos: &[&RequestInfo],
        streams: Vec<Box<dyn ResponseStream>>,
    ) -> Result<(), BackendError> {
        let refs: Vec<&[Tensor]> = requests.iter().map(Vec::as_slice).collect();
        let signature = Arc::clone(&self.signature);
        let worker = match self.worker() {
            Ok(w) => w,
            Err(e) => {
                streams.into_iter().for_each(|s| s.end(Err(e.clone())));
                return Err(e);
            }
        };
        let (call, slots) = worker.open_streams(streams, Arc::clone(&signature))?;
        let mut message = match write_inputs(worker, "execute", &refs, infos, &signature) {
            Ok(m) => m,
            Err(e) => {
                worker.fail_streams(call, &e);
                return Err(e);
            }
        };
        message.streaming(call, slots);
        // No timeout on the call itself: a model may stream from `execute` for as long as it
        // keeps sending, and the link thread finds one that stops (`worker::open`).
        let called = self.call(&message, Some(None));
        match (&called, self.worker.as_ref()) {
            (Ok(_), Some(worker)) => worker.returned(call),
            (Err(e), Some(worker)) => worker.fail_streams(call, e),
            _ => {}
        }
        called.map(|_| ())
    }

    fn declared_max_batch_size(&self) -> Option<usize> {
        Some(self.max_batch_size)
    }

    fn warms_up_on_zeros(&self) -> bool {
        false
    }
}

/// The declared tensors `init` answered, as tensor specs.
/// A stateful model's control inputs and states, which Triton's configuration names in
/// `sequence_batching` rather than in `input` and `output`: the model gets them as inputs (and
/// gives its states as outputs) beside its declared tensors.
fn sequence_tensors(config: &Value, batching: bool, signature: &mut Signature) {
    let Some(seq) = config.get("sequence_batching") else {
        return;
    };
    // Triton's configuration names byte strings TYPE_STRING.
    let dtype = |t: Option<&Value>| match t.and_then(Value::as_str)? {
        "TYPE_STRING" => Some(DataType::Bytes),
        t => DataType::parse_any(t.strip_prefix("TYPE_").unwrap_or(t)),
    };
    let per_item = |dims: Vec<i64>| -> Vec<i64> {
        let mut shape = if dims.is_empty() { vec![1] } else { dims };
        if batching {
            shape.insert(0, -1);
        }
        shape
    };
    let add = |specs: &mut Vec<TensorSpec>, name: &str, dtype: DataType, dims: Vec<i64>| {
        if !name.is_empty() && !specs.iter().any(|s| s.name == name) {
            specs.push(TensorSpec {
                name: name.to_string(),
                dtype,
                shape: per_item(dims),
            });
        }
    };
    for input in list(seq.get("control_input")) {
        let name = input
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for control in list(input.get("control")) {
            let kind = control
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let dtype = dtype(control.get("data_type")).unwrap_or(
                if control.get("int32_false_true").is_some() {
                    DataType::I32
                } else if control.get("bool_false_true").is_some() {
                    DataType::Bool
                } else if kind == "CONTROL_SEQUENCE_CORRID" {
                    DataType::U64
                } else {
                    DataType::F32
                },
            );
            add(&mut signature.inputs, name, dtype, Vec::new());
        }
    }
    for state in list(seq.get("state")) {
        let Some(dtype) = dtype(state.get("data_type")) else {
            continue;
        };
        let dims: Vec<i64> = list(state.get("dims"))
            .iter()
            .filter_map(Value::as_i64)
            .collect();
        let name = |key: &str| {
            state
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        add(
            &mut signature.inputs,
            &name("input_name"),
            dtype,
            dims.clone(),
        );
        add(&mut signature.outputs, &name("output_name"), dtype, dims);
    }
}

/// Ragged batching under the batched API (`allow_ragged_batch`, `batch_input`,
/// `batch_output`): `infer` takes the batch as the server assembles it for a model of one tensor
/// per input (see `sheaf_core::ragged`). A ragged input comes in one dimension, every request's
/// elements in a row; each `target_name` of a batch input is one more input, `[requests]` (or
/// `[requests + 1]`, `[most elements]`) by its kind, `[items, rank]` for `BATCH_ITEM_SHAPE`; a
/// scattered output is given in one dimension, a value for each element of its source input.
/// What does not fit is refused at load by the server, with the reason.
fn ragged_tensors(config: &Value, signature: &mut Signature) {
    let words = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let flat = |specs: &mut Vec<TensorSpec>, name: &str| {
        if let Some(spec) = specs.iter_mut().find(|s| s.name == name) {
            spec.shape = vec![-1];
        }
    };
    for input in list(config.get("input")) {
        if input.get("allow_ragged_batch").and_then(Value::as_bool) == Some(true) {
            let name = input
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            flat(&mut signature.inputs, name);
        }
    }
    for batch_input in list(config.get("batch_input")) {
        let word = batch_input
            .get("data_type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        // A type that is no batch input's is refused by name when the server resolves them.
        let dtype = DataType::parse_any(word.strip_prefix("TYPE_").unwrap_or(word))
            .unwrap_or(DataType::F32);
        let shape = match batch_input.get("kind").and_then(Value::as_str) {
            Some("BATCH_ITEM_SHAPE") => vec![-1, -1],
            _ => vec![-1],
        };
        for name in words(batch_input.get("target_name")) {
            if !signature.inputs.iter().any(|s| s.name == name) {
                signature.inputs.push(TensorSpec {
                    name,
                    dtype,
                    shape: shape.clone(),
                });
            }
        }
    }
    for batch_output in list(config.get("batch_output")) {
        for name in words(batch_output.get("target_name")) {
            flat(&mut signature.outputs, &name);
        }
    }
}

/// A list in the configuration's JSON; empty where there is none.
fn list(v: Option<&Value>) -> Vec<Value> {
    v.and_then(Value::as_array).cloned().unwrap_or_default()
}

fn specs(loaded: &Value, key: &str) -> Result<Vec<TensorSpec>, BackendError> {
    list(loaded.get(key))
        .iter()
        .map(|t| {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let datatype = t
                .get("datatype")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let dtype = DataType::parse_any(datatype).ok_or_else(|| {
                BackendError::Load(format!(
                    "{} '{name}' is {datatype}, which is not a tensor type sheaf serves",
                    &key[..key.len() - 1]
                ))
            })?;
            let shape = t
                .get("shape")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            Ok(TensorSpec { name, dtype, shape })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batched_model_takes_ragged_inputs_flat_with_the_batch_inputs_beside_them() {
        let config = json!({
            "input": [
                {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 2], "allow_ragged_batch": true},
                {"name": "k", "data_type": "TYPE_INT32", "dims": [1]},
            ],
            "batch_input": [
                {"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "target_name": ["offsets"],
                 "data_type": "TYPE_INT64", "source_input": ["x"]},
                {"kind": "BATCH_ITEM_SHAPE", "target_name": ["shapes", "again"],
                 "data_type": "TYPE_INT32", "source_input": ["x"]},
            ],
            "batch_output": [
                {"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["y"],
                 "source_input": ["x"]},
            ],
        });
        let mut signature = Signature {
            inputs: vec![
                TensorSpec::new("x", DataType::F32, &[-1, -1, 2]),
                TensorSpec::new("k", DataType::I32, &[-1, 1]),
            ],
            outputs: vec![
                TensorSpec::new("y", DataType::F32, &[-1, -1, 2]),
                TensorSpec::new("n", DataType::I64, &[-1, 1]),
            ],
        };
        ragged_tensors(&config, &mut signature);
        assert_eq!(
            signature.inputs,
            vec![
                TensorSpec::new("x", DataType::F32, &[-1]),
                TensorSpec::new("k", DataType::I32, &[-1, 1]),
                TensorSpec::new("offsets", DataType::I64, &[-1]),
                TensorSpec::new("shapes", DataType::I32, &[-1, -1]),
                TensorSpec::new("again", DataType::I32, &[-1, -1]),
            ]
        );
        assert_eq!(
            signature.outputs,
            vec![
                TensorSpec::new("y", DataType::F32, &[-1]),
                TensorSpec::new("n", DataType::I64, &[-1, 1]),
            ]
        );
        // Without ragged batching, nothing changes.
        let before = signature.clone();
        ragged_tensors(&json!({"input": [{"name": "k"}]}), &mut signature);
        assert_eq!(signature, before);
    }
}
