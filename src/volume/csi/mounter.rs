//! Setting up and tearing down CSI volumes in a pod (upstream
//! `csi_mounter.go`, and `csi_attacher.go`'s MountDevice/UnmountDevice for
//! staging): paths and handles as upstream computes them, the
//! `vol_data.json` beside the target, NodeStage/NodePublish on set-up and
//! NodeUnpublish/NodeUnstage on tear-down. The driver mounts and unmounts;
//! rkubelet makes the parent directories and removes them afterwards,
//! never following symlinks and never removing a directory still mounted.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{CSIVolumeSource, PersistentVolume, Pod, SecretReference};
use tracing::info;

use super::client::{NodeService, VolumeRequest, CSI_TIMEOUT};
use super::{log_msg, sha256_hex, Registry, PLUGIN_NAME};
use crate::objects::ObjectManager;

/// The file upstream keeps beside each target, read back at tear-down.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// File-system work on the pod directory may take this long.
const FS_DEADLINE: Duration = Duration::from_secs(30);

/// A CSI volume as published into a pod: what tear-down needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub driver: String,
    pub volume_id: String,
    /// `<pod dir>/volumes/kubernetes.io~csi/<name>/mount`.
    pub target: PathBuf,
    /// The global mount path, when the driver staged the volume.
    pub staging: Option<PathBuf>,
}

/// An inline volume's handle: `csi-<sha256(podUID + volume name)>`
/// (upstream `makeVolumeHandle`).
pub fn volume_handle(pod_uid: &str, volume: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(format!("{pod_uid}{volume}").as_bytes())
    )
}

/// Upstream `getAttachmentName`: the VolumeAttachment name for a volume on
/// a node, recorded in `vol_data.json`.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(format!("{handle}{driver}{node}").as_bytes())
    )
}

/// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`.
pub fn target_path(root: &Path, pod_uid: &str, volume: &str) -> PathBuf {
    crate::volume::pod_dir(root, pod_uid)
        .join("volumes")
        .join(PLUGIN_NAME.replace('/', "~"))
        .join(volume.replace('/', "~"))
        .join("mount")
}

/// Upstream `makeDeviceMountPath`:
/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
pub fn global_mount_path(root: &Path, driver: &str, handle: &str) -> PathBuf {
    root.join("plugins")
        .join(PLUGIN_NAME)
        .join(driver)
        .join(sha256_hex(handle.as_bytes()))
        .join("globalmount")
}

