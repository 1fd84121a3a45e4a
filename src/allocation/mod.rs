//! The allocation manager (upstream `pkg/kubelet/allocation`): which
//! resources each admitted pod's containers were granted, so an in-place
//! resize (a change of `resources` in the spec) runs only once it fits the
//! node. A resize that does not fit leaves the pod on its old allocation,
//! with a `PodResizePending` condition saying why (`Infeasible`: more than
//! the node has; `Deferred`: more than is free now, retried as pods come
//! and go).
//!
//! Only allocations that lag their spec are kept (a pod whose spec is its
//! allocation needs no record), in `<root>/allocated_pods_state`: after a
//! restart a pod waiting for room keeps its old resources instead of being
//! admitted, or refused, with the new ones.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use parking_lot::Mutex;
use tracing::warn;

/// The checkpoint's file name under the root directory.
pub const STATE_FILE: &str = "allocated_pods_state";

/// Why a resize waits (upstream's PodResizePending reasons).
pub const INFEASIBLE: &str = "Infeasible";
pub const DEFERRED: &str = "Deferred";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub reason: &'static str,
    pub message: String,
}

/// Container name → the resources it was granted.
pub type Allocation = HashMap<String, ResourceRequirements>;

#[derive(Default)]
struct State {
    /// Pods whose spec asks for other resources than they were granted.
    lagging: HashMap<String, Allocation>,
    pending: HashMap<String, Pending>,
    /// Pods whose resize was granted and not yet seen applied (upstream's
    /// PodResizeInProgress, set on allocation), with what was granted.
    in_progress: HashMap<String, Allocation>,
    /// Since when each pending resize has waited for its present reason
    /// (upstream: its PodResizePending condition's lastTransitionTime),
    /// which orders retries of equal rank.
    since: HashMap<String, tokio::time::Instant>,
}

#[derive(Clone, Default)]
pub struct AllocationManager {
    state: Arc<Mutex<State>>,
    /// Where lagging allocations are kept (none in unit tests).
    path: Option<PathBuf>,
    /// One checkpoint write at a time.
    writer: Arc<Mutex<()>>,
}

/// The containers a resize may change: sidecars, then the regular ones
/// (upstream IsResizableContainer).
pub fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        let sidecars = s
            .init_containers
            .iter()
            .flatten()
            .filter(|c| crate::kuberuntime::actions::is_sidecar(c));
        sidecars.chain(s.containers.iter())
    })
}

/// The resizable containers' resources, by name.
pub fn resources_of(pod: &Pod) -> Allocation {
    resizable(pod)
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect()
}

/// `pod` with `alloc`'s resources in place of its spec's.
fn with_allocation(pod: &Pod, alloc: &Allocation) -> Pod {
    let mut p = pod.clone();
    if let Some(spec) = p.spec.as_mut() {
        let inits = spec.init_containers.iter_mut().flatten();
        for c in spec.containers.iter_mut().chain(inits) {
            if let Some(r) = alloc.get(&c.name) {
                c.resources = Some(r.clone());
            }
        }
    }
    p
}

