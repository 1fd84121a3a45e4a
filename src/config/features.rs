//! The feature gates a v1.34.0 kubelet knows, and upstream's checks of
//! `featureGates` / `--feature-gates` (component-base
//! `featuregate/feature_gate.go`: `SetFromMap`, `Enabled`, `AddMetrics`).
//!
//! [`GATES`] is data generated from the upstream files below: for each
//! gate, the last `VersionedSpec` whose version is at most 1.34 (the
//! kubelet's binary and emulated version). It is every gate registered
//! into the kubelet's `DefaultMutableFeatureGate`:
//! - kubernetes `pkg/features/kube_features.go`
//!   (`defaultVersionedKubernetesFeatureGates`, which also relists the
//!   apiserver, apiextensions-apiserver, controller-manager and zpages
//!   gates), read from kubernetes master of 2025-08-11 as vendored in
//!   kubernetes-sigs/provider-aws-test-infra commit cab5dde4b7ee (its
//!   component-base still says binary version 1.34; its staging copies of
//!   the apiserver gates, `feature_gate.go`, zpages and client-go features
//!   are byte-identical to the v0.34.0 tags);
//! - k8s.io/apiserver v0.34.0 `pkg/features/kube_features.go`;
//!   k8s.io/apiextensions-apiserver v0.34.0 `pkg/features/kube_features.go`;
//! - k8s.io/component-base v0.34.0: `logs/api/v1/kube_features.go`
//!   (`logsapi.AddFeatureGates`, called by `cmd/kubelet/app/server.go`'s
//!   init; LoggingStableOptions is declared there but never registered),
//!   `zpages/features/kube_features.go`, `metrics/features/kube_features.go`
//!   (ComponentSLIs, added by k8s.io/apiserver `pkg/server/config.go`'s
//!   init, a package the kubelet imports), and `featuregate/feature_gate.go`
//!   (AllAlpha and AllBeta);
//! - k8s.io/client-go v0.34.0 `features/known_features.go` (unversioned,
//!   added through `pkg/features/client_adapter.go`).
//!
//! Checked against later kubernetes master snapshots (2025-08-29 to
//! 2026-07-29): no gate's state at 1.34 differs, except that
//! SchedulerAsyncAPICalls' 1.34 entry was later turned off (after v1.34.0;
//! the table keeps v1.34.0's on) and TopologyManagerPolicyOptions' 1.32
//! entry later gained a lock (v1.34.0 had none). Gates those snapshots
//! dropped after 1.34 (CronJobsScheduledAnnotation, PodIndexLabel,
//! ProbeHostPodSecurityStandards, SizeMemoryBackedVolumes,
//! StatefulSetAutoDeletePVC, and others) are here because 1.34 had them;
//! gates they added with a "1.0" initial entry (AllowServiceExternalIPs,
//! ChangeContainerStatusOnKubeletRestart, KubeProxyIPVS,
//! ServiceCIDRStatusFieldWiping, StatefulSetSemanticRevisionComparison)
//! are not, since the 1.34 binary did not know them. Not verified: changes
//! made only on the release-1.34 branch after 2025-08-11.

use std::collections::BTreeMap;

/// A gate's maturity (`featuregate.prerelease`). The strings are the
/// `stage` label of `kubernetes_feature_enabled`: GA is the empty string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

/// One gate as a v1.34.0 kubelet registers it (`featuregate.FeatureSpec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub name: &'static str,
    pub default: bool,
    pub stage: Stage,
    /// `LockToDefault`: setting it to anything but `default` is refused.
    pub locked: bool,
}

impl Gate {
    const fn new(name: &'static str, default: bool, stage: Stage, locked: bool) -> Gate {
        Gate {
            name,
            default,
            stage,
            locked,
        }
    }
}

/// Toggles every alpha (beta) gate not set explicitly (featuregate's
/// `allAlphaGate` / `allBetaGate`).
pub const ALL_ALPHA: &str = "AllAlpha";
pub const ALL_BETA: &str = "AllBeta";

