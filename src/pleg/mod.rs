//! Generic PLEG: relists sandboxes and containers every second, diffs them
//! against the previous relist and tells the syncLoop which pods changed
//! (upstream `pkg/kubelet/pleg/generic.go`). A relist is two list calls with
//! the CRI deadline; per-pod inspection happens in the pod workers, so one
//! slow pod never stalls the relist or the node's health.

pub mod evented;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::cri::{PodSandboxState, RuntimeService};
use crate::kuberuntime::pod_status::CState;

/// Upstream genericPlegRelistPeriod.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// Upstream genericPlegRelistThreshold: unhealthy after 3 min without a relist.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// Upstream plegChannelCapacity; events beyond it are dropped and counted.
pub const CHANNEL_CAPACITY: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub uid: String,
    pub kind: EventType,
    /// The container or sandbox the event is about.
    pub id: String,
}

/// What one relist saw of a pod: each container's and sandbox's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelistPod {
    pub containers: HashMap<String, CState>,
    pub sandboxes: HashMap<String, bool>,
}

impl RelistPod {
    pub fn any_running(&self) -> bool {
        self.containers.values().any(|s| *s == CState::Running)
            || self.sandboxes.values().any(|r| *r)
    }
}

pub type Snapshot = HashMap<String, RelistPod>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plegs {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

fn plegs(s: Option<CState>) -> Plegs {
    match s {
        None => Plegs::NonExistent,
        Some(CState::Running) => Plegs::Running,
        Some(CState::Exited) => Plegs::Exited,
        Some(CState::Created | CState::Unknown) => Plegs::Unknown,
    }
}

/// Upstream generateEvents: the event for one container's state change.
fn event_for(
    uid: &str,
    id: &str,
    old: Option<CState>,
    new: Option<CState>,
) -> Vec<PodLifecycleEvent> {
    let (o, n) = (plegs(old), plegs(new));
    if o == n {
        return vec![];
    }
    let ev = |kind| PodLifecycleEvent {
        uid: uid.to_string(),
        kind,
        id: id.to_string(),
    };
    match n {
        Plegs::Running => vec![ev(EventType::ContainerStarted)],
        Plegs::Exited => vec![ev(EventType::ContainerDied)],
        Plegs::Unknown => vec![ev(EventType::ContainerChanged)],
        Plegs::NonExistent if o == Plegs::Exited => vec![ev(EventType::ContainerRemoved)],
        Plegs::NonExistent => vec![
            ev(EventType::ContainerDied),
            ev(EventType::ContainerRemoved),
        ],
    }
}

/// Diffs two relists into events, pod by pod, and says whether they are
/// equal (every pod, container and sandbox in the same state: a state
/// change need not be an event, as created and unknown containers are both
/// "unknown" to the PLEG).
fn changes(old: &Snapshot, new: &Snapshot) -> (Vec<PodLifecycleEvent>, bool) {
    // Most relists find nothing changed: told without sorting every pod's
    // ids (equal relists have no events).
    if old == new {
        return (Vec::new(), true);
    }
    let mut events = Vec::new();
    let empty = RelistPod::default();
    let mut uids: Vec<&String> = old.keys().chain(new.keys()).collect();
    uids.sort();
    uids.dedup();
    for uid in uids {
        let (o, n) = (
            old.get(uid).unwrap_or(&empty),
            new.get(uid).unwrap_or(&empty),
        );
        let mut ids: Vec<&String> = o.containers.keys().chain(n.containers.keys()).collect();
        ids.sort();
        ids.dedup();
        for id in ids {
            let (was, now) = (o.containers.get(id).copied(), n.containers.get(id).copied());
            events.extend(event_for(uid, id, was, now));
        }
        // Sandboxes count as containers too, as upstream treats them.
        let sb = |r: Option<&bool>| {
            r.map(|ready| {
                if *ready {
                    CState::Running
                } else {
                    CState::Exited
                }
            })
        };
        let mut ids: Vec<&String> = o.sandboxes.keys().chain(n.sandboxes.keys()).collect();
        ids.sort();
        ids.dedup();
        for id in ids {
            let (was, now) = (o.sandboxes.get(id), n.sandboxes.get(id));
            events.extend(event_for(uid, id, sb(was), sb(now)));
        }
    }
    (events, false)
}

struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    last_relist: RwLock<Option<Instant>>,
    discarded: std::sync::atomic::AtomicU64,
}

