//! Whole inference requests and responses: JSON tensors and the binary tensor data extension.
//!
//! With the extension, a body is a JSON header of `Inference-Header-Content-Length` bytes
//! followed by the raw tensor bytes of every input whose `parameters.binary_data_size` is set,
//! in input order. Binary input bytes become tensors without a copy (they share the body).
//! A response carries an output in binary when the output's `parameters.binary_data` says so,
//! or, failing that, when the request's `parameters.binary_data_output` is true.
//!
//! BYTES tensors (encoded images in, encoded images or classes out) are strings in JSON, and in
//! binary each element is its 4-byte little-endian length, then its bytes. A BYTES output that is
//! not text (an encoded image) always goes as binary data. An output asked for with
//! `parameters.classification: K` comes back as its K best classes (Triton's classification
//! extension). Triton's system shared-memory extension: an input's `shared_memory_region`,
//! `shared_memory_byte_size` and `shared_memory_offset` name where its bytes are instead of
//! `data`, and an output's name where its bytes go ([`crate::shm`]).

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Map, Value};
use sheaf_core::json_parameters::{param_bool, param_u64, sequence_flags};
use sheaf_core::request::SequenceFlags;
use sheaf_core::{ByteTensor, InferError, InferResponse, RawRequest};

use super::json_data::{self, DataView};
use super::types::{InferRequestBody, InferResponseBody, OutputData, OutputTensor};
use super::{json_strings, named_tensor, wire_dims, wire_shape, BYTES};
use crate::shm::{Placement, SharedMemory};

/// A decoded request and how its outputs are to be returned.
#[derive(Debug)]
pub struct DecodedRequest {
    pub request: RawRequest,
    pub binary: BinaryOutputs,
}

/// Which outputs go back as binary data, and which into shared memory.
#[derive(Debug, Clone, Default)]
pub struct BinaryOutputs {
    /// The request-level default (`parameters.binary_data_output`).
    pub default: bool,
    /// Per-output choices (`outputs[].parameters.binary_data`).
    pub by_name: Vec<(String, bool)>,
    /// Outputs written into a shared-memory region (`outputs[].parameters.shared_memory_*`).
    pub shm: Vec<(String, Placement)>,
}

impl BinaryOutputs {
    fn in_shm(&self, name: &str) -> Option<&Placement> {
        self.shm.iter().find(|(n, _)| n == name).map(|(_, at)| at)
    }

    fn is_binary(&self, name: &str) -> bool {
        self.by_name
            .iter()
            .find(|(n, _)| n == name)
            .map_or(self.default, |(_, b)| *b)
    }
}

/// An encoded response body, and the JSON header length when binary data follows it.
#[derive(Debug)]
pub struct EncodedResponse {
    pub body: Bytes,
    pub header_length: Option<usize>,
}

/// Where an input's data comes from.
enum Source<'a> {
    Bytes(Bytes),
    Json(&'a str),
}

