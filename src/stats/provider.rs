//! The stats provider: one snapshot of node, pod and container figures,
//! taken on demand from the CRI (which pods and containers exist, their
//! writable layers, the image filesystem) and from cgroup and /proc files
//! (everything else). Concurrent scrapes within `CACHE_TTL` share one
//! snapshot; the previous CPU sample per cgroup is kept so usageNanoCores
//! is a rate over two samples, as cAdvisor computes it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::cgroup::{CgroupSample, CpuSample, Hierarchy, MemorySample};
use super::procfs::{self, FsFigures, Interface, Meminfo};
use crate::cri::{v1, ContainerState, ImageService, PodSandboxState, RuntimeService};

/// Scrapes closer together than this share one snapshot (metrics-server
/// and Prometheus scraping at once cost one collection).
pub const CACHE_TTL: Duration = Duration::from_secs(1);
/// The previous CPU sample is replaced only after this long, so a rate is
/// never taken over a window too short to mean anything.
const MIN_RATE_WINDOW_NS: i64 = 1_000_000_000;
/// Deadline for the file reads of one collection (a stuck cgroupfs read
/// must not hang the scrape forever).
const READ_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, thiserror::Error)]
pub enum StatsError {
    #[error("listing pods from the runtime: {0}")]
    Runtime(String),
    #[error("reading stats files: {0}")]
    Read(String),
}

/// What the provider needs from the kubelet's configuration.
#[derive(Debug, Clone, Default)]
pub struct StatsConfig {
    pub cgroup_root: String,
    pub systemd: bool,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
}

#[derive(Debug, Clone, Default)]
pub struct NodeRaw {
    pub root: CgroupSample,
    pub cpu_nano_cores: Option<u64>,
    /// Busy time from /proc/stat, when the root cgroup has no cpu figures.
    pub busy_ns: Option<u64>,
    pub meminfo: Meminfo,
    pub interfaces: Vec<Interface>,
    pub rootfs: Option<FsFigures>,
    pub rootfs_device: Option<String>,
    /// (figures of its file system, used bytes, inodes used) from ImageFsInfo.
    pub imagefs: Option<(FsFigures, Option<u64>, Option<u64>)>,
    pub imagefs_device: Option<String>,
    pub logs_fs: Option<FsFigures>,
    pub maxpid: Option<i64>,
    pub curproc: Option<i64>,
    pub boot_ns: i64,
}

/// A cgroup with its figures, for the system containers and cAdvisor's
/// intermediate cgroups (`/`, `/kubepods`, QoS classes).
#[derive(Debug, Clone, Default)]
pub struct CgroupRaw {
    pub name: String,
    pub sample: CgroupSample,
    pub cpu_nano_cores: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct ContainerRaw {
    pub id: String,
    pub name: String,
    pub image: String,
    pub created_ns: i64,
    pub cgroup: Option<String>,
    pub sample: CgroupSample,
    pub cpu_nano_cores: Option<u64>,
    /// Writable layer (used bytes, inodes used) from ListContainerStats.
    pub rootfs: Option<(Option<u64>, Option<u64>)>,
    pub logs: Option<(u64, u64)>,
}

#[derive(Debug, Clone, Default)]
pub struct PodRaw {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub sandbox_id: String,
    pub created_ns: i64,
    pub cgroup: Option<String>,
    pub sample: CgroupSample,
    pub cpu_nano_cores: Option<u64>,
    pub sandbox_cgroup: Option<String>,
    pub sandbox_sample: CgroupSample,
    pub interfaces: Vec<Interface>,
    pub containers: Vec<ContainerRaw>,
}

/// One collection.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When the files were read (Unix ns): every figure's `time`.
    pub time_ns: i64,
    /// Whether file-system figures were collected (not for cpu/memory only).
    pub full: bool,
    pub v2: bool,
    pub node: NodeRaw,
    /// `kubelet`, `runtime` and `pods` (absent when their cgroup is unknown).
    pub system: Vec<(String, CgroupRaw)>,
    /// `/`, the kubepods cgroup and the QoS cgroups that exist.
    pub hierarchy: Vec<CgroupRaw>,
    pub pods: Vec<PodRaw>,
    /// The pause image's name, for the sandboxes' cAdvisor `image` label.
    pub sandbox_image: String,
    /// OOM kills by cgroup name; None when not watched.
    pub oom: Option<HashMap<String, u64>>,
}

