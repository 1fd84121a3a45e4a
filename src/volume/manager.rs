//! The volume manager (upstream `pkg/kubelet/volumemanager`): a desired
//! state of the world (the pods whose volumes should be set up, written by
//! pod workers), an actual state of the world (what is set up), and a
//! reconciler task that makes the second follow the first. Pod workers
//! wait for a pod's volumes before its containers start, and hand a
//! terminated pod back so its volumes are torn down.
//!
//! Each mount or unmount is one operation per (pod, volume) in its own
//! task, so a slow API server or a hung file system delays that volume
//! only. ConfigMap, Secret, downwardAPI and projected volumes are written
//! again when the pod syncs, when an object they read changes, and before a
//! token in them is due for refresh.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::{pod_dir, VolumeError};
use crate::kuberuntime::RuntimeOptions;
use crate::objects::ObjectManager;

/// How long a pod worker waits for its volumes (upstream
/// podAttachAndMountTimeout: 2m3s).
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(123);
/// One operation's file-system part may take this long.
const FS_DEADLINE: Duration = Duration::from_secs(30);
/// Upstream's operation backoff: 500 ms doubling to 2m2s.
const RETRY_INITIAL: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(122);
/// The reconciler looks again at least this often.
const RECONCILE_MAX_IDLE: Duration = Duration::from_secs(10);

/// A volume as it is set up.
#[derive(Debug, Clone)]
pub struct Mounted {
    /// What containers bind.
    pub path: PathBuf,
    /// The directory rkubelet made for it (removed at teardown); None for
    /// hostPath and persistent volumes, which belong to the host.
    owned: Option<PathBuf>,
    /// Written from API data: rewritten on remount.
    remountable: bool,
    /// Unix seconds when a token in it is due for refresh.
    refresh_at: Option<i64>,
    /// Has volume stats: upstream's hostPath plugin (also behind a PV)
    /// offers no metrics, so its volumes are left out of pod stats.
    measured: bool,
    /// A CSI volume: its driver unpublishes it at tear-down.
    csi: Option<Arc<super::csi::mounter::Published>>,
    /// A CSI volume through a claim (claim name, read-only): checked for
    /// online expansion at each pod sync.
    claim: Option<(String, bool)>,
    /// A raw block volume mapped for the pod (`volumeMode: Block`): the
    /// path is the pod's device link; unmapped at tear-down.
    block: Option<Arc<super::block::Mapped>>,
}

impl Mounted {
    /// A CSI volume whose CSIDriver asks for `requiresRepublish`.
    fn republish(&self) -> bool {
        self.csi.as_ref().is_some_and(|p| p.republish)
    }
}

struct Desired {
    pod: Arc<Pod>,
    /// Remount requested (a pod sync, an object change).
    remount: bool,
    /// A pod sync happened: CSI volumes with requiresRepublish are
    /// published again (upstream's ReprocessPod marks every pod sync's
    /// volumes for remount; the CSI plugin's RequiresRemount says yes).
    resync: bool,
}

struct Failure {
    error: String,
    attempts: u32,
    retry_at: Instant,
    /// Waiting for the attach/detach controller: tried again as soon as
    /// the Node changes, not only at the backoff.
    node_wait: bool,
    /// Upstream's populator refused the volume (`Failed::Process`): the
    /// pod's wait fails at once instead of at its timeout.
    process: bool,
}

/// Why a set-up failed, and what upstream records for it.
#[derive(Debug)]
enum Failed {
    /// MountVolume.SetUp failed: a FailedMount event naming the pod's
    /// volume.
    SetUp(String),
    /// A failure with its own event (reason, message), or none (upstream's
    /// VerifyControllerAttachedVolume records no event); `node_wait` as in
    /// [`Failure`].
    Other {
        error: String,
        event: Option<(&'static str, String)>,
        node_wait: bool,
    },
    /// The desired-state populator could not take the volume (upstream's
    /// AddErrorToPod): the pod's FailedMount is upstream's "Unable to
    /// attach or mount volumes: ... failed to process volumes=[...]".
    Process(String),
}

impl Failed {
    /// Upstream's populator refuses the volume before any set-up (a
    /// volume mode that does not match its use).
    fn process(error: String) -> Self {
        Failed::Process(error)
    }
}

impl From<String> for Failed {
    fn from(e: String) -> Self {
        Failed::SetUp(e)
    }
}

impl From<&str> for Failed {
    fn from(e: &str) -> Self {
        Failed::SetUp(e.to_string())
    }
}

impl Failed {
    fn error(&self) -> &str {
        match self {
            Failed::SetUp(e) | Failed::Other { error: e, .. } | Failed::Process(e) => e,
        }
    }

    /// A CSI persistent volume's failure; `spec` is the PV's name, which
    /// upstream's messages name (the volume spec of a claim is its PV).
    fn from_csi(e: super::csi::mounter::SetUpError, spec: &str) -> Self {
        use super::csi::mounter::SetUpError;
        match e {
            SetUpError::SetUp(error) => Failed::Other {
                event: Some((
                    "FailedMount",
                    format!("MountVolume.SetUp failed for volume {spec:?} : {error}"),
                )),
                error,
                node_wait: false,
            },
            SetUpError::Attach(a) => Failed::Other {
                error: a.to_string(),
                event: a.event(spec),
                node_wait: a.waits_for_node(),
            },
            // Upstream's GenerateMapVolumeFunc records FailedMapVolume.
            SetUpError::Map { step, error } => Failed::Other {
                event: Some((
                    "FailedMapVolume",
                    format!("{step} failed for volume {spec:?} : {error}"),
                )),
                error,
                node_wait: false,
            },
        }
    }
}

#[derive(Default)]
struct State {
    desired: HashMap<String, Desired>,
    actual: HashMap<String, HashMap<String, Mounted>>,
    in_flight: HashSet<(String, String)>,
    /// The in-flight operations that tear a volume down (and may unstage
    /// its device); the others (a republish, an expansion check) leave the
    /// device staged.
    tearing_down: HashSet<(String, String)>,
    failures: HashMap<(String, String), Failure>,
    /// When each (pod, volume) was first asked to be set up (upstream's
    /// podToMount.mountRequestTime; renewed at each set-up of a volume
    /// whose plugin remounts), for `overall_volume_mount`.
    mount_requested: HashMap<(String, String), Instant>,
}

struct Inner {
    root: PathBuf,
    objects: ObjectManager,
    opts: RuntimeOptions,
    state: Mutex<State>,
    wake: Notify,
    /// Bumped on every change of the actual state; waiters watch it.
    changed: watch::Sender<u64>,
    started: std::sync::atomic::AtomicBool,
    /// Where `start` put the reconciler; orphan cleanups run there too.
    tasks: std::sync::OnceLock<TaskTracker>,
    /// An orphan cleanup is running; and when each orphan was last logged.
    orphans: Mutex<(bool, HashMap<String, Instant>)>,
    /// The CSI drivers registered on this node.
    csi: super::csi::Registry,
}

/// The handle pod workers and servers hold; cheap to clone.
#[derive(Clone)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

/// What to do for one (pod, volume).
enum Op {
    Mount {
        pod: Arc<Pod>,
        volume: Box<Volume>,
        uid: String,
    },
    Unmount {
        uid: String,
        name: String,
        mounted: Mounted,
    },
    /// Online expansion of a published CSI volume, if due.
    Expand {
        pod: Arc<Pod>,
        uid: String,
        name: String,
        mounted: Mounted,
    },
}

impl VolumeManager {
    pub fn new(objects: ObjectManager, opts: RuntimeOptions) -> Self {
        VolumeManager {
            inner: Arc::new(Inner {
                root: opts.root_dir.clone(),
                objects,
                opts,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                changed: watch::channel(0).0,
                started: Default::default(),
                tasks: Default::default(),
                orphans: Default::default(),
                csi: Default::default(),
            }),
        }
    }

