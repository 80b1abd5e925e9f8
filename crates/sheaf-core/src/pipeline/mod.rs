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
//!
//! This file reads and checks a pipeline; [`steps`] holds its steps as `pipeline.yaml` spells
//! them, [`run`] a run, [`cache`] its answers in the response cache, [`signature`] the tensors
//! its steps imply, and [`ensemble`] a Triton ensemble read as a pipeline.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sheaf_backend::{DataType, TensorSpec};

mod cache;
mod ensemble;
mod run;
mod signature;
mod steps;

pub use steps::{ClassifyStep, EncodeStep, ImageStep, ModelStepView, Step, TokenizeStep};

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
            false => sheaf_backend::yaml::from_str(&text),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{NamedTensor, RawRequest};
    use std::path::PathBuf;

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
