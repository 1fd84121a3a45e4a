//! The Node object: registration, status and the heartbeat Lease (upstream
//! `kubelet_node_status.go`, `nodestatus/setters.go` and `nodelease`).
//!
//! Registration creates the Node (labels, taints, addresses, capacity,
//! allocatable, nodeInfo); an existing Node of the same name keeps what
//! others set and gets only the default labels and the attach-detach
//! annotation the kubelet owns. Every `nodeStatusUpdateFrequency` the
//! status is computed on the Node as the API server has it (from a watch of
//! the kubelet's own Node, or a GET on retries) and the difference is sent
//! as a strategic merge patch, only when it changed (ignoring heartbeat
//! times) or `nodeStatusReportFrequency` passed; liveness comes from the
//! Lease, renewed every quarter of its duration.

pub mod lease;
pub mod patch;
pub mod quantity;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Why one try of a status update failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeStatusError {
    #[error("node {0:?} is not in the local cache")]
    NotCached(String),
    #[error("error getting node {node:?}: {source}")]
    Get {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("error patching the status of node {node:?}: {source}")]
    Patch {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Upstream's nodeStatusUpdateRetry: tries per status period.
pub const NODE_STATUS_UPDATE_RETRY: usize = 5;

use crate::apiclient::ApiClient;
use quantity::{format_binary, format_decimal_milli, parse_threshold_milli};

pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
pub const LABEL_OS: &str = "kubernetes.io/os";
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
pub const LEGACY_LABEL_OS: &str = "beta.kubernetes.io/os";
pub const LEGACY_LABEL_ARCH: &str = "beta.kubernetes.io/arch";
/// Labels the kubelet owns on an existing Node (upstream updateDefaultLabels).
const DEFAULT_LABELS: [&str; 8] = [
    LABEL_HOSTNAME,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    LABEL_OS,
    LABEL_ARCH,
    LEGACY_LABEL_OS,
    LEGACY_LABEL_ARCH,
];
pub const CONTROLLER_MANAGED_ATTACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// Upstream's Ready messages (nodestatus.ReadyCondition).
pub const READY_MESSAGE: &str = "kubelet is posting ready status";

/// What the Node is built from: configuration and facts read once at start.
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    pub node_name: String,
    pub hostname: String,
    pub node_ip: String,
    pub node_labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub provider_id: String,
    pub max_pods: i32,
    pub kubelet_port: i32,
    pub controller_attach_detach: bool,
    pub kube_reserved: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    pub eviction_hard: BTreeMap<String, String>,
    pub num_cores: usize,
    pub memory_bytes: u64,
    pub ephemeral_storage_bytes: u64,
    /// `localStorageCapacityIsolation`: without it the Node reports no
    /// ephemeral-storage at all, as upstream's MachineInfo setter.
    pub local_storage_capacity_isolation: bool,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    pub kubelet_version: String,
    pub update_frequency: Duration,
    pub report_frequency: Duration,
    pub lease_duration_seconds: i32,
    pub max_images: i32,
    /// `registerNode`: create the Node; when false, only an existing Node
    /// (made by someone else) is kept up to date, as upstream.
    pub register_node: bool,
    /// What admission reads: kept current with the Node in the API (labels
    /// and taints others set count for node selectors and taints).
    pub facts: Arc<parking_lot::RwLock<crate::lifecycle::NodeFacts>>,
}

impl NodeConfig {
    /// Upstream's heartbeat client timeout (cmd/kubelet/app/server.go): the
    /// smaller of the status period and the lease duration, so a hung
    /// request cannot eat the period.
    pub fn heartbeat_timeout(&self) -> Duration {
        let lease = Duration::from_secs(self.lease_duration_seconds.max(1) as u64);
        self.update_frequency
            .min(lease)
            .max(Duration::from_millis(100))
    }
}

/// What changes at run time: the health behind the Ready condition, the
/// runtime's version and the node's images.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Errors that make the node NotReady, in upstream's order (runtime,
    /// network, PLEG...).
    pub errors: Vec<String>,
    pub runtime_version: String,
    pub images: Vec<ContainerImage>,
    /// The runtime's handlers (status.runtimeHandlers); empty is omitted.
    pub runtime_handlers: Vec<k8s_openapi::api::core::v1::NodeRuntimeHandler>,
    /// Whether the runtime applies `supplementalGroupsPolicy: Strict`;
    /// None (no `status.features`) when it reports no features (upstream
    /// NodeFeatures setter).
    pub supplemental_groups_policy: Option<bool>,
    /// `status.volumesInUse` (upstream's VolumesInUse setter: sorted unique
    /// names of the attachable volumes the volume manager mounts or is
    /// mounting); None until the volume manager has synced its state, and
    /// the Node's list is then left as it is.
    pub volumes_in_use: Option<Vec<String>>,
    /// The eviction manager's pressure conditions.
    pub pressure: crate::eviction::Pressure,
}

/// Go's GOARCH for the machine's architecture.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// PRETTY_NAME from /etc/os-release, as cAdvisor reports the OS image.
pub fn os_image() -> String {
    let text = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

/// The bytes of the file system holding `path` (statfs).
pub fn fs_capacity(path: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statfs writes into the zeroed struct it is given.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut s) != 0 {
            return 0;
        }
        (s.f_blocks as u64).saturating_mul(s.f_bsize as u64)
    }
}

