//! Plugin registration (upstream `pkg/kubelet/pluginmanager`: the plugin
//! watcher, reconciler and operation executor, with the CSI registration
//! handler of `csi_plugin.go`). A plugin (for CSI, the
//! node-driver-registrar side-car) puts a Unix socket in
//! `<root-dir>/plugins_registry/`; rkubelet asks it `GetInfo`, validates
//! and records a CSI driver, asks the driver `NodeGetInfo`, and answers
//! `NotifyRegistrationStatus`. A socket that goes away deregisters its
//! driver; one re-created (another inode or time stamp) registers again.
//! Bad plugins are logged and retried with backoff, never fatal.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::client::{unix_channel, with_deadline, NodeService};
use super::registration_proto::{self as rp, registration_client::RegistrationClient};
use super::{highest_supported_version, log_msg, Driver, Registry};

/// The directory plugins put their registration sockets in (upstream
/// `PluginsRegistryDir`, under the root directory).
pub const REGISTRY_DIR: &str = "plugins_registry";
/// The plugin type CSI drivers register with.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// How often the directory is compared with what is registered (upstream's
/// reconciler loop period).
const RESCAN: Duration = Duration::from_secs(1);
/// Upstream dials a registration socket and waits for its answers at most
/// this long.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Upstream's operation backoff: 500 ms doubling to 2m2s.
const RETRY_INITIAL: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(122);

/// A socket file as last seen: a re-created socket differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ident {
    ino: u64,
    mtime_ns: i128,
}

#[derive(Debug)]
enum SocketState {
    /// Registered as driver `name` at `endpoint`.
    Registered { name: String, endpoint: String },
    /// Not a CSI driver this kubelet serves, or refused: tried again after
    /// `retry_at`.
    Failed { attempts: u32, retry_at: Instant },
}

#[derive(Debug)]
struct Seen {
    ident: Ident,
    state: SocketState,
}

/// Spawns the watcher on `dir`; it runs until `token` is cancelled.
pub fn spawn(dir: PathBuf, registry: Registry, tasks: &TaskTracker, token: CancellationToken) {
    tasks.spawn(tracing::Instrument::instrument(
        run(dir, registry, token),
        tracing::info_span!("plugin-watcher"),
    ));
}

async fn run(dir: PathBuf, registry: Registry, token: CancellationToken) {
    let d = dir.clone();
    // Upstream creates the directory at start so registrars can use it.
    if let Err(e) = crate::blocking::try_run(
        format!("create {}", dir.display()),
        Duration::from_secs(30),
        move || std::fs::create_dir_all(&d),
    )
    .await
    {
        warn!(dir = %dir.display(), error = %e, "cannot create the plugin registration directory");
    }
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    loop {
        reconcile(&dir, &registry, &mut seen).await;
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(RESCAN) => {}
        }
    }
}

/// Sockets in `dir` (not below it), skipping dot files and anything that
/// is not a socket, as upstream's watcher does.
fn list_sockets(dir: &Path) -> std::io::Result<Vec<(PathBuf, Ident)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !m.file_type().is_socket() {
            continue;
        }
        out.push((
            e.path(),
            Ident {
                ino: m.ino(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            },
        ));
    }
    Ok(out)
}

/// One pass: deregisters what went away or changed, registers what is new
/// or due for a retry. Registrations run concurrently, so one hung plugin
/// does not hold up the others.
async fn reconcile(dir: &Path, registry: &Registry, seen: &mut HashMap<PathBuf, Seen>) {
    // Cluster mode before the API client exists (TLS bootstrap): a
    // registration now could not record the node's driver info, so wait.
    if registry.api_client().is_err() {
        return;
    }
    let d = dir.to_path_buf();
    let listed = match crate::blocking::try_run(
        format!("list {}", dir.display()),
        Duration::from_secs(30),
        move || list_sockets(&d),
    )
    .await
    {
        Ok(l) => l,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot list the plugin registration directory");
            return;
        }
    };
    let now: HashMap<PathBuf, Ident> = listed.into_iter().collect();
    let gone: Vec<PathBuf> = seen
        .iter()
        .filter(|(p, s)| now.get(*p) != Some(&s.ident))
        .map(|(p, _)| p.clone())
        .collect();
    for p in gone {
        if let Some(Seen {
            state: SocketState::Registered { name, endpoint },
            ..
        }) = seen.remove(&p)
        {
            deregister(registry, &name, &endpoint).await;
        }
    }
    let due: Vec<(PathBuf, Ident, u32)> = now
        .iter()
        .filter_map(|(p, ident)| match seen.get(p) {
            None => Some((p.clone(), *ident, 0)),
            Some(Seen {
                state: SocketState::Failed { attempts, retry_at },
                ..
            }) if *retry_at <= Instant::now() => Some((p.clone(), *ident, *attempts)),
            Some(_) => None,
        })
        .collect();
    let results =
        futures::future::join_all(due.into_iter().map(|(p, ident, attempts)| async move {
            let r = register(registry, &p).await;
            (p, ident, attempts, r)
        }))
        .await;
    for (p, ident, attempts, r) in results {
        let state = match r {
            Ok((name, endpoint)) => SocketState::Registered { name, endpoint },
            Err(e) => {
                let attempts = attempts + 1;
                let wait = RETRY_INITIAL
                    .saturating_mul(1 << (attempts - 1).min(16))
                    .min(RETRY_MAX);
                warn!(socket = %p.display(), error = %e, retry_in = ?wait, "plugin registration failed");
                SocketState::Failed {
                    attempts,
                    retry_at: Instant::now() + wait,
                }
            }
        };
        seen.insert(p, Seen { ident, state });
    }
}

