//! One model's queue and the batching decisions over it, shared by everyone who moves a request
//! along, so that no batch waits for another task to wake up:
//! - a request handler queues its request and, if a batch is due and an instance is free,
//!   forms and sends it on the spot ([`Shared::arrive`]);
//! - an instance that has finished a batch records what it learned, then forms its own next
//!   batch under the same policy and takes it ([`Shared::finished`]);
//! - the timer task ([`run`]) handles what must happen while every instance is busy or the
//!   policy waits: deadlines, a batch whose delay runs out, and the end of the model.
//!
//! Every decision is made under one lock, by [`Core::pump`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sheaf_backend::Tensor;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::time::Instant;

use super::executor::{Batch, Done, Inputs};
use super::policy::{BatchPolicy, CostModel, Decision, QueueState, Returns};
use super::queue::{Job, Queue};
use super::timer::Timer;
use crate::{ErrorKind, InferError};

/// A model's queue, shared by its handles, its instances and its timer task.
pub(crate) struct Shared {
    core: Mutex<Core>,
    /// Wakes the timer task: the time it must next look at the queue may have changed.
    timer: Notify,
}

impl Shared {
    pub(super) fn new(core: Core) -> Shared {
        Shared {
            core: Mutex::new(core),
            timer: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a job, and sends a batch if one is due. The job is failed at once if the model
    /// has stopped.
    pub(super) fn arrive(&self, job: Job) -> Result<(), Job> {
        let sooner = {
            let mut core = self.lock();
            if core.batches.is_none() {
                return Err(job);
            }
            core.arrive(job);
            core.pump_waking(Instant::now())
        };
        self.schedule(sooner);
        Ok(())
    }

    /// Queues again, first in their levels and in their order, the requests the model asked to
    /// run again in a later batch (Triton's request rescheduling), all at once so that they go
    /// on together, and sends a batch if one is due. Their admission places stay held, so they
    /// are not refused as overload. Given back if the model has stopped.
    pub(crate) fn requeue(&self, jobs: Vec<Job>) -> Result<(), Vec<Job>> {
        let sooner = {
            let mut core = self.lock();
            if core.batches.is_none() {
                return Err(jobs);
            }
            let now = Instant::now();
            for job in jobs.into_iter().rev() {
                // Its items come back as an answered client's would (see `Returns`).
                core.returns.arrived(job.items, now);
                core.queue.push_front(job);
            }
            core.pump_waking(now)
        };
        self.schedule(sooner);
        Ok(())
    }

    /// Records an executed batch, then sends the next batch if one is due: the instance that
    /// calls this takes it from the channel next.
    pub(crate) fn finished(&self, done: Done) {
        let sooner = {
            let mut core = self.lock();
            core.observe(done);
            core.pump_waking(Instant::now())
        };
        self.schedule(sooner);
    }

    /// Learns that an instance is about to answer `items`, whose clients may send again.
    pub(crate) fn answering(&self, items: usize) {
        self.lock().returns.answered(items, Instant::now());
    }

    /// Wakes the timer task when [`Core::pump_waking`] said it must look at the queue sooner.
    fn schedule(&self, sooner: bool) {
        if sooner {
            self.timer.notify_one();
        }
    }
}

/// The timer task of one model: runs the policy when nobody else will (a delay that runs out, a
/// deadline that passes, while every instance is busy), until every handle of the model is
/// gone (`alive` closes); then fails what is still queued.
pub(super) async fn run(shared: Arc<Shared>, mut alive: mpsc::Receiver<()>) {
    let mut timer = Timer::new(shared.lock().policy.exact_waits());
    loop {
        let wake_at = {
            let mut core = shared.lock();
            let wake_at = core.pump(Instant::now());
            core.timer_at.sleeps_until(wake_at);
            wake_at
        };
        tokio::select! {
            _ = alive.recv() => break,
            () = shared.timer.notified() => {}
            () = timer.until(wake_at) => {}
        }
    }
    shared.lock().close();
}

/// The queue and everything a batching decision reads.
pub(super) struct Core {
    pub(super) queue: Queue,
    pub(super) policy: Box<dyn BatchPolicy>,
    pub(super) instances: usize,
    pub(super) slots: Arc<Semaphore>,
    pub(super) total_slots: usize,
    /// Where batches go to the instances; `None` once the model has stopped.
    pub(super) batches: Option<SyncSender<Batch>>,
    pub(super) last_arrival: Option<Instant>,
    pub(super) mean_gap: Option<Duration>,
    /// Published queue depth, read by the handle for statistics.
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) max_queued: Arc<AtomicUsize>,
    /// The device's cost curve, learned from executed batches.
    pub(super) cost: CostModel,
    /// Answered items expected back, learned from answers and arrivals.
    pub(super) returns: Returns,
    /// Where the fitted curve is published for routing.
    pub(super) published: Arc<Mutex<Option<(f64, f64)>>>,
    /// Allowed batch sizes, ascending (empty: any).
    pub(super) allowed: Vec<usize>,
    /// Variable-length batching's pad value, when enabled.
    pub(super) pad_value: Option<f64>,
    /// Ragged batching that makes the model's inputs itself: the batch inputs, and the
    /// outputs scattered back by a ragged input ([`crate::ragged`]).
    pub(super) ragged: Option<Arc<crate::ragged::Ragged>>,
    /// Whether the instances copy the requests' tensors into their own buffers: batches go to
    /// them unassembled (see [`sheaf_backend::Model::stage`]).
    pub(super) stages_inputs: bool,
    /// Input buffers of finished batches, reused for the next ones (at most [`POOL`]).
    pub(super) pool: Vec<bytes::BytesMut>,
    /// When the timer task will look at the queue next, at the latest.
    pub(super) timer_at: TimerAt,
}

/// When the timer task will look at the queue next, at the latest (`None`: only when woken).
/// Set by the timer task as it goes to sleep, and by whoever wakes it. Under load most
/// arrivals leave the time a batch is due unchanged (the oldest request's wait, a deadline
/// already known), and the timer task then sleeps on: no wake-up of it, and no timer set
/// again, per request.
#[derive(Debug, Default)]
pub(super) struct TimerAt(Option<Instant>);

impl TimerAt {
    /// The timer task sleeps until `at`, or until woken when there is none.
    fn sleeps_until(&mut self, at: Option<Instant>) {
        self.0 = at;
    }

