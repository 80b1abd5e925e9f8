//! The `fixed` policy: a constant delay.

use std::time::Duration;

use tokio::time::Instant;

use super::{delay_rule, BatchPolicy, Decision, QueueState};

/// Dispatch at `max_batch_size` or a preferred size at once; at `min_batch_size` or more once the
/// oldest request has waited `max_queue_delay` (a smaller batch after twice that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    /// Largest batch in items; 0 means no batching (every request runs alone, at once).
    pub max_batch_size: usize,
    pub min_batch_size: usize,
    pub max_queue_delay: Duration,
    pub preferred_batch_sizes: Vec<usize>,
}

impl BatchPolicy for Fixed {
    fn decide(&self, queue: &QueueState, now: Instant) -> Decision {
        delay_rule(
            queue,
            now,
            self.max_batch_size,
            self.min_batch_size,
            &self.preferred_batch_sizes,
            self.max_queue_delay,
        )
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }

    fn exact_waits(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Fixed {
        Fixed {
            max_batch_size: 8,
            min_batch_size: 1,
            max_queue_delay: Duration::from_micros(500),
            preferred_batch_sizes: vec![4],
        }
    }

    fn state(items: usize, oldest: Instant) -> QueueState {
        QueueState {
            items,
            oldest: Some(oldest),
            ..Default::default()
        }
    }

    #[test]
    fn empty_queue_is_idle() {
        assert_eq!(
            policy().decide(&QueueState::default(), Instant::now()),
            Decision::Idle
        );
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
    fn below_min_batch_size_holds_for_twice_the_delay() {
        let t0 = Instant::now();
        let p = Fixed {
            min_batch_size: 3,
            ..policy()
        };
        let delay = Duration::from_micros(500);
        assert_eq!(
            p.decide(&state(2, t0), t0 + delay),
            Decision::WaitUntil(t0 + delay * 2)
        );
        assert_eq!(
            p.decide(&state(3, t0), t0 + delay),
            Decision::Dispatch { full: false }
        );
        assert_eq!(
            p.decide(&state(2, t0), t0 + delay * 2),
            Decision::Dispatch { full: false }
        );
    }

    #[test]
    fn no_batching_never_waits() {
        let t0 = Instant::now();
        let p = Fixed {
            max_batch_size: 0,
            ..policy()
        };
        assert_eq!(
            p.decide(&state(1, t0), t0),
            Decision::Dispatch { full: true }
        );
    }
}
