//! Every bad input gets the protocol's `{"error": ...}` body with a message naming what was
//! wrong, and bad requests never disturb good ones.

mod common;

use common::*;
use futures::future::join_all;
use serde_json::{json, Value};
use sheaf_server::HttpConfig;

fn mlp_input(name: &str, datatype: &str, shape: Value, data: Value) -> Value {
    json!({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]})
}

fn zeros(n: usize) -> Value {
    json!(vec![0.0; n])
}

/// Sends `request` on a raw TCP connection and returns the status and body of the answer.
async fn raw_http(url: &str, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut buf));
        let n = read.await.expect("the server answered").unwrap_or(0);
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer);
        if n == 0 || text.contains("\"}") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text[9..12].parse().unwrap();
    (
        status,
        text.split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string(),
    )
}

async fn expect(server: &TestServer, model: &str, body: &Value, status: u16, needle: &str) {
    let (got, reply) = server.post_json(model, body).await;
    let message = reply["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error body: {reply}"));
    assert_eq!(got, status, "{message}");
    assert!(
        message.contains(needle),
        "'{message}' does not mention '{needle}'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_request_gets_a_specific_error() {
    let server = start(
        &[("mlp", MLP, "")],
        HttpConfig {
            max_body_bytes: 1 << 20,
            ..HttpConfig::default()
        },
    )
    .await;
    let good = mlp_input("input", "FP32", json!([1, 512]), zeros(512));
    assert_eq!(server.post_json("mlp", &good).await.0, 200);

    expect(&server, "nope", &good, 404, "unknown model 'nope'").await;
    // A shape of 2^33 elements with one value of data: refused before anything is set aside
    // for it (it used to abort the process), and the server goes on serving.
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([1, 8589934592u64]), json!([0])),
        400,
        "has 1 elements in 'data', but shape [1, 8589934592] needs 8589934592",
    )
    .await;
    assert_eq!(server.post_json("mlp", &good).await.0, 200);
    let (status, body) = server.get("/v2/models/mlp/versions/9").await;
    assert_eq!(status, 404);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("unknown version '9'"));
    expect(
        &server,
        "mlp",
        &mlp_input("inp", "FP32", json!([1, 512]), zeros(512)),
        400,
        "unexpected input 'inp'",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP64", json!([1, 512]), zeros(512)),
        400,
        "datatype FP64, but the model expects FP32",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([1, 511]), zeros(511)),
        400,
        "has shape [1, 511], but the model expects [-1, 512]",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([512]), zeros(512)),
        400,
        "has shape [512]",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([1, 512]), zeros(500)),
        400,
        "has 500 elements in 'data', but shape [1, 512] needs 512",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "BYTES", json!([1, 512]), zeros(512)),
        400,
        "input 'input' is BYTES: its data must be strings",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([1, -512]), zeros(512)),
        400,
        "negative dimension",
    )
    .await;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([1, 512]), json!(["a"])),
        400,
        "string",
    )
    .await;
    // Ragged rows (256 and 768 values for [2, 512]), and a value FP32 cannot hold.
    expect(
        &server,
        "mlp",
        &mlp_input(
            "input",
            "FP32",
            json!([2, 512]),
            json!([vec![0.0; 256], vec![0.0; 768]]),
        ),
        400,
        "ragged data",
    )
    .await;
    let mut huge = vec![0.0; 512];
    huge[7] = 1e39;
    expect(
        &server,
        "mlp",
        &mlp_input("input", "FP32", json!([1, 512]), json!(huge)),
        400,
        "value 1e39 is out of range for FP32",
    )
    .await;
    expect(
        &server,
        "mlp",
        &json!({"inputs": []}),
        400,
        "missing input 'input'",
    )
    .await;
    let mut wrong_output = good.clone();
    wrong_output["outputs"] = json!([{"name": "logits"}]);
    expect(
        &server,
        "mlp",
        &wrong_output,
        400,
        "unknown output 'logits'",
    )
    .await;

    // Malformed JSON.
    let r = server
        .client
        .post(server.infer_url("mlp"))
        .body("{\"inputs\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("malformed request JSON"),
        "{body}"
    );

    // Binary data that does not add up.
    let header = json!({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                    "parameters": {"binary_data_size": 2048}}]})
    .to_string();
    let mut short = header.clone().into_bytes();
    short.extend(vec![0u8; 1000]);
    let r = server
        .client
        .post(server.infer_url("mlp"))
        .header("Inference-Header-Content-Length", header.len())
        .body(short)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("binary_data_size 2048, but only 1000 bytes"),
        "{body}"
    );

    // A body over the limit is refused from its Content-Length, before it is read. Only the
    // headers are sent, so the answer cannot race an upload the server will not read.
    let (status, body) = raw_http(
        &server.url,
        &format!(
            "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            2 << 20
        ),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.to_lowercase().contains("length limit"), "{body}");

    // Unknown endpoints answer in the same error shape.
    let (status, body) = server.get("/v2/nothing").await;
    assert_eq!(status, 404);
    assert!(body["error"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_never_disturb_good_ones_sent_alongside() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 16\nmax_queue_delay_us: 100000\n",
        )],
        HttpConfig::default(),
    )
    .await;
    let x = floats(3, 512);
    let want = in_process(MLP, &[1, 512], &x);
    let good = mlp_input("input", "FP32", json!([1, 512]), json!(x));
    let bad = mlp_input("input", "FP32", json!([1, 512]), zeros(3));
    let bodies: Vec<(bool, Value)> = (0..16)
        .map(|i| {
            (
                i % 2 == 0,
                if i % 2 == 0 {
                    good.clone()
                } else {
                    bad.clone()
                },
            )
        })
        .collect();
    let replies = join_all(bodies.iter().map(|(_, b)| server.post_json("mlp", b))).await;
    for ((is_good, _), (status, body)) in bodies.iter().zip(replies) {
        if *is_good {
            assert_eq!(status, 200, "{body}");
            let got: Vec<f32> = body["outputs"][0]["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            assert_close(&got, &want, 1e-4, "good request beside bad ones");
        } else {
            assert_eq!(status, 400, "{body}");
        }
    }
    let stats = server.stats("mlp").await;
    assert_eq!(
        stats["inference_count"], 8,
        "only the good requests reach the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once_and_answers_everything_it_took() {
    // Four items fit in the queue; the long delay keeps admitted requests waiting.
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 64\nmax_queue_delay_us: 1000000\nmax_queue_size: 4\n",
        )],
        HttpConfig::default(),
    )
    .await;
    let body = mlp_input("input", "FP32", json!([1, 512]), zeros(512));
    let replies = join_all((0..12).map(|_| async {
        let r = server
            .client
            .post(server.infer_url("mlp"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (r.status().as_u16(), retry, r.json::<Value>().await.unwrap())
    }))
    .await;
    let ok = replies.iter().filter(|r| r.0 == 200).count();
    let refused: Vec<_> = replies.iter().filter(|r| r.0 == 503).collect();
    assert_eq!(
        ok + refused.len(),
        12,
        "every request is answered: {replies:?}"
    );
    assert!(ok >= 1 && ok <= 12 - refused.len());
    assert!(
        !refused.is_empty(),
        "12 concurrent requests never overflowed a queue of 4"
    );
    for (_, retry, body) in &refused {
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(
            body["error"].as_str().unwrap().contains("queue is full"),
            "{body}"
        );
    }
    // A request that can never fit is a client error, not overload.
    let huge = mlp_input("input", "FP32", json!([5, 512]), zeros(5 * 512));
    expect(
        &server,
        "mlp",
        &huge,
        400,
        "more than model 'mlp' can queue (4)",
    )
    .await;
}
