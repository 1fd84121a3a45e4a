//! Kubelet command-line flags: a hand-written parser following spf13/pflag's rules, with the
//! flag set of upstream `cmd/kubelet/app/options/options.go` (KubeletFlags plus the
//! deprecated KubeletConfiguration flags that kubeadm and older setups still pass).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use super::{parse_go_duration, GoDuration, KubeletConfiguration, MemoryReservation, Taint};

/// Upstream marks every KubeletConfiguration flag deprecated with this text
/// (except `--v`, `--vmodule`, `--log-flush-frequency` and `--provider-id`).
pub const CONFIG_FLAG_DEPRECATION: &str = "This parameter should be set via the config file specified by the Kubelet's --config flag. See https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information.";

/// Upstream 1.34 text for `--pod-infra-container-image` (ContainerRuntimeOptions.AddFlags).
const POD_INFRA_DEPRECATION: &str =
    "will be removed in 1.35. Image garbage collector will get sandbox image information from CRI.";

/// Upstream's text for the three container garbage collection flags (KubeletFlags.AddFlags).
const CONTAINER_GC_DEPRECATION: &str =
    "Use --eviction-hard or --eviction-soft instead. Will be removed in a future version.";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// Holds the flag as written, e.g. `--foo`.
    #[error("unknown flag: {0}")]
    Unknown(String),
    #[error("unknown shorthand flag: '{short}' in -{rest}")]
    UnknownShorthand { short: char, rest: String },
    /// Holds pflag's description of the flag, e.g. `--foo` or `'v' in -v`.
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("invalid argument {value:?} for {flag:?} flag: {reason}")]
    InvalidValue {
        value: String,
        flag: String,
        reason: String,
    },
    #[error("bad flag syntax: {0}")]
    BadSyntax(String),
    /// Upstream rejects positional arguments this way.
    #[error("unknown command {0}")]
    UnknownCommand(String),
    /// `--help`/`-h`: the caller prints [`usage`] to stdout and exits 0.
    #[error("help requested")]
    Help,
}

/// What `--version` asked for (`--version`/`--version=true` or `--version=raw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionMode {
    Plain,
    Raw,
}

/// A parsed flag value destined for a KubeletConfiguration field.
#[derive(Debug, Clone, PartialEq)]
pub enum FlagValue {
    Bool(bool),
    String(String),
    Int32(i32),
    Int64(i64),
    Level(u32),
    Duration(GoDuration),
    List(Vec<String>),
    BoolMap(BTreeMap<String, bool>),
    StringMap(BTreeMap<String, String>),
    /// `key:value` pairs in order, repeats kept (ColonSeparatedMultimapStringString).
    Multimap(Vec<(String, String)>),
    Taints(Vec<Taint>),
    /// `--reserved-memory` entries, appended across repeats (ReservedMemoryVar).
    ReservedMemory(Vec<MemoryReservation>),
    /// `--vmodule` patterns, appended across repeats (VModuleConfigurationPflag).
    VModule(Vec<super::VModuleItem>),
}

/// A config-file field given on the command line; applied over the file by
/// [`KubeletFlags::apply`], as upstream re-parses flags over the loaded config.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigOverride {
    /// The canonical flag name without dashes, e.g. `sync-frequency`.
    pub flag: &'static str,
    pub value: FlagValue,
}

/// Flags that are not part of KubeletConfiguration, plus the config overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletFlags {
    pub config: Option<PathBuf>,
    /// `--config-dir`: drop-in `*.conf` files merged over the config (see `config::dropin`).
    pub config_dir: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub hostname_override: Option<String>,
    pub node_ip: Option<String>,
    pub cloud_provider: Option<String>,
    pub root_dir: PathBuf,
    pub cert_dir: PathBuf,
    pub node_labels: BTreeMap<String, String>,
    /// Also recorded as an override; kept here for callers that only read flags.
    pub register_node: Option<bool>,
    /// Accepted for compatibility; informational only (the CRI owns the sandbox image).
    pub pod_infra_container_image: Option<String>,
    /// `--seccomp-default`: a KubeletFlags field upstream, ORed with the
    /// config's `seccompDefault` (server.go), so `=false` cannot clear the file's `true`.
    pub seccomp_default: bool,
    /// `--lock-file`: held with an exclusive flock for the life of the process.
    pub lock_file: Option<PathBuf>,
    /// `--exit-on-lock-contention`: exit when another process opens the lock file.
    pub exit_on_lock_contention: bool,
    /// Deprecated `--experimental-mounter-path`; accepted, not acted on.
    pub experimental_mounter_path: Option<String>,
    /// Deprecated `--experimental-allocatable-ignore-eviction`: hard eviction
    /// thresholds are left out of node allocatable.
    pub experimental_allocatable_ignore_eviction: bool,
    /// Deprecated `--minimum-container-ttl-duration` (upstream MinimumGCAge, default 0).
    pub minimum_container_ttl_duration: GoDuration,
    /// Deprecated `--maximum-dead-containers-per-container` (MaxPerPodContainerCount, default 1).
    pub maximum_dead_containers_per_container: i32,
    /// Deprecated `--maximum-dead-containers` (MaxContainerCount, default -1: no limit).
    pub maximum_dead_containers: i32,
    /// `-v`/`--v`, saturated to u8; the full value also overrides `logging.verbosity`.
    pub verbosity: u8,
    pub version: Option<VersionMode>,
    pub overrides: Vec<ConfigOverride>,
    /// pflag-style notices: `Flag --X has been deprecated, ...` and removed-flag notices.
    pub deprecation_warnings: Vec<String>,
    /// An empty `--reserved-memory` makes upstream's ReservedMemoryVar drop its
    /// target, so any later `--reserved-memory` fails.
    reserved_memory_detached: bool,
}

