//! Command-line arguments and logging set-up.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// sheaf: a model-inference server that batches concurrent requests (KServe v2 protocol).
#[derive(Debug, Parser)]
#[command(name = "sheaf", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models of a model repository over the KServe v2 HTTP protocol.
    Serve(Box<ServeArgs>),
    /// Measure throughput and latency: against a running server, or in-process.
    Bench(Box<crate::bench::BenchArgs>),
    /// List, load, unload and inspect the models of a running server.
    Models(crate::models::ModelsArgs),
    /// Run a model over files offline (tensors, images or prompts), writing its answers beside
    /// them; resumable.
    Run(Box<crate::run::RunArgs>),
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SHEAF_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log filter: a level (error, warn, info, debug, trace) or a tracing directive list.
    #[arg(long, global = true, default_value = "info", env = "SHEAF_LOG_LEVEL")]
    pub log_level: String,
    /// Triton's start-up log settings, over --log-level (as the logging extension changes them
    /// while the server runs): a verbose level above 0 writes the server's debug lines (2 and
    /// above, its trace lines too). `true` is 1 and `false` 0, as tritonserver reads them
    /// (Triton's SageMaker image passes `--log-verbose=true`).
    #[arg(long, global = true, value_name = "LEVEL", value_parser = verbose_level)]
    pub log_verbose: Option<u64>,
    /// Whether info lines are written (Triton's flag).
    #[arg(long, global = true, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub log_info: Option<bool>,
    /// Whether warning lines are written (Triton's flag).
    #[arg(long, global = true, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub log_warning: Option<bool>,
    /// Whether error lines are written (Triton's flag).
    #[arg(long, global = true, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub log_error: Option<bool>,
    /// A file the log lines are appended to, in place of stderr (Triton's flag; the logging
    /// extension's `log_file` changes it while the server runs).
    #[arg(long, global = true, value_name = "PATH", env = "SHEAF_LOG_FILE")]
    pub log_file: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ControlModeArg {
    None,
    Explicit,
    #[value(name = "on_demand")]
    OnDemand,
    Poll,
}

/// Triton's `--rate-limit` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RateLimitArg {
    /// Every `rate_limiter` is ignored: an instance runs a batch as soon as it has one.
    Off,
    /// An instance of a model that declares resources runs a batch only while it holds them.
    #[value(name = "execution_count")]
    ExecutionCount,
}

