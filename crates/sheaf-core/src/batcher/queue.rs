//! The item queue: queued requests, the replies they are owed, and batch forming.
//!
//! A request of N items is one [`Job`]. A batch takes items from the head of the queue, in
//! order, up to the maximum batch size: a job larger than the room left is split, and the rest
//! of it heads the next batch. Each piece is a [`Segment`] that remembers where its items start
//! in the request. The [`Reply`] collects the pieces' outputs, possibly from several batches,
//! and answers the client once all N items are back, in order. A request to a streaming model
//! also carries a channel its responses go through as they come ([`Reply::part`]); its answer,
//! with no outputs of its own, closes it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use sheaf_backend::{RequestInfo, Tensor};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::policy::QueueState;
use crate::request::Parameters;
use crate::stages::Timing;
use crate::stats::{ModelStats, Phases};
use crate::{ErrorKind, InferError};

/// What a request's caller receives: the outputs in signature order with what the batcher
/// measured of them, or an error.
pub(crate) type Outcome = Result<Delivered, InferError>;

/// A request's outputs, what the batcher measured of them, and the parameters the model put in
/// its answer.
pub(crate) struct Delivered {
    pub(crate) outputs: Vec<Tensor>,
    pub(crate) timing: Timing,
    pub(crate) parameters: Option<Parameters>,
}

/// One response of a streaming request: its outputs in signature order, and its parameters.
pub type Part = (Vec<Tensor>, Option<Parameters>);

/// The promise of an answer to one request, shared by the batches that carry its items.
pub(crate) struct Reply {
    enqueued: Instant,
    /// Its priority level index, which a run again keeps.
    level: usize,
    /// What else is known of the request (see [`super::Admission::info`]).
    info: Option<Arc<RequestInfo>>,
    /// Which outputs it reads (see [`super::Admission::reads`]).
    reads: Option<Arc<[bool]>>,
    /// The model asked for the request to run again: its later runs carry no sequence flags.
    again: std::sync::atomic::AtomicBool,
    stats: Arc<ModelStats>,
    state: Mutex<ReplyState>,
}

/// A queued request's places: in the model's queue, and in its priority level's where that has
/// a bound of its own.
pub(crate) type Permits = (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>);

/// The responses of a streaming request as they come, before its [`Outcome`] ends it.
pub(crate) type Parts = tokio::sync::mpsc::UnboundedSender<Result<Part, InferError>>;

struct ReplyState {
    sender: Option<oneshot::Sender<Outcome>>,
    /// For a request to a streaming model: where its responses go; closed with the answer.
    stream: Option<Parts>,
    total: usize,
    received: usize,
    parts: Vec<(usize, Vec<Tensor>)>,
    /// The parameters the model put in its answer (a model that answers requests).
    parameters: Option<Parameters>,
    first_dispatch: Option<Instant>,
    phases: Phases,
    /// The request's places in the model's queue (and in its priority level's, where that has
    /// a bound of its own); freed when the answer is sent.
    permit: Option<Permits>,
}

impl Reply {
    /// The reply owed to a request of `items` items, admitted as `admission` says.
    pub(crate) fn new(
        sender: oneshot::Sender<Outcome>,
        items: usize,
        permit: Permits,
        stats: Arc<ModelStats>,
        admission: &super::Admission,
    ) -> Arc<Reply> {
        Arc::new(Reply {
            enqueued: Instant::now(),
            level: admission.level,
            info: admission.info.clone(),
            reads: admission.reads.clone(),
            again: std::sync::atomic::AtomicBool::new(false),
            stats,
            state: Mutex::new(ReplyState {
                sender: Some(sender),
                stream: None,
                total: items,
                received: 0,
                parts: Vec::new(),
                parameters: None,
                first_dispatch: None,
                phases: Phases::default(),
                permit: Some(permit),
            }),
        })
    }

