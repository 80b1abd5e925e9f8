//! sheaf's protocol layer.
//!
//! - [`kserve`] converts between the KServe v2 / Open Inference Protocol wire format (JSON
//!   tensors and the binary tensor data extension) and the scheduler's request types, once, for
//!   every transport.
//! - [`http`] is the axum server and [`grpc`] the tonic server. Both serve health, metadata,
//!   inference and statistics; each handler extracts, converts with [`kserve`], calls the model
//!   manager, and converts back.
//! - [`openai`] serves generation models on OpenAI-compatible routes, and text encoders on
//!   `/v1/embeddings` and vLLM's `/score` and `/rerank`, and keeps the Responses API's answers for `previous_response_id` and
//!   the Conversations API's conversations;
//!   [`tei`] serves text encoders on text-embeddings-inference's `/embed`, `/similarity`,
//!   `/tokenize` and `/decode`, and at `POST /` as TEI does; [`triton_text`] reads and answers
//!   the requests of Triton's vLLM backend for a generation model, which the generate routes
//!   render as JSON and gRPC as tensors.
//!   Every model, whatever its kind, comes from the one model manager; this crate knows no
//!   backend or engine.
//! - [`listen`] accepts connections under limits (count, header and body time), and [`tls`]
//!   reads the certificates that put every port behind TLS.
//! - [`shm`] holds the system shared-memory regions clients register, whose bytes inputs and
//!   outputs may name instead of carrying them.
//! - [`broker`] puts many instances behind one NATS JetStream queue: workers pull the requests
//!   of the models they serve, and any instance forwards those of models it does not serve.
//! - [`error`] is the HTTP routes' one error vocabulary: the status of each error kind, rendered
//!   in KServe's body or OpenAI's; the embedding routes read their texts, and find the encoder a
//!   request names, alike ([`texts`]).
//! - [`stages`] closes each answer's account of where its time went once it is written, and
//!   [`trace`] samples answers for the request traces of Triton's trace extension, which the
//!   same account records ([`sheaf_core::trace`]).
//! - [`access`] says which key each route needs, [`restricted`] which header Triton's restricted
//!   API groups add, [`http::Cors`] which origins' web pages may call the HTTP port, and
//!   [`drain`] refuses new work and waits for the work already admitted when the server shuts
//!   down; [`request_memory`] bounds the bytes of requests held at once.
//! - [`logging`] holds the log settings that Triton's logging extension reads and changes
//!   (and the file the lines go to), and [`forward`] the headers handed to models as request
//!   parameters.
#![forbid(unsafe_code)]

pub mod access;
pub mod broker;
pub mod drain;
pub mod durable;
pub mod error;
pub mod forward;
#[cfg(test)]
mod fuzz;
pub mod grpc;
pub mod http;
pub mod kserve;
pub mod listen;
pub mod logging;
pub mod openai;
pub mod request_memory;
pub mod restricted;
pub mod shm;
pub mod stages;
pub mod tei;
pub mod texts;
pub mod tls;
pub mod trace;
pub mod triton_text;

use std::sync::Arc;

use sheaf_core::ModelManager;

pub use access::AccessConfig;
pub use drain::Drain;
pub use http::{
    metrics_router, router, sagemaker_router, serve, serve_with, vertex_router, Cors, HttpConfig,
};
pub use listen::{ConnectionLimits, Keepalive};
pub use tls::TlsFiles;

/// What every HTTP and gRPC handler shares: one reference-counted [`Shared`], so that the clone
/// each request's extractors and middleware take is one counter, not one per part.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The server's name in its metadata when `--id` gives none.
pub const DEFAULT_ID: &str = "sheaf";

