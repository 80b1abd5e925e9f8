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

use crate::config::{
    DeclaredTensor, LevelQueuePolicy, MaxBatchSize, PolicyKind, TimeoutActionConfig, VersionPolicy,
};
use crate::rate_limit::{RateLimiterConfig, ResourceNeed};
use crate::sequence::{ControlInput, ControlKind, SequenceConfig, SequenceStrategy, StateConfig};
use crate::warmup::{WarmupInput, WarmupSample};
use crate::ModelConfig;

/// A value in text format.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number, an enum name or `true`/`false`, as written.
    Word(String),
    Text(String),
    Message(Vec<(String, Value)>),
    List(Vec<Value>),
}

impl Value {
    /// The values of a field written once, several times, or as a list.
    pub(crate) fn items(&self) -> Vec<&Value> {
        match self {
            Value::List(items) => items.iter().collect(),
            one => vec![one],
        }
    }
}

/// Reads a text-format message: `name: value`, `name { ... }`, `name: [a, b]`, `#` comments.
pub fn parse(text: &str) -> Result<Vec<(String, Value)>, String> {
    let mut p = Parser {
        chars: text.chars().collect(),
        at: 0,
        line: 1,
    };
    let fields = p.fields(None)?;
    Ok(fields)
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    line: usize,
}

impl Parser {
    fn error<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("line {}: {what}", self.line))
    }

    fn peek(&mut self) -> Option<char> {
        loop {
            let c = *self.chars.get(self.at)?;
            match c {
                '#' => {
                    while self.chars.get(self.at).is_some_and(|&c| c != '\n') {
                        self.at += 1;
                    }
                }
                '\n' => {
                    self.line += 1;
                    self.at += 1;
                }
                c if c.is_whitespace() => self.at += 1,
                c => return Some(c),
            }
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// Fields up to `close` (`}` or `>`), or to the end of the text.
    fn fields(&mut self, close: Option<char>) -> Result<Vec<(String, Value)>, String> {
        let mut fields = Vec::new();
        loop {
            match (self.peek(), close) {
                (None, None) => return Ok(fields),
                (None, Some(c)) => return self.error(&format!("missing '{c}'")),
                (Some(c), Some(close)) if c == close => {
                    self.at += 1;
                    return Ok(fields);
                }
                _ => {}
            }
            let name = self.word()?;
            if name.is_empty() {
                return self.error("expected a field name");
            }
            let colon = self.eat(':');
            let value = match self.peek() {
                Some('{' | '<' | '[') => self.value()?,
                _ if colon => self.value()?,
                _ => return self.error(&format!("expected ':' or '{{' after '{name}'")),
            };
            fields.push((name, value));
            // Fields may be separated by ',' or ';'.
            let _ = self.eat(',') || self.eat(';');
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some('{') => {
                self.at += 1;
                Ok(Value::Message(self.fields(Some('}'))?))
            }
            Some('<') => {
                self.at += 1;
                Ok(Value::Message(self.fields(Some('>'))?))
            }
            Some('[') => {
                self.at += 1;
                let mut items = Vec::new();
                if self.eat(']') {
                    return Ok(Value::List(items));
                }
                loop {
                    items.push(self.value()?);
                    if self.eat(']') {
                        return Ok(Value::List(items));
                    }
                    if !self.eat(',') {
                        return self.error("expected ',' or ']' in a list");
                    }
                }
            }
            Some(q @ ('"' | '\'')) => {
                self.at += 1;
                let mut text = String::new();
                loop {
                    match self.chars.get(self.at).copied() {
                        None | Some('\n') => return self.error("unterminated string"),
                        Some(c) if c == q => {
                            self.at += 1;
                            break;
                        }
                        Some('\\') => {
                            let escaped = self.chars.get(self.at + 1).copied();
                            text.push(match escaped {
                                Some('n') => '\n',
                                Some('t') => '\t',
                                Some(c) => c,
                                None => return self.error("unterminated string"),
                            });
                            self.at += 2;
                        }
                        Some(c) => {
                            text.push(c);
                            self.at += 1;
                        }
                    }
                }
                // Adjacent strings join, as in protobuf.
                if let Ok(Value::Text(more)) = self.more_text() {
                    text.push_str(&more);
                }
                Ok(Value::Text(text))
            }
            Some(_) => {
                let word = self.word()?;
                if word.is_empty() {
                    return self.error("expected a value");
                }
                Ok(Value::Word(word))
            }
            None => self.error("expected a value"),
        }
    }

    fn more_text(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some('"' | '\'') => self.value(),
            _ => Ok(Value::Text(String::new())),
        }
    }

    /// A name, a number or an enum word (letters, digits, `_`, `.`, `-`, `+`, and `[...]` for
    /// extension names).
    fn word(&mut self) -> Result<String, String> {
        let _ = self.peek();
        let mut word = String::new();
        while let Some(&c) = self.chars.get(self.at) {
            if c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+' | '/') {
                word.push(c);
                self.at += 1;
            } else if c == '[' && word.is_empty() {
                // `[pkg.extension]`
                while let Some(&c) = self.chars.get(self.at) {
                    word.push(c);
                    self.at += 1;
                    if c == ']' {
                        break;
                    }
                }
            } else {
                break;
            }
        }
        Ok(word)
    }
}

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

