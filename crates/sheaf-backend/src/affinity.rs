//! Which CPU cores a thread may run on.
//!
//! An execution instance may be pinned to cores of its own (`instance_cpus` in a model's
//! config) and the server's protocol threads to others (`sheaf serve --io-cpus`), so that an
//! instance wakes for its next batch on the core whose caches hold its model, and no protocol
//! work is scheduled there in between. Threads and processes started by a pinned thread inherit
//! its cores: ONNX Runtime's intra-op threads, and a Python model's process.
//!
//! A thread started by a protocol thread inherits the protocol cores too, so an instance or an
//! engine thread that is given no cores of its own calls [`unpin_current_thread`], which puts
//! it back on the cores the process started with ([`remember_startup_cpus`]).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// A set of CPU cores, written as Linux writes them: `0-3,8,10-11`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CpuList(Vec<usize>);

/// Most cores a [`CpuList`] may name (the kernel's `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 1024;

impl CpuList {
    /// The cores, ascending.
    pub fn cores(&self) -> &[usize] {
        &self.0
    }
}

impl FromStr for CpuList {
    type Err = String;

    fn from_str(text: &str) -> Result<CpuList, String> {
        let bad = |why: &str| format!("cpu list '{text}': {why} (write it as 0-3,8,10-11)");
        let mut cores = Vec::new();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(bad("an empty entry"));
            }
            let (first, last) = part.split_once('-').unwrap_or((part, part));
            let parse = |n: &str| {
                n.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&c| c < MAX_CPUS)
                    .ok_or_else(|| {
                        bad(&format!(
                            "'{}' is not a core number below {MAX_CPUS}",
                            n.trim()
                        ))
                    })
            };
            let (first, last) = (parse(first)?, parse(last)?);
            if first > last {
                return Err(bad(&format!("the range {part} runs backwards")));
            }
            cores.extend(first..=last);
        }
        cores.sort_unstable();
        cores.dedup();
        Ok(CpuList(cores))
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &c in &self.0 {
            match ranges.last_mut() {
                Some((_, last)) if *last + 1 == c => *last = c,
                _ => ranges.push((c, c)),
            }
        }
        let parts: Vec<String> = ranges
            .iter()
            .map(|&(first, last)| match first == last {
                true => first.to_string(),
                false => format!("{first}-{last}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl<'de> serde::Deserialize<'de> for CpuList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CpuList, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Core(usize),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
            Raw::Core(c) => c.to_string().parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Runs the calling thread, and what it starts from now on, on `cpus` only.
pub fn pin_current_thread(cpus: &CpuList) -> Result<(), String> {
    set_current_thread(cpus.cores())
}

/// Puts the calling thread back on the cores the process started with, if
/// [`remember_startup_cpus`] was called; else leaves it as it is.
pub fn unpin_current_thread() -> Result<(), String> {
    match STARTUP.get() {
        Some(Some(cores)) => set_current_thread(cores),
        _ => Ok(()),
    }
}

/// Notes the cores the calling thread may run on, for [`unpin_current_thread`]. Call it once,
/// first thing in `main`, before any thread is pinned.
pub fn remember_startup_cpus() {
    STARTUP.get_or_init(current_thread_cores);
}

/// The cores the calling thread may run on; `None` where that cannot be read.
pub fn current_thread_cpus() -> Option<CpuList> {
    current_thread_cores().map(CpuList)
}

static STARTUP: OnceLock<Option<Vec<usize>>> = OnceLock::new();

#[cfg(target_os = "linux")]
fn set_current_thread(cores: &[usize]) -> Result<(), String> {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    for &c in cores {
        set.set(c)
            .map_err(|e| format!("core {c} cannot be named: {e}"))?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| {
        let list = CpuList(cores.to_vec());
        let allowed = STARTUP
            .get()
            .cloned()
            .flatten()
            .map_or_else(|| "unknown".to_string(), |c| CpuList(c).to_string());
        format!("cannot run on cores {list}: {e} (this process may use cores {allowed})")
    })
}

#[cfg(not(target_os = "linux"))]
fn set_current_thread(_cores: &[usize]) -> Result<(), String> {
    Err("pinning threads to cores is supported on Linux only".into())
}

#[cfg(target_os = "linux")]
fn current_thread_cores() -> Option<Vec<usize>> {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    let set = sched_getaffinity(Pid::from_raw(0)).ok()?;
    Some(
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
    )
}

#[cfg(not(target_os = "linux"))]
fn current_thread_cores() -> Option<Vec<usize>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_linux_writes_them_and_print_back() {
        let l: CpuList = "8, 0-3,10-11,2".parse().unwrap();
        assert_eq!(l.cores(), &[0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(l.to_string(), "0-3,8,10-11");
        assert_eq!("5".parse::<CpuList>().unwrap().to_string(), "5");
        assert_eq!("1,3,5".parse::<CpuList>().unwrap().to_string(), "1,3,5");
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        for (text, why) in [
            ("", "an empty entry"),
            ("1,,2", "an empty entry"),
            ("3-1", "runs backwards"),
            ("a", "'a' is not a core number"),
            ("0-99999", "'99999' is not a core number"),
        ] {
            let e = text.parse::<CpuList>().unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_thread_runs_on_its_cores_and_what_it_starts_inherits_them() {
        let all = current_thread_cpus().unwrap();
        let first = all.cores()[0];
        let one: CpuList = first.to_string().parse().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(&one).unwrap();
            let inner = std::thread::spawn(current_thread_cpus).join().unwrap();
            (current_thread_cpus(), inner)
        })
        .join()
        .unwrap();
        assert_eq!(seen.0.unwrap().cores(), &[first]);
        assert_eq!(seen.1.unwrap().cores(), &[first]);
        // The test thread itself is untouched.
        assert_eq!(current_thread_cpus().unwrap(), all);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn cores_the_process_may_not_use_are_a_clear_error() {
        let e = std::thread::spawn(|| pin_current_thread(&"1000".parse().unwrap()))
            .join()
            .unwrap()
            .unwrap_err();
        assert!(e.contains("cannot run on cores 1000"), "{e}");
    }
}
