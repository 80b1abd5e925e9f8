//! Warm-up samples (Triton's `model_warmup`): requests each instance runs after it loads and
//! before the model reports ready, so that the first clients do not pay for what a framework
//! does on its first runs (a CUDA context, cuDNN's kernel search, a caching allocator's growth,
//! a Python model's lazy imports).
//!
//! A sample names every input of the model (a stateful model's control and state inputs too)
//! with its type, its dimensions past the batch dimension, and where its data comes from:
//! zeros (`zero_data`), random values (`random_data`: floats in [0, 1), integers in 0..128,
//! booleans; byte strings stay empty, as under Triton), or a file in the model folder's
//! `warmup/` directory (`input_data_file`: one item's elements, raw, row-major, little-endian;
//! a byte string as its 4-byte little-endian length, then its bytes). The item is repeated
//! `batch_size` times (and padded with zero rows up to the batch size the instance runs, where
//! it pads), and the sample runs `count` times, at least once. A streaming model's sample runs
//! until its final response. A sample that fails fails the load, naming the sample. A model with
//! ragged batching ([`crate::ragged`]) takes a sample as one request of `batch_size` items sent
//! in the shape its inputs' dims give: its ragged inputs' elements in a row and the batch inputs
//! made for it, as a batch of that one request. Such a model's `max_batch_size: auto` probe times
//! batches made of its samples ([`probe_batch`]): it has no one shape of zeros to fill.
//!
//! Samples come from `config.pbtxt` (`model_warmup [ ... ]`) or `config.yaml` (`model_warmup:`,
//! the same fields). Their form is checked when the configuration is read
//! ([`WarmupSample::check`]), their data built once per load ([`read`]), and each instance
//! checks them against the model's signature and runs them ([`run`]) after the zero warm-up and
//! the batch-size probe. They run when the model loads, not when a Python model's process is
//! started again after a crash.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use sheaf_backend::{
    BackendError, DataType, Model, RequestInfo, ResponseStream, Signature, Tensor,
};

use crate::batcher::prepare::Settled;
use crate::ragged::Ragged;

/// Most bytes one input of a sample may take, its batch included.
const MAX_SAMPLE_BYTES: usize = 1 << 30;

/// Longest a streaming model's sample may take to send its final response.
const STREAM_LIMIT: Duration = Duration::from_secs(300);

/// One entry of `model_warmup`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupSample {
    /// Names the sample in logs and errors.
    #[serde(default)]
    pub name: String,
    /// Items in the sample's batch: its inputs' item, repeated. 1 for a model that does not
    /// batch.
    #[serde(default = "one")]
    pub batch_size: usize,
    /// Every input of the model, by name.
    #[serde(default)]
    pub inputs: BTreeMap<String, WarmupInput>,
    /// Runs of the sample; 0 counts as 1.
    #[serde(default)]
    pub count: usize,
}

fn one() -> usize {
    1
}

/// One input of a sample.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct WarmupInput {
    /// `FP32` or Triton's `TYPE_FP32`; `BYTES` or `TYPE_STRING` for byte strings.
    pub data_type: String,
    /// The item's shape, past the batch dimension: fixed sizes only.
    #[serde(default)]
    pub dims: Vec<i64>,
    #[serde(default)]
    pub zero_data: bool,
    #[serde(default)]
    pub random_data: bool,
    /// A file in the model folder's `warmup/` directory.
    #[serde(default)]
    pub input_data_file: Option<String>,
}

impl WarmupInput {
    /// The element type `data_type` names.
    fn dtype(&self) -> Result<DataType, String> {
        let name = self
            .data_type
            .strip_prefix("TYPE_")
            .unwrap_or(&self.data_type);
        let name = if name == "STRING" { "BYTES" } else { name };
        DataType::parse_any(name).ok_or_else(|| {
            format!(
                "data_type '{}' is not a tensor type (FP32, INT64, BYTES, ... or TYPE_FP32, ...)",
                self.data_type
            )
        })
    }

    /// The item's dimensions, each a fixed size.
    fn sizes(&self) -> Result<Vec<usize>, String> {
        self.dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                format!(
                    "dims {:?}: a sample's dimensions are sizes, not wildcards",
                    self.dims
                )
            })
    }
}

impl WarmupSample {
    /// How errors name the sample: its place in the list, and its name.
    fn label(&self, index: usize) -> String {
        match self.name.as_str() {
            "" => format!("model_warmup[{index}]"),
            name => format!("model_warmup[{index}] '{name}'"),
        }
    }

