//! Amazon SageMaker's multi-model endpoint contract, on the SageMaker port beside `/ping` and
//! `/invocations`, as Triton's SageMaker frontend serves it:
//! - `POST /models` with `{"model_name": NAME, "url": FOLDER}` loads the model in `FOLDER` (a
//!   model folder, or a folder of model folders whose ensemble, or only folder, is the model;
//!   the others are its steps). It serves under the `X-Amzn-SageMaker-Target-Model` header's
//!   name (SageMaker sends the model archive's name), else under `NAME`. 200 once loaded; 409
//!   for a `NAME` or model name taken; 507 when the load ran out of memory (SageMaker then
//!   unloads other models and tries again); 400 otherwise, with the reason.
//! - `GET /models` lists the loaded ones (`{"models": [{"modelName", "modelUrl"}]}`), `GET
//!   /models/NAME` one of them (404 when not loaded).
//! - `POST /models/NAME/invoke` is `/invocations` on that model.
//! - `DELETE /models/NAME` unloads it (its steps too) and forgets its folder.
//!
//! The folder joins the server's repositories while loaded (see
//! `ModelManager::register_repository`); loading needs a control mode that loads through the
//! API (Triton's SageMaker image starts `explicit` for multi-model endpoints). Loads, lists and
//! unloads are the model-repository API (its key, its restricted group); invoke is inference.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::cloud::infer_binary_named;
use super::sagemaker::{SageMaker, BINARY_CONTENT_TYPE};
use crate::error::ApiError;

/// The header naming the model archive a request is for.
pub const TARGET_MODEL: &str = "x-amzn-sagemaker-target-model";

/// The models loaded through `POST /models`, by the `model_name` each was loaded as.
#[derive(Debug, Default, Clone)]
pub struct Loaded(Arc<Mutex<BTreeMap<String, Entry>>>);

#[derive(Debug, Clone)]
pub struct Entry {
    /// The name it serves under.
    model: String,
    /// The `url` it was loaded from, as given.
    url: String,
    /// The repository registered for it.
    repository: PathBuf,
    /// False while it loads.
    ready: bool,
}

impl Loaded {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `POST /models`'s body.
#[derive(Debug, Deserialize)]
pub struct LoadBody {
    model_name: Option<String>,
    url: Option<String>,
}

/// `POST /models`: loads a model from its folder.
pub async fn load(
    State(s): State<SageMaker>,
    headers: HeaderMap,
    body: Result<Json<LoadBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body.map_err(|e| bad(format!("a load's body: {}", e.body_text())))?;
    let (Some(name), Some(url)) = (body.model_name, body.url) else {
        return Err(bad(
            "a load's body names the model and its folder: {\"model_name\": NAME, \"url\": FOLDER}",
        ));
    };
    let model = target(&headers, &name)?;
    let (repository, folder) = placement(Path::new(&url)).map_err(bad)?;
    {
        let mut loaded = s.models.lock();
        if loaded.contains_key(&name) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("model '{}' is loaded already", sheaf_core::clip(&name)),
            ));
        }
        loaded.insert(
            name.clone(),
            Entry {
                model: model.clone(),
                url: url.clone(),
                repository: repository.clone(),
                ready: false,
            },
        );
    }
    let manager = &s.state.manager;
    let names = BTreeMap::from([(folder, model.clone())]);
    if let Err(e) = manager.register_repository(&repository, names) {
        s.models.lock().remove(&name);
        return Err(e.into());
    }
    tracing::info!(model = %model, name = %name, url = %url, "SageMaker: loading a model");
    match manager.load(&model).await {
        Ok(_) => {
            if let Some(entry) = s.models.lock().get_mut(&name) {
                entry.ready = true;
            }
            Ok(StatusCode::OK.into_response())
        }
        Err(e) => {
            // Its steps too, those that did load.
            let _ = manager.unload_with_steps(&model).await;
            let _ = manager.unregister_repository(&repository);
            s.models.lock().remove(&name);
            let status = if out_of_memory(&e.message) {
                StatusCode::INSUFFICIENT_STORAGE
            } else {
                StatusCode::BAD_REQUEST
            };
            Err(ApiError::new(status, e.message))
        }
    }
}

