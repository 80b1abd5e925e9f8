//! sheaf's protocol layer.
//!
//! - [`kserve`] converts between the KServe v2 / Open Inference Protocol wire format (JSON
//!   tensors and the binary tensor data extension) and the scheduler's request types, once, for
//!   every transport.
//! - [`http`] is the axum server and [`grpc`] the tonic server. Both serve health, metadata,
//!   inference and statistics; each handler extracts, converts with [`kserve`], calls the model
//!   manager, and converts back.
//! - [`openai`] serves generation models on OpenAI-compatible routes.
#![forbid(unsafe_code)]

pub mod grpc;
pub mod http;
pub mod kserve;
pub mod openai;

use std::sync::Arc;

use sheaf_core::ModelManager;

pub use http::{metrics_router, router, serve, HttpConfig};

/// What every HTTP and gRPC handler shares.
#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<ModelManager>,
    /// Generation models (GGUF), served on the OpenAI-compatible `/v1` routes.
    pub generators: Arc<openai::Generators>,
}

impl AppState {
    /// Tensor models only.
    pub fn new(manager: Arc<ModelManager>) -> AppState {
        AppState {
            manager,
            generators: Arc::default(),
        }
    }
}
