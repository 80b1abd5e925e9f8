//! The repository extension's requests, read and answered alike over HTTP and gRPC: the load
//! parameters refused, and unload with or without a pipeline's step models.

use sheaf_core::{InferError, ModelManager};

/// Checks the parameters a load request names: Triton's `config` (a configuration to load the
/// model with) and `file:...` (model files sent with the request) are refused, since a model
/// loads as its folder holds it; any other is left alone, as Triton leaves it.
pub fn check_load_parameters<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<(), InferError> {
    match names
        .into_iter()
        .find(|n| *n == "config" || n.starts_with("file:"))
    {
        Some(name) => Err(InferError::invalid(format!(
            "load parameter '{name}': sheaf loads a model as its folder holds it; write the \
             configuration (config.pbtxt or config.yaml) and the files into the model's folder, \
             then load it (a loaded model loads again from its folder)"
        ))),
        None => Ok(()),
    }
}

/// Unloads `name`; with `dependents` (Triton's `unload_dependents`), a pipeline's step models
/// too.
pub async fn unload(
    manager: &ModelManager,
    name: &str,
    dependents: bool,
) -> Result<(), InferError> {
    match dependents {
        true => manager.unload_with_steps(name).await,
        false => manager.unload(name).await,
    }
}

/// The error for an `unload_dependents` parameter that is not a bool (`got`, as the protocol
/// shows it).
pub fn unload_dependents_not_bool(got: &str) -> InferError {
    InferError::invalid(format!(
        "parameter 'unload_dependents' must be true or false, got {got}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_or_files_in_a_load_request_are_refused_by_name() {
        assert!(check_load_parameters([]).is_ok());
        assert!(check_load_parameters(["priority"]).is_ok());
        let e = check_load_parameters(["x", "config"]).unwrap_err();
        assert!(
            e.message.starts_with("load parameter 'config':"),
            "{}",
            e.message
        );
        let e = check_load_parameters(["file:1/model.onnx"]).unwrap_err();
        assert!(e.message.contains("'file:1/model.onnx'"), "{}", e.message);
    }
}
