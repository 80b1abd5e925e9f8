//! gRPC inference messages to and from the scheduler's types.
//!
//! Inputs arrive as `raw_input_contents` (one entry per input, in input order) or as typed
//! `contents`. Outputs go back the way the inputs came: raw when the request was raw, typed
//! when it was typed (as long as every output's datatype has a typed field; FP16 and BF16 have
//! none, so such responses are raw).

use bytes::Bytes;
use sheaf_backend::DataType;
use sheaf_core::request::{SequenceFlags, SequenceId};
use sheaf_core::{ByteTensor, InferError, InferResponse, RawRequest};

use super::pb;
use crate::kserve::{named_tensor, wire_dims, wire_shape, BYTES};
use crate::shm::{Placement, SharedMemory};

/// A decoded gRPC inference request (its model is looked up before it is decoded).
#[derive(Debug)]
pub struct Decoded {
    pub request: RawRequest,
    /// Whether outputs should travel as typed contents rather than raw bytes.
    pub typed: bool,
    /// Outputs to write into shared-memory regions.
    pub shm_outputs: Vec<(String, Placement)>,
}

/// Where an input's data comes from.
enum Source {
    Bytes(Bytes),
    Typed(pb::InferTensorContents),
}

/// Decodes a request. Raw contents go, in order, to the inputs that take neither typed contents
/// nor a shared-memory region (as tritonclient sends them).
pub fn decode(req: pb::ModelInferRequest, shm: &SharedMemory) -> Result<Decoded, InferError> {
    let raw = req.raw_input_contents;
    let mut next_raw = 0;
    let mut inputs = Vec::with_capacity(req.inputs.len());
    let mut byte_inputs = Vec::new();
    let count = req.inputs.len();
    for input in req.inputs {
        let source = match (shm_param(&input.parameters, &input.name)?, input.contents) {
            (Some(_), Some(_)) => {
                return Err(InferError::invalid(format!(
                    "input '{}' names a shared-memory region, and also carries contents",
                    input.name
                )))
            }
            (Some(at), None) => Source::Bytes(shm.read(&at)?),
            (None, Some(_)) if !raw.is_empty() => {
                return Err(InferError::invalid(format!(
                    "input '{}' has typed contents, but the request also uses raw_input_contents",
                    input.name
                )))
            }
            (None, Some(contents)) => Source::Typed(contents),
            (None, None) => match raw.get(next_raw) {
                Some(bytes) => {
                    next_raw += 1;
                    Source::Bytes(bytes.clone())
                }
                None => {
                    return Err(InferError::invalid(format!(
                        "input '{}' has neither contents nor raw_input_contents",
                        input.name
                    )))
                }
            },
        };
        if input.datatype == BYTES {
            let (shape, elements) = wire_dims(&input.name, &input.shape)?;
            let items = match source {
                Source::Bytes(bytes) => {
                    ByteTensor::from_wire(input.name.clone(), shape.clone(), &bytes)?.items
                }
                Source::Typed(c) if c.bytes_contents.len() == elements => c.bytes_contents,
                Source::Typed(c) => {
                    return Err(InferError::invalid(format!(
                        "input '{}' has {} values in contents.bytes_contents, but its shape \
                         needs {elements}",
                        input.name,
                        c.bytes_contents.len()
                    )))
                }
            };
            byte_inputs.push(ByteTensor {
                name: input.name,
                shape,
                items,
            });
            continue;
        }
        let (dtype, shape, elements) = wire_shape(&input.name, &input.datatype, &input.shape)?;
        let data = match source {
            Source::Bytes(bytes) => bytes,
            Source::Typed(contents) => typed_to_bytes(&input.name, dtype, &contents, elements)?,
        };
        inputs.push(named_tensor(input.name, dtype, shape, data)?);
    }
    if next_raw != raw.len() {
        return Err(InferError::invalid(format!(
            "raw_input_contents has {} entries, but the request has {count} inputs ({next_raw} \
             of them take raw contents)",
            raw.len()
        )));
    }
    let mut classification = Vec::new();
    let mut in_shm = Vec::new();
    for o in &req.outputs {
        if let Some(k) = param_u64(&o.parameters, "classification")? {
            classification.push((o.name.clone(), k as usize));
        }
        if let Some(at) = shm_param(&o.parameters, &o.name)? {
            in_shm.push((o.name.clone(), at));
        }
    }
    let outputs =
        (!req.outputs.is_empty()).then(|| req.outputs.into_iter().map(|o| o.name).collect());
    Ok(Decoded {
        request: RawRequest {
            id: (!req.id.is_empty()).then_some(req.id),
            inputs,
            outputs,
            priority: param_u64(&req.parameters, "priority")?,
            timeout_us: param_u64(&req.parameters, "timeout")?,
            byte_inputs,
            classification,
            sequence: sequence_flags(&req.parameters)?,
            parameters: sheaf_core::model_parameters(
                req.parameters
                    .into_iter()
                    .filter_map(|(k, p)| Some((k, json_of(p)?))),
            ),
            // A client's request runs inside no pipeline.
            within: Vec::new(),
            calls: None,
        },
        typed: raw.is_empty(),
        shm_outputs: in_shm,
    })
}

