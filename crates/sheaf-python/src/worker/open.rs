//! The requests a streaming (decoupled) model is still answering, which may outlive the
//! `execute` call that brought them: as in Triton, once `execute` returns the instance takes its
//! next batch, and the model's own threads go on sending responses for the earlier ones.
//!
//! Each call gets a number, and each of its requests a slot in the control region. Each response
//! comes as `{"partial": {"call", "request", "outputs", "span", "final", "parameters"}}` (or
//! with `"error"` and Triton's `"code"`), its tensors written into the output region, and a
//! final flag sent alone as `{"final": {"call", "request"}}`. The process writes the responses
//! one after another around the output region as a ring; the server adds each response's `span`
//! (its bytes, with any bytes skipped to wrap to the start) to the counter at the start of the
//! control region once it has copied it out, and the process writes only over bytes counted
//! there. The byte at `FLAGS_AT + slot` is set once that request's client has gone, and the
//! runner's `is_cancelled()` reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use serde_json::Value;
use sheaf_backend::{Answer, BackendError, ResponseStream, Signature};

use crate::answers::{read_answer, response_error};
use crate::region::Region;

/// Where the cancellation flags start in the control region (the counter comes first).
pub(crate) const FLAGS_AT: usize = 64;

/// Bytes of the control region: the counter, then a flag for each request that may be open at
/// once in one process (more stay open without a flag: they cannot be told they are cancelled).
pub(crate) const CONTROL_SIZE: usize = FLAGS_AT + (64 << 10);

/// The control region, mapped so that the threads of the server that read responses and watch
/// clients may write it at once.
pub(crate) struct Control {
    map: MmapRaw,
}

impl Control {
    pub(crate) fn new(map: MmapRaw) -> Control {
        Control { map }
    }

    fn slots(&self) -> usize {
        self.map.len().saturating_sub(FLAGS_AT)
    }

    /// Counts `bytes` more of the output region as read.
    fn consumed(&self, bytes: u64) {
        // SAFETY: the map is at least CONTROL_SIZE bytes, page-aligned, and lives as long as
        // `self`; the counter at offset 0 is only ever accessed atomically on this side.
        let counter = unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().cast::<u64>()) };
        counter.fetch_add(bytes, Ordering::Release);
    }

    fn set_flag(&self, slot: usize, value: u8) {
        if slot < self.slots() {
            // SAFETY: in bounds (checked above); bytes are accessed atomically on this side.
            let flag = unsafe { AtomicU8::from_ptr(self.map.as_mut_ptr().add(FLAGS_AT + slot)) };
            flag.store(value, Ordering::Release);
        }
    }
}

/// One request still streaming.
struct Request {
    stream: Box<dyn ResponseStream>,
    slot: Option<usize>,
    /// Whether its flag has been raised.
    raised: bool,
    /// Past this with no response, the model hangs: the call's start, then each response, plus
    /// the model's execution timeout.
    deadline: Option<Instant>,
}

/// One call's requests still streaming.
struct Call {
    signature: Arc<Signature>,
    requests: Vec<Option<Request>>,
    /// The model's execution timeout: the longest a request may go without a response, and
    /// `execute` without a response from any of its requests.
    timeout: Option<Duration>,
    /// Whether `execute` has yet to return.
    executing: bool,
    /// While it runs, past this `execute` hangs: its start, then each response of the call,
    /// plus the timeout.
    deadline: Option<Instant>,
}

#[derive(Default)]
struct State {
    calls: HashMap<u64, Call>,
    calls_begun: u64,
    free_slots: Vec<usize>,
    slots_used: usize,
    /// Set once the process is gone: why, for the requests that come after.
    gone: Option<String>,
}

/// What the server's threads share of one process's open streams.
pub(crate) struct Open {
    state: Mutex<State>,
    control: Control,
}

/// What a look at the open streams found.
pub(crate) struct Looked {
    /// Whether any call is still open (its `execute` runs, or a request streams).
    pub(crate) open: bool,
    /// A request has gone the model's execution timeout without a response: the process
    /// hangs.
    pub(crate) overdue: bool,
}

