//! The container manager's cgroups (upstream `pkg/kubelet/cm`:
//! `node_container_manager_linux.go`, `qos_container_manager_linux.go`,
//! `pod_container_manager_linux.go`, `helpers_linux.go`), for the cgroupfs
//! driver with `cgroupsPerQOS` (the defaults):
//!
//! - `kubepods` under `cgroupRoot`, the node allocatable cgroup: cpu shares,
//!   memory and pids of the node's capacity, or of its allocatable
//!   (capacity less `systemReserved` and `kubeReserved`) when
//!   `enforceNodeAllocatable` has `pods`;
//! - the QoS tiers `kubepods/burstable` (cpu shares of the burstable pods'
//!   cpu requests, kept current every minute and before each new pod) and
//!   `kubepods/besteffort` (the minimum, 2 shares);
//! - each pod's cgroup, made with the pod's limits before the runtime puts
//!   its sandbox in it (`ResourceConfigForPod`, `podPidsLimit`), and kept
//!   in step with an in-place resize;
//! - `systemReserved`/`kubeReserved` set on their existing cgroups when
//!   `enforceNodeAllocatable` names them.
//!
//! Without these, the runtime made the parents bare: no pod limit (a pod's
//! processes outside its containers' own cgroups, or a fork bomb across
//! containers, ran unbounded), and Guaranteed pods competed with the tiers
//! at default weight.
//!
//! The systemd driver's slices belong to systemd (upstream asks it over
//! D-Bus, which rkubelet does not speak): there the runtime still makes
//! them, as before, and a warning says so.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cgroups_rs::cgroup::Cgroup;
use cgroups_rs::cpu::CpuController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Controller, Controllers, MaxValue};
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::{Cfs, QosClass};

#[derive(Debug, Clone, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup {path:?}: {message}")]
    Io { path: String, message: String },
    #[error("invalid cgroup name {0:?}")]
    InvalidName(String),
    /// Upstream's Validate message for a cgroup missing from a hierarchy.
    #[error("cgroup {0:?} has some missing paths")]
    Missing(String),
    #[error("invalid configuration: cgroup-root {0:?} doesn't exist")]
    NoRoot(String),
    #[error(transparent)]
    Blocking(#[from] crate::blocking::BlockingError),
}

/// What one cgroup is set to (upstream ResourceConfig); None leaves a
/// setting as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    pub cpu_shares: Option<u64>,
    /// Microseconds per period; -1 for none.
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    /// Bytes; -1 for none.
    pub memory: Option<i64>,
    /// -1 for none.
    pub pids: Option<i64>,
}

/// Upstream MinShares: what BestEffort gets.
const MIN_SHARES: u64 = 2;

/// Upstream's periodicQOSCgroupUpdateInterval, also its retry period for
/// node allocatable enforcement.
const PERIOD: Duration = Duration::from_secs(60);

/// How long one pass of cgroup writes may take (cgroupfs does not hang,
/// but the pool's threads are shared).
const DEADLINE: Duration = Duration::from_secs(10);

/// Upstream ResourceConfigForPod: Guaranteed pods get shares, quota and
/// memory; Burstable pods shares, and quota or memory where every
/// container (or the pod) limits it; BestEffort the minimum shares. With
/// `cpuCFSQuota` off the quota is -1 (none).
pub fn pod_resource_config(pod: &Pod, cfs: Cfs) -> ResourceConfig {
    use crate::lifecycle::{pod_limits, pod_requests};
    let milli = |v: i128| v.clamp(0, i64::MAX as i128) as i64;
    let cpu_request = milli(pod_requests(pod, "cpu"));
    let (cpu_limit, cpu_declared) = pod_limits(pod, "cpu");
    let (memory_limit, memory_declared) = pod_limits(pod, "memory");
    let shares = super::cpu_shares(Some(cpu_request)) as u64;
    let quota = match milli(cpu_limit) {
        _ if !cfs.enforce => -1,
        0 => 0,
        m => super::cpu_quota_over(m, cfs.period_us),
    };
    let period = cfs.period_us as u64;
    // Bytes, rounded up as upstream's Value().
    let memory = milli((memory_limit + 999) / 1000);
    match super::pod_qos(pod) {
        QosClass::Guaranteed => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: Some(quota),
            cpu_period: Some(period),
            memory: Some(memory),
            pids: None,
        },
        QosClass::Burstable => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: cpu_declared.then_some(quota),
            cpu_period: cpu_declared.then_some(period),
            memory: memory_declared.then_some(memory),
            pids: None,
        },
        QosClass::BestEffort => ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..Default::default()
        },
    }
}

