//! `sheaf run`: an offline job. A model of a repository (a pipeline with its step models) runs
//! over every item of its inputs (NPY or raw tensors, a folder of images, JSON-lines prompts
//! for a generation model, or an OpenAI batch file of requests to the `/v1` routes), in process (the same manager, batcher and backends as `sheaf
//! serve`, no HTTP), and its answers
//! are written beside them, in input order. A progress bar shows items/s and the time left;
//! a rerun of the same job starts where the last one stopped.
//!
//! - [`strategy`]: sequential, concurrent or pipelined chunks (load, compute, write);
//! - [`tensors`] and [`npy`]: tensor inputs, a chunk of items per request;
//! - [`outputs`]: the output folder and its progress file;
//! - [`prompts`]: generation jobs, prompts grouped by length;
//! - [`batch_file`]: OpenAI batch files, each request answered by the route `sheaf serve`
//!   answers it on;
//! - [`responses`]: jobs on streaming (decoupled) models, every response of each item;
//! - [`stream`]: items from a NATS JetStream subject, answers to another.

pub mod batch_file;
pub mod npy;
pub mod outputs;
pub mod prompts;
pub mod responses;
pub mod strategy;
pub mod stream;
pub mod tensors;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use sheaf_backend::Signature;
use sheaf_core::config::ImageFormatConfig;
use sheaf_core::{ControlMode, ModelHandle, ModelManager};
use sheaf_server::openai::batch::line::Tokens;

use outputs::{Outputs, Progress};
use strategy::{Plan, Strategy};
use tensors::{Source, TensorJob};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The model: its name in --model-repository, or the path of its folder.
    #[arg(long)]
    pub model: String,
    /// Folder of models that holds --model.
    #[arg(long, env = "SHEAF_MODEL_REPOSITORY")]
    pub model_repository: Option<PathBuf>,
    /// Input items, `PATH` for the model's first input or `NAME=PATH`, repeated for several
    /// inputs: an NPY file (items along dimension 0), a raw file of little-endian items of the
    /// input's type and shape, a folder of JPEG/PNG/WebP images (for an input the model's
    /// `image_inputs` decodes), for a generation model a JSON-lines file of prompts, for a
    /// generation model or a text encoder an OpenAI batch file (`{"custom_id", "method",
    /// "url", "body"}` a line), or a NATS JetStream subject, `nats://HOST:PORT/SUBJECT`, one
    /// item per message.
    #[arg(long = "input", required = true)]
    pub inputs: Vec<String>,
    /// Output folder (default: beside the first input, named after it with `.out`); for a
    /// stream input, the subject the answers go to, `nats://HOST:PORT/SUBJECT`.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Stream input: keep waiting for messages (default: stop when the subject has none left).
    #[arg(long)]
    pub follow: bool,
    /// Stream input: the durable consumer that remembers which messages are done (default:
    /// `sheaf-run-<model>`).
    #[arg(long)]
    pub consumer: Option<String>,
    /// Stream input: seconds a pulled message may go unanswered before it is delivered again
    /// (to a rerun of a stopped job).
    #[arg(long, default_value_t = 30.0)]
    pub ack_wait: f64,
    /// How chunks move through loading, compute and writing.
    #[arg(long, value_enum, default_value_t = Strategy::Pipelined)]
    pub strategy: Strategy,
    /// Items per chunk, each one request to the model's batcher (default: the model's
    /// max_batch_size; prompts: its generation.max_seqs).
    #[arg(long, value_parser = crate::cli::count_at_once)]
    pub batch_size: Option<usize>,
    /// Chunks loaded ahead of the model, and computed ahead of the writer (`pipelined`).
    #[arg(long, default_value_t = 2, value_parser = crate::cli::count_at_once)]
    pub pipeline_depth: usize,
    /// Chunks computing at once (default: 4 with `concurrent`, 1 with `pipelined`; for a
    /// streaming model, whose items are each a request, its max_batch_size; for a batch file's
    /// requests, twice the model's generation.max_seqs, or twice its max_batch_size).
    #[arg(long, value_parser = crate::cli::count_at_once)]
    pub max_concurrent_batches: Option<usize>,
    /// Only these outputs (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    pub outputs: Option<Vec<String>>,
    /// Write the first output's (or each named output's) top K classes, as JSON lines.
    #[arg(long)]
    pub classes: Option<usize>,
    /// Prompts: the most tokens each completion may have (a line's `max_tokens` overrides it).
    #[arg(long, default_value_t = 128, value_parser = crate::cli::count_at_once)]
    pub max_tokens: usize,
    /// Prompts: sampling temperature, 0 (greedy) to 2 (a line's `temperature` overrides it).
    #[arg(long, default_value_t = 0.0, value_parser = temperature)]
    pub temperature: f32,
    /// Start over: ignore (and overwrite) what an earlier run of this job wrote.
    #[arg(long)]
    pub restart: bool,
    /// Server configuration file (devices, placement), as for `sheaf serve`.
    #[arg(long, env = "SHEAF_CONFIG")]
    pub config: Option<PathBuf>,
    /// Path of libonnxruntime.so (default: $ORT_DYLIB_PATH, else the project's .venv).
    #[arg(long)]
    pub onnxruntime_lib: Option<PathBuf>,
    /// Python interpreter for Python models whose config names none (default: the project's
    /// .venv, else python3).
    #[arg(long, env = "SHEAF_PYTHON")]
    pub python: Option<PathBuf>,
}

