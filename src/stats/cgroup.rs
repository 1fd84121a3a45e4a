//! Reading one cgroup's CPU, memory, pids and PSI figures, on cgroup v1
//! (one hierarchy per controller) and v2 (one unified hierarchy). The
//! hierarchy roots are parameters so tests point them at temp dirs.
//! Figures and their meaning follow cAdvisor's libcontainer handler
//! (`container/libcontainer/handler.go`): working set = usage − inactive
//! file, rss = anon, cache = file cache.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::blkio::{self, DiskIo};
use super::processes::{self, ProcessSample};

/// USER_HZ: cpuacct.stat counts in clock ticks, 100 per second on Linux.
const CLOCK_TICKS_PER_SEC: u64 = 100;

/// Where the hierarchies are mounted.
#[derive(Debug, Clone)]
pub enum Hierarchy {
    /// cgroup v1: controller name (`cpu`, `cpuacct`, `memory`, `pids`) →
    /// mount point; `unified` is the optional cgroup2 mount of a hybrid
    /// host, used only for PSI.
    V1 {
        roots: HashMap<String, PathBuf>,
        unified: Option<PathBuf>,
    },
    V2 {
        root: PathBuf,
    },
}

impl Hierarchy {
    /// The host's hierarchies from `/proc/self/mountinfo` (blocking).
    pub fn detect() -> Self {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::from_mountinfo(&text)
    }