/// The pod information upstream adds to the volume context when the
/// driver's CSIDriver object sets `podInfoOnMount`.
pub fn pod_info_attrs(pod: &Pod, ephemeral: bool) -> HashMap<String, String> {
    let m = &pod.metadata;
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    [
        (
            "csi.storage.k8s.io/pod.name",
            m.name.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace",
            m.namespace.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.uid",
            m.uid.clone().unwrap_or_default(),
        ),
        ("csi.storage.k8s.io/serviceAccount.name", sa),
        ("csi.storage.k8s.io/ephemeral", ephemeral.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The `vol_data.json` upstream writes beside the target.
fn vol_data(volume: &str, handle: &str, driver: &str, node: &str, mode: &str) -> serde_json::Value {
    serde_json::json!({
        "specVolID": volume,
        "volumeHandle": handle,
        "driverName": driver,
        "nodeName": node,
        "volumeLifecycleMode": mode,
        "attachmentID": attachment_name(handle, driver, node),
    })
}

/// The driver's node service, or upstream's transient "not registered".
fn node_service(registry: &Registry, driver: &str) -> Result<NodeService, String> {
    let d = registry.get(driver).ok_or_else(|| {
        log_msg(format!(
            "mounter.SetUpAt failed to get CSI client: {}",
            Registry::not_found(driver)
        ))
    })?;
    Ok(NodeService::new(&d.endpoint, CSI_TIMEOUT))
}

async fn secrets(
    objects: &ObjectManager,
    ns: &str,
    name: Option<&str>,
) -> Result<HashMap<String, String>, String> {
    let Some(name) = name else {
        return Ok(HashMap::new());
    };
    let s = objects
        .secret(ns, name)
        .await
        .map_err(|e| format!("fetching NodePublishSecretRef {ns}/{name} failed: {e}"))?;
    Ok(s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// Sets up an inline (ephemeral) CSI volume: NodePublishVolume to the
/// pod's target path with upstream's handle, if the driver's CSIDriver
/// allows the Ephemeral mode; pod information when it asks for it.
pub async fn set_up_inline(
    registry: &Registry,
    objects: &ObjectManager,
    root: &Path,
    pod: &Pod,
    volume: &str,
    src: &CSIVolumeSource,
) -> Result<Published, String> {
    let service = node_service(registry, &src.driver)?;
    let object = registry.csi_driver(&src.driver).await.map_err(|e| {
        log_msg(format!(
            "mounter.SetUpAt failed to assemble volume attributes: {e}"
        ))
    })?;
    object
        .supports_mode(&src.driver, "Ephemeral")
        .map_err(|e| {
            log_msg(format!(
                "mounter.SetupAt failed to check volume lifecycle mode: {e}"
            ))
        })?;
    let pod_info = object.pod_info_on_mount();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let handle = volume_handle(uid, volume);
    let mut context: HashMap<String, String> = src
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    if pod_info {
        context.extend(pod_info_attrs(pod, true));
    }
    let req = VolumeRequest {
        volume_id: handle.clone(),
        read_only: src.read_only.unwrap_or(false),
        fs_type: src.fs_type.clone().unwrap_or_default(),
        mount_flags: Vec::new(),
        // Inline volumes are always ReadWriteOnce (upstream).
        access_mode: "ReadWriteOnce".into(),
        publish_context: HashMap::new(),
        volume_context: context,
        secrets: secrets(
            objects,
            ns,
            src.node_publish_secret_ref
                .as_ref()
                .map(|r| r.name.as_str()),
        )
        .await?,
    };
    let target = target_path(root, uid, volume);
    let data = vol_data(
        volume,
        &handle,
        &src.driver,
        &registry.node_name(),
        "Ephemeral",
    );
    publish(&service, &req, &src.driver, &target, None, data).await
}

/// Sets up a CSI persistent volume: NodeStageVolume to the global mount
/// path when the driver stages (STAGE_UNSTAGE_VOLUME), then
/// NodePublishVolume. Attaching is not done: a driver whose CSIDriver
/// requires attach (the default, also without a CSIDriver) is refused.
pub async fn set_up_persistent(
    registry: &Registry,
    objects: &ObjectManager,
    root: &Path,
    pod: &Pod,
    volume: &str,
    pv: &PersistentVolume,
    read_only: bool,
) -> Result<Published, String> {
    let spec = pv.spec.as_ref().ok_or("the PV has no spec")?;
    let src = spec.csi.as_ref().ok_or("the PV has no CSI source")?;
    let service = node_service(registry, &src.driver)?;
    let object = registry.csi_driver(&src.driver).await.map_err(|e| {
        log_msg(format!(
            "mounter.SetUpAt failed to check volume lifecycle mode: {e}"
        ))
    })?;
    object
        .supports_mode(&src.driver, "Persistent")
        .map_err(|e| {
            log_msg(format!(
                "mounter.SetupAt failed to check volume lifecycle mode: {e}"
            ))
        })?;
    if object.attach_required() {
        return Err(log_msg(format!(
            "driver {} requires attach (CSIDriver attachRequired), which rkubelet does not support",
            src.driver
        )));
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut context: HashMap<String, String> = src
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let secret_of = |r: &Option<SecretReference>| {
        r.as_ref().map(|r| {
            (
                r.namespace.clone().unwrap_or_else(|| "default".into()),
                r.name.clone().unwrap_or_default(),
            )
        })
    };
    let stage_secrets = match secret_of(&src.node_stage_secret_ref) {
        Some((ns, n)) => secrets(objects, &ns, Some(&n)).await?,
        None => HashMap::new(),
    };
    let publish_secrets = match secret_of(&src.node_publish_secret_ref) {
        Some((ns, n)) => secrets(objects, &ns, Some(&n)).await?,
        None => HashMap::new(),
    };
    let mut req = VolumeRequest {
        volume_id: src.volume_handle.clone(),
        read_only: read_only || src.read_only.unwrap_or(false),
        fs_type: src.fs_type.clone().unwrap_or_default(),
        mount_flags: spec.mount_options.clone().unwrap_or_default(),
        access_mode: spec
            .access_modes
            .as_ref()
            .and_then(|m| m.first().cloned())
            .unwrap_or_else(|| "ReadWriteOnce".into()),
        publish_context: HashMap::new(),
        volume_context: context.clone(),
        secrets: stage_secrets,
    };
    let stages = service.supports_stage_unstage().await.map_err(|e| {
        log_msg(format!(
            "mounter.SetUpAt failed to check for STAGE_UNSTAGE_VOLUME capability: {e}"
        ))
    })?;
    let staging = if stages {
        let g = global_mount_path(root, &src.driver, &src.volume_handle);
        let parent = g
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| g.clone());
        crate::blocking::try_run(
            format!("create {}", parent.display()),
            FS_DEADLINE,
            move || make_dirs(&parent),
        )
        .await?;
        service
            .stage(&req, &g.to_string_lossy())
            .await
            .map_err(|e| log_msg(format!("attacher.MountDevice failed: {e}")))?;
        Some(g)
    } else {
        None
    };
    // Pod information is for publishing only (upstream adds it in SetUp).
    if object.pod_info_on_mount() {
        context.extend(pod_info_attrs(pod, false));
    }
    req.volume_context = context;
    req.secrets = publish_secrets;
    let target = target_path(root, uid, volume);
    let data = vol_data(
        volume,
        &src.volume_handle,
        &src.driver,
        &registry.node_name(),
        "Persistent",
    );
    publish(&service, &req, &src.driver, &target, staging, data).await
}

fn make_dirs(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(p)
}

async fn publish(
    service: &NodeService,
    req: &VolumeRequest,
    driver: &str,
    target: &Path,
    staging: Option<PathBuf>,
    data: serde_json::Value,
) -> Result<Published, String> {
    // The parent of the target, and vol_data.json in it; the target itself
    // is the driver's to create (upstream creates only the parent).
    let parent = target.parent().unwrap_or(target).to_path_buf();
    let p = parent.clone();
    crate::blocking::try_run(
        format!("create {}", parent.display()),
        FS_DEADLINE,
        move || -> std::io::Result<()> {
            make_dirs(&p)?;
            std::fs::write(p.join(VOL_DATA_FILE), data.to_string())
        },
    )
    .await
    .map_err(|e| {
        log_msg(format!(
            "mounter.SetUpAt failed to save volume info data: {e}"
        ))
    })?;
    let staging_str = staging
        .as_ref()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Err(e) = service
        .publish(req, &staging_str, &target.to_string_lossy())
        .await
    {
        // A final error means the driver gave up: the directories go. One
        // it may still be working on leaves them for the next attempt.
        if e.is_final() {
            let t = target.to_path_buf();
            let _ = crate::blocking::try_run(
                format!("remove {}", t.display()),
                FS_DEADLINE,
                move || remove_mount_dir(&t),
            )
            .await;
        }
        return Err(e.to_string());
    }
    info!(driver = %driver, volume_id = %req.volume_id, target = %target.display(), "CSI volume published");
    Ok(Published {
        driver: driver.to_string(),
        volume_id: req.volume_id.clone(),
        target: target.to_path_buf(),
        staging,
    })
}

/// NodeUnpublishVolume, then the directories rkubelet made; then
/// NodeUnstageVolume when the volume was staged and no other pod on the
/// node publishes it (`still_used`).
pub async fn tear_down(registry: &Registry, p: &Published, still_used: bool) -> Result<(), String> {
    let d = registry.get(&p.driver).ok_or_else(|| {
        log_msg(format!(
            "Unmounter.TearDownAt failed to get CSI client: {}",
            Registry::not_found(&p.driver)
        ))
    })?;
    let service = NodeService::new(&d.endpoint, CSI_TIMEOUT);
    service
        .unpublish(&p.volume_id, &p.target.to_string_lossy())
        .await
        .map_err(|e| log_msg(format!("Unmounter.TearDownAt failed: {e}")))?;
    let t = p.target.clone();
    crate::blocking::try_run(format!("remove {}", t.display()), FS_DEADLINE, move || {
        remove_mount_dir(&t)
    })
    .await
    .map_err(|e| {
        log_msg(format!(
            "Unmounter.TearDownAt failed to clean mount dir [{}]: {e}",
            p.target.display()
        ))
    })?;
    if let (Some(g), false) = (&p.staging, still_used) {
        service
            .unstage(&p.volume_id, &g.to_string_lossy())
            .await
            .map_err(|e| log_msg(format!("attacher.UnmountDevice failed: {e}")))?;
        let dir = g.parent().map(Path::to_path_buf);
        let g = g.clone();
        crate::blocking::try_run(
            format!("remove {}", g.display()),
            FS_DEADLINE,
            move || -> std::io::Result<()> {
                remove_if_unmounted(&g)?;
                if let Some(d) = dir {
                    remove_empty_dir(&d)?;
                }
                Ok(())
            },
        )
        .await?;
    }
    Ok(())
}

/// CSI volumes left in the directory of a pod nobody owns any more (one
/// deleted while rkubelet was down): each `vol_data.json` names the
/// driver and handle, and the driver unpublishes before the directory may
/// go (upstream reconstructs such volumes from the same file). A staged
/// volume is not unstaged here. An error keeps the pod directory.
pub async fn tear_down_orphaned(registry: &Registry, root: &Path, uid: &str) -> Result<(), String> {
    let dir = crate::volume::pod_dir(root, uid)
        .join("volumes")
        .join(PLUGIN_NAME.replace('/', "~"));
    let d = dir.clone();
    let found = crate::blocking::try_run(
        format!("list {}", dir.display()),
        FS_DEADLINE,
        move || -> Result<Vec<Published>, String> {
            let entries = match std::fs::read_dir(&d) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                Err(e) => return Err(e.to_string()),
            };
            let mut out = Vec::new();
            for e in entries.flatten() {
                let data = e.path().join(VOL_DATA_FILE);
                let Ok(text) = std::fs::read_to_string(&data) else {
                    continue;
                };
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|err| format!("{}: {err}", data.display()))?;
                let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                out.push(Published {
                    driver: field("driverName"),
                    volume_id: field("volumeHandle"),
                    target: e.path().join("mount"),
                    staging: None,
                });
            }
            Ok(out)
        },
    )
    .await?;
    for p in found {
        tear_down(registry, &p, true).await?;
        info!(pod_uid = %uid, driver = %p.driver, target = %p.target.display(), "CSI volume of an orphaned pod unpublished");
    }
    Ok(())
}

/// Whether `p` is a mount point (another device than its parent, or the
/// root of its own bind).
fn is_mount_point(p: &Path) -> std::io::Result<bool> {
    let m = std::fs::symlink_metadata(p)?;
    let parent = p.parent().unwrap_or(Path::new("/"));
    let pm = std::fs::symlink_metadata(parent)?;
    if m.dev() != pm.dev() {
        return Ok(true);
    }
    // A bind mount of a directory on the same device: only mountinfo says.
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = p.to_string_lossy();
    Ok(info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| crate::stats::procfs::unescape_mountinfo(mp) == want)
    }))
}

