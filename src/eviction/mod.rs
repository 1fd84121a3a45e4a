//! The eviction manager (upstream `pkg/kubelet/eviction`): every 10 s it
//! compares the node's figures from the stats provider's summary with the
//! configured thresholds (`evictionHard`, `evictionSoft` with their grace
//! periods, `evictionMinimumReclaim`), reports MemoryPressure, DiskPressure
//! and PIDPressure for the Node and for admission, and when a threshold has
//! held past its grace period stops one pod per round, ranked as upstream
//! ranks them, leaving it Failed with reason `Evicted`.
//!
//! Not done (upstream does them): node-level reclaim before evicting (image
//! and container garbage collection: rkubelet has no image GC), the
//! containerfs signals (parsed, never observed: containerd 1.7 reports no
//! split image file system), and memcg threshold notifications. The
//! allocatable signal is observed only where the pods' cgroup has a memory
//! limit (rkubelet does not enforce node allocatable itself). With localStorageCapacityIsolation, pods
//! over their emptyDir size limits or ephemeral-storage limits are evicted
//! first, as upstream's localStorageEviction.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::source::pod_uid;
use crate::stats::types::{PodStats, Summary};

#[cfg(test)]
mod tests;

/// Upstream's evictionMonitoringPeriod.
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// How long a round waits for an evicted pod to be cleaned up, and how
/// often it looks (podCleanupTimeout, podCleanupPollFreq).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_POLL: Duration = Duration::from_secs(1);
/// The grace period of an eviction for a hard threshold
/// (immediateEvictionGracePeriodSeconds).
const IMMEDIATE_GRACE: i64 = 1;
/// Upstream's eviction reason, on the pod status and the event.
pub const REASON: &str = "Evicted";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EvictionError {
    #[error("unsupported eviction signal {0}")]
    UnsupportedSignal(String),
    #[error("eviction percentage threshold {0} must be >= 0%: {1}")]
    NegativePercentage(String, String),
    #[error("eviction percentage threshold {0} must be <= 100%: {1}")]
    PercentageOver100(String, String),
    #[error("eviction threshold {0} must be positive: {1}")]
    NotPositive(String, String),
    #[error("grace period must be specified for the soft eviction threshold {0}")]
    NoGracePeriod(String),
    #[error("invalid eviction grace period specified: {0}, must be a positive value")]
    NegativeGracePeriod(String),
    #[error("eviction percentage minimum reclaim {0} must be positive: {1}")]
    ReclaimNotPositive(String, String),
    #[error("negative eviction minimum reclaim specified for {0}")]
    NegativeReclaim(String),
    #[error("{0}")]
    Invalid(String),
}

/// An eviction signal (upstream evictionapi.Signal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

const SIGNALS: [Signal; 9] = [
    Signal::MemoryAvailable,
    Signal::AllocatableMemoryAvailable,
    Signal::NodeFsAvailable,
    Signal::NodeFsInodesFree,
    Signal::ImageFsAvailable,
    Signal::ImageFsInodesFree,
    Signal::ContainerFsAvailable,
    Signal::ContainerFsInodesFree,
    Signal::PidAvailable,
];

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(s: &str) -> Result<Signal, EvictionError> {
        SIGNALS
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| EvictionError::UnsupportedSignal(s.to_string()))
    }

    /// The resource the signal starves (upstream signalToResource).
    fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                "ephemeral-storage"
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// The node condition the signal raises (upstream signalToNodeCondition).
    fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => {
                Condition::MemoryPressure
            }
            Signal::PidAvailable => Condition::PidPressure,
            _ => Condition::DiskPressure,
        }
    }

    fn is_memory(self) -> bool {
        self.condition() == Condition::MemoryPressure
    }
}

/// The node conditions eviction reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl Condition {
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PidPressure => "PIDPressure",
        }
    }
}

/// Which pressure conditions hold now (for the Node's status).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// A threshold's amount: a quantity in the signal's unit (bytes, inodes,
/// processes), kept with its text for messages, or a fraction of capacity.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Quantity { units: i128, text: String },
    Percentage(f32),
}

impl Value {
    /// Upstream GetThresholdQuantity: a percentage of the capacity, in
    /// whole units.
    fn amount(&self, capacity: i128) -> i128 {
        match self {
            Value::Quantity { units, .. } => *units,
            Value::Percentage(p) => (capacity as f64 * *p as f64) as i128,
        }
    }
}

/// One threshold (upstream evictionapi.Threshold; the operator is always
/// LessThan). A zero grace period makes it hard.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Value,
    pub grace: Duration,
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }
}

/// The configuration the manager runs with.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub thresholds: Vec<Threshold>,
    /// evictionPressureTransitionPeriod: how long a condition stays after
    /// its threshold was last met.
    pub pressure_transition: Duration,
    /// evictionMaxPodGracePeriod, for soft evictions.
    pub max_pod_grace: i64,
    /// localStorageCapacityIsolation: pods over their emptyDir size limits
    /// or ephemeral-storage limits are evicted.
    pub local_storage: bool,
}

