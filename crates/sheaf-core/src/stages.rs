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
//! Each stage ends at the same clock reading as the next one starts: the batch's instants (taken
//! from the queue, assembled, started, returned, sliced) cut its phases, and the answer's
//! `delivered` instant is the one its last batch's slicing ended at, so a thread preempted
//! between two stages lengthens one of them and leaves nothing outside.
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

/// A request's account, from the batcher (or a pipeline's steps) to the protocol that writes
/// its answer.
#[derive(Clone)]
pub struct Receipt {
    made: Made,
    /// Its trace, when it was sampled (see [`crate::trace`]).
    trace: Option<crate::trace::Ticket>,
}

/// What made an answer.
#[derive(Clone)]
enum Made {
    /// A model's batches.
    Batch {
        stats: Arc<ModelStats>,
        timing: Timing,
        /// When the request's own task had its outputs back.
        resumed: Instant,
        /// The requests the model sent on this one's behalf while it ran (Triton's BLS
        /// requests made with `trace=request.trace()`), in the order they were answered.
        calls: Vec<StepReceipt>,
    },
    /// A pipeline's steps, from when it started to when its answer was put together, with the
    /// receipts of its model steps in the order the steps are run.
    Steps {
        started: Instant,
        ended: Instant,
        steps: Vec<StepReceipt>,
    },
}

/// The receipt of one model step of a pipeline, and which model and version answered it.
#[derive(Debug, Clone)]
pub struct StepReceipt {
    pub model: String,
    pub version: String,
    pub receipt: Receipt,
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.made {
            Made::Batch { timing, .. } => {
                f.debug_struct("Receipt").field("timing", timing).finish()
            }
            Made::Steps { steps, .. } => f.debug_struct("Receipt").field("steps", steps).finish(),
        }
    }
}

impl Receipt {
    pub(crate) fn new(stats: Arc<ModelStats>, timing: Timing) -> Receipt {
        Receipt {
            made: Made::Batch {
                stats,
                timing,
                resumed: Instant::now(),
                calls: Vec::new(),
            },
            trace: None,
        }
    }

    /// The receipt of a pipeline's answer, put together now, whose steps started at `started`.
    pub(crate) fn steps(started: Instant, steps: Vec<StepReceipt>) -> Receipt {
        Receipt {
            made: Made::Steps {
                started,
                ended: Instant::now(),
                steps,
            },
            trace: None,
        }
    }

    /// The compute phases of the batches that answered: a model's batch's, or the sum of a
    /// pipeline's model steps'.
    pub fn phases(&self) -> Phases {
        match &self.made {
            Made::Batch { timing, .. } => timing.phases,
            Made::Steps { steps, .. } => {
                steps
                    .iter()
                    .map(|s| s.receipt.phases())
                    .fold(Phases::default(), |sum, p| Phases {
                        input: sum.input + p.input,
                        wait: sum.wait + p.wait,
                        infer: sum.infer + p.infer,
                        output: sum.output + p.output,
                    })
            }
        }
    }

    /// How long the request waited in its model's queue before its first batch took it: a
    /// model's; for a pipeline, its model steps' added up.
    pub fn queued(&self) -> Duration {
        match &self.made {
            Made::Batch { timing: t, .. } => t.dispatched.saturating_duration_since(t.enqueued),
            Made::Steps { steps, .. } => steps.iter().map(|s| s.receipt.queued()).sum(),
        }
    }

    /// Traces the request: its trace is recorded when the account closes.
    pub fn trace(&mut self, ticket: crate::trace::Ticket) {
        self.trace = Some(ticket);
    }

    /// Takes in the accounts the model left in `calls` of the requests it sent on this one's
    /// behalf (see [`sheaf_backend::caller`]): traced with it, each as its child.
    pub(crate) fn called(&mut self, calls: &sheaf_backend::TraceCalls) {
        if let Made::Batch { calls: kept, .. } = &mut self.made {
            kept.extend(
                calls
                    .take()
                    .into_iter()
                    .filter_map(|account| account.downcast::<StepReceipt>().ok())
                    .map(|step| *step),
            );
        }
    }

    /// The stages of a request that arrived at `arrival` and whose answer was written at
    /// `written`. An arrival after queueing (a caller with no earlier instant) counts as queued.
    /// None for a pipeline's answer: its steps' time is their models' own.
    pub fn stages(&self, arrival: Instant, written: Instant) -> Option<Stages> {
        let Made::Batch {
            timing: t, resumed, ..
        } = &self.made
        else {
            return None;
        };
        let arrival = arrival.min(t.enqueued);
        // Batch work done before the outputs came back; a request split over several batches
        // has gaps between them, which stay in the remainder.
        let sliced = t.delivered;
        Some(Stages {
            receive: t.enqueued - arrival,
            queue: t.dispatched.saturating_duration_since(t.enqueued),
            phases: t.phases,
            reply: resumed.saturating_duration_since(sliced),
            send: written.saturating_duration_since(*resumed),
            total: written.saturating_duration_since(arrival),
        })
    }

    /// Closes the account: the answer's last byte was handed to the connection now. A model's
    /// stages are recorded in its statistics; a traced request records its trace, and a
    /// pipeline's that of each model step (Triton's `parent_id` naming the pipeline's).
    pub fn sent(self, arrival: Instant) {
        let written = Instant::now();
        if let (Made::Batch { stats, .. }, Some(stages)) =
            (&self.made, self.stages(arrival, written))
        {
            stats.record_stages(&stages);
        }
        if let Some(ticket) = &self.trace {
            self.record(ticket, Some((arrival, written)));
        }
    }

