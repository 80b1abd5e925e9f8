//! A generation model over gRPC: a KServe request's tensors read as Triton's vLLM backend
//! reads them, and each answer written as its output tensors ([`crate::triton_text`]):
//! `text_output` (BYTES), and where asked for `finish_reason` (BYTES: `None` until an output
//! ends, as the backend writes it), `num_input_tokens` and `num_output_tokens` (UINT32),
//! `cumulative_logprob` (FP32) and `logprobs` (BYTES, JSON text), as raw contents: each of
//! shape `[n]`, an element per output (`num_input_tokens`: `[1]`).

use bytes::Bytes;
use sheaf_core::{InferError, ModelHandle};

use super::pb;
use super::pb::model_infer_response::InferOutputTensor;
use crate::triton_text::TextAnswer;

/// The response that carries `answer` to the request `id` of `handle`.
pub fn response(handle: &ModelHandle, id: &str, answer: TextAnswer) -> pb::ModelInferResponse {
    let mut outputs = Vec::new();
    let mut raw = Vec::new();
    let mut add = |name: &str, datatype: &str, elements: usize, data: Vec<u8>| {
        outputs.push(InferOutputTensor {
            name: name.to_string(),
            datatype: datatype.to_string(),
            shape: vec![elements as i64],
            ..Default::default()
        });
        raw.push(Bytes::from(data));
    };
    // BYTES elements: each a 4-byte length, then its bytes.
    let texts = |items: &[&str]| {
        let mut data = Vec::with_capacity(items.iter().map(|s| 4 + s.len()).sum());
        for s in items {
            data.extend_from_slice(&(s.len() as u32).to_le_bytes());
            data.extend_from_slice(s.as_bytes());
        }
        (items.len(), data)
    };
    let counts = |items: &[usize]| {
        let data = items.iter().flat_map(|&n| (n as u32).to_le_bytes());
        (items.len(), data.collect::<Vec<u8>>())
    };
    let text: Vec<&str> = answer.texts.iter().map(String::as_str).collect();
    let (n, data) = texts(&text);
    add("text_output", "BYTES", n, data);
    if let Some(reasons) = &answer.finish_reasons {
        let reasons: Vec<&str> = reasons.iter().map(|r| r.unwrap_or("None")).collect();
        let (n, data) = texts(&reasons);
        add("finish_reason", "BYTES", n, data);
    }
    if let Some(tokens) = answer.num_input_tokens {
        let (n, data) = counts(&[tokens]);
        add("num_input_tokens", "UINT32", n, data);
    }
    if let Some(tokens) = &answer.num_output_tokens {
        let (n, data) = counts(tokens);
        add("num_output_tokens", "UINT32", n, data);
    }
    if let Some(sums) = &answer.cumulative_logprobs {
        let data = sums.iter().flat_map(|&sum| (sum as f32).to_le_bytes());
        add("cumulative_logprob", "FP32", sums.len(), data.collect());
    }
    if let Some(logprobs) = &answer.logprobs {
        let logprobs: Vec<&str> = logprobs.iter().map(String::as_str).collect();
        let (n, data) = texts(&logprobs);
        add("logprobs", "BYTES", n, data);
    }
    pb::ModelInferResponse {
        model_name: handle.name.clone(),
        model_version: handle.version.clone(),
        id: id.to_string(),
        outputs,
        raw_output_contents: raw,
        ..Default::default()
    }
}

/// What a unary call (`ModelInfer`) with `stream: true` is told.
pub fn unary_stream() -> InferError {
    InferError::invalid(
        "stream: true sends the text as it comes, in several responses: send the request on a \
         gRPC stream (ModelStreamInfer)",
    )
}
