//! One model instance over ONNX Runtime: one session, or one session per batch size.
//!
//! With `session_per_batch_size`, each batch size gets a session of its own, made the first time
//! that size runs (warm-up runs every size the batcher will use), so no session ever sees its
//! input shape change: ONNX Runtime's CUDA provider plans memory and picks cuDNN kernels per
//! shape, and runs at a fraction of its speed when the shape changes between calls. The
//! sessions of one model share their prepacked CPU weights, and every session on a device
//! allocates from the device's one arena ([`crate::arena`]), so a model holds about what its
//! largest bucket needs rather than the sum over its buckets. Inputs are handed to ONNX Runtime as
//! views of the assembled batch, not copied.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::staged::{OutputPool, Staged};
use bytes::Bytes;
use ort::ep::cuda::ConvAlgorithmSearch;
use ort::memory::Allocator;
use ort::session::builder::PrepackedWeights;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{
    DynTensor, DynTensorValueType, PrimitiveTensorElementType, TensorElementType, TensorRef,
    ValueType,
};
use sheaf_backend::{
    ArenaExtendStrategy, Backend, BackendError, ConvAlgoSearch, CudaOptions, DataType, Device,
    GraphOptimization, GraphOptions, LoadSpec, Model, Signature, Tensor, TensorSpec,
};

/// Session options that sheaf exposes per model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnnxOptions {
    /// Threads ONNX Runtime uses inside one operator. One per instance is the default: the
    /// server's own I/O shares the cores, and more threads than free cores made ONNX Runtime
    /// slower than one thread in measurements on a 2-core machine.
    pub intra_op_threads: usize,
    /// Whether idle intra-op threads spin; spinning burns the cores that HTTP handling needs.
    pub intra_op_spinning: bool,
    /// The device the session runs on: CPU, or a GPU through the CUDA execution provider.
    pub device: Device,
    /// One session per batch size (see the module docs).
    pub session_per_batch_size: bool,
    /// The CUDA provider's options, on a CUDA device.
    pub cuda: CudaOptions,
    /// Graph optimizations, and threads across operators.
    pub graph: GraphOptions,
    /// Whether the session allocates from its device's one shared arena (see
    /// [`crate::arena`]) rather than an arena of its own.
    pub shared_arena: bool,
    /// Whether each batch size's session has its inputs and outputs bound to buffers of its own
    /// (see [`crate::staged`]); only with `session_per_batch_size`, and only for signatures
    /// whose dimensions past the batch are fixed. `None`: where an item's inputs take
    /// [`crate::staged::BIND_FROM`] bytes or more (the input buffers are pinned host memory on
    /// CUDA).
    pub io_binding: Option<bool>,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            intra_op_threads: 1,
            intra_op_spinning: false,
            device: Device::Cpu,
            session_per_batch_size: false,
            cuda: CudaOptions::default(),
            graph: GraphOptions::default(),
            shared_arena: true,
            io_binding: Some(false),
        }
    }
}

/// A loaded ONNX model: its sessions, used by one thread at a time.
pub struct OnnxModel {
    signature: Signature,
    sessions: Sessions,
    allocator: Allocator,
    outputs: OutputPool,
    /// The batch size of the batch [`Model::stage`] copied in, until it runs.
    staged_items: Option<usize>,
    /// What the model takes of its device's shared arena, when it uses one.
    footprint: Option<crate::arena::Footprint>,
    /// The model's hold on its device's shared arena: after the sessions, so that it is
    /// dropped after them.
    _arena: Option<crate::arena::ArenaHold>,
}

/// The sessions of one model, and what making another one takes.
struct Sessions {
    path: PathBuf,
    options: OnnxOptions,
    /// By batch size; key 0 holds the only session when sessions are not per batch size.
    by_size: BTreeMap<usize, Slot>,
    /// The session made at load, before any batch size was seen: the first size run takes it.
    unassigned: Option<Session>,
    weights: PrepackedWeights,
}

/// One session, with its bound buffers when it has them.
struct Slot {
    session: Session,
    staged: Option<Staged>,
}

