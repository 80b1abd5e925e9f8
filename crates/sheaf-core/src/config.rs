//! Per-model configuration: `<repository>/<model>/config.yaml`.
//!
//! Every key is optional, so a folder holding a bare `model.onnx` serves with the defaults below.
//! Unknown keys are an error, so that a typo does not silently fall back to a default.

use serde::Deserialize;

/// The keys of a model's `config.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Most items (dimension 0) in one backend call. Absent: [`DEFAULT_MAX_BATCH_SIZE`] when the
    /// model has a dynamic first dimension, else 0. 0 turns batching off: each request runs
    /// alone, with its shape exactly as the model declares it. `auto`: probe at load (up to
    /// [`AUTO_LIMIT`]) and take the smallest size past which throughput gains less than 5%.
    pub max_batch_size: Option<MaxBatchSize>,
    /// Batch sizes the model may run, e.g. `[1, 4, 8]`: a batch is padded with zero rows up to
    /// the next one, and the padding is sliced off the outputs. Empty: any size, or with
    /// `session_per_batch_size`, the powers of two below `max_batch_size` and `max_batch_size`.
    pub allowed_batch_sizes: Vec<usize>,
    /// One ONNX Runtime session per allowed batch size, each warmed at load, so that no session
    /// sees its input shape change: on a GPU a shape change between calls costs most of the
    /// throughput. Absent: on for CUDA devices, off for the CPU.
    pub session_per_batch_size: Option<bool>,
    /// How ONNX Runtime uses a CUDA device (ignored on the CPU).
    pub cuda: CudaConfig,
    /// Run one batch of each size that will be used before the model reports ready.
    pub warmup: bool,
    /// Memory, in MiB, the model holds per device, for the memory ledger. Absent: what the
    /// backend estimates (a sim model's declared memory, an ONNX file's size).
    pub memory_mb: Option<u64>,
    /// Load at start in the `explicit` and `on_demand` control modes (in `none`, every model
    /// loads at start).
    pub preload: bool,
    /// The device the model loads on, by name (`cuda:1`, `cpu`, `sim:a`). Absent: the server's
    /// `assignment_strategy` decides.
    pub preferred_device: Option<String>,
    /// Variable-length inputs: requests whose dynamic non-batch dimensions differ share a batch,
    /// padded to the longest. Absent: only requests of equal shape share a batch.
    pub padding: Option<PaddingConfig>,
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
    /// Execution instances per device, each a thread with its own loaded copy of the model.
    pub instances: usize,
    /// How batches are formed.
    pub batching: BatchingConfig,
    /// Priority levels. A request's `priority` parameter picks one: 1 is the highest, and 0 or
    /// none means `default_priority_level`.
    pub priority_levels: usize,
    /// Level of requests that name no priority (default: the lowest, `priority_levels`).
    pub default_priority_level: Option<usize>,
    /// Timeout, in microseconds, of requests that give no `timeout` parameter; 0 means none.
    pub default_timeout_us: u64,
    /// What happens to a request whose timeout passes while it is queued.
    pub timeout_action: TimeoutActionConfig,
}

/// The `cuda` section: ONNX Runtime's CUDA provider options, under its own names.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CudaConfig {
    /// Most bytes each session's device memory arena may hold. Absent: no limit.
    pub gpu_mem_limit: Option<u64>,
    /// How the arena grows: `same_as_requested` (memory held stays close to what is used) or
    /// `next_power_of_two` (fewer, larger allocations).
    pub arena_extend_strategy: ArenaExtendConfig,
    /// How cuDNN picks convolution kernels, once per shape at warm-up: `exhaustive` (times
    /// every kernel: slowest load, fastest runs), `heuristic` or `default`.
    pub cudnn_conv_algo_search: ConvAlgoSearchConfig,
    /// Let float32 matrix products and convolutions use TF32 tensor cores: faster, with answers
    /// within about 2e-3 (relative) of float32.
    pub use_tf32: bool,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            gpu_mem_limit: None,
            arena_extend_strategy: ArenaExtendConfig::SameAsRequested,
            cudnn_conv_algo_search: ConvAlgoSearchConfig::Exhaustive,
            use_tf32: true,
        }
    }
}