impl AllocationManager {
    /// Reads the lagging allocations kept under `root` (blocking: call at
    /// start, off the async threads). A missing or unreadable file is no
    /// record: every pod's allocation is its spec.
    pub fn load(root: &Path) -> Self {
        let path = root.join(STATE_FILE);
        let lagging = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                warn!(path = %path.display(), error = %e, "ignoring an unreadable allocation checkpoint");
                HashMap::new()
            }),
            Err(_) => HashMap::new(),
        };
        AllocationManager {
            state: Arc::new(Mutex::new(State {
                lagging,
                ..Default::default()
            })),
            path: Some(path),
            writer: Default::default(),
        }
    }

    /// The pod as granted: its spec with the allocation that lags it, if
    /// any (upstream UpdatePodFromAllocation). The pod worker runs this.
    pub fn granted(&self, pod: Arc<Pod>) -> Arc<Pod> {
        let uid = crate::source::pod_uid(&pod);
        match self.state.lock().lagging.get(uid) {
            Some(alloc) => Arc::new(with_allocation(&pod, alloc)),
            None => pod,
        }
    }

    /// Whether the pod runs on an allocation other than its spec's.
    pub fn lags(&self, uid: &str) -> bool {
        self.state.lock().lagging.contains_key(uid)
    }

    /// The allocation the pod runs on instead of its spec, if any. A
    /// pending resize always has one (`defer` keeps both, `grant` and
    /// `remove` drop both).
    pub fn lagging(&self, uid: &str) -> Option<Allocation> {
        self.state.lock().lagging.get(uid).cloned()
    }

    /// The pod's allocation: the lagging one, else `fallback`'s resources
    /// (the pod as last granted).
    pub fn allocation(&self, uid: &str, fallback: &Pod) -> Allocation {
        self.lagging(uid).unwrap_or_else(|| resources_of(fallback))
    }

    pub fn pending(&self, uid: &str) -> Option<Pending> {
        self.state.lock().pending.get(uid).cloned()
    }

    /// The UIDs of pods whose resize is Deferred, the longest waiting
    /// first (Infeasible ones wait for their pod to change).
    pub fn deferred_uids(&self) -> Vec<String> {
        let st = self.state.lock();
        let mut uids: Vec<(tokio::time::Instant, &String)> = st
            .pending
            .iter()
            .filter(|(_, p)| p.reason == DEFERRED)
            .map(|(uid, _)| {
                (
                    st.since
                        .get(uid)
                        .copied()
                        .unwrap_or_else(tokio::time::Instant::now),
                    uid,
                )
            })
            .collect();
        uids.sort();
        uids.into_iter().map(|(_, uid)| uid.clone()).collect()
    }

    /// Where a deferred resize of `pod` comes in the retry order, lowest
    /// first (upstream sortPendingResizes): resizes that ask for no more
    /// than they were granted, then higher priority, then Guaranteed pods;
    /// `deferred_uids`' age order decides between equals.
    pub fn retry_rank(&self, pod: &Pod) -> (bool, std::cmp::Reverse<i32>, bool) {
        use crate::lifecycle::pod_requests;
        let increasing = self
            .lagging(crate::source::pod_uid(pod))
            .is_some_and(|alloc| {
                let granted = with_allocation(pod, &alloc);
                ["cpu", "memory"]
                    .iter()
                    .any(|r| pod_requests(pod, r) > pod_requests(&granted, r))
            });
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let guaranteed = crate::cm::pod_qos(pod) == crate::cm::QosClass::Guaranteed;
        (increasing, std::cmp::Reverse(priority), !guaranteed)
    }

    pub fn in_progress(&self, uid: &str) -> bool {
        self.state.lock().in_progress.contains_key(uid)
    }

    /// The granted resize was seen applied to `pod` (the copy a worker
    /// ran: one synced before the grant does not end it). True when it was
    /// in progress.
    pub fn done(&self, uid: &str, pod: &Pod) -> bool {
        let mut st = self.state.lock();
        if st
            .in_progress
            .get(uid)
            .is_some_and(|a| *a == resources_of(pod))
        {
            st.in_progress.remove(uid);
            return true;
        }
        false
    }

    /// Grants `pod` its spec: no lagging record, nothing pending. With
    /// `resized`, the grant is a resize, in progress until seen applied.
    pub fn grant(&self, pod: &Pod, resized: bool) {
        let uid = crate::source::pod_uid(pod);
        let changed = {
            let mut st = self.state.lock();
            st.pending.remove(uid);
            st.since.remove(uid);
            if resized {
                st.in_progress.insert(uid.to_string(), resources_of(pod));
            }
            st.lagging.remove(uid).is_some()
        };
        if changed {
            self.save();
        }
        crate::metrics::resize_states(self.counts());
    }

    /// Keeps the pod on `alloc`, its resize waiting for `why`.
    pub fn defer(&self, uid: &str, alloc: Allocation, why: Pending) {
        let changed = {
            let mut st = self.state.lock();
            let reason = why.reason;
            if st.pending.insert(uid.to_string(), why).map(|p| p.reason) != Some(reason) {
                st.since
                    .insert(uid.to_string(), tokio::time::Instant::now());
            }
            st.lagging.insert(uid.to_string(), alloc.clone()) != Some(alloc)
        };
        if changed {
            self.save();
        }
        crate::metrics::resize_states(self.counts());
    }

    /// A pod that finished has no resize in progress.
    pub fn remove_progress(&self, uid: &str) {
        if self.state.lock().in_progress.remove(uid).is_some() {
            crate::metrics::resize_states(self.counts());
        }
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        let changed = {
            let mut st = self.state.lock();
            st.pending.remove(uid);
            st.since.remove(uid);
            st.in_progress.remove(uid);
            st.lagging.remove(uid).is_some()
        };
        if changed {
            self.save();
        }
        crate::metrics::resize_states(self.counts());
    }

    /// (deferred, infeasible, in progress) counts, for the gauges.
    fn counts(&self) -> (i64, i64, i64) {
        let st = self.state.lock();
        let n = |r: &str| st.pending.values().filter(|p| p.reason == r).count() as i64;
        (n(DEFERRED), n(INFEASIBLE), st.in_progress.len() as i64)
    }

    /// Writes the lagging allocations (small: only pods whose resize
    /// waits), replacing the file atomically, on a blocking thread. Each
    /// write takes the state as it is then, one at a time, so a later save
    /// never loses to an earlier one.
    fn save(&self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let (state, writer) = (self.state.clone(), self.writer.clone());
        let write = move || {
            let _one = writer.lock();
            let bytes = serde_json::to_vec(&state.lock().lagging).map_err(std::io::Error::other)?;
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, &path)
        };
        let report = |r: std::io::Result<()>| {
            if let Err(e) = r {
                warn!(error = %e, "unable to write the allocation checkpoint");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || report(write()));
            }
            Err(_) => report(write()),
        }
    }
}

