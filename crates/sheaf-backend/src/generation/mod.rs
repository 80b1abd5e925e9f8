//! The generation contract: language models that continue text, one token at a time, for many
//! requests at once.
//!
//! A [`Backend`](crate::Backend) whose models generate loads a [`Generator`]: an engine that
//! schedules the sequences of every request itself (continuous batching), since its batches
//! change at every token. The scheduler hands it a [`GenRequest`] and one [`EventSink`] per
//! choice, and the text comes back as [`Event`]s. [`Tools`] is how a request's functions are
//! shown to a model and how its calls are read back out of the answer.

mod generator;
mod request;
mod tools;

pub use generator::{EventSink, GenerationSpec, Generator, GeneratorInfo, GeneratorStats};
pub use request::{
    Event, FinishReason, Format, GenError, GenRequest, Prompt, PromptLogprobs, Rendering, Sampling,
    StopBy, TokenLogprob, TokenProb, Turn, Usage, MAX_TOP_LOGPROBS,
};
pub use tools::{
    call_text, response_text, Tool, ToolAnswer, ToolCall, ToolChoice, Tools, CALL_CLOSE, CALL_OPEN,
};