impl OnnxModel {
    /// Loads `path` with `options`. [`crate::init`] must have succeeded first.
    pub fn load(path: &Path, options: &OnnxOptions) -> Result<OnnxModel, BackendError> {
        crate::runtime::ready()?;
        let arena = options
            .shared_arena
            .then(|| crate::arena::hold(options.device));
        let weights = PrepackedWeights::new();
        let session = session(path, options, &weights)?;
        let footprint = options.shared_arena.then(|| {
            let file = std::fs::metadata(path).map_or(0, |m| m.len());
            crate::arena::Footprint::start(&session, options.device, file)
        });
        let signature = Signature {
            inputs: specs(session.inputs().iter().map(|o| (o.name(), o.dtype())))?,
            outputs: specs(session.outputs().iter().map(|o| (o.name(), o.dtype())))?,
        };
        let mut options = options.clone();
        options.io_binding = Some(
            options
                .io_binding
                .unwrap_or_else(|| crate::staged::worth_binding(&signature)),
        );
        let (by_size, unassigned) = if options.session_per_batch_size {
            (BTreeMap::new(), Some(session))
        } else {
            let slot = Slot {
                session,
                staged: None,
            };
            (BTreeMap::from([(0, slot)]), None)
        };
        Ok(OnnxModel {
            signature,
            sessions: Sessions {
                path: path.to_path_buf(),
                options,
                by_size,
                unassigned,
                weights,
            },
            allocator: Allocator::default(),
            outputs: OutputPool::default(),
            staged_items: None,
            footprint,
            _arena: arena,
        })
    }

    /// The batch sizes that have a session of their own (empty when sessions are not per size).
    pub fn session_batch_sizes(&self) -> Vec<usize> {
        if self.sessions.options.session_per_batch_size {
            self.sessions.by_size.keys().copied().collect()
        } else {
            Vec::new()
        }
    }
}

impl Sessions {
    /// The session that runs a batch of `items`, made now if this size has none yet (and
    /// bound to buffers of its own, with `io_binding`).
    fn get(&mut self, items: usize, signature: &Signature) -> Result<&mut Slot, BackendError> {
        let key = if self.options.session_per_batch_size {
            items
        } else {
            0
        };
        match self.by_size.entry(key) {
            Entry::Occupied(found) => Ok(found.into_mut()),
            Entry::Vacant(slot) => {
                let made = match self.unassigned.take() {
                    Some(s) => s,
                    None => {
                        tracing::debug!(path = %self.path.display(), batch_size = items, "new session for this batch size");
                        session(&self.path, &self.options, &self.weights)
                            .map_err(|e| BackendError::Runtime(e.to_string()))?
                    }
                };
                let staged = if self.options.io_binding == Some(true)
                    && self.options.session_per_batch_size
                {
                    Staged::new(&made, signature, items, self.options.device)?
                } else {
                    None
                };
                Ok(slot.insert(Slot {
                    session: made,
                    staged,
                }))
            }
        }
    }
}

/// Builds one session of the model at `path`.
fn session(
    path: &Path,
    options: &OnnxOptions,
    weights: &PrepackedWeights,
) -> Result<Session, BackendError> {
    let env = crate::runtime::environment()?;
    let load_err =
        |e: &dyn std::fmt::Display| BackendError::Load(format!("{}: {e}", path.display()));
    let mut builder = Session::builder(env).map_err(|e| load_err(&e))?;
    if let Device::Cuda(id) = options.device {
        crate::runtime::prepare_cuda();
        // Fails the load (instead of falling back to the CPU) when the ONNX Runtime build has
        // no CUDA provider or the GPU is missing.
        let cuda = cuda_provider(id, &options.cuda).build().error_on_failure();
        builder = builder.with_execution_providers([cuda]).map_err(|e| {
            BackendError::Load(format!(
                "{}: CUDA execution provider for cuda:{id} is unavailable: {e} (sheaf needs \
                 the onnxruntime-gpu build of ONNX Runtime {}, its CUDA 13 and cuDNN 9 \
                 libraries (scripts/setup.sh --gpu installs them) and a visible GPU)",
                path.display(),
                crate::ORT_VERSION
            ))
        })?;
    }
    if options.shared_arena {
        crate::arena::register(options.device, &options.cuda)?;
        builder = builder.with_env_allocators().map_err(|e| load_err(&e))?;
    }
    let _making = crate::arena::making_sessions();
    use ort::session::builder::GraphOptimizationLevel as Level;
    let graph = &options.graph;
    builder
        .with_optimization_level(match graph.optimization {
            GraphOptimization::Disabled => Level::Disable,
            GraphOptimization::Basic => Level::Level1,
            GraphOptimization::Extended => Level::Level2,
            GraphOptimization::All => Level::All,
        })
        .map_err(|e| load_err(&e))?
        .with_parallel_execution(graph.parallel)
        .map_err(|e| load_err(&e))?
        .with_intra_threads(options.intra_op_threads.max(1))
        .map_err(|e| load_err(&e))?
        .with_inter_threads(graph.inter_op_threads.max(1))
        .map_err(|e| load_err(&e))?
        .with_intra_op_spinning(options.intra_op_spinning)
        .map_err(|e| load_err(&e))?
        .with_prepacked_weights(weights)
        .map_err(|e| load_err(&e))?
        .commit_from_file(path)
        .map_err(|e| load_err(&e))
}

