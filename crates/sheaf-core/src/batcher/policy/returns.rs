//! Answered items whose clients are expected to send again, and how soon they do.
//!
//! Many clients of a serving system run a closed loop: a video stream, a worker pool or a load
//! generator sends its next request when the last one is answered. Under such load the arrivals
//! come in bursts right after each batch is answered, and the smoothed gap between arrivals says
//! nothing about the burst that is about to come. [`Returns`] learns it: the items of executed
//! batches are counted as pending until as many items have arrived, and the time from the answer
//! to the last of them is the return time. The policy then knows, when an instance is free, how
//! many items are on their way and by when ([`Returns::expected`]).
//!
//! Under open-loop load the same count is the number of arrivals expected after an answer, and
//! the return time is how long they took to come, so the estimate is an arrival rate like any
//! other. Pending items that do not come back within a few return times are forgotten.

use std::time::Duration;

use tokio::time::Instant;

/// Weight of the newest sample in the smoothed return time.
const WEIGHT: f64 = 0.2;

/// Pending items older than this many return times are forgotten.
const STALE: u32 = 4;

/// Before any return time is learned, pending items are forgotten after this long.
const UNLEARNED: Duration = Duration::from_secs(1);

/// See the module documentation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Returns {
    /// Answered items not yet matched by arrivals.
    pending: usize,
    /// When the oldest of them was answered.
    since: Option<Instant>,
    /// Smoothed time from an answer until as many items have arrived.
    time: Option<Duration>,
}

impl Returns {
    /// Records `items` answered at `now`.
    pub fn answered(&mut self, items: usize, now: Instant) {
        self.forget_stale(now);
        if self.pending == 0 {
            self.since = Some(now);
        }
        self.pending += items;
    }

    /// Records `items` arriving at `now`; learns the return time when the pending items are in.
    pub fn arrived(&mut self, items: usize, now: Instant) {
        self.forget_stale(now);
        if self.pending == 0 {
            return;
        }
        self.pending = self.pending.saturating_sub(items);
        if self.pending > 0 {
            return;
        }
        if let Some(since) = self.since.take() {
            let sample = now - since;
            self.time = Some(match self.time {
                Some(t) => t.mul_f64(1.0 - WEIGHT) + sample.mul_f64(WEIGHT),
                None => sample,
            });
        }
    }

    /// How many items are on their way, and when the last of them is expected; `None` when none
    /// are pending or no return time is learned yet.
    pub fn expected(&self) -> Option<(usize, Instant)> {
        match (self.pending, self.since, self.time) {
            (0, _, _) => None,
            (n, Some(since), Some(time)) => Some((n, since + time)),
            _ => None,
        }
    }

    /// Drops pending items that have been away for too long: those clients are not coming back.
    fn forget_stale(&mut self, now: Instant) {
        let Some(since) = self.since else { return };
        let limit = self.time.map_or(UNLEARNED, |t| t * STALE);
        if now.saturating_duration_since(since) > limit {
            self.pending = 0;
            self.since = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn learns_the_time_until_an_answered_batch_has_come_back() {
        let t0 = Instant::now();
        let mut r = Returns::default();
        assert_eq!(r.expected(), None);
        r.answered(4, t0);
        // Nothing learned yet: nothing is expected.
        assert_eq!(r.expected(), None);
        r.arrived(1, t0 + ms(1));
        r.arrived(3, t0 + ms(2));
        assert_eq!(r.expected(), None);
        r.answered(8, t0 + ms(10));
        assert_eq!(r.expected(), Some((8, t0 + ms(12))));
        r.arrived(5, t0 + ms(11));
        assert_eq!(r.expected(), Some((3, t0 + ms(12))));
        r.arrived(3, t0 + ms(14));
        // The new sample (4 ms) moves the smoothed time by a fifth of the difference.
        r.answered(1, t0 + ms(20));
        let (n, by) = r.expected().unwrap();
        assert_eq!(n, 1);
        assert!(((by - (t0 + ms(20))).as_secs_f64() * 1000.0 - 2.4).abs() < 1e-6);
    }

    #[test]
    fn answers_to_clients_that_never_come_back_are_forgotten() {
        let t0 = Instant::now();
        let mut r = Returns::default();
        r.answered(2, t0);
        r.arrived(2, t0 + ms(1));
        // Answered, and nobody returns within four return times.
        r.answered(10, t0 + ms(10));
        r.answered(3, t0 + ms(20));
        assert_eq!(r.expected(), Some((3, t0 + ms(21))));
        // An arrival long after is not a return, and teaches nothing.
        r.arrived(1, t0 + ms(100));
        assert_eq!(r.expected(), None);
        r.answered(1, t0 + ms(100));
        assert_eq!(r.expected(), Some((1, t0 + ms(101))));
    }
}
