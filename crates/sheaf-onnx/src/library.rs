//! Finding `libonnxruntime.so`, and the CUDA libraries its GPU build needs, without asking the
//! user for environment variables.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

/// The CUDA 13 and cuDNN 9 libraries that ONNX Runtime's CUDA provider links against, in an
/// order where each one's own needs come first.
const CUDA_LIBRARIES: [&str; 9] = [
    "libcudart.so.13",
    "libnvJitLink.so.13",
    "libnvrtc.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcufft.so.12",
    "libcurand.so.10",
    "libcudnn.so.9",
    "libcudnn_graph.so.9",
];

/// Makes the CUDA libraries that `scripts/setup.sh --gpu` installs beside ONNX Runtime (the
/// PyPI `nvidia-*` wheels, under `site-packages/nvidia/*/lib/`) visible to its CUDA provider:
/// each one found there is loaded once, globally, so that the provider's own load finds it
/// already in the process, with no `LD_LIBRARY_PATH`. Libraries not found there are left to the
/// system's search path. Returns the files loaded.
pub fn preload_cuda(onnxruntime: &Path) -> &'static [PathBuf] {
    static LOADED: OnceLock<Vec<PathBuf>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let Some(site) = onnxruntime.ancestors().nth(3) else {
            return Vec::new();
        };
        let dirs: Vec<PathBuf> = std::fs::read_dir(site.join("nvidia"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path().join("lib")))
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        let mut loaded = Vec::new();
        for name in CUDA_LIBRARIES {
            let Some(path) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) else {
                continue;
            };
            let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
            // SAFETY: these are the NVIDIA runtime libraries, whose initialisers only set up
            // their own state; they stay loaded for the life of the process.
            match unsafe { libloading::os::unix::Library::open(Some(&path), flags) } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    loaded.push(path);
                }
                Err(e) => tracing::warn!(library = %path.display(), error = %e, "cannot preload a CUDA library"),
            }
        }
        tracing::info!(count = loaded.len(), from = %site.join("nvidia").display(), "CUDA libraries preloaded");
        loaded
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

    #[test]
    fn cuda_libraries_beside_the_runtime_are_preloaded() {
        // A real shared library (the wheel's dependency-free provider bridge) stands in for the
        // CUDA runtime in a venv laid out as the nvidia-* wheels lay it out.
        let real = locate(None).expect("run scripts/setup.sh");
        let bridge = real.with_file_name("libonnxruntime_providers_shared.so");
        let dir = std::env::temp_dir().join(format!("sheaf-cuda-{}", std::process::id()));
        let site = dir.join("lib/python3.12/site-packages");
        let capi = site.join("onnxruntime/capi");
        let cuda = site.join("nvidia/cu13/lib");
        std::fs::create_dir_all(&capi).unwrap();
        std::fs::create_dir_all(&cuda).unwrap();
        std::fs::copy(&bridge, cuda.join("libcudart.so.13")).unwrap();
        let loaded = preload_cuda(&capi.join("libonnxruntime.so.1.31.1"));
        assert_eq!(loaded, [cuda.join("libcudart.so.13")]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
