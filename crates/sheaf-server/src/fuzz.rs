//! Fuzzing of everything that reads what a client sends: the KServe JSON decoder, the binary
//! tensor extension, the gRPC request conversion (from raw protobuf bytes), and OpenAI request
//! parsing. Each target mutates the checked-in corpus (`tests/corpus/http.jsonl`, plus valid
//! requests) with `proptest` and runs for `SHEAF_FUZZ_SECONDS` (3 by default;
//! `scripts/test.sh` gives 60).
//!
//! The property: no input panics or aborts, and every refusal is the client's fault
//! (`InvalidInput`, a 400), never an internal error. An input that breaks it is printed, and
//! written to `target/fuzz-failures/`, to become a regression test.

use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;
use serde_json::Value;
use sheaf_core::ErrorKind;

use crate::grpc::{convert, pb};
use crate::kserve::codec;
use crate::openai::wire::{ChatRequest, CompletionRequest};

/// How long each target runs.
fn budget() -> Duration {
    let seconds = std::env::var("SHEAF_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(seconds)
}

/// The bodies of the checked-in corpus whose path starts with `prefix`, with valid ones.
fn seeds(prefix: &str, valid: &[&str]) -> Vec<Vec<u8>> {
    let corpus = include_str!("../tests/corpus/http.jsonl");
    let mut out: Vec<Vec<u8>> = valid.iter().map(|s| s.as_bytes().to_vec()).collect();
    for line in corpus.lines() {
        let Ok(case) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let path = case["path"].as_str().unwrap_or("");
        if let (true, Some(body)) = (path.starts_with(prefix), case["body"].as_str()) {
            out.push(body.as_bytes().to_vec());
        }
    }
    out
}

/// A seed with up to 12 edits: bytes overwritten, inserted or removed, a tail cut, or a run of
/// digits put in (the sizes and counts a request declares).
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        any::<prop::sample::Index>(),
        0u8..5,
        any::<u8>(),
        1usize..24,
    );
    (
        prop::sample::select(seeds),
        prop::collection::vec(edit, 0..12),
    )
        .prop_map(|(mut s, edits)| {
            for (at, kind, byte, run) in edits {
                let i = at.index(s.len() + 1);
                match kind {
                    0 if i < s.len() => s[i] = byte,
                    1 => s.insert(i, byte),
                    2 if i < s.len() => {
                        s.remove(i);
                    }
                    3 => s.truncate(i),
                    _ => {
                        let digits: Vec<u8> = (0..run)
                            .map(|k| b'0' + (byte as usize + k) as u8 % 10)
                            .collect();
                        s.splice(i..i, digits);
                    }
                }
            }
            s
        })
}

/// Runs `check` on values of `strategy` until the budget is spent; a panic is reported with the
/// input that caused it.
fn fuzz<S: Strategy>(target: &str, strategy: S, check: impl Fn(&S::Value))
where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config::default());
    let deadline = Instant::now() + budget();
    let mut runs = 0u64;
    while Instant::now() < deadline {
        let value = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree.current(),
            Err(e) => panic!("{target}: cannot make an input: {e}"),
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&value)));
        if outcome.is_err() {
            let dir =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(
                dir.join(format!("{target}-{runs}.txt")),
                format!("{value:?}"),
            );
            panic!("{target}: input {runs} failed: {value:?}");
        }
        runs += 1;
    }
    assert!(runs > 0, "{target}: no input ran");
    eprintln!("{target}: {runs} inputs");
}

fn client_fault(target: &str, result: Result<(), sheaf_core::InferError>) {
    if let Err(e) = result {
        assert_eq!(
            e.kind,
            ErrorKind::InvalidInput,
            "{target}: a refusal that is not a 400: {}",
            e.message
        );
        assert!(!e.message.is_empty(), "{target}: an empty message");
    }
}

const VALID_JSON: &str = r#"{"id":"a","inputs":[{"name":"input","datatype":"FP32","shape":[2,3],"data":[[1,2,3],[4,5,6]]}],"outputs":[{"name":"output","parameters":{"binary_data":true}}],"parameters":{"priority":1,"timeout":100}}"#;
const VALID_INT: &str = r#"{"inputs":[{"name":"a","datatype":"INT8","shape":[4],"data":[1,-2,3,127]},{"name":"b","datatype":"BOOL","shape":[2],"data":[true,false]},{"name":"c","datatype":"FP16","shape":[1],"data":[0.5]}]}"#;

#[test]
fn kserve_json_decoder() {
    fuzz(
        "kserve_json",
        mutated(seeds("/v2/", &[VALID_JSON, VALID_INT])),
        |body| {
            client_fault(
                "kserve_json",
                codec::decode_request(Bytes::from(body.clone()), None, &Default::default())
                    .map(|_| ()),
            )
        },
    );
}

