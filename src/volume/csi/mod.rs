//! CSI node plugins (upstream `pkg/volume/csi` and the CSI side of
//! `pkg/kubelet/pluginmanager`): the registry of drivers that registered
//! through `<root-dir>/plugins_registry/` (`registration.rs`), the gRPC
//! client to a driver's node service (`client.rs`), the set-up and
//! tear-down of CSI volumes in pods (`mounter.rs`; raw block volumes in
//! `block.rs`), and their figures from
//! NodeGetVolumeStats (`metrics.rs`). Mounting is the
//! driver's job; rkubelet computes the paths, makes the parent
//! directories and removes them after the driver unpublished.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::storage::v1::CSIDriver;

use parking_lot::Mutex;
use tokio::sync::watch;

pub mod attach;
pub mod block;
pub mod client;
pub mod expand;
pub mod metrics;
pub mod mounter;
pub mod nodeinfo;
pub mod registration;

/// Generated protobuf and gRPC code for the CSI node side (`csi.v1`).
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// Generated protobuf and gRPC code for the kubelet plugin registration API.
#[allow(clippy::all, missing_docs)]
pub mod registration_proto {
    tonic::include_proto!("pluginregistration");
}

/// Upstream's in-tree name of the CSI volume plugin; its escaped form
/// (`kubernetes.io~csi`) names the pod volume directory.
pub const PLUGIN_NAME: &str = "kubernetes.io/csi";

/// Upstream prefixes the CSI plugin's messages with its name (`log()` in
/// pkg/volume/csi).
pub(crate) fn log_msg(msg: impl std::fmt::Display) -> String {
    format!("{PLUGIN_NAME}: {msg}")
}

/// A generic version (upstream `utilversion.ParseGeneric`): two or more
/// dot-separated numbers after an optional `v`, anything after them
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(Vec<u64>);

impl Version {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim_start();
        let t = t.strip_prefix('v').unwrap_or(t);
        let end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let numbers = t[..end].trim_end_matches('.');
        let parts: Vec<&str> = numbers.split('.').collect();
        if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!("could not parse {s:?} as version"));
        }
        if parts[0].len() > 1 && parts[0].starts_with('0') {
            return Err(format!(
                "illegal zero-prefixed version component {:?} in {s:?}",
                parts[0]
            ));
        }
        parts
            .iter()
            .map(|p| {
                p.parse::<u64>().map_err(|e| {
                    format!("illegal non-numeric version component {p:?} in {s:?}: {e}")
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Version)
    }

    pub fn major(&self) -> u64 {
        self.0.first().copied().unwrap_or(0)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&s.join("."))
    }
}

/// The highest 1.x version among those a plugin reports (upstream
/// `utilversion.HighestSupportedVersion`: 2.x and later are skipped, as
/// they need not be compatible with 1.x; unparsable entries are skipped).
pub fn highest_supported_version(versions: &[String]) -> Result<Version, String> {
    if versions.is_empty() {
        return Err("empty array for supported versions".into());
    }
    let mut best: Option<Version> = None;
    let mut last_err = None;
    for v in versions.iter().rev() {
        match Version::parse(v) {
            Ok(v) if v.major() > 1 => {}
            Ok(v) => {
                if best.as_ref().is_none_or(|b| *b < v) {
                    best = Some(v);
                }
            }
            Err(e) => last_err = Some(e),
        }
    }
    match best {
        None => Err(format!(
            "could not find a highest supported version from versions ({}) reported: {}",
            versions.join(" "),
            last_err.unwrap_or_else(|| "<nil>".into())
        )),
        Some(v) if v.major() != 1 => Err(format!(
            "highest supported version reported is {v}, must be v1.x"
        )),
        Some(v) => Ok(v),
    }
}

/// A registered driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// The Unix socket of the driver's CSI services.
    pub endpoint: String,
    pub version: Version,
    /// What NodeGetInfo said.
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
}

/// The drivers registered on this node, by name (upstream `csiDrivers`).
/// Cheap to clone; every clone sees the same drivers.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

struct RegistryInner {
    drivers: Mutex<HashMap<String, Driver>>,
    node_name: Mutex<String>,
    /// The API client, once cluster mode has one: CSIDriver objects are
    /// read through it.
    api: Mutex<Option<Arc<OnceLock<crate::apiclient::ApiClient>>>>,
    /// Bumped on every change, so the volume manager retries waiting
    /// volumes as soon as their driver registers.
    changed: watch::Sender<u64>,
    /// `enableControllerAttachDetach` (true by default, as upstream).
    controller_attach: std::sync::atomic::AtomicBool,
    /// The kubelet's own Node as its watch last saw it (cluster mode):
    /// attach verification reads it first, and its changes retry volumes
    /// waiting for the attach/detach controller.
    node: watch::Sender<Option<Arc<k8s_openapi::api::core::v1::Node>>>,
    /// What to report in `node.status.volumesInUse`.
    in_use: Mutex<attach::InUse>,
    /// One operation at a time per persistent volume, across pods and the
    /// clean-up of pods gone while rkubelet was down.
    volume_locks: crate::volume::locks::VolumeLocks,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            inner: Arc::new(RegistryInner {
                drivers: Default::default(),
                node_name: Default::default(),
                api: Default::default(),
                changed: watch::channel(0).0,
                controller_attach: std::sync::atomic::AtomicBool::new(true),
                node: watch::channel(None).0,
                in_use: Default::default(),
                volume_locks: Default::default(),
            }),
        }
    }
}