/// What a finished job reports on stdout, as one JSON line.
#[derive(Debug, serde::Serialize)]
struct Summary {
    model: String,
    strategy: String,
    items: usize,
    skipped: usize,
    seconds: f64,
    items_per_s: f64,
    output: PathBuf,
    /// A batch file's answers with an error status, of this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<usize>,
    /// The tokens a batch file's answers of this run count, as the Batch object's `usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<serde_json::Value>,
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let loaded = crate::serve::read_config(args.config.as_deref())?;
    crate::serve::init_onnx(
        args.onnxruntime_lib.as_deref(),
        loaded.onnx_library.as_deref(),
    )?;
    let (folder, name) = model_folder(&args)?;
    // The job's own repository: the one model, linked, so no other model loads; a pipeline's
    // step models beside it.
    let repo = tempfile::Builder::new().prefix("sheaf-run").tempdir()?;
    link_model(repo.path(), &folder, &name)?;
    let callback = sheaf_backend::Callback::default();
    let manager = ModelManager::with_config(
        crate::serve::backends(args.python.as_deref(), &callback),
        &loaded.config,
    )
    .map_err(anyhow::Error::msg)?
    .with_control(ControlMode::None);
    let manager = Arc::new(manager);
    crate::serve::call_back(&callback, &manager);
    manager
        .load_models(&[repo.path().to_path_buf()])
        .await
        .map_err(anyhow::Error::msg)?;
    let result = job(&args, manager.clone(), name).await;
    // As `sheaf serve` does at exit: the model's threads drop it before the process ends.
    crate::serve::release_models(&manager, std::time::Duration::from_secs(30)).await;
    result
}

/// Links `folder` into the job's repository as `name`; when it holds a pipeline (or a Triton
/// ensemble), the folders of its step models too, found beside it, and theirs in turn.
fn link_model(repo: &Path, folder: &Path, name: &str) -> anyhow::Result<()> {
    let link = repo.join(name);
    if link.exists() {
        return Ok(());
    }
    std::os::unix::fs::symlink(folder, &link)
        .with_context(|| format!("cannot link {}", folder.display()))?;
    let Some(definition) = sheaf_core::repository::pipeline_definition(folder, None) else {
        return Ok(());
    };
    let pipeline = sheaf_core::pipeline::Pipeline::load(&definition).map_err(anyhow::Error::msg)?;
    let beside = folder.parent().unwrap_or(Path::new("."));
    for step in pipeline.model_steps() {
        let step_folder = beside.join(step.model);
        anyhow::ensure!(
            step_folder.is_dir(),
            "pipeline '{name}' runs model '{}', which is not beside it ({} is no folder)",
            step.model,
            step_folder.display()
        );
        link_model(repo, &step_folder, step.model)?;
    }
    Ok(())
}

