//! Requests and responses in the scheduler's terms, and their validation.
//!
//! A protocol layer decodes the wire format into a [`RawRequest`] (named tensors whose byte
//! sizes already match their shapes). [`validate`] checks it against the model's signature and
//! yields an [`InferRequest`] whose inputs are in signature order, so a request that reaches a
//! queue can never fail a batch it shares with others.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use sheaf_backend::{Signature, Tensor};

use crate::InferError;

/// A BYTES tensor: one byte string per element (an encoded image, a label), in C order.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub items: Vec<Bytes>,
}

impl ByteTensor {
    /// The binary form the KServe protocols use: each element as its length (4 bytes, little
    /// endian), then its bytes.
    pub fn to_wire(&self) -> Bytes {
        let size = self.items.iter().map(|i| 4 + i.len()).sum();
        let mut out = BytesMut::with_capacity(size);
        for item in &self.items {
            out.put_u32_le(item.len() as u32);
            out.put_slice(item);
        }
        out.freeze()
    }

    /// Reads the binary form of `shape`'s elements from `data` (which must hold exactly
    /// them); the elements share `data`'s bytes.
    pub fn from_wire(
        name: String,
        shape: Vec<usize>,
        data: &Bytes,
    ) -> Result<ByteTensor, InferError> {
        let count = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                InferError::invalid(format!("input '{name}': its shape is too large"))
            })?;
        // Each element takes at least its 4-byte length: a count past that is refused before
        // anything is allocated.
        if count > data.len() / 4 {
            return Err(InferError::invalid(format!(
                "input '{name}': shape {shape:?} needs {count} BYTES elements, but {} bytes \
                 cannot hold them",
                data.len()
            )));
        }
        let mut items = Vec::with_capacity(count);
        let mut at = 0usize;
        for i in 0..count {
            let Some(len) = data.get(at..at + 4) else {
                return Err(InferError::invalid(format!(
                    "input '{name}': element {i} has no length (the data ends at byte {at})"
                )));
            };
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            at += 4;
            if len > data.len() - at {
                return Err(InferError::invalid(format!(
                    "input '{name}': element {i} declares {len} bytes, but only {} remain",
                    data.len() - at
                )));
            }
            items.push(data.slice(at..at + len));
            at += len;
        }
        if at != data.len() {
            return Err(InferError::invalid(format!(
                "input '{name}': {} bytes follow the last of its {count} elements",
                data.len() - at
            )));
        }
        Ok(ByteTensor { name, shape, items })
    }
}

/// A tensor with its protocol name.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub tensor: Tensor,
}

/// A decoded, not yet validated request.
#[derive(Debug, Clone, Default)]
pub struct RawRequest {
    /// Client-chosen id, echoed in the response.
    pub id: Option<String>,
    pub inputs: Vec<NamedTensor>,
    /// Outputs to return, by name; `None` returns them all.
    pub outputs: Option<Vec<String>>,
    /// The `priority` request parameter: 1 is the highest level; 0 or none, the model's default.
    pub priority: Option<u64>,
    /// The `timeout` request parameter, in microseconds: the request must start within it.
    pub timeout_us: Option<u64>,
    /// BYTES inputs: encoded images for the model's `image_inputs`.
    pub byte_inputs: Vec<ByteTensor>,
    /// Outputs to return as their top K classes (Triton's classification extension), by name.
    pub classification: Vec<(String, usize)>,
    /// The request's place in a sequence (`sequence_id`, `sequence_start`, `sequence_end`), for
    /// a stateful model; see [`crate::sequence`].
    pub sequence: Option<SequenceFlags>,
    /// The request's other parameters, those sheaf does not read itself ([`RESERVED`]), for a
    /// model that reads them (Triton's `request.parameters()`); none when there are none.
    pub parameters: Option<Parameters>,
    /// The pipelines this request runs a step of, outermost first; empty for a client's
    /// request. A pipeline that would run inside itself is refused.
    pub within: Vec<String>,
    /// While requests are traced: where the accounts of the requests its model sends on its
    /// behalf go, for its trace (see [`sheaf_backend::caller`]); none otherwise.
    pub calls: Option<sheaf_backend::TraceCalls>,
}