impl Default for KubeletFlags {
    fn default() -> Self {
        KubeletFlags {
            config: None,
            config_dir: None,
            kubeconfig: None,
            bootstrap_kubeconfig: None,
            hostname_override: None,
            node_ip: None,
            cloud_provider: None,
            root_dir: PathBuf::from("/var/lib/kubelet"),
            cert_dir: PathBuf::from("/var/lib/kubelet/pki"),
            node_labels: BTreeMap::new(),
            register_node: None,
            pod_infra_container_image: None,
            seccomp_default: false,
            lock_file: None,
            exit_on_lock_contention: false,
            experimental_mounter_path: None,
            experimental_allocatable_ignore_eviction: false,
            minimum_container_ttl_duration: GoDuration::default(),
            maximum_dead_containers_per_container: 1,
            maximum_dead_containers: -1,
            verbosity: 0,
            version: None,
            overrides: Vec::new(),
            deprecation_warnings: Vec::new(),
            reserved_memory_detached: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Str,
    Ip,
    Int32,
    Int64,
    Level,
    Duration,
    Strings,
    MapBool,
    MapLangle,
    MapString,
    /// cliflag.NewMapStringStringNoSplit: one `key=value` per use, commas kept in the value.
    MapStringNoSplit,
    LabelMap,
    ColonMultimap,
    Taints,
    ReservedMemory,
    /// logsapi's VModuleConfigurationPflag: `pattern=N,...`.
    VModule,
    /// resource.QuantityValue (the log info buffer sizes).
    Quantity,
    Version,
    Help,
}

impl Kind {
    /// pflag's NoOptDefVal: these never consume the next argument.
    fn is_boolish(self) -> bool {
        matches!(self, Kind::Bool | Kind::Version | Kind::Help)
    }

    fn type_name(self) -> &'static str {
        match self {
            Kind::Bool | Kind::Help => "",
            Kind::Str => "string",
            Kind::Ip => "ip",
            Kind::Int32 => "int32",
            Kind::Int64 => "int",
            Kind::Level => "Level",
            Kind::Duration => "duration",
            Kind::Strings => "strings",
            Kind::MapBool => "mapStringBool",
            Kind::MapLangle | Kind::MapString | Kind::MapStringNoSplit | Kind::LabelMap => {
                "mapStringString"
            }
            Kind::ColonMultimap => "colonSeparatedMultimapStringString",
            Kind::Taints => "[]Taint",
            Kind::ReservedMemory => "reserved-memory",
            Kind::VModule => "pattern=N,...",
            Kind::Quantity => "quantity",
            Kind::Version => "version[=true]",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Stored on KubeletFlags.
    Local,
    /// Overrides a KubeletConfiguration field.
    Config,
    /// Removed upstream; accepted and ignored (see `removed`).
    Removed,
}

struct Spec {
    name: &'static str,
    short: Option<char>,
    kind: Kind,
    role: Role,
    deprecation: Option<&'static str>,
    usage: &'static str,
}

const fn local(name: &'static str, kind: Kind, usage: &'static str) -> Spec {
    Spec {
        name,
        short: None,
        kind,
        role: Role::Local,
        deprecation: None,
        usage,
    }
}

const fn cfg(name: &'static str, kind: Kind, usage: &'static str) -> Spec {
    Spec {
        name,
        short: None,
        kind,
        role: Role::Config,
        deprecation: Some(CONFIG_FLAG_DEPRECATION),
        usage,
    }
}

/// Flags upstream deleted (v1.24 dockershim removal, v1.27 `--container-runtime`).
/// Upstream now fails on them, but kubeadm upgrade paths leave them in
/// /var/lib/kubelet/kubeadm-flags.env, so we accept them with a warning instead of
/// refusing to start a node that the Go kubelet of the previous release ran fine.
const fn removed(name: &'static str) -> Spec {
    Spec {
        name,
        short: None,
        kind: Kind::Str,
        role: Role::Removed,
        deprecation: None,
        usage: "Removed upstream; accepted for compatibility and ignored.",
    }
}

const SPECS: &[Spec] = &[
    // KubeletFlags.
    local("config", Kind::Str, "The Kubelet will load its initial configuration from this file. Command-line flags override values from this file."),
    local("config-dir", Kind::Str, "Directory of drop-in *.conf KubeletConfiguration files, merged in lexical order over --config; command-line flags still win."),
    local("kubeconfig", Kind::Str, "Path to a kubeconfig file for connecting to the API server. Omitting it enables standalone mode."),
    local("bootstrap-kubeconfig", Kind::Str, "Path to a kubeconfig used to request a client certificate when --kubeconfig does not exist yet."),
    local("hostname-override", Kind::Str, "If non-empty, use this string as the node's identity instead of the hostname."),
    local("node-ip", Kind::Str, "IP address (or comma-separated dual-stack addresses) of the node."),
    local("cloud-provider", Kind::Str, "The provider for cloud services; only '' or 'external' are meaningful."),
    local("root-dir", Kind::Str, "Directory path for managing kubelet files (volume mounts, etc)."),
    local("cert-dir", Kind::Str, "The directory where the TLS certs are located."),
    local("node-labels", Kind::LabelMap, "Labels to add when registering the node, as key=value pairs separated by ','."),
    Spec {
        deprecation: Some(POD_INFRA_DEPRECATION),
        ..local("pod-infra-container-image", Kind::Str, "Sandbox image exempt from image garbage collection; the CRI runtime must be configured with it too.")
    },
    local("seccomp-default", Kind::Bool, "Enable the use of `RuntimeDefault` as the default seccomp profile for all workloads."),
    local("lock-file", Kind::Str, "<Warning: Alpha feature> The path to file for kubelet to use as a lock file."),
    local("exit-on-lock-contention", Kind::Bool, "Whether kubelet should exit upon lock-file contention."),
    Spec {
        deprecation: Some(CONTAINER_GC_DEPRECATION),
        ..local("minimum-container-ttl-duration", Kind::Duration, "Minimum age for a finished container before it is garbage collected.")
    },
    Spec {
        deprecation: Some(CONTAINER_GC_DEPRECATION),
        ..local("maximum-dead-containers-per-container", Kind::Int32, "Maximum number of old instances to retain per container.")
    },
    Spec {
        deprecation: Some(CONTAINER_GC_DEPRECATION),
        ..local("maximum-dead-containers", Kind::Int32, "Maximum number of old instances of containers to retain globally; negative disables.")
    },
    Spec {
        deprecation: Some("will be removed in 1.25 or later. in favor of using CSI."),
        ..local("experimental-mounter-path", Kind::Str, "[Experimental] Path of mounter binary. Leave empty to use the default mount.")
    },
    Spec {
        deprecation: Some("will be removed in 1.25 or later."),
        ..local("experimental-allocatable-ignore-eviction", Kind::Bool, "When set to 'true', Hard Eviction Thresholds will be ignored while calculating Node Allocatable.")
    },
    local("version", Kind::Version, "--version, --version=raw prints version information and quits."),
    Spec {
        short: Some('h'),
        ..local("help", Kind::Help, "help for rkubelet")
    },
    // Logging verbosity is a KubeletConfiguration field but its flag is not deprecated.
    Spec {
        short: Some('v'),
        deprecation: None,
        ..cfg("v", Kind::Level, "number for the log level verbosity")
    },
    // component-base's logging flags (logsapi.AddFlags over the
    // configuration's `logging`); vmodule and log-flush-frequency stay
    // undeprecated upstream, the others get the config-flag notice.
    Spec {
        deprecation: None,
        ..cfg("vmodule", Kind::VModule, "comma-separated list of pattern=N settings for file-filtered logging (only works for text log format)")
    },
    Spec {
        deprecation: None,
        ..cfg("log-flush-frequency", Kind::Duration, "Maximum number of seconds between log flushes")
    },
    cfg("logging-format", Kind::Str, "Sets the log format. Permitted formats: \"json\" (gated by LoggingBetaOptions), \"text\"."),
    cfg("log-text-split-stream", Kind::Bool, "[Alpha] In text format, write error messages to stderr and info messages to stdout."),
    cfg("log-text-info-buffer-size", Kind::Quantity, "[Alpha] In text format with split output streams, the info messages can be buffered for a while to increase performance."),
    cfg("log-json-split-stream", Kind::Bool, "[Alpha] In JSON format, write error messages to stderr and info messages to stdout."),
    cfg("log-json-info-buffer-size", Kind::Quantity, "[Alpha] In JSON format with split output streams, the info messages can be buffered for a while to increase performance."),
    Spec {
        deprecation: None,
        ..cfg("provider-id", Kind::Str, "Unique identifier for the node in a machine database, i.e. cloud provider.")
    },
    // Left undeprecated upstream too (options.go's notDeprecated set).
    Spec {
        deprecation: None,
        ..cfg("fail-cgroupv1", Kind::Bool, "Prevent the kubelet from starting on the host using cgroup v1.")
    },
    // Command-line only upstream (ContainerRuntimeOptions), never deprecated;
    // carried on KubeletConfiguration's non-file fields.
    Spec {
        deprecation: None,
        ..cfg("image-credential-provider-config", Kind::Str, "Path to the credential provider plugin config file (or a directory of .json/.yaml/.yml files, merged in lexical order).")
    },
    Spec {
        deprecation: None,
        ..cfg("image-credential-provider-bin-dir", Kind::Str, "Path to the directory where credential provider plugin binaries are located.")
    },
    // Deprecated KubeletConfiguration flags.
    cfg("enable-server", Kind::Bool, "Enable the Kubelet's server."),
    cfg("fail-swap-on", Kind::Bool, "Makes the Kubelet fail to start if swap is enabled on the node."),
    cfg("pod-manifest-path", Kind::Str, "Path to the directory containing static pod files, or to a single static pod file."),
    cfg("manifest-url", Kind::Str, "URL for accessing additional Pod specifications to run."),
    cfg("manifest-url-header", Kind::ColonMultimap, "Comma-separated list of HTTP headers (key:value) to use when accessing --manifest-url; may be repeated."),
    cfg("sync-frequency", Kind::Duration, "Max period between synchronizing running containers and config."),
    cfg("file-check-frequency", Kind::Duration, "Duration between checking config files for new data."),
    cfg("http-check-frequency", Kind::Duration, "Duration between checking http for new data."),
    cfg("address", Kind::Ip, "The IP address for the Kubelet to serve on."),
    cfg("port", Kind::Int32, "The port for the Kubelet to serve on."),
    cfg("read-only-port", Kind::Int32, "The read-only port for the Kubelet to serve on without authentication/authorization (0 disables)."),
    cfg("container-runtime-endpoint", Kind::Str, "The endpoint of the container runtime service, e.g. unix:///run/containerd/containerd.sock."),
    cfg("image-service-endpoint", Kind::Str, "The endpoint of the container image service; defaults to --container-runtime-endpoint."),
    cfg("anonymous-auth", Kind::Bool, "Enables anonymous requests to the Kubelet server."),
    cfg("authentication-token-webhook", Kind::Bool, "Use the TokenReview API to authenticate bearer tokens."),
    cfg("authentication-token-webhook-cache-ttl", Kind::Duration, "The duration to cache responses from the webhook token authenticator."),
    cfg("client-ca-file", Kind::Str, "Authenticate client certificates signed by one of the authorities in this file."),
    cfg("authorization-mode", Kind::Str, "Authorization mode for the Kubelet server: AlwaysAllow or Webhook."),
    cfg("authorization-webhook-cache-authorized-ttl", Kind::Duration, "The duration to cache 'authorized' responses from the webhook authorizer."),
    cfg("authorization-webhook-cache-unauthorized-ttl", Kind::Duration, "The duration to cache 'unauthorized' responses from the webhook authorizer."),
    cfg("tls-cert-file", Kind::Str, "File containing the x509 certificate used for serving HTTPS."),
    cfg("tls-private-key-file", Kind::Str, "File containing the x509 private key matching --tls-cert-file."),
    cfg("tls-cipher-suites", Kind::Strings, "Comma-separated list of cipher suites for the server."),
    cfg("tls-min-version", Kind::Str, "Minimum TLS version supported."),
    cfg("rotate-server-certificates", Kind::Bool, "Request and rotate the kubelet serving certificate from the API server."),
    cfg("rotate-certificates", Kind::Bool, "Auto rotate the kubelet client certificates."),
    cfg("registry-qps", Kind::Int32, "If > 0, limit registry pull QPS to this value; 0 means unlimited."),
    cfg("registry-burst", Kind::Int32, "Maximum size of bursty pulls."),
    cfg("event-qps", Kind::Int32, "QPS to limit event creations."),
    cfg("event-burst", Kind::Int32, "Maximum size of bursty event records."),
    cfg("enable-debugging-handlers", Kind::Bool, "Enables server endpoints for log collection and running commands in containers."),
    cfg("contention-profiling", Kind::Bool, "Enable block profiling, if profiling is enabled."),
    cfg("healthz-port", Kind::Int32, "The port of the localhost healthz endpoint (0 disables)."),
    cfg("healthz-bind-address", Kind::Ip, "The IP address for the healthz server to serve on."),
    cfg("oom-score-adj", Kind::Int32, "The oom-score-adj value for the kubelet process, in [-1000, 1000]."),
    cfg("cluster-domain", Kind::Str, "Domain for this cluster, added to container DNS search paths."),
    cfg("cluster-dns", Kind::Strings, "Comma-separated list of DNS server IP addresses for pods with dnsPolicy=ClusterFirst."),
    cfg("volume-plugin-dir", Kind::Str, "The directory to search for additional third party volume plugins."),
    cfg("streaming-connection-idle-timeout", Kind::Duration, "Maximum time a streaming connection can be idle before it is closed."),
    cfg("node-status-update-frequency", Kind::Duration, "How often the kubelet computes node status."),
    cfg("minimum-image-ttl-duration", Kind::Duration, "Minimum age for an unused image before it is garbage collected."),
    cfg("image-gc-high-threshold", Kind::Int32, "Disk usage percent above which image garbage collection always runs."),
    cfg("image-gc-low-threshold", Kind::Int32, "Disk usage percent that image garbage collection frees down to."),
    cfg("volume-stats-agg-period", Kind::Duration, "Interval for calculating and caching volume disk usage."),
    cfg("feature-gates", Kind::MapBool, "A set of key=value pairs that describe feature gates."),
    cfg("kubelet-cgroups", Kind::Str, "Absolute name of cgroups to create and run the Kubelet in."),
    cfg("system-cgroups", Kind::Str, "Absolute name of cgroups for non-kernel processes not already in a cgroup under '/'."),
    cfg("cgroups-per-qos", Kind::Bool, "Enable creation of the QoS cgroup hierarchy."),
    cfg("cgroup-driver", Kind::Str, "Driver the kubelet uses to manipulate cgroups on the host: 'cgroupfs' or 'systemd'."),
    cfg("cgroup-root", Kind::Str, "Optional root cgroup to use for pods."),
    cfg("cpu-manager-policy", Kind::Str, "CPU Manager policy to use: 'none' or 'static'."),
    cfg("cpu-manager-policy-options", Kind::MapStringNoSplit, "A key=value CPU Manager policy option; repeat the flag for several."),
    cfg("cpu-manager-reconcile-period", Kind::Duration, "CPU Manager reconciliation period."),
    cfg("qos-reserved", Kind::MapString, "ResourceName=Percentage pairs reserved at the QoS level."),
    cfg("topology-manager-policy", Kind::Str, "Topology Manager policy: 'none', 'best-effort', 'restricted' or 'single-numa-node'."),
    cfg("topology-manager-scope", Kind::Str, "Scope topology hints apply to: 'container' or 'pod'."),
    cfg("topology-manager-policy-options", Kind::MapString, "A set of key=value Topology Manager policy options."),
    cfg("memory-manager-policy", Kind::Str, "Memory Manager policy: 'None' or 'Static'."),
    cfg("reserved-memory", Kind::ReservedMemory, "Memory reservations per NUMA node, e.g. 0:memory=1Gi,hugepages-1M=2Gi;1:memory=2Gi; may be repeated."),
    cfg("runtime-request-timeout", Kind::Duration, "Timeout of all runtime requests except long running ones."),
    cfg("hairpin-mode", Kind::Str, "How to set up hairpin NAT: 'promiscuous-bridge', 'hairpin-veth' or 'none'."),
    cfg("max-pods", Kind::Int32, "Number of Pods that can run on this Kubelet."),
    cfg("pod-cidr", Kind::Str, "The CIDR to use for pod IP addresses, only used in standalone mode."),
    cfg("pod-max-pids", Kind::Int64, "Maximum number of processes per pod; -1 uses the node allocatable pid capacity."),
    cfg("resolv-conf", Kind::Str, "Resolver configuration file used as the basis for container DNS resolution."),
    cfg("runonce", Kind::Bool, "If true, exit after spawning pods from static pod files or remote urls (rejected since runOnce mode is deprecated)."),
    cfg("cpu-cfs-quota", Kind::Bool, "Enable CPU CFS quota enforcement for containers that specify CPU limits."),
    cfg("cpu-cfs-quota-period", Kind::Duration, "Sets the CPU CFS quota period value, cpu.cfs_period_us."),
    cfg("enable-controller-attach-detach", Kind::Bool, "Let the attach/detach controller manage volumes scheduled to this node."),
    cfg("make-iptables-util-chains", Kind::Bool, "If true, ensure iptables utility rules are present on the host."),
    cfg("container-log-max-size", Kind::Str, "Maximum size (e.g. 10Mi) of a container log file before it is rotated."),
    cfg("container-log-max-files", Kind::Int32, "Maximum number of container log files per container; must be >= 2."),
    cfg("allowed-unsafe-sysctls", Kind::Strings, "Comma-separated allowlist of unsafe sysctls or patterns (ending in *)."),
    cfg("node-status-max-images", Kind::Int32, "Maximum number of images reported in Node.Status.Images; -1 means no cap."),
    cfg("kernel-memcg-notification", Kind::Bool, "Use the kernel memcg notification to detect memory eviction thresholds instead of polling."),
    cfg("local-storage-capacity-isolation", Kind::Bool, "Enable local ephemeral storage isolation."),
    cfg("max-open-files", Kind::Int64, "Number of files that can be opened by the Kubelet process."),
    cfg("kube-api-content-type", Kind::Str, "Content type of requests sent to the API server."),
    cfg("kube-api-qps", Kind::Int32, "QPS to use while talking with the API server."),
    cfg("kube-api-burst", Kind::Int32, "Burst to use while talking with the API server."),
    cfg("serialize-image-pulls", Kind::Bool, "Pull images one at a time."),
    cfg("eviction-hard", Kind::MapLangle, "Hard eviction thresholds (e.g. memory.available<1Gi)."),
    cfg("eviction-soft", Kind::MapLangle, "Soft eviction thresholds (e.g. memory.available<1.5Gi)."),
    cfg("eviction-soft-grace-period", Kind::MapString, "Grace periods for soft eviction thresholds (e.g. memory.available=1m30s)."),
    cfg("eviction-pressure-transition-period", Kind::Duration, "How long to wait before transitioning out of an eviction pressure condition."),
    cfg("eviction-max-pod-grace-period", Kind::Int32, "Maximum grace period (seconds) for pods terminated by soft eviction."),
    cfg("eviction-minimum-reclaim", Kind::MapString, "Minimum reclaims (e.g. imagefs.available=2Gi) per eviction."),
    cfg("pods-per-core", Kind::Int32, "Number of Pods per core that can run on this Kubelet; 0 disables the limit."),
    cfg("protect-kernel-defaults", Kind::Bool, "Error if kernel tunables differ from kubelet defaults instead of modifying them."),
    cfg("reserved-cpus", Kind::Str, "CPUs or CPU ranges reserved for system and kubernetes usage."),
    cfg("system-reserved", Kind::MapString, "Resources reserved for non-kubernetes components (e.g. cpu=200m,memory=500Mi)."),
    cfg("kube-reserved", Kind::MapString, "Resources reserved for kubernetes system components (e.g. cpu=200m,memory=500Mi)."),
    cfg("enforce-node-allocatable", Kind::Strings, "Node allocatable enforcement levels: 'none', 'pods', 'system-reserved', 'kube-reserved'."),
    cfg("system-reserved-cgroup", Kind::Str, "Absolute name of the cgroup for --system-reserved resources."),
    cfg("kube-reserved-cgroup", Kind::Str, "Absolute name of the cgroup for --kube-reserved resources."),
    cfg("register-node", Kind::Bool, "Register the node with the API server."),
    cfg("register-with-taints", Kind::Taints, "Register the node with these taints (comma separated <key>=<value>:<effect>)."),
    // Removed upstream.
    removed("container-runtime"),
    removed("network-plugin"),
    removed("cni-bin-dir"),
    removed("cni-conf-dir"),
];

fn lookup(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

fn lookup_short(c: char) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.short == Some(c))
}

/// pflag's name in "invalid argument" errors: `-v, --v` when a shorthand exists.
fn display_name(spec: &Spec) -> String {
    match spec.short {
        Some(c) => format!("-{c}, --{}", spec.name),
        None => format!("--{}", spec.name),
    }
}

/// Parses kubelet arguments (without argv[0]) with pflag semantics: `--name=value`,
/// `--name value`, bare booleans that never take the next argument, `-v 3`/`-v=3`/`-v3`,
/// `_` normalised to `-` in names, and `--` ending flag parsing.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<KubeletFlags, FlagError> {
    let mut flags = KubeletFlags::default();
    let mut positional: Vec<String> = Vec::new();
    let mut help = false;
    let mut it = args.into_iter();

    while let Some(arg) = it.next() {
        if arg == "--" {
            positional.extend(it.by_ref());
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            if body.starts_with('-') || body.starts_with('=') {
                return Err(FlagError::BadSyntax(arg));
            }
            let (raw_name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            // cliflag.WordSepNormalizeFunc, which the kubelet installs.
            let spec = lookup(&raw_name.replace('_', "-"))
                .ok_or_else(|| FlagError::Unknown(format!("--{raw_name}")))?;
            let value = match inline {
                Some(v) => v,
                None if spec.kind.is_boolish() => "true".to_string(),
                None => it
                    .next()
                    .ok_or_else(|| FlagError::MissingValue(arg.clone()))?,
            };
            flags.set(spec, &value, &mut help)?;
        } else if arg.len() > 1 && arg.starts_with('-') {
            let mut shorts: &str = &arg[1..];
            while let Some(c) = shorts.chars().next() {
                let rest = &shorts[c.len_utf8()..];
                let spec = lookup_short(c).ok_or_else(|| FlagError::UnknownShorthand {
                    short: c,
                    rest: shorts.to_string(),
                })?;
                let value;
                if rest.len() > 1 && rest.starts_with('=') {
                    value = rest[1..].to_string();
                    shorts = "";
                } else if spec.kind.is_boolish() {
                    value = "true".to_string();
                    shorts = rest;
                } else if !rest.is_empty() {
                    value = rest.to_string();
                    shorts = "";
                } else {
                    value = it
                        .next()
                        .ok_or_else(|| FlagError::MissingValue(format!("'{c}' in -{shorts}")))?;
                    shorts = "";
                }
                flags.set(spec, &value, &mut help)?;
            }
        } else {
            // pflag keeps parsing flags after positionals; the kubelet rejects them later.
            positional.push(arg);
        }
    }

    if let Some(cmd) = positional.into_iter().next() {
        return Err(FlagError::UnknownCommand(cmd));
    }
    if help {
        return Err(FlagError::Help);
    }
    Ok(flags)
}

impl KubeletFlags {
    fn set(&mut self, spec: &'static Spec, raw: &str, help: &mut bool) -> Result<(), FlagError> {
        let invalid = |reason: String| FlagError::InvalidValue {
            value: raw.to_string(),
            flag: display_name(spec),
            reason,
        };
        if spec.kind == Kind::ReservedMemory && self.reserved_memory_detached {
            return Err(invalid(
                "no target (nil pointer to *[]MemoryReservation".to_string(),
            ));
        }
        let value = parse_value(spec.kind, raw).map_err(invalid)?;
        // pflag prints the notice on every successful Set of a deprecated flag.
        if let Some(msg) = spec.deprecation {
            self.deprecation_warnings
                .push(format!("Flag --{} has been deprecated, {msg}", spec.name));
        }
        match spec.role {
            Role::Removed => self.deprecation_warnings.push(format!(
                "Flag --{} has been removed from the kubelet and has no effect; ignoring it",
                spec.name
            )),
            Role::Config => {
                match (spec.name, &value) {
                    ("v", Parsed::Value(FlagValue::Level(l))) => {
                        self.verbosity = u8::try_from(*l).unwrap_or(u8::MAX);
                    }
                    ("register-node", Parsed::Value(FlagValue::Bool(b))) => {
                        self.register_node = Some(*b);
                    }
                    _ => {}
                }
                match value {
                    // ReservedMemoryVar.Set("") leaves the field as it was.
                    Parsed::Value(FlagValue::ReservedMemory(_)) if raw.is_empty() => {
                        self.reserved_memory_detached = true;
                    }
                    Parsed::Value(v) => self.push_override(spec.name, v),
                    Parsed::Version(_) => {}
                }
            }
            Role::Local => self.set_local(spec.name, value, help),
        }
        Ok(())
    }

    fn set_local(&mut self, name: &str, value: Parsed, help: &mut bool) {
        let text = |v: Parsed| match v {
            Parsed::Value(FlagValue::String(s)) if !s.is_empty() => Some(s),
            _ => None,
        };
        match name {
            "config" => self.config = text(value).map(PathBuf::from),
            "config-dir" => self.config_dir = text(value).map(PathBuf::from),
            "lock-file" => self.lock_file = text(value).map(PathBuf::from),
            "experimental-mounter-path" => self.experimental_mounter_path = text(value),
            "seccomp-default"
            | "exit-on-lock-contention"
            | "experimental-allocatable-ignore-eviction" => {
                if let Parsed::Value(FlagValue::Bool(b)) = value {
                    match name {
                        "seccomp-default" => self.seccomp_default = b,
                        "exit-on-lock-contention" => self.exit_on_lock_contention = b,
                        _ => self.experimental_allocatable_ignore_eviction = b,
                    }
                }
            }
            "minimum-container-ttl-duration" => {
                if let Parsed::Value(FlagValue::Duration(d)) = value {
                    self.minimum_container_ttl_duration = d;
                }
            }
            "maximum-dead-containers-per-container" | "maximum-dead-containers" => {
                if let Parsed::Value(FlagValue::Int32(n)) = value {
                    if name == "maximum-dead-containers" {
                        self.maximum_dead_containers = n;
                    } else {
                        self.maximum_dead_containers_per_container = n;
                    }
                }
            }
            "kubeconfig" => self.kubeconfig = text(value).map(PathBuf::from),
            "bootstrap-kubeconfig" => self.bootstrap_kubeconfig = text(value).map(PathBuf::from),
            "hostname-override" => self.hostname_override = text(value),
            "node-ip" => self.node_ip = text(value),
            "cloud-provider" => self.cloud_provider = text(value),
            "pod-infra-container-image" => self.pod_infra_container_image = text(value),
            "root-dir" => {
                if let Parsed::Value(FlagValue::String(s)) = value {
                    self.root_dir = PathBuf::from(s);
                }
            }
            "cert-dir" => {
                if let Parsed::Value(FlagValue::String(s)) = value {
                    self.cert_dir = PathBuf::from(s);
                }
            }
            // cliflag.ConfigurationMap accumulates across repeats.
            "node-labels" => {
                if let Parsed::Value(FlagValue::StringMap(m)) = value {
                    self.node_labels.extend(m);
                }
            }
            "version" => {
                if let Parsed::Version(v) = value {
                    self.version = v;
                }
            }
            "help" => {
                if let Parsed::Value(FlagValue::Bool(b)) = value {
                    *help = b;
                }
            }
            _ => {}
        }
    }

    /// Repeats combine like pflag's Set: slices append, maps merge, scalars replace.
    fn push_override(&mut self, flag: &'static str, value: FlagValue) {
        match self.overrides.iter_mut().find(|o| o.flag == flag) {
            Some(existing) => match (&mut existing.value, value) {
                (FlagValue::List(a), FlagValue::List(b)) => a.extend(b),
                (FlagValue::BoolMap(a), FlagValue::BoolMap(b)) => a.extend(b),
                (FlagValue::StringMap(a), FlagValue::StringMap(b)) => a.extend(b),
                (FlagValue::Multimap(a), FlagValue::Multimap(b)) => a.extend(b),
                (FlagValue::ReservedMemory(a), FlagValue::ReservedMemory(b)) => a.extend(b),
                (FlagValue::VModule(a), FlagValue::VModule(b)) => a.extend(b),
                (slot, v) => *slot = v,
            },
            None => self.overrides.push(ConfigOverride { flag, value }),
        }
    }

    /// Applies the config fields given as flags over `cfg` (flags win over the file).
    pub fn apply(&self, cfg: &mut KubeletConfiguration) {
        for o in &self.overrides {
            o.apply_to(cfg);
        }
    }

    /// Whether a config field was set from the command line (canonical flag name).
    pub fn overrides_flag(&self, flag: &str) -> bool {
        self.overrides.iter().any(|o| o.flag == flag)
    }
}

impl ConfigOverride {
    /// Sets the matching configuration field. Returns false if the flag/value pair maps to
    /// no field (cannot happen for overrides produced by [`parse_args`]).
    pub fn apply_to(&self, c: &mut KubeletConfiguration) -> bool {
        use FlagValue as V;
        match (self.flag, &self.value) {
            ("v", V::Level(l)) => c.logging.verbosity = *l,
            // The first use replaces the file's list, later ones append.
            ("vmodule", V::VModule(v)) => c.logging.vmodule = v.clone(),
            ("log-flush-frequency", V::Duration(d)) => {
                c.logging.flush_frequency.duration = *d;
                c.logging.flush_frequency.serialize_as_string = true;
            }
            ("logging-format", V::String(s)) => c.logging.format = s.clone(),
            ("log-text-split-stream", V::Bool(b)) => c.logging.options.text.split_stream = *b,
            ("log-text-info-buffer-size", V::String(s)) => {
                c.logging.options.text.info_buffer_size = s.clone()
            }
            ("log-json-split-stream", V::Bool(b)) => c.logging.options.json.split_stream = *b,
            ("log-json-info-buffer-size", V::String(s)) => {
                c.logging.options.json.info_buffer_size = s.clone()
            }
            ("provider-id", V::String(s)) => c.provider_id = s.clone(),
            ("image-credential-provider-config", V::String(s)) => {
                c.image_credential_provider_config = s.clone()
            }
            ("image-credential-provider-bin-dir", V::String(s)) => {
                c.image_credential_provider_bin_dir = s.clone()
            }
            ("enable-server", V::Bool(b)) => c.enable_server = *b,
            ("fail-swap-on", V::Bool(b)) => c.fail_swap_on = *b,
            ("pod-manifest-path", V::String(s)) => c.static_pod_path = s.clone(),
            ("manifest-url", V::String(s)) => c.static_pod_url = s.clone(),
            ("manifest-url-header", V::Multimap(pairs)) => {
                c.static_pod_url_header.clear();
                for (k, v) in pairs {
                    c.static_pod_url_header
                        .entry(k.clone())
                        .or_default()
                        .push(v.clone());
                }
            }
            ("sync-frequency", V::Duration(d)) => c.sync_frequency = *d,
            ("file-check-frequency", V::Duration(d)) => c.file_check_frequency = *d,
            ("http-check-frequency", V::Duration(d)) => c.http_check_frequency = *d,
            ("address", V::String(s)) => c.address = s.clone(),
            ("port", V::Int32(n)) => c.port = *n,
            ("read-only-port", V::Int32(n)) => c.read_only_port = *n,
            ("container-runtime-endpoint", V::String(s)) => {
                c.container_runtime_endpoint = s.clone()
            }
            ("image-service-endpoint", V::String(s)) => c.image_service_endpoint = s.clone(),
            ("anonymous-auth", V::Bool(b)) => c.authentication.anonymous.enabled = *b,
            ("authentication-token-webhook", V::Bool(b)) => c.authentication.webhook.enabled = *b,
            ("authentication-token-webhook-cache-ttl", V::Duration(d)) => {
                c.authentication.webhook.cache_ttl = *d
            }
            ("client-ca-file", V::String(s)) => c.authentication.x509.client_ca_file = s.clone(),
            ("authorization-mode", V::String(s)) => c.authorization.mode = s.clone(),
            ("authorization-webhook-cache-authorized-ttl", V::Duration(d)) => {
                c.authorization.webhook.cache_authorized_ttl = *d
            }
            ("authorization-webhook-cache-unauthorized-ttl", V::Duration(d)) => {
                c.authorization.webhook.cache_unauthorized_ttl = *d
            }
            ("tls-cert-file", V::String(s)) => c.tls_cert_file = s.clone(),
            ("tls-private-key-file", V::String(s)) => c.tls_private_key_file = s.clone(),
            ("tls-cipher-suites", V::List(l)) => c.tls_cipher_suites = l.clone(),
            ("tls-min-version", V::String(s)) => c.tls_min_version = s.clone(),
            ("rotate-server-certificates", V::Bool(b)) => c.server_tls_bootstrap = *b,
            ("rotate-certificates", V::Bool(b)) => c.rotate_certificates = *b,
            ("registry-qps", V::Int32(n)) => c.registry_pull_qps = *n,
            ("registry-burst", V::Int32(n)) => c.registry_burst = *n,
            ("event-qps", V::Int32(n)) => c.event_record_qps = *n,
            ("event-burst", V::Int32(n)) => c.event_burst = *n,
            ("enable-debugging-handlers", V::Bool(b)) => c.enable_debugging_handlers = *b,
            ("contention-profiling", V::Bool(b)) => c.enable_contention_profiling = *b,
            ("healthz-port", V::Int32(n)) => c.healthz_port = *n,
            ("healthz-bind-address", V::String(s)) => c.healthz_bind_address = s.clone(),
            ("oom-score-adj", V::Int32(n)) => c.oom_score_adj = *n,
            ("cluster-domain", V::String(s)) => c.cluster_domain = s.clone(),
            ("cluster-dns", V::List(l)) => c.cluster_dns = l.clone(),
            ("volume-plugin-dir", V::String(s)) => c.volume_plugin_dir = s.clone(),
            ("streaming-connection-idle-timeout", V::Duration(d)) => {
                c.streaming_connection_idle_timeout = *d
            }
            ("node-status-update-frequency", V::Duration(d)) => c.node_status_update_frequency = *d,
            ("minimum-image-ttl-duration", V::Duration(d)) => c.image_minimum_gc_age = *d,
            ("image-gc-high-threshold", V::Int32(n)) => c.image_gc_high_threshold_percent = *n,
            ("image-gc-low-threshold", V::Int32(n)) => c.image_gc_low_threshold_percent = *n,
            ("volume-stats-agg-period", V::Duration(d)) => c.volume_stats_agg_period = *d,
            // Upstream merges: flag gates win, gates only in the file are kept.
            ("feature-gates", V::BoolMap(m)) => c
                .feature_gates
                .extend(m.iter().map(|(k, v)| (k.clone(), *v))),
            ("kubelet-cgroups", V::String(s)) => c.kubelet_cgroups = s.clone(),
            ("system-cgroups", V::String(s)) => c.system_cgroups = s.clone(),
            ("cgroups-per-qos", V::Bool(b)) => c.cgroups_per_qos = *b,
            ("cgroup-driver", V::String(s)) => c.cgroup_driver = s.clone(),
            ("cgroup-root", V::String(s)) => c.cgroup_root = s.clone(),
            ("cpu-manager-policy", V::String(s)) => c.cpu_manager_policy = s.clone(),
            ("cpu-manager-policy-options", V::StringMap(m)) => {
                c.cpu_manager_policy_options = m.clone()
            }
            ("cpu-manager-reconcile-period", V::Duration(d)) => c.cpu_manager_reconcile_period = *d,
            ("qos-reserved", V::StringMap(m)) => c.qos_reserved = m.clone(),
            ("topology-manager-policy", V::String(s)) => c.topology_manager_policy = s.clone(),
            ("topology-manager-scope", V::String(s)) => c.topology_manager_scope = s.clone(),
            ("topology-manager-policy-options", V::StringMap(m)) => {
                c.topology_manager_policy_options = m.clone()
            }
            ("memory-manager-policy", V::String(s)) => c.memory_manager_policy = s.clone(),
            // The first use replaces the file's list, later ones append (ReservedMemoryVar).
            ("reserved-memory", V::ReservedMemory(r)) => c.reserved_memory = r.clone(),
            ("runtime-request-timeout", V::Duration(d)) => c.runtime_request_timeout = *d,
            ("hairpin-mode", V::String(s)) => c.hairpin_mode = s.clone(),
            ("max-pods", V::Int32(n)) => c.max_pods = *n,
            ("pod-cidr", V::String(s)) => c.pod_cidr = s.clone(),
            ("pod-max-pids", V::Int64(n)) => c.pod_pids_limit = *n,
            ("resolv-conf", V::String(s)) => c.resolv_conf = s.clone(),
            // Validation rejects it, as upstream's does.
            ("runonce", V::Bool(b)) => c.run_once = *b,
            ("cpu-cfs-quota", V::Bool(b)) => c.cpu_cfs_quota = *b,
            ("cpu-cfs-quota-period", V::Duration(d)) => c.cpu_cfs_quota_period = *d,
            ("enable-controller-attach-detach", V::Bool(b)) => {
                c.enable_controller_attach_detach = *b
            }
            ("make-iptables-util-chains", V::Bool(b)) => c.make_iptables_util_chains = *b,
            ("container-log-max-size", V::String(s)) => c.container_log_max_size = s.clone(),
            ("container-log-max-files", V::Int32(n)) => c.container_log_max_files = *n,
            ("allowed-unsafe-sysctls", V::List(l)) => c.allowed_unsafe_sysctls = l.clone(),
            ("node-status-max-images", V::Int32(n)) => c.node_status_max_images = *n,
            ("kernel-memcg-notification", V::Bool(b)) => c.kernel_memcg_notification = *b,
            ("fail-cgroupv1", V::Bool(b)) => c.fail_cgroup_v1 = *b,
            ("local-storage-capacity-isolation", V::Bool(b)) => {
                c.local_storage_capacity_isolation = *b
            }
            ("max-open-files", V::Int64(n)) => c.max_open_files = *n,
            ("kube-api-content-type", V::String(s)) => c.content_type = s.clone(),
            ("kube-api-qps", V::Int32(n)) => c.kube_api_qps = *n,
            ("kube-api-burst", V::Int32(n)) => c.kube_api_burst = *n,
            ("serialize-image-pulls", V::Bool(b)) => c.serialize_image_pulls = *b,
            // These replace the file's map wholesale, as pflag map Set does on first use.
            ("eviction-hard", V::StringMap(m)) => c.eviction_hard = m.clone(),
            ("eviction-soft", V::StringMap(m)) => c.eviction_soft = m.clone(),
            ("eviction-soft-grace-period", V::StringMap(m)) => {
                c.eviction_soft_grace_period = m.clone()
            }
            ("eviction-pressure-transition-period", V::Duration(d)) => {
                c.eviction_pressure_transition_period = *d
            }
            ("eviction-max-pod-grace-period", V::Int32(n)) => c.eviction_max_pod_grace_period = *n,
            ("eviction-minimum-reclaim", V::StringMap(m)) => c.eviction_minimum_reclaim = m.clone(),
            ("pods-per-core", V::Int32(n)) => c.pods_per_core = *n,
            ("protect-kernel-defaults", V::Bool(b)) => c.protect_kernel_defaults = *b,
            ("reserved-cpus", V::String(s)) => c.reserved_system_cpus = s.clone(),
            ("system-reserved", V::StringMap(m)) => c.system_reserved = m.clone(),
            ("kube-reserved", V::StringMap(m)) => c.kube_reserved = m.clone(),
            ("enforce-node-allocatable", V::List(l)) => c.enforce_node_allocatable = l.clone(),
            ("system-reserved-cgroup", V::String(s)) => c.system_reserved_cgroup = s.clone(),
            ("kube-reserved-cgroup", V::String(s)) => c.kube_reserved_cgroup = s.clone(),
            ("register-node", V::Bool(b)) => c.register_node = *b,
            ("register-with-taints", V::Taints(t)) => c.register_with_taints = t.clone(),
            _ => return false,
        }
        true
    }
}

/// A parsed flag value before it is routed to KubeletFlags or an override.
enum Parsed {
    Value(FlagValue),
    Version(Option<VersionMode>),
}

fn parse_value(kind: Kind, raw: &str) -> Result<Parsed, String> {
    let v = match kind {
        Kind::Bool | Kind::Help => FlagValue::Bool(parse_bool(raw)?),
        Kind::Version => {
            // component-base verflag: "raw" or a boolean.
            return Ok(Parsed::Version(if raw == "raw" {
                Some(VersionMode::Raw)
            } else if parse_bool(raw)? {
                Some(VersionMode::Plain)
            } else {
                None
            }));
        }
        Kind::Str => FlagValue::String(raw.to_string()),
        Kind::Ip => {
            if !raw.is_empty() && raw.parse::<IpAddr>().is_err() {
                return Err(format!("{raw:?} is not a valid IP address"));
            }
            FlagValue::String(raw.to_string())
        }
        Kind::Int32 => FlagValue::Int32(parse_int(raw, 32)? as i32),
        Kind::Int64 => FlagValue::Int64(parse_int(raw, 64)?),
        Kind::Level => FlagValue::Level(parse_level(raw)?),
        Kind::Duration => FlagValue::Duration(GoDuration(
            parse_go_duration(raw).map_err(|e| e.to_string())?,
        )),
        Kind::Strings => FlagValue::List(if raw.is_empty() {
            Vec::new()
        } else {
            raw.split(',').map(str::to_string).collect()
        }),
        Kind::MapBool => FlagValue::BoolMap(parse_bool_map(raw)?),
        Kind::MapLangle => FlagValue::StringMap(parse_pairs(raw, '<')?),
        Kind::MapString => FlagValue::StringMap(parse_pairs(raw, '=')?),
        Kind::MapStringNoSplit => FlagValue::StringMap(parse_pair_no_split(raw)?),
        Kind::ReservedMemory => FlagValue::ReservedMemory(parse_reserved_memory(raw)?),
        Kind::VModule => FlagValue::VModule(parse_vmodule(raw)?),
        Kind::Quantity => {
            crate::cm::quantity::parse_milli(raw).map_err(|e| e.to_string())?;
            FlagValue::String(raw.to_string())
        }
        Kind::LabelMap => FlagValue::StringMap(parse_labels(raw)),
        Kind::ColonMultimap => FlagValue::Multimap(parse_colon_pairs(raw)?),
        Kind::Taints => FlagValue::Taints(parse_taints(raw)?),
    };
    Ok(Parsed::Value(v))
}

/// component-base's ColonSeparatedMultimapStringString: `a:x,b:y`, keys
/// and values trimmed, a key may repeat.
fn parse_colon_pairs(raw: &str) -> Result<Vec<(String, String)>, String> {
    raw.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| match pair.split_once(':') {
            Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
            None => Err(format!("malformed pair {pair:?}, expect string:string")),
        })
        .collect()
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("strconv.ParseBool: parsing {s:?}: invalid syntax")),
    }
}

