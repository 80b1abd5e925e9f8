//! The repository extension's requests, read and answered alike over HTTP and gRPC: a load's
//! parameters (a configuration to load with, and the model's files), and unload with or
//! without a pipeline's step models.

use base64::Engine;
use sheaf_core::{InferError, ModelConfig, ModelManager};

/// A load parameter's value, as the protocol carried it.
#[derive(Debug, Clone, Copy)]
pub enum LoadValue<'a> {
    /// A string (HTTP's JSON string; gRPC's `string_param`).
    Text(&'a str),
    /// Bytes (gRPC's `bytes_param`).
    Bytes(&'a [u8]),
    /// Anything else (a number, a boolean).
    Other,
}

/// What a load request asks for besides its model: Triton's `config` (a configuration in
/// Triton's JSON form, as tritonclient's `load_model(name, config=...)` sends it) to load with
/// instead of the folder's file, and `file:<path>` parameters (`load_model(name, config=...,
/// files={"file:1/model.onnx": bytes})`: base64 text over HTTP, bytes over gRPC), the model's
/// files to load from instead of its folder, which need the `config`.
#[derive(Debug, Default)]
pub struct LoadRequest {
    pub config: Option<ModelConfig>,
    pub files: Vec<(String, Vec<u8>)>,
}

/// Reads the parameters of a load request ([`LoadRequest`]); any other parameter is left
/// alone, as Triton leaves it.
pub fn load_parameters<'a>(
    params: impl IntoIterator<Item = (&'a str, LoadValue<'a>)>,
) -> Result<LoadRequest, InferError> {
    let mut asked = LoadRequest::default();
    for (name, value) in params {
        if let Some(path) = name.strip_prefix("file:") {
            let bytes = match value {
                LoadValue::Bytes(b) => b.to_vec(),
                LoadValue::Text(t) => base64::engine::general_purpose::STANDARD
                    .decode(t)
                    .map_err(|e| {
                        InferError::invalid(format!(
                            "load parameter '{}': a file's bytes in base64, as tritonclient \
                             sends them: {e}",
                            sheaf_core::clip(name)
                        ))
                    })?,
                LoadValue::Other => {
                    return Err(InferError::invalid(format!(
                        "load parameter '{}' must be the file's bytes (base64 text over HTTP)",
                        sheaf_core::clip(name)
                    )))
                }
            };
            asked.files.push((path.to_string(), bytes));
            continue;
        }
        if name != "config" {
            continue;
        }
        let LoadValue::Text(text) = value else {
            return Err(InferError::invalid(
                "load parameter 'config' must be a string: the model's configuration in \
                 Triton's JSON form",
            ));
        };
        asked.config = Some(
            sheaf_core::pbtxt::load_config(text)
                .map_err(|e| InferError::invalid(format!("load parameter 'config': {e}")))?,
        );
    }
    if !asked.files.is_empty() && asked.config.is_none() {
        return Err(InferError::invalid(
            "a load with files (file:...) needs the 'config' parameter too: the model's \
             configuration in Triton's JSON form, as Triton asks",
        ));
    }
    Ok(asked)
}

/// Why a load that sends files is refused on this server, if it is: the files may be code (a
/// `model.py`) that the server then runs, so only a server with an admin key takes them (the
/// request has passed the admin key's check by then); without one, anyone who reaches the
/// port could run code there. 403 / PERMISSION_DENIED.
pub fn files_refused(
    access: &crate::access::AccessConfig,
    asked: &LoadRequest,
) -> Option<&'static str> {
    (!asked.files.is_empty() && access.admin_keys.is_empty()).then_some(
        "a load that sends the model's files runs what they hold, so the server takes them \
         only when it has an admin key: start it with --admin-key (SHEAF_ADMIN_KEY) and send \
         that key, or write the files into the model's folder and load it from there",
    )
}

/// Loads `name` as the load request asks ([`load_parameters`]): from its files, with its
/// configuration, or from its folder.
pub async fn load(
    manager: &ModelManager,
    name: &str,
    asked: LoadRequest,
) -> Result<(), InferError> {
    match asked {
        LoadRequest {
            config: Some(config),
            files,
        } if !files.is_empty() => manager.load_with_files(name, config, files).await.map(drop),
        LoadRequest {
            config: Some(config),
            ..
        } => manager.load_with_config(name, config).await.map(drop),
        LoadRequest { config: None, .. } => manager.load(name).await.map(drop),
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
    fn a_load_request_may_carry_a_config_and_files_with_it() {
        use LoadValue::{Bytes, Other, Text};
        let asked = load_parameters([]).unwrap();
        assert!(asked.config.is_none() && asked.files.is_empty());
        assert!(load_parameters([("priority", Other)])
            .unwrap()
            .config
            .is_none());
        let config = load_parameters([("config", Text(r#"{"max_batch_size": 4}"#))])
            .unwrap()
            .config
            .unwrap();
        assert_eq!(
            config.max_batch_size,
            Some(sheaf_core::config::MaxBatchSize::Size(4))
        );
        let e = load_parameters([("config", Other)]).unwrap_err();
        assert!(e.message.contains("must be a string"), "{}", e.message);
        let e = load_parameters([("config", Text("{"))]).unwrap_err();
        assert!(e.message.contains("is not JSON"), "{}", e.message);
        let e = load_parameters([("config", Text(r#"{"max_batch_size": "x"}"#))]).unwrap_err();
        assert!(
            e.message.starts_with("load parameter 'config': "),
            "{}",
            e.message
        );
        // Files: base64 text or bytes, with a config.
        let asked = load_parameters([
            ("config", Text("{}")),
            ("file:1/model.onnx", Text("AAEC")),
            ("file:labels.txt", Bytes(b"a\n")),
        ])
        .unwrap();
        assert_eq!(
            asked.files,
            vec![
                ("1/model.onnx".to_string(), vec![0, 1, 2]),
                ("labels.txt".to_string(), b"a\n".to_vec())
            ]
        );
        let e = load_parameters([("file:1/model.onnx", Text("AAEC"))]).unwrap_err();
        assert!(
            e.message.contains("needs the 'config' parameter"),
            "{}",
            e.message
        );
        let e = load_parameters([("config", Text("{}")), ("file:1/model.onnx", Text("%%"))])
            .unwrap_err();
        assert!(e.message.contains("base64"), "{}", e.message);
        let e =
            load_parameters([("config", Text("{}")), ("file:1/model.onnx", Other)]).unwrap_err();
        assert!(
            e.message.contains("must be the file's bytes"),
            "{}",
            e.message
        );
    }
}