    /// Spawns the reconciler. Without it (unit tests), waiters run the
    /// operations of their own pod themselves.
    pub fn start(&self, tasks: &TaskTracker, token: CancellationToken) {
        self.inner
            .started
            .store(true, std::sync::atomic::Ordering::Release);
        let _ = self.inner.tasks.set(tasks.clone());
        // volume_manager_total_volumes reads the states at each scrape.
        let w = Arc::downgrade(&self.inner);
        crate::metrics::certvol::add_volume_source(Box::new(move || {
            w.upgrade()
                .map(|inner| VolumeManager { inner }.volume_counts())
        }));
        let me = self.clone();
        let t = tasks.clone();
        tasks.spawn(tracing::Instrument::instrument(
            async move { me.reconcile_loop(t, token).await },
            tracing::info_span!("volume-manager"),
        ));
        // Upstream's reconstruction, for volumesInUse only: the persistent
        // CSI volumes still published in pod directories stay reported in
        // use until torn down, so a restarted kubelet never lets the
        // controller detach a volume under a running pod.
        let me = self.clone();
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                let root = me.inner.root.clone();
                match crate::blocking::try_run(
                    "read the CSI volumes of pod directories".to_string(),
                    FS_DEADLINE,
                    move || Ok::<_, String>(super::csi::attach::reconstruct(&root)),
                )
                .await
                {
                    Ok(found) => {
                        let mut u = me.inner.csi.in_use();
                        for (uid, name) in &found {
                            u.mark_reconstructed(uid, name);
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "reading the CSI volumes of pod directories failed; volumesInUse starts from the pods set up from now on")
                    }
                }
                me.inner.csi.in_use().set_synced();
            },
            tracing::debug_span!("volume-reconstruct"),
        ));
    }

    /// Adds the pod to the desired state (or updates it, asking for its
    /// API-data volumes to be written again) and waits until every volume
    /// is set up: upstream WaitForAttachAndMount. Returns volume name →
    /// host path. A volume still failing at the timeout fails the wait
    /// with upstream's message, and a FailedMount event.
    pub async fn wait_for_attach_and_mount(
        &self,
        pod: &Pod,
    ) -> Result<HashMap<String, PathBuf>, VolumeError> {
        self.wait_with_timeout(pod, MOUNT_TIMEOUT).await
    }

    async fn wait_with_timeout(
        &self,
        pod: &Pod,
        timeout: Duration,
    ) -> Result<HashMap<String, PathBuf>, VolumeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let names = volume_names(pod);
        {
            // A changed pod (labels, annotations, resources read by the
            // downward API) asks for its API-data volumes to be written
            // again; object changes and token refreshes do so on their
            // own, so an unchanged pod's sync costs no rewrite.
            let mut st = self.inner.state.lock();
            let same = st.desired.get(&uid).is_some_and(|d| *d.pod == *pod);
            if !same {
                st.desired.insert(
                    uid.clone(),
                    Desired {
                        pod: Arc::new(pod.clone()),
                        remount: true,
                        resync: true,
                    },
                );
            } else if let Some(d) = st.desired.get_mut(&uid) {
                d.resync = true;
            }
        }
        self.inner.wake.notify_one();
        let deadline = Instant::now() + timeout;
        if self
            .wait_until(&uid, deadline, |me| {
                me.mounted_paths(&uid, &names).is_some() || me.process_failed(&uid)
            })
            .await
        {
            if let Some(paths) = self.mounted_paths(&uid, &names) {
                return Ok(paths);
            }
            if let Some(e) = self.process_error(pod, &uid, &names) {
                return Err(e);
            }
        }
        let (unmounted, errors) = {
            let st = self.inner.state.lock();
            let got = st.actual.get(&uid);
            let unmounted: Vec<String> = names
                .iter()
                .filter(|n| got.is_none_or(|g| !g.contains_key(*n)))
                .cloned()
                .collect();
            let errors: Vec<String> = unmounted
                .iter()
                .filter_map(|n| {
                    st.failures
                        .get(&(uid.clone(), n.clone()))
                        .map(|f| format!("{n}: {}", f.error))
                })
                .collect();
            (unmounted, errors)
        };
        let message = format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}]: timed out waiting for the condition",
            unmounted.join(" "),
            names.join(" ")
        );
        Err(failed_mount(pod, message, errors.join("; ")))
    }

    /// A volume of the pod refused by upstream's populator (a volume mode
    /// that does not match its use).
    fn process_failed(&self, uid: &str) -> bool {
        let st = self.inner.state.lock();
        st.failures.iter().any(|((u, _), f)| u == uid && f.process)
    }

    /// Upstream's WaitForAttachAndMount error when the populator refused
    /// volumes (its wait ends at once on them), with kubelet.go's
    /// FailedMount event.
    fn process_error(&self, pod: &Pod, uid: &str, names: &[String]) -> Option<VolumeError> {
        let (unmounted, failed, errors) = {
            let st = self.inner.state.lock();
            let got = st.actual.get(uid);
            let unmounted: Vec<String> = names
                .iter()
                .filter(|n| got.is_none_or(|g| !g.contains_key(*n)))
                .cloned()
                .collect();
            let mut failed: Vec<(String, String)> = st
                .failures
                .iter()
                .filter(|((u, _), f)| u == uid && f.process)
                .map(|((_, n), f)| (n.clone(), f.error.clone()))
                .collect();
            failed.sort();
            let errors: Vec<String> = failed.iter().map(|(_, e)| e.clone()).collect();
            let failed: Vec<String> = failed.into_iter().map(|(n, _)| n).collect();
            (unmounted, failed, errors)
        };
        if failed.is_empty() {
            return None;
        }
        let message = format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[{}]: {}",
            unmounted.join(" "),
            failed.join(" "),
            errors.join("; ")
        );
        Some(failed_mount(pod, message, String::new()))
    }

    /// Removes the pod from the desired state and waits (up to `deadline`)
    /// until its volumes are torn down.
    pub async fn unmount_pod(&self, uid: &str, deadline: Duration) -> Result<(), VolumeError> {
        self.inner.state.lock().desired.remove(uid);
        self.inner.wake.notify_one();
        let until = Instant::now() + deadline;
        let gone = |me: &Self| !me.inner.state.lock().actual.contains_key(uid);
        if self.wait_until(uid, until, gone).await {
            // CSI volumes set up before a restart are not in the actual
            // state: their vol_data.json says what to unpublish.
            super::csi::mounter::tear_down_orphaned(&self.inner.csi, &self.inner.root, uid)
                .await
                .map_err(|e| VolumeError::Timeout {
                    message: format!("CSI volumes of pod {uid} are still published"),
                    errors: e,
                })?;
            self.inner.csi.in_use().release_pod(uid);
            return Ok(());
        }
        Err(VolumeError::Timeout {
            message: format!("volumes of pod {uid} are still set up"),
            errors: String::new(),
        })
    }

    /// Waits until `done` holds or `deadline` passes, woken by every
    /// change of the actual state. Without a reconciler (unit tests) the
    /// pod's own operations run here.
    async fn wait_until(&self, uid: &str, deadline: Instant, done: impl Fn(&Self) -> bool) -> bool {
        let mut changed = self.inner.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if done(self) {
                return true;
            }
            if !self
                .inner
                .started
                .load(std::sync::atomic::Ordering::Acquire)
            {
                for op in self.plan(Some(uid)) {
                    self.execute(op).await;
                }
                if done(self) {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                let next = self.next_due().unwrap_or(deadline).min(deadline);
                tokio::time::sleep_until(next).await;
                continue;
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Removes pod directories no pod owns any more (upstream
    /// cleanupOrphanedPodDirs, run at housekeeping): volumes and subPath
    /// binds are unmounted first, symlinks never followed. `known` says
    /// which pod UIDs are still wanted or running. A directory that cannot
    /// go is logged once per 10 minutes, not at every housekeeping pass.
    pub fn cleanup_orphaned_pod_dirs(&self, known: impl Fn(&str) -> bool + Send + 'static) {
        let Some(tasks) = self.inner.tasks.get() else {
            return;
        };
        {
            let mut o = self.inner.orphans.lock();
            if o.0 {
                return;
            }
            o.0 = true;
        }
        let me = self.clone();
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                let pods = me.inner.root.join("pods");
                let listed = crate::blocking::try_run(
                    format!("list {}", pods.display()),
                    FS_DEADLINE,
                    move || -> std::io::Result<Vec<String>> {
                        let mut out = Vec::new();
                        for e in std::fs::read_dir(&pods)? {
                            out.push(e?.file_name().to_string_lossy().into_owned());
                        }
                        Ok(out)
                    },
                )
                .await
                .unwrap_or_default();
                let orphans: Vec<String> = {
                    let st = me.inner.state.lock();
                    listed
                        .into_iter()
                        .filter(|u| {
                            !known(u) && !st.desired.contains_key(u) && !st.actual.contains_key(u)
                        })
                        .collect()
                };
                let (found, mut failed) = (orphans.len(), 0);
                for uid in orphans {
                    let (root, u) = (me.inner.root.clone(), uid.clone());
                    // CSI drivers unpublish their volumes first; the
                    // directory stays while one cannot.
                    let r = match super::csi::mounter::tear_down_orphaned(
                        &me.inner.csi,
                        &root,
                        &uid,
                    )
                    .await
                    {
                        Err(e) => Err(e),
                        Ok(()) => {
                            // Its CSI volumes are unpublished (and unstaged
                            // when last): no longer in use.
                            me.inner.csi.in_use().release_pod(&uid);
                            crate::blocking::try_run(
                                format!("cleanup of orphaned pod {uid}"),
                                FS_DEADLINE,
                                move || {
                                    // Block volumes mapped before a restart:
                                    // their global binds live outside the
                                    // pod directory.
                                    super::block::unmap_orphaned(&root, &u).map_err(|e| {
                                        super::subpath::SubPathError::Io {
                                            sub_path: String::new(),
                                            what: "unmap block volumes".into(),
                                            source: std::io::Error::other(e.to_string()),
                                        }
                                    })?;
                                    super::cleanup_pod_dir(&root, &u)
                                },
                            )
                            .await
                        }
                    };
                    let mut o = me.inner.orphans.lock();
                    match r {
                        Ok(()) => {
                            info!(pod_uid = %uid, "removed the directory of an orphaned pod");
                            o.1.remove(&uid);
                        }
                        Err(e) => {
                            failed += 1;
                            let now = Instant::now();
                            let quiet = o.1.get(&uid).is_some_and(|t| {
                                now.duration_since(*t) < Duration::from_secs(600)
                            });
                            if !quiet {
                                warn!(pod_uid = %uid, error = %e, "orphaned pod found, but its directory could not be removed; retrying quietly");
                                o.1.insert(uid, now);
                            }
                        }
                    }
                }
                crate::metrics::orphan_pod_sweep(found, failed);
                me.inner.orphans.lock().0 = false;
            },
            tracing::debug_span!("orphaned-pod-dirs"),
        ));
    }

    /// The registry of CSI drivers the plugin watcher fills.
    pub fn csi_drivers(&self) -> &super::csi::Registry {
        &self.inner.csi
    }

    /// The pod's volumes as set up: name → host path.
    pub fn pod_volumes(&self, uid: &str) -> Vec<(String, PathBuf)> {
        self.volumes_where(uid, |m| Some(m.path.clone()))
    }

    /// The pod's volumes that have stats (not hostPath ones, direct or
    /// through a PV): name → host path; for a local raw block volume its
    /// bind under the global map path (upstream's local NewBlockVolumeMapper
    /// measures `<global map path>/<pod uid>` with NewMetricsBlock).
    pub fn measured_volumes(&self, uid: &str) -> Vec<(String, PathBuf)> {
        self.volumes_where(uid, |m| {
            m.measured
                .then(|| m.block.as_ref().map_or(&m.path, |b| &b.bind).clone())
        })
    }

    /// The pod's published CSI volumes, by volume name (their stats come
    /// from the driver), raw block ones included: upstream's
    /// calcAndStoreStats measures the block volumes whose mapper
    /// SupportsMetrics, as csiBlockMapper does.
    pub fn csi_volumes(&self, uid: &str) -> Vec<(String, Arc<super::csi::mounter::Published>)> {
        self.volumes_where(uid, |m| m.csi.clone())
    }

    /// What `pick` takes of each of the pod's volumes as set up, by name.
    fn volumes_where<T>(
        &self,
        uid: &str,
        pick: impl Fn(&Mounted) -> Option<T>,
    ) -> Vec<(String, T)> {
        let st = self.inner.state.lock();
        let mut v: Vec<_> = st
            .actual
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|(n, m)| pick(m).map(|t| (n.clone(), t)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Volumes of the pod that failed to set up, with the last error and
    /// when the next attempt is (for `/debug/pods`).
    pub fn failing(&self, uid: &str) -> Vec<(String, String, Duration)> {
        let st = self.inner.state.lock();
        let now = Instant::now();
        let mut v: Vec<_> = st
            .failures
            .iter()
            .filter(|((u, _), _)| u == uid)
            .map(|((_, n), f)| {
                (
                    n.clone(),
                    f.error.clone(),
                    f.retry_at.saturating_duration_since(now),
                )
            })
            .collect();
        v.sort();
        v
    }

    fn mounted_paths(&self, uid: &str, names: &[String]) -> Option<HashMap<String, PathBuf>> {
        let st = self.inner.state.lock();
        let got = match st.actual.get(uid) {
            Some(g) => g,
            None if names.is_empty() => return Some(HashMap::new()),
            None => return None,
        };
        names
            .iter()
            .map(|n| got.get(n).map(|m| (n.clone(), m.path.clone())))
            .collect()
    }

    /// The earliest retry or token refresh.
    fn next_due(&self) -> Option<Instant> {
        let st = self.inner.state.lock();
        let now_wall = crate::kuberuntime::wall_now().as_secs() as i64;
        let now = Instant::now();
        let retries = st.failures.values().map(|f| f.retry_at);
        let refreshes = st
            .actual
            .values()
            .flat_map(|m| m.values())
            .filter_map(|m| m.refresh_at)
            .map(|at| now + Duration::from_secs((at - now_wall).max(0) as u64));
        retries.chain(refreshes).min()
    }

    /// The operations due now, for one pod or all.
    fn plan(&self, only: Option<&str>) -> Vec<Op> {
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        let now = Instant::now();
        let now_wall = crate::kuberuntime::wall_now().as_secs() as i64;
        let mut ops = Vec::new();
        for (uid, d) in st.desired.iter_mut() {
            if only.is_some_and(|o| o != uid) {
                continue;
            }
            let remount = std::mem::take(&mut d.remount);
            let resync = std::mem::take(&mut d.resync);
            let got = st.actual.get(uid);
            for v in d.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                let key = (uid.clone(), v.name.clone());
                if st.in_flight.contains(&key) {
                    continue;
                }
                let due = match got.and_then(|g| g.get(&v.name)) {
                    None => st.failures.get(&key).is_none_or(|f| f.retry_at <= now),
                    Some(m) => {
                        (m.remountable
                            && (remount || m.refresh_at.is_some_and(|at| at <= now_wall)))
                            || (m.republish() && (remount || resync))
                    }
                };
                if due {
                    // desired_state_of_world's AddPodToVolume keeps the
                    // first request time unless the plugin RequiresRemount
                    // (configMap, secret, downward API, projected).
                    let remounts = v.config_map.is_some()
                        || v.secret.is_some()
                        || v.downward_api.is_some()
                        || v.projected.is_some();
                    let at = st.mount_requested.entry(key.clone()).or_insert(now);
                    if remounts {
                        *at = now;
                    }
                    st.in_flight.insert(key);
                    ops.push(Op::Mount {
                        pod: d.pod.clone(),
                        volume: Box::new(v.clone()),
                        uid: uid.clone(),
                    });
                } else if let Some(m) = got
                    .and_then(|g| g.get(&v.name))
                    .filter(|m| resync && m.claim.is_some() && m.csi.is_some())
                {
                    // Upstream's populator looks at each pod's claims again
                    // for a size the node has to finish.
                    st.in_flight.insert(key);
                    ops.push(Op::Expand {
                        pod: d.pod.clone(),
                        uid: uid.clone(),
                        name: v.name.clone(),
                        mounted: m.clone(),
                    });
                }
            }
        }
        // Set up but no longer desired: the pod is gone, or the volume left
        // its spec.
        for (uid, vols) in &st.actual {
            if only.is_some_and(|o| o != uid) {
                continue;
            }
            let wanted = st.desired.get(uid).map(|d| volume_names(&d.pod));
            for (name, m) in vols {
                if wanted.as_ref().is_some_and(|w| w.contains(name)) {
                    continue;
                }
                let key = (uid.clone(), name.clone());
                if st.in_flight.contains(&key) {
                    continue;
                }
                st.in_flight.insert(key.clone());
                st.tearing_down.insert(key);
                ops.push(Op::Unmount {
                    uid: uid.clone(),
                    name: name.clone(),
                    mounted: m.clone(),
                });
            }
        }
        st.failures.retain(|(u, _), _| st.desired.contains_key(u));
        st.mount_requested
            .retain(|(u, _), _| st.desired.contains_key(u));
        let keep: HashSet<String> = st.desired.keys().chain(st.actual.keys()).cloned().collect();
        drop(guard);
        // Attachable volumes of pods gone before they were set up are no
        // longer in use.
        self.inner.csi.in_use().release_unused(|u| keep.contains(u));
        ops
    }

    async fn execute(&self, op: Op) {
        match op {
            Op::Expand {
                pod,
                uid,
                name,
                mounted,
            } => {
                if let (Some(p), Some((claim, read_only))) = (&mounted.csi, &mounted.claim) {
                    let _guard = self.inner.csi.lock_volume(&p.driver, &p.volume_id).await;
                    let mut due = None;
                    let r = super::csi::expand::expand_in_use(
                        &self.inner.csi,
                        &self.inner.objects,
                        &pod,
                        p,
                        claim,
                        *read_only,
                        &mut due,
                    )
                    .await;
                    // GenerateExpandInUseVolumeFunc's operation, run only
                    // when the claim asks the node to finish a resize.
                    if let Some(at) = due {
                        crate::metrics::certvol::storage_operation(
                            &mounted_plugin(&mounted),
                            "volume_fs_resize",
                            at.elapsed(),
                            r.is_ok(),
                        );
                    }
                    if let Err(e) = r {
                        // Tried again at the next pod sync.
                        warn!(pod_uid = %uid, volume = %name, error = %e, "NodeExpandVolume.NodeExpandVolume failed");
                    }
                }
                self.inner.state.lock().in_flight.remove(&(uid, name));
            }
            Op::Mount { pod, volume, uid } => {
                let had = self
                    .inner
                    .state
                    .lock()
                    .actual
                    .get(&uid)
                    .and_then(|g| g.get(&volume.name))
                    .is_some();
                let started = Instant::now();
                // Held until the actual state has the result, so another
                // pod's tear-down sees this pod among the volume's users.
                let mut guard = None;
                let r = set_up(&self.inner, &pod, &volume, had, &mut guard).await;
                let plugin = r
                    .as_ref()
                    .map_or_else(|_| spec_plugin(&volume), |m| Some(mounted_plugin(m)));
                // A raw block volume is mapped (GenerateMapVolumeFunc's
                // map_volume), the others mounted.
                let operation = match &r {
                    Ok(m) if m.block.is_some() => "map_volume",
                    _ => "volume_mount",
                };
                if let Some(p) = plugin {
                    crate::metrics::certvol::storage_operation(
                        &p,
                        operation,
                        started.elapsed(),
                        r.is_ok(),
                    );
                }
                let mut st = self.inner.state.lock();
                let key = (uid.clone(), volume.name.clone());
                st.in_flight.remove(&key);
                // GenerateMountVolumeFunc's end-to-end time, from the
                // mount request to a successful set-up (not for a map).
                if let (Ok(m), Some(at)) = (&r, st.mount_requested.get(&key)) {
                    if operation == "volume_mount" {
                        crate::metrics::certvol::volume_operation_total(
                            &mounted_plugin(m),
                            "overall_volume_mount",
                            at.elapsed(),
                        );
                    }
                }
                match r {
                    Ok(m) => {
                        st.failures.remove(&key);
                        if !had {
                            debug!(pod_uid = %uid, volume = %volume.name, path = %m.path.display(), "volume set up");
                        }
                        st.actual
                            .entry(uid)
                            .or_default()
                            .insert(volume.name.clone(), m);
                    }
                    Err(f) => {
                        drop(guard.take());
                        let attempts = st.failures.get(&key).map_or(0, |f| f.attempts) + 1;
                        let wait = RETRY_INITIAL
                            .saturating_mul(1 << (attempts - 1).min(16))
                            .min(RETRY_MAX);
                        let event = match &f {
                            // Upstream's event for a failed SetUp.
                            Failed::SetUp(e) => Some((
                                "FailedMount",
                                format!(
                                    "MountVolume.SetUp failed for volume {:?} : {e}",
                                    volume.name
                                ),
                            )),
                            Failed::Other { event, .. } => event.clone(),
                            // The pod's wait records upstream's event.
                            Failed::Process(_) => None,
                        };
                        let node_wait = matches!(
                            f,
                            Failed::Other {
                                node_wait: true,
                                ..
                            }
                        );
                        if event.is_some() || matches!(f, Failed::Process(_)) {
                            warn!(pod_uid = %uid, volume = %volume.name, error = %f.error(), retry_in = ?wait, "volume set-up failed");
                        } else {
                            info!(pod_uid = %uid, volume = %volume.name, error = %f.error(), retry_in = ?wait, "volume waiting for the attach/detach controller");
                        }
                        if let Some((reason, message)) = event {
                            crate::events::pod(&pod, None, crate::events::WARNING, reason, message);
                        }
                        st.failures.insert(
                            key,
                            Failure {
                                error: f.error().to_string(),
                                attempts,
                                retry_at: Instant::now() + wait,
                                node_wait,
                                process: matches!(f, Failed::Process(_)),
                            },
                        );
                    }
                }
            }
            Op::Unmount { uid, name, mounted } => {
                // Until this pod leaves the actual state: a set-up waiting
                // for the volume then sees whether it is still staged.
                let _guard = match &mounted.csi {
                    Some(p) if p.staging.is_some() || mounted.claim.is_some() => {
                        Some(self.inner.csi.lock_volume(&p.driver, &p.volume_id).await)
                    }
                    _ => None,
                };
                let (plugin, started) = (mounted_plugin(&mounted), Instant::now());
                // A staged volume is unstaged when no other pod still
                // publishes it.
                let still_used = |p: &super::csi::mounter::Published| {
                    p.staging.is_some() && {
                        let st = self.inner.state.lock();
                        st.actual.iter().any(|(u, vols)| {
                            vols.iter().any(|(n, m)| {
                                (u != &uid || n != &name)
                                    && m.csi.as_ref().is_some_and(|o| {
                                        o.driver == p.driver && o.staging == p.staging
                                    })
                            })
                        })
                    }
                };
                let r = match (mounted.owned.clone(), mounted.csi.clone()) {
                    (_, Some(p)) if p.block => {
                        let used = still_used(&p);
                        super::csi::block::tear_down(
                            &self.inner.csi,
                            &p,
                            mounted.block.clone(),
                            used,
                        )
                        .await
                    }
                    _ if mounted.block.is_some() => {
                        let m = mounted.block.clone();
                        crate::blocking::try_run(
                            format!("unmap block volume {name} of pod {uid}"),
                            FS_DEADLINE,
                            move || match m {
                                Some(m) => super::block::unmap(&m).map_err(|e| e.to_string()),
                                None => Ok(()),
                            },
                        )
                        .await
                    }
                    (_, Some(p)) => {
                        let used = still_used(&p);
                        super::csi::mounter::tear_down(&self.inner.csi, &p, used).await
                    }
                    (owned, None) => match owned {
                        Some(dir) => crate::blocking::try_run(
                            format!("tear down volume {name} of pod {uid}"),
                            FS_DEADLINE,
                            move || super::subpath::remove_tree(&dir),
                        )
                        .await
                        .map_err(|e| e.to_string()),
                        None => Ok(()),
                    },
                };
                // GenerateUnmapVolumeFunc's unmap_volume for a local raw
                // block volume (its unmap_device is timed in block.rs); a
                // CSI volume's tear-down times its unpublish (volume_unmount
                // or unmap_volume) and unstage (unmount_device or
                // unmap_device) itself.
                if mounted.block.is_some() && mounted.csi.is_none() {
                    crate::metrics::certvol::storage_operation(
                        &plugin,
                        "unmap_volume",
                        started.elapsed(),
                        r.is_ok(),
                    );
                } else if mounted.csi.is_none() {
                    crate::metrics::certvol::storage_operation(
                        &plugin,
                        "volume_unmount",
                        started.elapsed(),
                        r.is_ok(),
                    );
                }
                if let (Ok(()), Some(p)) = (&r, &mounted.csi) {
                    // Unpublished, and unstaged if last: no longer in use
                    // by this pod (upstream reports until the device is
                    // unmounted).
                    if p.staging.is_some() {
                        self.inner.csi.in_use().release(
                            &uid,
                            &super::csi::attach::unique_name(&p.driver, &p.volume_id),
                        );
                    }
                }
                let mut st = self.inner.state.lock();
                st.in_flight.remove(&(uid.clone(), name.clone()));
                st.tearing_down.remove(&(uid.clone(), name.clone()));
                match r {
                    Ok(()) => {
                        debug!(pod_uid = %uid, volume = %name, "volume torn down");
                        if let Some(g) = st.actual.get_mut(&uid) {
                            g.remove(&name);
                            if g.is_empty() {
                                st.actual.remove(&uid);
                            }
                        }
                    }
                    // Tried again on the next pass.
                    Err(e) => {
                        warn!(pod_uid = %uid, volume = %name, error = %e, "volume tear-down failed")
                    }
                }
            }
        }
        self.inner.changed.send_modify(|g| *g += 1);
        // Its pod may have more to do (a remount asked for meanwhile).
        self.inner.wake.notify_one();
    }

    /// One (full plugin name, state) per volume of each state, for
    /// `volume_manager_total_volumes` (upstream's totalVolumesCollector:
    /// the actual state's mounted volumes and the desired state's volumes
    /// to mount). A claim not set up yet is left out of the desired count:
    /// its PV decides the plugin, and upstream's populator adds it to the
    /// desired state only once it has the PV.
    pub fn volume_counts(&self) -> crate::metrics::certvol::VolumeCounts {
        use crate::metrics::certvol::{STATE_ACTUAL, STATE_DESIRED};
        let st = self.inner.state.lock();
        let mut out = Vec::new();
        for vols in st.actual.values() {
            out.extend(vols.values().map(|m| (mounted_plugin(m), STATE_ACTUAL)));
        }
        for (uid, d) in &st.desired {
            for v in d.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                let set_up = || st.actual.get(uid)?.get(&v.name).map(mounted_plugin);
                if let Some(p) = spec_plugin(v).or_else(set_up) {
                    out.push((p, STATE_DESIRED));
                }
            }
        }
        out
    }

    /// Pods whose API-data volumes read the changed object get them
    /// written again.
    fn object_changed(&self, key: &crate::objects::ObjectKey) {
        let mut st = self.inner.state.lock();
        if key.kind == crate::objects::podcert::KIND {
            pod_certificate_changed(&mut st, &key.name, Instant::now());
            return;
        }
        // ClusterTrustBundles are cluster-scoped: any pod may read them.
        let cluster_scoped = key.kind == crate::objects::trustbundle::KIND;
        for d in st.desired.values_mut() {
            if !cluster_scoped
                && d.pod.metadata.namespace.as_deref().unwrap_or("default") != key.namespace
            {
                continue;
            }
            let reads = d
                .pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| volume_reads(v, key.kind, &key.name));
            if reads {
                d.remount = true;
            }
        }
    }

    async fn reconcile_loop(self, tasks: TaskTracker, token: CancellationToken) {
        let mut changes = self.inner.objects.subscribe();
        // Without watches nothing says when a ConfigMap or Secret changed:
        // API-data volumes are written again every resync period, as
        // upstream's pod syncs remount them (Get and Cache strategies).
        let mut drivers = self.inner.csi.subscribe();
        let mut node = self.inner.csi.subscribe_node();
        let (strategy, resync) = self.inner.objects.strategy();
        let mut resync_tick = (strategy != crate::objects::ChangeDetection::Watch).then(|| {
            let period = resync.max(Duration::from_secs(1));
            tokio::time::interval_at(Instant::now() + period, period)
        });
        loop {
            for op in self.plan(None) {
                let me = self.clone();
                tasks.spawn(async move { me.execute(op).await });
            }
            let idle = Instant::now() + RECONCILE_MAX_IDLE;
            let next = self.next_due().map_or(idle, |n| n.min(idle));
            let resync_due = async {
                match resync_tick.as_mut() {
                    Some(t) => t.tick().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = token.cancelled() => return,
                _ = self.inner.wake.notified() => {}
                _ = tokio::time::sleep_until(next) => {}
                // A CSI driver came or went: volumes waiting for one are
                // tried now rather than at their backoff.
                Ok(()) = drivers.changed() => {
                    let now = Instant::now();
                    for f in self.inner.state.lock().failures.values_mut() {
                        f.retry_at = f.retry_at.min(now);
                    }
                }
                // The Node changed: volumes waiting for the attach/detach
                // controller (volumesAttached, volumesInUse) look again.
                Ok(()) = node.changed() => {
                    let now = Instant::now();
                    for f in self.inner.state.lock().failures.values_mut() {
                        if f.node_wait {
                            f.retry_at = f.retry_at.min(now);
                        }
                    }
                }
                _ = resync_due => {
                    for d in self.inner.state.lock().desired.values_mut() {
                        d.remount = true;
                    }
                }
                c = changes.recv() => match c {
                    Ok(key) => self.object_changed(&key),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Missed some: rewrite every API-data volume.
                        for d in self.inner.state.lock().desired.values_mut() {
                            d.remount = true;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        changes = tokio::sync::broadcast::channel(1).1;
                    }
                },
            }
        }
    }
}

