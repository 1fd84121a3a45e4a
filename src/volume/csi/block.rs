//! Raw block CSI volumes (`volumeMode: Block` PVs of a CSI driver):
//! upstream's csiBlockMapper (`pkg/volume/csi/csi_block.go`,
//! `NewBlockVolumeMapper` in `csi_plugin.go`) as the operation generator
//! drives it (`GenerateMapVolumeFunc`, `GenerateUnmapVolumeFunc`,
//! `GenerateUnmapDeviceFunc` in `operation_generator.go`).
//!
//! Set-up, in upstream's order:
//! 1. `vol_data.json` in `<root>/plugins/kubernetes.io/csi/volumeDevices/<spec>/data`
//!    (NewBlockVolumeMapper; read back at tear-down after a restart);
//! 2. SetUpDevice: for a driver with STAGE_UNSTAGE_VOLUME, the kubelet makes
//!    the staging directory `volumeDevices/staging/<spec>` and calls
//!    NodeStageVolume there with a Block capability;
//! 3. MapPodDevice: the kubelet makes `volumeDevices/publish/<spec>` and
//!    calls NodePublishVolume with the publish path
//!    `volumeDevices/publish/<spec>/<pod uid>` (the driver creates that file
//!    and puts the device there) and the staging path;
//! 4. MapBlockVolume (`volume/block.rs`): the publish path bound onto
//!    `volumeDevices/<spec>/dev/<pod uid>` (the global map path) and linked
//!    as `<root>/pods/<uid>/volumeDevices/kubernetes.io~csi/<spec>`, which
//!    CRI gets as the device's host path.
//!
//! Tear-down: UnmapBlockVolume (the link, the bind), NodeUnpublishVolume
//! (UnmapPodDevice); once no pod maps the volume, TearDownDevice:
//! NodeUnstageVolume when the staging path is there and the driver stages,
//! then the plugin's directories for the volume (cleanupOrphanDeviceFiles),
//! never one that still has a mount in it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use tracing::{debug, info};

use super::client::{NodeService, VolumeRequest};
use super::mounter::{self, Published, SetUpError, VOL_DATA_FILE};
use super::{log_msg, Registry, PLUGIN_NAME};
use crate::objects::ObjectManager;
use crate::volume::block::{self as blk, Mapped};

/// File-system work may take this long.
const FS_DEADLINE: Duration = Duration::from_secs(30);

/// `<root>/plugins/kubernetes.io/csi/volumeDevices` (upstream's
/// GetVolumeDevicePluginDir for the CSI plugin).
pub fn devices_dir(root: &Path) -> PathBuf {
    root.join("plugins").join(PLUGIN_NAME).join("volumeDevices")
}

/// `volumeDevices/staging/<spec>`: NodeStageVolume's staging path.
pub fn staging_path(root: &Path, spec: &str) -> PathBuf {
    devices_dir(root).join("staging").join(spec)
}

/// `volumeDevices/publish/<spec>`: the directory of the publish paths.
pub fn publish_dir(root: &Path, spec: &str) -> PathBuf {
    devices_dir(root).join("publish").join(spec)
}

/// `volumeDevices/publish/<spec>/<pod uid>`: NodePublishVolume's target.
pub fn publish_path(root: &Path, spec: &str, uid: &str) -> PathBuf {
    publish_dir(root, spec).join(uid)
}

/// `volumeDevices/<spec>`: the volume's own directory (`data`, `dev`).
pub fn volume_dir(root: &Path, spec: &str) -> PathBuf {
    devices_dir(root).join(spec)
}

/// `volumeDevices/<spec>/data`: where `vol_data.json` lives.
pub fn data_dir(root: &Path, spec: &str) -> PathBuf {
    volume_dir(root, spec).join("data")
}

/// `volumeDevices/<spec>/dev`: the global map path (one bind per pod).
pub fn global_map_path(root: &Path, spec: &str) -> PathBuf {
    volume_dir(root, spec).join("dev")
}

