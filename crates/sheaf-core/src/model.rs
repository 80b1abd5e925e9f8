//! A loaded model: its signature, resolved configuration, batcher and statistics; or, for a
//! generation model, its engine ([`crate::generate`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sheaf_backend::generation::Generator;
use sheaf_backend::{Backend, BackendError, Device, LoadSpec, PooledBackend, Signature};

use crate::batcher::policy::{BatchPolicy, Fixed, LatencySlo, QueueDepth};
use crate::batcher::PrepareSpec;
use crate::batcher::{self, Admission, Batcher, BatcherConfig, TimeoutAction};
use crate::cache::CacheSlot;
use crate::config::{MaxBatchSize, PolicyKind, TimeoutActionConfig, AUTO_LIMIT};
use crate::embed::TextEncoder;
use crate::frames::{FrameStore, FRAME_IDS};
use crate::metrics::{Metrics, ModelLabels};
use crate::pipeline::Pipeline;
use crate::request::{validate, ByteTensor, InferRequest, InferResponse, NamedTensor, RawRequest};
use crate::reshape::Reshapes;
use crate::sequence::Sequences;
use crate::server_config::{DeviceSpec, Routing};
use crate::stages::Receipt;
use crate::stats::{ModelStats, StatsSnapshot};
use crate::{InferError, ModelConfig};
use futures::StreamExt;

/// Where and with what a model is loaded: its backend, the devices, how requests pick one, and
/// the server's metrics.
pub struct Placement<'a> {
    pub backend: Arc<dyn Backend>,
    pub devices: &'a [DeviceSpec],
    pub routing: Routing,
    pub metrics: Arc<Metrics>,
    /// The server's response cache, if it has one; used by models whose config enables it.
    pub cache: Option<Arc<crate::cache::ResponseCache>>,
    /// The server's rate limiter (`--rate-limit execution_count`), which the instances of a
    /// model with a `rate_limiter` take their resources from.
    pub rate: Option<Arc<crate::rate_limit::RateLimiter>>,
}

/// The model on one device: its batcher (and instances) and its statistics.
pub struct Lane {
    pub device: String,
    pub stats: Arc<ModelStats>,
    batcher: Batcher,
    /// Its instances' word on whether they can serve now, of those that have one.
    checks: Vec<Arc<dyn sheaf_backend::ReadyCheck>>,
}

impl Lane {
    /// Items waiting in this device's queue.
    pub fn queued_items(&self) -> usize {
        self.batcher.queued_items()
    }

    /// The deepest this device's queue has been.
    pub fn max_queued_items(&self) -> usize {
        self.batcher.max_queued_items()
    }

    /// Batches assembled or running on this device now.
    pub fn inflight_batches(&self) -> usize {
        self.batcher.inflight_batches()
    }
}

/// A model ready to serve.
pub struct ModelHandle {
    pub name: String,
    pub version: String,
    pub platform: &'static str,
    pub path: PathBuf,
    pub signature: Signature,
    /// The configuration in force, with `max_batch_size` resolved.
    pub config: ModelConfig,
    /// Resolved from the config and the signature; 0 when the model does not batch.
    pub max_batch_size: usize,
    /// The model answers a request with a stream of responses (Triton's decoupled models):
    /// served by [`ModelHandle::infer_stream`], not [`ModelHandle::infer`].
    pub streams: bool,
    /// Memory the model's instances hold on each device (reported or estimated; 0 if unknown).
    pub memory_bytes: u64,
    /// For a text encoder (an `embedding` section): its tokenizer. See [`crate::embed`].
    pub(crate) encoder: Option<Arc<TextEncoder>>,
    /// The class names of the classification extension (`labels.txt`), when the model has them.
    pub labels: Option<Arc<Vec<String>>>,
    /// The frames requests may name by id (`frames` in the config). See [`crate::frames`].
    pub frames: Option<Arc<FrameStore>>,
    /// For a pipeline (`pipeline.yaml`): its steps, run by the model manager
    /// ([`crate::ModelManager::infer`]). See [`crate::pipeline`].
    pub pipeline: Option<Arc<Pipeline>>,
    /// For a pipeline: the statistics of its runs, as Triton keeps an ensemble's (see
    /// [`ModelHandle::record_run`]).
    runs: Option<Arc<ModelStats>>,
    /// For a generation model: its engine, which batches its requests itself (no lanes). See
    /// [`crate::generate`].
    pub(crate) generator: Option<Arc<dyn Generator>>,
    lanes: Vec<Lane>,
    routing: Routing,
    turn: AtomicUsize,
    metrics: Arc<Metrics>,
    /// This load's place in the response cache (`response_cache` in the config).
    cache: Option<CacheSlot>,
    /// For a stateful model (`sequence_batching`): its open sequences. Its lanes are its
    /// instances, one each, and [`ModelHandle::signature`] is the model as clients see it. See
    /// [`crate::sequence`].
    sequences: Option<Arc<Sequences>>,
    /// The older versions its `version_policy` names, which serve beside it (oldest first):
    /// loaded with it, each with instances of its own, and dropped with it. See
    /// [`ModelHandle::older_version`].
    pub(crate) older: Vec<Arc<ModelHandle>>,
    /// The declared tensors the model takes or gives in another shape than clients use
    /// (Triton's `reshape`); [`ModelHandle::signature`] has the clients' dims. See
    /// [`crate::reshape`].
    reshapes: Option<Reshapes>,
    /// Per signature input, whether a request may leave it out (Triton's `optional`); empty
    /// when none may.
    optional: Vec<bool>,
    /// For a model loaded from files its load request sent: their folder, kept while this
    /// load serves (see [`crate::uploaded`]).
    pub(crate) uploaded: Option<Arc<crate::uploaded::Uploaded>>,
}

impl Drop for ModelHandle {
    /// An unloaded (or reloaded) model's answers leave the cache with it.
    fn drop(&mut self) {
        if let Some(slot) = &self.cache {
            slot.cache.purge(slot.load);
        }
    }
}