/// A PodCertificateRequest a source of pod `uid` waits on was issued,
/// denied or failed (the objects' watch said so): its podCertificate
/// volumes are set up again now rather than at their backoff, and the
/// mounted ones written again (a refresh's new certificate).
fn pod_certificate_changed(st: &mut State, uid: &str, now: Instant) {
    let Some(d) = st.desired.get_mut(uid) else {
        return;
    };
    let names: Vec<String> = d
        .pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| {
            v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .any(|s| s.pod_certificate.is_some())
        })
        .map(|v| v.name.clone())
        .collect();
    if names.is_empty() {
        return;
    }
    d.remount = true;
    for n in names {
        if let Some(f) = st.failures.get_mut(&(uid.to_string(), n)) {
            f.retry_at = f.retry_at.min(now);
        }
    }
}

fn volume_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| v.name.clone())
        .collect()
}

/// Whether the volume reads the object (`kind` "configmap", "secret" or
/// "clustertrustbundle"). Any change of a bundle rewrites every volume that
/// projects one: a signer's selection can gain or lose it, and a rewrite
/// with the same content leaves the files as they are.
fn volume_reads(v: &Volume, kind: &str, name: &str) -> bool {
    if kind == crate::objects::trustbundle::KIND {
        return v
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .any(|s| s.cluster_trust_bundle.is_some());
    }
    let (cms, secrets) = super::payload::refs(v);
    match kind {
        "configmap" => cms.iter().any(|n| n == name),
        "secret" => secrets.iter().any(|n| n == name),
        _ => false,
    }
}