/// Capacity and allocatable (upstream MachineInfo setter and
/// GetNodeAllocatableReservation: capacity minus kube-reserved,
/// system-reserved and the hard eviction threshold).
fn resources(cfg: &NodeConfig) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let cpu = cfg.num_cores as i128 * 1000;
    let mem = cfg.memory_bytes as i128 * 1000;
    let eph = cfg.ephemeral_storage_bytes as i128 * 1000;
    let reserved = |name: &str, total: i128| -> i128 {
        let r = |m: &BTreeMap<String, String>| {
            m.get(name)
                .and_then(|v| parse_threshold_milli(v, total))
                .unwrap_or(0)
        };
        r(&cfg.kube_reserved) + r(&cfg.system_reserved)
    };
    // As configured: the file's defaults are filled in when it is loaded,
    // and without a file upstream has no hard thresholds at all.
    let evict = &cfg.eviction_hard;
    let threshold = |signal: &str, total: i128| {
        evict
            .get(signal)
            .and_then(|v| parse_threshold_milli(v, total))
            .unwrap_or(0)
    };
    let q = |s: String| Quantity(s);
    let mut cap = BTreeMap::new();
    cap.insert("cpu".to_string(), q(format_decimal_milli(cpu)));
    cap.insert("memory".to_string(), q(format_binary(mem / 1000)));
    if cfg.local_storage_capacity_isolation {
        cap.insert(
            "ephemeral-storage".to_string(),
            q(format_binary(eph / 1000)),
        );
    }
    cap.insert("pods".to_string(), q(cfg.max_pods.to_string()));
    cap.insert("hugepages-1Gi".to_string(), q("0".into()));
    cap.insert("hugepages-2Mi".to_string(), q("0".into()));
    let mut alloc = cap.clone();
    let cpu_a = (cpu - reserved("cpu", cpu)).max(0);
    alloc.insert("cpu".to_string(), q(format_decimal_milli(cpu_a)));
    let mem_a = (mem - reserved("memory", mem) - threshold("memory.available", mem)).max(0);
    alloc.insert("memory".to_string(), q(format_binary(mem_a / 1000)));
    if cfg.local_storage_capacity_isolation {
        let eph_a =
            (eph - reserved("ephemeral-storage", eph) - threshold("nodefs.available", eph)).max(0);
        alloc.insert(
            "ephemeral-storage".to_string(),
            q(format_binary(eph_a / 1000)),
        );
    }
    (cap, alloc)
}

/// The Node's pods capacity: `maxPods`, or with `podsPerCore` set that
/// many per core when fewer (upstream's MachineInfo setter).
pub fn pods_capacity(max_pods: i32, pods_per_core: i32, cores: usize) -> i32 {
    if pods_per_core > 0 {
        (i64::from(pods_per_core) * cores as i64).min(i64::from(max_pods)) as i32
    } else {
        max_pods
    }
}

/// What admission checks against, from the configured Node.
pub fn node_facts(cfg: &NodeConfig) -> crate::lifecycle::NodeFacts {
    use quantity::parse_milli;
    let (_, alloc) = resources(cfg);
    let get = |k: &str| alloc.get(k).and_then(|q| parse_milli(&q.0)).unwrap_or(0);
    let node = initial_node(cfg, &Observed::default(), now());
    crate::lifecycle::NodeFacts {
        name: cfg.node_name.clone(),
        labels: node.metadata.labels.unwrap_or_default(),
        taints: cfg.taints.clone(),
        cpu_milli: get("cpu"),
        memory_milli: get("memory"),
        ephemeral_milli: get("ephemeral-storage"),
        pods: cfg.max_pods as i64,
        // From the runtime's Status answers, at admission.
        supplemental_groups_policy: false,
    }
}

/// Takes the labels and taints of the Node as the API server has it.
fn observe_node(cfg: &NodeConfig, node: &Node) {
    let mut f = cfg.facts.write();
    if let Some(l) = &node.metadata.labels {
        f.labels = l.clone();
    }
    f.taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
}

/// The Node to register (upstream initialNode).
pub fn initial_node(cfg: &NodeConfig, obs: &Observed, now: Time) -> Node {
    let mut labels: BTreeMap<String, String> = [
        (LABEL_HOSTNAME, cfg.hostname.as_str()),
        (LABEL_OS, "linux"),
        (LABEL_ARCH, go_arch()),
        (LEGACY_LABEL_OS, "linux"),
        (LEGACY_LABEL_ARCH, go_arch()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in &cfg.node_labels {
        if let Some(old) = labels.get(k) {
            warn!(label = %k, value = %v, default = %old, "the node label will overwrite the default setting");
        }
        labels.insert(k.clone(), v.clone());
    }
    let annotations = cfg.controller_attach_detach.then(|| {
        [(CONTROLLER_MANAGED_ATTACH.to_string(), "true".to_string())]
            .into_iter()
            .collect()
    });
    let mut node = Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(labels),
            annotations,
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!cfg.taints.is_empty()).then(|| cfg.taints.clone()),
            provider_id: (!cfg.provider_id.is_empty()).then(|| cfg.provider_id.clone()),
            ..Default::default()
        }),
        status: None,
    };
    node.status = Some(node_status(cfg, obs, None, now));
    node
}

