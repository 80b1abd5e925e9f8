//! Loading and unloading: coalesced loads with room made in the ledger, drained unloads, and
//! idle unloading, for every kind of model.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{ledger, not_found, Entry, MemorySource, ModelManager, ModelStatus, MIB};
use crate::metrics::LifecycleLabels;
use crate::model::Placement;
use crate::repository::RepoModel;
use crate::server_config::DeviceSpec;
use crate::{ErrorKind, InferError, ModelHandle};

/// How long a load waits for a busy model to become evictable before it gives up (the models
/// that could make room may be answering their last requests).
const ROOM_WAIT: Duration = Duration::from_secs(2);

impl ModelManager {
    /// Loads `name` (re-reading its folder), or waits for the load already under way. A
    /// pipeline's (an ensemble's) step models load with it, as Triton loads an ensemble's
    /// composing models; when one cannot, the pipeline is not available either.
    pub async fn load(&self, name: &str) -> Result<Arc<ModelHandle>, InferError> {
        self.check_control()?;
        let handle = self.load_one(name, None).await?;
        self.load_steps(&handle).await?;
        Ok(handle)
    }

    /// [`ModelManager::load`] with `config` in place of the configuration file in the model's
    /// folder (Triton's load with a `config` parameter); the model's files still come from its
    /// folder. The model serves with it until it is loaded again (a later load without one
    /// reads the folder's file again). A pipeline (an ensemble) loads from its folder only.
    pub async fn load_with_config(
        &self,
        name: &str,
        config: crate::ModelConfig,
    ) -> Result<Arc<ModelHandle>, InferError> {
        self.check_control()?;
        self.load_one(name, Some(config)).await
    }

