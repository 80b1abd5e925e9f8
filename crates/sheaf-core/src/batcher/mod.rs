//! The dynamic batcher of one model.
//!
//! Who owns what:
//! - [`Batcher`] is a cheap, cloneable handle. It holds the sending side of a bounded channel of
//!   [`Job`]s and the model's admission semaphore (one permit per queued item).
//! - One tokio task owns the [`Queue`]. It pulls jobs from the channel, asks the [`FixedPolicy`]
//!   whether to dispatch, forms a batch from the head of the queue, concatenates its inputs, and
//!   sends it to the execution instances over a std channel.
//! - Execution instances are OS threads (see [`executor`]); each runs one batch at a time.
//!
//! Pipelining: `instances × pipeline_depth` slots bound the batches in flight. While every
//! instance is busy, the task keeps gathering requests. It assembles a batch ahead of time (the
//! copy into one buffer overlapping the running batch) only when that batch is full; a partial
//! batch waits for a free instance, so that it can still grow.
//!
//! Invariants: a request is answered exactly once, by its [`queue::Reply`]; its admission
//! permits live until then, so queued items never exceed `max_queue_size`.

mod executor;
pub mod policy;
mod queue;

use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sheaf_backend::{Backend, BackendError, LoadSpec, Signature, Tensor};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::time::Instant;

use crate::stats::ModelStats;
use crate::{ErrorKind, InferError};
use executor::{Batch, InstanceContext};
pub use policy::{Decision, FixedPolicy, QueueState};
use queue::{Job, Queue, Reply};

/// How one model's batcher behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatcherConfig {
    pub policy: FixedPolicy,
    /// Most items waiting at once; more is refused as overload.
    pub max_queue_size: usize,
    /// Execution instances (threads, each with its own loaded model).
    pub instances: usize,
    /// Batches in flight per instance.
    pub pipeline_depth: usize,
}

/// Handle to a model's batcher; clones share one queue.
#[derive(Clone)]
pub struct Batcher {
    jobs: mpsc::Sender<Job>,
    admission: Arc<Semaphore>,
    max_queue_size: usize,
    stats: Arc<ModelStats>,
    model: Arc<str>,
}

/// The instances of a model, loaded and waiting for batches.
pub struct Instances {
    batches: SyncSender<Batch>,
    freed: Arc<Notify>,
    count: usize,
    pipeline_depth: usize,
    pub signature: Signature,
}

/// Loads `instances` copies of the model on their own threads and waits until all are ready.
/// Returns the signature they report; if any fails, all are stopped and its error returned.
pub async fn load_instances(
    model: &str,
    backend: Arc<dyn Backend>,
    spec: LoadSpec,
    instances: usize,
    pipeline_depth: usize,
    stats: Arc<ModelStats>,
) -> Result<Instances, BackendError> {
    let instances = instances.max(1);
    let pipeline_depth = pipeline_depth.max(1);
    // Never full: the batcher holds one of `instances × depth` slots per batch it sends.
    let (tx, rx) = std::sync::mpsc::sync_channel(instances * pipeline_depth);
    let rx = Arc::new(Mutex::new(rx));
    let freed = Arc::new(Notify::new());
    let mut ready = Vec::with_capacity(instances);
    for i in 0..instances {
        let ctx = InstanceContext {
            batches: rx.clone(),
            stats: stats.clone(),
            freed: freed.clone(),
        };
        let name = format!("sheaf-{model}-{i}");
        ready.push(executor::spawn(name, backend.clone(), spec.clone(), ctx));
    }
    let mut signature = None;
    for r in ready {
        let sig = r
            .await
            .map_err(|_| BackendError::Load("instance thread stopped while loading".into()))??;
        signature.get_or_insert(sig);
    }
    Ok(Instances {
        batches: tx,
        freed,
        count: instances,
        pipeline_depth,
        signature: signature.unwrap_or_default(),
    })
}

impl Batcher {
    /// Starts the batching task for `model` over loaded `instances`.
    pub fn start(
        model: &str,
        config: BatcherConfig,
        instances: Instances,
        stats: Arc<ModelStats>,
    ) -> Batcher {
        let max_queue_size = config.max_queue_size.max(1);
        // Each queued job holds at least one admission permit, so at most `max_queue_size` jobs
        // exist at once and a send on this channel never waits.
        let (tx, rx) = mpsc::channel(max_queue_size);
        let slots = instances.count * instances.pipeline_depth;
        let task = BatchTask {
            jobs: rx,
            queue: Queue::default(),
            policy: config.policy,
            instances: instances.count,
            slots: Arc::new(Semaphore::new(slots)),
            total_slots: slots,
            batches: instances.batches,
            freed: instances.freed,
        };
        tokio::spawn(task.run());
        Batcher {
            jobs: tx,
            admission: Arc::new(Semaphore::new(max_queue_size)),
            max_queue_size,
            stats,
            model: model.into(),
        }
    }

