//! sheaf's generation engine: GGUF language models on llama.cpp, scheduled by sheaf.
//!
//! One [`Engine`] per model owns a thread that owns the llama.cpp model and context (a context
//! borrows its model and cannot be shared between threads). Requests reach it over a channel,
//! and their tokens come back over one channel per request. Each scheduler step is one `decode`
//! call over every active sequence: the next token of each running sequence, then prefill chunks
//! of new ones, within `max_batch_tokens` and `max_seqs` (continuous, iteration-level batching).
//! Sequences that finish leave at once and free their KV cache; waiting ones join at the next
//! step. The [`scheduler`] module explains the KV cache management: admission by free cells,
//! preemption of the newest sequence when cells run short, and kept prompt prefixes.

mod engine;
mod prefix;
mod request;
mod scheduler;
mod text;

pub use engine::{Engine, EngineConfig, EngineInfo, EngineStats};
pub use request::{
    Event, FinishReason, GenError, GenRequest, Prompt, Sampling, TokenLogprob, TokenProb, Usage,
    MAX_TOP_LOGPROBS,
};