/// `<root>/pods/<uid>/volumeDevices/kubernetes.io~csi`.
pub fn pod_device_map_dir(root: &Path, uid: &str) -> PathBuf {
    blk::plugin_device_map_dir(root, uid, blk::CSI_PLUGIN_DIR)
}

/// The `vol_data.json` of NewBlockVolumeMapper (no lifecycle mode: block
/// volumes are persistent only).
fn vol_data(spec: &str, handle: &str, driver: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "specVolID": spec,
        "volumeHandle": handle,
        "driverName": driver,
        "nodeName": node,
        "attachmentID": mounter::attachment_name(handle, driver, node),
    })
}

fn step(step: &'static str) -> impl FnOnce(String) -> SetUpError {
    move |error| SetUpError::Map { step, error }
}

/// Sets up a block CSI persistent volume for `pod` (see the module's
/// note); `stage` is false when the volume is set up already for this pod
/// (upstream stages once per device). Returns the published volume (for
/// tear-down and expansion) and the pod's mapping.
pub async fn set_up(
    registry: &Registry,
    objects: &ObjectManager,
    root: &Path,
    pod: &Pod,
    pv: &PersistentVolume,
    read_only: bool,
    stage: bool,
) -> Result<(Published, Mapped), SetUpError> {
    const INIT: &str = "MapVolume.NewBlockVolumeMapper initialization";
    const SET_UP: &str = "MapVolume.SetUpDevice";
    const MAP_POD: &str = "MapVolume.MapPodDevice";
    let spec = pv.spec.as_ref().ok_or("the PV has no spec")?;
    let src = spec.csi.as_ref().ok_or("the PV has no CSI source")?;
    let spec_name = pv.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    // Both name paths below the plugin's directories.
    blk::check_name(&spec_name)
        .and_then(|_| blk::check_name(&uid))
        .map_err(|e| step(INIT)(e.to_string()))?;
    let service = mounter::node_service(registry, &src.driver).map_err(step(SET_UP))?;
    let object = registry.csi_driver(&src.driver).await.map_err(|e| {
        step(MAP_POD)(log_msg(format!(
            "blockMapper.publishVolumeForBlock failed to assemble volume attributes: {e}"
        )))
    })?;
    let publish_context = mounter::attachment_context(
        registry,
        &object,
        &uid,
        &src.driver,
        &src.volume_handle,
        true,
    )
    .await?;

    // NewBlockVolumeMapper: the volume's data for tear-down.
    let data = vol_data(
        &spec_name,
        &src.volume_handle,
        &src.driver,
        &registry.node_name(),
    );
    let dir = data_dir(root, &spec_name);
    crate::blocking::try_run(
        format!("create {}", dir.display()),
        FS_DEADLINE,
        move || -> std::io::Result<()> {
            mounter::make_dirs(&dir)?;
            std::fs::write(dir.join(VOL_DATA_FILE), data.to_string())
        },
    )
    .await
    .map_err(|e| {
        step(INIT)(log_msg(format!(
            "csi.NewBlockVolumeMapper failed to save volume info data: {e}"
        )))
    })?;

    // Upstream's "better AccessModes mapping" TODO: the PV's first mode.
    let access_mode = spec
        .access_modes
        .as_ref()
        .and_then(|m| m.first().cloned())
        .unwrap_or_else(|| "ReadWriteOnce".into());
    let attributes: HashMap<String, String> = src
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut req = VolumeRequest {
        volume_id: src.volume_handle.clone(),
        read_only: read_only || src.read_only.unwrap_or(false),
        access_mode,
        publish_context,
        volume_context: attributes,
        block: true,
        ..Default::default()
    };
    let staging = staging_path(root, &spec_name);
    if stage {
        stage_volume(&service, objects, src, &req, &staging)
            .await
            .map_err(step(SET_UP))?;
    }

    // MapPodDevice: pod information as for a mount (upstream merges it
    // into the attributes when the CSIDriver asks); the publish secrets.
    if object.pod_info_on_mount() {
        req.volume_context
            .extend(mounter::pod_info_attrs(pod, false));
    }
    req.secrets = match src.node_publish_secret_ref.as_ref().map(mounter::secret_ref) {
        None => HashMap::new(),
        Some((ns, n)) => mounter::credentials(objects, &ns, &n)
            .await
            .map_err(|e| {
                step(MAP_POD)(log_msg(format!(
                    "blockMapper.publishVolumeForBlock failed to get NodePublishSecretRef {ns}/{n}: {e}"
                )))
            })?,
    };
    let target = publish_path(root, &spec_name, &uid);
    let parent = publish_dir(root, &spec_name);
    crate::blocking::try_run(
        format!("create {}", parent.display()),
        FS_DEADLINE,
        move || mounter::make_dirs(&parent),
    )
    .await
    .map_err(|e| {
        step(MAP_POD)(log_msg(format!(
            "blockMapper.publishVolumeForBlock failed to create dir: {e}"
        )))
    })?;
    // Upstream hands the staging path over whether or not the driver
    // stages.
    service
        .publish(&req, &staging.to_string_lossy(), &target.to_string_lossy())
        .await
        .map_err(|e| step(MAP_POD)(e.to_string()))?;
    info!(driver = %src.driver, volume_id = %src.volume_handle, target = %target.display(), "CSI block volume published");

    // MapBlockVolume: the driver's device bound for the pod and linked.
    let (global, links, t) = (
        global_map_path(root, &spec_name),
        pod_device_map_dir(root, &uid),
        target.clone(),
    );
    let (u, n) = (uid.clone(), spec_name.clone());
    let mapped = crate::blocking::try_run(
        format!("map block volume {spec_name} for pod {uid}"),
        FS_DEADLINE,
        move || blk::map_at(&global, &links, &u, &n, &t).map_err(|e| e.to_string()),
    )
    .await
    .map_err(step("MapVolume.MapBlockVolume"))?;
    let published = Published {
        driver: src.driver.clone(),
        volume_id: src.volume_handle.clone(),
        target,
        staging: Some(staging),
        // Upstream republishes block volumes too: the CSI plugin's
        // RequiresRemount (csi_plugin.go) asks only the CSIDriver's
        // requiresRepublish, MarkRemountRequired marks every volume of the
        // synced pod, and MountVolume (operation_executor.go) runs
        // GenerateMapVolumeFunc again for a Block one, which skips
        // SetUpDevice (the device is globally mounted) but calls
        // MapPodDevice (NodePublishVolume) and MapBlockVolume each time.
        republish: object.requires_republish(),
        block: true,
    };
    Ok((published, mapped))
}

