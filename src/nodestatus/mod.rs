//! The Node object: registration, status and the heartbeat Lease (upstream
//! `kubelet_node_status.go`, `nodestatus/setters.go` and `nodelease`).
//!
//! Registration creates the Node (labels, taints, addresses, capacity,
//! allocatable, nodeInfo); an existing Node of the same name keeps what
//! others set and gets only the default labels and the attach-detach
//! annotation the kubelet owns. Status is recomputed every
//! `nodeStatusUpdateFrequency` and patched only when it changed (ignoring
//! heartbeat times) or `nodeStatusReportFrequency` passed; liveness comes
//! from the Lease, renewed every quarter of its duration.

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

/// Upstream's default evictionHard when none is configured.
fn eviction_defaults(cfg: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    if !cfg.is_empty() {
        return cfg.clone();
    }
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("imagefs.available", "15%"),
        ("nodefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
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
    let evict = eviction_defaults(&cfg.eviction_hard);
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
    cap.insert(
        "ephemeral-storage".to_string(),
        q(format_binary(eph / 1000)),
    );
    cap.insert("pods".to_string(), q(cfg.max_pods.to_string()));
    cap.insert("hugepages-1Gi".to_string(), q("0".into()));
    cap.insert("hugepages-2Mi".to_string(), q("0".into()));
    let mut alloc = cap.clone();
    let cpu_a = (cpu - reserved("cpu", cpu)).max(0);
    alloc.insert("cpu".to_string(), q(format_decimal_milli(cpu_a)));
    let mem_a = (mem - reserved("memory", mem) - threshold("memory.available", mem)).max(0);
    alloc.insert("memory".to_string(), q(format_binary(mem_a / 1000)));
    let eph_a =
        (eph - reserved("ephemeral-storage", eph) - threshold("nodefs.available", eph)).max(0);
    alloc.insert(
        "ephemeral-storage".to_string(),
        q(format_binary(eph_a / 1000)),
    );
    (cap, alloc)
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
    let conditions = vec![
        condition(
            "MemoryPressure",
            false,
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
            previous,
            &now,
        ),
        condition(
            "DiskPressure",
            false,
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
            previous,
            &now,
        ),
        condition(
            "PIDPressure",
            false,
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
            previous,
            &now,
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
pub type Observe = Arc<dyn Fn() -> futures::future::BoxFuture<'static, Observed> + Send + Sync>;

/// Registers the Node (retrying 100 ms doubling to 7 s, as upstream), then
/// keeps its status, until `token` is cancelled. The API server may be
/// absent or go away at any time: every failure is logged and retried, and
/// nothing else waits for this loop.
pub async fn run(
    api: ApiClient,
    cfg: NodeConfig,
    observe: Observe,
    registered: tokio::sync::watch::Sender<Option<String>>,
    token: CancellationToken,
) {
    let mut step = Duration::from_millis(100);
    let node = loop {
        let obs = observe().await;
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
    let mut last_sent = node.status.clone().unwrap_or_default();
    let mut last_events = BTreeMap::new();
    record_transitions(&cfg.node_name, &mut last_events, &last_sent);
    let mut last_report: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(cfg.update_frequency.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let obs = observe().await;
        let status = node_status(&cfg, &obs, Some(&last_sent), now());
        record_transitions(&cfg.node_name, &mut last_events, &status);
        let due = last_report.is_none_or(|t| t.elapsed() >= cfg.report_frequency);
        if !due && !status_changed(&last_sent, &status) {
            debug!("node status unchanged; not sent");
            continue;
        }
        match patch_status(&api, &cfg.node_name, &status).await {
            Ok(node) => {
                observe_node(&cfg, &node);
                last_sent = status;
                last_report = Some(tokio::time::Instant::now());
            }
            Err(e) => {
                warn!(node = %cfg.node_name, error = %e, "error updating node status, will retry")
            }
        }
    }
}

/// Upstream's node events on condition changes ("Node n1 status is now:
/// NodeReady"), recorded when a condition first shows or changes.
fn record_transitions(node: &str, last: &mut BTreeMap<String, String>, status: &NodeStatus) {
    for c in status.conditions.iter().flatten() {
        if last.get(&c.type_) == Some(&c.status) {
            continue;
        }
        last.insert(c.type_.clone(), c.status.clone());
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
    let nodes: Api<Node> = Api::all(api.client().await);
    match nodes.create(&PostParams::default(), initial).await {
        Ok(n) => return Ok(n),
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

async fn patch_status(
    api: &ApiClient,
    name: &str,
    status: &NodeStatus,
) -> Result<Node, kube::Error> {
    // A strategic merge patch of the whole status: conditions and addresses
    // merge by type, so conditions other components own are kept.
    let patch = serde_json::json!({ "status": status });
    let nodes: Api<Node> = Api::all(api.client().await);
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
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
            kubelet_version: "v1.34.0".into(),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
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
