//! Server and model metadata, and Triton-shaped statistics, as JSON.

use serde_json::{json, Value};
use sheaf_backend::TensorSpec;
use sheaf_core::stats::{CounterSnapshot, StatsSnapshot};
use sheaf_core::ModelHandle;

/// Protocol extensions sheaf implements.
pub const EXTENSIONS: &[&str] = &["binary_tensor_data", "statistics"];

/// `GET /v2`.
pub fn server() -> Value {
    json!({
        "name": "sheaf",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    })
}

/// `GET /v2/models/{m}`.
pub fn model(handle: &ModelHandle) -> Value {
    let tensors = |specs: &[TensorSpec]| -> Vec<Value> {
        specs
            .iter()
            .map(|s| json!({ "name": s.name, "datatype": s.dtype.as_str(), "shape": s.shape }))
            .collect()
    };
    json!({
        "name": handle.name,
        "versions": [handle.version],
        "platform": handle.platform,
        "inputs": tensors(&handle.signature.inputs),
        "outputs": tensors(&handle.signature.outputs),
    })
}

fn counter(c: CounterSnapshot) -> Value {
    json!({ "count": c.count, "ns": c.ns })
}

/// One entry of `model_stats` in Triton's statistics extension.
pub fn model_stats(handle: &ModelHandle, s: &StatsSnapshot) -> Value {
    json!({
        "name": handle.name,
        "version": handle.version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": counter(s.success),
            "fail": counter(s.fail),
            "queue": counter(s.queue),
            "compute_input": counter(s.compute_input),
            "compute_infer": counter(s.compute_infer),
            "compute_output": counter(s.compute_output),
            "cache_hit": counter(CounterSnapshot::default()),
            "cache_miss": counter(CounterSnapshot::default()),
        },
        "batch_stats": s.batches.iter().map(|b| json!({
            "batch_size": b.batch_size,
            "compute_input": counter(b.compute_input),
            "compute_infer": counter(b.compute_infer),
            "compute_output": counter(b.compute_output),
        })).collect::<Vec<_>>(),
        "memory_usage": [],
    })
}