/// Encodes a response. Outputs placed in shared memory are written there and carry only their
/// region and size (with an empty raw entry, so that raw contents stay in output order).
pub fn encode(
    response: InferResponse,
    typed: bool,
    shm_outputs: &[(String, Placement)],
    shm: &SharedMemory,
) -> Result<pb::ModelInferResponse, InferError> {
    let typed = typed
        && response
            .outputs
            .iter()
            .all(|o| !matches!(o.tensor.dtype(), DataType::F16 | DataType::BF16));
    let placed = |name: &str, data: &[u8]| -> Result<Option<_>, InferError> {
        let Some((_, at)) = shm_outputs.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        shm.write_at(at, name, data)?;
        let string = |s: &str| pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::StringParam(s.into())),
        };
        let int = |v: u64| pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(v as i64)),
        };
        Ok(Some(std::collections::HashMap::from([
            ("shared_memory_region".to_string(), string(&at.region)),
            (
                "shared_memory_byte_size".to_string(),
                int(data.len() as u64),
            ),
        ])))
    };
    let mut raw = Vec::new();
    let mut outputs = Vec::with_capacity(response.outputs.len() + response.byte_outputs.len());
    for o in response.outputs {
        let t = o.tensor;
        let (parameters, contents) = match placed(&o.name, t.data())? {
            Some(p) => {
                if !typed {
                    raw.push(Bytes::new());
                }
                (p, None)
            }
            None if typed => (
                Default::default(),
                Some(bytes_to_typed(t.dtype(), t.data())),
            ),
            None => {
                raw.push(t.data().clone());
                (Default::default(), None)
            }
        };
        outputs.push(pb::model_infer_response::InferOutputTensor {
            name: o.name,
            datatype: t.dtype().as_str().to_string(),
            shape: t.shape().iter().map(|&d| d as i64).collect(),
            parameters,
            contents,
        });
    }
    // BYTES outputs: each element as its length and its bytes when raw, else bytes_contents.
    for o in response.byte_outputs {
        let wire = o.to_wire();
        let (parameters, contents) = match placed(&o.name, &wire)? {
            Some(p) => {
                if !typed {
                    raw.push(Bytes::new());
                }
                (p, None)
            }
            None if typed => (
                Default::default(),
                Some(pb::InferTensorContents {
                    bytes_contents: o.items.clone(),
                    ..Default::default()
                }),
            ),
            None => {
                raw.push(wire);
                (Default::default(), None)
            }
        };
        outputs.push(pb::model_infer_response::InferOutputTensor {
            name: o.name,
            datatype: BYTES.to_string(),
            shape: o.shape.iter().map(|&d| d as i64).collect(),
            parameters,
            contents,
        });
    }
    Ok(pb::ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version,
        id: response.id.unwrap_or_default(),
        parameters: response
            .parameters
            .as_deref()
            .map(response_parameters)
            .unwrap_or_default(),
        outputs,
        raw_output_contents: raw,
    })
}

