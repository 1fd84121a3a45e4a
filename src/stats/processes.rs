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

/// How long a cgroup's process walk is reused: cAdvisor walks processes
/// once per housekeeping (the kubelet sets 10 s), so its figures are that
/// old at worst too. The walk reads every descriptor link of every process
/// (thousands on a node whose shims sit in the root cgroup), most of a
/// cAdvisor scrape's cost if done per scrape.
pub const WALK_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a process's socket count is reused while its number of open
/// descriptors stays the same. Reading every descriptor's link to find the
/// sockets was most of a walk (the shims in the root cgroup hold thousands:
/// 45 ms of a cAdvisor scrape at 110 pods, at every Prometheus scrape
/// 15 s apart); the count itself is one `stat` of `/proc/<pid>/fd`, whose
/// size the kernel reports as the number open (Linux 6.2 and later). A
/// process that closes a socket and opens a file in its place shows its
/// old socket count until its next count change or this age, when it is
/// read again.
pub const SOCKETS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a process's open-files limit is reused. The runtime sets a
/// container's limits when it starts the process and nothing in the
/// kubelet changes them; only a `prlimit` made behind its back shows up
/// late, as the cgroups' limit files do (`SPEC_MAX_AGE`). Reading it at
/// every walk opened a `/proc/<pid>/limits` per container each 10 s.
pub const LIMITS_MAX_AGE: std::time::Duration = super::cgroup::SPEC_MAX_AGE;

/// A process's descriptors as last listed: how many were open then (the
/// size of its fd directory) and how many were sockets.
#[derive(Debug, Clone, Copy)]
struct FdCount {
    at: std::time::Instant,
    fds: u64,
    sockets: u64,
}

/// Process walks by `cgroup.procs` directory, with when they were made.
#[derive(Debug, Default)]
pub struct WalkCache {
    walks: std::collections::HashMap<std::path::PathBuf, (std::time::Instant, ProcessSample)>,
    /// Open-files limits by pid.
    limits: std::collections::HashMap<u32, (std::time::Instant, Option<i64>)>,
    /// Socket counts by pid (see `SOCKETS_MAX_AGE`).
    fds: std::collections::HashMap<u32, FdCount>,
    /// Process counts by `cgroup.procs` directory, where no walk is made
    /// (the summary's figure).
    counts: std::collections::HashMap<std::path::PathBuf, (std::time::Instant, u64)>,
    /// Descriptor directories listed link by link (profiling and tests).
    pub listed: u64,
}

impl WalkCache {
    /// Drops walks too old to be served, so cgroups that went away are
    /// forgotten.
    pub fn sweep(&mut self) {
        self.walks.retain(|_, (at, _)| at.elapsed() < WALK_PERIOD);
        self.counts.retain(|_, (at, _)| at.elapsed() < WALK_PERIOD);
        self.limits
            .retain(|_, (at, _)| at.elapsed() < LIMITS_MAX_AGE);
        self.fds.retain(|_, c| c.at.elapsed() < SOCKETS_MAX_AGE);
    }
}

/// How many processes the cgroup whose `cgroup.procs` is in `procs_dir`
/// holds (cAdvisor's ProcessCount, which upstream's summary sums per pod):
/// a walk's count while it is fresh, else the file's lines, kept for
/// `WALK_PERIOD` as cAdvisor keeps a housekeeping's figures.
pub fn count(procs_dir: &Path, r: &mut FileReader) -> Option<u64> {
    let fresh = |at: &std::time::Instant| at.elapsed() < WALK_PERIOD;
    if let Some((_, s)) = r.walks.walks.get(procs_dir).filter(|(at, _)| fresh(at)) {
        return Some(s.processes);
    }
    if let Some((_, n)) = r.walks.counts.get(procs_dir).filter(|(at, _)| fresh(at)) {
        return Some(*n);
    }
    let n = r
        .warm_whole(procs_dir, "cgroup.procs")?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count() as u64;
    r.walks
        .counts
        .insert(procs_dir.to_path_buf(), (std::time::Instant::now(), n));
    Some(n)
}

