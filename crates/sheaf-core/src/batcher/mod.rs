//! The dynamic batcher of one model.
//!
//! Who owns what:
//! - [`Batcher`] is a cheap, cloneable handle. It holds the model's queue ([`shared::Shared`]) and
//!   its admission semaphore (one permit per queued item), and one per priority level that
//!   bounds its own items ([`LevelPolicy`]).
//! - The queue, with the model's [`BatchPolicy`], lives behind one lock. Whoever moves a
//!   request along runs the policy there and sends the batch that is due: the request handler
//!   that queues a request (an instance is free), the instance that has just finished a batch
//!   (it takes its own next batch, with no other thread woken in between), and a timer task,
//!   for a delay or a deadline that runs out while nobody else is there (woken to the
//!   microsecond, [`timer`]; and woken by the others only for a time sooner than its own,
//!   [`shared::TimerAt`]). Where the model runs only some batch sizes, a batch between two of
//!   them takes the smaller size's worth when padding would cost more per item by the learned
//!   cost curve ([`policy::trimmed_to_bucket`]). Forming a batch concatenates its inputs and
//!   sends it to the execution instances over a std channel. Instances that keep input buffers
//!   of their own ([`sheaf_backend::Model::stage`]: bound CUDA buckets) get the requests'
//!   tensors unassembled instead, and copy each straight into its rows; so do instances that
//!   answer each request on its own ([`sheaf_backend::Model::infer_requests`]).
//! - Execution instances are OS threads (see [`executor`]); each runs one batch at a time and
//!   records its size and device time in the queue, where the policy learns from it. A request
//!   the model asks to run again (Triton's request rescheduling, for an iterative model) goes
//!   back into the queue ahead of its priority level's later arrivals, its reply and admission
//!   places still held, and is batched with them ([`shared::Shared::requeue`]).
//!
//! Pipelining: `instances × pipeline_depth` slots bound the batches in flight. While every
//! instance is busy, the queue keeps gathering requests. It assembles a batch ahead of time (the
//! copy into one buffer overlapping the running batch) only when that batch is full and nothing
//! could still change it: one priority level and no deadlines queued. A partial batch waits for a
//! free instance, so that it can still grow; a request with a deadline stays expirable, and a
//! higher-priority arrival can still go first, until an instance takes it. An instance skips a
//! batch whose clients have all gone.
//!
//! Invariants: a request is answered exactly once, by its [`queue::Reply`]; its admission
//! permits live until then, so queued items never exceed `max_queue_size`.

mod executor;
mod per_request;
pub mod policy;
pub mod prepare;
mod queue;
mod shared;
pub(crate) mod timer;

pub use prepare::{PrepareSpec, Settled};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sheaf_backend::affinity::CpuList;
use sheaf_backend::{Backend, BackendError, LoadSpec, Signature, Tensor};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::config::PaddingConfig;
use crate::stages::Receipt;
use crate::stats::ModelStats;
use crate::{ErrorKind, InferError};
pub use executor::Prepare;
use executor::{Batch, InstanceContext};
use policy::CostModel;
pub use policy::{BatchPolicy, Decision, QueueState};
use queue::{Job, Queue, Reply};
pub use queue::{Part, TimeoutAction};
use shared::{Core, Shared};

/// How one model's batcher behaves.
#[derive(Debug)]
pub struct BatcherConfig {
    pub policy: Box<dyn BatchPolicy>,
    /// Most items waiting at once; more is refused as overload.
    pub max_queue_size: usize,
    /// Priority levels; level index 0 is served first.
    pub priority_levels: usize,
    /// What happens to a request whose timeout passes while it waits.
    pub timeout_action: TimeoutAction,
    /// Per priority level (index 0 first), where its queue policy differs from the above
    /// (Triton's `priority_queue_policy`); shorter than the levels: the rest do not differ.
    pub level_policies: Vec<LevelPolicy>,
    /// Batch sizes the model may run, ascending; a batch is padded up to the next one. Empty:
    /// any size.
    pub allowed_batch_sizes: Vec<usize>,
    /// Variable-length batching: the pad value, bucket width and token budget.
    pub padding: Option<PaddingConfig>,
    /// Ragged batching: which inputs stack with any shape, and for a model that takes the
    /// batch as one tensor per input, its batch inputs and scattered outputs.
    pub ragged: Option<Arc<crate::ragged::Ragged>>,
}

/// A priority level's places in the queue, and how many there are.
type LevelRoom = (Arc<Semaphore>, usize);

