//! The kubelet's own metrics (`/metrics`, `/metrics/probes`) with
//! upstream's names, types, labels and buckets
//! (`pkg/kubelet/metrics/metrics.go`, `pkg/kubelet/server/metrics/metrics.go`,
//! `pkg/kubelet/prober/prober_manager.go`).
//!
//! One process-wide registry, like upstream's `legacyregistry`: the
//! instrumented code calls the small functions below (atomics only, label
//! sets of `&'static str`, so no allocation per call). Values that describe
//! the current state (running pods and containers) are computed at scrape
//! time from the PLEG snapshot.
//!
//! Exposition is OpenMetrics text (what `prometheus-client` writes), so a
//! counter family registered as `kubelet_runtime_operations` is sampled as
//! `kubelet_runtime_operations_total`, upstream's series name. The
//! upstream counters whose names lack `_total` (`kubelet_evictions`,
//! `kubelet_pleg_discard_events`, `kubelet_preemptions`, the pod-resources
//! endpoint's) are renamed back by [`to_prometheus_text`]
//! (`COUNTERS_WITHOUT_TOTAL`).
//!
//! `v134.rs` holds the families new in 1.34 and the credential provider
//! config hash; `absent.rs` those upstream registers for parts rkubelet
//! does not have; `certvol.rs` the certificate manager's and volume
//! manager's; `meta.rs` component-base's registry meta-metrics;
//! `transport.rs` client-go's transport cache families.

mod http;
mod process;
mod restclient;
pub mod startup;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::kuberuntime::CState;
use crate::server::{encoding, ServerState};

pub use http::track_http;
pub use process::init_start_time;
pub use restclient::{RestClientLayer, RestClientMetrics};

/// component-base prefixes the help of ALPHA metrics so.
macro_rules! alpha {
    ($s:literal) => {
        concat!("[ALPHA] ", $s)
    };
}

/// And that of BETA metrics so.
macro_rules! beta {
    ($s:literal) => {
        concat!("[BETA] ", $s)
    };
}

/// And that of STABLE metrics so.
macro_rules! stable {
    ($s:literal) => {
        concat!("[STABLE] ", $s)
    };
}

mod absent;
pub mod certvol;
pub mod cm;
mod golang;
mod meta;
pub mod slis;
pub mod transport;
pub mod v134;

/// The Prometheus text format upstream's endpoints answer with.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Counters whose upstream name has no `_total` (component-base registers
/// them as they are named; OpenMetrics would force the suffix).
const COUNTERS_WITHOUT_TOTAL: &[&str] = &[
    "kubelet_evictions",
    "kubelet_pleg_discard_events",
    "kubelet_evented_pleg_connection_error_count",
    "kubelet_evented_pleg_connection_success_count",
    "kubelet_preemptions",
    "kubelet_pod_resources_endpoint_requests_list",
    "kubelet_pod_resources_endpoint_requests_get_allocatable",
    "kubelet_pod_resources_endpoint_errors_list",
    "kubelet_pod_resources_endpoint_errors_get_allocatable",
    "kubelet_pod_resources_endpoint_requests_get",
    "kubelet_pod_resources_endpoint_errors_get",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
    "kubelet_container_aligned_compute_resources_count",
    "kubelet_container_aligned_compute_resources_failure_count",
];

/// Rewrites prometheus-client's OpenMetrics text as the Prometheus text
/// format (0.0.4) upstream's kubelet serves, so series and `# TYPE` names
/// are upstream's: a counter's HELP/TYPE carry its `_total` sample name
/// (or the sample loses the suffix for the counters upstream names
/// without it), `# UNIT` and `# EOF` go. prometheus-client writes only
/// OpenMetrics; this keeps dashboards and alerts written against upstream
/// working.
pub fn to_prometheus_text(open: &str) -> String {
    let mut out = String::with_capacity(open.len());
    let mut help: Option<&str> = None;
    // (family, sample prefix to rename from, rename to)
    let mut rename: Option<(String, String)> = None;
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
            rename = None;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            let shown = match ty {
                "counter" if COUNTERS_WITHOUT_TOTAL.contains(&name) => {
                    rename = Some((format!("{name}_total"), name.to_string()));
                    name.to_string()
                }
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            let ty = if ty == "info" { "gauge" } else { ty };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!(
                    "# HELP {shown} {text}
"
                ));
            }
            out.push_str(&format!(
                "# TYPE {shown} {ty}
"
            ));
            continue;
        }
        // client_golang writes infinite values as +Inf and -Inf (the
        // certificate TTL gauges without a certificate); prometheus-client
        // as inf and -inf.
        let line = match (line.strip_suffix(" inf"), line.strip_suffix(" -inf")) {
            _ if line.starts_with('#') => line.to_string(),
            (Some(head), _) => format!("{head} +Inf"),
            (_, Some(head)) => format!("{head} -Inf"),
            _ => line.to_string(),
        };
        match &rename {
            Some((from, to)) if line.starts_with(from.as_str()) => {
                out.push_str(to);
                out.push_str(&line[from.len()..]);
            }
            _ => out.push_str(&line),
        }
        out.push('\n');
    }
    golang::reorder(&out)
}

/// client_golang's `DefBuckets`.
pub const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upstream's `podStartupDurationBuckets` (metrics.go).
pub const POD_STARTUP_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// imagePullDurationBuckets.
pub const IMAGE_PULL_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];

/// Upstream's PodStatusSyncDuration buckets.
pub const POD_STATUS_SYNC_BUCKETS: [f64; 11] = [
    0.010, 0.050, 0.100, 0.500, 1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0,
];

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type GaugeF = Gauge<f64, AtomicU64>;

fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}
fn startup_histogram() -> Histogram {
    Histogram::new(POD_STARTUP_BUCKETS)
}
fn image_pull_histogram() -> Histogram {
    Histogram::new(IMAGE_PULL_BUCKETS)
}
fn runtime_op_histogram() -> Histogram {
    // metrics.ExponentialBuckets(.005, 2.5, 14)
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

// Label sets declare their fields in name order: client_golang writes a
// series' label pairs sorted by name, and the derive writes them in field
// order.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationType {
    pub operation_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabel {
    pub container_state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerType {
    pub container_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerTypeCode {
    pub code: String,
    pub container_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageSize {
    pub image_size_in_bytes: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaticLabel {
    pub r#static: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingLabels {
    pub config: &'static str,
    pub lifecycle: &'static str,
    pub r#static: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeHandler {
    pub runtime_handler: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub namespace: String,
    pub persistentvolumeclaim: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionSignal {
    pub eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub long_running: &'static str,
    pub method: &'static str,
    pub path: &'static str,
    pub server_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetricSource {
    pub metric_source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestClientLabels {
    pub code: String,
    pub host: String,
    pub method: String,
}

/// client-go's per-request families: label names sorted, as client_golang
/// writes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostVerb {
    pub host: String,
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeHostVerb {
    pub code: String,
    pub host: String,
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecPluginCall {
    pub call_status: String,
    pub code: String,
}

/// component-base's rest client latency buckets (request and rate limiter).
pub const REST_LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];
/// Its size buckets: 64 bytes to 16 MiB.
pub const REST_SIZE_BUCKETS: [f64; 11] = [
    64.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0,
];
/// rest_client_exec_plugin_certificate_rotation_age: 10 minutes to 4 years.
const EXEC_ROTATION_BUCKETS: [f64; 11] = [
    600.0,
    1800.0,
    3600.0,
    14400.0,
    86400.0,
    604800.0,
    2592000.0,
    7776000.0,
    15552000.0,
    31104000.0,
    124416000.0,
];

fn rest_latency_histogram() -> Histogram {
    Histogram::new(REST_LATENCY_BUCKETS)
}
fn rest_size_histogram() -> Histogram {
    Histogram::new(REST_SIZE_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginName {
    pub plugin_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    pub build_date: &'static str,
    pub compiler: &'static str,
    pub git_commit: &'static str,
    pub git_tree_state: &'static str,
    pub git_version: &'static str,
    pub go_version: &'static str,
    pub major: &'static str,
    pub minor: &'static str,
    pub platform: &'static str,
}

/// Every metric of `/metrics`; clones share their values.
pub struct KubeletMetrics {
    pub node_name: Family<NodeLabel, Gauge>,
    pub pod_worker_duration: HistFamily<OperationType>,
    pub pod_start_duration: Histogram,
    pub image_pull_duration: HistFamily<ImageSize>,
    pub pod_start_sli_duration: Histogram,
    pub pod_start_total_duration: Histogram,
    pub first_network_pod_start_sli_duration: GaugeF,
    pub pod_worker_start_duration: Histogram,
    pub cgroup_manager_duration: HistFamily<OperationType>,
    pub pleg_relist_duration: Histogram,
    pub pleg_relist_interval: Histogram,
    pub pleg_discard_events: Counter,
    pub pleg_last_seen: GaugeF,
    pub runtime_operations: Family<OperationType, Counter>,
    pub runtime_operations_duration: HistFamily<OperationType>,
    pub runtime_operations_errors: Family<OperationType, Counter>,
    pub evictions: Family<EvictionSignal, Counter>,
    pub running_pods: Gauge,
    pub running_containers: Family<ContainerStateLabel, Gauge>,
    pub restarted_pods: Family<StaticLabel, Counter>,
    pub started_pods: Counter,
    pub started_pods_errors: Counter,
    pub started_containers: Family<ContainerType, Counter>,
    pub started_containers_errors: Family<ContainerTypeCode, Counter>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_requests_duration: HistFamily<HttpLabels>,
    pub http_inflight_requests: Family<HttpLabels, Gauge>,
    /// By metric_source: "du", "statfs", or a CSI driver's name.
    pub volume_metric_collection_duration: HistFamily<MetricSource>,
    pub rest_client_requests: Family<RestClientLabels, Counter>,
    pub rest_client_request_duration: HistFamily<HostVerb>,
    pub rest_client_request_size: HistFamily<HostVerb>,
    pub rest_client_response_size: HistFamily<HostVerb>,
    pub rest_client_rate_limiter_duration: HistFamily<HostVerb>,
    /// No series: kube-rs retries 429/503/504 answers inside its stack,
    /// below the layer that records the rest.
    pub rest_client_request_retries: Family<CodeHostVerb, Counter>,
    /// No exec plugin is tracked: +Inf, as upstream without one.
    pub rest_client_exec_plugin_ttl: GaugeF,
    pub rest_client_exec_plugin_rotation_age: Histogram,
    pub rest_client_exec_plugin_calls: Family<ExecPluginCall, Counter>,
    pub build_info: Family<BuildInfo, Gauge>,
    /// kubelet_volume_stats_{capacity_bytes, available_bytes, used_bytes,
    /// inodes, inodes_free, inodes_used}, refreshed from the volume stats
    /// cache at each scrape.
    pub volume_stats: [Family<VolumeLabels, Gauge>; 6],
    /// kubelet_volume_stats_health_status_abnormal: a claim's volume
    /// condition, only for volumes whose stats carry one (CSIVolumeHealth
    /// with a VOLUME_CONDITION driver).
    pub volume_health_abnormal: Family<VolumeLabels, Gauge>,
    /// kubelet_credential_provider_plugin_{duration, errors_total}: shown
    /// only once plugins are registered (upstream's registerMetrics runs
    /// in RegisterCredentialProviderPlugins).
    pub credential_provider_plugin_duration: HistFamily<PluginName>,
    pub credential_provider_plugin_errors: Family<PluginName, Counter>,
    /// The rarer families of metrics.go's Register (issue 8).
    pub rare: RareMetrics,
    /// The families 1.34 added (issue 8).
    pub v134: v134::V134Metrics,
    /// Families registered for parts rkubelet lacks (issue 8).
    pub absent: absent::AbsentMetrics,
    /// The CPU manager's gauges and the alignment counters (issue 8).
    pub cm: cm::CmMetrics,
}

/// Families upstream's `metrics.Register` registers that count behaviour
/// rkubelet has (pod counts, sandbox runs, orphans, cgroup version, sleep
/// hooks) or lacks (CPU, memory and topology managers' pinning, evented
/// PLEG, node startup, graceful shutdown, HTTP-to-HTTPS fallback). The
/// plain ones (no labels) are always exposed, with 0 where nothing
/// happened, as client_golang shows an unlabelled metric from
/// registration; labelled ones appear with their first series, as
/// client_golang's vectors do.
pub struct RareMetrics {
    pub containers_per_pod: Histogram,
    pub pod_status_sync_duration: Histogram,
    pub evented_pleg_conn_errors: Counter,
    pub evented_pleg_conn: Counter,
    pub evented_pleg_conn_latency: Histogram,
    pub run_podsandbox_duration: HistFamily<RuntimeHandler>,
    pub run_podsandbox_errors: Family<RuntimeHandler, Counter>,
    pub desired_pods: Family<StaticLabel, Gauge>,
    pub active_pods: Family<StaticLabel, Gauge>,
    pub working_pods: Family<WorkingLabels, Gauge>,
    pub mirror_pods: Gauge,
    pub orphaned_runtime_pods: Counter,
    pub managed_ephemeral_containers: Gauge,
    pub cpu_manager_pinning_requests: Counter,
    pub cpu_manager_pinning_errors: Counter,
    pub memory_manager_pinning_requests: Counter,
    pub memory_manager_pinning_errors: Counter,
    pub topology_manager_admission_requests: Counter,
    pub topology_manager_admission_errors: Counter,
    pub topology_manager_admission_duration_ms: Histogram,
    pub orphan_pod_cleaned_volumes: Gauge,
    pub orphan_pod_cleaned_volumes_errors: Gauge,
    /// pre_kubelet, pre_registration, registration, post_registration,
    /// total.
    pub node_startup: [GaugeF; 5],
    pub graceful_shutdown_start: GaugeF,
    pub graceful_shutdown_end: GaugeF,
    pub lifecycle_handler_http_fallbacks: Counter,
    pub sleep_action_terminated_early: Counter,
    pub cgroup_version: Gauge,
}

impl RareMetrics {
    fn new() -> Self {
        RareMetrics {
            // metrics.ExponentialBuckets(1, 2, 5)
            containers_per_pod: Histogram::new(exponential_buckets(1.0, 2.0, 5)),
            pod_status_sync_duration: Histogram::new(POD_STATUS_SYNC_BUCKETS),
            evented_pleg_conn_latency: def_histogram(),
            run_podsandbox_duration: Family::new_with_constructor(def_histogram),
            // metrics.ExponentialBuckets(.05, 2, 15)
            topology_manager_admission_duration_ms: Histogram::new(exponential_buckets(
                0.05, 2.0, 15,
            )),
            evented_pleg_conn_errors: Counter::default(),
            evented_pleg_conn: Counter::default(),
            run_podsandbox_errors: Family::default(),
            desired_pods: Family::default(),
            active_pods: Family::default(),
            working_pods: Family::default(),
            mirror_pods: Gauge::default(),
            orphaned_runtime_pods: Counter::default(),
            managed_ephemeral_containers: Gauge::default(),
            cpu_manager_pinning_requests: Counter::default(),
            cpu_manager_pinning_errors: Counter::default(),
            memory_manager_pinning_requests: Counter::default(),
            memory_manager_pinning_errors: Counter::default(),
            topology_manager_admission_requests: Counter::default(),
            topology_manager_admission_errors: Counter::default(),
            orphan_pod_cleaned_volumes: Gauge::default(),
            orphan_pod_cleaned_volumes_errors: Gauge::default(),
            node_startup: Default::default(),
            graceful_shutdown_start: GaugeF::default(),
            graceful_shutdown_end: GaugeF::default(),
            lifecycle_handler_http_fallbacks: Counter::default(),
            sleep_action_terminated_early: Counter::default(),
            cgroup_version: Gauge::default(),
        }
    }

    /// Name, help and metric of each, in metrics.go's order.
    fn described(&self) -> Vec<Described> {
        let mut v: Vec<Described> = Vec::new();
        add(
            &mut v,
            "kubelet_containers_per_pod_count",
            alpha!("The number of containers per pod."),
            self.containers_per_pod.clone(),
        );
        add(
            &mut v,
            "kubelet_pod_status_sync_duration_seconds",
            alpha!("Duration in seconds to sync a pod status update. Measures time from detection of a change to pod status until the API is successfully updated for that pod, even if multiple intevening changes to pod status occur."),
            self.pod_status_sync_duration.clone(),
        );
        add(
            &mut v,
            "kubelet_evented_pleg_connection_error_count",
            alpha!("The number of errors encountered during the establishment of streaming connection with the CRI runtime."),
            self.evented_pleg_conn_errors.clone(),
        );
        add(
            &mut v,
            "kubelet_evented_pleg_connection_success_count",
            alpha!("The number of times a streaming client was obtained to receive CRI Events."),
            self.evented_pleg_conn.clone(),
        );
        add(
            &mut v,
            "kubelet_evented_pleg_connection_latency_seconds",
            alpha!(
                "The latency of streaming connection with the CRI runtime, measured in seconds."
            ),
            self.evented_pleg_conn_latency.clone(),
        );
        add(
            &mut v,
            "kubelet_run_podsandbox_duration_seconds",
            alpha!("Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler."),
            self.run_podsandbox_duration.clone(),
        );
        add(
            &mut v,
            "kubelet_run_podsandbox_errors",
            alpha!(
                "Cumulative number of the run_podsandbox operation errors by RuntimeClass.Handler."
            ),
            self.run_podsandbox_errors.clone(),
        );
        add(
            &mut v,
            "kubelet_desired_pods",
            alpha!("The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver."),
            self.desired_pods.clone(),
        );
        add(
            &mut v,
            "kubelet_active_pods",
            alpha!("The number of pods the kubelet considers active and which are being considered when admitting new pods. static is true if the pod is not from the apiserver."),
            self.active_pods.clone(),
        );
        add(
            &mut v,
            "kubelet_working_pods",
            alpha!("Number of pods the kubelet is actually running, broken down by lifecycle phase, whether the pod is desired, orphaned, or runtime only (also orphaned), and whether the pod is static. An orphaned pod has been removed from local configuration or force deleted in the API and consumes resources that are not otherwise visible."),
            self.working_pods.clone(),
        );
        add(
            &mut v,
            "kubelet_mirror_pods",
            alpha!("The number of mirror pods the kubelet will try to create (one per admitted static pod)"),
            self.mirror_pods.clone(),
        );
        add(
            &mut v,
            "kubelet_orphaned_runtime_pods",
            alpha!("Number of pods that have been detected in the container runtime without being already known to the pod worker. This typically indicates the kubelet was restarted while a pod was force deleted in the API or in the local configuration, which is unusual."),
            self.orphaned_runtime_pods.clone(),
        );
        add(
            &mut v,
            "kubelet_managed_ephemeral_containers",
            alpha!("Current number of ephemeral containers in pods managed by this kubelet."),
            self.managed_ephemeral_containers.clone(),
        );
        add(
            &mut v,
            "kubelet_cpu_manager_pinning_requests",
            alpha!("The number of cpu core allocations which required pinning."),
            self.cpu_manager_pinning_requests.clone(),
        );
        add(
            &mut v,
            "kubelet_cpu_manager_pinning_errors",
            alpha!("The number of cpu core allocations which required pinning failed."),
            self.cpu_manager_pinning_errors.clone(),
        );
        // Registered while the MemoryManager gate is on (GA, always).
        add(
            &mut v,
            "kubelet_memory_manager_pinning_requests",
            alpha!("The number of memory pages allocations which required pinning."),
            self.memory_manager_pinning_requests.clone(),
        );
        add(
            &mut v,
            "kubelet_memory_manager_pinning_errors",
            alpha!("The number of memory pages allocations which required pinning that failed."),
            self.memory_manager_pinning_errors.clone(),
        );
        add(
            &mut v,
            "kubelet_topology_manager_admission_requests",
            alpha!("The number of admission requests where resources have to be aligned."),
            self.topology_manager_admission_requests.clone(),
        );
        add(
            &mut v,
            "kubelet_topology_manager_admission_errors",
            alpha!(
                "The number of admission request failures where resources could not be aligned."
            ),
            self.topology_manager_admission_errors.clone(),
        );
        add(
            &mut v,
            "kubelet_topology_manager_admission_duration_ms",
            alpha!("Duration in milliseconds to serve a pod admission request."),
            self.topology_manager_admission_duration_ms.clone(),
        );
        add(
            &mut v,
            "kubelet_orphan_pod_cleaned_volumes",
            alpha!("The total number of orphaned Pods whose volumes were cleaned in the last periodic sweep."),
            self.orphan_pod_cleaned_volumes.clone(),
        );
        add(
            &mut v,
            "kubelet_orphan_pod_cleaned_volumes_errors",
            alpha!("The number of orphaned Pods whose volumes failed to be cleaned in the last periodic sweep."),
            self.orphan_pod_cleaned_volumes_errors.clone(),
        );
        let [pre_kubelet, pre_reg, reg, post_reg, total] = &self.node_startup;
        for (name, help, g) in [
            (
                "kubelet_node_startup_pre_kubelet_duration_seconds",
                alpha!("Duration in seconds of node startup before kubelet starts."),
                pre_kubelet,
            ),
            (
                "kubelet_node_startup_pre_registration_duration_seconds",
                alpha!("Duration in seconds of node startup before registration."),
                pre_reg,
            ),
            (
                "kubelet_node_startup_registration_duration_seconds",
                alpha!("Duration in seconds of node startup during registration."),
                reg,
            ),
            (
                "kubelet_node_startup_post_registration_duration_seconds",
                alpha!("Duration in seconds of node startup after registration."),
                post_reg,
            ),
            (
                "kubelet_node_startup_duration_seconds",
                alpha!("Duration in seconds of node startup in total."),
                total,
            ),
        ] {
            add(&mut v, name, help, g.clone());
        }
        // Registered while GracefulNodeShutdown and
        // GracefulNodeShutdownBasedOnPodPriority are on (both default on).
        // 1.31's end-time help repeated the start-time text; 1.34's says
        // "end" (the generated 1.34 metrics reference).
        add(
            &mut v,
            "kubelet_graceful_shutdown_start_time_seconds",
            alpha!("Last graceful shutdown start time since unix epoch in seconds"),
            self.graceful_shutdown_start.clone(),
        );
        add(
            &mut v,
            "kubelet_graceful_shutdown_end_time_seconds",
            alpha!("Last graceful shutdown end time since unix epoch in seconds"),
            self.graceful_shutdown_end.clone(),
        );
        add(
            &mut v,
            "kubelet_lifecycle_handler_http_fallbacks",
            alpha!(
                "The number of times lifecycle handlers successfully fell back to http from https."
            ),
            self.lifecycle_handler_http_fallbacks.clone(),
        );
        add(
            &mut v,
            "kubelet_sleep_action_terminated_early",
            alpha!("The number of times lifecycle sleep handler got terminated before it finishes"),
            self.sleep_action_terminated_early.clone(),
        );
        add(
            &mut v,
            "kubelet_cgroup_version",
            alpha!("cgroup version on the hosts."),
            self.cgroup_version.clone(),
        );
        v
    }
}

/// The process-wide metrics (upstream's package-level vars).
pub static METRICS: LazyLock<KubeletMetrics> = LazyLock::new(|| KubeletMetrics {
    node_name: Family::default(),
    pod_worker_duration: Family::new_with_constructor(def_histogram),
    pod_start_duration: startup_histogram(),
    image_pull_duration: Family::new_with_constructor(image_pull_histogram),
    pod_start_sli_duration: startup_histogram(),
    pod_start_total_duration: startup_histogram(),
    first_network_pod_start_sli_duration: GaugeF::default(),
    pod_worker_start_duration: def_histogram(),
    cgroup_manager_duration: Family::new_with_constructor(def_histogram),
    pleg_relist_duration: def_histogram(),
    pleg_relist_interval: def_histogram(),
    pleg_discard_events: Counter::default(),
    pleg_last_seen: GaugeF::default(),
    runtime_operations: Family::default(),
    runtime_operations_duration: Family::new_with_constructor(runtime_op_histogram),
    runtime_operations_errors: Family::default(),
    evictions: Family::default(),
    running_pods: Gauge::default(),
    running_containers: Family::default(),
    restarted_pods: Family::default(),
    started_pods: Counter::default(),
    started_pods_errors: Counter::default(),
    started_containers: Family::default(),
    started_containers_errors: Family::default(),
    http_requests: Family::default(),
    http_requests_duration: Family::new_with_constructor(def_histogram),
    http_inflight_requests: Family::default(),
    volume_metric_collection_duration: Family::new_with_constructor(def_histogram),
    rest_client_requests: Family::default(),
    rest_client_request_duration: Family::new_with_constructor(rest_latency_histogram),
    rest_client_request_size: Family::new_with_constructor(rest_size_histogram),
    rest_client_response_size: Family::new_with_constructor(rest_size_histogram),
    rest_client_rate_limiter_duration: Family::new_with_constructor(rest_latency_histogram),
    rest_client_request_retries: Family::default(),
    rest_client_exec_plugin_ttl: {
        let g = GaugeF::default();
        g.set(f64::INFINITY);
        g
    },
    rest_client_exec_plugin_rotation_age: Histogram::new(EXEC_ROTATION_BUCKETS),
    rest_client_exec_plugin_calls: Family::default(),
    build_info: Family::default(),
    volume_stats: Default::default(),
    volume_health_abnormal: Family::default(),
    credential_provider_plugin_duration: Family::new_with_constructor(def_histogram),
    credential_provider_plugin_errors: Family::default(),
    rare: RareMetrics::new(),
    v134: v134::V134Metrics::new(),
    absent: absent::AbsentMetrics::new(),
    cm: cm::CmMetrics::new(),
});

/// `kubelet_container_log_filesystem_used_bytes` series of the scrape in
/// progress (upstream's logMetricsCollector, `collectors/log_metrics.go`):
/// set from the pod stats under `SCRAPE` just before encoding.
static LOG_SIZES: Mutex<Vec<(LogLabels, u64)>> = Mutex::new(Vec::new());

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LogLabels {
    pub container: String,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
}

/// The log sizes as a const-metric collector: like client_golang, no
/// series means no family at all.
#[derive(Debug)]
struct LogSizes;

impl Collector for LogSizes {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sizes = LOG_SIZES.lock();
        if sizes.is_empty() {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(
            "kubelet_container_log_filesystem_used_bytes",
            alpha!("Bytes used by the container's logs on the filesystem."),
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (l, used) in sizes.iter() {
            let g = prometheus_client::metrics::gauge::ConstGauge::new(
                (*used).min(i64::MAX as u64) as i64,
            );
            g.encode(m.encode_family(l)?)?;
        }
        Ok(())
    }
}

/// Each container's log usage from the pod stats (none when they could not
/// be collected: upstream logs the error and emits nothing).
fn update_log_sizes(snap: Option<&crate::stats::provider::Snapshot>) {
    let mut sizes = LOG_SIZES.lock();
    sizes.clear();
    let Some(snap) = snap else {
        return;
    };
    for p in &snap.pods {
        for c in &p.containers {
            if let Some((used, _)) = c.logs {
                sizes.push((
                    LogLabels {
                        container: c.name.clone(),
                        namespace: p.namespace.clone(),
                        pod: p.name.clone(),
                        uid: p.uid.clone(),
                    },
                    used,
                ));
            }
        }
    }
}

/// Whether credential provider plugins were registered (their families are
/// exposed from then on).
static CREDENTIAL_PROVIDER_METRICS: AtomicBool = AtomicBool::new(false);

/// The DynamicResourceAllocation and ImageVolume gates, at their 1.34
/// defaults until [`apply_feature_gates`] reads the configuration.
static DRA_GATE: AtomicBool = AtomicBool::new(true);
static IMAGE_VOLUME_GATE: AtomicBool = AtomicBool::new(false);

/// Families upstream registers only while a feature gate is on follow the
/// configuration's gates, and `kubernetes_feature_enabled` shows them all
/// (upstream's `AddMetrics`, called once the gates are set). Also takes
/// `rotateCertificates`, which decides how the transport cache families
/// count the kubelet's clients (`transport.rs`).
pub fn apply_feature_gates(cfg: &crate::config::KubeletConfiguration) {
    let (dra, image_volume) = gated_families(cfg);
    DRA_GATE.store(dra, Ordering::Relaxed);
    IMAGE_VOLUME_GATE.store(image_volume, Ordering::Relaxed);
    *FEATURE_STATES.lock() = Some(feature_states(cfg));
    transport::set_rotating(cfg.rotate_certificates);
}

/// Whether each gate of [`crate::config::features::GATES`] is on, in its
/// order; `None` until [`apply_feature_gates`].
static FEATURE_STATES: Mutex<Option<Vec<bool>>> = Mutex::new(None);

fn feature_states(cfg: &crate::config::KubeletConfiguration) -> Vec<bool> {
    crate::config::features::GATES
        .iter()
        .map(|g| cfg.feature_gate(g.name))
        .collect()
}

const FEATURE_HELP: &str =
    beta!("This metric records the data about the stage and enablement of a k8s feature.");

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeatureLabels {
    name: &'static str,
    stage: &'static str,
}

/// `kubernetes_feature_enabled{name,stage}`: component-base
/// `metrics/prometheus/feature/metrics.go` (BETA in 1.34), set by
/// featuregate's `AddMetrics` for every known gate, AllAlpha and AllBeta
/// included, to 1 or 0; no family before that. Series in gate-name order,
/// as client_golang sorts them.
#[derive(Debug)]
struct FeatureInfo(&'static Mutex<Option<Vec<bool>>>);

impl Collector for FeatureInfo {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let states = self.0.lock();
        let Some(states) = states.as_ref() else {
            return Ok(());
        };
        let mut m = enc.encode_descriptor(
            "kubernetes_feature_enabled",
            FEATURE_HELP,
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (gate, &on) in crate::config::features::GATES.iter().zip(states) {
            let labels = FeatureLabels {
                name: gate.name,
                stage: gate.stage.as_str(),
            };
            prometheus_client::metrics::gauge::ConstGauge::new(i64::from(on))
                .encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// (DynamicResourceAllocation, ImageVolume) as configured.
fn gated_families(cfg: &crate::config::KubeletConfiguration) -> (bool, bool) {
    (
        cfg.feature_gate("DynamicResourceAllocation"),
        cfg.feature_gate("ImageVolume"),
    )
}

/// Whether a scrape has health series: upstream's collector describes
/// kubelet_volume_stats_health_status_abnormal always, but client_golang
/// writes no family without samples, so it shows only while some claim's
/// stats carry a volume condition (never with CSIVolumeHealth off).
static VOLUME_HEALTH_SERIES: AtomicBool = AtomicBool::new(false);

/// The `/metrics` registry. Names, help and label names follow upstream's
/// metrics.go (kubelet subsystem), server/metrics/metrics.go (HTTP),
/// component-base's restclient and version metrics.
static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let m = &*METRICS;
    let mut v: Vec<Described> = Vec::new();
    add(
        &mut v,
        "kubelet_node_name",
        alpha!("The node's name. The count is always 1."),
        m.node_name.clone(),
    );
    add(
        &mut v,
        "kubelet_pod_worker_duration_seconds",
        alpha!("Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync"),
        m.pod_worker_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_pod_start_duration_seconds",
        alpha!("Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run"),
        m.pod_start_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_image_pull_duration_seconds",
        alpha!("Duration in seconds to pull an image."),
        m.image_pull_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_pod_start_sli_duration_seconds",
        alpha!("Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch"),
        m.pod_start_sli_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_pod_start_total_duration_seconds",
        alpha!("Duration in seconds to start a pod since creation, including time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch"),
        m.pod_start_total_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_first_network_pod_start_sli_duration_seconds",
        concat!("[INTERNAL] ", "Duration in seconds to start the first network pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch"),
        m.first_network_pod_start_sli_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_cgroup_manager_duration_seconds",
        alpha!("Duration in seconds for cgroup manager operations. Broken down by method."),
        m.cgroup_manager_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_pod_worker_start_duration_seconds",
        alpha!("Duration in seconds from kubelet seeing a pod to starting a worker."),
        m.pod_worker_start_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_pleg_relist_duration_seconds",
        alpha!("Duration in seconds for relisting pods in PLEG."),
        m.pleg_relist_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_pleg_discard_events",
        alpha!("The number of discard events in PLEG."),
        m.pleg_discard_events.clone(),
    );
    add(
        &mut v,
        "kubelet_pleg_relist_interval_seconds",
        alpha!("Interval in seconds between relisting in PLEG."),
        m.pleg_relist_interval.clone(),
    );
    add(
        &mut v,
        "kubelet_pleg_last_seen_seconds",
        alpha!("Timestamp in seconds when PLEG was last seen active."),
        m.pleg_last_seen.clone(),
    );
    add(
        &mut v,
        "kubelet_runtime_operations",
        alpha!("Cumulative number of runtime operations by operation type."),
        m.runtime_operations.clone(),
    );
    add(
        &mut v,
        "kubelet_runtime_operations_duration_seconds",
        alpha!("Duration in seconds of runtime operations. Broken down by operation type."),
        m.runtime_operations_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_runtime_operations_errors",
        alpha!("Cumulative number of runtime operation errors by operation type."),
        m.runtime_operations_errors.clone(),
    );
    add(
        &mut v,
        "kubelet_evictions",
        alpha!("Cumulative number of pod evictions by eviction signal"),
        m.evictions.clone(),
    );
    add(
        &mut v,
        "kubelet_running_pods",
        alpha!("Number of pods that have a running pod sandbox"),
        m.running_pods.clone(),
    );
    add(
        &mut v,
        "kubelet_running_containers",
        alpha!("Number of containers currently running"),
        m.running_containers.clone(),
    );
    add(
        &mut v,
        "kubelet_restarted_pods",
        alpha!("Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)"),
        m.restarted_pods.clone(),
    );
    add(
        &mut v,
        "kubelet_started_pods",
        alpha!("Cumulative number of pods started"),
        m.started_pods.clone(),
    );
    add(
        &mut v,
        "kubelet_started_pods_errors",
        alpha!("Cumulative number of errors when starting pods"),
        m.started_pods_errors.clone(),
    );
    add(
        &mut v,
        "kubelet_started_containers",
        alpha!("Cumulative number of containers started"),
        m.started_containers.clone(),
    );
    add(
        &mut v,
        "kubelet_started_containers_errors",
        alpha!("Cumulative number of errors when starting containers"),
        m.started_containers_errors.clone(),
    );
    // pkg/kubelet/server/metrics: ALPHA since they carry a stability
    // level (as in the 1.34 tree), with the volume stats timing.
    add(
        &mut v,
        "kubelet_http_requests",
        alpha!("Number of the http requests received since the server started"),
        m.http_requests.clone(),
    );
    add(
        &mut v,
        "kubelet_http_requests_duration_seconds",
        alpha!("Duration in seconds to serve http requests"),
        m.http_requests_duration.clone(),
    );
    add(
        &mut v,
        "kubelet_http_inflight_requests",
        alpha!("Number of the inflight http requests"),
        m.http_inflight_requests.clone(),
    );
    add(
        &mut v,
        "kubelet_volume_metric_collection_duration_seconds",
        alpha!("Duration in seconds to calculate volume stats"),
        m.volume_metric_collection_duration.clone(),
    );
    // component-base's restclient/metrics.go registers these whatever
    // the client does (its DNS resolver histogram is left unregistered
    // there, and here); its transport cache families are
    // `transport::TransportCollector`.
    add(
        &mut v,
        "rest_client_request_duration_seconds",
        alpha!("Request latency in seconds. Broken down by verb, and host."),
        m.rest_client_request_duration.clone(),
    );
    add(
        &mut v,
        "rest_client_request_size_bytes",
        alpha!("Request size in bytes. Broken down by verb and host."),
        m.rest_client_request_size.clone(),
    );
    add(
        &mut v,
        "rest_client_response_size_bytes",
        alpha!("Response size in bytes. Broken down by verb and host."),
        m.rest_client_response_size.clone(),
    );
    add(
        &mut v,
        "rest_client_rate_limiter_duration_seconds",
        alpha!("Client side rate limiter latency in seconds. Broken down by verb, and host."),
        m.rest_client_rate_limiter_duration.clone(),
    );
    add(
        &mut v,
        "rest_client_requests",
        alpha!("Number of HTTP requests, partitioned by status code, method, and host."),
        m.rest_client_requests.clone(),
    );
    add(
        &mut v,
        "rest_client_request_retries",
        alpha!("Number of request retries, partitioned by status code, verb, and host."),
        m.rest_client_request_retries.clone(),
    );
    add(
        &mut v,
        "rest_client_exec_plugin_ttl_seconds",
        alpha!("Gauge of the shortest TTL (time-to-live) of the client certificate(s) managed by the auth exec plugin. The value is in seconds until certificate expiry (negative if already expired). If auth exec plugins are unused or manage no TLS certificates, the value will be +INF."),
        m.rest_client_exec_plugin_ttl.clone(),
    );
    add(
        &mut v,
        "rest_client_exec_plugin_certificate_rotation_age",
        alpha!("Histogram of the number of seconds the last auth exec plugin client certificate lived before being rotated. If auth exec plugin client certificates are unused, histogram will contain no data."),
        m.rest_client_exec_plugin_rotation_age.clone(),
    );
    add(
        &mut v,
        "rest_client_exec_plugin_call",
        alpha!("Number of calls to an exec plugin, partitioned by the type of event encountered (no_error, plugin_execution_error, plugin_not_found_error, client_internal_error) and an optional exit code. The exit code will be set to 0 if and only if the plugin call was successful."),
        m.rest_client_exec_plugin_calls.clone(),
    );
    add(
        &mut v,
        "kubernetes_build_info",
        alpha!("A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running."),
        m.build_info.clone(),
    );
    let [cap, avail, used, inodes, free, iused] = &m.volume_stats;
    for (name, help, f) in [
        (
            "kubelet_volume_stats_capacity_bytes",
            alpha!("Capacity in bytes of the volume"),
            cap,
        ),
        (
            "kubelet_volume_stats_available_bytes",
            alpha!("Number of available bytes in the volume"),
            avail,
        ),
        (
            "kubelet_volume_stats_used_bytes",
            alpha!("Number of used bytes in the volume"),
            used,
        ),
        (
            "kubelet_volume_stats_inodes",
            alpha!("Maximum number of inodes in the volume"),
            inodes,
        ),
        (
            "kubelet_volume_stats_inodes_free",
            alpha!("Number of free inodes in the volume"),
            free,
        ),
        (
            "kubelet_volume_stats_inodes_used",
            alpha!("Number of used inodes in the volume"),
            iused,
        ),
    ] {
        add(&mut v, name, help, f.clone());
    }
    // Constant series, set once.
    m.build_info.get_or_create(&build_info()).set(1);
    // pkg/credentialprovider/plugin/metrics.go; the counter is named
    // `..._errors_total` there (since 1.34), sampled so here.
    let plugins: Vec<Described> = vec![
        (
            "kubelet_credential_provider_plugin_errors",
            alpha!("Number of errors from credential provider plugin"),
            Box::new(m.credential_provider_plugin_errors.clone()),
        ),
        (
            "kubelet_credential_provider_plugin_duration",
            alpha!("Duration of execution in seconds for credential provider plugin"),
            Box::new(m.credential_provider_plugin_duration.clone()),
        ),
    ];
    v.extend(m.rare.described());
    v.extend(m.v134.described());
    v.extend(m.absent.described());
    v.extend(m.cm.described());
    v.extend(certvol::described());
    let dra = m.absent.gated_by_dra();
    let image_volume = m.absent.gated_by_image_volume();
    // What registered_metrics_total counts (meta.rs): the lists as their
    // parts register them, the collectors upstream builds from
    // component-base metrics, and the probes' and meta-metrics' own.
    let mut regs = meta::registrations(&v, None);
    regs.extend(meta::registrations(
        &plugins,
        Some(&CREDENTIAL_PROVIDER_METRICS),
    ));
    regs.extend(meta::registrations(&dra, Some(&DRA_GATE)));
    regs.extend(meta::registrations(&image_volume, Some(&IMAGE_VOLUME_GATE)));
    regs.extend(meta::helps(transport::FAMILIES, None));
    regs.extend(meta::helps(
        [("kubernetes_feature_enabled", FEATURE_HELP)],
        None,
    ));
    for (gate, families) in certvol::registrations() {
        regs.extend(meta::helps(families, Some(gate)));
    }
    regs.extend(meta::own());
    let mut r = Registry::default();
    r.register_collector(Box::new(Exact(v)));
    r.register_collector(Box::new(Gated(
        &CREDENTIAL_PROVIDER_METRICS,
        Exact(plugins),
    )));
    r.register_collector(Box::new(Gated(&DRA_GATE, Exact(dra))));
    r.register_collector(Box::new(Gated(&IMAGE_VOLUME_GATE, Exact(image_volume))));
    // pkg/kubelet/metrics/collectors/volume_stats.go.
    r.register_collector(Box::new(Gated(
        &VOLUME_HEALTH_SERIES,
        Exact(vec![(
            "kubelet_volume_stats_health_status_abnormal",
            alpha!("Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy"),
            Box::new(m.volume_health_abnormal.clone()),
        )]),
    )));
    r.register_collector(Box::new(v134::ConfigInfo(&v134::CONFIG_HASH)));
    r.register_collector(Box::new(FeatureInfo(&FEATURE_STATES)));
    r.register_collector(Box::new(LogSizes));
    r.register_collector(Box::new(certvol::CertCollector));
    r.register_collector(Box::new(certvol::TotalVolumes));
    r.register_collector(Box::new(process::ProcessCollector));
    r.register_collector(Box::new(transport::TransportCollector));
    r.register_collector(Box::new(meta::MetaMetrics(regs)));
    r
});

type Described = (
    &'static str,
    &'static str,
    Box<dyn EncodeMetric + Send + Sync>,
);

fn add(
    v: &mut Vec<Described>,
    name: &'static str,
    help: &'static str,
    m: impl EncodeMetric + Send + Sync + 'static,
) {
    v.push((name, help, Box::new(m)));
}

/// Encodes the metrics with their help text as given: `Registry::register`
/// appends a period, which would change upstream's help strings.
struct Exact(Vec<Described>);

impl std::fmt::Debug for Exact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|d| d.0)).finish()
    }
}

impl Collector for Exact {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, m) in &self.0 {
            m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)?;
        }
        Ok(())
    }
}

/// Families registered only once their part starts, as upstream registers
/// them late.
struct Gated(&'static AtomicBool, Exact);

impl std::fmt::Debug for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.1.fmt(f)
    }
}

impl Collector for Gated {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.load(Ordering::Relaxed) {
            self.1.encode(enc)?;
        }
        Ok(())
    }
}

fn build_info() -> BuildInfo {
    BuildInfo {
        build_date: "",
        compiler: "rustc",
        git_commit: "",
        git_tree_state: "",
        git_version: concat!("v", env!("CARGO_PKG_VERSION")),
        // Not a Go binary: left empty rather than faked.
        go_version: "",
        major: env!("CARGO_PKG_VERSION_MAJOR"),
        minor: env!("CARGO_PKG_VERSION_MINOR"),
        platform: PLATFORM,
    }
}

const PLATFORM: &str = if cfg!(target_arch = "x86_64") {
    "linux/amd64"
} else if cfg!(target_arch = "aarch64") {
    "linux/arm64"
} else {
    "linux/unknown"
};

/// Sets `kubelet_node_name{node}` (once, at startup; upstream does the same).
pub fn set_node_name(node: &str) {
    METRICS
        .node_name
        .get_or_create(&NodeLabel { node: node.into() })
        .set(1);
}

// ------------------------------------------------------------ runtime

/// Upstream's instrumented-service operation names (snake case, as in
/// `pkg/kubelet/kuberuntime/instrumented_services.go`) for rkubelet's CRI
/// method names.
pub fn operation_type(cri_method: &'static str) -> &'static str {
    match cri_method {
        "Version" => "version",
        "Status" => "status",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "ExecSync" => "exec_sync",
        "Exec" => "exec",
        "Attach" => "attach",
        "PortForward" => "port_forward",
        "ListContainerStats" => "list_container_stats",
        "ListPodSandboxStats" => "list_podsandbox_stats",
        "ReopenContainerLog" => "reopen_container_log",
        "CheckpointContainer" => "checkpoint_container",
        "GetContainerEvents" => "get_container_events",
        "ListImages" => "list_images",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        other => other,
    }
}

/// One finished CRI call: `kubelet_runtime_operations_total`,
/// `..._duration_seconds` and, on error, `..._errors_total`.
pub fn runtime_operation(cri_method: &'static str, took: Duration, ok: bool) {
    let l = OperationType {
        operation_type: operation_type(cri_method),
    };
    let m = &*METRICS;
    m.runtime_operations.get_or_create(&l).inc();
    m.runtime_operations_duration
        .get_or_create(&l)
        .observe(took.as_secs_f64());
    if !ok {
        m.runtime_operations_errors.get_or_create(&l).inc();
    }
}

// ------------------------------------------------------------ pleg

/// One relist: its duration, the interval since the previous relist's
/// start, and, when it succeeded, the last-seen timestamp.
pub fn pleg_relist(took: Duration, interval: Option<Duration>, ok: bool) {
    let m = &*METRICS;
    m.pleg_relist_duration.observe(took.as_secs_f64());
    if let Some(i) = interval {
        m.pleg_relist_interval.observe(i.as_secs_f64());
    }
    if ok {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        m.pleg_last_seen.set(now);
    }
}

/// A PLEG event dropped because the channel was full.
pub fn pleg_discarded() {
    METRICS.pleg_discard_events.inc();
}

// ------------------------------------------------------------ pods

/// `kubelet_pod_worker_duration_seconds{operation_type}`: create, update,
/// sync or kill, as upstream's SyncPodType strings.
pub fn pod_worker_duration(operation: &'static str, took: Duration) {
    METRICS
        .pod_worker_duration
        .get_or_create(&OperationType {
            operation_type: operation,
        })
        .observe(took.as_secs_f64());
}

pub fn pod_worker_start(took: Duration) {
    METRICS
        .pod_worker_start_duration
        .observe(took.as_secs_f64());
}

/// Upstream's GetImageSizeBucket: the label for an image of `size` bytes.
pub fn image_size_bucket(size: u64) -> &'static str {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const BUCKETS: [(u64, &str); 12] = [
        (0, "0-10MB"),
        (10 * MIB, "10MB-100MB"),
        (100 * MIB, "100MB-500MB"),
        (500 * MIB, "500MB-1GB"),
        (GIB, "1GB-5GB"),
        (5 * GIB, "5GB-10GB"),
        (10 * GIB, "10GB-20GB"),
        (20 * GIB, "20GB-30GB"),
        (30 * GIB, "30GB-40GB"),
        (40 * GIB, "40GB-60GB"),
        (60 * GIB, "60GB-100GB"),
        (100 * GIB, "GT100GB"),
    ];
    if size == 0 {
        return "N/A";
    }
    BUCKETS
        .iter()
        .rev()
        .find(|(lower, _)| size > *lower)
        .map_or("", |(_, label)| label)
}

/// A successful pull, timed from when it was queued for a slot (upstream
/// counts the puller's queue too).
pub fn image_pulled(size: u64, took: Duration) {
    METRICS
        .image_pull_duration
        .get_or_create(&ImageSize {
            image_size_in_bytes: image_size_bucket(size),
        })
        .observe(took.as_secs_f64());
}

pub fn pod_start(took: Duration) {
    METRICS.pod_start_duration.observe(took.as_secs_f64());
}

/// A sandbox creation (`kubelet_started_pods_total`, `..._errors_total`).
pub fn started_pod(ok: bool) {
    METRICS.started_pods.inc();
    if !ok {
        METRICS.started_pods_errors.inc();
    }
}

/// A container start; `container_type` is `container`, `init_container`
/// or `ephemeral_container`; `code` the error's CRI code on failure.
pub fn started_container(container_type: &'static str, err_code: Option<&str>) {
    METRICS
        .started_containers
        .get_or_create(&ContainerType { container_type })
        .inc();
    if let Some(code) = err_code {
        METRICS
            .started_containers_errors
            .get_or_create(&ContainerTypeCode {
                container_type,
                code: code.into(),
            })
            .inc();
    }
}

pub fn restarted_pod(is_static: bool) {
    METRICS
        .restarted_pods
        .get_or_create(&StaticLabel {
            r#static: if is_static { "true" } else { "false" },
        })
        .inc();
}

/// Go's `codes.Code.String()` for a CRI error (the `code` label of
/// `kubelet_started_containers_errors_total`).
pub fn cri_code(e: &crate::cri::CriError) -> &'static str {
    use crate::cri::CriError;
    match e {
        CriError::NotFound { .. } => "NotFound",
        CriError::DeadlineExceeded { .. } => "DeadlineExceeded",
        CriError::Unavailable { .. } => "Unavailable",
        CriError::Status { code, .. } => grpc_code_name(*code),
        CriError::Endpoint { .. } => "Unknown",
    }
}

/// Go's `codes.Code.String()`.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "Canceled",
        tonic::Code::Unknown => "Unknown",
        tonic::Code::InvalidArgument => "InvalidArgument",
        tonic::Code::DeadlineExceeded => "DeadlineExceeded",
        tonic::Code::NotFound => "NotFound",
        tonic::Code::AlreadyExists => "AlreadyExists",
        tonic::Code::PermissionDenied => "PermissionDenied",
        tonic::Code::ResourceExhausted => "ResourceExhausted",
        tonic::Code::FailedPrecondition => "FailedPrecondition",
        tonic::Code::Aborted => "Aborted",
        tonic::Code::OutOfRange => "OutOfRange",
        tonic::Code::Unimplemented => "Unimplemented",
        tonic::Code::Internal => "Internal",
        tonic::Code::Unavailable => "Unavailable",
        tonic::Code::DataLoss => "DataLoss",
        tonic::Code::Unauthenticated => "Unauthenticated",
    }
}