impl CudaConfig {
    /// The options as backends take them.
    pub fn options(&self) -> sheaf_backend::CudaOptions {
        use sheaf_backend::{ArenaExtendStrategy, ConvAlgoSearch};
        sheaf_backend::CudaOptions {
            memory_limit_bytes: self.gpu_mem_limit,
            arena_extend_strategy: match self.arena_extend_strategy {
                ArenaExtendConfig::NextPowerOfTwo => ArenaExtendStrategy::NextPowerOfTwo,
                ArenaExtendConfig::SameAsRequested => ArenaExtendStrategy::SameAsRequested,
            },
            conv_algo_search: match self.cudnn_conv_algo_search {
                ConvAlgoSearchConfig::Exhaustive => ConvAlgoSearch::Exhaustive,
                ConvAlgoSearchConfig::Heuristic => ConvAlgoSearch::Heuristic,
                ConvAlgoSearchConfig::Default => ConvAlgoSearch::Default,
            },
            tf32: self.use_tf32,
        }
    }
}

/// `cuda.arena_extend_strategy` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArenaExtendConfig {
    NextPowerOfTwo,
    SameAsRequested,
}

/// `cuda.cudnn_conv_algo_search` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvAlgoSearchConfig {
    Exhaustive,
    Heuristic,
    Default,
}

/// `timeout_action` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutActionConfig {
    /// Answer with a timeout error at once (HTTP 504, gRPC DEADLINE_EXCEEDED).
    #[default]
    Reject,
    /// Keep the request, moved behind everything else (the lowest priority level).
    Delay,
}

/// How variable-length inputs are padded into one batch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaddingConfig {
    /// The value padded positions hold (in each input's type).
    pub value: f64,
    /// 0: any lengths share a batch. N: only lengths in the same N-wide bucket (1..=N,
    /// N+1..=2N, ...) share one, so little is wasted on padding.
    pub bucket_width: usize,
}

impl Default for PaddingConfig {
    fn default() -> Self {
        PaddingConfig {
            value: 0.0,
            bucket_width: 0,
        }
    }
}

/// Which batching policy a model uses, and its knobs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    pub policy: PolicyKind,
    /// `fixed` and `queue_depth`: batches smaller than this wait up to twice the delay for more.
    pub min_batch_size: usize,
    /// `latency_slo`: the latency objective per request, in milliseconds, from enqueue to answer.
    pub latency_slo_ms: u64,
    /// `queue_depth`: queue depth (items) from which the wait starts to shrink.
    pub adaptive_threshold: usize,
    /// `queue_depth`: the shortest wait, in microseconds.
    pub min_wait_us: u64,
    /// `queue_depth`: the longest wait, in microseconds (default: `max_queue_delay_us`).
    pub max_wait_us: Option<u64>,
}

/// The batching policies (see `batcher::policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Constant delay: `max_queue_delay_us`.
    Fixed,
    /// Delay shrinking with queue depth.
    QueueDepth,
    /// Learned cost curve and a latency objective.
    LatencySlo,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            policy: PolicyKind::LatencySlo,
            min_batch_size: 1,
            latency_slo_ms: 100,
            adaptive_threshold: 16,
            min_wait_us: 100,
            max_wait_us: None,
        }
    }
}

/// `max_batch_size` for a batchable model with no `max_batch_size` key.
pub const DEFAULT_MAX_BATCH_SIZE: usize = 32;
/// The largest batch `max_batch_size: auto` probes.
pub const AUTO_LIMIT: usize = 256;

/// `max_batch_size`: a number, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum MaxBatchSize {
    Size(usize),
    Auto(AutoWord),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoWord {
    Auto,
}

