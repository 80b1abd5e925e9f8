//! sheaf's generation engine: GGUF language models on llama.cpp, scheduled by sheaf, behind
//! the [`sheaf_backend::generation`] contract ([`GgufBackend`] loads an [`Engine`]).
//!
//! One [`Engine`] per model owns a thread that owns the llama.cpp context (a context borrows
//! its model and cannot be shared between threads). The handle renders, tokenises and checks
//! each request on the caller's thread ([`prompt`]), so a bad one fails before it is queued;
//! checked requests reach the thread over a bounded channel, and each choice's text goes back
//! through its [`EventSink`](sheaf_backend::generation::EventSink). Each scheduler step is one
//! `decode` call over every active sequence: the next token of each running sequence, then
//! prefill chunks of new ones, within `max_batch_tokens` and `max_seqs` (continuous,
//! iteration-level batching). Sequences that finish leave at once and free their KV cache;
//! waiting ones join at the next step, by priority level, and those whose deadline passes while
//! they wait are answered with a timeout. The [`scheduler`] module explains the KV cache
//! management: admission by free cells, preemption of the newest sequence when cells run short,
//! kept prompt prefixes, and the choices of one request (OpenAI's `n`) sharing their prompt's
//! cells. A request may also ask for each token's log-probability ([`logprobs`]) and for a
//! format that a grammar enforces while sampling ([`grammar`]), such as a call to one of the
//! request's functions, a choice of strings or a regular expression ([`gbnf`]), and for where
//! its answer ends: stop strings and tokens, at least `min_tokens`, or no end-of-generation
//! token at all. How a prompt is rendered (the assistant's turn opened, left closed, or a final
//! message left open for the answer to continue) and which stop ended an answer come with the
//! request and its end.

mod backend;
mod engine;
mod gbnf;
mod grammar;
mod job;
mod logprobs;
mod prefix;
mod prompt;
mod scheduler;
mod text;

pub use backend::{GgufBackend, PLATFORM};
pub use engine::Engine;
