//! sheaf's scheduler: everything between a decoded protocol request and a backend call.
//!
//! The path a request takes through this crate:
//! [`ModelManager::get`] finds the model, [`ModelHandle::infer`] validates the request against the
//! model's signature ([`request::validate`]), gives tensors the config reshapes the model's
//! shape ([`reshape`]) and hands it to the model's [`batcher`], which merges the items of
//! concurrent requests into batches along dimension 0 (a ragged input's elements in one
//! dimension, with the batch inputs that say where each request's are: [`ragged`]) and passes
//! each batch to an execution thread that owns the loaded model. Outputs are sliced back per
//! request and reassembled in order. A text encoder's requests take the same path, one item per text, after
//! [`ModelHandle::embed`] has tokenised them ([`embed`]). A generation model (a language model)
//! is managed the same way, but its engine batches its requests itself, token by token
//! ([`generate`]). A stateful model's requests name their sequence, and go to the instance that
//! holds its state, with the control inputs and state filled in ([`sequence`]); a repeated
//! request of a model that opts in is answered from the response cache ([`cache`]) before it
//! reaches the queue. Under `--rate-limit execution_count`, an instance of a model that declares
//! resources runs a batch only while it holds them ([`rate_limit`]). Each answer carries its account of where the request's time went
//! ([`stages`]), which the protocol that writes it closes, writing a sampled request's trace
//! ([`trace`]). No protocol type (axum, tonic) appears here, and no backend type beyond the
//! `sheaf-backend` contract. A request's parameters are kept in KServe's JSON form, and read with
//! one set of rules ([`json_parameters`]) for HTTP bodies and for the requests models send of
//! their own.
#![forbid(unsafe_code)]

pub mod batcher;
pub mod cache;
pub mod config;
mod custom_metrics;
pub mod embed;
mod error;
pub mod frames;
pub mod generate;
pub mod grouped_config;
mod host_memory;
pub mod image;
pub mod json_parameters;
mod manager;
pub mod metrics;
mod model;
pub mod model_json;
pub mod pbtxt;
pub mod pipeline;
pub mod ragged;
pub mod rate_limit;
pub mod repository;
pub mod request;
pub mod reshape;
pub mod sequence;
pub mod server_config;
pub mod stages;
pub mod stats;
pub mod summary;
pub mod trace;
mod triton_metrics;
pub mod uploaded;
pub mod warmup;

pub use config::ModelConfig;
pub use embed::{EmbedInput, EmbedRequest, Embeddings};
pub use error::{clip, clip_to, ErrorKind, InferError, MESSAGE_CHARS};
pub use generate::Generate;
pub use host_memory::available_memory;
pub use manager::{
    caller, ControlMode, DefaultBatchSizes, DeviceUsage, MemorySource, ModelInfo, ModelManager,
    ModelMetadata, ModelState, ModelStatistics, ModelStatus, Readiness,
};
pub use model::{Lane, ModelHandle};
pub use request::{
    model_parameters, ByteTensor, InferRequest, InferResponse, NamedTensor, Parameters, RawRequest,
    SequenceFlags, SequenceId,
};
pub use server_config::{AssignmentStrategy, EvictionPolicy, ListedModel, Routing, ServerConfig};
pub use stats::StatsSnapshot;
