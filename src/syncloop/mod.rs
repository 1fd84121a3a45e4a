//! The syncLoop: one select over pod config updates, PLEG events, the 1 s
//! sync tick and housekeeping, handing each pod to its worker (upstream
//! `kubelet.go` syncLoop / syncLoopIteration / HandlePodCleanups).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::pleg::{PlegHandle, PodLifecycleEvent};
use crate::pod::PodManager;
use crate::podworkers::{PodWorkers, Work, WorkQueue};
use crate::prober::ProbeUpdate;
use crate::source::{PodOperation, PodUpdate};
use crate::status::StatusManager;

/// Upstream housekeepingPeriod.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// The longest time between two heap trims (see `SyncLoop::trim_heap`).
const TRIM_PERIOD: Duration = Duration::from_secs(60);
/// Whether to trim the heap: containers changed since the last trim
/// (`!same`), or it is `TRIM_PERIOD` old.
fn trim_due(same: bool, since_last: Duration) -> bool {
    !same || since_last >= TRIM_PERIOD
}

/// Upstream's sync tick that drains the work queue.
pub const SYNC_TICK: Duration = Duration::from_secs(1);

/// When the loop last ran an iteration, for /healthz.
#[derive(Clone)]
pub struct SyncLoopHealth {
    last: Arc<RwLock<Instant>>,
    threshold: Duration,
}

impl SyncLoopHealth {
    /// Upstream: unhealthy when the loop has not run for 2× syncFrequency,
    /// and never less than 5 minutes.
    pub fn new(sync_frequency: Duration) -> Self {
        SyncLoopHealth {
            last: Arc::new(RwLock::new(Instant::now())),
            threshold: (sync_frequency * 2).max(Duration::from_secs(300)),
        }
    }

    fn mark(&self) {
        *self.last.write() = Instant::now();
    }

    pub fn healthy(&self) -> Result<(), String> {
        let elapsed = self.last.read().elapsed();
        if elapsed > self.threshold {
            return Err(format!(
                "syncLoop was last seen active {elapsed:?} ago; threshold is {:?}",
                self.threshold
            ));
        }
        Ok(())
    }
}

pub struct SyncLoop {
    pub pods: PodManager,
    pub status: StatusManager,
    pub workers: PodWorkers,
    pub queue: Arc<WorkQueue>,
    pub pleg: PlegHandle,
    pub health: SyncLoopHealth,
    /// True once every config source has reported its pods once; orphans are
    /// not cleaned up before, or a restart would kill pods still to be listed.
    pub sources_ready: Box<dyn Fn() -> bool + Send + Sync>,
    /// The sources whose first update this loop must have *handled* before
    /// housekeeping may run: a source having reported is not enough, its
    /// pods may still sit in the channel, and an adopted pod would be killed
    /// as an orphan and recreated.
    pub expected_sources: Vec<String>,
    /// Drops per-pod caches (restart and pull backoff) of pods long gone.
    pub gc: Option<Box<dyn Fn() + Send + Sync>>,
    /// Cluster mode: API pods deleted gracefully, finished in the API once
    /// their worker is done.
    pub deleting: Option<crate::status::apisync::Deleting>,
    /// Admission of new pods (upstream canAdmitPod).
    pub admission: Option<Admission>,
}

/// The node facts admission checks against and the pods it refused.
pub struct Admission {
    node: std::sync::Arc<parking_lot::RwLock<crate::lifecycle::NodeFacts>>,
    rejected: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// The runtime's features, as its last Status answer gave them.
    runtime: Option<crate::runtimestate::RuntimeState>,
    /// The eviction manager's pressure conditions (its admit handler comes
    /// first, as upstream's).
    eviction: Option<crate::eviction::EvictionManager>,
    /// The sysctls pods may set (upstream's second admit handler).
    sysctls: Option<crate::lifecycle::sysctl::Allowlist>,
    /// Exclusive CPUs (upstream's third handler, the topology manager's,
    /// which calls the CPU manager's Allocate).
    cpu: Option<crate::cm::cpumanager::CpuManager>,
}

impl Admission {
    pub fn new(node: std::sync::Arc<parking_lot::RwLock<crate::lifecycle::NodeFacts>>) -> Self {
        Admission {
            node,
            rejected: Default::default(),
            runtime: None,
            eviction: None,
            sysctls: None,
            cpu: None,
        }
    }

    /// Takes exclusive CPUs for the pod's containers, or refuses it.
    pub fn with_cpu_manager(mut self, m: crate::cm::cpumanager::CpuManager) -> Self {
        self.cpu = Some(m);
        self
    }

    /// Refuses pods setting sysctls the allowlist does not allow.
    pub fn with_sysctls(mut self, s: crate::lifecycle::sysctl::Allowlist) -> Self {
        self.sysctls = Some(s);
        self
    }

    /// Refuses pods as the eviction manager's admit handler does under
    /// pressure.
    pub fn with_eviction(mut self, e: crate::eviction::EvictionManager) -> Self {
        self.eviction = Some(e);
        self
    }

    /// Takes the runtime's features from its Status answers.
    pub fn with_runtime(mut self, rs: crate::runtimestate::RuntimeState) -> Self {
        self.runtime = Some(rs);
        self
    }

    /// The node as admission sees it now.
    fn facts(&self) -> crate::lifecycle::NodeFacts {
        let mut f = self.node.read().clone();
        if let Some(rs) = &self.runtime {
            f.supplemental_groups_policy = rs.supplemental_groups_policy().unwrap_or(false);
        }
        f
    }
}

/// How often resizes deferred for want of room are tried again, besides
/// each pod removal (upstream's first retry comes after 30 s).
const RESIZE_RETRY_PERIOD: Duration = Duration::from_secs(30);

