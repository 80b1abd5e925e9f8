//! `sheaf bench`: a load tool for any KServe v2 server (sheaf, Triton, KServe runtimes).
//!
//! Load patterns (see [`load`]):
//! - closed loop at each `--concurrency` level (the default);
//! - `--request-rate R`: Poisson arrivals, open loop, so queueing shows;
//! - `--streams N --fps F`: fixed-rate streams (`--sequences`: each one a sequence of a
//!   stateful model);
//! - `--burst N`;
//! - `--users U --requests-per-user R`.
//!
//! Each request carries `--items` items. Inputs are random, or frames read from `--input-file`,
//! and `--start`/`--count` pick a frame range. For a model that takes inputs of any length
//! past the batch dimension (ragged batching, padding), `--lengths MIN-MAX` gives each request
//! a length drawn at random. Transport is HTTP (binary or JSON tensors) or
//! gRPC; either way each request is encoded once and its tensors are not copied per call (see
//! [`grpc_call`]). It reports throughput, p50/p90/p95/p99/max latency, errors by kind, and, under
//! each level, the server's own account of a request's time by stage (receive, queue, input,
//! wait, infer, output, reply, send, and what no stage covers) beside the client's p50, read
//! from the server's statistics endpoint. It can write JSON, CSV and an SVG plot. With `--in-process`, the same ONNX file first runs in-process, and
//! the table also gives served/in-process throughput, and the served compute against one
//! in-process batch at the mean batch size the level formed ([`report::compute_line`]); after
//! the levels the loop runs once more at its best batch size, and the change says how far the
//! machine itself drifted while they ran. `--alternate N` measures each concurrency level in N
//! rounds, each right after the loop ran again, and gives the median of the paired ratios
//! ([`report::paired_line`]). With
//! `--generate`, the model is a
//! generation model behind OpenAI-compatible routes (see [`generate`]); with `--embed`, a text
//! encoder behind `/v1/embeddings` (see [`embed`]).

mod embed;
mod generate;
mod grpc_call;
mod load;
mod report;
mod transport;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde_json::Value;
use sheaf_backend::{DataType, Tensor};

