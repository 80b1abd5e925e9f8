//! Every Prometheus metric sheaf exports, declared in one place.
//!
//! Names carry the `sheaf_` prefix, `_seconds` and `_bytes` units and `_total` on counters (added
//! by the encoder). Labels are `model`, `version` and `device`, plus `reason` on failures, whose
//! values come from a fixed set. Request, queue and compute metrics are recorded where the
//! statistics are; gauges are sampled from the live state when `/metrics` is scraped. The
//! metrics models define themselves follow, under the names they gave them
//! ([`crate::custom_metrics`]).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::ErrorKind;

/// Which model, version and device a sample belongs to.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
    pub version: String,
    pub device: String,
}

/// One stage of a request's server time (see [`crate::stages`]), of one model.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub model: String,
    pub version: String,
    pub device: String,
    pub stage: &'static str,
}

/// A failed request: its model and why it failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub model: String,
    pub version: String,
    pub device: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LifecycleLabels {
    pub model: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    pub device: String,
}

/// A generation model.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenLabels {
    pub model: String,
}

/// Prompt or completion tokens.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model: String,
    pub kind: &'static str,
}

/// Running or waiting sequences.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SequenceLabels {
    pub model: String,
    pub state: &'static str,
}

type GenHistograms = Family<GenLabels, Histogram, fn() -> Histogram>;

/// The metrics of generation models: latencies are recorded as tokens leave; the rest is
/// sampled from the engines when `/metrics` is scraped.
pub struct GenerationMetrics {
    pub time_to_first_token: GenHistograms,
    pub inter_token_latency: GenHistograms,
    pub tokens: Family<TokenLabels, Counter>,
    pub sequences: Family<SequenceLabels, Gauge>,
    pub kv_cache_used: Family<GenLabels, Gauge>,
    pub kv_cache_capacity: Family<GenLabels, Gauge>,
    pub prefix_lookups: Family<GenLabels, Counter>,
    pub prefix_hits: Family<GenLabels, Counter>,
    pub preemptions: Family<GenLabels, Counter>,
    pub decode_steps: Family<GenLabels, Counter>,
}

impl GenerationMetrics {
    /// Copies a generation engine's live counters into the metrics of `model`.
    pub fn sample(&self, model: &str, s: &sheaf_backend::generation::GeneratorStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let raise = |c: &Counter, to: u64| {
            let now = c.get();
            if to > now {
                c.inc_by(to - now);
            }
        };
        let labels = GenLabels {
            model: model.to_string(),
        };
        for (kind, n) in [
            ("prompt", s.prompt_tokens.load(Relaxed)),
            ("completion", s.generated_tokens.load(Relaxed)),
        ] {
            let token = TokenLabels {
                model: model.to_string(),
                kind,
            };
            raise(&self.tokens.get_or_create(&token), n);
        }
        for (state, n) in [
            ("running", s.running.load(Relaxed)),
            ("waiting", s.waiting.load(Relaxed)),
        ] {
            let sequence = SequenceLabels {
                model: model.to_string(),
                state,
            };
            self.sequences.get_or_create(&sequence).set(n as i64);
        }
        self.kv_cache_used
            .get_or_create(&labels)
            .set(s.kv_used.load(Relaxed) as i64);
        self.kv_cache_capacity
            .get_or_create(&labels)
            .set(s.kv_capacity.load(Relaxed) as i64);
        raise(
            &self.prefix_lookups.get_or_create(&labels),
            s.prefix_lookups.load(Relaxed),
        );
        raise(
            &self.prefix_hits.get_or_create(&labels),
            s.prefix_hits.load(Relaxed),
        );
        raise(
            &self.preemptions.get_or_create(&labels),
            s.preemptions.load(Relaxed),
        );
        raise(
            &self.decode_steps.get_or_create(&labels),
            s.steps.load(Relaxed),
        );
    }

