//! What an instance does after loading and before it serves: settle `max_batch_size` (probing
//! the model when it is `auto`) and warm up, one run per batch size that will be used.
//!
//! It runs on the instance thread, which owns the model, so no session crosses threads.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sheaf_backend::{BackendError, Model, Signature, Tensor};

/// How to settle the batch size and warm up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareSpec {
    /// Largest batch; with `auto`, the largest size probed.
    pub max_batch_size: usize,
    /// Probe for the size past which throughput stops growing.
    pub auto: bool,
    /// Allowed batch sizes (warm-up runs exactly these when set).
    pub allowed_batch_sizes: Vec<usize>,
    pub warmup: bool,
}

/// Throughput gain below which a bigger batch is not worth it, for `auto`.
const GAIN: f64 = 1.05;
/// A probe stops at sizes whose run takes longer than this.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// Held while a model is probed: models load in parallel, and a probe timed while another one
/// runs would measure the contention rather than the model.
static PROBING: Mutex<()> = Mutex::new(());

/// Runs the preparation and returns the batch size to use.
pub fn prepare(
    model: &mut dyn Model,
    spec: &PrepareSpec,
    name: &str,
) -> Result<usize, BackendError> {
    let batched = spec.max_batch_size > 0;
    let mut max = spec.max_batch_size;
    if spec.auto && batched {
        let curve = {
            let _alone = PROBING.lock().unwrap_or_else(|e| e.into_inner());
            probe(model, spec.max_batch_size)?
        };
        max = choose(&curve);
        let text: Vec<String> = curve
            .iter()
            .map(|(b, t)| format!("{b}: {t:.0}/s"))
            .collect();
        tracing::info!(model = name, curve = %text.join(", "), chosen = max, "max_batch_size auto: measured items/s by batch size");
    }
    if spec.warmup {
        let sizes = if !batched {
            vec![0]
        } else if !spec.allowed_batch_sizes.is_empty() {
            spec.allowed_batch_sizes.clone()
        } else {
            let mut s: Vec<usize> = std::iter::successors(Some(1usize), |b| Some(b * 2))
                .take_while(|&b| b < max)
                .collect();
            s.push(max);
            s
        };
        let started = Instant::now();
        for &b in &sizes {
            model.infer(&inputs(model.signature(), b)?)?;
        }
        tracing::debug!(
            model = name,
            ?sizes,
            ms = started.elapsed().as_millis() as u64,
            "warm-up done"
        );
    }
    Ok(max)
}

/// Items per second at batch sizes 1, 2, 4, … up to `limit`, while a run stays under a second,
/// throughput still grows by [`GAIN`] and runs succeed: a size that fails (on a GPU, typically
/// out of memory) ends the probe, so the choice is bounded by the memory the device has free.
fn probe(model: &mut dyn Model, limit: usize) -> Result<Vec<(usize, f64)>, BackendError> {
    let mut curve = Vec::new();
    let mut b = 1;
    while b <= limit {
        let batch = inputs(model.signature(), b)?;
        if let Err(e) = model.infer(&batch) {
            if curve.is_empty() {
                return Err(e);
            }
            tracing::info!(batch_size = b, error = %e, "max_batch_size auto: probe stopped at a size that fails");
            break;
        }
        let mut times = Vec::with_capacity(3);
        for _ in 0..3 {
            let t = Instant::now();
            model.infer(&batch)?;
            times.push(t.elapsed());
        }
        times.sort();
        let median = times[1].max(Duration::from_nanos(1));
        curve.push((b, b as f64 / median.as_secs_f64()));
        // The choice is the first size past which throughput stops growing: once a size gains
        // too little, larger ones cannot change it and would only slow the load down.
        let settled =
            matches!(curve.as_slice(), [.., (_, before), (_, now)] if *now < before * GAIN);
        if settled || median > PROBE_LIMIT {
            break;
        }
        b *= 2;
    }
    Ok(curve)
}

/// The smallest probed size past which throughput grows by less than [`GAIN`].
fn choose(curve: &[(usize, f64)]) -> usize {
    curve
        .windows(2)
        .find(|w| w[1].1 < w[0].1 * GAIN)
        .map(|w| w[0].0)
        .or_else(|| curve.last().map(|c| c.0))
        .unwrap_or(1)
}