/// A container start attempt with its result (upstream counts in
/// `startContainer`: the attempt, and on a failed create or start the
/// error by gRPC code).
/// `container_type` is upstream's: `container`, `init_container` or
/// `ephemeral_container`.
pub fn started_container_result(
    container_type: &'static str,
    r: Result<(), &crate::cri::CriError>,
) {
    started_container(container_type, r.err().map(cri_code));
}

/// Time since the pod's `kubernetes.io/config.seen` annotation (when a
/// source first saw it), if present and parseable.
fn since_seen(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Duration> {
    let seen = pod
        .metadata
        .annotations
        .as_ref()?
        .get(crate::source::CONFIG_FIRST_SEEN_ANNOTATION)?;
    let t: k8s_openapi::jiff::Timestamp = seen.parse().ok()?;
    let now = k8s_openapi::jiff::Timestamp::now();
    Duration::try_from(now.duration_since(t)).ok()
}

/// A pod worker starts for `pod` (`kubelet_pod_worker_start_duration_seconds`,
/// measured from config.seen: rkubelet's time of first sight).
pub fn pod_worker_started(pod: Option<&k8s_openapi::api::core::v1::Pod>) {
    if let Some(d) = pod.and_then(since_seen) {
        pod_worker_start(d);
    }
}

fn is_first_start(previous: Option<&str>, new: Option<&str>) -> bool {
    matches!(previous, None | Some("Pending")) && new == Some("Running")
}

/// A generated status: the first move from Pending (or no status) to
/// Running observes `kubelet_pod_start_duration_seconds` since config.seen,
/// as upstream's SyncPod does.
pub fn pod_phase_changed(
    pod: &k8s_openapi::api::core::v1::Pod,
    previous: Option<&str>,
    new: Option<&str>,
) {
    if is_first_start(previous, new) {
        if let Some(d) = since_seen(pod) {
            pod_start(d);
        }
    }
}

// ------------------------------------------------------------ rarer families

/// A pod handed to its worker for creation (upstream's dispatchWork with
/// SyncPodCreate, after admission): its number of regular containers.
pub fn containers_per_pod(pod: &k8s_openapi::api::core::v1::Pod) {
    let n = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    METRICS.rare.containers_per_pod.observe(n as f64);
}

/// One RunPodSandbox call with the RuntimeClass handler it asked for ("" by
/// default), as upstream's instrumented runtime service records it.
pub fn run_podsandbox(handler: &str, took: Duration, ok: bool) {
    let l = RuntimeHandler {
        runtime_handler: handler.to_string(),
    };
    let r = &METRICS.rare;
    r.run_podsandbox_duration
        .get_or_create(&l)
        .observe(took.as_secs_f64());
    if !ok {
        r.run_podsandbox_errors.get_or_create(&l).inc();
    }
}

/// HandlePodCleanups' pod counts: `pods` yields (static, active) for each
/// pod the sources want; `static` is "true" or "" as upstream labels it.
pub fn set_pod_counts(pods: impl IntoIterator<Item = (bool, bool)>) {
    let (desired, active) = pod_counts(pods);
    let r = &METRICS.rare;
    for (i, label) in ["", "true"].into_iter().enumerate() {
        let l = StaticLabel { r#static: label };
        r.desired_pods.get_or_create(&l).set(desired[i]);
        r.active_pods.get_or_create(&l).set(active[i]);
    }
}

/// (desired, active) pods, each as [regular, static].
fn pod_counts(pods: impl IntoIterator<Item = (bool, bool)>) -> ([i64; 2], [i64; 2]) {
    let (mut desired, mut active) = ([0i64; 2], [0i64; 2]);
    for (is_static, is_active) in pods {
        let i = usize::from(is_static);
        desired[i] += 1;
        if is_active {
            active[i] += 1;
        }
    }
    (desired, active)
}

/// `kubelet_managed_ephemeral_containers`: the ephemeral containers in
/// the specs of the pods the pod manager holds (upstream's pod manager
/// adds and subtracts them as pods come and go; the sum at scrape time is
/// the same figure).
fn ephemeral_containers(pods: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>]) -> i64 {
    pods.iter()
        .filter_map(|p| p.spec.as_ref()?.ephemeral_containers.as_ref())
        .map(|e| e.len() as i64)
        .sum()
}

/// Upstream's PodWorkerState strings.
pub fn worker_lifecycle(p: crate::podworkers::WorkerPhase) -> &'static str {
    use crate::podworkers::WorkerPhase::*;
    match p {
        Syncing => "sync",
        Terminating => "terminating",
        Terminated => "terminated",
    }
}

