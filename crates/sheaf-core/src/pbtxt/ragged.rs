//! `batch_input` and `batch_output`: what the server makes for each batch of ragged inputs, and
//! the outputs it scatters back by them ([`crate::ragged`]).

use crate::ragged::{BatchInput, BatchInputKind, BatchOutput, BatchOutputKind};

use super::text::{message, word, Value};

/// Every word of a field that may be repeated (`target_name: "a"` or `target_name: ["a", "b"]`).
fn words(path: &str, value: &Value) -> Result<Vec<String>, String> {
    value
        .items()
        .into_iter()
        .map(|v| word(path, v).map(str::to_string))
        .collect()
}

/// One `batch_input`.
pub(super) fn batch_input(value: &Value, ignored: &mut Vec<String>) -> Result<BatchInput, String> {
    let mut input = BatchInput {
        kind: BatchInputKind::ElementCount,
        target_name: Vec::new(),
        data_type: String::new(),
        source_input: Vec::new(),
    };
    let mut kind = None;
    for (field, value) in message("batch_input", value)? {
        let path = format!("batch_input.{field}");
        match field.as_str() {
            "kind" => {
                let w = word(&path, value)?.to_string();
                kind = Some(BatchInputKind::try_from(w).map_err(|e| format!("{path}: {e}"))?);
            }
            "target_name" => input.target_name.extend(words(&path, value)?),
            "data_type" => input.data_type = word(&path, value)?.to_string(),
            "source_input" => input.source_input.extend(words(&path, value)?),
            _ => ignored.push(path),
        }
    }
    input.kind = kind.ok_or("batch_input: a batch input needs its kind")?;
    if input.target_name.is_empty() || input.data_type.is_empty() {
        return Err("batch_input: a batch input needs target_name and data_type".into());
    }
    Ok(input)
}

/// One `batch_output`.
pub(super) fn batch_output(
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<BatchOutput, String> {
    let mut output = BatchOutput {
        target_name: Vec::new(),
        kind: BatchOutputKind::ScatterWithInputShape,
        source_input: Vec::new(),
    };
    for (field, value) in message("batch_output", value)? {
        let path = format!("batch_output.{field}");
        match field.as_str() {
            "kind" => match word(&path, value)? {
                "BATCH_SCATTER_WITH_INPUT_SHAPE" => {}
                other => {
                    return Err(format!(
                        "{path}: {other} is not a kind of batch output; the one kind is \
                         BATCH_SCATTER_WITH_INPUT_SHAPE"
                    ))
                }
            },
            "target_name" => output.target_name.extend(words(&path, value)?),
            "source_input" => output.source_input.extend(words(&path, value)?),
            _ => ignored.push(path),
        }
    }
    if output.target_name.is_empty() || output.source_input.is_empty() {
        return Err("batch_output: a batch output needs target_name and source_input".into());
    }
    Ok(output)
}
