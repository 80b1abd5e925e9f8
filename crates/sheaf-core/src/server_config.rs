//! The server configuration file (`--config sheaf.yaml`): the devices models run on and how
//! requests are routed between them.
//!
//! ```yaml
//! devices: [cpu]            # default. Also: "cpu:2" (2 intra-op threads per instance),
//!                           # "cuda:0", "cuda" (every id in GPU_IDS, else CUDA_VISIBLE_DEVICES),
//!                           # "sim:a100" (a simulated lane for sim models)
//! routing: queue_depth      # or round_robin
//! memory_budget_mb: 0       # per device; 0 = unlimited
//! max_models: 0             # loaded at once; 0 = unlimited
//! max_memory_mb: 0          # over all devices; 0 = unlimited
//! eviction_policy: lru      # or lfu: which idle model makes room for a load
//! idle_timeout_s: 0         # unload models unused this long; 0 = never
//! assignment_strategy: all  # where a model loads: all (every device), round_robin,
//!                           # least_loaded (least memory held), fewest_models
//! models:                   # models kept outside the repository (optional)
//!   sanders: {model_path: /models/sanders.onnx, preload: true, preferred_device: "cuda:1"}
//! ```
//!
//! The grouped layout of multi-GPU model servers (`server`, `gpus`, `capacity`, `onnx`, `models`)
//! is accepted too; [`crate::grouped_config`] translates it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use sheaf_backend::Device;

/// The server-wide configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Every model gets one batcher and its instances on each of these.
    pub devices: Vec<String>,
    pub routing: Routing,
    /// Memory, in MiB, the loaded models may hold on each device; 0 means no limit.
    pub memory_budget_mb: u64,
    /// Most models loaded at once; 0 means no limit.
    pub max_models: usize,
    /// Memory, in MiB, the loaded models may hold over all devices; 0 means no limit.
    pub max_memory_mb: u64,
    /// Which idle model is evicted to make room: least recently or least frequently used.
    pub eviction_policy: EvictionPolicy,
    /// Models unused for this many seconds are unloaded; 0 means never.
    pub idle_timeout_s: u64,
    /// Which devices a model loads on.
    pub assignment_strategy: AssignmentStrategy,
    /// Models named here, with their file, in addition to those of the model repository.
    pub models: BTreeMap<String, ListedModel>,
    /// Bytes of the response cache, shared by the models whose config enables it
    /// (`--cache-size`); 0: no cache.
    pub response_cache_bytes: u64,
}

/// Which devices a model loads on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AssignmentStrategy {
    /// Every device: one batcher per device, and requests are routed between them.
    #[default]
    All,
    /// One device, taking the devices in turn (skipping those where the model does not fit).
    RoundRobin,
    /// One device: the one whose loaded models hold the least memory.
    LeastLoaded,
    /// One device: the one holding the fewest models.
    FewestModels,
}

/// A model listed in the server configuration rather than found in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListedModel {
    /// The model file (`model.onnx`, `model.sim.yaml`, or any `*.onnx`).
    pub model_path: PathBuf,
    /// Load at start (in the `explicit` and `on_demand` control modes).
    #[serde(default)]
    pub preload: bool,
    /// The device it loads on, by name (`cuda:1`, `cpu`).
    #[serde(default)]
    pub preferred_device: Option<String>,
    /// Execution instances per device.
    #[serde(default)]
    pub instances: Option<usize>,
}

/// Which idle model makes room for a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used (fewest requests since it loaded).
    Lfu,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            devices: vec!["cpu".into()],
            routing: Routing::QueueDepth,
            memory_budget_mb: 0,
            max_models: 0,
            max_memory_mb: 0,
            eviction_policy: EvictionPolicy::Lru,
            idle_timeout_s: 0,
            assignment_strategy: AssignmentStrategy::All,
            models: BTreeMap::new(),
            response_cache_bytes: 0,
        }
    }
}

/// How a request picks one of a model's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// In turn.
    RoundRobin,
    /// The device expected to finish it first, from its queue and learned cost curve.
    #[default]
    QueueDepth,
}

/// One configured device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The name it is reported under: `cpu`, `cpu1`, `cuda:0`, `sim:a100`.
    pub name: String,
    pub device: Device,
    /// Intra-op threads per instance on this device, when the device sets them.
    pub threads: Option<usize>,
}

impl ServerConfig {
    pub fn from_yaml(text: &str) -> Result<ServerConfig, String> {
        let config: ServerConfig = sheaf_backend::yaml::from_str(text)?;
        config.check()?;
        Ok(config)
    }

