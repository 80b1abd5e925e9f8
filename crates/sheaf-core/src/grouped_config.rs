//! The grouped configuration layout of multi-GPU model servers, read as it is:
//!
//! ```yaml
//! server:   {port: 8080, worker_count_per_gpu: 2}
//! gpus:     {count: 8, memory_gb_per_gpu: 24, assignment_strategy: least_loaded}
//! capacity: {max_models: 200, max_memory_gb: 160, eviction_policy: lru, idle_timeout_minutes: 30}
//! onnx:     {library_path: /opt/onnxruntime/lib/libonnxruntime.so}
//! models:
//!   sanders: {model_path: models/sanders.onnx, preload: true, preferred_gpu: 3}
//! ```
//!
//! Each key maps onto a [`ServerConfig`] key or a serve option; a key with no counterpart is kept
//! out with a warning that names it. `gpus.count` GPUs become the devices `cuda:0..count`; on a
//! machine that shows no GPU the models run on the CPU instead, with a warning, so that the same
//! file also works on a laptop. Relative `model_path`s are taken from the file's folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use crate::server_config::{AssignmentStrategy, EvictionPolicy, ListedModel, ServerConfig};

/// The top-level keys that mark the grouped layout.
const SECTIONS: [&str; 4] = ["server", "gpus", "capacity", "onnx"];

/// A grouped file, translated.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub config: ServerConfig,
    /// `server.port`: the HTTP port.
    pub http_port: Option<u16>,
    /// `server.host`.
    pub host: Option<String>,
    /// `onnx.library_path`.
    pub onnx_library: Option<PathBuf>,
    /// Keys that were not applied, and why.
    pub warnings: Vec<String>,
}

/// Whether `text` uses the grouped layout (any of `server`, `gpus`, `capacity`, `onnx` at the
/// top level).
pub fn is_grouped(text: &str) -> bool {
    match sheaf_backend::yaml::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) => SECTIONS.iter().any(|s| m.contains_key(*s)),
        _ => false,
    }
}

/// Translates a grouped file. `gpus_visible` is how many GPUs this machine shows; `base` is the
/// folder relative model paths start from.
pub fn translate(text: &str, gpus_visible: usize, base: &Path) -> Result<Translated, String> {
    let root: Mapping = sheaf_backend::yaml::from_str(text)?;
    let mut out = Translated {
        config: ServerConfig::default(),
        http_port: None,
        host: None,
        onnx_library: None,
        warnings: Vec::new(),
    };
    let mut workers = None;
    let mut gpus = None;
    let mut preferred_gpus = BTreeMap::new();
    for (key, value) in &root {
        let section = key.as_str().unwrap_or("");
        let keys = || entries(section, value);
        match section {
            "server" => {
                for (k, v) in keys()? {
                    match k.as_str() {
                        "port" => {
                            let (host, port) = address(&v)?;
                            out.http_port = Some(port);
                            if let Some(host) = host {
                                out.host.get_or_insert(host);
                            }
                        }
                        "host" => out.host = Some(string(section, &k, v)?),
                        "worker_count_per_gpu" => workers = Some(int(section, &k, v)? as usize),
                        _ => out.warnings.push(ignored(section, &k)),
                    }
                }
            }
            "gpus" => {
                for (k, v) in keys()? {
                    match k.as_str() {
                        "count" => gpus = Some(int(section, &k, v)? as usize),
                        "memory_gb_per_gpu" => {
                            out.config.memory_budget_mb = gib_to_mib(section, &k, v)?
                        }
                        "assignment_strategy" => {
                            out.config.assignment_strategy = strategy(&string(section, &k, v)?)?
                        }
                        _ => out.warnings.push(ignored(section, &k)),
                    }
                }
            }
            "capacity" => {
                for (k, v) in keys()? {
                    match k.as_str() {
                        "max_models" => out.config.max_models = int(section, &k, v)? as usize,
                        "max_memory_gb" => out.config.max_memory_mb = gib_to_mib(section, &k, v)?,
                        "eviction_policy" => {
                            out.config.eviction_policy =
                                match string(section, &k, v)?.to_lowercase().as_str() {
                                    "lru" => EvictionPolicy::Lru,
                                    "lfu" => EvictionPolicy::Lfu,
                                    other => {
                                        return Err(format!(
                                            "capacity.eviction_policy '{other}': use lru or lfu"
                                        ))
                                    }
                                }
                        }
                        "idle_timeout_minutes" => {
                            out.config.idle_timeout_s = int(section, &k, v)? * 60
                        }
                        _ => out.warnings.push(ignored(section, &k)),
                    }
                }
            }
            "onnx" => {
                for (k, v) in keys()? {
                    match k.as_str() {
                        "library_path" => {
                            out.onnx_library = Some(base.join(string(section, &k, v)?))
                        }
                        _ => out.warnings.push(ignored(section, &k)),
                    }
                }
            }
            "models" => {
                for (name, v) in keys()? {
                    let (listed, gpu) = model(&name, v, base, &mut out.warnings)?;
                    if let Some(gpu) = gpu {
                        preferred_gpus.insert(name.clone(), gpu);
                    }
                    out.config.models.insert(name, listed);
                }
            }
            other => out
                .warnings
                .push(format!("'{other}' is not a known section; ignored")),
        }
    }
    match gpus {
        Some(0) | None => {}
        Some(n) if gpus_visible == 0 => {
            out.warnings.push(format!(
                "gpus.count is {n}, but this machine shows no GPU: the models run on the CPU, and \
                 gpus.memory_gb_per_gpu is the CPU's budget"
            ));
            if !preferred_gpus.is_empty() {
                out.warnings
                    .push("models' preferred_gpu is ignored: there is no GPU to prefer".into());
            }
            preferred_gpus.clear();
        }
        Some(n) => {
            if n > gpus_visible {
                return Err(format!(
                    "gpus.count is {n}, but this machine shows only {gpus_visible} GPU(s)"
                ));
            }
            out.config.devices = (0..n).map(|i| format!("cuda:{i}")).collect();
        }
    }
    for (name, gpu) in preferred_gpus {
        if let Some(m) = out.config.models.get_mut(&name) {
            m.preferred_device = Some(format!("cuda:{gpu}"));
        }
    }
    if let Some(w) = workers.filter(|&w| w > 0) {
        for m in out.config.models.values_mut() {
            m.instances.get_or_insert(w);
        }
        out.warnings.push(format!(
            "server.worker_count_per_gpu ({w}) sets the instances of the models this file lists; \
             repository models keep their own config.yaml's `instances`"
        ));
    }
    out.config.check()?;
    Ok(out)
}