impl ModelHandle {
    /// Loads the model at `path` on every device and starts one batcher per device.
    pub async fn load(
        name: &str,
        version: &str,
        path: PathBuf,
        config: ModelConfig,
        placement: Placement<'_>,
    ) -> Result<ModelHandle, BackendError> {
        let Placement {
            backend,
            devices,
            routing,
            metrics,
            cache,
            rate,
        } = placement;
        // Triton's backends auto-complete ONNX and Python models; without it, an absent
        // `max_batch_size` is Triton's 0 and every tensor is declared (checked once loaded).
        let no_auto_complete =
            !config.auto_complete && matches!(backend.platform(), "onnxruntime_onnx" | "python");
        let mut config = config;
        if no_auto_complete && config.max_batch_size.is_none() {
            config.max_batch_size = Some(MaxBatchSize::Size(0));
        }
        if backend.generates() {
            return ModelHandle::load_generator(name, version, path, config, backend, devices)
                .await
                .map(|mut h| {
                    h.routing = routing;
                    h.metrics = metrics;
                    h
                });
        }
        // A text encoder's instances pool their token states into one vector per item.
        let backend: Arc<dyn Backend> = match &config.embedding {
            Some(e) => Arc::new(PooledBackend::new(backend, e.pool_spec())),
            None => backend,
        };
        let mut allowed = config.allowed_batch_sizes.clone();
        allowed.sort_unstable();
        allowed.dedup();
        let samples = crate::reshape::warmup_samples(&config.model_warmup, &config.inputs);
        let samples = Arc::new(crate::warmup::read(&samples, &path).map_err(BackendError::Load)?);
        // A stateful model keeps each sequence on one instance: one lane per instance. So
        // does an iterative one: a request it runs again goes back to its own instance's queue,
        // where the model keeps what it needs for the next run.
        let (lanes_per_device, per_lane) =
            if config.sequence_batching.is_some() || config.iterative_sequence {
                (config.instances, 1)
            } else {
                (1, config.instances)
            };
        let mut loaded = Vec::with_capacity(devices.len() * lanes_per_device);
        for device in devices {
            for lane in 0..lanes_per_device {
                let labels = ModelLabels {
                    model: name.to_string(),
                    version: version.to_string(),
                    device: device.name.clone(),
                };
                let stats = Arc::new(ModelStats::new(labels, metrics.clone()));
                let spec = config.load_spec(&path, device.device, device.threads);
                let per_size = spec.session_per_batch_size;
                let cpus = config
                    .instance_cpus
                    .iter()
                    .skip(lane * per_lane)
                    .take(per_lane)
                    .cloned()
                    .collect();
                let instances = batcher::load_instances(
                    &format!("{name}@{}", device.name),
                    backend.clone(),
                    spec,
                    per_lane,
                    cpus,
                    config.pipeline_depth,
                    stats.clone(),
                    prepare(name, &config, &allowed, per_size, samples.clone()),
                    rate.as_ref()
                        .zip(config.rate_limiter.as_ref())
                        .map(|(limiter, config)| batcher::RateNeeds {
                            limiter,
                            config,
                            device: &device.name,
                        }),
                )
                .await
                .map_err(|e| on_device(device, e))?;
                loaded.push((device.name.clone(), stats, instances));
            }
        }
        let (mut signature, max_batch_size, memory_bytes, streams, sees_requests) = loaded
            .first()
            .map(|(_, _, i)| {
                (
                    i.signature.clone(),
                    i.max_batch_size,
                    i.memory_bytes,
                    i.streams,
                    i.sees_requests,
                )
            })
            .ok_or_else(|| BackendError::Load("no devices to load on".into()))?;
        if config.iterative_sequence && !sees_requests {
            return Err(BackendError::Load(
                "sequence_batching { iterative_sequence: true } is for models that answer each \
                 request on their own and may ask for it to run again (Triton's Python API)"
                    .into(),
            ));
        }
        if config.sequence_batching.is_some() && streams {
            return Err(BackendError::Load(
                "sequence_batching on a model that streams its responses (decoupled) is not \
                 supported"
                    .into(),
            ));
        }
        let frames = match config.frames.clone() {
            None => None,
            Some(f) => {
                let (file, signature, batched) =
                    (path.clone(), signature.clone(), max_batch_size > 0);
                let images = config.image_inputs.get(&f.input).cloned();
                let store = tokio::task::spawn_blocking(move || {
                    FrameStore::load(&file, &f, &signature, images.as_ref(), batched)
                })
                .await
                .map_err(|e| BackendError::Load(format!("the frame loader stopped: {e}")))?
                .map_err(BackendError::Load)?;
                Some(Arc::new(store))
            }
        };
        let memory_bytes = memory_bytes + frames.as_ref().map_or(0, |f| f.bytes());
        let encoder = match &config.embedding {
            Some(e) => Some(Arc::new(
                TextEncoder::load(&path, e, &signature).map_err(BackendError::Load)?,
            )),
            None => None,
        };
        let labels = read_labels(&path, &config.labels);
        // Frames named by id and sequences' state are server state the key does not cover: no
        // cache for them.
        let config_cache = config.response_cache
            && config.frames.is_none()
            && config.sequence_batching.is_none()
            && !config.iterative_sequence;
        if config_cache && cache.is_none() {
            tracing::warn!(
                model = name,
                "response_cache is on in the model's config, but the server has no cache: give it room with --cache-size"
            );
        }
        let lanes: Vec<Lane> = loaded
            .into_iter()
            .map(|(device, stats, mut instances)| {
                let checks = std::mem::take(&mut instances.checks);
                let batcher = Batcher::start(
                    name,
                    BatcherConfig {
                        policy: policy(&config, max_batch_size),
                        max_queue_size: config.max_queue_size,
                        priority_levels: config.priority_levels,
                        timeout_action: timeout_action(config.timeout_action),
                        level_policies: (1..=config.priority_levels)
                            .map(|level| {
                                let p = config.priority_queue_policy.get(&level);
                                batcher::LevelPolicy {
                                    timeout_action: p
                                        .and_then(|p| p.timeout_action)
                                        .map(timeout_action),
                                    max_queue_size: p.and_then(|p| p.max_queue_size),
                                }
                            })
                            .collect(),
                        allowed_batch_sizes: instances.batch_sizes.clone(),
                        padding: config.padding.clone(),
                    },
                    instances,
                    stats.clone(),
                );
                Lane {
                    device,
                    stats,
                    batcher,
                    checks,
                }
            })
            .collect();
        let sequences = match &config.sequence_batching {
            None => None,
            Some(s) => {
                let batchers: Vec<Batcher> = lanes.iter().map(|l| l.batcher.clone()).collect();
                let sequences = Sequences::start(name, s, &signature, max_batch_size, &batchers)
                    .map_err(BackendError::Load)?;
                signature = sequences.client.clone();
                Some(sequences)
            }
        };
        // Triton's declared tensors leave out the control inputs and the states.
        config
            .check_declared(&signature, max_batch_size > 0)
            .map_err(BackendError::Load)?;
        if no_auto_complete {
            config
                .check_complete(&signature)
                .map_err(BackendError::Load)?;
        }
        let (reshapes, client) = Reshapes::new(
            &config.inputs,
            &config.outputs,
            &signature,
            max_batch_size > 0,
        );
        if reshapes.is_some() {
            // These convert between bytes and the model's own tensors.
            let converted = config
                .image_inputs
                .keys()
                .chain(config.image_outputs.keys())
                .chain(config.frames.as_ref().map(|f| &f.input));
            for name in converted {
                let reshaped = config
                    .inputs
                    .iter()
                    .chain(&config.outputs)
                    .any(|d| &d.name == name && d.reshape.is_some());
                if reshaped {
                    return Err(BackendError::Load(format!(
                        "'{name}' is both reshaped and converted from or to images or frames; \
                         give it one of the two"
                    )));
                }
            }
            signature = client;
        }
        let optional = optional_inputs(&config, &signature, sees_requests)?;
        Ok(ModelHandle {
            uploaded: None,
            older: Vec::new(),
            name: name.to_string(),
            version: version.to_string(),
            platform: backend.platform(),
            path,
            signature,
            config: ModelConfig {
                max_batch_size: Some(MaxBatchSize::Size(max_batch_size)),
                ..config
            },
            max_batch_size,
            streams,
            memory_bytes,
            encoder,
            labels,
            frames,
            pipeline: None,
            runs: None,
            generator: None,
            lanes,
            routing,
            turn: AtomicUsize::new(0),
            metrics,
            cache: cache
                .filter(|_| config_cache && !streams)
                .map(|cache| CacheSlot {
                    cache,
                    load: crate::cache::next_load(),
                }),
            sequences,
            reshapes,
            optional,
        })
    }

