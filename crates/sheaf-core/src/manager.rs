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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sheaf_backend::Backend;
use tokio::sync::watch;

use crate::metrics::{DeviceLabels, LifecycleLabels, Metrics, ModelLabels};
use crate::model::Placement;
use crate::repository::{self, RepoModel};
use crate::server_config::{DeviceSpec, EvictionPolicy, Routing, ServerConfig};

const MIB: u64 = 1024 * 1024;
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
    /// Bytes per device this model holds in the memory ledger: its estimate while loading, its
    /// reported size while loaded, 0 otherwise.
    reserved: u64,
    usage: Arc<Usage>,
}

impl Entry {
    fn new(repo: RepoModel) -> Entry {
        let status = ModelStatus::Unloaded {
            version: repo.version.clone(),
        };
        Entry {
            repo,
            status,
            loading: None,
            reserved: 0,
            usage: Arc::default(),
        }
    }

    /// Whether it counts in the ledger (loading, loaded or unloading).
    fn holds_memory(&self) -> bool {
        matches!(
            self.status,
            ModelStatus::Loading { .. } | ModelStatus::Ready(_) | ModelStatus::Unloading { .. }
        )
    }
}

/// How a model has been used since it loaded, for eviction and idle unloading.
#[derive(Debug, Default)]
struct Usage {
    /// Milliseconds since the manager started, at the last request.
    last_used_ms: AtomicU64,
    /// Requests since the model loaded.
    uses: AtomicU64,
}