/// The 15 `kubelet_working_pods` series HandlePodCleanups sets: per
/// lifecycle, "desired" (in config) and "orphan" (a pod spec no longer in
/// config) by static "true"/"", and "runtime_only" (no spec: found only in
/// the runtime) with static "unknown". `workers` yields (lifecycle,
/// orphan, has a spec, static).
fn working_pod_counts(
    workers: impl IntoIterator<Item = (&'static str, bool, bool, bool)>,
) -> Vec<(WorkingLabels, i64)> {
    let key = |lifecycle: &'static str, orphan: bool, has_config: bool, st: bool| {
        let (config, r#static) = match (orphan, has_config) {
            (_, false) => ("runtime_only", "unknown"),
            (false, true) => ("desired", if st { "true" } else { "" }),
            (true, true) => ("orphan", if st { "true" } else { "" }),
        };
        WorkingLabels {
            lifecycle,
            config,
            r#static,
        }
    };
    let mut out: Vec<(WorkingLabels, i64)> = Vec::with_capacity(15);
    for lifecycle in ["sync", "terminating", "terminated"] {
        for (orphan, has_config, st) in [
            (false, true, true),
            (false, true, false),
            (true, true, true),
            (true, true, false),
            (true, false, false),
        ] {
            out.push((key(lifecycle, orphan, has_config, st), 0));
        }
    }
    for (lifecycle, orphan, has_config, st) in workers {
        let k = key(lifecycle, orphan || !has_config, has_config, st);
        if let Some(e) = out.iter_mut().find(|(l, _)| *l == k) {
            e.1 += 1;
        }
    }
    out
}

