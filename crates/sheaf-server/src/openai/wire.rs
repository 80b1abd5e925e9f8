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

/// The fields `/v1/completions` and `/v1/chat/completions` share. Every other field is in
/// `rest`, where [`check_rest`] lets through only those that ask for nothing sheaf would have to
/// do, and refuses the others by name: nothing a client asks for is silently dropped.
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
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

/// Refuses, by name, each field of `rest` that asks for something sheaf does not do. Accepted:
/// the caller's bookkeeping (`user`, `metadata`, `store`, `service_tier`), and the fields that
/// clients fill with their default, when they carry it (`logprobs: false`,
/// `presence_penalty: 0`, `tools: []`, `response_format: {"type": "text"}`…).
pub fn check_rest(rest: &serde_json::Map<String, Value>) -> Result<(), String> {
    let none = |v: &Value| v.is_null();
    let off = |v: &Value| none(v) || *v == Value::Bool(false);
    let zero = |v: &Value| none(v) || v.as_f64() == Some(0.0);
    let empty = |v: &Value| {
        none(v)
            || v.as_object().is_some_and(|o| o.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty())
    };
    for (key, value) in rest {
        let inert = match key.as_str() {
            "user" | "metadata" | "store" | "service_tier" | "prompt_cache_key"
            | "safety_identifier" => true,
            "logprobs" | "echo" | "parallel_tool_calls" => off(value),
            "top_logprobs" | "suffix" => none(value),
            "presence_penalty" | "frequency_penalty" => zero(value),
            "repetition_penalty" => none(value) || value.as_f64() == Some(1.0),
            "best_of" => none(value) || value.as_u64() == Some(1),
            "logit_bias" | "tools" | "functions" => empty(value),
            // With no tools there is nothing to call.
            "tool_choice" | "function_call" => {
                none(value) || value == "none" || (value == "auto" && empty_tools(rest))
            }
            "response_format" => none(value) || value["type"] == "text",
            _ => false,
        };
        if !inert {
            return Err(format!(
                "{key}: not supported by sheaf (value {}); leave it out",
                sheaf_core::clip(&value.to_string())
            ));
        }
    }
    Ok(())
}

fn empty_tools(rest: &serde_json::Map<String, Value>) -> bool {
    rest.get("tools")
        .is_none_or(|t| t.is_null() || t.as_array().is_some_and(|a| a.is_empty()))
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
        check_rest(&self.rest)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(extra: Value) -> Result<(Common, GenRequest), String> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value::<ChatRequest>(body)
            .map_err(|e| e.to_string())?
            .into_request(4096)
    }

    #[test]
    fn fields_asking_for_nothing_pass_and_the_others_are_named() {
        for inert in [
            json!({"user": "u1", "metadata": {"a": "b"}, "store": false}),
            json!({"logprobs": false, "presence_penalty": 0, "frequency_penalty": 0.0}),
            json!({"tools": [], "tool_choice": "auto", "logit_bias": {}}),
            json!({"response_format": {"type": "text"}, "top_logprobs": null}),
        ] {
            assert!(chat(inert.clone()).is_ok(), "{inert}");
        }
        for (asked, name) in [
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (json!({"tools": [{"type": "function"}]}), "tools"),
            (json!({"logprobs": true}), "logprobs"),
            (json!({"presence_penalty": 0.5}), "presence_penalty"),
            (json!({"logit_bias": {"1": 5}}), "logit_bias"),
            (json!({"top_k": 5}), "top_k"),
            (json!({"min_p": 0.1}), "min_p"),
            (json!({"max_token": 5}), "max_token"),
        ] {
            let e = chat(asked.clone()).unwrap_err();
            assert!(
                e.starts_with(&format!("{name}: not supported")),
                "{asked}: {e}"
            );
        }
    }
}
