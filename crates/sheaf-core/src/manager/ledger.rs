//! The memory ledger: where a model loads, and which idle models make room for it.
//!
//! Every model that is loading, loaded or unloading holds `reserved` bytes on each of its
//! devices. A load is admitted only when, after evicting idle models if need be, every limit
//! holds: each device's budget, the number of models, and the memory over all devices. Room is
//! made and reserved under the manager's lock, so concurrent loads never overcommit. Tensor and
//! generation models are booked alike.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Entry, ModelStatus, MIB};
use crate::metrics::{LifecycleLabels, Metrics};
use crate::server_config::{AssignmentStrategy, DeviceSpec, EvictionPolicy, ServerConfig};
use crate::{ErrorKind, InferError, ModelHandle};

/// The ledger's limits and placement rule.
#[derive(Debug)]
pub(super) struct Ledger {
    /// Bytes per device; 0 = none.
    pub device_budget: u64,
    pub max_models: usize,
    /// Bytes over all devices; 0 = none.
    pub max_memory: u64,
    pub eviction: EvictionPolicy,
    pub idle_timeout: Option<Duration>,
    pub strategy: AssignmentStrategy,
    /// The next device `round_robin` tries first.
    turn: AtomicUsize,
}

/// What the models holding memory hold, per device and in all.
struct Usage {
    per_device: Vec<u64>,
    models_per_device: Vec<usize>,
    models: usize,
    total: u64,
}

impl Ledger {
    pub fn new(config: &ServerConfig) -> Ledger {
        Ledger {
            device_budget: config.memory_budget_mb * MIB,
            max_models: config.max_models,
            max_memory: config.max_memory_mb * MIB,
            eviction: config.eviction_policy,
            idle_timeout: (config.idle_timeout_s > 0)
                .then(|| Duration::from_secs(config.idle_timeout_s)),
            strategy: config.assignment_strategy,
            turn: AtomicUsize::new(0),
        }
    }

    fn usage(&self, models: &BTreeMap<String, Entry>, devices: usize) -> Usage {
        let mut u = Usage {
            per_device: vec![0; devices],
            models_per_device: vec![0; devices],
            models: 0,
            total: 0,
        };
        let held = models
            .values()
            .filter(|e| e.holds_memory())
            .map(|e| (&e.devices, e.reserved));
        for (on, bytes) in held {
            u.models += 1;
            for &d in on {
                if let Some(slot) = u.per_device.get_mut(d) {
                    *slot += bytes;
                    u.models_per_device[d] += 1;
                    u.total += bytes;
                }
            }
        }
        u
    }

    /// Bytes held on each device.
    pub fn per_device(&self, models: &BTreeMap<String, Entry>, devices: usize) -> Vec<u64> {
        self.usage(models, devices).per_device
    }

    /// The devices a model of `need` bytes per device loads on: its preferred device, every
    /// device, or one picked by the assignment strategy (preferring devices where it fits
    /// without evicting anything).
    pub fn place(
        &self,
        models: &BTreeMap<String, Entry>,
        devices: &[DeviceSpec],
        name: &str,
        need: u64,
        preferred: Option<&str>,
    ) -> Result<Vec<usize>, InferError> {
        if let Some(wanted) = preferred {
            return devices
                .iter()
                .position(|d| d.name == wanted)
                .map(|i| vec![i])
                .ok_or_else(|| {
                    InferError::new(
                        ErrorKind::NotReady,
                        format!(
                            "model '{name}': preferred_device '{wanted}' is not one of the \
                             devices {:?}",
                            devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>()
                        ),
                    )
                });
        }
        let n = devices.len();
        if self.strategy == AssignmentStrategy::All || n <= 1 {
            return Ok((0..n).collect());
        }
        let usage = self.usage(models, n);
        let mut order: Vec<usize> = (0..n).collect();
        match self.strategy {
            AssignmentStrategy::RoundRobin => {
                let start = self.turn.fetch_add(1, Ordering::Relaxed) % n;
                order.rotate_left(start);
            }
            AssignmentStrategy::LeastLoaded => order.sort_by_key(|&d| (usage.per_device[d], d)),
            AssignmentStrategy::FewestModels => {
                order.sort_by_key(|&d| (usage.models_per_device[d], d))
            }
            AssignmentStrategy::All => {}
        }
        let fits =
            |d: usize| self.device_budget == 0 || usage.per_device[d] + need <= self.device_budget;
        let chosen = order.iter().copied().find(|&d| fits(d)).unwrap_or(order[0]);
        Ok(vec![chosen])
    }

