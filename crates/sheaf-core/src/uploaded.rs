//! A model's files sent with its load request (Triton's load with `file:<path>` parameters):
//! written into a folder of their own, laid out as a model folder (`1/model.onnx`, `1/model.py`,
//! a tokenizer beside them...), from which the model loads in place of its repository folder.
//! The folder lives as long as something holds it: the model's repository entry and each load
//! made from it, so that a model being replaced finishes its requests with its files still
//! there; it is removed when the last holder goes.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::InferError;

/// The folder one load request's files were written to; removed when dropped.
#[derive(Debug)]
pub struct Uploaded {
    /// The folder made for this load, holding the model's folder (named after the model).
    root: PathBuf,
}

impl Uploaded {
    /// Writes `files` (each a path inside the model's folder, and its bytes) into a new folder
    /// for the model `name`. A path that is not plain (absolute, empty, `..`) is an error
    /// naming it, before anything is written.
    pub fn write(name: &str, files: &[(String, Vec<u8>)]) -> Result<Uploaded, InferError> {
        let mut parts = Path::new(name).components();
        let one_folder = matches!(
            (parts.next(), parts.next()),
            (Some(Component::Normal(_)), None)
        );
        if !one_folder || name.contains(['/', '\\']) {
            return Err(InferError::invalid(format!(
                "model '{}': a model loaded from files needs a name that is one folder's (no \
                 '/', '\\' or '..')",
                crate::clip(name)
            )));
        }
        for (path, _) in files {
            let plain = !path.is_empty()
                && Path::new(path)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)));
            if !plain {
                return Err(InferError::invalid(format!(
                    "load parameter 'file:{}': give a path inside the model's folder, such as \
                     file:1/model.onnx",
                    crate::clip(path)
                )));
            }
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "sheaf-load-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // Held from here: a write that fails removes what was written.
        let uploaded = Uploaded { root };
        let folder = uploaded.folder(name);
        for (path, bytes) in files {
            let file = folder.join(path);
            let written = file
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&file, bytes));
            written.map_err(|e| {
                InferError::internal(format!(
                    "cannot write the load's file '{}': {e}",
                    crate::clip(path)
                ))
            })?;
        }
        Ok(uploaded)
    }

    /// The folders the repository is read from for these files: the root, whose one model
    /// folder is `name`'s.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn folder(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

impl Drop for Uploaded {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(folder = %self.root.display(), error = %e, "a loaded model's uploaded files could not be removed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_as_a_model_folder_and_removed_with_the_last_holder() {
        let files = vec![
            ("1/model.onnx".to_string(), b"onnx".to_vec()),
            ("labels.txt".to_string(), b"a\nb\n".to_vec()),
        ];
        let uploaded = Uploaded::write("net", &files).unwrap();
        let folder = uploaded.root().join("net");
        assert_eq!(std::fs::read(folder.join("1/model.onnx")).unwrap(), b"onnx");
        assert_eq!(std::fs::read(folder.join("labels.txt")).unwrap(), b"a\nb\n");
        let held = std::sync::Arc::new(uploaded);
        let second = held.clone();
        drop(held);
        assert!(folder.is_dir());
        drop(second);
        assert!(!folder.exists());
        for name in ["..", "a/b", "", "/tmp", "."] {
            let e = Uploaded::write(name, &files).unwrap_err();
            assert!(
                e.message.contains("needs a name that is one folder's"),
                "{name}: {}",
                e.message
            );
        }
        for bad in ["../x", "/etc/passwd", "", "1/../../x"] {
            let e = Uploaded::write("net", &[(bad.to_string(), Vec::new())]).unwrap_err();
            assert!(
                e.message.contains("give a path inside the model's folder"),
                "{bad}: {}",
                e.message
            );
        }
    }
}