impl SyncLoop {
    pub async fn run(
        self,
        mut updates: mpsc::Receiver<PodUpdate>,
        mut pleg_events: mpsc::Receiver<PodLifecycleEvent>,
        mut probe_updates: mpsc::Receiver<ProbeUpdate>,
        token: CancellationToken,
    ) {
        let mut sync_tick = tokio::time::interval(SYNC_TICK);
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        let mut resize_retry = tokio::time::interval(RESIZE_RETRY_PERIOD);
        for t in [&mut sync_tick, &mut housekeeping, &mut resize_retry] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        let mut handled = std::collections::HashSet::new();
        let mut trimmed = (self.pleg.snapshot(), Instant::now());
        loop {
            self.health.mark();
            tokio::select! {
                _ = token.cancelled() => {
                    info!("syncLoop stopping; running pods are left running");
                    return;
                }
                Some(u) = updates.recv() => {
                    handled.insert(u.source.clone());
                    self.handle_update(u);
                }
                Some(ev) = pleg_events.recv() => self.handle_pleg(ev),
                // A liveness/startup failure or a readiness change: sync the
                // pod so it is restarted or its status republished.
                Some(u) = probe_updates.recv() => {
                    if let Some(pod) = self.pods.get(&u.pod_uid) {
                        debug!(pod_uid = %u.pod_uid, container = %u.container, probe = ?u.probe, success = u.success, "probe result changed");
                        self.workers.update(&u.pod_uid, Work::Sync(pod));
                    }
                }
                _ = sync_tick.tick() => {
                    for uid in self.queue.take_due(Instant::now()) {
                        if let Some(pod) = self.pods.get(&uid) {
                            self.workers.update(&uid, Work::Sync(pod));
                        }
                    }
                }
                _ = resize_retry.tick() => self.retry_resizes("periodic_retry"),
                _ = housekeeping.tick() => {
                    let ready = self.expected_sources.iter().all(|s| handled.contains(s))
                        && (self.sources_ready)();
                    if ready {
                        self.housekeeping();
                    }
                    trimmed = self.trim_heap(trimmed);
                }
            }
        }
    }

    fn handle_update(&self, mut u: PodUpdate) {
        debug!(op = ?u.op, source = %u.source, pods = u.pods.len(), "pod config update");
        if u.op == PodOperation::Add {
            // Upstream admits new pods oldest first.
            u.pods.sort_by(|a, b| {
                a.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            });
        }
        for pod in u.pods {
            let uid = crate::source::pod_uid(&pod).to_string();
            match u.op {
                // A pod that arrives already deleted (an rkubelet restart
                // during a graceful deletion) is terminated, not started.
                PodOperation::Add | PodOperation::Update | PodOperation::Set
                    if pod.metadata.deletion_timestamp.is_some() =>
                {
                    self.terminate(pod, &uid, u.op);
                }
                PodOperation::Add if !self.admit(&pod, &uid) => {
                    self.pods.upsert(pod);
                }
                PodOperation::Update | PodOperation::Set if self.is_rejected(&uid) => {
                    self.pods.upsert(pod);
                }
                PodOperation::Add | PodOperation::Update | PodOperation::Set => {
                    info!(pod = pod.metadata.name.as_deref().unwrap_or_default(), pod_uid = %uid, op = ?u.op, "syncing pod");
                    let before = self.pods.get(&uid);
                    let pod = self.pods.upsert(pod);
                    self.resize(&pod, before.as_deref());
                    if u.op == PodOperation::Add {
                        crate::metrics::containers_per_pod(&pod);
                    }
                    self.workers.update(&uid, Work::Sync(pod));
                }
                PodOperation::Delete => self.terminate(pod, &uid, u.op),
                PodOperation::Remove => {
                    self.terminate(pod, &uid, u.op);
                    self.workers.allocation().remove(&uid);
                    self.retry_resizes("pods_removed");
                }
                // A status-only change (upstream HandlePodReconcile): the kept
                // copy follows it, so conditions others set (a readiness
                // gate's) reach the next status; a gate that changed what
                // Ready should be syncs the pod now.
                PodOperation::Reconcile => {
                    let Some(pod) = self.pods.reconcile(pod) else {
                        continue;
                    };
                    if !self.is_rejected(&uid)
                        && crate::status::generate::readiness_needs_reconcile(&pod)
                    {
                        debug!(pod = pod.metadata.name.as_deref().unwrap_or_default(), pod_uid = %uid, "readiness gate changed");
                        self.workers.update(&uid, Work::Sync(pod));
                    }
                }
            }
        }
    }

    fn is_rejected(&self, uid: &str) -> bool {
        self.admission
            .as_ref()
            .is_some_and(|a| a.rejected.lock().contains(uid))
    }

    /// Admits a new pod, or records it as Failed with upstream's reason
    /// and message ("Pod was rejected: ...") without ever starting it.
    fn admit(&self, pod: &crate::source::Pod, uid: &str) -> bool {
        let Some(a) = &self.admission else {
            return true;
        };
        if self.workers.is_known(uid) {
            return true;
        }
        let others = self.active_pods(a, uid);
        let refs: Vec<&crate::source::Pod> = others.iter().map(|p| p.as_ref()).collect();
        let is_static = crate::status::apisync::is_static_pod(pod);
        // A pod back after a restart is admitted as it was granted, not
        // with a resize still waiting for room (upstream admits the
        // allocated pod).
        let allocation = self.workers.allocation();
        let granted = allocation
            .lags(uid)
            .then(|| allocation.granted(Arc::new(pod.clone())));
        let checked = granted.as_deref().unwrap_or(pod);
        let evicted = a.eviction.as_ref().and_then(|e| e.admit(checked).err());
        let verdict = match evicted {
            Some(message) => Err(crate::lifecycle::Rejection {
                reason: crate::eviction::REASON.into(),
                message,
            }),
            None => {
                a.sysctls
                    .as_ref()
                    .map_or(Ok(()), |s| s.admit(checked))
                    .and_then(|()| match &a.cpu {
                        Some(m) => m.admit(checked).map_err(|(reason, message)| {
                            crate::lifecycle::Rejection { reason, message }
                        }),
                        None => Ok(()),
                    })
                    .and_then(|()| crate::lifecycle::admit(checked, &refs, &a.facts(), is_static))
            }
        };
        crate::metrics::topology_manager_admission(Duration::ZERO);
        match verdict {
            Ok(()) => true,
            Err(r) => {
                tracing::warn!(pod = pod.metadata.name.as_deref().unwrap_or_default(), pod_uid = %uid, reason = %r.reason, message = %r.message, "pod rejected at admission");
                crate::metrics::admission_rejected(&r.reason);
                a.rejected.lock().insert(uid.to_string());
                crate::events::pod(
                    pod,
                    None,
                    crate::events::WARNING,
                    &r.reason,
                    r.message.clone(),
                );
                self.status.set(
                    uid,
                    k8s_openapi::api::core::v1::PodStatus {
                        phase: Some("Failed".into()),
                        reason: Some(r.reason),
                        message: Some(format!("Pod was rejected: {}", r.message)),
                        qos_class: Some(crate::cm::pod_qos(pod).as_str().into()),
                        ..Default::default()
                    },
                );
                false
            }
        }
    }