/// The job on the loaded model `name`.
async fn job(args: &RunArgs, manager: Arc<ModelManager>, name: String) -> anyhow::Result<()> {
    let handle = manager
        .get(&name, None)
        .map_err(|e| anyhow::anyhow!("model '{name}' did not load: {}", e.message))?;
    let streams = manager.streams(&handle).await;
    // What the model's metadata lists: a pipeline's own tensors, where its steps imply them.
    let signature = manager
        .metadata(&name, Some(&handle.version))
        .map(|m| Signature {
            inputs: m.inputs,
            outputs: m.outputs,
        })
        .map_err(|e| anyhow::anyhow!("model '{name}': {}", e.message))?;
    let inputs = parse_inputs(&args.inputs, &signature)?;
    let plan = Plan {
        strategy: args.strategy,
        depth: args.pipeline_depth,
        concurrency: args.max_concurrent_batches.unwrap_or(match args.strategy {
            Strategy::Concurrent => 4,
            _ => 1,
        }),
    };
    let streamed = inputs
        .iter()
        .find_map(|(name, path)| Some((name, stream::StreamUrl::parse(path.to_str()?)?)));
    if let Some((input, source)) = streamed {
        anyhow::ensure!(
            !streams,
            "model '{name}' answers each request with a stream of responses (decoupled), and a \
             job on a NATS subject publishes one answer per item: give it files, or serve the \
             model behind the queue (`sheaf serve --queue`) and ask for a stream"
        );
        return run_stream(args, manager, handle, input.clone(), source?, plan).await;
    }
    if let Some(Some(Ok(_))) = args
        .output
        .as_ref()
        .map(|o| o.to_str().and_then(stream::StreamUrl::parse))
    {
        anyhow::bail!("a stream output takes a stream input (--input nats://HOST:PORT/SUBJECT)");
    }
    let output = match &args.output {
        Some(o) => o.clone(),
        None => beside(&inputs[0].1),
    };
    let started = Instant::now();
    if let [(_, path)] = inputs.as_slice() {
        if batch_file::is_batch_file(path) {
            let (items, skipped, answered) =
                run_batch_file(args, manager, handle, &inputs, &output, plan).await?;
            return report(
                args,
                name,
                (items, skipped, Some(answered)),
                started,
                output,
            );
        }
    }
    let (items, skipped) = if handle.is_generator() {
        run_prompts(args, handle, &inputs, &output, plan).await?
    } else if streams {
        let sources = open_sources(&handle, &signature, &inputs)?;
        responses::run(args, manager, handle, &inputs, sources, &output, plan).await?
    } else {
        run_tensors(args, manager, handle, &signature, &inputs, &output, plan).await?
    };
    report(args, name, (items, skipped, None), started, output)
}

/// Prints the job's summary: a line for people on stderr, and one JSON line on stdout.
/// `counts`: the items, those an earlier run did, and (a batch file) this run's answers with an
/// error status and the tokens its answers count.
fn report(
    args: &RunArgs,
    model: String,
    counts: (usize, usize, Option<(usize, Tokens)>),
    started: Instant,
    output: PathBuf,
) -> anyhow::Result<()> {
    let (items, skipped, answered) = counts;
    let errors = answered.map(|(errors, _)| errors);
    let seconds = started.elapsed().as_secs_f64();
    let done = items - skipped;
    let summary = Summary {
        model,
        strategy: format!("{:?}", args.strategy).to_lowercase(),
        items,
        skipped,
        seconds,
        items_per_s: done as f64 / seconds.max(1e-9),
        output: output.clone(),
        errors,
        usage: answered.map(|(_, tokens)| tokens.json()),
    };
    eprintln!(
        "sheaf run: {done} items in {seconds:.2} s ({:.1} items/s){}{}; answers in {}",
        summary.items_per_s,
        match errors {
            Some(n) if n > 0 => format!(", {n} answered with an error"),
            _ => String::new(),
        },
        if skipped > 0 {
            format!(", {skipped} done by an earlier run")
        } else {
            String::new()
        },
        output.display()
    );
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

/// The model's folder and name, from `--model` and `--model-repository`.
fn model_folder(args: &RunArgs) -> anyhow::Result<(PathBuf, String)> {
    let folder = match &args.model_repository {
        Some(repo) => repo.join(&args.model),
        None => PathBuf::from(&args.model),
    };
    anyhow::ensure!(
        folder.is_dir(),
        "{} is no model folder (give --model NAME with --model-repository DIR, or --model \
         FOLDER)",
        folder.display()
    );
    let folder = folder.canonicalize()?;
    let name = folder
        .file_name()
        .and_then(|n| n.to_str())
        .context("the model folder has no name")?
        .to_string();
    Ok((folder, name))
}

/// A sampling temperature from 0 to 2.
fn temperature(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(t) if sheaf_backend::generation::Sampling::TEMPERATURES.contains(&t) => Ok(t),
        _ => Err(format!("'{text}' is not a temperature from 0 to 2")),
    }
}

