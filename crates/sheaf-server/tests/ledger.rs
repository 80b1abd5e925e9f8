//! The memory ledger: loads that do not fit evict idle models first (LRU or LFU), busy models
//! are never evicted, idle models unload after their timeout, and 1,200 models cycle through a
//! budget that holds a tenth of them without the ledger ever going over, and a model loaded again
//! is booked at its new size.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use sheaf_core::{ControlMode, ServerConfig};

fn sim(ms: f64, memory_mb: u64) -> String {
    format!("input: {{name: x, shape: [-1, 2]}}\noutput: {{name: y}}\nlatency_ms: {{a: {ms}, b: 0}}\nmemory_mb: {memory_mb}\n")
}

fn body(v: f32) -> Value {
    json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [v, v]}]})
}

fn config(yaml: &str) -> ServerConfig {
    ServerConfig::from_yaml(yaml).unwrap()
}

fn ready(server: &TestServer) -> Vec<String> {
    server
        .manager
        .list()
        .into_iter()
        .filter(|(_, s)| s.state() == sheaf_core::ModelState::Ready)
        .map(|(n, _)| n)
        .collect()
}

async fn hit(server: &TestServer, model: &str) {
    let (status, reply) = server.post_json(model, &body(1.0)).await;
    assert_eq!(status, 200, "{model}: {reply}");
}

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_that_do_not_fit_evict_the_least_recently_used() {
    let spec = sim(0.1, 100);
    let models: Vec<(&str, &str, &str)> = ["m0", "m1", "m2", "m3"]
        .iter()
        .map(|n| (*n, spec.as_str(), "warmup: false\n"))
        .collect();
    let server = start_sim_with(
        &models,
        config("memory_budget_mb: 250\n"),
        ControlMode::OnDemand,
    )
    .await;
    hit(&server, "m0").await;
    hit(&server, "m1").await;
    assert_eq!(ready(&server), ["m0", "m1"]);
    hit(&server, "m0").await; // m1 is now the least recently used
    hit(&server, "m2").await;
    assert_eq!(ready(&server), ["m0", "m2"]);
    assert!(server.manager.memory_used()[0] <= 250 * MIB);
    let metrics = server.manager.encode_metrics();
    assert!(
        metrics.contains(r#"sheaf_model_evictions_total{model="m1"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lfu_evicts_the_least_used_and_max_models_caps_the_count() {
    let spec = sim(0.1, 1);
    let models: Vec<(&str, &str, &str)> = ["a", "b", "c"]
        .iter()
        .map(|n| (*n, spec.as_str(), "warmup: false\n"))
        .collect();
    let server = start_sim_with(
        &models,
        config("max_models: 2\neviction_policy: lfu\n"),
        ControlMode::OnDemand,
    )
    .await;
    for _ in 0..3 {
        hit(&server, "a").await;
    }
    hit(&server, "b").await;
    hit(&server, "a").await; // a is the most recent and the most used; b the least used
    hit(&server, "c").await;
    assert_eq!(ready(&server), ["a", "c"]);
    assert_eq!(server.manager.models_held(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_requests_is_never_evicted() {
    let models = [
        (
            "slow",
            // Longer than the 2 s a load waits for room.
            sim(2600.0, 100),
            "warmup: false\nmax_batch_size: 1\n",
        ),
        ("other", sim(0.1, 100), "warmup: false\n"),
    ];
    let models: Vec<(&str, &str, &str)> = models
        .iter()
        .map(|(n, s, c)| (*n, s.as_str(), *c))
        .collect();
    let server = start_sim_with(
        &models,
        config("memory_budget_mb: 150\n"),
        ControlMode::OnDemand,
    )
    .await;
    hit(&server, "slow").await;
    let (client, url) = (server.client.clone(), server.infer_url("slow"));
    let running = tokio::spawn(async move {
        client
            .post(url)
            .json(&body(2.0))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    let handle = server.manager.get("slow", None).unwrap();
    for _ in 0..1000 {
        if handle.pending_items() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(handle);
    let asked = std::time::Instant::now();
    let (status, reply) = server.post_json("other", &body(1.0)).await;
    assert_eq!(status, 503, "{reply}");
    // The load waited for `slow` to become idle before it gave up.
    assert!(asked.elapsed() >= Duration::from_secs(2));
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("none can be evicted"),
        "{reply}"
    );
    assert_eq!(running.await.unwrap(), 200);
    hit(&server, "other").await; // now `slow` is idle and makes room
    assert_eq!(ready(&server), ["other"]);
    let (status, reply) = server.post_json("slow", &body(1.0)).await;
    assert_eq!(status, 200, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_models_are_unloaded_after_the_timeout() {
    let spec = sim(0.1, 1);
    let server = start_sim_with(
        &[("m", &spec, "warmup: false\n")],
        config("idle_timeout_s: 1\n"),
        ControlMode::OnDemand,
    )
    .await;
    hit(&server, "m").await;
    assert_eq!(ready(&server), ["m"]);
    for _ in 0..400 {
        if ready(&server).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready(&server).is_empty(), "the idle model was unloaded");
    hit(&server, "m").await; // and loads again on demand
}

/// A Zipf-distributed index in 0..n (exponent 1.1), from a seeded generator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_by_the_model_it_loaded_though_the_next_load_evicts_it() {
    // One model at a time and requests for four: every load evicts the model the load before
    // made, often before the request that made it has been queued. That request still holds
    // the model it loaded and is answered; only a load that finds the one model busy for 2 s
    // may be refused, and says so.
    let spec = sim(0.5, 1);
    let names = ["a", "b", "c", "d"];
    let models: Vec<(&str, &str, &str)> = names
        .iter()
        .map(|n| (*n, spec.as_str(), "warmup: false\n"))
        .collect();
    let server = start_sim_with(&models, config("max_models: 1\n"), ControlMode::OnDemand).await;
    let answered = Arc::new(AtomicU64::new(0));
    stream::iter(0..400usize)
        .for_each_concurrent(8, |i| {
            let (server, answered) = (&server, answered.clone());
            async move {
                let model = names[i % names.len()];
                let (status, reply) = server.post_json(model, &body(i as f32)).await;
                match status {
                    200 => {
                        assert_eq!(
                            reply["outputs"][0]["data"],
                            json!([2.0 * i as f32 + 1.0, 2.0 * i as f32 + 1.0])
                        );
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    503 => assert!(
                        reply["error"]
                            .as_str()
                            .is_some_and(|e| e.contains("is busy")),
                        "{model}: {reply}"
                    ),
                    _ => panic!("{model}: {status} {reply}"),
                }
            }
        })
        .await;
    assert!(answered.load(Ordering::Relaxed) > 0);
    assert!(server.manager.models_held() <= 1);
}

fn zipf(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(1.1)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            cdf.partition_point(|&c| c < u).min(n - 1)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_hundred_models_cycle_through_a_budget_for_a_tenth_of_them() {
    let spec = sim(0.2, 10);
    let names: Vec<String> = (0..1200).map(|i| format!("m{i:04}")).collect();
    let models: Vec<(&str, &str, &str)> = names
        .iter()
        .map(|n| (n.as_str(), spec.as_str(), "warmup: false\n"))
        .collect();
    let budget = 1200 * MIB; // 120 models of 10 MiB
    let server = start_sim_with(
        &models,
        config("memory_budget_mb: 1200\n"),
        ControlMode::OnDemand,
    )
    .await;
    let trace = zipf(names.len(), 3000, 42);
    let answered = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    stream::iter(trace)
        .for_each_concurrent(16, |i| {
            let (server, names, answered, peak) = (&server, &names, answered.clone(), peak.clone());
            async move {
                let (status, reply) = server.post_json(&names[i], &body(i as f32)).await;
                // A load can be refused only when every loaded model is busy; with 16 clients
                // and 120 slots that never happens, so every request succeeds.
                assert_eq!(status, 200, "{}: {reply}", names[i]);
                assert_eq!(
                    reply["outputs"][0]["data"],
                    json!([2.0 * i as f32 + 1.0, 2.0 * i as f32 + 1.0])
                );
                let used = server.manager.memory_used()[0];
                assert!(used <= budget, "the ledger went over budget: {used}");
                peak.fetch_max(used, Ordering::Relaxed);
                answered.fetch_add(1, Ordering::Relaxed);
            }
        })
        .await;
    assert_eq!(answered.load(Ordering::Relaxed), 3000);
    assert!(server.manager.models_held() <= 120);
    let metrics = server.manager.encode_metrics();
    let evictions: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("sheaf_model_evictions_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(evictions > 0, "the trace forced evictions");
    assert!(
        peak.load(Ordering::Relaxed) > budget / 2,
        "the budget was used"
    );
}

/// Waits (at most 10 s) until the manager has booked `model` anew as it grew.
async fn rebooked(server: &TestServer, model: &str) -> sheaf_core::ModelInfo {
    for _ in 0..200 {
        let info = server.manager.model_info(model).unwrap();
        if info.memory_source == sheaf_core::MemorySource::Serving {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("'{model}' was not booked anew");
}

/// A budget of 250 MiB for `grows` (100 MiB at load, 200 once it has run a batch) and `idle`
/// (100 MiB), loaded on demand.
async fn grows_beside_idle() -> TestServer {
    let grows = format!("{}serving_memory_mb: 200\n", sim(0.1, 100));
    let spec = sim(0.1, 100);
    start_sim_with(
        &[
            ("grows", &grows, "warmup: false\n"),
            ("idle", &spec, "warmup: false\n"),
        ],
        config("memory_budget_mb: 250\n"),
        ControlMode::OnDemand,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_grows_as_it_serves_is_booked_anew_and_idle_models_make_room() {
    let server = grows_beside_idle().await;
    hit(&server, "idle").await;
    hit(&server, "grows").await;
    // Both fitted at load (100 + 100 MiB); after its first batch `grows` holds 200.
    let info = rebooked(&server, "grows").await;
    assert_eq!(info.memory_bytes, 200 * MIB);
    assert_eq!(ready(&server), ["grows"], "the idle model made room");
    assert_eq!(server.manager.memory_used(), [200 * MIB]);
    let metrics = server.manager.encode_metrics();
    assert!(
        metrics.contains(r#"sheaf_model_evictions_total{model="idle"} 1"#),
        "{metrics}"
    );
    let (_, stats) = server.get("/v2/models/grows/stats").await;
    assert_eq!(stats["model_stats"][0]["memory_source"], "serving");
    // It still serves, and a load that no longer fits beside it evicts it when it is idle.
    hit(&server, "grows").await;
    hit(&server, "idle").await;
    assert_eq!(ready(&server), ["idle"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_memory_mb_stays_the_booking_however_the_model_grows() {
    let grows = format!("{}serving_memory_mb: 200\n", sim(0.1, 100));
    let server = start_sim_with(
        &[("grows", &grows, "warmup: false\nmemory_mb: 50\n")],
        ServerConfig::default(),
        ControlMode::None,
    )
    .await;
    hit(&server, "grows").await;
    let handle = server.manager.get("grows", None).unwrap();
    for _ in 0..200 {
        if handle.memory_held() == 200 * MIB {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It holds 200 MiB (100 at load, grown by 100 since)...
    assert_eq!(handle.memory_held(), 200 * MIB);
    // ...and its booking stays what its config says.
    assert!(server.manager.rebook_grown().is_empty());
    let info = server.manager.model_info("grows").unwrap();
    assert_eq!(
        (info.memory_source, info.memory_bytes),
        (sheaf_core::MemorySource::Config, 50 * MIB)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_grew_is_reserved_at_that_when_it_loads_again() {
    let server = grows_beside_idle().await;
    hit(&server, "grows").await;
    rebooked(&server, "grows").await;
    server.manager.unload("grows").await.unwrap();
    hit(&server, "idle").await;
    assert_eq!(ready(&server), ["idle"]);
    // Loaded again, before any batch: reserved at the 200 MiB it grew to, so the idle model
    // makes room at admission (at its load figure of 100 MiB both would have fitted).
    server.manager.load("grows").await.unwrap();
    assert_eq!(ready(&server), ["grows"]);
    let info = server.manager.model_info("grows").unwrap();
    assert_eq!(
        (info.memory_source, info.memory_bytes),
        (sheaf_core::MemorySource::Serving, 200 * MIB)
    );
    assert_eq!(server.manager.memory_used(), [200 * MIB]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_loaded_again_is_booked_at_the_new_ones_size() {
    let spec = sim(0.1, 100);
    let server = start_sim_with(
        &[
            ("m", &spec, "warmup: false\n"),
            ("idle", &spec, "warmup: false\n"),
        ],
        config("memory_budget_mb: 250\n"),
        ControlMode::OnDemand,
    )
    .await;
    hit(&server, "m").await;
    hit(&server, "idle").await;
    assert_eq!(server.manager.memory_used(), [200 * MIB]);
    let booked = |server: &TestServer| {
        let info = server.manager.model_info("m").unwrap();
        (info.memory_source, info.memory_bytes)
    };
    let write = |mb: u64| {
        std::fs::write(server.repo.path().join("m/model.sim.yaml"), sim(0.1, mb)).unwrap()
    };
    // Smaller: what the old one held is freed.
    write(60);
    server.manager.load("m").await.unwrap();
    assert_eq!(
        booked(&server),
        (sheaf_core::MemorySource::Backend, 60 * MIB)
    );
    assert_eq!(server.manager.memory_used(), [160 * MIB]);
    // Larger: it must fit, and the idle model makes room.
    write(180);
    server.manager.load("m").await.unwrap();
    assert_eq!(booked(&server).1, 180 * MIB);
    assert_eq!(ready(&server), ["m"]);
    assert_eq!(server.manager.memory_used(), [180 * MIB]);
    // Larger than the budget: the load fails, and the one before serves, booked as it was.
    write(300);
    let Err(e) = server.manager.load("m").await else {
        panic!("a model past the budget loaded again");
    };
    assert!(
        e.message
            .contains("did not load again, and serves as before")
            && e.message.contains("300 MiB"),
        "{}",
        e.message
    );
    assert_eq!(booked(&server).1, 180 * MIB);
    assert_eq!(server.manager.memory_used(), [180 * MIB]);
    hit(&server, "m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_with_a_configuration_during_a_first_load_is_refused() {
    // Its warm-up runs one 400 ms batch, so its first load takes that long at least.
    let server = start_sim_with(
        &[("slow", &sim(400.0, 10), "max_batch_size: 1\n")],
        config(""),
        ControlMode::Explicit,
    )
    .await;
    let manager = server.manager.clone();
    let first = tokio::spawn(async move { manager.load("slow").await.map(drop) });
    for _ in 0..200 {
        if server
            .manager
            .model_info("slow")
            .is_some_and(|i| i.state == sheaf_core::ModelState::Loading)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let config = sheaf_core::pbtxt::load_config(r#"{"max_batch_size": 4}"#).unwrap();
    let Err(e) = server.manager.load_with_config("slow", config).await else {
        panic!("a load with a configuration went through a first load");
    };
    assert!(e.message.contains("is loading"), "{}", e.message);
    first.await.unwrap().unwrap();
    hit(&server, "slow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_served_together_are_booked_and_freed_together() {
    let server = start_sim_with(
        &[],
        config("memory_budget_mb: 250\n"),
        ControlMode::Explicit,
    )
    .await;
    // Versions 1-3 of 100 MB each; the policy serves the newest two.
    let folder = server.repo.path().join("v");
    for version in ["1", "2", "3"] {
        std::fs::create_dir_all(folder.join(version)).unwrap();
        std::fs::write(folder.join(version).join("model.sim.yaml"), sim(0.1, 100)).unwrap();
    }
    std::fs::write(
        folder.join("config.yaml"),
        "warmup: false\nversion_policy: {latest: {num_versions: 2}}\n",
    )
    .unwrap();
    let newest = server.manager.load("v").await.unwrap();
    assert_eq!(newest.version, "3");
    assert_eq!(newest.served_versions(), ["2", "3"]);
    assert_eq!(server.manager.memory_used(), [200 * MIB]);
    assert_eq!(
        server.manager.model_info("v").unwrap().memory_bytes,
        200 * MIB
    );
    // Each version answers on its own route.
    for version in ["2", "3"] {
        let url = format!("{}/v2/models/v/versions/{version}/infer", server.url);
        let r = server
            .client
            .post(url)
            .json(&body(1.0))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "version {version}");
        let answer: Value = r.json().await.unwrap();
        assert_eq!(answer["model_version"], version);
    }
    // All three would not fit the budget: the load fails, naming the sizes, and nothing is
    // held for it after.
    std::fs::write(
        folder.join("config.yaml"),
        "warmup: false\nversion_policy: {all: {}}\n",
    )
    .unwrap();
    server.manager.unload("v").await.unwrap();
    assert_eq!(server.manager.memory_used(), [0]);
    let Err(e) = server.manager.load("v").await else {
        panic!("three versions of 100 MB loaded within 250 MB");
    };
    assert!(e.message.contains("300 MiB"), "{}", e.message);
    assert_eq!(server.manager.memory_used(), [0]);
}