/// One priority level's queue policy, where it differs from the model's.
#[derive(Debug, Clone, Default)]
pub struct LevelPolicy {
    /// What happens to a request of this level whose timeout passes.
    pub timeout_action: Option<TimeoutAction>,
    /// Most items of this level waiting or running at once, within the model's bound.
    pub max_queue_size: Option<usize>,
}

/// Where and how long one request may wait, and the id its client gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// Priority level index: 0 is served first.
    pub level: usize,
    /// The request must start within this time of being queued.
    pub timeout: Option<Duration>,
    /// What else is known of the request (its id, sequence and requested outputs), for models
    /// that see their requests one by one (Triton's `execute(requests)`); none when the client
    /// said nothing more.
    pub info: Option<Arc<sheaf_backend::RequestInfo>>,
    /// Which of the model's outputs the request reads, by index; none: every one. An output
    /// it does not read is not sliced from its batches (nor cropped, nor kept alive): an empty
    /// tensor of shape `[items, 0]` stands in its place.
    pub reads: Option<Arc<[bool]>>,
}

/// What a model's instances take from the server's rate limiter, on `device`.
pub struct RateNeeds<'a> {
    pub limiter: &'a Arc<crate::rate_limit::RateLimiter>,
    pub config: &'a crate::rate_limit::RateLimiterConfig,
    pub device: &'a str,
}

/// Handle to a model's batcher; clones share one queue.
#[derive(Clone)]
pub struct Batcher {
    shared: Arc<Shared>,
    /// Held by every handle: the timer task ends when the last one is dropped.
    _alive: mpsc::Sender<()>,
    queued: Arc<AtomicUsize>,
    /// The deepest the queue has been, in items.
    max_queued: Arc<AtomicUsize>,
    /// Pipeline slots: batches in flight are `total_slots` minus the free ones.
    slots: Arc<Semaphore>,
    total_slots: usize,
    /// The device's learned cost curve `(a, c)` in seconds, published by the queue.
    cost: Arc<Mutex<Option<(f64, f64)>>>,
    max_batch_size: usize,
    admission: Arc<Semaphore>,
    max_queue_size: usize,
    /// Per priority level with a bound of its own: its places, and how many.
    level_room: Arc<[Option<LevelRoom>]>,
    stats: Arc<ModelStats>,
    model: Arc<str>,
}

/// The instances of a model, loaded and waiting for batches.
pub struct Instances {
    batches: SyncSender<Batch>,
    /// Where the instances find the model's queue once the batcher has started.
    queue: Arc<OnceLock<Arc<Shared>>>,
    count: usize,
    pipeline_depth: usize,
    pub signature: Signature,
    /// The batch size the instances settled on (see [`PrepareSpec`]).
    pub max_batch_size: usize,
    /// The sizes the instances settled on padding batches to; empty: any size.
    pub batch_sizes: Vec<usize>,
    /// Memory all the instances hold, as their backend reports it (0 if unknown).
    pub memory_bytes: u64,
    /// Whether the instances copy the requests' tensors into their own buffers, so that the
    /// batcher hands them batches unassembled ([`sheaf_backend::Model::stage`]).
    pub stages_inputs: bool,
    /// Whether the model streams its responses ([`sheaf_backend::Model::streams`]).
    pub streams: bool,
    /// Whether the model sees each request on its own ([`sheaf_backend::Model::answers_requests`]
    /// or [`sheaf_backend::Model::streams`]).
    pub sees_requests: bool,
    /// Each instance's word on whether it can serve now, of those that have one
    /// ([`sheaf_backend::Model::ready_check`]).
    pub checks: Vec<Arc<dyn sheaf_backend::ReadyCheck>>,
}

