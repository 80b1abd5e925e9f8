//! Triton's rate limiter (`--rate-limit execution_count`): an execution instance whose model
//! declares resources (an `instance_group`'s `rate_limiter`, or `rate_limiter` in
//! `config.yaml`) runs a batch only while it holds them, so that models sharing a device run
//! no more at once than the device takes.
//!
//! - A resource is per device (each device has its own copies) unless it is `global` (one set
//!   of copies for the server). An instance takes its resources on its own device.
//! - How many copies there are: what `--rate-limit-resource NAME:COUNT[:DEVICE]` says (a
//!   device-less count holds for every device; `DEVICE` is a GPU's number), else the most that
//!   any registered instance needs, so that every instance can run. An instance that needs
//!   more than the given count fails to load, in Triton's words.
//! - An instance takes all its resources at once or waits, never holding some while it waits
//!   for others. Among the instances waiting whose resources are free, the one that has run the
//!   least, weighted by its `priority`, goes first (stride scheduling): an instance of priority
//!   2 gets half the turns of one of priority 1 (0 counts as 1).
//!
//! Instances wait on their own threads (a batch in hand), so the wait is the batch's, between
//! its assembly and its start, and shows in the statistics as the batch's wait.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde::Deserialize;

/// What one instance needs to run a batch (Triton's `rate_limiter`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimiterConfig {
    pub resources: Vec<ResourceNeed>,
    /// The instance's weight among those waiting: priority 2 gets half the turns of 1.
    pub priority: u32,
}

/// `count` copies of the resource `name`, on the instance's device unless `global`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceNeed {
    pub name: String,
    pub count: usize,
    #[serde(default)]
    pub global: bool,
}

/// A count the server is given: `--rate-limit-resource NAME:COUNT[:DEVICE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceCount {
    /// In lower case: Triton's flag is case-insensitive.
    pub name: String,
    pub count: usize,
    /// A GPU's number; `None`: every device (and a global resource's count).
    pub device: Option<usize>,
}

impl FromStr for ResourceCount {
    type Err = String;

    fn from_str(s: &str) -> Result<ResourceCount, String> {
        let bad = || {
            format!(
                "--rate-limit-resource '{s}': give NAME:COUNT or NAME:COUNT:DEVICE (a GPU's \
                 number), for instance R1:4 or R1:4:0"
            )
        };
        let parts: Vec<&str> = s.split(':').collect();
        let (name, count, device) = match parts.as_slice() {
            [name, count] => (name, count, None),
            [name, count, device] => (name, count, Some(device)),
            _ => return Err(bad()),
        };
        if name.trim().is_empty() {
            return Err(bad());
        }
        Ok(ResourceCount {
            name: name.trim().to_ascii_lowercase(),
            count: count.trim().parse().map_err(|_| bad())?,
            device: device
                .map(|d| d.trim().parse())
                .transpose()
                .map_err(|_| bad())?,
        })
    }
}

/// A resource's copies: its name, and its device (`None`: global).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    name: String,
    device: Option<String>,
}

/// The server's resources and the instances that take them.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    given: Vec<ResourceCount>,
    instances: HashMap<u64, Registered>,
    next_id: u64,
    used: HashMap<Key, usize>,
    /// The instances waiting for their resources.
    waiting: Vec<u64>,
}

#[derive(Debug)]
struct Registered {
    needs: Vec<(Key, usize)>,
    /// What a turn adds to `pass`: the priority, at least 1.
    stride: u64,
    /// The turns taken, weighted: the least goes first.
    pass: u64,
}

