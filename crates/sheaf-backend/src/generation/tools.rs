//! Tool calls (OpenAI's `tools`): how the functions are shown to a model, how a call is held to
//! its function's schema while sampling, and how calls are read back out of the answer.
//!
//! The functions go into the system message, and a call is written as a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`: the convention of
//! the Hermes and Qwen chat templates, which many instruction-tuned models were trained on. The
//! whole chat, tool list included, is then rendered with the model's own chat template.
//! - A forced call (`required`, or a named function) is the whole answer: a grammar made from
//!   the functions' parameter schemas allows nothing else, the call in its tags as ever.
//! - With `auto` the model answers freely; if it opens `<tool_call>`, a lazy grammar takes over
//!   from there and holds the call to a function's schema.
//! - With `auto`, unless a request sets `parallel_tool_calls: false`, the model may make
//!   several calls in one answer, one after another, each in its tags, and the grammar holds
//!   each to its schema. A forced answer is one call unless the request sets
//!   `parallel_tool_calls: true` (`required`; a named function is called once): a model held
//!   to calls from its first token may otherwise repeat its call, as small models do.
//!
//! [`ToolAnswer`] splits an answer, as its text streams in, into text that can be shown at once
//! and the calls found when it ends.

use serde_json::Value;

use super::Format;

/// Where a call starts in an answer.
pub const CALL_OPEN: &str = "<tool_call>";
/// Where a call ends in an answer.
pub const CALL_CLOSE: &str = "</tool_call>";

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object).
    pub parameters: Value,
}

/// Whether, and which, function the model must call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides: text, or a call.
    Auto,
    /// A call to one of the functions.
    Required,
    /// A call to this function.
    Named(String),
}

/// The functions of a request and the choice among them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    tools: Vec<Tool>,
    choice: ToolChoice,
    /// Whether several calls may be made in one answer, as the request said (OpenAI's
    /// `parallel_tool_calls`); none: it said nothing (see [`Tools::format`]).
    parallel: Option<bool>,
}

/// A call read out of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

impl Tools {
    /// Checks the functions (at least one; names of letters, digits, `_` and `-`, at most 64,
    /// each once; parameters a schema object) and that a named choice is one of them.
    pub fn new(tools: Vec<Tool>, choice: ToolChoice) -> Result<Tools, String> {
        if tools.is_empty() {
            return Err("tools: at least one function is needed".into());
        }
        for (i, tool) in tools.iter().enumerate() {
            let name_ok = !tool.name.is_empty()
                && tool.name.len() <= 64
                && tool
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(format!(
                    "tools[{i}].function.name: '{}' is not 1 to 64 letters, digits, '_' or '-'",
                    clip(&tool.name)
                ));
            }
            if tools[..i].iter().any(|t| t.name == tool.name) {
                return Err(format!(
                    "tools[{i}].function.name: '{}' is named twice",
                    tool.name
                ));
            }
            if !tool.parameters.is_object() {
                return Err(format!(
                    "tools[{i}].function.parameters: not a JSON schema object"
                ));
            }
        }
        if let ToolChoice::Named(name) = &choice {
            if !tools.iter().any(|t| &t.name == name) {
                return Err(format!(
                    "tool_choice: '{}' is not one of the functions in tools",
                    clip(name)
                ));
            }
        }
        Ok(Tools {
            tools,
            choice,
            parallel: None,
        })
    }

    /// These tools, with several calls in one answer allowed or not, as the request says.
    pub fn parallel(self, parallel: Option<bool>) -> Tools {
        Tools { parallel, ..self }
    }

    /// Whether the answer must be a call.
    pub fn forced(&self) -> bool {
        self.choice != ToolChoice::Auto
    }

    /// The system text that shows the functions and how to call one.
    pub fn instructions(&self) -> String {
        let mut text = String::from(
            "You may call functions to answer. Each is described by a JSON schema inside \
             <tools></tools>:\n<tools>\n",
        );
        for tool in &self.tools {
            let mut function =
                serde_json::json!({"name": tool.name, "parameters": tool.parameters});
            if let Some(d) = &tool.description {
                function["description"] = Value::String(d.clone());
            }
            text.push_str(
                &serde_json::json!({"type": "function", "function": function}).to_string(),
            );
            text.push('\n');
        }
        text.push_str(
            "</tools>\nTo call a function, answer with a JSON object holding its name and \
             arguments inside <tool_call></tool_call> tags:\n<tool_call>\n\
             {\"name\": <function name>, \"arguments\": <arguments object>}\n</tool_call>",
        );
        text
    }

    /// The format that sampling must follow: a forced call is the whole answer; with `auto`, a
    /// call is held to its schema once the model opens one. Several calls may be made with
    /// `auto` unless the request said no, with `required` where it said yes, and never to a
    /// named function (as OpenAI's and vLLM's servers call it once).
    pub fn format(&self) -> Format {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            _ => self.tools.iter().collect(),
        };
        let calls: Vec<String> = allowed.iter().map(|t| call_schema(t)).collect();
        let schema = match calls.as_slice() {
            [one] => one.clone(),
            many => format!("{{\"anyOf\":[{}]}}", many.join(",")),
        };
        let parallel = match self.choice {
            ToolChoice::Auto => self.parallel != Some(false),
            ToolChoice::Required => self.parallel == Some(true),
            ToolChoice::Named(_) => false,
        };
        Format::ToolCall {
            schema,
            forced: self.forced(),
            parallel,
        }
    }

    /// Reads the calls out of an answer as it streams in.
    pub fn answer(&self) -> ToolAnswer {
        ToolAnswer {
            forced: self.forced(),
            text: String::new(),
            sent: 0,
        }
    }
}

