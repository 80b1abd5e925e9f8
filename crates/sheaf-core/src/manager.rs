//! The model manager: which models exist, their state, and the handles that serve them.
//!
//! It loads every model of the repository at start (each on its own instance threads, in
//! parallel) and keeps a map from name to state behind a std `RwLock` that is never held across
//! an await. A model that fails to load stays listed with its reason, and the server serves the
//! others.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use sheaf_backend::Backend;

use crate::repository::{self, RepoModel};
use crate::server_config::{DeviceSpec, Routing, ServerConfig};
use crate::{ErrorKind, InferError, ModelHandle};

/// Where a model stands.
#[derive(Clone)]
pub enum ModelStatus {
    Loading { version: String },
    Ready(Arc<ModelHandle>),
    Failed { version: String, reason: String },
}

impl ModelStatus {
    /// The state name the repository extension uses.
    pub fn state(&self) -> &'static str {
        match self {
            ModelStatus::Loading { .. } => "LOADING",
            ModelStatus::Ready(_) => "READY",
            ModelStatus::Failed { .. } => "UNAVAILABLE",
        }
    }

    pub fn version(&self) -> &str {
        match self {
            ModelStatus::Loading { version } | ModelStatus::Failed { version, .. } => version,
            ModelStatus::Ready(h) => &h.version,
        }
    }
}

/// All models of one server.
pub struct ModelManager {
    backends: Vec<Arc<dyn Backend>>,
    devices: Vec<DeviceSpec>,
    routing: Routing,
    models: RwLock<BTreeMap<String, ModelStatus>>,
    started: AtomicBool,
}

impl ModelManager {
    /// A manager that loads models with `backends`, each recognised by its model file name, on
    /// the default device (the CPU).
    pub fn new(backends: Vec<Arc<dyn Backend>>) -> ModelManager {
        ModelManager::with_config(backends, &ServerConfig::default())
            .unwrap_or_else(|_| unreachable!("the default configuration is valid"))
    }

    /// A manager that places every model on each of `config`'s devices.
    pub fn with_config(
        backends: Vec<Arc<dyn Backend>>,
        config: &ServerConfig,
    ) -> Result<ModelManager, String> {
        Ok(ModelManager {
            devices: config.device_specs()?,
            routing: config.routing,
            backends,
            models: RwLock::new(BTreeMap::new()),
            started: AtomicBool::new(false),
        })
    }

    /// The devices models are placed on.
    pub fn devices(&self) -> &[DeviceSpec] {
        &self.devices
    }

    /// Loads every model under `dir`. Failures are recorded per model; only an unreadable
    /// repository is an error. Marks the server ready when done.
    pub async fn load_repository(&self, dir: &Path) -> Result<(), String> {
        let files: Vec<&'static str> = self.backends.iter().map(|b| b.model_file()).collect();
        let found = repository::scan(dir, &files)?;
        if found.is_empty() {
            tracing::warn!(repository = %dir.display(), "the model repository holds no models");
        }
        {
            let mut models = self.write();
            for m in &found {
                models.insert(
                    m.name.clone(),
                    ModelStatus::Loading {
                        version: m.version.clone(),
                    },
                );
            }
        }
        let loads = found.into_iter().map(|m| self.load_one(m));
        futures::future::join_all(loads).await;
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    async fn load_one(&self, model: RepoModel) {
        let started = std::time::Instant::now();
        let backend = self
            .backends
            .iter()
            .find(|b| b.model_file() == model.file)
            .cloned();
        let outcome = match (model.config, backend) {
            (Err(reason), _) => Err(reason),
            (_, None) => Err(format!("no backend loads {}", model.file)),
            (Ok(config), Some(backend)) => ModelHandle::load(
                &model.name,
                &model.version,
                model.path.clone(),
                config,
                backend,
                &self.devices,
                self.routing,
            )
            .await
            .map_err(|e| e.to_string()),
        };
        let status = match outcome {
            Ok(handle) => {
                tracing::info!(
                    model = %model.name,
                    version = %model.version,
                    path = %model.path.display(),
                    max_batch_size = handle.max_batch_size,
                    load_ms = started.elapsed().as_millis() as u64,
                    "model loaded"
                );
                ModelStatus::Ready(Arc::new(handle))
            }
            Err(reason) => {
                tracing::error!(model = %model.name, %reason, "model failed to load");
                ModelStatus::Failed {
                    version: model.version,
                    reason,
                }
            }
        };
        self.write().insert(model.name, status);
    }

    /// The ready model `name`, at `version` if given.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, InferError> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let status = models.get(name).ok_or_else(|| {
            InferError::new(ErrorKind::ModelNotFound, format!("unknown model '{name}'"))
        })?;
        if let Some(v) = version.filter(|v| !v.is_empty()) {
            if v != status.version() {
                return Err(InferError::new(
                    ErrorKind::ModelNotFound,
                    format!(
                        "unknown version '{v}' of model '{name}' (version '{}' is served)",
                        status.version()
                    ),
                ));
            }
        }
        match status {
            ModelStatus::Ready(handle) => Ok(handle.clone()),
            ModelStatus::Loading { .. } => Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{name}' is still loading"),
            )),
            ModelStatus::Failed { reason, .. } => Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{name}' is not available: {reason}"),
            )),
        }
    }

    /// Every model with its status, by name.
    pub fn list(&self) -> Vec<(String, ModelStatus)> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// True once the repository has been loaded (whatever each model's outcome).
    pub fn is_ready(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, ModelStatus>> {
        self.models.write().unwrap_or_else(|e| e.into_inner())
    }
}
