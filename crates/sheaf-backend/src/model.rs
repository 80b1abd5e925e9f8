//! The synchronous model trait and the signature every backend reports.

use crate::{BackendError, DataType, Tensor};

/// One named input or output: element type and shape, with `-1` for a dynamic dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DataType,
    pub shape: Vec<i64>,
}

impl TensorSpec {
    pub fn new(name: &str, dtype: DataType, shape: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
        }
    }
}

/// What a model that sees its requests one by one (Triton's `execute(requests)`) knows of a
/// request besides its tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// The id the client gave it; empty for none (`request.request_id()`).
    pub id: String,
    /// The sequence it belongs to, for a stateful model (`request.correlation_id()`).
    pub correlation_id: Option<CorrelationId>,
    /// The outputs the client asked for, by name; empty when it asked for every output
    /// (`request.requested_output_names()`).
    pub requested_outputs: Vec<String>,
    /// The client's other request parameters, as a JSON object; empty for none
    /// (`request.parameters()`).
    pub parameters: String,
    /// Triton's request flags: [`RequestInfo::SEQUENCE_START`] and
    /// [`RequestInfo::SEQUENCE_END`] (`request.flags()`).
    pub flags: u32,
    /// The optional inputs (Triton's `optional: true`) the request left out, by name: their
    /// tensors are empty stand-ins, which the model is not given
    /// (`pb_utils.get_input_tensor_by_name` answers `None`).
    pub absent: Vec<String>,
    /// While requests are traced: where the accounts of the requests the model sends on this
    /// one's behalf go (see [`crate::caller`]); a backend passes it on to those calls
    /// ([`crate::Call::calls`]).
    pub calls: Option<crate::TraceCalls>,
}

impl RequestInfo {
    /// A request the client said nothing more of.
    pub const NONE: RequestInfo = RequestInfo {
        id: String::new(),
        correlation_id: None,
        requested_outputs: Vec::new(),
        parameters: String::new(),
        flags: 0,
        absent: Vec::new(),
        calls: None,
    };

    /// The request starts its sequence (Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`).
    pub const SEQUENCE_START: u32 = 1;
    /// The request ends its sequence (`TRITONSERVER_REQUEST_FLAG_SEQUENCE_END`).
    pub const SEQUENCE_END: u32 = 2;
}

/// A sequence's correlation id as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorrelationId {
    Number(u64),
    Text(String),
}

/// A model's inputs and outputs, in the order `Model::infer` takes and returns them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// True when every input and output has a dynamic first dimension, so that requests can be
    /// stacked along it.
    pub fn has_batch_dim(&self) -> bool {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .all(|s| s.shape.first() == Some(&-1))
    }
}

/// One request's answer from [`Model::infer_requests`], or one response of
/// [`Model::infer_streaming`]: its outputs in signature order, and the parameters the model put
/// in it (Triton's `InferenceResponse(parameters=...)`), which the protocols pass on to the
/// client.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub outputs: Vec<Tensor>,
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

impl From<Vec<Tensor>> for Answer {
    fn from(outputs: Vec<Tensor>) -> Answer {
        Answer {
            outputs,
            parameters: None,
        }
    }
}

/// Where the responses of one request to a streaming model go ([`Model::infer_streaming`]),
/// from whichever thread the model answers on, for as long as the request streams.
pub trait ResponseStream: Send {
    /// One response, as it comes.
    fn part(&mut self, response: Result<Answer, BackendError>);
    /// Ends the stream: after the model's final flag, or with the error that cut it short.
    fn end(self: Box<Self>, result: Result<(), BackendError>);
    /// Whether the request's client has gone, so that the model may stop early (Triton's
    /// `is_cancelled()`).
    fn is_cancelled(&self) -> bool;
    /// The model asks for the request to run again in a later batch, its responses so far
    /// sent (Triton's request rescheduling, for iterative sequences): this stream ends without
    /// ending the request, which the batch that carries it next answers through a stream of
    /// its own. Default: the request fails, as a server that cannot run it again says.
    fn reschedule(self: Box<Self>) {
        self.end(Err(crate::BackendError::Runtime(
            "the model asked for the request to run again, and this server cannot".into(),
        )))
    }
}

