//! KubeletConfiguration (kubelet.config.k8s.io/v1beta1): loading, defaulting and validation.
//! Mirrors upstream `staging/src/k8s.io/kubelet/config/v1beta1/types.go`,
//! `pkg/kubelet/apis/config/v1beta1/defaults.go`, `pkg/kubelet/apis/config/validation`
//! and the config-file handling in `cmd/kubelet/app` (targets Kubernetes 1.34).

pub mod dropin;
pub mod duration;
pub mod features;
pub mod flags;
pub mod honesty;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use duration::{format_go_duration, parse_go_duration, GoDuration};
pub use flags::{
    parse_args, usage, ConfigOverride, FlagError, FlagValue, KubeletFlags, VersionMode,
};

/// The only apiVersion upstream registers for KubeletConfiguration.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

/// Upstream `ports.KubeletReadOnlyPort`, used only by the no-`--config` legacy defaults.
pub const LEGACY_READ_ONLY_PORT: i32 = 10255;

pub const AUTHORIZATION_MODE_WEBHOOK: &str = "Webhook";
pub const AUTHORIZATION_MODE_ALWAYS_ALLOW: &str = "AlwaysAllow";

/// Linux hard-eviction defaults (`pkg/kubelet/eviction/defaults_linux.go`), applied by
/// upstream's `loadConfigFile` when a config file leaves `evictionHard` unset.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read kubelet config file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to load kubelet config file {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: Box<ConfigError>,
    },
    #[error("kubelet config is empty")]
    Empty,
    #[error("failed to decode kubelet config: {0}")]
    Decode(String),
    #[error("{}", type_meta_message("kind", found, KIND))]
    WrongKind { found: String },
    #[error("{}", type_meta_message("apiVersion", found, API_VERSION))]
    WrongApiVersion { found: String },
    /// Go-style duration error text, e.g. `time: invalid duration "x"`.
    #[error("{0}")]
    InvalidDuration(String),
    /// Validation failures, formatted like Go's `utilerrors.NewAggregate`.
    #[error("{}", aggregate_message(.0))]
    Invalid(Vec<String>),
    /// `featureGates` names an unknown gate or moves a locked one.
    #[error(transparent)]
    FeatureGates(#[from] features::GateErrors),
}

fn type_meta_message(field: &str, found: &str, want: &str) -> String {
    if found.is_empty() {
        format!("missing {field} in kubelet config, expected {want:?}")
    } else {
        format!("unsupported {field} {found:?} in kubelet config, expected {want:?}")
    }
}