/// The CUDA execution provider for device `id` with `options`.
fn cuda_provider(id: i32, options: &CudaOptions) -> ort::ep::CUDA {
    let mut cuda = ort::ep::CUDA::default()
        .with_device_id(id)
        .with_arena_extend_strategy(match options.arena_extend_strategy {
            ArenaExtendStrategy::NextPowerOfTwo => ort::ep::ArenaExtendStrategy::NextPowerOfTwo,
            ArenaExtendStrategy::SameAsRequested => ort::ep::ArenaExtendStrategy::SameAsRequested,
        })
        .with_conv_algorithm_search(match options.conv_algo_search {
            ConvAlgoSearch::Exhaustive => ConvAlgorithmSearch::Exhaustive,
            ConvAlgoSearch::Heuristic => ConvAlgorithmSearch::Heuristic,
            ConvAlgoSearch::Default => ConvAlgorithmSearch::Default,
        })
        .with_tf32(options.tf32);
    if let Some(limit) = options.memory_limit_bytes {
        cuda = cuda.with_memory_limit(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    cuda
}

impl Model for OnnxModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        if inputs.len() != self.signature.inputs.len() {
            return Err(BackendError::InvalidInput(format!(
                "model takes {} inputs, got {}",
                self.signature.inputs.len(),
                inputs.len()
            )));
        }
        let items = inputs
            .first()
            .and_then(|t| t.shape().first().copied())
            .unwrap_or(0);
        let slot = self.sessions.get(items, &self.signature)?;
        if let Some(staged) = &mut slot.staged {
            let pieces: Vec<&[Tensor]> = inputs.iter().map(std::slice::from_ref).collect();
            staged.load(&self.signature, &pieces)?;
            return staged.run(&mut slot.session, &self.signature, &mut self.outputs);
        }
        let mut values: Vec<(&str, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (spec, tensor) in self.signature.inputs.iter().zip(inputs) {
            values.push((spec.name.as_str(), to_ort(&self.allocator, tensor)?));
        }
        let outputs = slot
            .session
            .run(values)
            .map_err(|e| BackendError::Runtime(e.to_string()))?;
        outputs_of(&self.signature, outputs, &mut self.outputs)
    }

    fn keep_batch_sizes(&mut self, sizes: &[usize]) {
        if self.sessions.options.session_per_batch_size {
            self.sessions.by_size.retain(|b, _| sizes.contains(b));
        }
    }

    /// Runs `inputs` with ONNX Runtime's arena shrinkage on (the CPU's arena, and the GPU's
    /// on `cuda:N`): at the end of the run, every region of the arena that holds nothing goes
    /// back to the device. Measured on an H100 before this: ResNet-50 with `auto` held 8.2 GB
    /// after its probe and warm-up, against 4.2 GB for its largest size alone.
    fn release_memory(&mut self, inputs: &[Tensor]) -> Result<bool, BackendError> {
        let arenas = match self.sessions.options.device {
            Device::Cuda(id) => format!("cpu:0;gpu:{id}"),
            Device::Cpu | Device::Sim => "cpu:0".to_string(),
        };
        let fail = |e: ort::Error| BackendError::Runtime(e.to_string());
        let mut options = RunOptions::new().map_err(fail)?;
        options
            .set("memory.enable_memory_arena_shrinkage", &arenas)
            .map_err(fail)?;
        let items = inputs
            .first()
            .and_then(|t| t.shape().first().copied())
            .unwrap_or(0);
        let slot = self.sessions.get(items, &self.signature)?;
        let mut values: Vec<(&str, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (spec, tensor) in self.signature.inputs.iter().zip(inputs) {
            values.push((spec.name.as_str(), to_ort(&self.allocator, tensor)?));
        }
        // A session whose memory is no arena has nothing to give back, and says so by failing
        // the run; the model serves the same either way.
        let released = match slot.session.run_with_options(values, &options) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "the memory arena could not be shrunk after warm-up");
                false
            }
        };
        if let (true, Some(footprint)) = (released, self.footprint.as_mut()) {
            footprint.released(&slot.session);
        }
        Ok(released)
    }

    /// What the model takes of its device's shared arena ([`crate::arena::Footprint`]),
    /// counted once after the warm-up: the same whichever models loaded on the device before.
    fn memory_bytes(&self) -> Option<u64> {
        let sessions = &self.sessions;
        let session = sessions
            .by_size
            .values()
            .map(|s| &s.session)
            .next()
            .or(sessions.unassigned.as_ref())?;
        self.footprint.as_ref()?.bytes(session)
    }

    fn stages_inputs(&self) -> bool {
        let fixed = |specs: &[TensorSpec]| {
            specs
                .iter()
                .all(|s| s.shape.first() == Some(&-1) && s.shape.iter().skip(1).all(|&d| d >= 0))
        };
        let options = &self.sessions.options;
        options.io_binding == Some(true)
            && options.session_per_batch_size
            && fixed(&self.signature.inputs)
            && fixed(&self.signature.outputs)
    }

    fn stage(&mut self, pieces: &[Vec<Tensor>], items: usize) -> Result<bool, BackendError> {
        self.staged_items = None;
        if pieces.len() != self.signature.inputs.len() {
            return Ok(false);
        }
        let slot = self.sessions.get(items, &self.signature)?;
        let Some(staged) = &mut slot.staged else {
            return Ok(false);
        };
        let parts: Vec<&[Tensor]> = pieces.iter().map(Vec::as_slice).collect();
        staged.load(&self.signature, &parts)?;
        self.staged_items = Some(items);
        Ok(true)
    }

    fn infer_staged(&mut self) -> Result<Vec<Tensor>, BackendError> {
        let items = self
            .staged_items
            .take()
            .ok_or_else(|| BackendError::Runtime("no batch was staged".into()))?;
        let slot = self.sessions.get(items, &self.signature)?;
        let staged = slot
            .staged
            .as_mut()
            .ok_or_else(|| BackendError::Runtime("no batch was staged".into()))?;
        staged.run(&mut slot.session, &self.signature, &mut self.outputs)
    }
}

