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

/// Upstream pidlimit's node limit: the lesser of `kernel/pid_max` and
/// `kernel/threads-max` (either stops new tasks), or whichever was read.
pub fn pid_limit(pid_max: Option<i64>, threads_max: Option<i64>) -> Option<i64> {
    match (pid_max, threads_max) {
        (Some(p), Some(t)) => Some(p.min(t)),
        (p, t) => p.or(t),
    }
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
    match statvfs_at(path) {
        Statfs::Figures(f) => Some(f),
        Statfs::Missing | Statfs::Failed => None,
    }
}

/// What statfs said of a mount point.
#[derive(Clone)]
pub enum Statfs {
    Figures(FsFigures),
    /// It is not there (ENOENT, ENOTDIR).
    Missing,
    /// Any other failure.
    Failed,
}

/// statfs of `path`, telling a path that is not there from other failures
/// (what cAdvisor asks with a stat first; one path walk instead of two,
/// for each of the node's hundreds of pod mounts at every cAdvisor scrape).
pub fn statvfs_at(path: &Path) -> Statfs {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Statfs::Failed;
    };
    // SAFETY: `c` is a valid NUL-terminated path; `st` is plain old data the
    // call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => Statfs::Missing,
            _ => Statfs::Failed,
        };
    }
    let frsize = st.f_frsize as u64;
    Statfs::Figures(FsFigures {
        capacity: st.f_blocks as u64 * frsize,
        available: st.f_bavail as u64 * frsize,
        free: st.f_bfree as u64 * frsize,
        inodes: st.f_files as u64,
        inodes_free: st.f_ffree as u64,
    })
}

/// One line of `/proc/self/mountinfo`: `id parent maj:min root mountpoint
/// opts [optional...] - fstype source superopts`.
pub struct MountLine<'a> {
    /// Where in its file system the mount starts (`/` for a whole one).
    pub root: &'a str,
    pub mount_point: &'a str,
    pub fs_type: &'a str,
    pub source: &'a str,
    pub super_opts: &'a str,
}

/// The well-formed lines of a mountinfo text.
pub fn mount_lines(mountinfo: &str) -> impl Iterator<Item = MountLine<'_>> {
    mountinfo.lines().filter_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let mut pre = pre.split(' ').skip(3);
        let (root, mount_point) = (pre.next()?, pre.next()?);
        let mut post = post.split(' ');
        Some(MountLine {
            root,
            mount_point,
            fs_type: post.next()?,
            source: post.next()?,
            super_opts: post.next()?,
        })
    })
}

