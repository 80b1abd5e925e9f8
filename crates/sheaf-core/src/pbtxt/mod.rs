//! Triton's `config.pbtxt`: a model folder written for Triton serves as it is when it has no
//! `config.yaml`.
//!
//! The file is protobuf text format. It is read without Triton's schema into a tree of fields
//! ([`parse`]), and the fields sheaf has a meaning for become a [`ModelConfig`]
//! ([`model_config`]): `max_batch_size`; `dynamic_batching` (preferred sizes, the queue delay,
//! priority levels, the default queue policy and each level's own); `sequence_batching`
//! (strategy, idle timeout, control inputs and implicit state: [`crate::sequence`]);
//! `instance_group` (count, kind and `rate_limiter`: [`crate::rate_limit`]); `response_cache`; the declared `input` and `output`
//! tensors, which are checked against the model at load; `model_warmup` ([`crate::warmup`]); `version_policy` (which version folder serves: see
//! [`crate::config::VersionPolicy`]); `parameters`, which a Python model reads; and an
//! ensemble's `ensemble_scheduling`, which makes it a pipeline ([`crate::pipeline`]). Every other
//! field is named in a warning and ignored: real files carry `optimization` and others whose
//! meaning belongs to Triton's own backends. The whole file is kept in Triton's JSON form too
//! ([`crate::model_json`]): a Python model sees every field of it.
//!
//! No crate reads text format without the schema, and a schema-bound reader refuses the fields
//! it does not know, where a Triton user wants them passed over with a warning; the format's
//! grammar is small, so it is read here.
//!
//! This file turns the fields into a [`ModelConfig`] and reads the smaller sections; [`text`]
//! reads the format, [`json`] Triton's JSON form, and [`batching`], [`sequence`],
//! [`instances`] and [`onnx`] their sections.

mod batching;
mod instances;
mod json;
mod onnx;
mod ragged;
mod sequence;
mod text;

use batching::dynamic_batching;
use instances::{instance_group, Group};
pub use json::from_json;
use onnx::{onnx_parameters, optimization};
use ragged::{batch_input, batch_output};
use sequence::sequence_batching;
use text::{boolean, count, counts, dims};
pub(crate) use text::{map_entry, message, word};
pub use text::{parse, Value};

use crate::config::{DeclaredTensor, MaxBatchSize, PolicyKind, VersionPolicy};
use crate::warmup::{WarmupInput, WarmupSample};
use crate::ModelConfig;

/// What reading a `config.pbtxt` gives: the configuration, and the fields it passed over.
#[derive(Debug)]
pub struct Read {
    pub config: ModelConfig,
    /// Dotted paths of the fields sheaf does not read (`optimization`,
    /// `dynamic_batching.preserve_ordering`…).
    pub ignored: Vec<String>,
}

/// The [`ModelConfig`] a Triton `config.pbtxt` describes.
pub fn model_config(text: &str) -> Result<Read, String> {
    model_config_of(parse(text)?)
}

/// The [`ModelConfig`] that Triton's JSON form of a configuration describes: what a load
/// request's `config` parameter carries (tritonclient's `load_model(name, config=...)`). Its
/// fields are those of `config.pbtxt`, read alike ([`from_json`]).
pub fn model_config_json(json: &serde_json::Value) -> Result<Read, String> {
    model_config_of(from_json(json)?)
}

/// A load request's `config` (Triton's JSON form of a configuration, as text) as the
/// [`ModelConfig`] to load with; the fields sheaf does not read are named in a warning.
pub fn load_config(text: &str) -> Result<ModelConfig, String> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the configuration is not JSON: {e}"))?;
    let read = model_config_json(&json)?;
    if !read.ignored.is_empty() {
        tracing::warn!(ignored = ?read.ignored, "the configuration a load gave: sheaf does not read these fields; they are ignored");
    }
    Ok(read.config)
}

