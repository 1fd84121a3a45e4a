//! Pod cgroups no pod owns any more, removed at housekeeping (upstream
//! `cleanupOrphanedPodCgroups` in `pkg/kubelet/kubelet_pods.go`, over the
//! pod container manager's `GetAllPodsFromCgroups` and `Destroy` in
//! `pkg/kubelet/cm/pod_container_manager_linux.go`).
//!
//! The runtime makes a pod's cgroup (`kubepods[/<qos>]/pod<uid>`) as the
//! parent of its sandbox and containers, and removes only theirs: without
//! this, every pod ever run leaves an empty cgroup in each hierarchy, which
//! holds kernel memory and lengthens every walk of `kubepods`.
//!
//! As upstream: a pod is left alone while it is wanted or not yet fully
//! terminated, and while its volumes are there (its pod directory: a
//! memory-backed volume's pages stay charged to the pod's cgroup).
//! Unlike upstream, processes still in the cgroup are not killed: the pod
//! worker has stopped everything the runtime ran for it, and a cgroup that
//! is still busy is tried again at the next pass. The systemd driver's pod
//! slices are left alone: systemd owns them (upstream stops their unit over
//! D-Bus, which rkubelet does not speak).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The QoS levels' directories under `kubepods` (Guaranteed pods sit in
/// `kubepods` itself), as `pod_cgroup_parent` names them.
const QOS_DIRS: [&str; 3] = ["", "burstable", "besteffort"];

/// Nested cgroups followed below a pod's: the runtime makes one level
/// (sandbox and containers); a privileged pod could make more.
const MAX_DEPTH: usize = 8;

/// A pod cgroup younger than this is left for a later pass: one being made
/// for a pod this kubelet does not know (a second kubelet on the host, as in
/// tests) would otherwise lose its directory between the runtime's mkdir of
/// it and of its first child. cgroupfs keeps a directory's creation time as
/// its mtime.
const MIN_AGE: Duration = Duration::from_secs(10);

/// Pods whose cgroups one pass removes at most, so a pass stays short
/// after a restart with many left behind (the next pass, 2 s later, goes
/// on).
const PER_PASS: usize = 256;

/// How long one pass's file-system work may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Full listings (every hierarchy) come once per this many passes, and
/// passes between them list one hierarchy (see `Scan`).
const FULL_EVERY: u32 = 30;

/// The `kubepods` directory of each cgroup hierarchy on this host.
#[derive(Debug, Clone, Default)]
pub struct PodCgroups {
    tops: Vec<PathBuf>,
}

/// One listing: the pods found (but for those skipped) with their
/// directories, and the hierarchy that later passes may list alone.
struct Listing {
    pods: BTreeMap<String, Vec<PathBuf>>,
    probe: Option<usize>,
}

/// What passes carry from one to the next. A runtime makes a pod's cgroup
/// in every hierarchy at once and the pod's end leaves it in all of them,
/// so listing one hierarchy finds each orphan: at 110 pods on a v1 host
/// that reads about 120 directory entries per pass instead of about 1,250.
/// The full listing of every hierarchy that upstream does at each pass
/// comes every `FULL_EVERY` passes, for what one hierarchy cannot show (a
/// directory left in some hierarchies only, say by a crash mid-removal).
#[derive(Debug, Default)]
pub struct Scan {
    passes: u32,
    /// The hierarchy listed between full listings: of those where the last
    /// full listing found every pod, the one with the fewest entries.
    /// `None` (list them all) until a full listing has found a pod.
    probe: Option<usize>,
}

