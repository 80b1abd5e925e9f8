//! vLLM's own fields on the completion routes, which clients moving from vLLM send (the
//! `openai` client's `extra_body`): guided decoding (`guided_json`, `guided_regex`,
//! `guided_choice`, `guided_grammar`, or the newer `structured_outputs` object holding one of
//! `json`, `regex`, `choice`, `grammar`, `json_object`), and where an answer ends
//! (`min_tokens`, `ignore_eos`, `stop_token_ids`, `include_stop_str_in_output`,
//! `skip_special_tokens`), each prompt token's log-probability (`prompt_logprobs`), and how
//! the prompt is rendered (`add_generation_prompt`, `continue_final_message`,
//! `add_special_tokens`, read by `/tokenize` too). Each is read into the one [`GenRequest`] the
//! route sends; what needs the model (token ids in its vocabulary, a grammar that loads, a
//! chat template that writes the final message as it was given) the engine checks.

use serde::Deserialize;
use serde_json::Value;
use sheaf_backend::generation::{Format, GenRequest, Prompt, Rendering, Turn, MAX_TOP_LOGPROBS};

/// vLLM's fields, each absent unless sent.
#[derive(Debug, Default, Deserialize)]
pub struct Extras {
    /// A JSON schema (an object, or the schema as a string) the answer validates against.
    pub guided_json: Option<Value>,
    /// A regular expression the whole answer matches.
    pub guided_regex: Option<String>,
    /// Strings, one of which is the whole answer.
    pub guided_choice: Option<Vec<String>>,
    /// A grammar in llama.cpp's notation (GBNF), from its rule `root`.
    pub guided_grammar: Option<String>,
    /// vLLM's newer form of the guided fields: `{"json" | "regex" | "choice" | "grammar" |
    /// "json_object": ...}`.
    pub structured_outputs: Option<Value>,
    pub min_tokens: Option<usize>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    /// Alternatives to give with each prompt token's log-probability (0 to 20).
    pub prompt_logprobs: Option<usize>,
    /// A chat's rendering: open the assistant's turn after the messages (the default).
    pub add_generation_prompt: Option<bool>,
    /// A chat's rendering: leave the final message open, for the answer to continue.
    pub continue_final_message: Option<bool>,
    /// Add the tokenizer's special tokens (its start token) to the prompt.
    pub add_special_tokens: Option<bool>,
}

/// How a prompt is rendered, from vLLM's fields; `chat` when it is a chat's. Leaving the final
/// message open implies not opening a new turn, unless that is asked for too, which is
/// refused; the chat fields on a text prompt pass only when they ask for nothing.
pub fn rendering(
    special: Option<bool>,
    generation_prompt: Option<bool>,
    continue_final: Option<bool>,
    chat: bool,
) -> Result<Rendering, String> {
    if !chat {
        if let Some((field, _)) = [
            ("add_generation_prompt", generation_prompt == Some(false)),
            ("continue_final_message", continue_final == Some(true)),
        ]
        .into_iter()
        .find(|(_, asks)| *asks)
        {
            return Err(format!(
                "{field}: a chat's field; a text prompt is fed as it is written"
            ));
        }
    }
    let turn = match (generation_prompt, continue_final.unwrap_or(false)) {
        (Some(true), true) => {
            return Err(
                "continue_final_message: leaves the final message open, so no new \
                        turn can follow it; set add_generation_prompt: false"
                    .into(),
            )
        }
        (_, true) => Turn::Continue,
        (Some(false), false) => Turn::Closed,
        (_, false) => Turn::Open,
    };
    Ok(Rendering { special, turn })
}