/// `<pod dir>/volumes/kubernetes.io~<plugin>/<name>`.
fn plugin_dir(root: &Path, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pod_dir(root, uid)
        .join("volumes")
        .join(format!("kubernetes.io~{plugin}"))
        .join(name)
}

/// Sets up (or writes again) one volume.
/// `had`: the volume is set up already (a remount or republish).
/// `guard` takes the volume's lock when it is a CSI persistent volume
/// (known once its claim is resolved).
async fn set_up(
    inner: &Inner,
    pod: &Pod,
    v: &Volume,
    had: bool,
    guard: &mut Option<super::locks::VolumeGuard>,
) -> Result<Mounted, Failed> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let root = &inner.root;
    if let Some(hp) = &v.host_path {
        let path = PathBuf::from(&hp.path);
        check_host_path(&v.name, &path, hp.type_.as_deref().unwrap_or_default()).await?;
        return Ok(Mounted {
            path,
            owned: None,
            remountable: false,
            refresh_at: None,
            measured: false,
            csi: None,
            claim: None,
            block: None,
        });
    }
    if let Some(src) = &v.csi {
        let p =
            super::csi::mounter::set_up_inline(&inner.csi, &inner.objects, root, pod, &v.name, src)
                .await?;
        return Ok(csi_mounted(p));
    }
    if let Some(ed) = &v.empty_dir {
        let dir = plugin_dir(root, uid, "empty-dir", &v.name);
        let tmpfs = match ed.medium.as_deref().unwrap_or("") {
            "" => None,
            "Memory" => Some(memory_volume_size(
                pod,
                ed.size_limit.as_ref(),
                inner.opts.memory_capacity,
            )),
            other => return Err(format!("emptyDir medium {other:?} is not supported").into()),
        };
        let d = dir.clone();
        let owner = fs_group(pod);
        crate::blocking::try_run(
            format!("emptyDir {}", dir.display()),
            FS_DEADLINE,
            move || -> Result<(), std::io::Error> {
                std::fs::create_dir_all(&d)?;
                if let Some(size) = tmpfs {
                    mount_tmpfs(&d, size)?;
                }
                // Upstream makes emptyDir world-writable so any container
                // user can use it.
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777))?;
                match owner {
                    Some((gid, on_mismatch)) => super::ownership::set_volume_ownership(
                        &d,
                        gid,
                        false,
                        on_mismatch,
                        "kubernetes.io/empty-dir",
                    ),
                    None => Ok(()),
                }
            },
        )
        .await?;
        return Ok(Mounted {
            path: dir.clone(),
            owned: Some(dir),
            remountable: false,
            refresh_at: None,
            measured: true,
            csi: None,
            claim: None,
            block: None,
        });
    }
    if let Some(claim) = pvc_name(pod, v) {
        let pv = bound_pv(&inner.objects, pod, v, &claim).await?;
        let read_only = v
            .persistent_volume_claim
            .as_ref()
            .and_then(|c| c.read_only)
            .unwrap_or(false);
        // Upstream's populator: the PV's volumeMode against the pod's
        // volumeMounts / volumeDevices.
        let block = super::block::is_block(&pv);
        super::block::check_use(pod, &v.name, block).map_err(Failed::process)?;
        if let Some(src) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
            *guard = Some(inner.csi.lock_volume(&src.driver, &src.volume_handle).await);
        }
        // Staged already when set up before, for this pod or another
        // (upstream's device mount state is the volume's).
        let staged = had || device_set_up(inner, &pv, block);
        if block && pv.spec.as_ref().is_some_and(|s| s.csi.is_some()) {
            return csi_block(inner, pod, &pv, &claim, read_only, staged).await;
        }
        if block {
            return map_block(inner, uid, &pv).await;
        }
        if pv.spec.as_ref().is_some_and(|s| s.csi.is_some()) {
            let p = super::csi::mounter::set_up_persistent(
                &inner.csi,
                &inner.objects,
                root,
                pod,
                &pv,
                read_only,
                !staged,
            )
            .await
            .map_err(|e| Failed::from_csi(e, pv.metadata.name.as_deref().unwrap_or_default()))?;
            // Part of volume_mount upstream (GenerateMountVolumeFunc calls
            // it at every run, remounts included).
            let spec = pv.metadata.name.as_deref().unwrap_or_default();
            expand_during_set_up(
                inner,
                pod,
                &p,
                &claim,
                read_only,
                "FailedMount",
                format!("MountVolume.Setup failed while expanding volume for volume {spec:?}"),
            )
            .await?;
            let mut m = csi_mounted(p);
            m.claim = Some((claim, read_only));
            return Ok(m);
        }
        let (path, local) = persistent_path(v, &pv).await?;
        // Upstream's local plugin applies the fsGroup to a writable mount;
        // hostPath PVs are the host's and left alone.
        if let (true, false, Some((gid, on_mismatch))) = (local, read_only, fs_group(pod)) {
            let d = path.clone();
            crate::blocking::try_run(
                format!("local volume {}", path.display()),
                FS_DEADLINE,
                move || {
                    super::ownership::set_volume_ownership(
                        &d,
                        gid,
                        false,
                        on_mismatch,
                        "kubernetes.io/local-volume",
                    )
                },
            )
            .await
            .map_err(|e| format!("setting the fsGroup: {e}"))?;
        }
        return Ok(Mounted {
            path,
            owned: None,
            remountable: false,
            refresh_at: None,
            measured: local,
            csi: None,
            claim: None,
            block: None,
        });
    }
    let plugin = if v.config_map.is_some() {
        "configmap"
    } else if v.secret.is_some() {
        "secret"
    } else if v.downward_api.is_some() {
        "downward-api"
    } else if v.projected.is_some() {
        "projected"
    } else {
        return Err(VolumeError::Unsupported {
            volume: v.name.clone(),
        }
        .to_string()
        .into());
    };
    let built = super::payload::build(&inner.objects, &inner.opts, pod, v)
        .await
        .map_err(|e| e.to_string())?;
    // Secrets, tokens and downward API files never touch a disk (upstream's
    // secret, projected and downwardapi plugins wrap a memory-backed
    // emptyDir; configmap's wraps one on disk).
    let on_tmpfs = matches!(plugin, "secret" | "projected" | "downward-api");
    let dir = plugin_dir(root, uid, plugin, &v.name);
    let d = dir.clone();
    let size = inner.opts.memory_capacity;
    let refresh_at = built.refresh_at;
    let owner = fs_group(pod);
    let full_plugin = format!("kubernetes.io/{plugin}");
    let changed = crate::blocking::try_run(
        format!("{plugin} volume {}", dir.display()),
        FS_DEADLINE,
        move || -> Result<bool, String> {
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            if on_tmpfs {
                mount_tmpfs(&d, size).map_err(|e| e.to_string())?;
            }
            let changed =
                super::atomic_writer::write(&d, &built.files).map_err(|e| e.to_string())?;
            // A new data directory needs the group again (upstream calls
            // SetVolumeOwnership after each write; these volumes are
            // read-only to containers).
            if let (true, Some((gid, _))) = (changed, owner) {
                super::ownership::set_volume_ownership(&d, gid, true, false, &full_plugin)
                    .map_err(|e| format!("setting the fsGroup: {e}"))?;
            }
            Ok(changed)
        },
    )
    .await?;
    if changed {
        info!(pod_uid = %uid, volume = %v.name, "volume contents written");
    }
    Ok(Mounted {
        path: dir.clone(),
        owned: Some(dir),
        remountable: true,
        refresh_at,
        measured: true,
        csi: None,
        claim: None,
        block: None,
    })
}

