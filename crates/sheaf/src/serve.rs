//! `sheaf serve`: load ONNX Runtime and the model repository, then serve HTTP and gRPC until
//! SIGTERM or SIGINT, and drain: readiness turns false while requests are still served for
//! `--drain-delay` (SIGTERM only), then new work is refused, and the requests already admitted
//! are answered (within `--shutdown-timeout`) before the listeners close and the process exits.
//! With `--queue`, the instance also pulls its models' requests from a NATS JetStream queue,
//! and forwards to the queue those of models it does not serve (with no models, it is only a
//! gateway).

use std::sync::Arc;

use anyhow::Context;
use sheaf_core::{grouped_config, ControlMode, ModelManager, ServerConfig};
use sheaf_llama::GgufBackend;
use sheaf_onnx::OnnxBackend;
use sheaf_server::broker::{Broker, BrokerConfig};
use sheaf_server::restricted::Restrictions;
use sheaf_server::{AccessConfig, AppState, ConnectionLimits, HttpConfig, TlsFiles};
use sheaf_sim::SimBackend;

use crate::cli::{CompressionLevel, ControlModeArg, QueueArgs, RateLimitArg, ServeArgs};

/// The server configuration file, in either layout, with the serve options it sets.
pub(crate) struct Loaded {
    pub(crate) config: ServerConfig,
    http_port: Option<u16>,
    host: Option<String>,
    pub(crate) onnx_library: Option<std::path::PathBuf>,
}

