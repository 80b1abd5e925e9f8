//! OpenAI's Batch API: `POST /v1/batches` runs an uploaded file of requests in the background,
//! `GET /v1/batches/{id}` follows it, `POST /v1/batches/{id}/cancel` stops it, and
//! `GET /v1/batches` lists them, newest first.
//!
//! A batch is `validating` while its file is read and checked whole ([`line::parse_all`]:
//! each line a POST to the batch's `endpoint`, `custom_id`s of their own); a file with faults
//! fails, listing them by line. Then it is `in_progress`: its requests go through the `/v1`
//! routes in process, as many at once as the first request's model runs together (a generation
//! model's `max_seqs`, a text encoder's `max_batch_size`), so a batch keeps the engine full
//! without filling its queue ahead of the server's other clients. Answers are written in input
//! order, those with a success status to the batch's output file and the others to its error
//! file, both files of the [`files`](super::files) store (purpose `batch_output`), listed once
//! the batch is `completed`. `request_counts` grows as answers come. A cancelled batch stops
//! sending requests, drops those in flight (their sequences are freed at the engine's next
//! step), and keeps the answers it has, as `cancelled`.
//!
//! Batches live as long as the server, or, with a folder given for the files (`--files-dir`),
//! in that folder: each batch's object is written there (`batch_N.json`) as it moves from one
//! status to the next, and, while it runs, five times a second with the answers written so far
//! (on the disk first: the object records how many bytes of each answer file hold them, and
//! is itself written whole and synced, so a power cut leaves an older object, never one that
//! counts answers the disk does not hold, nor an empty one). The
//! answers are written beside it (`batch_N_output.jsonl`, `batch_N_error.jsonl`) until the
//! batch ends, when they become files of the store. The next server on the folder reads the
//! objects back ([`BatchStore::open`]). One that had not ended goes on once the models are
//! loaded ([`resume`]): from the first request whose answer was not kept, its answer files cut
//! back to what the object records; one whose answers are not all there starts over. One being
//! cancelled is `cancelled`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::Json;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::files::{FileStore, NewFile, BATCH, BATCH_OUTPUT};
use super::line::{self, Expect, LineError};
use crate::error::{bad, OpenAiError};
use crate::openai::body::{Body, BodyError};
use crate::openai::handlers::now_s;
use crate::AppState;

/// Most requests in one batch, as OpenAI's.
pub const MAX_REQUESTS: usize = 50_000;
/// Most faults a failed batch lists.
const MAX_FAULTS: usize = 100;
/// Most batches not yet finished; another is refused with 429.
pub const MAX_RUNNING: usize = 64;
/// Most batches kept; past it, the oldest finished one is let go.
const MAX_KEPT: usize = 10_000;
/// Requests in flight when the first request's model says nothing of its capacity.
const DEFAULT_IN_FLIGHT: usize = 8;
/// How often a running batch kept in a folder writes down the answers it has.
const KEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Status {
    #[default]
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Cancelling,
    Cancelled,
}

impl Status {
    const ALL: [Status; 7] = [
        Status::Validating,
        Status::Failed,
        Status::InProgress,
        Status::Finalizing,
        Status::Completed,
        Status::Cancelling,
        Status::Cancelled,
    ];

    fn named(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == name)
    }

    fn name(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }

    fn finished(self) -> bool {
        matches!(self, Status::Failed | Status::Completed | Status::Cancelled)
    }
}

/// When a batch entered each status (Unix seconds), as the Batch object names them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stamps {
    in_progress_at: Option<u64>,
    finalizing_at: Option<u64>,
    completed_at: Option<u64>,
    failed_at: Option<u64>,
    cancelling_at: Option<u64>,
    cancelled_at: Option<u64>,
}

impl Stamps {
    fn stamp(&mut self, status: Status, now: u64) {
        let at = match status {
            Status::InProgress => &mut self.in_progress_at,
            Status::Finalizing => &mut self.finalizing_at,
            Status::Completed => &mut self.completed_at,
            Status::Failed => &mut self.failed_at,
            Status::Cancelling => &mut self.cancelling_at,
            Status::Cancelled => &mut self.cancelled_at,
            Status::Validating => return,
        };
        *at = Some(now);
    }
}

/// A batch's fields that change as it runs.
#[derive(Debug, Default)]
struct Progress {
    status: Status,
    at: Stamps,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    total: usize,
    completed: usize,
    failed: usize,
    /// The tokens the answers so far count.
    usage: line::Tokens,
    /// Why it failed: faults of its file by line, or of its run.
    errors: Vec<Value>,
    /// Bytes of the output and error files that hold the answers counted, as last kept.
    written: [u64; 2],
}

impl Progress {
    /// Whether the answers counted could be in the bytes written: each file holds some
    /// exactly when some answers of its kind are counted.
    fn answers_fit(&self) -> bool {
        (self.completed > 0) == (self.written[0] > 0) && (self.failed > 0) == (self.written[1] > 0)
    }
}

