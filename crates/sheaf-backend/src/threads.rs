//! The threads that own loaded models, so that a process can wait, before it exits, until every
//! one of them has dropped its model.
//!
//! A model's runtime (ONNX Runtime and its CUDA provider, llama.cpp) keeps process-wide state
//! that the C library tears down when `main` returns. A thread still freeing its model then
//! calls into a runtime that is gone, which on CUDA ended in SIGSEGV. So each model thread holds
//! a [`Registered`] guard, taken before it loads its model and dropped after the model is, and
//! the server waits on [`ModelThreads::wait_all`] after it has unloaded its models.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Live model threads, by name.
#[derive(Debug, Default)]
pub struct ModelThreads {
    live: Mutex<BTreeMap<u64, String>>,
    changed: Condvar,
    next: AtomicU64,
}

/// A model thread's place in [`ModelThreads`]; dropping it says the thread has let its model go.
#[must_use = "the thread counts as live only while the guard is held"]
#[derive(Debug)]
pub struct Registered {
    threads: &'static ModelThreads,
    id: u64,
}

impl ModelThreads {
    /// The process's model threads.
    pub fn process() -> &'static ModelThreads {
        static THREADS: OnceLock<ModelThreads> = OnceLock::new();
        THREADS.get_or_init(ModelThreads::default)
    }

    /// Counts the calling thread, named `name`, as live until the guard drops. Take it before
    /// the model exists, so that the model drops first.
    pub fn enter(&'static self, name: &str) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, name.to_string());
        Registered { threads: self, id }
    }

    /// The names of the live model threads.
    pub fn live(&self) -> Vec<String> {
        self.lock().values().cloned().collect()
    }

    /// Waits until no model thread is live, or `timeout` has passed; returns the names of the
    /// threads still live then (empty: all have ended).
    pub fn wait_all(&self, timeout: Duration) -> Vec<String> {
        let (live, _) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |live| !live.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        live.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, String>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.threads.lock().remove(&self.id);
        self.threads.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_every_thread_to_let_its_model_go() {
        let threads: &'static ModelThreads = Box::leak(Box::default());
        let (started_tx, started) = std::sync::mpsc::channel();
        let workers: Vec<_> = (0..3)
            .map(|i| {
                let started_tx = started_tx.clone();
                std::thread::spawn(move || {
                    let _registered = threads.enter(&format!("model-{i}"));
                    started_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(50 * (i + 1)));
                })
            })
            .collect();
        for _ in 0..3 {
            started.recv().unwrap();
        }
        assert_eq!(threads.live().len(), 3);
        // Too short a wait names the threads still live.
        let left = threads.wait_all(Duration::ZERO);
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(threads.wait_all(Duration::from_secs(30)).is_empty());
        assert!(threads.live().is_empty());
        workers.into_iter().for_each(|w| w.join().unwrap());
    }
}
