//! The model repository on disk.
//!
//! Two layouts are accepted for each model folder `DIR/<name>/`, where `MODEL` is the file name
//! of one of the server's backends (`model.onnx`, `model.sim.yaml`, or any `*.gguf`):
//! - `DIR/<name>/MODEL` (version "1");
//! - Triton's `DIR/<name>/<version>/MODEL`, with numeric version folders; the highest version is
//!   served.
//!
//! An optional `DIR/<name>/config.yaml` holds the [`ModelConfig`]. A folder without one may
//! hold Triton's `config.pbtxt` instead, read by [`crate::pbtxt`]. When the server names a
//! custom configuration (Triton's `--model-config-name NAME`), a folder's
//! `configs/NAME.pbtxt` is read over both where it has one ([`triton_config_path`]). A folder with no model file
//! whose `config.pbtxt` is a Triton ensemble's serves as a pipeline ([`crate::pipeline`]); one
//! whose `config.pbtxt` names another platform or backend (a TorchScript or TensorRT model) is
//! listed with a configuration error that says what it is and what to do, so that it shows as
//! unavailable with that reason.

use std::path::{Path, PathBuf};

use crate::ModelConfig;

/// The optional per-model configuration file.
pub const CONFIG_FILE: &str = "config.yaml";

/// Triton's per-model configuration file, read when there is no [`CONFIG_FILE`].
pub const TRITON_CONFIG_FILE: &str = "config.pbtxt";

/// The folder of a model's custom Triton configurations (`configs/<name>.pbtxt`).
pub const CUSTOM_CONFIGS: &str = "configs";

/// The file that makes a model folder a pipeline ([`crate::pipeline`]).
pub const PIPELINE_FILE: &str = "pipeline.yaml";

/// One model found in the repository. `config` is an error message when `config.yaml` is bad,
/// so that the model is reported as failed while the others serve.
#[derive(Debug, Clone)]
pub struct RepoModel {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
    /// Which of the model file names matched.
    pub file: &'static str,
    pub config: Result<ModelConfig, String>,
    /// The other versions its `version_policy` names, oldest first (version, model file):
    /// they serve beside `version`, the newest, loaded and unloaded with it.
    pub older: Vec<(String, PathBuf)>,
    /// For a model loaded from files its load request sent: their folder, held while this
    /// entry is (see [`crate::uploaded`]).
    pub uploaded: Option<std::sync::Arc<crate::uploaded::Uploaded>>,
}