/// The memory ledger's limits.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Bytes per device; 0 = none.
    device_budget: u64,
    max_models: usize,
    /// Bytes over all devices; 0 = none.
    max_memory: u64,
    eviction: EvictionPolicy,
    idle_timeout: Option<Duration>,
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
    limits: Limits,
    epoch: std::time::Instant,
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
            limits: Limits {
                device_budget: config.memory_budget_mb * MIB,
                max_models: config.max_models,
                max_memory: config.max_memory_mb * MIB,
                eviction: config.eviction_policy,
                idle_timeout: (config.idle_timeout_s > 0)
                    .then(|| Duration::from_secs(config.idle_timeout_s)),
            },
            epoch: std::time::Instant::now(),
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
                models.insert(m.name.clone(), Entry::new(m));
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
                        models.insert(name.to_string(), Entry::new(m));
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
            Load(Box<RepoModel>, watch::Sender<()>, Vec<Arc<ModelHandle>>),
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
                        let repo = entry.repo.clone();
                        let need = self.estimate(&repo);
                        // Room is made, and reserved, under the same lock: concurrent loads
                        // can never overcommit the ledger.
                        let evicted = self.make_room(&mut models, name, need)?;
                        let entry = models.get_mut(name).ok_or_else(|| not_found(name))?;
                        let (tx, rx) = watch::channel(());
                        entry.status = ModelStatus::Loading {
                            version: repo.version.clone(),
                        };
                        entry.loading = Some(rx);
                        entry.reserved = need;
                        Step::Load(Box::new(repo), tx, evicted)
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
                Step::Load(repo, done, evicted) => {
                    // Evicted models were idle; dropping them here frees their instances.
                    drop(evicted);
                    (*repo, done)
                }
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
                entry.reserved = match &status {
                    ModelStatus::Ready(h) => h.memory_bytes.max(entry.reserved),
                    _ => 0,
                };
                entry.usage = Arc::default();
                entry
                    .usage
                    .last_used_ms
                    .store(self.now_ms(), Ordering::Relaxed);
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
        self.unload_for(name, "requested").await
    }

    async fn unload_for(&self, name: &str, reason: &str) -> Result<(), InferError> {
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
            entry.reserved = 0;
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
            reason,
            "model unloaded"
        );
        Ok(())
    }

    /// Memory the model at `repo` will hold per device: its `memory_mb`, else the backend's
    /// estimate, times its instances.
    fn estimate(&self, repo: &RepoModel) -> u64 {
        let config = repo.config.as_ref().ok();
        let per_instance = config
            .and_then(|c| c.memory_mb)
            .map(|mb| mb * MIB)
            .or_else(|| {
                let backend = self.backends.iter().find(|b| b.model_file() == repo.file)?;
                backend.estimate_memory(&repo.path)
            });
        per_instance.unwrap_or(0) * config.map_or(1, |c| c.instances as u64)
    }

    /// Evicts idle models (no admitted requests), in eviction-policy order, until a model of
    /// `need` bytes per device fits every limit. Returns the evicted handles (to drop after the
    /// lock), or an error if it cannot fit.
    fn make_room(
        &self,
        models: &mut BTreeMap<String, Entry>,
        name: &str,
        need: u64,
    ) -> Result<Vec<Arc<ModelHandle>>, InferError> {
        let l = self.limits;
        let devices = self.devices.len().max(1) as u64;
        let mib = |b: u64| b / MIB;
        if (l.device_budget > 0 && need > l.device_budget)
            || (l.max_memory > 0 && need * devices > l.max_memory)
        {
            return Err(InferError::new(
                ErrorKind::NotReady,
                format!(
                    "model '{name}' needs {} MiB per device, more than the memory budget allows",
                    mib(need)
                ),
            ));
        }
        let mut evicted = Vec::new();
        loop {
            let (used, count) = models
                .values()
                .filter(|e| e.holds_memory())
                .fold((0u64, 0usize), |(u, c), e| (u + e.reserved, c + 1));
            let fits = (l.device_budget == 0 || used + need <= l.device_budget)
                && (l.max_models == 0 || count < l.max_models)
                && (l.max_memory == 0 || (used + need) * devices <= l.max_memory);
            if fits {
                return Ok(evicted);
            }
            let victim = models
                .iter()
                .filter(|(n, e)| {
                    n.as_str() != name
                        && matches!(&e.status, ModelStatus::Ready(h) if h.pending_items() == 0)
                })
                .min_by_key(|(_, e)| {
                    let last = e.usage.last_used_ms.load(Ordering::Relaxed);
                    let uses = e.usage.uses.load(Ordering::Relaxed);
                    match l.eviction {
                        EvictionPolicy::Lru => (last, uses),
                        EvictionPolicy::Lfu => (uses, last),
                    }
                })
                .map(|(n, _)| n.clone());
            let Some(victim) = victim else {
                return Err(InferError::new(
                    ErrorKind::Overloaded,
                    format!(
                        "cannot load model '{name}' ({} MiB): {count} models hold {} MiB per device and every \
                         one of them is busy, so none can be evicted; retry later",
                        mib(need),
                        mib(used)
                    ),
                ));
            };
            if let Some(entry) = models.get_mut(&victim) {
                let unloaded = ModelStatus::Unloaded {
                    version: entry.repo.version.clone(),
                };
                if let ModelStatus::Ready(h) = std::mem::replace(&mut entry.status, unloaded) {
                    tracing::info!(
                        model = %victim,
                        memory_bytes = entry.reserved,
                        policy = ?l.eviction,
                        for_model = name,
                        reason = "evicted to make room",
                        "model unloaded"
                    );
                    evicted.push(h);
                }
                entry.reserved = 0;
                self.metrics
                    .evictions
                    .get_or_create(&LifecycleLabels {
                        model: victim.clone(),
                    })
                    .inc();
                self.metrics
                    .unloads
                    .get_or_create(&LifecycleLabels { model: victim })
                    .inc();
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Memory the loaded (and loading) models hold per device, in bytes.
    pub fn memory_used(&self) -> u64 {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models
            .values()
            .filter(|e| e.holds_memory())
            .map(|e| e.reserved)
            .sum()
    }

    /// Models loaded, loading or unloading.
    pub fn models_held(&self) -> usize {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.values().filter(|e| e.holds_memory()).count()
    }

    /// Starts the task that unloads models unused for `idle_timeout_s` (when it is set).
    pub fn spawn_idle_unloader(self: &Arc<Self>) {
        let Some(timeout) = self.limits.idle_timeout else {
            return;
        };
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            let tick = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            loop {
                tokio::time::sleep(tick).await;
                let Some(m) = manager.upgrade() else { return };
                let now = m.now_ms();
                let idle: Vec<String> = m
                    .models
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter(|(_, e)| matches!(&e.status, ModelStatus::Ready(h) if h.pending_items() == 0))
                    .filter(|(_, e)| {
                        now.saturating_sub(e.usage.last_used_ms.load(Ordering::Relaxed)) >= timeout.as_millis() as u64
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in idle {
                    let _ = m.unload_for(&name, "idle").await;
                }
            }
        });
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
        let handle = self.get_or_load_inner(name, version).await?;
        if let Some(entry) = self
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            entry
                .usage
                .last_used_ms
                .store(self.now_ms(), Ordering::Relaxed);
            entry.usage.uses.fetch_add(1, Ordering::Relaxed);
        }
        Ok(handle)
    }

    async fn get_or_load_inner(
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
