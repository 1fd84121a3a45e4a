//! CRI labels and annotations on sandboxes and containers, with upstream's
//! keys (`pkg/kubelet/kuberuntime/labels.go`), so crictl and other tools read
//! them and a restarted rkubelet can adopt the pods it finds.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

pub const POD_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Upstream's hash (`hash::upstream_hash`), written as upstream writes it.
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// The preStop handler as JSON, so an orphan found after a restart (no spec
/// any more) still gets its hook run before it is stopped, as upstream.
pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";

/// The CRI label selector for a pod's sandboxes and containers.
pub fn pod_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(POD_UID.to_string(), uid.to_string())])
}

/// The CRI label selector for the instances of one container of a pod.
pub fn container_selector(uid: &str, container: &str) -> HashMap<String, String> {
    HashMap::from([
        (POD_UID.to_string(), uid.to_string()),
        (CONTAINER_NAME.to_string(), container.to_string()),
    ])
}
/// rkubelet's own field-set hash (`hash::container_hash`). Containers written
/// before this key existed carry it under `CONTAINER_HASH` instead, beside
/// `CONTAINER_SPEC_VERSION`.
pub const RKUBELET_CONTAINER_HASH: &str = "io.rkubelet.container.hash";
/// rkubelet's own: the version of the field set behind
/// `RKUBELET_CONTAINER_HASH`, so a later rkubelet that hashes more fields
/// never restarts older containers.
pub const CONTAINER_SPEC_VERSION: &str = "io.rkubelet.container.specVersion";
/// rkubelet's own: "init" for init containers, so adoption after a restart
/// knows which list a container came from.
pub const CONTAINER_TYPE: &str = "io.rkubelet.container.type";

fn meta(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or("default"),
        m.uid.as_deref().unwrap_or_default(),
    )
}

/// Sandbox labels: the pod's own labels plus the identity keys.
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let (name, ns, uid) = meta(pod);
    labels.insert(POD_NAME.into(), name.into());
    labels.insert(POD_NAMESPACE.into(), ns.into());
    labels.insert(POD_UID.into(), uid.into());
    labels
}

/// Sandbox annotations are the pod's annotations, as upstream passes them.
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

pub fn container_labels(pod: &Pod, c: &Container, init: bool) -> HashMap<String, String> {
    let (name, ns, uid) = meta(pod);
    let mut l = HashMap::new();
    l.insert(POD_NAME.into(), name.into());
    l.insert(POD_NAMESPACE.into(), ns.into());
    l.insert(POD_UID.into(), uid.into());
    l.insert(CONTAINER_NAME.into(), c.name.clone());
    if init {
        l.insert(CONTAINER_TYPE.into(), "init".into());
    }
    l
}

/// Container annotations; `hash` is rkubelet's field-set hash.
pub fn container_annotations(
    pod: &Pod,
    c: &Container,
    restart_count: i32,
    hash: &str,
) -> HashMap<String, String> {
    let mut a = HashMap::new();
    // Upstream's value under upstream's key, so the upstream kubelet can take
    // the node back without restarting anything; rkubelet's beside it.
    a.insert(CONTAINER_HASH.into(), super::hash::upstream_hash(c));
    a.insert(RKUBELET_CONTAINER_HASH.into(), hash.into());
    a.insert(
        CONTAINER_SPEC_VERSION.into(),
        super::hash::SPEC_VERSION.to_string(),
    );
    a.insert(CONTAINER_RESTART_COUNT.into(), restart_count.to_string());
    a.insert(
        CONTAINER_TERMINATION_MESSAGE_PATH.into(),
        c.termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into()),
    );
    a.insert(
        CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
        c.termination_message_policy
            .clone()
            .unwrap_or_else(|| "File".into()),
    );
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    a.insert(POD_TERMINATION_GRACE.into(), grace.to_string());
    if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        if let Ok(json) = serde_json::to_string(h) {
            a.insert(CONTAINER_PRE_STOP_HANDLER.into(), json);
        }
    }
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty()) {
        if let Ok(json) = serde_json::to_string(ports) {
            a.insert(CONTAINER_PORTS.into(), json);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Old behaviour: rkubelet's field-set hash sat under upstream's key, so
    /// an upstream kubelet taking the node back restarted every container.
    #[test]
    fn upstreams_key_carries_upstreams_hash_and_ours_has_its_own_key() {
        let pod = Pod::default();
        let c = Container {
            name: "app".into(),
            image: Some("busybox:1.36".into()),
            ..Default::default()
        };
        let own = super::super::hash::container_hash(&c);
        let a = container_annotations(&pod, &c, 0, &own);
        assert_eq!(a[CONTAINER_HASH], "395745");
        assert_eq!(a[RKUBELET_CONTAINER_HASH], own);
        assert_eq!(a[CONTAINER_SPEC_VERSION], "1");
    }
}
