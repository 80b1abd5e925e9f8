//! The order of a sequence's requests on one stream. A client may send every frame of a
//! sequence back to back on a `ModelStreamInfer` stream; the stream serves its requests at once,
//! so nothing else would keep frame 2 from reaching the model (or, through a gateway, the worker
//! that holds the sequence) before frame 1. Each request of a sequence therefore starts once the
//! stream's previous request of the same sequence (same model, version and id) is answered;
//! requests of other sequences, and requests of none, still run beside it.

use std::collections::HashMap;
use std::future::Future;

use sheaf_core::SequenceId;
use tokio::sync::oneshot;

use super::{convert, pb};

/// Past this many sequences seen on one stream, those whose last request is answered are
/// forgotten (a sequence that idles out never sends its end).
const PRUNE_AT: usize = 1024;

/// The last request of each sequence seen on one stream.
#[derive(Default)]
pub struct SequenceOrder {
    last: HashMap<(String, String, SequenceId), oneshot::Receiver<()>>,
}

impl SequenceOrder {
    /// The turn of `request`: a request of a sequence waits for the stream's previous request
    /// of the same sequence to be answered; a request of none (or one whose flags are
    /// malformed: it is refused with the reason when served) waits for nothing. Taken in the
    /// order the requests came.
    pub fn turn(&mut self, request: &pb::ModelInferRequest) -> Turn {
        let Ok(Some(flags)) = convert::sequence_of(request) else {
            return Turn(None);
        };
        let key = (
            request.model_name.clone(),
            request.model_version.clone(),
            flags.id.clone(),
        );
        let previous = self.last.remove(&key);
        let (done, next) = oneshot::channel();
        if !flags.end {
            if self.last.len() >= PRUNE_AT {
                self.last.retain(|_, r| r.try_recv().is_err_and(is_pending));
            }
            self.last.insert(key, next);
        }
        Turn(Some((previous, done)))
    }
}

/// When one request of a stream may start (see [`SequenceOrder::turn`]).
pub struct Turn(Option<(Option<oneshot::Receiver<()>>, oneshot::Sender<()>)>);

impl Turn {
    /// Runs `serve` once the turn has come, and passes the turn on when it is done (or
    /// dropped).
    pub async fn serve<F: Future>(self, serve: F) -> F::Output {
        let Some((previous, done)) = self.0 else {
            return serve.await;
        };
        if let Some(previous) = previous {
            // Answered or dropped: either way, the turn has passed.
            let _ = previous.await;
        }
        let answer = serve.await;
        let _ = done.send(());
        answer
    }
}

fn is_pending(e: oneshot::error::TryRecvError) -> bool {
    matches!(e, oneshot::error::TryRecvError::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn frame(id: u64, start: bool, end: bool) -> pb::ModelInferRequest {
        use pb::infer_parameter::ParameterChoice;
        let p = |c| pb::InferParameter {
            parameter_choice: Some(c),
        };
        pb::ModelInferRequest {
            model_name: "m".into(),
            parameters: [
                (
                    "sequence_id".to_string(),
                    p(ParameterChoice::Int64Param(id as i64)),
                ),
                (
                    "sequence_start".to_string(),
                    p(ParameterChoice::BoolParam(start)),
                ),
                (
                    "sequence_end".to_string(),
                    p(ParameterChoice::BoolParam(end)),
                ),
            ]
            .into(),
            ..Default::default()
        }
    }

    /// A request that records when it starts and ends, and takes `ms` in between.
    fn served(
        log: &Arc<Mutex<Vec<String>>>,
        name: &str,
        ms: u64,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (log, name) = (log.clone(), name.to_string());
        async move {
            log.lock().unwrap().push(format!("{name}+"));
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            log.lock().unwrap().push(format!("{name}-"));
        }
    }

    #[tokio::test]
    async fn a_sequence_waits_for_its_previous_request_and_others_do_not() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut order = SequenceOrder::default();
        // The first frame is slow; the second of the same sequence must not start before it
        // ends, while another sequence's frame and a plain request run at once.
        let a0 = order
            .turn(&frame(1, true, false))
            .serve(served(&log, "a0", 60));
        let a1 = order
            .turn(&frame(1, false, true))
            .serve(served(&log, "a1", 1));
        let b0 = order
            .turn(&frame(2, true, false))
            .serve(served(&log, "b0", 1));
        let plain = order
            .turn(&pb::ModelInferRequest::default())
            .serve(served(&log, "p", 1));
        // Started last first: only the order they were given counts.
        let tasks = [
            tokio::spawn(a1),
            tokio::spawn(plain),
            tokio::spawn(b0),
            tokio::spawn(a0),
        ];
        for t in tasks {
            t.await.unwrap();
        }
        let log = log.lock().unwrap().clone();
        let at = |s: &str| log.iter().position(|l| l == s).unwrap();
        assert!(at("a0-") < at("a1+"), "{log:?}");
        assert!(at("b0-") < at("a0-"), "{log:?}");
        assert!(at("p-") < at("a0-"), "{log:?}");
        // The end forgets the sequence; sequence 2 is still open.
        assert_eq!(order.last.len(), 1);
    }

    #[tokio::test]
    async fn a_dropped_request_passes_its_turn_on() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut order = SequenceOrder::default();
        let first = order
            .turn(&frame(7, true, false))
            .serve(served(&log, "x0", 1));
        let second = order
            .turn(&frame(7, false, false))
            .serve(served(&log, "x1", 1));
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(5), second)
            .await
            .unwrap();
        assert_eq!(*log.lock().unwrap(), ["x1+", "x1-"]);
    }
}
