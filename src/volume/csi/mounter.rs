//! Setting up and tearing down CSI volumes in a pod (upstream
//! `csi_mounter.go`, and `csi_attacher.go`'s MountDevice/UnmountDevice for
//! staging): paths and handles as upstream computes them, the
//! `vol_data.json` beside the target, NodeStage/NodePublish on set-up and
//! NodeUnpublish/NodeUnstage on tear-down. The driver mounts and unmounts;
//! rkubelet makes the parent directories and removes them afterwards,
//! never following symlinks and never removing a directory still mounted.
//! The CSIDriver object decides the rest as upstream: the lifecycle modes,
//! pod information and service-account tokens in the volume context, who
//! applies the fsGroup (`fsGroupPolicy`, VOLUME_MOUNT_GROUP), and
//! republishing.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequestSpec, TokenRequestStatus,
};
use k8s_openapi::api::core::v1::{CSIVolumeSource, PersistentVolume, Pod, SecretReference};
use tracing::{debug, info};

use super::attach;
use super::client::{NodeService, VolumeRequest, CSI_TIMEOUT};
use super::{log_msg, sha256_hex, DriverObject, FsGroupPolicy, Registry, PLUGIN_NAME};
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
    /// A persistent volume's global (device) mount path: where the
    /// driver stages it, if it stages, and beside it the `vol_data.json`
    /// that unstaging reads (upstream's MountDevice writes both for every
    /// CSI persistent volume).
    pub staging: Option<PathBuf>,
    /// The CSIDriver's `requiresRepublish`: published again at each pod
    /// sync.
    pub republish: bool,
    /// A raw block volume (`csi/block.rs`): `target` is the publish path
    /// (a device file), `staging` the block staging path.
    pub block: bool,
}

/// The volume context key of the pod's service-account tokens (upstream
/// `podServiceAccountTokenAttrs`).
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

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

/// The `vol_data.json` upstream's MountDevice writes beside the global
/// mount path (read back to unstage).
fn device_vol_data(handle: &str, driver: &str) -> serde_json::Value {
    serde_json::json!({
        "volumeHandle": handle,
        "driverName": driver,
    })
}

/// The pod's fsGroup and whether its change policy is OnRootMismatch.
fn pod_fs_group(pod: &Pod) -> Option<(i64, bool)> {
    let sc = pod.spec.as_ref()?.security_context.as_ref()?;
    Some((
        sc.fs_group?,
        sc.fs_group_change_policy.as_deref() == Some("OnRootMismatch"),
    ))
}