/// A request's parameters by name, as KServe's JSON spells them.
pub type Parameters = Arc<serde_json::Map<String, serde_json::Value>>;

/// The request parameters sheaf reads itself, which a model is not given.
pub const RESERVED: [&str; 6] = [
    "priority",
    "timeout",
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "binary_data_output",
];

/// `parameters` less the [`RESERVED`] ones; none when nothing is left.
pub fn model_parameters(
    parameters: impl IntoIterator<Item = (String, serde_json::Value)>,
) -> Option<Parameters> {
    let kept: serde_json::Map<String, serde_json::Value> = parameters
        .into_iter()
        .filter(|(k, _)| !RESERVED.contains(&k.as_str()))
        .collect();
    (!kept.is_empty()).then(|| Arc::new(kept))
}

/// A sequence's correlation id, as Triton's clients send it: an integer or a string. 0 and the
/// empty string mean "no sequence".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SequenceId {
    Number(u64),
    Text(String),
}

impl SequenceId {
    /// Whether the id names no sequence (0 or "").
    pub fn is_none(&self) -> bool {
        match self {
            SequenceId::Number(n) => *n == 0,
            SequenceId::Text(t) => t.is_empty(),
        }
    }
}

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SequenceId::Number(n) => write!(f, "{n}"),
            SequenceId::Text(t) => write!(f, "'{t}'"),
        }
    }
}

/// The sequence parameters of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFlags {
    pub id: SequenceId,
    /// The request opens the sequence: its state starts from the initial value.
    pub start: bool,
    /// The request closes the sequence: its state is freed after it.
    pub end: bool,
}

/// A request that fits its model.
#[derive(Debug, Clone)]
pub struct InferRequest {
    pub id: Option<String>,
    /// One tensor per model input, in signature order.
    pub inputs: Vec<Tensor>,
    /// Indices into the signature's outputs of the outputs to return.
    pub outputs: Vec<usize>,
    /// Items along dimension 0 (1 for a model without batching).
    pub items: usize,
    pub priority: Option<u64>,
    pub timeout_us: Option<u64>,
    /// See [`RawRequest::parameters`].
    pub parameters: Option<Parameters>,
    /// Indices into the signature's inputs of the optional inputs the request left out; each
    /// holds an empty stand-in in `inputs` (see [`validate`]).
    pub absent: Vec<usize>,
    /// See [`RawRequest::calls`].
    pub calls: Option<sheaf_backend::TraceCalls>,
}

/// The outputs of one request, in the order they were asked for.
#[derive(Debug, Clone)]
pub struct InferResponse {
    pub id: Option<String>,
    pub model_name: String,
    pub model_version: String,
    pub outputs: Vec<NamedTensor>,
    /// BYTES outputs: encoded images, or classes (`score:index:label`).
    pub byte_outputs: Vec<ByteTensor>,
    /// The account of the request's time, for the protocol that writes the answer to close
    /// (see [`crate::stages`]); a pipeline's holds its model steps'; none for answers that no
    /// batcher made (the response cache, streams, tests).
    pub receipt: Option<crate::stages::Receipt>,
    /// The parameters the model put in its answer (Triton's
    /// `InferenceResponse(parameters=...)`), which each protocol writes beside the outputs.
    pub parameters: Option<Parameters>,
}

