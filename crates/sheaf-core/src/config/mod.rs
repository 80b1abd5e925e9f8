//! Per-model configuration: `<repository>/<model>/config.yaml`.
//!
//! Every key is optional, so a folder holding a bare `model.onnx` serves with the defaults below.
//! Unknown keys are an error, so that a typo does not silently fall back to a default.

use serde::Deserialize;

mod batching;
mod cuda;
mod embedding;
mod images;
mod versions;

pub use batching::{
    AutoWord, BatchingConfig, LevelQueuePolicy, MaxBatchSize, PaddingConfig, PolicyKind,
    TimeoutActionConfig, AUTO_LIMIT, DEFAULT_MAX_BATCH_SIZE,
};
pub use cuda::{ArenaExtendConfig, ConvAlgoSearchConfig, CudaConfig, GraphOptimizationConfig};
pub use embedding::{EmbeddingConfig, PoolingConfig};
pub use images::{
    ColorOrder, FramesConfig, ImageFormatConfig, ImageInputConfig, ImageOutputConfig, Layout,
};
pub use versions::VersionPolicy;

/// Most execution instances of one model on one device: each is a thread holding its own copy
/// of the model, and more than this would run out of threads or memory before serving.
pub const MAX_INSTANCES: usize = 1024;

/// Most threads one instance's runtime may be asked for (`intra_op_threads`,
/// `inter_op_threads`).
pub const MAX_RUNTIME_THREADS: usize = 1024;

/// Most batches in flight per instance (`pipeline_depth`).
pub const MAX_PIPELINE_DEPTH: usize = 64;

/// Most priority levels (`priority_levels`): the queue keeps room for each.
pub const MAX_PRIORITY_LEVELS: usize = 65_536;

/// Most items a queue may hold (`max_queue_size`, and each level's).
pub const MAX_QUEUE_SIZE: usize = 1 << 40;

