//! Request traces, as Triton's trace extension gives them: for a sampled request, when each part
//! of its time in the server began and ended, written in Triton's JSON trace format once its
//! answer has been sent.
//!
//! **Settings.** `trace_level` (`OFF` or `TIMESTAMPS`), `trace_rate` (one request in that many
//! is traced), `trace_count` (traces still to take; -1: no limit) and `log_frequency` (write the
//! traces out every that many; 0: at shutdown) are the server's, set at start
//! ([`Tracer::from_config`], Triton's `--trace-config` words) and changed while it runs
//! ([`Tracer::update`]). A model may hold its own: its first change copies the server's
//! settings, and a cleared one follows the server's again. `trace_file` is set at start only,
//! as recent Triton releases do: a request that could name any path would let a client write
//! anywhere the server may.
//!
//! **Sampling.** A request is sampled when its answer is ready ([`Tracer::sample`]): each
//! request of a model counts toward the rate of whoever sets it (the model, or the server for
//! every model that does not), and a sampled one takes one from that count.
//!
//! **What a trace holds.** The protocol's receive and send (`HTTP_RECV_START` ..
//! `HTTP_SEND_END`, or `GRPC_WAITREAD_START` .. `GRPC_SEND_END`), and between them Triton's
//! request and compute points, placed at the instants the request's [`crate::stages`] are cut
//! at: `REQUEST_START` and `QUEUE_START` when it was queued, `COMPUTE_START` when a batch took
//! it, `COMPUTE_INPUT_END` when the backend call began (so Triton's *input* holds the batch's
//! assembly and its wait for an instance), `COMPUTE_OUTPUT_START` when the call returned,
//! `COMPUTE_END` when its outputs were sliced, and `REQUEST_END` when its task had them back.
//! Times are nanoseconds since the Unix epoch.
//!
//! **Pipelines** (and Triton's ensembles) are traced as Triton traces an ensemble: the
//! pipeline's trace holds the protocol's points and `REQUEST_START` .. `REQUEST_END` (its steps'
//! run, no queue or compute of its own), and each model step a trace of its own with the
//! request and compute points above and a `parent_id` naming the pipeline's trace (a step that
//! is a pipeline in turn, the same one level down). A pipeline's sampling decides for its
//! steps, which count toward no rate or count. Answers from the response cache and streamed
//! responses carry no account, and are not traced.
//!
//! **Requests a model sends** (Triton's BLS: `InferenceRequest(..., trace=request.trace())`
//! in a Python model's `execute`) are traced as a pipeline's steps are: while tracing is on
//! ([`Tracer::is_active`]), each request carries a place for the accounts of the calls made on
//! its behalf ([`sheaf_backend::TraceCalls`]), and when it is sampled, each call answered
//! before its own answer has a trace whose `parent_id` names its trace (a call's own calls,
//! the same one level down). A call made without the trace, or answered as a stream, is not
//! traced.
//!
//! **Where traces go.** With a file, `log_frequency` traces at a time to `FILE.0`, `FILE.1`, ...,
//! and the rest when the count runs out (to the next index) or the server stops (to `FILE`
//! itself when `log_frequency` is 0), each file a JSON array, written by a thread of its own.
//! Without a file, each trace is a log line of its own (target `sheaf::trace`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::InferError;

/// The protocol a traced request came by, which names its receive and send points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    /// Its receive start and end, and send start and end points.
    pub(crate) fn points(self) -> [&'static str; 4] {
        match self {
            Protocol::Http => [
                "HTTP_RECV_START",
                "HTTP_RECV_END",
                "HTTP_SEND_START",
                "HTTP_SEND_END",
            ],
            Protocol::Grpc => [
                "GRPC_WAITREAD_START",
                "GRPC_WAITREAD_END",
                "GRPC_SEND_START",
                "GRPC_SEND_END",
            ],
        }
    }
}

/// What is traced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Off,
    Timestamps,
}

impl Level {
    fn shown(self) -> &'static str {
        match self {
            Level::Off => "OFF",
            Level::Timestamps => "TIMESTAMPS",
        }
    }
}

