//! The synchronous model trait and the signature every backend reports.

use crate::{BackendError, DataType, Tensor};

/// One named input or output: element type and shape, with `-1` for a dynamic dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DataType,
    pub shape: Vec<i64>,
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
}

/// Where an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
}

/// A kind of model runtime (ONNX Runtime, a simulated device, ...). Loading is blocking and runs
/// on the instance's own thread.
pub trait Backend: Send + Sync {
    /// The platform name reported in model metadata, as Triton names it (`onnxruntime_onnx`).
    fn platform(&self) -> &'static str;

    /// The file name a model folder holds for this backend (`model.onnx`).
    fn model_file(&self) -> &'static str;

    /// Loads one instance of the model described by `spec`.
    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError>;

    /// Memory one instance of the model at `path` will hold, in bytes, estimated before loading.
    fn estimate_memory(&self, path: &std::path::Path) -> Option<u64> {
        std::fs::metadata(path).ok().map(|m| m.len())
    }
}
