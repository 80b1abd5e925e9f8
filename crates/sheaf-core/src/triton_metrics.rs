//! Triton's metric names beside sheaf's own, so that dashboards and autoscalers written for
//! Triton (Grafana boards, a Kubernetes HPA on `nv_inference_queue_duration_us`) read sheaf
//! unchanged.
//!
//! Per ready model (labels `model` and `version`): `nv_inference_request_success` and
//! `_failure`, `nv_inference_count` and `nv_inference_exec_count`, the cumulative
//! `nv_inference_request_duration_us`, `_queue_duration_us`, `_compute_input_duration_us`,
//! `_compute_infer_duration_us` and `_compute_output_duration_us`,
//! `nv_inference_pending_request_count` (items waiting, in a batch being formed or in the
//! queue), and for a model with the response cache `nv_cache_num_hits_per_model`,
//! `nv_cache_num_misses_per_model`, `nv_cache_hit_duration_per_model` and
//! `nv_cache_miss_duration_per_model` (microseconds). For the host: `nv_cpu_utilization` (since
//! the previous scrape), `nv_cpu_memory_total_bytes` and `nv_cpu_memory_used_bytes`. The values
//! are those of the statistics extension (`/v2/models/stats`), so both always agree; a model
//! loaded again starts from zero, as a counter reset.
//!
//! Triton names its counters without `_total`, which OpenMetrics (and so `prometheus_client`'s
//! encoder) always adds; these lines are written here in Prometheus' text format 0.0.4, which
//! allows it.

use std::fmt::Write;
use std::sync::Mutex;

use crate::stats::StatsSnapshot;

/// One ready model's figures.
pub(crate) struct ModelFigures {
    pub name: String,
    pub version: String,
    pub stats: StatsSnapshot,
    /// Items waiting for a batch.
    pub pending: usize,
    pub cached: bool,
}

/// The host's CPU time at the previous scrape, for the utilization between two scrapes.
#[derive(Default)]
pub(crate) struct CpuSampler(Mutex<Option<CpuTimes>>);

#[derive(Clone, Copy)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuSampler {
    /// The share of the host's CPU time that was busy since the previous call (since boot the
    /// first time); `None` where `/proc/stat` cannot be read.
    fn utilization(&self) -> Option<f64> {
        let now = cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let mut before = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let from = before
            .replace(now)
            .unwrap_or(CpuTimes { busy: 0, total: 0 });
        let total = now.total.saturating_sub(from.total);
        (total > 0).then(|| now.busy.saturating_sub(from.busy) as f64 / total as f64)
    }
}

/// The `cpu` line of `/proc/stat`: busy and total ticks (idle and iowait are not busy).
fn cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest times are within user and nice).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// Total and used RAM in bytes (used: total less available), from `/proc/meminfo`.
fn memory(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some((total, total.saturating_sub(available)))
}

/// Appends the Triton-named lines for `models` to `out`, and the host's with its `cpu` sampler
/// (none: `--allow-cpu-metrics false`).
pub(crate) fn render(models: &[ModelFigures], cpu: Option<&CpuSampler>, out: &mut String) {
    type Value = fn(&ModelFigures) -> Option<f64>;
    let families: [(&str, &str, &str, Value); 14] = [
        ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes", |m| Some(m.stats.success.count as f64)),
        ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes", |m| Some(m.stats.fail.count as f64)),
        ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)", |m| Some(m.stats.inference_count as f64)),
        ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)", |m| Some(m.stats.execution_count as f64)),
        ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds (includes cached requests)", |m| Some(m.stats.success.ns as f64 / 1000.0)),
        ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds (includes cached requests)", |m| Some(m.stats.queue.ns as f64 / 1000.0)),
        ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds (does not include cached requests)", |m| Some(m.stats.compute_input.ns as f64 / 1000.0)),
        ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds (does not include cached requests)", |m| Some(m.stats.compute_infer.ns as f64 / 1000.0)),
        ("nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in microseconds (does not include cached requests)", |m| Some(m.stats.compute_output.ns as f64 / 1000.0)),
        ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model", |m| Some(m.pending as f64)),
        ("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model", |m| m.cached.then_some(m.stats.cache_hit.count as f64)),
        ("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model", |m| m.cached.then_some(m.stats.cache_miss.count as f64)),
        ("nv_cache_hit_duration_per_model", "counter", "Total cache hit duration per model, in microseconds", |m| m.cached.then_some(m.stats.cache_hit.ns as f64 / 1000.0)),
        ("nv_cache_miss_duration_per_model", "counter", "Total cache miss (insert+lookup) duration per model, in microseconds", |m| m.cached.then_some(m.stats.cache_miss.ns as f64 / 1000.0)),
    ];
    for (name, kind, help, value) in families {
        let lines: Vec<(String, f64)> = models
            .iter()
            .filter_map(|m| value(m).map(|v| (labels(m), v)))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in lines {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
    let Some(cpu) = cpu else { return };
    if let Some(share) = cpu.utilization() {
        gauge(
            out,
            "nv_cpu_utilization",
            "CPU utilization rate [0.0 - 1.0]",
            share,
        );
    }
    if let Some((total, used)) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| memory(&m))
    {
        gauge(
            out,
            "nv_cpu_memory_total_bytes",
            "CPU total memory (RAM), in bytes",
            total as f64,
        );
        gauge(
            out,
            "nv_cpu_memory_used_bytes",
            "CPU used memory (RAM), in bytes",
            used as f64,
        );
    }
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn labels(m: &ModelFigures) -> String {
    format!(
        "model=\"{}\",version=\"{}\"",
        escape(&m.name),
        escape(&m.version)
    )
}

/// A label value as the text format writes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_s_cpu_and_memory_are_read_from_proc() {
        let stat = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n";
        let t = cpu_times(stat).unwrap();
        assert_eq!((t.busy, t.total), (160, 1000));
        let meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n";
        assert_eq!(memory(meminfo), Some((1_024_000, 614_400)));
        assert_eq!(memory("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn each_model_s_figures_are_written_under_triton_s_names() {
        let mut stats = StatsSnapshot::default();
        stats.success.count = 3;
        stats.success.ns = 4_500;
        stats.queue.ns = 1_000;
        stats.inference_count = 7;
        stats.execution_count = 2;
        let m = ModelFigures {
            name: "a\"b".into(),
            version: "1".into(),
            stats,
            pending: 4,
            cached: false,
        };
        let mut out = String::new();
        render(&[m], Some(&CpuSampler::default()), &mut out);
        for line in [
            "# TYPE nv_inference_request_success counter",
            "nv_inference_request_success{model=\"a\\\"b\",version=\"1\"} 3",
            "nv_inference_count{model=\"a\\\"b\",version=\"1\"} 7",
            "nv_inference_exec_count{model=\"a\\\"b\",version=\"1\"} 2",
            "nv_inference_request_duration_us{model=\"a\\\"b\",version=\"1\"} 4.5",
            "nv_inference_queue_duration_us{model=\"a\\\"b\",version=\"1\"} 1",
            "# TYPE nv_inference_pending_request_count gauge",
            "nv_inference_pending_request_count{model=\"a\\\"b\",version=\"1\"} 4",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} not in\n{out}");
        }
        // No response cache: no cache lines.
        assert!(!out.contains("nv_cache_"), "{out}");
        // The host's lines come with a sampler, and not without (`--allow-cpu-metrics false`).
        assert!(out.contains("\nnv_cpu_memory_total_bytes "), "{out}");
        let mut without = String::new();
        render(&[], None, &mut without);
        assert!(!without.contains("nv_cpu_"), "{without}");
    }
}
