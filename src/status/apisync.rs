//! The status manager's API half (upstream `status_manager.go` syncPod and
//! `pod/mirror_client.go`): pushes each new pod status to `pods/<name>/
//! status`, finishes graceful deletions once the pod worker is done, and
//! keeps a mirror pod in the API for each static pod.
//!
//! - A status is sent when its version moved (`StatusManager` bumps it only
//!   on a real change), as a strategic merge patch carrying the pod's UID
//!   (the API server refuses it with 409 if the name now belongs to another
//!   pod). A failure leaves the version unsent, so it is retried, and a
//!   status computed while the API server was away is sent when it returns.
//! - Static pods report through their mirror pod (same name, another UID).
//! - A pod deleted in the API is deleted for good (grace 0, UID
//!   precondition) once its worker has stopped its containers and cleaned
//!   up (upstream canBeDeleted).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::StatusManager;
use crate::apiclient::ApiClient;
use crate::pod::PodManager;
use crate::source::api::MirrorPods;
use crate::source::{
    pod_full_name, pod_uid, API_SOURCE, CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
};

/// How often pending work is retried without a change to wake it (upstream
/// syncPeriod of the status manager: 10 s).
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);

/// Pods deleted in the API, waiting for their worker to finish.
#[derive(Debug, Default, Clone)]
pub struct Deleting(Arc<Mutex<HashMap<String, (String, String)>>>);

impl Deleting {
    /// Records an API pod that has a deletionTimestamp.
    pub fn add(&self, pod: &Pod) {
        let m = &pod.metadata;
        self.0.lock().insert(
            pod_uid(pod).to_string(),
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            ),
        );
    }
}

/// The strategic-merge patch of a pod's status. Of the conditions, only the
/// kubelet's own are sent (upstream mergePodStatus takes the others from
/// the API's copy): the status carries others' conditions as the API last
/// showed them, and sending those back could undo a newer change by their
/// owner (a readiness gate flipped while this patch was on its way).
/// A condition of the kubelet's that `old` (the API's status) has and the
/// new status lacks (a resize condition cleared) gets a delete directive,
/// as upstream's two-way merge patch from the old status writes one.
///
/// As upstream mergePodStatus, a pod whose containers could still run
/// (`could_run`: its worker has not finished stopping them) is not reported
/// in a terminal phase yet: the API's phase, reason and message are sent
/// instead, and the second value says the status was held back. The
/// DisruptionTarget condition (the one the kubelet shares) goes with the
/// transition to the terminal phase, once nothing runs.
fn status_patch(
    uid: &str,
    status: &PodStatus,
    old: Option<&PodStatus>,
    could_run: bool,
) -> (serde_json::Value, bool) {
    use crate::status::generate::is_terminal;
    let mut status = status.clone();
    let old_phase = old.and_then(|o| o.phase.as_deref());
    let transitioning = !is_terminal(old_phase) && is_terminal(status.phase.as_deref());
    let held = transitioning && could_run;
    if held {
        status.phase = old.and_then(|o| o.phase.clone());
        status.reason = old.and_then(|o| o.reason.clone());
        status.message = old.and_then(|o| o.message.clone());
    }
    let shared = transitioning && !could_run;
    if let Some(cs) = status.conditions.as_mut() {
        cs.retain(|c| {
            crate::status::generate::is_kubelet_condition(&c.type_)
                || (shared && c.type_ == "DisruptionTarget")
        });
    }
    let gone: Vec<serde_json::Value> = old
        .and_then(|o| o.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| crate::status::generate::is_kubelet_condition(&c.type_))
        .filter(|c| {
            !status
                .conditions
                .iter()
                .flatten()
                .any(|n| n.type_ == c.type_)
        })
        .map(|c| serde_json::json!({"$patch": "delete", "type": c.type_}))
        .collect();
    let mut patch = serde_json::json!({
        "metadata": { "uid": uid },
        "status": status,
    });
    if !gone.is_empty() {
        let list = &mut patch["status"]["conditions"];
        match list.as_array_mut() {
            Some(a) => a.extend(gone),
            None => *list = gone.into(),
        }
    }
    (patch, held)
}

