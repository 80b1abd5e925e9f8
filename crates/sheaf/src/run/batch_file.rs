//! A job of OpenAI batch requests: the input file of OpenAI's Batch API (and of vLLM's
//! `run-batch`), one request a line, `{"custom_id", "method": "POST", "url", "body"}`, answered
//! line by line in `batch_output.jsonl`, in input order:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`.
//!
//! Each request goes through the routes `sheaf serve` answers it on ([`URLS`]), called in
//! process without a socket, so a line's answer (or its error, with the route's status and
//! error body) is what the server would send for the same body. The whole file is checked
//! before anything runs: a line that is not such a request, a `custom_id` given twice, another
//! method or route, `stream: true` or another model's name stops the job with the line's
//! number. Up to `--max-concurrent-batches` requests are in flight (default: twice the
//! engine's `max_seqs` for a generation model, twice `max_batch_size` for a text encoder), so
//! that the engine and the batcher keep full batches; the answers are written in input order,
//! and `progress.json` records, about once a second, how many are on disk for a rerun.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Body;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tower::ServiceExt;

use super::outputs::{open_lines, progress_bar, Progress};
use super::strategy::{Stages, Task, Write};

/// The file the answers go to, in the output folder.
pub const FILE: &str = "batch_output.jsonl";

/// The routes a batch request may name.
pub const URLS: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
];

/// The most bytes of a batch file.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// The most bytes read to tell a batch file from another input.
const MAX_LINE_BYTES: u64 = 64 << 20;

/// How often the answers on disk are synced and counted in the progress file.
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// One line of the input file, as OpenAI's Batch API defines it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    custom_id: String,
    method: String,
    url: String,
    body: Map<String, Value>,
}

/// One checked request of the job.
#[derive(Debug, Clone)]
pub struct Request {
    custom_id: String,
    url: String,
    /// The body as sent: the line's, with the job's model named where it named none.
    body: Vec<u8>,
}

/// Whether `path` is a file whose first line is a batch request (an object with `custom_id`
/// and `body`), rather than a file of prompts or items.
pub fn is_batch_file(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    // A tensor file may hold no line break for a long way: read at most one line's worth.
    let first = std::io::BufReader::new(std::io::Read::take(file, MAX_LINE_BYTES))
        .lines()
        .map_while(Result::ok)
        .find(|l| !l.trim().is_empty());
    first
        .and_then(|l| serde_json::from_str::<Map<String, Value>>(&l).ok())
        .is_some_and(|o| o.contains_key("custom_id") && o.contains_key("body"))
}

/// Reads and checks every request of `path` for the job on `model`; line numbers in errors
/// count from 1.
pub fn read(path: &Path, model: &str) -> anyhow::Result<Vec<Request>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    anyhow::ensure!(
        file.metadata()?.len() <= MAX_FILE_BYTES,
        "{} is larger than {} bytes",
        path.display(),
        MAX_FILE_BYTES
    );
    let mut requests = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{} line {}", path.display(), n + 1);
        let input: Input = serde_json::from_str(&line).map_err(|e| {
            anyhow::anyhow!(
                "{at}: {e}; a batch request is {{\"custom_id\": \"…\", \"method\": \"POST\", \
                 \"url\": \"/v1/…\", \"body\": {{…}}}}"
            )
        })?;
        let request = check(input, model).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        if let Some(first) = seen.insert(request.custom_id.clone(), n + 1) {
            anyhow::bail!(
                "{at}: custom_id '{}' is on line {first} too; each request needs its own",
                request.custom_id
            );
        }
        requests.push(request);
    }
    Ok(requests)
}

