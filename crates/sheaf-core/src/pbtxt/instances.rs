//! `instance_group`: count and kind, and each group's `rate_limiter` ([`crate::rate_limit`]).

use crate::rate_limit::{RateLimiterConfig, ResourceNeed};

use super::text::{count, counts, message, word, Value};

/// One `instance_group`: its instances (`count`, 1 when absent), the device they prefer (none:
/// any) and its `rate_limiter`. Of several `gpus`, the first is taken and the rest named as
/// passed over.
pub(super) fn instance_group(value: &Value, ignored: &mut Vec<String>) -> Result<Group, String> {
    let mut gpus = Vec::new();
    let mut kind = "KIND_AUTO".to_string();
    let mut instances = 1;
    let mut limiter = None;
    for (name, value) in message("instance_group", value)? {
        let path = format!("instance_group.{name}");
        match name.as_str() {
            "count" => instances = count(&path, value)?.max(1),
            "kind" => kind = word(&path, value)?.to_string(),
            "gpus" => gpus = counts(&path, value)?,
            "rate_limiter" => limiter = Some(rate_limiter(value, ignored)?),
            "name" => {}
            _ => ignored.push(path),
        }
    }
    let device = match (kind.as_str(), gpus.first()) {
        ("KIND_CPU", _) => Some("cpu".into()),
        ("KIND_GPU", Some(gpu)) => Some(format!("cuda:{gpu}")),
        ("KIND_GPU", None) => Some("cuda:0".into()),
        ("KIND_AUTO", _) => None,
        (other, _) => {
            ignored.push(format!("instance_group.kind {other}"));
            None
        }
    };
    if kind == "KIND_GPU" && gpus.len() > 1 {
        ignored.push(format!(
            "instance_group.gpus {gpus:?} (the instances load on cuda:{}; sheaf.yaml's devices \
             spread a model over several)",
            gpus[0]
        ));
    }
    Ok(Group {
        instances,
        device,
        limiter,
    })
}

/// What one `instance_group` says.
pub(super) struct Group {
    pub(super) instances: usize,
    pub(super) device: Option<String>,
    pub(super) limiter: Option<RateLimiterConfig>,
}

/// `rate_limiter { resources [ { name: "R1" count: 2 global: true } ] priority: 1 }`.
pub(super) fn rate_limiter(
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<RateLimiterConfig, String> {
    let mut config = RateLimiterConfig::default();
    for (name, value) in message("instance_group.rate_limiter", value)? {
        let path = format!("instance_group.rate_limiter.{name}");
        match name.as_str() {
            "priority" => {
                config.priority =
                    u32::try_from(count(&path, value)?).map_err(|_| format!("{path}: too large"))?
            }
            "resources" => {
                for resource in value.items() {
                    let mut need = ResourceNeed {
                        name: String::new(),
                        count: 0,
                        global: false,
                    };
                    for (field, value) in message(&path, resource)? {
                        let at = format!("{path}.{field}");
                        match field.as_str() {
                            "name" => need.name = word(&at, value)?.to_string(),
                            "count" => need.count = count(&at, value)?,
                            "global" => {
                                need.global = match word(&at, value)?.to_ascii_lowercase().as_str()
                                {
                                    "true" => true,
                                    "false" => false,
                                    other => {
                                        return Err(format!(
                                            "{at}: {other} is neither true nor false"
                                        ))
                                    }
                                }
                            }
                            _ => ignored.push(at),
                        }
                    }
                    if need.name.is_empty() {
                        return Err(format!("{path}: a resource without a name"));
                    }
                    config.resources.push(need);
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(config)
}
