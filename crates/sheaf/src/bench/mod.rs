//! `sheaf bench`: load against a KServe v2 HTTP server.
//!
//! - Closed loop (default): each concurrency level runs `C` clients that send one request, wait
//!   for the answer and send the next, for `--duration` seconds. With `--in-process`, the same
//!   ONNX file first runs in-process on ONNX Runtime, so one run prints served against in-process
//!   throughput.
//! - `--streams N --fps F` (open loop): N streams each send a frame every 1/F seconds.
//! - `--burst N`: N requests at the same instant; reports the last user's latency.
//!
//! Inputs are random, shaped from the model's metadata (dimension 0 = `--items`).

mod open;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use sheaf_backend::{DataType, Model, Tensor};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Server base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model to load.
    #[arg(long)]
    pub model: String,
    /// Concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub concurrency: Vec<usize>,
    /// Seconds per level.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Items (dimension 0) per request.
    #[arg(long, default_value_t = 1)]
    pub items: usize,
    /// How tensors travel.
    #[arg(long, value_enum, default_value_t = Encoding::Binary)]
    pub encoding: Encoding,
    /// Also run this ONNX file in-process at each of --batch-sizes and report served/in-process.
    #[arg(long)]
    pub in_process: Option<PathBuf>,
    /// Batch sizes for the in-process run.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub batch_sizes: Vec<usize>,
    /// ONNX Runtime intra-op threads for the in-process run (match the served model's).
    #[arg(long, default_value_t = 1)]
    pub intra_op_threads: usize,
    /// Open loop: this many streams, each sending `--fps` requests per second.
    #[arg(long)]
    pub streams: Option<usize>,
    /// Frames per second per stream (with --streams).
    #[arg(long, default_value_t = 25.0)]
    pub fps: f64,
    /// Send this many requests at once and report their latencies.
    #[arg(long)]
    pub burst: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Encoding {
    Json,
    Binary,
}

/// One input of the model, shaped for `items` items.
struct InputShape {
    name: String,
    dtype: DataType,
    shape: Vec<usize>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let meta: Value = client
        .get(format!("{}/v2/models/{}", args.url, args.model))
        .send()
        .await
        .with_context(|| format!("cannot reach {}", args.url))?
        .error_for_status()?
        .json()
        .await?;
    let inputs = input_shapes(&meta, args.items)?;

    let body = Arc::new(request_body(&inputs, args.encoding));
    let url = format!("{}/v2/models/{}/infer", args.url, args.model);
    if let Some(n) = args.burst {
        let o = open::burst(&client, &url, body, n).await;
        println!(
            "burst of {n} on {}: last user {:.1} ms, p50 {:.1} ms, errors {}",
            args.model,
            o.latencies_ms.last().copied().unwrap_or(f64::NAN),
            o.p(0.5),
            o.errors
        );
        return Ok(());
    }
    if let Some(n) = args.streams {
        let o = open::streams(
            &client,
            &url,
            body,
            n,
            args.fps,
            Duration::from_secs_f64(args.duration),
        )
        .await;
        println!(
            "streams {n} x {} fps on {}: {:.1} answers/s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, errors {}",
            args.fps,
            args.model,
            o.latencies_ms.len() as f64 / o.elapsed.as_secs_f64(),
            o.p(0.5),
            o.p(0.99),
            o.latencies_ms.last().copied().unwrap_or(f64::NAN),
            o.errors
        );
        return Ok(());
    }
    let in_process = match &args.in_process {
        Some(path) => Some(in_process_best(path, &inputs, &args).await?),
        None => None,
    };

    println!(
        "served: model {} at {}, {} item(s)/request, {:?} encoding, {:.0} s per level",
        args.model, args.url, args.items, args.encoding, args.duration
    );
    println!(
        "{:>11} {:>12} {:>12} {:>9} {:>9} {:>9} {:>7} {:>10}",
        "concurrency",
        "requests/s",
        "items/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "errors",
        "vs in-proc"
    );
    for &c in &args.concurrency {
        let level = closed_loop(&client, &args, body.clone(), c).await;
        let items_s = level.ok as f64 * args.items as f64 / level.elapsed.as_secs_f64();
        let ratio = in_process.map_or("-".to_string(), |(_, best)| {
            format!("{:.2}", items_s / best)
        });
        println!(
            "{:>11} {:>12.1} {:>12.1} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>10}",
            c,
            level.ok as f64 / level.elapsed.as_secs_f64(),
            items_s,
            level.percentile(0.50),
            level.percentile(0.90),
            level.percentile(0.99),
            level.errors,
            ratio
        );
    }
    Ok(())
}

fn input_shapes(meta: &Value, items: usize) -> anyhow::Result<Vec<InputShape>> {
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
            let dtype = DataType::parse(i["datatype"].as_str().unwrap_or_default())
                .with_context(|| format!("input {name}: unsupported datatype"))?;
            let dims = i["shape"].as_array().context("input without a shape")?;
            let shape = dims
                .iter()
                .enumerate()
                .map(|(d, v)| match v.as_i64() {
                    Some(-1) if d == 0 => Ok(items),
                    Some(n) if n >= 0 => Ok(n as usize),
                    _ => bail!(
                        "input {name} has a dynamic dimension {d}; sheaf bench cannot shape it"
                    ),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(InputShape { name, dtype, shape })
        })
        .collect()
}

