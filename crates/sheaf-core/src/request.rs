//! Requests and responses in the scheduler's terms, and their validation.
//!
//! A protocol layer decodes the wire format into a [`RawRequest`] (named tensors whose byte
//! sizes already match their shapes). [`validate`] checks it against the model's signature and
//! yields an [`InferRequest`] whose inputs are in signature order, so a request that reaches a
//! queue can never fail a batch it shares with others.

use sheaf_backend::{Signature, Tensor};

use crate::InferError;

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
}

/// The outputs of one request, in the order they were asked for.
#[derive(Debug, Clone)]
pub struct InferResponse {
    pub id: Option<String>,
    pub model_name: String,
    pub model_version: String,
    pub outputs: Vec<NamedTensor>,
}

/// Checks `raw` against `signature`. With `batching`, dimension 0 of every input is the item
/// count (any positive number, equal across inputs); without it, shapes must match exactly.
pub fn validate(
    raw: RawRequest,
    signature: &Signature,
    batching: bool,
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
    let mut items: Option<(usize, &str)> = None;
    for (spec, slot) in signature.inputs.iter().zip(slots) {
        let tensor = slot.ok_or_else(|| {
            InferError::invalid(format!(
                "missing input '{}'; the model's inputs are {}",
                spec.name,
                expected()
            ))
        })?;
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
        items: items.map_or(1, |(n, _)| n),
        priority: raw.priority,
        timeout_us: raw.timeout_us,
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
        validate(r, &sig(), true).unwrap_err().message
    }

    #[test]
    fn orders_inputs_and_counts_items() {
        let ok = validate(
            raw(vec![input("b", vec![3, 7]), input("a", vec![3, 2])]),
            &sig(),
            true,
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
            false
        )
        .is_ok());
        assert!(validate(
            raw(vec![input("a", vec![1, 2]), input("b", vec![2, 1])]),
            &s,
            false
        )
        .is_err());
    }
}