/// Fields whose JSON form is an object of entries (protobuf maps), written in text format as
/// `name { key: "k" value ... }` entries.
const MAP_FIELDS: &[&str] = &["parameters", "input_map", "output_map", "inputs"];

/// Triton's JSON form of a configuration as text-format fields, as protobuf's JSON reader
/// takes it: field names in `snake_case` or `lowerCamelCase`, maps as objects, enums as their
/// names, 64-bit integers as numbers or strings; a `null` field is left out.
pub fn from_json(json: &serde_json::Value) -> Result<Vec<(String, Value)>, String> {
    match json {
        serde_json::Value::Object(map) => json_fields(map, ""),
        _ => Err("the configuration is not a JSON object".into()),
    }
}

fn json_fields(
    map: &serde_json::Map<String, serde_json::Value>,
    path: &str,
) -> Result<Vec<(String, Value)>, String> {
    let mut fields = Vec::with_capacity(map.len());
    for (key, value) in map {
        if value.is_null() {
            continue;
        }
        let name = snake_case(key);
        let at = match path {
            "" => name.clone(),
            _ => format!("{path}.{name}"),
        };
        let value = match (MAP_FIELDS.contains(&name.as_str()), value) {
            (true, serde_json::Value::Object(entries)) => Value::List(
                entries
                    .iter()
                    .map(|(k, v)| {
                        let entry = vec![
                            ("key".to_string(), Value::Text(k.clone())),
                            ("value".to_string(), json_value(v, &format!("{at}.{k}"))?),
                        ];
                        Ok(Value::Message(entry))
                    })
                    .collect::<Result<_, String>>()?,
            ),
            (true, _) => return Err(format!("{at}: expected an object of entries")),
            (false, v) => json_value(v, &at)?,
        };
        fields.push((name, value));
    }
    Ok(fields)
}

fn json_value(value: &serde_json::Value, at: &str) -> Result<Value, String> {
    use serde_json::Value as J;
    Ok(match value {
        J::Null => return Err(format!("{at}: null is not a value")),
        J::Bool(b) => Value::Word(b.to_string()),
        J::Number(n) => Value::Word(n.to_string()),
        // protobuf's JSON writes 64-bit integers as strings.
        J::String(s) if s.parse::<i64>().is_ok() => Value::Word(s.clone()),
        J::String(s) => Value::Text(s.clone()),
        J::Array(items) => Value::List(
            items
                .iter()
                .map(|v| json_value(v, at))
                .collect::<Result<_, _>>()?,
        ),
        J::Object(map) => Value::Message(json_fields(map, at)?),
    })
}

/// `maxBatchSize` as `max_batch_size`; a `snake_case` name stays as it is.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
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