    /// Evicts idle models (no admitted requests), in eviction-policy order, until a model of
    /// `need` bytes per device fits every limit on `targets`. Returns the evicted handles (to
    /// drop after the lock), or an error if it cannot fit.
    pub fn make_room(
        &self,
        models: &mut BTreeMap<String, Entry>,
        devices: &[DeviceSpec],
        name: &str,
        need: u64,
        targets: &[usize],
        metrics: &Metrics,
    ) -> Result<Vec<Arc<ModelHandle>>, InferError> {
        let mib = |b: u64| b / MIB;
        let spread = need * targets.len() as u64;
        if (self.device_budget > 0 && need > self.device_budget)
            || (self.max_memory > 0 && spread > self.max_memory)
        {
            return Err(InferError::new(
                ErrorKind::NotReady,
                format!(
                    "model '{name}' needs {} MiB on each of {} device(s), more than the memory \
                     budget allows",
                    mib(need),
                    targets.len()
                ),
            ));
        }
        let mut evicted = Vec::new();
        loop {
            let u = self.usage(models, devices.len());
            let full: Vec<usize> = targets
                .iter()
                .copied()
                .filter(|&d| self.device_budget > 0 && u.per_device[d] + need > self.device_budget)
                .collect();
            let too_many = self.max_models > 0 && u.models >= self.max_models;
            let too_much = self.max_memory > 0 && u.total + spread > self.max_memory;
            if full.is_empty() && !too_many && !too_much {
                return Ok(evicted);
            }
            // While a target device is full, only models on it can help.
            let victim = models
                .iter()
                .filter(|(n, e)| {
                    n.as_str() != name
                        && matches!(&e.status, ModelStatus::Ready(h) if h.pending_in_every_version() == 0)
                        && (full.is_empty() || e.devices.iter().any(|d| full.contains(d)))
                })
                .min_by_key(|(_, e)| {
                    let last = e.usage.last_used_ms.load(Ordering::Relaxed);
                    let uses = e.usage.uses.load(Ordering::Relaxed);
                    match self.eviction {
                        EvictionPolicy::Lru => (last, uses),
                        EvictionPolicy::Lfu => (uses, last),
                    }
                })
                .map(|(n, _)| n.clone());
            let Some(victim) = victim else {
                let on: Vec<String> = targets.iter().map(|&d| devices[d].name.clone()).collect();
                return Err(InferError::new(
                    ErrorKind::Overloaded,
                    format!(
                        "cannot load model '{name}' ({} MiB on {on:?}): {} models hold {} MiB \
                         and every one that would make room is busy, so none can be evicted; \
                         retry later",
                        mib(need),
                        u.models,
                        mib(u.total)
                    ),
                ));
            };
            if let Some(entry) = models.get_mut(&victim) {
                let unloaded = ModelStatus::Unloaded {
                    version: entry.repo.version.clone(),
                };
                if let ModelStatus::Ready(h) = std::mem::replace(&mut entry.status, unloaded) {
                    tracing::info!(
                        model = %victim,
                        devices = ?entry.devices.iter().map(|&d| devices[d].name.as_str()).collect::<Vec<_>>(),
                        memory_bytes = entry.reserved,
                        policy = ?self.eviction,
                        for_model = name,
                        reason = "evicted to make room",
                        "model unloaded"
                    );
                    evicted.push(h);
                }
                entry.reserved = 0;
                entry.devices.clear();
                entry.evictions += 1;
                metrics
                    .evictions
                    .get_or_create(&LifecycleLabels {
                        model: victim.clone(),
                    })
                    .inc();
                metrics
                    .unloads
                    .get_or_create(&LifecycleLabels { model: victim })
                    .inc();
            }
        }
    }
}

/// Memory in use where `devices` are, for measuring what a load takes: the process's resident
/// memory when they are all CPUs; the GPUs' used memory (`nvidia-smi`) when they are all CUDA
/// devices; unknown otherwise (simulated or mixed devices).
pub(super) fn memory_in_use(devices: &[DeviceSpec]) -> Option<u64> {
    use sheaf_backend::Device;
    if devices.iter().all(|d| d.device == Device::Cpu) {
        return resident_bytes();
    }
    let ids: Option<Vec<i32>> = devices
        .iter()
        .map(|d| match d.device {
            Device::Cuda(id) => Some(id),
            _ => None,
        })
        .collect();
    super::gpu::used_bytes(&ids?)
}

/// The process's resident memory in bytes (Linux), for measuring what a load takes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_in_use_is_known_for_the_cpu_and_not_for_mixed_devices() {
        assert!(resident_bytes().unwrap() > 0);
        let cpu = DeviceSpec {
            name: "cpu".into(),
            device: sheaf_backend::Device::Cpu,
            threads: None,
        };
        assert!(memory_in_use(std::slice::from_ref(&cpu)).is_some());
        let sim = DeviceSpec {
            name: "sim:a".into(),
            device: sheaf_backend::Device::Sim,
            threads: None,
        };
        assert_eq!(memory_in_use(&[cpu, sim]), None);
    }
}