    /// Queues a request of `items` items and waits for its outputs (in signature order).
    pub async fn submit(
        &self,
        inputs: Vec<Tensor>,
        items: usize,
    ) -> Result<Vec<Tensor>, InferError> {
        if items > self.max_queue_size {
            return Err(InferError::invalid(format!(
                "request has {items} items, more than model '{}' can queue ({})",
                self.model, self.max_queue_size
            )));
        }
        let permit = self
            .admission
            .clone()
            .try_acquire_many_owned(items as u32)
            .map_err(|_| {
                InferError::new(
                    ErrorKind::Overloaded,
                    format!(
                        "model '{}' is overloaded: its queue is full ({} items); retry later",
                        self.model, self.max_queue_size
                    ),
                )
            })?;
        let (tx, rx) = oneshot::channel();
        let reply = Reply::new(tx, items, permit, self.stats.clone());
        let job = Job {
            inputs,
            items,
            next: 0,
            reply,
        };
        self.jobs.send(job).await.map_err(|_| {
            InferError::new(
                ErrorKind::NotReady,
                format!("model '{}' is shutting down", self.model),
            )
        })?;
        rx.await.map_err(|_| {
            InferError::internal(format!("model '{}' stopped before answering", self.model))
        })?
    }

    /// Items currently admitted (queued or running).
    pub fn pending_items(&self) -> usize {
        self.max_queue_size - self.admission.available_permits()
    }
}

/// The task that owns one model's queue.
struct BatchTask {
    jobs: mpsc::Receiver<Job>,
    queue: Queue,
    policy: FixedPolicy,
    instances: usize,
    slots: Arc<Semaphore>,
    total_slots: usize,
    batches: SyncSender<Batch>,
    freed: Arc<Notify>,
}

impl BatchTask {
    async fn run(mut self) {
        loop {
            while let Ok(job) = self.jobs.try_recv() {
                self.queue.push(job);
            }
            let now = Instant::now();
            let in_flight = self.total_slots - self.slots.available_permits();
            match self.policy.decide(&self.queue.state(), now) {
                Decision::Dispatch { full }
                    if in_flight < self.instances || (full && in_flight < self.total_slots) =>
                {
                    if !self.dispatch(now) {
                        break;
                    }
                }
                Decision::Dispatch { .. } => tokio::select! {
                    job = self.jobs.recv() => match job {
                        Some(job) => self.queue.push(job),
                        None => break,
                    },
                    _ = self.freed.notified() => {}
                },
                Decision::WaitUntil(due) => tokio::select! {
                    job = self.jobs.recv() => match job {
                        Some(job) => self.queue.push(job),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(due) => {}
                },
                Decision::Idle => match self.jobs.recv().await {
                    Some(job) => self.queue.push(job),
                    None => break,
                },
            }
        }
        self.queue.fail_all(InferError::new(
            ErrorKind::NotReady,
            "the model was unloaded",
        ));
    }

    /// Forms, assembles and sends one batch. Returns false when the instances are gone.
    fn dispatch(&mut self, now: Instant) -> bool {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return true;
        };
        let Some(formed) = self.queue.take(self.policy.max_batch_size, now) else {
            return true;
        };
        let started = Instant::now();
        let inputs: Result<Vec<Tensor>, _> =
            formed.pieces.iter().map(|p| Tensor::concat(p)).collect();
        let inputs = match inputs {
            Ok(inputs) => inputs,
            Err(e) => {
                let error = InferError::from(e);
                formed
                    .segments
                    .iter()
                    .for_each(|s| s.reply.fail(error.clone()));
                return true;
            }
        };
        let batch = Batch {
            inputs,
            segments: formed.segments,
            size: formed.size,
            batched: self.policy.max_batch_size > 0,
            assembly: started.elapsed(),
            slot,
        };
        if let Err(returned) = self.batches.send(batch) {
            let error = InferError::internal("the model's execution instances stopped");
            returned
                .0
                .segments
                .iter()
                .for_each(|s| s.reply.fail(error.clone()));
            return false;
        }
        true
    }
}

/// Converts a configured delay in microseconds.
pub fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}
