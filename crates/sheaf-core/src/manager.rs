//! The model manager: which models exist, their state, and the handles that serve them.
//!
//! One map from name to [`Entry`] sits behind a std `RwLock` that is never held across an await.
//! A model is UNAVAILABLE (not loaded, or failed with a reason), LOADING, READY or UNLOADING.
//!
//! Model control modes ([`ControlMode`]):
//! - `none`: every model of the repository loads at start; load and unload requests are refused;
//! - `explicit`: models with `preload: true` load at start; the others through the repository
//!   API (`load`, `unload`);
//! - `on_demand`: as `explicit`, and the first inference request for a model that is not loaded
//!   loads it. Requests wait while it loads.
//!
//! Concurrent loads of one model coalesce: the first caller loads, and the others wait on a watch
//! channel for its outcome. Unloading marks the model UNLOADING, so new requests are refused. It
//! waits until every admitted request is answered, then drops the model: its batcher tasks end,
//! and so do its instance threads, which free the model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sheaf_backend::Backend;
use tokio::sync::watch;

use crate::metrics::{DeviceLabels, LifecycleLabels, Metrics, ModelLabels};
use crate::model::Placement;
use crate::repository::{self, RepoModel};
use crate::server_config::{DeviceSpec, Routing, ServerConfig};
use crate::{ErrorKind, InferError, ModelHandle};

/// When models load (`--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlMode {
    /// Everything at start; no load or unload API.
    #[default]
    None,
    /// `preload: true` models at start; the rest through the repository API.
    Explicit,
    /// As `Explicit`, and inference requests load the model they name.
    OnDemand,
}

/// Where a model stands.
#[derive(Clone)]
pub enum ModelStatus {
    /// Known, not loaded.
    Unloaded {
        version: String,
    },
    Loading {
        version: String,
    },
    Ready(Arc<ModelHandle>),
    Unloading {
        version: String,
    },
    /// The last load failed.
    Failed {
        version: String,
        reason: String,
    },
}

impl ModelStatus {
    /// The state name the repository extension uses.
    pub fn state(&self) -> &'static str {
        match self {
            ModelStatus::Loading { .. } => "LOADING",
            ModelStatus::Ready(_) => "READY",
            ModelStatus::Unloading { .. } => "UNLOADING",
            ModelStatus::Unloaded { .. } | ModelStatus::Failed { .. } => "UNAVAILABLE",
        }
    }

    pub fn version(&self) -> &str {
        match self {
            ModelStatus::Unloaded { version }
            | ModelStatus::Loading { version }
            | ModelStatus::Unloading { version }
            | ModelStatus::Failed { version, .. } => version,
            ModelStatus::Ready(h) => &h.version,
        }
    }

    /// Why the model is not available, when that is known.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ModelStatus::Failed { reason, .. } => Some(reason),
            ModelStatus::Unloaded { .. } => Some("not loaded"),
            _ => None,
        }
    }
}

/// One model of the repository.
struct Entry {
    repo: RepoModel,
    status: ModelStatus,
    /// While loading: resolves (changes or closes) when the load ends.
    loading: Option<watch::Receiver<()>>,
}

