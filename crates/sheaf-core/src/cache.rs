//! The response cache: a request that repeats one already answered is answered from memory,
//! without touching the queue (Triton's response cache).
//!
//! One cache serves the whole server, bounded in bytes (`--cache-size`) and evicting the least
//! recently used answers first. A model takes part when its config asks (`response_cache: true`,
//! or `response_cache { enable: true }` in `config.pbtxt`). An entry holds the model's outputs
//! for the request's items, before any protocol renders them, so that one entry answers every
//! protocol and every choice of requested outputs or classification. A pipeline that takes part
//! keeps every output of its answer, keyed by its request's inputs
//! ([`crate::pipeline::Pipeline::cache_key`]), and a hit runs none of its steps.
//!
//! The key is a 128-bit keyed hash (two SipHash states with keys drawn at start) of the model's
//! load (a number no other load shares, so that no answer survives a reload or crosses
//! versions) and every input's name, datatype, shape and bytes. Unloading a model removes its
//! entries at once.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use sheaf_backend::Tensor;

/// Bytes an entry is charged beyond its tensors' data: its key, shapes and bookkeeping.
const ENTRY_OVERHEAD: usize = 128;

/// A number for each model load, never reused in this process.
static LOADS: AtomicU64 = AtomicU64::new(1);

/// A fresh load number (see [`ResponseCache::key`]).
pub fn next_load() -> u64 {
    LOADS.fetch_add(1, Ordering::Relaxed)
}

/// One cached answer.
struct Entry {
    load: u64,
    outputs: Vec<Tensor>,
    bytes: usize,
}

struct Inner {
    entries: lru::LruCache<u128, Entry>,
    used: usize,
}

/// The server's response cache.
pub struct ResponseCache {
    inner: Mutex<Inner>,
    capacity: usize,
    keys: (RandomState, RandomState),
}

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("capacity", &self.capacity)
            .field("used", &self.used())
            .finish()
    }
}

