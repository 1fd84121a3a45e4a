//! Controller-managed attach for CSI persistent volumes (upstream
//! `csi_attacher.go` WaitForAttach, `csi_plugin.go` skipAttach and
//! getPublishContext, and the kubelet side of
//! `operation_generator.go` GenerateVerifyControllerAttachedVolumeFunc):
//! the attach/detach controller creates the VolumeAttachment and lists the
//! volume in the Node's `status.volumesAttached`, the driver's
//! external-attacher marks it attached; the kubelet only waits, reads the
//! attachment's `attachmentMetadata` (the publish context of NodeStage and
//! NodePublish) and reports the volumes it uses in `status.volumesInUse`
//! so that the controller does not detach them.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::mounter::attachment_name;
use super::PLUGIN_NAME;

/// Why a volume that needs attaching cannot be mounted yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// Upstream's precondition on the node lister: the Node as last seen
    /// does not list the volume as attached.
    #[error("volume {0} is not yet in node's status")]
    NotInNodeStatus(String),
    /// The kubelet has not yet reported the volume in use (upstream waits
    /// for its own node status update first).
    #[error("Volume has not been added to the list of VolumesInUse in the node's volume status")]
    NotReportedInUse,
    #[error("VerifyControllerAttachedVolume failed fetching node from API server: {0}")]
    NodeGet(String),
    #[error("Volume not attached according to node status")]
    NotAttached,
    /// `enableControllerAttachDetach: false`: upstream's CSI attacher
    /// refuses to attach from the kubelet.
    #[error("attaching volumes from the kubelet is not supported")]
    KubeletAttach,
    /// WaitForAttach: the VolumeAttachment is missing, not attached, being
    /// deleted, or carries the attacher's error.
    #[error("{0}")]
    WaitForAttach(String),
}

impl AttachError {
    /// The pod event upstream records for the failure (reason, message):
    /// none while verifying the controller's attach (its operation has no
    /// event recorder), `FailedAttachVolume` for the kubelet's own attach,
    /// `FailedMount` for WaitForAttach. `spec_name` is the volume spec's
    /// name (the PV's).
    pub fn event(&self, spec_name: &str) -> Option<(&'static str, String)> {
        match self {
            AttachError::KubeletAttach => Some((
                "FailedAttachVolume",
                format!("AttachVolume.Attach failed for volume {spec_name:?} : {self}"),
            )),
            AttachError::WaitForAttach(_) => Some((
                "FailedMount",
                format!("MountVolume.WaitForAttach failed for volume {spec_name:?} : {self}"),
            )),
            _ => None,
        }
    }

    /// Whether a change of the Node may clear it: such failures are tried
    /// again as soon as the Node changes (upstream's reconciler re-checks
    /// its precondition every 100 ms against the node lister).
    pub fn waits_for_node(&self) -> bool {
        matches!(
            self,
            AttachError::NotInNodeStatus(_)
                | AttachError::NotReportedInUse
                | AttachError::NotAttached
        )
    }
}

/// Upstream's unique volume name of a CSI volume
/// (`kubernetes.io/csi/<driver>^<volumeHandle>`), as the attach/detach
/// controller writes it in `volumesAttached` and the kubelet in
/// `volumesInUse`.
pub fn unique_name(driver: &str, handle: &str) -> String {
    format!("{PLUGIN_NAME}/{driver}^{handle}")
}

/// Upstream's verification against the Node as the kubelet last saw it
/// (`cached`, from its watch) before asking the API server: the volume
/// must be listed in `volumesAttached` and already reported in
/// `volumesInUse`. `cached` is None before the Node was first seen.
pub fn check_cached_node(cached: Option<&Node>, unique: &str) -> Result<(), AttachError> {
    let Some(status) = cached.and_then(|n| n.status.as_ref()) else {
        return Err(AttachError::NotReportedInUse);
    };
    let attached = status
        .volumes_attached
        .iter()
        .flatten()
        .any(|v| v.name == unique);
    if !attached {
        return Err(AttachError::NotInNodeStatus(unique.to_string()));
    }
    let in_use = status.volumes_in_use.iter().flatten().any(|v| v == unique);
    if !in_use {
        return Err(AttachError::NotReportedInUse);
    }
    Ok(())
}

