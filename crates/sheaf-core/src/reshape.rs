//! Triton's `reshape`: a declared tensor that clients send (or get back) with its `dims` while
//! the model takes (or gives) the same elements in another shape, `reshape: { shape: [...] }`
//! (a `[1]` per item that the model takes as a scalar, say). The model's signature has the
//! reshaped form; clients see `dims` in the metadata and send and get tensors of that shape.
//! Only the shape changes: the bytes are shared, never copied.
//!
//! Each side may have wildcards (-1): as many on both, standing for the same sizes in order,
//! with the same number of elements besides (checked at load).

use sheaf_backend::{Signature, Tensor};

use crate::config::DeclaredTensor;
use crate::warmup::WarmupSample;
use crate::InferError;

/// The reshaped tensors of a model, by their place in its signature.
#[derive(Debug, Clone, Default)]
pub struct Reshapes {
    /// For each input: (the clients' dims, the model's shape), when it is reshaped.
    inputs: Vec<Option<(Vec<i64>, Vec<i64>)>>,
    /// For each output: (the model's shape, the clients' dims), when it is reshaped.
    outputs: Vec<Option<(Vec<i64>, Vec<i64>)>>,
    /// Whether the tensors' first dimension is the batch, which no reshape touches.
    batched: bool,
}

/// Checks that `dims` and `reshape` may hold the same elements: as many wildcards on each
/// side, and the same product of the fixed sizes.
pub fn check(dims: &[i64], reshape: &[i64]) -> Result<(), String> {
    let wildcards = |s: &[i64]| s.iter().filter(|&&d| d < 0).count();
    let fixed = |s: &[i64]| s.iter().filter(|&&d| d >= 0).product::<i64>();
    if wildcards(dims) != wildcards(reshape) || fixed(dims) != fixed(reshape) {
        return Err(format!(
            "reshape {reshape:?} cannot hold the elements of dims {dims:?} (the same number of \
             elements, and as many -1 on each side, are needed)"
        ));
    }
    Ok(())
}

impl Reshapes {
    /// The reshapes `inputs` and `outputs` declare, and `model`'s signature as clients see it
    /// (the declared dims of each reshaped tensor); none when nothing is reshaped.
    pub fn new(
        inputs: &[DeclaredTensor],
        outputs: &[DeclaredTensor],
        model: &Signature,
        batched: bool,
    ) -> (Option<Reshapes>, Signature) {
        let mut client = model.clone();
        let batch: &[i64] = if batched { &[-1] } else { &[] };
        let find = |declared: &[DeclaredTensor], specs: &mut Vec<sheaf_backend::TensorSpec>| {
            specs
                .iter_mut()
                .map(|spec| {
                    let d = declared.iter().find(|d| d.name == spec.name)?;
                    let reshape = d.reshape.clone()?;
                    spec.shape = batch.iter().chain(&d.dims).copied().collect();
                    Some((d.dims.clone(), reshape))
                })
                .collect::<Vec<_>>()
        };
        let inputs = find(inputs, &mut client.inputs);
        let outputs = find(outputs, &mut client.outputs)
            .into_iter()
            .map(|r| r.map(|(dims, reshape)| (reshape, dims)))
            .collect::<Vec<_>>();
        if inputs.iter().chain(&outputs).all(Option::is_none) {
            return (None, client);
        }
        let reshapes = Reshapes {
            inputs,
            outputs,
            batched,
        };
        (Some(reshapes), client)
    }