/// Pseudo-random bytes in a range every dtype reads as small finite values.
fn random_bytes(dtype: DataType, n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    match dtype {
        DataType::F32 => (0..n)
            .flat_map(|_| ((next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes())
            .collect(),
        DataType::F64 => (0..n)
            .flat_map(|_| ((next() % 2000) as f64 / 1000.0 - 1.0).to_le_bytes())
            .collect(),
        other => (0..n * other.size()).map(|_| (next() % 2) as u8).collect(),
    }
}

/// A request body and the headers it needs.
struct RequestBody {
    body: Bytes,
    header_length: Option<usize>,
}

fn request_body(inputs: &[InputShape], encoding: Encoding) -> RequestBody {
    let mut binary = Vec::new();
    let specs: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let n: usize = i.shape.iter().product();
            let bytes = random_bytes(i.dtype, n, 17 + k as u64);
            match encoding {
                Encoding::Binary => {
                    let spec = json!({"name": i.name, "shape": i.shape, "datatype": i.dtype.as_str(),
                                      "parameters": {"binary_data_size": bytes.len()}});
                    binary.extend(bytes);
                    spec
                }
                Encoding::Json => {
                    let view = sheaf_server::kserve::json_data::DataView { dtype: i.dtype, bytes: &bytes };
                    json!({"name": i.name, "shape": i.shape, "datatype": i.dtype.as_str(), "data": view})
                }
            }
        })
        .collect();
    let mut header = json!({"inputs": specs});
    if encoding == Encoding::Binary {
        header["parameters"] = json!({"binary_data_output": true});
    }
    let mut body = header.to_string().into_bytes();
    let header_length = (encoding == Encoding::Binary).then_some(body.len());
    body.extend(binary);
    RequestBody {
        body: Bytes::from(body),
        header_length,
    }
}

struct Level {
    latencies_ms: Vec<f64>,
    ok: usize,
    errors: usize,
    elapsed: Duration,
}

impl Level {
    fn percentile(&self, p: f64) -> f64 {
        percentile(&self.latencies_ms, p)
    }
}

/// The `p` quantile of sorted values (NaN when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Sends one request; its latency in ms, or `None` if it failed.
async fn send(client: &reqwest::Client, url: &str, body: &RequestBody) -> Option<f64> {
    let t = Instant::now();
    let mut req = client.post(url).body(body.body.clone());
    if let Some(n) = body.header_length {
        req = req.header("Inference-Header-Content-Length", n);
    }
    let r = req.send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.bytes().await.ok()?;
    Some(t.elapsed().as_secs_f64() * 1000.0)
}

async fn closed_loop(
    client: &reqwest::Client,
    args: &BenchArgs,
    body: Arc<RequestBody>,
    concurrency: usize,
) -> Level {
    let url = format!("{}/v2/models/{}/infer", args.url, args.model);
    let duration = Duration::from_secs_f64(args.duration);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0;
                while started.elapsed() < duration {
                    match send(&client, &url, &body).await {
                        Some(ms) => latencies.push(ms),
                        None => errors += 1,
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut level = Level {
        latencies_ms: Vec::new(),
        ok: 0,
        errors: 0,
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        if let Ok((lat, err)) = t.await {
            level.ok += lat.len();
            level.latencies_ms.extend(lat);
            level.errors += err;
        }
    }
    level.elapsed = started.elapsed();
    level.latencies_ms.sort_by(f64::total_cmp);
    level
}

/// Runs the model in-process at each batch size; returns (best batch size, items/s).
async fn in_process_best(
    path: &std::path::Path,
    inputs: &[InputShape],
    args: &BenchArgs,
) -> anyhow::Result<(usize, f64)> {
    let library = sheaf_onnx::library::locate(None)?;
    sheaf_onnx::init(&library)?;
    let options = sheaf_onnx::OnnxOptions {
        intra_op_threads: args.intra_op_threads,
        ..Default::default()
    };
    let mut model = sheaf_onnx::OnnxModel::load(path, &options)?;
    let duration = Duration::from_secs_f64(args.duration);
    println!(
        "in-process: {} on ONNX Runtime, {} intra-op thread(s)",
        path.display(),
        args.intra_op_threads
    );
    println!("{:>11} {:>12} {:>12}", "batch size", "batches/s", "items/s");
    let mut best = (0, 0.0);
    for &b in &args.batch_sizes {
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
        model.infer(&tensors)?; // warm-up
        let started = Instant::now();
        let mut runs = 0usize;
        while started.elapsed() < duration {
            model.infer(&tensors)?;
            runs += 1;
        }
        let per_s = runs as f64 / started.elapsed().as_secs_f64();
        println!("{:>11} {:>12.1} {:>12.1}", b, per_s, per_s * b as f64);
        if per_s * b as f64 > best.1 {
            best = (b, per_s * b as f64);
        }
    }
    println!(
        "in-process best: {:.1} items/s at batch size {}\n",
        best.1, best.0
    );
    Ok(best)
}
