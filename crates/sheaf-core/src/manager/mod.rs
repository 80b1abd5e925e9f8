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
//!
//! Where a model loads and what it may hold is the [`ledger`]'s business.

mod ledger;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sheaf_backend::Backend;
use tokio::sync::watch;

use crate::metrics::{DeviceLabels, LifecycleLabels, Metrics, ModelLabels};
use crate::model::Placement;
use crate::repository::{self, RepoModel};
use crate::server_config::{DeviceSpec, ListedModel, Routing, ServerConfig};
use crate::{ErrorKind, InferError, ModelConfig, ModelHandle};
use ledger::{Ledger, MIB};

/// How long a load waits for a busy model to become evictable before it gives up (the models
/// that could make room may be answering their last requests).
const ROOM_WAIT: Duration = Duration::from_secs(2);

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
    /// Where `reserved` comes from.
    memory_source: MemorySource,
    /// Indexes of the devices it is placed on while it holds memory.
    devices: Vec<usize>,
    usage: Arc<Usage>,
    /// Successful loads and evictions since the server started.
    loads: u64,
    evictions: u64,
}

/// Where a model's memory figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemorySource {
    /// Nothing is known.
    #[default]
    Unknown,
    /// The model's `memory_mb`.
    Config,
    /// The backend's report for the loaded model (a sim model's declared memory).
    Backend,
    /// The process's resident memory grew by this much while the model loaded (CPU).
    Measured,
    /// Guessed before loading (an ONNX file's size).
    Estimate,
}

impl MemorySource {
    pub fn name(self) -> &'static str {
        match self {
            MemorySource::Unknown => "unknown",
            MemorySource::Config => "config",
            MemorySource::Backend => "backend",
            MemorySource::Measured => "measured",
            MemorySource::Estimate => "estimate",
        }
    }
}

/// One model as the manager sees it, for statistics and listings.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    pub version: String,
    /// UNAVAILABLE, LOADING, READY or UNLOADING.
    pub state: &'static str,
    pub reason: Option<String>,
    /// The devices it is placed on (while it holds memory).
    pub devices: Vec<String>,
    /// Bytes it holds on each of its devices.
    pub memory_bytes: u64,
    pub memory_source: MemorySource,
    /// Milliseconds since the Unix epoch of its last request since it loaded.
    pub last_used_unix_ms: Option<u64>,
    /// Requests since it loaded.
    pub uses: u64,
    pub loads: u64,
    pub evictions: u64,
}

impl ModelInfo {
    /// Memory per device in Triton's terms: (`CPU`/`GPU`/`SIM`, device id, bytes).
    pub fn memory_usage(&self) -> Vec<(&'static str, i64, u64)> {
        self.devices
            .iter()
            .map(|d| {
                let (kind, id) = match d.split_once(':') {
                    Some(("cuda", id)) => ("GPU", id.parse().unwrap_or(0)),
                    Some(("sim", _)) => ("SIM", 0),
                    _ => ("CPU", d.trim_start_matches("cpu").parse().unwrap_or(0)),
                };
                (kind, id, self.memory_bytes)
            })
            .collect()
    }
}

