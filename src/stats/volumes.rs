//! Pod volume usage for `/stats/summary` and `kubelet_volume_stats_*`
//! (upstream's fs_resource_analyzer and volume_stat_calculator): measured in
//! the background every `volumeStatsAggPeriod`, so a scrape never walks a
//! directory. The figures follow upstream's metrics providers: statfs for
//! memory-backed volumes and local persistent volumes, a `du`-like walk
//! (with the file system's capacity and free space from statfs) for the
//! kubelet's on-disk volumes (emptyDir, configMap, secret, downwardAPI,
//! projected). hostPath volumes report nothing, as upstream's plugin (those
//! behind a PV are left out by the volume manager's `measured_volumes`). A
//! local raw block volume reports its device's size as capacity and
//! nothing else (metrics_block.go).
//! CSI volumes are asked of their driver (NodeGetVolumeStats, when it has
//! the GET_VOLUME_STATS capability; none otherwise, as upstream), raw block
//! ones included (upstream's csiBlockMapper is a MetricsProvider). With the
//! CSIVolumeHealth gate on, a driver's volume condition is the volume's
//! `volumeHealthStats` and an abnormal one a VolumeConditionAbnormal event
//! (volume_stat_calculator.go).

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::types::{FsStats, VolumeStats};

/// One volume's figures, as the last calculation found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFigures {
    pub name: String,
    /// The claim behind the volume: (namespace, name).
    pub pvc: Option<(String, String)>,
    /// Unix nanoseconds of the measurement.
    pub time: i64,
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
    /// The driver's volume condition (CSIVolumeHealth): abnormal or not;
    /// None when not read.
    pub abnormal: Option<bool>,
    /// Counted in the pod's ephemeral storage (upstream's
    /// IsLocalEphemeralVolume: emptyDir on disk, configMap, gitRepo).
    pub local_ephemeral: bool,
}

impl VolumeFigures {
    pub fn to_stats(&self) -> VolumeStats {
        VolumeStats {
            fs: FsStats {
                time: super::types::time_from_ns(self.time),
                available_bytes: Some(self.available),
                capacity_bytes: Some(self.capacity),
                used_bytes: Some(self.used),
                inodes_free: Some(self.inodes_free),
                inodes: Some(self.inodes),
                inodes_used: Some(self.inodes_used),
            },
            name: self.name.clone(),
            pvc_ref: self.pvc.as_ref().map(|(ns, n)| super::types::PvcReference {
                name: n.clone(),
                namespace: ns.clone(),
            }),
            // parsePodVolumeStats: set only when the metrics carry one.
            volume_health_stats: self
                .abnormal
                .map(|abnormal| super::types::VolumeHealthStats { abnormal }),
        }
    }
}

/// Per pod UID, its volumes' latest figures. Clones share the map.
#[derive(Clone, Default)]
pub struct VolumeStatsCache {
    pods: Arc<Mutex<HashMap<String, Vec<VolumeFigures>>>>,
}

impl VolumeStatsCache {
    pub fn pod(&self, uid: &str) -> Vec<VolumeFigures> {
        self.pods.lock().get(uid).cloned().unwrap_or_default()
    }

    /// Every PVC-backed volume's figures (the metrics' subjects).
    pub fn claims(&self) -> Vec<VolumeFigures> {
        let mut v: Vec<_> = self
            .pods
            .lock()
            .values()
            .flatten()
            .filter(|f| f.pvc.is_some())
            .cloned()
            .collect();
        v.sort_by(|a, b| a.pvc.cmp(&b.pvc));
        v.dedup_by(|a, b| a.pvc == b.pvc);
        v
    }

    pub(crate) fn set(&self, uid: &str, figures: Vec<VolumeFigures>) {
        self.pods.lock().insert(uid.to_string(), figures);
    }

    fn retain(&self, live: &HashSet<String>) {
        self.pods.lock().retain(|uid, _| live.contains(uid));
    }
}

