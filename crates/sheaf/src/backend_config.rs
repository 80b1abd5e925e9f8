//! tritonserver's `--backend-config`: `BACKEND,SETTING=VALUE` for one backend, or
//! `SETTING=VALUE` for every one, as the command lines that start Triton's Python backend pass
//! them (`--backend-config=python,shm-default-byte-size=...`).
//!
//! Of Triton's settings, sheaf takes:
//! - `default-max-batch-size=N` (every backend, `python` or `onnxruntime`): the batch size a
//!   batchable model whose configuration gives none is completed with (sheaf's default: 32);
//! - the Python backend's `shm-default-byte-size`, `shm-growth-byte-size`,
//!   `shm-region-prefix-name`, `stub-timeout-seconds` and `stub-health-check-interval-seconds`,
//!   which size and watch Triton's stub processes: sheaf's Python processes grow their shared
//!   memory with each batch, name their own regions, are waited for as long as `initialize`
//!   takes, and are seen the moment they end, so these have nothing to set there; each is
//!   checked and said so in the log.
//!
//! Any other setting, or another backend, stops the start with the reason, never passed over
//! unseen.

use sheaf_core::DefaultBatchSizes;

/// What the `--backend-config` values set.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BackendConfig {
    pub default_max_batch_size: DefaultBatchSizes,
    /// The settings taken with nothing to set, each with why: for the log.
    pub nothing_to_set: Vec<(String, &'static str)>,
}

/// The Python backend's settings that size or watch Triton's stub processes, and why sheaf has
/// nothing to set for each.
const PYTHON_STUB: [(&str, &str); 5] = [
    ("shm-default-byte-size", "sheaf's Python processes grow their shared memory with each batch"),
    ("shm-growth-byte-size", "sheaf's Python processes grow their shared memory with each batch"),
    ("shm-region-prefix-name", "sheaf names each process's shared-memory regions itself, apart from any other server's"),
    ("stub-timeout-seconds", "sheaf waits for a Python model's initialize as long as it takes, and fails its requests by the model's execution_timeout_ms"),
    ("stub-health-check-interval-seconds", "sheaf sees a Python process end the moment it does, and starts it again"),
];

/// Reads the `--backend-config` values.
pub fn read(values: &[String]) -> Result<BackendConfig, String> {
    let mut config = BackendConfig::default();
    for value in values {
        let bad = |why: String| format!("--backend-config '{value}': {why}");
        // `BACKEND,SETTING=VALUE`, or `SETTING=VALUE` for every backend.
        let (backend, setting) = match value.split_once(',') {
            Some((backend, rest)) if !backend.contains('=') => (Some(backend.trim()), rest),
            _ => (None, value.as_str()),
        };
        let (key, setting_value) = setting
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| bad("give BACKEND,SETTING=VALUE or SETTING=VALUE".into()))?;
        match (backend, key) {
            (None | Some("python" | "onnxruntime"), "default-max-batch-size") => {
                let n: usize = setting_value
                    .parse()
                    .map_err(|_| bad(format!("'{setting_value}' is not a batch size")))?;
                let sizes = &mut config.default_max_batch_size;
                match backend {
                    None => sizes.every = Some(n),
                    Some(b) => {
                        sizes.per_backend.retain(|(known, _)| known != b);
                        sizes.per_backend.push((b.to_string(), n));
                    }
                }
            }
            (Some("python"), key) => {
                let (_, why) = PYTHON_STUB
                    .iter()
                    .find(|(known, _)| *known == key)
                    .ok_or_else(|| {
                        bad(format!(
                            "the Python backend takes default-max-batch-size, {}; not '{key}'",
                            PYTHON_STUB.map(|(k, _)| k).join(", ")
                        ))
                    })?;
                let numeric = key != "shm-region-prefix-name";
                if numeric && setting_value.parse::<u64>().is_err() {
                    return Err(bad(format!("'{setting_value}' is not a number")));
                }
                config.nothing_to_set.push((value.clone(), why));
            }
            (Some("onnxruntime") | None, key) => {
                return Err(bad(format!(
                    "'{key}' is not a setting sheaf takes here: ONNX Runtime's settings are per \
                     model (config.yaml's intra_op_threads, inter_op_threads, cuda, or a \
                     config.pbtxt's parameters), and default-max-batch-size is the only \
                     setting for every backend"
                )))
            }
            (Some(other), _) => {
                return Err(bad(format!(
                    "sheaf has no '{other}' backend; its backends are onnxruntime, python and \
                     llama.cpp (GGUF), each built in"
                )))
            }
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(values: &[&str]) -> Result<BackendConfig, String> {
        read(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn default_max_batch_size_for_every_backend_and_for_one() {
        let config = read_all(&[
            "default-max-batch-size=8",
            "python,default-max-batch-size=2",
            "python,default-max-batch-size=4",
        ])
        .unwrap();
        assert_eq!(
            config.default_max_batch_size,
            DefaultBatchSizes {
                every: Some(8),
                per_backend: vec![("python".into(), 4)],
            }
        );
        assert!(config.nothing_to_set.is_empty());
    }

    #[test]
    fn the_python_stub_settings_are_taken_with_why() {
        let config = read_all(&[
            "python,shm-default-byte-size=67108864",
            "python,shm-growth-byte-size=8388608",
            "python,shm-region-prefix-name=prefix0_",
            "python,stub-timeout-seconds=600",
            "python,stub-health-check-interval-seconds=30",
        ])
        .unwrap();
        assert_eq!(config.nothing_to_set.len(), 5);
        assert!(config.nothing_to_set[0].1.contains("grow"));
    }

    #[test]
    fn other_settings_and_backends_stop_the_start_with_the_reason() {
        let cases = [
            ("python,shm-default-byte-size=lots", "is not a number"),
            (
                "python,no-such=1",
                "the Python backend takes default-max-batch-size",
            ),
            (
                "onnxruntime,enable-global-threadpool=1",
                "settings are per model",
            ),
            ("enable-global-threadpool=1", "settings are per model"),
            ("tensorflow,version=2", "no 'tensorflow' backend"),
            ("default-max-batch-size=x", "is not a batch size"),
            ("python,shm-default-byte-size", "give BACKEND,SETTING=VALUE"),
        ];
        for (value, why) in cases {
            let err = read_all(&[value]).unwrap_err();
            assert!(err.contains(why), "{value}: {err}");
            assert!(err.starts_with("--backend-config"), "{err}");
        }
    }
}