/// An instance's own word on whether it can serve now, asked from any thread whenever a client
/// asks whether its model is ready (KServe's model readiness, and the server's under strict
/// readiness), while the instance's thread may be running a batch. `Err` says why not. A check
/// blocks for as long as the instance takes to answer, within a bound of its own.
pub trait ReadyCheck: Send + Sync {
    fn check(&self) -> Result<(), String>;
}

/// A loaded model instance. One OS thread owns it and calls `infer` for one batch at a time,
/// which is why it takes `&mut self` and need not be `Sync`.
pub trait Model: Send {
    /// The signature read from the model.
    fn signature(&self) -> &Signature;

    /// Runs one batch. `inputs` follow `signature().inputs` in order; the result follows
    /// `signature().outputs`.
    fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError>;

    /// Device memory this instance holds, in bytes, when the backend knows or can estimate it.
    fn memory_bytes(&self) -> Option<u64> {
        None
    }

    /// Called once the batch sizes the instance will run are settled (after a probe, which may
    /// run other sizes): what the instance holds for other sizes can go.
    fn keep_batch_sizes(&mut self, _sizes: &[usize]) {}

    /// Called once the configuration's warm-up samples have run on the instance, with each
    /// sample's inputs and how many runs it takes: a model that may start its runtime again
    /// after losing it (a Python process) keeps them to run them again first. Others drop them.
    fn keep_warmup(&mut self, _samples: Vec<(Vec<Tensor>, usize)>) {}

    /// Runs `inputs` once and then hands back to the device the memory the instance's
    /// allocator holds that no run is using; returns whether it did. Called after the first
    /// warm-up pass (and the `auto` probe before it): an arena that only grows keeps a region
    /// for every size and every first run it was asked for, where the sizes that stay, run
    /// again largest first, need about the largest's planned run alone. Default: nothing held,
    /// nothing run.
    fn release_memory(&mut self, _inputs: &[Tensor]) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Whether the instance copies a batch's pieces into input buffers of its own
    /// ([`Model::stage`]), so that the scheduler hands it the requests' tensors unassembled and
    /// each request's bytes are copied once, straight into their rows.
    fn stages_inputs(&self) -> bool {
        false
    }

    /// Copies a batch into the instance's own input buffers: per input, the requests' tensors
    /// in order, then zero rows up to `items`. [`Model::infer_staged`] runs it. `Ok(false)`: the
    /// instance keeps no buffers for this batch; the caller assembles it and calls
    /// [`Model::infer`].
    fn stage(&mut self, _pieces: &[Vec<Tensor>], _items: usize) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Runs the batch that [`Model::stage`] copied in.
    fn infer_staged(&mut self) -> Result<Vec<Tensor>, BackendError> {
        Err(BackendError::Runtime("no batch was staged".into()))
    }

    /// Whether the instance takes a batch as the requests it holds, each answered on its own
    /// ([`Model::infer_requests`]: Triton's `execute(requests)`), rather than as one tensor per
    /// input whose rows the scheduler slices back.
    fn answers_requests(&self) -> bool {
        false
    }

    /// Runs a batch of requests, each given as its tensors in signature order (and what else
    /// is known of it in `infos`, one per request, or none), and answers each on its own: one
    /// request's error fails that request alone. Called only when [`Model::answers_requests`].
    fn infer_requests(
        &mut self,
        requests: &[Vec<Tensor>],
        _infos: &[&RequestInfo],
    ) -> Vec<Result<Answer, BackendError>> {
        requests
            .iter()
            .map(|_| {
                Err(BackendError::Runtime(
                    "this model takes assembled batches".into(),
                ))
            })
            .collect()
    }

