//! A job on a streaming model (Triton's decoupled mode, or a pipeline with one): every
//! response of each item, in input order.
//!
//! Each item is its own request, since a streaming model's responses answer one request; up
//! to `--max-concurrent-batches` of them (default: the model's max_batch_size) are in flight,
//! so that the batcher can run several in one execution. `<output>/responses.jsonl` gets one
//! line per item, `{"item": i, "responses": [...]}`, each response as KServe's JSON body
//! (`{"model_name", "outputs": [{"name", "datatype", "shape", "data"}]}`). An item whose
//! stream ends in an error stops the job, as a failed chunk does.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use sheaf_core::{InferResponse, ModelHandle, ModelManager, RawRequest};
use sheaf_server::kserve::codec::{self, BinaryOutputs};
use sheaf_server::shm::SharedMemory;

use super::outputs::{open_lines, progress_bar, Progress};
use super::strategy::{self, Plan, Stages, Task, Write};
use super::tensors::{Source, TensorJob};
use super::RunArgs;

/// The file each item's responses go to, in the output folder.
pub const FILE: &str = "responses.jsonl";

/// Runs the streaming model `handle` over `sources`, opened from `inputs`, one item per request,
/// into `output`; returns (items, items an earlier run did).
pub async fn run(
    args: &RunArgs,
    manager: Arc<ModelManager>,
    handle: Arc<ModelHandle>,
    inputs: &[(String, PathBuf)],
    sources: Vec<Source>,
    output: &Path,
    mut plan: Plan,
) -> anyhow::Result<(usize, usize)> {
    anyhow::ensure!(
        args.batch_size.unwrap_or(1) == 1,
        "model '{}' answers each request with a stream of responses, so each item is its own \
         request: leave out --batch-size (the batcher still runs several in one execution)",
        handle.name
    );
    anyhow::ensure!(
        args.classes.is_none(),
        "--classes takes a model that answers once; a streaming model's responses are written \
         whole"
    );
    let total = sources.first().map_or(0, Source::items);
    let job = Progress::of(&handle.name, inputs, total);
    let kept = Progress::resume(output, &job, args.restart)?;
    std::fs::create_dir_all(output)?;
    plan.concurrency = args
        .max_concurrent_batches
        .unwrap_or(handle.max_batch_size.max(1));
    let writer = Responses {
        dir: output.to_path_buf(),
        file: open_lines(&output.join(FILE), kept)?,
        bar: progress_bar(total as u64, kept as u64),
        first: kept,
        progress: job,
    };
    let job = Arc::new(Streamed(TensorJob {
        manager,
        handle,
        sources,
        first: kept,
        total,
        chunk: 1,
        outputs: args.outputs.clone(),
        classes: None,
        first_output: None,
    }));
    let chunks = job.0.chunks();
    let writer = strategy::run(job, writer, Some(chunks), plan).await?;
    writer.bar.finish();
    Ok((total, kept))
}

/// A tensor job of one item per request, on a model that answers with a stream.
struct Streamed(TensorJob);

impl Stages for Streamed {
    type Input = (usize, RawRequest);
    type Output = Vec<InferResponse>;

    fn load(&self, k: usize) -> Task<'_, Option<Self::Input>> {
        self.0.load(k)
    }

    fn compute(&self, (k, raw): Self::Input) -> Task<'_, Vec<InferResponse>> {
        Box::pin(async move {
            let item = self.0.first + k;
            let failed = |e: sheaf_core::InferError| anyhow::anyhow!("item {item}: {}", e.message);
            let job = &self.0;
            let mut stream = job
                .manager
                .infer_stream(&job.handle, raw)
                .await
                .map_err(failed)?;
            let mut responses = Vec::new();
            while let Some(response) = stream.next().await {
                responses.push(response.map_err(failed)?);
            }
            Ok(responses)
        })
    }
}

/// Writes each item's responses as one JSON line, and the job's progress after it.
struct Responses {
    dir: PathBuf,
    file: File,
    bar: indicatif::ProgressBar,
    first: usize,
    progress: Progress,
}

impl Write<Vec<InferResponse>> for Responses {
    fn write(&mut self, k: usize, responses: Vec<InferResponse>) -> Task<'_, ()> {
        Box::pin(async move {
            let item = self.first + k;
            let line = line(item, &responses)?;
            tokio::task::block_in_place(|| {
                self.file.write_all(&line)?;
                self.file.sync_data()?;
                self.progress.done = item + 1;
                self.progress.save(&self.dir)
            })?;
            self.bar.inc(1);
            Ok(())
        })
    }
}

/// `{"item": item, "responses": [...]}` and a newline, each response rendered as KServe's JSON
/// body.
fn line(item: usize, responses: &[InferResponse]) -> anyhow::Result<Vec<u8>> {
    let json_only = BinaryOutputs::default();
    let no_shm = SharedMemory::default();
    let mut line = format!("{{\"item\":{item},\"responses\":[").into_bytes();
    for (i, response) in responses.iter().enumerate() {
        let encoded = codec::encode_response(response, &json_only, &no_shm)
            .map_err(|e| anyhow::anyhow!("item {item}: {}", e.message))?;
        if i > 0 {
            line.push(b',');
        }
        line.extend_from_slice(&encoded.body);
    }
    line.extend_from_slice(b"]}\n");
    Ok(line)
}
