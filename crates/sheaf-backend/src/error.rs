//! Errors a backend reports.

/// What went wrong inside a backend. The scheduler maps these onto the request's error kinds.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The model file could not be loaded or is not usable by sheaf.
    #[error("cannot load model: {0}")]
    Load(String),
    /// The inputs given to `infer` do not fit the model.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The runtime failed while running a batch.
    #[error("inference failed: {0}")]
    Runtime(String),
    /// The model cannot serve this request now, and says so; a retry later may succeed.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The runtime library itself is missing or unusable.
    #[error("{0}")]
    Library(String),
    /// Not a failure: the model asks for the request to run again in a later batch, unanswered
    /// for now (Triton's request rescheduling, for iterative sequences). Given only by models
    /// whose configuration allows it, for a request of [`crate::Model::infer_requests`].
    #[error("the model asked for the request to run again in a later batch")]
    Rescheduled,
}
