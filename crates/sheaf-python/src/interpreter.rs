//! Which Python runs a model, and where the runner's own modules live.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sheaf_backend::BackendError;

/// The runner each model process starts with.
const RUNNER: &str = include_str!("../python/sheaf_runner.py");
/// Triton's `triton_python_backend_utils`, as sheaf serves it.
const PB_UTILS: &str = include_str!("../python/triton_python_backend_utils.py");

/// The interpreter for a model: `configured` (the model's `python:`; a bare name is looked up
/// on PATH, a relative path is taken from the model's folder), else `server` (`--python`), else
/// the first `.venv/bin/python` above the running executable or the working directory, else
/// `python3`.
pub fn resolve(configured: Option<&Path>, server: Option<&Path>, model_dir: &Path) -> PathBuf {
    if let Some(p) = configured {
        if p.components().count() > 1 && p.is_relative() {
            return model_dir.join(p);
        }
        return p.to_path_buf();
    }
    if let Some(p) = server {
        return p.to_path_buf();
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    roots
        .iter()
        .map(|r| r.join(".venv/bin/python"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The folder holding the runner and `triton_python_backend_utils.py`, written once per
/// process into a folder named after their content (so that servers of different versions
/// never share one).
pub fn runner_dir() -> Result<&'static Path, BackendError> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let hash = name_hash(RUNNER.bytes().chain(PB_UTILS.bytes()));
        let dir = std::env::temp_dir().join(format!("sheaf-python-{hash:016x}"));
        write_runner(&dir)
            .map_err(|e| format!("cannot write the Python runner into {}: {e}", dir.display()))?;
        Ok(dir)
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(|e| BackendError::Load(e.clone()))
}

/// A stable 64-bit hash (FNV-1a) of `bytes`, to name folders after what they hold.
pub(crate) fn name_hash(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf29ce484222325, |hash, b| {
        (hash ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn write_runner(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in [
        ("sheaf_runner.py", RUNNER),
        ("triton_python_backend_utils.py", PB_UTILS),
    ] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|t| t == text) {
            continue;
        }
        // Written aside and renamed, so that a process starting meanwhile never reads half.
        let aside = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&aside, text)?;
        std::fs::rename(&aside, &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_setting_wins_then_the_servers() {
        let dir = Path::new("/models/m");
        assert_eq!(
            resolve(
                Some(Path::new("python3.12")),
                Some(Path::new("/usr/bin/python3")),
                dir
            ),
            PathBuf::from("python3.12")
        );
        assert_eq!(
            resolve(Some(Path::new("env/bin/python")), None, dir),
            PathBuf::from("/models/m/env/bin/python")
        );
        assert_eq!(
            resolve(None, Some(Path::new("/usr/bin/python3")), dir),
            PathBuf::from("/usr/bin/python3")
        );
    }

    #[test]
    fn the_runner_is_written_once() {
        let dir = runner_dir().unwrap();
        assert!(dir.join("sheaf_runner.py").is_file());
        assert!(dir.join("triton_python_backend_utils.py").is_file());
        assert_eq!(runner_dir().unwrap(), dir);
    }
}