    /// Whether the model answers a request with any number of responses (Triton's decoupled
    /// models, `model_transaction_policy { decoupled: true }`), through
    /// [`Model::infer_streaming`].
    fn streams(&self) -> bool {
        false
    }

    /// Runs a batch of requests, each with a stream of its own (`streams[i]` for request `i`),
    /// that takes its responses as they come and ends with [`ResponseStream::end`]. A stream
    /// may outlive the call: the call returns once the model is ready for its next batch
    /// (Triton's decoupled `execute` has returned), while earlier requests still stream. A
    /// stream dropped without its end fails its request. Called only when [`Model::streams`].
    fn infer_streaming(
        &mut self,
        _requests: &[Vec<Tensor>],
        _infos: &[&RequestInfo],
        streams: Vec<Box<dyn ResponseStream>>,
    ) -> Result<(), BackendError> {
        let error = BackendError::Runtime("this model does not stream".into());
        for stream in streams {
            stream.end(Err(error.clone()));
        }
        Err(error)
    }

    /// The largest batch the model itself declares (Triton's `max_batch_size`, as a Python
    /// model's configuration or `auto_complete_config` sets it), used when the server's
    /// configuration sets none; 0: the model does not batch.
    fn declared_max_batch_size(&self) -> Option<usize> {
        None
    }

    /// How the instance says whether it can serve now, beyond having loaded ([`ReadyCheck`]):
    /// a Python model's process that is being started again after it was lost, or the
    /// model's own `is_ready()`. Taken once, when the instance has loaded. None: loaded is
    /// ready.
    fn ready_check(&self) -> Option<std::sync::Arc<dyn ReadyCheck>> {
        None
    }

    /// Whether warm-up may run the model on batches of zeros. A model whose code is the user's
    /// (Python) may not take zeros for an answer, so it is not warmed with them.
    fn warms_up_on_zeros(&self) -> bool {
        true
    }
}

/// Where an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU.
    #[default]
    Cpu,
    /// An NVIDIA GPU, by CUDA device id.
    Cuda(i32),
    /// A simulated device (a sim model's latency is its own; the device is an execution lane).
    Sim,
}

/// What a backend needs to load one model instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadSpec {
    /// The model file.
    pub path: std::path::PathBuf,
    /// Threads the runtime may use inside one operator, for this instance.
    pub intra_op_threads: usize,
    pub device: Device,
    /// One runtime session per batch size, so that no session ever sees its input shape change
    /// (a shape change costs GPU runtimes dearly: they re-plan memory and kernels per shape).
    pub session_per_batch_size: bool,
    /// With `session_per_batch_size`: each session's inputs and outputs bound to buffers the
    /// instance keeps (pinned host memory on a GPU), into which requests are copied straight
    /// from their own bytes, and no tensor memory allocated per batch. `None`: the backend
    /// decides by the size of the model's items (see the ONNX backend's `staged` module).
    pub io_binding: Option<bool>,
    /// Options for a CUDA device (ignored elsewhere).
    pub cuda: CudaOptions,
    /// How the runtime plans the graph: its optimizations, and threads across operators.
    pub graph: GraphOptions,
    /// The model's configuration in Triton's JSON form (`args['model_config']`), for backends
    /// that hand it to the model's own code (Python).
    pub model_config: Option<String>,
    /// The interpreter the model's configuration names (`python:`), for the Python backend.
    pub interpreter: Option<std::path::PathBuf>,
    /// Whether the model's own code may complete its configuration (Triton's auto-complete:
    /// a Python model's `auto_complete_config` is called only then).
    pub auto_complete: bool,
    /// Whether `max_batch_size` in `model_config` is the server's choice rather than a number
    /// the configuration gives (a `config.yaml` without it, or with `auto`): a Python model's
    /// `auto_complete_config` may then set its own.
    pub max_batch_size_open: bool,
    /// Longest one backend call may run; past it the instance counts as hung (the Python
    /// backend kills and restarts its process). None: no limit.
    pub execution_timeout: Option<std::time::Duration>,
}

