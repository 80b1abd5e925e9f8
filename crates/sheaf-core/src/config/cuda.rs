//! How ONNX Runtime uses a CUDA device: the `cuda` section of a model's configuration.

use serde::Deserialize;

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

/// `graph_optimization` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GraphOptimizationConfig {
    Disabled,
    Basic,
    Extended,
    #[default]
    All,
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
