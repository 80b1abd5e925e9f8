//! Pipelines: a model folder holding `pipeline.yaml` instead of a model file chains steps, so
//! that one request in gives one answer out where the work takes several models or a built-in
//! conversion between them.
//!
//! ```yaml
//! inputs: [image]                 # the request's tensors the steps start from
//! steps:
//!   - image: {from: image, to: pixels, resize: 256, crop: [224, 224], mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}
//!   - model: efficientnet         # through that model's own queue and batcher
//!     inputs: {input: pixels}     # the model's input <- a value
//!     outputs: {logits: logits}   # the model's output -> a value
//!   - classify: {from: logits, to: classes, k: 5, labels: ../efficientnet/labels.txt}
//! outputs: [classes]
//! ```
//!
//! Steps run in order over named values: the request's inputs, then what each step adds.
//! - A model step sends its inputs to that model as one request, through the model manager (so
//!   the model loads on demand, and batches with every other request it gets), and names its
//!   outputs.
//! - Built-in steps: `image` (decode encoded images into a tensor, as `image_inputs` does),
//!   `classify` (the top K classes of a float tensor, as the classification extension gives them),
//!   `encode_image` (a float tensor into PNG or JPEG, as `image_outputs` does) and `tokenize`
//!   (texts into token ids, attention mask and segment ids, with a `tokenizer.json`).
//!
//! Steps in a row that take nothing from each other run at once (found at load: the pipeline's
//! runs); each works on its own copy of the values, and what each makes is kept in order.
//! Requests of a pipeline overlap freely: each waits only on its own steps. A failing step is
//! named in the error, which keeps the step's kind (a bad image is still a 400).
//!
//! A Triton ensemble (`platform: "ensemble"` in `config.pbtxt`) is read as a pipeline of model
//! steps ([`ensemble`]), and reports platform `ensemble`.
//!
//! A run's answer carries its model steps' receipts ([`crate::stages::Receipt`]): a sampled
//! request's trace holds a trace of each step under it, and the pipeline's statistics
//! ([`crate::ModelHandle::record_run`], kept by the model manager) sum their compute times.
//!
//! One model step may stream its responses (a decoupled model). Asked for a stream
//! ([`Pipeline::run_stream`]), the pipeline runs the steps before it once and the steps after it
//! on each of its responses, each one response of the pipeline; asked for one answer, it refuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;
use sheaf_backend::{DataType, TensorSpec};

use crate::cache::ResponseCache;
use crate::config::{ImageInputConfig, ImageOutputConfig};
use crate::request::{ByteTensor, InferResponse, NamedTensor, RawRequest};
use crate::stages::{Receipt, StepReceipt};
use crate::{InferError, ModelHandle, ModelManager};

mod ensemble;
mod signature;

pub use crate::repository::PIPELINE_FILE;

/// The platform pipelines report.
pub const PLATFORM: &str = "pipeline";

/// The platform Triton's ensembles report, as under Triton.
pub const ENSEMBLE_PLATFORM: &str = "ensemble";

/// The platform of the pipeline defined by the file at `path`: a Triton ensemble's
/// configuration (`config.pbtxt`, or a custom `configs/<name>.pbtxt`), or `pipeline.yaml`.
pub fn platform_of(path: &Path) -> &'static str {
    match is_ensemble(path) {
        true => ENSEMBLE_PLATFORM,
        false => PLATFORM,
    }
}

/// Whether the pipeline file at `path` is a Triton ensemble's configuration (a `.pbtxt`).
fn is_ensemble(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "pbtxt")
}

/// A pipeline's definition, as `pipeline.yaml` gives it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    /// The request's inputs, by name.
    pub inputs: Vec<String>,
    pub steps: Vec<Step>,
    /// The values returned, by name.
    pub outputs: Vec<String>,
    /// Class names of `classify` steps, read at load (by step index).
    #[serde(skip)]
    labels: BTreeMap<usize, Arc<Vec<String>>>,
    /// Tokenizers of `tokenize` steps, read at load (by step index).
    #[serde(skip)]
    tokenizers: BTreeMap<usize, Arc<tokenizers::Tokenizer>>,
    /// The steps in runs that may go at once, in order: no step of a run takes what another
    /// of it makes (found at load).
    #[serde(skip)]
    waves: Vec<std::ops::Range<usize>>,
    /// The values each step of a run of several makes, which are kept from it.
    #[serde(skip)]
    makes: Vec<Vec<String>>,
}

/// A model step, as a configuration view shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelStepView<'p> {
    pub model: &'p str,
    pub version: Option<&'p str>,
    /// The model's input <- a value of the pipeline (empty: each from the value of its name).
    pub inputs: &'p BTreeMap<String, String>,
    /// The model's output -> a value of the pipeline (empty: each under its own name).
    pub outputs: &'p BTreeMap<String, String>,
}

/// One step: `model: NAME` (with optional `inputs` and `outputs` maps), or one of the built-in
/// steps `image`, `classify` and `encode_image`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "serde_yaml::Mapping")]
pub enum Step {
    Model {
        model: String,
        /// The version of the model to run; absent: the one served.
        version: Option<String>,
        /// The model's input <- a value; absent: the value of the same name for each.
        inputs: BTreeMap<String, String>,
        /// The model's output -> a value; absent: every output under its own name.
        outputs: BTreeMap<String, String>,
    },
    Image(ImageStep),
    Classify(ClassifyStep),
    EncodeImage(EncodeStep),
    Tokenize(TokenizeStep),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelStep {
    model: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    inputs: BTreeMap<String, String>,
    #[serde(default)]
    outputs: BTreeMap<String, String>,
}

impl TryFrom<serde_yaml::Mapping> for Step {
    type Error = String;