    /// As [`Reply::new`], for a request whose responses stream into `parts` before the answer
    /// (with no outputs of its own) ends it.
    pub(crate) fn streaming(
        sender: oneshot::Sender<Outcome>,
        parts: Parts,
        items: usize,
        permit: Permits,
        stats: Arc<ModelStats>,
        admission: &super::Admission,
    ) -> Arc<Reply> {
        let reply = Reply::new(sender, items, permit, stats, admission);
        reply.lock().stream = Some(parts);
        reply
    }

    /// Whether the request reads the model's output `index`.
    pub(crate) fn reads(&self, index: usize) -> bool {
        self.reads
            .as_deref()
            .is_none_or(|r| r.get(index).copied().unwrap_or(true))
    }

    /// Its priority level index.
    pub(crate) fn level(&self) -> usize {
        self.level
    }

    /// What else is known of the request.
    /// Once the request runs again, without its sequence flags (Triton's iterative
    /// sequences: START on the first run only).
    pub(crate) fn info(&self) -> Option<Arc<RequestInfo>> {
        match &self.info {
            Some(i) if i.flags != 0 && self.again.load(std::sync::atomic::Ordering::Relaxed) => {
                Some(Arc::new(RequestInfo {
                    flags: 0,
                    ..RequestInfo::clone(i)
                }))
            }
            info => info.clone(),
        }
    }