fn model_config_of(fields: Vec<(String, Value)>) -> Result<Read, String> {
    let mut config = ModelConfig::default();
    let mut ignored = Vec::new();
    let mut batching_seen = false;
    let mut labels_from: Option<String> = None;
    for (name, value) in &fields {
        match name.as_str() {
            // The folder names the model, and the file's kind picks the backend.
            "name" | "platform" | "backend" | "default_model_filename" => {}
            // Read by the backend from the configuration as JSON (`triton` below): a Python
            // model in Triton's decoupled mode streams its responses.
            "model_transaction_policy" => {}
            // An ensemble's steps: read as its pipeline (`crate::pipeline`).
            "ensemble_scheduling" => {}
            "max_batch_size" => {
                config.max_batch_size = Some(MaxBatchSize::Size(count(name, value)?));
            }
            "dynamic_batching" => {
                batching_seen = true;
                dynamic_batching(value, &mut config, &mut ignored)?;
            }
            "instance_group" => {
                // A model's instances share one device here: the first group's. Later groups
                // on it add their instances; a group elsewhere is named as passed over.
                let mut first: Option<Option<String>> = None;
                for (i, group) in value.items().into_iter().enumerate() {
                    let Group {
                        instances: count,
                        device,
                        limiter,
                    } = instance_group(group, &mut ignored)?;
                    match &first {
                        None => {
                            config.instances = count;
                            config.preferred_device = device.clone();
                            config.rate_limiter = limiter;
                            first = Some(device);
                            continue;
                        }
                        Some(d) if *d == device => config.instances += count,
                        Some(d) => ignored.push(format!(
                            "instance_group[{i}] ({count} instance(s) on {}: a model's \
                             instances share the first group's device, {})",
                            device.as_deref().unwrap_or("any device"),
                            d.as_deref().unwrap_or("any device")
                        )),
                    }
                    if limiter.is_some() && limiter != config.rate_limiter {
                        ignored.push(format!(
                            "instance_group[{i}].rate_limiter (every instance takes the first \
                             group's)"
                        ));
                    }
                }
            }
            "input" | "output" => {
                for tensor in value.items() {
                    let (declared, labels) = declared_tensor(name, tensor, &mut ignored)?;
                    match name.as_str() {
                        "input" => config.inputs.push(declared),
                        _ => config.outputs.push(declared),
                    }
                    // The class names of the classification extension: one file a model.
                    match (labels, &labels_from) {
                        (Some(file), None) => {
                            config.labels = file.clone();
                            labels_from = Some(file);
                        }
                        (Some(file), Some(first)) if &file != first => ignored.push(format!(
                            "output.label_filename \"{file}\" (a model has one labels file: \
                             \"{first}\" is read)"
                        )),
                        _ => {}
                    }
                }
            }
            "batch_input" => {
                for b in value.items() {
                    config.batch_inputs.push(batch_input(b, &mut ignored)?);
                }
            }
            "batch_output" => {
                for b in value.items() {
                    config.batch_outputs.push(batch_output(b, &mut ignored)?);
                }
            }
            "parameters" => {
                for entry in value.items() {
                    parameter(entry, &mut config)?;
                }
                onnx_parameters(&mut config, &mut ignored)?;
            }
            "optimization" => optimization(value, &mut config, &mut ignored)?,
            "model_warmup" => {
                for sample in value.items() {
                    config
                        .model_warmup
                        .push(warmup_sample(sample, &mut ignored)?);
                }
            }
            "version_policy" => config.version_policy = Some(version_policy(value)?),
            "sequence_batching" => {
                // Batches of a sequence model form as without dynamic_batching, and `oldest`
                // sets its own queue delay and preferred sizes.
                if !batching_seen {
                    config.batching.policy = PolicyKind::Fixed;
                    config.max_queue_delay_us = 0;
                    batching_seen = true;
                }
                sequence_batching(value, &mut config, &mut ignored)?;
            }
            "response_cache" => {
                for (field, value) in message(name, value)? {
                    match field.as_str() {
                        "enable" => {
                            config.response_cache = boolean("response_cache.enable", value)?
                        }
                        other => ignored.push(format!("response_cache.{other}")),
                    }
                }
            }
            other => ignored.push(other.to_string()),
        }
    }
    config.triton = Some(crate::model_json::from_pbtxt(&fields));
    // Without dynamic batching, Triton runs each request as it comes.
    if !batching_seen {
        config.batching.policy = PolicyKind::Fixed;
        config.max_queue_delay_us = 0;
    }
    config.check()?;
    ignored.dedup();
    Ok(Read { config, ignored })
}

/// One `parameters { key: "k" value { string_value: "v" } }` entry.
fn parameter(entry: &Value, config: &mut ModelConfig) -> Result<(), String> {
    let (key, value) = map_entry("parameters", entry)?;
    let value = match value {
        Some(Value::Message(inner)) => inner
            .iter()
            .find(|(n, _)| n == "string_value")
            .map(|(_, v)| word("parameters.value.string_value", v).map(str::to_string))
            .transpose()?
            .unwrap_or_default(),
        _ => String::new(),
    };
    config.parameters.insert(key, value);
    Ok(())
}

