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
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

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
}

pub struct Deps {
    pub runtime: Arc<RuntimeManager>,
    pub status: StatusManager,
    pub probes: ProbeManager,
    pub queue: Arc<WorkQueue>,
    /// How often a healthy pod is synced anyway (syncFrequency).
    pub resync: Duration,
}

struct Entry {
    tx: watch::Sender<Work>,
    terminating: bool,
    /// A new pod with this UID that arrived while the old one terminated.
    after_termination: Option<Work>,
}

#[derive(Clone)]
pub struct PodWorkers {
    deps: Arc<Deps>,
    workers: Arc<Mutex<HashMap<String, Entry>>>,
    token: CancellationToken,
}

impl PodWorkers {
    pub fn new(deps: Deps, token: CancellationToken) -> Self {
        PodWorkers {
            deps: Arc::new(deps),
            workers: Default::default(),
            token,
        }
    }

    /// Hands work to the pod's worker, starting one if needed.
    pub fn update(&self, uid: &str, work: Work) {
        let mut workers = self.workers.lock();
        if let Some(e) = workers.get_mut(uid) {
            match (&work, e.terminating) {
                (Work::Sync(_), true) => e.after_termination = Some(work),
                (Work::Terminate { .. }, true) => {}
                (Work::Terminate { .. }, false) => {
                    e.terminating = true;
                    e.tx.send_replace(work);
                }
                (Work::Sync(_), false) => {
                    e.tx.send_replace(work);
                }
            }
            return;
        }
        self.spawn_worker(&mut workers, uid, work);
    }

    fn spawn_worker(&self, workers: &mut HashMap<String, Entry>, uid: &str, work: Work) {
        let terminating = matches!(work, Work::Terminate { .. });
        let (tx, rx) = watch::channel(work);
        workers.insert(
            uid.to_string(),
            Entry {
                tx,
                terminating,
                after_termination: None,
            },
        );
        let this = self.clone();
        let uid = uid.to_string();
        let span = tracing::info_span!("pod_worker", pod_uid = %uid);
        tokio::spawn(async move { this.run(uid, rx).await }.instrument(span));
    }

    pub fn is_known(&self, uid: &str) -> bool {
        self.workers.lock().contains_key(uid)
    }

    pub fn is_terminating(&self, uid: &str) -> bool {
        self.workers.lock().get(uid).is_some_and(|e| e.terminating)
    }

