//! The one mapping from [`ErrorKind`] to gRPC status codes.

use sheaf_core::{ErrorKind, InferError};
use tonic::{Code, Status};

/// Converts a request error into the status a gRPC client sees, keeping the message.
pub fn status(e: InferError) -> Status {
    let code = match e.kind {
        ErrorKind::InvalidInput | ErrorKind::ContextExceeded => Code::InvalidArgument,
        ErrorKind::ModelNotFound => Code::NotFound,
        ErrorKind::NotReady => Code::Unavailable,
        ErrorKind::Overloaded => Code::ResourceExhausted,
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::Conflict => Code::AlreadyExists,
    };
    if code == Code::Internal {
        tracing::error!(error = %e.message, "gRPC request failed");
    }
    Status::new(
        code,
        sheaf_core::clip_to(&e.message, sheaf_core::MESSAGE_CHARS),
    )
}