/// `version_policy { latest { num_versions: 2 } }`, `{ all { } }` or `{ specific { versions:
/// [1, 3] } }`.
fn version_policy(value: &Value) -> Result<VersionPolicy, String> {
    let fields = message("version_policy", value)?;
    let [(kind, inner)] = fields else {
        return Err("version_policy: give one of latest, all or specific".into());
    };
    let path = format!("version_policy.{kind}");
    let inner = message(&path, inner)?;
    let find = |name: &str| inner.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    match kind.as_str() {
        "latest" => Ok(VersionPolicy::Latest {
            num_versions: find("num_versions")
                .map(|v| count(&format!("{path}.num_versions"), v))
                .transpose()?
                .unwrap_or(1),
        }),
        "all" => Ok(VersionPolicy::All {}),
        "specific" => Ok(VersionPolicy::Specific {
            versions: find("versions")
                .map(|v| counts(&format!("{path}.versions"), v))
                .transpose()?
                .unwrap_or_default()
                .into_iter()
                .map(|v| v as u64)
                .collect(),
        }),
        other => Err(format!(
            "version_policy: '{other}' is not a policy (latest, all or specific)"
        )),
    }
}

/// One `model_warmup` entry: `name`, `batch_size` (1 when absent), `count`, and `inputs`,
/// a map from input names to `{ data_type dims zero_data | random_data | input_data_file }`. As
/// under Triton, `zero_data` and `random_data` count where they are written, whatever their
/// value.
fn warmup_sample(value: &Value, ignored: &mut Vec<String>) -> Result<WarmupSample, String> {
    let mut sample = WarmupSample {
        name: String::new(),
        batch_size: 1,
        inputs: Default::default(),
        count: 0,
    };
    for (field, value) in message("model_warmup", value)? {
        let path = format!("model_warmup.{field}");
        match field.as_str() {
            "name" => sample.name = word(&path, value)?.to_string(),
            "batch_size" => sample.batch_size = count(&path, value)?,
            "count" => sample.count = count(&path, value)?,
            "inputs" => {
                for entry in value.items() {
                    let (key, value) = map_entry(&path, entry)?;
                    let at = format!("{path}.{key}");
                    let mut input = WarmupInput::default();
                    let value = value.ok_or(format!("{at}: no value"))?;
                    for (name, value) in message(&at, value)? {
                        let inner = format!("{at}.{name}");
                        match name.as_str() {
                            "data_type" => input.data_type = word(&inner, value)?.to_string(),
                            "dims" => input.dims = dims(&inner, value)?,
                            "zero_data" => input.zero_data = true,
                            "random_data" => input.random_data = true,
                            "input_data_file" => {
                                input.input_data_file = Some(word(&inner, value)?.to_string())
                            }
                            _ => ignored.push(inner),
                        }
                    }
                    sample.inputs.insert(key, input);
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(sample)
}

/// One `input` or `output`, and an output's `label_filename`.
fn declared_tensor(
    field: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<(DeclaredTensor, Option<String>), String> {
    let mut t = DeclaredTensor::default();
    let mut labels = None;
    for (name, value) in message(field, value)? {
        let path = format!("{field}.{name}");
        match name.as_str() {
            "name" => t.name = word(&path, value)?.to_string(),
            "data_type" => {
                let w = word(&path, value)?;
                // Triton's config names byte strings TYPE_STRING; the protocol, BYTES.
                let name = w.strip_prefix("TYPE_").unwrap_or(w);
                t.data_type = Some(if name == "STRING" { "BYTES" } else { name }.to_string());
            }
            "dims" => t.dims = dims(&path, value)?,
            "reshape" => {
                let mut shape = Vec::new();
                for (name, value) in message(&path, value)? {
                    match name.as_str() {
                        "shape" => shape = dims(&format!("{path}.shape"), value)?,
                        _ => ignored.push(format!("{path}.{name}")),
                    }
                }
                t.reshape = Some(shape);
            }
            "label_filename" if field == "output" => labels = Some(word(&path, value)?.to_string()),
            "optional" if field == "input" => {
                t.optional = match word(&path, value)?.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    other => return Err(format!("{path}: {other} is neither true nor false")),
                }
            }
            "allow_ragged_batch" if field == "input" => {
                t.allow_ragged_batch = boolean(&path, value)?
            }
            _ => ignored.push(path),
        }
    }
    if t.name.is_empty() {
        return Err(format!("{field}: a tensor without a name"));
    }
    Ok((t, labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TimeoutActionConfig;
    use crate::rate_limit::ResourceNeed;
    use crate::sequence::{ControlKind, SequenceStrategy, StateConfig};

    /// A configuration as Triton users write them, with fields sheaf passes over.
    const TRITON: &str = r#"
name: "densenet"   # the folder's name wins
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    dims: [ 3, 224, 224 ]
  }
]
output {
  name: "prob", data_type: TYPE_FP32, dims: [ 1000 ]
  label_filename: "densenet_labels.txt"
}
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 max_queue_size: 64 }
}
instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 1 ] } ]
optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
parameters { key: "x" value: { string_value: 'a' "b" } }
model_warmup [ { name: "w", batch_size: 2, count: 3
  inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: false } } } ]
