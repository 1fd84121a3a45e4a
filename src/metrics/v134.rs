//! The `/metrics` families new or changed in Kubernetes v1.34 (issue 8):
//! in-place resize (`pkg/kubelet/metrics/metrics.go`, counted upstream by
//! the allocation manager and `kuberuntime`), user-namespaced pod starts,
//! the CRI-support gauge, the credential provider config hash
//! (`pkg/credentialprovider/plugin/metrics.go`, `config.go`) and the
//! admission rejections the kubelet records in `allocation_manager.go`.
//!
//! The resize families are moved by `allocation`, `syncloop` and
//! `kuberuntime`. rkubelet starts
//! no pod in a user namespace, so those families stay at 0. The CRI-support
//! gauge is set at start when the runtime lacks RuntimeConfig
//! (`kubelet::cgroup_driver_from_runtime`).

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::{add, Described, HistFamily};

/// `kubelet_pod_resize_duration_milliseconds` buckets (metrics.go, 1.34).
pub const POD_RESIZE_BUCKETS_MS: [f64; 14] = [
    10.0, 50.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 30000.0, 60000.0, 120000.0,
    300000.0, 600000.0,
];

fn resize_histogram() -> Histogram {
    Histogram::new(POD_RESIZE_BUCKETS_MS)
}

