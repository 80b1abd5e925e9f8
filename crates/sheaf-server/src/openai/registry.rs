//! The generation models of a repository: every model folder that holds a `.gguf` file, with an
//! optional `config.yaml` of engine sizes (`n_ctx`, `max_seqs`, `max_batch_tokens`,
//! `max_waiting`, `prefix_slots`, `threads`). It loads and unloads their engines, and books
//! their memory in the model manager's ledger.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sheaf_core::{ErrorKind, InferError, ModelManager};
use sheaf_llama::{Engine, EngineConfig};

/// A generation model of the repository.
enum Slot {
    Ready(Arc<Engine>),
    /// Not loaded: unloaded, or its load failed (the reason says which).
    Unavailable(String),
}

/// What the repository index shows of a generation model.
pub struct GenInfo {
    pub name: String,
    /// READY or UNAVAILABLE.
    pub state: &'static str,
    pub reason: Option<String>,
    /// Where its memory is booked.
    pub devices: Vec<String>,
}

/// The repository's generation models, by name. They load at start; the repository API can
/// unload and load them again. Their memory (weights and KV cache) is booked in the model
/// manager's ledger while they are loaded.
#[derive(Default)]
pub struct Generators {
    dir: Option<PathBuf>,
    manager: Option<Arc<ModelManager>>,
    /// Engine sizes for models without a `config.yaml`.
    defaults: EngineConfig,
    models: RwLock<BTreeMap<String, Slot>>,
    /// Held while a model loads, so that concurrent loads of one model start one engine.
    loading: tokio::sync::Mutex<()>,
}

impl Generators {
    /// Loads every `DIR/<name>/*.gguf` (or `DIR/<name>/<version>/*.gguf`, the highest version).
    /// A model that fails to load is logged and reported with its reason; the others serve.
    pub async fn load_dir(
        dir: &Path,
        defaults: EngineConfig,
        manager: Arc<ModelManager>,
    ) -> Generators {
        let generators = Generators {
            dir: Some(dir.to_path_buf()),
            manager: Some(manager),
            defaults,
            models: RwLock::default(),
            loading: tokio::sync::Mutex::default(),
        };
        for (name, path) in find(dir) {
            let slot = match generators.start(&name, path).await {
                Ok(engine) => Slot::Ready(engine),
                Err(reason) => Slot::Unavailable(reason),
            };
            generators.write().insert(name, slot);
        }
        generators
    }

    /// Starts the engine of `name` from the GGUF file at `path`, with its memory booked: the
    /// file's size before the load, then what the engine holds.
    async fn start(&self, name: &str, path: PathBuf) -> Result<Arc<Engine>, String> {
        let estimate = std::fs::metadata(&path).map_or(0, |m| m.len());
        let started: Result<Arc<Engine>, String> = async {
            self.book(name, estimate)?;
            let engine = self.start_engine(name, path).await?;
            self.book(name, engine.info.memory_bytes())?;
            Ok(engine)
        }
        .await;
        if let Err(reason) = &started {
            self.release(name);
            tracing::error!(model = %name, %reason, "generation model failed to load");
        }
        started
    }

    fn book(&self, name: &str, bytes: u64) -> Result<(), String> {
        match &self.manager {
            Some(manager) => manager.book(name, bytes).map_err(|e| e.message),
            None => Ok(()),
        }
    }

    fn release(&self, name: &str) {
        if let Some(manager) = &self.manager {
            manager.release(name);
        }
    }

