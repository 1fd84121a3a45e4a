//! The probe manager: one task per (container instance, probe type) that
//! runs the container's liveness, readiness or startup probe every period
//! and keeps the latest result (upstream `pkg/kubelet/prober`:
//! `prober_manager.go`, `worker.go`, `prober.go` and `results/`).
//!
//! Workers belong to a container ID: when a container restarts, the pod
//! worker's next [`ProbeManager::sync_pod`] stops the old workers, forgets
//! their results and starts fresh ones. Results are read by the status
//! manager ([`ProbeManager::readiness`], [`ProbeManager::started`]) and the
//! runtime manager ([`ProbeManager::failed`]); each change is also sent as a
//! [`ProbeUpdate`] so the syncLoop can sync the pod at once.

mod handlers;
mod tls;

// The HTTP client is shared with lifecycle httpGet hooks.
pub(crate) use handlers::{http_probe, HttpTarget, Outcome};
mod worker;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::cri::RuntimeService;
use crate::kuberuntime::{CState, RuntimePod};

/// Generated client of the gRPC health protocol, for gRPC probes.
#[allow(clippy::all, missing_docs)]
pub mod health {
    tonic::include_proto!("grpc.health.v1");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

const PROBE_TYPES: [ProbeType; 3] = [
    ProbeType::Liveness,
    ProbeType::Readiness,
    ProbeType::Startup,
];

impl ProbeType {
    /// Upstream's spelling, used in logs and in the `probe_type` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeType::Liveness => "Liveness",
            ProbeType::Readiness => "Readiness",
            ProbeType::Startup => "Startup",
        }
    }

    fn idx(self) -> usize {
        match self {
            ProbeType::Liveness => 0,
            ProbeType::Readiness => 1,
            ProbeType::Startup => 2,
        }
    }

    fn spec(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeType::Liveness => c.liveness_probe.as_ref(),
            ProbeType::Readiness => c.readiness_probe.as_ref(),
            ProbeType::Startup => c.startup_probe.as_ref(),
        }
    }
}

impl std::fmt::Display for ProbeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A probe result that changed (or was decided for the first time) for a
/// container instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container: String,
    pub container_id: String,
    pub probe: ProbeType,
    pub success: bool,
}

/// The `result` label values of `prober_probe_total`. Upstream's third
/// value, "unknown", never occurs: a probe that cannot run is a prober
/// error, retried and then discarded uncounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ResultLabel {
    Successful,
    Failed,
}

impl ResultLabel {
    fn as_str(self) -> &'static str {
        match self {
            ResultLabel::Successful => "successful",
            ResultLabel::Failed => "failed",
        }
    }
}

const METRIC_NAME: &str = "prober_probe";
/// As component-base prints it: BETA in current upstream (prober_manager.go).
const METRIC_HELP: &str =
    "[BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.";
const DURATION_NAME: &str = "prober_probe_duration_seconds";
const DURATION_HELP: &str = "[ALPHA] Duration in seconds for a probe response.";

struct WorkerHandle {
    gen: u64,
    token: CancellationToken,
    /// Runs the probe now instead of at the next period (readiness, once
    /// the startup probe succeeded).
    trigger: Arc<Notify>,
}

/// Probe state of one container of a pod (by name).
#[derive(Default)]
struct ContainerProbes {
    /// The running instance probed now; empty while none runs.
    container_id: String,
    /// Which probes the spec defines, by `ProbeType::idx`.
    has: [bool; 3],
    /// Results for `container_id` as decided by the thresholds; `None`
    /// until decided, when the initial value applies (readiness: not
    /// ready, liveness: alive, startup: not started).
    results: [Option<bool>; 3],
    workers: [Option<WorkerHandle>; 3],
}

impl ContainerProbes {
    fn stop(&mut self, t: ProbeType) {
        if let Some(w) = self.workers[t.idx()].take() {
            w.token.cancel();
        }
    }

    fn stop_all(&mut self) {
        for t in PROBE_TYPES {
            self.stop(t);
        }
    }

    fn started(&self) -> bool {
        !self.has[ProbeType::Startup.idx()]
            || (!self.container_id.is_empty()
                && self.results[ProbeType::Startup.idx()] == Some(true))
    }
}

