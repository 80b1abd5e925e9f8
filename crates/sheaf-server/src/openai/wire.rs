//! OpenAI request bodies, as the `openai` clients send them, turned into [`GenRequest`]s.

use serde::Deserialize;
use serde_json::Value;
use sheaf_backend::generation::{
    call_text, response_text, Format, GenRequest, Prompt, Rendering, Sampling, Tool, ToolChoice,
    Tools, MAX_TOP_LOGPROBS,
};
use sheaf_core::Generate;

/// A string or a list of strings (`stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
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
    /// vLLM's: -1 or 0 keep every token.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string, as OpenAI's) to a bias from -100 to 100.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// Chat: `true` for each token's log-probability. Completions: how many alternatives (0 to
    /// 5) to give with each token's log-probability.
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (0 to 20), with `logprobs: true`.
    pub top_logprobs: Option<Value>,
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
    /// {"name", "schema", "strict"}}`.
    pub response_format: Option<Value>,
    /// Chat: the functions the model may call, `[{"type": "function", "function": {"name",
    /// "description", "parameters"}}]`.
    pub tools: Option<Value>,
    /// `none`, `auto` (the default), `required`, or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    /// sheaf's: the queue level, 1 the highest, up to the model's `priority_levels`; 0 or none:
    /// the model's `default_priority_level`.
    pub priority: Option<u64>,
    /// sheaf's: seconds the request may wait for a sequence slot before it is answered with a
    /// timeout (504); none: the model's `default_timeout_us`.
    pub timeout: Option<f64>,
    /// vLLM's guided decoding and answer ends.
    #[serde(flatten)]
    pub vllm: super::vllm::Extras,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

/// Refuses, by name, each field of `rest` that asks for something sheaf does not do. Accepted:
/// the caller's bookkeeping (`user`, `metadata`, `store`, `service_tier`), and the fields that
/// clients fill with their default, when they carry it (`echo: false`, `functions: []`…),
/// `parallel_tool_calls` (read by [`Common::tools`]) and `guided_decoding_backend` (a library
/// name).
pub fn check_rest(rest: &serde_json::Map<String, Value>) -> Result<(), String> {
    let none = |v: &Value| v.is_null();
    let off = |v: &Value| none(v) || *v == Value::Bool(false);
    let empty = |v: &Value| {
        none(v)
            || v.as_object().is_some_and(|o| o.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty())
    };
    for (key, value) in rest {
        let inert = match key.as_str() {
            "user" | "metadata" | "store" | "service_tier" | "prompt_cache_key"
            | "safety_identifier" => true,
            "echo" => off(value),
            // Whether several calls may be made in one answer: read by `tools`.
            "parallel_tool_calls" => none(value) || value.is_boolean(),
            "suffix" => none(value),
            // Which library vLLM guides decoding with: sheaf's llama.cpp grammars give the
            // answer the same format, whichever is named.
            "guided_decoding_backend" => none(value) || value.is_string(),
            "best_of" => none(value) || value.as_u64() == Some(1),
            // The deprecated form of `tools`: with no functions there is nothing to call.
            "functions" => empty(value),
            "function_call" => {
                none(value)
                    || value == "none"
                    || (value == "auto" && rest.get("functions").is_none_or(empty))
            }
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

/// What a stream carries besides the answer; another field is refused by name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM's usage in every chunk (each its choice's tokens so far), as vLLM only with
    /// `include_usage`.
    #[serde(default)]
    pub continuous_usage_stats: bool,
    /// OpenAI's padding of chunks to hide their sizes: only `false`.
    #[serde(default)]
    pub include_obfuscation: bool,
}

/// A completion's prompts: a text or token ids, or a list of either, each answered with its own
/// choices.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a text, a list of texts, a list of token ids, or a list of token-id lists"
)]
pub enum CompletionPrompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// Most prompts in one completion request.
pub const MAX_PROMPTS: usize = 256;