"#;

    #[test]
    fn a_triton_configuration_is_read_and_the_rest_named() {
        let read = model_config(TRITON).unwrap();
        let c = &read.config;
        assert_eq!(c.max_batch_size, Some(MaxBatchSize::Size(8)));
        assert_eq!(c.preferred_batch_sizes, [4, 8]);
        assert_eq!(c.max_queue_delay_us, 100);
        assert_eq!(c.batching.policy, PolicyKind::Fixed);
        assert_eq!((c.priority_levels, c.default_priority_level), (2, Some(2)));
        assert_eq!(c.timeout_action, TimeoutActionConfig::Delay);
        assert_eq!((c.default_timeout_us, c.max_queue_size), (5000, 64));
        assert_eq!(c.instances, 2);
        assert_eq!(c.preferred_device.as_deref(), Some("cuda:1"));
        assert_eq!(c.inputs[0].name, "data_0");
        assert_eq!(c.inputs[0].data_type.as_deref(), Some("FP32"));
        assert_eq!(c.inputs[0].dims, [3, 224, 224]);
        assert_eq!(c.outputs[0].dims, [1000]);
        assert_eq!(
            read.ignored,
            [
                "dynamic_batching.preserve_ordering",
                "optimization.execution_accelerators.gpu_execution_accelerator \"tensorrt\" \
                 (sheaf runs ONNX models on ONNX Runtime's CPU and CUDA providers)"
            ]
        );
        let warm = &c.model_warmup[0];
        assert_eq!(
            (warm.name.as_str(), warm.batch_size, warm.count),
            ("w", 2, 3)
        );
        let data = &warm.inputs["data_0"];
        assert_eq!(data.data_type, "TYPE_FP32");
        assert_eq!(data.dims, [3, 224, 224]);
        // Written, so used, as under Triton.
        assert!(data.zero_data && !data.random_data && data.input_data_file.is_none());
        assert_eq!(c.parameters["x"], "ab");
        assert_eq!(c.labels, "densenet_labels.txt");
        // One labels file a model: another output's is named as passed over.
        let two = "output [ { name: \"a\" label_filename: \"a.txt\" }, \
                   { name: \"b\" label_filename: \"b.txt\" }, { name: \"c\" label_filename: \"a.txt\" } ]";
        let read = model_config(two).unwrap();
        assert_eq!(read.config.labels, "a.txt");
        assert_eq!(
            read.ignored,
            ["output.label_filename \"b.txt\" (a model has one labels file: \"a.txt\" is read)"]
        );
        let json = c.triton.as_ref().unwrap();
        assert_eq!(
            json["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]["name"],
            "tensorrt"
        );
    }

    #[test]
    fn onnx_runtime_settings_are_read_as_triton_s_onnxruntime_backend_names_them() {
        use crate::config::{ArenaExtendConfig, ConvAlgoSearchConfig, GraphOptimizationConfig};
        let read = model_config(
            "parameters { key: \"intra_op_thread_count\" value: { string_value: \"3\" } }\n\
             parameters { key: \"inter_op_thread_count\" value: { string_value: \"2\" } }\n\
             parameters { key: \"execution_mode\" value: { string_value: \"1\" } }\n\
             parameters { key: \"cudnn_conv_algo_search\" value: { string_value: \"1\" } }\n\
             parameters { key: \"enable_mem_pattern\" value: { string_value: \"0\" } }\n\
             optimization { graph { level: -1 }\n\
               execution_accelerators {\n\
                 gpu_execution_accelerator: [ { name: \"cuda\"\n\
                   parameters { key: \"gpu_mem_limit\" value: \"1073741824\" }\n\
                   parameters { key: \"arena_extend_strategy\" value: \"0\" }\n\
                   parameters { key: \"use_ep_level_unified_stream\" value: \"1\" } } ]\n\
                 cpu_execution_accelerator: [ { name: \"openvino\" } ] }\n\
               input_pinned_memory { enable: true } }",
        )
        .unwrap();
        let c = &read.config;
        assert_eq!((c.intra_op_threads, c.inter_op_threads), (3, 2));
        assert!(c.parallel_execution);
        assert_eq!(c.graph_optimization, GraphOptimizationConfig::Basic);
        assert_eq!(
            c.cuda.cudnn_conv_algo_search,
            ConvAlgoSearchConfig::Heuristic
        );
        assert_eq!(c.cuda.gpu_mem_limit, Some(1 << 30));
        assert_eq!(
            c.cuda.arena_extend_strategy,
            ArenaExtendConfig::NextPowerOfTwo
        );
        // Still there for a model that reads its parameters.
        assert_eq!(c.parameters["intra_op_thread_count"], "3");
        let named = read.ignored.join("\n");
        for passed_over in [
            "parameters.enable_mem_pattern",
            "gpu_execution_accelerator[cuda].parameters.use_ep_level_unified_stream",
            "cpu_execution_accelerator \"openvino\"",
            "optimization.input_pinned_memory",
        ] {
            assert!(named.contains(passed_over), "{passed_over} not in {named}");
        }
        // 0 threads is Triton's "one per core"; a level or mode outside Triton's is an error.
        let zero = model_config(
            "parameters { key: \"intra_op_thread_count\" value: { string_value: \"0\" } }",
        )
        .unwrap();
        assert!(zero.config.intra_op_threads >= 1);
        for bad in [
            "optimization { graph { level: 5 } }",
            "parameters { key: \"execution_mode\" value: { string_value: \"2\" } }",
            "parameters { key: \"cudnn_conv_algo_search\" value: { string_value: \"fast\" } }",
        ] {
            assert!(model_config(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn instance_groups_on_one_device_add_up_and_others_are_named() {
        let read = model_config(
            "instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_CPU }, \
             { count: 3 kind: KIND_GPU gpus: [ 0, 1 ] } ]",
        )
        .unwrap();
        assert_eq!(read.config.instances, 3);
        assert_eq!(read.config.preferred_device.as_deref(), Some("cpu"));
        assert_eq!(
            read.ignored,
            [
                "instance_group.gpus [0, 1] (the instances load on cuda:0; sheaf.yaml's devices \
                 spread a model over several)",
                "instance_group[2] (3 instance(s) on cuda:0: a model's instances share the \
                 first group's device, cpu)"
            ]
        );
        let read = model_config("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 1 ] } ]");
        let read = read.unwrap();
        assert_eq!(read.config.instances, 2);
        assert_eq!(read.config.preferred_device.as_deref(), Some("cuda:1"));
        assert!(read.ignored.is_empty());
    }

    #[test]
    fn a_rate_limiter_names_its_resources_and_priority() {
        let read = model_config(
            "instance_group [ { count: 2 kind: KIND_GPU rate_limiter { resources [ { name: \
             \"R1\" count: 4 }, { name: \"R2\" global: True count: 2 } ] priority: 2 } }, \
             { count: 1 kind: KIND_GPU rate_limiter { priority: 3 } } ]",
        )
        .unwrap();
        assert_eq!(read.config.instances, 3);
        let limiter = read.config.rate_limiter.unwrap();
        assert_eq!(limiter.priority, 2);
        assert_eq!(
            limiter.resources,
            [
                ResourceNeed {
                    name: "R1".into(),
                    count: 4,
                    global: false
                },
                ResourceNeed {
                    name: "R2".into(),
                    count: 2,
                    global: true
                }
            ]
        );
        assert_eq!(
            read.ignored,
            ["instance_group[1].rate_limiter (every instance takes the first group's)"]
        );
        let bad =
            model_config("instance_group [ { rate_limiter { resources [ { count: 1 } ] } } ]");
        assert!(bad.unwrap_err().contains("a resource without a name"));
        let bad = model_config(
            "instance_group [ { rate_limiter { resources [ { name: \"R\" global: maybe } ] } } ]",
        );
        assert!(bad.unwrap_err().contains("neither true nor false"));
    }

    #[test]
    fn no_dynamic_batching_runs_each_request_as_it_comes() {
        let read = model_config("max_batch_size: 0\ninstance_group { kind: KIND_CPU }").unwrap();
        assert_eq!(read.config.max_batch_size, Some(MaxBatchSize::Size(0)));
        assert_eq!(read.config.batching.policy, PolicyKind::Fixed);
        assert_eq!(read.config.max_queue_delay_us, 0);
        assert_eq!(read.config.preferred_device.as_deref(), Some("cpu"));
        assert!(read.ignored.is_empty());
    }

    #[test]
    fn the_json_form_reads_as_the_text_form() {
        let text = model_config(TRITON).unwrap();
        let json = serde_json::json!({
            "name": "densenet",
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "input": [{ "name": "data_0", "data_type": "TYPE_FP32", "dims": ["3", 224, 224] }],
            "output": [{
                "name": "prob", "dataType": "TYPE_FP32", "dims": [1000],
                "label_filename": "densenet_labels.txt"
            }],
            "dynamic_batching": {
                "preferred_batch_size": [4, 8],
                "max_queue_delay_microseconds": "100",
                "preserve_ordering": true,
                "priority_levels": 2,
                "default_priority_level": 2,
                "default_queue_policy": {
                    "timeout_action": "DELAY",
                    "default_timeout_microseconds": 5000,
                    "max_queue_size": 64
                }
            },
            "instance_group": [{ "count": 2, "kind": "KIND_GPU", "gpus": [1] }],
            "optimization": { "execution_accelerators": {
                "gpu_execution_accelerator": [{ "name": "tensorrt" }]
            } },
            "parameters": { "x": { "string_value": "ab" } },
            "model_warmup": [{
                "name": "w", "batch_size": 2, "count": 3,
                "inputs": { "data_0": { "data_type": "TYPE_FP32", "dims": [3, 224, 224], "zero_data": false } }
            }],
            "response_cache": null
        });
        let read = model_config_json(&json).unwrap();
        let mut from_text = text.config.clone();
        let mut from_json = read.config.clone();
        // The JSON form kept as Triton's tree differs only in how it was written.
        from_text.triton = None;
        from_json.triton = None;
        assert_eq!(from_json, from_text);
        assert_eq!(read.ignored, text.ignored);
        assert!(model_config_json(&serde_json::json!([1]))
            .unwrap_err()
            .contains("not a JSON object"));
        let bad = model_config_json(&serde_json::json!({ "parameters": [1] })).unwrap_err();
        assert!(
            bad.contains("parameters: expected an object of entries"),
            "{bad}"
        );
        let bad = model_config_json(&serde_json::json!({ "max_batch_size": "many" })).unwrap_err();
        assert!(bad.contains("max_batch_size"), "{bad}");
    }

    #[test]
    fn each_priority_level_may_have_a_queue_policy() {
        let read = model_config(
            "dynamic_batching { priority_levels: 3\n\
             default_queue_policy { default_timeout_microseconds: 10 }\n\
             priority_queue_policy [\n\
               { key: 1 value: { timeout_action: DELAY max_queue_size: 4 allow_timeout_override: true } },\n\
               { key: 3 value: { default_timeout_microseconds: 500 max_queue_size: 0 } } ] }",
        )
        .unwrap();
        let c = &read.config;
        assert_eq!(c.default_timeout_us, 10);
        let one = &c.priority_queue_policy[&1];
        assert_eq!(one.timeout_action, Some(TimeoutActionConfig::Delay));
        assert_eq!(
            (one.max_queue_size, one.default_timeout_us),
            (Some(4), None)
        );
        let three = &c.priority_queue_policy[&3];
        assert_eq!(
            (three.max_queue_size, three.default_timeout_us),
            (None, Some(500))
        );
        assert!(!c.priority_queue_policy.contains_key(&2));
        assert_eq!(one.allow_timeout_override, Some(true));
        assert!(read.ignored.is_empty(), "{:?}", read.ignored);
        let bad = model_config(
            "dynamic_batching { priority_levels: 1 priority_queue_policy { key: 2 value: { } } }",
        )
        .unwrap_err();
        assert!(bad.contains("level 2, outside 1..=1"), "{bad}");
    }

    #[test]
    fn an_input_may_be_optional() {
        let read = model_config(
            "input [ { name: \"a\" data_type: TYPE_FP32 dims: [ 1 ] },\n\
             { name: \"b\" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]",
        )
        .unwrap();
        assert!(!read.config.inputs[0].optional);
        assert!(read.config.inputs[1].optional);
        assert!(read.ignored.is_empty(), "{:?}", read.ignored);
        let bad = model_config("input [ { name: \"a\" optional: maybe } ]").unwrap_err();
        assert!(bad.contains("neither true nor false"), "{bad}");
    }

    #[test]
    fn ragged_inputs_batch_inputs_and_batch_outputs_are_read_as_triton_writes_them() {
        use crate::ragged::{BatchInputKind, BatchOutputKind};
        let read = model_config(
            r#"max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "offsets"
    data_type: TYPE_INT64 source_input: "x" },
  { kind: BATCH_ITEM_SHAPE target_name: [ "shape" ] data_type: TYPE_INT32
    source_input: [ "x" ] }
]
batch_output [ { target_name: [ "y", "z" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE
  source_input: "x" } ]"#,
        )
        .unwrap();
        assert!(read.ignored.is_empty(), "{:?}", read.ignored);
        let c = read.config;
        assert!(c.inputs[0].allow_ragged_batch);
        let kinds: Vec<_> = c.batch_inputs.iter().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            [
                BatchInputKind::AccumulatedElementCountWithZero,
                BatchInputKind::ItemShape
            ]
        );
        assert_eq!(c.batch_inputs[1].target_name, ["shape"]);
        assert_eq!(
            (
                c.batch_inputs[0].data_type.as_str(),
                &c.batch_inputs[0].source_input[..]
            ),
            ("TYPE_INT64", &["x".to_string()][..])
        );
        assert_eq!(c.batch_outputs[0].target_name, ["y", "z"]);
        assert_eq!(
            c.batch_outputs[0].kind,
            BatchOutputKind::ScatterWithInputShape
        );
        let bad = model_config("batch_input [ { kind: BATCH_NOTHING target_name: \"a\" } ]");
        assert!(bad
            .unwrap_err()
            .contains("BATCH_NOTHING is not a kind of batch input"));
        let bad = model_config("batch_output [ { target_name: \"y\" } ]");
        assert!(bad
            .unwrap_err()
            .contains("needs target_name and source_input"));
    }

    #[test]
    fn the_decoupled_mode_is_read_not_warned_about() {
        let read = model_config("max_batch_size: 8\nmodel_transaction_policy { decoupled: True }")
            .unwrap();
        assert!(read.ignored.is_empty(), "{:?}", read.ignored);
        let triton = read.config.triton.unwrap();
        assert_eq!(triton["model_transaction_policy"]["decoupled"], true);
    }

    #[test]
    fn the_response_cache_is_enabled_as_triton_spells_it() {
        let on = model_config("max_batch_size: 8\nresponse_cache { enable: true }").unwrap();
        assert!(on.config.response_cache);
        assert!(on.ignored.is_empty(), "{:?}", on.ignored);
        let off = model_config("response_cache { enable: false }").unwrap();
        assert!(!off.config.response_cache);
        assert!(
            !model_config("max_batch_size: 8")
                .unwrap()
                .config
                .response_cache
        );
        let e = model_config("response_cache { enable: maybe }").unwrap_err();
        assert!(e.contains("response_cache.enable"), "{e}");
        let yaml = ModelConfig::from_yaml("response_cache: true\n").unwrap();
        assert!(yaml.response_cache);
    }

    #[test]
    fn an_iterative_sequence_is_a_model_that_runs_requests_again() {
        let read = model_config(
            "backend: \"python\"\nmax_batch_size: 4\nsequence_batching { iterative_sequence: true }\n",
        )
        .unwrap();
        assert!(read.ignored.is_empty(), "{:?}", read.ignored);
        assert!(read.config.iterative_sequence);
        // No sequences of requests to keep: each request is one.
        assert!(read.config.sequence_batching.is_none());
        let off = model_config("sequence_batching { iterative_sequence: false }\n").unwrap();
        assert!(!off.config.iterative_sequence);
        assert!(off.config.sequence_batching.is_some());
        let e = model_config(
            "sequence_batching { iterative_sequence: true control_input [ { name: \"S\" \
             control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }\n",
        )
        .unwrap_err();
        assert!(e.contains("iterative_sequence with control inputs"), "{e}");
        let e = model_config("sequence_batching { iterative_sequence: maybe }\n").unwrap_err();
        assert!(e.contains("neither true nor false"), "{e}");
    }

    #[test]
    fn sequence_batching_is_read_as_triton_spells_it() {
        let read = model_config(
            r#"max_batch_size: 16
sequence_batching {
  max_sequence_idle_microseconds: 2500000
  oldest { max_candidate_sequences: 32 max_queue_delay_microseconds: 700 preferred_batch_size: [4, 8] }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 5, 9 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 2, 3 ]
            initial_state { zero_data: true data_type: TYPE_FP32 dims: [ 2, 3 ] name: "zeros" } } ]
}"#,
        )
        .unwrap();
        assert!(read.ignored.is_empty(), "{:?}", read.ignored);
        let s = read.config.sequence_batching.as_ref().unwrap();
        assert_eq!(s.strategy, SequenceStrategy::Oldest);
        assert_eq!(s.max_sequence_idle_us, 2_500_000);
        assert_eq!(s.max_candidate_sequences, 32);
        // Under `oldest` the model's own dynamic batcher forms the batches.
        assert_eq!(read.config.max_queue_delay_us, 700);
        assert_eq!(read.config.preferred_batch_sizes, vec![4, 8]);
        let controls: Vec<_> = s
            .control_inputs
            .iter()
            .map(|c| (c.name.as_str(), c.kind, c.false_true))
            .collect();
        assert_eq!(
            controls,
            [
                ("START", ControlKind::Start, [0.0, 1.0]),
                ("END", ControlKind::End, [5.0, 9.0]),
                ("READY", ControlKind::Ready, [0.0, 1.0]),
                ("CORRID", ControlKind::Corrid, [0.0, 1.0]),
            ]
        );
        assert_eq!(
            s.states,
            [StateConfig {
                dims: vec![2, 3],
                initial_dims: vec![2, 3],
                ..StateConfig::new("h_in", "h_out")
            }]
        );
        // Triton's own example: a variable state, its first shape and values from a file.
        let from_file = model_config(
            r#"sequence_batching {
  oldest { }
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
            dims: [ -1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "initial_state_data"
                            name: "initial state" } } ]
}"#,
        )
        .unwrap();
        assert!(from_file.ignored.is_empty(), "{:?}", from_file.ignored);
        assert_eq!(
            from_file.config.sequence_batching.unwrap().states,
            [StateConfig {
                dims: vec![-1],
                initial_dims: vec![1],
                initial_data_file: Some("initial_state_data".into()),
                ..StateConfig::new("INPUT_STATE", "OUTPUT_STATE")
            }]
        );

        let direct =
            model_config("sequence_batching { direct { max_queue_delay_microseconds: 300 } }")
                .unwrap();
        let s = direct.config.sequence_batching.unwrap();
        assert_eq!(
            (s.strategy, s.max_queue_delay_us),
            (SequenceStrategy::Direct, 300)
        );

        for (bad, says) in [
            (
                "sequence_batching { control_input [ { control [ { kind: CONTROL_SEQUENCE_START } ] } ] }",
                "without a name",
            ),
            (
                "sequence_batching { control_input [ { name: \"S\" control [ { kind: CONTROL_SEQUENCE_BEGIN } ] } ] }",
                "unknown kind 'CONTROL_SEQUENCE_BEGIN'",
            ),
            (
                "sequence_batching { control_input [ { name: \"S\" control [ { fp32_false_true: [0, 1] } ] } ] }",
                "a control without a kind",
            ),
            (
                "sequence_batching { control_input [ { name: \"S\" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [1] } ] } ] }",
                "give two values",
            ),
        ] {
            let e = model_config(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn broken_files_say_where() {
        for (bad, says) in [
            ("max_batch_size 8", "line 1: expected ':'"),
            ("input { name: \"x\"", "missing '}'"),
            ("name: \"x", "unterminated string"),
            ("max_batch_size: eight", "not a count"),
            (
                "dynamic_batching { preferred_batch_size: [4 8] }",
                "expected ',' or ']'",
            ),
            ("input { dims: [1] }", "without a name"),
            (
                "dynamic_batching { default_queue_policy { timeout_action: WAIT } }",
                "unknown action",
            ),
        ] {
            let e = model_config(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
