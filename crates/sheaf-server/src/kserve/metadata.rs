//! Server and model metadata, and Triton-shaped statistics, as JSON.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sheaf_backend::{Signature, TensorSpec};
use sheaf_core::ragged::{BatchInput, BatchOutput};
use sheaf_core::sequence::{ControlKind, SequenceConfig, SequenceStrategy};
use sheaf_core::stats::CounterSnapshot;
use sheaf_core::{ModelHandle, ModelMetadata, ModelStatistics};

/// Protocol extensions sheaf implements, by Triton's names: `sequence` (stateful models'
/// sequence ids and flags), `schedule_policy` (a request's `priority` and `timeout`) and
/// `parameters` (request and response parameters) among them.
pub const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "classification",
    "sequence",
    "schedule_policy",
    "parameters",
    "system_shared_memory",
    "statistics",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
    "trace",
];

/// `GET /v2`, for the server named `id`.
pub fn server(id: &str) -> Value {
    json!({
        "name": id,
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    })
}

/// `GET /v2/models/{m}`: a generation model lists no tensors (it takes text on the
/// OpenAI-compatible routes).
pub fn model(m: &ModelMetadata) -> Value {
    let tensors = |specs: &[TensorSpec]| -> Vec<Value> {
        specs
            .iter()
            .map(|s| json!({ "name": s.name, "datatype": s.dtype.as_str(), "shape": s.shape }))
            .collect()
    };
    json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": tensors(&m.inputs),
        "outputs": tensors(&m.outputs),
    })
}

fn counter(c: CounterSnapshot) -> Value {
    json!({ "count": c.count, "ns": c.ns })
}

/// One entry of `model_stats` in Triton's statistics extension, with the model manager's
/// figures (`memory_usage`, and sheaf's `load_count`, `eviction_count`, `memory_source`).
pub fn model_stats(m: &ModelStatistics) -> Value {
    let (handle, s, info) = (&m.handle, &m.stats, m.info.as_ref());
    let memory_usage: Vec<Value> = info
        .map(|i| i.memory_usage())
        .unwrap_or_default()
        .into_iter()
        .map(|(kind, id, bytes)| json!({ "type": kind, "id": id, "byte_size": bytes }))
        .collect();
    json!({
        "name": handle.name,
        "version": handle.version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": counter(s.success),
            "fail": counter(s.fail),
            "queue": counter(s.queue),
            "compute_input": counter(s.compute_input),
            "compute_infer": counter(s.compute_infer),
            "compute_output": counter(s.compute_output),
            "cache_hit": counter(s.cache_hit),
            "cache_miss": counter(s.cache_miss),
            // sheaf's stages outside the batch (see sheaf_core::stages), counted per answer
            // written: with queue and compute_*, they add up to `request`.
            "receive": counter(s.receive),
            "batch_wait": counter(s.batch_wait),
            "reply": counter(s.reply),
            "send": counter(s.send),
            "request": counter(s.request),
        },
        "batch_stats": s.batches.iter().map(|b| json!({
            "batch_size": b.batch_size,
            "compute_input": counter(b.compute_input),
            "compute_infer": counter(b.compute_infer),
            "compute_output": counter(b.compute_output),
        })).collect::<Vec<_>>(),
        "memory_usage": memory_usage,
        "load_count": info.map_or(0, |i| i.loads),
        "eviction_count": info.map_or(0, |i| i.evictions),
        "memory_source": info.map_or("unknown", |i| i.memory_source.name()),
    })
}

/// A model's configuration in Triton's terms (`GET /v2/models/{m}/config`, gRPC ModelConfig),
/// built once and rendered as JSON or protobuf.
#[derive(Debug, Clone, PartialEq)]
pub struct TritonConfig {
    pub name: String,
    pub platform: &'static str,
    pub backend: &'static str,
    pub max_batch_size: usize,
    pub inputs: Vec<ConfigTensor>,
    pub outputs: Vec<ConfigTensor>,
    pub preferred_batch_sizes: Vec<usize>,
    pub max_queue_delay_us: u64,
    /// Where the instances run: a group per kind of device.
    pub instance_groups: Vec<InstanceGroup>,
    pub default_model_filename: String,
    /// The configuration's `parameters`, each a string as Triton's `string_value`.
    pub parameters: BTreeMap<String, String>,
    /// The model answers a request with a stream of responses (Triton's
    /// `model_transaction_policy { decoupled: true }`).
    pub decoupled: bool,
    /// A stateful model's `sequence_batching` (then there is no `dynamic_batching`).
    pub sequence: Option<SequenceView>,
    /// A pipeline's model steps, as Triton's `ensemble_scheduling` (then there is no
    /// `dynamic_batching` and no backend).
    pub ensemble: Option<Vec<EnsembleStep>>,
    /// The inputs made for each batch of ragged inputs (Triton's `batch_input`).
    pub batch_inputs: Vec<BatchInput>,
    /// The outputs scattered back by a ragged input (Triton's `batch_output`).
    pub batch_outputs: Vec<BatchOutput>,
}