    /// Records the trace of this answer on `ticket`, its steps' or its calls' first (each on a
    /// ticket of its own that names this one as its parent); `sent`: the answer's arrival and
    /// writing.
    fn record(&self, ticket: &crate::trace::Ticket, sent: Option<(Instant, Instant)>) {
        let children = match &self.made {
            Made::Steps { steps, .. } => steps,
            Made::Batch { calls, .. } => calls,
        };
        for child in children {
            child
                .receipt
                .record(&ticket.child(&child.model, &child.version), None);
        }
        ticket.record(&self.points(sent.map(|(a, w)| (ticket.protocol(), a, w))));
    }

    /// The trace's points: Triton's request points and, for a model's batches, its queue and
    /// compute points, at the instants the stages are cut at, each no earlier than the one
    /// before; with `sent`, the protocol's receive and send points around them.
    fn points(
        &self,
        sent: Option<(crate::trace::Protocol, Instant, Instant)>,
    ) -> Vec<(&'static str, Instant)> {
        let mut points = Vec::with_capacity(11);
        let (start, end) = self.span();
        let send = sent.map(|(protocol, arrival, written)| {
            let [receive_start, receive_end, send_start, send_end] = protocol.points();
            points.push((receive_start, arrival.min(start)));
            points.push((receive_end, start));
            [(send_start, end), (send_end, written.max(end))]
        });
        points.push(("REQUEST_START", start));
        if let Made::Batch { timing, .. } = &self.made {
            points.extend(compute_points(timing));
        }
        points.push(("REQUEST_END", end));
        points.extend(send.into_iter().flatten());
        points
    }

    /// When the request started and when its task had the answer back.
    fn span(&self) -> (Instant, Instant) {
        match &self.made {
            Made::Batch {
                timing: t, resumed, ..
            } => (t.enqueued, (*resumed).max(t.delivered.max(t.dispatched))),
            Made::Steps { started, ended, .. } => (*started, (*ended).max(*started)),
        }
    }
}

/// A batched request's queue and compute points (see [`crate::trace`]), each no earlier than
/// the one before.
fn compute_points(t: &Timing) -> [(&'static str, Instant); 5] {
    let back = |from: Instant, by: std::time::Duration| {
        from.checked_sub(by).unwrap_or(from).max(t.dispatched)
    };
    let computed = t.delivered.max(t.dispatched);
    let output_start = back(computed, t.phases.output);
    let input_end = back(output_start, t.phases.infer);
    [
        ("QUEUE_START", t.enqueued),
        ("COMPUTE_START", t.dispatched.max(t.enqueued)),
        ("COMPUTE_INPUT_END", input_end),
        ("COMPUTE_OUTPUT_START", output_start),
        ("COMPUTE_END", computed),
    ]
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
            made: Made::Batch {
                stats: Arc::default(),
                timing,
                resumed: t0 + ms(17),
                calls: Vec::new(),
            },
            trace: None,
        };
        let s = receipt.stages(t0, t0 + ms(20)).unwrap();
        assert_eq!(s.receive, ms(3));
        assert_eq!(s.queue, ms(4));
        assert_eq!(s.reply, ms(1));
        assert_eq!(s.send, ms(3));
        assert_eq!(s.total, ms(20));
        assert_eq!(s.accounted(), ms(20));
        assert_eq!(s.other(), Duration::ZERO);
        // A caller that saw the request only once queued: nothing before it counts.
        let late = receipt.stages(t0 + ms(5), t0 + ms(20)).unwrap();
        assert_eq!(late.receive, Duration::ZERO);
        assert_eq!(late.total, ms(17));

        // The trace's points fall on the same instants, in order.
        let at = |points: Vec<(&'static str, Instant)>| -> Vec<(&'static str, u64)> {
            points
                .iter()
                .map(|(name, i)| (*name, (*i - t0).as_millis() as u64))
                .collect()
        };
        let sent = Some((crate::trace::Protocol::Http, t0, t0 + ms(20)));
        let served = at(receipt.points(sent));
        assert_eq!(
            served,
            [
                ("HTTP_RECV_START", 0),
                ("HTTP_RECV_END", 3),
                ("REQUEST_START", 3),
                ("QUEUE_START", 3),
                ("COMPUTE_START", 7),
                ("COMPUTE_INPUT_END", 10),
                ("COMPUTE_OUTPUT_START", 15),
                ("COMPUTE_END", 16),
                ("REQUEST_END", 17),
                ("HTTP_SEND_START", 17),
                ("HTTP_SEND_END", 20),
            ]
        );
        // As a pipeline's step: the same, less the protocol's points.
        assert_eq!(at(receipt.points(None)), served[2..9]);
        // A pipeline's answer (steps from 2 to 18 ms) holds no stages of its own, and its trace
        // the request points alone between the protocol's.
        let pipeline = Receipt {
            made: Made::Steps {
                started: t0 + ms(2),
                ended: t0 + ms(18),
                steps: vec![StepReceipt {
                    model: "m".into(),
                    version: "1".into(),
                    receipt,
                }],
            },
            trace: None,
        };
        assert!(pipeline.stages(t0, t0 + ms(20)).is_none());
        let sent = Some((crate::trace::Protocol::Grpc, t0, t0 + ms(20)));
        assert_eq!(
            at(pipeline.points(sent)),
            [
                ("GRPC_WAITREAD_START", 0),
                ("GRPC_WAITREAD_END", 2),
                ("REQUEST_START", 2),
                ("REQUEST_END", 18),
                ("GRPC_SEND_START", 18),
                ("GRPC_SEND_END", 20),
            ]
        );
    }

    #[test]
    fn the_metric_series_are_the_stages_then_the_remainder_and_the_whole() {
        let series = crate::stats::STAGE_SERIES;
        assert_eq!(series[..STAGES.len()], STAGES);
        assert_eq!(series[STAGES.len()..], ["other", "total"]);
    }
}