struct PodProbes {
    name: String,
    namespace: String,
    containers: HashMap<String, ContainerProbes>,
    /// `prober_probe_total` by (container, probe type, result).
    counts: BTreeMap<(String, usize, ResultLabel), u64>,
    /// `prober_probe_duration_seconds` of successful probes by (container,
    /// probe type). Kept per pod so both series go when the pod does, as
    /// upstream's workers delete theirs on exit.
    durations: BTreeMap<(String, usize), Histogram>,
}

struct Inner {
    runtime: Arc<dyn RuntimeService>,
    updates: mpsc::Sender<ProbeUpdate>,
    token: CancellationToken,
    pods: Mutex<HashMap<String, PodProbes>>,
    next_gen: AtomicU64,
}

/// What a worker needs to know about its container; fixed for its life.
pub(crate) struct WorkerCtx {
    pub uid: String,
    /// `namespace/name`, for logs.
    pub pod_ref: String,
    pub container: Container,
    pub container_id: String,
    pub probe_type: ProbeType,
    pub spec: Probe,
    /// Container start, nanoseconds since the epoch (CRI).
    pub started_at: i64,
    pub pod_ip: String,
    /// The container's reference for Unhealthy / ProbeWarning events.
    pub event_ref: k8s_openapi::api::core::v1::ObjectReference,
    gen: u64,
}

#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

/// Regular containers, plus restartable init containers (sidecars): the
/// containers whose probes run.
fn probed_containers(pod: &Pod) -> Vec<&Container> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers.iter().chain(sidecars).collect()
}

