//! Where a request's time in the server goes: stages that add up to it.
//!
//! A request's server time runs from its arrival (the protocol has its headers, not yet its
//! body) to the last byte of its answer handed to the connection. It is cut at instants that
//! follow one another, so the stages add up to the whole:
//!
//! | stage | from | to |
//! |---|---|---|
//! | `receive` | arrival | queued (body read, decoded, validated) |
//! | `queue` | queued | taken into a batch |
//! | `input` | taken | batch assembled |
//! | `wait` | assembled | an instance starts it |
//! | `infer` | started | the backend returned |
//! | `output` | returned | outputs sliced per request |
//! | `reply` | sliced | the request's task resumes with its outputs |
//! | `send` | resumed | the answer encoded and written |
//!
//! The batcher measures the middle stages (see [`crate::stats::Phases`]), the request's
//! [`Receipt`] carries them, with its instants, to the protocol that writes the answer, and the
//! protocol closes the account with [`Receipt::sent`]. Whatever the stages do not cover (the
//! gaps of a request split over several batches) is the remainder, [`Stages::other`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::stats::{ModelStats, Phases};

/// The names of the stages, in the order a request passes them.
pub const STAGES: [&str; 8] = [
    "receive", "queue", "input", "wait", "infer", "output", "reply", "send",
];

/// One request's server time, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stages {
    pub receive: Duration,
    pub queue: Duration,
    /// The batch's assembly, its wait for an instance, the backend call and the slicing.
    pub phases: Phases,
    pub reply: Duration,
    pub send: Duration,
    /// Arrival to the last byte written.
    pub total: Duration,
}

impl Stages {
    /// Each stage's time, in the order of [`STAGES`].
    pub fn each(&self) -> [Duration; 8] {
        [
            self.receive,
            self.queue,
            self.phases.input,
            self.phases.wait,
            self.phases.infer,
            self.phases.output,
            self.reply,
            self.send,
        ]
    }

    /// The sum of the stages.
    pub fn accounted(&self) -> Duration {
        self.each().iter().sum()
    }

    /// The part of the total no stage covers.
    pub fn other(&self) -> Duration {
        self.total.saturating_sub(self.accounted())
    }
}

/// What the batcher measured of one answered request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) enqueued: Instant,
    pub(crate) dispatched: Instant,
    pub(crate) delivered: Instant,
    pub(crate) phases: Phases,
}

/// A request's account, from the batcher to the protocol that writes its answer.
#[derive(Clone)]
pub struct Receipt {
    stats: Arc<ModelStats>,
    timing: Timing,
    /// When the request's own task had its outputs back.
    resumed: Instant,
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receipt")
            .field("timing", &self.timing)
            .finish()
    }
}

impl Receipt {
    pub(crate) fn new(stats: Arc<ModelStats>, timing: Timing) -> Receipt {
        Receipt {
            stats,
            timing,
            resumed: Instant::now(),
        }
    }

    /// The stages of a request that arrived at `arrival` and whose answer was written at
    /// `written`. An arrival after queueing (a caller with no earlier instant) counts as queued.
    pub fn stages(&self, arrival: Instant, written: Instant) -> Stages {
        let t = &self.timing;
        let arrival = arrival.min(t.enqueued);
        // Batch work done before the outputs came back; a request split over several batches
        // has gaps between them, which stay in the remainder.
        let sliced = t.delivered;
        Stages {
            receive: t.enqueued - arrival,
            queue: t.dispatched.saturating_duration_since(t.enqueued),
            phases: t.phases,
            reply: self.resumed.saturating_duration_since(sliced),
            send: written.saturating_duration_since(self.resumed),
            total: written.saturating_duration_since(arrival),
        }
    }

    /// Closes the account: the answer's last byte was handed to the connection now.
    pub fn sent(&self, arrival: Instant) {
        self.stats
            .record_stages(&self.stages(arrival, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_of_contiguous_instants_add_up_to_the_total() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let phases = Phases {
            input: ms(1),
            wait: ms(2),
            infer: ms(5),
            output: ms(1),
        };
        let timing = Timing {
            enqueued: t0 + ms(3),
            dispatched: t0 + ms(7),
            delivered: t0 + ms(16),
            phases,
        };
        let receipt = Receipt {
            stats: Arc::default(),
            timing,
            resumed: t0 + ms(17),
        };
        let s = receipt.stages(t0, t0 + ms(20));
        assert_eq!(s.receive, ms(3));
        assert_eq!(s.queue, ms(4));
        assert_eq!(s.reply, ms(1));
        assert_eq!(s.send, ms(3));
        assert_eq!(s.total, ms(20));
        assert_eq!(s.accounted(), ms(20));
        assert_eq!(s.other(), Duration::ZERO);
        // A caller that saw the request only once queued: nothing before it counts.
        let late = receipt.stages(t0 + ms(5), t0 + ms(20));
        assert_eq!(late.receive, Duration::ZERO);
        assert_eq!(late.total, ms(17));
    }

    #[test]
    fn the_metric_series_are_the_stages_then_the_remainder_and_the_whole() {
        let series = crate::stats::STAGE_SERIES;
        assert_eq!(series[..STAGES.len()], STAGES);
        assert_eq!(series[STAGES.len()..], ["other", "total"]);
    }
}
