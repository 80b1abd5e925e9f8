//! Execution instances: one named OS thread per loaded model instance.
//!
//! The thread first moves to its cores (the model's `instance_cpus`, else every core the process
//! started with: see [`sheaf_backend::affinity`]), so that what it starts runs there too, then
//! loads the model itself (so the backend's session never crosses threads), reports
//! the signature, then takes assembled batches from a channel shared by the model's instances,
//! runs them, and slices the outputs back to each request. An instance that answers each request
//! on its own ([`Model::infer_requests`]: a Triton-style Python model) gets the batch as its
//! requests instead, and each request gets its own answer or error, checked against the
//! signature ([`super::per_request`]); under the server's rate limiter an instance takes its resources before each batch
//! and gives them back when the batch has run ([`crate::rate_limit`]); a streaming model's
//! instance ([`Model::infer_streaming`]: a decoupled Python
//! model) hands each response to its request's stream as it comes, and the request closes when
//! its stream ends, which may be after the call has returned and the instance has moved on to
//! its next batch. A panic inside the backend is caught
//! and fails only the batch that caused it. After each batch the thread frees its pipeline slot,
//! tells the model's queue that the batch's items are being answered (the policy learns from it
//! when clients come back), answers them, records the batch's size and device time in the queue
//! (the policy learns the cost curve from it), and forms its own next batch there if one is due
//! ([`Shared::finished`]), so that no other thread has to wake up between two batches. When the
//! model's batcher ends (the model is unloaded), the channel closes and the thread drops its
//! model and ends; it is registered in [`ModelThreads`] until then, so that the process can wait
//! for it before it exits.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use sheaf_backend::affinity::{self, CpuList};
use sheaf_backend::threads::ModelThreads;
use sheaf_backend::{Backend, BackendError, LoadSpec, Model, Signature, Tensor, TensorSpec};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::per_request;
use super::prepare::Settled;
use super::queue::Segment;
use super::shared::Shared;
use crate::stats::{ModelStats, Phases};
use crate::InferError;

/// A batch's inputs as the batcher hands them over.
pub(crate) enum Inputs {
    /// One tensor per model input, assembled by the batcher.
    Assembled(Vec<Tensor>),
    /// Per model input, the requests' tensors in order, for an instance that copies them into
    /// buffers of its own ([`Model::stage`]); padding rows are the instance's to add.
    Pieces(Vec<Vec<Tensor>>),
}

/// A formed batch on its way to an instance.
pub(crate) struct Batch {
    pub(crate) inputs: Inputs,
    pub(crate) segments: Vec<Segment>,
    /// Real items.
    pub(crate) size: usize,
    /// Items the model runs, padding included (`allowed_batch_sizes`).
    pub(crate) padded: usize,
    /// With variable-length padding: each input's padded item dimensions.
    pub(crate) padded_dims: Option<Vec<Vec<usize>>>,
    /// Whether dimension 0 is the batch: outputs are sliced by it.
    pub(crate) batched: bool,
    /// With ragged batching made here: the outputs sliced by a ragged input's elements.
    pub(crate) scatter: Option<Arc<crate::ragged::Ragged>>,
    /// When its requests were taken from the queue and its assembly started.
    pub(crate) taken: Instant,
    /// When assembly ended: the batch waits from then until an instance starts it.
    pub(crate) assembled: Instant,
    /// The pipeline slot this batch holds until it has run.
    pub(crate) slot: OwnedSemaphorePermit,
}

/// Runs on the instance thread once the model is loaded: settles the batch sizes (for the
/// signature the model reports) and warms up. See [`super::prepare`].
pub type Prepare = Arc<dyn Fn(&mut dyn Model) -> Result<Settled, BackendError> + Send + Sync>;

/// What a loaded instance reports.
#[derive(Clone, Default)]
pub struct Loaded {
    pub signature: Signature,
    pub max_batch_size: usize,
    /// The sizes batches are padded to; empty: any size.
    pub batch_sizes: Vec<usize>,
    pub memory_bytes: Option<u64>,
    /// Whether the instance takes the requests' tensors unassembled: it stages its own inputs
    /// ([`Model::stages_inputs`]) or answers each request on its own
    /// ([`Model::answers_requests`]).
    pub stages_inputs: bool,
    /// Whether the model streams its responses ([`Model::streams`]).
    pub streams: bool,
    /// Whether the model sees each request on its own, with its [`RequestInfo`]
    /// ([`Model::answers_requests`] or [`Model::streams`]).
    pub sees_requests: bool,
    /// How the instance says whether it can serve now ([`Model::ready_check`]).
    pub ready_check: Option<Arc<dyn sheaf_backend::ReadyCheck>>,
}

