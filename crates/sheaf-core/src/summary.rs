//! Triton's latency summaries and the choice of its latency metrics (`--metrics-config
//! summary_latencies=true`, `summary_quantiles=...`, `counter_latencies=false`): per model,
//! the quantiles of its requests' latencies (end to end, queue, compute input, infer and
//! output) over a sliding window, written as Prometheus summaries
//! (`nv_inference_request_summary_us` and its four siblings) whose `_count` and `_sum` are the
//! counters' figures.
//!
//! Each model keeps the latencies of its most recent requests (the last minute, at most
//! [`MOST`] of them) and the quantiles are computed from them exactly at each scrape, so that
//! every error bound a `summary_quantiles` entry asks for is met.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a latency counts towards the quantiles (Prometheus' summaries' default age).
pub const WINDOW: Duration = Duration::from_secs(60);

/// The most latencies kept per series; the oldest go first.
pub const MOST: usize = 8192;

/// Triton's default quantiles.
pub const DEFAULT_QUANTILES: [f64; 4] = [0.5, 0.9, 0.95, 0.99];

/// Which latency metrics `/metrics` writes.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyMetrics {
    /// The cumulative `nv_*_duration_us` counters (on by default).
    pub counters: bool,
    /// The summaries, with these quantiles; `None`: off (the default).
    pub quantiles: Option<Vec<f64>>,
}

impl Default for LatencyMetrics {
    fn default() -> Self {
        LatencyMetrics {
            counters: true,
            quantiles: None,
        }
    }
}

impl LatencyMetrics {
    /// Reads tritonserver's `--metrics-config` settings (`KEY=VALUE` each).
    pub fn parse(settings: &[String]) -> Result<LatencyMetrics, String> {
        let mut out = LatencyMetrics::default();
        let mut on = false;
        let mut quantiles = None;
        for setting in settings {
            let (key, value) = setting.split_once('=').ok_or_else(|| {
                format!("--metrics-config '{setting}': give KEY=VALUE, e.g. summary_latencies=true")
            })?;
            let flag = || match value.trim() {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                other => Err(format!(
                    "--metrics-config {key}={other}: give true or false"
                )),
            };
            match key.trim() {
                "summary_latencies" => on = flag()?,
                "counter_latencies" => out.counters = flag()?,
                "summary_quantiles" => quantiles = Some(parse_quantiles(value)?),
                other => {
                    return Err(format!(
                        "--metrics-config {other}: sheaf takes summary_latencies, \
                         summary_quantiles and counter_latencies"
                    ))
                }
            }
        }
        if on {
            out.quantiles = Some(quantiles.unwrap_or_else(|| DEFAULT_QUANTILES.to_vec()));
        }
        Ok(out)
    }
}

/// `0.5:0.05,0.9:0.01,...`: each quantile (in (0, 1]) with the error Prometheus' estimate
/// may have, which sheaf's exact quantiles meet whatever it is.
fn parse_quantiles(value: &str) -> Result<Vec<f64>, String> {
    let mut quantiles = Vec::new();
    for pair in value.trim().trim_matches('"').split(',') {
        let (q, error) = pair.split_once(':').unwrap_or((pair, "0"));
        let q: f64 = q.trim().parse().unwrap_or(f64::NAN);
        let error: f64 = error.trim().parse().unwrap_or(f64::NAN);
        let fits = q > 0.0 && q <= 1.0 && (0.0..1.0).contains(&error);
        if !fits {
            return Err(format!(
                "--metrics-config summary_quantiles: '{pair}' is not QUANTILE:ERROR with a \
                 quantile in (0, 1] and an error in [0, 1), e.g. 0.5:0.05,0.99:0.001"
            ));
        }
        quantiles.push(q);
    }
    quantiles.sort_by(f64::total_cmp);
    quantiles.dedup();
    Ok(quantiles)
}

/// The recent latencies of one series, in microseconds.
#[derive(Debug, Default)]
pub struct Window(Mutex<VecDeque<(Instant, f64)>>);

