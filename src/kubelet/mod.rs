//! Assembles the kubelet from its parts and runs it: config sources, pod
//! manager, PLEG, pod workers, syncLoop and servers, each a task under one
//! cancellation token (upstream `kubelet.go` NewMainKubelet + Run).

pub mod iptables;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::KubeletConfiguration;
use crate::cri::client::RemoteRuntime;
use crate::cri::{ImageService, RuntimeService};
use crate::images::ImageManager;
use crate::kuberuntime::{RuntimeManager, RuntimeOptions};
use crate::pod::PodManager;
use crate::podworkers::{Deps, PodWorkers, WorkQueue};
use crate::server::{self, machine::MachineInfo, ServerState};
use crate::source::static_pod::Takeover;
use crate::source::{self, PodConfig};
use crate::status::StatusManager;
use crate::syncloop::{SyncLoop, SyncLoopHealth};
use crate::{pleg, server::ListenError};

/// The Kubernetes version rkubelet reports, as `kubelet --version` does.
pub const KUBERNETES_VERSION: &str = "v1.34.0";

#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error(transparent)]
    Runtime(#[from] crate::cri::CriError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error("{0}")]
    Source(String),
    #[error("invalid address {0:?}")]
    Address(String),
    #[error(transparent)]
    ApiClient(#[from] crate::apiclient::ApiClientError),
    #[error(transparent)]
    Tls(#[from] crate::server::https::TlsError),
    #[error(transparent)]
    Auth(#[from] crate::server::auth::AuthError),
    #[error("failed to validate nodeIP: {0}")]
    NodeIp(String),
    #[error("failed to initialize container log manager: {0}")]
    LogManager(String),
    /// Upstream exits with "Failed to register CRI auth plugins".
    #[error("failed to register CRI auth plugins: {0}")]
    CredentialProviders(#[from] crate::images::credentialprovider::ConfigError),
    #[error(transparent)]
    Eviction(#[from] crate::eviction::EvictionError),
    #[error(transparent)]
    Sysctl(#[from] crate::lifecycle::sysctl::SysctlError),
    /// Upstream exits with "Failed to start ContainerManager".
    #[error("failed to start ContainerManager: {0}")]
    ContainerManager(String),
    /// Upstream's NewContainerManager refuses a node with swap on.
    #[error("{0}")]
    Swap(String),
    #[error(transparent)]
    CpuManager(#[from] crate::cm::cpumanager::CpuManagerError),
    /// Upstream's getReservedCPUs errors.
    #[error("{0}")]
    ReservedCpus(String),
    #[error("cannot create directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the kubelet needs beyond its configuration file.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    pub config: KubeletConfiguration,
    pub node_name: String,
    pub node_ip: Option<String>,
    pub root_dir: PathBuf,
    /// Cluster mode when set: the API server's kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// `--node-labels`, applied when the Node is registered.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// `--bootstrap-kubeconfig`: TLS bootstrap when `kubeconfig` is
    /// missing or its client certificate expired.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
    /// `--seccomp-default`, ORed with the config's `seccompDefault` as
    /// upstream does (the flag is not a configuration field).
    pub seccomp_default: bool,
    /// `--experimental-allocatable-ignore-eviction`: hard eviction
    /// thresholds are not subtracted from node allocatable.
    pub allocatable_ignore_eviction: bool,
    /// The deprecated container GC flags (`--minimum-container-ttl-duration`,
    /// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
    pub container_gc: crate::kuberuntime::gc::Policy,
}

/// The node name upstream uses: --hostname-override or the hostname, lowercased.
pub fn node_name(hostname_override: Option<&str>) -> String {
    let raw = match hostname_override.filter(|h| !h.trim().is_empty()) {
        Some(h) => h.trim().to_string(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_else(|_| "localhost".into()),
    };
    raw.trim().to_lowercase()
}

/// The address a UDP socket would send from towards a documentation
/// address: the host's primary IP. connect() on UDP sends no packet.
pub fn detect_node_ip() -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_unspecified() && !ip.is_loopback()).then(|| ip.to_string())
}

/// `maxOpenFiles` as both limits of RLIMIT_NOFILE, as upstream's
/// rlimit.SetNumFiles; raising the hard limit needs CAP_SYS_RESOURCE, and
/// a refusal is logged and the kubelet carries on, as upstream.
fn set_open_file_limit(n: i64) {
    let n = n.max(0) as libc::rlim_t;
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::error!(error = %e, max_open_files = n, "Failed to set rlimit on max file handles");
    }
}

/// Upstream sets the kubelet's own oom_score_adj (-999); without
/// CAP_SYS_RESOURCE that fails, which is logged and ignored, as upstream does.
fn set_own_oom_score_adj(value: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        warn!(value, error = %e, "failed to set rkubelet's oom_score_adj; continuing");
    }
}

fn addr(ip: &str, port: i32) -> Result<SocketAddr, KubeletError> {
    let ip: IpAddr = if ip.is_empty() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        ip.parse().map_err(|_| KubeletError::Address(ip.into()))?
    };
    Ok(SocketAddr::new(ip, port as u16))
}

fn mkdir(path: &std::path::Path) -> Result<(), KubeletError> {
    std::fs::create_dir_all(path).map_err(|source| KubeletError::Dir {
        path: path.into(),
        source,
    })
}

/// Upstream's gate for taking the cgroup driver from the runtime (beta and on
/// by default since 1.28).
const CGROUP_DRIVER_FROM_CRI_GATE: &str = "KubeletCgroupDriverFromCRI";

/// The cgroup driver the runtime reports through CRI RuntimeConfig, else
/// `configured`, as upstream's getCgroupDriverFromCRI: three tries, `pause`
/// apart, for a runtime still starting; a runtime without RuntimeConfig
/// keeps the configured driver and sets `kubelet_cri_losing_support`.
/// Upstream exits when the runtime keeps failing; rkubelet keeps the
/// configured driver and goes on, as it does for a runtime that is down.
async fn cgroup_driver_from_runtime(
    runtime: &dyn RuntimeService,
    configured: String,
    pause: Duration,
) -> String {
    use crate::cri::v1::CgroupDriver;
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(pause).await;
        }
        match runtime.runtime_config().await {
            Ok(Some(d)) => {
                let driver = match d {
                    CgroupDriver::Systemd => "systemd",
                    CgroupDriver::Cgroupfs => "cgroupfs",
                };
                info!(
                    cgroup_driver = driver,
                    "using cgroup driver setting received from the CRI runtime"
                );
                return driver.to_string();
            }
            Ok(None) => return configured,
            Err(e) if e.is_unimplemented() => {
                info!(cgroup_driver = %configured, "CRI implementation should be updated to support RuntimeConfig; falling back to the cgroupDriver from the kubelet config");
                crate::metrics::cri_losing_support("1.36.0");
                return configured;
            }
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        warn!(error = %e, cgroup_driver = %configured, "could not get the cgroup driver from the CRI runtime; using the configured one");
    }
    configured
}

/// Runs until `token` is cancelled. Running pods are left running on exit.
pub async fn run(mut opts: KubeletOptions, token: CancellationToken) -> Result<(), KubeletError> {
    // Upstream's NewContainerManager, before the runtime is asked anything.
    let swap_on = crate::blocking::try_run(
        "read /proc/swaps".into(),
        Duration::from_secs(10),
        crate::cm::node::swap_on,
    )
    .await
    .map_err(|e| KubeletError::Swap(format!("failed to determine if swap is on: {e}")))?;
    if swap_on && opts.config.fail_swap_on {
        return Err(KubeletError::Swap(crate::cm::node::SWAP_ON_ERROR.into()));
    }
    crate::cm::node::note_swap_on(swap_on);
    // Decided now, off the async threads (it may try a mount); the Node's
    // warning and memory-backed volumes use it.
    let volumes_on_disk = crate::blocking::run(
        "tmpfs noswap".into(),
        Duration::from_secs(10),
        crate::cm::node::memory_backed_volumes_on_disk,
    )
    .await
    .unwrap_or(false);
    if volumes_on_disk {
        warn!("{}", crate::cm::node::MEMORY_BACKED_VOLUMES_ON_DISK);
    }
    let remote = Arc::new(
        RemoteRuntime::connect_lazy(
            &opts.config.container_runtime_endpoint,
            opts.config.runtime_request_timeout.0,
        )?
        .with_image_endpoint(&opts.config.image_service_endpoint)?,
    );
    if opts.config.feature_gate(CGROUP_DRIVER_FROM_CRI_GATE) {
        let configured = std::mem::take(&mut opts.config.cgroup_driver);
        opts.config.cgroup_driver =
            cgroup_driver_from_runtime(remote.as_ref(), configured, Duration::from_secs(2)).await;
    }
    // Upstream's run(): named reserved CPUs replace the cpu reservations
    // (systemReserved.cpu becomes their count, kubeReserved.cpu goes),
    // whatever the CPU manager policy, so the node allocatable follows.
    let topology = crate::cm::cpumanager::discover_topology().await?;
    let reserved_cpus =
        crate::cm::cpumanager::reserved_cpus(&opts.config.reserved_system_cpus, &topology)
            .map_err(KubeletError::ReservedCpus)?;
    if !reserved_cpus.is_empty() {
        info!(reserved_cpus = %reserved_cpus, "Option --reserved-cpus is specified, it will overwrite the cpu setting in KubeReserved and SystemReserved");
        opts.config.kube_reserved.remove("cpu");
        opts.config
            .system_reserved
            .insert("cpu".into(), reserved_cpus.len().to_string());
    }
    let cfg = &opts.config;
    // Before anything starts, as upstream's NewMainKubelet fails.
    let rotation =
        crate::logs::rotation::Policy::from_config(cfg).map_err(KubeletError::LogManager)?;
    set_own_oom_score_adj(cfg.oom_score_adj);
    crate::cm::set_cfs(crate::cm::Cfs::from_config(cfg));
    set_open_file_limit(cfg.max_open_files);
    let logs_dir = PathBuf::from(if cfg.pod_logs_dir.is_empty() {
        "/var/log/pods"
    } else {
        &cfg.pod_logs_dir
    });
    mkdir(&opts.root_dir)?;
    mkdir(&opts.root_dir.join("pods"))?;
    if cfg.feature_gate("ContainerCheckpoint") {
        // Checkpoints hold container memory: owner only, as upstream.
        let dir = opts.root_dir.join(server::checkpoint::CHECKPOINTS_DIR);
        mkdir(&dir)?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    mkdir(&logs_dir)?;

    match remote.version().await {
        Ok(v) => {
            crate::status::generate::set_runtime_name(&v.runtime_name);
            info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version, "connected to container runtime")
        }
        Err(e) => {
            warn!(endpoint = %cfg.container_runtime_endpoint, error = %e, "container runtime not answering yet; will keep retrying")
        }
    }
    let runtime: Arc<dyn RuntimeService> = remote.clone();
    let images: Arc<dyn ImageService> = remote;
    let images_for_node = images.clone();
    let images_for_server = images.clone();
    let images_for_gc = images.clone();
    let node_ip = opts
        .node_ip
        .clone()
        .or_else(detect_node_ip)
        .unwrap_or_default();
    let machine = Arc::new(MachineInfo::read());
    let memory_policy = {
        let behavior = cfg.memory_swap.swap_behavior.clone();
        let single = cfg.single_process_oom_kill;
        let capacity = machine.memory_capacity as i64;
        crate::blocking::run("memory policy".into(), Duration::from_secs(10), move || {
            crate::cm::node::MemoryPolicy::detect(&behavior, single, capacity)
        })
        .await
        .unwrap_or_default()
    };
    crate::metrics::detect_cgroup_version();
    if crate::metrics::cgroup_version() == 1 {
        info!(
            error = crate::cm::CGROUP_V1_WARNING,
            "Warning: cgroup check"
        );
    }
    crate::metrics::apply_feature_gates(&opts.config);
    crate::metrics::node_startup_kubelet_started();
    let machine_for_node = machine.clone();

    let node_cfg = node_config(&opts, &node_ip, &machine_for_node);
    // Upstream's ContainerLogsDir, where log collectors read.
    let container_logs_dir = PathBuf::from("/var/log/containers");
    let rt_opts = RuntimeOptions {
        root_dir: opts.root_dir.clone(),
        pod_logs_dir: logs_dir.clone(),
        container_logs_dir: container_logs_dir.clone(),
        cgroup_root: cfg.cgroup_root.clone(),
        systemd_cgroups: cfg.cgroup_driver == "systemd",
        cluster_dns: cfg.cluster_dns.clone(),
        cluster_domain: cfg.cluster_domain.clone(),
        resolv_conf: PathBuf::from(&cfg.resolv_conf),
        node_ip: node_ip.clone(),
        memory_capacity: machine.memory_capacity as i64,
        memory_policy,
        allocatable: crate::kuberuntime::Allocatable::of(&node_cfg.facts.read()),
        runtime_handler: String::new(),
        seccomp_default: cfg.seccomp_default || opts.seccomp_default,
        track_observed_generation: cfg.feature_gate("PodObservedGenerationTracking"),
    };
    let max_parallel = cfg.max_parallel_image_pulls.map(|n| n.max(1) as usize);
    let credential_providers =
        crate::images::credentialprovider::CredentialProviders::from_flags(cfg)?;
    let image_manager = ImageManager::new(images, cfg.serialize_image_pulls, max_parallel)
        .with_node_credentials(crate::images::keyring::NodeCredentials::new(&opts.root_dir))
        .with_credential_providers(credential_providers.clone())
        .with_pull_qps(cfg.registry_pull_qps, cfg.registry_burst);
    // Cluster mode fills this once its API client exists; :10250's webhook
    // authentication and authorization and the object manager use it.
    let api_slot = Arc::new(std::sync::OnceLock::new());
    // Manager and cluster-mode tasks, awaited at shutdown.
    let cluster_tasks = tokio_util::task::TaskTracker::new();
    let objects = crate::objects::ObjectManager::new(
        api_slot.clone(),
        cluster_tasks.clone(),
        token.child_token(),
    )
    .with_strategy(
        crate::objects::ChangeDetection::parse(
            &cfg.config_map_and_secret_change_detection_strategy,
        ),
        cfg.sync_frequency.0,
    )
    .with_cluster_trust_bundle_projection(
        cfg.feature_gate(crate::objects::trustbundle::FEATURE_GATE),
    )
    .with_pod_certificate_request(cfg.feature_gate(crate::objects::podcert::FEATURE_GATE));
    // Service-account-token mode reads ServiceAccounts and requests
    // tokens through the object manager (its client comes in cluster mode).
    if let Some(p) = &credential_providers {
        p.set_service_accounts(Arc::new(objects.clone()));
    }
    // Resizes waiting for room, as the last run left them (a small file
    // under the root directory; read off the async threads).
    let root = opts.root_dir.clone();
    let allocation = crate::blocking::run(
        "allocation checkpoint".into(),
        Duration::from_secs(10),
        move || crate::allocation::AllocationManager::load(&root),
    )
    .await
    .unwrap_or_default();
    // The runtime's last Status answer: polled below, read by the pod
    // workers (the runtime's handlers and their user-namespace support).
    let runtime_state = crate::runtimestate::RuntimeState::default();
    // The node allocatable, QoS and pod cgroups.
    let cgroups =
        start_container_manager(cfg, &opts.node_name, &machine, &cluster_tasks, &token).await?;
    // Exclusive CPUs (cpuManagerPolicy), its state file under the root.
    let cpu_manager = start_cpu_manager(
        cfg,
        &opts.root_dir,
        topology,
        reserved_cpus,
        &cluster_tasks,
        &token,
    )
    .await?;
    let manager = Arc::new({
        let (initial, max) = crate::kuberuntime::backoff::crash_loop_backoff(cfg);
        let mut m = RuntimeManager::new(runtime.clone(), image_manager, rt_opts)
            .with_objects(objects.clone())
            .with_crash_loop_backoff(initial, max);
        m.allocation = allocation;
        m.runtime_state = runtime_state.clone();
        m.cgroups = cgroups.clone();
        m.cpu = cpu_manager.clone();
        m.container_gc = opts.container_gc;
        m
    });
    manager.volumes.start(&cluster_tasks, token.child_token());
    // Pod cgroups the runtime leaves behind, removed at housekeeping.
    let pod_cgroups = crate::cm::podcgroups::Cleaner::for_host(
        cfg.cgroup_driver == "systemd",
        &cfg.cgroup_root,
        opts.root_dir.clone(),
        cluster_tasks.clone(),
        token.child_token(),
    )
    .await;
    // CSI drivers register through sockets in <root-dir>/plugins_registry
    // (upstream's plugin manager).
    manager.volumes.csi_drivers().set_node_name(&opts.node_name);
    if opts.kubeconfig.is_some() {
        manager.volumes.csi_drivers().set_api(api_slot.clone());
    }
    // Upstream's kubelet never attaches CSI volumes itself: with this off,
    // attachable CSI volumes fail with its "attaching volumes from the
    // kubelet is not supported".
    manager
        .volumes
        .csi_drivers()
        .set_controller_attach_detach(cfg.enable_controller_attach_detach);
    if !cfg.enable_controller_attach_detach {
        warn!("enableControllerAttachDetach is false: CSI volumes whose driver requires attach will not be mounted (upstream's CSI plugin does not attach from the kubelet)");
    }
    crate::volume::csi::registration::spawn(
        opts.root_dir
            .join(crate::volume::csi::registration::REGISTRY_DIR),
        manager.volumes.csi_drivers().clone(),
        &cluster_tasks,
        token.child_token(),
    );
    let gc_manager = manager.clone();

    let (runtime_state, runtime_state_task) = crate::runtimestate::spawn(
        runtime_state,
        runtime.clone(),
        crate::runtimestate::POLL_PERIOD,
        token.child_token(),
    );
    // Upstream passes the configured podCIDR (standalone mode) to the
    // runtime at start; in cluster mode the Node's spec.podCIDRs follow.
    if let Err(e) = runtime_state
        .update_pod_cidr(runtime.as_ref(), &cfg.pod_cidr)
        .await
    {
        warn!(error = %e, "pod CIDR update failed");
    }
    let pods = PodManager::new().with_objects(objects.clone());
    let status = StatusManager::new();
    let queue = Arc::new(WorkQueue::default());
    let (probe_tx, probe_rx) = mpsc::channel(1000);
    let probes = crate::prober::ProbeManager::new(runtime.clone(), probe_tx, token.child_token());
    let workers = PodWorkers::new(
        Deps {
            runtime: manager.clone(),
            status: status.clone(),
            probes: probes.clone(),
            queue: queue.clone(),
            resync: cfg.sync_frequency.0,
            network_error: Some({
                let rs = runtime_state.clone();
                Arc::new(move || rs.network_error())
            }),
        },
        token.child_token(),
    );
    cgroups.set_active_pods(active_pods(pods.clone(), workers.clone()));
    cpu_manager.set_active_pods(cpu_active_pods(
        pods.clone(),
        workers.clone(),
        status.clone(),
    ));
    {
        let status = status.clone();
        cpu_manager.spawn_reconcile(
            runtime.clone(),
            Box::new(move |uid| status.get(uid)),
            &cluster_tasks,
            token.child_token(),
        );
    }

    let (pleg_tx, pleg_rx) = mpsc::channel(pleg::CHANNEL_CAPACITY);
    pleg::evented::spawn(runtime.clone(), pleg_tx.clone(), token.child_token());
    let pleg = pleg::spawn(
        runtime.clone(),
        pleg::RELIST_PERIOD,
        pleg_tx,
        token.child_token(),
    );
    let health = SyncLoopHealth::new(cfg.sync_frequency.0);

    let api_health = crate::apiclient::ApiHealth::default();
    let state = ServerState {
        pods: pods.clone(),
        status: status.clone(),
        pleg: pleg.clone(),
        syncloop: health.clone(),
        machine,
        probes,
        runtime_state: runtime_state.clone(),
        api: opts.kubeconfig.as_ref().map(|_| api_health.clone()),
        runtime: runtime.clone(),
        images: images_for_server,
        config: Arc::new(cfg.clone()),
        node_name: opts.node_name.clone(),
        root_dir: opts.root_dir.clone(),
        pod_logs_dir: logs_dir.clone(),
        debug: Some(server::debug::DebugSources {
            workers: workers.clone(),
            queue: queue.clone(),
            runtime: manager.clone(),
        }),
        stats: crate::stats::StatsProvider::with_oom_watcher(&opts.node_name),
        streams: server::Streams::new(token.child_token()),
        slis: Default::default(),
    };
    // cAdvisor reads the machine's facts and lists its file systems when
    // the kubelet starts (off the async threads: /proc and /sys reads).
    {
        let stats = state.stats.clone();
        if let Err(e) =
            crate::blocking::run("stats/machine".into(), Duration::from_secs(10), move || {
                crate::stats::procfs::init_machine_facts();
                crate::metrics::init_start_time();
                stats.list_file_systems();
            })
            .await
        {
            tracing::warn!(error = %e, "reading machine facts and file systems at start");
        }
    }
    let streams = state.streams.clone();
    if cfg.make_iptables_util_chains {
        let families: Vec<Box<dyn iptables::Runner>> = vec![
            Box::new(iptables::Binary { ipv6: false }),
            Box::new(iptables::Binary { ipv6: true }),
        ];
        cluster_tasks.spawn(tracing::Instrument::instrument(
            iptables::run(families, iptables::MONITOR_INTERVAL, token.child_token()),
            tracing::info_span!("iptables"),
        ));
    }
    // Snapshots for steady scrapers (Prometheus, metrics-server) collected
    // just before their scrapes are due.
    cluster_tasks.spawn(tracing::Instrument::instrument(
        crate::stats::collect_ahead(state.clone(), token.child_token()),
        tracing::info_span!("stats-ahead"),
    ));
    {
        // Pod volume usage every volumeStatsAggPeriod (upstream's
        // fsResourceAnalyzer), for /stats/summary and /metrics.
        let (cache, p, v, vc) = (
            state.stats.volume_stats().clone(),
            pods.clone(),
            manager.volumes.clone(),
            manager.volumes.clone(),
        );
        let csi = crate::stats::volumes::CsiVolumes {
            registry: vc.csi_drivers().clone(),
            volumes: Box::new(move |uid| vc.csi_volumes(uid)),
            // Alpha, off by default (kube_features.go).
            health: cfg.feature_gate("CSIVolumeHealth"),
        };
        let period = cfg.volume_stats_agg_period.0;
        let t = token.child_token();
        cluster_tasks.spawn(tracing::Instrument::instrument(
            crate::stats::volumes::run(
                cache,
                move || p.pods(),
                move |uid| v.measured_volumes(uid),
                Some(csi),
                period,
                t,
            ),
            tracing::info_span!("volume-stats"),
        ));
    }
    let mut servers = Vec::new();
    if cfg.healthz_port > 0 {
        let a = addr(&cfg.healthz_bind_address, cfg.healthz_port)?;
        servers.push(
            server::serve(
                a,
                server::healthz_router(state.clone()),
                None,
                token.child_token(),
            )
            .await?,
        );
    }
    if cfg.read_only_port > 0 {
        let a = addr(&cfg.address, cfg.read_only_port)?;
        servers.push(
            server::serve(
                a,
                server::read_only_router(state.clone()),
                None,
                token.child_token(),
            )
            .await?,
        );
    }
    if cfg.enable_server && cfg.port > 0 {
        let (tls, auth, reload) = serving_tls(&opts, &node_cfg, api_slot.clone(), &token).await?;
        servers.push(reload);
        let a = addr(&cfg.address, cfg.port)?;
        let router = server::api_router(state.clone(), auth);
        servers.push(server::serve(a, router, Some(tls), token.child_token()).await?);
    }

    // Serving (healthz, read-only, :10250): ready as far as systemd is concerned.
    crate::sdnotify::ready();
    let (updates_tx, updates_rx) = mpsc::channel(100);
    let pod_config = PodConfig::new(updates_tx);
    let mut expected: Vec<&'static str> = Vec::new();
    if !cfg.static_pod_path.is_empty() {
        expected.push(source::FILE_SOURCE);
        source::file::spawn_file_source(
            PathBuf::from(&cfg.static_pod_path),
            opts.node_name.clone(),
            cfg.file_check_frequency.0,
            pod_config.channel(source::FILE_SOURCE),
            token.child_token(),
            running_static_pods(runtime.as_ref()).await,
        );
    }
    let mut sources = Vec::new();
    if !cfg.static_pod_url.is_empty() {
        expected.push(source::HTTP_SOURCE);
        sources.push(source::http::spawn_http_source(
            cfg.static_pod_url.clone(),
            cfg.static_pod_url_header.clone(),
            opts.node_name.clone(),
            cfg.http_check_frequency.0,
            pod_config.channel(source::HTTP_SOURCE),
            token.child_token(),
        ));
    }
    if let Some(policy) = rotation {
        sources.push(tokio::spawn(tracing::Instrument::instrument(
            crate::logs::rotation::run(runtime.clone(), policy, token.child_token()),
            tracing::info_span!("log-rotation"),
        )));
    }
    // Log directories and links of pods that are gone, removed at
    // housekeeping once a minute.
    let pod_logs = crate::logs::podlogs::Cleaner::new(
        logs_dir.clone(),
        container_logs_dir,
        runtime.clone(),
        cluster_tasks.clone(),
        token.child_token(),
    )
    .with_first({
        // An evicted pod's containers and sandboxes go though it stays in
        // config, as upstream's container GC removes them.
        // Then the policy's dead containers (upstream's minute
        // GarbageCollect).
        let (w, m) = (workers.clone(), manager.clone());
        Arc::new(move || {
            let (w, m) = (w.clone(), m.clone());
            Box::pin(async move {
                if let Err(e) = remove_finished_pods_containers(&w, &m, true).await {
                    tracing::info!(error = %e, "failed to remove an evicted pod's containers");
                }
                if let Err(e) = m.collect_dead_containers(m.container_gc).await {
                    tracing::warn!(error = %e, "container garbage collection failed");
                }
            })
        })
    });
    let image_gc = Arc::new(crate::images::gc::ImageGc::new(
        runtime.clone(),
        images_for_gc,
        crate::images::gc::Policy {
            high_threshold_percent: cfg.image_gc_high_threshold_percent,
            low_threshold_percent: cfg.image_gc_low_threshold_percent,
            min_age: cfg.image_minimum_gc_age.0,
            max_age: if cfg.feature_gate("ImageMaximumGCAge") {
                cfg.image_maximum_gc_age.0
            } else {
                Duration::ZERO
            },
        },
        {
            let s = state.clone();
            Box::new(move || {
                let s = s.clone();
                Box::pin(async move { crate::stats::image_fs_figures(&s).await })
            })
        },
        opts.node_name.clone(),
    ));
    cluster_tasks.spawn(tracing::Instrument::instrument(
        image_gc.clone().run(token.child_token()),
        tracing::info_span!("image-gc"),
    ));
    let eviction = start_eviction(
        cfg,
        &state,
        &pods,
        &workers,
        Reclaimers {
            images: image_gc,
            runtime: manager.clone(),
        },
        &cluster_tasks,
        &token,
        opts.kubeconfig.is_some(),
    )?;
    // Safe sysctls can always be set, and unsafe ones once allowed.
    let sysctls = crate::lifecycle::sysctl::Allowlist::for_node(
        &node_cfg.kernel_version,
        &cfg.allowed_unsafe_sysctls,
    )?;
    let admission = crate::syncloop::Admission::new(node_cfg.facts.clone())
        .with_runtime(runtime_state.clone())
        .with_eviction(eviction.clone())
        .with_sysctls(sysctls)
        .with_cpu_manager(cpu_manager.clone());
    let mut deleting = None;
    if let Some(path) = opts.kubeconfig.as_deref() {
        let c = ClusterParts {
            opts: &opts,
            path,
            node_ip: &node_ip,
            node_cfg: node_cfg.clone(),
            runtime: runtime.clone(),
            images: images_for_node.clone(),
            runtime_state: runtime_state.clone(),
            pleg: pleg.clone(),
            pods: pods.clone(),
            status: status.clone(),
            workers: workers.clone(),
            api_health: api_health.clone(),
            tasks: cluster_tasks.clone(),
            api_slot: api_slot.clone(),
            objects: objects.clone(),
            csi: manager.volumes.csi_drivers().clone(),
            eviction,
            cgroups: cgroups.clone(),
        };
        let d = start_cluster_mode(c, pod_config.channel(source::API_SOURCE), &token).await?;
        expected.push(source::API_SOURCE);
        deleting = Some(d);
    } else {
        cgroups.enforce_node_allocatable(&cluster_tasks, token.child_token());
    }
    info!(node = %opts.node_name, static_pod_path = %cfg.static_pod_path, cluster = opts.kubeconfig.is_some(), "rkubelet started");
    let (pods_for_gc, workers_for_gc) = (pods.clone(), workers.clone());
    let workers_at_shutdown = workers.clone();
    {
        // Stale CPU assignments go only once every source has been seen.
        let (seen, expected) = (pod_config.seen_sources(), expected.clone());
        cpu_manager.set_sources_ready(Box::new(move || {
            let seen = seen.borrow();
            expected.iter().all(|s| seen.contains(*s))
        }));
    }
    let sync_loop = SyncLoop {
        pods,
        status,
        workers,
        queue,
        pleg,
        health,
        expected_sources: expected.iter().map(|s| s.to_string()).collect(),
        sources_ready: Box::new(move || pod_config.seen_all_sources(&expected)),
        gc: Some({
            let (p, w) = (pods_for_gc, workers_for_gc);
            Box::new(move || {
                gc_manager.gc_backoff();
                // Asked as each pod is looked at: a pod added since is in
                // the pod manager before it has a directory or a cgroup.
                let known = || {
                    let (p, w) = (p.clone(), w.clone());
                    move |uid: &str| p.contains(uid) || w.is_known(uid)
                };
                gc_manager.volumes.cleanup_orphaned_pod_dirs(known());
                // Upstream's possiblyRunningPods: a pod whose worker syncs
                // or stops it, or that is in config before its worker
                // starts; and its volumes must be torn down first
                // (podVolumesExist). A finished pod that stays in config
                // loses its cgroup, as upstream's SyncTerminatedPod.
                pod_cgroups.run({
                    let (p, w, v) = (p.clone(), w.clone(), gc_manager.volumes.clone());
                    move |uid: &str| {
                        w.could_have_running(uid)
                            || (p.contains(uid) && !w.is_known(uid))
                            || !v.pod_volumes(uid).is_empty()
                    }
                });
                // An evicted pod's logs go though it stays (upstream
                // ShouldPodContentBeRemoved), with its containers.
                let keep = known();
                let w2 = w.clone();
                pod_logs.run(move |uid| keep(uid) && !w2.is_evicted_and_terminated(uid));
            })
        }),
        deleting,
        admission: Some(admission),
    };
    sync_loop
        .run(updates_rx, pleg_rx, probe_rx, token.clone())
        .await;
    let _ = runtime_state_task.await;
    if !workers_at_shutdown
        .wait_stopped(Duration::from_secs(5))
        .await
    {
        warn!("pod workers did not stop within 5 s");
    }
    cluster_tasks.close();
    if tokio::time::timeout(Duration::from_secs(5), cluster_tasks.wait())
        .await
        .is_err()
    {
        warn!("cluster-mode tasks did not stop within 5 s");
    }
    for s in servers.into_iter().chain(sources) {
        let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
    }
    if !streams.shut_down(Duration::from_secs(5)).await {
        warn!("streaming connections did not close within 5 s");
    }
    Ok(())
}

/// The static pods the runtime runs now (ready sandboxes from a file
/// source), for a uid-less manifest to take over (see `Takeover`). Empty
/// when the runtime does not answer: the manifests then get their own UIDs.
async fn running_static_pods(runtime: &dyn RuntimeService) -> Takeover {
    // Bounded: a runtime that hangs must not hold back the static pods.
    let listed =
        tokio::time::timeout(Duration::from_secs(10), runtime.list_pod_sandbox(None)).await;
    let sandboxes = match listed.map_err(|_| "timed out".to_string()) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            warn!(error = %e, "unable to list running pods for the takeover of static pods");
            return Takeover::default();
        }
        Err(e) => {
            warn!(error = %e, "unable to list running pods for the takeover of static pods");
            return Takeover::default();
        }
    };
    let running = sandboxes.into_iter().filter_map(|sb| {
        let ready = sb.state == crate::cri::v1::PodSandboxState::SandboxReady as i32;
        let from_file = sb
            .annotations
            .get(source::CONFIG_SOURCE_ANNOTATION)
            .is_some_and(|s| s == source::FILE_SOURCE);
        let l = &sb.labels;
        let (name, ns, uid) = (
            l.get(crate::kuberuntime::labels::POD_NAME)?,
            l.get(crate::kuberuntime::labels::POD_NAMESPACE)?,
            l.get(crate::kuberuntime::labels::POD_UID)?,
        );
        let created =
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(sb.created_at.max(0) as u64);
        (ready && from_file).then(|| ((ns.clone(), name.clone()), (uid.clone(), created)))
    });
    Takeover::new(running)
}

