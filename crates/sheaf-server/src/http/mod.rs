//! The KServe v2 HTTP server (axum).
//!
//! [`router`] builds the routes over an [`AppState`]; [`serve`] runs them on a bound listener
//! under [`ConnectionLimits`], so that tests bind `127.0.0.1:0` and talk to a real socket.

mod cloud;
mod cors;
mod encoding;
pub(crate) mod gate;
mod generate;
pub(crate) use generate::Once;
mod generate_text;
mod handlers;
pub mod sagemaker;
pub mod sagemaker_models;
mod shm;
mod stats;
pub mod vertex;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

pub use self::cors::Cors;
use crate::drain::Drain;
use crate::listen::{serve_connections, ConnectionLimits};
use crate::AppState;

/// Limits of the HTTP front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Largest request body in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Time a client has to send a request's body; slower ones get 408.
    pub body_timeout: Duration,
    /// The origins whose web pages may call the main port ([`Cors`]); none: no page of
    /// another site may.
    pub cors: Option<Cors>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 64 * 1024 * 1024,
            body_timeout: ConnectionLimits::default().body_timeout,
            cors: None,
        }
    }
}

/// All KServe v2 routes.
pub fn router(state: AppState, config: &HttpConfig) -> Router {
    let routes = Router::new()
        .route("/v2", get(handlers::server_metadata))
        .route("/v2/health/live", get(handlers::live))
        .route("/v2/health/ready", get(handlers::ready))
        .route("/v2/models/stats", get(handlers::all_stats))
        // The dashboard's page; a POST is TEI's embeddings or sentence similarity, as TEI
        // serves them at its root (Hugging Face's `InferenceClient(model=URL)`).
        .route("/", get(handlers::dashboard).post(crate::tei::root))
        // TEI's and vLLM's health check, which container health checks ask.
        .route("/health", get(handlers::ready))
        .route("/v2/repository/index", post(handlers::repository_index))
        .route(
            "/v2/repository/models/{model}/load",
            post(handlers::repository_load),
        )
        .route(
            "/v2/repository/models/{model}/unload",
            post(handlers::repository_unload),
        )
        .route("/stats", get(handlers::server_stats))
        .route(
            "/v2/trace/setting",
            get(handlers::trace_settings).post(handlers::update_trace_settings),
        )
        .route(
            "/v2/logging",
            get(handlers::log_settings).post(handlers::update_log_settings),
        )
        .route("/v2/cudasharedmemory/status", get(shm::cuda_status_all))
        .route(
            "/v2/cudasharedmemory/region/{name}/status",
            get(shm::cuda_status),
        )
        .route(
            "/v2/cudasharedmemory/region/{name}/register",
            post(shm::cuda_register),
        )
        .route(
            "/v2/cudasharedmemory/region/{name}/unregister",
            post(shm::cuda_unregister),
        )
        .route(
            "/v2/cudasharedmemory/unregister",
            post(shm::cuda_unregister),
        )
        .route("/v2/systemsharedmemory/status", get(shm::status_all))
        .route(
            "/v2/systemsharedmemory/region/{name}/status",
            get(shm::status),
        )
        .route(
            "/v2/systemsharedmemory/region/{name}/register",
            post(shm::register),
        )
        .route(
            "/v2/systemsharedmemory/region/{name}/unregister",
            post(shm::unregister),
        )
        .route(
            "/v2/systemsharedmemory/unregister",
            post(shm::unregister_all),
        )
        .merge(model_routes())
        .merge(crate::openai::routes())
        .merge(crate::tei::routes())
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed);
    let router = gated(routes, state.clone(), config)
        .layer(middleware::from_fn(crate::stages::account))
        .with_state(state);
    match &config.cors {
        // Outside the checks: a preflight carries no key.
        Some(cors) => router.layer(cors.layer()),
        None => router,
    }
}

