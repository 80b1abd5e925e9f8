//! `sheaf serve`: load ONNX Runtime and the model repository, then serve HTTP and gRPC until
//! Ctrl-C.

use std::sync::Arc;

use anyhow::Context;
use sheaf_core::{ControlMode, ModelManager, ServerConfig};
use sheaf_onnx::OnnxBackend;
use sheaf_server::{AppState, HttpConfig};
use sheaf_sim::SimBackend;

use crate::cli::{ControlModeArg, ServeArgs};

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let library = sheaf_onnx::library::locate(args.onnxruntime_lib.as_deref())?;
    sheaf_onnx::init(&library)?;
    tracing::info!(library = %library.display(), "ONNX Runtime loaded");

    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            ServerConfig::from_yaml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => ServerConfig::default(),
    };
    let manager = ModelManager::with_config(
        vec![Arc::new(OnnxBackend::default()), Arc::new(SimBackend)],
        &config,
    )
    .map_err(anyhow::Error::msg)?
    .with_control(match args.model_control_mode {
        ControlModeArg::None => ControlMode::None,
        ControlModeArg::Explicit => ControlMode::Explicit,
        ControlModeArg::OnDemand => ControlMode::OnDemand,
    });
    let devices: Vec<&str> = manager.devices().iter().map(|d| d.name.as_str()).collect();
    tracing::info!(?devices, routing = ?config.routing, "devices");
    let manager = Arc::new(manager);
    manager.spawn_idle_unloader();
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.http_port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.http_port))?;
    let address = listener.local_addr()?;
    let grpc_listener = tokio::net::TcpListener::bind((args.host.as_str(), args.grpc_port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.grpc_port))?;
    let grpc_address = grpc_listener.local_addr()?;
    let metrics_listener = tokio::net::TcpListener::bind((args.host.as_str(), args.metrics_port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.metrics_port))?;
    let metrics_address = metrics_listener.local_addr()?;
    let state = AppState {
        manager: manager.clone(),
    };
    let router = sheaf_server::router(
        state.clone(),
        &HttpConfig {
            max_body_bytes: args.max_body_bytes,
        },
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|&stop| stop).await;
        }
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    tracing::info!(%address, "HTTP listening on http://{address}");
    let server = tokio::spawn(sheaf_server::serve(listener, router, stopped()));
    tracing::info!(%grpc_address, "gRPC listening on {grpc_address}");
    tracing::info!(%metrics_address, "metrics on http://{metrics_address}/metrics");
    let metrics = tokio::spawn(sheaf_server::serve(
        metrics_listener,
        sheaf_server::metrics_router(state.clone()),
        stopped(),
    ));
    let grpc = tokio::spawn(sheaf_server::grpc::serve(
        grpc_listener,
        state,
        args.max_body_bytes,
        stopped(),
    ));

    manager
        .load_repository(&args.model_repository)
        .await
        .map_err(anyhow::Error::msg)?;
    let models = manager.list();
    let ready = models.iter().filter(|(_, s)| s.state() == "READY").count();
    tracing::info!(
        ready,
        total = models.len(),
        "model repository loaded; server ready"
    );

    server.await.context("HTTP server task failed")??;
    grpc.await.context("gRPC server task failed")??;
    metrics.await.context("metrics server task failed")??;
    tracing::info!("shut down");
    Ok(())
}

async fn shutdown_signal() {
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::error!("cannot listen for Ctrl-C: {e}");
        std::future::pending::<()>().await;
    }
    tracing::info!("Ctrl-C received; shutting down");
}
