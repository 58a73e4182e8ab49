//! The host's memory left to this process: what a model's load is checked against, and what an engine checks
//! before it takes more while it serves.

use std::path::Path;

/// The host's memory left to this process: the kernel's estimate of what can be had without swapping, and the
/// room under the container's limit (cgroup v2 or v1) where there is one, whichever is less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    pub available: u64,
    /// The container's limit, where one is set.
    pub limit: Option<u64>,
}

impl HostMemory {
    /// Reads `/proc/meminfo` and the cgroup's files; `None` where the kernel says nothing.
    pub fn read() -> Option<HostMemory> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let available = meminfo_bytes(&meminfo, "MemAvailable:")?;
        let v2 = Path::new("/sys/fs/cgroup");
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let cgroup =
            cgroup_room(v2.join("memory.max"), v2.join("memory.current"), v2.join("memory.stat"), "inactive_file")
                .or_else(|| {
                    cgroup_room(
                        v1.join("memory.limit_in_bytes"),
                        v1.join("memory.usage_in_bytes"),
                        v1.join("memory.stat"),
                        "total_inactive_file",
                    )
                });
        Some(match cgroup {
            Some((limit, room)) => HostMemory { available: available.min(room), limit: Some(limit) },
            None => HostMemory { available, limit: None },
        })
    }
}

fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// A cgroup's limit and the room under it; `None` without a limit (`max`, or v1's huge number). The cgroup's usage
/// counts the page cache, model files read at load among them: what the kernel can reclaim at once (`inactive` in
/// `stat`, under `inactive_key`) is room, as the kubelet counts a container's working set.
fn cgroup_room(
    limit: impl AsRef<Path>,
    usage: impl AsRef<Path>,
    stat: impl AsRef<Path>,
    inactive_key: &str,
) -> Option<(u64, u64)> {
    let limit: u64 = std::fs::read_to_string(limit).ok()?.trim().parse().ok()?;
    if limit >= 1 << 60 {
        return None;
    }
    let usage: u64 = std::fs::read_to_string(usage).ok()?.trim().parse().ok()?;
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let reclaimable = stat
        .lines()
        .find_map(|line| line.strip_prefix(inactive_key)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some((limit, limit.saturating_sub(usage.saturating_sub(reclaimable))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_cgroup_files_are_read() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemAvailable:"), Some(2048 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "SwapTotal:"), None);
        let dir = tempfile::tempdir().expect("temp dir");
        let (limit, usage, stat) = (dir.path().join("max"), dir.path().join("current"), dir.path().join("stat"));
        let room = || cgroup_room(&limit, &usage, &stat, "inactive_file");
        std::fs::write(&limit, "1000\n").expect("write");
        std::fs::write(&usage, "300\n").expect("write");
        assert_eq!(room(), Some((1000, 700)), "no stat file: the usage as it is");
        // The page cache the kernel can drop at once is room; a key that only begins the same is not it.
        std::fs::write(&stat, "anon 100\ninactive_file_x 7\nactive_file 50\ninactive_file 120\n").expect("write");
        assert_eq!(room(), Some((1000, 820)));
        std::fs::write(&stat, "inactive_file 5000\n").expect("write");
        assert_eq!(room(), Some((1000, 1000)), "never more room than the limit");
        std::fs::write(&limit, "max\n").expect("write");
        assert_eq!(room(), None);
        std::fs::write(&limit, "9223372036854771712\n").expect("write");
        assert_eq!(room(), None);
        assert!(HostMemory::read().is_some_and(|h| h.available > 0));
    }
}
