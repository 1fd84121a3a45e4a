//! Pod workers: one task per pod UID, at most one sync in flight per pod,
//! and the newest pending update replacing older ones (upstream
//! `pkg/kubelet/pod_workers.go`). Termination runs to completion before a
//! pod with the same UID may start again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use crate::kuberuntime::actions::ProbeState;
use crate::kuberuntime::{CState, RuntimeManager, RuntimePod};
use crate::prober::ProbeManager;
use crate::status::{generate_pod_status, StatusInput, StatusManager};
use crate::volume;

/// What a worker is asked to do next.
#[derive(Clone, Debug)]
pub enum Work {
    Sync(Arc<Pod>),
    /// Stop everything the pod runs and remove its containers and sandbox.
    /// `pod` is `None` for orphans found only in the runtime.
    Terminate {
        pod: Option<Arc<Pod>>,
        grace: Option<i64>,
    },
}

/// Pods due for another sync, and when (upstream's work queue, drained by
/// the syncLoop's 1 s tick).
#[derive(Default)]
pub struct WorkQueue {
    due: Mutex<HashMap<String, Instant>>,
}

impl WorkQueue {
    pub fn enqueue(&self, uid: &str, delay: Duration) {
        let at = Instant::now() + delay;
        let mut due = self.due.lock();
        let e = due.entry(uid.to_string()).or_insert(at);
        if at < *e {
            *e = at;
        }
    }

    pub fn take_due(&self, now: Instant) -> Vec<String> {
        let mut due = self.due.lock();
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for u in &ready {
            due.remove(u);
        }
        ready
    }

    pub fn forget(&self, uid: &str) {
        self.due.lock().remove(uid);
    }

    /// How long until the pod is due, if it is queued.
    pub fn due_in(&self, uid: &str) -> Option<Duration> {
        let at = *self.due.lock().get(uid)?;
        Some(at.saturating_duration_since(Instant::now()))
    }
}

pub struct Deps {
    pub runtime: Arc<RuntimeManager>,
    pub status: StatusManager,
    pub probes: ProbeManager,
    pub queue: Arc<WorkQueue>,
    /// How often a healthy pod is synced anyway (syncFrequency).
    pub resync: Duration,
    /// Why the pod network is not ready (CRI Status NetworkReady), if it
    /// is not; pods that need it are not started meanwhile.
    pub network_error: Option<NetworkCheck>,
}

pub type NetworkCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// How long removing a pod's directories may take before the worker moves
/// on (the blocking thread is left to finish or hang on its own).
const CLEANUP_DEADLINE: Duration = Duration::from_secs(30);

/// Upstream's NetworkNotReadyErrorMsg.
pub const NETWORK_NOT_READY: &str = "network is not ready";
/// Upstream retries a pod that waits for the network after 1 s
/// (backOffOnTransientErrorPeriod), not after the 10 s error backoff.
pub const NETWORK_RETRY: Duration = Duration::from_secs(1);

/// Upstream's backOffPeriod: a sync that failed is retried after 10 s
/// (jittered by up to half), not at the next 1 s tick.
pub const SYNC_ERROR_BACKOFF: Duration = Duration::from_secs(10);

/// Where a pod worker is in upstream's lifecycle (`pod_workers.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerPhase {
    /// Syncing the spec into the runtime.
    Syncing,
    /// Stopping every container within the grace period; nothing new starts.
    Terminating,
    /// All containers stopped. A pod still in config (a finished pod) stays
    /// here; one removed from config is cleaned up and forgotten.
    Terminated,
}

struct Entry {
    phase: WorkerPhase,
    /// The newest undelivered work; a burst of updates costs one sync.
    pending: Option<Work>,
    wake: Arc<Notify>,
    /// Cancels what the worker does now: a sync when the pod is killed, a
    /// termination when a shorter grace period arrives.
    inflight: CancellationToken,
    /// The effective grace period once terminating; it only ever shrinks.
    grace: Option<i64>,
    /// Killed from outside (removed from config, orphan, later API
    /// deletion): after terminating, remove everything and forget the pod.
    removed: bool,
    /// Whether the pod was allowed to start (static pods wait their turn).
    started: bool,
    /// `<name>_<namespace>` of a static pod, for upstream's start gating.
    full_name: Option<String>,
    pod: Option<Arc<Pod>>,
    /// A pod with this UID that came back while the old one terminated.
    after_termination: Option<Work>,
    /// Why the kubelet stopped the pod itself (an eviction): the status
    /// says so, whatever a sync in flight published meanwhile.
    stopped_because: Option<Arc<Stopped>>,
}

/// The terminal status a pod the kubelet stops itself gets (upstream
/// killPodNow's status function): Failed with `reason` and `message`, and,
/// with `disruption`, a DisruptionTarget condition with reason
/// TerminationByKubelet.
#[derive(Clone, Debug)]
pub struct Stopped {
    pub reason: String,
    pub message: String,
    pub disruption: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Full name → the UID of the static pod that holds it (upstream
    /// startedStaticPodsByFullname): a new UID with the same full name never
    /// starts before the old one has finished terminating.
    started_static: HashMap<String, String>,
    /// Full name → UIDs waiting to start, in arrival order.
    waiting_static: HashMap<String, Vec<String>>,
}

impl State {
    /// Lets go of a static pod's full name and wakes whoever waits for it.
    fn release_static(&mut self, uid: &str) {
        let Some(full) = self.entries.get(uid).and_then(|e| e.full_name.clone()) else {
            return;
        };
        if self.started_static.get(&full).is_some_and(|u| u == uid) {
            self.started_static.remove(&full);
        }
        if let Some(w) = self.waiting_static.get_mut(&full) {
            w.retain(|u| u != uid);
            if w.is_empty() {
                self.waiting_static.remove(&full);
            }
        }
        for u in self.waiting_static.get(&full).into_iter().flatten() {
            if let Some(e) = self.entries.get(u) {
                e.wake.notify_one();
            }
        }
    }

    /// Upstream allowStaticPodStart: the pod may start when no other UID
    /// holds its full name and it is the first live one waiting for it.
    fn allow_start(&mut self, uid: &str) -> bool {
        let Some(e) = self.entries.get(uid) else {
            return false;
        };
        if e.started {
            return true;
        }
        let Some(full) = e.full_name.clone() else {
            if let Some(e) = self.entries.get_mut(uid) {
                e.started = true;
            }
            return true;
        };
        if let Some(holder) = self.started_static.get(&full) {
            return holder == uid;
        }
        let entries = &self.entries;
        let live = |u: &String| {
            entries
                .get(u)
                .is_some_and(|e| e.phase == WorkerPhase::Syncing && !e.removed)
        };
        let waiting = self.waiting_static.entry(full.clone()).or_default();
        waiting.retain(live);
        if waiting.first().is_some_and(|u| u != uid) {
            return false;
        }
        waiting.retain(|u| u != uid);
        if waiting.is_empty() {
            self.waiting_static.remove(&full);
        }
        self.started_static.insert(full, uid.to_string());
        if let Some(e) = self.entries.get_mut(uid) {
            e.started = true;
        }
        true
    }
}

/// Upstream calculateEffectiveGracePeriod: the API server's
/// deletionGracePeriodSeconds and a kill's override can only shorten the
/// grace period already in force; with neither, the pod's own
/// terminationGracePeriodSeconds; never below 1 s. `None` for an orphan
/// with no override (its containers' annotations decide).
pub fn effective_grace(current: Option<i64>, pod: Option<&Pod>, over: Option<i64>) -> Option<i64> {
    let mut g = current;
    let mut overridden = false;
    let deletion = pod.and_then(|p| p.metadata.deletion_grace_period_seconds);
    for o in [deletion, over].into_iter().flatten() {
        if g.is_none_or(|g| o < g) {
            g = Some(o);
            overridden = true;
        }
    }
    if !overridden && g.is_none() {
        g = pod.map(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(crate::kuberuntime::DEFAULT_GRACE_SECONDS)
        });
    }
    g.map(|g| g.max(1))
}

