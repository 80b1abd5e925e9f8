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

/// The largest HTTP/2 frame a client may send. HTTP/2's default, 16 KiB, splits an image-sized
/// tensor (600 KB) into 37 frames, each handled on its own: with 1 MiB frames, requests of that
/// size went from 0.5 to 0.7 of HTTP's throughput (bench/grpc_vs_http.sh). Receive windows grow
/// with the measured bandwidth-delay product (`http2_adaptive_window`), as in gRPC's own
/// implementations, so a distant client is not held to the 64 KiB default either.
pub const MAX_FRAME_BYTES: u32 = 1 << 20;

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
    tonic::transport::Server::builder()
        .max_frame_size(Some(MAX_FRAME_BYTES))
        .http2_adaptive_window(Some(true))
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
