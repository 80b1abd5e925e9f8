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
//! With `--metrics-config summary_latencies=true`, the latency summaries too
//! (`nv_inference_*_summary_us`, see [`crate::summary`]); `counter_latencies=false` leaves the
//! cumulative latency counters out.
//!
//! Triton names its counters without `_total`, which OpenMetrics (and so `prometheus_client`'s
//! encoder) always adds; these lines are written here in Prometheus' text format 0.0.4, which
//! allows it.

use std::fmt::Write;
use std::sync::Mutex;

use crate::stats::StatsSnapshot;
use crate::summary::{quantile, LatencyMetrics};

/// Triton's summaries: name, help, the series' place in [`ModelFigures::summaries`], and the
/// counter (count, ns) its `_count` and `_sum` are.
type SummaryFamily = (
    &'static str,
    &'static str,
    usize,
    fn(&StatsSnapshot) -> (u64, u64),
);

#[rustfmt::skip]
const SUMMARIES: [SummaryFamily; 5] = [
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached requests)", 0, |s| (s.success.count, s.success.ns)),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached requests)", 1, |s| (s.queue.count, s.queue.ns)),
    ("nv_inference_compute_input_summary_us", "Summary of compute input duration in microseconds (does not include cached requests)", 2, |s| (s.compute_input.count, s.compute_input.ns)),
    ("nv_inference_compute_infer_summary_us", "Summary of compute inference duration in microseconds (does not include cached requests)", 3, |s| (s.compute_infer.count, s.compute_infer.ns)),
    ("nv_inference_compute_output_summary_us", "Summary of inference compute output duration in microseconds (does not include cached requests)", 4, |s| (s.compute_output.count, s.compute_output.ns)),
];

/// The summaries' lines: per model, `_count` and `_sum` (the counters') and each quantile of
/// the recent latencies.
fn summaries(models: &[ModelFigures], quantiles: &[f64], out: &mut String) {
    for (name, help, at, counter) in SUMMARIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
        for m in models {
            let Some(series) = &m.summaries else { continue };
            let labels = labels(m);
            let (count, ns) = counter(&m.stats);
            let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", ns as f64 / 1000.0);
            for &q in quantiles {
                let v = quantile(&series[at], q);
                let _ = writeln!(out, "{name}{{{labels},quantile=\"{q}\"}} {v}");
            }
        }
    }
}

/// One ready model's figures.
pub(crate) struct ModelFigures {
    pub name: String,
    pub version: String,
    pub stats: StatsSnapshot,
    /// Items waiting for a batch.
    pub pending: usize,
    pub cached: bool,
    /// The recent latencies of the summaries (request, queue, compute input, infer, output),
    /// sorted; `None` when they are off.
    pub summaries: Option<[Vec<f64>; 5]>,
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

/// Appends the Triton-named lines for `models` to `out` (the latency counters and summaries
/// as `latency` says), and the host's with its `cpu` sampler (none: `--allow-cpu-metrics
/// false`).
pub(crate) fn render(
    models: &[ModelFigures],
    latency: &LatencyMetrics,
    cpu: Option<&CpuSampler>,
    out: &mut String,
) {
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
        if !latency.counters && name.ends_with("_duration_us") && name.starts_with("nv_inference") {
            continue;
        }
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
    if let Some(quantiles) = &latency.quantiles {
        summaries(models, quantiles, out);
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
        .and_then(|m| crate::host_memory::host(&m))
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
    fn the_host_s_cpu_is_read_from_proc() {
        let stat = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n";
        let t = cpu_times(stat).unwrap();
        assert_eq!((t.busy, t.total), (160, 1000));
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
            summaries: None,
        };
        let mut out = String::new();
        let latency = LatencyMetrics::default();
        render(&[m], &latency, Some(&CpuSampler::default()), &mut out);
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
        // No response cache: no cache lines; no summaries by default.
        assert!(!out.contains("nv_cache_"), "{out}");
        assert!(!out.contains("_summary_us"), "{out}");
        // The host's lines come with a sampler, and not without (`--allow-cpu-metrics false`).
        assert!(out.contains("\nnv_cpu_memory_total_bytes "), "{out}");
        let mut without = String::new();
        render(&[], &latency, None, &mut without);
        assert!(!without.contains("nv_cpu_"), "{without}");
    }

    #[test]
    fn summaries_replace_or_join_the_latency_counters() {
        let mut stats = StatsSnapshot::default();
        stats.success.count = 4;
        stats.success.ns = 10_000;
        stats.queue.count = 4;
        stats.queue.ns = 2_000;
        let request: Vec<f64> = vec![1.0, 2.0, 3.0, 4.0];
        let m = ModelFigures {
            name: "m".into(),
            version: "2".into(),
            stats,
            pending: 0,
            cached: false,
            summaries: Some([request, vec![0.5; 4], vec![], vec![], vec![]]),
        };
        let latency = LatencyMetrics {
            counters: false,
            quantiles: Some(vec![0.5, 0.99]),
        };
        let mut out = String::new();
        render(&[m], &latency, None, &mut out);
        for line in [
            "# TYPE nv_inference_request_summary_us summary",
            "nv_inference_request_summary_us_count{model=\"m\",version=\"2\"} 4",
            "nv_inference_request_summary_us_sum{model=\"m\",version=\"2\"} 10",
            "nv_inference_request_summary_us{model=\"m\",version=\"2\",quantile=\"0.5\"} 2",
            "nv_inference_request_summary_us{model=\"m\",version=\"2\",quantile=\"0.99\"} 4",
            "nv_inference_queue_summary_us{model=\"m\",version=\"2\",quantile=\"0.5\"} 0.5",
            "nv_inference_compute_infer_summary_us{model=\"m\",version=\"2\",quantile=\"0.5\"} NaN",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} not in\n{out}");
        }
        // counter_latencies=false: the cumulative latency counters go, the counts stay.
        assert!(!out.contains("nv_inference_request_duration_us"), "{out}");
        assert!(!out.contains("nv_inference_queue_duration_us"), "{out}");
        assert!(out.contains("nv_inference_request_success{"), "{out}");
    }
}
