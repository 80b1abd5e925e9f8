//! `GET /stats`: the server at a glance, in the JSON shape of seed 001's `/stats`, plus per-model
//! figures the dashboard draws (recent p50/p99 latency and the batch-size histogram), and a
//! `generation` section with each generation model's engine figures.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};
use sheaf_backend::generation::Generator;
use sheaf_core::stats::StatsSnapshot;
use sheaf_core::{ModelInfo, ModelManager, ModelStatus};

/// Seed 001's figures for one reading of the statistics.
fn figures(s: &StatsSnapshot, queued: usize, max_queued: usize) -> Map<String, Value> {
    let requests = s.success.count + s.fail.count;
    let ms = |ns: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            ns as f64 / n as f64 / 1e6
        }
    };
    let mut m = Map::new();
    m.insert("total_requests".into(), json!(requests));
    m.insert("successful_requests".into(), json!(s.success.count));
    m.insert("failed_requests".into(), json!(s.fail.count));
    m.insert("total_batches".into(), json!(s.execution_count));
    m.insert("total_items".into(), json!(s.inference_count));
    m.insert("current_queue_depth".into(), json!(queued));
    m.insert("max_queue_depth".into(), json!(max_queued));
    m.insert(
        "avg_batch_size".into(),
        json!(if s.execution_count == 0 {
            0.0
        } else {
            s.inference_count as f64 / s.execution_count as f64
        }),
    );
    m.insert(
        "avg_wait_time_ms".into(),
        json!(ms(s.queue.ns, s.queue.count)),
    );
    m.insert(
        "avg_generation_time_ms".into(),
        json!(ms(s.compute_infer.ns, s.compute_infer.count)),
    );
    m.insert(
        "total_inference_time_ms".into(),
        json!(s.compute_infer.ns as f64 / 1e6),
    );
    m.insert(
        "avg_request_time_ms".into(),
        json!(ms(s.success.ns, s.success.count)),
    );
    m.insert("stages_ms".into(), stages(s));
    m
}

/// The mean ms of each stage of a request's server time (see `sheaf_core::stages`), what they
/// leave uncovered (`other`) and the whole (`total`), over the answers a protocol wrote.
fn stages(s: &StatsSnapshot) -> Value {
    let mean = |c: sheaf_core::stats::CounterSnapshot| {
        if c.count == 0 {
            0.0
        } else {
            c.ns as f64 / c.count as f64 / 1e6
        }
    };
    let each = [
        ("receive", mean(s.receive)),
        ("queue", mean(s.queue)),
        ("input", mean(s.compute_input)),
        ("wait", mean(s.batch_wait)),
        ("infer", mean(s.compute_infer)),
        ("output", mean(s.compute_output)),
        ("reply", mean(s.reply)),
        ("send", mean(s.send)),
    ];
    let total = mean(s.request);
    let accounted: f64 = each.iter().map(|(_, v)| v).sum();
    let mut m: Map<String, Value> = each
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    m.insert("other".into(), json!((total - accounted).max(0.0)));
    m.insert("total".into(), json!(total));
    m.insert("requests".into(), json!(s.request.count));
    Value::Object(m)
}

/// The model manager's figures for one model: placement, memory, use, loads and evictions.
fn lifecycle(i: &ModelInfo) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("devices".into(), json!(i.devices));
    m.insert("memory_bytes".into(), json!(i.memory_bytes));
    m.insert("memory_source".into(), json!(i.memory_source.name()));
    m.insert("last_used_ms".into(), json!(i.last_used_unix_ms));
    m.insert("usage_count".into(), json!(i.uses));
    m.insert("load_count".into(), json!(i.loads));
    m.insert("eviction_count".into(), json!(i.evictions));
    m
}

/// A generation engine's figures: its sequences, KV cache, tokens and prefix cache.
fn generation(g: &dyn Generator) -> Value {
    let s = g.stats();
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let generated = load(&s.generated_tokens);
    let decode_s = load(&s.decode_ns) as f64 / 1e9;
    let lookups = load(&s.prefix_lookups);
    json!({
        "running_sequences": s.running.load(Ordering::Relaxed),
        "waiting_sequences": s.waiting.load(Ordering::Relaxed),
        "kv_cache_used_cells": s.kv_used.load(Ordering::Relaxed),
        "kv_cache_cells": s.kv_capacity.load(Ordering::Relaxed),
        "prompt_tokens": load(&s.prompt_tokens),
        "generated_tokens": generated,
        "decode_steps": load(&s.steps),
        "tokens_per_second_while_decoding": if decode_s > 0.0 { generated as f64 / decode_s } else { 0.0 },
        "prefix_cache_hit_rate": if lookups > 0 { load(&s.prefix_hits) as f64 / lookups as f64 } else { 0.0 },
        "prefix_tokens_reused": load(&s.prefix_tokens_reused),
        "preemptions": load(&s.preemptions),
        "timeouts": load(&s.timeouts),
        "context_length": g.info().context_length,
    })
}