/// Upstream `supportsFSGroup`: whether the kubelet applies the fsGroup to
/// a published volume. `access_modes` is the PV's (None for an inline
/// volume, always mounted ReadWriteOnce).
fn supports_fs_group(
    fs_type: &str,
    has_fs_group: bool,
    policy: FsGroupPolicy,
    read_only: bool,
    access_modes: Option<&[String]>,
) -> bool {
    if !has_fs_group || policy == FsGroupPolicy::None || read_only {
        return false;
    }
    if policy == FsGroupPolicy::File {
        return true;
    }
    if fs_type.is_empty() {
        debug!(
            "{}",
            log_msg("mounter.SetupAt WARNING: skipping fsGroup, fsType not provided")
        );
        return false;
    }
    match access_modes {
        None => true,
        Some([]) => {
            debug!(
                "{}",
                log_msg("mounter.SetupAt WARNING: skipping fsGroup, access modes not provided")
            );
            false
        }
        Some(modes) => {
            let rwo = modes
                .iter()
                .any(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod");
            if !rwo {
                debug!("{}", log_msg("mounter.SetupAt WARNING: skipping fsGroup, only support ReadWriteOnce access mode"));
            }
            rwo
        }
    }
}

/// Upstream `podServiceAccountTokenAttrs`: for each of the CSIDriver's
/// `tokenRequests` a token of the pod's service account, bound to the pod
/// (an empty audience asks for the API server's own), as a JSON map
/// audience → TokenRequest status in one volume context key. Tokens come
/// from the object manager's cache, which renews them at 80 % of their
/// life.
async fn token_attrs(
    objects: &ObjectManager,
    object: &DriverObject,
    pod: &Pod,
) -> Result<HashMap<String, String>, String> {
    let requests = object.token_requests();
    if requests.is_empty() {
        return Ok(HashMap::new());
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let sa = crate::volume::payload::service_account(pod);
    let mut out = Vec::new();
    for r in requests {
        let audiences = if r.audience.is_empty() {
            Vec::new()
        } else {
            vec![r.audience.clone()]
        };
        let spec = TokenRequestSpec {
            audiences,
            expiration_seconds: r.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        };
        let t = objects
            .service_account_token(ns, sa, spec)
            .await
            .map_err(|e| e.to_string())?;
        out.push((r.audience, t));
    }
    let (k, v) = tokens_context(out)?;
    Ok(HashMap::from([(k, v)]))
}

/// The volume context entry for the tokens: a JSON map audience →
/// TokenRequest status (`token`, `expirationTimestamp`), as upstream
/// marshals it.
fn tokens_context(
    tokens: Vec<(String, crate::objects::Token)>,
) -> Result<(String, String), String> {
    let out: std::collections::BTreeMap<String, TokenRequestStatus> = tokens
        .into_iter()
        .map(|(aud, t)| {
            let at = k8s_openapi::jiff::Timestamp::from_second(t.expires_at)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            (
                aud,
                TokenRequestStatus {
                    token: t.token,
                    expiration_timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at),
                },
            )
        })
        .collect();
    let json = serde_json::to_string(&out).map_err(|e| e.to_string())?;
    Ok((TOKENS_KEY.to_string(), json))
}

/// What publishing needs from the CSIDriver and the node service besides
/// the request: the fsGroup policy, the tokens and pod information in the
/// volume context, and whether the driver takes the fsGroup itself
/// (VOLUME_MOUNT_GROUP). Errors are upstream's SetUpAt messages.
struct PublishPlan {
    policy: FsGroupPolicy,
    mount_group: bool,
}

async fn plan_publish(
    service: &NodeService,
    objects: &ObjectManager,
    object: &DriverObject,
    pod: &Pod,
    context: &mut HashMap<String, String>,
    ephemeral: bool,
) -> Result<PublishPlan, String> {
    let policy = object.fs_group_policy().map_err(|e| {
        log_msg(format!(
            "mounter.SetupAt failed to check fsGroup policy: {e}"
        ))
    })?;
    if object.pod_info_on_mount() {
        context.extend(pod_info_attrs(pod, ephemeral));
    }
    let tokens = token_attrs(objects, object, pod).await.map_err(|e| {
        // Upstream's spelling.
        log_msg(format!(
            "mounter.SetUpAt failed to get service accoount token attributes: {e}"
        ))
    })?;
    context.extend(tokens);
    let mount_group = service
        .capabilities()
        .await
        .map_err(|e| {
            log_msg(format!("mounter.SetUpAt failed to determine if the node service has VOLUME_MOUNT_GROUP capability: {e}"))
        })?
        .volume_mount_group();
    Ok(PublishPlan {
        policy,
        mount_group,
    })
}

/// After a successful publish: the fsGroup applied by the kubelet, when
/// the driver does not take it and the policy allows (upstream SetUpAt).
async fn apply_fs_group(
    pod: &Pod,
    plan: &PublishPlan,
    req: &VolumeRequest,
    access_modes: Option<&[String]>,
    target: &Path,
    driver: &str,
) -> Result<(), String> {
    let Some((gid, on_mismatch)) = pod_fs_group(pod) else {
        return Ok(());
    };
    if plan.mount_group
        || !supports_fs_group(&req.fs_type, true, plan.policy, req.read_only, access_modes)
    {
        return Ok(());
    }
    let gid = u32::try_from(gid).map_err(|_| format!("fsGroup {gid} is out of range"))?;
    let t = target.to_path_buf();
    // The CSI mounter's FSGroupCompleteHook names the driver.
    let plugin = format!("{PLUGIN_NAME}:{driver}");
    crate::blocking::try_run(
        format!("fsGroup on {}", target.display()),
        FS_DEADLINE,
        move || {
            crate::volume::ownership::set_volume_ownership(&t, gid, false, on_mismatch, &plugin)
        },
    )
    .await
    .map_err(|e| format!("applyFSGroup failed for vol {}: {e}", req.volume_id))?;
    debug!(volume_id = %req.volume_id, gid, "{}", log_msg("mounter.SetupAt fsGroup applied"));
    Ok(())
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
pub(super) fn node_service(registry: &Registry, driver: &str) -> Result<NodeService, String> {
    client_for(registry, driver, "mounter.SetUpAt")
}

/// The driver's node service; `op` names the operation in upstream's
/// "<op> failed to get CSI client" for a driver not registered.
pub(super) fn client_for(
    registry: &Registry,
    driver: &str,
    op: &str,
) -> Result<NodeService, String> {
    let d = registry.get(driver).ok_or_else(|| {
        log_msg(format!(
            "{op} failed to get CSI client: {}",
            Registry::not_found(driver)
        ))
    })?;
    Ok(NodeService::new(&d.endpoint, CSI_TIMEOUT))
}

/// Upstream's getCredentialsFromSecret: every key of the secret, its
/// value as a string. Shared by staging, publishing and expansion, whose
/// callers say which reference failed.
pub(crate) async fn credentials(
    objects: &ObjectManager,
    ns: &str,
    name: &str,
) -> Result<HashMap<String, String>, String> {
    let s = objects.secret(ns, name).await.map_err(|e| {
        log_msg(format!(
            "failed to find the secret {name} in the namespace {ns} with error: {e}"
        ))
    })?;
    Ok(s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// A PV's secret reference as (namespace, name); the namespace defaults
/// to `default`.
pub(crate) fn secret_ref(r: &SecretReference) -> (String, String) {
    (
        r.namespace.clone().unwrap_or_else(|| "default".into()),
        r.name.clone().unwrap_or_default(),
    )
}

/// The secret's data, or nothing without a reference; `field` names the
/// reference in upstream's error ("fetching NodePublishSecretRef ns/name
/// failed: ...").
async fn secrets(
    objects: &ObjectManager,
    ns: &str,
    name: Option<&str>,
    field: &str,
) -> Result<HashMap<String, String>, String> {
    let Some(name) = name else {
        return Ok(HashMap::new());
    };
    credentials(objects, ns, name)
        .await
        .map_err(|e| format!("fetching {field} {ns}/{name} failed: {e}"))
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
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let handle = volume_handle(uid, volume);
    let mut context: HashMap<String, String> = src
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let plan = plan_publish(&service, objects, &object, pod, &mut context, true).await?;
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
            "NodePublishSecretRef",
        )
        .await?,
        volume_mount_group: fs_group_arg(pod, &plan),
        block: false,
    };
    let target = target_path(root, uid, volume);
    let data = vol_data(
        volume,
        &handle,
        &src.driver,
        &registry.node_name(),
        "Ephemeral",
    );
    let mut p = publish(&service, &req, &src.driver, &target, None, false, data).await?;
    p.republish = object.requires_republish();
    apply_fs_group(pod, &plan, &req, None, &target, &src.driver).await?;
    Ok(p)
}

/// The fsGroup handed to a driver with VOLUME_MOUNT_GROUP.
fn fs_group_arg(pod: &Pod, plan: &PublishPlan) -> Option<i64> {
    plan.mount_group
        .then(|| pod_fs_group(pod).map(|(g, _)| g))
        .flatten()
}

/// Sets up a CSI persistent volume: the global mount path and its
/// `vol_data.json`, NodeStageVolume there when the driver stages
/// (STAGE_UNSTAGE_VOLUME) and `stage` is set (false on a republish: the
/// volume is staged already, as upstream's device mount state says), then
/// NodePublishVolume to `pods/<uid>/volumes/kubernetes.io~csi/<PV
/// name>/mount` (upstream names the directory after the volume spec, the
/// PV for a claim). A driver whose CSIDriver requires attach (the default,
/// also without a CSIDriver) first waits for the attach/detach controller
/// (`attach::wait_for_attach`); the VolumeAttachment's
/// `attachmentMetadata` is then the publish context of both calls, and the
/// volume is reported in `node.status.volumesInUse` from then on.
pub async fn set_up_persistent(
    registry: &Registry,
    objects: &ObjectManager,
    root: &Path,
    pod: &Pod,
    pv: &PersistentVolume,
    read_only: bool,
    stage: bool,
) -> Result<Published, SetUpError> {
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
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let publish_context = attachment_context(
        registry,
        &object,
        uid,
        &src.driver,
        &src.volume_handle,
        stage,
    )
    .await?;
    let spec_name = pv.metadata.name.clone().unwrap_or_default();
    let mut context: HashMap<String, String> = src
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let stage_secrets = match src.node_stage_secret_ref.as_ref().map(secret_ref) {
        Some((ns, n)) => secrets(objects, &ns, Some(&n), "NodeStageSecretRef").await?,
        None => HashMap::new(),
    };
    let publish_secrets = match src.node_publish_secret_ref.as_ref().map(secret_ref) {
        Some((ns, n)) => secrets(objects, &ns, Some(&n), "NodePublishSecretRef").await?,
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
        publish_context,
        volume_context: context.clone(),
        secrets: stage_secrets,
        volume_mount_group: None,
        block: false,
    };
    let caps = service.capabilities().await.map_err(|e| {
        log_msg(format!(
            "mounter.SetUpAt failed to check for STAGE_UNSTAGE_VOLUME capability: {e}"
        ))
    })?;
    let stages = caps.stage_unstage();
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    // Upstream's MountDevice: the global mount path and its vol_data.json
    // for every persistent volume (unstaging reads it), the stage call
    // only for a driver that stages.
    let g = global_mount_path(root, &src.driver, &src.volume_handle);
    if stage {
        let dir = g.clone();
        let data = device_vol_data(&src.volume_handle, &src.driver);
        crate::blocking::try_run(
            format!("create {}", g.display()),
            FS_DEADLINE,
            move || -> std::io::Result<()> {
                make_dirs(&dir)?;
                let parent = dir.parent().unwrap_or(&dir);
                std::fs::write(parent.join(VOL_DATA_FILE), data.to_string())
            },
        )
        .await
        .map_err(|e| log_msg(format!("failed to save volume info data: {e}")))?;
        if stages {
            // With VOLUME_MOUNT_GROUP the driver gets the fsGroup at
            // staging too (upstream MountDevice).
            if caps.volume_mount_group() {
                req.volume_mount_group = pod_fs_group(pod).map(|(g, _)| g);
            }
            service
                .stage(&req, &g.to_string_lossy())
                .await
                .map_err(|e| log_msg(format!("attacher.MountDevice failed: {e}")))?;
        }
    }
    // Pod information and tokens are for publishing only (upstream adds
    // them in SetUp).
    let plan = plan_publish(&service, objects, &object, pod, &mut context, false).await?;
    req.volume_context = context;
    req.secrets = publish_secrets;
    req.volume_mount_group = fs_group_arg(pod, &plan);
    let target = target_path(root, uid, &spec_name);
    let data = vol_data(
        &spec_name,
        &src.volume_handle,
        &src.driver,
        &registry.node_name(),
        "Persistent",
    );
    let mut p = publish(&service, &req, &src.driver, &target, Some(g), stages, data).await?;
    p.republish = object.requires_republish();
    apply_fs_group(pod, &plan, &req, Some(&access_modes), &target, &src.driver).await?;
    Ok(p)
}

/// The publish context of a persistent volume: a driver whose CSIDriver
/// requires attach (the default, also without a CSIDriver) first waits for
/// the attach/detach controller and its VolumeAttachment's
/// `attachmentMetadata` is the context; the volume is reported in
/// `node.status.volumesInUse` from then on (upstream's getPublishContext
/// and skipAttach, for mounts and block maps alike).
pub(super) async fn attachment_context(
    registry: &Registry,
    object: &DriverObject,
    uid: &str,
    driver: &str,
    handle: &str,
    timed: bool,
) -> Result<HashMap<String, String>, SetUpError> {
    let unique = attach::unique_name(driver, handle);
    if object.attach_required() {
        // In use from the moment the kubelet decides the volume should be
        // attached here (upstream reports the desired state's attachable
        // volumes), so the controller never detaches it under a mount.
        registry.in_use().mark(uid, &unique);
        attach::wait_for_attach(registry, driver, handle, timed)
            .await
            .map_err(SetUpError::Attach)
    } else {
        // Found on disk after a restart, but not attachable after all.
        registry.in_use().release(uid, &unique);
        Ok(HashMap::new())
    }
}

/// Why a persistent volume is not set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetUpError {
    /// A failure of the set-up itself (upstream's MountVolume.SetUp or
    /// MountDevice: a FailedMount event).
    #[error("{0}")]
    SetUp(String),
    /// Waiting for the attach/detach controller, or its attachment failed.
    #[error("{0}")]
    Attach(#[from] attach::AttachError),
    /// A step of a raw block volume's map (upstream's MapVolume: a
    /// FailedMapVolume event "<step> failed for volume ...").
    #[error("{error}")]
    Map { step: &'static str, error: String },
}

impl From<String> for SetUpError {
    fn from(e: String) -> Self {
        SetUpError::SetUp(e)
    }
}

impl From<&str> for SetUpError {
    fn from(e: &str) -> Self {
        SetUpError::SetUp(e.to_string())
    }
}

pub(super) fn make_dirs(p: &Path) -> std::io::Result<()> {
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
    staged: bool,
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
        .filter(|_| staged)
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
        republish: false,
        block: false,
    })
}

/// NodeUnpublishVolume, then the directories rkubelet made; then
/// NodeUnstageVolume when the volume was staged and no other pod on the
/// node publishes it (`still_used`).
pub async fn tear_down(registry: &Registry, p: &Published, still_used: bool) -> Result<(), String> {
    // Upstream's two operations, each timed (operation_generator.go:
    // GenerateUnmountVolumeFunc, GenerateUnmountDeviceFunc).
    let plugin = format!("{PLUGIN_NAME}:{}", p.driver);
    let started = std::time::Instant::now();
    let r = unpublish(registry, p).await;
    crate::metrics::certvol::storage_operation(
        &plugin,
        "volume_unmount",
        started.elapsed(),
        r.is_ok(),
    );
    let service = r?;
    if let (Some(g), false) = (&p.staging, still_used) {
        let started = std::time::Instant::now();
        let r = unmount_device(&service, &p.volume_id, g).await;
        crate::metrics::certvol::storage_operation(
            &plugin,
            "unmount_device",
            started.elapsed(),
            r.is_ok(),
        );
        r?;
    }
    Ok(())
}

/// NodeUnpublishVolume and the pod's target directory (upstream's
/// TearDown); the node service for what follows.
async fn unpublish(registry: &Registry, p: &Published) -> Result<NodeService, String> {
    let service = client_for(registry, &p.driver, "Unmounter.TearDownAt")?;
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
    Ok(service)
}

/// Upstream's UnmountDevice: NodeUnstageVolume when the driver stages
/// (asked now, as upstream does), then the global mount path, its
/// `vol_data.json` and their directory.
async fn unmount_device(service: &NodeService, volume_id: &str, g: &Path) -> Result<(), String> {
    let stages = service.supports_stage_unstage().await.map_err(|e| {
        log_msg(format!(
            "attacher.UnmountDevice failed to check whether STAGE_UNSTAGE_VOLUME set: {e}"
        ))
    })?;
    if stages {
        service
            .unstage(volume_id, &g.to_string_lossy())
            .await
            .map_err(|e| log_msg(format!("attacher.UnmountDevice failed: {e}")))?;
    }
    let g = g.to_path_buf();
    crate::blocking::try_run(format!("remove {}", g.display()), FS_DEADLINE, move || {
        remove_mount_dir(&g)
    })
    .await
}

/// CSI volumes left in the directory of a pod nobody owns any more (one
/// deleted while rkubelet was down; raw block ones as `block.rs` finds
/// them): each `vol_data.json` names the
/// driver and handle, and the driver unpublishes before the directory may
/// go (upstream reconstructs such volumes from the same file). A
/// persistent volume is then unstaged (upstream's UnmountDevice on the
/// reconstructed device mount) unless another pod directory still holds
/// a `vol_data.json` for the same driver and handle. An error keeps the
/// pod directory.
pub async fn tear_down_orphaned(registry: &Registry, root: &Path, uid: &str) -> Result<(), String> {
    // Raw block volumes first: their device links are in the pod's
    // volumeDevices directory, their data under the plugin's.
    super::block::tear_down_orphaned(registry, root, uid).await?;
    let dir = crate::volume::pod_dir(root, uid)
        .join("volumes")
        .join(PLUGIN_NAME.replace('/', "~"));
    let d = dir.clone();
    let root_c = root.to_path_buf();
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
                let (driver, handle) = (field("driverName"), field("volumeHandle"));
                let staging = (field("volumeLifecycleMode") == "Persistent")
                    .then(|| global_mount_path(&root_c, &driver, &handle));
                out.push(Published {
                    driver,
                    volume_id: handle,
                    target: e.path().join("mount"),
                    staging,
                    republish: false,
                    block: false,
                });
            }
            Ok(out)
        },
    )
    .await?;
    for p in found {
        // Held through the unstage: a pod setting the volume up meanwhile
        // either comes first (and its vol_data.json keeps the volume
        // staged) or stages it again after.
        let (_guard, still_used) = match &p.staging {
            None => (None, true),
            Some(_) => {
                let guard = registry.lock_volume(&p.driver, &p.volume_id).await;
                let (r, u, d, h) = (
                    root.to_path_buf(),
                    uid.to_string(),
                    p.driver.clone(),
                    p.volume_id.clone(),
                );
                let used = crate::blocking::try_run(
                    "look for other users of a CSI volume".to_string(),
                    FS_DEADLINE,
                    move || Ok::<_, String>(published_elsewhere(&r, &u, &d, &h)),
                )
                .await?;
                (Some(guard), used)
            }
        };
        tear_down(registry, &p, still_used).await?;
        info!(pod_uid = %uid, driver = %p.driver, target = %p.target.display(), "CSI volume of an orphaned pod unpublished");
    }
    Ok(())
}