/// Why upstream's `SetFromMap` refuses a gate map. The texts are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("unrecognized feature gate: {0}")]
    Unrecognized(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked_to}")]
    Locked {
        name: String,
        value: bool,
        locked_to: bool,
    },
}

/// Several errors, written as `utilerrors.NewAggregate` does: one alone
/// as itself, more as `[a, b]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", aggregate(.0))]
pub struct GateErrors(pub Vec<GateError>);

fn aggregate(errs: &[GateError]) -> String {
    match errs {
        [one] => one.to_string(),
        many => {
            let texts: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", texts.join(", "))
        }
    }
}

/// The gate named `name`, if a v1.34.0 kubelet knows it.
pub fn lookup(name: &str) -> Option<&'static Gate> {
    GATES
        .binary_search_by(|g| g.name.cmp(name))
        .ok()
        .map(|i| &GATES[i])
}

/// Upstream `SetFromMap`: every name must be known, and a locked gate may
/// only be set to its default. Upstream walks a Go map (random order),
/// collects lock errors and stops at the first unknown name; this walks
/// the names sorted, so the message is stable. On success, the warnings
/// upstream logs for setting GA and deprecated gates.
pub fn check(gates: &BTreeMap<String, bool>) -> Result<Vec<String>, GateErrors> {
    let mut errs = Vec::new();
    let mut warnings = Vec::new();
    for (name, &value) in gates {
        let Some(gate) = lookup(name) else {
            errs.push(GateError::Unrecognized(name.clone()));
            return Err(GateErrors(errs));
        };
        if gate.locked && gate.default != value {
            errs.push(GateError::Locked {
                name: name.clone(),
                value,
                locked_to: gate.default,
            });
            continue;
        }
        match gate.stage {
            Stage::Deprecated => warnings.push(format!(
                "Setting deprecated feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Ga => warnings.push(format!(
                "Setting GA feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Alpha | Stage::Beta => {}
        }
    }
    if errs.is_empty() {
        Ok(warnings)
    } else {
        Err(GateErrors(errs))
    }
}

/// Upstream `Enabled`: the value set for the gate, else AllAlpha's or
/// AllBeta's value for an alpha or beta gate when that is set, else the
/// gate's default. Panics on a name the table lacks, as upstream does (a
/// caller's typo, caught by any test that reaches it).
pub fn enabled(gates: &BTreeMap<String, bool>, name: &str) -> bool {
    let Some(gate) = lookup(name) else {
        panic!("feature {name:?} is not registered in FeatureGate");
    };
    if let Some(&v) = gates.get(name) {
        return v;
    }
    let all = match gate.stage {
        Stage::Alpha if name != ALL_ALPHA && name != ALL_BETA => gates.get(ALL_ALPHA),
        Stage::Beta if name != ALL_ALPHA && name != ALL_BETA => gates.get(ALL_BETA),
        _ => None,
    };
    all.copied().unwrap_or(gate.default)
}

/// The gates whose behaviour rkubelet follows; any other gate the user
/// moves from its default is reported as accepted but not implemented
/// (`config::honesty`). Sorted.
pub const FOLLOWED: &[&str] = &[
    // Which cpuManagerPolicyOptions the static CPU manager policy takes.
    "CPUManagerPolicyAlphaOptions",
    "CPUManagerPolicyBetaOptions",
    "CSIVolumeHealth",
    "ClusterTrustBundleProjection",
    "ContainerCheckpoint",
    // Validation only, as upstream's ValidateKubeletConfiguration (the
    // cpuCFSQuotaPeriod and imageMaximumGCAge fields are reported apart).
    "CustomCPUCFSQuotaPeriod",
    "DynamicResourceAllocation",
    // The image garbage collector's maximum age.
    "ImageMaximumGCAge",
    // The crash loop backoff's maximum (`kuberuntime::backoff`).
    "KubeletCrashLoopBackOffMax",
    "KubeletFineGrainedAuthz",
    "KubeletPSI",
    "KubeletServiceAccountTokenForCredentialProviders",
    "PodCertificateRequest",
    // The crash loop backoff's shorter periods.
    "ReduceDefaultCrashLoopBackOffDecay",
    // Validation refuses serverTLSBootstrap without it, as upstream.
    "RotateKubeletServerCertificate",
];

/// The gates `gates` moves away from their defaults (directly, or through
/// AllAlpha/AllBeta) that rkubelet does not follow, sorted.
pub fn unfollowed(gates: &BTreeMap<String, bool>) -> Vec<&'static str> {
    GATES
        .iter()
        .filter(|g| g.name != ALL_ALPHA && g.name != ALL_BETA)
        .filter(|g| FOLLOWED.binary_search(&g.name).is_err())
        .filter(|g| enabled(gates, g.name) != g.default)
        .map(|g| g.name)
        .collect()
}

/// Gate `name`'s 1.34 default; panics on an unknown name like [`enabled`].
pub fn default_of(name: &str) -> bool {
    enabled(&BTreeMap::new(), name)
}

use Stage::{Alpha, Beta, Deprecated, Ga};

/// (name, default, stage, locked) at v1.34.0, sorted by name in byte
/// order (Go's sort of feature names) for [`lookup`]'s binary search.
pub static GATES: &[Gate] = &[
    Gate::new("APIResponseCompression", true, Beta, false),
    Gate::new("APIServerIdentity", true, Beta, false),
    Gate::new("APIServerTracing", true, Ga, true),
    Gate::new("APIServingWithRoutine", false, Alpha, false),
    Gate::new("AggregatedDiscoveryRemoveBetaType", true, Deprecated, false),
    Gate::new("AllAlpha", false, Alpha, false),
    Gate::new("AllBeta", false, Beta, false),
    Gate::new("AllowDNSOnlyNodeCSR", false, Deprecated, false),
    Gate::new(
        "AllowInsecureKubeletCertificateSigningRequests",
        false,
        Deprecated,
        false,
    ),
    Gate::new(
        "AllowOverwriteTerminationGracePeriodSeconds",
        false,
        Deprecated,
        false,
    ),
    Gate::new("AllowParsingUserUIDFromCertAuth", true, Beta, false),
    Gate::new("AllowServiceLBStatusOnNonLB", false, Deprecated, true),
    Gate::new("AllowUnsafeMalformedObjectDeletion", false, Alpha, false),
    Gate::new("AnonymousAuthConfigurableEndpoints", true, Ga, true),
    Gate::new("AnyVolumeDataSource", true, Ga, true),
    Gate::new("AuthorizeNodeWithSelectors", true, Ga, true),
    Gate::new("AuthorizeWithSelectors", true, Ga, true),
    Gate::new("BtreeWatchCache", true, Ga, true),
    Gate::new("CBORServingAndStorage", false, Alpha, false),
    Gate::new("CPUManagerPolicyAlphaOptions", false, Alpha, false),
    Gate::new("CPUManagerPolicyBetaOptions", true, Beta, false),
    Gate::new("CPUManagerPolicyOptions", true, Ga, true),
    Gate::new("CRDValidationRatcheting", true, Ga, true),
    Gate::new("CSIMigrationPortworx", true, Ga, true),
    Gate::new("CSIVolumeHealth", false, Alpha, false),
    Gate::new("ClearingNominatedNodeNameAfterBinding", false, Alpha, false),
    Gate::new("ClientsAllowCBOR", false, Alpha, false),
    Gate::new("ClientsPreferCBOR", false, Alpha, false),
    Gate::new("CloudControllerManagerWebhook", false, Alpha, false),
    Gate::new("ClusterTrustBundle", false, Beta, false),
    Gate::new("ClusterTrustBundleProjection", false, Beta, false),
    Gate::new("ComponentFlagz", false, Alpha, false),
    Gate::new("ComponentSLIs", true, Ga, true),
    Gate::new("ComponentStatusz", false, Alpha, false),
    Gate::new("ConcurrentWatchObjectDecode", false, Beta, false),
    Gate::new("ConsistentListFromCache", true, Ga, true),
    Gate::new("ContainerCheckpoint", true, Beta, false),
    Gate::new("ContainerRestartRules", false, Alpha, false),
    Gate::new("ContainerStopSignals", false, Alpha, false),
    Gate::new("ContextualLogging", true, Beta, false),
    Gate::new("CoordinatedLeaderElection", false, Beta, false),
    Gate::new("CronJobsScheduledAnnotation", true, Ga, true),
    Gate::new("CrossNamespaceVolumeDataSource", false, Alpha, false),
    Gate::new("CustomCPUCFSQuotaPeriod", false, Alpha, false),
    Gate::new("CustomResourceFieldSelectors", true, Ga, true),
    Gate::new("DRAAdminAccess", true, Beta, false),
    Gate::new("DRAConsumableCapacity", false, Alpha, false),
    Gate::new("DRADeviceBindingConditions", false, Alpha, false),
    Gate::new("DRADeviceTaints", false, Alpha, false),
    Gate::new("DRAExtendedResource", false, Alpha, false),
    Gate::new("DRAPartitionableDevices", false, Alpha, false),
    Gate::new("DRAPrioritizedList", true, Beta, false),
    Gate::new("DRAResourceClaimDeviceStatus", true, Beta, false),
    Gate::new("DRASchedulerFilterTimeout", true, Beta, false),
    Gate::new("DeclarativeValidation", true, Beta, false),
    Gate::new("DeclarativeValidationTakeover", false, Beta, false),
    Gate::new(
        "DeploymentReplicaSetTerminatingReplicas",
        false,
        Alpha,
        false,
    ),
    Gate::new("DetectCacheInconsistency", true, Beta, false),
    Gate::new("DisableAllocatorDualWrite", true, Ga, false),
    Gate::new("DisableCPUQuotaWithExclusiveCPUs", true, Beta, false),
    Gate::new("DisableNodeKubeProxyVersion", true, Deprecated, false),
    Gate::new("DynamicResourceAllocation", true, Ga, false),
    Gate::new("EnvFiles", false, Alpha, false),
    Gate::new("EventedPLEG", false, Alpha, false),
    Gate::new("ExecProbeTimeout", true, Ga, false),
    Gate::new("ExternalServiceAccountTokenSigner", true, Beta, false),
    Gate::new("GitRepoVolumeDriver", false, Deprecated, false),
    Gate::new("GracefulNodeShutdown", true, Beta, false),
    Gate::new("GracefulNodeShutdownBasedOnPodPriority", true, Beta, false),
    Gate::new("HPAConfigurableTolerance", false, Alpha, false),
    Gate::new("HPAScaleToZero", false, Alpha, false),
    Gate::new("HonorPVReclaimPolicy", true, Ga, true),
    Gate::new("HostnameOverride", false, Alpha, false),
    Gate::new("ImageMaximumGCAge", true, Beta, false),
    Gate::new("ImageVolume", false, Beta, false),
    Gate::new("InOrderInformers", true, Beta, false),
    Gate::new("InPlacePodVerticalScaling", true, Beta, false),
    Gate::new(
        "InPlacePodVerticalScalingAllocatedStatus",
        false,
        Deprecated,
        false,
    ),
    Gate::new(
        "InPlacePodVerticalScalingExclusiveCPUs",
        false,
        Alpha,
        false,
    ),
    Gate::new(
        "InPlacePodVerticalScalingExclusiveMemory",
        false,
        Alpha,
        false,
    ),
    Gate::new("InTreePluginPortworxUnregister", false, Alpha, false),
    Gate::new("InformerResourceVersion", false, Alpha, false),
    Gate::new("JobBackoffLimitPerIndex", true, Ga, true),
    Gate::new("JobManagedBy", true, Beta, false),
    Gate::new("JobPodReplacementPolicy", true, Ga, true),
    Gate::new("JobSuccessPolicy", true, Ga, true),
    Gate::new("KMSv1", false, Deprecated, false),
    Gate::new("KubeletCgroupDriverFromCRI", true, Ga, true),
    Gate::new("KubeletCrashLoopBackOffMax", false, Alpha, false),
    Gate::new("KubeletEnsureSecretPulledImages", false, Alpha, false),
    Gate::new("KubeletFineGrainedAuthz", true, Beta, false),
    Gate::new("KubeletInUserNamespace", false, Alpha, false),
    Gate::new("KubeletPSI", true, Beta, false),
    Gate::new("KubeletPodResourcesDynamicResources", true, Beta, false),
    Gate::new("KubeletPodResourcesGet", true, Beta, false),
    Gate::new(
        "KubeletPodResourcesListUseActivePods",
        true,
        Deprecated,
        false,
    ),
    Gate::new(
        "KubeletRegistrationGetOnExistsOnly",
        false,
        Deprecated,
        false,
    ),
    Gate::new("KubeletSeparateDiskGC", true, Beta, false),
    Gate::new(
        "KubeletServiceAccountTokenForCredentialProviders",
        true,
        Beta,
        false,
    ),
    Gate::new("KubeletTracing", true, Ga, true),
    Gate::new("ListFromCacheSnapshot", true, Beta, false),
    Gate::new("LoadBalancerIPMode", true, Ga, true),
    Gate::new(
        "LocalStorageCapacityIsolationFSQuotaMonitoring",
        false,
        Beta,
        false,
    ),
    Gate::new("LogarithmicScaleDown", true, Ga, true),
    Gate::new("LoggingAlphaOptions", false, Alpha, false),
    Gate::new("LoggingBetaOptions", true, Beta, false),
    Gate::new("MatchLabelKeysInPodAffinity", true, Ga, true),
    Gate::new("MatchLabelKeysInPodTopologySpread", true, Beta, false),
    Gate::new(
        "MatchLabelKeysInPodTopologySpreadSelectorMerge",
        true,
        Beta,
        false,
    ),
    Gate::new("MaxUnavailableStatefulSet", false, Alpha, false),
    Gate::new("MemoryManager", true, Ga, true),
    Gate::new("MemoryQoS", false, Alpha, false),
    Gate::new("MultiCIDRServiceAllocator", true, Ga, true),
    Gate::new("MutableCSINodeAllocatableCount", false, Beta, false),
    Gate::new("MutatingAdmissionPolicy", false, Beta, false),
    Gate::new("NFTablesProxyMode", true, Ga, true),
    Gate::new("NodeInclusionPolicyInPodTopologySpread", true, Ga, true),
    Gate::new("NodeLogQuery", false, Beta, false),
    Gate::new("NodeSwap", true, Ga, true),
    Gate::new("NominatedNodeNameForExpectation", false, Alpha, false),
    Gate::new("OpenAPIEnums", true, Beta, false),
    Gate::new("OrderedNamespaceDeletion", true, Ga, true),
    Gate::new("PodAndContainerStatsFromCRI", false, Alpha, false),
    Gate::new("PodCertificateRequest", false, Alpha, false),
    Gate::new("PodDeletionCost", true, Beta, false),
    Gate::new("PodIndexLabel", true, Ga, true),
    Gate::new("PodLevelResources", true, Beta, false),
    Gate::new("PodLifecycleSleepAction", true, Ga, true),
    Gate::new("PodLifecycleSleepActionAllowZero", true, Ga, true),
    Gate::new("PodLogsQuerySplitStreams", false, Alpha, false),
    Gate::new("PodObservedGenerationTracking", true, Beta, false),
    Gate::new("PodReadyToStartContainersCondition", true, Beta, false),
    Gate::new("PodSchedulingReadiness", true, Ga, true),
    Gate::new("PodTopologyLabelsAdmission", false, Alpha, false),
    Gate::new("PortForwardWebsockets", true, Beta, false),
    Gate::new("PreferSameTrafficDistribution", true, Beta, false),
    Gate::new("PreventStaticPodAPIReferences", true, Beta, false),
    Gate::new("ProbeHostPodSecurityStandards", true, Ga, true),
    Gate::new("ProcMountType", true, Beta, false),
    Gate::new("QOSReserved", false, Alpha, false),
    Gate::new("RecoverVolumeExpansionFailure", true, Ga, true),
    Gate::new("RecursiveReadOnlyMounts", true, Ga, true),
    Gate::new("ReduceDefaultCrashLoopBackOffDecay", false, Alpha, false),
    Gate::new("RelaxedDNSSearchValidation", true, Ga, true),
    Gate::new("RelaxedEnvironmentVariableValidation", true, Ga, true),
    Gate::new("RelaxedServiceNameValidation", false, Alpha, false),
    Gate::new("ReloadKubeletServerCertificateFile", true, Beta, false),
    Gate::new("RemoteRequestHeaderUID", true, Beta, false),
    Gate::new("ResilientWatchCacheInitialization", true, Ga, true),
    Gate::new("ResourceHealthStatus", false, Alpha, false),
    Gate::new("RetryGenerateName", true, Ga, true),
    Gate::new("RotateKubeletServerCertificate", true, Beta, false),
    Gate::new("RuntimeClassInImageCriApi", false, Alpha, false),
    Gate::new("SELinuxChangePolicy", true, Beta, false),
    Gate::new("SELinuxMount", false, Beta, false),
    Gate::new("SELinuxMountReadWriteOncePod", true, Beta, false),
    Gate::new("SchedulerAsyncAPICalls", true, Beta, false),
    Gate::new("SchedulerAsyncPreemption", true, Beta, false),
    Gate::new("SchedulerPopFromBackoffQ", true, Beta, false),
    Gate::new("SchedulerQueueingHints", true, Ga, true),
    Gate::new("SeparateCacheWatchRPC", false, Deprecated, false),
    Gate::new("SeparateTaintEvictionController", true, Ga, true),
    Gate::new("ServiceAccountNodeAudienceRestriction", true, Beta, false),
    Gate::new("ServiceAccountTokenJTI", true, Ga, true),
    Gate::new("ServiceAccountTokenNodeBinding", true, Ga, true),
    Gate::new("ServiceAccountTokenNodeBindingValidation", true, Ga, true),
    Gate::new("ServiceAccountTokenPodNodeInfo", true, Ga, true),
    Gate::new("ServiceTrafficDistribution", true, Ga, true),
    Gate::new("SidecarContainers", true, Ga, true),
    Gate::new("SizeBasedListCostEstimate", true, Beta, false),
    Gate::new("SizeMemoryBackedVolumes", true, Ga, true),
    Gate::new("StatefulSetAutoDeletePVC", true, Ga, true),
    Gate::new("StorageCapacityScoring", false, Alpha, false),
    Gate::new("StorageNamespaceIndex", true, Deprecated, false),
    Gate::new("StorageVersionAPI", false, Alpha, false),
    Gate::new("StorageVersionHash", true, Beta, false),
    Gate::new("StorageVersionMigrator", false, Alpha, false),
    Gate::new("StreamingCollectionEncodingToJSON", true, Ga, true),
    Gate::new("StreamingCollectionEncodingToProtobuf", true, Ga, true),
    Gate::new("StrictCostEnforcementForVAP", true, Ga, true),
    Gate::new("StrictCostEnforcementForWebhooks", true, Ga, true),
    Gate::new("StrictIPCIDRValidation", false, Alpha, false),
    Gate::new("StructuredAuthenticationConfiguration", true, Ga, true),
    Gate::new(
        "StructuredAuthenticationConfigurationEgressSelector",
        true,
        Beta,
        false,
    ),
    Gate::new("StructuredAuthorizationConfiguration", true, Ga, true),
    Gate::new("SupplementalGroupsPolicy", true, Beta, false),
    Gate::new("SystemdWatchdog", true, Beta, false),
    Gate::new("TokenRequestServiceAccountUIDValidation", true, Beta, false),
    Gate::new("TopologyAwareHints", true, Ga, true),
    Gate::new("TopologyManagerPolicyAlphaOptions", false, Alpha, false),
    Gate::new("TopologyManagerPolicyBetaOptions", true, Beta, false),
    Gate::new("TopologyManagerPolicyOptions", true, Ga, false),
    Gate::new("TranslateStreamCloseWebsocketRequests", true, Beta, false),
    Gate::new("UnauthenticatedHTTP2DOSMitigation", true, Beta, false),
    Gate::new("UnknownVersionInteroperabilityProxy", false, Alpha, false),
    Gate::new("UserNamespacesPodSecurityStandards", false, Alpha, false),
    Gate::new("UserNamespacesSupport", true, Beta, false),
    Gate::new("VolumeAttributesClass", true, Ga, false),
    Gate::new("WatchCacheInitializationPostStartHook", false, Beta, false),
    Gate::new(
        "WatchFromStorageWithoutResourceVersion",
        false,
        Deprecated,
        true,
    ),
    Gate::new("WatchList", true, Beta, false),
    Gate::new("WatchListClient", false, Beta, false),
    Gate::new("WinDSR", true, Ga, true),
    Gate::new("WinOverlay", true, Ga, true),
    Gate::new("WindowsCPUAndMemoryAffinity", false, Alpha, false),
    Gate::new("WindowsGracefulNodeShutdown", true, Beta, false),
    Gate::new("WindowsHostNetwork", false, Deprecated, false),
];

#[cfg(test)]
mod tests {

    #[test]
    fn only_gates_rkubelet_does_not_follow_are_reported_when_moved() {
        assert!(FOLLOWED.windows(2).all(|w| w[0] < w[1]));
        assert!(FOLLOWED.iter().all(|g| lookup(g).is_some()));
        let moved = |pairs: &[(&str, bool)]| {
            let m: BTreeMap<String, bool> =
                pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            unfollowed(&m)
        };
        assert!(moved(&[("PodCertificateRequest", true)]).is_empty());
        // Set to its default: nothing changes.
        assert!(moved(&[("ImageVolume", false)]).is_empty());
        assert_eq!(moved(&[("ImageVolume", true)]), ["ImageVolume"]);
        let all = moved(&[("AllAlpha", true)]);
        assert!(all.contains(&"EnvFiles"), "{all:?}");
        assert!(!all.contains(&"PodCertificateRequest"));
    }

    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn table_is_sorted_without_duplicates() {
        for w in GATES.windows(2) {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
        // 196 from pkg/features (with its relisted apiserver, apiextensions,
        // controller-manager and zpages gates), 3 logging, ComponentSLIs,
        // 5 client-go, AllAlpha and AllBeta.
        assert_eq!(GATES.len(), 207);
        assert!(GATES.iter().all(|g| lookup(g.name) == Some(g)));
    }

    #[test]
    fn gates_have_their_v1_34_state() {
        let state = |n: &str| lookup(n).map(|g| (g.default, g.stage, g.locked));
        // pkg/features/kube_features.go: GA and locked from 1.34.
        assert_eq!(state("KubeletCgroupDriverFromCRI"), Some((true, Ga, true)));
        assert_eq!(state("NodeSwap"), Some((true, Ga, true)));
        // Alpha in 1.34 (its only entry); beta and on since 1.33.
        assert_eq!(state("PodCertificateRequest"), Some((false, Alpha, false)));
        assert_eq!(state("KubeletFineGrainedAuthz"), Some((true, Beta, false)));
        assert_eq!(
            state("ClusterTrustBundleProjection"),
            Some((false, Beta, false))
        );
        // Deprecated from 1.29, locked off from 1.32.
        assert_eq!(
            state("AllowServiceLBStatusOnNonLB"),
            Some((false, Deprecated, true))
        );
        // Scheduler gate: on in v1.34.0, turned off on master afterwards.
        assert_eq!(state("SchedulerAsyncAPICalls"), Some((true, Beta, false)));
        // Relisted from k8s.io/apiserver.
        assert_eq!(state("APIServerTracing"), Some((true, Ga, true)));
        // component-base: logs, metrics features, zpages; client-go.
        assert_eq!(state("ContextualLogging"), Some((true, Beta, false)));
        assert_eq!(state("LoggingAlphaOptions"), Some((false, Alpha, false)));
        assert_eq!(state("ComponentSLIs"), Some((true, Ga, true)));
        assert_eq!(state("ComponentFlagz"), Some((false, Alpha, false)));
        assert_eq!(state("InOrderInformers"), Some((true, Beta, false)));
        assert_eq!(state(ALL_ALPHA), Some((false, Alpha, false)));
        assert_eq!(state(ALL_BETA), Some((false, Beta, false)));
        // Declared but never registered; added only after 1.34 (with a
        // "1.0" entry); removed before 1.34.
        assert_eq!(state("LoggingStableOptions"), None);
        assert_eq!(state("ChangeContainerStatusOnKubeletRestart"), None);
        assert_eq!(state("CPUManager"), None);
    }

    #[test]
    fn unknown_gates_are_refused_in_upstreams_words() {
        let err = check(&gates(&[("NoSuchGate", true)])).unwrap_err();
        assert_eq!(err.to_string(), "unrecognized feature gate: NoSuchGate");
        // Names are exact: upstream does not fold case.
        let err = check(&gates(&[("nodeswap", true)])).unwrap_err();
        assert_eq!(err.to_string(), "unrecognized feature gate: nodeswap");
    }

    #[test]
    fn locked_gates_refuse_anything_but_their_default() {
        let err = check(&gates(&[("NodeSwap", false)])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot set feature gate NodeSwap to false, feature is locked to true"
        );
        let err = check(&gates(&[
            ("KubeletCgroupDriverFromCRI", false),
            ("NodeSwap", false),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "[cannot set feature gate KubeletCgroupDriverFromCRI to false, feature is locked to true, \
             cannot set feature gate NodeSwap to false, feature is locked to true]"
        );
        // Upstream stops at an unknown name, keeping the errors before it.
        let err = check(&gates(&[("NodeSwap", false), ("Zzz", true)])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "[cannot set feature gate NodeSwap to false, feature is locked to true, \
             unrecognized feature gate: Zzz]"
        );
    }

    #[test]
    fn allowed_settings_pass_with_upstreams_warnings() {
        let warnings = check(&gates(&[
            ("NodeSwap", true),
            ("KMSv1", false),
            ("PodCertificateRequest", true),
            (ALL_BETA, false),
        ]))
        .unwrap();
        assert_eq!(
            warnings,
            [
                "Setting deprecated feature gate KMSv1=false. It will be removed in a future release.",
                "Setting GA feature gate NodeSwap=true. It will be removed in a future release.",
            ]
        );
        assert_eq!(check(&BTreeMap::new()).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn all_alpha_and_all_beta_set_the_gates_left_unset() {
        let none = BTreeMap::new();
        assert!(!enabled(&none, "PodCertificateRequest"));
        assert!(enabled(&none, "KubeletFineGrainedAuthz"));
        let g = gates(&[(ALL_ALPHA, true), ("CSIVolumeHealth", false)]);
        assert!(enabled(&g, "PodCertificateRequest"));
        assert!(!enabled(&g, "CSIVolumeHealth"), "explicit wins");
        assert!(!enabled(&g, ALL_BETA));
        assert!(enabled(&g, ALL_ALPHA));
        let g = gates(&[(ALL_BETA, false)]);
        assert!(!enabled(&g, "KubeletFineGrainedAuthz"));
        assert!(enabled(&g, "NodeSwap"), "GA gates keep their default");
        assert!(
            enabled(&g, "StorageNamespaceIndex"),
            "so do deprecated ones"
        );
        assert!(!default_of("ImageVolume"));
    }

    #[test]
    #[should_panic(expected = "feature \"NoSuchGate\" is not registered in FeatureGate")]
    fn asking_for_an_unknown_gate_panics_as_upstream() {
        enabled(&BTreeMap::new(), "NoSuchGate");
    }
}