/// A static pod (from a file or URL, not the API server), as upstream's
/// IsStaticPod decides it: by the config source annotation.
pub fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::source::CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s != crate::source::API_SOURCE)
}

fn full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default")
    )
}

/// `d` plus up to half of it again (upstream wait.Jitter(d, 0.5)), so pods
/// that failed together do not retry in lockstep.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    d + d.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// What one sync decided.
struct SyncOutcome {
    requeue: Duration,
    /// The pod reached a terminal phase: move on to terminating.
    terminal: bool,
}

/// How a cancellable step of the worker ended.
enum Step<T> {
    Done(T),
    /// Cancelled by a kill or a shortened grace period; new work is pending.
    Cancelled,
    Panicked(String),
    /// rkubelet is shutting down: leave the pod as it is.
    Shutdown,
}

/// The resizable containers' names and resources, as upstream's
/// ResizeCompleted message shows them (JSON, init containers first).
fn resized_resources(pod: &Pod) -> String {
    let (mut inits, mut apps) = (Vec::new(), Vec::new());
    for c in crate::allocation::resizable(pod) {
        let entry = serde_json::json!({"name": c.name, "resources": c.resources.clone().unwrap_or_default()});
        if crate::kuberuntime::actions::is_sidecar(c) {
            inits.push(entry);
        } else {
            apps.push(entry);
        }
    }
    let mut out = serde_json::Map::new();
    if !inits.is_empty() {
        out.insert("initContainers".into(), inits.into());
    }
    out.insert("containers".into(), apps.into());
    serde_json::Value::Object(out).to_string()
}

#[derive(Clone)]
pub struct PodWorkers {
    deps: Arc<Deps>,
    state: Arc<Mutex<State>>,
    token: CancellationToken,
    /// Every worker and step task, awaited at shutdown.
    tasks: tokio_util::task::TaskTracker,
}