/// The schema of a call to `tool`, with `name` first so that the model writes it first.
fn call_schema(tool: &Tool) -> String {
    let name = Value::String(tool.name.clone());
    format!(
        "{{\"type\":\"object\",\"properties\":{{\"name\":{{\"const\":{name}}},\"arguments\":{}}},\
         \"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}}",
        tool.parameters
    )
}

/// A past call, as the model writes one (for assistant messages of the chat's history).
/// `arguments` is JSON text; text that is not JSON is kept as a string.
pub fn call_text(name: &str, arguments: &str) -> String {
    let arguments: Value =
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()));
    // `name` first, as the instructions show a call.
    format!(
        "{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{CALL_CLOSE}",
        Value::String(name.into())
    )
}

/// A function's result, as the model is shown it (for `tool` messages of the chat's history).
pub fn response_text(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// Splits an answer into text to show and calls: text is passed on as it comes, except what
/// may be the start of a call, which is held until the answer ends.
#[derive(Debug)]
pub struct ToolAnswer {
    forced: bool,
    text: String,
    /// Bytes of `text` passed on.
    sent: usize,
}

impl ToolAnswer {
    /// Adds a piece of the answer; returns the text that can be shown now.
    pub fn push(&mut self, piece: &str) -> Option<String> {
        self.text.push_str(piece);
        if self.forced {
            return None;
        }
        let unsent = &self.text[self.sent..];
        // Leading blank space waits: it is dropped if a call follows.
        if self.sent == 0 && unsent.trim().is_empty() {
            return None;
        }
        let end = match unsent.find(CALL_OPEN) {
            Some(at) => at,
            // Keep back a tail that may be the first bytes of `<tool_call>`.
            None => {
                let held = (1..CALL_OPEN.len())
                    .rev()
                    .find(|&k| unsent.ends_with(&CALL_OPEN[..k]))
                    .unwrap_or(0);
                unsent.len() - held
            }
        };
        // Blank space before a call is not shown either.
        if end == 0 || (self.sent == 0 && unsent[..end].trim().is_empty()) {
            return None;
        }
        let out = unsent[..end].to_string();
        self.sent += end;
        Some(out)
    }

    /// The answer has ended: the text not shown yet, and the calls, in the order made. An
    /// answer cut before its calls are complete (by `max_tokens`) has no call, and all its text
    /// is shown.
    pub fn finish(self) -> (Option<String>, Vec<ToolCall>) {
        let unsent = &self.text[self.sent..];
        let (before, calls) = match unsent.find(CALL_OPEN) {
            Some(at) => (&unsent[..at], parse_tagged(&unsent[at..])),
            None => (unsent, None),
        };
        match calls {
            Some(calls) => (
                (!before.trim().is_empty()).then(|| before.to_string()),
                calls,
            ),
            None => ((!unsent.is_empty()).then(|| unsent.to_string()), Vec::new()),
        }
    }
}

/// The calls of `text`, each `<tool_call>{...}</tool_call>` (the last one's closing tag may be
/// missing, where the answer ended at the call's end), with nothing but blank space between
/// them; `None` if any is not a complete call.
fn parse_tagged(mut text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    while let Some(rest) = text.trim_start().strip_prefix(CALL_OPEN) {
        let (body, after) = rest.split_once(CALL_CLOSE).unwrap_or((rest, ""));
        calls.push(parse_call(body)?);
        text = after;
    }
    (!calls.is_empty() && text.trim().is_empty()).then_some(calls)
}

/// At most 64 characters of a name, for messages.
fn clip(name: &str) -> String {
    name.chars().take(64).collect()
}

/// A call `{"name": "...", "arguments": {...}}`; `None` if `text` is not one.
fn parse_call(text: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments")? {
        args @ Value::Object(_) => args.to_string(),
        _ => return None,
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools(choice: ToolChoice) -> Tools {
        let tool = |name: &str| Tool {
            name: name.into(),
            description: Some(format!("{name} things")),
            parameters: json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        };
        Tools::new(vec![tool("add"), tool("sub")], choice).unwrap()
    }

    /// Streams `pieces` through the answer: what was shown, then what `finish` gives.
    fn split(t: &Tools, pieces: &[&str]) -> (String, Option<String>, Vec<ToolCall>) {
        let mut answer = t.answer();
        let shown: String = pieces.iter().filter_map(|p| answer.push(p)).collect();
        let (rest, calls) = answer.finish();
        (shown, rest, calls)
    }

    #[test]
    fn text_streams_and_a_call_is_held_and_read() {
        let auto = tools(ToolChoice::Auto);
        let (shown, rest, calls) = split(&auto, &["Hello", " there <", "b>"]);
        assert_eq!(
            (shown.as_str(), rest, calls),
            ("Hello there <b>", None, vec![])
        );
        // A tag split across pieces is never shown; the text before it is.
        let (shown, rest, calls) = split(
            &auto,
            &[
                "Let me see. <tool",
                "_call>\n{\"name\": \"add\", ",
                "\"arguments\": {\"x\": 1}}\n</tool_call>",
            ],
        );
        assert_eq!(shown, "Let me see. ");
        assert_eq!(rest, None);
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "add".into(),
                arguments: r#"{"x":1}"#.into()
            }]
        );
        // Blank space before a call is dropped.
        let (shown, rest, calls) = split(
            &auto,
            &["\n", " <tool_call>{\"name\": \"sub\", \"arguments\": {}}"],
        );
        assert_eq!((shown.as_str(), rest, calls.len()), ("", None, 1));
        // A call cut short is shown as text.
        let (shown, rest, calls) = split(&auto, &["<tool_call>{\"name\": \"sub\", \"argu"]);
        assert_eq!(shown, "");
        assert_eq!(
            rest.as_deref(),
            Some("<tool_call>{\"name\": \"sub\", \"argu")
        );
        assert!(calls.is_empty());
    }

    #[test]
    fn several_calls_are_read_in_the_order_made() {
        let call = |name: &str, x: i64| ToolCall {
            name: name.into(),
            arguments: format!(r#"{{"x":{x}}}"#),
        };
        let auto = tools(ToolChoice::Auto);
        let (shown, rest, calls) = split(
            &auto,
            &[
                "Two sums. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n",
                "</tool_call>\n<tool_call>\n{\"name\": \"sub\", \"arguments\": {\"x\": 2}}",
                "\n</tool_call>",
            ],
        );
        assert_eq!((shown.as_str(), rest), ("Two sums. ", None));
        assert_eq!(calls, vec![call("add", 1), call("sub", 2)]);
        // The second cut short: no call, every byte shown as text.
        let cut = "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>\n<tool_call>{\"na";
        let (shown, rest, calls) = split(&auto, &[cut]);
        assert_eq!(
            (shown.as_str(), rest.as_deref(), calls.len()),
            ("", Some(cut), 0)
        );
        // Forced, the same.
        let forced = tools(ToolChoice::Required);
        let (_, rest, calls) = split(
            &forced,
            &[
                "<tool_call>{\"name\": \"sub\", \"arguments\": {\"x\": 3}}</tool_call>\n",
                "<tool_call>{\"name\": \"add\", \"arguments\": {\"x\": 4}}</tool_call>",
            ],
        );
        assert_eq!((rest, calls), (None, vec![call("sub", 3), call("add", 4)]));
        // Whether more than one may be made is the format's.
        let parallel = |t: Tools| {
            let Format::ToolCall { parallel, .. } = t.format() else {
                panic!("a call format")
            };
            parallel
        };
        assert!(
            parallel(tools(ToolChoice::Auto)),
            "several calls by default"
        );
        assert!(!parallel(tools(ToolChoice::Auto).parallel(Some(false))));
        assert!(
            !parallel(forced.clone()),
            "one forced call unless asked for several"
        );
        assert!(parallel(forced.parallel(Some(true))));
        let named = tools(ToolChoice::Named("add".into()));
        assert!(!parallel(named.parallel(Some(true))));
    }

    #[test]
    fn a_forced_call_is_the_whole_answer() {
        let forced = tools(ToolChoice::Required);
        let (shown, rest, calls) = split(
            &forced,
            &[
                "<tool_call>\n{\"name\": \"sub\",",
                " \"arguments\": {\"x\": 2}}\n</tool_call>",
            ],
        );
        assert_eq!((shown.as_str(), rest), ("", None));
        assert_eq!(calls[0].name, "sub");
        let cut = "<tool_call>{\"name\": \"sub\"";
        let (_, rest, calls) = split(&forced, &[cut]);
        assert_eq!((rest.as_deref(), calls.len()), (Some(cut), 0));
    }

    #[test]
    fn the_format_allows_the_chosen_functions() {
        let Format::ToolCall { schema, forced, .. } = tools(ToolChoice::Auto).format() else {
            panic!("a call format")
        };
        assert!(!forced && schema.starts_with(r#"{"anyOf":["#), "{schema}");
        let named = tools(ToolChoice::Named("sub".into())).format();
        let Format::ToolCall { schema, forced, .. } = named else {
            panic!("a call format")
        };
        assert!(
            forced && schema.contains(r#""name":{"const":"sub"}"#) && !schema.contains(r#""add""#)
        );
        let schema: Value = serde_json::from_str(&schema).unwrap();
        assert_eq!(
            schema["properties"]["arguments"]["properties"]["x"]["type"],
            "integer"
        );
        let text = tools(ToolChoice::Auto).instructions();
        assert!(
            text.contains("\"add things\"") && text.contains(CALL_OPEN),
            "{text}"
        );
    }

    #[test]
    fn bad_functions_are_refused() {
        let tool = |name: &str, parameters: Value| Tool {
            name: name.into(),
            description: None,
            parameters,
        };
        let obj = json!({"type": "object"});
        assert!(Tools::new(vec![], ToolChoice::Auto).is_err());
        assert!(Tools::new(vec![tool("a b", obj.clone())], ToolChoice::Auto).is_err());
        assert!(Tools::new(vec![tool(&"x".repeat(65), obj.clone())], ToolChoice::Auto).is_err());
        assert!(Tools::new(vec![tool("f", json!(3))], ToolChoice::Auto).is_err());
        let e =
            Tools::new(vec![tool("f", obj.clone())], ToolChoice::Named("g".into())).unwrap_err();
        assert!(e.starts_with("tool_choice"), "{e}");
        assert_eq!(
            call_text("f", "not json"),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call>"
        );
    }
}
