//! CSI node plugins on real containerd, in cluster mode against the
//! in-process API server double (static pods may not name CSI volumes,
//! as upstream): this test process plays the CSI driver (a tonic node
//! service on a Unix socket that mounts a tmpfs with a file in it at the
//! target path) and its node-driver-registrar (a registration socket in
//! `<root-dir>/plugins_registry/`). A pod with an inline `csi` volume
//! waits while the driver is unregistered, starts once it registers,
//! reads the driver's file, and on deletion the driver is asked to
//! unpublish and rkubelet's directories are gone. A persistent volume is
//! staged and published; a driver with GET_VOLUME_STATS feeds the pod's
//! volume stats and its claim's `kubelet_volume_stats_*`; tokenRequests
//! put tokens into the volume context, and requiresRepublish publishes
//! again at pod syncs. A volume whose driver requires attach waits for the
//! test, playing the attach/detach controller and the external-attacher,
//! and gets the VolumeAttachment's metadata as its publish context; a PV
//! the test grows (as the external-resizer) is expanded online with
//! NodeExpandVolume and its claim gets the new capacity. Raw block PVs are
//! staged, published and mapped (also for two pods, and for a driver that
//! does not stage), measured through the driver, republished for
//! requiresRepublish, and with CSIVolumeHealth on their driver's abnormal
//! condition is reported.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::apiserver::{ApiServer, ApiServerOptions};
use common::*;
use parking_lot::Mutex;
use rkubelet::cri::RuntimeService;
use rkubelet::volume::csi::proto::{self, node_server};
use rkubelet::volume::csi::registration_proto::{self as rp, registration_server};
use serde_json::{json, Value};
use tonic::{Request, Response, Status};

const T: Duration = Duration::from_secs(60);
const DRIVER: &str = "fake.csi.rkubelet.test";

/// What the fake driver was asked.
#[derive(Default)]
struct Calls {
    staged: Vec<proto::NodeStageVolumeRequest>,
    unstaged: Vec<proto::NodeUnstageVolumeRequest>,
    published: Vec<proto::NodePublishVolumeRequest>,
    unpublished: Vec<proto::NodeUnpublishVolumeRequest>,
    stats: Vec<proto::NodeGetVolumeStatsRequest>,
    expanded: Vec<proto::NodeExpandVolumeRequest>,
    /// Every stage, publish, unpublish and unstage in order.
    log: Vec<&'static str>,
    /// The volume a slow NodeUnstageVolume is working on.
    unstaging: Option<String>,
    /// Calls that came for a volume while its unstage was in flight.
    overlaps: Vec<String>,
}

#[derive(Clone, Default)]
struct FakeDriver {
    calls: Arc<Mutex<Calls>>,
    /// Reports STAGE_UNSTAGE_VOLUME: stages a tmpfs at the global mount
    /// path and bind-mounts it into each target.
    stages: bool,
    /// Reports GET_VOLUME_STATS: answers fixed figures.
    stats: bool,
    /// Reports VOLUME_MOUNT_GROUP.
    mount_group: bool,
    /// Reports EXPAND_VOLUME: NodeExpandVolume answers the size asked for.
    expands: bool,
    /// Reports VOLUME_CONDITION: NodeGetVolumeStats answers this
    /// condition (abnormal, message).
    condition: Option<(bool, &'static str)>,
    /// A slow driver: NodeUnstageVolume takes this long, or less when
    /// another call for the same volume arrives meanwhile (recorded in
    /// `Calls::overlaps`, which the CSI spec forbids the CO to send).
    slow_unstage: Option<Duration>,
    overlap: Arc<tokio::sync::Notify>,
}

impl FakeDriver {
    /// Records `what` as an overlap when volume `id` is being unstaged.
    fn entered(&self, id: &str, what: &str) {
        let mut c = self.calls.lock();
        if c.unstaging.as_deref() == Some(id) {
            c.overlaps
                .push(format!("{what} of {id} during its unstage"));
            self.overlap.notify_one();
        }
    }
}

/// What the fake driver's NodeGetVolumeStats answers: bytes
/// (available, total, used), inodes (free, total, used).
const STATS_BYTES: (i64, i64, i64) = (7_000, 10_000, 3_000);
const STATS_INODES: (i64, i64, i64) = (90, 100, 10);

fn mount_tmpfs(target: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let t = std::ffi::CString::new(target.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"csi-test".as_ptr(),
            t.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=1m".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn bind(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let f = std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap();
    let t = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            f.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the fake driver does to unstage and unpublish: unmount the path
/// and remove its directory (or a block volume's device file), if it is
/// there. A block staging directory holds the staged device as `device`:
/// that goes, the directory is the kubelet's.
async fn unmount_and_remove(dir: PathBuf) -> Result<(), Status> {
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let staged_device = dir.join("device");
        if std::fs::symlink_metadata(&staged_device).is_ok() {
            unmount(&staged_device)?;
            return std::fs::remove_file(&staged_device);
        }
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {
                unmount(&dir)?;
                std::fs::remove_dir(&dir)?;
            }
            Ok(_) => {
                unmount(&dir)?;
                std::fs::remove_file(&dir)?;
            }
            Err(_) => {}
        }
        Ok(())
    })
    .await
    .unwrap()
    .map_err(|e| Status::internal(e.to_string()))
}
fn unmount(target: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let t = std::ffi::CString::new(target.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(t.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The host device of a raw block volume (a Block capability; the PV's
/// `device` attribute names it), None for a mount.
fn block_device(
    cap: &Option<proto::VolumeCapability>,
    context: &HashMap<String, String>,
) -> Option<String> {
    let block = matches!(
        cap.as_ref().and_then(|c| c.access_type.as_ref()),
        Some(proto::volume_capability::AccessType::Block(_))
    );
    block.then(|| context.get("device").cloned().unwrap_or_default())
}

#[tonic::async_trait]
impl node_server::Node for FakeDriver {
    async fn node_stage_volume(
        &self,
        r: Request<proto::NodeStageVolumeRequest>,
    ) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
        if !self.stages {
            return Err(Status::unimplemented("no staging"));
        }
        let r = r.into_inner();
        self.entered(&r.volume_id, "NodeStageVolume");
        let g = PathBuf::from(&r.staging_target_path);
        if let Some(dev) = block_device(&r.volume_capability, &r.volume_context) {
            // A raw block volume: the device bound onto a file in the
            // staging directory the kubelet made.
            let file = g.join("device");
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                if !g.is_dir() {
                    return Err(std::io::Error::other("no staging directory"));
                }
                if std::fs::symlink_metadata(&file).is_err() {
                    std::fs::write(&file, "")?;
                    bind(Path::new(&dev), &file)?;
                }
                Ok(())
            })
            .await
            .unwrap()
            .map_err(|e| Status::internal(e.to_string()))?;
            let mut c = self.calls.lock();
            c.staged.push(r);
            c.log.push("stage");
            return Ok(Response::new(proto::NodeStageVolumeResponse {}));
        }
        // Staged already (a kubelet that restarted stages again): nothing
        // more to do, as NodeStageVolume is idempotent.
        if g.join("hello").exists() {
            self.calls.lock().staged.push(r);
            return Ok(Response::new(proto::NodeStageVolumeResponse {}));
        }
        let id = r.volume_id.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&g)?;
            mount_tmpfs(&g)?;
            std::fs::write(g.join("hello"), format!("staged {id}\n"))
        })
        .await
        .unwrap()
        .map_err(|e| Status::internal(e.to_string()))?;
        let mut c = self.calls.lock();
        c.staged.push(r);
        c.log.push("stage");
        Ok(Response::new(proto::NodeStageVolumeResponse {}))
    }
    async fn node_unstage_volume(
        &self,
        r: Request<proto::NodeUnstageVolumeRequest>,
    ) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.entered(&r.volume_id, "NodeUnstageVolume");
        if let Some(d) = self.slow_unstage {
            self.calls.lock().unstaging = Some(r.volume_id.clone());
            let _ = tokio::time::timeout(d, self.overlap.notified()).await;
            self.calls.lock().unstaging = None;
        }
        unmount_and_remove(PathBuf::from(&r.staging_target_path)).await?;
        let mut c = self.calls.lock();
        c.unstaged.push(r);
        c.log.push("unstage");
        Ok(Response::new(proto::NodeUnstageVolumeResponse {}))
    }
    /// As a real driver: creates the target, mounts a tmpfs there and
    /// fills it.
    async fn node_publish_volume(
        &self,
        r: Request<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.entered(&r.volume_id, "NodePublishVolume");
        let target = PathBuf::from(&r.target_path);
        if let Some(dev) = block_device(&r.volume_capability, &r.volume_context) {
            // A raw block volume: the driver creates the publish path as a
            // file (its parent is the kubelet's) and binds the device, the
            // staged one when it stages, onto it.
            let staged = Path::new(&r.staging_target_path).join("device");
            let from = if self.stages {
                staged
            } else {
                PathBuf::from(dev)
            };
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                if !target.parent().is_some_and(Path::is_dir) {
                    return Err(std::io::Error::other("no publish directory"));
                }
                if std::fs::symlink_metadata(&target).is_err() {
                    std::fs::write(&target, "")?;
                    bind(&from, &target)?;
                }
                Ok(())
            })
            .await
            .unwrap()
            .map_err(|e| Status::internal(e.to_string()))?;
            let mut c = self.calls.lock();
            c.published.push(r);
            c.log.push("publish");
            return Ok(Response::new(proto::NodePublishVolumeResponse {}));
        }
        // A republish of a published target (requiresRepublish) is
        // answered as a real driver does: nothing more to mount (the
        // target exists from the first publish until the unpublish).
        if target.exists() {
            self.calls.lock().published.push(r);
            return Ok(Response::new(proto::NodePublishVolumeResponse {}));
        }
        let greeting = r
            .volume_context
            .get("greeting")
            .cloned()
            .unwrap_or_default();
        let id = r.volume_id.clone();
        let staged = PathBuf::from(&r.staging_target_path);
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&target)?;
            if staged.as_os_str().is_empty() {
                mount_tmpfs(&target)?;
                std::fs::write(target.join("hello"), format!("{greeting} from {id}\n"))
            } else {
                bind(&staged, &target)
            }
        })
        .await
        .unwrap()
        .map_err(|e| Status::internal(e.to_string()))?;
        let mut c = self.calls.lock();
        c.published.push(r);
        c.log.push("publish");
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.entered(&r.volume_id, "NodeUnpublishVolume");
        unmount_and_remove(PathBuf::from(&r.target_path)).await?;
        let mut c = self.calls.lock();
        c.unpublished.push(r);
        c.log.push("unpublish");
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        use proto::volume_usage::Unit;
        if !self.stats {
            return Err(Status::unimplemented("no stats"));
        }
        self.calls.lock().stats.push(r.into_inner());
        let usage = |(available, total, used), unit: Unit| proto::VolumeUsage {
            available,
            total,
            used,
            unit: unit as i32,
        };
        Ok(Response::new(proto::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(STATS_BYTES, Unit::Bytes),
                usage(STATS_INODES, Unit::Inodes),
            ],
            volume_condition: self
                .condition
                .map(|(abnormal, message)| proto::VolumeCondition {
                    abnormal,
                    message: message.into(),
                }),
        }))
    }
    async fn node_expand_volume(
        &self,
        r: Request<proto::NodeExpandVolumeRequest>,
    ) -> Result<Response<proto::NodeExpandVolumeResponse>, Status> {
        if !self.expands {
            return Err(Status::unimplemented("no expansion"));
        }
        let r = r.into_inner();
        let bytes = r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        self.calls.lock().expanded.push(r);
        Ok(Response::new(proto::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        }))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        use proto::node_service_capability::{rpc::Type, Rpc, Type as Cap};
        let capabilities = [
            (self.stages, Type::StageUnstageVolume),
            (self.stats, Type::GetVolumeStats),
            (self.mount_group, Type::VolumeMountGroup),
            (self.expands, Type::ExpandVolume),
            (self.condition.is_some(), Type::VolumeCondition),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, t)| proto::NodeServiceCapability {
            r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }
    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: "fake-node-id".into(),
            max_volumes_per_node: 5,
            accessible_topology: Some(proto::Topology {
                segments: [("topology.fake.csi/zone".to_string(), "z1".to_string())].into(),
            }),
        }))
    }
}

