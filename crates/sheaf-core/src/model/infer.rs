//! A request's way through a loaded model: its admission (priority, timeout), its form for the
//! model (reshapes, optional inputs, what a model that sees requests one by one is told of it),
//! the lane's queue, and the answer in the client's form; a pipeline's run, and a stream of
//! answers for a decoupled model.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::batcher::{self, Admission};
use crate::frames::FRAME_IDS;
use crate::metrics::ModelLabels;
use crate::pipeline::Pipeline;
use crate::request::{validate, ByteTensor, InferRequest, InferResponse, NamedTensor, RawRequest};
use crate::stages::Receipt;
use crate::InferError;
use futures::StreamExt;

use super::ModelHandle;

impl ModelHandle {
    /// Runs the steps of this pipeline handle's `pipeline` for `raw`, the models through
    /// `manager`: from the response cache when the pipeline's config enables it and the same
    /// inputs were answered before (then no step runs), and recorded in its statistics as
    /// Triton records an ensemble's (see [`ModelHandle::record_run`]).
    pub(crate) async fn run_pipeline(
        &self,
        pipeline: &Pipeline,
        raw: RawRequest,
        manager: &crate::ModelManager,
    ) -> Result<InferResponse, InferError> {
        let started = std::time::Instant::now();
        // Items: dimension 0 of the first input when the pipeline batches.
        let items = match self.max_batch_size {
            0 => 1,
            _ => raw
                .inputs
                .first()
                .map(|t| t.tensor.shape().first().copied())
                .or_else(|| raw.byte_inputs.first().map(|b| b.shape.first().copied()))
                .flatten()
                .unwrap_or(1),
        };
        let (name, version) = (self.name.as_str(), self.version.as_str());
        let cached = self.cache.as_ref().zip(self.runs.as_ref());
        let key = cached.and_then(|(slot, _)| pipeline.cache_key(&slot.cache, slot.load, &raw));
        let (Some((slot, runs)), Some(key)) = (cached, key) else {
            let answer = pipeline.run(name, version, raw, manager).await;
            self.record_run(items, started, &answer);
            return answer;
        };
        if let Some(kept) = slot.cache.get(key) {
            let answer = pipeline.cached_answer(name, version, &raw, kept);
            match &answer {
                Ok(_) => runs.record_cache_hit(started.elapsed()),
                Err(e) => runs.record_failure(e.kind, started.elapsed()),
            }
            return answer;
        }
        let lookup = started.elapsed();
        // Every output is run and kept, whichever the request asks for.
        let mut raw = raw;
        let asked = RawRequest {
            id: raw.id.clone(),
            outputs: raw.outputs.take(),
            ..RawRequest::default()
        };
        let answer = pipeline.run(name, version, raw, manager).await;
        let answer = answer.and_then(|all| {
            if let Some(kept) = pipeline.to_cache(&all) {
                let stored = std::time::Instant::now();
                slot.cache.put(key, slot.load, kept);
                runs.record_cache_miss(lookup + stored.elapsed());
            }
            pipeline.pick(name, version, &asked, all)
        });
        self.record_run(items, started, &answer);
        answer
    }

    /// Records a pipeline's run of `items` items, begun at `started`, as Triton records an
    /// ensemble's: a success with its whole time, no queue of its own, and its model steps'
    /// compute phases summed, as one execution of that many items; or a failure.
    fn record_run(
        &self,
        items: usize,
        started: std::time::Instant,
        answer: &Result<InferResponse, InferError>,
    ) {
        let Some(runs) = &self.runs else { return };
        let took = started.elapsed();
        match answer {
            Ok(answer) => {
                let phases = answer
                    .receipt
                    .as_ref()
                    .map(Receipt::phases)
                    .unwrap_or_default();
                runs.record_batch(items.max(1), phases);
                runs.record_success(took, std::time::Duration::ZERO, phases);
            }
            Err(e) => runs.record_failure(e.kind, took),
        }
    }

