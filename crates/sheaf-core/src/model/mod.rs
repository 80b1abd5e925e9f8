//! A loaded model: its signature, resolved configuration, batcher and statistics; or, for a
//! generation model, its engine ([`crate::generate`]).
//!
//! `load` makes one (a model's instances on every device, with their batchers and policies; a
//! pipeline; a generation engine), and `infer` takes a request through it: admission, the
//! request's form for the model, the queue of the lane it routes to, and the answer in the
//! client's form. This file holds the handle and what it says of itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sheaf_backend::generation::Generator;
use sheaf_backend::{Backend, Signature};

use crate::batcher::Batcher;
use crate::cache::CacheSlot;
use crate::embed::TextEncoder;
use crate::frames::FrameStore;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::reshape::Reshapes;
use crate::sequence::Sequences;
use crate::server_config::{DeviceSpec, Routing};
use crate::stats::{ModelStats, StatsSnapshot};
use crate::{InferError, ModelConfig};

mod infer;
mod load;

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
    /// Its ragged batching, for what it admits of a request (see
    /// [`crate::ragged::Ragged::admit`]).
    ragged: Option<Arc<crate::ragged::Ragged>>,
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

    /// Whether a request may leave out the input `name` (Triton's `optional`).
    pub fn is_optional(&self, name: &str) -> bool {
        self.signature
            .inputs
            .iter()
            .zip(&self.optional)
            .any(|(s, &o)| o && s.name == name)
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
