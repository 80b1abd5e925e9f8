//! What a generation request asks for, and what comes back.

use std::time::Duration;

/// The text to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text, tokenized as it is (special tokens such as `<|im_start|>` are parsed).
    Text(String),
    /// Chat messages `(role, content)`, rendered with the model's own chat template.
    Chat(Vec<(String, String)>),
}

/// How the next token is picked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (always the most likely token).
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum to `top_p`.
    pub top_p: f32,
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub prompt: Prompt,
    /// Most tokens to generate; clipped to what the context leaves after the prompt.
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Generation stops before any of these strings, which are not returned.
    pub stop: Vec<String>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` (or the context) was reached.
    Length,
}

impl FinishReason {
    /// The OpenAI name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts and timings of a finished sequence.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Time from submission to the first generated token.
    pub time_to_first_token: Duration,
    /// Time from submission to the end.
    pub total: Duration,
}

/// What a request's channel carries, in order: text pieces, then one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Newly generated text (whole UTF-8 characters, stop strings held back).
    Text(String),
    Done(FinishReason, Usage),
    Error(GenError),
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenError {
    /// The prompt does not leave room for one generated token in the context.
    #[error("the prompt is {tokens} tokens; this model's context holds {limit} tokens, prompt and completion together")]
    PromptTooLong { tokens: usize, limit: usize },
    #[error("{0}")]
    Invalid(String),
    /// Too many requests are waiting.
    #[error("{0}")]
    Overloaded(String),
    /// The engine stopped or failed.
    #[error("{0}")]
    Internal(String),
}