/// A model's response parameters as gRPC's: booleans, integers (unsigned above `i64`'s
/// range), doubles and strings as themselves, anything else as its JSON text.
fn response_parameters(
    map: &serde_json::Map<String, serde_json::Value>,
) -> std::collections::HashMap<String, pb::InferParameter> {
    use pb::infer_parameter::ParameterChoice;
    use serde_json::Value;
    map.iter()
        .map(|(key, value)| {
            let choice = match value {
                Value::Bool(b) => ParameterChoice::BoolParam(*b),
                Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => ParameterChoice::Int64Param(i),
                    (None, Some(u), _) => ParameterChoice::Uint64Param(u),
                    (_, _, Some(f)) => ParameterChoice::DoubleParam(f),
                    _ => ParameterChoice::StringParam(n.to_string()),
                },
                Value::String(s) => ParameterChoice::StringParam(s.clone()),
                other => ParameterChoice::StringParam(other.to_string()),
            };
            let parameter = pb::InferParameter {
                parameter_choice: Some(choice),
            };
            (key.clone(), parameter)
        })
        .collect()
}

/// Where a tensor's data is in shared memory (the `shared_memory_region`,
/// `shared_memory_byte_size` and `shared_memory_offset` parameters), if it names a region.
fn shm_param(
    params: &std::collections::HashMap<String, pb::InferParameter>,
    owner: &str,
) -> Result<Option<Placement>, InferError> {
    use pb::infer_parameter::ParameterChoice;
    let region = match params
        .get("shared_memory_region")
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => return Ok(None),
        Some(ParameterChoice::StringParam(s)) => s.clone(),
        Some(other) => {
            return Err(InferError::invalid(format!(
                "'{owner}': parameter 'shared_memory_region' must be a string, got {other:?}"
            )))
        }
    };
    let byte_size = param_u64(params, "shared_memory_byte_size")?.ok_or_else(|| {
        InferError::invalid(format!(
            "'{owner}': shared_memory_region needs shared_memory_byte_size"
        ))
    })?;
    Ok(Some(Placement {
        region,
        offset: param_u64(params, "shared_memory_offset")?.unwrap_or(0),
        byte_size,
    }))
}

/// The sequence a request belongs to, read without decoding its tensors: what a gateway needs
/// to route it (see `crate::broker`).
pub fn sequence_of(request: &pb::ModelInferRequest) -> Result<Option<SequenceFlags>, InferError> {
    sequence_flags(&request.parameters)
}

/// The request's sequence parameters: `sequence_id` (int64, uint64 or string) with
/// `sequence_start` and `sequence_end` (bool); none without an id (flags alone are an error).
fn sequence_flags(
    params: &std::collections::HashMap<String, pb::InferParameter>,
) -> Result<Option<SequenceFlags>, InferError> {
    use pb::infer_parameter::ParameterChoice;
    let flag = |key: &str| match params.get(key).and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(false),
        Some(ParameterChoice::BoolParam(b)) => Ok(*b),
        Some(other) => Err(InferError::invalid(format!(
            "parameter '{key}' must be a bool, got {other:?}"
        ))),
    };
    let (start, end) = (flag("sequence_start")?, flag("sequence_end")?);
    let id = match params
        .get("sequence_id")
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => None,
        Some(ParameterChoice::StringParam(s)) => Some(SequenceId::Text(s.clone())),
        Some(ParameterChoice::Uint64Param(v)) => Some(SequenceId::Number(*v)),
        Some(ParameterChoice::Int64Param(v)) if *v >= 0 => Some(SequenceId::Number(*v as u64)),
        Some(other) => {
            return Err(InferError::invalid(format!(
                "parameter 'sequence_id' must be a non-negative integer or a string, got {other:?}"
            )))
        }
    };
    match id {
        Some(id) if !id.is_none() => Ok(Some(SequenceFlags { id, start, end })),
        _ if start || end => Err(InferError::invalid(
            "sequence_start and sequence_end need a sequence_id (a non-zero integer or a non-empty string)",
        )),
        _ => Ok(None),
    }
}

/// A request parameter as KServe's JSON spells it; none when it holds no value.
fn json_of(parameter: pb::InferParameter) -> Option<serde_json::Value> {
    use pb::infer_parameter::ParameterChoice;
    Some(match parameter.parameter_choice? {
        ParameterChoice::BoolParam(b) => b.into(),
        ParameterChoice::Int64Param(v) => v.into(),
        ParameterChoice::Uint64Param(v) => v.into(),
        ParameterChoice::StringParam(s) => s.into(),
        ParameterChoice::DoubleParam(v) => serde_json::Number::from_f64(v)?.into(),
    })
}