type CpuHistory = (Option<(i64, u64)>, (i64, u64));
type SharedSnapshot = Shared<BoxFuture<'static, Result<Arc<Snapshot>, StatsError>>>;

#[derive(Default)]
struct Inner {
    hierarchy: Mutex<Option<Hierarchy>>,
    /// cgroup (or container id) → the two latest kept (time ns,
    /// cumulative cpu ns) samples, at least `MIN_RATE_WINDOW_NS` apart.
    prev_cpu: Mutex<HashMap<String, CpuHistory>>,
    cache: Mutex<Option<(Instant, bool, SharedSnapshot)>>,
    /// The runtime's pid, and when /proc was last scanned for it.
    runtime_pid: Mutex<(Option<u32>, Option<std::time::Instant>)>,
    /// Overrides for tests (a fake cgroup tree).
    fixed_hierarchy: Option<Hierarchy>,
    /// OOM kills per cgroup, when the kmsg watcher runs.
    oom: Option<super::oom::OomCounts>,
}

/// Cheap to clone; one per kubelet.
#[derive(Clone, Default)]
pub struct StatsProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StatsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsProvider")
    }
}

impl StatsProvider {
    /// The kubelet's provider: the host's cgroups, and OOM kills counted
    /// from /dev/kmsg (a thread for the life of the process), system OOMs
    /// recorded as events on node `node_name`.
    pub fn with_oom_watcher(node_name: &str) -> Self {
        let counts = super::oom::OomCounts::default();
        let oom = super::oom::watch(counts.clone(), node_name.to_string()).then_some(counts);
        StatsProvider {
            inner: Arc::new(Inner {
                oom,
                ..Default::default()
            }),
        }
    }

    /// The OOM counts, when watched (tests record kills through it).
    pub fn oom_counts(&self) -> Option<super::oom::OomCounts> {
        self.inner.oom.clone()
    }

    /// A provider over a given cgroup tree instead of the host's, with OOM
    /// counts that tests fill in themselves.
    pub fn with_hierarchy_and_oom(h: Hierarchy) -> Self {
        StatsProvider {
            inner: Arc::new(Inner {
                fixed_hierarchy: Some(h),
                oom: Some(Default::default()),
                ..Default::default()
            }),
        }
    }

    /// A provider over a given cgroup tree instead of the host's (tests).
    pub fn with_hierarchy(h: Hierarchy) -> Self {
        StatsProvider {
            inner: Arc::new(Inner {
                fixed_hierarchy: Some(h),
                ..Default::default()
            }),
        }
    }

    /// A snapshot no older than `CACHE_TTL`, shared with concurrent callers.
    /// `full` asks for file-system figures too.
    pub async fn snapshot(
        &self,
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        cfg: StatsConfig,
        full: bool,
    ) -> Result<Arc<Snapshot>, StatsError> {
        let fut = {
            let mut cache = self.inner.cache.lock();
            match &*cache {
                Some((at, was_full, f)) if at.elapsed() < CACHE_TTL && (*was_full || !full) => {
                    f.clone()
                }
                _ => {
                    let inner = self.inner.clone();
                    let f = collect(inner, runtime, images, cfg, full).boxed().shared();
                    *cache = Some((Instant::now(), full, f.clone()));
                    f
                }
            }
        };
        fut.await
    }
}

