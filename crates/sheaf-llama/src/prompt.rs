//! Prompts to tokens and tokens to text, with the model's own chat template and tokenizer. They
//! only read the model, so they run on the caller's thread, beside the engine's decoding.

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use sheaf_backend::generation::{GenError, Prompt, Rendering, Turn};

/// The tokens of a prompt: a chat rendered with the model's template, a text with its start
/// token (special tokens written in the text are parsed), token ids as they are; `rendering`
/// changes the defaults.
pub(crate) fn tokens_of(
    model: &LlamaModel,
    template: Option<&LlamaChatTemplate>,
    prompt: &Prompt,
    rendering: Rendering,
) -> Result<Vec<LlamaToken>, GenError> {
    let (text, add_bos) = match prompt {
        Prompt::Text(t) => (t.clone(), rendering.special.unwrap_or(true)),
        Prompt::Chat(messages) => (
            render(model, template, messages, rendering.turn)?,
            rendering.special.unwrap_or(false),
        ),
        Prompt::Tokens(ids) => {
            known(model, ids.iter().copied(), "prompt: ")?;
            return Ok(ids.iter().map(|&t| LlamaToken(t)).collect());
        }
    };
    Ok(model.vocab().tokenize(text.as_bytes(), add_bos, true))
}

/// Refuses the first of `tokens` outside the model's vocabulary, its message led by `field`.
pub(crate) fn known(
    model: &LlamaModel,
    tokens: impl IntoIterator<Item = i32>,
    field: &str,
) -> Result<(), GenError> {
    let n_vocab = model.n_vocab();
    match tokens.into_iter().find(|t| !(0..n_vocab).contains(t)) {
        Some(bad) => Err(GenError::Invalid(format!(
            "{field}token {bad} is not in this model's vocabulary of {n_vocab} tokens"
        ))),
        None => Ok(()),
    }
}

/// The text of token ids, special tokens included as text.
pub(crate) fn text_of(model: &LlamaModel, tokens: &[i32]) -> Result<String, GenError> {
    known(model, tokens.iter().copied(), "")?;
    if tokens.is_empty() {
        return Ok(String::new());
    }
    let tokens: Vec<LlamaToken> = tokens.iter().map(|&t| LlamaToken(t)).collect();
    let bytes = model.vocab().detokenize(&tokens, false, true);
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A chat in the model's template, ending as `turn` says.
fn render(
    model: &LlamaModel,
    template: Option<&LlamaChatTemplate>,
    messages: &[(String, String)],
    turn: Turn,
) -> Result<String, GenError> {
    let template =
        template.ok_or_else(|| GenError::Invalid("this model has no chat template".into()))?;
    let chat = messages
        .iter()
        .map(|(role, content)| LlamaChatMessage::new(role.clone(), content.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| GenError::Invalid(format!("bad chat message: {e}")))?;
    let rendered = model
        .apply_chat_template(template, &chat, turn == Turn::Open)
        .map_err(|e| GenError::Invalid(format!("cannot apply the chat template: {e}")))?;
    match (turn, messages.last()) {
        (Turn::Continue, Some((_, last))) => left_open(rendered, last),
        (Turn::Continue, None) => Err(GenError::Invalid(
            "continue_final_message: there is no message to continue".into(),
        )),
        _ => Ok(rendered),
    }
}

/// `rendered` cut just after the final message's text, so that what the template closes the
/// message with is gone. The text is found as the template wrote it: the last place it
/// appears, its own outer spaces kept where the template kept them.
fn left_open(mut rendered: String, last: &str) -> Result<String, GenError> {
    let core = last.trim();
    if core.is_empty() {
        return Err(GenError::Invalid(
            "continue_final_message: the final message is empty; leave it out to have the \
             answer start a new message"
                .into(),
        ));
    }
    let Some(at) = rendered.rfind(core) else {
        return Err(GenError::Invalid(
            "continue_final_message: the model's chat template does not write the final \
             message's text as it was given, so it cannot be left open"
                .into(),
        ));
    };
    let led = last.trim_start();
    let end = if rendered[at..].starts_with(led) {
        at + led.len()
    } else {
        at + core.len()
    };
    rendered.truncate(end);
    Ok(rendered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_message_is_left_open_where_its_text_ends() {
        let chat = "<s>user\nhi</s>\n<s>assistant\nThe answer is</s>\n".to_string();
        assert_eq!(
            left_open(chat.clone(), "The answer is").unwrap(),
            "<s>user\nhi</s>\n<s>assistant\nThe answer is"
        );
        // The client's trailing space is kept when the template keeps it, and cut when the
        // template trimmed it.
        let spaced = "<s>assistant\nThe answer is </s>".to_string();
        assert_eq!(
            left_open(spaced, "The answer is ").unwrap(),
            "<s>assistant\nThe answer is "
        );
        assert_eq!(
            left_open(chat.clone(), "The answer is ").unwrap(),
            "<s>user\nhi</s>\n<s>assistant\nThe answer is"
        );
        // The last place the text appears is the final message's.
        let repeated = "<s>user\nhi</s><s>assistant\nhi</s>".to_string();
        assert_eq!(
            left_open(repeated, "hi").unwrap(),
            "<s>user\nhi</s><s>assistant\nhi"
        );
        let empty = left_open(chat.clone(), "  ").unwrap_err();
        assert!(
            empty.to_string().contains("final message is empty"),
            "{empty}"
        );
        let missing = left_open(chat, "not there").unwrap_err();
        assert!(missing.to_string().contains("does not write"), "{missing}");
    }
}