    /// A pipeline: its definition read from `path` (`pipeline.yaml`, or an ensemble's
    /// `config.pbtxt`) and checked. The tensors its configuration declares (an ensemble's
    /// `input` and `output`) are its signature, and its metadata (which, where it declares
    /// none, lists what its steps imply). With `response_cache` in its config and a
    /// server `cache`, its answers are cached as a whole, as Triton caches an ensemble's.
    pub fn load_pipeline(
        name: &str,
        version: &str,
        path: PathBuf,
        config: ModelConfig,
        metrics: Arc<Metrics>,
        cache: Option<Arc<crate::cache::ResponseCache>>,
    ) -> Result<ModelHandle, BackendError> {
        let pipeline = Pipeline::load(&path).map_err(BackendError::Load)?;
        let max_batch_size = match config.max_batch_size {
            Some(MaxBatchSize::Size(n)) => n,
            _ => 0,
        };
        if let Some(d) = config.inputs.iter().find(|d| d.optional) {
            return Err(BackendError::Load(format!(
                "input '{}' is optional (Triton's `optional: true`), which a pipeline's own \
                 inputs cannot be: declare it required",
                d.name
            )));
        }
        let signature = pipeline
            .declared(&config, max_batch_size > 0)
            .map_err(BackendError::Load)?;
        if config.response_cache && cache.is_none() {
            tracing::warn!(
                model = name,
                "response_cache is on in the pipeline's config, but the server has no cache: give it room with --cache-size"
            );
        }
        let cache = cache
            .filter(|_| config.response_cache)
            .map(|cache| CacheSlot {
                cache,
                load: crate::cache::next_load(),
            });
        Ok(ModelHandle {
            uploaded: None,
            older: Vec::new(),
            name: name.to_string(),
            version: version.to_string(),
            platform: crate::pipeline::platform_of(&path),
            path,
            signature,
            config,
            max_batch_size,
            streams: false,
            memory_bytes: 0,
            encoder: None,
            labels: None,
            frames: None,
            pipeline: Some(Arc::new(pipeline)),
            runs: Some(Arc::new(ModelStats::new(
                ModelLabels {
                    model: name.to_string(),
                    version: version.to_string(),
                    device: String::new(),
                },
                metrics.clone(),
            ))),
            generator: None,
            lanes: Vec::new(),
            routing: Routing::RoundRobin,
            turn: AtomicUsize::new(0),
            metrics,
            cache,
            sequences: None,
            reshapes: None,
            optional: Vec::new(),
        })
    }

    /// Starts the engine of a generation model on the first of `devices` (an engine serves
    /// from one device).
    async fn load_generator(
        name: &str,
        version: &str,
        path: PathBuf,
        config: ModelConfig,
        backend: Arc<dyn Backend>,
        devices: &[DeviceSpec],
    ) -> Result<ModelHandle, BackendError> {
        let device = devices
            .first()
            .ok_or_else(|| BackendError::Load("no devices to load on".into()))?;
        let spec = LoadSpec {
            path: path.clone(),
            intra_op_threads: device.threads.unwrap_or(config.intra_op_threads),
            device: device.device,
            session_per_batch_size: false,
            io_binding: false,
            cuda: config.cuda.options(),
            graph: Default::default(),
            model_config: None,
            interpreter: None,
            auto_complete: true,
            execution_timeout: None,
        };
        let generation = config.generation.clone();
        let loader = backend.clone();
        let generator =
            tokio::task::spawn_blocking(move || loader.load_generator(&spec, &generation))
                .await
                .map_err(|e| BackendError::Load(format!("the loader stopped: {e}")))?
                .map_err(|e| on_device(device, e))?;
        Ok(ModelHandle {
            uploaded: None,
            older: Vec::new(),
            name: name.to_string(),
            version: version.to_string(),
            platform: backend.platform(),
            path,
            signature: Signature::default(),
            config: ModelConfig {
                max_batch_size: Some(MaxBatchSize::Size(0)),
                ..config
            },
            max_batch_size: 0,
            streams: false,
            memory_bytes: generator.info().memory_bytes(),
            encoder: None,
            labels: None,
            frames: None,
            pipeline: None,
            runs: None,
            generator: Some(generator),
            lanes: Vec::new(),
            routing: Routing::RoundRobin,
            turn: AtomicUsize::new(0),
            metrics: Arc::new(Metrics::new()),
            cache: None,
            sequences: None,
            reshapes: None,
            optional: Vec::new(),
        })
    }

    /// Whether the model is a text encoder, served on the embeddings routes.
    pub fn is_encoder(&self) -> bool {
        self.encoder.is_some()
    }

    /// The device lane a request of `items` items goes to.
    fn route(&self, items: usize) -> &Lane {
        let i = match self.routing {
            _ if self.lanes.len() == 1 => 0,
            Routing::RoundRobin => self.turn.fetch_add(1, Ordering::Relaxed) % self.lanes.len(),
            Routing::QueueDepth => (0..self.lanes.len())
                .min_by(|&a, &b| {
                    let ea = self.lanes[a].batcher.expected_completion(items);
                    let eb = self.lanes[b].batcher.expected_completion(items);
                    ea.total_cmp(&eb)
                })
                .unwrap_or(0),
        };
        &self.lanes[i]
    }