fn aggregate_message(errs: &[String]) -> String {
    match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

type StringMap = BTreeMap<String, String>;

// ---------------------------------------------------------------------------------------------
// Public, fully defaulted configuration.
// Serialization mirrors the v1beta1 JSON tags (omitempty on value fields; upstream pointer
// fields are always present after defaulting) so a future /configz looks like upstream's.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub enable_server: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub static_pod_path: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod_logs_dir: String,
    pub sync_frequency: GoDuration,
    pub file_check_frequency: GoDuration,
    pub http_check_frequency: GoDuration,
    #[serde(rename = "staticPodURL", skip_serializing_if = "String::is_empty")]
    pub static_pod_url: String,
    #[serde(
        rename = "staticPodURLHeader",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub address: String,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub port: i32,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub read_only_port: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_cert_file: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_private_key_file: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_cipher_suites: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_curve_preferences: Vec<i32>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_min_version: String,
    #[serde(skip_serializing_if = "is_false")]
    pub rotate_certificates: bool,
    #[serde(rename = "serverTLSBootstrap", skip_serializing_if = "is_false")]
    pub server_tls_bootstrap: bool,
    pub authentication: KubeletAuthentication,
    pub authorization: KubeletAuthorization,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: i32,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub registry_burst: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image_pull_credentials_verification_policy: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preloaded_images_verification_allowlist: Vec<String>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: i32,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub event_burst: i32,
    pub enable_debugging_handlers: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub enable_contention_profiling: bool,
    pub healthz_port: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub healthz_bind_address: String,
    pub oom_score_adj: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster_domain: String,
    #[serde(rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    pub streaming_connection_idle_timeout: GoDuration,
    pub node_status_update_frequency: GoDuration,
    pub node_status_report_frequency: GoDuration,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub node_lease_duration_seconds: i32,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: GoDuration,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    pub volume_stats_agg_period: GoDuration,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kubelet_cgroups: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub system_cgroups: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cgroup_root: String,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cgroup_driver: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cpu_manager_policy: String,
    #[serde(
        rename = "singleProcessOOMKill",
        skip_serializing_if = "Option::is_none"
    )]
    pub single_process_oom_kill: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_manager_policy_options: StringMap,
    pub cpu_manager_reconcile_period: GoDuration,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub memory_manager_policy: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub topology_manager_policy: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub topology_manager_scope: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topology_manager_policy_options: StringMap,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub qos_reserved: StringMap,
    pub runtime_request_timeout: GoDuration,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hairpin_mode: String,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub max_pods: i32,
    #[serde(rename = "podCIDR", skip_serializing_if = "String::is_empty")]
    pub pod_cidr: String,
    pub pod_pids_limit: i64,
    pub resolv_conf: String,
    #[serde(skip_serializing_if = "is_false")]
    pub run_once: bool,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: GoDuration,
    pub node_status_max_images: i32,
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub max_open_files: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub content_type: String,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: i32,
    #[serde(rename = "kubeAPIBurst", skip_serializing_if = "is_zero_i32")]
    pub kube_api_burst: i32,
    pub serialize_image_pulls: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel_image_pulls: Option<i32>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: StringMap,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: StringMap,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: StringMap,
    pub eviction_pressure_transition_period: GoDuration,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub eviction_max_pod_grace_period: i32,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_minimum_reclaim: StringMap,
    pub merge_default_eviction_settings: bool,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub pods_per_core: i32,
    pub enable_controller_attach_detach: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub protect_kernel_defaults: bool,
    #[serde(rename = "makeIPTablesUtilChains")]
    pub make_iptables_util_chains: bool,
    pub iptables_masquerade_bit: i32,
    pub iptables_drop_bit: i32,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    pub fail_swap_on: bool,
    pub memory_swap: MemorySwapConfiguration,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container_log_max_size: String,
    pub container_log_max_files: i32,
    pub container_log_max_workers: i32,
    pub container_log_monitor_interval: GoDuration,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub config_map_and_secret_change_detection_strategy: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: StringMap,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: StringMap,
    #[serde(
        rename = "reservedSystemCPUs",
        skip_serializing_if = "String::is_empty"
    )]
    pub reserved_system_cpus: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub show_hidden_metrics_for_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub system_reserved_cgroup: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kube_reserved_cgroup: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub enforce_node_allocatable: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_unsafe_sysctls: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub volume_plugin_dir: String,
    #[serde(rename = "providerID", skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
    /// `--image-credential-provider-config`: command line only (upstream's
    /// ContainerRuntimeOptions, not a KubeletConfiguration field), kept here
    /// so flags reach the kubelet with the rest of its settings.
    #[serde(skip)]
    pub image_credential_provider_config: String,
    /// `--image-credential-provider-bin-dir`: command line only, as above.
    #[serde(skip)]
    pub image_credential_provider_bin_dir: String,
    #[serde(skip_serializing_if = "is_false")]
    pub kernel_memcg_notification: bool,
    pub logging: LoggingConfiguration,
    pub enable_system_log_handler: bool,
    pub enable_system_log_query: bool,
    pub shutdown_grace_period: GoDuration,
    pub shutdown_grace_period_critical_pods: GoDuration,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGracePeriodByPodPriority>,
    pub crash_loop_back_off: CrashLoopBackOffConfig,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reserved_memory: Vec<MemoryReservation>,
    pub enable_profiling_handler: bool,
    pub enable_debug_flags_handler: bool,
    pub seccomp_default: bool,
    #[serde(serialize_with = "go_float")]
    pub memory_throttling_factor: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<Taint>,
    pub register_node: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingConfiguration>,
    pub local_storage_capacity_isolation: bool,
    pub container_runtime_endpoint: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image_service_endpoint: String,
    #[serde(rename = "failCgroupV1")]
    pub fail_cgroup_v1: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_namespaces: Option<UserNamespaces>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KubeletAuthentication {
    pub x509: KubeletX509Authentication,
    pub webhook: KubeletWebhookAuthentication,
    pub anonymous: KubeletAnonymousAuthentication,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KubeletX509Authentication {
    #[serde(rename = "clientCAFile", skip_serializing_if = "String::is_empty")]
    pub client_ca_file: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KubeletWebhookAuthentication {
    pub enabled: bool,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KubeletAnonymousAuthentication {
    pub enabled: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KubeletAuthorization {
    /// `Webhook` or `AlwaysAllow`; kept as a string so unknown values reach validation.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
    pub webhook: KubeletWebhookAuthorization,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KubeletWebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: GoDuration,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySwapConfiguration {
    /// `""`/`NoSwap` or `LimitedSwap`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub swap_behavior: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrashLoopBackOffConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_container_restart_period: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownGracePeriodByPodPriority {
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub shutdown_grace_period_seconds: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReservation {
    #[serde(default)]
    pub numa_node: i32,
    #[serde(default)]
    pub limits: StringMap,
}

/// A core/v1 Taint as used by `registerWithTaints`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    #[serde(default)]
    pub effect: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TracingConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_rate_per_million: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserNamespaces {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids_per_pod: Option<i64>,
}

/// component-base `logsapi.LoggingConfiguration` (v1).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggingConfiguration {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub format: String,
    pub flush_frequency: FlushFrequency,
    pub verbosity: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    pub options: LoggingFormatOptions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VModuleItem {
    #[serde(default)]
    pub file_pattern: String,
    #[serde(default)]
    pub verbosity: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggingFormatOptions {
    #[serde(default)]
    pub text: OutputRoutingOptions,
    #[serde(default)]
    pub json: OutputRoutingOptions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputRoutingOptions {
    #[serde(default, skip_serializing_if = "is_false")]
    pub split_stream: bool,
    /// A resource quantity such as `"0"` or `"64Ki"`; upstream defaults it to `"0"`.
    #[serde(default, deserialize_with = "quantity_string")]
    pub info_buffer_size: String,
}

/// Accepts a quantity written either as a string or as a bare number.
fn quantity_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a resource quantity")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(V)
}

/// `logsapi.TimeOrMetaDuration`: accepts `"5s"` or integer nanoseconds and
/// serializes back in the form it was given (defaults serialize as a string).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushFrequency {
    pub duration: GoDuration,
    pub serialize_as_string: bool,
}

impl Serialize for FlushFrequency {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.serialize_as_string {
            self.duration.serialize(s)
        } else {
            s.serialize_u64(u64::try_from(self.duration.0.as_nanos()).unwrap_or(u64::MAX))
        }
    }
}

impl<'de> Deserialize<'de> for FlushFrequency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FlushFrequency;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string or integer nanoseconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FlushFrequency, E> {
                Ok(FlushFrequency {
                    duration: v.parse().map_err(E::custom)?,
                    serialize_as_string: true,
                })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FlushFrequency, E> {
                Ok(FlushFrequency {
                    duration: GoDuration(std::time::Duration::from_nanos(v)),
                    serialize_as_string: false,
                })
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FlushFrequency, E> {
                let v = u64::try_from(v).map_err(|_| {
                    E::custom(format!("negative flushFrequency {v} is not allowed"))
                })?;
                self.visit_u64(v)
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Raw (as-written) document. Every field is optional so defaulting can tell "absent" from
// "explicit zero" exactly where upstream can (pointer fields); `extra` catches unknown fields.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKubeletConfiguration {
    kind: Option<String>,
    api_version: Option<String>,
    enable_server: Option<bool>,
    static_pod_path: Option<String>,
    pod_logs_dir: Option<String>,
    sync_frequency: Option<GoDuration>,
    file_check_frequency: Option<GoDuration>,
    http_check_frequency: Option<GoDuration>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    address: Option<String>,
    port: Option<i32>,
    read_only_port: Option<i32>,
    tls_cert_file: Option<String>,
    tls_private_key_file: Option<String>,
    tls_cipher_suites: Option<Vec<String>>,
    tls_curve_preferences: Option<Vec<i32>>,
    tls_min_version: Option<String>,
    rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<bool>,
    authentication: Option<RawAuthentication>,
    authorization: Option<RawAuthorization>,
    #[serde(rename = "registryPullQPS")]
    registry_pull_qps: Option<i32>,
    registry_burst: Option<i32>,
    image_pull_credentials_verification_policy: Option<String>,
    preloaded_images_verification_allowlist: Option<Vec<String>>,
    #[serde(rename = "eventRecordQPS")]
    event_record_qps: Option<i32>,
    event_burst: Option<i32>,
    enable_debugging_handlers: Option<bool>,
    enable_contention_profiling: Option<bool>,
    healthz_port: Option<i32>,
    healthz_bind_address: Option<String>,
    oom_score_adj: Option<i32>,
    cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<Vec<String>>,
    streaming_connection_idle_timeout: Option<GoDuration>,
    node_status_update_frequency: Option<GoDuration>,
    node_status_report_frequency: Option<GoDuration>,
    node_lease_duration_seconds: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<GoDuration>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<GoDuration>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i32>,
    volume_stats_agg_period: Option<GoDuration>,
    kubelet_cgroups: Option<String>,
    system_cgroups: Option<String>,
    cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<bool>,
    cgroup_driver: Option<String>,
    cpu_manager_policy: Option<String>,
    #[serde(rename = "singleProcessOOMKill")]
    single_process_oom_kill: Option<bool>,
    cpu_manager_policy_options: Option<StringMap>,
    cpu_manager_reconcile_period: Option<GoDuration>,
    memory_manager_policy: Option<String>,
    topology_manager_policy: Option<String>,
    topology_manager_scope: Option<String>,
    topology_manager_policy_options: Option<StringMap>,
    qos_reserved: Option<StringMap>,
    runtime_request_timeout: Option<GoDuration>,
    hairpin_mode: Option<String>,
    max_pods: Option<i32>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    pod_pids_limit: Option<i64>,
    resolv_conf: Option<String>,
    run_once: Option<bool>,
    #[serde(rename = "cpuCFSQuota")]
    cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    cpu_cfs_quota_period: Option<GoDuration>,
    node_status_max_images: Option<i32>,
    max_open_files: Option<i64>,
    content_type: Option<String>,
    #[serde(rename = "kubeAPIQPS")]
    kube_api_qps: Option<i32>,
    #[serde(rename = "kubeAPIBurst")]
    kube_api_burst: Option<i32>,
    serialize_image_pulls: Option<bool>,
    max_parallel_image_pulls: Option<i32>,
    eviction_hard: Option<StringMap>,
    eviction_soft: Option<StringMap>,
    eviction_soft_grace_period: Option<StringMap>,
    eviction_pressure_transition_period: Option<GoDuration>,
    eviction_max_pod_grace_period: Option<i32>,
    eviction_minimum_reclaim: Option<StringMap>,
    merge_default_eviction_settings: Option<bool>,
    pods_per_core: Option<i32>,
    enable_controller_attach_detach: Option<bool>,
    protect_kernel_defaults: Option<bool>,
    #[serde(rename = "makeIPTablesUtilChains")]
    make_iptables_util_chains: Option<bool>,
    iptables_masquerade_bit: Option<i32>,
    iptables_drop_bit: Option<i32>,
    feature_gates: Option<BTreeMap<String, bool>>,
    fail_swap_on: Option<bool>,
    memory_swap: Option<RawMemorySwap>,
    container_log_max_size: Option<String>,
    container_log_max_files: Option<i32>,
    container_log_max_workers: Option<i32>,
    container_log_monitor_interval: Option<GoDuration>,
    config_map_and_secret_change_detection_strategy: Option<String>,
    system_reserved: Option<StringMap>,
    kube_reserved: Option<StringMap>,
    #[serde(rename = "reservedSystemCPUs")]
    reserved_system_cpus: Option<String>,
    show_hidden_metrics_for_version: Option<String>,
    system_reserved_cgroup: Option<String>,
    kube_reserved_cgroup: Option<String>,
    enforce_node_allocatable: Option<Vec<String>>,
    allowed_unsafe_sysctls: Option<Vec<String>>,
    volume_plugin_dir: Option<String>,
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
    kernel_memcg_notification: Option<bool>,
    logging: Option<RawLogging>,
    enable_system_log_handler: Option<bool>,
    enable_system_log_query: Option<bool>,
    shutdown_grace_period: Option<GoDuration>,
    shutdown_grace_period_critical_pods: Option<GoDuration>,
    shutdown_grace_period_by_pod_priority: Option<Vec<ShutdownGracePeriodByPodPriority>>,
    crash_loop_back_off: Option<CrashLoopBackOffConfig>,
    reserved_memory: Option<Vec<MemoryReservation>>,
    enable_profiling_handler: Option<bool>,
    enable_debug_flags_handler: Option<bool>,
    seccomp_default: Option<bool>,
    memory_throttling_factor: Option<f64>,
    register_with_taints: Option<Vec<Taint>>,
    register_node: Option<bool>,
    tracing: Option<TracingConfiguration>,
    local_storage_capacity_isolation: Option<bool>,
    container_runtime_endpoint: Option<String>,
    image_service_endpoint: Option<String>,
    #[serde(rename = "failCgroupV1")]
    fail_cgroup_v1: Option<bool>,
    user_namespaces: Option<UserNamespaces>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct RawAuthentication {
    x509: Option<RawX509>,
    webhook: Option<RawWebhookAuthn>,
    anonymous: Option<RawAnonymous>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct RawX509 {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<String>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct RawWebhookAuthn {
    enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    cache_ttl: Option<GoDuration>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct RawAnonymous {
    enabled: Option<bool>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct RawAuthorization {
    mode: Option<String>,
    webhook: Option<RawWebhookAuthz>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct RawWebhookAuthz {
    #[serde(rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: Option<GoDuration>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: Option<GoDuration>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMemorySwap {
    swap_behavior: Option<String>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogging {
    format: Option<String>,
    flush_frequency: Option<FlushFrequency>,
    verbosity: Option<u32>,
    vmodule: Option<Vec<VModuleItem>>,
    options: Option<LoggingFormatOptions>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

fn push_unknown(out: &mut Vec<String>, prefix: &str, extra: &BTreeMap<String, serde_json::Value>) {
    // Same wording as upstream's strict-decoding error, which it logs before decoding leniently.
    out.extend(
        extra
            .keys()
            .map(|k| format!("unknown field \"{prefix}{k}\"")),
    );
}

impl RawKubeletConfiguration {
    fn unknown_fields(&self) -> Vec<String> {
        let mut out = Vec::new();
        push_unknown(&mut out, "", &self.extra);
        if let Some(a) = &self.authentication {
            push_unknown(&mut out, "authentication.", &a.extra);
            if let Some(x) = &a.x509 {
                push_unknown(&mut out, "authentication.x509.", &x.extra);
            }
            if let Some(w) = &a.webhook {
                push_unknown(&mut out, "authentication.webhook.", &w.extra);
            }
            if let Some(an) = &a.anonymous {
                push_unknown(&mut out, "authentication.anonymous.", &an.extra);
            }
        }
        if let Some(a) = &self.authorization {
            push_unknown(&mut out, "authorization.", &a.extra);
            if let Some(w) = &a.webhook {
                push_unknown(&mut out, "authorization.webhook.", &w.extra);
            }
        }
        if let Some(m) = &self.memory_swap {
            push_unknown(&mut out, "memorySwap.", &m.extra);
        }
        if let Some(l) = &self.logging {
            push_unknown(&mut out, "logging.", &l.extra);
        }
        out
    }

    /// Port of upstream `SetDefaults_KubeletConfiguration`: value fields are defaulted when
    /// absent *or* zero; pointer fields only when absent, so explicit `false`/`0` survive.
    fn apply_defaults(self) -> KubeletConfiguration {
        fn dur(v: Option<GoDuration>, default: GoDuration) -> GoDuration {
            v.filter(|d| !d.is_zero()).unwrap_or(default)
        }
        fn text(v: Option<String>, default: &str) -> String {
            v.filter(|s| !s.is_empty())
                .unwrap_or_else(|| default.to_string())
        }
        fn int(v: Option<i32>, default: i32) -> i32 {
            v.filter(|n| *n != 0).unwrap_or(default)
        }

        let gates = self.feature_gates.unwrap_or_default();
        let gate_on = |name: &str| gates.get(name) == Some(&true);

        let authn = self.authentication.unwrap_or_default();
        let x509 = authn.x509.unwrap_or_default();
        let webhook_authn = authn.webhook.unwrap_or_default();
        let anonymous = authn.anonymous.unwrap_or_default();
        let authz = self.authorization.unwrap_or_default();
        let webhook_authz = authz.webhook.unwrap_or_default();

        // Report frequency follows an explicitly set update frequency (backward compatibility).
        let update_freq = self.node_status_update_frequency.filter(|d| !d.is_zero());
        let report_freq = self
            .node_status_report_frequency
            .filter(|d| !d.is_zero())
            .or(update_freq)
            .unwrap_or(GoDuration::from_mins(5));

        let max_parallel = self.max_parallel_image_pulls;
        // Upstream defaults to serial pulls; rkubelet pulls in parallel
        // (bounded by images::DEFAULT_PARALLEL_PULLS) unless serial pulls
        // are asked for, so one slow image never holds up other pods.
        let serialize_image_pulls = self
            .serialize_image_pulls
            .unwrap_or(max_parallel.is_some_and(|n| n < 2));

        let logging = self.logging.unwrap_or_default();
        let flush_frequency = match logging.flush_frequency {
            Some(f) if !f.duration.is_zero() => f,
            _ => FlushFrequency {
                duration: GoDuration::from_secs(5),
                serialize_as_string: true,
            },
        };
        let mut log_options = logging.options.unwrap_or_default();
        for routing in [&mut log_options.text, &mut log_options.json] {
            if routing.info_buffer_size.is_empty() {
                routing.info_buffer_size = "0".to_string();
            }
        }

        let mut crash_loop_back_off = self.crash_loop_back_off.unwrap_or_default();
        if gate_on("KubeletCrashLoopBackOffMax")
            && crash_loop_back_off.max_container_restart_period.is_none()
        {
            crash_loop_back_off.max_container_restart_period = Some(GoDuration::from_secs(300));
        }
        let mut image_pull_policy = self
            .image_pull_credentials_verification_policy
            .unwrap_or_default();
        if gate_on("KubeletEnsureSecretPulledImages") && image_pull_policy.is_empty() {
            image_pull_policy = "NeverVerifyPreloadedImages".to_string();
        }

        KubeletConfiguration {
            enable_server: self.enable_server.unwrap_or(true),
            static_pod_path: self.static_pod_path.unwrap_or_default(),
            pod_logs_dir: text(self.pod_logs_dir, "/var/log/pods"),
            sync_frequency: dur(self.sync_frequency, GoDuration::from_mins(1)),
            file_check_frequency: dur(self.file_check_frequency, GoDuration::from_secs(20)),
            http_check_frequency: dur(self.http_check_frequency, GoDuration::from_secs(20)),
            static_pod_url: self.static_pod_url.unwrap_or_default(),
            static_pod_url_header: self.static_pod_url_header.unwrap_or_default(),
            address: text(self.address, "0.0.0.0"),
            port: int(self.port, 10250),
            // No defaulting upstream: 0 (disabled) unless set.
            read_only_port: self.read_only_port.unwrap_or(0),
            tls_cert_file: self.tls_cert_file.unwrap_or_default(),
            tls_private_key_file: self.tls_private_key_file.unwrap_or_default(),
            tls_cipher_suites: self.tls_cipher_suites.unwrap_or_default(),
            tls_curve_preferences: self.tls_curve_preferences.unwrap_or_default(),
            tls_min_version: self.tls_min_version.unwrap_or_default(),
            rotate_certificates: self.rotate_certificates.unwrap_or(false),
            server_tls_bootstrap: self.server_tls_bootstrap.unwrap_or(false),
            authentication: KubeletAuthentication {
                x509: KubeletX509Authentication {
                    client_ca_file: x509.client_ca_file.unwrap_or_default(),
                },
                webhook: KubeletWebhookAuthentication {
                    enabled: webhook_authn.enabled.unwrap_or(true),
                    cache_ttl: dur(webhook_authn.cache_ttl, GoDuration::from_mins(2)),
                },
                anonymous: KubeletAnonymousAuthentication {
                    enabled: anonymous.enabled.unwrap_or(false),
                },
            },
            authorization: KubeletAuthorization {
                mode: text(authz.mode, AUTHORIZATION_MODE_WEBHOOK),
                webhook: KubeletWebhookAuthorization {
                    cache_authorized_ttl: dur(
                        webhook_authz.cache_authorized_ttl,
                        GoDuration::from_mins(5),
                    ),
                    cache_unauthorized_ttl: dur(
                        webhook_authz.cache_unauthorized_ttl,
                        GoDuration::from_secs(30),
                    ),
                },
            },
            registry_pull_qps: self.registry_pull_qps.unwrap_or(5),
            registry_burst: int(self.registry_burst, 10),
            image_pull_credentials_verification_policy: image_pull_policy,
            preloaded_images_verification_allowlist: self
                .preloaded_images_verification_allowlist
                .unwrap_or_default(),
            event_record_qps: self.event_record_qps.unwrap_or(50),
            event_burst: int(self.event_burst, 100),
            enable_debugging_handlers: self.enable_debugging_handlers.unwrap_or(true),
            enable_contention_profiling: self.enable_contention_profiling.unwrap_or(false),
            healthz_port: self.healthz_port.unwrap_or(10248),
            healthz_bind_address: text(self.healthz_bind_address, "127.0.0.1"),
            // qos.KubeletOOMScoreAdj
            oom_score_adj: self.oom_score_adj.unwrap_or(-999),
            cluster_domain: self.cluster_domain.unwrap_or_default(),
            cluster_dns: self.cluster_dns.unwrap_or_default(),
            streaming_connection_idle_timeout: dur(
                self.streaming_connection_idle_timeout,
                GoDuration::from_mins(240),
            ),
            node_status_update_frequency: update_freq.unwrap_or(GoDuration::from_secs(10)),
            node_status_report_frequency: report_freq,
            node_lease_duration_seconds: int(self.node_lease_duration_seconds, 40),
            image_minimum_gc_age: dur(self.image_minimum_gc_age, GoDuration::from_mins(2)),
            image_maximum_gc_age: self.image_maximum_gc_age.unwrap_or_default(),
            image_gc_high_threshold_percent: self.image_gc_high_threshold_percent.unwrap_or(85),
            image_gc_low_threshold_percent: self.image_gc_low_threshold_percent.unwrap_or(80),
            volume_stats_agg_period: dur(self.volume_stats_agg_period, GoDuration::from_mins(1)),
            kubelet_cgroups: self.kubelet_cgroups.unwrap_or_default(),
            system_cgroups: self.system_cgroups.unwrap_or_default(),
            cgroup_root: self.cgroup_root.unwrap_or_default(),
            cgroups_per_qos: self.cgroups_per_qos.unwrap_or(true),
            cgroup_driver: text(self.cgroup_driver, "cgroupfs"),
            cpu_manager_policy: text(self.cpu_manager_policy, "none"),
            single_process_oom_kill: self.single_process_oom_kill,
            cpu_manager_policy_options: self.cpu_manager_policy_options.unwrap_or_default(),
            cpu_manager_reconcile_period: dur(
                self.cpu_manager_reconcile_period,
                GoDuration::from_secs(10),
            ),
            memory_manager_policy: text(self.memory_manager_policy, "None"),
            topology_manager_policy: text(self.topology_manager_policy, "none"),
            topology_manager_scope: text(self.topology_manager_scope, "container"),
            topology_manager_policy_options: self
                .topology_manager_policy_options
                .unwrap_or_default(),
            qos_reserved: self.qos_reserved.unwrap_or_default(),
            runtime_request_timeout: dur(self.runtime_request_timeout, GoDuration::from_mins(2)),
            hairpin_mode: text(self.hairpin_mode, "promiscuous-bridge"),
            max_pods: int(self.max_pods, 110),
            pod_cidr: self.pod_cidr.unwrap_or_default(),
            // nil or negative both mean "node allocatable pid limit".
            pod_pids_limit: self.pod_pids_limit.filter(|n| *n >= 0).unwrap_or(-1),
            // Pointer upstream: an explicit "" disables DNS lookups and is kept.
            resolv_conf: self
                .resolv_conf
                .unwrap_or_else(|| "/etc/resolv.conf".to_string()),
            run_once: self.run_once.unwrap_or(false),
            cpu_cfs_quota: self.cpu_cfs_quota.unwrap_or(true),
            cpu_cfs_quota_period: self
                .cpu_cfs_quota_period
                .unwrap_or(GoDuration::from_millis(100)),
            node_status_max_images: self.node_status_max_images.unwrap_or(50),
            max_open_files: self.max_open_files.filter(|n| *n != 0).unwrap_or(1_000_000),
            content_type: text(self.content_type, "application/vnd.kubernetes.protobuf"),
            kube_api_qps: self.kube_api_qps.unwrap_or(50),
            kube_api_burst: int(self.kube_api_burst, 100),
            serialize_image_pulls,
            max_parallel_image_pulls: max_parallel,
            // evictionHard has no v1beta1 default; see `finish_file_load`.
            eviction_hard: self.eviction_hard.unwrap_or_default(),
            eviction_soft: self.eviction_soft.unwrap_or_default(),
            eviction_soft_grace_period: self.eviction_soft_grace_period.unwrap_or_default(),
            eviction_pressure_transition_period: dur(
                self.eviction_pressure_transition_period,
                GoDuration::from_mins(5),
            ),
            eviction_max_pod_grace_period: self.eviction_max_pod_grace_period.unwrap_or(0),
            eviction_minimum_reclaim: self.eviction_minimum_reclaim.unwrap_or_default(),
            merge_default_eviction_settings: self.merge_default_eviction_settings.unwrap_or(false),
            pods_per_core: self.pods_per_core.unwrap_or(0),
            enable_controller_attach_detach: self.enable_controller_attach_detach.unwrap_or(true),
            protect_kernel_defaults: self.protect_kernel_defaults.unwrap_or(false),
            make_iptables_util_chains: self.make_iptables_util_chains.unwrap_or(true),
            iptables_masquerade_bit: self.iptables_masquerade_bit.unwrap_or(14),
            iptables_drop_bit: self.iptables_drop_bit.unwrap_or(15),
            fail_swap_on: self.fail_swap_on.unwrap_or(true),
            memory_swap: MemorySwapConfiguration {
                swap_behavior: self
                    .memory_swap
                    .and_then(|m| m.swap_behavior)
                    .unwrap_or_default(),
            },
            container_log_max_size: text(self.container_log_max_size, "10Mi"),
            container_log_max_files: self.container_log_max_files.unwrap_or(5),
            container_log_max_workers: self.container_log_max_workers.unwrap_or(1),
            container_log_monitor_interval: self
                .container_log_monitor_interval
                .unwrap_or(GoDuration::from_secs(10)),
            config_map_and_secret_change_detection_strategy: text(
                self.config_map_and_secret_change_detection_strategy,
                "Watch",
            ),
            system_reserved: self.system_reserved.unwrap_or_default(),
            kube_reserved: self.kube_reserved.unwrap_or_default(),
            reserved_system_cpus: self.reserved_system_cpus.unwrap_or_default(),
            show_hidden_metrics_for_version: self
                .show_hidden_metrics_for_version
                .unwrap_or_default(),
            system_reserved_cgroup: self.system_reserved_cgroup.unwrap_or_default(),
            kube_reserved_cgroup: self.kube_reserved_cgroup.unwrap_or_default(),
            // A nil check upstream: an explicit `[]` stays empty.
            enforce_node_allocatable: self
                .enforce_node_allocatable
                .unwrap_or_else(|| vec!["pods".to_string()]),
            allowed_unsafe_sysctls: self.allowed_unsafe_sysctls.unwrap_or_default(),
            volume_plugin_dir: text(
                self.volume_plugin_dir,
                "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/",
            ),
            provider_id: self.provider_id.unwrap_or_default(),
            image_credential_provider_config: String::new(),
            image_credential_provider_bin_dir: String::new(),
            kernel_memcg_notification: self.kernel_memcg_notification.unwrap_or(false),
            logging: LoggingConfiguration {
                format: text(logging.format, "text"),
                flush_frequency,
                verbosity: logging.verbosity.unwrap_or(0),
                vmodule: logging.vmodule.unwrap_or_default(),
                options: log_options,
            },
            enable_system_log_handler: self.enable_system_log_handler.unwrap_or(true),
            enable_system_log_query: self.enable_system_log_query.unwrap_or(false),
            shutdown_grace_period: self.shutdown_grace_period.unwrap_or_default(),
            shutdown_grace_period_critical_pods: self
                .shutdown_grace_period_critical_pods
                .unwrap_or_default(),
            shutdown_grace_period_by_pod_priority: self
                .shutdown_grace_period_by_pod_priority
                .unwrap_or_default(),
            crash_loop_back_off,
            reserved_memory: self.reserved_memory.unwrap_or_default(),
            enable_profiling_handler: self.enable_profiling_handler.unwrap_or(true),
            enable_debug_flags_handler: self.enable_debug_flags_handler.unwrap_or(true),
            seccomp_default: self.seccomp_default.unwrap_or(false),
            memory_throttling_factor: self.memory_throttling_factor.unwrap_or(0.9),
            register_with_taints: self.register_with_taints.unwrap_or_default(),
            register_node: self.register_node.unwrap_or(true),
            tracing: self.tracing,
            local_storage_capacity_isolation: self.local_storage_capacity_isolation.unwrap_or(true),
            container_runtime_endpoint: text(
                self.container_runtime_endpoint,
                "unix:///run/containerd/containerd.sock",
            ),
            image_service_endpoint: self.image_service_endpoint.unwrap_or_default(),
            // 1.34 defaults this to false (later releases flip it to true).
            fail_cgroup_v1: self.fail_cgroup_v1.unwrap_or(false),
            user_namespaces: self.user_namespaces,
            feature_gates: gates,
        }
    }

    fn check_type_meta(&self, require: bool) -> Result<(), ConfigError> {
        match self.kind.as_deref() {
            Some(KIND) => {}
            None if !require => {}
            other => {
                return Err(ConfigError::WrongKind {
                    found: other.unwrap_or_default().to_string(),
                })
            }
        }
        match self.api_version.as_deref() {
            Some(API_VERSION) => Ok(()),
            None if !require => Ok(()),
            other => Err(ConfigError::WrongApiVersion {
                found: other.unwrap_or_default().to_string(),
            }),
        }
    }

    /// Defaulting plus what upstream's `loadConfigFile` adds for config files.
    fn finish_file_load(self) -> KubeletConfiguration {
        let eviction_hard_unset = self.eviction_hard.is_none();
        let mut cfg = self.apply_defaults();
        if eviction_hard_unset {
            cfg.eviction_hard = default_eviction_hard();
        } else if cfg.merge_default_eviction_settings {
            // Signals the file names win; the rest inherit the defaults.
            for (k, v) in DEFAULT_EVICTION_HARD {
                cfg.eviction_hard
                    .entry(k.to_string())
                    .or_insert_with(|| v.to_string());
            }
        }
        cfg
    }
}

/// The Linux `evictionHard` defaults as a map.
pub fn default_eviction_hard() -> StringMap {
    DEFAULT_EVICTION_HARD
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for KubeletConfiguration {
    /// The configuration upstream runs with when no `--config` is given: v1beta1 defaults
    /// plus the legacy command-line defaults (`applyLegacyDefaults` in options.go), i.e.
    /// anonymous auth on, webhook authn off, `AlwaysAllow` and read-only port 10255.
    /// Like upstream, `evictionHard` stays empty in this mode.
    fn default() -> Self {
        let mut cfg = RawKubeletConfiguration::default().apply_defaults();
        cfg.apply_legacy_defaults();
        cfg
    }
}

impl<'de> Deserialize<'de> for KubeletConfiguration {
    /// Decodes a document with file semantics (defaults, evictionHard defaulting). Missing
    /// `kind`/`apiVersion` are tolerated here (e.g. /configz output); wrong ones are not.
    /// Unknown fields are ignored; use [`KubeletConfiguration::load_str`] to get warnings.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawKubeletConfiguration::deserialize(d)?;
        raw.check_type_meta(false).map_err(de::Error::custom)?;
        Ok(raw.finish_file_load())
    }
}

enum Format {
    Json,
    Yaml,
}

fn detect_format(text: &str) -> Format {
    // JSON documents are objects; anything else goes to the YAML parser (a JSON superset).
    if text.trim_start().starts_with('{') {
        Format::Json
    } else {
        Format::Yaml
    }
}

impl KubeletConfiguration {
    /// Whether feature gate `name` is on: as set in `featureGates` (or by
    /// AllAlpha/AllBeta), else its 1.34 default ([`features::GATES`]).
    /// Panics on a gate 1.34 does not know, as upstream's `Enabled` does.
    pub fn feature_gate(&self, name: &str) -> bool {
        features::enabled(&self.feature_gates, name)
    }

    /// What a config file holding only `apiVersion` and `kind` yields: v1beta1 defaults
    /// (read-only port 0, webhook authn/authz) plus the default `evictionHard`.
    pub fn file_defaults() -> Self {
        RawKubeletConfiguration::default().finish_file_load()
    }

    /// Upstream `applyLegacyDefaults`: the permissive values the command line has always had.
    pub fn apply_legacy_defaults(&mut self) {
        self.authentication.anonymous.enabled = true;
        self.authentication.webhook.enabled = false;
        self.authorization.mode = AUTHORIZATION_MODE_ALWAYS_ALLOW.to_string();
        self.read_only_port = LEGACY_READ_ONLY_PORT;
    }

    /// Decodes a YAML or JSON KubeletConfiguration document, applies defaults and returns
    /// warnings for unknown fields (upstream falls back to lenient decoding and logs them).
    pub fn load_str(text: &str) -> Result<(Self, Vec<String>), ConfigError> {
        let format = detect_format(text);
        // First pass: generic value, to report emptiness and type metadata before field errors.
        let value: serde_json::Value = match format {
            Format::Json => serde_json::from_str(text).map_err(|e| e.to_string()),
            Format::Yaml => crate::yaml::from_str(text).map_err(|e| e.to_string()),
        }
        .map_err(ConfigError::Decode)?;
        let map = match value {
            serde_json::Value::Null => return Err(ConfigError::Empty),
            serde_json::Value::Object(map) => map,
            other => {
                return Err(ConfigError::Decode(format!(
                    "expected a mapping at the top level, found {}",
                    json_type_name(&other)
                )))
            }
        };
        let type_meta = RawKubeletConfiguration {
            kind: map
                .get("kind")
                .map(|v| v.as_str().unwrap_or("").to_string()),
            api_version: map
                .get("apiVersion")
                .map(|v| v.as_str().unwrap_or("").to_string()),
            ..Default::default()
        };
        type_meta.check_type_meta(true)?;

        // Second pass straight from the text so errors carry line/column information.
        let raw: RawKubeletConfiguration = match format {
            Format::Json => serde_json::from_str(text).map_err(|e| e.to_string()),
            Format::Yaml => crate::yaml::from_str(text).map_err(|e| e.to_string()),
        }
        .map_err(ConfigError::Decode)?;
        let warnings = raw.unknown_fields();
        Ok((raw.finish_file_load(), warnings))
    }

    /// Runs the checks upstream's `ValidateKubeletConfiguration` makes that apply here,
    /// plus the cgroup driver and authorization mode checks done elsewhere upstream.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_on(crate::cm::node::cgroup_v2_unified())
    }

    /// `validate` for a host whose cgroups are v2 (`cgroup_v2`) or v1:
    /// upstream's validateKubeletOSConfiguration looks at the host.
    pub fn validate_on(&self, cgroup_v2: bool) -> Result<(), ConfigError> {
        let mut errs: Vec<String> = Vec::new();
        // Upstream words taint errors without the "invalid configuration" prefix.
        let mut taint_errs: Vec<String> = Vec::new();
        // Upstream sets the gates on a copy first and returns their error
        // alone (`validation.go`, `localFeatureGate.SetFromMap`).
        features::check(&self.feature_gates)?;
        let mut bad = |msg: String| errs.push(format!("invalid configuration: {msg}"));
        let gate = |name: &str| self.feature_gate(name);

        if self.node_lease_duration_seconds <= 0 {
            bad("nodeLeaseDurationSeconds must be greater than 0".into());
        }
        if !self.system_cgroups.is_empty() && self.cgroup_root.is_empty() {
            bad("systemCgroups (--system-cgroups) was specified and cgroupRoot (--cgroup-root) was not specified".into());
        }
        for (name, flag, v) in [
            ("eventBurst", "--event-burst", self.event_burst),
            ("eventRecordQPS", "--event-qps", self.event_record_qps),
            ("kubeAPIBurst", "--kube-api-burst", self.kube_api_burst),
            ("kubeAPIQPS", "--kube-api-qps", self.kube_api_qps),
            ("maxPods", "--max-pods", self.max_pods),
            ("podsPerCore", "--pods-per-core", self.pods_per_core),
            ("registryBurst", "--registry-burst", self.registry_burst),
            ("registryPullQPS", "--registry-qps", self.registry_pull_qps),
        ] {
            if v < 0 {
                bad(format!("{name} ({flag}) {v} must not be a negative number"));
            }
        }
        if self.max_open_files < 0 {
            bad(format!(
                "maxOpenFiles (--max-open-files) {} must not be a negative number",
                self.max_open_files
            ));
        }
        if self.healthz_port != 0 && !(1..=65535).contains(&self.healthz_port) {
            bad(format!(
                "healthzPort (--healthz-port) {} must be between 1 and 65535, inclusive",
                self.healthz_port
            ));
        }
        if !(1..=65535).contains(&self.port) {
            bad(format!(
                "port (--port) {} must be between 1 and 65535, inclusive",
                self.port
            ));
        }
        // Upstream refuses other values when it builds its managers.
        if !["Watch", "Cache", "Get"].contains(
            &self
                .config_map_and_secret_change_detection_strategy
                .as_str(),
        ) {
            bad(format!(
                "unknown configmap and secret manager mode: {}",
                self.config_map_and_secret_change_detection_strategy
            ));
        }
        if self.read_only_port != 0 && !(1..=65535).contains(&self.read_only_port) {
            bad(format!(
                "readOnlyPort (--read-only-port) {} must be between 0 and 65535, inclusive",
                self.read_only_port
            ));
        }
        let cfs_default = GoDuration::from_millis(100);
        if gate("CustomCPUCFSQuotaPeriod") {
            let p = self.cpu_cfs_quota_period.as_duration();
            if p < std::time::Duration::from_millis(1) || p > std::time::Duration::from_secs(1) {
                bad(format!(
                    "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {} must be between 1ms and 1sec, inclusive",
                    self.cpu_cfs_quota_period
                ));
            }
        } else if self.cpu_cfs_quota_period != cfs_default {
            bad(format!(
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {} requires feature gate CustomCPUCFSQuotaPeriod",
                self.cpu_cfs_quota_period
            ));
        }
        let restart_max = self.crash_loop_back_off.max_container_restart_period;
        if gate("KubeletCrashLoopBackOffMax") {
            match restart_max {
                None => bad("FeatureGate KubeletCrashLoopBackOffMax is enabled, CrashLoopBackOff.MaxContainerRestartPeriod must be set".into()),
                Some(d) if !(1000..=300_000).contains(&d.0.as_millis()) => bad(format!(
                    "CrashLoopBackOff.MaxContainerRestartPeriod (got: {} seconds) must be set between 1s and 300s",
                    d.0.as_secs_f64()
                )),
                Some(_) => {}
            }
        } else if restart_max.is_some() {
            bad("FeatureGate KubeletCrashLoopBackOffMax not enabled, CrashLoopBackOff.MaxContainerRestartPeriod must not be set".into());
        }
        let (high, low) = (
            self.image_gc_high_threshold_percent,
            self.image_gc_low_threshold_percent,
        );
        if !(0..=100).contains(&high) {
            bad(format!("imageGCHighThresholdPercent (--image-gc-high-threshold) {high} must be between 0 and 100, inclusive"));
        }
        if !(0..=100).contains(&low) {
            bad(format!("imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be between 0 and 100, inclusive"));
        }
        if low >= high {
            bad(format!("imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"));
        }
        if !self.image_maximum_gc_age.is_zero() {
            if !gate("ImageMaximumGCAge") {
                bad("ImageMaximumGCAge feature gate is required for Kubelet configuration option imageMaximumGCAge".into());
            }
            if self.image_maximum_gc_age <= self.image_minimum_gc_age {
                bad(format!(
                    "imageMaximumGCAge {} must be greater than imageMinimumGCAge {}",
                    self.image_maximum_gc_age, self.image_minimum_gc_age
                ));
            }
        }
        for (name, flag, v) in [
            (
                "iptablesDropBit",
                "--iptables-drop-bit",
                self.iptables_drop_bit,
            ),
            (
                "iptablesMasqueradeBit",
                "--iptables-masquerade-bit",
                self.iptables_masquerade_bit,
            ),
        ] {
            if !(0..=31).contains(&v) {
                bad(format!(
                    "{name} ({flag}) {v} must be between 0 and 31, inclusive"
                ));
            }
        }
        if self.node_status_max_images < -1 {
            bad(format!(
                "nodeStatusMaxImages (--node-status-max-images) {} must be -1 or greater",
                self.node_status_max_images
            ));
        }
        if !(-1000..=1000).contains(&self.oom_score_adj) {
            bad(format!(
                "oomScoreAdj (--oom-score-adj) {} must be between -1000 and 1000, inclusive",
                self.oom_score_adj
            ));
        }
        if let Some(n) = self.max_parallel_image_pulls {
            if n < 1 {
                bad(format!(
                    "maxParallelImagePulls {n} must be a positive number"
                ));
            }
            if self.serialize_image_pulls && n > 1 {
                bad("maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false".into());
            }
        }
        if self.server_tls_bootstrap && !gate("RotateKubeletServerCertificate") {
            bad(
                "serverTLSBootstrap true requires feature gate RotateKubeletServerCertificate"
                    .into(),
            );
        }
        if self.run_once {
            bad(
                "runOnce (--runOnce) true, Runonce mode has been deprecated and should not be set"
                    .into(),
            );
        }
        for t in &self.register_with_taints {
            if t.key.is_empty()
                || !matches!(
                    t.effect.as_str(),
                    "NoSchedule" | "PreferNoSchedule" | "NoExecute"
                )
            {
                taint_errs.push(format!("invalid taint: {t:?}"));
            }
            if t.time_added.is_some() {
                bad("taint.TimeAdded is not nil".into());
            }
        }
        if !matches!(
            self.topology_manager_policy.as_str(),
            "none" | "best-effort" | "restricted" | "single-numa-node"
        ) {
            bad(format!("topologyManagerPolicy (--topology-manager-policy) {:?} must be one of: [\"none\" \"best-effort\" \"restricted\" \"single-numa-node\"]", self.topology_manager_policy));
        }
        if !matches!(self.topology_manager_scope.as_str(), "container" | "pod") {
            bad(format!("topologyManagerScope (--topology-manager-scope) {:?} must be one of: \"container\", or \"pod\"", self.topology_manager_scope));
        }
        let (grace, critical) = (
            self.shutdown_grace_period.as_duration(),
            self.shutdown_grace_period_critical_pods.as_duration(),
        );
        let one_sec = std::time::Duration::from_secs(1);
        if critical > grace {
            bad(format!(
                "shutdownGracePeriodCriticalPods {} must be <= shutdownGracePeriod {}",
                self.shutdown_grace_period_critical_pods, self.shutdown_grace_period
            ));
        }
        if !grace.is_zero() && grace < one_sec {
            bad(format!(
                "shutdownGracePeriod {} must be either zero or otherwise >= 1 sec",
                self.shutdown_grace_period
            ));
        }
        if !critical.is_zero() && critical < one_sec {
            bad(format!(
                "shutdownGracePeriodCriticalPods {} must be either zero or otherwise >= 1 sec",
                self.shutdown_grace_period_critical_pods
            ));
        }
        if !self.shutdown_grace_period_by_pod_priority.is_empty()
            && (!grace.is_zero() || !critical.is_zero())
        {
            bad("Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time".into());
        }
        if !matches!(
            self.memory_swap.swap_behavior.as_str(),
            "" | "NoSwap" | "LimitedSwap"
        ) {
            bad(format!(
                "memorySwap.swapBehavior {:?} must be one of: \"\", \"LimitedSwap\" or \"NoSwap\"",
                self.memory_swap.swap_behavior
            ));
        }
        self.validate_enforce_node_allocatable(&mut bad);
        if !self.reserved_system_cpus.is_empty() {
            // --reserved-cpus replaces the cpu reservations, which the
            // reserved cgroups would be sized from.
            if !self.system_reserved_cgroup.is_empty() || !self.kube_reserved_cgroup.is_empty() {
                bad("can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)".into());
            }
            if let Err(e) = crate::cm::cpumanager::cpuset::CpuSet::parse(&self.reserved_system_cpus)
            {
                bad(format!(
                    "unable to parse reservedSystemCPUs (--reserved-cpus) {}, error: {e}",
                    self.reserved_system_cpus
                ));
            }
        }
        if !matches!(
            self.hairpin_mode.as_str(),
            "none" | "hairpin-veth" | "promiscuous-bridge"
        ) {
            bad(format!("option {:?} specified for hairpinMode (--hairpin-mode). Valid options are \"none\", \"hairpin-veth\" or \"promiscuous-bridge\"", self.hairpin_mode));
        }
        if self.memory_throttling_factor <= 0.0 || self.memory_throttling_factor > 1.0 {
            bad(format!(
                "memoryThrottlingFactor {} must be greater than 0 and less than or equal to 1.0",
                self.memory_throttling_factor
            ));
        }
        if self.container_runtime_endpoint.is_empty() {
            bad("the containerRuntimeEndpoint was not specified or empty".into());
        }
        if self.enable_system_log_query && !self.enable_system_log_handler {
            bad("enableSystemLogHandler is required for enableSystemLogQuery".into());
        }
        if self.container_log_max_workers < 1 {
            bad("containerLogMaxWorkers must be greater than or equal to 1".into());
        }
        if self.container_log_monitor_interval.as_duration() < std::time::Duration::from_secs(3) {
            bad("containerLogMonitorInterval must be a positive time duration greater than or equal to 3s".into());
        }
        if self.container_log_max_files <= 1 {
            bad("containerLogMaxFiles must be greater than 1".into());
        }
        if self.pod_logs_dir.is_empty() {
            bad("podLogsDir was not specified".into());
        } else {
            if !self.pod_logs_dir.starts_with('/') {
                bad(format!(
                    "pod logs path {:?} must be absolute path",
                    self.pod_logs_dir
                ));
            }
            if !is_clean_path(&self.pod_logs_dir) {
                bad(format!(
                    "pod logs path {:?} must be normalized",
                    self.pod_logs_dir
                ));
            }
            if !self.pod_logs_dir.is_ascii() {
                bad(format!(
                    "pod logs path {:?} mut contains ASCII characters only",
                    self.pod_logs_dir
                ));
            }
        }
        // Checked by the container manager / authz builder upstream rather than validation.go.
        if !matches!(self.cgroup_driver.as_str(), "cgroupfs" | "systemd") {
            bad(format!(
                "cgroupDriver (--cgroup-driver) {:?} must be one of \"cgroupfs\" or \"systemd\"",
                self.cgroup_driver
            ));
        }
        if !matches!(
            self.authorization.mode.as_str(),
            AUTHORIZATION_MODE_WEBHOOK | AUTHORIZATION_MODE_ALWAYS_ALLOW
        ) {
            bad(format!(
                "authorization.mode (--authorization-mode) {:?} must be one of \"AlwaysAllow\" or \"Webhook\"",
                self.authorization.mode
            ));
        }
        if !matches!(self.logging.format.as_str(), "text" | "json") {
            bad(format!(
                "logging.format: Unsupported value: {:?}: supported values: \"json\", \"text\"",
                self.logging.format
            ));
        }

        // component-base's ValidateShowHiddenMetricsVersion: only the
        // previous minor release. No kubelet metric was deprecated in it,
        // so the setting shows nothing more (as upstream 1.34's kubelet).
        let hidden = &self.show_hidden_metrics_for_version;
        let previous = previous_minor(crate::kubelet::KUBERNETES_VERSION);
        if !hidden.is_empty() && *hidden != previous {
            errs.push(format!("--show-hidden-metrics-for-version must be omitted or have the value '{previous}'. Only the previous minor version is allowed"));
        }
        // validateKubeletOSConfiguration (validation_linux.go): its first
        // error alone, unprefixed for failCgroupV1 as upstream words it.
        if let Some(e) = self.os_error(cgroup_v2) {
            errs.push(e);
        }
        errs.extend(taint_errs);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(errs))
        }
    }

    fn os_error(&self, cgroup_v2: bool) -> Option<String> {
        if self.fail_cgroup_v1 && !cgroup_v2 {
            return Some("kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is in maintenance mode".into());
        }
        if !cgroup_v2 && self.single_process_oom_kill == Some(false) {
            return Some("invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1".into());
        }
        // One user namespace unit is 65536 IDs, as upstream's userNsUnitLength.
        const UNIT: i64 = 65536;
        let ids = self.user_namespaces.as_ref().and_then(|u| u.ids_per_pod)?;
        if ids < UNIT {
            Some(format!(
                "invalid configuration: userNamespaces.idsPerPod must not be less than {UNIT}"
            ))
        } else if ids % UNIT != 0 {
            Some(format!(
                "invalid configuration: userNamespaces.idsPerPod must be a multiple of {UNIT}"
            ))
        } else if ids > u32::MAX as i64 {
            Some(format!(
                "invalid configuration: userNamespaces.idsPerPod must not be more than {}",
                u32::MAX
            ))
        } else {
            None
        }
    }

    fn validate_enforce_node_allocatable(&self, bad: &mut impl FnMut(String)) {
        const OPTS: &str = "\"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \"kube-reserved-compressible\" or \"none\"";
        let list = &self.enforce_node_allocatable;
        let has = |k: &str| list.iter().any(|v| v == k);
        for (plain, compressible) in [
            ("system-reserved", "system-reserved-compressible"),
            ("kube-reserved", "kube-reserved-compressible"),
        ] {
            if has(plain) && has(compressible) {
                bad(format!("both {plain:?} and {compressible:?} cannot be specified together in enforceNodeAllocatable (--enforce-node-allocatable)"));
            }
        }
        let mut seen: Vec<&str> = Vec::new();
        for val in list {
            if seen.contains(&val.as_str()) {
                bad(format!("duplicated enforcements {val:?} in enforceNodeAllocatable (--enforce-node-allocatable)"));
                continue;
            }
            seen.push(val);
            match val.as_str() {
                "pods" => {}
                "system-reserved" | "system-reserved-compressible" => {
                    if self.system_reserved_cgroup.is_empty() {
                        bad("systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" or \"system-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)".into());
                    }
                }
                "kube-reserved" | "kube-reserved-compressible" => {
                    if self.kube_reserved_cgroup.is_empty() {
                        bad("kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" or \"kube-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)".into());
                    }
                }
                "none" => {
                    if list.len() > 1 {
                        bad("enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified".into());
                    }
                    continue;
                }
                other => {
                    bad(format!("option {other:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are {OPTS}"));
                    continue;
                }
            }
            if !self.cgroups_per_qos {
                bad(format!("cgroupsPerQOS (--cgroups-per-qos) must be set to true when {val:?} contained in enforceNodeAllocatable (--enforce-node-allocatable)"));
            }
        }
    }

    /// Makes relative path fields absolute against `root` (upstream `resolveRelativePaths`
    /// over `KubeletConfigurationPathRefs`).
    pub fn resolve_relative_paths(&mut self, root: &Path) {
        for p in [
            &mut self.static_pod_path,
            &mut self.authentication.x509.client_ca_file,
            &mut self.tls_cert_file,
            &mut self.tls_private_key_file,
            &mut self.resolv_conf,
            &mut self.volume_plugin_dir,
            &mut self.pod_logs_dir,
        ] {
            if !p.is_empty() && !Path::new(p.as_str()).is_absolute() {
                *p = root.join(p.as_str()).to_string_lossy().into_owned();
            }
        }
    }
}

/// Go's `filepath.Clean(p) == p` for absolute Unix paths.
fn is_clean_path(p: &str) -> bool {
    if p == "/" {
        return true;
    }
    !p.ends_with('/') && !p.contains("//") && !p.split('/').any(|seg| seg == "." || seg == "..")
}

fn json_type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a sequence",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// Reads, decodes and defaults a kubelet config file (YAML or JSON, detected by content).
/// Relative paths inside it are resolved against the file's directory, as upstream does.
/// Returns warnings naming unknown fields (dotted paths); loading still succeeds.
pub fn load_file(path: &Path) -> Result<(KubeletConfiguration, Vec<String>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (mut cfg, warnings) =
        KubeletConfiguration::load_str(&text).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            source: Box::new(e),
        })?;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let Some(dir) = abs.parent() {
        cfg.resolve_relative_paths(dir);
    }
    Ok((cfg, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn load(body: &str) -> (KubeletConfiguration, Vec<String>) {
        KubeletConfiguration::load_str(&format!("{HEADER}{body}"))
            .unwrap_or_else(|e| panic!("load failed: {e}"))
    }

    #[test]
    fn empty_config_gets_upstream_defaults() {
        let (c, warnings) = load("");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(c.enable_server);
        assert_eq!(c.sync_frequency, GoDuration::from_mins(1));
        assert_eq!(c.file_check_frequency, GoDuration::from_secs(20));
        assert_eq!(c.http_check_frequency, GoDuration::from_secs(20));
        assert_eq!(c.address, "0.0.0.0");
        assert_eq!(c.port, 10250);
        assert_eq!(c.read_only_port, 0);
        assert!(!c.authentication.anonymous.enabled);
        assert!(c.authentication.webhook.enabled);
        assert_eq!(c.authentication.webhook.cache_ttl, GoDuration::from_mins(2));
        assert_eq!(c.authorization.mode, "Webhook");
        assert_eq!(
            c.authorization.webhook.cache_authorized_ttl,
            GoDuration::from_mins(5)
        );
        assert_eq!(
            c.authorization.webhook.cache_unauthorized_ttl,
            GoDuration::from_secs(30)
        );
        assert_eq!((c.registry_pull_qps, c.registry_burst), (5, 10));
        assert_eq!((c.event_record_qps, c.event_burst), (50, 100));
        assert!(c.enable_debugging_handlers);
        assert_eq!(c.healthz_port, 10248);
        assert_eq!(c.healthz_bind_address, "127.0.0.1");
        assert_eq!(c.oom_score_adj, -999);
        assert_eq!(c.streaming_connection_idle_timeout.to_string(), "4h0m0s");
        assert_eq!(c.node_status_update_frequency, GoDuration::from_secs(10));
        assert_eq!(c.node_status_report_frequency, GoDuration::from_mins(5));
        assert_eq!(c.node_lease_duration_seconds, 40);
        assert_eq!(c.image_minimum_gc_age, GoDuration::from_mins(2));
        assert!(c.image_maximum_gc_age.is_zero());
        assert_eq!(
            (
                c.image_gc_high_threshold_percent,
                c.image_gc_low_threshold_percent
            ),
            (85, 80)
        );
        assert_eq!(c.volume_stats_agg_period, GoDuration::from_mins(1));
        assert!(c.cgroups_per_qos);
        assert_eq!(c.cgroup_driver, "cgroupfs");
        assert_eq!(c.cpu_manager_policy, "none");
        assert_eq!(c.memory_manager_policy, "None");
        assert_eq!(c.topology_manager_policy, "none");
        assert_eq!(c.topology_manager_scope, "container");
        assert_eq!(c.runtime_request_timeout, GoDuration::from_mins(2));
        assert_eq!(c.hairpin_mode, "promiscuous-bridge");
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.pod_pids_limit, -1);
        assert_eq!(c.resolv_conf, "/etc/resolv.conf");
        assert!(c.cpu_cfs_quota);
        assert_eq!(c.cpu_cfs_quota_period, GoDuration::from_millis(100));
        assert_eq!(c.max_open_files, 1_000_000);
        assert_eq!(c.content_type, "application/vnd.kubernetes.protobuf");
        assert_eq!((c.kube_api_qps, c.kube_api_burst), (50, 100));
        // rkubelet's deliberate difference: parallel unless asked otherwise.
        assert!(!c.serialize_image_pulls);
        assert_eq!(c.max_parallel_image_pulls, None);
        assert_eq!(c.eviction_hard, default_eviction_hard());
        assert_eq!(c.eviction_hard.len(), 5);
        assert_eq!(
            c.eviction_pressure_transition_period,
            GoDuration::from_mins(5)
        );
        assert!(c.enable_controller_attach_detach);
        assert!(c.make_iptables_util_chains);
        assert!(c.fail_swap_on);
        assert_eq!(c.memory_swap, MemorySwapConfiguration::default());
        assert_eq!(c.container_log_max_size, "10Mi");
        assert_eq!(c.container_log_max_files, 5);
        assert_eq!(c.container_log_max_workers, 1);
        assert_eq!(c.container_log_monitor_interval, GoDuration::from_secs(10));
        assert_eq!(c.enforce_node_allocatable, vec!["pods".to_string()]);
        assert!(c.register_node);
        assert_eq!(
            c.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert!(c.local_storage_capacity_isolation);
        assert_eq!(c.logging.format, "text");
        assert_eq!(c.logging.flush_frequency.duration, GoDuration::from_secs(5));
        assert!(c.enable_profiling_handler);
        assert!(!c.seccomp_default);
        assert_eq!(c.pod_logs_dir, "/var/log/pods");
        assert_eq!(c, KubeletConfiguration::file_defaults());
        c.validate().expect("defaults validate");
    }

    #[test]
    fn default_is_the_no_config_command_line_baseline() {
        let d = KubeletConfiguration::default();
        assert_eq!(d.read_only_port, 10255);
        assert!(d.authentication.anonymous.enabled);
        assert!(!d.authentication.webhook.enabled);
        assert_eq!(d.authorization.mode, "AlwaysAllow");
        // Upstream only defaults evictionHard when loading a config file.
        assert!(d.eviction_hard.is_empty());
        assert_eq!(d.sync_frequency, GoDuration::from_mins(1));
        d.validate().expect("defaults validate");
    }

    #[test]
    fn kubeadm_zero_values_get_defaults() {
        // Shape of the file `kubeadm init` writes to /var/lib/kubelet/config.yaml.
        let (c, warnings) = load(
            r#"authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
crashLoopBackOff: {}
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"#,
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(c.sync_frequency, GoDuration::from_mins(1));
        assert_eq!(c.file_check_frequency, GoDuration::from_secs(20));
        assert_eq!(c.authentication.webhook.cache_ttl, GoDuration::from_mins(2));
        assert_eq!(
            c.authorization.webhook.cache_unauthorized_ttl,
            GoDuration::from_secs(30)
        );
        assert_eq!(
            c.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(c.node_status_report_frequency, GoDuration::from_mins(5));
        assert_eq!(c.runtime_request_timeout, GoDuration::from_mins(2));
        assert_eq!(c.logging.flush_frequency.duration, GoDuration::from_secs(5));
        assert_eq!(c.cgroup_driver, "systemd");
        assert_eq!(c.cluster_dns, vec!["10.96.0.10".to_string()]);
        assert_eq!(c.resolv_conf, "/run/systemd/resolve/resolv.conf");
        assert!(c.rotate_certificates);
        assert_eq!(
            c.authentication.x509.client_ca_file,
            "/etc/kubernetes/pki/ca.crt"
        );
        assert_eq!(c.memory_swap.swap_behavior, "");
        c.validate().expect("kubeadm config validates");
    }

    #[test]
    fn explicit_pointer_values_are_kept() {
        let (c, _) = load(
            "enableServer: false\nregisterNode: false\ncgroupsPerQOS: false\nfailSwapOn: false\n\
             healthzPort: 0\nregistryPullQPS: 0\nenforceNodeAllocatable: []\nresolvConf: \"\"\n\
             readOnlyPort: 10255\nevictionHard: {}\nauthentication:\n  webhook:\n    enabled: false\n",
        );
        assert!(!c.enable_server);
        assert!(!c.register_node);
        assert!(!c.cgroups_per_qos);
        assert!(!c.fail_swap_on);
        assert_eq!(c.healthz_port, 0);
        assert_eq!(c.registry_pull_qps, 0);
        assert!(c.enforce_node_allocatable.is_empty());
        assert_eq!(c.resolv_conf, "");
        assert_eq!(c.read_only_port, 10255);
        assert!(c.eviction_hard.is_empty());
        assert!(!c.authentication.webhook.enabled);
        // Value (non-pointer) fields still default when zero.
        let (c, _) = load("maxPods: 0\nport: 0\naddress: \"\"\n");
        assert_eq!(
            (c.max_pods, c.port, c.address.as_str()),
            (110, 10250, "0.0.0.0")
        );
    }

    #[test]
    fn reserved_system_cpus_are_checked_as_upstream() {
        // Old code: reservedSystemCPUs was accepted unread.
        let invalid = |body: &str| match load(body).0.validate() {
            Err(ConfigError::Invalid(errs)) => errs,
            other => panic!("{other:?}"),
        };
        let errs = invalid("reservedSystemCPUs: \"3-1\"\n");
        assert!(errs.iter().any(|e| e.starts_with("invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus) 3-1, error:")), "{errs:?}");
        let errs = invalid("reservedSystemCPUs: \"0\"\nkubeReservedCgroup: /kube\n");
        assert!(errs.iter().any(|e| e == "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)"), "{errs:?}");
        let (c, _) = load("cpuManagerPolicy: static\nreservedSystemCPUs: \"0,2-3\"\n");
        assert!(c.validate().is_ok());
    }

    #[test]
    fn the_crash_loop_maximum_is_checked_as_upstream() {
        let invalid = |body: &str| match load(body).0.validate() {
            Err(ConfigError::Invalid(errs)) => errs,
            other => panic!("{other:?}"),
        };
        let errs = invalid("crashLoopBackOff:\n  maxContainerRestartPeriod: 30s\n");
        assert!(errs.iter().any(|e| e.contains("FeatureGate KubeletCrashLoopBackOffMax not enabled, CrashLoopBackOff.MaxContainerRestartPeriod must not be set")), "{errs:?}");
        let errs = invalid("featureGates:\n  KubeletCrashLoopBackOffMax: true\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 400s\n");
        assert!(errs.iter().any(|e| e.contains("CrashLoopBackOff.MaxContainerRestartPeriod (got: 400 seconds) must be set between 1s and 300s")), "{errs:?}");
        let (c, _) = load("featureGates:\n  KubeletCrashLoopBackOffMax: true\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 30s\n");
        assert!(c.validate().is_ok());
    }

    #[test]
    fn derived_defaults() {
        let (c, _) = load("nodeStatusUpdateFrequency: 20s\n");
        assert_eq!(c.node_status_report_frequency, GoDuration::from_secs(20));
        let (c, _) = load("maxParallelImagePulls: 5\n");
        assert!(!c.serialize_image_pulls);
        let (c, _) = load("maxParallelImagePulls: 1\n");
        assert!(c.serialize_image_pulls);
        let (c, _) = load("serializeImagePulls: true\n");
        assert!(c.serialize_image_pulls);
        let (c, _) = load("podPidsLimit: -5\n");
        assert_eq!(c.pod_pids_limit, -1);
        let (c, _) = load("featureGates:\n  KubeletCrashLoopBackOffMax: true\n");
        assert_eq!(
            c.crash_loop_back_off.max_container_restart_period,
            Some(GoDuration::from_secs(300))
        );
    }

    #[test]
    fn eviction_hard_partial_and_merge() {
        let (c, _) = load("evictionHard:\n  memory.available: 200Mi\n");
        assert_eq!(c.eviction_hard.len(), 1);
        let (c, _) =
            load("mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 200Mi\n");
        assert_eq!(c.eviction_hard.len(), 5);
        assert_eq!(c.eviction_hard["memory.available"], "200Mi");
        assert_eq!(c.eviction_hard["imagefs.available"], "15%");
    }

    #[test]
    fn unknown_fields_warn_but_load() {
        let (c, warnings) = load(
            "maxPods: 42\nbogusField: 1\nauthentication:\n  webhook:\n    cacheTLL: 1m\n\
             logging:\n  colour: true\n",
        );
        assert_eq!(c.max_pods, 42);
        assert_eq!(
            warnings,
            vec![
                "unknown field \"bogusField\"".to_string(),
                "unknown field \"authentication.webhook.cacheTLL\"".to_string(),
                "unknown field \"logging.colour\"".to_string(),
            ]
        );
    }

    #[test]
    fn wrong_or_missing_type_meta_errors() {
        let err = KubeletConfiguration::load_str(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::WrongKind { .. }));
        assert_eq!(
            err.to_string(),
            "unsupported kind \"KubeProxyConfiguration\" in kubelet config, expected \"KubeletConfiguration\""
        );
        let err = KubeletConfiguration::load_str(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n",
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::WrongApiVersion { .. }), "{err}");
        let err = KubeletConfiguration::load_str("maxPods: 3\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing kind in kubelet config, expected \"KubeletConfiguration\""
        );
        assert!(matches!(
            KubeletConfiguration::load_str("# nothing\n"),
            Err(ConfigError::Empty)
        ));
        assert!(matches!(
            KubeletConfiguration::load_str("- a\n- b\n"),
            Err(ConfigError::Decode(_))
        ));
    }

    #[test]
    fn bad_values_error() {
        let err =
            KubeletConfiguration::load_str(&format!("{HEADER}syncFrequency: 5x\n")).unwrap_err();
        assert!(err.to_string().contains("unknown unit \"x\""), "{err}");
        let err = KubeletConfiguration::load_str(&format!("{HEADER}maxPods: lots\n")).unwrap_err();
        assert!(matches!(err, ConfigError::Decode(_)), "{err}");
        // A bare number is not a metav1.Duration.
        assert!(KubeletConfiguration::load_str(&format!("{HEADER}syncFrequency: 30\n")).is_err());
    }

    #[test]
    fn json_config_loads() {
        let json = r#"{
  "kind": "KubeletConfiguration",
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "syncFrequency": "30s",
  "enableServer": false,
  "clusterDNS": ["10.0.0.10"],
  "featureGates": {"NodeSwap": true},
  "unknownThing": {"a": 1}
}"#;
        let (c, warnings) = KubeletConfiguration::load_str(json).unwrap();
        assert_eq!(c.sync_frequency, GoDuration::from_secs(30));
        assert!(!c.enable_server);
        assert_eq!(c.cluster_dns, vec!["10.0.0.10".to_string()]);
        assert_eq!(c.feature_gates.get("NodeSwap"), Some(&true));
        assert_eq!(warnings, vec!["unknown field \"unknownThing\"".to_string()]);
    }

    #[test]
    fn serializes_like_configz_and_round_trips() {
        let c = KubeletConfiguration::file_defaults();
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["syncFrequency"], "1m0s");
        assert_eq!(v["staticPodURL"], serde_json::Value::Null);
        assert_eq!(v["registryPullQPS"], 5);
        assert_eq!(v["cgroupsPerQOS"], true);
        assert_eq!(v["imageMinimumGCAge"], "2m0s");
        assert_eq!(v["imageMaximumGCAge"], "0s");
        assert_eq!(v["cpuCFSQuotaPeriod"], "100ms");
        assert_eq!(v["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert_eq!(v["logging"]["flushFrequency"], "5s");
        assert_eq!(v["logging"]["options"]["json"]["infoBufferSize"], "0");
        assert_eq!(v["memorySwap"], serde_json::json!({}));
        assert!(v.get("readOnlyPort").is_none(), "omitempty zero");
        assert!(v.get("kind").is_none());
        let back: KubeletConfiguration = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
        // Integer flushFrequency stays an integer.
        let (c, _) = load("logging:\n  flushFrequency: 2000000000\n");
        assert_eq!(c.logging.flush_frequency.duration, GoDuration::from_secs(2));
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["logging"]["flushFrequency"], 2_000_000_000u64);
        // Deserialize still rejects a wrong kind.
        assert!(serde_json::from_str::<KubeletConfiguration>(r#"{"kind":"Pod"}"#).is_err());
    }

    #[test]
    fn validation_catches_bad_values() {
        let (mut c, _) = load(
            "imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 60\nport: 70000\n\
             cgroupDriver: weird\n",
        );
        let err = c.validate().unwrap_err();
        let ConfigError::Invalid(errs) = &err else {
            panic!("unexpected {err:?}")
        };
        assert_eq!(errs.len(), 3, "{errs:?}");
        let msg = err.to_string();
        assert!(msg.starts_with("[invalid configuration: "), "{msg}");
        assert!(msg.contains("imageGCLowThresholdPercent (--image-gc-low-threshold) 60 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 50"), "{msg}");
        assert!(
            msg.contains("port (--port) 70000 must be between 1 and 65535"),
            "{msg}"
        );
        assert!(msg.contains("cgroupDriver"), "{msg}");
        c.image_gc_low_threshold_percent = 40;
        c.port = 10250;
        c.cgroup_driver = "systemd".into();
        c.validate().unwrap();
        c.container_log_monitor_interval = GoDuration::from_secs(1);
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"
        );
        c.container_log_monitor_interval = GoDuration::from_secs(10);
        for ok in ["Watch", "Cache", "Get"] {
            c.config_map_and_secret_change_detection_strategy = ok.into();
            c.validate().unwrap();
        }
        c.config_map_and_secret_change_detection_strategy = "Poll".into();
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "invalid configuration: unknown configmap and secret manager mode: Poll"
        );
    }

    #[test]
    fn validation_refuses_unknown_and_locked_gates_first() {
        // Upstream's ValidateKubeletConfiguration returns the gates' error
        // alone, before any field check (`localFeatureGate.SetFromMap`).
        let (mut c, _) = load("featureGates:\n  NoSuchGate: true\nport: 70000\n");
        let err = c.validate().unwrap_err();
        assert!(matches!(err, ConfigError::FeatureGates(_)), "{err:?}");
        assert_eq!(err.to_string(), "unrecognized feature gate: NoSuchGate");
        c.feature_gates = [("NodeSwap".to_string(), false)].into();
        c.port = 10250;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "cannot set feature gate NodeSwap to false, feature is locked to true"
        );
        c.feature_gates = [("NodeSwap".to_string(), true)].into();
        c.validate().unwrap();
    }

    #[test]
    fn load_file_resolves_paths_and_reports_io_errors() {
        let dir = std::env::temp_dir().join(format!("rkubelet-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.yaml");
        std::fs::write(
            &file,
            format!("{HEADER}staticPodPath: manifests\ntlsCertFile: /abs/cert.pem\nextra: 1\n"),
        )
        .unwrap();
        let (c, warnings) = load_file(&file).unwrap();
        assert_eq!(Path::new(&c.static_pod_path), dir.join("manifests"));
        assert_eq!(c.tls_cert_file, "/abs/cert.pem");
        assert_eq!(warnings, vec!["unknown field \"extra\"".to_string()]);

        std::fs::write(&file, "kind: Nope\napiVersion: x\n").unwrap();
        let err = load_file(&file).unwrap_err();
        assert!(err.to_string().contains(file.to_str().unwrap()), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();

        let missing = dir.join("missing.yaml");
        let err = load_file(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }));
        assert!(
            err.to_string()
                .starts_with("failed to read kubelet config file "),
            "{err}"
        );
        assert!(err.to_string().contains("missing.yaml"), "{err}");
    }
}

#[cfg(test)]
mod kubeadm_tests {
    use super::*;

    #[test]
    fn the_kubeadm_config_loads_with_its_zero_values_as_defaults() {
        // kubeadm writes zero durations; upstream's v1beta1 defaulting turns
        // them into the defaults, and so must rkubelet.
        let (c, warnings) =
            KubeletConfiguration::load_str(include_str!("../../config/kubeadm/config.yaml"))
                .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let secs = |d: GoDuration| d.0.as_secs();
        assert_eq!(secs(c.sync_frequency), 60);
        assert_eq!(secs(c.file_check_frequency), 20);
        assert_eq!(secs(c.node_status_update_frequency), 10);
        assert_eq!(secs(c.node_status_report_frequency), 300);
        assert_eq!(secs(c.runtime_request_timeout), 120);
        assert_eq!(c.node_lease_duration_seconds, 40);
        assert_eq!(c.cgroup_driver, "systemd");
        assert_eq!(c.cluster_dns, vec!["10.96.0.10".to_string()]);
        assert_eq!(c.static_pod_path, "/etc/kubernetes/manifests");
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.kube_api_qps, 50);
        assert_eq!(c.kube_api_burst, 100);
        assert!(c.rotate_certificates);
    }
}

/// A float as Go's encoding/json writes one: a whole number without a
/// fraction (`1`, where serde writes `1.0`).
fn go_float<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f64(*v)
    }
}

/// "1.33" for "v1.34.0".
fn previous_minor(version: &str) -> String {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or("1");
    let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(1);
    format!("{major}.{}", minor.saturating_sub(1))
}

#[cfg(test)]
mod show_hidden_tests {
    use super::*;

    /// Old code: any value was accepted unread.
    #[test]
    fn show_hidden_metrics_takes_only_the_previous_minor_release() {
        let load = |v: &str| {
            KubeletConfiguration::load_str(&format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshowHiddenMetricsForVersion: \"{v}\"\n"
            ))
            .unwrap()
            .0
        };
        assert!(load("1.32").validate_on(true).unwrap_err().to_string().contains(
            "--show-hidden-metrics-for-version must be omitted or have the value '1.33'. Only the previous minor version is allowed"
        ));
        assert_eq!(previous_minor("v1.34.0"), "1.33");
        load("1.33").validate_on(true).unwrap();
    }
}

#[cfg(test)]
mod os_validation_tests {
    use super::*;

    fn load(body: &str) -> KubeletConfiguration {
        KubeletConfiguration::load_str(&format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
        ))
        .unwrap()
        .0
    }

    /// Old code: these settings were accepted unread on any host.
    #[test]
    fn host_checks_follow_upstreams_validate_kubelet_os_configuration() {
        let errs = |c: &KubeletConfiguration, v2: bool| match c.validate_on(v2) {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        };
        let fail = load("failCgroupV1: true\n");
        assert!(errs(&fail, false).contains(
            "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is in maintenance mode"
        ));
        assert_eq!(errs(&fail, true), "");
        let single = load("singleProcessOOMKill: false\n");
        assert!(errs(&single, false).contains(
            "singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
        ));
        assert_eq!(errs(&single, true), "");
        assert_eq!(errs(&load("singleProcessOOMKill: true\n"), false), "");
        for (ids, want) in [
            ("1000", "must not be less than 65536"),
            ("65537", "must be a multiple of 65536"),
            ("4295098368", "must not be more than 4294967295"),
        ] {
            let c = load(&format!("userNamespaces:\n  idsPerPod: {ids}\n"));
            assert!(errs(&c, true).contains(want), "{ids}: {}", errs(&c, true));
        }
        assert_eq!(
            errs(&load("userNamespaces:\n  idsPerPod: 131072\n"), true),
            ""
        );
    }
}