/// Upstream's expandVolumeDuringMount: a claim whose resize waits for the
/// node is finished before the pod uses the volume (and at a republish);
/// a failure is event `reason` with `message: <error>`.
async fn expand_during_set_up(
    inner: &Inner,
    pod: &Pod,
    p: &super::csi::mounter::Published,
    claim: &str,
    read_only: bool,
    reason: &'static str,
    message: String,
) -> Result<(), Failed> {
    super::csi::expand::expand_in_use(
        &inner.csi,
        &inner.objects,
        pod,
        p,
        claim,
        read_only,
        &mut None,
    )
    .await
    .map_err(|e| Failed::Other {
        event: Some((reason, format!("{message} : {e}"))),
        error: e,
        node_wait: false,
    })
}

/// A claim bound to a `volumeMode: Block` CSI PV: staged, published and
/// mapped for the pod (`csi/block.rs`); expanded when its claim waits for
/// the node, as a mounted one, at a republish too (GenerateMapVolumeFunc
/// calls expandVolumeDuringMount at every run).
async fn csi_block(
    inner: &Inner,
    pod: &Pod,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    claim: &str,
    read_only: bool,
    staged: bool,
) -> Result<Mounted, Failed> {
    let spec = pv.metadata.name.as_deref().unwrap_or_default();
    let (p, mapped) = super::csi::block::set_up(
        &inner.csi,
        &inner.objects,
        &inner.root,
        pod,
        pv,
        read_only,
        !staged,
    )
    .await
    .map_err(|e| Failed::from_csi(e, spec))?;
    // Part of map_volume upstream.
    expand_during_set_up(
        inner,
        pod,
        &p,
        claim,
        read_only,
        "FailedMapVolume",
        format!("MapVolume.MarkVolumeAsMounted failed while expanding volume for volume {spec:?}"),
    )
    .await?;
    let mut m = mapped_volume(mapped);
    m.csi = Some(Arc::new(p));
    m.claim = Some((claim.to_string(), read_only));
    // Measured through the driver instead (`csi_volumes`).
    m.measured = false;
    Ok(m)
}