pub(crate) fn read_config(path: Option<&std::path::Path>) -> anyhow::Result<Loaded> {
    let Some(path) = path else {
        return Ok(Loaded {
            config: ServerConfig::default(),
            http_port: None,
            host: None,
            onnx_library: None,
        });
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let fail = |e: String| anyhow::anyhow!("{}: {e}", path.display());
    let base = path.parent().unwrap_or(std::path::Path::new("."));
    if !grouped_config::is_grouped(&text) {
        let mut config = ServerConfig::from_yaml(&text).map_err(fail)?;
        // Listed model files are found from the configuration file's folder.
        for m in config.models.values_mut() {
            m.model_path = base.join(&m.model_path);
        }
        return Ok(Loaded {
            config,
            http_port: None,
            host: None,
            onnx_library: None,
        });
    }
    let t = grouped_config::translate(&text, grouped_config::visible_gpus(), base).map_err(fail)?;
    for warning in &t.warnings {
        tracing::warn!(config = %path.display(), "{warning}");
    }
    tracing::info!(
        config = %path.display(),
        devices = ?t.config.devices,
        memory_budget_mb = t.config.memory_budget_mb,
        max_models = t.config.max_models,
        max_memory_mb = t.config.max_memory_mb,
        eviction_policy = ?t.config.eviction_policy,
        idle_timeout_s = t.config.idle_timeout_s,
        assignment_strategy = ?t.config.assignment_strategy,
        models = t.config.models.len(),
        "grouped configuration translated"
    );
    Ok(Loaded {
        config: t.config,
        http_port: t.http_port,
        host: t.host,
        onnx_library: t.onnx_library,
    })
}

/// The cache's size in bytes from Triton's `--cache-config local,size=BYTES`.
fn cache_config(setting: &str) -> anyhow::Result<u64> {
    let (cache, rest) = setting.split_once(',').unwrap_or((setting, ""));
    if cache != "local" {
        anyhow::bail!(
            "--cache-config {setting}: sheaf has the local cache only (`local,size=BYTES`)"
        );
    }
    match rest.split_once('=') {
        Some(("size", n)) => n
            .trim()
            .parse::<u64>()
            .with_context(|| format!("--cache-config {setting}: the size is a number of bytes")),
        _ => anyhow::bail!(
            "--cache-config {setting}: the local cache takes `size=BYTES` and nothing else"
        ),
    }
}

/// Raises the process's soft limit on open files to its hard limit. Each client connection,
/// each Python instance's pipes and shared memory, and each model whose batching delay is
/// configured (its timerfd) holds a descriptor, and the common soft default of 1,024 is below
/// what a repository of a thousand models or thousands of connections needs; the hard limit is
/// what the administrator allows. The Python processes inherit it.
fn raise_open_files_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the limit on open files"),
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    raise_open_files_limit();
    let request_memory = request_memory(args.max_request_memory, args.max_body_bytes)?;
    let loaded = read_config(args.config.as_deref())?;
    let mut config = loaded.config;
    if args.cache_size > 0 {
        config.response_cache_bytes = args.cache_size;
    }
    for setting in &args.cache_config {
        let bytes = cache_config(setting)?;
        if args.cache_size > 0 && args.cache_size != bytes {
            anyhow::bail!(
                "--cache-size {} and --cache-config {setting} give the cache two sizes: give one",
                args.cache_size
            );
        }
        config.response_cache_bytes = bytes;
    }
    if args.model_repository.is_empty() && config.models.is_empty() && args.queue.url.is_none() {
        anyhow::bail!(
            "no models: give --model-repository DIR, or a --config file that lists models (or \
             --queue URL to be a gateway only)"
        );
    }
    init_onnx(
        args.onnxruntime_lib.as_deref(),
        loaded.onnx_library.as_deref(),
    )?;
    let host = args
        .host
        .clone()
        .or(loaded.host)
        .unwrap_or_else(|| "127.0.0.1".into());
    let http_port = args.http_port.or(loaded.http_port).unwrap_or(8000);

    let http_tls = tls_config(&args)?;
    let grpc_tls = grpc_tls_config(&args, &http_tls)?;
    let grpc_keepalive = grpc_keepalive(&args)?;
    let grpc_max_age = grpc_max_age(&args)?;
    let http_restricted =
        Restrictions::http(&args.http_restricted_api).map_err(anyhow::Error::msg)?;
    let grpc_restricted =
        Restrictions::grpc(&args.grpc_restricted_protocol).map_err(anyhow::Error::msg)?;
    let backend_config =
        crate::backend_config::read(&args.backend_config).map_err(anyhow::Error::msg)?;
    for (setting, why) in &backend_config.nothing_to_set {
        tracing::info!(%setting, "--backend-config taken with nothing to set: {why}");
    }
    let rate_limit = match args.rate_limit {
        RateLimitArg::ExecutionCount => Some(args.rate_limit_resource.clone()),
        RateLimitArg::Off if args.rate_limit_resource.is_empty() => None,
        RateLimitArg::Off => anyhow::bail!(
            "--rate-limit-resource counts resources for the rate limiter, which is off: give \
             --rate-limit execution_count too"
        ),
    };

    let callback = sheaf_backend::Callback::default();
    let manager = ModelManager::with_config(backends(args.python.as_deref(), &callback), &config)
        .map_err(anyhow::Error::msg)?;
    let control = match args.model_control_mode {
        Some(ControlModeArg::None) => ControlMode::None,
        Some(ControlModeArg::Explicit) => ControlMode::Explicit,
        Some(ControlModeArg::OnDemand) => ControlMode::OnDemand,
        Some(ControlModeArg::Poll) => ControlMode::Poll,
        None => {
            let (fits, need) = manager
                .all_fit(&args.model_repository)
                .map_err(anyhow::Error::msg)?;
            let mode = if fits {
                ControlMode::None
            } else {
                ControlMode::OnDemand
            };
            tracing::info!(
                ?mode,
                models_need_mb = need / (1024 * 1024),
                "model control mode chosen: the models {} the memory limits",
                if fits { "fit" } else { "do not fit" }
            );
            mode
        }
    };
    if control.loads_everything() && !args.load_model.is_empty() {
        tracing::warn!(
            models = ?args.load_model,
            "--load-model has no effect in the 'none' and 'poll' control modes: every model loads at start"
        );
    }
    let poll_every = crate::cli::some_seconds("--repository-poll-secs", args.repository_poll_secs)?;
    if args.model_namespacing == Some(true) {
        tracing::info!(
            "--model-namespacing: model names stay one set over every repository; a name in two \
             fails, with both folders named, rather than serving both"
        );
    }
    if let Some(name) = &args.model_config_name {
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && !name.contains(|c: char| c == '/' || c == '\\' || c.is_whitespace());
        if !plain {
            anyhow::bail!(
                "--model-config-name '{name}': give a plain name (configs/NAME.pbtxt in each \
                 model folder), without spaces, slashes or a leading dot"
            );
        }
    }
    if control == ControlMode::Poll && args.model_repository.is_empty() {
        anyhow::bail!(
            "--model-control-mode poll looks at a model repository: give --model-repository"
        );
    }
    let manager = manager
        .with_control(control)
        .with_load_at_start(args.load_model.clone())
        .with_strict_readiness(args.strict_readiness)
        .with_config_name(args.model_config_name.clone())
        .with_auto_complete(
            !args.disable_auto_complete_config && args.strict_model_config != Some(true),
        )
        .with_start_loads(args.model_load_thread_count)
        .with_load_retries(args.model_load_retry_count)
        .with_rate_limit(rate_limit)
        .with_default_max_batch_sizes(backend_config.default_max_batch_size)
        .with_host_metrics(args.allow_cpu_metrics, args.allow_gpu_metrics);
    let latency = sheaf_core::summary::LatencyMetrics::parse(&args.metrics_config)
        .map_err(|e| anyhow::anyhow!(e))?;
    if latency != Default::default() {
        tracing::info!(counters = latency.counters, quantiles = ?latency.quantiles, "Triton's latency metrics");
    }
    manager.metrics().set_latency_metrics(latency);
    if let Some(ms) = args.metrics_interval_ms {
        tracing::info!(
            interval_ms = ms,
            "--metrics-interval-ms: sheaf reads its gauges when /metrics is scraped; nothing to set"
        );
    }
    let devices: Vec<&str> = manager.devices().iter().map(|d| d.name.as_str()).collect();
    tracing::info!(?devices, routing = ?config.routing, "devices");
    let manager = Arc::new(manager);
    call_back(&callback, &manager);
    manager.spawn_idle_unloader();
    manager.spawn_memory_watch();
    if !args.allow_http && !args.allow_grpc && !args.allow_sagemaker && !args.allow_vertex_ai {
        anyhow::bail!(
            "--allow-http false and --allow-grpc false leave no way to reach the models: allow \
             one (or --allow-sagemaker or --allow-vertex-ai true)"
        );
    }
    let vertex_routes = vertex_routes(&args)?;
    if let Some(range) = &args.sagemaker_safe_port_range {
        let listeners = [
            ("HTTP", args.allow_http, http_port),
            ("gRPC", args.allow_grpc, args.grpc_port),
            ("metrics", args.allow_metrics, args.metrics_port),
            ("Vertex AI", args.allow_vertex_ai, args.vertex_ai_port),
        ];
        check_safe_ports(range, &listeners).map_err(anyhow::Error::msg)?;
    }
    // Each listener on its own address where one is given (Triton's --http-address...), else
    // on --host.
    let address_of = |own: &Option<String>| own.clone().unwrap_or_else(|| host.clone());
    let http_host = address_of(&args.http_address);
    let grpc_host = address_of(&args.grpc_address);
    let metrics_host = address_of(&args.metrics_address);
    let listener = bind(args.allow_http, &http_host, http_port, args.reuse_http_port).await?;
    let grpc_listener = bind(
        args.allow_grpc,
        &grpc_host,
        args.grpc_port,
        args.reuse_grpc_port,
    )
    .await?;
    let metrics_listener =
        bind(args.allow_metrics, &metrics_host, args.metrics_port, false).await?;
    let sagemaker_listener =
        bind(args.allow_sagemaker, &http_host, args.sagemaker_port, false).await?;
    let vertex_listener =
        bind(args.allow_vertex_ai, &http_host, args.vertex_ai_port, false).await?;
    let open_hosts = [
        (args.allow_http, &http_host),
        (args.allow_grpc, &grpc_host),
        (args.allow_metrics, &metrics_host),
        (args.allow_sagemaker, &http_host),
        (args.allow_vertex_ai, &http_host),
    ];
    let trace_settings = args.trace_settings();
    let access = AccessConfig {
        api_keys: non_empty(args.api_keys),
        admin_keys: non_empty(args.admin_keys),
        protect_metrics: args.protect_metrics,
        http_restricted,
        grpc_restricted,
    };
    let beyond = open_hosts
        .iter()
        .find(|(open, host)| *open && !is_loopback(host));
    if let (false, Some((_, host))) = (access.is_protected(), beyond) {
        tracing::warn!(%host, "listening beyond this machine with no API key: anyone who reaches the port can run and manage models (see --api-key, --admin-key)");
    }
    let traces =
        sheaf_core::trace::Tracer::from_config(&trace_settings).map_err(anyhow::Error::msg)?;
    if let Some(file) = traces.file() {
        tracing::info!(file = %file.display(), settings = ?traces.settings(None), "request traces");
    }
    let traces = Arc::new(traces);
    let forward = |flag: &str, pattern: &Option<String>| {
        pattern
            .as_deref()
            .map(sheaf_server::forward::Pattern::new)
            .transpose()
            .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
    };
    tracing::info!(
        bytes = request_memory,
        "requests held in memory at once are bounded (--max-request-memory)"
    );
    let mut state = AppState::new(manager.clone())
        .with_request_memory(request_memory)
        .with_id(&args.id)
        .with_response_store(args.responses_store_mib.saturating_mul(1 << 20))
        .with_files(
            args.files_dir.clone(),
            (args.files_store_mib as u64).saturating_mul(1 << 20),
        )
        .with_context(|| {
            let dir = args
                .files_dir
                .as_deref()
                .unwrap_or(std::path::Path::new(""));
            format!("--files-dir {}: cannot keep files there", dir.display())
        })?
        .with_header_forwarding(
            forward(
                "--http-header-forward-pattern",
                &args.http_header_forward_pattern,
            )?,
            forward(
                "--grpc-header-forward-pattern",
                &args.grpc_header_forward_pattern,
            )?,
        )
        .with_access(access)
        .with_traces(traces.clone());
    let broker = match broker_config(&args.queue)? {
        Some(config) => {
            let broker = Arc::new(Broker::connect(config).await.map_err(anyhow::Error::msg)?);
            state = state.with_broker(broker.clone());
            Some(broker)
        }
        None => None,
    };
    use crate::cli::seconds;
    let limits = ConnectionLimits {
        max_connections: args.max_connections,
        header_timeout: seconds("--client-header-timeout", args.client_header_timeout)?,
        body_timeout: seconds("--client-body-timeout", args.client_body_timeout)?,
        // The HTTP and metrics ports send no pings and keep connections for any time; gRPC's
        // may do otherwise (below).
        keepalive: None,
        max_age: None,
    };
    let grpc_limits = ConnectionLimits {
        keepalive: grpc_keepalive,
        max_age: grpc_max_age,
        ..limits
    };
    let http_config = HttpConfig {
        max_body_bytes: args.max_body_bytes,
        body_timeout: limits.body_timeout,
        cors: sheaf_server::Cors::parse(&args.cors_allow_origins).map_err(anyhow::Error::msg)?,
    };
    let router = sheaf_server::router(state.clone(), &http_config);
    let shutdown_timeout = seconds("--shutdown-timeout", args.shutdown_timeout)?;
    let drain_delay = seconds("--drain-delay", args.drain_delay)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|&stop| stop).await;
        }
    };
    let (deadline_tx, deadline_rx) = tokio::sync::oneshot::channel();
    let drain = state.drain.clone();
    tokio::spawn(async move {
        let signal = shutdown_signal().await;
        drain.announce();
        // A terminal's Ctrl-C has no load balancer to wait for.
        let delay = if signal == "SIGINT" {
            std::time::Duration::ZERO
        } else {
            drain_delay
        };
        if !delay.is_zero() {
            tracing::info!(
                delay_s = delay.as_secs_f64(),
                "drain delay: readiness is false; requests are still served, and each answer tells its client to reconnect"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                again = shutdown_signal() => tracing::info!(signal = again, "a second signal ends the drain delay"),
            }
        }
        let deadline = tokio::time::Instant::now() + shutdown_timeout;
        let _ = deadline_tx.send(deadline);
        drain.begin();
        tracing::info!(
            in_flight = drain.in_flight(),
            timeout_s = shutdown_timeout.as_secs_f64(),
            "draining: readiness is false, new work is refused, admitted requests finish"
        );
        if tokio::time::timeout_at(deadline, drain.idle())
            .await
            .is_err()
        {
            tracing::warn!(
                unanswered = drain.in_flight(),
                "the shutdown timeout ended the drain; open streams are cut"
            );
            drain.cut();
        }
        let _ = stop_tx.send(true);
    });
    let scheme = if http_tls.is_some() { "https" } else { "http" };
    // Each HTTP listener (the API, metrics, the clouds' routes) serves its routes under the same
    // limits, TLS and drain.
    let serve_http = |listener: tokio::net::TcpListener, routes| {
        tokio::spawn(sheaf_server::serve_with(
            listener,
            routes,
            limits,
            http_tls.clone(),
            state.drain.clone(),
            stopped(),
        ))
    };
    let server = match listener {
        Some(listener) => {
            let address = listener.local_addr()?;
            tracing::info!(%address, tls = http_tls.is_some(), "HTTP listening on {scheme}://{address}");
            Some(serve_http(listener, router.clone()))
        }
        None => {
            tracing::info!("HTTP off (--allow-http false)");
            None
        }
    };
    let metrics = match metrics_listener {
        Some(listener) => {
            let metrics_address = listener.local_addr()?;
            tracing::info!(%metrics_address, "metrics on {scheme}://{metrics_address}/metrics");
            Some(serve_http(
                listener,
                sheaf_server::metrics_router(state.clone()),
            ))
        }
        None => {
            tracing::info!("metrics off (--allow-metrics false)");
            None
        }
    };
    let sagemaker = match sagemaker_listener {
        Some(listener) => {
            let sagemaker_address = listener.local_addr()?;
            tracing::info!(%sagemaker_address, model = ?args.sagemaker_model, inference = ?args.sagemaker_inference_type, ping = ?args.sagemaker_ping_mode, "SageMaker's /ping and /invocations on {scheme}://{sagemaker_address}");
            let options = sheaf_server::http::sagemaker::SageMakerOptions {
                model: args.sagemaker_model.clone(),
                inference: args.sagemaker_inference_type,
                ping: args.sagemaker_ping_mode,
            };
            let routes = sheaf_server::sagemaker_router(state.clone(), &http_config, options);
            Some(serve_http(listener, routes))
        }
        None => None,
    };
    let vertex = match vertex_listener {
        Some(listener) => {
            let vertex_address = listener.local_addr()?;
            tracing::info!(%vertex_address, model = ?args.vertex_ai_default_model, predict = %vertex_routes.0, health = %vertex_routes.1, "Vertex AI's routes on {scheme}://{vertex_address}");
            let routes = sheaf_server::vertex_router(
                state.clone(),
                &http_config,
                args.vertex_ai_default_model.clone(),
                (&vertex_routes.0, &vertex_routes.1),
                router.clone(),
            );
            Some(serve_http(listener, routes))
        }
        None => None,
    };
    let grpc = match grpc_listener {
        Some(listener) => {
            let grpc_address = listener.local_addr()?;
            tracing::info!(%grpc_address, tls = grpc_tls.is_some(), "gRPC listening on {grpc_address}");
            Some(tokio::spawn(sheaf_server::grpc::serve_with(
                listener,
                state.clone(),
                sheaf_server::grpc::GrpcConfig {
                    max_message_bytes: args.max_body_bytes,
                    compress_responses: args.grpc_infer_response_compression_level
                        != CompressionLevel::None,
                },
                grpc_limits,
                grpc_tls,
                stopped(),
            )))
        }
        None => {
            tracing::info!("gRPC off (--allow-grpc false)");
            None
        }
    };

    manager
        .load_models(&args.model_repository)
        .await
        .map_err(anyhow::Error::msg)?;
    let failed = manager.failed();
    if args.exit_on_error && !failed.is_empty() {
        let each: Vec<String> = failed
            .iter()
            .map(|(m, why)| format!("'{m}': {why}"))
            .collect();
        // The models that did load are released as at any exit (a thread still freeing one as
        // the process ends could crash it).
        release_models(&manager, shutdown_timeout).await;
        anyhow::bail!(
            "--exit-on-error: {} model(s) did not load: {}",
            failed.len(),
            each.join("; ")
        );
    }
    if control == ControlMode::Poll {
        tracing::info!(
            every_s = poll_every.as_secs_f64(),
            "the model repository is polled for changes"
        );
        manager.spawn_repository_poll(poll_every);
    }
    // Names only: a status holds its model's handle, which must not outlive the unload at exit.
    let (names, ready): (Vec<String>, usize) = {
        let models = manager.list();
        let ready = models
            .iter()
            .filter(|(_, s)| s.state() == sheaf_core::ModelState::Ready)
            .count();
        (models.into_iter().map(|(name, _)| name).collect(), ready)
    };
    tracing::info!(
        ready,
        total = names.len(),
        "model repository loaded; server ready"
    );
    sheaf_server::openai::batch::runs::resume(&state);
    if let Some(broker) = broker {
        // Every tensor model this instance serves takes requests from the queue too.
        let generators = manager.generators();
        let served = names
            .into_iter()
            .filter(|name| !generators.contains(name))
            .collect();
        sheaf_server::broker::worker::spawn(state.clone(), broker, served);
    }

    let servers = async {
        let tasks = [
            (server, "HTTP"),
            (grpc, "gRPC"),
            (metrics, "metrics"),
            (sagemaker, "SageMaker"),
            (vertex, "Vertex AI"),
        ];
        for (task, what) in tasks {
            if let Some(task) = task {
                task.await
                    .with_context(|| format!("{what} server task failed"))??;
            }
        }
        anyhow::Ok(())
    };
    // Once the drain is over, the listeners close and wait for their connections to end; the
    // shutdown timeout (and a second for the last bytes) bounds that wait too.
    let bound = async {
        match deadline_rx.await {
            Ok(deadline) => {
                tokio::time::sleep_until(deadline + std::time::Duration::from_secs(1)).await
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        done = servers => done?,
        () = bound => tracing::warn!("connections still open at the shutdown timeout were closed"),
    }
    drop(state);
    // The traces taken and not written yet.
    traces.finish();
    release_models(&manager, shutdown_timeout).await;
    tracing::info!("shut down");
    Ok(())
}

/// Vertex AI's prediction and health routes, checked: each a path of its own.
fn vertex_routes(args: &ServeArgs) -> anyhow::Result<(String, String)> {
    let (predict, health) = (&args.vertex_ai_predict_route, &args.vertex_ai_health_route);
    for (flag, route) in [("predict", predict), ("health", health)] {
        let plain = route.starts_with('/')
            && route.len() > 1
            && !route.contains(['{', '}', '*', ' ', '?', '#']);
        if !plain {
            anyhow::bail!(
                "--vertex-ai-{flag}-route (AIP_{}_ROUTE) '{route}': give a path such as /{flag}",
                flag.to_uppercase()
            );
        }
    }
    if predict == health {
        anyhow::bail!("Vertex AI's prediction and health routes are both '{predict}': give two");
    }
    Ok((predict.clone(), health.clone()))
}

/// Unloads every model and waits, up to `timeout` for each step, until every thread that owned one has
/// dropped it. The runtimes' own process-wide state is torn down when `main` returns; a thread
/// still freeing a model then (a CUDA session, say) would crash the exit.
pub(crate) async fn release_models(manager: &ModelManager, timeout: std::time::Duration) {
    // After the drain, no model holds admitted requests, unless the drain timed out; then the
    // unloads stop waiting for them too, and those requests fail as their models go.
    if tokio::time::timeout(timeout, manager.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("models still held requests at the shutdown timeout; unloaded anyway");
    }
    let threads = sheaf_backend::threads::ModelThreads::process();
    let left = tokio::task::spawn_blocking(move || threads.wait_all(timeout))
        .await
        .unwrap_or_default();
    if left.is_empty() {
        tracing::info!("every model dropped");
    } else {
        tracing::warn!(threads = ?left, "model threads still running at the shutdown timeout");
    }
}

/// Loads ONNX Runtime: `--onnxruntime-lib`, else $ORT_DYLIB_PATH, else the configuration's
/// library, else the project's .venv. A library named by any of the first three must load. When
/// none is named and no .venv holds one, the server starts without it (its Python and GGUF
/// models need none), says so, and each ONNX model's load fails with the reason.
pub(crate) fn init_onnx(
    flag: Option<&std::path::Path>,
    from_config: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let named = std::env::var_os(sheaf_onnx::library::ENV_VAR).is_some_and(|v| !v.is_empty());
    let library = match (flag, from_config) {
        (None, Some(from_config)) if !named => from_config.to_path_buf(),
        _ => match sheaf_onnx::library::locate(flag) {
            Ok(library) => library,
            Err(e) if flag.is_none() && !named => {
                tracing::warn!("{e}; ONNX models will not load");
                sheaf_onnx::unavailable(e.to_string());
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        },
    };
    sheaf_onnx::init(&library)?;
    tracing::info!(library = %library.display(), "ONNX Runtime loaded");
    Ok(())
}

/// Every backend this build has: ONNX Runtime, the simulated device, llama.cpp and Python.
/// `python`: the interpreter of Python models that name none (`--python`). `callback` is
/// how Python models send requests of their own (BLS): set it with [`call_back`] once the
/// manager exists.
pub(crate) fn backends(
    python: Option<&std::path::Path>,
    callback: &sheaf_backend::Callback,
) -> Vec<Arc<dyn sheaf_backend::Backend>> {
    vec![
        Arc::new(OnnxBackend::default()),
        Arc::new(SimBackend),
        Arc::new(GgufBackend),
        Arc::new(sheaf_python::PythonBackend::new(
            python.map(Into::into),
            callback.clone(),
        )),
    ]
}

/// Lets the backends given `callback` run requests through `manager`.
pub(crate) fn call_back(callback: &sheaf_backend::Callback, manager: &Arc<ModelManager>) {
    callback.set(sheaf_core::caller(manager));
}

/// The queue's settings, from `--queue*`; `None` without `--queue`.
fn broker_config(args: &QueueArgs) -> anyhow::Result<Option<BrokerConfig>> {
    let Some(url) = &args.url else {
        return Ok(None);
    };
    let seconds = crate::cli::some_seconds;
    let mut config = BrokerConfig::new(url.clone());
    config.stream = args.stream.clone();
    config.prefix = args.prefix.clone();
    config.ack_wait = seconds("--queue-ack-wait", args.ack_wait)?;
    config.timeout = seconds("--queue-timeout", args.timeout)?;
    if args.window == Some(0) {
        anyhow::bail!("--queue-window must be at least 1");
    }
    config.window = args.window;
    Ok(Some(config))
}

/// The TLS configuration of every port, from `--tls-*`; read now, so that a bad file stops the
/// start rather than the first connection.
fn tls_config(args: &ServeArgs) -> anyhow::Result<Option<sheaf_server::tls::HttpTls>> {
    let files = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.tls_client_ca.clone(),
        },
        (None, None) if args.tls_client_ca.is_none() => return Ok(None),
        _ => anyhow::bail!(
            "TLS needs both --tls-cert and --tls-key (and --tls-client-ca needs them)"
        ),
    };
    Ok(Some(files.server_config().map_err(anyhow::Error::msg)?))
}