    /// Validates `raw` against the signature, queues it, and returns its outputs. Encoded
    /// images for `image_inputs` are decoded first; `image_outputs` and outputs asked for as
    /// classes are converted last (see [`crate::image`]).
    pub async fn infer(&self, mut raw: RawRequest) -> Result<InferResponse, InferError> {
        if self.is_generator() {
            return Err(InferError::invalid(format!(
                "model '{}' is a generation model, which takes text rather than tensors: use \
                 POST /v1/chat/completions, /v1/completions or /v2/models/{}/generate",
                self.name, self.name
            )));
        }
        if self.pipeline.is_some() {
            return Err(InferError::internal(format!(
                "pipeline '{}' runs through the model manager",
                self.name
            )));
        }
        if self.streams {
            return Err(InferError::invalid(format!(
                "model '{}' answers with a stream of responses (decoupled): send the request on \
                 a gRPC stream (ModelStreamInfer), or ask for server-sent events over HTTP \
                 (Accept: text/event-stream)",
                self.name
            )));
        }
        let classification = std::mem::take(&mut raw.classification);
        let sequence = raw.sequence.take();
        // Frames named by id become the frames' input.
        let mut frame_ids = None;
        if let Some(store) = &self.frames {
            if let Some(i) = raw.inputs.iter().position(|t| t.name == FRAME_IDS) {
                let ids = raw.inputs.remove(i);
                let (frames, ids) = store.gather(&ids.tensor)?;
                raw.inputs.push(frames);
                frame_ids = Some(ids);
                // The ids always come back; asking for them is no error.
                if let Some(outputs) = &mut raw.outputs {
                    outputs.retain(|o| o != FRAME_IDS);
                }
            }
        }
        let decoded = self
            .decode_images(std::mem::take(&mut raw.byte_inputs))
            .await;
        let checked = decoded
            .and_then(|images| {
                raw.inputs.extend(images);
                validate(
                    raw,
                    &self.signature,
                    self.max_batch_size > 0,
                    &self.optional,
                )
            })
            .and_then(|r| self.to_model(r))
            .and_then(|r| {
                let mut admission = self.admission(r.priority, r.timeout_us)?;
                admission.info = request_info(&r, sequence.as_ref(), &self.signature);
                if self.config.iterative_sequence {
                    self.iterative(&r, &mut admission.info)?;
                }
                Ok((admission, r))
            });
        let (admission, request) = checked.inspect_err(|e| {
            // Refused before any device was chosen: counted without a device.
            let labels = ModelLabels {
                model: self.name.clone(),
                version: self.version.clone(),
                device: String::new(),
            };
            self.metrics.record_failure(&labels, e.kind);
        })?;
        let (outputs, mut receipt, parameters) = match &self.sequences {
            Some(sequences) => {
                let flags = sequence.as_ref().ok_or_else(|| self.needs_sequence())?;
                if request.items != 1 {
                    return Err(InferError::invalid(format!(
                        "a request of a sequence carries one item, and this one has {}",
                        request.items
                    )));
                }
                let (outputs, receipt) = sequences.step(flags, request.inputs, admission).await?;
                (outputs, receipt, None)
            }
            None => {
                let admission = Admission {
                    reads: self.reads(&request.outputs),
                    ..admission
                };
                self.run(request.inputs, request.items, admission).await?
            }
        };
        if let (Some(calls), Some(receipt)) = (&request.calls, receipt.as_mut()) {
            receipt.called(calls);
        }
        let mut tensors = Vec::with_capacity(request.outputs.len());
        let mut byte_outputs = Vec::new();
        for &i in &request.outputs {
            let name = &self.signature.outputs[i].name;
            // Tensors share their bytes, so a clone here copies no data.
            let tensor = self.to_client(i, outputs[i].clone())?;
            if let Some((_, k)) = classification.iter().find(|(n, _)| n == name) {
                let labels = self.labels.as_deref().map(Vec::as_slice);
                byte_outputs.push(crate::image::classify(name, &tensor, *k, labels)?);
            } else if let Some(config) = self.config.image_outputs.get(name) {
                byte_outputs.push(crate::image::encode_output(name, &tensor, config).await?);
            } else {
                self.push_output(i, tensor, &mut tensors, &mut byte_outputs)?;
            }
        }
        if let Some(ids) = frame_ids {
            let data: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
            tensors.push(NamedTensor {
                name: FRAME_IDS.to_string(),
                tensor: sheaf_backend::Tensor::new(
                    sheaf_backend::DataType::I64,
                    vec![ids.len()],
                    bytes::Bytes::from(data),
                )?,
            });
        }
        if let Some((name, _)) = classification
            .iter()
            .find(|(n, _)| !self.signature.outputs.iter().any(|o| &o.name == n))
        {
            return Err(InferError::invalid(format!(
                "classification asked of '{name}', which is not an output of model '{}'",
                self.name
            )));
        }
        Ok(InferResponse {
            id: request.id,
            model_name: self.name.clone(),
            model_version: self.version.clone(),
            outputs: tensors,
            byte_outputs,
            receipt,
            parameters,
        })
    }