/// Go's `strconv.ParseInt(s, 0, bits)`: optional sign, 0x/0o/0b/0 prefixes, `_` after a prefix.
fn parse_int(s: &str, bits: u32) -> Result<i64, String> {
    let syntax = || format!("strconv.ParseInt: parsing {s:?}: invalid syntax");
    let range = || format!("strconv.ParseInt: parsing {s:?}: value out of range");
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d.to_string(), true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d.to_string(), true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d.to_string(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string(), true)
    } else {
        (10, lower.clone(), false)
    };
    let digits = if prefixed {
        digits.replace('_', "")
    } else {
        digits
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(syntax());
    }
    let magnitude = u128::from_str_radix(&digits, radix).map_err(|e| {
        if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) {
            range()
        } else {
            syntax()
        }
    })?;
    let limit = 1u128 << (bits - 1);
    if (negative && magnitude > limit) || (!negative && magnitude >= limit) {
        return Err(range());
    }
    let magnitude = magnitude as i128;
    Ok(if negative { -magnitude } else { magnitude } as i64)
}

/// component-base `VerbosityLevel.Set`: `strconv.ParseUint(s, 10, 32)`.
/// logsapi's VModuleConfigurationPflag.Set (klog's -vmodule): `pattern=N`
/// items split on commas, empty ones skipped, N below 2^31.
fn parse_vmodule(raw: &str) -> Result<Vec<super::VModuleItem>, String> {
    let mut out = Vec::new();
    for pat in raw.split(',').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = pat.split('=').collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() {
            return Err(format!("{pat:?} does not have the pattern=N format"));
        }
        let n = parse_level(parts[1])
            .ok()
            .filter(|n| *n < 1 << 31)
            .ok_or_else(|| {
                format!(
                    "parsing verbosity in {pat:?}: strconv.ParseUint: parsing {:?}: invalid syntax",
                    parts[1]
                )
            })?;
        out.push(super::VModuleItem {
            file_pattern: parts[0].to_string(),
            verbosity: n,
        });
    }
    Ok(out)
}