/// Triton's `--grpc-infer-response-compression-level` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompressionLevel {
    /// Answers sent plain (the default).
    None,
    /// Answers compressed (gzip or deflate, as the client takes them).
    Low,
    /// As `low`.
    Medium,
    /// As `low`.
    High,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Lines of text, each stamped in ISO 8601; tritonserver's `--log-format` words `default`
    /// and `ISO8601` name it too.
    #[value(alias = "default", alias = "ISO8601")]
    Text,
    /// One JSON object a line.
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Folder of models: DIR/<name>/model.onnx or DIR/<name>/<version>/model.onnx, each with an
    /// optional DIR/<name>/config.yaml.
    /// May be left out when the server configuration lists its models, and given more than
    /// once to serve the models of several (a name in two of them fails, as under Triton).
    /// `--model-store` is Triton's other name for it.
    #[arg(long, alias = "model-store", env = "SHEAF_MODEL_REPOSITORY", action = clap::ArgAction::Append)]
    pub model_repository: Vec<PathBuf>,
    /// Server configuration file (YAML): devices, routing, memory budgets, eviction, placement
    /// and listed models; the grouped layout (server, gpus, capacity, onnx, models) is read
    /// too. See the README.
    #[arg(long, env = "SHEAF_CONFIG")]
    pub config: Option<PathBuf>,
    /// When models load: `none` (all at start), `explicit` (`preload: true` ones at start, the
    /// rest through the repository API), `on_demand` (as explicit, and a request for a model that
    /// is not loaded loads it), `poll` (all at start, then the repository's changes: a model
    /// added or changed loads, a model removed unloads, every --repository-poll-secs). Default:
    /// `on_demand` when the models do not all fit the memory limits, else `none`.
    #[arg(long, value_enum, env = "SHEAF_MODEL_CONTROL_MODE")]
    pub model_control_mode: Option<ControlModeArg>,
    /// A model to load at start in the `explicit` and `on_demand` modes, besides the
    /// `preload: true` ones, as Triton's flag; repeat it for more, `*` for every model. A name
    /// the repository lacks stops the start. The environment variable takes a comma-separated
    /// list.
    #[arg(
        long = "load-model",
        value_name = "NAME",
        env = "SHEAF_LOAD_MODEL",
        value_delimiter = ','
    )]
    pub load_model: Vec<String>,
    /// Address to listen on (default 127.0.0.1, or the configuration's `server.host`).
    #[arg(long, env = "SHEAF_HOST")]
    pub host: Option<String>,
    /// Address the HTTP listener binds, in place of --host (Triton's flag).
    #[arg(long, value_name = "ADDRESS")]
    pub http_address: Option<String>,
    /// Address the gRPC listener binds, in place of --host (Triton's flag).
    #[arg(long, value_name = "ADDRESS")]
    pub grpc_address: Option<String>,
    /// Address the metrics listener binds, in place of --host (Triton's flag).
    #[arg(long, value_name = "ADDRESS")]
    pub metrics_address: Option<String>,
    /// HTTP port (default 8000, as Triton's; or the configuration's `server.port`). 0 picks a
    /// free port.
    #[arg(long, env = "SHEAF_HTTP_PORT")]
    pub http_port: Option<u16>,
    /// gRPC port (Triton's default is 8001). 0 picks a free port.
    #[arg(long, default_value_t = 8001, env = "SHEAF_GRPC_PORT")]
    pub grpc_port: u16,
    /// Prometheus metrics port (Triton's default is 8002): `GET /metrics`. 0 picks a free port.
    #[arg(long, default_value_t = 8002, env = "SHEAF_METRICS_PORT")]
    pub metrics_port: u16,
    /// Serve HTTP (KServe, OpenAI, TEI, health): Triton's flag. Without it, gRPC must be on.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_http: bool,
    /// Serve gRPC: Triton's flag. Without it, HTTP must be on.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_grpc: bool,
    /// Serve the metrics port: Triton's flag.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_metrics: bool,
    /// Serve Amazon SageMaker's container routes, `GET /ping` and `POST /invocations`, on
    /// `--sagemaker-port`: Triton's flag.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_sagemaker: bool,
    /// Port of SageMaker's routes (on --host, or --http-address), with --allow-sagemaker.
    #[arg(long, default_value_t = 8080)]
    pub sagemaker_port: u16,
    /// `LOW-HIGH`: the ports the server's other listeners (HTTP, gRPC, metrics, Vertex AI) must
    /// use, as SageMaker gives a container (Triton's flag, which its SageMaker image passes from
    /// SAGEMAKER_SAFE_PORT_RANGE); a listener outside it stops the start.
    #[arg(long, value_name = "LOW-HIGH")]
    pub sagemaker_safe_port_range: Option<String>,
    /// The model `POST /invocations` runs; absent: the server's only model.
    #[arg(long, env = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")]
    pub sagemaker_model: Option<String>,
    /// The route whose body `POST /invocations` takes: `infer` (KServe's), `generate` or
    /// `generate_stream` (the generate extension's, the latter as server-sent events), as
    /// Triton's SageMaker image reads the variable.
    #[arg(long, default_value = "infer", env = "SAGEMAKER_TRITON_INFERENCE_TYPE")]
    pub sagemaker_inference_type: sheaf_server::http::sagemaker::InferenceType,
    /// What `GET /ping` answers: `ready` (200 once the models are up, 503 before and while
    /// draining) or `live` (200 while the server runs).
    #[arg(long, default_value = "ready", env = "SAGEMAKER_TRITON_PING_MODE")]
    pub sagemaker_ping_mode: sheaf_server::http::sagemaker::PingMode,
    /// Serve Google Vertex AI's container routes (health and prediction) on
    /// `--vertex-ai-port`: Triton's flag.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_vertex_ai: bool,
    /// Port of Vertex AI's routes (on --host, or --http-address), with --allow-vertex-ai.
    #[arg(long, default_value_t = 8080, env = "AIP_HTTP_PORT")]
    pub vertex_ai_port: u16,
    /// The model Vertex AI's prediction route runs; absent: the server's only model.
    #[arg(long)]
    pub vertex_ai_default_model: Option<String>,
    /// Vertex AI's prediction route.
    #[arg(long, default_value = "/predict", env = "AIP_PREDICT_ROUTE")]
    pub vertex_ai_predict_route: String,
    /// Vertex AI's health route.
    #[arg(long, default_value = "/health", env = "AIP_HEALTH_ROUTE")]
    pub vertex_ai_health_route: String,
    /// Show the host's CPU and memory on /metrics (`nv_cpu_*`): Triton's flag.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_cpu_metrics: bool,
    /// Show the GPUs' series of the device memory gauges on /metrics
    /// (`sheaf_device_memory_*{device="cuda:N"}`): Triton's flag.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_gpu_metrics: bool,
    /// Triton's latency metrics, `KEY=VALUE`, given once per setting:
    /// `summary_latencies=true` adds the `nv_inference_*_summary_us` summaries (quantiles of
    /// the last minute's latencies), `summary_quantiles=0.5:0.05,0.9:0.01,...` picks their
    /// quantiles, `counter_latencies=false` leaves out the `nv_inference_*_duration_us`
    /// counters.
    #[arg(long, value_name = "KEY=VALUE")]
    pub metrics_config: Vec<String>,
    /// How often Triton polls its per-interval gauges; sheaf reads them when /metrics is
    /// scraped, so the value is only checked.
    #[arg(long, value_name = "MS")]
    pub metrics_interval_ms: Option<u64>,
    /// tritonserver's backend settings: `BACKEND,SETTING=VALUE` or `SETTING=VALUE` (every
    /// backend). Taken: `default-max-batch-size=N` (every backend, `python` or
    /// `onnxruntime`), and the Python backend's stub settings (`shm-default-byte-size`,
    /// `shm-growth-byte-size`, `shm-region-prefix-name`, `stub-timeout-seconds`,
    /// `stub-health-check-interval-seconds`), which have nothing to set in sheaf and are said
    /// so in the log. Others stop the start with the reason. Repeat it per setting.
    #[arg(long, value_name = "[BACKEND,]SETTING=VALUE")]
    pub backend_config: Vec<String>,
    /// Path of libonnxruntime.so. Default: $ORT_DYLIB_PATH, else the configuration's
    /// `onnx.library_path`, else the project's .venv (made by scripts/setup.sh).
    #[arg(long)]
    pub onnxruntime_lib: Option<PathBuf>,
    /// Python interpreter for Python models (`model.py`) whose config names none (`python:`).
    /// Default: the .venv above the sheaf executable or the working directory, else python3.
    #[arg(long, env = "SHEAF_PYTHON")]
    pub python: Option<PathBuf>,
    /// Largest accepted request body or gRPC message, in bytes; larger HTTP bodies are answered
    /// with 413, larger gRPC messages with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 64 * 1024 * 1024, env = "SHEAF_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Most bytes of requests held in memory at once, from their arrival until their answers
    /// are sent (bodies arriving, queued, in a running batch); a request that would pass it is
    /// answered with 503 and Retry-After (gRPC: RESOURCE_EXHAUSTED). At least
    /// --max-body-bytes. Default: half of the memory available at start (in a container, the
    /// room its memory limit leaves).
    #[arg(long, value_name = "BYTES", env = "SHEAF_MAX_REQUEST_MEMORY")]
    pub max_request_memory: Option<usize>,
    /// API key for inference, metadata and the OpenAI routes, sent as `Authorization: Bearer
    /// KEY` (gRPC: `authorization` metadata). Repeat it, or separate keys with commas in
    /// $SHEAF_API_KEY, to take several. Without keys inference is open.
    #[arg(
        long = "api-key",
        env = "SHEAF_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// Admin key for the repository API (load, unload, index) and statistics; it opens
    /// inference too. Without one, the API keys open those routes.
    #[arg(
        long = "admin-key",
        env = "SHEAF_ADMIN_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub admin_keys: Vec<String>,
    /// `GET /metrics` needs the admin key (or, without one, an API key).
    #[arg(long, env = "SHEAF_PROTECT_METRICS")]
    pub protect_metrics: bool,
    /// Lets web pages from ORIGIN (`https://app.example.com`, `http://localhost:3000`; `*`:
    /// any) call the HTTP port from a browser (CORS): their preflights are answered and their
    /// answers readable; they still need the API key where one is set. Repeat it, or separate
    /// origins with commas in $SHEAF_CORS_ALLOW_ORIGIN. Without it, a page of another site can
    /// read nothing, and its POSTs get 403.
    #[arg(
        long = "cors-allow-origin",
        env = "SHEAF_CORS_ALLOW_ORIGIN",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    pub cors_allow_origins: Vec<String>,
    /// Seconds after a SIGTERM during which requests are still served while readiness answers
    /// 503, so that load balancers (a Kubernetes Service's endpoints) stop sending here before
    /// anything is refused; every answer then tells its client to reconnect (`Connection:
    /// close` over HTTP/1.1, a GOAWAY over HTTP/2 and gRPC). 0 skips it, and so do SIGINT
    /// (Ctrl-C) and a second signal.
    #[arg(long, default_value_t = 5.0, env = "SHEAF_DRAIN_DELAY")]
    pub drain_delay: f64,
    /// Triton's rate limiter: with `execution_count`, an execution instance of a model whose
    /// configuration declares resources (`instance_group`'s `rate_limiter`, or `rate_limiter`
    /// in config.yaml) runs a batch only while it holds them, so that models sharing a device
    /// run no more at once than it takes.
    #[arg(
        long,
        value_enum,
        ignore_case = true,
        default_value = "off",
        env = "SHEAF_RATE_LIMIT"
    )]
    pub rate_limit: RateLimitArg,
    /// How many copies of a resource there are, under `--rate-limit execution_count`:
    /// NAME:COUNT (on every device; a global resource's count) or NAME:COUNT:DEVICE (a GPU's
    /// number). Repeat it per resource. Absent: the most any loaded instance needs.
    #[arg(long, value_name = "NAME:COUNT[:DEVICE]")]
    pub rate_limit_resource: Vec<sheaf_core::rate_limit::ResourceCount>,
    /// Most models loading at once at start (Triton's flag); 0, the default: all of them.
    #[arg(long, default_value_t = 0, env = "SHEAF_MODEL_LOAD_THREAD_COUNT")]
    pub model_load_thread_count: usize,
    /// How many times a model's failed load is tried again before it is failed (Triton's
    /// flag).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub model_load_retry_count: usize,
    /// Stop at start when a model that loads at start fails, naming each with its reason
    /// (Triton's flag; Triton's default is true, sheaf's serves the models that did load).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub exit_on_error: bool,
    /// Readiness (`/v2/health/ready`, gRPC `ServerReady`) also needs every model whose last
    /// load was tried to serve: a failed load makes the server not ready (Triton's flag;
    /// Triton's default is true, sheaf's is ready once the repository is loaded).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub strict_readiness: bool,
    /// The server's name in its metadata (`GET /v2`, gRPC ServerMetadata), as Triton's `--id`
    /// sets its own.
    #[arg(long, default_value = sheaf_server::DEFAULT_ID, env = "SHEAF_ID")]
    pub id: String,
    /// HTTP headers forwarded to the model as request parameters: those whose names this
    /// regular expression matches (anywhere in the name, without regard to case unless it
    /// starts with `(?-i)`), as Triton's flag does. Absent: none.
    #[arg(long, value_name = "REGEX", env = "SHEAF_HTTP_HEADER_FORWARD_PATTERN")]
    pub http_header_forward_pattern: Option<String>,
    /// gRPC metadata forwarded to the model as request parameters, as the flag above.
    #[arg(long, value_name = "REGEX", env = "SHEAF_GRPC_HEADER_FORWARD_PATTERN")]
    pub grpc_header_forward_pattern: Option<String>,
    /// A restricted API group over HTTP, Triton's flag: `APIS:KEY=VALUE` makes a request to any
    /// of the comma-separated categories (health, metadata, inference, shared-memory,
    /// model-config, model-repository, statistics, trace, logging) carry the header `KEY` with
    /// that value, or get 403. Give it once per group; a category stands in one group only.
    #[arg(long = "http-restricted-api", value_name = "APIS:KEY=VALUE")]
    pub http_restricted_api: Vec<String>,
    /// A restricted group over gRPC, as the flag above; the metadata key is
    /// `triton-grpc-protocol-KEY`, and a refused call gets PERMISSION_DENIED.
    #[arg(long = "grpc-restricted-protocol", value_name = "APIS:KEY=VALUE")]
    pub grpc_restricted_protocol: Vec<String>,
    /// Triton's model namespacing, which serves models of one name from several repositories
    /// (each ensemble running its own repository's): taken so that Triton's command lines (its
    /// SageMaker image passes `--model-namespacing=true`) start, but sheaf's model names stay
    /// one set, and a name in two repositories fails with both folders named.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub model_namespacing: Option<bool>,
    /// Read each model folder's `configs/NAME.pbtxt`, where it has one, over its own
    /// configuration (Triton's flag: one repository, configured per machine).
    #[arg(long, value_name = "NAME", env = "SHEAF_MODEL_CONFIG_NAME")]
    pub model_config_name: Option<String>,
    /// Complete no model's configuration from the model (Triton's flag): an ONNX or Python
    /// model's configuration must then list every input and output with its data_type and
    /// dims, an absent max_batch_size is 0, and a Python model's auto_complete_config is not
    /// called.
    #[arg(long)]
    pub disable_auto_complete_config: bool,
    /// Triton's older spelling of the flag above: `true` is --disable-auto-complete-config;
    /// `false` completes configurations, as sheaf and Triton do by default.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub strict_model_config: Option<bool>,
    /// Seconds between two looks at the model repository in the `poll` control mode (Triton's
    /// flag and default).
    #[arg(long, default_value_t = 15.0, env = "SHEAF_REPOSITORY_POLL_SECS")]
    pub repository_poll_secs: f64,
    /// CPU cores for the server's own threads (HTTP, gRPC, queues), e.g. `0-11`: with
    /// models' `instance_cpus` on the other cores, no request parsing is scheduled on a core
    /// an instance runs on. Absent: any core.
    #[arg(long, env = "SHEAF_IO_CPUS")]
    pub io_cpus: Option<sheaf_backend::affinity::CpuList>,
    /// Seconds that the drain, once new work is refused (503 / UNAVAILABLE with Retry-After),
    /// waits for the requests already admitted before the process exits anyway (Triton's
    /// --exit-timeout-secs, which names it too). Readiness is false throughout.
    #[arg(
        long,
        alias = "exit-timeout-secs",
        default_value_t = 30.0,
        env = "SHEAF_SHUTDOWN_TIMEOUT"
    )]
    pub shutdown_timeout: f64,
    /// Request traces, in Triton's words, one setting a flag: `level=TIMESTAMPS` (default
    /// OFF), `rate=N` (one request in N; default 1000), `count=N` (traces to take; default -1,
    /// no limit), `triton,file=PATH` (else each trace is a log line) and
    /// `triton,log-frequency=N` (write N traces at a time to PATH.0, PATH.1, ...; default 0,
    /// all to PATH at shutdown). Changed while serving through the trace extension
    /// (`/v2/trace/setting`), all but the file.
    #[arg(long = "trace-config", value_name = "SETTING=VALUE")]
    pub trace_config: Vec<String>,
    /// tritonserver's older trace flags, each the `--trace-config` setting it became:
    /// `--trace-file PATH` (`triton,file=PATH`), `--trace-level LEVEL` (`level=LEVEL`, given
    /// once per level), `--trace-rate N`, `--trace-count N` and `--trace-log-frequency N`
    /// (`triton,log-frequency=N`). They come before `--trace-config`'s settings, which win.
    #[arg(long, value_name = "PATH", hide = true)]
    pub trace_file: Option<String>,
    #[arg(long, value_name = "LEVEL", hide = true)]
    pub trace_level: Vec<String>,
    #[arg(long, value_name = "N", hide = true)]
    pub trace_rate: Option<String>,
    #[arg(long, value_name = "N", hide = true)]
    pub trace_count: Option<String>,
    #[arg(long, value_name = "N", hide = true)]
    pub trace_log_frequency: Option<String>,
    /// MiB of OpenAI Responses API answers kept in memory for `previous_response_id` and
    /// `GET`/`DELETE /v1/responses/{id}` (each with its conversation), least recently used let
    /// go first, and as many again of `/v1/conversations`. 0: none kept
    /// (`previous_response_id` and conversations are refused).
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 64,
        env = "SHEAF_RESPONSES_STORE_MIB"
    )]
    pub responses_store_mib: usize,
    /// MiB of `/v1/files` kept on disk: batch files uploaded for `/v1/batches`, and the
    /// batches' answers. An upload or a batch's answers past it are refused. 0: none kept (the
    /// Files and Batch APIs are refused).
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = sheaf_server::openai::batch::files::DEFAULT_MIB,
        env = "SHEAF_FILES_STORE_MIB"
    )]
    pub files_store_mib: usize,
    /// Folder of `/v1/files` and `/v1/batches` (default: a temporary folder made at the first
    /// upload and removed at exit). A server started on the same folder reads back the files
    /// and batches kept there, and goes on with the batches the last one had not ended. The
    /// `file-N` and `batch_N` names in it are the server's.
    #[arg(long, value_name = "DIR", env = "SHEAF_FILES_DIR")]
    pub files_dir: Option<PathBuf>,
    /// Bytes of the response cache, shared by the models whose config enables it
    /// (`response_cache: true`): a repeated request is answered from memory, least recently
    /// used answers evicted first. 0 (the default): no cache.
    #[arg(long, default_value_t = 0, env = "SHEAF_CACHE_SIZE")]
    pub cache_size: u64,
    /// Triton's form of --cache-size: `local,size=BYTES` (the local cache is the one there is).
    #[arg(long = "cache-config", value_name = "local,size=BYTES")]
    pub cache_config: Vec<String>,
    /// Most connections open at once on each port; more wait in the kernel's backlog. From 1 to
    /// 1,048,576.
    #[arg(long, default_value_t = 4096, env = "SHEAF_MAX_CONNECTIONS", value_parser = count_at_once)]
    pub max_connections: usize,
    /// Seconds an HTTP client has to send a request's headers; a keep-alive connection idle
    /// this long is closed too.
    #[arg(long, default_value_t = 10.0, env = "SHEAF_CLIENT_HEADER_TIMEOUT")]
    pub client_header_timeout: f64,
    /// Seconds an HTTP client has to send a request's body (408 after).
    #[arg(long, default_value_t = 60.0, env = "SHEAF_CLIENT_BODY_TIMEOUT")]
    pub client_body_timeout: f64,
    /// Serve every port over TLS with this certificate chain (PEM, leaf first).
    #[arg(long, env = "SHEAF_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "SHEAF_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, env = "SHEAF_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Let other servers listen on the HTTP port too (SO_REUSEPORT; Triton's flag): the kernel
    /// spreads new connections over every server with it set, which must serve the same
    /// models.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub reuse_http_port: bool,
    /// The same for the gRPC port (Triton's flag).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub reuse_grpc_port: bool,
    /// Milliseconds between the server's keepalive pings on each gRPC connection (Triton's
    /// flag); a connection whose ping is not answered within --grpc-keepalive-timeout is
    /// closed. Absent: no pings.
    #[arg(long, value_name = "MS")]
    pub grpc_keepalive_time: Option<u64>,
    /// Milliseconds a gRPC connection may stay open before the server sends it a GOAWAY, so
    /// that its client reconnects (and a load balancer spreads it afresh): Triton's flag.
    #[arg(long, value_name = "MS")]
    pub grpc_max_connection_age: Option<u64>,
    /// Milliseconds an aged connection then has for its calls before it is closed (Triton's
    /// flag); absent: until they end.
    #[arg(long, value_name = "MS")]
    pub grpc_max_connection_age_grace: Option<u64>,
    /// Whether the gRPC inference service's answers are compressed (Triton's flag): any level
    /// but `none` sends them gzip or deflate, whichever the call's `grpc-accept-encoding` takes
    /// (plain when it takes neither), at zlib's level 6 for every level (the gRPC library
    /// fixes it). Tensors of floats shrink little for the time compression takes; it pays for
    /// text and sparse outputs over slow links.
    #[arg(long, value_enum, value_name = "LEVEL", default_value_t = CompressionLevel::None)]
    pub grpc_infer_response_compression_level: CompressionLevel,
    /// Milliseconds a keepalive ping has to be answered (Triton's flag and default).
    #[arg(long, value_name = "MS")]
    pub grpc_keepalive_timeout: Option<u64>,
    /// TLS on the gRPC port alone, from the files the --grpc-server-* flags name (Triton's
    /// flag); the other ports keep --tls-* (or none).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub grpc_use_ssl: Option<bool>,
    /// As --grpc-use-ssl, and gRPC clients must present a certificate that --grpc-root-cert
    /// signed (Triton's flag).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub grpc_use_ssl_mutual: Option<bool>,
    /// The gRPC port's certificate chain (PEM), with --grpc-use-ssl (Triton's flag).
    #[arg(long, value_name = "PATH")]
    pub grpc_server_cert: Option<PathBuf>,
    /// The gRPC port's private key (PEM), with --grpc-use-ssl (Triton's flag).
    #[arg(long, value_name = "PATH")]
    pub grpc_server_key: Option<PathBuf>,
    /// The CA whose certificates gRPC clients present, with --grpc-use-ssl-mutual (Triton's
    /// flag).
    #[arg(long, value_name = "PATH")]
    pub grpc_root_cert: Option<PathBuf>,
    #[command(flatten)]
    pub queue: QueueArgs,
}

