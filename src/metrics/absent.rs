//! Families upstream's `metrics.Register` (`pkg/kubelet/metrics/metrics.go`)
//! registers for parts rkubelet does not have: the eviction manager's stats
//! age, critical-pod preemption, device plugins, the pod-resources gRPC
//! endpoint, Windows host-process containers. Upstream registers them
//! whatever runs; all are labelled vectors, so nothing is counted and no
//! series appears (rkubelet shows their HELP/TYPE lines, see the module
//! documentation of `metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::{add, def_histogram, ContainerType, ContainerTypeCode, Described, HistFamily};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreemptionSignal {
    pub preemption_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceName {
    pub resource_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerApiVersion {
    pub server_api_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionSignalLabel {
    pub eviction_signal: String,
}

/// Counters of the pod-resources endpoint, in metrics.go's order. The
/// `Get` pair is registered while KubeletPodResourcesGet is on (beta,
/// default on since 1.34).
pub const POD_RESOURCES_COUNTERS: [(&str, &str); 7] = [
    (
        "kubelet_pod_resources_endpoint_requests",
        alpha!("Cumulative number of requests to the PodResource endpoint. Broken down by server api version."),
    ),
    (
        "kubelet_pod_resources_endpoint_requests_list",
        alpha!("Number of requests to the PodResource List endpoint. Broken down by server api version."),
    ),
    (
        "kubelet_pod_resources_endpoint_requests_get_allocatable",
        alpha!("Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version."),
    ),
    (
        "kubelet_pod_resources_endpoint_errors_list",
        alpha!("Number of requests to the PodResource List endpoint which returned error. Broken down by server api version."),
    ),
    (
        "kubelet_pod_resources_endpoint_errors_get_allocatable",
        alpha!("Number of requests to the PodResource GetAllocatableResources endpoint which returned error. Broken down by server api version."),
    ),
    (
        "kubelet_pod_resources_endpoint_requests_get",
        alpha!("Number of requests to the PodResource Get endpoint. Broken down by server api version."),
    ),
    (
        "kubelet_pod_resources_endpoint_errors_get",
        alpha!("Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version."),
    ),
];

pub struct AbsentMetrics {
    pub eviction_stats_age: HistFamily<EvictionSignalLabel>,
    pub preemptions: Family<PreemptionSignal, Counter>,
    pub device_plugin_registrations: Family<ResourceName, Counter>,
    pub device_plugin_alloc_duration: HistFamily<ResourceName>,
    pub pod_resources: [Family<ServerApiVersion, Counter>; 7],
    pub started_host_process_containers: Family<ContainerType, Counter>,
    pub started_host_process_containers_errors: Family<ContainerTypeCode, Counter>,
}

impl AbsentMetrics {
    pub(super) fn new() -> Self {
        AbsentMetrics {
            eviction_stats_age: Family::new_with_constructor(def_histogram),
            preemptions: Family::default(),
            device_plugin_registrations: Family::default(),
            device_plugin_alloc_duration: Family::new_with_constructor(def_histogram),
            pod_resources: Default::default(),
            started_host_process_containers: Family::default(),
            started_host_process_containers_errors: Family::default(),
        }
    }

    pub(super) fn described(&self) -> Vec<Described> {
        let mut v: Vec<Described> = Vec::new();
        add(
            &mut v,
            "kubelet_eviction_stats_age_seconds",
            alpha!("Time between when stats are collected, and when pod is evicted based on those stats by eviction signal"),
            self.eviction_stats_age.clone(),
        );
        add(
            &mut v,
            "kubelet_preemptions",
            alpha!("Cumulative number of pod preemptions by preemption resource"),
            self.preemptions.clone(),
        );
        add(
            &mut v,
            "kubelet_device_plugin_registration",
            alpha!(
                "Cumulative number of device plugin registrations. Broken down by resource name."
            ),
            self.device_plugin_registrations.clone(),
        );
        add(
            &mut v,
            "kubelet_device_plugin_alloc_duration_seconds",
            alpha!("Duration in seconds to serve a device plugin Allocation request. Broken down by resource name."),
            self.device_plugin_alloc_duration.clone(),
        );
        for (&(name, help), f) in POD_RESOURCES_COUNTERS.iter().zip(&self.pod_resources) {
            add(&mut v, name, help, f.clone());
        }
        add(
            &mut v,
            "kubelet_started_host_process_containers",
            alpha!("Cumulative number of hostprocess containers started. This metric will only be collected on Windows."),
            self.started_host_process_containers.clone(),
        );
        add(
            &mut v,
            "kubelet_started_host_process_containers_errors",
            alpha!("Cumulative number of errors when starting hostprocess containers. This metric will only be collected on Windows."),
            self.started_host_process_containers_errors.clone(),
        );
        v
    }
}
