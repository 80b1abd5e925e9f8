//! OpenAI request bodies, as the `openai` clients send them, turned into [`GenRequest`]s.

use serde::Deserialize;
use serde_json::Value;
use sheaf_llama::{GenRequest, Prompt, Sampling};

/// A string or a list of strings (`prompt`, `stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// The fields `/v1/completions` and `/v1/chat/completions` share. Unknown fields are accepted
/// and ignored, as OpenAI clients send many.
#[derive(Debug, Deserialize)]
pub struct Common {
    pub model: String,
    #[serde(default)]
    pub stream: bool,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<OneOrMany>,
    pub n: Option<usize>,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: OneOrMany,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<ChatMessage>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, or a list of parts of which the `text` ones are used.
    #[serde(default)]
    pub content: Value,
}

/// Default `max_tokens` of `/v1/completions`, as OpenAI's.
const COMPLETION_DEFAULT_TOKENS: usize = 16;

impl Common {
    /// The engine request for `prompt`; `default_tokens` when the body names no limit. A limit
    /// over the model's `context` (in tokens, prompt and completion together) can never be met,
    /// and is refused, as OpenAI does.
    pub fn request(
        &self,
        prompt: Prompt,
        default_tokens: usize,
        context: usize,
    ) -> Result<GenRequest, String> {
        if self.n.is_some_and(|n| n != 1) {
            return Err("n: only one choice per request is supported".into());
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(format!("temperature: {temperature} is not between 0 and 2"));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(format!("top_p: {top_p} is not in (0, 1]"));
        }
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or(default_tokens);
        if max_tokens == 0 {
            return Err("max_tokens: must be at least 1".into());
        }
        if max_tokens > context {
            return Err(format!(
                "max_tokens: {max_tokens} is more than this model's context of {context} tokens, \
                 which holds the prompt and the completion together"
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) if v.len() > 4 => {
                return Err("stop: at most 4 sequences".into())
            }
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        Ok(GenRequest {
            prompt,
            max_tokens,
            sampling: Sampling {
                temperature,
                top_p,
                seed: self.seed.unwrap_or(0) as u32,
            },
            stop,
        })
    }
}

impl CompletionRequest {
    /// `context`: the model's context length in tokens.
    pub fn into_request(self, context: usize) -> Result<(Common, GenRequest), String> {
        let mut prompts = self.prompt.into_vec();
        if prompts.len() != 1 {
            return Err("prompt: give one prompt per request".into());
        }
        let request = self.common.request(
            Prompt::Text(prompts.remove(0)),
            COMPLETION_DEFAULT_TOKENS.min(context),
            context,
        )?;
        Ok((self.common, request))
    }
}

impl ChatRequest {
    /// `context`: the model's context length in tokens, which is also the default limit (chat
    /// has no small default; the engine caps it at what the prompt leaves).
    pub fn into_request(self, context: usize) -> Result<(Common, GenRequest), String> {
        if self.messages.is_empty() {
            return Err("messages: at least one message is needed".into());
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.into_iter().enumerate() {
            let content = match m.content {
                Value::String(s) => s,
                Value::Null => String::new(),
                Value::Array(parts) => parts
                    .iter()
                    .filter(|p| p["type"] == "text")
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                other => {
                    return Err(format!(
                        "messages[{i}].content: expected a string or a list of parts, got {other}"
                    ))
                }
            };
            messages.push((m.role, content));
        }
        let request = self
            .common
            .request(Prompt::Chat(messages), context, context)?;
        Ok((self.common, request))
    }
}