/// Decodes an inference request body. `header_length` is the `Inference-Header-Content-Length`
/// header's value, if the request had one.
pub fn decode_request(
    body: Bytes,
    header_length: Option<usize>,
    shm: &SharedMemory,
) -> Result<DecodedRequest, InferError> {
    let json_len = header_length.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(InferError::invalid(format!(
            "Inference-Header-Content-Length is {json_len}, but the body has only {} bytes",
            body.len()
        )));
    }
    let parsed: InferRequestBody = serde_json::from_slice(&body[..json_len])
        .map_err(|e| InferError::invalid(format!("malformed request JSON: {e}")))?;
    let mut binary = body.slice(json_len..);
    let mut inputs = Vec::with_capacity(parsed.inputs.len());
    let mut byte_inputs = Vec::new();
    for input in parsed.inputs {
        let binary_size = param_u64(&input.parameters, "binary_data_size", &input.name)?;
        let in_shm = shm_placement(&input.parameters, &input.name)?;
        // The input's bytes (binary data or shared memory), or its JSON `data`.
        let source = match (binary_size, &input.data, in_shm) {
            (Some(_), Some(_), _) => {
                return Err(InferError::invalid(format!(
                    "input '{}' has both 'data' and 'binary_data_size'",
                    input.name
                )))
            }
            (None, None, None) => {
                return Err(InferError::invalid(format!(
                    "input '{}' has neither 'data' nor 'binary_data_size'",
                    input.name
                )))
            }
            (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => {
                return Err(InferError::invalid(format!(
                    "input '{}' names a shared-memory region, and also carries its data",
                    input.name
                )))
            }
            (Some(size), None, None) => {
                let size = size as usize;
                if size > binary.len() {
                    return Err(InferError::invalid(format!(
                        "input '{}' declares binary_data_size {size}, but only {} bytes of binary data remain",
                        input.name,
                        binary.len()
                    )));
                }
                Source::Bytes(binary.split_to(size))
            }
            (None, None, Some(at)) => Source::Bytes(shm.read(&at)?),
            (None, Some(json), None) => Source::Json(json.get()),
        };
        if input.datatype == BYTES {
            let (shape, elements) = wire_dims(&input.name, &input.shape)?;
            let items = match source {
                Source::Bytes(data) => {
                    ByteTensor::from_wire(input.name.clone(), shape.clone(), &data)?.items
                }
                Source::Json(json) => json_strings(&input.name, json, elements)?,
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
            Source::Bytes(data) => data,
            Source::Json(json) => {
                let bytes = json_data::parse(json, dtype, &shape)
                    .map_err(|e| InferError::invalid(format!("input '{}': {e}", input.name)))?;
                let got = bytes.len() / dtype.size();
                if got != elements {
                    return Err(InferError::invalid(format!(
                        "input '{}' has {got} elements in 'data', but shape {:?} needs {elements}",
                        input.name, shape
                    )));
                }
                Bytes::from(bytes)
            }
        };
        inputs.push(named_tensor(input.name, dtype, shape, data)?);
    }
    if !binary.is_empty() {
        return Err(InferError::invalid(format!(
            "{} bytes of binary data are not claimed by any input's binary_data_size",
            binary.len()
        )));
    }
    let default =
        param_bool(&parsed.parameters, "binary_data_output", "the request")?.unwrap_or(false);
    let mut by_name = Vec::new();
    let mut in_shm = Vec::new();
    let mut classification = Vec::new();
    let outputs = match parsed.outputs {
        None => None,
        Some(list) => {
            let mut names = Vec::with_capacity(list.len());
            for out in list {
                if let Some(b) = param_bool(&out.parameters, "binary_data", &out.name)? {
                    by_name.push((out.name.clone(), b));
                }
                if let Some(k) = param_u64(&out.parameters, "classification", &out.name)? {
                    classification.push((out.name.clone(), k as usize));
                }
                if let Some(at) = shm_placement(&out.parameters, &out.name)? {
                    in_shm.push((out.name.clone(), at));
                }
                names.push(out.name);
            }
            Some(names)
        }
    };
    Ok(DecodedRequest {
        request: RawRequest {
            id: parsed.id,
            inputs,
            outputs,
            priority: param_u64(&parsed.parameters, "priority", "the request")?,
            timeout_us: param_u64(&parsed.parameters, "timeout", "the request")?,
            byte_inputs,
            classification,
            sequence: sequence_flags(&parsed.parameters)?,
            parameters: parsed.parameters.and_then(sheaf_core::model_parameters),
            // A client's request runs inside no pipeline.
            within: Vec::new(),
            calls: None,
        },
        binary: BinaryOutputs {
            default,
            by_name,
            shm: in_shm,
        },
    })
}

/// Encodes a response: JSON only, or a JSON header followed by binary outputs. Outputs placed
/// in shared memory are written there, and carry only their region and size.
pub fn encode_response(
    response: &InferResponse,
    binary: &BinaryOutputs,
    shm: &SharedMemory,
) -> Result<EncodedResponse, InferError> {
    let mut tail: Vec<Bytes> = Vec::new();
    let mut outputs: Vec<OutputTensor> = Vec::with_capacity(response.outputs.len());
    let placed = |name: &str, data: &[u8]| -> Result<Option<Value>, InferError> {
        let Some(at) = binary.in_shm(name) else {
            return Ok(None);
        };
        shm.write_at(at, name, data)?;
        Ok(Some(json!({
            "shared_memory_region": at.region,
            "shared_memory_byte_size": data.len(),
        })))
    };
    for o in &response.outputs {
        let dtype = o.tensor.dtype();
        let (parameters, data) = if let Some(p) = placed(&o.name, o.tensor.data())? {
            (Some(p), None)
        } else if binary.is_binary(&o.name) {
            tail.push(o.tensor.data().clone());
            let size = o.tensor.data().len();
            (Some(json!({ "binary_data_size": size })), None)
        } else {
            let view = DataView {
                dtype,
                bytes: o.tensor.data(),
            };
            (None, Some(OutputData::Numbers(view)))
        };
        outputs.push(OutputTensor {
            name: &o.name,
            datatype: dtype.as_str(),
            shape: o.tensor.shape(),
            parameters,
            data,
        });
    }
    for o in &response.byte_outputs {
        // Strings go inline unless binary data is asked for; other bytes (encoded images)
        // cannot be JSON strings, and always go as binary data.
        let strings: Option<Vec<&str>> = o
            .items
            .iter()
            .map(|i| std::str::from_utf8(i).ok())
            .collect();
        let wire = o.to_wire();
        let (parameters, data) = match strings {
            _ if binary.in_shm(&o.name).is_some() => (placed(&o.name, &wire)?, None),
            Some(strings) if !binary.is_binary(&o.name) => {
                (None, Some(OutputData::Strings(strings)))
            }
            _ => {
                let size = wire.len();
                tail.push(wire);
                (Some(json!({ "binary_data_size": size })), None)
            }
        };
        outputs.push(OutputTensor {
            name: &o.name,
            datatype: BYTES,
            shape: &o.shape,
            parameters,
            data,
        });
    }
    let body = InferResponseBody {
        model_name: &response.model_name,
        model_version: &response.model_version,
        id: response.id.as_deref(),
        parameters: response.parameters.as_deref(),
        outputs,
    };
    let header = serde_json::to_vec(&body)
        .map_err(|e| InferError::internal(format!("cannot encode response: {e}")))?;
    if tail.is_empty() {
        return Ok(EncodedResponse {
            body: Bytes::from(header),
            header_length: None,
        });
    }
    let header_length = header.len();
    let mut out =
        BytesMut::with_capacity(header_length + tail.iter().map(|b| b.len()).sum::<usize>());
    out.put_slice(&header);
    for data in tail {
        out.put_slice(&data);
    }
    Ok(EncodedResponse {
        body: out.freeze(),
        header_length: Some(header_length),
    })
}

/// Where a tensor's data is in shared memory (`shared_memory_region`, `shared_memory_byte_size`
/// and `shared_memory_offset`), if it names a region.
fn shm_placement(
    params: &Option<Map<String, Value>>,
    owner: &str,
) -> Result<Option<Placement>, InferError> {
    let Some(region) = params.as_ref().and_then(|p| p.get("shared_memory_region")) else {
        return Ok(None);
    };
    let region = region.as_str().ok_or_else(|| {
        InferError::invalid(format!(
            "'{owner}': parameter 'shared_memory_region' must be a string"
        ))
    })?;
    let byte_size = param_u64(params, "shared_memory_byte_size", owner)?.ok_or_else(|| {
        InferError::invalid(format!(
            "'{owner}': shared_memory_region needs shared_memory_byte_size"
        ))
    })?;
    Ok(Some(Placement {
        region: region.to_string(),
        offset: param_u64(params, "shared_memory_offset", owner)?.unwrap_or(0),
        byte_size,
    }))
}

/// The sequence a request body belongs to, read without decoding its tensors: what a gateway
/// needs to route it (see `crate::broker`). A body that does not mention `sequence_` is not
/// parsed at all.
pub fn sequence_of(
    body: &[u8],
    header_length: Option<usize>,
) -> Result<Option<SequenceFlags>, InferError> {
    #[derive(serde::Deserialize)]
    struct Parameters {
        #[serde(default)]
        parameters: Option<Map<String, Value>>,
    }
    let json = body
        .get(..header_length.unwrap_or(body.len()))
        .unwrap_or(body);
    if !json.windows(b"sequence_".len()).any(|w| w == b"sequence_") {
        return Ok(None);
    }
    let parsed: Parameters = serde_json::from_slice(json)
        .map_err(|e| InferError::invalid(format!("malformed request JSON: {e}")))?;
    sequence_flags(&parsed.parameters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_backend::{DataType, Tensor};
    use sheaf_core::request::SequenceId;
    use sheaf_core::NamedTensor;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn sequence_parameters_decode_and_flags_alone_are_refused() {
        let flags = |params: &str| {
            let body = format!(
                r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"FP32","data":[1]}}],"parameters":{params}}}"#
            );
            let decoded = decode_request(Bytes::from(body.clone()), None, &SharedMemory::default())
                .map(|d| d.request.sequence);
            // A gateway reads the same flags without decoding the tensors.
            let peeked = sequence_of(body.as_bytes(), None);
            assert_eq!(
                decoded.as_ref().map_err(|e| e.message.clone()),
                peeked.as_ref().map_err(|e| e.message.clone())
            );
            decoded
        };
        let seq = flags(r#"{"sequence_id":7,"sequence_start":true}"#).unwrap();
        assert_eq!(
            seq,
            Some(SequenceFlags {
                id: SequenceId::Number(7),
                start: true,
                end: false
            })
        );
        let seq = flags(r#"{"sequence_id":"cam-1","sequence_end":true}"#).unwrap();
        assert_eq!(
            seq,
            Some(SequenceFlags {
                id: SequenceId::Text("cam-1".into()),
                start: false,
                end: true
            })
        );
        assert_eq!(flags(r#"{"priority":1}"#).unwrap(), None);
        // 0 names no sequence, as in Triton's clients.
        assert_eq!(flags(r#"{"sequence_id":0}"#).unwrap(), None);
        for bad in [
            r#"{"sequence_start":true}"#,
            r#"{"sequence_id":0,"sequence_end":true}"#,
            r#"{"sequence_id":-3}"#,
            r#"{"sequence_id":1.5}"#,
            r#"{"sequence_id":1,"sequence_start":"yes"}"#,
        ] {
            let e = flags(bad).unwrap_err();
            assert_eq!(
                e.kind,
                sheaf_core::ErrorKind::InvalidInput,
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn json_request_decodes() {
        let body = r#"{"id":"r1","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}],
                      "outputs":[{"name":"y","parameters":{"binary_data":true}}]}"#;
        let d = decode_request(Bytes::from(body), None, &SharedMemory::default()).unwrap();
        assert_eq!(d.request.id.as_deref(), Some("r1"));
        assert_eq!(
            d.request.inputs[0].tensor.data().as_ref(),
            f32_bytes(&[1., 2., 3., 4.]).as_slice()
        );
        assert_eq!(d.request.outputs, Some(vec!["y".to_string()]));
        assert!(d.binary.is_binary("y"));
        assert!(!d.binary.is_binary("z"));
    }

    #[test]
    fn binary_request_decodes_in_input_order() {
        let header = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":4}},
                                   {"name":"b","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}}],
                         "parameters":{"binary_data_output":true}}"#;
        let mut body = header.as_bytes().to_vec();
        body.extend(f32_bytes(&[1.0, 2.0, 3.0]));
        let d = decode_request(
            Bytes::from(body),
            Some(header.len()),
            &SharedMemory::default(),
        )
        .unwrap();
        assert_eq!(
            d.request.inputs[0].tensor.data().as_ref(),
            f32_bytes(&[1.0]).as_slice()
        );
        assert_eq!(
            d.request.inputs[1].tensor.data().as_ref(),
            f32_bytes(&[2.0, 3.0]).as_slice()
        );
        assert!(d.binary.default);
    }

    #[test]
    fn size_mismatches_are_named() {
        let header = r#"{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;
        let mut body = header.as_bytes().to_vec();
        body.extend(f32_bytes(&[1.0]));
        let e = decode_request(
            Bytes::from(body.clone()),
            Some(header.len()),
            &SharedMemory::default(),
        )
        .unwrap_err();
        assert!(
            e.message.contains("only 4 bytes of binary data remain"),
            "{e}"
        );
        body.extend(f32_bytes(&[1.0, 2.0]));
        let e = decode_request(
            Bytes::from(body),
            Some(header.len()),
            &SharedMemory::default(),
        )
        .unwrap_err();
        assert!(e.message.contains("not claimed"), "{e}");
        let e = decode_request(Bytes::from("{}"), Some(99), &SharedMemory::default()).unwrap_err();
        assert!(
            e.message.contains("Inference-Header-Content-Length is 99"),
            "{e}"
        );
        let json = r#"{"inputs":[{"name":"a","shape":[3],"datatype":"FP32","data":[1,2]}]}"#;
        let e = decode_request(Bytes::from(json), None, &SharedMemory::default()).unwrap_err();
        assert!(
            e.message
                .contains("has 2 elements in 'data', but shape [3] needs 3"),
            "{e}"
        );
        let json = r#"{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;
        let e = decode_request(Bytes::from(json), None, &SharedMemory::default()).unwrap_err();
        assert!(e.message.contains("only 0 bytes"), "{e}");
        let e = decode_request(
            Bytes::from("{\"inputs\": ["),
            None,
            &SharedMemory::default(),
        )
        .unwrap_err();
        assert!(e.message.starts_with("malformed request JSON"), "{e}");
    }

    #[test]
    fn binary_response_appends_bytes_after_the_header() {
        let tensor =
            Tensor::new(DataType::F32, vec![2], Bytes::from(f32_bytes(&[5.0, 6.0]))).unwrap();
        let response = InferResponse {
            id: Some("q".into()),
            model_name: "m".into(),
            model_version: "1".into(),
            outputs: vec![NamedTensor {
                name: "y".into(),
                tensor,
            }],
            byte_outputs: vec![],
            receipt: None,
            parameters: None,
        };
        let json_only = encode_response(
            &response,
            &BinaryOutputs::default(),
            &SharedMemory::default(),
        )
        .unwrap();
        assert_eq!(json_only.header_length, None);
        let v: Value = serde_json::from_slice(&json_only.body).unwrap();
        assert_eq!(v["outputs"][0]["data"], json!([5.0, 6.0]));
        assert_eq!(v["id"], "q");

        let bin = encode_response(
            &response,
            &BinaryOutputs {
                default: true,
                ..BinaryOutputs::default()
            },
            &SharedMemory::default(),
        )
        .unwrap();
        let n = bin.header_length.unwrap();
        let v: Value = serde_json::from_slice(&bin.body[..n]).unwrap();
        assert_eq!(v["outputs"][0]["parameters"]["binary_data_size"], 8);
        assert!(v["outputs"][0].get("data").is_none());
        assert_eq!(&bin.body[n..], f32_bytes(&[5.0, 6.0]).as_slice());
    }

    #[test]
    fn bytes_inputs_decode_from_json_strings_and_binary_elements() {
        let mut wire = Vec::new();
        for item in [&b"\xff\xd8jpeg"[..], b"png!"] {
            wire.extend_from_slice(&(item.len() as u32).to_le_bytes());
            wire.extend_from_slice(item);
        }
        let header = json!({"inputs": [
            {"name": "img", "shape": [2], "datatype": "BYTES",
             "parameters": {"binary_data_size": wire.len()}},
            {"name": "tag", "shape": [1, 2], "datatype": "BYTES", "data": [["a", "bc"]]},
        ], "outputs": [{"name": "logits", "parameters": {"classification": 3}}]})
        .to_string();
        let mut body = header.clone().into_bytes();
        body.extend_from_slice(&wire);
        let d = decode_request(
            Bytes::from(body),
            Some(header.len()),
            &SharedMemory::default(),
        )
        .unwrap();
        let r = d.request;
        assert_eq!(r.byte_inputs[0].items, [&b"\xff\xd8jpeg"[..], b"png!"]);
        assert_eq!(r.byte_inputs[1].items, [&b"a"[..], b"bc"]);
        assert_eq!(r.byte_inputs[1].shape, [1, 2]);
        assert_eq!(r.classification, [("logits".to_string(), 3)]);
        for (bad, says) in [
            (
                json!({"inputs": [{"name": "t", "shape": [2], "datatype": "BYTES", "data": ["a"]}]}),
                "needs 2",
            ),
            (
                json!({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": [3]}]}),
                "must be strings",
            ),
            (
                json!({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES",
                                "parameters": {"binary_data_size": 2}}]}),
                "cannot hold",
            ),
        ] {
            let text = bad.to_string();
            let mut body = text.clone().into_bytes();
            body.extend_from_slice(b"\x09\x00");
            let header = bad["inputs"][0]["parameters"]
                .is_object()
                .then_some(text.len());
            let body = if header.is_some() {
                body
            } else {
                text.into_bytes()
            };
            let e =
                decode_request(Bytes::from(body), header, &SharedMemory::default()).unwrap_err();
            assert!(e.message.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn bytes_outputs_are_strings_inline_and_images_binary() {
        let response = InferResponse {
            id: None,
            model_name: "m".into(),
            model_version: "1".into(),
            outputs: vec![],
            byte_outputs: vec![
                ByteTensor {
                    name: "classes".into(),
                    shape: vec![1, 1],
                    items: vec![Bytes::from_static(b"0.9:282:tiger cat")],
                },
                ByteTensor {
                    name: "image".into(),
                    shape: vec![1],
                    items: vec![Bytes::from_static(b"\x89PNG\xff")],
                },
            ],
            receipt: None,
            parameters: None,
        };
        let out = encode_response(
            &response,
            &BinaryOutputs::default(),
            &SharedMemory::default(),
        )
        .unwrap();
        let n = out.header_length.unwrap();
        let v: Value = serde_json::from_slice(&out.body[..n]).unwrap();
        assert_eq!(v["outputs"][0]["datatype"], "BYTES");
        assert_eq!(v["outputs"][0]["data"], json!(["0.9:282:tiger cat"]));
        assert_eq!(v["outputs"][1]["parameters"]["binary_data_size"], 4 + 5);
        assert_eq!(&out.body[n..], b"\x05\x00\x00\x00\x89PNG\xff");
    }
}
