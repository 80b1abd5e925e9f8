//! The contract of a generation engine: what the scheduler asks of a loaded language model, and
//! what the engine reports.

use std::sync::atomic::{AtomicU64, AtomicUsize};

use super::{Event, GenError, GenRequest, Prompt, Rendering};

/// Where one choice's events go, in order (see [`Event`]). The engine drops it after `Done` or
/// `Error`.
pub trait EventSink: Send {
    /// Passes one event on; false once nobody listens.
    fn send(&self, event: Event) -> bool;
    /// Whether nobody listens any more (the client went away): the engine frees the sequence.
    fn is_closed(&self) -> bool;
}

/// How a generation engine is sized: the `generation` section of a model's config, every key
/// optional.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenerationSpec {
    /// Tokens the KV cache holds, over all sequences.
    pub n_ctx: u32,
    /// Sequences decoded together at most.
    pub max_seqs: u32,
    /// Tokens in one decode call at most (running sequences' next tokens plus prefill chunks).
    pub max_batch_tokens: u32,
    /// Requests waiting for a slot at most; more are refused at once (503).
    pub max_waiting: usize,
    /// Finished prompts kept in the KV cache for reuse by prompts that start the same way.
    pub prefix_slots: u32,
    /// CPU threads. Absent: every core.
    pub threads: Option<usize>,
    /// Layers offloaded to the GPU when the model is placed on `cuda:N`. Absent: all of them.
    /// On the CPU none are.
    pub gpu_layers: Option<u32>,
}

impl GenerationSpec {
    /// Checks that every size is at least 1.
    pub fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("n_ctx", self.n_ctx as usize),
            ("max_seqs", self.max_seqs as usize),
            ("max_batch_tokens", self.max_batch_tokens as usize),
            ("max_waiting", self.max_waiting),
            ("threads", self.threads.unwrap_or(1)),
        ] {
            if value == 0 {
                return Err(format!("generation.{key} must be at least 1"));
            }
        }
        Ok(())
    }
}

impl Default for GenerationSpec {
    fn default() -> Self {
        GenerationSpec {
            n_ctx: 8192,
            max_seqs: 16,
            max_batch_tokens: 512,
            max_waiting: 256,
            prefix_slots: 8,
            threads: None,
            gpu_layers: None,
        }
    }
}

/// What an engine reports about its model once loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratorInfo {
    /// Longest prompt plus completion of one request, in tokens.
    pub context_length: usize,
    pub n_params: u64,
    /// The weights, in bytes.
    pub size_bytes: u64,
    /// The KV cache, in bytes.
    pub kv_cache_bytes: u64,
    /// Most choices of one request (OpenAI's `n`): the sequences decoded together.
    pub max_choices: usize,
    /// Most requests queued at once; more are refused as overload.
    pub max_waiting: usize,
}

impl GeneratorInfo {
    /// What the engine holds: weights and KV cache.
    pub fn memory_bytes(&self) -> u64 {
        self.size_bytes + self.kv_cache_bytes
    }
}

/// Live counters of an engine, readable from any thread.
#[derive(Debug, Default)]
pub struct GeneratorStats {
    /// Sequences being decoded now.
    pub running: AtomicUsize,
    /// Requests waiting for a slot or for KV room.
    pub waiting: AtomicUsize,
    /// KV cells in use (running sequences and kept prefixes).
    pub kv_used: AtomicUsize,
    /// KV cells in all.
    pub kv_capacity: AtomicUsize,
    /// Running sequences pushed out to make KV room (recomputed later).
    pub preemptions: AtomicU64,
    /// Admissions that looked for a cached prefix, and those that found one.
    pub prefix_lookups: AtomicU64,
    pub prefix_hits: AtomicU64,
    /// Prompt tokens whose prefill a cached prefix saved.
    pub prefix_tokens_reused: AtomicU64,
    /// `decode` calls so far, and the time they took.
    pub steps: AtomicU64,
    pub decode_ns: AtomicU64,
    /// Tokens sampled so far, over all sequences.
    pub generated_tokens: AtomicU64,
    /// Prompt tokens decoded so far.
    pub prompt_tokens: AtomicU64,
    /// Requests answered with a timeout while they waited.
    pub timeouts: AtomicU64,
}

/// A loaded language model: an engine that batches the sequences of many requests.
pub trait Generator: Send + Sync {
    fn info(&self) -> &GeneratorInfo;

    fn stats(&self) -> &GeneratorStats;

    /// Checks `request` (its prompt rendered and tokenised, its length and format) and queues
    /// one choice of it per sink. An `Err` comes at once and nothing is queued; errors met
    /// later come as the sinks' last event.
    fn submit(&self, request: GenRequest, sinks: Vec<Box<dyn EventSink>>) -> Result<(), GenError>;

    /// The token ids of `prompt` rendered as `rendering` says, as a generation request would
    /// feed them.
    fn tokenize(&self, prompt: &Prompt, rendering: Rendering) -> Result<Vec<i32>, GenError>;

    /// The text of `tokens`; an id outside the vocabulary is refused.
    fn detokenize(&self, tokens: &[i32]) -> Result<String, GenError>;

    /// Choices queued or running.
    fn pending(&self) -> usize;
}
