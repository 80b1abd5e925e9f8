//! The grammars that constrain an answer to a format (OpenAI's `response_format`, a tool
//! call, or vLLM's guided decoding: a regular expression, a choice of strings, a grammar of
//! the client's own), in llama.cpp's notation (GBNF).

use serde_json::Value;

use sheaf_backend::generation::{Format, GenError, CALL_CLOSE, CALL_OPEN};

use crate::gbnf;

/// Any JSON object, in llama.cpp's grammar notation (GBNF), after llama.cpp's own `json.gbnf`.
const JSON_OBJECT: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"#;

/// The grammar of a format: a schema goes through llama.cpp's JSON-schema converter, which
/// refuses what it cannot express. A tool call's grammar wraps the call's in the call tags, as
/// the model writes a call unforced; where several calls are allowed, more may follow the
/// first, each in its tags. Unless forced, its sampler starts it only once the model writes
/// the opening tag ([`Grammar::trigger`]).
fn grammar_of(format: &Format) -> Result<String, GenError> {
    let converted = |schema: &str, field: &str| {
        llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| {
            GenError::Invalid(format!(
                "{field}: the JSON schema cannot be turned into a grammar ({e})"
            ))
        })
    };
    match format {
        Format::JsonObject => Ok(JSON_OBJECT.to_string()),
        Format::JsonSchema(schema) => converted(schema, "response_format"),
        Format::Regex(pattern) => {
            gbnf::regex_rules(pattern).map_err(|e| GenError::Invalid(format!("guided_regex: {e}")))
        }
        Format::Choice(choices) => {
            if choices.is_empty() {
                return Err(GenError::Invalid(
                    "guided_choice: lists no choice; give at least one string".into(),
                ));
            }
            let each: Vec<String> = choices.iter().map(|c| gbnf::literal(c)).collect();
            Ok(format!("root ::= {}\n", each.join(" | ")))
        }
        Format::Grammar(rules) => Ok(rules.clone()),
        Format::ToolCall {
            schema, parallel, ..
        } => {
            let call = converted(schema, "tools")?;
            // The converter names its top rule `root`; it becomes `call`, inside the tags.
            let renamed: Vec<String> = call
                .lines()
                .map(|line| match line.strip_prefix("root ::=") {
                    Some(rule) => format!("call ::={rule}"),
                    None => line.to_string(),
                })
                .collect();
            let one = format!(
                "{open} \"\\n\"? call \"\\n\"? {close}",
                open = Value::String(CALL_OPEN.into()),
                close = Value::String(CALL_CLOSE.into()),
            );
            let more = if *parallel {
                format!(" (\"\\n\" {one})*")
            } else {
                String::new()
            };
            Ok(format!("root ::= {one}{more}\n{}\n", renamed.join("\n")))
        }
    }
}

/// A format's grammar, as a sampler is made from it.
pub(crate) struct Grammar {
    pub rules: String,
    /// The text that starts the grammar, for one that waits for it (a lazy grammar); `None`:
    /// it holds from the first token.
    pub trigger: Option<&'static str>,
    /// The request field the format comes from, for errors.
    pub field: &'static str,
}

impl Grammar {
    pub fn of(format: &Format) -> Result<Grammar, GenError> {
        let (trigger, field) = match format {
            Format::ToolCall { forced: false, .. } => (Some(CALL_OPEN), "tools"),
            Format::ToolCall { forced: true, .. } => (None, "tools"),
            Format::Regex(_) => (None, "guided_regex"),
            Format::Choice(_) => (None, "guided_choice"),
            Format::Grammar(_) => (None, "guided_grammar"),
            Format::JsonObject | Format::JsonSchema(_) => (None, "response_format"),
        };
        Ok(Grammar {
            rules: grammar_of(format)?,
            trigger,
            field,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_become_grammars_and_bad_ones_are_refused() {
        let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#;
        let g = grammar_of(&Format::JsonSchema(schema.into())).unwrap();
        assert!(g.contains("root ::="), "{g}");
        let e = grammar_of(&Format::JsonSchema(
            r##"{"$ref": "#/definitions/missing"}"##.into(),
        ))
        .unwrap_err();
        assert!(e.to_string().starts_with("response_format"), "{e}");
        assert!(grammar_of(&Format::JsonObject)
            .unwrap()
            .contains("root   ::= object"));
        // A call that waits for its tag: the schema's rules under `call`, inside the tags.
        let call = |forced, parallel| Format::ToolCall {
            schema: schema.into(),
            forced,
            parallel,
        };
        let tagged = r#""<tool_call>" "\n"? call "\n"? "</tool_call>""#;
        let g = grammar_of(&call(false, false)).unwrap();
        assert!(g.starts_with(&format!("root ::= {tagged}\n")), "{g}");
        assert_eq!(g.matches("root ::=").count(), 1, "{g}");
        assert!(g.contains("\ncall ::="), "{g}");
        let grammar = Grammar::of(&call(false, false)).unwrap();
        assert_eq!((grammar.trigger, grammar.field), (Some(CALL_OPEN), "tools"));
        // Several calls: more may follow the first, each in its tags, forced or not.
        for forced in [false, true] {
            let g = grammar_of(&call(forced, true)).unwrap();
            assert!(
                g.starts_with(&format!("root ::= {tagged} (\"\\n\" {tagged})*\n")),
                "{g}"
            );
            assert_eq!(g.matches("root ::=").count(), 1, "{g}");
        }
        // A forced call is written as an unforced one is, from the first token.
        assert_eq!(
            grammar_of(&call(true, false)).unwrap(),
            grammar_of(&call(false, false)).unwrap()
        );
        assert_eq!(Grammar::of(&call(true, false)).unwrap().trigger, None);
        let e = Grammar::of(&Format::ToolCall {
            schema: r##"{"$ref": "#/nowhere"}"##.into(),
            forced: true,
            parallel: false,
        })
        .err()
        .unwrap();
        assert!(e.to_string().starts_with("tools:"), "{e}");
    }
}
