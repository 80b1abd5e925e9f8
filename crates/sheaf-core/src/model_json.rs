//! A model's configuration in Triton's JSON form: what a Python model gets as
//! `args['model_config']`, and what `pb_utils.get_input_config_by_name` and
//! `auto_complete_config` read.
//!
//! From a `config.pbtxt`, every field the file holds is carried over, those sheaf does not read
//! included (`parameters`, `model_transaction_policy`, a model's own settings), as Triton's
//! JSON writer renders them: repeated fields as lists, numbers as numbers, enum names as
//! strings. From a `config.yaml`, the same shape is built from sheaf's keys. `name` is left to
//! the backend, which knows the model's folder.

use serde_json::{json, Map, Value};

use sheaf_backend::DataType;

use crate::config::MaxBatchSize;
use crate::pbtxt;
use crate::ModelConfig;

/// Fields of Triton's `ModelConfig` message (and the messages inside it) that are repeated:
/// a list in JSON even when the file writes them once.
const REPEATED: &[&str] = &[
    "input",
    "output",
    "dims",
    "shape",
    "instance_group",
    "gpus",
    "preferred_batch_size",
    "model_warmup",
    "control_input",
    "control",
    "state",
    "initial_state",
    "batch_input",
    "batch_output",
    "source_input",
    "target_name",
    "allowed_values",
    "secondary_devices",
    "gpu_execution_accelerator",
    "cpu_execution_accelerator",
    "profile",
];

/// Map fields (`parameters { key: "k" value { ... } }`): an object keyed by `key`.
const MAPS: &[&str] = &["parameters", "parameter", "input_map", "output_map"];

/// The model's configuration as Triton hands it to a Python model.
pub fn model_json(config: &ModelConfig) -> Value {
    match &config.triton {
        Some(tree) => tree.clone(),
        None => from_keys(config),
    }
}

/// A `config.pbtxt`'s fields in Triton's JSON form. As Triton writes it, the fields a model
/// reads without checking are there even when the file has none: `max_batch_size` (0),
/// `input` and `output` (empty lists) and `parameters` (an empty map).
pub fn from_pbtxt(fields: &[(String, pbtxt::Value)]) -> Value {
    let mut object = message(fields);
    object
        .entry("max_batch_size")
        .or_insert_with(|| Value::from(0));
    for list in ["input", "output"] {
        object
            .entry(list)
            .or_insert_with(|| Value::Array(Vec::new()));
    }
    object
        .entry("parameters")
        .or_insert_with(|| Value::Object(Map::new()));
    Value::Object(object)
}

fn message(fields: &[(String, pbtxt::Value)]) -> Map<String, Value> {
    let mut object = Map::new();
    for (name, value) in fields {
        if MAPS.contains(&name.as_str()) {
            let map = object
                .entry(name.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            for entry in items(value) {
                if let (Value::Object(map), Some((key, value))) = (&mut *map, map_entry(entry)) {
                    map.insert(key, value);
                }
            }
            continue;
        }
        let converted: Vec<Value> = items(value).into_iter().map(convert).collect();
        if REPEATED.contains(&name.as_str()) {
            match object
                .entry(name.clone())
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                Value::Array(list) => list.extend(converted),
                other => *other = Value::Array(converted),
            }
        } else if let Some(last) = converted.into_iter().last() {
            object.insert(name.clone(), last);
        }
    }
    object
}

fn items(value: &pbtxt::Value) -> Vec<&pbtxt::Value> {
    match value {
        pbtxt::Value::List(items) => items.iter().collect(),
        one => vec![one],
    }
}

/// `{ key: "k" value { string_value: "v" } }` as `("k", {"string_value": "v"})`.
fn map_entry(entry: &pbtxt::Value) -> Option<(String, Value)> {
    let pbtxt::Value::Message(fields) = entry else {
        return None;
    };
    let key = fields.iter().find(|(n, _)| n == "key").map(|(_, v)| v)?;
    let key = match convert(key) {
        Value::String(s) => s,
        other => other.to_string(),
    };
    let value = fields
        .iter()
        .find(|(n, _)| n == "value")
        .map(|(_, v)| convert(v))
        .unwrap_or(Value::Null);
    Some((key, value))
}

fn convert(value: &pbtxt::Value) -> Value {
    match value {
        pbtxt::Value::Text(t) => Value::String(t.clone()),
        pbtxt::Value::Word(w) => match w.as_str() {
            "true" | "True" => Value::Bool(true),
            "false" | "False" => Value::Bool(false),
            _ => w
                .parse::<i64>()
                .map(Value::from)
                .or_else(|_| w.parse::<f64>().map(Value::from))
                .unwrap_or_else(|_| Value::String(w.clone())),
        },
        pbtxt::Value::Message(fields) => Value::Object(message(fields)),
        pbtxt::Value::List(items) => Value::Array(items.iter().map(convert).collect()),
    }
}