impl CompletionPrompt {
    fn into_prompts(self) -> Result<Vec<Prompt>, String> {
        let count = |n: usize| match n {
            0 => Err("prompt: the list of prompts is empty".to_string()),
            n if n > MAX_PROMPTS => Err(format!(
                "prompt: {n} prompts; at most {MAX_PROMPTS} in one request"
            )),
            _ => Ok(()),
        };
        let ids = |tokens: Vec<i64>| {
            if tokens.is_empty() {
                return Err("prompt: a token list is empty".to_string());
            }
            tokens
                .into_iter()
                .map(|t| i32::try_from(t).map_err(|_| format!("prompt: {t} is not a token id")))
                .collect::<Result<Vec<i32>, String>>()
                .map(Prompt::Tokens)
        };
        match self {
            CompletionPrompt::Text(text) => Ok(vec![Prompt::Text(text)]),
            CompletionPrompt::Texts(texts) => {
                count(texts.len())?;
                Ok(texts.into_iter().map(Prompt::Text).collect())
            }
            CompletionPrompt::Tokens(tokens) => Ok(vec![ids(tokens)?]),
            CompletionPrompt::TokenLists(lists) => {
                count(lists.len())?;
                lists.into_iter().map(ids).collect()
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: CompletionPrompt,
    /// The prompt comes back before the completion, in the text and, with `logprobs`, with
    /// each of its tokens' log-probabilities.
    pub echo: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<ChatMessage>,
    /// vLLM's: a final assistant message leads each choice's answer (with
    /// `continue_final_message`, the whole reply, begun by the client and ended by the model).
    pub echo: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, or a list of parts: `text` ones (and an assistant's `refusal` ones).
    #[serde(default)]
    pub content: Value,
    /// An assistant's calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    #[serde(default)]
    pub tool_calls: Value,
    /// A tool's message: the id of the call it answers.
    #[serde(default)]
    pub tool_call_id: Value,
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
        if self.n == Some(0) {
            return Err("n: at least one choice".into());
        }
        if self.stream_options.is_some() && !self.stream {
            return Err("stream_options: only with stream: true".into());
        }
        if self
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_obfuscation)
        {
            return Err(
                "stream_options.include_obfuscation: not supported by sheaf (chunks \
                        are not padded); leave it out or set it to false"
                    .into(),
            );
        }
        check_rest(&self.rest)?;
        let temperature = self.temperature.unwrap_or(1.0);
        if !Sampling::TEMPERATURES.contains(&temperature) {
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
        let mut request = GenRequest {
            sampling: self.sampling(temperature, top_p)?,
            stop,
            format: self.format()?.map(|(format, _)| format),
            ..GenRequest::new(prompt, max_tokens)
        };
        self.vllm.apply(&mut request)?;
        Ok(request)
    }

    /// Refuses a request for nothing (no tokens, with neither `echo` nor `prompt_logprobs` to
    /// read the prompt for), and vLLM's `prompt_logprobs` with `stream: true`: they come whole,
    /// with the answer. An echoed prompt's log-probabilities stream, in its chunk.
    fn check_prompt_reads(&self, request: &GenRequest, echo: bool) -> Result<(), String> {
        if request.max_tokens == 0 && !echo && request.prompt_logprobs.is_none() {
            return Err(
                "max_tokens: must be at least 1 (0 reads the prompt alone, for `echo` \
                        or `prompt_logprobs`)"
                    .into(),
            );
        }
        if self.stream && self.vllm.prompt_logprobs.is_some() {
            return Err(
                "prompt_logprobs: not with stream: true; they come with a whole answer".into(),
            );
        }
        Ok(())
    }

    /// `request` with its choices and queue place.
    fn generate(&self, request: GenRequest) -> Result<Generate, String> {
        let timeout_us = match self.timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => Some((t * 1e6).ceil() as u64),
            Some(t) => {
                return Err(format!(
                    "timeout: {t} is not a number of seconds in (0, 86400]"
                ))
            }
        };
        Ok(Generate {
            request,
            choices: self.n.unwrap_or(1),
            priority: self.priority,
            timeout_us,
        })
    }

    /// The format `response_format` or vLLM's guided decoding asks for, and the field that
    /// asks; none: free text. Both at once are refused.
    fn format(&self) -> Result<Option<super::vllm::Guided>, String> {
        match (self.response_format()?, self.vllm.format()?) {
            (Some(_), Some((_, field))) => Err(format!(
                "{field}: cannot be combined with response_format; ask for one format"
            )),
            (asked, guided) => Ok(asked.map(|f| (f, "response_format")).or(guided)),
        }
    }

    /// The format `response_format` asks for; none: free text.
    fn response_format(&self) -> Result<Option<Format>, String> {
        let Some(value) = self.response_format.as_ref().filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        match value["type"].as_str() {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(Format::JsonObject)),
            Some("json_schema") => match &value["json_schema"]["schema"] {
                schema @ Value::Object(_) => Ok(Some(Format::JsonSchema(schema.to_string()))),
                Value::Null => Err("response_format.json_schema.schema: missing".into()),
                other => Err(format!(
                    "response_format.json_schema.schema: {} is not a JSON schema object",
                    sheaf_core::clip(&other.to_string())
                )),
            },
            _ => Err(format!(
                "response_format: type {} is none of 'text', 'json_object', 'json_schema'",
                sheaf_core::clip(&value["type"].to_string())
            )),
        }
    }

    /// The functions the model may call and the choice among them; `None` when there are none
    /// or `tool_choice` is `none`.
    pub fn tools(&self) -> Result<Option<Tools>, String> {
        let list = match self.tools.as_ref().filter(|v| !v.is_null()) {
            None => &Vec::new(),
            Some(Value::Array(list)) => list,
            Some(other) => {
                return Err(format!(
                    "tools: expected a list of functions, got {}",
                    sheaf_core::clip(&other.to_string())
                ))
            }
        };
        let choice = match self.tool_choice.as_ref().filter(|v| !v.is_null()) {
            None => ToolChoice::Auto,
            Some(v) if v == "none" => return Ok(None),
            Some(v) if v == "auto" => ToolChoice::Auto,
            Some(v) if v == "required" => ToolChoice::Required,
            Some(v) if v["type"] == "function" && v["function"]["name"].is_string() => {
                ToolChoice::Named(v["function"]["name"].as_str().unwrap_or_default().into())
            }
            Some(other) => {
                return Err(format!(
                    "tool_choice: {} is none of 'none', 'auto', 'required' and \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                    sheaf_core::clip(&other.to_string())
                ))
            }
        };
        if list.is_empty() {
            return match choice {
                ToolChoice::Auto => Ok(None),
                _ => Err("tool_choice: asks for a call, but tools lists no function".into()),
            };
        }
        let mut tools = Vec::with_capacity(list.len());
        for (i, entry) in list.iter().enumerate() {
            if entry["type"] != "function" {
                return Err(format!(
                    "tools[{i}].type: {} is not 'function', the one kind of tool sheaf calls",
                    sheaf_core::clip(&entry["type"].to_string())
                ));
            }
            let function = &entry["function"];
            let Some(name) = function["name"].as_str() else {
                return Err(format!("tools[{i}].function.name: missing"));
            };
            let description = match &function["description"] {
                Value::Null => None,
                Value::String(d) => Some(d.clone()),
                _ => return Err(format!("tools[{i}].function.description: not a string")),
            };
            let parameters = match &function["parameters"] {
                Value::Null => serde_json::json!({"type": "object", "properties": {}}),
                p => p.clone(),
            };
            tools.push(Tool {
                name: name.to_string(),
                description,
                parameters,
            });
        }
        let parallel = self
            .rest
            .get("parallel_tool_calls")
            .and_then(Value::as_bool);
        Tools::new(tools, choice).map(|t| Some(t.parallel(parallel)))
    }

    /// The alternatives per token to report with log-probabilities, or none: chat takes
    /// `logprobs: true` and `top_logprobs: K` (0 to 20), completions `logprobs: K` (0 to 5).
    pub fn logprobs(&self, chat: bool) -> Result<Option<usize>, String> {
        let count = |name: &str, v: &Value, most: usize| match v.as_u64() {
            Some(k) if k as usize <= most => Ok(k as usize),
            _ => Err(format!(
                "{name}: {} is not a count from 0 to {most}",
                sheaf_core::clip(&v.to_string())
            )),
        };
        let top = self.top_logprobs.as_ref().filter(|v| !v.is_null());
        if !chat {
            if top.is_some() {
                return Err(
                    "top_logprobs: a chat field; completions take `logprobs: K` (0 to 5)".into(),
                );
            }
            return match &self.logprobs {
                None | Some(Value::Null) => Ok(None),
                Some(v) => count("logprobs", v, 5).map(Some),
            };
        }
        let on = match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(v) => {
                return Err(format!(
                    "logprobs: {} is not true or false (chat takes `top_logprobs` for the count)",
                    sheaf_core::clip(&v.to_string())
                ))
            }
        };
        match (on, top) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err("top_logprobs: needs `logprobs: true`".into()),
            (true, None) => Ok(Some(0)),
            (true, Some(v)) => count("top_logprobs", v, MAX_TOP_LOGPROBS).map(Some),
        }
    }

    /// The sampling fields beyond temperature and top-p, each checked against its range.
    fn sampling(&self, temperature: f32, top_p: f32) -> Result<Sampling, String> {
        let within = |name: &str, v: Option<f32>, lo: f32, hi: f32| match v {
            Some(x) if !(lo..=hi).contains(&x) => {
                Err(format!("{name}: {x} is not between {lo} and {hi}"))
            }
            _ => Ok(v),
        };
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k < 0 => return Err(format!("top_k: {k} is not -1, 0 or a positive count")),
            Some(k) => Some(u32::try_from(k).unwrap_or(u32::MAX)),
        };
        let min_p = within("min_p", self.min_p, 0.0, 1.0)?;
        let presence = within("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        let frequency = within("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        let repetition = match self.repetition_penalty {
            Some(r) if !(r > 0.0 && r <= 10.0) => {
                return Err(format!("repetition_penalty: {r} is not in (0, 10]"))
            }
            r => r,
        };
        let mut logit_bias = Vec::new();
        for (token, &bias) in self.logit_bias.iter().flatten() {
            let id = token.parse::<i32>().map_err(|_| {
                format!(
                    "logit_bias: '{}' is not a token id",
                    sheaf_core::clip(token)
                )
            })?;
            within("logit_bias", Some(bias), -100.0, 100.0)?;
            logit_bias.push((id, bias));
        }
        Ok(Sampling {
            temperature,
            top_p,
            seed: self.seed.unwrap_or(0) as u32,
            top_k,
            min_p,
            presence_penalty: presence.unwrap_or(0.0),
            frequency_penalty: frequency.unwrap_or(0.0),
            repetition_penalty: repetition.unwrap_or(1.0),
            logit_bias,
        })
    }
}