    /// Checks what serde cannot: the devices parse, preferred devices are among them, and a
    /// listed model's instances are within [`crate::config::MAX_INSTANCES`].
    pub fn check(&self) -> Result<(), String> {
        let specs = self.device_specs()?;
        for (name, m) in &self.models {
            let most = crate::config::MAX_INSTANCES;
            if let Some(n) = m.instances.filter(|&n| n == 0 || n > most) {
                return Err(format!(
                    "model '{name}': instances is {n}; from 1 to {most} are allowed"
                ));
            }
            if let Some(d) = &m.preferred_device {
                if !specs.iter().any(|s| &s.name == d) {
                    return Err(format!(
                        "model '{name}': preferred_device '{d}' is not one of the devices {:?}",
                        specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The devices, parsed and named; `cuda` expands to the visible GPUs.
    pub fn device_specs(&self) -> Result<Vec<DeviceSpec>, String> {
        let mut specs = Vec::new();
        for entry in &self.devices {
            let (kind, arg) = entry
                .split_once(':')
                .map_or((entry.as_str(), None), |(k, a)| (k, Some(a)));
            match (kind, arg) {
                ("cpu", threads) => {
                    let threads = threads
                        .map(|t| {
                            t.parse::<usize>()
                                .ok()
                                .filter(|&t| (1..=crate::config::MAX_RUNTIME_THREADS).contains(&t))
                                .ok_or(format!(
                                    "device '{entry}': cpu:N needs N from 1 to {}",
                                    crate::config::MAX_RUNTIME_THREADS
                                ))
                        })
                        .transpose()?;
                    let n = specs
                        .iter()
                        .filter(|s: &&DeviceSpec| s.device == Device::Cpu)
                        .count();
                    let name = if n == 0 {
                        "cpu".to_string()
                    } else {
                        format!("cpu{n}")
                    };
                    specs.push(DeviceSpec {
                        name,
                        device: Device::Cpu,
                        threads,
                    });
                }
                ("cuda", Some(id)) => {
                    let id = id
                        .parse::<i32>()
                        .map_err(|_| format!("device '{entry}': cuda:N needs a number"))?;
                    specs.push(DeviceSpec {
                        name: format!("cuda:{id}"),
                        device: Device::Cuda(id),
                        threads: None,
                    });
                }
                ("cuda", None) => {
                    for id in visible_gpus() {
                        specs.push(DeviceSpec {
                            name: format!("cuda:{id}"),
                            device: Device::Cuda(id),
                            threads: None,
                        });
                    }
                }
                ("sim", name) => specs.push(DeviceSpec {
                    name: format!("sim:{}", name.unwrap_or("0")),
                    device: Device::Sim,
                    threads: None,
                }),
                _ => {
                    return Err(format!(
                        "unknown device '{entry}': use cpu, cpu:N, cuda:N, cuda or sim:NAME"
                    ))
                }
            }
        }
        if specs.is_empty() {
            return Err("no devices: list at least one (cpu, cuda:N, sim:NAME)".into());
        }
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("device '{}' is listed twice", w[0]));
        }
        Ok(specs)
    }
}

/// GPU ids from `GPU_IDS` (a comma list), else one per entry of `CUDA_VISIBLE_DEVICES` (which
/// renumbers them from 0), else just 0.
fn visible_gpus() -> Vec<i32> {
    let list = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    if let Some(ids) = list("GPU_IDS") {
        return ids
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    if let Some(visible) = list("CUDA_VISIBLE_DEVICES") {
        return (0..visible.split(',').count() as i32).collect();
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_name_themselves() {
        let c = ServerConfig::from_yaml(
            "devices: [cpu, 'cpu:2', 'cuda:1', 'sim:a', 'sim:b']\nrouting: round_robin\n",
        )
        .unwrap();
        let specs = c.device_specs().unwrap();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["cpu", "cpu1", "cuda:1", "sim:a", "sim:b"]);
        assert_eq!(specs[1].threads, Some(2));
        assert_eq!(specs[2].device, Device::Cuda(1));
        assert_eq!(c.routing, Routing::RoundRobin);
        assert_eq!(
            ServerConfig::default().device_specs().unwrap()[0].name,
            "cpu"
        );
    }

    #[test]
    fn bad_devices_are_named() {
        assert!(ServerConfig::from_yaml("devices: [tpu]\n")
            .unwrap_err()
            .contains("unknown device 'tpu'"));
        assert!(ServerConfig::from_yaml("devices: ['sim:a', 'sim:a']\n")
            .unwrap_err()
            .contains("listed twice"));
        assert!(ServerConfig::from_yaml("devices: []\n")
            .unwrap_err()
            .contains("no devices"));
        assert!(ServerConfig::from_yaml("devices: ['cpu:0']\n").is_err());
        assert!(ServerConfig::from_yaml("devices: ['cpu:99999999']\n")
            .unwrap_err()
            .contains("cpu:N needs N from 1 to 1024"));
        assert!(ServerConfig::from_yaml("device: [cpu]\n").is_err());
    }

    /// A listed model's instance count is bounded as a model folder's is: a hundred million
    /// threads would take the server down before the load could fail.
    #[test]
    fn a_listed_model_s_instances_are_bounded() {
        let listed = |n: usize| {
            ServerConfig::from_yaml(&format!(
                "models: {{m: {{model_path: /models/m.onnx, instances: {n}}}}}\n"
            ))
        };
        assert!(listed(2).is_ok());
        assert!(listed(100_000_000)
            .unwrap_err()
            .contains("model 'm': instances is 100000000; from 1 to 1024 are allowed"));
        assert!(listed(0).unwrap_err().contains("instances is 0"));
    }
}