    fn try_from(map: serde_yaml::Mapping) -> Result<Step, String> {
        let keys: Vec<&str> = map.keys().filter_map(|k| k.as_str()).collect();
        let inner = |key: &str| map.get(key).cloned().unwrap_or_default();
        let value = serde_yaml::Value::Mapping(map.clone());
        match keys.as_slice() {
            k if k.contains(&"model") => {
                let m: ModelStep = serde_yaml::from_value(value).map_err(|e| e.to_string())?;
                Ok(Step::Model {
                    model: m.model,
                    version: m.version,
                    inputs: m.inputs,
                    outputs: m.outputs,
                })
            }
            ["image"] => ImageStep::try_from(inner("image")).map(Step::Image),
            ["classify"] => serde_yaml::from_value(inner("classify"))
                .map(Step::Classify)
                .map_err(|e| format!("classify: {e}")),
            ["encode_image"] => EncodeStep::try_from(inner("encode_image")).map(Step::EncodeImage),
            ["tokenize"] => serde_yaml::from_value(inner("tokenize"))
                .map(Step::Tokenize)
                .map_err(|e| format!("tokenize: {e}")),
            other => Err(format!(
                "a step is `model: NAME` or one of `image`, `classify`, `encode_image`, \
                 `tokenize`; this one has {other:?}"
            )),
        }
    }
}

/// `image`: encoded images (BYTES) into a float tensor, as `image_inputs` says (`crop` is
/// needed: no model fixes the size here).
#[derive(Debug, Clone)]
pub struct ImageStep {
    pub from: String,
    pub to: String,
    pub config: ImageInputConfig,
}

/// `encode_image`: a float tensor into encoded images, as `image_outputs` says.
#[derive(Debug, Clone)]
pub struct EncodeStep {
    pub from: String,
    pub to: String,
    pub config: ImageOutputConfig,
}

/// `from` and `to` out of a step's map, and the rest read as `T` (whose unknown keys are
/// errors).
fn split<T: serde::de::DeserializeOwned>(
    step: &str,
    value: serde_yaml::Value,
) -> Result<(String, String, T), String> {
    let serde_yaml::Value::Mapping(mut map) = value else {
        return Err(format!("{step}: expected {{from, to, ...}}"));
    };
    let mut take = |key: &str| -> Result<String, String> {
        map.remove(key)
            .and_then(|v| v.as_str().map(String::from))
            .ok_or_else(|| format!("{step}: needs '{key}'"))
    };
    let (from, to) = (take("from")?, take("to")?);
    let rest = serde_yaml::from_value(serde_yaml::Value::Mapping(map))
        .map_err(|e| format!("{step}: {e}"))?;
    Ok((from, to, rest))
}

impl TryFrom<serde_yaml::Value> for ImageStep {
    type Error = String;

    fn try_from(value: serde_yaml::Value) -> Result<ImageStep, String> {
        let (from, to, config): (_, _, ImageInputConfig) = split("image", value)?;
        if config.crop.is_empty() {
            return Err("image: needs a crop ([height, width] or [side])".into());
        }
        Ok(ImageStep { from, to, config })
    }
}

impl TryFrom<serde_yaml::Value> for EncodeStep {
    type Error = String;

    fn try_from(value: serde_yaml::Value) -> Result<EncodeStep, String> {
        let (from, to, config) = split("encode_image", value)?;
        Ok(EncodeStep { from, to, config })
    }
}

/// `tokenize`: texts (BYTES, UTF-8) into token ids, an attention mask and segment ids (INT64
/// `[texts, longest]`, padded with 0), with a Hugging Face `tokenizer.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeStep {
    pub from: String,
    /// The value names of the token ids, the mask and the segment ids.
    pub ids: String,
    pub mask: String,
    #[serde(default)]
    pub types: Option<String>,
    /// The tokenizer, relative to the pipeline's folder.
    pub tokenizer: PathBuf,
    /// Most tokens of one text, special tokens included: longer text is refused.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
}

fn default_max_tokens() -> usize {
    512
}

/// `classify`: the `k` best classes of each item of a float tensor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyStep {
    pub from: String,
    pub to: String,
    pub k: usize,
    /// Class names, one per line, relative to the pipeline's folder.
    #[serde(default)]
    pub labels: Option<PathBuf>,
}

/// A value between steps.
#[derive(Debug, Clone)]
enum Value {
    Tensor(sheaf_backend::Tensor),
    Bytes(ByteTensor),
}

impl Step {
    fn describe(&self) -> String {
        match self {
            Step::Model { model, .. } => format!("model '{model}'"),
            Step::Image(_) => "image".into(),
            Step::Classify(_) => "classify".into(),
            Step::EncodeImage(_) => "encode_image".into(),
            Step::Tokenize(_) => "tokenize".into(),
        }
    }
}

impl Pipeline {
    /// A pipeline of `steps` from `inputs` to `outputs`, before [`Pipeline::load`]'s checks.
    fn of(inputs: Vec<String>, steps: Vec<Step>, outputs: Vec<String>) -> Pipeline {
        Pipeline {
            inputs,
            steps,
            outputs,
            labels: BTreeMap::new(),
            tokenizers: BTreeMap::new(),
            waves: Vec::new(),
            makes: Vec::new(),
        }
    }