/// How a volume is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// statfs of the file system the volume is (tmpfs, a local PV).
    StatFs,
    /// A walk of the directory for usage; capacity from statfs.
    Du,
    /// A block device: its size (seek to the end), as upstream's
    /// metricsBlock; the other figures are zero.
    Block,
}

/// The claim behind `pod`'s volume `name` (upstream's PVCReference: the
/// claim a volume names, or a generic ephemeral volume's).
fn claim_of(pod: &Pod, name: &str) -> Option<(String, String)> {
    let v = crate::volume::pod_volume(pod, name)?;
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    if let Some(c) = &v.persistent_volume_claim {
        return Some((ns, c.claim_name.clone()));
    }
    // The generic ephemeral volume's claim is `<pod>-<volume>`.
    v.ephemeral.as_ref().map(|_| {
        (
            ns,
            format!("{}-{}", pod.metadata.name.as_deref().unwrap_or(""), v.name),
        )
    })
}

/// Where CSI volumes' figures come from: the registered drivers and the
/// volume manager's published CSI volumes of a pod.
pub struct CsiVolumes {
    pub registry: crate::volume::csi::Registry,
    #[allow(clippy::type_complexity)]
    pub volumes: Box<
        dyn Fn(&str) -> Vec<(String, Arc<crate::volume::csi::mounter::Published>)> + Send + Sync,
    >,
    /// The CSIVolumeHealth feature gate.
    pub health: bool,
}

/// The pod's CSI volumes as their drivers report them; a volume whose
/// driver fails or offers no stats is left out (upstream logs the failure
/// at V(4) and skips the volume).
async fn measure_csi(pod: &Pod, uid: &str, csi: &CsiVolumes) -> Vec<VolumeFigures> {
    let mut out = Vec::new();
    for (name, p) in (csi.volumes)(uid) {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let started = std::time::Instant::now();
        let r =
            crate::volume::csi::metrics::volume_stats(&csi.registry, &p, POD_BUDGET, csi.health)
                .await;
        // metrics_csi.go times each GetMetrics under the driver's name.
        crate::metrics::volume_stats_measured(&p.driver, started.elapsed());
        match r {
            Ok(Some(s)) => {
                if let Some((true, message)) = &s.condition {
                    // calcAndStoreStats' event for an abnormal volume, at
                    // each calculation (the recorder aggregates repeats).
                    crate::events::pod(
                        pod,
                        None,
                        crate::events::WARNING,
                        "VolumeConditionAbnormal",
                        format!("Volume {name}: {message}"),
                    );
                }
                out.push(VolumeFigures {
                    name: name.clone(),
                    pvc: claim_of(pod, &name),
                    time,
                    capacity: s.capacity,
                    available: s.available,
                    used: s.used,
                    inodes: s.inodes,
                    inodes_free: s.inodes_free,
                    inodes_used: s.inodes_used,
                    abnormal: s.condition.map(|(a, _)| a),
                    local_ephemeral: false,
                })
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(pod_uid = %uid, volume = %name, error = %e, "Failed to calculate volume metrics")
            }
        }
    }
    out
}

/// What to measure for `pod`'s volume `name` mounted at `path` (None: no
/// figures, as for hostPath), and the claim behind it.
fn plan(pod: &Pod, name: &str, path: &Path) -> Option<(Measure, Option<(String, String)>)> {
    let v = crate::volume::pod_volume(pod, name)?;
    if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
        // A mapped raw block volume's path is its bind of the device.
        let block = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        let how = if block {
            Measure::Block
        } else {
            Measure::StatFs
        };
        return Some((how, claim_of(pod, name)));
    }
    if v.host_path.is_some() {
        return None;
    }
    let memory = v
        .empty_dir
        .as_ref()
        .is_some_and(|e| e.medium.as_deref() == Some("Memory"))
        || v.secret.is_some();
    // Projected and secret volumes sit on their own tmpfs here too.
    let own_tmpfs = memory || (v.projected.is_some() && is_tmpfs(path));
    Some((
        if own_tmpfs {
            Measure::StatFs
        } else {
            Measure::Du
        },
        None,
    ))
}

