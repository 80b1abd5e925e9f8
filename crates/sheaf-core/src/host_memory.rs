//! How much RAM the server may still take: the host's (`/proc/meminfo`), and within a container
//! the room its memory limit leaves (the process's cgroup, v2 or v1), whichever is less. A
//! container sees the whole host in `/proc/meminfo`; its own limit is what the kernel enforces,
//! ending the process when it is passed.

/// The RAM available to this process now, in bytes: the host's `MemAvailable`, or less where
/// the process's cgroup limit leaves less room; none where neither can be read.
pub fn available_memory() -> Option<u64> {
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| host(&m))
        .map(|(total, used)| total - used);
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| cgroup_room(&c, &|path| std::fs::read_to_string(path).ok()));
    match (host, cgroup) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// Total and used RAM of the host in bytes (used: total less available), from `/proc/meminfo`.
pub(crate) fn host(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some((total, total.saturating_sub(available)))
}

/// Limits at or past this are no limit (cgroup v1 writes "no limit" as about 2^63).
const NO_LIMIT: u64 = 1 << 60;

/// The room the memory limit of the process's cgroup leaves, in bytes: the limit less what the
/// group uses, its inactive file pages aside (the kernel reclaims those before it ends a
/// process; Kubernetes calls the rest the working set). `cgroup` is `/proc/self/cgroup`;
/// `read` reads a file. The group's own folder is tried, then the mount's root (what a
/// container with its own cgroup namespace sees as its group); none without a limit.
fn cgroup_room(cgroup: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    // `0::/path` (v2), `N:memory:/path` or `N:...,memory,...:/path` (v1).
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|path| {
            (
                "/sys/fs/cgroup",
                path,
                "memory.max",
                "memory.current",
                "inactive_file",
            )
        });
    let v1 = cgroup
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':').skip(1);
            Some((parts.next()?, parts.next()?))
        })
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "memory"))
        .map(|(_, path)| {
            let (limit, usage) = ("memory.limit_in_bytes", "memory.usage_in_bytes");
            (
                "/sys/fs/cgroup/memory",
                path,
                limit,
                usage,
                "total_inactive_file",
            )
        });
    let number = |text: String| text.trim().parse::<u64>().ok();
    [v1, v2]
        .into_iter()
        .flatten()
        .find_map(|(mount, path, limit, usage, inactive)| {
            let path = path.trim_end_matches('/');
            [format!("{mount}{path}"), mount.to_string()]
                .iter()
                .find_map(|dir| {
                    let limit = read(&format!("{dir}/{limit}")).and_then(number)?;
                    let usage = read(&format!("{dir}/{usage}")).and_then(number)?;
                    let inactive = read(&format!("{dir}/memory.stat"))
                        .and_then(|stat| {
                            stat.lines()
                                .find_map(|l| l.strip_prefix(inactive)?.trim().parse::<u64>().ok())
                        })
                        .unwrap_or(0);
                    (limit < NO_LIMIT).then(|| limit.saturating_sub(usage.saturating_sub(inactive)))
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn files(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |path: &str| map.get(path).cloned()
    }

    #[test]
    fn the_host_s_memory_is_read_from_proc() {
        let meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n";
        assert_eq!(host(meminfo), Some((1_024_000, 614_400)));
        assert_eq!(host("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_container_s_limit_leaves_its_own_room() {
        // cgroup v2 inside a container's namespace: the group is the mount's root.
        let v2 = files(&[
            ("/sys/fs/cgroup/memory.max", "8000\n"),
            ("/sys/fs/cgroup/memory.current", "5000\n"),
            (
                "/sys/fs/cgroup/memory.stat",
                "anon 3000\nfile 2000\ninactive_file 1500\n",
            ),
        ]);
        assert_eq!(cgroup_room("0::/\n", &v2), Some(4500));
        // v2 without a limit.
        let open = files(&[
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/memory.current", "5000\n"),
        ]);
        assert_eq!(cgroup_room("0::/\n", &open), None);
        // cgroup v1, the group's own folder named in /proc/self/cgroup.
        let v1 = files(&[
            (
                "/sys/fs/cgroup/memory/pod/c1/memory.limit_in_bytes",
                "10000\n",
            ),
            (
                "/sys/fs/cgroup/memory/pod/c1/memory.usage_in_bytes",
                "7000\n",
            ),
            (
                "/sys/fs/cgroup/memory/pod/c1/memory.stat",
                "cache 3000\ntotal_inactive_file 1000\n",
            ),
        ]);
        let cgroup = "9:pids:/pod/c1\n4:memory:/pod/c1\n0::/\n";
        assert_eq!(cgroup_room(cgroup, &v1), Some(4000));
        // v1's "no limit" (about 2^63) is none.
        let unlimited = files(&[
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "7000\n"),
        ]);
        assert_eq!(cgroup_room("4:memory:/\n", &unlimited), None);
        // Nothing readable: none.
        assert_eq!(cgroup_room("0::/\n", &files(&[])), None);
    }
}