/// One of many instances behind a NATS JetStream queue.
#[derive(Debug, Args)]
pub struct QueueArgs {
    /// NATS server whose JetStream queue this instance joins (e.g. nats://127.0.0.1:4222): it
    /// pulls the requests of the models it serves, and forwards requests for other models there.
    /// With no models, the instance is a gateway only.
    #[arg(long = "queue", env = "SHEAF_QUEUE")]
    pub url: Option<String>,
    /// The JetStream stream of requests (created when missing).
    #[arg(
        long = "queue-stream",
        default_value = "SHEAF",
        env = "SHEAF_QUEUE_STREAM"
    )]
    pub stream: String,
    /// Requests for model M go on subject PREFIX.M.
    #[arg(
        long = "queue-prefix",
        default_value = "sheaf.infer",
        env = "SHEAF_QUEUE_PREFIX"
    )]
    pub prefix: String,
    /// Seconds a pulled request may go unacknowledged before another worker gets it (a worker
    /// that dies holding requests gives them up after this long).
    #[arg(
        long = "queue-ack-wait",
        default_value_t = 30.0,
        env = "SHEAF_QUEUE_ACK_WAIT"
    )]
    pub ack_wait: f64,
    /// Seconds a forwarded request waits for its answer (504 after); it is not started later.
    #[arg(
        long = "queue-timeout",
        default_value_t = 60.0,
        env = "SHEAF_QUEUE_TIMEOUT"
    )]
    pub timeout: f64,
    /// Most requests a worker holds per model (default: two full batches per device, and never
    /// more than the model's free queue room).
    #[arg(long = "queue-window", env = "SHEAF_QUEUE_WINDOW")]
    pub window: Option<usize>,
}

