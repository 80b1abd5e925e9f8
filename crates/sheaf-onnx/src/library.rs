//! Finding `libonnxruntime.so` without asking the user for environment variables.

use std::path::{Path, PathBuf};

use sheaf_backend::BackendError;

/// Environment variable that names the library file explicitly (the `ort` crate's own name).
pub const ENV_VAR: &str = "ORT_DYLIB_PATH";

/// Returns the library to load: `explicit` if given, else `$ORT_DYLIB_PATH`, else the first
/// `.venv/lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so*` found in the folders
/// above the running executable or the working directory.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, BackendError> {
    if let Some(path) = explicit {
        return existing(path, "--onnxruntime-lib");
    }
    if let Some(path) = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
        return existing(Path::new(&path), ENV_VAR);
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    for root in &roots {
        if let Some(found) = in_venv(&root.join(".venv")) {
            return Ok(found);
        }
    }
    Err(BackendError::Library(format!(
        "ONNX Runtime library not found: no .venv with the onnxruntime wheel above the sheaf \
         executable or the working directory. Run scripts/setup.sh (it installs \
         onnxruntime=={} into .venv/), or set {ENV_VAR} to the path of libonnxruntime.so.{}",
        crate::ORT_VERSION,
        crate::ORT_VERSION
    )))
}

fn existing(path: &Path, source: &str) -> Result<PathBuf, BackendError> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(BackendError::Library(format!(
            "ONNX Runtime library {} (from {source}) does not exist; run scripts/setup.sh or \
             point {source} at libonnxruntime.so.{}",
            path.display(),
            crate::ORT_VERSION
        )))
    }
}

/// The ONNX Runtime library inside a Python virtual environment, if it holds the wheel.
fn in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python"))
        })
        .collect();
    pythons.sort();
    pythons.into_iter().find_map(|py| {
        let capi = py.join("site-packages/onnxruntime/capi");
        let mut libs: Vec<PathBuf> = std::fs::read_dir(capi)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libonnxruntime.so"))
            })
            .collect();
        // The versioned file (libonnxruntime.so.1.31.1) sorts last; it is the one the wheel ships.
        libs.sort();
        libs.pop()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_missing_path_names_the_fix() {
        let err = locate(Some(Path::new("/nonexistent/libonnxruntime.so"))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/libonnxruntime.so"), "{msg}");
        assert!(msg.contains("scripts/setup.sh"), "{msg}");
    }

    #[test]
    fn finds_the_wheel_layout_in_a_venv() {
        let dir = std::env::temp_dir().join(format!("sheaf-venv-{}", std::process::id()));
        let capi = dir.join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"").unwrap();
        std::fs::write(capi.join("libonnxruntime_providers_shared.so"), b"").unwrap();
        let found = in_venv(&dir.join(".venv")).unwrap();
        assert!(found.ends_with("libonnxruntime.so.1.31.1"), "{found:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