/// How many NVIDIA GPUs this machine shows (through the driver's /proc entries).
pub fn visible_gpus() -> usize {
    std::fs::read_dir("/proc/driver/nvidia/gpus").map_or(0, |d| d.count())
}

fn entries(section: &str, value: &Value) -> Result<Vec<(String, Value)>, String> {
    match value {
        Value::Mapping(m) => Ok(m
            .iter()
            .map(|(k, v)| (k.as_str().unwrap_or("").to_string(), v.clone()))
            .collect()),
        Value::Null => Ok(Vec::new()),
        _ => Err(format!("'{section}' must be a mapping of keys")),
    }
}

/// `server.port`: a number (`8080`), or an address as Go servers write it (`":50051"`,
/// `"0.0.0.0:50051"`), whose host, if any, is the listening host.
fn address(v: &Value) -> Result<(Option<String>, u16), String> {
    let bad = || format!("server.port must be a port number or \":PORT\", not {v:?}");
    let (host, port) = match v {
        Value::Number(n) => (None, n.as_u64().ok_or_else(bad)?),
        Value::String(text) => {
            let (host, port) = text.rsplit_once(':').unwrap_or(("", text));
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = port.trim().parse::<u64>().map_err(|_| bad())?;
            ((!host.is_empty()).then(|| host.to_string()), port)
        }
        _ => return Err(bad()),
    };
    let port =
        u16::try_from(port).map_err(|_| format!("server.port {port} is not a port number"))?;
    Ok((host, port))
}

fn ignored(section: &str, key: &str) -> String {
    format!("{section}.{key} has no counterpart in sheaf; ignored")
}

fn int(section: &str, key: &str, v: Value) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("{section}.{key} must be a whole number >= 0, not {v:?}"))
}

fn string(section: &str, key: &str, v: Value) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{section}.{key} must be a string, not {v:?}"))
}

fn gib_to_mib(section: &str, key: &str, v: Value) -> Result<u64, String> {
    v.as_f64()
        .filter(|g| *g >= 0.0)
        .map(|g| (g * 1024.0).round() as u64)
        .ok_or_else(|| format!("{section}.{key} must be a number of GB >= 0, not {v:?}"))
}

fn strategy(name: &str) -> Result<AssignmentStrategy, String> {
    match name.to_lowercase().as_str() {
        "round_robin" => Ok(AssignmentStrategy::RoundRobin),
        "least_loaded" | "least_memory" => Ok(AssignmentStrategy::LeastLoaded),
        "fewest_models" | "least_models" => Ok(AssignmentStrategy::FewestModels),
        "all" => Ok(AssignmentStrategy::All),
        other => Err(format!(
            "gpus.assignment_strategy '{other}': use round_robin, least_loaded (by memory), \
             fewest_models or all"
        )),
    }
}