#[derive(Clone)]
struct Registrar {
    endpoint: String,
    statuses: Arc<Mutex<Vec<rp::RegistrationStatus>>>,
}

#[tonic::async_trait]
impl registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: Request<rp::InfoRequest>,
    ) -> Result<Response<rp::PluginInfo>, Status> {
        Ok(Response::new(rp::PluginInfo {
            r#type: "CSIPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }
    async fn notify_registration_status(
        &self,
        r: Request<rp::RegistrationStatus>,
    ) -> Result<Response<rp::RegistrationStatusResponse>, Status> {
        self.statuses.lock().push(r.into_inner());
        Ok(Response::new(rp::RegistrationStatusResponse {}))
    }
}

/// Serves a generated tonic service on a Unix socket with hyper's HTTP/2
/// server.
fn serve<S>(rt: &tokio::runtime::Runtime, path: &Path, svc: S)
where
    S: tower::Service<
            tonic::codegen::http::Request<hyper::body::Incoming>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let _g = rt.enter();
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            tokio::spawn(async move {
                let hs = hyper::service::service_fn(move |req| {
                    let mut s = svc.clone();
                    tower::Service::call(&mut s, req)
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), hs)
                        .await;
            });
        }
    });
}

/// A runtime for the test's gRPC servers, with `driver` served on
/// `<kubelet dir>/csi.sock` (returned).
fn serve_driver(k: &Kubelet, driver: &FakeDriver) -> (tokio::runtime::Runtime, PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let endpoint = k.dir.join("csi.sock");
    serve(&rt, &endpoint, node_server::NodeServer::new(driver.clone()));
    (rt, endpoint)
}

/// A registrar for the driver at `endpoint`, served as `socket` in the
/// kubelet's plugins_registry, where rkubelet finds it.
fn register(rt: &tokio::runtime::Runtime, k: &Kubelet, endpoint: &Path, socket: &str) -> Registrar {
    let reg_dir = k.dir.join("root/plugins_registry");
    std::fs::create_dir_all(&reg_dir).unwrap();
    let registrar = Registrar {
        endpoint: endpoint.display().to_string(),
        statuses: Default::default(),
    };
    serve(
        rt,
        &reg_dir.join(socket),
        registration_server::RegistrationServer::new(registrar.clone()),
    );
    registrar
}

/// `driver` served and registered with kubelet `k`, and its CSIDriver
/// object of `spec` created; the returned runtime serves it (keep it).
fn driver_with_object(
    api: &ApiServer,
    k: &Kubelet,
    driver: &FakeDriver,
    spec: Value,
) -> tokio::runtime::Runtime {
    let (rt, endpoint) = serve_driver(k, driver);
    register(&rt, k, &endpoint, "reg.sock");
    api.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER}, "spec": spec
    }));
    rt
}

fn sha256_hex(data: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, data.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn container_id(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

fn cluster_kubelet(node: &str, api: &ApiServer) -> Kubelet {
    cluster_kubelet_with(node, api, "")
}

/// As [`cluster_kubelet`], with `more` appended to its configuration.
fn cluster_kubelet_with(node: &str, api: &ApiServer, more: &str) -> Kubelet {
    let mut k = Kubelet::new(node);
    let kc = api.node_kubeconfig(&k.dir, node);
    k.extra_args = vec!["--kubeconfig".into(), kc.display().to_string()];
    k.extra_config = format!(
        "nodeStatusUpdateFrequency: 1s\nsyncFrequency: 5s\nvolumeStatsAggPeriod: 1s\n{more}"
    );
    k.spawn();
    k
}

/// The messages of a pod's VolumeConditionAbnormal events.
fn condition_events(api: &ApiServer, pod: &str) -> Vec<String> {
    api.list("events")
        .into_iter()
        .filter(|e| e["reason"] == "VolumeConditionAbnormal" && e["involvedObject"]["name"] == pod)
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

/// The `/metrics` lines of the `kubelet_volume_stats_*` families.
fn volume_stat_lines(k: &Kubelet) -> Vec<String> {
    let (_, metrics) = http_get(&k.read_only, "/metrics").expect("/metrics");
    metrics
        .lines()
        .filter(|l| l.contains("kubelet_volume_stats"))
        .map(String::from)
        .collect()
}

fn running_pod(api: &ApiServer, name: &str) -> Value {
    wait_for(&format!("pod {name} Running in the API"), T, || {
        api.get("pods", Some("default"), name).filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().all(|c| c["state"]["running"].is_object()))
        })
    })
}

/// The FailedMount events of a pod, messages only.
fn failed_mounts(api: &ApiServer, pod: &str) -> Vec<String> {
    api.list("events")
        .into_iter()
        .filter(|e| e["reason"] == "FailedMount" && e["involvedObject"]["name"] == pod)
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

/// Successful `op` samples of the fake driver's volumes in
/// `storage_operation_duration_seconds` (0 when none).
fn ops_timed(k: &Kubelet, op: &str) -> u64 {
    let want = format!(
        "storage_operation_duration_seconds_count{{migrated=\"false\",operation_name=\"{op}\",status=\"success\",volume_plugin=\"kubernetes.io/csi:{DRIVER}\"}} "
    );
    http_get(&k.read_only, "/metrics")
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix(want.as_str())?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Claim `claim` (namespace default, spec `pvc_spec`) bound to PV `pv`
/// (spec `pv_spec`, plus the claimRef), as the PV controller leaves them.
fn bind_claim(api: &ApiServer, claim: &str, mut pvc_spec: Value, pv: &str, mut pv_spec: Value) {
    pvc_spec["volumeName"] = json!(pv);
    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": "default"}, "spec": pvc_spec}));
    pv_spec["claimRef"] =
        json!({"namespace": "default", "name": claim, "uid": pvc["metadata"]["uid"]});
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv}, "spec": pv_spec}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), claim)
        .unwrap();
    bound["status"] = json!({"phase": "Bound"});
    api.update_status(bound);
}

/// Claim `claim` (namespace default, 1Gi, ReadWriteOnce) bound to the CSI
/// PV `pv` of handle `handle`, as the PV controller leaves them.
fn bound_csi_claim(api: &ApiServer, pv: &str, handle: &str) {
    bind_claim(
        api,
        "claim",
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
        pv,
        json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": handle}}),
    );
}