/// Hands a sheaf tensor to ONNX Runtime: a view of its bytes where they are aligned for the
/// element type (an assembled batch always is), else a copy.
fn to_ort<'a>(
    allocator: &Allocator,
    tensor: &'a Tensor,
) -> Result<SessionInputValue<'a>, BackendError> {
    let viewed = match tensor.dtype() {
        DataType::U8 => view::<u8>(tensor),
        DataType::U16 => view::<u16>(tensor),
        DataType::U32 => view::<u32>(tensor),
        DataType::U64 => view::<u64>(tensor),
        DataType::I8 => view::<i8>(tensor),
        DataType::I16 => view::<i16>(tensor),
        DataType::I32 => view::<i32>(tensor),
        DataType::I64 => view::<i64>(tensor),
        DataType::F32 => view::<f32>(tensor),
        DataType::F64 => view::<f64>(tensor),
        // BYTES never reaches an ONNX model: no ONNX signature is read as BYTES.
        DataType::Bool | DataType::F16 | DataType::BF16 | DataType::Bytes => None,
    };
    match viewed {
        Some(value) => value,
        None => copy(allocator, tensor).map(SessionInputValue::from),
    }
}

/// A view of `tensor`'s bytes as elements of `T`; none when they are not aligned for `T`.
fn view<T: PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static>(
    tensor: &Tensor,
) -> Option<Result<SessionInputValue<'_>, BackendError>> {
    // SAFETY: `T` is a plain numeric type for which every bit pattern is a valid value, and
    // `align_to` only yields the middle part that is correctly aligned for it.
    let (head, elements, tail) = unsafe { tensor.data().align_to::<T>() };
    if !head.is_empty() || !tail.is_empty() {
        return None;
    }
    Some(
        TensorRef::from_array_view((tensor.shape().to_vec(), elements))
            .map(|t| SessionInputValue::from(t.into_dyn()))
            .map_err(|e| BackendError::Runtime(format!("cannot pass input: {e}"))),
    )
}