/// Installs the tracing subscriber: `--log-level` as its base filter, and the log settings of
/// Triton's logging extension ([`sheaf_server::logging`]) over it, which turn each level on or
/// off, widen the base filter for the server's debug lines, and send the lines to stderr or to
/// a file (`--log-file`, without colours) while it runs.
pub fn init_logging(args: &LogArgs) -> anyhow::Result<()> {
    use tracing_subscriber::filter::{filter_fn, LevelFilter};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{reload, EnvFilter, Layer};
    let base = args.log_level.clone();
    let filter = EnvFilter::try_new(&base)
        .map_err(|e| anyhow::anyhow!("invalid --log-level '{base}': {e}"))?;
    let at_start = filter.max_level_hint().and_then(LevelFilter::into_level);
    let (filter, handle) = reload::Layer::new(filter);
    use sheaf_server::logging::{allows, file_line, to_file};
    let to_stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let to_log_file = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(file_line);
    let (to_stderr, to_log_file, format) = match args.log_format {
        LogFormat::Text => (to_stderr.boxed(), to_log_file.boxed(), "default"),
        LogFormat::Json => (to_stderr.json().boxed(), to_log_file.json().boxed(), "json"),
    };
    let to_stderr = to_stderr.with_filter(filter_fn(|meta| allows(meta.level()) && !to_file()));
    let to_log_file = to_log_file.with_filter(filter_fn(|meta| allows(meta.level()) && to_file()));
    tracing_subscriber::registry()
        .with(filter)
        .with(to_stderr)
        .with(to_log_file)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))?;
    sheaf_server::logging::install(format, at_start, move |widest| {
        // The server's crates are all named `sheaf…`: their lines, not their libraries'.
        let directive = format!("{base},sheaf={}", widest.as_str().to_ascii_lowercase());
        let filter = EnvFilter::try_new(&directive).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    });
    use sheaf_server::logging::Setting;
    let triton = [
        ("log_verbose_level", args.log_verbose.map(Setting::Number)),
        ("log_info", args.log_info.map(Setting::Bool)),
        ("log_warnings", args.log_warning.map(Setting::Bool)),
        ("log_errors", args.log_error.map(Setting::Bool)),
        (
            "log_file",
            args.log_file.as_deref().map(|f| Setting::Text(f.into())),
        ),
    ];
    sheaf_server::logging::update(
        triton
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?))),
    )
    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    Ok(())
}

