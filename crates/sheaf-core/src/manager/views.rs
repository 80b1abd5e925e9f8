//! The answers every protocol gives, built once: the repository index, a model's readiness,
//! metadata and statistics. HTTP and gRPC render these values and never rebuild them, so the
//! same question gets the same answer, and the same error, over both.

use std::sync::Arc;

use sheaf_backend::TensorSpec;

use super::{ModelInfo, ModelManager, ModelState, ModelStatus};
use crate::stats::StatsSnapshot;
use crate::{ErrorKind, InferError, ModelHandle};

/// Whether a known model can serve now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Loading, unloading, not loaded or failed: the reason says which.
    NotReady(String),
}

/// What a model takes and gives.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: &'static str,
    /// Empty for a generation model, which takes text on the OpenAI-compatible routes.
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// A ready model's statistics, with its placement and memory.
#[derive(Clone)]
pub struct ModelStatistics {
    pub handle: Arc<ModelHandle>,
    pub stats: StatsSnapshot,
    pub info: Option<ModelInfo>,
}

impl ModelManager {
    /// Every model with its state, by name; with `only_ready`, the ready ones.
    /// A model that serves several versions has a row for each, oldest first.
    pub fn index(&self, only_ready: bool) -> Vec<ModelInfo> {
        let older: std::collections::BTreeMap<String, Vec<String>> = self
            .list()
            .into_iter()
            .filter_map(|(name, status)| match status {
                ModelStatus::Ready(h) if !h.older_versions().is_empty() => Some((
                    name,
                    h.older_versions()
                        .iter()
                        .map(|o| o.version.clone())
                        .collect(),
                )),
                _ => None,
            })
            .collect();
        let mut rows = Vec::new();
        for m in self.model_infos() {
            if only_ready && m.state != ModelState::Ready {
                continue;
            }
            for version in older.get(&m.name).into_iter().flatten() {
                let mut row = m.clone();
                row.version = version.clone();
                rows.push(row);
            }
            rows.push(m);
        }
        rows
    }

    /// Whether `name` (at `version`, if given) is ready: an unknown model or version is an
    /// error, a known one that cannot serve now is [`Readiness::NotReady`] with the reason.
    pub fn readiness(&self, name: &str, version: Option<&str>) -> Result<Readiness, InferError> {
        match self.get(name, version) {
            Ok(_) => Ok(Readiness::Ready),
            Err(e) if e.kind == ErrorKind::NotReady => Ok(Readiness::NotReady(e.message)),
            Err(e) => Err(e),
        }
    }

    /// [`ModelManager::readiness`], and then the word of each of its instances that has one of
    /// its own ([`ModelHandle::instances_ready`]): a loaded model whose instances say they
    /// cannot serve now (a Python model's `is_ready()` said no, or its process is being started
    /// again after it was lost) is [`Readiness::NotReady`] with their reason. What a client
    /// that asks after a model's readiness is answered.
    pub async fn readiness_checked(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Readiness, InferError> {
        let handle = match self.get(name, version) {
            Ok(handle) => handle,
            Err(e) if e.kind == ErrorKind::NotReady => return Ok(Readiness::NotReady(e.message)),
            Err(e) => return Err(e),
        };
        Ok(match handle.instances_ready().await {
            Ok(()) => Readiness::Ready,
            Err(why) => Readiness::NotReady(format!("model '{}' is not ready: {why}", handle.name)),
        })
    }

    /// [`ModelManager::is_ready`]; under strict readiness, also every loaded model's instances'
    /// own word, as Triton's strict readiness asks each model's backend.
    pub async fn is_ready_checked(&self) -> bool {
        if !self.is_ready() {
            return false;
        }
        if !self.strict_readiness {
            return true;
        }
        for (_, status) in self.list() {
            let ModelStatus::Ready(handle) = status else {
                continue;
            };
            for version in handle.every_version() {
                if let Err(why) = version.instances_ready().await {
                    tracing::debug!(model = %version.name, version = %version.version, reason = %why, "a loaded model's instances are not ready");
                    return false;
                }
            }
        }
        true
    }

    /// The metadata of the ready model `name`.
    pub fn metadata(&self, name: &str, version: Option<&str>) -> Result<ModelMetadata, InferError> {
        let h = self.get(name, version)?;
        let newest = self.get(name, None)?;
        let signature = self.signature_of(&h);
        Ok(ModelMetadata {
            name: h.name.clone(),
            versions: newest.served_versions(),
            platform: h.platform,
            inputs: signature.inputs,
            outputs: signature.outputs,
        })
    }

    /// The signature a model's metadata and configuration list: a pipeline that declares none
    /// gets the one its steps imply, from the models its steps name as they are served now (a
    /// step that is a pipeline itself, the same, a few levels down at most).
    pub fn signature_of(&self, h: &ModelHandle) -> sheaf_backend::Signature {
        self.described(h, 0)
    }

    fn described(&self, h: &ModelHandle, depth: usize) -> sheaf_backend::Signature {
        const NESTED: usize = 8;
        match &h.pipeline {
            Some(pipeline)
                if h.signature.inputs.is_empty()
                    && h.signature.outputs.is_empty()
                    && depth < NESTED =>
            {
                pipeline
                    .implied(|model, version| {
                        let step = self.get(model, version).ok()?;
                        Some(self.described(&step, depth + 1))
                    })
                    .unwrap_or_default()
            }
            _ => h.signature.clone(),
        }
    }

    /// The statistics of the ready model `name`, or of every ready model when `name` is empty.
    pub fn statistics(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Vec<ModelStatistics>, InferError> {
        // Each version served, as Triton gives them: a model without a version asked gives
        // every version it serves, oldest first.
        let handles: Vec<Arc<ModelHandle>> = if name.is_empty() {
            self.list()
                .into_iter()
                .filter_map(|(_, status)| match status {
                    ModelStatus::Ready(h) => Some(h),
                    _ => None,
                })
                .flat_map(|h| h.every_version())
                .collect()
        } else if version.is_some_and(|v| !v.is_empty()) {
            vec![self.get(name, version)?]
        } else {
            self.get(name, None)?.every_version()
        };
        Ok(handles
            .into_iter()
            .map(|h| ModelStatistics {
                stats: h.stats(),
                info: self.model_info(&h.name),
                handle: h,
            })
            .collect())
    }

    /// The platform of a model of the repository, from its backend.
    pub(super) fn platform_of(&self, repo: &crate::repository::RepoModel) -> &'static str {
        if repo.file == crate::pipeline::PIPELINE_FILE {
            return crate::pipeline::platform_of(&repo.path);
        }
        self.backends
            .iter()
            .find(|b| b.model_file() == repo.file)
            .map_or("", |b| b.platform())
    }
}