/// Loads `instances` copies of the model on their own threads and waits until all are ready;
/// instance `i` runs on the cores of `cpus[i]`, where given, and each takes the resources
/// `rate` names from its rate limiter (on `rate`'s device) while it runs a batch. Returns the
/// signature they report; if any fails, all are stopped and its error returned.
#[allow(clippy::too_many_arguments)]
pub async fn load_instances(
    model: &str,
    backend: Arc<dyn Backend>,
    spec: LoadSpec,
    instances: usize,
    cpus: Vec<CpuList>,
    pipeline_depth: usize,
    stats: Arc<ModelStats>,
    prepare: executor::Prepare,
    rate: Option<RateNeeds<'_>>,
) -> Result<Instances, BackendError> {
    let instances = instances.max(1);
    let pipeline_depth = pipeline_depth.max(1);
    // Every instance's place in the rate limiter first: a count too small fails the load
    // before any instance starts.
    let mut slots = Vec::with_capacity(instances);
    for _ in 0..instances {
        slots.push(match &rate {
            Some(r) => r
                .limiter
                .register(r.config, r.device)
                .map_err(BackendError::Load)?,
            None => None,
        });
    }
    let mut slots = slots.into_iter();
    // Never full: the batcher holds one of `instances × depth` slots per batch it sends.
    let (tx, rx) = std::sync::mpsc::sync_channel(instances * pipeline_depth);
    let rx = Arc::new(Mutex::new(rx));
    let queue = Arc::new(OnceLock::new());
    let mut ready = Vec::with_capacity(instances);
    for i in 0..instances {
        let ctx = InstanceContext {
            batches: rx.clone(),
            stats: stats.clone(),
            queue: queue.clone(),
            cpus: cpus.get(i).cloned(),
            rate: slots.next().flatten(),
        };
        let name = format!("sheaf-{model}-{i}");
        ready.push(executor::spawn(
            name,
            backend.clone(),
            spec.clone(),
            ctx,
            prepare.clone(),
        ));
    }
    let mut prepared = None;
    let mut checks = Vec::new();
    for r in ready {
        let mut p = r
            .await
            .map_err(|_| BackendError::Load("instance thread stopped while loading".into()))??;
        checks.extend(p.ready_check.take());
        prepared.get_or_insert(p);
    }
    let loaded = prepared.unwrap_or_default();
    Ok(Instances {
        batches: tx,
        queue,
        count: instances,
        pipeline_depth,
        signature: loaded.signature,
        max_batch_size: loaded.max_batch_size,
        batch_sizes: loaded.batch_sizes,
        memory_bytes: loaded.memory_bytes.unwrap_or(0) * instances as u64,
        stages_inputs: loaded.stages_inputs,
        streams: loaded.streams,
        sees_requests: loaded.sees_requests,
        checks,
    })
}

impl Batcher {
    /// Starts the batcher of `model` over loaded `instances`: its queue and its timer task.
    pub fn start(
        model: &str,
        config: BatcherConfig,
        instances: Instances,
        stats: Arc<ModelStats>,
    ) -> Batcher {
        let max_queue_size = config.max_queue_size.max(1);
        let slots = instances.count * instances.pipeline_depth;
        let queued = Arc::new(AtomicUsize::new(0));
        let max_queued = Arc::new(AtomicUsize::new(0));
        let slot_pool = Arc::new(Semaphore::new(slots));
        let cost = Arc::new(Mutex::new(None));
        let max_batch_size = config.policy.max_batch_size();
        let levels = config.priority_levels.max(1);
        let policy = |level: usize| {
            config
                .level_policies
                .get(level)
                .cloned()
                .unwrap_or_default()
        };
        let level_room: Vec<Option<LevelRoom>> = (0..levels)
            .map(|l| {
                policy(l)
                    .max_queue_size
                    .map(|n| (Arc::new(Semaphore::new(n)), n))
            })
            .collect();
        let core = Core {
            queue: Queue::new(
                (0..levels)
                    .map(|l| policy(l).timeout_action.unwrap_or(config.timeout_action))
                    .collect(),
                config
                    .padding
                    .as_ref()
                    .map(|p| (p.bucket_width, p.max_batch_tokens)),
            )
            .with_ragged(config.ragged.as_ref().map(|r| r.inputs())),
            ragged: config.ragged.filter(|r| r.assembles()),
            allowed: config.allowed_batch_sizes,
            pad_value: config.padding.as_ref().map(|p| p.value),
            stages_inputs: instances.stages_inputs,
            pool: Vec::new(),
            timer_at: Default::default(),
            policy: config.policy,
            instances: instances.count,
            slots: slot_pool.clone(),
            total_slots: slots,
            batches: Some(instances.batches),
            last_arrival: None,
            mean_gap: None,
            queued: queued.clone(),
            max_queued: max_queued.clone(),
            cost: CostModel::default(),
            returns: Default::default(),
            published: cost.clone(),
        };
        let shared = Arc::new(Shared::new(core));
        // Set once: the instances were started before the queue existed.
        let _ = instances.queue.set(shared.clone());
        // Nothing is ever sent: the timer task ends when the last handle drops its sender.
        let (alive, handles) = mpsc::channel(1);
        tokio::spawn(shared::run(shared.clone(), handles));
        Batcher {
            shared,
            _alive: alive,
            queued,
            max_queued,
            slots: slot_pool,
            total_slots: slots,
            cost,
            max_batch_size,
            admission: Arc::new(Semaphore::new(max_queue_size)),
            max_queue_size,
            level_room: level_room.into(),
            stats,
            model: model.into(),
        }
    }

