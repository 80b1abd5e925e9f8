//! Placement across devices: round_robin, least_loaded and fewest_models put each model on one
//! device, `preferred_device` pins it, a full device evicts only its own models, and the
//! statistics (HTTP, gRPC, /stats) report where each model lives and what it holds.

mod common;

use common::*;
use serde_json::{json, Value};
use sheaf_core::{ControlMode, ServerConfig};
use sheaf_server::grpc::pb;

const MIB: u64 = 1024 * 1024;

fn sim(memory_mb: u64) -> String {
    format!("input: {{name: x, shape: [-1, 2]}}\noutput: {{name: y}}\nlatency_ms: {{a: 0.1, b: 0}}\nmemory_mb: {memory_mb}\n")
}

fn body() -> Value {
    json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]})
}

async fn server(strategy: &str, budget_mb: u64, models: &[(&str, &str, &str)]) -> TestServer {
    let config = ServerConfig::from_yaml(&format!(
        "devices: ['sim:a', 'sim:b', 'sim:c']\nassignment_strategy: {strategy}\nmemory_budget_mb: {budget_mb}\n"
    ))
    .unwrap();
    start_sim_with(models, config, ControlMode::OnDemand).await
}

/// Where each model lives, by name.
fn placed(server: &TestServer) -> Vec<(String, Vec<String>)> {
    server
        .manager
        .model_infos()
        .into_iter()
        .filter(|m| !m.devices.is_empty())
        .map(|m| (m.name, m.devices))
        .collect()
}

fn on(name: &str, device: &str) -> (String, Vec<String>) {
    (name.to_string(), vec![device.to_string()])
}