    /// The model's devices, with their statistics.
    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    /// Whether the model's instances say they can serve now ([`sheaf_backend::ReadyCheck`]),
    /// asked one after another on a blocking thread; `Err` is the first one's reason not to.
    /// A model whose instances have no word of their own answers at once.
    pub async fn instances_ready(self: &Arc<Self>) -> Result<(), String> {
        if self.lanes.iter().all(|lane| lane.checks.is_empty()) {
            return Ok(());
        }
        let handle = self.clone();
        tokio::task::spawn_blocking(move || {
            handle
                .lanes
                .iter()
                .flat_map(|lane| &lane.checks)
                .try_for_each(|check| check.check())
        })
        .await
        .unwrap_or_else(|e| Err(format!("its readiness check stopped: {e}")))
    }

    /// The recent latencies of Triton's summaries over every device (and a pipeline's runs),
    /// each series sorted; `None` when the summaries are off.
    pub(crate) fn summaries(&self) -> Option<[Vec<f64>; 5]> {
        let parts: Vec<&crate::summary::Summaries> = self
            .lanes
            .iter()
            .map(|lane| &lane.stats)
            .chain(self.runs.as_ref())
            .filter_map(|stats| stats.summaries())
            .collect();
        (!parts.is_empty()).then(|| crate::summary::Summaries::merged(parts.into_iter()))
    }

    pub fn stats(&self) -> StatsSnapshot {
        let mut total = StatsSnapshot::default();
        for lane in &self.lanes {
            total.merge(&lane.stats.snapshot());
        }
        if let Some(runs) = &self.runs {
            total.merge(&runs.snapshot());
        }
        total
    }

    /// Runs the steps of this pipeline handle's `pipeline` for `raw`, the models through
    /// `manager`: from the response cache when the pipeline's config enables it and the same
    /// inputs were answered before (then no step runs), and recorded in its statistics as
    /// Triton records an ensemble's (see [`ModelHandle::record_run`]).
    pub(crate) async fn run_pipeline(
        &self,
        pipeline: &Pipeline,
        raw: RawRequest,
        manager: &crate::ModelManager,
    ) -> Result<InferResponse, InferError> {
        let started = std::time::Instant::now();
        // Items: dimension 0 of the first input when the pipeline batches.
        let items = match self.max_batch_size {
            0 => 1,
            _ => raw
                .inputs
                .first()
                .map(|t| t.tensor.shape().first().copied())
                .or_else(|| raw.byte_inputs.first().map(|b| b.shape.first().copied()))
                .flatten()
                .unwrap_or(1),
        };
        let (name, version) = (self.name.as_str(), self.version.as_str());
        let cached = self.cache.as_ref().zip(self.runs.as_ref());
        let key = cached.and_then(|(slot, _)| pipeline.cache_key(&slot.cache, slot.load, &raw));
        let (Some((slot, runs)), Some(key)) = (cached, key) else {
            let answer = pipeline.run(name, version, raw, manager).await;
            self.record_run(items, started, &answer);
            return answer;
        };
        if let Some(kept) = slot.cache.get(key) {
            let answer = pipeline.cached_answer(name, version, &raw, kept);
            match &answer {
                Ok(_) => runs.record_cache_hit(started.elapsed()),
                Err(e) => runs.record_failure(e.kind, started.elapsed()),
            }
            return answer;
        }
        let lookup = started.elapsed();
        // Every output is run and kept, whichever the request asks for.
        let mut raw = raw;
        let asked = RawRequest {
            id: raw.id.clone(),
            outputs: raw.outputs.take(),
            ..RawRequest::default()
        };
        let answer = pipeline.run(name, version, raw, manager).await;
        let answer = answer.and_then(|all| {
            if let Some(kept) = pipeline.to_cache(&all) {
                let stored = std::time::Instant::now();
                slot.cache.put(key, slot.load, kept);
                runs.record_cache_miss(lookup + stored.elapsed());
            }
            pipeline.pick(name, version, &asked, all)
        });
        self.record_run(items, started, &answer);
        answer
    }

    /// Records a pipeline's run of `items` items, begun at `started`, as Triton records an
    /// ensemble's: a success with its whole time, no queue of its own, and its model steps'
    /// compute phases summed, as one execution of that many items; or a failure.
    fn record_run(
        &self,
        items: usize,
        started: std::time::Instant,
        answer: &Result<InferResponse, InferError>,
    ) {
        let Some(runs) = &self.runs else { return };
        let took = started.elapsed();
        match answer {
            Ok(answer) => {
                let phases = answer
                    .receipt
                    .as_ref()
                    .map(Receipt::phases)
                    .unwrap_or_default();
                runs.record_batch(items.max(1), phases);
                runs.record_success(took, std::time::Duration::ZERO, phases);
            }
            Err(e) => runs.record_failure(e.kind, took),
        }
    }

