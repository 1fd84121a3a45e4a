//! The stats provider: one snapshot of node, pod and container figures,
//! taken on demand from the CRI (which pods and containers exist, their
//! writable layers, the image filesystem) and from cgroup and /proc files
//! (everything else). Concurrent scrapes within `CACHE_TTL` share one
//! snapshot; the previous CPU sample per cgroup is kept so usageNanoCores
//! is a rate over two samples, as cAdvisor computes it. Each scrape reads
//! only the cgroup files its output shows (`Detail`); the CRI answers that
//! change slowly (lists, writable layers, image figures) are cached, see
//! `LIST_MAX_AGE`, `DISK_PERIOD` and `IMAGES_PERIOD`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::blkio::DiskNames;
use super::cgroup::{CgroupSample, CpuSample, Detail, FileReader, Hierarchy, MemorySample};
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
/// How long a collection waits for another to finish with the reader that
/// keeps files open before reading with one of its own (a collection takes
/// 5 to 30 ms at 110 pods; longer means something is stuck).
const TURN_WAIT: Duration = Duration::from_secs(1);
/// From this many pods cAdvisor's collection reads on two threads (see
/// `read_files`); below it a thread's start costs more than it saves.
const PARALLEL_MIN_PODS: usize = 16;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StatsError {
    #[error("listing pods from the runtime: {0}")]
    Runtime(String),
    #[error("reading stats files: {0}")]
    Read(String),
}

/// What the provider needs from the kubelet's configuration.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    pub cgroup_root: String,
    pub systemd: bool,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    /// The KubeletPSI feature gate: pressure figures are read (and
    /// reported) only with it on, as upstream gates them in the summary
    /// and cAdvisor's text; off, no pressure file is opened.
    pub psi: bool,
}

impl Default for StatsConfig {
    /// Upstream's defaults: the KubeletPSI gate is on (beta since v1.34).
    fn default() -> Self {
        StatsConfig {
            cgroup_root: String::new(),
            systemd: false,
            root_dir: PathBuf::new(),
            pod_logs_dir: PathBuf::new(),
            psi: true,
        }
    }
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
    /// The usage is kept when the file system cannot be looked at, as
    /// upstream's ImageFsStats gives a best-effort partial result then.
    pub imagefs: Option<(Option<FsFigures>, Option<u64>, Option<u64>)>,
    pub imagefs_device: Option<String>,
    pub logs_fs: Option<FsFigures>,
    /// Every file system cAdvisor's fsInfo knows, with its diskstats (the
    /// root container's `container_fs_*` on /metrics/cadvisor).
    pub filesystems: Vec<procfs::FsStat>,
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
    /// Bytes and inodes of the pod's managed hosts file (full collections),
    /// part of its ephemeral storage as upstream's getPodEtcHostsStats.
    pub etc_hosts: Option<(u64, u64)>,
}

/// One collection.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When the files were read (Unix ns): every figure's `time`.
    pub time_ns: i64,
    /// Whether file-system figures were collected (not for cpu/memory only).
    pub full: bool,
    /// How much of each cgroup was read.
    pub detail: Detail,
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
    /// Block device names by major:minor, for per-device I/O (cAdvisor's
    /// text only).
    pub disk_names: Arc<DiskNames>,
}

type CpuHistory = (Option<(i64, u64)>, (i64, u64));
/// Each cgroup's `CpuHistory`, stamped with the last collection that saw it.
type CpuHistories = foldhash::HashMap<String, (CpuHistory, u64)>;
/// A path's st_dev, when its mount source was found, and the source.
type KnownDevice = (u64, Instant, Option<String>);
type SharedSnapshot = Shared<BoxFuture<'static, Result<Arc<Snapshot>, StatsError>>>;

/// How long the sandbox and container lists are reused while the PLEG's
/// relists show no change. The PLEG relists every second and sees every
/// sandbox and container that carries a pod UID label (all the kubelet's),
/// so for those a change means a fresh list at the next scrape; this bounds
/// how late anything else (a sandbox made with `crictl runp`) shows up.
/// Without a PLEG (or with an unhealthy one) lists live no longer than a
/// snapshot.
const LIST_MAX_AGE: Duration = Duration::from_secs(30);
/// Writable layers (ListContainerStats) and the image file system's usage
/// (ImageFsInfo) are refreshed in the background this long after the last
/// refresh, when a full scrape finds them older; until the refresh lands
/// scrapes serve the previous figures. Disk usage changes slowly, and
/// upstream's cAdvisor measures it on its own one-minute period
/// (`common.DefaultPeriod` of its fs handler) rather than per scrape; here
/// a refresh costs containerd a metrics round trip to every container's
/// shim, which is most of what a full scrape cost it (ImageFsInfo is cheap,
/// under 1 ms, as containerd answers it from its own snapshot usage; it
/// rides along so a full scrape makes no CRI call at all). A container the
/// cache has not seen yet is asked about at once (filtered by its id), so
/// a new container has its rootfs from its first scrape on.
pub const DISK_PERIOD: Duration = Duration::from_secs(60);
/// The image list (names for cAdvisor's `image` label, the pinned pause
/// image): asked again at once when a container runs an image ID it does
/// not name (at most every `IMAGES_MIN_GAP`), otherwise every
/// `IMAGES_PERIOD` (a retag).
const IMAGES_PERIOD: Duration = Duration::from_secs(300);
const IMAGES_MIN_GAP: Duration = Duration::from_secs(10);
/// Up to this many containers missing from the caches (new, or without a
/// cgroup) are asked about one by one; more, and one full list is cheaper.
const MAX_FILTERED_STATS: usize = 8;

/// Whether a snapshot of `d` carries file-system and network figures (the
/// full summary's and cAdvisor's).
fn is_full(d: Detail) -> bool {
    d >= Detail::Summary
}

/// One pod as the lists show it: what the snapshot needs of a ready
/// sandbox and its running containers.
#[derive(Debug, Clone, Default)]
struct PodPlan {
    name: String,
    namespace: String,
    uid: String,
    sandbox_id: String,
    created_ns: i64,
    containers: Vec<ContainerPlan>,
}

#[derive(Debug, Clone, Default)]
struct ContainerPlan {
    id: String,
    name: String,
    /// As the runtime lists it (the image ID the kubelet created it with).
    image: String,
    created_ns: i64,
}

/// The last sandbox and container lists, as pod plans.
struct Lists {
    at: Instant,
    /// The PLEG's snapshot when these were listed.
    pleg: Option<Arc<crate::pleg::Snapshot>>,
    plans: Arc<Vec<PodPlan>>,
}

/// A writable layer: (used bytes, inodes used).
type Layer = (Option<u64>, Option<u64>);

#[derive(Default)]
struct DiskCache {
    /// Writable layer by container id: (used bytes, inodes used); `None`
    /// when the runtime reported none.
    layers: HashMap<String, Option<Layer>>,
    layers_at: Option<Instant>,
    image_fs: Option<v1::FilesystemUsage>,
    image_fs_at: Option<Instant>,
    /// A background refresh is under way.
    refreshing: bool,
}

impl DiskCache {
    fn set_layers(&mut self, stats: &[v1::ContainerStats]) {
        self.layers = stats
            .iter()
            .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), layer(s))))
            .collect();
        self.layers_at = Some(Instant::now());
    }
}

fn layer(s: &v1::ContainerStats) -> Option<Layer> {
    s.writable_layer
        .as_ref()
        .map(|w| (opt_u64(&w.used_bytes), opt_u64(&w.inodes_used)))
}