/// What a batch is asked to do, fixed when it is made: the Batch object's fields that never
/// change, written into it and read back from it as they are.
#[derive(Debug, Serialize, Deserialize)]
struct Fixed {
    id: String,
    endpoint: String,
    input_file_id: String,
    completion_window: String,
    metadata: Option<Map<String, Value>>,
    created_at: u64,
}

/// One batch.
#[derive(Debug)]
pub struct Batch {
    fixed: Fixed,
    progress: Mutex<Progress>,
    cancelled: AtomicBool,
    cancel: Notify,
    /// Where its object is kept across restarts, if it is.
    saved: Option<PathBuf>,
}

impl Batch {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn status(&self) -> Status {
        self.progress().status
    }

    /// Moves to `status`, stamping its time, and keeps its object where it is kept.
    fn enter(&self, status: Status) {
        {
            let mut p = self.progress();
            // A cancel asked while it ran wins over the run's own next step, but for its end.
            if p.status == Status::Cancelling && !status.finished() {
                return;
            }
            p.status = status;
            p.at.stamp(status, now_s());
        }
        self.save();
    }

    /// Writes its object where it is kept, if it is.
    fn save(&self) {
        let Some(path) = &self.saved else {
            return;
        };
        let mut object = self.json();
        object[WRITTEN] = json!(self.progress().written);
        let object = serde_json::to_vec(&object).map_err(std::io::Error::other);
        if let Err(e) = object.and_then(|o| crate::durable::write_whole(path, &o)) {
            tracing::warn!(batch = %self.fixed.id, error = %e, "a batch's object was not written: the next start reads an older one back");
        }
    }

    /// A batch an earlier server wrote to `path`, read back; one that had not ended, made
    /// ready to run again (`true`).
    fn read_back(path: PathBuf) -> Option<(u64, Batch, bool)> {
        let data = std::fs::read(&path).ok()?;
        let saved: Saved = serde_json::from_slice(&data).ok()?;
        let n = saved.fixed.id.strip_prefix("batch_")?.parse().ok()?;
        let status = Status::named(&saved.status)?;
        let mut progress = Progress {
            status,
            at: saved.at,
            output_file_id: saved.output_file_id,
            error_file_id: saved.error_file_id,
            total: saved.request_counts.total,
            completed: saved.request_counts.completed,
            failed: saved.request_counts.failed,
            usage: line::Tokens::of(&data),
            errors: saved.errors.map(|e| e.data).unwrap_or_default(),
            written: saved.written,
        };
        let again = !status.finished() && status != Status::Cancelling;
        let cut = status == Status::Cancelling;
        if matches!(status, Status::InProgress | Status::Finalizing) && progress.answers_fit() {
            // It goes on from the answers kept ([`execute`] checks they are there).
            progress.status = Status::InProgress;
            progress.at.finalizing_at = None;
        } else if again {
            progress = Progress::default();
        } else if cut {
            progress.status = Status::Cancelled;
            progress.at.stamp(Status::Cancelled, now_s());
        }
        let batch = Batch {
            fixed: saved.fixed,
            progress: Mutex::new(progress),
            cancelled: AtomicBool::new(false),
            cancel: Notify::new(),
            saved: Some(path),
        };
        if cut {
            // Cancelled once, for good: the next start reads it so.
            batch.save();
        }
        Some((n, batch, again))
    }

    fn fail(&self, errors: Vec<Value>) {
        self.progress().errors = errors;
        self.enter(Status::Failed);
    }

    /// Fails with one fault of the whole file.
    fn fail_with(&self, code: &'static str, message: impl Into<String>) {
        let e = LineError {
            code,
            message: message.into(),
        };
        self.fail(vec![fault(None, &e)]);
    }

    /// OpenAI's Batch object.
    pub fn json(&self) -> Value {
        let p = self.progress();
        let errors = (!p.errors.is_empty()).then(|| json!({"object": "list", "data": p.errors}));
        let mut object = json!({
            "object": "batch",
            "errors": errors,
            "status": p.status.name(),
            "output_file_id": p.output_file_id,
            "error_file_id": p.error_file_id,
            "expires_at": self.fixed.created_at + 24 * 3600,
            "expired_at": null,
            "request_counts": {"total": p.total, "completed": p.completed, "failed": p.failed},
            "usage": p.usage.json(),
        });
        // The fixed fields, and six optional times: each serialises as its struct.
        if let Value::Object(object) = &mut object {
            for part in [
                serde_json::to_value(&self.fixed),
                serde_json::to_value(&p.at),
            ] {
                if let Ok(Value::Object(part)) = part {
                    object.extend(part);
                }
            }
        }
        object
    }
}

/// The field of a kept batch object, beside the API's, that holds [`Progress::written`].
const WRITTEN: &str = "sheaf_answer_bytes";