impl State {
    /// The copies of `key`: the given count, else the most a registered instance needs.
    fn available(&self, key: &Key) -> usize {
        if let Some(count) = self.given_count(key) {
            return count;
        }
        self.instances
            .values()
            .flat_map(|r| &r.needs)
            .filter(|(k, _)| k == key)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// A count given for `key`: for a GPU, its own count first, then one for every device.
    fn given_count(&self, key: &Key) -> Option<usize> {
        let named = |c: &&ResourceCount| c.name == key.name;
        let gpu = key
            .device
            .as_deref()
            .and_then(|d| d.strip_prefix("cuda:"))
            .and_then(|n| n.parse::<usize>().ok());
        let own = match (&key.device, gpu) {
            (Some(_), Some(gpu)) => self
                .given
                .iter()
                .filter(named)
                .find(|c| c.device == Some(gpu)),
            _ => None,
        };
        let everywhere = || self.given.iter().filter(named).find(|c| c.device.is_none());
        // A global resource takes any count given for it (Triton ignores the device there).
        let global = || match key.device {
            None => self.given.iter().find(|c| c.name == key.name),
            Some(_) => None,
        };
        own.or_else(everywhere).or_else(global).map(|c| c.count)
    }

    fn fits(&self, id: u64) -> bool {
        self.instances.get(&id).is_some_and(|r| {
            r.needs
                .iter()
                .all(|(key, n)| self.used.get(key).copied().unwrap_or(0) + n <= self.available(key))
        })
    }

    /// The waiting instance that goes next: of those whose resources are free, the one with
    /// the least pass (the earliest registered among equals).
    fn next(&self) -> Option<u64> {
        self.waiting
            .iter()
            .copied()
            .filter(|&id| self.fits(id))
            .min_by_key(|id| (self.instances.get(id).map_or(u64::MAX, |r| r.pass), *id))
    }
}

impl RateLimiter {
    /// A rate limiter with the counts of `--rate-limit-resource`.
    pub fn new(given: Vec<ResourceCount>) -> RateLimiter {
        RateLimiter {
            state: Mutex::new(State {
                given,
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers an instance on `device` that needs `config`'s resources; an error when a
    /// given count is below what it needs (Triton's words), or `None` when it needs none.
    pub fn register(
        self: &Arc<Self>,
        config: &RateLimiterConfig,
        device: &str,
    ) -> Result<Option<Slot>, String> {
        let mut needs: Vec<(Key, usize)> = Vec::new();
        for need in config.resources.iter().filter(|n| n.count > 0) {
            let key = Key {
                name: need.name.to_ascii_lowercase(),
                device: (!need.global).then(|| device.to_string()),
            };
            match needs.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += need.count,
                None => needs.push((key, need.count)),
            }
        }
        if needs.is_empty() {
            return Ok(None);
        }
        let mut state = self.lock();
        for (key, n) in &needs {
            if let Some(given) = state.given_count(key).filter(|given| given < n) {
                return Err(format!(
                    "Resource count for \"{}\" is limited to {given} which will prevent \
                     scheduling of one or more model instances, the minimum required count is \
                     {n} (--rate-limit-resource)",
                    key.name
                ));
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        // A newcomer starts level with the instances already there, not ahead of them all.
        let pass = state.instances.values().map(|r| r.pass).min().unwrap_or(0);
        let stride = u64::from(config.priority.max(1));
        state.instances.insert(
            id,
            Registered {
                needs,
                stride,
                pass,
            },
        );
        Ok(Some(Slot {
            limiter: self.clone(),
            id,
        }))
    }
}

/// An instance's place in the rate limiter, held while it is loaded.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<RateLimiter>,
    id: u64,
}

impl Slot {
    /// Waits until the instance's turn comes with its resources free, and takes them until
    /// the returned grant drops.
    pub fn acquire(&self) -> Grant<'_> {
        let limiter = &self.limiter;
        let mut state = limiter.lock();
        // An instance that was idle starts level with those waiting, not ahead of them.
        let level = state
            .waiting
            .iter()
            .filter_map(|id| state.instances.get(id).map(|r| r.pass))
            .min();
        if let (Some(level), Some(me)) = (level, state.instances.get_mut(&self.id)) {
            me.pass = me.pass.max(level);
        }
        state.waiting.push(self.id);
        loop {
            if state.next() == Some(self.id) {
                state.waiting.retain(|&id| id != self.id);
                let needs = match state.instances.get_mut(&self.id) {
                    Some(me) => {
                        me.pass += me.stride;
                        me.needs.clone()
                    }
                    None => Vec::new(),
                };
                for (key, n) in &needs {
                    *state.used.entry(key.clone()).or_insert(0) += n;
                }
                drop(state);
                // Another waiting instance may fit beside this one.
                limiter.changed.notify_all();
                return Grant { slot: self, needs };
            }
            state = limiter
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        state.instances.remove(&self.id);
        state.waiting.retain(|&id| id != self.id);
        drop(state);
        // The default counts may have changed, and who goes next with them.
        self.limiter.changed.notify_all();
    }
}

/// The resources an instance holds while it runs a batch.
#[derive(Debug)]
pub struct Grant<'a> {
    slot: &'a Slot,
    needs: Vec<(Key, usize)>,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        let limiter = &self.slot.limiter;
        let mut state = limiter.lock();
        for (key, n) in &self.needs {
            if let Some(used) = state.used.get_mut(key) {
                *used = used.saturating_sub(*n);
            }
        }
        drop(state);
        limiter.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn needs(resources: &[(&str, usize, bool)], priority: u32) -> RateLimiterConfig {
        RateLimiterConfig {
            resources: resources
                .iter()
                .map(|&(name, count, global)| ResourceNeed {
                    name: name.into(),
                    count,
                    global,
                })
                .collect(),
            priority,
        }
    }

    /// The slot of an instance on `device` that needs `resources`.
    fn slot(
        limiter: &Arc<RateLimiter>,
        resources: &[(&str, usize, bool)],
        priority: u32,
        device: &str,
    ) -> Slot {
        limiter
            .register(&needs(resources, priority), device)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn flags_parse_with_and_without_a_device() {
        assert_eq!(
            "R1:4".parse::<ResourceCount>(),
            Ok(ResourceCount {
                name: "r1".into(),
                count: 4,
                device: None
            })
        );
        assert_eq!(
            "R2:8:1".parse::<ResourceCount>().map(|c| c.device),
            Ok(Some(1))
        );
        for bad in ["R1", "R1:x", ":4", "R1:4:0:1", "R1:4:gpu"] {
            let err = bad.parse::<ResourceCount>().unwrap_err();
            assert!(err.contains("NAME:COUNT"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_config_yaml_declares_the_same_as_a_config_pbtxt() {
        let config: crate::ModelConfig = serde_yaml::from_str(
            "rate_limiter: {resources: [{name: R1, count: 2}, {name: R2, count: 1, global: true}], priority: 3}",
        )
        .unwrap();
        assert_eq!(
            config.rate_limiter,
            Some(needs(&[("R1", 2, false), ("R2", 1, true)], 3))
        );
        let typo = serde_yaml::from_str::<crate::ModelConfig>(
            "rate_limiter: {resources: [{name: R1, cuont: 2}]}",
        );
        assert!(typo.is_err());
    }

    #[test]
    fn an_instance_without_resources_takes_no_slot() {
        let limiter = Arc::new(RateLimiter::new(Vec::new()));
        assert!(limiter
            .register(&RateLimiterConfig::default(), "cpu")
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_given_count_below_a_need_fails_the_load_in_tritons_words() {
        let limiter = Arc::new(RateLimiter::new(vec!["r1:1".parse().unwrap()]));
        let err = limiter
            .register(&needs(&[("R1", 4, false)], 0), "cuda:0")
            .unwrap_err();
        assert!(
            err.contains(
                "Resource count for \"r1\" is limited to 1 which will prevent \
                 scheduling of one or more model instances, the minimum required count is 4"
            ),
            "{err}"
        );
    }

    #[test]
    fn by_default_there_are_as_many_copies_as_the_greediest_instance_needs() {
        let limiter = Arc::new(RateLimiter::new(Vec::new()));
        let a = slot(&limiter, &[("r1", 4, false)], 0, "cpu");
        let c = slot(&limiter, &[("r1", 1, false)], 0, "cpu");
        let state = limiter.lock();
        let key = Key {
            name: "r1".into(),
            device: Some("cpu".into()),
        };
        assert_eq!(state.available(&key), 4);
        drop(state);
        // C's one copy fits beside nothing but itself once A holds all four.
        let held = a.acquire();
        assert!(!limiter.lock().fits(c.id));
        drop(held);
        assert!(limiter.lock().fits(c.id));
    }

    #[test]
    fn per_device_copies_are_apart_and_global_ones_shared() {
        let limiter = Arc::new(RateLimiter::new(vec![
            "r:1".parse().unwrap(),
            "r:2:1".parse().unwrap(),
            "g:1".parse().unwrap(),
        ]));
        let on = |device: &str, global: bool| {
            limiter
                .register(
                    &needs(&[(if global { "g" } else { "r" }, 1, global)], 0),
                    device,
                )
                .unwrap()
                .unwrap()
        };
        let (gpu0, gpu1a, gpu1b, gpu1c) = (
            on("cuda:0", false),
            on("cuda:1", false),
            on("cuda:1", false),
            on("cuda:1", false),
        );
        let _a = gpu0.acquire();
        // cuda:1 has two copies of its own.
        let _b = gpu1a.acquire();
        let _c = gpu1b.acquire();
        assert!(!limiter.lock().fits(gpu1c.id));
        let (g0, g1) = (on("cuda:0", true), on("cuda:1", true));
        let _g = g0.acquire();
        assert!(
            !limiter.lock().fits(g1.id),
            "one global copy for every device"
        );
    }

    #[test]
    fn instances_that_share_one_copy_never_run_at_once() {
        let limiter = Arc::new(RateLimiter::new(Vec::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let slot = slot(&limiter, &[("r", 1, false)], 0, "cpu");
                let (running, most) = (running.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let _grant = slot.acquire();
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(200));
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn priority_two_gets_half_the_turns_of_priority_one() {
        let limiter = Arc::new(RateLimiter::new(Vec::new()));
        let one = slot(&limiter, &[("r", 1, false)], 1, "cpu");
        let two = slot(&limiter, &[("r", 1, false)], 2, "cpu");
        // Both always waiting: replay the choices the limiter makes between them.
        let mut turns = [0usize; 2];
        for _ in 0..300 {
            let mut state = limiter.lock();
            state.waiting = vec![one.id, two.id];
            let next = state.next().unwrap();
            let me = state.instances.get_mut(&next).unwrap();
            me.pass += me.stride;
            turns[usize::from(next == two.id)] += 1;
        }
        assert_eq!(turns, [200, 100]);
    }

    #[test]
    fn an_unregistered_instance_leaves_the_default_count_to_the_others() {
        let limiter = Arc::new(RateLimiter::new(Vec::new()));
        let big = slot(&limiter, &[("r", 3, false)], 0, "cpu");
        let small = slot(&limiter, &[("r", 1, false)], 0, "cpu");
        let key = Key {
            name: "r".into(),
            device: Some("cpu".into()),
        };
        assert_eq!(limiter.lock().available(&key), 3);
        drop(big);
        assert_eq!(limiter.lock().available(&key), 1);
        let _held = small.acquire();
    }
}