impl ProbeManager {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        updates: mpsc::Sender<ProbeUpdate>,
        token: CancellationToken,
    ) -> Self {
        ProbeManager {
            inner: Arc::new(Inner {
                runtime,
                updates,
                token,
                pods: Mutex::new(HashMap::new()),
                next_gen: AtomicU64::new(1),
            }),
        }
    }

    /// Called after every sync of a pod with the runtime's current view.
    /// Starts one worker per (container, probe type) for each running
    /// container (regular containers and sidecars) whose spec has that
    /// probe and that has no worker for this container ID yet; stops the
    /// workers of containers that no longer run or whose ID changed, and
    /// forgets their results.
    pub fn sync_pod(&self, pod: &Pod, rt: &RuntimePod, pod_ip: &str) {
        let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
            return;
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_ref = format!("{namespace}/{name}");
        // Upstream stops liveness and startup probing once deletion is
        // requested, with a last successful result for a quiet shutdown.
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let containers = probed_containers(pod);

        let mut spawn = Vec::new();
        {
            let mut pods = self.inner.pods.lock();
            let entry = pods.entry(uid.clone()).or_insert_with(|| PodProbes {
                name,
                namespace,
                containers: HashMap::new(),
                counts: BTreeMap::new(),
                durations: BTreeMap::new(),
            });
            entry.containers.retain(|cname, cp| {
                let keep = containers.iter().any(|c| &c.name == cname);
                if !keep {
                    cp.stop_all();
                }
                keep
            });
            for c in &containers {
                let has = PROBE_TYPES.map(|t| t.spec(c).is_some());
                if !has.iter().any(|h| *h) {
                    if let Some(mut cp) = entry.containers.remove(&c.name) {
                        cp.stop_all();
                    }
                    continue;
                }
                let running = rt.latest(&c.name).filter(|i| i.state == CState::Running);
                let cp = entry.containers.entry(c.name.clone()).or_default();
                cp.has = has;
                let id = running.map(|i| i.id.as_str()).unwrap_or_default();
                if cp.container_id != id {
                    // A new instance (or none): fresh workers, fresh results.
                    cp.stop_all();
                    cp.results = [None; 3];
                    cp.container_id = id.to_string();
                }
                let Some(info) = running else {
                    continue;
                };
                for t in PROBE_TYPES {
                    let Some(spec) = t.spec(c) else {
                        cp.stop(t);
                        continue;
                    };
                    if deleting && t != ProbeType::Readiness {
                        cp.stop(t);
                        cp.results[t.idx()] = Some(true);
                        continue;
                    }
                    if cp.workers[t.idx()].is_some() {
                        continue;
                    }
                    let gen = self.inner.next_gen.fetch_add(1, Ordering::Relaxed);
                    let handle = WorkerHandle {
                        gen,
                        token: self.inner.token.child_token(),
                        trigger: Arc::new(Notify::new()),
                    };
                    spawn.push((
                        WorkerCtx {
                            uid: uid.clone(),
                            pod_ref: pod_ref.clone(),
                            container: (*c).clone(),
                            container_id: info.id.clone(),
                            probe_type: t,
                            spec: spec.clone(),
                            started_at: info.started_at,
                            pod_ip: pod_ip.to_string(),
                            event_ref: crate::events::pod_ref(
                                pod,
                                Some((&c.name, crate::kuberuntime::is_init(pod, &c.name))),
                            ),
                            gen,
                        },
                        handle.token.clone(),
                        handle.trigger.clone(),
                    ));
                    cp.workers[t.idx()] = Some(handle);
                }
            }
        }
        for (ctx, token, trigger) in spawn {
            tracing::debug!(
                pod = %ctx.pod_ref,
                container = %ctx.container.name,
                probe = ctx.probe_type.as_str(),
                container_id = %ctx.container_id,
                "starting probe worker"
            );
            tokio::spawn(worker::run(self.inner.clone(), ctx, token, trigger));
        }
    }

    /// Stops every worker of the pod and forgets its results and metrics.
    pub fn remove_pod(&self, uid: &str) {
        if let Some(mut p) = self.inner.pods.lock().remove(uid) {
            for cp in p.containers.values_mut() {
                cp.stop_all();
            }
        }
    }

    /// Readiness by container name, for containers with a readiness probe:
    /// ready only once the probe succeeded for the running instance (and
    /// its startup probe, if any, succeeded). Containers without readiness
    /// probe are not in the map; neither are pods never synced.
    pub fn readiness(&self, uid: &str) -> HashMap<String, bool> {
        let pods = self.inner.pods.lock();
        let Some(p) = pods.get(uid) else {
            return HashMap::new();
        };
        p.containers
            .iter()
            .filter(|(_, cp)| cp.has[ProbeType::Readiness.idx()])
            .map(|(name, cp)| {
                let ready = !cp.container_id.is_empty()
                    && cp.results[ProbeType::Readiness.idx()] == Some(true)
                    && cp.started();
                (name.clone(), ready)
            })
            .collect()
    }

    /// Whether the container has started per its startup probe (true when
    /// it has none, or the pod is unknown), for `ContainerStatus.started`.
    pub fn started(&self, uid: &str, container: &str) -> bool {
        let pods = self.inner.pods.lock();
        pods.get(uid)
            .and_then(|p| p.containers.get(container))
            .is_none_or(|cp| cp.started())
    }

    /// Each probed container's probes and their current results (`None`:
    /// not decided yet, the initial value applies), for `/debug/pods`.
    pub fn debug_states(&self, uid: &str) -> Vec<(String, &'static str, Option<bool>)> {
        let pods = self.inner.pods.lock();
        let Some(p) = pods.get(uid) else {
            return Vec::new();
        };
        let mut v = Vec::new();
        for (name, cp) in &p.containers {
            for t in PROBE_TYPES {
                if cp.has[t.idx()] {
                    v.push((name.clone(), t.as_str(), cp.results[t.idx()]));
                }
            }
        }
        v.sort();
        v
    }

    /// Names of containers whose liveness or startup probe failed for
    /// their current instance: the runtime manager restarts them.
    pub fn failed(&self, uid: &str) -> HashSet<String> {
        self.failed_iter(uid, |name, _| name.to_string())
    }

    /// IDs of the container instances [`failed`](Self::failed) reports, for
    /// callers that must not act on a newer instance of the same name.
    pub fn failed_container_ids(&self, uid: &str) -> HashSet<String> {
        self.failed_iter(uid, |_, id| id.to_string())
    }

    fn failed_iter(&self, uid: &str, f: impl Fn(&str, &str) -> String) -> HashSet<String> {
        let pods = self.inner.pods.lock();
        let Some(p) = pods.get(uid) else {
            return HashSet::new();
        };
        p.containers
            .iter()
            .filter(|(_, cp)| {
                !cp.container_id.is_empty()
                    && (cp.results[ProbeType::Liveness.idx()] == Some(false)
                        || cp.results[ProbeType::Startup.idx()] == Some(false))
            })
            .map(|(name, cp)| f(name, &cp.container_id))
            .collect()
    }

    /// Prometheus text for `/metrics/probes`: upstream's
    /// `prober_probe_total` counter. Series are kept for the pod's life.
    /// The `/metrics/probes` exposition (OpenMetrics text), rendered by
    /// prometheus-client from this manager's counters at scrape time.
    pub fn metrics_text(&self) -> String {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(ProbeCollector(self.inner.clone())));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }
}

