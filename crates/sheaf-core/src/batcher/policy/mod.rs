//! When to dispatch a batch.
//!
//! A [`BatchPolicy`] is a pure function of the queue's state (including the device's cost curve,
//! learned by the batcher from executed batches) and the clock. It is tested with made-up instants, no runtime and no model.
//! Three policies exist, chosen per model with `batching.policy` in `config.yaml`:
//! - [`Fixed`]: the classic rule with max size, preferred sizes, min size and a fixed delay;
//! - [`QueueDepth`]: the delay shrinks as the queue grows (adaptive wait);
//! - [`LatencySlo`]: it learns the model's cost curve and waits only while waiting pays off and the
//!   oldest request can still meet its latency objective; it also waits for answered clients that
//!   are on their way back ([`Returns`]).
//!
//! Every policy's waits are kept to the microsecond ([`BatchPolicy::exact_waits`]): a
//! configured delay is a latency budget, and each of `latency_slo`'s waits ends with an idle
//! instance. `latency_slo` waits for a burst of returning clients up to a batch's fixed cost past
//! its estimate, so that a burst a little behind it is not cut (bench/RESULTS.md: on tokio's
//! millisecond timer that slack came from the timer's rounding, and the late ends cost 10-34% of
//! the items a second at 8-32 clients).
//!
//! The batcher asks the policy only whether a batch is due. Whether an instance is free is the
//! batcher's concern: a due batch waits (and keeps growing) while every instance is busy. How
//! many of the queued items a due batch takes, where the model runs only some batch sizes, is
//! [`trimmed_to_bucket`]'s answer from the same learned cost curve; `latency_slo` weighs a wait
//! by the same answer ([`taken`], [`padded`]): by the batch that would then run.

mod buckets;
mod cost;
mod fixed;
mod latency_slo;
mod queue_depth;
mod returns;

use std::time::Duration;

use tokio::time::Instant;

pub use buckets::{padded, taken, trimmed_to_bucket};
pub use cost::CostModel;
pub use fixed::Fixed;
pub use latency_slo::LatencySlo;
pub use queue_depth::QueueDepth;
pub use returns::Returns;

/// What a policy sees of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QueueState {
    /// Items (dimension-0 rows) waiting.
    pub items: usize,
    /// When the oldest waiting request was queued.
    pub oldest: Option<Instant>,
    /// When the latest request arrived.
    pub last_arrival: Option<Instant>,
    /// Smoothed time between request arrivals, once two have arrived.
    pub mean_gap: Option<Duration>,
    /// The device's learned cost curve `(a, c)` in seconds: t(b) = a + c·b.
    pub cost: Option<(f64, f64)>,
    /// Items answered and expected back, and by when (see [`Returns`]).
    pub returning: Option<(usize, Instant)>,
}

/// A policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is queued.
    Idle,
    /// Send a batch now. `full` means waiting cannot make it bigger (it reached the maximum or
    /// a preferred size), so it may be assembled ahead while every instance is busy.
    Dispatch { full: bool },
    /// Wait for more requests until this instant, then ask again.
    WaitUntil(Instant),
}

/// A batching policy (see the module documentation).
pub trait BatchPolicy: Send + std::fmt::Debug {
    /// Whether a batch is due now.
    fn decide(&self, queue: &QueueState, now: Instant) -> Decision;

    /// Largest batch in items; 0 means no batching.
    fn max_batch_size(&self) -> usize;

    /// Whether the times this policy waits until are to be kept to the microsecond (on Linux, a
    /// timerfd), or waited on tokio's millisecond timer, which ends a wait up to a millisecond
    /// late: a delay the model's configuration sets is a latency budget (Triton's
    /// `max_queue_delay_microseconds` is often a few hundred µs), and a wait that ends with an
    /// instance idle costs the device that time.
    fn exact_waits(&self) -> bool {
        false
    }
}

/// The shared rule of the delay-based policies: full and preferred sizes go at once; a batch of
/// at least `min_batch_size` goes once the oldest request has waited `wait`; a smaller one is
/// held for at most twice that, so that a lone request is never stranded.
pub(crate) fn delay_rule(
    queue: &QueueState,
    now: Instant,
    max_batch_size: usize,
    min_batch_size: usize,
    preferred: &[usize],
    wait: Duration,
) -> Decision {
    let Some(oldest) = queue.oldest.filter(|_| queue.items > 0) else {
        return Decision::Idle;
    };
    if max_batch_size == 0 || queue.items >= max_batch_size || preferred.contains(&queue.items) {
        return Decision::Dispatch { full: true };
    }
    let due = if queue.items >= min_batch_size.max(1) {
        oldest + wait
    } else {
        oldest + wait * 2
    };
    if now >= due {
        Decision::Dispatch { full: false }
    } else {
        Decision::WaitUntil(due)
    }
}