    /// Queues a request of `items` items and waits for its outputs (in signature order), with
    /// the account of its time in the batcher and the parameters the model answered with.
    pub async fn submit(
        &self,
        inputs: Vec<Tensor>,
        items: usize,
        admission: Admission,
    ) -> Result<Answered, InferError> {
        let (rx, _) = self.queue(inputs, items, admission, false).await?;
        self.answer(rx).await
    }

    /// Queues a request to a streaming model ([`sheaf_backend::Model::streams`]); returns its
    /// responses as they come (each the outputs in signature order) and, once they end, the
    /// answer that closes the request (no outputs of its own, or the error that cut it short).
    pub async fn submit_stream(
        &self,
        inputs: Vec<Tensor>,
        items: usize,
        admission: Admission,
    ) -> Result<
        (
            tokio::sync::mpsc::UnboundedReceiver<Result<Part, InferError>>,
            impl std::future::Future<Output = Result<Answered, InferError>> + 'static,
        ),
        InferError,
    > {
        let (rx, parts) = self.queue(inputs, items, admission, true).await?;
        let parts =
            parts.ok_or_else(|| InferError::internal("no stream for a streaming request"))?;
        Ok((parts, self.answer(rx)))
    }

    /// Waits for the answer that closes a request; the wait holds nothing of the batcher.
    fn answer(
        &self,
        rx: oneshot::Receiver<queue::Outcome>,
    ) -> impl std::future::Future<Output = Result<Answered, InferError>> + 'static {
        let (model, stats) = (self.model.clone(), self.stats.clone());
        async move {
            let delivered = rx.await.map_err(|_| {
                InferError::internal(format!("model '{model}' stopped before answering"))
            })??;
            Ok(Answered {
                outputs: delivered.outputs,
                receipt: Receipt::new(stats, delivered.timing),
                parameters: delivered.parameters,
            })
        }
    }

    /// Admits and queues a request; with `stream`, its responses stream into the receiver
    /// returned beside the answer's.
    #[allow(clippy::type_complexity)]
    async fn queue(
        &self,
        inputs: Vec<Tensor>,
        items: usize,
        admission: Admission,
        stream: bool,
    ) -> Result<
        (
            oneshot::Receiver<queue::Outcome>,
            Option<tokio::sync::mpsc::UnboundedReceiver<Result<Part, InferError>>>,
        ),
        InferError,
    > {
        // Failures after queueing are counted by the reply; these are counted here.
        let rejected = |e: InferError| {
            self.stats.record_rejected(e.kind);
            e
        };
        if items > self.max_queue_size {
            return Err(rejected(InferError::invalid(format!(
                "request has {items} items, more than model '{}' can queue ({})",
                self.model, self.max_queue_size
            ))));
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
            })
            .map_err(rejected)?;
        // A level with a bound of its own: the request's places there too.
        let level_permit = match self.level_room.get(admission.level) {
            Some(Some((room, size))) => Some(
                room.clone()
                    .try_acquire_many_owned(items as u32)
                    .map_err(|_| {
                        InferError::new(
                            ErrorKind::Overloaded,
                            format!(
                                "model '{}' is overloaded: the queue of priority level {} is \
                                 full ({size} items); retry later",
                                self.model,
                                admission.level + 1
                            ),
                        )
                    })
                    .map_err(rejected)?,
            ),
            _ => None,
        };
        let permit = (permit, level_permit);
        let (tx, rx) = oneshot::channel();
        let (reply, parts) = if stream {
            let (parts_tx, parts_rx) = tokio::sync::mpsc::unbounded_channel();
            let reply =
                Reply::streaming(tx, parts_tx, items, permit, self.stats.clone(), &admission);
            (reply, Some(parts_rx))
        } else {
            (
                Reply::new(tx, items, permit, self.stats.clone(), &admission),
                None,
            )
        };
        let job = Job {
            inputs,
            items,
            next: 0,
            level: admission.level,
            deadline: admission.timeout.map(|t| Instant::now() + t),
            reply,
        };
        if self.shared.arrive(job).is_err() {
            return Err(InferError::new(
                ErrorKind::NotReady,
                format!("model '{}' is shutting down", self.model),
            ));
        }
        Ok((rx, parts))
    }

    /// Expected seconds until `items` more items would be done on this device, from the items
    /// already admitted and the learned cost curve (before anything is learned: one second per
    /// item, which still ranks devices by load).
    pub fn expected_completion(&self, items: usize) -> f64 {
        let total = (self.pending_items() + items) as f64;
        let cost = *self.cost.lock().unwrap_or_else(|e| e.into_inner());
        match cost {
            Some((a, c)) => {
                let batches = (total / self.max_batch_size.max(1) as f64).ceil();
                batches * a + c * total
            }
            None => total,
        }
    }

    /// Items waiting in the queue (admitted, not yet in a batch).
    pub fn queued_items(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// The deepest the queue has been, in items.
    pub fn max_queued_items(&self) -> usize {
        self.max_queued.load(Ordering::Relaxed)
    }

    /// Batches assembled or running now.
    pub fn inflight_batches(&self) -> usize {
        self.total_slots - self.slots.available_permits()
    }

    /// Items the queue could still admit now.
    pub fn free_room(&self) -> usize {
        self.admission.available_permits()
    }

    /// Items currently admitted (queued or running).
    pub fn pending_items(&self) -> usize {
        self.max_queue_size - self.admission.available_permits()
    }
}