    /// The model's outputs for checked `inputs`: from the response cache when this model uses
    /// it and the same inputs were answered before (the queue is not touched then, there is no
    /// receipt of a batch, and the cache keeps no parameters), else from a batch, with the
    /// parameters the model answered with.
    async fn run(
        &self,
        inputs: Vec<sheaf_backend::Tensor>,
        items: usize,
        admission: Admission,
    ) -> Result<
        (
            Vec<sheaf_backend::Tensor>,
            Option<Receipt>,
            Option<crate::request::Parameters>,
        ),
        InferError,
    > {
        let Some(slot) = &self.cache else {
            let lane = self.route(items);
            let a = lane.batcher.submit(inputs, items, admission).await?;
            return Ok((a.outputs, Some(a.receipt), a.parameters));
        };
        let looked = std::time::Instant::now();
        let names = self.signature.inputs.iter().map(|s| s.name.as_str());
        let key = slot
            .cache
            .key(slot.load, names.zip(&inputs), admission.reads.as_deref());
        if let Some(outputs) = slot.cache.get(key) {
            // A hit runs on no device; the model's statistics sum its devices.
            if let Some(lane) = self.lanes.first() {
                lane.stats.record_cache_hit(looked.elapsed());
            }
            return Ok((outputs, None, None));
        }
        let lookup = looked.elapsed();
        let lane = self.route(items);
        let a = lane.batcher.submit(inputs, items, admission).await?;
        let stored = std::time::Instant::now();
        slot.cache.put(key, slot.load, a.outputs.clone());
        lane.stats.record_cache_miss(lookup + stored.elapsed());
        Ok((a.outputs, Some(a.receipt), a.parameters))
    }

    /// Which outputs a request for `outputs` (indices) reads, where it is not every one (see
    /// [`Admission::reads`]).
    fn reads(&self, outputs: &[usize]) -> Option<Arc<[bool]>> {
        let mut reads = vec![false; self.signature.outputs.len()];
        for &i in outputs {
            if let Some(r) = reads.get_mut(i) {
                *r = true;
            }
        }
        (!reads.iter().all(|&r| r)).then(|| reads.into())
    }