/// The trace settings in force for the server, or for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub level: Level,
    /// One request in `rate` is traced.
    pub rate: u64,
    /// Traces still to take; -1: no limit.
    pub count: i64,
    /// Traces written out at a time; 0: when the server stops.
    pub log_frequency: u64,
}

impl Default for Settings {
    /// Triton's defaults: off, one in 1,000, no limit, written at shutdown.
    fn default() -> Settings {
        Settings {
            level: Level::Off,
            rate: 1000,
            count: -1,
            log_frequency: 0,
        }
    }
}

/// A change a settings request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The setting's new value (a list for `trace_level`, one value for the others).
    Set(Vec<String>),
    /// Back to the server's value (for a model), or to the value at start (for the server).
    Clear,
}

/// The settings' names, in the order they are shown.
pub const SETTINGS: [&str; 6] = [
    "trace_file",
    "trace_level",
    "trace_rate",
    "trace_count",
    "log_frequency",
    "trace_mode",
];

/// A model's own settings: each `None` follows the server's.
#[derive(Debug, Default, Clone)]
struct Own {
    level: Option<Level>,
    rate: Option<u64>,
    count: Option<i64>,
    log_frequency: Option<u64>,
    /// Its requests counted toward its own rate.
    seen: u64,
}

struct State {
    at_start: Settings,
    server: Settings,
    /// Requests counted toward the server's rate.
    seen: u64,
    models: HashMap<String, Own>,
    /// Traces not written yet (to a file).
    pending: Vec<[Value; 2]>,
    /// The next file's index.
    index: u64,
}

/// Traces held with no `log_frequency` before they are written out anyway, to bound memory.
const MOST_PENDING: usize = 100_000;

/// The server's trace settings, its sampling and its output (module docs).
pub struct Tracer {
    file: Option<PathBuf>,
    /// An instant and the same moment in nanoseconds since the Unix epoch.
    clock: (Instant, u64),
    state: Mutex<State>,
    /// Whether any level is on: when not, sampling costs one load.
    active: AtomicBool,
    next_id: AtomicU64,
    writer: Mutex<Option<Writer>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("file", &self.file).finish()
    }
}

impl Default for Tracer {
    /// Tracing off, no file.
    fn default() -> Tracer {
        Tracer::new(Settings::default(), None)
    }
}

impl Tracer {
    /// A tracer that starts with `settings`, writing to `file` (else to the log).
    pub fn new(settings: Settings, file: Option<PathBuf>) -> Tracer {
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let writer = file.as_ref().map(|_| Writer::start());
        Tracer {
            file,
            clock: (Instant::now(), unix_ns),
            active: AtomicBool::new(settings.level != Level::Off),
            state: Mutex::new(State {
                at_start: settings,
                server: settings,
                seen: 0,
                models: HashMap::new(),
                pending: Vec::new(),
                index: 0,
            }),
            next_id: AtomicU64::new(1),
            writer: Mutex::new(writer),
        }
    }

    /// A tracer from Triton's `--trace-config` words, each `SETTING=VALUE` (`level`, `rate`,
    /// `count`, `mode`) or `triton,SETTING=VALUE` (`file`, `log-frequency`).
    pub fn from_config(words: &[String]) -> Result<Tracer, String> {
        let mut settings = Settings::default();
        let mut file = None;
        let mut levels = Vec::new();
        for word in words {
            let (mode, setting) = match word.split_once(',') {
                Some((mode, setting)) => (Some(mode), setting),
                None => (None, word.as_str()),
            };
            let Some((key, value)) = setting.split_once('=') else {
                return Err(format!(
                    "--trace-config {word}: give SETTING=VALUE or triton,SETTING=VALUE"
                ));
            };
            let value = value.trim();
            let one = vec![value.to_string()];
            match (mode, key.trim()) {
                (Some(m), _) if m != "triton" => {
                    return Err(format!(
                        "--trace-config {word}: sheaf writes Triton's trace format only (mode \
                         triton), not '{m}'"
                    ))
                }
                (None, "mode") if value != "triton" => {
                    return Err(format!(
                        "--trace-config {word}: sheaf writes Triton's trace format only (mode \
                         triton)"
                    ))
                }
                (None, "mode") => {}
                (None, "level") => levels.push(value.to_string()),
                (None, "rate") => settings.rate = rate(&one).map_err(|e| e.message)?,
                (None, "count") => settings.count = count(&one).map_err(|e| e.message)?,
                (Some(_), "file") if !value.is_empty() => file = Some(PathBuf::from(value)),
                (Some(_), "log-frequency" | "log_frequency") => {
                    settings.log_frequency = log_frequency(&one).map_err(|e| e.message)?
                }
                _ => {
                    return Err(format!(
                        "--trace-config {word}: the settings are level, rate, count, mode, \
                         triton,file and triton,log-frequency"
                    ))
                }
            }
        }
        if !levels.is_empty() {
            settings.level = level(&levels).map_err(|e| e.message)?;
        }
        Ok(Tracer::new(settings, file))
    }