impl ResponseCache {
    /// A cache of at most `capacity` bytes.
    pub fn new(capacity: usize) -> ResponseCache {
        ResponseCache {
            inner: Mutex::new(Inner {
                entries: lru::LruCache::unbounded(),
                used: 0,
            }),
            capacity,
            keys: (RandomState::new(), RandomState::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key of a request to the model load `load`: its inputs, named, in signature order,
    /// and which outputs it reads where it reads only some (an answer cached for one set
    /// holds empty placeholders for the others: see [`crate::batcher::Admission::reads`]).
    pub fn key<'a>(
        &self,
        load: u64,
        inputs: impl Iterator<Item = (&'a str, &'a Tensor)>,
        reads: Option<&[bool]>,
    ) -> u128 {
        let mut a = self.keys.0.build_hasher();
        let mut b = self.keys.1.build_hasher();
        load.hash(&mut a);
        load.hash(&mut b);
        reads.hash(&mut a);
        reads.hash(&mut b);
        for (name, tensor) in inputs {
            for h in [&mut a, &mut b] {
                name.hash(h);
                tensor.dtype().as_str().hash(h);
                tensor.shape().hash(h);
                tensor.data().hash(h);
            }
        }
        (u128::from(a.finish()) << 64) | u128::from(b.finish())
    }

    /// The answer cached under `key`, now the most recently used.
    pub fn get(&self, key: u128) -> Option<Vec<Tensor>> {
        self.lock().entries.get(&key).map(|e| e.outputs.clone())
    }

    /// Caches `outputs` under `key` for the model load `load`, evicting the least recently used
    /// answers to make room. An answer larger than the whole cache is not kept.
    pub fn put(&self, key: u128, load: u64, outputs: Vec<Tensor>) {
        let bytes = ENTRY_OVERHEAD + outputs.iter().map(|t| t.data().len()).sum::<usize>();
        if bytes > self.capacity {
            return;
        }
        let mut inner = self.lock();
        if let Some(old) = inner.entries.pop(&key) {
            inner.used -= old.bytes;
        }
        while inner.used + bytes > self.capacity {
            match inner.entries.pop_lru() {
                Some((_, old)) => inner.used -= old.bytes,
                None => break,
            }
        }
        inner.used += bytes;
        inner.entries.put(
            key,
            Entry {
                load,
                outputs,
                bytes,
            },
        );
    }

    /// Removes every answer of the model load `load`.
    pub fn purge(&self, load: u64) {
        let mut inner = self.lock();
        let keys: Vec<u128> = inner
            .entries
            .iter()
            .filter(|(_, e)| e.load == load)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Some(old) = inner.entries.pop(&key) {
                inner.used -= old.bytes;
            }
        }
    }

    /// Bytes the cached answers are charged.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    /// Answers cached now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most bytes the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A model load's place in the cache.
#[derive(Debug, Clone)]
pub struct CacheSlot {
    pub cache: std::sync::Arc<ResponseCache>,
    pub load: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sheaf_backend::DataType;

    fn tensor(values: &[f32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DataType::F32, vec![1, values.len()], Bytes::from(data)).unwrap()
    }

    #[test]
    fn the_key_covers_the_load_and_every_input_name_type_shape_and_byte() {
        let cache = ResponseCache::new(1 << 20);
        let x = tensor(&[1.0, 2.0]);
        let key = |load, name: &str, t: &Tensor| cache.key(load, [(name, t)].into_iter(), None);
        let base = key(1, "x", &x);
        assert_eq!(base, key(1, "x", &tensor(&[1.0, 2.0])));
        assert_ne!(base, key(2, "x", &x), "another load");
        assert_ne!(base, key(1, "y", &x), "another input name");
        assert_ne!(base, key(1, "x", &tensor(&[1.0, 2.5])), "other bytes");
        let reshaped = Tensor::new(DataType::F32, vec![2, 1], x.data().clone()).unwrap();
        assert_ne!(base, key(1, "x", &reshaped), "another shape");
        let retyped = Tensor::new(DataType::I32, vec![1, 2], x.data().clone()).unwrap();
        assert_ne!(base, key(1, "x", &retyped), "another datatype");
        let reading = |reads: &[bool]| cache.key(1, [("x", &x)].into_iter(), Some(reads));
        assert_ne!(base, reading(&[true, false]), "some outputs");
        assert_ne!(reading(&[true, false]), reading(&[false, true]), "others");
    }

    #[test]
    fn least_recently_used_answers_go_first_and_the_size_holds() {
        // Room for two answers of 4 floats.
        let cache = ResponseCache::new(2 * (ENTRY_OVERHEAD + 16));
        let answer = |v: f32| vec![tensor(&[v; 4])];
        cache.put(1, 7, answer(1.0));
        cache.put(2, 7, answer(2.0));
        assert!(cache.get(1).is_some(), "1 is now the most recently used");
        cache.put(3, 7, answer(3.0));
        assert!(cache.get(2).is_none(), "2 was the least recently used");
        assert_eq!(cache.get(1).unwrap()[0].data(), answer(1.0)[0].data());
        assert!(cache.get(3).is_some());
        assert!(cache.used() <= cache.capacity());
        assert_eq!(cache.len(), 2);
        // Larger than the whole cache: not kept, and nothing evicted for it.
        cache.put(4, 7, vec![tensor(&[0.0; 1024])]);
        assert!(cache.get(4).is_none());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn purge_removes_one_load_only() {
        let cache = ResponseCache::new(1 << 20);
        cache.put(1, 7, vec![tensor(&[1.0])]);
        cache.put(2, 8, vec![tensor(&[2.0])]);
        cache.purge(7);
        assert!(cache.get(1).is_none());
        assert!(cache.get(2).is_some());
        assert_eq!(cache.used(), ENTRY_OVERHEAD + 4);
    }
}
