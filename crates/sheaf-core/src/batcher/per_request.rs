//! Batches of a model that answers each request on its own ([`Model::infer_requests`]: a
//! Triton-style Python model) or streams its answers ([`Model::infer_streaming`]: a decoupled
//! one). The batch reaches the model as its requests, each with what else is known of it; each
//! request gets its own answer or error, checked against the signature, and one the model asks
//! to run again (Triton's request rescheduling) goes back into the model's queue. The instance
//! thread that runs them is [`super::executor`]'s.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use sheaf_backend::{Answer, BackendError, Model, RequestInfo, ResponseStream, Signature, Tensor};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::executor::{fits, panic_text, ran, Done, Inputs, Report};
use super::queue::{Job, Reply, Segment};
use super::shared::Shared;
use crate::stats::Phases;
use crate::InferError;

/// A batch for a model that answers each request on its own: the requests' tensors, one list
/// per segment, in signature order.
pub(super) struct RequestBatch {
    requests: Vec<Vec<Tensor>>,
    /// What else is known of each request (its id, sequence, requested outputs).
    infos: Vec<Option<Arc<RequestInfo>>>,
    segments: Vec<Segment>,
    size: usize,
    batched: bool,
    /// When the batch was taken from the queue, and when its assembly ended.
    cuts: (Instant, Instant),
    slot: OwnedSemaphorePermit,
}

/// The batch's inputs as each request's own tensors.
pub(super) fn batch_parts(
    inputs: Inputs,
    segments: Vec<Segment>,
    size: usize,
    batched: bool,
    cuts: (Instant, Instant),
    slot: OwnedSemaphorePermit,
) -> RequestBatch {
    let requests = match inputs {
        // Per input, one piece per segment: turned into per segment, one tensor per input.
        Inputs::Pieces(pieces) => (0..segments.len())
            .map(|s| pieces.iter().filter_map(|p| p.get(s).cloned()).collect())
            .collect(),
        // Assembled (a model that does not batch: one request), or a batch sliced back by rows.
        Inputs::Assembled(tensors) if segments.len() == 1 => vec![tensors],
        Inputs::Assembled(tensors) => {
            let mut row = 0;
            segments
                .iter()
                .map(|seg| {
                    let piece = tensors
                        .iter()
                        .map(|t| t.slice_items(row, seg.len))
                        .collect();
                    row += seg.len;
                    piece
                })
                .collect()
        }
    };
    RequestBatch {
        requests,
        infos: segments.iter().map(|s| s.reply.info()).collect(),
        segments,
        size,
        batched,
        cuts,
        slot,
    }
}

/// Each request's info, [`RequestInfo::NONE`] where nothing more is known.
fn known(infos: &[Option<Arc<RequestInfo>>]) -> Vec<&RequestInfo> {
    static NONE: RequestInfo = RequestInfo::NONE;
    infos
        .iter()
        .map(|i| i.as_deref().unwrap_or(&NONE))
        .collect()
}

/// Runs a batch of requests through [`Model::infer_requests`] and answers each segment with its
/// own result: one request's error, or an answer that does not fit the signature, fails that
/// request alone.
pub(super) fn run_requests(
    model: &mut dyn Model,
    batch: RequestBatch,
    report: &Report,
    instance: &str,
) -> Done {
    let RequestBatch {
        requests,
        infos,
        segments,
        size,
        batched,
        cuts,
        slot,
    } = batch;
    let started = Instant::now();
    let infos = known(&infos);
    let results = catch_unwind(AssertUnwindSafe(|| model.infer_requests(&requests, &infos)));
    let (phases, ended) = ran(report, size, cuts, started, slot);
    let infer = phases.infer;
    tracing::debug!(
        instance,
        batch_size = size,
        requests = segments.len(),
        compute_ms = infer.as_secs_f64() * 1000.0,
        "batch"
    );
    let done = Done {
        size,
        took: infer,
        buffers: Vec::new(),
    };
    let results = match results {
        Ok(results) if results.len() == segments.len() => results,
        failed => {
            let error = InferError::internal(match failed {
                Ok(results) => format!(
                    "the model answered {} of a batch's {} requests",
                    results.len(),
                    segments.len()
                ),
                Err(p) => format!("model panicked: {}", panic_text(&p)),
            });
            segments.iter().for_each(|s| s.reply.fail(error.clone()));
            return done;
        }
    };
    let mut again = Vec::new();
    for ((seg, result), inputs) in segments.iter().zip(results).zip(requests) {
        if let Err(BackendError::Rescheduled) = result {
            again.extend(to_run_again(&seg.reply, seg.offset, seg.len, inputs));
            continue;
        }
        let answer = result.map_err(InferError::from).and_then(|answer| {
            let parameters = answer.parameters.map(Arc::new);
            fits(
                model.signature(),
                answer.outputs,
                batched.then_some(seg.len),
            )
            .map(|outputs| (outputs, parameters))
        });
        match answer {
            Ok((outputs, parameters)) => {
                seg.reply
                    .deliver_answer(seg.offset, outputs, seg.len, (phases, ended), parameters)
            }
            Err(error) => {
                tracing::warn!(%error, instance, "request failed");
                seg.reply.fail(error)
            }
        }
    }
    requeue(report.queue, again);
    done
}