    /// The file traces are written to, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The settings in force for `model` (the server's without one).
    pub fn settings(&self, model: Option<&str>) -> Settings {
        let state = self.lock();
        let server = state.server;
        match model.and_then(|m| state.models.get(m)) {
            Some(own) => Settings {
                level: own.level.unwrap_or(server.level),
                rate: own.rate.unwrap_or(server.rate),
                count: own.count.unwrap_or(server.count),
                log_frequency: own.log_frequency.unwrap_or(server.log_frequency),
            },
            None => server,
        }
    }

    /// The settings in force for `model`, by name ([`SETTINGS`]), each as its values: the level
    /// a list, the others one value.
    pub fn shown(&self, model: Option<&str>) -> Vec<(&'static str, Vec<String>)> {
        let s = self.settings(model);
        let file = self
            .file
            .as_ref()
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        vec![
            ("trace_file", vec![file]),
            ("trace_level", vec![s.level.shown().to_string()]),
            ("trace_rate", vec![s.rate.to_string()]),
            ("trace_count", vec![s.count.to_string()]),
            ("log_frequency", vec![s.log_frequency.to_string()]),
            ("trace_mode", vec!["triton".to_string()]),
        ]
    }

    /// Changes the settings of `model` (the server's without one): all the changes, or none when
    /// one of them is refused (an unknown setting, a bad value, another file).
    pub fn update(
        &self,
        model: Option<&str>,
        changes: &[(String, Change)],
    ) -> Result<(), InferError> {
        // Read every change before any is made.
        let mut read = Vec::with_capacity(changes.len());
        for (name, change) in changes {
            let values = match change {
                Change::Clear => None,
                Change::Set(values) => Some(values),
            };
            let setting = match (name.as_str(), values) {
                ("trace_level", Some(v)) => Read::Level(Some(level(v)?)),
                ("trace_rate", Some(v)) => Read::Rate(Some(rate(v)?)),
                ("trace_count", Some(v)) => Read::Count(Some(count(v)?)),
                ("log_frequency", Some(v)) => Read::LogFrequency(Some(log_frequency(v)?)),
                ("trace_level", None) => Read::Level(None),
                ("trace_rate", None) => Read::Rate(None),
                ("trace_count", None) => Read::Count(None),
                ("log_frequency", None) => Read::LogFrequency(None),
                ("trace_file", v) => {
                    let now = self
                        .file
                        .as_ref()
                        .map(|f| f.display().to_string())
                        .unwrap_or_default();
                    match v.map(|v| v.as_slice()) {
                        None => Read::Nothing,
                        Some([same]) if *same == now => Read::Nothing,
                        _ => {
                            return Err(InferError::invalid(
                                "trace_file is set when the server starts (--trace-config \
                                 triton,file=PATH), not by a request",
                            ))
                        }
                    }
                }
                ("trace_mode", v) => match v.map(|v| v.as_slice()) {
                    None => Read::Nothing,
                    Some([mode]) if mode == "triton" => Read::Nothing,
                    _ => {
                        return Err(InferError::invalid(
                            "trace_mode: sheaf writes Triton's trace format only (triton)",
                        ))
                    }
                },
                (other, _) => {
                    return Err(InferError::invalid(format!(
                        "unknown trace setting '{}'; the settings are {}",
                        crate::clip(other),
                        SETTINGS.join(", ")
                    )))
                }
            };
            read.push(setting);
        }
        let mut state = self.lock();
        let state = &mut *state;
        match model {
            None => {
                let start = state.at_start;
                let s = &mut state.server;
                for setting in read {
                    match setting {
                        Read::Level(v) => s.level = v.unwrap_or(start.level),
                        Read::Rate(v) => s.rate = v.unwrap_or(start.rate),
                        Read::Count(v) => s.count = v.unwrap_or(start.count),
                        Read::LogFrequency(v) => s.log_frequency = v.unwrap_or(start.log_frequency),
                        Read::Nothing => {}
                    }
                }
            }
            Some(model) => {
                let server = state.server;
                // A model's first settings start as a copy of the server's.
                let own = state.models.entry(model.to_string()).or_insert(Own {
                    level: Some(server.level),
                    rate: Some(server.rate),
                    count: Some(server.count),
                    log_frequency: Some(server.log_frequency),
                    seen: 0,
                });
                for setting in read {
                    match setting {
                        Read::Level(v) => own.level = v,
                        Read::Rate(v) => own.rate = v,
                        Read::Count(v) => own.count = v,
                        Read::LogFrequency(v) => own.log_frequency = v,
                        Read::Nothing => {}
                    }
                }
            }
        }
        let active = state.server.level != Level::Off
            || state
                .models
                .values()
                .any(|own| own.level.is_some_and(|l| l != Level::Off));
        self.active.store(active, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the answer of this request to `model` is traced: its rate's turn, with traces
    /// left to take. The ticket goes with the request's receipt, which records the trace when
    /// the answer has been sent.
    pub fn sample(
        self: &Arc<Self>,
        model: &str,
        version: &str,
        request_id: Option<&str>,
        protocol: Protocol,
    ) -> Option<Ticket> {
        if !self.active.load(Ordering::Relaxed) {
            return None;
        }
        let mut state = self.lock();
        let State {
            server,
            seen,
            models,
            ..
        } = &mut *state;
        let mut own = models.get_mut(model);
        let level = own.as_ref().and_then(|o| o.level).unwrap_or(server.level);
        if level == Level::Off {
            return None;
        }
        let (rate, seen) = match own.as_mut() {
            Some(o) if o.rate.is_some() => (o.rate.unwrap_or(1), &mut o.seen),
            _ => (server.rate, seen),
        };
        *seen += 1;
        if *seen % rate.max(1) != 0 {
            return None;
        }
        let log_frequency = own
            .as_ref()
            .and_then(|o| o.log_frequency)
            .unwrap_or(server.log_frequency);
        let count = match own {
            Some(Own {
                count: Some(count), ..
            }) => count,
            _ => &mut server.count,
        };
        if *count == 0 {
            return None;
        }
        let last = *count > 0 && {
            *count -= 1;
            *count == 0
        };
        Some(Ticket {
            tracer: self.clone(),
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            model: model.to_string(),
            version: version.to_string(),
            request_id: request_id.filter(|id| !id.is_empty()).map(str::to_string),
            parent: None,
            protocol,
            log_frequency,
            last,
        })
    }

    /// Whether any request may be traced now: the server's level, or a model's own, is not
    /// `OFF`.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Writes the traces not written yet, and waits for the writer: at shutdown.
    pub fn finish(&self) {
        let Some(file) = &self.file else { return };
        let (path, pending) = {
            let mut state = self.lock();
            let pending = std::mem::take(&mut state.pending);
            // With log_frequency 0 and nothing written yet, every trace goes to the file itself
            // (an empty list when none was taken).
            let path = if state.server.log_frequency == 0 && state.index == 0 {
                Some(file.clone())
            } else if pending.is_empty() {
                None
            } else {
                Some(indexed(file, state.index))
            };
            state.index += 1;
            (path, pending)
        };
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = writer.take() {
            if let Some(path) = path {
                w.write(path, pending);
            }
            w.finish();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ns(&self, at: Instant) -> u64 {
        self.clock.1 + at.saturating_duration_since(self.clock.0).as_nanos() as u64
    }

    /// Keeps a finished trace: to the log without a file; else pending, written out when
    /// `log_frequency` of them are pending, or this was the count's last.
    fn keep(&self, trace: [Value; 2], log_frequency: u64, last: bool) {
        let Some(file) = &self.file else {
            let line = Value::Array(trace.to_vec()).to_string();
            tracing::info!(target: "sheaf::trace", "{line}");
            return;
        };
        let out = {
            let mut state = self.lock();
            state.pending.push(trace);
            let due = last
                || (log_frequency > 0 && state.pending.len() as u64 >= log_frequency)
                || state.pending.len() >= MOST_PENDING;
            if !due {
                return;
            }
            if log_frequency == 0 && !last {
                tracing::warn!(
                    traces = MOST_PENDING,
                    "trace: that many traces held with log_frequency 0; written out now"
                );
            }
            let path = indexed(file, state.index);
            state.index += 1;
            (path, std::mem::take(&mut state.pending))
        };
        if let Some(w) = self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            w.write(out.0, out.1);
        }
    }
}

/// One change, read.
enum Read {
    Level(Option<Level>),
    Rate(Option<u64>),
    Count(Option<i64>),
    LogFrequency(Option<u64>),
    Nothing,
}

fn indexed(file: &Path, index: u64) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(format!(".{index}"));
    PathBuf::from(name)
}

fn single<'v>(name: &str, values: &'v [String]) -> Result<&'v str, InferError> {
    match values {
        [one] => Ok(one.trim()),
        _ => Err(InferError::invalid(format!(
            "{name} takes one value, not {}",
            values.len()
        ))),
    }
}