/// The ONNX Runtime backend's settings among a model's `parameters` (Triton's onnxruntime
/// backend reads these): `intra_op_thread_count` and `inter_op_thread_count` (0: one per core),
/// `execution_mode` (0 one operator at a time, 1 independent operators at once), and the CUDA
/// provider's `cudnn_conv_algo_search` (0 exhaustive, 1 heuristic, 2 default),
/// `gpu_mem_limit` and `arena_extend_strategy` (0 next power of two, 1 same as requested).
/// The backend's other settings are named as passed over. The parameters stay as given too,
/// for a model that reads them.
fn onnx_parameters(config: &mut ModelConfig, ignored: &mut Vec<String>) -> Result<(), String> {
    let cores = || {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    };
    let given: Vec<(String, String)> = config
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in given {
        let path = format!("parameters.{key}");
        let number = |value: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{path}: '{value}' is not a whole number of 0 or more"))
        };
        match key.as_str() {
            "intra_op_thread_count" => {
                config.intra_op_threads = match number(&value)? {
                    0 => cores(),
                    n => n as usize,
                }
            }
            "inter_op_thread_count" => {
                config.inter_op_threads = match number(&value)? {
                    0 => cores(),
                    n => n as usize,
                }
            }
            "execution_mode" => {
                config.parallel_execution = match number(&value)? {
                    0 => false,
                    1 => true,
                    n => {
                        return Err(format!(
                            "{path}: {n} is neither 0 (sequential) nor 1 (parallel)"
                        ))
                    }
                }
            }
            "cudnn_conv_algo_search" | "gpu_mem_limit" | "arena_extend_strategy" => {
                cuda_setting(&path, &key, &value, config)?
            }
            "enable_mem_arena"
            | "enable_mem_pattern"
            | "memory.enable_memory_arena_shrinkage"
            | "session.use_device_allocator_for_initializers"
            | "do_copy_in_default_stream" => ignored.push(format!(
                "{path} (an ONNX Runtime setting sheaf sets itself: its sessions share one \
                 memory arena per device)"
            )),
            _ => {}
        }
    }
    Ok(())
}

/// One of the CUDA provider's settings, under the name Triton's onnxruntime backend gives it.
fn cuda_setting(
    path: &str,
    key: &str,
    value: &str,
    config: &mut ModelConfig,
) -> Result<(), String> {
    use crate::config::{ArenaExtendConfig, ConvAlgoSearchConfig};
    let value = value.trim();
    let bad = |what: &str| format!("{path}: '{value}' is not {what}");
    match key {
        "cudnn_conv_algo_search" => {
            config.cuda.cudnn_conv_algo_search = match value {
                "0" => ConvAlgoSearchConfig::Exhaustive,
                "1" => ConvAlgoSearchConfig::Heuristic,
                "2" => ConvAlgoSearchConfig::Default,
                _ => return Err(bad("0 (exhaustive), 1 (heuristic) or 2 (default)")),
            }
        }
        "gpu_mem_limit" => {
            config.cuda.gpu_mem_limit =
                Some(value.parse::<u64>().map_err(|_| bad("a number of bytes"))?)
        }
        _ => {
            config.cuda.arena_extend_strategy = match value {
                "0" => ArenaExtendConfig::NextPowerOfTwo,
                "1" => ArenaExtendConfig::SameAsRequested,
                _ => return Err(bad("0 (next power of two) or 1 (same as requested)")),
            }
        }
    }
    Ok(())
}