/// A batch's object as [`Batch::save`] writes it, read back.
#[derive(Deserialize)]
struct Saved {
    #[serde(flatten)]
    fixed: Fixed,
    #[serde(default, rename = "sheaf_answer_bytes")]
    written: [u64; 2],
    status: String,
    #[serde(flatten)]
    at: Stamps,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    request_counts: Counts,
    errors: Option<Errors>,
}

#[derive(Deserialize)]
struct Counts {
    total: usize,
    completed: usize,
    failed: usize,
}

#[derive(Deserialize)]
struct Errors {
    data: Vec<Value>,
}

/// The server's batches, by number (`batch_N`).
#[derive(Debug, Default)]
pub struct BatchStore {
    inner: Mutex<(BTreeMap<u64, Arc<Batch>>, u64)>,
    /// Where each batch's object is kept across restarts, if anywhere.
    dir: Option<PathBuf>,
    /// Batches read back that had not ended, until [`resume`] runs them.
    unfinished: Mutex<Vec<Arc<Batch>>>,
}

impl BatchStore {
    /// Batches kept in `dir`, with those an earlier server left there.
    pub fn open(dir: PathBuf) -> std::io::Result<BatchStore> {
        std::fs::create_dir_all(&dir)?;
        let mut batches = BTreeMap::new();
        let mut unfinished = Vec::new();
        let mut last = 0;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(name) = name.strip_prefix("batch_") else {
                continue;
            };
            if name
                .strip_suffix(".partial")
                .is_some_and(|n| n.parse::<u64>().is_ok())
            {
                // An object being written when a server stopped: the one before it stands.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(n) = name.strip_suffix(".json") else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else {
                continue;
            };
            last = last.max(n);
            match Batch::read_back(path.clone()) {
                Some((n, batch, again)) => {
                    // Answers no longer needed: of a batch that ended, or none kept.
                    let written = batch.progress().written;
                    for (kind, bytes) in KINDS.iter().zip(written) {
                        if !again || bytes == 0 {
                            let answers = format!("{}_{kind}.jsonl", batch.fixed.id);
                            let _ = std::fs::remove_file(dir.join(answers));
                        }
                    }
                    let batch = Arc::new(batch);
                    if again {
                        unfinished.push(batch.clone());
                    }
                    batches.insert(n, batch);
                }
                None => {
                    tracing::warn!(file = %path.display(), "not a batch's object: left as it is")
                }
            }
        }
        if !batches.is_empty() {
            tracing::info!(batches = batches.len(), unfinished = unfinished.len(), dir = %dir.display(), "batches of /v1/batches read back");
        }
        Ok(BatchStore {
            inner: Mutex::new((batches, last)),
            dir: Some(dir),
            unfinished: Mutex::new(unfinished),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, (BTreeMap<u64, Arc<Batch>>, u64)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, id: &str) -> Option<Arc<Batch>> {
        let n: u64 = id.strip_prefix("batch_")?.parse().ok()?;
        self.inner().0.get(&n).cloned()
    }
}

/// What `POST /v1/batches` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    metadata: Option<Map<String, Value>>,
    /// How long OpenAI keeps the answers: here, until deleted (or until the server ends, in
    /// its temporary folder).
    #[serde(rename = "output_expires_after")]
    _expires_after: Option<serde::de::IgnoredAny>,
}

/// OpenAI's rule for metadata: at most 16 pairs, keys up to 64 characters, values strings up to
/// 512.
fn check_metadata(metadata: &Map<String, Value>) -> Result<(), String> {
    if metadata.len() > 16 {
        return Err(format!("metadata: {} pairs; at most 16", metadata.len()));
    }
    for (key, value) in metadata {
        if key.chars().count() > 64 {
            return Err(format!("metadata: key '{key}' is over 64 characters"));
        }
        match value.as_str() {
            Some(v) if v.chars().count() <= 512 => {}
            Some(_) => return Err(format!("metadata.{key}: over 512 characters")),
            None => return Err(format!("metadata.{key}: a string, not {value}")),
        }
    }
    Ok(())
}