fn level(values: &[String]) -> Result<Level, InferError> {
    let mut level = None;
    for value in values {
        let this = match value.trim().to_ascii_uppercase().as_str() {
            "OFF" => Level::Off,
            "TIMESTAMPS" => Level::Timestamps,
            "TENSORS" => {
                return Err(InferError::invalid(
                    "trace_level TENSORS is not supported: sheaf traces TIMESTAMPS",
                ))
            }
            _ => {
                return Err(InferError::invalid(format!(
                    "trace_level '{}' is neither OFF nor TIMESTAMPS",
                    crate::clip(value)
                )))
            }
        };
        level = Some(match level {
            Some(Level::Timestamps) => Level::Timestamps,
            _ => this,
        });
    }
    level.ok_or_else(|| InferError::invalid("trace_level: give OFF or TIMESTAMPS"))
}

fn rate(values: &[String]) -> Result<u64, InferError> {
    let value = single("trace_rate", values)?;
    match value.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(InferError::invalid(format!(
            "trace_rate must be a whole number of 1 or more, not '{}'",
            crate::clip(value)
        ))),
    }
}

fn count(values: &[String]) -> Result<i64, InferError> {
    let value = single("trace_count", values)?;
    match value.parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        _ => Err(InferError::invalid(format!(
            "trace_count must be -1 (no limit) or a whole number of 0 or more, not '{}'",
            crate::clip(value)
        ))),
    }
}