/// What an instance thread needs besides its model.
pub(crate) struct InstanceContext {
    pub(crate) batches: Arc<Mutex<Receiver<Batch>>>,
    pub(crate) stats: Arc<ModelStats>,
    /// The model's queue, once its batcher has started.
    pub(crate) queue: Arc<OnceLock<Arc<Shared>>>,
    /// The cores the instance runs on; `None`: those the process started with.
    pub(crate) cpus: Option<CpuList>,
    /// The instance's place in the server's rate limiter: it runs a batch only while it
    /// holds its resources ([`crate::rate_limit`]).
    pub(crate) rate: Option<crate::rate_limit::Slot>,
}

/// One executed batch, reported to the queue, with the input buffers it can reuse.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) size: usize,
    pub(crate) took: Duration,
    pub(crate) buffers: Vec<BytesMut>,
}

/// Starts an instance thread named `name` that loads `spec` with `backend` and runs `prepare`.
/// The returned channel yields the model's signature and settled batch size, or the error.
pub(crate) fn spawn(
    name: String,
    backend: Arc<dyn Backend>,
    spec: LoadSpec,
    ctx: InstanceContext,
    prepare: Prepare,
) -> oneshot::Receiver<Result<Loaded, BackendError>> {
    let (ready_tx, ready_rx) = oneshot::channel();
    let thread_name = name.clone();
    let spawned = std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            // Taken before the model exists, so that it drops after the model: the process
            // waits on it before it exits (see sheaf_backend::threads).
            let _registered = ModelThreads::process().enter(&name);
            let placed = match &ctx.cpus {
                Some(cpus) => affinity::pin_current_thread(cpus)
                    .map_err(|e| BackendError::Load(format!("instance_cpus: {e}"))),
                None => affinity::unpin_current_thread().map_err(BackendError::Load),
            };
            if let Err(e) = placed {
                let _ = ready_tx.send(Err(e));
                return;
            }
            let loaded = catch_unwind(AssertUnwindSafe(|| {
                let mut model = backend.load(&spec)?;
                let settled = prepare(model.as_mut())?;
                Ok((model, settled))
            }))
            .unwrap_or_else(|p| {
                Err(BackendError::Load(format!(
                    "loader panicked: {}",
                    panic_text(&p)
                )))
            });
            let (mut model, mut memory) = match loaded {
                Ok((model, settled)) => {
                    let memory = MemoryWatch::new(model.memory_bytes());
                    let ready = Loaded {
                        signature: model.signature().clone(),
                        max_batch_size: settled.max_batch_size,
                        batch_sizes: settled.batch_sizes,
                        memory_bytes: memory.held,
                        stages_inputs: model.stages_inputs()
                            || model.answers_requests()
                            || model.streams(),
                        streams: model.streams(),
                        sees_requests: model.answers_requests() || model.streams(),
                        ready_check: model.ready_check(),
                    };
                    if ready_tx.send(Ok(ready)).is_err() {
                        return;
                    }
                    (model, memory)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            tracing::debug!(instance = %name, "instance ready");
            loop {
                // Several instances share the receiver; the lock is held only while waiting.
                let next = ctx.batches.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(batch) = next else { break };
                let report = Report {
                    stats: &ctx.stats,
                    queue: ctx.queue.get(),
                };
                let grant = ctx.rate.as_ref().map(|slot| slot.acquire());
                let done = run(model.as_mut(), batch, &report, &name);
                drop(grant);
                let ran = done.size > 0;
                // This thread forms its own next batch, if one is due, and takes it next.
                if let Some(queue) = ctx.queue.get() {
                    queue.finished(done);
                }
                if ran {
                    memory.ran(model.as_ref(), &ctx.stats, &name);
                }
            }
            drop(model);
            tracing::debug!(instance = %name, "instance stopped; its model is dropped");
        });
    if let Err(e) = spawned {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Err(BackendError::Load(format!(
            "cannot start instance thread: {e}"
        ))));
        return rx;
    }
    ready_rx
}

/// How an instance keeps the manager's booking of it true: a framework's caching allocator
/// (PyTorch's, a Python model's arrays) grows with the first batches it runs, beyond what the
/// instance held at load. After batch 1, 4, 16, 64, 256 and 1,024, then after the first batch
/// to end [`MemoryWatch::EVERY`] after the last reading, the instance reads what it holds again
/// ([`Model::memory_bytes`]; for a Python model on a GPU that asks the driver, tens of
/// milliseconds, so it is not read after every batch) and reports any growth to its statistics,
/// where the manager finds it ([`crate::ModelHandle::memory_held`]).
struct MemoryWatch {
    /// What the instance held when last read; none: its backend does not say.
    held: Option<u64>,
    batches: u64,
    read_at: std::time::Instant,
}

