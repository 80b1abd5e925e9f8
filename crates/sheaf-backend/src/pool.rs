//! Sentence embeddings from an encoder model: [`Pooled`] wraps any backend's model whose output
//! is one hidden state per token (`[batch, tokens, hidden]`) and answers one vector per item
//! (`[batch, hidden]`, [`EMBEDDING_OUTPUT`]), pooled over the tokens the attention mask marks
//! and, if asked, L2-normalised, beside the token states themselves ([`TOKEN_STATES_OUTPUT`],
//! TEI's `/embed_all`). [`PooledBackend`] wraps a backend so that every instance it loads is
//! pooled.
//!
//! Pooling inside the instance means a request that asks for the vector alone takes only the
//! vector: the batcher slices back to a request only the outputs it reads, so the token states
//! (tokens × hidden floats per item) are neither sliced nor copied for it.

use std::sync::Arc;

use bytes::Bytes;

use crate::{Backend, BackendError, DataType, LoadSpec, Model, Signature, Tensor, TensorSpec};

/// How the token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean over the tokens the mask keeps (sentence-transformers' default).
    #[default]
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The last token the mask keeps (decoder-style encoders).
    Last,
}

/// What [`Pooled`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub pooling: Pooling,
    /// Scale each vector to unit length.
    pub normalize: bool,
    /// The input holding the attention mask (`[batch, tokens]`, integers, 0 at padding).
    pub mask_input: String,
    /// The output holding the token states; none: the first output of rank 3.
    pub hidden_output: Option<String>,
}

/// The name of a pooled model's vectors, its first output.
pub const EMBEDDING_OUTPUT: &str = "embedding";

/// The name of a pooled model's token states (`[batch, tokens, hidden]`, as the encoder gave
/// them), its second output.
pub const TOKEN_STATES_OUTPUT: &str = "token_states";

/// A backend whose instances are pooled (see the module doc).
pub struct PooledBackend {
    inner: Arc<dyn Backend>,
    spec: PoolSpec,
}

impl PooledBackend {
    pub fn new(inner: Arc<dyn Backend>, spec: PoolSpec) -> PooledBackend {
        PooledBackend { inner, spec }
    }
}

impl Backend for PooledBackend {
    fn platform(&self) -> &'static str {
        self.inner.platform()
    }

    fn model_file(&self) -> &'static str {
        self.inner.model_file()
    }

    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
        let model = self.inner.load(spec)?;
        Ok(Box::new(Pooled::new(model, self.spec.clone())?))
    }

    fn estimate_memory(&self, path: &std::path::Path) -> Option<u64> {
        self.inner.estimate_memory(path)
    }
}

/// An encoder instance that answers pooled vectors (see the module doc).
pub struct Pooled {
    inner: Box<dyn Model>,
    spec: PoolSpec,
    signature: Signature,
    /// Index of the mask among the inputs.
    mask: usize,
    /// Index of the token states among the inner model's outputs.
    hidden: usize,
}