/// Sets `kubelet_working_pods` from the pod workers (at housekeeping).
pub fn set_working_pods(workers: impl IntoIterator<Item = (&'static str, bool, bool, bool)>) {
    for (l, n) in working_pod_counts(workers) {
        METRICS.rare.working_pods.get_or_create(&l).set(n);
    }
}

/// The mirror pods the API shows for this node.
pub fn set_mirror_pods(n: usize) {
    METRICS.rare.mirror_pods.set(n as i64);
}

/// A pod found in the runtime that no pod worker knew.
pub fn orphaned_runtime_pod() {
    METRICS.rare.orphaned_runtime_pods.inc();
}

/// One topology manager admission (upstream's manager with the none
/// policy admits every pod at once: 0 ms).
pub fn topology_manager_admission(took: Duration) {
    let r = &METRICS.rare;
    r.topology_manager_admission_requests.inc();
    // Upstream observes whole milliseconds.
    r.topology_manager_admission_duration_ms
        .observe(took.as_millis() as f64);
}

/// The last orphaned-pod-directory sweep: pods found, and those whose
/// directories could not be removed.
pub fn orphan_pod_sweep(found: usize, failed: usize) {
    let r = &METRICS.rare;
    r.orphan_pod_cleaned_volumes.set(found as i64);
    r.orphan_pod_cleaned_volumes_errors.set(failed as i64);
}

/// A sleep lifecycle handler cut short by its deadline.
pub fn sleep_action_terminated_early() {
    METRICS.rare.sleep_action_terminated_early.inc();
}

/// `kubelet_cgroup_version`: 2 on the unified hierarchy, else 1.
pub fn set_cgroup_version(unified: bool) {
    METRICS.rare.cgroup_version.set(if unified { 2 } else { 1 });
}

/// The cgroup version detected at start (1 or 2).
pub fn cgroup_version() -> i64 {
    METRICS.rare.cgroup_version.get()
}

/// Reads whether /sys/fs/cgroup is the unified (v2) hierarchy and sets
/// `kubelet_cgroup_version` (blocking stat; at startup).
pub fn detect_cgroup_version() {
    set_cgroup_version(crate::cm::node::cgroup_v2_unified());
}

// ------------------------------------------------------------ pod status sync

/// Pod UID (of the API object) → when its first unsent status change was
/// seen (upstream's versionedPodStatus.at: several changes before one
/// write count from the first).
static STATUS_PENDING: LazyLock<Mutex<std::collections::HashMap<String, tokio::time::Instant>>> =
    LazyLock::new(Default::default);

/// A status change of `uid` waits to be written to the API.
pub fn pod_status_pending(uid: &str) {
    STATUS_PENDING
        .lock()
        .entry(uid.to_string())
        .or_insert_with(tokio::time::Instant::now);
}

/// `uid`'s status was written: `kubelet_pod_status_sync_duration_seconds`
/// since its first pending change.
pub fn pod_status_synced(uid: &str) {
    if let Some(at) = STATUS_PENDING.lock().remove(uid) {
        METRICS
            .rare
            .pod_status_sync_duration
            .observe(at.elapsed().as_secs_f64());
    }
}

/// `uid`'s status has nowhere to go (its object is gone or replaced):
/// not observed, as upstream returns before its observation.
pub fn pod_status_dropped(uid: &str) {
    STATUS_PENDING.lock().remove(uid);
}

// ------------------------------------------------------------ node startup

/// Upstream's NodeStartupLatencyTracker (`pkg/kubelet/util/
/// node_startup_latency_tracker.go`): boot, kubelet start, first
/// registration attempt, registration of a new Node, first Ready. Only a
/// kubelet that created its Node sets the gauges, as upstream.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeStartupTracker {
    boot: Option<SystemTime>,
    kubelet_start: Option<SystemTime>,
    attempt: Option<SystemTime>,
    registered: Option<SystemTime>,
    ready: Option<SystemTime>,
}