/// Checks `raw` against `signature`. With `batching`, dimension 0 of every input is the item
/// count (any positive number, equal across inputs); without it, shapes must match exactly.
/// An input whose `optional` entry is true may be left out (Triton's optional inputs): its
/// place in the request's inputs holds an empty stand-in (no bytes; `[items, 0]` with
/// batching, `[0]` without), and its index is listed in [`InferRequest::absent`]. A request
/// carries at least one input.
pub fn validate(
    raw: RawRequest,
    signature: &Signature,
    batching: bool,
    optional: &[bool],
) -> Result<InferRequest, InferError> {
    let expected = || {
        signature
            .inputs
            .iter()
            .map(|s| format!("'{}'", s.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut slots: Vec<Option<Tensor>> = vec![None; signature.inputs.len()];
    for input in raw.inputs {
        let Some(i) = signature.inputs.iter().position(|s| s.name == input.name) else {
            return Err(InferError::invalid(format!(
                "unexpected input '{}'; the model's inputs are {}",
                input.name,
                expected()
            )));
        };
        if slots[i].is_some() {
            return Err(InferError::invalid(format!(
                "input '{}' given twice",
                input.name
            )));
        }
        slots[i] = Some(input.tensor);
    }
    let mut inputs = Vec::with_capacity(slots.len());
    let mut absent = Vec::new();
    let mut items: Option<(usize, &str)> = None;
    for (k, (spec, slot)) in signature.inputs.iter().zip(slots).enumerate() {
        let Some(tensor) = slot else {
            if optional.get(k).copied().unwrap_or(false) {
                absent.push(k);
                continue;
            }
            return Err(InferError::invalid(format!(
                "missing input '{}'; the model's inputs are {}",
                spec.name,
                expected()
            )));
        };
        if tensor.dtype() != spec.dtype {
            return Err(InferError::invalid(format!(
                "input '{}' has datatype {}, but the model expects {}",
                spec.name,
                tensor.dtype(),
                spec.dtype
            )));
        }
        let shape = tensor.shape();
        let fits = shape.len() == spec.shape.len()
            && shape
                .iter()
                .zip(&spec.shape)
                .enumerate()
                .all(|(d, (&got, &want))| (batching && d == 0) || want < 0 || got as i64 == want);
        if !fits {
            return Err(InferError::invalid(format!(
                "input '{}' has shape {:?}, but the model expects {:?}{}",
                spec.name,
                shape,
                spec.shape,
                if batching {
                    " (-1: any size; dimension 0 is the batch)"
                } else {
                    " (-1: any size)"
                }
            )));
        }
        if batching {
            let n = tensor.items();
            if n == 0 {
                return Err(InferError::invalid(format!(
                    "input '{}' has no items: its first dimension is 0",
                    spec.name
                )));
            }
            match items {
                Some((m, other)) if m != n => {
                    return Err(InferError::invalid(format!(
                    "inputs disagree on the batch dimension: '{other}' has {m} items, '{}' has {n}",
                    spec.name
                )))
                }
                _ => items = Some((n, &spec.name)),
            }
        }
        inputs.push(tensor);
    }
    if inputs.is_empty() && !absent.is_empty() {
        return Err(InferError::invalid(format!(
            "the request carries no input; the model's inputs are {}, of which it needs at least one",
            expected()
        )));
    }
    let count = items.map_or(1, |(n, _)| n);
    for &k in &absent {
        let spec = &signature.inputs[k];
        let shape = if batching { vec![count, 0] } else { vec![0] };
        let stand_in = Tensor::new(spec.dtype, shape, Bytes::new())
            .map_err(|e| InferError::invalid(format!("input '{}': {e}", spec.name)))?;
        inputs.insert(k, stand_in);
    }
    let outputs = match raw.outputs {
        None => (0..signature.outputs.len()).collect(),
        Some(names) => names
            .iter()
            .map(|name| {
                signature
                    .outputs
                    .iter()
                    .position(|s| &s.name == name)
                    .ok_or_else(|| {
                        InferError::invalid(format!(
                            "unknown output '{name}'; the model's outputs are {}",
                            signature
                                .outputs
                                .iter()
                                .map(|s| format!("'{}'", s.name))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(InferRequest {
        id: raw.id,
        inputs,
        outputs,
        items: count,
        priority: raw.priority,
        timeout_us: raw.timeout_us,
        parameters: raw.parameters,
        absent,
        calls: raw.calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sheaf_backend::{DataType, TensorSpec};

    fn sig() -> Signature {
        let spec = |name: &str, shape: Vec<i64>| TensorSpec {
            name: name.into(),
            dtype: DataType::F32,
            shape,
        };
        Signature {
            inputs: vec![spec("a", vec![-1, 2]), spec("b", vec![-1, -1])],
            outputs: vec![spec("y", vec![-1, 2]), spec("z", vec![-1])],
        }
    }

    fn input(name: &str, shape: Vec<usize>) -> NamedTensor {
        let n: usize = shape.iter().product();
        NamedTensor {
            name: name.into(),
            tensor: Tensor::new(DataType::F32, shape, Bytes::from(vec![0u8; n * 4])).unwrap(),
        }
    }

    fn raw(inputs: Vec<NamedTensor>) -> RawRequest {
        RawRequest {
            inputs,
            ..Default::default()
        }
    }

    fn err(r: RawRequest) -> String {
        validate(r, &sig(), true, &[]).unwrap_err().message
    }

    #[test]
    fn orders_inputs_and_counts_items() {
        let ok = validate(
            raw(vec![input("b", vec![3, 7]), input("a", vec![3, 2])]),
            &sig(),
            true,
            &[],
        )
        .unwrap();
        assert_eq!(ok.items, 3);
        assert_eq!(ok.inputs[0].shape(), &[3, 2]);
        assert_eq!(ok.outputs, vec![0, 1]);
    }

    #[test]
    fn names_what_is_wrong() {
        assert!(err(raw(vec![input("a", vec![1, 2])])).contains("missing input 'b'"));
        assert!(err(raw(vec![input("c", vec![1, 2])])).contains("unexpected input 'c'"));
        assert!(
            err(raw(vec![input("a", vec![1, 3]), input("b", vec![1, 1])]))
                .contains("input 'a' has shape [1, 3]")
        );
        assert!(
            err(raw(vec![input("a", vec![2, 2]), input("b", vec![3, 1])]))
                .contains("disagree on the batch dimension")
        );
        assert!(
            err(raw(vec![input("a", vec![0, 2]), input("b", vec![0, 1])])).contains("no items")
        );
        let mut r = raw(vec![input("a", vec![1, 2]), input("b", vec![1, 1])]);
        r.outputs = Some(vec!["q".into()]);
        assert!(err(r).contains("unknown output 'q'"));
        let wrong_type = NamedTensor {
            name: "a".into(),
            tensor: Tensor::new(DataType::I32, vec![1, 2], Bytes::from(vec![0u8; 8])).unwrap(),
        };
        assert!(err(raw(vec![wrong_type, input("b", vec![1, 1])]))
            .contains("datatype INT32, but the model expects FP32"));
    }

    #[test]
    fn without_batching_the_first_dimension_must_match() {
        let mut s = sig();
        s.inputs[0].shape = vec![2, 2];
        s.inputs[1].shape = vec![2, 1];
        assert!(validate(
            raw(vec![input("a", vec![2, 2]), input("b", vec![2, 1])]),
            &s,
            false,
            &[]
        )
        .is_ok());
        assert!(validate(
            raw(vec![input("a", vec![1, 2]), input("b", vec![2, 1])]),
            &s,
            false,
            &[]
        )
        .is_err());
    }

    #[test]
    fn an_optional_input_may_be_left_out() {
        // 'b' optional: left out, it holds an empty stand-in of the request's items.
        let ok = validate(
            raw(vec![input("a", vec![3, 2])]),
            &sig(),
            true,
            &[false, true],
        )
        .unwrap();
        assert_eq!(ok.items, 3);
        assert_eq!(ok.absent, vec![1]);
        assert_eq!(ok.inputs.len(), 2);
        assert_eq!(ok.inputs[1].shape(), &[3, 0]);
        assert!(ok.inputs[1].data().is_empty());
        // Given, it is checked as any input is.
        let given = validate(
            raw(vec![input("a", vec![3, 2]), input("b", vec![3, 1])]),
            &sig(),
            true,
            &[false, true],
        )
        .unwrap();
        assert!(given.absent.is_empty());
        assert!(validate(
            raw(vec![input("a", vec![3, 2]), input("b", vec![2, 1])]),
            &sig(),
            true,
            &[false, true]
        )
        .is_err());
        // A required input is still required, and a request needs one input at least.
        let missing = validate(
            raw(vec![input("b", vec![1, 1])]),
            &sig(),
            true,
            &[false, true],
        );
        assert!(missing.unwrap_err().message.contains("missing input 'a'"));
        let none = validate(raw(vec![]), &sig(), true, &[true, true]).unwrap_err();
        assert!(
            none.message.contains("carries no input"),
            "{}",
            none.message
        );
        // Without batching the stand-in has no items either.
        let mut s = sig();
        s.inputs[0].shape = vec![2, 2];
        let flat = validate(raw(vec![input("a", vec![2, 2])]), &s, false, &[false, true]).unwrap();
        assert_eq!(flat.inputs[1].shape(), &[0]);
    }
}
