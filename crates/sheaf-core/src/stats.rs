//! Per-model counters in the shape Triton's statistics extension reports.
//!
//! Request counters are updated once per request when its reply is sent; batch counters once
//! per executed batch by the execution thread. All are atomics, except the per-batch-size table,
//! which sits behind a mutex that is never held across an await.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{Metrics, ModelLabels};
use crate::stages::Stages;
use crate::ErrorKind;

/// Request latencies kept for percentiles (the most recent ones).
const RECENT: usize = 2048;

/// A count and a total duration.
#[derive(Debug, Default)]
pub struct Counter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Counter {
    pub fn add(&self, count: u64, d: Duration) {
        self.count.fetch_add(count, Ordering::Relaxed);
        self.ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn get(&self) -> CounterSnapshot {
        CounterSnapshot {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

/// A point-in-time reading of a [`Counter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub count: u64,
    pub ns: u64,
}

/// Time spent in the execution phases of one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Gathering the requests' inputs into one batch tensor.
    pub input: Duration,
    /// The assembled batch waiting for an instance to start it.
    pub wait: Duration,
    /// The backend call.
    pub infer: Duration,
    /// Slicing the outputs back per request.
    pub output: Duration,
}

#[derive(Debug, Default)]
struct BatchSizeStats {
    input: Counter,
    infer: Counter,
    output: Counter,
}

/// Everything counted for one model on one device. It also feeds the Prometheus metrics.
#[derive(Default)]
pub struct ModelStats {
    labels: Option<(ModelLabels, Arc<Metrics>)>,
    /// Latencies (ms) of the most recent successful requests.
    recent: Mutex<VecDeque<f64>>,
    /// Requests answered with outputs; ns is the whole time in the server.
    pub success: Counter,
    /// Requests answered with an error after they were queued.
    pub fail: Counter,
    /// Time from enqueue to the first batch that carried the request.
    pub queue: Counter,
    pub compute_input: Counter,
    pub compute_infer: Counter,
    pub compute_output: Counter,
    /// The stages outside the batch (see [`crate::stages`]), counted per request whose answer
    /// a protocol wrote: arrival to queued, an assembled batch's wait for its instance, the
    /// hand-off back to the request's task, encoding and writing, and the whole.
    pub receive: Counter,
    pub batch_wait: Counter,
    pub reply: Counter,
    pub send: Counter,
    pub request: Counter,
    /// Requests answered from the response cache (ns: the lookup), and requests looked up
    /// and not found (ns: the lookup and the insertion of their answer).
    pub cache_hit: Counter,
    pub cache_miss: Counter,
    /// Items inferred (a request of N items counts N).
    inference_count: AtomicU64,
    /// Backend calls.
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    by_batch_size: Mutex<BTreeMap<usize, BatchSizeStats>>,
    /// This model's `sheaf_request_stage_duration_seconds` series, one per name of
    /// [`STAGE_SERIES`], made once so that recording a request looks nothing up.
    stage_histograms: Vec<Histogram>,
    /// Bytes this device's instances have grown by since they loaded, as they reported after
    /// running batches (see [`ModelStats::record_memory_growth`]).
    memory_growth: AtomicU64,
    /// The recent latencies Triton's summaries are computed from, when they are on.
    summaries: Option<Box<crate::summary::Summaries>>,
}

/// The stage series of `sheaf_request_stage_duration_seconds`: the stages, what they leave
/// uncovered, and the whole.
pub const STAGE_SERIES: [&str; 10] = [
    "receive", "queue", "input", "wait", "infer", "output", "reply", "send", "other", "total",
];

/// A reading of [`ModelStats`], with the per-batch-size table as (size, calls, phases in ns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub success: CounterSnapshot,
    pub fail: CounterSnapshot,
    pub queue: CounterSnapshot,
    pub compute_input: CounterSnapshot,
    pub compute_infer: CounterSnapshot,
    pub compute_output: CounterSnapshot,
    pub receive: CounterSnapshot,
    pub batch_wait: CounterSnapshot,
    pub reply: CounterSnapshot,
    pub send: CounterSnapshot,
    pub request: CounterSnapshot,
    pub cache_hit: CounterSnapshot,
    pub cache_miss: CounterSnapshot,
    pub inference_count: u64,
    pub execution_count: u64,
    /// Milliseconds since the Unix epoch of the last executed batch (0 if none).
    pub last_inference_ms: u64,
    pub batches: Vec<BatchSizeSnapshot>,
}

/// Executions of one batch size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchSizeSnapshot {
    pub batch_size: usize,
    pub compute_input: CounterSnapshot,
    pub compute_infer: CounterSnapshot,
    pub compute_output: CounterSnapshot,
}