/// The node's sizes the `kubepods` cgroup is set from (upstream's
/// internalCapacity: cpu, memory and the pid limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    /// The lesser of pid_max and threads-max (upstream pidlimit.Stats).
    pub max_pid: Option<i64>,
}

impl Capacity {
    /// Less the reservations, none below zero (upstream
    /// getNodeAllocatableAbsoluteImpl).
    fn less(self, reserved: &[&BTreeMap<String, String>]) -> Capacity {
        let take = |name: &str, total: i64, scale: i128| {
            let r: i128 = reserved
                .iter()
                .filter_map(|m| m.get(name))
                .filter_map(|v| super::quantity::parse_milli(v).ok())
                .sum();
            (total as i128 - r / scale).max(0) as i64
        };
        Capacity {
            cpu_milli: take("cpu", self.cpu_milli, 1),
            memory_bytes: take("memory", self.memory_bytes, 1000),
            max_pid: self.max_pid.map(|p| take("pid", p, 1000)),
        }
    }

    /// Upstream getCgroupConfig over a resource list.
    fn config(self) -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(super::cpu_shares(Some(self.cpu_milli)) as u64),
            memory: Some(self.memory_bytes),
            pids: self.max_pid,
            ..Default::default()
        }
    }
}

/// Upstream getCgroupConfig over a reservation: only what it names, and
/// only cpu for the `-compressible` enforcement keys.
fn reserved_config(reserved: &BTreeMap<String, String>, compressible_only: bool) -> ResourceConfig {
    let get = |k: &str| {
        reserved
            .get(k)
            .and_then(|v| super::quantity::parse_milli(v).ok())
    };
    let mut rc = ResourceConfig {
        cpu_shares: get("cpu").map(|m| super::cpu_shares(Some(m as i64)) as u64),
        ..Default::default()
    };
    if !compressible_only {
        rc.memory = get("memory").map(|m| ((m + 999) / 1000) as i64);
        rc.pids = get("pid").map(|m| (m / 1000) as i64);
    }
    rc
}

/// Upstream's burstable tier: the shares of its pods' cpu requests
/// together (minimum 2 when there are none).
pub fn burstable_shares<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> u64 {
    let milli: i128 = pods
        .into_iter()
        .filter(|p| super::pod_qos(p) == QosClass::Burstable)
        .map(|p| crate::lifecycle::pod_requests(p, "cpu"))
        .sum();
    super::cpu_shares(Some(milli.clamp(0, i64::MAX as i128) as i64)) as u64
}

/// cgroup v2's cpu.weight for v1 shares (runc's
/// ConvertCPUSharesToCgroupV2Value, which upstream relies on).
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// The pod's cgroup, relative to each hierarchy's root.
fn pod_path(pod: &Pod, cgroup_root: &str) -> Result<String, CgroupError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    // A UID names one directory: nothing from a pod spec walks the tree.
    if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
        return Err(CgroupError::InvalidName(uid.to_string()));
    }
    let p = super::pod_cgroup_parent(pod, cgroup_root, false);
    relative(&p)
}

/// A cgroupfs name ("/kubepods/burstable") as a path below each
/// hierarchy's root, refused if any part of it would leave that root.
pub(crate) fn relative(name: &str) -> Result<String, CgroupError> {
    let rel = name.trim_matches('/');
    if rel
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(CgroupError::InvalidName(name.to_string()));
    }
    Ok(rel.to_string())
}