fn parse_quantity_units(signal: &str, val: &str) -> Result<i128, EvictionError> {
    bytes_of(val).ok_or_else(|| EvictionError::Invalid(format!("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {signal}={val}")))
}

fn parse_percentage(signal: &str, val: &str) -> Result<f32, EvictionError> {
    let p: f64 = val
        .trim_end_matches('%')
        .parse()
        .map_err(|_| EvictionError::Invalid(format!("invalid percentage {signal}={val}")))?;
    Ok((p / 100.0) as f32)
}

/// Upstream parseThresholdStatement: None for "0%" and "100%", which
/// switch the signal off.
fn parse_statement(signal: &str, val: &str) -> Result<Option<Threshold>, EvictionError> {
    let s = Signal::parse(signal)?;
    let value = if val.ends_with('%') {
        if val == "0%" || val == "100%" {
            return Ok(None);
        }
        let p = parse_percentage(signal, val)?;
        if p < 0.0 {
            return Err(EvictionError::NegativePercentage(signal.into(), val.into()));
        }
        if p > 1.0 {
            return Err(EvictionError::PercentageOver100(signal.into(), val.into()));
        }
        Value::Percentage(p)
    } else {
        let units = parse_quantity_units(signal, val)?;
        if units <= 0 {
            return Err(EvictionError::NotPositive(signal.into(), val.into()));
        }
        Value::Quantity {
            units,
            text: val.trim().to_string(),
        }
    };
    Ok(Some(Threshold {
        signal: s,
        value,
        grace: Duration::ZERO,
        min_reclaim: None,
    }))
}

/// Upstream ParseThresholdConfig: the hard thresholds, then the soft ones
/// (each needs a grace period), each with its minimum reclaim; with
/// `enforce_pods` (enforceNodeAllocatable has "pods") a hard
/// memory.available threshold is repeated for allocatableMemory.available.
pub fn parse_config(
    enforce_pods: bool,
    hard: &std::collections::BTreeMap<String, String>,
    soft: &std::collections::BTreeMap<String, String>,
    soft_grace: &std::collections::BTreeMap<String, String>,
    min_reclaim: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<Threshold>, EvictionError> {
    let mut out = Vec::new();
    for (k, v) in hard {
        out.extend(parse_statement(k, v)?);
    }
    let mut graces = HashMap::new();
    for (k, v) in soft_grace {
        let s = Signal::parse(k)?;
        if v.trim_start().starts_with('-') {
            return Err(EvictionError::NegativeGracePeriod(v.clone()));
        }
        let d = crate::config::duration::parse_go_duration(v)
            .map_err(|e| EvictionError::Invalid(e.to_string()))?;
        graces.insert(s, d);
    }
    let mut reclaims = HashMap::new();
    for (k, v) in min_reclaim {
        let s = Signal::parse(k)?;
        let value = if v.ends_with('%') {
            let p = parse_percentage(k, v)?;
            if p <= 0.0 {
                return Err(EvictionError::ReclaimNotPositive(k.clone(), v.clone()));
            }
            Value::Percentage(p)
        } else {
            let units = parse_quantity_units(k, v)?;
            if units < 0 {
                return Err(EvictionError::NegativeReclaim(k.clone()));
            }
            Value::Quantity {
                units,
                text: v.trim().to_string(),
            }
        };
        reclaims.insert(s, value);
    }
    for (k, v) in soft {
        if let Some(mut t) = parse_statement(k, v)? {
            t.grace = *graces
                .get(&t.signal)
                .ok_or_else(|| EvictionError::NoGracePeriod(k.clone()))?;
            out.push(t);
        }
    }
    for t in &mut out {
        t.min_reclaim = reclaims.get(&t.signal).cloned();
    }
    if enforce_pods {
        let extra: Vec<Threshold> = out
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .collect();
        out.extend(extra);
    }
    Ok(out)
}

/// What a signal shows now (upstream signalObservation).
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub available: i128,
    pub capacity: i128,
    /// When the figures were taken (Unix nanoseconds; 0 unknown).
    pub time: i128,
}

pub type Observations = HashMap<Signal, Observation>;

