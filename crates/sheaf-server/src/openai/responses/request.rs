//! A Responses request read as the chat request it amounts to: its input items as messages
//! (checked as OpenAI checks them), `text.format` as `response_format`, its tools as chat
//! functions, what its answer repeats of it ([`Echo`]), and what sheaf does not do refused by
//! name.

use serde_json::{json, Map, Value};

use crate::openai::wire::ChatRequest;

/// What the answer repeats of the request.
#[derive(Debug, Clone, Default)]
pub(super) struct Echo {
    pub(super) instructions: Value,
    pub(super) max_output_tokens: Value,
    pub(super) temperature: Value,
    pub(super) top_p: Value,
    pub(super) tools: Value,
    pub(super) tool_choice: Value,
    pub(super) text: Value,
    pub(super) metadata: Value,
    pub(super) parallel_tool_calls: Value,
    pub(super) store: bool,
    pub(super) previous_response_id: Option<Value>,
    /// Made in the background (`background: true`): answered at once, read back later.
    pub(super) background: bool,
    /// The conversation it was made in, as `{"id": ...}`.
    pub(super) conversation: Option<Value>,
    /// `auto` (the oldest turns dropped to fit the context) or `disabled`.
    pub(super) truncation: &'static str,
}

/// The request as the chat request it amounts to, going on from the `previous` conversation's
/// items; what its answer repeats of it; and its input as items.
pub(super) fn to_chat(
    body: Value,
    previous: Option<&[Value]>,
) -> Result<(ChatRequest, Echo, Vec<Value>), String> {
    let Value::Object(mut body) = body else {
        return Err("the body is a JSON object: {\"model\", \"input\", ...}".into());
    };
    let mut take = |key: &str| body.remove(key).unwrap_or(Value::Null);
    let model = take("model");
    let input = take("input");
    let instructions = take("instructions");
    let stream = take("stream");
    let max_output_tokens = take("max_output_tokens");
    let temperature = take("temperature");
    let top_p = take("top_p");
    let text = take("text");
    let tools = take("tools");
    let tool_choice = take("tool_choice");
    let metadata = take("metadata");
    let parallel_tool_calls = take("parallel_tool_calls");
    let truncation = match take("truncation") {
        Value::Null => "disabled",
        Value::String(t) if t == "disabled" => "disabled",
        Value::String(t) if t == "auto" => "auto",
        other => return Err(format!("truncation: auto or disabled, not {other}")),
    };
    let background = match take("background") {
        Value::Null | Value::Bool(false) => false,
        Value::Bool(true) => true,
        other => return Err(format!("background: true or false, not {other}")),
    };
    refused(&mut body)?;
    let mut messages = Vec::new();
    match &instructions {
        Value::Null => {}
        Value::String(s) => messages.push(json!({ "role": "system", "content": s })),
        _ => return Err("instructions: a string".into()),
    }
    for (i, item) in previous.unwrap_or_default().iter().enumerate() {
        let message = input_message(i, item.clone())
            .map_err(|e| format!("previous_response_id's conversation: {e}"))?;
        messages.push(message);
    }
    let input = match input {
        Value::String(s) => vec![json!({ "type": "message", "role": "user", "content": s })],
        Value::Array(items) => items,
        Value::Null => return Err("input: the text, or the conversation's items".into()),
        _ => return Err("input: a string or a list of items".into()),
    };
    for (i, item) in input.iter().enumerate() {
        messages.push(input_message(i, item.clone())?);
    }
    calls_answered(previous.unwrap_or_default(), &input)?;
    let mut chat = Map::new();
    chat.insert("model".into(), model);
    chat.insert("stream".into(), stream);
    chat.insert("max_completion_tokens".into(), max_output_tokens.clone());
    chat.insert("temperature".into(), temperature.clone());
    chat.insert("top_p".into(), top_p.clone());
    chat.insert("response_format".into(), response_format(&text)?);
    chat.insert("tools".into(), chat_tools(&tools)?);
    chat.insert("tool_choice".into(), chat_tool_choice(&tool_choice)?);
    chat.insert("parallel_tool_calls".into(), parallel_tool_calls.clone());
    chat.insert("messages".into(), Value::Array(messages));
    chat.retain(|_, v| !v.is_null());
    let chat: ChatRequest =
        serde_json::from_value(Value::Object(chat)).map_err(|e| e.to_string())?;
    let echo = Echo {
        instructions,
        max_output_tokens,
        temperature,
        top_p,
        tools: if tools.is_null() { json!([]) } else { tools },
        tool_choice: if tool_choice.is_null() {
            json!("auto")
        } else {
            tool_choice
        },
        text: if text.is_null() {
            json!({ "format": { "type": "text" } })
        } else {
            text
        },
        metadata: crate::openai::conversations::checked_metadata(metadata)?,
        parallel_tool_calls: if parallel_tool_calls.is_null() {
            json!(true)
        } else {
            parallel_tool_calls
        },
        store: false,
        previous_response_id: None,
        background,
        conversation: None,
        truncation,
    };
    Ok((chat, echo, input))
}

