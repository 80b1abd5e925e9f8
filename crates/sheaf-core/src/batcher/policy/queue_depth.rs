//! The `queue_depth` policy: the deeper the queue, the shorter the wait.

use std::time::Duration;

use tokio::time::Instant;

use super::{delay_rule, BatchPolicy, Decision, QueueState};

/// Adaptive wait. Below `adaptive_threshold` queued items the wait is `max_wait`. At or above it,
/// `ratio = min(1, depth / (2 × threshold))` and `wait = max_wait − ratio × (max_wait − min_wait)`.
/// Dispatch otherwise follows the `fixed` rule with that wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    pub max_batch_size: usize,
    pub min_batch_size: usize,
    pub preferred_batch_sizes: Vec<usize>,
    pub min_wait: Duration,
    pub max_wait: Duration,
    pub adaptive_threshold: usize,
}

impl QueueDepth {
    /// The wait for a queue of `depth` items.
    pub fn wait(&self, depth: usize) -> Duration {
        let threshold = self.adaptive_threshold.max(1);
        if depth < threshold {
            return self.max_wait;
        }
        let ratio = (depth as f64 / (2.0 * threshold as f64)).min(1.0);
        let span = self.max_wait.saturating_sub(self.min_wait);
        self.max_wait - span.mul_f64(ratio)
    }
}

impl BatchPolicy for QueueDepth {
    fn decide(&self, queue: &QueueState, now: Instant) -> Decision {
        delay_rule(
            queue,
            now,
            self.max_batch_size,
            self.min_batch_size,
            &self.preferred_batch_sizes,
            self.wait(queue.items),
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

    fn policy() -> QueueDepth {
        QueueDepth {
            max_batch_size: 64,
            min_batch_size: 1,
            preferred_batch_sizes: vec![],
            min_wait: Duration::from_millis(1),
            max_wait: Duration::from_millis(11),
            adaptive_threshold: 10,
        }
    }

    #[test]
    fn wait_follows_the_formula() {
        let p = policy();
        assert_eq!(p.wait(9), Duration::from_millis(11));
        // depth 10: ratio 0.5, wait 11 - 0.5 * 10 = 6 ms.
        assert_eq!(p.wait(10), Duration::from_millis(6));
        // depth 15: ratio 0.75, wait 3.5 ms.
        assert_eq!(p.wait(15), Duration::from_micros(3500));
        assert_eq!(p.wait(20), Duration::from_millis(1));
        assert_eq!(p.wait(50), Duration::from_millis(1));
    }

    #[test]
    fn deeper_queues_dispatch_sooner() {
        let t0 = Instant::now();
        let p = policy();
        let shallow = QueueState {
            items: 2,
            oldest: Some(t0),
            ..Default::default()
        };
        let deep = QueueState {
            items: 20,
            ..shallow
        };
        let at = t0 + Duration::from_millis(2);
        assert_eq!(
            p.decide(&shallow, at),
            Decision::WaitUntil(t0 + Duration::from_millis(11))
        );
        assert_eq!(p.decide(&deep, at), Decision::Dispatch { full: false });
    }
}