impl MemoryWatch {
    /// The longest time between two readings once the first 1,024 batches have run.
    const EVERY: Duration = Duration::from_secs(10);

    fn new(held: Option<u64>) -> MemoryWatch {
        MemoryWatch {
            held,
            batches: 0,
            read_at: std::time::Instant::now(),
        }
    }

    /// Whether the instance reads its memory after its `n`-th batch, `since` the last reading.
    fn due(n: u64, since: Duration) -> bool {
        (n <= 1024 && n.is_power_of_two() && n.trailing_zeros().is_multiple_of(2))
            || (n > 1024 && since >= Self::EVERY)
    }

    /// Counts a batch run, and reports growth when a reading is due.
    fn ran(&mut self, model: &dyn Model, stats: &ModelStats, instance: &str) {
        let Some(before) = self.held else { return };
        self.batches += 1;
        if !Self::due(self.batches, self.read_at.elapsed()) {
            return;
        }
        self.read_at = std::time::Instant::now();
        let Some(now) = model.memory_bytes() else {
            return;
        };
        if now > before {
            tracing::debug!(
                instance,
                before_bytes = before,
                now_bytes = now,
                batches = self.batches,
                "instance memory grew"
            );
            stats.record_memory_growth(now - before);
            self.held = Some(now);
        }
    }
}

/// Where an instance reports the end of a batch: to the model's statistics, and to its queue,
/// which learns when the batch's items are answered (see [`super::policy::Returns`]).
pub(super) struct Report<'a> {
    stats: &'a ModelStats,
    pub(super) queue: Option<&'a Arc<Shared>>,
}

impl Report<'_> {
    /// Records a batch of `size` rows, frees its pipeline slot so that the next batch can start
    /// at once, and tells the queue that its `items` are about to be answered.
    fn ended(&self, size: usize, items: usize, phases: Phases, slot: OwnedSemaphorePermit) {
        self.stats.record_batch(size, phases);
        drop(slot);
        if let Some(queue) = self.queue {
            queue.answering(items);
        }
    }
}