/// The device path the controller recorded for the volume, if the Node
/// lists it as attached (upstream's final check, on a fresh GET).
pub fn attached_in(node: &Node, unique: &str) -> Result<String, AttachError> {
    node.status
        .iter()
        .flat_map(|s| s.volumes_attached.iter().flatten())
        .find(|v| v.name == unique)
        .map(|v| v.device_path.clone())
        .ok_or(AttachError::NotAttached)
}

/// Upstream `verifyAttachmentStatus` plus WaitForAttach's "not attached":
/// the attachment's metadata once attached.
pub fn attachment_status(
    va: &VolumeAttachment,
    handle: &str,
) -> Result<HashMap<String, String>, AttachError> {
    let name = va.metadata.name.clone().unwrap_or_default();
    if va.metadata.deletion_timestamp.is_some() {
        return Err(AttachError::WaitForAttach(
            "volume attachment is being deleted".into(),
        ));
    }
    let status = va.status.as_ref();
    if status.is_some_and(|s| s.attached) {
        return Ok(status
            .and_then(|s| s.attachment_metadata.clone())
            .unwrap_or_default()
            .into_iter()
            .collect());
    }
    if let Some(e) = status.and_then(|s| s.attach_error.as_ref()) {
        return Err(AttachError::WaitForAttach(
            e.message.clone().unwrap_or_default(),
        ));
    }
    Err(AttachError::WaitForAttach(format!(
        "volume {handle} is not attached for volume attachment {name}"
    )))
}

/// An API error as upstream's client-go prints it (the Status message,
/// e.g. `volumeattachments.storage.k8s.io "x" not found`).
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Upstream's VerifyControllerAttachedVolume then WaitForAttach for a
/// volume whose driver requires attach: the Node as last seen, then a GET
/// of the Node, then a GET of the VolumeAttachment
/// `csi-<sha256(handle + driver + node)>`, whose `attachmentMetadata` is
/// returned (upstream reads it again in MountDevice and SetUp through
/// getPublishContext; one read serves both here).
///
/// `timed`: the check is upstream's VerifyControllerAttachedVolume
/// operation (a volume not yet set up; a republish finds its volume
/// attached in upstream's actual state and verifies nothing).
pub async fn wait_for_attach(
    registry: &super::Registry,
    driver: &str,
    handle: &str,
    timed: bool,
) -> Result<HashMap<String, String>, AttachError> {
    if !registry.controller_attach_detach() {
        return Err(AttachError::KubeletAttach);
    }
    let unique = unique_name(driver, handle);
    let started = std::time::Instant::now();
    let verified = verify_attached(registry, &unique).await;
    // GenerateVerifyControllerAttachedVolumeFunc: a volume not yet in the
    // cached Node's volumesAttached fails before the operation exists (a
    // precondition, not timed); the rest is the operation.
    if timed && !matches!(verified, Err(AttachError::NotInNodeStatus(_))) {
        crate::metrics::certvol::storage_operation(
            &format!("{PLUGIN_NAME}:{driver}"),
            "verify_controller_attached_volume",
            started.elapsed(),
            verified.is_ok(),
        );
    }
    let c = verified?;
    let node_name = registry.node_name();
    let id = attachment_name(handle, driver, &node_name);
    let va = kube::Api::<VolumeAttachment>::all(c)
        .get(&id)
        .await
        .map_err(|e| {
            AttachError::WaitForAttach(format!(
                "volume {handle} has GET error for volume attachment {id}: {}",
                api_message(&e)
            ))
        })?;
    attachment_status(&va, handle)
}

/// The Node as last seen, then a fresh GET, list `unique` as attached;
/// the API client for what follows.
async fn verify_attached(
    registry: &super::Registry,
    unique: &str,
) -> Result<kube::Client, AttachError> {
    check_cached_node(registry.cached_node().as_deref(), unique)?;
    let client = match registry.api_client() {
        Ok(Some(c)) => c,
        Ok(None) => return Err(AttachError::NodeGet("no API server".into())),
        Err(e) => return Err(AttachError::NodeGet(e)),
    };
    let c = client.client().await;
    let node = kube::Api::<Node>::all(c.clone())
        .get(&registry.node_name())
        .await
        .map_err(|e| AttachError::NodeGet(api_message(&e)))?;
    attached_in(&node, unique)?;
    Ok(c)
}