/// The source device of the mount holding `path`, from
/// `/proc/self/mountinfo` (cAdvisor's `device` label).
pub fn device_of(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for m in mount_lines(mountinfo) {
        let mp = m.mount_point;
        if path.starts_with(mp) && best.as_ref().is_none_or(|(l, _)| mp.len() >= *l) {
            best = Some((mp.len(), m.source.to_string()));
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

/// Bytes and inodes under a container's log directory (the directory
/// counts as an inode, as upstream's `du`-like walk counts it), and the
/// names of its files: one readdir and a stat per file (log files sit flat
/// in the directory; no recursive walk).
fn list_usage(dir: &Path) -> Option<(u64, u64, Vec<std::ffi::OsString>)> {
    use std::os::unix::fs::MetadataExt;
    let rd = std::fs::read_dir(dir).ok()?;
    let (mut bytes, mut inodes, mut names) = (0u64, 1u64, Vec::new());
    for e in rd.flatten() {
        if let Ok(md) = e.metadata() {
            bytes += md.blocks() * 512;
            inodes += 1;
            names.push(e.file_name());
        }
    }
    Some((bytes, inodes, names))
}

/// How long after a directory's last change its listing is trusted to
/// stay valid while the change time stays the same: a file made in the
/// same clock tick as the listing would leave the time as it was (as
/// git's "racily clean" index entries).
const LISTING_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Container log directories as last listed. A log directory changes only
/// when the runtime makes its file or the kubelet rotates one, which also
/// changes the directory's modification time; its files grow in between.
/// So a summary or cAdvisor scrape stats the directory and each file
/// listed before, and lists again only when the directory changed: two
/// system calls per container where listing took six (open, stat,
/// readdir twice, stat, close), with the same figures.
#[derive(Debug, Default)]
pub struct LogDirs {
    dirs: std::collections::HashMap<std::path::PathBuf, Listing>,
    /// Directories listed (profiling and tests).
    pub listed: u64,
}

#[derive(Debug)]
struct Listing {
    /// Inode, modification and change times of the directory when listed.
    stamp: [i64; 5],
    /// Listed at least `LISTING_SETTLE` after its last change.
    settled: bool,
    names: Vec<std::ffi::OsString>,
    used: std::time::Instant,
}

impl LogDirs {
    /// Bytes and inodes under `dir` (see `list_usage`), through its last
    /// listing while that is valid.
    pub fn usage(&mut self, dir: &Path) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(dir).ok()?;
        let stamp = [
            md.ino() as i64,
            md.mtime(),
            md.mtime_nsec(),
            md.ctime(),
            md.ctime_nsec(),
        ];
        let now = std::time::Instant::now();
        if let Some(l) = self.dirs.get_mut(dir) {
            if l.settled && l.stamp == stamp {
                l.used = now;
                let (mut bytes, mut inodes) = (0u64, 1u64);
                let mut gone = false;
                for name in &l.names {
                    match std::fs::symlink_metadata(dir.join(name)) {
                        Ok(md) => {
                            bytes += md.blocks() * 512;
                            inodes += 1;
                        }
                        // Removed without the directory's time moving (a
                        // clock set back): list again.
                        Err(_) => gone = true,
                    }
                }
                if !gone {
                    return Some((bytes, inodes));
                }
            }
        }
        self.listed += 1;
        let (bytes, inodes, names) = list_usage(dir)?;
        let changed = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                u64::try_from(md.mtime()).unwrap_or(0),
                u32::try_from(md.mtime_nsec()).unwrap_or(0),
            );
        let settled = std::time::SystemTime::now()
            .duration_since(changed)
            .is_ok_and(|d| d >= LISTING_SETTLE);
        self.dirs.insert(
            dir.to_path_buf(),
            Listing {
                stamp,
                settled,
                names,
                used: now,
            },
        );
        Some((bytes, inodes))
    }

    /// Forgets directories not asked about for `idle` (containers gone).
    pub fn sweep(&mut self, idle: std::time::Duration) {
        self.dirs.retain(|_, l| l.used.elapsed() < idle);
    }
}

// ------------------------------------------------------------ machine facts

/// cAdvisor's MachineInfo figures behind the `machine_*` families the
/// kubelet's `/metrics/cadvisor` shows (v0.52.1 `machine/machine.go`,
/// `machine/info.go`). The kubelet reads MachineInfo once at start and
/// serves that cached copy, so these are read once too.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MachineFacts {
    pub physical_cores: usize,
    pub sockets: usize,
    /// SwapTotal, bytes.
    pub swap: u64,
    /// DIMM type → (count, capacity in bytes), from the EDAC sysfs.
    pub memory_by_type: std::collections::BTreeMap<String, (u64, u64)>,
}

static MACHINE_FACTS: std::sync::OnceLock<MachineFacts> = std::sync::OnceLock::new();

/// The machine facts, read from /proc and /sys on first use (call
/// `init_machine_facts` at start so no scrape pays for it).
pub fn machine_facts() -> &'static MachineFacts {
    MACHINE_FACTS.get_or_init(|| MachineFacts::read(Path::new("/proc"), Path::new("/sys")))
}

/// Reads the machine facts now (blocking; at startup).
pub fn init_machine_facts() {
    let _ = machine_facts();
}

impl MachineFacts {
    pub fn read(proc_dir: &Path, sys_dir: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string(proc_dir.join("cpuinfo")).unwrap_or_default();
        let meminfo = std::fs::read_to_string(proc_dir.join("meminfo")).unwrap_or_default();
        let cpu_dir = sys_dir.join("devices/system/cpu");
        // cAdvisor counts distinct "core id" / "physical id" lines and falls
        // back to the sysfs topology when /proc/cpuinfo has none (arm64).
        let mut physical_cores = unique_cpuinfo_lines(&cpuinfo, "core id");
        if physical_cores == 0 {
            physical_cores = cpu_property_count(&cpu_dir, "core_id");
        }
        let mut sockets = unique_cpuinfo_lines(&cpuinfo, "physical id");
        if sockets == 0 {
            sockets = cpu_property_count(&cpu_dir, "physical_package_id");
        }
        MachineFacts {
            physical_cores,
            sockets,
            swap: parse_meminfo(&meminfo).swap_total,
            memory_by_type: memory_by_type(&sys_dir.join("devices/system/edac/mc")),
        }
    }
}