/// Runs one batch and answers its segments.
fn run(model: &mut dyn Model, batch: Batch, report: &Report, instance: &str) -> Done {
    let Batch {
        inputs,
        segments,
        size,
        padded,
        padded_dims,
        batched,
        scatter,
        taken,
        assembled,
        slot,
    } = batch;
    // Per output, how many of its rows each segment takes: one per item, or for an output
    // scattered by a ragged input, one per element of that input's items.
    let scattered_by = |o: usize| {
        scatter
            .as_deref()
            .and_then(|r| r.scatter().get(o).copied().flatten())
    };
    let rows_of = |o: usize, seg: &Segment| match scattered_by(o) {
        Some(src) => crate::ragged::scattered_rows(seg.len, seg.dims.get(src).map_or(&[], |d| d)),
        None => seg.len,
    };
    if segments.iter().all(|s| s.reply.is_closed()) {
        tracing::debug!(size, "batch skipped: every client has gone");
        return Done {
            size: 0,
            took: Duration::ZERO,
            buffers: Vec::new(),
        };
    }
    if model.streams() {
        return per_request::run_streaming(
            model,
            per_request::batch_parts(inputs, segments, size, batched, (taken, assembled), slot),
            report,
            instance,
        );
    }
    if model.answers_requests() {
        return per_request::run_requests(
            model,
            per_request::batch_parts(inputs, segments, size, batched, (taken, assembled), slot),
            report,
            instance,
        );
    }
    let started = Instant::now();
    let mut staging = Duration::ZERO;
    let result = catch_unwind(AssertUnwindSafe(|| {
        execute(model, &inputs, padded, &mut staging)
    }));
    let returned = Instant::now();
    // Copying into the instance's own buffers is input, not compute.
    let infer = returned
        .saturating_duration_since(started)
        .saturating_sub(staging);
    // Assembled inputs that only this batch holds go back to the batcher for the next batch;
    // zero-copy inputs (slices of a request's body) are shared and simply dropped.
    let buffers: Vec<BytesMut> = match inputs {
        Inputs::Assembled(tensors) => tensors
            .into_iter()
            .filter_map(|t| t.into_data().try_into_mut().ok())
            .collect(),
        Inputs::Pieces(_) => Vec::new(),
    };
    tracing::debug!(
        instance,
        batch_size = size,
        padded,
        requests = segments.len(),
        queue_wait_ms = segments
            .iter()
            .map(|s| s.reply.waited(started))
            .max()
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0,
        compute_ms = infer.as_secs_f64() * 1000.0,
        "batch"
    );
    let outputs = match result {
        Ok(Ok(outputs)) => {
            check_rows(
                outputs,
                (batched, &model.signature().outputs),
                |o| match scattered_by(o) {
                    Some(_) => segments.iter().map(|seg| rows_of(o, seg)).sum(),
                    None => padded,
                },
            )
        }
        Ok(Err(e)) => Err(InferError::from(e)),
        Err(p) => Err(InferError::internal(format!(
            "model panicked: {}",
            panic_text(&p)
        ))),
    };
    // Each phase runs from one of the batch's instants to the next, so that they add up to the
    // time from `taken` to the end of slicing (see `crate::stages`).
    let mut phases = Phases {
        input: assembled.saturating_duration_since(taken) + staging,
        wait: started.saturating_duration_since(assembled),
        infer,
        output: Duration::ZERO,
    };
    match outputs {
        Ok(outputs) => {
            // Per output, the row the next segment's part starts at.
            let mut at = vec![0; outputs.len()];
            let pieces: Vec<Vec<Tensor>> = segments
                .iter()
                .map(|seg| {
                    if !batched {
                        return outputs.clone();
                    }
                    outputs
                        .iter()
                        .enumerate()
                        .map(|(o, t)| {
                            let (row, count) = (at[o], rows_of(o, seg));
                            at[o] += count;
                            if !seg.reply.reads(o) {
                                return Tensor::empty_rows(t.dtype(), seg.len);
                            }
                            let rows = t.slice_items(row, count);
                            match (scattered_by(o), &padded_dims) {
                                (Some(src), _) => scattered(rows, seg, src),
                                (None, Some(dims)) => {
                                    let spec = &model.signature().outputs[o].shape;
                                    trim(rows, spec, dims, &seg.dims)
                                }
                                (None, None) => rows,
                            }
                        })
                        .collect()
                })
                .collect();
            let sliced = Instant::now();
            phases.output = sliced.saturating_duration_since(returned);
            // Statistics first, so a client that reads them after its answer sees its batch;
            // the slot is free before the replies go out, so the next batch can start at once.
            report.ended(padded, size, phases, slot);
            for (seg, piece) in segments.iter().zip(pieces) {
                seg.reply
                    .deliver(seg.offset, piece, seg.len, (phases, sliced));
            }
        }
        Err(error) => {
            report.ended(padded, size, phases, slot);
            tracing::warn!(%error, size, "batch failed");
            for seg in &segments {
                seg.reply.fail(error.clone());
            }
        }
    }
    Done {
        size: padded,
        took: infer,
        buffers,
    }
}

/// The phases of a batch of requests taken from the queue and assembled at `(taken,
/// assembled)`, that started running at `started` and has just ended, and the instant they
/// end; recorded in the statistics, its pipeline slot freed here, before any answer goes out.
pub(super) fn ran(
    report: &Report,
    size: usize,
    (taken, assembled): (Instant, Instant),
    started: Instant,
    slot: OwnedSemaphorePermit,
) -> (Phases, Instant) {
    let ended = Instant::now();
    let phases = Phases {
        input: assembled.saturating_duration_since(taken),
        wait: started.saturating_duration_since(assembled),
        infer: ended.saturating_duration_since(started),
        output: Duration::ZERO,
    };
    report.ended(size, size, phases, slot);
    (phases, ended)
}

/// Checks one request's answer against the signature: every output, of its type, with one row
/// per item (`rows`) when the model batches.
pub(super) fn fits(
    signature: &Signature,
    outputs: Vec<Tensor>,
    rows: Option<usize>,
) -> Result<Vec<Tensor>, InferError> {
    if outputs.len() != signature.outputs.len() {
        return Err(InferError::internal(format!(
            "the model returned {} outputs; it declares {}",
            outputs.len(),
            signature.outputs.len()
        )));
    }
    for (spec, t) in signature.outputs.iter().zip(&outputs) {
        if t.dtype() != spec.dtype {
            return Err(InferError::internal(format!(
                "the model returned output '{}' as {}; it declares {}",
                spec.name,
                t.dtype().as_str(),
                spec.dtype.as_str()
            )));
        }
        let declared = &spec.shape[usize::from(rows.is_some()).min(spec.shape.len())..];
        let given = &t.shape()[usize::from(rows.is_some()).min(t.shape().len())..];
        let agree = declared.len() == given.len()
            && declared
                .iter()
                .zip(given)
                .all(|(&d, &g)| d < 0 || d as usize == g);
        if !agree {
            return Err(InferError::internal(format!(
                "the model returned output '{}' of shape {:?}; it declares {:?}",
                spec.name,
                t.shape(),
                spec.shape
            )));
        }
        if let Some(rows) = rows {
            if t.shape().is_empty() || t.items() != rows {
                return Err(InferError::internal(format!(
                    "the model returned output '{}' of shape {:?} for a request of {rows} items",
                    spec.name,
                    t.shape()
                )));
            }
        }
    }
    Ok(outputs)
}