/// The controllers whose directories make a cgroup exist (upstream's
/// cgroupManager.Exists checks these).
fn required(c: Controllers) -> bool {
    matches!(
        c,
        Controllers::Cpu
            | Controllers::CpuAcct
            | Controllers::CpuSet
            | Controllers::Mem
            | Controllers::Pids
    )
}

/// Whether the cgroup is there in every required hierarchy.
fn exists(rel: &str) -> bool {
    let cg = Cgroup::load(cgroups_rs::hierarchies::auto(), rel);
    cg.subsystems()
        .iter()
        .map(|s| s.to_controller())
        .filter(|c| required(c.control_type()))
        .all(|c| c.exists())
}

/// Writes `rc` to the cgroup, making it first when `create`. Zeros are
/// left unwritten, as runc's cgroup managers leave them.
fn apply(rel: &str, rc: &ResourceConfig, create: bool) -> Result<(), CgroupError> {
    let hier = cgroups_rs::hierarchies::auto();
    let v2 = hier.v2();
    let cg = Cgroup::load(hier, rel);
    let err = |e: cgroups_rs::error::Error| CgroupError::Io {
        path: rel.to_string(),
        message: e.to_string(),
    };
    if create {
        cg.create().map_err(err)?;
        if !exists(rel) {
            return Err(CgroupError::Missing(rel.to_string()));
        }
    }
    if let Some(cpu) = cg.controller_of::<CpuController>() {
        if let Some(s) = rc.cpu_shares.filter(|s| *s != 0) {
            cpu.set_shares(if v2 { shares_to_weight(s) } else { s })
                .map_err(err)?;
        }
        let quota = rc.cpu_quota.filter(|q| *q != 0);
        let period = rc.cpu_period.filter(|p| *p != 0);
        if quota.is_some() || period.is_some() {
            cpu.set_cfs_quota_and_period(quota, period).map_err(err)?;
        }
    }
    if let (Some(m), Some(mem)) = (
        rc.memory.filter(|m| *m != 0),
        cg.controller_of::<MemController>(),
    ) {
        mem.set_limit(m).map_err(err)?;
    }
    if let (Some(p), Some(pids)) = (
        rc.pids.filter(|p| *p != 0),
        cg.controller_of::<PidController>(),
    ) {
        let v = if p < 0 {
            MaxValue::Max
        } else {
            MaxValue::Value(p)
        };
        pids.set_pid_max(v).map_err(err)?;
    }
    Ok(())
}

/// The cpu quota and period, and the memory limit, a cgroup has now (-1
/// for none).
fn current_limits(rel: &str) -> Option<(i64, u64, i64)> {
    let hier = cgroups_rs::hierarchies::auto();
    let v2 = hier.v2();
    let cg = Cgroup::load(hier, rel);
    let cpu = cg.controller_of::<CpuController>()?;
    let quota = cpu.cfs_quota().ok()?;
    let period = cpu.cfs_period().ok()?;
    let mem = cg.controller_of::<MemController>()?;
    let file = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    let text = std::fs::read_to_string(Path::new(mem.path()).join(file)).ok()?;
    let text = text.trim();
    // v1 says "none" with a huge page-aligned number.
    let memory = match text.parse::<i64>() {
        Ok(n) if n < i64::MAX / 2 => n,
        Ok(_) => -1,
        Err(_) if text == "max" => -1,
        Err(_) => return None,
    };
    Some((quota, period, memory))
}

/// What of `want` loosens `have` (quota, period, memory): the settings a
/// resize must apply to the pod before its containers, as the kernel
/// refuses a child more than its parent (cgroup v1's cpu bandwidth) or
/// kills it at the parent's limit.
fn loosening(want: &ResourceConfig, have: (i64, u64, i64)) -> ResourceConfig {
    let (quota, period, memory) = have;
    let mut rc = ResourceConfig::default();
    if let (Some(q), Some(p)) = (want.cpu_quota, want.cpu_period) {
        let unlimited = q <= 0;
        let more = quota > 0
            && (unlimited || (q as i128) * (period as i128) > (quota as i128) * (p as i128));
        if more {
            rc.cpu_quota = Some(if unlimited { -1 } else { q });
            rc.cpu_period = Some(p);
        }
    }
    if let Some(m) = want.memory {
        if memory > 0 && (m <= 0 || m > memory) {
            rc.memory = Some(if m <= 0 { -1 } else { m });
        }
    }
    rc
}