fn is_tmpfs(path: &Path) -> bool {
    statfs(path).is_some_and(|s| s.f_type == libc::TMPFS_MAGIC)
}

fn statfs(path: &Path) -> Option<libc::statfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `st` is plain data statfs fills; `c` is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        (libc::statfs(c.as_ptr(), &mut st) == 0).then_some(st)
    }
}

/// Bytes (512-byte blocks, as `du`) and inodes under `root`: links not
/// followed, hard links counted once, other file systems not entered, and
/// the walk cut off at `deadline` (the figures so far).
pub fn disk_usage(root: &Path, deadline: Instant) -> (u64, u64) {
    let Ok(top) = std::fs::symlink_metadata(root) else {
        return (0, 0);
    };
    let dev = top.dev();
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    let mut first = true;
    while let Some(dir) = stack.pop() {
        if Instant::now() >= deadline {
            break;
        }
        let meta = if first {
            first = false;
            top.clone()
        } else {
            match std::fs::symlink_metadata(&dir) {
                Ok(m) => m,
                Err(_) => continue,
            }
        };
        if meta.dev() != dev {
            continue;
        }
        if seen.insert((meta.dev(), meta.ino())) {
            bytes += meta.blocks() * 512;
            inodes += 1;
        }
        if !meta.is_dir() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.dev() == dev && seen.insert((m.dev(), m.ino())) {
                bytes += m.blocks() * 512;
                inodes += 1;
            }
        }
    }
    (bytes, inodes)
}

/// The size of the block device at `path` (not followed if a link).
fn device_size(path: &Path) -> Option<u64> {
    use std::io::Seek;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    f.seek(std::io::SeekFrom::End(0)).ok()
}

fn measure(path: &Path, how: Measure, deadline: Instant) -> Option<[u64; 6]> {
    if how == Measure::Block {
        return device_size(path).map(|capacity| [capacity, 0, 0, 0, 0, 0]);
    }
    let st = statfs(path)?;
    let bsize = st.f_frsize as u64;
    let capacity = st.f_blocks * bsize;
    let available = st.f_bavail * bsize;
    let (inodes, inodes_free) = (st.f_files, st.f_ffree);
    let (used, inodes_used) = match how {
        Measure::StatFs => (
            (st.f_blocks - st.f_bfree) * bsize,
            inodes.saturating_sub(inodes_free),
        ),
        Measure::Du => disk_usage(path, deadline),
        // Answered above without statfs.
        Measure::Block => (0, 0),
    };
    Some([capacity, available, used, inodes, inodes_free, inodes_used])
}

/// Upstream's IsLocalEphemeralVolume: a gitRepo, an emptyDir on the
/// node's disk (not memory, not hugepages) or a configMap volume.
fn local_ephemeral(pod: &Pod, name: &str) -> bool {
    let Some(v) = crate::volume::pod_volume(pod, name) else {
        return false;
    };
    v.git_repo.is_some()
        || v.config_map.is_some()
        || v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty())
}

/// Measures every volume of `pod` (`volumes` as the volume manager has them
/// set up), off the async threads.
fn measure_pod(pod: &Pod, volumes: &[(String, PathBuf)], budget: Duration) -> Vec<VolumeFigures> {
    let deadline = Instant::now() + budget;
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let mut out = Vec::new();
    for (name, path) in volumes {
        let Some((how, pvc)) = plan(pod, name, path) else {
            continue;
        };
        let started = Instant::now();
        let figures = measure(path, how, deadline);
        crate::metrics::volume_stats_measured(
            match how {
                Measure::StatFs => "statfs",
                Measure::Du => "du",
                Measure::Block => "block",
            },
            started.elapsed(),
        );
        let Some([capacity, available, used, inodes, inodes_free, inodes_used]) = figures else {
            continue;
        };
        out.push(VolumeFigures {
            name: name.clone(),
            pvc,
            time,
            capacity,
            available,
            used,
            inodes,
            inodes_free,
            inodes_used,
            abnormal: None,
            local_ephemeral: local_ephemeral(pod, name),
        });
    }
    out
}