impl PodCgroups {
    /// Every mounted cgroup hierarchy (v1 controllers, the unified one of a
    /// hybrid host, or the v2 root), from `/proc/self/mountinfo` text.
    pub fn from_mountinfo(text: &str, cgroup_root: &str) -> Self {
        let rel = cgroup_root.trim_matches('/');
        let mut tops = Vec::new();
        for m in crate::stats::procfs::mount_lines(text) {
            // A bind of a sub-tree is not a hierarchy's root.
            if m.root != "/" || !matches!(m.fs_type, "cgroup" | "cgroup2") {
                continue;
            }
            let mut top = PathBuf::from(m.mount_point);
            if !rel.is_empty() {
                top.push(rel);
            }
            top.push("kubepods");
            if !tops.contains(&top) {
                tops.push(top);
            }
        }
        PodCgroups { tops }
    }

    /// Hierarchies given directly (tests).
    pub fn with_tops(tops: Vec<PathBuf>) -> Self {
        PodCgroups { tops }
    }

    /// Each pod UID that has a cgroup, with its directories in every
    /// hierarchy (blocking), but for the pods `skip` names, which cost
    /// nothing more than the test (each pass sees every running pod in
    /// every hierarchy: 1,100 directories at 110 pods on a v1 host).
    pub fn list(&self, skip: &dyn Fn(&str) -> bool) -> BTreeMap<String, Vec<PathBuf>> {
        self.list_all(skip).pods
    }

    /// `list`, and the hierarchy to list alone until the next full listing.
    fn list_all(&self, skip: &dyn Fn(&str) -> bool) -> Listing {
        let mut pods: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        // Per hierarchy that has a `kubepods`: its entries and pods.
        let mut seen: Vec<(usize, usize, std::collections::BTreeSet<String>)> = Vec::new();
        for (i, top) in self.tops.iter().enumerate() {
            let mut uids = std::collections::BTreeSet::new();
            let entries = for_each_pod_dir(top, &mut |uid, path| {
                uids.insert(uid.to_string());
                if !skip(uid) {
                    pods.entry(uid.to_string()).or_default().push(path());
                }
            });
            if let Some(n) = entries {
                seen.push((i, n, uids));
            }
        }
        let all: std::collections::BTreeSet<&String> =
            seen.iter().flat_map(|(_, _, u)| u).collect();
        let probe = seen
            .iter()
            .filter(|(_, _, u)| !all.is_empty() && u.len() == all.len())
            .min_by_key(|(_, n, _)| *n)
            .map(|(i, _, _)| *i);
        if let Some(p) = probe {
            // The probe's directory goes last (see `clean`).
            let last = &self.tops[p];
            for dirs in pods.values_mut() {
                dirs.sort_by_key(|d| d.starts_with(last));
            }
        }
        Listing { pods, probe }
    }

    /// The pods found in hierarchy `probe` alone (but for those `skip`
    /// names), each with its directories in every hierarchy where they
    /// exist, the probe's last (blocking).
    fn list_through(
        &self,
        probe: usize,
        skip: &dyn Fn(&str) -> bool,
    ) -> BTreeMap<String, Vec<PathBuf>> {
        let mut pods = BTreeMap::new();
        let Some(ptop) = self.tops.get(probe) else {
            return pods;
        };
        for_each_pod_dir(ptop, &mut |uid, path| {
            if skip(uid) {
                return;
            }
            let path = path();
            let Ok(rel) = path.strip_prefix(ptop) else {
                return;
            };
            let mut dirs: Vec<PathBuf> = self
                .tops
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != probe)
                .map(|(_, t)| t.join(rel))
                .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
                .collect();
            dirs.push(path);
            pods.insert(uid.to_string(), dirs);
        });
        pods
    }
}

/// Calls `f` with each pod cgroup directory in `top`'s QoS directories:
/// its pod UID and a maker of its path (made only when wanted). The number
/// of entries read, `None` when `top` itself cannot be read (blocking).
fn for_each_pod_dir(top: &Path, f: &mut dyn FnMut(&str, &dyn Fn() -> PathBuf)) -> Option<usize> {
    let mut entries = None;
    for q in QOS_DIRS {
        let dir = if q.is_empty() {
            top.to_path_buf()
        } else {
            top.join(q)
        };
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let n = entries.get_or_insert(0);
        for e in rd.flatten() {
            *n += 1;
            let name = e.file_name();
            let Some(uid) = name.to_str().and_then(|n| n.strip_prefix("pod")) else {
                continue;
            };
            // file_type does not follow symlinks.
            if uid.is_empty() || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            f(uid, &|| e.path());
        }
    }
    entries
}