/// The gRPC port's connection age and its grace, from Triton's `--grpc-max-connection-age`
/// and `--grpc-max-connection-age-grace` (milliseconds).
fn grpc_max_age(
    args: &ServeArgs,
) -> anyhow::Result<Option<(std::time::Duration, Option<std::time::Duration>)>> {
    let ms = std::time::Duration::from_millis;
    match (
        args.grpc_max_connection_age,
        args.grpc_max_connection_age_grace,
    ) {
        (None, None) => Ok(None),
        (None, Some(_)) => {
            anyhow::bail!("--grpc-max-connection-age-grace is read with --grpc-max-connection-age")
        }
        (Some(0), _) => anyhow::bail!("--grpc-max-connection-age must be above 0"),
        (Some(age), grace) => Ok(Some((ms(age), grace.map(ms)))),
    }
}

/// The gRPC port's keepalive pings, from Triton's `--grpc-keepalive-time` and
/// `--grpc-keepalive-timeout` (milliseconds; the timeout 20,000 by default, as Triton's).
fn grpc_keepalive(args: &ServeArgs) -> anyhow::Result<Option<sheaf_server::Keepalive>> {
    let ms = std::time::Duration::from_millis;
    match (args.grpc_keepalive_time, args.grpc_keepalive_timeout) {
        (None, None) => Ok(None),
        (None, Some(_)) => {
            anyhow::bail!("--grpc-keepalive-timeout is read with --grpc-keepalive-time")
        }
        (Some(0), _) | (_, Some(0)) => {
            anyhow::bail!("--grpc-keepalive-time and --grpc-keepalive-timeout must be above 0")
        }
        (Some(every), timeout) => Ok(Some(sheaf_server::Keepalive {
            every: ms(every),
            timeout: ms(timeout.unwrap_or(20_000)),
        })),
    }
}

