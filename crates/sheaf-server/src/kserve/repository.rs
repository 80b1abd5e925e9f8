//! The repository extension's requests, read and answered alike over HTTP and gRPC: a load's
//! parameters (a configuration to load with; no files), and unload with or without a pipeline's
//! step models.

use sheaf_core::{InferError, ModelConfig, ModelManager};

/// Reads the parameters of a load request, each with its value when it is a string: Triton's
/// `config` (a configuration in Triton's JSON form, as tritonclient's `load_model(name,
/// config=...)` sends it) is the configuration to load with instead of the folder's file;
/// `file:...` (model files sent with the request) is refused, since a model's files load from
/// its folder; any other is left alone, as Triton leaves it.
pub fn load_parameters<'a>(
    params: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<Option<ModelConfig>, InferError> {
    let mut config = None;
    for (name, value) in params {
        if name.starts_with("file:") {
            return Err(InferError::invalid(format!(
                "load parameter '{name}': sheaf loads a model's files from its folder; write \
                 them into the model's folder, then load it (a loaded model loads again from \
                 its folder)"
            )));
        }
        if name != "config" {
            continue;
        }
        let text = value.ok_or_else(|| {
            InferError::invalid(
                "load parameter 'config' must be a string: the model's configuration in \
                 Triton's JSON form",
            )
        })?;
        config = Some(
            sheaf_core::pbtxt::load_config(text)
                .map_err(|e| InferError::invalid(format!("load parameter 'config': {e}")))?,
        );
    }
    Ok(config)
}

/// Loads `name`, with the configuration a load request gave when it gave one
/// ([`load_parameters`]).
pub async fn load(
    manager: &ModelManager,
    name: &str,
    config: Option<ModelConfig>,
) -> Result<(), InferError> {
    match config {
        Some(config) => manager.load_with_config(name, config).await.map(drop),
        None => manager.load(name).await.map(drop),
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
    fn a_load_request_may_carry_a_config_but_no_files() {
        assert!(load_parameters([]).unwrap().is_none());
        assert!(load_parameters([("priority", None)]).unwrap().is_none());
        let config = load_parameters([("config", Some(r#"{"max_batch_size": 4}"#))])
            .unwrap()
            .unwrap();
        assert_eq!(
            config.max_batch_size,
            Some(sheaf_core::config::MaxBatchSize::Size(4))
        );
        let e = load_parameters([("config", None)]).unwrap_err();
        assert!(e.message.contains("must be a string"), "{}", e.message);
        let e = load_parameters([("config", Some("{"))]).unwrap_err();
        assert!(e.message.contains("is not JSON"), "{}", e.message);
        let e = load_parameters([("config", Some(r#"{"max_batch_size": "x"}"#))]).unwrap_err();
        assert!(
            e.message.starts_with("load parameter 'config': "),
            "{}",
            e.message
        );
        let e = load_parameters([("file:1/model.onnx", Some("AAAA"))]).unwrap_err();
        assert!(e.message.contains("'file:1/model.onnx'"), "{}", e.message);
    }
}