/// Label names in client_golang's exposition order (sorted).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResizeRequestLabels {
    pub operation: &'static str,
    pub requirement: &'static str,
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SuccessLabel {
    pub success: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonDetailLabel {
    pub reason_detail: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryTriggerLabel {
    pub retry_trigger: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HashLabel {
    pub hash: String,
}

/// The families of metrics.go's Register that 1.34 added, plus
/// `kubelet_admission_rejections_total`.
pub struct V134Metrics {
    pub container_requested_resizes: Family<ResizeRequestLabels, Counter>,
    pub pod_resize_duration_ms: HistFamily<SuccessLabel>,
    pub pod_pending_resizes: Family<ReasonLabel, Gauge>,
    pub pod_infeasible_resizes: Family<ReasonDetailLabel, Counter>,
    pub pod_in_progress_resizes: Gauge,
    pub pod_deferred_accepted_resizes: Family<RetryTriggerLabel, Counter>,
    pub started_user_namespaced_pods: Counter,
    pub started_user_namespaced_pods_errors: Counter,
    pub cri_losing_support: Family<VersionLabel, Gauge>,
    pub admission_rejections: Family<ReasonLabel, Counter>,
}

impl V134Metrics {
    pub(super) fn new() -> Self {
        V134Metrics {
            container_requested_resizes: Family::default(),
            pod_resize_duration_ms: Family::new_with_constructor(resize_histogram),
            pod_pending_resizes: Family::default(),
            pod_infeasible_resizes: Family::default(),
            pod_in_progress_resizes: Gauge::default(),
            pod_deferred_accepted_resizes: Family::default(),
            started_user_namespaced_pods: Counter::default(),
            started_user_namespaced_pods_errors: Counter::default(),
            cri_losing_support: Family::default(),
            admission_rejections: Family::default(),
        }
    }

    /// Name, help and metric of each, registered always: metrics.Register
    /// adds its newer families unconditionally (as the 1.31 source shows
    /// for the sleep-action and cgroup-version ones). Whether 1.34 puts the
    /// resize families behind InPlacePodVerticalScaling could not be read
    /// here; that gate is on by default in 1.34, so a default kubelet shows
    /// them either way.
    pub(super) fn described(&self) -> Vec<Described> {
        let mut v: Vec<Described> = Vec::new();
        add(
            &mut v,
            "kubelet_admission_rejections",
            alpha!("Cumulative number pod admission rejections by the Kubelet."),
            self.admission_rejections.clone(),
        );
        add(
            &mut v,
            "kubelet_started_user_namespaced_pods",
            alpha!("Cumulative number of pods with user namespaces started. This metric will only be collected on Linux."),
            self.started_user_namespaced_pods.clone(),
        );
        add(
            &mut v,
            "kubelet_started_user_namespaced_pods_errors",
            alpha!("Cumulative number of errors when starting pods with user namespaces. This metric will only be collected on Linux."),
            self.started_user_namespaced_pods_errors.clone(),
        );
        add(
            &mut v,
            "kubelet_cri_losing_support",
            alpha!("the Kubernetes version that the currently running CRI implementation will lose support on if not upgraded."),
            self.cri_losing_support.clone(),
        );
        add(
            &mut v,
            "kubelet_container_requested_resizes",
            alpha!("Number of requested resizes, counted at the container level. Different resources on the same container are counted separately. The 'requirement' label refers to 'memory' or 'limits'; the 'operation' label can be one of 'add', 'remove', 'increase' or 'decrease'."),
            self.container_requested_resizes.clone(),
        );
        add(
            &mut v,
            "kubelet_pod_resize_duration_milliseconds",
            alpha!("Duration in milliseconds to actuate a pod resize"),
            self.pod_resize_duration_ms.clone(),
        );
        add(
            &mut v,
            "kubelet_pod_pending_resizes",
            alpha!("Number of pending resizes for pods."),
            self.pod_pending_resizes.clone(),
        );
        add(
            &mut v,
            "kubelet_pod_infeasible_resizes",
            alpha!("Number of infeasible resizes for pods."),
            self.pod_infeasible_resizes.clone(),
        );
        add(
            &mut v,
            "kubelet_pod_in_progress_resizes",
            alpha!("Number of in-progress resizes for pods."),
            self.pod_in_progress_resizes.clone(),
        );
        add(
            &mut v,
            "kubelet_pod_deferred_accepted_resizes",
            alpha!("Cumulative number of resizes that were accepted after being deferred."),
            self.pod_deferred_accepted_resizes.clone(),
        );
        v
    }
}

// ------------------------------------------------------------ admission

/// The reasons upstream records as they are (allocation_manager.go's
/// admissionRejectionReasons, with the constants' values); others become
/// "OutOfExtendedResources" (an `OutOf` prefix) or "Other", to bound the
/// label's cardinality.
const ADMISSION_REJECTION_REASONS: &[&str] = &[
    "AppArmor",
    "PodOSSelectorNodeLabelDoesNotMatch",
    "PodOSNotSupported",
    "InvalidNodeInfo",
    "InitContainerRestartPolicyForbidden",
    "SupplementalGroupsPolicyNotSupported",
    "UnexpectedAdmissionError",
    "UnknownReason",
    "UnexpectedPredicateFailureType",
    "OutOfcpu",
    "OutOfmemory",
    "OutOfephemeral-storage",
    "OutOfpods",
    // tainttoleration.ErrReasonNotMatch (the scheduler plugin's constant).
    "node(s) had taints that the pod didn't tolerate",
    "Evicted",
    "SysctlForbidden",
    "TopologyAffinityError",
    "NodeShutdown",
];

/// The `reason` label upstream's recordAdmissionRejection gives `reason`.
pub fn admission_rejection_label(reason: &str) -> &'static str {
    if let Some(r) = ADMISSION_REJECTION_REASONS.iter().find(|r| **r == reason) {
        r
    } else if reason.starts_with("OutOf") {
        "OutOfExtendedResources"
    } else {
        "Other"
    }
}

// ------------------------------------------------------------ credential provider config

/// The hash of the credential provider config last applied
/// (`configHashProvider`); `None` until plugins are registered.
pub(super) static CONFIG_HASH: Mutex<Option<String>> = Mutex::new(None);

/// Upstream's readCredentialProviderConfig hash: SHA-256 over each file's
/// raw bytes, in order, each preceded by its length as a big-endian u64
/// (so two files cannot collide with one), as `sha256:<lowercase hex>`.
pub fn config_hash<'a>(files: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for data in files {
        ctx.update(&(data.len() as u64).to_be_bytes());
        ctx.update(data);
    }
    let digest = ctx.finish();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Sets the hash `kubelet_credential_provider_config_info` shows (upstream's
/// SetHashes: the last one replaces any earlier).
pub fn set_credential_provider_config_hash(hash: String) {
    *CONFIG_HASH.lock() = Some(hash);
}

/// `kubelet_credential_provider_config_info{hash} 1`: a custom collector
/// upstream (configmetrics' ConfigInfoCustomCollector), so no hash means no
/// family at all. Holds the hash store ([`CONFIG_HASH`] in the registry).
#[derive(Debug)]
pub(super) struct ConfigInfo(pub(super) &'static Mutex<Option<String>>);

impl Collector for ConfigInfo {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(hash) = self.0.lock().clone() else {
            return Ok(());
        };
        let mut m = enc.encode_descriptor(
            "kubelet_credential_provider_config_info",
            alpha!("Information about the last applied credential provider configuration with hash as label"),
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        prometheus_client::metrics::gauge::ConstGauge::new(1i64)
            .encode(m.encode_family(&HashLabel { hash })?)?;
        Ok(())
    }
}
