//! The backend contract of sheaf.
//!
//! This crate holds what every backend and the scheduler agree on, and nothing else: the element
//! types ([`DataType`]), a tensor whose bytes are shared without copying ([`Tensor`]), a model's
//! signature ([`Signature`]), the synchronous [`Model`] trait that one execution thread drives
//! (a batch as one tensor per input, or as its requests, each answered on its own and
//! described by a [`RequestInfo`]), an instance's own word on whether it can serve now
//! ([`ReadyCheck`]), [`BackendError`], and [`Pooled`], which turns any encoder's token states into sentence
//! embeddings; the [`generation`] contract, for language models whose engine batches
//! sequences token by token; [`ModelCaller`], the way back into the server for models that run
//! other models (Triton's BLS); [`custom_metrics`], the metrics models define themselves; [`threads`], the registry of the threads that own models, which
//! a process waits on before it exits; and [`yaml`], how the server's and the backends' YAML
//! files are read. It has no async runtime: backends are blocking code that runs on
//! threads the scheduler owns.
#![forbid(unsafe_code)]

pub mod affinity;
mod caller;
pub mod custom_metrics;
mod dtype;
mod error;
pub mod generation;
mod model;
mod pool;
mod tensor;
pub mod threads;
pub mod yaml;

pub use caller::{
    Call, Callback, Called, ModelCaller, Named, StreamCancel, StreamSink, TraceCalls, CANCELLED,
};
pub use custom_metrics::CustomMetrics;
pub use dtype::DataType;
pub use error::BackendError;
pub use model::{
    Answer, ArenaExtendStrategy, Backend, ConvAlgoSearch, CorrelationId, CudaOptions, Device,
    GraphOptimization, GraphOptions, LoadSpec, Model, ReadyCheck, RequestInfo, ResponseStream,
    Signature, TensorSpec,
};
pub use pool::{
    normalize, pool, PoolSpec, Pooled, PooledBackend, Pooling, EMBEDDING_OUTPUT,
    TOKEN_STATES_OUTPUT,
};
pub use tensor::Tensor;