use load::Limits;
use report::Level;
use transport::{random_bytes, Frame, Transport};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Server base URL (HTTP; with --protocol grpc, the gRPC address, e.g. http://127.0.0.1:8001).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// HTTP URL for metadata and statistics when --url is gRPC (default: --url).
    #[arg(long)]
    pub http_url: Option<String>,
    /// Key sent as `Authorization: Bearer KEY` (gRPC: `authorization` metadata) to a server
    /// started with --api-key; statistics need the admin key.
    #[arg(long, env = "SHEAF_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A header sent with every request, `NAME:VALUE` (gRPC: metadata), e.g. the one a
    /// restricted API group needs: `--header infer-key:SECRET` over HTTP,
    /// `--header triton-grpc-protocol-infer-key:SECRET` over gRPC. May be given more than once.
    #[arg(long = "header", value_name = "NAME:VALUE")]
    pub headers: Vec<String>,
    /// Model to load.
    #[arg(long)]
    pub model: String,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Protocol::Http)]
    pub protocol: Protocol,
    /// How tensors travel over HTTP.
    #[arg(long, value_enum, default_value_t = Encoding::Binary)]
    pub encoding: Encoding,
    /// Closed-loop concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64", value_parser = crate::cli::count_at_once)]
    pub concurrency: Vec<usize>,
    /// Open loop: Poisson arrivals at these rates (requests/s), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_rate)]
    pub request_rate: Vec<f64>,
    /// Open loop: this many streams, each sending `--fps` requests per second; a
    /// comma-separated list runs one level per count.
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::count_at_once)]
    pub streams: Vec<usize>,
    /// With --streams: each stream is one sequence of a stateful model (`sequence_id`, with
    /// `sequence_start` on its first request), as a camera or microphone stream is (HTTP).
    #[arg(long)]
    pub sequences: bool,
    /// Frames per second per stream (with --streams).
    #[arg(long, default_value_t = 25.0, value_parser = parse_rate)]
    pub fps: f64,
    /// Send this many requests at once (at most --max-outstanding of them in flight).
    #[arg(long, value_parser = crate::cli::count_at_once)]
    pub burst: Option<usize>,
    /// Open loops (--request-rate, --streams, --burst): the most requests in flight at once.
    /// An arrival past it waits for one to finish, and the level says how many waited.
    #[arg(long, default_value_t = 1024, value_parser = crate::cli::count_at_once)]
    pub max_outstanding: usize,
    /// This many users, each sending --requests-per-user requests one after another.
    #[arg(long, value_parser = crate::cli::count_at_once)]
    pub users: Option<usize>,
    #[arg(long, default_value_t = 5, value_parser = parse_count)]
    pub requests_per_user: usize,
    /// Seconds per level (default 5). With --generate, a level without --requests or this
    /// runs twice its concurrency in requests; with this, its clients send until it has passed.
    #[arg(long, value_parser = parse_seconds)]
    pub duration: Option<f64>,
    /// Stop each level after this many requests instead of after --duration.
    #[arg(long, value_parser = parse_count)]
    pub requests: Option<usize>,
    /// Items (dimension 0) per request (at most 2^20).
    #[arg(long, default_value_t = 1, value_parser = crate::cli::count_at_once)]
    pub items: usize,
    /// For a model whose inputs have a dynamic dimension past the batch dimension (ragged
    /// batching, padding): each request's length there, drawn at random from MIN-MAX (`N`:
    /// always N), the same for every such dimension of the request. Random inputs only.
    #[arg(long, value_parser = parse_lengths, conflicts_with_all = ["input_file", "image", "in_process"])]
    pub lengths: Option<(usize, usize)>,
    /// Raw little-endian input data (the first input's item after item, C order); requests
    /// take consecutive frames from it. Default: random data.
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// An encoded image (JPEG, PNG, WebP) sent as the BYTES data of the model's first input,
    /// --items copies per request, for a model whose config decodes images there.
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Ask for the first output's top K classes (Triton's classification extension).
    #[arg(long)]
    pub classes: Option<usize>,
    /// First frame to send.
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Frames to send in all (each request carries --items of them); implies --requests.
    #[arg(long, value_parser = parse_count)]
    pub count: Option<usize>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the results as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw latency percentiles against throughput across the levels (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Also run this ONNX file in-process at each of --batch-sizes and report served/in-process
    /// (with --generate: a GGUF file, run on an in-process engine at each concurrency level;
    /// with --embed: a model folder with its tokenizer and `embedding` config).
    #[arg(long)]
    pub in_process: Option<PathBuf>,
    /// Batch sizes for the in-process run.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64", value_parser = parse_count)]
    pub batch_sizes: Vec<usize>,
    /// With --in-process: measure each concurrency level in this many rounds, each one right
    /// after the in-process loop has run again at its best batch size for --duration, and
    /// report each round's served/in-process beside the other's figure of that moment, then
    /// their median. On a machine whose speed drifts from minute to minute (a virtual
    /// machine's cores), this pairs figures taken seconds apart.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub alternate: u32,
    /// ONNX Runtime intra-op threads for the in-process run; default: the served model's (its
    /// folder's config, when --in-process names a file in a model folder, else 1).
    #[arg(long)]
    pub intra_op_threads: Option<usize>,
    /// The ONNX Runtime library for the in-process run, as `sheaf serve --onnxruntime-lib`
    /// takes it (default: $ORT_DYLIB_PATH, else the project's .venv).
    #[arg(long, env = "SHEAF_ONNXRUNTIME_LIB")]
    pub onnxruntime_lib: Option<PathBuf>,
    /// Device of the in-process run: `cpu` or `cuda:N` (on CUDA, each batch size runs in a
    /// session of its own, as sheaf serves it there).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: sheaf_backend::Device,
    /// Load a generation model over the OpenAI-compatible routes (streamed chat completions),
    /// reporting tokens/s, time to first token and inter-token latency per concurrency level.
    /// --requests sets the requests per level (default: twice the concurrency).
    #[arg(long)]
    pub generate: bool,
    /// Load a text encoder over `/v1/embeddings`, one sentence per request, reporting
    /// sentences/s and p50/p99 latency per concurrency level.
    #[arg(long, conflicts_with = "generate")]
    pub embed: bool,
    /// With --embed: the share of requests (0 to 1) that repeat one of the 64 sentences; the
    /// others send a sentence no request sent before. 1 (the default) cycles over the 64.
    #[arg(long, default_value_t = 1.0, value_parser = parse_share)]
    pub repeat_rate: f64,
    /// Most tokens per generated answer (with --generate).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// A system prompt every generated request starts with (with --generate), to measure what
    /// a shared prefix saves.
    #[arg(long)]
    pub system: Option<String>,
}

