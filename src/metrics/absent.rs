//! Families upstream's `metrics.Register` (`pkg/kubelet/metrics/metrics.go`)
//! registers for parts rkubelet does not have (two are here though their
//! parts now fill them: the eviction manager's stats age, and
//! `kubelet_image_garbage_collected_total{reason}`, counted as upstream's
//! `images/image_gc_manager.go` freeImage counts, by `images::gc`),
//! critical-pod preemption, device plugins, the pod-resources gRPC
//! endpoint, Windows host-process containers and dynamic resource allocation's two
//! histograms (DRA is on by default in 1.34; rkubelet prepares no
//! ResourceClaim). Upstream registers them whatever runs; all are labelled
//! vectors, so nothing is counted and no series appears (rkubelet shows
//! their HELP/TYPE lines, see the module documentation of `metrics`).
//!
//! Two more are registered only while their feature gate is on (see
//! [`gated_by_dra`] and [`gated_by_image_volume`]):
//! - DRA's `dra_resource_claims_in_use`, a collector that upstream's DRA
//!   manager (`cm/dra/claiminfo.go`, registered by
//!   `container_manager_linux.go` while DynamicResourceAllocation is on, the
//!   1.34 default) fills with one all-drivers series,
//!   `driver_name="<any>"`, at 0 without claims;
//! - the image volume counters (`kubelet_image_volume_requested_total`,
//!   `..._mounted_succeed_total`, `..._mounted_errors_total`, plain
//!   counters added with the ImageVolume feature in 1.33, beta and off by
//!   default in 1.34; their registration behind the gate is as the 1.33
//!   change describes it, no 1.34 source could be read here). rkubelet
//!   refuses image volumes at volume set-up (containerd 1.7 cannot mount an
//!   image), before the container start where upstream counts, so they
//!   stay 0.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

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
pub struct ReasonLabel {
    pub reason: String,
}

/// Label names sorted, as client_golang exposes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraOperationLabels {
    pub is_error: String,
    pub operation_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriverName {
    pub driver_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraGrpcLabels {
    pub driver_name: String,
    pub grpc_status_code: String,
    pub method_name: String,
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
    pub image_garbage_collected: Family<ReasonLabel, Counter>,
    /// Their buckets were not read; no series is ever observed here.
    pub dra_operations_duration: HistFamily<DraOperationLabels>,
    pub dra_grpc_operations_duration: HistFamily<DraGrpcLabels>,
    pub dra_claims_in_use: Family<DriverName, Gauge>,
    pub image_volume_requested: Counter,
    pub image_volume_mounted_succeed: Counter,
    pub image_volume_mounted_errors: Counter,
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
            image_garbage_collected: Family::default(),
            dra_operations_duration: Family::new_with_constructor(def_histogram),
            dra_grpc_operations_duration: Family::new_with_constructor(def_histogram),
            dra_claims_in_use: {
                let f = Family::<DriverName, Gauge>::default();
                // No claim is ever prepared: the all-drivers count stays 0.
                f.get_or_create(&DriverName {
                    driver_name: "<any>".into(),
                })
                .set(0);
                f
            },
            image_volume_requested: Counter::default(),
            image_volume_mounted_succeed: Counter::default(),
            image_volume_mounted_errors: Counter::default(),
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
        add(
            &mut v,
            "kubelet_image_garbage_collected",
            alpha!("Total number of images garbage collected by the kubelet, whether through disk usage or image age."),
            self.image_garbage_collected.clone(),
        );
        add(
            &mut v,
            "dra_operations_duration_seconds",
            alpha!("Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count."),
            self.dra_operations_duration.clone(),
        );
        add(
            &mut v,
            "dra_grpc_operations_duration_seconds",
            alpha!("Duration in seconds of the DRA gRPC operations"),
            self.dra_grpc_operations_duration.clone(),
        );
        v
    }

    /// Shown while DynamicResourceAllocation is on.
    pub(super) fn gated_by_dra(&self) -> Vec<Described> {
        let mut v: Vec<Described> = Vec::new();
        add(
            &mut v,
            "dra_resource_claims_in_use",
            alpha!("The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name."),
            self.dra_claims_in_use.clone(),
        );
        v
    }

    /// Shown while ImageVolume is on.
    pub(super) fn gated_by_image_volume(&self) -> Vec<Described> {
        let mut v: Vec<Described> = Vec::new();
        for (name, help, c) in [
            (
                "kubelet_image_volume_requested",
                alpha!("Number of requested image volumes."),
                &self.image_volume_requested,
            ),
            (
                "kubelet_image_volume_mounted_succeed",
                alpha!("Number of successful image volume mounts."),
                &self.image_volume_mounted_succeed,
            ),
            (
                "kubelet_image_volume_mounted_errors",
                alpha!("Number of failed image volume mounts."),
                &self.image_volume_mounted_errors,
            ),
        ] {
            add(&mut v, name, help, c.clone());
        }
        v
    }
}