    /// Reads and checks `pipeline.yaml`: every value a step takes is a request input or made by
    /// an earlier step (model steps' outputs are checked when they run), and every output is
    /// made.
    ///
    /// A Triton ensemble's `config.pbtxt` is read as its pipeline ([`ensemble`]).
    pub fn load(path: &Path) -> Result<Pipeline, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut p: Pipeline = match is_ensemble(path) {
            true => ensemble::pipeline(&text),
            false => serde_yaml::from_str(&text).map_err(|e| e.to_string()),
        }
        .map_err(|e| format!("{}: {e}", path.display()))?;
        if p.steps.is_empty() {
            return Err("a pipeline needs at least one step".into());
        }
        let folder = path.parent().unwrap_or(Path::new("."));
        let mut known: Vec<String> = p.inputs.clone();
        // A model step's outputs are known only when it runs: past one, names are not checked.
        let mut open = false;
        let mut wave_makes: Vec<String> = Vec::new();
        let mut wave_closed = false;
        for (i, step) in p.steps.iter().enumerate() {
            let at = |e: String| format!("step {} ({}): {e}", i + 1, step.describe());
            let (takes, makes): (Vec<&String>, Vec<&String>) = match step {
                Step::Model {
                    inputs, outputs, ..
                } => (inputs.values().collect(), outputs.values().collect()),
                Step::Image(image) => (vec![&image.from], vec![&image.to]),
                Step::Classify(classify) => {
                    if classify.k == 0 {
                        return Err(at("k must be at least 1".into()));
                    }
                    if let Some(file) = &classify.labels {
                        let text = std::fs::read_to_string(folder.join(file))
                            .map_err(|e| at(format!("labels {}: {e}", file.display())))?;
                        let names = text.lines().map(|l| l.trim().to_string()).collect();
                        p.labels.insert(i, Arc::new(names));
                    }
                    (vec![&classify.from], vec![&classify.to])
                }
                Step::EncodeImage(encode) => (vec![&encode.from], vec![&encode.to]),
                Step::Tokenize(t) => {
                    let file = folder.join(&t.tokenizer);
                    let mut tokenizer = tokenizers::Tokenizer::from_file(&file)
                        .map_err(|e| at(format!("tokenizer {}: {e}", file.display())))?;
                    // The file's own padding and truncation would hide the length check.
                    tokenizer.with_padding(None);
                    tokenizer
                        .with_truncation(None)
                        .map_err(|e| at(e.to_string()))?;
                    p.tokenizers.insert(i, Arc::new(tokenizer));
                    let mut makes = vec![&t.ids, &t.mask];
                    makes.extend(t.types.iter());
                    (vec![&t.from], makes)
                }
            };
            for name in &takes {
                if !open && !known.contains(*name) {
                    return Err(at(format!(
                        "takes '{name}', which no input or earlier step makes"
                    )));
                }
            }
            // A step joins the run before it unless it takes what that run makes, or what it
            // takes or makes is known only when it runs (a model step without `inputs` or
            // `outputs`): then it starts a run, or ends one.
            let unknown_takes = matches!(step, Step::Model { inputs, .. } if inputs.is_empty());
            let unknown_makes = matches!(step, Step::Model { outputs, .. } if outputs.is_empty());
            let wave_open = p.waves.last().is_some_and(|w| w.end == i && !wave_closed);
            let joins = wave_open
                && !unknown_takes
                && !unknown_makes
                && !takes.iter().any(|t| wave_makes.contains(*t));
            if joins {
                if let Some(w) = p.waves.last_mut() {
                    w.end = i + 1;
                }
            } else {
                p.waves.push(i..i + 1);
                wave_makes.clear();
            }
            wave_makes.extend(makes.iter().map(|m| m.to_string()));
            wave_closed = unknown_makes;
            p.makes.push(makes.iter().map(|m| m.to_string()).collect());
            known.extend(makes.into_iter().cloned());
            if unknown_makes {
                open = true;
            }
        }
        for name in &p.outputs {
            if !open && !known.contains(name) {
                return Err(format!("outputs: no step makes '{name}'"));
            }
        }
        Ok(p)
    }

    /// The signature the pipeline's configuration declares (an ensemble's `input` and
    /// `output`, with their types; `batched`: the first dimension is the batch), for its
    /// metadata; none when it declares no tensors or leaves a type out (the metadata then lists
    /// what the steps imply, [`Pipeline::implied`]). A declared tensor the pipeline does not
    /// take or give is an error.
    pub(crate) fn declared(
        &self,
        config: &crate::ModelConfig,
        batched: bool,
    ) -> Result<sheaf_backend::Signature, String> {
        let mut signature = sheaf_backend::Signature::default();
        for (kind, declared, names, specs) in [
            ("input", &config.inputs, &self.inputs, &mut signature.inputs),
            (
                "output",
                &config.outputs,
                &self.outputs,
                &mut signature.outputs,
            ),
        ] {
            for d in declared {
                if !names.contains(&d.name) {
                    return Err(format!(
                        "the config declares {kind} '{}', but the pipeline's {kind}s are {names:?}",
                        d.name
                    ));
                }
                let Some(dtype) = d.data_type.as_deref().and_then(DataType::parse_any) else {
                    return Ok(sheaf_backend::Signature::default());
                };
                let batch = batched.then_some(-1);
                specs.push(TensorSpec {
                    name: d.name.clone(),
                    dtype,
                    shape: batch.into_iter().chain(d.dims.iter().copied()).collect(),
                });
            }
        }
        Ok(signature)
    }

    /// The model steps, in the order they run (as Triton's `ensemble_scheduling` lists them):
    /// each one's model, version (none: the one served), and input and output maps.
    pub fn model_steps(&self) -> Vec<ModelStepView<'_>> {
        self.steps
            .iter()
            .filter_map(|step| match step {
                Step::Model {
                    model,
                    version,
                    inputs,
                    outputs,
                } => Some(ModelStepView {
                    model,
                    version: version.as_deref(),
                    inputs,
                    outputs,
                }),
                _ => None,
            })
            .collect()
    }

    /// The models the steps run, each named once, in step order.
    pub fn models(&self) -> Vec<&str> {
        let mut models: Vec<&str> = Vec::new();
        for step in &self.steps {
            if let Step::Model { model, .. } = step {
                if !models.contains(&model.as_str()) {
                    models.push(model);
                }
            }
        }
        models
    }

    /// Runs the steps for `raw`, the models through `manager`.
    pub async fn run(
        &self,
        name: &str,
        version: &str,
        mut raw: RawRequest,
        manager: &ModelManager,
    ) -> Result<InferResponse, InferError> {
        let started = tokio::time::Instant::now();
        let mut values = self.start(name, &mut raw)?;
        // The receipts of the model steps, in the order the steps are run (for traces).
        let mut ran = Vec::new();
        for wave in &self.waves {
            if wave.len() == 1 {
                let step = &self.steps[wave.start];
                ran.extend(
                    self.run_step(name, wave.start, step, &mut values, manager, &raw)
                        .await?,
                );
                continue;
            }
            // Steps that take nothing from each other run at once (as Triton runs an
            // ensemble's steps once their inputs are there), each on its own copy of the
            // values (their tensors are shared, not copied); what each makes is kept, in order.
            let runs = wave.clone().map(|i| {
                let mut own = values.clone();
                let raw = &raw;
                async move {
                    self.run_step(name, i, &self.steps[i], &mut own, manager, raw)
                        .await
                        .map(|receipt| (i, own, receipt))
                }
            });
            for done in futures::future::join_all(runs).await {
                let (i, mut own, receipt) = done?;
                ran.extend(receipt);
                for made in &self.makes[i] {
                    if let Some(v) = own.remove(made) {
                        values.insert(made.clone(), v);
                    }
                }
            }
        }
        let mut answer = self.answer(name, version, &raw, values)?;
        answer.receipt = Some(Receipt::steps(started, ran));
        Ok(answer)
    }

    /// Runs the steps for `raw` when the client asks for a stream. When a model step streams
    /// its responses (a decoupled model; one step at most), the steps before it run once, and
    /// the steps after it run on each of its responses, each giving one response of the
    /// pipeline; otherwise the stream holds the one answer. An error before the first response
    /// is the call's error; a later one ends the stream with it.
    pub async fn run_stream<'a>(
        &'a self,
        name: &'a str,
        version: &'a str,
        mut raw: RawRequest,
        manager: &'a ModelManager,
    ) -> Result<BoxStream<'a, Result<InferResponse, InferError>>, InferError> {
        let mut values = self.start(name, &mut raw)?;
        for (at, step) in self.steps.iter().enumerate() {
            if let Step::Model {
                model,
                version: wanted,
                inputs,
                outputs,
            } = step
            {
                let handle = manager
                    .get_or_load(model, wanted.as_deref())
                    .await
                    .map_err(|e| self.step_error(name, at, e))?;
                if handle.streams {
                    if let Some(other) = self.streaming_step(manager, at + 1).await {
                        return Err(InferError::invalid(format!(
                            "pipeline '{name}': steps {} and {} both stream their responses \
                             (decoupled); one model step of a pipeline may",
                            at + 1,
                            other + 1
                        )));
                    }
                    let request = model_request(name, &handle, inputs, outputs, &values, &raw)
                        .map_err(|e| self.step_error(name, at, e))?;
                    let responses = handle
                        .infer_stream(request)
                        .await
                        .map_err(|e| self.step_error(name, at, e))?;
                    return Ok(self.stream_from(name, version, at, responses, values, raw, manager));
                }
            }
            self.run_step(name, at, step, &mut values, manager, &raw)
                .await?;
        }
        let answer = self.answer(name, version, &raw, values)?;
        Ok(futures::stream::once(async { Ok(answer) }).boxed())
    }

    /// The pipeline's responses from the responses of its streaming step `at`: each runs the
    /// steps after it on the values made before it.
    #[allow(clippy::too_many_arguments)]
    fn stream_from<'a>(
        &'a self,
        name: &'a str,
        version: &'a str,
        at: usize,
        responses: BoxStream<'static, Result<InferResponse, InferError>>,
        values: BTreeMap<String, Value>,
        raw: RawRequest,
        manager: &'a ModelManager,
    ) -> BoxStream<'a, Result<InferResponse, InferError>> {
        let Some(Step::Model { outputs, .. }) = self.steps.get(at) else {
            let error = InferError::internal("the streaming step is not a model");
            return futures::stream::once(async { Err(error) }).boxed();
        };
        let raw = Arc::new(raw);
        responses
            .then(move |response| {
                let (raw, mut values) = (raw.clone(), values.clone());
                async move {
                    let response = response.map_err(|e| self.step_error(name, at, e))?;
                    keep(outputs, response, &mut values);
                    for (i, step) in self.steps.iter().enumerate().skip(at + 1) {
                        self.run_step(name, i, step, &mut values, manager, &raw)
                            .await?;
                    }
                    self.answer(name, version, &raw, values)
                }
            })
            .boxed()
    }

    /// Whether the pipeline answers a stream request with a stream of responses: one of its
    /// model steps streams (their models are loaded to find out).
    pub async fn streams(&self, manager: &ModelManager) -> bool {
        self.streaming_step(manager, 0).await.is_some()
    }

    /// The first model step from `from` on whose model streams its responses; a model that
    /// cannot load counts as not streaming (its step fails when it runs).
    async fn streaming_step(&self, manager: &ModelManager, from: usize) -> Option<usize> {
        for (i, step) in self.steps.iter().enumerate().skip(from) {
            if let Step::Model { model, version, .. } = step {
                if manager
                    .get_or_load(model, version.as_deref())
                    .await
                    .is_ok_and(|h| h.streams)
                {
                    return Some(i);
                }
            }
        }
        None
    }

    /// The request's tensors as named values, every input the pipeline takes among them; a
    /// request of a pipeline that would run inside itself is refused.
    fn start(
        &self,
        name: &str,
        raw: &mut RawRequest,
    ) -> Result<BTreeMap<String, Value>, InferError> {
        if let Some(at) = raw.within.iter().position(|p| p == name) {
            let path: Vec<&str> = raw.within[at..].iter().map(String::as_str).collect();
            return Err(InferError::invalid(format!(
                "pipeline '{name}' runs inside itself ({} -> {name}): a pipeline may be a step of \
                 another, not of itself",
                path.join(" -> ")
            )));
        }
        let mut values: BTreeMap<String, Value> = BTreeMap::new();
        for t in raw.inputs.drain(..) {
            values.insert(t.name, Value::Tensor(t.tensor));
        }
        for b in raw.byte_inputs.drain(..) {
            values.insert(b.name.clone(), Value::Bytes(b));
        }
        for input in &self.inputs {
            if !values.contains_key(input) {
                return Err(InferError::invalid(format!(
                    "pipeline '{name}' takes input '{input}', which the request lacks"
                )));
            }
        }
        Ok(values)
    }

    /// Runs step `index`, its error naming the step; a model step gives its model's receipt.
    async fn run_step(
        &self,
        name: &str,
        index: usize,
        step: &Step,
        values: &mut BTreeMap<String, Value>,
        manager: &ModelManager,
        raw: &RawRequest,
    ) -> Result<Option<StepReceipt>, InferError> {
        self.step(name, index, step, values, manager, raw)
            .await
            .map_err(|e| self.step_error(name, index, e))
    }

    /// `e`, as the error of step `index`.
    fn step_error(&self, name: &str, index: usize, e: InferError) -> InferError {
        let step = self
            .steps
            .get(index)
            .map_or_else(String::new, Step::describe);
        InferError::new(
            e.kind,
            format!(
                "pipeline '{name}', step {} ({step}): {}",
                index + 1,
                e.message
            ),
        )
    }

    /// The key of `raw` in the response cache for the pipeline load `load`: its inputs by
    /// name (byte strings in their wire form), whatever their order in the request; None when
    /// one cannot be put in that form (the request is then run, not cached).
    pub(crate) fn cache_key(
        &self,
        cache: &ResponseCache,
        load: u64,
        raw: &RawRequest,
    ) -> Option<u128> {
        let bytes = raw
            .byte_inputs
            .iter()
            .map(|b| {
                let wire =
                    sheaf_backend::Tensor::new(DataType::Bytes, b.shape.clone(), b.to_wire());
                wire.ok().map(|t| (b.name.as_str(), t))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut inputs: Vec<(&str, &sheaf_backend::Tensor)> = raw
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), &t.tensor))
            .chain(bytes.iter().map(|(n, t)| (*n, t)))
            .collect();
        inputs.sort_by(|a, b| a.0.cmp(b.0));
        Some(cache.key(load, inputs.into_iter()))
    }

    /// What the response cache keeps of `answer`, which holds every output: each output's
    /// tensor in the order of [`Pipeline::outputs`] (byte strings in their wire form).
    pub(crate) fn to_cache(&self, answer: &InferResponse) -> Option<Vec<sheaf_backend::Tensor>> {
        self.outputs
            .iter()
            .map(|name| {
                if let Some(t) = answer.outputs.iter().find(|t| &t.name == name) {
                    return Some(t.tensor.clone());
                }
                let b = answer.byte_outputs.iter().find(|b| &b.name == name)?;
                sheaf_backend::Tensor::new(DataType::Bytes, b.shape.clone(), b.to_wire()).ok()
            })
            .collect()
    }

    /// The answer to `raw` from what the response cache kept ([`Pipeline::to_cache`]): the
    /// outputs it asks for, else every output.
    pub(crate) fn cached_answer(
        &self,
        name: &str,
        version: &str,
        raw: &RawRequest,
        kept: Vec<sheaf_backend::Tensor>,
    ) -> Result<InferResponse, InferError> {
        let mut values = BTreeMap::new();
        for (output, tensor) in self.outputs.iter().zip(kept) {
            let value = match tensor.dtype() {
                DataType::Bytes => Value::Bytes(ByteTensor::from_wire(
                    output.clone(),
                    tensor.shape().to_vec(),
                    tensor.data(),
                )?),
                _ => Value::Tensor(tensor),
            };
            values.insert(output.clone(), value);
        }
        self.answer(name, version, raw, values)
    }

    /// `answer`, which holds every output, as the answer to `raw`: the outputs it asks for
    /// (an output the pipeline lacks is a 400), else every output.
    pub(crate) fn pick(
        &self,
        name: &str,
        version: &str,
        raw: &RawRequest,
        answer: InferResponse,
    ) -> Result<InferResponse, InferError> {
        let receipt = answer.receipt;
        let mut values = BTreeMap::new();
        for t in answer.outputs {
            values.insert(t.name, Value::Tensor(t.tensor));
        }
        for b in answer.byte_outputs {
            values.insert(b.name.clone(), Value::Bytes(b));
        }
        let mut picked = self.answer(name, version, raw, values)?;
        picked.receipt = receipt;
        Ok(picked)
    }

    /// The pipeline's answer: the outputs the request asks for (else every output), from the
    /// values the steps made.
    fn answer(
        &self,
        name: &str,
        version: &str,
        raw: &RawRequest,
        mut values: BTreeMap<String, Value>,
    ) -> Result<InferResponse, InferError> {
        let mut outputs = Vec::new();
        let mut byte_outputs = Vec::new();
        let wanted = raw.outputs.clone().unwrap_or_else(|| self.outputs.clone());
        for out in wanted {
            if !self.outputs.contains(&out) {
                return Err(InferError::invalid(format!(
                    "pipeline '{name}' has no output '{out}' (its outputs are {:?})",
                    self.outputs
                )));
            }
            match values.remove(&out) {
                Some(Value::Tensor(tensor)) => outputs.push(NamedTensor { name: out, tensor }),
                Some(Value::Bytes(mut b)) => {
                    b.name = out;
                    byte_outputs.push(b);
                }
                None => {
                    return Err(InferError::internal(format!(
                        "pipeline '{name}': no step made output '{out}'"
                    )))
                }
            }
        }
        Ok(InferResponse {
            id: raw.id.clone(),
            model_name: name.to_string(),
            model_version: version.to_string(),
            outputs,
            byte_outputs,
            receipt: None,
            // A step's own response parameters stay with the step.
            parameters: None,
        })
    }

    async fn step(
        &self,
        name: &str,
        index: usize,
        step: &Step,
        values: &mut BTreeMap<String, Value>,
        manager: &ModelManager,
        raw: &RawRequest,
    ) -> Result<Option<StepReceipt>, InferError> {
        let take = |values: &BTreeMap<String, Value>, name: &str| {
            values
                .get(name)
                .cloned()
                .ok_or_else(|| InferError::internal(format!("no value '{name}' reached this step")))
        };
        let tensor = |v: Value, name: &str| match v {
            Value::Tensor(t) => Ok(t),
            Value::Bytes(_) => Err(InferError::invalid(format!(
                "'{name}' is BYTES; this step takes a float tensor"
            ))),
        };
        match step {
            Step::Model {
                model,
                version,
                inputs,
                outputs,
            } => {
                let handle = manager.get_or_load(model, version.as_deref()).await?;
                if handle.streams {
                    return Err(InferError::invalid(format!(
                        "model '{model}' streams its responses (decoupled): ask the pipeline \
                         for a stream (Accept: text/event-stream over HTTP, or a gRPC stream)"
                    )));
                }
                let request = model_request(name, &handle, inputs, outputs, values, raw)?;
                let mut response = manager.infer(&handle, request).await?;
                let receipt = response.receipt.take().map(|receipt| StepReceipt {
                    model: response.model_name.clone(),
                    version: response.model_version.clone(),
                    receipt,
                });
                keep(outputs, response, values);
                return Ok(receipt);
            }
            Step::Image(image) => {
                let Value::Bytes(b) = take(values, &image.from)? else {
                    return Err(InferError::invalid(format!(
                        "'{}' is not BYTES: the image step decodes encoded images",
                        image.from
                    )));
                };
                // The crop fixes the size; the spec only names the values.
                let spec = TensorSpec {
                    name: image.from.clone(),
                    dtype: DataType::F32,
                    shape: vec![-1, 3, -1, -1],
                };
                let decoded = crate::image::decode_input(b, &image.config, &spec).await?;
                values.insert(image.to.clone(), Value::Tensor(decoded.tensor));
            }
            Step::Classify(classify) => {
                let t = tensor(take(values, &classify.from)?, &classify.from)?;
                let labels = self.labels.get(&index).map(|l| l.as_slice());
                let classes = crate::image::classify(&classify.to, &t, classify.k, labels)?;
                values.insert(classify.to.clone(), Value::Bytes(classes));
            }
            Step::Tokenize(t) => {
                let Value::Bytes(texts) = take(values, &t.from)? else {
                    return Err(InferError::invalid(format!(
                        "'{}' is not BYTES: the tokenize step takes texts",
                        t.from
                    )));
                };
                let tokenizer = self
                    .tokenizers
                    .get(&index)
                    .ok_or_else(|| InferError::internal("the step's tokenizer was not loaded"))?;
                let (ids, mask, types) = tokens(tokenizer, &texts, t.max_tokens)?;
                values.insert(t.ids.clone(), Value::Tensor(ids));
                values.insert(t.mask.clone(), Value::Tensor(mask));
                if let Some(name) = &t.types {
                    values.insert(name.clone(), Value::Tensor(types));
                }
            }
            Step::EncodeImage(encode) => {
                let t = tensor(take(values, &encode.from)?, &encode.from)?;
                let images = crate::image::encode_output(&encode.to, &t, &encode.config).await?;
                values.insert(encode.to.clone(), Value::Bytes(images));
            }
        }
        Ok(None)
    }
}