/// A model's routes, under `/v2/models/{model}` and `/v2/models/{model}/versions/{version}`.
/// Each path is a route of its own rather than a nested router's, which would strip the prefix
/// of every request (an inference request's included) on its way in.
fn model_routes() -> Router<AppState> {
    let each: [(&str, MethodRouter<AppState>); 8] = [
        ("", get(handlers::model_metadata)),
        ("/ready", get(handlers::model_ready)),
        (
            "/infer",
            post(handlers::infer).layer(encoding::compression()),
        ),
        ("/generate", post(generate::generate)),
        ("/generate_stream", post(generate::generate_stream)),
        ("/stats", get(handlers::model_stats)),
        ("/config", get(handlers::model_config)),
        (
            "/trace/setting",
            get(handlers::model_trace_settings).post(handlers::update_model_trace_settings),
        ),
    ];
    let mut routes = Router::new();
    for prefix in [
        "/v2/models/{model}",
        "/v2/models/{model}/versions/{version}",
    ] {
        for (suffix, route) in &each {
            routes = routes.route(&format!("{prefix}{suffix}"), route.clone());
        }
    }
    routes
}

/// `routes` behind the main port's checks ([`gate`]) and its body limit; POSTs from the pages
/// of `config`'s CORS origins pass (the caller adds the [`Cors`] layer).
fn gated<S: Clone + Send + Sync + 'static>(
    routes: Router<S>,
    state: AppState,
    config: &HttpConfig,
) -> Router<S> {
    routes
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            gate::Gate {
                state,
                body_timeout: config.body_timeout,
                max_body_bytes: config.max_body_bytes,
                cors: config.cors.clone().map(Arc::new),
            },
            gate::gate,
        ))
}

/// Amazon SageMaker's routes (`GET /ping`, `POST /invocations`, and the multi-model
/// endpoint's `/models`), served on their own port through the main port's checks;
/// `/invocations` runs `options`' model (see [`sagemaker`], [`sagemaker_models`]).
pub fn sagemaker_router(
    state: AppState,
    config: &HttpConfig,
    options: sagemaker::SageMakerOptions,
) -> Router {
    let routes = Router::new()
        .route("/ping", get(sagemaker::ping))
        .route("/invocations", post(sagemaker::invocations))
        .route(
            "/models",
            get(sagemaker_models::list).post(sagemaker_models::load),
        )
        .route(
            "/models/{name}",
            get(sagemaker_models::get_one).delete(sagemaker_models::unload),
        )
        .route("/models/{name}/invoke", post(sagemaker_models::invoke))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(sagemaker::SageMaker {
            state: state.clone(),
            options,
            models: Default::default(),
        });
    gated(routes, state, &without_cors(config)).layer(middleware::from_fn(crate::stages::account))
}

/// Google Vertex AI's routes (`health` GET, `predict` POST), served on their own port;
/// `predict` runs `model`, or redirected, a route of `main` (see [`vertex`]).
pub fn vertex_router(
    state: AppState,
    config: &HttpConfig,
    model: Option<String>,
    (predict, health): (&str, &str),
    main: Router,
) -> Router {
    let vertex = vertex::Vertex {
        state: state.clone(),
        model,
        main,
    };
    let predict = Router::new()
        .route(predict, post(vertex::predict))
        .with_state(vertex.clone());
    let predict = gated(predict, state, &without_cors(config));
    Router::new()
        .route(health, get(vertex::health))
        .with_state(vertex)
        .merge(predict)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(middleware::from_fn(crate::stages::account))
}

/// `config` for a port that takes no part in CORS: the cloud platforms' own.
fn without_cors(config: &HttpConfig) -> HttpConfig {
    HttpConfig {
        cors: None,
        ..config.clone()
    }
}

/// The Prometheus endpoint, served on its own port (`GET /metrics`).
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            gate::metrics_gate,
        ))
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` completes, under the default
/// [`ConnectionLimits`], without TLS, with no drain of its own.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(
        listener,
        router,
        ConnectionLimits::default(),
        None,
        Arc::default(),
        shutdown,
    )
    .await
}

/// Serves `router` on `listener` under `limits`, over TLS when `tls` is given, until `shutdown`
/// completes; then stops listening, lets each connection finish the request it is on, and
/// returns when all are closed. HTTP/1 and HTTP/2 (prior knowledge, or ALPN over TLS) are both
/// spoken. Once `drain` is announced, answers tell clients to reconnect (see
/// [`crate::listen`]).
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<crate::tls::HttpTls>,
    drain: Arc<Drain>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    if let Some(keepalive) = limits.keepalive {
        builder.http2().timer(TokioTimer::new());
        keepalive.apply(&mut builder.http2());
    }
    serve_connections(listener, router, builder, limits, tls, drain, shutdown).await;
    Ok(())
}