/// Counts each container's requested change from `was` to `want` (their
/// resizable containers' resources), per resource and requirement
/// (upstream recordContainerResizeOperations:
/// `kubelet_container_requested_resizes_total`).
pub fn count_requested_resizes(was: &Allocation, want: &Allocation) {
    use crate::cm::quantity::{parse_bytes, parse_cpu_millis};
    type List = Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >;
    let value = |list: &List, resource: &str| {
        let q = &list.as_ref()?.get(resource)?.0;
        match resource {
            "cpu" => parse_cpu_millis(q).ok(),
            _ => parse_bytes(q).ok(),
        }
    };
    for (name, new) in want {
        let Some(old) = was.get(name) else {
            continue;
        };
        let pairs = [
            ("requests", &old.requests, &new.requests),
            ("limits", &old.limits, &new.limits),
        ];
        for (requirement, before, after) in pairs {
            for resource in ["cpu", "memory"] {
                let operation = match (value(before, resource), value(after, resource)) {
                    (None, Some(_)) => "add",
                    (Some(_), None) => "remove",
                    (Some(a), Some(b)) if b > a => "increase",
                    (Some(a), Some(b)) if b < a => "decrease",
                    _ => continue,
                };
                crate::metrics::resize_requested(resource, requirement, operation);
            }
        }
    }
}

/// Upstream canResizePod's node check: a pod asking for more cpu or memory
/// than the node can ever give is Infeasible (memory first; cpu in
/// millicores, memory in bytes).
pub fn infeasible(pod: &Pod, node: &crate::lifecycle::NodeFacts) -> Option<Pending> {
    let cpu = crate::lifecycle::pod_requests(pod, "cpu");
    let memory = crate::lifecycle::pod_requests(pod, "memory") / 1000;
    let msg = if memory > node.memory_milli / 1000 {
        format!(
            "memory, requested: {memory}, capacity: {}",
            node.memory_milli / 1000
        )
    } else if cpu > node.cpu_milli {
        format!("cpu, requested: {cpu}, capacity: {}", node.cpu_milli)
    } else {
        return None;
    };
    Some(Pending {
        reason: INFEASIBLE,
        message: format!("Node didn't have enough capacity: {msg}"),
    })
}

#[cfg(test)]
mod tests;