#[test]
fn an_inline_csi_volume_waits_for_its_driver_is_published_read_and_unpublished() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi";
    let k = cluster_kubelet(node, &api);
    let root = k.dir.join("root");
    let driver = FakeDriver::default();
    let (rt, endpoint) = serve_driver(&k, &driver);
    // The driver asks for pod information and allows inline volumes.
    api.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"podInfoOnMount": true, "attachRequired": false,
            "volumeLifecycleModes": ["Ephemeral"]}
    }));

    // The pod comes first: its driver has not registered.
    let name = format!("csi-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "serviceAccountName": "default",
            "volumes": [{"name": "data", "csi": {"driver": DRIVER,
                "volumeAttributes": {"greeting": "hi"}}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }]
        }
    }));
    let msg = wait_for("FailedMount for the unregistered driver", T, || {
        failed_mounts(&api, &name).into_iter().next()
    });
    assert_eq!(
        msg,
        format!("MountVolume.SetUp failed for volume \"data\" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {DRIVER} not found in the list of registered CSI drivers")
    );
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_ne!(p["status"]["phase"], "Running");

    // The registrar appears: the driver registers and the pod starts.
    let registrar = register(&rt, &k, &endpoint, &format!("{DRIVER}-reg.sock"));
    let p = running_pod(&api, &name);
    let st = registrar.statuses.lock().clone();
    assert_eq!(st.len(), 1);
    assert!(st[0].plugin_registered, "{:?}", st[0]);
    // What NodeGetInfo said is on the Node and in its CSINode.
    let n = api.get("nodes", None, node).unwrap();
    assert_eq!(
        n["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"],
        format!("{{\"{DRIVER}\":\"fake-node-id\"}}")
    );
    assert_eq!(n["metadata"]["labels"]["topology.fake.csi/zone"], "z1");
    let cn = api.get("csinodes", None, node).expect("a CSINode");
    assert_eq!(
        cn["spec"]["drivers"],
        json!([{"name": DRIVER, "nodeID": "fake-node-id",
            "topologyKeys": ["topology.fake.csi/zone"], "allocatable": {"count": 5}}])
    );
    assert_eq!(cn["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(
        cn["metadata"]["ownerReferences"][0]["uid"],
        n["metadata"]["uid"]
    );

    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let handle = format!("csi-{}", sha256_hex(&format!("{uid}data")));
    let vol_dir = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/data"));
    let target = vol_dir.join("mount");
    let published = driver.calls.lock().published.clone();
    assert_eq!(published.len(), 1);
    let req = &published[0];
    assert_eq!(req.volume_id, handle);
    assert_eq!(Path::new(&req.target_path), target);
    assert!(req.staging_target_path.is_empty() && !req.readonly);
    let want: HashMap<String, String> = [
        ("greeting", "hi"),
        ("csi.storage.k8s.io/pod.name", name.as_str()),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", uid.as_str()),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        ("csi.storage.k8s.io/ephemeral", "true"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(req.volume_context, want);
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(vol_dir.join("vol_data.json")).unwrap())
            .unwrap();
    assert_eq!(data["driverName"], DRIVER);
    assert_eq!(data["volumeHandle"], handle.as_str());
    assert_eq!(data["specVolID"], "data");
    assert_eq!(data["nodeName"], node);
    assert_eq!(data["volumeLifecycleMode"], "Ephemeral");

    // The container reads what the driver put there.
    let id = container_id(&p);
    let out = k
        .cri
        .rt
        .block_on(
            k.cri
                .client
                .exec_sync(&id, vec!["cat".into(), "/data/hello".into()], 10),
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("hi from {handle}")
    );

    // Pod deleted: the driver unpublishes, rkubelet's directories go.
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnpublishVolume", T, || {
        (!driver.calls.lock().unpublished.is_empty()).then_some(())
    });
    let un = driver.calls.lock().unpublished.clone();
    assert_eq!(un[0].volume_id, handle);
    assert_eq!(Path::new(&un[0].target_path), target);
    wait_for("the volume directory removed", T, || {
        (!path_exists(&vol_dir)).then_some(())
    });
    assert_eq!(driver.calls.lock().published.len(), 1);
}

#[test]
fn an_inline_volume_of_a_driver_without_ephemeral_mode_is_refused_as_upstream() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-mode";
    let k = cluster_kubelet(node, &api);
    let driver = FakeDriver::default();
    let (rt, endpoint) = serve_driver(&k, &driver);
    let registrar = register(&rt, &k, &endpoint, "reg.sock");
    wait_for("the driver registered", T, || {
        (!registrar.statuses.lock().is_empty()).then_some(())
    });
    // No CSIDriver object: only persistent volumes (upstream).
    let name = format!("nomode-{node}");
    api.create(data_pod(&name, node, json!({"csi": {"driver": DRIVER}})));
    let msg = wait_for("FailedMount for the missing CSIDriver", T, || {
        failed_mounts(&api, &name).into_iter().next()
    });
    assert_eq!(
        msg,
        format!("MountVolume.SetUp failed for volume \"data\" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode \"Ephemeral\" not supported by driver {DRIVER} (no CSIDriver object)")
    );
    assert!(driver.calls.lock().published.is_empty());
    api.delete("pods", Some("default"), &name, Some(0));
}

#[test]
fn a_csi_persistent_volume_is_staged_published_and_unstaged() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-pv";
    let k = cluster_kubelet(node, &api);
    let root = k.dir.join("root");
    let driver = FakeDriver {
        stages: true,
        ..Default::default()
    };
    // rkubelet does not attach: the driver says it needs none.
    let _rt = driver_with_object(
        &api,
        &k,
        &driver,
        json!({"attachRequired": false, "volumeLifecycleModes": ["Persistent"]}),
    );
    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "csi-pv"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "csi-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1", "volumeAttributes": {"tier": "gold"}},
            "claimRef": {"namespace": "default", "name": "claim", "uid": pvc["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "claim")
        .unwrap();
    bound["status"] = json!({"phase": "Bound"});
    api.update_status(bound);

    let name = format!("pv-{node}");
    api.create(claim_pod(&name, node, "claim"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let global = root.join(format!(
        "plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        sha256_hex("vol-1")
    ));
    // Upstream names a claim's directory after the PV.
    let target = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/csi-pv/mount"));
    let data: Value = serde_json::from_str(
        &std::fs::read_to_string(target.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(data["specVolID"], "csi-pv");
    assert_eq!(data["volumeLifecycleMode"], "Persistent");
    let device_data: Value = serde_json::from_str(
        &std::fs::read_to_string(global.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        device_data,
        json!({"driverName": DRIVER, "volumeHandle": "vol-1"})
    );
    let calls = driver.calls.lock();
    assert_eq!(calls.staged.len(), 1);
    assert_eq!(calls.staged[0].volume_id, "vol-1");
    assert_eq!(Path::new(&calls.staged[0].staging_target_path), global);
    assert_eq!(calls.staged[0].volume_context["tier"], "gold");
    let mode = calls.staged[0]
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_mode.as_ref())
        .map(|m| m.mode);
    assert_eq!(
        mode,
        Some(proto::volume_capability::access_mode::Mode::SingleNodeWriter as i32)
    );
    assert_eq!(calls.published.len(), 1);
    let pubr = &calls.published[0];
    assert_eq!(pubr.volume_id, "vol-1");
    assert_eq!(Path::new(&pubr.staging_target_path), global);
    assert_eq!(Path::new(&pubr.target_path), target);
    // No podInfoOnMount: the PV's attributes only.
    let want: HashMap<String, String> = [("tier".to_string(), "gold".to_string())].into();
    assert_eq!(pubr.volume_context, want);
    drop(calls);
    let id = container_id(&p);
    let out = k
        .cri
        .rt
        .block_on(
            k.cri
                .client
                .exec_sync(&id, vec!["cat".into(), "/data/hello".into()], 10),
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "staged vol-1");

    // Deleted: unpublished, then unstaged; rkubelet's directories go.
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnstageVolume", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
    let calls = driver.calls.lock();
    assert_eq!(calls.unpublished.len(), 1);
    assert_eq!(Path::new(&calls.unpublished[0].target_path), target);
    assert_eq!(calls.unstaged[0].volume_id, "vol-1");
    assert_eq!(Path::new(&calls.unstaged[0].staging_target_path), global);
    drop(calls);
    wait_for("the global mount directory removed", T, || {
        (!path_exists(global.parent().unwrap())).then_some(())
    });
    assert!(!path_exists(target.parent().unwrap()));
    // Timed apart as upstream's two operations (operation_generator.go).
    wait_for("volume_unmount and unmount_device timed", T, || {
        (ops_timed(&k, "volume_unmount") == 1 && ops_timed(&k, "unmount_device") == 1).then_some(())
    });

    // The registrar goes: the driver is deregistered and leaves the
    // CSINode and the Node's annotation (its topology labels stay).
    wait_for("the driver in the CSINode", T, || {
        api.get("csinodes", None, node).filter(|c| {
            c["spec"]["drivers"]
                .as_array()
                .is_some_and(|d| d.len() == 1)
        })
    });
    std::fs::remove_file(k.dir.join("root/plugins_registry/reg.sock")).unwrap();
    wait_for("the driver gone from the CSINode", T, || {
        api.get("csinodes", None, node)
            .filter(|c| c["spec"]["drivers"] == json!([]))
    });
    // The annotation goes after the CSINode entry (upstream's order).
    let n = wait_for("the node ID annotation removed", T, || {
        api.get("nodes", None, node).filter(|n| {
            n["metadata"]["annotations"]
                .get("csi.volume.kubernetes.io/nodeid")
                .is_none()
        })
    });
    assert_eq!(n["metadata"]["labels"]["topology.fake.csi/zone"], "z1");
}

/// What the external-resizer leaves when it grows PV `pv` and claim
/// `claim` (namespace default) to `size` and the node's part is pending:
/// the updated claim with that status, for the caller to add to and write
/// with `update_status`.
fn grow_to_node_resize(api: &ApiServer, pv: &str, claim: &str, size: &str) -> Value {
    let mut p = api.get("persistentvolumes", None, pv).unwrap();
    p["spec"]["capacity"]["storage"] = json!(size);
    api.update(p);
    let mut c = api
        .get("persistentvolumeclaims", Some("default"), claim)
        .unwrap();
    c["spec"]["resources"]["requests"]["storage"] = json!(size);
    let mut c = api.update(c);
    c["status"]["allocatedResources"] = json!({"storage": size});
    c["status"]["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
    c
}

/// A pod whose container has volume `data` (of `source`) at /data.
fn data_pod(name: &str, node: &str, mut source: Value) -> Value {
    source["name"] = json!("data");
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "volumes": [source],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }]
        }
    })
}

/// A pod on claim `claim` with its volume at /data.
fn claim_pod(name: &str, node: &str, claim: &str) -> Value {
    data_pod(
        name,
        node,
        json!({"persistentVolumeClaim": {"claimName": claim}}),
    )
}

/// Pod B comes for a volume while pod A's tear-down is unstaging it on a
/// slow driver: B's set-up waits for the unstage (no call for the volume
/// while it is in flight), then stages and publishes it again. Before,
/// B's stage and publish went to the driver during A's unstage, which
/// then removed what B had just published.
#[test]
fn a_volume_being_unstaged_for_one_pod_is_staged_again_for_the_next_only_afterwards() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-serial";
    let k = cluster_kubelet(node, &api);
    // The window in which a second call would overlap: an unstage ends
    // early when one arrives, so only the fixed kubelet waits it out.
    let driver = FakeDriver {
        stages: true,
        slow_unstage: Some(Duration::from_secs(4)),
        ..Default::default()
    };
    let _rt = driver_with_object(
        &api,
        &k,
        &driver,
        json!({"attachRequired": false, "volumeLifecycleModes": ["Persistent"]}),
    );
    bound_csi_claim(&api, "csi-serial-pv", "vol-s");
    let (a, b) = (format!("a-{node}"), format!("b-{node}"));
    api.create(claim_pod(&a, node, "claim"));
    running_pod(&api, &a);
    assert_eq!(driver.calls.lock().log, ["stage", "publish"]);

    api.delete("pods", Some("default"), &a, Some(0));
    wait_for("pod a's unstage in flight", T, || {
        driver.calls.lock().unstaging.is_some().then_some(())
    });
    api.create(claim_pod(&b, node, "claim"));
    let p = running_pod(&api, &b);
    let calls = driver.calls.lock();
    assert_eq!(calls.overlaps, Vec::<String>::new());
    assert_eq!(
        calls.log,
        [
            "stage",
            "publish",
            "unpublish",
            "unstage",
            "stage",
            "publish"
        ]
    );
    drop(calls);
    let out = k
        .cri
        .rt
        .block_on(k.cri.client.exec_sync(
            &container_id(&p),
            vec!["cat".into(), "/data/hello".into()],
            10,
        ))
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "staged vol-s");

    api.delete("pods", Some("default"), &b, Some(0));
    wait_for("pod b's unstage", T, || {
        (driver.calls.lock().unstaged.len() == 2).then_some(())
    });
    assert_eq!(driver.calls.lock().overlaps, Vec::<String>::new());
}