fn secs_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

impl NodeStartupTracker {
    pub fn started(boot: Option<SystemTime>, now: SystemTime) -> Self {
        NodeStartupTracker {
            boot,
            kubelet_start: Some(now),
            ..Default::default()
        }
    }

    pub fn attempt_register(&mut self, now: SystemTime) {
        if self.attempt.is_none() {
            self.attempt = Some(now);
        }
    }

    /// (pre_kubelet, pre_registration, registration) when this is the first
    /// new registration after an attempt.
    pub fn registered_new(&mut self, now: SystemTime) -> Option<(Option<f64>, f64, f64)> {
        let (Some(start), Some(attempt)) = (self.kubelet_start, self.attempt) else {
            return None;
        };
        if self.registered.is_some() {
            return None;
        }
        self.registered = Some(now);
        Some((
            self.boot.map(|b| secs_between(b, start)),
            secs_between(start, attempt),
            secs_between(attempt, now),
        ))
    }

    /// (post_registration, total) on the first Ready after registering.
    pub fn node_ready(&mut self, now: SystemTime) -> Option<(f64, Option<f64>)> {
        let registered = self.registered?;
        if self.ready.is_some() {
            return None;
        }
        self.ready = Some(now);
        Some((
            secs_between(registered, now),
            self.boot.map(|b| secs_between(b, now)),
        ))
    }
}