    /// Validates `raw` against the signature, queues it, and returns its outputs. Encoded
    /// images for `image_inputs` are decoded first; `image_outputs` and outputs asked for as
    /// classes are converted last (see [`crate::image`]).
    pub async fn infer(&self, mut raw: RawRequest) -> Result<InferResponse, InferError> {
        if self.is_generator() {
            return Err(InferError::invalid(format!(
                "model '{}' is a generation model, which takes text rather than tensors: use \
                 POST /v1/chat/completions or /v1/completions",
                self.name
            )));
        }
        if self.pipeline.is_some() {
            return Err(InferError::internal(format!(
                "pipeline '{}' runs through the model manager",
                self.name
            )));
        }
        if self.streams {
            return Err(InferError::invalid(format!(
                "model '{}' answers with a stream of responses (decoupled): send the request on \
                 a gRPC stream (ModelStreamInfer), or ask for server-sent events over HTTP \
                 (Accept: text/event-stream)",
                self.name
            )));
        }
        let classification = std::mem::take(&mut raw.classification);
        let sequence = raw.sequence.take();
        // Frames named by id become the frames' input.
        let mut frame_ids = None;
        if let Some(store) = &self.frames {
            if let Some(i) = raw.inputs.iter().position(|t| t.name == FRAME_IDS) {
                let ids = raw.inputs.remove(i);
                let (frames, ids) = store.gather(&ids.tensor)?;
                raw.inputs.push(frames);
                frame_ids = Some(ids);
                // The ids always come back; asking for them is no error.
                if let Some(outputs) = &mut raw.outputs {
                    outputs.retain(|o| o != FRAME_IDS);
                }
            }
        }
        let decoded = self
            .decode_images(std::mem::take(&mut raw.byte_inputs))
            .await;
        let checked = decoded
            .and_then(|images| {
                raw.inputs.extend(images);
                validate(
                    raw,
                    &self.signature,
                    self.max_batch_size > 0,
                    &self.optional,
                )
            })
            .and_then(|r| self.to_model(r))
            .and_then(|r| {
                let mut admission = self.admission(r.priority, r.timeout_us)?;
                admission.info = request_info(&r, sequence.as_ref(), &self.signature);
                if self.config.iterative_sequence {
                    self.iterative(&r, &mut admission.info)?;
                }
                Ok((admission, r))
            });
        let (admission, request) = checked.inspect_err(|e| {
            // Refused before any device was chosen: counted without a device.
            let labels = ModelLabels {
                model: self.name.clone(),
                version: self.version.clone(),
                device: String::new(),
            };
            self.metrics.record_failure(&labels, e.kind);
        })?;
        let (outputs, receipt, parameters) = match &self.sequences {
            Some(sequences) => {
                let flags = sequence.as_ref().ok_or_else(|| self.needs_sequence())?;
                if request.items != 1 {
                    return Err(InferError::invalid(format!(
                        "a request of a sequence carries one item, and this one has {}",
                        request.items
                    )));
                }
                let (outputs, receipt) = sequences.step(flags, request.inputs, admission).await?;
                (outputs, receipt, None)
            }
            None => self.run(request.inputs, request.items, admission).await?,
        };
        let mut tensors = Vec::with_capacity(request.outputs.len());
        let mut byte_outputs = Vec::new();
        for &i in &request.outputs {
            let name = &self.signature.outputs[i].name;
            // Tensors share their bytes, so a clone here copies no data.
            let tensor = self.to_client(i, outputs[i].clone())?;
            if let Some((_, k)) = classification.iter().find(|(n, _)| n == name) {
                let labels = self.labels.as_deref().map(Vec::as_slice);
                byte_outputs.push(crate::image::classify(name, &tensor, *k, labels)?);
            } else if let Some(config) = self.config.image_outputs.get(name) {
                byte_outputs.push(crate::image::encode_output(name, &tensor, config).await?);
            } else {
                self.push_output(i, tensor, &mut tensors, &mut byte_outputs)?;
            }
        }
        if let Some(ids) = frame_ids {
            let data: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
            tensors.push(NamedTensor {
                name: FRAME_IDS.to_string(),
                tensor: sheaf_backend::Tensor::new(
                    sheaf_backend::DataType::I64,
                    vec![ids.len()],
                    bytes::Bytes::from(data),
                )?,
            });
        }
        if let Some((name, _)) = classification
            .iter()
            .find(|(n, _)| !self.signature.outputs.iter().any(|o| &o.name == n))
        {
            return Err(InferError::invalid(format!(
                "classification asked of '{name}', which is not an output of model '{}'",
                self.name
            )));
        }
        Ok(InferResponse {
            id: request.id,
            model_name: self.name.clone(),
            model_version: self.version.clone(),
            outputs: tensors,
            byte_outputs,
            receipt,
            parameters,
        })
    }

    /// The model's outputs for checked `inputs`: from the response cache when this model uses
    /// it and the same inputs were answered before (the queue is not touched then, there is no
    /// receipt of a batch, and the cache keeps no parameters), else from a batch, with the
    /// parameters the model answered with.
    async fn run(
        &self,
        inputs: Vec<sheaf_backend::Tensor>,
        items: usize,
        admission: Admission,
    ) -> Result<
        (
            Vec<sheaf_backend::Tensor>,
            Option<Receipt>,
            Option<crate::request::Parameters>,
        ),
        InferError,
    > {
        let Some(slot) = &self.cache else {
            let lane = self.route(items);
            let a = lane.batcher.submit(inputs, items, admission).await?;
            return Ok((a.outputs, Some(a.receipt), a.parameters));
        };
        let looked = std::time::Instant::now();
        let names = self.signature.inputs.iter().map(|s| s.name.as_str());
        let key = slot.cache.key(slot.load, names.zip(&inputs));
        if let Some(outputs) = slot.cache.get(key) {
            // A hit runs on no device; the model's statistics sum its devices.
            if let Some(lane) = self.lanes.first() {
                lane.stats.record_cache_hit(looked.elapsed());
            }
            return Ok((outputs, None, None));
        }
        let lookup = looked.elapsed();
        let lane = self.route(items);
        let a = lane.batcher.submit(inputs, items, admission).await?;
        let stored = std::time::Instant::now();
        slot.cache.put(key, slot.load, a.outputs.clone());
        lane.stats.record_cache_miss(lookup + stored.elapsed());
        Ok((a.outputs, Some(a.receipt), a.parameters))
    }

    /// Queues `raw` for a streaming model ([`ModelHandle::streams`]) and returns its responses
    /// as they come; the stream ends with the request, or with the error that cut it short.
    /// A request must fit one batch (`max_batch_size` items): its responses are its own.
    pub async fn infer_stream(
        self: Arc<Self>,
        mut raw: RawRequest,
    ) -> Result<futures::stream::BoxStream<'static, Result<InferResponse, InferError>>, InferError>
    {
        if !self.streams {
            return Err(InferError::invalid(format!(
                "model '{}' answers each request once: use its infer route",
                self.name
            )));
        }
        let bytes = self
            .decode_images(std::mem::take(&mut raw.byte_inputs))
            .await?;
        raw.inputs.extend(bytes);
        let request = self.to_model(validate(
            raw,
            &self.signature,
            self.max_batch_size > 0,
            &self.optional,
        )?)?;
        if self.max_batch_size > 0 && request.items > self.max_batch_size {
            return Err(InferError::invalid(format!(
                "request has {} items; a streaming model takes at most {} (its max_batch_size) \
                 in one request",
                request.items, self.max_batch_size
            )));
        }
        let mut admission = self.admission(request.priority, request.timeout_us)?;
        admission.info = request_info(&request, None, &self.signature);
        if self.config.iterative_sequence {
            self.iterative(&request, &mut admission.info)?;
        }
        let (parts, done) = {
            let lane = self.route(request.items);
            lane.batcher
                .submit_stream(request.inputs, request.items, admission)
                .await?
        };
        let (id, wanted) = (request.id, request.outputs);
        let responses = futures::stream::unfold(Some(parts), |parts| async move {
            let mut parts = parts?;
            let part = parts.recv().await?;
            Some((part, Some(parts)))
        })
        .map(move |part| {
            let (outputs, parameters) = part?;
            let mut tensors = Vec::with_capacity(wanted.len());
            let mut byte_outputs = Vec::new();
            for &i in &wanted {
                if let Some(tensor) = outputs.get(i) {
                    let tensor = self.to_client(i, tensor.clone())?;
                    self.push_output(i, tensor, &mut tensors, &mut byte_outputs)?;
                }
            }
            Ok(InferResponse {
                id: id.clone(),
                model_name: self.name.clone(),
                model_version: self.version.clone(),
                outputs: tensors,
                byte_outputs,
                receipt: None,
                parameters,
            })
        });
        // After the last response, the answer that closes the request: an error ends the
        // stream with it.
        let end =
            futures::stream::once(done).filter_map(|answer| async move { answer.err().map(Err) });
        Ok(Box::pin(responses.chain(end)))
    }

