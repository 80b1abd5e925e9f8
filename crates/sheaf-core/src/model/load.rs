//! Loading a model: its instances on each device, prepared and warmed, with their batcher and
//! policy; a pipeline's handle; a generation model's engine.

use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use sheaf_backend::{Backend, BackendError, Device, LoadSpec, PooledBackend, Signature};

use crate::batcher::policy::{BatchPolicy, Fixed, LatencySlo, QueueDepth};
use crate::batcher::PrepareSpec;
use crate::batcher::{self, Batcher, BatcherConfig, TimeoutAction};
use crate::cache::CacheSlot;
use crate::config::{MaxBatchSize, PolicyKind, TimeoutActionConfig};
use crate::embed::TextEncoder;
use crate::frames::FrameStore;
use crate::metrics::{Metrics, ModelLabels};
use crate::pipeline::Pipeline;
use crate::reshape::Reshapes;
use crate::sequence::Sequences;
use crate::server_config::{DeviceSpec, Routing};
use crate::stats::ModelStats;
use crate::ModelConfig;

use super::{Lane, ModelHandle, Placement};

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
        let ragged = crate::ragged::declared(&config).map_err(BackendError::Load)?;
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
                let mut spec = config.load_spec(&path, device.device, device.threads);
                // Ragged batches run at any size: one session takes them all.
                spec.session_per_batch_size &= !ragged;
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
                    prepare(name, &config, &allowed, (per_size, ragged), samples.clone()),
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
        // Clients send ragged inputs in their own shapes, and never the batch inputs.
        let ragged = match crate::ragged::Ragged::new(
            &config.inputs,
            (&config.batch_inputs, &config.batch_outputs),
            &signature,
            max_batch_size > 0,
            sees_requests,
        )
        .map_err(BackendError::Load)?
        {
            Some((ragged, client)) => {
                signature = client;
                Some(Arc::new(ragged))
            }
            None => None,
        };
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
                        policy: policy(&config, max_batch_size, &instances.batch_sizes),
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
                        ragged: ragged.clone(),
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
                let sequences = Sequences::start(
                    name,
                    s,
                    (&signature, crate::repository::model_folder(&path)),
                    max_batch_size,
                    &batchers,
                )
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
            ragged,
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
            ragged: None,
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
            io_binding: Some(false),
            cuda: config.cuda.options(),
            graph: Default::default(),
            model_config: None,
            interpreter: None,
            auto_complete: true,
            max_batch_size_open: false,
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
            ragged: None,
            optional: Vec::new(),
        })
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
/// then the configuration's warm-up `samples` run (see [`crate::warmup`]). With `auto`, the
/// instances of one device probe once: the first probes while the others wait, and they take
/// the size it settled on, so that every instance runs the batches (and keeps the sessions) of
/// the size the batcher sends.
fn prepare(
    name: &str,
    config: &ModelConfig,
    allowed: &[usize],
    (buckets, ragged): (bool, bool),
    samples: Arc<Vec<crate::warmup::Sample>>,
) -> batcher::Prepare {
    let config = config.clone();
    let name = name.to_string();
    let allowed = allowed.to_vec();
    let probed: Arc<std::sync::Mutex<Option<usize>>> = Arc::default();
    Arc::new(move |model| {
        let (max, auto) = resolve_max_batch_size(&config, &*model, &allowed)?;
        let mut first = auto.then(|| probed.lock().unwrap_or_else(|e| e.into_inner()));
        let (max, auto) = match first.as_deref() {
            Some(Some(settled)) => (*settled, false),
            _ => (max, auto),
        };
        // A ragged model's inputs are not a batch of zero items of one shape: it is not warmed
        // up on them, and `auto` probes it with its warm-up samples.
        let spec = PrepareSpec {
            max_batch_size: max,
            auto,
            auto_floor: samples.iter().map(|s| s.batch_size()).max().unwrap_or(0),
            allowed_batch_sizes: if max > 0 { allowed.clone() } else { Vec::new() },
            buckets,
            warmup: config.warmup && model.warms_up_on_zeros() && !ragged,
        };
        // Samples are requests as clients send them: a ragged model's are assembled as its
        // batches are.
        let form = match ragged && (auto || !samples.is_empty()) {
            true => crate::ragged::Ragged::new(
                &config.inputs,
                (&config.batch_inputs, &config.batch_outputs),
                model.signature(),
                max > 0,
                model.answers_requests() || model.streams(),
            )
            .map_err(BackendError::Load)?,
            false => None,
        };
        let settled = match &form {
            Some(form) => batcher::prepare::prepare_probing(model, &spec, &name, &|items| {
                crate::warmup::probe_batch(&samples, form, items)
            })?,
            None => batcher::prepare::prepare(model, &spec, &name)?,
        };
        if let (Some(first), true) = (first.as_mut(), auto) {
            **first = Some(settled.max_batch_size);
        }
        drop(first);
        crate::warmup::run(model, &samples, &settled, &name, form.as_ref())?;
        Ok(settled)
    })
}

/// The batching policy `config` asks for, for a model that runs the `allowed` batch sizes
/// (empty: any).
fn policy(config: &ModelConfig, max_batch_size: usize, allowed: &[usize]) -> Box<dyn BatchPolicy> {
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
        PolicyKind::LatencySlo => Box::new(
            LatencySlo::new(
                max_batch_size,
                std::time::Duration::from_millis(b.latency_slo_ms),
            )
            .with_sizes(allowed),
        ),
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
        // A limit the model sets itself (a Python model's `auto_complete_config`) bounds the
        // probe.
        Some(MaxBatchSize::Auto(_)) if batchable => Ok((
            match declared {
                Some(MaxBatchSize::Size(n)) if n > 0 => n.min(config.auto_limit()),
                _ => config.auto_limit(),
            },
            true,
        )),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::prepare::tests::counting;

    #[test]
    fn with_auto_the_first_instance_probes_and_the_others_take_its_size() {
        let config = ModelConfig::from_yaml("max_batch_size: auto\n").unwrap();
        let each = prepare("m", &config, &[], (false, false), Arc::default());
        let (mut first, mut second) = (counting(), counting());
        let probed = each(&mut first).unwrap();
        let taken = each(&mut second).unwrap();
        assert_eq!(taken, probed);
        // The second ran only its warm-up, one batch of each size up to the first's, largest
        // first; the first ran the probe before it.
        let mut sizes = crate::batcher::prepare::powers_of_two_and(probed.max_batch_size);
        sizes.reverse();
        assert_eq!(second.runs, sizes);
        assert!(first.runs.len() > sizes.len() + 10, "{:?}", first.runs);
        // Without auto, each instance prepares on its own as configured.
        let config = ModelConfig::from_yaml("max_batch_size: 4\n").unwrap();
        let each = prepare("m", &config, &[], (false, false), Arc::default());
        let mut third = counting();
        assert_eq!(each(&mut third).unwrap().max_batch_size, 4);
        assert_eq!(third.runs, vec![4, 2, 1]);
    }
}
