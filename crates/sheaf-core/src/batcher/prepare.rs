//! What an instance does after loading and before it serves: settle `max_batch_size` (probing
//! the model when it is `auto`, on batches of zeros, or of a ragged model's warm-up samples),
//! settle the batch sizes it will run (with buckets: the powers of two below the maximum, and the
//! maximum), and warm up, one run per batch size that will be used. Then the model may free what
//! it holds for other sizes (sessions made while probing). The configuration's own warm-up
//! samples run after it, on the sizes it settled ([`crate::warmup`]).
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
    /// With `auto`, the smallest size it settles on (up to `max_batch_size`): the largest
    /// warm-up sample's batch, which the model must take whatever the probe measured.
    pub auto_floor: usize,
    /// Allowed batch sizes (warm-up runs exactly these when set).
    pub allowed_batch_sizes: Vec<usize>,
    /// Without allowed sizes, pad batches to buckets: powers of two below the maximum, and the
    /// maximum (for models with one session per batch size).
    pub buckets: bool,
    pub warmup: bool,
}

/// What preparation settled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settled {
    pub max_batch_size: usize,
    /// The sizes batches are padded to, ascending; empty: any size.
    pub batch_sizes: Vec<usize>,
}

/// Throughput gain below which a bigger batch is not worth it, for `auto`.
const GAIN: f64 = 1.05;
/// A probe stops at sizes whose run takes longer than this.
const PROBE_LIMIT: Duration = Duration::from_secs(1);
/// Untimed runs of each probed size first: a GPU runtime picks its kernels and grows its memory
/// on the first runs of a shape.
const PROBE_WARM_RUNS: usize = 2;
/// Timed runs of each probed size; the median counts.
const PROBE_TIMED_RUNS: usize = 5;

/// Held while a model is probed: models load in parallel, and a probe timed while another one
/// runs would measure the contention rather than the model.
static PROBING: Mutex<()> = Mutex::new(());

/// Builds the batch of a given number of items that the `auto` probe times, with how many items
/// it counts as: zeros shaped by the model's signature ([`prepare`]), each an item; or for a
/// ragged model, requests made from its warm-up samples ([`crate::warmup::probe_batch`]), which
/// count by their size against the samples' mean, so that batches of another mix of lengths
/// compare.
pub type ProbeBatch<'a> = &'a dyn Fn(usize) -> Result<(Vec<Tensor>, f64), BackendError>;

/// Reads the time: [`Instant::now`] when serving; the tests give the probe a clock that a model's
/// runs advance by their modelled cost, so that what the probe chooses does not depend on how
/// busy the machine running them is.
type Clock<'a> = &'a dyn Fn() -> Instant;

/// Runs the preparation and returns the batch sizes to use.
pub fn prepare(
    model: &mut dyn Model,
    spec: &PrepareSpec,
    name: &str,
) -> Result<Settled, BackendError> {
    let signature = model.signature().clone();
    prepare_timed(model, spec, name, &|b| zeros(&signature, b), &Instant::now)
}

/// [`prepare`], with the `auto` probe timing the batches `batch` makes rather than zeros: how a
/// ragged model, whose inputs have no one shape to fill, is probed.
pub fn prepare_probing(
    model: &mut dyn Model,
    spec: &PrepareSpec,
    name: &str,
    batch: ProbeBatch,
) -> Result<Settled, BackendError> {
    prepare_timed(model, spec, name, batch, &Instant::now)
}