/// `POST /v1/batches`: checks the request, and starts the batch in the background.
pub async fn create(
    State(state): State<AppState>,
    body: Result<Body<CreateBatch>, BodyError>,
) -> Result<Json<Value>, OpenAiError> {
    let Body(body) = body.map_err(|e| bad(e.0))?;
    if !line::URLS.contains(&body.endpoint.as_str()) {
        return Err(bad(format!(
            "endpoint: '{}'; give one of {}",
            body.endpoint,
            line::URLS.join(", ")
        )));
    }
    if body.completion_window != "24h" {
        return Err(bad(format!(
            "completion_window: '{}'; give 24h",
            body.completion_window
        )));
    }
    if let Some(metadata) = &body.metadata {
        check_metadata(metadata).map_err(bad)?;
    }
    let (file, path) = state.files.get(&body.input_file_id).ok_or_else(|| {
        OpenAiError::new(
            StatusCode::NOT_FOUND,
            format!("input_file_id: no such file: {}", body.input_file_id),
        )
    })?;
    if file.purpose != BATCH {
        return Err(bad(format!(
            "input_file_id: {} is a file of purpose '{}', not '{BATCH}'",
            file.id, file.purpose
        )));
    }
    let batch = {
        let mut inner = state.batches.inner();
        let running = inner.0.values().filter(|b| !b.status().finished()).count();
        if running >= MAX_RUNNING {
            return Err(OpenAiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("batches: {running} are unfinished, the most this server runs at once; wait for one to end"),
            ));
        }
        while inner.0.len() >= MAX_KEPT {
            let Some(oldest) = inner
                .0
                .iter()
                .find(|(_, b)| b.status().finished())
                .map(|(n, _)| *n)
            else {
                break;
            };
            if let Some(gone) = inner.0.remove(&oldest) {
                if let Some(path) = &gone.saved {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        inner.1 += 1;
        let n = inner.1;
        let batch = Arc::new(Batch {
            fixed: Fixed {
                id: format!("batch_{n}"),
                endpoint: body.endpoint,
                input_file_id: body.input_file_id,
                completion_window: body.completion_window,
                metadata: body.metadata,
                created_at: now_s(),
            },
            progress: Mutex::default(),
            cancelled: AtomicBool::new(false),
            cancel: Notify::new(),
            saved: state
                .batches
                .dir
                .as_ref()
                .map(|d| d.join(format!("batch_{n}.json"))),
        });
        inner.0.insert(n, batch.clone());
        batch
    };
    batch.save();
    let answer = batch.json();
    tokio::spawn(execute(state, batch, path));
    Ok(Json(answer))
}

fn missing(id: &str) -> OpenAiError {
    OpenAiError::new(StatusCode::NOT_FOUND, format!("No such Batch object: {id}"))
}

/// `GET /v1/batches/{id}`.
pub async fn get(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, OpenAiError> {
    let batch = state.batches.get(&id).ok_or_else(|| missing(&id))?;
    Ok(Json(batch.json()))
}

/// `POST /v1/batches/{id}/cancel`: a batch still validating or running stops; one that has
/// ended is a 409.
pub async fn cancel(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, OpenAiError> {
    let batch = state.batches.get(&id).ok_or_else(|| missing(&id))?;
    let status = batch.status();
    if status.finished() {
        return Err(OpenAiError::new(
            StatusCode::CONFLICT,
            format!(
                "batch {id} is {}: only an unfinished batch can be cancelled",
                status.name()
            ),
        ));
    }
    if status != Status::Cancelling {
        batch.enter(Status::Cancelling);
        batch.cancelled.store(true, Ordering::Release);
        batch.cancel.notify_one();
    }
    Ok(Json(batch.json()))
}

/// What `GET /v1/batches` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
}

/// `GET /v1/batches`: newest first, `limit` of them (1 to 100, default 20) after `after`.
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(bad(format!("limit: {limit}; give 1 to 100")));
    }
    let after = match &query.after {
        None => u64::MAX,
        Some(id) => id
            .strip_prefix("batch_")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad(format!("after: '{id}' is no batch id")))?,
    };
    let batches: Vec<Arc<Batch>> = {
        let inner = state.batches.inner();
        inner
            .0
            .range(..after)
            .rev()
            .take(limit + 1)
            .map(|(_, b)| b.clone())
            .collect()
    };
    let shown = batches.iter().take(limit).map(|b| b.json()).collect();
    Ok(Json(super::page(shown, batches.len() > limit)))
}

/// A fault of the batch's file, as the Batch API lists it.
fn fault(line: Option<usize>, e: &LineError) -> Value {
    let param = crate::error::param_of(&e.message);
    json!({"code": e.code, "message": e.message, "param": param, "line": line})
}