impl CompletionRequest {
    /// `context`: the model's context length in tokens. One engine request per prompt, each
    /// with the body's choices; also says whether the prompts are echoed (with `logprobs`, the
    /// engine then reads the prompts' log-probabilities too).
    pub fn into_request(self, context: usize) -> Result<(Common, Vec<Generate>, bool), String> {
        if self.common.tools.as_ref().is_some_and(|t| !t.is_null()) {
            return Err("tools: a chat field; /v1/completions calls no functions".into());
        }
        let echo = self.echo.unwrap_or(false);
        let mut prompts = self.prompt.into_prompts()?.into_iter();
        let first = prompts.next().unwrap_or(Prompt::Text(String::new()));
        let mut request =
            self.common
                .request(first, COMPLETION_DEFAULT_TOKENS.min(context), context)?;
        request.logprobs = self.common.logprobs(false)?;
        if let (true, Some(k)) = (echo, request.logprobs) {
            request.prompt_logprobs = Some(request.prompt_logprobs.map_or(k, |p| p.max(k)));
        }
        self.common.check_prompt_reads(&request, echo)?;
        let generate = self.common.generate(request)?;
        let mut generates = vec![generate.clone()];
        generates.extend(prompts.map(|prompt| {
            let mut g = generate.clone();
            g.request.prompt = prompt;
            g
        }));
        Ok((self.common, generates, echo))
    }
}

