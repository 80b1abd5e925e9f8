//! Shared helpers of the HTTP integration tests: a real sheaf server on 127.0.0.1:0 over a
//! temporary model repository built from the real models that scripts/setup.sh fetches.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use sheaf_backend::{DataType, Model, Tensor};
use sheaf_core::{ModelManager, ServerConfig};
use sheaf_onnx::{OnnxBackend, OnnxModel, OnnxOptions};
use sheaf_server::{AppState, HttpConfig};

/// The checkout's root folder.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A model file made by scripts/setup.sh; panics with the fix if it is missing.
pub fn model_file(relative: &str) -> PathBuf {
    let path = root().join(relative);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh first (the README's test command does)",
        path.display()
    );
    path
}

pub const MLP: &str = "model_repository/mlp/1/model.onnx";
pub const ORIENTATION: &str = "model_repository/orientation/1/model.onnx";
pub const NSFW: &str = "model_repository/nsfw/1/model.onnx";
pub const FIXED: &str = ".cache/test-models/fixed.onnx";
pub const ALLTYPES: &str = ".cache/test-models/allint.onnx";
pub const VARLEN: &str = ".cache/test-models/varlen.onnx";
pub const EFFICIENTNET: &str = "model_repository/efficientnet/1/model.onnx";
pub const FACES: &str = "model_repository/faces/1/model.onnx";

/// Loads ONNX Runtime once for the test process.
pub fn init_runtime() {
    let lib = sheaf_onnx::library::locate(None).expect("ONNX Runtime: run scripts/setup.sh");
    sheaf_onnx::init(&lib).expect("ONNX Runtime loads");
}

/// A running server and the repository it serves.
pub struct TestServer {
    pub url: String,
    /// `http://127.0.0.1:PORT` of the gRPC server.
    pub grpc_url: String,
    /// `http://127.0.0.1:PORT` of the metrics server.
    pub metrics_url: String,
    pub client: reqwest::Client,
    pub manager: Arc<ModelManager>,
    /// What the HTTP, gRPC and metrics servers share (its drain, its keys).
    pub state: AppState,
    pub repo: tempfile::TempDir,
}

/// Builds a repository of `(name, model file, config.yaml)` and serves it.
pub async fn start(models: &[(&str, &str, &str)], http: HttpConfig) -> TestServer {
    serve_repo_on(onnx_repo(models), http, ServerConfig::default()).await
}

/// As [`start`], loading nothing until asked (`--model-control-mode explicit`).
pub async fn start_explicit(models: &[(&str, &str, &str)]) -> TestServer {
    serve(
        onnx_repo(models),
        HttpConfig::default(),
        ServerConfig::default(),
        sheaf_core::ControlMode::Explicit,
        Default::default(),
    )
    .await
}