/// Removes a cgroup and those under it, deepest first (blocking): a cgroup
/// with children refuses to go, as does one with processes (EBUSY, left for
/// the next pass). One already gone counts as removed.
pub fn remove(dir: &Path) -> std::io::Result<()> {
    remove_at(dir, 0)
}

fn remove_at(dir: &Path, depth: usize) -> std::io::Result<()> {
    if depth < MAX_DEPTH {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_at(&e.path(), depth + 1)?;
                }
            }
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Whether a volume of the pod directory `pod_dir` is still a mount point
/// (upstream getMountedVolumePathListFromDisk: each
/// `volumes/<plugin>/<name>`, and a CSI volume's `mount` below it). A
/// directory that cannot be read counts as mounted, as upstream's error
/// does.
fn volumes_mounted(pod_dir: &Path) -> bool {
    let plugins = match std::fs::read_dir(pod_dir.join("volumes")) {
        Ok(d) => d,
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    let mounted = |dir: &Path| crate::volume::manager::is_mount_point(dir).unwrap_or(false);
    for plugin in plugins.flatten() {
        let Ok(volumes) = std::fs::read_dir(plugin.path()) else {
            return true;
        };
        for v in volumes.flatten() {
            let dir = v.path();
            if mounted(&dir) || mounted(&dir.join("mount")) {
                return true;
            }
        }
    }
    false
}

/// Upstream's ReduceCPULimits for a pod waiting on its volumes: its cgroup
/// at the minimum cpu weight (2 shares on v1, weight 1 on v2), so what is
/// left in it cannot compete while the volumes go.
fn reduce_cpu(dirs: &[PathBuf]) {
    for d in dirs {
        for (file, min) in [("cpu.shares", "2"), ("cpu.weight", "1")] {
            let f = d.join(file);
            if f.exists() {
                if let Err(e) = std::fs::write(&f, min) {
                    tracing::debug!(path = %f.display(), error = %e, "Failed to reduce cpu time for pod pending volume cleanup");
                }
            }
        }
    }
}

/// Removes the cgroups of pods that are not `known`, with no volume still
/// mounted under `root_dir`, and at least `min_age` old (blocking); returns the UIDs whose
/// cgroups are all removed, and those that could not be, with the error.
pub fn clean(
    cgroups: &PodCgroups,
    scan: &mut Scan,
    root_dir: &Path,
    min_age: Duration,
    known: &dyn Fn(&str) -> bool,
) -> (Vec<String>, Vec<(String, std::io::Error)>) {
    let pods = match scan.probe {
        Some(p) if scan.passes % FULL_EVERY != 0 => cgroups.list_through(p, known),
        _ => {
            let l = cgroups.list_all(known);
            scan.probe = l.probe;
            l.pods
        }
    };
    scan.passes = scan.passes.wrapping_add(1);
    let (mut removed, mut failed) = (Vec::new(), Vec::new());
    for (uid, dirs) in pods {
        if removed.len() + failed.len() >= PER_PASS {
            break;
        }
        // Volumes still mounted (upstream podVolumesExist): a
        // memory-backed volume's pages are charged to the pod's cgroup.
        if volumes_mounted(&root_dir.join("pods").join(&uid)) {
            tracing::debug!(pod_uid = %uid, "Orphaned pod found, but volumes not yet removed.  Reducing cpu to minimum");
            reduce_cpu(&dirs);
            continue;
        }
        let now = std::time::SystemTime::now();
        let young = dirs.iter().any(|d| {
            std::fs::symlink_metadata(d)
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() < min_age)
        });
        if young {
            continue;
        }
        // The probe's directory comes last: a removal that stops part-way
        // leaves it, so the next pass, listing the probe alone, tries again.
        match dirs.iter().try_for_each(|d| remove(d)) {
            Ok(()) => removed.push(uid),
            Err(e) => failed.push((uid, e)),
        }
    }
    (removed, failed)
}