async fn deregister(registry: &Registry, name: &str, endpoint: &str) {
    if registry.remove(name, endpoint) {
        info!(driver = %name, endpoint = %endpoint, "CSI driver deregistered: its registration socket is gone");
        if let Err(e) = super::nodeinfo::uninstall(registry, name).await {
            warn!(driver = %name, error = %e, "registrationHandler.DeRegisterPlugin failed");
        }
    }
}

/// Upstream's operation generator RegisterPlugin with the CSI handler:
/// GetInfo, type and version checks, NodeGetInfo, then the status back to
/// the plugin. Returns the driver name and endpoint.
async fn register(registry: &Registry, socket: &Path) -> Result<(String, String), String> {
    let socket_str = socket.to_string_lossy().into_owned();
    let mut client = RegistrationClient::new(unix_channel(&socket_str));
    let info = with_deadline(REGISTRATION_TIMEOUT, client.get_info(rp::InfoRequest {}))
        .await
        .map_err(|e| format!("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {socket_str}, err: {e}"))?;
    let notify = |client: RegistrationClient<_>, ok: bool, error: String| async move {
        let mut client = client;
        with_deadline(
            REGISTRATION_TIMEOUT,
            client.notify_registration_status(rp::RegistrationStatus {
                plugin_registered: ok,
                error,
            }),
        )
        .await
        .map(drop)
    };
    if info.r#type != CSI_PLUGIN {
        // rkubelet has no device or DRA plugin handler.
        let e = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {socket_str}",
            info.r#type
        );
        let _ = notify(client, false, e.clone()).await;
        return Err(e);
    }
    // The endpoint is optional: the registration socket serves CSI then.
    let endpoint = if info.endpoint.is_empty() {
        socket_str.clone()
    } else {
        info.endpoint.clone()
    };
    let name = info.name.clone();
    info!(driver = %name, endpoint = %endpoint, versions = %info.supported_versions.join(","), "trying to validate a new CSI driver");
    let version = match validate(registry, &name, &info.supported_versions) {
        Ok(v) => v,
        Err(e) => {
            let e = format!(
                "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver {name} at endpoint {endpoint}: {e}"
            );
            let _ = notify(client, false, e.clone()).await;
            return Err(e);
        }
    };
    // The driver is recorded before NodeGetInfo (upstream order: its client
    // is found through the registry) and removed again if that fails.
    let mut driver = Driver {
        endpoint: endpoint.clone(),
        version,
        node_id: String::new(),
        max_volumes: 0,
        topology: Default::default(),
    };
    registry.set(&name, driver.clone());
    match NodeService::new(&endpoint, super::client::CSI_TIMEOUT)
        .get_info()
        .await
    {
        Ok(ni) => {
            driver.node_id = ni.node_id;
            driver.max_volumes = ni.max_volumes_per_node;
            driver.topology = ni
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default();
            registry.set(&name, driver.clone());
            // Upstream: a failed node info update fails the registration.
            if let Err(e) = super::nodeinfo::install(registry, &name, &driver).await {
                registry.remove(&name, &endpoint);
                let e = format!("RegisterPlugin error -- plugin registration failed with err: {e}");
                let _ = notify(client, false, e.clone()).await;
                return Err(e);
            }
        }
        Err(e) => {
            registry.remove(&name, &endpoint);
            let e = format!("RegisterPlugin error -- plugin registration failed with err: {e}");
            let _ = notify(client, false, e.clone()).await;
            return Err(e);
        }
    }
    if let Err(e) = notify(client, true, String::new()).await {
        // Registered all the same, as upstream: the driver works.
        warn!(driver = %name, error = %e, "RegisterPlugin error -- failed to send registration status");
    }
    info!(driver = %name, endpoint = %endpoint, node_id = %driver.node_id, max_volumes = driver.max_volumes, "CSI driver registered");
    Ok((name, endpoint))
}