/// Whether a pod directory other than `uid`'s has a CSI volume whose
/// `vol_data.json` names `driver` and `handle` (it still needs the staged
/// volume). An unreadable directory counts as a user: unstaging too early
/// would cut the volume from under a pod.
fn published_elsewhere(root: &Path, uid: &str, driver: &str, handle: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else {
        return false;
    };
    let plugin = PLUGIN_NAME.replace('/', "~");
    for pod in pods.flatten() {
        if pod.file_name().to_string_lossy() == uid {
            continue;
        }
        let vols = match std::fs::read_dir(pod.path().join("volumes").join(&plugin)) {
            Ok(v) => v,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return true,
        };
        for v in vols.flatten() {
            let Ok(text) = std::fs::read_to_string(v.path().join(VOL_DATA_FILE)) else {
                continue;
            };
            let Ok(j) = serde_json::from_str::<serde_json::Value>(&text) else {
                return true;
            };
            if j["driverName"] == driver && j["volumeHandle"] == handle {
                return true;
            }
        }
    }
    false
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
    remove_unmounted(p, false)
}

/// Removes `p` unless something is mounted there (that is the driver's to
/// undo); a link is removed, never followed. Without `tree` only an empty
/// directory that is no mount point: a driver that left files behind
/// unmounted is not second-guessed (upstream removes with os.Remove). With
/// `tree` (upstream's RemoveAll of a block staging path) a file, or a
/// directory with what is in it, unless a mount is anywhere below.
pub(super) fn remove_unmounted(p: &Path, tree: bool) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() || (tree && !m.is_dir()) => {
            return std::fs::remove_file(p)
        }
        Ok(_) => {}
    }
    let mounted = if tree {
        mounted_below(p)?
    } else {
        is_mount_point(p)?
    };
    if mounted {
        return Err(std::io::Error::other(format!(
            "{} is still mounted",
            p.display()
        )));
    }
    if tree {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_dir(p)
    }
}