/// The TLS configuration of the gRPC port: its own from Triton's `--grpc-use-ssl`,
/// `--grpc-use-ssl-mutual` and `--grpc-server-cert/-key`/`--grpc-root-cert` when those turn it
/// on, else every port's (`http`, from `--tls-*`).
fn grpc_tls_config(
    args: &ServeArgs,
    http: &Option<sheaf_server::tls::HttpTls>,
) -> anyhow::Result<Option<sheaf_server::tls::HttpTls>> {
    let mutual = args.grpc_use_ssl_mutual == Some(true);
    // As Triton: the mutual flag turns TLS on by itself.
    if args.grpc_use_ssl != Some(true) && !mutual {
        if args.grpc_server_cert.is_some()
            || args.grpc_server_key.is_some()
            || args.grpc_root_cert.is_some()
        {
            anyhow::bail!(
                "--grpc-server-cert, --grpc-server-key and --grpc-root-cert are read with \
                 --grpc-use-ssl true (or --grpc-use-ssl-mutual true)"
            );
        }
        return Ok(http.clone());
    }
    let (Some(cert), Some(key)) = (&args.grpc_server_cert, &args.grpc_server_key) else {
        anyhow::bail!("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key");
    };
    let client_ca = match (mutual, &args.grpc_root_cert) {
        (true, Some(ca)) => Some(ca.clone()),
        (true, None) => anyhow::bail!("--grpc-use-ssl-mutual needs --grpc-root-cert"),
        (false, _) => None,
    };
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca,
    };
    let config = files
        .server_config()
        .map_err(|e| anyhow::anyhow!("gRPC TLS: {e}"))?;
    Ok(Some(config))
}