/// SetUpDevice's stageVolumeForBlock: nothing for a driver without
/// STAGE_UNSTAGE_VOLUME; else the stage secrets, the staging directory
/// (the kubelet's to make) and NodeStageVolume.
async fn stage_volume(
    service: &NodeService,
    objects: &ObjectManager,
    src: &k8s_openapi::api::core::v1::CSIPersistentVolumeSource,
    req: &VolumeRequest,
    staging: &Path,
) -> Result<(), String> {
    let stages = service.supports_stage_unstage().await.map_err(|e| {
        log_msg(format!(
            "blockMapper.stageVolumeForBlock failed to check STAGE_UNSTAGE_VOLUME capability: {e}"
        ))
    })?;
    if !stages {
        debug!("{}", log_msg("blockMapper.stageVolumeForBlock STAGE_UNSTAGE_VOLUME capability not set. Skipping MountDevice..."));
        return Ok(());
    }
    let mut req = req.clone();
    if let Some((ns, n)) = src.node_stage_secret_ref.as_ref().map(mounter::secret_ref) {
        req.secrets = mounter::credentials(objects, &ns, &n)
            .await
            .map_err(|e| format!("failed to get NodeStageSecretRef {ns}/{n}: {e}"))?;
    }
    let dir = staging.to_path_buf();
    crate::blocking::try_run(
        format!("create {}", dir.display()),
        FS_DEADLINE,
        move || mounter::make_dirs(&dir),
    )
    .await
    .map_err(|e| {
        log_msg(format!(
            "blockMapper.stageVolumeForBlock failed to create dir {}: {e}",
            staging.display()
        ))
    })?;
    service
        .stage(&req, &staging.to_string_lossy())
        .await
        .map_err(|e| e.to_string())
}