    /// Queues `raw` for a streaming model ([`ModelHandle::streams`]) and returns its responses
    /// as they come; the stream ends with the request, or with the error that cut it short.
    /// A request must fit one batch (`max_batch_size` items): its responses are its own.
    pub async fn infer_stream(
        self: Arc<Self>,
        mut raw: RawRequest,
    ) -> Result<futures::stream::BoxStream<'static, Result<InferResponse, InferError>>, InferError>
    {
        if !self.streams {
            return Err(InferError::invalid(format!(
                "model '{}' answers each request once: use its infer route",
                self.name
            )));
        }
        let bytes = self
            .decode_images(std::mem::take(&mut raw.byte_inputs))
            .await?;
        raw.inputs.extend(bytes);
        let request = self.to_model(validate(
            raw,
            &self.signature,
            self.max_batch_size > 0,
            &self.optional,
        )?)?;
        if self.max_batch_size > 0 && request.items > self.max_batch_size {
            return Err(InferError::invalid(format!(
                "request has {} items; a streaming model takes at most {} (its max_batch_size) \
                 in one request",
                request.items, self.max_batch_size
            )));
        }
        let mut admission = self.admission(request.priority, request.timeout_us)?;
        admission.info = request_info(&request, None, &self.signature);
        if self.config.iterative_sequence {
            self.iterative(&request, &mut admission.info)?;
        }
        let (parts, done) = {
            let lane = self.route(request.items);
            lane.batcher
                .submit_stream(request.inputs, request.items, admission)
                .await?
        };
        let (id, wanted) = (request.id, request.outputs);
        let responses = futures::stream::unfold(Some(parts), |parts| async move {
            let mut parts = parts?;
            let part = parts.recv().await?;
            Some((part, Some(parts)))
        })
        .map(move |part| {
            let (outputs, parameters) = part?;
            let mut tensors = Vec::with_capacity(wanted.len());
            let mut byte_outputs = Vec::new();
            for &i in &wanted {
                if let Some(tensor) = outputs.get(i) {
                    let tensor = self.to_client(i, tensor.clone())?;
                    self.push_output(i, tensor, &mut tensors, &mut byte_outputs)?;
                }
            }
            Ok(InferResponse {
                id: id.clone(),
                model_name: self.name.clone(),
                model_version: self.version.clone(),
                outputs: tensors,
                byte_outputs,
                receipt: None,
                parameters,
            })
        });
        // After the last response, the answer that closes the request: an error ends the
        // stream with it.
        let end =
            futures::stream::once(done).filter_map(|answer| async move { answer.err().map(Err) });
        Ok(Box::pin(responses.chain(end)))
    }

    /// A checked request with its inputs in the shapes the model takes ([`crate::reshape`]),
    /// or refused where the model could not answer each of its items ([`crate::ragged`]).
    fn to_model(&self, mut request: InferRequest) -> Result<InferRequest, InferError> {
        if let Some(r) = &self.ragged {
            r.admit(request.items).map_err(InferError::invalid)?;
        }
        if let Some(r) = &self.reshapes {
            request.inputs = r.to_model(request.inputs)?;
        }
        Ok(request)
    }

    /// Output `i` of an answer in the shape clients get ([`crate::reshape`]).
    fn to_client(
        &self,
        i: usize,
        tensor: sheaf_backend::Tensor,
    ) -> Result<sheaf_backend::Tensor, InferError> {
        match &self.reshapes {
            Some(r) => r.to_client(i, tensor),
            None => Ok(tensor),
        }
    }

    /// Adds output `i` of an answer to a response: as a tensor, or as byte strings when it is
    /// BYTES.
    fn push_output(
        &self,
        i: usize,
        tensor: sheaf_backend::Tensor,
        tensors: &mut Vec<NamedTensor>,
        bytes: &mut Vec<ByteTensor>,
    ) -> Result<(), InferError> {
        let name = self.signature.outputs[i].name.clone();
        if tensor.dtype() == sheaf_backend::DataType::Bytes {
            bytes.push(ByteTensor::from_wire(
                name,
                tensor.shape().to_vec(),
                tensor.data(),
            )?);
        } else {
            tensors.push(NamedTensor { name, tensor });
        }
        Ok(())
    }

