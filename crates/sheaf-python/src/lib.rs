//! Python backend for sheaf: models written in Python, batched and scheduled like any other.
//!
//! A model folder holds `model.py` (in `DIR/<name>/` or a version folder) and a `config.pbtxt`
//! or `config.yaml` that declares its inputs and outputs. Two APIs are served:
//! - **Triton's Python model API**: `class TritonPythonModel` with `initialize(args)`,
//!   `execute(requests)` and `finalize()`, `import triton_python_backend_utils as pb_utils`
//!   (served from this crate's `python/` folder). `execute` gets the requests the batcher put
//!   together and answers each on its own ([`sheaf_backend::Model::infer_requests`]), so one
//!   request's error fails that request alone.
//!   A decoupled model (`model_transaction_policy { decoupled: true }`) sends any number of
//!   responses per request through `request.get_response_sender()`; each crosses as it is sent
//!   ([`sheaf_backend::Model::infer_streaming`]) and reaches the client on a gRPC stream or as
//!   server-sent events. As under Triton, the instance takes its next batch once `execute`
//!   returns, while the model's own threads still answer the earlier requests. `pb_utils.InferenceRequest(...).exec()` sends a request of the model's
//!   own to any model of the server (business logic scripting), through the server's
//!   [`sheaf_backend::ModelCaller`]; a stream it reads may be cancelled (`cancel()`), and one
//!   sent with `trace=request.trace()` is traced under that request ([`traced`]). A model
//!   configured as an iterative sequence may ask for a request to run again in a later batch
//!   (`RELEASE_RESCHEDULE`): the answer says so ([`sheaf_backend::BackendError::Rescheduled`],
//!   or [`sheaf_backend::ResponseStream::reschedule`] for a decoupled model) and the server
//!   queues it again.
//! - **sheaf's batched API**: `def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`
//!   and an optional `load(config)`. The batcher has already concatenated the requests along the
//!   batch axis, and slices the answer back.
//!
//! In both, a tensor is a NumPy array of its type: BYTES an object array of `bytes`, and BF16
//! (which NumPy has no type for) an array of `ml_dtypes`' `bfloat16`, which `to_dlpack()` hands
//! to PyTorch as bfloat16.
//!
//! Each instance is its own interpreter process ([`worker`]), so the GIL never serialises two
//! instances. Tensors cross through shared-memory files per process ([`region`]); a short
//! JSON message over a pipe says where each tensor lies ([`batch_message`]). The metrics a model defines
//! (`pb_utils.MetricFamily`) come over a Unix socket of the process's own ([`metrics`]) into
//! the backend's [`sheaf_backend::CustomMetrics`], which the server's `/metrics` shows. A
//! process that dies or runs past the model's execution timeout (a batch, or a request it still
//! streams) fails the requests it held and is started again at once, as is one that ends while
//! idle ([`processes`]); the server and the other instances keep serving. The instance is not
//! ready from the loss until its new process has loaded, nor while the model's own
//! `is_ready()` says no ([`ready`]: asked on a socket of its own, answered while batches run).
//! Dropping the model calls `finalize` and ends the process.
//! The interpreter is the model's `python:` setting, else the interpreter of the environment
//! its `EXECUTION_ENV_PATH` parameter names (a folder, or one packed by conda-pack:
//! [`environment`]), else the server's `--python`, else the `.venv` above the server or the
//! working directory, else `python3` ([`interpreter`]).

mod answers;
mod batch_message;
pub mod environment;
pub mod interpreter;
mod metrics;
mod model;
mod processes;
mod ready;
mod region;
mod traced;
mod worker;

pub use model::{PythonBackend, PythonModel};
