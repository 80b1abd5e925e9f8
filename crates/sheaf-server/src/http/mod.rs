//! The KServe v2 HTTP server (axum).
//!
//! [`router`] builds the routes over an [`AppState`]; [`serve`] runs them on a bound listener, so
//! that tests bind `127.0.0.1:0` and talk to a real socket.

mod error;
mod gate;
mod handlers;
mod stats;

use std::future::Future;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;

use crate::AppState;

pub use error::ApiError;

/// Limits of the HTTP front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Largest request body in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 64 * 1024 * 1024,
        }
    }
}

/// All KServe v2 routes.
pub fn router(state: AppState, config: &HttpConfig) -> Router {
    let model_routes = Router::new()
        .route("/", get(handlers::model_metadata))
        .route("/ready", get(handlers::model_ready))
        .route("/infer", post(handlers::infer))
        .route("/stats", get(handlers::model_stats))
        .route("/config", get(handlers::model_config));
    Router::new()
        .route("/v2", get(handlers::server_metadata))
        .route("/v2/health/live", get(handlers::live))
        .route("/v2/health/ready", get(handlers::ready))
        .route("/v2/models/stats", get(handlers::all_stats))
        .route("/", get(handlers::dashboard))
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
        .nest(
            "/v2/models/{model}/versions/{version}",
            model_routes.clone(),
        )
        .nest("/v2/models/{model}", model_routes)
        .merge(crate::openai::routes())
        .fallback(handlers::not_found)
        .layer(middleware::from_fn_with_state(
            config.max_body_bytes,
            reject_oversized,
        ))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), gate::gate))
        .with_state(state)
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

/// Refuses a body whose declared `Content-Length` is over the limit before any of it is read, so
/// the client learns at once instead of after uploading. Bodies without a length (chunked) are
/// still cut off at the limit by [`DefaultBodyLimit`].
async fn reject_oversized(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {n} bytes is over the length limit of {limit} bytes"),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Serves `router` on `listener` until `shutdown` completes, with `TCP_NODELAY` on every
/// connection so that small responses are not held back by Nagle's algorithm.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