/// The pod cgroup candidates for a UID, in QoS order (Guaranteed pods sit
/// directly under kubepods), as `cm::pod_cgroup_parent` names them.
fn pod_cgroup_candidates(cfg: &StatsConfig, uid: &str) -> Vec<String> {
    if cfg.systemd {
        let u = uid.replace('-', "_");
        vec![
            format!("/kubepods.slice/kubepods-pod{u}.slice"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"),
        ]
    } else {
        let k = kubepods(cfg);
        vec![
            format!("{k}/pod{uid}"),
            format!("{k}/burstable/pod{uid}"),
            format!("{k}/besteffort/pod{uid}"),
        ]
    }
}

fn kubepods(cfg: &StatsConfig) -> String {
    if cfg.systemd {
        return "/kubepods.slice".into();
    }
    let root = cfg.cgroup_root.trim_end_matches('/');
    format!("{root}/kubepods")
}

/// containerd's cgroup for a container under its pod's cgroup: the id for
/// cgroupfs, `cri-containerd-<id>.scope` for systemd.
fn container_cgroup(h: &Hierarchy, pod: &str, id: &str) -> Option<String> {
    [
        format!("{pod}/{id}"),
        format!("{pod}/cri-containerd-{id}.scope"),
    ]
    .into_iter()
    .find(|c| h.exists(c))
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

struct PodPlan {
    sandbox: v1::PodSandbox,
    containers: Vec<v1::Container>,
}

async fn collect(
    inner: Arc<Inner>,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    cfg: StatsConfig,
    full: bool,
) -> Result<Arc<Snapshot>, StatsError> {
    let sandboxes = runtime
        .list_pod_sandbox(None)
        .await
        .map_err(|e| StatsError::Runtime(e.to_string()))?;
    let containers = runtime
        .list_containers(None)
        .await
        .map_err(|e| StatsError::Runtime(e.to_string()))?;
    // The runtime lists a container's image as the ID the kubelet created
    // it with; cAdvisor labels it with the image's name.
    let image_list = if full {
        images.list_images().await.unwrap_or_default()
    } else {
        Vec::new()
    };
    let image_names: HashMap<String, String> = image_list
        .iter()
        .filter_map(|i| Some((i.id.clone(), i.repo_tags.first()?.clone())))
        .collect();
    // The sandbox (pause) image: the runtime pins it (containerd 1.7 does).
    // The CRI's sandbox list names no image; with other pinned images
    // around it stays unknown rather than guessed.
    let pinned: Vec<&String> = image_list
        .iter()
        .filter(|i| i.pinned)
        .filter_map(|i| i.repo_tags.first())
        .collect();
    let sandbox_image = match pinned.as_slice() {
        [one] => (*one).clone(),
        _ => String::new(),
    };
    let image_fs = if full {
        match images.image_fs_info().await {
            Ok(r) => r.image_filesystems.into_iter().next(),
            Err(e) => {
                tracing::debug!(error = %e, "ImageFsInfo failed");
                None
            }
        }
    } else {
        None
    };
    let mut plans: Vec<PodPlan> = sandboxes
        .into_iter()
        .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
        .map(|sandbox| PodPlan {
            sandbox,
            containers: Vec::new(),
        })
        .collect();
    for c in containers {
        if c.state != ContainerState::ContainerRunning as i32 {
            continue;
        }
        if let Some(p) = plans.iter_mut().find(|p| p.sandbox.id == c.pod_sandbox_id) {
            let mut c = c;
            if let Some(img) = c.image.as_mut() {
                if let Some(name) = image_names.get(&img.image) {
                    img.image = name.clone();
                }
            }
            p.containers.push(c);
        }
    }

    let inner2 = inner.clone();
    let mut snap = crate::blocking::run("stats/collect".into(), READ_DEADLINE, move || {
        read_files(&inner2, &cfg, plans, image_fs, full)
    })
    .await
    .map_err(|e| StatsError::Read(e.to_string()))?;
    snap.sandbox_image = sandbox_image;
    // CRI stats carry the writable layer (which no cgroup file has) and are
    // the fallback for cpu/memory where no cgroup was found. They cost the
    // runtime a cgroup read per container, so the cpu-and-memory form
    // (metrics-server's) asks only when a cgroup was missing.
    let need_cri = full
        || snap
            .pods
            .iter()
            .flat_map(|p| &p.containers)
            .any(|c| c.cgroup.is_none());
    if need_cri {
        match runtime.list_container_stats(None).await {
            Ok(v) => merge_cri(&mut snap, v),
            Err(e) => tracing::debug!(error = %e, "ListContainerStats failed; cgroup figures only"),
        }
    }
    if let Some(counts) = &inner.oom {
        let names: std::collections::HashSet<&str> = snap
            .hierarchy
            .iter()
            .map(|c| c.name.as_str())
            .chain(snap.system.iter().map(|(_, c)| c.name.as_str()))
            .chain(snap.pods.iter().flat_map(|p| {
                p.cgroup
                    .as_deref()
                    .into_iter()
                    .chain(p.sandbox_cgroup.as_deref())
                    .chain(p.containers.iter().filter_map(|c| c.cgroup.as_deref()))
            }))
            .collect();
        counts.retain(|k| names.contains(k));
        let map = names
            .iter()
            .map(|n| (n.to_string(), counts.get(n)))
            .collect();
        snap.oom = Some(map);
    }
    rates(&inner, &mut snap);
    Ok(Arc::new(snap))
}

/// The CRI's figures into the snapshot: writable layers, and cpu/memory
/// where no cgroup was read.
fn merge_cri(snap: &mut Snapshot, stats: Vec<v1::ContainerStats>) {
    let by_id: HashMap<String, v1::ContainerStats> = stats
        .into_iter()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
        .collect();
    for c in snap.pods.iter_mut().flat_map(|p| p.containers.iter_mut()) {
        let Some(s) = by_id.get(&c.id) else { continue };
        let fallback = sample_from_cri(s);
        if c.sample.cpu.is_none() {
            c.sample.cpu = fallback.cpu;
        }
        if c.sample.memory.is_none() {
            c.sample.memory = fallback.memory;
        }
        if c.cgroup.is_none() {
            c.cpu_nano_cores = s.cpu.as_ref().and_then(|u| opt_u64(&u.usage_nano_cores));
        }
        c.rootfs = s
            .writable_layer
            .as_ref()
            .map(|w| (opt_u64(&w.used_bytes), opt_u64(&w.inodes_used)));
    }
}

fn hierarchy(inner: &Inner) -> Hierarchy {
    if let Some(h) = &inner.fixed_hierarchy {
        return h.clone();
    }
    let mut g = inner.hierarchy.lock();
    g.get_or_insert_with(Hierarchy::detect).clone()
}

/// The runtime's pid, found once by name and re-found when it exits
/// (a scan of /proc comm files; no fork).
fn runtime_pid(inner: &Inner) -> Option<u32> {
    // A host without containerd (or one named otherwise) would cost a full
    // /proc scan per scrape: scan at most once a minute.
    const RESCAN: Duration = Duration::from_secs(60);
    let mut g = inner.runtime_pid.lock();
    if let Some(pid) = g.0 {
        if std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "containerd")
        {
            return Some(pid);
        }
    }
    if g.1.is_some_and(|at| at.elapsed() < RESCAN) {
        return None;
    }
    let found = std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "containerd").then_some(pid)
    });
    *g = (found, Some(std::time::Instant::now()));
    found
}