fn time_ns(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i128 {
    t.0.as_nanosecond()
}

/// Upstream makeSignalObservations.
pub fn observe(summary: &Summary) -> Observations {
    let mut out = Observations::new();
    let n = &summary.node;
    let mut memory = |m: Option<&crate::stats::types::MemoryStats>, signal: Signal| {
        if let Some((a, w)) = m.and_then(|m| Some((m.available_bytes?, m.working_set_bytes?))) {
            out.insert(
                signal,
                Observation {
                    available: a as i128,
                    capacity: a as i128 + w as i128,
                    time: m.map_or(0, |m| time_ns(&m.time)),
                },
            );
        }
    };
    memory(n.memory.as_ref(), Signal::MemoryAvailable);
    // The pods' cgroup, where it has a limit (node allocatable enforced).
    let pods = n.system_containers.iter().find(|c| c.name == "pods");
    memory(
        pods.and_then(|c| c.memory.as_ref()),
        Signal::AllocatableMemoryAvailable,
    );
    let mut fs = |f: &crate::stats::types::FsStats, bytes: Signal, inodes: Signal| {
        if let (Some(a), Some(c)) = (f.available_bytes, f.capacity_bytes) {
            out.insert(
                bytes,
                Observation {
                    available: a as i128,
                    capacity: c as i128,
                    time: time_ns(&f.time),
                },
            );
        }
        if let (Some(a), Some(c)) = (f.inodes_free, f.inodes) {
            out.insert(
                inodes,
                Observation {
                    available: a as i128,
                    capacity: c as i128,
                    time: time_ns(&f.time),
                },
            );
        }
    };
    if let Some(f) = &n.fs {
        fs(f, Signal::NodeFsAvailable, Signal::NodeFsInodesFree);
    }
    if let Some(rt) = &n.runtime {
        if let Some(f) = &rt.image_fs {
            fs(f, Signal::ImageFsAvailable, Signal::ImageFsInodesFree);
        }
        if let Some(f) = &rt.container_fs {
            fs(
                f,
                Signal::ContainerFsAvailable,
                Signal::ContainerFsInodesFree,
            );
        }
    }
    if let Some(r) = &n.rlimit {
        if let (Some(max), Some(cur)) = (r.maxpid, r.curproc) {
            out.insert(
                Signal::PidAvailable,
                Observation {
                    available: max as i128 - cur as i128,
                    capacity: max as i128,
                    time: time_ns(&r.time),
                },
            );
        }
    }
    out
}

/// Upstream thresholdsMet: the thresholds whose signal shows less available
/// than the threshold (plus its minimum reclaim with `enforce_min_reclaim`).
pub fn thresholds_met(
    thresholds: &[Threshold],
    obs: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else {
                return false;
            };
            let mut q = t.value.amount(o.capacity);
            if enforce_min_reclaim {
                if let Some(r) = &t.min_reclaim {
                    q += r.amount(o.capacity);
                }
            }
            q > o.available
        })
        .cloned()
        .collect()
}

/// Upstream byEvictionPriority: memory signals first, then the others with
/// a resource to reclaim, as configured.
fn by_eviction_priority(thresholds: &mut [Threshold]) {
    thresholds.sort_by_key(|t| !t.signal.is_memory());
}