/// One device as the ledger sees it.
#[derive(Debug, Clone)]
pub struct DeviceUsage {
    pub name: String,
    pub models: usize,
    pub memory_used: u64,
    /// The device's own memory (the host's RAM for the CPU); 0 where unknown.
    pub memory_total: u64,
    /// The ledger's budget for the device; 0 means none.
    pub memory_budget: u64,
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
            memory_source: MemorySource::Unknown,
            devices: Vec::new(),
            usage: Arc::default(),
            loads: 0,
            evictions: 0,
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
    ledger: Ledger,
    /// Models the server configuration lists outside the repository.
    listed: BTreeMap<String, ListedModel>,
    /// Loads under way, and loads begun since the start: a memory measurement is trusted only
    /// when no other load overlapped it.
    loads_in_flight: AtomicUsize,
    loads_begun: AtomicUsize,
    epoch: std::time::Instant,
    epoch_unix_ms: u64,
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
            ledger: Ledger::new(config),
            listed: config.models.clone(),
            loads_in_flight: AtomicUsize::new(0),
            loads_begun: AtomicUsize::new(0),
            epoch: std::time::Instant::now(),
            epoch_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
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
        self.load_models(Some(dir)).await
    }

    /// As [`ModelManager::load_repository`], for the models of `dir` (if any) and those the
    /// server configuration lists.
    pub async fn load_models(&self, dir: Option<&Path>) -> Result<(), String> {
        *self.repository.write().unwrap_or_else(|e| e.into_inner()) = dir.map(Path::to_path_buf);
        let found = self.scan()?;
        if found.is_empty() {
            tracing::warn!(repository = ?dir, "there are no models to serve");
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

    /// Whether every model of `dir` (generation models included) and the listed ones fits the
    /// ledger's limits at once, and the memory they need in all (estimated, before loading
    /// anything).
    pub fn all_fit(&self, dir: Option<&Path>) -> Result<(bool, u64), String> {
        *self.repository.write().unwrap_or_else(|e| e.into_inner()) = dir.map(Path::to_path_buf);
        let found = self.scan()?;
        let spread = match self.ledger.strategy {
            crate::server_config::AssignmentStrategy::All => self.devices.len() as u64,
            _ => 1,
        };
        // Generation models are booked too, from their GGUF file's size before they load.
        let generation: Vec<u64> = dir
            .and_then(|d| repository::model_folders(d).ok())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(_, folder)| repository::find_gguf(&folder))
            .map(|file| std::fs::metadata(file).map_or(0, |m| m.len()))
            .collect();
        let need: u64 = found
            .iter()
            .map(|m| self.estimate(m).0 * spread)
            .sum::<u64>()
            + generation.iter().sum::<u64>();
        let l = &self.ledger;
        let devices = self.devices.len() as u64;
        let fits = (l.max_models == 0 || found.len() + generation.len() <= l.max_models)
            && (l.max_memory == 0 || need <= l.max_memory)
            && (l.device_budget == 0 || need <= l.device_budget * devices);
        Ok((fits, need))
    }

    /// The repository's models, then the listed ones (a listed model replaces a repository
    /// model of the same name).
    fn scan(&self) -> Result<Vec<RepoModel>, String> {
        let dir = self
            .repository
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let files: Vec<&'static str> = self.backends.iter().map(|b| b.model_file()).collect();
        let mut found = match &dir {
            Some(dir) => repository::scan(dir, &files)?,
            None if self.listed.is_empty() => {
                return Err(
                    "no model repository, and the server configuration lists no models".into(),
                )
            }
            None => Vec::new(),
        };
        for (name, listed) in &self.listed {
            if found.iter().any(|m| &m.name == name) {
                tracing::warn!(model = %name, path = %listed.model_path.display(), "the server configuration lists a model the repository also holds; serving the listed file");
                found.retain(|m| &m.name != name);
            }
            found.push(listed_model(name, listed, &files));
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// Whether the repository API may load and unload models: not in the `none` control mode.
    pub fn check_control(&self) -> Result<(), InferError> {
        if self.control == ControlMode::None {
            return Err(InferError::invalid(
                "model control mode is 'none': every model loads at start and stays loaded; run \
                 sheaf serve with --model-control-mode explicit or on_demand to load and unload \
                 models",
            ));
        }
        Ok(())
    }

    /// Loads `name` (re-reading its folder), or waits for the load already under way.
    pub async fn load(&self, name: &str) -> Result<Arc<ModelHandle>, InferError> {
        self.check_control()?;
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
            Load(
                Box<RepoModel>,
                watch::Sender<()>,
                Vec<Arc<ModelHandle>>,
                Vec<usize>,
            ),
            /// Every model that could make room is busy: look again shortly.
            Retry,
        }
        let asked = std::time::Instant::now();
        loop {
            let step = 'decide: {
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
                        let (need, source) = self.estimate(&repo);
                        let preferred = repo
                            .config
                            .as_ref()
                            .ok()
                            .and_then(|c| c.preferred_device.clone());
                        // Room is made, and reserved, under the same lock: concurrent loads
                        // can never overcommit the ledger.
                        let admitted = self
                            .ledger
                            .place(&models, &self.devices, name, need, preferred.as_deref())
                            .and_then(|targets| {
                                let evicted = self.ledger.make_room(
                                    &mut models,
                                    &self.devices,
                                    name,
                                    need,
                                    &targets,
                                    &self.metrics,
                                )?;
                                Ok((targets, evicted))
                            });
                        let entry = models.get_mut(name).ok_or_else(|| not_found(name))?;
                        let (targets, evicted) = match admitted {
                            Ok(admitted) => admitted,
                            Err(e)
                                if e.kind == ErrorKind::Overloaded
                                    && asked.elapsed() < ROOM_WAIT =>
                            {
                                break 'decide Step::Retry;
                            }
                            Err(e) => {
                                // A model that can never fit is reported as failed; a full,
                                // busy ledger is only a reason to retry.
                                if e.kind == ErrorKind::NotReady {
                                    tracing::error!(model = name, reason = %e.message, "model cannot be placed");
                                    entry.status = ModelStatus::Failed {
                                        version: repo.version.clone(),
                                        reason: e.message.clone(),
                                    };
                                }
                                return Err(e);
                            }
                        };
                        let (tx, rx) = watch::channel(());
                        entry.status = ModelStatus::Loading {
                            version: repo.version.clone(),
                        };
                        entry.loading = Some(rx);
                        entry.reserved = need;
                        entry.memory_source = source;
                        entry.devices = targets.clone();
                        Step::Load(Box::new(repo), tx, evicted, targets)
                    }
                }
            };
            let (repo, done, targets) = match step {
                Step::Done(h) => return Ok(h),
                Step::Retry => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                Step::Wait(mut waiter) => {
                    // Either a change or a closed channel means the load ended.
                    let _ = waiter.changed().await;
                    continue;
                }
                Step::Load(repo, done, evicted, targets) => {
                    // Evicted models were idle; dropping them here frees their instances.
                    drop(evicted);
                    (*repo, done, targets)
                }
            };
            let (status, measured) = self.load_entry(repo, &targets).await;
            let (status, evicted) = self.settle(name, status, measured, &targets);
            drop(evicted);
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
                if matches!(status, ModelStatus::Ready(_)) {
                    entry.loads += 1;
                } else {
                    entry.reserved = 0;
                    entry.devices.clear();
                }
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

    /// Loads `model` on the devices `targets`; also returns how much memory in use grew per
    /// device when the load ran alone (see [`ledger::memory_in_use`]).
    async fn load_entry(&self, model: RepoModel, targets: &[usize]) -> (ModelStatus, Option<u64>) {
        let started = std::time::Instant::now();
        let devices: Vec<DeviceSpec> = targets
            .iter()
            .filter_map(|&i| self.devices.get(i).cloned())
            .collect();
        let begun = self.loads_begun.fetch_add(1, Ordering::SeqCst) + 1;
        let alone = self.loads_in_flight.fetch_add(1, Ordering::SeqCst) == 0;
        let before = ledger::memory_in_use(&devices);
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
                    devices: &devices,
                    routing: self.routing,
                    metrics: self.metrics.clone(),
                },
            )
            .await
            .map_err(|e| e.to_string()),
        };
        let after = ledger::memory_in_use(&devices);
        let alone = alone && self.loads_begun.load(Ordering::SeqCst) == begun;
        self.loads_in_flight.fetch_sub(1, Ordering::SeqCst);
        let measured = match (before, after) {
            (Some(b), Some(a)) if alone && a > b => Some((a - b) / devices.len().max(1) as u64),
            _ => None,
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
                    reported_bytes = handle.memory_bytes,
                    measured_bytes = measured,
                    devices = ?devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
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
        (status, measured)
    }

    /// Books a loaded model at its real size: the configured `memory_mb`, else what the backend
    /// reports, else the measured growth, else the estimate. A model larger than its
    /// reservation must still fit (evicting more if need be), or it is dropped and reported as
    /// failed. Returns the final status and the models evicted meanwhile.
    fn settle(
        &self,
        name: &str,
        status: ModelStatus,
        measured: Option<u64>,
        targets: &[usize],
    ) -> (ModelStatus, Vec<Arc<ModelHandle>>) {
        let ModelStatus::Ready(handle) = &status else {
            return (status, Vec::new());
        };
        let mut models = self.write();
        let Some(entry) = models.get_mut(name) else {
            return (status, Vec::new());
        };
        let (size, source) = match entry.memory_source {
            MemorySource::Config => (entry.reserved, MemorySource::Config),
            _ if handle.memory_bytes > 0 => (handle.memory_bytes, MemorySource::Backend),
            _ => match measured {
                Some(m) => (m, MemorySource::Measured),
                None => (entry.reserved, entry.memory_source),
            },
        };
        entry.memory_source = source;
        if size <= entry.reserved {
            entry.reserved = size;
            return (status, Vec::new());
        }
        // Re-admit it at its real size: out of the ledger meanwhile (under the same lock).
        entry.reserved = 0;
        let kept = entry.devices.clone();
        entry.devices.clear();
        let loading = std::mem::replace(
            &mut entry.status,
            ModelStatus::Unloaded {
                version: handle.version.clone(),
            },
        );
        let admitted = self.ledger.make_room(
            &mut models,
            &self.devices,
            name,
            size,
            targets,
            &self.metrics,
        );
        let Some(entry) = models.get_mut(name) else {
            return (status, Vec::new());
        };
        entry.status = loading;
        match admitted {
            Ok(evicted) => {
                entry.reserved = size;
                entry.devices = kept;
                (status, evicted)
            }
            Err(e) => {
                let reason = format!(
                    "it holds {} MiB per device once loaded ({}), and does not fit: {}",
                    size / MIB,
                    source.name(),
                    e.message
                );
                tracing::error!(model = name, %reason, "model loaded, but dropped");
                (
                    ModelStatus::Failed {
                        version: handle.version.clone(),
                        reason,
                    },
                    Vec::new(),
                )
            }
        }
    }

    /// Unloads `name` once every request it admitted has been answered; new requests are refused
    /// meanwhile.
    pub async fn unload(&self, name: &str) -> Result<(), InferError> {
        self.check_control()?;
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
        let version = handle.version.clone();
        drop(handle);
        let mut memory = 0;
        if let Some(entry) = self.write().get_mut(name) {
            entry.status = ModelStatus::Unloaded { version };
            memory = std::mem::take(&mut entry.reserved);
            entry.devices.clear();
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

    /// Memory the model at `repo` will hold per device, and where the figure comes from: its
    /// `memory_mb`, else the backend's estimate, times its instances.
    fn estimate(&self, repo: &RepoModel) -> (u64, MemorySource) {
        let config = repo.config.as_ref().ok();
        let instances = config.map_or(1, |c| c.instances as u64);
        if let Some(mb) = config.and_then(|c| c.memory_mb) {
            return (mb * MIB * instances, MemorySource::Config);
        }
        let backend = self.backends.iter().find(|b| b.model_file() == repo.file);
        match backend.and_then(|b| b.estimate_memory(&repo.path)) {
            Some(bytes) => (bytes * instances, MemorySource::Estimate),
            None => (0, MemorySource::Unknown),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Books `bytes` for `name`, a model the server runs outside the manager (a generation
    /// model), on the first CPU device: idle models are evicted to make room, and the booking
    /// counts against every limit until [`ModelManager::release`], but is never evicted itself.
    /// Booking again replaces the name's booking. Without a CPU device nothing is booked.
    pub fn book(&self, name: &str, bytes: u64) -> Result<(), InferError> {
        let Some(cpu) = self
            .devices
            .iter()
            .position(|d| d.device == sheaf_backend::Device::Cpu)
        else {
            return Ok(());
        };
        let evicted = {
            let mut models = self.write();
            // A new booking replaces the name's old one.
            self.ledger.unpin(name);
            let evicted = self.ledger.make_room(
                &mut models,
                &self.devices,
                name,
                bytes,
                &[cpu],
                &self.metrics,
            )?;
            self.ledger.pin(name, vec![cpu], bytes);
            evicted
        };
        // Evicted models were idle; dropping them here frees their instances.
        drop(evicted);
        Ok(())
    }

    /// The devices [`ModelManager::book`] booked `name` on.
    pub fn booked_devices(&self, name: &str) -> Vec<String> {
        let _models = self.models.read().unwrap_or_else(|e| e.into_inner());
        self.ledger
            .pinned_devices(name)
            .into_iter()
            .filter_map(|d| self.devices.get(d).map(|spec| spec.name.clone()))
            .collect()
    }

    /// Releases what [`ModelManager::book`] booked for `name`.
    pub fn release(&self, name: &str) {
        let _models = self.write();
        self.ledger.unpin(name);
    }

    /// Memory the loaded (and loading) models hold on each device, in bytes.
    pub fn memory_used(&self) -> Vec<u64> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        self.ledger.per_device(&models, self.devices.len())
    }

    /// Each device: models placed on it, memory they hold, its total memory and its budget.
    pub fn device_usage(&self) -> Vec<DeviceUsage> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let used = self.ledger.per_device(&models, self.devices.len());
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceUsage {
                name: d.name.clone(),
                models: models
                    .values()
                    .filter(|e| e.holds_memory() && e.devices.contains(&i))
                    .count()
                    + self.ledger.pinned_on(i),
                memory_used: used[i],
                memory_total: device_memory(d.device),
                memory_budget: self.ledger.device_budget,
            })
            .collect()
    }

    /// One model's placement, memory and usage.
    pub fn model_info(&self, name: &str) -> Option<ModelInfo> {
        self.model_infos().into_iter().find(|m| m.name == name)
    }

    /// Every model with its placement, memory and usage, by name.
    pub fn model_infos(&self) -> Vec<ModelInfo> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models
            .iter()
            .map(|(name, e)| {
                let held = e.holds_memory();
                let uses = e.usage.uses.load(Ordering::Relaxed);
                ModelInfo {
                    name: name.clone(),
                    version: e.status.version().to_string(),
                    state: e.status.state(),
                    reason: e.status.reason().map(str::to_string),
                    devices: e
                        .devices
                        .iter()
                        .filter_map(|&d| self.devices.get(d).map(|d| d.name.clone()))
                        .collect(),
                    memory_bytes: if held { e.reserved } else { 0 },
                    memory_source: e.memory_source,
                    last_used_unix_ms: (held && uses > 0)
                        .then(|| self.epoch_unix_ms + e.usage.last_used_ms.load(Ordering::Relaxed)),
                    uses,
                    loads: e.loads,
                    evictions: e.evictions,
                }
            })
            .collect()
    }

    /// Models loaded, loading or unloading.
    pub fn models_held(&self) -> usize {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.values().filter(|e| e.holds_memory()).count()
    }

    /// Starts the task that unloads models unused for `idle_timeout_s` (when it is set).
    pub fn spawn_idle_unloader(self: &Arc<Self>) {
        let Some(timeout) = self.ledger.idle_timeout else {
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
            }
        }
        for d in self.device_usage() {
            let labels = DeviceLabels { device: d.name };
            m.device_memory_used
                .get_or_create(&labels)
                .set(d.memory_used as i64);
            m.device_memory_total
                .get_or_create(&labels)
                .set(d.memory_total as i64);
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

/// A model the server configuration lists, as if found in the repository: its backend is the
/// one whose model file name ends like its path (`.onnx`, `.sim.yaml`).
fn listed_model(name: &str, listed: &ListedModel, files: &[&'static str]) -> RepoModel {
    let path = listed.model_path.clone();
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let file = files
        .iter()
        .copied()
        .find(|f| file_name.ends_with(f.trim_start_matches("model")));
    let config = match (file, path.is_file()) {
        (None, _) => Err(format!(
            "{}: no backend serves this file; the name must end like one of {files:?}",
            path.display()
        )),
        (_, false) => Err(format!("{}: no such model file", path.display())),
        (Some(_), true) => {
            let mut config = ModelConfig {
                preload: listed.preload,
                preferred_device: listed.preferred_device.clone(),
                ..ModelConfig::default()
            };
            if let Some(n) = listed.instances {
                config.instances = n;
            }
            Ok(config)
        }
    };
    RepoModel {
        name: name.to_string(),
        version: "1".into(),
        path,
        file: file.unwrap_or(""),
        config,
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