/// `NAME=PATH` or `PATH` (the model's first input, or the prompts of a generation model).
fn parse_inputs(given: &[String], signature: &Signature) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let first = signature
        .inputs
        .first()
        .map_or_else(String::new, |s| s.name.clone());
    let mut inputs = Vec::new();
    for spec in given {
        let (name, path) = match spec.split_once('=') {
            Some((name, path)) if !Path::new(spec).exists() => (name.to_string(), path),
            _ => (first.clone(), spec.as_str()),
        };
        anyhow::ensure!(
            !inputs.iter().any(|(n, _): &(String, PathBuf)| *n == name),
            "input '{name}' is given twice"
        );
        inputs.push((name, PathBuf::from(path)));
    }
    Ok(inputs)
}

/// `DIR/frames.npy` → `DIR/frames.out`.
fn beside(input: &Path) -> PathBuf {
    let stem = input
        .file_stem()
        .map_or_else(|| "sheaf".into(), |s| s.to_string_lossy().into_owned());
    input.with_file_name(format!("{stem}.out"))
}

/// The job's inputs, opened: every input of the model given, each with as many items.
fn open_sources(
    handle: &ModelHandle,
    signature: &Signature,
    inputs: &[(String, PathBuf)],
) -> anyhow::Result<Vec<Source>> {
    let sources = inputs
        .iter()
        .map(|(name, path)| Source::open(handle, signature, name, path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let missing: Vec<&str> = signature
        .inputs
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| !inputs.iter().any(|(given, _)| given == n))
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "model '{}' also takes {missing:?}: give each as --input NAME=PATH",
        handle.name
    );
    let total = sources[0].items();
    for (source, (name, _)) in sources.iter().zip(inputs) {
        anyhow::ensure!(
            source.items() == total,
            "input '{name}' has {} items, and '{}' {total}: every input needs as many",
            source.items(),
            inputs[0].0
        );
    }
    Ok(sources)
}

/// A tensor job; returns (items, items an earlier run did).
async fn run_tensors(
    args: &RunArgs,
    manager: Arc<ModelManager>,
    handle: Arc<ModelHandle>,
    signature: &Signature,
    inputs: &[(String, PathBuf)],
    output: &Path,
    plan: Plan,
) -> anyhow::Result<(usize, usize)> {
    let sources = open_sources(&handle, signature, inputs)?;
    let total = sources[0].items();
    let batching = handle.max_batch_size > 0;
    let chunk = if batching {
        args.batch_size.unwrap_or(handle.max_batch_size)
    } else {
        anyhow::ensure!(
            args.batch_size.unwrap_or(1) == 1,
            "model '{}' does not batch: each request is one item",
            handle.name
        );
        1
    };
    let job = Progress::of(&handle.name, inputs, total);
    let kept = Progress::resume(output, &job, args.restart)?;
    let images: HashMap<String, &'static str> = handle
        .config
        .image_outputs
        .iter()
        .map(|(name, c)| {
            let ext = match c.format {
                ImageFormatConfig::Png => "png",
                ImageFormatConfig::Jpeg => "jpg",
            };
            (name.clone(), ext)
        })
        .collect();
    let names = sources.iter().find_map(Source::names);
    let writer = Outputs::new(output, job, kept, chunk, batching, names, images)?;
    let job = Arc::new(TensorJob {
        manager,
        handle,
        sources,
        first: kept,
        total,
        chunk,
        outputs: args.outputs.clone(),
        classes: args.classes,
        first_output: signature.outputs.first().map(|o| o.name.clone()),
    });
    let chunks = job.chunks();
    let writer = strategy::run(job, writer, Some(chunks), plan).await?;
    writer.finish();
    Ok((total, kept))
}

