//! One model process: started, spoken to, watched, restarted and ended.
//!
//! Messages are a 4-byte little-endian length, then JSON, over the child's stdin and stdout
//! (the runner moves the model's own prints to stderr, which a thread puts into the server's
//! log line by line). A thread per process reads the child's messages into a channel, so that
//! the instance thread can wait for an answer with a timeout: past it, the process is killed.
//!
//! While the instance thread waits, the model may send requests of its own (Triton's BLS,
//! `InferenceRequest.exec()`), which [`calls`] runs through the server. The responses of a
//! streaming model it calls come back on the same channel as the process's messages, so the
//! thread handles both in the order they come.

mod calls;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use serde_json::Value;
use sheaf_backend::{BackendError, Callback, Called, CustomMetrics, DataType, Tensor};

use crate::metrics::MetricsLink;

use crate::region::Region;

/// Longest `finalize` may take when the model is dropped before the process is killed.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest message the process may send (tensor bytes travel in shared memory, not here).
const MAX_MESSAGE: usize = 64 << 20;

/// How to start the process again.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) interpreter: PathBuf,
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

/// What the instance thread waits for.
pub(crate) enum Incoming {
    /// A message of the process, or why no more can be read.
    Message(Result<Value, String>),
    /// A response (`Some`) or the end (`None`) of the stream the model asked for, numbered.
    Streamed(u64, Option<Result<Called, String>>),
}

/// A running model process with its shared memory.
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<Incoming>,
    /// Where a stream the model asked for sends its responses: the same channel as `answers`.
    incoming: Sender<Incoming>,
    /// The stream the model is reading, if any.
    stream: Option<calls::OpenStream>,
    /// How many streams the model has asked for, to number them.
    streams_begun: u64,
    pub(crate) input: Region,
    pub(crate) output: Region,
    /// The model's own requests and their answers (BLS).
    calls: Region,
    callback: Callback,
    timeout: Option<Duration>,
    instance: String,
    /// The socket of the model's metrics; ends with the process.
    _metrics: MetricsLink,
}

/// How often a call whose requests' clients may go looks whether they have.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// The requests of a call whose clients may go (a streaming model's): how to ask whether
/// request `i`'s has, and where their flags lie in the input region (a byte each, set to 1
/// once it has; the runner's `is_cancelled()` reads it).
pub(crate) struct Watch<'a> {
    pub(crate) asks: &'a dyn Fn(usize) -> bool,
    pub(crate) at: usize,
    pub(crate) count: usize,
}