/// The node conditions `thresholds` raise, without repeats, in order.
fn conditions_of(thresholds: &[Threshold]) -> Vec<Condition> {
    let mut out = Vec::new();
    for t in thresholds {
        let c = t.signal.condition();
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Upstream's "[MemoryPressure DiskPressure]" (a Go slice printed with %v).
fn conditions_text(c: &[Condition]) -> String {
    let names: Vec<&str> = c.iter().map(|c| c.as_str()).collect();
    format!("[{}]", names.join(" "))
}

/// A pod's priority (corev1helpers.PodPriority: 0 when unset).
fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Upstream's admission under pressure: critical pods always; under
/// memory pressure alone, pods that are not BestEffort, and BestEffort
/// pods that tolerate the memory-pressure taint; nothing else while any
/// condition holds. Err is the rejection message.
pub fn admit(conditions: &[Condition], pod: &Pod) -> Result<(), String> {
    if conditions.is_empty() || crate::cm::is_critical(pod) {
        return Ok(());
    }
    if conditions == [Condition::MemoryPressure] {
        if crate::cm::pod_qos(pod) != crate::cm::QosClass::BestEffort {
            return Ok(());
        }
        if tolerates_memory_pressure(pod) {
            return Ok(());
        }
    }
    Err(format!(
        "The node had condition: {}. ",
        conditions_text(conditions)
    ))
}

/// Upstream TolerationsTolerateTaint for the taint
/// node.kubernetes.io/memory-pressure:NoSchedule.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    let taint = k8s_openapi::api::core::v1::Taint {
        key: "node.kubernetes.io/memory-pressure".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations
        .into_iter()
        .flatten()
        .any(|t| crate::lifecycle::tolerates(t, &taint))
}

/// A pod's request of `resource` in whole units (upstream
/// GetResourceRequestQuantity).
fn request_units(pod: &Pod, resource: &str) -> i128 {
    let milli = crate::lifecycle::pod_requests(pod, resource);
    (milli + 999).div_euclid(1000)
}

/// What a pod uses of the disk resource, counting what `parts` name
/// (upstream podDiskUsage): (bytes, inodes).
fn disk_usage(stats: &PodStats, pod: &Pod, parts: DiskParts) -> (i128, i128) {
    let (mut bytes, mut inodes) = (0i128, 0i128);
    let mut add = |f: Option<&crate::stats::types::FsStats>| {
        if let Some(f) = f {
            bytes += f.used_bytes.unwrap_or(0) as i128;
            inodes += f.inodes_used.unwrap_or(0) as i128;
        }
    };
    for c in &stats.containers {
        if parts.root {
            add(c.rootfs.as_ref());
        }
        if parts.logs {
            add(c.logs.as_ref());
        }
    }
    if parts.volumes {
        for name in local_volume_names(pod) {
            add(stats
                .volume_stats
                .iter()
                .find(|v| v.name == name)
                .map(|v| &v.fs));
        }
    }
    (bytes, inodes)
}

/// Upstream localVolumeNames: hostPath volumes and local ephemeral ones
/// (emptyDir not in memory, gitRepo, configMap, downwardAPI).
fn local_volume_names(pod: &Pod) -> Vec<&str> {
    let vols = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    vols.into_iter()
        .flatten()
        .filter(|v| {
            v.host_path.is_some()
                || v.empty_dir
                    .as_ref()
                    .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
                || v.git_repo.is_some()
                || v.config_map.is_some()
                || v.downward_api.is_some()
        })
        .map(|v| v.name.as_str())
        .collect()
}

/// Which of a pod's file-system figures a disk signal counts
/// (upstream fsStatsType lists).
#[derive(Clone, Copy, Debug)]
struct DiskParts {
    root: bool,
    logs: bool,
    volumes: bool,
}

/// Upstream buildSignalToRankFunc's disk lists: without a dedicated image
/// file system every disk signal counts everything; with one, nodefs counts
/// logs and volumes and imagefs the containers' writable layers.
fn disk_parts(signal: Signal, dedicated_image_fs: bool) -> DiskParts {
    let all = DiskParts {
        root: true,
        logs: true,
        volumes: true,
    };
    if !dedicated_image_fs {
        return all;
    }
    match signal {
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree => DiskParts { root: false, ..all },
        _ => DiskParts {
            root: true,
            logs: false,
            volumes: false,
        },
    }
}

/// Sorts `pods` into eviction order for `signal` (upstream's rank
/// functions): memory by whether usage exceeds requests, then priority,
/// then usage above requests; PIDs by priority, then process count; disk
/// as memory, with the disk resource. A pod without stats goes first.
pub fn rank(
    signal: Signal,
    pods: &mut [Arc<Pod>],
    stats: &HashMap<String, PodStats>,
    dedicated_image_fs: bool,
) {
    let st = |p: &Pod| stats.get(pod_uid(p));
    match signal {
        Signal::PidAvailable => pods.sort_by(|a, b| {
            let (sa, sb) = (st(a), st(b));
            priority(a)
                .cmp(&priority(b))
                .then_with(|| sa.is_some().cmp(&sb.is_some()))
                .then_with(|| {
                    let count = |s: Option<&PodStats>| {
                        s.and_then(|s| s.process_stats.as_ref())
                            .and_then(|p| p.process_count)
                            .unwrap_or(0)
                    };
                    count(sb).cmp(&count(sa))
                })
        }),
        _ => {
            // (usage, the request it exceeds or not, the request taken from
            // it): inodes are compared with an inode request (none exists:
            // 0) yet less the storage request, as upstream's disk().
            let usage = |p: &Pod, s: &PodStats| -> (i128, i128, i128) {
                if signal.is_memory() {
                    let used = s.memory.as_ref().and_then(|m| m.working_set_bytes);
                    let req = request_units(p, "memory");
                    return (used.unwrap_or(0) as i128, req, req);
                }
                let (bytes, inodes) = disk_usage(s, p, disk_parts(signal, dedicated_image_fs));
                let req = request_units(p, "ephemeral-storage");
                if signal.resource() == "inodes" {
                    (inodes, 0, req)
                } else {
                    (bytes, req, req)
                }
            };
            // Without stats first, then exceeding requests (false sorts
            // first), then lower priority, then more above requests.
            pods.sort_by_key(|p| match st(p) {
                None => (false, false, priority(p), 0),
                Some(s) => {
                    let (used, exceeds, less) = usage(p, s);
                    (true, used <= exceeds, priority(p), less - used)
                }
            });
        }
    }
}

/// Upstream's annotation keys on an eviction's event.
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
pub const OFFENDING_POD: &str = "offending_pod";
pub const OFFENDING_POD_USAGE: &str = "offending_pod_usage";
pub const STARVED_RESOURCE: &str = "starved_resource";

/// Upstream evictionMessage: what was low, the threshold and what was
/// available, the pod's use against its pod-level request, and each
/// container using more than it asked for; with the event's annotations
/// naming them (none when the pod has no stats, as upstream).
pub fn message(
    signal: Signal,
    pod: &Pod,
    stats: Option<&PodStats>,
    thresholds: &[Threshold],
    obs: &Observations,
) -> (String, BTreeMap<String, String>) {
    use crate::nodestatus::quantity::format_binary;
    let resource = signal.resource();
    let mut m = format!("The node was low on resource: {resource}. ");
    // The first met threshold of the same resource (getThresholdMetInfo).
    let met = thresholds.iter().find_map(|t| {
        let o = obs.get(&t.signal)?;
        (t.signal.resource() == resource).then_some((t, o))
    });
    if let Some((t, o)) = met {
        let binary = matches!(resource, "memory" | "ephemeral-storage");
        let fmt = |v: i128| {
            if binary {
                format_binary(v)
            } else {
                v.to_string()
            }
        };
        let quantity = match &t.value {
            Value::Quantity { text, .. } => text.clone(),
            Value::Percentage(_) => fmt(t.value.amount(o.capacity)),
        };
        m.push_str(&format!(
            "Threshold quantity: {quantity}, available: {}. ",
            fmt(o.available)
        ));
    }
    let mut notes = BTreeMap::new();
    let Some(stats) = stats else {
        return (m, notes);
    };
    let spec = pod.spec.as_ref();
    // PodLevelResources (beta, on): the pod's working set against its
    // pod-level memory request, whatever their order, as upstream.
    let pod_request = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource));
    let pod_usage = stats.memory.as_ref().and_then(|m| m.working_set_bytes);
    if let (Some(req), Some(used), "memory") = (pod_request, pod_usage, resource) {
        let used = format_binary(used as i128);
        let name = pod.metadata.name.clone().unwrap_or_default();
        m.push_str(&format!(
            "Pod {name} was using {used}, request is {}, has larger consumption of {resource}. ",
            req.0
        ));
        notes.insert(OFFENDING_POD.to_string(), name);
        notes.insert(OFFENDING_POD_USAGE.to_string(), used);
    }
    let mut offending = Vec::new();
    let mut usages = Vec::new();
    let containers = spec.into_iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    let containers: Vec<_> = containers.collect();
    for cs in &stats.containers {
        let Some(c) = containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .map(|q| q.0.clone());
        let req_units = request.as_deref().and_then(bytes_of).unwrap_or(0);
        let usage = match resource {
            "ephemeral-storage" => match (
                cs.rootfs.as_ref().and_then(|f| f.used_bytes),
                cs.logs.as_ref().and_then(|f| f.used_bytes),
            ) {
                (Some(r), Some(l)) => Some(r as i128 + l as i128),
                _ => None,
            },
            "memory" => cs
                .memory
                .as_ref()
                .and_then(|m| m.working_set_bytes)
                .map(|w| w as i128),
            _ => None,
        };
        if let Some(u) = usage.filter(|u| *u > req_units) {
            m.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                format_binary(u),
                request.unwrap_or_else(|| "0".into())
            ));
            offending.push(c.name.clone());
            usages.push(format_binary(u));
        }
    }
    notes.insert(OFFENDING_CONTAINERS.to_string(), offending.join(","));
    notes.insert(OFFENDING_CONTAINERS_USAGE.to_string(), usages.join(","));
    notes.insert(STARVED_RESOURCE.to_string(), resource.to_string());
    (m, notes)
}

