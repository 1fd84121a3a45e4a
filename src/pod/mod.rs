//! The pod manager: the desired pods, by UID, as the config sources last
//! described them (upstream `pkg/kubelet/pod/pod_manager.go`). One writer
//! (the syncLoop), many readers (workers, servers) that get `Arc` clones.
//!
//! A pod whose deletion has begun leaves the desired set at once (nothing
//! may start it again) but stays known, with its deletionTimestamp, until
//! its source removes it: upstream keeps it in the pod manager until
//! REMOVE, so `/pods`, `kubectl logs` and `kubectl exec` still find a pod
//! in its grace period.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;

#[derive(Default, Clone)]
pub struct PodManager {
    pods: Arc<RwLock<Pods>>,
    /// Told of each pod's references, as upstream's pod manager tells the
    /// secret and configmap managers.
    objects: Option<crate::objects::ObjectManager>,
}

#[derive(Default)]
struct Pods {
    desired: HashMap<String, Arc<Pod>>,
    /// Deleted by their source, not yet removed from it.
    terminating: HashMap<String, Arc<Pod>>,
}

impl PodManager {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_objects(mut self, objects: crate::objects::ObjectManager) -> Self {
        self.objects = Some(objects);
        self
    }

    pub fn upsert(&self, pod: Pod) -> Arc<Pod> {
        if let Some(o) = &self.objects {
            o.register_pod(&pod);
        }
        let pod = Arc::new(pod);
        let uid = crate::source::pod_uid(&pod).to_string();
        let mut pods = self.pods.write();
        pods.terminating.remove(&uid);
        pods.desired.insert(uid, pod.clone());
        pod
    }

    /// Takes a pod out of the desired set as its deletion begins, keeping
    /// `pod` (the copy with its deletionTimestamp) until [`Self::remove`].
    pub fn mark_terminating(&self, pod: Pod) -> Arc<Pod> {
        let uid = crate::source::pod_uid(&pod).to_string();
        if let Some(o) = &self.objects {
            o.unregister_pod(&uid);
        }
        let pod = Arc::new(pod);
        let mut pods = self.pods.write();
        pods.desired.remove(&uid);
        pods.terminating.insert(uid, pod.clone());
        pod
    }

    /// Forgets a pod its source removed; returns the copy last kept.
    pub fn remove(&self, uid: &str) -> Option<Arc<Pod>> {
        if let Some(o) = &self.objects {
            o.unregister_pod(uid);
        }
        let mut pods = self.pods.write();
        let terminating = pods.terminating.remove(uid);
        pods.desired.remove(uid).or(terminating)
    }

    /// Replaces the kept copy of a known pod whose status alone changed at
    /// its source (upstream HandlePodReconcile's UpdatePod). Returns the new
    /// copy when the pod is desired; a pod not known is not added.
    pub fn reconcile(&self, pod: Pod) -> Option<Arc<Pod>> {
        let uid = crate::source::pod_uid(&pod).to_string();
        let mut pods = self.pods.write();
        let pods = &mut *pods;
        let (slot, desired) = match pods.desired.get_mut(&uid) {
            Some(slot) => (slot, true),
            None => (pods.terminating.get_mut(&uid)?, false),
        };
        *slot = Arc::new(pod);
        desired.then(|| slot.clone())
    }

    /// A desired pod.
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.read().desired.get(uid).cloned()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.pods.read().desired.contains_key(uid)
    }

    /// The desired pods, sorted by namespace and name for stable output.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        sorted(self.pods.read().desired.values().cloned().collect())
    }

    /// Every pod the sources still hold, terminating ones included (what
    /// upstream's pod manager lists for `/pods`), sorted.
    pub fn listed(&self) -> Vec<Arc<Pod>> {
        let pods = self.pods.read();
        sorted(
            pods.desired
                .values()
                .chain(pods.terminating.values())
                .cloned()
                .collect(),
        )
    }

    /// The desired pods and the deleted ones not yet removed, apart.
    pub fn desired_and_terminating(&self) -> (Vec<Arc<Pod>>, Vec<Arc<Pod>>) {
        let pods = self.pods.read();
        (
            pods.desired.values().cloned().collect(),
            pods.terminating.values().cloned().collect(),
        )
    }

    /// A pod by namespace and name (upstream GetPodByName), a desired one
    /// before one that is terminating.
    pub fn by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let pods = self.pods.read();
        let named = |p: &&Arc<Pod>| {
            p.metadata.name.as_deref() == Some(name)
                && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
        };
        pods.desired
            .values()
            .find(named)
            .or_else(|| pods.terminating.values().find(named))
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.pods.read().desired.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn sorted(mut v: Vec<Arc<Pod>>) -> Vec<Arc<Pod>> {
    v.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::{epoch, named_pod as pod};

    #[test]
    fn a_terminating_pod_stays_listed_until_it_is_removed() {
        let m = PodManager::new();
        m.upsert(pod("web", "u1"));
        m.upsert(pod("db", "u2"));
        let mut deleted = pod("web", "u1");
        deleted.metadata.deletion_timestamp = Some(epoch());
        m.mark_terminating(deleted);

        assert!(m.get("u1").is_none() && !m.contains("u1"), "not desired");
        assert_eq!(m.len(), 1);
        let listed = m.listed();
        let names: Vec<_> = listed.iter().map(|p| pod_name(p)).collect();
        assert_eq!(names, ["db", "web"]);
        let found = m.by_name("default", "web").expect("found by name");
        assert!(found.metadata.deletion_timestamp.is_some());

        // A status-only change reaches the kept copy, and asks no sync.
        let mut status = pod("web", "u1");
        status.metadata.deletion_timestamp = Some(epoch());
        status.status = Some(Default::default());
        assert!(m.reconcile(status).is_none());
        assert!(m.by_name("default", "web").unwrap().status.is_some());

        assert!(m.remove("u1").is_some());
        assert!(m.by_name("default", "web").is_none());
        assert_eq!(m.listed().len(), 1);
    }

    #[test]
    fn reconcile_replaces_only_known_pods() {
        let m = PodManager::new();
        assert!(
            m.reconcile(pod("web", "u1")).is_none(),
            "unknown: not added"
        );
        assert!(m.listed().is_empty());
        m.upsert(pod("web", "u1"));
        let mut p = pod("web", "u1");
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let got = m.reconcile(p).expect("desired");
        assert_eq!(
            got.status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );
        assert!(Arc::ptr_eq(&got, &m.get("u1").unwrap()));
    }

    #[test]
    fn a_desired_pod_is_found_before_a_terminating_one_of_the_same_name() {
        let m = PodManager::new();
        m.mark_terminating(pod("web", "old"));
        m.upsert(pod("web", "new"));
        assert_eq!(
            m.by_name("default", "web").unwrap().metadata.uid.as_deref(),
            Some("new")
        );
        assert_eq!(m.listed().len(), 2);
    }

    fn pod_name(p: &Pod) -> &str {
        p.metadata.name.as_deref().unwrap_or_default()
    }
}