impl PodWorkers {
    pub fn new(deps: Deps, token: CancellationToken) -> Self {
        PodWorkers {
            deps: Arc::new(deps),
            state: Default::default(),
            token,
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// After the token is cancelled: waits (at most `timeout`) for every
    /// worker to return. Running pods are left running, as upstream.
    pub async fn wait_stopped(&self, timeout: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(timeout, self.tasks.wait())
            .await
            .is_ok()
    }

    /// Hands work to the pod's worker, starting one if needed (upstream
    /// UpdatePod). A kill cancels the sync in flight; a kill with a shorter
    /// grace period restarts the termination in flight with it.
    pub fn update(&self, uid: &str, work: Work) {
        // A pod runs on what it was granted, which an in-place resize that
        // waits for room leaves behind its spec.
        let work = match work {
            Work::Sync(pod) => Work::Sync(self.deps.runtime.allocation.granted(pod)),
            w => w,
        };
        let mut st = self.state.lock();
        let Some(e) = st.entries.get_mut(uid) else {
            self.spawn_worker(&mut st, uid, work);
            return;
        };
        match work {
            Work::Sync(pod) => {
                if e.removed {
                    // Same UID back after a kill: waits for the old run to end.
                    if e.after_termination.is_none() {
                        crate::metrics::restarted_pod(is_static(&pod));
                    }
                    e.after_termination = Some(Work::Sync(pod));
                } else if e.phase == WorkerPhase::Syncing {
                    e.pod = Some(pod.clone());
                    e.pending = Some(Work::Sync(pod));
                    e.wake.notify_one();
                }
                // A finished pod is not synced again.
            }
            Work::Terminate { pod, grace } => {
                let pod = pod.or_else(|| e.pod.clone());
                let was_removed = std::mem::replace(&mut e.removed, true);
                e.after_termination = None;
                let new = effective_grace(e.grace, pod.as_deref(), grace);
                let shortened = matches!((e.grace, new), (Some(old), Some(new)) if new < old);
                let restart = match e.phase {
                    WorkerPhase::Syncing => true,
                    WorkerPhase::Terminating => shortened,
                    WorkerPhase::Terminated => !was_removed,
                };
                if e.phase == WorkerPhase::Syncing {
                    e.phase = WorkerPhase::Terminating;
                }
                e.grace = new;
                if restart {
                    debug!(pod_uid = uid, grace = ?new, phase = ?e.phase, "pod worker told to terminate");
                    e.pending = Some(Work::Terminate { pod, grace: new });
                    e.inflight.cancel();
                    e.wake.notify_one();
                }
            }
        }
    }

    fn spawn_worker(&self, st: &mut State, uid: &str, work: Work) {
        let (phase, removed, pod, grace) = match &work {
            Work::Sync(p) => (WorkerPhase::Syncing, false, Some(p.clone()), None),
            Work::Terminate { pod, grace } => (
                WorkerPhase::Terminating,
                true,
                pod.clone(),
                effective_grace(None, pod.as_deref(), *grace),
            ),
        };
        let work = match work {
            Work::Terminate { pod, .. } => Work::Terminate { pod, grace },
            w => w,
        };
        let full = pod.as_deref().filter(|p| is_static(p)).map(full_name);
        if let (Some(f), WorkerPhase::Syncing) = (&full, phase) {
            st.waiting_static
                .entry(f.clone())
                .or_default()
                .push(uid.to_string());
        }
        if phase == WorkerPhase::Syncing {
            crate::metrics::pod_worker_started(pod.as_deref());
        }
        let wake = Arc::new(Notify::new());
        wake.notify_one();
        st.entries.insert(
            uid.to_string(),
            Entry {
                phase,
                pending: Some(work),
                wake: wake.clone(),
                inflight: CancellationToken::new(),
                grace,
                removed,
                started: false,
                full_name: full,
                pod,
                after_termination: None,
                stopped_because: None,
            },
        );
        let this = self.clone();
        let uid = uid.to_string();
        let span = tracing::info_span!("pod_worker", pod_uid = %uid);
        self.tasks
            .spawn(async move { this.run(uid, wake).await }.instrument(span));
    }

    /// Stops a running pod that stays in config (upstream killPodNow, for
    /// the eviction manager): the sync in flight is cancelled, the pod is
    /// stopped within `grace` seconds, and its status is Failed as `why`
    /// says. False when the pod is not running (unknown, or already
    /// stopping or stopped).
    pub fn stop_now(&self, uid: &str, grace: i64, why: Stopped) -> bool {
        let why = Arc::new(why);
        {
            let mut st = self.state.lock();
            let Some(e) = st.entries.get_mut(uid) else {
                return false;
            };
            if e.phase != WorkerPhase::Syncing || e.removed {
                return false;
            }
            let pod = e.pod.clone();
            e.phase = WorkerPhase::Terminating;
            e.grace = effective_grace(None, pod.as_deref(), Some(grace));
            e.stopped_because = Some(why.clone());
            e.pending = Some(Work::Terminate {
                pod,
                grace: e.grace,
            });
            e.inflight.cancel();
            e.wake.notify_one();
        }
        self.mark_stopped(uid, &why);
        true
    }

    /// Puts a kubelet-stopped pod's reason into its status.
    fn mark_stopped(&self, uid: &str, why: &Stopped) {
        let Some(old) = self.deps.status.get(uid) else {
            return;
        };
        let mut st = (*old).clone();
        st.phase = Some("Failed".into());
        st.reason = Some(why.reason.clone());
        st.message = Some(why.message.clone());
        if !why.disruption {
            self.deps.status.set(uid, st);
            return;
        }
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_nanosecond(crate::kuberuntime::wall_now().as_nanos() as i128)
                .unwrap_or(Timestamp::UNIX_EPOCH),
        );
        let generation = self
            .state
            .lock()
            .entries
            .get(uid)
            .and_then(|e| e.pod.as_ref()?.metadata.generation)
            .filter(|_| self.deps.runtime.opts.track_observed_generation);
        let conditions = st.conditions.get_or_insert_with(Vec::new);
        let c = k8s_openapi::api::core::v1::PodCondition {
            observed_generation: generation,
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(why.message.clone()),
            last_transition_time: Some(now),
            ..Default::default()
        };
        match conditions
            .iter_mut()
            .find(|c| c.type_ == "DisruptionTarget")
        {
            // Upstream UpdatePodCondition keeps the transition time when the
            // status does not change.
            Some(old) if old.status == c.status => {
                old.reason = c.reason;
                old.message = c.message;
                old.observed_generation = c.observed_generation;
            }
            Some(old) => *old = c,
            None => conditions.push(c),
        }
        self.deps.status.set(uid, st);
    }

    /// Each worker's UID, phase, whether it has a pod spec and whether that
    /// is a static pod (for `kubelet_working_pods`).
    pub fn working(&self) -> Vec<(String, WorkerPhase, bool, bool)> {
        let st = self.state.lock();
        st.entries
            .iter()
            .map(|(uid, e)| {
                let is_st = e.pod.as_deref().is_some_and(is_static);
                (uid.clone(), e.phase, e.pod.is_some(), is_st)
            })
            .collect()
    }

    /// What each pod was granted (the runtime manager's).
    pub fn allocation(&self) -> &crate::allocation::AllocationManager {
        &self.deps.runtime.allocation
    }

    pub fn is_known(&self, uid: &str) -> bool {
        self.state.lock().entries.contains_key(uid)
    }

    /// Whether the pod's containers could still be running: its worker
    /// syncs or stops it (upstream CouldHaveRunningContainers).
    pub fn could_have_running(&self, uid: &str) -> bool {
        matches!(
            self.phase(uid),
            Some(WorkerPhase::Syncing | WorkerPhase::Terminating)
        )
    }

    /// Whether the pod was evicted and its worker has stopped everything:
    /// its content may go though it stays in config (upstream
    /// ShouldPodContentBeRemoved counts an evicted pod's).
    pub fn is_evicted_and_terminated(&self, uid: &str) -> bool {
        self.state.lock().entries.get(uid).is_some_and(|e| {
            e.phase == WorkerPhase::Terminated
                && e.stopped_because
                    .as_ref()
                    .is_some_and(|s| s.reason == crate::eviction::REASON)
        })
    }

    pub fn is_terminating(&self, uid: &str) -> bool {
        self.phase(uid).is_some_and(|p| p != WorkerPhase::Syncing)
    }

    pub fn phase(&self, uid: &str) -> Option<WorkerPhase> {
        self.state.lock().entries.get(uid).map(|e| e.phase)
    }

    /// Runs `fut` as its own task, so a panic in it is caught and a kill can
    /// abort it at any await point (an image pull, a hook, a volume wait).
    async fn step<T: Send + 'static>(
        &self,
        cancel: &CancellationToken,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Step<T> {
        let mut task = self.tasks.spawn(fut.in_current_span());
        let r = tokio::select! {
            r = &mut task => r,
            _ = cancel.cancelled() => {
                task.abort();
                let _ = task.await;
                return Step::Cancelled;
            }
            _ = self.token.cancelled() => {
                task.abort();
                let _ = task.await;
                return Step::Shutdown;
            }
        };
        match r {
            Ok(v) => Step::Done(v),
            Err(e) if e.is_panic() => {
                let p = e.into_panic();
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Step::Panicked(msg)
            }
            Err(_) => Step::Cancelled,
        }
    }

    /// Takes the pending work, arming a fresh cancellation token for it.
    fn take_work(&self, uid: &str) -> Option<Option<(Work, CancellationToken)>> {
        let mut st = self.state.lock();
        let e = st.entries.get_mut(uid)?;
        Some(e.pending.take().map(|w| {
            e.inflight = CancellationToken::new();
            (w, e.inflight.clone())
        }))
    }

    /// Puts work back unless something newer arrived meanwhile.
    fn put_back(&self, uid: &str, work: Work) {
        if let Some(e) = self.state.lock().entries.get_mut(uid) {
            if e.pending.is_none() {
                e.pending = Some(work);
            }
        }
    }

    async fn run(self, uid: String, wake: Arc<Notify>) {
        // Why containers waited at the last sync, carried to the next one.
        let mut waiting = HashMap::new();
        let mut terminate_retry = Duration::from_millis(500);
        let mut first_sync = true;
        loop {
            tokio::select! {
                _ = self.token.cancelled() => return,
                _ = wake.notified() => {}
            }
            // Drain everything pending before waiting again.
            while let Some(next) = self.take_work(&uid) {
                let Some((work, cancel)) = next else { break };
                match work {
                    Work::Sync(pod) => {
                        if self.must_wait_for_leftover(&uid, &pod).await {
                            debug!(
                                pod = pod.metadata.name.as_deref().unwrap_or_default(),
                                "static pod waits for a previous instance still in the runtime"
                            );
                            self.put_back(&uid, Work::Sync(pod));
                            self.deps.queue.enqueue(&uid, Duration::from_secs(1));
                            break;
                        }
                        if !self.state.lock().allow_start(&uid) {
                            debug!(pod = pod.metadata.name.as_deref().unwrap_or_default(), "static pod waits for the previous pod with its full name to terminate");
                            self.put_back(&uid, Work::Sync(pod));
                            break;
                        }
                        let this = self.clone();
                        let (u, p, mut w) =
                            (uid.clone(), pod.clone(), std::mem::take(&mut waiting));
                        let fut = async move {
                            let o = this.sync(&u, &p, &mut w).await;
                            (o, w)
                        };
                        let sync_start = tokio::time::Instant::now();
                        match self.step(&cancel, fut).await {
                            Step::Done((o, w)) => {
                                // Upstream's SyncPodType: the first sync creates.
                                let op = if std::mem::take(&mut first_sync) {
                                    "create"
                                } else {
                                    "sync"
                                };
                                crate::metrics::pod_worker_duration(op, sync_start.elapsed());
                                waiting = w;
                                self.deps.queue.enqueue(&uid, o.requeue);
                                if o.terminal {
                                    self.begin_natural_termination(&uid, pod);
                                }
                            }
                            Step::Cancelled => {}
                            Step::Panicked(msg) => {
                                error!(panic = %msg, "pod sync panicked; retrying after backoff");
                                self.deps.queue.enqueue(&uid, jitter(SYNC_ERROR_BACKOFF));
                            }
                            Step::Shutdown => return,
                        }
                    }
                    Work::Terminate { pod, grace } => {
                        let this = self.clone();
                        let (u, p) = (uid.clone(), pod.clone());
                        let fut = async move { this.kill(&u, p.as_deref(), grace).await };
                        let failed = match self.step(&cancel, fut).await {
                            Step::Done(Ok(())) => None,
                            Step::Done(Err(e)) => Some(e.to_string()),
                            Step::Panicked(msg) => Some(format!("panic: {msg}")),
                            // A shorter grace period: the new termination is pending.
                            Step::Cancelled => continue,
                            Step::Shutdown => return,
                        };
                        if let Some(err) = failed {
                            warn!(error = %err, retry_in = ?terminate_retry, "failed to terminate pod");
                            self.put_back(&uid, Work::Terminate { pod, grace });
                            tokio::select! {
                                _ = self.token.cancelled() => return,
                                _ = tokio::time::sleep(terminate_retry) => {}
                            }
                            terminate_retry = (terminate_retry * 2).min(Duration::from_secs(30));
                            continue;
                        }
                        terminate_retry = Duration::from_millis(500);
                        if self.terminated(&uid, pod.as_deref()).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Before a static pod first starts: is an instance with the same full
    /// name but another UID still live in the runtime? After a restart of
    /// rkubelet that instance is an orphan no worker knows yet (housekeeping
    /// will stop it); starting beside it would run two copies at once.
    async fn must_wait_for_leftover(&self, uid: &str, pod: &Pod) -> bool {
        {
            let st = self.state.lock();
            match st.entries.get(uid) {
                Some(e) if !e.started && e.full_name.is_some() => {}
                _ => return false,
            }
        }
        use crate::kuberuntime::labels;
        let selector = HashMap::from([
            (
                labels::POD_NAME.to_string(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                labels::POD_NAMESPACE.to_string(),
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
        ]);
        let other = |l: &HashMap<String, String>| l.get(labels::POD_UID).is_some_and(|u| u != uid);
        // A live instance has a ready sandbox (killing stops it last): one
        // filtered list call, answered by the runtime.
        let ready = crate::cri::v1::PodSandboxStateValue {
            state: crate::cri::v1::PodSandboxState::SandboxReady as i32,
        };
        match self
            .deps
            .runtime
            .runtime
            .list_pod_sandbox(Some(crate::cri::PodSandboxFilter {
                label_selector: selector,
                state: Some(ready),
                ..Default::default()
            }))
            .await
        {
            Ok(s) => s.iter().any(|s| {
                other(&s.labels) && s.state == crate::cri::v1::PodSandboxState::SandboxReady as i32
            }),
            // The sync itself will meet and report the runtime error.
            Err(_) => false,
        }
    }

    /// The pod reached Succeeded or Failed on its own (upstream completeSync):
    /// stop what is left (sidecars, the sandbox) but keep the pod.
    fn begin_natural_termination(&self, uid: &str, pod: Arc<Pod>) {
        let mut st = self.state.lock();
        let Some(e) = st.entries.get_mut(uid) else {
            return;
        };
        if e.phase != WorkerPhase::Syncing {
            return;
        }
        info!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "pod is terminal; terminating it"
        );
        e.phase = WorkerPhase::Terminating;
        e.grace = effective_grace(None, Some(&pod), None);
        if !matches!(e.pending, Some(Work::Terminate { .. })) {
            e.pending = Some(Work::Terminate {
                pod: Some(pod),
                grace: e.grace,
            });
        }
    }

    /// Terminating: stops every container within the grace period (preStop
    /// hooks first), then the sandbox.
    async fn kill(
        &self,
        uid: &str,
        pod: Option<&Pod>,
        grace: Option<i64>,
    ) -> Result<(), crate::kuberuntime::RuntimeError> {
        // Nothing may restart a container of a terminating pod.
        self.deps.probes.remove_pod(uid);
        let rm = &self.deps.runtime;
        let rt = rm.pod_status(uid).await?;
        rm.kill_pod(pod, &rt, grace).await?;
        // A removed pod's status is dropped once it is gone: only a pod that
        // stays in config (finished), or one deleted in the API (whose last
        // status is sent before the object is deleted), needs the post-kill
        // status.
        let stays = self
            .state
            .lock()
            .entries
            .get(uid)
            .is_some_and(|e| !e.removed);
        if let Some(pod) = pod.filter(|p| stays || p.metadata.deletion_timestamp.is_some()) {
            // Upstream: the status after the kill is generated as terminal.
            let rt = rm.pod_status(uid).await?;
            let probes = self.probe_state(uid, pod, &rt);
            self.publish_status(uid, pod, &rt, &HashMap::new(), &probes, true);
        }
        let why = self
            .state
            .lock()
            .entries
            .get(uid)
            .and_then(|e| e.stopped_because.clone());
        if let Some(why) = why {
            self.mark_stopped(uid, &why);
        }
        Ok(())
    }

    /// Terminated: a pod still in config keeps its status and containers
    /// (for logs) and gives up its static full name; a removed pod has its
    /// containers, sandboxes, directories and caches removed and is
    /// forgotten. Returns true when the worker is done.
    async fn terminated(&self, uid: &str, pod: Option<&Pod>) -> bool {
        let removed = {
            let mut st = self.state.lock();
            let Some(e) = st.entries.get_mut(uid) else {
                return true;
            };
            e.phase = WorkerPhase::Terminated;
            // A terminal phase the API sync held back while containers
            // could run can be sent now.
            self.deps.status.touch();
            let removed = e.removed;
            // A removed static pod gives up its full name only once its
            // sandbox is gone too (below), so its successor never overlaps
            // it in any way.
            if !removed {
                st.release_static(uid);
            }
            removed
        };
        if !removed {
            // Upstream SyncTerminatedPod: a finished pod's volumes are torn
            // down though the pod stays (its memory-backed volumes would
            // otherwise hold memory, and keep its cgroup, until it is
            // deleted); housekeeping then removes its cgroup.
            self.unmount_volumes(uid).await;
            info!(
                pod = pod
                    .and_then(|p| p.metadata.name.as_deref())
                    .unwrap_or_default(),
                "pod terminated; kept until it is removed from config"
            );
            return false;
        }
        let rm = &self.deps.runtime;
        let mut delay = Duration::from_millis(500);
        loop {
            let r = async {
                let rt = rm.pod_status(uid).await?;
                rm.remove_pod(&rt).await
            }
            .await;
            match r {
                Ok(()) => break,
                Err(e) => {
                    warn!(error = %e, retry_in = ?delay, "failed to remove pod's containers");
                    tokio::select! {
                        _ = self.token.cancelled() => return true,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
        self.state.lock().release_static(uid);
        self.cleanup_dirs(uid, pod).await;
        // Probes went when terminating began (kill).
        self.deps.status.remove(uid);
        self.deps.queue.forget(uid);
        info!(
            pod = pod
                .and_then(|p| p.metadata.name.as_deref())
                .unwrap_or("<orphan>"),
            "pod terminated and removed"
        );
        self.finish(uid);
        true
    }

    /// One sync: read the runtime, act, publish the status. Says when the
    /// pod should be synced again and whether it reached a terminal phase.
    async fn sync(
        &self,
        uid: &str,
        pod: &Pod,
        waiting: &mut HashMap<String, crate::kuberuntime::Waiting>,
    ) -> SyncOutcome {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let rm = &self.deps.runtime;
        let rt = match rm.pod_status(uid).await {
            Ok(rt) => rt,
            Err(e) => {
                warn!(pod = name, error = %e, "unable to read pod status from the runtime");
                return SyncOutcome {
                    requeue: jitter(SYNC_ERROR_BACKOFF),
                    terminal: false,
                };
            }
        };
        let probes = self.probe_state(uid, pod, &rt);
        if self.deadline_left(uid, pod).is_some_and(|l| l.is_zero()) {
            // Upstream: Failed with DeadlineExceeded; terminating kills it.
            info!(
                pod = name,
                "pod was active on the node longer than the specified deadline"
            );
            self.publish_status(uid, pod, &rt, waiting, &probes, false);
            if let Some(st) = self.deps.status.get(uid) {
                let mut st = (*st).clone();
                st.phase = Some("Failed".into());
                st.reason = Some("DeadlineExceeded".into());
                st.message =
                    Some("Pod was active on the node longer than the specified deadline".into());
                self.deps.status.set(uid, st);
            }
            return SyncOutcome {
                requeue: self.deps.resync,
                terminal: true,
            };
        }
        // Publish what the runtime shows now (a container that just died),
        // before this sync spends time restarting it. The last sync's waiting
        // reasons apply only to containers that are still not running.
        self.publish_status(uid, pod, &rt, waiting, &probes, false);
        if self.is_terminal(uid) {
            return SyncOutcome {
                requeue: self.deps.resync,
                terminal: true,
            };
        }
        if let Some(err) = self.network_not_ready(pod) {
            // Upstream SyncPod: only hostNetwork pods start without the pod
            // network; the others wait, and their status says why.
            let msg = format!("{NETWORK_NOT_READY}: {err}");
            warn!(pod = name, "{msg}");
            crate::events::pod(
                pod,
                None,
                crate::events::WARNING,
                "NetworkNotReady",
                msg.clone(),
            );
            let not_running: HashMap<_, _> = pod
                .spec
                .iter()
                .flat_map(|s| {
                    s.init_containers
                        .iter()
                        .flatten()
                        .chain(s.containers.iter())
                })
                .filter(|c| {
                    rt.latest(&c.name)
                        .is_none_or(|l| l.state != CState::Running)
                })
                .map(|c| {
                    let w = crate::kuberuntime::Waiting {
                        reason: "ContainerCreating".into(),
                        message: msg.clone(),
                    };
                    (c.name.clone(), w)
                })
                .collect();
            self.publish_status(uid, pod, &rt, &not_running, &probes, false);
            *waiting = not_running;
            return SyncOutcome {
                requeue: jitter(NETWORK_RETRY),
                terminal: false,
            };
        }
        let mut result = rm.sync_pod(pod, &rt, &probes).await;
        if let Some(left) = self.deadline_left(uid, pod) {
            // Come back when the deadline passes (upstream activeDeadlineHandler).
            result.requeue_after = Some(result.requeue_after.map_or(left, |d| d.min(left)));
        }
        for e in &result.errors {
            warn!(pod = name, error = %e, "error syncing pod");
        }
        if !result.errors.is_empty() {
            // A failed sync is retried after upstream's backOffPeriod.
            let backoff = jitter(SYNC_ERROR_BACKOFF);
            result.requeue_after = Some(result.requeue_after.map_or(backoff, |d| d.max(backoff)));
        }
        // Re-read so the status shows what this sync just started.
        let rt = if result.changed {
            rm.pod_status(uid).await.unwrap_or(rt)
        } else {
            rt
        };
        let pod_ip = rt
            .ips()
            .into_iter()
            .next()
            .unwrap_or_else(|| self.deps.runtime.opts.node_ip.clone());
        self.deps.probes.sync_pod(pod, &rt, &pod_ip);
        let probes = self.probe_state(uid, pod, &rt);
        self.publish_status(uid, pod, &rt, &result.waiting, &probes, false);
        *waiting = result.waiting;
        SyncOutcome {
            requeue: result
                .requeue_after
                .unwrap_or(self.deps.resync)
                .min(self.deps.resync),
            terminal: self.is_terminal(uid),
        }
    }

    fn network_not_ready(&self, pod: &Pod) -> Option<String> {
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if host_network {
            return None;
        }
        self.deps.network_error.as_ref().and_then(|f| f())
    }

    fn is_terminal(&self, uid: &str) -> bool {
        self.deps
            .status
            .get(uid)
            .is_some_and(|s| crate::status::generate::is_terminal(s.phase.as_deref()))
    }

    /// Time left before activeDeadlineSeconds, counted from the pod's
    /// startTime; `None` when the pod sets no deadline or has not started.
    fn deadline_left(&self, uid: &str, pod: &Pod) -> Option<Duration> {
        let secs = pod.spec.as_ref()?.active_deadline_seconds?;
        let start = self.deps.status.get(uid)?.start_time.clone()?;
        let start_ns = start.0.as_nanosecond();
        let now_ns = crate::kuberuntime::wall_now().as_nanos() as i128;
        let end_ns = start_ns + i128::from(secs.max(0)) * 1_000_000_000;
        Some(Duration::from_nanos((end_ns - now_ns).max(0) as u64))
    }

    /// What the probes say about the pod's current container instances.
    fn probe_state(&self, uid: &str, pod: &Pod, rt: &RuntimePod) -> ProbeState {
        let failed_ids = self.deps.probes.failed_container_ids(uid);
        let failed = rt
            .containers
            .iter()
            .filter(|c| c.state == CState::Running && failed_ids.contains(&c.id))
            .map(|c| c.name.clone())
            .collect();
        let not_started = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .filter(|c| c.startup_probe.is_some() && !self.deps.probes.started(uid, &c.name))
            .map(|c| c.name.clone())
            .collect();
        ProbeState {
            failed,
            not_started,
        }
    }

    /// Where the pod's in-place resize stands. A granted resize that the
    /// runtime shows applied, without error, is done: upstream's
    /// ResizeCompleted event says so, with the resources now in place.
    fn resize_status(
        &self,
        uid: &str,
        pod: &Pod,
        rt: &RuntimePod,
        pod_is_terminal: bool,
    ) -> crate::status::generate::ResizeStatus {
        let alloc = &self.deps.runtime.allocation;
        if pod_is_terminal {
            alloc.remove_progress(uid);
            return Default::default();
        }
        let error = self.deps.runtime.resize_error(uid);
        let differs = crate::allocation::resizable(pod).any(|c| {
            rt.latest(&c.name)
                .filter(|l| l.state == CState::Running)
                .is_some_and(|l| {
                    let (cpu, memory) = crate::kuberuntime::actions::resize_changes(c, l);
                    cpu || memory
                })
        });
        if !differs && error.is_none() && alloc.done(uid, pod) {
            crate::events::pod(
                pod,
                None,
                crate::events::NORMAL,
                "ResizeCompleted",
                format!("Pod resize completed: {}", resized_resources(pod)),
            );
        }
        crate::status::generate::ResizeStatus {
            pending: alloc.pending(uid),
            in_progress: alloc.in_progress(uid) || differs,
            error,
        }
    }

    fn publish_status(
        &self,
        uid: &str,
        pod: &Pod,
        rt: &RuntimePod,
        waiting: &HashMap<String, crate::kuberuntime::Waiting>,
        probes: &ProbeState,
        pod_is_terminal: bool,
    ) {
        let previous = self.deps.status.get(uid);
        let resize = self.resize_status(uid, pod, rt, pod_is_terminal);
        let status = generate_pod_status(&StatusInput {
            pod,
            rt,
            waiting,
            readiness: &self.deps.probes.readiness(uid),
            not_started: &probes.not_started,
            host_ip: &self.deps.runtime.opts.node_ip,
            previous: previous.as_deref(),
            now: Timestamp::from_nanosecond(crate::kuberuntime::wall_now().as_nanos() as i128)
                .unwrap_or(Timestamp::UNIX_EPOCH),
            pod_is_terminal,
            track_generation: self.deps.runtime.opts.track_observed_generation,
            resize,
        });
        crate::metrics::pod_phase_changed(
            pod,
            previous.as_ref().and_then(|p| p.phase.as_deref()),
            status.phase.as_deref(),
        );
        self.deps.status.set(uid, status);
    }

    /// Tears the pod's volumes down, waiting up to `CLEANUP_DEADLINE`.
    async fn unmount_volumes(&self, uid: &str) {
        let volumes = &self.deps.runtime.volumes;
        if let Err(e) = volumes.unmount_pod(uid, CLEANUP_DEADLINE).await {
            warn!(pod_uid = uid, error = %e, "volumes not torn down in time");
        }
    }

    /// Removes the pod's directory (subPath binds unmounted first) and its
    /// log directory, on a blocking thread with a deadline: a hung file
    /// system stalls this pod's cleanup, never the async threads.
    async fn cleanup_dirs(&self, uid: &str, pod: Option<&Pod>) {
        // Volumes first (upstream: the pod is not gone until they are
        // unmounted); what is left mounted is unmounted with the directory.
        self.unmount_volumes(uid).await;
        let opts = &self.deps.runtime.opts;
        let root = opts.root_dir.clone();
        let logs = pod.map(|p| crate::kuberuntime::sandbox::pod_log_dir(opts, p));
        let u = uid.to_string();
        let r = crate::blocking::try_run(
            format!("cleanup of pod {uid}"),
            CLEANUP_DEADLINE,
            move || {
                volume::cleanup_pod_dir(&root, &u)?;
                match logs {
                    Some(dir) => volume::subpath::remove_tree(std::path::Path::new(&dir)),
                    None => Ok(()),
                }
            },
        )
        .await;
        if let Err(e) = r {
            warn!(error = %e, "failed to remove pod directories; leaving them");
        }
    }

    fn finish(&self, uid: &str) {
        let mut st = self.state.lock();
        st.release_static(uid);
        if let Some(e) = st.entries.remove(uid) {
            if let Some(next) = e.after_termination {
                debug!(pod_uid = uid, "starting pod again after termination");
                self.spawn_worker(&mut st, uid, next);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::cri::fake::FakeRuntime;

    /// Pod workers over the fake runtime, in a temporary root.
    pub fn workers(fake: &Arc<FakeRuntime>, token: &CancellationToken) -> PodWorkers {
        let rm = crate::testutil::runtime_manager(fake);
        let (tx, _rx) = tokio::sync::mpsc::channel(10);
        let deps = Deps {
            runtime: rm,
            status: StatusManager::new(),
            probes: ProbeManager::new(fake.clone(), tx, token.child_token()),
            queue: Arc::new(WorkQueue::default()),
            resync: Duration::from_secs(60),
            network_error: None,
        };
        PodWorkers::new(deps, token.child_token())
    }

    /// Like `workers`, with the pod network's readiness in the test's hands.
    pub fn workers_with_network(
        fake: &Arc<FakeRuntime>,
        token: &CancellationToken,
        network: NetworkCheck,
    ) -> PodWorkers {
        let mut w = workers(fake, token);
        Arc::get_mut(&mut w.deps).unwrap().network_error = Some(network);
        w
    }

    impl PodWorkers {
        pub fn runtime(&self) -> &Arc<RuntimeManager> {
            &self.deps.runtime
        }

        pub fn status(&self) -> &StatusManager {
            &self.deps.status
        }

        /// The queue the workers put pods back on (the syncLoop's tick
        /// takes them off it).
        pub fn queue(&self) -> &Arc<WorkQueue> {
            &self.deps.queue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;

    fn workers(fake: &Arc<FakeRuntime>, token: &CancellationToken) -> PodWorkers {
        testing::workers(fake, token)
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_pod_coming_back_waits_for_its_termination_to_finish() {
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let mut pod = crate::testutil::pod("Always", &[], &["app"]);
        pod.metadata.name = Some("p".into());
        pod.metadata.uid = Some("u1".into());
        let pod = Arc::new(pod);

        w.update("u1", Work::Sync(pod.clone()));
        until("the app to start", || {
            fake.calls().contains(&"StartContainer app".to_string())
        })
        .await;
        w.update(
            "u1",
            Work::Terminate {
                pod: Some(pod.clone()),
                grace: Some(2),
            },
        );
        // Arrives while terminating: must not start until removal is done.
        w.update("u1", Work::Sync(pod.clone()));
        until("the pod to start again", || {
            fake.count_calls("RunPodSandbox") == 2
        })
        .await;
        let calls = fake.calls();
        let removed = calls
            .iter()
            .position(|c| c.starts_with("RemovePodSandbox"))
            .expect("sandbox removed");
        let second = calls
            .iter()
            .rposition(|c| c.starts_with("RunPodSandbox"))
            .unwrap();
        assert!(
            removed < second,
            "started again before termination finished: {calls:?}"
        );
        until("the new instance to run", || {
            w.deps
                .status
                .get("u1")
                .is_some_and(|s| s.phase.as_deref() == Some("Running"))
        })
        .await;
        token.cancel();
    }

    fn named(name: &str, uid: &str, image: &str, apps: &[&str]) -> Arc<Pod> {
        let mut pod = crate::testutil::pod("Always", &[], apps);
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some(uid.into());
        for c in &mut pod.spec.as_mut().unwrap().containers {
            c.image = Some(image.into());
        }
        Arc::new(pod)
    }

    fn static_pod(name: &str, uid: &str, apps: &[&str]) -> Arc<Pod> {
        let mut pod = (*named(name, uid, "busybox:1.36", apps)).clone();
        pod.metadata.annotations = Some(
            [(
                crate::source::CONFIG_SOURCE_ANNOTATION.to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        Arc::new(pod)
    }

    fn kill(pod: &Arc<Pod>, grace: Option<i64>) -> Work {
        Work::Terminate {
            pod: Some(pod.clone()),
            grace,
        }
    }

    fn has(fake: &FakeRuntime, call: &str) -> bool {
        fake.calls().iter().any(|c| c.starts_with(call))
    }

    #[tokio::test]
    async fn a_kill_cancels_an_image_pull_in_flight() {
        // Old code: the termination waited behind the pull, forever here.
        let fake = Arc::new(FakeRuntime::new());
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let pod = named("slow", "u-hang", "registry.example/hang:1", &["app"]);
        w.update("u-hang", Work::Sync(pod.clone()));
        until("the pull to start", || {
            has(&fake, "PullImage registry.example/hang:1")
        })
        .await;
        w.update("u-hang", kill(&pod, Some(2)));
        until("the pod to be removed", || {
            has(&fake, "RemovePodSandbox") && !w.is_known("u-hang")
        })
        .await;
        token.cancel();
    }

    #[tokio::test]
    async fn shutdown_waits_for_every_worker_and_step_even_mid_pull() {
        // Old code: workers were detached tasks nobody awaited at shutdown.
        let fake = Arc::new(FakeRuntime::new());
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let pod = named("slow", "u-stop", "registry.example/hang:1", &["app"]);
        w.update("u-stop", Work::Sync(pod));
        until("the pull to start", || {
            has(&fake, "PullImage registry.example/hang:1")
        })
        .await;
        assert!(!w.tasks.is_empty(), "the worker and its step are tracked");
        token.cancel();
        assert!(w.wait_stopped(Duration::from_secs(5)).await);
        assert!(w.tasks.is_empty());
        assert!(
            !has(&fake, "StopPodSandbox"),
            "shutdown leaves pods as they are"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_grace_period_shortens_the_termination_in_flight() {
        // Old code: a second kill was ignored and the 30 s stop ran out.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let pod = named("p", "u-grace", "busybox:1.36", &["stubborn"]);
        w.update("u-grace", Work::Sync(pod.clone()));
        until("the container to start", || {
            has(&fake, "StartContainer stubborn")
        })
        .await;
        let t0 = Instant::now();
        w.update("u-grace", kill(&pod, Some(30)));
        until("the first stop", || !fake.stop_timeouts().is_empty()).await;
        // A longer one never lengthens it...
        w.update("u-grace", kill(&pod, Some(60)));
        // ...a shorter one restarts the stop with it.
        w.update("u-grace", kill(&pod, Some(5)));
        until("the pod to be removed", || !w.is_known("u-grace")).await;
        let stops: Vec<i64> = fake.stop_timeouts().iter().map(|(_, t)| *t).collect();
        assert_eq!(stops, vec![30, 5], "stop timeouts");
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "took {:?}",
            t0.elapsed()
        );
        token.cancel();
    }

    #[test]
    fn effective_grace_only_ever_shrinks_and_is_at_least_one() {
        let mut pod = (*named("p", "u", "busybox:1.36", &["a"])).clone();
        pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(20);
        assert_eq!(effective_grace(None, Some(&pod), None), Some(20));
        assert_eq!(effective_grace(None, Some(&pod), Some(50)), Some(50));
        assert_eq!(effective_grace(Some(20), Some(&pod), Some(50)), Some(20));
        assert_eq!(effective_grace(Some(20), Some(&pod), Some(3)), Some(3));
        assert_eq!(effective_grace(Some(20), Some(&pod), Some(0)), Some(1));
        pod.metadata.deletion_grace_period_seconds = Some(7);
        assert_eq!(effective_grace(Some(20), Some(&pod), None), Some(7));
        assert_eq!(effective_grace(None, None, None), None);
        assert_eq!(effective_grace(None, None, Some(4)), Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_static_pod_waits_for_its_predecessor_with_the_same_full_name() {
        // Old code: the edited pod (new UID) started while the old one was
        // still stopping, two copies of e.g. etcd at once.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let old = static_pod("etcd", "u-old", &["stubborn"]);
        let new = static_pod("etcd", "u-new", &["stubborn"]);
        w.update("u-old", Work::Sync(old.clone()));
        until("the old pod to run", || {
            has(&fake, "StartContainer stubborn")
        })
        .await;
        fake.clear_calls();
        // The file source sends the new pod first, then removes the old.
        w.update("u-new", Work::Sync(new.clone()));
        w.update("u-old", kill(&old, Some(5)));
        until("the new pod to run", || {
            has(&fake, "StartContainer stubborn")
        })
        .await;
        let calls = fake.calls();
        let removed = calls.iter().position(|c| c.starts_with("RemovePodSandbox"));
        let started = calls.iter().position(|c| c.starts_with("RunPodSandbox"));
        assert!(
            matches!((removed, started), (Some(r), Some(s)) if r < s),
            "new pod started before the old one was gone: {calls:?}"
        );
        // Other names are not held up.
        let other = static_pod("other", "u-other", &["app"]);
        w.update("u-other", Work::Sync(other));
        until("an unrelated pod to run", || {
            has(&fake, "StartContainer app")
        })
        .await;
        token.cancel();
    }

    #[tokio::test]
    async fn a_static_pod_removed_before_it_started_never_starts() {
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let a = static_pod("kube-apiserver", "u-a", &["stubborn"]);
        let b = static_pod("kube-apiserver", "u-b", &["app"]);
        let c = static_pod("kube-apiserver", "u-c", &["app2"]);
        w.update("u-a", Work::Sync(a.clone()));
        until("a to run", || has(&fake, "StartContainer stubborn")).await;
        w.update("u-b", Work::Sync(b.clone()));
        w.update("u-c", Work::Sync(c.clone()));
        // b is edited away while it waits; c is next in line.
        w.update("u-b", kill(&b, None));
        w.update("u-a", kill(&a, Some(2)));
        until("c to run", || has(&fake, "StartContainer app2")).await;
        assert!(!fake.calls().contains(&"StartContainer app".to_string()));
        token.cancel();
    }

    #[tokio::test]
    async fn a_static_pod_waits_for_a_leftover_instance_from_before_a_restart() {
        // Old code: the edited pod started beside the orphaned old instance.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let old = static_pod("etcd", "u-old", &["main"]);
        let before = workers(&fake, &token);
        let rt = before.runtime().pod_status("u-old").await.unwrap();
        before
            .runtime()
            .sync_pod(&old, &rt, &Default::default())
            .await;
        fake.clear_calls();
        // rkubelet restarted; the manifest changed meanwhile.
        let w = workers(&fake, &token);
        let new = static_pod("etcd", "u-new", &["main"]);
        w.update("u-new", Work::Sync(new.clone()));
        until("the start to be deferred", || {
            w.deps.queue.due_in("u-new").is_some()
        })
        .await;
        assert!(!has(&fake, "RunPodSandbox"), "{:?}", fake.calls());
        // Housekeeping finds the orphan and stops it; the new pod may start.
        w.update(
            "u-old",
            Work::Terminate {
                pod: None,
                grace: None,
            },
        );
        until("the orphan to be removed", || !w.is_known("u-old")).await;
        w.update("u-new", Work::Sync(new));
        until("the new pod to run", || has(&fake, "StartContainer main")).await;
        token.cancel();
    }

    #[tokio::test]
    async fn pods_wait_for_the_pod_network_but_host_network_pods_start() {
        // Old code: started every pod whatever the runtime said of its network.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ready.clone();
        let w = testing::workers_with_network(
            &fake,
            &token,
            Arc::new(move || {
                (!r.load(std::sync::atomic::Ordering::SeqCst))
                    .then(|| "NetworkReady=false reason:NetworkPluginNotReady".to_string())
            }),
        );
        let pod = named("web", "u-web", "busybox:1.36", &["app"]);
        let mut host = (*named("agent", "u-host", "busybox:1.36", &["hostapp"])).clone();
        host.spec.as_mut().unwrap().host_network = Some(true);
        w.update("u-web", Work::Sync(pod.clone()));
        w.update("u-host", Work::Sync(Arc::new(host)));
        until("the hostNetwork pod to run", || {
            has(&fake, "StartContainer hostapp")
        })
        .await;
        until("the waiting status", || {
            w.deps.status.get("u-web").is_some_and(|s| {
                let c = &s.container_statuses.as_ref().unwrap()[0];
                let wt = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
                wt.reason.as_deref() == Some("ContainerCreating")
                    && wt
                        .message
                        .as_deref()
                        .unwrap_or_default()
                        .starts_with("network is not ready: ")
            })
        })
        .await;
        assert!(!has(&fake, "RunPodSandbox web"), "{:?}", fake.calls());
        // Upstream's NetworkNotReady event says so too.
        assert!(
            crate::events::captured("web").iter().any(|(kind, reason, message)| {
                *kind == "Warning"
                    && reason == "NetworkNotReady"
                    && message == "network is not ready: NetworkReady=false reason:NetworkPluginNotReady"
            }),
            "{:?}",
            crate::events::captured("web")
        );
        assert!(w.deps.queue.due_in("u-web").unwrap() <= Duration::from_millis(1500));
        ready.store(true, std::sync::atomic::Ordering::SeqCst);
        w.update("u-web", Work::Sync(pod));
        until("the pod to run once the network is ready", || {
            has(&fake, "StartContainer app")
        })
        .await;
        token.cancel();
    }

    #[tokio::test]
    async fn a_failed_sync_is_retried_after_upstreams_backoff() {
        // Old code: retried after 2 s.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let pod = named("broken", "u-broken", "busybox:1.36", &["app"]);
        w.update("u-broken", Work::Sync(pod));
        until("the sync to fail", || has(&fake, "RunPodSandbox broken")).await;
        until("the retry to be queued", || {
            w.deps.queue.due_in("u-broken").is_some()
        })
        .await;
        let due = w.deps.queue.due_in("u-broken").unwrap();
        assert!(due > Duration::from_secs(9), "retry due in {due:?}");
        token.cancel();
    }

    #[tokio::test]
    async fn a_container_config_error_is_retried_after_upstreams_backoff() {
        // Old code: CreateContainerConfigError was retried every 2 s.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let mut pod = (*named("cfg", "u-cfg", "busybox:1.36", &["app"])).clone();
        let spec = pod.spec.as_mut().unwrap();
        spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
            name: "data".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            sub_path: Some("../../escape".into()),
            ..Default::default()
        }]);
        w.update("u-cfg", Work::Sync(Arc::new(pod)));
        until("the config error", || {
            w.deps
                .status
                .get("u-cfg")
                .is_some_and(|s| format!("{s:?}").contains("CreateContainerConfigError"))
        })
        .await;
        until("the retry to be queued", || {
            w.deps.queue.due_in("u-cfg").is_some()
        })
        .await;
        let due = w.deps.queue.due_in("u-cfg").unwrap();
        assert!(due > Duration::from_secs(9), "retry due in {due:?}");
        token.cancel();
    }

    #[tokio::test]
    async fn a_panicking_sync_backs_off_and_the_worker_survives() {
        // Old code: the worker task died with the panic; the pod was stuck.
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let bad = named("bad", "u-bad", "registry.example/panic:1", &["app"]);
        w.update("u-bad", Work::Sync(bad.clone()));
        until("the retry to be queued", || {
            w.deps.queue.due_in("u-bad").is_some()
        })
        .await;
        assert!(w.deps.queue.due_in("u-bad").unwrap() > Duration::from_secs(9));
        // Other pods are unaffected, and the bad one still answers a kill.
        let good = named("good", "u-good", "busybox:1.36", &["app"]);
        w.update("u-good", Work::Sync(good));
        until("the good pod to run", || has(&fake, "StartContainer app")).await;
        w.update("u-bad", kill(&bad, Some(2)));
        until("the bad pod to be removed", || !w.is_known("u-bad")).await;
        token.cancel();
    }

    #[tokio::test]
    async fn a_finished_pod_is_terminated_but_kept_until_removed() {
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let mut pod = (*named("job", "u-job", "busybox:1.36", &["app"])).clone();
        pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let pod = Arc::new(pod);
        w.update("u-job", Work::Sync(pod.clone()));
        until("the app to start", || has(&fake, "StartContainer app")).await;
        let rt = w.deps.runtime.pod_status("u-job").await.unwrap();
        fake.exit_container(&rt.latest("app").unwrap().id, 0);
        w.update("u-job", Work::Sync(pod.clone()));
        until("the pod to be terminated", || {
            w.phase("u-job") == Some(WorkerPhase::Terminated)
        })
        .await;
        assert!(has(&fake, "StopPodSandbox"));
        assert!(!has(&fake, "RemovePodSandbox"), "kept for its logs");
        let st = w.deps.status.get("u-job").unwrap();
        assert_eq!(st.phase.as_deref(), Some("Succeeded"));
        // Syncs of a finished pod do nothing.
        fake.clear_calls();
        w.update("u-job", Work::Sync(pod.clone()));
        w.update("u-job", kill(&pod, None));
        until("the pod to be removed", || !w.is_known("u-job")).await;
        assert!(has(&fake, "RemovePodSandbox"));
        assert!(!has(&fake, "StartContainer"));
        token.cancel();
    }

    #[tokio::test]
    async fn a_pod_stopped_now_ends_failed_with_the_reason_and_stays() {
        // Old code: nothing could stop a running pod that stays in config
        // (upstream killPodNow, which the eviction manager uses).
        let fake = Arc::new(FakeRuntime::new());
        fake.add_image("busybox:1.36");
        let token = CancellationToken::new();
        let w = workers(&fake, &token);
        let mut pod = (*named("web", "u-web", "busybox:1.36", &["app"])).clone();
        pod.metadata.generation = Some(3);
        let pod = Arc::new(pod);
        assert!(!w.stop_now("u-web", 1, stopped()), "unknown pod");
        w.update("u-web", Work::Sync(pod.clone()));
        until("the app to start", || has(&fake, "StartContainer app")).await;
        until("a status", || w.deps.status.get("u-web").is_some()).await;
        assert!(!w.is_evicted_and_terminated("u-web"));
        assert!(w.stop_now("u-web", 1, stopped()));
        assert!(!w.stop_now("u-web", 1, stopped()), "already stopping");
        until("the pod to be terminated", || {
            w.phase("u-web") == Some(WorkerPhase::Terminated)
        })
        .await;
        // Its content may go now, though the pod stays.
        assert!(w.is_evicted_and_terminated("u-web"));
        assert!(has(&fake, "StopContainer"));
        assert!(!has(&fake, "RemovePodSandbox"), "kept until removed");
        let st = w.deps.status.get("u-web").unwrap();
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            st.message.as_deref(),
            Some("The node was low on resource: memory. ")
        );
        let c = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .unwrap();
        assert_eq!(
            (
                c.status.as_str(),
                c.reason.as_deref(),
                c.message.as_deref(),
                c.observed_generation
            ),
            (
                "True",
                Some("TerminationByKubelet"),
                Some("The node was low on resource: memory. "),
                Some(3)
            )
        );
        // Its containers are not started again.
        fake.clear_calls();
        w.update("u-web", Work::Sync(pod.clone()));
        tokio::task::yield_now().await;
        assert!(!has(&fake, "StartContainer"));
        token.cancel();
    }

    fn stopped() -> Stopped {
        Stopped {
            reason: "Evicted".into(),
            message: "The node was low on resource: memory. ".into(),
            disruption: true,
        }
    }

    #[test]
    fn work_queue_hands_out_only_due_pods_once() {
        let q = WorkQueue::default();
        q.enqueue("a", Duration::ZERO);
        q.enqueue("b", Duration::from_secs(60));
        q.enqueue("b", Duration::from_secs(30));
        let now = Instant::now();
        assert_eq!(q.take_due(now), vec!["a".to_string()]);
        assert!(q.take_due(now).is_empty());
        assert_eq!(
            q.take_due(now + Duration::from_secs(31)),
            vec!["b".to_string()]
        );
    }
}