    /// The pods admission counts besides `uid`, as granted (their
    /// allocations, not specs a resize has not been granted yet).
    fn active_pods(&self, a: &Admission, uid: &str) -> Vec<Arc<crate::source::Pod>> {
        // The active pods, as upstream's filterOutInactivePods: the desired
        // pods and the deleted ones still in their grace period (their
        // containers hold what they asked for until they stop), less those
        // whose worker finished and those that ended and are not being
        // stopped. A deleted pod whose worker is gone has finished (upstream
        // keeps its worker, known terminated, until the source removes it).
        use crate::podworkers::WorkerPhase;
        let (desired, deleted) = self.pods.desired_and_terminating();
        let active = |p: &Arc<crate::source::Pod>, is_desired: bool| {
            let id = crate::source::pod_uid(p);
            if id == uid || a.rejected.lock().contains(id) {
                return false;
            }
            let worker = self.workers.phase(id);
            match worker {
                Some(WorkerPhase::Terminated) => false,
                None if !is_desired => false,
                Some(WorkerPhase::Terminating) => true,
                _ => !self
                    .status
                    .get(id)
                    .is_some_and(|s| crate::status::generate::is_terminal(s.phase.as_deref())),
            }
        };
        desired
            .into_iter()
            .filter(|p| active(p, true))
            .chain(deleted.into_iter().filter(|p| active(p, false)))
            .map(|p| self.workers.allocation().granted(p))
            .collect()
    }

    /// An update of an admitted pod whose containers' resources differ
    /// from what it was granted is a resize request (upstream
    /// HandlePodUpdates, handlePodResourcesResize); one that matches again
    /// (reverted) ends any wait. `before` is the pod as last seen (none:
    /// new, or back after a restart with a lagging allocation on record).
    fn resize(&self, pod: &Arc<crate::source::Pod>, before: Option<&crate::source::Pod>) {
        let Some(a) = &self.admission else {
            return;
        };
        let uid = crate::source::pod_uid(pod);
        if self.is_rejected(uid) {
            return;
        }
        let alloc = self.workers.allocation();
        let want = crate::allocation::resources_of(pod);
        let was = before.map(crate::allocation::resources_of);
        if let Some(was) = &was {
            crate::allocation::count_requested_resizes(was, &want);
        }
        // What the pod runs on: its lagging allocation, else the copy last
        // seen; a new pod with no record has nothing to decide.
        let lagging = alloc.lagging(uid);
        let waits = lagging.is_some();
        let Some(granted) = lagging.or(was) else {
            return;
        };
        if want == granted {
            if waits {
                alloc.grant(pod, false);
            }
            return;
        }
        self.decide_resize(a, pod, granted, "pod_updated");
    }

    /// Grants a resize that fits, or keeps the pod on `alloc` with why it
    /// waits (upstream canResizePod, then the admission handlers with the
    /// pod's new resources: Infeasible, then Deferred). True when granted.
    fn decide_resize(
        &self,
        a: &Admission,
        pod: &Arc<crate::source::Pod>,
        alloc: crate::allocation::Allocation,
        trigger: &'static str,
    ) -> bool {
        use crate::allocation::{Pending, DEFERRED, INFEASIBLE};
        let uid = crate::source::pod_uid(pod);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let node = a.facts();
        let is_static = crate::status::apisync::is_static_pod(pod);
        let why = if is_static {
            crate::metrics::resize_infeasible("static_pod");
            Some(Pending {
                reason: INFEASIBLE,
                message: "In-place resize of static-pods is not supported".into(),
            })
        } else if a.cpu.as_ref().is_some_and(|m| m.is_static())
            && crate::cm::pod_qos(pod) == crate::cm::QosClass::Guaranteed
            && cpu_request_changes(pod, &alloc)
        {
            // Upstream canResizePod: pinned CPUs are not resized (rkubelet
            // does not follow InPlacePodVerticalScalingExclusiveCPUs, under
            // which upstream would re-allocate them).
            crate::metrics::resize_infeasible("guaranteed_pod_cpu_manager_static_policy");
            Some(Pending {
                reason: INFEASIBLE,
                message: "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"".into(),
            })
        } else if let Some(p) = crate::allocation::infeasible(pod, &node) {
            crate::metrics::resize_infeasible("insufficient_node_allocatable");
            Some(p)
        } else {
            let others = self.active_pods(a, uid);
            let refs: Vec<&crate::source::Pod> = others.iter().map(|p| p.as_ref()).collect();
            crate::lifecycle::admit(pod, &refs, &node, is_static)
                .err()
                .map(|r| Pending {
                    reason: DEFERRED,
                    message: r.message,
                })
        };
        let allocation = self.workers.allocation();
        match why {
            None => {
                if allocation
                    .pending(uid)
                    .is_some_and(|p| p.reason == DEFERRED)
                {
                    crate::metrics::resize_deferred_accepted(trigger);
                }
                info!(pod = name, pod_uid = %uid, "in-place resize granted");
                allocation.grant(pod, true);
                true
            }
            Some(p) => {
                info!(pod = name, pod_uid = %uid, reason = p.reason, message = %p.message, "in-place resize waits");
                allocation.defer(uid, alloc, p);
                false
            }
        }
    }

