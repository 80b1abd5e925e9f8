//! The backend contract of sheaf.
//!
//! This crate holds what every backend and the scheduler agree on, and nothing else: the element
//! types ([`DataType`]), a tensor whose bytes are shared without copying ([`Tensor`]), a model's
//! signature ([`Signature`]), the synchronous [`Model`] trait that one execution thread drives, and
//! [`BackendError`]. It has no async runtime: backends are blocking code that runs on threads the
//! scheduler owns.
#![forbid(unsafe_code)]

mod dtype;
mod error;
mod model;
mod tensor;

pub use dtype::DataType;
pub use error::BackendError;
pub use model::{
    ArenaExtendStrategy, Backend, ConvAlgoSearch, CudaOptions, Device, LoadSpec, Model, Signature,
    TensorSpec,
};
pub use tensor::Tensor;