/// The keys given, without empty ones (an unset `SHEAF_API_KEY=` gives one empty key).
fn non_empty(keys: Vec<String>) -> Vec<String> {
    keys.into_iter()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect()
}

/// A listener on `host:port` when `allowed`.
/// Checks tritonserver's `--sagemaker-safe-port-range LOW-HIGH`: each open listener of
/// `listeners` (name, open, port) has its port in the range.
fn check_safe_ports(range: &str, listeners: &[(&str, bool, u16)]) -> Result<(), String> {
    let bad = || format!("--sagemaker-safe-port-range '{range}': give LOW-HIGH, e.g. 10000-10999");
    let (low, high) = range.trim().split_once('-').ok_or_else(bad)?;
    let low: u16 = low.trim().parse().map_err(|_| bad())?;
    let high: u16 = high.trim().parse().map_err(|_| bad())?;
    if low > high {
        return Err(bad());
    }
    for (name, open, port) in listeners {
        if *open && !(low..=high).contains(port) {
            return Err(format!(
                "the {name} port {port} is outside --sagemaker-safe-port-range {low}-{high}: \
                 give it a port in the range, or turn it off (--allow-{} false)",
                name.to_ascii_lowercase().replace(' ', "-")
            ));
        }
    }
    Ok(())
}