    /// The tensors of a request's BYTES inputs: encoded images decoded for the inputs the
    /// model's `image_inputs` names, byte strings kept as they are for inputs the model takes as
    /// BYTES; any other BYTES input is refused.
    pub async fn decode_images(
        &self,
        inputs: Vec<ByteTensor>,
    ) -> Result<Vec<NamedTensor>, InferError> {
        let mut out = Vec::with_capacity(inputs.len());
        for input in inputs {
            let config = self.config.image_inputs.get(&input.name);
            let spec = self.signature.inputs.iter().find(|s| s.name == input.name);
            // A model that takes byte strings (a Python model) gets them as they are.
            if let (None, Some(spec)) = (config, spec) {
                if spec.dtype == sheaf_backend::DataType::Bytes {
                    let tensor = sheaf_backend::Tensor::new(
                        sheaf_backend::DataType::Bytes,
                        input.shape.clone(),
                        input.to_wire(),
                    )?;
                    out.push(NamedTensor {
                        name: input.name,
                        tensor,
                    });
                    continue;
                }
            }
            let (Some(config), Some(spec)) = (config, spec) else {
                return Err(InferError::invalid(format!(
                    "input '{}' is BYTES, but model '{}' takes no encoded images there (its \
                     config names no image_inputs.{})",
                    input.name, self.name, input.name
                )));
            };
            out.push(crate::image::decode_input(input, config, spec).await?);
        }
        Ok(out)
    }

    /// The priority level and timeout of a request, from its parameters and the model's defaults.
    pub(crate) fn admission(
        &self,
        priority: Option<u64>,
        timeout_us: Option<u64>,
    ) -> Result<Admission, InferError> {
        let levels = self.config.priority_levels;
        let level = match priority {
            None | Some(0) => self.config.default_priority_level.unwrap_or(levels),
            Some(p) if p <= levels as u64 => p as usize,
            Some(p) => {
                return Err(InferError::invalid(format!(
                "priority {p} is outside 1..={levels} (model '{}' has {levels} priority level{})",
                self.name,
                if levels == 1 { "" } else { "s" }
            )))
            }
        };
        // The level's own default timeout and override rule, where its queue policy sets them.
        let policy = self.config.priority_queue_policy.get(&level);
        let default_timeout_us = policy
            .and_then(|p| p.default_timeout_us)
            .unwrap_or(self.config.default_timeout_us);
        let allow_override = policy
            .and_then(|p| p.allow_timeout_override)
            .or(self.config.allow_timeout_override);
        let timeout_us = effective_timeout_us(timeout_us, default_timeout_us, allow_override);
        let timeout = (timeout_us > 0).then(|| batcher::micros(timeout_us));
        Ok(Admission {
            level: level - 1,
            timeout,
            info: None,
            reads: None,
        })
    }
}

impl ModelHandle {
    /// A request to an iterative model (`sequence_batching { iterative_sequence: true }`) is a
    /// sequence of its own, run again as the model asks: one that names no sequence gets a
    /// correlation id from the server and the START flag, as Triton's iterative sequencer
    /// gives it (later runs have no flags). Whole, it must fit one batch.
    fn iterative(
        &self,
        request: &crate::InferRequest,
        info: &mut Option<Arc<sheaf_backend::RequestInfo>>,
    ) -> Result<(), InferError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        if self.max_batch_size > 0 && request.items > self.max_batch_size {
            return Err(InferError::invalid(format!(
                "request has {} items; an iterative model takes at most {} (its max_batch_size) \
                 in one request, as each request runs again on its own",
                request.items, self.max_batch_size
            )));
        }
        let mut filled = info.as_deref().cloned().unwrap_or_default();
        if filled.correlation_id.is_none() {
            filled.correlation_id = Some(sheaf_backend::CorrelationId::Number(
                NEXT.fetch_add(1, Ordering::Relaxed),
            ));
            filled.flags |= sheaf_backend::RequestInfo::SEQUENCE_START;
        }
        *info = Some(Arc::new(filled));
        Ok(())
    }
}