/// Reads the processes of the cgroup whose `cgroup.procs` is in `procs_dir`
/// (the cpu controller's on v1, as cAdvisor takes it) and the pids
/// controller's figures in `pids_dir`. Every process's descriptors are
/// listed and each link read, as cAdvisor does, to count sockets; that walk
/// (and the open-files limit) is reused for `WALK_PERIOD`, the thread
/// figures are read each time. `v2`: without a pids controller the
/// processes are the thread count, as libcontainer's cgroup v2 reader has
/// it.
pub fn read(
    procs_dir: &Path,
    pids_dir: Option<&Path>,
    v2: bool,
    r: &mut FileReader,
) -> ProcessSample {
    let cached = r
        .walks
        .walks
        .get(procs_dir)
        .filter(|(at, _)| at.elapsed() < WALK_PERIOD)
        .map(|(_, s)| *s);
    let mut s = match cached {
        Some(s) => s,
        None => {
            let s = walk(procs_dir, r);
            r.walks
                .walks
                .insert(procs_dir.to_path_buf(), (std::time::Instant::now(), s));
            s
        }
    };
    if let Some(d) = pids_dir {
        match r.reuse_u64(d, "pids.current") {
            Some(current) => {
                s.threads = current.unwrap_or(0);
                // The limit changes only when the cgroup is updated: read
                // with the walk. "max": no limit, which libcontainer
                // reports as 0.
                if cached.is_none() {
                    s.threads_max = r
                        .spec(d, "pids.max")
                        .and_then(|t| t.trim().parse().ok())
                        .unwrap_or(0);
                    if let Some(w) = r.walks.walks.get_mut(procs_dir) {
                        w.1.threads_max = s.threads_max;
                    }
                }
            }
            None if v2 => s.threads = s.processes,
            None => {}
        }
    }
    s
}

fn walk(procs_dir: &Path, r: &mut FileReader) -> ProcessSample {
    let mut s = ProcessSample::default();
    // Kept open in the warm tier as cAdvisor's other files are: opening
    // it (and the directories it sits in) was most of a walk's cost once
    // the descriptor links were reused. A read from offset 0 lists the
    // processes afresh (v1's cached list lasts a second after a read).
    let pids: Vec<u32> = r
        .warm_whole(procs_dir, "cgroup.procs")
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default();
    s.processes = pids.len() as u64;
    s.first_pid = pids.iter().copied().min();
    for pid in &pids {
        // A process may exit between the list and here.
        if let Some((fds, sockets)) = count_fds(*pid, &mut r.walks) {
            s.fds += fds;
            s.sockets += sockets;
        }
    }
    s
}

/// A process's open descriptors and how many are sockets: the count from
/// the size of its fd directory, the sockets as last listed while that
/// count stays the same (for `SOCKETS_MAX_AGE`), else listed again.
fn count_fds(pid: u32, cache: &mut WalkCache) -> Option<(u64, u64)> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd")).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `path` is NUL-terminated and `st` has room for a stat.
    if unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: stat succeeded, so it filled `st`.
    let open = u64::try_from(unsafe { st.assume_init() }.st_size).unwrap_or(0);
    // 0: a kernel before 6.2 (or no descriptors): listed every time.
    if open > 0 {
        if let Some(c) = cache.fds.get(&pid) {
            if c.fds == open && c.at.elapsed() < SOCKETS_MAX_AGE {
                return Some((open, c.sockets));
            }
        }
    }
    cache.listed += 1;
    let (fds, sockets) = list_fds(&path)?;
    if open > 0 {
        let at = std::time::Instant::now();
        cache.fds.insert(
            pid,
            FdCount {
                at,
                fds: open,
                sockets,
            },
        );
    }
    Some((fds, sockets))
}

