//! The pod startup latency SLI (upstream's
//! `pkg/kubelet/util/pod_startup_latency_tracker.go`): for a pod first seen
//! on the API watch before the kubelet acknowledged it (no startTime yet),
//! the time from its creation to the watch showing every container running,
//! less the time spent pulling images. Static pods are never on the watch
//! under their own UID, so, as upstream, they are not measured.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use parking_lot::Mutex;

#[derive(Default)]
struct PerPod {
    first_started_pulling: Option<SystemTime>,
    last_finished_pulling: Option<SystemTime>,
    /// When the kubelet's own status first showed every container running.
    observed_running: Option<SystemTime>,
    recorded: bool,
}

/// What one pod's start gave, once the watch showed it running.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// podStartSLOduration: end to end, less the image pulls.
    pub sli: f64,
    /// podStartE2EDuration.
    pub total: f64,
    /// The first pod on the pod network since the kubelet started.
    pub first_network_pod: bool,
}

#[derive(Default)]
pub struct Tracker {
    pods: HashMap<String, PerPod>,
    first_network_pod_seen: bool,
}

/// Every container has been running at least once (hasPodStartedSLO).
fn started(status: Option<&PodStatus>) -> bool {
    status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some_and(|r| r.started_at.is_some())
        })
}

fn secs_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

impl Tracker {
    /// ObservedPodOnWatch: starts tracking a pod the kubelet has not
    /// acknowledged yet; once its status written by this kubelet shows it
    /// started and the watch shows the same, gives the figures (once).
    pub fn observed_on_watch(&mut self, pod: &Pod, when: SystemTime) -> Option<Observation> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let status = pod.status.as_ref();
        if matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Failed" | "Succeeded")
        ) {
            self.pods.remove(uid);
            return None;
        }
        let Some(state) = self.pods.get_mut(uid) else {
            // Only pods bound after this kubelet started: no startTime yet.
            if status.and_then(|s| s.start_time.as_ref()).is_none() {
                self.pods.insert(uid.to_string(), PerPod::default());
            }
            return None;
        };
        if state.observed_running.is_none() || state.recorded || !started(status) {
            return None;
        }
        let created = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0))?;
        let total = secs_between(created, when);
        let pulling = match (state.first_started_pulling, state.last_finished_pulling) {
            (Some(a), Some(b)) => secs_between(a, b),
            _ => 0.0,
        };
        state.recorded = true;
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let first_network_pod = !host_network && !self.first_network_pod_seen;
        if first_network_pod {
            self.first_network_pod_seen = true;
        }
        Some(Observation {
            sli: total - pulling,
            total,
            first_network_pod,
        })
    }

    pub fn image_started_pulling(&mut self, uid: &str, now: SystemTime) {
        if let Some(s) = self.pods.get_mut(uid) {
            s.first_started_pulling.get_or_insert(now);
        }
    }

    pub fn image_finished_pulling(&mut self, uid: &str, now: SystemTime) {
        if let Some(s) = self.pods.get_mut(uid) {
            s.last_finished_pulling = Some(now);
        }
    }

    /// RecordStatusUpdated: notes when the kubelet's status first showed
    /// every container running.
    pub fn status_updated(&mut self, uid: &str, status: &PodStatus, now: SystemTime) {
        if let Some(s) = self.pods.get_mut(uid) {
            if !s.recorded && s.observed_running.is_none() && started(Some(status)) {
                s.observed_running = Some(now);
            }
        }
    }

    pub fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    pub fn tracked(&self) -> usize {
        self.pods.len()
    }
}

/// The kubelet's tracker (one per process, as upstream's is per kubelet).
pub static TRACKER: LazyLock<Mutex<Tracker>> = LazyLock::new(Default::default);

/// A pod as the API watch delivered it, now: records the SLI when due.
pub fn observed_on_watch(pod: &Pod) {
    let seen = TRACKER.lock().observed_on_watch(pod, SystemTime::now());
    let Some(o) = seen else { return };
    tracing::info!(
        pod = %format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        ),
        pod_start_slo_duration = o.sli,
        pod_start_e2e_duration = ?Duration::from_secs_f64(o.total.max(0.0)),
        "observed pod startup duration"
    );
    let m = &*super::METRICS;
    if o.first_network_pod {
        m.first_network_pod_start_sli_duration.set(o.sli);
    }
    m.pod_start_sli_duration.observe(o.sli);
    m.pod_start_total_duration.observe(o.total);
}