/// Runs `clean` at housekeeping on a tracked task, one pass at a time.
#[derive(Clone)]
pub struct Cleaner {
    /// `None` with the systemd driver (see the module documentation).
    cgroups: Option<Arc<PodCgroups>>,
    root_dir: PathBuf,
    busy: Arc<AtomicBool>,
    /// Taken by one pass at a time (`busy`).
    scan: Arc<parking_lot::Mutex<Scan>>,
    tasks: TaskTracker,
    token: CancellationToken,
}

impl Cleaner {
    pub fn new(
        cgroups: Option<PodCgroups>,
        root_dir: PathBuf,
        tasks: TaskTracker,
        token: CancellationToken,
    ) -> Self {
        Cleaner {
            cgroups: cgroups.map(Arc::new),
            root_dir,
            busy: Arc::default(),
            scan: Arc::default(),
            tasks,
            token,
        }
    }

    /// The cleaner for this host's hierarchies (`/proc/self/mountinfo`);
    /// one that does nothing with the systemd driver.
    pub async fn for_host(
        systemd: bool,
        cgroup_root: &str,
        root_dir: PathBuf,
        tasks: TaskTracker,
        token: CancellationToken,
    ) -> Self {
        let cgroups = if systemd {
            None
        } else {
            let text = crate::blocking::run(
                "read /proc/self/mountinfo".into(),
                Duration::from_secs(5),
                || std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            )
            .await
            .unwrap_or_default();
            Some(PodCgroups::from_mountinfo(&text, cgroup_root))
        };
        Self::new(cgroups, root_dir, tasks, token)
    }

