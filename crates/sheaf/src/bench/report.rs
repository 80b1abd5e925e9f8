//! Results of `sheaf bench`: one row per level, printed as a table and optionally written as
//! JSON, CSV and an SVG plot of latency percentiles against throughput.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use super::load::Samples;

/// One measured level.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    /// `concurrency`, `rate`, `streams`, `burst` or `users`.
    pub mode: String,
    /// The level's size: clients, requests/s, streams, burst size or users.
    pub level: f64,
    pub requests: usize,
    pub errors: usize,
    pub errors_by_kind: BTreeMap<String, usize>,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub items_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Mean time a request waited in the server's queue (from its statistics endpoint).
    pub server_queue_ms: Option<f64>,
    /// Mean backend time per request (from the server's statistics endpoint).
    pub server_compute_ms: Option<f64>,
    /// The server's mean time per request in each stage (from its statistics endpoint).
    pub server: Option<ServerStages>,
    /// Mean items per backend call (batch) while the level ran (from its statistics endpoint).
    pub mean_batch: Option<f64>,
    /// Open loops: requests that waited for a place because `--max-outstanding` requests were
    /// in flight at their arrival instant.
    pub waited: usize,
}

/// The `p` quantile of sorted values (NaN when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

impl Level {
    pub fn new(
        mode: &str,
        level: f64,
        s: &Samples,
        items: usize,
        before: Option<&Reading>,
        after: Option<&Reading>,
    ) -> Level {
        let split = split(before.map(|r| r.counters), after.map(|r| r.counters));
        let ok = s.latencies_ms.len();
        let secs = s.elapsed.as_secs_f64().max(1e-9);
        let p = |q| percentile(&s.latencies_ms, q);
        Level {
            mode: mode.to_string(),
            level,
            requests: ok + s.errors.values().sum::<usize>(),
            errors: s.errors.values().sum(),
            errors_by_kind: s.errors.clone(),
            seconds: secs,
            requests_per_s: ok as f64 / secs,
            items_per_s: (ok * items) as f64 / secs,
            p50_ms: p(0.5),
            p90_ms: p(0.9),
            p95_ms: p(0.95),
            p99_ms: p(0.99),
            max_ms: s.latencies_ms.last().copied().unwrap_or(f64::NAN),
            server_queue_ms: split.map(|s| s.queue),
            server_compute_ms: split.map(|s| s.infer),
            server: split,
            mean_batch: mean_batch(before, after),
            waited: s.waited,
        }
    }
}

pub fn print_header() {
    println!(
        "{:>12} {:>8} {:>11} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}  errors",
        "mode",
        "level",
        "requests/s",
        "items/s",
        "p50 ms",
        "p90 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "srv queue",
        "srv comp"
    );
}

pub fn print_row(l: &Level) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let errors = if l.errors == 0 {
        "0".to_string()
    } else {
        l.errors_by_kind
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "{:>12} {:>8} {:>11.1} {:>10.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9} {:>9}  {}",
        l.mode,
        l.level,
        l.requests_per_s,
        l.items_per_s,
        l.p50_ms,
        l.p90_ms,
        l.p95_ms,
        l.p99_ms,
        l.max_ms,
        opt(l.server_queue_ms),
        opt(l.server_compute_ms),
        errors
    );
    if l.waited > 0 {
        println!(
            "{:>12} {} of {} requests waited for one of the --max-outstanding in flight: the level ran behind its schedule, and the latencies count the wait",
            "", l.waited, l.requests
        );
    }
}

/// The statistics extension's counters of a request's stages, in the order of
/// [`ServerStages`], then the whole request.
const STAGE_COUNTERS: [&str; 9] = [
    "receive",
    "queue",
    "compute_input",
    "batch_wait",
    "compute_infer",
    "compute_output",
    "reply",
    "send",
    "request",
];

/// `(ns, count)` of each of [`STAGE_COUNTERS`], from a KServe/Triton statistics body.
pub type Counters = [(f64, f64); 9];

/// The server's mean ms per request in each stage of its time (see the server's
/// `sheaf_core::stages`), what they leave uncovered, and the whole.
///
/// `whole` is false when the server timed no whole request of the model between the readings
/// (a pipeline, whose steps' time is their models' own, or a server that reports only its
/// queue and compute): then only `queue`, `input`, `infer` and `output` hold figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerStages {
    pub receive: f64,
    pub queue: f64,
    pub input: f64,
    pub wait: f64,
    pub infer: f64,
    pub output: f64,
    pub reply: f64,
    pub send: f64,
    pub other: f64,
    pub total: f64,
    pub whole: bool,
}

