//! The process-wide ONNX Runtime environment, loaded once from the located library.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use sheaf_backend::BackendError;

static ENV: OnceLock<Environment> = OnceLock::new();
static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());
/// Why the runtime is not loaded, when the server started without it (see [`unavailable`]).
static MISSING: OnceLock<String> = OnceLock::new();

/// Loads ONNX Runtime from `library` (see [`crate::library::locate`]) and creates the process's
/// environment. Later calls return at once; the first successful library wins.
pub fn init(library: &Path) -> Result<(), BackendError> {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    if ENV.get().is_some() {
        return Ok(());
    }
    let env = ort::init_from(library)
        .map_err(|e| {
            BackendError::Library(format!(
                "cannot load ONNX Runtime from {}: {e} (sheaf needs ONNX Runtime {})",
                library.display(),
                crate::ORT_VERSION
            ))
        })?
        .with_name("sheaf")
        .with_telemetry(false)
        .build();
    let env = env.map_err(|e| BackendError::Library(format!("cannot start ONNX Runtime: {e}")))?;
    let _ = ENV.set(env);
    let _ = LIBRARY.set(library.to_path_buf());
    Ok(())
}

/// Records that this process runs without ONNX Runtime, and why: a server whose models are all
/// Python or GGUF needs no ONNX Runtime, and an ONNX model that loads then fails with `reason`.
pub fn unavailable(reason: String) {
    let _ = MISSING.set(reason);
}

/// Ok once [`init`] has succeeded; else the error an ONNX model's load gets (never a panic in
/// the `ort` crate's own attempt to find a library).
pub(crate) fn ready() -> Result<(), BackendError> {
    if ENV.get().is_some() {
        return Ok(());
    }
    Err(BackendError::Library(format!(
        "ONNX Runtime is not loaded, so ONNX models cannot load: {}",
        MISSING
            .get()
            .map_or("the process did not load it", String::as_str)
    )))
}

/// True once [`init`] has succeeded.
pub fn is_initialized() -> bool {
    ENV.get().is_some()
}

/// Before the first CUDA session: the CUDA libraries installed beside the loaded ONNX Runtime
/// (see [`crate::library::preload_cuda`]).
pub(crate) fn prepare_cuda() {
    if let Some(library) = LIBRARY.get() {
        crate::library::preload_cuda(library);
    }
}

pub(crate) fn environment() -> Result<&'static Environment, BackendError> {
    ENV.get().ok_or_else(|| {
        BackendError::Library("ONNX Runtime is not initialised: call sheaf_onnx::init first".into())
    })
}