/// Whether anything is mounted at or below `dir`.
fn mounted_below(dir: &Path) -> std::io::Result<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().any(|l| {
        l.split(' ').nth(4).is_some_and(|mp| {
            Path::new(&crate::stats::procfs::unescape_mountinfo(mp)).starts_with(dir)
        })
    }))
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

    use super::super::proto;
    use proto::node_service_capability::rpc::Type as CapType;

    /// What the fake node service was asked.
    #[derive(Default)]
    struct Calls {
        staged: Vec<proto::NodeStageVolumeRequest>,
        unstaged: Vec<(String, String)>,
        published: Vec<proto::NodePublishVolumeRequest>,
        unpublished: Vec<(String, String)>,
        stats: Vec<proto::NodeGetVolumeStatsRequest>,
    }

    /// A node service with the given RPC capabilities that records every
    /// call; publishing makes the target directory (no mount).
    #[derive(Clone, Default)]
    struct FakeNode {
        caps: Vec<CapType>,
        calls: std::sync::Arc<parking_lot::Mutex<Calls>>,
        /// NodeGetVolumeStats answers no usage.
        no_usage: bool,
    }

    #[tonic::async_trait]
    impl proto::node_server::Node for FakeNode {
        async fn node_stage_volume(
            &self,
            r: tonic::Request<proto::NodeStageVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeStageVolumeResponse>, tonic::Status> {
            self.calls.lock().staged.push(r.into_inner());
            Ok(tonic::Response::new(Default::default()))
        }
        async fn node_unstage_volume(
            &self,
            r: tonic::Request<proto::NodeUnstageVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeUnstageVolumeResponse>, tonic::Status> {
            let r = r.into_inner();
            self.calls
                .lock()
                .unstaged
                .push((r.volume_id, r.staging_target_path));
            Ok(tonic::Response::new(Default::default()))
        }
        async fn node_publish_volume(
            &self,
            r: tonic::Request<proto::NodePublishVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodePublishVolumeResponse>, tonic::Status> {
            let r = r.into_inner();
            std::fs::create_dir_all(&r.target_path)
                .map_err(|e| tonic::Status::internal(e.to_string()))?;
            self.calls.lock().published.push(r);
            Ok(tonic::Response::new(Default::default()))
        }
        async fn node_unpublish_volume(
            &self,
            r: tonic::Request<proto::NodeUnpublishVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeUnpublishVolumeResponse>, tonic::Status> {
            let r = r.into_inner();
            self.calls
                .lock()
                .unpublished
                .push((r.volume_id, r.target_path));
            Ok(tonic::Response::new(Default::default()))
        }
        async fn node_get_volume_stats(
            &self,
            r: tonic::Request<proto::NodeGetVolumeStatsRequest>,
        ) -> Result<tonic::Response<proto::NodeGetVolumeStatsResponse>, tonic::Status> {
            use proto::volume_usage::Unit;
            self.calls.lock().stats.push(r.into_inner());
            if self.no_usage {
                return Ok(tonic::Response::new(Default::default()));
            }
            Ok(tonic::Response::new(proto::NodeGetVolumeStatsResponse {
                usage: vec![
                    proto::VolumeUsage {
                        available: 700,
                        total: 1000,
                        used: 300,
                        unit: Unit::Bytes as i32,
                    },
                    proto::VolumeUsage {
                        available: 90,
                        total: 100,
                        used: 10,
                        unit: Unit::Inodes as i32,
                    },
                ],
                volume_condition: Some(proto::VolumeCondition {
                    abnormal: true,
                    message: "disk on fire".into(),
                }),
            }))
        }
        async fn node_expand_volume(
            &self,
            _: tonic::Request<proto::NodeExpandVolumeRequest>,
        ) -> Result<tonic::Response<proto::NodeExpandVolumeResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("no expansion"))
        }
        async fn node_get_capabilities(
            &self,
            _: tonic::Request<proto::NodeGetCapabilitiesRequest>,
        ) -> Result<tonic::Response<proto::NodeGetCapabilitiesResponse>, tonic::Status> {
            use proto::node_service_capability::{Rpc, Type as Cap};
            Ok(tonic::Response::new(proto::NodeGetCapabilitiesResponse {
                capabilities: self
                    .caps
                    .iter()
                    .map(|t| proto::NodeServiceCapability {
                        r#type: Some(Cap::Rpc(Rpc { r#type: *t as i32 })),
                    })
                    .collect(),
            }))
        }
        async fn node_get_info(
            &self,
            _: tonic::Request<proto::NodeGetInfoRequest>,
        ) -> Result<tonic::Response<proto::NodeGetInfoResponse>, tonic::Status> {
            Ok(tonic::Response::new(Default::default()))
        }
    }

    /// Serves `node` on a socket under `root` and registers it as `name`.
    fn register(root: &Path, registry: &Registry, name: &str, node: FakeNode) {
        let sock = root.join(format!("{name}.sock"));
        crate::volume::csi::registration::tests::serve(
            tokio::net::UnixListener::bind(&sock).unwrap(),
            proto::node_server::NodeServer::new(node),
        );
        registry.set(
            name,
            super::super::Driver {
                endpoint: sock.to_string_lossy().into_owned(),
                version: super::super::Version::parse("1.0.0").unwrap(),
                node_id: String::new(),
                max_volumes: 0,
                topology: Default::default(),
            },
        );
    }

    fn test_root(tag: &str) -> PathBuf {
        crate::testutil::tempdir(&format!("csimnt-{tag}"))
    }

    #[tokio::test]
    async fn an_orphaned_pods_csi_volumes_are_unpublished_from_vol_data() {
        let root = test_root("orph");
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
        let node = FakeNode::default();
        register(&root, &registry, "d.csi", node.clone());
        tear_down_orphaned(&registry, &root, "u1").await.unwrap();
        assert_eq!(
            node.calls.lock().unpublished.clone(),
            vec![("csi-abc".to_string(), target.to_string_lossy().into_owned())]
        );
        // An ephemeral volume was never staged.
        assert!(node.calls.lock().unstaged.is_empty());
        assert!(!target.parent().unwrap().exists());
        // Nothing left: nothing to do.
        tear_down_orphaned(&registry, &root, "u1").await.unwrap();
        tear_down_orphaned(&registry, &root, "u2").await.unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Writes what set-up leaves for a persistent volume published into
    /// pod `uid`: the target with its vol_data.json, the global mount
    /// path with its own.
    fn leave_persistent(root: &Path, uid: &str, pv: &str, handle: &str) -> (PathBuf, PathBuf) {
        let target = target_path(root, uid, pv);
        std::fs::create_dir_all(&target).unwrap();
        let data = vol_data(pv, handle, "d.csi", "n", "Persistent");
        std::fs::write(
            target.parent().unwrap().join(VOL_DATA_FILE),
            data.to_string(),
        )
        .unwrap();
        let g = global_mount_path(root, "d.csi", handle);
        std::fs::create_dir_all(&g).unwrap();
        std::fs::write(
            g.parent().unwrap().join(VOL_DATA_FILE),
            device_vol_data(handle, "d.csi").to_string(),
        )
        .unwrap();
        (target, g)
    }

    #[tokio::test]
    async fn the_publish_context_reaches_node_stage_and_node_publish() {
        let root = test_root("pubctx");
        let registry = Registry::default();
        let node = FakeNode {
            caps: vec![CapType::StageUnstageVolume],
            ..Default::default()
        };
        register(&root, &registry, "d.csi", node.clone());
        let svc = node_service(&registry, "d.csi").unwrap();
        let ctx: HashMap<String, String> = [("devicePath".to_string(), "/dev/xvdf".to_string())]
            .into_iter()
            .collect();
        let req = VolumeRequest {
            volume_id: "h".into(),
            publish_context: ctx.clone(),
            ..Default::default()
        };
        let g = root.join("g");
        svc.stage(&req, &g.to_string_lossy()).await.unwrap();
        svc.publish(
            &req,
            &g.to_string_lossy(),
            &root.join("t").to_string_lossy(),
        )
        .await
        .unwrap();
        let calls = node.calls.lock();
        assert_eq!(calls.staged[0].publish_context, ctx);
        assert_eq!(calls.published[0].publish_context, ctx);
        drop(calls);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn an_orphaned_persistent_volume_is_unstaged_once_no_other_pod_has_it() {
        let root = test_root("orph-pv");
        let registry = Registry::default();
        let node = FakeNode {
            caps: vec![CapType::StageUnstageVolume],
            ..Default::default()
        };
        register(&root, &registry, "d.csi", node.clone());
        let (t1, g) = leave_persistent(&root, "u1", "pv-1", "h1");
        let (t2, _) = leave_persistent(&root, "u2", "pv-1", "h1");
        // u2 still has it: u1's copy is unpublished only.
        tear_down_orphaned(&registry, &root, "u1").await.unwrap();
        assert_eq!(node.calls.lock().unpublished.len(), 1);
        assert!(node.calls.lock().unstaged.is_empty());
        assert!(!t1.parent().unwrap().exists() && g.is_dir());
        // The last user goes: unstaged, and the global directory with its
        // vol_data.json removed.
        tear_down_orphaned(&registry, &root, "u2").await.unwrap();
        assert_eq!(
            node.calls.lock().unstaged.clone(),
            vec![("h1".to_string(), g.to_string_lossy().into_owned())]
        );
        assert!(!t2.parent().unwrap().exists());
        assert!(!g.parent().unwrap().exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The clean-up of a pod gone while rkubelet was down takes the
    /// volume's lock before it looks for other users and unstages: a set-up
    /// holding it (which may be writing its own vol_data.json) goes first.
    #[tokio::test]
    async fn an_orphans_persistent_volume_waits_for_an_operation_on_it() {
        let root = test_root("orph-lock");
        let registry = Registry::default();
        let node = FakeNode {
            caps: vec![CapType::StageUnstageVolume],
            ..Default::default()
        };
        register(&root, &registry, "d.csi", node.clone());
        leave_persistent(&root, "u1", "pv-1", "h1");
        let held = registry.lock_volume("d.csi", "h1").await;
        let (r, rt) = (registry.clone(), root.clone());
        let cleanup = tokio::spawn(async move { tear_down_orphaned(&r, &rt, "u1").await });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while registry.volume_lock_users("d.csi", "h1") < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the clean-up never waited"
            );
            tokio::task::yield_now().await;
        }
        assert!(node.calls.lock().unpublished.is_empty());
        drop(held);
        cleanup.await.unwrap().unwrap();
        assert_eq!(node.calls.lock().unstaged.len(), 1);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn a_driver_without_staging_is_not_unstaged_but_its_global_dir_goes() {
        let root = test_root("orph-nostage");
        let registry = Registry::default();
        let node = FakeNode::default();
        register(&root, &registry, "d.csi", node.clone());
        let (_, g) = leave_persistent(&root, "u1", "pv-1", "h1");
        tear_down_orphaned(&registry, &root, "u1").await.unwrap();
        assert!(node.calls.lock().unstaged.is_empty());
        assert!(!g.parent().unwrap().exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_kubelet_applies_the_fs_group_as_upstreams_supports_fs_group() {
        use FsGroupPolicy::{File, ReadWriteOnceWithFsType};
        let rwo = ["ReadWriteOnce".to_string()];
        let rwop = ["ReadWriteOncePod".to_string()];
        let rox = ["ReadOnlyMany".to_string()];
        // No fsGroup, policy None, or a read-only volume: never.
        assert!(!supports_fs_group("ext4", false, File, false, None));
        assert!(!supports_fs_group(
            "ext4",
            true,
            FsGroupPolicy::None,
            false,
            Some(&rwo)
        ));
        assert!(!supports_fs_group("ext4", true, File, true, None));
        // File: always, whatever the fsType and access modes.
        assert!(supports_fs_group("", true, File, false, Some(&rox)));
        // The default: an fsType and ReadWriteOnce(Pod), or inline.
        assert!(!supports_fs_group(
            "",
            true,
            ReadWriteOnceWithFsType,
            false,
            Some(&rwo)
        ));
        assert!(supports_fs_group(
            "ext4",
            true,
            ReadWriteOnceWithFsType,
            false,
            Some(&rwo)
        ));
        assert!(supports_fs_group(
            "ext4",
            true,
            ReadWriteOnceWithFsType,
            false,
            Some(&rwop)
        ));
        assert!(!supports_fs_group(
            "ext4",
            true,
            ReadWriteOnceWithFsType,
            false,
            Some(&rox)
        ));
        assert!(!supports_fs_group(
            "ext4",
            true,
            ReadWriteOnceWithFsType,
            false,
            Some(&[])
        ));
        assert!(supports_fs_group(
            "ext4",
            true,
            ReadWriteOnceWithFsType,
            false,
            None
        ));
    }

    fn pod_with_fs_group(gid: Option<i64>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-fs"},
            "spec": {"containers": [], "securityContext": {"fsGroup": gid}}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn an_inline_volume_gets_the_fs_group_from_the_kubelet_or_as_mount_group() {
        use std::os::unix::fs::PermissionsExt;
        let root = test_root("fsgroup");
        let objects = ObjectManager::default();
        let src = CSIVolumeSource {
            driver: "d.csi".into(),
            fs_type: Some("ext4".into()),
            ..Default::default()
        };
        // Without VOLUME_MOUNT_GROUP the kubelet changes the group of the
        // published target (no CSIDriver to ask: the default policy).
        let registry = Registry::default();
        let node = FakeNode::default();
        register(&root, &registry, "d.csi", node.clone());
        let pod = pod_with_fs_group(Some(4321));
        let p = set_up_inline(&registry, &objects, &root, &pod, "data", &src)
            .await
            .unwrap();
        let m = std::fs::metadata(&p.target).unwrap();
        assert_eq!(m.gid(), 4321);
        assert_ne!(m.permissions().mode() & libc::S_ISGID, 0);
        let req = node.calls.lock().published[0].clone();
        let mount = |r: &proto::NodePublishVolumeRequest| match r
            .volume_capability
            .as_ref()
            .and_then(|c| c.access_type.clone())
        {
            Some(proto::volume_capability::AccessType::Mount(m)) => m.volume_mount_group,
            other => panic!("{other:?}"),
        };
        assert_eq!(mount(&req), "");
        assert!(!p.republish);

        // With it, the driver gets the group and the kubelet leaves the
        // directory alone.
        let root2 = test_root("fsgroup-mg");
        let registry = Registry::default();
        let node = FakeNode {
            caps: vec![CapType::VolumeMountGroup],
            ..Default::default()
        };
        register(&root2, &registry, "d.csi", node.clone());
        let p = set_up_inline(&registry, &objects, &root2, &pod, "data", &src)
            .await
            .unwrap();
        assert_eq!(mount(&node.calls.lock().published[0]), "4321");
        assert_ne!(std::fs::metadata(&p.target).unwrap().gid(), 4321);
        // No fsGroup: no group either way.
        let pod = pod_with_fs_group(None);
        set_up_inline(&registry, &objects, &root2, &pod, "other", &src)
            .await
            .unwrap();
        assert_eq!(mount(&node.calls.lock().published[1]), "");
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&root2);
    }

    #[tokio::test]
    async fn a_persistent_volume_is_named_after_its_pv_with_upstreams_vol_data() {
        let root = test_root("pvpaths");
        let objects = ObjectManager::default();
        let registry = Registry::default();
        registry.set_node_name("node-a");
        let node = FakeNode {
            caps: vec![CapType::StageUnstageVolume],
            ..Default::default()
        };
        register(&root, &registry, "pvpaths.csi", node.clone());
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-7"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "pvpaths.csi", "volumeHandle": "h-7"}}
        }))
        .unwrap();
        let pod = pod_with_fs_group(None);
        let p = set_up_persistent(&registry, &objects, &root, &pod, &pv, false, true)
            .await
            .unwrap();
        // Upstream's volume spec name for a claim is the PV's.
        assert_eq!(p.target, target_path(&root, "u-fs", "pv-7"));
        let g = global_mount_path(&root, "pvpaths.csi", "h-7");
        assert_eq!(p.staging.as_deref(), Some(g.as_path()));
        let read = |f: PathBuf| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap()
        };
        assert_eq!(
            read(p.target.parent().unwrap().join(VOL_DATA_FILE)),
            serde_json::json!({
                "specVolID": "pv-7", "volumeHandle": "h-7", "driverName": "pvpaths.csi",
                "nodeName": "node-a", "volumeLifecycleMode": "Persistent",
                "attachmentID": attachment_name("h-7", "pvpaths.csi", "node-a"),
            })
        );
        assert_eq!(
            read(g.parent().unwrap().join(VOL_DATA_FILE)),
            serde_json::json!({"volumeHandle": "h-7", "driverName": "pvpaths.csi"})
        );
        assert_eq!(node.calls.lock().staged.len(), 1);
        assert_eq!(
            node.calls.lock().published[0].staging_target_path,
            g.to_string_lossy()
        );
        // A republish does not stage again.
        set_up_persistent(&registry, &objects, &root, &pod, &pv, false, false)
            .await
            .unwrap();
        assert_eq!(node.calls.lock().staged.len(), 1);
        assert_eq!(node.calls.lock().published.len(), 2);
        // Tear-down: unpublished, unstaged, the global directory gone;
        // upstream's two operations timed, each once (none before).
        let ops = |op| {
            crate::metrics::certvol::storage_operation_count(
                "kubernetes.io/csi:pvpaths.csi",
                op,
                "success",
            )
        };
        assert_eq!((ops("volume_unmount"), ops("unmount_device")), (0, 0));
        tear_down(&registry, &p, false).await.unwrap();
        assert_eq!((ops("volume_unmount"), ops("unmount_device")), (1, 1));
        assert_eq!(node.calls.lock().unstaged.len(), 1);
        assert!(!g.parent().unwrap().exists());
        assert!(!p.target.parent().unwrap().exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn volume_stats_come_from_a_driver_with_get_volume_stats_only() {
        let root = test_root("stats");
        let registry = Registry::default();
        let p = Published {
            driver: "d.csi".into(),
            volume_id: "h".into(),
            target: root.join("t/mount"),
            staging: None,
            republish: false,
            block: false,
        };
        let t = Duration::from_secs(10);
        let e = super::super::metrics::volume_stats(&registry, &p, t, false)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not found in the list"), "{e}");
        let without = FakeNode::default();
        register(&root, &registry, "d.csi", without.clone());
        assert!(super::super::metrics::volume_stats(&registry, &p, t, false)
            .await
            .unwrap()
            .is_none());
        assert!(without.calls.lock().stats.is_empty());
        let with = FakeNode {
            caps: vec![CapType::GetVolumeStats],
            ..Default::default()
        };
        register(&root, &registry, "d2.csi", with.clone());
        let p = Published {
            driver: "d2.csi".into(),
            ..p
        };
        let s = super::super::metrics::volume_stats(&registry, &p, t, false)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                s.capacity,
                s.available,
                s.used,
                s.inodes,
                s.inodes_free,
                s.inodes_used
            ),
            (1000, 700, 300, 100, 90, 10)
        );
        // CSIVolumeHealth off (the default): the condition is not read.
        assert_eq!(s.condition, None);
        let asked = with.calls.lock().stats[0].clone();
        assert_eq!(asked.volume_id, "h");
        assert_eq!(asked.volume_path, p.target.to_string_lossy());
        // With the gate on, only a driver with VOLUME_CONDITION has its
        // condition read (csi_client.go's nodeSupportsVolumeCondition).
        let s = super::super::metrics::volume_stats(&registry, &p, t, true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.condition, None);
        let healthy = FakeNode {
            caps: vec![CapType::GetVolumeStats, CapType::VolumeCondition],
            ..Default::default()
        };
        register(&root, &registry, "d4.csi", healthy);
        let p4 = Published {
            driver: "d4.csi".into(),
            ..p.clone()
        };
        let s = super::super::metrics::volume_stats(&registry, &p4, t, true)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.condition, Some((true, "disk on fire".to_string())));
        let s = super::super::metrics::volume_stats(&registry, &p4, t, false)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.condition, None);
        // A raw block volume's figures are asked for at the pod's bind
        // under the global map path (NewBlockVolumeMapper's NewMetricsCsi).
        let block = Published {
            target: super::super::block::publish_path(&root, "pv1", "u1"),
            block: true,
            ..p.clone()
        };
        super::super::metrics::volume_stats(&registry, &block, t, false)
            .await
            .unwrap()
            .unwrap();
        let asked = with.calls.lock().stats.last().cloned().unwrap();
        assert_eq!(
            Path::new(&asked.volume_path),
            super::super::block::global_map_path(&root, "pv1").join("u1")
        );
        // An answer without usage is an error (upstream), not zeros.
        let empty = FakeNode {
            caps: vec![CapType::GetVolumeStats],
            no_usage: true,
            ..Default::default()
        };
        register(&root, &registry, "d3.csi", empty);
        let p = Published {
            driver: "d3.csi".into(),
            ..p
        };
        let e = super::super::metrics::volume_stats(&registry, &p, t, false)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("usage is nil"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn tokens_are_a_json_map_of_audience_to_token_request_status() {
        let (k, v) = tokens_context(vec![
            (
                "vault".to_string(),
                crate::objects::Token {
                    token: "t1".into(),
                    expires_at: 1_700_000_000,
                    refresh_at: 0,
                },
            ),
            (
                String::new(),
                crate::objects::Token {
                    token: "t0".into(),
                    expires_at: 1_700_000_600,
                    refresh_at: 0,
                },
            ),
        ])
        .unwrap();
        assert_eq!(k, "csi.storage.k8s.io/serviceAccount.tokens");
        let j: serde_json::Value = serde_json::from_str(&v).unwrap();
        assert_eq!(
            j,
            serde_json::json!({
                "vault": {"token": "t1", "expirationTimestamp": "2023-11-14T22:13:20Z"},
                "": {"token": "t0", "expirationTimestamp": "2023-11-14T22:23:20Z"},
            })
        );
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