#[test]
fn a_pod_deleted_while_rkubelet_was_down_has_its_csi_volume_unpublished_after_restart() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-restart";
    let mut k = cluster_kubelet(node, &api);
    let root = k.dir.join("root");
    let driver = FakeDriver::default();
    let (rt, endpoint) = serve_driver(&k, &driver);
    let registrar = register(&rt, &k, &endpoint, "reg.sock");
    api.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"volumeLifecycleModes": ["Ephemeral"]}
    }));
    let name = format!("gone-{node}");
    api.create(data_pod(&name, node, json!({"csi": {"driver": DRIVER}})));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let pod_dir = root.join("pods").join(&uid);
    let target = pod_dir.join("volumes/kubernetes.io~csi/data/mount");
    assert_eq!(driver.calls.lock().published.len(), 1);

    // Deleted while rkubelet is down: after the restart the driver (found
    // again by the scan at start) unpublishes what vol_data.json names,
    // and only then does the pod directory go.
    k.stop();
    api.delete("pods", Some("default"), &name, Some(0));
    k.spawn();
    wait_for("NodeUnpublishVolume after the restart", T, || {
        (!driver.calls.lock().unpublished.is_empty()).then_some(())
    });
    let un = driver.calls.lock().unpublished.clone();
    assert_eq!(Path::new(&un[0].target_path), target);
    assert_eq!(
        un[0].volume_id,
        format!("csi-{}", sha256_hex(&format!("{uid}data")))
    );
    wait_for("the orphaned pod directory removed", T, || {
        (!path_exists(&pod_dir)).then_some(())
    });
    let st = registrar.statuses.lock().clone();
    assert!(
        st.len() >= 2 && st.last().is_some_and(|s| s.plugin_registered),
        "registered again after the restart: {st:?}"
    );
}

#[test]
fn driver_stats_tokens_mount_group_and_republish_follow_the_csidriver() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-stats";
    api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}}));
    let k = cluster_kubelet(node, &api);
    let root = k.dir.join("root");
    let driver = FakeDriver {
        stats: true,
        mount_group: true,
        ..Default::default()
    };
    // Tokens for one audience, published again at every pod sync.
    let _rt = driver_with_object(
        &api,
        &k,
        &driver,
        json!({"attachRequired": false, "requiresRepublish": true,
            "tokenRequests": [{"audience": "vault", "expirationSeconds": 600}]}),
    );
    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "stats-pv"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "stats-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": "vol-s", "fsType": "ext4"},
            "claimRef": {"namespace": "default", "name": "claim", "uid": pvc["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "claim")
        .unwrap();
    bound["status"] = json!({"phase": "Bound"});
    api.update_status(bound);

    let name = format!("stats-{node}");
    api.create(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 1,
            "serviceAccountName": "default",
            "securityContext": {"fsGroup": 2000},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "claim"}}],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "exec sleep 3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }]
        }
    }));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let target = root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~csi/stats-pv/mount"
    ));

    // The token for "vault" is in the volume context, bound to the pod.
    let first = driver.calls.lock().published[0].clone();
    assert_eq!(Path::new(&first.target_path), target);
    let tokens: Value = serde_json::from_str(
        first
            .volume_context
            .get("csi.storage.k8s.io/serviceAccount.tokens")
            .expect("the tokens key"),
    )
    .unwrap();
    let t = &tokens["vault"];
    assert!(
        t["token"].as_str().is_some_and(|t| !t.is_empty()),
        "{tokens}"
    );
    assert!(
        t["expirationTimestamp"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z')),
        "{tokens}"
    );
    assert_eq!(tokens.as_object().unwrap().len(), 1);
    let asked: Vec<Value> = api
        .token_requests()
        .into_iter()
        .filter(|(ns, sa, _)| ns == "default" && sa == "default")
        .map(|(_, _, spec)| spec)
        .collect();
    let spec = asked
        .iter()
        .find(|s| s["audiences"] == json!(["vault"]))
        .expect("a TokenRequest for vault");
    assert_eq!(spec["expirationSeconds"], 600);
    assert_eq!(spec["boundObjectRef"]["kind"], "Pod");
    assert_eq!(spec["boundObjectRef"]["name"], name.as_str());
    assert_eq!(spec["boundObjectRef"]["uid"], uid.as_str());
    // VOLUME_MOUNT_GROUP: the fsGroup goes to the driver.
    let group = match first
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    {
        Some(proto::volume_capability::AccessType::Mount(m)) => m.volume_mount_group,
        other => panic!("{other:?}"),
    };
    assert_eq!(group, "2000");

    // requiresRepublish: published again at a later pod sync (every 5 s
    // here), to the same target.
    wait_for("a second NodePublishVolume", T, || {
        (driver.calls.lock().published.len() >= 2).then_some(())
    });
    let again = driver.calls.lock().published[1].clone();
    assert_eq!(again.target_path, first.target_path);
    assert!(again
        .volume_context
        .contains_key("csi.storage.k8s.io/serviceAccount.tokens"));

    // The driver's figures are the pod's volume stats, with the claim.
    let vol = summary_volume(&k, &uid, "data", T);
    assert_eq!(vol["usedBytes"], STATS_BYTES.2);
    assert_eq!(vol["capacityBytes"], STATS_BYTES.1);
    assert_eq!(vol["availableBytes"], STATS_BYTES.0);
    assert_eq!(vol["inodes"], STATS_INODES.1);
    assert_eq!(vol["inodesFree"], STATS_INODES.0);
    assert_eq!(vol["inodesUsed"], STATS_INODES.2);
    assert_eq!(
        vol["pvcRef"],
        json!({"name": "claim", "namespace": "default"})
    );
    let asked = driver.calls.lock().stats[0].clone();
    assert_eq!(asked.volume_id, "vol-s");
    assert_eq!(Path::new(&asked.volume_path), target);
    let (_, metrics) = http_get(&k.read_only, "/metrics").expect("/metrics");
    assert!(
        metrics.lines().any(|l| l
            == format!(
                "kubelet_volume_stats_used_bytes{{namespace=\"default\",persistentvolumeclaim=\"claim\"}} {}",
                STATS_BYTES.2
            )),
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("kubelet_volume_stats"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnpublishVolume", T, || {
        (!driver.calls.lock().unpublished.is_empty()).then_some(())
    });
}

