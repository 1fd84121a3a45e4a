//! Online expansion of published CSI persistent volumes (upstream
//! `node_expander.go`, `csi_expander.go` and the PVC status helpers of
//! `pkg/volume/util/resize_util.go`): once the external-resizer grew the PV
//! and handed over to the node (`status.allocatedResourceStatuses.storage:
//! NodeResizePending`), the kubelet marks the claim NodeResizeInProgress,
//! calls NodeExpandVolume on a driver with the EXPAND_VOLUME node
//! capability (with the PV's `nodeExpandSecretRef` secret, and for a raw
//! block volume its publish path and a Block capability), and records the new size in the claim's
//! `status.capacity`, clearing the resize status and conditions.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use tracing::{debug, info, warn};

use super::client::{NodeService, VolumeRequest, CSI_TIMEOUT};
use super::mounter::Published;
use super::Registry;

/// `allocatedResourceStatuses` values the kubelet acts on.
pub const NODE_RESIZE_PENDING: &str = "NodeResizePending";
pub const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
/// Upstream's knownResizeConditions, removed once the resize is done.
const RESIZE_CONDITIONS: [&str; 4] = [
    "FileSystemResizePending",
    "Resizing",
    "ControllerResizeError",
    "NodeResizeError",
];

/// The size to expand a published volume to, if the node's part of a
/// resize is due: the PV's capacity is above the claim's
/// `status.capacity` and the resizer handed over (upstream runPreCheck:
/// NodeResizePending or NodeResizeInProgress; with no resize status the
/// controller has not finished and the kubelet leaves it).
pub fn node_expansion_due(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Option<(i64, String)> {
    let pv_q = pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
    let pv_bytes = crate::cm::quantity::parse_bytes(&pv_q.0).ok()?;
    let status = pvc.status.as_ref();
    let claim_bytes = status
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| crate::cm::quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0);
    if pv_bytes <= claim_bytes {
        return None;
    }
    let resize = status
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .and_then(|m| m.get("storage"))
        .map(String::as_str);
    matches!(resize, Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS))
        .then(|| (pv_bytes, pv_q.0.clone()))
}

/// Upstream MarkNodeExpansionInProgress as the strategic merge patch
/// PatchPVCStatus sends (with the resourceVersion as precondition).
pub fn in_progress_patch(rv: &str) -> Value {
    json!({
        "metadata": {"resourceVersion": rv},
        "status": {"allocatedResourceStatuses": {"storage": NODE_RESIZE_IN_PROGRESS}},
    })
}

/// Upstream MarkFSResizeFinished: the new capacity, the storage resize
/// status gone (the map too when it held only that), the resize
/// conditions deleted (by their merge key, with the order of those left).
pub fn finished_patch(pvc: &PersistentVolumeClaim, new_size: &str) -> Value {
    let rv = pvc.metadata.resource_version.clone().unwrap_or_default();
    let status = pvc.status.clone().unwrap_or_default();
    let mut st = json!({"capacity": {"storage": new_size}});
    if let Some(m) = &status.allocated_resource_statuses {
        if m.contains_key("storage") {
            st["allocatedResourceStatuses"] = if m.len() == 1 {
                Value::Null
            } else {
                json!({"storage": null})
            };
        }
    }
    let conds = status.conditions.unwrap_or_default();
    let (gone, kept): (Vec<_>, Vec<_>) = conds
        .iter()
        .partition(|c| RESIZE_CONDITIONS.contains(&c.type_.as_str()));
    if !gone.is_empty() {
        if kept.is_empty() {
            st["conditions"] = Value::Null;
        } else {
            st["conditions"] = gone
                .iter()
                .map(|c| json!({"type": c.type_, "$patch": "delete"}))
                .collect();
            st["$setElementOrder/conditions"] =
                kept.iter().map(|c| json!({"type": c.type_})).collect();
        }
    }
    json!({"metadata": {"resourceVersion": rv}, "status": st})
}

/// Upstream MarkNodeExpansionFailedCondition (no resourceVersion check).
fn failed_patch(error: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": "NodeResizeError",
        "status": "True",
        "lastTransitionTime": serde_json::to_value(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
        )
        .unwrap_or(Value::Null),
        "message": format!("failed to expand pvc with {error}"),
    }]}})
}