async fn hit(server: &TestServer, model: &str) {
    let (status, reply) = server.post_json(model, &body()).await;
    assert_eq!(status, 200, "{model}: {reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_takes_the_devices_in_turn() {
    let spec = sim(10);
    let models: Vec<_> = ["m0", "m1", "m2", "m3"]
        .iter()
        .map(|n| (*n, spec.as_str(), ""))
        .collect();
    let server = server("round_robin", 0, &models).await;
    for m in ["m0", "m1", "m2", "m3"] {
        hit(&server, m).await;
    }
    assert_eq!(
        placed(&server),
        [
            on("m0", "sim:a"),
            on("m1", "sim:b"),
            on("m2", "sim:c"),
            on("m3", "sim:a")
        ]
    );
    // Each model has one lane, on its device.
    let handle = server.manager.get("m1", None).unwrap();
    let lanes: Vec<_> = handle.lanes().iter().map(|l| l.device.clone()).collect();
    assert_eq!(lanes, ["sim:b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_and_fewest_models_balance_memory_and_counts() {
    let (big, small) = (sim(300), sim(100));
    let models = [
        ("big", big.as_str(), ""),
        ("s1", small.as_str(), ""),
        ("s2", small.as_str(), ""),
        ("s3", small.as_str(), ""),
        ("s4", small.as_str(), ""),
    ];
    let server = server("least_loaded", 0, &models).await;
    for m in ["big", "s1", "s2", "s3", "s4"] {
        hit(&server, m).await;
    }
    // big → a (300); s1 → b; s2 → c; s3 → b (100 < 300); s4 → c.
    assert_eq!(
        placed(&server),
        [
            on("big", "sim:a"),
            on("s1", "sim:b"),
            on("s2", "sim:c"),
            on("s3", "sim:b"),
            on("s4", "sim:c")
        ]
    );
    let used: Vec<u64> = server.manager.memory_used();
    assert_eq!(used, [300 * MIB, 200 * MIB, 200 * MIB]);

    let server = self::server("fewest_models", 0, &models).await;
    for m in ["big", "s1", "s2", "s3", "s4"] {
        hit(&server, m).await;
    }
    // By count: a, b, c, then a and b again, whatever their memory.
    assert_eq!(
        placed(&server),
        [
            on("big", "sim:a"),
            on("s1", "sim:b"),
            on("s2", "sim:c"),
            on("s3", "sim:a"),
            on("s4", "sim:b")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_device_pins_and_a_full_device_evicts_only_its_own_models() {
    let spec = sim(100);
    let pin = |d: &str| format!("preferred_device: '{d}'\n");
    let (pa, pb, pc) = (pin("sim:a"), pin("sim:b"), pin("sim:c"));
    let models = [
        ("a1", spec.as_str(), pa.as_str()),
        ("a2", spec.as_str(), pa.as_str()),
        ("b1", spec.as_str(), pb.as_str()),
        ("c1", spec.as_str(), pc.as_str()),
        ("nowhere", spec.as_str(), "preferred_device: 'cuda:7'\n"),
    ];
    // Each device holds one 100 MiB model.
    let server = server("round_robin", 150, &models).await;
    hit(&server, "b1").await;
    hit(&server, "c1").await;
    hit(&server, "a1").await;
    assert_eq!(
        placed(&server),
        [on("a1", "sim:a"), on("b1", "sim:b"), on("c1", "sim:c")]
    );
    // a2 needs device a: a1 goes, although b1 was used less recently.
    hit(&server, "a2").await;
    assert_eq!(
        placed(&server),
        [on("a2", "sim:a"), on("b1", "sim:b"), on("c1", "sim:c")]
    );
    let a1 = server.manager.model_info("a1").unwrap();
    assert_eq!(
        (a1.state.as_str(), a1.loads, a1.evictions),
        ("UNAVAILABLE", 1, 1)
    );

    let (status, reply) = server.post_json("nowhere", &body()).await;
    assert_eq!(status, 503, "{reply}");
    let message = reply["error"].as_str().unwrap();
    assert!(
        message.contains("preferred_device 'cuda:7'") && message.contains("sim:a"),
        "{message}"
    );
    // The repository index says where each model lives.
    let index: Value = server
        .client
        .post(format!("{}/v2/repository/index", server.url))
        .json(&json!({"ready": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let a2 = index
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "a2")
        .unwrap();
    assert_eq!(a2["devices"], json!(["sim:a"]));
    let nowhere = server.manager.model_info("nowhere").unwrap();
    assert_eq!(nowhere.state.as_str(), "UNAVAILABLE");
    assert!(nowhere.reason.unwrap().contains("cuda:7"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_report_placement_memory_use_loads_and_evictions() {
    let spec = sim(100);
    let models = [("p", spec.as_str(), ""), ("q", spec.as_str(), "")];
    let server = server("round_robin", 150, &models).await;
    for _ in 0..3 {
        hit(&server, "p").await;
    }
    hit(&server, "q").await;

    // HTTP statistics: Triton's shape plus memory_usage and the manager's counts.
    let (status, stats) = server.get("/v2/models/p/stats").await;
    assert_eq!(status, 200, "{stats}");
    let p = &stats["model_stats"][0];
    assert_eq!(p["inference_stats"]["success"]["count"], 3);
    assert_eq!(
        p["memory_usage"],
        json!([{"type": "SIM", "id": 0, "byte_size": 100 * MIB}])
    );
    assert_eq!(
        (p["load_count"].clone(), p["eviction_count"].clone()),
        (json!(1), json!(0))
    );
    assert_eq!(p["memory_source"], "backend");

    // gRPC ModelStatistics carries the same.
    let mut grpc = pb::grpc_inference_service_client::GrpcInferenceServiceClient::connect(
        server.grpc_url.clone(),
    )
    .await
    .unwrap();
    let reply = grpc
        .model_statistics(pb::ModelStatisticsRequest {
            name: "q".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let q = &reply.model_stats[0];
    assert_eq!(q.memory_usage.len(), 1);
    assert_eq!(
        (
            q.memory_usage[0].r#type.as_str(),
            q.memory_usage[0].byte_size
        ),
        ("SIM", 100 * MIB)
    );
    assert_eq!((q.load_count, q.eviction_count), (1, 0));
    assert!(q.last_inference > 0);

    // /stats: per model and per device.
    let (_, doc) = server.get("/stats").await;
    let p = &doc["models"]["p"];
    assert_eq!(p["devices"], json!(["sim:a"]));
    assert_eq!(p["memory_bytes"], 100 * MIB);
    assert_eq!(p["usage_count"], 3);
    assert!(p["last_used_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert!(p["total_inference_time_ms"].as_f64().unwrap() > 0.0);
    let devices = doc["per_gpu_stats"].as_array().unwrap();
    let summary: Vec<(Value, Value, Value)> = devices
        .iter()
        .map(|d| {
            (
                d["device"].clone(),
                d["models_loaded"].clone(),
                d["memory_used_bytes"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (json!("sim:a"), json!(1), json!(100 * MIB)),
            (json!("sim:b"), json!(1), json!(100 * MIB)),
            (json!("sim:c"), json!(0), json!(0)),
        ]
    );
    assert_eq!(devices[0]["memory_budget_bytes"], 150 * MIB);
}
