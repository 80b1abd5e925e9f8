//! Copies a batch's pieces (the requests' tensors, in order) into one staged input buffer, on
//! several threads when the batch is large.
//!
//! One thread copies a few GB/s from memory to memory; a batch of 64 images of 602 KB (38 MB)
//! then takes its instance 3-5 ms before the GPU sees it, about as long as the GPU's own run of
//! the batch (measured on an H100's host, `bench/RESULTS.md`). Memory bandwidth serves several
//! copying threads at once, so a large batch is split into contiguous byte ranges, each copied
//! by a scoped thread of its own while the instance's thread copies the last range. Small
//! batches stay on the instance's thread: starting a thread costs tens of microseconds, and
//! each thread here copies at least 1 MiB (a few hundred microseconds).

/// Below this many bytes a batch is copied by the instance's thread alone.
const PARALLEL_BYTES: usize = 2 << 20;
/// Each thread copies at least this many bytes.
const BYTES_PER_THREAD: usize = 1 << 20;
/// Most threads that copy one batch: past about four, memory bandwidth, not threads, limits.
const MOST_THREADS: usize = 4;

/// How many threads copy `bytes`: one below [`PARALLEL_BYTES`], else one per
/// [`BYTES_PER_THREAD`], at most [`MOST_THREADS`] and at most the cores this thread may run on.
pub(crate) fn threads_for(bytes: usize) -> usize {
    if bytes < PARALLEL_BYTES {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (bytes / BYTES_PER_THREAD).clamp(1, MOST_THREADS.min(cores))
}

/// Copies the concatenation of `parts` into the start of `dst` with `threads` threads (this one
/// included); returns the bytes copied. `dst` must hold them all.
pub(crate) fn gather(dst: &mut [u8], parts: &[&[u8]], threads: usize) -> usize {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let dst = &mut dst[..total];
    let threads = threads.clamp(1, total.max(1));
    if threads == 1 {
        copy_range(dst, parts, 0);
        return total;
    }
    let chunk = total.div_ceil(threads);
    std::thread::scope(|scope| {
        let mut rest = dst;
        let mut begin = 0;
        while rest.len() > chunk {
            let (mine, tail) = rest.split_at_mut(chunk);
            rest = tail;
            let from = begin;
            scope.spawn(move || copy_range(mine, parts, from));
            begin += chunk;
        }
        copy_range(rest, parts, begin);
    });
    total
}

/// Copies bytes `begin..begin + dst.len()` of the concatenation of `parts` into `dst`.
fn copy_range(dst: &mut [u8], parts: &[&[u8]], begin: usize) {
    let end = begin + dst.len();
    let (mut at, mut written) = (0, 0);
    for part in parts {
        let next = at + part.len();
        if next > begin && at < end {
            let (from, to) = (begin.max(at) - at, end.min(next) - at);
            dst[written..written + (to - from)].copy_from_slice(&part[from..to]);
            written += to - from;
        }
        if next >= end {
            break;
        }
        at = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_split_copies_the_parts_in_order() {
        // Parts of uneven sizes, an empty one among them, so that the ranges cut through parts.
        let sizes = [7usize, 0, 1, 300, 64, 5, 1000, 3];
        let parts: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|i| (k * 31 + i) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let expected: Vec<u8> = parts.concat();
        for threads in [1, 2, 3, 4, 7, 64, 5000] {
            let mut dst = vec![0xAAu8; expected.len() + 10];
            assert_eq!(gather(&mut dst, &refs, threads), expected.len());
            assert_eq!(
                &dst[..expected.len()],
                expected.as_slice(),
                "{threads} threads"
            );
            // Nothing past the parts is touched.
            assert!(dst[expected.len()..].iter().all(|&b| b == 0xAA));
        }
    }

    #[test]
    fn no_parts_copy_nothing() {
        let mut dst = [1u8; 4];
        assert_eq!(gather(&mut dst, &[], 4), 0);
        assert_eq!(gather(&mut dst, &[&[]], 4), 0);
        assert_eq!(dst, [1; 4]);
    }

    #[test]
    fn only_large_batches_take_more_threads() {
        assert_eq!(threads_for(0), 1);
        assert_eq!(threads_for(PARALLEL_BYTES - 1), 1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let most = MOST_THREADS.min(cores);
        assert_eq!(
            threads_for(PARALLEL_BYTES),
            (PARALLEL_BYTES / BYTES_PER_THREAD).min(most)
        );
        assert_eq!(threads_for(1 << 30), most);
    }
}
