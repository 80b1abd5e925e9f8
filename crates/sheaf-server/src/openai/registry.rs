//! The generation models of a repository: every model folder that holds a `.gguf` file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sheaf_llama::{Engine, EngineConfig};

/// Loaded generation models, by name.
#[derive(Default)]
pub struct Generators {
    engines: BTreeMap<String, Arc<Engine>>,
}

impl Generators {
    /// Loads every `DIR/<name>/*.gguf` (or `DIR/<name>/<version>/*.gguf`, the highest version).
    /// A model that fails to load is logged and left out; the others serve.
    pub async fn load_dir(dir: &Path, config: EngineConfig) -> Generators {
        let mut engines = BTreeMap::new();
        for (name, path) in find(dir) {
            let config = config.clone();
            let started = std::time::Instant::now();
            let loaded = tokio::task::spawn_blocking(move || {
                Engine::start(&path, config).map(|e| (e, path))
            })
            .await;
            match loaded {
                Ok(Ok((engine, path))) => {
                    tracing::info!(
                        model = %name,
                        path = %path.display(),
                        context_length = engine.info.context_length,
                        memory_bytes = engine.info.size_bytes,
                        load_ms = started.elapsed().as_millis() as u64,
                        "generation model loaded"
                    );
                    engines.insert(name, engine);
                }
                Ok(Err(e)) => {
                    tracing::error!(model = %name, reason = %e, "generation model failed to load")
                }
                Err(e) => {
                    tracing::error!(model = %name, reason = %e, "generation model failed to load")
                }
            }
        }
        Generators { engines }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Engine>> {
        self.engines.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.engines.keys()
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }
}

/// `(name, gguf file)` of each model folder under `dir` that holds one.
fn find(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let folder = entry.path();
        let Some(name) = folder
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if let Some(file) = sheaf_core::repository::find_gguf(&folder) {
            found.push((name, file));
        }
    }
    found.sort();
    found
}