impl Open {
    pub(crate) fn new(control: Control) -> Open {
        Open {
            state: Mutex::new(State::default()),
            control,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a call of `streams`, one per request, and returns its number and each request's
    /// flag slot; once the process is gone, ends them with the reason instead.
    pub(crate) fn begin(
        &self,
        streams: Vec<Box<dyn ResponseStream>>,
        signature: Arc<Signature>,
        timeout: Option<Duration>,
    ) -> Result<(u64, Vec<Option<usize>>), BackendError> {
        let mut state = self.lock();
        if let Some(why) = state.gone.clone() {
            drop(state);
            let error = BackendError::Runtime(why);
            streams.into_iter().for_each(|s| s.end(Err(error.clone())));
            return Err(error);
        }
        state.calls_begun += 1;
        let call = state.calls_begun;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut slots = Vec::with_capacity(streams.len());
        let mut requests = Vec::with_capacity(streams.len());
        for stream in streams {
            let slot = state.free_slots.pop().or_else(|| {
                (state.slots_used < self.control.slots()).then(|| {
                    state.slots_used += 1;
                    state.slots_used - 1
                })
            });
            if let Some(s) = slot {
                self.control.set_flag(s, 0);
            }
            slots.push(slot);
            requests.push(Some(Request {
                stream,
                slot,
                raised: false,
                deadline,
            }));
        }
        state.calls.insert(
            call,
            Call {
                signature,
                requests,
                timeout,
                executing: true,
                deadline,
            },
        );
        Ok((call, slots))
    }

    /// A response the process sent (`{"partial": ...}`): copied out of `output`, counted as
    /// read, and handed to its request's stream; the stream ends with it when it is final.
    pub(crate) fn partial(&self, partial: &Value, output: &mut Region) {
        let number = |key: &str| partial.get(key).and_then(Value::as_u64);
        let (Some(call), Some(index)) = (number("call"), number("request")) else {
            return;
        };
        let index = index as usize;
        let signature = self.lock().calls.get(&call).map(|c| c.signature.clone());
        let response = match (partial.get("error"), signature) {
            (Some(_), _) => Some(Err(response_error(partial))),
            (None, Some(signature)) => Some(
                output
                    .follow()
                    .and_then(|()| read_answer(output.bytes(), partial, &signature)),
            ),
            // A call that has ended (it failed): what its threads still send is dropped.
            (None, None) => None,
        };
        self.control.consumed(number("span").unwrap_or(0));
        if let Some(response) = response {
            self.part(call, index, response);
        }
        if partial.get("final").and_then(Value::as_bool) == Some(true) {
            self.end(call, index, Ok(()));
        }
    }

    fn part(&self, call: u64, index: usize, response: Result<Answer, BackendError>) {
        let mut state = self.lock();
        let Some(entry) = state.calls.get_mut(&call) else {
            return;
        };
        let deadline = entry.timeout.map(|t| Instant::now() + t);
        entry.deadline = deadline;
        if let Some(Some(request)) = entry.requests.get_mut(index) {
            request.deadline = deadline;
            request.stream.part(response);
        }
    }

    /// Ends request `index` of `call` (its final flag came, or it failed).
    pub(crate) fn end(&self, call: u64, index: usize, result: Result<(), BackendError>) {
        if let Some(request) = self.take(call, index) {
            request.stream.end(result);
        }
    }

    /// The model asked for request `index` of `call` to run again in a later batch: its
    /// stream here ends without ending the request, which the server queues again.
    pub(crate) fn reschedule(&self, call: u64, index: usize) {
        if let Some(request) = self.take(call, index) {
            request.stream.reschedule();
        }
    }

    /// Takes request `index` of `call` out of those streaming, freeing its slot.
    fn take(&self, call: u64, index: usize) -> Option<Request> {
        let mut state = self.lock();
        let entry = state.calls.get_mut(&call)?;
        let ended = entry.requests.get_mut(index).and_then(Option::take);
        entry.deadline = entry.timeout.map(|t| Instant::now() + t);
        if !entry.executing && entry.requests.iter().all(Option::is_none) {
            state.calls.remove(&call);
        }
        if let Some(slot) = ended.as_ref().and_then(|r| r.slot) {
            state.free_slots.push(slot);
        }
        ended
    }

    /// `execute` has returned for `call`: its requests that still stream go on alone.
    pub(crate) fn returned(&self, call: u64) {
        let mut state = self.lock();
        if let Some(entry) = state.calls.get_mut(&call) {
            entry.executing = false;
            if entry.requests.iter().all(Option::is_none) {
                state.calls.remove(&call);
            }
        }
    }

    /// Ends every request of `call` still streaming with `error` (its `execute` failed).
    pub(crate) fn fail_call(&self, call: u64, error: &BackendError) {
        let ended = {
            let mut state = self.lock();
            let Some(entry) = state.calls.remove(&call) else {
                return;
            };
            let ended: Vec<Request> = entry.requests.into_iter().flatten().collect();
            state.free_slots.extend(ended.iter().filter_map(|r| r.slot));
            ended
        };
        for request in ended {
            request.stream.end(Err(error.clone()));
        }
    }

    /// The process is gone (`why`, unless a reason was given first): every request still
    /// streaming fails with the reason, and so does any call after.
    pub(crate) fn gone(&self, why: &str) {
        let (why, ended) = {
            let mut state = self.lock();
            let why = state.gone.get_or_insert_with(|| why.to_string()).clone();
            let calls = std::mem::take(&mut state.calls);
            (why, calls)
        };
        let error = BackendError::Runtime(why);
        for request in ended.into_values().flat_map(|c| c.requests).flatten() {
            request.stream.end(Err(error.clone()));
        }
    }

    /// Whether the process is gone (or has been given up).
    pub(crate) fn is_gone(&self) -> bool {
        self.lock().gone.is_some()
    }

    /// Raises the flag of each request whose client has gone, and says whether any call is
    /// still open and whether a request, or a running `execute`, has gone the execution timeout
    /// without a response.
    pub(crate) fn look(&self) -> Looked {
        let mut state = self.lock();
        let now = Instant::now();
        let mut overdue = false;
        for call in state.calls.values_mut() {
            overdue |= call.executing && call.deadline.is_some_and(|d| now >= d);
            for request in call.requests.iter_mut().flatten() {
                overdue |= request.deadline.is_some_and(|d| now >= d);
                if !request.raised && request.stream.is_cancelled() {
                    request.raised = true;
                    if let Some(slot) = request.slot {
                        self.control.set_flag(slot, 1);
                    }
                }
            }
        }
        Looked {
            open: !state.calls.is_empty(),
            overdue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_backend::{DataType, TensorSpec};
    use std::sync::atomic::AtomicBool;

    /// What a stream got, in words.
    type Log = Arc<Mutex<Vec<String>>>;

    /// A stream that writes down what it gets, and says it is cancelled when told to.
    struct Noted {
        log: Log,
        cancelled: Arc<AtomicBool>,
    }

    impl ResponseStream for Noted {
        fn part(&mut self, response: Result<Answer, BackendError>) {
            let what = match response {
                Ok(a) => format!("part {:?}", a.outputs[0].data().to_vec()),
                Err(e) => format!("error {e}"),
            };
            self.log.lock().unwrap().push(what);
        }

        fn end(self: Box<Self>, result: Result<(), BackendError>) {
            let what = match result {
                Ok(()) => "end".to_string(),
                Err(e) => format!("failed {e}"),
            };
            self.log.lock().unwrap().push(what);
        }

        fn is_cancelled(&self) -> bool {
            self.cancelled.load(Ordering::Relaxed)
        }
    }

    fn control() -> (Region, Open) {
        let region = Region::create("control-test").unwrap();
        let open = Open::new(Control::new(region.map_raw(CONTROL_SIZE).unwrap()));
        (region, open)
    }

    fn signature() -> Arc<Signature> {
        Arc::new(Signature {
            inputs: vec![],
            outputs: vec![TensorSpec {
                name: "y".into(),
                dtype: DataType::U8,
                shape: vec![-1],
            }],
        })
    }

    fn noted() -> (Box<dyn ResponseStream>, Log, Arc<AtomicBool>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(AtomicBool::new(false));
        let stream = Box::new(Noted {
            log: log.clone(),
            cancelled: cancelled.clone(),
        });
        (stream, log, cancelled)
    }

    fn read(region: &Region, at: usize) -> u64 {
        let bytes = std::fs::read(region.path()).unwrap();
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(word)
    }

    #[test]
    fn responses_reach_their_stream_are_counted_as_read_and_the_final_one_ends_it() {
        let (control, open) = control();
        let mut output = Region::create("out-test").unwrap();
        output.reserve(256).unwrap();
        output.bytes_mut()[64..67].copy_from_slice(&[7, 8, 9]);
        let (a, log_a, _) = noted();
        let (b, log_b, _) = noted();
        let (call, slots) = open.begin(vec![a, b], signature(), None).unwrap();
        assert_eq!(slots, [Some(0), Some(1)]);
        let placed = serde_json::json!({"call": call, "request": 1, "span": 128, "outputs": [
            {"name": "y", "datatype": "UINT8", "shape": [3], "offset": 64, "nbytes": 3}]});
        open.partial(&placed, &mut output);
        assert_eq!(*log_b.lock().unwrap(), ["part [7, 8, 9]"]);
        assert_eq!(read(&control, 0), 128);
        let mut last = placed.clone();
        last["final"] = serde_json::json!(true);
        open.partial(&last, &mut output);
        assert_eq!(read(&control, 0), 256);
        assert_eq!(log_b.lock().unwrap().last().unwrap(), "end");
        // Request 0 still streams; a response of a call that has ended is counted, not passed on.
        assert!(open.look().open);
        open.end(call, 0, Ok(()));
        assert_eq!(*log_a.lock().unwrap(), ["end"]);
        // The call is open until its `execute` returns.
        assert!(open.look().open);
        open.returned(call);
        assert!(!open.look().open);
        open.partial(&placed, &mut output);
        assert_eq!(read(&control, 0), 384);
        assert_eq!(log_b.lock().unwrap().len(), 3);
        // Their slots are free for the next call.
        let (c, _, _) = noted();
        let (_, slots) = open.begin(vec![c], signature(), None).unwrap();
        assert!(slots[0].is_some_and(|s| s < 2), "{slots:?}");
    }

    #[test]
    fn a_client_that_goes_raises_its_flag_and_an_overdue_stream_is_seen() {
        let (control, open) = control();
        let (a, _, cancelled) = noted();
        let (b, _, _) = noted();
        let (_, slots) = open
            .begin(vec![a, b], signature(), Some(Duration::ZERO))
            .unwrap();
        let flag =
            |slot: Option<usize>| std::fs::read(control.path()).unwrap()[FLAGS_AT + slot.unwrap()];
        assert_eq!((flag(slots[0]), flag(slots[1])), (0, 0));
        cancelled.store(true, Ordering::Relaxed);
        let looked = open.look();
        assert!(looked.open && looked.overdue);
        assert_eq!((flag(slots[0]), flag(slots[1])), (1, 0));
    }

    #[test]
    fn a_process_gone_fails_its_open_streams_and_every_later_call() {
        let (_control, open) = control();
        let (a, log_a, _) = noted();
        let (call, _) = open.begin(vec![a], signature(), None).unwrap();
        let (b, log_b, _) = noted();
        let (other, _) = open.begin(vec![b], signature(), None).unwrap();
        open.fail_call(call, &BackendError::Runtime("execute raised".into()));
        assert_eq!(
            *log_a.lock().unwrap(),
            ["failed inference failed: execute raised"]
        );
        open.gone("it stopped");
        open.gone("a later reason");
        assert!(open.is_gone());
        assert_eq!(
            *log_b.lock().unwrap(),
            ["failed inference failed: it stopped"]
        );
        let (c, log_c, _) = noted();
        assert!(open.begin(vec![c], signature(), None).is_err());
        assert_eq!(
            *log_c.lock().unwrap(),
            ["failed inference failed: it stopped"]
        );
        let _ = other;
    }
}
