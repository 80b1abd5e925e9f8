//! sheaf's protocol layer.
//!
//! - [`kserve`] converts between the KServe v2 / Open Inference Protocol wire format (JSON
//!   tensors and the binary tensor data extension) and the scheduler's request types, once, for
//!   every transport.
//! - [`http`] is the axum server and [`grpc`] the tonic server. Both serve health, metadata,
//!   inference and statistics; each handler extracts, converts with [`kserve`], calls the model
//!   manager, and converts back.
//! - [`openai`] serves generation models on OpenAI-compatible routes, and text encoders on
//!   `/v1/embeddings`; [`tei`] serves text encoders on text-embeddings-inference's `/embed`.
//! - [`listen`] accepts connections under limits (count, header and body time), and [`tls`]
//!   reads the certificates that put every port behind TLS.
//! - [`access`] says which key each route needs, and [`drain`] refuses new work and waits for
//!   the work already admitted when the server shuts down.
#![forbid(unsafe_code)]

pub mod access;
pub mod drain;
#[cfg(test)]
mod fuzz;
pub mod grpc;
pub mod http;
pub mod kserve;
pub mod listen;
pub mod openai;
pub mod tei;
pub mod tls;

use std::sync::Arc;

use sheaf_core::{ErrorKind, InferError, ModelHandle, ModelManager};

pub use access::AccessConfig;
pub use drain::Drain;
pub use http::{metrics_router, router, serve, serve_with, HttpConfig};
pub use listen::ConnectionLimits;
pub use tls::TlsFiles;

/// What every HTTP and gRPC handler shares.
#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<ModelManager>,
    /// Generation models (GGUF), served on the OpenAI-compatible `/v1` routes.
    pub generators: Arc<openai::Generators>,
    /// The keys each scope needs.
    pub access: Arc<AccessConfig>,
    /// Admission of new work, refused once a shutdown began.
    pub drain: Arc<Drain>,
}

impl AppState {
    /// Tensor models only, no keys.
    pub fn new(manager: Arc<ModelManager>) -> AppState {
        AppState::with_generators(manager, Arc::default())
    }

    /// Tensor and generation models, no keys.
    pub fn with_generators(
        manager: Arc<ModelManager>,
        generators: Arc<openai::Generators>,
    ) -> AppState {
        AppState {
            manager,
            generators,
            access: Arc::default(),
            drain: Arc::default(),
        }
    }

    /// The same state, taking the keys of `access`.
    pub fn with_access(mut self, access: AccessConfig) -> AppState {
        self.access = Arc::new(access);
        self
    }

    /// Readiness over every protocol: the repository's start-up loads have ended and no
    /// shutdown has begun.
    pub fn is_ready(&self) -> bool {
        self.manager.is_ready() && !self.drain.is_draining()
    }

    /// The tensor model `name` for inference, loading it on demand. A generation model is
    /// refused with a pointer to the routes that serve it.
    pub async fn tensor_model(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<ModelHandle>, InferError> {
        match self.manager.get_or_load(name, version).await {
            Err(e) if e.kind == ErrorKind::ModelNotFound && self.generators.knows(name) => {
                Err(InferError::invalid(format!(
                    "model '{name}' is a generation model, which takes text rather than tensors: \
                     use POST /v1/chat/completions or /v1/completions"
                )))
            }
            found => found,
        }
    }

    /// The repository API's load, for both kinds of model: a generation model starts its
    /// engine, any other goes through the model manager. The control mode applies to both.
    pub async fn load(&self, name: &str) -> Result<(), InferError> {
        if self.generators.knows(name) {
            self.manager.check_control()?;
            return self.generators.load(name).await;
        }
        self.manager.load(name).await.map(|_| ())
    }

    /// The repository API's unload, for both kinds of model; it answers once the model's
    /// running requests are done.
    pub async fn unload(&self, name: &str) -> Result<(), InferError> {
        if self.generators.knows(name) {
            self.manager.check_control()?;
            return self.generators.unload(name).await;
        }
        self.manager.unload(name).await
    }
}