fn condition(
    kind: &str,
    ok: bool,
    reason: &str,
    message: &str,
    previous: Option<&NodeStatus>,
    now: &Time,
) -> NodeCondition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status does.
    let transition = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// Upstream's utilerrors aggregate: one error as itself, more as "[a, b]".
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The node's status (upstream setNodeStatus with the default setters).
pub fn node_status(
    cfg: &NodeConfig,
    obs: &Observed,
    previous: Option<&NodeStatus>,
    now: Time,
) -> NodeStatus {
    let (capacity, allocatable) = resources(cfg);
    let mut addresses = Vec::new();
    if !cfg.node_ip.is_empty() {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: cfg.node_ip.clone(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: cfg.hostname.clone(),
    });
    let ready = obs.errors.is_empty();
    if ready {
        crate::metrics::node_ready();
    }
    // Upstream's MemoryPressureCondition, DiskPressureCondition and
    // PIDPressureCondition setters, from the eviction manager.
    let p = obs.pressure;
    let pressure = |kind: &str, on: bool, yes: (&str, &str), no: (&str, &str)| {
        let (reason, message) = if on { yes } else { no };
        condition(kind, on, reason, message, previous, &now)
    };
    let conditions = vec![
        pressure(
            "MemoryPressure",
            p.memory,
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
        ),
        pressure(
            "DiskPressure",
            p.disk,
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ),
        pressure(
            "PIDPressure",
            p.pid,
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        ),
        if ready {
            condition("Ready", true, "KubeletReady", READY_MESSAGE, previous, &now)
        } else {
            condition(
                "Ready",
                false,
                "KubeletNotReady",
                &aggregate(&obs.errors),
                previous,
                &now,
            )
        },
    ];
    NodeStatus {
        addresses: Some(addresses),
        allocatable: Some(allocatable),
        capacity: Some(capacity),
        conditions: Some(conditions),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: cfg.kubelet_port,
            }),
        }),
        images: Some(obs.images.clone()),
        runtime_handlers: (!obs.runtime_handlers.is_empty()).then(|| obs.runtime_handlers.clone()),
        features: obs.supplemental_groups_policy.map(|b| {
            k8s_openapi::api::core::v1::NodeFeatures {
                supplemental_groups_policy: Some(b),
            }
        }),
        node_info: Some(NodeSystemInfo {
            architecture: go_arch().into(),
            boot_id: cfg.boot_id.clone(),
            container_runtime_version: obs.runtime_version.clone(),
            kernel_version: cfg.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: cfg.kubelet_version.clone(),
            machine_id: cfg.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: cfg.os_image.clone(),
            system_uuid: cfg.system_uuid.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A resource named outside the `kubernetes.io` domain (upstream
/// IsExtendedResourceName, for what may sit in capacity).
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// The kubelet's setters applied to a copy of `fetched`, the status the API
/// server has (upstream updateNode + setNodeStatus): what the kubelet owns
/// is set, conditions are replaced in place by type (transition times
/// against the fetched ones), and whatever else is there (conditions and
/// capacity others set, volumes, nodeInfo fields the kubelet does not
/// report) stays.
pub fn update_status(
    cfg: &NodeConfig,
    obs: &Observed,
    fetched: &NodeStatus,
    now: Time,
) -> NodeStatus {
    let own = node_status(cfg, obs, Some(fetched), now);
    let mut s = fetched.clone();
    s.addresses = own.addresses;
    // Capacity: the kubelet's resources over what is there (device plugins
    // and others add theirs); allocatable follows every capacity entry.
    let mut cap = s.capacity.take().unwrap_or_default();
    cap.extend(own.capacity.unwrap_or_default());
    let own_alloc = own.allocatable.unwrap_or_default();
    let mut alloc = s.allocatable.take().unwrap_or_default();
    alloc.retain(|k, _| cap.contains_key(k) || !is_extended_resource(k));
    for (k, v) in &cap {
        alloc.insert(k.clone(), own_alloc.get(k).unwrap_or(v).clone());
    }
    s.capacity = Some(cap);
    s.allocatable = Some(alloc);
    let conditions = s.conditions.get_or_insert_with(Vec::new);
    for c in own.conditions.unwrap_or_default() {
        match conditions.iter_mut().find(|x| x.type_ == c.type_) {
            Some(x) => *x = c,
            None => conditions.push(c),
        }
    }
    let o = own.node_info.unwrap_or_default();
    let info = s.node_info.get_or_insert_with(Default::default);
    info.architecture = o.architecture;
    info.boot_id = o.boot_id;
    info.container_runtime_version = o.container_runtime_version;
    info.kernel_version = o.kernel_version;
    info.kubelet_version = o.kubelet_version;
    info.machine_id = o.machine_id;
    info.operating_system = o.operating_system;
    info.os_image = o.os_image;
    info.system_uuid = o.system_uuid;
    s.daemon_endpoints = own.daemon_endpoints;
    s.images = own.images.filter(|i| !i.is_empty());
    s.runtime_handlers = own.runtime_handlers;
    // Left as it is while the runtime reports no features (the setter
    // returns without touching it).
    if own.features.is_some() {
        s.features = own.features;
    }
    // volumesAttached is the attach/detach controller's and stays as
    // fetched; volumesInUse is the kubelet's.
    if let Some(v) = &obs.volumes_in_use {
        s.volumes_in_use = (!v.is_empty()).then(|| v.clone());
    }
    s
}

/// Whether two statuses differ beyond heartbeat times (upstream
/// nodeStatusHasChanged).
pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(old) != strip(new)
}

/// The images of the node for its status: largest first, at most `max`
/// (upstream nodeStatusMaxImages; -1 for all).
pub fn node_images(mut images: Vec<ContainerImage>, max: i32) -> Vec<ContainerImage> {
    images.sort_by_key(|i| std::cmp::Reverse(i.size_bytes));
    if max >= 0 {
        images.truncate(max as usize);
    }
    images
}

/// Makes `existing` carry what the kubelet owns (upstream
/// tryRegisterWithAPIServer's reconciliation); says whether it changed.
pub fn reconcile_existing(initial: &Node, existing: &mut Node) -> bool {
    let mut changed = false;
    let want = initial.metadata.labels.clone().unwrap_or_default();
    let labels = existing.metadata.labels.get_or_insert_with(BTreeMap::new);
    for key in DEFAULT_LABELS {
        let Some(v) = want.get(key) else { continue };
        if labels.get(key) != Some(v) {
            labels.insert(key.to_string(), v.clone());
            changed = true;
        }
        if labels.get(key).is_some_and(|v| v.is_empty()) {
            labels.remove(key);
        }
    }
    let want = initial
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_MANAGED_ATTACH));
    let annotations = existing
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    if annotations.get(CONTROLLER_MANAGED_ATTACH) != want {
        match want {
            Some(v) => annotations.insert(CONTROLLER_MANAGED_ATTACH.to_string(), v.clone()),
            None => annotations.remove(CONTROLLER_MANAGED_ATTACH),
        };
        changed = true;
    }
    changed
}

pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Where the status loop reads its live inputs.
/// Observes the node. With `fast` (the start-up fast path, every 100 ms),
/// the runtime's status is asked for first (upstream's updateRuntimeUp) and,
/// while the node would stay NotReady, only `errors` is filled in.
pub type Observe = Arc<dyn Fn(bool) -> futures::future::BoxFuture<'static, Observed> + Send + Sync>;

/// Tells the runtime the Node's pod CIDRs, comma-joined (upstream's
/// updatePodCIDR); says whether they changed.
pub type PodCidr =
    Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, Result<bool, String>> + Send + Sync>;

/// The kubelet's own Node as its watch last saw it (upstream's node
/// lister): `None` until first listed, and after it is deleted.
pub type NodeCache = tokio::sync::watch::Receiver<Option<Node>>;

/// Says when a repeated failure may be logged at warn: at most once per
/// `every`, with the count of those held back (they go to debug).
struct Throttle {
    every: Duration,
    last: Option<tokio::time::Instant>,
    held: u64,
}

impl Throttle {
    fn new(every: Duration) -> Self {
        Throttle {
            every,
            last: None,
            held: 0,
        }
    }

