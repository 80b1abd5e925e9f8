//! The `latency_slo` policy: wait only while waiting raises throughput and the oldest request
//! can still meet its latency objective.
//!
//! The rule. With the learned cost t(b) = a + c·b (see [`CostModel`]) and n items queued on a free
//! instance, running them now costs (a + c·n)/n per item. Waiting one expected inter-arrival gap g
//! for one more item costs (g + a + c·(n+1))/(n+1) per item, counting the idle wait. Waiting is
//! cheaper exactly when g < a/n: the next item must arrive sooner than its share of the fixed
//! batch cost that it saves. So the policy dispatches at once when:
//! - the queue is full;
//! - nothing has been learned yet;
//! - the expected gap is at least a/n (with a pure per-item cost, a ≈ 0, it never waits);
//! - the next arrival is overdue;
//! - waiting for it would make the oldest request finish past `queued + slo`: the wait must end by
//!   `oldest + slo − t(n+1)`.
//!
//! Otherwise it waits until the next arrival is expected. At concurrency 1 the next request cannot
//! come before this one is answered, so the gap exceeds a and nothing waits.
//!
//! Clients that send again once answered come back in a burst after each batch, which the
//! smoothed gap cannot foresee: when an instance frees up, the last arrival is long past and the
//! rule above would send what is queued, half of the clients, while the other half are on their
//! way. So the burst is looked at first. With r items answered and expected back by time T (see
//! [`Returns`](super::Returns)), and m = min(n + r, max), the policy waits when
//! (max(T − now, 0) + t(m))/m < t(n)/n and the batch of m would still finish within the oldest
//! request's objective. T is a smoothed estimate, and a burst often runs a little behind it: a
//! batch sent at T is cut in the middle of the burst, and its stragglers then cost a batch of
//! their own. So the wait lasts until T + a, a batch's fixed cost, which is what those
//! stragglers would cost again. Each arrival asks again, so the batch goes as soon as the burst
//! is in or the queue is full.
//!
//! Where the model runs only some batch sizes, the batch waited for may stop at one of them
//! ([`taken`]) and leave items behind. Such a wait is judged by items a second instead, each
//! batch as the batcher will form it ([`taken`], [`padded`]): the batch after the wait, against
//! the batch now followed by the next one, which the returning items join while the first runs
//! (the device is busy through the wait). With buckets of 8, 16 and 32 on a GPU and 24
//! clients, 8 left over from a batch cut at 16 would otherwise wait for the other 16 only to run
//! 16 of the 24 again, leaving 8 behind each time, a third of the clients idle for a whole batch;
//! now the 8 go at once and the 16 run next, while the 8 are on their way back.
//!
//! Every wait ends with the instance idle, so its end is kept to the microsecond (a timerfd:
//! [`BatchPolicy::exact_waits`](super::BatchPolicy::exact_waits)), not on tokio's millisecond
//! timer, which ended waits up to a millisecond late: a large share of a GPU's batch.

use std::time::Duration;

use tokio::time::Instant;