fn log_frequency(values: &[String]) -> Result<u64, InferError> {
    let value = single("log_frequency", values)?;
    value.parse::<u64>().map_err(|_| {
        InferError::invalid(format!(
            "log_frequency must be a whole number of 0 or more, not '{}'",
            crate::clip(value)
        ))
    })
}

/// A sampled request's trace, to be recorded when its answer has been sent.
#[derive(Clone)]
pub struct Ticket {
    tracer: Arc<Tracer>,
    id: u64,
    model: String,
    version: String,
    request_id: Option<String>,
    /// The trace of the pipeline this request is a step of.
    parent: Option<u64>,
    protocol: Protocol,
    log_frequency: u64,
    /// The last trace its count allowed: the traces pending are written out after it.
    last: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("model", &self.model)
            .finish()
    }
}

impl Ticket {
    /// The protocol the request came by.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The ticket of a model step of this request's pipeline, which `model` at `version`
    /// answered: a trace of its own, whose `parent_id` is this one's (as Triton traces the
    /// composing models of an ensemble). It counts toward no rate or count.
    pub(crate) fn child(&self, model: &str, version: &str) -> Ticket {
        Ticket {
            tracer: self.tracer.clone(),
            id: self.tracer.next_id.fetch_add(1, Ordering::Relaxed),
            model: model.to_string(),
            version: version.to_string(),
            request_id: self.request_id.clone(),
            parent: Some(self.id),
            protocol: self.protocol,
            log_frequency: self.log_frequency,
            last: false,
        }
    }

