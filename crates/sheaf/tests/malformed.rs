//! The malformed-input corpus: every case in `sheaf-server/tests/corpus/http.jsonl` (HTTP, KServe and OpenAI
//! routes) and every gRPC case below is sent to a real server over a real socket. Each gets the
//! status the corpus names, a 4xx, with the protocol's error body, and the server is still live
//! after each one.

#[path = "../../sheaf-server/tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use serde_json::Value;
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use sheaf_server::grpc::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use sheaf_server::{AppState, HttpConfig};
use tonic::Code;

/// The limit the corpus's over-length case is measured against.
const MAX_BODY: usize = 1 << 20;

struct Served {
    http: String,
    grpc: String,
    _repo: tempfile::TempDir,
}

/// `mlp`, the generation model `smollm2` and the text encoder `minilm`, on HTTP and gRPC.
async fn serve() -> Served {
    init_runtime();
    let repo = tempfile::tempdir().unwrap();
    let mlp = repo.path().join("mlp/1");
    std::fs::create_dir_all(&mlp).unwrap();
    std::os::unix::fs::symlink(
        model_file(MLP).canonicalize().unwrap(),
        mlp.join("model.onnx"),
    )
    .unwrap();
    std::fs::create_dir_all(repo.path().join("smollm2")).unwrap();
    std::os::unix::fs::symlink(
        root()
            .join("model_repository/smollm2/model.gguf")
            .canonicalize()
            .expect("run scripts/setup.sh --test"),
        repo.path().join("smollm2/model.gguf"),
    )
    .unwrap();
    // The demo repository's text encoder, for the embeddings routes.
    let encoder = root().join("model_repository/minilm");
    std::fs::create_dir_all(repo.path().join("minilm/1")).unwrap();
    for part in ["1/model.onnx", "tokenizer.json", "config.yaml"] {
        std::os::unix::fs::symlink(
            encoder
                .join(part)
                .canonicalize()
                .expect("run scripts/setup.sh --test"),
            repo.path().join("minilm").join(part),
        )
        .unwrap();
    }
    let manager = Arc::new(sheaf_core::ModelManager::new(vec![
        Arc::new(sheaf_onnx::OnnxBackend::default()),
        Arc::new(sheaf_llama::GgufBackend),
    ]));
    manager.load_repository(repo.path()).await.unwrap();
    let state = AppState::new(manager);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap().to_string();
    let router = sheaf_server::router(
        state.clone(),
        &HttpConfig {
            max_body_bytes: MAX_BODY,
            ..HttpConfig::default()
        },
    );
    tokio::spawn(sheaf_server::serve(
        listener,
        router,
        std::future::pending(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(sheaf_server::grpc::serve(
        listener,
        state,
        MAX_BODY,
        std::future::pending(),
    ));
    Served {
        http,
        grpc,
        _repo: repo,
    }
}

/// Status and body of a request that declares `length` bytes and sends none.
async fn declare_only(address: &str, path: &str, length: u64) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let status = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_http_request_gets_its_4xx_and_the_server_lives_on() {
    let served = serve().await;
    let client = reqwest::Client::new();
    let corpus = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sheaf-server/tests/corpus/http.jsonl"),
    )
    .unwrap();
    let mut count = 0;
    for line in corpus.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let name = case["name"].as_str().unwrap();
        let path = case["path"].as_str().unwrap();
        let want = case["status"].as_u64().unwrap() as u16;
        let (status, body) = if let Some(length) = case["declare_length"].as_u64() {
            declare_only(&served.http, path, length).await
        } else {
            let method =
                reqwest::Method::from_bytes(case["method"].as_str().unwrap().as_bytes()).unwrap();
            let mut request = client.request(method, format!("http://{}{path}", served.http));
            if let Some(headers) = case["headers"].as_object() {
                for (k, v) in headers {
                    request = request.header(k, v.as_str().unwrap());
                }
            }
            if let Some(body) = case["body"].as_str() {
                request = request.body(body.to_string());
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        };
        assert_eq!(status, want, "{name}: {body}");
        assert!((400..500).contains(&status), "{name}");
        let reply: Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("{name}: the error body is not JSON: {body}"));
        let openai = path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize";
        let message = if openai {
            reply["error"]["message"].as_str()
        } else {
            reply["error"].as_str()
        };
        let message =
            message.unwrap_or_else(|| panic!("{name}: no error in the protocol's shape: {reply}"));
        assert!(!message.is_empty(), "{name}");
        if let Some(says) = case["says"].as_str() {
            assert!(
                message.contains(says),
                "{name}: {message} does not say {says:?}"
            );
        }
        if let Some(param) = case.get("param") {
            assert_eq!(&reply["error"]["param"], param, "{name}: {reply}");
        }
        assert!(
            message.len() <= 1200,
            "{name}: a {} byte message",
            message.len()
        );
        let live = client
            .get(format!("http://{}/v2/health/live", served.http))
            .send()
            .await
            .unwrap();
        assert_eq!(live.status(), 200, "not live after {name}");
        count += 1;
    }
    assert!(count >= 100, "the corpus has only {count} cases");
}

fn tensor(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

fn request(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "mlp".into(),
        inputs,
        raw_input_contents: raw.into_iter().map(Bytes::from).collect(),
        ..Default::default()
    }
}

fn good() -> pb::ModelInferRequest {
    request(
        vec![tensor("input", "FP32", &[1, 512])],
        vec![vec![0u8; 2048]],
    )
}

/// The gRPC cases: a name, the request, and the status it must get.
fn grpc_cases() -> Vec<(&'static str, pb::ModelInferRequest, Code)> {
    let typed = |contents: pb::InferTensorContents| {
        let mut t = tensor("input", "FP32", &[1, 512]);
        t.contents = Some(contents);
        request(vec![t], vec![])
    };
    let with = |f: &dyn Fn(&mut pb::ModelInferRequest)| {
        let mut r = good();
        f(&mut r);
        r
    };
    let param = |choice: pb::infer_parameter::ParameterChoice| pb::InferParameter {
        parameter_choice: Some(choice),
    };
    use pb::infer_parameter::ParameterChoice as P;
    // One input of `datatype` and `shape`, with `bytes` raw bytes: refused as invalid.
    let one = |name: &'static str, input: &str, datatype: &str, shape: &[i64], bytes: usize| {
        let r = request(vec![tensor(input, datatype, shape)], vec![vec![0; bytes]]);
        (name, r, Code::InvalidArgument)
    };
    vec![
        (
            "unknown model",
            with(&|r| r.model_name = "nope".into()),
            Code::NotFound,
        ),
        (
            "empty model name",
            with(&|r| r.model_name.clear()),
            Code::NotFound,
        ),
        (
            "long model name",
            with(&|r| r.model_name = "m".repeat(10_000)),
            Code::NotFound,
        ),
        (
            "unknown version",
            with(&|r| r.model_version = "9".into()),
            Code::NotFound,
        ),
        ("no inputs", request(vec![], vec![]), Code::InvalidArgument),
        one("unknown input", "x", "FP32", &[1, 512], 2048),
        one("unknown datatype", "input", "FP128", &[1, 512], 2048),
        one("wrong datatype", "input", "INT32", &[1, 512], 2048),
        one("negative dimension", "input", "FP32", &[1, -512], 2048),
        one("huge shape", "input", "FP32", &[1, 8_589_934_592], 4),
        one(
            "overflowing shape",
            "input",
            "FP32",
            &[i64::MAX, i64::MAX],
            4,
        ),
        one("wrong shape", "input", "FP32", &[1, 511], 2044),
        one("short raw contents", "input", "FP32", &[1, 512], 2047),
        one("long raw contents", "input", "FP32", &[1, 512], 2052),
        (
            "raw contents without inputs",
            request(vec![], vec![vec![0; 2048]]),
            Code::InvalidArgument,
        ),
        (
            "more raw contents than inputs",
            request(
                vec![tensor("input", "FP32", &[1, 512])],
                vec![vec![0; 2048], vec![0; 4]],
            ),
            Code::InvalidArgument,
        ),
        (
            "an input without contents",
            request(vec![tensor("input", "FP32", &[1, 512])], vec![]),
            Code::InvalidArgument,
        ),
        (
            "typed contents of another type",
            typed(pb::InferTensorContents {
                int_contents: vec![0; 512],
                ..Default::default()
            }),
            Code::InvalidArgument,
        ),
        (
            "too few typed values",
            typed(pb::InferTensorContents {
                fp32_contents: vec![0.0; 500],
                ..Default::default()
            }),
            Code::InvalidArgument,
        ),
        (
            "too many typed values",
            typed(pb::InferTensorContents {
                fp32_contents: vec![0.0; 600],
                ..Default::default()
            }),
            Code::InvalidArgument,
        ),
        (
            "raw and typed contents",
            {
                let mut r = typed(pb::InferTensorContents {
                    fp32_contents: vec![0.0; 512],
                    ..Default::default()
                });
                r.raw_input_contents = vec![Bytes::from(vec![0u8; 2048])];
                r
            },
            Code::InvalidArgument,
        ),
        (
            "duplicate input",
            request(
                vec![
                    tensor("input", "FP32", &[1, 512]),
                    tensor("input", "FP32", &[1, 512]),
                ],
                vec![vec![0; 2048], vec![0; 2048]],
            ),
            Code::InvalidArgument,
        ),
        (
            "unknown output",
            with(&|r| {
                r.outputs = vec![InferRequestedOutputTensor {
                    name: "logits".into(),
                    ..Default::default()
                }]
            }),
            Code::InvalidArgument,
        ),
        (
            "priority out of range",
            with(&|r| {
                r.parameters
                    .insert("priority".into(), param(P::Int64Param(99)));
            }),
            Code::InvalidArgument,
        ),
        (
            "negative priority",
            with(&|r| {
                r.parameters
                    .insert("priority".into(), param(P::Int64Param(-1)));
            }),
            Code::InvalidArgument,
        ),
        (
            "priority as text",
            with(&|r| {
                r.parameters
                    .insert("priority".into(), param(P::StringParam("high".into())));
            }),
            Code::InvalidArgument,
        ),
        (
            "timeout as text",
            with(&|r| {
                r.parameters
                    .insert("timeout".into(), param(P::StringParam("1s".into())));
            }),
            Code::InvalidArgument,
        ),
        // The generation model, asked as Triton's vLLM backend is.
        (
            "a tensor a generation model does not take",
            with(&|r| r.model_name = "smollm2".into()),
            Code::InvalidArgument,
        ),
        (
            "two prompts",
            llm(vec![(
                tensor("text_input", "BYTES", &[2]),
                bytes_of(&["a", "b"]),
            )]),
            Code::InvalidArgument,
        ),
        (
            "sampling parameters that are not JSON",
            llm(vec![(
                tensor("sampling_parameters", "BYTES", &[1]),
                bytes_of(&["{"]),
            )]),
            Code::InvalidArgument,
        ),
        (
            "a length past the context",
            llm(vec![(
                tensor("sampling_parameters", "BYTES", &[1]),
                bytes_of(&["{\"max_tokens\": 18446744073709551615}"]),
            )]),
            Code::InvalidArgument,
        ),
        (
            "more outputs than the engine runs at once",
            llm(vec![(
                tensor("sampling_parameters", "BYTES", &[1]),
                bytes_of(&["{\"n\": 4294967296}"]),
            )]),
            Code::InvalidArgument,
        ),
        (
            "a log-probability switch that is not BOOL",
            llm(vec![(
                tensor("return_logprobs", "INT32", &[1]),
                vec![1, 0, 0, 0],
            )]),
            Code::InvalidArgument,
        ),
    ]
}