impl BenchArgs {
    /// Seconds per level: `--duration`, else 5.
    pub fn seconds(&self) -> f64 {
        self.duration.unwrap_or(5.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Encoding {
    Json,
    Binary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Http,
    Grpc,
}

/// One input of the model, shaped for one request.
#[derive(Clone)]
pub struct InputShape {
    name: String,
    dtype: DataType,
    shape: Vec<usize>,
    /// The dimensions past the batch dimension of any size, which `--lengths` sets.
    dynamic: Vec<usize>,
}

impl InputShape {
    /// Its shape for a request whose dynamic dimensions are `length` long.
    fn with_length(&self, length: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        for &d in &self.dynamic {
            shape[d] = length;
        }
        shape
    }
}

/// Requests made with `--lengths`: this many, each of its own length.
const LENGTH_FRAMES: u64 = 64;

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.generate {
        return generate::run(&args).await;
    }
    if args.embed {
        return embed::run(&args).await;
    }
    let client = crate::client::http_client(args.api_key.as_deref(), &args.headers)?;
    let metadata = crate::client::headers(args.api_key.as_deref(), &args.headers)?;
    let http = args.http_url.clone().unwrap_or_else(|| args.url.clone());
    let meta: Value = client
        .get(format!("{http}/v2/models/{}", args.model))
        .send()
        .await
        .with_context(|| format!("cannot reach {http}"))?
        .error_for_status()?
        .json()
        .await?;
    let image = match &args.image {
        Some(path) => Some(transport::ImageRequest {
            input: meta["inputs"][0]["name"]
                .as_str()
                .context("model metadata has no inputs")?
                .to_string(),
            shape: image_shape(&meta["inputs"][0], args.items),
            image: {
                let image = std::fs::read(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                fits_in_memory(
                    (image.len() as u64).checked_mul(args.items as u64),
                    "one request's images",
                )?;
                Bytes::from(image)
            },
            classes: args
                .classes
                .zip(meta["outputs"][0]["name"].as_str().map(String::from)),
        }),
        None => None,
    };
    let transport = match (&image, args.protocol) {
        (Some(image), Protocol::Http) => Transport::http_image(
            client.clone(),
            format!("{}/v2/models/{}/infer", args.url, args.model),
            image,
        ),
        (Some(image), Protocol::Grpc) => {
            Transport::grpc_image(&args.url, &args.model, image, metadata).await?
        }
        (None, _) => {
            let inputs = input_shapes(&meta, args.items, args.lengths.is_some())?;
            let frames = match args.lengths {
                Some(lengths) => frames_of_lengths(&inputs, lengths)?,
                None => frames(&inputs, &args)?,
            };
            match args.protocol {
                Protocol::Http => Transport::http(
                    client.clone(),
                    format!("{}/v2/models/{}/infer", args.url, args.model),
                    &inputs,
                    &frames,
                    args.encoding,
                    args.sequences,
                ),
                Protocol::Grpc => {
                    Transport::grpc(&args.url, &args.model, &inputs, &frames, metadata).await?
                }
            }
        }
    };
    let in_process = |batch_sizes: Vec<usize>, loud: bool| {
        let run = InProcess {
            batch_sizes,
            threads: args.intra_op_threads,
            seconds: args.seconds(),
            device: args.device,
            library: args.onnxruntime_lib.clone(),
        };
        let (path, inputs) = (args.in_process.clone(), input_shapes(&meta, 1, false));
        async move {
            let Some(path) = path else {
                return Ok(None);
            };
            let inputs = inputs?;
            tokio::task::spawn_blocking(move || in_process_curve(&path, &inputs, run, loud))
                .await?
                .map(Some)
        }
    };
    let curve: Option<Vec<(usize, f64)>> = in_process(args.batch_sizes.clone(), true).await?;
    let stats_url = format!("{http}/v2/models/{}/stats", args.model);
    let read_stats = || async {
        let body: Option<Value> = client.get(&stats_url).send().await.ok()?.json().await.ok();
        body.as_ref().and_then(report::reading)
    };
    let limits = Limits {
        duration: Duration::from_secs_f64(args.seconds()),
        requests: args.count.map(|c| c.div_ceil(args.items)).or(args.requests),
        start: args.start,
        outstanding: args.max_outstanding,
    };
    println!(
        "sheaf bench: model {} at {} over {:?}{}, {} item(s) per request",
        args.model,
        args.url,
        args.protocol,
        if args.protocol == Protocol::Http {
            format!(" ({:?} tensors)", args.encoding)
        } else {
            String::new()
        },
        args.items
    );
    report::print_header();
    // One closed-loop level of `c` clients, with the server's statistics around it.
    let closed_level = |c: usize| {
        let (transport, read_stats) = (&transport, &read_stats);
        async move {
            let before = read_stats().await;
            let s = load::closed(transport, c, limits).await;
            Level::new(
                "concurrency",
                c as f64,
                &s,
                args.items,
                before.as_ref(),
                read_stats().await.as_ref(),
            )
        }
    };
    let mut levels = Vec::new();
    let mut measure = |level: Level| {
        report::print_row(&level);
        report::print_stages(&level);
        if let Some(curve) = &curve {
            if let Some((batch, items_s)) = best(curve) {
                println!("{:>12} served/in-process: {:.2} (in-process best {items_s:.1} items/s at batch {batch})", "", level.items_per_s / items_s);
            }
            if let Some(line) = report::compute_line(&level, curve) {
                println!("{line}");
            }
        }
        levels.push(level);
    };
    if let Some(n) = args.burst {
        let before = read_stats().await;
        let s = load::burst(&transport, n, limits).await;
        measure(Level::new(
            "burst",
            n as f64,
            &s,
            args.items,
            before.as_ref(),
            read_stats().await.as_ref(),
        ));
    } else if let Some(u) = args.users {
        let before = read_stats().await;
        let s = load::users(&transport, u, args.requests_per_user, args.start).await;
        measure(Level::new(
            "users",
            u as f64,
            &s,
            args.items,
            before.as_ref(),
            read_stats().await.as_ref(),
        ));
    } else if !args.streams.is_empty() {
        if args.sequences && args.protocol != Protocol::Http {
            anyhow::bail!("--sequences sends its requests over HTTP: leave out --protocol grpc");
        }
        // Ids no earlier run used, so that every level opens its own sequences.
        let mut first_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64)
            * 1000;
        for &n in &args.streams {
            let before = read_stats().await;
            let sequences = args.sequences.then_some(first_id);
            first_id += n as u64;
            let s = load::streams(&transport, n, args.fps, limits, sequences).await;
            measure(Level::new(
                "streams",
                n as f64,
                &s,
                args.items,
                before.as_ref(),
                read_stats().await.as_ref(),
            ));
        }
    } else if !args.request_rate.is_empty() {
        for &r in &args.request_rate {
            let before = read_stats().await;
            let s = load::rate(&transport, r, limits).await;
            measure(Level::new(
                "rate",
                r,
                &s,
                args.items,
                before.as_ref(),
                read_stats().await.as_ref(),
            ));
        }
    } else if let (true, Some((batch, _))) = (args.alternate > 1, curve.as_deref().and_then(best)) {
        for &c in &args.concurrency {
            let mut pairs = Vec::with_capacity(args.alternate as usize);
            for round in 1..=args.alternate {
                let Some(&(_, reference)) = in_process(vec![batch], false)
                    .await?
                    .as_deref()
                    .and_then(<[(usize, f64)]>::first)
                else {
                    bail!("the in-process loop at batch {batch} gave no figure");
                };
                let level = closed_level(c).await;
                pairs.push((level.items_per_s, reference));
                measure(level);
                println!(
                    "{:>12} round {round}: the loop just before at batch {batch}: {reference:.1} items/s; served/in-process {:.2}",
                    "",
                    pairs[pairs.len() - 1].0 / reference
                );
            }
            println!("{}", report::paired_line(c, batch, &pairs));
        }
    } else {
        for &c in &args.concurrency {
            measure(closed_level(c).await);
        }
    }
    // The same loop once more after the levels: how far the machine itself moved while they
    // ran, which each served/in-process figure above carries as well.
    if let Some((batch, before)) = curve.as_deref().and_then(best) {
        if let Some(again) = in_process(vec![batch], false).await? {
            if let Some(&(_, after)) = again.first() {
                println!(
                    "in-process at batch {batch} again after the levels: {after:.1} items/s \
                     ({:+.1}% against before); the ratios above carry that much of the \
                     machine's own drift",
                    (after / before - 1.0) * 100.0
                );
            }
        }
    }
    if let Some(path) = &args.json {
        report::write_json(path, &levels)?;
    }
    if let Some(path) = &args.csv {
        report::write_csv(path, &levels)?;
    }
    if let Some(path) = &args.plot {
        report::plot(
            path,
            &levels,
            &format!("{}: latency against throughput", args.model),
        )?;
    }
    Ok(())
}

/// The shape of `items` encoded images sent to an input: a BYTES input of the model's own
/// (a Python model's, a pipeline's) gets its dimensions after the first, a dynamic one as 1, so
/// that `[-1, 1]` takes `[items, 1]`; an input the server decodes images into (`image_inputs`,
/// whose metadata gives the pixels' shape) takes the images as `[items]`.
fn image_shape(input: &Value, items: usize) -> Vec<i64> {
    let mut shape = vec![items as i64];
    if input["datatype"] == "BYTES" {
        let dims = input["shape"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        shape.extend(
            dims.iter()
                .skip(1)
                .map(|d| d.as_i64().filter(|&d| d > 0).unwrap_or(1)),
        );
    }
    shape
}

/// The model's inputs from its metadata, shaped for requests of `items`; with `lengths`, a
/// dynamic dimension past the batch dimension is left to each request (else refused).
fn input_shapes(meta: &Value, items: usize, lengths: bool) -> anyhow::Result<Vec<InputShape>> {
    let inputs = meta["inputs"]
        .as_array()
        .context("model metadata has no inputs")?;
    inputs
        .iter()
        .map(|i| {
            let name = i["name"]
                .as_str()
                .context("input without a name")?
                .to_string();
            let datatype = i["datatype"].as_str().unwrap_or_default();
            anyhow::ensure!(
                datatype != "BYTES",
                "input '{name}' takes BYTES, which sheaf bench sends as encoded images: give \
                 --image FILE"
            );
            let dtype = DataType::parse(datatype)
                .with_context(|| format!("input '{name}': unsupported datatype {datatype:?}"))?;
            let dims = i["shape"].as_array().context("input without a shape")?;
            let mut dynamic = Vec::new();
            let shape = dims
                .iter()
                .enumerate()
                .map(|(d, v)| {
                    let n = v
                        .as_i64()
                        .or_else(|| v.as_str().and_then(|s| s.parse().ok()));
                    match n {
                        Some(-1) if d == 0 => Ok(items),
                        Some(-1) if lengths => {
                            dynamic.push(d);
                            Ok(1)
                        }
                        Some(n) if n >= 0 => Ok(n as usize),
                        _ => bail!(
                            "input {name} has a dynamic dimension {d}: give each request's length \
                             there with --lengths MIN-MAX"
                        ),
                    }
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(InputShape {
                name,
                dtype,
                shape,
                dynamic,
            })
        })
        .collect()
}

/// Request payloads: frames read from --input-file (first input; other inputs random), or 16
/// random payloads.
fn frames(inputs: &[InputShape], args: &BenchArgs) -> anyhow::Result<Vec<Frame>> {
    let sizes: Option<Vec<usize>> = inputs
        .iter()
        .map(|i| {
            i.shape
                .iter()
                .try_fold(i.dtype.size(), |bytes, &d| bytes.checked_mul(d))
        })
        .collect();
    let request = sizes
        .as_ref()
        .and_then(|s| s.iter().try_fold(0usize, |all, &b| all.checked_add(b)));
    let payloads = match (&args.input_file, args.count) {
        (None, _) => Some(16),
        (Some(_), Some(count)) => Some(count.div_ceil(args.items)),
        // A file's frames are counted once it is read (its size bounds them).
        (Some(_), None) => Some(1),
    };
    fits_in_memory(
        request
            .zip(payloads)
            .and_then(|(r, n)| (r as u64).checked_mul(n as u64)),
        "the requests' payloads",
    )?;
    let sizes = sizes.unwrap_or_default();
    let Some(path) = &args.input_file else {
        return Ok((0..16u64)
            .map(|f| {
                inputs
                    .iter()
                    .enumerate()
                    .map(|(k, i)| {
                        let bytes =
                            random_bytes(i.dtype, sizes[k] / i.dtype.size(), f * 31 + k as u64);
                        (i.shape.clone(), bytes)
                    })
                    .collect()
            })
            .collect());
    };
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let item = sizes.first().copied().unwrap_or(0) / args.items.max(1);
    if item == 0 || data.len() < item {
        bail!(
            "{} holds {} bytes, less than one item ({item} bytes)",
            path.display(),
            data.len()
        );
    }
    let available = data.len() / item;
    let count = args.count.unwrap_or(available).div_ceil(args.items).max(1);
    Ok((0..count)
        .map(|r| {
            let mut frame: Frame = inputs
                .iter()
                .enumerate()
                .skip(1)
                .map(|(k, i)| {
                    let bytes = random_bytes(i.dtype, sizes[k] / i.dtype.size(), k as u64);
                    (i.shape.clone(), bytes)
                })
                .collect();
            let first: Vec<u8> = (0..args.items)
                .flat_map(|j| {
                    let f = args.start.wrapping_add(r * args.items + j) % available;
                    data[f * item..(f + 1) * item].to_vec()
                })
                .collect();
            frame.insert(0, (inputs[0].shape.clone(), first));
            frame
        })
        .collect())
}

/// Requests of random inputs, each with its dynamic dimensions of one length drawn from
/// `min..=max` (the same draws on every run).
fn frames_of_lengths(
    inputs: &[InputShape],
    (min, max): (usize, usize),
) -> anyhow::Result<Vec<Frame>> {
    use rand::{Rng, SeedableRng};
    if inputs.iter().all(|i| i.dynamic.is_empty()) {
        bail!("--lengths: the model's inputs have no dynamic dimension past the batch dimension");
    }
    let longest: Option<u64> = inputs.iter().try_fold(0u64, |all, i| {
        let elements = i
            .with_length(max)
            .iter()
            .try_fold(i.dtype.size() as u64, |n, &d| n.checked_mul(d as u64))?;
        all.checked_add(elements)
    });
    fits_in_memory(
        longest.and_then(|r| r.checked_mul(LENGTH_FRAMES)),
        "the requests' payloads",
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(LENGTH_FRAMES);
    Ok((0..LENGTH_FRAMES)
        .map(|f| {
            let length = rng.random_range(min..=max);
            inputs
                .iter()
                .enumerate()
                .map(|(k, i)| {
                    let shape = i.with_length(length);
                    let n = shape.iter().product();
                    (shape, random_bytes(i.dtype, n, f * 31 + k as u64))
                })
                .collect()
        })
        .collect())
}

/// Refuses `bytes` of payloads (`None`: more than a number can hold) that take more memory than
/// the host has available, before any of it is made.
fn fits_in_memory(bytes: Option<u64>, what: &str) -> anyhow::Result<()> {
    let available = sheaf_core::available_memory();
    match (bytes, available) {
        (Some(b), Some(a)) if b <= a => Ok(()),
        (Some(_), None) => Ok(()),
        (_, Some(a)) => bail!(
            "{what} take more memory than the {} MiB this host has available: lower --items or --count",
            a >> 20
        ),
        (None, None) => bail!("{what} take more bytes than a number holds: lower --items or --count"),
    }
}

/// What the in-process reference runs.
struct InProcess {
    batch_sizes: Vec<usize>,
    threads: Option<usize>,
    seconds: f64,
    device: sheaf_backend::Device,
    library: Option<PathBuf>,
}

/// The load spec the server would use for the ONNX file at `path` on `device`: from the
/// configuration of the model folder it sits in (`NAME/VERSION/model.onnx`), else the defaults.
pub(crate) fn served_spec(
    path: &std::path::Path,
    device: sheaf_backend::Device,
    threads: Option<usize>,
) -> anyhow::Result<sheaf_backend::LoadSpec> {
    let folder = path
        .parent()
        .filter(|v| {
            v.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .and_then(std::path::Path::parent);
    let config = match folder {
        Some(folder) => {
            let name = folder
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("model");
            sheaf_core::repository::read_config(name, folder, None).map_err(anyhow::Error::msg)?
        }
        None => sheaf_core::ModelConfig::default(),
    };
    Ok(config.load_spec(path, device, threads))
}

/// The best of an in-process curve: (batch size, items/s).
fn best(curve: &[(usize, f64)]) -> Option<(usize, f64)> {
    curve.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))
}

/// Runs the model in-process at each batch size, loaded as the server loads it and timed as
/// the server's `auto` probe times it; returns each (batch size, items/s).
fn in_process_curve(
    path: &std::path::Path,
    inputs: &[InputShape],
    run: InProcess,
    loud: bool,
) -> anyhow::Result<Vec<(usize, f64)>> {
    let library = sheaf_onnx::library::locate(run.library.as_deref())?;
    sheaf_onnx::init(&library)?;
    let spec = served_spec(path, run.device, run.threads)?;
    let mut model = sheaf_backend::Backend::load(&sheaf_onnx::OnnxBackend::default(), &spec)?;
    let duration = Duration::from_secs_f64(run.seconds);
    if loud {
        println!(
            "in-process: {} on ONNX Runtime ({:?}), {} intra-op thread(s), {} session per batch size, \
             as the server loads it",
            path.display(),
            spec.device,
            spec.intra_op_threads,
            if spec.session_per_batch_size {
                "a"
            } else {
                "no"
            }
        );
        println!("{:>11} {:>12} {:>12}", "batch size", "batches/s", "items/s");
    }
    let mut curve = Vec::with_capacity(run.batch_sizes.len());
    for &b in &run.batch_sizes {
        let tensors = batch_of(inputs, b)?;
        let items_s = sheaf_core::batcher::prepare::throughput(model.as_mut(), &tensors, duration)?;
        if loud {
            println!("{:>11} {:>12.1} {:>12.1}", b, items_s / b as f64, items_s);
        }
        curve.push((b, items_s));
    }
    if let (true, Some((batch, items_s))) = (loud, best(&curve)) {
        println!("in-process best: {items_s:.1} items/s at batch size {batch}\n");
    }
    Ok(curve)
}

/// One batch of `b` items of random values for `inputs`.
fn batch_of(inputs: &[InputShape], b: usize) -> anyhow::Result<Vec<Tensor>> {
    let tensors = inputs
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let mut shape = i.shape.clone();
            shape[0] = b;
            let n: usize = shape.iter().product();
            Tensor::new(
                i.dtype,
                shape,
                Bytes::from(random_bytes(i.dtype, n, 17 + k as u64)),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(tensors)
}

/// `cpu` or `cuda:N`.
fn parse_device(text: &str) -> Result<sheaf_backend::Device, String> {
    match text.split_once(':') {
        None if text == "cpu" => Ok(sheaf_backend::Device::Cpu),
        Some(("cuda", id)) => id
            .parse()
            .map(sheaf_backend::Device::Cuda)
            .map_err(|_| format!("'{text}': the CUDA device id must be a number")),
        _ => Err(format!("'{text}' is not a device: use cpu or cuda:N")),
    }
}

/// A count of one or more (clients, requests, items, a batch size).
fn parse_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err("0: it must be at least 1".into()),
        Err(e) => Err(format!("'{text}': {e}")),
    }
}

/// `MIN-MAX` (or `N`): lengths from 1 up, MIN at most MAX, at most 2^24.
fn parse_lengths(text: &str) -> Result<(usize, usize), String> {
    let (min, max) = text.split_once('-').unwrap_or((text, text));
    let parse = |t: &str| -> Result<usize, String> {
        match t.trim().parse::<usize>() {
            Ok(n) if (1..=1 << 24).contains(&n) => Ok(n),
            _ => Err(format!(
                "'{text}' is not a length or a range of lengths (MIN-MAX, from 1 to {})",
                1 << 24
            )),
        }
    };
    let (min, max) = (parse(min)?, parse(max)?);
    if min > max {
        return Err(format!("'{text}': MIN is above MAX"));
    }
    Ok((min, max))
}

/// A rate per second above zero.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "'{text}' is not a rate above zero (a number per second)"
        )),
    }
}

/// Seconds above zero, at most [`crate::cli::MAX_SECONDS`].
fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= crate::cli::MAX_SECONDS => Ok(v),
        _ => Err(format!(
            "'{text}' is not a number of seconds above zero, at most {}",
            crate::cli::MAX_SECONDS
        )),
    }
}