    async fn run(self, uid: String, mut rx: watch::Receiver<Work>) {
        // Why containers waited at the last sync, carried to the next one.
        let mut waiting = HashMap::new();
        loop {
            let work = rx.borrow_and_update().clone();
            match work {
                Work::Sync(pod) => {
                    let delay = self.sync(&uid, &pod, &mut waiting).await;
                    self.deps.queue.enqueue(&uid, delay);
                }
                Work::Terminate { pod, grace } => {
                    self.terminate(&uid, pod.as_deref(), grace).await;
                    self.finish(&uid);
                    return;
                }
            }
            tokio::select! {
                _ = self.token.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }

    /// One sync: read the runtime, act, publish the status. Returns when
    /// the pod should be synced again.
    async fn sync(
        &self,
        uid: &str,
        pod: &Pod,
        waiting: &mut HashMap<String, crate::kuberuntime::Waiting>,
    ) -> Duration {
        let rm = &self.deps.runtime;
        let rt = match rm.pod_status(uid).await {
            Ok(rt) => rt,
            Err(e) => {
                warn!(pod = pod.metadata.name.as_deref().unwrap_or_default(), error = %e, "unable to read pod status from the runtime");
                return Duration::from_secs(2);
            }
        };
        if let Some(left) = self.deadline_left(uid, pod) {
            if left.is_zero() {
                return self.fail_past_deadline(uid, pod, &rt).await;
            }
        }
        let probes = self.probe_state(uid, pod, &rt);
        // Publish what the runtime shows now (a container that just died),
        // before this sync spends time restarting it. The last sync's waiting
        // reasons apply only to containers that are still not running.
        self.publish_status(uid, pod, &rt, waiting, &probes);
        let mut result = rm.sync_pod(pod, &rt, &probes).await;
        if let Some(left) = self.deadline_left(uid, pod) {
            // Come back when the deadline passes (upstream activeDeadlineHandler).
            result.requeue_after = Some(result.requeue_after.map_or(left, |d| d.min(left)));
        }
        for e in &result.errors {
            warn!(pod = pod.metadata.name.as_deref().unwrap_or_default(), error = %e, "error syncing pod");
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
        self.publish_status(uid, pod, &rt, &result.waiting, &probes);
        *waiting = result.waiting;
        result
            .requeue_after
            .unwrap_or(self.deps.resync)
            .min(self.deps.resync)
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

    /// Upstream: a pod past its activeDeadlineSeconds is killed and Failed
    /// with reason DeadlineExceeded; it is not restarted.
    async fn fail_past_deadline(&self, uid: &str, pod: &Pod, rt: &RuntimePod) -> Duration {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        info!(
            pod = name,
            "pod was active on the node longer than the specified deadline; killing it"
        );
        if let Err(e) = self.deps.runtime.kill_pod(Some(pod), rt, None).await {
            warn!(pod = name, error = %e, "failed to kill pod past its deadline");
            return Duration::from_secs(2);
        }
        let rt = self
            .deps
            .runtime
            .pod_status(uid)
            .await
            .unwrap_or_else(|_| rt.clone());
        let probes = self.probe_state(uid, pod, &rt);
        self.publish_status(uid, pod, &rt, &HashMap::new(), &probes);
        if let Some(st) = self.deps.status.get(uid) {
            let mut st = (*st).clone();
            st.phase = Some("Failed".into());
            st.reason = Some("DeadlineExceeded".into());
            st.message =
                Some("Pod was active on the node longer than the specified deadline".into());
            self.deps.status.set(uid, st);
        }
        self.deps.resync
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

    fn publish_status(
        &self,
        uid: &str,
        pod: &Pod,
        rt: &RuntimePod,
        waiting: &HashMap<String, crate::kuberuntime::Waiting>,
        probes: &ProbeState,
    ) {
        let previous = self.deps.status.get(uid);
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
            pod_is_terminal: false,
        });
        self.deps.status.set(uid, status);
    }

    /// Kills and removes everything of the pod, retrying with backoff until
    /// it is done or rkubelet shuts down (a shutdown leaves pods running).
    async fn terminate(&self, uid: &str, pod: Option<&Pod>, grace: Option<i64>) {
        let rm = &self.deps.runtime;
        let mut delay = Duration::from_millis(500);
        loop {
            let r = async {
                let rt = rm.pod_status(uid).await?;
                rm.kill_pod(pod, &rt, grace).await?;
                let rt = rm.pod_status(uid).await?;
                rm.remove_pod(&rt).await
            }
            .await;
            match r {
                Ok(()) => break,
                Err(e) => {
                    warn!(error = %e, retry_in = ?delay, "failed to terminate pod");
                    tokio::select! {
                        _ = self.token.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
        if let Err(e) = volume::cleanup_pod_dir(&rm.opts.root_dir, uid) {
            warn!(error = %e, "failed to remove pod directory");
        }
        self.deps.status.remove(uid);
        self.deps.probes.remove_pod(uid);
        self.deps.queue.forget(uid);
        info!(
            pod = pod
                .and_then(|p| p.metadata.name.as_deref())
                .unwrap_or("<orphan>"),
            "pod terminated and removed"
        );
    }

    fn finish(&self, uid: &str) {
        let mut workers = self.workers.lock();
        if let Some(e) = workers.remove(uid) {
            if let Some(next) = e.after_termination {
                debug!(pod_uid = uid, "starting pod again after termination");
                self.spawn_worker(&mut workers, uid, next);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use crate::images::ImageManager;
    use crate::kuberuntime::RuntimeOptions;

    fn workers(fake: &Arc<FakeRuntime>, token: &CancellationToken) -> PodWorkers {
        let root = std::env::temp_dir().join(format!("rkubelet-pw-{}", std::process::id()));
        let opts = RuntimeOptions {
            root_dir: root.clone(),
            pod_logs_dir: root.join("logs"),
            resolv_conf: std::path::PathBuf::new(),
            ..RuntimeOptions::default()
        };
        let rm = Arc::new(RuntimeManager::new(
            fake.clone(),
            ImageManager::new(fake.clone(), true, None),
            opts,
        ));
        let (tx, _rx) = tokio::sync::mpsc::channel(10);
        let deps = Deps {
            runtime: rm,
            status: StatusManager::new(),
            probes: ProbeManager::new(fake.clone(), tx, token.child_token()),
            queue: Arc::new(WorkQueue::default()),
            resync: Duration::from_secs(60),
        };
        PodWorkers::new(deps, token.child_token())
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
            fake.calls()
                .iter()
                .filter(|c| c.starts_with("RunPodSandbox"))
                .count()
                == 2
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