/// What the QoS tiers are updated from: upstream's active pods (those the
/// pod workers still run), as granted.
pub type ActivePods = Box<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>;

/// The container manager's cgroups; a disabled one (the default, the
/// systemd driver, `cgroupsPerQOS: false`) does nothing.
#[derive(Clone, Default)]
pub struct ContainerManager {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    node_name: String,
    /// What `kubepods` is held to (upstream enforceNodeAllocatableCgroups).
    node: ResourceConfig,
    cgroup_root: String,
    /// `kubepods`, relative to each hierarchy's root.
    kubepods: String,
    cfs: Cfs,
    pod_pids_limit: i64,
    active: OnceLock<ActivePods>,
    /// One QoS update at a time (held on a blocking thread, never across
    /// an await).
    qos: parking_lot::Mutex<()>,
}

/// What the container manager starts from.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub node_name: String,
    pub cgroup_root: String,
    pub cfs: Cfs,
    pub pod_pids_limit: i64,
    pub enforce_node_allocatable: Vec<String>,
    pub system_reserved: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    pub system_reserved_cgroup: String,
    pub kube_reserved_cgroup: String,
}

impl ContainerManager {
    /// Upstream's setupNode for the cgroups: `kubepods` made if missing,
    /// the QoS tiers made or updated, the reservations set on their
    /// cgroups (an error, which stops the kubelet as upstream's does), and
    /// the tiers kept current every minute until `token` is cancelled.
    /// `enforce_node_allocatable` then holds `kubepods` to the node's
    /// figures.
    pub async fn start(
        cfg: Config,
        capacity: Capacity,
        tasks: &TaskTracker,
        token: CancellationToken,
    ) -> Result<ContainerManager, CgroupError> {
        let root = cfg.cgroup_root.trim_matches('/');
        let kubepods = if root.is_empty() {
            "kubepods".to_string()
        } else {
            relative(&format!("{root}/kubepods"))?
        };
        let enforce = |k: &str| cfg.enforce_node_allocatable.iter().any(|e| e == k);
        let node = if enforce("pods") {
            capacity.less(&[&cfg.system_reserved, &cfg.kube_reserved])
        } else {
            capacity
        }
        .config();
        let inner = Arc::new(Inner {
            node_name: cfg.node_name.clone(),
            node,
            cgroup_root: cfg.cgroup_root.clone(),
            kubepods: kubepods.clone(),
            cfs: cfg.cfs,
            pod_pids_limit: cfg.pod_pids_limit,
            active: OnceLock::new(),
            qos: parking_lot::Mutex::new(()),
        });
        let root_rel = root.to_string();
        let k = kubepods.clone();
        crate::blocking::run("cgroups/setup".into(), DEADLINE, move || {
            if !root_rel.is_empty() && !exists(&relative(&root_rel)?) {
                return Err(CgroupError::NoRoot(format!("/{root_rel}")));
            }
            if !exists(&k) {
                apply(&k, &node, true)?;
            }
            let tiers = [
                ("burstable", ResourceConfig::default()),
                (
                    "besteffort",
                    ResourceConfig {
                        cpu_shares: Some(MIN_SHARES),
                        ..Default::default()
                    },
                ),
            ];
            for (tier, rc) in tiers {
                let path = format!("{k}/{tier}");
                let made = exists(&path);
                apply(&path, &rc, !made)?;
            }
            Ok(())
        })
        .await??;
        info!(cgroup = %format!("/{kubepods}"), cpu_shares = ?node.cpu_shares, memory = ?node.memory, pids = ?node.pids, "container manager: node allocatable and QoS cgroups in place");
        // Upstream's enforcement keys with the names its events use.
        let system = (&cfg.system_reserved, &cfg.system_reserved_cgroup);
        let kube = (&cfg.kube_reserved, &cfg.kube_reserved_cgroup);
        for (key, (reserved, cgroup), compressible, which, title) in [
            (
                "system-reserved",
                system,
                false,
                "system reserved",
                "System Reserved",
            ),
            (
                "kube-reserved",
                kube,
                false,
                "kube reserved",
                "Kube Reserved",
            ),
            (
                "system-reserved-compressible",
                system,
                true,
                "system reserved",
                "System Reserved Compressible",
            ),
            (
                "kube-reserved-compressible",
                kube,
                true,
                "kube reserved",
                "Kube Reserved Compressible",
            ),
        ] {
            if !enforce(key) {
                continue;
            }
            let rc = reserved_config(reserved, compressible);
            let name = cgroup.clone();
            let r = crate::blocking::run(format!("cgroups/{key}"), DEADLINE, move || {
                let rel = relative(&name)?;
                if !exists(&rel) {
                    return Err(CgroupError::Missing(name));
                }
                apply(&rel, &rc, false)
            })
            .await
            .map_err(CgroupError::from)
            .and_then(|r| r);
            let node_ref = crate::events::node_ref(&cfg.node_name);
            match r {
                Ok(()) => crate::events::record(
                    node_ref,
                    crate::events::NORMAL,
                    "SuccessfulNodeAllocatableEnforcement",
                    format!("Updated limits on {which} cgroup {cgroup}"),
                ),
                Err(e) => {
                    let message =
                        format!("Failed to enforce {title} Cgroup Limits on \"{cgroup}\": {e}");
                    crate::events::record(
                        node_ref,
                        crate::events::WARNING,
                        "FailedNodeAllocatableEnforcement",
                        message.clone(),
                    );
                    return Err(CgroupError::Io {
                        path: cgroup.clone(),
                        message,
                    });
                }
            }
        }
        let cm = ContainerManager { inner: Some(inner) };
        let periodic = cm.clone();
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                loop {
                    if let Err(e) = periodic.update_qos().await {
                        info!(error = %e, "Failed to reserve QoS requests");
                    }
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(PERIOD) => {}
                    }
                }
            },
            tracing::info_span!("qos-cgroups"),
        ));
        Ok(cm)
    }

    /// Upstream enforceNodeAllocatableCgroups: `kubepods` set to the node's
    /// figures, retried every minute until it holds (usage above a lowered
    /// memory limit refuses it until evictions bring it down), with the
    /// node's events; called once the event recorder is in place, as
    /// upstream starts its container manager after the "Starting" event.
    pub fn enforce_node_allocatable(&self, tasks: &TaskTracker, token: CancellationToken) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                let k = inner.kubepods.clone();
                loop {
                    let (k2, node) = (k.clone(), inner.node);
                    let r = crate::blocking::run("cgroups/kubepods".into(), DEADLINE, move || {
                        apply(&k2, &node, false)
                    })
                    .await
                    .map_err(CgroupError::from)
                    .and_then(|r| r);
                    let node_ref = crate::events::node_ref(&inner.node_name);
                    match r {
                        Ok(()) => {
                            crate::events::record(
                                node_ref,
                                crate::events::NORMAL,
                                "SuccessfulNodeAllocatableEnforcement",
                                "Updated Node Allocatable limit across pods".into(),
                            );
                            return;
                        }
                        Err(e) => {
                            warn!(error = %e, "failed to update node allocatable limits");
                            crate::events::record(
                                node_ref,
                                crate::events::WARNING,
                                "FailedNodeAllocatableEnforcement",
                                format!("Failed to update Node Allocatable Limits \"/{k}\": {e}"),
                            );
                        }
                    }
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(PERIOD) => {}
                    }
                }
            },
            tracing::info_span!("node-allocatable"),
        ));
    }

    /// Where the QoS update reads the pods from (set once the pod workers
    /// exist; updates before then are skipped).
    pub fn set_active_pods(&self, f: ActivePods) {
        if let Some(i) = &self.inner {
            let _ = i.active.set(f);
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Upstream UpdateCgroups: besteffort at the minimum shares, burstable
    /// at its pods' cpu requests.
    pub async fn update_qos(&self) -> Result<(), CgroupError> {
        let Some(inner) = self.inner.clone() else {
            return Ok(());
        };
        crate::blocking::run("cgroups/qos".into(), DEADLINE, move || {
            let Some(active) = inner.active.get() else {
                return Ok(());
            };
            let _one = inner.qos.lock();
            let pods = active();
            let burstable = ResourceConfig {
                cpu_shares: Some(burstable_shares(pods.iter().map(|p| &**p))),
                ..Default::default()
            };
            let besteffort = ResourceConfig {
                cpu_shares: Some(MIN_SHARES),
                ..Default::default()
            };
            apply(&format!("{}/burstable", inner.kubepods), &burstable, false)?;
            apply(
                &format!("{}/besteffort", inner.kubepods),
                &besteffort,
                false,
            )
        })
        .await?
    }

    /// Upstream EnsureExists: the pod's cgroup, made with its limits (and
    /// `podPidsLimit`) if it is not there yet, after the QoS tiers are
    /// brought up to date. An existing cgroup is left as it is.
    pub async fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let rel = pod_path(pod, &inner.cgroup_root)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let r = rel.clone();
        if crate::blocking::run(format!("cgroups/{uid}"), DEADLINE, move || exists(&r)).await? {
            return Ok(());
        }
        if let Err(e) = self.update_qos().await {
            debug!(error = %e, "failed to update QoS cgroups while syncing pod");
        }
        let mut rc = pod_resource_config(pod, inner.cfs);
        if inner.pod_pids_limit > 0 {
            rc.pids = Some(inner.pod_pids_limit);
        }
        debug!(pod = pod.metadata.name.as_deref().unwrap_or_default(), cgroup = %rel, config = ?rc, "creating pod cgroup");
        crate::blocking::run(format!("cgroups/{uid}"), DEADLINE, move || {
            apply(&rel, &rc, true)
        })
        .await?
    }

    /// Before an in-place resize's container updates (upstream
    /// doPodResizeAction): the pod cgroup's limits the resize raises.
    pub async fn resize_pod_before(&self, pod: &Pod) -> Result<(), CgroupError> {
        self.resize_pod(pod, true).await
    }

    /// After them: the pod's cgroup as the resized pod's config (shares,
    /// quota, memory; lowered limits now that the containers fit them).
    pub async fn resize_pod_after(&self, pod: &Pod) -> Result<(), CgroupError> {
        self.resize_pod(pod, false).await
    }

    async fn resize_pod(&self, pod: &Pod, before: bool) -> Result<(), CgroupError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let rel = pod_path(pod, &inner.cgroup_root)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let want = pod_resource_config(pod, inner.cfs);
        crate::blocking::run(format!("cgroups/{uid}"), DEADLINE, move || {
            // A pod whose cgroup predates the container manager has no
            // limits to keep in step.
            if !exists(&rel) {
                return Ok(());
            }
            let rc = if before {
                match current_limits(&rel) {
                    Some(have) => loosening(&want, have),
                    None => return Ok(()),
                }
            } else {
                ResourceConfig { pids: None, ..want }
            };
            if rc != ResourceConfig::default() {
                debug!(cgroup = %rel, config = ?rc, before, "resizing pod cgroup");
                apply(&rel, &rc, false)?;
            }
            Ok(())
        })
        .await?
    }
}