/// The number of distinct lines `<key>\s*:\s*<digits>` (cAdvisor's
/// getUniqueMatchesCount over the whole match: on a two-socket machine
/// whose sockets reuse core ids, the physical cores of one socket).
pub fn unique_cpuinfo_lines(cpuinfo: &str, key: &str) -> usize {
    let mut seen = std::collections::HashSet::new();
    for line in cpuinfo.lines() {
        let Some(rest) = line.strip_prefix(key) else {
            continue;
        };
        let Some(v) = rest.trim_start().strip_prefix(':') else {
            continue;
        };
        let v = v.trim_start();
        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            seen.insert(line);
        }
    }
    seen.len()
}

/// Whether `cpu` is in a cpu list such as `0-3,5`.
fn in_cpu_list(list: &str, cpu: u32) -> bool {
    list.trim().split(',').any(|r| match r.split_once('-') {
        Some((a, b)) => match (a.parse::<u32>(), b.parse::<u32>()) {
            (Ok(a), Ok(b)) => (a..=b).contains(&cpu),
            _ => false,
        },
        None => r.parse::<u32>() == Ok(cpu),
    })
}

/// cAdvisor's GetUniqueCPUPropertyCount: distinct (property, package) pairs
/// over the online `cpuN` directories (a missing file counts as "0").
pub fn cpu_property_count(cpu_dir: &Path, property: &str) -> usize {
    let online = std::fs::read_to_string(cpu_dir.join("online")).ok();
    let Ok(entries) = std::fs::read_dir(cpu_dir) else {
        return 0;
    };
    let read = |p: std::path::PathBuf| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "0".to_string())
    };
    let mut seen = std::collections::HashSet::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cpu"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if online.as_deref().is_some_and(|l| !in_cpu_list(l, id)) {
            continue;
        }
        let topo = e.path().join("topology");
        seen.insert((
            read(topo.join(property)),
            read(topo.join("physical_package_id")),
        ));
    }
    seen.len()
}

/// cAdvisor's GetMachineMemoryByType: per `dimm_mem_type`, the number of
/// `mc*/dimm*` entries and their `size` (MiB) in bytes. No EDAC (VMs, arm):
/// empty, and the dimm families are then not shown.
pub fn memory_by_type(edac: &Path) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut out = std::collections::BTreeMap::new();
    let is = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let Ok(mcs) = std::fs::read_dir(edac) else {
        return out;
    };
    for mc in mcs.flatten() {
        if !mc.file_name().to_str().is_some_and(|n| is(n, "mc")) {
            continue;
        }
        let Ok(dimms) = std::fs::read_dir(mc.path()) else {
            continue;
        };
        for d in dimms.flatten() {
            if !d.file_name().to_str().is_some_and(|n| is(n, "dimm")) {
                continue;
            }
            let read = |f: &str| std::fs::read_to_string(d.path().join(f)).ok();
            let (Some(ty), Some(size)) = (read("dimm_mem_type"), read("size")) else {
                continue;
            };
            let Ok(mib) = size.trim().parse::<u64>() else {
                continue;
            };
            let e = out.entry(ty.trim().to_string()).or_insert((0, 0));
            e.0 += 1;
            e.1 += mib * 1024 * 1024;
        }
    }
    out
}

// ------------------------------------------------------------ global file systems

/// A file system cAdvisor's fsInfo tracks (v0.52.1 `fs/fs.go`
/// processMounts): its `device` label, type, mount point and numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    pub device: String,
    pub fs_type: String,
    pub mountpoint: std::path::PathBuf,
    pub major: u64,
    pub minor: u64,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, also tab,
/// newline and backslash).
pub fn unescape_mountinfo(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Linux's dev_t split (glibc's gnu_dev_major/minor).
fn dev_major_minor(dev: u64) -> (u64, u64) {
    (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    )
}