/// A generation job; returns (prompts, prompts an earlier run did).
async fn run_prompts(
    args: &RunArgs,
    handle: Arc<ModelHandle>,
    inputs: &[(String, PathBuf)],
    output: &Path,
    plan: Plan,
) -> anyhow::Result<(usize, usize)> {
    let [(_, path)] = inputs else {
        anyhow::bail!("a generation model takes one --input: a JSON-lines file of prompts");
    };
    let items = prompts::read(path, &handle, args.max_tokens, args.temperature)?;
    let total = items.len();
    let (writer, done) = prompts::Completions::open(output, args.restart, total)?;
    let size = args
        .batch_size
        .unwrap_or(handle.config.generation.max_seqs as usize);
    let skipped = done.len();
    let groups = prompts::groups(items, &done, size);
    let chunks = groups.len();
    let job = Arc::new(prompts::PromptJob { handle, groups });
    let writer = strategy::run(job, writer, Some(chunks), plan).await?;
    writer.finish(output)?;
    Ok((total, skipped))
}

/// A job from one stream subject to another, until the source has no more (or, with
/// `--follow`, until stopped).
async fn run_stream(
    args: &RunArgs,
    manager: Arc<ModelManager>,
    handle: Arc<ModelHandle>,
    input: String,
    source: stream::StreamUrl,
    plan: Plan,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.inputs.len() == 1,
        "a stream input is the job's only input"
    );
    let sink = args
        .output
        .as_ref()
        .and_then(|o| o.to_str())
        .and_then(stream::StreamUrl::parse)
        .context("a stream input needs a stream output: --output nats://HOST:PORT/SUBJECT")??;
    anyhow::ensure!(
        sink.subject != source.subject,
        "the output subject must differ from the input subject"
    );
    let ack_wait = crate::cli::seconds("--ack-wait", args.ack_wait)
        .ok()
        .filter(|d| d.as_secs() >= 1)
        .context("--ack-wait must be a number of seconds, at least 1")?;
    let consumer = args
        .consumer
        .clone()
        .unwrap_or_else(|| format!("sheaf-run-{}", handle.name));
    anyhow::ensure!(
        sheaf_server::broker::is_token(&consumer),
        "consumer name '{consumer}' may hold only letters, digits, '-' and '_'"
    );
    let chunk = if handle.max_batch_size > 0 {
        args.batch_size.unwrap_or(handle.max_batch_size)
    } else {
        1
    };
    let name = handle.name.clone();
    let stream_plan = stream::StreamPlan {
        input,
        source,
        sink: sink.clone(),
        consumer,
        follow: args.follow,
        ack_wait,
    };
    let (job, writer) =
        stream::open(manager, handle, &stream_plan, chunk, args.outputs.clone()).await?;
    let started = Instant::now();
    let writer = strategy::run(Arc::new(job), writer, None, plan).await?;
    writer.finish();
    let output = PathBuf::from(format!("{}/{}", sink.server, sink.subject));
    report(args, name, (writer.items, 0, None), started, output)
}

/// A job of OpenAI batch requests; returns (requests, requests an earlier run did, (this run's
/// answers with an error status, the tokens its answers count)).
async fn run_batch_file(
    args: &RunArgs,
    manager: Arc<ModelManager>,
    handle: Arc<ModelHandle>,
    inputs: &[(String, PathBuf)],
    output: &Path,
    mut plan: Plan,
) -> anyhow::Result<(usize, usize, (usize, Tokens))> {
    let name = &handle.name;
    let in_flight = if handle.is_generator() {
        handle.config.generation.max_seqs as usize
    } else if handle.is_encoder() {
        handle.max_batch_size.max(1)
    } else {
        anyhow::bail!(
            "model '{name}' is neither a generation model nor a text encoder, so no route of a \
             batch file ({}) answers for it",
            sheaf_server::openai::batch::line::URLS.join(", ")
        );
    };
    anyhow::ensure!(
        args.batch_size.is_none() && args.classes.is_none(),
        "a batch file's requests are each one request, answered whole: leave out --batch-size \
         and --classes"
    );
    let [(_, path)] = inputs else {
        anyhow::bail!("a batch file is the job's only --input");
    };
    let requests = batch_file::read(path, name)?;
    let total = requests.len();
    let job = Progress::of(name, inputs, total);
    let kept = Progress::resume(output, &job, args.restart)?;
    let writer = batch_file::Answers::open(output, job, kept)?;
    plan.concurrency = args.max_concurrent_batches.unwrap_or(2 * in_flight);
    let routes = sheaf_server::openai::routes().with_state(sheaf_server::AppState::new(manager));
    let job = Arc::new(batch_file::BatchJob {
        routes,
        requests,
        first: kept,
    });
    let writer = strategy::run(job, writer, Some(total - kept), plan).await?;
    let answered = writer.finish()?;
    Ok((total, kept, answered))
}
