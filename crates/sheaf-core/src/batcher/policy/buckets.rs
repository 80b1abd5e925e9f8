//! How many of the queued items a batch takes when the model runs only some batch sizes
//! (`allowed_batch_sizes`, or the buckets of a model with one session per batch size).
//!
//! A batch of n items runs padded up to the next allowed size `up`. When n lies between two
//! allowed sizes, `down < n < up`, the batch can instead take `down` items, which run without
//! padding, and leave the other `n − down` queued for the next batch. With the learned cost
//! t(b) = a + c·b of a batch padded to b (see [`super::CostModel`]), the batch takes `down` when
//! that costs less per item: t(down)/down < t(up)/n. On a GPU, whose cost is nearly all per
//! item at these sizes, 40 queued items run as 32 now rather than padded to 64 (which takes
//! about twice as long for 25% more items); with a large fixed cost (a), padding wins and every
//! queued item goes. Until a cost curve is learned, every queued item goes, as without buckets.
//!
//! The policy decides when a batch is due; this only bounds its size. The items left behind
//! are the oldest of what remains, and go first in the next batch. [`taken`] and [`padded`] say
//! which batch a number of queued items forms: the batcher forms it, and `latency_slo` prices a
//! wait by it.

/// The number of items the next batch should take out of `queued`, when that is fewer than all
/// of them: `allowed` ascending, `(a, c)` the learned cost in seconds. `None`: take them all.
pub fn trimmed_to_bucket(queued: usize, allowed: &[usize], cost: (f64, f64)) -> Option<usize> {
    let up = allowed.iter().copied().find(|&s| s >= queued)?;
    if up == queued {
        return None;
    }
    let down = allowed.iter().copied().rev().find(|&s| s < queued)?;
    let (a, c) = cost;
    let t = |b: usize| a + c * b as f64;
    // t(down)/down < t(up)/queued, without the divisions.
    (t(down) * (queued as f64) < t(up) * (down as f64)).then_some(down)
}

/// How many of `queued` items the next batch takes under a positive `max`: all of them up to
/// `max`, or fewer where [`trimmed_to_bucket`] says so (once a cost curve is learned).
pub fn taken(queued: usize, max: usize, allowed: &[usize], cost: Option<(f64, f64)>) -> usize {
    if queued >= max || allowed.is_empty() {
        return queued.min(max);
    }
    cost.and_then(|cost| trimmed_to_bucket(queued, allowed, cost))
        .unwrap_or(queued)
}

/// The size a batch of `items` runs at: the smallest allowed size that holds it (`allowed`
/// ascending), or its own size where none does or any size is allowed.
pub fn padded(items: usize, allowed: &[usize]) -> usize {
    allowed
        .iter()
        .copied()
        .find(|&a| a >= items)
        .unwrap_or(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKETS: &[usize] = &[1, 2, 4, 8, 16, 32, 64];

    #[test]
    fn a_per_item_cost_runs_the_full_bucket_and_leaves_the_rest() {
        // 0.15 ms an item, nothing fixed: 40 padded to 64 would cost 9.6 ms for 40 items.
        let gpu = (0.0, 0.15e-3);
        assert_eq!(trimmed_to_bucket(40, BUCKETS, gpu), Some(32));
        assert_eq!(trimmed_to_bucket(63, BUCKETS, gpu), Some(32));
        assert_eq!(trimmed_to_bucket(3, BUCKETS, gpu), Some(2));
    }

    #[test]
    fn a_large_fixed_cost_pads_and_takes_everything() {
        // 5 ms a batch, 0.01 ms an item: a second batch costs more than the padding.
        let fixed = (5e-3, 0.01e-3);
        assert_eq!(trimmed_to_bucket(40, BUCKETS, fixed), None);
        assert_eq!(trimmed_to_bucket(3, BUCKETS, fixed), None);
    }

    #[test]
    fn the_balance_point_follows_the_curve() {
        // a = 2c: taking 32 of 40 costs 34c/32 = 1.0625c an item, padding 66c/40 = 1.65c.
        assert_eq!(trimmed_to_bucket(40, BUCKETS, (2.0, 1.0)), Some(32));
        // Just under a full bucket the padding is small: 63 padded costs 66c/63 = 1.048c an
        // item, less than the 1.0625c of 32; 62 padded costs 1.065c, just more.
        assert_eq!(trimmed_to_bucket(63, BUCKETS, (2.0, 1.0)), None);
        assert_eq!(trimmed_to_bucket(62, BUCKETS, (2.0, 1.0)), Some(32));
    }

    #[test]
    fn sizes_that_fit_a_bucket_or_leave_the_buckets_are_taken_whole() {
        let gpu = (0.0, 0.15e-3);
        assert_eq!(trimmed_to_bucket(32, BUCKETS, gpu), None);
        assert_eq!(trimmed_to_bucket(1, BUCKETS, gpu), None);
        // Past the largest, the batch is bounded by the maximum anyway.
        assert_eq!(trimmed_to_bucket(100, BUCKETS, gpu), None);
        // Below the smallest there is nothing to trim to.
        assert_eq!(trimmed_to_bucket(3, &[4, 8], gpu), None);
        assert_eq!(trimmed_to_bucket(5, &[], gpu), None);
    }

    #[test]
    fn the_batch_a_queue_forms() {
        let gpu = Some((0.0, 0.15e-3));
        // 24 queued: 16 go, padded to nothing; the maximum bounds what goes.
        assert_eq!(taken(24, 64, BUCKETS, gpu), 16);
        assert_eq!(padded(16, BUCKETS), 16);
        assert_eq!(taken(100, 64, BUCKETS, gpu), 64);
        // Before a curve is learned, or where any size runs, every queued item goes.
        assert_eq!(taken(24, 64, BUCKETS, None), 24);
        assert_eq!(taken(24, 64, &[], gpu), 24);
        assert_eq!(padded(24, &[]), 24);
        // Where no smaller size is allowed, the items run padded up.
        assert_eq!(taken(8, 64, &[16, 32, 64], gpu), 8);
        assert_eq!(padded(8, &[16, 32, 64]), 16);
    }
}