/// Lists the models under `dir` whose folders hold one of `model_files`, sorted by name. Folders
/// that hold none are skipped with a warning; a missing or unreadable `dir` is an error.
/// `custom` names the custom Triton configuration read where a folder has it.
pub fn scan(
    dir: &Path,
    model_files: &[&'static str],
    custom: Option<&str>,
) -> Result<Vec<RepoModel>, String> {
    let mut models = Vec::new();
    for (name, folder) in model_folders(dir)? {
        let pbtxt = triton_config_path(&folder, custom);
        // Triton's `default_model_filename`: the file under another name than the backend's.
        let named = default_model_filename(&folder, &pbtxt);
        let found = match &named {
            Some(file_name) => model_files
                .iter()
                .filter(|f| takes(f, file_name))
                .find_map(|f| find_named_file(&folder, file_name, f)),
            None => model_files.iter().find_map(|f| find_model_file(&folder, f)),
        }
        .or_else(|| {
            model_files
                .contains(&PIPELINE_FILE)
                .then(|| find_ensemble(&folder, &pbtxt))
                .flatten()
        });
        let Some((version, path, file)) = found else {
            // A Triton model of a kind sheaf does not run is listed, unavailable with the
            // reason, rather than left out as if it were not there.
            if let Some(unserved) = unserved_triton_model(&name, &folder, &pbtxt, model_files) {
                tracing::warn!(model = %name, reason = ?unserved.config.as_ref().err(), "a Triton model sheaf does not run");
                models.push(unserved);
                continue;
            }
            tracing::warn!(folder = %folder.display(), expected = ?model_files, "no model file in model folder; skipped");
            continue;
        };
        let mut config = read_config(&name, &folder, custom);
        let (version, path, older) = match &config {
            Ok(c) if file != PIPELINE_FILE => match &c.version_policy {
                Some(policy) => {
                    match pick_versions(&folder, named.as_deref().unwrap_or(file), policy) {
                        Ok(Some(picked)) => picked,
                        Ok(None) => (version, path, Vec::new()),
                        Err(e) => {
                            config = Err(e);
                            (version, path, Vec::new())
                        }
                    }
                }
                None => (version, path, Vec::new()),
            },
            _ => (version, path, Vec::new()),
        };
        models.push(RepoModel {
            name,
            version,
            path,
            file,
            config,
            older,
            uploaded: None,
        });
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

/// The version folders of `folder` that `policy` serves, and their model files: the newest
/// (version, file), and the others it names, oldest first. `None` for a folder without version
/// folders.
#[allow(clippy::type_complexity)]
fn pick_versions(
    folder: &Path,
    file: &str,
    policy: &crate::config::VersionPolicy,
) -> Result<Option<(String, PathBuf, Vec<(String, PathBuf)>)>, String> {
    let versions = model_versions(folder, file);
    if versions.is_empty() {
        return Ok(None);
    }
    let numbers: Vec<u64> = versions.iter().map(|(v, _)| *v).collect();
    let named = policy
        .named(&numbers)
        .map_err(|e| format!("{}: {e}", folder.display()))?;
    let mut served: Vec<(String, PathBuf)> = versions
        .into_iter()
        .filter(|(v, _)| named.contains(v))
        .map(|(v, path)| (v.to_string(), path))
        .collect();
    Ok(served.pop().map(|(v, path)| (v, path, served)))
}

/// The model's folder, given its file: the folder above a numbered version folder, else the
/// file's own folder. What a model keeps beside its versions (`warmup/`, `initial_state/`) is
/// there.
pub fn model_folder(model_file: &Path) -> &Path {
    let parent = model_file.parent().unwrap_or(Path::new("."));
    let versioned = parent
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.parse::<u64>().is_ok());
    match parent.parent() {
        Some(model) if versioned => model,
        _ => parent,
    }
}

/// Picks again the versions of `model` that serve, by `policy` (none: the newest alone,
/// Triton's default): for a load that brings a configuration of its own, whose
/// `version_policy` (or its absence) replaces the folder's. A model without version folders
/// has one version, and is left as it is.
pub fn repick_versions(
    model: &mut RepoModel,
    policy: Option<&crate::config::VersionPolicy>,
) -> Result<(), String> {
    let versioned = model
        .path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.parse::<u64>().is_ok());
    let (Some(folder), Some(file)) = (
        model.path.parent().and_then(Path::parent),
        model.path.file_name().and_then(|f| f.to_str()),
    ) else {
        return Ok(());
    };
    if !versioned {
        return Ok(());
    }
    let newest = crate::config::VersionPolicy::Latest { num_versions: 1 };
    if let Some((version, path, older)) = pick_versions(folder, file, policy.unwrap_or(&newest))? {
        model.version = version;
        model.path = path;
        model.older = older;
    }
    Ok(())
}

/// The Triton configuration file of the model folder `folder`: `configs/<custom>.pbtxt` when
/// the server names a custom configuration (Triton's `--model-config-name`) and the folder
/// has it, else `config.pbtxt` (which may not be there).
pub fn triton_config_path(folder: &Path, custom: Option<&str>) -> PathBuf {
    custom
        .map(|c| folder.join(CUSTOM_CONFIGS).join(format!("{c}.pbtxt")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| folder.join(TRITON_CONFIG_FILE))
}

/// The configuration of the model folder `folder`: its custom Triton configuration when
/// `custom` names one it has ([`triton_config_path`]), else its `config.yaml`, else its Triton
/// `config.pbtxt` (whose fields sheaf does not read are named in a warning), else the defaults.
/// A Python model with none starts, as under Triton, from an empty `config.pbtxt` that its
/// `auto_complete_config` fills (no `max_batch_size` until the model sets one).
pub fn read_config(name: &str, folder: &Path, custom: Option<&str>) -> Result<ModelConfig, String> {
    let read = |file: &Path| match std::fs::read_to_string(file) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", file.display())),
    };
    let pbtxt = triton_config_path(folder, custom);
    let at = |file: &Path, e: String| format!("{}: {e}", file.display());
    if pbtxt == folder.join(TRITON_CONFIG_FILE) {
        let yaml = folder.join(CONFIG_FILE);
        if let Some(text) = read(&yaml)? {
            return ModelConfig::from_yaml(&text).map_err(|e| at(&yaml, e));
        }
    }
    let text = match read(&pbtxt)? {
        Some(text) => text,
        None if holds_python_model(folder) => String::new(),
        None => return Ok(ModelConfig::default()),
    };
    let read = crate::pbtxt::model_config(&text).map_err(|e| at(&pbtxt, e))?;
    if !read.ignored.is_empty() {
        tracing::warn!(
            model = name,
            file = %pbtxt.display(),
            ignored = ?read.ignored,
            "config.pbtxt: sheaf does not read these fields; they are ignored"
        );
    }
    Ok(read.config)
}

/// The definition of the pipeline in `folder`, as [`scan`] finds it: its `pipeline.yaml`, or a
/// Triton ensemble's configuration; none when the folder holds another kind of model.
pub fn pipeline_definition(folder: &Path, custom: Option<&str>) -> Option<PathBuf> {
    find_model_file(folder, PIPELINE_FILE)
        .or_else(|| find_ensemble(folder, &triton_config_path(folder, custom)))
        .map(|(_, path, _)| path)
}

/// A Triton ensemble in `folder` (its Triton configuration `pbtxt` with `platform:
/// "ensemble"`, read as a pipeline): its version (the highest numeric version folder's, as
/// Triton's layout has one, else "1"), its configuration file, and [`PIPELINE_FILE`] as the
/// kind of model it is.
fn find_ensemble(folder: &Path, pbtxt: &Path) -> Option<(String, PathBuf, &'static str)> {
    let fields = crate::pbtxt::parse(&std::fs::read_to_string(pbtxt).ok()?).ok()?;
    let ensemble = fields.iter().any(|(name, value)| {
        name == "platform"
            && matches!(value, crate::pbtxt::Value::Text(t) | crate::pbtxt::Value::Word(t) if t == "ensemble")
    });
    if !ensemble {
        return None;
    }
    let version = highest_version_folder(folder)?;
    Some((version.to_string(), pbtxt.to_path_buf(), PIPELINE_FILE))
}

/// The highest numeric version folder of `folder` (1 when there is none), as Triton's layout
/// gives a model without a model file; None when `folder` cannot be read.
fn highest_version_folder(folder: &Path) -> Option<u64> {
    let versions = std::fs::read_dir(folder).ok()?;
    Some(
        versions
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or(1),
    )
}

/// A folder whose Triton configuration `pbtxt` names a platform or backend, with no model file
/// this server's backends read (a TorchScript `model.pt`, a TensorRT plan, a SavedModel...):
/// the model, with its configuration an error that says what it is and what to do, so that it
/// is listed as unavailable with that reason and its requests get it.
fn unserved_triton_model(
    name: &str,
    folder: &Path,
    pbtxt: &Path,
    model_files: &[&'static str],
) -> Option<RepoModel> {
    let path = pbtxt.to_path_buf();
    let fields = crate::pbtxt::parse(&std::fs::read_to_string(&path).ok()?).ok()?;
    let named = |field: &str| {
        fields.iter().find_map(|(n, v)| match v {
            crate::pbtxt::Value::Text(t) | crate::pbtxt::Value::Word(t) if n == field => {
                Some(t.clone())
            }
            _ => None,
        })
    };
    let kind = match (named("platform"), named("backend")) {
        (Some(platform), _) => format!("platform '{platform}'"),
        (None, Some(backend)) => format!("backend '{backend}'"),
        (None, None) => return None,
    };
    let version = highest_version_folder(folder)?;
    // A kind sheaf runs, whose file is missing; else a kind it does not run.
    let expected = match (named("platform").as_deref(), named("backend").as_deref()) {
        (Some("onnxruntime_onnx"), _) | (_, Some("onnxruntime")) => Some("model.onnx"),
        (_, Some("python")) => Some("model.py"),
        _ => None,
    };
    let reason = match expected {
        Some(file) => format!(
            "model '{name}': its config.pbtxt names {kind}, and there is no {file} in its \
             folder or a version folder"
        ),
        None => format!(
            "model '{name}': its config.pbtxt names {kind}, and its folder holds none of the \
             files sheaf runs ({}): sheaf runs ONNX models on ONNX Runtime, Python models, GGUF \
             language models and ensembles. Export the model to ONNX (model.onnx), or serve it \
             with a model.py that loads it (for TorchScript, torch.jit.load in a Triton Python \
             model)",
            model_files.join(", ")
        ),
    };
    Some(RepoModel {
        name: name.to_string(),
        version: version.to_string(),
        path,
        file: TRITON_CONFIG_FILE,
        config: Err(reason),
        older: Vec::new(),
        uploaded: None,
    })
}

/// Whether `folder` holds a `model.py`, in itself or in a version folder.
fn holds_python_model(folder: &Path) -> bool {
    const PYTHON_MODEL: &str = "model.py";
    folder.join(PYTHON_MODEL).is_file()
        || std::fs::read_dir(folder).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().join(PYTHON_MODEL).is_file())
        })
}