/// Where a block volume's figures are asked for (NodeGetVolumeStats'
/// volume path): the pod's bind under the global map path,
/// `volumeDevices/<spec>/dev/<pod uid>`, as upstream's NewBlockVolumeMapper
/// hands NewMetricsCsi `GetGlobalMapPath + "/" + podUID` (csi_plugin.go).
pub fn stats_path(p: &Published) -> Option<PathBuf> {
    let (devices, spec, uid) = parts(p)?;
    Some(devices.join(spec).join("dev").join(uid))
}

/// The paths of a published block volume, from its publish path
/// `volumeDevices/publish/<spec>/<uid>`: (root's volumeDevices dir, spec,
/// uid).
fn parts(p: &Published) -> Option<(PathBuf, String, String)> {
    let uid = p.target.file_name()?.to_str()?.to_string();
    let dir = p.target.parent()?;
    let spec = dir.file_name()?.to_str()?.to_string();
    let devices = dir.parent()?.parent()?.to_path_buf();
    Some((devices, spec, uid))
}

/// Upstream's UnmapVolume of a block CSI volume for one pod: the pod's
/// mapping (`mapped`, or what is on disk after a restart), then
/// NodeUnpublishVolume of the publish path, timed as the driver's
/// `unmap_volume` (GenerateUnmapVolumeFunc); then UnmapDevice when no other
/// pod maps the volume (`still_used` false), timed as its `unmap_device`
/// (GenerateUnmapDeviceFunc: TearDownDevice and the global map path).
pub async fn tear_down(
    registry: &Registry,
    p: &Published,
    mapped: Option<std::sync::Arc<Mapped>>,
    still_used: bool,
) -> Result<(), String> {
    let plugin = format!("{PLUGIN_NAME}:{}", p.driver);
    let started = std::time::Instant::now();
    let r = unmap_volume(registry, p, mapped).await;
    crate::metrics::certvol::storage_operation(
        &plugin,
        "unmap_volume",
        started.elapsed(),
        r.is_ok(),
    );
    let service = r?;
    if !still_used {
        let (devices, spec, _) = parts(p)
            .ok_or_else(|| format!("{} is not a CSI block publish path", p.target.display()))?;
        let started = std::time::Instant::now();
        let r = tear_down_device(&service, &p.volume_id, &devices, &spec).await;
        crate::metrics::certvol::storage_operation(
            &plugin,
            "unmap_device",
            started.elapsed(),
            r.is_ok(),
        );
        r?;
    }
    Ok(())
}

/// UnmapBlockVolume and UnmapPodDevice; the driver's client for what
/// follows.
async fn unmap_volume(
    registry: &Registry,
    p: &Published,
    mapped: Option<std::sync::Arc<Mapped>>,
) -> Result<NodeService, String> {
    let (devices, spec, uid) = parts(p)
        .ok_or_else(|| format!("{} is not a CSI block publish path", p.target.display()))?;
    let root_link = p
        .target
        .ancestors()
        .nth(7)
        .map(|root| pod_device_map_dir(root, &uid).join(&spec));
    let bind = devices.join(&spec).join("dev").join(&uid);
    crate::blocking::try_run(
        format!("unmap block volume {spec} of pod {uid}"),
        FS_DEADLINE,
        move || match (mapped, root_link) {
            (Some(m), _) => blk::unmap_for(&m, None).map_err(|e| e.to_string()),
            (None, Some(link)) => blk::unmap_paths(&link, &bind, None).map_err(|e| e.to_string()),
            (None, None) => Ok(()),
        },
    )
    .await
    .map_err(|e| format!("UnmapVolume.UnmapBlockVolume failed: {e}"))?;
    let service = mounter::client_for(registry, &p.driver, "blockMapper.UnmapPodDevice")?;
    // Even a publish path that is not there is unpublished: an earlier
    // publish may have timed out (upstream).
    service
        .unpublish(&p.volume_id, &p.target.to_string_lossy())
        .await
        .map_err(|e| {
            log_msg(format!(
                "UnmapVolume.UnmapPodDevice failed: blockMapper.unpublishVolumeForBlock failed: {e}"
            ))
        })?;
    info!(driver = %p.driver, volume_id = %p.volume_id, target = %p.target.display(), "CSI block volume unpublished");
    Ok(service)
}