impl Pooled {
    /// Wraps `inner`; fails when it has no such mask input or no rank-3 float32 output.
    pub fn new(inner: Box<dyn Model>, spec: PoolSpec) -> Result<Pooled, BackendError> {
        let sig = inner.signature();
        let mask = sig
            .inputs
            .iter()
            .position(|s| s.name == spec.mask_input)
            .ok_or_else(|| {
                BackendError::Load(format!(
                    "an embedding model needs an attention-mask input named '{}'; its inputs are {}",
                    spec.mask_input,
                    names(&sig.inputs)
                ))
            })?;
        if sig.inputs[mask].shape.len() != 2 || !sig.inputs[mask].dtype.is_integer() {
            return Err(BackendError::Load(format!(
                "the attention mask '{}' must be integers of shape [batch, tokens], not {} {:?}",
                spec.mask_input, sig.inputs[mask].dtype, sig.inputs[mask].shape
            )));
        }
        let hidden = match &spec.hidden_output {
            Some(name) => sig.outputs.iter().position(|s| &s.name == name),
            None => sig.outputs.iter().position(|s| s.shape.len() == 3),
        }
        .ok_or_else(|| {
            BackendError::Load(format!(
                "an embedding model needs {} among its outputs; they are {}",
                spec.hidden_output.as_deref().map_or_else(
                    || "a [batch, tokens, hidden] output".to_string(),
                    |n| format!("an output named '{n}'")
                ),
                names(&sig.outputs)
            ))
        })?;
        let out = &sig.outputs[hidden];
        if out.shape.len() != 3 || out.dtype != DataType::F32 {
            return Err(BackendError::Load(format!(
                "the token states '{}' must be FP32 of shape [batch, tokens, hidden], not {} {:?}",
                out.name, out.dtype, out.shape
            )));
        }
        let signature = Signature {
            inputs: sig.inputs.clone(),
            outputs: vec![
                TensorSpec {
                    name: EMBEDDING_OUTPUT.into(),
                    dtype: DataType::F32,
                    shape: vec![-1, out.shape[2]],
                },
                TensorSpec {
                    name: TOKEN_STATES_OUTPUT.into(),
                    dtype: DataType::F32,
                    shape: vec![-1, -1, out.shape[2]],
                },
            ],
        };
        Ok(Pooled {
            inner,
            spec,
            signature,
            mask,
            hidden,
        })
    }
}

