//! What the manager reports: each model's state, memory and placement, each device's usage,
//! and the sampled gauges of the metrics exposition.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ModelManager;
use crate::metrics::{DeviceLabels, Metrics, ModelLabels};
use crate::server_config::Routing;
use crate::ModelHandle;

/// Where a model stands.
#[derive(Clone)]
pub enum ModelStatus {
    /// Known, not loaded.
    Unloaded {
        version: String,
    },
    Loading {
        version: String,
    },
    Ready(Arc<ModelHandle>),
    Unloading {
        version: String,
    },
    /// The last load failed.
    Failed {
        version: String,
        reason: String,
    },
}

/// A model's state, as the repository extension names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// Not loaded, or its load failed (the reason says which).
    Unavailable,
    Loading,
    Ready,
    Unloading,
}

impl ModelState {
    /// The name the repository extension uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Unavailable => "UNAVAILABLE",
            ModelState::Loading => "LOADING",
            ModelState::Ready => "READY",
            ModelState::Unloading => "UNLOADING",
        }
    }
}

impl std::fmt::Display for ModelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ModelStatus {
    /// Where the model stands.
    pub fn state(&self) -> ModelState {
        match self {
            ModelStatus::Loading { .. } => ModelState::Loading,
            ModelStatus::Ready(_) => ModelState::Ready,
            ModelStatus::Unloading { .. } => ModelState::Unloading,
            ModelStatus::Unloaded { .. } | ModelStatus::Failed { .. } => ModelState::Unavailable,
        }
    }

    pub fn version(&self) -> &str {
        match self {
            ModelStatus::Unloaded { version }
            | ModelStatus::Loading { version }
            | ModelStatus::Unloading { version }
            | ModelStatus::Failed { version, .. } => version,
            ModelStatus::Ready(h) => &h.version,
        }
    }

    /// Why the model is not available, when that is known.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ModelStatus::Failed { reason, .. } => Some(reason),
            ModelStatus::Unloaded { .. } => Some("not loaded"),
            _ => None,
        }
    }
}

/// Where a model's memory figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemorySource {
    /// Nothing is known.
    #[default]
    Unknown,
    /// The model's `memory_mb`.
    Config,
    /// The backend's report for the loaded model (a sim model's declared memory).
    Backend,
    /// The device's memory grew by this much while the model loaded alone (the process's
    /// resident memory on the CPU, the driver's count on a GPU), more than the backend counts.
    Measured,
    /// The backend's report, grown since the load as the model's instances ran batches.
    Serving,
    /// Guessed before loading (an ONNX file's size).
    Estimate,
}

impl MemorySource {
    pub fn name(self) -> &'static str {
        match self {
            MemorySource::Unknown => "unknown",
            MemorySource::Config => "config",
            MemorySource::Backend => "backend",
            MemorySource::Measured => "measured",
            MemorySource::Serving => "serving",
            MemorySource::Estimate => "estimate",
        }
    }
}

/// One model as the manager sees it, for statistics and listings.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    pub version: String,
    pub state: ModelState,
    /// The platform that serves it (`onnxruntime_onnx`, `llama.cpp`).
    pub platform: &'static str,
    pub reason: Option<String>,
    /// The devices it is placed on (while it holds memory).
    pub devices: Vec<String>,
    /// Bytes it holds on each of its devices.
    pub memory_bytes: u64,
    pub memory_source: MemorySource,
    /// Milliseconds since the Unix epoch of its last request since it loaded.
    pub last_used_unix_ms: Option<u64>,
    /// Requests since it loaded.
    pub uses: u64,
    pub loads: u64,
    pub evictions: u64,
}

impl ModelInfo {
    /// Memory per device in Triton's terms: (`CPU`/`GPU`/`SIM`, device id, bytes).
    pub fn memory_usage(&self) -> Vec<(&'static str, i64, u64)> {
        self.devices
            .iter()
            .map(|d| {
                let (kind, id) = match d.split_once(':') {
                    Some(("cuda", id)) => ("GPU", id.parse().unwrap_or(0)),
                    Some(("sim", _)) => ("SIM", 0),
                    _ => ("CPU", d.trim_start_matches("cpu").parse().unwrap_or(0)),
                };
                (kind, id, self.memory_bytes)
            })
            .collect()
    }
}

/// One device as the ledger sees it.
#[derive(Debug, Clone)]
pub struct DeviceUsage {
    pub name: String,
    pub models: usize,
    pub memory_used: u64,
    /// The device's own memory (the host's RAM for the CPU); 0 where unknown.
    pub memory_total: u64,
    /// The ledger's budget for the device; 0 means none.
    pub memory_budget: u64,
}