    /// A request's checked inputs, in the signature's order, in the shapes the model takes.
    pub fn to_model(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, InferError> {
        inputs
            .into_iter()
            .zip(self.inputs.iter().chain(std::iter::repeat(&None)))
            .map(|(t, r)| match r {
                Some((from, to)) => self.convert(t, from, to),
                None => Ok(t),
            })
            .collect()
    }

    /// Output `i` of the model, in the shape clients get.
    pub fn to_client(&self, i: usize, t: Tensor) -> Result<Tensor, InferError> {
        match self.outputs.get(i) {
            Some(Some((from, to))) => self.convert(t, from, to),
            _ => Ok(t),
        }
    }

    /// `t`, whose items have shape `from` (wildcards being any size), with items of shape
    /// `to`, each wildcard of `to` the size of the same wildcard of `from`.
    fn convert(&self, t: Tensor, from: &[i64], to: &[i64]) -> Result<Tensor, InferError> {
        let lead = usize::from(self.batched).min(t.shape().len());
        let (outer, item) = t.shape().split_at(lead);
        let wrong = || {
            InferError::internal(format!(
                "a tensor of shape {:?} does not have items of shape {from:?} to reshape to \
                 {to:?}",
                t.shape()
            ))
        };
        let shaped = resolve(item, from, to).ok_or_else(wrong)?;
        let shape: Vec<usize> = outer.iter().copied().chain(shaped).collect();
        let dtype = t.dtype();
        Tensor::new(dtype, shape, t.into_data()).map_err(|e| InferError::internal(e.to_string()))
    }
}

/// The shape `to` takes for an item of shape `item` that matches `from`: each wildcard of `to`
/// the size of the same wildcard of `from`; none when `item` does not match `from`.
fn resolve(item: &[usize], from: &[i64], to: &[i64]) -> Option<Vec<usize>> {
    if item.len() != from.len() {
        return None;
    }
    let mut sizes = item
        .iter()
        .zip(from)
        .filter(|(_, &f)| f < 0)
        .map(|(&s, _)| s);
    to.iter()
        .map(|&d| usize::try_from(d).ok().or_else(|| sizes.next()))
        .collect()
}

/// `samples` with each input the config reshapes in the model's shape: warm-up samples, as
/// Triton's, give the clients' dims, and run on the model itself.
pub fn warmup_samples(samples: &[WarmupSample], inputs: &[DeclaredTensor]) -> Vec<WarmupSample> {
    let mut samples = samples.to_vec();
    for sample in &mut samples {
        for (name, input) in &mut sample.inputs {
            let Some(d) = inputs.iter().find(|d| &d.name == name) else {
                continue;
            };
            let Some(reshape) = &d.reshape else { continue };
            let item: Option<Vec<usize>> = input
                .dims
                .iter()
                .map(|&s| usize::try_from(s).ok())
                .collect();
            // A sample that does not match its dims is left as it is, to be refused by name.
            if let Some(shaped) = item.and_then(|item| resolve(&item, &d.dims, reshape)) {
                input.dims = shaped.into_iter().map(|s| s as i64).collect();
            }
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_backend::{DataType, TensorSpec};

    fn declared(name: &str, dims: &[i64], reshape: Option<&[i64]>) -> DeclaredTensor {
        DeclaredTensor {
            name: name.into(),
            data_type: None,
            dims: dims.to_vec(),
            reshape: reshape.map(<[i64]>::to_vec),
            optional: false,
            allow_ragged_batch: false,
        }
    }

    fn spec(name: &str, shape: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype: DataType::F32,
            shape: shape.to_vec(),
        }
    }

    fn tensor(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::new(DataType::F32, shape.to_vec(), vec![0u8; n * 4].into()).unwrap()
    }

    #[test]
    fn clients_see_the_dims_and_the_model_gets_its_shape() {
        let model = Signature {
            inputs: vec![spec("x", &[-1]), spec("plain", &[-1, 3])],
            outputs: vec![spec("y", &[-1, 2, -1])],
        };
        let (r, client) = Reshapes::new(
            &[declared("x", &[1], Some(&[]))],
            &[declared("y", &[-1, 2], Some(&[2, -1]))],
            &model,
            true,
        );
        let r = r.unwrap();
        assert_eq!(client.inputs[0].shape, [-1, 1]);
        assert_eq!(client.inputs[1].shape, [-1, 3]);
        assert_eq!(client.outputs[0].shape, [-1, -1, 2]);
        let given = r.to_model(vec![tensor(&[4, 1]), tensor(&[4, 3])]).unwrap();
        assert_eq!(given[0].shape(), [4]);
        assert_eq!(given[1].shape(), [4, 3]);
        // The wildcard keeps its size, moved to its place.
        assert_eq!(
            r.to_client(0, tensor(&[4, 2, 7])).unwrap().shape(),
            [4, 7, 2]
        );
        // An item of the wrong rank is an error, never a panic.
        assert!(r.to_client(0, tensor(&[4, 2])).is_err());
    }

    #[test]
    fn a_model_that_does_not_batch_reshapes_the_whole_tensor() {
        let model = Signature {
            inputs: vec![spec("x", &[2, 3])],
            outputs: vec![],
        };
        let (r, client) = Reshapes::new(&[declared("x", &[6], Some(&[2, 3]))], &[], &model, false);
        assert_eq!(client.inputs[0].shape, [6]);
        assert_eq!(
            r.unwrap().to_model(vec![tensor(&[6])]).unwrap()[0].shape(),
            [2, 3]
        );
    }

    #[test]
    fn nothing_reshaped_is_none() {
        let model = Signature {
            inputs: vec![spec("x", &[-1, 2])],
            outputs: vec![],
        };
        assert!(
            Reshapes::new(&[declared("x", &[2], None)], &[], &model, true)
                .0
                .is_none()
        );
    }

    #[test]
    fn a_warm_up_sample_in_the_clients_dims_runs_in_the_model_s_shape() {
        let sample: WarmupSample = serde_yaml::from_str(
            "inputs: {x: {data_type: FP32, dims: [4, 1], zero_data: true}, \
             z: {data_type: FP32, dims: [3], zero_data: true}}",
        )
        .unwrap();
        let reshaped = warmup_samples(
            &[sample],
            &[
                declared("x", &[-1, 1], Some(&[-1])),
                declared("z", &[3], None),
            ],
        );
        assert_eq!(reshaped[0].inputs["x"].dims, [4]);
        assert_eq!(reshaped[0].inputs["z"].dims, [3]);
    }

    #[test]
    fn dims_and_reshape_must_hold_the_same_elements() {
        assert_eq!(check(&[1], &[]), Ok(()));
        assert_eq!(check(&[2, 3, -1], &[6, -1]), Ok(()));
        assert!(check(&[2, 3], &[5]).is_err());
        assert!(check(&[-1], &[]).is_err());
        assert!(check(&[-1, 2], &[-1, -1]).is_err());
    }
}