/// [`prepare`], probing with `batch` and timing the probe by `now`.
fn prepare_timed(
    model: &mut dyn Model,
    spec: &PrepareSpec,
    name: &str,
    batch: ProbeBatch,
    now: Clock,
) -> Result<Settled, BackendError> {
    let batched = spec.max_batch_size > 0;
    let mut max = spec.max_batch_size;
    if spec.auto && batched {
        let curve = {
            let _alone = PROBING.lock().unwrap_or_else(|e| e.into_inner());
            probe(model, spec.max_batch_size, batch, now)?
        };
        max = choose(&curve).max(spec.auto_floor.min(spec.max_batch_size));
        let text: Vec<String> = curve
            .iter()
            .map(|(b, t)| format!("{b}: {t:.0}/s"))
            .collect();
        tracing::info!(model = name, curve = %text.join(", "), chosen = max, "max_batch_size auto: measured items/s by batch size");
    }
    let batch_sizes = if !batched {
        Vec::new()
    } else if !spec.allowed_batch_sizes.is_empty() {
        spec.allowed_batch_sizes.clone()
    } else if spec.buckets {
        powers_of_two_and(max)
    } else {
        Vec::new()
    };
    if spec.warmup {
        let sizes = if !batched {
            vec![0]
        } else if batch_sizes.is_empty() {
            powers_of_two_and(max)
        } else {
            batch_sizes.clone()
        };
        let started = Instant::now();
        // Largest first: sessions that share one arena (see sheaf_onnx's arena) then fit each
        // smaller size into memory the largest already took, where growing sizes would each
        // add their own (measured on the CPU: 1.14x the largest size alone, against 1.46x).
        for &b in sizes.iter().rev() {
            model.infer(&inputs(model.signature(), b)?)?;
        }
        // A size's first run allocates tensor by tensor and plans the later runs; the probe
        // grew the arena size by size. What no run holds now goes back, and a second pass,
        // largest first, takes what the planned runs need (on the CPU, EfficientNet-Lite0
        // probed up to 32: 359 MiB, against 760 without the release).
        if model.release_memory(&inputs(model.signature(), sizes[0])?)? {
            for &b in sizes.iter().rev() {
                model.infer(&inputs(model.signature(), b)?)?;
            }
        }
        tracing::debug!(
            model = name,
            ?sizes,
            ms = started.elapsed().as_millis() as u64,
            "warm-up done"
        );
    }
    if !batch_sizes.is_empty() {
        model.keep_batch_sizes(&batch_sizes);
    }
    Ok(Settled {
        max_batch_size: max,
        batch_sizes,
    })
}

/// 1, 2, 4, … below `max`, then `max`.
pub(crate) fn powers_of_two_and(max: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
        .take_while(|&b| b < max)
        .collect();
    sizes.push(max);
    sizes
}

/// Items per second at batch sizes 1, 2, 4, … up to `limit`. Each size runs
/// [`PROBE_WARM_RUNS`] times untimed, then [`PROBE_TIMED_RUNS`] times; the median counts. The
/// probe goes on while a run stays under [`PROBE_LIMIT`], runs succeed (a size that fails, on a
/// GPU typically out of memory, ends it, so the choice is bounded by the memory the device has
/// free), and one of the last two sizes still gained [`GAIN`] over the best before it: one
/// size that gains little (a noisy timing) does not end the probe, two in a row do.
///
/// Then every probed size is measured again, largest first, and the faster of its two figures
/// counts. Other models load while this one is probed (only probes take turns), so the first
/// sizes, measured first, are the likeliest to run beside a load; contention only ever slows a
/// run, so the faster figure is the nearer one. Measured on this machine with the demo
/// repository loading: the text-orientation CNN's batch 1 ran at 51 items/s in the first pass
/// against 332 alone, and the probe chose 32 where 4 is best.
fn probe(
    model: &mut dyn Model,
    limit: usize,
    batch: ProbeBatch,
    now: Clock,
) -> Result<Vec<(usize, f64)>, BackendError> {
    let mut curve = sweep(model, limit, batch, now)?;
    for (b, items_s) in curve.iter_mut().rev() {
        let (batch, items) = batch(*b)?;
        if let Ok(again) = timed_throughput(model, (&batch, items), Duration::ZERO, now) {
            *items_s = items_s.max(again);
        }
    }
    Ok(curve)
}

/// The first pass of [`probe`]: sizes upwards while they gain.
fn sweep(
    model: &mut dyn Model,
    limit: usize,
    batch: ProbeBatch,
    now: Clock,
) -> Result<Vec<(usize, f64)>, BackendError> {
    let mut curve: Vec<(usize, f64)> = Vec::new();
    let mut b = 1;
    while b <= limit {
        // A size whose batch the host cannot hold ends the probe as one that fails to run.
        let run = batch(b).and_then(|(batch, items)| {
            timed_throughput(model, (&batch, items), Duration::ZERO, now)
        });
        let items_s = match run {
            Ok(items_s) => items_s,
            Err(e) if curve.is_empty() => return Err(e),
            Err(e) => {
                tracing::info!(batch_size = b, error = %e, "max_batch_size auto: probe stopped at a size that fails");
                break;
            }
        };
        curve.push((b, items_s));
        if stalled(&curve) || b as f64 / items_s > PROBE_LIMIT.as_secs_f64() {
            break;
        }
        b *= 2;
    }
    Ok(curve)
}