/// cAdvisor's processMounts over `/proc/self/mountinfo`: ext*, nfs*,
/// btrfs, overlay, tmpfs, xfs and zfs mounts; a source already seen is a
/// bind mount and skipped (not for tmpfs, keyed by its mount point, the
/// later mount replacing the earlier); overlay sources made unique as
/// `overlay_<major>-<minor>`; btrfs's 0 major taken from the device node.
/// The kubelet's (Docker-less) context excludes `/devicemapper/mnt`.
pub fn partitions(mountinfo: &str) -> Vec<Partition> {
    let mut out: Vec<Partition> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let mut post = post.split(' ');
        let (Some(fs_type), Some(source)) = (post.next(), post.next()) else {
            continue;
        };
        let (Some(devno), Some(mp)) = (pre.get(2), pre.get(4)) else {
            continue;
        };
        let Some((Ok(mut major), Ok(mut minor))) = devno
            .split_once(':')
            .map(|(a, b)| (a.parse::<u64>(), b.parse::<u64>()))
        else {
            continue;
        };
        let supported = fs_type.starts_with("ext")
            || fs_type.starts_with("nfs")
            || matches!(fs_type, "btrfs" | "overlay" | "tmpfs" | "xfs" | "zfs");
        if !supported {
            continue;
        }
        let mut source = unescape_mountinfo(source);
        let mountpoint = unescape_mountinfo(mp);
        if index.contains_key(&source) && fs_type != "tmpfs" {
            continue;
        }
        if mountpoint.starts_with("/devicemapper/mnt") {
            continue;
        }
        if fs_type == "tmpfs" {
            source = mountpoint.clone();
        }
        if fs_type == "btrfs" && major == 0 && source.starts_with("/dev/") {
            use std::os::unix::fs::MetadataExt;
            if let Ok(m) = std::fs::metadata(&source) {
                (major, minor) = dev_major_minor(m.rdev());
            }
        }
        if fs_type == "overlay" {
            source = format!("{source}_{major}-{minor}");
        }
        let p = Partition {
            device: source.clone(),
            fs_type: fs_type.to_string(),
            mountpoint: mountpoint.into(),
            major,
            minor,
        };
        match index.get(&source) {
            Some(&i) => out[i] = p,
            None => {
                index.insert(source, out.len());
                out.push(p);
            }
        }
    }
    out
}

/// One `/proc/diskstats` line's eleven figures: reads completed, reads
/// merged, sectors read, read ms, writes completed, writes merged, sectors
/// written, write ms, I/Os in progress, I/O ms, weighted I/O ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DiskStats {
    pub major: u64,
    pub minor: u64,
    pub fields: [u64; 11],
}

/// cAdvisor's partitionRegex `^(?:(?:s|v|xv)d[a-z]+\d*|dm-\d+)$`.
fn is_stats_partition(name: &str) -> bool {
    if let Some(n) = name.strip_prefix("dm-") {
        return !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    }
    let rest = name
        .strip_prefix("xvd")
        .or_else(|| name.strip_prefix("sd"))
        .or_else(|| name.strip_prefix("vd"));
    let Some(rest) = rest else {
        return false;
    };
    let letters = rest.bytes().take_while(|b| b.is_ascii_lowercase()).count();
    letters > 0 && rest[letters..].bytes().all(|b| b.is_ascii_digit())
}

/// `/proc/diskstats` for the devices cAdvisor reads (its partitionRegex),
/// keyed `/dev/<name>` as cAdvisor's getDiskStatsMap.
pub fn parse_diskstats(text: &str) -> std::collections::HashMap<String, DiskStats> {
    let mut out = std::collections::HashMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 14 || !is_stats_partition(w[2]) {
            continue;
        }
        let (Ok(major), Ok(minor)) = (w[0].parse(), w[1].parse()) else {
            continue;
        };
        let mut fields = [0u64; 11];
        if w[3..14]
            .iter()
            .zip(fields.iter_mut())
            .any(|(v, f)| v.parse().map(|v| *f = v).is_err())
        {
            continue;
        }
        out.insert(
            format!("/dev/{}", w[2]),
            DiskStats {
                major,
                minor,
                fields,
            },
        );
    }
    out
}

/// One file system of the root container (cAdvisor's FsStats).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FsStat {
    pub device: String,
    pub capacity: u64,
    pub free: u64,
    /// (inodes, free inodes), when statfs gave them.
    pub inodes: Option<(u64, u64)>,
    pub disk: DiskStats,
}