/// One reading of a model's statistics endpoint: its stage counters, the items it has run and
/// the backend calls (batches) it has made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub counters: Counters,
    pub items: f64,
    pub executions: f64,
}

/// Reads a statistics body; none when it has no stage counters (see [`server_counters`]).
pub fn reading(stats: &Value) -> Option<Reading> {
    let m = &stats["model_stats"][0];
    let n = |k: &str| {
        m[k].as_f64()
            .or_else(|| m[k].as_str().and_then(|v| v.parse().ok()))
            .unwrap_or(0.0)
    };
    Some(Reading {
        counters: server_counters(stats)?,
        items: n("inference_count"),
        executions: n("execution_count"),
    })
}

/// Mean items per backend call between two readings; none when no call was made in between.
pub fn mean_batch(before: Option<&Reading>, after: Option<&Reading>) -> Option<f64> {
    let (b, a) = (before?, after?);
    let calls = a.executions - b.executions;
    (calls > 0.0).then(|| (a.items - b.items) / calls)
}

/// The line that sets the served model's compute beside the in-process loop's: the level's
/// mean batch, the server's `infer` time per request (each request is counted for the whole
/// batch it ran in), and the in-process time of one batch at the measured size nearest to it
/// (`curve`: batch size and items/s). Served compute slower than in-process at the size the
/// load forms is time lost inside the instance, not in the server around it.
pub fn compute_line(level: &Level, curve: &[(usize, f64)]) -> Option<String> {
    let (batch, infer) = (level.mean_batch?, level.server?.infer);
    let &(size, items_s) = curve.iter().filter(|(_, r)| *r > 0.0).min_by(|x, y| {
        (x.0 as f64 - batch)
            .abs()
            .total_cmp(&(y.0 as f64 - batch).abs())
    })?;
    let alone = size as f64 / items_s * 1e3;
    Some(format!(
        "{:>12} batches: mean {batch:.1} items, infer {infer:.2} ms; in-process at batch {size}: {alone:.2} ms a batch (served/in-process time {:.2})",
        "",
        infer / alone
    ))
}

/// The summary of a level measured in alternating rounds: each `(served, in-process)` pair's
/// ratio, their median and range, and the ratio of the totals.
pub fn paired_line(clients: usize, batch: usize, pairs: &[(f64, f64)]) -> String {
    let mut ratios: Vec<f64> = pairs.iter().map(|(s, r)| s / r).collect();
    let listed = ratios
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(" ");
    ratios.sort_by(f64::total_cmp);
    let (served, reference) = pairs
        .iter()
        .fold((0.0, 0.0), |(a, b), (s, r)| (a + s, b + r));
    format!(
        "c={clients}, {} rounds each after the loop at batch {batch}: served/in-process {listed}; \
         median {:.2} (from {:.2} to {:.2}), totals {:.2}",
        pairs.len(),
        percentile(&ratios, 0.5),
        ratios.first().copied().unwrap_or(f64::NAN),
        ratios.last().copied().unwrap_or(f64::NAN),
        served / reference
    )
}

/// Reads [`STAGE_COUNTERS`] from a statistics body; none when the server reports no queue or
/// compute (the stages it does not report read as zero).
pub fn server_counters(stats: &Value) -> Option<Counters> {
    let s = &stats["model_stats"][0]["inference_stats"];
    let n = |k: &str, f: &str| {
        s[k][f]
            .as_f64()
            .or_else(|| s[k][f].as_str().and_then(|v| v.parse().ok()))
    };
    n("queue", "ns")?;
    n("compute_infer", "ns")?;
    let mut out = [(0.0, 0.0); 9];
    for (slot, key) in out.iter_mut().zip(STAGE_COUNTERS) {
        *slot = (n(key, "ns").unwrap_or(0.0), n(key, "count").unwrap_or(0.0));
    }
    Some(out)
}

