//! The item queue: queued requests, the replies they are owed, and batch forming.
//!
//! A request of N items is one [`Job`]. A batch takes items from the head of the queue, in
//! order, up to the maximum batch size: a job larger than the room left is split, and the rest
//! of it heads the next batch. Each piece is a [`Segment`] that remembers where its items start
//! in the request. The [`Reply`] collects the pieces' outputs, possibly from several batches,
//! and answers the client once all N items are back, in order.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use sheaf_backend::Tensor;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::policy::QueueState;
use crate::stats::{ModelStats, Phases};
use crate::InferError;

/// What a request's caller receives: the outputs in signature order, or an error.
pub(crate) type Outcome = Result<Vec<Tensor>, InferError>;

/// The promise of an answer to one request, shared by the batches that carry its items.
pub(crate) struct Reply {
    enqueued: Instant,
    stats: Arc<ModelStats>,
    state: Mutex<ReplyState>,
}

struct ReplyState {
    sender: Option<oneshot::Sender<Outcome>>,
    total: usize,
    received: usize,
    parts: Vec<(usize, Vec<Tensor>)>,
    first_dispatch: Option<Instant>,
    phases: Phases,
    /// The request's places in the model's queue; freed when the answer is sent.
    permit: Option<OwnedSemaphorePermit>,
}