/// Whether an error the command logs now reaches stderr as a line of text a reader sees as it
/// is, so that the command's closing error need not be written again beside it.
pub fn errors_reach_stderr_as_text(args: &LogArgs) -> bool {
    use sheaf_server::logging::{allows, to_file};
    matches!(args.log_format, LogFormat::Text)
        && !to_file()
        && allows(&tracing::Level::ERROR)
        && tracing::enabled!(target: "sheaf", tracing::Level::ERROR)
}

/// The most of anything one process opens or holds at once by a flag's count: connections,
/// clients, chunks in flight. A million already needs a million sockets or buffers.
pub(crate) const MOST_AT_ONCE: usize = 1 << 20;

/// A count of things at once, from 1 (none would do nothing) to [`MOST_AT_ONCE`] (past
/// which a semaphore's count, or the memory, runs out).
pub(crate) fn count_at_once(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MOST_AT_ONCE).contains(&n) => Ok(n),
        _ => Err(format!("'{text}' is not a count from 1 to {MOST_AT_ONCE}")),
    }
}

/// The longest time a flag may give, in seconds: about 31 years. A clock reading plus it is
/// still a time, which 10^19 s is not (such a header timeout panicked every connection).
pub(crate) const MAX_SECONDS: f64 = 1e9;

/// `value` seconds of `flag` as a duration: a number from 0 to [`MAX_SECONDS`].
pub(crate) fn seconds(flag: &str, value: f64) -> anyhow::Result<std::time::Duration> {
    anyhow::ensure!(
        (0.0..=MAX_SECONDS).contains(&value),
        "{flag} must be a number of seconds from 0 to {MAX_SECONDS}"
    );
    Ok(std::time::Duration::from_secs_f64(value))
}

