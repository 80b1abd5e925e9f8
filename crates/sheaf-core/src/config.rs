//! Per-model configuration: `<repository>/<model>/config.yaml`.
//!
//! Every key is optional, so a folder holding a bare `model.onnx` serves with the defaults below.
//! Unknown keys are an error, so that a typo does not silently fall back to a default.

use serde::Deserialize;

/// The keys of a model's `config.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Most items (dimension 0) in one backend call. Absent: [`DEFAULT_MAX_BATCH_SIZE`] when the
    /// model has a dynamic first dimension, else 0. 0 turns batching off: each request runs
    /// alone, with its shape exactly as the model declares it.
    pub max_batch_size: Option<usize>,
    /// Longest time, in microseconds, the oldest queued request waits for a batch to fill while
    /// an execution instance is free.
    pub max_queue_delay_us: u64,
    /// Batch sizes worth dispatching at once, without waiting out `max_queue_delay_us`.
    pub preferred_batch_sizes: Vec<usize>,
    /// ONNX Runtime intra-op threads per execution instance.
    pub intra_op_threads: usize,
    /// Most items that may wait in this model's queue; a request that does not fit is refused
    /// at once with 503 (overload), never queued without bound.
    pub max_queue_size: usize,
    /// Batches in flight per execution instance: one running while the next is assembled.
    pub pipeline_depth: usize,
}

/// `max_batch_size` for a batchable model with no `max_batch_size` key.
pub const DEFAULT_MAX_BATCH_SIZE: usize = 32;

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            max_batch_size: None,
            max_queue_delay_us: 500,
            preferred_batch_sizes: Vec::new(),
            intra_op_threads: 1,
            max_queue_size: 4096,
            pipeline_depth: 2,
        }
    }
}

impl ModelConfig {
    /// Parses a `config.yaml` body.
    pub fn from_yaml(text: &str) -> Result<ModelConfig, String> {
        if text.trim().is_empty() {
            return Ok(ModelConfig::default());
        }
        let config: ModelConfig = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if self.intra_op_threads == 0 {
            return Err("intra_op_threads must be at least 1".into());
        }
        if self.max_queue_size == 0 {
            return Err("max_queue_size must be at least 1".into());
        }
        if self.pipeline_depth == 0 {
            return Err("pipeline_depth must be at least 1".into());
        }
        if self.preferred_batch_sizes.contains(&0) {
            return Err("preferred_batch_sizes must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(ModelConfig::from_yaml("").unwrap(), ModelConfig::default());
    }

    #[test]
    fn keys_are_read() {
        let c = ModelConfig::from_yaml(
            "max_batch_size: 8\nmax_queue_delay_us: 100\npreferred_batch_sizes: [4, 8]\nintra_op_threads: 2\n",
        )
        .unwrap();
        assert_eq!(c.max_batch_size, Some(8));
        assert_eq!(c.max_queue_delay_us, 100);
        assert_eq!(c.preferred_batch_sizes, vec![4, 8]);
        assert_eq!(c.intra_op_threads, 2);
        assert_eq!(c.max_queue_size, ModelConfig::default().max_queue_size);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = ModelConfig::from_yaml("max_batch_sise: 8\n").unwrap_err();
        assert!(err.contains("max_batch_sise"), "{err}");
        assert!(ModelConfig::from_yaml("intra_op_threads: 0\n").is_err());
        assert!(ModelConfig::from_yaml("max_batch_size: -1\n").is_err());
    }
}
