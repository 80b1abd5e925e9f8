//! Repositories registered while the server runs (Triton's repository registration, which
//! Amazon SageMaker's multi-model endpoints use): a folder of model folders whose models join
//! the server's, some under names the registration gives in place of their folders' names, until
//! it is unregistered. They are read after the server's own repositories, and load and unload
//! through the repository API as theirs do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{ModelManager, ModelStatus};
use crate::InferError;

/// One registered repository.
#[derive(Debug, Clone)]
pub(super) struct Registered {
    pub(super) dir: PathBuf,
    /// Folder name → the name its model serves under; other folders keep their names.
    pub(super) names: BTreeMap<String, String>,
}

impl ModelManager {
    pub(super) fn registered(&self) -> Vec<Registered> {
        self.registered
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Adds the repository `dir`, its folders named in `names` serving under the names given
    /// there, and returns the names of the models it adds. A folder registered already, a
    /// folder `names` names that `dir` lacks, and a model name the server has already are
    /// errors, before anything changes. Only where the repository API may load models.
    pub fn register_repository(
        &self,
        dir: &Path,
        names: BTreeMap<String, String>,
    ) -> Result<Vec<String>, InferError> {
        self.check_control()?;
        let folders = crate::repository::model_folders(dir).map_err(InferError::invalid)?;
        if let Some(missing) = names
            .keys()
            .find(|f| !folders.iter().any(|(name, _)| name == *f))
        {
            return Err(InferError::invalid(format!(
                "{} has no model folder '{}'",
                dir.display(),
                crate::clip(missing)
            )));
        }
        let adds: Vec<String> = folders
            .iter()
            .map(|(folder, _)| names.get(folder).unwrap_or(folder).clone())
            .collect();
        // The names the server has: its repositories' (and the registered ones'), and the
        // entries it holds (a model loaded from files).
        let mut known: Vec<String> = self
            .scan()
            .map_err(InferError::internal)?
            .into_iter()
            .map(|m| m.name)
            .collect();
        known.extend(
            self.models
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned(),
        );
        let mut registered = self.registered.write().unwrap_or_else(|e| e.into_inner());
        if registered.iter().any(|r| r.dir == dir) {
            return Err(conflict(format!(
                "the repository {} is registered already",
                dir.display()
            )));
        }
        // Those registered since the scan, read under the lock so that two registrations
        // cannot both take one name.
        let since: Vec<String> = registered
            .iter()
            .flat_map(Registered::model_names)
            .collect();
        let taken = adds.iter().find(|n| known.contains(n) || since.contains(n));
        if let Some(taken) = taken {
            return Err(conflict(format!(
                "a model named '{}' exists already",
                crate::clip(taken)
            )));
        }
        registered.push(Registered {
            dir: dir.to_path_buf(),
            names,
        });
        drop(registered);
        // Listed from now on, unavailable until loaded, as the repositories' models are.
        let found = self.scan().map_err(InferError::internal)?;
        let mut models = self.write();
        for m in found.into_iter().filter(|m| adds.contains(&m.name)) {
            models
                .entry(m.name.clone())
                .or_insert_with(|| super::Entry::new(m));
        }
        drop(models);
        tracing::info!(repository = %dir.display(), models = ?adds, "repository registered");
        Ok(adds)
    }

    /// Removes the registered repository `dir`: its models that are not loaded (or loading)
    /// leave the index. Unload them first.
    pub fn unregister_repository(&self, dir: &Path) -> Result<(), InferError> {
        let removed = {
            let mut registered = self.registered.write().unwrap_or_else(|e| e.into_inner());
            let Some(at) = registered.iter().position(|r| r.dir == dir) else {
                return Err(InferError::new(
                    crate::ErrorKind::ModelNotFound,
                    format!("the repository {} is not registered", dir.display()),
                ));
            };
            registered.remove(at)
        };
        let names = removed.model_names();
        let mut models = self.write();
        for name in names {
            let idle = models.get(&name).is_some_and(|e| {
                !matches!(
                    e.status,
                    ModelStatus::Ready(_) | ModelStatus::Loading { .. }
                )
            });
            if idle {
                models.remove(&name);
            }
        }
        tracing::info!(repository = %dir.display(), "repository unregistered");
        Ok(())
    }
}

impl Registered {
    /// The names its models serve under (its folders, renamed where `names` says).
    fn model_names(&self) -> Vec<String> {
        crate::repository::model_folders(&self.dir)
            .unwrap_or_default()
            .into_iter()
            .map(|(folder, _)| self.names.get(&folder).cloned().unwrap_or(folder))
            .chain(self.names.values().cloned())
            .collect()
    }
}

fn conflict(message: String) -> InferError {
    InferError::new(crate::ErrorKind::Conflict, message)
}