/// cAdvisor's GetFsInfoForPath(nil) (`GetGlobalFsInfo`): statfs of every
/// partition and its diskstats, by device name or else by major:minor.
/// An nfs or zfs mount whose statfs fails is left out (one statfs per
/// major:minor); any other whose mount point is gone is reported with
/// zeros, as cAdvisor does; `statfs` is a parameter for tests.
pub fn global_fs_stats(
    partitions: &[Partition],
    diskstats: &std::collections::HashMap<String, DiskStats>,
    mut statfs: impl FnMut(&Path) -> Statfs,
) -> Vec<FsStat> {
    let mut by_devno: std::collections::HashMap<(u64, u64), FsStat> =
        std::collections::HashMap::new();
    let mut out = Vec::with_capacity(partitions.len());
    for p in partitions {
        // cAdvisor's zfs case falls through to the nfs one (its /dev/zfs
        // test is never true).
        let vfs_shared = p.fs_type.starts_with("nfs") || p.fs_type == "zfs";
        let mut st = if vfs_shared {
            if let Some(s) = by_devno.get(&(p.major, p.minor)) {
                s.clone()
            } else {
                let Statfs::Figures(f) = statfs(&p.mountpoint) else {
                    continue;
                };
                let s = fs_stat_of(&f);
                by_devno.insert((p.major, p.minor), s.clone());
                s
            }
        } else {
            // cAdvisor stats the mount point first: one that is gone is
            // reported with zeros, one whose statfs fails is left out.
            match statfs(&p.mountpoint) {
                Statfs::Figures(f) => fs_stat_of(&f),
                Statfs::Missing => FsStat::default(),
                Statfs::Failed => continue,
            }
        };
        st.device = p.device.clone();
        st.disk = diskstats
            .get(&p.device)
            .or_else(|| {
                diskstats
                    .values()
                    .find(|d| d.major == p.major && d.minor == p.minor)
            })
            .copied()
            .unwrap_or_default();
        out.push(st);
    }
    out
}