fn parse_level(s: &str) -> Result<u32, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("strconv.ParseUint: parsing {s:?}: invalid syntax"));
    }
    s.parse::<u32>()
        .map_err(|_| format!("strconv.ParseUint: parsing {s:?}: value out of range"))
}

/// cliflag.MapStringBool: `k=bool` pairs separated by commas.
fn parse_bool_map(s: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for {part}"))?;
        let b = parse_bool(v.trim()).map_err(|e| format!("invalid value of {k}={v}, err: {e}"))?;
        out.insert(k.trim().to_string(), b);
    }
    Ok(out)
}

/// cliflag.MapStringString / LangleSeparatedMapStringString with separator `sep`.
fn parse_pairs(s: &str, sep: char) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once(sep)
            .ok_or_else(|| format!("malformed pair, expect string{sep}string"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// cliflag.MapStringString with NoSplit: exactly one `key=value`, split at the first `=`.
fn parse_pair_no_split(s: &str) -> Result<BTreeMap<String, String>, String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| "malformed pair, expect string=string".to_string())?;
    Ok(BTreeMap::from([(
        k.trim().to_string(),
        v.trim().to_string(),
    )]))
}

/// Upstream `ReservedMemoryVar.Set` (pkg/util/flag): `;`-separated NUMA nodes, each
/// `id:type=quantity[,type=quantity...]`, types `memory` or `hugepages-*`. Error texts
/// (typos included) are upstream's. Quantities are kept as written, as the file's are.
fn parse_reserved_memory(s: &str) -> Result<Vec<MemoryReservation>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for reservation in s.split(';') {
        let parts: Vec<&str> = reservation.split(':').collect();
        let [id, limits] = parts[..] else {
            return Err(format!("the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got {reservation}"));
        };
        // strconv.Atoi, then Go's int32 conversion.
        let numa_node = go_atoi(id).ok_or_else(|| {
            format!("failed to convert the NUMA node ID, exptected integer, got {id}")
        })? as i32;
        let mut r = MemoryReservation {
            numa_node,
            limits: BTreeMap::new(),
        };
        for limit in limits.split(',') {
            let kv: Vec<&str> = limit.split('=').collect();
            let [name, quantity] = kv[..] else {
                return Err(format!(
                    "the reserved limit has incorrect value, expected type=quantatity, got {limit}"
                ));
            };
            if name != "memory" && !name.starts_with("hugepages-") {
                return Err(format!(
                    "memory type conversion error, unknown type: {name:?}"
                ));
            }
            if crate::cm::quantity::parse_milli(quantity).is_err() || quantity.trim() != quantity {
                return Err(format!(
                    "failed to parse the quantatity, expected quantatity, got {quantity}"
                ));
            }
            r.limits.insert(name.to_string(), quantity.to_string());
        }
        out.push(r);
    }
    Ok(out)
}