    /// Tries the deferred resizes again (after a pod left, or
    /// periodically); a granted one syncs its pod. Infeasible ones wait for
    /// their pod to change, as upstream drops them from its queue.
    fn retry_resizes(&self, trigger: &'static str) {
        let Some(a) = &self.admission else {
            return;
        };
        let alloc = self.workers.allocation();
        // Upstream's retry order: the first in line takes the room there is.
        let mut queue = Vec::new();
        for uid in alloc.deferred_uids() {
            match self.pods.get(&uid) {
                Some(pod) => queue.push((alloc.retry_rank(&pod), uid, pod)),
                None => alloc.remove(&uid),
            }
        }
        // Stable: equals keep deferred_uids' longest-waiting-first order.
        queue.sort_by_key(|q| q.0);
        for (_, uid, pod) in queue {
            let granted = alloc.allocation(&uid, &pod);
            if self.decide_resize(a, &pod, granted, trigger) {
                self.workers.update(&uid, Work::Sync(pod));
            }
        }
    }

    fn terminate(&self, pod: crate::source::Pod, uid: &str, op: PodOperation) {
        if let Some(a) = &self.admission {
            if a.rejected.lock().remove(uid) {
                // Never started: nothing to stop.
                self.status.remove(uid);
                if let Some(d) = &self.deleting {
                    if pod.metadata.deletion_timestamp.is_some()
                        && crate::status::apisync::is_api_pod(&pod)
                    {
                        d.add(&pod);
                    }
                }
                if op == PodOperation::Remove {
                    self.pods.remove(uid);
                } else {
                    self.pods.mark_terminating(pod);
                }
                return;
            }
        }
        info!(pod = pod.metadata.name.as_deref().unwrap_or_default(), pod_uid = %uid, op = ?op, "terminating pod");
        let grace = pod.metadata.deletion_grace_period_seconds;
        if let Some(d) = &self.deleting {
            if op != PodOperation::Remove
                && pod.metadata.deletion_timestamp.is_some()
                && crate::status::apisync::is_api_pod(&pod)
            {
                d.add(&pod);
            }
        }
        // A deletion carries the pod as the API has it now (with its
        // deletionTimestamp), kept listed until its removal; a removal may
        // carry only its identity.
        let pod = if op == PodOperation::Remove {
            self.pods.remove(uid).unwrap_or_else(|| Arc::new(pod))
        } else {
            self.pods.mark_terminating(pod)
        };
        self.workers.update(
            uid,
            Work::Terminate {
                pod: Some(pod),
                grace,
            },
        );
    }

    fn handle_pleg(&self, ev: PodLifecycleEvent) {
        if let Some(pod) = self.pods.get(&ev.uid) {
            self.workers.update(&ev.uid, Work::Sync(pod));
        }
    }

    /// Gives freed heap back to the kernel (glibc keeps it in its arenas):
    /// at the first housekeeping after containers changed, so a burst of
    /// pod starts (watch events, tokens, CRI answers decoded and dropped)
    /// does not stay resident, and otherwise once per `TRIM_PERIOD`.
    /// Measured with 110 API pods just started: 5.5 MiB of the 26.6 MiB
    /// anonymous RSS was such memory. Returns the snapshot and time of the
    /// last trim.
    fn trim_heap(
        &self,
        (seen, at): (Arc<crate::pleg::Snapshot>, Instant),
    ) -> (Arc<crate::pleg::Snapshot>, Instant) {
        let now = self.pleg.snapshot();
        // The relist replaces its snapshot only when something changed.
        let same = Arc::ptr_eq(&now, &seen);
        if !trim_due(same, at.elapsed()) {
            return (seen, at);
        }
        // cAdvisor's text buffers, when no scrape has used them lately.
        crate::stats::textpool::release_idle();
        // A bounded walk of the allocator's free lists: no I/O, well under
        // a millisecond at this heap's size.
        crate::memtrim::trim();
        (now, Instant::now())
    }

    /// Kills pods the runtime runs that no source wants (upstream
    /// HandlePodCleanups), once every source has been heard from. Orphans
    /// are stopped with the grace period and preStop hooks recorded in their
    /// containers' annotations.
    fn housekeeping(&self) {
        let snap = self.pleg.snapshot();
        for uid in snap.keys() {
            if !self.pods.contains(uid) && !self.workers.is_known(uid) {
                info!(pod_uid = %uid, "cleaning up orphaned pod");
                crate::metrics::orphaned_runtime_pod();
                self.workers.update(
                    uid,
                    Work::Terminate {
                        pod: None,
                        grace: None,
                    },
                );
            }
        }
        for uid in self.status.uids() {
            if !self.pods.contains(&uid) && !self.workers.is_known(&uid) {
                self.status.remove(&uid);
            }
        }
        crate::metrics::set_pod_counts(self.pods.pods().iter().map(|p| {
            (
                crate::status::apisync::is_static_pod(p),
                !self.is_rejected(crate::source::pod_uid(p))
                    && !self
                        .status
                        .get(crate::source::pod_uid(p))
                        .is_some_and(|s| crate::status::generate::is_terminal(s.phase.as_deref())),
            )
        }));
        crate::metrics::set_working_pods(self.workers.working().into_iter().map(
            |(uid, phase, has_config, st)| {
                (
                    crate::metrics::worker_lifecycle(phase),
                    !self.pods.contains(&uid),
                    has_config,
                    st,
                )
            },
        ));
        if let Some(gc) = &self.gc {
            gc();
        }
    }
}