#[test]
fn a_staged_volume_of_a_pod_deleted_while_rkubelet_was_down_is_unstaged_after_restart() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-restart-pv";
    let mut k = cluster_kubelet(node, &api);
    let root = k.dir.join("root");
    let driver = FakeDriver {
        stages: true,
        ..Default::default()
    };
    let _rt = driver_with_object(&api, &k, &driver, json!({"attachRequired": false}));
    bound_csi_claim(&api, "restart-pv", "vol-r");
    let name = format!("gone-{node}");
    api.create(claim_pod(&name, node, "claim"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let pod_dir = root.join("pods").join(&uid);
    let global = root.join(format!(
        "plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        sha256_hex("vol-r")
    ));
    assert_eq!(driver.calls.lock().staged.len(), 1);

    // Deleted while rkubelet is down: after the restart the volume is
    // unpublished and, no other pod having it, unstaged; the global
    // directory and the pod directory go.
    k.stop();
    api.delete("pods", Some("default"), &name, Some(0));
    k.spawn();
    wait_for("NodeUnstageVolume after the restart", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
    let calls = driver.calls.lock();
    assert_eq!(calls.unpublished.len(), 1);
    assert_eq!(
        Path::new(&calls.unpublished[0].target_path),
        pod_dir.join("volumes/kubernetes.io~csi/restart-pv/mount")
    );
    assert_eq!(calls.unstaged[0].volume_id, "vol-r");
    assert_eq!(Path::new(&calls.unstaged[0].staging_target_path), global);
    drop(calls);
    wait_for("the global mount directory removed", T, || {
        (!path_exists(global.parent().unwrap())).then_some(())
    });
    wait_for("the orphaned pod directory removed", T, || {
        (!path_exists(&pod_dir)).then_some(())
    });
}

/// The Node's `status.volumesInUse` (absent when empty).
fn volumes_in_use(api: &ApiServer, node: &str) -> Value {
    api.get("nodes", None, node)
        .map(|n| n["status"]["volumesInUse"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn a_volume_that_needs_attaching_waits_for_the_controller_and_gets_its_metadata_as_publish_context()
{
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-attach";
    let k = cluster_kubelet(node, &api);
    let driver = FakeDriver {
        stages: true,
        ..Default::default()
    };
    let (rt, endpoint) = serve_driver(&k, &driver);
    register(&rt, &k, &endpoint, "reg.sock");
    // attachRequired is left to the API server's default: true.
    let d = api.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER}, "spec": {}
    }));
    assert_eq!(d["spec"]["attachRequired"], true);
    bound_csi_claim(&api, "att-pv", "vol-a");
    let name = format!("att-{node}");
    api.create(claim_pod(&name, node, "claim"));
    // Upstream's unique volume name, reported in use before anything is
    // attached (so the controller may attach it and never detaches it).
    let unique = format!("kubernetes.io/csi/{DRIVER}^vol-a");
    wait_for("the volume in the Node's volumesInUse", T, || {
        (volumes_in_use(&api, node) == json!([unique])).then_some(())
    });
    // The volume is reported once a set-up found that it needs attaching,
    // which comes before staging: nothing is staged or published while
    // the controller has not attached it, and the pod waits.
    assert!(driver.calls.lock().staged.is_empty());
    assert!(driver.calls.lock().published.is_empty());
    let p = api.get("pods", Some("default"), &name).unwrap();
    assert_ne!(p["status"]["phase"], "Running");

    // The test plays the attach/detach controller and the
    // external-attacher: a VolumeAttachment named as upstream's
    // getAttachmentName, whose attach failed, and the volume in the
    // Node's volumesAttached.
    let va_name = format!("csi-{}", sha256_hex(&format!("vol-a{DRIVER}{node}")));
    let mut va = api.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": va_name},
        "spec": {"attacher": DRIVER, "nodeName": node,
            "source": {"persistentVolumeName": "att-pv"}}
    }));
    va["status"] = json!({"attached": false,
        "attachError": {"message": "disk is on fire", "time": "2026-01-01T00:00:00Z"}});
    va = api.update_status(va);
    let r = api
        .client()
        .patch(
            &format!("/api/v1/nodes/{node}/status"),
            "application/merge-patch+json",
            &json!({"status": {"volumesAttached": [{"name": unique, "devicePath": ""}]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    // The attacher's error is the pod's FailedMount, naming the PV.
    let msg = wait_for("FailedMount for the attach error", T, || {
        failed_mounts(&api, &name)
            .into_iter()
            .find(|m| m.contains("WaitForAttach"))
    });
    assert_eq!(
        msg,
        "MountVolume.WaitForAttach failed for volume \"att-pv\" : disk is on fire"
    );
    assert!(driver.calls.lock().staged.is_empty());

    // The attach succeeds: its metadata is the publish context.
    va["status"] = json!({"attached": true,
        "attachmentMetadata": {"devicePath": "/dev/fake0", "lun": "3"}});
    api.update_status(va);
    let p = wait_for(
        "pod Running after the attach",
        Duration::from_secs(150),
        || {
            api.get("pods", Some("default"), &name).filter(|p| {
                p["status"]["phase"] == "Running"
                    && p["status"]["containerStatuses"]
                        .as_array()
                        .is_some_and(|cs| cs.iter().all(|c| c["state"]["running"].is_object()))
            })
        },
    );
    let want: HashMap<String, String> = [("devicePath", "/dev/fake0"), ("lun", "3")]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let calls = driver.calls.lock();
    assert_eq!(calls.staged.len(), 1);
    assert_eq!(calls.staged[0].publish_context, want);
    assert_eq!(calls.published.len(), 1);
    assert_eq!(calls.published[0].publish_context, want);
    drop(calls);
    let id = container_id(&p);
    let out = k
        .cri
        .rt
        .block_on(
            k.cri
                .client
                .exec_sync(&id, vec!["cat".into(), "/data/hello".into()], 10),
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "staged vol-a");
    // In use while the pod runs; volumesAttached is the controller's and
    // left as it wrote it.
    let n = api.get("nodes", None, node).unwrap();
    assert_eq!(n["status"]["volumesInUse"], json!([unique]));
    assert_eq!(
        n["status"]["volumesAttached"],
        json!([{"name": unique, "devicePath": ""}])
    );
    assert_eq!(
        n["metadata"]["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"],
        "true"
    );
    // Checked against the Node as upstream's VerifyControllerAttachedVolume.
    assert!(ops_timed(&k, "verify_controller_attached_volume") >= 1);

    // Deleted: unpublished and unstaged, then no longer in use.
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnstageVolume", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
    wait_for("the volume gone from volumesInUse", T, || {
        let v = volumes_in_use(&api, node);
        (v.is_null() || v == json!([])).then_some(())
    });
}

#[test]
fn volumes_in_use_are_not_dropped_while_a_restarted_kubelet_sets_its_volumes_up_again() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-attach-restart";
    let mut k = cluster_kubelet(node, &api);
    let driver = FakeDriver {
        stages: true,
        ..Default::default()
    };
    let _rt = driver_with_object(&api, &k, &driver, json!({"attachRequired": true}));
    bound_csi_claim(&api, "rs-pv", "vol-r");
    // The controller and the attacher have done their part already.
    let unique = format!("kubernetes.io/csi/{DRIVER}^vol-r");
    let va_name = format!("csi-{}", sha256_hex(&format!("vol-r{DRIVER}{node}")));
    let mut va = api.create(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": va_name},
        "spec": {"attacher": DRIVER, "nodeName": node,
            "source": {"persistentVolumeName": "rs-pv"}}
    }));
    va["status"] = json!({"attached": true, "attachmentMetadata": {"k": "v"}});
    api.update_status(va);
    wait_for("the Node registered", T, || api.get("nodes", None, node));
    let r = api
        .client()
        .patch(
            &format!("/api/v1/nodes/{node}/status"),
            "application/merge-patch+json",
            &json!({"status": {"volumesAttached": [{"name": unique, "devicePath": ""}]}}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let name = format!("rs-{node}");
    api.create(claim_pod(&name, node, "claim"));
    running_pod(&api, &name);
    assert_eq!(volumes_in_use(&api, node), json!([unique]));
    assert_eq!(driver.calls.lock().published.len(), 1);

    // Restarted: the volume is set up again (its pod still runs), and no
    // status the new kubelet writes meanwhile drops it from volumesInUse.
    k.stop();
    let before = api.resource_version();
    let t0 = std::time::SystemTime::now();
    k.spawn();
    wait_for("the volume published again after the restart", T, || {
        (driver.calls.lock().published.len() >= 2).then_some(())
    });
    let patches = |api: &ApiServer| {
        api.requests()
            .into_iter()
            .filter(|r| {
                r.method == "PATCH"
                    && r.path.starts_with(&format!("/api/v1/nodes/{node}/status"))
                    && r.status == 200
                    && r.time > t0
            })
            .count()
    };
    wait_for("a node status update after the restart", T, || {
        (patches(&api) >= 1).then_some(())
    });
    let last = api.get("nodes", None, node).unwrap();
    let last_rv: u64 = last["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut w = api
        .client()
        .watch(&format!(
            "/api/v1/nodes?watch=1&fieldSelector=metadata.name%3D{node}&resourceVersion={before}"
        ))
        .unwrap();
    let mut seen = 0;
    loop {
        let e = w
            .next_non_bookmark()
            .unwrap()
            .expect("the replayed history");
        let o = &e["object"];
        assert_eq!(
            o["status"]["volumesInUse"],
            json!([unique]),
            "a Node version without the volume in use: {o}"
        );
        seen += 1;
        let rv: u64 = o["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        if rv >= last_rv {
            break;
        }
    }
    assert!(seen >= 1);
    let calls = driver.calls.lock();
    let want: HashMap<String, String> = [("k".to_string(), "v".to_string())].into();
    assert_eq!(calls.published[1].publish_context, want);
    drop(calls);

    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("the volume gone from volumesInUse", T, || {
        let v = volumes_in_use(&api, node);
        (v.is_null() || v == json!([])).then_some(())
    });
    assert_eq!(driver.calls.lock().unstaged.len(), 1);
}

#[test]
fn a_grown_volume_is_expanded_online_and_its_claim_gets_the_new_capacity() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-expand";
    let k = cluster_kubelet(node, &api);
    let root = k.dir.join("root");
    let driver = FakeDriver {
        stages: true,
        expands: true,
        ..Default::default()
    };
    let _rt = driver_with_object(&api, &k, &driver, json!({"attachRequired": false}));
    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "ex-pv"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "ex-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": "vol-x", "fsType": "ext4",
                "nodeExpandSecretRef": {"name": "expand-secret", "namespace": "default"}},
            "claimRef": {"namespace": "default", "name": "claim", "uid": pvc["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "claim")
        .unwrap();
    bound["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}});
    api.update_status(bound);
    api.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "expand-secret", "namespace": "default"},
        "data": {"expandkey": "c2VjcmV0"}}));
    let name = format!("ex-{node}");
    api.create(claim_pod(&name, node, "claim"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    assert!(driver.calls.lock().expanded.is_empty());

    // The test plays the external-resizer: the PV grew, the claim asks for
    // it, and the node's part is pending.
    let mut c = grow_to_node_resize(&api, "ex-pv", "claim", "2Gi");
    c["status"]["conditions"] = json!([{"type": "FileSystemResizePending", "status": "True",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node."}]);
    api.update_status(c);

    // At a later pod sync (every 5 s here) the driver is asked to expand
    // the published volume to the PV's size.
    wait_for("NodeExpandVolume", T, || {
        (!driver.calls.lock().expanded.is_empty()).then_some(())
    });
    let req = driver.calls.lock().expanded[0].clone();
    assert_eq!(req.volume_id, "vol-x");
    assert_eq!(
        Path::new(&req.volume_path),
        root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/ex-pv/mount"))
    );
    assert_eq!(
        Path::new(&req.staging_target_path),
        root.join(format!(
            "plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
            sha256_hex("vol-x")
        ))
    );
    assert_eq!(req.capacity_range.as_ref().unwrap().required_bytes, 2 << 30);
    // The PV's nodeExpandSecretRef (upstream expander.go).
    assert_eq!(
        req.secrets,
        [("expandkey".to_string(), "secret".to_string())].into()
    );
    match req
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    {
        Some(proto::volume_capability::AccessType::Mount(m)) => assert_eq!(m.fs_type, "ext4"),
        other => panic!("{other:?}"),
    }
    // The claim records the new size; the resize status and its condition
    // are gone.
    let c = wait_for("the claim's new capacity", T, || {
        api.get("persistentvolumeclaims", Some("default"), "claim")
            .filter(|c| c["status"]["capacity"]["storage"] == "2Gi")
    });
    assert!(
        c["status"].get("allocatedResourceStatuses").is_none(),
        "{}",
        c["status"]
    );
    assert!(c["status"].get("conditions").is_none(), "{}", c["status"]);
    assert_eq!(c["status"]["allocatedResources"]["storage"], "2Gi");
    let ev = wait_for("FileSystemResizeSuccess", T, || {
        api.list("events").into_iter().find(|e| {
            e["reason"] == "FileSystemResizeSuccess" && e["involvedObject"]["kind"] == "Pod"
        })
    });
    assert_eq!(
        ev["message"],
        format!("MountVolume.NodeExpandVolume succeeded for volume \"ex-pv\" {node}")
    );
    // Expanded once: the claim's status now matches the PV.
    assert_eq!(driver.calls.lock().expanded.len(), 1);
    // An in-use expansion: upstream's volume_fs_resize, once.
    assert_eq!(ops_timed(&k, "volume_fs_resize"), 1);
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnstageVolume", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
}

#[test]
fn a_claim_whose_resize_waits_for_the_node_is_expanded_before_its_pod_starts() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-expand-mount";
    let k = cluster_kubelet(node, &api);
    let driver = FakeDriver {
        expands: true,
        ..Default::default()
    };
    let _rt = driver_with_object(&api, &k, &driver, json!({"attachRequired": false}));
    // Grown while no pod used it: the resizer left the node's part pending.
    let pvc = api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "3Gi"}}, "volumeName": "exm-pv"}}));
    api.create(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "exm-pv"},
        "spec": {"capacity": {"storage": "3Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": "vol-m",
                "nodeExpandSecretRef": {"name": "late-secret", "namespace": "default"}},
            "claimRef": {"namespace": "default", "name": "claim", "uid": pvc["metadata"]["uid"]}}}));
    let mut bound = api
        .get("persistentvolumeclaims", Some("default"), "claim")
        .unwrap();
    bound["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"},
        "allocatedResources": {"storage": "3Gi"},
        "allocatedResourceStatuses": {"storage": "NodeResizePending"}});
    api.update_status(bound);
    let name = format!("exm-{node}");
    api.create(claim_pod(&name, node, "claim"));
    // The PV's nodeExpandSecretRef names a secret not there yet: the
    // expansion fails as upstream's (the claim gets NodeResizeError, the
    // pod a FailedMount) and the driver is not asked.
    let want = "expander.NodeExpand failed to get NodeExpandSecretRef default/late-secret: kubernetes.io/csi: failed to find the secret late-secret in the namespace default with error: ";
    wait_for("FailedMount for the missing expand secret", T, || {
        failed_mounts(&api, &name).into_iter().find(|m| {
            m.starts_with(&format!(
                "MountVolume.Setup failed while expanding volume for volume \"exm-pv\" : {want}"
            ))
        })
    });
    wait_for("NodeResizeError on the claim", T, || {
        api.get("persistentvolumeclaims", Some("default"), "claim")
            .filter(|c| {
                c["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["type"] == "NodeResizeError"
                            && c["message"].as_str().is_some_and(|m| m.contains(want))
                    })
                })
            })
    });
    assert!(driver.calls.lock().expanded.is_empty());
    assert!(api.get("pods", Some("default"), &name).unwrap()["status"]["phase"] != "Running");
    api.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "late-secret", "namespace": "default"},
        "data": {"k": "dg=="}}));
    running_pod(&api, &name);
    // Expanded during the mount, before the containers started: the
    // driver does not stage, so no staging path.
    let calls = driver.calls.lock();
    assert_eq!(calls.expanded.len(), 1, "expanded before the pod ran");
    assert_eq!(
        calls.expanded[0].secrets,
        [("k".to_string(), "v".to_string())].into()
    );
    assert_eq!(calls.expanded[0].volume_id, "vol-m");
    assert_eq!(
        calls.expanded[0]
            .capacity_range
            .as_ref()
            .unwrap()
            .required_bytes,
        3 << 30
    );
    assert!(calls.expanded[0].staging_target_path.is_empty());
    drop(calls);
    let c = api
        .get("persistentvolumeclaims", Some("default"), "claim")
        .unwrap();
    assert_eq!(c["status"]["capacity"]["storage"], "3Gi");
    assert!(c["status"].get("allocatedResourceStatuses").is_none());
    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnpublishVolume", T, || {
        (!driver.calls.lock().unpublished.is_empty()).then_some(())
    });
}