/// Chat messages as `(role, text)`, `developer` read as `system`. An assistant's calls and a
/// tool's results are written as the model writes and reads them, a tool's as the user's turn.
/// What the model could not read is refused, not dropped: a role other than OpenAI's, a part
/// that is not text (an image, audio, a file), a message other than an assistant's with no
/// content, and a tool message that answers no call an assistant message before it made.
pub fn chat_messages(messages: Vec<ChatMessage>) -> Result<Vec<(String, String)>, String> {
    if messages.is_empty() {
        return Err("messages: at least one message is needed".into());
    }
    let mut calls: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            role @ ("user" | "assistant" | "tool") => role,
            other => {
                return Err(format!(
                    "messages[{i}].role: system, developer, user, assistant or tool, not {:?}",
                    sheaf_core::clip(other)
                ))
            }
        };
        let content = match m.content {
            Value::String(s) => s,
            Value::Null if role == "assistant" => String::new(),
            Value::Null => {
                return Err(format!(
                    "messages[{i}].content: a {} message needs its content",
                    m.role
                ))
            }
            Value::Array(parts) => text_of_parts(i, role, &parts)?,
            other => {
                return Err(format!(
                    "messages[{i}].content: expected a string or a list of parts, got {}",
                    sheaf_core::clip(&other.to_string())
                ))
            }
        };
        let mut parts: Vec<String> = Vec::new();
        parts.extend((!content.is_empty()).then_some(content));
        let made = match &m.tool_calls {
            Value::Null => &[][..],
            Value::Array(made) if role == "assistant" => made.as_slice(),
            _ => {
                return Err(format!(
                    "messages[{i}].tool_calls: an assistant message's list of calls"
                ))
            }
        };
        for (j, call) in made.iter().enumerate() {
            let function = &call["function"];
            let (Some(name), Some(arguments)) =
                (function["name"].as_str(), function["arguments"].as_str())
            else {
                return Err(format!(
                    "messages[{i}].tool_calls[{j}]: expected {{\"function\": {{\"name\", \"arguments\"}}}}"
                ));
            };
            calls.extend(call["id"].as_str().map(str::to_string));
            parts.push(call_text(name, arguments));
        }
        let text = parts.join("\n");
        if role == "tool" {
            let Some(id) = m.tool_call_id.as_str() else {
                return Err(format!(
                    "messages[{i}].tool_call_id: a tool message names the call it answers"
                ));
            };
            if !calls.iter().any(|made| made == id) {
                return Err(format!(
                    "messages[{i}]: no assistant message before it made a call with id {:?}, \
                     which this tool message answers",
                    sheaf_core::clip(id)
                ));
            }
            out.push(("user".into(), response_text(&text)));
        } else {
            out.push((role.to_string(), text));
        }
    }
    Ok(out)
}

/// The text of a content's parts: `text` parts, and an assistant's `refusal` parts.
fn text_of_parts(i: usize, role: &str, parts: &[Value]) -> Result<String, String> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        // A part's text is under its type's name.
        let kind = match part["type"].as_str() {
            Some("text") => "text",
            Some("refusal") if role == "assistant" => "refusal",
            other => {
                return Err(format!(
                    "messages[{i}].content[{j}]: sheaf's language models read text parts, \
                     not {}",
                    other.map_or("a part with no type".to_string(), |t| format!("{t:?}"))
                ))
            }
        };
        let Some(t) = part[kind].as_str() else {
            return Err(format!(
                "messages[{i}].content[{j}].{kind}: the {kind} part's text, a string"
            ));
        };
        text.push_str(t);
    }
    Ok(text)
}

/// `POST /tokenize` (vLLM's): a `prompt` or chat `messages` of `model`, rendered as a
/// generation request's would be with the same fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: String,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    /// Answer each token's text too, as `token_strs`.
    #[serde(default)]
    pub return_token_strs: bool,
}

