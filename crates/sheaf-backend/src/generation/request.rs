//! What a generation request asks for, and what comes back.

use std::time::{Duration, Instant};

/// The text to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text, tokenized as it is (special tokens such as `<|im_start|>` are parsed).
    Text(String),
    /// Chat messages `(role, content)`, rendered with the model's own chat template.
    Chat(Vec<(String, String)>),
    /// Token ids, fed as they are (each must be in the model's vocabulary).
    Tokens(Vec<i32>),
}

/// How a prompt becomes tokens beyond its content: vLLM's chat-template fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rendering {
    /// Add the special tokens the model's tokenizer adds to a text (its start token, where it
    /// has one); `None`: yes for a text, no for a chat, whose template writes its own (vLLM's
    /// `add_special_tokens` and its defaults). Token ids are fed as they are.
    pub special: Option<bool>,
    /// How a chat's rendering ends.
    pub turn: Turn,
}

/// How a chat's rendering ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Turn {
    /// With the template's opening of the assistant's answer (vLLM's default
    /// `add_generation_prompt: true`).
    #[default]
    Open,
    /// With the messages alone (`add_generation_prompt: false`).
    Closed,
    /// With the final message left open, so that the answer continues it
    /// (`continue_final_message: true`): an assistant's reply begun by the client.
    Continue,
}

/// How the next token is picked. Logit biases and penalties apply first, then (unless the
/// temperature is 0, which is greedy) top-k, top-p, min-p and the temperature.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (always the most likely token).
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum to `top_p`.
    pub top_p: f32,
    pub seed: u32,
    /// Keep only the `top_k` most likely tokens; `None` keeps all.
    pub top_k: Option<u32>,
    /// Keep only tokens at least `min_p` times as likely as the most likely one; `None` keeps
    /// all.
    pub min_p: Option<f32>,
    /// Subtracted from the logit of every token already generated (OpenAI's, -2 to 2).
    pub presence_penalty: f32,
    /// Subtracted once per time a token was already generated (OpenAI's, -2 to 2).
    pub frequency_penalty: f32,
    /// Divides the logits of tokens already generated (1 is none; as vLLM's and llama.cpp's).
    pub repetition_penalty: f32,
    /// Added to the logits of these token ids (OpenAI's `logit_bias`, -100 to 100).
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            seed: 0,
            top_k: None,
            min_p: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

impl Sampling {
    /// The temperatures a request may ask for: 0 (greedy) to 2, as OpenAI's API takes them.
    pub const TEMPERATURES: std::ops::RangeInclusive<f32> = 0.0..=2.0;

    /// True when any penalty is asked for.
    pub fn penalizes(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub prompt: Prompt,
    /// How `prompt` is rendered and tokenized.
    pub rendering: Rendering,
    /// Most tokens to generate; clipped to what the context leaves after the prompt. 0 reads
    /// the prompt and generates nothing (for its log-probabilities).
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Generation stops at any of these strings, which are not returned unless `include_stop`.
    pub stop: Vec<String>,
    /// Generation stops at any of these token ids (vLLM's `stop_token_ids`), whose text is not
    /// returned, as an end-of-generation token's is not.
    pub stop_tokens: Vec<i32>,
    /// Return the stop string that ended the answer with it (vLLM's
    /// `include_stop_str_in_output`).
    pub include_stop: bool,
    /// Neither an end-of-generation token nor a stop token can be picked, nor a stop string
    /// end the answer, before this many tokens are generated (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// End-of-generation tokens are never picked: the answer runs to `max_tokens` or a stop
    /// (vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// Render special tokens (such as `<|im_start|>`) in the text; false leaves them out, as
    /// vLLM's default `skip_special_tokens: true` does.
    pub special_tokens: bool,
    /// Report each generated token's log-probability, with this many most likely alternatives
    /// (0 to [`MAX_TOP_LOGPROBS`]); `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability given the tokens before it, with this many
    /// most likely alternatives, in one [`Event::PromptLogprobs`] before any generated text;
    /// `None`: none. Such a prompt is read whole (no kept prefix stands in for its start).
    pub prompt_logprobs: Option<usize>,
    /// Constrain the answer to a format (OpenAI's `response_format`); `None`: free text.
    pub format: Option<Format>,
    /// Queue level: 0 is admitted first. Requests of one level are admitted in arrival order.
    pub priority: usize,
    /// A request still waiting for a sequence slot at this instant is answered with
    /// [`GenError::Timeout`]; once admitted it runs to its end.
    pub deadline: Option<Instant>,
}

impl GenRequest {
    /// A request for `prompt`, rendered as vLLM does by default, with default sampling, no stops, no least length, no
    /// log-probabilities, no format, the highest priority and no deadline.
    pub fn new(prompt: Prompt, max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt,
            rendering: Rendering::default(),
            max_tokens,
            sampling: Sampling::default(),
            stop: Vec::new(),
            stop_tokens: Vec::new(),
            include_stop: false,
            min_tokens: 0,
            ignore_eos: false,
            special_tokens: false,
            logprobs: None,
            prompt_logprobs: None,
            format: None,
            priority: 0,
            deadline: None,
        }
    }
}