/// The model folders under `dir` (not hidden), with their names.
pub fn model_folders(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read model repository {}: {e}", dir.display()))?;
    Ok(entries
        .flatten()
        .map(|e| e.path())
        .filter(|folder| folder.is_dir())
        .filter_map(|folder| {
            let name = folder.file_name()?.to_str()?.to_string();
            (!name.starts_with('.')).then_some((name, folder))
        })
        .collect())
}

/// `file` in `dir` (a `*.ending` pattern: the first such file by name).
fn in_file(dir: &Path, file: &str) -> Option<PathBuf> {
    match file.strip_prefix('*') {
        None => Some(dir.join(file)).filter(|p| p.is_file()),
        Some(ending) => {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.ends_with(ending))
                })
                .collect();
            found.sort();
            found.into_iter().next()
        }
    }
}

/// The newest version and its model file of one model folder, for the file name `file`
/// (`*.ext`: the first file by name that ends with `.ext`); a folder without version folders
/// holds version 1 itself.
fn find_model_file(folder: &Path, file: &'static str) -> Option<(String, PathBuf, &'static str)> {
    find_named_file(folder, file, file)
}

/// As [`find_model_file`], for the file `file_name`, which the backend of `kind` (its model
/// file name) loads.
fn find_named_file(
    folder: &Path,
    file_name: &str,
    kind: &'static str,
) -> Option<(String, PathBuf, &'static str)> {
    if let Some((v, path)) = model_versions(folder, file_name).pop() {
        return Some((v.to_string(), path, kind));
    }
    in_file(folder, file_name).map(|flat| ("1".to_string(), flat, kind))
}