    /// The error for a request without a sequence to a stateful model.
    fn needs_sequence(&self) -> InferError {
        InferError::invalid(format!(
            "model '{}' is stateful (sequence_batching): each request names its sequence with \
             the sequence_id parameter, the first with sequence_start and the last with \
             sequence_end",
            self.name
        ))
    }

    /// A stateful model's sequences; none for any other model.
    pub fn sequences(&self) -> Option<&Sequences> {
        self.sequences.as_deref()
    }

    /// Sequences of a stateful model open now (0 for any other model).
    pub fn open_sequences(&self) -> usize {
        self.sequences.as_ref().map_or(0, |s| s.open())
    }

    /// Whether sequence `id` is open on this model.
    pub fn sequence_open(&self, id: &crate::SequenceId) -> bool {
        self.sequences.as_ref().is_some_and(|s| s.is_open(id))
    }

    /// A checked request with its inputs in the shapes the model takes ([`crate::reshape`]).
    fn to_model(&self, mut request: InferRequest) -> Result<InferRequest, InferError> {
        if let Some(r) = &self.reshapes {
            request.inputs = r.to_model(request.inputs)?;
        }
        Ok(request)
    }

    /// Whether a request may leave out the input `name` (Triton's `optional`).
    pub fn is_optional(&self, name: &str) -> bool {
        self.signature
            .inputs
            .iter()
            .zip(&self.optional)
            .any(|(s, &o)| o && s.name == name)
    }

    /// Output `i` of an answer in the shape clients get ([`crate::reshape`]).
    fn to_client(
        &self,
        i: usize,
        tensor: sheaf_backend::Tensor,
    ) -> Result<sheaf_backend::Tensor, InferError> {
        match &self.reshapes {
            Some(r) => r.to_client(i, tensor),
            None => Ok(tensor),
        }
    }

    /// Adds output `i` of an answer to a response: as a tensor, or as byte strings when it is
    /// BYTES.
    fn push_output(
        &self,
        i: usize,
        tensor: sheaf_backend::Tensor,
        tensors: &mut Vec<NamedTensor>,
        bytes: &mut Vec<ByteTensor>,
    ) -> Result<(), InferError> {
        let name = self.signature.outputs[i].name.clone();
        if tensor.dtype() == sheaf_backend::DataType::Bytes {
            bytes.push(ByteTensor::from_wire(
                name,
                tensor.shape().to_vec(),
                tensor.data(),
            )?);
        } else {
            tensors.push(NamedTensor { name, tensor });
        }
        Ok(())
    }

    /// The tensors of a request's BYTES inputs: encoded images decoded for the inputs the
    /// model's `image_inputs` names, byte strings kept as they are for inputs the model takes as
    /// BYTES; any other BYTES input is refused.
    pub async fn decode_images(
        &self,
        inputs: Vec<ByteTensor>,
    ) -> Result<Vec<NamedTensor>, InferError> {
        let mut out = Vec::with_capacity(inputs.len());
        for input in inputs {
            let config = self.config.image_inputs.get(&input.name);
            let spec = self.signature.inputs.iter().find(|s| s.name == input.name);
            // A model that takes byte strings (a Python model) gets them as they are.
            if let (None, Some(spec)) = (config, spec) {
                if spec.dtype == sheaf_backend::DataType::Bytes {
                    let tensor = sheaf_backend::Tensor::new(
                        sheaf_backend::DataType::Bytes,
                        input.shape.clone(),
                        input.to_wire(),
                    )?;
                    out.push(NamedTensor {
                        name: input.name,
                        tensor,
                    });
                    continue;
                }
            }
            let (Some(config), Some(spec)) = (config, spec) else {
                return Err(InferError::invalid(format!(
                    "input '{}' is BYTES, but model '{}' takes no encoded images there (its \
                     config names no image_inputs.{})",
                    input.name, self.name, input.name
                )));
            };
            out.push(crate::image::decode_input(input, config, spec).await?);
        }
        Ok(out)
    }

    /// The priority level and timeout of a request, from its parameters and the model's defaults.
    pub(crate) fn admission(
        &self,
        priority: Option<u64>,
        timeout_us: Option<u64>,
    ) -> Result<Admission, InferError> {
        let levels = self.config.priority_levels;
        let level = match priority {
            None | Some(0) => self.config.default_priority_level.unwrap_or(levels),
            Some(p) if p <= levels as u64 => p as usize,
            Some(p) => {
                return Err(InferError::invalid(format!(
                "priority {p} is outside 1..={levels} (model '{}' has {levels} priority level{})",
                self.name,
                if levels == 1 { "" } else { "s" }
            )))
            }
        };
        // The level's own default timeout and override rule, where its queue policy sets them.
        let policy = self.config.priority_queue_policy.get(&level);
        let default_timeout_us = policy
            .and_then(|p| p.default_timeout_us)
            .unwrap_or(self.config.default_timeout_us);
        let allow_override = policy
            .and_then(|p| p.allow_timeout_override)
            .or(self.config.allow_timeout_override);
        let timeout_us = effective_timeout_us(timeout_us, default_timeout_us, allow_override);
        let timeout = (timeout_us > 0).then(|| batcher::micros(timeout_us));
        Ok(Admission {
            level: level - 1,
            timeout,
            info: None,
        })
    }

    /// Items waiting in the queues, not yet in a batch.
    pub fn queued_items(&self) -> usize {
        self.lanes.iter().map(|l| l.batcher.queued_items()).sum()
    }