/// A request's answer from the batcher: its outputs in signature order, the account of its
/// time, and the parameters the model put in its answer (a model that answers requests).
#[derive(Debug)]
pub struct Answered {
    pub outputs: Vec<Tensor>,
    pub receipt: Receipt,
    pub parameters: Option<crate::request::Parameters>,
}

/// Converts a configured delay in microseconds.
pub fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sheaf_backend::{DataType, Model, TensorSpec};

    /// Records where each batch's input bytes live, and answers with a copy of them. With
    /// `stages`, it takes batches as pieces ([`Model::stage`]) and records each piece's bytes.
    struct Recorder {
        signature: Signature,
        seen: Arc<Mutex<Vec<usize>>>,
        stages: bool,
        staged: Option<Tensor>,
    }

    impl Model for Recorder {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn stages_inputs(&self) -> bool {
            self.stages
        }

        fn stage(&mut self, pieces: &[Vec<Tensor>], items: usize) -> Result<bool, BackendError> {
            let mut seen = self.seen.lock().unwrap();
            seen.extend(pieces[0].iter().map(|p| p.data().as_ptr() as usize));
            self.staged = Some(Tensor::concat(&pieces[0])?.pad_items(items)?);
            Ok(true)
        }

        fn infer_staged(&mut self) -> Result<Vec<Tensor>, BackendError> {
            Ok(vec![self.staged.take().unwrap()])
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            self.seen
                .lock()
                .unwrap()
                .push(inputs[0].data().as_ptr() as usize);
            let x = &inputs[0];
            Ok(vec![Tensor::new(
                x.dtype(),
                x.shape().to_vec(),
                Bytes::copy_from_slice(x.data()),
            )?])
        }
    }

    /// The test models' signature: `x`, four floats an item, in and out.
    fn four_floats() -> Signature {
        let spec = TensorSpec {
            name: "x".into(),
            dtype: DataType::F32,
            shape: vec![-1, 4],
        };
        Signature {
            inputs: vec![spec.clone()],
            outputs: vec![spec],
        }
    }

    struct RecorderBackend(Arc<Mutex<Vec<usize>>>, bool);

    impl Backend for RecorderBackend {
        fn platform(&self) -> &'static str {
            "recorder"
        }

        fn model_file(&self) -> &'static str {
            "model.recorder"
        }

        fn load(&self, _: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
            Ok(Box::new(Recorder {
                signature: four_floats(),
                seen: self.0.clone(),
                stages: self.1,
                staged: None,
            }))
        }
    }

    /// A load spec for the recorder; `bound`: buckets with their own buffers.
    fn spec(bound: bool) -> LoadSpec {
        LoadSpec {
            path: "unused".into(),
            intra_op_threads: 1,
            device: Default::default(),
            session_per_batch_size: bound,
            io_binding: Some(bound),
            cuda: Default::default(),
            graph: Default::default(),
            model_config: None,
            interpreter: None,
            auto_complete: true,
            max_batch_size_open: false,
            execution_timeout: None,
        }
    }

    fn item(v: f32) -> Tensor {
        let data: Vec<u8> = [v; 4].iter().flat_map(|f| f.to_le_bytes()).collect();
        Tensor::new(DataType::F32, vec![1, 4], Bytes::from(data)).unwrap()
    }

    /// One recorder instance, recording into `seen`, behind a `fixed` policy that waits up to
    /// 50 ms for 8 items.
    async fn recorded(seen: &Arc<Mutex<Vec<usize>>>) -> Batcher {
        let stats = Arc::new(ModelStats::default());
        let spec = spec(false);
        let prepare: Prepare = Arc::new(|m| {
            Ok(Settled {
                max_batch_size: m.signature().inputs.len() * 8,
                batch_sizes: Vec::new(),
            })
        });
        let instances = load_instances(
            "m",
            Arc::new(RecorderBackend(seen.clone(), false)),
            spec,
            1,
            Vec::new(),
            2,
            stats.clone(),
            prepare,
            None,
        )
        .await
        .unwrap();
        let policy = policy::Fixed {
            max_batch_size: 8,
            min_batch_size: 1,
            max_queue_delay: Duration::from_millis(50),
            preferred_batch_sizes: vec![],
        };
        let config = BatcherConfig {
            policy: Box::new(policy),
            max_queue_size: 64,
            priority_levels: 1,
            timeout_action: TimeoutAction::Reject,
            level_policies: Vec::new(),
            allowed_batch_sizes: vec![],
            padding: None,
            ragged: None,
        };
        Batcher::start("m", config, instances, stats)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn assembled_batches_reuse_their_input_buffers() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let batcher = recorded(&seen).await;
        for round in 0..3 {
            let (a, b) = tokio::join!(
                batcher.submit(vec![item(round as f32)], 1, Admission::default()),
                batcher.submit(vec![item(10.0 + round as f32)], 1, Admission::default()),
            );
            // Each request gets its own item back, from the shared batch.
            assert_eq!(
                a.unwrap().outputs[0].data().as_ref(),
                item(round as f32).data().as_ref()
            );
            assert_eq!(
                b.unwrap().outputs[0].data().as_ref(),
                item(10.0 + round as f32).data().as_ref()
            );
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "each round was one batch of two");
        assert!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "the same buffer served every batch: {seen:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_output_a_request_does_not_read_is_not_cut_from_its_batch_for_it() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let batcher = recorded(&seen).await;
        let unread = Admission {
            reads: Some(vec![false].into()),
            ..Admission::default()
        };
        let (a, b) = tokio::join!(
            batcher.submit(vec![item(1.0)], 1, unread),
            batcher.submit(vec![item(2.0)], 1, Admission::default()),
        );
        assert_eq!(seen.lock().unwrap().len(), 1, "one batch of two");
        // The request that reads no output gets an empty stand-in of its one row.
        let a = a.unwrap().outputs;
        assert_eq!((a[0].shape(), a[0].data().len()), (&[1, 0][..], 0));
        // Its neighbour in the batch reads its own row.
        assert_eq!(
            b.unwrap().outputs[0].data().as_ref(),
            item(2.0).data().as_ref()
        );
    }

    /// One instance of `backend` (`bound`: with buckets of its own buffers) that runs batches of
    /// 4 and 8, behind a `fixed` policy that waits up to `delay` for 8 items; and whether the
    /// instance takes the requests unassembled.
    async fn bucketed(backend: Arc<dyn Backend>, bound: bool, delay: Duration) -> (bool, Batcher) {
        let stats = Arc::new(ModelStats::default());
        let prepare: Prepare = Arc::new(|_| {
            Ok(Settled {
                max_batch_size: 8,
                batch_sizes: vec![4, 8],
            })
        });
        let instances = load_instances(
            "m",
            backend,
            spec(bound),
            1,
            Vec::new(),
            2,
            stats.clone(),
            prepare,
            None,
        )
        .await
        .unwrap();
        let stages_inputs = instances.stages_inputs;
        let config = BatcherConfig {
            policy: Box::new(policy::Fixed {
                max_batch_size: 8,
                min_batch_size: 1,
                max_queue_delay: delay,
                preferred_batch_sizes: vec![],
            }),
            max_queue_size: 64,
            priority_levels: 1,
            timeout_action: TimeoutAction::Reject,
            level_policies: Vec::new(),
            allowed_batch_sizes: vec![4, 8],
            padding: None,
            ragged: None,
        };
        (stages_inputs, Batcher::start("m", config, instances, stats))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn instances_that_stage_get_the_requests_own_bytes_unassembled() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let backend = Arc::new(RecorderBackend(seen.clone(), true));
        let (stages_inputs, batcher) = bucketed(backend, true, Duration::from_millis(50)).await;
        assert!(stages_inputs);
        let (a, b) = (item(1.0), item(2.0));
        let sent = [a.data().as_ptr() as usize, b.data().as_ptr() as usize];
        let (ra, rb) = tokio::join!(
            batcher.submit(vec![a.clone()], 1, Admission::default()),
            batcher.submit(vec![b.clone()], 1, Admission::default()),
        );
        assert_eq!(ra.unwrap().outputs[0], a);
        assert_eq!(rb.unwrap().outputs[0], b);
        // The instance saw each request's own bytes, not a copy assembled by the batcher.
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        let mut sent = sent.to_vec();
        sent.sort_unstable();
        assert_eq!(seen, sent);
    }

    /// Takes 4 ms a row of its batch, padding included, records each batch's rows and answers
    /// with its input.
    struct Paced {
        signature: Signature,
        rows: Arc<Mutex<Vec<usize>>>,
    }

    impl Model for Paced {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            let rows = inputs[0].items();
            std::thread::sleep(Duration::from_millis(4 * rows as u64));
            self.rows.lock().unwrap().push(rows);
            Ok(vec![inputs[0].clone()])
        }
    }

    struct PacedBackend(Arc<Mutex<Vec<usize>>>);

    impl Backend for PacedBackend {
        fn platform(&self) -> &'static str {
            "paced"
        }

        fn model_file(&self) -> &'static str {
            "model.paced"
        }

        fn load(&self, _: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
            Ok(Box::new(Paced {
                signature: four_floats(),
                rows: self.0.clone(),
            }))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_between_two_sizes_runs_the_smaller_full_and_leaves_the_rest_queued() {
        let rows = Arc::new(Mutex::new(Vec::new()));
        let backend = Arc::new(PacedBackend(rows.clone()));
        let (_, batcher) = bucketed(backend, false, Duration::from_millis(30)).await;
        let burst = |n: usize, from: usize| {
            let batcher = batcher.clone();
            async move {
                let sent = (from..from + n).map(|v| {
                    let batcher = batcher.clone();
                    async move {
                        let x = item(v as f32);
                        let answer = batcher.submit(vec![x.clone()], 1, Admission::default());
                        assert_eq!(answer.await.unwrap().outputs[0], x, "item {v}");
                    }
                });
                futures::future::join_all(sent).await;
            }
        };
        // Before any batch has run, nothing is known of the cost: 6 items go as one batch,
        // padded to 8. Then the curve is learned from batches of 4 and 8 (4 ms a row, nothing
        // fixed).
        burst(6, 0).await;
        burst(4, 10).await;
        burst(8, 20).await;
        assert_eq!(rows.lock().unwrap().clone(), vec![8, 4, 8]);
        // Padding 6 items to 8 costs 32 ms for 6; 4 of them run as a full batch of 4 (16 ms),
        // and the other 2 go next, padded to 4: every item answered with its own value.
        rows.lock().unwrap().clear();
        burst(6, 30).await;
        assert_eq!(rows.lock().unwrap().clone(), vec![4, 4]);
    }

    /// Each batch's requests, as their values and the sequence flags each run saw.
    type Runs = Arc<Mutex<Vec<Vec<(u32, u32)>>>>;

    /// Answers each request once it has run as many times as its value says, asking for it to
    /// run again until then (Triton's request rescheduling); records each batch ([`Runs`]).
    struct Iterating {
        signature: Signature,
        runs: std::collections::HashMap<u32, u32>,
        batches: Runs,
        gate: Gate,
    }

    /// Holds the first batch until the test says: says it has begun, then waits to be let go.
    type Gate = Arc<Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>>;

    impl Model for Iterating {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn infer(&mut self, _: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            unreachable!("the model answers requests")
        }

        fn answers_requests(&self) -> bool {
            true
        }

        fn infer_requests(
            &mut self,
            requests: &[Vec<Tensor>],
            infos: &[&sheaf_backend::RequestInfo],
        ) -> Vec<Result<sheaf_backend::Answer, BackendError>> {
            if let Some((begun, go)) = self.gate.lock().unwrap().take() {
                begun.send(()).unwrap();
                go.recv().unwrap();
            }
            let mut batch = Vec::new();
            let answers = requests
                .iter()
                .zip(infos)
                .map(|(r, info)| {
                    let wanted =
                        r[0].data()[..4].try_into().map(f32::from_le_bytes).unwrap() as u32;
                    batch.push((wanted, info.flags));
                    let runs = self.runs.entry(wanted).or_default();
                    *runs += 1;
                    if *runs < wanted {
                        return Err(BackendError::Rescheduled);
                    }
                    Ok(vec![item(*runs as f32)].into())
                })
                .collect();
            self.batches.lock().unwrap().push(batch);
            answers
        }
    }

    struct IteratingBackend(Runs, Gate);

    impl Backend for IteratingBackend {
        fn platform(&self) -> &'static str {
            "iterating"
        }

        fn model_file(&self) -> &'static str {
            "model.iterating"
        }

        fn load(&self, _: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
            Ok(Box::new(Iterating {
                signature: four_floats(),
                runs: Default::default(),
                batches: self.0.clone(),
                gate: self.1.clone(),
            }))
        }
    }

    /// A batcher on one instance of [`Iterating`], under the `fixed` policy.
    async fn iterating(
        batches: &Runs,
        gate: Gate,
        max_batch_size: usize,
        max_queue_delay: Duration,
        priority_levels: usize,
    ) -> Batcher {
        let stats = Arc::new(ModelStats::default());
        let prepare: Prepare = Arc::new(move |_| {
            Ok(Settled {
                max_batch_size,
                batch_sizes: Vec::new(),
            })
        });
        let instances = load_instances(
            "m",
            Arc::new(IteratingBackend(batches.clone(), gate)),
            spec(false),
            1,
            Vec::new(),
            1,
            stats.clone(),
            prepare,
            None,
        )
        .await
        .unwrap();
        let config = BatcherConfig {
            policy: Box::new(policy::Fixed {
                max_batch_size,
                min_batch_size: 1,
                max_queue_delay,
                preferred_batch_sizes: vec![],
            }),
            max_queue_size: 64,
            priority_levels,
            timeout_action: TimeoutAction::Reject,
            level_policies: Vec::new(),
            allowed_batch_sizes: vec![],
            padding: None,
            ragged: None,
        };
        Batcher::start("m", config, instances, stats)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_the_model_asks_to_run_again_goes_on_in_later_batches() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let batcher = iterating(&batches, Gate::default(), 8, Duration::from_millis(20), 1).await;
        let started = |v: f32| {
            let info = sheaf_backend::RequestInfo {
                flags: sheaf_backend::RequestInfo::SEQUENCE_START,
                ..Default::default()
            };
            batcher.submit(
                vec![item(v)],
                1,
                Admission {
                    info: Some(Arc::new(info)),
                    ..Admission::default()
                },
            )
        };
        let (one, three, five) = tokio::join!(started(1.0), started(3.0), started(5.0));
        // Each request is answered once, after as many runs as it asked for.
        for (answer, runs) in [(one, 1.0), (three, 3.0), (five, 5.0)] {
            assert_eq!(answer.unwrap().outputs[0], item(runs));
        }
        let batches = batches.lock().unwrap().clone();
        // The three ran together, then the two still running, then the last alone.
        let requests: Vec<Vec<u32>> = batches
            .iter()
            .map(|b| b.iter().map(|(v, _)| *v).collect())
            .collect();
        assert_eq!(requests.len(), 5, "{requests:?}");
        assert_eq!(requests[0].len(), 3, "{requests:?}");
        assert_eq!(requests.iter().map(Vec::len).sum::<usize>(), 1 + 3 + 5);
        // START on each request's first run only.
        let flags: Vec<(u32, u32)> = batches.concat();
        for wanted in [1, 3, 5] {
            let seen: Vec<u32> = flags
                .iter()
                .filter(|(v, _)| *v == wanted)
                .map(|(_, f)| *f)
                .collect();
            assert_eq!(seen[0], sheaf_backend::RequestInfo::SEQUENCE_START);
            assert!(seen[1..].iter().all(|f| *f == 0), "{seen:?}");
        }
        // Nothing is left queued or held.
        assert_eq!(batcher.queued_items(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_run_again_keeps_its_priority_level() {
        // One batch of one at a time. A low-priority request that runs three times starts
        // alone; two high-priority requests arrive during its first run. It goes on after them.
        let batches = Arc::new(Mutex::new(Vec::new()));
        let (begun_tx, begun) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let gate: Gate = Arc::new(Mutex::new(Some((begun_tx, go_rx))));
        let batcher = iterating(&batches, gate, 1, Duration::ZERO, 2).await;
        let send = |v: f32, level: usize| {
            let batcher = batcher.clone();
            tokio::spawn(async move {
                let admission = Admission {
                    level,
                    ..Admission::default()
                };
                batcher.submit(vec![item(v)], 1, admission).await
            })
        };
        let low = send(3.0, 1);
        tokio::task::spawn_blocking(move || begun.recv())
            .await
            .unwrap()
            .unwrap();
        let high = [send(1.0, 0), send(1.0, 0)];
        for _ in 0..10_000 {
            if batcher.queued_items() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(batcher.queued_items(), 2);
        go.send(()).unwrap();
        assert_eq!(low.await.unwrap().unwrap().outputs[0], item(3.0));
        for h in high {
            h.await.unwrap().unwrap();
        }
        let order: Vec<u32> = batches.lock().unwrap().iter().map(|b| b[0].0).collect();
        assert_eq!(order, [3, 1, 1, 3, 3]);
    }
}