/// Mean ms per request of each stage between two readings; none when no request was answered
/// in between.
pub fn split(before: Option<Counters>, after: Option<Counters>) -> Option<ServerStages> {
    let (b, a) = (before?, after?);
    let mean: Vec<f64> = b
        .iter()
        .zip(&a)
        .map(|(b, a)| {
            let count = a.1 - b.1;
            if count > 0.0 {
                (a.0 - b.0) / count / 1e6
            } else {
                0.0
            }
        })
        .collect();
    if a[1].1 - b[1].1 <= 0.0 {
        return None;
    }
    let each = &mean[..8];
    let total = mean[8];
    let whole = a[8].1 - b[8].1 > 0.0;
    Some(ServerStages {
        receive: each[0],
        queue: each[1],
        input: each[2],
        wait: each[3],
        infer: each[4],
        output: each[5],
        reply: each[6],
        send: each[7],
        other: match whole {
            true => (total - each.iter().sum::<f64>()).max(0.0),
            false => 0.0,
        },
        total,
        whole,
    })
}

/// The line under a level's row: the client's p50 beside the server's stages and what neither
/// covers, so that time spent nowhere that the server measures stands out.
pub fn print_stages(l: &Level) {
    if let Some(line) = stages_line(l) {
        println!("{line}");
    }
}

/// The text of [`print_stages`]; none when the server reported no stages. Where it timed no
/// whole request (see [`ServerStages::whole`]), the stages it did time, and no remainder.
pub fn stages_line(l: &Level) -> Option<String> {
    let s = l.server.as_ref()?;
    if !s.whole {
        return Some(format!(
            "{:>12} stages ms: queue {:.2}  input {:.2}  infer {:.2}  output {:.2}; \
             the server times no whole request of this model (a pipeline's steps are timed \
             under their own models); client p50 {:.2}",
            "", s.queue, s.input, s.infer, s.output, l.p50_ms
        ));
    }
    Some(format!(
        "{:>12} stages ms: receive {:.2}  queue {:.2}  input {:.2}  wait {:.2}  infer {:.2}  \
         output {:.2}  reply {:.2}  send {:.2}  other {:.2}  = server {:.2}; client p50 {:.2}, \
         outside the server {:.2}",
        "",
        s.receive,
        s.queue,
        s.input,
        s.wait,
        s.infer,
        s.output,
        s.reply,
        s.send,
        s.other,
        s.total,
        l.p50_ms,
        l.p50_ms - s.total
    ))
}

pub fn write_json(path: &Path, levels: &[Level]) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(levels)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

