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

use crate::metrics::{DeviceLabels, LifecycleLabels, Metrics, ModelLabels};
use crate::model::Placement;
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
    metrics: Arc<Metrics>,
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
            metrics: Arc::new(Metrics::new()),
            devices: config.device_specs()?,
            routing: config.routing,
            backends,
            models: RwLock::new(BTreeMap::new()),
            started: AtomicBool::new(false),
        })
    }

    /// How requests pick a device, as configured (`queue_depth`, `round_robin`).
    pub fn routing_name(&self) -> &'static str {
        match self.routing {
            Routing::QueueDepth => "queue_depth",
            Routing::RoundRobin => "round_robin",
        }
    }

    /// The server's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The metrics exposition text, with gauges sampled from the live state first.
    pub fn encode_metrics(&self) -> String {
        let m = &self.metrics;
        let mut used: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
        for (_, status) in self.list() {
            let ModelStatus::Ready(h) = status else {
                continue;
            };
            for lane in h.lanes() {
                let labels = ModelLabels {
                    model: h.name.clone(),
                    version: h.version.clone(),
                    device: lane.device.clone(),
                };
                m.queue_depth
                    .get_or_create(&labels)
                    .set(lane.queued_items() as i64);
                m.inflight_batches
                    .get_or_create(&labels)
                    .set(lane.inflight_batches() as i64);
                *used.entry(lane.device.clone()).or_default() += h.memory_bytes as i64;
            }
        }
        for d in &self.devices {
            let labels = DeviceLabels {
                device: d.name.clone(),
            };
            m.device_memory_used
                .get_or_create(&labels)
                .set(used.get(&d.name).copied().unwrap_or(0));
            m.device_memory_total
                .get_or_create(&labels)
                .set(device_memory(d.device) as i64);
        }
        m.encode()
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
                Placement {
                    backend,
                    devices: &self.devices,
                    routing: self.routing,
                    metrics: self.metrics.clone(),
                },
            )
            .await
            .map_err(|e| e.to_string()),
        };
        let status = match outcome {
            Ok(handle) => {
                self.metrics
                    .loads
                    .get_or_create(&LifecycleLabels {
                        model: model.name.clone(),
                    })
                    .inc();
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

/// Total memory of a device in bytes: the host's RAM for the CPU, 0 where unknown.
fn device_memory(device: sheaf_backend::Device) -> u64 {
    match device {
        sheaf_backend::Device::Cpu => std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| {
                        l.split_whitespace()
                            .nth(1)
                            .and_then(|kb| kb.parse::<u64>().ok())
                    })
            })
            .map_or(0, |kb| kb * 1024),
        _ => 0,
    }
}