/// Upstream guaranteedPodResourceResizeRequired for cpu: a resizable
/// container asks for another cpu request than it was granted.
fn cpu_request_changes(pod: &crate::source::Pod, granted: &crate::allocation::Allocation) -> bool {
    let cpu = |r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>| {
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get("cpu"))
            .and_then(|q| crate::cm::quantity::parse_milli(&q.0).ok())
    };
    crate::allocation::resizable(pod)
        .any(|c| cpu(c.resources.as_ref()) != cpu(granted.get(&c.name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use crate::podworkers::testing;

    #[test]
    fn the_heap_is_trimmed_after_container_changes_and_once_a_minute() {
        assert!(trim_due(false, Duration::ZERO), "containers changed");
        assert!(!trim_due(true, Duration::from_secs(2)), "quiet: not yet");
        assert!(trim_due(true, TRIM_PERIOD), "quiet for a period");
    }

    /// A syncLoop over `workers` (and their status manager) with every
    /// source ready.
    fn sync_loop(
        pods: PodManager,
        workers: &PodWorkers,
        pleg: PlegHandle,
        admission: Option<Admission>,
    ) -> SyncLoop {
        SyncLoop {
            pods,
            status: workers.status().clone(),
            workers: workers.clone(),
            // The workers' own queue, as in the kubelet: a sync that asks
            // to come back is taken off it by the loop's tick.
            queue: workers.queue().clone(),
            pleg,
            health: SyncLoopHealth::new(Duration::from_secs(60)),
            sources_ready: Box::new(|| true),
            expected_sources: vec![],
            gc: None,
            deleting: None,
            admission,
        }
    }

    /// A fake runtime with busybox, pod workers over it and a PLEG.
    fn fixture() -> (Arc<FakeRuntime>, CancellationToken, PodWorkers, PlegHandle) {
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let workers = testing::workers(&fake, &token);
        let pleg = crate::pleg::spawn(
            fake.clone(),
            Duration::from_secs(1),
            mpsc::channel(10).0,
            token.child_token(),
        );
        (fake, token, workers, pleg)
    }

    /// Runs `sl` until `token` is cancelled, fed by the returned sender; no
    /// PLEG event or probe result comes (their senders live as long).
    fn run_loop(
        sl: SyncLoop,
        token: &CancellationToken,
    ) -> (mpsc::Sender<PodUpdate>, tokio::task::JoinHandle<()>) {
        let (updates_tx, updates_rx) = mpsc::channel(10);
        let (pleg_tx, pleg_rx) = mpsc::channel(10);
        let (probe_tx, probe_rx) = mpsc::channel(10);
        let token = token.child_token();
        let task = tokio::spawn(async move {
            let _senders = (pleg_tx, probe_tx);
            sl.run(updates_rx, pleg_rx, probe_rx, token).await
        });
        (updates_tx, task)
    }

    /// Admission on a node with room for one pod.
    fn one_pod_node() -> Admission {
        let facts = crate::lifecycle::NodeFacts {
            name: "n1".into(),
            cpu_milli: 2000,
            memory_milli: 1 << 40,
            ephemeral_milli: 1 << 40,
            pods: 1,
            ..Default::default()
        };
        Admission::new(Arc::new(parking_lot::RwLock::new(facts)))
    }

    /// Admission on a node with 2 cpus and room for the rest.
    fn two_cpu_node() -> Admission {
        let facts = crate::lifecycle::NodeFacts {
            name: "n1".into(),
            cpu_milli: 2000,
            memory_milli: 1 << 50,
            ephemeral_milli: 1 << 50,
            pods: 110,
            ..Default::default()
        };
        Admission::new(Arc::new(parking_lot::RwLock::new(facts)))
    }

    /// A pod as the API source gives it.
    fn api_pod(name: &str, uid: &str) -> crate::source::Pod {
        let mut p = crate::testutil::named_pod(name, uid);
        p.metadata.annotations = Some(
            [(
                crate::source::CONFIG_SOURCE_ANNOTATION.to_string(),
                crate::source::API_SOURCE.to_string(),
            )]
            .into(),
        );
        p
    }

    async fn send_api(tx: &mpsc::Sender<PodUpdate>, op: PodOperation, pod: crate::source::Pod) {
        tx.send(PodUpdate {
            pods: vec![pod],
            op,
            source: crate::source::API_SOURCE.to_string(),
        })
        .await
        .unwrap()
    }

    /// Polls `f` until it holds, failing after 20 s.
    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn housekeeping_waits_until_each_sources_first_update_is_handled() {
        // Old code: housekeeping ran as soon as the source had *reported*,
        // while its pods could still sit in the channel, and killed the
        // adopted pod as an orphan.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let mut pod = crate::testutil::pod("Always", &[], &["app"]);
        pod.metadata.name = Some("adopted".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("u-adopt".into());
        // A previous rkubelet left the pod running.
        let before = testing::workers(&fake, &token);
        let rt = before.runtime().pod_status("u-adopt").await.unwrap();
        before
            .runtime()
            .sync_pod(&pod, &rt, &Default::default())
            .await;
        fake.clear_calls();

        let workers = testing::workers(&fake, &token);
        let (pleg_tx, pleg_rx) = mpsc::channel(100);
        let pleg = crate::pleg::spawn(
            fake.clone(),
            Duration::from_secs(1),
            pleg_tx,
            token.child_token(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pleg.snapshot().contains_key("u-adopt") {
            assert!(Instant::now() < deadline, "relist never saw the pod");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (updates_tx, updates_rx) = mpsc::channel(10);
        let (_probe_tx, probe_rx) = mpsc::channel(10);
        let sl = SyncLoop {
            pods: PodManager::new(),
            status: StatusManager::new(),
            workers: workers.clone(),
            queue: Arc::new(WorkQueue::default()),
            pleg,
            health: SyncLoopHealth::new(Duration::from_secs(60)),
            // The source has reported; its update is not handled yet.
            sources_ready: Box::new(|| true),
            expected_sources: vec![crate::source::FILE_SOURCE.to_string()],
            gc: None,
            deleting: None,
            admission: None,
        };
        let t = token.child_token();
        let task = tokio::spawn(sl.run(updates_rx, pleg_rx, probe_rx, t));
        // Several housekeeping periods pass (paused time: a timer, not a wait).
        tokio::time::sleep(HOUSEKEEPING_PERIOD * 4).await;
        assert!(
            !workers.is_known("u-adopt"),
            "adopted pod treated as an orphan"
        );
        updates_tx
            .send(PodUpdate {
                pods: vec![pod],
                op: PodOperation::Add,
                source: crate::source::FILE_SOURCE.to_string(),
            })
            .await
            .unwrap();
        tokio::time::sleep(HOUSEKEEPING_PERIOD * 4).await;
        assert_eq!(
            workers.phase("u-adopt"),
            Some(crate::podworkers::WorkerPhase::Syncing)
        );
        let calls = fake.calls();
        assert!(
            !calls
                .iter()
                .any(|c| c.starts_with("Stop") || c.starts_with("RunPodSandbox")),
            "adopted pod was killed or recreated: {calls:?}"
        );
        token.cancel();
        task.await.unwrap();
    }

    /// The pod's first status, waited for up to 10 s.
    async fn first_status(
        status: &StatusManager,
        uid: &str,
    ) -> Arc<k8s_openapi::api::core::v1::PodStatus> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = status.get(uid) {
                return s;
            }
            assert!(Instant::now() < deadline, "no status for {uid}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_pod_that_does_not_fit_is_rejected_and_never_started() {
        // Old code: every pod was started, whatever maxPods said.
        let (_, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let sl = sync_loop(PodManager::new(), &workers, pleg, Some(one_pod_node()));
        let pod = |name: &str| crate::testutil::named_pod(name, &format!("u-{name}"));
        let (updates_tx, task) = run_loop(sl, &token);
        updates_tx
            .send(PodUpdate {
                pods: vec![pod("first"), pod("second")],
                op: PodOperation::Add,
                source: crate::source::FILE_SOURCE.to_string(),
            })
            .await
            .unwrap();
        let rejected = first_status(&status, "u-second").await;
        assert_eq!(rejected.phase.as_deref(), Some("Failed"));
        assert_eq!(rejected.reason.as_deref(), Some("OutOfpods"));
        assert_eq!(
            rejected.message.as_deref(),
            Some("Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1")
        );
        assert!(workers.is_known("u-first"));
        assert!(
            !workers.is_known("u-second"),
            "a rejected pod gets no worker"
        );
        token.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn under_memory_pressure_a_best_effort_pod_is_rejected_as_evicted() {
        // Old code: nothing refused pods while the node was short of memory.
        let (_, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let eviction = crate::eviction::EvictionManager::default();
        eviction.set_conditions(vec![crate::eviction::Condition::MemoryPressure]);
        let admission = two_cpu_node().with_eviction(eviction);
        let sl = sync_loop(PodManager::new(), &workers, pleg, Some(admission));
        let (updates_tx, task) = run_loop(sl, &token);
        updates_tx
            .send(PodUpdate {
                pods: vec![api_pod("be", "u-be")],
                op: PodOperation::Add,
                source: crate::source::API_SOURCE.to_string(),
            })
            .await
            .unwrap();
        let rejected = first_status(&status, "u-be").await;
        assert_eq!(rejected.phase.as_deref(), Some("Failed"));
        assert_eq!(rejected.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            rejected.message.as_deref(),
            Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
        );
        assert!(!workers.is_known("u-be"));
        token.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn a_pod_setting_an_unsafe_sysctl_is_rejected_as_sysctl_forbidden() {
        // Old code: no sysctl admit handler; the pod ran with whatever
        // sysctls it asked for.
        let (_, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let sysctls = crate::lifecycle::sysctl::Allowlist::for_node("6.1.0", &[]).unwrap();
        let admission = two_cpu_node().with_sysctls(sysctls);
        let sl = sync_loop(PodManager::new(), &workers, pleg, Some(admission));
        let (updates_tx, task) = run_loop(sl, &token);
        let mut pod = api_pod("tuned", "u-tuned");
        pod.spec.as_mut().unwrap().security_context = Some(
            serde_json::from_value(serde_json::json!({"sysctls": [
                {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                {"name": "kernel.msgmax", "value": "65536"}
            ]}))
            .unwrap(),
        );
        updates_tx
            .send(PodUpdate {
                pods: vec![pod],
                op: PodOperation::Add,
                source: crate::source::API_SOURCE.to_string(),
            })
            .await
            .unwrap();
        let rejected = first_status(&status, "u-tuned").await;
        assert_eq!(rejected.phase.as_deref(), Some("Failed"));
        assert_eq!(rejected.reason.as_deref(), Some("SysctlForbidden"));
        assert_eq!(
            rejected.message.as_deref(),
            Some("Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted")
        );
        assert!(!workers.is_known("u-tuned"));
        token.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn a_pod_in_its_grace_period_still_counts_at_admission() {
        // Old code: admission counted the desired pods only, so a new pod
        // was admitted beside a deleted one whose containers were still
        // stopping (upstream's filterOutInactivePods counts it until its
        // worker finishes).
        let (fake, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let pods = PodManager::new();
        let sl = sync_loop(pods.clone(), &workers, pleg, Some(one_pod_node()));
        let (updates_tx, task) = run_loop(sl, &token);
        let send = |op, pod| send_api(&updates_tx, op, pod);

        // A container deaf to SIGTERM (the fake's "stubborn" name): it
        // stops only when its grace period runs out.
        let mut old = crate::testutil::pod("Always", &[], &["stubborn"]);
        old.metadata.name = Some("old".into());
        old.metadata.namespace = Some("default".into());
        old.metadata.uid = Some("u-old".into());
        send(PodOperation::Add, old.clone()).await;
        until("the old pod running", || {
            fake.calls().iter().any(|c| c.starts_with("StartContainer"))
        })
        .await;
        old.metadata.deletion_timestamp = Some(crate::testutil::epoch());
        old.metadata.deletion_grace_period_seconds = Some(2);
        send(PodOperation::Delete, old).await;
        until("the deletion handled", || !pods.contains("u-old")).await;
        assert_eq!(
            workers.phase("u-old"),
            Some(crate::podworkers::WorkerPhase::Terminating)
        );

        send(
            PodOperation::Add,
            crate::testutil::named_pod("new", "u-new"),
        )
        .await;
        until("a verdict on the new pod", || {
            status.get("u-new").is_some() || workers.is_known("u-new")
        })
        .await;
        let rejected = status
            .get("u-new")
            .expect("rejected beside the pod in its grace period");
        assert_eq!(rejected.reason.as_deref(), Some("OutOfpods"));
        assert!(!workers.is_known("u-new"));

        // Once the old pod's worker is done, it no longer counts, though
        // the API has not removed it yet.
        until("the old pod's worker finished", || {
            !workers.is_known("u-old")
        })
        .await;
        assert_eq!(pods.listed().len(), 2, "old still listed, new rejected");
        send(
            PodOperation::Add,
            crate::testutil::named_pod("later", "u-later"),
        )
        .await;
        until("the later pod admitted", || workers.is_known("u-later")).await;
        assert!(status.get("u-later").is_none_or(|s| s.reason.is_none()));
        token.cancel();
        let _ = task.await;
    }

    #[test]
    fn a_cpu_resize_is_told_from_other_resizes() {
        // Under the static CPU manager policy only a changed cpu request
        // makes a Guaranteed pod's resize Infeasible (upstream
        // guaranteedPodResourceResizeRequired).
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let res = |cpu: &str, mem: &str| ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_string(), Quantity(cpu.into())),
                    ("memory".to_string(), Quantity(mem.into())),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let mut pod = crate::testutil::named_pod("p", "u");
        pod.spec.as_mut().unwrap().containers[0].resources = Some(res("1", "64Mi"));
        let name = pod.spec.as_ref().unwrap().containers[0].name.clone();
        let granted = |cpu: &str, mem: &str| {
            crate::allocation::Allocation::from([(name.clone(), res(cpu, mem))])
        };
        assert!(!cpu_request_changes(&pod, &granted("1", "64Mi")));
        assert!(!cpu_request_changes(&pod, &granted("1000m", "32Mi")));
        assert!(cpu_request_changes(&pod, &granted("2", "64Mi")));
    }

    #[tokio::test]
    async fn an_in_place_resize_runs_when_it_fits_and_waits_when_it_does_not() {
        // Old code: a resized spec changed nothing on the node, and no
        // condition said so (upstream's in-place resize, beta and on in
        // 1.34: handlePodResourcesResize, doPodResizeAction).
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let (fake, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let pods = PodManager::new();
        let sl = sync_loop(pods.clone(), &workers, pleg, Some(two_cpu_node()));
        let (updates_tx, task) = run_loop(sl, &token);
        let send = |op, pod| send_api(&updates_tx, op, pod);
        let sized = |name: &str, cpu: &str| {
            let mut p = api_pod(name, &format!("u-{name}"));
            let q = [("cpu".to_string(), Quantity(cpu.into()))];
            p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
                requests: Some(q.clone().into()),
                limits: Some(q.into()),
                ..Default::default()
            });
            p
        };
        let updated = |quota: i64| {
            let fake = fake.clone();
            move || {
                fake.calls().iter().any(|c| {
                    c.starts_with("UpdateContainerResources app")
                        && c.contains(&format!("quota={quota} "))
                })
            }
        };
        let condition = |t: &'static str| {
            let status = status.clone();
            move || {
                status.get("u-web").and_then(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .find(|c| c.type_ == t)
                        .cloned()
                })
            }
        };
        send(PodOperation::Add, sized("web", "500m")).await;
        send(PodOperation::Add, sized("hog", "1")).await;
        until("both running", || fake.count_calls("StartContainer") == 2).await;

        // 800m fits beside the hog: applied in place, then done.
        send(PodOperation::Update, sized("web", "800m")).await;
        until("web updated to 800m", updated(80_000)).await;
        until("the resize done", || {
            status.get("u-web").is_some_and(|s| {
                s.container_statuses.as_ref().is_some_and(|cs| {
                    cs[0]
                        .resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .map(|l| l["cpu"].0.clone())
                        == Some("800m".into())
                }) && condition("PodResizeInProgress")().is_none()
            })
        })
        .await;
        let st = status.get("u-web").unwrap();
        assert_eq!(
            st.container_statuses.as_ref().unwrap()[0]
                .allocated_resources
                .as_ref()
                .unwrap()["cpu"]
                .0,
            "800m"
        );

        // 1500m does not fit beside the hog's 1: it waits, Deferred, and
        // the container keeps its 800m.
        send(PodOperation::Update, sized("web", "1500m")).await;
        until("Deferred", || condition("PodResizePending")().is_some()).await;
        let c = condition("PodResizePending")().unwrap();
        assert_eq!(c.reason.as_deref(), Some("Deferred"));
        assert_eq!(
            c.message.as_deref(),
            Some("Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000")
        );
        assert!(!updated(150_000)());

        // More than the node has: Infeasible.
        send(PodOperation::Update, sized("web", "3")).await;
        until("Infeasible", || {
            condition("PodResizePending")()
                .is_some_and(|c| c.reason.as_deref() == Some("Infeasible"))
        })
        .await;
        assert_eq!(
            condition("PodResizePending")().unwrap().message.as_deref(),
            Some("Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000")
        );

        // Back to 1500m, then the hog goes: the deferred resize is granted
        // and applied.
        send(PodOperation::Update, sized("web", "1500m")).await;
        until("Deferred again", || {
            condition("PodResizePending")().is_some_and(|c| c.reason.as_deref() == Some("Deferred"))
        })
        .await;
        send(PodOperation::Remove, sized("hog", "1")).await;
        until("web updated to 1500m", updated(150_000)).await;
        until("nothing pending", || {
            condition("PodResizePending")().is_none()
        })
        .await;
        assert!(
            !fake.calls().iter().any(|c| c.contains("quota=300000")),
            "the infeasible size never reached the runtime"
        );
        token.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn freed_room_goes_to_deferred_resizes_in_upstreams_order() {
        // Old code: deferred resizes were retried in a hash map's order,
        // so freed room went to any of them (upstream sortPendingResizes:
        // higher priority first, then Guaranteed before Burstable).
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let (fake, token, workers, pleg) = fixture();
        let sl = sync_loop(PodManager::new(), &workers, pleg, Some(two_cpu_node()));
        let (updates_tx, task) = run_loop(sl, &token);
        let send = |op, pod| send_api(&updates_tx, op, pod);
        let alloc = workers.allocation().clone();
        let sized = |name: &str, cpu: &str, priority: i32, guaranteed: bool| {
            let mut p = api_pod(name, &format!("u-{name}"));
            let mut q = vec![("cpu".to_string(), Quantity(cpu.into()))];
            if guaranteed {
                q.push(("memory".to_string(), Quantity("64Mi".into())));
            }
            let spec = p.spec.as_mut().unwrap();
            spec.priority = Some(priority);
            spec.containers[0].resources = Some(ResourceRequirements {
                requests: Some(q.clone().into_iter().collect()),
                limits: guaranteed.then(|| q.into_iter().collect()),
                ..Default::default()
            });
            p
        };
        send(PodOperation::Add, sized("hog", "900m", 0, false)).await;
        send(PodOperation::Add, sized("a", "200m", 0, false)).await;
        send(PodOperation::Add, sized("b", "200m", 100, false)).await;
        send(PodOperation::Add, sized("c", "200m", 0, true)).await;
        until("all running", || fake.count_calls("StartContainer") == 4).await;
        send(PodOperation::Update, sized("a", "1100m", 0, false)).await;
        send(PodOperation::Update, sized("c", "1100m", 0, true)).await;
        send(PodOperation::Update, sized("b", "1000m", 100, false)).await;
        let deferred = |uid: &str| {
            alloc
                .pending(uid)
                .is_some_and(|p| p.reason == crate::allocation::DEFERRED)
        };
        until("all three deferred", || {
            ["u-a", "u-b", "u-c"].iter().all(|u| deferred(u))
        })
        .await;

        // Room for one: the higher priority's, though it waited least.
        send(PodOperation::Remove, sized("hog", "900m", 0, false)).await;
        until("b granted", || !alloc.lags("u-b")).await;
        assert!(deferred("u-a") && deferred("u-c"));

        // Room for one again: the Guaranteed pod's, though it waited less.
        send(PodOperation::Remove, sized("b", "1000m", 100, false)).await;
        until("c granted", || !alloc.lags("u-c")).await;
        assert!(deferred("u-a"));
        token.cancel();
        let _ = task.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_memory_limit_is_not_lowered_below_what_the_container_uses() {
        // Old code: the lower limit went to the runtime whatever the
        // container used (cgroup v2 OOM-kills it then). Upstream's
        // validateMemoryResizeAction refuses it, with reason Error.
        use crate::cri::RuntimeService;
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let (fake, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let sl = sync_loop(PodManager::new(), &workers, pleg, Some(one_pod_node()));
        let (updates_tx, task) = run_loop(sl, &token);
        let send = |op, pod| send_api(&updates_tx, op, pod);
        let sized = |limit: &str| {
            let mut p = api_pod("mem", "u-mem");
            let q = |v: &str| [("memory".to_string(), Quantity(v.into()))].into();
            p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
                requests: Some(q("32Mi")),
                limits: Some(q(limit)),
                ..Default::default()
            });
            p
        };
        let in_progress = || {
            status.get("u-mem").and_then(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == "PodResizeInProgress")
                    .cloned()
            })
        };
        send(PodOperation::Add, sized("128Mi")).await;
        until("running", || fake.count_calls("StartContainer") == 1).await;
        let id = fake.list_containers(None).await.unwrap()[0].id.clone();
        fake.set_container_stats(&id, 0, 100 << 20, 0);

        send(PodOperation::Update, sized("96Mi")).await;
        until("the resize refused", || {
            in_progress().is_some_and(|c| c.reason.as_deref() == Some("Error"))
        })
        .await;
        assert_eq!(
            in_progress().unwrap().message.as_deref(),
            Some(
                "cannot decrease memory limits: attempting to set container \"app\" \
                 memory limit (100663296) below current usage (104857600)"
            )
        );
        assert_eq!(fake.count_calls("UpdateContainerResources"), 0);

        // The container now uses less than the new limit: applied.
        fake.set_container_stats(&id, 0, 50 << 20, 0);
        until("applied", || {
            fake.calls().iter().any(|c| {
                c.starts_with("UpdateContainerResources app") && c.ends_with("memory=100663296")
            })
        })
        .await;
        until("the resize done", || in_progress().is_none()).await;
        token.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn a_reconciled_gate_readies_the_pod_and_a_deleted_pod_stays_listed() {
        // Old code: RECONCILE was ignored, so a readiness gate met later
        // never made the pod Ready; and a deleted pod left the pod manager
        // at once, so /pods, logs and exec lost it in its grace period.
        use k8s_openapi::api::core::v1::{
            ContainerStatus, PodCondition, PodReadinessGate, PodStatus,
        };
        let (_, token, workers, pleg) = fixture();
        let status = workers.status().clone();
        let pods = PodManager::new();
        let sl = sync_loop(pods.clone(), &workers, pleg, None);
        let (updates_tx, task) = run_loop(sl, &token);
        let send = |op, pod| send_api(&updates_tx, op, pod);
        let ready = |reason: Option<&str>, st: &str| {
            let status = status.clone();
            let reason = reason.map(String::from);
            let st = st.to_string();
            move || {
                status.get("u-gated").is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == st && c.reason == reason)
                })
            }
        };

        let mut pod = crate::testutil::named_pod("gated", "u-gated");
        pod.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
        send(PodOperation::Add, pod.clone()).await;
        until(
            "Ready False for the missing gate",
            ready(Some("ReadinessGatesNotReady"), "False"),
        )
        .await;

        // The API's copy: its controller met the gate; Ready is as the
        // kubelet last reported it.
        let mut api = pod.clone();
        let c = |t: &str, st: &str| PodCondition {
            type_: t.into(),
            status: st.into(),
            ..Default::default()
        };
        api.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![c("example.com/lb", "True"), c("Ready", "False")]),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                ready: true,
                ..Default::default()
            }]),
            ..Default::default()
        });
        send(PodOperation::Reconcile, api).await;
        until("Ready True once the gate is met", ready(None, "True")).await;
        let st = status.get("u-gated").unwrap();
        assert_eq!(
            st.conditions.as_ref().unwrap()[0].type_,
            "example.com/lb",
            "the gate's condition is kept, first"
        );

        let mut deleted = pod.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        deleted.metadata.deletion_grace_period_seconds = Some(0);
        send(PodOperation::Delete, deleted).await;
        until("the deletion handled", || !pods.contains("u-gated")).await;
        let listed = pods.listed();
        assert_eq!(listed.len(), 1, "still listed until removed");
        assert!(listed[0].metadata.deletion_timestamp.is_some());
        assert!(pods.by_name("default", "gated").is_some());
        assert!(pods.get("u-gated").is_none(), "no longer desired");

        send(PodOperation::Remove, pod).await;
        until("the removal handled", || pods.listed().is_empty()).await;
        token.cancel();
        let _ = task.await;
    }
}