/// `value` seconds of `flag` as a duration above 0, at most [`MAX_SECONDS`].
pub(crate) fn some_seconds(flag: &str, value: f64) -> anyhow::Result<std::time::Duration> {
    match seconds(flag, value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => anyhow::bail!("{flag} must be a number of seconds above 0, at most {MAX_SECONDS}"),
    }
}

/// A `--log-verbose` level: a number, or `true` (1) / `false` (0), as tritonserver reads it.
fn verbose_level(given: &str) -> Result<u64, String> {
    match given.trim() {
        "true" => Ok(1),
        "false" => Ok(0),
        n => n
            .parse()
            .map_err(|_| format!("'{n}': give a level (0, 1, 2...), true (1) or false (0)")),
    }
}

impl ServeArgs {
    /// The trace settings: tritonserver's older trace flags as the `--trace-config` settings
    /// they became, then `--trace-config`'s own.
    pub fn trace_settings(&self) -> Vec<String> {
        let mut settings: Vec<String> = Vec::new();
        if let Some(path) = &self.trace_file {
            settings.push(format!("triton,file={path}"));
        }
        settings.extend(self.trace_level.iter().map(|l| format!("level={l}")));
        if let Some(n) = &self.trace_rate {
            settings.push(format!("rate={n}"));
        }
        if let Some(n) = &self.trace_count {
            settings.push(format!("count={n}"));
        }
        if let Some(n) = &self.trace_log_frequency {
            settings.push(format!("triton,log-frequency={n}"));
        }
        settings.extend(self.trace_config.iter().cloned());
        settings
    }
}
