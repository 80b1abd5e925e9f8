//! The model repository extension and model control: explicit load and unload over HTTP and
//! gRPC, on-demand loading with concurrent loads coalesced, unload draining its requests, and
//! failed loads reported with their reason.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use serde_json::{json, Value};
use sheaf_core::ControlMode;
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;

fn sim(ms: u64) -> String {
    format!("input: {{name: x, shape: [-1, 2]}}\noutput: {{name: y}}\nlatency_ms: {{a: {ms}, b: 0}}\nmemory_mb: 64\n")
}

fn body(v: f32) -> Value {
    json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [v, v]}]})
}

async fn post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let r = server
        .client
        .post(format!("{}{path}", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn index(server: &TestServer) -> Vec<(String, String)> {
    let (status, list) = post(server, "/v2/repository/index", json!({})).await;
    assert_eq!(status, 200);
    list.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(name: &str, state: &str) -> (String, String) {
    (name.to_string(), state.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_mode_loads_and_unloads_over_http_and_grpc() {
    let server = start_sim_mode(
        &[("a", &sim(1), "preload: true\n"), ("b", &sim(1), "")],
        ControlMode::Explicit,
    )
    .await;
    assert_eq!(
        index(&server).await,
        vec![pair("a", "READY"), pair("b", "UNAVAILABLE")]
    );
    let (_, list) = post(&server, "/v2/repository/index", json!({"ready": true})).await;
    assert_eq!(list.as_array().unwrap().len(), 1);

    let (status, reply) = server.post_json("b", &body(1.0)).await;
    assert_eq!(status, 503);
    assert!(
        reply["error"].as_str().unwrap().contains("not loaded"),
        "{reply}"
    );

    assert_eq!(
        post(&server, "/v2/repository/models/b/load", json!({}))
            .await
            .0,
        200
    );
    let (status, reply) = server.post_json("b", &body(1.0)).await;
    assert_eq!(status, 200);
    assert_eq!(reply["outputs"][0]["data"], json!([3.0, 3.0]));
    assert_eq!(
        post(&server, "/v2/repository/models/b/unload", json!({}))
            .await
            .0,
        200
    );
    assert_eq!(
        index(&server).await,
        vec![pair("a", "READY"), pair("b", "UNAVAILABLE")]
    );

    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap();
    let load = pb::RepositoryModelLoadRequest {
        model_name: "b".into(),
        ..Default::default()
    };
    grpc.repository_model_load(load).await.unwrap();
    let ready = pb::ModelReadyRequest {
        name: "b".into(),
        version: String::new(),
    };
    assert!(
        grpc.model_ready(ready.clone())
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let unload = pb::RepositoryModelUnloadRequest {
        model_name: "b".into(),
        ..Default::default()
    };
    grpc.repository_model_unload(unload).await.unwrap();
    assert!(!grpc.model_ready(ready).await.unwrap().into_inner().ready);
    let missing = pb::RepositoryModelLoadRequest {
        model_name: "zzz".into(),
        ..Default::default()
    };
    assert_eq!(
        grpc.repository_model_load(missing)
            .await
            .unwrap_err()
            .code(),
        tonic::Code::NotFound
    );

    let metrics = server.manager.encode_metrics();
    assert!(
        metrics.contains(r#"sheaf_model_loads_total{model="b"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"sheaf_model_unloads_total{model="b"} 2"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_loads_once_for_many_concurrent_requests() {
    let server = start_sim_mode(&[("c", &sim(5), "")], ControlMode::OnDemand).await;
    assert_eq!(index(&server).await, vec![pair("c", "UNAVAILABLE")]);
    let bodies: Vec<Value> = (0..8).map(|i| body(i as f32)).collect();
    let replies = join_all(bodies.iter().map(|b| server.post_json("c", b))).await;
    for (i, (status, reply)) in replies.iter().enumerate() {
        assert_eq!(*status, 200, "{reply}");
        assert_eq!(
            reply["outputs"][0]["data"],
            json!([2.0 * i as f32 + 1.0, 2.0 * i as f32 + 1.0])
        );
    }
    let metrics = server.manager.encode_metrics();
    assert!(
        metrics.contains(r#"sheaf_model_loads_total{model="c"} 1"#),
        "one load for 8 requests:\n{metrics}"
    );
    assert_eq!(index(&server).await, vec![pair("c", "READY")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_waits_for_running_requests_and_refuses_new_ones() {
    let server = start_sim_mode(
        &[("d", &sim(400), "preload: true\nmax_batch_size: 1\n")],
        ControlMode::Explicit,
    )
    .await;
    let (client, url) = (server.client.clone(), server.infer_url("d"));
    // The simulated batch sleeps 400 ms, so it cannot finish before `started + 400 ms`.
    let started = std::time::Instant::now();
    let running = tokio::spawn(async move {
        let r = client.post(url).json(&body(2.0)).send().await.unwrap();
        r.status().as_u16()
    });
    let handle = server.manager.get("d", None).unwrap();
    for _ in 0..1000 {
        if handle.pending_items() == 1 && handle.queued_items() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(handle);
    let (client, base) = (server.client.clone(), server.url.clone());
    let unload = tokio::spawn(async move {
        let r = client
            .post(format!("{base}/v2/repository/models/d/unload"))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), std::time::Instant::now())
    });
    // While draining, the model refuses new work.
    for _ in 0..1000 {
        if index(&server).await == vec![pair("d", "UNLOADING")] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (status, reply) = server.post_json("d", &body(1.0)).await;
    assert_eq!(status, 503);
    assert!(
        reply["error"].as_str().unwrap().contains("unloading"),
        "{reply}"
    );
    let run_status = running.await.unwrap();
    let (unload_status, unload_done) = unload.await.unwrap();
    assert_eq!(
        (run_status, unload_status),
        (200, 200),
        "the running request was answered"
    );
    // Both replies leave the server at nearly the same moment, so their arrival order at the
    // client proves nothing; the batch's fixed duration does.
    assert!(
        unload_done.duration_since(started) >= Duration::from_millis(400),
        "unload answered before the running batch could have finished"
    );
    assert_eq!(index(&server).await, vec![pair("d", "UNAVAILABLE")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_loads_are_reported_and_none_mode_refuses_control() {
    let server = start_sim_mode(&[("bad", "not: [a sim spec", "")], ControlMode::Explicit).await;
    let (status, reply) = post(&server, "/v2/repository/models/bad/load", json!({})).await;
    assert_eq!(status, 503);
    assert!(
        reply["error"].as_str().unwrap().contains("not available"),
        "{reply}"
    );
    let (_, list) = post(&server, "/v2/repository/index", json!({})).await;
    assert_eq!(list[0]["state"], "UNAVAILABLE");
    assert!(!list[0]["reason"].as_str().unwrap().is_empty());
    assert_eq!(server.get("/v2/health/live").await.0, 200);

    let fixed = start_sim(&[("e", &sim(1), "")]).await;
    let (status, reply) = post(&fixed, "/v2/repository/models/e/unload", json!({})).await;
    assert_eq!(status, 400);
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("model control mode is 'none'"),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_repositories_join_under_their_names_until_unregistered() {
    let server = start_sim_mode(&[("a", &sim(1), "")], ControlMode::Explicit).await;
    let extra = tempfile::tempdir().unwrap();
    for folder in ["model", "helper"] {
        std::fs::create_dir_all(extra.path().join(folder)).unwrap();
        std::fs::write(extra.path().join(folder).join("model.sim.yaml"), sim(1)).unwrap();
    }
    let rename = |to: &str| std::collections::BTreeMap::from([("model".into(), to.into())]);
    let m = &server.manager;
    // A folder the registration names must be there; a name the server has is taken.
    let e = m
        .register_repository(
            extra.path(),
            [("absent".to_string(), "x".to_string())].into(),
        )
        .unwrap_err();
    assert!(
        e.message.contains("no model folder 'absent'"),
        "{}",
        e.message
    );
    let e = m
        .register_repository(extra.path(), rename("a"))
        .unwrap_err();
    assert_eq!(e.kind, sheaf_core::ErrorKind::Conflict, "{}", e.message);
    let mut added = m
        .register_repository(extra.path(), rename("served.tar.gz"))
        .unwrap();
    added.sort();
    assert_eq!(added, ["helper", "served.tar.gz"]);
    let e = m
        .register_repository(extra.path(), rename("other"))
        .unwrap_err();
    assert!(e.message.contains("registered already"), "{}", e.message);
    // Its models load and serve through the API, under the names given.
    let (status, _) = post(
        &server,
        "/v2/repository/models/served.tar.gz/load",
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, out) = post(&server, "/v2/models/served.tar.gz/infer", body(2.0)).await;
    assert_eq!(status, 200, "{out}");
    assert!(index(&server)
        .await
        .contains(&pair("served.tar.gz", "READY")));
    assert!(index(&server)
        .await
        .contains(&pair("helper", "UNAVAILABLE")));
    // Unregistered after an unload: its models leave the index.
    let (status, _) = post(
        &server,
        "/v2/repository/models/served.tar.gz/unload",
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    m.unregister_repository(extra.path()).unwrap();
    let names: Vec<String> = index(&server).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a"]);
    let e = m.unregister_repository(extra.path()).unwrap_err();
    assert_eq!(e.kind, sheaf_core::ErrorKind::ModelNotFound);
    // Registered again, it loads again.
    m.register_repository(extra.path(), rename("served.tar.gz"))
        .unwrap();
    let (status, _) = post(
        &server,
        "/v2/repository/models/served.tar.gz/load",
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
}
