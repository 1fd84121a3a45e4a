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

/// The `kubepods` directory of each cgroup hierarchy on this host.
#[derive(Debug, Clone, Default)]
pub struct PodCgroups {
    tops: Vec<PathBuf>,
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
        let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for top in &self.tops {
            for q in QOS_DIRS {
                let dir = if q.is_empty() {
                    top.clone()
                } else {
                    top.join(q)
                };
                let Ok(rd) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    let name = e.file_name();
                    let Some(uid) = name.to_str().and_then(|n| n.strip_prefix("pod")) else {
                        continue;
                    };
                    // file_type does not follow symlinks.
                    if uid.is_empty() || skip(uid) || !e.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    out.entry(uid.to_string()).or_default().push(e.path());
                }
            }
        }
        out
    }
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

/// Removes the cgroups of pods that are not `known`, whose pod directory
/// under `root_dir` is gone and which are at least `min_age` old (blocking); returns the UIDs whose
/// cgroups are all removed, and those that could not be, with the error.
pub fn clean(
    cgroups: &PodCgroups,
    root_dir: &Path,
    min_age: Duration,
    known: &dyn Fn(&str) -> bool,
) -> (Vec<String>, Vec<(String, std::io::Error)>) {
    let (mut removed, mut failed) = (Vec::new(), Vec::new());
    for (uid, dirs) in cgroups.list(known) {
        if removed.len() + failed.len() >= PER_PASS {
            break;
        }
        // Volumes not yet torn down (upstream podVolumesExist): the pod
        // directory goes only after they are.
        if std::fs::symlink_metadata(root_dir.join("pods").join(&uid)).is_ok() {
            tracing::debug!(pod_uid = %uid, "Orphaned pod found, but volumes not yet removed");
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
        let (root, busy) = (self.root_dir.clone(), self.busy.clone());
        self.tasks.spawn(tracing::Instrument::instrument(
            async move {
                let r = crate::blocking::run("pod cgroup cleanup".into(), DEADLINE, move || {
                    clean(&cgroups, &root, MIN_AGE, &known)
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
            ] {
                std::fs::create_dir_all(top.join(p)).unwrap();
            }
        }
        // Not a pod's cgroup, nor a directory.
        std::fs::create_dir_all(mem.join("besteffort/other")).unwrap();
        std::fs::write(mem.join("besteffort/podfile"), "").unwrap();
        let root = d.join("root");
        std::fs::create_dir_all(root.join("pods/volumes/volumes")).unwrap();
        let c = PodCgroups::with_tops(vec![mem.clone(), cpu.clone()]);
        assert_eq!(
            c.list(&|_| false).keys().collect::<Vec<_>>(),
            ["gone", "guaranteed-gone", "known", "volumes"]
        );
        assert_eq!(
            c.list(&|u| u == "known").keys().collect::<Vec<_>>(),
            ["gone", "guaranteed-gone", "volumes"]
        );
        let (removed, failed) = clean(&c, &root, Duration::ZERO, &|u| u == "known");
        assert_eq!(removed, ["gone", "guaranteed-gone"]);
        assert!(failed.is_empty());
        for top in [&mem, &cpu] {
            assert!(!top.join("besteffort/podgone").exists());
            assert!(!top.join("podguaranteed-gone").exists());
            assert!(top.join("burstable/podknown/ctr2").exists());
            assert!(top.join("besteffort/podvolumes").exists());
            assert!(top.join("besteffort").exists());
        }
        assert!(mem.join("besteffort/other").exists());
        // Once its pod directory is gone, the last one goes too.
        std::fs::remove_dir_all(root.join("pods/volumes")).unwrap();
        let (removed, _) = clean(&c, &root, Duration::ZERO, &|u| u == "known");
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
        let (removed, failed) = clean(&c, &d.join("root"), Duration::ZERO, &|_| false);
        assert_eq!(removed, ["free"]);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, "busy");
        assert!(top.join("besteffort/podbusy").exists());
        // Just made: left for a later pass.
        std::fs::create_dir_all(top.join("besteffort/podnew")).unwrap();
        let (removed, _) = clean(&c, &d.join("root"), Duration::from_secs(3600), &|_| false);
        assert!(removed.is_empty());
        assert!(top.join("besteffort/podnew").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
