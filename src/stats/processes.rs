//! A cgroup's process figures, as cAdvisor's libcontainer handler gets
//! them for its `container_processes`, `container_file_descriptors`,
//! `container_sockets`, `container_threads`, `container_threads_max` and
//! `container_ulimits_soft` families (`processStatsFromProcs`,
//! `setThreadsStats`).

use std::path::Path;

use super::cgroup::FileReader;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessSample {
    /// Processes in the cgroup itself (its `cgroup.procs`, not its
    /// children's: a pod cgroup on its own has none).
    pub processes: u64,
    /// Open descriptors of those processes, and how many are sockets.
    pub fds: u64,
    pub sockets: u64,
    /// Tasks in the cgroup and below, and their limit (0: none), from the
    /// pids controller.
    pub threads: u64,
    pub threads_max: u64,
    /// The lowest pid in the cgroup (see `max_open_files`).
    pub first_pid: Option<u32>,
    /// The soft `Max open files` limit of that process (-1: unlimited),
    /// read only for containers.
    pub max_open_files: Option<i64>,
}

/// Reads the processes of the cgroup whose `cgroup.procs` is in `procs_dir`
/// (the cpu controller's on v1, as cAdvisor takes it) and the pids
/// controller's figures in `pids_dir`. Every process's descriptors are
/// listed and each link read, as cAdvisor does, to count sockets. `v2`:
/// without a pids controller the processes are the thread count, as
/// libcontainer's cgroup v2 reader has it.
pub fn read(
    procs_dir: &Path,
    pids_dir: Option<&Path>,
    v2: bool,
    r: &mut FileReader,
) -> ProcessSample {
    let mut s = ProcessSample::default();
    let pids: Vec<u32> = r
        .whole(procs_dir, "cgroup.procs")
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default();
    s.processes = pids.len() as u64;
    s.first_pid = pids.iter().copied().min();
    let mut fd_dir = String::new();
    for pid in &pids {
        use std::fmt::Write;
        fd_dir.clear();
        let _ = write!(fd_dir, "/proc/{pid}/fd");
        // A process may exit between the list and here.
        let Ok(rd) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        for e in rd.flatten() {
            s.fds += 1;
            if std::fs::read_link(e.path())
                .is_ok_and(|l| l.as_os_str().as_encoded_bytes().starts_with(b"socket"))
            {
                s.sockets += 1;
            }
        }
    }
    if let Some(d) = pids_dir {
        match r.value(d, "pids.current").map(|t| t.trim().parse().ok()) {
            Some(current) => {
                s.threads = current.unwrap_or(0);
                // "max": no limit, which libcontainer reports as 0.
                s.threads_max = r
                    .value(d, "pids.max")
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
            }
            None if v2 => s.threads = s.processes,
            None => {}
        }
    }
    s
}

/// The soft `Max open files` limit in a `/proc/<pid>/limits` text, -1 for
/// unlimited (cAdvisor's `processLimitsFile`, the one limit it reports).
pub fn parse_max_open_files(text: &str) -> Option<i64> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // soft, hard, units
    if f.len() != 3 {
        return None;
    }
    match f[0] {
        v if v.eq_ignore_ascii_case("unlimited") => Some(-1),
        v => v.parse().ok(),
    }
}

/// Adds the open-files limit of the sample's first process: cAdvisor reads
/// the container's init process (the task pid the runtime reports); rkubelet
/// does not ask the runtime at scrape time and takes the lowest pid in the
/// cgroup, which is the init process unless pids wrapped.
pub fn add_limits(s: &mut ProcessSample, r: &mut FileReader) {
    if let Some(pid) = s.first_pid {
        s.max_open_files = r
            .whole_path(Path::new(&format!("/proc/{pid}/limits")))
            .and_then(parse_max_open_files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_with_this_process_counts_its_descriptors_and_sockets() {
        let root = crate::testutil::tempdir("procs");
        let me = std::process::id();
        std::fs::write(root.join("cgroup.procs"), format!("{me}\n")).unwrap();
        std::fs::write(root.join("pids.current"), "7\n").unwrap();
        std::fs::write(root.join("pids.max"), "max\n").unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut r = FileReader::new();
        let mut s = read(&root, Some(&root), false, &mut r);
        assert_eq!(s.processes, 1);
        assert_eq!(s.first_pid, Some(me));
        assert!(s.fds >= 4, "stdio and the socket: {}", s.fds);
        assert!(s.sockets >= 1);
        assert_eq!((s.threads, s.threads_max), (7, 0), "max is no limit");
        add_limits(&mut s, &mut r);
        let soft = s.max_open_files.expect("own limits");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let want = if lim.rlim_cur == libc::RLIM_INFINITY {
            -1
        } else {
            lim.rlim_cur as i64
        };
        assert_eq!(soft, want);
        drop(sock);
        std::fs::write(root.join("pids.max"), "100\n").unwrap();
        std::fs::write(root.join("cgroup.procs"), "").unwrap();
        let s = read(&root, Some(&root), false, &mut r);
        assert_eq!((s.processes, s.fds, s.threads_max), (0, 0, 100));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn the_open_files_limit_is_the_soft_one_and_unlimited_is_minus_one() {
        let t = "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max processes             63422                63422                processes\n\
                 Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_open_files(t), Some(1024));
        let u = "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_open_files(u), Some(-1));
        assert_eq!(
            parse_max_open_files("Max cpu time unlimited unlimited seconds\n"),
            None
        );
    }
}