    /// Items the model's queues could still admit now, over every device (0 for a generation
    /// model, which queues its own way).
    pub fn free_room(&self) -> usize {
        self.lanes.iter().map(|l| l.batcher.free_room()).sum()
    }

    /// The older version `version` served beside this one, if it is one.
    pub fn older_version(&self, version: &str) -> Option<&Arc<ModelHandle>> {
        self.older.iter().find(|h| h.version == version)
    }

    /// The older versions served beside this one, oldest first.
    pub fn older_versions(&self) -> &[Arc<ModelHandle>] {
        &self.older
    }

    /// Every version served, oldest first: the older ones, then this one.
    pub fn every_version(self: &Arc<Self>) -> Vec<Arc<ModelHandle>> {
        self.older.iter().cloned().chain([self.clone()]).collect()
    }

    /// The names of every version served, oldest first (this one last).
    pub fn served_versions(&self) -> Vec<String> {
        self.older
            .iter()
            .map(|h| h.version.clone())
            .chain([self.version.clone()])
            .collect()
    }

    /// Items admitted and not yet answered by this version or an older one served beside it.
    pub fn pending_in_every_version(&self) -> usize {
        self.pending_items() + self.older.iter().map(|h| h.pending_items()).sum::<usize>()
    }

    /// Items admitted and not yet answered (a generation model's choices queued or running).
    pub fn pending_items(&self) -> usize {
        self.lanes
            .iter()
            .map(|l| l.batcher.pending_items())
            .sum::<usize>()
            + self.generator.as_ref().map_or(0, |g| g.pending())
    }

    /// Memory the model holds on each device now: [`ModelHandle::memory_bytes`] (at load),
    /// plus what its instances have grown by since, as they report after running batches (on
    /// the device where they grew most).
    /// The older versions served beside it count too (their sizes are in `memory_bytes`).
    pub fn memory_held(&self) -> u64 {
        let growth = |h: &ModelHandle| {
            h.lanes
                .iter()
                .map(|l| l.stats.memory_growth())
                .max()
                .unwrap_or(0)
        };
        self.memory_bytes + growth(self) + self.older.iter().map(|h| growth(h)).sum::<u64>()
    }
}

/// The class names in the file `labels` beside `model_file` (in its version folder) or in the
/// model folder above it, one per line; `None` without such a file.
fn read_labels(model_file: &std::path::Path, labels: &str) -> Option<Arc<Vec<String>>> {
    let version = model_file.parent()?;
    let text = [Some(version), version.parent()]
        .into_iter()
        .flatten()
        .find_map(|dir| std::fs::read_to_string(dir.join(labels)).ok())?;
    Some(Arc::new(
        text.lines().map(|l| l.trim().to_string()).collect(),
    ))
}

/// A load error on `device`, naming the device unless it is the CPU.
fn on_device(device: &DeviceSpec, e: BackendError) -> BackendError {
    match (device.device, e) {
        (Device::Cpu, e) => e,
        (_, BackendError::Load(m)) => BackendError::Load(format!("on {}: {m}", device.name)),
        (_, e) => e,
    }
}

/// The preparation of each instance (see [`batcher::prepare`]): `max_batch_size` resolved for
/// the signature the model reports, with buckets when each batch size has its own session;
/// then the configuration's warm-up `samples` run (see [`crate::warmup`]).
fn prepare(
    name: &str,
    config: &ModelConfig,
    allowed: &[usize],
    buckets: bool,
    samples: Arc<Vec<crate::warmup::Sample>>,
) -> batcher::Prepare {
    let config = config.clone();
    let name = name.to_string();
    let allowed = allowed.to_vec();
    Arc::new(move |model| {
        let (max, auto) = resolve_max_batch_size(&config, &*model, &allowed)?;
        let spec = PrepareSpec {
            max_batch_size: max,
            auto,
            allowed_batch_sizes: if max > 0 { allowed.clone() } else { Vec::new() },
            buckets,
            warmup: config.warmup && model.warms_up_on_zeros(),
        };
        let settled = batcher::prepare::prepare(model, &spec, &name)?;
        crate::warmup::run(model, &samples, &settled, &name)?;
        Ok(settled)
    })
}

/// The batching policy `config` asks for.
fn policy(config: &ModelConfig, max_batch_size: usize) -> Box<dyn BatchPolicy> {
    let b = &config.batching;
    let delay = batcher::micros(config.max_queue_delay_us);
    match b.policy {
        PolicyKind::Fixed => Box::new(Fixed {
            max_batch_size,
            min_batch_size: b.min_batch_size,
            max_queue_delay: delay,
            preferred_batch_sizes: config.preferred_batch_sizes.clone(),
        }),
        PolicyKind::QueueDepth => Box::new(QueueDepth {
            max_batch_size,
            min_batch_size: b.min_batch_size,
            preferred_batch_sizes: config.preferred_batch_sizes.clone(),
            min_wait: batcher::micros(b.min_wait_us),
            max_wait: b.max_wait_us.map_or(delay, batcher::micros),
            adaptive_threshold: b.adaptive_threshold,
        }),
        PolicyKind::LatencySlo => Box::new(LatencySlo::new(
            max_batch_size,
            std::time::Duration::from_millis(b.latency_slo_ms),
        )),
    }
}

/// The configured `max_batch_size` (capped by the largest allowed size), else the one the model
/// declares itself, else the default for the signature, and whether to probe (`auto`); an error
/// when batching is asked of a model without a batch dimension.
fn resolve_max_batch_size(
    config: &ModelConfig,
    model: &dyn sheaf_backend::Model,
    allowed: &[usize],
) -> Result<(usize, bool), BackendError> {
    let batchable = model.signature().has_batch_dim();
    let cap = |n: usize| allowed.last().map_or(n, |&a| n.min(a));
    let declared = model.declared_max_batch_size().map(MaxBatchSize::Size);
    match config.max_batch_size.or(declared) {
        None if batchable => Ok((cap(config.default_max_batch_size), false)),
        None | Some(MaxBatchSize::Size(0)) => Ok((0, false)),
        Some(MaxBatchSize::Size(n)) if batchable => Ok((cap(n), false)),
        Some(MaxBatchSize::Auto(_)) if batchable => Ok((cap(AUTO_LIMIT), true)),
        Some(m) => Err(BackendError::Load(format!(
            "max_batch_size is {}, but the model has no batch dimension (its inputs and outputs \
             do not all start with a dynamic dimension); set max_batch_size: 0",
            match m {
                MaxBatchSize::Size(n) => n.to_string(),
                MaxBatchSize::Auto(_) => "auto".into(),
            }
        ))),
    }
}