/// Whether the backend whose model file is `kind` (`model.onnx`, `*.gguf`) loads a file named
/// `file_name`: the same extension.
fn takes(kind: &str, file_name: &str) -> bool {
    kind != PIPELINE_FILE
        && kind
            .rsplit_once('.')
            .is_some_and(|(_, ext)| file_name.rsplit_once('.').is_some_and(|(_, e)| e == ext))
}

/// The `default_model_filename` a folder's Triton configuration `pbtxt` names (none for a
/// folder whose `config.yaml` is read, whose model files keep the backends' names).
fn default_model_filename(folder: &Path, pbtxt: &Path) -> Option<String> {
    if pbtxt == folder.join(TRITON_CONFIG_FILE) && folder.join(CONFIG_FILE).is_file() {
        return None;
    }
    let text = std::fs::read_to_string(pbtxt).ok()?;
    let fields = crate::pbtxt::parse(&text).ok()?;
    fields
        .iter()
        .find_map(|(name, value)| match (name.as_str(), value) {
            (
                "default_model_filename",
                crate::pbtxt::Value::Text(t) | crate::pbtxt::Value::Word(t),
            ) if !t.is_empty() && !t.contains('/') => Some(t.clone()),
            _ => None,
        })
}

/// The numeric version folders of `folder` that hold `file`, ascending, each with its file.
fn model_versions(folder: &Path, file: &str) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut versions: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u64>().ok()?;
            Some((v, in_file(&e.path(), file)?))
        })
        .collect();
    versions.sort();
    versions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_and_bad_configs() {
        let dir = std::env::temp_dir().join(format!("sheaf-repo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (folder, file) in [
            ("flat", "model.onnx"),
            ("versioned/1", "model.onnx"),
            ("versioned/3", "model.onnx"),
            ("versioned/2", "model.onnx"),
            ("badcfg", "model.onnx"),
            ("empty", "README"),
        ] {
            std::fs::create_dir_all(dir.join(folder)).unwrap();
            std::fs::write(dir.join(folder).join(file), b"x").unwrap();
        }
        std::fs::write(dir.join("badcfg/config.yaml"), "nonsense_key: 1\n").unwrap();
        std::fs::write(dir.join("flat/config.yaml"), "max_batch_size: 4\n").unwrap();

        std::fs::create_dir_all(dir.join("sim")).unwrap();
        std::fs::write(dir.join("sim/model.sim.yaml"), b"x").unwrap();
        // A pattern: the first matching file of the highest version.
        for file in [
            "llm/1/z.gguf",
            "llm/2/b.gguf",
            "llm/2/a.gguf",
            "llm/2/c.bin",
        ] {
            std::fs::create_dir_all(dir.join(file).parent().unwrap()).unwrap();
            std::fs::write(dir.join(file), b"x").unwrap();
        }
        let models = scan(&dir, &["model.onnx", "model.sim.yaml", "*.gguf"], None).unwrap();
        let names: Vec<_> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["badcfg", "flat", "llm", "sim", "versioned"]);
        assert_eq!(
            (models[2].file, models[2].version.as_str()),
            ("*.gguf", "2")
        );
        assert!(models[2].path.ends_with("llm/2/a.gguf"));
        let models: Vec<_> = models.into_iter().filter(|m| m.name != "llm").collect();
        assert_eq!(models[2].file, "model.sim.yaml");
        assert!(models[0]
            .config
            .as_ref()
            .unwrap_err()
            .contains("nonsense_key"));
        assert_eq!(models[1].version, "1");
        assert_eq!(
            models[1].config.as_ref().unwrap().max_batch_size,
            Some(crate::config::MaxBatchSize::Size(4))
        );
        assert_eq!(models[3].version, "3");
        assert!(models[3].path.ends_with("versioned/3/model.onnx"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_triton_model_of_a_kind_sheaf_does_not_run_is_listed_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("sheaf-unserved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, file, config) in [
            ("resnet", "1/model.pt", "platform: \"pytorch_libtorch\"\n"),
            ("engine", "2/model.plan", "backend: \"tensorrt\"\n"),
            ("lost", "1/other.bin", "backend: \"python\"\n"),
            ("plain", "1/model.bin", "max_batch_size: 8\n"),
        ] {
            let folder = dir.join(name);
            std::fs::create_dir_all(folder.join(file).parent().unwrap()).unwrap();
            std::fs::write(folder.join(file), b"x").unwrap();
            std::fs::write(folder.join(TRITON_CONFIG_FILE), config).unwrap();
        }
        let found = scan(&dir, &["model.onnx", "model.py"], None).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let reasons: Vec<(&str, &str, String)> = found
            .iter()
            .map(|m| {
                (
                    m.name.as_str(),
                    m.version.as_str(),
                    m.config.clone().unwrap_err(),
                )
            })
            .collect();
        // A folder whose config names no platform or backend is still skipped.
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert_eq!((reasons[0].0, reasons[0].1), ("engine", "2"));
        assert!(
            reasons[0].2.contains("backend 'tensorrt'"),
            "{}",
            reasons[0].2
        );
        assert_eq!(reasons[1].0, "lost");
        assert!(reasons[1].2.contains("no model.py"), "{}", reasons[1].2);
        assert_eq!(reasons[2].0, "resnet");
        assert!(
            reasons[2].2.contains("platform 'pytorch_libtorch'"),
            "{}",
            reasons[2].2
        );
        assert!(
            reasons[2].2.contains("Export the model to ONNX"),
            "{}",
            reasons[2].2
        );
    }

    #[test]
    fn a_default_model_filename_names_the_file_that_serves() {
        let dir = std::env::temp_dir().join(format!("sheaf-named-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (file, text) in [
            ("renamed/1/resnet.onnx", "x"),
            ("renamed/2/resnet.onnx", "x"),
            ("renamed/2/model.onnx", "x"),
            (
                "renamed/config.pbtxt",
                "default_model_filename: \"resnet.onnx\"\n",
            ),
            ("script/1/my_model.py", "x"),
            (
                "script/config.pbtxt",
                "backend: \"python\"\ndefault_model_filename: \"my_model.py\"\n",
            ),
            ("missing/1/model.onnx", "x"),
            (
                "missing/config.pbtxt",
                "default_model_filename: \"other.onnx\"\n",
            ),
        ] {
            std::fs::create_dir_all(dir.join(file).parent().unwrap()).unwrap();
            std::fs::write(dir.join(file), text).unwrap();
        }
        let models = scan(&dir, &["model.onnx", "model.py"], None).unwrap();
        let names: Vec<_> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["renamed", "script"],
            "the file it names is not there: skipped"
        );
        assert_eq!(
            (models[0].file, models[0].version.as_str()),
            ("model.onnx", "2")
        );
        assert!(models[0].path.ends_with("renamed/2/resnet.onnx"));
        assert_eq!(models[1].file, "model.py");
        assert!(models[1].path.ends_with("script/1/my_model.py"));
        assert!(takes("*.gguf", "a.gguf") && !takes("model.onnx", "a.py"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_version_policy_picks_the_folder_that_serves() {
        let dir = std::env::temp_dir().join(format!("sheaf-versions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let policies = [
            ("newest", None),
            (
                "pinned",
                Some("version_policy: {specific: {versions: [2]}}\n"),
            ),
            ("two", Some("version_policy: {latest: {num_versions: 2}}\n")),
            ("every", Some("version_policy: {all: {}}\n")),
            (
                "gone",
                Some("version_policy: {specific: {versions: [7]}}\n"),
            ),
        ];
        for (name, config) in policies {
            for v in ["1", "2", "3"] {
                std::fs::create_dir_all(dir.join(name).join(v)).unwrap();
                std::fs::write(dir.join(name).join(v).join("model.onnx"), b"x").unwrap();
            }
            if let Some(config) = config {
                std::fs::write(dir.join(name).join("config.yaml"), config).unwrap();
            }
        }
        // Triton's spelling, in a config.pbtxt.
        for v in ["1", "4"] {
            std::fs::create_dir_all(dir.join("triton").join(v)).unwrap();
            std::fs::write(dir.join("triton").join(v).join("model.onnx"), b"x").unwrap();
        }
        std::fs::write(
            dir.join("triton/config.pbtxt"),
            "version_policy: { specific: { versions: [ 1 ] } }\n",
        )
        .unwrap();
        let models = scan(&dir, &["model.onnx"], None).unwrap();
        let served = |name: &str| {
            let m = models.iter().find(|m| m.name == name).unwrap();
            (m.version.clone(), m.path.clone(), m.config.clone())
        };
        assert_eq!(served("newest").0, "3");
        let (version, path, config) = served("pinned");
        assert!(config.is_ok());
        assert_eq!(version, "2");
        assert!(path.ends_with("pinned/2/model.onnx"));
        // Several named: the newest first, the others beside it, oldest first.
        let older = |name: &str| {
            let m = models.iter().find(|m| m.name == name).unwrap();
            m.older.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>()
        };
        assert_eq!(served("two").0, "3");
        assert_eq!(older("two"), ["2"]);
        assert_eq!(served("every").0, "3");
        assert_eq!(older("every"), ["1", "2"]);
        assert!(models.iter().find(|m| m.name == "every").unwrap().older[0]
            .1
            .ends_with("every/1/model.onnx"));
        assert!(older("newest").is_empty() && older("pinned").is_empty());
        // A load's own policy picks again; none is the newest alone.
        let mut every = models.iter().find(|m| m.name == "every").unwrap().clone();
        let two = crate::config::VersionPolicy::Latest { num_versions: 2 };
        repick_versions(&mut every, Some(&two)).unwrap();
        assert_eq!(every.version, "3");
        assert_eq!(every.older.len(), 1);
        repick_versions(&mut every, None).unwrap();
        assert!(every.version == "3" && every.older.is_empty());
        let gone = crate::config::VersionPolicy::Specific { versions: vec![7] };
        assert!(repick_versions(&mut every, Some(&gone)).is_err());
        let (version, path, _) = served("triton");
        assert_eq!(version, "1");
        assert!(path.ends_with("triton/1/model.onnx"));
        let e = served("gone").2.unwrap_err();
        assert!(e.contains("names no version the folder holds"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_python_model_without_a_config_file_starts_from_an_empty_pbtxt() {
        let dir = std::env::temp_dir().join(format!("sheaf-bare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let python = dir.join("bare");
        std::fs::create_dir_all(python.join("1")).unwrap();
        std::fs::write(python.join("1").join("model.py"), "").unwrap();
        let config = read_config("bare", &python, None).unwrap();
        assert_eq!(
            config.max_batch_size, None,
            "the model's auto_complete_config sets it"
        );
        let json = crate::model_json::model_json(&config);
        assert_eq!(json["max_batch_size"], 0, "{json}");
        assert_eq!(json["input"], serde_json::json!([]), "{json}");
        // Any other model keeps sheaf's defaults.
        let onnx = dir.join("net");
        std::fs::create_dir_all(onnx.join("1")).unwrap();
        std::fs::write(onnx.join("1").join("model.onnx"), "").unwrap();
        let config = read_config("net", &onnx, None).unwrap();
        assert!(config.triton.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_custom_configuration_is_read_over_the_folder_s_own_where_it_is() {
        use crate::config::MaxBatchSize;
        let dir = std::env::temp_dir().join(format!("sheaf-custom-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let folder = dir.join("net");
        std::fs::create_dir_all(folder.join("1")).unwrap();
        std::fs::create_dir_all(folder.join(CUSTOM_CONFIGS)).unwrap();
        std::fs::write(folder.join("1").join("model.onnx"), "").unwrap();
        std::fs::write(folder.join(CONFIG_FILE), "max_batch_size: 8\n").unwrap();
        std::fs::write(
            folder.join(CUSTOM_CONFIGS).join("h100.pbtxt"),
            "max_batch_size: 2\n",
        )
        .unwrap();
        let size = |custom| read_config("net", &folder, custom).unwrap().max_batch_size;
        assert_eq!(size(None), Some(MaxBatchSize::Size(8)));
        assert_eq!(size(Some("h100")), Some(MaxBatchSize::Size(2)));
        // A name the folder has no file for: its own configuration.
        assert_eq!(size(Some("a100")), Some(MaxBatchSize::Size(8)));
        assert_eq!(
            triton_config_path(&folder, Some("a100")),
            folder.join(TRITON_CONFIG_FILE)
        );
        // A bad custom file fails the model, naming the file.
        std::fs::write(
            folder.join(CUSTOM_CONFIGS).join("h100.pbtxt"),
            "max_batch_size: x\n",
        )
        .unwrap();
        let e = read_config("net", &folder, Some("h100")).unwrap_err();
        assert!(e.contains("configs/h100.pbtxt"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_repository_is_an_error() {
        let err = scan(Path::new("/nonexistent/repo"), &["model.onnx"], None).unwrap_err();
        assert!(err.contains("/nonexistent/repo"), "{err}");
    }
}