/// The node's pid limit: the lesser of `kernel/pid_max` and
/// `kernel/threads-max` (upstream pidlimit.Stats), read off the async
/// threads.
pub async fn max_pid() -> Option<i64> {
    crate::blocking::run("cgroups/max-pid".into(), DEADLINE, || {
        let read = |f: &str| {
            std::fs::read_to_string(Path::new("/proc/sys/kernel").join(f))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        crate::stats::procfs::pid_limit(read("pid_max"), read("threads-max"))
    })
    .await
    .ok()
    .flatten()
}

/// Logged once at start when the container manager's cgroups are left to
/// the runtime.
pub fn warn_disabled(driver: &str, cgroups_per_qos: bool) {
    if !cgroups_per_qos {
        return;
    }
    warn!(
        cgroup_driver = driver,
        "container manager: the systemd driver's QoS and pod slices are left to the runtime (no pod-level limits, podPidsLimit or node allocatable enforcement)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn list(kv: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        (!kv.is_empty()).then(|| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        })
    }

    fn container(name: &str, req: &[(&str, &str)], lim: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: list(req),
                limits: list(lim),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const ON: Cfs = Cfs {
        enforce: true,
        period_us: 100_000,
    };

    #[test]
    fn guaranteed_pods_get_shares_quota_and_memory() {
        let both = [("cpu", "250m"), ("memory", "64Mi")];
        let p = pod(
            vec![container("a", &both, &both), container("b", &both, &both)],
            vec![],
        );
        assert_eq!(
            pod_resource_config(&p, ON),
            ResourceConfig {
                cpu_shares: Some(512),
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory: Some(128 << 20),
                pids: None,
            }
        );
        // cpuCFSQuota off: no quota (upstream -1).
        let off = Cfs {
            enforce: false,
            ..ON
        };
        assert_eq!(pod_resource_config(&p, off).cpu_quota, Some(-1));
    }

    #[test]
    fn burstable_pods_get_only_the_limits_every_container_declares() {
        // Every container limits cpu, one leaves memory open.
        let p = pod(
            vec![
                container(
                    "a",
                    &[("cpu", "100m")],
                    &[("cpu", "200m"), ("memory", "64Mi")],
                ),
                container("b", &[("cpu", "100m")], &[("cpu", "300m")]),
            ],
            vec![],
        );
        let rc = pod_resource_config(&p, ON);
        assert_eq!(rc.cpu_shares, Some(204));
        assert_eq!((rc.cpu_quota, rc.cpu_period), (Some(50_000), Some(100_000)));
        assert_eq!(rc.memory, None);
        // An init container without a cpu limit leaves the pod's cpu open;
        // the largest init container bounds memory with the apps'.
        let p = pod(
            vec![container(
                "a",
                &[("cpu", "100m")],
                &[("cpu", "200m"), ("memory", "64Mi")],
            )],
            vec![container("i", &[], &[("memory", "128Mi")])],
        );
        let rc = pod_resource_config(&p, ON);
        assert_eq!((rc.cpu_quota, rc.cpu_period), (None, None));
        assert_eq!(rc.memory, Some(128 << 20));
        // A sidecar's limit counts for the init containers after it.
        let mut sidecar = container("s", &[], &[("cpu", "100m"), ("memory", "32Mi")]);
        sidecar.restart_policy = Some("Always".into());
        let p = pod(
            vec![container(
                "a",
                &[("cpu", "100m")],
                &[("cpu", "200m"), ("memory", "64Mi")],
            )],
            vec![sidecar, container("i", &[], &[])],
        );
        let rc = pod_resource_config(&p, ON);
        assert_eq!((rc.cpu_quota, rc.memory), (Some(30_000), Some(96 << 20)));
    }

    #[test]
    fn besteffort_pods_get_the_minimum_shares() {
        let p = pod(vec![container("a", &[], &[])], vec![]);
        assert_eq!(
            pod_resource_config(&p, ON),
            ResourceConfig {
                cpu_shares: Some(2),
                ..Default::default()
            }
        );
    }

    #[test]
    fn pod_level_limits_and_overhead_count() {
        let mut p = pod(vec![container("a", &[("cpu", "100m")], &[])], vec![]);
        let spec = p.spec.as_mut().unwrap();
        spec.resources = Some(ResourceRequirements {
            requests: list(&[("cpu", "100m")]),
            limits: list(&[("cpu", "500m"), ("memory", "1Gi")]),
            ..Default::default()
        });
        spec.overhead = list(&[("cpu", "50m"), ("memory", "10Mi")]);
        let rc = pod_resource_config(&p, ON);
        assert_eq!(rc.cpu_shares, Some(153));
        assert_eq!(rc.cpu_quota, Some(55_000));
        assert_eq!(rc.memory, Some((1 << 30) + (10 << 20)));
    }

    #[test]
    fn node_allocatable_takes_the_reservations_off() {
        let cap = Capacity {
            cpu_milli: 2000,
            memory_bytes: 8 << 30,
            max_pid: Some(4_194_304),
        };
        assert_eq!(
            cap.config(),
            ResourceConfig {
                cpu_shares: Some(2048),
                memory: Some(8 << 30),
                pids: Some(4_194_304),
                ..Default::default()
            }
        );
        let sys: BTreeMap<String, String> = [("cpu", "500m"), ("memory", "1Gi"), ("pid", "1000")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let kube: BTreeMap<String, String> = [("memory", "10Gi")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let a = cap.less(&[&sys, &kube]);
        assert_eq!(a.cpu_milli, 1500);
        // Never below zero.
        assert_eq!(a.memory_bytes, 0);
        assert_eq!(a.max_pid, Some(4_193_304));
        assert_eq!(
            reserved_config(&sys, false),
            ResourceConfig {
                cpu_shares: Some(512),
                memory: Some(1 << 30),
                pids: Some(1000),
                ..Default::default()
            }
        );
        assert_eq!(
            reserved_config(&sys, true),
            ResourceConfig {
                cpu_shares: Some(512),
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_burstable_tier_sums_its_pods_cpu_requests() {
        let b1 = pod(vec![container("a", &[("cpu", "100m")], &[])], vec![]);
        let b2 = pod(
            vec![container("a", &[("cpu", "400m")], &[("cpu", "1")])],
            vec![],
        );
        let g = pod(
            vec![container(
                "a",
                &[("cpu", "1"), ("memory", "1Gi")],
                &[("cpu", "1"), ("memory", "1Gi")],
            )],
            vec![],
        );
        let be = pod(vec![container("a", &[], &[])], vec![]);
        assert_eq!(burstable_shares([&b1, &b2, &g, &be]), 512);
        assert_eq!(burstable_shares([&g, &be]), 2);
    }

    #[test]
    fn shares_map_to_weights_as_runc_does() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }

    #[test]
    fn names_never_leave_the_hierarchy() {
        assert_eq!(
            relative("/kubepods/burstable").unwrap(),
            "kubepods/burstable"
        );
        for bad in ["/", "/a/../b", "a//b", "./a"] {
            assert!(relative(bad).is_err(), "{bad}");
        }
        let mut p = pod(vec![], vec![]);
        for uid in ["../../etc", "", ".."] {
            p.metadata.uid = Some(uid.into());
            assert!(pod_path(&p, "").is_err(), "{uid}");
        }
        p.metadata.uid = Some("0b1c".into());
        assert_eq!(pod_path(&p, "").unwrap(), "kubepods/besteffort/pod0b1c");
        assert_eq!(
            pod_path(&p, "/r/").unwrap(),
            "r/kubepods/besteffort/pod0b1c"
        );
    }

    #[test]
    fn a_resize_loosens_the_pod_before_its_containers() {
        let want = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(256 << 20),
            pids: None,
        };
        // Raised: both go first.
        assert_eq!(
            loosening(&want, (20_000, 100_000, 128 << 20)),
            ResourceConfig {
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory: Some(256 << 20),
                ..Default::default()
            }
        );
        // Lowered, or already unlimited: nothing goes first.
        assert_eq!(
            loosening(&want, (80_000, 100_000, 512 << 20)),
            ResourceConfig::default()
        );
        assert_eq!(
            loosening(&want, (-1, 100_000, -1)),
            ResourceConfig::default()
        );
        // The same ratio over another period is no loosening.
        assert_eq!(
            loosening(&want, (25_000, 50_000, 256 << 20)),
            ResourceConfig::default()
        );
    }
}
