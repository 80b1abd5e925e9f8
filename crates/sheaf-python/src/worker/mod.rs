//! One model process: started, spoken to, watched, restarted and ended.
//!
//! Messages are a 4-byte little-endian length, then JSON, over the child's stdin and stdout
//! (the runner moves the model's own prints to stderr, which a thread puts into the server's
//! log line by line, keeping the last few to say why a process that ended did: [`tail`]).
//! Three threads of the server serve each process:
//! - the instance thread sends it a batch (`execute`, `infer`) and waits for the answer with a
//!   timeout, reading what the process sends meanwhile itself ([`reader`]): past the timeout,
//!   the process is killed;
//! - a reader thread reads what the process sends the rest of the time; both route it the
//!   same way: each response of a streaming model straight to its request ([`open`]), and the
//!   requests the model sends of its own to the link thread;
//! - the link thread ([`link`]) answers the model's own requests (Triton's BLS,
//!   `InferenceRequest.exec()`, and its model loading API), during a batch or after it, and
//!   watches the clients of streaming requests.
//!
//! The instance and link threads write to the process's stdin one whole message at a time.

mod link;
mod open;
mod reader;
mod tail;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sheaf_backend::{BackendError, Callback, CustomMetrics, ResponseStream, Signature};

use crate::metrics::MetricsLink;
use crate::processes::Lifeline;
use crate::ready::Line;
use crate::region::Region;
use crate::traced::Traced;
use link::{Event, Link};
use open::{Control, Open, CONTROL_SIZE};
use reader::{Routes, Turns, Waited};
use tail::Tail;

/// Longest `finalize` may take when the model is dropped before the process is killed.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a process whose stdout closed may take to exit by itself before it is killed, and
/// its stderr to end after: what it says as it goes is kept for the error. An interpreter's
/// teardown after its pipes close took 0.6 s while some thirty others were starting on two
/// cores; one that exits sooner is not waited for.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// The process's stdin, written one whole message at a time by whichever thread holds it.
pub(crate) type Pipe = Arc<Mutex<ChildStdin>>;

/// Writes one message (its length, then its JSON) to the process.
pub(crate) fn write_message(pipe: &Pipe, message: &impl Serialize) -> std::io::Result<()> {
    let body = serde_json::to_string(message)?;
    let mut stdin = pipe.lock().unwrap_or_else(|e| e.into_inner());
    stdin.write_all(&(body.len() as u32).to_le_bytes())?;
    stdin.write_all(body.as_bytes())?;
    stdin.flush()
}

/// How to start the process again.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) interpreter: PathBuf,
    /// The model's own environment, whose `bin` and `lib` the process finds first.
    pub(crate) environment: Option<crate::environment::Environment>,
    pub(crate) model_file: PathBuf,
    pub(crate) runner_dir: PathBuf,
    /// The `init` message.
    pub(crate) init: Value,
    pub(crate) timeout: Option<Duration>,
    /// Names the process in logs.
    pub(crate) instance: String,
    /// The server, for the model's own requests (BLS).
    pub(crate) callback: Callback,
    /// Where the metrics the model defines are kept.
    pub(crate) metrics: CustomMetrics,
}

/// A running model process with its shared memory, as its instance thread holds it.
pub(crate) struct Worker {
    child: Arc<Mutex<Child>>,
    pid: u32,
    pipe: Pipe,
    /// Answers the reader thread read (or why none can come).
    answers: Receiver<Result<Value, String>>,
    /// Who reads the process's stdout.
    turns: Arc<Turns>,
    /// The link thread's events.
    events: Sender<Event>,
    /// The requests of a streaming model still answering.
    open: Arc<Open>,
    pub(crate) input: Region,
    pub(crate) output: Region,
    timeout: Option<Duration>,
    instance: String,
    /// The last lines the process wrote to stderr.
    tail: Arc<Tail>,
    /// The socket of the model's metrics; ends with the process.
    metrics: MetricsLink,
    /// Says when this process is lost, so that another starts.
    lifeline: Lifeline,
    /// The numbers of the requests of its batches that may be traced.
    pub(crate) traced: Traced,
}

/// Why a call failed.
pub(crate) enum Failure {
    /// The model's code raised (the process is fine): its message.
    Raised(String),
    /// The process died, hung or broke the protocol; it has been killed.
    Lost(String),
}

