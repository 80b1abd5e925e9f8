//! The sim backend and its models.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use sheaf_backend::{
    Backend, BackendError, DataType, LoadSpec, Model, Signature, Tensor, TensorSpec,
};

use crate::CostCurve;

/// The contents of `model.sim.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    pub input: SimTensor,
    pub output: SimOutput,
    pub latency_ms: CostCurve,
    #[serde(default = "one")]
    pub time_scale: f64,
    #[serde(default)]
    pub memory_mb: u64,
    /// Declared device memory once the instance has run a batch (as a framework's caching
    /// allocator grows with its first batches); default: `memory_mb` throughout.
    #[serde(default)]
    pub serving_memory_mb: Option<u64>,
    /// Milliseconds that dropping a loaded instance takes (as freeing a GPU session does);
    /// the instance logs "sim model dropped" when done.
    #[serde(default)]
    pub drop_ms: u64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimTensor {
    pub name: String,
    pub shape: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimOutput {
    pub name: String,
}

impl SimSpec {
    pub fn from_yaml(text: &str) -> Result<SimSpec, String> {
        let spec: SimSpec = sheaf_backend::yaml::from_str(text)?;
        spec.latency_ms.check()?;
        if !(spec.time_scale > 0.0 && spec.time_scale <= 1e6) {
            return Err("time_scale must be a number above 0, at most 10^6".into());
        }
        Ok(spec)
    }
}

/// A loaded sim model.
#[derive(Debug)]
pub struct SimModel {
    spec: SimSpec,
    signature: Signature,
    /// Whether it has run a batch.
    ran: bool,
}

impl SimModel {
    pub fn new(spec: SimSpec) -> SimModel {
        let tensor = |name: &str| TensorSpec {
            name: name.to_string(),
            dtype: DataType::F32,
            shape: spec.input.shape.clone(),
        };
        let signature = Signature {
            inputs: vec![tensor(&spec.input.name)],
            outputs: vec![tensor(&spec.output.name)],
        };
        SimModel {
            spec,
            signature,
            ran: false,
        }
    }

    /// The time a batch of `items` takes.
    pub fn latency(&self, items: usize) -> Duration {
        self.spec.latency_ms.latency(items, self.spec.time_scale)
    }
}

impl Drop for SimModel {
    fn drop(&mut self) {
        if self.spec.drop_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.spec.drop_ms));
        }
        tracing::info!(drop_ms = self.spec.drop_ms, "sim model dropped");
    }
}

impl Model for SimModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn memory_bytes(&self) -> Option<u64> {
        let mb = match self.spec.serving_memory_mb {
            Some(grown) if self.ran => grown,
            _ => self.spec.memory_mb,
        };
        Some(mb * 1024 * 1024)
    }

    fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let [x] = inputs else {
            return Err(BackendError::InvalidInput(format!(
                "sim model takes 1 input, got {}",
                inputs.len()
            )));
        };
        std::thread::sleep(self.latency(x.items()));
        self.ran = true;
        let out: Vec<u8> = x
            .data()
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 2.0 + 1.0).to_le_bytes())
            .collect();
        Ok(vec![Tensor::new(
            DataType::F32,
            x.shape().to_vec(),
            Bytes::from(out),
        )?])
    }
}

/// Loads `model.sim.yaml` files.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimBackend;

impl Backend for SimBackend {
    fn platform(&self) -> &'static str {
        "sheaf_sim"
    }

    fn model_file(&self) -> &'static str {
        "model.sim.yaml"
    }

    fn estimate_memory(&self, path: &std::path::Path) -> Option<u64> {
        let spec = SimSpec::from_yaml(&std::fs::read_to_string(path).ok()?).ok()?;
        Some(spec.memory_mb * 1024 * 1024)
    }

    fn load(&self, spec: &LoadSpec) -> Result<Box<dyn Model>, BackendError> {
        let text = std::fs::read_to_string(&spec.path)
            .map_err(|e| BackendError::Load(format!("{}: {e}", spec.path.display())))?;
        let sim = SimSpec::from_yaml(&text)
            .map_err(|e| BackendError::Load(format!("{}: {e}", spec.path.display())))?;
        Ok(Box::new(SimModel::new(sim)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str =
        "input: {name: x, shape: [-1, 2]}\noutput: {name: y}\nlatency_ms: {a: 0, b: 0}\n";

    #[test]
    fn outputs_are_a_fixed_function_of_the_inputs() {
        let mut m = SimModel::new(SimSpec::from_yaml(SPEC).unwrap());
        let x: Vec<u8> = [1.0f32, 2.0, -1.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = Tensor::new(DataType::F32, vec![2, 2], Bytes::from(x)).unwrap();
        let y = m.infer(&[t]).unwrap();
        let got: Vec<f32> = y[0]
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, vec![3.0, 5.0, -1.0, 2.0]);
        assert!(m.signature().has_batch_dim());
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let e = SimSpec::from_yaml(
            "input: {name: x, shape: [-1]}\noutput: {name: y}\nlatency_ms: {points: [[1, 2]]}\n",
        )
        .unwrap_err();
        assert!(e.contains("two"), "{e}");
        assert!(SimSpec::from_yaml("input: {name: x, shape: [-1]}\n").is_err());
        // Brackets nested past what any spec needs are refused before the YAML parser (whose
        // time grows with the square of the depth) reads them.
        let deep = format!("latency_ms: {}\n", "[".repeat(200_000));
        let e = SimSpec::from_yaml(&deep).unwrap_err();
        assert!(e.contains("nest more than 100 deep"), "{e}");
    }
}