/// The parts of [`AppState`].
#[derive(Clone)]
pub struct Shared {
    /// Every model, whatever its kind: tensor models, text encoders and generation models.
    pub manager: Arc<ModelManager>,
    /// The keys each scope needs.
    pub access: Arc<AccessConfig>,
    /// Admission of new work, refused once a shutdown began.
    pub drain: Arc<Drain>,
    /// The bytes of requests held now, and the most that may be (`--max-request-memory`).
    pub request_memory: Arc<request_memory::RequestMemory>,
    /// The system shared-memory regions clients have registered.
    pub shm: Arc<shm::SharedMemory>,
    /// The queue, when this instance is one of many behind it: requests for models it does not
    /// serve are forwarded there.
    pub broker: Option<Arc<broker::Broker>>,
    /// Request traces: their settings, sampling and output (Triton's trace extension).
    pub traces: Arc<sheaf_core::trace::Tracer>,
    /// The headers forwarded to models as request parameters, over HTTP and over gRPC
    /// (`--http-header-forward-pattern`, `--grpc-header-forward-pattern`); none: no header is.
    pub forward_http: Option<forward::Pattern>,
    pub forward_grpc: Option<forward::Pattern>,
    /// The name server metadata gives (`GET /v2`, gRPC `ServerMetadata`): `sheaf`, or the
    /// one `--id` sets, as Triton's `--id` sets its own.
    pub id: Arc<str>,
    /// The answers of `/v1/responses` kept for `previous_response_id`.
    pub responses: Arc<openai::store::ResponseStore>,
    /// The conversations of `/v1/conversations`, which responses are made in.
    pub conversations: Arc<openai::conversation_store::ConversationStore>,
    /// The files of `/v1/files`: batch files and their answers.
    pub files: Arc<openai::batch::files::FileStore>,
    /// The batches of `/v1/batches`.
    pub batches: Arc<openai::batch::runs::BatchStore>,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// The manager's models, no keys.
    pub fn new(manager: Arc<ModelManager>) -> AppState {
        AppState(Arc::new(Shared {
            manager,
            access: Arc::default(),
            drain: Arc::default(),
            request_memory: Arc::default(),
            shm: Arc::default(),
            broker: None,
            traces: Arc::default(),
            id: Arc::from(DEFAULT_ID),
            forward_http: None,
            forward_grpc: None,
            responses: Arc::default(),
            conversations: Arc::default(),
            files: Arc::default(),
            batches: Arc::default(),
        }))
    }

    /// The same state, keeping `/v1/files` in `dir` (none: a temporary folder made at the first
    /// upload), at most `bytes` of them (0: none; the Files and Batch APIs are refused). In a
    /// folder given, the files and batches an earlier server left there are read back (the
    /// batches it had not ended go on at [`openai::batch::runs::resume`]).
    pub fn with_files(
        mut self,
        dir: Option<std::path::PathBuf>,
        bytes: u64,
    ) -> std::io::Result<AppState> {
        use openai::batch::{files::FileStore, runs::BatchStore};
        let shared = Arc::make_mut(&mut self.0);
        match dir {
            Some(dir) => {
                shared.files = Arc::new(FileStore::open(dir.clone(), bytes)?);
                shared.batches = Arc::new(BatchStore::open(dir)?);
            }
            None => shared.files = Arc::new(FileStore::new(None, bytes)),
        }
        Ok(self)
    }

    /// The same state, keeping at most `bytes` of `/v1/responses` answers, and as many again
    /// of `/v1/conversations` (0: none).
    pub fn with_response_store(mut self, bytes: usize) -> AppState {
        let shared = Arc::make_mut(&mut self.0);
        shared.responses = Arc::new(openai::store::ResponseStore::new(bytes));
        shared.conversations = Arc::new(openai::conversation_store::ConversationStore::new(bytes));
        self
    }

    /// The same state, forwarding the headers `http` matches on HTTP requests and the
    /// metadata `grpc` matches on gRPC calls to models as request parameters.
    pub fn with_header_forwarding(
        mut self,
        http: Option<forward::Pattern>,
        grpc: Option<forward::Pattern>,
    ) -> AppState {
        let shared = Arc::make_mut(&mut self.0);
        shared.forward_http = http;
        shared.forward_grpc = grpc;
        self
    }

    /// The same state, holding at most `bytes` of requests in memory at once.
    pub fn with_request_memory(mut self, bytes: usize) -> AppState {
        Arc::make_mut(&mut self.0).request_memory =
            Arc::new(request_memory::RequestMemory::new(bytes));
        self
    }

    /// The same state, naming the server `id` in its metadata.
    pub fn with_id(mut self, id: &str) -> AppState {
        Arc::make_mut(&mut self.0).id = Arc::from(id);
        self
    }

    /// The same state, taking the keys of `access`.
    pub fn with_access(mut self, access: AccessConfig) -> AppState {
        Arc::make_mut(&mut self.0).access = Arc::new(access);
        self
    }

    /// The same state, forwarding requests for models it does not serve to `broker`.
    pub fn with_broker(mut self, broker: Arc<broker::Broker>) -> AppState {
        Arc::make_mut(&mut self.0).broker = Some(broker);
        self
    }

    /// The same state, tracing requests with `traces`.
    pub fn with_traces(mut self, traces: Arc<sheaf_core::trace::Tracer>) -> AppState {
        Arc::make_mut(&mut self.0).traces = traces;
        self
    }

    /// Readiness over every protocol: the repository's start-up loads have ended and no
    /// shutdown has begun.
    pub fn is_ready(&self) -> bool {
        self.manager.is_ready() && !self.drain.is_draining()
    }

    /// What the readiness routes answer: [`AppState::is_ready`], and under strict readiness
    /// each loaded model's instances' own word as well
    /// ([`sheaf_core::ModelManager::is_ready_checked`]).
    pub async fn ready_checked(&self) -> bool {
        !self.drain.is_draining() && self.manager.is_ready_checked().await
    }
}