/// Where a volume in use was learnt of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A pod's set-up found that its driver requires attach.
    Desired,
    /// Found on disk at start (a persistent CSI volume's `vol_data.json`
    /// in a pod directory): in use until torn down or found not to need
    /// attaching.
    Reconstructed,
}

/// The volumes to report in `node.status.volumesInUse` (upstream
/// GetVolumesInUse: attachable volumes in the desired state, and those
/// still attached in the actual state until their device is unmounted),
/// by pod UID and unique name.
#[derive(Debug, Default)]
pub struct InUse {
    entries: HashMap<(String, String), Origin>,
    /// The pod directories have been read once since start (upstream's
    /// ReconcilerStatesHasBeenSynced): before that nothing is reported, so
    /// the list on the Node is not cleared by a kubelet that just started.
    synced: bool,
}

impl InUse {
    pub fn mark(&mut self, uid: &str, unique: &str) {
        self.entries
            .insert((uid.to_string(), unique.to_string()), Origin::Desired);
    }

    pub fn mark_reconstructed(&mut self, uid: &str, unique: &str) {
        self.entries
            .entry((uid.to_string(), unique.to_string()))
            .or_insert(Origin::Reconstructed);
    }

    pub fn release(&mut self, uid: &str, unique: &str) {
        self.entries.remove(&(uid.to_string(), unique.to_string()));
    }

    pub fn release_pod(&mut self, uid: &str) {
        self.entries.retain(|(u, _), _| u != uid);
    }

    /// Forgets volumes of pods set-up marked that are neither wanted nor
    /// set up any more (`keep` says which pods are); reconstructed ones
    /// wait for their tear-down.
    pub fn release_unused(&mut self, keep: impl Fn(&str) -> bool) {
        self.entries
            .retain(|(u, _), o| *o == Origin::Reconstructed || keep(u));
    }

    pub fn set_synced(&mut self) {
        self.synced = true;
    }

    /// Sorted unique names; None until synced.
    pub fn list(&self) -> Option<Vec<String>> {
        if !self.synced {
            return None;
        }
        let set: BTreeSet<&String> = self.entries.keys().map(|(_, n)| n).collect();
        Some(set.into_iter().cloned().collect())
    }
}