impl Registry {
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.inner.drivers.lock().get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.drivers.lock().keys().cloned().collect();
        v.sort();
        v
    }

    pub(crate) fn set(&self, name: &str, d: Driver) {
        crate::metrics::certvol::csi_driver_endpoint(&d.endpoint, name);
        self.inner.drivers.lock().insert(name.to_string(), d);
        self.inner.changed.send_modify(|g| *g += 1);
    }

    /// Removes the driver if it is still the one at `endpoint` (a newer
    /// registration under the same name is left alone).
    pub(crate) fn remove(&self, name: &str, endpoint: &str) -> bool {
        let removed = {
            let mut d = self.inner.drivers.lock();
            if d.get(name).is_some_and(|d| d.endpoint == endpoint) {
                d.remove(name);
                true
            } else {
                false
            }
        };
        if removed {
            self.inner.changed.send_modify(|g| *g += 1);
        }
        removed
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// The node's name, recorded in `vol_data.json` and attachment IDs.
    pub fn set_node_name(&self, name: &str) {
        *self.inner.node_name.lock() = name.to_string();
    }

    pub fn node_name(&self) -> String {
        self.inner.node_name.lock().clone()
    }

    /// Where the API client will be (cluster mode only).
    pub fn set_api(&self, slot: Arc<OnceLock<crate::apiclient::ApiClient>>) {
        *self.inner.api.lock() = Some(slot);
    }

    /// The API client: None in standalone mode, an error in cluster mode
    /// before the client exists (TLS bootstrap still running).
    pub(crate) fn api_client(&self) -> Result<Option<crate::apiclient::ApiClient>, String> {
        match self.inner.api.lock().as_ref() {
            None => Ok(None),
            Some(slot) => slot
                .get()
                .cloned()
                .map(Some)
                .ok_or_else(|| "no API client yet".to_string()),
        }
    }

    /// `enableControllerAttachDetach`.
    pub fn set_controller_attach_detach(&self, on: bool) {
        self.inner
            .controller_attach
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn controller_attach_detach(&self) -> bool {
        self.inner
            .controller_attach
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Follows the watch of the kubelet's own Node until it closes.
    pub async fn follow_node(
        &self,
        mut rx: watch::Receiver<Option<k8s_openapi::api::core::v1::Node>>,
    ) {
        loop {
            let n = rx.borrow_and_update().clone().map(Arc::new);
            self.inner.node.send_replace(n);
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The Node as last seen (None before the first sight, or standalone).
    pub fn cached_node(&self) -> Option<Arc<k8s_openapi::api::core::v1::Node>> {
        self.inner.node.borrow().clone()
    }

    /// Changes of the cached Node.
    pub fn subscribe_node(&self) -> watch::Receiver<Option<Arc<k8s_openapi::api::core::v1::Node>>> {
        self.inner.node.subscribe()
    }

    /// Waits until no other operation runs on persistent volume `handle`
    /// of `driver` (see `volume::locks`).
    pub async fn lock_volume(
        &self,
        driver: &str,
        handle: &str,
    ) -> crate::volume::locks::VolumeGuard {
        self.inner
            .volume_locks
            .lock(&attach::unique_name(driver, handle))
            .await
    }

    #[cfg(test)]
    pub fn volume_lock_users(&self, driver: &str, handle: &str) -> usize {
        self.inner
            .volume_locks
            .users(&attach::unique_name(driver, handle))
    }

    /// The volumes-in-use bookkeeping (see [`attach::InUse`]).
    pub fn in_use(&self) -> parking_lot::MutexGuard<'_, attach::InUse> {
        self.inner.in_use.lock()
    }

    /// `node.status.volumesInUse`: sorted unique names of the attachable
    /// volumes mounted or being mounted; None until the pod directories
    /// have been read after start (the Node's list is then left alone).
    pub fn volumes_in_use(&self) -> Option<Vec<String>> {
        self.inner.in_use.lock().list()
    }

    /// The driver's CSIDriver object (upstream reads it through an
    /// informer; rkubelet asks at each set-up).
    pub(crate) async fn csi_driver(&self, name: &str) -> Result<DriverObject, String> {
        let Some(client) = self.api_client()? else {
            return Ok(DriverObject::NoApiServer);
        };
        let c = client.client().await;
        match kube::Api::<CSIDriver>::all(c).get_opt(name).await {
            Ok(Some(d)) => Ok(DriverObject::Found(Box::new(d))),
            Ok(None) => Ok(DriverObject::Missing),
            Err(e) => Err(format!("failed to get CSIDriver {name}: {e}")),
        }
    }

    /// Upstream's message when a volume names a driver that has not
    /// registered (a transient failure: the mount is retried).
    pub fn not_found(name: &str) -> String {
        format!("driver name {name} not found in the list of registered CSI drivers")
    }
}

/// What the API says about a driver.
#[derive(Debug)]
pub enum DriverObject {
    /// Standalone mode: there is no API to ask.
    NoApiServer,
    /// No CSIDriver object (it is optional).
    Missing,
    Found(Box<CSIDriver>),
}

impl DriverObject {
    /// Upstream `supportsVolumeLifecycleMode`: without a CSIDriver only
    /// persistent volumes; with one, the modes it lists (the API server
    /// defaults the list to Persistent). Standalone mode has no CSIDriver
    /// to ask and allows both (upstream's standalone kubelet has no CSI at
    /// all; static pods cannot name CSI volumes anyway).
    pub fn supports_mode(&self, driver: &str, mode: &str) -> Result<(), String> {
        match self {
            DriverObject::NoApiServer => Ok(()),
            DriverObject::Missing if mode == "Persistent" => Ok(()),
            DriverObject::Missing => Err(format!(
                "volume mode {mode:?} not supported by driver {driver} (no CSIDriver object)"
            )),
            DriverObject::Found(d) => {
                let modes = d
                    .spec
                    .volume_lifecycle_modes
                    .clone()
                    .unwrap_or_else(|| vec!["Persistent".into()]);
                if modes.iter().any(|m| m == mode) {
                    return Ok(());
                }
                let quoted: Vec<String> = modes.iter().map(|m| format!("{m:?}")).collect();
                Err(format!(
                    "volume mode {mode:?} not supported by driver {driver} (only supports [{}])",
                    quoted.join(" ")
                ))
            }
        }
    }

    /// Whether the driver wants pod information in the volume context
    /// (`podInfoOnMount`; no CSIDriver, no pod information).
    pub fn pod_info_on_mount(&self) -> bool {
        matches!(self, DriverObject::Found(d) if d.spec.pod_info_on_mount == Some(true))
    }

    /// Whether the volume must be attached first (`attachRequired`, true
    /// by default and without a CSIDriver).
    pub fn attach_required(&self) -> bool {
        match self {
            DriverObject::Found(d) => d.spec.attach_required != Some(false),
            DriverObject::Missing => true,
            DriverObject::NoApiServer => false,
        }
    }
}

/// A CSIDriver's `fsGroupPolicy`: whether the kubelet applies the pod's
/// fsGroup to a published volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsGroupPolicy {
    /// Only for a volume with an fsType and a ReadWriteOnce access mode
    /// (the API server's default, and upstream's without a CSIDriver).
    ReadWriteOnceWithFsType,
    File,
    None,
}

impl DriverObject {
    /// Upstream `getFSGroupPolicy`: the default without a CSIDriver; an
    /// object without the field (the API server always defaults it) is
    /// an error.
    pub fn fs_group_policy(&self) -> Result<FsGroupPolicy, String> {
        let DriverObject::Found(d) = self else {
            return Ok(FsGroupPolicy::ReadWriteOnceWithFsType);
        };
        match d.spec.fs_group_policy.as_deref() {
            Some("File") => Ok(FsGroupPolicy::File),
            Some("None") => Ok(FsGroupPolicy::None),
            Some("ReadWriteOnceWithFSType") => Ok(FsGroupPolicy::ReadWriteOnceWithFsType),
            None | Some("") => Err(log_msg(
                "expected valid fsGroupPolicy, received nil value or empty string",
            )),
            // The API server admits only the three values; anything else
            // is treated as the default, as upstream's comparisons do.
            Some(_) => Ok(FsGroupPolicy::ReadWriteOnceWithFsType),
        }
    }

    /// `requiresRepublish`: NodePublishVolume again at each pod sync.
    pub fn requires_republish(&self) -> bool {
        matches!(self, DriverObject::Found(d) if d.spec.requires_republish == Some(true))
    }

    /// `tokenRequests`: the audiences the driver wants pod tokens for.
    pub fn token_requests(&self) -> Vec<k8s_openapi::api::storage::v1::TokenRequest> {
        match self {
            DriverObject::Found(d) => d.spec.token_requests.clone().unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

/// Lower-case hex of SHA-256.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use std::fmt::Write;
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_highest_1x_version_is_chosen_and_others_refused() {
        assert_eq!(
            highest_supported_version(&vs(&["1.0.0", "1.2.0", "0.3.0"]))
                .unwrap()
                .to_string(),
            "1.2.0"
        );
        // 2.x need not be compatible: skipped, a 1.x still wins.
        assert_eq!(
            highest_supported_version(&vs(&["2.0.0", "v1.5"]))
                .unwrap()
                .to_string(),
            "1.5"
        );
        assert!(highest_supported_version(&[])
            .unwrap_err()
            .contains("empty array"));
        let e = highest_supported_version(&vs(&["0.3.0"])).unwrap_err();
        assert_eq!(
            e,
            "highest supported version reported is 0.3.0, must be v1.x"
        );
        let e = highest_supported_version(&vs(&["2.0.0", "junk"])).unwrap_err();
        assert!(
            e.starts_with("could not find a highest supported version"),
            "{e}"
        );
        assert!(Version::parse("1").is_err() && Version::parse("01.0").is_err());
        assert!(Version::parse("1.0.0-rc1").is_ok());
    }

    #[test]
    fn a_driver_is_removed_only_by_its_own_endpoint() {
        let r = Registry::default();
        let mut rx = r.subscribe();
        let d = Driver {
            endpoint: "/a.sock".into(),
            version: Version::parse("1.0.0").unwrap(),
            node_id: "n".into(),
            max_volumes: 0,
            topology: Default::default(),
        };
        r.set("x", d.clone());
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        assert!(!r.remove("x", "/b.sock"));
        assert_eq!(r.get("x"), Some(d));
        assert!(r.remove("x", "/a.sock"));
        assert!(r.get("x").is_none() && rx.has_changed().unwrap());
    }

    #[test]
    fn lifecycle_modes_pod_info_and_attach_follow_the_csidriver() {
        let missing = DriverObject::Missing;
        missing.supports_mode("d", "Persistent").unwrap();
        assert_eq!(
            missing.supports_mode("d", "Ephemeral").unwrap_err(),
            "volume mode \"Ephemeral\" not supported by driver d (no CSIDriver object)"
        );
        assert!(!missing.pod_info_on_mount() && missing.attach_required());
        let mut d = CSIDriver::default();
        let found = DriverObject::Found(Box::new(d.clone()));
        assert_eq!(
            found.supports_mode("d", "Ephemeral").unwrap_err(),
            "volume mode \"Ephemeral\" not supported by driver d (only supports [\"Persistent\"])"
        );
        d.spec.volume_lifecycle_modes = Some(vec!["Ephemeral".into()]);
        d.spec.pod_info_on_mount = Some(true);
        d.spec.attach_required = Some(false);
        let found = DriverObject::Found(Box::new(d));
        found.supports_mode("d", "Ephemeral").unwrap();
        assert!(found.supports_mode("d", "Persistent").is_err());
        assert!(found.pod_info_on_mount() && !found.attach_required());
    }

    #[test]
    fn fs_group_policy_republish_and_tokens_follow_the_csidriver() {
        assert_eq!(
            DriverObject::Missing.fs_group_policy(),
            Ok(FsGroupPolicy::ReadWriteOnceWithFsType)
        );
        assert_eq!(
            DriverObject::NoApiServer.fs_group_policy(),
            Ok(FsGroupPolicy::ReadWriteOnceWithFsType)
        );
        let mut d = CSIDriver::default();
        assert_eq!(
            DriverObject::Found(Box::new(d.clone()))
                .fs_group_policy()
                .unwrap_err(),
            "kubernetes.io/csi: expected valid fsGroupPolicy, received nil value or empty string"
        );
        for (v, want) in [
            ("File", FsGroupPolicy::File),
            ("None", FsGroupPolicy::None),
            (
                "ReadWriteOnceWithFSType",
                FsGroupPolicy::ReadWriteOnceWithFsType,
            ),
        ] {
            d.spec.fs_group_policy = Some(v.into());
            assert_eq!(
                DriverObject::Found(Box::new(d.clone())).fs_group_policy(),
                Ok(want)
            );
        }
        assert!(!DriverObject::Found(Box::new(d.clone())).requires_republish());
        d.spec.requires_republish = Some(true);
        d.spec.token_requests = Some(vec![k8s_openapi::api::storage::v1::TokenRequest {
            audience: "vault".into(),
            expiration_seconds: Some(600),
        }]);
        let o = DriverObject::Found(Box::new(d));
        assert!(o.requires_republish());
        assert_eq!(o.token_requests()[0].audience, "vault");
        assert!(DriverObject::Missing.token_requests().is_empty());
    }

    #[test]
    fn sha256_is_lower_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