/// Upstream's MarkNodeExpansionFailedCondition; a failure to patch is
/// logged only (the expansion's own error is what the caller reports).
async fn mark_failed(pvcs: &Api<PersistentVolumeClaim>, claim: &str, msg: &str) {
    if let Err(pe) = pvcs
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Strategic(failed_patch(msg)),
        )
        .await
    {
        warn!(claim = %claim, error = %api_message(&pe), "MountVolume.NodeExpandVolume failed to mark node expansion as failed");
    }
}

fn claim_ref(pvc: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: pvc.metadata.name.clone(),
        namespace: pvc.metadata.namespace.clone(),
        uid: pvc.metadata.uid.clone(),
        resource_version: pvc.metadata.resource_version.clone(),
        ..Default::default()
    }
}

fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Upstream's online expansion of a published volume of `pod` through
/// claim `claim` (nothing when the node's part is not due). Read-only
/// volumes are not expanded (FileSystemResizeFailed, as upstream); a
/// driver without EXPAND_VOLUME is left alone. `due` is set when the
/// claim's size asks for the node's part: from then on this is upstream's
/// `volume_fs_resize` operation (its reconciler generates it only then).
pub async fn expand_in_use(
    registry: &Registry,
    objects: &crate::objects::ObjectManager,
    pod: &Pod,
    published: &Published,
    claim: &str,
    read_only: bool,
    due: &mut Option<std::time::Instant>,
) -> Result<(), String> {
    let Some(client) = registry.api_client()? else {
        return Ok(());
    };
    let c = client.client().await;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), ns);
    let pvc = pvcs.get(claim).await.map_err(|e| {
        format!(
            "mountVolume.NodeExpandVolume get PVC failed : {}",
            api_message(&e)
        )
    })?;
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let pv = Api::<PersistentVolume>::all(c)
        .get(&pv_name)
        .await
        .map_err(|e| api_message(&e))?;
    let Some((bytes, size)) = node_expansion_due(&pvc, &pv) else {
        return Ok(());
    };
    *due = Some(std::time::Instant::now());
    let node = registry.node_name();
    if read_only {
        let msg = format!(
            "MountVolume.NodeExpandVolume failed for volume {pv_name:?} requested read-only file system"
        );
        crate::events::pod(
            pod,
            None,
            crate::events::WARNING,
            "FileSystemResizeFailed",
            msg.clone(),
        );
        crate::events::record(
            claim_ref(&pvc),
            crate::events::WARNING,
            "FileSystemResizeFailed",
            msg,
        );
        return Ok(());
    }
    let d = registry
        .get(&published.driver)
        .ok_or_else(|| Registry::not_found(&published.driver))?;
    let service = NodeService::new(&d.endpoint, CSI_TIMEOUT);
    let caps = service.capabilities().await.map_err(|e| {
        format!("Expander.NodeExpand failed to check if node supports expansion : {e}")
    })?;
    if !caps.expand_volume() {
        debug!(driver = %published.driver, volume = %pv_name, "the driver has no EXPAND_VOLUME node capability; nothing to do on the node");
        return Ok(());
    }
    let pvc = pvcs
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Strategic(in_progress_patch(
                pvc.metadata.resource_version.as_deref().unwrap_or_default(),
            )),
        )
        .await
        .map_err(|e| {
            format!(
                "MountVolume.NodeExpandVolume failed to mark node expansion in progress: {}",
                api_message(&e)
            )
        })?;
    let src = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
    // Upstream's expander.go: the PV's nodeExpandSecretRef, fetched as the
    // stage and publish secrets are; a secret that cannot be read fails the
    // expansion (and is marked on the claim as any node expansion error).
    let secrets = match src
        .and_then(|s| s.node_expand_secret_ref.as_ref())
        .map(super::mounter::secret_ref)
    {
        None => Default::default(),
        Some((ns, n)) => match super::mounter::credentials(objects, &ns, &n).await {
            Ok(s) => s,
            Err(e) => {
                let msg =
                    format!("expander.NodeExpand failed to get NodeExpandSecretRef {ns}/{n}: {e}");
                mark_failed(&pvcs, claim, &msg).await;
                return Err(msg);
            }
        },
    };
    let req = VolumeRequest {
        volume_id: published.volume_id.clone(),
        fs_type: src.and_then(|s| s.fs_type.clone()).unwrap_or_default(),
        mount_flags: pv
            .spec
            .as_ref()
            .and_then(|s| s.mount_options.clone())
            .unwrap_or_default(),
        secrets,
        // A block volume: the publish path and a Block capability
        // (upstream's fsTypeBlockName for a non-filesystem volume).
        block: published.block,
        ..Default::default()
    };
    let staging = match &published.staging {
        Some(g) if caps.stage_unstage() => g.to_string_lossy().into_owned(),
        _ => String::new(),
    };
    if let Err(e) = service
        .expand(&req, &published.target.to_string_lossy(), &staging, bytes)
        .await
    {
        let msg = format!("Expander.NodeExpand failed to expand the volume : {e}");
        if e.is_final() {
            mark_failed(&pvcs, claim, &msg).await;
        }
        return Err(msg);
    }
    let msg = format!("MountVolume.NodeExpandVolume succeeded for volume {pv_name:?} {node}");
    info!(pod = %pod.metadata.name.as_deref().unwrap_or_default(), volume = %pv_name, size = %size, "{msg}");
    crate::events::pod(
        pod,
        None,
        crate::events::NORMAL,
        "FileSystemResizeSuccess",
        msg.clone(),
    );
    crate::events::record(
        claim_ref(&pvc),
        crate::events::NORMAL,
        "FileSystemResizeSuccess",
        msg,
    );
    pvcs.patch_status(
        claim,
        &PatchParams::default(),
        &Patch::Strategic(finished_patch(&pvc, &size)),
    )
    .await
    .map_err(|e| {
        format!(
            "mountVolume.NodeExpandVolume update pvc status failed: {}",
            api_message(&e)
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvc(v: Value) -> PersistentVolumeClaim {
        serde_json::from_value(v).unwrap()
    }
    fn pv(cap: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pv"},
            "spec": {"capacity": {"storage": cap}}}))
        .unwrap()
    }

    #[test]
    fn the_node_expands_only_a_grown_pv_the_resizer_handed_over() {
        let claim = |status: Value| pvc(json!({"metadata": {"name": "c"}, "status": status}));
        let pending = claim(json!({"capacity": {"storage": "1Gi"},
            "allocatedResourceStatuses": {"storage": "NodeResizePending"}}));
        assert_eq!(
            node_expansion_due(&pending, &pv("2Gi")),
            Some((2 << 30, "2Gi".to_string()))
        );
        // Not grown.
        assert_eq!(node_expansion_due(&pending, &pv("1Gi")), None);
        // The controller has not handed over, or the node failed for good.
        for s in ["", "ControllerResizeInProgress", "NodeResizeFailed"] {
            let c = claim(json!({"capacity": {"storage": "1Gi"},
                "allocatedResourceStatuses": {"storage": s}}));
            assert_eq!(node_expansion_due(&c, &pv("2Gi")), None, "{s}");
        }
        let none = claim(json!({"capacity": {"storage": "1Gi"}}));
        assert_eq!(node_expansion_due(&none, &pv("2Gi")), None);
        let in_progress = claim(json!({"capacity": {"storage": "1Gi"},
            "allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}));
        assert!(node_expansion_due(&in_progress, &pv("2Gi")).is_some());
    }

    #[test]
    fn the_finished_patch_sets_capacity_and_clears_resize_status_and_conditions() {
        let c = pvc(json!({"metadata": {"name": "c", "resourceVersion": "42"},
            "status": {"capacity": {"storage": "1Gi"},
                "allocatedResourceStatuses": {"storage": "NodeResizeInProgress"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True"}]}}));
        assert_eq!(
            finished_patch(&c, "2Gi"),
            json!({"metadata": {"resourceVersion": "42"}, "status": {
                "capacity": {"storage": "2Gi"},
                "allocatedResourceStatuses": null,
                "conditions": null}})
        );
        // Other conditions and statuses stay: deletions by merge key.
        let c = pvc(json!({"metadata": {"name": "c", "resourceVersion": "7"},
            "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress", "x": "y"},
                "conditions": [{"type": "Other", "status": "True"},
                    {"type": "NodeResizeError", "status": "True"}]}}));
        assert_eq!(
            finished_patch(&c, "3Gi"),
            json!({"metadata": {"resourceVersion": "7"}, "status": {
                "capacity": {"storage": "3Gi"},
                "allocatedResourceStatuses": {"storage": null},
                "conditions": [{"type": "NodeResizeError", "$patch": "delete"}],
                "$setElementOrder/conditions": [{"type": "Other"}]}})
        );
        assert_eq!(
            in_progress_patch("9"),
            json!({"metadata": {"resourceVersion": "9"},
                "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}})
        );
        assert_eq!(
            failed_patch("boom")["status"]["conditions"][0]["message"],
            "failed to expand pvc with boom"
        );
    }
}