/// The request of one line, or what is wrong with it.
fn check(input: Input, model: &str) -> Result<Request, String> {
    let Input {
        custom_id,
        method,
        url,
        mut body,
    } = input;
    if method != "POST" {
        return Err(format!("method '{method}': a batch request is a POST"));
    }
    if !URLS.contains(&url.as_str()) {
        return Err(format!(
            "url '{url}' is not a route a batch runs; give one of {}",
            URLS.join(", ")
        ));
    }
    if body.get("stream").is_some_and(|s| s == &Value::Bool(true)) {
        return Err("body.stream: a batch answers each request whole; leave it out".into());
    }
    match body.get("model") {
        None => {
            body.insert("model".into(), Value::String(model.into()));
        }
        Some(Value::String(named)) if named != model => {
            return Err(format!(
                "body.model '{named}' is not this job's model '{model}'; name it or leave it out"
            ))
        }
        // The route answers a model that is not a string, as the server does.
        Some(_) => {}
    }
    let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    Ok(Request {
        custom_id,
        url,
        body,
    })
}

/// The job's stages: each chunk is one request, sent to the routes in process.
pub struct BatchJob {
    pub router: Router,
    pub requests: Vec<Request>,
    /// Requests an earlier run answered, which this one skips.
    pub first: usize,
}

/// One answer, rendered as its output line.
pub struct Answered {
    line: Vec<u8>,
    ok: bool,
}

impl Stages for BatchJob {
    type Input = usize;
    type Output = Answered;

    fn load(&self, k: usize) -> Task<'_, Option<usize>> {
        Box::pin(async move { Ok(Some(k)) })
    }

    fn compute(&self, k: usize) -> Task<'_, Answered> {
        Box::pin(async move {
            let index = self.first + k;
            let request = &self.requests[index];
            let sent = axum::http::Request::post(&request.url)
                .header(axum::http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(request.body.clone()))?;
            let response = self.router.clone().oneshot(sent).await?;
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            let line = match body {
                Ok(body) => answer_line(index, &request.custom_id, status.as_u16(), &body)?,
                Err(e) => error_line(index, &request.custom_id, &e.to_string())?,
            };
            Ok(Answered {
                line,
                ok: status.is_success(),
            })
        })
    }
}

/// One line of the output file, as OpenAI's Batch API defines it.
#[derive(Serialize)]
struct Output<'a> {
    id: String,
    custom_id: &'a str,
    response: Option<Response>,
    /// Why no response came, where none did.
    error: Option<Value>,
}

#[derive(Serialize)]
struct Response {
    status_code: u16,
    request_id: String,
    body: Box<RawValue>,
}

impl Output<'_> {
    fn line(&self) -> anyhow::Result<Vec<u8>> {
        let mut line = serde_json::to_vec(self)?;
        line.push(b'\n');
        Ok(line)
    }
}

/// The output line of request `index`'s answer: its status and body (a body that is not
/// JSON, as a string).
fn answer_line(index: usize, custom_id: &str, status: u16, body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let text = String::from_utf8_lossy(body);
    let body = match serde_json::from_str::<&RawValue>(&text) {
        Ok(raw) => raw.to_owned(),
        Err(_) => RawValue::from_string(serde_json::to_string(&text)?)?,
    };
    Output {
        id: format!("batch_req_{index}"),
        custom_id,
        response: Some(Response {
            status_code: status,
            request_id: format!("req_{index}"),
            body,
        }),
        error: None,
    }
    .line()
}

/// The output line of request `index` when no answer came: no response, and the error.
fn error_line(index: usize, custom_id: &str, message: &str) -> anyhow::Result<Vec<u8>> {
    Output {
        id: format!("batch_req_{index}"),
        custom_id,
        response: None,
        error: Some(serde_json::json!({"code": "internal_error", "message": message})),
    }
    .line()
}

/// Writes the answers in input order, and the job's progress about once a second.
pub struct Answers {
    dir: PathBuf,
    file: BufWriter<File>,
    bar: indicatif::ProgressBar,
    progress: Progress,
    /// Answers on disk: those of an earlier run, then this one's.
    written: usize,
    synced: Instant,
    /// This run's answers with an error status.
    pub errors: usize,
}