/// The longest one pod's measurement may take before its figures so far
/// are kept (a huge or hung volume must not hold the others back).
const POD_BUDGET: Duration = Duration::from_secs(10);

/// Measures the volumes of every pod `pods()` lists (with `volumes(uid)` as
/// the volume manager has them, and its CSI volumes through `csi`) every
/// `period`, until `token` is cancelled.
pub async fn run(
    cache: VolumeStatsCache,
    pods: impl Fn() -> Vec<Arc<Pod>> + Send + Sync,
    volumes: impl Fn(&str) -> Vec<(String, PathBuf)> + Send + Sync,
    csi: Option<CsiVolumes>,
    period: Duration,
    token: CancellationToken,
) {
    let period = period.max(Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut live = HashSet::new();
        for pod in pods() {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            live.insert(uid.clone());
            let vols = volumes(&uid);
            let mut figures = if vols.is_empty() {
                Vec::new()
            } else {
                let p = pod.clone();
                let work = tokio::task::spawn_blocking(move || measure_pod(&p, &vols, POD_BUDGET));
                tokio::select! {
                    _ = token.cancelled() => return,
                    r = tokio::time::timeout(POD_BUDGET * 2, work) => match r {
                        Ok(Ok(f)) => f,
                        // A hung file system: keep the last figures.
                        _ => {
                            tracing::debug!(pod_uid = %uid, "volume stats calculation did not finish");
                            continue;
                        }
                    },
                }
            };
            if let Some(csi) = &csi {
                tokio::select! {
                    _ = token.cancelled() => return,
                    f = measure_csi(&pod, &uid, csi) => figures.extend(f),
                }
            }
            cache.set(&uid, figures);
        }
        cache.retain(&live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        crate::testutil::tempdir(&format!("volstats-{tag}"))
    }

    #[test]
    fn du_counts_blocks_and_inodes_once_and_follows_no_link() {
        let d = tempdir("du");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/f"), vec![7u8; 100_000]).unwrap();
        std::fs::hard_link(d.join("sub/f"), d.join("g")).unwrap();
        // A link out of the volume is counted as itself, never followed.
        let outside = tempdir("du-outside");
        std::fs::write(outside.join("big"), vec![1u8; 1_000_000]).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("out")).unwrap();
        let (bytes, inodes) = disk_usage(&d, Instant::now() + Duration::from_secs(10));
        // root, sub, f (once for both names), the link.
        assert_eq!(inodes, 4);
        assert!((100_000..500_000).contains(&bytes), "{bytes}");
        // A deadline already passed gives what was counted so far: nothing.
        assert_eq!(disk_usage(&d, Instant::now()), (0, 0));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn volumes_are_measured_as_upstreams_plugins_and_claims_named() {
        let d = tempdir("plan");
        std::fs::write(d.join("f"), vec![1u8; 50_000]).unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
                {"name": "eph", "ephemeral": {}},
                {"name": "host", "hostPath": {"path": "/"}}
            ]}
        }))
        .unwrap();
        let vols: Vec<(String, PathBuf)> = ["scratch", "data", "eph", "host"]
            .iter()
            .map(|n| (n.to_string(), d.clone()))
            .collect();
        let timed = || {
            (
                crate::metrics::volume_stats_measured_count("du"),
                crate::metrics::volume_stats_measured_count("statfs"),
            )
        };
        let before = timed();
        let f = measure_pod(&pod, &vols, Duration::from_secs(10));
        // Each measurement timed under its provider's source (other tests
        // may measure meanwhile: at least this pod's).
        let after = timed();
        assert!(
            after.0 > before.0 && after.1 >= before.1 + 2,
            "{before:?} {after:?}"
        );
        let names: Vec<_> = f.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["scratch", "data", "eph"],
            "hostPath reports nothing"
        );
        assert!(f[0].used >= 50_000 && f[0].inodes_used == 2, "{:?}", f[0]);
        assert!(f[0].pvc.is_none());
        assert_eq!(f[1].pvc, Some(("prod".into(), "db".into())));
        assert_eq!(f[2].pvc, Some(("prod".into(), "web-eph".into())));
        // statfs: the file system's use, capacity and free space.
        assert!(f[1].capacity >= f[1].available && f[1].used > 0);
        let json = serde_json::to_value(f[1].to_stats()).unwrap();
        assert_eq!(json["name"], "data");
        assert_eq!(
            json["pvcRef"],
            serde_json::json!({"name": "db", "namespace": "prod"})
        );
        assert!(json["usedBytes"].as_u64().unwrap() > 0);
        assert!(serde_json::to_value(f[0].to_stats())
            .unwrap()
            .get("pvcRef")
            .is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// parsePodVolumeStats: `volumeHealthStats` only when the figures
    /// carry a condition (CSIVolumeHealth with a VOLUME_CONDITION driver).
    #[test]
    fn volume_health_is_in_the_summary_only_when_read() {
        let mut f = VolumeFigures {
            name: "data".into(),
            pvc: None,
            time: 0,
            capacity: 1,
            available: 1,
            used: 0,
            inodes: 0,
            inodes_free: 0,
            inodes_used: 0,
            abnormal: None,
            local_ephemeral: false,
        };
        let json = serde_json::to_value(f.to_stats()).unwrap();
        assert!(json.get("volumeHealthStats").is_none(), "{json}");
        for abnormal in [true, false] {
            f.abnormal = Some(abnormal);
            let json = serde_json::to_value(f.to_stats()).unwrap();
            assert_eq!(
                json["volumeHealthStats"],
                serde_json::json!({ "abnormal": abnormal })
            );
        }
    }

    /// metrics_block.go: a block volume's capacity is its size, found by
    /// seeking to the end; the rest is zero. A claim whose path is a
    /// block device (a mapped raw block volume's bind) is measured so.
    #[test]
    fn a_block_volume_reports_its_size_as_capacity() {
        let d = tempdir("block");
        let file = d.join("image");
        std::fs::write(&file, vec![0u8; 12_345]).unwrap();
        assert_eq!(
            measure(&file, Measure::Block, Instant::now()),
            Some([12_345, 0, 0, 0, 0, 0])
        );
        // Never through a link.
        std::os::unix::fs::symlink(&file, d.join("link")).unwrap();
        assert_eq!(
            measure(&d.join("link"), Measure::Block, Instant::now()),
            None
        );
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "disk", "persistentVolumeClaim": {"claimName": "blk"}}
            ]}
        }))
        .unwrap();
        assert_eq!(
            plan(&pod, "disk", &file).map(|p| p.0),
            Some(Measure::StatFs)
        );
        // A device node (loop0's numbers; mknod needs root).
        let node = d.join("dev");
        let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        let made =
            unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(7, 0)) } == 0;
        if made {
            assert_eq!(plan(&pod, "disk", &node).map(|p| p.0), Some(Measure::Block));
        } else {
            eprintln!("skipped the device node: mknod failed");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn the_cache_follows_the_pods() {
        let d = tempdir("cache");
        let pod: Arc<Pod> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "prod", "uid": "u1"},
                "spec": {"containers": [], "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "db"}}
                ]}
            }))
            .unwrap(),
        );
        let cache = VolumeStatsCache::default();
        let listed = Arc::new(Mutex::new(vec![pod]));
        let token = CancellationToken::new();
        let (c, l, dd, t) = (cache.clone(), listed.clone(), d.clone(), token.clone());
        let task = tokio::spawn(async move {
            run(
                c,
                move || l.lock().clone(),
                move |_| vec![("data".to_string(), dd.clone())],
                None,
                Duration::from_secs(1),
                t,
            )
            .await
        });
        let until = Instant::now() + Duration::from_secs(10);
        while cache.claims().is_empty() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(cache.pod("u1").len(), 1);
        assert_eq!(cache.claims()[0].pvc, Some(("prod".into(), "db".into())));
        // The pod goes: its figures go at the next calculation.
        listed.lock().clear();
        let until = Instant::now() + Duration::from_secs(10);
        while !cache.pod("u1").is_empty() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(cache.pod("u1").is_empty());
        token.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }
}
