//! Starts the real `sheaf` binary on free ports and reads its addresses from the JSON log.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub fn sheaf() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sheaf"))
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A model repository holding the demo MLP as `mlp` (linked, not copied), with `config` as its
/// `config.yaml` when given.
pub fn mlp_repository(config: Option<&str>) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    let model = repo.path().join("mlp/1");
    std::fs::create_dir_all(&model).unwrap();
    std::os::unix::fs::symlink(
        root()
            .join("model_repository/mlp/1/model.onnx")
            .canonicalize()
            .expect("run scripts/setup.sh first"),
        model.join("model.onnx"),
    )
    .unwrap();
    if let Some(config) = config {
        std::fs::write(repo.path().join("mlp/config.yaml"), config).unwrap();
    }
    repo
}

/// A model repository holding the demo MLP with the demo's config: the demo's batching, without
/// loading the whole demo repository.
pub fn demo_mlp() -> tempfile::TempDir {
    let config = std::fs::read_to_string(root().join("model_repository/mlp/config.yaml"))
        .expect("run scripts/setup.sh first");
    mlp_repository(Some(&config))
}

/// A running `sheaf serve`, killed on drop.
pub struct Server {
    child: Child,
    /// `host:port` of HTTP, gRPC and metrics.
    pub http: String,
    pub grpc: String,
    pub metrics: String,
    /// The `ready` field of the "server ready" log line: models loaded.
    pub ready: u64,
    /// Every log line so far (JSON), read by a background thread.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal_term();
        self.wait()
    }

    /// Sends SIGTERM.
    pub fn signal_term(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// Serves `repository` until dropped; waits until the repository is loaded.
    pub fn start(repository: &Path) -> Server {
        Server::start_with(repository, &[])
    }

    /// The same, with extra `sheaf serve` arguments.
    pub fn start_with(repository: &Path, extra: &[&str]) -> Server {
        let repository = repository.to_string_lossy();
        let mut args = extra.to_vec();
        args.extend(["--model-repository", &repository]);
        Server::start_args(&args)
    }

    /// `sheaf serve` on free ports with JSON logs, and exactly `extra` besides.
    pub fn start_args(extra: &[&str]) -> Server {
        let mut child = sheaf()
            .args([
                "serve",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
                "--log-format",
                "json",
            ])
            .args(extra)
            // No load balancer routes to these servers: a SIGTERM needs no drain delay
            // (`--drain-delay` in `extra` overrides this).
            .env("SHEAF_DRAIN_DELAY", "0")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let (mut http, mut grpc, mut metrics, mut ready) = (None, None, None, 0);
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for line in lines.by_ref() {
            let line = line.unwrap();
            log.lock().unwrap().push(line.clone());
            let entry: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|_| panic!("log line is not JSON: {line}"));
            let f = &entry["fields"];
            let text = |k: &str| f[k].as_str().map(str::to_string);
            http = http.or(text("address"));
            grpc = grpc.or(text("grpc_address"));
            metrics = metrics.or(text("metrics_address"));
            if f["message"]
                .as_str()
                .is_some_and(|m| m.contains("server ready"))
            {
                ready = f["ready"].as_u64().unwrap_or(0);
                break;
            }
        }
        // Keep reading so the server never blocks on a full pipe.
        let keep = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                keep.lock().unwrap().push(line);
            }
        });
        Server {
            child,
            http: http.expect("the server logged its HTTP address"),
            grpc: grpc.expect("the server logged its gRPC address"),
            metrics: metrics.expect("the server logged its metrics address"),
            ready,
            log,
        }
    }
}
