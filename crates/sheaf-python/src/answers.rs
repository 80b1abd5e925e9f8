//! Tensors placed in shared memory, read back as the server's tensors: a model's answers and
//! each response a streaming model sends, checked against its signature.

use serde_json::Value;
use sheaf_backend::{Answer, BackendError, DataType, Signature, Tensor};

/// Where each tensor in a region starts: a multiple of this.
pub(crate) const ALIGN: usize = 64;

/// Tensors placed in a region (`{"name", "datatype", "shape", "offset", "nbytes"}` each),
/// copied out; `what` names them in errors ("output", "input").
pub(crate) fn read_placed(
    region: &[u8],
    placed: &[Value],
    what: &str,
) -> Result<Vec<(String, Tensor)>, String> {
    placed
        .iter()
        .map(|p| {
            let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
            let datatype = p.get("datatype").and_then(Value::as_str).unwrap_or_default();
            let dtype = DataType::parse_any(datatype)
                .ok_or_else(|| {
                    format!("{what} '{name}': the model returned {datatype}, not a tensor type sheaf serves")
                })?;
            let shape: Vec<usize> = p
                .get("shape")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
                .unwrap_or_default();
            let offset = p.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
            let nbytes = p.get("nbytes").and_then(Value::as_u64).unwrap_or(0) as usize;
            let bytes = offset
                .checked_add(nbytes)
                .and_then(|end| region.get(offset..end))
                .ok_or_else(|| format!("{what} '{name}' lies outside shared memory"))?;
            let tensor = Tensor::new(dtype, shape, bytes::Bytes::copy_from_slice(bytes))
                .map_err(|e| format!("{what} '{name}': {e}"))?;
            Ok((name.to_string(), tensor))
        })
        .collect()
}

/// One response: its outputs, copied out of the output region, in signature order, and the
/// parameters the model gave it.
pub(crate) fn read_answer(
    region: &[u8],
    response: &Value,
    signature: &Signature,
) -> Result<Answer, BackendError> {
    let outputs = read_outputs(region, response, signature)?;
    let parameters = response
        .get("parameters")
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
        .cloned();
    Ok(Answer {
        outputs,
        parameters,
    })
}

/// One response's outputs, copied out of the output region, in signature order.
fn read_outputs(
    region: &[u8],
    response: &Value,
    signature: &Signature,
) -> Result<Vec<Tensor>, BackendError> {
    let placed = response
        .get("outputs")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let bad = |m: String| BackendError::Runtime(m);
    signature
        .outputs
        .iter()
        .map(|spec| {
            let p = placed
                .iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(spec.name.as_str()))
                .ok_or_else(|| {
                    let given: Vec<&str> = placed
                        .iter()
                        .filter_map(|p| p.get("name").and_then(Value::as_str))
                        .collect();
                    bad(format!(
                        "the model returned no output '{}' (it returned {given:?})",
                        spec.name
                    ))
                })?;
            let (_, tensor) = read_placed(region, std::slice::from_ref(p), "output")
                .map_err(bad)?
                .pop()
                .ok_or_else(|| bad(format!("output '{}' was not read", spec.name)))?;
            if tensor.dtype() != spec.dtype {
                return Err(bad(format!(
                    "output '{}': the model returned {}; it declares {}",
                    spec.name,
                    tensor.dtype().as_str(),
                    spec.dtype.as_str()
                )));
            }
            Ok(tensor)
        })
        .collect()
}

/// The error of a response the model answered with (`{"error", "code"}`), by Triton's code:
/// `INVALID_ARG` is the client's input (400 / `INVALID_ARGUMENT`), `UNAVAILABLE` a model that
/// cannot serve now (503 / `UNAVAILABLE`), any other a failure of the model (500 / `INTERNAL`).
pub(crate) fn response_error(response: &Value) -> BackendError {
    let message = response
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("the model answered with an error")
        .to_string();
    match response.get("code").and_then(Value::as_str) {
        Some("INVALID_ARG") => BackendError::InvalidInput(message),
        Some("UNAVAILABLE") => BackendError::Unavailable(message),
        _ => BackendError::Runtime(message),
    }
}