    /// Checks the sample's form (what needs no model): `index` is its place in the list.
    pub fn check(&self, index: usize) -> Result<(), String> {
        let label = self.label(index);
        if self.count > MAX_RUNS {
            return Err(format!(
                "{label}: count is {}; a sample runs at most {MAX_RUNS} times",
                self.count
            ));
        }
        if self.inputs.is_empty() {
            return Err(format!(
                "{label}: no inputs: a sample gives data for every input of the model"
            ));
        }
        for (name, input) in &self.inputs {
            let at = format!("{label}, input '{name}'");
            input.dtype().map_err(|e| format!("{at}: {e}"))?;
            input.sizes().map_err(|e| format!("{at}: {e}"))?;
            let sources = [
                input.zero_data,
                input.random_data,
                input.input_data_file.is_some(),
            ];
            if sources.iter().filter(|&&s| s).count() != 1 {
                return Err(format!(
                    "{at}: give exactly one of zero_data, random_data and input_data_file"
                ));
            }
            if let Some(file) = &input.input_data_file {
                let inside = !file.is_empty()
                    && Path::new(file)
                        .components()
                        .all(|c| matches!(c, Component::Normal(_)));
                if !inside {
                    return Err(format!(
                        "{at}: input_data_file '{file}' must name a file inside the model \
                         folder's warmup/ directory"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Most runs of one sample (`count`): every load of the model waits for them.
pub const MAX_RUNS: usize = 10_000;

/// A sample with its data built: what each instance runs.
#[derive(Debug, Clone)]
pub struct Sample {
    label: String,
    batch_size: usize,
    runs: usize,
    inputs: Vec<SampleInput>,
}

/// One input's item.
#[derive(Debug, Clone)]
struct SampleInput {
    name: String,
    dtype: DataType,
    dims: Vec<usize>,
    /// One item's bytes.
    item: Bytes,
}

/// Builds the data of `samples` for the model whose file is `model_file`: zeros, random values,
/// or the files in the model folder's `warmup/` (the folder above the file's version folder,
/// or the file's own folder where it has none).
pub fn read(samples: &[WarmupSample], model_file: &Path) -> Result<Vec<Sample>, String> {
    let folder = crate::repository::model_folder(model_file).join("warmup");
    samples
        .iter()
        .enumerate()
        .map(|(index, sample)| {
            sample.check(index)?;
            let label = sample.label(index);
            let inputs = sample
                .inputs
                .iter()
                .enumerate()
                .map(|(at, (name, input))| {
                    // Each input its own random values, the same at each load.
                    let seed = (index as u64) << 32 | at as u64;
                    item(sample.batch_size, input, seed, &folder)
                        .map_err(|e| format!("{label}, input '{name}': {e}"))
                        .map(|(dtype, dims, item)| SampleInput {
                            name: name.clone(),
                            dtype,
                            dims,
                            item,
                        })
                })
                .collect::<Result<_, _>>()?;
            Ok(Sample {
                label,
                batch_size: sample.batch_size,
                runs: sample.count.max(1),
                inputs,
            })
        })
        .collect()
}

/// One item of `input`, for batches of `batch_size`: its type, its dimensions and its bytes
/// (random ones drawn from `seed`).
fn item(
    batch_size: usize,
    input: &WarmupInput,
    seed: u64,
    folder: &Path,
) -> Result<(DataType, Vec<usize>, Bytes), String> {
    let dtype = input.dtype()?;
    let dims = input.sizes()?;
    let elements = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or("the dims overflow")?;
    let too_big = elements
        .checked_mul(dtype.size())
        .and_then(|b| b.checked_mul(batch_size.max(1)))
        .is_none_or(|b| b > MAX_SAMPLE_BYTES);
    if too_big {
        return Err(format!(
            "{elements} elements of {dtype} in batches of {batch_size} take more than {} MiB",
            MAX_SAMPLE_BYTES >> 20
        ));
    }
    let bytes = match &input.input_data_file {
        Some(file) => {
            let path = folder.join(file);
            if !path.is_file() {
                return Err(format!(
                    "input_data_file '{file}' is not in {}",
                    folder.display()
                ));
            }
            read_elements(&path, dtype, elements)?
        }
        // A byte string's zero is its empty length; random byte strings are empty, as Triton's.
        None if dtype == DataType::Bytes || input.zero_data => vec![0u8; elements * dtype.size()],
        None => random(dtype, elements, seed),
    };
    Ok((dtype, dims, Bytes::from(bytes)))
}

/// Reads a file that holds exactly `elements` of `dtype`: raw, row-major, little-endian; BYTES
/// as Triton writes them, each a 4-byte length, then the bytes. A numeric file's size is checked
/// before it is read, and no file over 1 GiB is read. Errors name the file.
pub(crate) fn read_elements(
    path: &Path,
    dtype: DataType,
    elements: usize,
) -> Result<Vec<u8>, String> {
    let named = |e: String| format!("{}: {e}", path.display());
    let len = std::fs::metadata(path)
        .map_err(|e| named(e.to_string()))?
        .len();
    let want = elements.checked_mul(dtype.size()).map(|b| b as u64);
    if dtype != DataType::Bytes && want != Some(len) {
        return Err(named(format!(
            "{len} bytes, where {elements} elements of {dtype} take {}",
            want.map_or("more than the address space".to_string(), |w| w.to_string())
        )));
    }
    if len > MAX_SAMPLE_BYTES as u64 {
        return Err(named(format!(
            "{len} bytes; at most {} MiB is read",
            MAX_SAMPLE_BYTES >> 20
        )));
    }
    let data = std::fs::read(path).map_err(|e| named(e.to_string()))?;
    check_file(&data, dtype, elements).map_err(named)?;
    Ok(data)
}

/// Checks that a file's bytes are exactly `elements` of `dtype`.
fn check_file(data: &[u8], dtype: DataType, elements: usize) -> Result<(), String> {
    if dtype != DataType::Bytes {
        let want = elements * dtype.size();
        return match data.len() == want {
            true => Ok(()),
            false => Err(format!(
                "{} bytes, where {elements} elements of {dtype} take {want}",
                data.len()
            )),
        };
    }
    let mut at = 0usize;
    let mut found = 0usize;
    while at < data.len() {
        let length = data
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| format!("byte string {found} has a cut length at byte {at}"))?;
        at = at
            .checked_add(4 + length as usize)
            .filter(|&end| end <= data.len())
            .ok_or_else(|| format!("byte string {found} runs past the end of the file"))?;
        found += 1;
    }
    match found == elements {
        true => Ok(()),
        false => Err(format!(
            "{found} byte strings, where the dims make {elements}"
        )),
    }
}

/// `elements` random values of `dtype`, the same each load: floats in [0, 1), integers in
/// 0..128 (every integer type holds them), booleans.
fn random(dtype: DataType, elements: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(elements * dtype.size());
    for _ in 0..elements {
        let x: f32 = rng.random();
        let n: u8 = rng.random_range(0..128);
        match dtype {
            DataType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            DataType::F64 => out.extend_from_slice(&f64::from(x).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            DataType::Bool => out.push(n & 1),
            // Little-endian: the value's byte, then zeros up to the type's size.
            _ => {
                out.push(n);
                out.resize(out.len() + dtype.size() - 1, 0);
            }
        }
    }
    out
}

impl Sample {
    /// The sample's tensors in the order of `signature`'s inputs, batched as the instance
    /// settled: `batch_size` items, padded up to the next batch size the instance runs.
    fn tensors(&self, signature: &Signature, settled: &Settled) -> Result<Vec<Tensor>, String> {
        let batched = settled.max_batch_size > 0;
        let b = self.batch_size;
        if batched && !(1..=settled.max_batch_size).contains(&b) {
            return Err(format!(
                "batch_size {b} is outside 1..={}, the model's batch sizes",
                settled.max_batch_size
            ));
        }
        if !batched && b > 1 {
            return Err(format!(
                "batch_size {b}, but the model does not batch (max_batch_size 0): a sample \
                 holds one request's inputs"
            ));
        }
        let rows = settled
            .batch_sizes
            .iter()
            .copied()
            .find(|&s| s >= b)
            .unwrap_or(b);
        self.rows(signature, batched, (b, rows))
    }

    /// The sample's tensors in the order of `signature`'s inputs: with `batched`, `b`
    /// copies of its item padded with zero rows up to `rows`; else its one item as it is.
    fn rows(
        &self,
        signature: &Signature,
        batched: bool,
        (b, rows): (usize, usize),
    ) -> Result<Vec<Tensor>, String> {
        let names = || {
            signature
                .inputs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
        };
        if let Some(extra) = self
            .inputs
            .iter()
            .find(|i| !signature.inputs.iter().any(|s| s.name == i.name))
        {
            return Err(format!(
                "input '{}' is not an input of the model; its inputs are {:?}",
                extra.name,
                names()
            ));
        }
        signature
            .inputs
            .iter()
            .map(|spec| {
                let input = self
                    .inputs
                    .iter()
                    .find(|i| i.name == spec.name)
                    .ok_or_else(|| {
                        format!(
                            "no data for input '{}': a sample gives every input of the model \
                             ({:?})",
                            spec.name,
                            names()
                        )
                    })?;
                if input.dtype != spec.dtype {
                    return Err(format!(
                        "input '{}' is {} in the sample, but the model takes {}",
                        spec.name, input.dtype, spec.dtype
                    ));
                }
                let model_dims = &spec.shape[usize::from(batched).min(spec.shape.len())..];
                let agree = model_dims.len() == input.dims.len()
                    && model_dims
                        .iter()
                        .zip(&input.dims)
                        .all(|(&m, &d)| m < 0 || m as usize == d);
                if !agree {
                    return Err(format!(
                        "input '{}' has dims {:?} in the sample, but the model's are {:?}{}",
                        spec.name,
                        input.dims,
                        model_dims,
                        if batched {
                            " (past the batch dimension)"
                        } else {
                            ""
                        }
                    ));
                }
                let tensor = if batched {
                    let shape = std::iter::once(b)
                        .chain(input.dims.iter().copied())
                        .collect();
                    Tensor::new(input.dtype, shape, input.item.repeat(b).into())
                        .and_then(|t| t.pad_items(rows))
                } else {
                    Tensor::new(input.dtype, input.dims.clone(), input.item.clone())
                };
                tensor.map_err(|e| format!("input '{}': {e}", spec.name))
            })
            .collect()
    }
}

/// Runs every sample on `model`, an instance whose batch sizes `settled` says; the first that
/// fails is the load's error. A model with ragged batching comes with it resolved and the
/// signature clients see: its samples are requests as clients send them, assembled into the
/// model's batch as the server assembles one (the ragged inputs' elements in a row, the batch
/// inputs made for them).
pub fn run(
    model: &mut dyn Model,
    samples: &[Sample],
    settled: &Settled,
    name: &str,
    ragged: Option<&(Ragged, Signature)>,
) -> Result<(), BackendError> {
    if samples.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    let mut ran = Vec::with_capacity(samples.len());
    for sample in samples {
        let inputs = match ragged {
            Some((ragged, client)) if ragged.assembles() => {
                sample.tensors(client, settled).and_then(|request| {
                    let pieces: Vec<Vec<Tensor>> = request.into_iter().map(|t| vec![t]).collect();
                    ragged.assemble(&pieces).map_err(|e| e.to_string())
                })
            }
            _ => sample.tensors(model.signature(), settled),
        }
        .map_err(|e| BackendError::Load(format!("{}: {e}", sample.label)))?;
        for _ in 0..sample.runs {
            let ran = match model.streams() {
                true => stream(model, inputs.clone()),
                false => model.infer(&inputs).map(drop),
            };
            ran.map_err(|e| BackendError::Load(format!("{} failed: {e}", sample.label)))?;
        }
        ran.push((inputs, sample.runs));
    }
    model.keep_warmup(ran);
    tracing::info!(
        model = name,
        samples = samples.len(),
        ms = started.elapsed().as_millis() as u64,
        "warm-up samples ran"
    );
    Ok(())
}

/// A batch of `items` for the `auto` probe of a model with ragged batching, made from its
/// warm-up samples, the only requests of the lengths clients send that the server knows, with
/// how many items it counts as. Where the server assembles the model's batches, it is `items`
/// requests of one item each, the samples' items in turn (samples of several lengths make a
/// batch of mixed lengths), assembled as a batch of them is; it counts its bytes in items of the
/// samples' mean size, since a small batch holds only the first samples (batch 1 the first
/// alone) and would otherwise look as fast as they are short. Where the model sees each request
/// (Triton's Python API), it is one request of `items` copies of the first sample's item, each
/// an item. A batch that would take more memory than the host has available is refused before
/// any of it is made.
pub fn probe_batch(
    samples: &[Sample],
    (ragged, client): &(Ragged, Signature),
    items: usize,
) -> Result<(Vec<Tensor>, f64), BackendError> {
    let first = samples.first().ok_or_else(|| {
        BackendError::Load("max_batch_size: auto has no warm-up sample to probe with".into())
    })?;
    let bytes = (0..items)
        .map(|i| samples[i % samples.len()].item_bytes())
        .fold(0u64, |sum, n| sum.saturating_add(n));
    // The requests' copies and the assembled batch.
    let need = bytes.saturating_mul(2);
    let available = crate::host_memory::available_memory().unwrap_or(u64::MAX);
    if need > available {
        return Err(BackendError::Load(format!(
            "a probe batch of {items} items of the warm-up samples takes {need} bytes, more than \
             the host has available ({available})"
        )));
    }
    let named = |sample: &Sample, e: String| BackendError::Load(format!("{}: {e}", sample.label));
    if !ragged.assembles() {
        return first
            .rows(client, true, (items, items))
            .map(|batch| (batch, items as f64))
            .map_err(|e| named(first, e));
    }
    let requests = samples
        .iter()
        .map(|s| s.rows(client, true, (1, 1)).map_err(|e| named(s, e)))
        .collect::<Result<Vec<_>, _>>()?;
    let pieces: Vec<Vec<Tensor>> = (0..client.inputs.len())
        .map(|input| {
            (0..items)
                .map(|i| requests[i % requests.len()][input].clone())
                .collect()
        })
        .collect();
    let mean = samples.iter().map(Sample::item_bytes).sum::<u64>() as f64 / samples.len() as f64;
    let counts = match mean > 0.0 {
        true => bytes as f64 / mean,
        false => items as f64,
    };
    Ok((ragged.assemble(&pieces)?, counts))
}

impl Sample {
    /// Items in the sample's batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Bytes of one item of every input.
    fn item_bytes(&self) -> u64 {
        self.inputs.iter().map(|i| i.item.len() as u64).sum()
    }
}

/// Runs one request of a streaming model to its final response.
fn stream(model: &mut dyn Model, inputs: Vec<Tensor>) -> Result<(), BackendError> {
    let (ended, end) = std::sync::mpsc::channel();
    let sink = Box::new(Sink {
        ended,
        failed: None,
    });
    model.infer_streaming(&[inputs], &[&RequestInfo::NONE], vec![sink])?;
    match end.recv_timeout(STREAM_LIMIT) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(BackendError::Runtime(format!(
            "no final response within {} s",
            STREAM_LIMIT.as_secs()
        ))),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(BackendError::Runtime(
            "the stream ended without its final response".into(),
        )),
    }
}

/// Where a sample's responses go: the first error is kept, and the end says how it went.
struct Sink {
    ended: std::sync::mpsc::Sender<Result<(), BackendError>>,
    failed: Option<BackendError>,
}

impl ResponseStream for Sink {
    fn part(&mut self, response: Result<sheaf_backend::Answer, BackendError>) {
        if let Err(e) = response {
            self.failed.get_or_insert(e);
        }
    }

    fn end(self: Box<Self>, result: Result<(), BackendError>) {
        let _ = self.ended.send(match (result, self.failed) {
            (Err(e), _) | (Ok(()), Some(e)) => Err(e),
            (Ok(()), None) => Ok(()),
        });
    }

    fn is_cancelled(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_backend::{Answer, TensorSpec};

    /// Records each batch it runs; fails on a first element of `fail_on`; with `streaming`,
    /// answers each request with two responses from a thread of its own, then ends.
    struct Recording {
        signature: Signature,
        runs: Vec<Vec<Tensor>>,
        fail_on: Option<f32>,
        streaming: bool,
    }

    impl Model for Recording {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            self.runs.push(inputs.to_vec());
            let first = inputs[0]
                .data()
                .get(..4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
            if first.is_some() && first == self.fail_on {
                return Err(BackendError::Runtime("ValueError: not this one".into()));
            }
            Ok(Vec::new())
        }

        fn streams(&self) -> bool {
            self.streaming
        }

        fn infer_streaming(
            &mut self,
            requests: &[Vec<Tensor>],
            _infos: &[&RequestInfo],
            streams: Vec<Box<dyn ResponseStream>>,
        ) -> Result<(), BackendError> {
            let failing = self.infer(&requests[0]).err();
            for mut stream in streams {
                let failing = failing.clone();
                std::thread::spawn(move || {
                    stream.part(Ok(Answer::default()));
                    std::thread::sleep(Duration::from_millis(20));
                    match failing {
                        Some(e) => stream.part(Err(e)),
                        None => stream.part(Ok(Answer::default())),
                    }
                    stream.end(Ok(()));
                });
            }
            Ok(())
        }
    }

    fn model(inputs: Vec<TensorSpec>) -> Recording {
        Recording {
            signature: Signature {
                inputs,
                outputs: Vec::new(),
            },
            runs: Vec::new(),
            fail_on: None,
            streaming: false,
        }
    }

    fn input(data_type: &str, dims: &[i64]) -> WarmupInput {
        WarmupInput {
            data_type: data_type.into(),
            dims: dims.to_vec(),
            zero_data: true,
            ..WarmupInput::default()
        }
    }

    fn sample(batch_size: usize, inputs: &[(&str, WarmupInput)]) -> WarmupSample {
        WarmupSample {
            name: "s".into(),
            batch_size,
            inputs: inputs
                .iter()
                .map(|(n, i)| (n.to_string(), i.clone()))
                .collect(),
            count: 0,
        }
    }

    fn settled(max: usize, sizes: &[usize]) -> Settled {
        Settled {
            max_batch_size: max,
            batch_sizes: sizes.to_vec(),
        }
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        t.data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn tensors(s: &WarmupSample, m: &Recording, at: &Settled) -> Result<Vec<Tensor>, String> {
        let read = read(
            std::slice::from_ref(s),
            Path::new("/nowhere/m/1/model.onnx"),
        )?;
        read[0].tensors(m.signature(), at)
    }

    #[test]
    fn a_sample_s_form_is_checked_when_the_configuration_is_read() {
        let ok = sample(1, &[("x", input("TYPE_FP32", &[2]))]);
        assert_eq!(ok.check(0), Ok(()));
        let cases = [
            (sample(1, &[]), "model_warmup[3] 's': no inputs"),
            (
                WarmupSample {
                    count: 1_000_000_000,
                    ..ok.clone()
                },
                "count is 1000000000; a sample runs at most 10000 times",
            ),
            (
                sample(1, &[("x", input("TYPE_FLOAT", &[2]))]),
                "input 'x': data_type 'TYPE_FLOAT' is not a tensor type",
            ),
            (
                sample(1, &[("x", input("FP32", &[-1]))]),
                "dims [-1]: a sample's dimensions are sizes",
            ),
            (
                sample(
                    1,
                    &[(
                        "x",
                        WarmupInput {
                            random_data: true,
                            ..input("FP32", &[2])
                        },
                    )],
                ),
                "exactly one of zero_data, random_data and input_data_file",
            ),
            (
                sample(
                    1,
                    &[(
                        "x",
                        WarmupInput {
                            zero_data: false,
                            ..input("FP32", &[2])
                        },
                    )],
                ),
                "exactly one of",
            ),
        ];
        for (s, says) in cases {
            let e = s.check(3).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        for file in ["../secret", "/etc/passwd", "", "a/../../b"] {
            let s = sample(
                1,
                &[(
                    "x",
                    WarmupInput {
                        zero_data: false,
                        input_data_file: Some(file.into()),
                        ..input("FP32", &[2])
                    },
                )],
            );
            let e = s.check(0).unwrap_err();
            assert!(
                e.contains("inside the model folder's warmup/"),
                "{file}: {e}"
            );
        }
    }

    #[test]
    fn an_item_is_repeated_to_the_batch_size_and_padded_to_the_size_the_instance_runs() {
        let m = model(vec![
            TensorSpec::new("x", DataType::F32, &[-1, 2]),
            TensorSpec::new("t", DataType::Bytes, &[-1, 1]),
        ]);
        let s = sample(
            3,
            &[
                ("x", input("TYPE_FP32", &[2])),
                ("t", input("TYPE_STRING", &[1])),
            ],
        );
        let t = tensors(&s, &m, &settled(8, &[1, 2, 4, 8])).unwrap();
        // Signature order, whatever the sample's.
        assert_eq!(
            (t[0].dtype(), t[0].shape()),
            (DataType::F32, &[4usize, 2][..])
        );
        assert!(floats(&t[0]).iter().all(|&v| v == 0.0));
        assert_eq!(
            (t[1].dtype(), t[1].shape()),
            (DataType::Bytes, &[4usize, 1][..])
        );
        // Any size may run: no padding.
        let t = tensors(&s, &m, &settled(8, &[])).unwrap();
        assert_eq!(t[0].shape(), [3, 2]);
        // A model that does not batch takes the item as it is.
        let m = model(vec![TensorSpec::new("x", DataType::F32, &[2])]);
        let s = sample(1, &[("x", input("FP32", &[2]))]);
        assert_eq!(tensors(&s, &m, &settled(0, &[])).unwrap()[0].shape(), [2]);
    }

    #[test]
    fn random_data_is_in_range_and_the_same_at_each_load() {
        let m = model(vec![
            TensorSpec::new("f", DataType::F32, &[-1, 64]),
            TensorSpec::new("i", DataType::I64, &[-1, 64]),
            TensorSpec::new("h", DataType::F16, &[-1, 4]),
        ]);
        let random = |dtype: &str, n: i64| WarmupInput {
            zero_data: false,
            random_data: true,
            ..input(dtype, &[n])
        };
        let s = sample(
            1,
            &[
                ("f", random("FP32", 64)),
                ("i", random("INT64", 64)),
                ("h", random("FP16", 4)),
            ],
        );
        let a = tensors(&s, &m, &settled(4, &[])).unwrap();
        let b = tensors(&s, &m, &settled(4, &[])).unwrap();
        assert_eq!(a, b);
        let f = floats(&a[0]);
        assert!(f.iter().all(|v| (0.0..1.0).contains(v)), "{f:?}");
        assert!(f.windows(2).any(|w| w[0] != w[1]), "random, not constant");
        let i: Vec<i64> = a[1]
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(i.iter().all(|v| (0..128).contains(v)), "{i:?}");
        assert_eq!(a[2].data().len(), 8);
    }

    #[test]
    fn a_file_in_the_model_folder_s_warmup_directory_gives_the_item() {
        let dir = std::env::temp_dir().join(format!("sheaf-warmup-{}", std::process::id()));
        let version = dir.join("m").join("1");
        std::fs::create_dir_all(&version).unwrap();
        std::fs::create_dir_all(dir.join("m").join("warmup")).unwrap();
        let values: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(dir.join("m/warmup/x.bin"), &values).unwrap();
        let mut strings = Vec::new();
        for s in [&b"ab"[..], b""] {
            strings.extend_from_slice(&(s.len() as u32).to_le_bytes());
            strings.extend_from_slice(s);
        }
        std::fs::write(dir.join("m/warmup/t.bin"), &strings).unwrap();
        let from = |file: &str, dtype: &str, dims: &[i64]| WarmupInput {
            zero_data: false,
            input_data_file: Some(file.into()),
            ..input(dtype, dims)
        };
        let m = model(vec![
            TensorSpec::new("x", DataType::F32, &[-1, 2]),
            TensorSpec::new("t", DataType::Bytes, &[-1, 2]),
        ]);
        let s = sample(
            2,
            &[
                ("x", from("x.bin", "FP32", &[2])),
                ("t", from("t.bin", "BYTES", &[2])),
            ],
        );
        let file = version.join("model.onnx");
        let read = read(std::slice::from_ref(&s), &file).unwrap();
        let t = read[0].tensors(m.signature(), &settled(4, &[])).unwrap();
        assert_eq!(floats(&t[0]), [1.5, -2.0, 1.5, -2.0]);
        assert_eq!(t[1].shape(), [2, 2]);
        assert_eq!(&t[1].data()[..], [&strings[..], &strings[..]].concat());
        // Sizes that do not make one item, and a file that is not there.
        let wrong = [
            (
                from("x.bin", "FP32", &[3]),
                "8 bytes, where 3 elements of FP32 take 12",
            ),
            (
                from("t.bin", "BYTES", &[3]),
                "2 byte strings, where the dims make 3",
            ),
            (
                from("x.bin", "BYTES", &[2]),
                "runs past the end of the file",
            ),
            (
                from("none.bin", "FP32", &[2]),
                "input_data_file 'none.bin' is not in",
            ),
        ];
        for (input, says) in wrong {
            let s = sample(1, &[("x", input)]);
            let e = super::read(&[s], &file).unwrap_err();
            assert!(e.contains(says), "{e}");
            assert!(e.starts_with("model_warmup[0] 's', input 'x': "), "{e}");
        }
        // A model folder without versions holds its warmup/ itself; the repository's is not
        // looked at.
        std::fs::create_dir_all(dir.join("flat/warmup")).unwrap();
        std::fs::write(dir.join("flat/warmup/x.bin"), &values).unwrap();
        std::fs::create_dir_all(dir.join("warmup")).unwrap();
        std::fs::write(dir.join("warmup/y.bin"), &values).unwrap();
        let flat = dir.join("flat/model.py");
        let s = sample(1, &[("x", from("x.bin", "FP32", &[2]))]);
        assert!(super::read(&[s], &flat).is_ok());
        let s = sample(1, &[("x", from("y.bin", "FP32", &[2]))]);
        let e = super::read(&[s], &flat).unwrap_err();
        let there = dir.join("flat/warmup");
        assert!(
            e.ends_with(&format!("is not in {}", there.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_sample_that_does_not_fit_the_model_says_how() {
        let m = model(vec![
            TensorSpec::new("x", DataType::F32, &[-1, 2]),
            TensorSpec::new("y", DataType::I64, &[-1, -1]),
        ]);
        let x = ("x", input("FP32", &[2]));
        let y = ("y", input("INT64", &[5]));
        let cases = [
            (sample(1, std::slice::from_ref(&x)), "no data for input 'y'"),
            (
                sample(1, &[x.clone(), y.clone(), ("z", input("FP32", &[1]))]),
                "input 'z' is not an input of the model; its inputs are [\"x\", \"y\"]",
            ),
            (
                sample(1, &[("x", input("FP64", &[2])), y.clone()]),
                "input 'x' is FP64 in the sample, but the model takes FP32",
            ),
            (
                sample(1, &[("x", input("FP32", &[3])), y.clone()]),
                "input 'x' has dims [3] in the sample, but the model's are [2] (past the batch",
            ),
            (
                sample(9, &[x.clone(), y.clone()]),
                "batch_size 9 is outside 1..=8",
            ),
            (
                sample(0, &[x.clone(), y.clone()]),
                "batch_size 0 is outside 1..=8",
            ),
        ];
        for (s, says) in cases {
            let e = tensors(&s, &m, &settled(8, &[])).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let m = model(vec![TensorSpec::new("x", DataType::F32, &[2])]);
        let e = tensors(&sample(2, &[x]), &m, &settled(0, &[])).unwrap_err();
        assert!(e.contains("the model does not batch"), "{e}");
    }

    #[test]
    fn each_sample_runs_its_count_and_one_that_fails_fails_the_load() {
        let mut m = model(vec![TensorSpec::new("x", DataType::F32, &[-1, 1])]);
        let mut warm = sample(2, &[("x", input("FP32", &[1]))]);
        warm.count = 3;
        let ones = WarmupInput {
            zero_data: false,
            random_data: true,
            ..input("FP32", &[1])
        };
        let mut other = sample(1, &[("x", ones)]);
        other.name = "other".into();
        let samples = read(&[warm, other], Path::new("m/model.py")).unwrap();
        run(&mut m, &samples, &settled(4, &[]), "m", None).unwrap();
        let sizes: Vec<usize> = m.runs.iter().map(|r| r[0].items()).collect();
        assert_eq!(sizes, [2, 2, 2, 1]);
        // The second sample's value makes the model raise.
        m.fail_on = Some(floats(&m.runs[3][0])[0]);
        let e = run(&mut m, &samples, &settled(4, &[]), "m", None).unwrap_err();
        assert!(
            matches!(&e, BackendError::Load(s) if s.starts_with("model_warmup[1] 'other' failed: inference failed: ValueError")),
            "{e}"
        );
        // A sample that does not fit is a load error before anything runs.
        let runs = m.runs.len();
        let e = run(&mut m, &samples, &settled(0, &[]), "m", None).unwrap_err();
        assert!(
            e.to_string().contains("model_warmup[0] 's': batch_size 2"),
            "{e}"
        );
        assert_eq!(m.runs.len(), runs);
    }

    /// A model that takes `x` ragged, every request's values in a row, and where each request's
    /// end in `offsets`; with the ragged form the server resolves for it.
    fn offsets_model() -> (Recording, (Ragged, Signature)) {
        let m = model(vec![
            TensorSpec::new("x", DataType::F32, &[-1]),
            TensorSpec::new("offsets", DataType::I64, &[-1]),
        ]);
        let config = crate::ModelConfig::from_yaml(
            "inputs: [{name: x, dims: [-1], allow_ragged_batch: true}]\n\
             batch_inputs: [{kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, \
             target_name: [offsets], data_type: INT64, source_input: [x]}]\n",
        )
        .unwrap();
        let form = Ragged::new(
            &config.inputs,
            (&config.batch_inputs, &config.batch_outputs),
            m.signature(),
            true,
            false,
        )
        .unwrap()
        .unwrap();
        (m, form)
    }

    #[test]
    fn a_ragged_model_s_sample_runs_as_one_request_assembled_as_batches_are() {
        let (mut m, form) = offsets_model();
        // Clients send x in rows of any length; the sample's are 3 long, two of them.
        let warm = sample(2, &[("x", input("FP32", &[3]))]);
        let samples = read(&[warm], Path::new("m/model.onnx")).unwrap();
        run(&mut m, &samples, &settled(8, &[]), "m", Some(&form)).unwrap();
        let [x, offsets] = m.runs[0].as_slice() else {
            panic!("{:?}", m.runs[0]);
        };
        assert_eq!(x.shape(), [6]);
        assert_eq!(offsets.shape(), [2]);
        let ends: Vec<i64> = offsets
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(ends, [0, 6]);
        // A sample that names the batch input, not the clients' input, does not fit.
        let wrong = sample(1, &[("offsets", input("INT64", &[2]))]);
        let samples = read(&[wrong], Path::new("m/model.onnx")).unwrap();
        let e = run(&mut m, &samples, &settled(8, &[]), "m", Some(&form)).unwrap_err();
        assert!(
            e.to_string()
                .contains("input 'offsets' is not an input of the model"),
            "{e}"
        );
    }

    #[test]
    fn the_auto_probe_of_a_ragged_model_batches_its_samples_in_turn() {
        let (_, form) = offsets_model();
        let random = WarmupInput {
            zero_data: false,
            random_data: true,
            ..input("FP32", &[5])
        };
        let samples = read(
            &[
                sample(1, &[("x", input("FP32", &[3]))]),
                sample(2, &[("x", random)]),
            ],
            Path::new("m/model.onnx"),
        )
        .unwrap();
        // Counted in items of the samples' mean size, 4 values: 1 request of 3 counts as 0.75.
        assert_eq!(probe_batch(&samples, &form, 1).unwrap().1, 0.75);
        assert_eq!(probe_batch(&samples, &form, 3).unwrap().1, 2.75);
        // Four requests of one item each: 3 values, 5, 3, 5.
        let (batch, counts) = probe_batch(&samples, &form, 4).unwrap();
        assert_eq!(counts, 4.0);
        let [x, offsets] = batch.as_slice() else {
            panic!("{batch:?}");
        };
        assert_eq!(x.shape(), [16]);
        let values: Vec<f32> = x
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values[..3], [0.0; 3]);
        assert!(
            values[3..8].iter().all(|v| (0.0..1.0).contains(v)),
            "{values:?}"
        );
        assert!(values[3..8].iter().any(|&v| v != 0.0), "{values:?}");
        assert_eq!(values[8..11], [0.0; 3]);
        assert_eq!(values[11..], values[3..8]);
        let ends: Vec<i64> = offsets
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(ends, [0, 3, 8, 11, 16]);
        // A model that sees each request gets one request of copies of the first sample.
        let plain = crate::ModelConfig::from_yaml(
            "inputs: [{name: x, dims: [-1], allow_ragged_batch: true}]\n",
        )
        .unwrap();
        let per_request = Ragged::new(
            &plain.inputs,
            (&[], &[]),
            &Signature {
                inputs: vec![TensorSpec::new("x", DataType::F32, &[-1, -1])],
                outputs: Vec::new(),
            },
            true,
            true,
        )
        .unwrap()
        .unwrap();
        let (batch, counts) = probe_batch(&samples, &per_request, 4).unwrap();
        assert_eq!(counts, 4.0);
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].shape(), [4, 3]);
        // Without samples there is nothing to probe with.
        let e = probe_batch(&[], &form, 1).unwrap_err().to_string();
        assert!(e.contains("no warm-up sample"), "{e}");
    }

    #[test]
    fn a_streaming_model_s_sample_runs_to_its_final_response() {
        let mut m = model(vec![TensorSpec::new("x", DataType::F32, &[-1, 1])]);
        m.streaming = true;
        let ones = WarmupInput {
            zero_data: false,
            random_data: true,
            ..input("FP32", &[1])
        };
        let samples = read(&[sample(1, &[("x", ones)])], Path::new("m/model.py")).unwrap();
        run(&mut m, &samples, &settled(4, &[]), "m", None).unwrap();
        assert_eq!(m.runs.len(), 1);
        // An error response on the way fails the sample, though the stream ends well.
        m.fail_on = Some(floats(&m.runs[0][0])[0]);
        let e = run(&mut m, &samples, &settled(4, &[]), "m", None).unwrap_err();
        assert!(e.to_string().contains("ValueError: not this one"), "{e}");
    }
}