/// Triton's configuration name of a declared type (`FP32` when none is declared):
/// `TYPE_STRING` for byte strings, `TYPE_` and the protocol's name for the rest.
fn config_name(declared: Option<&str>) -> String {
    let name = declared.unwrap_or("FP32");
    match DataType::parse_any(name) {
        Some(dtype) => dtype.config_name().to_string(),
        None => format!("TYPE_{name}"),
    }
}

/// The JSON form of a `config.yaml`: the declared tensors (Triton's `TYPE_` names), the batch
/// size (absent: sheaf's default, since the yaml form batches unless told not to; `auto`: the
/// most the probe may settle on, since the model reads it before the probe runs), the
/// instances (with their `rate_limiter`) and the parameters.
fn from_keys(config: &ModelConfig) -> Value {
    let max_batch_size = match config.max_batch_size {
        Some(MaxBatchSize::Size(n)) => n,
        Some(MaxBatchSize::Auto(_)) => config.auto_limit(),
        None => config.default_max_batch_size,
    };
    let tensors = |declared: &[crate::config::DeclaredTensor]| -> Vec<Value> {
        declared
            .iter()
            .map(|t| {
                let mut tensor = json!({
                    "name": t.name,
                    "data_type": config_name(t.data_type.as_deref()),
                    "dims": t.dims,
                });
                if let Some(shape) = &t.reshape {
                    tensor["reshape"] = json!({ "shape": shape });
                }
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
    let parameters: Map<String, Value> = config
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), json!({ "string_value": v })))
        .collect();
    let mut object = json!({
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": tensors(&config.inputs),
        "output": tensors(&config.outputs),
        "instance_group": [{ "count": config.instances, "kind": "KIND_CPU" }],
        "parameters": parameters,
    });
    if !config.batch_inputs.is_empty() {
        object["batch_input"] = config.batch_inputs.iter().map(|b| b.to_json()).collect();
    }
    if !config.batch_outputs.is_empty() {
        object["batch_output"] = config.batch_outputs.iter().map(|b| b.to_json()).collect();
    }
    if let Some(limiter) = &config.rate_limiter {
        let resources: Vec<Value> = limiter
            .resources
            .iter()
            .map(|r| json!({ "name": r.name, "count": r.count, "global": r.global }))
            .collect();
        object["instance_group"][0]["rate_limiter"] =
            json!({ "resources": resources, "priority": limiter.priority });
    }
    if let Some(seq) = &config.sequence_batching {
        object["sequence_batching"] = sequence_batching(seq);
    } else if config.iterative_sequence {
        object["sequence_batching"] = json!({ "iterative_sequence": true });
    } else if max_batch_size > 0 {
        object["dynamic_batching"] = json!({
            "preferred_batch_size": config.preferred_batch_sizes,
            "max_queue_delay_microseconds": config.max_queue_delay_us,
        });
    }
    object
}