/// The keys of a model's `config.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Most items (dimension 0) in one backend call. Absent: `default_max_batch_size` when the
    /// model has a dynamic first dimension, else 0. 0 turns batching off: each request runs
    /// alone, with its shape exactly as the model declares it. `auto`: probe at load (up to
    /// [`AUTO_LIMIT`]) and take the smallest size past which throughput gains less than 5%.
    pub max_batch_size: Option<MaxBatchSize>,
    /// Batch sizes the model may run, e.g. `[1, 4, 8]`: a batch is padded with zero rows up to
    /// the next one, and the padding is sliced off the outputs. Empty: any size, or with
    /// `session_per_batch_size`, the powers of two below `max_batch_size` and `max_batch_size`.
    pub allowed_batch_sizes: Vec<usize>,
    /// One ONNX Runtime session per allowed batch size, each warmed at load, so that no session
    /// sees its input shape change: on a GPU a shape change between calls costs most of the
    /// throughput. Absent: on for CUDA devices, off for the CPU.
    pub session_per_batch_size: Option<bool>,
    /// With sessions per batch size: bind each session's inputs and outputs to buffers the
    /// instance keeps (pinned host memory on a GPU, so one DMA moves a batch), copy requests
    /// into them straight from their own bytes, and allocate no tensor memory per batch.
    /// Absent: on for CUDA devices, off for the CPU.
    pub io_binding: Option<bool>,
    /// How ONNX Runtime uses a CUDA device (ignored on the CPU).
    pub cuda: CudaConfig,
    /// Run one batch of each size that will be used before the model reports ready.
    pub warmup: bool,
    /// Requests each instance runs before the model reports ready (Triton's `model_warmup`):
    /// see [`crate::warmup`]. They run whatever `warmup` says.
    pub model_warmup: Vec<crate::warmup::WarmupSample>,
    /// Memory, in MiB, the model holds per device, for the memory ledger. Absent: what the
    /// backend estimates (a sim model's declared memory, an ONNX file's size).
    pub memory_mb: Option<u64>,
    /// Load at start in the `explicit` and `on_demand` control modes (in `none`, every model
    /// loads at start).
    pub preload: bool,
    /// The device the model loads on, by name (`cuda:1`, `cpu`, `sim:a`). Absent: the server's
    /// `assignment_strategy` decides.
    pub preferred_device: Option<String>,
    /// Variable-length inputs: requests whose dynamic non-batch dimensions differ share a batch,
    /// padded to the longest. Absent: only requests of equal shape share a batch (for an
    /// `embedding` model: [`PaddingConfig::for_embeddings`]).
    pub padding: Option<PaddingConfig>,
    /// The model is a text encoder: it is served on the embeddings routes, which tokenise the
    /// text and pool the encoder's token states into one vector per input.
    pub embedding: Option<EmbeddingConfig>,
    /// Longest time, in microseconds, the oldest queued request waits for a batch to fill while
    /// an execution instance is free.
    pub max_queue_delay_us: u64,
    /// Batch sizes worth dispatching at once, without waiting out `max_queue_delay_us`.
    pub preferred_batch_sizes: Vec<usize>,
    /// ONNX Runtime intra-op threads per execution instance.
    pub intra_op_threads: usize,
    /// ONNX Runtime's graph optimizations at load: `all` (the default), `extended`, `basic` or
    /// `disabled` (the graph runs as written).
    pub graph_optimization: GraphOptimizationConfig,
    /// Threads ONNX Runtime runs independent operators on at once, with `parallel_execution`.
    pub inter_op_threads: usize,
    /// Whether ONNX Runtime runs independent operators at once (else one after the other).
    pub parallel_execution: bool,
    /// Most items that may wait in this model's queue; a request that does not fit is refused
    /// at once with 503 (overload), never queued without bound.
    pub max_queue_size: usize,
    /// Batches in flight per execution instance: one running while the next is assembled.
    pub pipeline_depth: usize,
    /// Execution instances per device, each a thread with its own loaded copy of the model.
    pub instances: usize,
    /// CPU cores per instance, one entry per instance (`["2", "3"]`, or lists such as
    /// `"4-7"`): instance `i` on every device runs on the cores of entry `i`, and so do the
    /// threads and processes it starts (ONNX Runtime's intra-op threads, a Python model's
    /// process). Empty: instances run wherever the OS puts them. See `sheaf serve --io-cpus`
    /// to keep the protocol threads off those cores.
    pub instance_cpus: Vec<sheaf_backend::affinity::CpuList>,
    /// How batches are formed.
    pub batching: BatchingConfig,
    /// Priority levels. A request's `priority` parameter picks one: 1 is the highest, and 0 or
    /// none means `default_priority_level`.
    pub priority_levels: usize,
    /// Level of requests that name no priority (default: the lowest, `priority_levels`).
    pub default_priority_level: Option<usize>,
    /// Timeout, in microseconds, of requests that give no `timeout` parameter; 0 means none.
    pub default_timeout_us: u64,
    /// What happens to a request whose timeout passes while it is queued.
    pub timeout_action: TimeoutActionConfig,
    /// Whether a request's own `timeout` counts (Triton's `allow_timeout_override`): `false`
    /// ignores it, `true` lets it shorten `default_timeout_us` (never lengthen it; with no
    /// default, any timeout counts). Unset: a request's timeout replaces the default.
    pub allow_timeout_override: Option<bool>,
    /// Per priority level (1 first), what its requests get instead of the model's default
    /// queue policy (Triton's `priority_queue_policy`): their timeout action, default timeout
    /// and a bound on the items of that level in the queue.
    pub priority_queue_policy: std::collections::BTreeMap<usize, LevelQueuePolicy>,
    /// A generation model's engine sizes (ignored by tensor models).
    pub generation: sheaf_backend::generation::GenerationSpec,
    /// Inputs the model is declared to take (Triton's `input`): checked against the model's
    /// own signature at load. Empty: not checked.
    pub inputs: Vec<DeclaredTensor>,
    /// Outputs the model is declared to give (Triton's `output`), checked likewise.
    pub outputs: Vec<DeclaredTensor>,
    /// Inputs the server makes for each batch of ragged inputs (Triton's `batch_input`). See
    /// [`crate::ragged`].
    pub batch_inputs: Vec<crate::ragged::BatchInput>,
    /// Outputs given over a ragged input's elements, each request's part in the shape it sent
    /// that input in (Triton's `batch_output`).
    pub batch_outputs: Vec<crate::ragged::BatchOutput>,
    /// Inputs that take encoded images (JPEG, PNG, WebP) as BYTES, by input name: each is
    /// decoded, resized, cropped and normalised into the model's tensor before the queue.
    pub image_inputs: std::collections::BTreeMap<String, ImageInputConfig>,
    /// Outputs returned as encoded images (BYTES), by output name.
    pub image_outputs: std::collections::BTreeMap<String, ImageOutputConfig>,
    /// The class names of the classification extension, one per line, beside the model file
    /// or in the model folder. Absent file: classes are named by index only.
    pub labels: String,
    /// Frames held by the server, which requests name by id instead of sending them (see
    /// `crate::frames`).
    pub frames: Option<FramesConfig>,
    /// A Python model's interpreter (a path, or a name on PATH). Absent: the server's
    /// `--python`, else the `.venv` above the server or the working directory, else `python3`.
    pub python: Option<String>,
    /// Longest one batch may run in a Python model's process, in milliseconds; past it the
    /// process counts as hung: its requests fail, and it is killed and started again. 0: none.
    pub execution_timeout_ms: u64,
    /// Named strings handed to a Python model (Triton's `parameters`): in `args['model_config']`
    /// of a Triton-style model, and in the dictionary `load(config)` gets.
    pub parameters: std::collections::BTreeMap<String, String>,
    /// Answers repeated requests from the server's response cache (`--cache-size`), without
    /// running the model. See [`crate::cache`].
    pub response_cache: bool,
    /// The model is stateful: its requests belong to sequences (`sequence_id`), each kept on
    /// one instance, with control inputs and implicit state filled by the server. See
    /// [`crate::sequence`].
    pub sequence_batching: Option<crate::sequence::SequenceConfig>,
    /// A model may ask for a request to run again in a later batch (Triton's
    /// `sequence_batching { iterative_sequence: true }` and request rescheduling): each request
    /// is its own sequence, batched with the others at every step, so a finished one leaves
    /// room for a new one (continuous batching). Python models in Triton's API.
    pub iterative_sequence: bool,
    /// Which of the model's version folders serve (Triton's `version_policy`); absent: the
    /// newest. Every version the policy names serves; a request without a version goes to the
    /// newest of them.
    pub version_policy: Option<VersionPolicy>,
    /// The resources each instance takes while it runs a batch, under the server's
    /// `--rate-limit execution_count` (Triton's `rate_limiter` of an `instance_group`); see
    /// [`crate::rate_limit`]. Ignored when rate limiting is off.
    pub rate_limiter: Option<crate::rate_limit::RateLimiterConfig>,
    /// The `config.pbtxt` this configuration was read from, in Triton's JSON form: what a
    /// Python model sees as its `model_config`. See [`crate::model_json`].
    #[serde(skip)]
    pub triton: Option<serde_json::Value>,
    /// Whether what the configuration leaves out is completed from the model (Triton's
    /// auto-complete): the inputs and outputs from the model file, `max_batch_size` as above,
    /// a Python model's `auto_complete_config`. Not a key of the file: the server's
    /// `--disable-auto-complete-config` turns it off for every model, and then an ONNX or
    /// Python model's configuration lists each of its inputs and outputs with a type and dims,
    /// and an absent `max_batch_size` is 0 ([`ModelConfig::check_complete`]).
    #[serde(skip)]
    pub auto_complete: bool,
    /// The batch size a batchable model whose configuration gives none is completed with
    /// ([`DEFAULT_MAX_BATCH_SIZE`]). Not a key of the file: the server's `--backend-config
    /// default-max-batch-size=N` sets it, for every model or for one backend's.
    #[serde(skip)]
    pub default_max_batch_size: usize,
}