/// Refuses, by name, each field left that asks for something sheaf does not do; takes the
/// caller's bookkeeping and the fields clients send with their default.
fn refused(rest: &mut Map<String, Value>) -> Result<(), String> {
    let bookkeeping = [
        "user",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
    ];
    for key in bookkeeping {
        rest.remove(key);
    }
    for (key, value) in std::mem::take(rest) {
        let default = match key.as_str() {
            "include" => value.is_null() || value.as_array().is_some_and(Vec::is_empty),
            _ => value.is_null(),
        };
        if default {
            continue;
        }
        return Err(format!("{key}: not a field sheaf takes on /v1/responses"));
    }
    Ok(())
}

/// One input item as a chat message: a message (its text parts), a function call the model
/// made, or a call's output.
pub(in crate::openai) fn input_message(i: usize, item: Value) -> Result<Value, String> {
    let kind = item["type"].as_str().unwrap_or("message");
    match kind {
        "message" => {
            let role = match item["role"].as_str() {
                Some("developer") => "system",
                Some(role @ ("system" | "user" | "assistant")) => role,
                other => {
                    return Err(format!(
                        "input[{i}].role: user, assistant, system or developer, not {other:?}"
                    ))
                }
            };
            let content = match &item["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => text_parts(&format!("input[{i}].content"), parts)?,
                _ => return Err(format!("input[{i}].content: a string or a list of parts")),
            };
            Ok(json!({ "role": role, "content": content }))
        }
        "function_call" => {
            for field in ["call_id", "name", "arguments"] {
                if !item[field].is_string() {
                    return Err(format!("input[{i}].{field}: the function call's, a string"));
                }
            }
            Ok(json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": item["call_id"],
                    "type": "function",
                    "function": { "name": item["name"], "arguments": item["arguments"] },
                }],
            }))
        }
        "function_call_output" => {
            if !item["call_id"].is_string() {
                return Err(format!("input[{i}].call_id: the call's id, a string"));
            }
            let output = match &item["output"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => text_parts(&format!("input[{i}].output"), parts)?,
                _ => return Err(format!("input[{i}].output: the call's output, a string")),
            };
            Ok(json!({
                "role": "tool",
                "tool_call_id": item["call_id"],
                "content": output,
            }))
        }
        other => Err(format!(
            "input[{i}].type: message, function_call or function_call_output, not {other:?}"
        )),
    }
}