/// Encodes the counts kept in the pod map, so removing a pod removes its
/// series (upstream deletes them when the workers stop).
#[derive(Debug)]
struct ProbeCollector(Arc<Inner>);

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("prober::Inner")
    }
}

impl Collector for ProbeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pods = self.0.pods.lock();
        // client_golang sorts families by name: the durations first.
        let mut h =
            enc.encode_descriptor(DURATION_NAME, DURATION_HELP, None, MetricType::Histogram)?;
        for p in pods.values() {
            for ((container, t), hist) in &p.durations {
                // client_golang writes label pairs sorted by name.
                let l = [
                    ("container", container.as_str()),
                    ("namespace", p.namespace.as_str()),
                    ("pod", p.name.as_str()),
                    ("probe_type", PROBE_TYPES[*t].as_str()),
                ];
                hist.encode(h.encode_family(&l)?)?;
            }
        }
        let mut c = enc.encode_descriptor(METRIC_NAME, METRIC_HELP, None, MetricType::Counter)?;
        for (uid, p) in pods.iter() {
            for ((container, t, result), n) in &p.counts {
                let l = [
                    ("container", container.as_str()),
                    ("namespace", p.namespace.as_str()),
                    ("pod", p.name.as_str()),
                    ("pod_uid", uid.as_str()),
                    ("probe_type", PROBE_TYPES[*t].as_str()),
                    ("result", result.as_str()),
                ];
                ConstCounter::new(*n).encode(c.encode_family(&l)?)?;
            }
        }
        Ok(())
    }
}

/// Whether the worker is still current, and the container's startup state.
pub(crate) enum Standing {
    /// The worker was replaced or its pod removed: it should exit.
    Stale,
    Current {
        started: bool,
    },
}

impl Inner {
    fn with_container<R>(
        &self,
        ctx: &WorkerCtx,
        f: impl FnOnce(&mut PodProbes, &str) -> R,
    ) -> Option<R> {
        let mut pods = self.pods.lock();
        let p = pods.get_mut(&ctx.uid)?;
        let cp = p.containers.get(&ctx.container.name)?;
        let current = cp.container_id == ctx.container_id
            && cp.workers[ctx.probe_type.idx()]
                .as_ref()
                .is_some_and(|w| w.gen == ctx.gen);
        if !current {
            return None;
        }
        Some(f(p, &ctx.container.name))
    }

    pub(crate) fn standing(&self, ctx: &WorkerCtx) -> Standing {
        match self.with_container(ctx, |p, name| p.containers[name].started()) {
            Some(started) => Standing::Current { started },
            None => Standing::Stale,
        }
    }

    pub(crate) fn count(&self, ctx: &WorkerCtx, result: ResultLabel, took: Duration) {
        self.with_container(ctx, |p, name| {
            *p.counts
                .entry((name.to_string(), ctx.probe_type.idx(), result))
                .or_default() += 1;
            // Upstream times successful probes only.
            if result == ResultLabel::Successful {
                p.durations
                    .entry((name.to_string(), ctx.probe_type.idx()))
                    .or_insert_with(|| Histogram::new(crate::metrics::DEF_BUCKETS))
                    .observe(took.as_secs_f64());
            }
        });
    }

    /// Records a decided result; returns the update to send when it is the
    /// first decided result for this instance or differs from the last.
    pub(crate) fn set_result(&self, ctx: &WorkerCtx, success: bool) -> Option<ProbeUpdate> {
        self.with_container(ctx, |p, name| {
            let cp = p.containers.get_mut(name)?;
            let slot = &mut cp.results[ctx.probe_type.idx()];
            if *slot == Some(success) {
                return None;
            }
            *slot = Some(success);
            if ctx.probe_type == ProbeType::Startup && success {
                // As upstream's status update does: probe readiness right
                // away instead of a period later.
                if let Some(w) = &cp.workers[ProbeType::Readiness.idx()] {
                    w.trigger.notify_one();
                }
            }
            Some(ProbeUpdate {
                pod_uid: ctx.uid.clone(),
                container: name.to_string(),
                container_id: ctx.container_id.clone(),
                probe: ctx.probe_type,
                success,
            })
        })
        .flatten()
    }
}
