//! When to dispatch a batch. The policy is a pure function of the queue's state and the clock,
//! so it is tested with made-up instants and no runtime.

use std::time::Duration;

use tokio::time::Instant;

/// What the policy sees of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueState {
    /// Items (dimension-0 rows) waiting.
    pub items: usize,
    /// When the oldest waiting request was queued.
    pub oldest: Option<Instant>,
}

/// The policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is queued.
    Idle,
    /// Send a batch now. `full` means waiting cannot make it bigger (it reached the maximum or
    /// a preferred size), so it may be assembled ahead while every instance is busy.
    Dispatch { full: bool },
    /// Wait for more requests until this instant, then dispatch what is there.
    WaitUntil(Instant),
}

/// The `fixed` policy: dispatch at `max_batch_size`, at a preferred size, or when the oldest
/// request has waited `max_queue_delay`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedPolicy {
    /// Largest batch in items; 0 means no batching (every request runs alone, at once).
    pub max_batch_size: usize,
    pub max_queue_delay: Duration,
    pub preferred_batch_sizes: Vec<usize>,
}

impl FixedPolicy {
    pub fn decide(&self, queue: &QueueState, now: Instant) -> Decision {
        let Some(oldest) = queue.oldest.filter(|_| queue.items > 0) else {
            return Decision::Idle;
        };
        if self.max_batch_size == 0
            || queue.items >= self.max_batch_size
            || self.preferred_batch_sizes.contains(&queue.items)
        {
            return Decision::Dispatch { full: true };
        }
        let due = oldest + self.max_queue_delay;
        if now >= due {
            Decision::Dispatch { full: false }
        } else {
            Decision::WaitUntil(due)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> FixedPolicy {
        FixedPolicy {
            max_batch_size: 8,
            max_queue_delay: Duration::from_micros(500),
            preferred_batch_sizes: vec![4],
        }
    }

    fn state(items: usize, oldest: Instant) -> QueueState {
        QueueState {
            items,
            oldest: Some(oldest),
        }
    }

    #[test]
    fn empty_queue_is_idle() {
        let now = Instant::now();
        let q = QueueState {
            items: 0,
            oldest: None,
        };
        assert_eq!(policy().decide(&q, now), Decision::Idle);
    }

    #[test]
    fn waits_out_the_delay_then_dispatches() {
        let t0 = Instant::now();
        let p = policy();
        let due = t0 + Duration::from_micros(500);
        assert_eq!(p.decide(&state(1, t0), t0), Decision::WaitUntil(due));
        assert_eq!(
            p.decide(&state(3, t0), t0 + Duration::from_micros(499)),
            Decision::WaitUntil(due)
        );
        assert_eq!(
            p.decide(&state(3, t0), due),
            Decision::Dispatch { full: false }
        );
    }

    #[test]
    fn full_and_preferred_sizes_dispatch_at_once() {
        let t0 = Instant::now();
        let p = policy();
        assert_eq!(
            p.decide(&state(8, t0), t0),
            Decision::Dispatch { full: true }
        );
        assert_eq!(
            p.decide(&state(20, t0), t0),
            Decision::Dispatch { full: true }
        );
        assert_eq!(
            p.decide(&state(4, t0), t0),
            Decision::Dispatch { full: true }
        );
        assert!(matches!(
            p.decide(&state(5, t0), t0),
            Decision::WaitUntil(_)
        ));
    }

    #[test]
    fn no_batching_never_waits() {
        let t0 = Instant::now();
        let p = FixedPolicy {
            max_batch_size: 0,
            ..policy()
        };
        assert_eq!(
            p.decide(&state(1, t0), t0),
            Decision::Dispatch { full: true }
        );
    }
}
