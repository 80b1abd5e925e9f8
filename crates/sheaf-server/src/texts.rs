//! The texts to embed as the embedding routes take them: OpenAI's `input` and TEI's `inputs`, a
//! string, a list of strings, a list of token ids, or a list of such lists; and the text encoder
//! a request names, or the only one, for the routes whose `model` may be left out (TEI's, and
//! vLLM's scores).

use std::sync::Arc;

use serde_json::Value;
use sheaf_core::embed::EmbedInput;
use sheaf_core::{ErrorKind, InferError, ModelHandle};

use crate::AppState;

/// The text encoder `model` names, else the server's only one (loaded, or in the `on_demand`
/// control mode one a request would load).
pub async fn encoder(
    state: &AppState,
    model: Option<String>,
) -> Result<Arc<ModelHandle>, InferError> {
    let name = match model {
        Some(name) => name,
        None => match state.manager.offered_encoders().as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(InferError::new(
                    ErrorKind::ModelNotFound,
                    "the server has no embedding model",
                ))
            }
            many => {
                return Err(InferError::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "the server has several embedding models ({}): name one in `model`",
                        many.join(", ")
                    ),
                ))
            }
        },
    };
    state.manager.get_or_load(&name, None).await
}

/// Texts only, in the forms [`parse_input`] takes that hold texts: a string or a list of them.
pub fn parse_texts(input: &Value, field: &str) -> Result<Vec<String>, String> {
    match parse_input(input, field)? {
        EmbedInput::Texts(texts) => Ok(texts),
        EmbedInput::Tokens(_) => Err(format!("`{field}` must be a string or a list of strings")),
    }
}

/// `input` in any of OpenAI's four forms. An empty text is refused, as OpenAI and TEI refuse
/// it: it has nothing to embed (its vector would be the special tokens').
pub fn parse_input(input: &Value, field: &str) -> Result<EmbedInput, String> {
    let parsed = parse_forms(input, field)?;
    if let EmbedInput::Texts(texts) = &parsed {
        if let Some(i) = texts.iter().position(String::is_empty) {
            return Err(match input.is_string() {
                true => format!("`{field}` is an empty string: there is nothing to embed"),
                false => format!("`{field}`[{i}] is an empty string: there is nothing to embed"),
            });
        }
    }
    Ok(parsed)
}

fn parse_forms(input: &Value, field: &str) -> Result<EmbedInput, String> {
    let shape = || {
        format!(
            "`{field}` must be a string, a list of strings, a list of token ids, or a list of \
             lists of token ids"
        )
    };
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect()
    };
    match input {
        Value::String(s) => Ok(EmbedInput::Texts(vec![s.clone()])),
        Value::Array(items) if items.is_empty() => Err(format!("`{field}` is an empty list")),
        Value::Array(items) if items[0].is_string() => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(EmbedInput::Texts)
            .ok_or_else(shape),
        Value::Array(items) if items[0].is_number() => ids(input)
            .map(|t| EmbedInput::Tokens(vec![t]))
            .ok_or_else(shape),
        Value::Array(items) => items
            .iter()
            .map(ids)
            .collect::<Option<Vec<_>>>()
            .map(EmbedInput::Tokens)
            .ok_or_else(shape),
        _ => Err(shape()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_empty_text_is_refused_by_its_place() {
        assert_eq!(
            parse_input(&json!(""), "input").unwrap_err(),
            "`input` is an empty string: there is nothing to embed"
        );
        assert_eq!(
            parse_input(&json!(["a", ""]), "inputs").unwrap_err(),
            "`inputs`[1] is an empty string: there is nothing to embed"
        );
    }

    #[test]
    fn every_input_form_is_read_and_others_are_refused() {
        let texts = |v: &[&str]| EmbedInput::Texts(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(parse_input(&json!("a"), "input"), Ok(texts(&["a"])));
        assert_eq!(
            parse_input(&json!(["a", "b"]), "input"),
            Ok(texts(&["a", "b"]))
        );
        assert_eq!(
            parse_input(&json!([1, 2]), "input"),
            Ok(EmbedInput::Tokens(vec![vec![1, 2]]))
        );
        assert_eq!(
            parse_input(&json!([[1], [2, 3]]), "input"),
            Ok(EmbedInput::Tokens(vec![vec![1], vec![2, 3]]))
        );
        for bad in [
            json!([]),
            json!(["a", 1]),
            json!([-1]),
            json!([1.5]),
            json!([[1], "a"]),
            json!({"text": "a"}),
            json!(3),
            json!([4294967296u64]),
        ] {
            assert!(parse_input(&bad, "input").is_err(), "{bad}");
        }
    }
}