/// The whole `/stats` document.
pub fn document(manager: &ModelManager) -> Value {
    let devices = manager.devices();
    let mut total = StatsSnapshot::default();
    let (mut queued, mut max_queued) = (0, 0);
    let mut per_device: Vec<(StatsSnapshot, usize, usize)> =
        devices.iter().map(|_| Default::default()).collect();
    let mut models = Map::new();
    let mut model_configs = Map::new();
    let mut generators = Map::new();
    let infos: std::collections::HashMap<String, ModelInfo> = manager
        .model_infos()
        .into_iter()
        .map(|i| (i.name.clone(), i))
        .collect();
    for (name, status) in manager.list() {
        let manager_figures = infos.get(&name).map(lifecycle).unwrap_or_default();
        let ModelStatus::Ready(h) = status else {
            let mut m = manager_figures;
            m.insert("state".into(), json!(status.state().as_str()));
            if let Some(reason) = status.reason() {
                m.insert("reason".into(), json!(reason));
            }
            models.insert(name, Value::Object(m));
            continue;
        };
        // A model's figures count every version it serves.
        let every = h.every_version();
        let mut snapshot = StatsSnapshot::default();
        for version in &every {
            snapshot.merge(&version.stats());
        }
        let (mut mq, mut mmax) = (0, 0);
        let mut recent = None;
        for lane in every.iter().flat_map(|v| v.lanes()) {
            let s = lane.stats.snapshot();
            if let Some(i) = devices.iter().position(|d| d.name == lane.device) {
                let d = &mut per_device[i];
                d.0.merge(&s);
                d.1 += lane.queued_items();
                d.2 = d.2.max(lane.max_queued_items());
            }
            mq += lane.queued_items();
            mmax = mmax.max(lane.max_queued_items());
            recent = recent.or(lane.stats.recent_percentiles());
        }
        queued += mq;
        max_queued = max_queued.max(mmax);
        total.merge(&snapshot);
        let mut m = figures(&snapshot, mq, mmax);
        m.extend(manager_figures);
        m.insert("state".into(), json!("READY"));
        m.insert("version".into(), json!(h.version));
        if every.len() > 1 {
            m.insert("versions".into(), json!(h.served_versions()));
        }
        m.insert("p50_latency_ms".into(), json!(recent.map(|r| r.0)));
        m.insert("p99_latency_ms".into(), json!(recent.map(|r| r.1)));
        if h.sequences().is_some() {
            m.insert("sequences_open".into(), json!(h.open_sequences()));
        }
        m.insert(
            "batch_size_histogram".into(),
            Value::Object(
                snapshot
                    .batches
                    .iter()
                    .map(|b| (b.batch_size.to_string(), json!(b.compute_infer.count)))
                    .collect(),
            ),
        );
        if let Ok(g) = h.generator() {
            generators.insert(name.clone(), generation(g.as_ref()));
        } else {
            m.insert(
                "devices".into(),
                json!(h
                    .lanes()
                    .iter()
                    .map(|l| l.device.clone())
                    .collect::<Vec<_>>()),
            );
        }
        models.insert(name.clone(), Value::Object(m));
        model_configs.insert(
            name,
            json!({
                "max_batch_size": h.max_batch_size,
                "policy": format!("{:?}", h.config.batching.policy),
                "max_queue_delay_us": h.config.max_queue_delay_us,
                "max_queue_size": h.config.max_queue_size,
                "instances": h.config.instances,
            }),
        );
    }
    let mut doc = figures(&total, queued, max_queued);
    doc.insert(
        "config".into(),
        json!({ "devices": devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>(), "routing": manager.routing_name(), "models": model_configs }),
    );
    doc.insert("num_gpus".into(), json!(devices.len()));
    doc.insert(
        "gpu_ids".into(),
        json!(devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>()),
    );
    doc.insert(
        "load_balance_strategy".into(),
        json!(manager.routing_name()),
    );
    doc.insert(
        "per_gpu_stats".into(),
        Value::Array(
            devices
                .iter()
                .zip(per_device)
                .zip(manager.device_usage())
                .enumerate()
                .map(|(i, ((d, (s, q, mq)), usage))| {
                    let mut m = figures(&s, q, mq);
                    m.insert("gpu_id".into(), json!(i));
                    m.insert("device".into(), json!(d.name));
                    m.insert("models_loaded".into(), json!(usage.models));
                    m.insert("memory_used_bytes".into(), json!(usage.memory_used));
                    m.insert("memory_total_bytes".into(), json!(usage.memory_total));
                    m.insert("memory_budget_bytes".into(), json!(usage.memory_budget));
                    Value::Object(m)
                })
                .collect(),
        ),
    );
    doc.insert("models".into(), Value::Object(models));
    if !generators.is_empty() {
        doc.insert("generation".into(), Value::Object(generators));
    }
    Value::Object(doc)
}
