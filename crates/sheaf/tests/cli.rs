//! The `sheaf` binary as a user runs it: help text, `serve` on the demo repository over a real
//! socket, and the error when ONNX Runtime is missing.

mod common;

use common::{demo_mlp, mlp_repository, root, sheaf, Server};

#[test]
fn help_documents_every_serve_flag() {
    let out = sheaf().args(["serve", "--help"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--model-repository",
        "--http-port",
        "--host",
        "--onnxruntime-lib",
        "--max-body-bytes",
        "--log-format",
        "--log-level",
        "--api-key",
        "--admin-key",
        "--protect-metrics",
        "--shutdown-timeout",
        "--max-connections",
        "--client-header-timeout",
        "--client-body-timeout",
    ] {
        assert!(text.contains(flag), "serve --help lacks {flag}:\n{text}");
    }
    assert!(text.contains("default 8000"), "{text}");
    assert!(
        text.contains("on_demand"),
        "the control modes are spelled as documented: {text}"
    );
    let top = sheaf().arg("--help").output().unwrap();
    let text = String::from_utf8(top.stdout).unwrap();
    assert!(text.contains("serve") && text.contains("bench"), "{text}");
}

#[test]
fn serve_answers_on_the_demo_repository() {
    let repo = root().join("model_repository");
    assert!(
        repo.join("mlp/1/model.onnx").is_file(),
        "run scripts/setup.sh first"
    );
    let server = Server::start(&repo);
    // mlp, nsfw, orientation, efficientnet, faces, the text encoder minilm, the generation
    // model smollm2, the pipelines classify and classify_python, the Python models digits
    // and preprocess, and the stateful stream model gru: one manager loads them all.
    assert_eq!(server.ready, 12);
    let http = |method: &str, path: &str, body: &str| {
        http_request(&server.http, &format!("{method} {path}"), body)
    };
    assert_eq!(http("GET", "/v2/health/ready", "").0, 200);
    let data = vec!["0.25"; 512].join(",");
    let (status, body) = http(
        "POST",
        "/v2/models/mlp/infer",
        &format!(
            r#"{{"inputs":[{{"name":"input","shape":[1,512],"datatype":"FP32","data":[{data}]}}]}}"#
        ),
    );
    assert_eq!(status, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["outputs"][0]["shape"], serde_json::json!([1, 10]));
    let (status, body) = http(
        "POST",
        "/v1/embeddings",
        r#"{"model":"minilm","input":["The demo embeds text."],"encoding_format":"float"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    let vector = reply["data"][0]["embedding"].as_array().unwrap();
    assert_eq!(vector.len(), 384);
    let norm: f64 = vector.iter().map(|v| v.as_f64().unwrap().powi(2)).sum();
    assert!((norm - 1.0).abs() < 1e-4, "normalised: {norm}");
    drop(server);
}

/// A connection limit that would serve nothing, or that no semaphore can count, is refused as
/// the flag is read.
#[test]
fn a_connection_limit_of_none_or_past_counting_is_refused() {
    for given in ["0", "18446744073709551615"] {
        let out = sheaf()
            .args(["serve", "--max-connections", given, "--model-repository"])
            .arg(root().join("model_repository"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("from 1 to 1048576"), "{given}: {text}");
    }
}

/// A time no clock reading can be added to is refused as the server starts, naming the flag:
/// a header timeout of 10^19 s panicked every connection.
#[test]
fn times_past_what_a_clock_holds_are_refused() {
    let repo = tempfile::tempdir().unwrap();
    for (flag, given) in [
        ("--client-header-timeout", "1e19"),
        ("--client-body-timeout", "-1"),
        ("--drain-delay", "nan"),
        ("--repository-poll-secs", "0"),
    ] {
        let out = sheaf()
            .args([
                "serve",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
            ])
            .arg(format!("{flag}={given}"))
            .arg("--model-repository")
            .arg(repo.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {given}");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains(&format!("{flag} must be a number of seconds")),
            "{flag} {given}: {text}"
        );
        assert!(!text.contains("panicked"), "{text}");
    }
}

/// A command that fails says why once: in its log line where that is text on stderr, and as a
/// plain line where the log is JSON or says nothing of errors.
#[test]
fn a_failing_command_says_why_once() {
    let run = |log: &[&str]| {
        let out = sheaf()
            .args(log)
            .args(["models", "list", "--url", "http://127.0.0.1:1"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = |text: &str| text.lines().filter(|l| l.contains("cannot reach")).count();
    let text = run(&[]);
    assert_eq!(said(&text), 1, "{text}");
    assert!(text.contains("ERROR"), "{text}");
    let json = run(&["--log-format", "json"]);
    assert_eq!(said(&json), 2, "{json}");
    assert!(
        json.lines()
            .any(|l| l.starts_with('{') && l.contains("cannot reach")),
        "{json}"
    );
    assert!(
        json.lines().any(|l| l.starts_with("sheaf: cannot reach")),
        "{json}"
    );
    let quiet = run(&["--log-level", "off"]);
    assert_eq!(said(&quiet), 1, "{quiet}");
    assert!(quiet.starts_with("sheaf: cannot reach"), "{quiet}");
}

#[test]
fn a_missing_onnx_runtime_says_how_to_get_it() {
    let out = sheaf()
        .args(["serve", "--http-port", "0", "--model-repository"])
        .arg(root().join("model_repository"))
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("/nonexistent/libonnxruntime.so") && text.contains("scripts/setup.sh"),
        "{text}"
    );
}

#[test]
fn logs_are_structured_with_a_line_per_load_and_per_batch() {
    // Two of the demo's models: the MLP as the demo configures it, and the GRU beside it.
    let repo = demo_mlp();
    std::os::unix::fs::symlink(
        root().join("model_repository/gru").canonicalize().unwrap(),
        repo.path().join("gru"),
    )
    .unwrap();
    let server = Server::start_with(repo.path(), &["--log-level", "info,sheaf_core=debug"]);
    let lines = || server.log.lock().unwrap().clone();
    let entries = |lines: Vec<String>| -> Vec<serde_json::Value> {
        lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let loads: Vec<_> = entries(lines())
        .into_iter()
        .filter(|e| e["fields"]["message"] == "model loaded")
        .collect();
    let mut loaded: Vec<_> = loads.iter().map(|l| l["fields"]["model"].clone()).collect();
    loaded.sort_by_key(|m| m.to_string());
    assert_eq!(loaded, ["gru", "mlp"], "{loads:?}");
    for l in &loads {
        assert_eq!(l["level"], "INFO");
        for field in ["model", "version", "path", "max_batch_size", "load_ms"] {
            assert!(
                !l["fields"][field].is_null(),
                "load line lacks {field}: {l}"
            );
        }
    }
    let data = vec!["0.5"; 512].join(",");
    let body = format!(
        r#"{{"inputs":[{{"name":"input","shape":[1,512],"datatype":"FP32","data":[{data}]}}]}}"#
    );
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&server.http).unwrap();
    write!(s, "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The batch line is written before the answer goes out; give the log reader a moment.
    let mut batch = None;
    for _ in 0..200 {
        batch = entries(lines())
            .into_iter()
            .find(|e| e["fields"]["message"] == "batch");
        if batch.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let batch = batch.expect("a debug line per batch");
    assert_eq!(batch["level"], "DEBUG");
    let f = &batch["fields"];
    assert_eq!(f["instance"].as_str().unwrap(), "sheaf-mlp@cpu-0");
    assert_eq!(f["batch_size"], 1);
    assert!(f["compute_ms"].as_f64().unwrap() > 0.0);
    assert!(f["queue_wait_ms"].as_f64().is_some());
}

#[test]
fn models_subcommand_lists_loads_unloads_and_reports() {
    let repo = tempfile::tempdir().unwrap();
    for name in ["first", "second"] {
        std::fs::create_dir_all(repo.path().join(name)).unwrap();
        std::fs::write(
            repo.path().join(name).join("model.sim.yaml"),
            "input: {name: x, shape: [-1, 2]}\noutput: {name: y}\nlatency_ms: {a: 1, b: 0}\n",
        )
        .unwrap();
    }
    std::fs::write(repo.path().join("first/config.yaml"), "preload: true\n").unwrap();
    let server = Server::start_with(repo.path(), &["--model-control-mode", "explicit"]);
    let url = format!("http://{}", server.http);
    let models = |args: &[&str]| {
        let out = sheaf()
            .arg("models")
            .args(args)
            .arg("--url")
            .arg(&url)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, list, _) = models(&["list"]);
    assert!(ok);
    let line = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line(&list, "first").contains("READY") && line(&list, "first").contains("cpu"),
        "{list}"
    );
    assert!(line(&list, "second").contains("UNAVAILABLE"), "{list}");
    assert_eq!(models(&["load", "second"]).1.trim(), "loaded second");
    assert!(line(&models(&["list"]).1, "second").contains("READY"));
    let (ok, stats, _) = models(&["stats", "second"]);
    let fields: Vec<String> = line(&stats, "second")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    // model, state, requests, ..., devices, loads, evictions.
    assert!(
        ok && fields[1] == "READY" && fields[2] == "0" && fields[8] == "cpu" && fields[9] == "1",
        "{stats}"
    );
    let (_, all, _) = models(&["stats"]);
    assert!(all.contains("device") && all.contains("total:"), "{all}");
    assert_eq!(models(&["unload", "second"]).1.trim(), "unloaded second");
    assert!(line(&models(&["list"]).1, "second").contains("UNAVAILABLE"));
    let (ok, _, err) = models(&["load", "nope"]);
    assert!(!ok && err.contains("unknown model 'nope'"), "{err}");
}

#[test]
fn a_grouped_config_file_serves_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let mlp = root()
        .join("model_repository/mlp/1/model.onnx")
        .canonicalize()
        .expect("run scripts/setup.sh first");
    std::os::unix::fs::symlink(&mlp, dir.path().join("sanders.onnx")).unwrap();
    let library = sheaf_onnx::library::locate(None).expect("run scripts/setup.sh first");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "server:\n  port: 0\n  worker_count_per_gpu: 2\n  request_log: true\n\
             gpus:\n  count: 8\n  memory_gb_per_gpu: 24\n  assignment_strategy: least_loaded\n\
             capacity:\n  max_models: 1\n  max_memory_gb: 64\n  eviction_policy: lfu\n  idle_timeout_minutes: 30\n\
             onnx:\n  library_path: {}\n\
             models:\n  sanders:\n    model_path: sanders.onnx\n    preload: true\n    preferred_gpu: 3\n\
             \x20 obama:\n    model_path: {}\n",
            library.display(),
            mlp.display()
        ),
    )
    .unwrap();
    // The file alone: no --model-repository, no --http-port.
    let server = Server::start_args(&["--config", config.to_str().unwrap()]);
    let log = server.log.lock().unwrap().join("\n");
    for warning in [
        "server.request_log",
        "shows no GPU",
        "preferred_gpu is ignored",
    ] {
        assert!(log.contains(warning), "no warning about {warning}:\n{log}");
    }
    // Two models and room for one: on_demand, with the preloaded one ready.
    assert!(log.contains("OnDemand"), "{log}");
    assert_eq!(server.ready, 1);
    let infer = |model: &str| {
        let data = vec!["0.5"; 512].join(",");
        let body = format!(
            r#"{{"inputs":[{{"name":"input","shape":[1,512],"datatype":"FP32","data":[{data}]}}]}}"#
        );
        http_post(&server.http, &format!("/v2/models/{model}/infer"), &body)
    };
    assert_eq!(infer("sanders").0, 200);
    // obama loads on demand, and max_models (1) evicts sanders for it.
    let (status, body) = infer("obama");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value =
        serde_json::from_str(&http_get(&server.http, "/stats").1).unwrap();
    assert_eq!(stats["models"]["sanders"]["state"], "UNAVAILABLE");
    assert_eq!(stats["models"]["sanders"]["eviction_count"], 1);
    assert_eq!(stats["models"]["obama"]["state"], "READY");
    assert_eq!(
        stats["per_gpu_stats"][0]["memory_budget_bytes"],
        24u64 * 1024 * 1024 * 1024
    );
    assert_eq!(stats["config"]["models"]["obama"]["instances"], 2);
}

fn http_request(address: &str, head: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(address).unwrap();
    write!(s, "{head} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

fn http_post(address: &str, path: &str, body: &str) -> (u16, String) {
    http_request(address, &format!("POST {path}"), body)
}

fn http_get(address: &str, path: &str) -> (u16, String) {
    http_request(address, &format!("GET {path}"), "")
}

#[test]
fn a_config_file_can_list_models_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mlp = root()
        .join("model_repository/mlp/1/model.onnx")
        .canonicalize()
        .expect("run scripts/setup.sh first");
    std::os::unix::fs::symlink(&mlp, dir.path().join("m.onnx")).unwrap();
    let config = dir.path().join("sheaf.yaml");
    std::fs::write(
        &config,
        "assignment_strategy: round_robin\nmodels:\n  m: {model_path: m.onnx, preload: true}\n",
    )
    .unwrap();
    let server = Server::start_args(&["--config", config.to_str().unwrap()]);
    assert_eq!(server.ready, 1);
    let (status, body) = http_get(&server.http, "/v2/models/m");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn sigterm_answers_every_request_already_received_then_exits_cleanly() {
    // A batch waits up to 5 s to fill, so the requests are still queued at SIGTERM and while the
    // drain is checked: on two busy cores (the whole suite at once) queueing 32 requests, seeing
    // them in /stats and signalling once outlasted a 1.5 s wait, and the batch ran, the drain
    // ended and the listener closed before readiness was asked.
    let repo = mlp_repository(Some(
        "max_batch_size: 64\nmax_queue_delay_us: 5000000\nbatching: {policy: fixed}\n",
    ));
    let mut server = Server::start(repo.path());
    let body = format!(
        "{{\"inputs\":[{{\"name\":\"input\",\"shape\":[1,512],\"datatype\":\"FP32\",\"data\":[{}]}}]}}",
        vec!["0.25"; 512].join(",")
    );
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let (address, body) = (server.http.clone(), body.clone());
            std::thread::spawn(move || http_post(&address, "/v2/models/mlp/infer", &body))
        })
        .collect();
    // Wait until all 32 are queued, then stop the server.
    let queued = || {
        let (_, stats) = http_get(&server.http, "/stats");
        let stats: serde_json::Value = serde_json::from_str(&stats).unwrap_or_default();
        stats["models"]["mlp"]["current_queue_depth"].as_u64() == Some(32)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !queued() {
        assert!(
            std::time::Instant::now() < deadline,
            "the requests never queued"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.signal_term();
    // While the queued requests wait, readiness is false and new work is refused at once,
    // on a listener that still answers.
    let draining = || {
        let log = server.log.lock().unwrap().join("\n");
        log.contains("draining")
    };
    while !draining() {
        assert!(std::time::Instant::now() < deadline, "no drain began");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (ready, _) = http_get(&server.http, "/v2/health/ready");
    assert_eq!(ready, 503);
    let (late, reply) = http_post(&server.http, "/v2/models/mlp/infer", &body);
    assert_eq!(late, 503, "{reply}");
    assert!(reply.contains("shutting down"), "{reply}");
    let status = server.wait();
    let answers: Vec<(u16, String)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    for (code, body) in &answers {
        assert_eq!(*code, 200, "{body}");
        assert!(body.contains("\"outputs\""), "{body}");
    }
    assert!(status.success(), "exit status {status}");
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("SIGTERM"), "{log}");
}

#[test]
fn the_shutdown_timeout_bounds_the_drain() {
    // A batch would wait 120 s to fill: far past the 1 s the drain may take.
    let repo = mlp_repository(Some(
        "max_batch_size: 64\nmax_queue_delay_us: 120000000\nbatching: {policy: fixed}\n",
    ));
    let mut server = Server::start_with(repo.path(), &["--shutdown-timeout", "1"]);
    let body = format!(
        "{{\"inputs\":[{{\"name\":\"input\",\"shape\":[1,512],\"datatype\":\"FP32\",\"data\":[{}]}}]}}",
        vec!["0.25"; 512].join(",")
    );
    let address = server.http.clone();
    let client = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&address).unwrap();
        write!(s, "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, stats) = http_get(&server.http, "/stats");
        let stats: serde_json::Value = serde_json::from_str(&stats).unwrap_or_default();
        if stats["models"]["mlp"]["current_queue_depth"].as_u64() == Some(1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never queued");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Without the timeout the process would wait 120 s for the batch; the log says the timeout
    // ended the drain, with the one request unanswered.
    let status = server.terminate();
    assert!(status.success(), "exit status {status}");
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("the shutdown timeout ended the drain"),
        "{log}"
    );
    assert!(log.contains("\"unanswered\":1"), "{log}");
    // The request cut off gets no answer: its connection closes.
    let text = client.join().unwrap();
    assert!(!text.contains("\"outputs\""), "{text}");
}

#[test]
fn sigterm_returns_only_after_every_model_is_dropped() {
    // Two models of two instances each, whose instances take 700 ms to drop (as freeing a GPU
    // session can): were the process to exit with their threads still dropping, the threads
    // would die with it and never log that they finished.
    let repo = tempfile::tempdir().unwrap();
    for name in ["slow", "slower"] {
        std::fs::create_dir_all(repo.path().join(name)).unwrap();
        std::fs::write(
            repo.path().join(name).join("model.sim.yaml"),
            "input: {name: x, shape: [-1, 2]}\noutput: {name: y}\nlatency_ms: {a: 1, b: 0}\n\
             drop_ms: 700\n",
        )
        .unwrap();
        std::fs::write(repo.path().join(name).join("config.yaml"), "instances: 2\n").unwrap();
    }
    let mut server = Server::start(repo.path());
    let body = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}"#;
    for name in ["slow", "slower"] {
        let (code, reply) = http_post(&server.http, &format!("/v2/models/{name}/infer"), body);
        assert_eq!(code, 200, "{reply}");
    }
    let status = server.terminate();
    assert!(status.success(), "exit status {status}");
    // The log is read from the process's stderr on a thread of its own: let it catch up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !server
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("\"shut down\""))
    {
        assert!(std::time::Instant::now() < deadline, "no shut down line");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let log = server.log.lock().unwrap().clone();
    let at = |text: &str| log.iter().position(|l| l.contains(text));
    let dropped: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("sim model dropped"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(dropped.len(), 4, "{log:#?}");
    let (all, down) = (at("every model dropped"), at("\"shut down\""));
    assert!(all.is_some() && down.is_some(), "{log:#?}");
    assert!(
        dropped.iter().all(|&d| Some(d) < all) && all < down,
        "{log:#?}"
    );
}

#[test]
fn a_triton_model_folder_serves_with_its_config_pbtxt() {
    let repo = tempfile::tempdir().unwrap();
    let mlp = root().join("model_repository/mlp/1/model.onnx");
    let triton = |name: &str, pbtxt: &str| {
        let folder = repo.path().join(name);
        std::fs::create_dir_all(folder.join("1")).unwrap();
        std::os::unix::fs::symlink(&mlp, folder.join("1/model.onnx")).unwrap();
        std::fs::write(folder.join("config.pbtxt"), pbtxt).unwrap();
    };
    triton(
        "triton_mlp",
        r#"name: "triton_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 300 }
instance_group [ { count: 2 kind: KIND_CPU } ]
optimization { graph { level: 1 } input_pinned_memory { enable: true } }
"#,
    );
    triton(
        "wrong_dims",
        "max_batch_size: 8\ninput [ { name: \"input\" dims: [ 511 ] } ]\n",
    );
    let server = Server::start(repo.path());
    assert_eq!(server.ready, 1);
    let http = |method: &str, path: &str, body: &str| {
        http_request(&server.http, &format!("{method} {path}"), body)
    };
    // The Triton fields are in force.
    let (status, config) = http("GET", "/v2/models/triton_mlp/config", "");
    assert_eq!(status, 200, "{config}");
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["max_batch_size"], 16);
    assert_eq!(
        config["dynamic_batching"]["preferred_batch_size"],
        serde_json::json!([4, 8])
    );
    assert_eq!(
        config["dynamic_batching"]["max_queue_delay_microseconds"],
        300
    );
    assert_eq!(config["instance_group"][0]["count"], 2);
    let data = vec!["0.25"; 512].join(",");
    let (status, body) = http(
        "POST",
        "/v2/models/triton_mlp/infer",
        &format!(
            r#"{{"inputs":[{{"name":"input","shape":[1,512],"datatype":"FP32","data":[{data}]}}]}}"#
        ),
    );
    assert_eq!(status, 200, "{body}");
    // Declared dims that disagree with the model fail its load, with the reason.
    let (_, index) = http("POST", "/v2/repository/index", "{}");
    assert!(
        index.contains("wrong_dims") && index.contains("dims [511]"),
        "{index}"
    );
    // The fields sheaf does not read are named in a warning.
    let log = server.log.lock().unwrap().join("\n");
    let warning = log
        .lines()
        .find(|l| l.contains("config.pbtxt: sheaf does not read"))
        .unwrap_or_else(|| panic!("no warning in {log}"));
    assert!(
        warning.contains("optimization.input_pinned_memory"),
        "{warning}"
    );
}