/// The persistent CSI volumes published into pod directories, from their
/// `vol_data.json` (pod UID, unique name), and the block ones mapped
/// into them: what a restarted kubelet still
/// has in use. Blocking: run on the blocking pool.
pub fn reconstruct(root: &std::path::Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else {
        return out;
    };
    let plugin = PLUGIN_NAME.replace('/', "~");
    for pod in pods.flatten() {
        let uid = pod.file_name().to_string_lossy().into_owned();
        let Ok(vols) = std::fs::read_dir(pod.path().join("volumes").join(&plugin)) else {
            continue;
        };
        for v in vols.flatten() {
            let data = v.path().join(super::mounter::VOL_DATA_FILE);
            let Ok(text) = std::fs::read_to_string(&data) else {
                continue;
            };
            let Ok(j) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            if j["volumeLifecycleMode"] != "Persistent" {
                continue;
            }
            let (Some(d), Some(h)) = (j["driverName"].as_str(), j["volumeHandle"].as_str()) else {
                continue;
            };
            out.push((uid.clone(), unique_name(d, h)));
        }
    }
    // Raw block volumes: the pods' device links and the volumes' data.
    for (uid, d, h) in super::block::reconstruct(root) {
        out.push((uid, unique_name(&d, &h)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{AttachedVolume, NodeStatus};

    #[test]
    fn the_unique_name_and_attachment_name_are_upstreams() {
        assert_eq!(
            unique_name("ebs.csi.aws.com", "vol-0abc"),
            "kubernetes.io/csi/ebs.csi.aws.com^vol-0abc"
        );
        // sha256("vol-1" "fake.csi" "node-a") computed with sha256sum:
        // printf 'vol-1fake.csinode-a' | sha256sum
        assert_eq!(
            attachment_name("vol-1", "fake.csi", "node-a"),
            "csi-25bf2cab13f233c69a395fa07add88281de73dda39f1349e4f36c981f9289684"
        );
    }

    fn node(attached: &[&str], in_use: &[&str]) -> Node {
        Node {
            status: Some(NodeStatus {
                volumes_attached: Some(
                    attached
                        .iter()
                        .map(|n| AttachedVolume {
                            name: n.to_string(),
                            device_path: format!("/dev/{n}"),
                        })
                        .collect(),
                ),
                volumes_in_use: Some(in_use.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_cached_node_must_list_the_volume_attached_and_in_use() {
        let u = "kubernetes.io/csi/d^h";
        assert_eq!(
            check_cached_node(None, u),
            Err(AttachError::NotReportedInUse)
        );
        assert_eq!(
            check_cached_node(Some(&node(&[], &[u])), u),
            Err(AttachError::NotInNodeStatus(u.into()))
        );
        assert_eq!(
            check_cached_node(Some(&node(&[u], &[])), u),
            Err(AttachError::NotReportedInUse)
        );
        check_cached_node(Some(&node(&[u], &[u])), u).unwrap();
        assert_eq!(
            attached_in(&node(&[u], &[]), u).unwrap(),
            format!("/dev/{u}")
        );
        assert_eq!(
            attached_in(&node(&["other"], &[]), u),
            Err(AttachError::NotAttached)
        );
        // Only these wait for the Node; none of them is an event.
        for e in [
            AttachError::NotInNodeStatus(u.into()),
            AttachError::NotReportedInUse,
            AttachError::NotAttached,
        ] {
            assert!(e.waits_for_node() && e.event("pv").is_none(), "{e}");
        }
        assert_eq!(
            AttachError::NotInNodeStatus(u.into()).to_string(),
            "volume kubernetes.io/csi/d^h is not yet in node's status"
        );
    }

    /// GenerateVerifyControllerAttachedVolumeFunc's operation: a volume
    /// not yet in the cached Node's volumesAttached is a precondition (no
    /// sample); one attached but not reported in use is a failed
    /// operation, timed.
    #[tokio::test]
    async fn the_attach_verification_is_timed_once_the_node_lists_the_volume() {
        let registry = super::super::Registry::default();
        registry.set_controller_attach_detach(true);
        let driver = "verify-timing.csi";
        let unique = unique_name(driver, "h");
        let count = |status| {
            crate::metrics::certvol::storage_operation_count(
                &format!("kubernetes.io/csi:{driver}"),
                "verify_controller_attached_volume",
                status,
            )
        };
        let (tx, rx) = tokio::sync::watch::channel(Some(node(&[], &[])));
        let follower = registry.clone();
        let follow = tokio::spawn(async move { follower.follow_node(rx).await });
        let seen = |want: usize| {
            let registry = registry.clone();
            async move {
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    let n = registry.cached_node();
                    let attached = n
                        .as_ref()
                        .and_then(|n| n.status.as_ref()?.volumes_attached.as_ref().map(Vec::len));
                    if attached == Some(want) {
                        return;
                    }
                    assert!(tokio::time::Instant::now() < deadline, "node not seen");
                    tokio::task::yield_now().await;
                }
            }
        };
        seen(0).await;
        assert_eq!(
            wait_for_attach(&registry, driver, "h", true).await,
            Err(AttachError::NotInNodeStatus(unique.clone()))
        );
        assert_eq!((count("success"), count("fail-unknown")), (0, 0));
        tx.send(Some(node(&[&unique], &[]))).unwrap();
        seen(1).await;
        assert_eq!(
            wait_for_attach(&registry, driver, "h", true).await,
            Err(AttachError::NotReportedInUse)
        );
        assert_eq!((count("success"), count("fail-unknown")), (0, 1));
        drop(tx);
        follow.await.unwrap();
    }

    fn va(status: serde_json::Value) -> VolumeAttachment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-x"},
            "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_attachment_metadata_is_the_publish_context_once_attached() {
        let m = attachment_status(
            &va(serde_json::json!({"attached": true,
                "attachmentMetadata": {"devicePath": "/dev/xvdf"}})),
            "h",
        )
        .unwrap();
        assert_eq!(
            m,
            HashMap::from([("devicePath".into(), "/dev/xvdf".into())])
        );
        let e = attachment_status(
            &va(serde_json::json!({"attached": false,
                "attachError": {"message": "disk is on fire", "time": "2026-01-01T00:00:00Z"}})),
            "h",
        )
        .unwrap_err();
        assert_eq!(
            e.event("pv-1"),
            Some((
                "FailedMount",
                "MountVolume.WaitForAttach failed for volume \"pv-1\" : disk is on fire".into()
            ))
        );
        assert!(!e.waits_for_node());
        let e = attachment_status(&va(serde_json::json!({"attached": false})), "h").unwrap_err();
        assert_eq!(
            e.to_string(),
            "volume h is not attached for volume attachment csi-x"
        );
        let mut deleting = va(serde_json::json!({"attached": true}));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(
            attachment_status(&deleting, "h").unwrap_err().to_string(),
            "volume attachment is being deleted"
        );
        assert_eq!(
            AttachError::KubeletAttach.event("pv-1"),
            Some((
                "FailedAttachVolume",
                "AttachVolume.Attach failed for volume \"pv-1\" : attaching volumes from the kubelet is not supported".into()
            ))
        );
    }

    #[tokio::test]
    async fn with_controller_attach_detach_off_the_kubelet_refuses_to_attach() {
        let r = super::super::Registry::default();
        assert!(r.controller_attach_detach(), "on by default, as upstream");
        r.set_controller_attach_detach(false);
        assert_eq!(
            wait_for_attach(&r, "d", "h", true).await,
            Err(AttachError::KubeletAttach)
        );
        // On, without a Node seen yet: waiting, no API call needed.
        r.set_controller_attach_detach(true);
        assert_eq!(
            wait_for_attach(&r, "d", "h", true).await,
            Err(AttachError::NotReportedInUse)
        );
    }

    #[test]
    fn volumes_in_use_are_sorted_unique_and_reported_once_synced() {
        let mut u = InUse::default();
        u.mark("p1", "kubernetes.io/csi/d^b");
        u.mark("p2", "kubernetes.io/csi/d^b");
        u.mark("p2", "kubernetes.io/csi/d^a");
        u.mark_reconstructed("gone", "kubernetes.io/csi/d^c");
        assert_eq!(
            u.list(),
            None,
            "nothing before the pod directories were read"
        );
        u.set_synced();
        assert_eq!(
            u.list().unwrap(),
            vec![
                "kubernetes.io/csi/d^a",
                "kubernetes.io/csi/d^b",
                "kubernetes.io/csi/d^c"
            ]
        );
        // p1 is torn down: b stays for p2.
        u.release("p1", "kubernetes.io/csi/d^b");
        assert_eq!(u.list().unwrap().len(), 3);
        // p2 is neither wanted nor set up any more; the reconstructed one
        // waits for its tear-down.
        u.release_unused(|uid| uid == "p1");
        assert_eq!(u.list().unwrap(), vec!["kubernetes.io/csi/d^c"]);
        u.release_pod("gone");
        assert_eq!(u.list().unwrap(), Vec::<String>::new());
    }

    #[test]
    fn persistent_volumes_in_pod_directories_are_reconstructed() {
        let root = crate::testutil::tempdir("csi-attach-reconstruct");
        let dir = |uid: &str, vol: &str| {
            let d = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{vol}"));
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        std::fs::write(
            dir("u1", "pv-1").join("vol_data.json"),
            r#"{"driverName":"d","volumeHandle":"h1","volumeLifecycleMode":"Persistent"}"#,
        )
        .unwrap();
        std::fs::write(
            dir("u2", "inline").join("vol_data.json"),
            r#"{"driverName":"d","volumeHandle":"csi-x","volumeLifecycleMode":"Ephemeral"}"#,
        )
        .unwrap();
        std::fs::write(dir("u3", "junk").join("vol_data.json"), "not json").unwrap();
        assert_eq!(
            reconstruct(&root),
            vec![("u1".to_string(), "kubernetes.io/csi/d^h1".to_string())]
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