/// Runs a batch's inputs: staged by the model from the requests' pieces when it can, else
/// assembled here (for a model whose buffers do not fit this batch) and inferred. `staging` is
/// set to the time spent copying the inputs on this thread.
fn execute(
    model: &mut dyn Model,
    inputs: &Inputs,
    padded: usize,
    staging: &mut Duration,
) -> Result<Vec<Tensor>, BackendError> {
    let pieces = match inputs {
        Inputs::Assembled(tensors) => return model.infer(tensors),
        Inputs::Pieces(pieces) => pieces,
    };
    let started = Instant::now();
    if model.stage(pieces, padded)? {
        *staging = started.elapsed();
        return model.infer_staged();
    }
    let assembled = pieces
        .iter()
        .map(|parts| Tensor::concat(parts).and_then(|t| t.pad_items(padded)))
        .collect::<Result<Vec<_>, _>>()?;
    *staging = started.elapsed();
    model.infer(&assembled)
}

/// Trims padding off one request's output: an output dimension that is dynamic in the signature
/// and has the padded length of an input dimension at the same position is cut back to that
/// input's length in this request (e.g. `[batch, seq]` in, `[batch, seq, hidden]` out).
fn trim(rows: Tensor, spec: &[i64], padded: &[Vec<usize>], request: &[Vec<usize>]) -> Tensor {
    let mut dims = rows.shape().to_vec();
    for k in 1..dims.len() {
        if spec.get(k) != Some(&-1) {
            continue;
        }
        let matched = padded.iter().zip(request).find(|(p, r)| {
            p.get(k - 1) == Some(&dims[k]) && r.get(k - 1).is_some_and(|&n| n < dims[k])
        });
        if let Some((_, r)) = matched {
            dims[k] = r[k - 1];
        }
    }
    if dims == rows.shape() {
        rows
    } else {
        rows.crop(&dims).unwrap_or(rows)
    }
}

/// A batched model must return one row per item for every output (`specs`: the model's
/// outputs, for their names).
fn check_rows(
    outputs: Vec<Tensor>,
    (batched, specs): (bool, &[TensorSpec]),
    rows: impl Fn(usize) -> usize,
) -> Result<Vec<Tensor>, InferError> {
    if batched {
        if let Some((o, bad)) = outputs
            .iter()
            .enumerate()
            .find(|(o, t)| t.shape().is_empty() || t.items() != rows(*o))
        {
            return Err(InferError::internal(format!(
                "the model returned output '{}' of shape {:?} where {} rows were due",
                specs.get(o).map_or("", |s| s.name.as_str()),
                bad.shape(),
                rows(o)
            )));
        }
    }
    Ok(outputs)
}

/// A segment's part of an output scattered by the ragged input at `src`: its rows (one per
/// element of that input) in the shape the request sent the input in, then the output's own
/// dims.
fn scattered(rows: Tensor, seg: &Segment, src: usize) -> Tensor {
    let mut shape = vec![seg.len];
    shape.extend(seg.dims.get(src).map_or(&[][..], |d| d.as_slice()));
    shape.extend(rows.shape().get(1..).unwrap_or_default());
    let dtype = rows.dtype();
    // The element count is the same by construction; should it not be, the rows stand as they are.
    Tensor::new(dtype, shape, rows.data().clone()).unwrap_or(rows)
}

pub(super) fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::MemoryWatch;

    use std::time::Duration;

    #[test]
    fn memory_is_read_often_at_first_then_at_most_every_ten_seconds() {
        let soon = Duration::from_millis(5);
        let due: Vec<u64> = (1..=20_000)
            .filter(|&n| MemoryWatch::due(n, soon))
            .collect();
        assert_eq!(due, [1, 4, 16, 64, 256, 1024]);
        let later = MemoryWatch::EVERY;
        assert!(!MemoryWatch::due(2, later), "early batches go by count");
        assert!(MemoryWatch::due(1025, later) && MemoryWatch::due(50_000, later));
        assert!(!MemoryWatch::due(50_000, later - soon));
    }
}