/// The manager's memory between rounds (upstream managerImpl's fields).
#[derive(Default)]
struct State {
    conditions: Vec<Condition>,
    first_observed: Vec<(Threshold, Instant)>,
    conditions_last_observed: HashMap<Condition, Instant>,
    met: Vec<Threshold>,
    last_observations: Observations,
}

/// An eviction to carry out: the pod is stopped within `grace` seconds
/// and left Failed with reason Evicted and `message`, with a
/// DisruptionTarget condition (reason TerminationByKubelet) saying the same
/// when `disruption`.
pub struct Eviction {
    pub pod: Arc<Pod>,
    pub grace: i64,
    pub message: String,
    /// Whether the status gets the DisruptionTarget condition.
    pub disruption: bool,
}

/// The figures of one round.
pub struct Sample {
    /// The summary, as `/stats/summary` gives it.
    pub summary: Summary,
    /// Whether the image file system is on another device than the root
    /// directory's (upstream HasDedicatedImageFs).
    pub dedicated_image_fs: bool,
}

/// What the manager needs from the kubelet.
pub struct Deps {
    /// The node's figures of the round (None when they could not be had).
    pub sample: Box<dyn Fn() -> futures::future::BoxFuture<'static, Option<Sample>> + Send + Sync>,
    /// The pods' figures. Upstream takes the full summary each round; here
    /// they are asked for only when a threshold or a pod's own storage
    /// limit needs them, which spares most rounds reading every pod's
    /// cgroups.
    pub pod_stats:
        Box<dyn Fn() -> futures::future::BoxFuture<'static, Option<Vec<PodStats>>> + Send + Sync>,
    /// The pods that are running (admitted, not terminating or finished).
    pub active_pods: Box<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>,
    /// Stops a pod for eviction; false when it could not be (already
    /// stopping).
    pub evict: Box<dyn Fn(Eviction) -> bool + Send + Sync>,
    /// Whether the pod's worker has finished with it (upstream PodIsFinished).
    pub cleaned_up: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// Frees node-level resources before any pod is evicted; the error as
    /// text.
    pub reclaim: Box<
        dyn Fn(Reclaim) -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync,
    >,
    pub node_name: String,
}

/// Upstream's node reclaim functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaim {
    /// The dead containers of finished pods (upstream
    /// DeleteAllUnusedContainers).
    DeadContainers,
    /// Every unused image old enough (upstream DeleteUnusedImages).
    UnusedImages,
}

