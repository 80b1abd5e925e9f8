//! The KServe v2 gRPC server (tonic), service `inference.GRPCInferenceService`, with gRPC's
//! health checking protocol beside it ([`health`]) and text-embeddings-inference's `tei.v1`
//! services for the repository's text encoders ([`tei`]).
//!
//! The types are generated at build time from `proto/grpc_service.proto`, which keeps the
//! published package, message and field numbers, so Triton's and KServe's generated clients work
//! against it unchanged. [`serve`] runs the service on a bound listener, through the same
//! connection handling as the HTTP port ([`crate::listen`]), speaking HTTP/2 alone.

pub(crate) mod convert;
mod error;
pub mod health;
mod receiving;
mod sequences;
mod service;
pub mod tei;
mod text;
mod views;

use std::future::Future;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::listen::{serve_connections, ConnectionLimits};

pub use error::status;
pub use service::InferenceService;

/// Generated protocol types and the client and server stubs.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("inference");
}

/// Text-embeddings-inference's generated types and stubs (`tei.v1`), served by [`tei`].
#[allow(clippy::all, missing_docs)]
pub mod tei_pb {
    tonic::include_proto!("tei.v1");
}

use pb::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The largest HTTP/2 frame a client may send. HTTP/2's default, 16 KiB, splits an image-sized
/// tensor (600 KB) into 37 frames, each handled on its own: with 1 MiB frames, requests of that
/// size went from 0.5 to 0.7 of HTTP's throughput (bench/grpc_vs_http.sh). Receive windows grow
/// with the measured bandwidth-delay product (`http2_adaptive_window`), as in gRPC's own
/// implementations, so a distant client is not held to the 64 KiB default either.
pub const MAX_FRAME_BYTES: u32 = 1 << 20;

/// How the gRPC service answers, beside its connections' limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcConfig {
    /// Messages up to this size are accepted and sent (RESOURCE_EXHAUSTED past it).
    pub max_message_bytes: usize,
    /// Whether the inference service's answers are compressed, gzip or deflate as the call's
    /// `grpc-accept-encoding` takes them (and plain when it takes neither): Triton's
    /// `--grpc-infer-response-compression-level` other than `none`. tonic compresses at zlib's
    /// level 6 whatever the level named.
    pub compress_responses: bool,
}

/// Serves gRPC on `listener` until `shutdown` completes, under the default
/// [`ConnectionLimits`]. Messages up to `max_message_bytes` are accepted and sent.
pub async fn serve(
    listener: TcpListener,
    state: crate::AppState,
    max_message_bytes: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(
        listener,
        state,
        GrpcConfig {
            max_message_bytes,
            compress_responses: false,
        },
        ConnectionLimits::default(),
        None,
        shutdown,
    )
    .await
}

/// As [`serve`], as `config` says, with at most `limits.max_connections` connections open at
/// once, over TLS when `tls` is given (ALPN `h2`). Once the state's drain is announced, each
/// connection gets a GOAWAY (see [`crate::listen`]).
pub async fn serve_with(
    listener: TcpListener,
    state: crate::AppState,
    config: GrpcConfig,
    limits: ConnectionLimits,
    tls: Option<crate::tls::HttpTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let drain = state.drain.clone();
    let receiving = receiving::Limits {
        memory: state.request_memory.clone(),
        max_message_bytes: config.max_message_bytes,
    };
    let health = health::HealthServer::new(health::HealthService::new(state.clone()));
    // Calls compressed as tritonclient's `compression_algorithm` sends them are inflated, no
    // larger than the message limit (RESOURCE_EXHAUSTED past it).
    let tei = tei::TeiService::new(state.clone());
    let mut service = GrpcInferenceServiceServer::new(InferenceService::new(state))
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Deflate)
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    if config.compress_responses {
        service = service
            .send_compressed(tonic::codec::CompressionEncoding::Gzip)
            .send_compressed(tonic::codec::CompressionEncoding::Deflate);
    }
    let max = config.max_message_bytes;
    let routes = tonic::service::Routes::new(service)
        .add_service(health)
        .add_service(
            tei_pb::info_server::InfoServer::new(tei.clone()).max_encoding_message_size(max),
        )
        .add_service(
            tei_pb::embed_server::EmbedServer::new(tei.clone())
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            tei_pb::rerank_server::RerankServer::new(tei.clone())
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            tei_pb::tokenize_server::TokenizeServer::new(tei.clone())
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(tei_pb::predict_server::PredictServer::new(tei))
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            receiving,
            receiving::hold_while_receiving,
        ))
        .layer(axum::middleware::map_response(size_status))
        .layer(axum::middleware::from_fn(crate::stages::account));
    let mut builder = auto::Builder::new(TokioExecutor::new()).http2_only();
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_frame_size(MAX_FRAME_BYTES)
        .adaptive_window(true)
        // As tonic's own server: as many concurrent calls on a connection as the client opens.
        .max_concurrent_streams(None);
    if let Some(keepalive) = limits.keepalive {
        keepalive.apply(&mut builder.http2());
    }
    serve_connections(listener, routes, builder, limits, tls, drain, shutdown).await;
    Ok(())
}

/// tonic answers a message over the size limit with OUT_OF_RANGE; gRPC's own servers, and
/// sheaf's documentation, use RESOURCE_EXHAUSTED, which is what clients retry on or report.
async fn size_status(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    let too_large = headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() == b"11")
        && headers
            .get("grpc-message")
            .is_some_and(|m| contains(m.as_bytes(), b"message%20length%20too%20large"));
    if too_large {
        let detail = headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .unwrap_or("")
            // tonic percent-encodes the spaces of this message, and nothing else in it.
            .replace("%20", " ");
        headers.insert("grpc-status", axum::http::HeaderValue::from_static("8"));
        let message =
            format!("the message is over the server's size limit (--max-body-bytes): {detail}");
        if let Ok(value) = axum::http::HeaderValue::from_str(&message) {
            headers.insert("grpc-message", value);
        }
    }
    response
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