/// Listens on `host:port` where `allowed`; with `shared`, beside other processes that share
/// the port too (SO_REUSEPORT, Triton's `--reuse-http-port` and `--reuse-grpc-port`).
async fn bind(
    allowed: bool,
    host: &str,
    port: u16,
    shared: bool,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    if !allowed {
        return Ok(None);
    }
    let cannot = || format!("cannot listen on {host}:{port}");
    if !shared {
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .with_context(cannot)?;
        return Ok(Some(listener));
    }
    let address = tokio::net::lookup_host((host, port))
        .await
        .with_context(cannot)?
        .next()
        .with_context(|| format!("{host} names no address"))?;
    let socket = match address {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .with_context(cannot)?;
    socket.set_reuseaddr(true).with_context(cannot)?;
    socket.set_reuseport(true).with_context(cannot)?;
    socket.bind(address).with_context(cannot)?;
    Ok(Some(socket.listen(1024).with_context(cannot)?))
}

/// True for an address only this machine can reach.
fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Resolves at SIGINT (Ctrl-C) or SIGTERM (what service managers and Kubernetes send), with the
/// signal's name. Either starts the drain; SIGINT skips its delay.
async fn shutdown_signal() -> &'static str {
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
        "SIGINT"
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
        "SIGTERM"
    };
    let signal = tokio::select! {
        s = interrupt => s,
        s = terminate => s,
    };
    tracing::info!(signal, "shutting down");
    signal
}

