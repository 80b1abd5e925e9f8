//! The model manager: which models exist, their state, and the handles that serve them.
//!
//! One map from name to [`Entry`] sits behind a std `RwLock` that is never held across an await.
//! A model is UNAVAILABLE (not loaded, or failed with a reason), LOADING, READY or UNLOADING.
//!
//! Model control modes ([`ControlMode`]):
//! - `none`: every model of the repository loads at start; load and unload requests are refused;
//! - `explicit`: models with `preload: true`, and those [`ModelManager::with_load_at_start`]
//!   names, load at start; the others through the repository API (`load`, `unload`). A
//!   pipeline's step models load with it;
//! - `on_demand`: as `explicit`, and the first inference request for a model that is not loaded
//!   loads it. Requests wait while it loads.
//! - `poll`: as `none`, and the repository is looked at again every so often ([`poll`]): a
//!   model added or changed loads, a model removed unloads.
//!
//! Loading a loaded model loads it again from its folder while the one before serves, then
//! swaps them. Concurrent loads of one model coalesce: the first caller loads, and the others wait on a watch
//! channel for its outcome. Unloading marks the model UNLOADING, so new requests are refused. It
//! waits until every admitted request is answered, then drops the model: its batchers' timer
//! tasks end, and so do its instance threads, which free the model.
//!
//! Every kind of model is managed alike: tensor models, text encoders and generation models
//! (whose engine batches their requests itself) are loaded, placed, booked, evicted and unloaded
//! by the same code.
//!
//! Files: this one holds the map, the repository scan and lookups; [`lifecycle`] loads and
//! unloads; [`poll`] follows the repository's changes in the `poll` mode; [`growth`] books loaded models anew as they grow while serving; [`status`] reports; [`views`] answers the questions every protocol asks (index,
//! readiness, metadata, statistics) once, as typed values that each protocol renders. Where a model loads and what it may hold is the [`ledger`]'s
//! business. [`caller`] lets models run other models (Triton's BLS) through the same manager.

mod caller;
mod gpu;
mod growth;
mod ledger;
mod lifecycle;
mod poll;
mod registered;
mod status;
mod views;

pub use caller::caller;
pub use status::{DeviceUsage, MemorySource, ModelInfo, ModelState, ModelStatus};
pub use views::{ModelMetadata, ModelStatistics, Readiness};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use sheaf_backend::Backend;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::repository::{self, RepoModel};
use crate::server_config::{DeviceSpec, ListedModel, Routing, ServerConfig};
use crate::{ErrorKind, InferError, ModelConfig, ModelHandle};
use ledger::Ledger;

/// Bytes in a MiB: the unit of the configuration's memory figures and of the GPU driver's.
const MIB: u64 = 1024 * 1024;

/// How many times, in the `on_demand` mode, one request loads a model that another load evicted
/// before the request could look up the version it names.
const ON_DEMAND_LOADS: usize = 3;

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
    /// Everything at start, as `None`, and the repository is looked at again every so often:
    /// models added to it load, models changed in it load again, models removed from it unload
    /// (Triton's `poll` mode; see [`ModelManager::spawn_repository_poll`]). No load or unload
    /// API, as Triton.
    Poll,
}

impl ControlMode {
    /// Whether every model loads at start and the repository API neither loads nor unloads.
    pub fn loads_everything(self) -> bool {
        matches!(self, ControlMode::None | ControlMode::Poll)
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
    /// What a version of it held per device once it had grown while serving (see [`growth`]):
    /// a later load of the same version is reserved and booked at that from the start.
    served: Option<(String, u64)>,
    usage: Arc<Usage>,
    /// Successful loads and evictions since the server started.
    loads: u64,
    evictions: u64,
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
            served: None,
            usage: Arc::default(),
            loads: 0,
            evictions: 0,
        }
    }

    /// What `version` of it held per device when it last grew while serving.
    fn served(&self, version: &str) -> Option<u64> {
        self.served
            .as_ref()
            .filter(|(v, _)| v == version)
            .map(|&(_, held)| held)
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

/// The batch sizes that complete the configurations that give none: one for every model, and
/// one per backend (`python`, `onnxruntime`), which comes first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefaultBatchSizes {
    pub every: Option<usize>,
    pub per_backend: Vec<(String, usize)>,
}

