//! A pipeline's metadata when its configuration declares none: each input's spec read from the
//! first step that takes it, and each output's from the step that makes it, so that clients that
//! build their requests from the metadata (`sheaf bench`, tritonclient's examples,
//! perf_analyzer) can call a `pipeline.yaml` as written.
//!
//! A model step gives its model's own specs (looked up among the models served); an `image` or
//! `tokenize` step takes BYTES, one element an image or a text; `classify`, `encode_image` and
//! `tokenize` make what their settings say; an `image` step makes FP32 pixels of its crop.
//! Where one tensor's spec cannot be read so (a step model not loaded, a float tensor
//! taken by a built-in step), the metadata lists no tensors at all rather than a part of them.

use std::collections::BTreeMap;

use sheaf_backend::{DataType, Signature, TensorSpec};

use super::{Pipeline, Step};
use crate::config::Layout;

impl Pipeline {
    /// The signature the steps imply, with `lookup` giving a step model's signature (its name
    /// and version); none where a tensor's spec cannot be read.
    pub(crate) fn implied(
        &self,
        lookup: impl Fn(&str, Option<&str>) -> Option<Signature>,
    ) -> Option<Signature> {
        let mut models = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            models.push(match step {
                Step::Model { model, version, .. } => Some(lookup(model, version.as_deref())?),
                _ => None,
            });
        }
        let inputs = self
            .inputs
            .iter()
            .map(|name| {
                self.steps
                    .iter()
                    .zip(&models)
                    .find_map(|(step, model)| taken(step, model.as_ref(), name))
                    .flatten()
            })
            .collect::<Option<Vec<_>>>()?;
        let outputs = self
            .outputs
            .iter()
            .map(|name| {
                self.steps
                    .iter()
                    .zip(&models)
                    .rev()
                    .find_map(|(step, model)| made(step, model.as_ref(), name))
                    .flatten()
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Signature { inputs, outputs })
    }
}

/// `Some(spec)` when `step` takes the value `name` and says its spec, `Some(None)` when it takes
/// it without saying, `None` when it does not take it.
fn taken(step: &Step, model: Option<&Signature>, name: &str) -> Option<Option<TensorSpec>> {
    let bytes = || Some(Some(spec(name, DataType::Bytes, vec![-1])));
    match step {
        Step::Model { inputs, .. } => bound(inputs, &model?.inputs, name),
        Step::Image(image) if image.from == name => bytes(),
        Step::Tokenize(t) if t.from == name => bytes(),
        Step::Classify(c) if c.from == name => Some(None),
        Step::EncodeImage(e) if e.from == name => Some(None),
        _ => None,
    }
}

/// As [`taken`], for the step that makes the value `name`.
fn made(step: &Step, model: Option<&Signature>, name: &str) -> Option<Option<TensorSpec>> {
    match step {
        Step::Model { outputs, .. } => bound(outputs, &model?.outputs, name),
        Step::Classify(c) if c.to == name => {
            Some(Some(spec(name, DataType::Bytes, vec![-1, c.k as i64])))
        }
        Step::EncodeImage(e) if e.to == name => Some(Some(spec(name, DataType::Bytes, vec![-1]))),
        Step::Image(image) if image.to == name => {
            let (h, w) = match image.config.crop.as_slice() {
                [side] => (*side as i64, *side as i64),
                [h, w] => (*h as i64, *w as i64),
                _ => return Some(None),
            };
            let shape = match image.config.layout {
                Layout::Nchw => vec![-1, 3, h, w],
                Layout::Nhwc => vec![-1, h, w, 3],
            };
            Some(Some(spec(name, DataType::F32, shape)))
        }
        Step::Tokenize(t)
            if [Some(&t.ids), Some(&t.mask), t.types.as_ref()]
                .contains(&Some(&name.to_string())) =>
        {
            Some(Some(spec(name, DataType::I64, vec![-1, -1])))
        }
        _ => None,
    }
}

/// As [`taken`], for a model step whose `map` binds its tensors (`specs`) to values: the spec
/// of the tensor bound to `name` (each its own name's when the map is empty), named `name`.
fn bound(
    map: &BTreeMap<String, String>,
    specs: &[TensorSpec],
    name: &str,
) -> Option<Option<TensorSpec>> {
    let tensor = match map.iter().find(|(_, value)| *value == name) {
        Some((tensor, _)) => tensor.as_str(),
        None if map.is_empty() => name,
        None => return None,
    };
    let found = specs.iter().find(|s| s.name == tensor)?;
    Some(Some(spec(name, found.dtype, found.shape.clone())))
}

fn spec(name: &str, dtype: DataType, shape: Vec<i64>) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        dtype,
        shape,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::tests::load;

    fn model(
        inputs: &[(&str, DataType, &[i64])],
        outputs: &[(&str, DataType, &[i64])],
    ) -> Signature {
        let specs = |list: &[(&str, DataType, &[i64])]| {
            list.iter()
                .map(|(name, dtype, shape)| spec(name, *dtype, shape.to_vec()))
                .collect()
        };
        Signature {
            inputs: specs(inputs),
            outputs: specs(outputs),
        }
    }

    fn listed(specs: &[TensorSpec]) -> Vec<(&str, DataType, &[i64])> {
        specs
            .iter()
            .map(|s| (s.name.as_str(), s.dtype, s.shape.as_slice()))
            .collect()
    }

    #[test]
    fn the_steps_say_what_a_pipeline_takes_and_gives() {
        let classifier = model(
            &[("input", DataType::F32, &[-1, 3, 8, 8])],
            &[("logits", DataType::F32, &[-1, 2])],
        );
        let served = |name: &str, _: Option<&str>| (name == "m").then(|| classifier.clone());
        // Built-in steps around a model: images in, classes and pixels out.
        let p = load(
            "inputs: [image]\nsteps:\n  - image: {from: image, to: x, crop: [8, 8]}\n  \
             - model: m\n    inputs: {input: x}\n    outputs: {logits: scores}\n  \
             - classify: {from: scores, to: classes, k: 2}\noutputs: [classes, x, scores]\n",
        )
        .unwrap();
        let s = p.implied(served).unwrap();
        assert_eq!(listed(&s.inputs), [("image", DataType::Bytes, &[-1][..])]);
        assert_eq!(
            listed(&s.outputs),
            [
                ("classes", DataType::Bytes, &[-1, 2][..]),
                ("x", DataType::F32, &[-1, 3, 8, 8][..]),
                ("scores", DataType::F32, &[-1, 2][..]),
            ]
        );
        // A model step that maps nothing reads and writes values of its tensors' names.
        let p = load("inputs: [input]\nsteps: [{model: m}]\noutputs: [logits]\n").unwrap();
        let s = p.implied(served).unwrap();
        assert_eq!(
            listed(&s.inputs),
            [("input", DataType::F32, &[-1, 3, 8, 8][..])]
        );
        assert_eq!(
            listed(&s.outputs),
            [("logits", DataType::F32, &[-1, 2][..])]
        );
        // A step model not served, or a float input only a built-in step reads: no metadata.
        assert!(p.implied(|_, _| None).is_none());
        let p = load("inputs: [z]\nsteps: [{encode_image: {from: z, to: png}}]\noutputs: [png]\n")
            .unwrap();
        assert!(p.implied(served).is_none());
    }
}
