//! A pipeline's run: its steps in order over named values (those in a row that take nothing
//! from each other at once), each model step a request through the model manager, and its
//! answer; or, where a model step streams, a stream of answers.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use sheaf_backend::{DataType, TensorSpec};

use crate::request::{ByteTensor, InferResponse, NamedTensor, RawRequest};
use crate::stages::{Receipt, StepReceipt};
use crate::{InferError, ModelHandle, ModelManager};

use super::{Pipeline, Step};

/// A value between steps.
#[derive(Debug, Clone)]
pub(super) enum Value {
    Tensor(sheaf_backend::Tensor),
    Bytes(ByteTensor),
}

impl Pipeline {
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
    pub(super) fn start(
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

    /// The pipeline's answer: the outputs the request asks for (else every output), from the
    /// values the steps made.
    pub(super) fn answer(
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
        // A traced run's steps keep the requests they send for their own traces.
        calls: raw
            .calls
            .as_ref()
            .map(|_| sheaf_backend::TraceCalls::default()),
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