/// Zero inputs for a batch of `items` (0: the declared shape of an unbatched model); dynamic
/// dimensions other than the batch get size 1.
fn inputs(signature: &Signature, items: usize) -> Result<Vec<Tensor>, BackendError> {
    signature
        .inputs
        .iter()
        .map(|s| {
            let shape: Vec<usize> = s
                .shape
                .iter()
                .enumerate()
                .map(|(d, &n)| match (d, n) {
                    (0, _) if items > 0 => items,
                    (_, n) if n < 0 => 1,
                    (_, n) => n as usize,
                })
                .collect();
            let bytes = shape.iter().product::<usize>() * s.dtype.size();
            Tensor::new(s.dtype, shape, Bytes::from(vec![0u8; bytes]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_backend::{DataType, TensorSpec};
    use std::sync::Arc;

    /// Records the batch sizes it is run with.
    struct Counting {
        signature: Signature,
        runs: Vec<usize>,
    }

    impl Model for Counting {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            self.runs.push(inputs[0].items());
            Ok(inputs.to_vec())
        }
    }

    fn counting() -> Counting {
        let spec = TensorSpec {
            name: "x".into(),
            dtype: DataType::F32,
            shape: vec![-1, 3, -1],
        };
        Counting {
            signature: Signature {
                inputs: vec![spec.clone()],
                outputs: vec![spec],
            },
            runs: Vec::new(),
        }
    }

    fn spec(max: usize, allowed: Vec<usize>) -> PrepareSpec {
        PrepareSpec {
            max_batch_size: max,
            auto: false,
            allowed_batch_sizes: allowed,
            warmup: true,
        }
    }

    #[test]
    fn warm_up_runs_each_size_that_will_be_used() {
        let mut m = counting();
        assert_eq!(prepare(&mut m, &spec(12, vec![]), "m").unwrap(), 12);
        assert_eq!(m.runs, vec![1, 2, 4, 8, 12]);
        let mut m = counting();
        prepare(&mut m, &spec(8, vec![2, 8]), "m").unwrap();
        assert_eq!(m.runs, vec![2, 8]);
        let mut m = counting();
        prepare(
            &mut m,
            &PrepareSpec {
                warmup: false,
                ..spec(8, vec![])
            },
            "m",
        )
        .unwrap();
        assert!(m.runs.is_empty());
    }

    /// Fails at batch sizes above 4, as a device out of memory would.
    struct Small(Counting);

    impl Model for Small {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            if inputs[0].items() > 4 {
                return Err(BackendError::Runtime("out of memory".into()));
            }
            self.0.infer(inputs)
        }
    }

    #[test]
    fn auto_stops_at_the_first_size_that_fails() {
        let mut m = Small(counting());
        let chosen = prepare(
            &mut m,
            &PrepareSpec {
                auto: true,
                warmup: false,
                ..spec(64, vec![])
            },
            "m",
        )
        .unwrap();
        assert!(chosen <= 4, "chose {chosen}");
    }

    /// Takes `cost(batch size)` per run, like a device with that cost curve.
    struct Timed(Counting, fn(usize) -> Duration);

    impl Model for Timed {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            std::thread::sleep((self.1)(inputs[0].items()));
            self.0.infer(inputs)
        }
    }

    fn auto(model: &mut dyn Model, limit: usize) -> usize {
        let spec = PrepareSpec {
            auto: true,
            warmup: false,
            ..spec(limit, vec![])
        };
        prepare(model, &spec, "m").unwrap()
    }

    /// Each probed size runs once to warm and three times timed.
    fn probed(sizes: &[usize]) -> Vec<usize> {
        sizes.iter().flat_map(|&b| [b; 4]).collect()
    }

    #[test]
    fn auto_probes_powers_of_two_up_to_the_limit() {
        // A fixed cost per batch: throughput doubles with every size.
        let mut m = Timed(counting(), |_| Duration::from_millis(5));
        assert_eq!(auto(&mut m, 8), 8);
        assert_eq!(m.0.runs, probed(&[1, 2, 4, 8]));
    }

    #[test]
    fn auto_stops_probing_once_throughput_stops_growing() {
        // 8 ms per batch up to 4 items, then 4 ms per item: throughput halves past 4.
        let mut m = Timed(counting(), |b| {
            Duration::from_millis(if b <= 4 { 8 } else { 4 * b as u64 })
        });
        assert_eq!(auto(&mut m, 256), 4);
        assert_eq!(m.0.runs, probed(&[1, 2, 4, 8]));
    }

    /// Records when each of its runs started and ended.
    struct Spans(Counting, Arc<Mutex<Vec<(Instant, Instant)>>>);

    impl Model for Spans {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            let start = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            self.1.lock().unwrap().push((start, Instant::now()));
            self.0.infer(inputs)
        }
    }

    #[test]
    fn models_loading_together_are_probed_one_at_a_time() {
        let runs: Vec<_> = (0..2).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
        let threads: Vec<_> = runs
            .iter()
            .map(|r| {
                let r = r.clone();
                std::thread::spawn(move || auto(&mut Spans(counting(), r), 16))
            })
            .collect();
        threads.into_iter().for_each(|t| {
            t.join().unwrap();
        });
        let span = |r: &Arc<Mutex<Vec<(Instant, Instant)>>>| {
            let r = r.lock().unwrap();
            (r[0].0, r[r.len() - 1].1)
        };
        let (a, b) = (span(&runs[0]), span(&runs[1]));
        assert!(a.1 <= b.0 || b.1 <= a.0, "the probes overlapped");
    }

    #[test]
    fn chooses_where_gains_fall_below_five_percent() {
        let curve = [(1, 100.0), (2, 190.0), (4, 350.0), (8, 360.0), (16, 365.0)];
        assert_eq!(choose(&curve), 4);
        assert_eq!(choose(&[(1, 100.0), (2, 200.0)]), 2);
        assert_eq!(choose(&[(1, 100.0)]), 1);
    }
}
