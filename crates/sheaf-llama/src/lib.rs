//! sheaf's generation engine: GGUF language models on llama.cpp, scheduled by sheaf.
//!
//! One [`Engine`] per model owns a thread that owns the llama.cpp model and context (a context
//! borrows its model and cannot be shared between threads). Requests reach it over a channel,
//! and their tokens come back over one channel per request. Each scheduler step is one `decode`
//! call over every active sequence: the next token of each running sequence, then prefill chunks
//! of new ones, within `max_batch_tokens` and `max_seqs` (continuous, iteration-level batching).
//! Sequences that finish leave at once and free their KV cache; waiting ones join at the next
//! step. The [`scheduler`] module explains the KV cache management: admission by free cells,
//! preemption of the newest sequence when cells run short, kept prompt prefixes, and the choices
//! of one request (OpenAI's `n`) sharing their prompt's cells. A request may also ask for each
//! token's log-probability ([`logprobs`]) and for a format that a grammar enforces while
//! sampling ([`grammar`]), such as a call to one of the request's functions ([`tools`]).

mod engine;
mod grammar;
mod logprobs;
mod prefix;
mod request;
mod scheduler;
mod text;
mod tools;

pub use engine::{Engine, EngineConfig, EngineInfo, EngineStats};
pub use request::{
    Event, FinishReason, Format, GenError, GenRequest, Prompt, Sampling, TokenLogprob, TokenProb,
    Usage, MAX_TOP_LOGPROBS,
};
pub use tools::{call_text, response_text, Tool, ToolAnswer, ToolCall, ToolChoice, Tools};