    /// Records the trace: its points, in the order they were passed.
    pub(crate) fn record(&self, points: &[(&'static str, Instant)]) {
        let tracer = &self.tracer;
        let version = match self.version.parse::<u64>() {
            Ok(n) => json!(n),
            Err(_) => json!(self.version),
        };
        let mut info = json!({ "id": self.id, "model_name": self.model, "model_version": version });
        if let Some(id) = &self.request_id {
            info["request_id"] = json!(id);
        }
        if let Some(parent) = self.parent {
            info["parent_id"] = json!(parent);
        }
        let timestamps: Vec<Value> = points
            .iter()
            .map(|(name, at)| json!({ "name": name, "ns": tracer.ns(*at) }))
            .collect();
        let times = json!({ "id": self.id, "timestamps": timestamps });
        tracer.keep([info, times], self.log_frequency, self.last);
    }
}

/// A file to write and the traces it holds.
type Job = (PathBuf, Vec<[Value; 2]>);

/// Writes trace files on a thread of its own, so that no request waits for the disk.
struct Writer {
    /// None when the thread could not start: then each file is written by its caller.
    thread: Option<(mpsc::Sender<Job>, std::thread::JoinHandle<()>)>,
}

impl Writer {
    fn start() -> Writer {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("sheaf-trace".into())
            .spawn(move || {
                for (path, traces) in rx {
                    write_file(&path, &traces);
                }
            });
        Writer {
            thread: thread.ok().map(|handle| (tx, handle)),
        }
    }

    fn write(&self, path: PathBuf, traces: Vec<[Value; 2]>) {
        match &self.thread {
            Some((tx, _)) => {
                let _ = tx.send((path, traces));
            }
            None => write_file(&path, &traces),
        }
    }

    fn finish(self) {
        if let Some((tx, handle)) = self.thread {
            drop(tx);
            let _ = handle.join();
        }
    }
}

/// Writes `traces` to `path` as one JSON array (each trace's two objects in turn).
fn write_file(path: &Path, traces: &[[Value; 2]]) {
    let all: Vec<&Value> = traces.iter().flatten().collect();
    let written = serde_json::to_vec(&all)
        .map_err(std::io::Error::other)
        .and_then(|body| std::fs::write(path, body));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "trace: cannot write the trace file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &str) -> Change {
        Change::Set(vec![v.to_string()])
    }

    fn change(name: &str, c: Change) -> Vec<(String, Change)> {
        vec![(name.to_string(), c)]
    }

    fn tracing_all() -> Arc<Tracer> {
        Arc::new(Tracer::new(
            Settings {
                level: Level::Timestamps,
                rate: 1,
                count: -1,
                log_frequency: 0,
            },
            None,
        ))
    }

    #[test]
    fn triton_s_start_up_words_are_read() {
        let words: Vec<String> = [
            "triton,file=/tmp/t.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "count=7",
            "mode=triton",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let t = Tracer::from_config(&words).unwrap();
        assert_eq!(t.file(), Some(Path::new("/tmp/t.json")));
        assert_eq!(
            t.settings(None),
            Settings {
                level: Level::Timestamps,
                rate: 100,
                count: 7,
                log_frequency: 50
            }
        );
        for bad in [
            "level=TENSORS",
            "rate=0",
            "count=-2",
            "mode=opentelemetry",
            "opentelemetry,url=x",
            "triton,colour=red",
            "level",
        ] {
            assert!(Tracer::from_config(&[bad.to_string()]).is_err(), "{bad}");
        }
        assert_eq!(
            Tracer::from_config(&[]).unwrap().settings(None),
            Settings::default()
        );
    }

    #[test]
    fn one_request_in_rate_is_sampled_until_the_count_runs_out() {
        let t = tracing_all();
        t.update(None, &change("trace_rate", set("3"))).unwrap();
        t.update(None, &change("trace_count", set("2"))).unwrap();
        let sampled: Vec<bool> = (0..9)
            .map(|_| t.sample("m", "1", None, Protocol::Http).is_some())
            .collect();
        // The 3rd and 6th; then the count is spent.
        assert_eq!(
            sampled,
            [false, false, true, false, false, true, false, false, false]
        );
        assert_eq!(t.settings(None).count, 0);
    }

    #[test]
    fn a_model_s_settings_start_as_the_server_s_and_clear_back_to_them() {
        let t = Arc::new(Tracer::default());
        assert!(t.sample("m", "1", None, Protocol::Http).is_none());
        t.update(Some("m"), &change("trace_level", set("TIMESTAMPS")))
            .unwrap();
        t.update(Some("m"), &change("trace_rate", set("1")))
            .unwrap();
        // Its own level and rate; the server's count and log frequency, copied.
        assert_eq!(
            t.settings(Some("m")),
            Settings {
                level: Level::Timestamps,
                rate: 1,
                count: -1,
                log_frequency: 0
            }
        );
        assert!(t.sample("m", "1", None, Protocol::Http).is_some());
        assert!(t.sample("other", "1", None, Protocol::Http).is_none());
        // Cleared, the level follows the server's again: off.
        t.update(Some("m"), &change("trace_level", Change::Clear))
            .unwrap();
        assert_eq!(t.settings(Some("m")).level, Level::Off);
        assert!(t.sample("m", "1", None, Protocol::Http).is_none());
        // The server's cleared setting goes back to its value at start.
        t.update(None, &change("trace_rate", set("9"))).unwrap();
        t.update(None, &change("trace_rate", Change::Clear))
            .unwrap();
        assert_eq!(t.settings(None).rate, 1000);
    }

    #[test]
    fn a_refused_change_changes_nothing() {
        let t = tracing_all();
        for (name, value) in [
            ("trace_level", "TENSORS"),
            ("trace_level", "LOUD"),
            ("trace_rate", "0"),
            ("trace_count", "-5"),
            ("log_frequency", "often"),
            ("trace_file", "/etc/passwd"),
            ("trace_mode", "opentelemetry"),
            ("trace_colour", "red"),
        ] {
            let both = vec![
                ("trace_rate".to_string(), set("5")),
                (name.to_string(), set(value)),
            ];
            let e = t.update(None, &both).unwrap_err();
            assert_eq!(e.kind, crate::ErrorKind::InvalidInput, "{name}");
            assert_eq!(t.settings(None).rate, 1, "{name}={value}");
        }
        // Two values where one is asked.
        let two = Change::Set(vec!["1".into(), "2".into()]);
        assert!(t.update(None, &change("trace_rate", two)).is_err());
        // The file named again, or the mode, is no change.
        t.update(None, &change("trace_file", set(""))).unwrap();
        t.update(None, &change("trace_mode", set("triton")))
            .unwrap();
    }

    #[test]
    fn traces_are_written_log_frequency_at_a_time_and_the_rest_at_the_end() {
        let dir = std::env::temp_dir().join(format!("sheaf-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("trace.json");
        let t = Arc::new(Tracer::new(
            Settings {
                level: Level::Timestamps,
                rate: 1,
                count: -1,
                log_frequency: 2,
            },
            Some(file.clone()),
        ));
        let t0 = Instant::now();
        for i in 0..5u64 {
            let ticket = t
                .sample("m", "1", Some(&format!("r{i}")), Protocol::Grpc)
                .unwrap();
            ticket.record(&[
                ("GRPC_WAITREAD_START", t0),
                ("GRPC_SEND_END", t0 + std::time::Duration::from_micros(5)),
            ]);
        }
        t.finish();
        let read = |p: PathBuf| -> Vec<Value> {
            serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
        };
        let first = read(indexed(&file, 0));
        assert_eq!(first.len(), 4, "two traces, two objects each");
        assert_eq!(first[0]["model_name"], "m");
        assert_eq!(first[0]["model_version"], 1);
        assert_eq!(first[0]["request_id"], "r0");
        assert_eq!(first[1]["id"], first[0]["id"]);
        let stamps = first[1]["timestamps"].as_array().unwrap();
        assert_eq!(stamps[0]["name"], "GRPC_WAITREAD_START");
        let ns = |i: usize| stamps[i]["ns"].as_u64().unwrap();
        assert_eq!(ns(1) - ns(0), 5_000);
        assert_eq!(read(indexed(&file, 1)).len(), 4);
        // The fifth, at shutdown, to the next index.
        let last = read(indexed(&file, 2));
        assert_eq!(last[0]["request_id"], "r4");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