    /// Loads the models `handle`'s steps run, if it is a pipeline, those not loaded yet; when
    /// one cannot load, the pipeline is unloaded and marked failed with the reason.
    pub(super) async fn load_steps(&self, handle: &ModelHandle) -> Result<(), InferError> {
        let Some(pipeline) = &handle.pipeline else {
            return Ok(());
        };
        for model in pipeline.models() {
            if self.get(model, None).is_ok() {
                continue;
            }
            // A step may be a pipeline too; one already loaded is not entered again, so
            // pipelines that name each other end.
            let Err(e) = Box::pin(self.load(model)).await else {
                continue;
            };
            let reason = format!("its step model '{model}' did not load: {}", e.message);
            let _ = self
                .unload_for(&handle.name, "a step model did not load")
                .await;
            if let Some(entry) = self.write().get_mut(&handle.name) {
                entry.status = ModelStatus::Failed {
                    version: handle.version.clone(),
                    reason: reason.clone(),
                };
            }
            return Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{}' is not available: {reason}", handle.name),
            ));
        }
        Ok(())
    }

    /// [`ModelManager::load`] of `name` alone: a loaded model is loaded again from its folder
    /// ([`ModelManager::reload`]).
    pub(super) async fn load_one(
        &self,
        name: &str,
        config: Option<crate::ModelConfig>,
    ) -> Result<Arc<ModelHandle>, InferError> {
        // The model may have been added to the repository since the start.
        self.load_found(name, config, self.scan()).await
    }

    /// [`ModelManager::load_with_config`] from the files the load request sent (Triton's
    /// `file:` parameters), written into a folder of their own ([`crate::uploaded`]) that
    /// stands for the model's folder: the model loads from them, whether or not the repository
    /// has it, and serves from them until it is loaded again (a later load without files reads
    /// its repository folder again).
    pub async fn load_with_files(
        &self,
        name: &str,
        config: crate::ModelConfig,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<Arc<ModelHandle>, InferError> {
        self.check_control()?;
        let model = name.to_string();
        let uploaded =
            tokio::task::spawn_blocking(move || crate::uploaded::Uploaded::write(&model, &files))
                .await
                .map_err(|e| {
                    InferError::internal(format!("writing the load's files stopped: {e}"))
                })??;
        let kinds: Vec<&'static str> = self.backends.iter().map(|b| b.model_file()).collect();
        let found = crate::repository::scan(uploaded.root(), &kinds, None)
            .map_err(InferError::internal)?
            .into_iter()
            .find(|m| m.name == name)
            .ok_or_else(|| {
                InferError::invalid(format!(
                    "the load's files hold no model file sheaf runs for '{}' ({}), in the \
                     model's folder or a version folder (file:1/model.onnx)",
                    crate::clip(name),
                    kinds.join(", ")
                ))
            })?;
        let uploaded = Some(Arc::new(uploaded));
        let found = RepoModel { uploaded, ..found };
        self.load_found(name, Some(config), Ok(vec![found])).await
    }

    /// Loads `name` as `found` (the repository's models, or the uploaded one) has it, with
    /// `config` over its folder's configuration when one is given.
    async fn load_found(
        &self,
        name: &str,
        config: Option<crate::ModelConfig>,
        found: Result<Vec<RepoModel>, String>,
    ) -> Result<Arc<ModelHandle>, InferError> {
        let mut fresh = None;
        if let (Some(config), Ok(found)) = (&config, &found) {
            match found.iter().find(|m| m.name == name) {
                Some(m) if m.file == crate::pipeline::PIPELINE_FILE => {
                    return Err(InferError::invalid(format!(
                        "model '{name}' is a pipeline (an ensemble), which loads from its \
                         folder's configuration only: load it without a config"
                    )))
                }
                Some(_) => {
                    tracing::info!(model = name, max_batch_size = ?config.max_batch_size, "loading with the configuration the request gave")
                }
                None => return Err(not_found(name)),
            }
        }
        if let Ok(found) = found {
            let mut models = self.write();
            for mut m in found.into_iter().filter(|m| m.name == name) {
                if let Some(config) = &config {
                    // Its version policy (or its absence: the newest) replaces the folder's.
                    crate::repository::repick_versions(&mut m, config.version_policy.as_ref())
                        .map_err(InferError::invalid)?;
                    m.config = Ok(crate::ModelConfig {
                        auto_complete: self.auto_complete,
                        ..config.clone()
                    });
                }
                match models.get_mut(name) {
                    Some(e) if matches!(e.status, ModelStatus::Ready(_)) => fresh = Some(m),
                    // A load under way has its configuration already: the one given here would
                    // not be the one that serves.
                    Some(e)
                        if matches!(e.status, ModelStatus::Loading { .. }) && config.is_some() =>
                    {
                        return Err(InferError::new(
                            ErrorKind::NotReady,
                            format!(
                                "model '{name}' is loading; load it with the configuration once \
                                 that load is done"
                            ),
                        ))
                    }
                    Some(e) if matches!(e.status, ModelStatus::Loading { .. }) => {}
                    Some(e) => e.repo = m,
                    None => {
                        models.insert(name.to_string(), Entry::new(m));
                    }
                }
            }
        }
        match fresh {
            Some(repo) => self.reload(name, repo).await,
            None => self.load_now(name).await,
        }
    }

    /// Loads a loaded model again from `repo` (its folder read anew), as Triton does when a
    /// loaded model is asked to load: the new one is loaded on the devices the old one holds
    /// while the old one serves, then takes its place; requests already admitted finish on
    /// the old one, which is dropped after them. When the new one fails, the old one stays,
    /// and the error says why. Concurrent reloads of one model wait for each other. The model
    /// is booked at the new one's size ([`ModelManager::rebook_reloaded`]).
    async fn reload(&self, name: &str, repo: RepoModel) -> Result<Arc<ModelHandle>, InferError> {
        let (old, done, targets) = loop {
            // None: no longer loaded (unloaded or evicted meanwhile), so loaded as any model.
            let waiter = {
                let mut models = self.write();
                let entry = models.get_mut(name).ok_or_else(|| not_found(name))?;
                match (&entry.status, entry.loading.clone()) {
                    (ModelStatus::Ready(_), Some(waiter)) => Some(waiter),
                    (ModelStatus::Ready(old), None) => {
                        let old = old.clone();
                        let (tx, rx) = watch::channel(());
                        entry.loading = Some(rx);
                        break (old, tx, entry.devices.clone());
                    }
                    _ => None,
                }
            };
            match waiter {
                Some(mut waiter) => {
                    let _ = waiter.changed().await;
                }
                None => return self.load_now(name).await,
            }
        };
        let (status, measured) = self.load_entry(repo.clone(), &targets).await;
        let mut evicted = Vec::new();
        let outcome = {
            let mut models = self.write();
            let entry = models.get_mut(name).ok_or_else(|| not_found(name))?;
            entry.loading = None;
            let still = matches!(&entry.status, ModelStatus::Ready(h) if Arc::ptr_eq(h, &old));
            match status {
                ModelStatus::Ready(new) if still => {
                    match self.rebook_reloaded(&mut models, name, &new, measured, &targets) {
                        Ok(out) => {
                            evicted = out;
                            if let Some(entry) = models.get_mut(name) {
                                entry.status = ModelStatus::Ready(new.clone());
                                entry.repo = repo;
                                entry.loads += 1;
                            }
                            Ok(new)
                        }
                        Err(reason) => Err(InferError::new(
                            ErrorKind::NotReady,
                            format!(
                                "model '{name}' did not load again, and serves as before: {reason}"
                            ),
                        )),
                    }
                }
                ModelStatus::Ready(_) => Err(InferError::new(
                    ErrorKind::NotReady,
                    format!("model '{name}' was unloaded while it loaded again"),
                )),
                other => Err(InferError::new(
                    ErrorKind::NotReady,
                    format!(
                        "model '{name}' did not load again, and serves as before: {}",
                        other.reason().unwrap_or("load failed")
                    ),
                )),
            }
        };
        let _ = done.send(());
        drop(evicted);
        if outcome.is_ok() {
            tracing::info!(
                model = name,
                "model loaded again; the one before finishes its requests"
            );
        }
        // The old handle goes once the requests that hold it are answered.
        drop(old);
        outcome
    }

    pub(super) async fn load_now(&self, name: &str) -> Result<Arc<ModelHandle>, InferError> {
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
                        let (need, source) =
                            match (self.estimate(&repo), entry.served(&repo.version)) {
                                ((need, source), Some(held))
                                    if held > need && source != MemorySource::Config =>
                                {
                                    (held, MemorySource::Serving)
                                }
                                (estimate, _) => estimate,
                            };
                        let preferred = repo
                            .config
                            .as_ref()
                            .ok()
                            .and_then(|c| c.preferred_device.clone());
                        // Room is made, and reserved, under the same lock: concurrent loads
                        // can never overcommit the ledger.
                        let one_device = self.generates(&repo);
                        let admitted = self
                            .ledger
                            .place(&models, &self.devices, name, need, preferred.as_deref())
                            .map(|mut targets| {
                                // An engine serves from one device.
                                if one_device {
                                    targets.truncate(1);
                                }
                                targets
                            })
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
            let mut tries = 0;
            let (status, measured) = loop {
                let (status, measured) = self.load_entry(repo.clone(), &targets).await;
                match &status {
                    ModelStatus::Failed { reason, .. } if tries < self.load_retries => {
                        tries += 1;
                        tracing::warn!(model = name, reason = %reason, retry = tries, of = self.load_retries, "load failed; trying again (--model-load-retry-count)");
                    }
                    _ => break (status, measured),
                }
            };
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
    /// device when the load ran alone (see [`ledger::memory_in_use`]). On GPUs it always does:
    /// it waits for the other loads on the same GPUs, and the CPU's loads do not show in the
    /// driver's figure.
    async fn load_entry(&self, model: RepoModel, targets: &[usize]) -> (ModelStatus, Option<u64>) {
        let started = std::time::Instant::now();
        let devices: Vec<DeviceSpec> = targets
            .iter()
            .filter_map(|&i| self.devices.get(i).cloned())
            .collect();
        let on_gpus = !devices.is_empty()
            && devices
                .iter()
                .all(|d| matches!(d.device, sheaf_backend::Device::Cuda(_)));
        let mut gpus_held = Vec::new();
        if on_gpus {
            let mut order = targets.to_vec();
            order.sort_unstable();
            order.dedup();
            for i in order {
                if let Some(lock) = self.gpu_loads.get(i) {
                    gpus_held.push(lock.lock().await);
                }
            }
        }
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
            (Ok(config), None) if model.file == crate::pipeline::PIPELINE_FILE => {
                ModelHandle::load_pipeline(
                    &model.name,
                    &model.version,
                    model.path.clone(),
                    config,
                    self.metrics.clone(),
                    self.cache.clone(),
                )
                .map_err(|e| e.to_string())
            }
            (_, None) => Err(format!("no backend loads {}", model.file)),
            (Ok(config), Some(backend)) => {
                // The newest version, then each older one its version policy names (oldest
                // first), each with instances of its own on the same devices; one that fails
                // fails them all.
                let load = |version: String, path: std::path::PathBuf| {
                    let (name, config) = (&model.name, config.clone());
                    let placement = Placement {
                        backend: backend.clone(),
                        devices: &devices,
                        routing: self.routing,
                        metrics: self.metrics.clone(),
                        cache: self.cache.clone(),
                        rate: self.rate.clone(),
                    };
                    async move { ModelHandle::load(name, &version, path, config, placement).await }
                };
                let mut loaded = load(model.version.clone(), model.path.clone())
                    .await
                    .map_err(|e| e.to_string());
                for (version, path) in &model.older {
                    let Ok(newest) = &mut loaded else { break };
                    match load(version.clone(), path.clone()).await {
                        Ok(older) => {
                            newest.memory_bytes += older.memory_bytes;
                            newest.older.push(Arc::new(older));
                        }
                        Err(e) => loaded = Err(format!("version {version}: {e}")),
                    }
                }
                loaded
            }
        };
        let after = ledger::memory_in_use(&devices);
        drop(gpus_held);
        let alone = on_gpus || (alone && self.loads_begun.load(Ordering::SeqCst) == begun);
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
                let mut handle = handle;
                handle.uploaded = model.uploaded.clone();
                ModelStatus::Ready(Arc::new(handle))
            }
            Err(reason) => {
                tracing::error!(model = %model.name, %reason, "model failed to load");
                ModelStatus::Failed {
                    version: model.version,
                    reason: self.redact(&reason),
                }
            }
        };
        (status, measured)
    }

    /// Books `name`, loaded again as `new` while the model before it serves, at the new one's
    /// size ([`booking`]): a smaller one frees what the old one held, and a larger one must
    /// fit, evicting idle models if need be, or the reload fails with why (the old one stays
    /// booked as it was). Returns the models evicted, to be dropped once the lock is released.
    fn rebook_reloaded(
        &self,
        models: &mut std::collections::BTreeMap<String, Entry>,
        name: &str,
        new: &ModelHandle,
        measured: Option<u64>,
        targets: &[usize],
    ) -> Result<Vec<Arc<ModelHandle>>, String> {
        let entry = models.get_mut(name).ok_or("the model is gone")?;
        let (size, source) = booking(entry, new, measured);
        if size > entry.reserved {
            let admitted = self
                .room_for(models, name, size, targets)
                .ok_or("the model is gone")?;
            let evicted = admitted.map_err(|e| {
                format!(
                    "it holds {} MiB per device once loaded ({}), and does not fit: {}",
                    size / MIB,
                    source.name(),
                    e.message
                )
            })?;
            let entry = models.get_mut(name).ok_or("the model is gone")?;
            entry.reserved = size;
            entry.memory_source = source;
            return Ok(evicted);
        }
        entry.reserved = size;
        entry.memory_source = source;
        Ok(Vec::new())
    }

    /// Makes room in the ledger for `name`, which is loaded, to hold `size` bytes per device on
    /// `on`, evicting idle models if need be: it is out of the ledger meanwhile (under the same
    /// lock), so that it neither counts against itself nor is a candidate for eviction, and is
    /// back as it was (status, booking, devices) when this returns; the caller books the new
    /// size. `None` if the model is gone.
    pub(super) fn room_for(
        &self,
        models: &mut std::collections::BTreeMap<String, Entry>,
        name: &str,
        size: u64,
        on: &[usize],
    ) -> Option<Result<Vec<Arc<ModelHandle>>, InferError>> {
        let entry = models.get_mut(name)?;
        let (held, kept) = (entry.reserved, std::mem::take(&mut entry.devices));
        entry.reserved = 0;
        let version = entry.status.version().to_string();
        let serving = std::mem::replace(&mut entry.status, ModelStatus::Unloaded { version });
        let admitted = self
            .ledger
            .make_room(models, &self.devices, name, size, on, &self.metrics);
        let entry = models.get_mut(name)?;
        entry.status = serving;
        entry.reserved = held;
        entry.devices = kept;
        Some(admitted)
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
        let (size, source) = booking(entry, handle, measured);
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

    /// Unloads `name` as [`ModelManager::unload`] does; a pipeline's step models as well
    /// (Triton's `unload_dependents`), except those a step of another loaded pipeline.
    pub async fn unload_with_steps(&self, name: &str) -> Result<(), InferError> {
        self.check_control()?;
        let steps: Vec<String> = match self.get(name, None) {
            Ok(h) => h
                .pipeline
                .as_ref()
                .map(|p| p.models().into_iter().map(str::to_string).collect())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        self.unload_for(name, "requested").await?;
        for step in steps {
            let used = self.list().into_iter().any(|(_, status)| {
                matches!(status, ModelStatus::Ready(h)
                    if h.pipeline.as_ref().is_some_and(|p| p.models().contains(&step.as_str())))
            });
            if used {
                continue;
            }
            match Box::pin(self.unload_with_steps(&step)).await {
                // Gone from the repository since: nothing to unload.
                Err(e) if e.kind == ErrorKind::ModelNotFound => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Unloads every loaded model, whatever the control mode, once the requests each admitted
    /// are answered: their batchers end, and their instance threads drop the models. The
    /// caller waits on [`sheaf_backend::threads::ModelThreads`] for those threads to end.
    pub async fn shutdown(&self) {
        let loaded: Vec<String> = self
            .list()
            .into_iter()
            .filter(|(_, status)| matches!(status, ModelStatus::Ready(_)))
            .map(|(name, _)| name)
            .collect();
        let unloads = loaded.iter().map(|name| self.unload_for(name, "shutdown"));
        for (name, result) in loaded.iter().zip(futures::future::join_all(unloads).await) {
            if let Err(e) = result {
                tracing::warn!(model = %name, error = %e, "not unloaded at shutdown");
            }
        }
    }

    pub(super) async fn unload_for(&self, name: &str, reason: &str) -> Result<(), InferError> {
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
        while handle.pending_in_every_version() > 0 {
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

    /// Whether the model at `repo` is a generation model (its backend generates).
    pub(super) fn generates(&self, repo: &RepoModel) -> bool {
        self.backends
            .iter()
            .any(|b| b.model_file() == repo.file && b.generates())
    }

    /// Memory the model at `repo` will hold per device, and where the figure comes from: its
    /// `memory_mb`, else the backend's estimate, times its instances.
    pub(super) fn estimate(&self, repo: &RepoModel) -> (u64, MemorySource) {
        let config = repo.config.as_ref().ok();
        // Every version served has instances of its own.
        let instances = config.map_or(1, |c| c.instances as u64) * (1 + repo.older.len() as u64);
        if let Some(mb) = config.and_then(|c| c.memory_mb) {
            return (mb * MIB * instances, MemorySource::Config);
        }
        let backend = self.backends.iter().find(|b| b.model_file() == repo.file);
        match backend.and_then(|b| b.estimate_memory(&repo.path)) {
            Some(bytes) => (bytes * instances, MemorySource::Estimate),
            None => (0, MemorySource::Unknown),
        }
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
                    .filter(|(_, e)| matches!(&e.status, ModelStatus::Ready(h) if h.pending_in_every_version() == 0))
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
}

/// What a loaded model is booked at in the ledger, and why: the configured `memory_mb`, else
/// the most of what the backend reports, what this version grew to while it served before and
/// the measured growth, else what it was reserved at.
fn booking(entry: &Entry, handle: &ModelHandle, measured: Option<u64>) -> (u64, MemorySource) {
    if entry.memory_source == MemorySource::Config {
        return (entry.reserved, MemorySource::Config);
    }
    let known = Known {
        reported: handle.memory_bytes,
        served: entry.served(&handle.version),
        measured,
    };
    known
        .largest()
        .unwrap_or((entry.reserved, entry.memory_source))
}

/// What is known of a loaded model's memory per device besides its configuration.
struct Known {
    /// The backend's report (0: none).
    reported: u64,
    /// What this version grew to while it served before.
    served: Option<u64>,
    /// The device's growth while it loaded, when it loaded alone.
    measured: Option<u64>,
}

impl Known {
    /// The largest figure and where it comes from. A version that grew while it served last
    /// time is booked at that from the start. The device's growth during a load can hold what
    /// the backend does not count (a GPU's CUDA context, made with the device's first model)
    /// and can fall short of what it does (on a shared arena, the release at the end of a
    /// warm-up gives back the room that models loaded before kept), so neither alone is it.
    fn largest(&self) -> Option<(u64, MemorySource)> {
        let reported = (self.reported > 0).then_some(match self.served {
            Some(held) if held > self.reported => (held, MemorySource::Serving),
            _ => (self.reported, MemorySource::Backend),
        });
        let measured = self.measured.map(|m| (m, MemorySource::Measured));
        match (reported, measured) {
            (Some(r), Some(m)) if m.0 > r.0 => Some(m),
            (Some(r), _) => Some(r),
            (None, m) => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(
        reported: u64,
        served: Option<u64>,
        measured: Option<u64>,
    ) -> Option<(u64, MemorySource)> {
        Known {
            reported,
            served,
            measured,
        }
        .largest()
    }

    #[test]
    fn a_model_is_booked_at_the_most_that_is_known_of_it() {
        use MemorySource::*;
        // The backend's count, where the device grew less (a shared arena gave back room).
        assert_eq!(known(900, None, Some(0)), Some((900, Backend)));
        assert_eq!(known(900, None, None), Some((900, Backend)));
        // The device's growth, where it holds more than the backend counts (a CUDA context).
        assert_eq!(known(900, None, Some(4_000)), Some((4_000, Measured)));
        // What this version grew to while it served, above both.
        assert_eq!(known(900, Some(1_200), Some(1_000)), Some((1_200, Serving)));
        assert_eq!(known(900, Some(800), None), Some((900, Backend)));
        // Without the backend's count, what was measured, else nothing.
        assert_eq!(known(0, Some(1_200), Some(50)), Some((50, Measured)));
        assert_eq!(known(0, None, None), None);
    }
}
