//! The KServe v2 gRPC server (tonic), service `inference.GRPCInferenceService`.
//!
//! The types are generated at build time from `proto/grpc_service.proto`, which keeps the
//! published package, message and field numbers, so Triton's and KServe's generated clients work
//! against it unchanged. [`serve`] runs the service on a bound listener.

mod convert;
mod error;
mod service;

use std::future::Future;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

pub use error::status;
pub use service::InferenceService;

/// Generated protocol types and the client and server stubs.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("inference");
}

use pb::grpc_inference_service_server::GrpcInferenceServiceServer;

/// Serves gRPC on `listener` until `shutdown` completes. Messages up to `max_message_bytes`
/// are accepted and sent. Connections use `TCP_NODELAY`: without it, small responses wait out
/// Nagle's algorithm against the client's delayed ACK (about 40 ms).
pub async fn serve(
    listener: TcpListener,
    state: crate::AppState,
    max_message_bytes: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let service = GrpcInferenceServiceServer::new(InferenceService::new(state))
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    let v = std::env::var("SHEAF_GRPC_EXP").unwrap_or_default();
    let mut b = tonic::transport::Server::builder();
    if v.contains("adaptive") {
        b = b.http2_adaptive_window(Some(true));
    }
    if v.contains("big") {
        b = b
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20));
    }
    if v.contains("frame") {
        b = b.max_frame_size(Some(1 << 20));
    }
    b.add_service(service)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