/// A format the answer must follow, enforced while sampling by a llama.cpp grammar: only tokens
/// that keep the answer a prefix of a valid one can be picked, and the end of generation only
/// where it is complete.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A JSON value that validates against this JSON schema (OpenAI's `json_schema`).
    JsonSchema(String),
    /// Text that matches this regular expression, whole (vLLM's `guided_regex`).
    Regex(String),
    /// One of these strings, exactly (vLLM's `guided_choice`).
    Choice(Vec<String>),
    /// Text of this grammar, in llama.cpp's notation (GBNF) from its rule `root` (vLLM's
    /// `guided_grammar`).
    Grammar(String),
    /// A call to one of the request's functions, whose JSON value validates against `schema`,
    /// written in its tags (`<tool_call>` … `</tool_call>`). Forced, it is the whole answer.
    /// Otherwise the answer is free text until the model opens a call: from there, the call,
    /// its closing tag, and nothing more. With `parallel`, more calls may follow the first,
    /// each in its tags, and then nothing more.
    ToolCall {
        schema: String,
        forced: bool,
        parallel: bool,
    },
}

/// Most alternatives per token a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One token and its log-probability under the model (its raw distribution, before the
/// request's penalties, biases, top-k/p and temperature), as OpenAI reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenProb {
    pub token: i32,
    /// The token's text as bytes (a piece of a character for some tokens).
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A token's log-probability, and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub chosen: TokenProb,
    /// The chosen token's place among all tokens by likelihood: 1 is the most likely.
    pub rank: usize,
    /// Most likely first.
    pub top: Vec<TokenProb>,
}

/// A prompt's tokens with their log-probabilities, each given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobs {
    /// The first token's id and bytes: nothing comes before it to give it a probability.
    pub first: (i32, Vec<u8>),
    /// Every later token's log-probability, in order.
    pub rest: Vec<TokenLogprob>,
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (`None`), or one of the request's stops.
    Stop(Option<StopBy>),
    /// `max_tokens` (or the context) was reached.
    Length,
    /// The answer is a tool call. The engine never ends a sequence so; whoever reads the calls
    /// out of the answer ([`super::ToolAnswer`]) reports it.
    ToolCalls,
}

impl FinishReason {
    /// The OpenAI name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop(_) => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Which of a request's stops ended its answer (vLLM's `stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopBy {
    /// The stop string at this place in [`GenRequest::stop`].
    String(usize),
    /// This token of [`GenRequest::stop_tokens`].
    Token(i32),
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

/// What a request's channel carries, in order: text pieces (each token's log-probability
/// before the text it adds, when asked for), then one `Done` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Newly generated text (whole UTF-8 characters, stop strings held back).
    Text(String),
    /// One generated token's log-probability (its text comes in a later `Text`, which may hold
    /// several tokens). The end-of-generation token has none.
    Logprob(TokenLogprob),
    /// The prompt's tokens and their log-probabilities, when asked for: once, first.
    PromptLogprobs(PromptLogprobs),
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
    /// The request's deadline passed while it waited for a slot.
    #[error("{0}")]
    Timeout(String),
    /// The engine stopped or failed.
    #[error("{0}")]
    Internal(String),
}
