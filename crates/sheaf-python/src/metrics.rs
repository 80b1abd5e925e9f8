//! A model process's line to the metrics it defines (Triton's `pb_utils.MetricFamily`): a Unix
//! socket of its own, apart from the request protocol on the pipes, so that the model may
//! count from any thread at any time.
//!
//! The process connects once, as it starts; the path goes as soon as the connection is taken,
//! or once the process has answered its first call, whichever comes first.
//! Each message is one line of JSON with an `op`. `declare` (a family), `series` (a family's
//! metric with its labels and, for a histogram, its buckets) and `value` are answered with
//! `{"ok": ...}` or `{"error": "..."}`; `increment`, `set` and `observe` are not (the runner
//! checks them first; one that fails here is logged), so counting costs one write. Numbers
//! travel as text, so that `inf` and `nan` do too. When the connection closes (the process
//! ended), the families it declared are released ([`CustomMetrics::release`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use sheaf_backend::custom_metrics::{Labels, MetricKind, Update};
use sheaf_backend::{BackendError, CustomMetrics};

/// Longest line the process may send.
const MAX_LINE: u64 = 1 << 20;

/// The socket one process's metrics come through, served by a thread of its own.
pub(crate) struct MetricsLink {
    path: PathBuf,
    taken: Arc<AtomicBool>,
}

impl MetricsLink {
    /// Listens for the process that `instance` names, which will count into `store`.
    pub(crate) fn open(store: CustomMetrics, instance: &str) -> Result<MetricsLink, BackendError> {
        let path = crate::region::shared_path("metrics");
        let listener = UnixListener::bind(&path).map_err(|e| {
            BackendError::Load(format!(
                "cannot listen for the model's metrics on {}: {e}",
                path.display()
            ))
        })?;
        let taken = Arc::new(AtomicBool::new(false));
        let (flag, at, name) = (taken.clone(), path.clone(), instance.to_string());
        std::thread::Builder::new()
            .name(format!("{instance}-metrics"))
            .spawn(move || {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                flag.store(true, Ordering::SeqCst);
                let _ = std::fs::remove_file(&at);
                drop(listener);
                serve(stream, &store, &name);
            })
            .map_err(|e| BackendError::Load(format!("cannot start a metrics thread: {e}")))?;
        Ok(MetricsLink { path, taken })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the socket's name away once the process has connected (it does before it
    /// answers its first call): the connection stays, waiting for the thread to take it if it
    /// has not yet.
    pub(crate) fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for MetricsLink {
    /// A process that never connected leaves the thread waiting: a connection of our own,
    /// closed at once, lets it end.
    fn drop(&mut self) {
        if !self.taken.load(Ordering::SeqCst) {
            drop(UnixStream::connect(&self.path));
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Answers one connection until it closes, then releases what it declared.
fn serve(stream: UnixStream, store: &CustomMetrics, instance: &str) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut declared = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with('\n') => {
                tracing::warn!(instance, "a metrics message over 1 MiB: the line is closed");
                break;
            }
            Ok(_) => {}
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(message) => handle(&message, store, &mut declared, instance),
            Err(e) => Some(Err(format!("not JSON: {e}"))),
        };
        if let Some(a) = answer {
            let body = match a {
                Ok(v) => json!({ "ok": v }),
                Err(e) => json!({ "error": e }),
            };
            if writeln!(writer, "{body}").is_err() {
                break;
            }
        }
    }
    for name in declared {
        store.release(&name);
    }
}

/// What `message` does to `store`; the answer, for the operations that have one. An error of
/// an unanswered operation is logged here.
fn handle(
    message: &Value,
    store: &CustomMetrics,
    declared: &mut Vec<String>,
    instance: &str,
) -> Option<Result<Value, String>> {
    let text = |key: &str| message.get(key).and_then(Value::as_str).unwrap_or_default();
    let family = text("family");
    let op = text("op");
    match op {
        "declare" => {
            let name = text("name");
            let answer = MetricKind::parse(text("kind"))
                .ok_or_else(|| format!("unknown metric kind {:?}", text("kind")))
                .and_then(|kind| store.declare(name, text("description"), kind));
            if answer.is_ok() {
                declared.push(name.to_string());
            }
            Some(answer.map(|()| Value::Null))
        }
        "series" => {
            let buckets = match message.get("buckets") {
                Some(Value::Array(b)) => match b.iter().map(number).collect::<Option<Vec<_>>>() {
                    Some(b) => Some(b),
                    None => return Some(Err("a bucket is not a number".into())),
                },
                _ => None,
            };
            Some(
                labels(message)
                    .and_then(|l| store.series(family, l, buckets))
                    .map(|()| Value::Null),
            )
        }
        "value" => Some(
            labels(message)
                .and_then(|l| store.value(family, l))
                .map(|v| json!(v.to_string())),
        ),
        "increment" | "set" | "observe" => {
            let changed = message
                .get("value")
                .and_then(number)
                .ok_or_else(|| "the value is not a number".to_string())
                .and_then(|v| {
                    let update = match op {
                        "increment" => Update::Increment(v),
                        "set" => Update::Set(v),
                        _ => Update::Observe(v),
                    };
                    labels(message).and_then(|l| store.update(family, l, update))
                });
            if let Err(error) = changed {
                tracing::warn!(instance, family, op, %error, "a metric change was refused");
            }
            None
        }
        other => Some(Err(format!("unknown metrics operation {other:?}"))),
    }
}

/// A number sent as text (`"1.5"`, `"inf"`) or as a JSON number.
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => s.parse().ok(),
        v => v.as_f64(),
    }
}

/// The message's `labels` object, each value a string.
fn labels(message: &Value) -> Result<Labels, String> {
    match message.get("labels") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(format!("label '{k}' is not a string")),
            })
            .collect(),
        Some(_) => Err("labels must be an object of strings".into()),
    }
}