/// One `instance_group`: `count` instances on each of `gpus`, or on the CPU when `gpus` is
/// empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceGroup {
    pub count: usize,
    /// The CUDA device ordinals (Triton's `KIND_GPU`); empty: `KIND_CPU`.
    pub gpus: Vec<i32>,
}

impl InstanceGroup {
    /// Triton's name of the group's kind.
    pub fn kind(&self) -> &'static str {
        if self.gpus.is_empty() {
            "KIND_CPU"
        } else {
            "KIND_GPU"
        }
    }
}

/// The instance groups of a model served on `devices` (`cpu`, `cuda:N`), `count` on each: the
/// GPUs in one group, as Triton lists `count` per GPU, and the CPU in another. A model with no
/// devices of its own (a pipeline, a generation engine) lists one CPU group.
fn instance_groups<'a>(devices: impl Iterator<Item = &'a str>, count: usize) -> Vec<InstanceGroup> {
    let mut gpus = Vec::new();
    let mut cpu = false;
    for device in devices {
        match device.strip_prefix("cuda:").map(str::parse::<i32>) {
            Some(Ok(ordinal)) => gpus.push(ordinal),
            _ => cpu = true,
        }
    }
    // A stateful model's lanes are its instances, several on one device.
    gpus.sort_unstable();
    gpus.dedup();
    let mut groups = Vec::new();
    if !gpus.is_empty() {
        groups.push(InstanceGroup { count, gpus });
    }
    if cpu || groups.is_empty() {
        groups.push(InstanceGroup {
            count,
            gpus: Vec::new(),
        });
    }
    groups
}

/// One step of `ensemble_scheduling`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleStep {
    pub model_name: String,
    /// -1: the version served.
    pub model_version: i64,
    /// The model's input <- the ensemble's tensor.
    pub input_map: BTreeMap<String, String>,
    /// The model's output -> the ensemble's tensor.
    pub output_map: BTreeMap<String, String>,
}

/// `sequence_batching` in Triton's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceView {
    pub config: SequenceConfig,
    /// The data type (`TYPE_FP32`...) of each control input, in the config's order.
    pub control_types: Vec<String>,
    /// The data type of each state, in the config's order.
    pub state_types: Vec<String>,
    /// Each state's dims per item.
    pub state_dims: Vec<Vec<i64>>,
    /// Each state's dims when its sequence starts (`initial_state.dims`).
    pub initial_dims: Vec<Vec<i64>>,
}

/// An input or output in Triton's configuration: dims exclude the batch dimension when the
/// model batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigTensor {
    pub name: String,
    /// `TYPE_FP32`, `TYPE_INT64`, ...
    pub data_type: String,
    pub dims: Vec<i64>,
    /// An input a request may leave out (Triton's `optional`); false for outputs.
    pub optional: bool,
    /// An input whose requests of any shape share a batch (Triton's `allow_ragged_batch`).
    pub allow_ragged_batch: bool,
}