/// Triton's `optimization`: `graph { level }` (-1 basic, 1 extended, 2 none, 0 all, as Triton's
/// onnxruntime backend reads it), and the `cuda` execution accelerator's settings (as
/// [`cuda_setting`]). Other accelerators (TensorRT, OpenVINO) and fields are named as passed
/// over: sheaf runs ONNX models on ONNX Runtime's CPU and CUDA providers.
fn optimization(
    value: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    use crate::config::GraphOptimizationConfig as Level;
    for (name, value) in message("optimization", value)? {
        let path = format!("optimization.{name}");
        match name.as_str() {
            "graph" => {
                for (field, value) in message(&path, value)? {
                    let inner = format!("{path}.{field}");
                    match field.as_str() {
                        "level" => {
                            config.graph_optimization = match word(&inner, value)? {
                                "0" => Level::All,
                                "-1" => Level::Basic,
                                "1" => Level::Extended,
                                "2" => Level::Disabled,
                                other => {
                                    return Err(format!(
                                        "{inner}: {other} is not -1 (basic), 0 (all), 1 \
                                         (extended) or 2 (none)"
                                    ))
                                }
                            }
                        }
                        _ => ignored.push(inner),
                    }
                }
            }
            "execution_accelerators" => {
                for (kind, list) in message(&path, value)? {
                    for accelerator in list.items() {
                        accelerator_settings(
                            &format!("{path}.{kind}"),
                            accelerator,
                            config,
                            ignored,
                        )?;
                    }
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(())
}

/// One execution accelerator: the `cuda` one's settings are read; any other is named as passed
/// over.
fn accelerator_settings(
    path: &str,
    accelerator: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    let fields = message(path, accelerator)?;
    let name = fields
        .iter()
        .find(|(n, _)| n == "name")
        .map(|(_, v)| word(&format!("{path}.name"), v))
        .transpose()?
        .unwrap_or("");
    if name != "cuda" {
        ignored.push(format!(
            "{path} \"{name}\" (sheaf runs ONNX models on ONNX Runtime's CPU and CUDA providers)"
        ));
        return Ok(());
    }
    for (field, value) in fields {
        if field != "parameters" {
            continue;
        }
        for entry in value.items() {
            let (key, value) = map_entry(&format!("{path}.parameters"), entry)?;
            let at = format!("{path}[cuda].parameters.{key}");
            let value = value.map(|v| word(&at, v)).transpose()?.unwrap_or("");
            match key.as_str() {
                "cudnn_conv_algo_search" | "gpu_mem_limit" | "arena_extend_strategy" => {
                    cuda_setting(&at, &key, value, config)?
                }
                _ => ignored.push(at),
            }
        }
    }
    Ok(())
}

/// One entry of a map field (`{ key: "k" value: ... }`): its key, and its value if written.
pub(crate) fn map_entry<'v>(
    path: &str,
    entry: &'v Value,
) -> Result<(String, Option<&'v Value>), String> {
    let fields = message(path, entry)?;
    let find = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let key = find("key").ok_or(format!("{path}: an entry without a key"))?;
    Ok((
        word(&format!("{path}.key"), key)?.to_string(),
        find("value"),
    ))
}

pub(crate) fn message<'v>(name: &str, value: &'v Value) -> Result<&'v [(String, Value)], String> {
    match value {
        Value::Message(fields) => Ok(fields),
        _ => Err(format!("{name}: expected a message {{ ... }}")),
    }
}

/// A `true` or a `false`.
fn boolean(name: &str, value: &Value) -> Result<bool, String> {
    match word(name, value)? {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{name}: {other} is neither true nor false")),
    }
}

fn count(name: &str, value: &Value) -> Result<usize, String> {
    match value {
        Value::Word(w) => w
            .parse::<usize>()
            .map_err(|_| format!("{name}: '{w}' is not a count")),
        other => Err(format!("{name}: {other:?} is not a count")),
    }
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

fn counts(name: &str, value: &Value) -> Result<Vec<usize>, String> {
    value.items().into_iter().map(|v| count(name, v)).collect()
}

pub(crate) fn word<'v>(name: &str, value: &'v Value) -> Result<&'v str, String> {
    match value {
        Value::Word(w) => Ok(w),
        Value::Text(t) => Ok(t),
        other => Err(format!("{name}: {other:?} is not a word")),
    }
}

