//! Reading what a model process sends, by whichever thread needs it: the instance thread reads
//! for itself while it waits for a call's answer, so that the answer reaches it without the
//! wake-up of another thread; the reader thread reads the rest of the time (a streaming
//! model's responses after `execute`, the model's own requests from its threads, the end of a
//! process that dies while idle).
//!
//! Both route every message the same way ([`Reader::next`]): a streaming model's responses to
//! their requests, the model's own requests to the link thread, and answers to the caller. The
//! process's stdout is behind a lock that the reader holds only to read a message that is
//! there (it waits for one with `poll`, without the lock), and that the instance thread holds
//! for its whole wait. While a call waits, the reader thread stands aside.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ChildStdout;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::Value;

use super::link::Event;
use super::open::Open;
use crate::processes::Lifeline;
use crate::region::Region;

/// Largest message the process may send (tensor bytes travel in shared memory, not here).
const MAX_MESSAGE: usize = 64 << 20;

/// Where what the process says goes.
pub(super) struct Routes {
    /// Answers the reader thread read, to the instance thread.
    pub(super) answers: Sender<Result<Value, String>>,
    /// The model's own requests to the link thread.
    pub(super) events: Sender<Event>,
    /// Responses of a streaming model to their requests.
    pub(super) open: Arc<Open>,
    /// The output region, where those responses lie.
    pub(super) output: Region,
    /// Hears that the process has ended, even while no batch runs on it.
    pub(super) lifeline: Lifeline,
}

/// The process's stdout, and where its messages go.
pub(super) struct Reader {
    from: ChildStdout,
    routes: Routes,
}

impl Reader {
    /// Reads one message and routes it; an answer is returned to the reader. `Err`: the
    /// process's stdout ended, or it broke the protocol (why).
    fn next(&mut self) -> Result<Option<Value>, String> {
        let mut size = [0u8; 4];
        if self.from.read_exact(&mut size).is_err() {
            return Err("it stopped".into());
        }
        let size = u32::from_le_bytes(size) as usize;
        if size > MAX_MESSAGE {
            return Err(format!("it sent a message of {size} bytes"));
        }
        let mut body = vec![0u8; size];
        if let Err(e) = self.from.read_exact(&mut body) {
            return Err(format!("its message was cut short ({e})"));
        }
        let message: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("it sent a message that is not JSON ({e})"))?;
        let to = &mut self.routes;
        if let Some(partial) = message.get("partial") {
            to.open.partial(partial, &mut to.output);
        } else if let Some(last) = message.get("final") {
            let number = |key: &str| last.get(key).and_then(Value::as_u64);
            if let (Some(call), Some(index)) = (number("call"), number("request")) {
                to.open.end(call, index as usize, Ok(()));
            }
        } else if let Some(again) = message.get("rescheduled") {
            let number = |key: &str| again.get(key).and_then(Value::as_u64);
            if let (Some(call), Some(index)) = (number("call"), number("request")) {
                to.open.reschedule(call, index as usize);
            }
        } else if ["call", "manage", "next", "cancel"]
            .iter()
            .any(|k| message.get(k).is_some())
        {
            let _ = to.events.send(Event::Message(message));
        } else {
            return Ok(Some(message));
        }
        Ok(None)
    }

    /// The process is gone: the requests it was still streaming fail, another process starts,
    /// and a call waiting hears why.
    fn lost(&self, why: String) {
        let message = format!("the model's Python process was lost: {why}");
        self.routes.open.gone(&message);
        self.routes.lifeline.lost(&message);
        let _ = self.routes.answers.send(Err(why));
    }
}

/// Which thread reads the process's stdout.
pub(super) struct Turns {
    reader: Mutex<Reader>,
    /// The same pipe, to wait on without the lock.
    pipe: OwnedFd,
    /// Whether the instance thread is waiting for an answer, reading for itself.
    calling: Mutex<bool>,
    /// Told when a call has its answer.
    called: Condvar,
}

/// What a call's wait for its answer came to.
pub(super) enum Waited {
    /// The answer, or why none can come.
    Answer(Result<Value, String>),
    /// None within the time it had.
    TimedOut,
}

impl Turns {
    pub(super) fn new(from: ChildStdout, routes: Routes) -> std::io::Result<Arc<Turns>> {
        let pipe = from.as_fd().try_clone_to_owned()?;
        Ok(Arc::new(Turns {
            reader: Mutex::new(Reader { from, routes }),
            pipe,
            calling: Mutex::new(false),
            called: Condvar::new(),
        }))
    }

    fn reader(&self) -> MutexGuard<'_, Reader> {
        self.reader.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn calling(&self) -> MutexGuard<'_, bool> {
        self.calling.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the process has something to read (or has closed its end) within `wait`
    /// (`None`: however long it takes).
    fn readable(&self, wait: Option<Duration>) -> bool {
        let timeout = match wait {
            None => PollTimeout::NONE,
            // Rounded up to the millisecond poll counts in.
            Some(w) => {
                PollTimeout::try_from(w.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [PollFd::new(self.pipe.as_fd(), PollFlags::POLLIN)];
        loop {
            match poll(&mut fds, timeout) {
                Ok(n) => return n > 0,
                Err(Errno::EINTR) => continue,
                // The pipe cannot be waited on: reading it says why.
                Err(_) => return true,
            }
        }
    }

    /// A call begins: the reader thread stands aside until it has its answer.
    pub(super) fn begin_call(&self) {
        *self.calling() = true;
    }

    /// Waits up to `timeout` for the call's answer, reading the process's messages and routing
    /// those that are not it. The call has ended when this returns.
    pub(super) fn answer(
        &self,
        answers: &Receiver<Result<Value, String>>,
        timeout: Option<Duration>,
    ) -> Waited {
        let waited = self.wait_for_answer(answers, timeout);
        self.end_call();
        waited
    }

    /// The call has ended (with its answer, or without one to wait for): the reader thread
    /// reads again.
    pub(super) fn end_call(&self) {
        *self.calling() = false;
        self.called.notify_all();
    }

    fn wait_for_answer(
        &self,
        answers: &Receiver<Result<Value, String>>,
        timeout: Option<Duration>,
    ) -> Waited {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut reader = self.reader();
        loop {
            // The reader thread may have read it before this call took the pipe.
            match answers.try_recv() {
                Ok(answer) => return Waited::Answer(answer),
                Err(TryRecvError::Disconnected) => return Waited::Answer(Err("it stopped".into())),
                Err(TryRecvError::Empty) => {}
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Waited::TimedOut;
            }
            if !self.readable(left) {
                continue;
            }
            match reader.next() {
                Ok(Some(answer)) => return Waited::Answer(Ok(answer)),
                Ok(None) => {}
                Err(why) => return Waited::Answer(Err(why)),
            }
        }
    }

    /// The reader thread: reads the process's messages while no call waits for its answer,
    /// until its stdout closes; then says so, failing the requests it was still streaming,
    /// and another process starts at once.
    pub(super) fn read_messages(self: Arc<Self>) {
        loop {
            {
                let mut calling = self.calling();
                while *calling {
                    calling = self.called.wait(calling).unwrap_or_else(|e| e.into_inner());
                }
            }
            if !self.readable(None) {
                continue;
            }
            let mut reader = self.reader();
            // A call that began meanwhile reads for itself; one that ended has read its part.
            if *self.calling() || !self.readable(Some(Duration::ZERO)) {
                continue;
            }
            match reader.next() {
                Ok(Some(answer)) => {
                    let _ = reader.routes.answers.send(Ok(answer));
                }
                Ok(None) => {}
                Err(why) => return reader.lost(why),
            }
        }
    }
}