    /// The model asked for the request to run again.
    pub(crate) fn runs_again(&self) {
        self.again.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The optional inputs the request left out ([`RequestInfo::absent`]).
    fn absent(&self) -> &[String] {
        self.info.as_deref().map_or(&[], |i| i.absent.as_slice())
    }

    /// Passes one response of a streaming request on, as it comes.
    pub(crate) fn part(&self, response: Result<Part, InferError>) {
        if let Some(stream) = &self.lock().stream {
            let _ = stream.send(response);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long the request had waited by `at`.
    pub(crate) fn waited(&self, at: Instant) -> std::time::Duration {
        at.saturating_duration_since(self.enqueued)
    }

    /// True when nobody waits for the answer any more (client gone, or already answered).
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().sender.as_ref().is_none_or(|s| s.is_closed())
    }

    /// The request's items.
    pub(crate) fn items(&self) -> usize {
        self.lock().total
    }

    fn mark_dispatched(&self, now: Instant) {
        self.lock().first_dispatch.get_or_insert(now);
    }

    /// As [`Reply::deliver`], for the whole request answered by a model that answers
    /// requests, with the parameters it put in its answer.
    pub(crate) fn deliver_answer(
        &self,
        offset: usize,
        outputs: Vec<Tensor>,
        items: usize,
        ran: (Phases, Instant),
        parameters: Option<Parameters>,
    ) {
        self.lock().parameters = parameters;
        self.deliver(offset, outputs, items, ran);
    }

    /// Adds the outputs of items `offset..offset + n`, whose batch's `phases` ended at `ended`;
    /// answers once every item is back. The answer's account has its compute end at `ended`
    /// of the last batch, so that the hand-off back to the request (the `reply` stage) starts
    /// where the batch's phases stop.
    pub(crate) fn deliver(
        &self,
        offset: usize,
        outputs: Vec<Tensor>,
        items: usize,
        (phases, ended): (Phases, Instant),
    ) {
        let mut state = self.lock();
        if state.sender.is_none() {
            return;
        }
        state.received += items;
        state.phases.input += phases.input;
        state.phases.wait += phases.wait;
        state.phases.infer += phases.infer;
        state.phases.output += phases.output;
        state.parts.push((offset, outputs));
        if state.received < state.total {
            return;
        }
        let mut parts = std::mem::take(&mut state.parts);
        parts.sort_by_key(|(offset, _)| *offset);
        let joined = join_parts(parts);
        let now = ended.max(self.enqueued);
        let timing = Timing {
            enqueued: self.enqueued,
            dispatched: state.first_dispatch.unwrap_or(now),
            delivered: now,
            phases: state.phases,
        };
        match &joined {
            Ok(_) => self.stats.record_success(
                now - self.enqueued,
                timing.dispatched - self.enqueued,
                state.phases,
            ),
            Err(e) => self.stats.record_failure(e.kind, now - self.enqueued),
        }
        let parameters = state.parameters.take();
        Self::send(
            &mut state,
            joined.map(|outputs| Delivered {
                outputs,
                timing,
                parameters,
            }),
        );
    }

    /// Answers with `error`, unless an answer was already sent.
    pub(crate) fn fail(&self, error: InferError) {
        let mut state = self.lock();
        if state.sender.is_some() {
            self.stats
                .record_failure(error.kind, self.enqueued.elapsed());
            Self::send(&mut state, Err(error));
        }
    }

    fn send(state: &mut ReplyState, outcome: Outcome) {
        if let Some(sender) = state.sender.take() {
            // The receiver may be gone (client disconnected); nothing is owed to it then.
            let _ = sender.send(outcome);
        }
        state.permit = None;
        state.stream = None;
        state.parts.clear();
    }
}

/// Concatenates each output across the pieces of one request.
fn join_parts(parts: Vec<(usize, Vec<Tensor>)>) -> Result<Vec<Tensor>, InferError> {
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
    /// Priority level index: 0 is served first.
    pub(crate) level: usize,
    /// When the request must have started, if it has a timeout.
    pub(crate) deadline: Option<Instant>,
    pub(crate) reply: Arc<Reply>,
}

impl Job {
    fn remaining(&self) -> usize {
        self.items - self.next
    }

    /// Positions one item holds in its first input (a text encoder's tokens).
    fn item_len(&self) -> usize {
        self.inputs.first().map_or(1, |t| {
            t.shape().get(1..).unwrap_or_default().iter().product()
        })
    }
}

/// Items `offset..offset + len` of one request, carried by a batch.
pub(crate) struct Segment {
    pub(crate) reply: Arc<Reply>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// Each input's item dimensions (past dimension 0) as the request sent them, before any
    /// padding: outputs are trimmed back to these.
    pub(crate) dims: Vec<Vec<usize>>,
}

/// A formed batch, before assembly into tensors.
pub(crate) struct Formed {
    /// Per model input, the pieces to concatenate.
    pub(crate) pieces: Vec<Vec<Tensor>>,
    pub(crate) segments: Vec<Segment>,
    pub(crate) size: usize,
}

/// What happens to a queued request whose timeout passes before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutAction {
    /// Answer it with a timeout error at once.
    Reject,
    /// Keep it, behind everything else: it moves to the lowest priority level.
    Delay,
}

/// The waiting requests of one model: one FIFO per priority level, level 0 first.
pub(crate) struct Queue {
    levels: Vec<VecDeque<Job>>,
    /// Variable-length batching: `Some(bucket width)` (0 = any lengths together).
    padding: Option<usize>,
    /// Most positions per batch, padding included (items × the longest item); 0: no limit.
    max_batch_tokens: usize,
    items: usize,
    /// Jobs that carry a deadline; when 0, expiry costs nothing.
    with_deadline: usize,
    /// What happens to a request of each level whose timeout passes.
    timeout_actions: Vec<TimeoutAction>,
    /// Per input, whether requests of any item shape stack (Triton's `allow_ragged_batch`).
    ragged: Option<crate::ragged::RaggedInputs>,
}

impl Queue {
    /// A queue of `timeout_actions.len()` priority levels (at least one), each with what
    /// happens to its requests whose timeout passes.
    pub(crate) fn new(
        mut timeout_actions: Vec<TimeoutAction>,
        padding: Option<(usize, usize)>,
    ) -> Queue {
        if timeout_actions.is_empty() {
            timeout_actions.push(TimeoutAction::Reject);
        }
        Queue {
            levels: timeout_actions.iter().map(|_| VecDeque::new()).collect(),
            padding: padding.map(|p| p.0),
            max_batch_tokens: padding.map_or(0, |p| p.1),
            items: 0,
            with_deadline: 0,
            timeout_actions,
            ragged: None,
        }
    }

