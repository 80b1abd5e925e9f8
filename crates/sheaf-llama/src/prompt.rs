//! Prompts to tokens and tokens to text, with the model's own chat template and tokenizer. They
//! only read the model, so they run on the caller's thread, beside the engine's decoding.

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use sheaf_backend::generation::{GenError, Prompt};

/// The tokens of a prompt: a chat rendered with the model's template, a text with its start
/// token (special tokens written in the text are parsed), token ids as they are.
pub(crate) fn tokens_of(
    model: &LlamaModel,
    template: Option<&LlamaChatTemplate>,
    prompt: &Prompt,
) -> Result<Vec<LlamaToken>, GenError> {
    let (text, add_bos) = match prompt {
        Prompt::Text(t) => (t.clone(), true),
        Prompt::Chat(messages) => (render(model, template, messages)?, false),
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

fn render(
    model: &LlamaModel,
    template: Option<&LlamaChatTemplate>,
    messages: &[(String, String)],
) -> Result<String, GenError> {
    let template =
        template.ok_or_else(|| GenError::Invalid("this model has no chat template".into()))?;
    let chat = messages
        .iter()
        .map(|(role, content)| LlamaChatMessage::new(role.clone(), content.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| GenError::Invalid(format!("bad chat message: {e}")))?;
    model
        .apply_chat_template(template, &chat, true)
        .map_err(|e| GenError::Invalid(format!("cannot apply the chat template: {e}")))
}