impl Failure {
    pub(crate) fn into_backend(self) -> BackendError {
        match self {
            Failure::Raised(m) | Failure::Lost(m) => BackendError::Runtime(m),
        }
    }
}

impl Worker {
    /// Starts the process and loads the model in it; returns the worker, what `init`
    /// answered, and the line to the model's `is_ready()` where it has one. A model that
    /// fails to import or initialise is a load error carrying the Python message. `lifeline`
    /// hears when the process is lost once it serves.
    pub(crate) fn start(
        launch: &Launch,
        lifeline: Lifeline,
    ) -> Result<(Worker, Value, Option<Line>), BackendError> {
        let input = Region::create("in")?;
        let output = Region::create("out")?;
        let calls = Region::create("calls")?;
        let calls_path = calls.path().to_path_buf();
        let control_region = Region::create("control")?;
        let control = Control::new(control_region.map_raw(CONTROL_SIZE)?);
        let metrics = MetricsLink::open(launch.metrics.clone(), &launch.instance)?;
        let ready_path = crate::region::shared_path("ready");
        let model_dir = launch.model_file.parent().unwrap_or(Path::new("."));
        let mut path = std::env::join_paths([launch.runner_dir.as_path(), model_dir])
            .map_err(|e| BackendError::Load(e.to_string()))?;
        if let Some(more) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            let mut joined = path;
            joined.push(":");
            joined.push(more);
            path = joined;
        }
        let mut command = Command::new(&launch.interpreter);
        for (name, value) in launch.environment.iter().flat_map(|e| e.variables()) {
            command.env(name, value);
        }
        let mut child = command
            .arg("-u")
            .arg(launch.runner_dir.join("sheaf_runner.py"))
            .arg(&launch.model_file)
            .arg(input.path())
            .arg(output.path())
            .arg(calls.path())
            .arg(control_region.path())
            .arg(metrics.path())
            .arg(&ready_path)
            .env("PYTHONPATH", path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(model_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                BackendError::Load(format!(
                    "cannot start the Python interpreter {}: {e} (set `python:` in the model's \
                     config, or --python, to an interpreter with numpy installed)",
                    launch.interpreter.display()
                ))
            })?;
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => {
                    let _ = child.kill();
                    return Err(BackendError::Load("the Python process has no pipes".into()));
                }
            };
        let pid = child.id();
        let child = Arc::new(Mutex::new(child));
        let pipe: Pipe = Arc::new(Mutex::new(stdin));
        let open = Arc::new(Open::new(control));
        let (to_instance, answers) = std::sync::mpsc::channel();
        let (events, to_link) = std::sync::mpsc::channel();
        let traced = Traced::default();
        let link = Link {
            pipe: pipe.clone(),
            calls,
            stream: None,
            streams_begun: 0,
            callback: launch.callback.clone(),
            events: events.clone(),
            open: open.clone(),
            child: child.clone(),
            timeout: launch.timeout,
            instance: launch.instance.clone(),
            traced: traced.clone(),
        };
        let routes = Routes {
            answers: to_instance,
            events: events.clone(),
            open: open.clone(),
            output: output.share()?,
            lifeline: lifeline.clone(),
        };
        let turns = Turns::new(stdout, routes)
            .map_err(|e| BackendError::Load(format!("cannot wait on the process's pipe: {e}")))?;
        let instance = launch.instance.clone();
        let tail = Arc::new(Tail::default());
        let kept = tail.clone();
        let reading = turns.clone();
        let started = std::thread::Builder::new()
            .name(format!("{}-py", launch.instance))
            .spawn(move || reading.read_messages())
            .and_then(|_| {
                std::thread::Builder::new()
                    .name(format!("{}-log", launch.instance))
                    .spawn(move || log_lines(stderr, &instance, &kept))
            })
            .and_then(|_| {
                std::thread::Builder::new()
                    .name(format!("{}-link", launch.instance))
                    .spawn(move || link.run(to_link))
            });
        let mut worker = Worker {
            child,
            pid,
            pipe,
            answers,
            turns,
            events,
            open,
            input,
            output,
            timeout: launch.timeout,
            instance: launch.instance.clone(),
            tail,
            metrics,
            lifeline: lifeline.clone(),
            traced,
        };
        if let Err(e) = started {
            return Err(BackendError::Load(format!("cannot start a thread: {e}")));
        }
        // Importing a model may take long (PyTorch, a pipeline's weights): no timeout here, not
        // even the model's execution timeout, which bounds `execute`.
        let loaded = worker.call(&launch.init, Some(None)).map_err(|f| {
            BackendError::Load(match f {
                Failure::Raised(m) => format!("{}: {m}", launch.model_file.display()),
                Failure::Lost(m) => format!("{}: {m}", launch.model_file.display()),
            })
        })?;
        // The process has mapped every region: their names can go.
        worker.input.unlink();
        worker.output.unlink();
        control_region.unlink();
        worker.metrics.unlink();
        let _ = std::fs::remove_file(&calls_path);
        // A model with an `is_ready()` of its own listens for the server's questions.
        let line = match loaded.get("is_ready").and_then(Value::as_bool) {
            Some(true) => Some(Line::connect(&ready_path).map_err(|e| {
                BackendError::Load(format!(
                    "cannot connect to the model's is_ready() at {}: {e}",
                    ready_path.display()
                ))
            })?),
            _ => None,
        };
        tracing::debug!(instance = %worker.instance, pid, "Python model process ready");
        Ok((worker, loaded, line))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `message` and waits for the answer (up to `timeout`, else the worker's own).
    pub(crate) fn call(
        &mut self,
        message: &impl Serialize,
        timeout: Option<Option<Duration>>,
    ) -> Result<Value, Failure> {
        let timeout = timeout.unwrap_or(self.timeout);
        self.turns.begin_call();
        if let Err(e) = write_message(&self.pipe, message) {
            self.turns.end_call();
            return Err(self.lost(format!("cannot write to it ({e})"), true));
        }
        match self.turns.answer(&self.answers, timeout) {
            Waited::Answer(Ok(mut v)) => match v.get_mut("ok").map(Value::take) {
                Some(ok) => Ok(ok),
                None => Err(Failure::Raised(
                    v.get("error")
                        .and_then(Value::as_str)
                        .unwrap_or("the model failed without a message")
                        .to_string(),
                )),
            },
            Waited::Answer(Err(why)) => Err(self.lost(why, true)),
            Waited::TimedOut => Err(self.lost(
                format!(
                    "it ran past the model's execution timeout ({} ms)",
                    timeout.map_or(0, |t| t.as_millis())
                ),
                false,
            )),
        }
    }

    /// Opens a call of a streaming model: its requests' `streams` take the responses the
    /// process sends for them until each one's final flag, during `execute` and after it.
    /// Returns the call's number and each request's cancellation flag slot.
    pub(crate) fn open_streams(
        &self,
        streams: Vec<Box<dyn ResponseStream>>,
        signature: Arc<Signature>,
    ) -> Result<(u64, Vec<Option<usize>>), BackendError> {
        let opened = self.open.begin(streams, signature, self.timeout)?;
        let _ = self.events.send(Event::Look);
        Ok(opened)
    }

    /// Streaming call `call`'s `execute` has returned: its requests that still stream go on
    /// alone.
    pub(crate) fn returned(&self, call: u64) {
        self.open.returned(call);
    }

    /// Ends every request of streaming call `call` with `error`: its `execute` failed.
    pub(crate) fn fail_streams(&self, call: u64, error: &BackendError) {
        self.open.fail_call(call, error);
    }

    /// Kills the process and says why, with how it ended and the last lines it wrote to
    /// stderr; the requests it was still streaming fail with the same message. `exiting`: it
    /// closed its end, so it is given [`EXIT_GRACE`] to end by itself and say how.
    fn lost(&mut self, why: String, exiting: bool) -> Failure {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if exiting {
            let until = std::time::Instant::now() + EXIT_GRACE;
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = child.kill();
        let status = child.wait().map(|s| format!("; {s}")).unwrap_or_default();
        drop(child);
        let words = self
            .tail
            .last_words(EXIT_GRACE)
            .map(|w| format!("; the last it wrote to stderr:\n{w}"))
            .unwrap_or_default();
        let message = format!(
            "the model's Python process (pid {}) was lost: {why}{status}{words}",
            self.pid
        );
        tracing::error!(instance = %self.instance, "{message}");
        self.lifeline.lost(&message);
        self.open.gone(&message);
        Failure::Lost(message)
    }

    /// The process's resident memory, in bytes.
    pub(crate) fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    /// GPU memory the process holds, in bytes, as the driver reports it (`nvidia-smi`); none
    /// where there is no NVIDIA driver.
    pub(crate) fn gpu_bytes(&self) -> Option<u64> {
        let out = Command::new("nvidia-smi")
            .args([
                "--query-compute-apps=pid,used_memory",
                "--format=csv,noheader,nounits",
            ])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        gpu_bytes_of(&String::from_utf8_lossy(&out.stdout), self.pid)
    }

    /// Whether the process is still running, and has not been given up (killed as hung, or
    /// found gone by its reader).
    pub(crate) fn alive(&mut self) -> bool {
        if self.open.is_gone() {
            return false;
        }
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        matches!(child.try_wait(), Ok(None))
    }
}

impl Drop for Worker {
    /// Calls the model's `finalize` (its threads may still finish the requests they stream
    /// meanwhile), then ends the process; requests still streaming then fail.
    fn drop(&mut self) {
        if self.alive() {
            let finalize = serde_json::json!({ "op": "finalize" });
            if let Err(Failure::Raised(m)) = self.call(&finalize, Some(Some(FINALIZE_TIMEOUT))) {
                tracing::warn!(instance = %self.instance, error = %m, "finalize failed");
            }
        }
        self.open
            .gone("the model was unloaded before it sent this request's final response");
        {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.events.send(Event::Stop);
    }
}

/// The MiB `nvidia-smi` lists for `pid` (one line per process and GPU: `pid, MiB`), in bytes.
fn gpu_bytes_of(listing: &str, pid: u32) -> Option<u64> {
    let mib: u64 = listing
        .lines()
        .filter_map(|l| {
            let (p, m) = l.split_once(',')?;
            (p.trim().parse::<u32>().ok()? == pid).then(|| m.trim().parse::<u64>().ok())?
        })
        .sum();
    (mib > 0).then_some(mib << 20)
}

/// Puts what the model prints (its stdout and stderr) into the server's log, a line at a time,
/// so that a JSON log stays JSON, and keeps the last lines in `tail`. A line that `pb_utils.Logger` wrote (marked [`LOG_MARK`],
/// then its level and a space) is logged at that level; any other at info.
fn log_lines(from: impl Read, instance: &str, tail: &Tail) {
    use std::io::BufRead;
    const TARGET: &str = "sheaf_python::model_output";
    for line in std::io::BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        let (level, text) = logged_level(&line);
        tail.push(text);
        match level {
            tracing::Level::ERROR => tracing::error!(target: TARGET, instance, "{text}"),
            tracing::Level::WARN => tracing::warn!(target: TARGET, instance, "{text}"),
            tracing::Level::DEBUG => tracing::debug!(target: TARGET, instance, "{text}"),
            _ => tracing::info!(target: TARGET, instance, "{text}"),
        }
    }
    tail.end();
}

/// What starts a line `pb_utils.Logger` wrote: a character no message prints.
const LOG_MARK: char = '\u{1e}';

/// The level a line of the model's output is logged at, and its text.
fn logged_level(line: &str) -> (tracing::Level, &str) {
    let Some(marked) = line.strip_prefix(LOG_MARK) else {
        return (tracing::Level::INFO, line);
    };
    let (level, text) = marked.split_once(' ').unwrap_or((marked, ""));
    let level = match level {
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "verbose" => tracing::Level::DEBUG,
        _ => tracing::Level::INFO,
    };
    (level, text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_the_logger_wrote_keeps_its_level() {
        use tracing::Level;
        assert_eq!(
            super::logged_level("\u{1e}warn low memory"),
            (Level::WARN, "low memory")
        );
        assert_eq!(
            super::logged_level("\u{1e}error x y"),
            (Level::ERROR, "x y")
        );
        assert_eq!(super::logged_level("\u{1e}verbose "), (Level::DEBUG, ""));
        assert_eq!(
            super::logged_level("\u{1e}info done"),
            (Level::INFO, "done")
        );
        // A print is logged as it is, at info.
        assert_eq!(
            super::logged_level("warn: not marked"),
            (Level::INFO, "warn: not marked")
        );
    }

    #[test]
    fn a_process_gpu_memory_is_summed_over_its_gpus() {
        let listing = "4242, 1024\n77, 300\n4242, 512\n";
        assert_eq!(super::gpu_bytes_of(listing, 4242), Some(1536 << 20));
        assert_eq!(super::gpu_bytes_of(listing, 5), None);
        assert_eq!(super::gpu_bytes_of("", 77), None);
    }
}