/// Runs the batches read back that had not ended, each from its first answer not kept.
pub fn resume(state: &AppState) {
    let unfinished = std::mem::take(
        &mut *state
            .batches
            .unfinished
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    for batch in unfinished {
        tracing::info!(batch = %batch.fixed.id, "a batch the last server did not end goes on");
        let path = state
            .files
            .get(&batch.fixed.input_file_id)
            .map(|(_, path)| path)
            .unwrap_or_default();
        tokio::spawn(execute(state.clone(), batch, path));
    }
}

/// Runs `batch`, whose input file is at `path`.
async fn execute(state: AppState, batch: Arc<Batch>, path: std::path::PathBuf) {
    let text = match tokio::fs::read(&path).await.map(String::from_utf8) {
        Ok(Ok(text)) => text,
        Ok(Err(_)) => return batch.fail_with("invalid_file", "the input file is not UTF-8 text"),
        Err(_) => {
            let message = format!(
                "{} was deleted before the batch read it",
                batch.fixed.input_file_id
            );
            return batch.fail_with("file_not_found", message);
        }
    };
    let expect = Expect {
        endpoint: Some(&batch.fixed.endpoint),
        model: None,
    };
    let requests = match line::parse_all(&text, expect, MAX_FAULTS) {
        Ok(requests) if requests.is_empty() => {
            return batch.fail_with("empty_file", "the input file holds no request")
        }
        Ok(requests) if requests.len() > MAX_REQUESTS => {
            let message = format!(
                "{} requests; a batch holds at most {MAX_REQUESTS}",
                requests.len()
            );
            return batch.fail_with("too_many_requests", message);
        }
        Ok(requests) => requests,
        Err(faults) => return batch.fail(faults.iter().map(|(n, e)| fault(Some(*n), e)).collect()),
    };
    drop(text);
    batch.progress().total = requests.len();
    if batch.status() != Status::InProgress {
        batch.enter(Status::InProgress);
    }
    let mut outputs = match Outputs::reopen(&state.files, &batch, requests.len()).await {
        Ok(outputs) => outputs,
        Err(why) => {
            if batch.progress().written != [0, 0] {
                tracing::warn!(batch = %batch.fixed.id, why, "a batch's answers so far are not all there: it starts over");
            }
            {
                let mut p = batch.progress();
                p.completed = 0;
                p.failed = 0;
                p.usage = line::Tokens::default();
                p.written = [0, 0];
            }
            Outputs::new(&state.files, &batch.fixed.id)
        }
    };
    let start = {
        let p = batch.progress();
        p.completed + p.failed
    };
    let in_flight = in_flight(&state, &requests[0].body);
    let routes = crate::openai::routes().with_state(state.clone());
    let prefix = batch.fixed.id.clone();
    let mut kept_at = std::time::Instant::now();
    let requests = requests.into_iter().enumerate().skip(start);
    let mut answers = futures::stream::iter(requests)
        .map(move |(i, request)| {
            let routes = routes.clone();
            let id = format!("{prefix}_req_{i}");
            async move { line::call(&routes, &id, &request).await }
        })
        .buffered(in_flight);
    let mut run_error = None;
    loop {
        if batch.cancelled.load(Ordering::Acquire) {
            break;
        }
        let answered = tokio::select! {
            answered = answers.next() => answered,
            _ = batch.cancel.notified() => continue,
        };
        let Some(answered) = answered else {
            break;
        };
        if let Err(e) = outputs.write(answered.ok, &answered.line).await {
            run_error = Some(e);
            break;
        }
        {
            let mut p = batch.progress();
            p.usage.add(answered.tokens);
            if answered.ok {
                p.completed += 1;
            } else {
                p.failed += 1;
            }
        }
        if batch.saved.is_some() && kept_at.elapsed() >= KEEP_EVERY {
            // The answers so far on disk, then the object that counts them.
            match outputs.flush().await {
                Ok(written) => batch.progress().written = written,
                Err(e) => {
                    run_error = Some(e);
                    break;
                }
            }
            batch.save();
            kept_at = std::time::Instant::now();
        }
    }
    // Requests still in flight are dropped with their futures.
    drop(answers);
    if !batch.cancelled.load(Ordering::Acquire) && run_error.is_none() {
        batch.enter(Status::Finalizing);
    }
    let (output, error) = outputs.finish(&state.files).await;
    {
        let mut p = batch.progress();
        p.output_file_id = output;
        p.error_file_id = error;
    }
    match run_error {
        Some(message) => batch.fail_with("batch_failed", message),
        None if batch.cancelled.load(Ordering::Acquire) => batch.enter(Status::Cancelled),
        None => batch.enter(Status::Completed),
    }
}

/// Requests a batch keeps in flight: as many as the first request's model runs together.
fn in_flight(state: &AppState, body: &[u8]) -> usize {
    let model = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|b| b.get("model").and_then(Value::as_str).map(str::to_string));
    let handle = model.and_then(|m| state.manager.get(&m, None).ok());
    match handle {
        Some(h) if h.is_generator() => h.config.generation.max_seqs as usize,
        Some(h) if h.is_encoder() => h.max_batch_size.max(1),
        _ => DEFAULT_IN_FLIGHT,
    }
    .max(1)
}

/// The output file and the error file.
const KINDS: [&str; 2] = ["output", "error"];

/// A batch's output and error files, written as answers come: beside the store's files
/// (`batch_N_output.jsonl`, `batch_N_error.jsonl`) until the batch ends, then listed.
struct Outputs<'a> {
    store: &'a FileStore,
    batch: String,
    /// The output file (answers with a success status) and the error file (the others).
    files: [Option<Open>; 2],
}

/// An answer file being written: the store's file it becomes, where it is written until then,
/// and how many bytes it holds.
struct Open {
    file: NewFile,
    partial: PathBuf,
    out: tokio::io::BufWriter<tokio::fs::File>,
    bytes: u64,
}