fn names(specs: &[TensorSpec]) -> String {
    specs
        .iter()
        .map(|s| format!("'{}'", s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Model for Pooled {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let mask = inputs
            .get(self.mask)
            .ok_or_else(|| BackendError::InvalidInput("the attention mask is missing".into()))?;
        let mut outputs = self.inner.infer(inputs)?;
        if self.hidden >= outputs.len() {
            return Err(BackendError::Runtime(
                "the encoder returned fewer outputs than it declares".into(),
            ));
        }
        let states = outputs.swap_remove(self.hidden);
        Ok(vec![pool(&states, mask, &self.spec)?, states])
    }

    fn memory_bytes(&self) -> Option<u64> {
        self.inner.memory_bytes()
    }

    fn keep_batch_sizes(&mut self, sizes: &[usize]) {
        self.inner.keep_batch_sizes(sizes)
    }

    fn release_memory(&mut self, inputs: &[Tensor]) -> Result<bool, BackendError> {
        self.inner.release_memory(inputs)
    }

    fn ready_check(&self) -> Option<std::sync::Arc<dyn crate::ReadyCheck>> {
        self.inner.ready_check()
    }
}

/// Pools `states` (`[batch, tokens, hidden]`, FP32) over `mask` (`[batch, tokens]`).
pub fn pool(states: &Tensor, mask: &Tensor, spec: &PoolSpec) -> Result<Tensor, BackendError> {
    let (&[batch, tokens, hidden], &[mb, mt]) = (states.shape(), mask.shape()) else {
        return Err(BackendError::Runtime(format!(
            "cannot pool token states of shape {:?} with a mask of shape {:?}",
            states.shape(),
            mask.shape()
        )));
    };
    if (mb, mt) != (batch, tokens) || states.dtype() != DataType::F32 {
        return Err(BackendError::Runtime(format!(
            "cannot pool token states {} {:?} with a mask of shape {:?}",
            states.dtype(),
            states.shape(),
            mask.shape()
        )));
    }
    let keep = mask_values(mask)?;
    let data = states.data();
    let value = |b: usize, t: usize, h: usize| {
        let at = ((b * tokens + t) * hidden + h) * 4;
        f32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
    };
    let mut out = Vec::with_capacity(batch * hidden * 4);
    let mut vector = vec![0f32; hidden];
    for b in 0..batch {
        let kept = &keep[b * tokens..(b + 1) * tokens];
        vector.iter_mut().for_each(|v| *v = 0.0);
        match spec.pooling {
            Pooling::Mean => {
                let count = kept.iter().filter(|&&k| k).count().max(1) as f32;
                for t in (0..tokens).filter(|&t| kept[t]) {
                    for (h, v) in vector.iter_mut().enumerate() {
                        *v += value(b, t, h);
                    }
                }
                vector.iter_mut().for_each(|v| *v /= count);
            }
            Pooling::Cls | Pooling::Last => {
                let t = match spec.pooling {
                    Pooling::Cls => Some(0).filter(|_| tokens > 0),
                    _ => kept.iter().rposition(|&k| k),
                };
                if let Some(t) = t {
                    for (h, v) in vector.iter_mut().enumerate() {
                        *v = value(b, t, h);
                    }
                }
            }
        }
        if spec.normalize {
            normalize(&mut vector);
        }
        out.extend(vector.iter().flat_map(|v| v.to_le_bytes()));
    }
    Tensor::new(DataType::F32, vec![batch, hidden], Bytes::from(out))
}

/// Scales `vector` to unit length (an all-zero vector stays zero).
pub fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    vector.iter_mut().for_each(|v| *v /= norm);
}

/// Whether each mask position is kept (non-zero), for an integer mask.
fn mask_values(mask: &Tensor) -> Result<Vec<bool>, BackendError> {
    let size = mask.dtype().size();
    if !mask.dtype().is_integer() {
        return Err(BackendError::InvalidInput(format!(
            "the attention mask must be integers, not {}",
            mask.dtype()
        )));
    }
    Ok(mask
        .data()
        .chunks_exact(size)
        .map(|c| c.iter().any(|&b| b != 0))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(t: &Tensor) -> Vec<f32> {
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn states(values: &[f32], shape: [usize; 3]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DataType::F32, shape.to_vec(), Bytes::from(bytes)).unwrap()
    }

    fn mask(values: &[i64], shape: [usize; 2]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DataType::I64, shape.to_vec(), Bytes::from(bytes)).unwrap()
    }

    fn spec(pooling: Pooling, normalize: bool) -> PoolSpec {
        PoolSpec {
            pooling,
            normalize,
            mask_input: "attention_mask".into(),
            hidden_output: None,
        }
    }

    // Two items of three tokens, hidden size 2; the second item's last token is padding.
    const STATES: [f32; 12] = [1., 2., 3., 4., 5., 6., 10., 20., 30., 40., 99., 99.];
    const MASK: [i64; 6] = [1, 1, 1, 1, 1, 0];

    #[test]
    fn mean_skips_masked_tokens() {
        let s = states(&STATES, [2, 3, 2]);
        let out = pool(&s, &mask(&MASK, [2, 3]), &spec(Pooling::Mean, false)).unwrap();
        assert_eq!(out.shape(), &[2, 2]);
        assert_eq!(f32s(&out), vec![3., 4., 20., 30.]);
    }

    #[test]
    fn cls_and_last_pick_one_token() {
        let s = states(&STATES, [2, 3, 2]);
        let m = mask(&MASK, [2, 3]);
        let cls = pool(&s, &m, &spec(Pooling::Cls, false)).unwrap();
        assert_eq!(f32s(&cls), vec![1., 2., 10., 20.]);
        let last = pool(&s, &m, &spec(Pooling::Last, false)).unwrap();
        assert_eq!(f32s(&last), vec![5., 6., 30., 40.]);
    }

    #[test]
    fn normalised_vectors_have_unit_length() {
        let s = states(&[3., 4., 0., 0.], [2, 1, 2]);
        let out = pool(&s, &mask(&[1, 1], [2, 1]), &spec(Pooling::Mean, true)).unwrap();
        // An all-zero vector stays zero rather than dividing by zero.
        assert_eq!(f32s(&out), vec![0.6, 0.8, 0., 0.]);
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let s = states(&STATES, [2, 3, 2]);
        assert!(pool(&s, &mask(&MASK, [3, 2]), &spec(Pooling::Mean, true)).is_err());
    }
}