/// TearDownDevice and upstream's cleanupOrphanDeviceFiles.
async fn tear_down_device(
    service: &NodeService,
    volume_id: &str,
    devices: &Path,
    spec: &str,
) -> Result<(), String> {
    let staging = devices.join("staging").join(spec);
    let s = staging.clone();
    let staged = crate::blocking::try_run(
        format!("stat {}", staging.display()),
        FS_DEADLINE,
        move || Ok::<_, String>(std::fs::symlink_metadata(&s).is_ok()),
    )
    .await?;
    if staged {
        let stages = service.supports_stage_unstage().await.map_err(|e| {
            log_msg(format!("blockMapper.unstageVolumeForBlock failed to check STAGE_UNSTAGE_VOLUME capability: {e}"))
        })?;
        if stages {
            service
                .unstage(volume_id, &staging.to_string_lossy())
                .await
                .map_err(|e| log_msg(format!("blockMapper.unstageVolumeForBlock failed: {e}")))?;
        }
    }
    let (d, sp) = (devices.to_path_buf(), spec.to_string());
    let r = crate::blocking::try_run(
        format!("remove the block volume directories of {spec}"),
        FS_DEADLINE,
        move || cleanup_device_files(&d, &sp),
    )
    .await;
    if let Err(e) = r {
        // As upstream: not worth failing the unmap for.
        debug!(error = %e, "failed to clean up block volume directory");
    }
    Ok(())
}

/// cleanupOrphanDeviceFiles: the (empty) publish directory, the staging
/// path and the volume's directory (`data/vol_data.json`, `dev/`).
fn cleanup_device_files(devices: &Path, spec: &str) -> Result<(), String> {
    let publish = devices.join("publish").join(spec);
    match std::fs::remove_dir(&publish) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(log_msg(format!(
                "failed to remove publish directory [{}]: {e}",
                publish.display()
            )))
        }
        _ => {}
    }
    let staging = devices.join("staging").join(spec);
    mounter::remove_unmounted(&staging, true).map_err(|e| {
        log_msg(format!(
            "failed to delete volume staging path [{}]: {e}",
            staging.display()
        ))
    })?;
    let dir = devices.join(spec);
    mounter::remove_unmounted(&dir, true).map_err(|e| format!("{}: {e}", dir.display()))
}

/// The block volume found on disk for a pod link name `spec`: its
/// `vol_data.json` says driver and handle.
fn found_on_disk(root: &Path, spec: &str, uid: &str) -> Result<Option<Published>, String> {
    let data = data_dir(root, spec).join(VOL_DATA_FILE);
    let text = match std::fs::read_to_string(&data) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", data.display())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", data.display()))?;
    let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    Ok(Some(Published {
        driver: field("driverName"),
        volume_id: field("volumeHandle"),
        target: publish_path(root, spec, uid),
        staging: Some(staging_path(root, spec)),
        republish: false,
        block: true,
    }))
}

