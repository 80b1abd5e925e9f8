//! GGUF language models as a sheaf backend: a model folder's `*.gguf` file loads as an
//! [`Engine`], placed on the device the model manager chose.

use std::sync::Arc;

use sheaf_backend::generation::{GenError, GenerationSpec, Generator};
use sheaf_backend::{Backend, BackendError, LoadSpec, Model};

use crate::Engine;

/// The platform name of generation models in model metadata.
pub const PLATFORM: &str = "llama.cpp";

/// Loads GGUF files on llama.cpp.
#[derive(Debug, Default, Clone, Copy)]
pub struct GgufBackend;

impl Backend for GgufBackend {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn model_file(&self) -> &'static str {
        "*.gguf"
    }

    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
        Err(BackendError::Load(format!(
            "{} is a generation model: it takes text, not tensors",
            spec.path.display()
        )))
    }

    fn generates(&self) -> bool {
        true
    }

    fn load_generator(
        &self,
        spec: &LoadSpec,
        generation: &GenerationSpec,
    ) -> Result<Arc<dyn Generator>, BackendError> {
        let engine =
            Engine::start(&spec.path, spec.device, generation.clone()).map_err(|e| match e {
                GenError::Invalid(m) | GenError::Internal(m) => BackendError::Load(m),
                other => BackendError::Load(other.to_string()),
            })?;
        Ok(engine)
    }

    /// The file's size, plus the KV cache the model's `n_ctx` will need is not known before
    /// loading: the file's size stands for both until the load reports.
    fn estimate_memory(&self, path: &std::path::Path) -> Option<u64> {
        std::fs::metadata(path).ok().map(|m| m.len())
    }
}