    pub fn from_mountinfo(text: &str) -> Self {
        let mut roots = HashMap::new();
        let mut unified = None;
        for m in super::procfs::mount_lines(text) {
            let mount = PathBuf::from(m.mount_point);
            match m.fs_type {
                "cgroup2" => unified = Some(mount),
                "cgroup" => {
                    for opt in m.super_opts.split(',') {
                        if matches!(opt, "cpu" | "cpuacct" | "memory" | "pids" | "blkio") {
                            roots
                                .entry(opt.to_string())
                                .or_insert_with(|| mount.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        if roots.is_empty() {
            if let Some(root) = unified {
                return Hierarchy::V2 { root };
            }
        }
        Hierarchy::V1 { roots, unified }
    }

    pub fn is_v2(&self) -> bool {
        matches!(self, Hierarchy::V2 { .. })
    }

    /// The directory of cgroup `name` (e.g. `/kubepods/pod<uid>`) for a
    /// controller; `None` when that controller is not mounted.
    fn dir(&self, controller: &str, name: &str) -> Option<PathBuf> {
        let root = match self {
            Hierarchy::V1 { roots, .. } => roots.get(controller)?,
            Hierarchy::V2 { root } => root,
        };
        Some(join(root, name))
    }

    /// Whether cgroup `name` exists (memory controller on v1).
    pub fn exists(&self, name: &str) -> bool {
        self.dir("memory", name).is_some_and(|d| d.is_dir())
    }

    /// The pids in cgroup `name` (for finding a sandbox's netns).
    pub fn procs(&self, name: &str) -> Vec<u32> {
        self.procs_with(name, &mut FileReader::new())
    }

    /// `procs` with the caller's buffer.
    pub fn procs_with(&self, name: &str, r: &mut FileReader) -> Vec<u32> {
        self.dir("memory", name)
            // cgroup.procs has one record per pid: read to the end.
            .and_then(|d| r.whole(&d, "cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Reads everything for one cgroup (blocking); see `read_with`.
    pub fn read(&self, name: &str) -> CgroupSample {
        let mut r = FileReader::new();
        let mut s = self.read_with(name, Detail::Full, &mut r);
        s.pids = self.pids_with(name, &mut r);
        s
    }

    /// Reads only cgroup `name`'s v1 blkio files, so `r` learns which
    /// recursive figures of its subtree are empty (see `blkio::read_v1`)
    /// before the cgroups under it are read; nothing on v2.
    pub fn learn_empty_blkio(&self, name: &str, r: &mut FileReader) {
        if let Hierarchy::V1 { .. } = self {
            self.blkio_v1(name, r);
        }
    }

    /// A v1 cgroup's block I/O (`None`: no blkio controller).
    fn blkio_v1(&self, name: &str, r: &mut FileReader) -> Option<blkio::DiskIo> {
        let (d, root) = (self.dir("blkio", name)?, self.dir("blkio", "/")?);
        let files = *r
            .blkio_files
            .get_or_insert_with(|| blkio::V1Files::probe(&root));
        Some(blkio::read_v1(&d, files, r))
    }

    /// Reads the files `detail` needs for one cgroup (blocking), through
    /// the caller's buffer. Missing files leave their figures `None`: a
    /// cgroup may vanish between listing and reading, and v1 hosts may lack
    /// a controller.
    pub fn read_with(&self, name: &str, detail: Detail, r: &mut FileReader) -> CgroupSample {
        match self {
            Hierarchy::V1 { unified, .. } => {
                let mut s = self.read_v1_with(&|_| name, detail, r);
                // A hybrid host mirrors the tree in its cgroup2 mount, whose
                // pressure files are valid even without controllers there.
                if let Some(u) = unified {
                    if detail >= Detail::CpuMemory {
                        s.psi = read_psi_dir(&join(u, name), detail, r);
                    }
                }
                s
            }
            Hierarchy::V2 { root } => read_v2(&join(root, name), detail, r, name == "/"),
        }
    }

    /// A process's cgroup from its `/proc/<pid>/cgroup` text: its name (the
    /// memory controller's path on v1, the unified one on v2) and figures,
    /// each v1 controller read at that process's own path in it (they can
    /// differ: a service may have its own memory cgroup but share `/` for
    /// cpu).
    pub fn read_process(&self, proc_cgroup: &str) -> Option<(String, CgroupSample)> {
        self.read_process_with(proc_cgroup, Detail::Full, &mut FileReader::new())
    }

    /// `read_process` for `detail`, with the caller's buffer.
    pub fn read_process_with(
        &self,
        proc_cgroup: &str,
        detail: Detail,
        r: &mut FileReader,
    ) -> Option<(String, CgroupSample)> {
        let name = parse_proc_cgroup(proc_cgroup, self.is_v2())?;
        if self.is_v2() {
            let s = self.read_with(&name, detail, r);
            return Some((name, s));
        }
        let per: HashMap<String, String> = proc_cgroup
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ':');
                let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
                Some(
                    ctrls
                        .split(',')
                        .map(|c| (c.to_string(), path.to_string()))
                        .collect::<Vec<_>>(),
                )
            })
            .flatten()
            .collect();
        let s = self.read_v1_with(
            &|c: &str| per.get(c).map_or(name.as_str(), String::as_str),
            detail,
            r,
        );
        Some((name, s))
    }

    fn read_v1_with<'a>(
        &self,
        path_of: &dyn Fn(&str) -> &'a str,
        detail: Detail,
        r: &mut FileReader,
    ) -> CgroupSample {
        let full = detail == Detail::Full;
        let mut s = CgroupSample::default();
        if let Some(d) = self.dir("cpuacct", path_of("cpuacct")) {
            if let Some(total) = r.hot_u64(&d, "cpuacct.usage") {
                let ns = 1_000_000_000 / CLOCK_TICKS_PER_SEC;
                let (mut user, mut system) = (None, None);
                // User and system time only for cAdvisor's text.
                if full {
                    if let Some(t) = r.warm(&d, "cpuacct.stat") {
                        for (k, v) in kv_lines(t) {
                            match k {
                                "user" => user = Some(v * ns),
                                "system" => system = Some(v * ns),
                                _ => {}
                            }
                        }
                    }
                }
                s.cpu = Some(CpuSample {
                    usage_ns: total,
                    user_ns: user,
                    system_ns: system,
                });
            }
        }
        if full {
            if let Some(d) = self.dir("cpu", path_of("cpu")) {
                s.cpu_shares = r.spec_u64(&d, "cpu.shares");
                s.cpu_period = r.spec_u64(&d, "cpu.cfs_period_us");
                s.cpu_quota = r.spec_i64(&d, "cpu.cfs_quota_us").filter(|q| *q > 0);
                // Throttling is reported only under a quota (cAdvisor's
                // container_cpu_cfs_* families).
                if s.cpu_quota.is_some() {
                    if let Some(t) = r.warm(&d, "cpu.stat") {
                        s.throttling = throttling(t);
                    }
                }
            }
        }
        if let Some(d) = self.dir("memory", path_of("memory")) {
            if let Some(usage) = r.hot_u64(&d, "memory.usage_in_bytes") {
                // v1 hierarchical totals, as cAdvisor reads them.
                let st = r
                    .hot(&d, "memory.stat")
                    .map(|t| MemStat::parse(t, false))
                    .unwrap_or_default();
                let limit = if detail >= Detail::CpuMemory {
                    r.spec_u64(&d, "memory.limit_in_bytes")
                } else {
                    None
                };
                // Every endpoint shows the swap limit (resource metrics
                // and the summary's swapAvailableBytes).
                let memsw_limit = r.spec_u64(&d, "memory.memsw.limit_in_bytes");
                // Memory and swap together: just the memory when the node
                // has no swap (the limit file says swap is accounted).
                let memsw = match memsw_limit {
                    Some(_) if r.swap_off => Some(usage),
                    _ => r.hot_u64(&d, "memory.memsw.usage_in_bytes"),
                };
                // A host without swap accounting lacks the file: cAdvisor
                // reads that as 0.
                let swap_limit = Some(memsw_limit.unwrap_or(0));
                let (max_usage, failcnt) = if full {
                    (
                        r.warm_u64(&d, "memory.max_usage_in_bytes"),
                        r.warm_u64(&d, "memory.failcnt"),
                    )
                } else {
                    (None, None)
                };
                let mut m = st.sample(
                    usage,
                    (max_usage, failcnt, limit),
                    memsw.map(|m| m.saturating_sub(usage)),
                );
                m.swap_limit = swap_limit;
                if full {
                    m.kernel = r.warm_u64(&d, "memory.kmem.usage_in_bytes");
                    m.reservation = r.spec_u64(&d, "memory.soft_limit_in_bytes");
                }
                s.memory = Some(m);
            }
        }
        if full {
            if let Some(io) = self.blkio_v1(path_of("blkio"), r) {
                s.disk = Some(io);
            }
            if let Some(d) = self.dir("cpu", path_of("cpu")) {
                let pids = self.dir("pids", path_of("pids"));
                s.procs = Some(processes::read(&d, pids.as_deref(), false, r));
            }
        }
        s
    }

    /// The processes in cgroup `name` (see `processes::count`), from the
    /// directory cAdvisor's walk reads (v1: the cpu controller's).
    pub fn process_count_with(&self, name: &str, r: &mut FileReader) -> Option<u64> {
        let d = match self {
            Hierarchy::V1 { .. } => self.dir("cpu", name)?,
            Hierarchy::V2 { root } => join(root, name),
        };
        processes::count(&d, r)
    }

    /// The number of tasks in cgroup `name` (`read`'s; no collection
    /// needs it, so `read_with` leaves it out).
    pub fn pids_with(&self, name: &str, r: &mut FileReader) -> Option<u64> {
        let d = self.dir("pids", name)?;
        r.hot_u64(&d, "pids.current")
    }
}

/// Cgroup `name` (`/` or relative) under a hierarchy's root, allocated
/// once at its final size (`Path::join` copies the root, then grows it): a
/// few per cgroup at every scrape.
fn join(root: &Path, name: &str) -> PathBuf {
    let rel = name.trim_start_matches('/');
    let mut p = PathBuf::with_capacity(root.as_os_str().len() + 1 + rel.len());
    p.push(root);
    p.push(rel);
    p
}

/// How much of a cgroup one collection reads: each endpoint asks for what
/// its output shows and no more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Detail {
    /// `/metrics/resource`: cumulative CPU, and memory usage, working set,
    /// rss, faults and swap (the usage, `memory.stat` and swap files).
    #[default]
    Resource,
    /// `/stats/summary?only_cpu_and_memory=true`: also the memory limit
    /// (for availableBytes) and the CPU and memory pressure.
    CpuMemory,
    /// `/stats/summary`: also the IO pressure (and, in the provider, file
    /// systems, networks and pod process counts).
    Summary,
    /// `/metrics/cadvisor`: every figure (CPU spec and throttling, user and
    /// system time, peak usage and failures; the sandboxes' and QoS
    /// cgroups).
    Full,
}

/// Reads small kernel files into one buffer reused from file to file. A
/// cgroupfs value file is one seq_file record, which the kernel hands over
/// whole to a read with room for it: one open and one read per file
/// (`std::fs::read_to_string` also stats the file and reads again to see
/// the end). Files of many records (`/proc/.../net/dev`, `cgroup.procs`)
/// are read to the end. The directories last read from are held open for
/// the collection and files in them (and their subdirectories: a
/// container's cgroup under its pod's) opened relative to them, so the
/// kernel walks a long cgroup path once per pod and controller rather than
/// once per file.
pub struct FileReader {
    buf: Vec<u8>,
    /// Directories held for this collection, most recently used last (at
    /// most `HELD_DIRS`).
    dirs: Vec<(PathBuf, std::os::fd::OwnedFd)>,
    /// Files opened (profiling and tests).
    pub opened: u64,
    /// Value files kept open between collections, when enabled.
    kept: Option<KeptFiles>,
    /// Whether this collection keeps the files only cAdvisor's text reads
    /// (see `keep_warm`).
    warm: bool,
    /// Where `hot` keeps a new file: the warm tier while a cgroup only
    /// cAdvisor's text reads is read (see `sandbox_files`).
    hot_tier: Tier,
    /// Which v1 blkio files the host has, found at the first read.
    blkio_files: Option<blkio::V1Files>,
    /// This collection's v1 blkio directories whose recursive figures of
    /// a file group were empty (see `blkio::read_v1`).
    pub(super) blkio_empty: Vec<(PathBuf, usize)>,
    /// Process walks reused between collections.
    pub(super) walks: processes::WalkCache,
    /// Container log directories as last listed.
    pub(super) logs: super::procfs::LogDirs,
    /// Limits and weights read lately, by directory and file name (see
    /// `spec`).
    specs: foldhash::HashMap<std::ffi::OsString, Vec<(&'static str, SpecEntry)>>,
    /// Whether `spec` may answer from `specs` (see `cache_specs`).
    cache_specs: bool,
    /// The `SPEC_EPOCH` the kept limits were read under.
    spec_epoch: u64,
    /// The node has no swap (`SwapTotal` 0 in this collection's meminfo):
    /// no cgroup has anything swapped out, so the swap usage files, one per
    /// cgroup at every scrape, are not read.
    pub swap_off: bool,
    /// Whether pressure files are read (the KubeletPSI gate; on unless the
    /// collection says otherwise).
    pub psi: bool,
}

/// A limit or weight file's trimmed text (`None`: it could not be read)
/// and when it was read.
struct SpecEntry {
    text: Option<Box<str>>,
    read: std::time::Instant,
}

/// How long a pod's or container's limits and weights are reused before
/// they are read again. The runtime sets them when it creates the cgroup
/// and changes them only when rkubelet resizes a container in place, which
/// drops every kept value (`limits_changed`), so only a change made behind
/// the kubelet's back (`crictl update`) shows this late; cAdvisor rereads
/// them at most every 5 s. Reading them at every scrape was about a
/// quarter of `/metrics/cadvisor`'s file opens.
pub const SPEC_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Bumped by each in-place resize: kept limits read under an older value
/// are read again.
#[cfg(not(test))]
static SPEC_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// Per test thread in unit tests, so a resize in one test never empties the
// cache another test is counting file opens on.
#[cfg(test)]
thread_local! {
    static SPEC_EPOCH: std::sync::atomic::AtomicU64 = const { std::sync::atomic::AtomicU64::new(0) };
}

fn spec_epoch() -> u64 {
    #[cfg(not(test))]
    return SPEC_EPOCH.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(test)]
    SPEC_EPOCH.with(|e| e.load(std::sync::atomic::Ordering::Relaxed))
}

/// A container's limits were changed (an in-place resize).
pub fn limits_changed() {
    #[cfg(not(test))]
    SPEC_EPOCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(test)]
    SPEC_EPOCH.with(|e| e.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
}

/// Open cgroup value files, read again at offset 0 on the next collection.
/// Opening is most of the kernel's share of a scrape (a path walk and a
/// kernfs open and release per file, hundreds per scrape); a seq_file read
/// at offset 0 starts over with fresh figures. A file whose cgroup went
/// away fails its read and its directory is forgotten; directories unused
/// for `KEPT_IDLE` are closed, so a removed cgroup is not pinned for long.
///
/// Two tiers, each with its own cap: the files every endpoint reads
/// (`hot`), and those only cAdvisor's text reads (`warm`: user and system
/// time, peak usage, failures, kernel memory, thread counts, and every
/// file of the sandboxes' cgroups). A warm directory's age counts from the
/// last cAdvisor collection only, so the warm files are closed
/// `KEPT_IDLE` after the last `/metrics/cadvisor` scrape, while
/// metrics-server's scrapes keep only the hot ones.
struct KeptFiles {
    /// Keyed by the path's bytes: a `Path` hashes component by component,
    /// which showed in profiles at hundreds of lookups per collection.
    dirs: foldhash::HashMap<std::ffi::OsString, KeptDir>,
    warm: foldhash::HashMap<std::ffi::OsString, KeptDir>,
    /// Warm descriptors held (apart from `held`), at most `warm_cap`.
    warm_held: usize,
    warm_cap: usize,
    /// Sandbox id → its pause process's `/proc/<pid>/net/dev`. The open
    /// file is bound to the network namespace, not the pid, so it keeps
    /// naming that sandbox's namespace; dropped with the sandbox (see
    /// `FileReader::retain_net_devs`) or when unused for `KEPT_IDLE`.
    net_devs: HashMap<Box<str>, (std::fs::File, std::time::Instant)>,
    /// Descriptors held, at most `cap`; past it files are opened per read.
    held: usize,
    cap: usize,
    swept: std::time::Instant,
}

/// Which of `KeptFiles`' tiers a file is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Hot,
    Warm,
}

struct KeptDir {
    /// File name → its descriptor, `None` for a file the cgroup lacks.
    /// The names are the callers' literals: compared without a pointer
    /// chase per name.
    files: Vec<(&'static str, Option<std::fs::File>)>,
    used: std::time::Instant,
}

impl KeptDir {
    /// Descriptors it holds.
    fn open(&self) -> usize {
        self.files.iter().filter(|(_, f)| f.is_some()).count()
    }
}

const KEPT_IDLE: std::time::Duration = std::time::Duration::from_secs(120);
/// Directories held during a collection: a pod's in each controller (cpu,
/// cpuacct, memory, pids, blkio, unified) and its sandbox's and a
/// container's under them, without evicting the pod's before its last
/// container.
const HELD_DIRS: usize = 20;

impl Default for FileReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FileReader {
    const INITIAL: usize = 16 << 10;

    pub fn new() -> Self {
        FileReader {
            buf: vec![0; Self::INITIAL],
            dirs: Vec::new(),
            opened: 0,
            kept: None,
            warm: false,
            hot_tier: Tier::Hot,
            blkio_files: None,
            blkio_empty: Vec::new(),
            walks: processes::WalkCache::default(),
            logs: Default::default(),
            specs: Default::default(),
            cache_specs: false,
            spec_epoch: 0,
            swap_off: false,
            psi: true,
        }
    }

    /// A reader that keeps up to `cap` value files open for its next
    /// collections in the hot tier, and half as many again in the warm one
    /// (see `KeptFiles`): cAdvisor's text reads five more files of a pod's
    /// and a container's cgroup, and eleven of a sandbox's.
    pub fn keeping(cap: usize) -> Self {
        FileReader {
            kept: Some(KeptFiles {
                dirs: Default::default(),
                warm: Default::default(),
                warm_held: 0,
                warm_cap: cap + cap / 2,
                net_devs: HashMap::new(),
                held: 0,
                cap,
                swept: std::time::Instant::now(),
            }),
            ..Self::new()
        }
    }

    /// Starts a collection: the held directory descriptors are let go
    /// (they may name cgroups removed since) and the open count restarts.
    pub fn begin(&mut self) {
        self.cache_specs = false;
        self.warm = false;
        self.hot_tier = Tier::Hot;
        self.dirs.clear();
        self.opened = 0;
        self.blkio_empty.clear();
        self.swap_off = false;
    }

    /// Descriptors held open between collections.
    pub fn held(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| k.held + k.warm_held)
    }

    /// Whether this collection (cAdvisor's) keeps the files only
    /// cAdvisor's text reads, in the warm tier; off again at `begin`.
    pub fn keep_warm(&mut self, on: bool) {
        self.warm = on;
    }

    /// While on, the files of every endpoint (`hot`) are kept in the warm
    /// tier: for the cgroups only cAdvisor's text reads (sandboxes), so the
    /// hot tier's cap goes to the pods' and containers' files.
    pub fn sandbox_files(&mut self, on: bool) {
        self.hot_tier = if on { Tier::Warm } else { Tier::Hot };
    }

    /// Closes the directories no collection read for `KEPT_IDLE`; call
    /// after a collection.
    pub fn sweep(&mut self) {
        // Nor is a directory held open until the next collection.
        self.dirs.clear();
        self.walks.sweep();
        self.logs.sweep(KEPT_IDLE);
        // Limits too old to be used again (or of cgroups gone).
        let now = std::time::Instant::now();
        self.specs.retain(|_, files| {
            files.retain(|(_, e)| now.duration_since(e.read) < SPEC_MAX_AGE);
            !files.is_empty()
        });
        let Some(k) = self.kept.as_mut() else { return };
        let now = std::time::Instant::now();
        if now.duration_since(k.swept) < KEPT_IDLE / 4 {
            return;
        }
        k.swept = now;
        let sweep = |dirs: &mut foldhash::HashMap<std::ffi::OsString, KeptDir>| {
            let mut held = 0;
            dirs.retain(|_, d| {
                let keep = now.duration_since(d.used) < KEPT_IDLE;
                if keep {
                    held += d.open();
                }
                keep
            });
            held
        };
        let held = sweep(&mut k.dirs);
        k.warm_held = sweep(&mut k.warm);
        k.net_devs
            .retain(|_, (_, used)| now.duration_since(*used) < KEPT_IDLE);
        k.held = held + k.net_devs.len();
    }

    /// Closes the kept `net/dev` files of sandboxes not in `live` (gone
    /// from the runtime's lists): call after a collection that looked at
    /// every sandbox.
    pub fn retain_net_devs(&mut self, live: &dyn Fn(&str) -> bool) {
        let Some(k) = self.kept.as_mut() else { return };
        let before = k.net_devs.len();
        k.net_devs.retain(|id, _| live(id));
        k.held -= before - k.net_devs.len();
    }

    /// The network counters of sandbox `sandbox`'s namespace: its
    /// `/proc/<pid>/net/dev`, kept open by sandbox id when the reader
    /// keeps files (re-read from offset 0, no pid lookup: `pid` is asked
    /// only when the sandbox has no file kept). A sandbox id is never
    /// reused, so a kept file is never read as another sandbox's.
    pub fn net_dev(
        &mut self,
        sandbox: &str,
        pid: impl FnOnce(&mut Self) -> Option<u32>,
    ) -> Option<&str> {
        let now = std::time::Instant::now();
        if let Some(k) = self.kept.as_mut() {
            if let Some((f, used)) = k.net_devs.get_mut(sandbox) {
                *used = now;
                match read_all_at(f, &mut self.buf) {
                    Some(len) => return std::str::from_utf8(&self.buf[..len]).ok(),
                    None => {
                        k.net_devs.remove(sandbox);
                        k.held -= 1;
                    }
                }
            }
        }
        let pid = pid(self)?;
        self.opened += 1;
        let f = std::fs::File::open(format!("/proc/{pid}/net/dev")).ok()?;
        let len = read_all_at(&f, &mut self.buf)?;
        if let Some(k) = self.kept.as_mut() {
            if k.held < k.cap {
                k.held += 1;
                k.net_devs.insert(sandbox.into(), (f, now));
            }
        }
        std::str::from_utf8(&self.buf[..len]).ok()
    }

    /// Whether `spec` may reuse what it read within `SPEC_MAX_AGE`: on for
    /// the pods' and containers' cgroups, whose limits only the runtime
    /// sets; off for the node's, QoS and system cgroups, which the kubelet
    /// and systemd change as pods come and go.
    pub fn cache_specs(&mut self, on: bool) {
        self.cache_specs = on;
    }

    /// A limit or weight file (`value`, trimmed), answered from what was
    /// read within `SPEC_MAX_AGE` while `cache_specs` is on.
    pub(super) fn spec(&mut self, dir: &Path, file: &'static str) -> Option<&str> {
        if !self.cache_specs {
            return self.value(dir, file).map(str::trim);
        }
        let epoch = spec_epoch();
        if epoch != self.spec_epoch {
            self.specs.clear();
            self.spec_epoch = epoch;
        }
        let now = std::time::Instant::now();
        let at = |files: &[(&str, SpecEntry)]| files.iter().position(|(n, _)| *n == file);
        let fresh = self.specs.get(dir.as_os_str()).and_then(|files| {
            let i = at(files)?;
            (now.duration_since(files[i].1.read) < SPEC_MAX_AGE).then_some(i)
        });
        let i = match fresh {
            Some(i) => i,
            None => {
                let text = self.value(dir, file).map(|t| t.trim().into());
                let entry = SpecEntry { text, read: now };
                // A key is allocated only here, at most once a
                // `SPEC_MAX_AGE` per file.
                let files = self.specs.entry(dir.as_os_str().to_owned()).or_default();
                match at(files) {
                    Some(i) => {
                        files[i].1 = entry;
                        i
                    }
                    None => {
                        files.push((file, entry));
                        files.len() - 1
                    }
                }
            }
        };
        self.specs.get(dir.as_os_str())?[i].1.text.as_deref()
    }

    fn spec_u64(&mut self, dir: &Path, file: &'static str) -> Option<u64> {
        self.spec(dir, file)?.parse().ok()
    }

    fn spec_i64(&mut self, dir: &Path, file: &'static str) -> Option<i64> {
        self.spec(dir, file)?.parse().ok()
    }

    /// A single-record file (`dir/file`): one read unless it fills the
    /// buffer.
    pub fn value(&mut self, dir: &Path, file: &str) -> Option<&str> {
        let f = self.open_in(dir, file)?;
        self.read_from(f, true)
    }

    /// `value` for the files every collection reads (cpu usage, memory
    /// usage and stat, swap), the pressure files and the pods' task counts:
    /// kept open when the reader keeps files. Only these, since each open
    /// seq_file holds a page of kernel memory.
    fn hot(&mut self, dir: &Path, file: &'static str) -> Option<&str> {
        if self.kept.is_some() {
            return self.kept_value(dir, file, self.hot_tier, false);
        }
        self.value(dir, file)
    }

    /// `value` for a file only cAdvisor's text reads: read through a
    /// descriptor kept in either tier, else opened and, while the
    /// collection keeps those files (`keep_warm`), kept in the warm tier.
    pub(super) fn warm(&mut self, dir: &Path, file: &'static str) -> Option<&str> {
        if self.kept.is_some() {
            return self.kept_value(dir, file, Tier::Warm, false);
        }
        self.value(dir, file)
    }

    /// `warm` for a file of many records (a cgroup's `cgroup.procs`), read
    /// to its end.
    pub(super) fn warm_whole(&mut self, dir: &Path, file: &'static str) -> Option<&str> {
        if self.kept.is_some() {
            return self.kept_value(dir, file, Tier::Warm, true);
        }
        self.whole(dir, file)
    }

    fn warm_u64(&mut self, dir: &Path, file: &'static str) -> Option<u64> {
        self.warm(dir, file)?.trim().parse().ok()
    }

    /// A one-number file (`None`: unreadable, `Some(None)`: not a
    /// number), read through a descriptor kept for another collection when
    /// there is one (a pod's `pids.current`, which the summary keeps and
    /// cAdvisor's process figures read too): `warm`, parsed.
    pub(super) fn reuse_u64(&mut self, dir: &Path, file: &'static str) -> Option<Option<u64>> {
        self.warm(dir, file).map(|t| t.trim().parse().ok())
    }

    fn hot_u64(&mut self, dir: &Path, file: &'static str) -> Option<u64> {
        self.hot(dir, file)?.trim().parse().ok()
    }

    /// A file read through its kept descriptor, found in either tier;
    /// opened when it has none and kept in `tier`, room permitting (the
    /// warm tier only while `keep_warm` is on). `whole`: read to the end
    /// (see `read_from_start`).
    fn kept_value(
        &mut self,
        dir: &Path,
        file: &'static str,
        tier: Tier,
        whole: bool,
    ) -> Option<&str> {
        let now = std::time::Instant::now();
        let k = self.kept.as_mut()?;
        let mut stale = false;
        for (map, t) in [(&mut k.dirs, Tier::Hot), (&mut k.warm, Tier::Warm)] {
            let Some(d) = map.get_mut(dir.as_os_str()) else {
                continue;
            };
            // A warm directory ages from cAdvisor's collections only.
            if t == Tier::Hot || self.warm {
                d.used = now;
            }
            if let Some((_, f)) = d.files.iter().find(|(n, _)| *n == file) {
                let Some(f) = f else { return None };
                match read_from_start(f, &mut self.buf, whole) {
                    Some(len) => return std::str::from_utf8(&self.buf[..len]).ok(),
                    // The cgroup went away (or was made again): start over.
                    None => {
                        stale = true;
                        break;
                    }
                }
            }
        }
        if stale {
            if let Some(d) = k.dirs.remove(dir.as_os_str()) {
                k.held -= d.open();
            }
            if let Some(d) = k.warm.remove(dir.as_os_str()) {
                k.warm_held -= d.open();
            }
            // The held directory descriptors may name the removed one too.
            self.dirs.clear();
        }
        let f = self.open_in(dir, file);
        let k = self.kept.as_mut()?;
        let len = match &f {
            Some(f) => read_from_start(f, &mut self.buf, whole),
            None => None,
        };
        let (map, held, cap) = match tier {
            Tier::Hot => (&mut k.dirs, &mut k.held, k.cap),
            Tier::Warm => (&mut k.warm, &mut k.warm_held, k.warm_cap),
        };
        // A file that failed to open is remembered only while its directory
        // is there: a cgroup's controller files do not come and go.
        let dir_there = f.is_some() || self.dirs.last().is_some_and(|(p, _)| p == dir);
        let keep = tier == Tier::Hot || self.warm;
        if dir_there && keep && (f.is_none() || *held < cap) {
            *held += usize::from(f.is_some());
            let d = map
                .entry(dir.as_os_str().to_owned())
                .or_insert_with(|| KeptDir {
                    files: Vec::new(),
                    used: now,
                });
            d.files.push((file, f));
        }
        std::str::from_utf8(&self.buf[..len?]).ok()
    }

    /// A file of many records, read to its end.
    pub fn whole(&mut self, dir: &Path, file: &str) -> Option<&str> {
        let f = self.open_in(dir, file)?;
        self.read_from(f, false)
    }

    /// `whole` for a full path.
    pub fn whole_path(&mut self, path: &Path) -> Option<&str> {
        self.opened += 1;
        let f = std::fs::File::open(path).ok()?;
        self.read_from(f, false)
    }

    /// Opens `file` in `dir` through a held directory descriptor.
    fn open_in(&mut self, dir: &Path, file: &str) -> Option<std::fs::File> {
        use std::os::fd::FromRawFd;
        self.opened += 1;
        let dfd = self.dir_fd(dir)?;
        let c = std::ffi::CString::new(file).ok()?;
        // SAFETY: `dfd` is an open directory descriptor and `c` a
        // NUL-terminated name; a descriptor returned is ours alone and
        // handed to a File, which closes it.
        let fd = unsafe { libc::openat(dfd, c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Some(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    /// A held descriptor of `dir` (then the most recently used), opened
    /// relative to the nearest held ancestor when there is one (a path walk
    /// of one component for a container under its pod instead of the whole
    /// cgroupfs path).
    fn dir_fd(&mut self, dir: &Path) -> Option<std::os::fd::RawFd> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::ffi::OsStrExt;
        let want = dir.as_os_str().as_bytes();
        if let Some(i) = self
            .dirs
            .iter()
            .rposition(|(p, _)| p.as_os_str().as_bytes() == want)
        {
            let e = self.dirs.remove(i);
            self.dirs.push(e);
            return self.dirs.last().map(|(_, fd)| fd.as_raw_fd());
        }
        // The longest held path that `dir` is under (byte prefix ending at
        // a `/`), and what is left of `dir` below it.
        let base =
            self.dirs
                .iter()
                .enumerate()
                .filter_map(|(i, (p, _))| {
                    let p = p.as_os_str().as_bytes();
                    let p = p.strip_suffix(b"/").unwrap_or(p);
                    let rest = want.strip_prefix(p)?.strip_prefix(b"/")?;
                    let rest = rest.strip_suffix(b"/").unwrap_or(rest);
                    (!rest.is_empty() && !rest.split(|b| *b == b'/').any(|c| c == b".."))
                        .then_some((i, p.len(), rest))
                })
                .max_by_key(|(_, len, _)| *len)
                .map(|(i, _, rest)| (i, std::ffi::CString::new(rest)));
        let fd = match base {
            Some((i, c)) => {
                let e = self.dirs.remove(i);
                self.dirs.push(e);
                let c = c.ok()?;
                let at = self.dirs.last()?.1.as_raw_fd();
                // SAFETY: `at` is an open directory descriptor and `c` a
                // NUL-terminated relative path; a descriptor returned is
                // ours alone and handed to an OwnedFd below.
                unsafe {
                    libc::openat(
                        at,
                        c.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                }
            }
            None => {
                let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
                // SAFETY: `c` is a NUL-terminated path; a descriptor
                // returned is ours alone and handed to an OwnedFd below.
                unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                }
            }
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if self.dirs.len() >= HELD_DIRS {
            self.dirs.remove(0);
        }
        self.dirs.push((dir.to_path_buf(), fd));
        self.dirs.last().map(|(_, fd)| fd.as_raw_fd())
    }

    fn read_from(&mut self, mut f: std::fs::File, single: bool) -> Option<&str> {
        use std::io::Read;
        let mut len = 0;
        loop {
            if len == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = match f.read(&mut self.buf[len..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            };
            len += n;
            if n == 0 || (single && len < self.buf.len()) {
                break;
            }
        }
        std::str::from_utf8(&self.buf[..len]).ok()
    }
}

/// Reads `f` from offset 0 into `buf`, growing it until the file fits:
/// the length read, `None` on an error. A single-record file comes whole in
/// one read with room; a file of many records (`whole`), which a seq_file
/// hands over a page at a time, is read to its end.
fn read_from_start(f: &std::fs::File, buf: &mut Vec<u8>, whole: bool) -> Option<usize> {
    use std::os::unix::fs::FileExt;
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read_at(&mut buf[len..], len as u64) {
            Ok(0) => return Some(len),
            Ok(n) => {
                len += n;
                if !whole && len < buf.len() {
                    return Some(len);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

fn read_all_at(f: &std::fs::File, buf: &mut Vec<u8>) -> Option<usize> {
    read_from_start(f, buf, true)
}

/// `key value` lines, without allocating.
fn kv_lines(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|l| {
        let mut it = l.split_whitespace();
        Some((it.next()?, it.next()?.parse().ok()?))
    })
}

/// (nr_periods, nr_throttled) from a `cpu.stat`.
fn throttling(text: &str) -> Option<(u64, u64)> {
    let (mut periods, mut throttled) = (None, 0);
    for (k, v) in kv_lines(text) {
        match k {
            "nr_periods" => periods = Some(v),
            "nr_throttled" => throttled = v,
            _ => {}
        }
    }
    periods.map(|p| (p, throttled))
}

/// The `memory.stat` figures cAdvisor uses; `prefix` is `total_` for v1's
/// hierarchical totals, empty on v2.
#[derive(Debug, Default)]
struct MemStat {
    inactive_file: u64,
    active_file: u64,
    rss: u64,
    cache: u64,
    mapped_file: u64,
    pgfault: u64,
    pgmajfault: u64,
}

impl MemStat {
    /// The sample v1 and v2 both build from `memory.stat` and their own
    /// usage, (max usage, fail count, limit) and swap files.
    fn sample(
        &self,
        usage: u64,
        (max_usage, failcnt, limit): (Option<u64>, Option<u64>, Option<u64>),
        swap: Option<u64>,
    ) -> MemorySample {
        MemorySample {
            usage,
            working_set: usage.saturating_sub(self.inactive_file),
            rss: self.rss,
            cache: self.cache,
            mapped_file: self.mapped_file,
            pgfault: self.pgfault,
            pgmajfault: self.pgmajfault,
            max_usage,
            failcnt,
            limit,
            swap,
            active_file: self.active_file,
            inactive_file: self.inactive_file,
            kernel: None,
            swap_limit: None,
            reservation: None,
        }
    }

    /// `memory.stat`'s wanted lines: v1's hierarchical totals
    /// (`total_…`), v2's own. Seven of v1's 46 lines (35 on v2) are wanted,
    /// read at every scrape for each cgroup, so lines are looked at as
    /// bytes and most passed over on their first ones (as a `str` split
    /// this was a quarter of a collection's user-space CPU).
    fn parse(text: &str, v2: bool) -> Self {
        let mut m = MemStat::default();
        for line in text.as_bytes().split(|b| *b == b'\n') {
            let line = if v2 {
                line
            } else {
                match line.strip_prefix(b"total_") {
                    Some(l) => l,
                    None => continue,
                }
            };
            if !matches!(
                line.first(),
                Some(b'i' | b'a' | b'r' | b'c' | b'm' | b'f' | b'p')
            ) {
                continue;
            }
            let Some(sp) = line.iter().position(|b| *b == b' ') else {
                continue;
            };
            let field = match &line[..sp] {
                b"inactive_file" => &mut m.inactive_file,
                b"active_file" => &mut m.active_file,
                b"rss" if !v2 => &mut m.rss,
                b"anon" if v2 => &mut m.rss,
                b"cache" if !v2 => &mut m.cache,
                b"file" if v2 => &mut m.cache,
                b"mapped_file" if !v2 => &mut m.mapped_file,
                b"file_mapped" if v2 => &mut m.mapped_file,
                b"pgfault" => &mut m.pgfault,
                b"pgmajfault" => &mut m.pgmajfault,
                _ => continue,
            };
            if let Some(v) = ascii_u64(&line[sp + 1..]) {
                *field = v;
            }
        }
        m
    }
}

/// An unsigned decimal (surrounding ASCII whitespace allowed), as
/// `str::parse::<u64>` reads one without a sign.
fn ascii_u64(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, b| {
        let d = b.wrapping_sub(b'0');
        (d < 10).then_some(())?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// `is_root`: `d` is the hierarchy's root, which has no memory.current.
fn read_v2(d: &Path, detail: Detail, r: &mut FileReader, is_root: bool) -> CgroupSample {
    let full = detail == Detail::Full;
    let mut s = CgroupSample::default();
    if let Some(t) = r.hot(d, "cpu.stat") {
        let (mut usage, mut user, mut system) = (None, None, None);
        for (k, v) in kv_lines(t) {
            match k {
                "usage_usec" => usage = Some(v * 1000),
                "user_usec" => user = Some(v * 1000),
                "system_usec" => system = Some(v * 1000),
                _ => {}
            }
        }
        if let Some(usage_ns) = usage {
            s.cpu = Some(CpuSample {
                usage_ns,
                user_ns: user,
                system_ns: system,
            });
            s.throttling = throttling(t);
        }
    }
    if full {
        // cpu.weight → shares, the inverse of the kubelet's shares → weight.
        s.cpu_shares = r
            .spec_u64(d, "cpu.weight")
            .map(|w| 2 + ((w.max(1) - 1) * 262_142) / 9999);
        if let Some(max) = r.spec(d, "cpu.max") {
            let mut it = max.split_whitespace();
            let quota = it.next().and_then(|q| q.parse::<i64>().ok());
            s.cpu_quota = quota;
            s.cpu_period = it.next().and_then(|p| p.parse().ok());
        }
    }
    let stat = |r: &mut FileReader| r.hot(d, "memory.stat").map(|t| MemStat::parse(t, true));
    let memory = match r.hot_u64(d, "memory.current") {
        Some(usage) => Some((usage, stat(r).unwrap_or_default())),
        // As runc's rootStatsFromMeminfo, which cAdvisor reads the root
        // through: anon + file of the root's memory.stat (v1's
        // usage_in_bytes), not MemTotal - MemFree, which counts the
        // kernel's own memory too.
        None if is_root => stat(r).map(|st| (st.rss + st.cache, st)),
        None => None,
    };
    if let Some((usage, st)) = memory {
        // "max" does not parse: no limit.
        let limit = if detail >= Detail::CpuMemory {
            r.spec_u64(d, "memory.max")
        } else {
            None
        };
        let swap_max = r.spec(d, "memory.swap.max").map(parse_max);
        // 0 when the node has no swap: nothing is swapped out (the limit
        // file says the swap controller is there), and the file is not read.
        let swap = match swap_max {
            Some(_) if r.swap_off => Some(0),
            _ => r.hot_u64(d, "memory.swap.current"),
        };
        let swap_limit = Some(swap_max.flatten().unwrap_or(0));
        let (max_usage, failcnt) = if full {
            let failcnt = r
                .warm(d, "memory.events")
                .and_then(|t| kv_lines(t).find_map(|(k, v)| (k == "max").then_some(v)));
            (r.warm_u64(d, "memory.peak"), failcnt)
        } else {
            (None, None)
        };
        let mut m = st.sample(usage, (max_usage, failcnt, limit), swap);
        m.swap_limit = swap_limit;
        if full {
            m.reservation = r.spec(d, "memory.min").and_then(parse_max);
        }
        s.memory = Some(m);
    }
    if detail >= Detail::CpuMemory {
        s.psi = read_psi_dir(d, detail, r);
    }
    if full {
        s.disk = Some(
            r.whole(d, "io.stat")
                .map(blkio::parse_v2)
                .unwrap_or_default(),
        );
        s.procs = Some(processes::read(d, Some(d), true, r));
    }
    s
}

/// Kept open as the hot files are: opening was most of their cost (a
/// path walk in the unified tree per file, three files per cgroup).
fn read_psi_dir(d: &Path, detail: Detail, r: &mut FileReader) -> Option<Psi> {
    if !r.psi {
        return None;
    }
    let cpu = r.hot(d, "cpu.pressure").and_then(parse_psi);
    let memory = r.hot(d, "memory.pressure").and_then(parse_psi);
    let io = if detail >= Detail::Summary {
        r.hot(d, "io.pressure").and_then(parse_psi)
    } else {
        None
    };
    (cpu.is_some() || memory.is_some() || io.is_some()).then_some(Psi { cpu, memory, io })
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSample {
    pub usage_ns: u64,
    pub user_ns: Option<u64>,
    pub system_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemorySample {
    pub usage: u64,
    pub working_set: u64,
    pub rss: u64,
    pub cache: u64,
    pub mapped_file: u64,
    pub pgfault: u64,
    pub pgmajfault: u64,
    pub max_usage: Option<u64>,
    pub failcnt: Option<u64>,
    /// None or a huge value: unlimited.
    pub limit: Option<u64>,
    pub swap: Option<u64>,
    pub active_file: u64,
    pub inactive_file: u64,
    /// v1's kernel memory usage; v2 has no such file (cAdvisor shows 0).
    pub kernel: Option<u64>,
    /// cAdvisor's SwapLimit: v1 `memory.memsw.limit_in_bytes` (memory and
    /// swap together), v2 `memory.swap.max` (`max` is `u64::MAX`), 0 where
    /// the file is missing, as cAdvisor reads it; `None` for figures not
    /// from cgroups.
    pub swap_limit: Option<u64>,
    /// cAdvisor's Reservation (its text only): v1
    /// `memory.soft_limit_in_bytes`, v2 `memory.min`.
    pub reservation: Option<u64>,
}

/// A v2 limit: a number, or `max` for none (cAdvisor's `u64::MAX`).
fn parse_max(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => Some(u64::MAX),
        t => t.parse().ok(),
    }
}

/// One pressure file's `some` and `full` lines.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Cumulative stall time in microseconds, as the kernel reports it.
    pub total: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiPair {
    pub some: PsiLine,
    pub full: PsiLine,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Psi {
    pub cpu: Option<PsiPair>,
    pub memory: Option<PsiPair>,
    pub io: Option<PsiPair>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupSample {
    pub cpu: Option<CpuSample>,
    pub memory: Option<MemorySample>,
    pub pids: Option<u64>,
    /// Processes (not threads) in the cgroup, read for containers only.
    pub processes: Option<u64>,
    pub cpu_shares: Option<u64>,
    pub cpu_period: Option<u64>,
    pub cpu_quota: Option<i64>,
    /// (nr_periods, nr_throttled).
    pub throttling: Option<(u64, u64)>,
    pub psi: Option<Psi>,
    /// Per-device block I/O (cAdvisor's text only).
    pub disk: Option<DiskIo>,
    /// Processes, descriptors and threads (cAdvisor's text only).
    pub procs: Option<ProcessSample>,
}

/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=0` (and `full ...`).
pub fn parse_psi(text: &str) -> Option<PsiPair> {
    let mut out = PsiPair::default();
    let mut any = false;
    for l in text.lines() {
        let mut it = l.split_ascii_whitespace();
        let which = match it.next() {
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            _ => continue,
        };
        any = true;
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            match k {
                "avg10" => which.avg10 = parse_avg(v).unwrap_or(0.0),
                "avg60" => which.avg60 = parse_avg(v).unwrap_or(0.0),
                "avg300" => which.avg300 = parse_avg(v).unwrap_or(0.0),
                "total" => which.total = v.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    any.then_some(out)
}

/// A pressure average, which the kernel writes as `%lu.%02lu`: its digits
/// as one integer divided by the power of ten of its decimals. Both that
/// division and `str::parse` round the exact decimal value once, so the
/// double is the same; six per file and three files per cgroup made the
/// general float parser show in profiles. Other shapes go to it.
fn parse_avg(v: &str) -> Option<f64> {
    const POW10: [f64; 8] = [1.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7];
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    let digits = int.len() + frac.len();
    if int.is_empty() || digits > 15 || frac.len() >= POW10.len() {
        return v.parse().ok();
    }
    let n = int.bytes().chain(frac.bytes()).try_fold(0u64, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    });
    match n {
        Some(n) => Some(n as f64 / POW10[frac.len()]),
        None => v.parse().ok(),
    }
}

/// A process's cgroup (from `/proc/<pid>/cgroup`): on v1 the memory
/// controller's path (the others usually agree; the summary only needs
/// one name), on v2 the unified path.
pub fn parse_proc_cgroup(text: &str, v2: bool) -> Option<String> {
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = if v2 {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == "memory")
        };
        hit.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "rkubelet-stats-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn mountinfo_of_a_hybrid_host_is_v1_with_a_unified_mount() {
        let mi = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw shared:6 - cgroup cgroup rw,cpu,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw shared:7 - cgroup cgroup rw,memory
";
        let h = Hierarchy::from_mountinfo(mi);
        let Hierarchy::V1 { roots, unified } = h else {
            panic!("expected v1")
        };
        assert_eq!(roots["cpu"], PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(
            roots["cpuacct"],
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(roots["memory"], PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(unified, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let v2 = Hierarchy::from_mountinfo(
            "31 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        assert!(v2.is_v2());
    }

    #[test]
    fn v1_figures_follow_cadvisor() {
        let root = tempdir("v1");
        let cg = "/kubepods/besteffort/podx/abc";
        let mem = root.join("memory").join(&cg[1..]);
        let acct = root.join("cpuacct").join(&cg[1..]);
        let cpu = root.join("cpu").join(&cg[1..]);
        write(&acct, "cpuacct.usage", "123456789\n");
        write(&acct, "cpuacct.stat", "user 10\nsystem 5\n");
        write(&cpu, "cpu.shares", "2\n");
        write(&cpu, "cpu.cfs_quota_us", "-1\n");
        write(&cpu, "cpu.cfs_period_us", "100000\n");
        write(&mem, "memory.usage_in_bytes", "10000\n");
        write(&mem, "memory.memsw.usage_in_bytes", "10500\n");
        write(&mem, "memory.failcnt", "3\n");
        write(
            &mem,
            "memory.stat",
            "cache 1\nrss 2\ninactive_file 5\ntotal_cache 4000\ntotal_rss 6000\n\
             total_inactive_file 3000\ntotal_pgfault 77\ntotal_pgmajfault 7\ntotal_mapped_file 9\n",
        );
        write(&mem, "cgroup.procs", "42\n43\n");
        let h = Hierarchy::V1 {
            roots: ["cpu", "cpuacct", "memory"]
                .iter()
                .map(|c| (c.to_string(), root.join(c)))
                .collect(),
            unified: None,
        };
        assert!(h.exists(cg));
        assert_eq!(h.procs(cg), vec![42, 43]);
        let s = h.read(cg);
        let c = s.cpu.unwrap();
        assert_eq!(c.usage_ns, 123456789);
        assert_eq!(c.user_ns, Some(100_000_000));
        assert_eq!(c.system_ns, Some(50_000_000));
        assert_eq!(s.cpu_shares, Some(2));
        assert_eq!(s.cpu_quota, None, "-1 means no quota");
        let m = s.memory.unwrap();
        assert_eq!(m.usage, 10000);
        assert_eq!(m.working_set, 7000, "usage - total_inactive_file");
        assert_eq!(m.rss, 6000);
        assert_eq!(m.cache, 4000);
        assert_eq!(m.pgfault, 77);
        assert_eq!(m.pgmajfault, 7);
        assert_eq!(m.failcnt, Some(3));
        assert_eq!(m.swap, Some(500));
        assert!(s.psi.is_none());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn each_detail_reads_only_its_files() {
        let root = tempdir("detail");
        let cg = "/kubepods/pody/abc";
        let mem = root.join("memory").join(&cg[1..]);
        let acct = root.join("cpuacct").join(&cg[1..]);
        write(&acct, "cpuacct.usage", "5000\n");
        write(&acct, "cpuacct.stat", "user 1\nsystem 2\n");
        write(&root.join("cpu").join(&cg[1..]), "cpu.shares", "1024\n");
        write(&mem, "memory.usage_in_bytes", "10000\n");
        write(&mem, "memory.memsw.usage_in_bytes", "10100\n");
        write(&mem, "memory.limit_in_bytes", "20000\n");
        write(
            &mem,
            "memory.stat",
            "total_inactive_file 3000\ntotal_rss 6000\n",
        );
        let h = Hierarchy::V1 {
            roots: ["cpu", "cpuacct", "memory"]
                .iter()
                .map(|c| (c.to_string(), root.join(c)))
                .collect(),
            unified: None,
        };
        let read = |d| {
            let mut r = FileReader::new();
            let s = h.read_with(cg, d, &mut r);
            (s, r.opened)
        };
        let (res, n_res) = read(Detail::Resource);
        let (cm, n_cm) = read(Detail::CpuMemory);
        let (sum, n_sum) = read(Detail::Summary);
        let (full, n_full) = read(Detail::Full);
        assert_eq!(n_sum, n_cm, "no unified mount: no more to read");
        assert_eq!(sum, cm);
        // usage, memory usage, memory.stat, memsw usage and limit.
        assert_eq!(n_res, 5);
        assert_eq!(n_cm, 6, "and the limit");
        assert!(n_full > n_cm);
        for s in [&res, &cm, &full] {
            assert_eq!(s.cpu.unwrap().usage_ns, 5000);
            let m = s.memory.unwrap();
            assert_eq!((m.usage, m.working_set, m.rss), (10000, 7000, 6000));
            assert_eq!(m.swap, Some(100));
        }
        assert_eq!(res.memory.unwrap().limit, None);
        // No memsw limit file here: 0, as cAdvisor reads a missing file.
        assert_eq!(res.memory.unwrap().swap_limit, Some(0));
        assert_eq!(cm.memory.unwrap().limit, Some(20000));
        assert_eq!(res.cpu.unwrap().user_ns, None);
        assert_eq!(full.cpu.unwrap().user_ns, Some(10_000_000));
        assert_eq!(full.cpu_shares, Some(1024));
        let _ = std::fs::remove_dir_all(root);
    }

    /// A v1 tree with only the memory controller, cgroup `cg` in it with
    /// usage 10000, memsw usage 10100 (swap 100) and a 50 MiB memsw limit;
    /// returns the hierarchy and the cgroup's directory.
    fn v1_memory_with_swap(root: &Path, cg: &str) -> (Hierarchy, PathBuf) {
        let mem = root.join("memory").join(&cg[1..]);
        write(&mem, "memory.usage_in_bytes", "10000\n");
        write(&mem, "memory.memsw.usage_in_bytes", "10100\n");
        write(&mem, "memory.memsw.limit_in_bytes", "52428800\n");
        write(&mem, "memory.stat", "total_rss 6000\n");
        let h = Hierarchy::V1 {
            roots: [("memory".to_string(), root.join("memory"))]
                .into_iter()
                .collect(),
            unified: None,
        };
        (h, mem)
    }

    /// A v2 root has no memory.current: its usage is anon + file of its
    /// memory.stat, as runc's rootStatsFromMeminfo (it was MemTotal -
    /// MemFree, which counts slab and page tables too). Elsewhere a
    /// missing memory.current is no figure.
    #[test]
    fn the_v2_root_memory_is_anon_and_file() {
        let root = tempdir("v2root");
        write(
            &root,
            "memory.stat",
            "anon 6000\nfile 4000\ninactive_file 1000\npgfault 7\n",
        );
        let h = Hierarchy::V2 { root: root.clone() };
        let m = h.read("/").memory.expect("root memory");
        assert_eq!((m.usage, m.working_set, m.rss), (10000, 9000, 6000));
        assert_eq!(m.pgfault, 7);
        write(&root.join("kubepods"), "memory.stat", "anon 1\n");
        assert!(h.read("/kubepods").memory.is_none());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn swap_and_reservation_limits_are_read_as_cadvisor_reads_them() {
        let root = tempdir("swaplimit");
        let cg = "/kubepods/podz/abc";
        let (h, mem) = v1_memory_with_swap(&root, cg);
        write(&mem, "memory.soft_limit_in_bytes", "9223372036854771712\n");
        let m = h
            .read_with(cg, Detail::Resource, &mut FileReader::new())
            .memory
            .unwrap();
        assert_eq!(m.swap_limit, Some(52428800), "memsw, memory and swap");
        assert_eq!(m.reservation, None, "cAdvisor's text only");
        let m = h.read(cg).memory.unwrap();
        assert_eq!(m.reservation, Some(9223372036854771712));

        // v2: `max` is no limit (u64::MAX), memory.min the reservation.
        let d = root.join("v2").join(&cg[1..]);
        write(&d, "memory.current", "10000\n");
        write(&d, "memory.stat", "anon 6000\n");
        write(&d, "memory.swap.current", "0\n");
        write(&d, "memory.swap.max", "max\n");
        write(&d, "memory.min", "4096\n");
        let h2 = Hierarchy::V2 {
            root: root.join("v2"),
        };
        let m = h2.read(cg).memory.unwrap();
        assert_eq!((m.swap_limit, m.reservation), (Some(u64::MAX), Some(4096)));
        write(&d, "memory.swap.max", "1048576\n");
        let m = h2
            .read_with(cg, Detail::Resource, &mut FileReader::new())
            .memory
            .unwrap();
        assert_eq!(m.swap_limit, Some(1048576));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn without_swap_on_the_node_the_swap_usage_files_are_not_read() {
        let root = tempdir("swapoff");
        let cg = "/kubepods/podw/abc";
        // Read a moment apart, the two usage counters differ a little.
        let (h, mem) = v1_memory_with_swap(&root, cg);
        let read = |h: &Hierarchy, swap_off| {
            let mut r = FileReader::new();
            r.swap_off = swap_off;
            let m = h.read_with(cg, Detail::Resource, &mut r).memory.unwrap();
            (m.swap, m.swap_limit, r.opened)
        };
        let (swap, limit, opened) = read(&h, false);
        assert_eq!((swap, limit), (Some(100), Some(52428800)));
        assert_eq!(read(&h, true), (Some(0), limit, opened - 1));
        // No swap accounting (no memsw files): no swap figure either way.
        std::fs::remove_file(mem.join("memory.memsw.limit_in_bytes")).unwrap();
        std::fs::remove_file(mem.join("memory.memsw.usage_in_bytes")).unwrap();
        assert_eq!(read(&h, true).0, None);
        assert_eq!(read(&h, false).0, None);

        // v2: memory.swap.current, beside memory.swap.max.
        let d = root.join("v2").join(&cg[1..]);
        write(&d, "memory.current", "10000\n");
        write(&d, "memory.stat", "anon 6000\n");
        write(&d, "memory.swap.current", "4096\n");
        write(&d, "memory.swap.max", "max\n");
        let h2 = Hierarchy::V2 {
            root: root.join("v2"),
        };
        let (swap, _, opened) = read(&h2, false);
        assert_eq!(swap, Some(4096));
        assert_eq!(read(&h2, true), (Some(0), Some(u64::MAX), opened - 1));
        std::fs::remove_file(d.join("memory.swap.max")).unwrap();
        std::fs::remove_file(d.join("memory.swap.current")).unwrap();
        assert_eq!(read(&h2, true).0, None);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn an_in_place_resize_drops_the_kept_limits() {
        // Old code: a limit changed by a resize showed up to 60 s late.
        let root = tempdir("specs-resize");
        write(&root, "cpu.cfs_quota_us", "20000\n");
        let mut r = FileReader::keeping(16);
        r.begin();
        r.cache_specs(true);
        assert_eq!(r.spec_u64(&root, "cpu.cfs_quota_us"), Some(20000));
        write(&root, "cpu.cfs_quota_us", "40000\n");
        assert_eq!(r.spec_u64(&root, "cpu.cfs_quota_us"), Some(20000), "kept");
        limits_changed();
        assert_eq!(r.spec_u64(&root, "cpu.cfs_quota_us"), Some(40000));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn limits_are_reused_only_while_caching_and_young() {
        let root = tempdir("specs");
        write(&root, "memory.limit_in_bytes", "1000\n");
        let mut r = FileReader::keeping(16);
        // Off (the node's and QoS cgroups): read every time.
        assert_eq!(r.spec_u64(&root, "memory.limit_in_bytes"), Some(1000));
        write(&root, "memory.limit_in_bytes", "2000\n");
        assert_eq!(r.spec_u64(&root, "memory.limit_in_bytes"), Some(2000));
        // On: the first read is reused, without opening the file.
        r.begin();
        r.cache_specs(true);
        assert_eq!(r.spec_u64(&root, "memory.limit_in_bytes"), Some(2000));
        write(&root, "memory.limit_in_bytes", "3000\n");
        let opened = r.opened;
        assert_eq!(r.spec_u64(&root, "memory.limit_in_bytes"), Some(2000));
        assert_eq!(r.opened, opened, "answered from the cache");
        // A missing file is remembered as missing too.
        assert_eq!(r.spec(&root, "memory.soft_limit_in_bytes"), None);
        assert_eq!(r.spec(&root, "memory.soft_limit_in_bytes"), None);
        assert_eq!(r.opened, opened + 1);
        // A new collection starts with caching off.
        r.begin();
        assert_eq!(r.spec_u64(&root, "memory.limit_in_bytes"), Some(3000));
        // Past SPEC_MAX_AGE the file is read again (and sweep drops it).
        r.cache_specs(true);
        for (_, e) in r.specs.values_mut().flatten() {
            e.read -= SPEC_MAX_AGE;
        }
        assert_eq!(r.spec_u64(&root, "memory.limit_in_bytes"), Some(3000));
        for (_, e) in r.specs.values_mut().flatten() {
            e.read -= SPEC_MAX_AGE;
        }
        r.sweep();
        assert!(r.specs.is_empty());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn memory_stat_takes_v1_totals_and_v2_own_lines() {
        // A v1 file as 6.1 writes it: the local figures first, then the
        // hierarchical ones; only the latter count, and keys that share a
        // start with a wanted one (rss_huge, mapped_file) are told apart.
        let v1 = "cache 11\nrss 12\nrss_huge 13\nmapped_file 14\npgfault 15\n\
                  inactive_file 16\nactive_file 17\nhierarchical_memory_limit 9223372036854771712\n\
                  total_cache 4000\ntotal_rss 6000\ntotal_rss_huge 2097152\n\
                  total_mapped_file 9\ntotal_pgfault 77\ntotal_pgmajfault 7\n\
                  total_inactive_anon 86016\ntotal_inactive_file 3000\n\
                  total_active_file 250\ntotal_unevictable 0\n";
        let m = MemStat::parse(v1, false);
        assert_eq!(
            (m.cache, m.rss, m.mapped_file, m.pgfault, m.pgmajfault),
            (4000, 6000, 9, 77, 7)
        );
        assert_eq!((m.inactive_file, m.active_file), (3000, 250));
        // v2: no prefix, its own names; v1's names are not v2's.
        let v2 = "anon 500\nfile 600\nkernel 1\nfile_mapped 70\nfile_dirty 3\n\
                  anon_thp 0\ninactive_anon 4\nactive_anon 5\ninactive_file 80\n\
                  active_file 90\nrss 999\ncache 999\npgfault 11\npgmajfault 2\n";
        let m = MemStat::parse(v2, true);
        assert_eq!(
            (
                m.rss,
                m.cache,
                m.mapped_file,
                m.inactive_file,
                m.active_file
            ),
            (500, 600, 70, 80, 90)
        );
        assert_eq!((m.pgfault, m.pgmajfault), (11, 2));
        // A value that is no number is left at 0, as before; a last line
        // without its newline still counts.
        let m = MemStat::parse("total_rss x1\ntotal_cache 5", false);
        assert_eq!((m.rss, m.cache), (0, 5));
    }

    #[test]
    fn values_are_read_as_the_standard_parsers_read_them() {
        for t in ["0", "42", " 42\n", "18446744073709551615"] {
            assert_eq!(ascii_u64(t.as_bytes()), t.trim().parse().ok(), "{t:?}");
        }
        for t in ["", " ", "-1", "4x", "18446744073709551616", "1 2"] {
            assert_eq!(ascii_u64(t.as_bytes()), None, "{t:?}");
        }
        // Every average the kernel can write below 1000, and some others:
        // the same double as the general parser.
        for i in 0..1000u32 {
            for f in 0..100u32 {
                let t = format!("{i}.{f:02}");
                assert_eq!(parse_avg(&t), t.parse().ok(), "{t}");
            }
        }
        for t in [
            "100.00",
            "7",
            "0.5",
            "123456.78",
            "1e3",
            "x",
            ".5",
            "1.2.3",
            "",
        ] {
            assert_eq!(parse_avg(t), t.parse().ok(), "{t:?}");
        }
        let p = parse_psi("some avg10=12.34 avg60=0.07 avg300=100.00 total=56\n").unwrap();
        assert_eq!(
            (p.some.avg10, p.some.avg60, p.some.avg300),
            (12.34, 0.07, 100.0)
        );
        assert_eq!(p.some.total, 56);
    }

    #[test]
    fn the_reader_grows_for_big_files_and_reuses_its_buffer() {
        let root = tempdir("reader");
        let big: String = (0..5000).map(|i| format!("k{i} {i}\n")).collect();
        write(&root, "big", &big);
        write(&root, "small", "42\n");
        let mut r = FileReader::new();
        assert_eq!(r.value(&root, "big"), Some(big.as_str()));
        assert_eq!(r.whole(&root, "big"), Some(big.as_str()));
        assert_eq!(r.value(&root, "small"), Some("42\n"));
        assert_eq!(r.value(&root, "missing"), None);
        assert_eq!(r.whole_path(&root.join("small")), Some("42\n"));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn pressure_files_are_kept_open_between_collections() {
        let d = tempdir("psi-kept");
        let line = "some avg10=1.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=2\n";
        for f in ["cpu.pressure", "memory.pressure", "io.pressure"] {
            write(&d, f, line);
        }
        let mut r = FileReader::keeping(8);
        let first = read_psi_dir(&d, Detail::Summary, &mut r).unwrap();
        assert_eq!((r.opened, r.held()), (3, 3));
        r.begin();
        write(&d, "cpu.pressure", &line.replace("total=5", "total=9"));
        let again = read_psi_dir(&d, Detail::Summary, &mut r).unwrap();
        assert_eq!(r.opened, 0, "read through the kept descriptors");
        assert_ne!(first.cpu, again.cpu, "fresh figures");
        assert_eq!(first.memory, again.memory);
        let _ = std::fs::remove_dir_all(d);
    }

    /// With the KubeletPSI gate off no pressure file is opened, on a
    /// hybrid host's unified mount as on v2.
    #[test]
    fn without_the_psi_gate_no_pressure_file_is_read() {
        let root = tempdir("psi-gate");
        let line = "some avg10=1.00 avg60=0.00 avg300=0.00 total=5\n";
        let cg = "kubepods/podu";
        write(&root.join("cpuacct").join(cg), "cpuacct.usage", "7\n");
        for dir in [root.join("unified").join(cg), root.join("v2").join(cg)] {
            for f in ["cpu.pressure", "memory.pressure", "io.pressure"] {
                write(&dir, f, line);
            }
        }
        let v1 = Hierarchy::V1 {
            roots: [("cpuacct".to_string(), root.join("cpuacct"))].into(),
            unified: Some(root.join("unified")),
        };
        let v2 = Hierarchy::V2 {
            root: root.join("v2"),
        };
        for h in [&v1, &v2] {
            let mut r = FileReader::new();
            let on = h.read_with(cg, Detail::Summary, &mut r);
            assert_eq!(on.psi.and_then(|p| p.io).map(|p| p.some.total), Some(5));
            let opened = r.opened;
            r.begin();
            r.psi = false;
            let off = h.read_with(cg, Detail::Summary, &mut r);
            assert_eq!(off.psi, None);
            assert_eq!(r.opened, opened - 3, "the three pressure files fewer");
        }
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_reused_file_goes_through_a_kept_descriptor_and_keeps_no_new_one() {
        let root = tempdir("reuse");
        let (pod, ctr) = (root.join("pod"), root.join("pod/ctr"));
        write(&pod, "pids.current", "3\n");
        write(&ctr, "pids.current", "2\n");
        write(&ctr, "pids.max", "max\n");
        let mut r = FileReader::keeping(10);
        // The summary keeps the pod's.
        assert_eq!(r.hot_u64(&pod, "pids.current"), Some(3));
        assert_eq!((r.opened, r.held()), (1, 1));
        write(&pod, "pids.current", "4\n");
        assert_eq!(r.reuse_u64(&pod, "pids.current"), Some(Some(4)));
        assert_eq!(r.opened, 1, "read through the kept descriptor");
        // The container's is opened per read and not kept...
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(2)));
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(2)));
        assert_eq!((r.opened, r.held()), (3, 1));
        // ...nor is its absence remembered; and the reader keeps new files
        // afterwards as before.
        assert_eq!(r.reuse_u64(&ctr, "pids.nope"), None);
        assert_eq!(r.reuse_u64(&ctr, "pids.max"), Some(None));
        assert_eq!(r.hot_u64(&ctr, "pids.current"), Some(2));
        assert_eq!(r.held(), 2);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn kept_files_are_read_again_without_opening_and_capped() {
        let root = tempdir("kept");
        let (a, b) = (root.join("a"), root.join("b"));
        write(&a, "memory.stat", "cache 1\n");
        write(&b, "memory.stat", "cache 2\n");
        let mut r = FileReader::keeping(1);
        assert_eq!(r.hot(&a, "memory.stat"), Some("cache 1\n"));
        assert_eq!((r.opened, r.held()), (1, 1));
        // Fresh figures from the same descriptor, read from offset 0.
        write(&a, "memory.stat", "cache 12345\n");
        assert_eq!(r.hot(&a, "memory.stat"), Some("cache 12345\n"));
        assert_eq!(r.opened, 1);
        // A file the cgroup lacks is remembered, not looked for again.
        assert_eq!(r.hot(&a, "memory.memsw.usage_in_bytes"), None);
        assert_eq!(r.hot(&a, "memory.memsw.usage_in_bytes"), None);
        assert_eq!((r.opened, r.held()), (2, 1));
        // Past the cap, files are opened per read.
        assert_eq!(r.hot(&b, "memory.stat"), Some("cache 2\n"));
        assert_eq!(r.hot(&b, "memory.stat"), Some("cache 2\n"));
        assert_eq!((r.opened, r.held()), (4, 1));
        // A missing directory is not remembered.
        assert_eq!(r.hot(&root.join("gone"), "memory.stat"), None);
        std::fs::create_dir_all(root.join("gone")).unwrap();
        write(&root.join("gone"), "memory.stat", "cache 3\n");
        assert_eq!(r.hot(&root.join("gone"), "memory.stat"), Some("cache 3\n"));
        // A plain reader keeps nothing.
        let mut plain = FileReader::new();
        assert_eq!(plain.hot(&a, "memory.stat"), Some("cache 12345\n"));
        assert_eq!(plain.held(), 0);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn directories_under_a_held_one_are_opened_relative_to_it() {
        let root = tempdir("dirs");
        let (a, ab, c) = (root.join("a"), root.join("a/b"), root.join("c"));
        write(&a, "x", "1\n");
        write(&ab, "x", "2\n");
        write(&c, "x", "3\n");
        let mut r = FileReader::new();
        assert_eq!(r.value(&a, "x"), Some("1\n"));
        assert_eq!(r.value(&ab, "x"), Some("2\n"));
        assert_eq!(r.value(&c, "x"), Some("3\n"));
        assert_eq!(r.value(&a, "x"), Some("1\n"));
        assert_eq!(r.value(&root.join("a/b/"), "x"), Some("2\n"));
        assert_eq!(r.value(&root.join("a/missing"), "x"), None);
        // Made again between collections: the new directory is read.
        std::fs::remove_dir_all(&ab).unwrap();
        write(&ab, "x", "4\n");
        r.begin();
        assert_eq!(r.value(&ab, "x"), Some("4\n"));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_sandboxs_net_dev_is_kept_by_sandbox_id_until_it_goes() {
        let me = std::process::id();
        let mut r = FileReader::keeping(4);
        let text = r.net_dev("sb1", |_| Some(me)).map(str::to_string);
        assert!(text.as_deref().is_some_and(|t| t.contains("Receive")));
        assert_eq!((r.opened, r.held()), (1, 1));
        // Read again through the kept file: no pid looked for.
        assert!(r.net_dev("sb1", |_| panic!("looked for")).is_some());
        assert_eq!(r.opened, 1);
        // The sandbox is gone from the lists: its file is closed.
        r.retain_net_devs(&|id| id != "sb1");
        assert_eq!(r.held(), 0);
        assert_eq!(r.net_dev("sb1", |_| None), None);
    }

    #[test]
    fn files_only_cadvisor_reads_are_kept_apart_while_it_reads_them() {
        let root = tempdir("warm");
        let (pod, ctr, sb) = (root.join("pod"), root.join("pod/ctr"), root.join("pod/sb"));
        for d in [&pod, &ctr, &sb] {
            write(d, "memory.stat", "cache 1\n");
            write(d, "memory.failcnt", "0\n");
            write(d, "cpuacct.stat", "user 1\nsystem 2\n");
            write(d, "pids.current", "1\n");
        }
        let mut r = FileReader::keeping(2);
        // Another endpoint's collection: opened per read, nothing kept.
        assert_eq!(r.warm_u64(&ctr, "memory.failcnt"), Some(0));
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(1)));
        assert_eq!((r.opened, r.held()), (2, 0));
        // cAdvisor's: kept in the warm tier, which has a cap of its own.
        r.begin();
        r.keep_warm(true);
        assert_eq!(r.hot(&ctr, "memory.stat"), Some("cache 1\n"));
        assert_eq!(r.warm_u64(&ctr, "memory.failcnt"), Some(0));
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(1)));
        assert_eq!(r.warm(&ctr, "cpuacct.stat"), Some("user 1\nsystem 2\n"));
        assert_eq!((r.opened, r.held()), (4, 4), "one hot, three warm");
        // A sandbox's files, even those every endpoint reads for a
        // container, go to the warm tier (full at half as many again as
        // the hot one: not kept).
        r.sandbox_files(true);
        assert_eq!(r.hot(&sb, "memory.stat"), Some("cache 1\n"));
        r.sandbox_files(false);
        assert_eq!(r.hot(&pod, "memory.stat"), Some("cache 1\n"));
        assert_eq!(r.held(), 5, "the pod's in the hot tier");
        write(&ctr, "memory.failcnt", "7\n");
        r.begin();
        r.keep_warm(true);
        assert_eq!(r.warm_u64(&ctr, "memory.failcnt"), Some(7));
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(1)));
        assert_eq!(r.hot(&ctr, "memory.stat"), Some("cache 1\n"));
        assert_eq!(r.opened, 0, "read through the kept descriptors");
        // Outside cAdvisor's collections a kept warm file is still read
        // through its descriptor (a pod's task count, which the summary
        // reads too), but its age is not renewed: past KEPT_IDLE the warm
        // tier closes while the hot one stays.
        r.begin();
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(1)));
        assert_eq!(r.opened, 0);
        let old = std::time::Instant::now()
            .checked_sub(KEPT_IDLE + std::time::Duration::from_secs(1))
            .expect("uptime past KEPT_IDLE");
        let k = r.kept.as_mut().unwrap();
        for d in k.dirs.values_mut().chain(k.warm.values_mut()) {
            d.used = old;
        }
        k.swept = old;
        assert_eq!(r.hot(&ctr, "memory.stat"), Some("cache 1\n"));
        assert_eq!(r.reuse_u64(&ctr, "pids.current"), Some(Some(1)));
        r.sweep();
        assert_eq!(r.held(), 1, "only the hot file read since");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn v2_figures_follow_cadvisor() {
        let root = tempdir("v2");
        let cg = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope";
        let d = root.join(&cg[1..]);
        write(
            &d,
            "cpu.stat",
            "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 4\nnr_throttled 1\n",
        );
        write(&d, "cpu.weight", "1\n");
        write(&d, "cpu.max", "50000 100000\n");
        write(&d, "memory.current", "8192\n");
        write(&d, "memory.max", "max\n");
        write(&d, "memory.swap.current", "0\n");
        write(
            &d,
            "memory.stat",
            "anon 4096\nfile 2048\ninactive_file 1024\npgfault 11\npgmajfault 1\nfile_mapped 3\n",
        );
        write(&d, "pids.current", "2\n");
        write(
            &d,
            "cpu.pressure",
            "some avg10=1.50 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n",
        );
        let h = Hierarchy::V2 { root: root.clone() };
        let s = h.read(cg);
        assert_eq!(s.cpu.unwrap().usage_ns, 2_000_000);
        assert_eq!(s.cpu.unwrap().user_ns, Some(1_500_000));
        assert_eq!(s.cpu_shares, Some(2), "weight 1 is shares 2");
        assert_eq!(s.cpu_quota, Some(50000));
        assert_eq!(s.cpu_period, Some(100000));
        assert_eq!(s.throttling, Some((4, 1)));
        let m = s.memory.unwrap();
        assert_eq!(m.working_set, 8192 - 1024);
        assert_eq!(m.rss, 4096);
        assert_eq!(m.cache, 2048);
        assert_eq!(m.limit, None, "max is unlimited");
        assert_eq!(m.swap, Some(0));
        assert_eq!(s.pids, Some(2));
        let psi = s.psi.unwrap().cpu.unwrap();
        assert_eq!(psi.some.total, 1234);
        assert_eq!(psi.some.avg10, 1.5);
        assert_eq!(psi.full.total, 99);
        assert!(s.psi.unwrap().memory.is_none());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_process_is_read_at_its_own_path_in_each_v1_controller() {
        let root = tempdir("proc");
        write(&root.join("cpuacct"), "cpuacct.usage", "500\n");
        write(&root.join("memory/svc"), "memory.usage_in_bytes", "300\n");
        let h = Hierarchy::V1 {
            roots: ["cpuacct", "memory"]
                .iter()
                .map(|c| (c.to_string(), root.join(c)))
                .collect(),
            unified: None,
        };
        let (name, s) = h
            .read_process("5:memory:/svc\n3:cpu,cpuacct:/\n0::/\n")
            .unwrap();
        assert_eq!(name, "/svc");
        assert_eq!(s.cpu.unwrap().usage_ns, 500);
        assert_eq!(s.memory.unwrap().usage, 300);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn proc_cgroup_picks_the_memory_or_unified_path() {
        let t = "4:memory:/system.slice/kubelet.service\n1:cpu,cpuacct:/\n0::/unified/x\n";
        assert_eq!(
            parse_proc_cgroup(t, false).as_deref(),
            Some("/system.slice/kubelet.service")
        );
        assert_eq!(parse_proc_cgroup(t, true).as_deref(), Some("/unified/x"));
    }
}