/// What cluster mode is started from.
struct ClusterParts<'a> {
    opts: &'a KubeletOptions,
    path: &'a std::path::Path,
    node_ip: &'a str,
    node_cfg: crate::nodestatus::NodeConfig,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    runtime_state: crate::runtimestate::RuntimeState,
    pleg: pleg::PlegHandle,
    pods: PodManager,
    status: StatusManager,
    workers: PodWorkers,
    api_health: crate::apiclient::ApiHealth,
    tasks: tokio_util::task::TaskTracker,
    api_slot: Arc<std::sync::OnceLock<crate::apiclient::ApiClient>>,
    objects: crate::objects::ObjectManager,
    /// The CSI drivers: volumesInUse for the Node, the Node for attach.
    csi: crate::volume::csi::Registry,
    /// The pressure conditions for the Node.
    eviction: crate::eviction::EvictionManager,
    /// Node allocatable enforcement, once events can be sent.
    cgroups: crate::cm::manager::ContainerManager,
}

/// What the eviction manager reclaims with before evicting pods.
struct Reclaimers {
    images: Arc<crate::images::gc::ImageGc>,
    runtime: Arc<RuntimeManager>,
}

/// Removes the containers and sandboxes of the pods whose workers have
/// finished with them (upstream's DeleteAllUnusedContainers: the pods
/// whose runtime may go; those never seen by a worker are housekeeping's).
async fn remove_finished_pods_containers(
    workers: &PodWorkers,
    runtime: &RuntimeManager,
    evicted_only: bool,
) -> Result<(), String> {
    let mut errors = Vec::new();
    for (uid, phase, ..) in workers.working() {
        if phase != crate::podworkers::WorkerPhase::Terminated
            || (evicted_only && !workers.is_evicted_and_terminated(&uid))
        {
            continue;
        }
        let r = async {
            let rt = runtime.pod_status(&uid).await?;
            runtime.remove_pod(&rt).await
        };
        if let Err(e) = r.await {
            errors.push(format!("pod {uid}: {e}"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Upstream's getAllocatedPods less those already stopping: the pods
/// whose worker still syncs them, as granted.
fn active_pods(p: PodManager, w: PodWorkers) -> crate::cm::manager::ActivePods {
    Box::new(move || {
        let (desired, _) = p.desired_and_terminating();
        desired
            .into_iter()
            .filter(|pod| {
                w.phase(crate::source::pod_uid(pod))
                    == Some(crate::podworkers::WorkerPhase::Syncing)
            })
            .map(|pod| w.allocation().granted(pod))
            .collect()
    })
}

/// The active pods as the CPU manager sees them (upstream GetActivePods):
/// the desired pods and the deleted ones still stopping, less those whose
/// worker finished and those that ended (or were refused) and are not
/// being stopped.
fn cpu_active_pods(
    p: PodManager,
    w: PodWorkers,
    s: StatusManager,
) -> crate::cm::cpumanager::ActivePods {
    Box::new(move || {
        use crate::podworkers::WorkerPhase;
        let (desired, deleted) = p.desired_and_terminating();
        let keep = |pod: &Arc<crate::source::Pod>, is_desired: bool| {
            let id = crate::source::pod_uid(pod);
            match w.phase(id) {
                Some(WorkerPhase::Terminated) => false,
                Some(WorkerPhase::Terminating) => true,
                None if !is_desired => false,
                _ => !s
                    .get(id)
                    .is_some_and(|st| crate::status::generate::is_terminal(st.phase.as_deref())),
            }
        };
        desired
            .into_iter()
            .filter(|pod| keep(pod, true))
            .chain(deleted.into_iter().filter(|pod| keep(pod, false)))
            .collect()
    })
}

/// Starts the CPU manager (upstream NewManager and Start; an error stops
/// the kubelet). The cpu reservation is systemReserved.cpu +
/// kubeReserved.cpu, as upstream's GetNodeAllocatableReservation.
async fn start_cpu_manager(
    cfg: &crate::config::KubeletConfiguration,
    root_dir: &std::path::Path,
    topology: crate::cm::cpumanager::topology::CpuTopology,
    reserved_cpus: crate::cm::cpumanager::cpuset::CpuSet,
    tasks: &tokio_util::task::TaskTracker,
    token: &CancellationToken,
) -> Result<crate::cm::cpumanager::CpuManager, KubeletError> {
    let reserved_milli: i128 = [&cfg.system_reserved, &cfg.kube_reserved]
        .iter()
        .filter_map(|m| m.get("cpu"))
        .filter_map(|v| crate::cm::quantity::parse_milli(v).ok())
        .sum();
    let c = crate::cm::cpumanager::Config {
        policy: cfg.cpu_manager_policy.clone(),
        options: cfg
            .cpu_manager_policy_options
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        reconcile_period: cfg.cpu_manager_reconcile_period.0,
        reserved_cpus,
        reserved_milli: reserved_milli.clamp(0, i64::MAX as i128) as i64,
        root_dir: root_dir.to_path_buf(),
        alpha_options: cfg.feature_gate("CPUManagerPolicyAlphaOptions"),
        beta_options: cfg.feature_gate("CPUManagerPolicyBetaOptions"),
        metrics: true,
    };
    Ok(crate::cm::cpumanager::CpuManager::start(c, topology, tasks, token.child_token()).await?)
}

/// Starts the container manager's cgroups for the cgroupfs driver with
/// `cgroupsPerQOS` (upstream's containerManager Start; an error stops the
/// kubelet as upstream's "Failed to start ContainerManager" does).
async fn start_container_manager(
    cfg: &crate::config::KubeletConfiguration,
    node_name: &str,
    machine: &MachineInfo,
    tasks: &tokio_util::task::TaskTracker,
    token: &CancellationToken,
) -> Result<crate::cm::manager::ContainerManager, KubeletError> {
    use crate::cm::manager::{self, Capacity, ContainerManager};
    // setupNode: the kernel settings first, whatever the driver.
    let protect = cfg.protect_kernel_defaults;
    crate::blocking::try_run(
        "kernel tunables".into(),
        Duration::from_secs(10),
        move || crate::cm::node::setup_kernel_tunables(std::path::Path::new("/proc/sys"), protect),
    )
    .await
    .map_err(KubeletError::ContainerManager)?;
    // kubeletCgroups and systemCgroups, whatever the driver, as upstream.
    let system =
        crate::cm::system::SystemContainers::from_config(&cfg.kubelet_cgroups, &cfg.system_cgroups)
            .map_err(KubeletError::ContainerManager)?;
    if !system.is_empty() {
        tasks.spawn(tracing::Instrument::instrument(
            system.run(token.child_token()),
            tracing::info_span!("system-cgroups"),
        ));
    }
    if cfg.cgroup_driver == "systemd" || !cfg.cgroups_per_qos {
        manager::warn_disabled(&cfg.cgroup_driver, cfg.cgroups_per_qos);
        return Ok(ContainerManager::default());
    }
    let capacity = Capacity {
        cpu_milli: machine.num_cores as i64 * 1000,
        memory_bytes: machine.memory_capacity as i64,
        max_pid: manager::max_pid().await,
    };
    let c = manager::Config {
        node_name: node_name.to_string(),
        cgroup_root: cfg.cgroup_root.clone(),
        cfs: crate::cm::Cfs::from_config(cfg),
        pod_pids_limit: cfg.pod_pids_limit,
        enforce_node_allocatable: cfg.enforce_node_allocatable.clone(),
        system_reserved: cfg.system_reserved.clone(),
        kube_reserved: cfg.kube_reserved.clone(),
        system_reserved_cgroup: cfg.system_reserved_cgroup.clone(),
        kube_reserved_cgroup: cfg.kube_reserved_cgroup.clone(),
    };
    ContainerManager::start(c, capacity, tasks, token.child_token())
        .await
        .map_err(|e| KubeletError::ContainerManager(e.to_string()))
}

/// Starts the eviction manager (upstream NewManager and Start; thresholds
/// that do not parse stop the kubelet, as upstream's ParseThresholdConfig).
#[allow(clippy::too_many_arguments)]
fn start_eviction(
    cfg: &crate::config::KubeletConfiguration,
    state: &ServerState,
    pods: &PodManager,
    workers: &PodWorkers,
    reclaimers: Reclaimers,
    tasks: &tokio_util::task::TaskTracker,
    token: &CancellationToken,
    cluster: bool,
) -> Result<crate::eviction::EvictionManager, KubeletError> {
    use crate::eviction::{self, EvictionManager};
    let thresholds = eviction::parse_config(
        cfg.enforce_node_allocatable.iter().any(|k| k == "pods"),
        &cfg.eviction_hard,
        &cfg.eviction_soft,
        &cfg.eviction_soft_grace_period,
        &cfg.eviction_minimum_reclaim,
    )?;
    let manager = EvictionManager::new(eviction::Config {
        thresholds,
        pressure_transition: cfg.eviction_pressure_transition_period.0,
        max_pod_grace: cfg.eviction_max_pod_grace_period as i64,
        local_storage: cfg.local_storage_capacity_isolation,
    });
    if !cluster {
        // Every pod is static without an API server, and static pods are
        // critical: none could be evicted or refused, and no Node shows the
        // conditions, so the collections are not spent.
        info!("eviction manager: standalone mode, no pod can be evicted; not monitoring");
        return Ok(manager);
    }
    let (s, s2) = (state.clone(), state.clone());
    let (p, w, w2, w3, w4) = (
        pods.clone(),
        workers.clone(),
        workers.clone(),
        workers.clone(),
        workers.clone(),
    );
    let deps = eviction::Deps {
        sample: Box::new(move || {
            let s = s.clone();
            Box::pin(async move {
                crate::stats::eviction_sample(&s)
                    .await
                    .inspect_err(
                        |e| tracing::warn!(error = %e, "eviction manager: stats collection failed"),
                    )
                    .ok()
            })
        }),
        pod_stats: Box::new(move || {
            let s = s2.clone();
            Box::pin(async move {
                crate::stats::eviction_pod_stats(&s)
                    .await
                    .inspect_err(|e| tracing::warn!(error = %e, "eviction manager: pod stats collection failed"))
                    .ok()
            })
        }),
        active_pods: active_pods(p, w),
        evict: Box::new(move |e| {
            w2.stop_now(
                crate::source::pod_uid(&e.pod),
                e.grace,
                crate::podworkers::Stopped {
                    reason: eviction::REASON.into(),
                    message: e.message,
                    disruption: e.disruption,
                },
            )
        }),
        cleaned_up: Box::new(move |uid| !w3.could_have_running(uid)),
        reclaim: Box::new(move |what| {
            let (r, w) = (reclaimers.runtime.clone(), w4.clone());
            let gc = reclaimers.images.clone();
            Box::pin(async move {
                match what {
                    eviction::Reclaim::DeadContainers => {
                        remove_finished_pods_containers(&w, &r, false).await
                    }
                    eviction::Reclaim::UnusedImages => {
                        gc.delete_unused_images().await.map_err(|e| e.to_string())
                    }
                }
            })
        }),
        node_name: state.node_name.clone(),
    };
    let m = manager.clone();
    tasks.spawn(tracing::Instrument::instrument(
        m.run(deps, token.child_token()),
        tracing::info_span!("eviction-manager"),
    ));
    Ok(manager)
}

/// Starts what joins the node to a cluster: the Node with its status and
/// Lease, the API pod source, and the API status sync. Nothing here waits
/// for the API server: each loop retries on its own.
async fn start_cluster_mode(
    c: ClusterParts<'_>,
    api_updates: mpsc::Sender<source::PodUpdate>,
    token: &CancellationToken,
) -> Result<crate::status::apisync::Deleting, KubeletError> {
    use crate::nodestatus::{self, Observed};
    if let Ok(ip) = c.node_ip.parse::<IpAddr>() {
        if ip.is_loopback() {
            return Err(KubeletError::NodeIp(
                "nodeIP can't be loopback address".into(),
            ));
        }
    }
    let node_cfg = c.node_cfg.clone();
    let max_images = node_cfg.max_images;
    let observe: nodestatus::Observe = {
        let (runtime, images, rs, pleg, csi, eviction) = (
            c.runtime.clone(),
            c.images.clone(),
            c.runtime_state.clone(),
            c.pleg.clone(),
            c.csi.clone(),
            c.eviction.clone(),
        );
        Arc::new(move |fast| {
            let (runtime, images, rs, pleg) =
                (runtime.clone(), images.clone(), rs.clone(), pleg.clone());
            let volumes_in_use = csi.volumes_in_use();
            let pressure = eviction.pressure();
            Box::pin(async move {
                if fast {
                    // Upstream's fast path asks the runtime itself rather
                    // than wait up to 5 s for the poller.
                    rs.refresh(runtime.as_ref()).await;
                }
                // Upstream's Ready errors: runtime, network, then PLEG.
                let errors: Vec<String> =
                    [rs.runtime_error(), rs.network_error(), pleg.healthy().err()]
                        .into_iter()
                        .flatten()
                        .collect();
                if fast && !errors.is_empty() {
                    return Observed {
                        errors,
                        ..Default::default()
                    };
                }
                let runtime_version = match runtime.version().await {
                    Ok(v) => {
                        crate::status::generate::set_runtime_name(&v.runtime_name);
                        format!("{}://{}", v.runtime_name, v.runtime_version)
                    }
                    Err(_) => String::new(),
                };
                let list = images.list_images().await.unwrap_or_default();
                let list = list
                    .into_iter()
                    .map(|i| k8s_openapi::api::core::v1::ContainerImage {
                        names: Some(i.repo_digests.into_iter().chain(i.repo_tags).collect()),
                        size_bytes: Some(i.size as i64),
                    })
                    .collect();
                Observed {
                    errors,
                    runtime_version,
                    images: nodestatus::node_images(list, max_images),
                    runtime_handlers: rs.node_runtime_handlers(),
                    supplemental_groups_policy: rs.supplemental_groups_policy(),
                    volumes_in_use,
                    pressure,
                }
            })
        })
    };
    let pod_cidr: nodestatus::PodCidr = {
        let (runtime, rs) = (c.runtime.clone(), c.runtime_state.clone());
        Arc::new(move |cidr| {
            let (runtime, rs) = (runtime.clone(), rs.clone());
            Box::pin(async move {
                rs.update_pod_cidr(runtime.as_ref(), &cidr)
                    .await
                    .map_err(|e| e.to_string())
            })
        })
    };
    let deleting = crate::status::apisync::Deleting::default();
    let parts = ClusterTasks {
        kubeconfig: c.path.to_path_buf(),
        bootstrap: c.opts.bootstrap_kubeconfig.clone(),
        cert_dir: c.opts.cert_dir.clone(),
        qps: c.opts.config.kube_api_qps,
        burst: c.opts.config.kube_api_burst,
        event_qps: c.opts.config.event_record_qps,
        event_burst: c.opts.config.event_burst,
        rotate_certificates: c.opts.config.rotate_certificates,
        // The self-signed pair is written before serving (serving_tls).
        bootstrap_serving_cert: c.opts.config.enable_server
            && c.opts.config.tls_cert_file.is_empty()
            && c.opts.config.server_tls_bootstrap,
        api_slot: c.api_slot.clone(),
        objects: c.objects.clone(),
        node_cfg: node_cfg.clone(),
        observe,
        pod_cidr,
        api_updates,
        pods: c.pods.clone(),
        status: c.status.clone(),
        workers: c.workers.clone(),
        deleting: deleting.clone(),
        api_health: c.api_health.clone(),
        tasks: c.tasks.clone(),
        csi: c.csi.clone(),
        cgroups: c.cgroups.clone(),
    };
    let t = token.clone();
    c.tasks.spawn(tracing::Instrument::instrument(
        async move {
            tokio::select! {
                _ = t.cancelled() => {}
                _ = parts.run(&t) => {}
            }
        },
        tracing::info_span!("cluster-start"),
    ));
    info!(node = %node_cfg.node_name, kubeconfig = %c.path.display(), "cluster mode: registering with the API server");
    Ok(deleting)
}

/// The cluster-mode tasks, started once the client credentials are there.
struct ClusterTasks {
    kubeconfig: PathBuf,
    bootstrap: Option<PathBuf>,
    cert_dir: PathBuf,
    qps: i32,
    burst: i32,
    event_qps: i32,
    event_burst: i32,
    rotate_certificates: bool,
    /// Request the serving certificate (serverTLSBootstrap, no tlsCertFile).
    bootstrap_serving_cert: bool,
    /// Where the API client goes once built, for :10250's webhooks.
    api_slot: Arc<std::sync::OnceLock<crate::apiclient::ApiClient>>,
    node_cfg: crate::nodestatus::NodeConfig,
    observe: crate::nodestatus::Observe,
    pod_cidr: crate::nodestatus::PodCidr,
    api_updates: mpsc::Sender<source::PodUpdate>,
    pods: PodManager,
    status: StatusManager,
    workers: PodWorkers,
    deleting: crate::status::apisync::Deleting,
    api_health: crate::apiclient::ApiHealth,
    tasks: tokio_util::task::TaskTracker,
    objects: crate::objects::ObjectManager,
    csi: crate::volume::csi::Registry,
    cgroups: crate::cm::manager::ContainerManager,
}

impl ClusterTasks {
    /// Bootstraps the client certificate if needed and builds the client,
    /// retrying with backoff (the API server may not be up yet), then
    /// spawns the node status, lease, API source and status sync.
    async fn run(self, token: &CancellationToken) {
        use crate::metrics::certvol::{self, Cert::Client};
        use crate::nodestatus;
        // Upstream registers the client certificate manager's families
        // with rotateCertificates (buildKubeletClientConfig).
        if self.rotate_certificates {
            certvol::register_certificate_manager(Client);
        }
        let mut backoff = Duration::from_secs(1);
        let api = loop {
            let ready = match &self.bootstrap {
                Some(b) => crate::certificate::load_client_cert(
                    &self.kubeconfig,
                    b,
                    &self.cert_dir,
                    &self.node_cfg.node_name,
                )
                .await
                .map_err(|e| e.to_string()),
                None => Ok(()),
            };
            let built = match &ready {
                Ok(()) => crate::apiclient::ApiClient::from_kubeconfig(
                    &self.kubeconfig,
                    self.qps,
                    self.burst,
                )
                .await
                .map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            };
            // With rotation, upstream's manager requests the first
            // certificate itself: each failure is a renewal error.
            if ready.is_err() && self.rotate_certificates && self.bootstrap.is_some() {
                certvol::certificate_renew_failed(Client);
            }
            match built {
                Ok(api) => break api,
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff, "unable to set up the API client; retrying")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        };
        if self.rotate_certificates {
            let na = crate::certificate::client_cert_not_after(&self.kubeconfig, &self.cert_dir);
            certvol::set_certificate_not_after(Client, na.await);
        }
        let node_cfg = self.node_cfg;
        let tasks = self.tasks.clone();
        let _ = self.api_slot.set(api.clone());
        if self.bootstrap_serving_cert {
            let (api, dir, node) = (api.clone(), self.cert_dir.clone(), node_cfg.clone());
            tasks.spawn(tracing::Instrument::instrument(
                serving_certificate(api, dir, node, token.child_token()),
                tracing::info_span!("serving-cert"),
            ));
        }
        if self.rotate_certificates
            && crate::certificate::uses_rotating_pair(&self.kubeconfig, &self.cert_dir)
        {
            tasks.spawn(tracing::Instrument::instrument(
                crate::certificate::rotate_client_cert(
                    api.clone(),
                    self.kubeconfig.clone(),
                    self.cert_dir.clone(),
                    node_cfg.node_name.clone(),
                    token.child_token(),
                ),
                tracing::info_span!("cert-rotation"),
            ));
        }
        crate::events::install(
            &tasks,
            api.clone(),
            node_cfg.node_name.clone(),
            self.event_qps,
            self.event_burst,
            token.child_token(),
        );
        crate::events::record(
            crate::events::node_ref(&node_cfg.node_name),
            crate::events::NORMAL,
            "Starting",
            "Starting kubelet.".into(),
        );
        if crate::cm::node::memory_backed_volumes_on_disk() {
            crate::events::record(
                crate::events::node_ref(&node_cfg.node_name),
                crate::events::WARNING,
                "PossibleMemoryBackedVolumesOnDisk",
                crate::cm::node::MEMORY_BACKED_VOLUMES_ON_DISK.into(),
            );
        }
        if crate::metrics::cgroup_version() == 1 {
            // Upstream cgroupVersionCheck.
            crate::events::record(
                crate::events::node_ref(&node_cfg.node_name),
                crate::events::WARNING,
                "CgroupV1",
                crate::cm::CGROUP_V1_WARNING.into(),
            );
        }
        self.cgroups
            .enforce_node_allocatable(&tasks, token.child_token());
        let (registered_tx, registered_rx) = tokio::sync::watch::channel(None);
        // The kubelet's own Node, watched: the status loop's first read.
        let (node_tx, node_rx) =
            tokio::sync::watch::channel(None::<k8s_openapi::api::core::v1::Node>);
        // The Cache strategy's TTL, as the TTL controller sets it on the Node.
        let ttl_node = node_rx.clone();
        self.objects.set_ttl_source(Box::new(move || {
            let node = ttl_node.borrow();
            let v = node
                .as_ref()?
                .metadata
                .annotations
                .as_ref()?
                .get(crate::objects::OBJECT_TTL_ANNOTATION)?;
            v.parse::<u64>().ok().map(Duration::from_secs)
        }));
        tasks.spawn(tracing::Instrument::instrument(
            nodestatus::watch_node(api.clone(), node_cfg.clone(), node_tx, token.child_token()),
            tracing::info_span!("node-watch", node = %node_cfg.node_name),
        ));
        // CSI attach verification reads the Node as the watch saw it.
        let (csi, rx, t) = (self.csi.clone(), node_rx.clone(), token.child_token());
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                tokio::select! {
                    _ = t.cancelled() => {}
                    _ = csi.follow_node(rx) => {}
                }
            },
            tracing::debug_span!("csi-node-follow"),
        ));
        tasks.spawn(tracing::Instrument::instrument(
            nodestatus::run(
                api.clone(),
                node_cfg.clone(),
                self.observe,
                self.pod_cidr,
                node_rx,
                registered_tx,
                token.child_token(),
            ),
            tracing::info_span!("node-status"),
        ));
        tasks.spawn(tracing::Instrument::instrument(
            nodestatus::lease::run(
                api.clone(),
                node_cfg.node_name.clone(),
                node_cfg.lease_duration_seconds,
                node_cfg.heartbeat_timeout(),
                registered_rx.clone(),
                self.api_health.clone(),
                token.child_token(),
            ),
            tracing::info_span!("node-lease"),
        ));
        let mirrors = source::api::MirrorPods::default();
        source::api::spawn_api_source(
            &tasks,
            api.clone(),
            node_cfg.node_name.clone(),
            self.api_updates,
            mirrors.clone(),
            token.child_token(),
        );
        let workers = self.workers;
        let workers2 = workers.clone();
        self.status.keep_finals();
        let sync = crate::status::apisync::ApiStatusSync {
            api,
            node_name: node_cfg.node_name.clone(),
            node_uid: registered_rx,
            pods: self.pods,
            status: self.status,
            mirrors,
            deleting: self.deleting,
            worker_known: Arc::new(move |uid| workers.is_known(uid)),
            could_have_running: Arc::new(move |uid| workers2.could_have_running(uid)),
        };
        tasks.spawn(tracing::Instrument::instrument(
            sync.run(token.child_token()),
            tracing::info_span!("status-sync"),
        ));
        info!(node = %node_cfg.node_name, "cluster mode: API client ready, registering the node");
    }
}

/// The Node as configured: used for registration in cluster mode and for
/// admission in both modes.
fn node_config(
    opts: &KubeletOptions,
    node_ip: &str,
    machine: &MachineInfo,
) -> crate::nodestatus::NodeConfig {
    use crate::nodestatus::{self, NodeConfig};
    let cfg = &opts.config;
    let c_opts = opts;
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let node_cfg = NodeConfig {
        node_name: c_opts.node_name.clone(),
        hostname: c_opts.node_name.clone(),
        node_ip: node_ip.to_string(),
        node_labels: c_opts.node_labels.clone(),
        taints: cfg
            .register_with_taints
            .iter()
            .map(|t| k8s_openapi::api::core::v1::Taint {
                key: t.key.clone(),
                value: (!t.value.is_empty()).then(|| t.value.clone()),
                effect: t.effect.clone(),
                time_added: None,
            })
            .collect(),
        provider_id: cfg.provider_id.clone(),
        max_pods: nodestatus::pods_capacity(cfg.max_pods, cfg.pods_per_core, machine.num_cores),
        kubelet_port: cfg.port,
        controller_attach_detach: cfg.enable_controller_attach_detach,
        kube_reserved: cfg.kube_reserved.clone().into_iter().collect(),
        system_reserved: cfg.system_reserved.clone().into_iter().collect(),
        // Upstream leaves the container manager's hard thresholds nil then.
        eviction_hard: if opts.allocatable_ignore_eviction {
            std::collections::BTreeMap::new()
        } else {
            cfg.eviction_hard.clone().into_iter().collect()
        },
        num_cores: machine.num_cores,
        memory_bytes: machine.memory_capacity,
        ephemeral_storage_bytes: nodestatus::fs_capacity(&c_opts.root_dir),
        local_storage_capacity_isolation: cfg.local_storage_capacity_isolation,
        machine_id: machine.machine_id.clone(),
        system_uuid: machine.system_uuid.clone(),
        boot_id: machine.boot_id.clone(),
        kernel_version: read("/proc/sys/kernel/osrelease"),
        os_image: nodestatus::os_image(),
        kubelet_version: KUBERNETES_VERSION.to_string(),
        update_frequency: cfg.node_status_update_frequency.0,
        report_frequency: cfg.node_status_report_frequency.0,
        lease_duration_seconds: cfg.node_lease_duration_seconds,
        max_images: cfg.node_status_max_images,
        facts: Default::default(),
        register_node: cfg.register_node,
    };
    *node_cfg.facts.write() = nodestatus::node_facts(&node_cfg);
    node_cfg
}

/// The serving certificate for :10250 with `serverTLSBootstrap`, as
/// upstream's serving certificate manager: a valid
/// `kubelet-server-current.pem` is kept; otherwise, and again 70-90 % into
/// each certificate's life, a CSR to `kubernetes.io/kubelet-serving`,
/// retried with backoff. The server re-reads the file, so a renewed
/// certificate is served without a restart.
async fn serving_certificate(
    api: crate::apiclient::ApiClient,
    dir: PathBuf,
    node: crate::nodestatus::NodeConfig,
    token: CancellationToken,
) {
    use crate::metrics::certvol::{self, Cert::Server};
    let ips: Vec<IpAddr> = node.node_ip.parse().into_iter().collect();
    let current = dir.join("kubelet-server-current.pem");
    certvol::register_certificate_manager(Server);
    loop {
        let validity = tokio::fs::read(&current)
            .await
            .ok()
            .and_then(|pem| crate::certificate::validity(&pem).ok());
        certvol::set_certificate_not_after(Server, validity.map(|(_, na)| na));
        let wait = validity.map_or(Duration::ZERO, |(nb, na)| {
            crate::certificate::rotation_wait(nb, na)
        });
        if !wait.is_zero() {
            info!(rotate_in = ?wait, "serving certificate rotation scheduled");
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let mut backoff = Duration::from_secs(1);
        loop {
            let r = tokio::select! {
                _ = token.cancelled() => return,
                r = crate::certificate::bootstrap_serving(
                    api.client().await,
                    &dir,
                    &node.node_name,
                    &node.hostname,
                    &ips,
                ) => r,
            };
            match r {
                Ok(_) => {
                    let now = crate::kuberuntime::wall_now().as_secs_f64();
                    certvol::certificate_rotated(Server, validity.map(|(nb, _)| nb), now);
                    break;
                }
                Err(e) => {
                    certvol::certificate_renew_failed(Server);
                    warn!(error = %e, retry_in = ?backoff, "unable to get a serving certificate")
                }
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(300));
        }
    }
}

/// The TLS configuration and the authn/authz filter of :10250, as
/// upstream's InitializeTLS and BuildAuth: `tlsCertFile`/`tlsPrivateKeyFile`,
/// else with `serverTLSBootstrap` the issued `kubelet-server-current.pem`
/// (served once it exists), else the self-signed `kubelet.crt`/`kubelet.key`
/// in cert-dir, written now if missing. The certificate is re-read every
/// 10 s, so a rotated one is served without a restart.
async fn serving_tls(
    opts: &KubeletOptions,
    node: &crate::nodestatus::NodeConfig,
    api_slot: Arc<std::sync::OnceLock<crate::apiclient::ApiClient>>,
    token: &CancellationToken,
) -> Result<
    (
        Arc<server::https::TlsSource>,
        Arc<server::auth::Auth>,
        tokio::task::JoinHandle<()>,
    ),
    KubeletError,
> {
    use crate::server::https::{self, CertReloader, CertSource};
    let cfg = &opts.config;
    let provider = Arc::new(https::provider(
        &cfg.tls_cipher_suites,
        &cfg.tls_curve_preferences,
    )?);
    let source = if !cfg.tls_cert_file.is_empty() {
        CertSource::Files {
            cert: PathBuf::from(&cfg.tls_cert_file),
            key: PathBuf::from(&cfg.tls_private_key_file),
        }
    } else if cfg.server_tls_bootstrap && opts.kubeconfig.is_some() {
        CertSource::Combined(opts.cert_dir.join("kubelet-server-current.pem"))
    } else {
        let ips: Vec<IpAddr> = node.node_ip.parse().into_iter().collect();
        let (cert, key) =
            crate::certificate::ensure_self_signed_serving(&opts.cert_dir, &node.hostname, &ips)
                .await
                .map_err(|e| https::TlsError::Pem {
                    path: opts.cert_dir.join("kubelet.crt"),
                    reason: e.to_string(),
                })?;
        CertSource::Files { cert, key }
    };
    let certs = CertReloader::new(source.clone(), provider.clone());
    let first = {
        let c = certs.clone();
        tokio::task::spawn_blocking(move || c.reload())
            .await
            .unwrap_or(Ok(false))
    };
    match (first, &source) {
        (Ok(_), _) => {}
        // An issued certificate may not exist yet: served once it does.
        (Err(e), CertSource::Combined(_)) => {
            info!(error = %e, "serving certificate not issued yet; :10250 answers once it is")
        }
        (Err(e), _) => return Err(e.into()),
    }
    let client_ca = match cfg.authentication.x509.client_ca_file.as_str() {
        "" => None,
        path => {
            let (path, p) = (PathBuf::from(path), provider.clone());
            Some(
                tokio::task::spawn_blocking(move || https::ClientCa::load(path, p))
                    .await
                    .map_err(|e| https::TlsError::Pem {
                        path: PathBuf::from(&cfg.authentication.x509.client_ca_file),
                        reason: e.to_string(),
                    })??,
            )
        }
    };
    let auth = server::auth::Auth::new(
        cfg,
        &opts.node_name,
        client_ca.clone(),
        opts.kubeconfig.is_some(),
        api_slot,
    )?;
    let tls = https::TlsSource::new(provider, &cfg.tls_min_version, certs, client_ca)?;
    let reload = tokio::spawn(tracing::Instrument::instrument(
        tls.clone()
            .watch(Duration::from_secs(10), token.child_token()),
        tracing::info_span!("tls-reload"),
    ));
    Ok((tls, auth, reload))
}

#[cfg(test)]
mod cgroup_driver_tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use crate::cri::v1::CgroupDriver;

    async fn ask(fake: &FakeRuntime) -> String {
        cgroup_driver_from_runtime(fake, "cgroupfs".into(), Duration::from_secs(2)).await
    }

    /// Upstream's getCgroupDriverFromCRI: the runtime's driver wins over
    /// the configured one; no Linux config keeps the configured one.
    #[tokio::test(start_paused = true)]
    async fn the_runtime_driver_replaces_the_configured_one() {
        let fake = FakeRuntime::new();
        fake.push_runtime_config(Ok(Some(CgroupDriver::Systemd)));
        assert_eq!(ask(&fake).await, "systemd");
        fake.push_runtime_config(Ok(None));
        assert_eq!(ask(&fake).await, "cgroupfs");
    }

    /// A transient error is retried (three tries in all); an unimplemented
    /// RuntimeConfig is not, keeps the configured driver and sets
    /// kubelet_cri_losing_support{version="1.36.0"}.
    #[tokio::test(start_paused = true)]
    async fn errors_are_retried_and_unimplemented_falls_back() {
        let fake = FakeRuntime::new();
        fake.push_runtime_config(Err(tonic::Code::Unavailable));
        fake.push_runtime_config(Ok(Some(CgroupDriver::Systemd)));
        assert_eq!(ask(&fake).await, "systemd");
        let tries = |f: &FakeRuntime| f.calls().iter().filter(|c| *c == "RuntimeConfig").count();
        assert_eq!(tries(&fake), 2);

        let fake = FakeRuntime::new();
        for _ in 0..3 {
            fake.push_runtime_config(Err(tonic::Code::Unavailable));
        }
        fake.push_runtime_config(Ok(Some(CgroupDriver::Systemd)));
        assert_eq!(ask(&fake).await, "cgroupfs");
        assert_eq!(tries(&fake), 3);

        let fake = FakeRuntime::new();
        assert_eq!(ask(&fake).await, "cgroupfs");
        assert_eq!(tries(&fake), 1);
        let gauge = crate::metrics::METRICS
            .v134
            .cri_losing_support
            .get_or_create(&crate::metrics::v134::VersionLabel { version: "1.36.0" })
            .get();
        assert_eq!(gauge, 1);
    }
}