impl Window {
    pub fn observe(&self, took: Duration) {
        let now = Instant::now();
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == MOST {
            kept.pop_front();
        }
        kept.push_back((now, took.as_secs_f64() * 1e6));
        let cutoff = now.checked_sub(WINDOW);
        while kept
            .front()
            .is_some_and(|(at, _)| cutoff.is_some_and(|c| *at < c))
        {
            kept.pop_front();
        }
    }

    /// The latencies of the last [`WINDOW`], appended to `out`.
    pub fn recent(&self, out: &mut Vec<f64>) {
        let cutoff = Instant::now().checked_sub(WINDOW);
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        out.extend(
            kept.iter()
                .filter(|(at, _)| cutoff.is_none_or(|c| *at >= c))
                .map(|(_, us)| *us),
        );
    }
}

/// One model's (on one device) five series.
#[derive(Debug, Default)]
pub struct Summaries {
    pub request: Window,
    pub queue: Window,
    pub compute_input: Window,
    pub compute_infer: Window,
    pub compute_output: Window,
}

impl Summaries {
    /// The five series' recent latencies, over every part given (a model's devices).
    pub fn merged<'a>(parts: impl Iterator<Item = &'a Summaries>) -> [Vec<f64>; 5] {
        let mut out: [Vec<f64>; 5] = Default::default();
        for s in parts {
            let series = [
                &s.request,
                &s.queue,
                &s.compute_input,
                &s.compute_infer,
                &s.compute_output,
            ];
            for (window, into) in series.into_iter().zip(out.iter_mut()) {
                window.recent(into);
            }
        }
        for v in &mut out {
            v.sort_by(f64::total_cmp);
        }
        out
    }
}

/// The `q` quantile of `sorted` (nearest rank); `NaN` for none, as Prometheus writes an empty
/// summary's.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(settings: &[&str]) -> Result<LatencyMetrics, String> {
        LatencyMetrics::parse(&settings.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn settings_are_read_as_tritonserver_reads_them() {
        assert_eq!(parse(&[]).unwrap(), LatencyMetrics::default());
        let on = parse(&["summary_latencies=true"]).unwrap();
        assert_eq!(on.quantiles.as_deref(), Some(&DEFAULT_QUANTILES[..]));
        assert!(on.counters);
        let custom = parse(&[
            "summary_quantiles=\"0.99:0.001,0.5:0.05\"",
            "summary_latencies=true",
            "counter_latencies=false",
        ])
        .unwrap();
        assert_eq!(custom.quantiles, Some(vec![0.5, 0.99]));
        assert!(!custom.counters);
        // Quantiles alone do not turn the summaries on.
        assert_eq!(
            parse(&["summary_quantiles=0.5:0.05"]).unwrap().quantiles,
            None
        );
        for (bad, says) in [
            ("summary_latencies=yes", "give true or false"),
            ("summary_quantiles=1.5:0.1", "not QUANTILE:ERROR"),
            ("summary_quantiles=0.5:x", "not QUANTILE:ERROR"),
            ("gpu_metrics=true", "sheaf takes summary_latencies"),
            ("summary_latencies", "give KEY=VALUE"),
        ] {
            let e = parse(&[bad]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn quantiles_are_exact_nearest_ranks() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sorted, 0.5), 50.0);
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&sorted, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.01), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn a_window_keeps_the_most_recent() {
        let w = Window::default();
        for us in 0..(MOST + 10) {
            w.observe(Duration::from_micros(us as u64));
        }
        let mut recent = Vec::new();
        w.recent(&mut recent);
        assert_eq!(recent.len(), MOST);
        assert_eq!(recent[0], 10.0);
        let s = Summaries::default();
        s.queue.observe(Duration::from_micros(3));
        let t = Summaries::default();
        t.queue.observe(Duration::from_micros(1));
        let merged = Summaries::merged([&s, &t].into_iter());
        assert_eq!(merged[1], vec![1.0, 3.0]);
        assert!(merged[0].is_empty());
    }
}
