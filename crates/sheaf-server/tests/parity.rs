//! HTTP and gRPC give the same answer to the same question: metadata, readiness, inference,
//! configuration, statistics and the repository index, over a ready model, a model that is not
//! loaded, a model whose config is broken, and names and versions nobody knows. Both protocols
//! render the one answer the model manager builds, and map its error kind once each.

mod common;

use bytes::Bytes;
use common::*;
use serde_json::{json, Value};
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use sheaf_server::grpc::pb::model_infer_request::InferInputTensor;
use tonic::Code;

const SIM: &str =
    "input: {name: x, shape: [-1, 2]}\noutput: {name: y}\nlatency_ms: {a: 0.1, b: 0}\n";

/// One answer, as a protocol-neutral outcome: the HTTP status, or the gRPC code, as the class
/// of answer both stand for.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Ok,
    Invalid,
    NotFound,
    Unavailable,
}

fn from_http(status: u16) -> Outcome {
    match status {
        200 => Outcome::Ok,
        400 => Outcome::Invalid,
        404 => Outcome::NotFound,
        503 => Outcome::Unavailable,
        other => panic!("unexpected HTTP status {other}"),
    }
}

fn from_grpc<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Outcome {
    match result.map_err(|s| s.code()) {
        Ok(_) => Outcome::Ok,
        Err(Code::InvalidArgument) => Outcome::Invalid,
        Err(Code::NotFound) => Outcome::NotFound,
        Err(Code::Unavailable) => Outcome::Unavailable,
        Err(other) => panic!("unexpected gRPC code {other:?}"),
    }
}

/// A request of the sim model's shape, one with a wrong input name, or (`garbled`) one that
/// cannot even be decoded: more values than its shape holds, more raw contents than inputs.
fn infer_body(input: &str) -> (Value, pb::ModelInferRequest) {
    let garbled = input == "garbled";
    let data = if garbled {
        json!([1.0, 2.0, 3.0])
    } else {
        json!([1.0, 2.0])
    };
    let http = json!({"inputs": [{"name": input, "shape": [1, 2], "datatype": "FP32",
                                  "data": data}]});
    let raw = Bytes::from(to_bytes(&[1.0, 2.0]));
    let grpc = pb::ModelInferRequest {
        inputs: vec![InferInputTensor {
            name: input.into(),
            datatype: "FP32".into(),
            shape: vec![1, 2],
            ..Default::default()
        }],
        raw_input_contents: if garbled {
            vec![raw.clone(), raw]
        } else {
            vec![raw]
        },
        ..Default::default()
    };
    (http, grpc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_grpc_answer_every_question_alike() {
    let server = start_sim_with(
        &[
            ("ready", SIM, "preload: true\n"),
            ("idle", SIM, ""),
            ("broken", SIM, "preload: true\nno_such_key: 1\n"),
        ],
        Default::default(),
        sheaf_core::ControlMode::Explicit,
    )
    .await;
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap();
    let http = |method: &'static str, path: String, body: Option<Value>| {
        let client = server.client.clone();
        let url = format!("{}{path}", server.url);
        async move {
            let request = match method {
                "GET" => client.get(url),
                _ => client.post(url).json(&body.unwrap_or(json!({}))),
            };
            request.send().await.unwrap().status().as_u16()
        }
    };
    let names = [
        ("ready", ""),
        ("ready", "1"),
        ("ready", "9"),
        ("idle", ""),
        ("broken", ""),
        ("nobody", ""),
    ];
    let mut seen = Vec::new();
    for (name, version) in names {
        let path = match version {
            "" => format!("/v2/models/{name}"),
            v => format!("/v2/models/{name}/versions/{v}"),
        };
        let what = format!("{name} version '{version}'");

        // Metadata.
        let h = from_http(http("GET", path.clone(), None).await);
        let g = from_grpc(
            grpc.model_metadata(pb::ModelMetadataRequest {
                name: name.into(),
                version: version.into(),
            })
            .await,
        );
        assert_eq!(h, g, "metadata of {what}");
        seen.push(h);

        // Readiness: 200 / true; 503 or 404 / false (gRPC's answer is only a flag, and
        // Triton's clients read an unknown model as not ready).
        let h = from_http(http("GET", format!("{path}/ready"), None).await);
        let ready = grpc
            .model_ready(pb::ModelReadyRequest {
                name: name.into(),
                version: version.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .ready;
        assert_eq!(h == Outcome::Ok, ready, "readiness of {what}");
        assert!(
            h == Outcome::Ok || h == Outcome::Unavailable || h == Outcome::NotFound,
            "readiness of {what}: {h:?}"
        );

        // Inference, good and bad: the model is looked up first over both.
        for input in ["x", "wrong", "garbled"] {
            let (body, mut request) = infer_body(input);
            request.model_name = name.into();
            request.model_version = version.into();
            let h = from_http(http("POST", format!("{path}/infer"), Some(body)).await);
            let g = from_grpc(grpc.model_infer(request).await);
            assert_eq!(h, g, "inference of {what} with input '{input}'");
            seen.push(h);
        }

        // Configuration and statistics.
        let h = from_http(http("GET", format!("{path}/config"), None).await);
        let g = from_grpc(
            grpc.model_config(pb::ModelConfigRequest {
                name: name.into(),
                version: version.into(),
            })
            .await,
        );
        assert_eq!(h, g, "config of {what}");
        let h = from_http(http("GET", format!("{path}/stats"), None).await);
        let g = from_grpc(
            grpc.model_statistics(pb::ModelStatisticsRequest {
                name: name.into(),
                version: version.into(),
            })
            .await,
        );
        assert_eq!(h, g, "statistics of {what}");
    }
    // The cases cover every outcome.
    for outcome in [
        Outcome::Ok,
        Outcome::Invalid,
        Outcome::NotFound,
        Outcome::Unavailable,
    ] {
        assert!(seen.contains(&outcome), "{outcome:?} never came up");
    }

    // The repository index, whole and ready only.
    for ready in [false, true] {
        let reply: Value = server
            .client
            .post(format!("{}/v2/repository/index", server.url))
            .json(&json!({ "ready": ready }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let over_http: Vec<(String, String, String)> = reply
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                (s("name"), s("state"), s("reason"))
            })
            .collect();
        let over_grpc: Vec<(String, String, String)> = grpc
            .repository_index(pb::RepositoryIndexRequest {
                ready,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .models
            .into_iter()
            .map(|m| (m.name, m.state, m.reason))
            .collect();
        assert_eq!(over_http, over_grpc, "index, ready only: {ready}");
        assert_eq!(over_http.len(), if ready { 1 } else { 3 });
    }
}
