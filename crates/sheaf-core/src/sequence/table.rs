//! The open sequences of one model: which instance (and, under `direct`, which batch row)
//! each holds, its state, when it was last heard from, and why a closed one closed.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sheaf_backend::Tensor;

use crate::request::SequenceId;
use crate::InferError;

/// How many closed sequences are remembered, so that a late request hears why its sequence is
/// gone.
const REMEMBERED: usize = 4096;

/// Why a sequence is no longer open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Its last request carried `sequence_end`.
    Ended,
    /// It sent nothing for `max_sequence_idle_us`.
    Idle,
}

/// One open sequence.
pub struct Seq {
    /// The lane (one instance) that runs its requests.
    pub lane: usize,
    /// Its batch row on that instance (`direct`); 0 under `oldest`.
    pub slot: usize,
    /// Held by the request being run: the sequence's requests run one at a time, in the order
    /// they arrived (the lock is fair).
    pub step: tokio::sync::Mutex<Step>,
    last: Mutex<Instant>,
}

/// What a sequence carries between its requests.
pub struct Step {
    /// Its implicit states, in the order of the model's `states`.
    pub state: Vec<Tensor>,
    /// Set when the sequence closed while a request waited for its turn.
    pub closed: Option<Closed>,
}

impl Seq {
    /// Marks the sequence as heard from now.
    pub fn touch(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        self.last.lock().map(|l| l.elapsed()).unwrap_or_default()
    }
}

/// The table of a model's open sequences.
pub struct Table {
    inner: Mutex<Inner>,
    /// Sequences each lane may hold at once.
    per_lane: usize,
    idle: Duration,
    model: String,
}

struct Inner {
    open: HashMap<SequenceId, Arc<Seq>>,
    /// Per lane: its free rows, the lowest last (so that `pop` takes the lowest).
    free: Vec<Vec<usize>>,
    closed: lru::LruCache<SequenceId, Closed>,
}

impl Table {
    pub fn new(model: &str, lanes: usize, per_lane: usize, idle: Duration) -> Table {
        Table {
            inner: Mutex::new(Inner {
                open: HashMap::new(),
                free: (0..lanes).map(|_| (0..per_lane).rev().collect()).collect(),
                closed: lru::LruCache::new(
                    NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN),
                ),
            }),
            per_lane,
            idle,
            model: model.to_string(),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, InferError> {
        self.inner
            .lock()
            .map_err(|_| InferError::internal("the sequence table was poisoned"))
    }

    /// The sequence a request belongs to: opened now, on the lane with the most free rows,
    /// when the request starts it (with `initial` as its state); else the open one.
    pub fn open(
        &self,
        id: &SequenceId,
        start: bool,
        initial: impl FnOnce() -> Vec<Tensor>,
    ) -> Result<Arc<Seq>, InferError> {
        let mut inner = self.lock()?;
        if !start {
            return match inner.open.get(id) {
                Some(seq) => {
                    seq.touch();
                    Ok(seq.clone())
                }
                None => {
                    let why = inner.closed.get(id).copied();
                    Err(self.gone(id, why))
                }
            };
        }
        if inner.open.contains_key(id) {
            return Err(InferError::invalid(format!(
                "sequence {id} of model '{}' is already open: a second sequence_start needs \
                 the first sequence ended first (sequence_end), or a new sequence_id",
                self.model
            )));
        }
        let lanes = inner.free.len();
        let Some(lane) = (0..lanes)
            .filter(|&l| !inner.free[l].is_empty())
            .max_by_key(|&l| (inner.free[l].len(), std::cmp::Reverse(l)))
        else {
            return Err(InferError::new(
                crate::ErrorKind::Overloaded,
                format!(
                "model '{}' holds {} sequences, as many as it has room for ({lanes} instance(s) \
                 x {}): end a sequence, or retry later",
                self.model,
                lanes * self.per_lane,
                self.per_lane
            ),
            ));
        };
        let slot = inner.free[lane].pop().unwrap_or_default();
        let seq = Arc::new(Seq {
            lane,
            slot,
            step: tokio::sync::Mutex::new(Step {
                state: initial(),
                closed: None,
            }),
            last: Mutex::new(Instant::now()),
        });
        inner.closed.pop(id);
        inner.open.insert(id.clone(), seq.clone());
        Ok(seq)
    }

    /// Closes `seq` (still open under `id`): its row is free again, and its id remembered.
    pub fn close(&self, id: &SequenceId, seq: &Arc<Seq>, why: Closed) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.open.get(id).is_some_and(|s| Arc::ptr_eq(s, seq)) {
            inner.open.remove(id);
            inner.free[seq.lane].push(seq.slot);
            inner.free[seq.lane].sort_unstable_by(|a, b| b.cmp(a));
            inner.closed.put(id.clone(), why);
        }
    }

