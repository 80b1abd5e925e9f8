//! KServe v2 over HTTP: health, metadata, versions, every numeric datatype in JSON and binary,
//! output selection and request ids, models without a batch dimension, and failed loads.

mod common;

use common::*;
use serde_json::{json, Value};
use sheaf_server::HttpConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_and_versioned_routes() {
    let server = start(
        &[("mlp", MLP, ""), ("nsfw", NSFW, "")],
        HttpConfig::default(),
    )
    .await;
    assert_eq!(server.get("/v2/health/live").await.0, 200);
    assert_eq!(server.get("/v2/health/ready").await.0, 200);
    let (_, meta) = server.get("/v2").await;
    assert_eq!(meta["name"], "sheaf");
    assert!(meta["extensions"]
        .as_array()
        .unwrap()
        .contains(&json!("binary_tensor_data")));

    let (status, m) = server.get("/v2/models/nsfw").await;
    assert_eq!(status, 200);
    assert_eq!(m["platform"], "onnxruntime_onnx");
    assert_eq!(m["versions"], json!(["1"]));
    assert_eq!(
        m["inputs"],
        json!([{"name": "input:0", "datatype": "FP32", "shape": [-1, 224, 224, 3]}])
    );
    assert_eq!(
        m["outputs"],
        json!([{"name": "outputs", "datatype": "FP32", "shape": [-1, 2]}])
    );
    assert_eq!(server.get("/v2/models/nsfw/versions/1").await.1, m);
    assert_eq!(server.get("/v2/models/mlp/ready").await.0, 200);
    assert_eq!(server.get("/v2/models/mlp/versions/1/ready").await.0, 200);
    assert_eq!(server.get("/v2/models/mlp/versions/2/ready").await.0, 404);
    assert_eq!(server.get("/v2/models/other/ready").await.0, 404);

    let body = json!({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32", "data": vec![0.5; 512]}]});
    let r = server
        .client
        .post(format!("{}/v2/models/mlp/versions/1/infer", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, all) = server.get("/v2/models/stats").await;
    assert_eq!(all["model_stats"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_binary_give_the_in_process_result_on_a_real_cnn() {
    let server = start(&[("nsfw", NSFW, "")], HttpConfig::default()).await;
    let x = floats(11, 224 * 224 * 3);
    let want = in_process(NSFW, &[1, 224, 224, 3], &x);
    let binary = server
        .infer_binary("nsfw", "input:0", &[1, 224, 224, 3], &x)
        .await;
    assert_eq!(binary[0].0, vec![1, 2]);
    assert_close(&binary[0].1, &want, 1e-5, "binary");
    let body = json!({"id": "req-7",
        "inputs": [{"name": "input:0", "shape": [1, 224, 224, 3], "datatype": "FP32", "data": x}],
        "outputs": [{"name": "outputs"}]});
    let (status, reply) = server.post_json("nsfw", &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["id"], "req-7");
    assert_eq!(reply["model_name"], "nsfw");
    assert_eq!(reply["model_version"], "1");
    let got: Vec<f32> = reply["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_close(&got, &want, 1e-5, "json");
}

fn sample(datatype: &str) -> Value {
    match datatype {
        "INT8" => json!([-128, 0, 127]),
        "INT16" => json!([-32768, 1, 32767]),
        "INT32" => json!([-2147483648i64, 2, 2147483647]),
        "INT64" => json!([-9007199254740993i64, 3, 9007199254740993i64]),
        "UINT8" => json!([0, 1, 255]),
        "UINT16" => json!([0, 2, 65535]),
        "UINT32" => json!([0, 3, 4294967295u64]),
        "UINT64" => json!([0, 4, 18446744073709551615u64]),
        "BOOL" => json!([true, false, true]),
        "FP16" => json!([0.5, -2.0, 1024.0]),
        "FP32" => json!([0.1, -3.5, 1e30]),
        "FP64" => json!([0.1, -3.5, 1e300]),
        _ => unreachable!(),
    }
}

const TYPES: [&str; 12] = [
    "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL", "FP16",
    "FP32", "FP64",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_numeric_datatype_round_trips_in_json_and_binary() {
    let server = start(&[("echo", ALLTYPES, "")], HttpConfig::default()).await;
    let inputs: Vec<Value> = TYPES
        .iter()
        .map(|t| json!({"name": format!("in_{t}"), "shape": [1, 3], "datatype": t, "data": sample(t)}))
        .collect();
    // All outputs as JSON, except FP64 as binary, chosen per output.
    let outputs: Vec<Value> = TYPES
        .iter()
        .map(|t| json!({"name": format!("out_{t}"), "parameters": {"binary_data": *t == "FP64"}}))
        .collect();
    let header = json!({"inputs": inputs, "outputs": outputs}).to_string();
    let r = server
        .client
        .post(server.infer_url("echo"))
        .header("Inference-Header-Content-Length", header.len())
        .body(header.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let n: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = r.bytes().await.unwrap();
    let reply: Value = serde_json::from_slice(&bytes[..n]).unwrap();
    for (t, out) in TYPES.iter().zip(reply["outputs"].as_array().unwrap()) {
        assert_eq!(out["name"], format!("out_{t}"));
        assert_eq!(out["datatype"], *t);
        assert_eq!(out["shape"], json!([1, 3]));
        if *t == "FP64" {
            assert_eq!(out["parameters"]["binary_data_size"], 24);
            let v: Vec<f64> = bytes[n..]
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(v, vec![0.1, -3.5, 1e300]);
        } else if *t == "FP32" {
            let v: Vec<f32> = out["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(v, vec![0.1f32, -3.5, 1e30]);
        } else {
            assert_eq!(out["data"], sample(t), "{t}");
        }
    }
    // Out-of-range values are refused with the type named.
    let bad = json!({"inputs": [{"name": "in_UINT8", "shape": [1, 3], "datatype": "UINT8", "data": [1, 2, 256]}]});
    let (status, body) = server.post_json("echo", &bad).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("256 is out of range for UINT8"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_batch_dimension_runs_requests_as_they_are() {
    let server = start(
        &[
            ("fixed", FIXED, ""),
            ("fixed_misconfigured", FIXED, "max_batch_size: 4\n"),
            ("typo", MLP, "max_batch_sise: 4\n"),
        ],
        HttpConfig::default(),
    )
    .await;
    let (_, m) = server.get("/v2/models/fixed").await;
    assert_eq!(m["inputs"][0]["shape"], json!([2, 3]));
    let handle = server.manager.get("fixed", None).unwrap();
    assert_eq!(handle.max_batch_size, 0);

    let body = json!({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [0, 1, 2, 3, 4, 5]}]});
    let (status, reply) = server.post_json("fixed", &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["outputs"][0]["data"],
        json!([1.0, 3.0, 5.0, 7.0, 9.0, 11.0])
    );
    let one =
        json!({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0, 1, 2]}]});
    let (status, reply) = server.post_json("fixed", &one).await;
    assert_eq!(status, 400);
    assert!(
        reply["error"].as_str().unwrap().contains("expects [2, 3]"),
        "{reply}"
    );

    // Models that cannot load are reported with the reason; the server serves the rest.
    assert_eq!(server.get("/v2/health/ready").await.0, 200);
    let (status, reply) = server.get("/v2/models/fixed_misconfigured/ready").await;
    assert_eq!(status, 503);
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("no batch dimension"),
        "{reply}"
    );
    let (status, reply) = server.post_json("typo", &body).await;
    assert_eq!(status, 503);
    assert!(
        reply["error"].as_str().unwrap().contains("max_batch_sise"),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_config_has_tritons_json_shape() {
    let server = start(
        &[
            (
                "mlp",
                MLP,
                "max_batch_size: 64\npreferred_batch_sizes: [8]\nmax_queue_delay_us: 250\n",
            ),
            ("fixed", FIXED, ""),
        ],
        HttpConfig::default(),
    )
    .await;
    let (status, c) = server.get("/v2/models/mlp/config").await;
    assert_eq!(status, 200);
    assert_eq!(c["name"], "mlp");
    assert_eq!(c["platform"], "onnxruntime_onnx");
    assert_eq!(c["max_batch_size"], 64);
    assert_eq!(
        c["input"],
        json!([{"name": "input", "data_type": "TYPE_FP32", "dims": [512]}])
    );
    assert_eq!(
        c["output"],
        json!([{"name": "output", "data_type": "TYPE_FP32", "dims": [10]}])
    );
    assert_eq!(
        c["dynamic_batching"],
        json!({"preferred_batch_size": [8], "max_queue_delay_microseconds": 250})
    );
    assert_eq!(c["instance_group"][0]["kind"], "KIND_CPU");
    let (_, f) = server.get("/v2/models/fixed/versions/1/config").await;
    assert_eq!(f["max_batch_size"], 0);
    assert_eq!(f["input"][0]["dims"], json!([2, 3]));
    assert!(f.get("dynamic_batching").is_none());
    assert_eq!(server.get("/v2/models/nope/config").await.0, 404);
}
