//! A loaded model: its signature, resolved configuration, batcher and statistics.

use std::path::PathBuf;
use std::sync::Arc;

use sheaf_backend::{Backend, BackendError, LoadSpec, Signature};

use crate::batcher::policy::{BatchPolicy, Fixed, LatencySlo, QueueDepth};
use crate::batcher::{self, Batcher, BatcherConfig};
use crate::config::{PolicyKind, DEFAULT_MAX_BATCH_SIZE};
use crate::request::{validate, InferResponse, NamedTensor, RawRequest};
use crate::stats::ModelStats;
use crate::{InferError, ModelConfig};

/// A model ready to serve.
pub struct ModelHandle {
    pub name: String,
    pub version: String,
    pub platform: &'static str,
    pub path: PathBuf,
    pub signature: Signature,
    /// The configuration in force, with `max_batch_size` resolved.
    pub config: ModelConfig,
    /// Resolved from the config and the signature; 0 when the model does not batch.
    pub max_batch_size: usize,
    pub stats: Arc<ModelStats>,
    batcher: Batcher,
}

impl ModelHandle {
    /// Loads the model at `path` and starts its batcher.
    pub async fn load(
        name: &str,
        version: &str,
        path: PathBuf,
        config: ModelConfig,
        backend: Arc<dyn Backend>,
    ) -> Result<ModelHandle, BackendError> {
        let stats = Arc::new(ModelStats::default());
        let spec = LoadSpec {
            path: path.clone(),
            intra_op_threads: config.intra_op_threads,
        };
        let instances = batcher::load_instances(
            name,
            backend.clone(),
            spec,
            1,
            config.pipeline_depth,
            stats.clone(),
        )
        .await?;
        let signature = instances.signature.clone();
        let max_batch_size = resolve_max_batch_size(&config, &signature)?;
        let batcher = Batcher::start(
            name,
            BatcherConfig {
                policy: policy(&config, max_batch_size),
                max_queue_size: config.max_queue_size,
            },
            instances,
            stats.clone(),
        );
        Ok(ModelHandle {
            name: name.to_string(),
            version: version.to_string(),
            platform: backend.platform(),
            path,
            signature,
            config: ModelConfig {
                max_batch_size: Some(max_batch_size),
                ..config
            },
            max_batch_size,
            stats,
            batcher,
        })
    }

    /// Validates `raw` against the signature, queues it, and returns its outputs.
    pub async fn infer(&self, raw: RawRequest) -> Result<InferResponse, InferError> {
        let request = validate(raw, &self.signature, self.max_batch_size > 0)?;
        let outputs = self.batcher.submit(request.inputs, request.items).await?;
        // Tensors share their bytes, so a clone here copies no data.
        let outputs = request
            .outputs
            .iter()
            .map(|&i| NamedTensor {
                name: self.signature.outputs[i].name.clone(),
                tensor: outputs[i].clone(),
            })
            .collect();
        Ok(InferResponse {
            id: request.id,
            model_name: self.name.clone(),
            model_version: self.version.clone(),
            outputs,
        })
    }

    /// Items admitted and not yet answered.
    pub fn pending_items(&self) -> usize {
        self.batcher.pending_items()
    }
}

/// The batching policy `config` asks for.
fn policy(config: &ModelConfig, max_batch_size: usize) -> Box<dyn BatchPolicy> {
    let b = &config.batching;
    let delay = batcher::micros(config.max_queue_delay_us);
    match b.policy {
        PolicyKind::Fixed => Box::new(Fixed {
            max_batch_size,
            min_batch_size: b.min_batch_size,
            max_queue_delay: delay,
            preferred_batch_sizes: config.preferred_batch_sizes.clone(),
        }),
        PolicyKind::QueueDepth => Box::new(QueueDepth {
            max_batch_size,
            min_batch_size: b.min_batch_size,
            preferred_batch_sizes: config.preferred_batch_sizes.clone(),
            min_wait: batcher::micros(b.min_wait_us),
            max_wait: b.max_wait_us.map_or(delay, batcher::micros),
            adaptive_threshold: b.adaptive_threshold,
        }),
        PolicyKind::LatencySlo => Box::new(LatencySlo::new(
            max_batch_size,
            std::time::Duration::from_millis(b.latency_slo_ms),
        )),
    }
}

/// The configured `max_batch_size`, or the default for the signature; an error when batching is
/// asked of a model without a batch dimension.
fn resolve_max_batch_size(
    config: &ModelConfig,
    signature: &Signature,
) -> Result<usize, BackendError> {
    let batchable = signature.has_batch_dim();
    match config.max_batch_size {
        None if batchable => Ok(DEFAULT_MAX_BATCH_SIZE),
        None | Some(0) => Ok(0),
        Some(n) if batchable => Ok(n),
        Some(n) => Err(BackendError::Load(format!(
            "max_batch_size is {n}, but the model has no batch dimension (its inputs and outputs \
             do not all start with a dynamic dimension); set max_batch_size: 0"
        ))),
    }
}
