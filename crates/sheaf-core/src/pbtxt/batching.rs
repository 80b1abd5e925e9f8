//! `dynamic_batching`: preferred sizes, the queue delay, priority levels and their queue
//! policies.

use crate::config::{LevelQueuePolicy, PolicyKind, TimeoutActionConfig};
use crate::ModelConfig;

use super::text::{boolean, count, counts, map_entry, message, word, Value};

pub(super) fn dynamic_batching(
    value: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    // Triton's dynamic batcher waits up to the queue delay for a preferred size: sheaf's
    // `fixed` policy.
    config.batching.policy = PolicyKind::Fixed;
    config.max_queue_delay_us = 0;
    for (name, value) in message("dynamic_batching", value)? {
        let path = format!("dynamic_batching.{name}");
        match name.as_str() {
            "preferred_batch_size" => config.preferred_batch_sizes = counts(&path, value)?,
            "max_queue_delay_microseconds" => {
                config.max_queue_delay_us = count(&path, value)? as u64
            }
            "priority_levels" => config.priority_levels = count(&path, value)?.max(1),
            "default_priority_level" => {
                let level = count(&path, value)?;
                config.default_priority_level = (level > 0).then_some(level);
            }
            "default_queue_policy" => {
                let policy = queue_policy(&path, value, ignored)?;
                if let Some(action) = policy.timeout_action {
                    config.timeout_action = action;
                }
                if let Some(timeout) = policy.default_timeout_us {
                    config.default_timeout_us = timeout;
                }
                if let Some(size) = policy.max_queue_size {
                    config.max_queue_size = size;
                }
                if let Some(allow) = policy.allow_timeout_override {
                    config.allow_timeout_override = Some(allow);
                }
            }
            "priority_queue_policy" => {
                for entry in value.items() {
                    let (key, policy) = map_entry(&path, entry)?;
                    let level = key
                        .parse::<usize>()
                        .map_err(|_| format!("{path}: '{key}' is not a priority level"))?;
                    let policy = match policy {
                        Some(p) => queue_policy(&format!("{path}.{level}"), p, ignored)?,
                        None => LevelQueuePolicy::default(),
                    };
                    config.priority_queue_policy.insert(level, policy);
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(())
}

/// A `ModelQueuePolicy` message: what it sets (a `max_queue_size` of 0 is Triton's "no bound").
fn queue_policy(
    path: &str,
    value: &Value,
    ignored: &mut Vec<String>,
) -> Result<LevelQueuePolicy, String> {
    let mut policy = LevelQueuePolicy::default();
    for (name, value) in message(path, value)? {
        let inner = format!("{path}.{name}");
        match name.as_str() {
            "timeout_action" => {
                policy.timeout_action = Some(match word(&inner, value)? {
                    "REJECT" => TimeoutActionConfig::Reject,
                    "DELAY" => TimeoutActionConfig::Delay,
                    other => return Err(format!("{inner}: unknown action '{other}'")),
                })
            }
            "default_timeout_microseconds" => {
                policy.default_timeout_us = Some(count(&inner, value)? as u64)
            }
            "max_queue_size" => {
                policy.max_queue_size = Some(count(&inner, value)?).filter(|&n| n > 0)
            }
            "allow_timeout_override" => {
                policy.allow_timeout_override = Some(boolean(&inner, value)?)
            }
            _ => ignored.push(inner),
        }
    }
    Ok(policy)
}