impl DefaultBatchSizes {
    /// The size for a model whose file is `file` (`model.py`: python, `model.onnx`:
    /// onnxruntime), if one is set.
    fn size_for(&self, file: &str) -> Option<usize> {
        let backend = match file.rsplit('.').next() {
            Some("py") => "python",
            Some("onnx") => "onnxruntime",
            _ => "",
        };
        self.per_backend
            .iter()
            .find(|(b, _)| b == backend)
            .map(|(_, n)| *n)
            .or(self.every)
    }
}

/// All models of one server.
pub struct ModelManager {
    backends: Vec<Arc<dyn Backend>>,
    metrics: Arc<Metrics>,
    devices: Vec<DeviceSpec>,
    routing: Routing,
    control: ControlMode,
    /// Models to load at start besides the `preload: true` ones (`*`: all).
    load_at_start: Vec<String>,
    /// Readiness also needs every model whose load was tried to serve (Triton's
    /// `--strict-readiness`).
    strict_readiness: bool,
    /// Whether models' configurations are completed from the models (Triton's auto-complete).
    auto_complete: bool,
    /// Whether `/metrics` shows the host's CPU and memory (`nv_cpu_*`), and the GPUs' series
    /// of the device gauges (`--allow-cpu-metrics`, `--allow-gpu-metrics`).
    cpu_metrics: bool,
    gpu_metrics: bool,
    /// The batch sizes models without one are completed with (`--backend-config`).
    default_batch: DefaultBatchSizes,
    /// The rate limiter, when `--rate-limit execution_count` is on.
    rate: Option<Arc<crate::rate_limit::RateLimiter>>,
    /// The custom Triton configuration read where a model folder has it (Triton's
    /// `--model-config-name`).
    config_name: Option<String>,
    /// Most models loading at once at start; 0: all of them.
    start_loads: usize,
    /// How many times a failed load is tried again (Triton's `--model-load-retry-count`).
    load_retries: usize,
    /// The model repositories (Triton's `--model-repository`, given once or more).
    repositories: RwLock<Vec<PathBuf>>,
    /// Repositories registered while the server runs ([`registered`]), after `repositories`.
    registered: RwLock<Vec<registered::Registered>>,
    models: RwLock<BTreeMap<String, Entry>>,
    started: AtomicBool,
    ledger: Ledger,
    /// Models the server configuration lists outside the repository.
    listed: BTreeMap<String, ListedModel>,
    /// Loads under way, and loads begun since the start: a memory measurement is trusted only
    /// when no other load overlapped it.
    loads_in_flight: AtomicUsize,
    loads_begun: AtomicUsize,
    /// One per device, taken by loads on CUDA devices: loads on one GPU run one at a time, so
    /// that the driver's figure measures each of them even when many load at once.
    gpu_loads: Vec<tokio::sync::Mutex<()>>,
    epoch: std::time::Instant,
    epoch_unix_ms: u64,
    /// The response cache, when the configuration gives it room.
    cache: Option<Arc<crate::cache::ResponseCache>>,
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
        let devices = config.device_specs()?;
        Ok(ModelManager {
            metrics: Arc::new(Metrics::with_custom(
                backends.iter().filter_map(|b| b.custom_metrics()).collect(),
            )),
            gpu_loads: devices
                .iter()
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            devices,
            routing: config.routing,
            control: ControlMode::None,
            load_at_start: Vec::new(),
            strict_readiness: false,
            auto_complete: true,
            rate: None,
            default_batch: DefaultBatchSizes::default(),
            cpu_metrics: true,
            gpu_metrics: true,
            config_name: None,
            start_loads: 0,
            load_retries: 0,
            repositories: RwLock::new(Vec::new()),
            registered: RwLock::new(Vec::new()),
            backends,
            models: RwLock::new(BTreeMap::new()),
            started: AtomicBool::new(false),
            ledger: Ledger::new(config),
            listed: config.models.clone(),
            loads_in_flight: AtomicUsize::new(0),
            loads_begun: AtomicUsize::new(0),
            epoch: std::time::Instant::now(),
            cache: (config.response_cache_bytes > 0).then(|| {
                Arc::new(crate::cache::ResponseCache::new(
                    usize::try_from(config.response_cache_bytes).unwrap_or(usize::MAX),
                ))
            }),
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

    /// Names models to load at start besides the `preload: true` ones, as Triton's
    /// `--load-model` (`*`: every model), in the `explicit` and `on_demand` modes (before
    /// `load_repository`).
    pub fn with_load_at_start(mut self, names: Vec<String>) -> ModelManager {
        self.load_at_start = names;
        self
    }

    /// At most `loads` models load at once at start (Triton's `--model-load-thread-count`); 0,
    /// the default: all of them.
    pub fn with_start_loads(mut self, loads: usize) -> ModelManager {
        self.start_loads = loads;
        self
    }

    /// Tries a failed load `retries` more times before the model is failed (Triton's
    /// `--model-load-retry-count`): for loads that fail now and then (a file still being
    /// written, a device briefly short of memory).
    pub fn with_load_retries(mut self, retries: usize) -> ModelManager {
        self.load_retries = retries;
        self
    }

    /// With `strict`, the server is ready only while no model's last load failed (Triton's
    /// `--strict-readiness`); without, once the repository is loaded.
    pub fn with_strict_readiness(mut self, strict: bool) -> ModelManager {
        self.strict_readiness = strict;
        self
    }

    /// With `complete` off, no model's configuration is completed from its model (Triton's
    /// `--disable-auto-complete-config`; see [`crate::ModelConfig::auto_complete`]).
    pub fn with_auto_complete(mut self, complete: bool) -> ModelManager {
        self.auto_complete = complete;
        self
    }

    /// Shows or leaves out of `/metrics` the host's CPU and memory gauges (`nv_cpu_*`) and the
    /// GPUs' series of the device memory gauges (tritonserver's `--allow-cpu-metrics` and
    /// `--allow-gpu-metrics`; both on by default).
    pub fn with_host_metrics(mut self, cpu: bool, gpu: bool) -> ModelManager {
        self.cpu_metrics = cpu;
        self.gpu_metrics = gpu;
        self
    }

    /// Completes a batchable model whose configuration gives no `max_batch_size` with
    /// `sizes`' (tritonserver's `--backend-config default-max-batch-size=N`) rather than
    /// [`crate::config::DEFAULT_MAX_BATCH_SIZE`].
    pub fn with_default_max_batch_sizes(mut self, sizes: DefaultBatchSizes) -> ModelManager {
        self.default_batch = sizes;
        self
    }

    /// Rate-limits the instances of models that declare resources, with these counts
    /// (`--rate-limit execution_count`, `--rate-limit-resource`); `None`: off, every
    /// `rate_limiter` ignored (Triton's default).
    pub fn with_rate_limit(
        mut self,
        counts: Option<Vec<crate::rate_limit::ResourceCount>>,
    ) -> ModelManager {
        self.rate = counts.map(|c| Arc::new(crate::rate_limit::RateLimiter::new(c)));
        self
    }

    /// Reads `configs/<name>.pbtxt` over a model folder's own configuration wherever the folder
    /// has it (Triton's `--model-config-name`; see [`repository::triton_config_path`]).
    pub fn with_config_name(mut self, name: Option<String>) -> ModelManager {
        self.config_name = name;
        self
    }

    /// The model repositories, in the order given.
    pub(super) fn repositories(&self) -> Vec<PathBuf> {
        self.repositories
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The models whose last load failed, with the reason.
    pub fn failed(&self) -> Vec<(String, String)> {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(name, e)| match &e.status {
                ModelStatus::Failed { reason, .. } => Some((name.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn control(&self) -> ControlMode {
        self.control
    }

    /// Registers every model under `dir` and loads those the control mode loads at start
    /// (all of them in `none`; `preload: true` ones otherwise). Failures are recorded per model;
    /// only an unreadable repository is an error. Marks the server ready when done.
    pub async fn load_repository(&self, dir: &Path) -> Result<(), String> {
        self.load_models(&[dir.to_path_buf()]).await
    }

    /// As [`ModelManager::load_repository`], for the models of the repositories `dirs` (none,
    /// one or more) and those the server configuration lists.
    pub async fn load_models(&self, dirs: &[PathBuf]) -> Result<(), String> {
        *self.repositories.write().unwrap_or_else(|e| e.into_inner()) = dirs.to_vec();
        let found = self.scan()?;
        if found.is_empty() {
            tracing::warn!(repositories = ?dirs, "there are no models to serve");
        }
        if let Some(unknown) = self
            .load_at_start
            .iter()
            .find(|n| *n != "*" && !found.iter().any(|m| &m.name == *n))
        {
            let names: Vec<&str> = found.iter().map(|m| m.name.as_str()).collect();
            return Err(format!(
                "--load-model '{unknown}': no such model (the models are {})",
                names.join(", ")
            ));
        }
        let mut at_start = Vec::new();
        {
            let mut models = self.write();
            for m in found {
                let preload = m.config.as_ref().map_or(true, |c| c.preload)
                    || self.load_at_start.iter().any(|n| n == "*" || *n == m.name);
                if self.control.loads_everything() || preload {
                    at_start.push(m.name.clone());
                }
                models.insert(m.name.clone(), Entry::new(m));
            }
        }
        // In `explicit` and `on_demand`, a pipeline loaded at start loads its step models (in
        // `none`, every model loads anyway).
        use futures::StreamExt as _;
        let at_once = match self.start_loads {
            0 => at_start.len().max(1),
            n => n,
        };
        futures::stream::iter(&at_start)
            .for_each_concurrent(at_once, |name| async move {
                if let Ok(handle) = self.load_now(name).await {
                    if !self.control.loads_everything() {
                        let _ = self.load_steps(&handle).await;
                    }
                }
            })
            .await;
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether every model of the repositories `dirs` and the listed ones fits the ledger's
    /// limits at once, and the memory they need in all (estimated, before loading anything).
    pub fn all_fit(&self, dirs: &[PathBuf]) -> Result<(bool, u64), String> {
        *self.repositories.write().unwrap_or_else(|e| e.into_inner()) = dirs.to_vec();
        let found = self.scan()?;
        let spread = match self.ledger.strategy {
            crate::server_config::AssignmentStrategy::All => self.devices.len() as u64,
            _ => 1,
        };
        let need: u64 = found.iter().map(|m| self.estimate(m).0 * spread).sum();
        let l = &self.ledger;
        let devices = self.devices.len() as u64;
        let fits = (l.max_models == 0 || found.len() <= l.max_models)
            && (l.max_memory == 0 || need <= l.max_memory)
            && (l.device_budget == 0 || need <= l.device_budget * devices);
        Ok((fits, need))
    }

    /// The repositories' models, then the listed ones (a listed model replaces a repository
    /// model of the same name). A name found in two repositories is a model that fails, saying
    /// where it is, as under Triton.
    fn scan(&self) -> Result<Vec<RepoModel>, String> {
        let dirs = self.repositories();
        let mut files: Vec<&'static str> = self.backends.iter().map(|b| b.model_file()).collect();
        files.push(crate::pipeline::PIPELINE_FILE);
        // No repository and no listed models: a gateway in front of a queue serves none itself.
        let mut found: Vec<RepoModel> = Vec::new();
        // Each name's place in `found`, to find one in two repositories.
        let mut at: HashMap<String, usize> = HashMap::new();
        let registered = self.registered();
        let dirs = dirs
            .iter()
            .map(|d| (d.as_path(), None))
            .chain(registered.iter().map(|r| (r.dir.as_path(), Some(&r.names))));
        for (dir, names) in dirs {
            for mut m in repository::scan(dir, &files, self.config_name.as_deref())? {
                if let Some(name) = names.and_then(|n| n.get(&m.name)) {
                    m.name = name.clone();
                }
                match at.get(&m.name).and_then(|&i| found.get_mut(i)) {
                    Some(first) => {
                        first.config = Err(format!(
                            "model '{}' is in more than one model repository ({} and {}): \
                             rename one of the two folders",
                            m.name,
                            first.path.display(),
                            m.path.display()
                        ))
                    }
                    None => {
                        at.insert(m.name.clone(), found.len());
                        found.push(m);
                    }
                }
            }
        }
        for (name, listed) in &self.listed {
            if found.iter().any(|m| &m.name == name) {
                tracing::warn!(model = %name, path = %listed.model_path.display(), "the server configuration lists a model the repository also holds; serving the listed file");
                found.retain(|m| &m.name != name);
            }
            found.push(listed_model(name, listed, &files));
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        for m in &mut found {
            if let Ok(config) = &mut m.config {
                config.auto_complete = self.auto_complete;
                if let Some(n) = self.default_batch.size_for(m.file) {
                    config.default_max_batch_size = n;
                }
            }
        }
        Ok(found)
    }

    /// Whether the repository API may load and unload models: not in the `none` and `poll`
    /// control modes.
    pub fn check_control(&self) -> Result<(), InferError> {
        match self.control {
            ControlMode::None => Err(InferError::invalid(
                "model control mode is 'none': every model loads at start and stays loaded; run \
                 sheaf serve with --model-control-mode explicit or on_demand to load and unload \
                 models",
            )),
            ControlMode::Poll => Err(InferError::invalid(
                "model control mode is 'poll': the repository's own changes load and unload \
                 models (add, change or remove a model's folder); run sheaf serve with \
                 --model-control-mode explicit or on_demand to load and unload them through the \
                 API",
            )),
            ControlMode::Explicit | ControlMode::OnDemand => Ok(()),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The devices models are placed on.
    pub fn devices(&self) -> &[DeviceSpec] {
        &self.devices
    }

    /// The ready model `name`, at `version` if given.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelHandle>, InferError> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let entry = models.get(name).ok_or_else(|| not_found(name))?;
        let status = &entry.status;
        if let Some(v) = version.filter(|v| !v.is_empty() && *v != status.version()) {
            // An older version its version policy serves beside the newest.
            if let ModelStatus::Ready(h) = status {
                if let Some(older) = h.older_version(v) {
                    return Ok(older.clone());
                }
            }
            if !entry.repo.older.iter().any(|(older, _)| older == v) {
                let served = match status {
                    ModelStatus::Ready(h) => h.served_versions(),
                    _ => vec![status.version().to_string()],
                };
                return Err(InferError::new(
                    ErrorKind::ModelNotFound,
                    format!(
                        "unknown version '{}' of model '{name}' ({} '{}' {} served)",
                        crate::clip(v),
                        if served.len() == 1 {
                            "version"
                        } else {
                            "versions"
                        },
                        served.join("', '"),
                        if served.len() == 1 { "is" } else { "are" },
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
                match self.control {
                    ControlMode::OnDemand => {
                        format!("model '{name}' is not loaded (an inference request loads it)")
                    }
                    _ => {
                        format!("model '{name}' is not loaded (load it through the repository API)")
                    }
                },
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
        let handle = self.loaded(name, version).await?;
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

    /// [`ModelManager::get_or_load`] without counting a use: for a look at the model before
    /// the request that uses it (which counts it) is made.
    pub async fn loaded(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<ModelHandle>, InferError> {
        let mut loads = 0;
        loop {
            match self.get(name, version) {
                Err(e)
                    if self.control == ControlMode::OnDemand
                        && e.kind == ErrorKind::NotReady
                        && loads < ON_DEMAND_LOADS =>
                {
                    // The status now: it may have changed since `get` read it.
                    let now = self
                        .models
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(name)
                        .map(|e| match e.status {
                            ModelStatus::Unloaded { .. } | ModelStatus::Loading { .. } => {
                                Some(true)
                            }
                            ModelStatus::Ready(_) => Some(false),
                            _ => None,
                        });
                    match now.flatten() {
                        Some(true) => {}
                        // A load that ended in between: looked up again.
                        Some(false) => {
                            loads += 1;
                            continue;
                        }
                        None => return Err(e),
                    }
                    // Boxed: the load's state is large, and every request's future would
                    // otherwise carry (and copy) room for it.
                    let handle = Box::pin(self.load_now(name)).await?;
                    if version.is_none_or(|v| v.is_empty() || v == handle.version) {
                        return Ok(handle);
                    }
                    // Another version: looked up once the load has ended. If another load
                    // evicted the model in between, it is loaded again.
                    loads += 1;
                }
                other => return other,
            }
        }
    }

    /// Runs `raw` on `handle`: a model's batcher, or a pipeline's steps (whose models come from
    /// this manager).
    pub fn infer<'a>(
        &'a self,
        handle: &'a ModelHandle,
        raw: crate::RawRequest,
    ) -> futures::future::BoxFuture<'a, Result<crate::InferResponse, InferError>> {
        Box::pin(async move {
            match &handle.pipeline {
                Some(p) => handle.run_pipeline(p, raw, self).await,
                None => handle.infer(raw).await,
            }
        })
    }

    /// Runs `raw` on a streaming model's `handle` ([`ModelHandle::streams`]), or on a pipeline
    /// with a model step that streams ([`ModelManager::streams`]): its responses as they come.
    pub async fn infer_stream<'a>(
        &'a self,
        handle: &'a Arc<ModelHandle>,
        raw: crate::RawRequest,
    ) -> Result<futures::stream::BoxStream<'a, Result<crate::InferResponse, InferError>>, InferError>
    {
        match &handle.pipeline {
            Some(p) => p.run_stream(&handle.name, &handle.version, raw, self).await,
            None => handle.clone().infer_stream(raw).await,
        }
    }

    /// Whether `handle` answers a request with a stream of responses: a streaming model, or a
    /// pipeline with a model step that is one (its models are loaded to find out; a model that
    /// cannot load counts as not streaming, and its request fails on the unary path).
    pub async fn streams(&self, handle: &ModelHandle) -> bool {
        match &handle.pipeline {
            Some(p) => p.streams(self).await,
            None => handle.streams,
        }
    }

    /// The loaded text encoders (models with an `embedding` section), by name.
    pub fn encoders(&self) -> Vec<String> {
        self.ready_where(ModelHandle::is_encoder)
    }

    /// The loaded generation models, by name.
    pub fn generators(&self) -> Vec<String> {
        self.ready_where(ModelHandle::is_generator)
    }

    /// The generation models a request may name: the loaded ones and, in the `on_demand`
    /// control mode, those its first request would load (a `*.gguf` model not loaded yet).
    pub fn offered_generators(&self) -> Vec<String> {
        self.offered(ModelHandle::is_generator, |repo| repo.file == "*.gguf")
    }

    /// The text encoders a request may name: the loaded ones and, in the `on_demand` control
    /// mode, those its first request would load (a model with an `embedding` section).
    pub fn offered_encoders(&self) -> Vec<String> {
        self.offered(ModelHandle::is_encoder, |repo| {
            repo.config.as_ref().is_ok_and(|c| c.embedding.is_some())
        })
    }

    /// The models of one kind that are ready (`loaded` says which are of it), and in the
    /// `on_demand` mode those a request would load or is loading (`listed` says from the
    /// repository which are of it).
    fn offered(
        &self,
        loaded: impl Fn(&ModelHandle) -> bool,
        listed: impl Fn(&RepoModel) -> bool,
    ) -> Vec<String> {
        let on_demand = self.control == ControlMode::OnDemand;
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        // By name, as the map keeps them.
        models
            .iter()
            .filter(|(_, entry)| match &entry.status {
                ModelStatus::Ready(h) => loaded(h),
                ModelStatus::Unloaded { .. } | ModelStatus::Loading { .. } => {
                    on_demand && listed(&entry.repo)
                }
                _ => false,
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn ready_where(&self, kind: impl Fn(&ModelHandle) -> bool) -> Vec<String> {
        self.offered(kind, |_| false)
    }

    /// Every model with its status, by name.
    pub fn list(&self) -> Vec<(String, ModelStatus)> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models
            .iter()
            .map(|(k, v)| (k.clone(), v.status.clone()))
            .collect()
    }

    /// `text` without the server's own folders: the repository's, and those of the models the
    /// configuration lists, so that a client reads `mlp/model.onnx` where the log has the
    /// absolute path.
    pub fn redact(&self, text: &str) -> String {
        let mut roots: Vec<PathBuf> = Vec::new();
        for dir in self.repositories() {
            roots.extend(dir.canonicalize().ok());
            roots.push(dir);
        }
        for listed in self.listed.values() {
            if let Some(folder) = listed.model_path.parent() {
                roots.extend(folder.canonicalize().ok());
                roots.push(folder.to_path_buf());
            }
        }
        // The longest first, so that a folder inside another is taken out whole.
        let mut roots: Vec<String> = roots
            .iter()
            .map(|r| r.to_string_lossy().trim_end_matches('/').to_string())
            .filter(|r| !r.is_empty())
            .collect();
        roots.sort_by_key(|r| std::cmp::Reverse(r.len()));
        roots.iter().fold(text.to_string(), |t, root| {
            t.replace(&format!("{root}/"), "")
        })
    }

    /// True once the repository has been registered and its start-up loads have ended; with
    /// strict readiness ([`ModelManager::with_strict_readiness`]), while no model's last load
    /// failed.
    pub fn is_ready(&self) -> bool {
        self.started.load(Ordering::Acquire) && !(self.strict_readiness && self.any_failed())
    }

    fn any_failed(&self) -> bool {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|e| matches!(e.status, ModelStatus::Failed { .. }))
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
        older: Vec::new(),
        uploaded: None,
    }
}

fn not_found(name: &str) -> InferError {
    InferError::new(
        ErrorKind::ModelNotFound,
        format!("unknown model '{}'", crate::clip(name)),
    )
}