/// The text of an item's text parts (`input_text`, `output_text`); `at` names the list.
fn text_parts(at: &str, parts: &[Value]) -> Result<String, String> {
    let mut text = String::new();
    for (k, part) in parts.iter().enumerate() {
        match (part["type"].as_str(), part["text"].as_str()) {
            (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
            (kind, _) => {
                return Err(format!(
                    "{at}[{k}]: sheaf's language models read text parts (input_text), not \
                     {kind:?}"
                ))
            }
        }
    }
    Ok(text)
}

/// Refuses a `function_call_output` in `input` whose `call_id` no `function_call` before it
/// (in `input`, or in the conversation it goes on from) made.
fn calls_answered(previous: &[Value], input: &[Value]) -> Result<(), String> {
    let made = |item: &Value| (item["type"] == "function_call").then(|| item["call_id"].clone());
    let mut calls: Vec<Value> = previous.iter().filter_map(made).collect();
    for (i, item) in input.iter().enumerate() {
        if item["type"] == "function_call_output" && !calls.contains(&item["call_id"]) {
            return Err(format!(
                "input[{i}]: no function_call before this function_call_output has its call_id \
                 {}",
                sheaf_core::clip(&item["call_id"].to_string())
            ));
        }
        calls.extend(made(item));
    }
    Ok(())
}

/// `text.format` as a chat `response_format`.
fn response_format(text: &Value) -> Result<Value, String> {
    let format = &text["format"];
    Ok(match format["type"].as_str() {
        None | Some("text") => Value::Null,
        Some("json_object") => json!({ "type": "json_object" }),
        Some("json_schema") => json!({
            "type": "json_schema",
            "json_schema": {
                "name": format["name"],
                "schema": format["schema"],
                "strict": format["strict"],
            },
        }),
        Some(other) => {
            return Err(format!(
                "text.format.type: text, json_object or json_schema, not {other:?}"
            ))
        }
    })
}

/// Function tools as chat functions; other kinds of tool are refused.
fn chat_tools(tools: &Value) -> Result<Value, String> {
    let tools = match tools {
        Value::Null => return Ok(Value::Null),
        Value::Array(tools) => tools,
        _ => return Err("tools: a list of tools".into()),
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool["type"] != "function" {
            return Err(format!(
                "tools[{i}]: sheaf calls functions only (type function), not {}",
                tool["type"]
            ));
        }
        out.push(json!({
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["parameters"],
            },
        }));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` in the chat's shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, String> {
    Ok(match choice {
        Value::Object(o) if o.get("type") == Some(&json!("function")) => {
            json!({ "type": "function", "function": { "name": o.get("name") } })
        }
        Value::Object(_) => return Err("tool_choice: auto, none, required or a function".into()),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_as_the_chat_it_amounts_to() {
        let (chat, echo, _) = to_chat(json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use metric units."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "max_output_tokens": 20,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "user": "u1",
            "include": [],
            "metadata": {"k": "v"},
        }), None)
        .unwrap();
        assert_eq!(chat.common.model, "m");
        assert_eq!(chat.common.max_completion_tokens, Some(20));
        assert_eq!(chat.messages.len(), 5);
        assert_eq!(chat.messages[0].role, "system");
        assert_eq!(chat.messages[1].role, "system");
        assert_eq!(chat.messages[2].content, json!("Weather?"));
        assert_eq!(
            chat.messages[3].tool_calls[0]["function"]["name"],
            "weather"
        );
        assert_eq!(chat.messages[4].role, "tool");
        assert_eq!(
            chat.common.response_format.as_ref().unwrap()["json_schema"]["name"],
            "w"
        );
        assert_eq!(echo.metadata, json!({"k": "v"}));
        let (chat, _, input) = to_chat(json!({"model": "m", "input": "hi"}), None).unwrap();
        assert_eq!(chat.messages[0].content, json!("hi"));
        assert_eq!(
            input,
            vec![json!({"type": "message", "role": "user", "content": "hi"})]
        );
    }

    #[test]
    fn a_request_goes_on_from_the_previous_conversation() {
        // A kept conversation: a question, then the answer's output items.
        let previous = [
            json!({"type": "message", "role": "user", "content": "Weather in Paris?"}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather",
                   "arguments": "{\"city\":\"Paris\"}", "status": "completed"}),
        ];
        let body = json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
        });
        let (chat, _, input) = to_chat(body, Some(&previous)).unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(chat.messages[2].tool_calls[0]["id"], "call_1");
        assert_eq!(chat.messages[3].content, json!("sunny"));
        // Only this request's own input is returned as its input.
        assert_eq!(input.len(), 1);
        // An answer's message item reads back as the assistant's turn.
        let previous = [
            json!({"type": "message", "id": "msg_1", "status": "completed",
            "role": "assistant", "content": [{"type": "output_text", "text": "Hi.", "annotations": []}]}),
        ];
        let (chat, _, _) =
            to_chat(json!({"model": "m", "input": "And?"}), Some(&previous)).unwrap();
        assert_eq!(chat.messages[0].role, "assistant");
        assert_eq!(chat.messages[0].content, json!("Hi."));
    }

    #[test]
    fn what_sheaf_does_not_do_is_refused_by_name() {
        for (body, says) in [
            (
                json!({"model": "m", "input": "x", "background": "yes"}),
                "background: true or false",
            ),
            (
                json!({"model": "m", "input": "x", "truncation": "middle"}),
                "truncation: auto or disabled",
            ),
            (
                json!({"model": "m", "input": "x", "reasoning": {"effort": "low"}}),
                "reasoning: not a field",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "functions only",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "text parts",
            ),
            (json!({"model": "m"}), "input:"),
            (
                json!({"model": "m", "input": [{"type": "reasoning"}]}),
                "input[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": {"type": "function"}}),
                "tools: a list",
            ),
            (
                json!({"model": "m", "input": "x", "metadata": {"a": 1}}),
                "metadata.a: a string",
            ),
            (
                json!({"model": "m", "input": "x", "metadata": (0..17).map(|k| (k.to_string(), json!("v"))).collect::<Map<String, Value>>()}),
                "metadata: at most 16 keys",
            ),
        ] {
            let e = to_chat(body.clone(), None).map(|_| ()).unwrap_err();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn a_call_output_answers_a_call_made_before_it() {
        let call =
            json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
        let output = json!({"type": "function_call_output", "call_id": "c1", "output": "sunny"});
        let body = |input: Value| json!({"model": "m", "input": input});
        // Made in the input, or in the conversation gone on from.
        assert!(to_chat(body(json!([call, output])), None).is_ok());
        assert!(to_chat(body(json!([output])), Some(std::slice::from_ref(&call))).is_ok());
        for (input, says) in [
            (json!([output]), "input[0]: no function_call before this function_call_output has its call_id \"c1\""),
            (json!([output, call]), "input[0]: no function_call"),
            (json!([{"type": "function_call", "call_id": "c1", "name": "f"}]), "input[0].arguments"),
            (json!([call, {"type": "function_call_output", "output": "x"}]), "input[1].call_id"),
            (json!([call, {"type": "function_call_output", "call_id": "c1", "output": 5}]), "input[1].output"),
            (
                json!([call, {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image"}]}]),
                "input[1].output[0]: sheaf's language models read text parts",
            ),
        ] {
            let e = to_chat(body(input.clone()), None).map(|_| ()).unwrap_err();
            assert!(e.starts_with(says), "{input}: {e}");
        }
        let parts = json!({"type": "function_call_output", "call_id": "c1",
                           "output": [{"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}]});
        let (chat, _, _) = to_chat(body(json!([call, parts])), None).unwrap();
        assert_eq!(chat.messages[1].content, json!("sunny"));
    }
}