    /// Closes every sequence idle past the timeout whose turn is free (one whose request is
    /// running is not idle). Returns how many closed.
    pub fn sweep(&self) -> usize {
        let stale: Vec<(SequenceId, Arc<Seq>)> = match self.inner.lock() {
            Ok(inner) => inner
                .open
                .iter()
                .filter(|(_, s)| s.idle_for() > self.idle)
                .map(|(id, s)| (id.clone(), s.clone()))
                .collect(),
            Err(_) => return 0,
        };
        let mut closed = 0;
        for (id, seq) in stale {
            if let Ok(mut step) = seq.step.try_lock() {
                // Heard from since it was picked out: still open.
                if seq.idle_for() <= self.idle {
                    continue;
                }
                step.closed = Some(Closed::Idle);
                step.state.clear();
                self.close(&id, &seq, Closed::Idle);
                closed += 1;
            }
        }
        closed
    }

    /// Sequences open now, per lane.
    pub fn open_on(&self, lane: usize) -> usize {
        self.inner
            .lock()
            .map(|i| self.per_lane - i.free.get(lane).map_or(0, Vec::len))
            .unwrap_or(0)
    }

    /// Whether sequence `id` is open.
    pub fn is_open(&self, id: &SequenceId) -> bool {
        self.lock().is_ok_and(|inner| inner.open.contains_key(id))
    }

    /// Sequences open now.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.open.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The error for a request of a sequence that is not open.
    pub fn gone(&self, id: &SequenceId, why: Option<Closed>) -> InferError {
        let model = &self.model;
        InferError::invalid(match why {
            Some(Closed::Ended) => format!(
                "sequence {id} of model '{model}' has ended (its sequence_end was sent); start a \
                 new one with sequence_start"
            ),
            Some(Closed::Idle) => format!(
                "sequence {id} of model '{model}' was closed after {} ms without a request \
                 (max_sequence_idle_us); start it again with sequence_start",
                self.idle.as_millis()
            ),
            None => format!(
                "sequence {id} of model '{model}' is not open: its first request must carry \
                 sequence_start"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> SequenceId {
        SequenceId::Number(n)
    }

    #[test]
    fn sequences_spread_over_lanes_and_rows_come_back() {
        let t = Table::new("m", 2, 2, Duration::from_secs(60));
        let a = t.open(&id(1), true, Vec::new).unwrap();
        let b = t.open(&id(2), true, Vec::new).unwrap();
        assert_ne!(a.lane, b.lane);
        let c = t.open(&id(3), true, Vec::new).unwrap();
        let d = t.open(&id(4), true, Vec::new).unwrap();
        let mut rows: Vec<_> = [&a, &b, &c, &d].iter().map(|s| (s.lane, s.slot)).collect();
        rows.sort_unstable();
        assert_eq!(rows, vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        let full = t.open(&id(5), true, Vec::new).err().unwrap();
        assert_eq!(full.kind, crate::ErrorKind::Overloaded);
        t.close(&id(1), &a, Closed::Ended);
        let e = t.open(&id(5), true, Vec::new).unwrap();
        assert_eq!((e.lane, e.slot), (a.lane, a.slot));
        let again = t.open(&id(1), false, Vec::new).err().unwrap();
        assert!(again.message.contains("has ended"), "{}", again.message);
        let twice = t.open(&id(5), true, Vec::new).err().unwrap();
        assert!(twice.message.contains("already open"), "{}", twice.message);
        let never = t.open(&id(9), false, Vec::new).err().unwrap();
        assert!(never.message.contains("not open"), "{}", never.message);
    }

    #[test]
    fn idle_sequences_close_unless_their_request_runs() {
        let t = Table::new("m", 1, 4, Duration::from_millis(20));
        let idle = t.open(&id(1), true, Vec::new).unwrap();
        let busy = t.open(&id(2), true, Vec::new).unwrap();
        let running = busy.step.try_lock().unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(t.sweep(), 1);
        assert_eq!(idle.step.try_lock().unwrap().closed, Some(Closed::Idle));
        let e = t.open(&id(1), false, Vec::new).err().unwrap();
        assert!(e.message.contains("without a request"), "{}", e.message);
        drop(running);
        assert!(t.open(&id(2), false, Vec::new).is_ok());
        assert_eq!(t.len(), 1);
    }
}