/// Items per second of `model` on `batch`: [`PROBE_WARM_RUNS`] untimed runs, then timed runs,
/// at least [`PROBE_TIMED_RUNS`] and as many more as fit in `budget`, of which the median run
/// counts. The `auto` probe and `sheaf bench`'s in-process reference both measure with this, so
/// their figures are the same measurement.
pub fn throughput(
    model: &mut dyn Model,
    batch: &[Tensor],
    budget: Duration,
) -> Result<f64, BackendError> {
    let items = batch.first().map_or(1, |t| t.items());
    timed_throughput(model, (batch, items as f64), budget, &Instant::now)
}

/// [`throughput`] of a batch that counts as `items` (a ragged batch's inputs do not count
/// them; see [`ProbeBatch`]), timed by `now`.
fn timed_throughput(
    model: &mut dyn Model,
    (batch, items): (&[Tensor], f64),
    budget: Duration,
    now: Clock,
) -> Result<f64, BackendError> {
    for _ in 0..PROBE_WARM_RUNS {
        model.infer(batch)?;
    }
    let started = now();
    let mut times = Vec::with_capacity(PROBE_TIMED_RUNS);
    while times.len() < PROBE_TIMED_RUNS || now() - started < budget {
        let t = now();
        model.infer(batch)?;
        times.push(now() - t);
    }
    times.sort();
    let median = times[times.len() / 2].max(Duration::from_nanos(1));
    Ok(items / median.as_secs_f64())
}

/// True when neither of the last two sizes gained [`GAIN`] over the best size before it.
fn stalled(curve: &[(usize, f64)]) -> bool {
    let gained = |i: usize| {
        let best_before = curve[..i].iter().map(|c| c.1).fold(0.0, f64::max);
        curve[i].1 >= best_before * GAIN
    };
    curve.len() >= 3 && !gained(curve.len() - 1) && !gained(curve.len() - 2)
}

/// The smallest probed size whose throughput is within [`GAIN`] of the best probed.
fn choose(curve: &[(usize, f64)]) -> usize {
    let best = curve.iter().map(|c| c.1).fold(0.0, f64::max);
    curve
        .iter()
        .find(|c| c.1 * GAIN >= best)
        .map(|c| c.0)
        .unwrap_or(1)
}

/// [`inputs`] for the probe: a batch of `items`, each counted as one.
fn zeros(signature: &Signature, items: usize) -> Result<(Vec<Tensor>, f64), BackendError> {
    inputs(signature, items).map(|batch| (batch, items as f64))
}

/// Zero inputs for a batch of `items` (0: the declared shape of an unbatched model); dynamic
/// dimensions other than the batch get size 1.
fn inputs(signature: &Signature, items: usize) -> Result<Vec<Tensor>, BackendError> {
    inputs_within(
        signature,
        items,
        crate::host_memory::available_memory().unwrap_or(u64::MAX),
    )
}