impl ModelManager {
    /// Memory the loaded (and loading) models hold on each device, in bytes.
    pub fn memory_used(&self) -> Vec<u64> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        self.ledger.per_device(&models, self.devices.len())
    }

    /// Each device: models placed on it, memory they hold, its total memory and its budget.
    pub fn device_usage(&self) -> Vec<DeviceUsage> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let used = self.ledger.per_device(&models, self.devices.len());
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceUsage {
                name: d.name.clone(),
                models: models
                    .values()
                    .filter(|e| e.holds_memory() && e.devices.contains(&i))
                    .count(),
                memory_used: used[i],
                memory_total: device_memory(d.device),
                memory_budget: self.ledger.device_budget,
            })
            .collect()
    }

    /// One model's placement, memory and usage.
    pub fn model_info(&self, name: &str) -> Option<ModelInfo> {
        self.model_infos().into_iter().find(|m| m.name == name)
    }

    /// Every model with its placement, memory and usage, by name.
    pub fn model_infos(&self) -> Vec<ModelInfo> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models
            .iter()
            .map(|(name, e)| {
                let held = e.holds_memory();
                let uses = e.usage.uses.load(Ordering::Relaxed);
                ModelInfo {
                    name: name.clone(),
                    version: e.status.version().to_string(),
                    state: e.status.state(),
                    platform: self.platform_of(&e.repo),
                    reason: e.status.reason().map(str::to_string),
                    devices: e
                        .devices
                        .iter()
                        .filter_map(|&d| self.devices.get(d).map(|d| d.name.clone()))
                        .collect(),
                    memory_bytes: if held { e.reserved } else { 0 },
                    memory_source: e.memory_source,
                    last_used_unix_ms: (held && uses > 0)
                        .then(|| self.epoch_unix_ms + e.usage.last_used_ms.load(Ordering::Relaxed)),
                    uses,
                    loads: e.loads,
                    evictions: e.evictions,
                }
            })
            .collect()
    }

    /// Models loaded, loading or unloading.
    pub fn models_held(&self) -> usize {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.values().filter(|e| e.holds_memory()).count()
    }

    /// How requests pick a device, as configured (`queue_depth`, `round_robin`).
    pub fn routing_name(&self) -> &'static str {
        match self.routing {
            Routing::QueueDepth => "queue_depth",
            Routing::RoundRobin => "round_robin",
        }
    }

    /// The server's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The metrics exposition text, with gauges sampled from the live state first.
    pub fn encode_metrics(&self) -> String {
        let m = &self.metrics;
        let mut triton = Vec::new();
        for (_, status) in self.list() {
            let ModelStatus::Ready(newest) = status else {
                continue;
            };
            if let Some(g) = &newest.generator {
                m.generation.sample(&newest.name, g.stats());
            }
            if newest.sequences().is_some() {
                m.sequences_open
                    .get_or_create(&crate::metrics::LifecycleLabels {
                        model: newest.name.clone(),
                    })
                    .set(newest.open_sequences() as i64);
            }
            // Each version served, the older ones beside the newest.
            for h in newest.every_version() {
                triton.push(crate::triton_metrics::ModelFigures {
                    name: h.name.clone(),
                    version: h.version.clone(),
                    stats: h.stats(),
                    pending: h.pending_items(),
                    cached: h.config.response_cache,
                    summaries: h.summaries(),
                });
                for lane in h.lanes() {
                    let labels = ModelLabels {
                        model: h.name.clone(),
                        version: h.version.clone(),
                        device: lane.device.clone(),
                    };
                    m.queue_depth
                        .get_or_create(&labels)
                        .set(lane.queued_items() as i64);
                    m.inflight_batches
                        .get_or_create(&labels)
                        .set(lane.inflight_batches() as i64);
                }
            }
        }
        // A GPU's series are left out under `--allow-gpu-metrics false`.
        let shown = |d: &DeviceUsage| self.gpu_metrics || !d.name.starts_with("cuda");
        for d in self.device_usage().into_iter().filter(shown) {
            let labels = DeviceLabels { device: d.name };
            m.device_memory_used
                .get_or_create(&labels)
                .set(d.memory_used as i64);
            m.device_memory_total
                .get_or_create(&labels)
                .set(d.memory_total as i64);
        }
        let mut text = m.encode();
        let cpu = self.cpu_metrics.then_some(&m.cpu);
        let latency = m.latency_metrics();
        crate::triton_metrics::render(&triton, &latency, cpu, &mut text);
        text
    }
}

/// Total memory of a device in bytes: the host's RAM for the CPU, what the driver reports for a
/// GPU, 0 where unknown.
fn device_memory(device: sheaf_backend::Device) -> u64 {
    match device {
        sheaf_backend::Device::Cpu => std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| {
                        l.split_whitespace()
                            .nth(1)
                            .and_then(|kb| kb.parse::<u64>().ok())
                    })
            })
            .map_or(0, |kb| kb * 1024),
        sheaf_backend::Device::Cuda(id) => super::gpu::total_bytes(id),
        sheaf_backend::Device::Sim => 0,
    }
}