    /// The queue stacks requests whose ragged inputs differ in shape ([`crate::ragged`]).
    pub(crate) fn with_ragged(mut self, ragged: Option<crate::ragged::RaggedInputs>) -> Queue {
        self.ragged = ragged;
        self
    }

    pub(crate) fn push(&mut self, mut job: Job) {
        self.items += job.remaining();
        self.with_deadline += usize::from(job.deadline.is_some());
        job.level = job.level.min(self.levels.len() - 1);
        self.levels[job.level].push_back(job);
    }

    /// Puts a job first in its level: a request the model asked to run again goes on before
    /// the requests that came after it.
    pub(crate) fn push_front(&mut self, mut job: Job) {
        self.items += job.remaining();
        self.with_deadline += usize::from(job.deadline.is_some());
        job.level = job.level.min(self.levels.len() - 1);
        self.levels[job.level].push_front(job);
    }

    pub(crate) fn state(&self) -> QueueState {
        QueueState {
            items: self.items,
            oldest: self
                .levels
                .iter()
                .filter_map(|l| l.front())
                .map(|j| j.reply.enqueued)
                .min(),
            ..Default::default()
        }
    }

    /// Whether a batch may be assembled ahead into a pipeline slot: only when nothing can still
    /// change which requests it should hold (one priority level, no deadlines).
    pub(crate) fn can_assemble_ahead(&self) -> bool {
        self.levels.len() == 1 && self.with_deadline == 0
    }

    /// Items waiting (not yet handed to a batch).
    pub(crate) fn items(&self) -> usize {
        self.items
    }

    /// Handles requests whose deadline has passed, and returns the next deadline still ahead.
    pub(crate) fn expire(&mut self, now: Instant) -> Option<Instant> {
        if self.with_deadline == 0 {
            return None;
        }
        let last = self.levels.len() - 1;
        let mut delayed = Vec::new();
        for (level, action) in self.levels.iter_mut().zip(&self.timeout_actions) {
            let mut kept = VecDeque::with_capacity(level.len());
            for mut job in level.drain(..) {
                match job.deadline {
                    Some(d) if d <= now => {
                        self.with_deadline -= 1;
                        match action {
                            TimeoutAction::Reject => {
                                self.items -= job.remaining();
                                let waited = now - job.reply.enqueued;
                                job.reply.fail(InferError::new(
                                    ErrorKind::Timeout,
                                    format!(
                                        "request timed out after {} µs in the queue",
                                        waited.as_micros()
                                    ),
                                ));
                            }
                            TimeoutAction::Delay => {
                                job.deadline = None;
                                job.level = last;
                                delayed.push(job);
                            }
                        }
                    }
                    _ => kept.push_back(job),
                }
            }
            *level = kept;
        }
        self.levels[last].extend(delayed);
        self.levels
            .iter()
            .flatten()
            .filter_map(|j| j.deadline)
            .min()
    }