pub fn is_api_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION) == Some(API_SOURCE)
}

pub fn is_static_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s != API_SOURCE)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The mirror pod of a static pod (upstream mirror_client CreateMirrorPod):
/// its spec and labels, the config.mirror annotation set to the static
/// pod's hash, and the Node as owner so it goes with the Node.
pub fn mirror_of(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut annotations: BTreeMap<String, String> =
        pod.metadata.annotations.clone().unwrap_or_default();
    let hash = annotations
        .get(CONFIG_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| pod_uid(pod).to_string());
    annotations.insert(CONFIG_MIRROR_ANNOTATION.to_string(), hash);
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: node_uid.into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: pod.spec.clone(),
        status: None,
    }
}

/// Whether `mirror` mirrors the current `pod` (upstream IsMirrorPodOf: the
/// mirror annotation equals the static pod's hash).
pub fn mirrors(mirror: &Pod, pod: &Pod) -> bool {
    let hash = annotation(pod, CONFIG_HASH_ANNOTATION).unwrap_or(pod_uid(pod));
    annotation(mirror, CONFIG_MIRROR_ANNOTATION) == Some(hash)
        && mirror.metadata.deletion_timestamp.is_none()
}

pub struct ApiStatusSync {
    pub api: ApiClient,
    pub node_name: String,
    pub node_uid: tokio::sync::watch::Receiver<Option<String>>,
    pub pods: PodManager,
    pub status: StatusManager,
    pub mirrors: MirrorPods,
    pub deleting: Deleting,
    /// Whether the pod worker still knows a UID (terminating or not).
    pub worker_known: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// Whether a pod's containers could still be running (its worker syncs
    /// or stops it; upstream PodCouldHaveRunningContainers).
    pub could_have_running: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl ApiStatusSync {
    /// Runs until `token` is cancelled.
    pub async fn run(self, token: CancellationToken) {
        let mut sent: HashMap<String, u64> = HashMap::new();
        loop {
            self.sync_mirrors().await;
            self.sync_statuses(&mut sent).await;
            self.finish_deletions().await;
            tokio::select! {
                _ = token.cancelled() => return,
                _ = self.status.changed() => {}
                _ = tokio::time::sleep(SYNC_PERIOD) => {}
            }
        }
    }

    async fn sync_statuses(&self, sent: &mut HashMap<String, u64>) {
        // Last statuses of pods deleted in the API, sent before the delete
        // (upstream sends the terminal status, then deletes).
        for (uid, status, version) in self.status.take_finals() {
            let target = self.deleting.0.lock().get(&uid).cloned();
            let Some((ns, name)) = target else { continue };
            if sent.get(&uid) == Some(&version) {
                continue;
            }
            crate::metrics::pod_status_pending(&uid);
            if self
                .patch_status(&uid, &ns, &name, &status, None, false)
                .await
            {
                sent.insert(uid, version);
            } else {
                // Not sent: kept for the next pass, ahead of the delete.
                self.status.return_final(&uid, status, version);
            }
        }
        let uids = self.status.uids();
        sent.retain(|uid, _| uids.contains(uid) || self.deleting.0.lock().contains_key(uid));
        for uid in uids {
            let Some((status, version)) = self.status.get_versioned(&uid) else {
                continue;
            };
            if sent.get(&uid) == Some(&version) {
                continue;
            }
            let Some(pod) = self.pods.get(&uid) else {
                continue;
            };
            // The API object and its UID: the pod itself, or a static pod's
            // mirror (none yet: nothing to report to).
            let (target_uid, old) = if is_api_pod(&pod) {
                (uid.clone(), pod.status.clone())
            } else {
                match self.mirrors.get(&pod_full_name(&pod)) {
                    Some(m) if mirrors(&m, &pod) => (pod_uid(&m).to_string(), m.status),
                    _ => continue,
                }
            };
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            crate::metrics::pod_status_pending(&target_uid);
            let could_run = (self.could_have_running)(&uid);
            if self
                .patch_status(&target_uid, &ns, &name, &status, old.as_ref(), could_run)
                .await
            {
                debug!(pod = %name, namespace = %ns, version, "status sent");
                sent.insert(uid, version);
            }
        }
    }

    /// Patches one status; true when done with it (sent, or its object is
    /// gone or replaced), false to retry (as when its terminal phase was
    /// held back: sent again once the worker has stopped the containers).
    async fn patch_status(
        &self,
        uid: &str,
        ns: &str,
        name: &str,
        status: &PodStatus,
        old: Option<&PodStatus>,
        could_run: bool,
    ) -> bool {
        let (patch, held) = status_patch(uid, status, old, could_run);
        let api: Api<Pod> = Api::namespaced(self.api.client().await, ns);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                crate::metrics::pod_status_synced(uid);
                !held
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                crate::metrics::pod_status_dropped(uid);
                // The object is gone or is another pod now: this status has
                // no home; a new mirror or pod starts over.
                debug!(pod = %name, namespace = %ns, reason = %s.reason, "status not sent: pod gone or replaced");
                true
            }
            Err(e) => {
                warn!(pod = %name, namespace = %ns, error = %e, "failed to update pod status, will retry");
                false
            }
        }
    }

    async fn finish_deletions(&self) {
        let due: Vec<(String, (String, String))> = self
            .deleting
            .0
            .lock()
            .iter()
            .filter(|(uid, _)| !(self.worker_known)(uid) && !self.status.has_final(uid))
            .map(|(u, v)| (u.clone(), v.clone()))
            .collect();
        for (uid, (ns, name)) in due {
            let api: Api<Pod> = Api::namespaced(self.api.client().await, &ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {
                    info!(pod = %name, namespace = %ns, "pod deleted from the API after termination")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    warn!(pod = %name, namespace = %ns, error = %e, "failed to delete pod, will retry");
                    continue;
                }
            }
            self.deleting.0.lock().remove(&uid);
        }
    }

    /// Creates missing mirror pods, replaces outdated ones and deletes
    /// those whose static pod is gone (upstream syncPod's mirror handling
    /// and HandlePodCleanups' orphaned mirror pods).
    async fn sync_mirrors(&self) {
        let Some(node_uid) = self.node_uid.borrow().clone() else {
            return;
        };
        let statics: HashMap<String, Arc<Pod>> = self
            .pods
            .pods()
            .into_iter()
            .filter(|p| is_static_pod(p))
            .map(|p| (pod_full_name(&p), p))
            .collect();
        for (full, pod) in &statics {
            match self.mirrors.get(full) {
                Some(m) if mirrors(&m, pod) => {}
                Some(m) => {
                    if m.metadata.deletion_timestamp.is_none() {
                        info!(pod = %full, "deleting outdated mirror pod");
                        self.delete_mirror(&m).await;
                    }
                }
                None => {
                    let mirror = mirror_of(pod, &self.node_name, &node_uid);
                    let ns = mirror.metadata.namespace.clone().unwrap_or_default();
                    let api: Api<Pod> = Api::namespaced(self.api.client().await, &ns);
                    match api.create(&PostParams::default(), &mirror).await {
                        Ok(created) => {
                            info!(pod = %full, "created mirror pod");
                            self.mirrors.insert(created);
                        }
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            // It exists: take it if it mirrors this pod.
                            let name = mirror.metadata.name.clone().unwrap_or_default();
                            if let Ok(m) = api.get(&name).await {
                                if mirrors(&m, pod) {
                                    self.mirrors.insert(m);
                                }
                            }
                        }
                        Err(e) => warn!(pod = %full, error = %e, "failed creating a mirror pod"),
                    }
                }
            }
        }
        for m in self.mirrors.all() {
            if !statics.contains_key(&pod_full_name(&m)) && m.metadata.deletion_timestamp.is_none()
            {
                info!(pod = %pod_full_name(&m), "deleting orphaned mirror pod");
                self.delete_mirror(&m).await;
            }
        }
    }

    async fn delete_mirror(&self, m: &Pod) {
        let ns = m.metadata.namespace.clone().unwrap_or_default();
        let name = m.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.api.client().await, &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: m.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(e) = api.delete(&name, &dp).await {
            warn!(pod = %name, namespace = %ns, error = %e, "failed deleting a mirror pod");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn static_pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("etcd-n1".into());
        p.metadata.namespace = Some("kube-system".into());
        p.metadata.uid = Some("static-uid".into());
        p.metadata.annotations = Some(
            [
                (CONFIG_HASH_ANNOTATION.to_string(), "static-uid".to_string()),
                (CONFIG_SOURCE_ANNOTATION.to_string(), "file".to_string()),
            ]
            .into(),
        );
        p
    }

    #[test]
    fn a_status_patch_sends_only_the_kubelets_conditions() {
        // Old code sent the whole status, so a readiness gate's condition as
        // last seen would go back to the API over its owner's newer value.
        let c = |t: &str| k8s_openapi::api::core::v1::PodCondition {
            type_: t.into(),
            status: "True".into(),
            ..Default::default()
        };
        let status = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                c("example.com/lb"),
                c("DisruptionTarget"),
                c("PodReadyToStartContainers"),
                c("Ready"),
            ]),
            ..Default::default()
        };
        // The API still shows a resize condition the kubelet cleared: it is
        // deleted by the patch; others' conditions are left alone.
        let old = PodStatus {
            conditions: Some(vec![c("PodResizeInProgress"), c("example.com/lb")]),
            ..Default::default()
        };
        let (p, held) = status_patch("u1", &status, Some(&old), false);
        assert!(!held);
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["status"]["phase"], "Running");
        let types: Vec<&str> = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            ["PodReadyToStartContainers", "Ready", "PodResizeInProgress"]
        );
        assert_eq!(p["status"]["conditions"][2]["$patch"], "delete");
    }

    #[test]
    fn a_terminal_phase_waits_for_the_containers_to_stop_and_brings_disruption_target() {
        // Old code: Failed went to the API while the containers still ran,
        // and a DisruptionTarget the kubelet set never went at all.
        let running = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        let evicted = PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            message: Some("The node was low on resource: memory. ".into()),
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("TerminationByKubelet".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let (p, held) = status_patch("u1", &evicted, Some(&running), true);
        assert!(held);
        assert_eq!(p["status"]["phase"], "Running");
        assert!(p["status"]["reason"].is_null());
        assert_eq!(p["status"]["conditions"], serde_json::json!([]));
        let (p, held) = status_patch("u1", &evicted, Some(&running), false);
        assert!(!held);
        assert_eq!(p["status"]["phase"], "Failed");
        assert_eq!(p["status"]["reason"], "Evicted");
        assert_eq!(p["status"]["conditions"][0]["type"], "DisruptionTarget");
        // Already terminal in the API: nothing is held, and the shared
        // condition is not sent again.
        let (p, held) = status_patch("u1", &evicted, Some(&evicted), true);
        assert!(!held);
        assert_eq!(p["status"]["conditions"], serde_json::json!([]));
    }

    #[test]
    fn a_mirror_pod_carries_the_hash_and_is_owned_by_the_node() {
        let pod = static_pod();
        let m = mirror_of(&pod, "n1", "node-uid");
        assert_eq!(m.metadata.uid, None, "the API server names it");
        assert_eq!(
            m.metadata.annotations.as_ref().unwrap()[CONFIG_MIRROR_ANNOTATION],
            "static-uid"
        );
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        assert!(mirrors(&m, &pod));
        let mut edited = pod.clone();
        edited
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(CONFIG_HASH_ANNOTATION.into(), "new".into());
        assert!(
            !mirrors(&m, &edited),
            "an edited static pod needs a new mirror"
        );
        assert!(is_static_pod(&pod) && !is_api_pod(&pod));
    }
}
