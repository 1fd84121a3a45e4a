//! Node figures from /proc and file-system figures from statvfs (all
//! blocking; callers run them off the async threads).

use std::path::Path;

/// One interface's counters from `/proc/<pid>/net/dev`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// `/proc/net/dev`, without the interfaces cAdvisor ignores.
pub fn parse_net_dev(text: &str) -> Vec<Interface> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if is_ignored_interface(name) {
                return None;
            }
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() < 12 {
                return None;
            }
            Some(Interface {
                name: name.to_string(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect()
}

/// Interfaces cAdvisor leaves out everywhere (its `ignoredDevicePrefixes`
/// in `lib/container/libcontainer/handler.go`): host ends of container
/// links and the docker/nerdctl bridges.
pub fn is_ignored_interface(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["lo", "veth", "docker", "nerdctl"]
        .iter()
        .any(|p| n.starts_with(p))
}

/// `/proc/meminfo` in bytes: (MemTotal, MemFree, Inactive(file), SwapTotal, SwapFree).
pub fn parse_meminfo(text: &str) -> Meminfo {
    let mut m = Meminfo::default();
    for l in text.lines() {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        let b = kb * 1024;
        match k {
            "MemTotal" => m.total = b,
            "MemFree" => m.free = b,
            "Inactive(file)" => m.inactive_file = b,
            "SwapTotal" => m.swap_total = b,
            "SwapFree" => m.swap_free = b,
            _ => {}
        }
    }
    m
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Meminfo {
    pub total: u64,
    pub free: u64,
    pub inactive_file: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// Busy CPU time from the `cpu` line of `/proc/stat`, in nanoseconds
/// (user+nice+system+irq+softirq+steal; idle and iowait left out).
pub fn parse_proc_stat_busy_ns(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let ticks = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some(ticks * (1_000_000_000 / 100))
}

/// The number of processes (threads) from `/proc/loadavg`'s `running/total`.
pub fn parse_loadavg_procs(text: &str) -> Option<i64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// statvfs of the file system holding `path`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FsFigures {
    pub capacity: u64,
    pub available: u64,
    pub free: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

pub fn statvfs(path: &Path) -> Option<FsFigures> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is plain old data the
    // call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some(FsFigures {
        capacity: st.f_blocks as u64 * frsize,
        available: st.f_bavail as u64 * frsize,
        free: st.f_bfree as u64 * frsize,
        inodes: st.f_files as u64,
        inodes_free: st.f_ffree as u64,
    })
}

/// The source device of the mount holding `path`, from
/// `/proc/self/mountinfo` (cAdvisor's `device` label).
pub fn device_of(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let (Some(mp), Some(src)) = (pre.split(' ').nth(4), post.split(' ').nth(1)) else {
            continue;
        };
        if path.starts_with(mp) && best.as_ref().is_none_or(|(l, _)| mp.len() >= *l) {
            best = Some((mp.len(), src.to_string()));
        }
    }
    best.map(|(_, d)| d)
}

/// Boot time in Unix seconds (`btime` in /proc/stat).
pub fn parse_btime(text: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Bytes and inodes under a container's log directory: one readdir and a
/// stat per file (log files sit flat in the directory; no recursive walk).
pub fn dir_usage(dir: &Path) -> Option<(u64, u64)> {
    let rd = std::fs::read_dir(dir).ok()?;
    let (mut bytes, mut inodes) = (0u64, 1u64);
    for e in rd.flatten() {
        if let Ok(md) = e.metadata() {
            use std::os::unix::fs::MetadataExt;
            bytes += md.blocks() * 512;
            inodes += 1;
        }
    }
    Some((bytes, inodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_is_parsed_without_lo() {
        let t = "Inter-|   Receive                                                |  Transmit\n \
face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:  100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
eth0: 5000 10 1 2 0 0 0 0 7000 20 3 4 0 0 0 0\n";
        let v = parse_net_dev(t);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].name, "eth0");
        assert_eq!(
            (v[0].rx_bytes, v[0].rx_errors, v[0].rx_dropped),
            (5000, 1, 2)
        );
        assert_eq!(
            (v[0].tx_bytes, v[0].tx_packets, v[0].tx_errors),
            (7000, 20, 3)
        );
    }

    #[test]
    fn meminfo_stat_and_loadavg_are_parsed() {
        let m = parse_meminfo(
            "MemTotal: 100 kB\nMemFree: 40 kB\nInactive(file): 10 kB\nSwapTotal: 0 kB\n",
        );
        assert_eq!(m.total, 102400);
        assert_eq!(m.free, 40960);
        assert_eq!(m.inactive_file, 10240);
        let busy = parse_proc_stat_busy_ns("cpu  1 2 3 100 50 4 5 6 0 0\ncpu0 1 1 1 1 1 1 1 1\n");
        assert_eq!(busy, Some((1 + 2 + 3 + 4 + 5 + 6) * 10_000_000));
        assert_eq!(
            parse_loadavg_procs("0.10 0.20 0.30 2/345 6789\n"),
            Some(345)
        );
    }

    #[test]
    fn statvfs_of_root_has_capacity() {
        let f = statvfs(Path::new("/")).unwrap();
        assert!(f.capacity > 0 && f.capacity >= f.available);
    }
}