/// Whether CSI PV `pv` is set up (staged) on the node already, for some
/// pod: upstream's GenerateMountVolumeFunc and GenerateMapVolumeFunc skip
/// MountDevice / SetUpDevice when the volume's GetDeviceMountState is
/// DeviceGloballyMounted (operation_generator.go), so a second pod's
/// set-up publishes only. A volume being torn down (which may unstage it)
/// does not count: staging again is idempotent. Its other operations (a
/// republish, the expansion check of a pod sync) leave it staged.
fn device_set_up(
    inner: &Inner,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    block: bool,
) -> bool {
    let Some(src) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return false;
    };
    let st = inner.state.lock();
    st.actual.iter().any(|(uid, vols)| {
        vols.iter().any(|(name, m)| {
            m.csi.as_ref().is_some_and(|p| {
                p.driver == src.driver && p.volume_id == src.volume_handle && p.block == block
            }) && !st.tearing_down.contains(&(uid.clone(), name.clone()))
        })
    })
}

/// A raw block volume mapped for the pod: containers get its device link;
/// its stats are the device's size (upstream's local plugin measures it
/// with metrics_block.go; a CSI one is asked of its driver instead).
fn mapped_volume(mapped: super::block::Mapped) -> Mounted {
    Mounted {
        path: mapped.link.clone(),
        owned: None,
        remountable: false,
        refresh_at: None,
        measured: true,
        csi: None,
        claim: None,
        block: Some(Arc::new(mapped)),
    }
}

/// A claim bound to a `volumeMode: Block` PV: the device is mapped for the
/// pod (upstream's MapVolume for the local plugin; see `block.rs`).
async fn map_block(
    inner: &Inner,
    uid: &str,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
) -> Result<Mounted, Failed> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let Some(local) = pv.spec.as_ref().and_then(|s| s.local.as_ref()) else {
        return Err(format!(
            "PV {name}: raw block volumes are supported for local and CSI PVs only"
        )
        .into());
    };
    let (root, u, dev) = (
        inner.root.clone(),
        uid.to_string(),
        PathBuf::from(&local.path),
    );
    let n = name.clone();
    let mapped = crate::blocking::try_run(
        format!("map block volume {name} for pod {uid}"),
        FS_DEADLINE,
        move || super::block::map(&root, &u, &n, &dev).map_err(|e| e.to_string()),
    )
    .await
    .map_err(|e| format!("MapVolume.MapPodDevice failed for volume {name:?} : {e}"))?;
    Ok(mapped_volume(mapped))
}

/// Upstream's full plugin name of a volume from its spec
/// (GetFullQualifiedPluginNameForVolume: a CSI volume's carries its
/// driver), "N/A" for a kind rkubelet has no plugin for; `None` for a
/// claim, whose PV decides.
fn spec_plugin(v: &Volume) -> Option<String> {
    let name = if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
        return None;
    } else if let Some(c) = &v.csi {
        return Some(format!("kubernetes.io/csi:{}", c.driver));
    } else if v.host_path.is_some() {
        "kubernetes.io/host-path"
    } else if v.empty_dir.is_some() {
        "kubernetes.io/empty-dir"
    } else if v.config_map.is_some() {
        "kubernetes.io/configmap"
    } else if v.secret.is_some() {
        "kubernetes.io/secret"
    } else if v.downward_api.is_some() {
        "kubernetes.io/downward-api"
    } else if v.projected.is_some() {
        "kubernetes.io/projected"
    } else {
        "N/A"
    };
    Some(name.to_string())
}

/// The full plugin name of a volume as set up: a CSI volume's driver; the
/// plugin whose directory rkubelet made (`kubernetes.io~<plugin>`, the
/// escaped name as on upstream's disk); else a host path, of a local PV
/// (measured) or a hostPath volume or PV.
/// kubelet.go's FailedMount event for a pod whose volumes did not come,
/// and the error its worker reports.
fn failed_mount(pod: &Pod, message: String, errors: String) -> VolumeError {
    crate::events::pod(
        pod,
        None,
        crate::events::WARNING,
        "FailedMount",
        message.clone(),
    );
    VolumeError::Timeout { message, errors }
}

fn mounted_plugin(m: &Mounted) -> String {
    if let Some(p) = &m.csi {
        return format!("kubernetes.io/csi:{}", p.driver);
    }
    // Raw block volumes other than CSI ones (above) are local PVs.
    if m.block.is_some() {
        return "kubernetes.io/local-volume".into();
    }
    let escaped = m
        .owned
        .as_deref()
        .and_then(|d| d.parent()?.file_name()?.to_str());
    match (escaped, m.measured) {
        (Some(dir), _) => dir.replace('~', "/"),
        (None, true) => "kubernetes.io/local-volume".into(),
        (None, false) => "kubernetes.io/host-path".into(),
    }
}

/// A published CSI volume: the driver's mount is what containers bind;
/// rkubelet's directories go with the driver's unpublish, not before.
fn csi_mounted(p: super::csi::mounter::Published) -> Mounted {
    Mounted {
        path: p.target.clone(),
        owned: None,
        remountable: false,
        refresh_at: None,
        // Measured through the driver's NodeGetVolumeStats instead
        // (`csi_volumes`).
        measured: false,
        csi: Some(Arc::new(p)),
        claim: None,
        block: None,
    }
}

/// The pod's fsGroup and whether its change policy is OnRootMismatch.
fn fs_group(pod: &Pod) -> Option<(u32, bool)> {
    let sc = pod.spec.as_ref()?.security_context.as_ref()?;
    let gid = u32::try_from(sc.fs_group?).ok()?;
    Some((
        gid,
        sc.fs_group_change_policy.as_deref() == Some("OnRootMismatch"),
    ))
}

/// Upstream's SizeMemoryBackedVolumes: the node's memory, or the pod's
/// memory limit when smaller, or the volume's sizeLimit when smaller still.
fn memory_volume_size(
    pod: &Pod,
    limit: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    node_memory: i64,
) -> i64 {
    let mut size = node_memory;
    let spec = pod.spec.as_ref();
    let limits: Option<Vec<i64>> = spec
        .map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .map(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("memory"))
                .and_then(|q| crate::cm::quantity::parse_bytes(&q.0).ok())
        })
        .collect();
    if let Some(total) = limits.map(|l| l.iter().sum::<i64>()).filter(|t| *t > 0) {
        if size <= 0 || total < size {
            size = total;
        }
    }
    if let Some(l) = limit.and_then(|q| crate::cm::quantity::parse_bytes(&q.0).ok()) {
        if l > 0 && (size <= 0 || l < size) {
            size = l;
        }
    }
    size
}

/// Whether `dir` is a mount point: on another device than its parent.
pub(crate) fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    let m = std::fs::symlink_metadata(dir)?;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let p = std::fs::symlink_metadata(parent)?;
    Ok(m.dev() != p.dev() || m.ino() == p.ino())
}

/// Mounts a tmpfs on `dir` unless one is there already (a volume set up
/// before a restart is reused), kept out of swap where the kernel allows
/// (upstream's emptyDir adds `noswap` whenever it is supported).
fn mount_tmpfs(dir: &Path, size: i64) -> std::io::Result<()> {
    if is_mount_point(dir)? {
        return Ok(());
    }
    let mut opts: Vec<String> = Vec::new();
    if size > 0 {
        opts.push(format!("size={size}"));
    }
    if crate::cm::node::tmpfs_noswap_supported() {
        opts.push("noswap".into());
    }
    crate::cm::node::mount_tmpfs_with(dir, &opts.join(","))
}

/// The claim a volume uses: a persistentVolumeClaim's, or the generic
/// ephemeral volume's `<pod>-<volume>`.
fn pvc_name(pod: &Pod, v: &Volume) -> Option<String> {
    if let Some(c) = &v.persistent_volume_claim {
        return Some(c.claim_name.clone());
    }
    v.ephemeral.as_ref().map(|_| {
        format!(
            "{}-{}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            v.name
        )
    })
}