/// Go's `strconv.Atoi`: optional sign and decimal digits, within 64 bits.
fn go_atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// cliflag.ConfigurationMap: like `k=v,k2=v2`, but a key without `=` gets an empty value.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|part| match part.split_once('=') {
            Some((k, v)) => (k.trim().to_string(), v.trim().to_string()),
            None => (part.trim().to_string(), String::new()),
        })
        .collect()
}

/// `<key>[=<value>]:<effect>` specs separated by commas (upstream taints.ParseTaints).
fn parse_taints(s: &str) -> Result<Vec<Taint>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|spec| {
            let (kv, effect) = spec
                .split_once(':')
                .filter(|(_, e)| !e.contains(':'))
                .ok_or_else(|| format!("invalid taint spec: {spec}"))?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(format!(
                    "invalid taint effect: {effect}, unsupported taint effect"
                ));
            }
            let (key, value) = match kv.split_once('=') {
                Some((_, v)) if v.contains('=') => {
                    return Err(format!("invalid taint spec: {spec}"))
                }
                Some((k, v)) => (k, v),
                None => (kv, ""),
            };
            if key.is_empty() {
                return Err(format!("invalid taint spec: {spec}"));
            }
            Ok(Taint {
                key: key.to_string(),
                value: value.to_string(),
                effect: effect.to_string(),
                time_added: None,
            })
        })
        .collect()
}