/// Whether a pod other than `uid` still has a device link of the volume
/// (an unreadable pods directory counts as one).
fn mapped_elsewhere(root: &Path, uid: &str, spec: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else {
        return false;
    };
    pods.flatten().any(|p| {
        p.file_name().to_str() != Some(uid)
            && std::fs::symlink_metadata(
                p.path()
                    .join("volumeDevices")
                    .join(blk::CSI_PLUGIN_DIR)
                    .join(spec),
            )
            .is_ok()
    })
}

/// The block CSI volumes of pod `uid` left from before a restart (its
/// device links, each with the volume's `vol_data.json`): unmapped,
/// unpublished, and unstaged when no other pod maps them. A link without
/// data is unmapped only.
pub async fn tear_down_orphaned(registry: &Registry, root: &Path, uid: &str) -> Result<(), String> {
    blk::check_name(uid).map_err(|e| e.to_string())?;
    let (r, u) = (root.to_path_buf(), uid.to_string());
    let found = crate::blocking::try_run(
        format!("list the block volumes of pod {uid}"),
        FS_DEADLINE,
        move || -> Result<Vec<(String, Option<Published>)>, String> {
            let dir = pod_device_map_dir(&r, &u);
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                Err(e) => return Err(format!("{}: {e}", dir.display())),
            };
            let mut out = Vec::new();
            for e in entries.flatten() {
                let Some(spec) = e.file_name().to_str().map(String::from) else {
                    continue;
                };
                if blk::check_name(&spec).is_err() {
                    continue;
                }
                let p = found_on_disk(&r, &spec, &u)?;
                out.push((spec, p));
            }
            Ok(out)
        },
    )
    .await?;
    for (spec, p) in found {
        match p {
            Some(p) => {
                // Held through the unstage, as for a mounted volume
                // (mounter.rs `tear_down_orphaned`).
                let _guard = registry.lock_volume(&p.driver, &p.volume_id).await;
                let (r, u, s) = (root.to_path_buf(), uid.to_string(), spec.clone());
                let still_used = crate::blocking::try_run(
                    format!("look for other users of block volume {spec}"),
                    FS_DEADLINE,
                    move || Ok::<_, String>(mapped_elsewhere(&r, &u, &s)),
                )
                .await?;
                tear_down(registry, &p, None, still_used).await?;
                info!(pod_uid = %uid, driver = %p.driver, volume = %spec, "CSI block volume of an orphaned pod unmapped");
            }
            None => {
                let (link, bind) = (
                    pod_device_map_dir(root, uid).join(&spec),
                    global_map_path(root, &spec).join(uid),
                );
                crate::blocking::try_run(
                    format!("unmap block volume {spec} of pod {uid}"),
                    FS_DEADLINE,
                    move || blk::unmap_paths(&link, &bind, None).map_err(|e| e.to_string()),
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// The block CSI volumes mapped into pod directories (pod UID, driver,
/// handle): in use after a restart until torn down. Blocking.
pub fn reconstruct(root: &Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else {
        return out;
    };
    for pod in pods.flatten() {
        let Some(uid) = pod.file_name().to_str().map(String::from) else {
            continue;
        };
        let Ok(links) = std::fs::read_dir(pod_device_map_dir(root, &uid)) else {
            continue;
        };
        for l in links.flatten() {
            let Some(spec) = l.file_name().to_str().map(String::from) else {
                continue;
            };
            if let Ok(Some(p)) = found_on_disk(root, &spec, &uid) {
                out.push((uid.clone(), p.driver, p.volume_id));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_block_paths() {
        let root = Path::new("/var/lib/kubelet");
        let base = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices";
        assert_eq!(
            staging_path(root, "pv1"),
            Path::new(&format!("{base}/staging/pv1"))
        );
        assert_eq!(
            publish_path(root, "pv1", "u1"),
            Path::new(&format!("{base}/publish/pv1/u1"))
        );
        assert_eq!(
            data_dir(root, "pv1"),
            Path::new(&format!("{base}/pv1/data"))
        );
        assert_eq!(
            global_map_path(root, "pv1"),
            Path::new(&format!("{base}/pv1/dev"))
        );
        assert_eq!(
            pod_device_map_dir(root, "u1"),
            Path::new("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~csi")
        );
        // A CSI device link is a pod device path too (CRI gets it).
        assert!(blk::is_pod_device_path(
            root,
            "u1",
            &pod_device_map_dir(root, "u1").join("pv1")
        ));
        let p = Published {
            driver: "d".into(),
            volume_id: "h".into(),
            target: publish_path(root, "pv1", "u1"),
            staging: Some(staging_path(root, "pv1")),
            republish: false,
            block: true,
        };
        assert_eq!(
            parts(&p),
            Some((devices_dir(root), "pv1".to_string(), "u1".to_string()))
        );
        assert_eq!(
            p.target.ancestors().nth(7),
            Some(root),
            "the root from a publish path"
        );
        // Stats are asked for at the pod's bind under the global map path.
        assert_eq!(
            stats_path(&p),
            Some(global_map_path(root, "pv1").join("u1"))
        );
    }

    #[test]
    fn vol_data_has_upstreams_block_keys() {
        let v = vol_data("pv1", "h", "d", "n");
        assert_eq!(
            v,
            serde_json::json!({"specVolID": "pv1", "volumeHandle": "h", "driverName": "d",
                "nodeName": "n", "attachmentID": mounter::attachment_name("h", "d", "n")})
        );
    }

    #[test]
    fn a_pods_device_link_with_the_volumes_data_counts_in_use_after_a_restart() {
        let root = crate::testutil::tempdir("csiblk-recon");
        let links = pod_device_map_dir(&root, "u1");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(publish_path(&root, "pv1", "u1"), links.join("pv1")).unwrap();
        // A link whose volume has no data is not counted.
        std::os::unix::fs::symlink("/nowhere", links.join("pv2")).unwrap();
        std::fs::create_dir_all(data_dir(&root, "pv1")).unwrap();
        std::fs::write(
            data_dir(&root, "pv1").join(VOL_DATA_FILE),
            vol_data("pv1", "h1", "d.csi", "n").to_string(),
        )
        .unwrap();
        assert_eq!(
            reconstruct(&root),
            vec![("u1".to_string(), "d.csi".to_string(), "h1".to_string())]
        );
        // And the attach bookkeeping sees it under its unique name.
        assert_eq!(
            super::super::attach::reconstruct(&root),
            vec![(
                "u1".to_string(),
                super::super::attach::unique_name("d.csi", "h1")
            )]
        );
        assert!(mapped_elsewhere(&root, "u2", "pv1"));
        assert!(!mapped_elsewhere(&root, "u1", "pv1"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn device_files_go_only_when_nothing_is_mounted_there() {
        let root = crate::testutil::tempdir("csiblk-clean");
        let devices = devices_dir(&root);
        std::fs::create_dir_all(devices.join("publish/pv1")).unwrap();
        std::fs::create_dir_all(devices.join("staging/pv1")).unwrap();
        std::fs::create_dir_all(devices.join("pv1/dev")).unwrap();
        std::fs::create_dir_all(devices.join("pv1/data")).unwrap();
        std::fs::write(devices.join("pv1/data").join(VOL_DATA_FILE), "{}").unwrap();
        // A link in the volume's directory is removed, not followed.
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        std::os::unix::fs::symlink(&outside, devices.join("pv1/link")).unwrap();
        cleanup_device_files(&devices, "pv1").unwrap();
        for p in ["publish/pv1", "staging/pv1", "pv1"] {
            assert!(!devices.join(p).exists(), "{p}");
        }
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        // A publish directory another pod still has a file in stays, and
        // says so.
        std::fs::create_dir_all(devices.join("publish/pv2")).unwrap();
        std::fs::write(devices.join("publish/pv2/u9"), "").unwrap();
        assert!(cleanup_device_files(&devices, "pv2").is_err());
        assert!(devices.join("publish/pv2/u9").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
