//! sheaf's protocol layer.
//!
//! - [`kserve`] converts between the KServe v2 / Open Inference Protocol wire format (JSON
//!   tensors and the binary tensor data extension) and the scheduler's request types, once, for
//!   every transport.
//! - [`http`] is the axum server: health, metadata, inference and statistics endpoints. Each
//!   handler extracts, converts with [`kserve`], calls the model manager, and converts back.
#![forbid(unsafe_code)]

pub mod http;
pub mod kserve;

pub use http::{router, serve, AppState, HttpConfig};
