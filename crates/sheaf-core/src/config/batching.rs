//! How a model's requests are batched and queued: `max_batch_size` (a size, or `auto`), the
//! `batching` policy, padding to fixed shapes, and the priority levels' queue policies.

use serde::Deserialize;

/// One priority level's queue policy (a `priority_queue_policy` entry): what it sets instead of
/// the model's `timeout_action`, `default_timeout_us` and `max_queue_size` (then counted for
/// that level's items alone, within the model's bound).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct LevelQueuePolicy {
    pub timeout_action: Option<TimeoutActionConfig>,
    pub default_timeout_us: Option<u64>,
    pub max_queue_size: Option<usize>,
    pub allow_timeout_override: Option<bool>,
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
    /// Most positions one batch may hold, padding included: items times the longest item's
    /// length (for a text encoder, tokens). 0: no limit beyond `max_batch_size`. A single item
    /// longer than this still runs, alone.
    pub max_batch_tokens: usize,
}

impl Default for PaddingConfig {
    fn default() -> Self {
        PaddingConfig {
            value: 0.0,
            bucket_width: 0,
            max_batch_tokens: 0,
        }
    }
}

impl PaddingConfig {
    /// What an `embedding` model without a `padding` section gets: pad with 0 (the pad id,
    /// mask and segment of BERT-style encoders), batch texts of similar length together
    /// (16-token buckets), and at most 16,384 tokens per batch.
    pub fn for_embeddings() -> PaddingConfig {
        PaddingConfig {
            value: 0.0,
            bucket_width: 16,
            max_batch_tokens: 16384,
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