static NODE_STARTUP: Mutex<NodeStartupTracker> = Mutex::new(NodeStartupTracker {
    boot: None,
    kubelet_start: None,
    attempt: None,
    registered: None,
    ready: None,
});

/// Boot time as upstream's GetBootTime: now less the uptime, truncated to
/// the second.
fn boot_time() -> Option<SystemTime> {
    let up: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let boot = SystemTime::now().checked_sub(Duration::from_secs(up as u64))?;
    let secs = boot.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// The kubelet starts (blocking read of /proc/uptime; at startup).
pub fn node_startup_kubelet_started() {
    *NODE_STARTUP.lock() = NodeStartupTracker::started(boot_time(), SystemTime::now());
}

/// A registration attempt of the Node object.
pub fn node_registration_attempt() {
    NODE_STARTUP.lock().attempt_register(SystemTime::now());
}

/// The Node object was created by this kubelet.
pub fn node_registered_new() {
    let r = NODE_STARTUP.lock().registered_new(SystemTime::now());
    if let Some((pre_kubelet, pre_reg, reg)) = r {
        let g = &METRICS.rare.node_startup;
        if let Some(p) = pre_kubelet {
            g[0].set(p);
        }
        g[1].set(pre_reg);
        g[2].set(reg);
    }
}

/// The node's Ready condition is true.
pub fn node_ready() {
    let r = NODE_STARTUP.lock().node_ready(SystemTime::now());
    if let Some((post, total)) = r {
        let g = &METRICS.rare.node_startup;
        g[3].set(post);
        if let Some(t) = total {
            g[4].set(t);
        }
    }
}

// ------------------------------------------------------------ credential provider plugins

/// Credential provider plugins were registered: their two families are
/// exposed from now on.
pub fn register_credential_provider_metrics() {
    CREDENTIAL_PROVIDER_METRICS.store(true, Ordering::Relaxed);
}

/// One plugin run (upstream's runPlugin): its duration whatever the
/// outcome, and an error when it could not be run, failed or timed out.
pub fn credential_provider_plugin_run(plugin: &str, took: Duration, failed: bool) {
    let l = PluginName {
        plugin_name: plugin.to_string(),
    };
    let m = &*METRICS;
    m.credential_provider_plugin_duration
        .get_or_create(&l)
        .observe(took.as_secs_f64());
    if failed {
        m.credential_provider_plugin_errors.get_or_create(&l).inc();
    }
}

// ------------------------------------------------------------ admission

/// A pod evicted for `signal` (`kubelet_evictions{eviction_signal}`).
pub fn eviction(signal: &str) {
    METRICS
        .evictions
        .get_or_create(&EvictionSignal {
            eviction_signal: signal.to_string(),
        })
        .inc();
}

/// How old the figures behind an eviction for `signal` were
/// (`kubelet_eviction_stats_age_seconds`).
pub fn eviction_stats_age(signal: &str, seconds: f64) {
    METRICS
        .absent
        .eviction_stats_age
        .get_or_create(&absent::EvictionSignalLabel {
            eviction_signal: signal.to_string(),
        })
        .observe(seconds);
}

/// An image removed by the image garbage collector, by why ("age" or
/// "space"; upstream's `kubelet_image_garbage_collected_total{reason}`).
pub fn image_garbage_collected(reason: &str) {
    METRICS
        .absent
        .image_garbage_collected
        .get_or_create(&absent::ReasonLabel {
            reason: reason.to_string(),
        })
        .inc();
}

/// The images collected for `reason` so far (unit tests).
#[cfg(test)]
pub fn image_garbage_collected_count(reason: &str) -> u64 {
    METRICS
        .absent
        .image_garbage_collected
        .get_or_create(&absent::ReasonLabel {
            reason: reason.to_string(),
        })
        .get()
}

/// A pod refused at admission, by its rejection reason
/// (`kubelet_admission_rejections_total{reason}`, upstream's
/// recordAdmissionRejection: unknown reasons fold into "Other").
pub fn admission_rejected(reason: &str) {
    METRICS
        .v134
        .admission_rejections
        .get_or_create(&v134::ReasonLabel {
            reason: v134::admission_rejection_label(reason),
        })
        .inc();
}

/// The resize gauges: pending ones by reason (lower-cased, as upstream's
/// `kubelet_pod_pending_resizes{reason}`) and those in progress.
pub fn resize_states((deferred, infeasible, in_progress): (i64, i64, i64)) {
    let m = &METRICS.v134;
    for (reason, n) in [("deferred", deferred), ("infeasible", infeasible)] {
        m.pod_pending_resizes
            .get_or_create(&v134::ReasonLabel { reason })
            .set(n);
    }
    m.pod_in_progress_resizes.set(in_progress);
}

/// A container's requested resize of one resource and requirement.
pub fn resize_requested(
    resource: &'static str,
    requirement: &'static str,
    operation: &'static str,
) {
    METRICS
        .v134
        .container_requested_resizes
        .get_or_create(&v134::ResizeRequestLabels {
            operation,
            requirement,
            resource,
        })
        .inc();
}

/// An Infeasible resize decision (`reason_detail` as upstream's).
pub fn resize_infeasible(reason_detail: &'static str) {
    METRICS
        .v134
        .pod_infeasible_resizes
        .get_or_create(&v134::ReasonDetailLabel { reason_detail })
        .inc();
}

/// A Deferred resize granted on a retry (`retry_trigger` as upstream's).
pub fn resize_deferred_accepted(retry_trigger: &'static str) {
    METRICS
        .v134
        .pod_deferred_accepted_resizes
        .get_or_create(&v134::RetryTriggerLabel { retry_trigger })
        .inc();
}

/// How long the runtime took to apply a pod's resize.
pub fn resize_actuated(d: std::time::Duration, success: bool) {
    METRICS
        .v134
        .pod_resize_duration_ms
        .get_or_create(&v134::SuccessLabel {
            success: if success { "true" } else { "false" },
        })
        .observe(d.as_secs_f64() * 1000.0);
}

/// The runtime does not implement CRI RuntimeConfig: the Kubernetes version
/// that will stop falling back to the configured cgroup driver
/// (`kubelet_cri_losing_support{version} 1`, as upstream's
/// getCgroupDriverFromCRI sets it).
pub fn cri_losing_support(version: &'static str) {
    METRICS
        .v134
        .cri_losing_support
        .get_or_create(&v134::VersionLabel { version })
        .set(1);
}

/// One volume measured for the stats (upstream's
/// CollectVolumeStatCalDuration, deferred in each metrics provider's
/// GetMetrics: "du" for a walked directory, "statfs" for a file system's
/// figures, the driver's name for a CSI volume), whatever the outcome.
pub fn volume_stats_measured(source: &str, took: Duration) {
    METRICS
        .volume_metric_collection_duration
        .get_or_create(&MetricSource {
            metric_source: source.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// How many requests to `host` with `verb` waited for the rate limiter
/// (tests).
#[cfg(test)]
pub fn rest_client_throttled_count(host: &str, verb: &str) -> u64 {
    histogram_count(
        METRICS.rest_client_rate_limiter_duration.clone(),
        &format!("host=\"{host}\",verb=\"{verb}\""),
    )
}

/// How many `source` measurements were timed (tests).
#[cfg(test)]
pub fn volume_stats_measured_count(source: &str) -> u64 {
    histogram_count(
        METRICS.volume_metric_collection_duration.clone(),
        &format!("metric_source=\"{source}\""),
    )
}

/// The observation count of one series (`labels` as written) of a
/// histogram family (tests).
#[cfg(test)]
fn histogram_count(family: impl prometheus_client::registry::Metric, labels: &str) -> u64 {
    let mut r = Registry::default();
    r.register("v", "", family);
    let mut text = String::new();
    encode(&mut text, &r).unwrap_or_default();
    let want = format!("v_count{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want)?.parse().ok())
        .unwrap_or(0)
}

fn host_verb(host: &str, verb: &str) -> HostVerb {
    HostVerb {
        host: host.into(),
        verb: verb.into(),
    }
}

/// A request's latency, from before its rate-limiter wait to the end of
/// its response body (client-go's request(), around Do's body read).
pub fn rest_client_request_duration(verb: &str, host: &str, took: Duration) {
    METRICS
        .rest_client_request_duration
        .get_or_create(&host_verb(host, verb))
        .observe(took.as_secs_f64());
}

pub fn rest_client_request_size(verb: &str, host: &str, bytes: u64) {
    METRICS
        .rest_client_request_size
        .get_or_create(&host_verb(host, verb))
        .observe(bytes as f64);
}

pub fn rest_client_response_size(verb: &str, host: &str, bytes: u64) {
    METRICS
        .rest_client_response_size
        .get_or_create(&host_verb(host, verb))
        .observe(bytes as f64);
}

pub fn rest_client_rate_limiter_duration(verb: &str, host: &str, waited: Duration) {
    METRICS
        .rest_client_rate_limiter_duration
        .get_or_create(&host_verb(host, verb))
        .observe(waited.as_secs_f64());
}

/// One API request from the kube-rs client.
pub fn rest_client_request(code: &str, method: &str, host: &str) {
    METRICS
        .rest_client_requests
        .get_or_create(&RestClientLabels {
            code: code.into(),
            host: host.into(),
            method: method.into(),
        })
        .inc();
}

// ------------------------------------------------------------ scrape

/// Sets the state gauges from the PLEG snapshot, as upstream's PLEG does
/// after each relist: pods with a ready sandbox, containers by state
/// (sandboxes not counted as containers).
/// The volume families from the claims' latest figures (upstream's
/// volumeStatsCollector reads the same cache at each scrape); claims gone
/// drop out.
fn update_volume_stats(claims: &[crate::stats::volumes::VolumeFigures]) {
    for f in &METRICS.volume_stats {
        f.clear();
    }
    METRICS.volume_health_abnormal.clear();
    let mut health = false;
    for c in claims {
        let Some((namespace, claim)) = &c.pvc else {
            continue;
        };
        let labels = VolumeLabels {
            namespace: namespace.clone(),
            persistentvolumeclaim: claim.clone(),
        };
        let values = [
            c.capacity,
            c.available,
            c.used,
            c.inodes,
            c.inodes_free,
            c.inodes_used,
        ];
        for (f, v) in METRICS.volume_stats.iter().zip(values) {
            f.get_or_create(&labels).set(v.min(i64::MAX as u64) as i64);
        }
        if let Some(abnormal) = c.abnormal {
            health = true;
            METRICS
                .volume_health_abnormal
                .get_or_create(&labels)
                .set(i64::from(abnormal));
        }
    }
    VOLUME_HEALTH_SERIES.store(health, Ordering::Relaxed);
}

fn update_running(snapshot: &crate::pleg::Snapshot) {
    let mut pods = 0i64;
    let mut by_state = [0i64; 4];
    for p in snapshot.values() {
        if p.sandboxes.values().any(|ready| *ready) {
            pods += 1;
        }
        for s in p.containers.values() {
            by_state[state_idx(*s)] += 1;
        }
    }
    let m = &*METRICS;
    m.running_pods.set(pods);
    for (i, n) in by_state.iter().enumerate() {
        m.running_containers
            .get_or_create(&ContainerStateLabel {
                container_state: STATES[i],
            })
            .set(*n);
    }
}

/// kubecontainer.State strings.
const STATES: [&str; 4] = ["created", "running", "exited", "unknown"];

fn state_idx(s: CState) -> usize {
    match s {
        CState::Created => 0,
        CState::Running => 1,
        CState::Exited => 2,
        CState::Unknown => 3,
    }
}

/// Serialises set-from-snapshot and encode, so one scrape shows one
/// snapshot's counts.
static SCRAPE: Mutex<()> = Mutex::new(());

/// The `/metrics` text for `state` (the node name and state gauges are
/// refreshed from it first).
pub fn render(state: &ServerState) -> String {
    render_with(state, None)
}

/// `render` with the pod stats behind the container log sizes.
pub fn render_with(
    state: &ServerState,
    stats: Option<&crate::stats::provider::Snapshot>,
) -> String {
    let snap = state.pleg.snapshot();
    let reg = &*REGISTRY;
    let _g = SCRAPE.lock();
    update_running(&snap);
    update_log_sizes(stats);
    METRICS
        .rare
        .managed_ephemeral_containers
        .set(ephemeral_containers(&state.pods.pods()));
    update_volume_stats(&state.stats.volume_stats().claims());
    if !state.node_name.is_empty() {
        set_node_name(&state.node_name);
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, reg);
    to_prometheus_text(&out)
}

/// `/metrics`, `/metrics/probes` and `/metrics/slis`.
pub fn routes() -> Router<ServerState> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(metrics_probes))
        .route("/metrics/slis", get(metrics_slis).delete(reset_slis))
}

async fn metrics(
    State(s): State<ServerState>,
    crate::stats::Scraper(client): crate::stats::Scraper,
    headers: HeaderMap,
) -> Response {
    // Upstream's log collector lists the pod stats at each scrape.
    let stats = crate::stats::summary_snapshot(&s, client).await;
    let enc = encoding::negotiate(&headers);
    // The process collector reads /proc: off the async threads.
    let render = move || encoding::encode(enc, vec![render_with(&s, stats.as_deref()).into()]);
    match tokio::task::spawn_blocking(render).await {
        Ok(body) => encoding::text_response(enc, body),
        Err(e) => {
            tracing::error!(error = %e, "rendering /metrics failed");
            axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn metrics_probes(State(s): State<ServerState>, headers: HeaderMap) -> Response {
    // A few lines per probe: encoded on this thread.
    let enc = encoding::negotiate(&headers);
    let mut text = to_prometheus_text(&s.probes.metrics_text());
    // Upstream registers the start-time gauge in this registry too; its
    // name sorts after the prober's.
    text.push_str(&s.slis.start_time_text());
    encoding::text_response(enc, encoding::encode(enc, vec![text.into()]))
}

async fn metrics_slis(State(s): State<ServerState>, headers: HeaderMap) -> Response {
    let enc = encoding::negotiate(&headers);
    encoding::text_response(enc, encoding::encode(enc, vec![s.slis.text().into()]))
}

/// `DELETE /metrics/slis` (component-base `HandlerWithReset`).
async fn reset_slis(State(s): State<ServerState>) -> Response {
    s.slis.reset();
    "metrics reset\n".into_response()
}

#[cfg(test)]
mod tests;

/// One exclusive CPU allocation asked of the static CPU manager policy
/// (`kubelet_cpu_manager_pinning_requests_total`).
pub fn cpu_manager_pinning_request() {
    METRICS.rare.cpu_manager_pinning_requests.inc();
}

/// One that failed (`kubelet_cpu_manager_pinning_errors_total`).
pub fn cpu_manager_pinning_error() {
    METRICS.rare.cpu_manager_pinning_errors.inc();
}

/// The static policy's gauges, from its state: the shared pool less the
/// reserved CPUs in millicores, the exclusively assigned CPUs, and those
/// per NUMA node (upstream sets only nodes with some, never back to 0).
pub fn cpu_manager_pool(shared_cpus: usize, exclusive_cpus: usize, per_numa: &[(usize, usize)]) {
    let cm = &METRICS.cm;
    cm.shared_pool_size_millicores
        .set((shared_cpus * 1000) as i64);
    cm.exclusive_cpu_allocation_count.set(exclusive_cpus as i64);
    for (numa, n) in per_numa {
        cm.allocation_per_numa
            .get_or_create(&cm::NumaNode {
                numa_node: numa.to_string(),
            })
            .set(*n as i64);
    }
}

/// The full-pcpus-only alignment counters (`scope="container"`,
/// `boundary="physical_cpu"`): `None` makes the series exist at 0 (the
/// static policy's start, which also makes the uncore-cache one).
pub fn cpu_manager_alignment(ok: Option<bool>) {
    let cm = &METRICS.cm;
    let labels = |boundary| cm::AlignmentLabels {
        boundary,
        scope: "container",
    };
    match ok {
        None => {
            let _ = cm
                .aligned_compute_resources_failure
                .get_or_create(&labels("physical_cpu"));
            let _ = cm
                .aligned_compute_resources
                .get_or_create(&labels("physical_cpu"));
            let _ = cm
                .aligned_compute_resources
                .get_or_create(&labels("uncore_cache"));
        }
        Some(true) => {
            cm.aligned_compute_resources
                .get_or_create(&labels("physical_cpu"))
                .inc();
        }
        Some(false) => {
            cm.aligned_compute_resources_failure
                .get_or_create(&labels("physical_cpu"))
                .inc();
        }
    }
}