    /// Whether the timer task must be woken to look at the queue by `wake`: only when it would
    /// otherwise look later, or not at all. When it must, `wake` is the time it now looks at.
    fn sooner(&mut self, wake: Option<Instant>) -> bool {
        match (wake, self.0) {
            (Some(wake), Some(at)) if at <= wake => false,
            (Some(wake), _) => {
                self.0 = Some(wake);
                true
            }
            (None, _) => false,
        }
    }
}

/// Most input buffers kept for reuse.
const POOL: usize = 16;

/// Weight of the newest gap in the smoothed inter-arrival time.
const GAP_WEIGHT: f64 = 0.2;

impl Core {
    /// [`Core::pump`] for anyone but the timer task; returns whether the timer task must be
    /// woken because the queue must be looked at sooner than it sleeps until (see [`TimerAt`]).
    fn pump_waking(&mut self, now: Instant) -> bool {
        let wake = self.pump(now);
        self.timer_at.sooner(wake)
    }

    /// Sends every batch that is due while a pipeline slot is free; returns when the queue must
    /// be looked at again (the policy's next time, or the next deadline), if ever.
    fn pump(&mut self, now: Instant) -> Option<Instant> {
        loop {
            // Nothing more once the model has stopped.
            self.batches.as_ref()?;
            let next_deadline = self.queue.expire(now);
            self.queued.store(self.queue.items(), Ordering::Relaxed);
            self.max_queued
                .fetch_max(self.queue.items(), Ordering::Relaxed);
            let in_flight = self.total_slots - self.slots.available_permits();
            let state = QueueState {
                last_arrival: self.last_arrival,
                mean_gap: self.mean_gap,
                cost: self.cost.fit(),
                returning: self.returns.expected(),
                ..self.queue.state()
            };
            let wake_at = match self.policy.decide(&state, now) {
                Decision::Dispatch { full }
                    if in_flight < self.instances
                        || (full
                            && in_flight < self.total_slots
                            && self.queue.can_assemble_ahead()) =>
                {
                    if self.dispatch(now) {
                        continue;
                    }
                    return next_deadline;
                }
                // Due, but every instance is busy: the first to finish takes it (the batch
                // keeps growing meanwhile).
                Decision::Dispatch { .. } => None,
                Decision::WaitUntil(due) => Some(due),
                Decision::Idle => None,
            };
            // Deadlines are enforced while the instances are busy, not after the running batch.
            return match (wake_at, next_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }

    /// Fails everything queued and stops sending batches: the instances end once they have
    /// run what they hold.
    fn close(&mut self) {
        self.batches = None;
        self.queue.fail_all(InferError::new(
            ErrorKind::NotReady,
            "the model was unloaded",
        ));
        self.queued.store(0, Ordering::Relaxed);
    }

    /// Learns from an executed batch (a skipped one, of size 0, only frees its slot).
    fn observe(&mut self, done: Done) {
        for buffer in done.buffers {
            if self.pool.len() < POOL {
                self.pool.push(buffer);
            }
        }
        if done.size > 0 {
            self.cost.observe(done.size, done.took);
            *self.published.lock().unwrap_or_else(|e| e.into_inner()) = self.cost.fit();
        }
    }

    /// Queues a job and updates the arrival statistics the policy reads.
    fn arrive(&mut self, job: Job) {
        let now = Instant::now();
        if let Some(last) = self.last_arrival {
            let gap = now - last;
            self.mean_gap = Some(match self.mean_gap {
                Some(mean) => mean.mul_f64(1.0 - GAP_WEIGHT) + gap.mul_f64(GAP_WEIGHT),
                None => gap,
            });
        }
        self.last_arrival = Some(now);
        self.returns.arrived(job.items, now);
        self.queue.push(job);
    }

    /// Forms, assembles and sends one batch. Returns false when nothing more can be sent now
    /// (no free slot, nothing to take, or the instances are gone).
    fn dispatch(&mut self, now: Instant) -> bool {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return false;
        };
        let limit = self.batch_limit();
        // The instant its requests leave the queue and its assembly starts, so that the two
        // stages meet there (see `crate::stages`).
        let taken = Instant::now().max(now);
        let Some(formed) = self.queue.take(limit, taken) else {
            return false;
        };
        let batched = self.policy.max_batch_size() > 0;
        // Pad up to the next allowed size with zero rows; outputs are sliced for real items only.
        let padded = super::policy::padded(formed.size, &self.allowed);
        // Variable lengths: every piece grows to the longest item of its input.
        let padded_dims: Option<Vec<Vec<usize>>> = self.pad_value.map(|_| {
            formed
                .pieces
                .iter()
                .map(|pieces| {
                    let rank = pieces.first().map_or(0, |p| p.shape().len());
                    (1..rank)
                        .map(|d| pieces.iter().map(|p| p.shape()[d]).max().unwrap_or(0))
                        .collect()
                })
                .collect()
        });
        let inputs = if let Some(ragged) = &self.ragged {
            // Ragged inputs in one dimension, and the batch inputs that find each request's.
            ragged.assemble(&formed.pieces).map(Inputs::Assembled)
        } else if self.stages_inputs && batched && padded_dims.is_none() {
            // The instance copies each request's bytes straight into its own buffers.
            Ok(Inputs::Pieces(formed.pieces))
        } else {
            self.assemble(&formed.pieces, padded, padded_dims.as_deref())
                .map(Inputs::Assembled)
        };
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
            padded,
            padded_dims,
            batched,
            scatter: self.ragged.clone(),
            taken,
            assembled: Instant::now(),
            slot,
        };
        self.send(batch)
    }

