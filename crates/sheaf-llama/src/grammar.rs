//! The grammars that constrain an answer to a format (OpenAI's `response_format`), in llama.cpp's
//! notation (GBNF).

use crate::{Format, GenError};

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
/// refuses what it cannot express.
pub(crate) fn grammar_of(format: &Format) -> Result<String, GenError> {
    match format {
        Format::JsonObject => Ok(JSON_OBJECT.to_string()),
        Format::JsonSchema(schema) => llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| {
            GenError::Invalid(format!(
                "response_format: the JSON schema cannot be turned into a grammar ({e})"
            ))
        }),
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
    }
}