impl CounterSnapshot {
    fn add(&mut self, other: CounterSnapshot) {
        self.count += other.count;
        self.ns += other.ns;
    }
}

impl StatsSnapshot {
    /// Adds another device's reading of the same model into this one.
    pub fn merge(&mut self, other: &StatsSnapshot) {
        self.success.add(other.success);
        self.fail.add(other.fail);
        self.queue.add(other.queue);
        self.compute_input.add(other.compute_input);
        self.compute_infer.add(other.compute_infer);
        self.compute_output.add(other.compute_output);
        self.receive.add(other.receive);
        self.batch_wait.add(other.batch_wait);
        self.reply.add(other.reply);
        self.send.add(other.send);
        self.request.add(other.request);
        self.cache_hit.add(other.cache_hit);
        self.cache_miss.add(other.cache_miss);
        self.inference_count += other.inference_count;
        self.execution_count += other.execution_count;
        self.last_inference_ms = self.last_inference_ms.max(other.last_inference_ms);
        for b in &other.batches {
            match self
                .batches
                .iter_mut()
                .find(|m| m.batch_size == b.batch_size)
            {
                Some(m) => {
                    m.compute_input.add(b.compute_input);
                    m.compute_infer.add(b.compute_infer);
                    m.compute_output.add(b.compute_output);
                }
                None => self.batches.push(*b),
            }
        }
        self.batches.sort_by_key(|b| b.batch_size);
    }
}

impl std::fmt::Debug for ModelStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStats")
            .field("labels", &self.labels.as_ref().map(|l| &l.0))
            .finish()
    }
}

impl ModelStats {
    /// Statistics that also record into `metrics` under `labels`.
    pub fn new(labels: ModelLabels, metrics: Arc<Metrics>) -> ModelStats {
        let stage_histograms = STAGE_SERIES
            .iter()
            .map(|&stage| metrics.stage(&labels, stage))
            .collect();
        let summaries = metrics.latency_metrics().quantiles.map(|_| Box::default());
        ModelStats {
            stage_histograms,
            summaries,
            labels: Some((labels, metrics)),
            ..Default::default()
        }
    }

    /// Records a request refused before it was queued (invalid, overloaded, shutting down).
    pub fn record_rejected(&self, kind: ErrorKind) {
        if let Some((labels, metrics)) = &self.labels {
            metrics.record_failure(labels, kind);
        }
    }

    /// Records a queued request that was answered with an error.
    pub fn record_failure(&self, kind: ErrorKind, total: Duration) {
        self.fail.add(1, total);
        self.record_rejected(kind);
    }