/// Upstream `validateVersions`: a 1.x version, and higher than that of a
/// driver of the same name already registered.
fn validate(
    registry: &Registry,
    name: &str,
    versions: &[String],
) -> Result<super::Version, String> {
    if versions.is_empty() {
        return Err(log_msg(format!(
            "RegisterPlugin for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
        )));
    }
    let v = highest_supported_version(versions).map_err(|e| {
        log_msg(format!(
            "RegisterPlugin for CSI driver {name:?} failed. None of the versions specified {versions:?} are supported. err={e}"
        ))
    })?;
    if let Some(existing) = registry.get(name) {
        if existing.version >= v {
            return Err(log_msg(format!(
                "RegisterPlugin for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: {:?}",
                existing.version.to_string()
            )));
        }
    }
    Ok(v)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::volume::csi::proto;
    use std::sync::Arc;
    use tonic::{Request, Response, Status};

    /// Serves a tonic-generated service on a Unix socket with hyper's
    /// HTTP/2 server (tonic's own server transport is not built).
    pub(crate) fn serve<S>(listener: tokio::net::UnixListener, svc: S)
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
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let hs = hyper::service::service_fn(move |req| {
                        let mut s = svc.clone();
                        tower::Service::call(&mut s, req)
                    });
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), hs)
                    .await;
                });
            }
        });
    }

    /// A registrar: answers GetInfo with `info` and records the statuses.
    #[derive(Clone)]
    pub(crate) struct FakeRegistrar {
        pub info: rp::PluginInfo,
        pub statuses: Arc<parking_lot::Mutex<Vec<rp::RegistrationStatus>>>,
    }

    #[tonic::async_trait]
    impl rp::registration_server::Registration for FakeRegistrar {
        async fn get_info(
            &self,
            _: Request<rp::InfoRequest>,
        ) -> Result<Response<rp::PluginInfo>, Status> {
            Ok(Response::new(self.info.clone()))
        }
        async fn notify_registration_status(
            &self,
            r: Request<rp::RegistrationStatus>,
        ) -> Result<Response<rp::RegistrationStatusResponse>, Status> {
            self.statuses.lock().push(r.into_inner());
            Ok(Response::new(rp::RegistrationStatusResponse {}))
        }
    }

    /// A driver's node service that only answers NodeGetInfo.
    #[derive(Clone)]
    struct InfoOnly;

    #[tonic::async_trait]
    impl proto::node_server::Node for InfoOnly {
        async fn node_stage_volume(
            &self,
            _: Request<proto::NodeStageVolumeRequest>,
        ) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
            Err(Status::unimplemented("no"))
        }
        async fn node_unstage_volume(
            &self,
            _: Request<proto::NodeUnstageVolumeRequest>,
        ) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
            Err(Status::unimplemented("no"))
        }
        async fn node_publish_volume(
            &self,
            _: Request<proto::NodePublishVolumeRequest>,
        ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
            Err(Status::unimplemented("no"))
        }
        async fn node_unpublish_volume(
            &self,
            _: Request<proto::NodeUnpublishVolumeRequest>,
        ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
            Err(Status::unimplemented("no"))
        }
        async fn node_get_volume_stats(
            &self,
            _: Request<proto::NodeGetVolumeStatsRequest>,
        ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
            Err(Status::unimplemented("no"))
        }
        async fn node_expand_volume(
            &self,
            _: Request<proto::NodeExpandVolumeRequest>,
        ) -> Result<Response<proto::NodeExpandVolumeResponse>, Status> {
            Err(Status::unimplemented("no"))
        }
        async fn node_get_capabilities(
            &self,
            _: Request<proto::NodeGetCapabilitiesRequest>,
        ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
            Ok(Response::new(Default::default()))
        }
        async fn node_get_info(
            &self,
            _: Request<proto::NodeGetInfoRequest>,
        ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
            Ok(Response::new(proto::NodeGetInfoResponse {
                node_id: "node-7".into(),
                max_volumes_per_node: 3,
                accessible_topology: Some(proto::Topology {
                    segments: [("zone".to_string(), "z1".to_string())].into(),
                }),
            }))
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "rkubelet-csireg-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn registrar(dir: &Path, file: &str, info: rp::PluginInfo) -> FakeRegistrar {
        let l = tokio::net::UnixListener::bind(dir.join(file)).unwrap();
        let f = FakeRegistrar {
            info,
            statuses: Default::default(),
        };
        serve(
            l,
            rp::registration_server::RegistrationServer::new(f.clone()),
        );
        f
    }

    fn driver_socket(dir: &Path) -> String {
        let p = dir.join("csi.sock");
        let l = tokio::net::UnixListener::bind(&p).unwrap();
        serve(l, proto::node_server::NodeServer::new(InfoOnly));
        p.to_string_lossy().into_owned()
    }

    fn info(name: &str, endpoint: &str, versions: &[&str]) -> rp::PluginInfo {
        rp::PluginInfo {
            r#type: CSI_PLUGIN.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            supported_versions: versions.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[tokio::test]
    async fn a_registrar_socket_registers_its_driver_and_its_removal_deregisters() {
        let root = tempdir("ok");
        let reg_dir = root.join(REGISTRY_DIR);
        std::fs::create_dir_all(&reg_dir).unwrap();
        let endpoint = driver_socket(&root);
        let fake = registrar(
            &reg_dir,
            "fake.csi-reg.sock",
            info("fake.csi", &endpoint, &["1.0.0"]),
        );
        // Not sockets or hidden: ignored.
        std::fs::write(reg_dir.join("notes.txt"), "x").unwrap();
        let registry = Registry::default();
        let mut seen = HashMap::new();
        reconcile(&reg_dir, &registry, &mut seen).await;
        let d = registry.get("fake.csi").expect("registered");
        assert_eq!(d.endpoint, endpoint);
        assert_eq!((d.node_id.as_str(), d.max_volumes), ("node-7", 3));
        assert_eq!(d.topology.get("zone").map(String::as_str), Some("z1"));
        let st = fake.statuses.lock().clone();
        assert_eq!(st.len(), 1);
        assert!(st[0].plugin_registered && st[0].error.is_empty());
        assert_eq!(seen.len(), 1, "only the socket is looked at");
        // Another pass changes nothing and asks nothing again.
        reconcile(&reg_dir, &registry, &mut seen).await;
        assert_eq!(fake.statuses.lock().len(), 1);
        std::fs::remove_file(reg_dir.join("fake.csi-reg.sock")).unwrap();
        reconcile(&reg_dir, &registry, &mut seen).await;
        assert!(registry.get("fake.csi").is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn unsupported_versions_and_types_are_refused_and_told_so() {
        let root = tempdir("bad");
        let reg_dir = root.join(REGISTRY_DIR);
        std::fs::create_dir_all(&reg_dir).unwrap();
        let endpoint = driver_socket(&root);
        let v2 = registrar(&reg_dir, "v2.sock", info("v2.csi", &endpoint, &["2.0.0"]));
        let mut dp = info("gpu", &endpoint, &["v1beta1"]);
        dp.r#type = "DevicePlugin".into();
        let dev = registrar(&reg_dir, "dev.sock", dp);
        let registry = Registry::default();
        let mut seen = HashMap::new();
        reconcile(&reg_dir, &registry, &mut seen).await;
        assert!(registry.names().is_empty());
        let st = v2.statuses.lock().clone();
        assert_eq!(st.len(), 1);
        assert!(!st[0].plugin_registered);
        assert!(
            st[0]
                .error
                .contains("validation failed for CSI Driver v2.csi")
                && st[0].error.contains("None of the versions specified"),
            "{}",
            st[0].error
        );
        let st = dev.statuses.lock().clone();
        assert!(
            !st[0].plugin_registered
                && st[0]
                    .error
                    .contains("no handler registered for plugin type: DevicePlugin"),
            "{}",
            st[0].error
        );
        // Failed sockets wait for their backoff: the next pass does not ask.
        reconcile(&reg_dir, &registry, &mut seen).await;
        assert_eq!(v2.statuses.lock().len(), 1);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn a_dead_socket_is_logged_not_fatal_and_a_second_driver_of_a_name_needs_a_higher_version(
    ) {
        let root = tempdir("dead");
        let reg_dir = root.join(REGISTRY_DIR);
        std::fs::create_dir_all(&reg_dir).unwrap();
        // A socket nobody answers on.
        let dead = std::os::unix::net::UnixListener::bind(reg_dir.join("dead.sock")).unwrap();
        drop(dead);
        let endpoint = driver_socket(&root);
        registrar(&reg_dir, "a.sock", info("same.csi", &endpoint, &["1.1.0"]));
        let registry = Registry::default();
        let mut seen = HashMap::new();
        reconcile(&reg_dir, &registry, &mut seen).await;
        assert_eq!(registry.names(), vec!["same.csi".to_string()]);
        assert!(matches!(
            seen[&reg_dir.join("dead.sock")].state,
            SocketState::Failed { .. }
        ));
        let second = registrar(&reg_dir, "b.sock", info("same.csi", &endpoint, &["1.0.0"]));
        reconcile(&reg_dir, &registry, &mut seen).await;
        let st = second.statuses.lock().clone();
        assert!(
            !st[0].plugin_registered && st[0].error.contains("higher supported version"),
            "{}",
            st[0].error
        );
        // The first driver stays.
        assert_eq!(
            registry.get("same.csi").unwrap().version.to_string(),
            "1.1.0"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
