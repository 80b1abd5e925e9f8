//! ONNX Runtime backend for sheaf.
//!
//! ONNX Runtime is loaded at run time from a shared library (the `ort` crate's `load-dynamic`
//! feature), so the binary builds without it. [`library::locate`] finds the library: an explicit
//! path, then `ORT_DYLIB_PATH`, then the project-local `.venv` that `scripts/setup.sh` fills from
//! the PyPI `onnxruntime` wheel. [`init`] loads it once per process; a process that runs
//! without it ([`unavailable`]) fails each ONNX model's load with the reason. [`OnnxModel`] is one session,
//! owned by one execution thread; its signature is read from the model file. Every session on a
//! device allocates from one arena per device ([`arena`]). On CUDA, each batch size's session has
//! its inputs and outputs bound to host buffers of its own, the inputs pinned ([`staged`]) and a
//! large batch copied into them by several threads ([`gather`]), and
//! output bytes are recycled across batches, so a batch allocates no tensor memory.

mod arena;
mod gather;
pub mod library;
mod model;
mod runtime;
mod staged;

pub use model::{OnnxBackend, OnnxModel, OnnxOptions};
pub use runtime::{init, is_initialized, unavailable};

/// The ONNX Runtime release whose C API the `ort` crate is built against (`api-31`).
pub const ORT_VERSION: &str = "1.31.1";