/// A non-negative integer request parameter (`int64_param` or `uint64_param`).
fn param_u64(
    params: &std::collections::HashMap<String, pb::InferParameter>,
    key: &str,
) -> Result<Option<u64>, InferError> {
    use pb::infer_parameter::ParameterChoice;
    match params.get(key).and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(ParameterChoice::Uint64Param(v)) => Ok(Some(*v)),
        Some(ParameterChoice::Int64Param(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(other) => Err(InferError::invalid(format!(
            "parameter '{key}' must be a non-negative integer, got {other:?}"
        ))),
    }
}

/// Packs the typed field that holds `dtype` into little-endian bytes.
fn typed_to_bytes(
    name: &str,
    dtype: DataType,
    c: &pb::InferTensorContents,
    elements: usize,
) -> Result<Bytes, InferError> {
    let count = |n: usize, field: &str| {
        if n == elements {
            Ok(())
        } else {
            Err(InferError::invalid(format!(
                "input '{name}' has {n} values in contents.{field}, but its shape needs {elements}"
            )))
        }
    };
    macro_rules! pack {
        ($field:ident, $t:ty) => {{
            count(c.$field.len(), stringify!($field))?;
            let mut out = Vec::with_capacity(elements * std::mem::size_of::<$t>());
            for &v in &c.$field {
                let x = <$t>::try_from(v).map_err(|_| {
                    InferError::invalid(format!(
                        "input '{name}': value {v} is out of range for {dtype}"
                    ))
                })?;
                out.extend_from_slice(&x.to_le_bytes());
            }
            out
        }};
    }
    let bytes = match dtype {
        DataType::Bool => {
            count(c.bool_contents.len(), "bool_contents")?;
            c.bool_contents.iter().map(|&b| u8::from(b)).collect()
        }
        DataType::I8 => pack!(int_contents, i8),
        DataType::I16 => pack!(int_contents, i16),
        DataType::I32 => pack!(int_contents, i32),
        DataType::I64 => pack!(int64_contents, i64),
        DataType::U8 => pack!(uint_contents, u8),
        DataType::U16 => pack!(uint_contents, u16),
        DataType::U32 => pack!(uint_contents, u32),
        DataType::U64 => pack!(uint64_contents, u64),
        DataType::F32 => pack!(fp32_contents, f32),
        DataType::F64 => pack!(fp64_contents, f64),
        DataType::F16 | DataType::BF16 => {
            return Err(InferError::invalid(format!(
                "input '{name}' is {dtype}, which travels only in raw_input_contents"
            )))
        }
        // BYTES inputs are read apart, into byte strings.
        DataType::Bytes => {
            return Err(InferError::invalid(format!(
                "input '{name}': BYTES travel in bytes_contents"
            )))
        }
    };
    Ok(Bytes::from(bytes))
}

/// Unpacks little-endian bytes into the typed field for `dtype` (not FP16/BF16).
fn bytes_to_typed(dtype: DataType, data: &[u8]) -> pb::InferTensorContents {
    let mut c = pb::InferTensorContents::default();
    macro_rules! unpack {
        ($field:ident, $t:ty, $to:ty) => {
            c.$field = data
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|b| {
                    let mut a = [0u8; std::mem::size_of::<$t>()];
                    a.copy_from_slice(b);
                    <$to>::from(<$t>::from_le_bytes(a))
                })
                .collect()
        };
    }
    match dtype {
        DataType::Bool => c.bool_contents = data.iter().map(|&b| b != 0).collect(),
        DataType::I8 => unpack!(int_contents, i8, i32),
        DataType::I16 => unpack!(int_contents, i16, i32),
        DataType::I32 => unpack!(int_contents, i32, i32),
        DataType::I64 => unpack!(int64_contents, i64, i64),
        DataType::U8 => unpack!(uint_contents, u8, u32),
        DataType::U16 => unpack!(uint_contents, u16, u32),
        DataType::U32 => unpack!(uint_contents, u32, u32),
        DataType::U64 => unpack!(uint64_contents, u64, u64),
        DataType::F32 => unpack!(fp32_contents, f32, f32),
        DataType::F64 => unpack!(fp64_contents, f64, f64),
        // BYTES answers are rendered apart, as byte strings.
        DataType::F16 | DataType::BF16 | DataType::Bytes => {}
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::model_infer_request::InferInputTensor;

    fn request(datatype: &str, contents: pb::InferTensorContents) -> pb::ModelInferRequest {
        pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![InferInputTensor {
                name: "x".into(),
                datatype: datatype.into(),
                shape: vec![1, 3],
                contents: Some(contents),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_model_is_given_the_parameters_sheaf_does_not_read() {
        use pb::infer_parameter::ParameterChoice;
        let mut req = request(
            "FP32",
            pb::InferTensorContents {
                fp32_contents: vec![1.0, 2.0, 3.0],
                ..Default::default()
            },
        );
        let param = |c| pb::InferParameter {
            parameter_choice: Some(c),
        };
        req.parameters = [
            ("priority", param(ParameterChoice::Uint64Param(1))),
            ("tag", param(ParameterChoice::StringParam("blue".into()))),
            ("t", param(ParameterChoice::DoubleParam(0.5))),
            ("n", param(ParameterChoice::Int64Param(-3))),
            ("greedy", param(ParameterChoice::BoolParam(true))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let decoded = decode(req, &SharedMemory::default()).unwrap();
        assert_eq!(decoded.request.priority, Some(1));
        let given = serde_json::Value::Object(decoded.request.parameters.unwrap().as_ref().clone());
        assert_eq!(
            given,
            serde_json::json!({"tag": "blue", "t": 0.5, "n": -3, "greedy": true})
        );
        // Without parameters of its own, a model is given none.
        let plain = request(
            "FP32",
            pb::InferTensorContents {
                fp32_contents: vec![1.0, 2.0, 3.0],
                ..Default::default()
            },
        );
        let decoded = decode(plain, &SharedMemory::default()).unwrap();
        assert!(decoded.request.parameters.is_none());
    }

    #[test]
    fn typed_contents_round_trip_for_every_typed_dtype() {
        let cases = [
            (
                "INT8",
                pb::InferTensorContents {
                    int_contents: vec![-128, 0, 127],
                    ..Default::default()
                },
            ),
            (
                "UINT16",
                pb::InferTensorContents {
                    uint_contents: vec![0, 1, 65535],
                    ..Default::default()
                },
            ),
            (
                "INT64",
                pb::InferTensorContents {
                    int64_contents: vec![i64::MIN, 0, i64::MAX],
                    ..Default::default()
                },
            ),
            (
                "UINT64",
                pb::InferTensorContents {
                    uint64_contents: vec![0, 1, u64::MAX],
                    ..Default::default()
                },
            ),
            (
                "FP32",
                pb::InferTensorContents {
                    fp32_contents: vec![0.5, -1.0, 3.25],
                    ..Default::default()
                },
            ),
            (
                "FP64",
                pb::InferTensorContents {
                    fp64_contents: vec![0.1, -1.0, 1e300],
                    ..Default::default()
                },
            ),
            (
                "BOOL",
                pb::InferTensorContents {
                    bool_contents: vec![true, false, true],
                    ..Default::default()
                },
            ),
        ];
        for (datatype, contents) in cases {
            let d = decode(
                request(datatype, contents.clone()),
                &SharedMemory::default(),
            )
            .unwrap();
            assert!(d.typed);
            let tensor = &d.request.inputs[0].tensor;
            assert_eq!(
                bytes_to_typed(tensor.dtype(), tensor.data()),
                contents,
                "{datatype}"
            );
        }
    }

    #[test]
    fn bad_contents_are_named() {
        let c = pb::InferTensorContents {
            int_contents: vec![1, 2, 300],
            ..Default::default()
        };
        let e = decode(request("UINT8", c.clone()), &SharedMemory::default()).unwrap_err();
        assert!(
            e.message.contains("3 values in contents.uint_contents")
                || e.message.contains("0 values"),
            "{e}"
        );
        let e = decode(request("INT8", c), &SharedMemory::default()).unwrap_err();
        assert!(e.message.contains("300 is out of range for INT8"), "{e}");
        let e = decode(
            request("FP32", pb::InferTensorContents::default()),
            &SharedMemory::default(),
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("0 values in contents.fp32_contents, but its shape needs 3"),
            "{e}"
        );
        let mut r = request("FP32", pb::InferTensorContents::default());
        r.inputs[0].contents = None;
        r.raw_input_contents = vec![Bytes::from(vec![0u8; 12]), Bytes::new()];
        assert!(decode(r, &SharedMemory::default())
            .unwrap_err()
            .message
            .contains("2 entries, but the request has 1 inputs"));
    }
}