/// Claim `blk` (volumeMode Block) bound to the CSI PV `csi-blk-pv` (handle
/// `blk-1`) whose `device` attribute names the loop device `dev` for the
/// fake driver, with stage and publish secrets.
fn csi_block_claim(api: &ApiServer, dev: &str) {
    for (name, key) in [("stage-secret", "stagekey"), ("publish-secret", "pubkey")] {
        api.create(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "default"},
            "data": {key: "c2VjcmV0"}}));
    }
    bind_claim(
        api,
        "blk",
        json!({"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
            "resources": {"requests": {"storage": "16Mi"}}}),
        "csi-blk-pv",
        json!({"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "csi": {"driver": DRIVER, "volumeHandle": "blk-1",
                "volumeAttributes": {"device": dev},
                "nodeStageSecretRef": {"name": "stage-secret", "namespace": "default"},
                "nodePublishSecretRef": {"name": "publish-secret", "namespace": "default"}}}),
    );
}

/// A cluster kubelet for a block CSI volume: `driver` served and
/// registered under a CSIDriver of `spec`, and claim `blk` bound to its PV
/// on a [`marked_loop_disk`] (`csi_block_claim`).
struct BlockSetup {
    /// Detached before the driver's runtime and the kubelet go.
    dev: LoopDevice,
    backing: PathBuf,
    _rt: tokio::runtime::Runtime,
    k: Kubelet,
    root: PathBuf,
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices`.
    devices: PathBuf,
}

/// [`BlockSetup`] for `node`, its kubelet configured with `more` too.
fn block_setup(
    api: &ApiServer,
    node: &str,
    driver: &FakeDriver,
    spec: Value,
    more: &str,
) -> BlockSetup {
    let k = cluster_kubelet_with(node, api, more);
    let root = k.dir.join("root");
    let rt = driver_with_object(api, &k, driver, spec);
    let backing = k.dir.join("disk.img");
    let dev = marked_loop_disk(&backing);
    csi_block_claim(api, &dev.0);
    BlockSetup {
        dev,
        backing,
        _rt: rt,
        devices: root.join("plugins/kubernetes.io/csi/volumeDevices"),
        root,
        k,
    }
}

/// Waits until the block volume `csi-blk-pv` has left nothing behind: no
/// mount under the root, none of its plugin directories, no directory of
/// the pods `uids`.
fn wait_block_volume_gone(b: &BlockSetup, uids: &[&str]) {
    wait_for(
        "no mounts, no volume directories, no pod directories",
        T,
        || {
            (mounts_containing(b.root.to_str().unwrap()).is_empty()
                && ["csi-blk-pv", "staging/csi-blk-pv", "publish/csi-blk-pv"]
                    .iter()
                    .all(|d| !path_exists(&b.devices.join(d)))
                && uids
                    .iter()
                    .all(|u| !path_exists(&b.root.join("pods").join(u))))
            .then_some(())
        },
    );
}

/// A claim bound to a `volumeMode: Block` CSI PV (upstream's csiBlockMapper
/// with MapBlockVolume): the driver gets NodeStageVolume at
/// `volumeDevices/staging/<pv>` and NodePublishVolume at
/// `volumeDevices/publish/<pv>/<pod uid>`, both with a Block capability,
/// the PV's secrets and (podInfoOnMount) the pod's identity, and a claim
/// resize pending on the node is done with NodeExpandVolume on the publish
/// path; the driver binds a loop device there, and the container finds the
/// device at its
/// `volumeDevices` path, reads what the host wrote and writes what the
/// host then reads back. The driver's NodeGetVolumeStats figures, asked
/// for at the pod's bind under the global map path (upstream's
/// NewBlockVolumeMapper hands NewMetricsCsi that path), are the volume's
/// entry in `/stats/summary` and its claim's `kubelet_volume_stats_*`;
/// with CSIVolumeHealth off (the default) the driver's abnormal condition
/// is not reported. Deleting the pod unmaps, unpublishes and
/// unstages in that order and leaves no mount, no plugin directory of the
/// volume and no pod directory. The old code refused the PV
/// ("supported for local PVs only") and never started the pod, and then
/// left block volumes out of the stats.
#[test]
fn a_block_claim_on_a_csi_pv_is_staged_published_and_mapped_as_a_device() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-blk";
    let driver = FakeDriver {
        stages: true,
        expands: true,
        stats: true,
        condition: Some((true, "device lost")),
        ..Default::default()
    };
    let b = block_setup(
        &api,
        node,
        &driver,
        json!({"attachRequired": false, "podInfoOnMount": true}),
        "",
    );
    let (k, root, devices, dev) = (&b.k, &b.root, &b.devices, &b.dev);
    // The claim was grown to the PV's 16Mi while no pod used it: the
    // node's part is pending and done at the map (upstream's
    // expandVolumeDuringMount in GenerateMapVolumeFunc).
    let mut c = api
        .get("persistentvolumeclaims", Some("default"), "blk")
        .unwrap();
    c["status"]["capacity"] = json!({"storage": "8Mi"});
    c["status"]["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
    api.update_status(c);

    let name = format!("blk-{node}");
    api.create(block_pod(&name, node, "blk"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let staging = devices.join("staging/csi-blk-pv");
    let publish = devices.join("publish/csi-blk-pv").join(&uid);
    let is_block = |c: &Option<proto::VolumeCapability>| {
        matches!(
            c.as_ref().and_then(|c| c.access_type.as_ref()),
            Some(proto::volume_capability::AccessType::Block(_))
        )
    };
    let calls = driver.calls.lock();
    assert_eq!(calls.log, ["stage", "publish"]);
    // Expanded on the publish path with a Block capability.
    assert_eq!(calls.expanded.len(), 1);
    let ex = &calls.expanded[0];
    assert_eq!(Path::new(&ex.volume_path), publish);
    assert_eq!(Path::new(&ex.staging_target_path), staging);
    assert!(is_block(&ex.volume_capability), "{ex:?}");
    assert_eq!(ex.capacity_range.as_ref().unwrap().required_bytes, 16 << 20);
    let claim = api
        .get("persistentvolumeclaims", Some("default"), "blk")
        .unwrap();
    assert_eq!(claim["status"]["capacity"]["storage"], "16Mi");
    let st = &calls.staged[0];
    assert_eq!(st.volume_id, "blk-1");
    assert_eq!(Path::new(&st.staging_target_path), staging);
    assert!(is_block(&st.volume_capability), "{st:?}");
    assert_eq!(
        st.secrets,
        [("stagekey".to_string(), "secret".to_string())].into()
    );
    let pb = &calls.published[0];
    assert_eq!(Path::new(&pb.target_path), publish);
    assert_eq!(Path::new(&pb.staging_target_path), staging);
    assert!(is_block(&pb.volume_capability), "{pb:?}");
    assert!(!pb.readonly);
    assert_eq!(
        pb.secrets,
        [("pubkey".to_string(), "secret".to_string())].into()
    );
    assert_eq!(
        pb.volume_context["csi.storage.k8s.io/pod.name"],
        name.as_str()
    );
    assert_eq!(pb.volume_context["device"], dev.0.as_str());
    drop(calls);
    // The volume's data, the per-pod bind of the publish path under the
    // global map path, and the pod's link to the publish path.
    let data: Value = serde_json::from_str(
        &std::fs::read_to_string(devices.join("csi-blk-pv/data/vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(data["specVolID"], "csi-blk-pv");
    assert_eq!(data["volumeHandle"], "blk-1");
    assert_eq!(data["driverName"], DRIVER);
    let global = devices.join("csi-blk-pv/dev");
    assert_eq!(
        mounts_containing(global.to_str().unwrap()),
        vec![global.join(&uid).display().to_string()],
        "one bind of the device for the pod"
    );
    let link = root.join(format!(
        "pods/{uid}/volumeDevices/kubernetes.io~csi/csi-blk-pv"
    ));
    assert_eq!(std::fs::read_link(&link).unwrap(), publish);

    // The driver's figures are the block volume's stats, with its claim.
    let vol = summary_volume(k, &uid, "disk", T);
    assert_eq!(vol["usedBytes"], STATS_BYTES.2);
    assert_eq!(vol["capacityBytes"], STATS_BYTES.1);
    assert_eq!(vol["availableBytes"], STATS_BYTES.0);
    assert_eq!(vol["inodes"], STATS_INODES.1);
    assert_eq!(
        vol["pvcRef"],
        json!({"name": "blk", "namespace": "default"})
    );
    assert!(vol.get("volumeHealthStats").is_none(), "{vol}");
    let asked = driver.calls.lock().stats[0].clone();
    assert_eq!(asked.volume_id, "blk-1");
    assert_eq!(Path::new(&asked.volume_path), global.join(&uid));
    let lines = volume_stat_lines(k);
    assert!(
        lines.iter().any(|l| *l
            == format!(
                "kubelet_volume_stats_capacity_bytes{{namespace=\"default\",persistentvolumeclaim=\"blk\"}} {}",
                STATS_BYTES.1
            )),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("health_status_abnormal")),
        "{lines:#?}"
    );
    assert!(condition_events(&api, &name).is_empty());

    let id = container_id(&p);
    device_is_shared_with_the_host(k, &id, &b.backing, T);

    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnstageVolume", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
    let calls = driver.calls.lock();
    assert_eq!(calls.log, ["stage", "publish", "unpublish", "unstage"]);
    assert_eq!(Path::new(&calls.unpublished[0].target_path), publish);
    assert_eq!(calls.unpublished[0].volume_id, "blk-1");
    assert_eq!(Path::new(&calls.unstaged[0].staging_target_path), staging);
    drop(calls);
    wait_block_volume_gone(&b, &[&uid]);
    assert!(std::fs::symlink_metadata(&link).is_err());
    // GenerateUnmapVolumeFunc's and GenerateUnmapDeviceFunc's operations,
    // under the driver's plugin name (not the local plugin's).
    wait_for("unmap_volume and unmap_device timed once", T, || {
        ((ops_timed(k, "unmap_volume"), ops_timed(k, "unmap_device")) == (1, 1)).then_some(())
    });
    let (_, metrics) = http_get(&k.read_only, "/metrics").expect("/metrics");
    assert!(!metrics.contains("kubernetes.io/local-volume"), "{metrics}");
}

/// A block CSI volume of a pod deleted while rkubelet was down: after the
/// restart its device link, the per-pod bind and the volume's
/// `vol_data.json` say what to undo, and it is unmapped, unpublished and
/// unstaged as at a normal tear-down, leaving nothing behind. The old
/// code refused the PV, so the pod never ran.
#[test]
fn a_block_csi_volume_of_a_pod_deleted_while_rkubelet_was_down_is_unmapped_after_restart() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-blk-restart";
    let driver = FakeDriver {
        stages: true,
        ..Default::default()
    };
    let mut b = block_setup(&api, node, &driver, json!({"attachRequired": false}), "");
    let devices = b.devices.clone();
    let name = format!("blk-gone-{node}");
    api.create(block_pod(&name, node, "blk"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let global = devices.join("csi-blk-pv/dev");
    assert_eq!(mounts_containing(global.to_str().unwrap()).len(), 1);

    b.k.stop();
    api.delete("pods", Some("default"), &name, Some(0));
    b.k.spawn();
    wait_for("NodeUnstageVolume after the restart", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
    let calls = driver.calls.lock();
    assert_eq!(calls.log, ["stage", "publish", "unpublish", "unstage"]);
    assert_eq!(
        Path::new(&calls.unpublished[0].target_path),
        devices.join("publish/csi-blk-pv").join(&uid)
    );
    assert_eq!(calls.unpublished[0].volume_id, "blk-1");
    assert_eq!(
        Path::new(&calls.unstaged[0].staging_target_path),
        devices.join("staging/csi-blk-pv")
    );
    drop(calls);
    wait_block_volume_gone(&b, &[&uid]);
    // The orphan's unmap and unstage are timed as at a normal tear-down.
    wait_for("unmap_volume and unmap_device timed once", T, || {
        ((
            ops_timed(&b.k, "unmap_volume"),
            ops_timed(&b.k, "unmap_device"),
        ) == (1, 1))
            .then_some(())
    });
}

/// A block CSI volume of a driver without STAGE_UNSTAGE_VOLUME whose
/// CSIDriver has `requiresRepublish: true`, with CSIVolumeHealth on and the
/// driver reporting VOLUME_CONDITION and an abnormal volume: never staged;
/// published again at a later pod sync to the same publish path (upstream's
/// csiPlugin.RequiresRemount asks only the CSIDriver, and MountVolume runs
/// GenerateMapVolumeFunc again for a Block volume, calling MapPodDevice
/// while skipping SetUpDevice), the device still the container's; the
/// volume's `volumeHealthStats` in `/stats/summary`,
/// `kubelet_volume_stats_health_status_abnormal` 1 for its claim and a
/// VolumeConditionAbnormal event "Volume disk: <message>"
/// (volume_stat_calculator.go, collectors/volume_stats.go); a claim grown
/// meanwhile is expanded at a republish (NodeExpandVolume on the publish
/// path). Deleting the pod unpublishes without an unstage and leaves
/// nothing. The old code published a block volume once, read no
/// condition, and never expanded a republished volume.
#[test]
fn a_republishing_drivers_block_volume_is_published_again_and_its_health_reported() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-blk-health";
    let driver = FakeDriver {
        stats: true,
        condition: Some((true, "device lost")),
        expands: true,
        ..Default::default()
    };
    let b = block_setup(
        &api,
        node,
        &driver,
        json!({"attachRequired": false, "requiresRepublish": true}),
        "featureGates:\n  CSIVolumeHealth: true\n",
    );
    let (k, devices) = (&b.k, &b.devices);
    let name = format!("blk-health-{node}");
    api.create(block_pod(&name, node, "blk"));
    let p = running_pod(&api, &name);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let publish = devices.join("publish/csi-blk-pv").join(&uid);

    wait_for("a second NodePublishVolume", T, || {
        (driver.calls.lock().published.len() >= 2).then_some(())
    });
    let calls = driver.calls.lock();
    assert!(calls.staged.is_empty(), "a driver without staging");
    for pb in &calls.published[..2] {
        assert_eq!(Path::new(&pb.target_path), publish);
        assert_eq!(pb.volume_id, "blk-1");
    }
    assert!(calls.log.iter().all(|c| *c == "publish"), "{:?}", calls.log);
    drop(calls);
    let global = devices.join("csi-blk-pv/dev");
    assert_eq!(
        mounts_containing(global.to_str().unwrap()),
        vec![global.join(&uid).display().to_string()],
        "still one bind of the device for the pod"
    );
    device_is_shared_with_the_host(k, &container_id(&p), &b.backing, T);

    let vol = summary_volume(k, &uid, "disk", T);
    assert_eq!(vol["volumeHealthStats"], json!({"abnormal": true}), "{vol}");
    assert_eq!(vol["usedBytes"], STATS_BYTES.2);
    let want = "kubelet_volume_stats_health_status_abnormal{namespace=\"default\",persistentvolumeclaim=\"blk\"} 1";
    let lines = volume_stat_lines(k);
    assert!(lines.iter().any(|l| l == want), "{lines:#?}");
    let events = wait_for("a VolumeConditionAbnormal event", T, || {
        Some(condition_events(&api, &name)).filter(|e| !e.is_empty())
    });
    assert_eq!(events, ["Volume disk: device lost"]);

    // The test plays the external-resizer: the republish finishes the
    // node's part (expandVolumeDuringMount runs at every map).
    assert!(driver.calls.lock().expanded.is_empty());
    let mut c = grow_to_node_resize(&api, "csi-blk-pv", "blk", "32Mi");
    c["status"]["capacity"] = json!({"storage": "16Mi"});
    api.update_status(c);
    wait_for("NodeExpandVolume at a republish", T, || {
        (!driver.calls.lock().expanded.is_empty()).then_some(())
    });
    let ex = driver.calls.lock().expanded[0].clone();
    assert_eq!(Path::new(&ex.volume_path), publish);
    assert_eq!(ex.capacity_range.as_ref().unwrap().required_bytes, 32 << 20);
    wait_for("the claim's new capacity", T, || {
        let c = api.get("persistentvolumeclaims", Some("default"), "blk")?;
        (c["status"]["capacity"]["storage"] == "32Mi").then_some(())
    });

    api.delete("pods", Some("default"), &name, Some(0));
    wait_for("NodeUnpublishVolume", T, || {
        (!driver.calls.lock().unpublished.is_empty()).then_some(())
    });
    wait_block_volume_gone(&b, &[&uid]);
    let calls = driver.calls.lock();
    assert!(calls.unstaged.is_empty());
    assert_eq!(Path::new(&calls.unpublished[0].target_path), publish);
}

/// Two pods on one block CSI volume: staged once and published for each
/// (one bind per pod under the global map path); the first pod's deletion
/// unpublishes its publish path only, leaving the staging and the other
/// pod's mapping; the last one's unpublishes and unstages (upstream's
/// UnmapDevice runs once no pod maps the device).
#[test]
fn a_block_csi_volume_shared_by_two_pods_is_unstaged_after_the_last() {
    let api = ApiServer::start(ApiServerOptions::default());
    let node = "it-csi-blk-two";
    let driver = FakeDriver {
        stages: true,
        ..Default::default()
    };
    let setup = block_setup(&api, node, &driver, json!({"attachRequired": false}), "");
    let (root, devices) = (&setup.root, &setup.devices);
    let (a, b) = (format!("blk-a-{node}"), format!("blk-b-{node}"));
    api.create(block_pod(&a, node, "blk"));
    let ua = running_pod(&api, &a)["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    api.create(block_pod(&b, node, "blk"));
    let ub = running_pod(&api, &b)["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let staging = devices.join("staging/csi-blk-pv");
    let global = devices.join("csi-blk-pv/dev");
    let publish = |uid: &str| devices.join("publish/csi-blk-pv").join(uid);
    let calls = driver.calls.lock();
    assert_eq!(calls.log, ["stage", "publish", "publish"]);
    assert_eq!(Path::new(&calls.published[0].target_path), publish(&ua));
    assert_eq!(Path::new(&calls.published[1].target_path), publish(&ub));
    drop(calls);
    let mut binds = mounts_containing(global.to_str().unwrap());
    binds.sort();
    let mut want = vec![
        global.join(&ua).display().to_string(),
        global.join(&ub).display().to_string(),
    ];
    want.sort();
    assert_eq!(binds, want);

    api.delete("pods", Some("default"), &a, Some(0));
    wait_for("pod a's NodeUnpublishVolume", T, || {
        (!driver.calls.lock().unpublished.is_empty()).then_some(())
    });
    wait_for("pod a's directory gone", T, || {
        (!path_exists(&root.join("pods").join(&ua))).then_some(())
    });
    let calls = driver.calls.lock();
    assert_eq!(calls.log, ["stage", "publish", "publish", "unpublish"]);
    assert_eq!(Path::new(&calls.unpublished[0].target_path), publish(&ua));
    drop(calls);
    assert!(path_exists(&staging), "still staged for pod b");
    assert_eq!(
        mounts_containing(global.to_str().unwrap()),
        vec![global.join(&ub).display().to_string()]
    );

    api.delete("pods", Some("default"), &b, Some(0));
    wait_for("NodeUnstageVolume after the last pod", T, || {
        (!driver.calls.lock().unstaged.is_empty()).then_some(())
    });
    let calls = driver.calls.lock();
    assert_eq!(
        calls.log,
        [
            "stage",
            "publish",
            "publish",
            "unpublish",
            "unpublish",
            "unstage"
        ]
    );
    assert_eq!(Path::new(&calls.unpublished[1].target_path), publish(&ub));
    drop(calls);
    wait_block_volume_gone(&setup, &[&ua, &ub]);
}