fn dynamic_batching(
    value: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    // Triton's dynamic batcher waits up to the queue delay for a preferred size: sheaf's
    // `fixed` policy.
    config.batching.policy = PolicyKind::Fixed;
    config.max_queue_delay_us = 0;
    for (name, value) in message("dynamic_batching", value)? {
        let path = format!("dynamic_batching.{name}");
        match name.as_str() {
            "preferred_batch_size" => config.preferred_batch_sizes = counts(&path, value)?,
            "max_queue_delay_microseconds" => {
                config.max_queue_delay_us = count(&path, value)? as u64
            }
            "priority_levels" => config.priority_levels = count(&path, value)?.max(1),
            "default_priority_level" => {
                let level = count(&path, value)?;
                config.default_priority_level = (level > 0).then_some(level);
            }
            "default_queue_policy" => {
                let policy = queue_policy(&path, value, ignored)?;
                if let Some(action) = policy.timeout_action {
                    config.timeout_action = action;
                }
                if let Some(timeout) = policy.default_timeout_us {
                    config.default_timeout_us = timeout;
                }
                if let Some(size) = policy.max_queue_size {
                    config.max_queue_size = size;
                }
                if let Some(allow) = policy.allow_timeout_override {
                    config.allow_timeout_override = Some(allow);
                }
            }
            "priority_queue_policy" => {
                for entry in value.items() {
                    let (key, policy) = map_entry(&path, entry)?;
                    let level = key
                        .parse::<usize>()
                        .map_err(|_| format!("{path}: '{key}' is not a priority level"))?;
                    let policy = match policy {
                        Some(p) => queue_policy(&format!("{path}.{level}"), p, ignored)?,
                        None => LevelQueuePolicy::default(),
                    };
                    config.priority_queue_policy.insert(level, policy);
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(())
}

/// A `ModelQueuePolicy` message: what it sets (a `max_queue_size` of 0 is Triton's "no bound").
fn queue_policy(
    path: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<LevelQueuePolicy, String> {
    let mut policy = LevelQueuePolicy::default();
    for (name, value) in message(path, value)? {
        let inner = format!("{path}.{name}");
        match name.as_str() {
            "timeout_action" => {
                policy.timeout_action = Some(match word(&inner, value)? {
                    "REJECT" => TimeoutActionConfig::Reject,
                    "DELAY" => TimeoutActionConfig::Delay,
                    other => return Err(format!("{inner}: unknown action '{other}'")),
                })
            }
            "default_timeout_microseconds" => {
                policy.default_timeout_us = Some(count(&inner, value)? as u64)
            }
            "max_queue_size" => {
                policy.max_queue_size = Some(count(&inner, value)?).filter(|&n| n > 0)
            }
            "allow_timeout_override" => {
                policy.allow_timeout_override = Some(boolean(&inner, value)?)
            }
            _ => ignored.push(inner),
        }
    }
    Ok(policy)
}

/// Triton's `sequence_batching`: the strategy (`direct` or `oldest`, with their queue delays),
/// the idle timeout, the control inputs and the implicit states.
fn sequence_batching(
    value: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    let mut s = SequenceConfig::default();
    let mut iterative = false;
    for (name, value) in message("sequence_batching", value)? {
        let path = format!("sequence_batching.{name}");
        match name.as_str() {
            "max_sequence_idle_microseconds" => {
                s.max_sequence_idle_us = count(&path, value)? as u64
            }
            "direct" | "oldest" => {
                s.strategy = if name == "direct" {
                    SequenceStrategy::Direct
                } else {
                    SequenceStrategy::Oldest
                };
                for (field, value) in message(&path, value)? {
                    let inner = format!("{path}.{field}");
                    match field.as_str() {
                        "max_queue_delay_microseconds" if name == "direct" => {
                            s.max_queue_delay_us = count(&inner, value)? as u64
                        }
                        // The oldest strategy batches with the model's dynamic batcher.
                        "max_queue_delay_microseconds" => {
                            config.max_queue_delay_us = count(&inner, value)? as u64
                        }
                        "preferred_batch_size" => {
                            config.preferred_batch_sizes = counts(&inner, value)?
                        }
                        "max_candidate_sequences" => {
                            s.max_candidate_sequences = count(&inner, value)?.max(1)
                        }
                        _ => ignored.push(inner),
                    }
                }
            }
            "control_input" => {
                for input in value.items() {
                    s.control_inputs
                        .extend(control_input(&path, input, ignored)?);
                }
            }
            "state" => {
                for state in value.items() {
                    s.states.push(state_config(&path, state, ignored)?);
                }
            }
            "iterative_sequence" => iterative = boolean(&path, value)?,
            _ => ignored.push(path),
        }
    }
    // An iterative sequence is one request, run again as the model asks: the server has no
    // sequence of requests to keep, and nothing to fill in.
    if iterative {
        if !s.control_inputs.is_empty() || !s.states.is_empty() {
            return Err(
                "sequence_batching: iterative_sequence with control inputs or states is \
                        not supported; an iterative model keeps each request's state itself"
                    .into(),
            );
        }
        config.iterative_sequence = true;
        return Ok(());
    }
    config.sequence_batching = Some(s);
    Ok(())
}

/// One `control_input { name: "START" control [{ kind: CONTROL_SEQUENCE_START
/// fp32_false_true: [0, 1] }] }`.
fn control_input(
    path: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<Vec<ControlInput>, String> {
    let fields = message(path, value)?;
    let name = fields
        .iter()
        .find(|(n, _)| n == "name")
        .map(|(_, v)| word(&format!("{path}.name"), v))
        .transpose()?
        .ok_or_else(|| format!("{path}: a control input without a name"))?
        .to_string();
    let mut controls = Vec::new();
    for (field, value) in fields {
        let inner = format!("{path}.{field}");
        match field.as_str() {
            "name" => {}
            "control" => {
                for control in value.items() {
                    let mut kind = None;
                    let mut false_true = [0.0, 1.0];
                    for (f, v) in message(&inner, control)? {
                        let at = format!("{inner}.{f}");
                        match f.as_str() {
                            "kind" => {
                                kind = Some(match word(&at, v)? {
                                    "CONTROL_SEQUENCE_START" => ControlKind::Start,
                                    "CONTROL_SEQUENCE_END" => ControlKind::End,
                                    "CONTROL_SEQUENCE_READY" => ControlKind::Ready,
                                    "CONTROL_SEQUENCE_CORRID" => ControlKind::Corrid,
                                    other => return Err(format!("{at}: unknown kind '{other}'")),
                                })
                            }
                            "fp32_false_true" | "int32_false_true" | "bool_false_true" => {
                                let values = v
                                    .items()
                                    .into_iter()
                                    .map(|x| match word(&at, x)? {
                                        "true" => Ok(1.0),
                                        "false" => Ok(0.0),
                                        w => w
                                            .parse::<f64>()
                                            .map_err(|_| format!("{at}: '{w}' is not a value")),
                                    })
                                    .collect::<Result<Vec<_>, _>>()?;
                                false_true = <[f64; 2]>::try_from(values).map_err(|_| {
                                    format!("{at}: give two values, false and true")
                                })?;
                            }
                            // The model's own input says the data type.
                            "data_type" => {}
                            _ => ignored.push(at),
                        }
                    }
                    let kind = kind.ok_or_else(|| format!("{inner}: a control without a kind"))?;
                    controls.push(ControlInput {
                        name: name.clone(),
                        kind,
                        false_true,
                    });
                }
            }
            _ => ignored.push(inner),
        }
    }
    Ok(controls)
}

/// One `state { input_name output_name data_type dims initial_state { zero_data } }`.
fn state_config(
    path: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<StateConfig, String> {
    let mut state = StateConfig {
        input: String::new(),
        output: String::new(),
        dims: Vec::new(),
        initial: 0.0,
    };
    for (field, value) in message(path, value)? {
        let inner = format!("{path}.{field}");
        match field.as_str() {
            "input_name" => state.input = word(&inner, value)?.to_string(),
            "output_name" => state.output = word(&inner, value)?.to_string(),
            "dims" => state.dims = dims(&inner, value)?,
            // The model's own input says the data type.
            "data_type" => {}
            "initial_state" => {
                for (f, _) in message(&inner, value)? {
                    let at = format!("{inner}.{f}");
                    match f.as_str() {
                        "zero_data" | "name" | "data_type" | "dims" => {}
                        "data_file" => {
                            return Err(format!(
                                "{at}: initial state from a file is not supported; use zero_data"
                            ))
                        }
                        _ => ignored.push(at),
                    }
                }
            }
            _ => ignored.push(inner),
        }
    }
    if state.input.is_empty() || state.output.is_empty() {
        return Err(format!("{path}: a state needs input_name and output_name"));
    }
    Ok(state)
}

fn dims(path: &str, value: &Value) -> Result<Vec<i64>, String> {
    value
        .items()
        .into_iter()
        .map(|d| {
            word(path, d)?
                .parse::<i64>()
                .map_err(|_| format!("{path}: {d:?} is not a dimension"))
        })
        .collect()
}

/// One `instance_group`: its instances (`count`, 1 when absent), the device they prefer (none:
/// any) and its `rate_limiter`. Of several `gpus`, the first is taken and the rest named as
/// passed over.
fn instance_group(value: &Value, ignored: &mut Vec<String>) -> Result<Group, String> {
    let mut gpus = Vec::new();
    let mut kind = "KIND_AUTO".to_string();
    let mut instances = 1;
    let mut limiter = None;
    for (name, value) in message("instance_group", value)? {
        let path = format!("instance_group.{name}");
        match name.as_str() {
            "count" => instances = count(&path, value)?.max(1),
            "kind" => kind = word(&path, value)?.to_string(),
            "gpus" => gpus = counts(&path, value)?,
            "rate_limiter" => limiter = Some(rate_limiter(value, ignored)?),
            "name" => {}
            _ => ignored.push(path),
        }
    }
    let device = match (kind.as_str(), gpus.first()) {
        ("KIND_CPU", _) => Some("cpu".into()),
        ("KIND_GPU", Some(gpu)) => Some(format!("cuda:{gpu}")),
        ("KIND_GPU", None) => Some("cuda:0".into()),
        ("KIND_AUTO", _) => None,
        (other, _) => {
            ignored.push(format!("instance_group.kind {other}"));
            None
        }
    };
    if kind == "KIND_GPU" && gpus.len() > 1 {
        ignored.push(format!(
            "instance_group.gpus {gpus:?} (the instances load on cuda:{}; sheaf.yaml's devices \
             spread a model over several)",
            gpus[0]
        ));
    }
    Ok(Group {
        instances,
        device,
        limiter,
    })
}

/// What one `instance_group` says.
struct Group {
    instances: usize,
    device: Option<String>,
    limiter: Option<RateLimiterConfig>,
}

/// `rate_limiter { resources [ { name: "R1" count: 2 global: true } ] priority: 1 }`.
fn rate_limiter(value: &Value, ignored: &mut Vec<String>) -> Result<RateLimiterConfig, String> {
    let mut config = RateLimiterConfig::default();
    for (name, value) in message("instance_group.rate_limiter", value)? {
        let path = format!("instance_group.rate_limiter.{name}");
        match name.as_str() {
            "priority" => {
                config.priority =
                    u32::try_from(count(&path, value)?).map_err(|_| format!("{path}: too large"))?
            }
            "resources" => {
                for resource in value.items() {
                    let mut need = ResourceNeed {
                        name: String::new(),
                        count: 0,
                        global: false,
                    };
                    for (field, value) in message(&path, resource)? {
                        let at = format!("{path}.{field}");
                        match field.as_str() {
                            "name" => need.name = word(&at, value)?.to_string(),
                            "count" => need.count = count(&at, value)?,
                            "global" => {
                                need.global = match word(&at, value)?.to_ascii_lowercase().as_str()
                                {
                                    "true" => true,
                                    "false" => false,
                                    other => {
                                        return Err(format!(
                                            "{at}: {other} is neither true nor false"
                                        ))
                                    }
                                }
                            }
                            _ => ignored.push(at),
                        }
                    }
                    if need.name.is_empty() {
                        return Err(format!("{path}: a resource without a name"));
                    }
                    config.resources.push(need);
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(config)
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
                input: "h_in".into(),
                output: "h_out".into(),
                dims: vec![2, 3],
                initial: 0.0
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
            (
                "sequence_batching { state [ { input_name: \"a\" output_name: \"b\" initial_state { data_file: \"x.bin\" } } ] }",
                "not supported; use zero_data",
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
