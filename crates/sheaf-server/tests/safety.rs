//! Operating safely, over real sockets with real clients (reqwest, tonic): API and admin keys on
//! both protocols, POSTs from other sites and form bodies refused, the drain a shutdown starts
//! (announced: still serving, with `Connection: close` and GOAWAY; begun: refusing), and error
//! messages that keep server paths and long client text out.

mod common;

use bytes::Bytes;
use common::*;
use serde_json::{json, Value};
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use sheaf_server::grpc::pb::model_infer_request::InferInputTensor;
use sheaf_server::{AccessConfig, HttpConfig};
use tonic::transport::Channel;
use tonic::Code;

fn mlp_body() -> Value {
    json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 512],
                       "data": vec![0.0; 512]}]})
}

fn grpc_request() -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![1, 512],
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(to_bytes(&[0.0; 512]))],
        ..Default::default()
    }
}

/// A gRPC request carrying `key` as `authorization: Bearer KEY`.
fn with_key<T>(message: T, key: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}

async fn grpc(server: &TestServer) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap()
}

/// `grpc_request()` on `c`, sent again if a GOAWAY overtook it: a call written as the GOAWAY
/// arrived comes back with it (the server never ran it), and tonic has no transparent retry,
/// where grpc-core, grpc-go and grpc-java send such a call again by themselves.
async fn infer_past_goaway(
    c: &mut GrpcInferenceServiceClient<Channel>,
) -> Result<tonic::Response<pb::ModelInferResponse>, tonic::Status> {
    match c.model_infer(grpc_request()).await {
        Err(e) if format!("{e:?}").contains("GoAway") || e.code() == Code::Cancelled => {
            c.model_infer(grpc_request()).await
        }
        answer => answer,
    }
}