/// Builds the Triton-shaped configuration of a loaded model, listing `signature`'s tensors (the
/// manager's [`signature_of`](sheaf_core::ModelManager::signature_of) the handle: a pipeline
/// that declares none lists those its steps imply, as its metadata does).
pub fn model_config(handle: &ModelHandle, signature: &Signature) -> TritonConfig {
    let batched = handle.max_batch_size > 0;
    let tensors = |specs: &[TensorSpec], inputs: bool| {
        specs
            .iter()
            .map(|s| ConfigTensor {
                name: s.name.clone(),
                data_type: s.dtype.config_name().to_string(),
                dims: s.shape.iter().skip(usize::from(batched)).copied().collect(),
                optional: inputs && handle.is_optional(&s.name),
                allow_ragged_batch: inputs
                    && handle
                        .config
                        .inputs
                        .iter()
                        .any(|d| d.name == s.name && d.allow_ragged_batch),
            })
            .collect()
    };
    let ensemble = handle.pipeline.as_ref().map(|p| {
        p.model_steps()
            .into_iter()
            .map(|step| EnsembleStep {
                model_name: step.model.to_string(),
                model_version: step.version.and_then(|v| v.parse().ok()).unwrap_or(-1),
                input_map: step.inputs.clone(),
                output_map: step.outputs.clone(),
            })
            .collect()
    });
    TritonConfig {
        name: handle.name.clone(),
        platform: handle.platform,
        backend: match handle.platform {
            "onnxruntime_onnx" => "onnxruntime",
            // A pipeline runs models; it has no backend of its own, as Triton's ensembles.
            _ if ensemble.is_some() => "",
            platform => platform,
        },
        max_batch_size: handle.max_batch_size,
        inputs: tensors(&signature.inputs, true),
        outputs: tensors(&signature.outputs, false),
        preferred_batch_sizes: handle.config.preferred_batch_sizes.clone(),
        max_queue_delay_us: handle.config.max_queue_delay_us,
        instance_groups: instance_groups(
            handle.lanes().iter().map(|lane| lane.device.as_str()),
            handle.config.instances,
        ),
        default_model_filename: handle
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        parameters: handle.config.parameters.clone(),
        decoupled: handle.streams,
        sequence: sequence_view(handle),
        ensemble,
        batch_inputs: handle.config.batch_inputs.clone(),
        batch_outputs: handle.config.batch_outputs.clone(),
    }
}

/// A stateful model's sequence configuration, with the types its model gives the tensors.
fn sequence_view(handle: &ModelHandle) -> Option<SequenceView> {
    let config = handle.config.sequence_batching.clone()?;
    let model = &handle.sequences()?.model;
    let type_of = |name: &str| {
        model
            .inputs
            .iter()
            .find(|s| s.name == name)
            .map_or_else(String::new, |s| s.dtype.config_name().to_string())
    };
    let batched = usize::from(handle.max_batch_size > 0);
    let state_dims: Vec<Vec<i64>> = config
        .states
        .iter()
        .map(|s| match s.dims.is_empty() {
            false => s.dims.clone(),
            true => model
                .inputs
                .iter()
                .find(|i| i.name == s.input)
                .map(|i| i.shape.iter().skip(batched).copied().collect())
                .unwrap_or_default(),
        })
        .collect();
    // A variable dimension starts at 1 unless the configuration gives the first dims.
    let initial_dims = config
        .states
        .iter()
        .zip(&state_dims)
        .map(|(s, dims)| match s.initial_dims.is_empty() {
            true => dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect(),
            false => s.initial_dims.clone(),
        })
        .collect();
    Some(SequenceView {
        control_types: config
            .control_inputs
            .iter()
            .map(|c| type_of(&c.name))
            .collect(),
        state_types: config.states.iter().map(|s| type_of(&s.input)).collect(),
        state_dims,
        initial_dims,
        config,
    })
}

impl SequenceView {
    /// Triton's JSON form.
    pub fn to_json(&self) -> Value {
        let c = &self.config;
        let kind = |k: ControlKind| match k {
            ControlKind::Start => "CONTROL_SEQUENCE_START",
            ControlKind::End => "CONTROL_SEQUENCE_END",
            ControlKind::Ready => "CONTROL_SEQUENCE_READY",
            ControlKind::Corrid => "CONTROL_SEQUENCE_CORRID",
        };
        let controls: Vec<Value> = c
            .control_inputs
            .iter()
            .zip(&self.control_types)
            .map(|(ci, t)| {
                let mut control = json!({ "kind": kind(ci.kind), "data_type": t });
                if ci.kind != ControlKind::Corrid {
                    control["fp32_false_true"] = json!(ci.false_true);
                }
                json!({ "name": ci.name, "control": [control] })
            })
            .collect();
        let states: Vec<Value> = c
            .states
            .iter()
            .zip(&self.state_types)
            .zip(self.state_dims.iter().zip(&self.initial_dims))
            .map(|((s, t), (dims, first))| {
                let mut initial = json!({ "data_type": t, "dims": first });
                match &s.initial_data_file {
                    Some(file) => initial["data_file"] = json!(file),
                    None => initial["zero_data"] = json!(s.initial == 0.0),
                }
                json!({
                    "input_name": s.input,
                    "output_name": s.output,
                    "data_type": t,
                    "dims": dims,
                    "initial_state": [initial],
                })
            })
            .collect();
        let mut v = json!({
            "max_sequence_idle_microseconds": c.max_sequence_idle_us,
            "control_input": controls,
            "state": states,
        });
        match c.strategy {
            SequenceStrategy::Direct => {
                v["direct"] = json!({ "max_queue_delay_microseconds": c.max_queue_delay_us })
            }
            SequenceStrategy::Oldest => {
                v["oldest"] = json!({ "max_candidate_sequences": c.max_candidate_sequences })
            }
        }
        v
    }
}