#[test]
fn kserve_binary_extension_decoder() {
    let header = r#"{"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}},{"name":"n","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}}],"parameters":{"binary_data_output":true}}"#;
    let mut seed = header.as_bytes().to_vec();
    seed.extend_from_slice(&[0u8; 32]);
    let strategy = (mutated(vec![seed]), 0usize..400);
    fuzz("kserve_binary", strategy, |(body, header_length)| {
        let length = (*header_length).min(body.len() + 8);
        client_fault(
            "kserve_binary",
            codec::decode_request(Bytes::from(body.clone()), Some(length), &Default::default())
                .map(|_| ()),
        )
    });
}

fn grpc_seeds() -> Vec<Vec<u8>> {
    use pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
    let input = |name: &str, datatype: &str, shape: Vec<i64>| InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        ..Default::default()
    };
    let raw = pb::ModelInferRequest {
        model_name: "mlp".into(),
        id: "1".into(),
        inputs: vec![
            input("input", "FP32", vec![1, 4]),
            input("b", "UINT8", vec![3]),
        ],
        raw_input_contents: vec![Bytes::from(vec![0u8; 16]), Bytes::from(vec![1u8; 3])],
        outputs: vec![InferRequestedOutputTensor {
            name: "output".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut typed_input = input("input", "INT32", vec![2, 2]);
    typed_input.contents = Some(pb::InferTensorContents {
        int_contents: vec![1, 2, 3, 4],
        ..Default::default()
    });
    let mut typed = pb::ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![typed_input],
        ..Default::default()
    };
    typed.parameters.insert(
        "priority".into(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(2)),
        },
    );
    vec![raw.encode_to_vec(), typed.encode_to_vec()]
}

#[test]
fn grpc_request_conversion() {
    fuzz("grpc", mutated(grpc_seeds()), |bytes| {
        // What tonic would refuse as a malformed message never reaches the conversion.
        if let Ok(request) = pb::ModelInferRequest::decode(bytes.as_slice()) {
            client_fault(
                "grpc",
                convert::decode(request, &Default::default()).map(|_| ()),
            );
        }
    });
}

#[test]
fn grpc_request_conversion_with_any_shape_and_type() {
    let datatypes = prop::sample::select(vec![
        "FP32", "FP16", "BF16", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
        "UINT32", "UINT64", "BOOL", "BYTES", "fp32", "",
    ]);
    let input = (
        datatypes,
        prop::collection::vec(prop_oneof![any::<i64>(), -2i64..70_000], 0..5),
        prop::option::of(0usize..4096),
        prop::collection::vec(any::<i32>(), 0..64),
    );
    fuzz(
        "grpc_shapes",
        prop::collection::vec(input, 0..4),
        |inputs| {
            let mut request = pb::ModelInferRequest {
                model_name: "m".into(),
                ..Default::default()
            };
            for (i, (datatype, shape, raw, ints)) in inputs.iter().enumerate() {
                let mut tensor = pb::model_infer_request::InferInputTensor {
                    name: format!("i{i}"),
                    datatype: datatype.to_string(),
                    shape: shape.clone(),
                    ..Default::default()
                };
                match raw {
                    Some(n) => request.raw_input_contents.push(Bytes::from(vec![7u8; *n])),
                    None => {
                        tensor.contents = Some(pb::InferTensorContents {
                            int_contents: ints.clone(),
                            fp32_contents: ints.iter().map(|&v| v as f32).collect(),
                            ..Default::default()
                        })
                    }
                }
                request.inputs.push(tensor);
            }
            client_fault(
                "grpc_shapes",
                convert::decode(request, &Default::default()).map(|_| ()),
            );
        },
    );
}

#[test]
fn openai_request_parsing() {
    let valid = [
        r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"temperature":0.5,"top_p":0.9,"max_tokens":8,"stop":["x"],"seed":3,"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"model":"m","prompt":"hello","max_tokens":4,"stop":"x"}"#,
        r#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required"}"#,
    ];
    fuzz("openai", mutated(seeds("/v1/", &valid)), |body| {
        if let Ok(chat) = serde_json::from_slice::<ChatRequest>(body) {
            let _ = chat.into_request(8192);
        }
        if let Ok(completion) = serde_json::from_slice::<CompletionRequest>(body) {
            let _ = completion.into_request(8192);
        }
    });
}

#[test]
fn batch_file_parsing() {
    let valid = [
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"m\",\"prompt\":\"x\"}}\n{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"y\",\"stream\":false}}\n",
        "{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":[\"a\",\"b\"]}}\n\n{\"custom_id\":\"e\"}\n",
    ];
    fuzz("batch_file", mutated(seeds("/v1/", &valid)), |body| {
        let text = String::from_utf8_lossy(body);
        for endpoint in [None, Some("/v1/completions")] {
            let expect = crate::openai::batch::line::Expect {
                endpoint,
                model: Some("m"),
            };
            if let Ok(requests) = crate::openai::batch::line::parse_all(&text, expect, 100) {
                // What is sent is JSON with the job's model named.
                for r in requests {
                    let body: Value = serde_json::from_slice(&r.body).expect("a JSON body");
                    assert!(body.get("model").is_some(), "{body}");
                }
            }
        }
    });
}