/// Copies a sheaf tensor into a new ONNX Runtime tensor.
fn copy(allocator: &Allocator, tensor: &Tensor) -> Result<DynTensor, BackendError> {
    let shape: Vec<i64> = tensor.shape().iter().map(|&d| d as i64).collect();
    let mut value = DynTensor::new(allocator, element_type(tensor.dtype()), shape)
        .map_err(|e| BackendError::Runtime(format!("cannot allocate input: {e}")))?;
    let src = tensor.data();
    if !src.is_empty() {
        let dst = value.data_ptr_mut().cast::<u8>();
        // SAFETY: `DynTensor::new` allocated a CPU buffer for exactly `shape` elements of this
        // dtype, which is `src.len()` bytes (checked when the sheaf tensor was built), and the two
        // buffers cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
    Ok(value)
}

/// A run's outputs as sheaf tensors, in the order of `signature`, in bytes from `pool`.
pub(crate) fn outputs_of(
    signature: &Signature,
    mut outputs: ort::session::SessionOutputs<'_>,
    pool: &mut OutputPool,
) -> Result<Vec<Tensor>, BackendError> {
    signature
        .outputs
        .iter()
        .map(|spec| {
            let value = outputs.remove(spec.name.as_str()).ok_or_else(|| {
                BackendError::Runtime(format!("output {} missing from the run", spec.name))
            })?;
            let tensor = value
                .downcast::<DynTensorValueType>()
                .map_err(|e| BackendError::Runtime(format!("output {}: {e}", spec.name)))?;
            from_ort(&tensor, pool)
        })
        .collect()
}

/// Copies an ONNX Runtime output tensor into a sheaf tensor, into bytes from `pool`.
pub(crate) fn from_ort(value: &DynTensor, pool: &mut OutputPool) -> Result<Tensor, BackendError> {
    let dtype = data_type(*value.data_type()).ok_or_else(|| {
        BackendError::Runtime(format!("unsupported output type {:?}", value.data_type()))
    })?;
    let shape: Vec<usize> = value.shape().iter().map(|&d| d.max(0) as usize).collect();
    let len = shape.iter().product::<usize>() * dtype.size();
    let data = if len == 0 {
        Bytes::new()
    } else {
        let src = value.data_ptr().cast::<u8>();
        // SAFETY: ONNX Runtime owns a CPU-readable buffer of `len` bytes for this output (CPU
        // provider outputs, and bound outputs in ONNX Runtime's CPU memory), valid while `value` is
        // borrowed.
        pool.copy(unsafe { std::slice::from_raw_parts(src, len) })
    };
    Tensor::new(dtype, shape, data)
}

fn specs<'a>(
    outlets: impl Iterator<Item = (&'a str, &'a ValueType)>,
) -> Result<Vec<TensorSpec>, BackendError> {
    outlets
        .map(|(name, ty)| match ty {
            ValueType::Tensor { ty, shape, .. } => {
                let dtype = data_type(*ty).ok_or_else(|| {
                    BackendError::Load(format!("{name}: element type {ty:?} is not supported"))
                })?;
                Ok(TensorSpec {
                    name: name.to_string(),
                    dtype,
                    shape: shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect(),
                })
            }
            other => Err(BackendError::Load(format!(
                "{name}: only tensor inputs and outputs are supported, not {other:?}"
            ))),
        })
        .collect()
}

pub(crate) fn element_type(dtype: DataType) -> TensorElementType {
    match dtype {
        DataType::Bool => TensorElementType::Bool,
        DataType::U8 => TensorElementType::Uint8,
        DataType::U16 => TensorElementType::Uint16,
        DataType::U32 => TensorElementType::Uint32,
        DataType::U64 => TensorElementType::Uint64,
        DataType::I8 => TensorElementType::Int8,
        DataType::I16 => TensorElementType::Int16,
        DataType::I32 => TensorElementType::Int32,
        DataType::I64 => TensorElementType::Int64,
        DataType::F16 => TensorElementType::Float16,
        DataType::BF16 => TensorElementType::Bfloat16,
        DataType::F32 => TensorElementType::Float32,
        DataType::F64 => TensorElementType::Float64,
        DataType::Bytes => TensorElementType::String,
    }
}

fn data_type(ty: TensorElementType) -> Option<DataType> {
    DataType::ALL.into_iter().find(|&d| element_type(d) == ty)
}

/// The ONNX Runtime [`Backend`]: loads `.onnx` files as [`OnnxModel`]s.
#[derive(Debug, Clone, Default)]
pub struct OnnxBackend {
    /// Whether idle intra-op threads spin (see [`OnnxOptions::intra_op_spinning`]).
    pub intra_op_spinning: bool,
}

impl Backend for OnnxBackend {
    fn platform(&self) -> &'static str {
        "onnxruntime_onnx"
    }

    fn model_file(&self) -> &'static str {
        "model.onnx"
    }

    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
        let options = OnnxOptions {
            intra_op_threads: spec.intra_op_threads,
            intra_op_spinning: self.intra_op_spinning,
            device: spec.device,
            session_per_batch_size: spec.session_per_batch_size,
            cuda: spec.cuda.clone(),
            graph: spec.graph,
            shared_arena: true,
            io_binding: spec.io_binding,
        };
        Ok(Box::new(OnnxModel::load(&spec.path, &options)?))
    }
}