/// What may be reclaimed for a signal before pods are evicted (upstream
/// buildSignalToNodeReclaimFuncs; the container and image file systems are
/// never split here, as containerd 1.7 reports none). With the images on
/// their own device, the root file system has nothing to reclaim.
fn reclaim_for(signal: Signal, dedicated_image_fs: bool) -> &'static [Reclaim] {
    use Signal::*;
    const BOTH: &[Reclaim] = &[Reclaim::DeadContainers, Reclaim::UnusedImages];
    match signal {
        NodeFsAvailable | NodeFsInodesFree | ContainerFsAvailable | ContainerFsInodesFree
            if dedicated_image_fs =>
        {
            &[]
        }
        NodeFsAvailable
        | NodeFsInodesFree
        | ContainerFsAvailable
        | ContainerFsInodesFree
        | ImageFsAvailable
        | ImageFsInodesFree => BOTH,
        MemoryAvailable | AllocatableMemoryAvailable | PidAvailable => &[],
    }
}

/// Cheap to clone: the conditions it reports are read by node status and
/// admission.
#[derive(Clone, Default)]
pub struct EvictionManager {
    config: Arc<Config>,
    state: Arc<Mutex<State>>,
}

impl EvictionManager {
    pub fn new(config: Config) -> Self {
        EvictionManager {
            config: Arc::new(config),
            state: Default::default(),
        }
    }

    /// Sets the conditions as a round would (tests of their readers).
    #[cfg(test)]
    pub(crate) fn set_conditions(&self, c: Vec<Condition>) {
        self.state.lock().conditions = c;
    }

    /// The pressure conditions that hold now.
    pub fn pressure(&self) -> Pressure {
        let c = &self.state.lock().conditions;
        Pressure {
            memory: c.contains(&Condition::MemoryPressure),
            disk: c.contains(&Condition::DiskPressure),
            pid: c.contains(&Condition::PidPressure),
        }
    }

    /// Upstream's eviction admit handler (see `admit`).
    pub fn admit(&self, pod: &Pod) -> Result<(), String> {
        let conditions = self.state.lock().conditions.clone();
        admit(&conditions, pod)
    }