impl Answers {
    /// Opens `dir/batch_output.jsonl` for `progress`'s job, keeping the first `kept` lines.
    pub fn open(dir: &Path, progress: Progress, kept: usize) -> anyhow::Result<Answers> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Answers {
            dir: dir.to_path_buf(),
            file: BufWriter::new(open_lines(&dir.join(FILE), kept)?),
            bar: progress_bar(progress.items as u64, kept as u64),
            progress,
            written: kept,
            synced: Instant::now(),
            errors: 0,
        })
    }

    /// Puts every answer written on disk, and records it.
    pub fn finish(mut self) -> anyhow::Result<usize> {
        self.sync()?;
        self.bar.finish();
        Ok(self.errors)
    }

    fn sync(&mut self) -> anyhow::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_data()?;
        self.progress.done = self.written;
        self.progress.save(&self.dir)?;
        self.synced = Instant::now();
        Ok(())
    }
}

impl Write<Answered> for Answers {
    fn write(&mut self, _k: usize, answer: Answered) -> Task<'_, ()> {
        Box::pin(async move {
            tokio::task::block_in_place(|| {
                self.file.write_all(&answer.line)?;
                self.written += 1;
                if self.synced.elapsed() >= SYNC_EVERY {
                    self.sync()?;
                }
                anyhow::Ok(())
            })?;
            self.errors += usize::from(!answer.ok);
            self.bar.inc(1);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(line: Value) -> Result<Request, String> {
        let input: Input = serde_json::from_value(line).map_err(|e| e.to_string())?;
        check(input, "smollm2")
    }

    fn line(url: &str, body: Value) -> Value {
        serde_json::json!({"custom_id": "a", "method": "POST", "url": url, "body": body})
    }

    #[test]
    fn a_request_gets_the_job_s_model_where_it_names_none() {
        let r = input(line("/v1/completions", serde_json::json!({"prompt": "hi"}))).unwrap();
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["model"], "smollm2");
        assert_eq!(body["prompt"], "hi");
        let named = serde_json::json!({"model": "smollm2", "messages": []});
        assert!(input(line("/v1/chat/completions", named)).is_ok());
    }

    #[test]
    fn requests_no_route_can_answer_whole_are_refused() {
        let e = input(line("/v1/completions", serde_json::json!({"stream": true}))).unwrap_err();
        assert!(e.starts_with("body.stream"), "{e}");
        assert!(input(line(
            "/v1/completions",
            serde_json::json!({"stream": false})
        ))
        .is_ok());
        let e = input(line("/v2/models/m/infer", serde_json::json!({}))).unwrap_err();
        assert!(e.contains("/v1/chat/completions, /v1/completions"), "{e}");
        let e = input(line(
            "/v1/completions",
            serde_json::json!({"model": "gpt-4o"}),
        ))
        .unwrap_err();
        assert!(
            e.contains("'gpt-4o' is not this job's model 'smollm2'"),
            "{e}"
        );
        let mut get = line("/v1/completions", serde_json::json!({}));
        get["method"] = "GET".into();
        assert!(input(get)
            .unwrap_err()
            .contains("a batch request is a POST"));
        let mut extra = line("/v1/completions", serde_json::json!({}));
        extra["priority"] = 1.into();
        assert!(input(extra)
            .unwrap_err()
            .contains("unknown field `priority`"));
    }

    #[test]
    fn an_answer_that_is_not_json_is_kept_as_a_string() {
        let line = answer_line(3, "x", 413, b"too large").unwrap();
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["response"]["body"], "too large");
        assert_eq!(v["response"]["status_code"], 413);
        assert_eq!(v["id"], "batch_req_3");
        let line = answer_line(0, "y", 200, br#"{"a": [1, 2]}"#).unwrap();
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["response"]["body"]["a"][1], 2);
        assert!(v["error"].is_null());
    }
}