/// KServe's binary form of BYTES elements: each one's length (4 bytes, little endian), then it.
fn bytes_of(items: &[&str]) -> Vec<u8> {
    items
        .iter()
        .flat_map(|s| (s.len() as u32).to_le_bytes().into_iter().chain(s.bytes()))
        .collect()
}

/// A request of the generation model: the prompt "Hi" and `more` inputs with their raw bytes.
fn llm(more: Vec<(InferInputTensor, Vec<u8>)>) -> pb::ModelInferRequest {
    let (mut inputs, mut raw) = (
        vec![tensor("text_input", "BYTES", &[1])],
        vec![bytes_of(&["Hi"])],
    );
    for (input, bytes) in more {
        inputs.push(input);
        raw.push(bytes);
    }
    if inputs.iter().filter(|i| i.name == "text_input").count() > 1 {
        inputs.remove(0);
        raw.remove(0);
    }
    let mut r = request(inputs, raw);
    r.model_name = "smollm2".into();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_grpc_request_gets_its_status_and_the_server_lives_on() {
    let served = serve().await;
    let mut c = GrpcInferenceServiceClient::connect(served.grpc.clone())
        .await
        .unwrap();
    let cases = grpc_cases();
    let count = cases.len();
    for (name, request, want) in cases {
        let e = c.model_infer(request.clone()).await.unwrap_err();
        assert_eq!(e.code(), want, "{name}: {}", e.message());
        assert!(!e.message().is_empty(), "{name}");
        assert!(
            e.message().len() <= 1200,
            "{name}: {} bytes",
            e.message().len()
        );
        // On a stream, the same request is answered with an error message, and the stream
        // stays open for the good request after it. Answers to different requests may come in
        // either order (a generation model's request takes another path than the MLP's).
        let stream = futures::stream::iter(vec![request, good()]);
        let mut answers = c.model_stream_infer(stream).await.unwrap().into_inner();
        let mut errors = 0;
        for _ in 0..2 {
            let answer = answers.message().await.unwrap().unwrap();
            if answer.error_message.is_empty() {
                let outputs = answer.infer_response.map_or(0, |r| r.outputs.len());
                assert!(
                    outputs > 0,
                    "{name}: an answer with neither outputs nor error"
                );
            } else {
                errors += 1;
            }
        }
        assert_eq!(errors, 1, "{name}: the stream's errors");
        assert!(
            c.server_live(pb::ServerLiveRequest {})
                .await
                .unwrap()
                .into_inner()
                .live,
            "not live after {name}"
        );
    }
    // The other RPCs that name a model.
    let e = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .model_config(pb::ModelConfigRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // In the control mode `none`, loading is refused whatever the model.
    let e = c
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("control mode"), "{}", e.message());
    assert!(count >= 25, "only {count} gRPC cases");
}
