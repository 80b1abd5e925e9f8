//! The `poll` control mode: the repository looked at again every so often, as Triton's
//! `--model-control-mode=poll` with `--repository-poll-secs` does. A model whose folder appears
//! loads, a model whose folder changed (any file's size or modification time, any file added
//! or removed) loads again while the one before serves (the reload of [`super::lifecycle`]),
//! and a model whose folder is gone unloads once its admitted requests are answered and leaves
//! the index. A model whose load failed loads again only when its folder changes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::{ModelManager, ModelStatus};
use crate::repository::RepoModel;

/// The most files of one model's folder a fingerprint reads; past it, the rest are not seen.
const MOST_FILES: usize = 10_000;
/// The deepest a fingerprint looks below a model's folder.
const DEEPEST: usize = 8;

impl ModelManager {
    /// Starts the task that looks at the repository every `every` (the `poll` control mode),
    /// from the folders as they are now.
    pub fn spawn_repository_poll(self: &Arc<Self>, every: Duration) {
        let manager = Arc::downgrade(self);
        let mut seen = match self.scan() {
            Ok(found) => fingerprints(self, &found),
            Err(_) => HashMap::new(),
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(m) = manager.upgrade() else { return };
                m.poll_once(&mut seen).await;
            }
        });
    }

    /// One look at the repository: loads what was added or changed since `seen`, unloads what
    /// was removed, and keeps the fingerprints of what is there now.
    async fn poll_once(&self, seen: &mut HashMap<String, u64>) {
        let found = match self.scan() {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "repository poll: the repository cannot be read; nothing changes");
                return;
            }
        };
        let now = fingerprints(self, &found);
        for (name, print) in &now {
            let change = match seen.get(name) {
                None => "added to",
                Some(before) if before != print => "changed in",
                Some(_) => continue,
            };
            tracing::info!(model = %name, "repository poll: the model was {change} the repository; loading it");
            if let Err(e) = self.load_one(name, None).await {
                tracing::warn!(model = %name, error = %e, "repository poll: the model did not load");
            }
        }
        let removed: Vec<String> = seen
            .keys()
            .filter(|name| !now.contains_key(*name))
            .cloned()
            .collect();
        for name in removed {
            tracing::info!(model = %name, "repository poll: the model was removed from the repository; unloading it");
            match self.unload_for(&name, "removed from the repository").await {
                Ok(()) => {}
                Err(e) if e.kind == crate::ErrorKind::ModelNotFound => {}
                // Not loaded (failed, or never loaded): nothing to unload.
                Err(e) => {
                    tracing::debug!(model = %name, error = %e, "repository poll: not unloaded")
                }
            }
            let mut models = self.write();
            if models.get(&name).is_some_and(|e| {
                !matches!(
                    e.status,
                    ModelStatus::Ready(_) | ModelStatus::Loading { .. }
                )
            }) {
                models.remove(&name);
            }
        }
        *seen = now;
    }
}

/// Each found model's fingerprint: its folder's files (path, size, modification time).
fn fingerprints(manager: &ModelManager, found: &[RepoModel]) -> HashMap<String, u64> {
    let dirs = manager.repositories();
    found
        .iter()
        .map(|m| {
            let folder = dirs
                .iter()
                .map(|d| d.join(&m.name))
                .find(|f| f.is_dir())
                .or_else(|| m.path.parent().map(Path::to_path_buf));
            let print = folder.map_or(0, |f| fingerprint(&f));
            (m.name.clone(), print)
        })
        .collect()
}

/// A hash of the files below `folder`: each one's path, size and modification time, in name
/// order.
pub(crate) fn fingerprint(folder: &Path) -> u64 {
    let mut files = Vec::new();
    walk(folder, folder, 0, &mut files);
    files.sort();
    let mut hasher = DefaultHasher::new();
    files.hash(&mut hasher);
    hasher.finish()
}

fn walk(root: &Path, at: &Path, depth: usize, files: &mut Vec<(String, u64, u128)>) {
    if depth > DEEPEST {
        return;
    }
    let Ok(entries) = std::fs::read_dir(at) else {
        return;
    };
    for entry in entries.flatten() {
        if files.len() >= MOST_FILES {
            return;
        }
        let path = entry.path();
        // Links are followed: a repository of links to model files is common.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(root, &path, depth + 1, files);
            continue;
        }
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let name = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        files.push((name, meta.len(), modified));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder removed when the test ends.
    struct Folder(std::path::PathBuf);

    impl Folder {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_folder_s_fingerprint_changes_with_its_files() {
        let root = std::env::temp_dir().join(format!("sheaf-poll-{}", std::process::id()));
        let dir = Folder(root);
        std::fs::create_dir_all(dir.path().join("1")).unwrap();
        std::fs::write(dir.path().join("1/model.onnx"), b"abc").unwrap();
        let first = fingerprint(dir.path());
        assert_eq!(fingerprint(dir.path()), first, "nothing changed");
        // Another size.
        std::fs::write(dir.path().join("1/model.onnx"), b"abcd").unwrap();
        let grown = fingerprint(dir.path());
        assert_ne!(grown, first);
        // A file added, in a new version folder.
        std::fs::create_dir_all(dir.path().join("2")).unwrap();
        std::fs::write(dir.path().join("2/model.onnx"), b"abcd").unwrap();
        let added = fingerprint(dir.path());
        assert_ne!(added, grown);
        // And removed again.
        std::fs::remove_dir_all(dir.path().join("2")).unwrap();
        assert_ne!(fingerprint(dir.path()), added);
        // The same size, a later modification time.
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join("1/model.onnx"))
            .unwrap();
        let before = fingerprint(dir.path());
        file.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
            .unwrap();
        assert_ne!(fingerprint(dir.path()), before);
    }
}