/// A process's open descriptors and how many are sockets: its fd
/// directory (`path`) listed and each link read relative to it (no path
/// walk through /proc per descriptor).
fn list_fds(path: &std::ffi::CStr) -> Option<(u64, u64)> {
    // SAFETY: `path` is NUL-terminated; a descriptor returned is handed to
    // fdopendir, and closedir below closes both.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is an open directory descriptor we own.
    let dir = unsafe { libc::fdopendir(fd) };
    if dir.is_null() {
        // SAFETY: fdopendir failed, so `fd` is still ours to close.
        unsafe { libc::close(fd) };
        return None;
    }
    let (mut fds, mut sockets) = (0u64, 0u64);
    let mut link = [0u8; 16];
    loop {
        // SAFETY: `dir` is an open DIR stream; the entry it returns stays
        // valid until the next readdir on it, and is read before that.
        let ent = unsafe { libc::readdir(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is a NUL-terminated name within the entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
        if name.to_bytes().first() == Some(&b'.') {
            continue;
        }
        fds += 1;
        // Only the start matters ("socket:[inode]"); a longer target is
        // cut short, which readlinkat allows.
        // SAFETY: `fd` is the stream's directory, `name` NUL-terminated,
        // and `link` has the length given.
        let n =
            unsafe { libc::readlinkat(fd, name.as_ptr(), link.as_mut_ptr().cast(), link.len()) };
        if n > 0 && link[..n as usize].starts_with(b"socket:") {
            sockets += 1;
        }
    }
    // SAFETY: `dir` is open; this closes it and its descriptor.
    unsafe { libc::closedir(dir) };
    Some((fds, sockets))
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
/// Reused for `LIMITS_MAX_AGE`.
pub fn add_limits(s: &mut ProcessSample, r: &mut FileReader) {
    let Some(pid) = s.first_pid else { return };
    if let Some((at, soft)) = r.walks.limits.get(&pid) {
        if at.elapsed() < LIMITS_MAX_AGE {
            s.max_open_files = *soft;
            return;
        }
    }
    let soft = r
        .whole_path(Path::new(&format!("/proc/{pid}/limits")))
        .and_then(parse_max_open_files);
    r.walks
        .limits
        .insert(pid, (std::time::Instant::now(), soft));
    s.max_open_files = soft;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cgroup directory holding this test process, with the pids
    /// controller's figures: its path and this process's pid.
    fn cgroup_of_this_process(tag: &str, current: &str, max: &str) -> (std::path::PathBuf, u32) {
        let root = crate::testutil::tempdir(tag);
        let me = std::process::id();
        std::fs::write(root.join("cgroup.procs"), format!("{me}\n")).unwrap();
        std::fs::write(root.join("pids.current"), format!("{current}\n")).unwrap();
        std::fs::write(root.join("pids.max"), format!("{max}\n")).unwrap();
        (root, me)
    }

    #[test]
    fn a_cgroup_with_this_process_counts_its_descriptors_and_sockets() {
        let (root, me) = cgroup_of_this_process("procs", "7", "max");
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
        std::fs::write(root.join("pids.current"), "9\n").unwrap();
        std::fs::write(root.join("cgroup.procs"), "").unwrap();
        // Within the walk period the walk (and the limit) is reused; the
        // thread count is read again.
        let s = read(&root, Some(&root), false, &mut r);
        assert_eq!((s.processes, s.threads, s.threads_max), (1, 9, 0));
        let s = read(&root, Some(&root), false, &mut FileReader::new());
        assert_eq!((s.processes, s.fds, s.threads_max), (0, 0, 100));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn sockets_are_listed_again_only_when_the_count_changes_or_ages() {
        // A child with a socket for stdin, waiting on it: its descriptors
        // (and whatever it inherited that is not close-on-exec, as cargo's
        // jobserver pipes) stay put while the test runs, unlike this
        // process's. Its first line says it runs: spawn returns before
        // exec has closed what it should not keep.
        use std::io::BufRead;
        let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "echo; read x"])
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                theirs,
            )))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = child.id();
        let mut c = WalkCache::default();
        let (fds, sockets) = count_fds(pid, &mut c).unwrap();
        assert!(fds >= 3 && sockets >= 1, "{fds} {sockets}");
        assert_eq!(c.listed, 1);
        // The kernel gives the count as the directory's size (6.2 and
        // later; else each count lists again, and this test says so).
        assert_eq!(count_fds(pid, &mut c), Some((fds, sockets)));
        assert_eq!(c.listed, 1, "same count: the sockets as listed");
        let at = std::time::Instant::now();
        // A recorded count that differs: listed again.
        c.fds.insert(
            pid,
            FdCount {
                at,
                fds: fds + 1,
                sockets: 0,
            },
        );
        assert_eq!(count_fds(pid, &mut c), Some((fds, sockets)));
        assert_eq!(c.listed, 2);
        // Same count within the age: the recorded sockets are used (here
        // a made-up figure, to see it is not listed)...
        let made_up = sockets + 7;
        c.fds.insert(
            pid,
            FdCount {
                at,
                fds,
                sockets: made_up,
            },
        );
        assert_eq!(count_fds(pid, &mut c), Some((fds, made_up)));
        // ...and past it, listed again.
        let old = at
            .checked_sub(SOCKETS_MAX_AGE + std::time::Duration::from_secs(1))
            .expect("uptime past the age");
        c.fds.insert(
            pid,
            FdCount {
                at: old,
                fds,
                sockets: made_up,
            },
        );
        assert_eq!(count_fds(pid, &mut c), Some((fds, sockets)));
        assert_eq!(c.listed, 3);
        child.kill().unwrap();
        child.wait().unwrap();
        drop(mine);
        assert_eq!(count_fds(pid, &mut c), None, "gone");
    }

    #[test]
    fn a_walk_reads_through_kept_files_and_reuses_limits_for_a_minute() {
        let (root, me) = cgroup_of_this_process("procs-kept", "3", "50");
        let mut r = FileReader::keeping(64);
        let collect = |r: &mut FileReader| {
            r.begin();
            r.keep_warm(true);
            // A pod's or container's cgroup, as the provider reads them.
            r.cache_specs(true);
            let mut s = read(&root, Some(&root), false, r);
            add_limits(&mut s, r);
            r.sweep();
            s
        };
        let s = collect(&mut r);
        assert_eq!((s.processes, s.threads, s.threads_max), (1, 3, 50));
        assert!(s.max_open_files.is_some());
        let held = r.held();
        assert!(held >= 2, "cgroup.procs and pids.current kept: {held}");
        assert!(r.opened >= 4, "the files and the limits: {}", r.opened);

        // The next walk (past WALK_PERIOD) lists the processes again
        // through the kept descriptor, and the limits come from what was
        // read: no file is opened.
        // A second pid that is no process (its descriptors are not
        // counted), above this one so the first pid stays the same.
        std::fs::write(
            root.join("cgroup.procs"),
            format!("{me}\n{}\n", u32::MAX - 1),
        )
        .unwrap();
        std::fs::write(root.join("pids.max"), "60\n").unwrap();
        r.walks.walks.clear();
        let s = collect(&mut r);
        assert_eq!(r.opened, 0, "nothing opened");
        assert_eq!(s.processes, 2, "read afresh");
        assert_eq!(s.first_pid, Some(me));
        assert_eq!(s.threads_max, 50, "the limit as read within a minute");

        // An open-files limit read 30 s ago (three walk periods) is served;
        // one older than LIMITS_MAX_AGE is read again.
        let ago = |secs| {
            std::time::Instant::now()
                .checked_sub(std::time::Duration::from_secs(secs))
                .unwrap()
        };
        let mut s = ProcessSample {
            first_pid: Some(me),
            ..Default::default()
        };
        r.walks.limits.insert(me, (ago(30), Some(7)));
        add_limits(&mut s, &mut r);
        assert_eq!(s.max_open_files, Some(7));
        r.walks.limits.insert(me, (ago(61), Some(7)));
        add_limits(&mut s, &mut r);
        assert_ne!(s.max_open_files, Some(7), "read again");
        assert!(s.max_open_files.is_some());
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