    /// Takes up to `max` items from the heads of the levels, highest priority first (one whole
    /// request when `max` is 0: no batching). Requests whose client has gone are dropped here,
    /// so they never run.
    pub(crate) fn take(&mut self, max: usize, now: Instant) -> Option<Formed> {
        self.drop_closed_heads();
        let first = self.levels.iter().find_map(|l| l.front())?;
        let mut formed = Formed {
            pieces: vec![Vec::new(); first.inputs.len()],
            segments: Vec::new(),
            size: 0,
        };
        let limit = max.max(1);
        // With a token budget, the longest item so far bounds how many items fit.
        let mut longest = 0usize;
        // The batch starts with the oldest request of the highest level, so nothing starves;
        // then it scans on for requests that stack with it (same item shape, or with padding
        // the same length buckets), leaving the others in place and in order.
        'levels: for level in 0..self.levels.len() {
            let mut i = 0;
            while formed.size < limit && i < self.levels[level].len() {
                let job = &mut self.levels[level][i];
                if job.reply.is_closed() {
                    if let Some(gone) = self.levels[level].remove(i) {
                        self.items -= gone.remaining();
                        self.with_deadline -= usize::from(gone.deadline.is_some());
                    }
                    continue;
                }
                if !formed.segments.is_empty()
                    && (max == 0
                        || !stacks_with(job, &formed, self.padding, self.ragged.as_deref()))
                {
                    if max == 0 {
                        break 'levels;
                    }
                    i += 1;
                    continue;
                }
                let take = if max == 0 {
                    job.items
                } else {
                    let mut take = job.remaining().min(limit - formed.size);
                    if self.max_batch_tokens > 0 {
                        let long = longest.max(job.item_len());
                        let fits = (self.max_batch_tokens / long.max(1)).max(1);
                        take = take.min(fits.saturating_sub(formed.size));
                        if take == 0 {
                            i += 1;
                            continue;
                        }
                        longest = long;
                    }
                    take
                };
                for (pieces, input) in formed.pieces.iter_mut().zip(&job.inputs) {
                    pieces.push(if max == 0 {
                        input.clone()
                    } else {
                        input.slice_items(job.next, take)
                    });
                }
                job.reply.mark_dispatched(now);
                formed.segments.push(Segment {
                    reply: job.reply.clone(),
                    offset: job.next,
                    len: take,
                    dims: job
                        .inputs
                        .iter()
                        .map(|t| t.shape().get(1..).unwrap_or_default().to_vec())
                        .collect(),
                });
                job.next += take;
                formed.size += take;
                self.items -= take;
                if job.remaining() == 0 {
                    if let Some(done) = self.levels[level].remove(i) {
                        self.with_deadline -= usize::from(done.deadline.is_some());
                    }
                } else {
                    i += 1;
                }
                if max == 0 {
                    break 'levels;
                }
            }
        }
        Some(formed)
    }

    fn drop_closed_heads(&mut self) {
        for level in &mut self.levels {
            while level.front().is_some_and(|j| j.reply.is_closed()) {
                if let Some(job) = level.pop_front() {
                    self.items -= job.remaining();
                    self.with_deadline -= usize::from(job.deadline.is_some());
                }
            }
        }
    }

    /// Answers every waiting request with `error` (used at shutdown).
    pub(crate) fn fail_all(&mut self, error: InferError) {
        for job in self.levels.iter_mut().flat_map(|l| l.drain(..)) {
            job.reply.fail(error.clone());
        }
        self.items = 0;
        self.with_deadline = 0;
    }
}

/// Whether `job`'s items can join `formed`: the same optional inputs left out (as Triton
/// batches only requests with the same inputs), and for every input the same shape past
/// dimension 0; with padding, the same rank and, with a bucket width, lengths in the same
/// buckets. A ragged input stacks with any shape.
fn stacks_with(
    job: &Job,
    formed: &Formed,
    padding: Option<usize>,
    ragged: Option<&[bool]>,
) -> bool {
    if let Some(first) = formed.segments.first() {
        if job.reply.absent() != first.reply.absent() {
            return false;
        }
    }
    formed
        .pieces
        .iter()
        .zip(&job.inputs)
        .enumerate()
        .all(|(i, (pieces, input))| {
            let Some(first) = pieces.first() else {
                return false;
            };
            if ragged.is_some_and(|r| r.get(i) == Some(&true)) {
                return true;
            }
            let (a, b) = (
                first.shape().get(1..).unwrap_or_default(),
                input.shape().get(1..).unwrap_or_default(),
            );
            match padding {
                None => a == b,
                Some(width) => {
                    a.len() == b.len()
                        && (width == 0
                            || a.iter()
                                .zip(b)
                                .all(|(x, y)| x.div_ceil(width) == y.div_ceil(width)))
                }
            }
        })
}
