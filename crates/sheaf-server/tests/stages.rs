//! A request's server time by stage: over HTTP and gRPC, on a real model, the stages reported
//! in the statistics extension, `/stats` and `/metrics` add up to the request's whole time.

mod common;

use common::*;
use serde_json::Value;
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use sheaf_server::grpc::pb::model_infer_request::InferInputTensor;
use sheaf_server::HttpConfig;

/// The stages of `sheaf_core::stages`, as the statistics extension names their counters.
const STAGES: [&str; 8] = [
    "receive",
    "queue",
    "compute_input",
    "batch_wait",
    "compute_infer",
    "compute_output",
    "reply",
    "send",
];

fn counter(stats: &Value, name: &str) -> (u64, u64) {
    let c = &stats["inference_stats"][name];
    (c["count"].as_u64().unwrap(), c["ns"].as_u64().unwrap())
}

/// Mean ns per request of each stage, and of the whole request, over the `n` requests counted
/// between `before` and `after`.
fn means(before: &Value, after: &Value, n: u64) -> (Vec<f64>, f64) {
    let mean = |name: &str| {
        let (c1, n1) = counter(after, name);
        let (c0, n0) = counter(before, name);
        assert_eq!(c1 - c0, n, "{name}: {after}");
        (n1 - n0) as f64 / n as f64
    };
    (STAGES.iter().map(|s| mean(s)).collect(), mean("request"))
}

/// The stages add up to the request's whole time: each runs from one instant of the request to
/// the next, so however the machine's threads are preempted, nothing falls between two of them.
/// (The means are of integer nanoseconds; only the division's rounding may differ.)
fn adds_up(stages: &[f64], total: f64, what: &str) {
    let sum: f64 = stages.iter().sum();
    assert!(
        (total - sum).abs() <= 1e-9 * total + 1.0,
        "{what}: stages {stages:?} add up to {sum} ns of {total} ns"
    );
}

/// Sends `requests` requests with `send` and returns their stages' means, checked to add up to
/// the requests' whole time.
async fn measure<F: std::future::Future<Output = ()>>(
    server: &TestServer,
    requests: u64,
    what: &str,
    send: impl FnOnce() -> F,
) -> Vec<f64> {
    let before = server.stats("mlp").await;
    send().await;
    let after = server.stats("mlp").await;
    let (stages, total) = means(&before, &after, requests);
    adds_up(&stages, total, what);
    stages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_add_up_to_each_request_over_http_and_grpc() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 16\nmax_queue_delay_us: 2000\n",
        )],
        HttpConfig::default(),
    )
    .await;
    // 4 rounds of 16 concurrent binary requests: batches form, so requests queue and wait.
    let data = floats(7, 512);
    let rounds = || async {
        for _ in 0..4 {
            let calls = (0..16).map(|_| server.infer_binary("mlp", "input", &[1, 512], &data));
            futures::future::join_all(calls).await;
        }
    };
    let stages = measure(&server, 64, "HTTP", rounds).await;
    let http = 64;
    let stats = server.stats("mlp").await;
    assert_eq!(counter(&stats, "request").0, http, "{stats}");
    for stage in STAGES {
        assert_eq!(counter(&stats, stage).0, http, "{stage}: {stats}");
    }
    // The requests did wait for their batches to fill (2 ms at most).
    assert!(stages[1] > 0.0, "{stages:?}");

    // /stats renders the same account, with the remainder.
    let (_, doc) = server.get("/stats").await;
    let s = &doc["models"]["mlp"]["stages_ms"];
    assert_eq!(s["requests"], http, "{s}");
    let listed: f64 = [
        "receive", "queue", "input", "wait", "infer", "output", "reply", "send", "other",
    ]
    .iter()
    .map(|k| s[k].as_f64().unwrap())
    .sum();
    let whole = s["total"].as_f64().unwrap();
    assert!((listed - whole).abs() <= 1e-6 * whole.max(1.0), "{s}");
    // Each request ran in one batch: no gap between batches, so no remainder.
    assert!(s["other"].as_f64().unwrap() < 1e-6, "{s}");

    // gRPC: 8 more requests, one after another, counted alike.
    let grpc = GrpcInferenceServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap();
    let eight = || {
        let mut grpc = grpc.clone();
        let data = &data;
        async move {
            for _ in 0..8 {
                let request = pb::ModelInferRequest {
                    model_name: "mlp".into(),
                    inputs: vec![InferInputTensor {
                        name: "input".into(),
                        datatype: "FP32".into(),
                        shape: vec![1, 512],
                        ..Default::default()
                    }],
                    raw_input_contents: vec![bytes::Bytes::from(to_bytes(data))],
                    ..Default::default()
                };
                grpc.model_infer(request).await.unwrap();
            }
        }
    };
    measure(&server, 8, "gRPC", eight).await;
    let all = http + 8;
    let reply = grpc
        .clone()
        .model_statistics(pb::ModelStatisticsRequest {
            name: "mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let s = reply.model_stats[0].inference_stats.unwrap();
    let d = |c: Option<pb::StatisticDuration>| c.unwrap_or_default();
    assert_eq!(d(s.request).count, all);

    // /metrics has every stage's series, the remainder and the whole.
    let text = server
        .client
        .get(format!("{}/metrics", server.metrics_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for stage in [
        "receive", "queue", "input", "wait", "infer", "output", "reply", "send", "other", "total",
    ] {
        let series = format!("sheaf_request_stage_duration_seconds_count{{model=\"mlp\",version=\"1\",device=\"cpu\",stage=\"{stage}\"}} {all}");
        assert!(text.contains(&series), "{series} missing from:\n{text}");
    }
}