impl TritonConfig {
    /// The JSON Triton returns from `GET /v2/models/{m}/config`.
    pub fn to_json(&self) -> Value {
        let tensors = |list: &[ConfigTensor]| -> Vec<Value> {
            list.iter()
                .map(|t| {
                    let mut tensor =
                        json!({ "name": t.name, "data_type": t.data_type, "dims": t.dims });
                    if t.optional {
                        tensor["optional"] = json!(true);
                    }
                    if t.allow_ragged_batch {
                        tensor["allow_ragged_batch"] = json!(true);
                    }
                    tensor
                })
                .collect()
        };
        let mut config = json!({
            "name": self.name,
            "platform": self.platform,
            "backend": self.backend,
            "max_batch_size": self.max_batch_size,
            "input": tensors(&self.inputs),
            "output": tensors(&self.outputs),
            "instance_group": self.instance_groups.iter().map(|g| {
                json!({ "name": self.name, "kind": g.kind(), "count": g.count, "gpus": g.gpus })
            }).collect::<Vec<_>>(),
            "default_model_filename": self.default_model_filename,
            "parameters": self.parameters.iter().map(|(k, v)| {
                (k.clone(), json!({ "string_value": v }))
            }).collect::<serde_json::Map<_, _>>(),
            "model_transaction_policy": { "decoupled": self.decoupled },
        });
        if let Some(steps) = &self.ensemble {
            let steps: Vec<Value> = steps
                .iter()
                .map(|s| {
                    json!({
                        "model_name": s.model_name,
                        "model_version": s.model_version,
                        "input_map": s.input_map,
                        "output_map": s.output_map,
                    })
                })
                .collect();
            config["ensemble_scheduling"] = json!({ "step": steps });
        } else if let Some(sequence) = &self.sequence {
            config["sequence_batching"] = sequence.to_json();
        } else if self.max_batch_size > 0 {
            config["dynamic_batching"] = json!({
                "preferred_batch_size": self.preferred_batch_sizes,
                "max_queue_delay_microseconds": self.max_queue_delay_us,
            });
        }
        if !self.batch_inputs.is_empty() {
            config["batch_input"] = self.batch_inputs.iter().map(|b| b.to_json()).collect();
        }
        if !self.batch_outputs.is_empty() {
            config["batch_output"] = self.batch_outputs.iter().map(|b| b.to_json()).collect();
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_groups_name_each_kind_of_device_once() {
        let cpu = instance_groups(["cpu"].into_iter(), 2);
        assert_eq!(
            cpu,
            vec![InstanceGroup {
                count: 2,
                gpus: vec![]
            }]
        );
        assert_eq!(cpu[0].kind(), "KIND_CPU");
        let gpus = instance_groups(["cuda:1", "cuda:0", "cuda:1"].into_iter(), 3);
        assert_eq!(
            gpus,
            vec![InstanceGroup {
                count: 3,
                gpus: vec![0, 1]
            }]
        );
        assert_eq!(gpus[0].kind(), "KIND_GPU");
        let both = instance_groups(["cuda:0", "cpu"].into_iter(), 1);
        assert_eq!(
            both.iter().map(InstanceGroup::kind).collect::<Vec<_>>(),
            ["KIND_GPU", "KIND_CPU"]
        );
        // A pipeline or a generation engine has no devices of its own.
        assert_eq!(instance_groups(std::iter::empty(), 1)[0].kind(), "KIND_CPU");
    }
}