    /// One pass, unless the last one is still running. `known` says which
    /// pod UIDs are wanted or not yet terminated.
    pub fn run(&self, known: impl Fn(&str) -> bool + Send + 'static) {
        let Some(cgroups) = self.cgroups.clone() else {
            return;
        };
        if self.token.is_cancelled() || self.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let (root, busy, scan) = (self.root_dir.clone(), self.busy.clone(), self.scan.clone());
        self.tasks.spawn(tracing::Instrument::instrument(
            async move {
                let r = crate::blocking::run("pod cgroup cleanup".into(), DEADLINE, move || {
                    clean(&cgroups, &mut scan.lock(), &root, MIN_AGE, &known)
                })
                .await;
                match r {
                    Ok((removed, failed)) => {
                        for uid in removed {
                            tracing::debug!(pod_uid = %uid, "Orphaned pod found, removed pod cgroups");
                        }
                        // Tried again at every pass, as upstream: not worth
                        // more than a debug line each time.
                        for (uid, e) in failed {
                            tracing::debug!(pod_uid = %uid, error = %e, "pod cgroups not removed yet");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "pod cgroup cleanup"),
                }
                busy.store(false, Ordering::Release);
            },
            tracing::info_span!("pod_cgroup_cleanup"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rk-podcg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn every_cgroup_hierarchy_is_found_under_the_cgroup_root() {
        let text = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
33 25 0:28 /sub /mnt/bound rw - cgroup2 cgroup2 rw
34 25 0:29 / /proc rw - proc proc rw
";
        let c = PodCgroups::from_mountinfo(text, "/");
        assert_eq!(
            c.tops,
            [
                "/sys/fs/cgroup/memory/kubepods",
                "/sys/fs/cgroup/cpu,cpuacct/kubepods",
                "/sys/fs/cgroup/unified/kubepods",
            ]
            .map(PathBuf::from)
        );
        let c = PodCgroups::from_mountinfo(text, "/custom/");
        assert_eq!(
            c.tops[0],
            PathBuf::from("/sys/fs/cgroup/memory/custom/kubepods")
        );
    }

    #[test]
    fn only_pods_neither_known_nor_holding_volumes_lose_their_cgroups() {
        let d = tempdir("clean");
        let (mem, cpu) = (d.join("memory/kubepods"), d.join("cpu/kubepods"));
        for top in [&mem, &cpu] {
            for p in [
                "besteffort/podgone/ctr1",
                "burstable/podknown/ctr2",
                "podguaranteed-gone",
                "besteffort/podvolumes",
                "besteffort/podfinished",
            ] {
                std::fs::create_dir_all(top.join(p)).unwrap();
            }
        }
        // Not a pod's cgroup, nor a directory.
        std::fs::create_dir_all(mem.join("besteffort/other")).unwrap();
        std::fs::write(mem.join("besteffort/podfile"), "").unwrap();
        let root = d.join("root");
        // A pod with a memory-backed volume still mounted, and a finished
        // one whose volumes are torn down though its directory stays.
        let mounted = root.join("pods/volumes/volumes/kubernetes.io~empty-dir/mem");
        std::fs::create_dir_all(&mounted).unwrap();
        crate::cm::node::mount_tmpfs_with(&mounted, "size=1m").unwrap();
        std::fs::create_dir_all(root.join("pods/finished/volumes/kubernetes.io~empty-dir/mem"))
            .unwrap();
        std::fs::write(cpu.join("besteffort/podvolumes/cpu.shares"), "1024").unwrap();
        let c = PodCgroups::with_tops(vec![mem.clone(), cpu.clone()]);
        assert_eq!(
            c.list(&|_| false).keys().collect::<Vec<_>>(),
            ["finished", "gone", "guaranteed-gone", "known", "volumes"]
        );
        assert_eq!(
            c.list(&|u| u == "known").keys().collect::<Vec<_>>(),
            ["finished", "gone", "guaranteed-gone", "volumes"]
        );
        let (removed, failed) = clean(&c, &mut Scan::default(), &root, Duration::ZERO, &|u| {
            u == "known"
        });
        // Old code kept "finished" while its pod directory was there.
        assert_eq!(removed, ["finished", "gone", "guaranteed-gone"]);
        assert!(failed.is_empty());
        for top in [&mem, &cpu] {
            assert!(!top.join("besteffort/podgone").exists());
            assert!(!top.join("podguaranteed-gone").exists());
            assert!(top.join("burstable/podknown/ctr2").exists());
            assert!(top.join("besteffort/podvolumes").exists());
            assert!(top.join("besteffort").exists());
        }
        assert!(mem.join("besteffort/other").exists());
        // The one waiting on its volumes was set to the minimum cpu weight.
        assert_eq!(
            std::fs::read_to_string(cpu.join("besteffort/podvolumes/cpu.shares")).unwrap(),
            "2"
        );
        // (cgroupfs removes its files with the directory; a test one does not.)
        std::fs::remove_file(cpu.join("besteffort/podvolumes/cpu.shares")).unwrap();
        // Once its volume is unmounted, the last one goes too.
        let c_path = std::ffi::CString::new(mounted.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::umount2(c_path.as_ptr(), 0) }, 0);
        let (removed, _) = clean(&c, &mut Scan::default(), &root, Duration::ZERO, &|u| {
            u == "known"
        });
        assert_eq!(removed, ["volumes"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_cgroup_that_refuses_is_reported_and_the_rest_still_go() {
        let d = tempdir("refuse");
        let top = d.join("memory/kubepods");
        std::fs::create_dir_all(top.join("besteffort/podbusy")).unwrap();
        std::fs::create_dir_all(top.join("besteffort/podfree")).unwrap();
        // A plain directory with a file stands for a busy cgroup.
        std::fs::write(top.join("besteffort/podbusy/held"), "").unwrap();
        let c = PodCgroups::with_tops(vec![top.clone()]);
        let (removed, failed) = clean(
            &c,
            &mut Scan::default(),
            &d.join("root"),
            Duration::ZERO,
            &|_| false,
        );
        assert_eq!(removed, ["free"]);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, "busy");
        assert!(top.join("besteffort/podbusy").exists());
        // Just made: left for a later pass.
        std::fs::create_dir_all(top.join("besteffort/podnew")).unwrap();
        let (removed, _) = clean(
            &c,
            &mut Scan::default(),
            &d.join("root"),
            Duration::from_secs(3600),
            &|_| false,
        );
        assert!(removed.is_empty());
        assert!(top.join("besteffort/podnew").exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn passes_between_full_listings_list_one_hierarchy_and_still_find_each_orphan() {
        let d = tempdir("probe");
        let (pids, mem, part) = (
            d.join("pids/kubepods"),
            d.join("memory/kubepods"),
            d.join("partial/kubepods"),
        );
        for top in [&pids, &mem, &part] {
            std::fs::create_dir_all(top.join("besteffort/podrunning")).unwrap();
        }
        for top in [&pids, &mem] {
            std::fs::create_dir_all(top.join("besteffort/podgone/ctr")).unwrap();
        }
        // memory has more entries than pids; partial has the fewest but
        // lacks a pod, so it cannot stand for the others.
        for f in ["memory.stat", "memory.usage_in_bytes"] {
            std::fs::write(mem.join(f), "").unwrap();
        }
        let root = d.join("root");
        let c = PodCgroups::with_tops(vec![pids.clone(), mem.clone(), part.clone()]);
        let known = |u: &str| u == "running";
        let gone = |top: &Path, p: &str| !top.join("besteffort").join(p).exists();
        let mut scan = Scan::default();
        // The first pass lists every hierarchy.
        let (removed, _) = clean(&c, &mut scan, &root, Duration::ZERO, &known);
        assert_eq!(removed, ["gone"]);
        assert!(gone(&pids, "podgone") && gone(&mem, "podgone"));
        assert_eq!(scan.probe, Some(0));
        // A pod ended since: found through pids alone, removed everywhere.
        for top in [&pids, &mem, &part] {
            std::fs::create_dir_all(top.join("besteffort/podlater")).unwrap();
        }
        let (removed, _) = clean(&c, &mut scan, &root, Duration::ZERO, &known);
        assert_eq!(removed, ["later"]);
        assert!([&pids, &mem, &part].iter().all(|t| gone(t, "podlater")));
        // A removal that stops part-way keeps the probe's directory, so the
        // next pass finds the pod again.
        for top in [&pids, &mem] {
            std::fs::create_dir_all(top.join("besteffort/podbusy")).unwrap();
        }
        std::fs::write(mem.join("besteffort/podbusy/held"), "").unwrap();
        let (removed, failed) = clean(&c, &mut scan, &root, Duration::ZERO, &known);
        assert!(removed.is_empty());
        assert_eq!(failed.len(), 1);
        assert!(pids.join("besteffort/podbusy").exists());
        std::fs::remove_file(mem.join("besteffort/podbusy/held")).unwrap();
        let (removed, _) = clean(&c, &mut scan, &root, Duration::ZERO, &known);
        assert_eq!(removed, ["busy"]);
        assert!(gone(&pids, "podbusy") && gone(&mem, "podbusy"));
        // A directory left in another hierarchy only waits for the next
        // full listing.
        std::fs::create_dir_all(mem.join("besteffort/podstray")).unwrap();
        let mut passes = 0;
        while !gone(&mem, "podstray") {
            assert!(passes < FULL_EVERY, "never removed");
            clean(&c, &mut scan, &root, Duration::ZERO, &known);
            passes += 1;
        }
        assert!(passes > 1, "removed by a pass listing one hierarchy");
        assert_eq!(scan.passes % FULL_EVERY, 1, "removed by a full listing");
        assert!(pids.join("besteffort/podrunning").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