/// A share between 0 and 1.
fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{text} is not a share between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_backend::Device;

    /// A level of nothing, a rate of none and no time at all are refused before anything is
    /// sent, naming the flag: measured, each would print a row of NaN or stop on a division.
    #[test]
    fn levels_rates_and_durations_of_nothing_are_refused() {
        use clap::Parser;
        let parse = |flags: &[&str]| {
            let mut args = vec!["sheaf", "bench", "--model", "m"];
            args.extend(flags);
            crate::cli::Cli::try_parse_from(args).map_err(|e| e.to_string())
        };
        for flags in [
            &["--concurrency", "1,0"][..],
            &["--streams", "0"],
            &["--burst", "0"],
            &["--users", "0"],
            &["--users", "2", "--requests-per-user", "0"],
            &["--requests", "0"],
            &["--items", "0"],
            &["--count", "0"],
            &["--batch-sizes", "0,8"],
        ] {
            let error = parse(flags).unwrap_err();
            assert!(error.contains(flags[flags.len() - 2]), "{flags:?}: {error}");
            assert!(
                error.contains("at least 1") || error.contains("from 1 to"),
                "{flags:?}: {error}"
            );
        }
        for flags in [
            &["--request-rate", "0"][..],
            &["--request-rate", "10,inf"],
            &["--request-rate", "NaN"],
            &["--streams", "2", "--fps", "0"],
        ] {
            let error = parse(flags).unwrap_err();
            assert!(
                error.contains("not a rate above zero"),
                "{flags:?}: {error}"
            );
        }
        for flag in [
            "--concurrency",
            "--streams",
            "--burst",
            "--users",
            "--max-outstanding",
            "--items",
        ] {
            let error = parse(&[flag, "1048577"]).unwrap_err();
            assert!(error.contains("from 1 to 1048576"), "{flag}: {error}");
            assert!(parse(&[flag, "1048576"]).is_ok(), "{flag}");
        }
        for seconds in ["0", "-1", "1e30", "1e19", "x"] {
            let error = parse(&[&format!("--duration={seconds}")]).unwrap_err();
            assert!(
                error.contains("not a number of seconds"),
                "{seconds}: {error}"
            );
        }
        assert!(parse(&[
            "--concurrency",
            "1,8",
            "--request-rate",
            "0.5",
            "--duration",
            "0.1"
        ])
        .is_ok());
    }

    /// `--lengths` gives each request one length for every dynamic dimension past the batch
    /// dimension, drawn from its range; without it such an input is refused, naming the flag.
    #[test]
    fn requests_take_lengths_drawn_from_the_range_for_their_dynamic_dimensions() {
        assert_eq!(parse_lengths("3-9"), Ok((3, 9)));
        assert_eq!(parse_lengths("5"), Ok((5, 5)));
        for bad in ["0-4", "9-3", "x", "1-", "1-16777217"] {
            assert!(parse_lengths(bad).is_err(), "{bad}");
        }
        let meta = serde_json::json!({"inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
            {"name": "x", "datatype": "FP32", "shape": [-1, -1, 2]},
            {"name": "k", "datatype": "INT32", "shape": [-1, 1]},
        ]});
        let error = input_shapes(&meta, 2, false).err().unwrap().to_string();
        assert!(error.contains("--lengths MIN-MAX"), "{error}");
        let inputs = input_shapes(&meta, 2, true).unwrap();
        let frames = frames_of_lengths(&inputs, (3, 9)).unwrap();
        assert_eq!(frames.len(), LENGTH_FRAMES as usize);
        let mut seen = std::collections::BTreeSet::new();
        for frame in &frames {
            let [(ids, ids_bytes), (x, x_bytes), (k, _)] = frame.as_slice() else {
                panic!("three inputs");
            };
            let n = ids[1];
            assert!((3..=9).contains(&n), "{n}");
            assert_eq!(
                (ids.as_slice(), x.as_slice()),
                (&[2, n][..], &[2, n, 2][..])
            );
            assert_eq!(k, &[2, 1]);
            assert_eq!((ids_bytes.len(), x_bytes.len()), (2 * n * 8, 2 * n * 2 * 4));
            seen.insert(n);
        }
        // 64 draws of 7 lengths: each is all but sure to come.
        assert_eq!(seen.len(), 7, "{seen:?}");
        let fixed =
            serde_json::json!({"inputs": [{"name": "k", "datatype": "INT32", "shape": [-1, 1]}]});
        let error = frames_of_lengths(&input_shapes(&fixed, 1, true).unwrap(), (1, 2))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("no dynamic dimension"), "{error}");
    }

    /// The in-process reference loads a file as the server loads it: from its model folder's
    /// configuration, with the CUDA options the server would use.
    #[test]
    fn the_in_process_reference_takes_the_served_models_options() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("effnet/1/model.onnx");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"").unwrap();
        std::fs::write(
            dir.path().join("effnet/config.yaml"),
            "intra_op_threads: 2\ncuda: {use_tf32: false}\n",
        )
        .unwrap();
        let config =
            sheaf_core::repository::read_config("effnet", &dir.path().join("effnet"), None)
                .unwrap();
        for device in [Device::Cpu, Device::Cuda(0)] {
            let spec = served_spec(&file, device, None).unwrap();
            assert_eq!(spec, config.load_spec(&file, device, None));
            assert_eq!(spec.intra_op_threads, 2);
            assert!(!spec.cuda.tf32);
            assert_eq!(spec.session_per_batch_size, device != Device::Cpu);
            // On a GPU the backend binds by the size of an item; on the CPU never.
            let binding = (device == Device::Cpu).then_some(false);
            assert_eq!(spec.io_binding, binding);
        }
        // --intra-op-threads overrides the config; a file outside a model folder takes the
        // defaults (TF32 on, as the server's default).
        assert_eq!(
            served_spec(&file, Device::Cpu, Some(1))
                .unwrap()
                .intra_op_threads,
            1
        );
        let loose = dir.path().join("model.onnx");
        let spec = served_spec(&loose, Device::Cuda(0), None).unwrap();
        assert!(spec.cuda.tf32 && spec.intra_op_threads == 1);
    }

    /// Payloads the host could not hold, or that no number counts, are refused before any is
    /// made (`--count` past what memory holds hung the bench filling it).
    #[test]
    fn payloads_past_the_host_s_memory_are_refused() {
        assert!(fits_in_memory(Some(1 << 20), "x").is_ok());
        let error = fits_in_memory(Some(u64::MAX), "the payloads").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the payloads take more memory than the"),
            "{error}"
        );
        assert!(fits_in_memory(None, "the payloads").is_err());
    }
}