/// How a runtime plans and runs a model's graph (ONNX Runtime's session options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphOptions {
    /// Which graph optimizations run at load.
    pub optimization: GraphOptimization,
    /// Threads that run independent operators at once; used with `parallel`.
    pub inter_op_threads: usize,
    /// Whether independent operators run at once (else one after the other).
    pub parallel: bool,
}

impl Default for GraphOptions {
    /// Every optimization, operators one after the other.
    fn default() -> Self {
        GraphOptions {
            optimization: GraphOptimization::All,
            inter_op_threads: 1,
            parallel: false,
        }
    }
}

/// ONNX Runtime's graph optimization levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphOptimization {
    /// None: the graph runs as written.
    Disabled,
    /// Semantics-preserving rewrites that need no particular provider (constant folding,
    /// redundant nodes removed).
    Basic,
    /// Basic, and fusions of node groups into one kernel.
    Extended,
    /// Extended, and layout changes for the device.
    #[default]
    All,
}

/// How a runtime uses a CUDA device, as the ONNX Runtime CUDA provider names its options.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CudaOptions {
    /// Most bytes the runtime's device memory arena may hold; none: no limit.
    pub memory_limit_bytes: Option<u64>,
    /// How the arena grows when it is full.
    pub arena_extend_strategy: ArenaExtendStrategy,
    /// How cuDNN picks a convolution algorithm.
    pub conv_algo_search: ConvAlgoSearch,
    /// Whether float32 matrix products and convolutions may use TF32 tensor cores (faster, about
    /// 1e-3 relative error).
    pub tf32: bool,
}

/// How a device memory arena grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArenaExtendStrategy {
    /// By doubling chunks: few allocations, more memory held.
    #[default]
    NextPowerOfTwo,
    /// By what was asked for: memory held stays close to what is used.
    SameAsRequested,
}

/// How cuDNN chooses a convolution algorithm, once per input shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvAlgoSearch {
    /// Time every algorithm: slow first run, fastest kernels.
    #[default]
    Exhaustive,
    /// cuDNN's heuristics: quick, usually close.
    Heuristic,
    /// The default algorithm, no search: least memory.
    Default,
}

/// A kind of model runtime (ONNX Runtime, a simulated device, ...). Loading is blocking and runs
/// on the instance's own thread.
pub trait Backend: Send + Sync {
    /// The platform name reported in model metadata, as Triton names it (`onnxruntime_onnx`).
    fn platform(&self) -> &'static str;

    /// The file name a model folder holds for this backend (`model.onnx`); `*.gguf`: any file
    /// with that ending (the first by name).
    fn model_file(&self) -> &'static str;

    /// Loads one instance of the model described by `spec`.
    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError>;

    /// Whether this backend's models generate text ([`Backend::load_generator`]) rather than
    /// map tensors to tensors ([`Backend::load`]).
    fn generates(&self) -> bool {
        false
    }

    /// Loads the generation engine of the model at `spec.path` on `spec.device`.
    fn load_generator(
        &self,
        _spec: &LoadSpec,
        _generation: &crate::generation::GenerationSpec,
    ) -> Result<std::sync::Arc<dyn crate::generation::Generator>, BackendError> {
        Err(BackendError::Load(format!(
            "{} serves tensor models, not generation models",
            self.platform()
        )))
    }

    /// Memory one instance of the model at `path` will hold, in bytes, estimated before loading.
    fn estimate_memory(&self, path: &std::path::Path) -> Option<u64> {
        std::fs::metadata(path).ok().map(|m| m.len())
    }

    /// The metrics this backend's models define themselves, which the server's `/metrics`
    /// shows beside its own; none for a backend whose models cannot.
    fn custom_metrics(&self) -> Option<crate::CustomMetrics> {
        None
    }
}