/// A `sequence_batching` section of a `config.yaml` in Triton's form: its control inputs (a
/// Python model gets them as inputs, FP32 and CORRID UINT64 unless the model says otherwise).
fn sequence_batching(seq: &crate::sequence::SequenceConfig) -> Value {
    use crate::sequence::ControlKind;
    let controls: Vec<Value> = seq
        .control_inputs
        .iter()
        .map(|c| {
            let kind = match c.kind {
                ControlKind::Start => "CONTROL_SEQUENCE_START",
                ControlKind::End => "CONTROL_SEQUENCE_END",
                ControlKind::Ready => "CONTROL_SEQUENCE_READY",
                ControlKind::Corrid => "CONTROL_SEQUENCE_CORRID",
            };
            let control = match c.kind {
                ControlKind::Corrid => json!({ "kind": kind, "data_type": "TYPE_UINT64" }),
                _ => json!({ "kind": kind, "fp32_false_true": c.false_true }),
            };
            json!({ "name": c.name, "control": [control] })
        })
        .collect();
    json!({
        "max_sequence_idle_microseconds": seq.max_sequence_idle_us,
        "control_input": controls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pbtxt_reads_as_triton_writes_its_json() {
        let text = r#"
            name: "add_sub"
            backend: "python"
            input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
            input { name: "INPUT1" data_type: TYPE_FP32 dims: 4 }
            output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
            instance_group [ { kind: KIND_CPU } ]
            parameters { key: "scale" value: { string_value: "2.5" } }
            parameters [ { key: "mode", value: { string_value: "fast" } } ]
            model_transaction_policy { decoupled: True }
        "#;
        let json = from_pbtxt(&pbtxt::parse(text).unwrap());
        assert_eq!(json["name"], "add_sub");
        assert_eq!(json["max_batch_size"], 0, "Triton's default");
        assert_eq!(json["input"][1]["name"], "INPUT1");
        assert_eq!(json["input"][1]["dims"], json!([4]));
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
        assert_eq!(json["output"][0]["dims"], json!([4]));
        assert_eq!(json["instance_group"][0]["kind"], "KIND_CPU");
        assert_eq!(json["parameters"]["scale"]["string_value"], "2.5");
        assert_eq!(json["parameters"]["mode"]["string_value"], "fast");
        assert_eq!(json["model_transaction_policy"]["decoupled"], true);
    }

    #[test]
    fn an_empty_pbtxt_still_has_the_fields_triton_always_writes() {
        let json = from_pbtxt(&pbtxt::parse("").unwrap());
        assert_eq!(
            json,
            json!({"max_batch_size": 0, "input": [], "output": [], "parameters": {}})
        );
    }

    #[test]
    fn an_iterative_yaml_config_says_so_as_triton_would() {
        let config = ModelConfig::from_yaml(
            "inputs: [{name: x, dims: [1]}]\noutputs: [{name: y, dims: [1]}]\n\
             iterative_sequence: true\n",
        )
        .unwrap();
        let json = model_json(&config);
        assert_eq!(
            json["sequence_batching"],
            json!({ "iterative_sequence": true })
        );
        assert!(json.get("dynamic_batching").is_none());
    }

    #[test]
    fn auto_tells_the_model_the_most_it_may_be_sent() {
        let json = |yaml: &str| {
            let text = format!("inputs: [{{name: x, dims: [4]}}]\n{yaml}");
            model_json(&ModelConfig::from_yaml(&text).unwrap())["max_batch_size"].clone()
        };
        assert_eq!(json("max_batch_size: auto\n"), crate::config::AUTO_LIMIT);
        assert_eq!(
            json("max_batch_size: auto\nallowed_batch_sizes: [8, 2, 64]\n"),
            64
        );
        assert_eq!(
            json("max_batch_size: auto\nallowed_batch_sizes: [1, 4096]\n"),
            crate::config::AUTO_LIMIT
        );
        assert_eq!(json("max_batch_size: 12\n"), 12);
    }

    #[test]
    fn a_yaml_config_gets_the_same_shape() {
        let config = ModelConfig::from_yaml(
            "inputs: [{name: x, data_type: INT64, dims: [64]}, \
             {name: s, data_type: BYTES, dims: [-1], allow_ragged_batch: true}]\n\
             outputs: [{name: y, dims: [10]}]\n\
             parameters: {classes: '10'}\ninstances: 2\n",
        )
        .unwrap();
        let json = model_json(&config);
        assert_eq!(
            json["max_batch_size"],
            crate::config::DEFAULT_MAX_BATCH_SIZE
        );
        assert_eq!(json["input"][0]["data_type"], "TYPE_INT64");
        // Byte strings under Triton's name for them.
        assert_eq!(json["input"][1]["data_type"], "TYPE_STRING");
        assert_eq!(json["input"][1]["allow_ragged_batch"], true);
        assert!(json["input"][0].get("allow_ragged_batch").is_none());
        assert!(json.get("batch_input").is_none() && json.get("batch_output").is_none());
        // Ragged batching's batch inputs and outputs, under Triton's names.
        let ragged = ModelConfig::from_yaml(
            "inputs: [{name: s, dims: [-1], allow_ragged_batch: true}]\n\
             batch_inputs: [{kind: BATCH_ELEMENT_COUNT, target_name: [n], data_type: INT32, \
             source_input: [s]}]\n\
             batch_outputs: [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE, target_name: [y], \
             source_input: [s]}]\n",
        )
        .unwrap();
        let ragged = model_json(&ragged);
        assert_eq!(
            ragged["batch_input"],
            json!([{"kind": "BATCH_ELEMENT_COUNT", "target_name": ["n"],
                    "data_type": "TYPE_INT32", "source_input": ["s"]}])
        );
        assert_eq!(
            ragged["batch_output"],
            json!([{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["y"],
                    "source_input": ["s"]}])
        );
        assert_eq!(json["output"][0]["data_type"], "TYPE_FP32");
        assert_eq!(json["output"][0]["dims"], json!([10]));
        assert_eq!(json["parameters"]["classes"]["string_value"], "10");
        assert_eq!(json["instance_group"][0]["count"], 2);
        assert!(json["instance_group"][0].get("rate_limiter").is_none());
        let config = ModelConfig::from_yaml(
            "rate_limiter: {resources: [{name: R, count: 2, global: true}], priority: 3}\n",
        )
        .unwrap();
        assert_eq!(
            model_json(&config)["instance_group"][0]["rate_limiter"],
            json!({"resources": [{"name": "R", "count": 2, "global": true}], "priority": 3})
        );
    }
}