/// All models of one server.
pub struct ModelManager {
    backends: Vec<Arc<dyn Backend>>,
    metrics: Arc<Metrics>,
    devices: Vec<DeviceSpec>,
    routing: Routing,
    control: ControlMode,
    repository: RwLock<Option<PathBuf>>,
    models: RwLock<BTreeMap<String, Entry>>,
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
            control: ControlMode::None,
            repository: RwLock::new(None),
            backends,
            models: RwLock::new(BTreeMap::new()),
            started: AtomicBool::new(false),
        })
    }

    /// Sets the model control mode (before `load_repository`).
    pub fn with_control(mut self, control: ControlMode) -> ModelManager {
        self.control = control;
        self
    }

    pub fn control(&self) -> ControlMode {
        self.control
    }

    /// Registers every model under `dir` and loads those the control mode loads at start
    /// (all of them in `none`; `preload: true` ones otherwise). Failures are recorded per model;
    /// only an unreadable repository is an error. Marks the server ready when done.
    pub async fn load_repository(&self, dir: &Path) -> Result<(), String> {
        *self.repository.write().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_path_buf());
        let found = self.scan()?;
        if found.is_empty() {
            tracing::warn!(repository = %dir.display(), "the model repository holds no models");
        }
        let mut at_start = Vec::new();
        {
            let mut models = self.write();
            for m in found {
                let preload = m.config.as_ref().map_or(true, |c| c.preload);
                if self.control == ControlMode::None || preload {
                    at_start.push(m.name.clone());
                }
                let status = ModelStatus::Unloaded {
                    version: m.version.clone(),
                };
                models.insert(
                    m.name.clone(),
                    Entry {
                        repo: m,
                        status,
                        loading: None,
                    },
                );
            }
        }
        futures::future::join_all(at_start.iter().map(|name| self.load_now(name))).await;
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    fn scan(&self) -> Result<Vec<RepoModel>, String> {
        let dir = self
            .repository
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let dir = dir.ok_or("no model repository")?;
        let files: Vec<&'static str> = self.backends.iter().map(|b| b.model_file()).collect();
        repository::scan(&dir, &files)
    }

    /// Loads `name` (re-reading its folder), or waits for the load already under way.
    pub async fn load(&self, name: &str) -> Result<Arc<ModelHandle>, InferError> {
        if self.control == ControlMode::None {
            return Err(InferError::invalid(
                "model control mode is 'none': every model loads at start; run sheaf serve with \
                 --model-control-mode explicit or on_demand to load and unload models",
            ));
        }
        // The model may have been added to the repository since the start.
        if let Ok(found) = self.scan() {
            let mut models = self.write();
            for m in found.into_iter().filter(|m| m.name == name) {
                match models.get_mut(name) {
                    Some(e)
                        if !matches!(
                            e.status,
                            ModelStatus::Ready(_) | ModelStatus::Loading { .. }
                        ) =>
                    {
                        e.repo = m
                    }
                    Some(_) => {}
                    None => {
                        let status = ModelStatus::Unloaded {
                            version: m.version.clone(),
                        };
                        models.insert(
                            name.to_string(),
                            Entry {
                                repo: m,
                                status,
                                loading: None,
                            },
                        );
                    }
                }
            }
        }
        self.load_now(name).await
    }

    async fn load_now(&self, name: &str) -> Result<Arc<ModelHandle>, InferError> {
        /// What to do, decided under the lock and done after it is released.
        enum Step {
            Done(Arc<ModelHandle>),
            Wait(watch::Receiver<()>),
            Load(Box<RepoModel>, watch::Sender<()>),
        }
        loop {
            let step = {
                let mut models = self.write();
                let entry = models.get_mut(name).ok_or_else(|| not_found(name))?;
                match &entry.status {
                    ModelStatus::Ready(h) => Step::Done(h.clone()),
                    ModelStatus::Unloading { .. } => {
                        return Err(InferError::new(
                            ErrorKind::NotReady,
                            format!("model '{name}' is unloading"),
                        ))
                    }
                    ModelStatus::Loading { .. } => match entry.loading.clone() {
                        Some(waiter) => Step::Wait(waiter),
                        None => {
                            return Err(InferError::internal(format!(
                                "model '{name}' is loading without a waiter"
                            )))
                        }
                    },
                    ModelStatus::Unloaded { .. } | ModelStatus::Failed { .. } => {
                        let (tx, rx) = watch::channel(());
                        entry.status = ModelStatus::Loading {
                            version: entry.repo.version.clone(),
                        };
                        entry.loading = Some(rx);
                        Step::Load(Box::new(entry.repo.clone()), tx)
                    }
                }
            };
            let (repo, done) = match step {
                Step::Done(h) => return Ok(h),
                Step::Wait(mut waiter) => {
                    // Either a change or a closed channel means the load ended.
                    let _ = waiter.changed().await;
                    continue;
                }
                Step::Load(repo, done) => (*repo, done),
            };
            let status = self.load_entry(repo).await;
            let outcome = match &status {
                ModelStatus::Ready(h) => Ok(h.clone()),
                other => Err(InferError::new(
                    ErrorKind::NotReady,
                    format!(
                        "model '{name}' is not available: {}",
                        other.reason().unwrap_or("load failed")
                    ),
                )),
            };
            if let Some(entry) = self.write().get_mut(name) {
                entry.status = status;
                entry.loading = None;
            }
            let _ = done.send(());
            return outcome;
        }
    }

    async fn load_entry(&self, model: RepoModel) -> ModelStatus {
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
        match outcome {
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
                    memory_bytes = handle.memory_bytes,
                    devices = ?self.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
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
        }
    }

    /// Unloads `name` once every request it admitted has been answered; new requests are refused
    /// meanwhile.
    pub async fn unload(&self, name: &str) -> Result<(), InferError> {
        if self.control == ControlMode::None {
            return Err(InferError::invalid(
                "model control mode is 'none': models cannot be unloaded; run sheaf serve with \
                 --model-control-mode explicit or on_demand",
            ));
        }
        let handle = {
            let mut models = self.write();
            let entry = models.get_mut(name).ok_or_else(|| not_found(name))?;
            match &entry.status {
                ModelStatus::Ready(h) => {
                    let h = h.clone();
                    entry.status = ModelStatus::Unloading {
                        version: h.version.clone(),
                    };
                    h
                }
                ModelStatus::Loading { .. } => {
                    return Err(InferError::new(
                        ErrorKind::NotReady,
                        format!("model '{name}' is still loading"),
                    ))
                }
                _ => return Ok(()),
            }
        };
        let started = std::time::Instant::now();
        while handle.pending_items() > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (version, memory) = (handle.version.clone(), handle.memory_bytes);
        drop(handle);
        if let Some(entry) = self.write().get_mut(name) {
            entry.status = ModelStatus::Unloaded { version };
        }
        self.metrics
            .unloads
            .get_or_create(&LifecycleLabels {
                model: name.to_string(),
            })
            .inc();
        tracing::info!(
            model = name,
            memory_bytes = memory,
            drain_ms = started.elapsed().as_millis() as u64,
            reason = "requested",
            "model unloaded"
        );
        Ok(())
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

    /// The ready model `name`, at `version` if given.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, InferError> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let status = &models.get(name).ok_or_else(|| not_found(name))?.status;
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
            ModelStatus::Unloading { .. } => Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{name}' is unloading"),
            )),
            ModelStatus::Unloaded { .. } => Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{name}' is not loaded (load it through the repository API)"),
            )),
            ModelStatus::Failed { reason, .. } => Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{name}' is not available: {reason}"),
            )),
        }
    }

    /// The model an inference request names: in `on_demand` mode a model that is not loaded is
    /// loaded first (the request waits); otherwise as [`ModelManager::get`].
    pub async fn get_or_load(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<ModelHandle>, InferError> {
        match self.get(name, version) {
            Err(e) if self.control == ControlMode::OnDemand && e.kind == ErrorKind::NotReady => {
                let unloaded = matches!(
                    self.models
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(name)
                        .map(|e| &e.status),
                    Some(ModelStatus::Unloaded { .. } | ModelStatus::Loading { .. })
                );
                if !unloaded {
                    return Err(e);
                }
                self.load_now(name).await?;
                self.get(name, version)
            }
            other => other,
        }
    }

    /// Every model with its status, by name.
    pub fn list(&self) -> Vec<(String, ModelStatus)> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models
            .iter()
            .map(|(k, v)| (k.clone(), v.status.clone()))
            .collect()
    }

    /// True once the repository has been registered and its start-up loads have ended.
    pub fn is_ready(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.models.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn not_found(name: &str) -> InferError {
    InferError::new(ErrorKind::ModelNotFound, format!("unknown model '{name}'"))
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