/// A tensor a configuration declares: its name, and optionally its type (`FP32`) and its
/// dimensions, without the batch dimension when the model batches (-1: any size).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DeclaredTensor {
    pub name: String,
    pub data_type: Option<String>,
    pub dims: Vec<i64>,
    /// The shape the model takes or gives the tensor in, when not `dims` (Triton's
    /// `reshape`; see [`crate::reshape`]); clients see `dims`.
    pub reshape: Option<Vec<i64>>,
    /// Triton's `optional` (inputs only): a request may leave the input out. Served for
    /// models that see their requests one by one (Triton's Python models), which are told
    /// which inputs a request carries; requests with different inputs never share a batch.
    pub optional: bool,
    /// Triton's `allow_ragged_batch` (inputs only): requests whose items differ in shape share
    /// a batch, unpadded. See [`crate::ragged`].
    pub allow_ragged_batch: bool,
}

impl ModelConfig {
    /// Checks the declared tensors against the model's signature: each is there, of its type,
    /// with dimensions that agree (where both are fixed); `batched`: the signature's first
    /// dimension is the batch.
    pub fn check_declared(
        &self,
        signature: &sheaf_backend::Signature,
        batched: bool,
    ) -> Result<(), String> {
        for (kind, declared, specs) in [
            ("input", &self.inputs, &signature.inputs),
            ("output", &self.outputs, &signature.outputs),
        ] {
            for d in declared {
                if kind == "output" && d.optional {
                    return Err(format!(
                        "output '{}' is declared optional: only inputs can be",
                        d.name
                    ));
                }
                let names = || specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>();
                let spec = specs.iter().find(|s| s.name == d.name).ok_or_else(|| {
                    format!(
                        "the config declares {kind} '{}', but the model's {kind}s are {:?}",
                        d.name,
                        names()
                    )
                })?;
                if let Some(t) = &d.data_type {
                    if t != spec.dtype.as_str() {
                        return Err(format!(
                            "the config declares {kind} '{}' as {t}, but the model has {}",
                            d.name,
                            spec.dtype.as_str()
                        ));
                    }
                }
                // A reshaped tensor has the model's shape in its reshape, `dims` for clients.
                let (what, dims) = match &d.reshape {
                    Some(reshape) => {
                        crate::reshape::check(&d.dims, reshape)
                            .map_err(|e| format!("{kind} '{}': {e}", d.name))?;
                        ("reshape", reshape)
                    }
                    None if d.dims.is_empty() => continue,
                    None => ("dims", &d.dims),
                };
                let shape = &spec.shape[usize::from(batched).min(spec.shape.len())..];
                let agree = shape.len() == dims.len()
                    && shape
                        .iter()
                        .zip(dims)
                        .all(|(&m, &c)| m < 0 || c < 0 || m == c);
                if !agree {
                    return Err(format!(
                        "the config declares {kind} '{}' with {what} {:?}, but the model's \
                         dims are {:?}{}",
                        d.name,
                        dims,
                        shape,
                        if batched {
                            " (past the batch dimension)"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
        Ok(())
    }

    /// Without auto-complete ([`ModelConfig::auto_complete`] off): every input and output of
    /// `signature` is declared, each with its data type and dims (Triton's minimal model
    /// configuration), so that nothing the model serves comes from its file alone. Checked
    /// after [`ModelConfig::check_declared`], which checks what is declared against the model.
    pub fn check_complete(&self, signature: &sheaf_backend::Signature) -> Result<(), String> {
        for (kind, declared, specs) in [
            ("input", &self.inputs, &signature.inputs),
            ("output", &self.outputs, &signature.outputs),
        ] {
            for spec in specs {
                let lacks = match declared.iter().find(|d| d.name == spec.name) {
                    None => "is not declared",
                    Some(d) if d.data_type.is_none() => "is declared without a data_type",
                    Some(d) if d.dims.is_empty() => "is declared without dims",
                    Some(_) => continue,
                };
                return Err(format!(
                    "the model's {kind} '{}' {lacks}, and auto-complete is off \
                     (--disable-auto-complete-config): the configuration must give every input \
                     and output with its data_type and dims",
                    spec.name
                ));
            }
        }
        Ok(())
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            max_batch_size: None,
            allowed_batch_sizes: Vec::new(),
            session_per_batch_size: None,
            io_binding: None,
            cuda: CudaConfig::default(),
            warmup: true,
            model_warmup: Vec::new(),
            preload: false,
            preferred_device: None,
            memory_mb: None,
            padding: None,
            embedding: None,
            max_queue_delay_us: 500,
            preferred_batch_sizes: Vec::new(),
            intra_op_threads: 1,
            graph_optimization: GraphOptimizationConfig::All,
            inter_op_threads: 1,
            parallel_execution: false,
            max_queue_size: 4096,
            pipeline_depth: 2,
            instances: 1,
            instance_cpus: Vec::new(),
            batching: BatchingConfig::default(),
            priority_levels: 1,
            default_priority_level: None,
            default_timeout_us: 0,
            timeout_action: TimeoutActionConfig::Reject,
            allow_timeout_override: None,
            priority_queue_policy: Default::default(),
            generation: Default::default(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            batch_inputs: Vec::new(),
            batch_outputs: Vec::new(),
            image_inputs: Default::default(),
            image_outputs: Default::default(),
            labels: "labels.txt".into(),
            frames: None,
            python: None,
            execution_timeout_ms: 60_000,
            parameters: Default::default(),
            response_cache: false,
            sequence_batching: None,
            iterative_sequence: false,
            version_policy: None,
            rate_limiter: None,
            triton: None,
            auto_complete: true,
            default_max_batch_size: DEFAULT_MAX_BATCH_SIZE,
        }
    }
}

impl ModelConfig {
    /// The largest batch `max_batch_size: auto` may settle on: [`AUTO_LIMIT`], or the largest
    /// of `allowed_batch_sizes` below it. A model told its `max_batch_size` before the probe
    /// runs (a Python model's configuration) is told this, the most it will be sent.
    pub fn auto_limit(&self) -> usize {
        self.allowed_batch_sizes
            .iter()
            .max()
            .map_or(AUTO_LIMIT, |&a| a.min(AUTO_LIMIT))
    }

    /// How an instance of this model loads on `device`: the one place the served model's
    /// session options come from, for the server and for `sheaf bench`'s in-process reference
    /// alike. `threads` overrides `intra_op_threads` (a device's own setting). On a GPU each
    /// batch size gets its own session unless the config says otherwise: a session whose input
    /// shape changes between calls runs far slower there.
    pub fn load_spec(
        &self,
        path: &std::path::Path,
        device: sheaf_backend::Device,
        threads: Option<usize>,
    ) -> sheaf_backend::LoadSpec {
        sheaf_backend::LoadSpec {
            path: path.to_path_buf(),
            intra_op_threads: threads.unwrap_or(self.intra_op_threads),
            device,
            session_per_batch_size: self
                .session_per_batch_size
                .unwrap_or(matches!(device, sheaf_backend::Device::Cuda(_))),
            // On a GPU, unless the config says, the backend binds by the size of an item.
            io_binding: match (self.io_binding, device) {
                (None, sheaf_backend::Device::Cuda(_)) => None,
                (asked, _) => Some(asked.unwrap_or(false)),
            },
            cuda: self.cuda.options(),
            graph: sheaf_backend::GraphOptions {
                optimization: match self.graph_optimization {
                    GraphOptimizationConfig::Disabled => sheaf_backend::GraphOptimization::Disabled,
                    GraphOptimizationConfig::Basic => sheaf_backend::GraphOptimization::Basic,
                    GraphOptimizationConfig::Extended => sheaf_backend::GraphOptimization::Extended,
                    GraphOptimizationConfig::All => sheaf_backend::GraphOptimization::All,
                },
                inter_op_threads: self.inter_op_threads,
                parallel: self.parallel_execution,
            },
            model_config: Some(crate::model_json::model_json(self).to_string()),
            interpreter: self.python.as_ref().map(std::path::PathBuf::from),
            auto_complete: self.auto_complete,
            max_batch_size_open: self.triton.is_none()
                && matches!(self.max_batch_size, None | Some(MaxBatchSize::Auto(_))),
            execution_timeout: (self.execution_timeout_ms > 0)
                .then(|| std::time::Duration::from_millis(self.execution_timeout_ms)),
        }
    }

    pub fn from_yaml(text: &str) -> Result<ModelConfig, String> {
        if text.trim().is_empty() {
            return Ok(ModelConfig::default());
        }
        let mut config: ModelConfig = sheaf_backend::yaml::from_str(text)?;
        config.check()?;
        if config.embedding.is_some() && config.padding.is_none() {
            config.padding = Some(PaddingConfig::for_embeddings());
        }
        Ok(config)
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        // Each count is checked before anything is made of it: a thread, a queue level or a
        // slot each, which an absurd number would exhaust before the load could fail.
        let within = |name: &str, value: usize, most: usize| match value {
            0 => Err(format!("{name} must be at least 1")),
            v if v > most => Err(format!("{name} is {v}; at most {most} is allowed")),
            _ => Ok(()),
        };
        within(
            "intra_op_threads",
            self.intra_op_threads,
            MAX_RUNTIME_THREADS,
        )?;
        within(
            "inter_op_threads",
            self.inter_op_threads,
            MAX_RUNTIME_THREADS,
        )?;
        within("max_queue_size", self.max_queue_size, MAX_QUEUE_SIZE)?;
        within("pipeline_depth", self.pipeline_depth, MAX_PIPELINE_DEPTH)?;
        within("instances", self.instances, MAX_INSTANCES)?;
        if !self.instance_cpus.is_empty() && self.instance_cpus.len() != self.instances {
            return Err(format!(
                "instance_cpus lists cores for {} instance(s) but the model has {} (one entry \
                 per instance)",
                self.instance_cpus.len(),
                self.instances
            ));
        }
        within("priority_levels", self.priority_levels, MAX_PRIORITY_LEVELS)?;
        if let Some(d) = self.default_priority_level {
            if d == 0 || d > self.priority_levels {
                return Err(format!(
                    "default_priority_level {d} is outside 1..={}",
                    self.priority_levels
                ));
            }
        }
        for (&level, policy) in &self.priority_queue_policy {
            if level == 0 || level > self.priority_levels {
                return Err(format!(
                    "priority_queue_policy names level {level}, outside 1..={}",
                    self.priority_levels
                ));
            }
            if policy.max_queue_size == Some(0) {
                return Err(format!(
                    "priority_queue_policy level {level}: max_queue_size must be at least 1 \
                     (leave it out for no bound of its own)"
                ));
            }
            if let Some(n) = policy.max_queue_size.filter(|&n| n > MAX_QUEUE_SIZE) {
                return Err(format!(
                    "priority_queue_policy level {level}: max_queue_size is {n}; at most \
                     {MAX_QUEUE_SIZE} is allowed"
                ));
            }
        }
        if self.batching.latency_slo_ms == 0 {
            return Err("batching.latency_slo_ms must be positive".into());
        }
        for (i, sample) in self.model_warmup.iter().enumerate() {
            sample.check(i)?;
        }
        if self.allowed_batch_sizes.contains(&0) {
            return Err("allowed_batch_sizes must be positive".into());
        }
        if self.preferred_batch_sizes.contains(&0) {
            return Err("preferred_batch_sizes must be positive".into());
        }
        self.generation.check()?;
        if let Some(s) = &self.sequence_batching {
            s.check()?;
        }
        for (name, i) in &self.image_inputs {
            if !(1..=2).contains(&i.crop.len()) && !i.crop.is_empty() {
                return Err(format!(
                    "image_inputs.{name}.crop: give [height, width] or [side]"
                ));
            }
            if i.crop.contains(&0) || i.resize == Some(0) || i.std.contains(&0.0) {
                return Err(format!(
                    "image_inputs.{name}: crop and resize must be positive, std non-zero"
                ));
            }
        }
        for (name, o) in &self.image_outputs {
            if o.range[0] == o.range[1] || !(1..=100).contains(&o.quality) {
                return Err(format!(
                    "image_outputs.{name}: range must span something, quality be 1 to 100"
                ));
            }
        }
        if let Some(e) = &self.embedding {
            if e.max_input_tokens == 0 {
                return Err("embedding.max_input_tokens must be at least 1".into());
            }
            if e.dimensions.contains(&0) {
                return Err("embedding.dimensions must be positive".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(ModelConfig::from_yaml("").unwrap(), ModelConfig::default());
    }

    #[test]
    fn declared_tensors_are_checked_against_the_signature() {
        use sheaf_backend::{DataType, Signature, TensorSpec};
        let signature = Signature {
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DataType::F32,
                shape: vec![-1, 3, -1],
            }],
            outputs: vec![],
        };
        let with = |yaml: &str| ModelConfig::from_yaml(yaml).unwrap();
        let ok = with("inputs: [{name: x, data_type: FP32, dims: [3, 224]}]");
        assert_eq!(ok.check_declared(&signature, true), Ok(()));
        for (yaml, batched, says) in [
            ("inputs: [{name: y}]", true, "model's inputs are [\"x\"]"),
            ("inputs: [{name: x, data_type: INT64}]", true, "as INT64"),
            ("inputs: [{name: x, dims: [4, -1]}]", true, "dims [4, -1]"),
            (
                "inputs: [{name: x, dims: [3, 224]}]",
                false,
                "dims [3, 224]",
            ),
        ] {
            let e = with(yaml).check_declared(&signature, batched).unwrap_err();
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }

    #[test]
    fn without_auto_complete_every_tensor_is_declared_with_its_type_and_dims() {
        use sheaf_backend::{DataType, Signature, TensorSpec};
        let spec = |name: &str| TensorSpec {
            name: name.into(),
            dtype: DataType::F32,
            shape: vec![-1, 4],
        };
        let signature = Signature {
            inputs: vec![spec("x")],
            outputs: vec![spec("y")],
        };
        let with = |yaml: &str| ModelConfig::from_yaml(yaml).unwrap();
        let whole = "inputs: [{name: x, data_type: FP32, dims: [4]}]\n\
                     outputs: [{name: y, data_type: FP32, dims: [4]}]";
        assert_eq!(with(whole).check_complete(&signature), Ok(()));
        for (yaml, says) in [
            ("inputs: [{name: x, data_type: FP32, dims: [4]}]", "output 'y' is not declared"),
            (
                "inputs: [{name: x, dims: [4]}]\noutputs: [{name: y, data_type: FP32, dims: [4]}]",
                "input 'x' is declared without a data_type",
            ),
            (
                "inputs: [{name: x, data_type: FP32}]\noutputs: [{name: y, data_type: FP32, dims: [4]}]",
                "input 'x' is declared without dims",
            ),
        ] {
            let e = with(yaml).check_complete(&signature).unwrap_err();
            assert!(e.contains(says), "{yaml}: {e}");
        }
        // What the file says never turns it off: only the server does.
        assert!(with(whole).auto_complete);
    }

    #[test]
    fn the_generation_section_sizes_the_engine() {
        let c = ModelConfig::from_yaml(
            "generation: {n_ctx: 2048, max_seqs: 4, prefix_slots: 0, gpu_layers: 12}\n\
             priority_levels: 2\ndefault_timeout_us: 500000\n",
        )
        .unwrap();
        let spec = &c.generation;
        assert_eq!((spec.n_ctx, spec.max_seqs, spec.prefix_slots), (2048, 4, 0));
        assert_eq!(
            (spec.gpu_layers, spec.threads, spec.max_batch_tokens),
            (Some(12), None, 512)
        );
        for bad in [
            "generation: {max_seqs: 0}",
            "generation: {n_ctx_: 5}",
            "n_ctx: 4096",
        ] {
            assert!(ModelConfig::from_yaml(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_read() {
        let c = ModelConfig::from_yaml(
            "max_batch_size: 8\nmax_queue_delay_us: 100\npreferred_batch_sizes: [4, 8]\nintra_op_threads: 2\n",
        )
        .unwrap();
        assert_eq!(c.max_batch_size, Some(MaxBatchSize::Size(8)));
        assert_eq!(c.max_queue_delay_us, 100);
        assert_eq!(c.preferred_batch_sizes, vec![4, 8]);
        assert_eq!(c.intra_op_threads, 2);
        assert_eq!(c.max_queue_size, ModelConfig::default().max_queue_size);
    }

    #[test]
    fn batching_section_is_read() {
        let c = ModelConfig::from_yaml(
            "instances: 2\nbatching:\n  policy: queue_depth\n  adaptive_threshold: 4\n  max_wait_us: 900\n",
        )
        .unwrap();
        assert_eq!(c.instances, 2);
        assert_eq!(c.batching.policy, PolicyKind::QueueDepth);
        assert_eq!(c.batching.adaptive_threshold, 4);
        assert_eq!(c.batching.max_wait_us, Some(900));
        assert_eq!(
            ModelConfig::default().batching.policy,
            PolicyKind::LatencySlo
        );
        let err = ModelConfig::from_yaml("batching:\n  policy: greedy\n").unwrap_err();
        assert!(err.contains("greedy"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = ModelConfig::from_yaml("max_batch_sise: 8\n").unwrap_err();
        assert!(err.contains("max_batch_sise"), "{err}");
        assert!(ModelConfig::from_yaml("intra_op_threads: 0\n").is_err());
        assert!(ModelConfig::from_yaml("inter_op_threads: 0\n").is_err());
        // ONNX Runtime's graph settings reach the load.
        let c = ModelConfig::from_yaml(
            "graph_optimization: disabled\ninter_op_threads: 2\nparallel_execution: true\n",
        )
        .unwrap();
        let spec = c.load_spec(
            std::path::Path::new("m.onnx"),
            sheaf_backend::Device::Cpu,
            None,
        );
        assert_eq!(
            spec.graph,
            sheaf_backend::GraphOptions {
                optimization: sheaf_backend::GraphOptimization::Disabled,
                inter_op_threads: 2,
                parallel: true
            }
        );
        assert!(ModelConfig::from_yaml("graph_optimization: most\n").is_err());
        assert!(ModelConfig::from_yaml("max_batch_size: -1\n").is_err());
    }

    #[test]
    fn instance_cpus_are_read_one_list_per_instance() {
        let c = ModelConfig::from_yaml("instances: 2\ninstance_cpus: [3, '4-5,7']\n").unwrap();
        let lists: Vec<String> = c.instance_cpus.iter().map(|l| l.to_string()).collect();
        assert_eq!(lists, ["3", "4-5,7"]);
        let err = ModelConfig::from_yaml("instances: 2\ninstance_cpus: [3]\n").unwrap_err();
        assert!(
            err.contains("cores for 1 instance(s) but the model has 2"),
            "{err}"
        );
        let err = ModelConfig::from_yaml("instance_cpus: ['5-2']\n").unwrap_err();
        assert!(err.contains("runs backwards"), "{err}");
    }

    #[test]
    fn embedding_section_is_read_and_brings_padding() {
        let c = ModelConfig::from_yaml(
            "embedding:\n  pooling: cls\n  max_input_tokens: 256\n  dimensions: [128]\n",
        )
        .unwrap();
        let e = c.embedding.unwrap();
        assert_eq!(e.pooling, PoolingConfig::Cls);
        assert_eq!(e.max_input_tokens, 256);
        assert_eq!(e.dimensions, vec![128]);
        assert!(e.normalize && !e.truncate);
        assert_eq!(e.tokenizer, "tokenizer.json");
        assert_eq!(c.padding, Some(PaddingConfig::for_embeddings()));
        let c = ModelConfig::from_yaml(
            "embedding: {}\npadding:\n  bucket_width: 8\n  max_batch_tokens: 100\n",
        )
        .unwrap();
        let p = c.padding.unwrap();
        assert_eq!((p.bucket_width, p.max_batch_tokens), (8, 100));
        let err = ModelConfig::from_yaml("embedding:\n  pooling: max\n").unwrap_err();
        assert!(err.contains("max"), "{err}");
        assert!(ModelConfig::from_yaml("embedding:\n  max_input_tokens: 0\n").is_err());
        assert_eq!(ModelConfig::from_yaml("").unwrap().padding, None);
    }

    #[test]
    fn cuda_section_is_read_with_defaults_and_checked() {
        let c = ModelConfig::from_yaml(
            "session_per_batch_size: false\ncuda:\n  gpu_mem_limit: 2147483648\n  \
             cudnn_conv_algo_search: heuristic\n  use_tf32: false\n",
        )
        .unwrap();
        assert_eq!(c.session_per_batch_size, Some(false));
        let o = c.cuda.options();
        assert_eq!(o.memory_limit_bytes, Some(2 << 30));
        assert_eq!(o.conv_algo_search, sheaf_backend::ConvAlgoSearch::Heuristic);
        assert!(!o.tf32);
        assert_eq!(
            o.arena_extend_strategy,
            sheaf_backend::ArenaExtendStrategy::SameAsRequested
        );
        let d = ModelConfig::default();
        assert_eq!(d.session_per_batch_size, None);
        assert!(d.cuda.use_tf32);
        let err = ModelConfig::from_yaml("cuda:\n  cudnn_conv_algo_search: fastest\n").unwrap_err();
        assert!(err.contains("fastest"), "{err}");
        let err = ModelConfig::from_yaml("cuda:\n  gpu_mem_limt: 1\n").unwrap_err();
        assert!(err.contains("gpu_mem_limt"), "{err}");
    }

    /// A count that would exhaust threads, queue room or memory before the load could fail is
    /// refused with its limit, as is a count of none.
    #[test]
    fn counts_past_their_limits_are_refused() {
        for (text, says) in [
            ("instances: 1025\n", "instances is 1025; at most 1024"),
            ("instances: 0\n", "instances must be at least 1"),
            ("intra_op_threads: 100000\n", "intra_op_threads is 100000; at most 1024"),
            ("inter_op_threads: 1025\n", "inter_op_threads is 1025"),
            ("pipeline_depth: 65\n", "pipeline_depth is 65; at most 64"),
            ("priority_levels: 4000000000\n", "priority_levels is 4000000000; at most 65536"),
            ("max_queue_size: 18446744073709551615\n", "max_queue_size is 18446744073709551615"),
            (
                "priority_levels: 2\npriority_queue_policy: {2: {max_queue_size: 18446744073709551615}}\n",
                "level 2: max_queue_size is 18446744073709551615",
            ),
        ] {
            let error = ModelConfig::from_yaml(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        let most = format!(
            "instances: {MAX_INSTANCES}\npipeline_depth: {MAX_PIPELINE_DEPTH}\npriority_levels: {MAX_PRIORITY_LEVELS}\n"
        );
        assert!(ModelConfig::from_yaml(&most).is_ok());
    }
}