/// What `/tokenize` is asked to tokenize, and how.
pub struct Tokenize {
    pub model: String,
    pub prompt: Prompt,
    pub rendering: Rendering,
    pub token_strs: bool,
}

impl TokenizeRequest {
    /// The prompt to tokenize: exactly one of `prompt` and `messages`.
    pub fn into_prompt(self) -> Result<Tokenize, String> {
        let prompt = match (self.prompt, self.messages) {
            (Some(text), None) => Prompt::Text(text),
            (None, Some(messages)) => Prompt::Chat(chat_messages(messages)?),
            _ => return Err("give either 'prompt' or 'messages'".into()),
        };
        let rendering = super::vllm::rendering(
            self.add_special_tokens,
            self.add_generation_prompt,
            self.continue_final_message,
            matches!(prompt, Prompt::Chat(_)),
        )?;
        Ok(Tokenize {
            model: self.model,
            prompt,
            rendering,
            token_strs: self.return_token_strs,
        })
    }
}

/// `POST /detokenize` (vLLM's): token ids of `model`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: String,
    pub tokens: Vec<i32>,
}

impl ChatRequest {
    /// `context`: the model's context length in tokens, which is also the default limit (chat
    /// has no small default; the engine caps it at what the prompt leaves). With functions to
    /// call, they are shown in the system message, and the answer's format is a call's.
    pub fn into_request(self, context: usize) -> Result<(Common, Generate, Option<Tools>), String> {
        let mut messages = chat_messages(self.messages)?;
        let tools = self.common.tools()?;
        if let Some(tools) = &tools {
            if let Some((_, field)) = self.common.format()? {
                return Err(format!(
                    "{field}: cannot be combined with tools; a call's arguments follow its \
                     function's parameters schema"
                ));
            }
            match messages.first_mut() {
                Some((role, text)) if role == "system" => {
                    *text = format!("{text}\n\n{}", tools.instructions());
                }
                _ => messages.insert(0, ("system".into(), tools.instructions())),
            }
        }
        let mut request = self
            .common
            .request(Prompt::Chat(messages), context, context)?;
        request.logprobs = self.common.logprobs(true)?;
        self.common.check_prompt_reads(&request, false)?;
        if let Some(tools) = &tools {
            request.format = Some(tools.format());
        }
        let generate = self.common.generate(request)?;
        Ok((self.common, generate, tools))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_with_tools(extra: Value) -> Result<(Common, GenRequest, Option<Tools>), String> {
        chat_generate(extra).map(|(c, g, t)| (c, g.request, t))
    }

    fn chat_generate(extra: Value) -> Result<(Common, Generate, Option<Tools>), String> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value::<ChatRequest>(body)
            .map_err(|e| e.to_string())?
            .into_request(4096)
    }

    fn chat(extra: Value) -> Result<(Common, GenRequest), String> {
        chat_with_tools(extra).map(|(c, r, _)| (c, r))
    }

    #[test]
    fn fields_asking_for_nothing_pass_and_the_others_are_named() {
        for inert in [
            json!({"user": "u1", "metadata": {"a": "b"}, "store": false}),
            json!({"logprobs": false, "presence_penalty": 0, "frequency_penalty": 0.0}),
            json!({"tools": [], "tool_choice": "auto", "logit_bias": {}}),
            json!({"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1}),
            json!({"logit_bias": {"42": -100, "7": 5.5}, "presence_penalty": -2}),
            json!({"response_format": {"type": "text"}, "top_logprobs": null}),
        ] {
            assert!(chat(inert.clone()).is_ok(), "{inert}");
        }
        for (asked, name) in [
            (json!({"functions": [{"name": "f"}]}), "functions"),
            (json!({"max_token": 5}), "max_token"),
        ] {
            let e = chat(asked.clone()).unwrap_err();
            assert!(
                e.starts_with(&format!("{name}: not supported")),
                "{asked}: {e}"
            );
        }
    }

    #[test]
    fn vllm_fields_reach_the_request_and_one_format_is_asked_for() {
        let (_, r) = chat(json!({
            "guided_choice": ["yes", "no"], "guided_decoding_backend": "outlines",
            "stop_token_ids": [2], "include_stop_str_in_output": true,
        }))
        .unwrap();
        assert_eq!(
            r.format,
            Some(Format::Choice(vec!["yes".into(), "no".into()]))
        );
        assert_eq!((r.stop_tokens, r.include_stop), (vec![2], true));
        let (_, r) = chat(json!({"min_tokens": 4, "ignore_eos": true})).unwrap();
        assert_eq!((r.min_tokens, r.ignore_eos), (4, true));
        let e = chat(json!({"guided_regex": "a", "response_format": {"type": "json_object"}}))
            .unwrap_err();
        assert_eq!(
            e,
            "guided_regex: cannot be combined with response_format; ask for one format"
        );
        let e = chat_with_tools(weather(json!({"guided_json": {"type": "object"}}))).unwrap_err();
        assert!(
            e.starts_with("guided_json: cannot be combined with tools"),
            "{e}"
        );
    }

    #[test]
    fn response_format_is_read_and_checked() {
        let format = |v: Value| chat(json!({ "response_format": v })).map(|r| r.1.format);
        assert_eq!(format(json!({"type": "text"})), Ok(None));
        assert_eq!(format(Value::Null), Ok(None));
        assert_eq!(
            format(json!({"type": "json_object"})),
            Ok(Some(Format::JsonObject))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            format(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})),
            Ok(Some(Format::JsonSchema(schema.to_string())))
        );
        for bad in [
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
            json!({"type": "yaml"}),
            json!("json"),
        ] {
            let e = format(bad.clone()).unwrap_err();
            assert!(e.starts_with("response_format"), "{bad}: {e}");
        }
    }