pub fn image_started_pulling(uid: &str) {
    TRACKER.lock().image_started_pulling(uid, SystemTime::now());
}

pub fn image_finished_pulling(uid: &str) {
    TRACKER
        .lock()
        .image_finished_pulling(uid, SystemTime::now());
}

pub fn status_updated(uid: &str, status: &PodStatus) {
    TRACKER
        .lock()
        .status_updated(uid, status, SystemTime::now());
}

pub fn forget(uid: &str) {
    TRACKER.lock().forget(uid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn ts(s: u64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::try_from(at(s)).unwrap())
    }

    fn status(running: &[bool], start: Option<u64>) -> PodStatus {
        PodStatus {
            phase: Some("Pending".into()),
            start_time: start.map(ts),
            container_statuses: Some(
                running
                    .iter()
                    .map(|r| ContainerStatus {
                        state: Some(ContainerState {
                            running: r.then(|| ContainerStateRunning {
                                started_at: Some(ts(0)),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn pod(uid: &str, host_network: bool, st: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(uid.into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(ts(100)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                host_network: Some(host_network),
                ..Default::default()
            }),
            status: Some(st),
        }
    }

    #[test]
    fn the_sli_is_creation_to_watched_running_less_the_pulls_once_per_pod() {
        let mut t = Tracker::default();
        // Bound, not acknowledged yet: tracked.
        assert_eq!(
            t.observed_on_watch(&pod("a", false, status(&[false], None)), at(101)),
            None
        );
        t.image_started_pulling("a", at(102));
        t.image_started_pulling("a", at(103));
        t.image_finished_pulling("a", at(106));
        t.image_finished_pulling("a", at(110));
        // The kubelet's status shows both containers running at 112...
        t.status_updated("a", &status(&[true, false], Some(101)), at(111));
        t.status_updated("a", &status(&[true, true], Some(101)), at(112));
        // ...and the watch shows it at 115: 15 s end to end, 8 s pulling.
        let running = pod("a", false, status(&[true, true], Some(101)));
        let o = t.observed_on_watch(&running, at(115)).expect("recorded");
        assert_eq!(
            o,
            Observation {
                sli: 7.0,
                total: 15.0,
                first_network_pod: true
            }
        );
        assert_eq!(t.observed_on_watch(&running, at(116)), None, "once");
        // A second pod on the pod network is not the first.
        t.observed_on_watch(&pod("b", false, status(&[false], None)), at(120));
        t.status_updated("b", &status(&[true], Some(120)), at(121));
        let o = t
            .observed_on_watch(&pod("b", false, status(&[true], Some(120))), at(122))
            .unwrap();
        assert!(!o.first_network_pod);
        assert_eq!(o.sli, 22.0, "no pulls: all of it");
    }

    #[test]
    fn pods_acknowledged_before_or_finished_are_not_measured() {
        let mut t = Tracker::default();
        // Already had a startTime when first seen (bound before a restart).
        t.observed_on_watch(&pod("old", false, status(&[false], Some(50))), at(101));
        t.status_updated("old", &status(&[true], Some(50)), at(102));
        assert_eq!(
            t.observed_on_watch(&pod("old", false, status(&[true], Some(50))), at(103)),
            None
        );
        // Running on the watch before the kubelet's own status said so.
        t.observed_on_watch(&pod("x", false, status(&[false], None)), at(101));
        assert_eq!(
            t.observed_on_watch(&pod("x", false, status(&[true], Some(101))), at(102)),
            None
        );
        // A terminal pod is dropped.
        let mut done = status(&[false], Some(101));
        done.phase = Some("Succeeded".into());
        t.observed_on_watch(&pod("x", false, done), at(103));
        t.forget("nothing");
        assert_eq!(t.tracked(), 0);
    }
}