impl Open {
    /// Writes out what is buffered and waits for it to reach the disk, before anything that
    /// counts on it is written: the batch's object, the file's description.
    async fn keep(&mut self) -> std::io::Result<()> {
        self.out.flush().await?;
        self.out.get_ref().sync_data().await
    }
}

impl<'a> Outputs<'a> {
    fn new(store: &'a FileStore, batch: &str) -> Outputs<'a> {
        Outputs {
            store,
            batch: batch.to_string(),
            files: [None, None],
        }
    }

    /// The answer files of `batch` as it last kept them, to go on from its first answer not
    /// kept; or why that cannot be (a file missing or shorter than the object records, counts
    /// that do not fit `total` requests or the files).
    async fn reopen(
        store: &'a FileStore,
        batch: &Batch,
        total: usize,
    ) -> Result<Outputs<'a>, String> {
        let (written, answered, fit) = {
            let p = batch.progress();
            (p.written, p.completed + p.failed, p.answers_fit())
        };
        if answered > total || !fit {
            return Err(format!(
                "{answered} answers of {total} requests counted in {written:?} bytes"
            ));
        }
        let mut outputs = Outputs::new(store, &batch.fixed.id);
        for (i, keep) in written.into_iter().enumerate() {
            if keep > 0 {
                if let Err(e) = outputs.open(i, keep).await {
                    outputs.abandon();
                    return Err(e);
                }
            }
        }
        Ok(outputs)
    }

    /// Gives up the files opened: their bytes go back to the budget, and what they hold is
    /// cut by the next [`Outputs::open`] of the same batch.
    fn abandon(self) {
        for open in self.files.into_iter().flatten() {
            self.store.discard(open.file);
        }
    }

    /// Opens answer file `i` for writing: holding its first `keep` bytes, or new.
    async fn open(&mut self, i: usize, keep: u64) -> Result<(), String> {
        let mut file = self.store.create().map_err(|e| e.message)?;
        let partial = file
            .path
            .with_file_name(format!("{}_{}.jsonl", self.batch, KINDS[i]));
        let opened = async {
            let out = tokio::fs::OpenOptions::new()
                .write(true)
                .create(keep == 0)
                .truncate(keep == 0)
                .open(&partial)
                .await?;
            if keep > 0 {
                let has = out.metadata().await?.len();
                if has < keep {
                    let e = format!("{} holds {has} bytes, not {keep}", partial.display());
                    return Err(std::io::Error::other(e));
                }
                out.set_len(keep).await?;
            }
            let mut out = tokio::io::BufWriter::new(out);
            tokio::io::AsyncSeekExt::seek(&mut out, std::io::SeekFrom::End(0)).await?;
            Ok::<_, std::io::Error>(out)
        };
        let kept = match opened.await {
            Ok(out) => self.store.reserve(&mut file, keep).map(|()| out),
            Err(e) => Err(format!("cannot write the batch's answers: {e}")),
        };
        match kept {
            Ok(out) => {
                self.files[i] = Some(Open {
                    file,
                    partial,
                    out,
                    bytes: keep,
                });
                Ok(())
            }
            Err(e) => {
                self.store.discard(file);
                Err(e)
            }
        }
    }

    async fn write(&mut self, ok: bool, line: &[u8]) -> Result<(), String> {
        let i = usize::from(!ok);
        if self.files[i].is_none() {
            self.open(i, 0).await?;
        }
        let Some(open) = self.files[i].as_mut() else {
            return Ok(());
        };
        self.store.reserve(&mut open.file, line.len() as u64)?;
        open.bytes += line.len() as u64;
        open.out
            .write_all(line)
            .await
            .map_err(|e| format!("cannot write the batch's answers: {e}"))
    }

    /// Writes out what is buffered, onto the disk: the bytes each file then holds.
    async fn flush(&mut self) -> Result<[u64; 2], String> {
        let mut written = [0, 0];
        for (open, bytes) in self.files.iter_mut().zip(&mut written) {
            if let Some(open) = open {
                open.keep()
                    .await
                    .map_err(|e| format!("cannot write the batch's answers: {e}"))?;
                *bytes = open.bytes;
            }
        }
        Ok(written)
    }

