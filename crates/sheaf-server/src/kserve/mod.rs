//! The KServe v2 wire format, converted once for every transport.
//!
//! - [`types`]: the JSON request and response bodies.
//! - [`json_data`]: tensor `data` arrays to and from little-endian bytes, per datatype.
//! - [`codec`]: a whole inference request or response, including the binary tensor data
//!   extension (`Inference-Header-Content-Length`, `binary_data_size`, `binary_data`,
//!   `binary_data_output`).
//! - [`metadata`]: server and model metadata, and Triton-shaped statistics.
//! - [`repository`]: the repository extension's load parameters.

pub mod codec;
pub mod json_data;
pub mod metadata;
pub mod repository;
pub mod types;

/// HTTP header that gives the length of the JSON part of a binary-extension body.
pub const HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

use bytes::Bytes;
use sheaf_backend::{DataType, Tensor};
use sheaf_core::{InferError, NamedTensor};

/// The datatype of byte strings (encoded images, labels).
pub const BYTES: &str = "BYTES";

/// Checks an input's wire datatype and shape; returns the type, the shape and its element count.
pub fn wire_shape(
    name: &str,
    datatype: &str,
    shape: &[i64],
) -> Result<(DataType, Vec<usize>, usize), InferError> {
    let dtype = DataType::parse(datatype).ok_or_else(|| {
        InferError::invalid(format!(
            "input '{name}' has unsupported datatype '{datatype}'"
        ))
    })?;
    let (dims, elements) = wire_dims(name, shape)?;
    Ok((dtype, dims, elements))
}

/// Checks an input's wire shape; returns it and its element count.
pub fn wire_dims(name: &str, shape: &[i64]) -> Result<(Vec<usize>, usize), InferError> {
    let dims = shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| {
            InferError::invalid(format!(
                "input '{name}' has a negative dimension in shape {shape:?}"
            ))
        })?;
    let elements = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            InferError::invalid(format!(
                "input '{name}' has an impossibly large shape {shape:?}"
            ))
        })?;
    Ok((dims, elements))
}

/// The strings of a JSON BYTES `data` array (nested as its shape, or flat), as bytes; it must
/// hold `elements` of them.
pub fn json_strings(name: &str, raw: &str, elements: usize) -> Result<Vec<Bytes>, InferError> {
    let value: serde_json::Value = serde_json::from_str(raw)
        .map_err(|e| InferError::invalid(format!("input '{name}': malformed data: {e}")))?;
    let mut out = Vec::new();
    let mut stack = vec![&value];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Array(items) => stack.extend(items.iter().rev()),
            serde_json::Value::String(s) => out.push(Bytes::copy_from_slice(s.as_bytes())),
            other => {
                return Err(InferError::invalid(format!(
                    "input '{name}' is BYTES: its data must be strings, not {}",
                    sheaf_core::clip(&other.to_string())
                )))
            }
        }
    }
    if out.len() != elements {
        return Err(InferError::invalid(format!(
            "input '{name}' has {} strings in 'data', but its shape needs {elements}",
            out.len()
        )));
    }
    Ok(out)
}

/// Builds a named input tensor, naming the input if its bytes do not fit its shape.
pub fn named_tensor(
    name: String,
    dtype: DataType,
    shape: Vec<usize>,
    data: Bytes,
) -> Result<NamedTensor, InferError> {
    let tensor = Tensor::new(dtype, shape, data)
        .map_err(|e| InferError::invalid(format!("input '{name}': {e}")))?;
    Ok(NamedTensor { name, tensor })
}