/// The most bytes of requests held at once: `asked`, or half of the memory available now (where
/// it can be read), and never less than one body of `max_body_bytes`: a smaller bound asked for
/// could never admit the largest body, and stops the start.
fn request_memory(asked: Option<usize>, max_body_bytes: usize) -> anyhow::Result<usize> {
    match asked {
        Some(bytes) if bytes < max_body_bytes => anyhow::bail!(
            "--max-request-memory {bytes} is less than --max-body-bytes {max_body_bytes}: the \
             largest request would always be refused"
        ),
        Some(bytes) => Ok(bytes),
        None => Ok(sheaf_core::available_memory()
            .map_or(usize::MAX, |available| {
                usize::try_from(available / 2).unwrap_or(usize::MAX)
            })
            .max(max_body_bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::check_safe_ports;

    #[test]
    fn open_listeners_must_be_in_sagemaker_s_safe_range() {
        let closed = [("HTTP", false, 8000), ("gRPC", false, 8001)];
        assert!(check_safe_ports("10000-10999", &closed).is_ok());
        let inside = [("HTTP", true, 10001), ("metrics", true, 10999)];
        assert!(check_safe_ports("10000-10999", &inside).is_ok());
        let e = check_safe_ports("10000-10999", &[("Vertex AI", true, 8080)]).unwrap_err();
        assert!(
            e.contains("Vertex AI port 8080") && e.contains("--allow-vertex-ai false"),
            "{e}"
        );
        for bad in ["10000", "b-c", "10999-10000", "1-99999"] {
            assert!(
                check_safe_ports(bad, &[])
                    .unwrap_err()
                    .contains("give LOW-HIGH"),
                "{bad}"
            );
        }
    }
}