/// `GET /models`: the loaded models.
pub async fn list(State(s): State<SageMaker>) -> Json<serde_json::Value> {
    let models: Vec<serde_json::Value> = s
        .models
        .lock()
        .iter()
        .filter(|(_, e)| e.ready)
        .map(|(name, e)| json!({ "modelName": name, "modelUrl": e.url }))
        .collect();
    Json(json!({ "models": models }))
}

/// `GET /models/NAME`: one loaded model.
pub async fn get_one(
    State(s): State<SageMaker>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let entry = entry(&s, &name)?;
    Ok(Json(json!({ "modelName": name, "modelUrl": entry.url })))
}

/// `POST /models/NAME/invoke`: `/invocations` on that model.
pub async fn invoke(
    State(s): State<SageMaker>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let entry = entry(&s, &name)?;
    infer_binary_named(s.state, entry.model, headers, body, BINARY_CONTENT_TYPE).await
}

/// `DELETE /models/NAME`: unloads it and its steps, and forgets its folder.
pub async fn unload(
    State(s): State<SageMaker>,
    UrlPath(name): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    let entry = entry(&s, &name)?;
    let manager = &s.state.manager;
    tracing::info!(model = %entry.model, name = %name, "SageMaker: unloading a model");
    match manager.unload_with_steps(&entry.model).await {
        Ok(()) => {}
        Err(e) if e.kind == sheaf_core::ErrorKind::ModelNotFound => {}
        Err(e) => return Err(e.into()),
    }
    let _ = manager.unregister_repository(&entry.repository);
    s.models.lock().remove(&name);
    Ok(StatusCode::OK)
}

/// The loaded model `name`, or a 404.
fn entry(s: &SageMaker, name: &str) -> Result<Entry, ApiError> {
    s.models
        .lock()
        .get(name)
        .filter(|e| e.ready)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("model '{}' is not loaded", sheaf_core::clip(name)),
            )
        })
}

/// The name a load serves under: the target-model header's, else the body's `model_name`.
fn target(headers: &HeaderMap, name: &str) -> Result<String, ApiError> {
    let model = match headers.get(TARGET_MODEL) {
        Some(v) => v
            .to_str()
            .map_err(|_| bad("the X-Amzn-SageMaker-Target-Model header is not text"))?
            .to_string(),
        None => name.to_string(),
    };
    let plain = !model.is_empty()
        && model != "."
        && model != ".."
        && !model.contains(['/', '\\'])
        && !model.chars().any(char::is_control);
    if !plain {
        return Err(bad(format!(
            "'{}' cannot name a model (empty, '.', '..', or with '/', '\\' or control \
             characters)",
            sheaf_core::clip(&model)
        )));
    }
    Ok(model)
}

/// Where the model of the folder `url` is: the repository to register and the folder in it
/// that is the model. `url` itself when it holds a model's configuration or version folders;
/// else its ensemble (a pipeline) when it has one, else its only folder.
fn placement(url: &Path) -> Result<(PathBuf, String), String> {
    let url = normal(url)?;
    if ["/dev", "/proc", "/sys"].iter().any(|p| url.starts_with(p)) {
        return Err(format!(
            "url {}: a model folder cannot be under /dev, /proc or /sys",
            url.display()
        ));
    }
    if !url.is_dir() {
        return Err(format!("url {}: no such folder", url.display()));
    }
    if is_model_folder(&url) {
        return match (url.parent(), url.file_name()) {
            (Some(parent), Some(name)) => {
                Ok((parent.to_path_buf(), name.to_string_lossy().into_owned()))
            }
            _ => Err(format!("url {}: not a model folder", url.display())),
        };
    }
    let folders = sheaf_core::repository::model_folders(&url)?;
    let ensemble = folders.iter().find(|(_, f)| is_ensemble(f));
    match (ensemble, folders.as_slice()) {
        (Some((name, _)), _) | (None, [(name, _)]) => Ok((url.clone(), name.clone())),
        (None, []) => Err(format!("url {}: no model folder in it", url.display())),
        (None, many) => Err(format!(
            "url {}: {} model folders and no ensemble among them to serve",
            url.display(),
            many.len()
        )),
    }
}