/// The request a model step of pipeline `pipeline` sends: each of the model's inputs from its
/// value (`inputs` maps input to value; empty: each input from the value of its name), asking
/// for the `outputs` the step names (empty: every output). The model may be a pipeline itself
/// (an ensemble's step that is an ensemble).
fn model_request(
    pipeline: &str,
    handle: &ModelHandle,
    inputs: &BTreeMap<String, String>,
    outputs: &BTreeMap<String, String>,
    values: &BTreeMap<String, Value>,
    raw: &RawRequest,
) -> Result<RawRequest, InferError> {
    let mut request = RawRequest {
        priority: raw.priority,
        timeout_us: raw.timeout_us,
        parameters: raw.parameters.clone(),
        within: raw
            .within
            .iter()
            .cloned()
            .chain([pipeline.to_string()])
            .collect(),
        ..RawRequest::default()
    };
    let names: Vec<(String, String)> = if inputs.is_empty() {
        handle
            .signature
            .inputs
            .iter()
            .map(|s| (s.name.clone(), s.name.clone()))
            .collect()
    } else {
        inputs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    for (input, value) in names {
        match values.get(&value).cloned() {
            Some(Value::Tensor(t)) => request.inputs.push(NamedTensor {
                name: input,
                tensor: t,
            }),
            Some(Value::Bytes(mut b)) => {
                b.name = input;
                request.byte_inputs.push(b);
            }
            None => {
                return Err(InferError::internal(format!(
                    "no value '{value}' reached this step"
                )))
            }
        }
    }
    if !outputs.is_empty() {
        request.outputs = Some(outputs.keys().cloned().collect());
    }
    Ok(request)
}

/// A model step's answer as values, each output under the name `outputs` gives it (else its
/// own).
fn keep(
    outputs: &BTreeMap<String, String>,
    response: InferResponse,
    values: &mut BTreeMap<String, Value>,
) {
    let rename = |o: &str| outputs.get(o).cloned().unwrap_or_else(|| o.to_string());
    for t in response.outputs {
        values.insert(rename(&t.name), Value::Tensor(t.tensor));
    }
    for b in response.byte_outputs {
        values.insert(rename(&b.name), Value::Bytes(b));
    }
}

/// Token ids, attention mask and segment ids of `texts`, each `[texts, longest]` INT64, padded
/// with 0; a text longer than `max` tokens is refused.
fn tokens(
    tokenizer: &tokenizers::Tokenizer,
    texts: &ByteTensor,
    max: usize,
) -> Result<
    (
        sheaf_backend::Tensor,
        sheaf_backend::Tensor,
        sheaf_backend::Tensor,
    ),
    InferError,
> {
    let mut rows = Vec::with_capacity(texts.items.len());
    for (i, item) in texts.items.iter().enumerate() {
        let text = std::str::from_utf8(item)
            .map_err(|_| InferError::invalid(format!("text {i} is not UTF-8")))?;
        let encoding = tokenizer
            .encode(text, true)
            .map_err(|e| InferError::invalid(format!("text {i} cannot be tokenised: {e}")))?;
        if encoding.get_ids().len() > max {
            return Err(InferError::invalid(format!(
                "text {i} has {} tokens; this step takes at most {max}",
                encoding.get_ids().len()
            )));
        }
        rows.push(encoding);
    }
    let longest = rows.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
    let grid = |field: &dyn Fn(&tokenizers::Encoding) -> Vec<i64>| {
        let mut data = Vec::with_capacity(rows.len() * longest * 8);
        for e in &rows {
            let mut row = field(e);
            row.resize(longest, 0);
            data.extend(row.iter().flat_map(|v| v.to_le_bytes()));
        }
        sheaf_backend::Tensor::new(
            DataType::I64,
            vec![rows.len(), longest],
            bytes::Bytes::from(data),
        )
    };
    Ok((
        grid(&|e| e.get_ids().iter().map(|&v| i64::from(v)).collect())?,
        grid(&|e| {
            e.get_attention_mask()
                .iter()
                .map(|&v| i64::from(v))
                .collect()
        })?,
        grid(&|e| e.get_type_ids().iter().map(|&v| i64::from(v)).collect())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn load(yaml: &str) -> Result<Pipeline, String> {
        let dir = tempfile_dir();
        let path = dir.join(PIPELINE_FILE);
        std::fs::write(&path, yaml).unwrap();
        std::fs::write(dir.join("labels.txt"), "a\nb\n").unwrap();
        let p = Pipeline::load(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        p
    }

    fn tempfile_dir() -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sheaf-pipeline-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn steps_that_take_nothing_from_each_other_make_one_run() {
        let p = load(
            "inputs: [x]\nsteps:\n\
             - {model: a, inputs: {x: x}, outputs: {y: ya}}\n\
             - {model: b, inputs: {x: x}, outputs: {y: yb}}\n\
             - {model: c, inputs: {p: ya, q: yb}, outputs: {z: z}}\n\
             - classify: {from: z, to: classes, k: 1}\n\
             - {model: d, outputs: {y: yd}}\n\
             - {model: e, inputs: {x: x}, outputs: {y: ye}}\n\
             - {model: f, inputs: {x: x}}\n\
             - {model: g, inputs: {x: x}, outputs: {y: yg}}\n\
             outputs: [classes, yd, ye, yg]\n",
        )
        .unwrap();
        // b joins a; c takes theirs; classify takes c's; d takes what it will (a run of its
        // own start) and e joins it; f makes what it will, so g starts anew.
        assert_eq!(p.waves, [0..2, 2..3, 3..4, 4..6, 6..7, 7..8]);
        assert_eq!(p.makes[0], ["ya"]);
        assert_eq!(p.makes[3], ["classes"]);
    }

    #[test]
    fn the_models_the_steps_run_are_named_once_in_order() {
        let p = load(
            "inputs: [x]\nsteps:\n\
             - {model: b, inputs: {x: x}, outputs: {y: y1}}\n\
             - {model: a, inputs: {x: y1}, outputs: {y: y2}}\n\
             - {model: b, inputs: {x: y2}, outputs: {y: y3}}\n\
             - classify: {from: y3, to: c, k: 1}\n\
             outputs: [c]\n",
        )
        .unwrap();
        assert_eq!(p.models(), ["b", "a"]);
    }

    #[test]
    fn a_request_of_a_pipeline_inside_itself_is_refused_with_the_path() {
        let p = load("inputs: [x]\nsteps: [{model: m, outputs: {y: y}}]\noutputs: [y]\n").unwrap();
        let tensor = NamedTensor {
            name: "x".into(),
            tensor: sheaf_backend::Tensor::new(DataType::F32, vec![1, 1], vec![0u8; 4].into())
                .unwrap(),
        };
        let mut raw = RawRequest {
            inputs: vec![tensor.clone()],
            within: vec!["outer".into(), "p".into(), "inner".into()],
            ..RawRequest::default()
        };
        let e = p.start("p", &mut raw).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::InvalidInput);
        assert!(
            e.message
                .starts_with("pipeline 'p' runs inside itself (p -> inner -> p)"),
            "{}",
            e.message
        );
        // Inside other pipelines only, it runs.
        let mut raw = RawRequest {
            inputs: vec![tensor],
            within: vec!["outer".into()],
            ..RawRequest::default()
        };
        assert!(p.start("p", &mut raw).is_ok());
    }

    #[test]
    fn the_tensors_a_configuration_declares_are_the_pipeline_s_metadata() {
        let p = load("inputs: [x]\nsteps: [{model: m, outputs: {y: y}}]\noutputs: [y]\n").unwrap();
        let declared = |text: &str| {
            let config = crate::ModelConfig::from_yaml(text).unwrap();
            p.declared(&config, true)
        };
        let s = declared(
            "inputs: [{name: x, data_type: BYTES, dims: [1]}]\n\
             outputs: [{name: y, data_type: FP32, dims: [3]}]\n",
        )
        .unwrap();
        assert_eq!(
            (s.inputs[0].dtype, s.inputs[0].shape.as_slice()),
            (DataType::Bytes, &[-1, 1][..])
        );
        assert_eq!(s.outputs[0].shape, [-1, 3]);
        // A type left out: no metadata rather than a guess.
        let s = declared("inputs: [{name: x, dims: [1]}]\n").unwrap();
        assert!(s.inputs.is_empty() && s.outputs.is_empty());
        let e = declared("outputs: [{name: z, data_type: FP32, dims: [3]}]\n").unwrap_err();
        assert_eq!(
            e,
            "the config declares output 'z', but the pipeline's outputs are [\"y\"]"
        );
    }

    #[test]
    fn steps_are_read_and_their_values_checked() {
        let p = load(
            "inputs: [image]\nsteps:\n  - image: {from: image, to: x, crop: [8, 8], mean: [0.5, 0.5, 0.5]}\n  \
             - model: m\n    inputs: {input: x}\n    outputs: {y: logits}\n  \
             - classify: {from: logits, to: classes, k: 2, labels: labels.txt}\n  \
             - encode_image: {from: x, to: png, range: [-1, 1]}\noutputs: [classes, png]\n",
        )
        .unwrap();
        assert_eq!(p.steps.len(), 4);
        assert!(
            matches!(&p.steps[0], Step::Image(i) if i.config.crop == [8, 8] && i.config.mean == [0.5; 3])
        );
        assert_eq!(p.labels[&2].as_slice(), ["a", "b"]);
        for (yaml, says) in [
            ("inputs: [a]\nsteps: []\noutputs: []\n", "at least one step"),
            (
                "inputs: [a]\nsteps:\n  - classify: {from: nope, to: c, k: 1}\noutputs: [c]\n",
                "step 1 (classify): takes 'nope'",
            ),
            (
                "inputs: [a]\nsteps:\n  - image: {from: a, to: x}\noutputs: [x]\n",
                "needs a crop",
            ),
            (
                "inputs: [a]\nsteps:\n  - image: {from: a, to: x, crop: [2], resise: 3}\noutputs: [x]\n",
                "resise",
            ),
            ("inputs: [a]\nsteps:\n  - rotate: {from: a}\noutputs: [a]\n", "a step is"),
            (
                "inputs: [a]\nsteps:\n  - model: m\n    inputs: {x: a}\n    outputs: {y: b}\noutputs: [c]\n",
                "no step makes 'c'",
            ),
        ] {
            let e = load(yaml).unwrap_err();
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }
}