    fn new(registry: &mut Registry) -> GenerationMetrics {
        let histograms = || GenHistograms::new_with_constructor(latency as fn() -> Histogram);
        let g = GenerationMetrics {
            time_to_first_token: histograms(),
            inter_token_latency: histograms(),
            tokens: Family::default(),
            sequences: Family::default(),
            kv_cache_used: Family::default(),
            kv_cache_capacity: Family::default(),
            prefix_lookups: Family::default(),
            prefix_hits: Family::default(),
            preemptions: Family::default(),
            decode_steps: Family::default(),
        };
        registry.register_with_unit(
            "sheaf_generation_time_to_first_token",
            "Time from a generation request's arrival to its first token",
            Unit::Seconds,
            g.time_to_first_token.clone(),
        );
        registry.register_with_unit(
            "sheaf_generation_inter_token_latency",
            "Time between consecutive pieces of text of one generation",
            Unit::Seconds,
            g.inter_token_latency.clone(),
        );
        registry.register(
            "sheaf_generation_tokens",
            "Tokens processed, by kind (prompt: prefilled; completion: generated)",
            g.tokens.clone(),
        );
        registry.register(
            "sheaf_generation_sequences",
            "Generation sequences now, by state (running, waiting)",
            g.sequences.clone(),
        );
        registry.register(
            "sheaf_generation_kv_cache_used_cells",
            "KV cache cells held by running sequences and kept prefixes",
            g.kv_cache_used.clone(),
        );
        registry.register(
            "sheaf_generation_kv_cache_cells",
            "KV cache cells in all",
            g.kv_cache_capacity.clone(),
        );
        registry.register(
            "sheaf_generation_prefix_cache_lookups",
            "Admissions that looked for a kept prompt prefix",
            g.prefix_lookups.clone(),
        );
        registry.register(
            "sheaf_generation_prefix_cache_hits",
            "Admissions that reused a kept prompt prefix",
            g.prefix_hits.clone(),
        );
        registry.register(
            "sheaf_generation_preemptions",
            "Running sequences preempted for KV cache room (recomputed later)",
            g.preemptions.clone(),
        );
        registry.register(
            "sheaf_generation_decode_steps",
            "Batched decode calls",
            g.decode_steps.clone(),
        );
        g
    }
}

type Histograms = Family<ModelLabels, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 50 µs to about 26 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 20))
}

fn batch_sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

/// The metrics of one server.
pub struct Metrics {
    registry: Registry,
    pub success: Family<ModelLabels, Counter>,
    pub failure: Family<FailureLabels, Counter>,
    /// Requests answered from the response cache, and looked up there and not found.
    pub cache_hits: Family<ModelLabels, Counter>,
    pub cache_misses: Family<ModelLabels, Counter>,
    pub request_duration: Histograms,
    pub queue_duration: Histograms,
    pub compute_input_duration: Histograms,
    pub compute_infer_duration: Histograms,
    pub compute_output_duration: Histograms,
    pub stage_duration: Family<StageLabels, Histogram, fn() -> Histogram>,
    pub batch_size: Histograms,
    pub queue_depth: Family<ModelLabels, Gauge>,
    pub inflight_batches: Family<ModelLabels, Gauge>,
    pub sequences_open: Family<LifecycleLabels, Gauge>,
    pub loads: Family<LifecycleLabels, Counter>,
    pub unloads: Family<LifecycleLabels, Counter>,
    pub evictions: Family<LifecycleLabels, Counter>,
    pub device_memory_used: Family<DeviceLabels, Gauge>,
    pub device_memory_total: Family<DeviceLabels, Gauge>,
    pub process_cpu: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub process_resident_memory: Gauge,
    pub generation: GenerationMetrics,
    /// The metrics the models define themselves, one store per backend that has them.
    custom: Vec<sheaf_backend::CustomMetrics>,
    /// The host's CPU time at the previous scrape (Triton's `nv_cpu_utilization`).
    pub(crate) cpu: crate::triton_metrics::CpuSampler,
    /// Which latency metrics of Triton's are written (`--metrics-config`); set before any
    /// model loads, since each model's statistics keep summaries only when they are on.
    latency: std::sync::OnceLock<crate::summary::LatencyMetrics>,
    encode_lock: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The series of one stage of `labels`' requests (see [`crate::stages`]).
    pub fn stage(&self, labels: &ModelLabels, stage: &'static str) -> Histogram {
        self.stage_duration
            .get_or_create(&StageLabels {
                model: labels.model.clone(),
                version: labels.version.clone(),
                device: labels.device.clone(),
                stage,
            })
            .clone()
    }

