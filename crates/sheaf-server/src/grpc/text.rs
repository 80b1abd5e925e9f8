//! A generation model over gRPC: a KServe request's tensors read as Triton's vLLM backend
//! reads them, and each answer written as its output tensors ([`crate::triton_text`]):
//! `text_output` (BYTES), and where asked for `finish_reason` (BYTES: `None` until the last
//! answer, as the backend writes it), `num_input_tokens` and `num_output_tokens` (UINT32) and
//! `cumulative_logprob` (FP32) and `logprobs` (BYTES, JSON text), each of shape `[1]`, as raw
//! contents.

use bytes::Bytes;
use sheaf_core::{InferError, ModelHandle};

use super::pb;
use super::pb::model_infer_response::InferOutputTensor;
use crate::triton_text::TextAnswer;

/// The response that carries `answer` to the request `id` of `handle`.
pub fn response(handle: &ModelHandle, id: &str, answer: TextAnswer) -> pb::ModelInferResponse {
    let mut outputs = Vec::new();
    let mut raw = Vec::new();
    let mut add = |name: &str, datatype: &str, data: Vec<u8>| {
        outputs.push(InferOutputTensor {
            name: name.to_string(),
            datatype: datatype.to_string(),
            shape: vec![1],
            ..Default::default()
        });
        raw.push(Bytes::from(data));
    };
    let text = |s: &str| {
        let mut data = Vec::with_capacity(4 + s.len());
        data.extend_from_slice(&(s.len() as u32).to_le_bytes());
        data.extend_from_slice(s.as_bytes());
        data
    };
    add("text_output", "BYTES", text(&answer.text));
    if let Some(reason) = answer.finish_reason {
        add("finish_reason", "BYTES", text(reason.unwrap_or("None")));
    }
    if let Some(n) = answer.num_input_tokens {
        add(
            "num_input_tokens",
            "UINT32",
            (n as u32).to_le_bytes().to_vec(),
        );
    }
    if let Some(n) = answer.num_output_tokens {
        add(
            "num_output_tokens",
            "UINT32",
            (n as u32).to_le_bytes().to_vec(),
        );
    }
    if let Some(sum) = answer.cumulative_logprob {
        add(
            "cumulative_logprob",
            "FP32",
            (sum as f32).to_le_bytes().to_vec(),
        );
    }
    if let Some(logprobs) = &answer.logprobs {
        add("logprobs", "BYTES", text(logprobs));
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
