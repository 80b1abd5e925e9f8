//! Triton's ensembles as pipelines: a model folder whose `config.pbtxt` says
//! `platform: "ensemble"` and chains models in `ensemble_scheduling { step [ ... ] }` serves as
//! a pipeline of model steps, so that a Triton repository's ensembles work unchanged.
//!
//! The ensemble's `input`s are the request's values and its `output`s the answer; each step's
//! `input_map` gives its model's inputs from the ensemble's tensors (`key`: the model's input,
//! `value`: the tensor), and `output_map` names its model's outputs. Triton starts a step once
//! its inputs are there; here the steps are put in an order where each comes after those that
//! make its inputs (the file's order, where it already is one), and the pipeline runs at once
//! the steps of that order that take nothing from each other. `model_version` -1 (or none) runs
//! the version served; another number runs that version, and the step fails with "unknown
//! version" when its model does not serve it.

use std::collections::{BTreeMap, HashSet};

use super::{Pipeline, Step};
use crate::pbtxt::{map_entry, message, parse, word, Value};

/// The ensemble's pipeline, from its `config.pbtxt` text.
pub(super) fn pipeline(text: &str) -> Result<Pipeline, String> {
    let fields = parse(text)?;
    let all = |field: &str| {
        fields
            .iter()
            .filter(|(name, _)| name == field)
            .flat_map(|(_, value)| value.items())
            .collect::<Vec<_>>()
    };
    let names = |field: &str| -> Result<Vec<String>, String> {
        all(field)
            .into_iter()
            .map(|tensor| {
                message(field, tensor)?
                    .iter()
                    .find(|(name, _)| name == "name")
                    .ok_or(format!("{field}: a tensor without a name"))
                    .and_then(|(_, name)| word(field, name).map(str::to_string))
            })
            .collect()
    };
    let inputs = names("input")?;
    let outputs = names("output")?;
    let scheduling = all("ensemble_scheduling");
    let [scheduling] = scheduling.as_slice() else {
        return Err("an ensemble needs one ensemble_scheduling { step [ ... ] }".into());
    };
    let mut steps = Vec::new();
    for (name, value) in message("ensemble_scheduling", scheduling)? {
        if name != "step" {
            continue;
        }
        for step in value.items() {
            steps.push(model_step(step)?);
        }
    }
    if steps.is_empty() {
        return Err("ensemble_scheduling has no step".into());
    }
    Ok(Pipeline::of(
        inputs.clone(),
        in_order(steps, &inputs)?,
        outputs,
    ))
}

/// One `step { model_name model_version input_map output_map }`.
fn model_step(step: &Value) -> Result<Step, String> {
    let at = "ensemble_scheduling.step";
    let mut model = None;
    let mut version = None;
    let mut inputs = BTreeMap::new();
    let mut outputs = BTreeMap::new();
    for (name, value) in message(at, step)? {
        let path = format!("{at}.{name}");
        match name.as_str() {
            "model_name" => model = Some(word(&path, value)?.to_string()),
            "model_version" => {
                let v = word(&path, value)?;
                let v: i64 = v
                    .parse()
                    .map_err(|_| format!("{path}: '{v}' is not a version"))?;
                version = (v >= 0).then(|| v.to_string());
            }
            "input_map" | "output_map" => {
                let map = if name == "input_map" {
                    &mut inputs
                } else {
                    &mut outputs
                };
                for entry in value.items() {
                    let (key, value) = map_entry(&path, entry)?;
                    let value = value.ok_or(format!("{path}: an entry without a value"))?;
                    map.insert(key, word(&path, value)?.to_string());
                }
            }
            _ => {}
        }
    }
    let model = model.ok_or(format!("{at}: a step without a model_name"))?;
    Ok(Step::Model {
        model,
        version,
        inputs,
        outputs,
    })
}

/// `steps` in an order where each comes after the steps that make the tensors it takes, from
/// the ensemble's `inputs` on; the given order where it is one.
fn in_order(mut steps: Vec<Step>, inputs: &[String]) -> Result<Vec<Step>, String> {
    let takes = |step: &Step| match step {
        Step::Model { inputs, .. } => inputs.values().cloned().collect(),
        _ => Vec::new(),
    };
    let mut known: HashSet<String> = inputs.iter().cloned().collect();
    let mut ordered = Vec::with_capacity(steps.len());
    while !steps.is_empty() {
        let Some(next) = steps
            .iter()
            .position(|s| takes(s).iter().all(|t| known.contains(t)))
        else {
            let step = &steps[0];
            let missing = takes(step).into_iter().find(|t| !known.contains(t));
            return Err(format!(
                "step {} takes '{}', which no ensemble input or other step makes",
                step.describe(),
                missing.unwrap_or_default()
            ));
        };
        let step = steps.remove(next);
        if let Step::Model { outputs, .. } = &step {
            known.extend(outputs.values().cloned());
        }
        ordered.push(step);
    }
    Ok(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Triton's image-classification ensemble, its steps written last first.
    const ENSEMBLE: &str = r#"
name: "ensemble_model"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "CLASSES" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "postprocess"
      model_version: -1
      input_map { key: "LOGITS" value: "scores" }
      output_map { key: "LABELS" value: "CLASSES" }
    },
    {
      model_name: "classifier"
      model_version: 3
      input_map { key: "input" value: "pixels" }
      output_map [ { key: "output" value: "scores" }, { key: "output_copy" value: "SCORES" } ]
    },
    {
      model_name: "preprocess"
      input_map { key: "IMAGE" value: "RAW" }
      output_map { key: "PIXELS" value: "pixels" }
    }
  ]
}
"#;

    fn model_steps(p: &Pipeline) -> Vec<(String, Option<String>)> {
        p.steps
            .iter()
            .map(|s| match s {
                Step::Model { model, version, .. } => (model.clone(), version.clone()),
                other => panic!("{}", other.describe()),
            })
            .collect()
    }

    #[test]
    fn an_ensemble_s_steps_run_after_the_steps_that_make_their_inputs() {
        let p = pipeline(ENSEMBLE).unwrap();
        assert_eq!(p.inputs, ["RAW"]);
        assert_eq!(p.outputs, ["CLASSES", "SCORES"]);
        assert_eq!(
            model_steps(&p),
            [
                ("preprocess".to_string(), None),
                ("classifier".to_string(), Some("3".to_string())),
                ("postprocess".to_string(), None),
            ]
        );
        let Step::Model {
            inputs, outputs, ..
        } = &p.steps[1]
        else {
            unreachable!()
        };
        assert_eq!(inputs["input"], "pixels");
        assert_eq!(outputs["output"], "scores");
        assert_eq!(outputs["output_copy"], "SCORES");
    }

    #[test]
    fn an_ensemble_that_cannot_run_says_why() {
        let cut = ENSEMBLE.replace(r#"value: "RAW""#, r#"value: "RAW_IMAGE""#);
        let e = pipeline(&cut).unwrap_err();
        assert_eq!(
            e,
            "step model 'postprocess' takes 'scores', which no ensemble input or other step makes"
        );
        let e = pipeline("platform: \"ensemble\"\ninput [ { name: \"x\" } ]").unwrap_err();
        assert!(e.contains("needs one ensemble_scheduling"), "{e}");
        let e =
            pipeline("ensemble_scheduling { step [ { input_map { key: \"a\" value: \"b\" } } ] }")
                .unwrap_err();
        assert!(e.contains("a step without a model_name"), "{e}");
        let e = pipeline("ensemble_scheduling { }").unwrap_err();
        assert!(e.contains("no step"), "{e}");
    }
}