fn opt_u64(v: &Option<v1::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

/// CRI figures where no cgroup was found (another layout, or the fake).
fn sample_from_cri(s: &v1::ContainerStats) -> CgroupSample {
    let mut out = CgroupSample::default();
    if let Some(c) = &s.cpu {
        if let Some(u) = opt_u64(&c.usage_core_nano_seconds) {
            out.cpu = Some(CpuSample {
                usage_ns: u,
                ..Default::default()
            });
        }
    }
    if let Some(m) = &s.memory {
        if let Some(ws) = opt_u64(&m.working_set_bytes) {
            out.memory = Some(MemorySample {
                working_set: ws,
                usage: opt_u64(&m.usage_bytes).unwrap_or(ws),
                rss: opt_u64(&m.rss_bytes).unwrap_or(0),
                pgfault: opt_u64(&m.page_faults).unwrap_or(0),
                pgmajfault: opt_u64(&m.major_page_faults).unwrap_or(0),
                ..Default::default()
            });
        }
    }
    out
}

fn read_files(
    inner: &Inner,
    cfg: &StatsConfig,
    plans: Vec<PodPlan>,
    image_fs: Option<v1::FilesystemUsage>,
    full: bool,
) -> Snapshot {
    let h = hierarchy(inner);
    let v2 = h.is_v2();
    let time_ns = now_ns();
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let proc_stat = read("/proc/stat");
    let mut node = NodeRaw {
        root: h.read("/"),
        meminfo: procfs::parse_meminfo(&read("/proc/meminfo")),
        busy_ns: procfs::parse_proc_stat_busy_ns(&proc_stat),
        boot_ns: procfs::parse_btime(&proc_stat).unwrap_or(0) * 1_000_000_000,
        maxpid: read("/proc/sys/kernel/pid_max").trim().parse().ok(),
        curproc: procfs::parse_loadavg_procs(&read("/proc/loadavg")),
        ..Default::default()
    };
    if full {
        node.interfaces = procfs::parse_net_dev(&read("/proc/net/dev"));
        let mountinfo = read("/proc/self/mountinfo");
        node.rootfs = procfs::statvfs(&cfg.root_dir);
        node.rootfs_device = procfs::device_of(&mountinfo, &cfg.root_dir);
        node.logs_fs = procfs::statvfs(&cfg.pod_logs_dir);
        if let Some(fs) = &image_fs {
            let mp = fs.fs_id.as_ref().map(|f| PathBuf::from(&f.mountpoint));
            if let Some(figs) = mp.as_deref().and_then(procfs::statvfs) {
                node.imagefs = Some((figs, opt_u64(&fs.used_bytes), opt_u64(&fs.inodes_used)));
                node.imagefs_device = mp.as_deref().and_then(|m| procfs::device_of(&mountinfo, m));
            }
        }
    }

    let kp = kubepods(cfg);
    let mut system = Vec::new();
    let by_process = |pid: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let (name, sample) = h.read_process(&text)?;
        Some(CgroupRaw {
            name,
            sample,
            cpu_nano_cores: None,
        })
    };
    if let Some(c) = by_process("self") {
        system.push(("kubelet".to_string(), c));
    }
    if let Some(c) = runtime_pid(inner).and_then(|p| by_process(&p.to_string())) {
        system.push(("runtime".to_string(), c));
    }
    let mut hier = vec![CgroupRaw {
        name: "/".into(),
        sample: node.root.clone(),
        cpu_nano_cores: None,
    }];
    if h.exists(&kp) {
        system.push(("pods".to_string(), raw(&h, &kp)));
        hier.push(raw(&h, &kp));
        for q in ["burstable", "besteffort"] {
            let name = if cfg.systemd {
                format!("{kp}/kubepods-{q}.slice")
            } else {
                format!("{kp}/{q}")
            };
            if h.exists(&name) {
                hier.push(raw(&h, &name));
            }
        }
    }

    let mut pods = Vec::with_capacity(plans.len());
    for plan in plans {
        let md = plan.sandbox.metadata.clone().unwrap_or_default();
        let cgroup = pod_cgroup_candidates(cfg, &md.uid)
            .into_iter()
            .find(|c| h.exists(c));
        let mut pod = PodRaw {
            name: md.name.clone(),
            namespace: md.namespace.clone(),
            uid: md.uid.clone(),
            sandbox_id: plan.sandbox.id.clone(),
            created_ns: plan.sandbox.created_at,
            ..Default::default()
        };
        if let Some(cg) = &cgroup {
            pod.sample = h.read(cg);
            pod.sandbox_cgroup = container_cgroup(&h, cg, &plan.sandbox.id);
            if let Some(sc) = &pod.sandbox_cgroup {
                pod.sandbox_sample = h.read(sc);
            }
            if full {
                // The pause process holds the pod's network namespace.
                let pid = pod
                    .sandbox_cgroup
                    .as_deref()
                    .and_then(|sc| h.procs(sc).into_iter().next())
                    .or_else(|| h.procs(cg).into_iter().next());
                if let Some(pid) = pid {
                    pod.interfaces = procfs::parse_net_dev(&read(&format!("/proc/{pid}/net/dev")));
                }
            }
        }
        pod.cgroup = cgroup;
        for c in plan.containers {
            let cmd = c.metadata.clone().unwrap_or_default();
            let ccg = pod
                .cgroup
                .as_deref()
                .and_then(|p| container_cgroup(&h, p, &c.id));
            let sample = ccg.as_deref().map(|g| h.read(g)).unwrap_or_default();
            let logs = full
                .then(|| {
                    procfs::dir_usage(
                        &cfg.pod_logs_dir
                            .join(format!("{}_{}_{}", md.namespace, md.name, md.uid))
                            .join(&cmd.name),
                    )
                })
                .flatten();
            pod.containers.push(ContainerRaw {
                id: c.id.clone(),
                name: cmd.name,
                image: c
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                created_ns: c.created_at,
                cgroup: ccg,
                sample,
                cpu_nano_cores: None,
                rootfs: None,
                logs,
            });
        }
        pods.push(pod);
    }
    Snapshot {
        time_ns,
        full,
        v2,
        node,
        system,
        hierarchy: hier,
        pods,
        sandbox_image: String::new(),
        oom: None,
    }
}