    /// Every `MONITORING_PERIOD` a round; after an eviction, the next round
    /// comes once the pod is cleaned up (up to 30 s), as upstream.
    pub async fn run(self, deps: Deps, token: CancellationToken) {
        if self.config.thresholds.is_empty() && !self.config.local_storage {
            info!("eviction manager: no thresholds configured; not monitoring");
            return;
        }
        info!("eviction manager: starting control loop");
        loop {
            let evicted = tokio::select! {
                _ = token.cancelled() => return,
                e = self.synchronize(&deps, Instant::now()) => e,
            };
            if evicted.is_empty() {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(MONITORING_PERIOD) => {}
                }
                continue;
            }
            info!(pods = ?evicted, "eviction manager: pods evicted, waiting for pod to be cleaned up");
            let deadline = Instant::now() + CLEANUP_TIMEOUT;
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(CLEANUP_POLL) => {}
                }
                if evicted.iter().all(|uid| (deps.cleaned_up)(uid)) {
                    info!(pods = ?evicted, "eviction manager: pods successfully cleaned up");
                    break;
                }
                if Instant::now() >= deadline {
                    info!(pods = ?evicted, "eviction manager: timed out waiting for pods to be cleaned up");
                    break;
                }
            }
        }
    }

    /// Reclaims what the signal allows; true when, on fresh figures, no
    /// threshold is met any more, minimum reclaims included (upstream
    /// reclaimNodeLevelResources).
    async fn reclaim_node_level(&self, deps: &Deps, signal: Signal, dedicated: bool) -> bool {
        let what = reclaim_for(signal, dedicated);
        if what.is_empty() {
            return false;
        }
        for r in what {
            if let Err(e) = (deps.reclaim)(*r).await {
                info!(resource = signal.resource(), error = %e, "eviction manager: unexpected error when attempting to reduce resource pressure");
            }
        }
        let Some(sample) = (deps.sample)().await else {
            warn!("eviction manager: failed to get summary stats after resource reclaim");
            return false;
        };
        let obs = observe(&sample.summary);
        thresholds_met(&self.config.thresholds, &obs, true).is_empty()
    }

    /// One round (upstream synchronize); the UIDs of the pods evicted.
    pub async fn synchronize(&self, deps: &Deps, now: Instant) -> Vec<String> {
        self.round(deps, now).await.unwrap_or_default()
    }

    async fn round(&self, deps: &Deps, now: Instant) -> Option<Vec<String>> {
        let active = (deps.active_pods)();
        let Some(Sample {
            summary,
            dedicated_image_fs,
        }) = (deps.sample)().await
        else {
            // The sampler has logged why.
            return None;
        };
        let obs = observe(&summary);
        let cfg = &self.config;
        let mut thresholds = thresholds_met(&cfg.thresholds, &obs, false);
        let evictable = {
            let mut st = self.state.lock();
            // Thresholds met before stay until their minimum reclaim is.
            if !st.met.is_empty() {
                for t in thresholds_met(&st.met, &obs, true) {
                    if !thresholds.contains(&t) {
                        thresholds.push(t);
                    }
                }
            }
            let first: Vec<(Threshold, Instant)> = thresholds
                .iter()
                .map(|t| {
                    let at = st
                        .first_observed
                        .iter()
                        .find(|(o, _)| o == t)
                        .map_or(now, |(_, at)| *at);
                    (t.clone(), at)
                })
                .collect();
            let mut last_seen = st.conditions_last_observed.clone();
            for c in conditions_of(&thresholds) {
                last_seen.insert(c, now);
            }
            // A condition holds until the transition period has passed
            // since its threshold was last met.
            let conditions: Vec<Condition> = [
                Condition::MemoryPressure,
                Condition::DiskPressure,
                Condition::PidPressure,
            ]
            .into_iter()
            .filter(|c| {
                last_seen
                    .get(c)
                    .is_some_and(|at| now.duration_since(*at) < cfg.pressure_transition)
            })
            .collect();
            let met: Vec<Threshold> = first
                .iter()
                .filter(|(t, at)| now.duration_since(*at) >= t.grace)
                .map(|(t, _)| t.clone())
                .collect();
            if conditions != st.conditions {
                info!(conditions = %conditions_text(&conditions), "eviction manager: node conditions changed");
            }
            st.conditions = conditions.clone();
            st.first_observed = first;
            st.conditions_last_observed = last_seen;
            st.met = met.clone();
            // Only thresholds whose figures are newer than last round's act.
            let updated: Vec<Threshold> = met
                .into_iter()
                .filter(|t| {
                    let Some(o) = obs.get(&t.signal) else {
                        return false;
                    };
                    match st.last_observations.get(&t.signal) {
                        None => true,
                        Some(last) => o.time == 0 || o.time > last.time,
                    }
                })
                .collect();
            st.last_observations = obs.clone();
            updated
        };
        let mut thresholds = evictable;
        let storage_limited = cfg.local_storage && active.iter().any(|p| has_storage_limit(p));
        if thresholds.is_empty() && !storage_limited {
            return None;
        }
        // The sampler has logged why when there are none.
        let pods = (deps.pod_stats)().await?;
        let stats: HashMap<String, PodStats> = pods
            .into_iter()
            .map(|p| (p.pod_ref.uid.clone(), p))
            .collect();
        // Pods over their own local storage limits go first, and alone.
        if storage_limited {
            let evicted = local_storage_evictions(&active, &stats, dedicated_image_fs, deps);
            if !evicted.is_empty() {
                return Some(evicted);
            }
        }
        if thresholds.is_empty() {
            return None;
        }
        by_eviction_priority(&mut thresholds);
        let threshold = thresholds[0].clone();
        let resource = threshold.signal.resource();
        info!(resource, "eviction manager: attempting to reclaim");
        crate::events::record(
            crate::events::node_ref(&deps.node_name),
            crate::events::WARNING,
            "EvictionThresholdMet",
            format!("Attempting to reclaim {resource}"),
        );
        if self
            .reclaim_node_level(deps, threshold.signal, dedicated_image_fs)
            .await
        {
            info!(
                resource,
                "eviction manager: able to reduce resource pressure without evicting pods."
            );
            return None;
        }
        info!(resource, "eviction manager: must evict pod(s) to reclaim");
        if active.is_empty() {
            warn!("eviction manager: eviction thresholds have been met, but no pods are active to evict");
            return None;
        }
        let mut pods = active;
        rank(threshold.signal, &mut pods, &stats, dedicated_image_fs);
        for t in &thresholds {
            if let Some(o) = obs.get(&t.signal).filter(|o| o.time > 0) {
                let age = crate::kuberuntime::wall_now().as_nanos() as i128 - o.time;
                crate::metrics::eviction_stats_age(t.signal.as_str(), age.max(0) as f64 / 1e9);
            }
        }
        for pod in pods {
            let grace = if threshold.is_hard() {
                IMMEDIATE_GRACE
            } else {
                let tgps = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds);
                match tgps {
                    Some(g) => cfg.max_pod_grace.min(g),
                    None => cfg.max_pod_grace,
                }
            };
            let (msg, notes) = message(
                threshold.signal,
                &pod,
                stats.get(pod_uid(&pod)),
                &thresholds,
                &obs,
            );
            if evict_pod(deps, &pod, grace, msg, notes, true) {
                crate::metrics::eviction(threshold.signal.as_str());
                return Some(vec![pod_uid(&pod).to_string()]);
            }
        }
        info!("eviction manager: unable to evict any pods from the node");
        None
    }
}

/// Upstream evictPod: never a critical pod; the event, then the stop.
/// `disruption` adds the DisruptionTarget condition (threshold evictions;
/// upstream's local storage evictions have none).
fn evict_pod(
    deps: &Deps,
    pod: &Arc<Pod>,
    grace: i64,
    message: String,
    annotations: BTreeMap<String, String>,
    disruption: bool,
) -> bool {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if crate::cm::is_critical(pod) {
        warn!(pod = name, "eviction manager: cannot evict a critical pod");
        return false;
    }
    crate::events::pod_annotated(
        pod,
        crate::events::WARNING,
        REASON,
        message.clone(),
        annotations,
    );
    info!(pod = name, pod_uid = pod_uid(pod), message = %message, "evicting pod");
    (deps.evict)(Eviction {
        pod: pod.clone(),
        grace,
        message,
        disruption,
    })
}