/// What a model that sees its requests one by one is told of a request besides its tensors:
/// its id, its sequence, the outputs it asked for when they are not every output in order, and
/// its other parameters. None when there is nothing to tell (no allocation then).
fn request_info(
    request: &crate::InferRequest,
    sequence: Option<&crate::SequenceFlags>,
    signature: &sheaf_backend::Signature,
) -> Option<Arc<sheaf_backend::RequestInfo>> {
    let id = request.id.as_deref().filter(|id| !id.is_empty());
    let outputs = &request.outputs;
    let every = outputs.len() == signature.outputs.len()
        && outputs.iter().enumerate().all(|(k, &i)| k == i);
    if id.is_none()
        && sequence.is_none()
        && every
        && request.parameters.is_none()
        && request.absent.is_empty()
        && request.calls.is_none()
    {
        return None;
    }
    let asked = if every {
        Vec::new()
    } else {
        outputs
            .iter()
            .filter_map(|&i| signature.outputs.get(i).map(|o| o.name.clone()))
            .collect()
    };
    Some(Arc::new(sheaf_backend::RequestInfo {
        id: id.unwrap_or_default().to_string(),
        correlation_id: sequence.map(|s| match &s.id {
            crate::SequenceId::Number(n) => sheaf_backend::CorrelationId::Number(*n),
            crate::SequenceId::Text(t) => sheaf_backend::CorrelationId::Text(t.clone()),
        }),
        parameters: request
            .parameters
            .as_ref()
            .and_then(|p| serde_json::to_string(p.as_ref()).ok())
            .unwrap_or_default(),
        flags: sequence.map_or(0, |s| {
            use sheaf_backend::RequestInfo as Info;
            (if s.start { Info::SEQUENCE_START } else { 0 })
                | (if s.end { Info::SEQUENCE_END } else { 0 })
        }),
        requested_outputs: asked,
        absent: request
            .absent
            .iter()
            .filter_map(|&i| signature.inputs.get(i).map(|s| s.name.clone()))
            .collect(),
        calls: request.calls.clone(),
    }))
}

/// A request's timeout in microseconds (0: none), from its own `timeout` and its level's
/// default, under the level's `allow_timeout_override` (see
/// [`ModelConfig::allow_timeout_override`]).
fn effective_timeout_us(asked: Option<u64>, default_us: u64, allow_override: Option<bool>) -> u64 {
    let asked = asked.filter(|&t| t > 0);
    match (asked, allow_override) {
        (None, _) | (Some(_), Some(false)) => default_us,
        (Some(t), None) => t,
        (Some(t), Some(true)) if default_us == 0 => t,
        (Some(t), Some(true)) => t.min(default_us),
    }
}

#[cfg(test)]
mod tests {
    use super::effective_timeout_us;

    #[test]
    fn a_request_s_timeout_counts_as_its_level_s_override_rule_says() {
        // Unset: the request's own timeout replaces the default, longer or shorter.
        assert_eq!(effective_timeout_us(Some(900), 500, None), 900);
        assert_eq!(effective_timeout_us(None, 500, None), 500);
        // Refused: the default holds.
        assert_eq!(effective_timeout_us(Some(100), 500, Some(false)), 500);
        assert_eq!(effective_timeout_us(Some(100), 0, Some(false)), 0);
        // Allowed: shorter only, and any timeout where there is no default.
        assert_eq!(effective_timeout_us(Some(100), 500, Some(true)), 100);
        assert_eq!(effective_timeout_us(Some(900), 500, Some(true)), 500);
        assert_eq!(effective_timeout_us(Some(900), 0, Some(true)), 900);
        // A timeout of 0 is none asked.
        assert_eq!(effective_timeout_us(Some(0), 500, Some(true)), 500);
    }
}
