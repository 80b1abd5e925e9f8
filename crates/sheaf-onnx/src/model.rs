//! One ONNX Runtime session as a sheaf [`Model`].

use std::path::Path;

use bytes::Bytes;
use ort::memory::Allocator;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynTensor, DynTensorValueType, TensorElementType, ValueType};
use sheaf_backend::{
    Backend, BackendError, DataType, Device, LoadSpec, Model, Signature, Tensor, TensorSpec,
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
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            intra_op_threads: 1,
            intra_op_spinning: false,
            device: Device::Cpu,
        }
    }
}

/// A loaded ONNX model: one session, used by one thread at a time.
pub struct OnnxModel {
    session: Session,
    signature: Signature,
    allocator: Allocator,
}

impl OnnxModel {
    /// Loads `path` with `options`. [`crate::init`] must have succeeded first.
    pub fn load(path: &Path, options: &OnnxOptions) -> Result<OnnxModel, BackendError> {
        let env = crate::runtime::environment()?;
        let load_err =
            |e: &dyn std::fmt::Display| BackendError::Load(format!("{}: {e}", path.display()));
        let mut builder = Session::builder(env).map_err(|e| load_err(&e))?;
        if let Device::Cuda(id) = options.device {
            // Fails the load (instead of falling back to the CPU) when the ONNX Runtime build has
            // no CUDA provider or the GPU is missing.
            let cuda = ort::ep::CUDA::default()
                .with_device_id(id)
                .build()
                .error_on_failure();
            builder = builder.with_execution_providers([cuda]).map_err(|e| {
                BackendError::Load(format!(
                    "{}: CUDA execution provider for cuda:{id} is unavailable: {e} (sheaf needs \
                     the onnxruntime-gpu build of ONNX Runtime {} and a visible GPU)",
                    path.display(),
                    crate::ORT_VERSION
                ))
            })?;
        }
        let session = builder
            .with_intra_threads(options.intra_op_threads.max(1))
            .map_err(|e| load_err(&e))?
            .with_inter_threads(1)
            .map_err(|e| load_err(&e))?
            .with_intra_op_spinning(options.intra_op_spinning)
            .map_err(|e| load_err(&e))?
            .commit_from_file(path)
            .map_err(|e| load_err(&e))?;
        let signature = Signature {
            inputs: specs(session.inputs().iter().map(|o| (o.name(), o.dtype())))?,
            outputs: specs(session.outputs().iter().map(|o| (o.name(), o.dtype())))?,
        };
        Ok(OnnxModel {
            session,
            signature,
            allocator: Allocator::default(),
        })
    }
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
        let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (spec, tensor) in self.signature.inputs.iter().zip(inputs) {
            let value = to_ort(&self.allocator, tensor)?;
            values.push((spec.name.clone(), value.into()));
        }
        let mut outputs = self
            .session
            .run(values)
            .map_err(|e| BackendError::Runtime(e.to_string()))?;
        self.signature
            .outputs
            .iter()
            .map(|spec| {
                let value = outputs.remove(spec.name.as_str()).ok_or_else(|| {
                    BackendError::Runtime(format!("output {} missing from the run", spec.name))
                })?;
                let tensor = value
                    .downcast::<DynTensorValueType>()
                    .map_err(|e| BackendError::Runtime(format!("output {}: {e}", spec.name)))?;
                from_ort(&tensor)
            })
            .collect()
    }
}

/// Copies a sheaf tensor into a new ONNX Runtime tensor.
fn to_ort(allocator: &Allocator, tensor: &Tensor) -> Result<DynTensor, BackendError> {
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

/// Copies an ONNX Runtime output tensor into a sheaf tensor.
fn from_ort(value: &DynTensor) -> Result<Tensor, BackendError> {
    let dtype = data_type(*value.data_type()).ok_or_else(|| {
        BackendError::Runtime(format!("unsupported output type {:?}", value.data_type()))
    })?;
    let shape: Vec<usize> = value.shape().iter().map(|&d| d.max(0) as usize).collect();
    let len = shape.iter().product::<usize>() * dtype.size();
    let data = if len == 0 {
        Bytes::new()
    } else {
        let src = value.data_ptr().cast::<u8>();
        // SAFETY: ONNX Runtime owns a CPU buffer of `len` bytes for this output (CPU execution
        // provider outputs live in CPU memory), valid while `value` is borrowed.
        Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(src, len) })
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

fn element_type(dtype: DataType) -> TensorElementType {
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
        };
        Ok(Box::new(OnnxModel::load(&spec.path, &options)?))
    }
}