struct ImageCache {
    at: Instant,
    /// Image ID → its first tag.
    names: Arc<HashMap<String, String>>,
    sandbox_image: String,
}

/// Resolved cgroup names, so a scrape does not look for each one again
/// (pods never change QoS class, containers never move). An entry whose
/// cgroup reads nothing is dropped and looked for again.
#[derive(Default)]
struct PathCache {
    /// Pod UID → pod cgroup.
    pods: foldhash::HashMap<String, String>,
    /// Container or sandbox id → its cgroup.
    containers: foldhash::HashMap<String, String>,
}

#[derive(Default)]
struct Inner {
    hierarchy: Mutex<Option<Hierarchy>>,
    /// cgroup (or container id) → the two latest kept (time ns,
    /// cumulative cpu ns) samples, at least `MIN_RATE_WINDOW_NS` apart.
    /// The number of the last collection, and each entry stamped with the
    /// last collection that saw it.
    prev_cpu: Mutex<(u64, CpuHistories)>,
    cache: Mutex<Option<(Instant, Detail, SharedSnapshot)>>,
    lists: Mutex<Option<Lists>>,
    disk: Mutex<DiskCache>,
    images: Mutex<Option<ImageCache>>,
    /// Each reader's resolved cgroups.
    paths: Mutex<[PathCache; 2]>,
    /// The cgroup file readers, with the files they keep open, each for
    /// half of the pods (see `assign_halves`); locked by the collection reading
    /// through them (see `with_readers`).
    reader: Mutex<Option<[FileReader; 2]>>,
    /// Pod volume usage, measured in the background.
    volumes: super::volumes::VolumeStatsCache,
    /// Boot time (Unix ns), from /proc/stat once.
    boot_ns: std::sync::OnceLock<i64>,
    /// Mount source by path, with the path's st_dev and when it was found
    /// (see `devices_of`).
    devices: Mutex<HashMap<PathBuf, KnownDevice>>,
    /// The runtime's pid, and when /proc was last scanned for it.
    runtime_pid: Mutex<(Option<u32>, Option<std::time::Instant>)>,
    /// Block device names and when /sys/block was read for them.
    disk_names: Mutex<Option<(Instant, Arc<DiskNames>)>>,
    /// Overrides for tests (a fake cgroup tree).
    fixed_hierarchy: Option<Hierarchy>,
    /// OOM kills per cgroup, when the kmsg watcher runs.
    oom: Option<super::oom::OomCounts>,
    /// The file systems of the root container's figures, from mountinfo
    /// once: cAdvisor's fsInfo lists its partitions once, at start.
    partitions: std::sync::OnceLock<Vec<procfs::Partition>>,
    /// statfs of those partitions (see `GLOBAL_FS_MAX_AGE`).
    statfs: Mutex<StatfsCache>,
    /// When each endpoint's scrapes came, for collections made ahead of
    /// steady ones (see `cadence`), and its wake-up when one comes.
    cadences: Mutex<super::cadence::Cadences>,
    scraped: tokio::sync::Notify,
    ahead_text: Mutex<super::AheadText>,
}

/// statfs answers by mount point, dropped together once `GLOBAL_FS_MAX_AGE`
/// old.
#[derive(Default)]
struct StatfsCache {
    at: Option<Instant>,
    figures: HashMap<PathBuf, procfs::Statfs>,
}

impl StatfsCache {
    /// `path`'s answer: the cached one while the cache is younger than
    /// `GLOBAL_FS_MAX_AGE` at `now`, else `statfs`'s.
    fn get(
        &mut self,
        now: Instant,
        path: &Path,
        statfs: impl FnOnce(&Path) -> procfs::Statfs,
    ) -> procfs::Statfs {
        if self
            .at
            .is_none_or(|at| now.duration_since(at) >= GLOBAL_FS_MAX_AGE)
        {
            self.figures.clear();
            self.at = Some(now);
        }
        if let Some(known) = self.figures.get(path) {
            return known.clone();
        }
        let fresh = statfs(path);
        self.figures.insert(path.to_path_buf(), fresh.clone());
        fresh
    }
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

/// Where the provider gets pods and figures from.
#[derive(Clone)]
pub struct Sources {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
    /// The PLEG, whose relists tell when the CRI lists need asking again.
    pub pleg: Option<crate::pleg::PlegHandle>,
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

    /// Lists the root container's file systems now (blocking), as
    /// cAdvisor's fsInfo does when the kubelet starts: the mounts of pods
    /// started later are not among them, as upstream.
    pub fn list_file_systems(&self) {
        partitions(&self.inner);
    }

    /// The OOM counts, when watched (tests record kills through it).
    /// The pod volume figures the background calculation keeps.
    pub fn volume_stats(&self) -> &super::volumes::VolumeStatsCache {
        &self.inner.volumes
    }

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

    /// The node's own figures and no pod's (the summary's node part with
    /// its system containers, and the root and image file systems'
    /// devices): the eviction manager's rounds, which look at pods only
    /// when a threshold or a pod's own storage limit calls for it. Neither
    /// cached nor shared and without CPU rates, so the scrapes' snapshots
    /// and rates are left as they are.
    pub async fn node_snapshot(
        &self,
        src: Sources,
        cfg: StatsConfig,
    ) -> Result<Snapshot, StatsError> {
        let inner = self.inner.clone();
        let image = image_fs(&inner, &src).await;
        crate::blocking::run("stats/node".into(), READ_DEADLINE, move || {
            with_readers(&inner, |rs| {
                let r = &mut rs[0];
                r.begin();
                r.psi = cfg.psi;
                let h = hierarchy(&inner);
                let mount = image
                    .as_ref()
                    .and_then(|fs| fs.fs_id.as_ref())
                    .map(|f| PathBuf::from(&f.mountpoint));
                let part = read_node(&inner, &h, &cfg, image, Detail::Summary, r);
                r.sweep();
                let mut node = part.node;
                let mut paths = vec![cfg.root_dir.as_path()];
                paths.extend(mount.as_deref());
                let mut devs = devices_of(&inner, &paths).into_iter();
                node.rootfs_device = devs.next().flatten();
                node.imagefs_device = devs.next().flatten();
                Snapshot {
                    time_ns: part.time_ns,
                    full: true,
                    detail: Detail::Summary,
                    v2: h.is_v2(),
                    node,
                    system: part.system,
                    hierarchy: part.hierarchy,
                    pods: Vec::new(),
                    sandbox_image: String::new(),
                    oom: None,
                    disk_names: Arc::default(),
                }
            })
        })
        .await
        .map_err(|e| StatsError::Read(e.to_string()))
    }

    /// Forgets the last snapshot, so the next scrape collects (tests).
    #[cfg(test)]
    pub(crate) fn expire(&self) {
        *self.inner.cache.lock() = None;
    }

    /// Makes the cached disk figures `by` older (tests).
    #[cfg(test)]
    pub(crate) fn age_disk(&self, by: Duration) {
        let mut d = self.inner.disk.lock();
        d.layers_at = d.layers_at.map(|t| t - by);
        d.image_fs_at = d.image_fs_at.map(|t| t - by);
    }

    /// Whether a background disk refresh is under way (tests).
    #[cfg(test)]
    pub(crate) fn refreshing(&self) -> bool {
        self.inner.disk.lock().refreshing
    }

    /// `client`'s scrape of `e` arrived: its time goes into that client's
    /// cadence.
    pub fn scraped(&self, e: super::cadence::Endpoint, client: super::cadence::Client) {
        self.inner
            .cadences
            .lock()
            .arrived(e, client, Instant::now());
        self.inner.scraped.notify_one();
    }