/// [`inputs`], refused before anything is allocated when one batch of them would take more
/// than `available` bytes (or more than a size can count): a `max_batch_size` the host cannot
/// hold a batch of fails the load with the reason, rather than the server with it.
fn inputs_within(
    signature: &Signature,
    items: usize,
    available: u64,
) -> Result<Vec<Tensor>, BackendError> {
    let shapes: Vec<Vec<usize>> = signature
        .inputs
        .iter()
        .map(|s| {
            s.shape
                .iter()
                .enumerate()
                .map(|(d, &n)| match (d, n) {
                    (0, _) if items > 0 => items,
                    (_, n) if n < 0 => 1,
                    (_, n) => n as usize,
                })
                .collect()
        })
        .collect();
    let sizes: Option<Vec<usize>> = shapes
        .iter()
        .zip(&signature.inputs)
        .map(|(shape, s)| {
            shape
                .iter()
                .try_fold(s.dtype.size(), |bytes, &n| bytes.checked_mul(n))
        })
        .collect();
    let fits = |sizes: &Vec<usize>| {
        sizes
            .iter()
            .try_fold(0usize, |sum, &b| sum.checked_add(b))
            .is_some_and(|total| total as u64 <= available)
    };
    let Some(sizes) = sizes.filter(fits) else {
        return Err(BackendError::Load(format!(
            "a batch of {items} items of this model's inputs takes more memory than the {} MiB \
             the host has available; lower max_batch_size",
            available / (1 << 20)
        )));
    };
    shapes
        .into_iter()
        .zip(sizes)
        .zip(&signature.inputs)
        .map(|((shape, bytes), s)| Tensor::new(s.dtype, shape, Bytes::from(vec![0u8; bytes])))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sheaf_backend::{DataType, TensorSpec};
    use std::sync::Arc;

    /// One batch's warm-up inputs are sized before they are allocated: a batch the host's
    /// available memory cannot hold (or no size can count) fails the load with the reason.
    #[test]
    fn a_batch_the_host_cannot_hold_is_refused_before_it_is_allocated() {
        let signature = Signature {
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DataType::F32,
                shape: vec![-1, 1000],
            }],
            outputs: vec![],
        };
        // 10 items of 1,000 floats take 40,000 bytes.
        let fits = inputs_within(&signature, 10, 40_000).unwrap();
        assert_eq!(fits[0].shape(), &[10, 1000]);
        let error = inputs_within(&signature, 11, 40_000)
            .unwrap_err()
            .to_string();
        assert!(error.contains("a batch of 11 items"), "{error}");
        assert!(error.contains("lower max_batch_size"), "{error}");
        assert!(inputs_within(&signature, usize::MAX / 2, u64::MAX).is_err());
    }

    /// Records the batch sizes it is run with.
    pub(crate) struct Counting {
        signature: Signature,
        pub(crate) runs: Vec<usize>,
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

    pub(crate) fn counting() -> Counting {
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
            auto_floor: 0,
            allowed_batch_sizes: allowed,
            buckets: false,
            warmup: true,
        }
    }

    #[test]
    fn warm_up_runs_each_size_that_will_be_used() {
        let mut m = counting();
        let settled = prepare(&mut m, &spec(12, vec![]), "m").unwrap();
        assert_eq!(settled.max_batch_size, 12);
        assert!(settled.batch_sizes.is_empty(), "any size may run");
        // Largest first, so that smaller sizes reuse the memory the largest took.
        assert_eq!(m.runs, vec![12, 8, 4, 2, 1]);
        let mut m = counting();
        let settled = prepare(&mut m, &spec(8, vec![2, 8]), "m").unwrap();
        assert_eq!(settled.batch_sizes, vec![2, 8]);
        assert_eq!(m.runs, vec![8, 2]);
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

    /// Holds memory it gives back when asked: records the release among its runs (as 0).
    struct Releasing(Counting);

    impl Model for Releasing {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            self.0.infer(inputs)
        }

        fn release_memory(&mut self, inputs: &[Tensor]) -> Result<bool, BackendError> {
            assert_eq!(inputs[0].items(), 1, "the release runs the smallest size");
            self.0.runs.push(0);
            Ok(true)
        }
    }

    #[test]
    fn a_model_that_gives_memory_back_is_warmed_a_second_time_largest_first() {
        let mut m = Releasing(counting());
        prepare(&mut m, &spec(8, vec![]), "m").unwrap();
        assert_eq!(m.0.runs, vec![8, 4, 2, 1, 0, 8, 4, 2, 1]);
        // After the probe too: its sizes upwards, then the same warm-up.
        let mut m = Releasing(counting());
        let auto = PrepareSpec {
            auto: true,
            ..spec(2, vec![])
        };
        let settled = prepare(&mut m, &auto, "m").unwrap();
        let release = m.0.runs.iter().position(|&r| r == 0).unwrap();
        let warm: Vec<usize> = powers_of_two_and(settled.max_batch_size)
            .into_iter()
            .rev()
            .collect();
        assert_eq!(m.0.runs[release + 1..], warm[..]);
        assert_eq!(m.0.runs[release - warm.len()..release], warm[..]);
    }

    /// Records the sizes it is told to keep.
    struct Keeping(Counting, Vec<usize>);

    impl Model for Keeping {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            self.0.infer(inputs)
        }

        fn keep_batch_sizes(&mut self, sizes: &[usize]) {
            self.1 = sizes.to_vec();
        }
    }

    #[test]
    fn buckets_are_powers_of_two_and_the_maximum_each_warmed_and_kept() {
        let mut m = Keeping(counting(), Vec::new());
        let buckets = PrepareSpec {
            buckets: true,
            ..spec(24, vec![])
        };
        let settled = prepare(&mut m, &buckets, "m").unwrap();
        assert_eq!(settled.batch_sizes, vec![1, 2, 4, 8, 16, 24]);
        assert_eq!(m.0.runs, vec![24, 16, 8, 4, 2, 1]);
        assert_eq!(m.1, vec![1, 2, 4, 8, 16, 24]);
        // Allowed sizes, when given, are the buckets.
        let mut m = Keeping(counting(), Vec::new());
        let settled = prepare(
            &mut m,
            &PrepareSpec {
                buckets: true,
                ..spec(8, vec![4, 8])
            },
            "m",
        )
        .unwrap();
        assert_eq!(settled.batch_sizes, vec![4, 8]);
        assert_eq!(m.1, vec![4, 8]);
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
        .unwrap()
        .max_batch_size;
        assert!(chosen <= 4, "chose {chosen}");
    }

    /// The probe's clock in the tests: time passes only as the models' runs say they take.
    #[derive(Clone)]
    struct Virtual(Instant, Arc<Mutex<Duration>>);

    impl Virtual {
        fn new() -> Self {
            Virtual(Instant::now(), Arc::default())
        }

        fn now(&self) -> Instant {
            self.0 + *self.1.lock().unwrap()
        }

        fn pass(&self, time: Duration) {
            *self.1.lock().unwrap() += time;
        }
    }

    /// Takes `cost(batch size)` per run on its clock, like a device with that cost curve.
    struct Timed(Counting, fn(usize) -> Duration, Virtual);

    impl Model for Timed {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            self.2.pass((self.1)(inputs[0].items()));
            self.0.infer(inputs)
        }
    }

    fn timed(cost: fn(usize) -> Duration) -> Timed {
        Timed(counting(), cost, Virtual::new())
    }

    fn auto(model: &mut dyn Model, limit: usize, clock: &Virtual) -> usize {
        let spec = PrepareSpec {
            auto: true,
            warmup: false,
            ..spec(limit, vec![])
        };
        let signature = model.signature().clone();
        prepare_timed(model, &spec, "m", &|b| zeros(&signature, b), &|| {
            clock.now()
        })
        .unwrap()
        .max_batch_size
    }

    /// Each probed size runs twice to warm and five times timed, upwards, then again downwards.
    fn probed(sizes: &[usize]) -> Vec<usize> {
        let up = sizes.iter().flat_map(|&b| [b; 7]);
        let down = sizes.iter().rev().flat_map(|&b| [b; 7]);
        up.chain(down).collect()
    }

    #[test]
    fn auto_probes_powers_of_two_up_to_the_limit() {
        // A fixed cost per batch: throughput doubles with every size.
        let mut m = timed(|_| Duration::from_millis(5));
        let clock = m.2.clone();
        assert_eq!(auto(&mut m, 8, &clock), 8);
        assert_eq!(m.0.runs, probed(&[1, 2, 4, 8]));
    }

    #[test]
    fn auto_stops_probing_once_throughput_stops_growing() {
        // 8 ms per batch up to 4 items, then 4 ms per item: throughput halves past 4. Two
        // sizes without gain end the probe.
        let mut m = timed(|b| Duration::from_millis(if b <= 4 { 8 } else { 4 * b as u64 }));
        let clock = m.2.clone();
        assert_eq!(auto(&mut m, 256, &clock), 4);
        assert_eq!(m.0.runs, probed(&[1, 2, 4, 8, 16]));
    }

    #[test]
    fn auto_looks_past_one_size_that_gains_nothing() {
        // A dip at 4 (as a noisy or badly warmed size would show), then the curve climbs on to
        // 16: the probe does not stop at the dip, and picks the best size.
        let mut m = timed(|b| {
            Duration::from_millis(match b {
                1 => 4,
                2 => 6,
                4 => 16,
                8 => 8,
                _ => 10,
            })
        });
        let clock = m.2.clone();
        assert_eq!(auto(&mut m, 16, &clock), 16);
    }

    #[test]
    fn auto_settles_on_no_less_than_the_largest_warm_up_sample() {
        // 4 ms per item: batch 1 is as good as any, but a sample of 4 items must still run.
        let linear = |b: usize| Duration::from_millis(4 * b as u64);
        let mut m = timed(linear);
        let clock = m.2.clone();
        assert_eq!(auto(&mut m, 64, &clock), 1);
        let mut m = timed(linear);
        let clock = m.2.clone();
        let spec = PrepareSpec {
            auto: true,
            auto_floor: 4,
            warmup: false,
            ..spec(64, vec![])
        };
        let signature = m.signature().clone();
        let settled = prepare_timed(&mut m, &spec, "m", &|b| zeros(&signature, b), &|| {
            clock.now()
        });
        assert_eq!(settled.unwrap().max_batch_size, 4);
        // Never past the largest size it may run.
        let spec = PrepareSpec {
            auto_floor: 100,
            ..spec
        };
        let settled = prepare_timed(&mut m, &spec, "m", &|b| zeros(&signature, b), &|| {
            clock.now()
        });
        assert_eq!(settled.unwrap().max_batch_size, 64);
    }

    #[test]
    fn auto_times_the_batches_it_is_given_and_counts_their_items_as_they_say() {
        // A ragged model's batch: every request's 3 values in one row, so no input counts the
        // items. A fixed cost per batch makes each size twice as fast as the one before, and
        // the probe sees that only if it counts the items the batch says it holds.
        let mut m = timed(|_| Duration::from_millis(5));
        let clock = m.2.clone();
        let asked = Mutex::new(Vec::new());
        let flat = |items: usize| {
            asked.lock().unwrap().push(items);
            Tensor::new(
                DataType::F32,
                vec![1, 3 * items],
                vec![0u8; 12 * items].into(),
            )
            .map(|t| (vec![t], items as f64))
        };
        let spec = PrepareSpec {
            auto: true,
            warmup: false,
            ..spec(8, vec![])
        };
        let settled = prepare_timed(&mut m, &spec, "m", &flat, &|| clock.now()).unwrap();
        assert_eq!(settled.max_batch_size, 8);
        // Each size made once going up and once coming down; every run got its batch.
        assert_eq!(*asked.lock().unwrap(), vec![1, 2, 4, 8, 8, 4, 2, 1]);
        assert_eq!(m.0.runs, vec![1; 56]);
    }

    /// 2 ms per item, whatever the batch, but its first 14 runs 5x slower, as when other
    /// models load beside the probe.
    struct Contended(Counting, Virtual);

    impl Model for Contended {
        fn signature(&self) -> &Signature {
            self.0.signature()
        }

        fn infer(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
            let slowed = if self.0.runs.len() < 14 { 5 } else { 1 };
            self.1.pass(Duration::from_millis(
                (2 * inputs[0].items() * slowed) as u64,
            ));
            self.0.infer(inputs)
        }
    }

    #[test]
    fn a_probe_slowed_at_its_start_measures_again_and_keeps_the_faster_figure() {
        // The first pass sees 1 and 2 slowed and 4 at full speed, a gain that would choose 4;
        // measured again, every size runs as fast, and the smallest is chosen.
        let clock = Virtual::new();
        let mut m = Contended(counting(), clock.clone());
        assert_eq!(auto(&mut m, 64, &clock), 1);
        assert_eq!(m.0.runs, probed(&[1, 2, 4, 8, 16]));
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
                std::thread::spawn(move || {
                    let spec = PrepareSpec {
                        auto: true,
                        warmup: false,
                        ..spec(16, vec![])
                    };
                    prepare(&mut Spans(counting(), r), &spec, "m").unwrap()
                })
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
    fn chooses_the_smallest_size_within_five_percent_of_the_best() {
        let curve = [(1, 100.0), (2, 190.0), (4, 350.0), (8, 360.0), (16, 365.0)];
        assert_eq!(choose(&curve), 4);
        // The measured shape of the GPU curve that fooled a first-gain rule: 8 then 16 drops,
        // but 32 is best.
        let curve = [
            (1, 467.0),
            (2, 820.0),
            (4, 987.0),
            (8, 2909.0),
            (16, 1754.0),
            (32, 6000.0),
        ];
        assert_eq!(choose(&curve), 32);
        assert_eq!(choose(&[(1, 100.0), (2, 200.0)]), 2);
        assert_eq!(choose(&[(1, 100.0)]), 1);
    }

    #[test]
    fn a_probe_stalls_after_two_sizes_without_gain() {
        assert!(!stalled(&[(1, 100.0), (2, 101.0)]));
        assert!(!stalled(&[(1, 100.0), (2, 101.0), (4, 300.0)]));
        assert!(stalled(&[(1, 100.0), (2, 300.0), (4, 301.0), (8, 200.0)]));
        assert!(!stalled(&[(1, 100.0), (2, 300.0), (4, 290.0), (8, 900.0)]));
    }
}