impl MaxBatchSize {
    pub fn is_auto(self) -> bool {
        matches!(self, MaxBatchSize::Auto(_))
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            max_batch_size: None,
            allowed_batch_sizes: Vec::new(),
            session_per_batch_size: None,
            cuda: CudaConfig::default(),
            warmup: true,
            preload: false,
            preferred_device: None,
            memory_mb: None,
            padding: None,
            max_queue_delay_us: 500,
            preferred_batch_sizes: Vec::new(),
            intra_op_threads: 1,
            max_queue_size: 4096,
            pipeline_depth: 2,
            instances: 1,
            batching: BatchingConfig::default(),
            priority_levels: 1,
            default_priority_level: None,
            default_timeout_us: 0,
            timeout_action: TimeoutActionConfig::Reject,
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
        if self.instances == 0 {
            return Err("instances must be at least 1".into());
        }
        if self.priority_levels == 0 {
            return Err("priority_levels must be at least 1".into());
        }
        if let Some(d) = self.default_priority_level {
            if d == 0 || d > self.priority_levels {
                return Err(format!(
                    "default_priority_level {d} is outside 1..={}",
                    self.priority_levels
                ));
            }
        }
        if self.batching.latency_slo_ms == 0 {
            return Err("batching.latency_slo_ms must be positive".into());
        }
        if self.allowed_batch_sizes.contains(&0) {
            return Err("allowed_batch_sizes must be positive".into());
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
        assert_eq!(c.max_batch_size, Some(MaxBatchSize::Size(8)));
        assert_eq!(c.max_queue_delay_us, 100);
        assert_eq!(c.preferred_batch_sizes, vec![4, 8]);
        assert_eq!(c.intra_op_threads, 2);
        assert_eq!(c.max_queue_size, ModelConfig::default().max_queue_size);
    }

    #[test]
    fn batching_section_is_read() {
        let c = ModelConfig::from_yaml(
            "instances: 2\nbatching:\n  policy: queue_depth\n  adaptive_threshold: 4\n  max_wait_us: 900\n",
        )
        .unwrap();
        assert_eq!(c.instances, 2);
        assert_eq!(c.batching.policy, PolicyKind::QueueDepth);
        assert_eq!(c.batching.adaptive_threshold, 4);
        assert_eq!(c.batching.max_wait_us, Some(900));
        assert_eq!(
            ModelConfig::default().batching.policy,
            PolicyKind::LatencySlo
        );
        let err = ModelConfig::from_yaml("batching:\n  policy: greedy\n").unwrap_err();
        assert!(err.contains("greedy"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let err = ModelConfig::from_yaml("max_batch_sise: 8\n").unwrap_err();
        assert!(err.contains("max_batch_sise"), "{err}");
        assert!(ModelConfig::from_yaml("intra_op_threads: 0\n").is_err());
        assert!(ModelConfig::from_yaml("max_batch_size: -1\n").is_err());
    }

    #[test]
    fn cuda_section_is_read_with_defaults_and_checked() {
        let c = ModelConfig::from_yaml(
            "session_per_batch_size: false\ncuda:\n  gpu_mem_limit: 2147483648\n  \
             cudnn_conv_algo_search: heuristic\n  use_tf32: false\n",
        )
        .unwrap();
        assert_eq!(c.session_per_batch_size, Some(false));
        let o = c.cuda.options();
        assert_eq!(o.memory_limit_bytes, Some(2 << 30));
        assert_eq!(o.conv_algo_search, sheaf_backend::ConvAlgoSearch::Heuristic);
        assert!(!o.tf32);
        assert_eq!(
            o.arena_extend_strategy,
            sheaf_backend::ArenaExtendStrategy::SameAsRequested
        );
        let d = ModelConfig::default();
        assert_eq!(d.session_per_batch_size, None);
        assert!(d.cuda.use_tf32);
        let err = ModelConfig::from_yaml("cuda:\n  cudnn_conv_algo_search: fastest\n").unwrap_err();
        assert!(err.contains("fastest"), "{err}");
        let err = ModelConfig::from_yaml("cuda:\n  gpu_mem_limt: 1\n").unwrap_err();
        assert!(err.contains("gpu_mem_limt"), "{err}");
    }
}