    /// Collects (through `collect`) ahead of each scrape that comes at a
    /// steady period, until `token` is cancelled (see `cadence::run`).
    pub async fn collect_ahead<F, Fut>(
        &self,
        collect: F,
        expire: impl Fn(),
        token: tokio_util::sync::CancellationToken,
    ) where
        F: Fn(super::cadence::Endpoint, super::cadence::Client) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let i = &self.inner;
        super::cadence::run(&i.cadences, &i.scraped, collect, expire, token).await
    }

    /// cAdvisor's text made ahead of a steady scrape (see `AheadText`).
    pub(crate) fn ahead_text(&self) -> &Mutex<super::AheadText> {
        &self.inner.ahead_text
    }

    /// A snapshot no older than `CACHE_TTL` with at least `detail`, shared
    /// with concurrent callers.
    pub async fn snapshot(
        &self,
        src: Sources,
        cfg: StatsConfig,
        detail: Detail,
    ) -> Result<Arc<Snapshot>, StatsError> {
        let fut = {
            let mut cache = self.inner.cache.lock();
            match &*cache {
                Some((at, had, f)) if at.elapsed() < CACHE_TTL && *had >= detail => f.clone(),
                _ => {
                    let inner = self.inner.clone();
                    let f = collect(inner, src, cfg, detail).boxed().shared();
                    *cache = Some((Instant::now(), detail, f.clone()));
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

/// The burstable and besteffort QoS cgroups.
fn qos_cgroups(cfg: &StatsConfig) -> [String; 2] {
    let kp = kubepods(cfg);
    ["burstable", "besteffort"].map(|q| {
        if cfg.systemd {
            format!("{kp}/kubepods-{q}.slice")
        } else {
            format!("{kp}/{q}")
        }
    })
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

/// The ready sandboxes and their running containers: from the last lists
/// while the PLEG saw no change since (and they are younger than
/// `LIST_MAX_AGE`), otherwise listed again.
async fn pod_plans(inner: &Inner, src: &Sources) -> Result<Arc<Vec<PodPlan>>, StatsError> {
    // A healthy PLEG's snapshot, taken before listing: a change the PLEG
    // sees after this differs from it and forces the next list.
    let pleg = src
        .pleg
        .as_ref()
        .filter(|p| p.healthy().is_ok())
        .map(|p| p.snapshot());
    if let (Some(now), Some(l)) = (&pleg, &*inner.lists.lock()) {
        let same = l
            .pleg
            .as_ref()
            // The PLEG replaces its snapshot only when a relist differs.
            .is_some_and(|was| Arc::ptr_eq(was, now));
        if same && l.at.elapsed() < LIST_MAX_AGE {
            return Ok(l.plans.clone());
        }
    }
    let sandboxes = src
        .runtime
        .list_pod_sandbox(None)
        .await
        .map_err(|e| StatsError::Runtime(e.to_string()))?;
    let containers = src
        .runtime
        .list_containers(None)
        .await
        .map_err(|e| StatsError::Runtime(e.to_string()))?;
    let mut plans: Vec<PodPlan> = sandboxes
        .into_iter()
        .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
        .map(|s| {
            let md = s.metadata.unwrap_or_default();
            PodPlan {
                name: md.name,
                namespace: md.namespace,
                uid: md.uid,
                sandbox_id: s.id,
                created_ns: s.created_at,
                containers: Vec::new(),
            }
        })
        .collect();
    let index: HashMap<String, usize> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| (p.sandbox_id.clone(), i))
        .collect();
    for c in containers {
        if c.state != ContainerState::ContainerRunning as i32 {
            continue;
        }
        if let Some(&i) = index.get(&c.pod_sandbox_id) {
            plans[i].containers.push(ContainerPlan {
                id: c.id,
                name: c.metadata.map(|m| m.name).unwrap_or_default(),
                image: c.image.map(|i| i.image).unwrap_or_default(),
                created_ns: c.created_at,
            });
        }
    }
    let plans = Arc::new(plans);
    *inner.lists.lock() = Some(Lists {
        at: Instant::now(),
        pleg,
        plans: plans.clone(),
    });
    Ok(plans)
}

/// Image names by ID and the pause image, from the cached image list; asked
/// again when stale, or when a running container's image is not named and
/// the list is older than `IMAGES_MIN_GAP`.
async fn image_names(
    inner: &Inner,
    src: &Sources,
    plans: &[PodPlan],
) -> (Arc<HashMap<String, String>>, String) {
    let fresh = {
        let g = inner.images.lock();
        g.as_ref().and_then(|c| {
            let age = c.at.elapsed();
            let unknown = || {
                plans
                    .iter()
                    .flat_map(|p| &p.containers)
                    .any(|c2| !c.names.contains_key(&c2.image))
            };
            (age < IMAGES_PERIOD && (age < IMAGES_MIN_GAP || !unknown()))
                .then(|| (c.names.clone(), c.sandbox_image.clone()))
        })
    };
    if let Some(v) = fresh {
        return v;
    }
    let list = src.images.list_images().await.unwrap_or_default();
    let names: Arc<HashMap<String, String>> = Arc::new(
        list.iter()
            .filter_map(|i| Some((i.id.clone(), i.repo_tags.first()?.clone())))
            .collect(),
    );
    // The sandbox (pause) image: the runtime pins it (containerd 1.7 does).
    // The CRI's sandbox list names no image; with other pinned images
    // around it stays unknown rather than guessed.
    let pinned: Vec<&String> = list
        .iter()
        .filter(|i| i.pinned)
        .filter_map(|i| i.repo_tags.first())
        .collect();
    let sandbox_image = match pinned.as_slice() {
        [one] => (*one).clone(),
        _ => String::new(),
    };
    *inner.images.lock() = Some(ImageCache {
        at: Instant::now(),
        names: names.clone(),
        sandbox_image: sandbox_image.clone(),
    });
    (names, sandbox_image)
}

/// Clears `DiskCache::refreshing` however the refresh ends.
struct RefreshGuard(Arc<Inner>);

impl Drop for RefreshGuard {
    fn drop(&mut self) {
        self.0.disk.lock().refreshing = false;
    }
}

/// Starts a background refresh of the writable layers and the image file
/// system unless one is under way. Async CRI calls on a task of their own:
/// the scrape that started it does not wait.
fn refresh_disk_in_background(inner: &Arc<Inner>, src: &Sources) {
    {
        let mut d = inner.disk.lock();
        if d.refreshing {
            return;
        }
        d.refreshing = true;
    }
    let guard = RefreshGuard(inner.clone());
    let src = src.clone();
    tokio::spawn(async move {
        let stats = src.runtime.list_container_stats(None).await;
        let fs = src.images.image_fs_info().await;
        let mut d = guard.0.disk.lock();
        match stats {
            Ok(v) => d.set_layers(&v),
            Err(e) => {
                tracing::debug!(error = %e, "ListContainerStats failed; keeping the last writable layers");
                d.layers_at = Some(Instant::now());
            }
        }
        match fs {
            Ok(r) => d.image_fs = r.image_filesystems.into_iter().next(),
            Err(e) => tracing::debug!(error = %e, "ImageFsInfo failed; keeping the last figures"),
        }
        d.image_fs_at = Some(Instant::now());
    });
}

async fn collect(
    inner: Arc<Inner>,
    src: Sources,
    cfg: StatsConfig,
    detail: Detail,
) -> Result<Arc<Snapshot>, StatsError> {
    let started = Instant::now();
    let full = is_full(detail);
    let plans = pod_plans(&inner, &src).await?;
    // The runtime lists a container's image as the ID the kubelet created
    // it with; cAdvisor labels it with the image's name.
    let (names, sandbox_image) = if detail == Detail::Full {
        image_names(&inner, &src, &plans).await
    } else {
        Default::default()
    };
    let image_fs = if full {
        image_fs(&inner, &src).await
    } else {
        None
    };

    let inner2 = inner.clone();
    let mut snap = crate::blocking::run("stats/collect".into(), READ_DEADLINE, move || {
        with_readers(&inner2, |rs| {
            read_files(&inner2, rs, &cfg, &plans, &names, image_fs, detail)
        })
    })
    .await
    .map_err(|e| StatsError::Read(e.to_string()))?;
    snap.sandbox_image = sandbox_image;
    cri_figures(&inner, &src, &mut snap).await;
    // OOM counts are cAdvisor's; only its snapshot names every cgroup.
    if detail == Detail::Full {
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
    }
    rates(&inner, &mut snap, detail);
    inner.cadences.lock().collected(detail, started.elapsed());
    Ok(Arc::new(snap))
}

/// The image file system as ImageFsInfo last gave it (refreshed in the
/// background once `DISK_PERIOD` old; the first caller waits for it).
async fn image_fs(inner: &Arc<Inner>, src: &Sources) -> Option<v1::FilesystemUsage> {
    let (cached, stale) = {
        let d = inner.disk.lock();
        (
            d.image_fs_at.map(|_| d.image_fs.clone()),
            d.image_fs_at.is_none_or(|at| at.elapsed() >= DISK_PERIOD),
        )
    };
    match cached {
        Some(fs) => {
            if stale {
                refresh_disk_in_background(inner, src);
            }
            fs
        }
        None => {
            let fs = match src.images.image_fs_info().await {
                Ok(r) => r.image_filesystems.into_iter().next(),
                Err(e) => {
                    tracing::debug!(error = %e, "ImageFsInfo failed");
                    None
                }
            };
            let mut d = inner.disk.lock();
            d.image_fs = fs.clone();
            d.image_fs_at = Some(Instant::now());
            fs
        }
    }
}

/// The CRI's figures: writable layers for the full form (from the cache,
/// see `DISK_PERIOD`), and cpu/memory for containers whose cgroup was not
/// found (asked each time: those figures are live).
async fn cri_figures(inner: &Arc<Inner>, src: &Sources, snap: &mut Snapshot) {
    let full = snap.full;
    let ctrs = || snap.pods.iter().flat_map(|p| &p.containers);
    let no_cgroup: Vec<String> = ctrs()
        .filter(|c| c.cgroup.is_none())
        .map(|c| c.id.clone())
        .collect();
    let (first, stale, unseen): (bool, bool, Vec<String>) = if full {
        let d = inner.disk.lock();
        (
            d.layers_at.is_none(),
            d.layers_at.is_some_and(|at| at.elapsed() >= DISK_PERIOD),
            ctrs()
                .filter(|c| !d.layers.contains_key(&c.id))
                .map(|c| c.id.clone())
                .collect(),
        )
    } else {
        (false, false, Vec::new())
    };
    let mut ask: Vec<String> = no_cgroup;
    for id in unseen {
        if !ask.contains(&id) {
            ask.push(id);
        }
    }
    let mut got: Vec<v1::ContainerStats> = Vec::new();
    if first || ask.len() > MAX_FILTERED_STATS {
        match src.runtime.list_container_stats(None).await {
            Ok(v) => {
                inner.disk.lock().set_layers(&v);
                got = v;
            }
            Err(e) => tracing::debug!(error = %e, "ListContainerStats failed; cgroup figures only"),
        }
    } else {
        for id in &ask {
            let filter = v1::ContainerStatsFilter {
                id: id.clone(),
                ..Default::default()
            };
            match src.runtime.list_container_stats(Some(filter)).await {
                Ok(v) => {
                    let mut d = inner.disk.lock();
                    // Asked and answered: remembered even when the runtime
                    // has no figures for it, so it is not asked again.
                    d.layers.entry(id.clone()).or_insert(None);
                    for s in &v {
                        if let Some(a) = &s.attributes {
                            d.layers.insert(a.id.clone(), layer(s));
                        }
                    }
                    got.extend(v);
                }
                Err(e) => tracing::debug!(error = %e, id, "ContainerStats failed"),
            }
        }
        if stale && full {
            refresh_disk_in_background(inner, src);
        }
    }
    merge_cri(snap, got);
    if full {
        let mut d = inner.disk.lock();
        for c in snap.pods.iter_mut().flat_map(|p| p.containers.iter_mut()) {
            c.rootfs = d.layers.get(&c.id).copied().flatten();
        }
        // Containers gone from the lists are dropped (not in a refresh
        // under way: it replaces the map anyway).
        let live: std::collections::HashSet<&str> = snap
            .pods
            .iter()
            .flat_map(|p| &p.containers)
            .map(|c| c.id.as_str())
            .collect();
        d.layers.retain(|k, _| live.contains(k.as_str()));
    }
}

/// The CRI's cpu/memory where no cgroup was read.
fn merge_cri(snap: &mut Snapshot, stats: Vec<v1::ContainerStats>) {
    if stats.is_empty() {
        return;
    }
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
fn runtime_pid(inner: &Inner, r: &mut FileReader) -> Option<u32> {
    // A host without containerd (or one named otherwise) would cost a full
    // /proc scan per scrape: scan at most once a minute.
    const RESCAN: Duration = Duration::from_secs(60);
    let mut g = inner.runtime_pid.lock();
    if let Some(pid) = g.0 {
        if r.whole_path(Path::new(&format!("/proc/{pid}/comm")))
            .is_some_and(|c| c.trim() == "containerd")
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

/// A cached cgroup name, or the first of `candidates` that exists (then
/// cached).
fn resolve(
    cache: &mut foldhash::HashMap<String, String>,
    key: &str,
    candidates: impl FnOnce() -> Option<String>,
) -> Option<String> {
    if let Some(c) = cache.get(key) {
        return Some(c.clone());
    }
    let found = candidates()?;
    cache.insert(key.to_string(), found.clone());
    Some(found)
}

/// Reads a cached cgroup; when it reads nothing (gone, or moved) the entry
/// is dropped and the cgroup looked for again.
fn read_cached(
    cache: &mut foldhash::HashMap<String, String>,
    key: &str,
    h: &Hierarchy,
    detail: Detail,
    r: &mut FileReader,
    candidates: impl Fn() -> Option<String>,
) -> Option<(String, CgroupSample)> {
    let was_cached = cache.contains_key(key);
    let name = resolve(cache, key, &candidates)?;
    let s = h.read_with(&name, detail, r);
    if was_cached && s.cpu.is_none() && s.memory.is_none() {
        cache.remove(key);
        let name = resolve(cache, key, candidates)?;
        let s = h.read_with(&name, detail, r);
        return Some((name, s));
    }
    Some((name, s))
}

/// How long a path's mount source is trusted while its st_dev is unchanged.
const DEVICE_MAX_AGE: Duration = Duration::from_secs(60);

/// How long the root container's statfs figures are reused. With 110 pods
/// there are over 300 partitions (each sandbox's shm among them), 1.7 ms
/// of path walks per cAdvisor scrape here; upstream's cAdvisor takes them
/// at each housekeeping, every 10 s as the kubelet sets it
/// (`defaultHousekeepingInterval`), so they are never fresher there.
const GLOBAL_FS_MAX_AGE: Duration = Duration::from_secs(10);

/// The mount source of each path (cAdvisor's `device` label). The kernel
/// formats all of /proc/self/mountinfo per read, and with 110 pods' mounts
/// (rootfs, shm, volumes) that was an eighth of a scrape's CPU: it is read
/// again only when a path's st_dev changed (something mounted over it or
/// an ancestor) or its figure is older than `DEVICE_MAX_AGE`.
fn devices_of(inner: &Inner, paths: &[&Path]) -> Vec<Option<String>> {
    use std::os::unix::fs::MetadataExt;
    let mut cache = inner.devices.lock();
    let mut mountinfo: Option<String> = None;
    let out: Vec<Option<String>> = paths
        .iter()
        .map(|p| {
            let dev = std::fs::metadata(p).ok().map(|m| m.dev());
            if let (Some((d, at, v)), Some(dev)) = (cache.get(*p), dev) {
                if *d == dev && at.elapsed() < DEVICE_MAX_AGE {
                    return v.clone();
                }
            }
            let mi = mountinfo.get_or_insert_with(|| {
                std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
            });
            let v = procfs::device_of(mi, p);
            if let Some(dev) = dev {
                cache.insert(p.to_path_buf(), (dev, Instant::now(), v.clone()));
            }
            v
        })
        .collect();
    cache.retain(|k, _| paths.contains(&k.as_path()));
    out
}

/// The file systems listed once (at start, else at the first full scrape).
fn partitions(inner: &Inner) -> &[procfs::Partition] {
    inner.partitions.get_or_init(|| {
        procfs::partitions(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
    })
}

/// The root container's file systems (cAdvisor's GetGlobalFsInfo): the
/// partitions listed once, one statfs each (reused for
/// `GLOBAL_FS_MAX_AGE`), and one read of /proc/diskstats.
fn global_fs_stats(inner: &Inner, r: &mut FileReader) -> Vec<procfs::FsStat> {
    let parts = partitions(inner);
    let disks =
        procfs::parse_diskstats(r.whole(Path::new("/proc"), "diskstats").unwrap_or_default());
    let mut cache = inner.statfs.lock();
    let now = Instant::now();
    procfs::global_fs_stats(parts, &disks, |p| cache.get(now, p, procfs::statvfs_at))
}

/// CPU time of the calling thread (the collection's own cost, apart from
/// whatever else the process does meanwhile; the bench's kernel floor is
/// timed with it too).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Cgroup files kept open between collections (see
/// `FileReader::keeping`): in the hot tier, enough for the four files each
/// collection reads of 110 pods' and their containers' cgroups, their
/// three pressure files and the pods' `net/dev` (1,560); the warm tier,
/// with half as many again, holds the files only `/metrics/cadvisor` reads
/// of them and of the sandboxes (2,300 at 110 pods), only while it is
/// scraped. Each holds a page of kernel memory (4.4 KiB measured: 7 MiB
/// hot and 10 MiB warm at 110 pods, 23 MiB at both caps), traded for a
/// third of `/metrics/resource`'s CPU, a sixth of the summary's and a
/// fifth of cAdvisor's; never more than a quarter of the open-file limit
/// in the hot tier (and 3/8 in the warm one).
fn kept_files_cap() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur as usize
    } else {
        1024
    };
    (soft / 4).min(2048)
}

/// Runs `f` with the readers that keep files open, one collection at a
/// time. A collection that needs more than the one under way (cAdvisor's
/// scrape arriving during metrics-server's: Prometheus and metrics-server
/// often time them together) waits for it and reads through the same warm
/// readers; reading every file cold instead took 60 to 190 ms at 110 pods.
/// Only past `TURN_WAIT` does it read with readers of its own, dropped
/// afterwards. Each reader keeps half of `kept_files_cap`.
fn with_readers<T>(inner: &Inner, f: impl FnOnce(&mut [FileReader; 2]) -> T) -> T {
    let new = || {
        let cap = kept_files_cap() / 2;
        [FileReader::keeping(cap), FileReader::keeping(cap)]
    };
    match inner.reader.try_lock_for(TURN_WAIT) {
        Some(mut held) => f(held.get_or_insert_with(new)),
        None => f(&mut new()),
    }
}

/// One collection: the files `detail` needs, read through `r` (blocking).
fn read_files(
    inner: &Inner,
    rs: &mut [FileReader; 2],
    cfg: &StatsConfig,
    plans: &[PodPlan],
    image_names: &HashMap<String, String>,
    image_fs: Option<v1::FilesystemUsage>,
    detail: Detail,
) -> Snapshot {
    let full = is_full(detail);
    let h = hierarchy(inner);
    let v2 = h.is_v2();
    let cpu0 = thread_cpu_ns();
    let wall0 = std::time::Instant::now();
    let (ra, rb) = rs.split_at_mut(1);
    let (ra, rb) = (&mut ra[0], &mut rb[0]);
    let mut paths = std::mem::take(&mut *inner.paths.lock());
    let halves = assign_halves(plans, &paths);
    let (pa, pb) = paths.split_at_mut(1);
    let (pa, pb) = (&mut pa[0], &mut pb[0]);
    let read = |r: &mut FileReader, paths: &mut PathCache, which: &[usize]| {
        let cpu0 = thread_cpu_ns();
        // Pods' and containers' limits are the runtime's, set once.
        r.cache_specs(true);
        let pods = read_pods(&h, cfg, plans, which, image_names, detail, r, paths);
        (pods, thread_cpu_ns().saturating_sub(cpu0))
    };
    let start = |r: &mut FileReader| {
        r.begin();
        r.keep_warm(detail == Detail::Full);
        r.psi = cfg.psi;
    };
    // cAdvisor's collection reads twice the files of the others: the
    // second reader's half of the pods on a second thread from the start,
    // beside the node's files and the first half, so its scrape takes
    // about half as long. The others are quick enough on one thread (and
    // spare the thread's start).
    let (node_part, mut pods, (other, other_cpu)) =
        if detail == Detail::Full && plans.len() >= PARALLEL_MIN_PODS {
            let ((node_part, first), second, apart) = crate::blocking::halves(
                "stats-collect",
                || {
                    start(ra);
                    let node_part = read_node(inner, &h, cfg, image_fs, detail, ra);
                    (node_part, read(ra, pa, &halves[0]).0)
                },
                || {
                    start(rb);
                    // Its own look at swap and at the pods' parents' I/O
                    // (what lets it skip the pods' blkio files on a node
                    // without disk I/O): the node's files are being read
                    // meanwhile.
                    rb.swap_off = swap_total(rb) == 0;
                    for cg in std::iter::once(kubepods(cfg)).chain(qos_cgroups(cfg)) {
                        h.learn_empty_blkio(&cg, rb);
                    }
                    read(rb, pb, &halves[1])
                },
            );
            // The second half's CPU, unless it was this thread's.
            (
                node_part,
                first,
                (second.0, if apart { second.1 } else { 0 }),
            )
        } else {
            // Both on this thread, whose CPU the log counts already; the
            // second reader starts with what the first learnt of the node
            // (before the first's pods add to its list of empty blkio).
            start(ra);
            let node_part = read_node(inner, &h, cfg, image_fs, detail, ra);
            start(rb);
            rb.swap_off = ra.swap_off;
            rb.blkio_empty.clone_from(&ra.blkio_empty);
            let (first, _) = read(ra, pa, &halves[0]);
            let (second, _) = read(rb, pb, &halves[1]);
            (node_part, first, (second, 0))
        };
    *inner.paths.lock() = paths;
    let NodePart {
        time_ns,
        node,
        system,
        hierarchy: hier,
    } = node_part;
    pods.extend(other);
    pods.sort_unstable_by_key(|(i, _)| *i);
    let pods: Vec<PodRaw> = pods.into_iter().map(|(_, p)| p).collect();
    tracing::debug!(
        files = ra.opened + rb.opened,
        held = ra.held() + rb.held(),
        cpu_us = (thread_cpu_ns().saturating_sub(cpu0) + other_cpu) / 1000,
        wall_us = wall0.elapsed().as_micros(),
        ?detail,
        pods = pods.len(),
        "stats files read"
    );
    for r in [ra, rb] {
        r.cache_specs(false);
        r.sweep();
    }
    Snapshot {
        time_ns,
        full,
        detail,
        v2,
        node,
        system,
        hierarchy: hier,
        pods,
        sandbox_image: String::new(),
        oom: None,
        disk_names: if detail == Detail::Full {
            disk_names(inner)
        } else {
            Arc::default()
        },
    }
}

/// `SwapTotal` of this moment's /proc/meminfo, read through `r`.
fn swap_total(r: &mut FileReader) -> u64 {
    procfs::parse_meminfo(r.whole(Path::new("/proc"), "meminfo").unwrap_or_default()).swap_total
}

/// What a collection reads apart from the pods.
struct NodePart {
    time_ns: i64,
    node: NodeRaw,
    /// The summary's system containers.
    system: Vec<(String, CgroupRaw)>,
    /// cAdvisor's intermediate cgroups.
    hierarchy: Vec<CgroupRaw>,
}

/// The node's figures, its system and QoS cgroups, read through `r`.
fn read_node(
    inner: &Inner,
    h: &Hierarchy,
    cfg: &StatsConfig,
    image_fs: Option<v1::FilesystemUsage>,
    detail: Detail,
    r: &mut FileReader,
) -> NodePart {
    let full = is_full(detail);
    let time_ns = now_ns();
    let proc_dir = Path::new("/proc");
    let meminfo = procfs::parse_meminfo(r.whole(proc_dir, "meminfo").unwrap_or_default());
    r.swap_off = meminfo.swap_total == 0;
    let root = h.read_with("/", detail, r);
    // The root cgroup has cpu figures on v1 and on v2 since 5.x; /proc/stat
    // only where it has not, and once for the boot time.
    let busy_ns = if root.cpu.is_none() {
        r.whole(proc_dir, "stat")
            .and_then(procfs::parse_proc_stat_busy_ns)
    } else {
        None
    };
    let boot_ns = *inner.boot_ns.get_or_init(|| {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| procfs::parse_btime(&t))
            .unwrap_or(0)
            * 1_000_000_000
    });
    let mut node = NodeRaw {
        root,
        meminfo,
        busy_ns,
        boot_ns,
        ..Default::default()
    };
    if full {
        // Upstream's pidlimit: the lesser of pid_max and threads-max, as
        // either one stops new tasks.
        let limit = |r: &mut FileReader, f| {
            r.whole(proc_dir, f)
                .and_then(|t| t.trim().parse::<i64>().ok())
        };
        let pid_max = limit(r, "sys/kernel/pid_max");
        let threads_max = limit(r, "sys/kernel/threads-max");
        node.maxpid = procfs::pid_limit(pid_max, threads_max);
        node.curproc = r
            .whole(proc_dir, "loadavg")
            .and_then(procfs::parse_loadavg_procs);
        node.interfaces = procfs::parse_net_dev(r.whole(proc_dir, "net/dev").unwrap_or_default());
        node.rootfs = procfs::statvfs(&cfg.root_dir);
        node.logs_fs = procfs::statvfs(&cfg.pod_logs_dir);
        let mut image_mp = None;
        if let Some(fs) = &image_fs {
            let mp = fs.fs_id.as_ref().map(|f| PathBuf::from(&f.mountpoint));
            let figs = mp.as_deref().and_then(procfs::statvfs);
            if figs.is_some() {
                image_mp = mp;
            }
            node.imagefs = Some((figs, opt_u64(&fs.used_bytes), opt_u64(&fs.inodes_used)));
        }
        // Device names are cAdvisor's labels only.
        if detail == Detail::Full {
            let mut paths = vec![cfg.root_dir.as_path()];
            paths.extend(image_mp.as_deref());
            let mut devs = devices_of(inner, &paths).into_iter();
            node.rootfs_device = devs.next().flatten();
            node.imagefs_device = devs.next().flatten();
            node.filesystems = global_fs_stats(inner, r);
        }
    }

    // System containers (the summary's) and cAdvisor's intermediate
    // cgroups: not for /metrics/resource, which shows neither.
    let kp = kubepods(cfg);
    let mut system = Vec::new();
    let mut hier = Vec::new();
    if detail >= Detail::CpuMemory {
        let by_process = |pid: &str, r: &mut FileReader| {
            let text = r.whole(&proc_dir.join(pid), "cgroup")?.to_string();
            let (name, sample) = h.read_process_with(&text, detail, r)?;
            Some(CgroupRaw {
                name,
                sample,
                cpu_nano_cores: None,
            })
        };
        if let Some(c) = by_process("self", r) {
            system.push(("kubelet".to_string(), c));
        }
        if let Some(pid) = runtime_pid(inner, r) {
            if let Some(c) = by_process(&pid.to_string(), r) {
                system.push(("runtime".to_string(), c));
            }
        }
        let cadvisor = detail == Detail::Full;
        if cadvisor {
            hier.push(CgroupRaw {
                name: "/".into(),
                sample: node.root.clone(),
                cpu_nano_cores: None,
            });
        }
        if h.exists(&kp) {
            let pods = CgroupRaw {
                name: kp.clone(),
                sample: h.read_with(&kp, detail, r),
                cpu_nano_cores: None,
            };
            if cadvisor {
                hier.push(pods.clone());
            }
            system.push(("pods".to_string(), pods));
            if cadvisor {
                for name in qos_cgroups(cfg) {
                    if h.exists(&name) {
                        let sample = h.read_with(&name, detail, r);
                        hier.push(CgroupRaw {
                            name,
                            sample,
                            cpu_nano_cores: None,
                        });
                    }
                }
            }
        }
    }

    NodePart {
        time_ns,
        node,
        system,
        hierarchy: hier,
    }
}

/// Which reader reads each pod (indexes into `plans`): the one whose cache
/// resolved its cgroup before, which keeps its files open; a new pod goes
/// to the reader with less to read. Pods move from the heavier side only
/// while that evens the load (pods gone from one side), so the two threads
/// of cAdvisor's collection finish together.
fn assign_halves(plans: &[PodPlan], paths: &[PathCache; 2]) -> [Vec<usize>; 2] {
    // A pod's cgroup and sandbox, and each container's.
    let weight = |i: usize| 2 + plans[i].containers.len();
    let mut halves: [Vec<usize>; 2] = Default::default();
    let mut load = [0usize; 2];
    let mut new = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        match paths.iter().position(|c| c.pods.contains_key(&p.uid)) {
            Some(k) => {
                halves[k].push(i);
                load[k] += weight(i);
            }
            None => new.push(i),
        }
    }
    loop {
        let heavy = usize::from(load[1] > load[0]);
        let gap = load[heavy] - load[1 - heavy];
        match halves[heavy].last() {
            Some(&i) if 2 * weight(i) <= gap => {
                halves[heavy].pop();
                halves[1 - heavy].push(i);
                load[heavy] -= weight(i);
                load[1 - heavy] += weight(i);
            }
            _ => break,
        }
    }
    for i in new {
        let k = usize::from(load[1] < load[0]);
        halves[k].push(i);
        load[k] += weight(i);
    }
    halves
}

/// The pods `which` (indexes into `plans`) read through `r`, with their
/// indexes; `paths` is this reader's cache of resolved cgroups, cleared of
/// pods and containers no longer listed.
#[allow(clippy::too_many_arguments)]
fn read_pods(
    h: &Hierarchy,
    cfg: &StatsConfig,
    plans: &[PodPlan],
    which: &[usize],
    image_names: &HashMap<String, String>,
    detail: Detail,
    r: &mut FileReader,
    paths: &mut PathCache,
) -> Vec<(usize, PodRaw)> {
    let full = is_full(detail);
    // Looked up once per pod and container with the runtime's ids: a fast
    // hasher (no hostile keys).
    let mut seen_pods = foldhash::HashSet::default();
    let mut seen_ctrs = foldhash::HashSet::default();
    let mut pods = Vec::with_capacity(which.len());
    for &i in which {
        let plan = &plans[i];
        let mut pod = PodRaw {
            name: plan.name.clone(),
            namespace: plan.namespace.clone(),
            uid: plan.uid.clone(),
            sandbox_id: plan.sandbox_id.clone(),
            created_ns: plan.created_ns,
            ..Default::default()
        };
        seen_pods.insert(plan.uid.as_str());
        let found = read_cached(&mut paths.pods, &plan.uid, h, detail, r, || {
            pod_cgroup_candidates(cfg, &plan.uid)
                .into_iter()
                .find(|c| h.exists(c))
        });
        if let Some((cg, sample)) = found {
            pod.sample = sample;
            // The sandbox's cgroup (its figures are cAdvisor's only) and
            // netns.
            if full {
                seen_ctrs.insert(plan.sandbox_id.as_str());
                let sandbox = if detail == Detail::Full {
                    // Only cAdvisor's text reads the sandbox cgroups: their
                    // files are kept in the warm tier, so the hot tier's
                    // cap goes to the files every endpoint reads.
                    r.sandbox_files(true);
                    let found = read_cached(
                        &mut paths.containers,
                        &plan.sandbox_id,
                        h,
                        detail,
                        r,
                        || container_cgroup(h, &cg, &plan.sandbox_id),
                    )
                    .map(|(sc, mut s)| {
                        add_limits(&mut s, r);
                        pod.sandbox_sample = s;
                        pod.sandbox_cgroup = Some(sc.clone());
                        sc
                    });
                    r.sandbox_files(false);
                    found
                } else {
                    resolve(&mut paths.containers, &plan.sandbox_id, || {
                        container_cgroup(h, &cg, &plan.sandbox_id)
                    })
                };
                // The pause process holds the pod's network namespace (its
                // pid is looked for only when no file is kept for it).
                pod.interfaces = procfs::parse_net_dev(
                    r.net_dev(&plan.sandbox_id, |r| {
                        sandbox
                            .as_deref()
                            .and_then(|sc| h.procs_with(sc, r).into_iter().next())
                            .or_else(|| h.procs_with(&cg, r).into_iter().next())
                    })
                    .unwrap_or_default(),
                );
            }
            pod.cgroup = Some(cg);
        }
        if full {
            pod.etc_hosts =
                file_usage(&crate::volume::pod_dir(&cfg.root_dir, &plan.uid).join("etc-hosts"));
        }
        for c in &plan.containers {
            seen_ctrs.insert(c.id.as_str());
            let (ccg, mut sample) = match pod.cgroup.as_deref() {
                Some(pcg) => read_cached(&mut paths.containers, &c.id, h, detail, r, || {
                    container_cgroup(h, pcg, &c.id)
                })
                .map_or((None, CgroupSample::default()), |(n, s)| (Some(n), s)),
                None => (None, CgroupSample::default()),
            };
            add_limits(&mut sample, r);
            if full {
                sample.processes = match (&sample.procs, ccg.as_deref()) {
                    (Some(p), _) => Some(p.processes),
                    (None, Some(cg)) => h.process_count_with(cg, r),
                    (None, None) => None,
                };
            }
            let logs = full
                .then(|| {
                    r.logs.usage(
                        &cfg.pod_logs_dir
                            .join(format!("{}_{}_{}", plan.namespace, plan.name, plan.uid))
                            .join(&c.name),
                    )
                })
                .flatten();
            let image = if detail == Detail::Full {
                image_names.get(&c.image).unwrap_or(&c.image).clone()
            } else {
                c.image.clone()
            };
            pod.containers.push(ContainerRaw {
                id: c.id.clone(),
                name: c.name.clone(),
                image,
                created_ns: c.created_ns,
                cgroup: ccg,
                sample,
                cpu_nano_cores: None,
                rootfs: None,
                logs,
            });
        }
        pods.push((i, pod));
    }
    paths.pods.retain(|k, _| seen_pods.contains(k.as_str()));
    if full {
        paths
            .containers
            .retain(|k, _| seen_ctrs.contains(k.as_str()));
        r.retain_net_devs(&|id| seen_ctrs.contains(id));
    } else {
        // Sandboxes were not looked at: keep theirs.
        let sandboxes: foldhash::HashSet<&str> = which
            .iter()
            .map(|&i| plans[i].sandbox_id.as_str())
            .collect();
        paths
            .containers
            .retain(|k, _| seen_ctrs.contains(k.as_str()) || sandboxes.contains(k.as_str()));
    }
    pods
}

/// A file's bytes on disk and its one inode, as upstream's du-based
/// MetricsDu counts a single file; `None` when it does not exist.
fn file_usage(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|md| (md.blocks() * 512, 1))
}

/// Block device names, read again after `DEVICE_MAX_AGE` (disks come and
/// go rarely; a new one is named within a minute).
fn disk_names(inner: &Inner) -> Arc<DiskNames> {
    let mut g = inner.disk_names.lock();
    if let Some((at, names)) = g.as_ref() {
        if at.elapsed() < DEVICE_MAX_AGE {
            return names.clone();
        }
    }
    let names = Arc::new(super::blkio::disk_names(Path::new("/sys/block")));
    *g = Some((Instant::now(), names.clone()));
    names
}

/// The open-files limit cAdvisor shows for containers (it knows their
/// processes; raw cgroups have none), when their processes were read.
fn add_limits(s: &mut CgroupSample, r: &mut FileReader) {
    if let Some(p) = s.procs.as_mut() {
        super::processes::add_limits(p, r);
    }
}

/// usageNanoCores from the previous sample of each cgroup; the previous
/// samples of cgroups that are gone are dropped (of the kinds `detail`
/// reads: a `/metrics/resource` snapshot has no system containers, which
/// keep their samples).
fn rates(inner: &Inner, snap: &mut Snapshot, detail: Detail) {
    let t = snap.time_ns;
    let mut guard = inner.prev_cpu.lock();
    let (generation, prev) = &mut *guard;
    // Entries this collection looks at are stamped with its number, so the
    // ones it did not are found without a set of keys; the key is built in
    // one buffer and allocated only for a new entry (a few hundred per
    // scrape).
    *generation += 1;
    let now_gen = *generation;
    let mut key = String::with_capacity(128);
    let mut rate = |kind: &str, name: &str, cpu: Option<CpuSample>| -> Option<u64> {
        key.clear();
        key.push_str(kind);
        key.push_str(name);
        let cur = (t, cpu?.usage_ns);
        let per_sec = |(pt, pu): (i64, u64)| {
            (t > pt && cur.1 >= pu)
                .then(|| ((cur.1 - pu) as u128 * 1_000_000_000 / (t - pt) as u128) as u64)
        };
        match prev.get_mut(key.as_str()) {
            None => {
                prev.insert(key.clone(), ((None, cur), now_gen));
                None
            }
            Some(((older, newer), seen)) => {
                *seen = now_gen;
                if t - newer.0 >= MIN_RATE_WINDOW_NS {
                    let r = per_sec(*newer);
                    *older = Some(*newer);
                    *newer = cur;
                    r
                } else {
                    // Too soon after the last sample: rate over the one
                    // before it.
                    older.and_then(per_sec)
                }
            }
        }
    };
    let node_cpu = snap.node.root.cpu.or(snap.node.busy_ns.map(|u| CpuSample {
        usage_ns: u,
        ..Default::default()
    }));
    snap.node.cpu_nano_cores = rate("node", "", node_cpu);
    for (name, c) in snap.system.iter_mut() {
        c.cpu_nano_cores = rate("sys:", name, c.sample.cpu);
    }
    for c in snap.hierarchy.iter_mut() {
        c.cpu_nano_cores = rate("cg:", &c.name, c.sample.cpu);
    }
    for p in snap.pods.iter_mut() {
        p.cpu_nano_cores = rate("pod:", &p.uid, p.sample.cpu);
        for c in p.containers.iter_mut() {
            let r = rate("ctr:", &c.id, c.sample.cpu);
            if c.cpu_nano_cores.is_none() {
                c.cpu_nano_cores = r;
            }
        }
    }
    prev.retain(|k, (_, seen)| {
        *seen == now_gen
            || (k.starts_with("sys:") && detail < Detail::CpuMemory)
            || (k.starts_with("cg:") && detail < Detail::Full)
    });
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
    fn a_collection_waits_for_the_one_under_way_and_reads_through_its_reader() {
        let inner = Arc::new(Inner::default());
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let inner = inner.clone();
            std::thread::spawn(move || {
                with_readers(&inner, |rs| {
                    // Marks the reader, so the next collection can tell
                    // whether it got this one.
                    rs[0].opened = 4242;
                    inside_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                })
            })
        };
        inside_rx.recv().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let second = {
            let inner = inner.clone();
            std::thread::spawn(move || {
                ready_tx.send(()).unwrap();
                with_readers(&inner, |rs| rs[0].opened)
            })
        };
        // The second is on its way in while the first still reads.
        ready_rx.recv().unwrap();
        go_tx.send(()).unwrap();
        first.join().unwrap();
        assert_eq!(second.join().unwrap(), 4242, "a cold reader of its own");
        assert_eq!(
            inner.reader.lock().as_ref().map(|rs| rs[0].opened),
            Some(4242)
        );
    }

    fn plans_with(containers: &[usize]) -> Vec<PodPlan> {
        containers
            .iter()
            .enumerate()
            .map(|(i, &n)| PodPlan {
                uid: format!("uid-{i}"),
                containers: (0..n)
                    .map(|c| ContainerPlan {
                        id: format!("c-{i}-{c}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    /// The pods each reader's cache knows after reading `halves`.
    fn cache_of(plans: &[PodPlan], halves: &[Vec<usize>; 2]) -> [PathCache; 2] {
        let mut paths: [PathCache; 2] = Default::default();
        for (k, half) in halves.iter().enumerate() {
            for &i in half {
                paths[k].pods.insert(plans[i].uid.clone(), "/cg".into());
            }
        }
        paths
    }

    fn load(plans: &[PodPlan], half: &[usize]) -> usize {
        half.iter().map(|&i| 2 + plans[i].containers.len()).sum()
    }

    #[test]
    fn pods_stay_with_their_reader_and_the_halves_stay_even() {
        // New pods of uneven sizes: split about evenly, every pod once.
        let sizes: Vec<usize> = (0..40).map(|i| 1 + i % 3).collect();
        let plans = plans_with(&sizes);
        let halves = assign_halves(&plans, &Default::default());
        let mut all: Vec<usize> = halves.concat();
        all.sort_unstable();
        assert_eq!(all, (0..40).collect::<Vec<_>>());
        let (a, b) = (load(&plans, &halves[0]), load(&plans, &halves[1]));
        assert!(a.abs_diff(b) <= 4, "{a} against {b}");

        // Read again: each pod with the reader that keeps its files.
        let paths = cache_of(&plans, &halves);
        assert_eq!(assign_halves(&plans, &paths), halves);

        // Most of the first reader's pods go: the second reader's last
        // pods move over until the load is about even again, and no
        // more than that.
        let gone: std::collections::HashSet<usize> = halves[0].iter().copied().take(15).collect();
        let left: Vec<PodPlan> = plans
            .iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        let again = assign_halves(&left, &paths);
        let (a, b) = (load(&left, &again[0]), load(&left, &again[1]));
        assert!(a.abs_diff(b) <= 4, "{a} against {b}");
        let moved = again[0]
            .iter()
            .filter(|&&i| paths[1].pods.contains_key(&left[i].uid))
            .count();
        let kept_first = again[0].len() - moved;
        assert_eq!(kept_first, halves[0].len() - 15, "the first's own stay");
        assert!(moved > 0 && moved < 15, "{moved} moved");
    }

    #[test]
    fn statfs_answers_are_reused_until_they_are_ten_seconds_old() {
        let calls = std::cell::Cell::new(0);
        let statfs = |_: &Path| {
            calls.set(calls.get() + 1);
            procfs::Statfs::Missing
        };
        let mut cache = StatfsCache::default();
        let t0 = Instant::now();
        let (a, b) = (Path::new("/a"), Path::new("/b"));
        cache.get(t0, a, statfs);
        cache.get(t0, b, statfs);
        assert_eq!(calls.get(), 2);
        let later = t0 + GLOBAL_FS_MAX_AGE - Duration::from_millis(1);
        cache.get(later, a, statfs);
        cache.get(later, b, statfs);
        assert_eq!(calls.get(), 2, "younger than the max age: reused");
        let stale = t0 + GLOBAL_FS_MAX_AGE;
        cache.get(stale, a, statfs);
        cache.get(stale, b, statfs);
        assert_eq!(calls.get(), 4, "both asked again");
    }

    #[test]
    fn usage_nano_cores_is_a_rate_over_the_previous_sample() {
        let inner = Inner::default();
        let rate = |s: &Snapshot| s.pods[0].containers[0].cpu_nano_cores;
        let mut a = snap_at(10_000_000_000, 1_000_000_000);
        rates(&inner, &mut a, Detail::Full);
        assert_eq!(rate(&a), None, "one sample has no rate");
        // Half a core over 2 s.
        let mut b = snap_at(12_000_000_000, 2_000_000_000);
        rates(&inner, &mut b, Detail::Full);
        assert_eq!(rate(&b), Some(500_000_000));
        // 100 ms later: too short a window; the rate is taken over the
        // sample before (2.1 s back).
        let mut c = snap_at(12_100_000_000, 2_100_000_000);
        rates(&inner, &mut c, Detail::Full);
        assert_eq!(
            rate(&c),
            Some(1_100_000_000 * 1_000_000_000 / 2_100_000_000)
        );
        // A container that disappears loses its previous sample.
        let mut empty = Snapshot {
            time_ns: 20_000_000_000,
            ..Default::default()
        };
        rates(&inner, &mut empty, Detail::Full);
        assert!(!inner.prev_cpu.lock().1.contains_key("ctr:c"));
    }
}
