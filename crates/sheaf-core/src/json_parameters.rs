//! A request's parameters in KServe's JSON form (a JSON object), read with the errors every
//! JSON protocol gives: typed getters, and the sequence a request belongs to. The HTTP codec
//! reads a body's parameters with them, and a model's own requests (Python's business logic
//! scripting) theirs, so that both spell and check `priority`, `timeout` and the sequence
//! parameters alike.

use serde_json::{Map, Value};

use crate::request::{SequenceFlags, SequenceId};
use crate::InferError;

/// `key` of `params` as a non-negative integer; none when absent. `owner` names the request or
/// tensor in the error.
pub fn param_u64(
    params: &Option<Map<String, Value>>,
    key: &str,
    owner: &str,
) -> Result<Option<u64>, InferError> {
    param(params, key, Value::as_u64, |v| {
        format!("'{owner}': parameter '{key}' must be a non-negative integer, got {v}")
    })
}

/// `key` of `params` as true or false; none when absent.
pub fn param_bool(
    params: &Option<Map<String, Value>>,
    key: &str,
    owner: &str,
) -> Result<Option<bool>, InferError> {
    param(params, key, Value::as_bool, |v| {
        format!("{owner}: parameter '{key}' must be true or false, got {v}")
    })
}

/// `key` of `params` read by `read`; none when absent, `wrong`'s message when it reads nothing.
fn param<T>(
    params: &Option<Map<String, Value>>,
    key: &str,
    read: impl Fn(&Value) -> Option<T>,
    wrong: impl Fn(&Value) -> String,
) -> Result<Option<T>, InferError> {
    match params.as_ref().and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(v) => read(v)
            .map(Some)
            .ok_or_else(|| InferError::invalid(wrong(v))),
    }
}

/// The request's sequence parameters: `sequence_id` (an integer or a string), with
/// `sequence_start` and `sequence_end`; none without an id (flags alone are an error).
pub fn sequence_flags(
    params: &Option<Map<String, Value>>,
) -> Result<Option<SequenceFlags>, InferError> {
    let owner = "the request";
    let start = param_bool(params, "sequence_start", owner)?;
    let end = param_bool(params, "sequence_end", owner)?;
    let id = match params.as_ref().and_then(|p| p.get("sequence_id")) {
        None => None,
        Some(Value::String(s)) => Some(SequenceId::Text(s.clone())),
        Some(v) => Some(SequenceId::Number(v.as_u64().ok_or_else(|| {
            InferError::invalid(format!(
                "{owner}: parameter 'sequence_id' must be a non-negative integer or a string, got {v}"
            ))
        })?)),
    };
    match id {
        Some(id) if !id.is_none() => Ok(Some(SequenceFlags {
            id,
            start: start.unwrap_or(false),
            end: end.unwrap_or(false),
        })),
        _ if start == Some(true) || end == Some(true) => Err(InferError::invalid(
            "sequence_start and sequence_end need a sequence_id (a non-zero integer or a non-empty string)",
        )),
        _ => Ok(None),
    }
}