/// Runs a batch of requests through [`Model::infer_streaming`]: each request gets a
/// [`ToClient`] stream, which passes each response on as it comes (checked against the
/// signature; one that does not fit is an error in that stream) and closes the request at its
/// end. The streams may outlive the call: the instance takes its next batch while earlier
/// requests still stream, as a Triton decoupled model's instance does once `execute` returns.
pub(super) fn run_streaming(
    model: &mut dyn Model,
    batch: RequestBatch,
    report: &Report,
    instance: &str,
) -> Done {
    let RequestBatch {
        requests,
        infos,
        segments,
        size,
        cuts,
        slot,
        ..
    } = batch;
    let started = Instant::now();
    let signature = Arc::new(model.signature().clone());
    let infos = known(&infos);
    let streams: Vec<Box<dyn ResponseStream>> = segments
        .iter()
        .zip(&requests)
        .map(|(seg, inputs)| {
            Box::new(ToClient {
                reply: Arc::clone(&seg.reply),
                again: report.queue.map(|q| (Arc::clone(q), inputs.clone())),
                offset: seg.offset,
                len: seg.len,
                signature: Arc::clone(&signature),
                input: cuts.1.saturating_duration_since(cuts.0),
                wait: started.saturating_duration_since(cuts.1),
                started,
                ended: false,
            }) as Box<dyn ResponseStream>
        })
        .collect();
    let result = catch_unwind(AssertUnwindSafe(|| {
        model.infer_streaming(&requests, &infos, streams)
    }));
    let (phases, _) = ran(report, size, cuts, started, slot);
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, instance, "streaming batch failed"),
        Err(p) => {
            // The streams were dropped as the panic unwound, failing their requests.
            tracing::warn!(instance, "model panicked: {}", panic_text(&p));
        }
    }
    Done {
        size,
        took: phases.infer,
        buffers: Vec::new(),
    }
}

/// The stream of one request to a streaming model ([`ResponseStream`]): its responses go to
/// the client as they come, and its end answers the request, with the time from the batch's
/// start to the end as its compute time.
struct ToClient {
    reply: Arc<Reply>,
    /// The model's queue and the request's inputs, should the model ask for it to run again.
    again: Option<(Arc<Shared>, Vec<Tensor>)>,
    offset: usize,
    len: usize,
    signature: Arc<Signature>,
    input: Duration,
    wait: Duration,
    started: Instant,
    ended: bool,
}

impl ResponseStream for ToClient {
    fn part(&mut self, response: Result<Answer, BackendError>) {
        let checked = response.map_err(InferError::from).and_then(|answer| {
            let parameters = answer.parameters.map(Arc::new);
            fits(&self.signature, answer.outputs, None).map(|o| (o, parameters))
        });
        self.reply.part(checked);
    }

    fn end(mut self: Box<Self>, result: Result<(), BackendError>) {
        self.ended = true;
        match result {
            Ok(()) => {
                let ended = Instant::now();
                let phases = Phases {
                    input: self.input,
                    wait: self.wait,
                    infer: ended.saturating_duration_since(self.started),
                    output: Duration::ZERO,
                };
                self.reply
                    .deliver(self.offset, Vec::new(), self.len, (phases, ended));
            }
            Err(e) => self.reply.fail(InferError::from(e)),
        }
    }

    fn is_cancelled(&self) -> bool {
        self.reply.is_closed()
    }

    fn reschedule(mut self: Box<Self>) {
        self.ended = true;
        let (queue, inputs) = match self.again.take() {
            Some((queue, inputs)) => (Some(queue), inputs),
            None => (None, Vec::new()),
        };
        let job = to_run_again(&self.reply, self.offset, self.len, inputs);
        requeue(queue.as_ref(), job.into_iter().collect());
    }
}

/// `reply`'s request (its items `offset..offset + len` in the batch that ran), with its
/// `inputs`, as a job to queue again, in its own priority level: the model asked for it to run
/// again (Triton's request rescheduling, for iterative sequences). Its timeout counted until
/// its first run only. None, the request failed, when it was split across batches; none, and
/// let go, when its client has gone.
fn to_run_again(reply: &Arc<Reply>, offset: usize, len: usize, inputs: Vec<Tensor>) -> Option<Job> {
    if reply.is_closed() {
        return None;
    }
    if offset != 0 || len != reply.items() {
        reply.fail(InferError::internal(
            "the model asked for a request to run again, but the request was split across \
             batches; send it with no more items than the model's max_batch_size",
        ));
        return None;
    }
    reply.runs_again();
    Some(Job {
        inputs,
        items: len,
        next: 0,
        level: reply.level(),
        deadline: None,
        reply: Arc::clone(reply),
    })
}

/// Queues `jobs` again, together (see [`to_run_again`]); each fails when the model's queue
/// has stopped.
fn requeue(queue: Option<&Arc<Shared>>, jobs: Vec<Job>) {
    if jobs.is_empty() {
        return;
    }
    let stopped = match queue {
        Some(queue) => queue.requeue(jobs).err(),
        None => Some(jobs),
    };
    for job in stopped.into_iter().flatten() {
        job.reply.fail(InferError::new(
            crate::ErrorKind::NotReady,
            "the model stopped before the request it asked to run again could run",
        ));
    }
}

impl Drop for ToClient {
    fn drop(&mut self) {
        if !self.ended {
            self.reply.fail(InferError::internal(
                "the model's stream for this request ended without its final response",
            ));
        }
    }
}