    /// `Some(held back since the last one)` when this one may be logged.
    fn allow(&mut self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    fn reset(&mut self) {
        self.last = None;
        self.held = 0;
    }
}

/// Watches the kubelet's own Node into `cache` until `token` is cancelled,
/// keeping admission's labels and taints current. The field selector
/// `metadata.name=<node>` is all the node authorizer lets a kubelet watch.
pub async fn watch_node(
    api: ApiClient,
    cfg: NodeConfig,
    cache: tokio::sync::watch::Sender<Option<Node>>,
    token: CancellationToken,
) {
    tokio::select! {
        _ = token.cancelled() => {}
        _ = follow_node(api, cfg, cache) => {}
    }
}

async fn follow_node(
    api: ApiClient,
    cfg: NodeConfig,
    cache: tokio::sync::watch::Sender<Option<Node>>,
) {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, watcher};
    use kube::runtime::WatchStreamExt;
    let mut generation = api.generation();
    let mut errors = Throttle::new(Duration::from_secs(60));
    loop {
        generation.borrow_and_update();
        let nodes: Api<Node> = Api::all(api.client().await);
        let wc = watcher::Config::default()
            .fields(&format!("metadata.name={}", cfg.node_name))
            // Reopened from the last resourceVersion, as for pods.
            .timeout(290);
        let mut stream = watcher(nodes, wc).default_backoff().boxed();
        // A (re-)list in progress: what it found so far.
        let mut listing: Option<Option<Node>> = None;
        loop {
            let ev = tokio::select! {
                // New credentials (a rotated certificate): watch again.
                Ok(()) = generation.changed() => break,
                ev = stream.next() => ev,
            };
            let seen = match ev {
                Some(Ok(watcher::Event::Init)) => {
                    listing = Some(None);
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(n))) => {
                    if let Some(l) = listing.as_mut() {
                        *l = Some(n);
                    }
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => listing.take().flatten(),
                Some(Ok(watcher::Event::Apply(n))) => Some(n),
                Some(Ok(watcher::Event::Delete(_))) => None,
                Some(Err(e)) => {
                    match errors.allow() {
                        Some(held) => {
                            warn!(node = %cfg.node_name, error = %e, held_back = held, "watch of this node failed; retrying with backoff")
                        }
                        None => {
                            debug!(node = %cfg.node_name, error = %e, "watch of this node failed")
                        }
                    }
                    continue;
                }
                None => {
                    // The watcher's stream does not end; should it, start
                    // again without spinning.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
            };
            errors.reset();
            if let Some(n) = &seen {
                observe_node(&cfg, n);
            }
            cache.send_replace(seen);
        }
    }
}

/// Registers the Node (retrying 100 ms doubling to 7 s, as upstream), then
/// updates its status every `nodeStatusUpdateFrequency` until `token` is
/// cancelled (upstream syncNodeStatus: up to five tries a period, the first
/// on the Node from `cache`, the others on one read from the API server).
/// The API server may be absent or go away at any time: failures are
/// logged at a bounded rate and tried again the next period; nothing else
/// waits for this loop. As upstream, registration happens once: a Node
/// deleted later is not created again (every update fails until someone
/// creates it or the kubelet restarts).
pub async fn run(
    api: ApiClient,
    cfg: NodeConfig,
    observe: Observe,
    pod_cidr: PodCidr,
    cache: NodeCache,
    registered: tokio::sync::watch::Sender<Option<String>>,
    token: CancellationToken,
) {
    let mut step = Duration::from_millis(100);
    let node = loop {
        let obs = observe(false).await;
        let initial = initial_node(&cfg, &obs, now());
        let attempt = if cfg.register_node {
            info!(node = %cfg.node_name, "attempting to register node");
            register(&api, &initial).await
        } else {
            let nodes: Api<Node> = Api::all(api.client().await);
            nodes.get(&cfg.node_name).await
        };
        match attempt {
            Ok(node) => {
                if cfg.register_node {
                    info!(node = %cfg.node_name, "successfully registered node");
                } else {
                    info!(node = %cfg.node_name, "registerNode is false; keeping the existing Node's status");
                }
                break node;
            }
            Err(e) => {
                warn!(node = %cfg.node_name, error = %e, "unable to register node with API server")
            }
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(step) => {}
        }
        step = (step * 2).min(Duration::from_secs(7));
    };
    observe_node(&cfg, &node);
    let _ = registered.send(node.metadata.uid.clone());
    record_transitions(
        &cfg.node_name,
        &NodeStatus::default(),
        &node.status.clone().unwrap_or_default(),
    );
    let try_timeout = cfg.heartbeat_timeout();
    let mut last_report: Option<tokio::time::Instant> = None;
    let mut failures = Throttle::new(Duration::from_secs(60));
    let mut tick = tokio::time::interval(cfg.update_frequency.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Upstream's fastStatusUpdateOnce: until the Node is seen Ready (or
    // nodeReadyGracePeriod passed), check every 100 ms whether it would now
    // be Ready and send that at once, not a status period later.
    let fast_until = tokio::time::Instant::now() + NODE_READY_GRACE_PERIOD;
    let mut fast = Some(tokio::time::interval(FAST_STATUS_PERIOD));
    loop {
        let fast_tick = async {
            match fast.as_mut() {
                Some(t) => t.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
            _ = fast_tick => {
                let timed_out = tokio::time::Instant::now() >= fast_until;
                // Bounded like a regular try: a hung runtime or API server
                // must not hold the status loop.
                let turn = tokio::time::timeout(
                    try_timeout,
                    fast_update(&api, &cfg, &observe, &cache, timed_out),
                );
                match turn.await.unwrap_or(Fast::Again) {
                    Fast::Again => continue,
                    Fast::Done => {
                        fast = None;
                        continue;
                    }
                    Fast::SyncNow => fast = None,
                }
            }
        }
        let obs = observe(false).await;
        let mut last_error = None;
        for attempt in 0..NODE_STATUS_UPDATE_RETRY {
            let tried = tokio::select! {
                _ = token.cancelled() => return,
                r = tokio::time::timeout(
                    try_timeout,
                    try_update(&api, &cfg, &obs, &pod_cidr, &cache, attempt, &mut last_report),
                ) => r.unwrap_or(Err(NodeStatusError::Timeout(try_timeout))),
            };
            match tried {
                Ok(()) => {
                    last_error = None;
                    break;
                }
                Err(e) => {
                    debug!(node = %cfg.node_name, attempt, error = %e, "error updating node status, will retry");
                    last_error = Some(e);
                }
            }
        }
        match (last_error, failures.allow()) {
            (None, _) => failures.reset(),
            (Some(e), Some(held)) => {
                warn!(node = %cfg.node_name, error = %e, tries = NODE_STATUS_UPDATE_RETRY, held_back = held, "unable to update node status; trying again next period")
            }
            (Some(e), None) => {
                debug!(node = %cfg.node_name, error = %e, "unable to update node status")
            }
        }
    }
}

/// One try (upstream tryUpdateNodeStatus): the Node from the cache on the
/// first try and from the API server on the others, the setters applied to
/// a copy of it, and a patch of the difference, sent when the status
/// changed (heartbeats aside) or `nodeStatusReportFrequency` passed.
async fn try_update(
    api: &ApiClient,
    cfg: &NodeConfig,
    obs: &Observed,
    pod_cidr: &PodCidr,
    cache: &NodeCache,
    attempt: usize,
    last_report: &mut Option<tokio::time::Instant>,
) -> Result<(), NodeStatusError> {
    let name = &cfg.node_name;
    let fetched = if attempt == 0 {
        let cached = cache.borrow().clone();
        cached.ok_or_else(|| NodeStatusError::NotCached(name.clone()))?
    } else {
        let nodes: Api<Node> = Api::all(api.heartbeat_client().await);
        nodes
            .get(name)
            .await
            .map_err(|source| NodeStatusError::Get {
                node: name.clone(),
                source,
            })?
    };
    // The pod CIDRs the controller manager allocated go to the runtime;
    // a change (or a failure to tell it, to be safe, as upstream) makes
    // this update send even an unchanged status.
    let cidrs = fetched
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_ref())
        .filter(|c| !c.is_empty())
        .map(|c| c.join(","));
    let cidr_changed = match cidrs {
        None => false,
        Some(c) => pod_cidr(c).await.unwrap_or_else(|e| {
            warn!(node = %name, error = %e, "failed to update pod CIDR");
            true
        }),
    };
    let labels = missing_required_labels(&fetched);
    let before = fetched.status.unwrap_or_default();
    let after = update_status(cfg, obs, &before, now());
    let due = last_report.is_none_or(|t| t.elapsed() >= cfg.report_frequency);
    if !due && !cidr_changed && !status_changed(&before, &after) && labels.is_empty() {
        debug!(node = %name, "node status unchanged; not sent");
        return Ok(());
    }
    let body = node_patch(&before, &after, labels);
    let nodes: Api<Node> = Api::all(api.heartbeat_client().await);
    let updated = nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
        .await
        .map_err(|source| NodeStatusError::Patch {
            node: name.clone(),
            source,
        })?;
    *last_report = Some(tokio::time::Instant::now());
    record_transitions(name, &before, &after);
    observe_node(cfg, &updated);
    Ok(())
}

/// Upstream's nodeReadyGracePeriod: how long the start-up fast path runs.
pub const NODE_READY_GRACE_PERIOD: Duration = Duration::from_secs(120);
const FAST_STATUS_PERIOD: Duration = Duration::from_millis(100);

/// The os and arch labels upstream's updateNode puts back on every status
/// update when someone removed or changed them: the scheduler's
/// kubernetes.io/os node affinity of every DaemonSet depends on them.
fn missing_required_labels(node: &Node) -> BTreeMap<String, String> {
    let labels = node.metadata.labels.as_ref();
    [(LABEL_OS, std::env::consts::OS), (LABEL_ARCH, go_arch())]
        .into_iter()
        .filter(|(k, v)| labels.and_then(|l| l.get(*k)).map(String::as_str) != Some(*v))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The status diff, plus the labels to restore: the status subresource of
/// a Node takes metadata changes too (its strategy resets only spec), which
/// is how upstream's PatchNodeStatus sends both.
fn node_patch(
    before: &NodeStatus,
    after: &NodeStatus,
    labels: BTreeMap<String, String>,
) -> serde_json::Value {
    let mut body = patch::status_patch(before, after);
    if !labels.is_empty() {
        body["metadata"] = serde_json::json!({ "labels": labels });
    }
    body
}

enum Fast {
    /// Not Ready yet, or nothing to tell: look again in 100 ms.
    Again,
    /// The fast path is over.
    Done,
    /// Over, and the patch failed: do a regular update (which re-reads the
    /// Node from the API) now.
    SyncNow,
}

fn ready(s: &NodeStatus) -> Option<bool> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// Whether the fast path has work with the Node as last seen: not while
/// there is none or it has no Ready condition, and no more once it is Ready.
fn fast_gate(node: Option<&Node>) -> Result<&Node, Fast> {
    let node = node.ok_or(Fast::Again)?;
    match node.status.as_ref().and_then(ready) {
        None => Err(Fast::Again),
        Some(true) => Err(Fast::Done),
        Some(false) => Ok(node),
    }
}

/// The fast path's answer for the Node and what was observed: the patch
/// that makes it Ready (`None` when it would stay NotReady or nothing
/// changed), or why there is nothing to do (`fast_gate`).
fn fast_decision(
    cfg: &NodeConfig,
    node: Option<&Node>,
    obs: &Observed,
) -> Result<Option<(NodeStatus, serde_json::Value)>, Fast> {
    let node = fast_gate(node)?;
    let before = node.status.clone().unwrap_or_default();
    let labels = missing_required_labels(node);
    let after = update_status(cfg, obs, &before, now());
    if (!status_changed(&before, &after) && labels.is_empty()) || ready(&after) != Some(true) {
        return Ok(None);
    }
    let body = node_patch(&before, &after, labels);
    Ok(Some((before, body)))
}

/// One turn of upstream's fastNodeStatusUpdate.
async fn fast_update(
    api: &ApiClient,
    cfg: &NodeConfig,
    observe: &Observe,
    cache: &NodeCache,
    timed_out: bool,
) -> Fast {
    if timed_out {
        warn!(node = %cfg.node_name, "node not becoming ready in time after startup");
        return Fast::Done;
    }
    let node = cache.borrow().clone();
    // Observe only once the cached Node says it is worth it.
    if let Err(f) = fast_gate(node.as_ref()) {
        return f;
    }
    let obs = observe(true).await;
    if !obs.errors.is_empty() {
        return Fast::Again;
    }
    let (before, body) = match fast_decision(cfg, node.as_ref(), &obs) {
        Err(f) => return f,
        Ok(None) => return Fast::Again,
        Ok(Some(p)) => p,
    };
    info!(node = %cfg.node_name, "fast updating node status as it just became ready");
    let nodes: Api<Node> = Api::all(api.heartbeat_client().await);
    match nodes
        .patch_status(
            &cfg.node_name,
            &PatchParams::default(),
            &Patch::Strategic(body),
        )
        .await
    {
        Ok(updated) => {
            record_transitions(
                &cfg.node_name,
                &before,
                &updated.status.clone().unwrap_or_default(),
            );
            observe_node(cfg, &updated);
            Fast::Done
        }
        Err(e) => {
            // The cached Node was probably stale; the regular update reads
            // it from the API server.
            warn!(node = %cfg.node_name, error = %e, "error updating node status, will retry with a regular update");
            Fast::SyncNow
        }
    }
}

/// Upstream's node events on condition changes ("Node n1 status is now:
/// NodeReady"): for each condition whose status differs from the one in
/// `before` (or that is new), once the change reached the API.
fn record_transitions(node: &str, before: &NodeStatus, after: &NodeStatus) {
    for c in after.conditions.iter().flatten() {
        let was = before
            .conditions
            .iter()
            .flatten()
            .find(|b| b.type_ == c.type_);
        if was.is_some_and(|b| b.status == c.status) {
            continue;
        }
        let event = match (c.type_.as_str(), c.status.as_str()) {
            ("Ready", "True") => "NodeReady",
            ("Ready", _) => "NodeNotReady",
            ("MemoryPressure", "False") => "NodeHasSufficientMemory",
            ("MemoryPressure", _) => "NodeHasInsufficientMemory",
            ("DiskPressure", "False") => "NodeHasNoDiskPressure",
            ("DiskPressure", _) => "NodeHasDiskPressure",
            ("PIDPressure", "False") => "NodeHasSufficientPID",
            ("PIDPressure", _) => "NodeHasInsufficientPID",
            _ => continue,
        };
        crate::events::record(
            crate::events::node_ref(node),
            crate::events::NORMAL,
            event,
            format!("Node {node} status is now: {event}"),
        );
    }
}

async fn register(api: &ApiClient, initial: &Node) -> Result<Node, kube::Error> {
    let name = initial.metadata.name.clone().unwrap_or_default();
    crate::metrics::node_registration_attempt();
    let nodes: Api<Node> = Api::all(api.client().await);
    match nodes.create(&PostParams::default(), initial).await {
        Ok(n) => {
            crate::metrics::node_registered_new();
            return Ok(n);
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let nodes: Api<Node> = Api::all(api.client().await);
    let mut existing = nodes.get(&name).await?;
    info!(node = %name, "node was previously registered");
    if reconcile_existing(initial, &mut existing) {
        let patch = serde_json::json!({
            "metadata": {
                "labels": existing.metadata.labels,
                "annotations": existing.metadata.annotations,
            }
        });
        let nodes: Api<Node> = Api::all(api.client().await);
        existing = nodes
            .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await?;
    }
    Ok(existing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NodeConfig {
        NodeConfig {
            node_name: "n1".into(),
            hostname: "n1".into(),
            node_ip: "10.0.0.5".into(),
            max_pods: 110,
            kubelet_port: 10250,
            controller_attach_detach: true,
            num_cores: 2,
            memory_bytes: 4 << 30,
            ephemeral_storage_bytes: 100 << 30,
            local_storage_capacity_isolation: true,
            kubelet_version: "v1.34.0".into(),
            eviction_hard: [("memory.available", "100Mi"), ("nodefs.available", "10%")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn pods_per_core_caps_the_pods_capacity_as_upstream() {
        // Old code: podsPerCore was accepted unread.
        assert_eq!(pods_capacity(110, 0, 2), 110);
        assert_eq!(pods_capacity(110, 10, 2), 20);
        assert_eq!(pods_capacity(110, 100, 2), 110);
    }

    #[test]
    fn without_local_storage_capacity_isolation_no_ephemeral_storage_is_reported() {
        // Old code: ephemeral-storage was reported whatever the setting.
        let mut c = cfg();
        let (cap, alloc) = resources(&c);
        assert!(cap.contains_key("ephemeral-storage") && alloc.contains_key("ephemeral-storage"));
        c.local_storage_capacity_isolation = false;
        let (cap, alloc) = resources(&c);
        assert!(!cap.contains_key("ephemeral-storage"), "{cap:?}");
        assert!(!alloc.contains_key("ephemeral-storage"), "{alloc:?}");
        assert_eq!(node_facts(&c).ephemeral_milli, 0);
    }

    #[test]
    fn the_runtimes_features_reach_the_node_as_upstreams_setter_puts_them() {
        // Old code: status.features was never set, so a scheduler could not
        // tell a node that applies supplementalGroupsPolicy: Strict.
        let c = cfg();
        let mut obs = Observed::default();
        assert!(initial_node(&c, &obs, at(1))
            .status
            .unwrap()
            .features
            .is_none());
        obs.supplemental_groups_policy = Some(true);
        let s = initial_node(&c, &obs, at(1)).status.unwrap();
        assert_eq!(s.features.unwrap().supplemental_groups_policy, Some(true));
        // A runtime that reports no features leaves the Node's as they are.
        let fetched = NodeStatus {
            features: Some(k8s_openapi::api::core::v1::NodeFeatures {
                supplemental_groups_policy: Some(false),
            }),
            ..Default::default()
        };
        let kept = update_status(&c, &Observed::default(), &fetched, at(2));
        assert_eq!(kept.features, fetched.features);
        let set = update_status(&c, &obs, &fetched, at(2));
        assert_eq!(set.features.unwrap().supplemental_groups_policy, Some(true));
    }

    #[test]
    fn the_initial_node_has_upstreams_labels_resources_and_conditions() {
        let mut c = cfg();
        c.node_labels.insert("role".into(), "worker".into());
        c.kube_reserved.insert("cpu".into(), "100m".into());
        c.kube_reserved.insert("memory".into(), "256Mi".into());
        let obs = Observed {
            runtime_version: "containerd://1.7.24".into(),
            ..Default::default()
        };
        let n = initial_node(&c, &obs, at(100));
        let l = n.metadata.labels.as_ref().unwrap();
        assert_eq!(l[LABEL_HOSTNAME], "n1");
        assert_eq!(l[LABEL_OS], "linux");
        assert_eq!(l[LABEL_ARCH], go_arch());
        assert_eq!(l["role"], "worker");
        assert_eq!(
            n.metadata.annotations.as_ref().unwrap()[CONTROLLER_MANAGED_ATTACH],
            "true"
        );
        let s = n.status.unwrap();
        let cap = s.capacity.unwrap();
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "4Gi");
        assert_eq!(cap["pods"].0, "110");
        let alloc = s.allocatable.unwrap();
        assert_eq!(alloc["cpu"].0, "1900m");
        // 4Gi - 256Mi reserved - 100Mi eviction threshold.
        assert_eq!(alloc["memory"].0, format_binary((4 << 30) - (356 << 20)));
        // 10 % nodefs.available by default.
        assert_eq!(alloc["ephemeral-storage"].0, format_binary(90 << 30));
        let conds = s.conditions.unwrap();
        let kinds: Vec<_> = conds.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            kinds,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );
        assert_eq!(conds[3].reason.as_deref(), Some("KubeletReady"));
        assert_eq!(conds[3].message.as_deref(), Some(READY_MESSAGE));
        let info = s.node_info.unwrap();
        assert_eq!(info.container_runtime_version, "containerd://1.7.24");
        assert_eq!(info.operating_system, "linux");
        assert_eq!(
            s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
            10250
        );
        let addrs: Vec<_> = s
            .addresses
            .unwrap()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            addrs,
            [
                ("InternalIP".to_string(), "10.0.0.5".to_string()),
                ("Hostname".to_string(), "n1".to_string())
            ]
        );
    }

    #[test]
    fn volumes_in_use_are_the_kubelets_and_volumes_attached_the_controllers() {
        use k8s_openapi::api::core::v1::AttachedVolume;
        let c = cfg();
        let fetched = NodeStatus {
            volumes_attached: Some(vec![AttachedVolume {
                name: "kubernetes.io/csi/d^a".into(),
                device_path: String::new(),
            }]),
            volumes_in_use: Some(vec!["kubernetes.io/csi/d^old".into()]),
            ..Default::default()
        };
        // Not synced yet: the list on the Node is left as it is.
        let s = update_status(&c, &Observed::default(), &fetched, at(1));
        assert_eq!(s.volumes_in_use, fetched.volumes_in_use);
        let obs = Observed {
            volumes_in_use: Some(vec![
                "kubernetes.io/csi/d^a".into(),
                "kubernetes.io/csi/d^b".into(),
            ]),
            ..Default::default()
        };
        let s = update_status(&c, &obs, &fetched, at(1));
        assert_eq!(s.volumes_in_use, obs.volumes_in_use);
        assert_eq!(s.volumes_attached, fetched.volumes_attached);
        let p = patch::status_patch(&fetched, &s);
        assert_eq!(
            p["status"]["volumesInUse"],
            serde_json::json!(["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"])
        );
        assert!(p["status"].get("volumesAttached").is_none(), "{p}");
        // None in use any more: the field goes.
        let obs = Observed {
            volumes_in_use: Some(vec![]),
            ..Default::default()
        };
        let s = update_status(&c, &obs, &fetched, at(1));
        assert_eq!(s.volumes_in_use, None);
        assert!(status_changed(&fetched, &s));
        assert_eq!(
            patch::status_patch(&fetched, &s)["status"]["volumesInUse"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn pressure_conditions_carry_upstreams_reasons_and_messages() {
        // Old code: the three pressure conditions were always False.
        let obs = Observed {
            pressure: crate::eviction::Pressure {
                memory: true,
                disk: true,
                pid: true,
            },
            ..Default::default()
        };
        let s = node_status(&cfg(), &obs, None, at(1));
        let got: Vec<(String, String, String, String)> = s
            .conditions
            .unwrap()
            .into_iter()
            .take(3)
            .map(|c| (c.type_, c.status, c.reason.unwrap(), c.message.unwrap()))
            .collect();
        let want = [
            (
                "MemoryPressure",
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "DiskPressure",
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
            ),
            (
                "PIDPressure",
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        ]
        .map(|(t, r, m)| {
            (
                t.to_string(),
                "True".to_string(),
                r.to_string(),
                m.to_string(),
            )
        });
        assert_eq!(got, want);
    }

    #[test]
    fn not_ready_carries_the_aggregated_errors_and_transition_times_move_only_on_change() {
        let c = cfg();
        let ok = node_status(&c, &Observed::default(), None, at(100));
        let later = node_status(&c, &Observed::default(), Some(&ok), at(110));
        assert!(!status_changed(&ok, &later), "only heartbeats moved");
        let ready = |s: &NodeStatus| s.conditions.as_ref().unwrap()[3].clone();
        assert_eq!(ready(&later).last_transition_time, Some(at(100)));
        let bad = Observed {
            errors: vec![
                "container runtime is down".into(),
                "PLEG is not healthy".into(),
            ],
            ..Default::default()
        };
        let down = node_status(&c, &bad, Some(&later), at(120));
        assert!(status_changed(&later, &down));
        let r = ready(&down);
        assert_eq!(r.status, "False");
        assert_eq!(r.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(
            r.message.as_deref(),
            Some("[container runtime is down, PLEG is not healthy]")
        );
        assert_eq!(r.last_transition_time, Some(at(120)));
    }

    #[test]
    fn removed_or_changed_os_and_arch_labels_are_put_back_with_the_status() {
        // Old code restored them only at registration.
        let mut node = Node::default();
        let labels = |n: &Node| missing_required_labels(n);
        assert_eq!(
            labels(&node).keys().collect::<Vec<_>>(),
            [LABEL_ARCH, LABEL_OS]
        );
        node.metadata.labels = Some(BTreeMap::from([
            (LABEL_OS.to_string(), std::env::consts::OS.to_string()),
            (LABEL_ARCH.to_string(), "s390x-by-hand".to_string()),
            ("team".to_string(), "a".to_string()),
        ]));
        let fix = labels(&node);
        assert_eq!(
            fix,
            BTreeMap::from([(LABEL_ARCH.to_string(), go_arch().to_string())])
        );
        let st = NodeStatus::default();
        let body = node_patch(&st, &st, fix);
        assert_eq!(
            body,
            serde_json::json!({"metadata": {"labels": {LABEL_ARCH: go_arch()}}}),
            "only the label, merged into the others"
        );
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_ARCH.into(), go_arch().into());
        assert!(labels(&node).is_empty());
    }

    #[test]
    fn the_fast_path_sends_ready_once_the_node_would_be_ready_and_stops_when_it_is() {
        let c = cfg();
        let healthy = Observed::default();
        let sick = Observed {
            errors: vec!["container runtime is down".into()],
            ..Default::default()
        };
        let mut node = Node {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([
                    (LABEL_OS.to_string(), std::env::consts::OS.to_string()),
                    (LABEL_ARCH.to_string(), go_arch().to_string()),
                ])),
                ..Default::default()
            },
            status: Some(node_status(&c, &sick, None, at(100))),
            ..Default::default()
        };
        let decide = |n: Option<&Node>, o: &Observed| fast_decision(&c, n, o);
        assert!(
            matches!(decide(None, &healthy), Err(Fast::Again)),
            "no Node yet"
        );
        assert!(
            matches!(decide(Some(&node), &sick), Ok(None)),
            "still NotReady"
        );
        let (before, body) = decide(Some(&node), &healthy)
            .ok()
            .flatten()
            .expect("a patch");
        assert_eq!(before, node.status.clone().unwrap());
        let ready = body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .expect("Ready in the patch");
        assert_eq!(
            (ready["status"].as_str(), ready["reason"].as_str()),
            (Some("True"), Some("KubeletReady"))
        );
        node.status = Some(node_status(&c, &healthy, None, at(101)));
        assert!(
            matches!(decide(Some(&node), &healthy), Err(Fast::Done)),
            "Ready: over"
        );
        node.status.as_mut().unwrap().conditions = None;
        assert!(
            matches!(decide(Some(&node), &healthy), Err(Fast::Again)),
            "no Ready condition"
        );
    }

    #[test]
    fn the_update_keeps_what_others_set_and_compares_against_the_api() {
        let c = cfg();
        let obs = Observed::default();
        // The Node as the API server has it: the kubelet's last status, a
        // CNI's NetworkUnavailable, an extended resource, and Ready turned
        // Unknown by the node lifecycle controller.
        let mut api = node_status(&c, &obs, None, at(100));
        let network = NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("RouteCreated".into()),
            message: Some("route created".into()),
            last_heartbeat_time: Some(at(50)),
            last_transition_time: Some(at(50)),
        };
        let conds = api.conditions.as_mut().unwrap();
        conds.insert(0, network.clone());
        conds[4].status = "Unknown".into();
        conds[4].reason = Some("NodeStatusUnknown".into());
        conds[4].last_transition_time = Some(at(105));
        let dongle = Quantity("4".into());
        for m in [api.capacity.as_mut(), api.allocatable.as_mut()] {
            m.unwrap()
                .insert("example.com/dongle".into(), dongle.clone());
        }
        api.node_info.as_mut().unwrap().kube_proxy_version = "v1.33.0".into();

        let next = update_status(&c, &obs, &api, at(110));
        let conds = next.conditions.as_ref().unwrap();
        assert_eq!(conds[0], network, "the foreign condition is untouched");
        let kinds: Vec<_> = conds.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "NetworkUnavailable",
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure",
                "Ready"
            ]
        );
        // Ready moved from the API's Unknown: a transition now; the others
        // keep their transition times.
        assert_eq!(conds[4].status, "True");
        assert_eq!(conds[4].last_transition_time, Some(at(110)));
        assert_eq!(conds[1].last_transition_time, Some(at(100)));
        assert_eq!(conds[1].last_heartbeat_time, Some(at(110)));
        assert_eq!(
            next.capacity.as_ref().unwrap()["example.com/dongle"],
            dongle
        );
        assert_eq!(
            next.allocatable.as_ref().unwrap()["example.com/dongle"],
            dongle
        );
        assert_eq!(
            next.node_info.as_ref().unwrap().kube_proxy_version,
            "v1.33.0"
        );
        assert!(status_changed(&api, &next));

        // The patch carries the kubelet's conditions, none of the rest.
        let p = patch::status_patch(&api, &next);
        let sent: Vec<_> = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            sent,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );
        assert_eq!(p["status"]["conditions"][3]["status"], "True");
        assert_eq!(p["status"]["conditions"][0].get("status"), None);
        for f in ["capacity", "allocatable", "nodeInfo", "addresses", "images"] {
            assert!(p["status"].get(f).is_none(), "{f}: {p}");
        }

        // Ten seconds on with nothing new: only heartbeats differ.
        let later = update_status(&c, &obs, &next, at(120));
        assert!(!status_changed(&next, &later));
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_failures_are_logged_once_a_period_with_the_count_held_back() {
        let mut t = Throttle::new(Duration::from_secs(60));
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(t.allow(), Some(2));
        t.reset();
        assert_eq!(t.allow(), Some(0), "a success starts afresh");
    }

    #[test]
    fn extended_resources_are_told_from_native_ones() {
        assert!(is_extended_resource("example.com/dongle"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("kubernetes.io/foo"));
        assert!(!is_extended_resource("requests.example.com/dongle"));
    }

    #[test]
    fn an_existing_node_gets_only_the_labels_the_kubelet_owns() {
        let initial = initial_node(&cfg(), &Observed::default(), at(1));
        let mut existing = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(
                    [
                        ("team".to_string(), "a".to_string()),
                        (LABEL_HOSTNAME.to_string(), "old".to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(reconcile_existing(&initial, &mut existing));
        let l = existing.metadata.labels.as_ref().unwrap();
        assert_eq!(l["team"], "a", "labels others set are kept");
        assert_eq!(l[LABEL_HOSTNAME], "n1");
        assert!(!reconcile_existing(&initial, &mut existing), "idempotent");
    }
}