fn raw(h: &Hierarchy, name: &str) -> CgroupRaw {
    CgroupRaw {
        name: name.to_string(),
        sample: h.read(name),
        cpu_nano_cores: None,
    }
}

/// usageNanoCores from the previous sample of each cgroup; the previous
/// samples of cgroups that are gone are dropped.
fn rates(inner: &Inner, snap: &mut Snapshot) {
    let t = snap.time_ns;
    let mut prev = inner.prev_cpu.lock();
    let mut seen: std::collections::HashSet<String> = Default::default();
    let mut rate = |key: String, cpu: Option<CpuSample>| -> Option<u64> {
        let cur = (t, cpu?.usage_ns);
        let per_sec = |(pt, pu): (i64, u64)| {
            (t > pt && cur.1 >= pu)
                .then(|| ((cur.1 - pu) as u128 * 1_000_000_000 / (t - pt) as u128) as u64)
        };
        let out = match prev.get_mut(&key) {
            None => {
                prev.insert(key.clone(), (None, cur));
                None
            }
            Some((older, newer)) if t - newer.0 >= MIN_RATE_WINDOW_NS => {
                let r = per_sec(*newer);
                *older = Some(*newer);
                *newer = cur;
                r
            }
            // Too soon after the last sample: rate over the one before it.
            Some((older, _)) => older.and_then(per_sec),
        };
        seen.insert(key);
        out
    };
    let node_cpu = snap.node.root.cpu.or(snap.node.busy_ns.map(|u| CpuSample {
        usage_ns: u,
        ..Default::default()
    }));
    snap.node.cpu_nano_cores = rate("node".into(), node_cpu);
    for (name, c) in snap.system.iter_mut() {
        c.cpu_nano_cores = rate(format!("sys:{name}"), c.sample.cpu);
    }
    for c in snap.hierarchy.iter_mut() {
        c.cpu_nano_cores = rate(format!("cg:{}", c.name), c.sample.cpu);
    }
    for p in snap.pods.iter_mut() {
        p.cpu_nano_cores = rate(format!("pod:{}", p.uid), p.sample.cpu);
        for c in p.containers.iter_mut() {
            let r = rate(format!("ctr:{}", c.id), c.sample.cpu);
            if c.cpu_nano_cores.is_none() {
                c.cpu_nano_cores = r;
            }
        }
    }
    prev.retain(|k, _| seen.contains(k));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap_at(t: i64, usage: u64) -> Snapshot {
        Snapshot {
            time_ns: t,
            pods: vec![PodRaw {
                uid: "u".into(),
                containers: vec![ContainerRaw {
                    id: "c".into(),
                    sample: CgroupSample {
                        cpu: Some(CpuSample {
                            usage_ns: usage,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn usage_nano_cores_is_a_rate_over_the_previous_sample() {
        let inner = Inner::default();
        let rate = |s: &Snapshot| s.pods[0].containers[0].cpu_nano_cores;
        let mut a = snap_at(10_000_000_000, 1_000_000_000);
        rates(&inner, &mut a);
        assert_eq!(rate(&a), None, "one sample has no rate");
        // Half a core over 2 s.
        let mut b = snap_at(12_000_000_000, 2_000_000_000);
        rates(&inner, &mut b);
        assert_eq!(rate(&b), Some(500_000_000));
        // 100 ms later: too short a window; the rate is taken over the
        // sample before (2.1 s back).
        let mut c = snap_at(12_100_000_000, 2_100_000_000);
        rates(&inner, &mut c);
        assert_eq!(
            rate(&c),
            Some(1_100_000_000 * 1_000_000_000 / 2_100_000_000)
        );
        // A container that disappears loses its previous sample.
        let mut empty = Snapshot {
            time_ns: 20_000_000_000,
            ..Default::default()
        };
        rates(&inner, &mut empty);
        assert!(!inner.prev_cpu.lock().contains_key("ctr:c"));
    }
}