    /// Starts the engine, sized by the model's `config.yaml` when it has one.
    async fn start_engine(&self, name: &str, path: PathBuf) -> Result<Arc<Engine>, String> {
        let folder = self.dir.as_deref().unwrap_or(Path::new(".")).join(name);
        let file = folder.join(sheaf_core::repository::CONFIG_FILE);
        let config = match std::fs::read_to_string(&file) {
            Ok(text) => serde_yaml::from_str::<EngineConfig>(&text)
                .map_err(|e| format!("{}: {e}", file.display())),
            Err(_) => Ok(self.defaults.clone()),
        };
        let started = std::time::Instant::now();
        let loaded = match config {
            Ok(config) => tokio::task::spawn_blocking(move || {
                Engine::start(&path, config)
                    .map(|e| (e, path))
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(format!("the loader stopped: {e}"))),
            Err(e) => Err(e),
        };
        let (engine, path) = loaded?;
        tracing::info!(
            model = %name,
            path = %path.display(),
            context_length = engine.info.context_length,
            memory_bytes = engine.info.memory_bytes(),
            load_ms = started.elapsed().as_millis() as u64,
            "generation model loaded"
        );
        Ok(engine)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Slot>> {
        self.models.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Slot>> {
        self.models.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The engine of a loaded model.
    pub fn get(&self, name: &str) -> Option<Arc<Engine>> {
        match self.read().get(name) {
            Some(Slot::Ready(engine)) => Some(engine.clone()),
            _ => None,
        }
    }

    /// Loaded models, by name.
    pub fn names(&self) -> Vec<String> {
        self.ready().into_iter().map(|(name, _)| name).collect()
    }

    pub(super) fn ready(&self) -> Vec<(String, Arc<Engine>)> {
        self.read()
            .iter()
            .filter_map(|(name, slot)| match slot {
                Slot::Ready(engine) => Some((name.clone(), engine.clone())),
                Slot::Unavailable(_) => None,
            })
            .collect()
    }

    /// Whether any model is loaded.
    pub fn is_empty(&self) -> bool {
        !self.read().values().any(|s| matches!(s, Slot::Ready(_)))
    }

    /// Every generation model with its state, for the repository index.
    pub fn infos(&self) -> Vec<GenInfo> {
        self.read()
            .iter()
            .map(|(name, slot)| match slot {
                Slot::Ready(_) => GenInfo {
                    name: name.clone(),
                    state: "READY",
                    reason: None,
                    devices: self
                        .manager
                        .as_ref()
                        .map(|m| m.booked_devices(name))
                        .unwrap_or_default(),
                },
                Slot::Unavailable(reason) => GenInfo {
                    name: name.clone(),
                    state: "UNAVAILABLE",
                    reason: Some(reason.clone()),
                    devices: Vec::new(),
                },
            })
            .collect()
    }

    /// Whether `name` is a generation model: known, or a GGUF folder added to the repository
    /// since the start.
    pub fn knows(&self, name: &str) -> bool {
        self.read().contains_key(name) || self.gguf(name).is_some()
    }

    fn gguf(&self, name: &str) -> Option<PathBuf> {
        let dir = self.dir.as_deref()?;
        find(dir)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p)
    }

    /// Loads `name` from the repository (re-reading its folder); a loaded model stays as it is.
    pub async fn load(&self, name: &str) -> Result<(), InferError> {
        let _one_at_a_time = self.loading.lock().await;
        if self.get(name).is_some() {
            return Ok(());
        }
        let path = self.gguf(name).ok_or_else(|| {
            InferError::new(
                ErrorKind::ModelNotFound,
                format!("no GGUF file for generation model '{name}' in the repository"),
            )
        })?;
        match self.start(name, path).await {
            Ok(engine) => {
                self.write().insert(name.to_string(), Slot::Ready(engine));
                Ok(())
            }
            Err(reason) => {
                self.write()
                    .insert(name.to_string(), Slot::Unavailable(reason.clone()));
                Err(InferError::new(
                    ErrorKind::Internal,
                    format!("generation model '{name}' failed to load: {reason}"),
                ))
            }
        }
    }

    /// Unloads `name`: new requests find no model at once, and the answer comes once the
    /// sequences it was running have finished and the model is freed.
    pub async fn unload(&self, name: &str) -> Result<(), InferError> {
        let engine = {
            let mut models = self.write();
            match models.get_mut(name) {
                Some(slot @ Slot::Ready(_)) => {
                    match std::mem::replace(slot, Slot::Unavailable("unloaded".into())) {
                        Slot::Ready(engine) => engine,
                        Slot::Unavailable(_) => return Ok(()),
                    }
                }
                Some(Slot::Unavailable(_)) => return Ok(()),
                None => {
                    return Err(InferError::new(
                        ErrorKind::ModelNotFound,
                        format!("unknown model '{name}'"),
                    ))
                }
            }
        };
        let ended = engine.ended();
        drop(engine);
        if let Some(ended) = ended {
            let _ = tokio::task::spawn_blocking(move || ended.recv()).await;
        }
        self.release(name);
        tracing::info!(model = %name, "generation model unloaded");
        Ok(())
    }
}

/// `(name, gguf file)` of each model folder under `dir` that holds one.
fn find(dir: &Path) -> Vec<(String, PathBuf)> {
    let folders = sheaf_core::repository::model_folders(dir).unwrap_or_default();
    let mut found: Vec<(String, PathBuf)> = folders
        .into_iter()
        .filter_map(|(name, folder)| Some((name, sheaf_core::repository::find_gguf(&folder)?)))
        .collect();
    found.sort();
    found
}
