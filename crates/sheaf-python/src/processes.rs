//! One instance's model processes over time: the one serving, and a lost one started again at
//! once, by whoever sees it lost first (the batch it failed, or its reader thread, which sees
//! a process that ends while idle), so that an instance never waits for a request to notice
//! that it has no process. The instance's readiness ([`ReadyWatch`]) follows: down from the
//! loss until the new process has loaded.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use serde_json::Value;
use sheaf_backend::BackendError;

use crate::ready::ReadyWatch;
use crate::worker::{Launch, Worker};

/// A process being started again, as its thread will hand it over.
type Starting = JoinHandle<Result<Worker, BackendError>>;

/// The processes of one instance.
pub(crate) struct Processes {
    pub(crate) launch: Launch,
    /// Whether the instance can serve now: what readiness checks ask.
    pub(crate) watch: Arc<ReadyWatch>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Numbers the processes started, the latest last.
    started: u64,
    /// The number of the process that has loaded and serves, until it is lost.
    serving: Option<u64>,
    /// The process being started again after a loss, until the instance takes it.
    starting: Option<Starting>,
    /// The model is being dropped: its processes end and are not started again.
    ending: bool,
}

/// How a process tells its instance that it has been lost: the instance's processes, and the
/// process's number among them.
#[derive(Clone)]
pub(crate) struct Lifeline {
    processes: Weak<Processes>,
    number: u64,
}

impl Lifeline {
    /// The process is lost, and `why`; the first word of a process's loss starts another.
    pub(crate) fn lost(&self, why: &str) {
        if let Some(processes) = self.processes.upgrade() {
            processes.lost(self.number, why);
        }
    }
}

impl Processes {
    pub(crate) fn new(launch: Launch) -> Arc<Processes> {
        Arc::new(Processes {
            launch,
            watch: Arc::default(),
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a process and loads the model in it; returns it with what `init` answered.
    pub(crate) fn start(self: &Arc<Self>) -> Result<(Worker, Value), BackendError> {
        let number = {
            let mut state = self.lock();
            state.started += 1;
            state.started
        };
        let lifeline = Lifeline {
            processes: Arc::downgrade(self),
            number,
        };
        let (worker, loaded, line) = Worker::start(&self.launch, lifeline)?;
        let mut state = self.lock();
        if !state.ending {
            state.serving = Some(number);
            self.watch.up(line);
        }
        Ok((worker, loaded))
    }

    /// Process `number` is lost: unless it was already, or the model is ending, the instance
    /// is down and another process starts at once, on a thread of its own.
    fn lost(self: &Arc<Self>, number: u64, why: &str) {
        let mut state = self.lock();
        if state.ending || state.serving != Some(number) {
            return;
        }
        state.serving = None;
        self.watch.down(format!(
            "its Python process was lost ({}) and is being started again",
            first_line(why)
        ));
        let processes = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-restart", self.launch.instance))
            .spawn(move || {
                processes
                    .start()
                    .map(|(worker, _)| worker)
                    .inspect_err(|e| {
                        processes.watch.down(format!(
                            "its Python process could not be started again: {e}"
                        ))
                    })
            });
        match spawned {
            Ok(handle) => state.starting = Some(handle),
            Err(e) => {
                tracing::warn!(instance = %self.launch.instance, error = %e, "cannot start a restart thread; the next batch starts the process")
            }
        }
    }

    /// The process started again after a loss, once it is up (waiting for it), if one is
    /// being started.
    pub(crate) fn take_started(&self) -> Option<Result<Worker, BackendError>> {
        let starting = self.lock().starting.take()?;
        Some(
            starting
                .join()
                .unwrap_or_else(|_| Err(BackendError::Runtime("the restart panicked".into()))),
        )
    }

    /// Starts a process on this thread, for a batch that found none (one that could not be
    /// started again before); the instance is down while it fails.
    pub(crate) fn start_here(self: &Arc<Self>) -> Result<Worker, BackendError> {
        self.start().map(|(worker, _)| worker).inspect_err(|e| {
            self.watch.down(format!(
                "its Python process could not be started again: {e}"
            ))
        })
    }

    /// The model is being dropped: no process starts again from here on; the one still
    /// starting, if any, is waited for so that it ends with the model.
    pub(crate) fn end(&self) {
        let starting = {
            let mut state = self.lock();
            state.ending = true;
            state.starting.take()
        };
        if let Some(starting) = starting {
            let _ = starting.join();
        }
    }
}

/// The first line of `text`: a loss's message may carry the process's last words.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}