/// Help text: a header, then one line per flag, sorted by name as pflag prints them.
pub fn usage() -> String {
    let mut specs: Vec<&Spec> = SPECS.iter().collect();
    specs.sort_by_key(|s| s.name);
    let heads: Vec<String> = specs
        .iter()
        .map(|s| {
            let short = match s.short {
                Some(c) => format!("  -{c}, "),
                None => "      ".to_string(),
            };
            let ty = s.kind.type_name();
            if ty.is_empty() {
                format!("{short}--{}", s.name)
            } else {
                format!("{short}--{} {ty}", s.name)
            }
        })
        .collect();
    let width = heads.iter().map(String::len).max().unwrap_or(0);
    let mut out = String::from("Usage:\n  rkubelet [flags]\n\nFlags:\n");
    for (spec, head) in specs.iter().zip(heads) {
        out.push_str(&format!("{head:width$}   {}", spec.usage));
        if let Some(msg) = spec.deprecation {
            out.push_str(&format!(" (DEPRECATED: {msg})"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<KubeletFlags, FlagError> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    fn ok(args: &[&str]) -> KubeletFlags {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn err(args: &[&str]) -> String {
        parse(args).expect_err("expected an error").to_string()
    }

    #[test]
    fn defaults() {
        let f = ok(&[]);
        assert_eq!(f.root_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(f.cert_dir, PathBuf::from("/var/lib/kubelet/pki"));
        assert_eq!(f.verbosity, 0);
        assert!(f.config.is_none() && f.overrides.is_empty());
        assert!(f.deprecation_warnings.is_empty());
    }

    #[test]
    fn value_forms() {
        let f = ok(&[
            "--config=/var/lib/kubelet/config.yaml",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--hostname_override",
            "node-a",
            "--node-ip=10.0.0.5",
            "--node-labels=a=1, b = 2",
            "--node-labels",
            "c",
            "--root-dir=/data/kubelet",
        ]);
        assert_eq!(
            f.config,
            Some(PathBuf::from("/var/lib/kubelet/config.yaml"))
        );
        assert_eq!(
            f.kubeconfig,
            Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
        );
        assert_eq!(
            f.bootstrap_kubeconfig,
            Some(PathBuf::from("/etc/kubernetes/bootstrap-kubelet.conf"))
        );
        assert_eq!(f.hostname_override.as_deref(), Some("node-a"));
        assert_eq!(f.node_ip.as_deref(), Some("10.0.0.5"));
        let labels: Vec<_> = f
            .node_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(labels, ["a=1", "b=2", "c="]);
        assert_eq!(f.root_dir, PathBuf::from("/data/kubelet"));
        // A value starting with '-' is still consumed by a non-bool flag, as in pflag.
        assert_eq!(
            ok(&["--hostname-override", "-x"])
                .hostname_override
                .as_deref(),
            Some("-x")
        );
    }

    #[test]
    fn verbosity_forms() {
        for args in [
            &["-v=3"][..],
            &["-v", "3"],
            &["-v3"],
            &["--v=3"],
            &["--v", "3"],
        ] {
            let f = ok(args);
            assert_eq!(f.verbosity, 3, "{args:?}");
            assert_eq!(
                f.overrides,
                vec![ConfigOverride {
                    flag: "v",
                    value: FlagValue::Level(3)
                }]
            );
        }
        assert_eq!(ok(&["--v=1000"]).verbosity, 255);
        assert_eq!(
            err(&["-v", "x"]),
            "invalid argument \"x\" for \"-v, --v\" flag: strconv.ParseUint: parsing \"x\": invalid syntax"
        );
        assert_eq!(err(&["-v"]), "flag needs an argument: 'v' in -v");
        let mut cfg = KubeletConfiguration::default();
        ok(&["--v=4"]).apply(&mut cfg);
        assert_eq!(cfg.logging.verbosity, 4);
    }

    #[test]
    fn bool_forms() {
        let f = ok(&[
            "--fail-swap-on=false",
            "--register-node",
            "--cgroups-per-qos=0",
        ]);
        let get = |name| {
            f.overrides
                .iter()
                .find(|o| o.flag == name)
                .map(|o| o.value.clone())
        };
        assert_eq!(get("fail-swap-on"), Some(FlagValue::Bool(false)));
        assert_eq!(get("register-node"), Some(FlagValue::Bool(true)));
        assert_eq!(get("cgroups-per-qos"), Some(FlagValue::Bool(false)));
        assert_eq!(f.register_node, Some(true));
        // A bare bool never consumes the next argument: "false" becomes a positional.
        assert_eq!(err(&["--fail-swap-on", "false"]), "unknown command false");
        assert_eq!(
            err(&["--fail-swap-on=maybe"]),
            "invalid argument \"maybe\" for \"--fail-swap-on\" flag: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        );
    }

    #[test]
    fn error_texts() {
        assert_eq!(err(&["--foo"]), "unknown flag: --foo");
        assert_eq!(err(&["--foo=bar"]), "unknown flag: --foo");
        assert_eq!(err(&["-x"]), "unknown shorthand flag: 'x' in -x");
        assert_eq!(
            err(&["--kubeconfig"]),
            "flag needs an argument: --kubeconfig"
        );
        assert_eq!(err(&["--max-pods"]), "flag needs an argument: --max-pods");
        assert_eq!(
            err(&["--max-pods=many"]),
            "invalid argument \"many\" for \"--max-pods\" flag: strconv.ParseInt: parsing \"many\": invalid syntax"
        );
        assert_eq!(
            err(&["--port=99999999999"]),
            "invalid argument \"99999999999\" for \"--port\" flag: strconv.ParseInt: parsing \"99999999999\": value out of range"
        );
        assert_eq!(
            err(&["--sync-frequency=10"]),
            "invalid argument \"10\" for \"--sync-frequency\" flag: time: missing unit in duration \"10\""
        );
        assert_eq!(
            err(&["--address=not-an-ip"]),
            "invalid argument \"not-an-ip\" for \"--address\" flag: \"not-an-ip\" is not a valid IP address"
        );
        assert_eq!(err(&["---config=x"]), "bad flag syntax: ---config=x");
        assert_eq!(err(&["run"]), "unknown command run");
        assert_eq!(err(&["--", "--config=x"]), "unknown command --config=x");
    }

    #[test]
    fn help_and_version() {
        assert_eq!(parse(&["--help"]), Err(FlagError::Help));
        assert_eq!(parse(&["-h"]), Err(FlagError::Help));
        // Parse errors win over help, as in the Go kubelet.
        assert_eq!(err(&["-h", "--nope"]), "unknown flag: --nope");
        assert_eq!(ok(&["--version"]).version, Some(VersionMode::Plain));
        assert_eq!(ok(&["--version=true"]).version, Some(VersionMode::Plain));
        assert_eq!(ok(&["--version=raw"]).version, Some(VersionMode::Raw));
        assert_eq!(ok(&["--version=false"]).version, None);
        assert_eq!(err(&["--version", "raw"]), "unknown command raw");
        let text = usage();
        assert!(text.contains("  -h, --help "), "{text}");
        assert!(text.contains("      --config string "), "{text}");
        assert!(text.contains("  -v, --v Level "), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.contains("--")).count(),
            SPECS.len()
        );
    }

    #[test]
    fn credential_provider_flags_reach_the_config_without_deprecation() {
        let f = ok(&[
            "--image-credential-provider-config=/etc/kubernetes/credential-providers.yaml",
            "--image_credential_provider_bin_dir",
            "/usr/libexec/kubelet/credential-providers",
        ]);
        assert!(
            f.deprecation_warnings.is_empty(),
            "{:?}",
            f.deprecation_warnings
        );
        let mut cfg = KubeletConfiguration::default();
        f.apply(&mut cfg);
        assert_eq!(
            cfg.image_credential_provider_config,
            "/etc/kubernetes/credential-providers.yaml"
        );
        assert_eq!(
            cfg.image_credential_provider_bin_dir,
            "/usr/libexec/kubelet/credential-providers"
        );
        // Command line only: never written out as config fields.
        let v = serde_json::to_value(&cfg).unwrap();
        assert!(v.get("imageCredentialProviderConfig").is_none());
    }

    #[test]
    fn deprecated_flags_warn_with_upstream_text() {
        let f = ok(&[
            "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
            "--provider-id=aws:///i-123",
        ]);
        assert_eq!(
            f.deprecation_warnings,
            vec![
                "Flag --container-runtime-endpoint has been deprecated, This parameter should be set via the config file specified by the Kubelet's --config flag. See https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information.".to_string(),
                "Flag --pod-infra-container-image has been deprecated, will be removed in 1.35. Image garbage collector will get sandbox image information from CRI.".to_string(),
            ]
        );
        assert_eq!(
            f.pod_infra_container_image.as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
        // Removed flags are accepted (value consumed) with a no-effect warning.
        let f = ok(&[
            "--network-plugin",
            "cni",
            "--container-runtime=remote",
            "--cni-bin-dir=/opt/cni/bin",
        ]);
        assert_eq!(f.deprecation_warnings.len(), 3);
        assert!(f.deprecation_warnings[0].starts_with("Flag --network-plugin has been removed"));
        assert!(f.overrides.is_empty());
    }

    #[test]
    fn manifest_url_headers_accumulate_as_upstreams_multimap() {
        let mut cfg = KubeletConfiguration::default();
        cfg.static_pod_url_header
            .insert("Old".into(), vec!["gone".into()]);
        let f = ok(&[
            "--manifest-url=http://127.0.0.1:8080/pods",
            "--manifest-url-header",
            "a:hello, b : again,c:world",
            "--manifest-url-header=b:beautiful",
        ]);
        f.apply(&mut cfg);
        assert_eq!(cfg.static_pod_url, "http://127.0.0.1:8080/pods");
        let h: Vec<String> = cfg
            .static_pod_url_header
            .iter()
            .map(|(k, v)| format!("{k}={}", v.join("|")))
            .collect();
        assert_eq!(h, ["a=hello", "b=again|beautiful", "c=world"]);
        assert!(parse_args(["--manifest-url-header=novalue".to_string()]).is_err());
    }

    #[test]
    fn flags_override_file() {
        let (mut cfg, _) = KubeletConfiguration::load_str(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             maxPods: 50\nstaticPodPath: /etc/kubernetes/manifests\nfailSwapOn: true\n\
             featureGates:\n  ImageVolume: true\n  KubeletPSI: true\nclusterDNS: [10.0.0.1]\nsyncFrequency: 30s\n",
        )
        .unwrap();
        let f = ok(&[
            "--max-pods=20",
            "--pod-manifest-path",
            "/srv/manifests",
            "--fail-swap-on=false",
            "--feature-gates=KubeletPSI=false,PodCertificateRequest=true",
            "--cluster-dns=10.96.0.10",
            "--cluster-dns=10.96.0.11",
            "--eviction-hard=memory.available<200Mi",
            "--read-only-port=0",
            "--register-with-taints=dedicated=infra:NoSchedule,gpu:NoExecute",
            "--anonymous-auth=false",
            "--authorization-mode=Webhook",
            "--container-runtime-endpoint=unix:///var/run/crio/crio.sock",
        ]);
        f.apply(&mut cfg);
        assert_eq!(cfg.max_pods, 20);
        assert_eq!(cfg.static_pod_path, "/srv/manifests");
        assert!(!cfg.fail_swap_on);
        let gates: Vec<_> = cfg
            .feature_gates
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            gates,
            [
                "ImageVolume=true",
                "KubeletPSI=false",
                "PodCertificateRequest=true"
            ]
        );
        assert_eq!(cfg.cluster_dns, ["10.96.0.10", "10.96.0.11"]);
        assert_eq!(cfg.eviction_hard.len(), 1);
        assert_eq!(cfg.eviction_hard["memory.available"], "200Mi");
        assert_eq!(cfg.register_with_taints.len(), 2);
        assert_eq!(cfg.register_with_taints[0].key, "dedicated");
        assert_eq!(cfg.register_with_taints[0].value, "infra");
        assert_eq!(cfg.register_with_taints[1].effect, "NoExecute");
        assert_eq!(
            cfg.container_runtime_endpoint,
            "unix:///var/run/crio/crio.sock"
        );
        // Fields not given as flags keep the file's value.
        assert_eq!(cfg.sync_frequency, GoDuration::from_secs(30));
        assert!(f.overrides_flag("max-pods"));
        assert!(!f.overrides_flag("sync-frequency"));
        cfg.validate().unwrap();

        // Without --config, flags apply over the legacy command-line defaults.
        let mut cfg = KubeletConfiguration::default();
        ok(&["--read-only-port=0"]).apply(&mut cfg);
        assert_eq!(cfg.read_only_port, 0);
    }

    #[test]
    fn value_parsers() {
        assert_eq!(parse_int("0x10", 32), Ok(16));
        assert_eq!(parse_int("010", 32), Ok(8));
        assert_eq!(parse_int("-2147483648", 32), Ok(-2147483648));
        assert!(parse_int("2147483648", 32).is_err());
        assert!(parse_int("1_000", 32).is_err());
        assert_eq!(parse_int("0x1_0", 32), Ok(16));
        assert_eq!(parse_int("-1", 64), Ok(-1));
        assert!(parse_int("+-1", 64).is_err());
        assert_eq!(
            parse_bool_map("a=true,b=f"),
            Ok(BTreeMap::from([("a".into(), true), ("b".into(), false)]))
        );
        assert_eq!(parse_bool_map("a"), Err("missing bool value for a".into()));
        assert_eq!(
            parse_pairs("cpu=1", '<'),
            Err("malformed pair, expect string<string".into())
        );
        assert!(parse_taints("k=v").is_err());
        assert!(parse_taints("k=v:Sometimes").is_err());
        assert_eq!(parse_taints(""), Ok(Vec::new()));
        assert_eq!(
            ok(&["--cluster-dns="]).overrides[0].value,
            FlagValue::List(Vec::new())
        );
    }

    #[test]
    fn v1_34_config_flags_set_their_fields() {
        let (mut cfg, _) = KubeletConfiguration::load_str(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\n\
             topologyManagerPolicyOptions:\n  prefer-closest-numa-nodes: \"true\"\n\
             reservedMemory:\n- numaNode: 3\n  limits:\n    memory: 1Gi\n\
             kernelMemcgNotification: true\nfailCgroupV1: true\n",
        )
        .unwrap();
        let f = ok(&[
            "--contention-profiling",
            "--kernel-memcg-notification=false",
            "--fail-cgroupv1=false",
            // NoSplit: one pair per use, commas stay in the value.
            "--cpu-manager-policy-options=distribute-cpus-across-numa=true,x",
            "--cpu-manager-policy-options",
            "align-by-socket = true",
            "--topology-manager-policy-options=max-allowable-numa-nodes=12,prefer-closest-numa-nodes=true",
            "--reserved-memory",
            "0:memory=1Gi,hugepages-1M=2Gi;1:memory=2Gi",
            "--reserved-memory=2:hugepages-2Mi=64Mi",
        ]);
        f.apply(&mut cfg);
        assert!(cfg.enable_contention_profiling);
        assert!(!cfg.kernel_memcg_notification);
        assert!(!cfg.fail_cgroup_v1);
        let pairs = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
        };
        // The first use replaces the file's map; repeats add.
        assert_eq!(
            pairs(&cfg.cpu_manager_policy_options),
            ["align-by-socket=true", "distribute-cpus-across-numa=true,x"]
        );
        assert_eq!(
            pairs(&cfg.topology_manager_policy_options),
            [
                "max-allowable-numa-nodes=12",
                "prefer-closest-numa-nodes=true"
            ]
        );
        let rm: Vec<String> = cfg
            .reserved_memory
            .iter()
            .map(|r| format!("{}:{}", r.numa_node, pairs(&r.limits).join(",")))
            .collect();
        assert_eq!(
            rm,
            [
                "0:hugepages-1M=2Gi,memory=1Gi",
                "1:memory=2Gi",
                "2:hugepages-2Mi=64Mi"
            ]
        );
        // fail-cgroupv1 is not deprecated upstream; the others are.
        assert_eq!(f.deprecation_warnings.len(), 7);
        assert!(!f
            .deprecation_warnings
            .iter()
            .any(|w| w.contains("--fail-cgroupv1")));

        // runonce reaches runOnce, which validation rejects as upstream's does.
        let mut cfg = KubeletConfiguration::default();
        ok(&["--runonce"]).apply(&mut cfg);
        assert!(cfg.run_once);
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("Runonce mode has been deprecated"), "{e}");
    }

    #[test]
    fn reserved_memory_errors_are_upstreams() {
        let e = |v: &str| err(&[&format!("--reserved-memory={v}")]);
        assert_eq!(
            e("memory=1Gi"),
            "invalid argument \"memory=1Gi\" for \"--reserved-memory\" flag: the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got memory=1Gi"
        );
        assert!(e("x:memory=1Gi")
            .ends_with("failed to convert the NUMA node ID, exptected integer, got x"));
        assert!(e("0:memory").ends_with(
            "the reserved limit has incorrect value, expected type=quantatity, got memory"
        ));
        assert!(e("0:cpu=1").ends_with("memory type conversion error, unknown type: \"cpu\""));
        assert!(e("0:memory=lots")
            .ends_with("failed to parse the quantatity, expected quantatity, got lots"));
        assert!(e("0:memory=1Gi,").ends_with("expected type=quantatity, got "));
        // An empty value leaves the field alone, and ReservedMemoryVar then
        // has no target: a later use fails.
        let f = ok(&["--reserved-memory="]);
        assert!(f.overrides.is_empty());
        assert_eq!(
            err(&["--reserved-memory=", "--reserved-memory=0:memory=1Gi"]),
            "invalid argument \"0:memory=1Gi\" for \"--reserved-memory\" flag: no target (nil pointer to *[]MemoryReservation"
        );
        assert!(err(&["--cpu-manager-policy-options=full-pcpus-only"])
            .ends_with("malformed pair, expect string=string"));
    }

    #[test]
    fn v1_34_local_flags() {
        let f = ok(&[]);
        assert_eq!(
            (
                f.maximum_dead_containers,
                f.maximum_dead_containers_per_container
            ),
            (-1, 1)
        );
        assert!(f.minimum_container_ttl_duration.is_zero());
        let f = ok(&[
            "--config-dir=/etc/kubernetes/kubelet.conf.d",
            "--seccomp-default",
            "--lock-file",
            "/var/run/lock/kubelet.lock",
            "--exit-on-lock-contention",
            "--minimum-container-ttl-duration=1m",
            "--maximum-dead-containers-per-container=2",
            "--maximum-dead-containers=100",
            "--experimental-mounter-path=/usr/bin/mount",
            "--experimental-allocatable-ignore-eviction",
        ]);
        assert_eq!(
            f.config_dir,
            Some(PathBuf::from("/etc/kubernetes/kubelet.conf.d"))
        );
        assert!(f.seccomp_default && f.exit_on_lock_contention);
        assert_eq!(
            f.lock_file,
            Some(PathBuf::from("/var/run/lock/kubelet.lock"))
        );
        assert_eq!(f.minimum_container_ttl_duration, GoDuration::from_mins(1));
        assert_eq!(f.maximum_dead_containers_per_container, 2);
        assert_eq!(f.maximum_dead_containers, 100);
        assert_eq!(
            f.experimental_mounter_path.as_deref(),
            Some("/usr/bin/mount")
        );
        assert!(f.experimental_allocatable_ignore_eviction);
        assert!(f.overrides.is_empty(), "{:?}", f.overrides);
        let gc =
            "Use --eviction-hard or --eviction-soft instead. Will be removed in a future version.";
        assert_eq!(
            f.deprecation_warnings,
            vec![
                format!("Flag --minimum-container-ttl-duration has been deprecated, {gc}"),
                format!("Flag --maximum-dead-containers-per-container has been deprecated, {gc}"),
                format!("Flag --maximum-dead-containers has been deprecated, {gc}"),
                "Flag --experimental-mounter-path has been deprecated, will be removed in 1.25 or later. in favor of using CSI.".to_string(),
                "Flag --experimental-allocatable-ignore-eviction has been deprecated, will be removed in 1.25 or later.".to_string(),
            ]
        );
        // seccomp-default is a KubeletFlags field upstream: it does not touch
        // the configuration (the kubelet ORs the two).
        let mut cfg = KubeletConfiguration::default();
        f.apply(&mut cfg);
        assert!(!cfg.seccomp_default);
        assert!(err(&["--maximum-dead-containers=x"]).contains("strconv.ParseInt"));
    }

    #[test]
    fn logging_flags_set_the_logging_configuration_as_logsapi_does() {
        // Old code: every one of these was an unknown flag (exit 1).
        let f = parse_args(
            [
                "--vmodule=pleg*=4,,kubelet=2",
                "--vmodule=server=3",
                "--log-flush-frequency=10s",
                "--logging-format=json",
                "--log-json-split-stream",
                "--log-json-info-buffer-size=64Ki",
                "--log-text-info-buffer-size=1M",
            ]
            .iter()
            .map(|s| s.to_string()),
        )
        .unwrap();
        let mut cfg = KubeletConfiguration::default();
        f.apply(&mut cfg);
        let l = &cfg.logging;
        let vm: Vec<(&str, u32)> = l
            .vmodule
            .iter()
            .map(|v| (v.file_pattern.as_str(), v.verbosity))
            .collect();
        assert_eq!(vm, [("pleg*", 4), ("kubelet", 2), ("server", 3)]);
        assert_eq!(
            l.flush_frequency.duration.0,
            std::time::Duration::from_secs(10)
        );
        assert_eq!(l.format, "json");
        assert!(l.options.json.split_stream);
        assert_eq!(l.options.json.info_buffer_size, "64Ki");
        assert_eq!(l.options.text.info_buffer_size, "1M");
        // Only the undeprecated two stay quiet.
        let notices: Vec<&str> = f
            .deprecation_warnings
            .iter()
            .map(|w| w.split_whitespace().nth(1).unwrap())
            .collect();
        assert_eq!(
            notices,
            [
                "--logging-format",
                "--log-json-split-stream",
                "--log-json-info-buffer-size",
                "--log-text-info-buffer-size"
            ]
        );
        let err = |a: &str| parse_args([a.to_string()]).unwrap_err().to_string();
        assert!(
            err("--vmodule=a").contains("\"a\" does not have the pattern=N format"),
            "{}",
            err("--vmodule=a")
        );
        assert!(err("--vmodule=a=x").contains("parsing verbosity in \"a=x\""));
        assert!(err("--log-json-info-buffer-size=lots").contains("invalid quantity"));
    }

    #[test]
    fn every_config_flag_maps_to_a_field() {
        let mut cfg = KubeletConfiguration::default();
        for spec in SPECS.iter().filter(|s| s.role == Role::Config) {
            let sample = match spec.kind {
                Kind::Bool => "true",
                Kind::Str => "x",
                Kind::Ip => "127.0.0.1",
                Kind::Int32 | Kind::Int64 | Kind::Level => "1",
                Kind::Duration => "1s",
                Kind::Strings => "a,b",
                Kind::MapBool => "a=true",
                Kind::MapLangle => "a<1",
                Kind::MapString | Kind::MapStringNoSplit | Kind::LabelMap => "a=1",
                Kind::ReservedMemory => "0:memory=1Gi",
                Kind::VModule => "a=1",
                Kind::Quantity => "64Ki",
                Kind::ColonMultimap => "a:1",
                Kind::Taints => "k=v:NoSchedule",
                Kind::Version | Kind::Help => unreachable!("not a config flag"),
            };
            let Ok(Parsed::Value(value)) = parse_value(spec.kind, sample) else {
                panic!("{}: sample does not parse", spec.name)
            };
            let o = ConfigOverride {
                flag: spec.name,
                value,
            };
            assert!(o.apply_to(&mut cfg), "--{} maps to no field", spec.name);
        }
        // Names are unique.
        let mut names: Vec<_> = SPECS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SPECS.len());
    }
}
