//! The CPU manager's gauges and the container alignment counters of
//! `pkg/kubelet/metrics/metrics.go` (1.33-1.34; names, types, help and
//! labels as the 1.34 metrics reference lists them).
//!
//! Only upstream's `static` CPU manager policy sets them
//! (`cm/cpumanager/policy_static.go`: initializeMetrics,
//! updateMetricsOnAllocate/Release, the alignment counters); rkubelet's
//! (`cm::cpumanager`) sets the gauges from its state after each change
//! through `metrics::cpu_manager_pool`. Under `none` the plain gauges show
//! 0 and the labelled families have no series, as upstream's.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{add, Described};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NumaNode {
    pub numa_node: String,
}

/// Label names sorted, as client_golang exposes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlignmentLabels {
    pub boundary: &'static str,
    pub scope: &'static str,
}

pub struct CmMetrics {
    pub shared_pool_size_millicores: Gauge,
    pub exclusive_cpu_allocation_count: Gauge,
    pub allocation_per_numa: Family<NumaNode, Gauge>,
    pub aligned_compute_resources: Family<AlignmentLabels, Counter>,
    pub aligned_compute_resources_failure: Family<AlignmentLabels, Counter>,
}

impl CmMetrics {
    pub(super) fn new() -> Self {
        CmMetrics {
            shared_pool_size_millicores: Gauge::default(),
            exclusive_cpu_allocation_count: Gauge::default(),
            allocation_per_numa: Family::default(),
            aligned_compute_resources: Family::default(),
            aligned_compute_resources_failure: Family::default(),
        }
    }

    pub(super) fn described(&self) -> Vec<Described> {
        let mut v: Vec<Described> = Vec::new();
        add(
            &mut v,
            "kubelet_cpu_manager_shared_pool_size_millicores",
            alpha!("The size of the shared CPU pool for non-guaranteed QoS pods, in millicores."),
            self.shared_pool_size_millicores.clone(),
        );
        add(
            &mut v,
            "kubelet_cpu_manager_exclusive_cpu_allocation_count",
            alpha!(
                "The total number of CPUs exclusively allocated to containers running on this node"
            ),
            self.exclusive_cpu_allocation_count.clone(),
        );
        add(
            &mut v,
            "kubelet_cpu_manager_allocation_per_numa",
            alpha!("Number of CPUs allocated per NUMA node"),
            self.allocation_per_numa.clone(),
        );
        // Counters named `..._count` upstream, without `_total`.
        add(
            &mut v,
            "kubelet_container_aligned_compute_resources_count",
            alpha!("Cumulative number of aligned compute resources allocated to containers by alignment type."),
            self.aligned_compute_resources.clone(),
        );
        add(
            &mut v,
            "kubelet_container_aligned_compute_resources_failure_count",
            alpha!("Cumulative number of failures to allocate aligned compute resources to containers by alignment type."),
            self.aligned_compute_resources_failure.clone(),
        );
        v
    }
}