    /// The most items the next batch takes: the policy's maximum, or fewer where the model runs
    /// only some batch sizes and padding what is queued costs more per item than running the
    /// largest size it fills (see [`super::policy::trimmed_to_bucket`]).
    fn batch_limit(&self) -> usize {
        let max = self.policy.max_batch_size();
        if max == 0 {
            return max;
        }
        super::policy::taken(self.queue.items(), max, &self.allowed, self.cost.fit())
    }

    /// Concatenates each input's pieces into one tensor (padded to `padded` items, and with
    /// variable-length padding, each piece grown to `padded_dims` first).
    fn assemble(
        &mut self,
        pieces: &[Vec<Tensor>],
        padded: usize,
        padded_dims: Option<&[Vec<usize>]>,
    ) -> Result<Vec<Tensor>, sheaf_backend::BackendError> {
        pieces
            .iter()
            .enumerate()
            .map(|(i, pieces)| {
                let joined = match (padded_dims, self.pad_value) {
                    (Some(dims), Some(value)) => {
                        let grown = pieces
                            .iter()
                            .map(|p| {
                                let mut target = vec![p.items()];
                                target.extend(&dims[i]);
                                p.pad_to(&target, value)
                            })
                            .collect::<Result<Vec<_>, _>>()?;
                        Tensor::concat(&grown)
                    }
                    _ if pieces.len() > 1 => {
                        let buffer = self.pool.pop().unwrap_or_default();
                        Tensor::concat_into(pieces, buffer)
                    }
                    _ => Tensor::concat(pieces),
                };
                joined.and_then(|t| t.pad_items(padded))
            })
            .collect()
    }

    /// Sends a batch to the instances. Returns false when they are gone (its requests fail,
    /// and so does everything queued).
    fn send(&mut self, batch: Batch) -> bool {
        let Some(batches) = &self.batches else {
            return false;
        };
        if let Err(returned) = batches.send(batch) {
            let error = InferError::internal("the model's execution instances stopped");
            returned
                .0
                .segments
                .iter()
                .for_each(|s| s.reply.fail(error.clone()));
            self.batches = None;
            self.queue.fail_all(error);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timer task is woken for a time earlier than the one it sleeps until, or when it
    /// sleeps until woken; never for a later or equal time, nor for no time.
    #[test]
    fn the_timer_task_is_woken_only_for_a_sooner_time() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut at = TimerAt::default();
        assert!(!at.sooner(None), "nothing to wake for");
        assert!(at.sooner(Some(now + ms(5))), "asleep until woken");
        assert!(!at.sooner(Some(now + ms(5))), "the same time again");
        assert!(!at.sooner(Some(now + ms(8))), "a later time");
        assert!(at.sooner(Some(now + ms(2))), "a sooner time");
        assert!(!at.sooner(Some(now + ms(3))), "later than the sooner one");
        // The task looked, and sleeps until a later time now: an earlier one wakes it again.
        at.sleeps_until(Some(now + ms(9)));
        assert!(at.sooner(Some(now + ms(4))));
        // It sleeps until woken: any time wakes it.
        at.sleeps_until(None);
        assert!(at.sooner(Some(now + ms(20))));
    }
}