/// Status and body of `method path` with an optional bearer key and JSON body.
async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let base = if path == "/metrics" {
        &server.metrics_url
    } else {
        &server.url
    };
    let mut request = server.client.request(method, format!("{base}{path}"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn keys() -> AccessConfig {
    AccessConfig {
        api_keys: vec!["k1".into(), "k2".into()],
        admin_keys: vec!["root".into()],
        protect_metrics: true,
        ..AccessConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_routes_take_the_key_of_their_scope() {
    use reqwest::Method;
    let server = start_protected(&[("mlp", MLP, "")], keys()).await;
    let infer = "/v2/models/mlp/infer";
    let body = mlp_body();

    // Probes need no key.
    for path in ["/v2/health/live", "/v2/health/ready"] {
        assert_eq!(call(&server, Method::GET, path, None, None).await.0, 200);
    }
    // Inference: 401 with the KServe error body and a Bearer challenge, without a key or with
    // an unknown one; an API key or the admin key opens it.
    for key in [None, Some("k3")] {
        let (status, headers, reply) = call(&server, Method::POST, infer, key, Some(&body)).await;
        assert_eq!(status, 401, "{reply}");
        assert_eq!(headers["www-authenticate"], "Bearer");
        assert!(
            reply["error"].as_str().unwrap().contains("API key"),
            "{reply}"
        );
    }
    for key in ["k1", "k2", "root"] {
        let (status, _, reply) = call(&server, Method::POST, infer, Some(key), Some(&body)).await;
        assert_eq!(status, 200, "{key}: {reply}");
        assert_eq!(reply["outputs"][0]["shape"], json!([1, 10]));
    }
    assert_eq!(
        call(&server, Method::GET, "/v2/models/mlp", None, None)
            .await
            .0,
        401
    );
    assert_eq!(
        call(&server, Method::GET, "/v2/models/mlp", Some("k1"), None)
            .await
            .0,
        200
    );
    // Admin routes: 403 for an API key, 200 for the admin key.
    for (method, path) in [
        (Method::GET, "/v2/models/mlp/stats"),
        (Method::GET, "/v2/models/stats"),
        (Method::GET, "/stats"),
        (Method::POST, "/v2/repository/index"),
        (Method::GET, "/metrics"),
    ] {
        let (status, _, reply) = call(&server, method.clone(), path, None, None).await;
        assert_eq!(status, 401, "{path}: {reply}");
        let (status, _, reply) = call(&server, method.clone(), path, Some("k1"), None).await;
        assert_eq!(status, 403, "{path}: {reply}");
        assert!(reply["error"].as_str().unwrap().contains("admin key"));
        let (status, _, reply) = call(&server, method, path, Some("root"), None).await;
        assert_eq!(status, 200, "{path}: {reply}");
    }
    // The OpenAI routes answer in OpenAI's error shape.
    let (status, _, reply) = call(
        &server,
        Method::POST,
        "/v1/chat/completions",
        Some("nope"),
        Some(&json!({"model": "m", "messages": []})),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(reply["error"]["type"], "authentication_error", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_take_the_key_of_their_scope_from_metadata() {
    let server = start_protected(&[("mlp", MLP, "")], keys()).await;
    let mut c = grpc(&server).await;
    assert!(
        c.server_live(with_key(pb::ServerLiveRequest {}, None))
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(with_key(pb::ServerReadyRequest {}, None))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    for key in [None, Some("k3")] {
        let e = c
            .model_infer(with_key(grpc_request(), key))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    let answer = c
        .model_infer(with_key(grpc_request(), Some("k2")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outputs[0].shape, vec![1, 10]);
    let statistics = || pb::ModelStatisticsRequest {
        name: "mlp".into(),
        version: String::new(),
    };
    let e = c
        .model_statistics(with_key(statistics(), Some("k1")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = c
        .repository_model_unload(with_key(
            pb::RepositoryModelUnloadRequest {
                model_name: "mlp".into(),
                ..Default::default()
            },
            Some("k1"),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let stats = c
        .model_statistics(with_key(statistics(), Some("root")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.model_stats[0].name, "mlp");
    // A stream is opened with the key too.
    let e = c
        .model_stream_infer(with_key(futures::stream::iter(vec![grpc_request()]), None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_from_other_sites_and_form_bodies_are_refused_and_programs_pass() {
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let body = mlp_body().to_string();
    let post = |headers: &[(&'static str, &'static str)]| {
        let mut r = server
            .client
            .post(server.infer_url("mlp"))
            .body(body.clone());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        async move {
            let response = r.send().await.unwrap();
            let status = response.status().as_u16();
            let reply: Value = response.json().await.unwrap();
            (status, reply)
        }
    };
    // What programs send: no Content-Type (tritonclient), or a JSON one.
    assert_eq!(post(&[]).await.0, 200);
    assert_eq!(post(&[("content-type", "application/json")]).await.0, 200);
    // What an HTML form or a cross-site script can send without a CORS preflight.
    for kind in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=b",
        "text/plain",
    ] {
        let (status, reply) = post(&[("content-type", kind)]).await;
        assert_eq!(status, 415, "{kind}: {reply}");
        assert!(
            reply["error"]
                .as_str()
                .unwrap()
                .contains("application/json"),
            "{reply}"
        );
    }
    let (status, reply) = post(&[("origin", "https://evil.example")]).await;
    assert_eq!(status, 403, "{reply}");
    let (status, reply) = post(&[("sec-fetch-site", "cross-site")]).await;
    assert_eq!(status, 403, "{reply}");
    // The dashboard's own page, same origin, still works.
    let host = server.url.trim_start_matches("http://").to_string();
    let response = server
        .client
        .post(server.infer_url("mlp"))
        .header("origin", server.url.clone())
        .header("host", host)
        .header("sec-fetch-site", "same-origin")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_turns_readiness_false_and_refuses_new_work_on_both_protocols() {
    use reqwest::Method;
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let mut c = grpc(&server).await;
    assert_eq!(
        call(&server, Method::GET, "/v2/health/ready", None, None)
            .await
            .0,
        200
    );
    server.state.drain.begin();
    let (status, _, _) = call(&server, Method::GET, "/v2/health/ready", None, None).await;
    assert_eq!(status, 503);
    assert_eq!(
        call(&server, Method::GET, "/v2/health/live", None, None)
            .await
            .0,
        200
    );
    assert!(
        !c.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let (status, headers, reply) = call(
        &server,
        Method::POST,
        "/v2/models/mlp/infer",
        None,
        Some(&mlp_body()),
    )
    .await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(headers["retry-after"], "1");
    assert!(reply["error"].as_str().unwrap().contains("shutting down"));
    // The readiness answer came with a GOAWAY.
    let e = infer_past_goaway(&mut c).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(e.metadata().get("retry-after").unwrap(), "1");
    // Reading is still answered while the drain lasts.
    assert_eq!(
        call(&server, Method::GET, "/v2/models/mlp", None, None)
            .await
            .0,
        200
    );
    assert_eq!(server.state.drain.in_flight(), 0);
}

/// Sends one HTTP/1.1 request on `stream` (kept alive) and reads its answer: the status, the
/// `connection` header, and the body.
async fn keep_alive_request(
    stream: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    head: &str,
    body: &str,
) -> (u16, Option<String>, String) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "{head} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .unwrap();
    let mut line = String::new();
    stream.read_line(&mut line).await.unwrap();
    let status = line[9..12].parse().unwrap();
    let (mut length, mut connection) = (0, None);
    loop {
        line.clear();
        stream.read_line(&mut line).await.unwrap();
        let Some((name, value)) = line.trim_end().split_once(": ") else {
            break;
        };
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().unwrap(),
            "connection" => connection = Some(value.to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();
    (status, connection, String::from_utf8(body).unwrap())
}

/// An HTTP/2 connection (prior knowledge, no TLS) to `address`, driven on a task of its own;
/// the task ends when the server closes the connection.
async fn h2_connection(
    address: &str,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    (send, driven)
}

/// A gRPC call of `method` with an empty message, over a raw HTTP/2 connection: its grpc-status.
async fn h2_grpc_call(
    send: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>,
    method: &str,
) -> String {
    use http_body_util::BodyExt;
    send.ready().await.unwrap();
    let request =
        axum::http::Request::post(format!("http://x/inference.GRPCInferenceService/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            // One message, uncompressed, of no bytes.
            .body(http_body_util::Full::new(Bytes::from_static(&[
                0, 0, 0, 0, 0,
            ])))
            .unwrap();
    let response = send.send_request(request).await.unwrap();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    trailers["grpc-status"].to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_drain_still_serves_and_sends_every_client_elsewhere() {
    use std::time::Duration;
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let http_address = server.url.trim_start_matches("http://").to_string();
    let grpc_address = server.grpc_url.trim_start_matches("http://").to_string();
    let body = mlp_body().to_string();
    // Before: an HTTP/1.1 connection kept alive, an HTTP/2 one to each port.
    let tcp = tokio::net::TcpStream::connect(&http_address).await.unwrap();
    let mut h1 = tokio::io::BufReader::new(tcp);
    let (status, connection, reply) =
        keep_alive_request(&mut h1, "POST /v2/models/mlp/infer", &body).await;
    assert_eq!((status, connection), (200, None), "{reply}");
    let (mut h2, h2_open) = h2_connection(&http_address).await;
    h2.ready().await.unwrap();
    let live = axum::http::Request::get("http://x/v2/health/live")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(h2.send_request(live).await.unwrap().status(), 200);
    let (mut raw_grpc, grpc_open) = h2_connection(&grpc_address).await;
    assert_eq!(h2_grpc_call(&mut raw_grpc, "ServerLive").await, "0");

    server.state.drain.announce();
    // Readiness is false at once, over both protocols ...
    let (status, _, _) = call(
        &server,
        reqwest::Method::GET,
        "/v2/health/ready",
        None,
        None,
    )
    .await;
    assert_eq!(status, 503);
    let mut c = grpc(&server).await;
    let ready = c.server_ready(pb::ServerReadyRequest {}).await.unwrap();
    assert!(!ready.into_inner().ready);
    // ... while work is still served: the HTTP/1.1 answer says the connection closes, and
    // then it does.
    let (status, connection, reply) =
        keep_alive_request(&mut h1, "POST /v2/models/mlp/infer", &body).await;
    assert_eq!(status, 200, "{reply}");
    assert!(reply.contains("outputs"), "{reply}");
    assert_eq!(connection.as_deref(), Some("close"));
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut h1, &mut rest),
    )
    .await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
    // HTTP/2 on either port: the open connections get a GOAWAY and end; one opened during the
    // drain is served, then gets its GOAWAY too.
    for (open, what) in [(h2_open, "HTTP/2"), (grpc_open, "gRPC")] {
        tokio::time::timeout(Duration::from_secs(5), open)
            .await
            .unwrap_or_else(|_| panic!("the {what} connection ends after a GOAWAY"))
            .unwrap();
    }
    assert!(h2.is_closed() && raw_grpc.is_closed());
    let (mut h2, h2_open) = h2_connection(&http_address).await;
    let models = axum::http::Request::get("http://x/v2/models/mlp")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    h2.ready().await.unwrap();
    assert_eq!(h2.send_request(models).await.unwrap().status(), 200);
    let (mut raw_grpc, grpc_open) = h2_connection(&grpc_address).await;
    assert_eq!(h2_grpc_call(&mut raw_grpc, "ServerLive").await, "0");
    for (open, what) in [(h2_open, "HTTP/2"), (grpc_open, "gRPC")] {
        tokio::time::timeout(Duration::from_secs(5), open)
            .await
            .unwrap_or_else(|_| panic!("the new {what} connection ends after its answer"))
            .unwrap();
    }
    // tonic's channel reconnects by itself.
    let answer = infer_past_goaway(&mut c).await.unwrap().into_inner();
    assert_eq!(answer.outputs[0].shape, vec![1, 10]);
    // A new connection is still accepted and served until the drain refuses work.
    let (status, _, reply) = call(
        &server,
        reqwest::Method::POST,
        "/v2/models/mlp/infer",
        None,
        Some(&mlp_body()),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(server.state.drain.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_keep_server_paths_and_long_client_text_out() {
    use reqwest::Method;
    // A model whose file is not ONNX fails to load.
    let server = start(
        &[("mlp", MLP, ""), ("broken", "README.md", "")],
        HttpConfig::default(),
    )
    .await;
    let root = server.repo.path().to_string_lossy().to_string();
    let canonical = server
        .repo
        .path()
        .canonicalize()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let (status, _, reply) = call(
        &server,
        Method::POST,
        "/v2/repository/models/broken/load",
        None,
        None,
    )
    .await;
    assert_ne!(status, 200, "{reply}");
    let (_, _, index) = call(&server, Method::POST, "/v2/repository/index", None, None).await;
    let (_, _, ready) = call(&server, Method::GET, "/v2/models/broken/ready", None, None).await;
    let (_, _, stats) = call(&server, Method::GET, "/stats", None, None).await;
    let mut c = grpc(&server).await;
    let grpc_index = c
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    let grpc_reason = grpc_index
        .models
        .iter()
        .find(|m| m.name == "broken")
        .map(|m| m.reason.clone())
        .unwrap();
    assert!(
        grpc_reason.contains("broken/1/model.onnx"),
        "the reason names the model's file: {grpc_reason}"
    );
    for text in [
        reply.to_string(),
        index.to_string(),
        ready.to_string(),
        stats.to_string(),
        grpc_reason,
    ] {
        assert!(
            !text.contains(&root) && !text.contains(&canonical),
            "a server path leaked: {text}"
        );
    }

    // A 10 KB model name is cut in the answer, over both protocols.
    let long = "m".repeat(10_000);
    let (status, _, reply) = call(
        &server,
        Method::POST,
        &format!("/v2/models/{long}/infer"),
        None,
        Some(&mlp_body()),
    )
    .await;
    assert_eq!(status, 404);
    let message = reply["error"].as_str().unwrap();
    assert!(message.len() < 400, "{} bytes", message.len());
    assert!(message.contains("(10000 bytes)"), "{message}");
    let mut request = grpc_request();
    request.model_name = long;
    let e = c.model_infer(request).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().len() < 400, "{} bytes", e.message().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_message_over_the_limit_is_resource_exhausted() {
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(sheaf_server::grpc::serve(
        listener,
        server.state.clone(),
        1 << 20,
        std::future::pending(),
    ));
    let mut c = GrpcInferenceServiceClient::connect(url).await.unwrap();
    let mut request = grpc_request();
    request.raw_input_contents = vec![Bytes::from(vec![0u8; 2 << 20])];
    let e = c.model_infer(request).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("size limit"), "{}", e.message());
    // The connection, and the server, go on.
    let answer = c.model_infer(grpc_request()).await.unwrap().into_inner();
    assert_eq!(answer.outputs[0].shape, vec![1, 10]);
}

/// Serves `server`'s state on a new port under `limits`; its `http://` URL.
async fn serve_limited(server: &TestServer, limits: sheaf_server::ConnectionLimits) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = sheaf_server::router(
        server.state.clone(),
        &HttpConfig {
            body_timeout: limits.body_timeout,
            ..HttpConfig::default()
        },
    );
    tokio::spawn(sheaf_server::serve_with(
        listener,
        router,
        limits,
        None,
        server.state.drain.clone(),
        std::future::pending(),
    ));
    url
}

/// Everything the server sends on `stream` until it closes it (or 10 s pass).
async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut text = Vec::new();
    let read = stream.read_to_end(&mut text);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the server closed the connection");
    String::from_utf8_lossy(&text).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_while_others_are_served() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let url = serve_limited(
        &server,
        sheaf_server::ConnectionLimits {
            max_connections: 64,
            header_timeout: Duration::from_millis(500),
            body_timeout: Duration::from_millis(500),
            keepalive: None,
            max_age: None,
        },
    )
    .await;
    let address = url.trim_start_matches("http://").to_string();
    // Headers that never end, and a body that trickles in a byte at a time.
    let mut slow_header = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow_header
        .write_all(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let mut slow_body = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow_body
        .write_all(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow_body.write_all(b" ").await.is_err() {
                break;
            }
        }
        read_to_close(&mut slow_body).await
    });
    // Others are served meanwhile.
    let served = || async {
        let r = server
            .client
            .post(format!("{url}/v2/models/mlp/infer"))
            .json(&mlp_body())
            .send()
            .await
            .unwrap();
        r.status() == 200
    };
    for _ in 0..3 {
        assert!(served().await);
    }
    // The slow header is cut off with nothing answered; the slow body gets 408.
    let answer = read_to_close(&mut slow_header).await;
    assert!(!answer.contains("200 OK"), "{answer}");
    let answer = trickle.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"error\""), "{answer}");
    assert!(served().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_room() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let url = serve_limited(
        &server,
        sheaf_server::ConnectionLimits {
            max_connections: 2,
            ..Default::default()
        },
    )
    .await;
    let address = url.trim_start_matches("http://").to_string();
    let first = tokio::net::TcpStream::connect(&address).await.unwrap();
    let _second = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Give the server time to take both.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = tokio::net::TcpStream::connect(&address).await.unwrap();
    third
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut buf)).await;
    assert!(early.is_err(), "answered past the cap of 2 connections");
    drop(first);
    let answer = read_to_close(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_broken_chunked_framing_gets_the_json_error_body() {
    let server = start(&[("mlp", MLP, "")], HttpConfig::default()).await;
    let address = server.url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(address).await.unwrap();
    use tokio::io::AsyncWriteExt;
    // A chunk size that is not hexadecimal.
    s.write_all(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert!(
        body.contains("\"error\":\"cannot read the request body"),
        "{answer}"
    );
}

/// A connection accepted just before the listener closes, whose request comes after: it is
/// answered, not closed unread (its client would read a reset); one that never sends is
/// closed after its grace, and the server returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_request_comes_as_the_listener_closes_is_answered() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = axum::Router::new().route("/ping", axum::routing::get(|| async { "pong" }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sheaf_server::serve_with(
        listener,
        router,
        sheaf_server::ConnectionLimits::default(),
        None,
        Default::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let mut late = tokio::net::TcpStream::connect(address).await.unwrap();
    let _silent = tokio::net::TcpStream::connect(address).await.unwrap();
    // Both are accepted and wait for a request when the close begins.
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    late.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), late.read_to_string(&mut answer))
        .await
        .expect("the answer and the close come")
        .expect("no reset");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("pong"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server returns once the silent connection's grace is over")
        .unwrap()
        .unwrap();
}

/// A request whose bytes would pass the server's request memory (`--max-request-memory`) is
/// refused before its body arrives: over HTTP by its declared length (503), over gRPC by its
/// message's prefix (RESOURCE_EXHAUSTED), while the slow upload that holds the memory waits;
/// a refused body sent all the same is read and dropped; once the slow upload is answered its
/// bytes are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_request_memory_are_refused_before_their_bodies_arrive() {
    use http_body_util::BodyExt;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    const MIB: usize = 1 << 20;
    let server = start_with_request_memory(&[("mlp", MLP, "")], 8 * MIB).await;
    let memory = server.state.request_memory.clone();
    let held_becomes = |bytes: usize| {
        let memory = memory.clone();
        async move {
            let start = Instant::now();
            while memory.held() != bytes && start.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(memory.held(), bytes);
        }
    };
    let http_address = server.url.trim_start_matches("http://").to_string();
    let head = |length: usize| {
        format!(
            "POST /v2/models/mlp/infer HTTP/1.1\r\nhost: sheaf\r\ncontent-length: {length}\r\n\r\n"
        )
    };
    // A slow upload holds 6 of the 8 MiB: all of its body sent but the last byte.
    let slow = tokio::net::TcpStream::connect(&http_address).await.unwrap();
    let mut slow = tokio::io::BufReader::new(slow);
    slow.get_mut()
        .write_all(head(6 * MIB).as_bytes())
        .await
        .unwrap();
    slow.get_mut()
        .write_all(&vec![b'0'; 6 * MIB - 1])
        .await
        .unwrap();
    held_becomes(6 * MIB).await;

    // gRPC: a call whose message's prefix declares 3 MiB, and nothing more of it is sent.
    let grpc_address = server.grpc_url.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&grpc_address).await.unwrap();
    type Frames = futures::channel::mpsc::UnboundedReceiver<
        Result<http_body::Frame<Bytes>, std::convert::Infallible>,
    >;
    let (mut send, connection) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::StreamBody<Frames>>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
    tokio::spawn(connection);
    let (frames, body) = futures::channel::mpsc::unbounded();
    let mut prefix = vec![0u8];
    prefix.extend((3 * MIB as u32).to_be_bytes());
    frames
        .unbounded_send(Ok(http_body::Frame::data(Bytes::from(prefix))))
        .unwrap();
    let call = axum::http::Request::post("http://x/inference.GRPCInferenceService/ModelInfer")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::StreamBody::new(body))
        .unwrap();
    send.ready().await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let response = send.send_request(call).await.unwrap();
        let (parts, body) = response.into_parts();
        let trailers = body.collect().await.unwrap().trailers().cloned();
        trailers.unwrap_or(parts.headers)
    })
    .await
    .expect("the call is answered while its message is still on its way");
    assert_eq!(answered["grpc-status"], "8", "{answered:?}");
    let message = answered["grpc-message"].to_str().unwrap();
    assert!(message.contains("--max-request-memory"), "{message}");
    drop(frames);

    // HTTP: a declared length past what is left, and none of its body sent.
    let refused = tokio::net::TcpStream::connect(&http_address).await.unwrap();
    let mut refused = tokio::io::BufReader::new(refused);
    refused
        .get_mut()
        .write_all(head(3 * MIB).as_bytes())
        .await
        .unwrap();
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(10), refused.read_line(&mut line))
        .await
        .expect("refused at once")
        .unwrap();
    assert!(line.starts_with("HTTP/1.1 503"), "{line}");
    held_becomes(6 * MIB).await;
    // Its body, sent after the refusal, is read and dropped rather than reset under the
    // client, and the connection serves on.
    refused
        .get_mut()
        .write_all(&vec![b'0'; 3 * MIB])
        .await
        .unwrap();
    refused
        .get_mut()
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: sheaf\r\n\r\n")
        .await
        .unwrap();
    loop {
        line.clear();
        let read = tokio::time::timeout(Duration::from_secs(10), refused.read_line(&mut line));
        assert!(read.await.unwrap().unwrap() > 0, "the connection closed");
        // The refusal's JSON body ends without a newline: the next answer's status line
        // follows it on the same line.
        if line.contains("HTTP/1.1 ") {
            break;
        }
    }
    assert!(line.contains("HTTP/1.1 200"), "{line}");
    held_becomes(6 * MIB).await;

    // The slow upload's last byte: it is answered (its bytes are no tensor), and given back.
    slow.get_mut().write_all(b"0").await.unwrap();
    line.clear();
    slow.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");
    held_becomes(0).await;
}