/// One entry of `models`, and its preferred GPU.
fn model(
    name: &str,
    value: Value,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<(ListedModel, Option<u64>), String> {
    let section = format!("models.{name}");
    let mut listed = ListedModel {
        model_path: PathBuf::new(),
        preload: false,
        preferred_device: None,
        instances: None,
    };
    let mut gpu = None;
    for (k, v) in entries(&section, &value)? {
        match k.as_str() {
            "model_path" => listed.model_path = base.join(string(&section, &k, v)?),
            "preload" => {
                listed.preload = v
                    .as_bool()
                    .ok_or_else(|| format!("{section}.preload must be true or false"))?
            }
            "preferred_gpu" => gpu = Some(int(&section, &k, v)?),
            _ => warnings.push(ignored(&section, &k)),
        }
    }
    if listed.model_path.as_os_str().is_empty() {
        return Err(format!("{section} needs a model_path"));
    }
    Ok((listed, gpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
server: {port: 8080, worker_count_per_gpu: 2, log_level: debug}
gpus: {count: 2, memory_gb_per_gpu: 1.5, assignment_strategy: least_loaded}
capacity: {max_models: 20, max_memory_gb: 2, eviction_policy: lfu, idle_timeout_minutes: 30}
onnx: {library_path: lib/libonnxruntime.so}
models:
  sanders: {model_path: m/sanders.onnx, preload: true, preferred_gpu: 1}
  obama: {model_path: /abs/obama.onnx}
";

    #[test]
    fn every_key_maps_onto_gpus() {
        assert!(is_grouped(FILE));
        assert!(!is_grouped("devices: [cpu]\n"));
        let t = translate(FILE, 2, Path::new("/cfg")).unwrap();
        let c = &t.config;
        assert_eq!(t.http_port, Some(8080));
        assert_eq!(c.devices, ["cuda:0", "cuda:1"]);
        assert_eq!(c.memory_budget_mb, 1536);
        assert_eq!(c.assignment_strategy, AssignmentStrategy::LeastLoaded);
        assert_eq!(
            (
                c.max_models,
                c.max_memory_mb,
                c.eviction_policy,
                c.idle_timeout_s
            ),
            (20, 2048, EvictionPolicy::Lfu, 1800)
        );
        assert_eq!(
            t.onnx_library.as_deref(),
            Some(Path::new("/cfg/lib/libonnxruntime.so"))
        );
        let sanders = &c.models["sanders"];
        assert_eq!(sanders.model_path, Path::new("/cfg/m/sanders.onnx"));
        assert!(sanders.preload);
        assert_eq!(sanders.preferred_device.as_deref(), Some("cuda:1"));
        assert_eq!(sanders.instances, Some(2));
        assert_eq!(c.models["obama"].model_path, Path::new("/abs/obama.onnx"));
        assert!(t
            .warnings
            .iter()
            .any(|w| w.contains("server.log_level") && w.contains("ignored")));
    }

    #[test]
    fn without_gpus_it_runs_on_the_cpu_and_says_so() {
        let t = translate(FILE, 0, Path::new("/cfg")).unwrap();
        assert_eq!(t.config.devices, ["cpu"]);
        assert_eq!(t.config.models["sanders"].preferred_device, None);
        assert!(t.warnings.iter().any(|w| w.contains("shows no GPU")));
        assert!(translate(FILE, 1, Path::new("/"))
            .unwrap_err()
            .contains("only 1 GPU"));
    }

    #[test]
    fn bad_values_are_named() {
        let bad = |text: &str| translate(text, 0, Path::new("/")).unwrap_err();
        assert!(bad("gpus: {assignment_strategy: random}\n").contains("gpus.assignment_strategy"));
        assert!(bad("capacity: {eviction_policy: fifo}\n").contains("lru or lfu"));
        assert!(bad("capacity: {max_models: -1}\n").contains("capacity.max_models"));
        assert!(bad("server: {port: x}\nmodels: {a: {preload: true}}\n").contains("server.port"));
        assert!(bad("server: {port: 70000}\n").contains("not a port number"));
        assert!(bad("server: {}\nmodels: {a: {preload: true}}\n").contains("needs a model_path"));
    }

    #[test]
    fn a_port_can_be_written_as_an_address() {
        let port = |text: &str| {
            let t = translate(text, 0, Path::new("/")).unwrap();
            (t.host, t.http_port)
        };
        assert_eq!(port("server: {port: \":50051\"}\n"), (None, Some(50051)));
        assert_eq!(port("server: {port: \"50051\"}\n"), (None, Some(50051)));
        assert_eq!(
            port("server: {port: \"0.0.0.0:8080\"}\n"),
            (Some("0.0.0.0".into()), Some(8080))
        );
        assert_eq!(
            port("server: {port: \"0.0.0.0:8080\", host: 127.0.0.1}\n"),
            (Some("127.0.0.1".into()), Some(8080)),
            "an explicit host wins"
        );
    }
}