impl Watch<'_> {
    /// Raises the flag of each request whose client has gone since the last look.
    fn raise(&self, raised: &mut [bool], region: &mut [u8]) {
        for (i, done) in raised.iter_mut().enumerate() {
            if !*done && (self.asks)(i) {
                if let Some(flag) = region.get_mut(self.at + i) {
                    *flag = 1;
                }
                *done = true;
            }
        }
    }
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
    /// Starts the process and loads the model in it; returns the worker and what `init`
    /// answered. A model that fails to import or initialise is a load error carrying the
    /// Python message.
    pub(crate) fn start(launch: &Launch) -> Result<(Worker, Value), BackendError> {
        let input = Region::create("in")?;
        let output = Region::create("out")?;
        let calls = Region::create("calls")?;
        let metrics = MetricsLink::open(launch.metrics.clone(), &launch.instance)?;
        let model_dir = launch.model_file.parent().unwrap_or(Path::new("."));
        let mut path = std::env::join_paths([launch.runner_dir.as_path(), model_dir])
            .map_err(|e| BackendError::Load(e.to_string()))?;
        if let Some(more) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            let mut joined = path;
            joined.push(":");
            joined.push(more);
            path = joined;
        }
        let mut child = Command::new(&launch.interpreter)
            .arg("-u")
            .arg(launch.runner_dir.join("sheaf_runner.py"))
            .arg(&launch.model_file)
            .arg(input.path())
            .arg(output.path())
            .arg(calls.path())
            .arg(metrics.path())
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
        let (incoming, answers) = std::sync::mpsc::channel();
        let tx = incoming.clone();
        let reader = std::thread::Builder::new()
            .name(format!("{}-py", launch.instance))
            .spawn(move || read_messages(stdout, tx));
        let instance = launch.instance.clone();
        let logger = std::thread::Builder::new()
            .name(format!("{}-log", launch.instance))
            .spawn(move || log_lines(stderr, &instance));
        if let Err(e) = reader.and(logger) {
            let _ = child.kill();
            return Err(BackendError::Load(format!(
                "cannot start a reader thread: {e}"
            )));
        }
        let mut worker = Worker {
            child,
            stdin,
            answers,
            incoming,
            stream: None,
            streams_begun: 0,
            input,
            output,
            calls,
            callback: launch.callback.clone(),
            timeout: launch.timeout,
            instance: launch.instance.clone(),
            _metrics: metrics,
        };
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
        worker.calls.unlink();
        tracing::debug!(instance = %worker.instance, pid = worker.child.id(), "Python model process ready");
        Ok((worker, loaded))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `message` and waits for the answer (up to `timeout`, else the worker's own).
    pub(crate) fn call(
        &mut self,
        message: &Value,
        timeout: Option<Option<Duration>>,
    ) -> Result<Value, Failure> {
        self.call_streaming(message, timeout, &mut |_, _| {}, None)
    }

    /// As [`Worker::call`], handing each response a streaming model sends before the answer
    /// (`{"partial": ...}`) to `on_partial`, with the output region it lies in, and, with
    /// `watch`, raising each request's flag once its client has gone. The timeout bounds the
    /// whole call.
    pub(crate) fn call_streaming(
        &mut self,
        message: &Value,
        timeout: Option<Option<Duration>>,
        on_partial: &mut dyn FnMut(&Value, &[u8]),
        watch: Option<Watch<'_>>,
    ) -> Result<Value, Failure> {
        let timeout = timeout.unwrap_or(self.timeout);
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        self.send(message)?;
        let answer = self.wait(deadline, timeout, on_partial, watch);
        // A stream the model left open ends with its call: what it still sends is dropped.
        self.stream = None;
        answer
    }

    /// Waits for the answer to the message just sent, handling what comes before it.
    fn wait(
        &mut self,
        deadline: Option<std::time::Instant>,
        timeout: Option<Duration>,
        on_partial: &mut dyn FnMut(&Value, &[u8]),
        mut watch: Option<Watch<'_>>,
    ) -> Result<Value, Failure> {
        let mut raised = vec![false; watch.as_ref().map_or(0, |w| w.count)];
        loop {
            if let Some(w) = watch.as_mut() {
                w.raise(&mut raised, self.input.bytes_mut());
            }
            let now = std::time::Instant::now();
            // While clients may go, the wait wakes now and then to look.
            let wake = watch.as_ref().map(|_| now + CANCEL_POLL);
            let until = match (deadline, wake) {
                (Some(d), Some(w)) => Some(d.min(w)),
                (d, w) => d.or(w),
            };
            let incoming = match until {
                Some(u) => self.answers.recv_timeout(u.saturating_duration_since(now)),
                None => self
                    .answers
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
            };
            let answer = match incoming {
                Ok(Incoming::Streamed(id, response)) => {
                    self.streamed(id, response)?;
                    continue;
                }
                Ok(Incoming::Message(message)) => message,
                Err(RecvTimeoutError::Timeout)
                    if deadline.is_none_or(|d| std::time::Instant::now() < d) =>
                {
                    continue
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.lost(format!(
                        "it ran past the model's execution timeout ({} ms)",
                        timeout.map_or(0, |t| t.as_millis())
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => return Err(self.lost("it stopped".into())),
            };
            return match answer {
                Ok(v) if v.get("call").is_some() => {
                    if let Some(answer) = self.answer_call(&v["call"]) {
                        self.send(&answer)?;
                    }
                    continue;
                }
                Ok(v) if v.get("manage").is_some() => {
                    let answer = self.answer_manage(&v["manage"]);
                    self.send(&answer)?;
                    continue;
                }
                Ok(v) if v.get("next").is_some() => {
                    self.stream_taken()?;
                    continue;
                }
                Ok(v) if v.get("partial").is_some() => {
                    if let Err(e) = self.output.follow() {
                        return Err(self.lost(e.to_string()));
                    }
                    on_partial(&v["partial"], self.output.bytes());
                    continue;
                }
                Ok(mut v) => match v.get_mut("ok").map(Value::take) {
                    Some(ok) => Ok(ok),
                    None => Err(Failure::Raised(
                        v.get("error")
                            .and_then(Value::as_str)
                            .unwrap_or("the model failed without a message")
                            .to_string(),
                    )),
                },
                Err(e) => Err(self.lost(e)),
            };
        }
    }

    /// Writes one message to the process.
    fn send(&mut self, message: &Value) -> Result<(), Failure> {
        let body = message.to_string();
        let sent = self
            .stdin
            .write_all(&(body.len() as u32).to_le_bytes())
            .and_then(|_| self.stdin.write_all(body.as_bytes()))
            .and_then(|_| self.stdin.flush());
        sent.map_err(|e| self.lost(format!("cannot write to it ({e})")))
    }

    /// Kills the process and says why, with how it ended.
    fn lost(&mut self, why: String) -> Failure {
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .map(|s| format!("; {s}"))
            .unwrap_or_default();
        let message = format!(
            "the model's Python process (pid {}) was lost: {why}{status}",
            self.child.id()
        );
        tracing::error!(instance = %self.instance, "{message}");
        Failure::Lost(message)
    }

    /// The process's resident memory, in bytes.
    pub(crate) fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
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
        gpu_bytes_of(&String::from_utf8_lossy(&out.stdout), self.child.id())
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Worker {
    /// Calls the model's `finalize`, then ends the process.
    fn drop(&mut self) {
        if self.alive() {
            let finalize = serde_json::json!({ "op": "finalize" });
            if let Err(Failure::Raised(m)) = self.call(&finalize, Some(Some(FINALIZE_TIMEOUT))) {
                tracing::warn!(instance = %self.instance, error = %m, "finalize failed");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where each tensor in a region starts: a multiple of this.
pub(crate) const ALIGN: usize = 64;

/// Tensors placed in a region (`{"name", "datatype", "shape", "offset", "nbytes"}` each),
/// copied out; `what` names them in errors ("output", "input").
pub(crate) fn read_placed(
    region: &[u8],
    placed: &[Value],
    what: &str,
) -> Result<Vec<(String, Tensor)>, String> {
    placed
        .iter()
        .map(|p| {
            let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
            let datatype = p.get("datatype").and_then(Value::as_str).unwrap_or_default();
            let dtype = DataType::parse_any(datatype)
                .ok_or_else(|| {
                    format!("{what} '{name}': the model returned {datatype}, not a tensor type sheaf serves")
                })?;
            let shape: Vec<usize> = p
                .get("shape")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
                .unwrap_or_default();
            let offset = p.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
            let nbytes = p.get("nbytes").and_then(Value::as_u64).unwrap_or(0) as usize;
            let bytes = offset
                .checked_add(nbytes)
                .and_then(|end| region.get(offset..end))
                .ok_or_else(|| format!("{what} '{name}' lies outside shared memory"))?;
            let tensor = Tensor::new(dtype, shape, bytes::Bytes::copy_from_slice(bytes))
                .map_err(|e| format!("{what} '{name}': {e}"))?;
            Ok((name.to_string(), tensor))
        })
        .collect()
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
/// so that a JSON log stays JSON. A line that `pb_utils.Logger` wrote (marked [`LOG_MARK`],
/// then its level and a space) is logged at that level; any other at info.
fn log_lines(from: impl Read, instance: &str) {
    use std::io::BufRead;
    const TARGET: &str = "sheaf_python::model_output";
    for line in std::io::BufReader::new(from).lines() {
        let Ok(line) = line else { return };
        let (level, text) = logged_level(&line);
        match level {
            tracing::Level::ERROR => tracing::error!(target: TARGET, instance, "{text}"),
            tracing::Level::WARN => tracing::warn!(target: TARGET, instance, "{text}"),
            tracing::Level::DEBUG => tracing::debug!(target: TARGET, instance, "{text}"),
            _ => tracing::info!(target: TARGET, instance, "{text}"),
        }
    }
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

/// Reads the child's messages until its stdout closes, then says so: the worker holds a
/// sender of the channel too, so the channel itself does not close.
fn read_messages(mut from: impl Read, to: Sender<Incoming>) {
    let lost = |why: String| {
        let _ = to.send(Incoming::Message(Err(why)));
    };
    loop {
        let mut size = [0u8; 4];
        if from.read_exact(&mut size).is_err() {
            return lost("it stopped".into());
        }
        let size = u32::from_le_bytes(size) as usize;
        if size > MAX_MESSAGE {
            return lost(format!("it sent a message of {size} bytes"));
        }
        let mut body = vec![0u8; size];
        if let Err(e) = from.read_exact(&mut body) {
            return lost(format!("its message was cut short ({e})"));
        }
        let message = serde_json::from_slice(&body)
            .map_err(|e| format!("it sent a message that is not JSON ({e})"));
        if to.send(Incoming::Message(message)).is_err() {
            return;
        }
    }
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
