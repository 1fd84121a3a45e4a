//! The pod manager: the desired pods, by UID, as the config sources last
//! described them (upstream `pkg/kubelet/pod/pod_manager.go`). One writer
//! (the syncLoop), many readers (workers, servers) that get `Arc` clones.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;

#[derive(Default, Clone)]
pub struct PodManager {
    pods: Arc<RwLock<HashMap<String, Arc<Pod>>>>,
    /// Told of each pod's references, as upstream's pod manager tells the
    /// secret and configmap managers.
    objects: Option<crate::objects::ObjectManager>,
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
        self.pods
            .write()
            .insert(crate::source::pod_uid(&pod).to_string(), pod.clone());
        pod
    }

    pub fn remove(&self, uid: &str) -> Option<Arc<Pod>> {
        if let Some(o) = &self.objects {
            o.unregister_pod(uid);
        }
        self.pods.write().remove(uid)
    }

    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.read().get(uid).cloned()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.pods.read().contains_key(uid)
    }

    /// All pods, sorted by namespace and name for stable output.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        let mut v: Vec<Arc<Pod>> = self.pods.read().values().cloned().collect();
        v.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        v
    }

    pub fn len(&self) -> usize {
        self.pods.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