pub fn write_csv(path: &Path, levels: &[Level]) -> anyhow::Result<()> {
    let mut out = String::from(
        "mode,level,requests,errors,seconds,requests_per_s,items_per_s,p50_ms,p90_ms,p95_ms,p99_ms,max_ms,server_queue_ms,server_compute_ms\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
    for l in levels {
        out.push_str(&format!(
            "{},{},{},{},{:.3},{:.2},{:.2},{:.4},{:.4},{:.4},{:.4},{:.4},{},{}\n",
            l.mode,
            l.level,
            l.requests,
            l.errors,
            l.seconds,
            l.requests_per_s,
            l.items_per_s,
            l.p50_ms,
            l.p90_ms,
            l.p95_ms,
            l.p99_ms,
            l.max_ms,
            opt(l.server_queue_ms),
            opt(l.server_compute_ms)
        ));
    }
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// Latency percentiles (ms) against throughput (requests/s), one point per level.
pub fn plot(path: &Path, levels: &[Level], title: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let points: Vec<&Level> = levels.iter().filter(|l| l.p99_ms.is_finite()).collect();
    let max_x = points.iter().map(|l| l.requests_per_s).fold(1.0, f64::max) * 1.1;
    let max_y = points.iter().map(|l| l.p99_ms).fold(1.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("throughput (requests/s)")
        .y_desc("latency (ms)")
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    type Series = (&'static str, fn(&Level) -> f64, RGBColor);
    let series: [Series; 3] = [
        ("p50", |l| l.p50_ms, RGBColor(59, 130, 246)),
        ("p90", |l| l.p90_ms, RGBColor(16, 185, 129)),
        ("p99", |l| l.p99_ms, RGBColor(239, 68, 68)),
    ];
    for (name, value, color) in series {
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|l| (l.requests_per_s, value(l)))
            .collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Alternating rounds: each ratio in order, the median of an odd count the middle one,
    /// the range, and the totals' ratio.
    #[test]
    fn paired_rounds_give_each_ratio_and_their_median() {
        let line = paired_line(
            64,
            32,
            &[(900.0, 1000.0), (500.0, 1000.0), (1200.0, 1000.0)],
        );
        assert!(
            line.starts_with("c=64, 3 rounds each after the loop at batch 32"),
            "{line}"
        );
        assert!(line.contains("served/in-process 0.90 0.50 1.20;"), "{line}");
        assert!(
            line.contains("median 0.90 (from 0.50 to 1.20), totals 0.87"),
            "{line}"
        );
    }

    /// A statistics body as the server writes it, with every stage at `ns` over `count`.
    fn body(items: u64, executions: u64, ns: u64, count: u64) -> Value {
        let stage = json!({"count": count, "ns": ns});
        let stages: serde_json::Map<String, Value> = STAGE_COUNTERS
            .iter()
            .map(|k| (k.to_string(), stage.clone()))
            .collect();
        json!({"model_stats": [{
            "inference_count": items,
            "execution_count": executions,
            "inference_stats": stages,
        }]})
    }

    #[test]
    fn a_level_knows_its_mean_batch_and_sets_its_compute_beside_the_loop() {
        let before = reading(&body(100, 10, 0, 0)).unwrap();
        // 640 more items in 20 more calls; each request's infer is 3 ms on average.
        let after = reading(&body(740, 30, 640 * 3_000_000, 640)).unwrap();
        assert_eq!(mean_batch(Some(&before), Some(&after)), Some(32.0));
        assert_eq!(mean_batch(Some(&after), Some(&after)), None);
        let samples = Samples::default();
        let level = Level::new(
            "concurrency",
            64.0,
            &samples,
            1,
            Some(&before),
            Some(&after),
        );
        assert_eq!(level.mean_batch, Some(32.0));
        // In-process, batch 32 runs 16,000 items/s: 2 ms a batch; the nearest size is taken.
        let curve = [(1, 1_000.0), (32, 16_000.0), (64, 20_000.0)];
        let line = compute_line(&level, &curve).unwrap();
        assert!(line.contains("mean 32.0 items, infer 3.00 ms"), "{line}");
        assert!(line.contains("in-process at batch 32: 2.00 ms"), "{line}");
        assert!(line.contains("served/in-process time 1.50"), "{line}");
        assert_eq!(compute_line(&level, &[]), None);
    }

    /// A pipeline's statistics: its steps' compute summed, no queue time of its own (as Triton
    /// keeps an ensemble's), and no whole request timed. The line names the stages there are
    /// and claims no server total.
    #[test]
    fn a_model_whose_whole_requests_are_not_timed_shows_only_its_stages() {
        let mut before = body(0, 0, 0, 0);
        let mut after = body(10, 10, 50_000_000, 10);
        for stage in ["receive", "batch_wait", "reply", "send", "request"] {
            before["model_stats"][0]["inference_stats"][stage] = json!({"count": 0, "ns": 0});
            after["model_stats"][0]["inference_stats"][stage] = json!({"count": 0, "ns": 0});
        }
        let (before, after) = (reading(&before).unwrap(), reading(&after).unwrap());
        let samples = Samples::default();
        let level = Level::new("concurrency", 1.0, &samples, 1, Some(&before), Some(&after));
        let stages = level.server.unwrap();
        assert!(!stages.whole);
        assert_eq!((stages.infer, stages.other, stages.total), (5.0, 0.0, 0.0));
        let line = stages_line(&level).unwrap();
        assert!(line.contains("infer 5.00  output 5.00;"), "{line}");
        assert!(line.contains("times no whole request"), "{line}");
        assert!(!line.contains("outside the server"), "{line}");

        // Every stage timed: the whole line, with the remainder and the time outside.
        let after = reading(&body(10, 10, 50_000_000, 10)).unwrap();
        let level = Level::new("concurrency", 1.0, &samples, 1, Some(&before), Some(&after));
        assert!(level.server.unwrap().whole);
        let line = stages_line(&level).unwrap();
        assert!(line.contains("= server 5.00;"), "{line}");
        assert!(line.contains("outside the server"), "{line}");
    }

    #[test]
    fn a_body_without_stage_counters_is_no_reading() {
        assert_eq!(
            reading(&json!({"model_stats": [{"inference_count": 3}]})),
            None
        );
    }
}