    /// The 50th and 99th percentile of recent request latencies, in ms.
    pub fn recent_percentiles(&self) -> Option<(f64, f64)> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = recent.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        Some((at(0.5), at(0.99)))
    }

    /// Records that an instance holds `bytes` more than it last reported (a framework's caching
    /// allocator grows with the first batches it runs): the manager books the model at its
    /// size at load plus this.
    pub fn record_memory_growth(&self, bytes: u64) {
        self.memory_growth.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes the instances have grown by since they loaded.
    pub fn memory_growth(&self) -> u64 {
        self.memory_growth.load(Ordering::Relaxed)
    }

    /// Records one executed batch of `size` items.
    pub fn record_batch(&self, size: usize, phases: Phases) {
        if let Some((labels, m)) = &self.labels {
            m.batch_size.get_or_create(labels).observe(size as f64);
            m.compute_input_duration
                .get_or_create(labels)
                .observe(phases.input.as_secs_f64());
            m.compute_infer_duration
                .get_or_create(labels)
                .observe(phases.infer.as_secs_f64());
            m.compute_output_duration
                .get_or_create(labels)
                .observe(phases.output.as_secs_f64());
        }
        self.inference_count
            .fetch_add(size as u64, Ordering::Relaxed);
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_inference_ms.store(now_ms, Ordering::Relaxed);
        let mut table = self.by_batch_size.lock().unwrap_or_else(|e| e.into_inner());
        let entry = table.entry(size).or_default();
        entry.input.add(1, phases.input);
        entry.infer.add(1, phases.infer);
        entry.output.add(1, phases.output);
    }

    /// Records a request that was answered with outputs.
    pub fn record_success(&self, total: Duration, queue: Duration, phases: Phases) {
        if let Some((labels, m)) = &self.labels {
            m.success.get_or_create(labels).inc();
            m.request_duration
                .get_or_create(labels)
                .observe(total.as_secs_f64());
            m.queue_duration
                .get_or_create(labels)
                .observe(queue.as_secs_f64());
        }
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(total.as_secs_f64() * 1000.0);
        }
        if let Some(s) = &self.summaries {
            s.request.observe(total);
            s.queue.observe(queue);
            s.compute_input.observe(phases.input);
            s.compute_infer.observe(phases.infer);
            s.compute_output.observe(phases.output);
        }
        self.success.add(1, total);
        self.queue.add(1, queue);
        self.compute_input.add(1, phases.input);
        self.compute_infer.add(1, phases.infer);
        self.compute_output.add(1, phases.output);
    }

    /// Records a request answered from the response cache: a success that ran nothing.
    pub fn record_cache_hit(&self, took: Duration) {
        if let Some((labels, m)) = &self.labels {
            m.success.get_or_create(labels).inc();
            m.cache_hits.get_or_create(labels).inc();
        }
        if let Some(s) = &self.summaries {
            s.request.observe(took);
        }
        self.success.add(1, took);
        self.cache_hit.add(1, took);
    }

    /// The recent latencies of Triton's summaries; `None` when they are off.
    pub fn summaries(&self) -> Option<&crate::summary::Summaries> {
        self.summaries.as_deref()
    }

    /// Records a request not found in the response cache, once its answer is stored there.
    pub fn record_cache_miss(&self, took: Duration) {
        if let Some((labels, m)) = &self.labels {
            m.cache_misses.get_or_create(labels).inc();
        }
        self.cache_miss.add(1, took);
    }

    /// Records the stages of a request whose answer was written (see [`crate::stages`]).
    pub fn record_stages(&self, stages: &Stages) {
        let all = stages
            .each()
            .into_iter()
            .chain([stages.other(), stages.total]);
        for (histogram, took) in self.stage_histograms.iter().zip(all) {
            histogram.observe(took.as_secs_f64());
        }
        self.receive.add(1, stages.receive);
        self.batch_wait.add(1, stages.phases.wait);
        self.reply.add(1, stages.reply);
        self.send.add(1, stages.send);
        self.request.add(1, stages.total);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let table = self.by_batch_size.lock().unwrap_or_else(|e| e.into_inner());
        StatsSnapshot {
            success: self.success.get(),
            fail: self.fail.get(),
            queue: self.queue.get(),
            compute_input: self.compute_input.get(),
            compute_infer: self.compute_infer.get(),
            compute_output: self.compute_output.get(),
            receive: self.receive.get(),
            batch_wait: self.batch_wait.get(),
            reply: self.reply.get(),
            send: self.send.get(),
            request: self.request.get(),
            cache_hit: self.cache_hit.get(),
            cache_miss: self.cache_miss.get(),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            last_inference_ms: self.last_inference_ms.load(Ordering::Relaxed),
            batches: table
                .iter()
                .map(|(&batch_size, s)| BatchSizeSnapshot {
                    batch_size,
                    compute_input: s.input.get(),
                    compute_infer: s.infer.get(),
                    compute_output: s.output.get(),
                })
                .collect(),
        }
    }
}
