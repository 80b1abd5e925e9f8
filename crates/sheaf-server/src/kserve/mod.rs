//! The KServe v2 wire format, converted once for every transport.
//!
//! - [`types`]: the JSON request and response bodies.
//! - [`json_data`]: tensor `data` arrays to and from little-endian bytes, per datatype.
//! - [`codec`]: a whole inference request or response, including the binary tensor data
//!   extension (`Inference-Header-Content-Length`, `binary_data_size`, `binary_data`,
//!   `binary_data_output`).
//! - [`metadata`]: server and model metadata, and Triton-shaped statistics.

pub mod codec;
pub mod json_data;
pub mod metadata;
pub mod types;

/// HTTP header that gives the length of the JSON part of a binary-extension body.
pub const HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";
