//! A pipeline's answers in the response cache: the key a request has there, what of an answer
//! is kept, and the answer rebuilt from it.

use std::collections::BTreeMap;

use sheaf_backend::DataType;

use crate::cache::ResponseCache;
use crate::request::{ByteTensor, InferResponse, RawRequest};
use crate::InferError;

use super::run::Value;
use super::Pipeline;

impl Pipeline {
    /// The key of `raw` in the response cache for the pipeline load `load`: its inputs by
    /// name (byte strings in their wire form), whatever their order in the request; None when
    /// one cannot be put in that form (the request is then run, not cached).
    pub(crate) fn cache_key(
        &self,
        cache: &ResponseCache,
        load: u64,
        raw: &RawRequest,
    ) -> Option<u128> {
        let bytes = raw
            .byte_inputs
            .iter()
            .map(|b| {
                let wire =
                    sheaf_backend::Tensor::new(DataType::Bytes, b.shape.clone(), b.to_wire());
                wire.ok().map(|t| (b.name.as_str(), t))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut inputs: Vec<(&str, &sheaf_backend::Tensor)> = raw
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), &t.tensor))
            .chain(bytes.iter().map(|(n, t)| (*n, t)))
            .collect();
        inputs.sort_by(|a, b| a.0.cmp(b.0));
        Some(cache.key(load, inputs.into_iter(), None))
    }

    /// What the response cache keeps of `answer`, which holds every output: each output's
    /// tensor in the order of [`Pipeline::outputs`] (byte strings in their wire form).
    pub(crate) fn to_cache(&self, answer: &InferResponse) -> Option<Vec<sheaf_backend::Tensor>> {
        self.outputs
            .iter()
            .map(|name| {
                if let Some(t) = answer.outputs.iter().find(|t| &t.name == name) {
                    return Some(t.tensor.clone());
                }
                let b = answer.byte_outputs.iter().find(|b| &b.name == name)?;
                sheaf_backend::Tensor::new(DataType::Bytes, b.shape.clone(), b.to_wire()).ok()
            })
            .collect()
    }

    /// The answer to `raw` from what the response cache kept ([`Pipeline::to_cache`]): the
    /// outputs it asks for, else every output.
    pub(crate) fn cached_answer(
        &self,
        name: &str,
        version: &str,
        raw: &RawRequest,
        kept: Vec<sheaf_backend::Tensor>,
    ) -> Result<InferResponse, InferError> {
        let mut values = BTreeMap::new();
        for (output, tensor) in self.outputs.iter().zip(kept) {
            let value = match tensor.dtype() {
                DataType::Bytes => Value::Bytes(ByteTensor::from_wire(
                    output.clone(),
                    tensor.shape().to_vec(),
                    tensor.data(),
                )?),
                _ => Value::Tensor(tensor),
            };
            values.insert(output.clone(), value);
        }
        self.answer(name, version, raw, values)
    }

    /// `answer`, which holds every output, as the answer to `raw`: the outputs it asks for
    /// (an output the pipeline lacks is a 400), else every output.
    pub(crate) fn pick(
        &self,
        name: &str,
        version: &str,
        raw: &RawRequest,
        answer: InferResponse,
    ) -> Result<InferResponse, InferError> {
        let receipt = answer.receipt;
        let mut values = BTreeMap::new();
        for t in answer.outputs {
            values.insert(t.name, Value::Tensor(t.tensor));
        }
        for b in answer.byte_outputs {
            values.insert(b.name.clone(), Value::Bytes(b));
        }
        let mut picked = self.answer(name, version, raw, values)?;
        picked.receipt = receipt;
        Ok(picked)
    }
}