impl ModelHandle {
    /// A request to an iterative model (`sequence_batching { iterative_sequence: true }`) is a
    /// sequence of its own, run again as the model asks: one that names no sequence gets a
    /// correlation id from the server and the START flag, as Triton's iterative sequencer
    /// gives it (later runs have no flags). Whole, it must fit one batch.
    fn iterative(
        &self,
        request: &crate::InferRequest,
        info: &mut Option<Arc<sheaf_backend::RequestInfo>>,
    ) -> Result<(), InferError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        if self.max_batch_size > 0 && request.items > self.max_batch_size {
            return Err(InferError::invalid(format!(
                "request has {} items; an iterative model takes at most {} (its max_batch_size) \
                 in one request, as each request runs again on its own",
                request.items, self.max_batch_size
            )));
        }
        let mut filled = info.as_deref().cloned().unwrap_or_default();
        if filled.correlation_id.is_none() {
            filled.correlation_id = Some(sheaf_backend::CorrelationId::Number(
                NEXT.fetch_add(1, Ordering::Relaxed),
            ));
            filled.flags |= sheaf_backend::RequestInfo::SEQUENCE_START;
        }
        *info = Some(Arc::new(filled));
        Ok(())
    }
}

/// What a model that sees its requests one by one is told of a request besides its tensors:
/// its id, its sequence, the outputs it asked for when they are not every output in order, and
/// its other parameters. None when there is nothing to tell (no allocation then).
fn request_info(
    request: &crate::InferRequest,
    sequence: Option<&crate::SequenceFlags>,
    signature: &sheaf_backend::Signature,
) -> Option<Arc<sheaf_backend::RequestInfo>> {
    let id = request.id.as_deref().filter(|id| !id.is_empty());
    let outputs = &request.outputs;
    let every = outputs.len() == signature.outputs.len()
        && outputs.iter().enumerate().all(|(k, &i)| k == i);
    if id.is_none()
        && sequence.is_none()
        && every
        && request.parameters.is_none()
        && request.absent.is_empty()
    {
        return None;
    }
    let asked = if every {
        Vec::new()
    } else {
        outputs
            .iter()
            .filter_map(|&i| signature.outputs.get(i).map(|o| o.name.clone()))
            .collect()
    };
    Some(Arc::new(sheaf_backend::RequestInfo {
        id: id.unwrap_or_default().to_string(),
        correlation_id: sequence.map(|s| match &s.id {
            crate::SequenceId::Number(n) => sheaf_backend::CorrelationId::Number(*n),
            crate::SequenceId::Text(t) => sheaf_backend::CorrelationId::Text(t.clone()),
        }),
        parameters: request
            .parameters
            .as_ref()
            .and_then(|p| serde_json::to_string(p.as_ref()).ok())
            .unwrap_or_default(),
        flags: sequence.map_or(0, |s| {
            use sheaf_backend::RequestInfo as Info;
            (if s.start { Info::SEQUENCE_START } else { 0 })
                | (if s.end { Info::SEQUENCE_END } else { 0 })
        }),
        requested_outputs: asked,
        absent: request
            .absent
            .iter()
            .filter_map(|&i| signature.inputs.get(i).map(|s| s.name.clone()))
            .collect(),
    }))
}

/// The batcher's form of a configured timeout action.
fn timeout_action(action: TimeoutActionConfig) -> TimeoutAction {
    match action {
        TimeoutActionConfig::Reject => TimeoutAction::Reject,
        TimeoutActionConfig::Delay => TimeoutAction::Delay,
    }
}

/// Per input of `signature`, whether the configuration declares it optional (Triton's
/// `optional`); empty when none is. Only a model that sees its requests one by one is told
/// which inputs a request carries, so on any other model, and with what rewrites a request's
/// inputs before the model sees them (sequences, reshapes), an optional input fails the load.
fn optional_inputs(
    config: &ModelConfig,
    signature: &Signature,
    sees_requests: bool,
) -> Result<Vec<bool>, BackendError> {
    let Some(first) = config.inputs.iter().find(|d| d.optional) else {
        return Ok(Vec::new());
    };
    let refuse = |why: &str| {
        BackendError::Load(format!(
            "input '{}' is optional (Triton's `optional: true`), {why}",
            first.name
        ))
    };
    if !sees_requests {
        return Err(refuse(
            "which is served for models that see their requests one by one (Triton's Python \
             models), and this one takes assembled batches: declare the input required",
        ));
    }
    if config.sequence_batching.is_some() {
        return Err(refuse("which a model with sequence_batching cannot take"));
    }
    if let Some(d) = config
        .inputs
        .iter()
        .find(|d| d.optional && d.reshape.is_some())
    {
        return Err(BackendError::Load(format!(
            "input '{}' is both optional and reshaped; give it one of the two",
            d.name
        )));
    }
    Ok(signature
        .inputs
        .iter()
        .map(|s| config.inputs.iter().any(|d| d.name == s.name && d.optional))
        .collect())
}

/// A request's timeout in microseconds (0: none), from its own `timeout` and its level's
/// default, under the level's `allow_timeout_override` (see
/// [`ModelConfig::allow_timeout_override`]).
fn effective_timeout_us(asked: Option<u64>, default_us: u64, allow_override: Option<bool>) -> u64 {
    let asked = asked.filter(|&t| t > 0);
    match (asked, allow_override) {
        (None, _) | (Some(_), Some(false)) => default_us,
        (Some(t), None) => t,
        (Some(t), Some(true)) if default_us == 0 => t,
        (Some(t), Some(true)) => t.min(default_us),
    }
}

#[cfg(test)]
mod tests {
    use super::effective_timeout_us;

    #[test]
    fn a_request_s_timeout_counts_as_its_level_s_override_rule_says() {
        // Unset: the request's own timeout replaces the default, longer or shorter.
        assert_eq!(effective_timeout_us(Some(900), 500, None), 900);
        assert_eq!(effective_timeout_us(None, 500, None), 500);
        // Refused: the default holds.
        assert_eq!(effective_timeout_us(Some(100), 500, Some(false)), 500);
        assert_eq!(effective_timeout_us(Some(100), 0, Some(false)), 0);
        // Allowed: shorter only, and any timeout where there is no default.
        assert_eq!(effective_timeout_us(Some(100), 500, Some(true)), 100);
        assert_eq!(effective_timeout_us(Some(900), 500, Some(true)), 500);
        assert_eq!(effective_timeout_us(Some(900), 0, Some(true)), 900);
        // A timeout of 0 is none asked.
        assert_eq!(effective_timeout_us(Some(0), 500, Some(true)), 500);
    }
}
