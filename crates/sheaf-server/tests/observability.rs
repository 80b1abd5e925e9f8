//! Seeing it work: Prometheus metrics (checked by promtool), `/stats`, and the live dashboard
//! rendered by headless Chromium.

mod common;

use common::*;
use futures::future::join_all;
use serde_json::{json, Value};
use sheaf_server::HttpConfig;

fn mlp_body(v: f32) -> Value {
    json!({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32", "data": vec![v; 512]}]})
}

async fn traffic(server: &TestServer, good: usize, bad: usize) {
    let bodies: Vec<Value> = (0..good).map(|i| mlp_body(i as f32)).collect();
    let good = join_all(bodies.iter().map(|b| server.post_json("mlp", b))).await;
    assert!(good.iter().all(|(s, _)| *s == 200));
    for _ in 0..bad {
        assert_eq!(server.post_json("mlp", &json!({"inputs": []})).await.0, 400);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_count_what_happened() {
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    traffic(&server, 5, 2).await;
    // A client has its answer a moment before the batch that made it is counted as done: the
    // pending gauge reads 0 once the server is idle, which a scrape may have to wait for.
    let idle = r#"nv_inference_pending_request_count{model="mlp",version="1"} 0"#;
    let mut text = String::new();
    for _ in 0..100 {
        let r = server
            .client
            .get(format!("{}/metrics", server.metrics_url))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()["content-type"],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        text = r.text().await.unwrap();
        if text.contains(idle) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    promtool_check(&text);

    let labels = r#"model="mlp",version="1",device="cpu""#;
    for needle in [
        format!("sheaf_request_success_total{{{labels}}} 5"),
        r#"sheaf_request_failure_total{model="mlp",version="1",device="",reason="invalid_input"} 2"#.to_string(),
        format!("sheaf_request_duration_seconds_count{{{labels}}} 5"),
        format!("sheaf_queue_duration_seconds_count{{{labels}}} 5"),
        format!("sheaf_queue_depth{{{labels}}} 0"),
        format!("sheaf_inflight_batches{{{labels}}} 0"),
        r#"sheaf_model_loads_total{model="mlp"} 1"#.to_string(),
        r#"sheaf_device_memory_used_bytes{device="cpu"}"#.to_string(),
        "sheaf_process_resident_memory_bytes".to_string(),
        "sheaf_process_cpu_seconds".to_string(),
        // Every request answered: none of their bytes is held.
        "sheaf_request_memory_bytes 0\n".to_string(),
        "sheaf_request_memory_refused_total 0\n".to_string(),
        // Triton's names for the same figures.
        r#"nv_inference_request_success{model="mlp",version="1"} 5"#.to_string(),
        r#"nv_inference_count{model="mlp",version="1"} 5"#.to_string(),
        r#"nv_inference_pending_request_count{model="mlp",version="1"} 0"#.to_string(),
        "# TYPE nv_inference_queue_duration_us counter".to_string(),
        "nv_cpu_memory_total_bytes ".to_string(),
        "nv_cpu_utilization ".to_string(),
    ] {
        assert!(text.contains(&needle), "/metrics lacks {needle}:\n{text}");
    }
    // Every executed batch is in the batch-size histogram, and its items add up to the requests.
    let sum_line = text
        .lines()
        .find(|l| l.starts_with(&format!("sheaf_batch_size_sum{{{labels}}}")))
        .unwrap();
    assert_eq!(
        sum_line.rsplit(' ').next().unwrap().parse::<f64>().unwrap(),
        5.0
    );
    let stats = server.stats("mlp").await;
    let count_line = text
        .lines()
        .find(|l| l.starts_with(&format!("sheaf_batch_size_count{{{labels}}}")))
        .unwrap();
    assert_eq!(
        count_line.rsplit(' ').next().unwrap(),
        stats["execution_count"].to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_has_the_seed_001_shape_per_server_device_and_model() {
    let server = start(
        &[("mlp", MLP, ""), ("fixed", FIXED, "")],
        HttpConfig::default(),
    )
    .await;
    traffic(&server, 6, 1).await;
    let (status, s) = server.get("/stats").await;
    assert_eq!(status, 200);
    for key in [
        "total_requests",
        "total_batches",
        "current_queue_depth",
        "max_queue_depth",
        "avg_batch_size",
        "avg_wait_time_ms",
        "avg_generation_time_ms",
        "config",
        "num_gpus",
        "gpu_ids",
        "load_balance_strategy",
        "per_gpu_stats",
        "models",
    ] {
        assert!(s.get(key).is_some(), "/stats lacks {key}: {s}");
    }
    assert_eq!(
        s["total_requests"], 6,
        "queued requests: the invalid one never reached a queue"
    );
    assert_eq!(s["num_gpus"], 1);
    assert_eq!(s["gpu_ids"], json!(["cpu"]));
    assert_eq!(s["load_balance_strategy"], "queue_depth");
    assert_eq!(s["per_gpu_stats"][0]["device"], "cpu");
    assert_eq!(s["per_gpu_stats"][0]["models_loaded"], 2);
    assert_eq!(s["per_gpu_stats"][0]["total_requests"], 6);
    let mlp = &s["models"]["mlp"];
    assert_eq!(mlp["total_requests"], 6);
    let batches = mlp["total_batches"].as_u64().unwrap();
    assert!((6.0 / batches as f64 - mlp["avg_batch_size"].as_f64().unwrap()).abs() < 1e-9);
    let histogram: u64 = mlp["batch_size_histogram"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(histogram, batches);
    assert!(mlp["p99_latency_ms"].as_f64().unwrap() >= mlp["p50_latency_ms"].as_f64().unwrap());
    assert_eq!(s["config"]["models"]["mlp"]["max_batch_size"], 32);
    assert_eq!(s["models"]["fixed"]["total_requests"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_numbers_that_move_with_traffic() {
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let profile = tempfile::tempdir().unwrap();
    let url = format!("{}/", server.url);
    let page = url.clone();
    let dir = profile.path().to_path_buf();
    let before = tokio::task::spawn_blocking(move || render(&page, &dir))
        .await
        .unwrap();
    assert_eq!(
        text_of(&before, "status"),
        "live",
        "the page reached /stats"
    );
    assert_eq!(text_of(&before, "total-requests"), "0");

    traffic(&server, 7, 0).await;
    let dir = profile.path().to_path_buf();
    let after = tokio::task::spawn_blocking(move || render(&url, &dir))
        .await
        .unwrap();
    assert_eq!(text_of(&after, "total-requests"), "7");
    assert!(
        after.contains("id=\"model-mlp\""),
        "the models table lists mlp"
    );
    assert_ne!(text_of(&after, "total-batches"), "0");
}