use super::{padded, taken, BatchPolicy, Decision, QueueState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencySlo {
    pub max_batch_size: usize,
    /// Latency objective per request, from enqueue to answer.
    pub slo: Duration,
    /// The batch sizes the model runs, ascending; empty: any.
    pub allowed: Vec<usize>,
}

impl LatencySlo {
    pub fn new(max_batch_size: usize, slo: Duration) -> LatencySlo {
        LatencySlo {
            max_batch_size,
            slo,
            allowed: Vec::new(),
        }
    }

    /// The same, for a model that runs only the `allowed` batch sizes (ascending).
    pub fn with_sizes(self, allowed: &[usize]) -> LatencySlo {
        LatencySlo {
            allowed: allowed.to_vec(),
            ..self
        }
    }
}

impl BatchPolicy for LatencySlo {
    fn decide(&self, queue: &QueueState, now: Instant) -> Decision {
        let Some(oldest) = queue.oldest.filter(|_| queue.items > 0) else {
            return Decision::Idle;
        };
        let n = queue.items;
        if self.max_batch_size == 0 || n >= self.max_batch_size {
            return Decision::Dispatch { full: true };
        }
        let go = Decision::Dispatch { full: false };
        let Some((a, c)) = queue.cost else {
            return go;
        };
        let (Some(gap), Some(last)) = (queue.mean_gap, queue.last_arrival) else {
            return self
                .wait_for_returns(queue, (a, c), oldest, now)
                .unwrap_or(go);
        };
        if let Some(wait) = self.wait_for_returns(queue, (a, c), oldest, now) {
            return wait;
        }
        if gap.as_secs_f64() >= a / n as f64 {
            return go;
        }
        let next = last + gap;
        if next <= now {
            return go;
        }
        let finish = Duration::from_secs_f64(a + c * (n + 1) as f64);
        match (oldest + self.slo).checked_sub(finish) {
            Some(latest_start) if next <= latest_start => Decision::WaitUntil(next),
            _ => go,
        }
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }

    fn exact_waits(&self) -> bool {
        true
    }
}

impl LatencySlo {
    /// Waits for the items on their way back when that makes the batch cheaper per item and
    /// keeps the oldest request within its objective (see the module documentation).
    fn wait_for_returns(
        &self,
        queue: &QueueState,
        (a, c): (f64, f64),
        oldest: Instant,
        now: Instant,
    ) -> Option<Decision> {
        let (r, by) = queue.returning?;
        let n = queue.items;
        let all = n + r;
        let m = all.min(self.max_batch_size);
        let due = by + Duration::from_secs_f64(a);
        if due <= now || m <= n {
            return None;
        }
        let t = |b: usize| a + c * b as f64;
        let wait = by.saturating_duration_since(now).as_secs_f64();
        // The batch that `q` queued items form where the model runs only some sizes: the items
        // it takes, and its time at the size it runs.
        let batch = |q: usize| {
            let items = taken(q, self.max_batch_size, &self.allowed, Some((a, c)));
            (items, t(padded(items, &self.allowed)))
        };
        let (cut, t_cut) = batch(all);
        let (cheaper, t_waited) = if cut < m {
            // The batch waited for would stop at a bucket and leave items behind: compare
            // the items a second of the two ways, the batch now followed by the next one, which
            // the returning items join while this one runs.
            let (first, t_first) = batch(n);
            let (next, t_next) = batch(all - first);
            let now_rate = (first + next) as f64 / (t_first.max(wait) + t_next);
            (cut as f64 / (wait + t_cut) > now_rate, t_cut)
        } else {
            ((wait + t(m)) / (m as f64) < t(n) / (n as f64), t(m))
        };
        let finish = by.max(now) + Duration::from_secs_f64(t_waited);
        (cheaper && finish <= oldest + self.slo).then_some(Decision::WaitUntil(due))
    }
}

#[cfg(test)]
mod tests {
    use super::super::CostModel;
    use super::*;

    /// The cost curve t(b) = 10 + 1·b ms, learned from batches.
    fn cost() -> Option<(f64, f64)> {
        let mut m = CostModel::default();
        for b in [1, 2, 4, 8, 16, 32] {
            m.observe(b, ms(10.0 + b as f64));
        }
        m.fit()
    }

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    fn learned() -> LatencySlo {
        LatencySlo::new(32, ms(100.0))
    }

    fn queue(items: usize, oldest: Instant, last: Instant, gap_ms: f64) -> QueueState {
        QueueState {
            items,
            oldest: Some(oldest),
            last_arrival: Some(last),
            mean_gap: Some(ms(gap_ms)),
            cost: cost(),
            returning: None,
        }
    }

    #[test]
    fn dispatches_at_once_before_anything_is_learned() {
        let t0 = Instant::now();
        let unlearned = QueueState {
            cost: None,
            ..queue(1, t0, t0, 0.1)
        };
        assert_eq!(
            learned().decide(&unlearned, t0),
            Decision::Dispatch { full: false }
        );
    }

    #[test]
    fn concurrency_one_never_waits() {
        // One client: the next request comes a full round trip (more than a batch) later.
        let t0 = Instant::now();
        assert_eq!(
            learned().decide(&queue(1, t0, t0, 12.0), t0),
            Decision::Dispatch { full: false }
        );
    }

    #[test]
    fn waits_while_arrivals_beat_the_amortised_overhead() {
        let t0 = Instant::now();
        let p = learned();
        // a = 10 ms. With 2 queued and a 1 ms gap (< 10/2), wait for the next arrival.
        assert_eq!(
            p.decide(&queue(2, t0, t0, 1.0), t0),
            Decision::WaitUntil(t0 + ms(1.0))
        );
        // With 12 queued, a/n = 0.83 ms < 1 ms: waiting no longer pays.
        assert_eq!(
            p.decide(&queue(12, t0, t0, 1.0), t0),
            Decision::Dispatch { full: false }
        );
        // An overdue arrival is not waited for again.
        assert_eq!(
            p.decide(&queue(2, t0, t0, 1.0), t0 + ms(1.5)),
            Decision::Dispatch { full: false }
        );
    }

    #[test]
    fn never_waits_past_the_oldest_requests_objective() {
        let t0 = Instant::now();
        let p = learned();
        // Oldest queued at t0 with a 100 ms objective; a batch of 3 takes 13 ms, so the wait
        // must end by t0 + 87 ms.
        let now = t0 + ms(86.5);
        assert_eq!(
            p.decide(&queue(2, t0, now, 0.4), now),
            Decision::WaitUntil(now + ms(0.4))
        );
        let now = t0 + ms(86.8);
        assert_eq!(
            p.decide(&queue(2, t0, now, 0.4), now),
            Decision::Dispatch { full: false }
        );
    }

    #[test]
    fn a_full_queue_dispatches() {
        let t0 = Instant::now();
        assert_eq!(
            learned().decide(&queue(32, t0, t0, 0.01), t0),
            Decision::Dispatch { full: true }
        );
    }

    #[test]
    fn a_per_item_cost_curve_never_waits() {
        // Batching does not help (t = 2·b ms): no fixed cost to amortise.
        let t0 = Instant::now();
        let mut m = CostModel::default();
        for b in [1, 2, 4, 8] {
            m.observe(b, ms(2.0 * b as f64));
        }
        let q = QueueState {
            cost: m.fit(),
            ..queue(1, t0, t0, 0.01)
        };
        assert_eq!(learned().decide(&q, t0), Decision::Dispatch { full: false });
    }

    #[test]
    fn waits_for_the_burst_of_answered_clients_coming_back() {
        // a = 10 ms, c = 1 ms. An instance frees up with 12 queued, the last arrival long past;
        // 20 answered items are expected back within 2 ms.
        let t0 = Instant::now();
        let p = learned();
        let back = |r: usize| QueueState {
            returning: Some((r, t0 + ms(2.0))),
            ..queue(12, t0, t0 - ms(8.0), 0.5)
        };
        // (2 + 10 + 32)/32 = 1.375 ms an item against (10 + 12)/12 = 1.83 ms now: wait, for as
        // long past the estimate as a batch's fixed cost (10 ms), should the burst run late.
        assert_eq!(p.decide(&back(20), t0), Decision::WaitUntil(t0 + ms(12.0)));
        // Without them, the arrival is overdue and the batch goes.
        let alone = QueueState {
            returning: None,
            ..back(20)
        };
        assert_eq!(p.decide(&alone, t0), Decision::Dispatch { full: false });
        // One item on its way is not worth 2 ms: (2 + 23)/13 = 1.92 > 1.83.
        assert_eq!(p.decide(&back(1), t0), Decision::Dispatch { full: false });
        // A late burst is still waited for, until its estimate and the fixed cost have passed.
        assert_eq!(
            p.decide(&back(20), t0 + ms(7.0)),
            Decision::WaitUntil(t0 + ms(12.0))
        );
        assert_eq!(
            p.decide(&back(20), t0 + ms(12.0)),
            Decision::Dispatch { full: false }
        );
        // Nor one that would take the oldest request past its objective (100 ms).
        let late = QueueState {
            oldest: Some(t0 - ms(70.0)),
            ..back(20)
        };
        assert_eq!(p.decide(&late, t0), Decision::Dispatch { full: false });
    }

    #[test]
    fn a_wait_a_bucket_would_cut_is_judged_by_items_a_second() {
        // A GPU-like curve, t(b) = 1.2 + 0.09·b ms, buckets of powers of two to 64, and 24
        // clients: a batch was cut at 16, 8 are queued and 16 are due back in 2 ms.
        let t0 = Instant::now();
        let mut curve = CostModel::default();
        for b in [1, 8, 16, 32, 64] {
            curve.observe(b, ms(1.2 + 0.09 * b as f64));
        }
        let q = QueueState {
            cost: curve.fit(),
            returning: Some((16, t0 + ms(2.0))),
            ..queue(8, t0, t0 - ms(4.0), 0.2)
        };
        let any_size = LatencySlo::new(64, ms(100.0));
        let buckets = any_size.clone().with_sizes(&[1, 2, 4, 8, 16, 32, 64]);
        // Any size runs: a batch of 24 after the wait, (2 + 3.36)/24 = 0.223 ms an item against
        // 1.92/8 = 0.24 now. Wait.
        assert_eq!(
            any_size.decide(&q, t0),
            Decision::WaitUntil(t0 + ms(2.0) + ms(1.2))
        );
        // With the buckets those 24 would run as 16, leaving 8: 16 items in 2 + 2.64 ms (3.4 a
        // ms) against 8 now and the 16 next in 2 + 2.64 ms (5.2 a ms). Go now.
        assert_eq!(buckets.decide(&q, t0), Decision::Dispatch { full: false });
        // When the burst is all but in: 16 in 0.2 + 2.64 ms (5.6 a ms) against 24 in 1.92 +
        // 2.64 (5.3 a ms). Wait.
        assert!(matches!(
            buckets.decide(&q, t0 + ms(1.8)),
            Decision::WaitUntil(_)
        ));
        // Without a size for the 8, they run padded to 16, and 24 would still run as 16 (padded
        // to 32 they cost more an item): 16 in 2 + 2.64 ms against 8 padded now and the 16 next
        // in 2.64 + 2.64 ms (4.5 a ms). Go now.
        let no_eight = any_size.clone().with_sizes(&[16, 32, 64]);
        assert_eq!(no_eight.decide(&q, t0), Decision::Dispatch { full: false });
        // A batch stopped at the maximum rather than at a bucket is priced per item as before:
        // with 60 items due, a wait for a full batch of 64 costs (2 + 6.96)/64 = 0.14 ms an
        // item against 0.24 now. Wait.
        let many = QueueState {
            returning: Some((60, t0 + ms(2.0))),
            ..q
        };
        assert!(matches!(buckets.decide(&many, t0), Decision::WaitUntil(_)));
    }

    #[test]
    fn its_waits_are_kept_to_the_microsecond() {
        // Each of its waits ends with the instance idle: tokio's millisecond timer would idle
        // it up to a millisecond more, a large share of a GPU's batch.
        assert!(learned().exact_waits());
    }

    #[test]
    fn a_burst_is_waited_for_only_up_to_a_full_batch() {
        // 30 queued of 32 and 20 on their way: m = 32, and (1 + 42)/32 = 1.344 is more than
        // 40/30 = 1.333 an item now.
        let t0 = Instant::now();
        let q = QueueState {
            returning: Some((20, t0 + ms(1.0))),
            ..queue(30, t0, t0 - ms(8.0), 0.5)
        };
        assert_eq!(learned().decide(&q, t0), Decision::Dispatch { full: false });
    }
}
