//! A job of OpenAI batch requests: the input file of OpenAI's Batch API (and of vLLM's
//! `run-batch`), one request a line, `{"custom_id", "method": "POST", "url", "body"}`, answered
//! line by line in `batch_output.jsonl`, in input order:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`.
//!
//! Each request goes through the routes `sheaf serve` answers it on
//! ([`line::URLS`](sheaf_server::openai::batch::line::URLS)), called in process without a
//! socket, so a line's answer (or its error, with the route's status and error body) is what
//! the server would send for the same body; the lines' formats are the server's own, shared
//! with `POST /v1/batches`. The whole file is checked
//! before anything runs: a line that is not such a request, a `custom_id` given twice, another
//! method or route, `stream: true` or another model's name stops the job with the line's
//! number. Up to `--max-concurrent-batches` requests are in flight (default: twice the
//! engine's `max_seqs` for a generation model, twice `max_batch_size` for a text encoder), so
//! that the engine and the batcher keep full batches; the answers are written in input order,
//! and `progress.json` records, about once a second, how many are on disk for a rerun.

use std::fs::File;
use std::io::{BufRead, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use sheaf_server::openai::batch::line::{self, Answered, Expect, Request, Tokens};

use super::outputs::{open_lines, progress_bar, Progress};
use super::strategy::{Stages, Task, Write};

/// The file the answers go to, in the output folder.
pub const FILE: &str = "batch_output.jsonl";

/// The most bytes read to tell a batch file from another input.
const MAX_LINE_BYTES: u64 = 64 << 20;

/// How often the answers on disk are synced and counted in the progress file.
const SYNC_EVERY: Duration = Duration::from_secs(1);

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
        .and_then(|l| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&l).ok())
        .is_some_and(|o| o.contains_key("custom_id") && o.contains_key("body"))
}

/// Reads and checks every request of `path` for the job on `model`; the error names the
/// first faulty line (counted from 1).
pub fn read(path: &Path, model: &str) -> anyhow::Result<Vec<Request>> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut super::prompts::open_lines_input(path)?, &mut text)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    let expect = Expect {
        endpoint: None,
        model: Some(model),
    };
    line::parse_all(&text, expect, 1).map_err(|faults| {
        let (n, e) = &faults[0];
        anyhow::anyhow!("{} line {n}: {}", path.display(), e.message)
    })
}

/// The job's stages: each chunk is one request, sent to the routes in process.
pub struct BatchJob {
    /// The `/v1` routes over the job's models.
    pub routes: Router,
    pub requests: Vec<Request>,
    /// Requests an earlier run answered, which this one skips.
    pub first: usize,
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
            let id = format!("batch_req_{index}");
            Ok(line::call(&self.routes, &id, &self.requests[index]).await)
        })
    }
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
    /// The tokens this run's answers count.
    pub tokens: Tokens,
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
            tokens: Tokens::default(),
        })
    }

    /// Puts every answer written on disk, and records it; this run's answers with an error
    /// status, and the tokens its answers count.
    pub fn finish(mut self) -> anyhow::Result<(usize, Tokens)> {
        self.sync()?;
        self.bar.finish();
        Ok((self.errors, self.tokens))
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
            self.tokens.add(answer.tokens);
            self.bar.inc(1);
            Ok(())
        })
    }
}
