//! A model's own Python environment (Triton's `EXECUTION_ENV_PATH` parameter): a folder holding
//! an interpreter and its packages (a virtual environment, an unpacked conda environment), or
//! that folder packed as `.tar.gz` or `.tar` (what `conda-pack` writes), so that models with
//! conflicting dependencies serve side by side.
//!
//! The value may start with `$$TRITON_MODEL_DIRECTORY` (the model's folder), as in Triton's
//! examples; a relative path is taken from the model's folder. A packed environment is unpacked
//! once into the temporary folder, under a name drawn from its path, size and modification time
//! (so a changed file is unpacked afresh, and instances and reloads share one copy). The model's
//! process runs the environment's `bin/python3` (or `bin/python`), with its `bin` first on
//! `PATH` and its `lib` first on `LD_LIBRARY_PATH`, as activating it would.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sheaf_backend::BackendError;

/// The parameter that names the environment.
pub const PARAMETER: &str = "EXECUTION_ENV_PATH";

/// What the value's `$$TRITON_MODEL_DIRECTORY` stands for.
const MODEL_DIRECTORY: &str = "$$TRITON_MODEL_DIRECTORY";

/// Held while a packed environment is unpacked: instances of a model load in parallel.
static UNPACKING: Mutex<()> = Mutex::new(());

/// A model's environment, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    /// The environment's folder (unpacked, for a packed one).
    pub root: PathBuf,
    /// Its interpreter.
    pub python: PathBuf,
}

impl Environment {
    /// The environment `value` names for the model whose folder is `model_dir`, unpacked when
    /// it is packed.
    pub fn open(value: &str, model_dir: &Path) -> Result<Environment, BackendError> {
        let fail = |why: String| BackendError::Load(format!("{PARAMETER} '{value}': {why}"));
        let written = value.replace(MODEL_DIRECTORY, &model_dir.to_string_lossy());
        let path = model_dir.join(written);
        let root = if path.is_dir() {
            path
        } else if path.is_file() {
            unpack(&path).map_err(fail)?
        } else {
            return Err(fail(format!(
                "{} is neither a folder nor a file",
                path.display()
            )));
        };
        let python = ["bin/python3", "bin/python"]
            .iter()
            .map(|p| root.join(p))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                fail(format!(
                    "{} holds no bin/python3 or bin/python: an environment is a virtual or \
                     conda environment's folder, or one packed as .tar.gz or .tar",
                    root.display()
                ))
            })?;
        Ok(Environment { root, python })
    }

    /// `PATH` and `LD_LIBRARY_PATH` with the environment's `bin` and `lib` first.
    pub fn variables(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        [("PATH", "bin"), ("LD_LIBRARY_PATH", "lib")]
            .into_iter()
            .map(|(name, dir)| {
                let mut paths = vec![self.root.join(dir)];
                if let Some(old) = std::env::var_os(name) {
                    paths.extend(std::env::split_paths(&old));
                }
                let joined = std::env::join_paths(paths).unwrap_or_default();
                (name, joined)
            })
            .collect()
    }
}

