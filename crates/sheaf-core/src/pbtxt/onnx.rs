//! A Triton ONNX model's settings for ONNX Runtime: its `parameters`, and `optimization`'s
//! graph level and execution accelerators, as sheaf's `cuda` and graph settings.

use crate::ModelConfig;

use super::text::{map_entry, message, word, Value};

/// The ONNX Runtime backend's settings among a model's `parameters` (Triton's onnxruntime
/// backend reads these): `intra_op_thread_count` and `inter_op_thread_count` (0: one per core),
/// `execution_mode` (0 one operator at a time, 1 independent operators at once), and the CUDA
/// provider's `cudnn_conv_algo_search` (0 exhaustive, 1 heuristic, 2 default),
/// `gpu_mem_limit` and `arena_extend_strategy` (0 next power of two, 1 same as requested).
/// The backend's other settings are named as passed over. The parameters stay as given too,
/// for a model that reads them.
pub(super) fn onnx_parameters(
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    let cores = || {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    };
    let given: Vec<(String, String)> = config
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in given {
        let path = format!("parameters.{key}");
        let number = |value: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{path}: '{value}' is not a whole number of 0 or more"))
        };
        match key.as_str() {
            "intra_op_thread_count" => {
                config.intra_op_threads = match number(&value)? {
                    0 => cores(),
                    n => n as usize,
                }
            }
            "inter_op_thread_count" => {
                config.inter_op_threads = match number(&value)? {
                    0 => cores(),
                    n => n as usize,
                }
            }
            "execution_mode" => {
                config.parallel_execution = match number(&value)? {
                    0 => false,
                    1 => true,
                    n => {
                        return Err(format!(
                            "{path}: {n} is neither 0 (sequential) nor 1 (parallel)"
                        ))
                    }
                }
            }
            "cudnn_conv_algo_search" | "gpu_mem_limit" | "arena_extend_strategy" => {
                cuda_setting(&path, &key, &value, config)?
            }
            "enable_mem_arena"
            | "enable_mem_pattern"
            | "memory.enable_memory_arena_shrinkage"
            | "session.use_device_allocator_for_initializers"
            | "do_copy_in_default_stream" => ignored.push(format!(
                "{path} (an ONNX Runtime setting sheaf sets itself: its sessions share one \
                 memory arena per device)"
            )),
            _ => {}
        }
    }
    Ok(())
}

/// One of the CUDA provider's settings, under the name Triton's onnxruntime backend gives it.
fn cuda_setting(
    path: &str,
    key: &str,
    value: &str,
    config: &mut ModelConfig,
) -> Result<(), String> {
    use crate::config::{ArenaExtendConfig, ConvAlgoSearchConfig};
    let value = value.trim();
    let bad = |what: &str| format!("{path}: '{value}' is not {what}");
    match key {
        "cudnn_conv_algo_search" => {
            config.cuda.cudnn_conv_algo_search = match value {
                "0" => ConvAlgoSearchConfig::Exhaustive,
                "1" => ConvAlgoSearchConfig::Heuristic,
                "2" => ConvAlgoSearchConfig::Default,
                _ => return Err(bad("0 (exhaustive), 1 (heuristic) or 2 (default)")),
            }
        }
        "gpu_mem_limit" => {
            config.cuda.gpu_mem_limit =
                Some(value.parse::<u64>().map_err(|_| bad("a number of bytes"))?)
        }
        _ => {
            config.cuda.arena_extend_strategy = match value {
                "0" => ArenaExtendConfig::NextPowerOfTwo,
                "1" => ArenaExtendConfig::SameAsRequested,
                _ => return Err(bad("0 (next power of two) or 1 (same as requested)")),
            }
        }
    }
    Ok(())
}

/// Triton's `optimization`: `graph { level }` (-1 basic, 1 extended, 2 none, 0 all, as Triton's
/// onnxruntime backend reads it), and the `cuda` execution accelerator's settings (as
/// [`cuda_setting`]). Other accelerators (TensorRT, OpenVINO) and fields are named as passed
/// over: sheaf runs ONNX models on ONNX Runtime's CPU and CUDA providers.
pub(super) fn optimization(
    value: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    use crate::config::GraphOptimizationConfig as Level;
    for (name, value) in message("optimization", value)? {
        let path = format!("optimization.{name}");
        match name.as_str() {
            "graph" => {
                for (field, value) in message(&path, value)? {
                    let inner = format!("{path}.{field}");
                    match field.as_str() {
                        "level" => {
                            config.graph_optimization = match word(&inner, value)? {
                                "0" => Level::All,
                                "-1" => Level::Basic,
                                "1" => Level::Extended,
                                "2" => Level::Disabled,
                                other => {
                                    return Err(format!(
                                        "{inner}: {other} is not -1 (basic), 0 (all), 1 \
                                         (extended) or 2 (none)"
                                    ))
                                }
                            }
                        }
                        _ => ignored.push(inner),
                    }
                }
            }
            "execution_accelerators" => {
                for (kind, list) in message(&path, value)? {
                    for accelerator in list.items() {
                        accelerator_settings(
                            &format!("{path}.{kind}"),
                            accelerator,
                            config,
                            ignored,
                        )?;
                    }
                }
            }
            _ => ignored.push(path),
        }
    }
    Ok(())
}

/// One execution accelerator: the `cuda` one's settings are read; any other is named as passed
/// over.
fn accelerator_settings(
    path: &str,
    accelerator: &Value,
    config: &mut ModelConfig,
    ignored: &mut Vec<String>,
) -> Result<(), String> {
    let fields = message(path, accelerator)?;
    let name = fields
        .iter()
        .find(|(n, _)| n == "name")
        .map(|(_, v)| word(&format!("{path}.name"), v))
        .transpose()?
        .unwrap_or("");
    if name != "cuda" {
        ignored.push(format!(
            "{path} \"{name}\" (sheaf runs ONNX models on ONNX Runtime's CPU and CUDA providers)"
        ));
        return Ok(());
    }
    for (field, value) in fields {
        if field != "parameters" {
            continue;
        }
        for entry in value.items() {
            let (key, value) = map_entry(&format!("{path}.parameters"), entry)?;
            let at = format!("{path}[cuda].parameters.{key}");
            let value = value.map(|v| word(&at, v)).transpose()?.unwrap_or("");
            match key.as_str() {
                "cudnn_conv_algo_search" | "gpu_mem_limit" | "arena_extend_strategy" => {
                    cuda_setting(&at, &key, value, config)?
                }
                _ => ignored.push(at),
            }
        }
    }
    Ok(())
}
