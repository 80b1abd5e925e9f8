//! Scheduling behaviour on the simulated device: deadlines enforced while the model is busy,
//! priorities and their levels' own queue policies, timeout actions, dropped clients, and
//! instances. The sim model's latency is
//! real (it sleeps), so every assertion is about order and counts, never about durations.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// One item in, `2x + 1` out, every batch takes `ms` milliseconds.
fn sim(ms: u64) -> String {
    format!(
        "input: {{name: x, shape: [-1, 2]}}\noutput: {{name: y}}\nlatency_ms: {{a: {ms}, b: 0}}\n"
    )
}

fn body(v: f32, parameters: Value) -> Value {
    json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [v, v]}], "parameters": parameters})
}

/// Waits (bounded) until the model has `queued` items waiting and `pending` admitted.
async fn until(server: &TestServer, model: &str, queued: usize, pending: usize) {
    let handle = server.manager.get(model, None).unwrap();
    for _ in 0..2000 {
        if handle.queued_items() == queued && handle.pending_items() == pending {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("queue never reached {queued} queued / {pending} pending");
}

/// Sends `body` in the background; the label goes to `done` when the answer arrives.
fn send(
    server: &TestServer,
    body: Value,
    label: &'static str,
    done: tokio::sync::mpsc::UnboundedSender<(&'static str, u16, Value)>,
) {
    let (client, url) = (server.client.clone(), server.infer_url("m"));
    tokio::spawn(async move {
        let r = client.post(url).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        let _ = done.send((label, status, r.json().await.unwrap()));
    });
}

const ONE_AT_A_TIME: &str = "max_batch_size: 1\nbatching: {policy: fixed}\nmax_queue_delay_us: 0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_request_is_answered_while_the_model_is_still_busy() {
    let server = start_sim(&[("m", &sim(600), ONE_AT_A_TIME)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(1.0, json!({})), "long", tx.clone());
    until(&server, "m", 0, 1).await; // the long request is running
    send(
        &server,
        body(2.0, json!({"timeout": 20_000})),
        "expires",
        tx.clone(),
    );
    let (first, status, reply) = rx.recv().await.unwrap();
    assert_eq!(
        first, "expires",
        "the expired request is answered before the running batch ends"
    );
    assert_eq!(status, 504, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("timed out"),
        "{reply}"
    );
    let (second, status, reply) = rx.recv().await.unwrap();
    assert_eq!((second, status), ("long", 200));
    assert_eq!(reply["outputs"][0]["data"], json!([3.0, 3.0]));
    let stats = server.stats("m").await;
    assert_eq!(stats["inference_count"], 1, "the expired request never ran");
    assert_eq!(stats["inference_stats"]["fail"]["count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_requests_run_first() {
    let config = format!("{ONE_AT_A_TIME}priority_levels: 2\n");
    let server = start_sim(&[("m", &sim(300), &config)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "running", tx.clone());
    until(&server, "m", 0, 1).await;
    send(
        &server,
        body(1.0, json!({"priority": 2})),
        "low",
        tx.clone(),
    );
    until(&server, "m", 1, 2).await;
    send(
        &server,
        body(2.0, json!({"priority": 1})),
        "high",
        tx.clone(),
    );
    until(&server, "m", 2, 3).await;
    let order: Vec<&str> = [rx.recv().await, rx.recv().await, rx.recv().await]
        .into_iter()
        .map(|r| r.unwrap().0)
        .collect();
    assert_eq!(order, vec!["running", "high", "low"]);
    let (status, reply) = server
        .post_json("m", &body(1.0, json!({"priority": 3})))
        .await;
    assert_eq!(status, 400);
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("priority 3 is outside 1..=2"),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_level_keeps_a_queue_policy_of_its_own() {
    // Level 1: a default timeout of 100 ms and room for 2 items; level 2: the model's policy
    // (no timeout, the model's room).
    let config = format!(
        "{ONE_AT_A_TIME}priority_levels: 2\npriority_queue_policy: \
         {{1: {{default_timeout_us: 100000, max_queue_size: 2}}}}\n"
    );
    let server = start_sim(&[("m", &sim(600), &config)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "running", tx.clone());
    until(&server, "m", 0, 1).await;
    // Its level's default timeout passes while `running` runs.
    send(
        &server,
        body(1.0, json!({"priority": 1})),
        "expires",
        tx.clone(),
    );
    let (first, status, reply) = rx.recv().await.unwrap();
    assert_eq!((first, status), ("expires", 504), "{reply}");
    // Two level-1 items fill its room; a third is refused at once; level 2 still queues.
    for (label, queued) in [("a", 1), ("b", 2)] {
        send(
            &server,
            body(2.0, json!({"priority": 1, "timeout": 10_000_000})),
            label,
            tx.clone(),
        );
        until(&server, "m", queued, queued + 1).await;
    }
    let (status, reply) = server
        .post_json(
            "m",
            &body(3.0, json!({"priority": 1, "timeout": 10_000_000})),
        )
        .await;
    assert_eq!(status, 503, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("the queue of priority level 1 is full (2 items)"),
        "{reply}"
    );
    send(
        &server,
        body(4.0, json!({"priority": 2})),
        "low",
        tx.clone(),
    );
    until(&server, "m", 3, 4).await;
    let mut answers: Vec<(&str, u16)> = Vec::new();
    for _ in 0..4 {
        let (label, status, _) = rx.recv().await.unwrap();
        answers.push((label, status));
    }
    assert_eq!(
        answers,
        vec![("running", 200), ("a", 200), ("b", 200), ("low", 200)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_s_allow_timeout_override_says_whether_a_request_s_timeout_counts() {
    // Level 1 ignores a request's timeout; level 2 lets one shorten its 10 s default.
    let config = format!(
        "{ONE_AT_A_TIME}priority_levels: 2\npriority_queue_policy: \
         {{1: {{allow_timeout_override: false}}, \
           2: {{allow_timeout_override: true, default_timeout_us: 10000000}}}}\n"
    );
    let server = start_sim(&[("m", &sim(500), &config)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "running", tx.clone());
    until(&server, "m", 0, 1).await;
    // Both ask for 50 ms while `running` runs for 500: only level 2's counts.
    let short = |priority: u64| json!({"priority": priority, "timeout": 50_000});
    send(&server, body(1.0, short(1)), "ignored", tx.clone());
    until(&server, "m", 1, 2).await;
    send(&server, body(2.0, short(2)), "shortened", tx.clone());
    let (first, status, reply) = rx.recv().await.unwrap();
    assert_eq!((first, status), ("shortened", 504), "{reply}");
    let mut rest: Vec<(&str, u16)> = Vec::new();
    for _ in 0..2 {
        let (label, status, _) = rx.recv().await.unwrap();
        rest.push((label, status));
    }
    assert_eq!(rest, vec![("running", 200), ("ignored", 200)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_action_delay_keeps_an_expired_request_but_serves_it_last() {
    let config = format!("{ONE_AT_A_TIME}timeout_action: delay\n");
    let server = start_sim(&[("m", &sim(600), &config)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "running", tx.clone());
    until(&server, "m", 0, 1).await;
    // Queued first, but its 150 ms timeout passes while `running` still runs...
    send(
        &server,
        body(1.0, json!({"timeout": 150_000})),
        "delayed",
        tx.clone(),
    );
    until(&server, "m", 1, 2).await;
    // ...so this later request, queued before that, is served ahead of it.
    send(&server, body(2.0, json!({})), "overtakes", tx.clone());
    until(&server, "m", 2, 3).await;
    let answers: Vec<(&str, u16)> = [rx.recv().await, rx.recv().await, rx.recv().await]
        .into_iter()
        .map(|r| r.map(|(l, s, _)| (l, s)).unwrap())
        .collect();
    assert_eq!(
        answers,
        vec![("running", 200), ("overtakes", 200), ("delayed", 200)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_left_never_runs() {
    let server = start_sim(&[("m", &sim(400), ONE_AT_A_TIME)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "running", tx.clone());
    until(&server, "m", 0, 1).await;
    // A client that gives up while its request waits.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gone = impatient
        .post(server.infer_url("m"))
        .json(&body(5.0, json!({})))
        .send()
        .await;
    assert!(gone.is_err(), "the impatient client timed out");
    assert_eq!(rx.recv().await.unwrap().1, 200);
    let (status, _) = server.post_json("m", &body(1.0, json!({}))).await;
    assert_eq!(status, 200);
    let stats = server.stats("m").await;
    assert_eq!(
        stats["inference_count"], 2,
        "only the two requests with a client ran: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_run_two_batches_at_once() {
    let config = format!("{ONE_AT_A_TIME}instances: 2\n");
    let server = start_sim(&[("m", &sim(400), &config)]).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "a", tx.clone());
    send(&server, body(1.0, json!({})), "b", tx.clone());
    // Both are taken by an instance at once: nothing waits in the queue while both run.
    until(&server, "m", 0, 2).await;
    for _ in 0..2 {
        assert_eq!(rx.recv().await.unwrap().1, 200);
    }
    let (_, config) = server.get("/v2/models/m/config").await;
    assert_eq!(config["instance_group"][0]["count"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_send_again_once_answered_are_batched_together_not_in_halves() {
    // 8 clients in a closed loop, 10 requests each, against a model whose batch costs 100 ms
    // whatever its size. The first request runs alone (nothing is learned yet) and the other 7
    // queue behind it; from then on, an instance that frees up finds one cohort queued while
    // the other is on its way back. Sent at once, the two cohorts would alternate for good:
    // 20 batches. The default policy waits for the answered clients to come back, and the
    // cohorts merge into batches of 8 (the objective, 1 s, leaves room to wait).
    let config = "max_batch_size: 8\nbatching: {latency_slo_ms: 1000}\n";
    let server = start_sim(&[("m", &sim(100), config)]).await;
    let mut clients = Vec::new();
    for c in 0..8u8 {
        let (client, url) = (server.client.clone(), server.infer_url("m"));
        clients.push(tokio::spawn(async move {
            for i in 0..10u8 {
                let v = f32::from(c * 10 + i);
                let r = client
                    .post(&url)
                    .json(&body(v, json!({})))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let reply: Value = r.json().await.unwrap();
                assert_eq!(
                    reply["outputs"][0]["data"],
                    json!([2.0 * v + 1.0, 2.0 * v + 1.0])
                );
            }
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    let stats = server.stats("m").await;
    assert_eq!(stats["inference_count"], 80, "{stats}");
    let batches = stats["execution_count"].as_u64().unwrap();
    assert!(
        batches <= 14,
        "80 requests from 8 clients took {batches} batches: the cohorts did not merge"
    );
}

fn two_sim_devices(routing: &str) -> sheaf_core::ServerConfig {
    sheaf_core::ServerConfig::from_yaml(&format!(
        "devices: ['sim:a', 'sim:b']\nrouting: {routing}\n"
    ))
    .unwrap()
}

fn lane_items(server: &TestServer) -> Vec<(String, u64)> {
    let handle = server.manager.get("m", None).unwrap();
    handle
        .lanes()
        .iter()
        .map(|l| (l.device.clone(), l.stats.snapshot().inference_count))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_routing_sends_work_to_the_idle_device() {
    let server = start_sim_on(
        &[("m", &sim(400), ONE_AT_A_TIME)],
        two_sim_devices("queue_depth"),
    )
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    send(&server, body(0.0, json!({})), "a", tx.clone());
    until(&server, "m", 0, 1).await;
    send(&server, body(1.0, json!({})), "b", tx.clone());
    // The second request goes to the idle device: both run at once, nothing waits.
    until(&server, "m", 0, 2).await;
    for _ in 0..2 {
        assert_eq!(rx.recv().await.unwrap().1, 200);
    }
    assert_eq!(
        lane_items(&server),
        vec![("sim:a".to_string(), 1), ("sim:b".to_string(), 1)]
    );
    let stats = server.stats("m").await;
    assert_eq!(
        stats["inference_count"], 2,
        "model statistics sum the devices"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_routing_alternates_devices() {
    let server = start_sim_on(
        &[("m", &sim(1), ONE_AT_A_TIME)],
        two_sim_devices("round_robin"),
    )
    .await;
    for i in 0..6 {
        assert_eq!(
            server.post_json("m", &body(i as f32, json!({}))).await.0,
            200
        );
    }
    assert_eq!(
        lane_items(&server),
        vec![("sim:a".to_string(), 3), ("sim:b".to_string(), 3)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cuda_device_without_a_gpu_build_fails_the_load_with_the_reason() {
    let config = sheaf_core::ServerConfig::from_yaml("devices: ['cuda:0']\n").unwrap();
    let server = start_on(&[("mlp", MLP, "")], config).await;
    let (status, reply) = server.get("/v2/models/mlp/ready").await;
    assert_eq!(status, 503);
    let reason = reply["error"].as_str().unwrap();
    assert!(
        reason.contains("on cuda:0") && reason.contains("CUDA execution provider"),
        "{reason}"
    );
    assert_eq!(server.get("/v2/health/live").await.0, 200);
}