impl Reply {
    pub(crate) fn new(
        sender: oneshot::Sender<Outcome>,
        items: usize,
        permit: OwnedSemaphorePermit,
        stats: Arc<ModelStats>,
    ) -> Arc<Reply> {
        Arc::new(Reply {
            enqueued: Instant::now(),
            stats,
            state: Mutex::new(ReplyState {
                sender: Some(sender),
                total: items,
                received: 0,
                parts: Vec::new(),
                first_dispatch: None,
                phases: Phases::default(),
                permit: Some(permit),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when nobody waits for the answer any more (client gone, or already answered).
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().sender.as_ref().is_none_or(|s| s.is_closed())
    }

    fn mark_dispatched(&self, now: Instant) {
        self.lock().first_dispatch.get_or_insert(now);
    }

    /// Adds the outputs of items `offset..offset + n`; answers once every item is back.
    pub(crate) fn deliver(
        &self,
        offset: usize,
        outputs: Vec<Tensor>,
        items: usize,
        phases: Phases,
    ) {
        let mut state = self.lock();
        if state.sender.is_none() {
            return;
        }
        state.received += items;
        state.phases.input += phases.input;
        state.phases.infer += phases.infer;
        state.phases.output += phases.output;
        state.parts.push((offset, outputs));
        if state.received < state.total {
            return;
        }
        let mut parts = std::mem::take(&mut state.parts);
        parts.sort_by_key(|(offset, _)| *offset);
        let outcome = join_parts(parts);
        let now = Instant::now();
        match &outcome {
            Ok(_) => self.stats.record_success(
                now - self.enqueued,
                state.first_dispatch.unwrap_or(now) - self.enqueued,
                state.phases,
            ),
            Err(_) => self.stats.fail.add(1, now - self.enqueued),
        }
        Self::send(&mut state, outcome);
    }

    /// Answers with `error`, unless an answer was already sent.
    pub(crate) fn fail(&self, error: InferError) {
        let mut state = self.lock();
        if state.sender.is_some() {
            self.stats.fail.add(1, self.enqueued.elapsed());
            Self::send(&mut state, Err(error));
        }
    }

    fn send(state: &mut ReplyState, outcome: Outcome) {
        if let Some(sender) = state.sender.take() {
            // The receiver may be gone (client disconnected); nothing is owed to it then.
            let _ = sender.send(outcome);
        }
        state.permit = None;
        state.parts.clear();
    }
}

/// Concatenates each output across the pieces of one request.
fn join_parts(parts: Vec<(usize, Vec<Tensor>)>) -> Outcome {
    let mut parts = parts.into_iter().map(|(_, outputs)| outputs);
    let Some(first) = parts.next() else {
        return Ok(Vec::new());
    };
    let rest: Vec<Vec<Tensor>> = parts.collect();
    if rest.is_empty() {
        return Ok(first);
    }
    first
        .into_iter()
        .enumerate()
        .map(|(i, head)| {
            let mut pieces = Vec::with_capacity(rest.len() + 1);
            pieces.push(head);
            pieces.extend(rest.iter().map(|outputs| outputs[i].clone()));
            Tensor::concat(&pieces).map_err(InferError::from)
        })
        .collect()
}

/// One queued request.
pub(crate) struct Job {
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) items: usize,
    /// Items already handed to batches.
    pub(crate) next: usize,
    pub(crate) reply: Arc<Reply>,
}

impl Job {
    fn remaining(&self) -> usize {
        self.items - self.next
    }
}

/// Items `offset..offset + len` of one request, carried by a batch.
pub(crate) struct Segment {
    pub(crate) reply: Arc<Reply>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// A formed batch, before assembly into tensors.
pub(crate) struct Formed {
    /// Per model input, the pieces to concatenate.
    pub(crate) pieces: Vec<Vec<Tensor>>,
    pub(crate) segments: Vec<Segment>,
    pub(crate) size: usize,
}

/// The waiting requests of one model, in arrival order.
#[derive(Default)]
pub(crate) struct Queue {
    jobs: VecDeque<Job>,
    items: usize,
}

impl Queue {
    pub(crate) fn push(&mut self, job: Job) {
        self.items += job.remaining();
        self.jobs.push_back(job);
    }

    pub(crate) fn state(&self) -> QueueState {
        QueueState {
            items: self.items,
            oldest: self.jobs.front().map(|j| j.reply.enqueued),
            ..Default::default()
        }
    }

    /// Takes up to `max` items from the head (one whole request when `max` is 0: no batching).
    /// Requests whose client has gone are dropped here, so they never run.
    pub(crate) fn take(&mut self, max: usize, now: Instant) -> Option<Formed> {
        self.drop_closed_head();
        let first = self.jobs.front()?;
        let mut formed = Formed {
            pieces: vec![Vec::new(); first.inputs.len()],
            segments: Vec::new(),
            size: 0,
        };
        if max == 0 {
            let job = self.jobs.pop_front()?;
            self.items -= job.remaining();
            job.reply.mark_dispatched(now);
            for (pieces, input) in formed.pieces.iter_mut().zip(job.inputs) {
                pieces.push(input);
            }
            formed.segments.push(Segment {
                reply: job.reply,
                offset: 0,
                len: 1,
            });
            formed.size = 1;
            return Some(formed);
        }
        while formed.size < max {
            self.drop_closed_head();
            let Some(job) = self.jobs.front_mut() else {
                break;
            };
            if !formed.segments.is_empty() && !job.stacks_with_first(&formed) {
                break;
            }
            let take = job.remaining().min(max - formed.size);
            for (pieces, input) in formed.pieces.iter_mut().zip(&job.inputs) {
                pieces.push(input.slice_items(job.next, take));
            }
            job.reply.mark_dispatched(now);
            formed.segments.push(Segment {
                reply: job.reply.clone(),
                offset: job.next,
                len: take,
            });
            job.next += take;
            formed.size += take;
            self.items -= take;
            if job.remaining() == 0 {
                self.jobs.pop_front();
            }
        }
        Some(formed)
    }

    fn drop_closed_head(&mut self) {
        while self.jobs.front().is_some_and(|j| j.reply.is_closed()) {
            if let Some(job) = self.jobs.pop_front() {
                self.items -= job.remaining();
            }
        }
    }

    /// Answers every waiting request with `error` (used at shutdown).
    pub(crate) fn fail_all(&mut self, error: InferError) {
        for job in self.jobs.drain(..) {
            job.reply.fail(error.clone());
        }
        self.items = 0;
    }
}

impl Job {
    fn stacks_with_first(&self, formed: &Formed) -> bool {
        formed
            .pieces
            .iter()
            .zip(&self.inputs)
            .all(|(pieces, input)| {
                pieces.first().map(|p| p.shape().get(1..)) == Some(input.shape().get(1..))
            })
    }
}