/// Unpacks the packed environment `file` (once: a copy unpacked before is reused) and returns
/// its folder.
fn unpack(file: &Path) -> Result<PathBuf, String> {
    let name = file.to_string_lossy();
    let gzip = name.ends_with(".tar.gz") || name.ends_with(".tgz");
    if !gzip && !name.ends_with(".tar") {
        return Err(format!(
            "{name}: a packed environment is a .tar.gz (as conda-pack writes it) or a .tar"
        ));
    }
    let meta = std::fs::metadata(file).map_err(|e| format!("{name}: {e}"))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let absolute = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
    let key = format!("{}\n{}\n{modified}", absolute.display(), meta.len());
    let hash = crate::interpreter::name_hash(key.bytes());
    let root = std::env::temp_dir().join(format!("sheaf-env-{hash:016x}"));
    let _alone = UNPACKING.lock().unwrap_or_else(|e| e.into_inner());
    if root.is_dir() {
        return Ok(root);
    }
    // Unpacked aside and renamed, so that no process ever sees half an environment.
    let aside = root.with_extension(format!("{}.partial", std::process::id()));
    let _ = std::fs::remove_dir_all(&aside);
    let opened = File::open(file).map_err(|e| format!("{name}: {e}"))?;
    let unpacked = match gzip {
        true => tar::Archive::new(flate2::read::GzDecoder::new(opened)).unpack(&aside),
        false => tar::Archive::new(opened).unpack(&aside),
    };
    if let Err(e) = unpacked {
        let _ = std::fs::remove_dir_all(&aside);
        return Err(format!("cannot unpack {name}: {e}"));
    }
    if let Err(e) = std::fs::rename(&aside, &root) {
        let _ = std::fs::remove_dir_all(&aside);
        // Another server unpacked the same file meanwhile.
        if !root.is_dir() {
            return Err(format!(
                "cannot move the unpacked {name} to {}: {e}",
                root.display()
            ));
        }
    }
    tracing::info!(file = %name, folder = %root.display(), "Python environment unpacked");
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sheaf-envtest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A folder with `bin/python3` (a script) and `lib/`.
    fn environment(at: &Path) {
        std::fs::create_dir_all(at.join("bin")).unwrap();
        std::fs::create_dir_all(at.join("lib")).unwrap();
        std::fs::write(at.join("bin/python3"), "#!/bin/sh\n").unwrap();
        let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(at.join("bin/python3"), executable).unwrap();
    }

    #[test]
    fn a_folder_or_a_packed_folder_gives_its_interpreter() {
        let model = scratch("model");
        environment(&model.join("env"));
        let env = Environment::open("$$TRITON_MODEL_DIRECTORY/env", &model).unwrap();
        assert_eq!(env.python, model.join("env/bin/python3"));
        let relative = Environment::open("env", &model).unwrap();
        assert_eq!(relative, env);
        let vars = env.variables();
        let path: Vec<PathBuf> = std::env::split_paths(&vars[0].1).collect();
        assert_eq!((vars[0].0, &path[0]), ("PATH", &model.join("env/bin")));
        assert_eq!(vars[1].0, "LD_LIBRARY_PATH");

        // Packed as conda-pack packs: the environment's files at the archive's top.
        let packed = model.join("env.tar.gz");
        {
            let gz = flate2::write::GzEncoder::new(
                File::create(&packed).unwrap(),
                flate2::Compression::fast(),
            );
            let mut tar = tar::Builder::new(gz);
            tar.append_dir_all(".", model.join("env")).unwrap();
            tar.into_inner().unwrap().finish().unwrap();
        }
        let first = Environment::open("$$TRITON_MODEL_DIRECTORY/env.tar.gz", &model).unwrap();
        assert!(first.python.ends_with("bin/python3"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&first.python).unwrap().permissions(),
        );
        assert_eq!(mode & 0o111, 0o111, "the interpreter stays executable");
        assert!(first.root.starts_with(std::env::temp_dir()));
        assert_ne!(first.root, model.join("env"));
        // Unpacked once: the second open finds the same copy.
        let again = Environment::open("env.tar.gz", &model).unwrap();
        assert_eq!(again, first);
        std::fs::remove_dir_all(&first.root).unwrap();
        std::fs::remove_dir_all(&model).unwrap();
    }

    #[test]
    fn what_is_not_an_environment_says_why() {
        let model = scratch("bad");
        std::fs::create_dir_all(model.join("empty")).unwrap();
        std::fs::write(model.join("env.zip"), b"PK").unwrap();
        std::fs::write(model.join("broken.tar.gz"), b"not gzip").unwrap();
        for (value, says) in [
            ("gone", "is neither a folder nor a file"),
            ("empty", "holds no bin/python3 or bin/python"),
            ("env.zip", "a packed environment is a .tar.gz"),
            ("broken.tar.gz", "cannot unpack"),
        ] {
            let e = Environment::open(value, &model).unwrap_err().to_string();
            assert!(
                e.contains(&format!("EXECUTION_ENV_PATH '{value}': ")),
                "{e}"
            );
            assert!(e.contains(says), "{e}");
        }
        std::fs::remove_dir_all(&model).unwrap();
    }
}
