//! Bookings that follow what loaded models hold once they serve.
//!
//! A model is booked at load at what its backend reports then. A framework's caching allocator
//! (PyTorch's on a GPU, a Python model's arrays on the CPU) grows with the first batches the
//! model runs, so its instances read what they hold again after some of their batches and
//! report growth ([`crate::ModelHandle::memory_held`]). Every [`TICK`] the manager books each
//! loaded model that holds more than its booking at what it holds, and evicts idle models (as
//! a load would) while the ledger's limits no longer hold. A model that serves is never dropped
//! for having grown: when nothing can be evicted it stays, booked at its real size, and the
//! next loads find the device full. A model's `memory_mb` is its booking, whatever it holds.
//! What a version grew to is remembered: its next load is reserved, and booked, at that from
//! the start, so that the room it will take is made before it loads, not after its first
//! batches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Entry, MemorySource, ModelManager, ModelStatus, MIB};
use crate::ModelHandle;

/// How often bookings are compared with what the models hold.
pub const TICK: Duration = Duration::from_secs(1);

impl ModelManager {
    /// Starts the task that books grown models at what they hold, every [`TICK`].
    pub fn spawn_memory_watch(self: &Arc<Self>) {
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                let Some(m) = manager.upgrade() else { return };
                m.rebook_grown();
            }
        });
    }

    /// Books each loaded model that holds more than its booking at what it holds, evicting
    /// idle models to keep the ledger's limits; returns the names of the models booked anew.
    pub fn rebook_grown(&self) -> Vec<String> {
        let grown: Vec<(String, u64)> = self
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(name, e)| grown_by(e).map(|held| (name.clone(), held)))
            .collect();
        let mut rebooked = Vec::with_capacity(grown.len());
        for (name, held) in grown {
            let evicted = {
                let mut models = self.write();
                self.rebook(&mut models, &name, held)
            };
            // Dropped after the lock: their batchers and instance threads end on their own.
            if let Some(evicted) = evicted {
                drop(evicted);
                rebooked.push(name);
            }
        }
        rebooked
    }

    /// Books `name` at `held` bytes per device; `None` if it changed meanwhile.
    fn rebook(
        &self,
        models: &mut BTreeMap<String, Entry>,
        name: &str,
        held: u64,
    ) -> Option<Vec<Arc<ModelHandle>>> {
        let entry = models.get_mut(name)?;
        if grown_by(entry) != Some(held) {
            return None;
        }
        let before = entry.reserved;
        let on = entry.devices.clone();
        let admitted = self.room_for(models, name, held, &on)?;
        let entry = models.get_mut(name)?;
        entry.reserved = held;
        entry.memory_source = MemorySource::Serving;
        entry.served = Some((entry.status.version().to_string(), held));
        match admitted {
            Ok(evicted) => {
                tracing::info!(
                    model = name,
                    before_mib = before / MIB,
                    now_mib = held / MIB,
                    evicted = evicted.len(),
                    "model grew as it served; booked at what it holds"
                );
                Some(evicted)
            }
            Err(e) => {
                tracing::warn!(
                    model = name,
                    before_mib = before / MIB,
                    now_mib = held / MIB,
                    reason = %e.message,
                    "model grew as it served past the memory limits; booked at what it holds"
                );
                Some(Vec::new())
            }
        }
    }
}

/// What a loaded model holds per device, when that is more than its booking and its booking
/// follows what was counted (not a configured `memory_mb`, nor an estimate). A model whose
/// backend counts nothing holds nothing by this count, and is not booked anew.
fn grown_by(entry: &Entry) -> Option<u64> {
    let ModelStatus::Ready(handle) = &entry.status else {
        return None;
    };
    let follows = matches!(
        entry.memory_source,
        MemorySource::Backend | MemorySource::Serving | MemorySource::Measured
    );
    let held = handle.memory_held();
    (follows && held > entry.reserved).then_some(held)
}
