//! The process-wide ONNX Runtime environment, loaded once from the located library.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use sheaf_backend::BackendError;

static ENV: OnceLock<Environment> = OnceLock::new();
static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

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