/// A guided format and the field that asked for it, for errors.
pub type Guided = (Format, &'static str);

impl Extras {
    /// The format guided decoding asks for, and the field that asks; none when none does. Two
    /// at once are refused.
    pub fn format(&self) -> Result<Option<Guided>, String> {
        let mut asked: Vec<Guided> = Vec::new();
        if let Some(schema) = &self.guided_json {
            asked.push((json_schema("guided_json", schema)?, "guided_json"));
        }
        if let Some(pattern) = &self.guided_regex {
            asked.push((Format::Regex(pattern.clone()), "guided_regex"));
        }
        if let Some(choices) = &self.guided_choice {
            asked.push((Format::Choice(choices.clone()), "guided_choice"));
        }
        if let Some(rules) = &self.guided_grammar {
            asked.push((Format::Grammar(rules.clone()), "guided_grammar"));
        }
        if let Some(outputs) = self.structured_outputs.as_ref().filter(|v| !v.is_null()) {
            asked.extend(structured_outputs(outputs)?);
        }
        match asked.len() {
            0 | 1 => Ok(asked.pop()),
            _ => Err(format!(
                "{} and {}: ask for one format",
                asked[0].1, asked[1].1
            )),
        }
    }

    /// Sets where `request`'s answer ends, and what of it is returned.
    pub fn apply(&self, request: &mut GenRequest) -> Result<(), String> {
        request.rendering = rendering(
            self.add_special_tokens,
            self.add_generation_prompt,
            self.continue_final_message,
            matches!(request.prompt, Prompt::Chat(_)),
        )?;
        request.min_tokens = self.min_tokens.unwrap_or(0);
        request.ignore_eos = self.ignore_eos.unwrap_or(false);
        request.include_stop = self.include_stop_str_in_output.unwrap_or(false);
        request.special_tokens = !self.skip_special_tokens.unwrap_or(true);
        if let Some(k) = self.prompt_logprobs {
            if k > MAX_TOP_LOGPROBS {
                return Err(format!(
                    "prompt_logprobs: {k} is not a count from 0 to {MAX_TOP_LOGPROBS}"
                ));
            }
            request.prompt_logprobs = Some(k);
        }
        request.stop_tokens = self
            .stop_token_ids
            .iter()
            .flatten()
            .map(|&id| {
                i32::try_from(id)
                    .ok()
                    .filter(|id| *id >= 0)
                    .ok_or_else(|| format!("stop_token_ids: {id} is not a token id"))
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }
}

/// A JSON schema sent as an object, or as its text.
fn json_schema(field: &str, schema: &Value) -> Result<Format, String> {
    let parsed;
    let schema = match schema {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| format!("{field}: not a JSON schema ({e})"))?;
            &parsed
        }
        other => other,
    };
    match schema {
        Value::Object(_) => Ok(Format::JsonSchema(schema.to_string())),
        other => Err(format!(
            "{field}: {} is not a JSON schema object",
            sheaf_core::clip(&other.to_string())
        )),
    }
}

/// The formats a `structured_outputs` object asks for. Its switches that ask for nothing
/// (null or false) pass; another key is refused by name.
fn structured_outputs(outputs: &Value) -> Result<Vec<Guided>, String> {
    let Some(fields) = outputs.as_object() else {
        return Err(format!(
            "structured_outputs: {} is not an object",
            sheaf_core::clip(&outputs.to_string())
        ));
    };
    let text = |key: &str, v: &Value| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("structured_outputs.{key}: not a string"))
    };
    let mut asked = Vec::new();
    for (key, value) in fields.iter().filter(|(_, v)| !v.is_null()) {
        let guided =
            match key.as_str() {
                "json" => (
                    json_schema("structured_outputs.json", value)?,
                    "structured_outputs.json",
                ),
                "regex" => (Format::Regex(text(key, value)?), "structured_outputs.regex"),
                "grammar" => (
                    Format::Grammar(text(key, value)?),
                    "structured_outputs.grammar",
                ),
                "choice" => (
                    Format::Choice(serde_json::from_value(value.clone()).map_err(|_| {
                        "structured_outputs.choice: not a list of strings".to_string()
                    })?),
                    "structured_outputs.choice",
                ),
                "json_object" if value == &Value::Bool(false) => continue,
                "json_object" if value == &Value::Bool(true) => {
                    (Format::JsonObject, "structured_outputs.json_object")
                }
                "disable_fallback" | "disable_any_whitespace" | "disable_additional_properties"
                    if value == &Value::Bool(false) =>
                {
                    continue
                }
                _ => {
                    return Err(format!(
                        "structured_outputs.{key}: not supported by sheaf (value {}); leave it out",
                        sheaf_core::clip(&value.to_string())
                    ))
                }
            };
        asked.push(guided);
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn extras(body: Value) -> Extras {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn each_guided_field_gives_its_format() {
        let one = |body: Value| extras(body).format().unwrap().unwrap();
        let schema = json!({"type": "object"});
        assert_eq!(
            one(json!({"guided_json": schema})),
            (Format::JsonSchema(schema.to_string()), "guided_json")
        );
        assert_eq!(
            one(json!({"guided_json": schema.to_string()})).0,
            Format::JsonSchema(schema.to_string())
        );
        assert_eq!(
            one(json!({"guided_regex": "a+"})).0,
            Format::Regex("a+".into())
        );
        assert_eq!(
            one(json!({"guided_choice": ["x", "y"], "guided_decoding_backend": "xgrammar"})).0,
            Format::Choice(vec!["x".into(), "y".into()])
        );
        assert_eq!(
            one(json!({"guided_grammar": "root ::= \"a\""})).0,
            Format::Grammar("root ::= \"a\"".into())
        );
        assert_eq!(
            one(json!({"structured_outputs": {"choice": ["x"], "disable_fallback": false}})),
            (
                Format::Choice(vec!["x".into()]),
                "structured_outputs.choice"
            )
        );
        assert_eq!(
            one(json!({"structured_outputs": {"json_object": true}})).0,
            Format::JsonObject
        );
        assert_eq!(extras(json!({})).format().unwrap(), None);
    }

    #[test]
    fn bad_guided_fields_are_refused_by_name() {
        let why = |body: Value| extras(body).format().unwrap_err();
        assert_eq!(
            why(json!({"guided_regex": "a", "guided_choice": ["a"]})),
            "guided_regex and guided_choice: ask for one format"
        );
        assert!(why(json!({"guided_json": "{not json"})).starts_with("guided_json: not a JSON"));
        assert!(why(json!({"guided_json": [1]})).contains("is not a JSON schema object"));
        assert!(why(json!({"structured_outputs": {"structural_tag": "x"}}))
            .starts_with("structured_outputs.structural_tag: not supported"));
        assert!(why(json!({"structured_outputs": {"choice": "x"}})).contains("list of strings"));
        assert!(why(json!({"structured_outputs": 3})).contains("not an object"));
    }

    #[test]
    fn the_ends_are_set_on_the_request() {
        let prompt = sheaf_backend::generation::Prompt::Text("p".into());
        let mut request = GenRequest::new(prompt, 8);
        extras(json!({
            "min_tokens": 3, "ignore_eos": true, "stop_token_ids": [5, 7],
            "include_stop_str_in_output": true, "skip_special_tokens": false,
            "prompt_logprobs": 2,
        }))
        .apply(&mut request)
        .unwrap();
        assert_eq!(
            (
                request.min_tokens,
                request.ignore_eos,
                request.stop_tokens.clone(),
                request.include_stop,
                request.special_tokens
            ),
            (3, true, vec![5, 7], true, true)
        );
        assert_eq!(request.prompt_logprobs, Some(2));
        let e = extras(json!({"prompt_logprobs": 21}))
            .apply(&mut request)
            .unwrap_err();
        assert_eq!(e, "prompt_logprobs: 21 is not a count from 0 to 20");
        let e = extras(json!({"stop_token_ids": [-1]}))
            .apply(&mut request)
            .unwrap_err();
        assert_eq!(e, "stop_token_ids: -1 is not a token id");
    }

    #[test]
    fn the_rendering_fields_set_how_a_chat_ends() {
        let chat = |g, c| rendering(None, g, c, true).map(|r| r.turn);
        assert_eq!(chat(None, None), Ok(Turn::Open));
        assert_eq!(chat(Some(true), Some(false)), Ok(Turn::Open));
        assert_eq!(chat(Some(false), None), Ok(Turn::Closed));
        assert_eq!(chat(Some(false), Some(true)), Ok(Turn::Continue));
        // Leaving the final message open needs no second field.
        assert_eq!(chat(None, Some(true)), Ok(Turn::Continue));
        assert!(chat(Some(true), Some(true))
            .unwrap_err()
            .contains("set add_generation_prompt: false"));
        assert_eq!(
            rendering(Some(true), None, None, false),
            Ok(Rendering {
                special: Some(true),
                turn: Turn::Open
            })
        );
        assert!(rendering(None, Some(true), Some(false), false).is_ok());
        let text = rendering(None, None, Some(true), false).unwrap_err();
        assert!(
            text.starts_with("continue_final_message: a chat's field"),
            "{text}"
        );
        let mut request = GenRequest::new(Prompt::Chat(vec![("user".into(), "hi".into())]), 8);
        extras(json!({"add_generation_prompt": false, "add_special_tokens": true}))
            .apply(&mut request)
            .unwrap();
        assert_eq!(
            request.rendering,
            Rendering {
                special: Some(true),
                turn: Turn::Closed
            }
        );
    }
}