/// The PV behind a claim, with upstream's checks: the claim is Bound to a
/// PV that names it back, and an ephemeral volume's claim is owned by
/// this pod.
async fn bound_pv(
    objects: &ObjectManager,
    pod: &Pod,
    v: &Volume,
    claim: &str,
) -> Result<Arc<k8s_openapi::api::core::v1::PersistentVolume>, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pvc = objects
        .persistent_volume_claim(ns, claim)
        .await
        .map_err(|e| e.to_string())?;
    if v.ephemeral.is_some() {
        let owned = pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == pod.metadata.uid.as_ref());
        if !owned {
            return Err(format!(
                "PVC {ns}/{claim} was not created for pod {ns}/{} (pod is not owner)",
                pod.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty() && phase == Some("Bound"))
        .ok_or_else(|| {
            format!(
                "PVC {ns}/{claim} has non-bound phase (\"{}\") or empty pvc.Spec.VolumeName (\"\")",
                phase.unwrap_or("")
            )
        })?;
    let pv = objects
        .persistent_volume(&pv_name)
        .await
        .map_err(|e| e.to_string())?;
    let spec = pv.spec.as_ref().ok_or("the PV has no spec")?;
    let back = spec.claim_ref.as_ref();
    if back.and_then(|r| r.uid.as_ref()) != pvc.metadata.uid.as_ref() {
        return Err(format!("PV {pv_name} is not bound to claim {ns}/{claim}"));
    }
    Ok(pv)
}

/// The host path behind a claim bound to a hostPath or local PV (and
/// whether it is local).
async fn persistent_path(
    v: &Volume,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
) -> Result<(PathBuf, bool), String> {
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.as_ref().ok_or("the PV has no spec")?;
    let (path, kind, local) = if let Some(hp) = &spec.host_path {
        (
            PathBuf::from(&hp.path),
            hp.type_.clone().unwrap_or_default(),
            false,
        )
    } else if let Some(l) = &spec.local {
        (PathBuf::from(&l.path), "Directory".to_string(), true)
    } else {
        return Err(format!(
            "PV {pv_name}: only hostPath, local and CSI persistent volumes are supported"
        ));
    };
    check_host_path(&v.name, &path, &kind).await?;
    Ok((path, local))
}

/// The host path's type check, off the async threads: a hung mount
/// delays this volume only.
async fn check_host_path(volume: &str, path: &Path, kind: &str) -> Result<(), String> {
    let (p, name, kind) = (path.to_path_buf(), volume.to_string(), kind.to_string());
    crate::blocking::try_run(
        format!("hostPath {}", path.display()),
        FS_DEADLINE,
        move || super::check_host_path(&name, &p, &kind),
    )
    .await
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource,
        ObjectFieldSelector, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn root(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        std::env::temp_dir().join(format!(
            "rkubelet-vm-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
    }

    fn manager(root: &Path) -> VolumeManager {
        VolumeManager::new(
            ObjectManager::default(),
            RuntimeOptions {
                root_dir: root.to_path_buf(),
                memory_capacity: 1 << 30,
                ..Default::default()
            },
        )
    }

    pub(crate) fn pod(uid: &str, volumes: Vec<Volume>) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                volumes: Some(volumes),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("default".into());
        p
    }

    fn mount_options(dir: &Path) -> Option<String> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines()
            .find(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap()))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
    }

    #[tokio::test]
    async fn a_memory_empty_dir_is_a_tmpfs_of_its_size_limit_and_goes_with_the_pod() {
        let root = root("mem");
        let vm = manager(&root);
        let p = pod(
            "u-mem",
            vec![Volume {
                name: "cache".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(Quantity("8Mi".into())),
                }),
                ..Default::default()
            }],
        );
        let got = vm.wait_for_attach_and_mount(&p).await.unwrap();
        let dir = &got["cache"];
        assert!(dir.ends_with("pods/u-mem/volumes/kubernetes.io~empty-dir/cache"));
        let opts = mount_options(dir).expect("a tmpfs is mounted there");
        assert!(opts.contains("size=8192k"), "{opts}");
        // A second sync reuses the mount rather than stacking another.
        vm.wait_for_attach_and_mount(&p).await.unwrap();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let n = info
            .lines()
            .filter(|l| l.split(' ').nth(4) == dir.to_str())
            .count();
        assert_eq!(n, 1);
        vm.unmount_pod("u-mem", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(mount_options(dir).is_none() && !dir.exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_block_map_failure_is_upstreams_failed_map_volume() {
        use super::super::csi::mounter::SetUpError;
        let f = Failed::from_csi(
            SetUpError::Map {
                step: "MapVolume.MapPodDevice",
                error: "rpc error: boom".into(),
            },
            "pv1",
        );
        match f {
            Failed::Other {
                error,
                event: Some((reason, message)),
                node_wait: false,
            } => {
                assert_eq!(error, "rpc error: boom");
                assert_eq!(reason, "FailedMapVolume");
                assert_eq!(
                    message,
                    "MapVolume.MapPodDevice failed for volume \"pv1\" : rpc error: boom"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn memory_volumes_are_sized_by_the_smallest_of_node_pod_and_limit() {
        let mut p = pod("u", vec![]);
        assert_eq!(memory_volume_size(&p, None, 1000), 1000);
        let c = |mem: &str| k8s_openapi::api::core::v1::Container {
            resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity(mem.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().containers = vec![c("300"), c("200")];
        assert_eq!(memory_volume_size(&p, None, 1000), 500);
        assert_eq!(
            memory_volume_size(&p, Some(&Quantity("100".into())), 1000),
            100
        );
        assert_eq!(
            memory_volume_size(&p, Some(&Quantity("2k".into())), 1000),
            500
        );
    }

    /// Upstream's verifyVolumesMountedFunc ends the wait at once on the
    /// populator's errors (PopPodErrors) rather than at the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_volume_refused_by_the_populator_fails_the_wait_at_once() {
        use k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource;
        let root = root("process");
        let vm = manager(&root);
        let claim = |n: &str| Volume {
            name: n.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: n.into(),
                read_only: None,
            }),
            ..Default::default()
        };
        let p = pod("u-proc", vec![claim("disk"), claim("other")]);
        let later = Instant::now() + Duration::from_secs(3600);
        for (v, process) in [("disk", true), ("other", false)] {
            vm.inner.state.lock().failures.insert(
                ("u-proc".into(), v.into()),
                Failure {
                    error: format!("{v} failed"),
                    attempts: 1,
                    retry_at: later,
                    node_wait: false,
                    process,
                },
            );
        }
        let start = Instant::now();
        let e = vm
            .wait_with_timeout(&p, Duration::from_secs(600))
            .await
            .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "not at the timeout"
        );
        assert_eq!(
            e.to_string(),
            "Unable to attach or mount volumes: unmounted volumes=[disk other], unattached volumes=[], failed to process volumes=[disk]: disk failed"
        );
        // Without such a failure the wait runs to its timeout.
        vm.inner.state.lock().failures.retain(|_, f| !f.process);
        let e = vm
            .wait_with_timeout(&p, Duration::from_secs(600))
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("timed out waiting for the condition"),
            "{e}"
        );
        assert!(start.elapsed() >= Duration::from_secs(600));
    }

    #[tokio::test]
    async fn a_failing_volume_times_out_with_upstreams_message_then_mounts_on_retry() {
        let root = root("retry");
        let vm = manager(&root);
        vm.start(&TaskTracker::new(), CancellationToken::new());
        let file = root.join("needed");
        let p = pod(
            "u-retry",
            vec![Volume {
                name: "f".into(),
                host_path: Some(HostPathVolumeSource {
                    path: file.to_string_lossy().into(),
                    type_: Some("File".into()),
                }),
                ..Default::default()
            }],
        );
        std::fs::create_dir_all(&root).unwrap();
        let e = vm
            .wait_with_timeout(&p, Duration::from_millis(300))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("Unable to attach or mount volumes: unmounted volumes=[f], unattached volumes=[f]: timed out waiting for the condition"),
            "{e}"
        );
        assert!(
            e.contains("is not a file"),
            "the volume's own error is kept: {e}"
        );
        assert_eq!(vm.failing("u-retry").len(), 1);
        std::fs::write(&file, "x").unwrap();
        // Retried by the reconciler with upstream's backoff (0.5 s, 1 s, ...).
        let got = vm
            .wait_with_timeout(&p, Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(got["f"], file);
        assert!(vm.failing("u-retry").is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn downward_api_files_follow_the_pods_labels() {
        let root = root("dw");
        let vm = manager(&root);
        vm.start(&TaskTracker::new(), CancellationToken::new());
        let mut p = pod(
            "u-dw",
            vec![Volume {
                name: "info".into(),
                downward_api: Some(DownwardAPIVolumeSource {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "labels".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.labels".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        );
        p.metadata.labels = Some([("tier".to_string(), "a".to_string())].into());
        let got = vm.wait_for_attach_and_mount(&p).await.unwrap();
        let file = got["info"].join("labels");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "tier=\"a\"");
        // On tmpfs, as upstream's downwardapi plugin (a memory-backed
        // emptyDir); the old code wrote it to disk.
        assert!(mount_options(&got["info"]).is_some(), "a tmpfs");
        assert!(std::fs::symlink_metadata(&file).unwrap().is_symlink());
        p.metadata.labels = Some([("tier".to_string(), "b".to_string())].into());
        // A sync with the new pod asks for a rewrite; the reconciler does it.
        vm.wait_for_attach_and_mount(&p).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&file).unwrap() != "tier=\"b\"" {
            assert!(Instant::now() < deadline, "labels never rewritten");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        vm.unmount_pod("u-dw", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!got["info"].exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn volumes_are_counted_by_plugin_and_state_and_their_operations_timed() {
        use crate::metrics::certvol::{storage_operation_count, STATE_ACTUAL, STATE_DESIRED};
        let root = root("count");
        let vm = manager(&root);
        vm.start(&TaskTracker::new(), CancellationToken::new());
        let host = root.join("host-dir");
        std::fs::create_dir_all(&host).unwrap();
        let p = pod(
            "u-count",
            vec![
                Volume {
                    name: "scratch".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
                Volume {
                    name: "host".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: host.display().to_string(),
                        type_: Some("Directory".into()),
                    }),
                    ..Default::default()
                },
            ],
        );
        let before = (
            storage_operation_count("kubernetes.io/empty-dir", "volume_mount", "success"),
            storage_operation_count("kubernetes.io/empty-dir", "volume_unmount", "success"),
        );
        let overall_before = crate::metrics::certvol::volume_operation_total_count(
            "kubernetes.io/empty-dir",
            "overall_volume_mount",
        );
        vm.wait_for_attach_and_mount(&p).await.unwrap();
        let mut got = vm.volume_counts();
        got.sort();
        let want = |plugin: &str, state| (plugin.to_string(), state);
        assert_eq!(
            got,
            vec![
                want("kubernetes.io/empty-dir", STATE_ACTUAL),
                want("kubernetes.io/empty-dir", STATE_DESIRED),
                want("kubernetes.io/host-path", STATE_ACTUAL),
                want("kubernetes.io/host-path", STATE_DESIRED),
            ]
        );
        assert!(
            storage_operation_count("kubernetes.io/empty-dir", "volume_mount", "success")
                > before.0
        );
        assert!(storage_operation_count("kubernetes.io/host-path", "volume_mount", "success") > 0);
        // End to end, from the mount request.
        assert!(
            crate::metrics::certvol::volume_operation_total_count(
                "kubernetes.io/empty-dir",
                "overall_volume_mount"
            ) > overall_before
        );
        vm.unmount_pod("u-count", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(vm.volume_counts().is_empty());
        assert!(
            storage_operation_count("kubernetes.io/empty-dir", "volume_unmount", "success")
                > before.1
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn plugin_names_are_upstreams() {
        let v = |f: fn(&mut Volume)| {
            let mut v = Volume::default();
            f(&mut v);
            spec_plugin(&v)
        };
        assert_eq!(
            v(|v| v.config_map = Some(Default::default())).as_deref(),
            Some("kubernetes.io/configmap")
        );
        assert_eq!(
            v(|v| v.secret = Some(Default::default())).as_deref(),
            Some("kubernetes.io/secret")
        );
        assert_eq!(
            v(|v| v.downward_api = Some(Default::default())).as_deref(),
            Some("kubernetes.io/downward-api")
        );
        assert_eq!(
            v(|v| v.projected = Some(Default::default())).as_deref(),
            Some("kubernetes.io/projected")
        );
        assert_eq!(
            v(
                |v| v.csi = Some(k8s_openapi::api::core::v1::CSIVolumeSource {
                    driver: "d.example.com".into(),
                    ..Default::default()
                })
            )
            .as_deref(),
            Some("kubernetes.io/csi:d.example.com")
        );
        assert_eq!(
            v(|v| v.nfs = Some(Default::default())).as_deref(),
            Some("N/A")
        );
        assert_eq!(
            v(|v| v.persistent_volume_claim = Some(Default::default())),
            None
        );
        // Set up: by the directory rkubelet made, else the host path's kind.
        let m = |owned: Option<PathBuf>, measured| Mounted {
            path: PathBuf::new(),
            owned,
            remountable: false,
            refresh_at: None,
            measured,
            csi: None,
            claim: None,
            block: None,
        };
        let dir = plugin_dir(Path::new("/r"), "u", "projected", "x");
        assert_eq!(
            mounted_plugin(&m(Some(dir), true)),
            "kubernetes.io/projected"
        );
        assert_eq!(mounted_plugin(&m(None, true)), "kubernetes.io/local-volume");
        assert_eq!(mounted_plugin(&m(None, false)), "kubernetes.io/host-path");
    }

    /// Upstream's device mount state is the volume's: a CSI PV another pod
    /// has set up (and no operation is running on) is staged already, so a
    /// second pod's set-up publishes only.
    #[test]
    fn a_csi_pv_set_up_for_another_pod_counts_as_staged() {
        let vm = manager(&root("staged"));
        let pv = |handle: &str| -> k8s_openapi::api::core::v1::PersistentVolume {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pv1"},
                "spec": {"csi": {"driver": "d.csi", "volumeHandle": handle}}
            }))
            .unwrap()
        };
        assert!(!device_set_up(&vm.inner, &pv("h"), true));
        let published = super::super::csi::mounter::Published {
            driver: "d.csi".into(),
            volume_id: "h".into(),
            target: "/r/t".into(),
            staging: Some("/r/s".into()),
            republish: false,
            block: true,
        };
        vm.inner
            .state
            .lock()
            .actual
            .entry("a".into())
            .or_default()
            .insert(
                "disk".into(),
                Mounted {
                    path: "/r/link".into(),
                    owned: None,
                    remountable: false,
                    refresh_at: None,
                    measured: false,
                    csi: Some(Arc::new(published)),
                    claim: None,
                    block: None,
                },
            );
        assert!(device_set_up(&vm.inner, &pv("h"), true));
        // Another volume, or the same handle mounted rather than mapped.
        assert!(!device_set_up(&vm.inner, &pv("h2"), true));
        assert!(!device_set_up(&vm.inner, &pv("h"), false));
        // Another of its operations running (the expansion check of a
        // pod sync, a republish): still staged. A flaky stage, publish,
        // stage, publish came from counting those as tear-downs.
        vm.inner
            .state
            .lock()
            .in_flight
            .insert(("a".into(), "disk".into()));
        assert!(device_set_up(&vm.inner, &pv("h"), true));
        // Its tear-down running (it may unstage): staged again.
        vm.inner
            .state
            .lock()
            .tearing_down
            .insert(("a".into(), "disk".into()));
        assert!(!device_set_up(&vm.inner, &pv("h"), true));
    }

    /// A request a podCertificate source waits on reached a terminal state:
    /// that pod's failing podCertificate volume is due now (not at its
    /// backoff), its mounted volumes are written again; other volumes and
    /// pods keep their backoff.
    #[tokio::test(start_paused = true)]
    async fn a_pod_certificate_change_wakes_that_pods_certificate_volumes_only() {
        use k8s_openapi::api::core::v1::{
            PodCertificateProjection, ProjectedVolumeSource, VolumeProjection,
        };
        let cert = |name: &str| Volume {
            name: name.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    pod_certificate: Some(PodCertificateProjection {
                        signer_name: "example.com/s".into(),
                        key_type: "ED25519".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let other = Volume {
            name: "other".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        };
        let vm = manager(&root("pcert"));
        let later = Instant::now() + Duration::from_secs(100);
        {
            let mut st = vm.inner.state.lock();
            for uid in ["a", "b"] {
                st.desired.insert(
                    uid.into(),
                    Desired {
                        pod: Arc::new(pod(uid, vec![cert("cert"), other.clone()])),
                        remount: false,
                        resync: false,
                    },
                );
                for v in ["cert", "other"] {
                    st.failures.insert(
                        (uid.into(), v.into()),
                        Failure {
                            error: "credential bundle is not issued yet".into(),
                            attempts: 8,
                            retry_at: later,
                            node_wait: false,
                            process: false,
                        },
                    );
                }
            }
        }
        let due = |vm: &VolumeManager| -> Vec<(String, String)> {
            let mut v: Vec<_> = vm
                .plan(None)
                .into_iter()
                .filter_map(|op| match op {
                    Op::Mount { uid, volume, .. } => Some((uid, volume.name)),
                    Op::Unmount { .. } | Op::Expand { .. } => None,
                })
                .collect();
            v.sort();
            v
        };
        assert!(due(&vm).is_empty(), "everything waits for its backoff");
        vm.object_changed(&crate::objects::ObjectKey {
            kind: crate::objects::podcert::KIND,
            namespace: "default".into(),
            name: "a".into(),
        });
        assert!(vm.inner.state.lock().desired["a"].remount);
        assert!(!vm.inner.state.lock().desired["b"].remount);
        assert_eq!(due(&vm), [("a".to_string(), "cert".to_string())]);
        // A pod without such a volume, or unknown: nothing changes.
        vm.object_changed(&crate::objects::ObjectKey {
            kind: crate::objects::podcert::KIND,
            namespace: "default".into(),
            name: "nope".into(),
        });
        assert!(due(&vm).is_empty());
        tokio::time::advance(Duration::from_secs(101)).await;
        assert_eq!(due(&vm).len(), 3, "the rest at their backoff");
    }

    #[tokio::test]
    async fn orphaned_pod_dirs_are_unmounted_and_removed_known_ones_kept() {
        let root = root("orphan");
        let vm = manager(&root);
        let tasks = TaskTracker::new();
        vm.start(&tasks, CancellationToken::new());
        let orphan = root.join("pods/u-gone/volumes/kubernetes.io~empty-dir/m");
        let kept = root.join("pods/u-here/volumes/kubernetes.io~empty-dir/m");
        std::fs::create_dir_all(&orphan).unwrap();
        std::fs::create_dir_all(&kept).unwrap();
        mount_tmpfs(&orphan, 1 << 20).unwrap();
        // A link out of the pod directory must not be followed.
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("pods/u-gone/link")).unwrap();
        vm.cleanup_orphaned_pod_dirs(|uid| uid == "u-here");
        let deadline = Instant::now() + Duration::from_secs(10);
        while root.join("pods/u-gone").exists() {
            assert!(Instant::now() < deadline, "orphan never removed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(mount_options(&orphan).is_none());
        assert!(kept.is_dir() && outside.join("keep").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