    pub fn new() -> Metrics {
        Metrics::with_custom(Vec::new())
    }

    /// The server's metrics, and those its models define in `custom` (written after them).
    /// Chooses Triton's latency metrics (`--metrics-config`); only the first choice counts.
    pub fn set_latency_metrics(&self, latency: crate::summary::LatencyMetrics) {
        let _ = self.latency.set(latency);
    }

    /// Triton's latency metrics that are written.
    pub fn latency_metrics(&self) -> crate::summary::LatencyMetrics {
        self.latency.get().cloned().unwrap_or_default()
    }

    pub fn with_custom(custom: Vec<sheaf_backend::CustomMetrics>) -> Metrics {
        let mut registry = Registry::default();
        let histograms = || Histograms::new_with_constructor(latency as fn() -> Histogram);
        let m = Metrics {
            success: Family::default(),
            failure: Family::default(),
            cache_hits: Family::default(),
            cache_misses: Family::default(),
            request_duration: histograms(),
            queue_duration: histograms(),
            compute_input_duration: histograms(),
            compute_infer_duration: histograms(),
            compute_output_duration: histograms(),
            stage_duration: Family::new_with_constructor(latency as fn() -> Histogram),
            batch_size: Histograms::new_with_constructor(batch_sizes as fn() -> Histogram),
            queue_depth: Family::default(),
            inflight_batches: Family::default(),
            sequences_open: Family::default(),
            loads: Family::default(),
            unloads: Family::default(),
            evictions: Family::default(),
            device_memory_used: Family::default(),
            device_memory_total: Family::default(),
            process_cpu: Gauge::default(),
            process_resident_memory: Gauge::default(),
            generation: GenerationMetrics::new(&mut registry),
            custom,
            cpu: Default::default(),
            latency: std::sync::OnceLock::new(),
            encode_lock: Mutex::new(()),
            registry: Registry::default(),
        };
        registry.register(
            "sheaf_request_success",
            "Inference requests answered with outputs",
            m.success.clone(),
        );
        registry.register(
            "sheaf_cache_hits",
            "Inference requests answered from the response cache, without running the model",
            m.cache_hits.clone(),
        );
        registry.register(
            "sheaf_cache_misses",
            "Inference requests looked up in the response cache and not found there",
            m.cache_misses.clone(),
        );
        registry.register(
            "sheaf_request_failure",
            "Inference requests answered with an error, by reason (invalid_input, not_ready, overloaded, timeout, internal)",
            m.failure.clone(),
        );
        let seconds: [(&str, &str, &Histograms); 5] = [
            (
                "sheaf_request_duration",
                "Time from a request's arrival at the model to its answer",
                &m.request_duration,
            ),
            (
                "sheaf_queue_duration",
                "Time a request waited in the queue before its first batch",
                &m.queue_duration,
            ),
            (
                "sheaf_compute_input_duration",
                "Time to assemble a batch's inputs (per batch)",
                &m.compute_input_duration,
            ),
            (
                "sheaf_compute_infer_duration",
                "Time the backend spent running a batch (per batch)",
                &m.compute_infer_duration,
            ),
            (
                "sheaf_compute_output_duration",
                "Time to slice a batch's outputs back per request (per batch)",
                &m.compute_output_duration,
            ),
        ];
        for (name, help, family) in seconds {
            registry.register_with_unit(name, help, Unit::Seconds, family.clone());
        }
        registry.register_with_unit(
            "sheaf_request_stage_duration",
            "A request's server time by stage: receive (arrival to queued), queue, input (batch assembly), wait (assembled batch waiting for its instance), infer, output (slicing), reply (hand-off back to the request), send (encode and write); other is what no stage covers, total the whole",
            Unit::Seconds,
            m.stage_duration.clone(),
        );
        registry.register(
            "sheaf_batch_size",
            "Items in each executed batch, padding included",
            m.batch_size.clone(),
        );
        registry.register(
            "sheaf_queue_depth",
            "Items waiting in the queue now",
            m.queue_depth.clone(),
        );
        registry.register(
            "sheaf_inflight_batches",
            "Batches assembled or running now",
            m.inflight_batches.clone(),
        );
        registry.register(
            "sheaf_sequences_open",
            "Sequences of a stateful model open now (sequence_batching)",
            m.sequences_open.clone(),
        );
        registry.register("sheaf_model_loads", "Model loads", m.loads.clone());
        registry.register("sheaf_model_unloads", "Model unloads", m.unloads.clone());
        registry.register(
            "sheaf_model_evictions",
            "Models evicted to make room",
            m.evictions.clone(),
        );
        registry.register_with_unit(
            "sheaf_device_memory_used",
            "Memory held by loaded models on the device (declared or estimated from the model file)",
            Unit::Bytes,
            m.device_memory_used.clone(),
        );
        registry.register_with_unit(
            "sheaf_device_memory_total",
            "Memory of the device (0 where unknown)",
            Unit::Bytes,
            m.device_memory_total.clone(),
        );
        registry.register_with_unit(
            "sheaf_process_cpu",
            "CPU time the server process has used, user and system",
            Unit::Seconds,
            m.process_cpu.clone(),
        );
        registry.register_with_unit(
            "sheaf_process_resident_memory",
            "Resident memory of the server process",
            Unit::Bytes,
            m.process_resident_memory.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The exposition text in Prometheus' text format 0.0.4 (what `promtool check metrics`
    /// reads and every Prometheus scrapes).
    pub fn encode(&self) -> String {
        let _guard = self.encode_lock.lock().unwrap_or_else(|e| e.into_inner());
        sample_process(self);
        let mut open_metrics = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut open_metrics, &self.registry);
        let mut text = to_text_format(&open_metrics);
        crate::custom_metrics::render(&self.custom, &mut text);
        text
    }

    pub fn record_failure(&self, labels: &ModelLabels, kind: ErrorKind) {
        self.failure
            .get_or_create(&FailureLabels {
                model: labels.model.clone(),
                version: labels.version.clone(),
                device: labels.device.clone(),
                reason: reason(kind),
            })
            .inc();
    }
}

/// Converts OpenMetrics text to Prometheus text format 0.0.4: a counter's HELP and TYPE lines
/// name its `_total` samples, and the OpenMetrics-only `# UNIT` and `# EOF` lines go.
fn to_text_format(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The `reason` label of a failure.
pub fn reason(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput | ErrorKind::ContextExceeded => "invalid_input",
        ErrorKind::ModelNotFound => "not_found",
        ErrorKind::NotReady => "not_ready",
        ErrorKind::Overloaded => "overloaded",
        ErrorKind::Timeout => "timeout",
        ErrorKind::Internal => "internal",
        ErrorKind::Conflict => "conflict",
    }
}

/// CPU time and resident memory from /proc (Linux); left unchanged elsewhere.
fn sample_process(m: &Metrics) {
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the command name (which may hold spaces): utime is the 12th, stime 13th.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            // Linux reports in clock ticks of 1/100 s on every supported architecture.
            m.process_cpu.set((ticks(11) + ticks(12)) / 100.0);
        }
    }
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        if let Some(pages) = statm
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<i64>().ok())
        {
            m.process_resident_memory.set(pages * 4096);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_total_in_text_format() {
        let m = Metrics::new();
        let labels = ModelLabels {
            model: "m".into(),
            version: "1".into(),
            device: "cpu".into(),
        };
        m.success.get_or_create(&labels).inc();
        m.record_failure(&labels, ErrorKind::Overloaded);
        m.batch_size.get_or_create(&labels).observe(8.0);
        let text = m.encode();
        assert!(
            text.contains("# TYPE sheaf_request_success_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# HELP sheaf_request_success_total "),
            "{text}"
        );
        assert!(text.contains(r#"sheaf_request_failure_total{model="m",version="1",device="cpu",reason="overloaded"} 1"#), "{text}");
        assert!(text.contains("# TYPE sheaf_batch_size histogram"), "{text}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }
}