/// A cheap, cloneable view of the PLEG: its last snapshot and its health.
#[derive(Clone)]
pub struct PlegHandle {
    shared: Arc<Shared>,
}

impl PlegHandle {
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.read().clone()
    }

    /// Upstream Healthy(): fails when no relist completed within 3 minutes.
    pub fn healthy(&self) -> Result<(), String> {
        let last = *self.shared.last_relist.read();
        match last {
            None => Err("pleg has yet to be successful".into()),
            Some(t) if t.elapsed() > RELIST_THRESHOLD => Err(format!(
                "pleg was last seen active {:?} ago; threshold is {:?}",
                t.elapsed(),
                RELIST_THRESHOLD
            )),
            Some(_) => Ok(()),
        }
    }

    pub fn discarded_events(&self) -> u64 {
        self.shared
            .discarded
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn relist_once(runtime: &dyn RuntimeService) -> Result<Snapshot, crate::cri::CriError> {
    let (sandboxes, containers) = runtime.relist().await?;
    let mut snap: Snapshot = HashMap::new();
    for sb in sandboxes {
        let Some(uid) = sb.pod_uid else {
            continue;
        };
        let ready = sb.state == PodSandboxState::SandboxReady as i32;
        snap.entry(uid).or_default().sandboxes.insert(sb.id, ready);
    }
    for c in containers {
        let Some(uid) = c.pod_uid else {
            continue;
        };
        snap.entry(uid)
            .or_default()
            .containers
            .insert(c.id, CState::from_cri(c.state));
    }
    Ok(snap)
}

/// Starts the relist loop; events go to `events` (dropped when it is full).
pub fn spawn(
    runtime: Arc<dyn RuntimeService>,
    period: Duration,
    events: mpsc::Sender<PodLifecycleEvent>,
    token: CancellationToken,
) -> PlegHandle {
    let shared = Arc::new(Shared {
        snapshot: RwLock::new(Arc::new(HashMap::new())),
        last_relist: RwLock::new(None),
        discarded: Default::default(),
    });
    let handle = PlegHandle {
        shared: shared.clone(),
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        let mut last_start: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            let started = Instant::now();
            let res = relist_once(runtime.as_ref()).await;
            crate::metrics::pleg_relist(
                started.elapsed(),
                last_start.replace(started).map(|t| started - t),
                res.is_ok(),
            );
            match res {
                Ok(snap) => {
                    failures = 0;
                    let old = shared.snapshot.read().clone();
                    let (evs, same) = changes(&old, &snap);
                    // An unchanged relist keeps the published snapshot, so
                    // readers that remember one (the stats lists, the heap
                    // trim) tell "no change" by pointer: a new Arc always
                    // means a changed relist.
                    if !same {
                        *shared.snapshot.write() = Arc::new(snap);
                    }
                    *shared.last_relist.write() = Some(Instant::now());
                    for ev in evs {
                        debug!(pod_uid = %ev.uid, kind = ?ev.kind, id = %ev.id, "pleg event");
                        if events.try_send(ev).is_err() {
                            shared
                                .discarded
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            crate::metrics::pleg_discarded();
                        }
                    }
                }
                Err(e) => {
                    failures += 1;
                    // Log the first failure and then rarely: the runtime may be
                    // restarting, and the next tick retries anyway.
                    if failures == 1 || failures % 60 == 0 {
                        warn!(error = %e, failures, "pleg relist failed");
                    }
                }
            }
        }
    });
    handle
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::labels;

    fn pod(cs: &[(&str, CState)]) -> RelistPod {
        RelistPod {
            containers: cs.iter().map(|(i, s)| (i.to_string(), *s)).collect(),
            sandboxes: HashMap::new(),
        }
    }

    fn kinds(evs: &[PodLifecycleEvent]) -> Vec<(String, EventType)> {
        evs.iter().map(|e| (e.id.clone(), e.kind)).collect()
    }

    #[test]
    fn diff_reports_starts_deaths_and_removals() {
        let old: Snapshot = [(
            "u".to_string(),
            pod(&[
                ("a", CState::Running),
                ("b", CState::Running),
                ("c", CState::Exited),
            ]),
        )]
        .into();
        let new: Snapshot = [(
            "u".to_string(),
            pod(&[
                ("a", CState::Running),
                ("b", CState::Exited),
                ("d", CState::Running),
            ]),
        )]
        .into();
        let evs = changes(&old, &new).0;
        assert_eq!(
            kinds(&evs),
            vec![
                ("b".into(), EventType::ContainerDied),
                ("c".into(), EventType::ContainerRemoved),
                ("d".into(), EventType::ContainerStarted)
            ]
        );
    }

    #[test]
    fn a_running_container_that_vanishes_dies_then_is_removed() {
        let old: Snapshot = [("u".to_string(), pod(&[("a", CState::Running)]))].into();
        let evs = changes(&old, &Snapshot::new()).0;
        assert_eq!(
            kinds(&evs),
            vec![
                ("a".into(), EventType::ContainerDied),
                ("a".into(), EventType::ContainerRemoved)
            ]
        );
    }

    #[test]
    fn unchanged_relist_emits_nothing_and_sandbox_changes_count() {
        let mut p = pod(&[("a", CState::Running)]);
        p.sandboxes.insert("s".into(), true);
        let old: Snapshot = [("u".to_string(), p.clone())].into();
        assert!(changes(&old, &old).0.is_empty());
        p.sandboxes.insert("s".into(), false);
        let new: Snapshot = [("u".to_string(), p)].into();
        assert_eq!(
            kinds(&changes(&old, &new).0),
            vec![("s".into(), EventType::ContainerDied)]
        );
    }

    #[test]
    fn changes_tell_equal_relists_from_changes_that_are_no_event() {
        let mut p = pod(&[("a", CState::Created)]);
        p.sandboxes.insert("s".into(), true);
        let old: Snapshot = [("u".to_string(), p.clone())].into();
        assert_eq!(changes(&old, &old.clone()), (vec![], true));
        // Created and unknown are both "unknown" to the PLEG: no event, but
        // not the same relist.
        p.containers.insert("a".into(), CState::Unknown);
        let new: Snapshot = [("u".to_string(), p)].into();
        assert_eq!(changes(&old, &new), (vec![], false));
        // A pod with nothing left in it is a change too.
        let mut more = old.clone();
        more.insert("v".into(), RelistPod::default());
        assert_eq!(changes(&old, &more), (vec![], false));
        assert!(!changes(&more, &old).1);
        // As is one such pod in place of another.
        let mut other = old.clone();
        other.insert("w".into(), RelistPod::default());
        assert!(!changes(&more, &other).1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_relist_keeps_the_published_snapshot() {
        let rt = Arc::new(crate::cri::fake::FakeRuntime::new());
        let (tx, mut rx) = mpsc::channel(10);
        let token = CancellationToken::new();
        let h = spawn(rt.clone(), RELIST_PERIOD, tx, token.clone());
        let relisted = |h: &PlegHandle| *h.shared.last_relist.read();
        // Waits (in paused time) for the relist after `since`.
        async fn next(h: &PlegHandle, since: Option<Instant>) {
            let deadline = Instant::now() + Duration::from_secs(30);
            while *h.shared.last_relist.read() == since && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_ne!(*h.shared.last_relist.read(), since, "no relist");
        }
        next(&h, None).await;
        let first = h.snapshot();
        next(&h, relisted(&h)).await;
        assert!(Arc::ptr_eq(&first, &h.snapshot()), "same relist, same Arc");
        // A new sandbox: a new snapshot.
        rt.run_pod_sandbox(
            crate::cri::v1::PodSandboxConfig {
                metadata: Some(crate::cri::v1::PodSandboxMetadata {
                    name: "p".into(),
                    namespace: "ns".into(),
                    uid: "u-new".into(),
                    attempt: 0,
                }),
                labels: [(labels::POD_UID.to_string(), "u-new".to_string())].into(),
                ..Default::default()
            },
            String::new(),
        )
        .await
        .unwrap();
        next(&h, relisted(&h)).await;
        let second = h.snapshot();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(second.contains_key("u-new"), "{second:?}");
        assert!(rx.try_recv().is_ok(), "the sandbox's event");
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn health_fails_before_the_first_relist_and_after_the_threshold() {
        let rt = Arc::new(crate::cri::fake::FakeRuntime::new());
        let (tx, _rx) = mpsc::channel(10);
        let token = CancellationToken::new();
        let h = spawn(rt, RELIST_PERIOD, tx, token.clone());
        assert!(h.healthy().is_err());
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.healthy().is_err() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(h.healthy().is_ok());
        token.cancel();
        tokio::time::sleep(RELIST_THRESHOLD + Duration::from_secs(1)).await;
        assert!(h.healthy().unwrap_err().contains("threshold is"));
    }
}