/// Upstream's signals for local storage limit evictions (the metric label).
const SIGNAL_EMPTYDIR: &str = "emptydirfs.limit";
const SIGNAL_POD_STORAGE: &str = "ephemeralpodfs.limit";
const SIGNAL_CONTAINER_STORAGE: &str = "ephemeralcontainerfs.limit";

/// A quantity's bytes, rounded up; None when it does not parse.
fn bytes_of(q: &str) -> Option<i128> {
    crate::cm::quantity::parse_bytes(q).ok().map(i128::from)
}

/// Whether the pod sets a local storage limit (an emptyDir `sizeLimit`
/// or an ephemeral-storage limit) that `local_storage_excess` checks.
fn has_storage_limit(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let sized = spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()));
    let limited = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some_and(|l| l.contains_key("ephemeral-storage"))
        });
    sized || limited
}

/// Upstream localStorageEviction: each running pod using more than an
/// emptyDir's `sizeLimit`, than its containers' ephemeral-storage limits
/// together, or with a container over its own limit, is evicted at once.
fn local_storage_evictions(
    pods: &[Arc<Pod>],
    stats: &HashMap<String, PodStats>,
    dedicated_image_fs: bool,
    deps: &Deps,
) -> Vec<String> {
    let mut evicted = Vec::new();
    for pod in pods {
        let Some(st) = stats.get(pod_uid(pod)) else {
            continue;
        };
        if let Some((signal, message)) = local_storage_excess(pod, st, dedicated_image_fs) {
            if evict_pod(deps, pod, IMMEDIATE_GRACE, message, BTreeMap::new(), false) {
                crate::metrics::eviction(signal);
                evicted.push(pod_uid(pod).to_string());
            }
        }
    }
    evicted
}

/// The first local storage limit the pod is over (upstream's order:
/// emptyDir, then the pod's total, then each container), with its signal
/// and message.
pub fn local_storage_excess(
    pod: &Pod,
    st: &PodStats,
    dedicated_image_fs: bool,
) -> Option<(&'static str, String)> {
    let spec = pod.spec.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let Some(size) = bytes_of(&limit.0).filter(|b| *b > 0) else {
            continue;
        };
        let used = st
            .volume_stats
            .iter()
            .find(|s| s.name == v.name)
            .and_then(|s| s.fs.used_bytes);
        if used.is_some_and(|u| u as i128 > size) {
            return Some((
                SIGNAL_EMPTYDIR,
                format!(
                    "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                    v.name, limit.0
                ),
            ));
        }
    }
    let limit_of = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("ephemeral-storage"))
            .map(|q| q.0.clone())
    };
    // Upstream PodLimits: the app containers' limits and the sidecars'
    // summed, against the largest other init container's.
    let mut total: Option<i128> = None;
    let mut binary = false;
    let is_sidecar =
        |c: &&k8s_openapi::api::core::v1::Container| c.restart_policy.as_deref() == Some("Always");
    let inits = || spec.init_containers.iter().flatten();
    for c in spec.containers.iter().chain(inits().filter(is_sidecar)) {
        if let Some(q) = limit_of(c) {
            binary |= q.contains('i');
            *total.get_or_insert(0) += bytes_of(&q).unwrap_or(0);
        }
    }
    for c in inits().filter(|c| !is_sidecar(c)) {
        if let Some(q) = limit_of(c) {
            let b = bytes_of(&q).unwrap_or(0);
            if total.is_none_or(|t| b > t) {
                binary |= q.contains('i');
                total = Some(b);
            }
        }
    }
    if let Some(limit) = total {
        let used = st
            .ephemeral_storage
            .as_ref()
            .and_then(|e| e.used_bytes)
            .unwrap_or(0) as i128;
        if used > limit {
            let text = if binary {
                crate::nodestatus::quantity::format_binary(limit)
            } else {
                format_decimal(limit)
            };
            return Some((
                SIGNAL_POD_STORAGE,
                format!("Pod ephemeral local storage usage exceeds the total limit of containers {text}. "),
            ));
        }
    }
    for cs in &st.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let Some(q) = limit_of(c) else { continue };
        let Some(limit) = bytes_of(&q).filter(|b| *b != 0) else {
            continue;
        };
        let used = |f: &Option<crate::stats::types::FsStats>| {
            f.as_ref().and_then(|f| f.used_bytes).unwrap_or(0) as i128
        };
        let mut u = used(&cs.logs);
        if !dedicated_image_fs {
            u += used(&cs.rootfs);
        }
        if u > limit {
            return Some((
                SIGNAL_CONTAINER_STORAGE,
                format!(
                    "Container {} exceeded its local ephemeral storage limit {:?}. ",
                    c.name, q
                ),
            ));
        }
    }
    None
}

/// Bytes in a decimal quantity's canonical form ("5M", "1500k", "999").
fn format_decimal(v: i128) -> String {
    let mut v = v;
    let mut i = 0;
    while i < 6 && v != 0 && v % 1000 == 0 {
        v /= 1000;
        i += 1;
    }
    format!("{v}{}", ["", "k", "M", "G", "T", "P", "E"][i])
}