/// `path` absolute, without `.` and `..`.
fn normal(path: &Path) -> Result<PathBuf, String> {
    let absolute = std::path::absolute(path).map_err(|e| format!("url {}: {e}", path.display()))?;
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// A model's own folder: its configuration, or a numeric version folder, in it.
fn is_model_folder(folder: &Path) -> bool {
    let config = [
        sheaf_core::repository::CONFIG_FILE,
        sheaf_core::repository::TRITON_CONFIG_FILE,
        sheaf_core::repository::PIPELINE_FILE,
    ];
    config.iter().any(|f| folder.join(f).is_file())
        || std::fs::read_dir(folder).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.path().is_dir() && e.file_name().to_string_lossy().parse::<u64>().is_ok()
            })
        })
}

/// A Triton ensemble's folder, or a sheaf pipeline's.
fn is_ensemble(folder: &Path) -> bool {
    if folder.join(sheaf_core::repository::PIPELINE_FILE).is_file() {
        return true;
    }
    std::fs::read_to_string(folder.join(sheaf_core::repository::TRITON_CONFIG_FILE)).is_ok_and(
        |text| {
            let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            squeezed.contains("platform:\"ensemble\"")
        },
    )
}

/// Whether a load's error is the device or the host running out of memory, which SageMaker
/// answers by unloading other models and trying again.
fn out_of_memory(message: &str) -> bool {
    const WORDS: [&str; 8] = [
        "out of memory",
        "Out of memory",
        "Out Of Memory",
        "OutOfMemory",
        "CUDA_OUT_OF_MEMORY",
        "MemoryError",
        "Failed to allocate memory",
        "failed to allocate memory",
    ];
    WORDS.iter().any(|w| message.contains(w))
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder_with(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            let path = dir.path().join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "").unwrap();
        }
        dir
    }

    #[test]
    fn a_model_folder_is_served_from_its_parent() {
        let dir = folder_with(&["model/config.pbtxt", "model/1/model.onnx"]);
        let url = dir.path().join("model");
        let (repo, folder) = placement(&url).unwrap();
        assert_eq!(repo, normal(dir.path()).unwrap());
        assert_eq!(folder, "model");
        // Version folders alone make a model folder too; `.` and `..` are read.
        let dir = folder_with(&["m/1/model.onnx"]);
        let dotted = dir.path().join("m/./1/..");
        assert_eq!(placement(&dotted).unwrap().1, "m");
    }

    #[test]
    fn a_folder_of_models_serves_its_ensemble_or_its_only_model() {
        let dir = folder_with(&["only/1/model.onnx"]);
        assert_eq!(placement(dir.path()).unwrap().1, "only");
        let dir = folder_with(&["pre/1/model.py", "net/1/model.onnx", "ens/config.pbtxt"]);
        std::fs::write(
            dir.path().join("ens/config.pbtxt"),
            "name: \"ens\"\nplatform : \"ensemble\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("ens/1")).unwrap();
        assert_eq!(placement(dir.path()).unwrap().1, "ens");
        let dir = folder_with(&["a/1/model.onnx", "b/1/model.onnx"]);
        let e = placement(dir.path()).unwrap_err();
        assert!(e.contains("2 model folders and no ensemble"), "{e}");
        let dir = folder_with(&[]);
        assert!(placement(dir.path())
            .unwrap_err()
            .contains("no model folder"));
        assert!(placement(&dir.path().join("absent"))
            .unwrap_err()
            .contains("no such folder"));
        for system in ["/proc/self", "/sys/kernel", "/dev/../dev/shm"] {
            let e = placement(Path::new(system)).unwrap_err();
            assert!(
                e.contains("cannot be under /dev, /proc or /sys"),
                "{system}: {e}"
            );
        }
    }

    #[test]
    fn the_target_header_names_the_model() {
        let mut headers = HeaderMap::new();
        assert_eq!(target(&headers, "hash").unwrap(), "hash");
        headers.insert(TARGET_MODEL, "resnet.tar.gz".parse().unwrap());
        assert_eq!(target(&headers, "hash").unwrap(), "resnet.tar.gz");
        for bad in ["", "..", "a/b"] {
            headers.insert(TARGET_MODEL, bad.parse().unwrap());
            assert!(target(&headers, "hash").is_err(), "{bad}");
        }
    }

    #[test]
    fn out_of_memory_errors_are_told_apart() {
        assert!(out_of_memory("CUDA out of memory. Tried to allocate 2 GiB"));
        assert!(out_of_memory(
            "Failed to allocate memory for requested buffer"
        ));
        assert!(!out_of_memory("no model file"));
    }
}