fn remove_if_unmounted(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() => return std::fs::remove_file(p),
        Ok(_) => {}
    }
    if is_mount_point(p)? {
        return Err(std::io::Error::other(format!(
            "{} is still mounted",
            p.display()
        )));
    }
    // Only an empty directory: a driver that left files behind unmounted
    // is not second-guessed (upstream removes with os.Remove too).
    std::fs::remove_dir(p)
}

fn remove_empty_dir(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Upstream `removeMountDir`: the target if it is no longer mounted, then
/// `vol_data.json` and the volume directory.
pub fn remove_mount_dir(target: &Path) -> std::io::Result<()> {
    remove_if_unmounted(target)?;
    if let Some(dir) = target.parent() {
        match std::fs::remove_file(dir.join(VOL_DATA_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        remove_empty_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_paths_are_upstreams() {
        // sha256("uid-1" + "vol") computed independently (sha256sum).
        assert_eq!(
            volume_handle("uid-1", "vol"),
            format!("csi-{}", sha256_hex(b"uid-1vol"))
        );
        assert_eq!(volume_handle("a", "b").len(), 4 + 64);
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            target_path(root, "u", "data"),
            Path::new("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/data/mount")
        );
        assert_eq!(
            global_mount_path(root, "d.csi", "h"),
            root.join(format!(
                "plugins/kubernetes.io/csi/d.csi/{}/globalmount",
                sha256_hex(b"h")
            ))
        );
        assert_eq!(
            attachment_name("h", "d", "n"),
            format!("csi-{}", sha256_hex(b"hdn"))
        );
    }

    #[test]
    fn pod_info_carries_the_ephemeral_flag_and_the_pods_identity() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("u".into());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            service_account_name: Some("sa".into()),
            ..Default::default()
        });
        let a = pod_info_attrs(&pod, true);
        assert_eq!(a["csi.storage.k8s.io/pod.name"], "p");
        assert_eq!(a["csi.storage.k8s.io/pod.namespace"], "ns");
        assert_eq!(a["csi.storage.k8s.io/pod.uid"], "u");
        assert_eq!(a["csi.storage.k8s.io/serviceAccount.name"], "sa");
        assert_eq!(a["csi.storage.k8s.io/ephemeral"], "true");
        assert_eq!(
            pod_info_attrs(&pod, false)["csi.storage.k8s.io/ephemeral"],
            "false"
        );
    }

    #[test]
    fn vol_data_has_upstreams_keys() {
        let v = vol_data("v", "h", "d", "n", "Ephemeral");
        for k in [
            "specVolID",
            "volumeHandle",
            "driverName",
            "nodeName",
            "volumeLifecycleMode",
            "attachmentID",
        ] {
            assert!(v.get(k).is_some_and(|x| x.is_string()), "{k}");
        }
        assert_eq!(v["volumeLifecycleMode"], "Ephemeral");
    }

    /// A node service that records NodeUnpublishVolume.
    #[derive(Clone, Default)]
    struct Recorder(std::sync::Arc<parking_lot::Mutex<Vec<(String, String)>>>);

    #[tonic::async_trait]
    impl super::super::proto::node_server::Node for Recorder {
        async fn node_stage_volume(
            &self,
            _: tonic::Request<proto::NodeStageVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeStageVolumeResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }
        async fn node_unstage_volume(
            &self,
            _: tonic::Request<proto::NodeUnstageVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeUnstageVolumeResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }
        async fn node_publish_volume(
            &self,
            _: tonic::Request<proto::NodePublishVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodePublishVolumeResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }
        async fn node_unpublish_volume(
            &self,
            r: tonic::Request<proto::NodeUnpublishVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeUnpublishVolumeResponse>, tonic::Status> {
            let r = r.into_inner();
            self.0.lock().push((r.volume_id, r.target_path));
            Ok(tonic::Response::new(Default::default()))
        }
        async fn node_get_capabilities(
            &self,
            _: tonic::Request<proto::NodeGetCapabilitiesRequest>,
        ) -> Result<tonic::Response<proto::NodeGetCapabilitiesResponse>, tonic::Status> {
            Ok(tonic::Response::new(Default::default()))
        }
        async fn node_get_info(
            &self,
            _: tonic::Request<proto::NodeGetInfoRequest>,
        ) -> Result<tonic::Response<proto::NodeGetInfoResponse>, tonic::Status> {
            Ok(tonic::Response::new(Default::default()))
        }
    }

    use super::super::proto;

    #[tokio::test]
    async fn an_orphaned_pods_csi_volumes_are_unpublished_from_vol_data() {
        let root = std::env::temp_dir().join(format!("rkubelet-csiorph-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let target = target_path(&root, "u1", "data");
        std::fs::create_dir_all(&target).unwrap();
        let data = vol_data("data", "csi-abc", "d.csi", "n", "Ephemeral");
        std::fs::write(
            target.parent().unwrap().join(VOL_DATA_FILE),
            data.to_string(),
        )
        .unwrap();
        let registry = Registry::default();
        // Without the driver the directory stays (its mount would
        // otherwise be cut from under the driver).
        let e = tear_down_orphaned(&registry, &root, "u1")
            .await
            .unwrap_err();
        assert!(e.contains("driver name d.csi not found"), "{e}");
        assert!(target.is_dir());
        let sock = root.join("csi.sock");
        let rec = Recorder::default();
        crate::volume::csi::registration::tests::serve(
            tokio::net::UnixListener::bind(&sock).unwrap(),
            proto::node_server::NodeServer::new(rec.clone()),
        );
        registry.set(
            "d.csi",
            super::super::Driver {
                endpoint: sock.to_string_lossy().into_owned(),
                version: super::super::Version::parse("1.0.0").unwrap(),
                node_id: String::new(),
                max_volumes: 0,
                topology: Default::default(),
            },
        );
        tear_down_orphaned(&registry, &root, "u1").await.unwrap();
        assert_eq!(
            rec.0.lock().clone(),
            vec![("csi-abc".to_string(), target.to_string_lossy().into_owned())]
        );
        assert!(!target.parent().unwrap().exists());
        // Nothing left: nothing to do.
        tear_down_orphaned(&registry, &root, "u1").await.unwrap();
        tear_down_orphaned(&registry, &root, "u2").await.unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_mount_dir_is_removed_only_when_unmounted_and_links_are_not_followed() {
        let root = std::env::temp_dir().join(format!("rkubelet-csirm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let target = root.join("vol/mount");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(root.join("vol").join(VOL_DATA_FILE), "{}").unwrap();
        remove_mount_dir(&target).unwrap();
        assert!(!root.join("vol").exists());
        // A target replaced by a link: the link goes, its target stays.
        let outside = root.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(root.join("vol2")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("vol2/mount")).unwrap();
        remove_mount_dir(&root.join("vol2/mount")).unwrap();
        assert!(outside.is_dir() && !root.join("vol2").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
