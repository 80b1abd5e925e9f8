//! The steps a `pipeline.yaml` lists, as it spells them: a model step with its input and output
//! maps, and the built-in steps `image`, `classify`, `encode_image` and `tokenize`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::{ImageInputConfig, ImageOutputConfig};

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

impl Step {
    pub(super) fn describe(&self) -> String {
        match self {
            Step::Model { model, .. } => format!("model '{model}'"),
            Step::Image(_) => "image".into(),
            Step::Classify(_) => "classify".into(),
            Step::EncodeImage(_) => "encode_image".into(),
            Step::Tokenize(_) => "tokenize".into(),
        }
    }
}