    /// Lists the files written: (output file id, error file id).
    async fn finish(self, store: &FileStore) -> (Option<String>, Option<String>) {
        let mut ids = [None, None];
        for (i, open) in self.files.into_iter().enumerate() {
            let Some(mut open) = open else {
                continue;
            };
            let kept = if store.kept() {
                open.keep().await
            } else {
                open.out.flush().await
            };
            let whole = match kept {
                Ok(()) => tokio::fs::rename(&open.partial, &open.file.path).await,
                Err(e) => Err(e),
            };
            if let Err(e) = whole {
                tracing::warn!(batch = %self.batch, error = %e, "a batch's answers were not kept");
                let _ = tokio::fs::remove_file(&open.partial).await;
                store.discard(open.file);
                continue;
            }
            let name = format!("{}_{}.jsonl", self.batch, KINDS[i]);
            ids[i] = Some(store.add(open.file, &name, BATCH_OUTPUT).id);
        }
        let [output, error] = ids;
        (output, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_follows_openai_s_rule() {
        let ok: Map<String, Value> = serde_json::from_value(json!({"job": "nightly"})).unwrap();
        assert!(check_metadata(&ok).is_ok());
        let number: Map<String, Value> = serde_json::from_value(json!({"n": 3})).unwrap();
        assert!(check_metadata(&number).unwrap_err().contains("a string"));
        let many: Map<String, Value> = (0..17).map(|i| (i.to_string(), json!("v"))).collect();
        assert!(check_metadata(&many).unwrap_err().contains("at most 16"));
    }

    fn kept(dir: &std::path::Path, n: u64) -> Batch {
        Batch {
            fixed: Fixed {
                id: format!("batch_{n}"),
                endpoint: "/v1/completions".into(),
                input_file_id: "file-1".into(),
                completion_window: "24h".into(),
                metadata: serde_json::from_value(json!({"job": "nightly"})).unwrap(),
                created_at: 100,
            },
            progress: Mutex::default(),
            cancelled: AtomicBool::new(false),
            cancel: Notify::new(),
            saved: Some(dir.join(format!("batch_{n}.json"))),
        }
    }

    #[test]
    fn batches_kept_in_a_folder_are_read_back_and_the_unfinished_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let done = kept(dir.path(), 1);
        done.enter(Status::InProgress);
        {
            let mut p = done.progress();
            p.total = 3;
            p.completed = 2;
            p.failed = 1;
            p.output_file_id = Some("file-2".into());
            p.error_file_id = Some("file-3".into());
            p.usage = line::Tokens {
                input: 30,
                output: 12,
                cached: 0,
            };
        }
        done.enter(Status::Finalizing);
        done.enter(Status::Completed);
        let failed = kept(dir.path(), 2);
        failed.fail_with("empty_file", "the input file holds no request");
        let running = kept(dir.path(), 4);
        running.enter(Status::InProgress);
        // Counted after the object was kept: the next server does not see it.
        running.progress().completed = 7;
        let going = kept(dir.path(), 7);
        going.enter(Status::InProgress);
        {
            let mut p = going.progress();
            p.completed = 5;
            p.usage.input = 40;
            p.written = [300, 0];
        }
        going.enter(Status::Finalizing);
        let unfit = kept(dir.path(), 8);
        unfit.enter(Status::InProgress);
        unfit.progress().failed = 2;
        unfit.save();
        for leftover in ["1_output", "7_output", "7_error", "8_error"] {
            std::fs::write(dir.path().join(format!("batch_{leftover}.jsonl")), b"{}\n").unwrap();
        }
        let cancelling = kept(dir.path(), 5);
        cancelling.enter(Status::InProgress);
        cancelling.enter(Status::Cancelling);
        std::fs::write(dir.path().join("batch_6.json"), b"{").unwrap();
        std::fs::write(dir.path().join("batch_4.partial"), b"{").unwrap();

        let store = BatchStore::open(dir.path().to_path_buf()).unwrap();
        let back = store.get("batch_1").unwrap().json();
        assert_eq!(back, done.json(), "a finished batch reads back as it was");
        assert_eq!(back["usage"]["input_tokens"], 30);
        assert_eq!(back["metadata"]["job"], "nightly");
        assert_eq!(store.get("batch_2").unwrap().json(), failed.json());
        let again = store.get("batch_4").unwrap().json();
        assert_eq!(again["status"], "in_progress");
        assert_eq!(again["request_counts"]["completed"], 0);
        assert!(again["in_progress_at"].is_u64() && again["created_at"] == 100);
        // One with answers kept goes on from them, finalizing or not.
        let on = store.get("batch_7").unwrap();
        assert_eq!(on.progress().written, [300, 0]);
        let on = on.json();
        assert_eq!(on["status"], "in_progress");
        assert_eq!(on["request_counts"]["completed"], 5);
        assert_eq!(on["usage"]["input_tokens"], 40);
        assert!(on["finalizing_at"].is_null() && on["in_progress_at"].is_u64());
        // Answers counted with no bytes to hold them: it starts over.
        let over = store.get("batch_8").unwrap().json();
        assert_eq!(over["status"], "validating");
        assert_eq!(over["request_counts"]["failed"], 0);
        // Answer files stay only where a batch goes on from them.
        let left: Vec<bool> = ["1_output", "7_output", "7_error", "8_error"]
            .iter()
            .map(|l| dir.path().join(format!("batch_{l}.jsonl")).exists())
            .collect();
        assert_eq!(left, [false, true, false, false]);
        let cancelled = store.get("batch_5").unwrap().json();
        assert_eq!(cancelled["status"], "cancelled");
        assert!(cancelled["cancelled_at"].is_u64());
        let mut kept: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("batch_5.json")).unwrap())
                .unwrap();
        // The API's object, and beside it the bytes of answers kept.
        assert_eq!(kept[WRITTEN], json!([0, 0]));
        kept.as_object_mut().unwrap().remove(WRITTEN);
        assert_eq!(kept, cancelled, "kept as it now stands");
        assert!(store.get("batch_6").is_none() && store.get("batch_3").is_none());
        assert!(!dir.path().join("batch_4.partial").exists());
        let unfinished = store.unfinished.lock().unwrap();
        let ids: Vec<&str> = unfinished.iter().map(|b| b.fixed.id.as_str()).collect();
        assert_eq!(ids.len(), 3);
        for id in ["batch_4", "batch_7", "batch_8"] {
            assert!(ids.contains(&id), "{ids:?}");
        }
        // New batches are numbered after the last one kept.
        assert_eq!(store.inner().1, 8);
    }

    fn lines(n: std::ops::Range<usize>) -> Vec<Vec<u8>> {
        n.map(|i| format!("{{\"custom_id\": \"r{i}\"}}\n").into_bytes())
            .collect()
    }

    #[tokio::test]
    async fn answer_files_go_on_from_the_bytes_kept_and_become_the_store_s_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path().to_path_buf(), 1 << 20).unwrap();
        let batch = kept(dir.path(), 1);
        let mut outputs = Outputs::reopen(&store, &batch, 10).await.unwrap();
        for (i, line) in lines(0..4).iter().enumerate() {
            outputs.write(i != 2, line).await.unwrap();
        }
        let written = outputs.flush().await.unwrap();
        let first: usize = lines(0..4).iter().map(Vec::len).sum();
        assert_eq!(written[0] + written[1], first as u64);
        // Answers past the last record, then the process gone.
        outputs.write(true, &lines(4..5)[0]).await.unwrap();
        outputs.flush().await.unwrap();
        drop(outputs);
        {
            let mut p = batch.progress();
            (p.completed, p.failed, p.written) = (3, 1, written);
        }
        let store = FileStore::open(dir.path().to_path_buf(), 1 << 20).unwrap();
        let mut outputs = Outputs::reopen(&store, &batch, 10).await.unwrap();
        for line in lines(4..6) {
            outputs.write(true, &line).await.unwrap();
        }
        let (output, error) = outputs.finish(&store).await;
        let read = |id: Option<String>| {
            let (meta, path) = store.get(&id.unwrap()).unwrap();
            let data = std::fs::read(path).unwrap();
            assert_eq!(
                meta.bytes,
                data.len() as u64,
                "the budget counts the bytes kept"
            );
            String::from_utf8(data).unwrap()
        };
        let want = |ns: &[usize]| -> String {
            ns.iter()
                .map(|&n| String::from_utf8(lines(n..n + 1).remove(0)).unwrap())
                .collect()
        };
        assert_eq!(read(output), want(&[0, 1, 3, 4, 5]));
        assert_eq!(read(error), want(&[2]));
        assert!(!dir.path().join("batch_1_output.jsonl").exists());

        // Counts the files cannot hold, or a file cut short, are refused.
        let short = kept(dir.path(), 2);
        {
            let mut p = short.progress();
            (p.completed, p.written) = (1, [0, 0]);
        }
        assert!(Outputs::reopen(&store, &short, 10).await.is_err());
        std::fs::write(dir.path().join("batch_2_output.jsonl"), b"{}").unwrap();
        short.progress().written = [50, 0];
        let e = Outputs::reopen(&store, &short, 10).await.err().unwrap();
        assert!(e.contains("holds 2 bytes, not 50"), "{e}");
        short.progress().completed = 11;
        assert!(Outputs::reopen(&store, &short, 10).await.is_err());
    }

    #[test]
    fn a_cancel_holds_against_the_run_s_next_step_but_not_its_end() {
        let batch = Batch {
            fixed: Fixed {
                id: "batch_1".into(),
                endpoint: "/v1/completions".into(),
                input_file_id: "file-1".into(),
                completion_window: "24h".into(),
                metadata: None,
                created_at: 0,
            },
            progress: Mutex::default(),
            cancelled: AtomicBool::new(false),
            cancel: Notify::new(),
            saved: None,
        };
        batch.enter(Status::Cancelling);
        batch.enter(Status::InProgress);
        assert_eq!(batch.status(), Status::Cancelling);
        batch.enter(Status::Cancelled);
        let v = batch.json();
        assert_eq!(v["status"], "cancelled");
        assert!(v["cancelling_at"].is_u64() && v["cancelled_at"].is_u64());
        assert!(v["in_progress_at"].is_null() && v["errors"].is_null());
    }
}
