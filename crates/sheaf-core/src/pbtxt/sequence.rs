//! `sequence_batching`: the strategy, the idle timeout, control inputs and implicit state
//! ([`crate::sequence`]).

use crate::sequence::{ControlInput, ControlKind, SequenceConfig, SequenceStrategy, StateConfig};
use crate::ModelConfig;

use super::text::{boolean, count, counts, dims, message, word, Value};

/// Triton's `sequence_batching`: the strategy (`direct` or `oldest`, with their queue delays),
/// the idle timeout, the control inputs and the implicit states.
pub(super) fn sequence_batching(
    value: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    let mut s = SequenceConfig::default();
    let mut iterative = false;
    for (name, value) in message("sequence_batching", value)? {
        let path = format!("sequence_batching.{name}");
        match name.as_str() {
            "max_sequence_idle_microseconds" => {
                s.max_sequence_idle_us = count(&path, value)? as u64
            }
            "direct" | "oldest" => {
                s.strategy = if name == "direct" {
                    SequenceStrategy::Direct
                } else {
                    SequenceStrategy::Oldest
                };
                for (field, value) in message(&path, value)? {
                    let inner = format!("{path}.{field}");
                    match field.as_str() {
                        "max_queue_delay_microseconds" if name == "direct" => {
                            s.max_queue_delay_us = count(&inner, value)? as u64
                        }
                        // The oldest strategy batches with the model's dynamic batcher.
                        "max_queue_delay_microseconds" => {
                            config.max_queue_delay_us = count(&inner, value)? as u64
                        }
                        "preferred_batch_size" => {
                            config.preferred_batch_sizes = counts(&inner, value)?
                        }
                        "max_candidate_sequences" => {
                            s.max_candidate_sequences = count(&inner, value)?.max(1)
                        }
                        _ => ignored.push(inner),
                    }
                }
            }
            "control_input" => {
                for input in value.items() {
                    s.control_inputs
                        .extend(control_input(&path, input, ignored)?);
                }
            }
            "state" => {
                for state in value.items() {
                    s.states.push(state_config(&path, state, ignored)?);
                }
            }
            "iterative_sequence" => iterative = boolean(&path, value)?,
            _ => ignored.push(path),
        }
    }
    // An iterative sequence is one request, run again as the model asks: the server has no
    // sequence of requests to keep, and nothing to fill in.
    if iterative {
        if !s.control_inputs.is_empty() || !s.states.is_empty() {
            return Err(
                "sequence_batching: iterative_sequence with control inputs or states is \
                        not supported; an iterative model keeps each request's state itself"
                    .into(),
            );
        }
        config.iterative_sequence = true;
        return Ok(());
    }
    config.sequence_batching = Some(s);
    Ok(())
}

/// One `control_input { name: "START" control [{ kind: CONTROL_SEQUENCE_START
/// fp32_false_true: [0, 1] }] }`.
pub(super) fn control_input(
    path: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<Vec<ControlInput>, String> {
    let fields = message(path, value)?;
    let name = fields
        .iter()
        .find(|(n, _)| n == "name")
        .map(|(_, v)| word(&format!("{path}.name"), v))
        .transpose()?
        .ok_or_else(|| format!("{path}: a control input without a name"))?
        .to_string();
    let mut controls = Vec::new();
    for (field, value) in fields {
        let inner = format!("{path}.{field}");
        match field.as_str() {
            "name" => {}
            "control" => {
                for control in value.items() {
                    let mut kind = None;
                    let mut false_true = [0.0, 1.0];
                    for (f, v) in message(&inner, control)? {
                        let at = format!("{inner}.{f}");
                        match f.as_str() {
                            "kind" => {
                                kind = Some(match word(&at, v)? {
                                    "CONTROL_SEQUENCE_START" => ControlKind::Start,
                                    "CONTROL_SEQUENCE_END" => ControlKind::End,
                                    "CONTROL_SEQUENCE_READY" => ControlKind::Ready,
                                    "CONTROL_SEQUENCE_CORRID" => ControlKind::Corrid,
                                    other => return Err(format!("{at}: unknown kind '{other}'")),
                                })
                            }
                            "fp32_false_true" | "int32_false_true" | "bool_false_true" => {
                                let values = v
                                    .items()
                                    .into_iter()
                                    .map(|x| match word(&at, x)? {
                                        "true" => Ok(1.0),
                                        "false" => Ok(0.0),
                                        w => w
                                            .parse::<f64>()
                                            .map_err(|_| format!("{at}: '{w}' is not a value")),
                                    })
                                    .collect::<Result<Vec<_>, _>>()?;
                                false_true = <[f64; 2]>::try_from(values).map_err(|_| {
                                    format!("{at}: give two values, false and true")
                                })?;
                            }
                            // The model's own input says the data type.
                            "data_type" => {}
                            _ => ignored.push(at),
                        }
                    }
                    let kind = kind.ok_or_else(|| format!("{inner}: a control without a kind"))?;
                    controls.push(ControlInput {
                        name: name.clone(),
                        kind,
                        false_true,
                    });
                }
            }
            _ => ignored.push(inner),
        }
    }
    Ok(controls)
}

/// One `state { input_name output_name data_type dims initial_state { zero_data | data_file
/// dims } }`.
fn state_config(
    path: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<StateConfig, String> {
    let mut state = StateConfig::new("", "");
    for (field, value) in message(path, value)? {
        let inner = format!("{path}.{field}");
        match field.as_str() {
            "input_name" => state.input = word(&inner, value)?.to_string(),
            "output_name" => state.output = word(&inner, value)?.to_string(),
            "dims" => state.dims = dims(&inner, value)?,
            // The model's own input says the data type.
            "data_type" => {}
            "initial_state" => {
                for (f, value) in message(&inner, value)? {
                    let at = format!("{inner}.{f}");
                    match f.as_str() {
                        "zero_data" | "name" | "data_type" => {}
                        "dims" => state.initial_dims = dims(&at, value)?,
                        "data_file" => {
                            state.initial_data_file = Some(word(&at, value)?.to_string())
                        }
                        _ => ignored.push(at),
                    }
                }
            }
            _ => ignored.push(inner),
        }
    }
    if state.input.is_empty() || state.output.is_empty() {
        return Err(format!("{path}: a state needs input_name and output_name"));
    }
    Ok(state)
}