/// As [`start`], with extra files written into the repository first (`(path in the
/// repository, contents)`), such as a pipeline's `pipeline.yaml`.
pub async fn start_with_files(models: &[(&str, &str, &str)], files: &[(&str, &str)]) -> TestServer {
    let repo = onnx_repo(models);
    for (path, contents) in files {
        let path = repo.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    serve_repo_on(repo, HttpConfig::default(), ServerConfig::default()).await
}

/// As [`start`], taking the keys of `access`.
pub async fn start_protected(
    models: &[(&str, &str, &str)],
    access: sheaf_server::AccessConfig,
) -> TestServer {
    serve(
        onnx_repo(models),
        HttpConfig::default(),
        ServerConfig::default(),
        sheaf_core::ControlMode::None,
        access,
    )
    .await
}

/// A temporary repository linking the real model files of `(name, model file, config.yaml)`.
fn onnx_repo(models: &[(&str, &str, &str)]) -> tempfile::TempDir {
    init_runtime();
    let repo = tempfile::tempdir().unwrap();
    for (name, file, config) in models {
        let dir = repo.path().join(name).join("1");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(
            model_file(file).canonicalize().unwrap(),
            dir.join("model.onnx"),
        )
        .unwrap();
        write_config(repo.path(), name, config);
    }
    repo
}

/// Serves sim models: `(name, model.sim.yaml, config.yaml)`.
pub async fn start_sim(models: &[(&str, &str, &str)]) -> TestServer {
    start_sim_on(models, ServerConfig::default()).await
}

/// Serves sim models with a model control mode.
pub async fn start_sim_mode(
    models: &[(&str, &str, &str)],
    control: sheaf_core::ControlMode,
) -> TestServer {
    start_sim_with(models, ServerConfig::default(), control).await
}

/// Serves sim models with a server configuration and a model control mode.
pub async fn start_sim_with(
    models: &[(&str, &str, &str)],
    config: ServerConfig,
    control: sheaf_core::ControlMode,
) -> TestServer {
    let repo = tempfile::tempdir().unwrap();
    for (name, spec, config) in models {
        std::fs::create_dir_all(repo.path().join(name)).unwrap();
        std::fs::write(repo.path().join(name).join("model.sim.yaml"), spec).unwrap();
        write_config(repo.path(), name, config);
    }
    serve(
        repo,
        HttpConfig::default(),
        config,
        control,
        Default::default(),
    )
    .await
}

/// Serves sim models on the devices of `server`.
pub async fn start_sim_on(models: &[(&str, &str, &str)], server: ServerConfig) -> TestServer {
    start_sim_with(models, server, sheaf_core::ControlMode::None).await
}

/// Serves real ONNX models on the devices of `server`.
pub async fn start_on(models: &[(&str, &str, &str)], server: ServerConfig) -> TestServer {
    serve_repo_on(onnx_repo(models), HttpConfig::default(), server).await
}

fn write_config(repo: &Path, name: &str, config: &str) {
    if !config.is_empty() {
        std::fs::write(repo.join(name).join("config.yaml"), config).unwrap();
    }
}

async fn serve_repo_on(
    repo: tempfile::TempDir,
    http: HttpConfig,
    server: ServerConfig,
) -> TestServer {
    serve(
        repo,
        http,
        server,
        sheaf_core::ControlMode::None,
        Default::default(),
    )
    .await
}

async fn serve(
    repo: tempfile::TempDir,
    http: HttpConfig,
    server: ServerConfig,
    control: sheaf_core::ControlMode,
    access: sheaf_server::AccessConfig,
) -> TestServer {
    serve_backends(repo, real_backends(), http, server, control, |s| {
        s.with_access(access)
    })
    .await
}

fn real_backends() -> Vec<Arc<dyn sheaf_backend::Backend>> {
    vec![
        Arc::new(OnnxBackend::default()),
        Arc::new(sheaf_sim::SimBackend),
    ]
}

/// As [`start`], holding at most `bytes` of requests in memory at once
/// (`--max-request-memory`).
pub async fn start_with_request_memory(models: &[(&str, &str, &str)], bytes: usize) -> TestServer {
    serve_backends(
        onnx_repo(models),
        real_backends(),
        HttpConfig::default(),
        ServerConfig::default(),
        sheaf_core::ControlMode::None,
        |s| s.with_request_memory(bytes),
    )
    .await
}

/// Serves `repo` with `backends` (the binary's tests add the generation backend), with no
/// keys and the default HTTP limits.
pub async fn start_with_backends(
    repo: tempfile::TempDir,
    backends: Vec<Arc<dyn sheaf_backend::Backend>>,
    server: ServerConfig,
    control: sheaf_core::ControlMode,
) -> TestServer {
    serve_backends(
        repo,
        backends,
        HttpConfig::default(),
        server,
        control,
        |s| s,
    )
    .await
}

async fn serve_backends(
    repo: tempfile::TempDir,
    backends: Vec<Arc<dyn sheaf_backend::Backend>>,
    http: HttpConfig,
    server: ServerConfig,
    control: sheaf_core::ControlMode,
    state: impl FnOnce(AppState) -> AppState,
) -> TestServer {
    let manager = Arc::new(
        ModelManager::with_config(backends, &server)
            .unwrap()
            .with_control(control),
    );
    manager.load_repository(repo.path()).await.unwrap();
    manager.spawn_idle_unloader();
    manager.spawn_memory_watch();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = state(AppState::new(manager.clone()));
    let router = sheaf_server::router(state.clone(), &http);
    tokio::spawn(sheaf_server::serve_with(
        listener,
        router,
        sheaf_server::ConnectionLimits::default(),
        None,
        state.drain.clone(),
        std::future::pending(),
    ));
    let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_url = format!("http://{}", metrics_listener.local_addr().unwrap());
    let metrics = sheaf_server::metrics_router(state.clone());
    tokio::spawn(sheaf_server::serve(
        metrics_listener,
        metrics,
        std::future::pending(),
    ));
    let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_url = format!("http://{}", grpc_listener.local_addr().unwrap());
    tokio::spawn(sheaf_server::grpc::serve(
        grpc_listener,
        state.clone(),
        64 << 20,
        std::future::pending(),
    ));
    TestServer {
        url,
        grpc_url,
        metrics_url,
        client: reqwest::Client::new(),
        manager,
        state,
        repo,
    }
}

/// Deterministic pseudo-random floats in [-1, 1).
pub fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The binary form of BYTES elements: each its 4-byte little-endian length, then its bytes.
pub fn bytes_wire(items: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    out
}

pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl TestServer {
    pub fn infer_url(&self, model: &str) -> String {
        format!("{}/v2/models/{model}/infer", self.url)
    }

    /// POSTs a binary-extension body to `model`: the JSON `header`, then `data`.
    pub async fn post_binary(&self, model: &str, header: &Value, data: &[u8]) -> reqwest::Response {
        let header = header.to_string();
        let mut body = header.clone().into_bytes();
        body.extend_from_slice(data);
        self.client
            .post(self.infer_url(model))
            .header("Inference-Header-Content-Length", header.len())
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// POSTs `items` as the BYTES input `input` of `model` in binary, asking for `outputs`
    /// (the JSON list of requested outputs, or null for all); status and the JSON answer.
    pub async fn post_bytes(
        &self,
        model: &str,
        input: &str,
        items: &[Bytes],
        outputs: Value,
    ) -> (u16, Value) {
        let data = bytes_wire(items);
        let mut header = json!({"inputs": [{"name": input, "shape": [items.len()],
            "datatype": "BYTES", "parameters": {"binary_data_size": data.len()}}]});
        if !outputs.is_null() {
            header["outputs"] = outputs;
        }
        let r = self.post_binary(model, &header, &data).await;
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// POSTs a JSON body; returns status and parsed body.
    pub async fn post_json(&self, model: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.infer_url(model))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// One FP32 input sent as binary, all outputs asked back as binary; returns each output's
    /// shape and values, in the order the response lists them.
    pub async fn infer_binary(
        &self,
        model: &str,
        input: &str,
        shape: &[usize],
        data: &[f32],
    ) -> Vec<(Vec<usize>, Vec<f32>)> {
        let header = json!({
            "inputs": [{"name": input, "shape": shape, "datatype": "FP32",
                        "parameters": {"binary_data_size": data.len() * 4}}],
            "parameters": {"binary_data_output": true}
        })
        .to_string();
        let mut body = header.as_bytes().to_vec();
        body.extend(to_bytes(data));
        let r = self
            .client
            .post(self.infer_url(model))
            .header("Inference-Header-Content-Length", header.len())
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "binary infer failed");
        let n: usize = r.headers()["inference-header-content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let bytes = r.bytes().await.unwrap();
        let head: Value = serde_json::from_slice(&bytes[..n]).unwrap();
        let mut offset = n;
        head["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let size = o["parameters"]["binary_data_size"].as_u64().unwrap() as usize;
                let values = from_bytes(&bytes[offset..offset + size]);
                offset += size;
                let shape = o["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                (shape, values)
            })
            .collect()
    }

    pub async fn stats(&self, model: &str) -> Value {
        let (status, body) = self.get(&format!("/v2/models/{model}/stats")).await;
        assert_eq!(status, 200);
        body["model_stats"][0].clone()
    }
}

/// Runs `model` in-process on ONNX Runtime, one FP32 input, and returns the first output.
pub fn in_process(model: &str, shape: &[usize], data: &[f32]) -> Vec<f32> {
    init_runtime();
    let mut m = OnnxModel::load(&model_file(model), &OnnxOptions::default()).unwrap();
    let t = Tensor::new(DataType::F32, shape.to_vec(), Bytes::from(to_bytes(data))).unwrap();
    from_bytes(m.infer(&[t]).unwrap()[0].data())
}

/// Asserts that every element is within `rel` relative error (with a small absolute floor).
pub fn assert_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1e-3);
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Batch sizes the server executed for a model, from its Triton-shaped statistics.
pub fn batch_sizes(stats: &Value) -> Vec<u64> {
    stats["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| {
            let size = b["batch_size"].as_u64().unwrap();
            let count = b["compute_infer"]["count"].as_u64().unwrap();
            std::iter::repeat_n(size, count as usize)
        })
        .collect()
}

/// Runs `promtool check metrics` on `text`; panics with promtool's complaint if it fails.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (scripts/setup.sh --test installs Debian's prometheus package)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit 3 is lint alone. Triton's metric names (`nv_*`: counters without `_total`, units
    // such as `_us`) are kept as Triton writes them, so lint about them alone is accepted;
    // any other complaint, and a parse error (exit 1) above all, fails.
    let complaints: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    let only_triton =
        out.status.code() == Some(3) && complaints.iter().all(|l| l.starts_with("nv_"));
    assert!(
        out.status.success() || only_triton,
        "promtool check metrics failed:\n{said}"
    );
}

/// The dashboard as headless Chromium renders it, after its scripts have run.
pub fn render(url: &str, profile: &std::path::Path) -> String {
    let out = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=4000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .output()
        .expect("chromium runs (scripts/setup.sh --test installs it)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The text of the element with `id` in a dumped DOM.
pub fn text_of(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in:\n{dom}"));
    let open = start + dom[start..].find('>').unwrap() + 1;
    dom[open..open + dom[open..].find('<').unwrap()].to_string()
}