fn fs_stat_of(f: &FsFigures) -> FsStat {
    FsStat {
        capacity: f.capacity,
        free: f.free,
        inodes: Some((f.inodes, f.inodes_free)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statfs_tells_a_missing_mount_point_from_a_failure() {
        assert!(matches!(statvfs_at(Path::new("/")), Statfs::Figures(_)));
        assert!(matches!(
            statvfs_at(Path::new("/nonexistent/rkubelet/mp")),
            Statfs::Missing
        ));
        // Under a regular file: ENOTDIR, a path that cannot be there.
        assert!(matches!(
            statvfs_at(Path::new("/proc/self/stat/x")),
            Statfs::Missing
        ));
        assert!(matches!(statvfs_at(Path::new("a\0b")), Statfs::Failed));
    }

    #[test]
    fn a_log_directory_is_listed_again_only_when_it_changes() {
        use std::io::Write;
        let dir = crate::testutil::tempdir("logdirs");
        let write = |name: &str, bytes: usize| {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .unwrap();
            f.write_all(&vec![b'x'; bytes]).unwrap();
            f.sync_all().unwrap();
        };
        // The directory's last change put 10 s back, so a listing is
        // settled.
        let age = || {
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(10);
            std::fs::File::open(&dir).unwrap().set_modified(t).unwrap();
        };
        let fresh = |d: &Path| list_usage(d).map(|(b, i, _)| (b, i));
        write("0.log", 10_000);
        age();
        let mut logs = LogDirs::default();
        let first = logs.usage(&dir).unwrap();
        assert_eq!(first, fresh(&dir).unwrap());
        assert_eq!(first.1, 2, "the directory and its file");
        assert_eq!(logs.listed, 1);
        assert_eq!(logs.usage(&dir), Some(first));
        assert_eq!(logs.listed, 1, "unchanged: not listed");

        // A file that grows is stat'ed afresh.
        write("0.log", 200_000);
        let grown = logs.usage(&dir).unwrap();
        assert!(grown.0 > first.0, "{grown:?} after {first:?}");
        assert_eq!(grown, fresh(&dir).unwrap());
        assert_eq!(logs.listed, 1);

        // A new file changes the directory: listed again, and again at the
        // next call while that change is under a second old.
        write("0.log.20261125-080000", 4096);
        let two = logs.usage(&dir).unwrap();
        assert_eq!(two, fresh(&dir).unwrap());
        assert_eq!(two.1, 3);
        assert_eq!(logs.listed, 2);
        logs.usage(&dir);
        assert_eq!(logs.listed, 3, "a change under a second old");
        age();
        logs.usage(&dir);
        assert_eq!(logs.listed, 4, "the times moved");
        assert_eq!(logs.usage(&dir), Some(two));
        assert_eq!(logs.listed, 4, "settled");

        // Gone: nothing, and forgotten when unused.
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(logs.usage(&dir), None);
        logs.sweep(std::time::Duration::ZERO);
        assert!(logs.dirs.is_empty());
    }

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

    fn write(p: &std::path::Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn machine_facts_count_cpuinfo_lines_edac_dimms_and_swap() {
        let root = crate::testutil::tempdir("machine-facts");
        // Two sockets reusing core ids 0 and 1, hyperthreaded: cAdvisor's
        // unique-line count gives 2 physical cores, 2 sockets.
        let mut cpuinfo = String::new();
        for (cpu, phys, core) in [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 0, 0)] {
            cpuinfo.push_str(&format!(
                "processor\t: {cpu}\nphysical id\t: {phys}\ncore id\t\t: {core}\n\n"
            ));
        }
        write(&root.join("proc/cpuinfo"), &cpuinfo);
        write(
            &root.join("proc/meminfo"),
            "MemTotal: 100 kB\nSwapTotal: 2048 kB\n",
        );
        let mc = root.join("sys/devices/system/edac/mc");
        for (m, d, ty, mib) in [
            ("mc0", "dimm0", "Unbuffered-DDR4", "8192"),
            ("mc0", "dimm1", "Unbuffered-DDR4", "8192"),
            ("mc1", "dimm0", "Non-volatile-RAM", "1024"),
            ("mc1", "rank0", "Unbuffered-DDR4", "9999"),
        ] {
            write(
                &mc.join(m).join(d).join("dimm_mem_type"),
                &format!("{ty}\n"),
            );
            write(&mc.join(m).join(d).join("size"), &format!("{mib}\n"));
        }
        let f = MachineFacts::read(&root.join("proc"), &root.join("sys"));
        assert_eq!((f.physical_cores, f.sockets, f.swap), (2, 2, 2048 * 1024));
        assert_eq!(
            f.memory_by_type.get("Unbuffered-DDR4"),
            Some(&(2, 16384 << 20))
        );
        assert_eq!(
            f.memory_by_type.get("Non-volatile-RAM"),
            Some(&(1, 1 << 30))
        );
        assert_eq!(f.memory_by_type.len(), 2);
    }

    #[test]
    fn machine_facts_fall_back_to_sysfs_topology_of_online_cpus() {
        let root = crate::testutil::tempdir("machine-topology");
        write(
            &root.join("proc/cpuinfo"),
            "processor\t: 0\nBogoMIPS\t: 50.00\n",
        );
        let cpu = root.join("sys/devices/system/cpu");
        write(&cpu.join("online"), "0-2\n");
        for (n, core, pkg) in [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 7, 1)] {
            write(
                &cpu.join(format!("cpu{n}/topology/core_id")),
                &format!("{core}\n"),
            );
            write(
                &cpu.join(format!("cpu{n}/topology/physical_package_id")),
                &format!("{pkg}\n"),
            );
        }
        // Not a cpu directory.
        std::fs::create_dir_all(cpu.join("cpufreq")).unwrap();
        let f = MachineFacts::read(&root.join("proc"), &root.join("sys"));
        // cpu3 is offline: (0,0), (1,0), (0,1).
        assert_eq!((f.physical_cores, f.sockets), (3, 2));
        assert!(f.memory_by_type.is_empty());
    }

    #[test]
    fn partitions_follow_cadvisor_process_mounts() {
        let mi = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
23 22 0:5 / /dev rw - devtmpfs udev rw\n\
24 22 0:22 / /run rw - tmpfs tmpfs rw\n\
25 22 8:1 /var/lib/x /mnt/bind rw - ext4 /dev/sda1 rw\n\
26 22 0:40 / /var/lib/kubelet/pods/u/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw\n\
27 22 0:41 / /run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs rw - overlay overlay rw,lowerdir=a\n\
28 22 0:42 / /mnt/nfs rw - nfs4 srv:/export rw\n\
29 22 253:0 / /data\\040dir rw - xfs /dev/mapper/vg-data rw\n\
30 22 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n\
31 22 0:43 / /devicemapper/mnt/x rw - xfs /dev/dm-9 rw\n\
32 22 0:44 / /run rw - tmpfs tmpfs rw,size=1k\n";
        let p = partitions(mi);
        let devs: Vec<&str> = p.iter().map(|p| p.device.as_str()).collect();
        assert_eq!(
            devs,
            [
                "/dev/sda1",
                "/run",
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~projected/t",
                "overlay_0-41",
                "srv:/export",
                "/dev/mapper/vg-data",
            ]
        );
        // The later tmpfs over /run replaces the earlier one.
        assert_eq!((p[1].major, p[1].minor), (0, 44));
        assert_eq!(p[5].mountpoint, std::path::PathBuf::from("/data dir"));
        assert_eq!(p[4].fs_type, "nfs4");
    }

    #[test]
    fn diskstats_keep_cadvisor_partition_names_only() {
        let d = parse_diskstats(
            "   8       0 sda 10 1 80 5 20 2 160 7 0 9 12 0 0 0 0\n\
                8       1 sda1 4 0 32 2 6 0 48 3 1 4 5\n\
              259       0 nvme0n1 1 1 1 1 1 1 1 1 1 1 1\n\
              253       0 dm-0 3 0 24 1 2 0 16 1 0 2 2\n\
                7       0 loop0 1 1 1 1 1 1 1 1 1 1 1\n\
              202      16 xvdb 1 0 8 0 0 0 0 0 0 0 0\n\
                8      16 sdb 1 2\n",
        );
        let mut names: Vec<&str> = d.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["/dev/dm-0", "/dev/sda", "/dev/sda1", "/dev/xvdb"]);
        assert_eq!(
            d["/dev/sda1"],
            DiskStats {
                major: 8,
                minor: 1,
                fields: [4, 0, 32, 2, 6, 0, 48, 3, 1, 4, 5],
            }
        );
    }

    #[test]
    fn global_fs_stats_match_diskstats_by_name_then_number() {
        let part = |device: &str, fs_type: &str, mp: &str, major, minor| Partition {
            device: device.into(),
            fs_type: fs_type.into(),
            mountpoint: mp.into(),
            major,
            minor,
        };
        let parts = [
            part("/dev/sda1", "ext4", "/", 8, 1),
            part("/dev/mapper/vg-data", "xfs", "/", 253, 0),
            part("/gone/tmpfs", "tmpfs", "/nonexistent/rkubelet/mp", 0, 50),
            part("srv:/a", "nfs4", "/", 0, 60),
            part("srv:/b", "nfs4", "/", 0, 60),
            part("srv:/down", "nfs", "/", 0, 61),
            part("/dev/sdz1", "ext4", "/", 8, 99),
        ];
        let disks = parse_diskstats(
            "8 1 sda1 4 0 32 2 6 0 48 3 1 4 5\n253 0 dm-0 3 0 24 1 2 0 16 1 0 2 2\n",
        );
        let calls = std::cell::Cell::new(0);
        let fig = FsFigures {
            capacity: 1000,
            available: 300,
            free: 400,
            inodes: 50,
            inodes_free: 20,
        };
        let out = global_fs_stats(&parts, &disks, |mp| {
            if mp == Path::new("/nonexistent/rkubelet/mp") {
                return Statfs::Missing;
            }
            calls.set(calls.get() + 1);
            // The second nfs device's statfs fails.
            if calls.get() == 4 {
                Statfs::Failed
            } else {
                Statfs::Figures(fig)
            }
        });
        let devs: Vec<&str> = out.iter().map(|f| f.device.as_str()).collect();
        assert_eq!(
            devs,
            [
                "/dev/sda1",
                "/dev/mapper/vg-data",
                "/gone/tmpfs",
                "srv:/a",
                "srv:/b",
                "/dev/sdz1"
            ]
        );
        // sda1, vg-data, srv:/a, srv:/down (failed), sdz1: srv:/b reuses srv:/a's.
        assert_eq!(calls.get(), 5);
        assert_eq!(out[0].disk.fields[0], 4);
        assert_eq!(
            (out[0].capacity, out[0].free, out[0].inodes),
            (1000, 400, Some((50, 20)))
        );
        // By major:minor: dm-0.
        assert_eq!(out[1].disk.fields[0], 3);
        // A mount point that is gone: zeros, no inodes.
        assert_eq!((out[2].capacity, out[2].inodes), (0, None));
        assert_eq!(out[4].capacity, 1000);
        // No diskstats line: zeros.
        assert_eq!(out[5].disk, DiskStats::default());
    }
}