    #[test]
    fn logprobs_are_read_per_route_and_checked() {
        assert_eq!(chat(json!({"logprobs": false})).unwrap().1.logprobs, None);
        assert_eq!(chat(json!({"logprobs": true})).unwrap().1.logprobs, Some(0));
        let (_, r) = chat(json!({"logprobs": true, "top_logprobs": 5})).unwrap();
        assert_eq!(r.logprobs, Some(5));
        for (bad, says) in [
            (json!({"top_logprobs": 2}), "needs `logprobs: true`"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (json!({"logprobs": 3}), "not true or false"),
        ] {
            let e = chat(bad.clone()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let completion = |extra: Value| {
            let mut body = json!({"model": "m", "prompt": "hi"});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            serde_json::from_value::<CompletionRequest>(body)
                .map_err(|e| e.to_string())?
                .into_request(4096)
                .map(|r| r.1[0].request.logprobs)
        };
        assert_eq!(completion(json!({"logprobs": 2})), Ok(Some(2)));
        assert_eq!(completion(json!({"logprobs": null})), Ok(None));
        assert!(completion(json!({"logprobs": 6})).is_err());
        assert!(completion(json!({"logprobs": true})).is_err());
        assert!(completion(json!({"top_logprobs": 1})).is_err());
    }

    #[test]
    fn sampling_fields_are_read_and_checked() {
        let (_, r) = chat(json!({"top_k": 40, "min_p": 0.05, "frequency_penalty": 1.5,
                                 "logit_bias": {"42": -100}}))
        .unwrap();
        assert_eq!(r.sampling.top_k, Some(40));
        assert_eq!(r.sampling.min_p, Some(0.05));
        assert_eq!(r.sampling.frequency_penalty, 1.5);
        assert_eq!(r.sampling.logit_bias, vec![(42, -100.0)]);
        assert!(r.sampling.penalizes());
        let (_, r) = chat(json!({"top_k": -1})).unwrap();
        assert_eq!(r.sampling.top_k, None);
        assert!(!r.sampling.penalizes());
        for (bad, says) in [
            (json!({"top_k": -5}), "top_k"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"logit_bias": {"x": 1}}), "not a token id"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias: 101"),
        ] {
            let e = chat(bad.clone()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    fn weather(extra: Value) -> Value {
        let mut body = json!({"tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}
        }}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    }

    #[test]
    fn tools_show_in_the_system_message_and_set_the_calls_format() {
        let (_, r, tools) = chat_with_tools(weather(json!({}))).unwrap();
        assert!(tools.is_some_and(|t| !t.forced()));
        let Prompt::Chat(messages) = &r.prompt else {
            panic!("a chat")
        };
        assert_eq!(messages[0].0, "system");
        assert!(messages[0].1.contains("get_weather"), "{}", messages[0].1);
        assert!(matches!(
            r.format,
            Some(Format::ToolCall { forced: false, .. })
        ));
        for forced in [
            json!("required"),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ] {
            let (_, r, _) = chat_with_tools(weather(json!({ "tool_choice": forced }))).unwrap();
            let Some(Format::ToolCall {
                schema,
                forced: true,
                ..
            }) = r.format
            else {
                panic!("a forced call")
            };
            assert!(schema.contains(r#"{"const":"get_weather"}"#), "{schema}");
        }
        // `none`: no functions shown, free text.
        let (_, r, tools) = chat_with_tools(weather(json!({"tool_choice": "none"}))).unwrap();
        assert!(tools.is_none() && r.format.is_none());
        // A system message of the request's own is kept, the functions after it.
        let mut body = weather(json!({}));
        body["messages"] = json!([{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "hi"}]);
        let (_, r, _) = chat_with_tools(body).unwrap();
        let Prompt::Chat(messages) = &r.prompt else {
            panic!("a chat")
        };
        assert!(messages[0].1.starts_with("Be brief.\n\n") && messages[1].0 == "user");
        assert!(chat(json!({"parallel_tool_calls": true})).is_ok());
        // Several calls in one answer: with `auto` unless the request says no, forced only
        // where it says yes.
        for (choice, asked, parallel) in [
            (json!("auto"), json!(null), true),
            (json!("auto"), json!(true), true),
            (json!("auto"), json!(false), false),
            (json!("required"), json!(null), false),
            (json!("required"), json!(true), true),
        ] {
            let body = weather(json!({ "tool_choice": choice, "parallel_tool_calls": asked }));
            let (_, r, _) = chat_with_tools(body).unwrap();
            assert!(
                matches!(r.format, Some(Format::ToolCall { parallel: p, .. }) if p == parallel),
                "{choice} {asked}"
            );
        }
    }

    #[test]
    fn bad_tools_are_refused_by_name() {
        for (bad, says) in [
            (json!({"tools": {"name": "f"}}), "tools: expected a list"),
            (
                json!({"tools": [{"type": "code_interpreter"}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name: missing",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tool_choice": "required"}),
                "tool_choice: asks for a call",
            ),
            (
                weather(json!({"tool_choice": "always"})),
                "tool_choice: \"always\"",
            ),
            (
                weather(json!({"tool_choice": {"type": "function", "function": {"name": "f"}}})),
                "tool_choice: 'f' is not one of",
            ),
            (
                weather(json!({"response_format": {"type": "json_object"}})),
                "response_format: cannot be combined",
            ),
        ] {
            let e = chat(bad.clone()).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let mut twice = weather(json!({}));
        let first = twice["tools"][0].clone();
        twice["tools"].as_array_mut().unwrap().push(first);
        assert!(chat(twice).unwrap_err().contains("named twice"));
        let completion = serde_json::from_value::<CompletionRequest>(weather(
            json!({"model": "m", "prompt": "hi"}),
        ))
        .unwrap()
        .into_request(4096);
        assert!(completion.unwrap_err().starts_with("tools: a chat field"));
    }

    #[test]
    fn past_calls_and_their_results_are_written_as_the_model_reads_them() {
        let messages: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]))
        .unwrap();
        let out = chat_messages(messages).unwrap();
        assert_eq!(out[1].0, "assistant");
        assert_eq!(
            out[1].1,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            out[2],
            (
                "user".into(),
                "<tool_response>\nsunny\n</tool_response>".into()
            )
        );
        let bad: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]},
        ]))
        .unwrap();
        assert!(chat_messages(bad)
            .unwrap_err()
            .starts_with("messages[0].tool_calls[0]"));
    }

    #[test]
    fn what_a_model_could_not_read_is_refused_by_its_place() {
        let read = |messages: Value| {
            chat_messages(serde_json::from_value::<Vec<ChatMessage>>(messages).unwrap())
        };
        let refused = [
            (json!([{"role": "robot", "content": "x"}]), "messages[0].role"),
            (json!([{"role": "function", "content": "x"}]), "messages[0].role"),
            (json!([{"role": "user"}]), "messages[0].content"),
            (json!([{"role": "system", "content": null}]), "messages[0].content"),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "data:,"}}]}]),
                "messages[0].content[1]: sheaf's language models read text parts, not \"image_url\"",
            ),
            (json!([{"role": "user", "content": [{"text": "a"}]}]), "messages[0].content[0]"),
            (json!([{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
            (json!([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]), "messages[0].content[0]"),
            (json!([{"role": "user", "content": "x", "tool_calls": []}]), "messages[0].tool_calls"),
            (json!([{"role": "assistant", "tool_calls": {}}]), "messages[0].tool_calls"),
            (json!([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]), "messages[1].tool_call_id"),
            (
                json!([{"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "call_9", "content": "y"}]),
                "messages[1]: no assistant message before it made a call with id \"call_9\"",
            ),
        ];
        for (messages, error) in refused {
            let e = read(messages.clone()).unwrap_err();
            assert!(e.starts_with(error), "{messages}: {e}");
        }
        let read = read(json!([
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
            {"role": "assistant", "content": null},
        ]))
        .unwrap();
        let roles: Vec<(&str, &str)> = read.iter().map(|(r, t)| (r.as_str(), t.as_str())).collect();
        assert_eq!(
            roles,
            [
                ("system", "Be brief."),
                ("user", "ab"),
                ("assistant", "No."),
                ("assistant", "")
            ]
        );
        let streamless = chat(json!({"stream_options": {"include_usage": true}}));
        assert_eq!(
            streamless.unwrap_err(),
            "stream_options: only with stream: true"
        );
        assert!(chat(json!({"stream": true, "stream_options": {"include_usage": true}})).is_ok());
        let options = |o: Value| chat(json!({"stream": true, "stream_options": o}));
        assert!(options(json!({"continuous_usage_stats": false})).is_ok());
        let every = json!({"include_usage": true, "continuous_usage_stats": true});
        assert!(options(every).is_ok());
        assert!(options(json!({"include_obfuscation": false})).is_ok());
        let e = options(json!({"include_obfuscation": true})).unwrap_err();
        assert!(
            e.starts_with("stream_options.include_obfuscation: not supported"),
            "{e}"
        );
        let e = options(json!({"include_usage": true, "bogus": 1})).unwrap_err();
        assert!(e.contains("unknown field `bogus`"), "{e}");
    }

    fn completion(body: Value) -> Result<(GenRequest, bool), String> {
        let mut full = json!({"model": "m", "prompt": "hi"});
        for (k, v) in body.as_object().unwrap() {
            full[k] = v.clone();
        }
        serde_json::from_value::<CompletionRequest>(full)
            .map_err(|e| e.to_string())?
            .into_request(4096)
            .map(|(_, mut g, echo)| (g.remove(0).request, echo))
    }

    #[test]
    fn completion_prompts_are_text_or_token_ids_and_echo_reads_the_prompt() {
        let prompts = |p: Value| -> Result<Vec<Prompt>, String> {
            let body = json!({"model": "m", "prompt": p, "n": 2, "max_tokens": 3});
            let (_, generates, _) = serde_json::from_value::<CompletionRequest>(body)
                .map_err(|e| e.to_string())?
                .into_request(4096)?;
            // Each prompt's request is the body's, choices and all.
            assert!(generates
                .iter()
                .all(|g| g.choices == 2 && g.request.max_tokens == 3));
            Ok(generates.into_iter().map(|g| g.request.prompt).collect())
        };
        let text = |t: &str| Prompt::Text(t.into());
        assert_eq!(prompts(json!("hi")), Ok(vec![text("hi")]));
        assert_eq!(prompts(json!(["hi"])), Ok(vec![text("hi")]));
        assert_eq!(prompts(json!(["a", "b"])), Ok(vec![text("a"), text("b")]));
        assert_eq!(prompts(json!([5, 6])), Ok(vec![Prompt::Tokens(vec![5, 6])]));
        assert_eq!(
            prompts(json!([[5, 6]])),
            Ok(vec![Prompt::Tokens(vec![5, 6])])
        );
        assert_eq!(
            prompts(json!([[1], [2, 3]])),
            Ok(vec![Prompt::Tokens(vec![1]), Prompt::Tokens(vec![2, 3])])
        );
        let many = vec!["x"; MAX_PROMPTS + 1];
        for (bad, says) in [
            (
                json!([]),
                "prompt: the list of prompts is empty".to_string(),
            ),
            (
                json!([[1], []]),
                "prompt: a token list is empty".to_string(),
            ),
            (
                json!(many),
                format!("prompt: 257 prompts; at most {MAX_PROMPTS} in one request"),
            ),
            (
                json!([4_294_967_296_i64]),
                "prompt: 4294967296 is not a token id".to_string(),
            ),
        ] {
            assert_eq!(prompts(bad.clone()), Err(says), "{bad}");
        }
        // With `logprobs`, an echoed prompt's log-probabilities are read, with as many
        // alternatives as the larger ask.
        let (r, echo) = completion(json!({"echo": true, "logprobs": 2})).unwrap();
        assert_eq!((r.prompt_logprobs, echo), (Some(2), true));
        let (r, _) =
            completion(json!({"echo": true, "logprobs": 1, "prompt_logprobs": 4})).unwrap();
        assert_eq!(r.prompt_logprobs, Some(4));
        let (r, echo) = completion(json!({"echo": true})).unwrap();
        assert_eq!((r.prompt_logprobs, echo), (None, true));
        // Nothing generated: only to read the prompt.
        assert_eq!(
            completion(json!({"max_tokens": 0, "echo": true}))
                .unwrap()
                .0
                .max_tokens,
            0
        );
        let e = completion(json!({"max_tokens": 0})).unwrap_err();
        assert!(e.starts_with("max_tokens: must be at least 1"), "{e}");
        let e = chat(json!({"max_tokens": 0})).unwrap_err();
        assert!(e.starts_with("max_tokens: must be at least 1"), "{e}");
        let (_, r) = chat(json!({"max_tokens": 0, "prompt_logprobs": 0})).unwrap();
        assert_eq!((r.max_tokens, r.prompt_logprobs), (0, Some(0)));
        // Echoed text streams first, with its log-probabilities where they are asked for;
        // vLLM's prompt_logprobs come only whole.
        assert!(completion(json!({"echo": true, "stream": true})).is_ok());
        let (r, echo) = completion(json!({"echo": true, "logprobs": 1, "stream": true})).unwrap();
        assert_eq!((r.prompt_logprobs, echo), (Some(1), true));
        let e = completion(json!({"prompt_logprobs": 1, "stream": true})).unwrap_err();
        assert!(e.starts_with("prompt_logprobs: not with stream"), "{e}");
        let e = chat(json!({"prompt_logprobs": 1, "stream": true})).unwrap_err();
        assert!(e.starts_with("prompt_logprobs: not with stream"), "{e}");
    }

    #[test]
    fn choices_priority_and_timeout_give_the_queue_place() {
        let (_, g, _) = chat_generate(json!({"n": 3, "priority": 2, "timeout": 0.25})).unwrap();
        assert_eq!(
            (g.choices, g.priority, g.timeout_us),
            (3, Some(2), Some(250_000))
        );
        let (_, g, _) = chat_generate(json!({})).unwrap();
        assert_eq!((g.choices, g.priority, g.timeout_us), (1, None, None));
        for bad in [
            json!({"timeout": 0}),
            json!({"timeout": -1}),
            json!({"timeout": 1e9}),
        ] {
            let e = chat(bad.clone()).unwrap_err();
            assert!(e.starts_with("timeout:"), "{bad}: {e}");
        }
    }
}
